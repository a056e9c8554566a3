"""Fault and weather dataclasses: validation, TOML decoding, profiles."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from twin.faults import (
    CardFailure,
    ColdPlateFouling,
    ConstantAmbient,
    DiurnalAmbient,
    GarbageReadings,
    HeatWave,
    PiecewiseAmbient,
    PumpDegradation,
    SensorDropout,
    StuckSensor,
)
from twin.tables import SpecError, decode_table

pytestmark = pytest.mark.unit


def test_faults_decode_from_scenario_tables() -> None:
    f = decode_table(PumpDegradation, {"rack": 3, "start_s": 600.0, "flow_fraction": 0.5}, "scenario.toml", "faults[0]")
    assert f == PumpDegradation(rack=3, start_s=600.0, flow_fraction=0.5)
    s = decode_table(StuckSensor, {"rack": 1, "start_s": 10.0, "card": 70}, "scenario.toml", "faults[1]")
    assert s.card == 70 and math.isinf(s.end_s)
    with pytest.raises(SpecError, match=r"faults\[2\]\.mode: must be one of"):
        decode_table(GarbageReadings, {"rack": 0, "start_s": 1.0, "mode": "zeros"}, "scenario.toml", "faults[2]")
    with pytest.raises(SpecError, match="did you mean 'at_s'"):
        decode_table(CardFailure, {"card": 0, "at_sec": 1.0}, "scenario.toml", "faults[3]")


def test_fault_validation() -> None:
    with pytest.raises(ValueError, match="end_s"):
        SensorDropout(rack=0, start_s=100.0, end_s=50.0)
    with pytest.raises(ValueError, match="flow_fraction"):
        PumpDegradation(rack=0, start_s=0.0, flow_fraction=1.5)


def test_pump_ramp_and_heat_wave_shape() -> None:
    pump = PumpDegradation(rack=0, start_s=100.0, flow_fraction=0.5, ramp_s=100.0, end_s=1000.0)
    assert [pump.fraction_at(t) for t in (50.0, 150.0, 300.0, 1000.0)] == [1.0, 0.75, 0.5, 1.0]
    wave = HeatWave(start_s=0.0, peak_delta_k=8.0, ramp_s=100.0, hold_s=200.0)
    assert [wave.delta_k(t) for t in (0.0, 50.0, 150.0, 350.0, 500.0)] == [0.0, 4.0, 8.0, 4.0, 0.0]


def test_ambient_profiles() -> None:
    d = DiurnalAmbient(mean_c=20.0, amplitude_k=6.0)
    assert d.temp_at_c(15 * 3600.0) == pytest.approx(26.0)
    assert d.temp_at_c(3 * 3600.0) == pytest.approx(14.0)
    p = PiecewiseAmbient(times_s=(0.0, 3600.0), temps_c=(10.0, 20.0))
    assert [p.temp_at_c(t) for t in (-5.0, 1800.0, 9999.0)] == [10.0, 15.0, 20.0]
    with pytest.raises(ValueError, match="increasing"):
        PiecewiseAmbient(times_s=(0.0, 0.0), temps_c=(1.0, 2.0))


@pytest.mark.parametrize(
    ("cls", "table", "field"),
    [
        (GarbageReadings, {"rack": 0, "start_s": 0.0, "fraction": 1.5}, "fraction"),
        (CardFailure, {"card": 0, "at_s": 0.0, "repair_after_s": 0.0}, "repair_after_s"),
        (PumpDegradation, {"rack": 0, "start_s": 0.0, "flow_fraction": 0.01}, "flow_fraction"),
        (ColdPlateFouling, {"card": 0, "start_s": 0.0, "r_factor": 0.5}, "r_factor"),
        (ColdPlateFouling, {"card": 0, "start_s": 0.0, "r_factor": 25.0}, "r_factor"),
        (HeatWave, {"start_s": 0.0, "peak_delta_k": 31.0}, "peak_delta_k"),
        (ConstantAmbient, {"temp_c": 60.0}, "temp_c"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_field(cls: type, table: dict[str, float], field: str) -> None:
    with pytest.raises(SpecError, match=rf"faults\[0\]\.{field}: "):
        decode_table(cls, table, "scenario.toml", "faults[0]")


def test_values_at_the_edges_of_their_ranges_are_accepted() -> None:
    """Card 0, a cold snap (a negative heat wave), a pump left at 5% of its flow, a plate fouled 20 x."""
    s = decode_table(StuckSensor, {"rack": 0, "start_s": 0.0, "card": 0}, "scenario.toml", "faults[0]")
    assert s.card == 0
    cold = decode_table(HeatWave, {"start_s": 0.0, "peak_delta_k": -10.0}, "scenario.toml", "faults[0]")
    assert cold.delta_k(2 * 3600.0) == -10.0
    assert PumpDegradation(rack=0, start_s=0.0, flow_fraction=0.05).fraction_at(1.0) == 0.05
    assert ColdPlateFouling(card=0, start_s=0.0, r_factor=20.0).r_factor == 20.0


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: SensorDropout(rack=0, start_s=5.0, end_s=5.0), "end_s"),  # an empty window
        (lambda: SensorDropout(rack=0, start_s=math.inf), "finite"),
        (lambda: CardFailure(card=0, at_s=10.0, repair_after_s=-5.0), "end_s"),
        (lambda: GarbageReadings(rack=0, start_s=0.0, fraction=1.5), "fraction"),
        (lambda: PumpDegradation(rack=0, start_s=0.0, flow_fraction=0.01), "flow_fraction"),
        (lambda: PumpDegradation(rack=0, start_s=0.0, flow_fraction=0.5, ramp_s=-0.5), "ramp_s"),
        (lambda: ColdPlateFouling(card=0, start_s=0.0, r_factor=0.5), "r_factor"),
        (lambda: ColdPlateFouling(card=0, start_s=0.0, r_factor=25.0), "r_factor"),
        (lambda: PiecewiseAmbient(times_s=(), temps_c=()), "non-empty"),
        (lambda: HeatWave(start_s=0.0, peak_delta_k=5.0, ramp_s=-100.0, hold_s=300.0), "ramp_s"),
        (lambda: HeatWave(start_s=0.0, peak_delta_k=5.0, ramp_s=100.0, hold_s=-50.0), "hold_s"),
    ],
)
def test_faults_made_in_code_are_checked_as_scenario_files_are(make: Callable[[], object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        make()


def test_the_defaults_of_a_garbage_fault_and_of_a_heat_wave() -> None:
    """docs/sim.md: ``mode`` "nan" and ``fraction`` 1; a heat wave rises over an hour, holds four hours
    and falls over an hour; a diurnal day swings 5 K around its mean, warmest at 15:00."""
    g = decode_table(GarbageReadings, {"rack": 0, "start_s": 0.0}, "scenario.toml", "faults[0]")
    assert (g.mode, g.fraction) == ("nan", 1.0)
    wave = HeatWave(start_s=1000.0, peak_delta_k=8.0)
    hours = [1000.0 + h * 3600.0 for h in (0.25, 1.0, 5.0, 5.25, 6.0)]
    assert [wave.delta_k(t) for t in hours] == pytest.approx([2.0, 8.0, 8.0, 6.0, 0.0])
    assert DiurnalAmbient(mean_c=20.0).temp_at_c(15 * 3600.0) == pytest.approx(25.0)


def test_a_pump_degradation_is_in_force_from_its_start_to_its_end() -> None:
    """Its flow fraction at ``start_s`` itself (no ramp), 1 again at ``end_s``; a ramp falls linearly
    and holds at ``flow_fraction`` once done."""
    pump = PumpDegradation(rack=0, start_s=100.0, flow_fraction=0.4, end_s=200.0)
    assert [pump.fraction_at(t) for t in (99.9, 100.0, 199.9, 200.0)] == [1.0, 0.4, 0.4, 1.0]
    ramped = PumpDegradation(rack=0, start_s=100.0, flow_fraction=0.4, ramp_s=60.0)
    assert [ramped.fraction_at(t) for t in (100.0, 130.0, 160.0, 1e6)] == pytest.approx([1.0, 0.7, 0.4, 0.4])


def test_a_heat_wave_without_a_ramp_is_a_step_from_its_start_for_its_hold() -> None:
    """Like every other fault's window, ``[start_s, start_s + hold_s)``: in force at ``start_s`` itself
    (a wave from t = 0 is in the first readings), no longer at its end."""
    step = HeatWave(start_s=100.0, peak_delta_k=5.0, ramp_s=0.0, hold_s=50.0)
    assert [step.delta_k(t) for t in (99.5, 100.0, 149.5, 150.0, 200.0)] == [0.0, 5.0, 5.0, 0.0, 0.0]
    assert HeatWave(start_s=0.0, peak_delta_k=-3.0, ramp_s=0.0, hold_s=10.0).delta_k(0.0) == -3.0
