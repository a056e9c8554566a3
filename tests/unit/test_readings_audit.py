"""Mutation audit of twin.readings: what a reading carries, its bounds and its time stamps, by hand
from the module's docstrings and docs/twin.md."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from readings_testing import card_batch

from twin.readings import (
    JOB_EVENT_KINDS,
    MAX_PUMP_SPEED_FRAC,
    CardBatch,
    LoopReading,
    PduReading,
    RackReading,
    pump_speed_in_range,
)

pytestmark = pytest.mark.unit

_COLUMNS = [f.name for f in dataclasses.fields(CardBatch) if f.name != "card_index"]


@pytest.mark.parametrize("column", _COLUMNS)
def test_a_column_of_one_row_per_card_but_several_values_each_is_refused(column: str) -> None:
    # "one value per card in every column": a (4, 2) column has 4 rows but 8 values; it used to pass
    # (only len() was compared) and reach the belief as two values per card
    good = dataclasses.replace(card_batch(range(4)), host_off=np.zeros(4, dtype=bool))
    col = getattr(good, column)
    wide = np.stack([col, col], axis=1)
    with pytest.raises(ValueError, match=rf"CardBatch\.{column} has shape \(4, 2\), not one value for each of the 4 "):
        dataclasses.replace(good, **{column: wide})


def test_a_card_index_of_one_row_per_card_but_two_dimensions_is_refused() -> None:
    b = card_batch(range(4))
    with pytest.raises(ValueError, match=r"CardBatch\.card_index must be one-dimensional, got shape \(4, 1\)"):
        dataclasses.replace(b, card_index=np.arange(4).reshape(4, 1))


def test_a_pump_speed_is_in_range_from_stopped_to_full_speed_and_nan_is_not() -> None:
    # docs/twin.md: a loop reading's speed outside 0 .. full speed is no reading; 0 is a stopped pump
    assert MAX_PUMP_SPEED_FRAC == 1.0
    assert pump_speed_in_range(0.0) and pump_speed_in_range(1.0 / 3.0) and pump_speed_in_range(1.0)
    assert not pump_speed_in_range(-1e-9)
    assert not pump_speed_in_range(1.0 + 1e-9)
    assert not pump_speed_in_range(math.nan)


def test_a_loop_reading_that_leaves_out_its_pump_speed_reports_none() -> None:
    loop = LoopReading(supply_temp_c=30.0, return_temp_c=36.0, flow_lpm=90.0, pump_power_w=300.0)
    assert math.isnan(loop.pump_speed_frac)


def test_each_part_of_a_rack_reading_has_its_own_time_stamp_or_the_readings() -> None:
    r = RackReading(rack=2, time_s=10.0, cards=card_batch(range(2)), loop=None, pdu=PduReading(5e3), cards_time_s=7.0)
    assert (r.part_time_s("cards"), r.part_time_s("loop"), r.part_time_s("pdu")) == (7.0, 10.0, 10.0)
    s = dataclasses.replace(r, cards_time_s=None, loop_time_s=8.0, pdu_time_s=9.0)
    assert (s.part_time_s("cards"), s.part_time_s("loop"), s.part_time_s("pdu")) == (10.0, 8.0, 9.0)
    with pytest.raises(ValueError, match="no part 'host'"):
        r.part_time_s("host")  # type: ignore[arg-type]  # deliberately wrong: the test checks the refusal


def test_the_job_event_kinds_are_the_six_documented() -> None:
    assert JOB_EVENT_KINDS == ("submitted", "started", "phase", "requeued", "finished", "failed")


def test_readings_are_frozen_so_a_shared_reading_cannot_be_changed_under_another_reader() -> None:
    b = card_batch(range(2))
    r = RackReading(rack=0, time_s=1.0, cards=b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.power_w = np.zeros(2)  # type: ignore[misc]  # deliberate: the test checks the refusal
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.time_s = 2.0  # type: ignore[misc]  # deliberate: the test checks the refusal
