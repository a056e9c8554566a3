"""twin.sensor_faults, audited against its docstring and docs/sim.md's fault catalogue: what a garbage
window leaves alone (the loop below a share of 1, the reading it garbles), and a stuck sensor and a
dropout in force from their own windows only. Values are read off the docs, not off the code."""

from __future__ import annotations

import math

import numpy as np
import pytest
from readings_testing import card_batch

from twin.faults import GarbageReadings, SensorDropout, StuckSensor
from twin.readings import LoopReading, PduReading, RackReading
from twin.sensor_faults import SensorFaults

pytestmark = pytest.mark.unit


def rack_reading(rack: int, time_s: float, power_w: float, n: int = 8) -> RackReading:
    batch = card_batch(np.arange(n), power_w=power_w, die_temp_c=60.0, utilization=0.9)
    return RackReading(
        rack=rack, time_s=time_s, cards=batch, loop=LoopReading(30.0, 40.0, 100.0, 500.0), pdu=PduReading(power_w * n)
    )


@pytest.mark.parametrize("mode", ["nan", "garbage"])
def test_below_a_share_of_one_the_loop_reads_true(mode: str) -> None:
    """Only at a share of 1 does the loop go bad too: at 0.5, or 0.999, the CDU reads as read in either
    mode, while the cards are hit."""
    rr = rack_reading(0, 0.0, power_w=300.0, n=2000)
    assert rr.cards is not None and rr.loop is not None
    for share in (0.5, 0.999):
        sf = SensorFaults(n_racks=1)
        sf.switch(GarbageReadings(rack=0, start_s=0.0, mode=mode, fraction=share), on=True)
        batch, loop = sf.garble(0, rr.cards, rr.loop, np.random.default_rng(3))
        assert loop == rr.loop
        assert not np.all(batch.power_w == 300.0)


def test_garbage_leaves_the_reading_it_garbles_as_read() -> None:
    """The garbled batch is a new one: the plant's own card values (power, die, utilisation) are not
    overwritten in place, in either mode."""
    for mode in ("nan", "garbage"):
        rr = rack_reading(0, 0.0, power_w=300.0)
        assert rr.cards is not None and rr.loop is not None
        sf = SensorFaults(n_racks=1)
        sf.switch(GarbageReadings(rack=0, start_s=0.0, mode=mode), on=True)
        batch, loop = sf.garble(0, rr.cards, rr.loop, np.random.default_rng(4))
        assert not np.any(batch.utilization == 0.9) and not np.any(batch.die_temp_c == 60.0)
        assert np.all(rr.cards.power_w == 300.0) and np.all(rr.cards.die_temp_c == 60.0)
        assert np.all(rr.cards.utilization == 0.9)
        assert rr.loop == LoopReading(30.0, 40.0, 100.0, 500.0) and loop != rr.loop


def test_garbage_at_a_share_of_zero_hits_no_card() -> None:
    rr = rack_reading(0, 0.0, power_w=300.0, n=4000)
    assert rr.cards is not None and rr.loop is not None
    sf = SensorFaults(n_racks=1)
    sf.switch(GarbageReadings(rack=0, start_s=0.0, mode="garbage", fraction=0.0), on=True)
    batch, loop = sf.garble(0, rr.cards, rr.loop, np.random.default_rng(5))
    assert np.all(batch.power_w == 300.0) and loop == rr.loop


def test_garbage_on_one_rack_leaves_the_others_and_ending_it_leaves_no_trace() -> None:
    rr = rack_reading(1, 0.0, power_w=300.0)
    assert rr.cards is not None and rr.loop is not None
    sf = SensorFaults(n_racks=2)
    g = GarbageReadings(rack=0, start_s=0.0, mode="nan")
    sf.switch(g, on=True)
    batch, loop = sf.garble(1, rr.cards, rr.loop, np.random.default_rng(6))
    assert batch is rr.cards and loop is rr.loop
    sf.switch(g, on=False)
    batch, loop = sf.garble(0, rr.cards, rr.loop, np.random.default_rng(6))
    assert batch is rr.cards and loop is rr.loop
    assert not math.isnan(loop.supply_temp_c)


def test_one_dropout_window_drops_its_rack_until_it_ends() -> None:
    sf = SensorFaults(n_racks=3)
    d = SensorDropout(rack=2, start_s=5.0, end_s=8.0)
    assert not sf.dropped(2)
    sf.switch(d, on=True)
    assert sf.dropped(2) and not sf.dropped(0) and not sf.dropped(1)
    sf.switch(d, on=False)
    assert not sf.dropped(2)


def test_a_stuck_rack_forgets_its_reading_when_its_one_window_ends() -> None:
    """A single window: repeated while in force, read afresh after, and a later window freezes at its
    own first reading, not the old one."""
    sf = SensorFaults(n_racks=1)
    w = StuckSensor(rack=0, start_s=1.0, end_s=5.0)
    sf.switch(w, on=True)
    sf.seen(rack_reading(0, 1.0, power_w=111.0))
    held = sf.frozen_rack(0, 4.0)
    assert held is not None and held.time_s == 4.0 and held.pdu == PduReading(888.0)
    sf.switch(w, on=False)
    assert sf.frozen_rack(0, 5.0) is None
    sf.seen(rack_reading(0, 5.0, power_w=222.0))  # not stuck: nothing kept
    sf.switch(StuckSensor(rack=0, start_s=9.0), on=True)
    assert sf.frozen_rack(0, 9.0) is None
    sf.seen(rack_reading(0, 9.0, power_w=333.0))
    again = sf.frozen_rack(0, 10.0)
    assert again is not None and again.pdu == PduReading(333.0 * 8)


def test_a_stuck_card_window_freezes_only_its_own_card_and_ends_cleanly() -> None:
    sf = SensorFaults(n_racks=1)
    w = StuckSensor(rack=0, start_s=0.0, end_s=10.0, card=3)
    sf.switch(w, on=True)
    first = [np.full(8, 1.0) for _ in range(4)]
    sf.freeze_stuck_cards(*first)
    later = [np.full(8, 2.0) for _ in range(4)]
    sf.freeze_stuck_cards(*later)
    assert [float(a[3]) for a in later] == [1.0] * 4 and all(float(a[2]) == 2.0 for a in later)
    sf.switch(w, on=False)
    after = [np.full(8, 3.0) for _ in range(4)]
    sf.freeze_stuck_cards(*after)
    assert all(np.all(a == 3.0) for a in after)
