"""Fault and weather dataclasses: validation, TOML decoding, profiles."""

from __future__ import annotations

import math

import pytest

from twin.faults import (
    CardFailure,
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
