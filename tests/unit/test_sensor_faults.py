"""twin.sensor_faults: overlapping fault windows and what a stuck sensor holds (the plant's readings
under each fault are in tests/unit/test_plant.py::test_sensor_faults)."""

from __future__ import annotations

import numpy as np
import pytest
from readings_testing import card_batch

from twin.faults import GarbageReadings, SensorDropout, StuckSensor
from twin.readings import LoopReading, PduReading, RackReading
from twin.sensor_faults import SensorFaults

pytestmark = pytest.mark.unit


def values(x: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Power, die, utilization and clock of four cards, all ``x``."""
    return np.full(4, x), np.full(4, x), np.full(4, x), np.full(4, x)


def rack_reading(rack: int, time_s: float, power_w: float, n: int = 4) -> RackReading:
    batch = card_batch(np.arange(n), power_w=power_w, die_temp_c=60.0, utilization=0.9)
    loop = LoopReading(30.0, 40.0, 100.0, 500.0)
    return RackReading(rack=rack, time_s=time_s, cards=batch, loop=loop, pdu=PduReading(power_w * n))


def test_a_stuck_card_holds_its_first_values_until_the_last_overlapping_window_ends() -> None:
    sf = SensorFaults(n_racks=2)
    early, late = StuckSensor(rack=0, start_s=0.0, end_s=20.0, card=2), StuckSensor(rack=0, start_s=10.0, card=2)
    sf.switch(early, on=True)
    first = values(1.0)
    sf.freeze_stuck_cards(*first)  # the fault's first reading: frozen at it
    later = values(2.0)
    sf.freeze_stuck_cards(*later)
    assert [a[2] for a in later] == [1.0] * 4 and [a[1] for a in later] == [2.0] * 4  # card 2 only
    sf.switch(late, on=True)
    sf.switch(early, on=False)  # one window still in force: still frozen at the first values
    still = values(3.0)
    sf.freeze_stuck_cards(*still)
    assert [a[2] for a in still] == [1.0] * 4
    sf.switch(late, on=False)  # the last window ended: the card reads true again
    free = values(4.0)
    sf.freeze_stuck_cards(*free)
    assert [a[2] for a in free] == [4.0] * 4
    sf.switch(StuckSensor(rack=0, start_s=50.0, card=2), on=True)  # a new window freezes afresh
    fresh, after = values(5.0), values(6.0)
    sf.freeze_stuck_cards(*fresh)
    sf.freeze_stuck_cards(*after)
    assert [a[2] for a in after] == [5.0] * 4


def test_a_stuck_rack_repeats_its_first_reading_with_fresh_stamps_until_its_last_window_ends() -> None:
    sf = SensorFaults(n_racks=2)
    a, b = StuckSensor(rack=1, start_s=0.0, end_s=30.0), StuckSensor(rack=1, start_s=5.0, end_s=60.0)
    sf.switch(a, on=True)
    assert sf.frozen_rack(1, 1.0) is None  # nothing frozen yet: this reading is taken afresh
    sf.seen(rack_reading(1, 1.0, power_w=300.0))
    sf.seen(rack_reading(0, 1.0, power_w=111.0))  # rack 0 is not stuck: nothing of it is kept ...
    sf.switch(StuckSensor(rack=0, start_s=2.0), on=True)
    assert sf.frozen_rack(0, 2.0) is None  # ... so its window freezes at its own first reading
    sf.seen(rack_reading(0, 2.0, power_w=222.0))
    r0 = sf.frozen_rack(0, 3.0)
    assert r0 is not None and r0.pdu is not None and r0.pdu.power_w == 888.0
    sf.switch(b, on=True)
    sf.switch(a, on=False)
    again = sf.frozen_rack(1, 40.0)
    assert again is not None and again.time_s == 40.0 and again.pdu is not None and again.pdu.power_w == 1200.0
    sf.switch(b, on=False)
    assert sf.frozen_rack(1, 61.0) is None
    sf.switch(StuckSensor(rack=1, start_s=70.0), on=True)  # a new window does not bring the old reading back
    assert sf.frozen_rack(1, 70.0) is None


def test_dropouts_overlap_and_garbage_hits_the_share_asked() -> None:
    sf = SensorFaults(n_racks=2)
    d1, d2 = SensorDropout(rack=0, start_s=0.0, end_s=10.0), SensorDropout(rack=0, start_s=5.0, end_s=20.0)
    sf.switch(d1, on=True)
    sf.switch(d2, on=True)
    sf.switch(d1, on=False)
    assert sf.dropped(0) and not sf.dropped(1)
    sf.switch(d2, on=False)
    assert not sf.dropped(0)

    rr = rack_reading(1, 0.0, power_w=300.0)
    assert rr.cards is not None and rr.loop is not None
    rng = np.random.default_rng(0)
    batch, loop = sf.garble(1, rr.cards, rr.loop, rng)
    assert batch is rr.cards and loop is rr.loop  # no garbage fault: untouched
    half = GarbageReadings(rack=1, start_s=0.0, mode="garbage", fraction=0.5)
    sf.switch(half, on=True)
    big = rack_reading(1, 0.0, power_w=300.0, n=1000).cards
    assert big is not None
    batch, loop = sf.garble(1, big, rr.loop, rng)
    hit = batch.power_w == -1234.5
    assert 0.4 < hit.mean() < 0.6 and np.all(batch.die_temp_c[hit] == 1.0e4)
    assert np.all(batch.power_w[~hit] == 300.0) and loop == rr.loop  # a share below 1 leaves the loop
    assert np.all(big.power_w == 300.0)  # the input is not changed in place
    sf.switch(half, on=False)
    sf.switch(GarbageReadings(rack=1, start_s=0.0, mode="nan"), on=True)
    batch, loop = sf.garble(1, rr.cards, rr.loop, rng)
    assert np.all(np.isnan(batch.power_w)) and np.isnan(loop.supply_temp_c) and np.isnan(loop.return_temp_c)


def test_a_stuck_card_freezes_each_of_its_four_values_at_its_own_reading() -> None:
    """Power, die temperature, utilisation and clock of the stuck card each keep the value they had
    in the fault's first reading (not one another's); the other cards read afresh."""
    sf = SensorFaults(n_racks=1)
    sf.switch(StuckSensor(rack=0, start_s=0.0, card=1), on=True)
    first = np.array([500.0, 600.0]), np.array([60.0, 70.0]), np.array([0.5, 0.9]), np.array([1980.0, 1760.0])
    sf.freeze_stuck_cards(*first)
    later = np.array([100.0, 200.0]), np.array([30.0, 40.0]), np.array([0.1, 0.2]), np.array([1210.0, 1320.0])
    sf.freeze_stuck_cards(*later)
    assert [float(a[1]) for a in later] == [600.0, 70.0, 0.9, 1760.0]
    assert [float(a[0]) for a in later] == [100.0, 30.0, 0.1, 1210.0]


def test_garbage_replaces_every_card_value_and_at_a_share_of_one_the_loop() -> None:
    """``garbage``: -1234.5 W, 10,000 deg C, utilisation 7 for every card hit; at a share of 1 the loop
    returns -273 deg C at -1 l/min (its supply left as read). ``nan``: the three card values NaN and
    the loop's two temperatures NaN (its flow left as read)."""
    rr = rack_reading(0, 0.0, power_w=300.0)
    assert rr.cards is not None and rr.loop is not None
    rng = np.random.default_rng(1)
    sf = SensorFaults(n_racks=1)
    sf.switch(GarbageReadings(rack=0, start_s=0.0, mode="garbage"), on=True)
    batch, loop = sf.garble(0, rr.cards, rr.loop, rng)
    assert np.all(batch.power_w == -1234.5) and np.all(batch.die_temp_c == 1.0e4) and np.all(batch.utilization == 7.0)
    assert (loop.supply_temp_c, loop.return_temp_c, loop.flow_lpm) == (30.0, -273.0, -1.0)
    sf = SensorFaults(n_racks=1)
    sf.switch(GarbageReadings(rack=0, start_s=0.0, mode="nan"), on=True)
    batch, loop = sf.garble(0, rr.cards, rr.loop, rng)
    assert np.all(np.isnan(batch.utilization)) and np.all(np.isnan(batch.die_temp_c))
    assert np.isnan(loop.supply_temp_c) and np.isnan(loop.return_temp_c) and loop.flow_lpm == 100.0


def test_garbage_hits_each_card_with_the_share_asked_and_overlapping_windows_each_draw() -> None:
    """A share of 0.25 hits about a quarter of the cards (not three quarters); two windows of 0.5 in
    force together hit about 1 - 0.5 x 0.5 = 3/4 of them, and when one ends the other still hits half."""
    big = rack_reading(0, 0.0, power_w=300.0, n=4000)
    assert big.cards is not None and big.loop is not None
    rng = np.random.default_rng(2)
    sf = SensorFaults(n_racks=1)
    quarter = GarbageReadings(rack=0, start_s=0.0, mode="garbage", fraction=0.25)
    sf.switch(quarter, on=True)
    batch, _ = sf.garble(0, big.cards, big.loop, rng)
    assert 0.22 < float(np.mean(batch.power_w == -1234.5)) < 0.28
    sf.switch(quarter, on=False)
    a = GarbageReadings(rack=0, start_s=0.0, end_s=100.0, mode="garbage", fraction=0.5)
    b = GarbageReadings(rack=0, start_s=10.0, mode="garbage", fraction=0.5)
    sf.switch(a, on=True)
    sf.switch(b, on=True)
    batch, _ = sf.garble(0, big.cards, big.loop, rng)
    assert 0.72 < float(np.mean(batch.power_w == -1234.5)) < 0.78
    sf.switch(a, on=False)
    batch, _ = sf.garble(0, big.cards, big.loop, rng)
    assert 0.47 < float(np.mean(batch.power_w == -1234.5)) < 0.53
    sf.switch(b, on=False)
    batch, loop = sf.garble(0, big.cards, big.loop, rng)
    assert batch is big.cards and loop is big.loop  # the last window ended: untouched
