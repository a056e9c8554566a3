"""Card power vs DVFS level, utilization and die temperature; the card's own protection; fitting.

The model (DESIGN.md, "card power"), per level ``k`` with clock ``f_k`` and voltage ``V_k``::

    P_active(k, u, T) = idle_w[k] + leak_w_per_k[k] * (T - T_ref) + u * dyn_w[k]
        idle_w[k]       = idle_power_w    * (V_k/V_0)^2           static + clock tree at u = 0
        leak_w_per_k[k] = leakage_w_per_k * (V_k/V_0)             leakage current ~ V
        dyn_w[k]        = dynamic_power_w * (f_k/f_0) * (V_k/V_0)^2   switching power C f V^2
    P_low_power(T)    = low_power_idle_w + low_power_leakage_w_per_k * (T - T_ref)

All functions are vectorized over cards (numpy arrays); levels are integer arrays.

Fitting (``fit_power``) uses the same shape with the usual DVFS voltage curve, a floor below a knee
and linear above it: ``V(f)/V(f_0) = max(v_floor, 1 - slope * (1 - f/f_0))``. A fitted result maps
directly onto a card spec: ``idle_power_w``, ``dynamic_power_w``, ``leakage_w_per_k`` and a voltage
table for any clock list. On ``perseus_stage_profile_gpt3-175b+a100_sxm_bf16.csv`` it fits 38 clocks
with a mean absolute error under 1% (tests/unit/test_power_fit.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from twin.spec import CardSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Temperature above the slowdown threshold that costs one DVFS level of hardware slowdown.
#: A modelling choice (no public per-level figure): firmware steps the clock down as the die
#: passes its slowdown temperature, so a die 3 K over it runs 3 levels lower.
SLOWDOWN_K_PER_LEVEL = 1.0

#: Power never modelled below this fraction of the level's idle power. A modelling guard, not a
#: measurement: the linear leakage term, extrapolated to a die far below the reference temperature,
#: would otherwise eat the idle power (the example card reaches it only with a die ~90 K under 42 deg C,
#: which no scenario has).
_MIN_POWER_FRACTION = 0.5


@dataclass(frozen=True)
class PowerModel:
    """Per-level power coefficients derived from a :class:`CardSpec` (arrays of length L)."""

    clocks_mhz: FloatArray
    idle_w: FloatArray
    leak_w_per_k: FloatArray
    dyn_w: FloatArray
    reference_temp_c: float
    low_power_idle_w: float
    low_power_leak_w_per_k: float
    power_limit_w: float
    slowdown_temp_c: float

    @classmethod
    def from_card(cls, card: CardSpec) -> PowerModel:
        f = np.asarray(card.clocks_mhz, dtype=np.float64)
        v = np.asarray(card.voltages_v, dtype=np.float64)
        f_rel, v_rel = f / f[0], v / v[0]
        return cls(
            clocks_mhz=f,
            idle_w=card.idle_power_w * v_rel**2,
            leak_w_per_k=card.leakage_w_per_k * v_rel,
            dyn_w=card.dynamic_power_w * f_rel * v_rel**2,
            reference_temp_c=card.reference_temp_c,
            low_power_idle_w=card.low_power_idle_w,
            low_power_leak_w_per_k=card.low_power_leakage_w_per_k,
            power_limit_w=card.power_limit_w,
            slowdown_temp_c=card.slowdown_temp_c,
        )

    @property
    def n_levels(self) -> int:
        return int(self.clocks_mhz.shape[0])

    # ---- power --------------------------------------------------------------------------------
    def active_power_w(self, level: IntArray, utilization: FloatArray, die_temp_c: FloatArray) -> FloatArray:
        """Power of cards that are awake, at ``level`` and ``utilization`` (0..1)."""
        idle = self.idle_w[level]
        p = idle + self.leak_w_per_k[level] * (die_temp_c - self.reference_temp_c) + utilization * self.dyn_w[level]
        return np.maximum(p, _MIN_POWER_FRACTION * idle)

    def low_power_w(self, die_temp_c: FloatArray) -> FloatArray:
        """Power of cards in the low-power idle state."""
        p = self.low_power_idle_w + self.low_power_leak_w_per_k * (die_temp_c - self.reference_temp_c)
        return np.maximum(p, _MIN_POWER_FRACTION * self.low_power_idle_w)

    def card_power_w(
        self,
        level: IntArray,
        utilization: FloatArray,
        die_temp_c: FloatArray,
        low_power: npt.NDArray[np.bool_],
    ) -> FloatArray:
        """Power of every card: active at ``level`` unless in the low-power state."""
        return np.where(low_power, self.low_power_w(die_temp_c), self.active_power_w(level, utilization, die_temp_c))

    def level_power_table_w(self, utilization: FloatArray, die_temp_c: FloatArray) -> FloatArray:
        """Power of every card at every level, shape (n_cards, L)."""
        u = np.asarray(utilization, dtype=np.float64)[:, None]
        t = np.asarray(die_temp_c, dtype=np.float64)[:, None]
        p = self.idle_w[None, :] + self.leak_w_per_k[None, :] * (t - self.reference_temp_c) + u * self.dyn_w[None, :]
        return np.maximum(p, _MIN_POWER_FRACTION * self.idle_w[None, :])

    # ---- the card's own protection -------------------------------------------------------------
    def protected_level(
        self,
        requested_level: IntArray,
        utilization: FloatArray,
        die_temp_c: FloatArray,
        power_limit_w: FloatArray | float | None = None,
    ) -> IntArray:
        """The level a card actually runs at, after its firmware protection.

        Power brake: the fastest level at or below the requested one whose power stays within the
        card's power limit (the slowest level if none does). Thermal slowdown: one more level for
        each ``SLOWDOWN_K_PER_LEVEL`` above the slowdown temperature.
        """
        limit = self.power_limit_w if power_limit_w is None else power_limit_w
        req = np.asarray(requested_level, dtype=np.int64)
        n_levels = self.n_levels
        table = self.level_power_table_w(utilization, die_temp_c)
        lim = np.broadcast_to(np.asarray(limit, dtype=np.float64), req.shape)[:, None]
        ok = (table <= lim + 1e-9) & (np.arange(n_levels)[None, :] >= req[:, None])
        # first True along levels; if none, the slowest level
        any_ok = ok.any(axis=1)
        braked = np.where(any_ok, ok.argmax(axis=1), n_levels - 1).astype(np.int64)
        over = np.asarray(die_temp_c, dtype=np.float64) - self.slowdown_temp_c
        thermal_steps = np.where(over > 0.0, np.ceil(over / SLOWDOWN_K_PER_LEVEL), 0.0).astype(np.int64)
        return np.asarray(np.minimum(braked + thermal_steps, n_levels - 1), dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Fitting from an nvidia-smi / DCGM sweep
# --------------------------------------------------------------------------------------------


class FitError(ValueError):
    """The samples cannot support a fit (too few distinct points, non-finite values...)."""


#: The range ``fit_power`` searches for the voltage floor (V at the floor over V at the top clock): a
#: sweep whose voltage falls lower is fitted with its floor at the range's lower bound.
FIT_VOLTAGE_FLOOR_REL = (0.4, 1.0)

#: The leakage slope is fitted only when ``temperature_c`` spans more than this (K); a narrower
#: spread cannot separate leakage from idle power, and the slope is reported as 0.
LEAKAGE_MIN_TEMP_SPAN_K = 0.5


@dataclass(frozen=True)
class PowerFit:
    """A fitted card power model. ``voltage_rel(f)`` is V(f)/V(top_clock_mhz)."""

    idle_power_w: float
    dynamic_power_w: float
    leakage_w_per_k: float
    voltage_floor_rel: float
    voltage_slope_rel: float
    top_clock_mhz: float
    reference_temp_c: float
    mape: float
    n_samples: int
    #: False when the samples cannot identify the parameter, which is then reported as 0: no
    #: ``temperature_c`` or one spanning at most ``LEAKAGE_MIN_TEMP_SPAN_K`` (leakage); a
    #: utilization of 0 on every sample (dynamic power).
    leakage_identified: bool = True
    dynamic_identified: bool = True

    def voltage_rel(self, clock_mhz: FloatArray | float) -> FloatArray:
        return _voltage_rel(
            np.asarray(clock_mhz, dtype=np.float64) / self.top_clock_mhz, self.voltage_floor_rel, self.voltage_slope_rel
        )

    def predict_w(
        self,
        clock_mhz: FloatArray | float,
        utilization: FloatArray | float = 1.0,
        temperature_c: FloatArray | float | None = None,
    ) -> FloatArray:
        f = np.asarray(clock_mhz, dtype=np.float64)
        v = self.voltage_rel(f)
        t = self.reference_temp_c if temperature_c is None else np.asarray(temperature_c, dtype=np.float64)
        u = np.asarray(utilization, dtype=np.float64)
        return np.asarray(
            v**2 * (self.idle_power_w + u * self.dynamic_power_w * f / self.top_clock_mhz)
            + self.leakage_w_per_k * v * (t - self.reference_temp_c),
            dtype=np.float64,
        )

    def params(self) -> dict[str, float]:
        return {
            "idle_power_w": self.idle_power_w,
            "dynamic_power_w": self.dynamic_power_w,
            "leakage_w_per_k": self.leakage_w_per_k,
            "voltage_floor_rel": self.voltage_floor_rel,
            "voltage_slope_rel": self.voltage_slope_rel,
            "top_clock_mhz": self.top_clock_mhz,
            "reference_temp_c": self.reference_temp_c,
        }


def _voltage_rel(x: FloatArray, v_floor: float, slope: float) -> FloatArray:
    return np.maximum(v_floor, 1.0 - slope * (1.0 - x))


def _nonneg_lstsq(a: FloatArray, b: FloatArray) -> FloatArray:
    """Least squares with non-negative coefficients (exhaustive active set; a has few columns)."""
    sol, *_ = np.linalg.lstsq(a, b, rcond=None)
    if np.all(sol >= 0.0):
        return np.asarray(sol, dtype=np.float64)
    n = a.shape[1]
    best = np.zeros(n)
    best_res = math.inf
    for mask in range(1, (1 << n) - 1):
        cols = [j for j in range(n) if mask >> j & 1]
        sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(sub < 0.0):
            continue
        x = np.zeros(n)
        x[cols] = sub
        res = float(np.sum((a @ x - b) ** 2))
        if res < best_res:
            best, best_res = x, res
    return best


def fit_power(
    clock_mhz: FloatArray,
    power_w: FloatArray,
    utilization: FloatArray | None = None,
    temperature_c: FloatArray | None = None,
) -> PowerFit:
    """Fit the card power model to samples of a clock sweep.

    ``utilization`` (0..1) defaults to 1 (a sweep under full load); without ``temperature_c``, or
    with one spanning at most ``LEAKAGE_MIN_TEMP_SPAN_K``, the leakage slope is not identifiable and
    is reported as 0 at the reference temperature; with utilization 0 on every sample the dynamic
    power is not either and is reported as 0 (``PowerFit.leakage_identified``/``dynamic_identified``).
    The voltage floor is searched within ``FIT_VOLTAGE_FLOOR_REL`` (0.4..1), the slope within 0..2.2.
    Raises :class:`FitError` when the samples cannot support the fit.
    """
    f = np.asarray(clock_mhz, dtype=np.float64)
    p = np.asarray(power_w, dtype=np.float64)
    u = np.ones_like(f) if utilization is None else np.asarray(utilization, dtype=np.float64)
    t = np.zeros_like(f) if temperature_c is None else np.asarray(temperature_c, dtype=np.float64)
    for name, arr in (("clock_mhz", f), ("power_w", p), ("utilization", u), ("temperature_c", t)):
        if arr.shape != f.shape:
            raise FitError(f"column {name} has {arr.size} values, clock_mhz has {f.size}")
        if not np.all(np.isfinite(arr)):
            raise FitError(f"column {name} has non-finite values (NaN or infinity)")
    if np.any(f <= 0) or np.any(p <= 0):
        raise FitError("clock_mhz and power_w must be positive")
    if np.any((u < 0) | (u > 1)):
        raise FitError("utilization must be within 0..1 (a fraction, not percent)")
    n_distinct = int(np.unique(f).size)
    if n_distinct < 4:
        raise FitError(f"need at least 4 distinct clocks to fit, got {n_distinct}")
    f_top = float(f.max())
    x_rel = f / f_top
    fit_leak = temperature_c is not None and float(np.ptp(t)) > LEAKAGE_MIN_TEMP_SPAN_K
    t_ref = float(np.median(t)) if temperature_c is not None else 0.0

    def solve(v_floor: float, slope: float) -> tuple[float, FloatArray]:
        v = _voltage_rel(x_rel, v_floor, slope)
        cols = [v**2, v**2 * u * x_rel]
        if fit_leak:
            cols.append(v * (t - t_ref))
        a = np.stack(cols, axis=1)
        coef = _nonneg_lstsq(a, p)
        return float(np.sum((a @ coef - p) ** 2)), coef

    # Coarse grid over the voltage curve, then two finer grids around the best point. No range is ever
    # inverted: the best floor (on the last grid, or the start while no error is finite) lies within
    # FIT_VOLTAGE_FLOOR_REL, so clipping best -/+ d to it keeps lo <= best <= hi (one-sided at a bound:
    # [0.4, 0.4 + d]); likewise the slope's, clipped at 0 only.
    floor_lo, floor_hi = FIT_VOLTAGE_FLOOR_REL
    slope_lo, slope_hi = 0.0, 2.0
    best = (math.inf, floor_hi, slope_lo)
    for _ in range(3):
        for v_floor in np.linspace(floor_lo, floor_hi, 25):
            for slope in np.linspace(slope_lo, slope_hi, 25):
                err, _ = solve(float(v_floor), float(slope))
                if err < best[0]:
                    best = (err, float(v_floor), float(slope))
        d_floor, d_slope = (floor_hi - floor_lo) / 12, (slope_hi - slope_lo) / 12
        floor_lo = max(FIT_VOLTAGE_FLOOR_REL[0], best[1] - d_floor)
        floor_hi = min(FIT_VOLTAGE_FLOOR_REL[1], best[1] + d_floor)
        slope_lo, slope_hi = max(0.0, best[2] - d_slope), best[2] + d_slope
    _, coef = solve(best[1], best[2])
    fit = PowerFit(
        idle_power_w=float(coef[0]),
        dynamic_power_w=float(coef[1]),
        leakage_w_per_k=float(coef[2]) if fit_leak else 0.0,
        voltage_floor_rel=best[1],
        voltage_slope_rel=best[2],
        top_clock_mhz=f_top,
        reference_temp_c=t_ref,
        mape=0.0,
        n_samples=int(f.size),
        leakage_identified=fit_leak,
        dynamic_identified=bool(np.any(u > 0.0)),
    )
    pred = fit.predict_w(f, u, t if temperature_c is not None else None)
    mape = float(np.mean(np.abs(pred - p) / p))
    return dataclasses.replace(fit, mape=mape)
