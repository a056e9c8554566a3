"""Die -> cold plate -> coolant RC network, discretized exactly, vectorized over cards.

Each card is two thermal nodes::

    die   (C_d) --R_dc-- case/cold plate (C_p) --R_pc(flow)-- coolant inlet (T_in)
      ^ P (electrical power, all dissipated in the die)

    C_d dT_d/dt = P - (T_d - T_p)/R_dc
    C_p dT_p/dt = (T_d - T_p)/R_dc - (T_p - T_in)/R_pc

``R_pc`` is the cold plate's case-to-coolant-inlet resistance at the card's flow
(``ocp_oam_1kW_coldplate_R_vs_flow.csv``), so the heat into the coolant is ``(T_p - T_in)/R_pc``
and the steady die temperature is ``T_in + P (R_dc + R_pc)``.

With power and inlet held over a step (zero-order hold), the exact solution is
``x(t+dt) = x_ss + exp(A dt) (x(t) - x_ss)``; the 2x2 matrix exponential has a closed form, so any
``dt`` is stable and a step costs a few array operations per card.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from twin.spec import SiteSpec

FloatArray = npt.NDArray[np.float64]


def plate_resistance_k_per_w(
    flow_lpm_table: tuple[float, ...],
    r_table_k_per_w: tuple[float, ...],
    flow_lpm: FloatArray | float,
) -> FloatArray:
    """Cold plate resistance at ``flow_lpm``: linear in 1/flow between table points, clamped.

    Interpolating in 1/flow follows the convective term (R ~ 1/(h A), h rising with flow) and is
    exact at the table points. Below the table's smallest flow the resistance is extrapolated
    along the last segment (a weak pump makes the plate worse, never better).
    """
    q = np.asarray(flow_lpm, dtype=np.float64)
    inv_tab = 1.0 / np.asarray(flow_lpm_table, dtype=np.float64)[::-1]
    r_tab = np.asarray(r_table_k_per_w, dtype=np.float64)[::-1]
    inv_q = 1.0 / np.maximum(q, 1e-6)
    r = np.interp(inv_q, inv_tab, r_tab)
    # extrapolate for flows below the table (1/q above the largest 1/flow)
    if inv_tab.size >= 2:
        slope = (r_tab[-1] - r_tab[-2]) / (inv_tab[-1] - inv_tab[-2])
        r = np.where(inv_q > inv_tab[-1], r_tab[-1] + slope * (inv_q - inv_tab[-1]), r)
    return np.asarray(r, dtype=np.float64)


@dataclass
class ThermalParams:
    """Per-card thermal parameters (arrays of shape (n_cards,))."""

    r_die_case_k_per_w: FloatArray
    r_case_coolant_k_per_w: FloatArray
    c_die_j_per_k: FloatArray
    c_plate_j_per_k: FloatArray

    @classmethod
    def from_site(cls, site: SiteSpec, flow_per_card_lpm: FloatArray | float | None = None) -> ThermalParams:
        n = site.n_cards
        q = site.loop.flow_per_card_lpm if flow_per_card_lpm is None else flow_per_card_lpm
        r_pc = plate_resistance_k_per_w(
            site.cold_plate.flow_lpm, site.cold_plate.r_case_to_coolant_k_per_w, np.broadcast_to(q, (n,))
        )
        return cls(
            r_die_case_k_per_w=np.full(n, site.card.r_die_to_case_k_per_w),
            r_case_coolant_k_per_w=np.array(r_pc, dtype=np.float64),
            c_die_j_per_k=np.full(n, site.card.die_heat_capacity_j_per_k),
            c_plate_j_per_k=np.full(n, site.cold_plate.heat_capacity_j_per_k),
        )

    @property
    def r_total_k_per_w(self) -> FloatArray:
        return self.r_die_case_k_per_w + self.r_case_coolant_k_per_w


class ThermalNetwork:
    """The RC network of all cards. Parameters may change (faults, calibration): call
    :meth:`set_params`; the step propagator is cached per ``dt`` until then."""

    def __init__(self, params: ThermalParams) -> None:
        self._params = params
        self._cache: dict[float, tuple[FloatArray, FloatArray, FloatArray, FloatArray]] = {}

    @property
    def params(self) -> ThermalParams:
        return self._params

    def set_params(self, params: ThermalParams) -> None:
        self._params = params
        self._cache.clear()

    def steady_state(self, power_w: FloatArray, inlet_c: FloatArray | float) -> tuple[FloatArray, FloatArray]:
        """Steady (die, plate) temperatures for constant power and inlet temperature."""
        p = self._params
        plate = inlet_c + power_w * p.r_case_coolant_k_per_w
        die = plate + power_w * p.r_die_case_k_per_w
        return np.asarray(die, dtype=np.float64), np.asarray(plate, dtype=np.float64)

    def heat_to_coolant_w(self, plate_c: FloatArray, inlet_c: FloatArray | float) -> FloatArray:
        return np.asarray((plate_c - inlet_c) / self._params.r_case_coolant_k_per_w, dtype=np.float64)

    def _propagator(self, dt_s: float) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """exp(A dt) as four arrays (a11, a12, a21, a22), closed form for 2x2 (distinct real
        eigenvalues: an RC ladder's are always real, negative and distinct)."""
        hit = self._cache.get(dt_s)
        if hit is not None:
            return hit
        p = self._params
        g_dc = 1.0 / p.r_die_case_k_per_w
        g_pc = 1.0 / p.r_case_coolant_k_per_w
        m11 = -g_dc / p.c_die_j_per_k
        m12 = g_dc / p.c_die_j_per_k
        m21 = g_dc / p.c_plate_j_per_k
        m22 = -(g_dc + g_pc) / p.c_plate_j_per_k
        tr = m11 + m22
        det = m11 * m22 - m12 * m21
        disc = np.sqrt(np.maximum(tr * tr / 4.0 - det, 0.0))
        l1 = tr / 2.0 + disc
        l2 = tr / 2.0 - disc
        e1 = np.exp(l1 * dt_s)
        e2 = np.exp(l2 * dt_s)
        # e^{A t} = (l1 e2 - l2 e1)/(l1 - l2) I + (e1 - e2)/(l1 - l2) A
        diff = l1 - l2
        c0 = (l1 * e2 - l2 * e1) / diff
        c1 = (e1 - e2) / diff
        prop = (c0 + c1 * m11, c1 * m12, c1 * m21, c0 + c1 * m22)
        if len(self._cache) > 16:
            self._cache.clear()
        self._cache[dt_s] = prop
        return prop

    def step(
        self,
        die_c: FloatArray,
        plate_c: FloatArray,
        power_w: FloatArray,
        inlet_c: FloatArray | float,
        dt_s: float,
    ) -> tuple[FloatArray, FloatArray]:
        """Advance all cards by ``dt_s`` with power and inlet held constant over the step."""
        if dt_s <= 0.0:
            raise ValueError(f"dt_s must be positive, got {dt_s}")
        a11, a12, a21, a22 = self._propagator(float(dt_s))
        die_ss, plate_ss = self.steady_state(power_w, inlet_c)
        d0 = die_c - die_ss
        p0 = plate_c - plate_ss
        return die_ss + a11 * d0 + a12 * p0, plate_ss + a21 * d0 + a22 * p0

    def time_constants_s(self) -> tuple[FloatArray, FloatArray]:
        """The two time constants (fast, slow) of every card, -1/eigenvalue."""
        p = self._params
        g_dc = 1.0 / p.r_die_case_k_per_w
        g_pc = 1.0 / p.r_case_coolant_k_per_w
        m11 = -g_dc / p.c_die_j_per_k
        m22 = -(g_dc + g_pc) / p.c_plate_j_per_k
        m12m21 = (g_dc / p.c_die_j_per_k) * (g_dc / p.c_plate_j_per_k)
        tr = m11 + m22
        det = m11 * m22 - m12m21
        disc = np.sqrt(np.maximum(tr * tr / 4.0 - det, 0.0))
        return -1.0 / (tr / 2.0 - disc), -1.0 / (tr / 2.0 + disc)


# --------------------------------------------------------------------------------------------
# Fitting a card's effective thermal resistance and time constant from a time series
# --------------------------------------------------------------------------------------------


class ThermalFitError(ValueError):
    """The time series cannot support a thermal fit."""


@dataclass(frozen=True)
class ThermalFit:
    r_th_k_per_w: float
    tau_s: float
    rmse_k: float
    n_samples: int
    #: True when the best ``tau_s`` is the lower end of the search (a twentieth of the shortest
    #: sample interval, at least 1 ms): the die follows the power within one sample, so the time
    #: constant is not identified; ``r_th_k_per_w`` (the steady-state gain) still is.
    tau_at_lower_bound: bool = False


def first_order_scan(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """All states of ``x[k+1] = a[k] x[k] + b[k]`` as ``x[k+1] = gain[k] x[0] + offset[k]``.

    A parallel prefix scan over the affine maps (Hillis-Steele: log2(n) vectorized passes instead
    of a Python loop over n samples): composing ``(a1, b1)`` after ``(a2, b2)`` gives
    ``(a1 a2, a1 b2 + b1)``. ``b`` may have extra trailing axes (several drives sharing ``a``).
    With ``0 <= a <= 1`` every product only shrinks (an underflow to 0 is the exact limit of a
    forgotten past) and every offset stays a weighted sum of the drives, so nothing overflows.
    """
    gain = np.array(a, dtype=np.float64)
    offset = np.array(b, dtype=np.float64)
    extra = (slice(None),) + (None,) * (offset.ndim - 1)
    step = 1
    while step < gain.size:
        offset[step:] = gain[step:][extra] * offset[:-step] + offset[step:]
        gain[step:] = gain[step:] * gain[:-step]
        step *= 2
    return gain, offset


def fit_thermal(t_s: FloatArray, power_w: FloatArray, inlet_c: FloatArray, die_c: FloatArray) -> ThermalFit:
    """Fit ``tau dT/dt = T_in + R P - T`` (output error, zero-order hold between samples).

    For a given ``tau`` the simulated response is linear in ``R``, so ``R`` is solved exactly and
    ``tau`` by a 1-D search on a log grid refined by golden section. ``rmse_k`` is the error of
    the free-running simulation against the measured die temperature.

    ``tau`` is searched from a twentieth of the shortest sample interval (at least 1 ms) to 5 times
    the series' span (at least 1 s). A best fit at the upper end means the die temperature does not
    settle within the series: only ``R / tau`` shows, ``R`` is as arbitrary as ``tau``, and
    :class:`ThermalFitError` is raised. One at the lower end is returned with ``tau_at_lower_bound``.
    """
    t = np.asarray(t_s, dtype=np.float64)
    p = np.asarray(power_w, dtype=np.float64)
    tin = np.asarray(inlet_c, dtype=np.float64)
    y = np.asarray(die_c, dtype=np.float64)
    n = t.size
    for name, arr in (("power_w", p), ("inlet_temp_c", tin), ("die_temp_c", y)):
        if arr.shape != t.shape:
            raise ThermalFitError(f"column {name} has {arr.size} values, t_s has {n}")
    for name, arr in (("t_s", t), ("power_w", p), ("inlet_temp_c", tin), ("die_temp_c", y)):
        if not np.all(np.isfinite(arr)):
            raise ThermalFitError(f"column {name} has non-finite values (NaN or infinity)")
    if n < 10:
        raise ThermalFitError(f"need at least 10 samples, got {n}")
    if np.any(np.diff(t) <= 0):
        raise ThermalFitError("t_s must be strictly increasing")
    if float(np.ptp(p)) < 1.0:
        raise ThermalFitError(
            "power_w hardly varies (< 1 W): the resistance is not identifiable from a step-free series"
        )
    dts = np.diff(t)

    def responses(tau: float) -> tuple[FloatArray, FloatArray]:
        """Free response x (inlet + initial state) and unit-R response z to power."""
        a = np.exp(-dts / tau)
        drive = np.stack(((1.0 - a) * tin[:-1], (1.0 - a) * p[:-1]), axis=1)
        gain, offset = first_order_scan(a, drive)
        x = np.concatenate(([y[0]], gain * y[0] + offset[:, 0]))
        z = np.concatenate(([0.0], offset[:, 1]))
        return x, z

    def err(log_tau: float) -> tuple[float, float]:
        x, z = responses(float(np.exp(log_tau)))
        denom = float(z @ z)
        r = float(z @ (y - x)) / denom if denom > 0 else 0.0
        resid = y - x - r * z
        return float(resid @ resid), r

    span = float(t[-1] - t[0])
    lo, hi = np.log(max(float(dts.min()) / 20, 1e-3)), np.log(max(span * 5, 1.0))
    grid = np.linspace(lo, hi, 80)
    errs = [err(g)[0] for g in grid]
    i = int(np.argmin(errs))
    a_, b_ = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    phi = (np.sqrt(5.0) - 1.0) / 2.0
    for _ in range(50):
        m1, m2 = b_ - phi * (b_ - a_), a_ + phi * (b_ - a_)
        if err(m1)[0] < err(m2)[0]:
            b_ = m2
        else:
            a_ = m1
    log_tau = 0.5 * (a_ + b_)
    sse, r = err(log_tau)
    if r <= 0:
        raise ThermalFitError("the die temperature does not rise with power: check the columns")
    at_bound = 0.01 * float(grid[1] - grid[0])  # the golden section ends within 1e-10 steps of a bound
    if log_tau > hi - at_bound:
        why = f"5 times the series' span of {span:g} s" if span * 5 >= 1.0 else f"1 s; the series spans {span:g} s"
        raise ThermalFitError(
            f"the time constant is not identified: the best fit is the upper end of the search, tau {np.exp(hi):g} s "
            f"({why}): the die temperature does not settle within the series, so r_th is not identified either "
            "(record several time constants after a power step; check that die_temp_c and inlet_temp_c are in deg C)"
        )
    return ThermalFit(
        r_th_k_per_w=r,
        tau_s=float(np.exp(log_tau)),
        rmse_k=float(np.sqrt(sse / n)),
        n_samples=n,
        tau_at_lower_bound=bool(log_tau < lo + at_bound),
    )
