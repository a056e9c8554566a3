"""Property: no plan, optimal or fallback, ever exceeds a rack limit (minus margin) or a die limit
as the twin computes them (``twin.steady.site_steady_state`` at the plan's levels and idle states).
When no plan is feasible, both the MILP and the greedy say so, with an explanation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models_helpers import EXAMPLES, judge

from models.plans import CyclePlan, SolveStatus
from models.problem import CycleProblem, Margins, make_problem
from models.solve import CyclePlanner, greedy_cycle
from twin.spec import load_site
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.models

SITE = load_site(EXAMPLES / "supernode-512.toml")
PLANNER = CyclePlanner()  # persistent solvers are rebuilt when the structure changes

job_st = st.tuples(
    st.sampled_from([8, 16, 32, 64, 128]),
    st.floats(0.3, 1.0),  # compute share
    st.sampled_from([1.0, 2.0, 5.0]),  # priority
    st.sampled_from([0.0, 0.0, 0.8, 0.93]),  # SLO
    st.sampled_from(list(Phase)),
)


@st.composite
def problems(draw: st.DrawFn) -> CycleProblem:
    specs = draw(st.lists(job_st, min_size=1, max_size=10))
    free = np.ones(SITE.n_cards, dtype=bool)
    jobs: list[JobSpec] = []
    cards: list[np.ndarray] = []
    phases: list[Phase] = []
    for i, (n, share, prio, slo, phase) in enumerate(specs):
        starts = [s for s in range(0, SITE.n_cards - n + 1, 8) if free[s : s + n].all()]
        if not starts:
            continue
        s = draw(st.sampled_from(starts))
        free[s : s + n] = False
        jobs.append(
            JobSpec(f"j{i}", n, 1e5, 1.0, share, priority=prio, min_throughput_frac=slo, noncompute_utilization=0.4)
        )
        cards.append(np.arange(s, s + n))
        phases.append(phase)
    limits = draw(st.lists(st.floats(20_000.0, 60_000.0), min_size=8, max_size=8))
    supply = draw(st.sampled_from(SITE.facility.supply_temp_options_c))
    failed = np.zeros(SITE.n_cards, dtype=bool)
    failed[np.flatnonzero(free)[: draw(st.integers(0, 3))]] = True
    return make_problem(
        SITE,
        jobs=jobs,
        job_cards=cards,
        job_phase=phases,
        failed=failed,
        rack_limit_w=limits,
        margins=Margins(draw(st.floats(0.0, 3000.0)), draw(st.floats(0.0, 20.0))),
        supply_temp_c=supply,
        ambient_c=draw(st.floats(-5.0, 40.0)),
        ready_reserve_cards=draw(st.integers(0, 64)),
    )


def _check(p: CycleProblem, plan: CyclePlan) -> None:
    if plan.status.has_plan:
        assert plan.dvfs is not None
        rack_w, die = judge(p, plan.dvfs, plan.supply_temp_c)
        assert np.all(rack_w <= p.rack_cap_w() + 1e-6), (rack_w - p.rack_cap_w()).max()
        busy = p.card_job >= 0
        assert np.all(die[busy] <= p.die_limit_c + 1e-6), die[busy].max()
        # each supernode keeps its reserve awake, or all its idle cards where it has fewer
        card_sn = p.site.rack_supernode()[p.site.card_rack()]
        n_sn = p.site.supernodes
        awake = np.bincount(card_sn, weights=~plan.dvfs.card_low_power & p.idle_mask(), minlength=n_sn)
        idle = np.bincount(card_sn, weights=p.idle_mask(), minlength=n_sn)
        assert np.all(awake >= np.minimum(p.ready_reserve_cards, idle)), (awake, p.ready_reserve_cards)
    else:
        assert plan.status == SolveStatus.INFEASIBLE
        assert plan.explanation


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.booleans())
def test_no_plan_exceeds_a_cap(p: CycleProblem, choose_setpoint: bool) -> None:
    milp = PLANNER.plan(p, choose_setpoint=choose_setpoint, time_limit_s=5.0)
    greedy = greedy_cycle(p, choose_setpoint=choose_setpoint)
    _check(p, milp)
    _check(p, greedy)
    # the greedy is feasible exactly when the problem is
    assert (milp.status == SolveStatus.INFEASIBLE) == (greedy.status == SolveStatus.INFEASIBLE)
    if milp.status.has_plan:
        assert milp.objective_per_h is not None and greedy.objective_per_h is not None
        assert milp.objective_per_h >= greedy.objective_per_h - 1e-6


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_fallback_under_a_tiny_time_limit_is_within_caps(p: CycleProblem) -> None:
    plan = CyclePlanner().plan(p, choose_setpoint=False, time_limit_s=0.002)
    _check(p, plan)
