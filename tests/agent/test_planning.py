"""The plan of one control step (``agent.planning``): the models' problem from what the agent sees
(jobs on blind racks and jobs out of compute pinned, cards it cannot use, set-point options within a
step, caps less the unexplained power, the ready reserve), the planner's plan with the real HiGHS
(the greedy one without the solver), and, where no plan meets every constraint, the plan of the
problem relaxed only as far as needed, flagged infeasible."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from guard_helpers import scene, step_context

from agent.config import ControlConfig
from agent.decision import StepContext
from agent.load import site_load, spec_r_total_k_per_w
from agent.planning import checkpoint_ends_soon, checkpoint_wake_s, cycle_problem, pinned_value_frac, plan_cycle, relax
from models.explain import min_rack_power_w
from models.plans import CyclePlan, SolveStatus
from models.problem import CycleProblem, Margins, Prices, dvfs_tables
from models.solve import CyclePlanner
from twin.state import JobInfo, StateSnapshot
from twin.workload import Phase

pytestmark = pytest.mark.agent

SITE, SNAP = scene()  # 2 racks of 16 cards: "a" on cards 0-7, "b" (priority 2) on 8-19, 20-31 idle, "q" queued
N = SITE.n_cards
NAMES = SITE.rack_names


def problem(
    cfg: ControlConfig | None = None, snap: StateSnapshot = SNAP, ctx: StepContext | None = None
) -> CycleProblem:
    ctx = ctx if ctx is not None else step_context(SITE)
    load = site_load(SITE, snap)
    return cycle_problem(SITE, cfg or ControlConfig(), load, snap, ctx, margins=Margins(), prices=Prices())


def with_job(snap: StateSnapshot, i: int, **changes: Any) -> StateSnapshot:
    """``snap`` with running job ``i``'s info changed (``spec`` changes go to its spec)."""
    info = snap.jobs[i]
    spec_changes = changes.pop("spec", {})
    if spec_changes:
        assert info.spec is not None
        changes["spec"] = dataclasses.replace(info.spec, **spec_changes)
    jobs = list(snap.jobs)
    jobs[i] = dataclasses.replace(info, **changes)
    return dataclasses.replace(snap, jobs=tuple(jobs))


# ---- pinned_value_frac --------------------------------------------------------------------------


def test_a_pinned_job_keeps_its_whole_value_for_a_resume_lag_then_lag_over_time_out_of_compute() -> None:
    assert pinned_value_frac(0.0, 100.0) == 0.0  # no lag: worth nothing from its first second
    assert pinned_value_frac(-5.0, 100.0) == 0.0
    assert pinned_value_frac(0.0, 0.0) == 0.0  # out of compute since this very step
    assert pinned_value_frac(60.0, 0.0) == 1.0
    assert pinned_value_frac(60.0, 60.0) == 1.0
    assert pinned_value_frac(60.0, 600.0) == pytest.approx(0.1)
    assert pinned_value_frac(60.0, 6000.0) == pytest.approx(0.01)


# ---- checkpoint_ends_soon -----------------------------------------------------------------------


def test_a_checkpoint_ends_soon_within_the_lead_of_its_declared_end_and_not_after_overrunning_it() -> None:
    spec = SNAP.jobs[0].spec
    assert spec is not None
    spec = dataclasses.replace(spec, checkpoint_duration_s=60.0)
    ckpt = Phase.CHECKPOINT
    # began at t = 0: expected to end at t = 60
    assert not checkpoint_ends_soon(ckpt, spec, 0.0, 43.9, 16.0)  # 16.1 s left
    assert checkpoint_ends_soon(ckpt, spec, 0.0, 44.0, 16.0)  # 16 s left
    assert checkpoint_ends_soon(ckpt, spec, 0.0, 60.0, 16.0)  # due now
    assert checkpoint_ends_soon(ckpt, spec, 0.0, 75.9, 16.0)  # 15.9 s late
    assert not checkpoint_ends_soon(ckpt, spec, 0.0, 76.0, 16.0)  # overran by the lead: slowed again
    assert not checkpoint_ends_soon(ckpt, spec, 0.0, 59.0, 0.0)  # off
    for phase in (Phase.COMPUTE, Phase.COMMUNICATION, Phase.WAITING):  # no declared end
        assert not checkpoint_ends_soon(phase, spec, 0.0, 59.0, 16.0)


def test_the_wake_for_a_checkpoints_end_is_the_earliest_end_less_the_lead_after_the_last_decision() -> None:
    a, b = SNAP.jobs[0], SNAP.jobs[1]
    assert a.spec is not None and b.spec is not None

    def in_checkpoint(info: JobInfo, since_s: float, duration_s: float) -> JobInfo:
        assert info.spec is not None
        spec = dataclasses.replace(info.spec, checkpoint_duration_s=duration_s)
        return dataclasses.replace(info, phase=Phase.CHECKPOINT, last_event_s=since_s, spec=spec)

    jobs = [in_checkpoint(a, 100.0, 60.0), in_checkpoint(b, 90.0, 100.0)]  # ends at 160 and 190
    assert checkpoint_wake_s(jobs, 100.0, 3.0) == 157.0
    assert checkpoint_wake_s(jobs, 157.0, 3.0) == 187.0  # (157: decided then, the job raised)
    assert checkpoint_wake_s(jobs, 187.0, 3.0) == math.inf
    assert checkpoint_wake_s(jobs, 100.0, 0.0) == math.inf  # off
    # a checkpoint shorter than the lead: due from its beginning
    assert checkpoint_wake_s([in_checkpoint(a, 100.0, 2.0)], 99.0, 3.0) == 100.0
    # computing or queued jobs have no checkpoint's end
    assert checkpoint_wake_s([a, dataclasses.replace(jobs[0], state="queued")], 0.0, 3.0) == math.inf


# ---- cycle_problem ------------------------------------------------------------------------------


def test_the_problem_of_a_seen_site_offers_setpoints_within_a_step_and_caps_less_the_unexplained_power() -> None:
    assert SITE.facility.supply_temp_options_c == (20.0, 25.0, 30.0, 35.0, 40.0, 45.0)
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 400.0]))
    p = problem(ControlConfig(max_setpoint_step_k=5.0, idle_reserve_cards=16), ctx=ctx)
    assert [(j.job_id, j.priority) for j in p.jobs] == [("a", 1.0), ("b", 2.0)]
    assert p.supply_temp_c == 30.0 and p.supply_options_c == (25.0, 30.0, 35.0)
    np.testing.assert_allclose(p.rack_limit_w, [12500.0, 12100.0])
    assert not p.failed.any()
    assert p.ready_reserve_cards == 12  # 16 per supernode, but only cards 20-31 are idle
    assert problem(ControlConfig(idle_reserve_cards=4)).ready_reserve_cards == 4
    # no step allowed, or a set-point that is no option: the set-point in force only
    assert problem(ControlConfig(max_setpoint_step_k=0.0)).supply_options_c == (30.0,)
    p = problem(ControlConfig(max_setpoint_step_k=1.0), ctx=step_context(SITE, setpoint_c=32.0))
    assert p.supply_options_c == (32.0,)


def test_jobs_touching_a_blind_rack_are_pinned_and_its_idle_cards_are_out_of_the_models_hands() -> None:
    snap = with_job(SNAP, 1, spec={"min_throughput_frac": 0.5})  # "b" on cards 8-19 touches rack 1
    ctx = step_context(SITE, blind_racks=(1,), failsafe_racks=(1,))
    p = problem(snap=snap, ctx=ctx)
    a, b = p.jobs
    assert (a.priority, b.priority) == (1.0, 1e-9)
    assert b.min_throughput_frac == 0.0  # the slowest level, SLO or not
    assert np.flatnonzero(p.failed).tolist() == list(range(20, 32))  # idle on rack 1; "b"'s cards are not
    assert p.ready_reserve_cards == 0


def test_a_stuck_idle_card_and_idle_cards_of_hosts_off_are_not_offered_a_busy_one_stays() -> None:
    off = np.zeros(N, dtype=bool)
    off[[0, 30, 31]] = True  # card 0 runs "a": its host reported off is no reason to drop it
    p = problem(snap=dataclasses.replace(SNAP, card_host_off=off), ctx=step_context(SITE, stuck_cards=(25,)))
    assert np.flatnonzero(p.failed).tolist() == [25, 30, 31]
    assert p.ready_reserve_cards == 9
    assert p.card_job[0] == 0


def test_dies_without_a_reading_are_at_their_inlet_and_the_calibrated_resistance_is_used() -> None:
    die = SNAP.card_die_temp_c.copy()
    die[[2, 22]] = np.nan
    r_spec = spec_r_total_k_per_w(SITE)
    r = r_spec.copy()
    r[3] *= 2.0
    r[4] = 0.0  # below the die-to-case part: the case-to-coolant part is kept positive
    inlet = np.full(N, 30.0)
    inlet[22] = 33.0
    ctx = step_context(SITE, r_total_k_per_w=r, card_inlet_c=inlet)
    p = problem(snap=dataclasses.replace(SNAP, card_die_temp_c=die), ctx=ctx)
    assert p.die_temp_c[2] == 30.0 and p.die_temp_c[22] == 33.0
    assert p.die_temp_c[5] == SNAP.card_die_temp_c[5]
    assert p.r_total_k_per_w[3] == pytest.approx(2.0 * r_spec[3])
    assert p.r_total_k_per_w[4] == pytest.approx(SITE.card.r_die_to_case_k_per_w + 1e-5)
    assert p.r_total_k_per_w[5] == pytest.approx(r_spec[5])


def test_a_job_out_of_compute_is_valued_for_its_resume_lag_over_the_time_it_has_been_out() -> None:
    # "a" (priority 1) has checkpointed for 600 s at t = 100 s
    snap = with_job(SNAP, 0, phase=Phase.CHECKPOINT, last_event_s=-500.0)
    assert problem(ControlConfig(resume_lag_s=60.0), snap=snap).jobs[0].priority == pytest.approx(0.1)
    assert problem(ControlConfig(resume_lag_s=0.0), snap=snap).jobs[0].priority == 1e-9
    assert problem(ControlConfig(resume_lag_s=60.0)).jobs[0].priority == 1.0  # computing: its whole value


def test_a_job_whose_checkpoint_ends_within_the_lead_is_planned_at_its_whole_value() -> None:
    # "a" (priority 1) began a 60 s checkpoint at t = 50: 10 s left at t = 100
    snap = with_job(SNAP, 0, phase=Phase.CHECKPOINT, last_event_s=50.0, spec={"checkpoint_duration_s": 60.0})
    assert problem(ControlConfig(checkpoint_end_lead_s=16.0), snap=snap).jobs[0].priority == 1.0
    assert problem(ControlConfig(checkpoint_end_lead_s=9.0), snap=snap).jobs[0].priority == 1e-9  # not yet
    assert problem(ControlConfig(), snap=snap).jobs[0].priority == 1e-9  # off by default
    stalled = with_job(SNAP, 0, phase=Phase.COMMUNICATION, last_event_s=50.0, spec={"checkpoint_duration_s": 60.0})
    assert problem(ControlConfig(checkpoint_end_lead_s=16.0), snap=stalled).jobs[0].priority == 1e-9


# ---- plan_cycle ---------------------------------------------------------------------------------


def plan(p: CycleProblem, notes: list[str], *, use_solver: bool = True, **ctx_changes: Any) -> CyclePlan:
    got, _planned = plan_cycle(
        p,
        step_context(SITE, **ctx_changes),
        notes,
        planner=CyclePlanner(),
        previous_plan=None,
        mip_rel_gap=1e-4,
        use_solver=use_solver,
        rack_names=NAMES,
    )
    return got


def test_the_solver_plans_within_the_caps_and_without_it_the_greedy_plan_is_said_to_be_used() -> None:
    p = problem()
    notes: list[str] = []
    solved = plan(p, notes)
    assert solved.status == SolveStatus.OPTIMAL and solved.source == "milp"
    assert notes == []
    assert solved.dvfs is not None
    assert (solved.dvfs.rack_power_w <= p.rack_cap_w() + 1e-6).all()
    greedy = plan(p, notes, use_solver=False)
    assert greedy.source == "greedy" and greedy.status.has_plan
    assert notes == ["greedy plan (the solve was late or not asked for)"]
    # the greedy plan is never better than the optimum
    assert greedy.objective_per_h is not None and solved.objective_per_h is not None
    assert greedy.objective_per_h <= solved.objective_per_h + 1e-6


def test_a_solve_out_of_time_gives_the_greedy_plan_within_the_caps() -> None:
    p = problem(snap=SNAP, ctx=step_context(SITE))
    notes: list[str] = []
    late = plan(p, notes, solver_time_limit_s=1e-6)
    assert late.status == SolveStatus.FALLBACK and late.source == "greedy"  # computed before the solve
    # and the decision says why (it used to show a fallback with no reason)
    assert notes == [
        f"fallback: supply {p.supply_temp_c:g} deg C: the time limit was used up before its solve; greedy plan used"
    ]
    assert late.dvfs is not None
    assert (late.dvfs.rack_power_w <= p.rack_cap_w() + 1e-6).all()


@pytest.mark.parametrize("use_solver", [True, False])
def test_with_no_plan_within_every_cap_the_relaxed_plan_is_returned_flagged_infeasible(use_solver: bool) -> None:
    # rack 0 runs 16 busy cards ("a"'s 8 and 8 of "b"'s 12): more than 3 kW at their lowest levels
    p = dataclasses.replace(problem(), rack_limit_w=np.array([3000.0, 12500.0]))
    notes: list[str] = []
    got = plan(p, notes, use_solver=use_solver)
    assert got.status == SolveStatus.INFEASIBLE
    assert got.dvfs is not None  # a plan to send, the guard caps rack 0
    assert f"rack power: rack {NAMES[0]}:" in got.explanation  # why the original problem has no plan
    assert any(n.startswith("infeasible: ") and f"rack {NAMES[0]}:" in n for n in notes)
    assert f"relaxed: racks {NAMES[0]} left to the guard's caps (idle cards asleep: no reserve)" in notes
    # rack 1, within its cap, is planned as usual
    assert got.dvfs.rack_power_w[1] <= p.rack_cap_w()[1] + 1e-6


def test_a_rack_over_the_limit_its_unexplained_power_leaves_is_explained_with_the_sites_limit_beside() -> None:
    """A PDU reading 9.5 kW above what the twin explains on rack 0: the models get 3 kW of its 12.5 kW,
    which its 16 busy cards exceed at their slowest. The decision's infeasible line names both limits;
    it named the 3.0 kW alone, which an operator takes for a misconfigured limit."""
    ctx = step_context(SITE, rack_extra_w=np.array([9500.0, 0.0]))
    p = problem(ctx=ctx)
    assert p.rack_limit_w.tolist() == [3000.0, 12500.0]
    notes: list[str] = []
    got = plan(p, notes, rack_extra_w=np.array([9500.0, 0.0]))
    assert got.status == SolveStatus.INFEASIBLE
    line = next(n for n in notes if n.startswith("infeasible: "))
    assert line.startswith(f"infeasible: rack power: rack {NAMES[0]}: 16 busy cards at their lowest allowed levels")
    assert line.endswith("> 2.0 kW (limit 3.0 kW - margin 1.0 kW; the site's limit is 12.5 kW)"), line


def test_a_rack_whose_unexplained_power_leaves_no_room_is_explained_as_no_room_not_a_limit_of_0_kw() -> None:
    """A PDU reading 1 MW above what the twin explains on rack 0: the models get the least limit
    (1 W), the rack is left to the guard. The decision's infeasible line says there is no room, with
    the limit in watts beside the site's 12.5 kW; it read "... > -1.0 kW (limit 0.0 kW - margin 1.0
    kW)", which an operator takes for a misconfigured limit."""
    ctx = step_context(SITE, rack_extra_w=np.array([1e6, 0.0]))
    p = problem(ctx=ctx)
    assert p.rack_limit_w.tolist() == [1.0, 12500.0]
    notes: list[str] = []
    got = plan(p, notes, rack_extra_w=np.array([1e6, 0.0]))
    assert got.status == SolveStatus.INFEASIBLE
    line = next(n for n in notes if n.startswith("infeasible: "))
    assert line.startswith(
        f"infeasible: rack power: rack {NAMES[0]}: no room: its limit in this problem is 1 W (the site's limit is "
        "12.5 kW), not above the 1.0 kW margin; 16 busy cards at their lowest allowed levels"
    ), line
    assert "0.0 kW" not in line and "-1.0 kW" not in line
    assert f"relaxed: racks {NAMES[0]} left to the guard's caps (idle cards asleep: no reserve)" in notes


# ---- relax --------------------------------------------------------------------------------------


def offset_on(p: CycleProblem, cards: slice, k: float) -> CycleProblem:
    off = np.zeros(N)
    off[cards] = k
    return dataclasses.replace(p, die_offset_k=off)


def test_a_job_whose_slo_no_cool_level_meets_loses_its_slo_only() -> None:
    p = problem()
    # 30 K over the twin on "a"'s cards: level 0 (~94 deg C) and 1 are over the 85 deg C limit, level 3 is not
    jobs = (dataclasses.replace(p.jobs[0], min_throughput_frac=0.99), p.jobs[1])
    p = offset_on(dataclasses.replace(p, jobs=jobs), slice(0, 8), 30.0)
    t = dvfs_tables(p, 30.0)
    assert t.cheapest_level[0] < 0 and t.die_ok[0].any()
    notes: list[str] = []
    q = relax(p, False, notes, NAMES)
    assert notes == ["relaxed: SLO of job(s) a (no level meets it under the die limit)"]
    assert q.jobs[0].min_throughput_frac == 0.0 and q.jobs[1] == p.jobs[1]
    assert q.least_power_jobs is None
    assert q.ready_reserve_cards == p.ready_reserve_cards
    np.testing.assert_array_equal(q.die_offset_k, p.die_offset_k)


def test_a_job_no_level_keeps_under_the_die_limit_runs_at_its_least_power_and_the_setpoint_may_not_rise() -> None:
    p = offset_on(problem(), slice(8, 20), 60.0)  # "b": ~106 deg C even at the slowest level
    assert p.supply_options_c == (25.0, 30.0, 35.0)
    notes: list[str] = []
    q = relax(p, True, notes, NAMES)
    assert notes == ["relaxed: job(s) b at their least power (over the die limit at every level)"]
    assert q.least_power_jobs is not None and q.least_power_jobs.tolist() == [False, True]
    assert q.supply_options_c == (25.0, 30.0)
    assert q.jobs == p.jobs


def test_only_the_racks_over_their_cap_at_least_power_are_left_unbounded() -> None:
    p = dataclasses.replace(problem(), rack_limit_w=np.array([3000.0, 12500.0]))
    notes: list[str] = []
    q = relax(p, False, notes, NAMES)
    assert notes == [f"relaxed: racks {NAMES[0]} left to the guard's caps (idle cards asleep: no reserve)"]
    assert q.rack_limit_w[0] >= 1e12 and q.rack_limit_w[1] == 12500.0
    assert q.ready_reserve_cards == p.ready_reserve_cards  # feasible once rack 0 is left to the guard


@pytest.mark.parametrize("use_solver", [True, False])
def test_the_idle_cards_of_a_rack_left_to_the_guards_caps_are_no_ready_reserve(use_solver: bool) -> None:
    """Rack 1 (all 12 idle cards of the scene) is 10 W over its cap at its least power: it is left to
    the guard's caps, which put its awake idle cards to low-power idle, so the relaxed problem has
    them asleep (``failed``: the models may not wake them) and the plan keeps none of them awake as
    reserve; :func:`plan_cycle` hands back that problem with its plan (the controller keeps awake
    only cards it counts idle). Was: rack 1, without a cap in the relaxed problem, held the whole
    reserve of 12 awake cards, which the guard put to sleep."""
    p = problem()
    least_w = min_rack_power_w(dvfs_tables(p, 30.0))
    p = dataclasses.replace(p, rack_limit_w=np.array([12500.0, least_w[1] + p.margins.rack_margin_w - 10.0]))
    assert p.ready_reserve_cards == 12 and p.idle_mask().sum() == 12
    notes: list[str] = []
    got, planned = plan_cycle(
        p,
        step_context(SITE),
        notes,
        planner=CyclePlanner(),
        previous_plan=None,
        mip_rel_gap=1e-4,
        use_solver=use_solver,
        rack_names=NAMES,
    )
    assert got.status == SolveStatus.INFEASIBLE and got.dvfs is not None
    assert f"relaxed: racks {NAMES[1]} left to the guard's caps (idle cards asleep: no reserve)" in notes
    assert planned.rack_limit_w[1] >= 1e12 and planned.ready_reserve_cards == 12
    np.testing.assert_array_equal(planned.failed, p.failed | p.idle_mask())
    assert not planned.idle_mask().any()
    assert got.dvfs.rack_awake.tolist() == [0, 0]
    assert got.dvfs.card_low_power[p.idle_mask()].all()


def test_a_relaxed_rack_marks_its_own_idle_cards_only_and_failed_cards_stay_failed() -> None:
    """Rack 0 (jobs "a" and "b", no idle card) is over its cap at its least power, and idle cards 21
    and 30 of rack 1 have failed. Relaxing rack 0 marks none of its busy cards (they run their jobs)
    and none of rack 1's healthy idle cards, and keeps 21 and 30 failed: the relaxed plan may keep
    only rack 1's 10 healthy idle cards awake as reserve, never a failed one."""
    failed = np.zeros(N, dtype=bool)
    failed[[21, 30]] = True
    p = problem(snap=dataclasses.replace(SNAP, card_failed=failed))
    p = dataclasses.replace(p, rack_limit_w=np.array([3000.0, 12500.0]))
    notes: list[str] = []
    q = relax(p, False, notes, NAMES)
    assert notes == [f"relaxed: racks {NAMES[0]} left to the guard's caps (idle cards asleep: no reserve)"]
    np.testing.assert_array_equal(q.failed, failed)
    assert np.flatnonzero(q.idle_mask()).tolist() == [20, 22, 23, 24, 25, 26, 27, 28, 29, 31]
    got, planned = plan_cycle(
        p,
        step_context(SITE),
        notes,
        planner=CyclePlanner(),
        previous_plan=None,
        mip_rel_gap=1e-4,
        use_solver=True,
        rack_names=NAMES,
    )
    assert got.status == SolveStatus.INFEASIBLE and got.dvfs is not None
    np.testing.assert_array_equal(planned.failed, failed)
    assert got.dvfs.card_low_power[[21, 30]].all()


def test_with_both_racks_over_their_caps_the_notes_say_why_for_each_and_name_both() -> None:
    """Both racks over their caps at their least power: the decision's notes carry the infeasible
    line of each rack (an operator reads why each rack has no plan) and the relaxed line names both."""
    p = dataclasses.replace(problem(), rack_limit_w=np.array([3000.0, 3000.0]))
    notes: list[str] = []
    got = plan(p, notes, use_solver=False)
    assert got.status == SolveStatus.INFEASIBLE and got.dvfs is not None
    infeasible = [n for n in notes if n.startswith("infeasible: ")]
    assert [n.split(":", 3)[2] for n in infeasible] == [f" rack {NAMES[0]}", f" rack {NAMES[1]}"], infeasible
    assert f"relaxed: racks {NAMES[0]}, {NAMES[1]} left to the guard's caps (idle cards asleep: no reserve)" in notes


def test_the_ready_reserve_goes_when_the_headroom_cannot_hold_it() -> None:
    p = problem()
    t = dvfs_tables(p, 30.0)
    least_w = min_rack_power_w(t)
    # rack 1 fits at its least power with 50 W to spare: too little to wake the 12 reserve cards
    limit = np.array([12500.0, least_w[1] + p.margins.rack_margin_w + 50.0])
    p = dataclasses.replace(p, rack_limit_w=limit)
    notes: list[str] = []
    q = relax(p, False, notes, NAMES)
    assert notes == ["relaxed: no ready reserve"]
    assert q.ready_reserve_cards == 0
    np.testing.assert_array_equal(q.rack_limit_w, limit)


def test_a_feasible_problem_is_left_as_it_is() -> None:
    p = problem()
    notes: list[str] = []
    q = relax(p, True, notes, NAMES)
    assert notes == []
    assert q is p


def test_the_coolest_setpoint_decides_what_cooling_cannot_fix() -> None:
    # 15 K over the twin on "a" with an SLO of its top level: over the limit at 30 deg C, not at 25
    p = problem()
    jobs = (dataclasses.replace(p.jobs[0], min_throughput_frac=0.99), p.jobs[1])
    p = offset_on(dataclasses.replace(p, jobs=jobs), slice(0, 8), 0.0)
    hot_k = p.die_limit_c - float(dvfs_tables(p, 30.0).job_die_max_c[0, 0]) - 2.0  # 2 K under at 30 deg C ...
    p = offset_on(p, slice(0, 8), hot_k + 3.0)  # ... 1 K over it at 30 deg C, 4 K under it at 25 deg C
    assert dvfs_tables(p, 30.0).cheapest_level[0] < 0 and dvfs_tables(p, 25.0).cheapest_level[0] == 0
    notes: list[str] = []
    assert relax(p, True, notes, NAMES) is p  # the cooler set-point can meet the SLO: nothing relaxed
    assert notes == []
    q = relax(p, False, notes, NAMES)  # the set-point is not chosen this step: 30 deg C
    assert q.jobs[0].min_throughput_frac == 0.0
