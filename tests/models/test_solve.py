"""Solver handling: limits read back from HiGHS, statuses, persistence across cycles, the direct
highspy model, the deadline and the fallback."""

from __future__ import annotations

import numpy as np
import pytest
from models_helpers import job, judge, problem, rack_cards
from solver_testing import LatePlanner

from models.dvfs import dvfs_matrix
from models.plans import SolveStatus
from models.problem import dvfs_tables, facility_line, it_power_range_w, make_problem
from models.solve import CyclePlanner, DvfsSolver, greedy_cycle, plan_cycle, solve_matrix_highspy
from models.synthetic import synthetic_workload
from twin.spec import SiteSpec

pytestmark = pytest.mark.models


def _mixed(site: SiteSpec, seed: int = 3, allocation: float = 0.9, limit_w: float = 47_000.0):  # type: ignore[no-untyped-def]
    wl = synthetic_workload(site, seed=seed, allocation=allocation, compute_share=(0.9, 0.99))
    return make_problem(
        site, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, rack_limit_w=limit_w, ready_reserve_cards=8
    )


def test_time_limit_and_gap_are_what_highs_runs_with(site: SiteSpec) -> None:
    p = _mixed(site)
    t = dvfs_tables(p)
    lo, hi = it_power_range_w(p, t)
    line = facility_line(site, p.supply_temp_c, p.ambient_c, lo, hi)
    info, level, awake = DvfsSolver().solve(p, t, line, time_limit_s=7.25, mip_rel_gap=3e-4)
    assert info.time_limit_s == 7.25
    assert info.mip_rel_gap == 3e-4
    assert info.status == SolveStatus.OPTIMAL
    assert level is not None and awake is not None
    assert info.gap is not None and info.gap <= 3e-4


def test_persistent_model_is_reused_and_gives_the_fresh_optimum(site: SiteSpec) -> None:
    planner = CyclePlanner(persistent=True)
    for limit in (47_000.0, 45_500.0, 48_000.0):  # caps move between cycles as in a control loop
        p = _mixed(site, limit_w=limit)
        kept = planner.plan(p, choose_setpoint=False, time_limit_s=10.0)
        fresh = plan_cycle(p, choose_setpoint=False, time_limit_s=10.0, planner=CyclePlanner(persistent=False))
        assert kept.status == fresh.status == SolveStatus.OPTIMAL
        assert kept.objective_per_h == pytest.approx(fresh.objective_per_h, rel=1e-4)
    assert planner.solver_for(p.supply_temp_c, planner.chunking(dvfs_tables(p))).builds == 1


def test_direct_highspy_model_has_the_same_optimum(site: SiteSpec) -> None:
    p = _mixed(site)
    t = dvfs_tables(p)
    lo, hi = it_power_range_w(p, t)
    line = facility_line(site, p.supply_temp_c, p.ambient_c, lo, hi)
    info_pyomo, _, _ = DvfsSolver(persistent=False).solve(p, t, line, 10.0, 1e-6)
    info_direct, sol = solve_matrix_highspy(dvfs_matrix(p, t, line), 10.0, 1e-6)
    assert info_direct.status == SolveStatus.OPTIMAL and sol is not None
    assert info_pyomo.objective == pytest.approx(info_direct.objective, rel=1e-5)


def test_late_solve_falls_back_to_greedy_within_caps(site: SiteSpec) -> None:
    p = _mixed(site)
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=0.05, planner=LatePlanner())
    assert plan.status == SolveStatus.FALLBACK and plan.dvfs is not None
    greedy = greedy_cycle(p, choose_setpoint=False)
    assert greedy.dvfs is not None
    assert plan.dvfs.job_level.tolist() == greedy.dvfs.job_level.tolist()  # the greedy plan, as it is
    rack_w, die = judge(p, plan.dvfs, plan.supply_temp_c)
    assert np.all(rack_w <= p.rack_cap_w() + 1e-6)
    assert np.all(die <= p.die_limit_c + 1e-6)


def test_milp_is_at_least_as_good_as_greedy(site: SiteSpec) -> None:
    from models.solve import greedy_cycle

    p = _mixed(site, seed=11, limit_w=46_000.0)
    milp = plan_cycle(p, choose_setpoint=False, time_limit_s=10.0)
    greedy = greedy_cycle(p, choose_setpoint=False)
    assert milp.status == SolveStatus.OPTIMAL and milp.objective_per_h is not None
    assert greedy.objective_per_h is not None
    assert milp.objective_per_h >= greedy.objective_per_h - 1e-9


def test_bad_arguments(site: SiteSpec) -> None:
    p = problem(site, [job("a", 8)], [rack_cards(0, 8)])
    with pytest.raises(ValueError, match="time_limit_s"):
        plan_cycle(p, time_limit_s=0.0)
    with pytest.raises(ValueError, match="mip_rel_gap"):
        plan_cycle(p, mip_rel_gap=1.5)


def test_decomposed_solve_matches_the_monolithic_optimum_within_caps(site: SiteSpec) -> None:
    # Two supernodes of small jobs: chunks of 512 cards solve independently (the reserve split by
    # the greedy plan, the PUE penalty priced at the greedy plan's state); the result must stay
    # within every cap as the twin computes it and lose at most the gap against the monolithic MILP.
    big = site.with_supernodes(2)
    wl = synthetic_workload(big, seed=4, allocation=0.95, sizes=(8, 16), compute_share=(0.9, 0.99))
    p = make_problem(big, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, ready_reserve_cards=12)
    mono = plan_cycle(
        p, choose_setpoint=False, time_limit_s=20.0, mip_rel_gap=1e-4, planner=CyclePlanner(chunk_cards=None)
    )
    dec = plan_cycle(
        p, choose_setpoint=False, time_limit_s=20.0, mip_rel_gap=1e-4, planner=CyclePlanner(chunk_cards=512)
    )
    assert mono.status == dec.status == SolveStatus.OPTIMAL
    assert mono.dvfs is not None and dec.dvfs is not None
    rack_w, die = judge(p, dec.dvfs, dec.supply_temp_c)
    assert np.all(rack_w <= p.rack_cap_w() + 1e-6)
    assert np.all(die[p.card_job >= 0] <= p.die_limit_c + 1e-6)
    assert int((~dec.dvfs.card_low_power & p.idle_mask()).sum()) >= 12
    loss = float(dvfs_tables(p).job_value.max(axis=1).sum()) - mono.dvfs.objective_per_h
    assert dec.dvfs.objective_per_h >= mono.dvfs.objective_per_h - 2e-3 * loss
