"""The joint set-point MILP (``models.cooling``) on small cases whose optimum is found by brute force.

The brute force tries every set-point and every level of the one free job, judges each plan with the
twin (``models.plans.assess_dvfs``: card and rack power, facility power of ``twin.cooling``) and
keeps the best one that meets the rack caps and the die limit. The MILP sees the same physics only
through the per-set-point tables and the affine facility lines, so agreeing with the brute force is
a check of how it combines them: one set-point, each job one level there, the caps and the die
limits of *that* set-point, the facility's fixed and IT-proportional power, the read-back.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pyomo.environ as pyo
import pytest
from models_helpers import job, problem, rack_cards
from pyomo.contrib.solver.solvers.highs import Highs

from models.cooling import build_joint_setpoint_model, solve_joint_setpoint
from models.dvfs import level_upper_bounds
from models.dvfs_solver import highs_solve
from models.heuristic import greedy_dvfs
from models.plans import DvfsPlan, SetpointPlan, SolveStatus, assess_dvfs
from models.problem import CycleProblem, dvfs_tables, facility_line, it_power_range_w, make_problem
from models.synthetic import synthetic_workload
from twin.cooling import facility_cooling
from twin.spec import SiteSpec
from twin.workload import Phase

pytestmark = pytest.mark.models


def _brute_force(p: CycleProblem, awake: Sequence[int]) -> tuple[float, tuple[int, ...], DvfsPlan]:
    """Best (supply, job levels, plan) over every set-point and every allowed level combination, with
    ``awake`` idle cards per rack kept awake; caps checked on the twin's rack power."""
    best: tuple[float, tuple[int, ...], DvfsPlan] | None = None
    for s in p.supply_options_c:
        t = dvfs_tables(p, s)
        ub = level_upper_bounds(t)
        for levels in itertools.product(*[np.flatnonzero(ub[j] > 0).tolist() for j in range(t.n_jobs)]):
            plan = assess_dvfs(p, np.asarray(levels, dtype=np.int64), np.asarray(awake, dtype=np.int64), s, t)
            if np.any(plan.rack_power_w > t.rack_cap_w + 1e-6):
                continue
            if best is None or plan.objective_per_h > best[2].objective_per_h:
                best = (s, tuple(levels), plan)
    assert best is not None
    return best


def test_joint_milp_picks_the_set_point_the_twin_prices_best(site: SiteSpec) -> None:
    # One 8-card job far below any cap. A warmer supply saves chiller power but adds leakage; the
    # brute force over 5 set-points x 8 levels finds 35 C at the top clock (the value of a level,
    # ~0.8/h, dwarfs any energy difference between levels). 55 C is listed first: the die limit
    # forbids levels 0 and 1 there (and only there), so a model reading another set-point's
    # die limits would not run the job at the top clock at 35 C.
    opts = [55.0, 25.0, 35.0, 30.0, 40.0]
    p = problem(site, [job("a", 8)], [rack_cards(0, 8)], options=opts)
    assert dvfs_tables(p, 55.0).allowed[0].tolist()[:3] == [False, False, True]
    assert dvfs_tables(p, 35.0).allowed[0].all()
    supply, levels, best = _brute_force(p, [0] * site.n_racks)
    assert (supply, levels) == (35.0, (0,))
    # the runner-up is not within noise of the best (the facility fit's few W of error are < 0.001/h)
    others = [
        _brute_force(problem(site, [job("a", 8)], [rack_cards(0, 8)], options=[s]), [0] * site.n_racks) for s in opts
    ]
    second = max(o[2].objective_per_h for o in others if o[0] != 35.0)
    assert best.objective_per_h - second > 0.05

    status, plan, sp, seconds = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert sp.supply_temp_c == 35.0 and plan.supply_temp_c == 35.0
    assert plan.job_level.tolist() == [0]
    assert plan.objective_per_h == pytest.approx(best.objective_per_h, rel=1e-9)
    assert plan.facility_power_w == pytest.approx(
        facility_cooling(site, plan.it_power_w, 35.0, p.ambient_c).facility_power_w, rel=1e-12
    )
    (rec,) = sp.options
    assert (rec.supply_temp_c, rec.status) == (35.0, SolveStatus.OPTIMAL)
    assert rec.objective_per_h == plan.objective_per_h
    assert (rec.facility_power_w, rec.it_power_w) == (plan.facility_power_w, plan.it_power_w)
    assert rec.solve_time_s == seconds > 0  # the record says how long the solve took, as plan_cycle's do


def test_joint_milp_keeps_the_caps_of_the_chosen_set_point_and_drops_one_that_cannot_meet_them(
    site: SiteSpec,
) -> None:
    # A 64-card job fills rack r0; its cap (limit - 1 kW margin) is 130 W above the rack's power at
    # the slowest level at 30 C (host 8.8 kW + 64 cards: 28,696 W). At 40 C leakage adds ~4 W per
    # card: 28,958 W even at the slowest level, over the cap, so 40 C is infeasible and the plan is
    # 30 C at level 7, although 40 C would be the cheaper facility point.
    limits = np.full(site.n_racks, 50_000.0)
    limits[0] = 28_696.0 + 130.0 + 1000.0
    p = problem(site, [job("a", 64)], [rack_cards(0)], limit_w=limits, options=[40.0, 30.0])
    t30, t40 = dvfs_tables(p, 30.0), dvfs_tables(p, 40.0)
    assert t30.rack_base_w[0] + t30.job_power_w[0, 7] == pytest.approx(28_696.0, abs=1.0)
    assert t30.rack_base_w[0] + t30.job_power_w[0, 6] > t30.rack_cap_w[0]
    assert t40.rack_base_w[0] + t40.job_power_w[0].min() > t40.rack_cap_w[0]
    assert not greedy_dvfs(p, t40, facility_line(site, 40.0, 25.0, *it_power_range_w(p, t40))).feasible

    status, plan, sp, _dt = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert sp.supply_temp_c == 30.0
    assert plan.job_level.tolist() == [7]
    assert plan.rack_power_w[0] <= limits[0] - 1000.0


def test_joint_milp_wakes_the_reserve_within_the_cap_and_pins_a_job_without_clock_work(site: SiteSpec) -> None:
    # Rack r0: a 56-card COMPUTE job and 8 idle cards; rack r1: an 8-card job in CHECKPOINT (no
    # clock-sensitive work: pinned at its cheapest level, 5) and 56 idle cards. Every other rack's
    # limit leaves 5 W above its base power, less than one card's wake power (8.6 W), and r1's limit
    # is its base with the checkpoint job, so the reserve of 4 awake cards must come from r0. r0's
    # cap is 17 W above the power of the job at level 1 at 30 C: level 1 fits on its own but not
    # with 4 cards awake (34 W), so the plan runs the job at level 2 and wakes 4 cards of r0.
    opts = [30.0, 40.0]
    phases = [Phase.COMPUTE, Phase.CHECKPOINT]
    jobs = [job("a", 56), job("c", 8)]
    cards = [rack_cards(0, 56), rack_cards(1, 8)]
    probe = problem(site, jobs, cards, phases, options=opts, reserve=4)
    t = dvfs_tables(probe, 30.0)
    assert t.fixed.tolist() == [False, True] and int(t.cheapest_level[1]) == 5
    assert float(t.job_value[1].max()) == 0.0  # the pinned job earns nothing at any level
    limits = t.rack_base_w + 5.0 + 1000.0
    limits[1] += float(t.job_power_w[1, 5])
    limits[0] = float(t.rack_base_w[0] + t.job_power_w[0, 1]) + 17.0 + 1000.0
    p = problem(site, jobs, cards, phases, options=opts, reserve=4, limit_w=limits)
    t = dvfs_tables(p, 30.0)
    assert 4 * float(t.rack_wake_w[0]) > 17.0 > 0.0
    awake = np.zeros(site.n_racks, dtype=np.int64)
    awake[0] = 4
    supply, levels, best = _brute_force(p, awake.tolist())
    assert (supply, levels) == (30.0, (2, 5))

    status, plan, sp, _dt = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert sp.supply_temp_c == 30.0
    assert plan.job_level.tolist() == [2, 5]
    assert plan.rack_awake.tolist() == awake.tolist()
    assert np.all(plan.rack_power_w <= limits - 1000.0 + 1e-6)
    assert plan.objective_per_h == pytest.approx(best.objective_per_h, rel=1e-9)


def test_no_set_point_meets_the_caps(site: SiteSpec) -> None:
    # r0's limit is below its host power alone: no set-point and no level can meet it.
    limits = np.full(site.n_racks, 50_000.0)
    limits[0] = 8000.0
    p = problem(site, [job("a", 8)], [rack_cards(0, 8)], limit_w=limits, options=[30.0, 40.0], supply_c=35.0)
    status, plan, sp, _dt = solve_joint_setpoint(p, time_limit_s=5.0)
    assert status == SolveStatus.INFEASIBLE
    assert plan is None
    assert sp == SetpointPlan(35.0, ())


def test_joint_objective_prices_fixed_and_proportional_facility_power_and_the_pue_excess(site: SiteSpec) -> None:
    # At the optimum the MILP's objective must be, by hand from the chosen set-point's table and
    # facility line F = a + b IT:  value - vmax - price F - penalty max(0, a + (b - pue) IT).
    # With one 8-card job the facility overhead is ~10% of IT, above the 1.08 target, so the PUE
    # excess is positive and its fixed part a matters.
    opts = [30.0, 35.0, 40.0]
    p = problem(site, [job("a", 8)], [rack_cards(0, 8)], options=opts)
    tabs = [dvfs_tables(p, s) for s in opts]
    lines = [facility_line(site, s, p.ambient_c, *it_power_range_w(p, t)) for s, t in zip(opts, tabs, strict=True)]
    m = build_joint_setpoint_model(p, tabs, lines, [True] * len(opts))
    info = highs_solve(Highs(), m, 10.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and info.objective is not None
    y = [round(pyo.value(m.y[s])) for s in m.S]
    assert y == [0, 1, 0]  # 35 C, as the brute force of the first test finds
    t, line = tabs[1], lines[1]
    it = float(t.rack_base_w.sum() + t.job_power_w[0, 0])
    fac = line.a_w + line.b * it
    excess = fac - site.pue_target * it
    assert excess > 0.1 * line.a_w
    expected = (
        float(t.job_value[0, 0])
        - float(t.job_value.max(axis=1).sum())
        - p.prices.energy_price_per_kwh / 1000.0 * fac
        - p.prices.pue_penalty_per_kwh / 1000.0 * excess
    )
    assert float(pyo.value(m.obj)) == pytest.approx(expected, rel=1e-7, abs=1e-6)
    assert info.objective == pytest.approx(expected, rel=1e-7, abs=1e-6)


def test_with_nothing_worth_running_the_plan_still_has_a_set_point(site: SiteSpec) -> None:
    # Only an 8-card job in CHECKPOINT: no level earns anything, every set-point costs facility
    # power. The plan must still pick exactly one set-point (the cheapest, by the brute force) and
    # pin the job at its cheapest level, not drop every set-point and report the first option with
    # level 0.
    opts = [25.0, 30.0, 35.0, 40.0]
    p = problem(site, [job("c", 8)], [rack_cards(1, 8)], [Phase.CHECKPOINT], options=opts)
    t = dvfs_tables(p, 35.0)
    assert bool(t.fixed[0]) and int(t.cheapest_level[0]) == 5
    supply, levels, best = _brute_force(p, [0] * site.n_racks)
    assert (supply, levels) == (35.0, (5,))
    status, plan, sp, _dt = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert sp.supply_temp_c == 35.0
    assert plan.job_level.tolist() == [5]
    assert plan.objective_per_h == pytest.approx(best.objective_per_h, rel=1e-9)


def test_a_solve_stopped_before_any_plan_reports_the_timeout_without_a_plan(site: SiteSpec) -> None:
    # 8 jobs over the site, 3 set-points: feasible (the greedy plan meets the caps at each), but a
    # 1 us limit stops the real HiGHS before it has an incumbent. The answer is the status with no
    # plan and no set-point record, the problem's current supply kept.
    wl = synthetic_workload(site, seed=3, allocation=0.9, compute_share=(0.9, 0.99))
    p = make_problem(
        site,
        jobs=wl.jobs,
        job_cards=wl.job_cards,
        job_phase=wl.job_phase,
        rack_limit_w=47_000.0,
        ready_reserve_cards=8,
        supply_temp_c=32.0,
        supply_options_c=[30.0, 35.0, 40.0],
    )
    status, plan, sp, _dt = solve_joint_setpoint(p, time_limit_s=1e-6)
    assert status == SolveStatus.TIMEOUT_NO_SOLUTION
    assert plan is None
    assert sp == SetpointPlan(32.0, ())
    # and with time, the same problem is solved (the timeout above is not infeasibility)
    status, plan, sp, _dt = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert sp.supply_temp_c in (30.0, 35.0, 40.0)
