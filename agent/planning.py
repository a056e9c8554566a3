"""The plan of one control step: the models' problem from what the agent sees, its plan, and its relaxation.

* :func:`cycle_problem`: the ``models.problem.CycleProblem`` of a step: the site's jobs (those that
  do not compute now and those touching a blind rack *pinned*: handed to the models as computing
  jobs of no value, or with the opt-in ``resume_lag_s`` of the value :func:`pinned_value_frac`
  gives them, so that they get their cheapest level while their computing power is budgeted), the
  cards the models may not use (failed, unseen idle, idle on hosts that are off, idle and kept out of
  placement by a ``card_failed`` refusal: none of them is ready reserve), the calibrated
  thermal parameters and measured die offsets of the step's context, the set-point options within
  ``max_setpoint_step_k``, each rack's cap less the power the twin does not explain (and the wake
  power of the refused idle cards that are awake), at least ``_NO_ROOM_W`` (a rack with no room is
  then one :func:`relax` leaves to the guard), the ready reserve of each supernode
  (``control.idle_reserve_cards``, capped by its cards a job can take: a job runs inside one
  supernode), and which of its cards are awake now (with the opt-in ``reserve_wake_tie_w``, the plan
  keeps the reserve on those where racks tie: ``CycleProblem.wake_tie_w``);
* :func:`plan_cycle`: the planner's plan (``models.solve.CyclePlanner``; the greedy plan without the
  solver) and the problem it plans; where no plan meets every constraint, the plan of the problem
  :func:`relax` leaves, flagged infeasible, and that problem;
* :func:`relax`: the problem without what no plan can meet, so that one job or rack never drags the
  site to its slowest levels (the guard then caps those racks, their idle cards no ready reserve).

Pure functions of their arguments (the controller, ``agent.controller.Controller``, hands them its
configuration, its planner and its previous plan); the explanation lines go to ``notes``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from agent.config import ControlConfig
from agent.decision import StepContext
from agent.load import SiteLoad
from models.explain import is_feasible, min_rack_power_w
from models.plans import CyclePlan, SolveStatus
from models.problem import CycleProblem, Margins, Prices, dvfs_tables, make_problem
from models.solve import CyclePlanner, greedy_cycle
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.state import JobInfo, StateSnapshot
from twin.steady import card_steady_power_w
from twin.thermal import ThermalParams
from twin.workload import JobSpec, Phase

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["checkpoint_ends_soon", "checkpoint_wake_s", "cycle_problem", "pinned_value_frac", "plan_cycle", "relax"]

#: Priority handed to the models for a job on a blind rack, and the least for a pinned job (one that
#: does no clock-sensitive work now): its value is nil, so the MILP gives it its cheapest level while
#: budgeting its computing power.
_PINNED_PRIORITY = 1e-9

#: A rack limit that never binds (racks the models cannot satisfy are left to the guard).
_UNBOUNDED_W = 1e12

#: The least rack limit handed to the models: a rack whose unexplained power leaves it no room (an
#: absurd PDU reading the belief still takes: 1 MW on a 50-kW rack) gets this instead of a limit the
#: models refuse (not positive), below its least power, so the site's problem is built and
#: :func:`relax` leaves that rack alone to the guard's caps (``models.explain`` says "no room: its
#: limit in this problem is 1 W", not a limit of 0.0 kW).
_NO_ROOM_W = 1.0


def pinned_value_frac(resume_lag_s: float, pinned_for_s: float) -> float:
    """The share of a computing job's value a job out of compute for ``pinned_for_s`` keeps.

    A job that resumes computing runs ``resume_lag_s`` at the level it was given meanwhile: that level
    costs its throughput loss over the lag, once per resume. Expecting the job to stay out of compute
    about as long again as it has been (the phases are heavy-tailed: checkpoints, stalls, start-up),
    that cost spread over the time the slow level saves power is the job's value per second times
    ``resume_lag_s / pinned_for_s``. With that value the MILP keeps the job's clock until the power
    the slow level saves has paid for the resume's loss, then slows it: the ski-rental rule, whose
    cost is at most twice that of the best choice in hindsight (the hosts' break-even rule too).
    The models weigh that value against the job's *computing* power at each level (a paused job is
    budgeted as if it resumed), which overstates what a slower level saves in a pause, so the job
    slows sooner than this break-even (docs/agent.md, ``control.resume_lag_s``).
    ``resume_lag_s = 0`` values a pinned job at nothing from its first second."""
    if resume_lag_s <= 0.0:
        return 0.0
    return min(1.0, resume_lag_s / max(pinned_for_s, resume_lag_s))


def checkpoint_ends_soon(phase: Phase, spec: JobSpec, phase_since_s: float, now_s: float, lead_s: float) -> bool:
    """Whether a job in a checkpoint since ``phase_since_s`` is expected to resume computing within
    ``lead_s`` of ``now_s`` (its declared ``checkpoint_duration_s`` after it began), and has not
    overrun that expected end by more than ``lead_s``. Such a job is planned as computing so that its
    clock is back when it resumes (``control.checkpoint_end_lead_s``; 0 = never)."""
    if lead_s <= 0.0 or phase != Phase.CHECKPOINT:
        return False
    left_s = phase_since_s + spec.checkpoint_duration_s - now_s
    return -lead_s < left_s <= lead_s


def checkpoint_wake_s(jobs: Iterable[JobInfo], after_s: float, lead_s: float) -> float:
    """The earliest time after ``after_s`` (the last decision) at which a running job's checkpoint
    comes within ``lead_s`` of its declared end (:func:`checkpoint_ends_soon`): when a decision gives
    it its clock back. A checkpoint begun closer to its end than ``lead_s`` counts from its beginning.
    inf when no job is due (or ``lead_s`` is 0)."""
    wake = math.inf
    if lead_s <= 0.0:
        return wake
    for info in jobs:
        if info.state != "running" or info.phase != Phase.CHECKPOINT or info.spec is None:
            continue
        due = max(info.last_event_s + info.spec.checkpoint_duration_s - lead_s, info.last_event_s)
        if due > after_s:
            wake = min(wake, due)
    return wake


def cycle_problem(
    site: SiteSpec,
    cfg: ControlConfig,
    load: SiteLoad,
    snap: StateSnapshot,
    ctx: StepContext,
    *,
    margins: Margins,
    prices: Prices,
) -> CycleProblem:
    """The models' problem for ``load`` (the site's jobs, placements in flight included) in the step
    of ``snap`` and ``ctx`` (see the module docstring)."""
    card_rack = site.card_rack()
    blind_card = ctx.blind_card_mask(card_rack)
    jobs: list[JobSpec] = []
    cards: list[IntArray] = []
    since = {info.job_id: info.last_event_s for info in snap.jobs}
    for j in load.jobs:
        spec = j.spec
        if bool(blind_card[j.cards].any()):  # safety first: the slowest level, SLO or not
            spec = dataclasses.replace(spec, priority=_PINNED_PRIORITY, min_throughput_frac=0.0)
        elif not j.computing and not checkpoint_ends_soon(
            j.phase, spec, since.get(j.job_id, ctx.now_s), ctx.now_s, cfg.checkpoint_end_lead_s
        ):  # valued for the work its level costs at the resume (SLO kept)
            frac = pinned_value_frac(cfg.resume_lag_s, ctx.now_s - since.get(j.job_id, ctx.now_s))
            spec = dataclasses.replace(spec, priority=max(spec.priority * frac, _PINNED_PRIORITY))
        jobs.append(spec)
        cards.append(j.cards)
    # idle cards the agent cannot see are out of the models' hands (never woken on stale data), and
    # so are the idle cards of hosts that are off: the plan cannot wake them (a wake would boot the
    # host), so the ready reserve must sit on hosts that are on (budgeted at low-power idle, as now)
    unusable = ctx.unseen_card_mask(card_rack) | np.asarray(snap.card_host_off, dtype=bool)
    # and so are the idle cards a card_failed refusal keeps out of placement (marked or held:
    # ``StepContext.refused_failed_cards``): no job can take them, so they are no ready reserve, and no
    # command reaches them (``agent.command_diff``): they stay in the state they report, an awake one
    # budgeted awake (its wake power off its rack's limit; the models count such cards asleep)
    held = np.zeros(site.n_cards, dtype=bool)
    held[list(ctx.refused_failed_cards)] = True
    held &= load.idle & ~unusable
    failed = np.asarray(snap.card_failed, dtype=bool) | ((unusable | held) & load.idle)
    die = np.asarray(snap.card_die_temp_c, dtype=np.float64)
    die = np.where(np.isfinite(die), die, ctx.card_inlet_c)
    r_dc = np.full(site.n_cards, site.card.r_die_to_case_k_per_w)
    thermal = ThermalParams(
        r_die_case_k_per_w=r_dc,
        r_case_coolant_k_per_w=np.maximum(ctx.r_total_k_per_w - r_dc, 1e-5),
        c_die_j_per_k=np.full(site.n_cards, site.card.die_heat_capacity_j_per_k),
        c_plate_j_per_k=np.full(site.n_cards, site.cold_plate.heat_capacity_j_per_k),
    )
    options = tuple(
        o for o in site.facility.supply_temp_options_c if abs(o - ctx.setpoint_c) <= cfg.max_setpoint_step_k + 1e-9
    ) or (ctx.setpoint_c,)
    snap_lp = np.asarray(snap.card_low_power, dtype=bool)
    # idle cards a job can be placed on, on hosts that are on, per supernode: a job runs inside one, so each
    # keeps its own reserve
    placeable = site.rack_supernode()[card_rack[load.idle & ~failed]]
    reserve = np.minimum(cfg.idle_reserve_cards, np.bincount(placeable, minlength=site.supernodes))
    return make_problem(
        site,
        jobs=jobs,
        job_cards=cards,
        job_phase=[Phase.COMPUTE] * len(jobs),
        failed=failed,
        die_temp_c=die,
        die_offset_k=ctx.die_offset_k,
        thermal=thermal,
        ambient_c=ctx.ambient_c,
        supply_temp_c=ctx.setpoint_c,
        supply_options_c=options,
        rack_limit_w=np.maximum(
            site.rack_power_limits_w() - ctx.rack_extra_w - _wake_w(site, ctx, held & ~snap_lp), _NO_ROOM_W
        ),
        ready_reserve_cards=reserve,
        margins=margins,
        prices=prices,
        awake_now=~snap_lp,
        wake_tie_w=cfg.reserve_wake_tie_w,
    )


def _wake_w(site: SiteSpec, ctx: StepContext, awake: BoolArray) -> FloatArray:
    """Per rack, what its ``awake`` idle cards draw beyond low-power idle at the set-point in force
    (the twin's steady power at the slowest level, as the models price a wake)."""
    model = PowerModel.from_card(site.card)
    cards = np.flatnonzero(awake)
    level = np.full(cards.size, model.n_levels - 1)
    idle_u = np.zeros(cards.size)
    r = ctx.r_total_k_per_w[cards]
    lp_w, _ = card_steady_power_w(model, level, idle_u, np.ones(cards.size, dtype=bool), ctx.setpoint_c, r)
    aw_w, _ = card_steady_power_w(model, level, idle_u, np.zeros(cards.size, dtype=bool), ctx.setpoint_c, r)
    return np.bincount(site.card_rack()[cards], weights=aw_w - lp_w, minlength=site.n_racks).astype(np.float64)


def plan_cycle(
    p: CycleProblem,
    ctx: StepContext,
    notes: list[str],
    *,
    planner: CyclePlanner,
    previous_plan: CyclePlan | None,
    mip_rel_gap: float,
    use_solver: bool,
    rack_names: tuple[str, ...],
) -> tuple[CyclePlan, CycleProblem]:
    """The planner's plan (the greedy one without the solver; ``previous_plan`` warm-starts the
    solver) and the problem it plans (``p``); where no plan meets every constraint, the plan of the
    problem without what no plan can meet (:func:`relax`), flagged infeasible, and that problem (its
    idle cards are those the plan may keep awake: not those of a rack left to the guard's caps). Why
    a set-point the solver was run for kept the greedy plan (late, failed, no solution: the plan's
    explanation) goes to ``notes`` as ``fallback: ...``, the relaxed plan's too."""
    choose = ctx.choose_setpoint and len(p.supply_options_c) > 1
    if use_solver:
        plan = planner.plan(
            p,
            previous_plan,
            time_limit_s=ctx.solver_time_limit_s,
            mip_rel_gap=mip_rel_gap,
            choose_setpoint=choose,
            refine_top=2,
        )
    else:
        plan = greedy_cycle(p, choose_setpoint=choose)
        notes.append("greedy plan (the solve was late or not asked for)")
    if plan.status != SolveStatus.INFEASIBLE:
        notes.extend(f"fallback: {line}" for line in plan.explanation.splitlines()[:6])
        return plan, p
    notes.extend(f"infeasible: {line}" for line in plan.explanation.splitlines()[:6])
    q = relax(p, choose, notes, rack_names)
    if use_solver:
        relaxed = planner.plan(
            q,
            previous_plan,
            time_limit_s=ctx.solver_time_limit_s,
            mip_rel_gap=mip_rel_gap,
            choose_setpoint=choose and len(q.supply_options_c) > 1,
            refine_top=2,
        )
    else:
        relaxed = greedy_cycle(q, choose_setpoint=choose and len(q.supply_options_c) > 1)
    if not relaxed.status.has_plan:
        return plan, p
    notes.extend(f"fallback: {line}" for line in relaxed.explanation.splitlines()[:6])
    return dataclasses.replace(relaxed, status=SolveStatus.INFEASIBLE, explanation=plan.explanation), q


def relax(p: CycleProblem, choose: bool, notes: list[str], rack_names: tuple[str, ...]) -> CycleProblem:
    """No plan meets every constraint: ``p`` without what no plan can meet at the coolest set-point
    within reach (what cooling cannot fix), so that the rest, set-point included, is planned as
    usual and one job or rack never drags the site to its slowest levels or its coolest set-point.
    In order, each only where still needed:

    1. jobs with no level that meets both their SLO and the die limit: a job some level keeps
       under the die limit loses its SLO (it runs as fast as its dies allow); a job no level keeps
       under it runs at its least power, its hot cards left to the guard, and the set-point may
       not rise (``CycleProblem.least_power_jobs``);
    2. racks over their cap at their least power: left to the guard's caps, their idle cards asleep
       and none of them ready reserve (marked ``failed``: the models may not wake them and budget
       them asleep). No plan keeps such a rack within its cap, and the guard puts its awake idle
       cards to low-power idle for the cap once its jobs are slowed: a reserve planned there was
       put to sleep by the guard while other racks had room for it (until 2026-12-05);
    3. the ready reserve (of every supernode);
    4. the measured die offsets (the guard caps hot cards): a safety net; after 1-3 the plan's
       feasibility check has nothing left to refuse (SLOs and dies, rack caps and the reserve are
       lifted), so no known case reaches it (a mutation audit, 2026-12-05, found none).
    """
    coolest = min(p.supply_options_c) if choose else p.supply_temp_c
    q = p
    t = dvfs_tables(q, coolest)
    stuck = t.cheapest_level < 0
    if stuck.any():
        hot = stuck & ~t.die_ok.any(axis=1)
        slo = stuck & ~hot
        if slo.any():
            free = (dataclasses.replace(j, min_throughput_frac=0.0) if slo[i] else j for i, j in enumerate(q.jobs))
            q = dataclasses.replace(q, jobs=tuple(free))
            ids = ", ".join(q.jobs[i].job_id for i in np.flatnonzero(slo)[:6])
            notes.append(f"relaxed: SLO of job(s) {ids} (no level meets it under the die limit)")
        if hot.any():
            warmest = q.supply_temp_c + 1e-9
            options = tuple(o for o in q.supply_options_c if o <= warmest) or (q.supply_temp_c,)
            q = dataclasses.replace(q, least_power_jobs=hot, supply_options_c=options)
            ids = ", ".join(q.jobs[i].job_id for i in np.flatnonzero(hot)[:6])
            notes.append(f"relaxed: job(s) {ids} at their least power (over the die limit at every level)")
        t = dvfs_tables(q, coolest)
    bad = min_rack_power_w(t) > t.rack_cap_w + 1e-6
    if bad.any():
        asleep = (q.card_job < 0) & bad[q.site.card_rack()]  # the idle cards the guard puts to sleep
        q = dataclasses.replace(q, rack_limit_w=np.where(bad, _UNBOUNDED_W, q.rack_limit_w), failed=q.failed | asleep)
        names = ", ".join(rack_names[r] for r in np.flatnonzero(bad))
        notes.append(f"relaxed: racks {names} left to the guard's caps (idle cards asleep: no reserve)")
        t = dvfs_tables(q, coolest)
    if not is_feasible(q, t):
        q = dataclasses.replace(q, ready_reserve_cards=np.zeros_like(q.ready_reserve_cards))
        notes.append("relaxed: no ready reserve")
        t = dvfs_tables(q, coolest)
    if not is_feasible(q, t):
        q = dataclasses.replace(q, die_offset_k=np.zeros_like(q.die_offset_k))
        notes.append("relaxed: measured die offsets ignored (the guard caps hot cards)")
    return q
