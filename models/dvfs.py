"""DVFS + low-power idle for one control cycle (a MILP), in Pyomo and as a plain matrix for highspy.

Decisions, aggregated (DESIGN.md: one level per synchronous job, identical cards summed):

* ``x[j,k]`` in {0,1}: job ``j`` runs at level ``k`` (all its cards, in every rack it spans);
* ``a[r]`` integer in 0..idle_r: idle cards of rack ``r`` kept awake (the rest in low-power idle);
* ``s`` >= 0 W: facility power above the PUE target (soft constraint's slack);
* ``u[r]`` >= 0, only with a wake tie-break (``DvfsTables.wake_tie_w`` > 0): idle cards of rack ``r`` kept
  awake beyond those awake now (``a[r] - u[r] <= n[r]``, ``n[r]`` = ``DvfsTables.rack_awake_now``): the
  cards the plan wakes there.

Data (``models.problem.DvfsTables``, predicted by the twin at the supply set-point):
``P[j,r,k]`` the summed steady power of job ``j``'s cards in rack ``r`` at level ``k`` (with leakage
at the predicted die temperature), ``B[r]`` host + failed + idle-in-low-power power, ``w[r]`` the
extra power of one awake idle card, ``V[j,k]`` the value per hour of job ``j`` at level ``k``.

Levels a job may not use (its hottest card above the die limit, below its SLO, or any level but
its cheapest when its phase does no clock-sensitive work) get the upper bound 0 on ``x[j,k]``
instead of rows: a card's temperature depends only on its own job's level, so the exclusion is
exact and costs nothing; a bound that changes leaves the structure as it is (``set_dvfs_data``
sets the bounds and says which changed, for a persistent solver to take).

Objective (maximize, per hour): ``sum V[j,k] x[j,k] - Vmax - price (a + b IT) - penalty s [- price b e sum u]``
(``e`` = ``DvfsTables.wake_tie_w``, W per card woken, e.g. 1: a tie-break, so that the ready reserve stays
on the racks whose idle cards are awake now when racks with room tie, not a power the plan draws; at
``e`` = 0, the default, the model has no ``u`` columns, no rows for them and no term) where
``Vmax = sum_j max_k V[j,k]`` is a constant: the objective is minus the *loss* (throughput value
given up plus facility energy cost plus PUE penalty), so HiGHS's relative gap is measured against
that loss, not against the much larger total value (a 0.1% gap on the total would hide kilowatts).

All other numbers are mutable Pyomo parameters, so :class:`models.dvfs_solver.DvfsSolver` can keep one model
and one HiGHS instance across control cycles while the jobs' rack spans stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyomo.environ as pyo
from pyomo.core.base.param import ParamData

from models.problem import CycleProblem, DvfsTables, FacilityLine

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "DvfsMatrix",
    "build_dvfs_model",
    "dvfs_matrix",
    "dvfs_structure_key",
    "extract_dvfs",
    "level_upper_bounds",
    "reserve_supernodes",
    "set_dvfs_data",
]


def level_upper_bounds(t: DvfsTables) -> FloatArray:
    """1 where a job may run at a level, else 0 (fixed jobs: only their cheapest level)."""
    ub = t.allowed.astype(np.float64)
    for j in np.flatnonzero(t.fixed & (t.cheapest_level >= 0)):
        ub[j] = 0.0
        ub[j, t.cheapest_level[j]] = 1.0
    return ub


def dvfs_structure_key(t: DvfsTables) -> tuple[object, ...]:
    """Two tables with the same key fit the same model (only parameter values differ)."""
    return (
        t.n_jobs,
        t.n_levels,
        t.n_racks,
        t.pair_job.tobytes(),
        t.pair_rack.tobytes(),
        (t.rack_idle > 0).tobytes(),
        t.rack_supernode.tobytes(),  # one reserve row per supernode with idle cards
        t.wake_tie_w > 0.0,  # the wake tie-break's columns and rows (its weight is a parameter)
    )


def build_dvfs_model(p: CycleProblem, t: DvfsTables, line: FacilityLine) -> pyo.ConcreteModel:
    """The DVFS + idle MILP at one supply set-point (maths in the ``_add_*`` docstrings)."""
    m = pyo.ConcreteModel(name="dvfs")
    m.J = pyo.RangeSet(0, t.n_jobs - 1) if t.n_jobs else pyo.Set(initialize=[])
    m.K = pyo.RangeSet(0, t.n_levels - 1)
    m.PAIRS = pyo.Set(initialize=range(t.pair_job.size))
    racks_used = sorted(set(t.pair_rack.tolist()) | set(np.flatnonzero(t.rack_idle > 0).tolist()))
    m.R = pyo.Set(initialize=racks_used)
    m.RI = pyo.Set(initialize=np.flatnonzero(t.rack_idle > 0).tolist())
    m.SN = pyo.Set(initialize=reserve_supernodes(t).tolist())
    m._sn_racks = {int(s): [r for r in m.RI if int(t.rack_supernode[r]) == s] for s in m.SN}
    m._pair_job = t.pair_job.tolist()
    m._pair_rack = t.pair_rack.tolist()
    m._rack_pairs = {r: [] for r in racks_used}
    for q, r in enumerate(m._pair_rack):
        m._rack_pairs[r].append(q)

    # the (job or pair) x level params are filled by set_dvfs_data below, before any row reads them:
    # an initial 0.0 here would be validated entry by entry (a quarter of the build's time)
    m.pw = pyo.Param(m.PAIRS, m.K, mutable=True)
    m.x_gain = pyo.Param(m.J, m.K, mutable=True)
    m.rhs = pyo.Param(m.R, mutable=True, initialize=0.0)
    m.wake = pyo.Param(m.RI, mutable=True, initialize=0.0)
    m.idle = pyo.Param(m.RI, mutable=True, initialize=0.0)
    m.a_gain = pyo.Param(m.RI, mutable=True, initialize=0.0)
    m.pue_x = pyo.Param(m.J, m.K, mutable=True)
    m.pue_a = pyo.Param(m.RI, mutable=True, initialize=0.0)
    m.base_total = pyo.Param(mutable=True, initialize=0.0)
    m.reserve = pyo.Param(m.SN, mutable=True, initialize=0.0)
    m.fa = pyo.Param(mutable=True, initialize=0.0)
    m.fb = pyo.Param(mutable=True, initialize=1.0)
    m.pue = pyo.Param(mutable=True, initialize=p.site.pue_target)
    m.price_w = pyo.Param(mutable=True, initialize=0.0)
    m.penalty_w = pyo.Param(mutable=True, initialize=0.0)
    m.vmax = pyo.Param(mutable=True, initialize=0.0)
    m._wake_tie = t.wake_tie_w > 0.0  # fixed for the model's life (dvfs_structure_key)
    if m._wake_tie:
        m.awake_now = pyo.Param(m.RI, mutable=True, initialize=0.0)
        m.woken_gain = pyo.Param(mutable=True, initialize=0.0)

    # x's upper bounds are plain numbers that set_dvfs_data changes (see there), starting at 0
    m.x = pyo.Var(m.J, m.K, domain=pyo.Binary, bounds=(0, 0.0))
    m._x_ub = np.zeros((t.n_jobs, t.n_levels))
    m.a = pyo.Var(m.RI, domain=pyo.NonNegativeIntegers, bounds=lambda m, r: (0, m.idle[r]))
    if m._wake_tie:
        m.u = pyo.Var(m.RI, domain=pyo.NonNegativeReals)  # declared before s: the matrix's column order
    m.s = pyo.Var(domain=pyo.NonNegativeReals)
    set_dvfs_data(m, p, t, line)
    _add_level_choice_constraints(m, p)
    _add_rack_power_constraints(m, p)
    _add_reserve_constraints(m, p)
    _add_pue_constraints(m, p)
    if m._wake_tie:
        _add_wake_constraints(m, p)
    # The objective's coefficients are whole params (see set_dvfs_data): value - price fb P for
    # x[j,k], - price fb w for a[r], - price fb e for u[r]. Written as val x - price (fa + fb it_w), each
    # would be an expression that Pyomo re-evaluates at every persistent re-solve.
    gain = sum(m.x_gain[j, k] * m.x[j, k] for j in m.J for k in m.K) + sum(m.a_gain[r] * m.a[r] for r in m.RI)
    if m._wake_tie:
        gain = gain + sum(m.woken_gain * m.u[r] for r in m.RI)
    m.obj = pyo.Objective(
        expr=gain - m.vmax - m.price_w * (m.fa + m.fb * m.base_total) - m.penalty_w * m.s,
        sense=pyo.maximize,
    )
    return m


def set_dvfs_data(
    m: pyo.ConcreteModel,
    p: CycleProblem,
    t: DvfsTables,
    line: FacilityLine,
    it_price_per_wh: float | None = None,
) -> list[Any]:
    """Load a cycle's numbers into the model's mutable parameters (same structure key required).

    ``it_price_per_wh`` (a part of a decomposed problem): IT power is priced at this marginal
    rate (currency per W-hour) and the site-level PUE row is switched off (see ``models.decompose``).

    The upper bounds of ``x`` (:func:`level_upper_bounds`) are the variables' own bounds, plain
    numbers, not params: Pyomo's HiGHS interface re-evaluates a mutable bound as two expressions
    (``max(lb, 0)``, ``min(ub, 1)``) per column at every re-solve, which took a tenth of a DVFS
    re-solve's time. Returns the ``x`` variables whose bound changed, for a persistent solver that
    holds the model to take (``update_variables``); HiGHS gets the same bounds either way.
    """
    jk = [(j, k) for j in range(t.n_jobs) for k in range(t.n_levels)]
    ub = level_upper_bounds(t)
    changed: list[Any] = []
    for j, k in zip(*np.nonzero(ub != m._x_ub), strict=True):
        v = m.x[int(j), int(k)]
        v.setub(float(ub[j, k]))
        changed.append(v)
    m._x_ub = ub
    _store(m.pw, [(q, k) for q in range(t.pair_job.size) for k in range(t.n_levels)], t.pair_power_w)
    racks, idle_racks = list(m.R), list(m.RI)
    _store(m.rhs, racks, t.rack_cap_w[racks] - t.rack_base_w[racks])
    _store(m.wake, idle_racks, t.rack_wake_w[idle_racks])
    _store(m.idle, idle_racks, t.rack_idle[idle_racks].astype(np.float64))
    m.base_total = float(t.rack_base_w.sum())
    sns = list(m.SN)
    _store(m.reserve, sns, t.reserve[sns].astype(np.float64))
    m.vmax = float(t.job_value.max(axis=1, initial=0.0).sum())
    if it_price_per_wh is None:
        m.fa = line.a_w
        m.fb = line.b
        m.pue = p.site.pue_target
        m.price_w = p.prices.energy_price_per_kwh / 1000.0
        m.penalty_w = p.prices.pue_penalty_per_kwh / 1000.0
    else:  # the PUE row becomes -s <= 0; IT power costs it_price_per_wh
        m.fa = 0.0
        m.fb = 1.0
        m.pue = 1.0
        m.price_w = it_price_per_wh
        m.penalty_w = 0.0
    # the objective's coefficients, as Pyomo evaluated V - price_w fb P (the same floats)
    minus_price_fb = (-pyo.value(m.price_w)) * pyo.value(m.fb)
    _store(m.x_gain, jk, t.job_value + minus_price_fb * t.job_power_w)
    _store(m.a_gain, idle_racks, minus_price_fb * t.rack_wake_w[idle_racks])
    if m._wake_tie:
        _store(m.awake_now, idle_racks, t.rack_awake_now[idle_racks].astype(np.float64))
        m.woken_gain = minus_price_fb * t.wake_tie_w
    # the PUE row's coefficients, as Pyomo evaluated (fb - pue) P and (fb - pue) w (the same floats)
    fb_minus_pue = pyo.value(m.fb) - pyo.value(m.pue)
    _store(m.pue_x, jk, fb_minus_pue * t.job_power_w)
    _store(m.pue_a, idle_racks, fb_minus_pue * t.rack_wake_w[idle_racks])
    return changed


def _store(param: pyo.Param, keys: list[Any], values: npt.NDArray[Any]) -> None:
    """Set a mutable indexed param's values at ``keys`` (in order; ``values`` read row-major) in one call,
    unchecked: the keys are the param's own index set and the values plain floats, and Pyomo's
    per-item assignment, which validates each one, took about a tenth of a DVFS solve's time.

    A param built without values (``build_dvfs_model``'s job and pair tables) gets its entries here,
    in ``keys``' order (its index set's), each as Pyomo's own first assignment makes it (its index
    recorded), without that assignment's validation (a quarter of a build's time)."""
    vals = values.reshape(-1).tolist()
    data = param._data
    if data:
        param.store_values(dict(zip(keys, vals, strict=True)), check=False)
        return
    for key, v in zip(keys, vals, strict=True):
        entry = ParamData(param)
        entry._value = v
        entry._index = key
        data[key] = entry


def _add_level_choice_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """One level per job: ``sum_k x[j,k] = 1`` for every job ``j``."""
    m.one_level = pyo.Constraint(m.J, rule=lambda m, j: sum(m.x[j, k] for k in m.K) == 1)


def _add_rack_power_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Rack cap: ``B[r] + sum_{j in r} sum_k P[j,r,k] x[j,k] + w[r] a[r] <= limit[r] - margin``
    for every rack holding a job or an idle card (``rhs = limit - margin - B``)."""

    def rule(m: pyo.ConcreteModel, r: int) -> object:
        body = sum(m.pw[q, k] * m.x[m._pair_job[q], k] for q in m._rack_pairs[r] for k in m.K)
        if r in m.RI:
            body = body + m.wake[r] * m.a[r]
        return body <= m.rhs[r]

    m.rack_power = pyo.Constraint(m.R, rule=rule)


def _add_reserve_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Ready reserve: ``sum_{r in n} a[r] >= reserve[n]`` awake idle cards for queued work (wake latency)
    in every supernode ``n`` with idle cards (a job runs inside one supernode: a reserve in another does
    not spare it the wake)."""
    m.ready_reserve = pyo.Constraint(m.SN, rule=lambda m, n: sum(m.a[r] for r in m._sn_racks[n]) >= m.reserve[n])


def _add_pue_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Soft PUE target: facility power ``F = a + b IT`` (affine fit of the twin's facility model at
    this set-point) must stay within ``pue_target * IT``; the excess ``s`` is paid at the PUE
    penalty in the objective: ``(b - pue) IT - s <= -a`` with ``IT = B + sum P x + sum w a``.

    The coefficients of ``x`` and ``a`` are whole params (``pue_x``, ``pue_a``, set with the data):
    written as ``(fb - pue) * IT``, each would be an expression Pyomo re-evaluates at every
    persistent re-solve and when loading the model (HiGHS gets the same floats either way)."""
    m.pue_soft = pyo.Constraint(
        expr=(m.fb - m.pue) * m.base_total
        + sum(m.pue_x[j, k] * m.x[j, k] for j in m.J for k in m.K)
        + sum(m.pue_a[r] * m.a[r] for r in m.RI)
        - m.s
        <= -m.fa
    )


def _add_wake_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Cards woken: ``a[r] - u[r] <= n[r]`` for every rack with idle cards (``n[r]`` of them awake now),
    so that ``u[r]``, priced in the objective, is at least the cards kept awake beyond those awake now."""
    m.woken = pyo.Constraint(m.RI, rule=lambda m, r: m.a[r] - m.u[r] <= m.awake_now[r])


def reserve_supernodes(t: DvfsTables) -> IntArray:
    """The supernodes with idle cards, each one ready reserve row (in this order)."""
    return np.unique(t.rack_supernode[t.rack_idle > 0]).astype(np.int64)


def extract_dvfs(m: pyo.ConcreteModel, t: DvfsTables) -> tuple[IntArray, IntArray]:
    """Job levels and awake idle cards per rack from a solved model."""
    level = np.full(t.n_jobs, t.n_levels - 1, dtype=np.int64)
    for j in range(t.n_jobs):
        vals = [pyo.value(m.x[j, k], exception=False) or 0.0 for k in range(t.n_levels)]
        level[j] = int(np.argmax(vals))
    awake = np.zeros(t.n_racks, dtype=np.int64)
    for r in m.RI:
        awake[r] = round(pyo.value(m.a[r], exception=False) or 0.0)
    return level, awake


# --------------------------------------------------------------------------------------------
# The same model as a matrix (for highspy directly: the lower bound on modelling overhead)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DvfsMatrix:
    """Columns: x[j,k] (j-major), then a[r] for racks with idle cards, then (with a wake tie-break,
    ``DvfsTables.wake_tie_w`` > 0) u[r] for the same racks, then s. Rows as in the Pyomo model.
    Maximize ``c @ v + c0``. The matrix is in row-wise triplets."""

    c: FloatArray
    c0: float
    col_lo: FloatArray
    col_hi: FloatArray
    integer: npt.NDArray[np.bool_]
    row_lo: FloatArray
    row_hi: FloatArray
    rows: IntArray
    cols: IntArray
    vals: FloatArray
    n_x: int
    idle_racks: IntArray


def dvfs_matrix(p: CycleProblem, t: DvfsTables, line: FacilityLine) -> DvfsMatrix:
    n_j, n_lv = t.n_jobs, t.n_levels
    n_x = n_j * n_lv
    idle_racks = np.flatnonzero(t.rack_idle > 0).astype(np.int64)
    n_a = idle_racks.size
    n_u = n_a if t.wake_tie_w > 0.0 else 0  # the wake tie-break's columns (and rows)
    n_col = n_x + n_a + n_u + 1
    price_w = p.prices.energy_price_per_kwh / 1000.0
    pue = p.site.pue_target
    jpw = t.job_power_w.reshape(-1)
    wake = t.rack_wake_w[idle_racks]
    woken = np.full(n_u, -price_w * line.b * t.wake_tie_w)
    c = np.concatenate([t.job_value.reshape(-1) - price_w * line.b * jpw, -price_w * line.b * wake, woken, [0.0]])
    c[-1] = -p.prices.pue_penalty_per_kwh / 1000.0
    c0 = -price_w * (line.a_w + line.b * float(t.rack_base_w.sum())) - float(t.job_value.max(axis=1, initial=0.0).sum())
    col_lo = np.zeros(n_col)
    idle = t.rack_idle[idle_racks].astype(np.float64)
    col_hi = np.concatenate([level_upper_bounds(t).reshape(-1), idle, np.full(n_u, np.inf), [np.inf]])
    integer = np.ones(n_col, dtype=bool)
    integer[n_x + n_a :] = False
    rows: list[IntArray] = []
    cols: list[IntArray] = []
    vals: list[FloatArray] = []
    lo: list[float] = []
    hi: list[float] = []
    # one level per job
    rows.append(np.repeat(np.arange(n_j), n_lv))
    cols.append(np.arange(n_x))
    vals.append(np.ones(n_x))
    lo += [1.0] * n_j
    hi += [1.0] * n_j
    # rack power
    racks_used = np.union1d(np.unique(t.pair_rack), idle_racks)
    rack_row = {int(r): n_j + i for i, r in enumerate(racks_used)}
    rr = np.array([rack_row[int(r)] for r in t.pair_rack], dtype=np.int64)
    rows.append(np.repeat(rr, n_lv))
    cols.append((t.pair_job[:, None] * n_lv + np.arange(n_lv)[None, :]).reshape(-1))
    vals.append(t.pair_power_w.reshape(-1))
    rows.append(np.array([rack_row[int(r)] for r in idle_racks], dtype=np.int64))
    cols.append(n_x + np.arange(n_a))
    vals.append(wake)
    lo += [-np.inf] * racks_used.size
    hi += (t.rack_cap_w[racks_used] - t.rack_base_w[racks_used]).tolist()
    # reserve: one row per supernode with idle cards
    r_res = n_j + racks_used.size
    sns = reserve_supernodes(t)
    rows.append(r_res + np.searchsorted(sns, t.rack_supernode[idle_racks]))
    cols.append(n_x + np.arange(n_a))
    vals.append(np.ones(n_a))
    lo += t.reserve[sns].astype(np.float64).tolist()
    hi += [np.inf] * sns.size
    # PUE soft row: (b - pue) (base + jpw x + wake a) - s <= -a
    r_pue = r_res + sns.size
    coef = line.b - pue
    rows.append(np.full(n_x + n_a + 1, r_pue))
    cols.append(np.concatenate([np.arange(n_x + n_a), [n_col - 1]]))
    vals.append(np.concatenate([coef * jpw, coef * wake, [-1.0]]))
    lo.append(-np.inf)
    hi.append(-line.a_w - coef * float(t.rack_base_w.sum()))
    # cards woken (a wake tie-break only): a[r] - u[r] <= awake now
    if n_u:
        rows += [r_pue + 1 + np.arange(n_u)] * 2
        cols += [n_x + np.arange(n_u), n_x + n_a + np.arange(n_u)]
        vals += [np.ones(n_u), -np.ones(n_u)]
        lo += [-np.inf] * n_u
        hi += t.rack_awake_now[idle_racks].astype(np.float64).tolist()
    return DvfsMatrix(
        c=c,
        c0=c0,
        col_lo=col_lo,
        col_hi=col_hi,
        integer=integer,
        row_lo=np.asarray(lo, dtype=np.float64),
        row_hi=np.asarray(hi, dtype=np.float64),
        rows=np.concatenate(rows).astype(np.int64),
        cols=np.concatenate(cols).astype(np.int64),
        vals=np.concatenate(vals).astype(np.float64),
        n_x=n_x,
        idle_racks=idle_racks,
    )
