"""Problems with hosts powered off (``CycleProblem.host_off``, as ``racktwin optimize`` plans): the
models count an off host and its cards as the twin does, and never wake a card of an off host."""

from __future__ import annotations

import numpy as np
import pytest
from models_helpers import job, problem, rack_cards

from models.plans import SolveStatus, assess_dvfs, awake_cards
from models.problem import CycleProblem, ProblemError, dvfs_tables, make_problem, phase_utilization
from models.solve import plan_cycle
from twin.spec import SiteSpec
from twin.steady import site_steady_state

# Time limit for solves whose plan a test asserts (the MILP's, not a fallback): these problems solve in
# milliseconds, but plan_cycle's default 1 s, shared among the set-points, fell back to the greedy plan
# once on a loaded 2-core machine (as on CI); a generous limit costs nothing when HiGHS finishes early.
_SOLVE_S = 30.0

pytestmark = pytest.mark.models


def _utilization(p: CycleProblem, level: np.ndarray) -> np.ndarray:
    u = np.zeros(p.n_cards)
    for j, jb in enumerate(p.jobs):
        cards = p.card_job == j
        u[cards] = phase_utilization(jb, p.job_phase[j], p.site, level[cards])
    return u


def test_off_hosts_cards_are_neither_idle_nor_counted_and_the_twin_agrees(site: SiteSpec) -> None:
    """r0: a 16-card job on hosts 0-1, hosts 2-7 off. The off hosts' cards are not idle (no reserve
    there), the rack's base power drops by what the twin says they and their hosts drew, and the
    model's assessment of a plan is the twin's steady state with those hosts off."""
    off = np.zeros(site.n_hosts, dtype=bool)
    off[2:8] = True
    base = problem(site, [job("a", 16)], [rack_cards(0, 16)], reserve=24, options=[30.0])
    p = make_problem(
        site,
        jobs=base.jobs,
        job_cards=[rack_cards(0, 16)],
        supply_temp_c=30.0,
        ambient_c=25.0,
        ready_reserve_cards=24,
        supply_options_c=[30.0],
        host_off=off,
    )
    assert p.idle_mask()[16:64].sum() == 0 and p.idle_mask()[64:].all()
    t_on, t_off = dvfs_tables(base), dvfs_tables(p)
    assert t_off.rack_idle[0] == 0 and t_on.rack_idle[0] == 48
    assert np.array_equal(t_off.rack_base_w[1:], t_on.rack_base_w[1:])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status.has_plan and plan.dvfs is not None
    dv = plan.dvfs
    assert not (awake_cards(p, dv.rack_awake) & p.unpowered()).any()
    ss = site_steady_state(
        site,
        level=dv.card_level,
        utilization=_utilization(p, dv.card_level),
        supply_temp_c=30.0,
        ambient_c=25.0,
        low_power=dv.card_low_power,
        host_off=off,
    )
    assert np.allclose(dv.rack_power_w, ss.rack_power_w, atol=1e-6)
    assert np.allclose(dv.card_power_w, ss.card_power_w, atol=1e-9)
    assert np.allclose(dv.card_die_temp_c, ss.die_temp_c, atol=1e-9)
    assert dv.it_power_w == pytest.approx(ss.it_power_w)
    # the tables' least-power rack 0 is that plan's rack 0 with its job at the slowest level
    slow = assess_dvfs(p, np.array([site.card.n_levels - 1]), np.zeros(8, dtype=np.int64), 30.0)
    lv = t_off.cheapest_level[0]
    assert t_off.rack_base_w[0] + t_off.pair_power_w[0, lv] == pytest.approx(float(slow.rack_power_w[0]))


def test_a_rack_that_fits_only_with_its_idle_hosts_off(site: SiteSpec) -> None:
    """An 11 kW limit: a rack with every host on draws ~12 kW with no job at all. With its idle hosts
    off, the problem is feasible, its job runs at the top clock and the explanation is empty."""
    limits = np.full(8, 11_000.0)
    on = problem(site, [job("a", 8)], [rack_cards(0, 8)], limit_w=limits, options=[30.0])
    assert plan_cycle(on, choose_setpoint=False, time_limit_s=_SOLVE_S).status == SolveStatus.INFEASIBLE
    off = np.ones(site.n_hosts, dtype=bool)
    off[0] = False  # the job's host
    p = make_problem(
        site,
        jobs=on.jobs,
        job_cards=[rack_cards(0, 8)],
        rack_limit_w=limits,
        supply_temp_c=30.0,
        ambient_c=25.0,
        ready_reserve_cards=0,
        supply_options_c=[30.0],
        host_off=off,
    )
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=_SOLVE_S)
    assert plan.status == SolveStatus.OPTIMAL and plan.source == "milp" and plan.explanation == ""
    assert plan.dvfs is not None and int(plan.dvfs.job_level[0]) == 0
    assert plan.dvfs.within_caps(p)
    # within_caps can say no: the same decisions with every host on put r0 over its 10 kW cap (8.8 kW
    # of hosts, 8 busy cards at ~600 W, 56 asleep at ~50 W: ~16.4 kW), so the check above means something
    same_hosts_on = assess_dvfs(on, plan.dvfs.job_level, plan.dvfs.rack_awake, 30.0)
    assert same_hosts_on.rack_power_w[0] > 16_000.0
    assert not same_hosts_on.within_caps(on)


def test_a_host_off_may_not_hold_a_busy_card(site: SiteSpec) -> None:
    off = np.zeros(site.n_hosts, dtype=bool)
    off[0] = True
    with pytest.raises(ProblemError, match="host 0 is off but its card 0 runs job a"):
        make_problem(site, jobs=[job("a", 8)], job_cards=[rack_cards(0, 8)], host_off=off)
    with pytest.raises(ProblemError, match="host_off: expected shape"):
        make_problem(site, jobs=[job("a", 8)], job_cards=[rack_cards(0, 8)], host_off=off[:3])
