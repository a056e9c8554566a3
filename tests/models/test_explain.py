"""Infeasible problems are explained from the data: which constraint group, which rack or job, the numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from models_helpers import card_die_c, job, problem, rack_cards

from models.heuristic import greedy_dvfs
from models.plans import SolveStatus
from models.problem import dvfs_tables, facility_line, it_power_range_w
from models.solve import greedy_cycle, plan_cycle
from twin.spec import SiteSpec

# Time limit for solves whose plan a test asserts (the MILP's, not a fallback): these problems solve in
# milliseconds, but plan_cycle's default 1 s, shared among the set-points, fell back to the greedy plan
# once on a loaded 2-core machine (as on CI); a generous limit costs nothing when HiGHS finishes early.
_SOLVE_S = 30.0

pytestmark = pytest.mark.models


def test_rack_over_its_cap_at_the_lowest_level(site: SiteSpec) -> None:
    # 64 cards in r3 with a 25 kW limit: even at 1210 MHz they draw ~18 kW + 8.8 kW host > 24 kW.
    limits = np.full(8, 50_000.0)
    limits[3] = 25_000.0
    p = problem(site, [job("a", 64)], [rack_cards(3)], limit_w=limits, options=[30.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status == SolveStatus.INFEASIBLE
    assert plan.explanation.startswith("rack power: rack r3: 64 busy cards at their lowest allowed levels")
    # the limit the models got is below the site's 50 kW (as the agent's is, less the power the twin
    # does not explain): the site's limit stands beside it
    assert plan.explanation.endswith("> 24.0 kW (limit 25.0 kW - margin 1.0 kW; the site's limit is 50.0 kW)")
    assert plan.dvfs is not None  # the least-power plan is still returned for the caller's guard
    assert plan.source == "greedy"  # that plan is the greedy heuristic's (it was labelled "milp")
    assert greedy_cycle(p, choose_setpoint=False).status == SolveStatus.INFEASIBLE


def test_a_rack_over_its_cap_at_the_sites_own_limit_names_that_limit_alone(site: SiteSpec) -> None:
    """The site's 50 kW limit less a 35 kW margin leaves 15 kW, below what r3's 64 cards and host draw
    at their lowest level: the limit in the line is the site's, said once."""
    p = problem(site, [job("a", 64)], [rack_cards(3)], margin_w=35_000.0, options=[30.0])
    assert p.rack_limit_w[3] == site.rack_power_limits_w()[3] == 50_000.0
    explanation = greedy_cycle(p, choose_setpoint=False).explanation
    assert explanation.startswith("rack power: rack r3: 64 busy cards at their lowest allowed levels")
    assert explanation.endswith("> 15.0 kW (limit 50.0 kW - margin 35.0 kW)"), explanation


def test_die_limit_even_at_the_lowest_level(site: SiteSpec) -> None:
    p = problem(site, [job("hot", 8)], [rack_cards(0, 8)], die_margin_k=60.0, options=[30.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status == SolveStatus.INFEASIBLE
    assert "die limit: job hot: hottest card reaches" in plan.explanation
    assert "27.0 deg C limit (slowdown 87 - margin 60)" in plan.explanation


def test_slo_against_die_limit(site: SiteSpec) -> None:
    # At a 45 deg C supply, a die margin between the level-2 and level-1 temperatures forbids
    # levels 0 and 1; an SLO of 0.93 needs level <= 1 (tp(1) = 0.947, tp(2) = 0.894 at share 0.95).
    t1, t2 = (card_die_c(site, 0.95, 0.5, k, 45.0) for k in (1, 2))
    margin = 87.0 - (t1 + t2) / 2.0
    p = problem(site, [job("slo", 64, slo=0.93)], [rack_cards(0)], die_margin_k=margin, supply_c=45.0, options=[45.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status == SolveStatus.INFEASIBLE
    assert "SLO: job slo needs throughput >= 0.93 of top clock, i.e. level <= 1" in plan.explanation
    assert "die limit allows only level >= 2" in plan.explanation


def test_slo_against_rack_cap(site: SiteSpec) -> None:
    # Without the SLO the job could slow down enough to fit; the SLO floor keeps the rack over.
    p0 = problem(site, [job("a", 64, share=0.95, slo=0.93)], [rack_cards(4)], options=[30.0])
    t = dvfs_tables(p0)
    limits = np.full(8, 50_000.0)
    limits[4] = t.rack_base_w[4] + t.job_power_w[0, 3] + 1000.0  # room for level 3 only; SLO needs <= 1
    p = problem(site, [job("a", 64, share=0.95, slo=0.93)], [rack_cards(4)], limit_w=limits, options=[30.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status == SolveStatus.INFEASIBLE
    assert plan.explanation.startswith("SLO: rack r4: the SLOs of job(s) a keep it at")


def test_ready_reserve_that_cannot_wake(site: SiteSpec) -> None:
    p0 = problem(site, [job("a", 64)], [rack_cards(0)], reserve=20, options=[30.0])
    t = dvfs_tables(p0)
    limits = t.rack_base_w + 1000.0 + 3.5 * t.rack_wake_w  # every idle rack can wake 3 cards: 21 in r1..r7
    limits[0] = 50_000.0
    ok = problem(site, [job("a", 64)], [rack_cards(0)], reserve=21, limit_w=limits, options=[30.0])
    assert plan_cycle(ok, choose_setpoint=False, time_limit_s=_SOLVE_S).status == SolveStatus.OPTIMAL
    bad = problem(site, [job("a", 64)], [rack_cards(0)], reserve=22, limit_w=limits, options=[30.0])
    plan = plan_cycle(bad, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status == SolveStatus.INFEASIBLE
    assert "ready reserve: 22 awake idle cards are required but" in plan.explanation
    assert "room for only 21" in plan.explanation


def test_feasible_problem_has_no_explanation_and_greedy_agrees(site: SiteSpec) -> None:
    p = problem(site, [job("a", 64)], [rack_cards(0)], options=[30.0])
    t = dvfs_tables(p)
    lo, hi = it_power_range_w(p, t)
    g = greedy_dvfs(p, t, facility_line(site, 30.0, 25.0, lo, hi))
    assert g.feasible and g.explanation == ""
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=10.0)  # the MILP agrees: feasible, nothing to explain
    assert plan.status == SolveStatus.OPTIMAL and plan.explanation == ""


def test_a_problem_no_set_point_makes_feasible_keeps_the_set_point_in_force(site: SiteSpec) -> None:
    # r3 over its cap at any level and any set-point: no option is feasible, so cooling fixes nothing
    # and the least-power plan stays at the set-point in force (was: the coolest option, 5 K down
    # at every evaluation of an agent's set-point)
    limits = np.full(8, 50_000.0)
    limits[3] = 25_000.0
    p = problem(site, [job("a", 64)], [rack_cards(3)], limit_w=limits, supply_c=35.0, options=[30.0, 35.0, 40.0])
    for plan in (plan_cycle(p, choose_setpoint=True, time_limit_s=_SOLVE_S), greedy_cycle(p, choose_setpoint=True)):
        assert plan.status == SolveStatus.INFEASIBLE
        assert plan.supply_temp_c == 35.0
        assert plan.dvfs is not None and plan.dvfs.supply_temp_c == 35.0


def test_a_least_power_job_is_pinned_at_its_least_power_and_exempt_from_the_die_limit(site: SiteSpec) -> None:
    # job hot exceeds the die limit at every level; named a least-power job, the problem is feasible:
    # hot at its least-power level, the other job planned as usual (its top level)
    hot_die_c = card_die_c(site, 0.95, 0.5, 7, 30.0)
    p = problem(site, [job("hot", 8), job("b", 8)], [rack_cards(0, 8), rack_cards(1, 8)], options=[30.0])
    p = dataclasses.replace(p, die_offset_k=np.where(p.card_job == 0, 95.0 - hot_die_c, 0.0))
    assert plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S).status == SolveStatus.INFEASIBLE
    q = dataclasses.replace(p, least_power_jobs=np.array([True, False]))
    t = dvfs_tables(q)
    assert t.fixed[0] and t.cheapest_level[0] == int(np.argmin(t.job_power_w[0]))
    assert q.die_exempt_cards().tolist() == (p.card_job == 0).tolist()
    for plan in (plan_cycle(q, choose_setpoint=False, time_limit_s=_SOLVE_S), greedy_cycle(q, choose_setpoint=False)):
        assert plan.status.has_plan
        assert plan.dvfs is not None
        assert plan.dvfs.job_level.tolist() == [t.cheapest_level[0], 0]
    # the MILP's plan is kept (its hot card exempt)
    assert plan_cycle(q, choose_setpoint=False, time_limit_s=_SOLVE_S).source == "milp"


def test_a_rack_whose_limit_is_no_more_than_the_margin_is_explained_as_no_room(site: SiteSpec) -> None:
    """A rack's limit equal to the margin leaves a cap of 0 W: the line says there is no room, with
    the limit in watts beside the site's own (not "> 0.0 kW (limit 1.0 kW - margin 1.0 kW)"). A margin
    as large as the site's limit (the problem's limit is the site's) says the limit once."""
    limits = np.full(8, 50_000.0)
    limits[3] = 1000.0
    p = problem(site, [job("a", 64)], [rack_cards(3)], limit_w=limits, options=[30.0])
    line = greedy_cycle(p, choose_setpoint=False).explanation.splitlines()[0]
    assert line.startswith(
        "rack power: rack r3: no room: its limit in this problem is 1,000 W (the site's limit is 50.0 kW), not "
        "above the 1.0 kW margin; 64 busy cards at their lowest allowed levels"
    ), line
    p = problem(site, [job("a", 64)], [rack_cards(3)], margin_w=50_000.0, options=[30.0])
    lines = greedy_cycle(p, choose_setpoint=False).explanation.splitlines()
    r3 = next(n for n in lines if n.startswith("rack power: rack r3:"))
    assert r3.startswith(
        "rack power: rack r3: no room: its limit in this problem is 50,000 W, not above the 50.0 kW margin; 64 busy"
    ), r3
