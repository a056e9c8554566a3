"""The guard's test scene and plain builders of its inputs (no fixtures)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
from agent_helpers import belief, job, small_site

from agent.decision import Decision, StepContext
from agent.load import predict, site_load, spec_r_total_k_per_w
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import StateSnapshot
from twin.workload import Phase


@cache
def scene() -> tuple[SiteSpec, StateSnapshot]:
    """2 racks of 16 cards: job "a" (priority 1) on cards 0-7, job "b" (priority 2) on cards 8-19,
    "q" (4 cards) queued, cards 20-31 idle and awake; every card at level 0 and 700 W."""
    site = small_site()
    jobs = [job("a", 8, share=0.97), job("b", 12, share=0.9, priority=2.0), job("q", 4)]
    _plant, state = belief(site, jobs[:2], 90)
    # "q" is queued (the belief's plant never saw it, so nothing placed it)
    state.apply_events([JobEvent(time_s=90.0, job_id="q", kind="submitted", phase=Phase.WAITING, job=jobs[2])])
    snap = state.snapshot()
    return site, snap


def step_context(site: SiteSpec, **changes: Any) -> StepContext:
    """Every rack seen and fresh at a 30 deg C supply (its set-point), pumps at full speed, no
    measured offsets or extra power, at t = 100 s; ``changes`` replace fields."""
    n = site.n_cards
    fields: dict[str, Any] = dict(
        now_s=100.0,
        cycle=1,
        stale_racks=(),
        stuck_racks=(),
        stuck_cards=(),
        blind_racks=(),
        failsafe_racks=(),
        setpoint_c=30.0,
        ambient_c=25.0,
        card_inlet_c=np.full(n, 30.0),
        r_total_k_per_w=spec_r_total_k_per_w(site),
        die_offset_k=np.zeros(n),
        rack_extra_w=np.zeros(site.n_racks),
        rack_flow_full_lpm=np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        rack_pump_speed_frac=np.ones(site.n_racks),
        choose_setpoint=False,
        solver_time_limit_s=1.0,
    )
    fields.update(changes)
    return StepContext(**fields)


def proposal(site: SiteSpec, level: Any = 0, **changes: Any) -> Decision:
    """A plan with every card at ``level`` (a number or one per card), awake, at the card's largest
    power limit, the set-point at 30 deg C, no placements; ``changes`` replace fields."""
    n = site.n_cards
    nan_r = np.full(site.n_racks, np.nan)
    fields: dict[str, Any] = dict(
        cycle=1,
        time_s=100.0,
        card_level=np.broadcast_to(np.asarray(level, dtype=np.int64), (n,)).copy(),
        card_low_power=np.zeros(n, dtype=bool),
        card_power_limit_w=np.full(n, site.card.power_limit_w),
        card_failed=np.zeros(n, dtype=bool),
        card_busy=np.zeros(n, dtype=bool),
        supply_temp_c=30.0,
        placements=(),
        status="optimal",
        plan_status="optimal",
        source="milp",
        solve_time_s=0.0,
        failsafe_racks=(),
        rack_cap_w=nan_r,
        predicted_rack_power_w=nan_r,
        budget_rack_power_w=nan_r,
        predicted_rack_max_die_c=nan_r,
        predicted_it_power_w=0.0,
        predicted_facility_power_w=0.0,
        predicted_pue=1.0,
    )
    fields.update(changes)
    return Decision(**fields)


def in_force(
    snap: StateSnapshot, ctx: StepContext
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Each card's level, power limit and low-power state in force: as it reports them, or as its rack
    confirmed applying them (``ctx.applied_level``, ``ctx.applied_power_limit_w``, ``ctx.applied_low_power``)
    where that is a faster level (a smaller index), a higher limit or awake (agent.guard, step 3a)."""
    level = np.asarray(snap.card_level, dtype=np.int64)
    limit = np.asarray(snap.card_power_limit_w, dtype=np.float64)
    low = np.asarray(snap.card_low_power, dtype=bool)
    if ctx.applied_level is not None:
        level = np.where(ctx.applied_level >= 0, np.minimum(level, ctx.applied_level), level)
    if ctx.applied_power_limit_w is not None:
        limit = np.where(np.isfinite(ctx.applied_power_limit_w), np.fmax(limit, ctx.applied_power_limit_w), limit)
    if ctx.applied_low_power is not None:
        low = low & (ctx.applied_low_power != 0.0)  # awake where either says awake (NaN: none confirmed)
    return level, limit, low


def drawn_rack_power_w(site: SiteSpec, d: Decision, snap: StateSnapshot, ctx: StepContext) -> npt.NDArray[np.float64]:
    """What each rack will draw (every busy card computing, the twin, plus the power it does not explain):
    the decision's settings, but each kind a refusal holds back (``ctx.held_*_cards``) and every kind on
    the cards no command reaches (``ctx.refused_failed_cards``) as in force (:func:`in_force`): what the
    guard's budget must equal (agent.guard, step 3a)."""

    def mask(cards: tuple[int, ...]) -> npt.NDArray[np.bool_]:
        out = np.zeros(site.n_cards, dtype=bool)
        out[list(cards)] = True
        return out

    unreached = mask(ctx.refused_failed_cards)
    level_now, limit_now, low_now = in_force(snap, ctx)
    level = np.where(unreached | mask(ctx.held_level_cards), level_now, d.card_level)
    low = np.where(unreached | mask(ctx.held_sleep_cards), low_now, d.card_low_power)
    limit = np.where(unreached | mask(ctx.held_limit_cards), limit_now, d.card_power_limit_w)
    load = site_load(site, snap, [(p.job_id, p.cards) for p in d.placements])
    inlet = np.maximum(ctx.card_inlet_c, d.supply_temp_c)
    got = predict(
        site, load, level, low, limit, inlet, ctx.r_total_k_per_w, ctx.die_offset_k, rack_extra_w=ctx.rack_extra_w
    )
    return np.asarray(got.rack_power_w, dtype=np.float64)
