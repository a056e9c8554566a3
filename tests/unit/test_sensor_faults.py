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
    return tuple(np.full(4, x) for _ in range(4))  # type: ignore[return-value]


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
