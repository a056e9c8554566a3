"""Safety: nothing leaves the agent unless the twin predicts every rack under its cap and every die
under its limit, whatever plan it is given.

:meth:`Guard.review` takes a proposed :class:`agent.decision.Decision` (from the models, the greedy
fallback, or anything else) and returns the decision that may be sent. It recomputes everything with
the twin's own functions (``agent.load.predict``), independently of the solver's rows, in the steps
below, each in a module of its own that ``review`` calls in order (the low-power changes step 2 holds
against are the one thing the guard remembers, :meth:`Guard._observe`); what they share (the draft
decision, the masks of what is not seen or kept, the explanation lines, the caps in watts) is in
``agent.guard_draft``:

1. **Sanity** (``agent.guard_sanity``): levels clipped to the DVFS table (an undefined one the slowest,
   a fractional one the slower of its two), power limits to the card's range, placements kept only when
   the job is queued (once per job) and its cards are free (idle, not failed, not held by a placement
   in flight), seen (not on a blind rack, not a stuck card) and not said failed by a ``card_failed``
   refusal no reading has confirmed (``StepContext.refused_failed_cards``; counted as their readings
   say everywhere else, at the settings in force: step 3a); busy cards are awake (a placed card is
   woken). Placements in flight (``in_flight``: sent by earlier decisions, their jobs not yet seen
   started) hold their cards as busy like the decision's own: awake, budgeted as computing, never put
   to low-power idle (neither for a cap nor by the low-power hold).
2. **Rate limits** (``agent.guard_rate_limits``): a card's level rises (toward faster clocks) by at
   most ``max_level_raise_per_period`` per decision, counted from the level in force (step 3a: as
   reported or, where its rack confirmed a faster one since, that one: the rate limit never slows a
   card below what its rack applied); the supply set-point moves by at most ``max_setpoint_step_k`` (an
   undefined one stays at the one in force, or the site's design set-point when none is known); an idle
   card whose low-power state changed less than ``low_power_hold_s`` ago keeps it (no flapping); all
   cards of a job get one level (the job runs at the pace of its slowest card).
3. **Fail-safe** (``agent.guard_failsafe``): racks whose telemetry is stale or has a stuck sensor
   (``StepContext.failsafe_racks``) get per-card power limits whose sum plus host overhead stays under
   the rack's cap (``(limit - margin - extra - host) / cards``; with cards at the limits in force, step
   3a, the other cards share what those leave, no more than that). On *blind* racks (stale, or frozen
   as a whole: ``StepContext.blind_racks``) every card and every job touching them also gets the
   slowest level (``failsafe_lowest_level``; otherwise no faster than the level in force, step 3a); a
   rack with one card's sensor stuck keeps its jobs' levels (its PDU, loop and other dies are seen; the
   stuck card's die is bounded by its cap in step 5). Caps are never raised, and idle cards the agent
   cannot see (blind racks, stuck cards) are never placed on, woken or put to sleep on stale data: they
   keep the low-power state they last reported (a command the agent cannot see take effect, and that
   its rack's fail-safe limits make unnecessary for the cap).
3a. **Settings no command changes** (``agent.guard_in_force``): a card a ``card_failed`` refusal says
   failed, no reading having confirmed it (``StepContext.refused_failed_cards``), gets no command
   (``agent.command_diff`` leaves it out of levels, power limits, sleeps and wakes) while its rack may
   read it alive (a stale scheduler's refusal, a repeat's hold): it keeps the level and power limit in
   force (a busy one too; its job's other cards get the job's level, and ``Decision.job_levels`` is
   theirs) and an idle one the low-power state in force, neither woken nor put to sleep. A card a
   refusal of another reason holds one kind of setting back on (``Overlays.backoff``, ``command_ttl_s``
   from the refusal: ``StepContext.held_level_cards``, ``held_limit_cards``, ``held_sleep_cards``)
   keeps that kind alone as in force (its level, its power limit, or, idle, its low-power state); its
   other settings are the decision's (a card whose level is held may still get a power limit or sleep).
   A setting *in force* is the one telemetry reports or, where the card's rack confirmed applying a
   faster level, a higher limit or a wake (its retained applied state: ``StepContext.applied_level``,
   ``applied_power_limit_w``, ``applied_low_power``; the commands' diff counts from the confirmed
   level), the confirmed one: telemetry shows a setting the rack applied up to one telemetry period
   later, and the card draws at it meanwhile (where nothing is confirmed, as reported). So a kept idle
   card is asleep only where telemetry shows it asleep and its rack did not confirm it awake. Steps
   3b-5 count each kept setting so and take no lever on it (no sleep, slowing or power limit for a cap
   or a die): a rack or die they cannot hold without it is said not held. The service's context has the
   refusals in force, and what the racks confirmed, when the guard reviews, those acked during the
   solve included.
3b. **Pumps** (``agent.guard_pumps``; when the decision sets pump speeds, ``agent.pumps``): speeds are
   clipped to the site's range (an undefined one is full speed); fail-safe racks get full speed; a rack
   where, at the levels so far with every busy card computing, the twin predicts a die over its limit,
   the rack over its cap or the loop's rise over ``max_delta_t_k`` at its proposed speed gets full
   speed. Steps 4-5 and the predictions then use each card's resistance at its rack's speed and its die
   offset scaled to that speed (``agent.pumps.offset_at_speed``).
4. **Caps** (``agent.guard_caps``, with the power tables steps 4-5 predict with): the twin predicts
   every card's power with every busy card *computing* at its level (a job in a stall or a checkpoint
   may resume at any moment) and its die at the warmer of the rack's measured supply and the new
   set-point, plus the card's measured die offset (``StepContext.die_offset_k``: the twin's persistent
   error, never a transient, ``agent.offsets``; the same array the planner used). While a rack is over
   ``limit - margin - extra``, as few of its awake idle cards it can see as bring it under go to
   low-power idle, those whose sleep saves the most first (the others stay awake, the ready reserve);
   while it is still over, the job of that rack whose next slower level gives up the least value per
   watt saved steps down, and the cards put to sleep that the slowing made room for stay awake after
   all (a sleep loses no work now, a slower job does: the idle cards go first); if the rack is still
   over (its idle cards asleep, its jobs all at the slowest level), every card of the rack whose power
   limit commands set gets the fail-safe power limit (cards that keep the limit in force, step 3a, keep it: the others
   share what it leaves). That holds the cap unless the limit it needs is below
   ``control.min_power_limit_w`` (the lowest a card accepts), or cards at settings in force (step 3a)
   draw more than it: the configuration check rules that out for a site's own rack limits
   (``agent.config.check_control``), but not power the twin does not explain (``rack_extra_w``, e.g.
   30 kW more on a PDU than its cards and hosts draw); then the guard says the rack cannot be held (an
   explanation line, its predicted power over its cap in the metrics; the periodic decision's plan,
   relaxed at the cap, is ``infeasible``) and no lever of the agent is left.
5. **Dies** (``agent.guard_dies``): a busy card predicted above ``slowdown_temp_c - die_margin_k``
   slows its job down; at the slowest level its power limit is set to what the die limit allows. The
   explanation lines say which jobs were slowed (to which level), which were power-limited at the
   slowest level, and which dies cannot be held even at ``control.min_power_limit_w`` or are on cards
   that keep the power limit in force (step 3a; no lever of the agent is left for them).

Each explanation line the guard writes (``guard: ...``) comes with its action, one of
:data:`GUARD_ACTIONS`, in ``Decision.guard_actions`` (written together by one helper,
``agent.guard_draft.Notes``; the explanation keeps the guard's first 12 lines, the actions are all
kept), which ``racktwin_guard_actions_total`` counts (``agent.metric_updates``).

Property (tests/agent/test_guard_properties.py): for any proposal, the reviewed decision's twin
prediction (``min(P(level), limit)`` per awake card, low-power and failed cards as they are) keeps
every rack within ``limit - margin - extra`` wherever the fail-safe power limit can (above); with
cards no command reaches or settings a refusal holds back (tests/agent/test_guard_refused_cards.py,
tests/agent/test_guard_held_back.py) the budget is what the racks draw with those settings in force
(as the cards report them, or as their racks confirmed a faster level, a higher limit or a wake:
tests/agent/test_guard_confirmed_settings.py), within the cap or the rack said not held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agent.config import ControlConfig
from agent.decision import Decision, StepContext
from agent.guard_caps import enforce_caps, low_power_w, power_table_w
from agent.guard_dies import enforce_dies
from agent.guard_draft import (
    GUARD_ACTIONS,
    BoolArray,
    Draft,
    FloatArray,
    GuardSetup,
    Notes,
    Sight,
    failsafe_card_limit_w,
    rack_measured_caps_w,
    rack_modelled_caps_w,
)
from agent.guard_failsafe import apply_failsafe, failsafe_beside_kept
from agent.guard_in_force import job_level, keep_in_force, kept_levels
from agent.guard_pumps import review_pumps, thermal_at_speeds
from agent.guard_rate_limits import hold_low_power, limit_level_raises, limit_setpoint
from agent.guard_sanity import check_shapes, sanitize
from agent.load import predict
from twin.cooling import facility_cooling
from twin.spec import SiteSpec
from twin.state import StateSnapshot

__all__ = ["GUARD_ACTIONS", "Guard", "failsafe_card_limit_w", "rack_measured_caps_w", "rack_modelled_caps_w"]

_MAX_NOTES = 12


class Guard:
    """Reviews decisions (see the module docstring). Keeps only what it needs to rate-limit the
    low-power state: when each card last changed it, as telemetry shows."""

    def __init__(self, site: SiteSpec, control: ControlConfig | None = None, *, card_hour_value: float = 2.0) -> None:
        self._setup = GuardSetup.of(site, control if control is not None else ControlConfig(), card_hour_value)
        n = site.n_cards
        self._seen_lp: BoolArray | None = None
        self._toggle_s = np.full(n, -math.inf)

    # ---- public -------------------------------------------------------------------------------
    @property
    def site(self) -> SiteSpec:
        return self._setup.site

    @property
    def control(self) -> ControlConfig:
        return self._setup.control

    @property
    def card_hour_value(self) -> float:
        """The value of a card-hour the caps' choice of the job to slow uses (``agent.load.job_value_per_h``)."""
        return self._setup.card_hour_value

    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s``: the low-power toggles kept on the old timeline count
        as made now (the hold against toggling lasts its time from now, not until the old times)."""
        np.minimum(self._toggle_s, now_s, out=self._toggle_s)

    def review(
        self,
        proposal: Decision,
        snap: StateSnapshot,
        ctx: StepContext,
        *,
        in_flight: Sequence[tuple[str, Sequence[int]]] = (),
    ) -> Decision:
        """The decision that may be sent: the steps of the module docstring, in its order (each step
        works on what the steps before it let through; ``notes`` collects their explanation lines).
        ``in_flight``: ``(job id, cards)`` of placements earlier decisions sent whose jobs the snapshot
        still shows queued (``agent.placing.PlacementBook.in_flight``): their cards are busy."""
        gs = self._setup  # what every step reads (agent.guard_draft.GuardSetup)
        check_shapes(gs, proposal)
        site, cfg = self.site, self.control
        notes = Notes()
        snap_lp = np.asarray(snap.card_low_power, dtype=bool)
        self._observe(snap_lp, ctx.now_s)
        sight = Sight.of(site, ctx, gs.card_rack, snap)

        # 1. sanity; 2. rate limits
        draft = sanitize(gs, proposal, snap, ctx, sight, notes, in_flight)
        setpoint = limit_setpoint(gs, proposal.supply_temp_c, ctx.setpoint_c, notes)
        in_force_lv = kept_levels(gs, snap, ctx)  # the levels the cards run at (reported or confirmed)
        limit_level_raises(gs, draft, in_force_lv, notes)
        hold_low_power(gs, draft, snap_lp, ctx.now_s, self._toggle_s)

        # 3. fail-safe racks
        fs_lim = failsafe_card_limit_w(site, cfg, ctx.rack_extra_w)
        if sight.limit_kept.any():  # the limits the others share beside those no command changes
            fs_lim = failsafe_beside_kept(gs, fs_lim, snap, sight.limit_kept, ctx)
        if sight.failsafe_rack.any():
            apply_failsafe(gs, draft, snap, snap_lp, in_force_lv, sight, fs_lim, ctx.stuck_cards, notes)
        # settings no command changes stay as the racks have them (before any prediction counts on them)
        if sight.any_kept():
            keep_in_force(gs, draft, snap, snap_lp, sight, ctx)

        # 3b. pumps, then the thermal conditions steps 4-5 and the predictions use
        inlet = np.maximum(ctx.card_inlet_c, setpoint)
        off = np.asarray(ctx.die_offset_k, dtype=np.float64)  # persistent model error (agent.offsets)
        measured_caps = rack_measured_caps_w(site, cfg)
        modelled_caps = rack_modelled_caps_w(site, cfg, ctx.rack_extra_w)
        speed = review_pumps(
            gs, proposal.rack_pump_speed_frac, draft, inlet, off, measured_caps, sight.failsafe_rack, ctx, notes
        )
        r_eff, off = thermal_at_speeds(gs, speed, off, ctx)

        # 4. caps; 5. dies
        table = power_table_w(gs, draft.load, inlet, r_eff, off)
        lp_w = low_power_w(gs, inlet, r_eff, off)
        failed = np.asarray(snap.card_failed, dtype=bool)
        enforce_caps(
            gs, draft, table, lp_w, modelled_caps, fs_lim, failed, notes, unseen=sight.unseen_card, sight=sight
        )
        enforce_dies(gs, draft, table, inlet, r_eff, off, notes, sight=sight)

        return self._reviewed(
            proposal, draft, failed, setpoint, speed, sight, inlet, r_eff, off, measured_caps, ctx, notes
        )

    # ---- the decision that leaves --------------------------------------------------------------
    def _reviewed(
        self,
        proposal: Decision,
        draft: Draft,
        failed: BoolArray,
        setpoint: float,
        speed: FloatArray | None,
        sight: Sight,
        inlet: FloatArray,
        r_eff: FloatArray,
        off: FloatArray,
        measured_caps: FloatArray,
        ctx: StepContext,
        notes: Notes,
    ) -> Decision:
        """The decision that leaves, with the twin's predictions of it: rack power with every busy card
        computing (the budget held to the caps, its hottest dies) and in the jobs' expected phases (the
        prediction, the facility's power and PUE at it), status ``failsafe`` on any fail-safe rack."""
        site = self.site
        load, lvl, lp, lim = draft.load, draft.level, draft.low_power, draft.power_limit_w
        busy = load.busy
        fs_rack = sight.failsafe_rack
        budget = predict(site, load, lvl, lp, lim, inlet, r_eff, off, rack_extra_w=ctx.rack_extra_w)
        expected = predict(site, load, lvl, lp, lim, inlet, r_eff, off, worst_case=False, rack_extra_w=ctx.rack_extra_w)
        it_w = float(expected.rack_power_w.sum())
        flow = None if speed is None else speed * ctx.rack_flow_full_lpm / site.loop_flow_per_rack_lpm()
        cooling = facility_cooling(site, it_w, setpoint, ctx.ambient_c, flow_fraction=1.0 if flow is None else flow)
        status = "failsafe" if fs_rack.any() else proposal.status
        job_levels = {j.job_id: job_level(lvl, j.cards, sight.level_kept) for j in load.jobs}
        return proposal.replace(
            card_level=lvl,
            card_low_power=lp & ~busy,
            card_power_limit_w=lim,
            card_failed=failed,
            card_busy=busy,
            supply_temp_c=setpoint,
            placements=tuple(draft.orders),
            status=status,
            failsafe_racks=tuple(int(r) for r in np.flatnonzero(fs_rack)),
            rack_cap_w=measured_caps,
            predicted_rack_power_w=expected.rack_power_w,
            budget_rack_power_w=budget.rack_power_w,
            predicted_rack_max_die_c=budget.rack_max_die_c,
            predicted_it_power_w=it_w,
            predicted_facility_power_w=cooling.facility_power_w,
            predicted_pue=cooling.pue,
            max_power_limit_w=site.card.power_limit_w,
            job_levels=job_levels,
            explanation=(*proposal.explanation, *notes.lines[:_MAX_NOTES]),
            guard_actions=(*proposal.guard_actions, *notes.actions),
            queue_waits=draft.queue_waits,
            guarded=True,
            rack_pump_speed_frac=speed,
        )

    # ---- helpers -------------------------------------------------------------------------------
    def _observe(self, snap_lp: BoolArray, now_s: float) -> None:
        """Note when each card's low-power state changed (as telemetry shows it)."""
        if self._seen_lp is not None:
            changed = snap_lp != self._seen_lp
            self._toggle_s[changed] = now_s
        self._seen_lp = snap_lp.copy()
