"""Faults and weather for the virtual plant: plain frozen dataclasses a scenario file can create.

Every fault names the rack or card it hits and when (s from the start of the run); ``end_s`` /
``repair_after_s`` default to never. Field metadata carries valid ranges for
``twin.tables.decode_table``, so a TOML scenario table decodes straight into these classes.

What each fault does in ``twin.plant.Plant`` (docs/twin.md, "Faults"):

* :class:`SensorDropout`: the rack publishes nothing (no card batch, loop or PDU reading).
* :class:`StuckSensor`: the rack's readings (or one card's) repeat the values of the first reading
  taken at or after ``start_s``; timestamps still advance.
* :class:`GarbageReadings`: a share of the rack's card readings are NaN (``mode="nan"``) or
  implausible numbers (``mode="garbage"``: negative power, 1e4 deg C, utilization 7...).
* :class:`CardFailure`: the card stops (draws 0 W, cools down, refuses commands). Its job, if any,
  goes to WAITING, holds its cards for ``PhaseModel.restart_delay_s`` (teardown), rolls back to its
  last completed checkpoint and is queued again at the front; the scheduler places it on healthy
  cards. A job that loses cards more than ``PhaseModel.max_restarts`` times fails. Failures of one
  card may overlap: it works again when the last of them is repaired.
* :class:`PumpDegradation`: the rack loop's flow falls to ``flow_fraction`` of nominal (linearly
  over ``ramp_s``): every cold plate's resistance rises along the OCP R-vs-flow curve, the return
  temperature rises, the pump draws less (affinity law).
* :class:`ColdPlateFouling`: one card's case-to-coolant resistance is multiplied by ``r_factor``.
* :class:`HeatWave`: ambient rises by ``peak_delta_k`` over ``ramp_s``, holds ``hold_s``, falls back
  over ``ramp_s``; adds to the ambient profile.

A fault that starts at t = 0 is in force from the start: in the readings taken before the first
step and when the jobs running at the start are placed (``Plant.add_fault``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from twin.tables import choices, rng

__all__ = [
    "Ambient",
    "CardFailure",
    "ColdPlateFouling",
    "ConstantAmbient",
    "DiurnalAmbient",
    "Fault",
    "GarbageReadings",
    "HeatWave",
    "PiecewiseAmbient",
    "PumpDegradation",
    "SensorDropout",
    "StuckSensor",
]

_INF = math.inf


def _check_window(name: str, start_s: float, end_s: float) -> None:
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"{name}: start must be a finite time >= 0 s, got {start_s}")
    if not end_s > start_s:
        raise ValueError(f"{name}: end_s ({end_s}) must be after start_s ({start_s})")


@dataclass(frozen=True)
class SensorDropout:
    rack: int = field(metadata=rng(0))
    start_s: float = field(metadata=rng(0.0))
    end_s: float = field(default=_INF, metadata=rng(0.0))

    def __post_init__(self) -> None:
        _check_window("SensorDropout", self.start_s, self.end_s)


@dataclass(frozen=True)
class StuckSensor:
    rack: int = field(metadata=rng(0))
    start_s: float = field(metadata=rng(0.0))
    end_s: float = field(default=_INF, metadata=rng(0.0))
    #: None: every reading of the rack is frozen; otherwise only this card's (site card index)
    card: int | None = field(default=None, metadata=rng(0))

    def __post_init__(self) -> None:
        _check_window("StuckSensor", self.start_s, self.end_s)


@dataclass(frozen=True)
class GarbageReadings:
    rack: int = field(metadata=rng(0))
    start_s: float = field(metadata=rng(0.0))
    end_s: float = field(default=_INF, metadata=rng(0.0))
    mode: str = field(default="nan", metadata=choices("nan", "garbage"))
    #: share of the rack's card readings affected in each reading (chosen at random), 0..1; a scenario
    #: file's ``[[faults]]`` must give more than 0 (the range below): there a fault that garbles nothing
    #: is a mistake, as a window or broker outage of no length is
    fraction: float = field(default=1.0, metadata=rng(0.0, 1.0, lo_open=True))

    def __post_init__(self) -> None:
        _check_window("GarbageReadings", self.start_s, self.end_s)
        if self.mode not in ("nan", "garbage"):
            raise ValueError(f"GarbageReadings.mode must be 'nan' or 'garbage', got {self.mode!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"GarbageReadings.fraction must be within 0..1, got {self.fraction}")


@dataclass(frozen=True)
class CardFailure:
    card: int = field(metadata=rng(0))
    at_s: float = field(metadata=rng(0.0))
    repair_after_s: float = field(default=_INF, metadata=rng(0.0, lo_open=True))

    def __post_init__(self) -> None:
        _check_window("CardFailure", self.at_s, self.at_s + self.repair_after_s)


@dataclass(frozen=True)
class PumpDegradation:
    rack: int = field(metadata=rng(0))
    start_s: float = field(metadata=rng(0.0))
    #: the rack loop's flow at the fault's full strength, a share of nominal, 0.05..1; a scenario file's
    #: ``[[faults]]`` must give less than 1 (the range below): there a pump that keeps its full flow is a
    #: mistake, as a window of no length is
    flow_fraction: float = field(metadata=rng(0.05, 1.0, hi_open=True))
    ramp_s: float = field(default=0.0, metadata=rng(0.0))
    end_s: float = field(default=_INF, metadata=rng(0.0))

    def __post_init__(self) -> None:
        _check_window("PumpDegradation", self.start_s, self.end_s)
        if not 0.05 <= self.flow_fraction <= 1.0:
            raise ValueError(f"PumpDegradation.flow_fraction must be within 0.05..1, got {self.flow_fraction}")
        if self.ramp_s < 0:
            raise ValueError("PumpDegradation.ramp_s must be >= 0")

    def fraction_at(self, t_s: float) -> float:
        """Flow fraction of the rack loop at ``t_s`` (1 outside the fault)."""
        if t_s < self.start_s or t_s >= self.end_s:
            return 1.0
        if self.ramp_s <= 0.0:
            return self.flow_fraction
        x = min((t_s - self.start_s) / self.ramp_s, 1.0)
        return 1.0 + (self.flow_fraction - 1.0) * x


@dataclass(frozen=True)
class ColdPlateFouling:
    card: int = field(metadata=rng(0))
    start_s: float = field(metadata=rng(0.0))
    #: multiplies the card's case-to-coolant resistance, 1..20; a scenario file's ``[[faults]]`` must give
    #: more than 1 (the range below): there a plate that is not fouled is a mistake
    r_factor: float = field(metadata=rng(1.0, 20.0, lo_open=True))
    end_s: float = field(default=_INF, metadata=rng(0.0))

    def __post_init__(self) -> None:
        _check_window("ColdPlateFouling", self.start_s, self.end_s)
        if not 1.0 <= self.r_factor <= 20.0:
            raise ValueError(f"ColdPlateFouling.r_factor must be within 1..20, got {self.r_factor}")


@dataclass(frozen=True)
class HeatWave:
    start_s: float = field(metadata=rng(0.0))
    #: added to the ambient at the peak, -30..30 K (negative: a cold snap); a scenario file's ``[[faults]]``
    #: must not give 0 (the range below): there a wave that leaves the ambient as it is is a mistake
    peak_delta_k: float = field(metadata=rng(-30.0, 30.0, not_zero=True))
    # the shape of the event, not a measurement: an hour's rise, four hours at the peak (the afternoon)
    ramp_s: float = field(default=3600.0, metadata=rng(0.0))
    hold_s: float = field(default=4 * 3600.0, metadata=rng(0.0))

    def __post_init__(self) -> None:
        _check_window("HeatWave", self.start_s, self.start_s + 2 * self.ramp_s + self.hold_s + 1e-9)
        if not (self.ramp_s >= 0 and self.hold_s >= 0):
            raise ValueError(f"HeatWave: ramp_s and hold_s must be >= 0, got {self.ramp_s} and {self.hold_s}")

    def delta_k(self, t_s: float) -> float:
        """Ambient increase at ``t_s``: in force over ``[start_s, start_s + 2 ramp_s + hold_s)`` like the
        other faults' windows, so that a wave without a ramp is a step of ``hold_s`` from ``start_s`` on
        (in the readings of ``start_s`` itself, and no longer in those of its end)."""
        x = t_s - self.start_s
        down = self.ramp_s + self.hold_s
        if x < 0.0 or x >= down + self.ramp_s:
            return 0.0
        if x < self.ramp_s:
            return self.peak_delta_k * x / self.ramp_s
        if x <= down:
            return self.peak_delta_k
        return self.peak_delta_k * (1.0 - (x - down) / self.ramp_s)


Fault = SensorDropout | StuckSensor | GarbageReadings | CardFailure | PumpDegradation | ColdPlateFouling | HeatWave


# --------------------------------------------------------------------------------------------
# Ambient profiles
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConstantAmbient:
    temp_c: float = field(metadata=rng(-40.0, 55.0))

    def temp_at_c(self, t_s: float) -> float:
        return self.temp_c


@dataclass(frozen=True)
class DiurnalAmbient:
    """``mean_c + amplitude_k * cos(2 pi (t - peak_time_s) / period_s)``: warmest at ``peak_time_s``
    (15:00 by default, t = 0 is midnight)."""

    mean_c: float = field(metadata=rng(-40.0, 55.0))
    # assumption: a temperate site's day, +-5 K around its mean (a 10 K daily range), warmest mid-afternoon
    amplitude_k: float = field(default=5.0, metadata=rng(0.0, 30.0))
    peak_time_s: float = field(default=15 * 3600.0, metadata=rng(0.0))
    period_s: float = field(default=86400.0, metadata=rng(0.0, lo_open=True))

    def temp_at_c(self, t_s: float) -> float:
        return self.mean_c + self.amplitude_k * math.cos(2.0 * math.pi * (t_s - self.peak_time_s) / self.period_s)


@dataclass(frozen=True)
class PiecewiseAmbient:
    """Linear between ``(times_s[i], temps_c[i])``, constant outside."""

    times_s: tuple[float, ...] = field(metadata=rng(0.0))
    temps_c: tuple[float, ...] = field(metadata=rng(-40.0, 55.0))

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.temps_c) or not self.times_s:
            raise ValueError("PiecewiseAmbient: times_s and temps_c must be non-empty and of equal length")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise ValueError("PiecewiseAmbient: times_s must be strictly increasing")

    def temp_at_c(self, t_s: float) -> float:
        return float(np.interp(t_s, self.times_s, self.temps_c))


Ambient = ConstantAmbient | DiurnalAmbient | PiecewiseAmbient
