"""Coolant supply set-point: leakage and throttling vs chiller / dry cooler power.

A warmer supply saves chiller energy (and lets the dry cooler work alone for more of the year) but
raises every die temperature: leakage power grows with it and the die limit may forbid the top
levels. The twin prices both sides: ``models.problem.dvfs_tables`` predicts card power and die
temperature at the supply temperature, ``models.problem.facility_line`` the facility's power.

Two ways to choose, both over ``problem.supply_options_c``:

* **enumeration** (``models.solve.CyclePlanner.plan(choose_setpoint=True)``): one DVFS MILP per
  set-point, each plan judged by the twin, the best kept; ``refine_top=k`` solves the MILP only for
  the ``k`` set-points whose greedy plans score best (the rest keep their greedy plans);
* **one joint MILP** (:func:`build_joint_setpoint_model` here): a binary ``y[s]`` per set-point and
  a copy of the level variables per set-point, ``x[j,k,s] <= y[s]``.

benchmarks/results-models.md compares them; enumeration is the default (its parts are the small
per-set-point models a persistent solver keeps, and infeasible set-points drop out for free).
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt
import pyomo.environ as pyo
from pyomo.contrib.solver.solvers.highs import Highs

from models.dvfs import level_upper_bounds, reserve_supernodes
from models.heuristic import greedy_dvfs
from models.plans import DvfsPlan, SetpointOption, SetpointPlan, SolveStatus, assess_dvfs
from models.problem import CycleProblem, DvfsTables, FacilityLine, dvfs_tables, facility_line, it_power_range_w

IntArray = npt.NDArray[np.int64]

__all__ = ["build_joint_setpoint_model", "solve_joint_setpoint"]


def build_joint_setpoint_model(
    p: CycleProblem, tabs: list[DvfsTables], lines: list[FacilityLine], feasible: list[bool]
) -> pyo.ConcreteModel:
    """One MILP choosing the set-point and the levels together (maths in the ``_add_*`` docstrings)."""
    m = pyo.ConcreteModel(name="joint_setpoint")
    t0 = tabs[0]
    m.S = pyo.RangeSet(0, len(tabs) - 1)
    m.J = pyo.RangeSet(0, t0.n_jobs - 1) if t0.n_jobs else pyo.Set(initialize=[])
    m.K = pyo.RangeSet(0, t0.n_levels - 1)
    idle_racks = np.flatnonzero(t0.rack_idle > 0).tolist()
    m.RI = pyo.Set(initialize=idle_racks)
    racks = sorted(set(t0.pair_rack.tolist()) | set(idle_racks))
    m.R = pyo.Set(initialize=racks)
    ubs = [level_upper_bounds(t) for t in tabs]
    m.y = pyo.Var(m.S, domain=pyo.Binary, bounds=lambda m, s: (0, 1 if feasible[s] else 0))
    m.x = pyo.Var(m.J, m.K, m.S, domain=pyo.Binary, bounds=lambda m, j, k, s: (0, ubs[s][j, k]))
    m.a = pyo.Var(m.RI, m.S, domain=pyo.NonNegativeIntegers, bounds=lambda m, r, s: (0, int(t0.rack_idle[r])))
    tie_w = t0.wake_tie_w  # the wake tie-break (0: off, no woken columns, rows or term)
    if tie_w > 0.0:
        m.woken = pyo.Var(m.RI, m.S, domain=pyo.NonNegativeReals)
    m.slack = pyo.Var(domain=pyo.NonNegativeReals)

    def it_w(s: int) -> object:
        t = tabs[s]
        return (
            float(t.rack_base_w.sum()) * m.y[s]
            + sum(float(t.job_power_w[j, k]) * m.x[j, k, s] for j in m.J for k in m.K if ubs[s][j, k] > 0)
            + sum(float(t.rack_wake_w[r]) * m.a[r, s] for r in m.RI)
        )

    m.it = pyo.Expression(m.S, rule=lambda m, s: it_w(s))
    m._tabs, m._lines, m._feasible, m._racks = tabs, lines, feasible, racks
    _add_setpoint_choice_constraints(m, p)
    _add_joint_rack_constraints(m, p)
    _add_joint_reserve_constraints(m, p)
    _add_joint_pue_constraints(m, p)
    if tie_w > 0.0:
        _add_joint_wake_constraints(m, p)
    price = p.prices.energy_price_per_kwh / 1000.0
    vmax = float(t0.job_value.max(axis=1, initial=0.0).sum())
    m.facility = pyo.Expression(expr=sum(lines[s].a_w * m.y[s] + lines[s].b * m.it[s] for s in m.S))
    loss = (
        sum(float(tabs[s].job_value[j, k]) * m.x[j, k, s] for j in m.J for k in m.K for s in m.S)
        - vmax
        - price * m.facility
        - p.prices.pue_penalty_per_kwh / 1000.0 * m.slack
    )
    if tie_w > 0.0:
        loss = loss - price * tie_w * sum(lines[s].b * m.woken[r, s] for r in m.RI for s in m.S)
    m.obj = pyo.Objective(expr=loss, sense=pyo.maximize)
    return m


def _add_setpoint_choice_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """One set-point: ``sum_s y[s] = 1``; each job one level at the chosen one:
    ``sum_k x[j,k,s] = y[s]`` for every job and set-point; idle cards awake only there: ``a[r,s] <= idle_r y[s]``."""
    m.one_setpoint = pyo.Constraint(expr=sum(m.y[s] for s in m.S) == 1)
    m.one_level = pyo.Constraint(m.J, m.S, rule=lambda m, j, s: sum(m.x[j, k, s] for k in m.K) == m.y[s])
    m.awake_at = pyo.Constraint(m.RI, m.S, rule=lambda m, r, s: m.a[r, s] <= int(m._tabs[0].rack_idle[r]) * m.y[s])


def _add_joint_rack_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Rack caps at every set-point: ``B_s[r] y[s] + sum P_s[j,r,k] x[j,k,s] + w_s[r] a[r,s] <= cap[r] y[s]``
    (only for set-points that are feasible at all, the others have ``y[s] = 0``)."""
    pairs_of: dict[int, list[int]] = {}
    t0 = m._tabs[0]
    for q, r in enumerate(t0.pair_rack.tolist()):
        pairs_of.setdefault(r, []).append(q)

    def rule(m: pyo.ConcreteModel, r: int, s: int) -> object:
        if not m._feasible[s]:
            return pyo.Constraint.Skip
        t = m._tabs[s]
        body = float(t.rack_base_w[r] - t.rack_cap_w[r]) * m.y[s] + sum(
            float(t.pair_power_w[q, k]) * m.x[int(t.pair_job[q]), k, s] for q in pairs_of.get(r, []) for k in m.K
        )
        if r in m.RI:
            body = body + float(t.rack_wake_w[r]) * m.a[r, s]
        return body <= 0

    m.rack_power = pyo.Constraint(m.R, m.S, rule=rule)


def _add_joint_reserve_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Ready reserve at the chosen set-point, in every supernode ``n`` with idle cards:
    ``sum_{r in n} a[r,s] >= reserve[n] y[s]`` (as ``models.dvfs``'s)."""
    t0 = m._tabs[0]
    res = t0.reserve
    racks = {int(n): [r for r in m.RI if int(t0.rack_supernode[r]) == n] for n in reserve_supernodes(t0)}
    m.SN = pyo.Set(initialize=list(racks))
    m.reserve = pyo.Constraint(m.SN, m.S, rule=lambda m, n, s: sum(m.a[r, s] for r in racks[n]) >= int(res[n]) * m.y[s])


def _add_joint_pue_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Soft PUE: ``sum_s (a_s y[s] + (b_s - pue) IT_s) <= slack``."""
    pue = p.site.pue_target
    m.pue_soft = pyo.Constraint(
        expr=sum(m._lines[s].a_w * m.y[s] + (m._lines[s].b - pue) * m.it[s] for s in m.S) <= m.slack
    )


def _add_joint_wake_constraints(m: pyo.ConcreteModel, p: CycleProblem) -> None:
    """Cards woken at each set-point: ``a[r,s] - u[r,s] <= n[r]`` (``n[r]`` idle cards of rack ``r`` awake
    now, ``u`` = ``m.woken``), ``u`` priced as ``DvfsTables.wake_tie_w`` watts of IT power each in the
    objective (the wake tie-break of ``models.dvfs``; only when that weight is above 0)."""
    now = m._tabs[0].rack_awake_now
    m.kept_awake = pyo.Constraint(m.RI, m.S, rule=lambda m, r, s: m.a[r, s] - m.woken[r, s] <= int(now[r]))


def solve_joint_setpoint(
    p: CycleProblem, time_limit_s: float = 10.0, mip_rel_gap: float = 1e-4
) -> tuple[SolveStatus, DvfsPlan | None, SetpointPlan, float]:
    """Build and solve the joint model; the plan is judged by the twin. Returns (status, plan,
    set-point record, seconds)."""
    from models.dvfs_solver import highs_solve

    t0 = time.perf_counter()
    tabs: list[DvfsTables] = []
    lines: list[FacilityLine] = []
    feasible: list[bool] = []
    for s in p.supply_options_c:
        t = dvfs_tables(p, s)
        lo, hi = it_power_range_w(p, t)
        line = facility_line(p.site, s, p.ambient_c, lo, hi)
        tabs.append(t)
        lines.append(line)
        feasible.append(greedy_dvfs(p, t, line).feasible)
    if not any(feasible):
        return SolveStatus.INFEASIBLE, None, SetpointPlan(p.supply_temp_c, ()), time.perf_counter() - t0
    m = build_joint_setpoint_model(p, tabs, lines, feasible)
    info = highs_solve(Highs(), m, time_limit_s, mip_rel_gap)
    if info.objective is None:
        return info.status, None, SetpointPlan(p.supply_temp_c, ()), time.perf_counter() - t0
    s_best = int(np.argmax([pyo.value(m.y[s]) or 0.0 for s in m.S]))
    t = tabs[s_best]
    level = np.array(
        [int(np.argmax([pyo.value(m.x[j, k, s_best]) or 0.0 for k in m.K])) for j in range(t.n_jobs)], dtype=np.int64
    )
    awake = np.zeros(t.n_racks, dtype=np.int64)
    for r in m.RI:
        awake[r] = round(pyo.value(m.a[r, s_best]) or 0.0)
    supply = p.supply_options_c[s_best]
    plan = assess_dvfs(p, level, awake, supply, t)
    seconds = time.perf_counter() - t0
    rec = SetpointOption(supply, info.status, plan.objective_per_h, plan.facility_power_w, plan.it_power_w, seconds)
    return info.status, plan, SetpointPlan(supply, (rec,)), seconds
