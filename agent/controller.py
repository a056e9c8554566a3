"""One control step, synchronous and pure of I/O: a TwinState snapshot in, a Decision out.

The same :class:`Controller` runs inside the asyncio service (``agent.service``) and inside an
in-process closed loop with ``twin.plant.Plant`` (``agent.loop.ClosedLoop``), as do-mpc runs
``mpc.make_step`` and ``simulator.make_step`` in one loop::

    controller = Controller(site, ControlConfig(period_s=15), Prices(energy_price_per_kwh=0.15))
    decision = controller.step(state.snapshot(), now_s, estimator.estimates())
    apply_to_plant(decision, plant)                   # agent.loop

What a step does:

1. **Context** (:meth:`Controller.context`): site time; *blind* racks, whose telemetry is stale or
   frozen as a whole, and racks with one card's sensor stuck (both at fail-safe caps, held
   ``failsafe_hold_s`` after they recover; only blind racks also slow their jobs and take no
   placements, a stuck card's rack loses just that card); the set-point in force, ambient,
   each rack's measured supply; every card's die-to-inlet resistance (``agent.calibration``: the
   estimator's where it is confident, the journal's after a restart, else the spec); every card's
   measured die offset (``agent.offsets.DieOffsetFilter``: the twin's persistent error from settled
   readings, no transients; computed once here and used by both the planner and the guard); per
   rack, power the twin does not explain (``agent.unexplained_power``), subtracted from the cap: the
   PDU's power above what the cards report and the spec's host overhead (smoothed), plus what the
   cards of computing jobs draw above the twin's power model for their work at the settings in force
   (``agent.load.model_gap_w``: a job whose work is not what the agent believes; per card, taken
   once two readings in a row show it, let go as slowly as the PDU's part, kept while the job holds
   the card).
   A decision says so when a rack draws more than the margin above the twin's prediction.
2. **Placement** of queued jobs (``agent.placing``: ``models.placement.place_jobs`` with EASY
   backfilling) onto free, healthy cards the agent sees (not on blind racks, not a card with a stuck
   sensor, not one a ``card_failed`` refusal says failed before a reading confirms it:
   ``StepContext.refused_failed_cards``, counted alive everywhere else); placed jobs are budgeted
   from this step on and not placed twice.
3. **Plan** (``agent.planning``; ``models.solve.CyclePlanner``: DVFS + low-power idle + set-point
   MILP with the greedy fallback). Jobs that compute get the level the MILP gives them (top clocks where the caps allow;
   at full load the jobs with the least value per watt slow down first). Jobs that do not compute
   now (communication stall, checkpoint, waiting) and jobs touching a blind rack are *pinned*:
   they are handed to the MILP as computing jobs of no value, so they get their cheapest (slowest)
   level (for a job with an SLO, the slowest that meets it, so that it meets it the moment it
   resumes; a blind rack's jobs get the slowest), and their power is budgeted as if they
   resumed computing at any moment (with the opt-in ``resume_lag_s`` a pinned job keeps part of
   its value, :func:`pinned_value_frac`, so it slows only once that pays). Idle cards beyond
   ``idle_reserve_cards`` per supernode go to low-power idle; each rack keeps as many awake as the
   plan counts there (its rack power budgets them), the ones awake now first (the awake ones stay
   the same cards from step to step while the plan keeps them on their racks). The set-point is
   re-optimized every ``setpoint_interval_s`` among the options within ``max_setpoint_step_k`` of
   the current one. A late, failed or infeasible solve falls back to
   the greedy plan; a problem no plan can meet is relaxed rack by rack (the guard then caps those
   racks, their idle cards asleep and no ready reserve) so that one bad rack never drags the whole
   site to its slowest levels.
4. **Pumps** (:meth:`Controller.with_pump_speeds`, ``agent.pumps``): each rack loop's pump as slow
   as the twin says the plan's dies, the rack's cap and the loop's rise allow (the plan itself is
   made with every pump at full speed).
5. **Guard** (``agent.guard.Guard.review``): caps, dies, rate limits, fail-safe, pumps (see there).
   Then **hosts** (:meth:`Controller.with_hosts`, ``agent.hosts``; sites whose spec lets hosts be
   powered off): hosts idle for ``host_off_after_s`` are powered off, a reserve of idle hosts per
   supernode stays on. Powering a host off only lowers power, so it needs no review by the guard;
   the plan and the guard budget every host as on (conservative).
6. **Commit** (:meth:`Controller.commit`): what the next step must remember (pending placements,
   the last set-point evaluation, fail-safe hold, the plan for warm starts, each job's level the
   last time it computed).

Decisions taken at once on job events (a job starts, ends, is requeued or resumes computing) use
:meth:`Controller.propose_incremental` instead of step 3: the last plan adjusted without a solve (a
few milliseconds), the guard doing the rest; the next periodic decision re-optimizes.

:meth:`Controller.step` does 1-6. The service calls the pieces itself so that the solve runs in a
worker thread under a deadline while the pumps and the guard run on the event loop:
``ctx = context(...)``, ``proposal = propose(snap, ctx)`` (thread) or ``propose(snap, ctx,
use_solver=False)`` (the greedy fallback when the thread is late), ``decision = review(proposal,
snap, ctx)`` (steps 4-5), ``commit(decision, snap, ctx)``.

This module runs the steps in order and keeps what a step must remember of the last (holds, the
set-point, the last decision and plan, each job's level); the pieces with small interfaces live in
their own modules: ``agent.calibration`` (each card's resistance), ``agent.unexplained_power`` (the
rack power the twin does not explain), ``agent.placing`` (placement, the orders in flight and the
reservation), ``agent.planning`` (the models' problem, its plan and its relaxation), ``agent.hosts``
(which hosts go off, and the hosts' times), ``agent.load``, ``agent.offsets``, ``agent.pumps``,
``agent.guard`` and ``agent.backfill``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.calibration import Calibration
from agent.config import ControlConfig, LoadedConfig
from agent.decision import Decision, PlacementOrder, QueueWait, StepContext
from agent.guard import Guard, rack_measured_caps_w
from agent.hosts import HostTimes, choose_hosts_off, host_any
from agent.load import SiteLoad, SiteLoads, finite_or
from agent.offsets import DieOffsetFilter
from agent.open_commands import LEVEL, LIMIT, SLEEP
from agent.placing import PlacementBook, cards_due, orders_seen_until, place_queued
from agent.planning import checkpoint_ends_soon, checkpoint_wake_s, cycle_problem, pinned_value_frac, plan_cycle
from agent.pumps import choose_pump_speeds, full_speed_flow_lpm, r_at_speed
from agent.unexplained_power import UnexplainedPower
from models.plans import CyclePlan
from models.problem import CycleProblem, Margins, Prices, ProblemError
from models.solve import CyclePlanner
from twin.estimate import Estimates, EstimatorConfig
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import JobInfo, StateSnapshot
from twin.workload import Phase, relative_throughput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["Controller", "decides_again_on", "pinned_value_frac", "prices_from_config"]

#: A pump that gives less than (1 - this) of its nominal flow at full speed stays at full speed:
#: the estimator calls such a pump weak.
_WEAK_PUMP_FRAC = EstimatorConfig().pump_threshold_frac
#: A rack where a measured die reached the die limit (slowdown - margin) keeps its pump at full speed
#: this long (site s): the twin under-predicted that die, and its offset may take minutes to measure
#: (it is only taken from settled readings); ten minutes spans several checkpoint cycles.
_PUMP_LATCH_S = 600.0


def prices_from_config(loaded: LoadedConfig) -> Prices:
    p = loaded.config.prices
    return Prices(
        card_hour_value=p.card_hour_value,
        energy_price_per_kwh=p.energy_per_kwh,
        pue_penalty_per_kwh=p.pue_penalty_per_kwh,
    )


def decides_again_on(ev: JobEvent, placing: bool = True) -> bool:
    """Whether a job event calls for a decision at once (the service and the in-process loop alike):
    a job starts, ends, is requeued or resumes computing, or (when the agent places jobs,
    ``placing``) is submitted."""
    return (
        ev.kind in ("started", "finished", "failed", "requeued")
        or (ev.kind == "phase" and ev.phase == Phase.COMPUTE)
        or (placing and ev.kind == "submitted")
    )


def _cards_of(mask: BoolArray | None) -> tuple[int, ...]:
    """The cards a per-card mask sets (none for no mask)."""
    return () if mask is None else tuple(int(c) for c in np.flatnonzero(np.asarray(mask)))


def _first_per_rack(mask: BoolArray, card_rack: IntArray, per_rack: IntArray) -> IntArray:
    """The cards ``mask`` sets, at most the first ``per_rack[r]`` (in card order) of each rack ``r``."""
    cards = np.flatnonzero(mask)
    racks = card_rack[cards]
    order = np.argsort(racks, kind="stable")  # by rack, in card order inside each
    by_rack = racks[order]
    rank = np.arange(cards.size) - np.searchsorted(by_rack, by_rack, side="left")
    return np.sort(cards[order][rank < per_rack[by_rack]])


class Controller:
    """Turns snapshots into decisions (see the module docstring).

    ``planner`` defaults to a persistent :class:`models.solve.CyclePlanner` kept for the controller's
    lifetime. :meth:`propose` with the solver must not run twice at once (the service keeps at most
    one solve in flight); everything else is cheap and runs on the caller's thread.
    """

    def __init__(
        self,
        site: SiteSpec,
        control: ControlConfig | None = None,
        prices: Prices | None = None,
        *,
        planner: CyclePlanner | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.site = site
        self.control = control if control is not None else ControlConfig()
        self.prices = prices if prices is not None else Prices()
        self.margins = Margins(rack_margin_w=self.control.rack_margin_w, die_margin_k=self.control.die_margin_k)
        self.planner = planner if planner is not None else CyclePlanner()
        if guard is None:
            guard = Guard(site, self.control, card_hour_value=self.prices.card_hour_value)
        self.guard = guard
        n_r = site.n_racks
        self._card_rack = site.card_rack()
        self._calibration = Calibration(site)  # die-to-inlet resistances: estimator, journal, spec
        self._cycle = 0
        self._prev_plan: CyclePlan | None = None
        self._last_setpoint_eval_s = -math.inf
        self._latest_now_s = -math.inf  # the site time of the latest step (a later one before it: the clock went back)
        self._setpoint_c = site.facility.supply_temp_c
        self._blind_until = np.full(n_r, -math.inf)  # fail-safe hold of racks stale or stuck as a whole
        self._capped_until = np.full(n_r, -math.inf)  # fail-safe hold of racks with a stuck card
        self._pump_latch_until = np.full(n_r, -math.inf)  # racks whose pump stays at full speed (a die hit its limit)
        self._unexplained = UnexplainedPower(site)  # per rack, power the twin does not explain
        self._placements = PlacementBook()  # placements in flight, the reservation, running jobs' starts
        self._solving = threading.Lock()
        self._last: Decision | None = None
        self._computing_level: dict[str, int] = {}  # each job's level the last time it computed
        self.offsets = DieOffsetFilter(site)  # measured die offsets, updated once per step (context)
        self._hosts = HostTimes(site)  # per host: last time a card was busy, when a boot ends

    @classmethod
    def from_config(cls, loaded: LoadedConfig, *, planner: CyclePlanner | None = None) -> Controller:
        return cls(loaded.site, loaded.config.control, prices_from_config(loaded), planner=planner)

    # ================================================================================================
    # the whole step
    # ================================================================================================
    def step(
        self,
        snap: StateSnapshot,
        now_s: float | None = None,
        estimates: Estimates | None = None,
        *,
        use_solver: bool = True,
        incremental: bool = False,
        refused_failed: BoolArray | None = None,
    ) -> Decision:
        """Context, proposal, guard, commit: the decision to apply (see the module docstring).
        ``incremental=True``: the fast adjustment of the last plan made on job events
        (:meth:`propose_incremental`). ``refused_failed``: per card, a ``card_failed`` refusal says it
        failed and no reading has confirmed it (``agent.command_overlays.Overlays.unplaceable``): no
        job is placed on it, everything else sees it as its readings say (:meth:`context`)."""
        ctx = self.context(snap, now_s, estimates, refused_failed=refused_failed)
        if incremental:
            proposal = self.propose_incremental(snap, ctx)
        else:
            proposal = self.propose(snap, ctx, use_solver=use_solver)
        decision = self.review(proposal, snap, ctx)
        self.commit(decision, snap, ctx)
        return decision

    # ================================================================================================
    # 1. context
    # ================================================================================================
    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s`` (``agent.clock.SiteClock``; :meth:`context` calls it
        when a step's time falls more than a period before the latest one): holds and times kept
        on the old timeline are brought onto the new one, at most as long as they can last from now
        (else a rack would stay at fail-safe caps, a pump latched or a host booting until the new
        clock reached the old times: ~800 site s after a simulator restarted 760 s back; a placement
        in flight held its job and cards as long)."""
        cfg = self.control
        np.minimum(self._blind_until, now_s + cfg.failsafe_hold_s, out=self._blind_until)
        np.minimum(self._capped_until, now_s + cfg.failsafe_hold_s, out=self._capped_until)
        np.minimum(self._pump_latch_until, now_s + _PUMP_LATCH_S, out=self._pump_latch_until)
        self._hosts.clock_went_back(now_s)
        self._last_setpoint_eval_s = min(self._last_setpoint_eval_s, now_s)
        self._unexplained.clock_went_back()  # readings on the new timeline are new
        # running jobs' starts; a placement in flight lasts at most its order's time to live from now
        self._placements.clock_went_back(now_s, cfg.command_ttl_s)
        self.guard.clock_went_back(now_s)
        self.offsets.clock_went_back(now_s)

    def context(
        self,
        snap: StateSnapshot,
        now_s: float | None = None,
        estimates: Estimates | None = None,
        *,
        time_limit_s: float | None = None,
        refused_failed: BoolArray | None = None,
        held_back: BoolArray | None = None,
    ) -> StepContext:
        """Everything the step needs besides the snapshot (see the module docstring).
        ``refused_failed``: per card, a ``card_failed`` refusal (of a card setting or a placement) says
        it failed and no reading of it since confirms or clears it, or a repeat's hold holds it out
        (``agent.command_overlays.Overlays.unplaceable``): ``StepContext.refused_failed_cards``, kept
        out of placement (a job requeued by a card's failure asks for a decision at once, before
        the rack's telemetry shows it; a scheduler whose view of a card is stale refuses every
        placement onto it), and so out of the ready reserve (``agent.planning.cycle_problem``: an idle
        card no job can take is no reserve) and out of the cards a free host holds for the hosts'
        reserve and out of the awake cards that have a host kept on first (:meth:`with_hosts`). The
        guard's budget, the levels, low-power idle and the hosts' power see such a card as its
        readings say: one a stale scheduler calls failed while its rack reads it alive draws its
        power, and an idle one keeps the low-power state in force (no command reaches it:
        ``agent.command_diff``; the guard's step 3a). ``held_back``: per kind of card setting
        (``agent.open_commands``: LEVEL, SLEEP, LIMIT, HOST rows) and card, a refusal holds that setting
        back (``agent.command_overlays.Overlays.held_back``): ``StepContext.held_level_cards``,
        ``held_limit_cards`` and ``held_sleep_cards``, which the guard keeps as in force (as the cards
        report them, or as their racks confirmed: :meth:`with_refusals`)."""
        site, cfg = self.site, self.control
        now = finite_or(now_s, finite_or(snap.time_s, 0.0))
        if now < self._latest_now_s - cfg.period_s:  # the site's clock went back (agent.clock)
            self.clock_went_back(now)
        self._latest_now_s = now
        if estimates is not None:
            self.update_calibration(estimates)
        last = np.asarray(snap.rack_last_seen_s, dtype=np.float64)
        stale = np.flatnonzero(~(last >= now - cfg.telemetry_deadline_s))
        stuck = set(int(r) for r in snap.stuck_racks)
        stuck_cards = tuple(sorted(int(c) for c in snap.stuck_cards))
        blind = set(int(r) for r in stale) | stuck | set(int(r) for r in np.flatnonzero(self._blind_until > now))
        capped = {int(self._card_rack[c]) for c in stuck_cards} | set(
            int(r) for r in np.flatnonzero(self._capped_until > now)
        )
        fac = snap.facility
        # the facility's set-point as it reports it, while that report is fresh; a silent facility
        # keeps the last one decided (its stale report would undo a change not yet acknowledged),
        # and the set-point is not re-optimized on stale weather
        fac_fresh = fac is not None and fac.time_s >= now - cfg.telemetry_deadline_s
        setpoint = finite_or(fac.supply_setpoint_c if fac is not None and fac_fresh else None, self._setpoint_c)
        ambient = finite_or(fac.ambient_temp_c if fac is not None else None, site.facility.ambient_temp_c)
        supply = np.asarray(snap.rack_supply_temp_c, dtype=np.float64)
        supply = np.where(np.isfinite(supply), supply, setpoint)
        choose = cfg.control_setpoint and fac_fresh and now - self._last_setpoint_eval_s >= cfg.setpoint_interval_s
        limit = cfg.solve_deadline_s if time_limit_s is None else min(cfg.solve_deadline_s, time_limit_s)
        inlet = supply[self._card_rack]
        # resistances: calibrated at nominal flow; the planner sees the pump at full speed (the flow it
        # gives now: a weak pump counts), the die offsets the speed the pump runs at now
        speed_now = np.asarray(snap.rack_pump_speed_frac, dtype=np.float64)
        reported = snap.rack_pump_speed_reported
        last_speed = None if self._last is None else self._last.rack_pump_speed_frac
        if reported is not None and last_speed is not None and not np.all(reported):
            # a CDU that does not report its pump's speed runs it at the speed last commanded (read as
            # the last reported one, a slowed pump would look weak and be sped up and slowed again)
            speed_now = np.where(reported, speed_now, np.asarray(last_speed, dtype=np.float64))
        flow_full = full_speed_flow_lpm(site, np.asarray(snap.rack_flow_lpm, dtype=np.float64), speed_now)
        nominal = np.full(site.n_racks, site.loop_flow_per_rack_lpm())
        r_nominal = self.r_total_k_per_w()
        r_total = r_at_speed(site, r_nominal, nominal, flow_full / nominal)
        r_now = r_at_speed(site, r_total, flow_full, np.clip(speed_now, 0.05, 1.0))
        # die readings that are no observations: frozen (a stuck card, a rack frozen as a whole) or stale
        card_seen = np.asarray(snap.card_last_seen_s, dtype=np.float64) >= now - cfg.telemetry_deadline_s
        card_seen &= ~np.isin(self._card_rack, np.asarray(sorted(stuck), dtype=np.int64))
        card_seen[list(stuck_cards)] = False
        die = np.where(card_seen, np.asarray(snap.card_die_temp_c, dtype=np.float64), np.nan)
        # a rack whose hottest measured die reached the die limit keeps its pump at full speed for a while:
        # the twin under-predicted it (a fouled plate not yet calibrated, an offset not yet measured)
        hottest = np.full(site.n_racks, -np.inf)
        np.maximum.at(hottest, self._card_rack, np.where(np.isfinite(die), die, -np.inf))
        hot = hottest >= site.card.slowdown_temp_c - cfg.die_margin_k
        self._pump_latch_until[hot] = now + _PUMP_LATCH_S
        # once per step, for the planner and the guard alike (persistent model error, no transients); a
        # card whose die is no observation keeps the offset it had (a frozen or stale die read against the
        # slowest level of a fail-safe rack would be a large offset that outlived the fault by minutes)
        seen = snap if card_seen.all() else dataclasses.replace(snap, card_die_temp_c=die)
        loads = SiteLoads(site, snap)
        load = loads.of(snap)
        offsets = self.offsets.update(seen, load, inlet, r_nominal, now, r_scale=r_now / r_nominal)
        failsafe = blind | capped
        self._unexplained.update_cards(snap, load, card_seen, failsafe)
        ctx = StepContext(
            now_s=now,
            cycle=self._cycle,
            stale_racks=tuple(int(r) for r in stale),
            stuck_racks=tuple(sorted(stuck)),
            stuck_cards=stuck_cards,
            blind_racks=tuple(sorted(blind)),
            failsafe_racks=tuple(sorted(failsafe)),
            setpoint_c=setpoint,
            ambient_c=min(max(ambient, -60.0), 60.0),
            card_inlet_c=inlet,
            r_total_k_per_w=r_total,
            die_offset_k=offsets,
            rack_flow_full_lpm=flow_full,
            rack_pump_speed_frac=speed_now,
            rack_extra_w=self._unexplained.budget_w(),
            choose_setpoint=choose,
            solver_time_limit_s=max(limit, 0.005),
            loads=loads,
        )
        return self.with_refusals(ctx, refused_failed=refused_failed, held_back=held_back)

    @staticmethod
    def with_refusals(
        ctx: StepContext,
        *,
        refused_failed: BoolArray | None = None,
        held_back: BoolArray | None = None,
        applied_level: IntArray | None = None,
        applied_power_limit_w: FloatArray | None = None,
        applied_low_power: FloatArray | None = None,
    ) -> StepContext:
        """``ctx`` with the refusals in force (``refused_failed``, ``held_back``: as :meth:`context`
        takes them) and what the racks confirmed applying (``applied_level``, ``applied_power_limit_w``,
        ``applied_low_power``: ``agent.ingest.Ingest``'s, copied; None: nothing confirmed) in place of those
        it had. The service reads them again after the proposal, before the guard reviews it: a refusal
        acked while the solve ran (the ack path runs meanwhile on the event loop) keeps its settings out of
        that decision's commands, so the guard must see it too (its budget is what the cards will draw; a
        placement onto a card refused as failed meanwhile is dropped), and the guard keeps a card no
        command reaches at the faster level and the higher limit of what it reports and what its rack
        confirmed, and an idle one awake where either says awake (``agent.guard``, step 3a; the level the
        commands' diff counts from)."""
        return dataclasses.replace(
            ctx,
            refused_failed_cards=_cards_of(refused_failed),
            held_level_cards=_cards_of(None if held_back is None else held_back[LEVEL]),
            held_limit_cards=_cards_of(None if held_back is None else held_back[LIMIT]),
            held_sleep_cards=_cards_of(None if held_back is None else held_back[SLEEP]),
            applied_level=None if applied_level is None else np.array(applied_level, dtype=np.int64),
            applied_power_limit_w=(
                None if applied_power_limit_w is None else np.array(applied_power_limit_w, dtype=np.float64)
            ),
            applied_low_power=None if applied_low_power is None else np.array(applied_low_power, dtype=np.float64),
        )

    # ---- calibration ------------------------------------------------------------------------------
    def update_calibration(self, est: Estimates) -> None:
        """Take the estimator's die-to-inlet resistances where it is confident (``agent.calibration``)."""
        self._calibration.update(est)

    def load_calibration(self, cards: IntArray, r_th_k_per_w: FloatArray, leak_scale: FloatArray) -> None:
        """Calibration from the journal (a restarted agent), used until the estimator is confident."""
        self._calibration.load(cards, r_th_k_per_w, leak_scale)

    def calibration(self) -> tuple[IntArray, FloatArray, FloatArray]:
        """(cards, die-to-inlet resistance, leakage scale) of the calibrated cards, for the journal."""
        return self._calibration.calibrated()

    def r_total_k_per_w(self) -> FloatArray:
        """Per card at nominal flow: the estimator's resistance, else the journal's, else the spec's (clipped)."""
        return self._calibration.r_total_k_per_w()

    # ---- pumps and the guard ----------------------------------------------------------------------
    def review(self, proposal: Decision, snap: StateSnapshot, ctx: StepContext) -> Decision:
        """Steps 4-5: the proposal's pump speeds (:meth:`with_pump_speeds`), the guard, then the hosts
        (:meth:`with_hosts`). The guard counts the cards of the placements in flight (sent by earlier
        decisions, their jobs not yet seen started) busy, as the proposal did: without them it took
        those cards for idle ones, budgeted them asleep and, where telemetry still read them asleep
        within ``low_power_hold_s``, sent them back to low-power idle (the rack refused: busy)."""
        in_flight = self._placements.in_flight(ctx, snap)
        reviewed = self.guard.review(self.with_pump_speeds(proposal, snap, ctx), snap, ctx, in_flight=in_flight)
        return self.with_hosts(reviewed, snap, ctx)

    def with_hosts(self, d: Decision, snap: StateSnapshot, ctx: StepContext) -> Decision:
        """``d`` with the hosts to have off (``agent.hosts``) and their cards in low-power idle.
        Unchanged where the site's hosts cannot be powered off or host control is off."""
        site, cfg = self.site, self.control
        if not (cfg.control_host_power and site.hosts_managed):
            return d
        now = ctx.now_s
        # busy: the decision's, plus the placements sent and not expired (the proposal counted those in
        # flight already: the service commits each decision before the next one's context is taken, and a
        # late solve's proposal is dropped; the union covers a caller that reviews a proposal after
        # committing another decision)
        card_busy = np.asarray(d.card_busy, dtype=bool).copy()
        for cards in self._placements.pending_now(orders_seen_until(ctx, snap)).values():
            card_busy[list(cards)] = True
        busy = host_any(site, card_busy)
        last = np.where(np.isnan(self._hosts.busy_last_s), now, self._hosts.busy_last_s)
        last = np.where(busy, now, last)
        # a card a card_failed refusal keeps out of placement holds no job either: no reserve, neither
        # of the hosts' cards nor of the ready reserve's awake ones (it may read awake: no command
        # reaches it, the guard's step 3a), as a failed one
        failed = d.card_failed | ctx.unplaceable_card_mask(self._card_rack)
        choice = choose_hosts_off(
            site,
            now_s=now,
            host_busy_last_s=last,
            card_busy=card_busy,
            host_off_now=host_any(site, snap.card_host_off),
            host_awake=host_any(site, ~d.card_low_power & ~d.card_busy & ~failed),
            frozen_host=host_any(site, ctx.unseen_card_mask(self._card_rack)),
            off_after_s=cfg.host_idle_off_s(site),
            reserve_per_supernode=cfg.host_reserve_per_supernode,
            due_cards=cards_due(site, snap, ctx, self._placements, d.placements, cfg.host_boot_lead_s, d.queue_waits),
            card_failed=failed,
        )
        low = d.card_low_power | np.repeat(choice.host_off, site.cards_per_host)
        notes = d.explanation
        if choice.powering_off.any() or choice.powering_on.any():
            notes = (*notes, choice.note())
        return d.replace(host_off=choice.host_off, card_low_power=low, explanation=notes)

    def with_pump_speeds(self, d: Decision, snap: StateSnapshot, ctx: StepContext) -> Decision:
        """``d`` with each rack's pump speed (``agent.pumps``) for its levels, sleeping cards and
        placements: the slowest pump the twin says keeps dies, caps and the loop's rise in bounds.
        Racks at fail-safe caps, whose pump gives less than (1 - the estimator's weak-pump
        threshold) of its nominal flow at full speed, or where a measured die reached the die
        limit within ``_PUMP_LATCH_S`` get full speed. Unchanged without pump control."""
        site, cfg = self.site, self.control
        if not cfg.control_pump_speed or site.min_pump_speed_frac() >= 1.0:
            return d
        load = ctx.load_of(site, snap, self._placements.pending_with(ctx, snap, d.placements))
        full = np.zeros(site.n_racks, dtype=bool)
        full[list(ctx.failsafe_racks)] = True
        full |= ctx.rack_flow_full_lpm < (1.0 - _WEAK_PUMP_FRAC) * site.loop_flow_per_rack_lpm()
        full |= self._pump_latch_until > ctx.now_s
        choice = choose_pump_speeds(
            site,
            load,
            d.card_level,
            d.card_low_power,
            d.card_power_limit_w,
            np.maximum(ctx.card_inlet_c, d.supply_temp_c if math.isfinite(d.supply_temp_c) else ctx.setpoint_c),
            ctx.r_total_k_per_w,
            ctx.die_offset_k,
            ctx.rack_flow_full_lpm,
            ctx.rack_pump_speed_frac,
            rack_measured_caps_w(site, cfg),  # the prediction counts the extra itself
            ctx.rack_extra_w,
            site.card.slowdown_temp_c - cfg.die_margin_k,
            facility_w_per_it_w=1.0 + site.facility.ups_loss_fraction,
            steps=cfg.pump_speed_steps,
            full_speed_racks=full,
        )
        note = f"pumps at {', '.join(f'{100 * x:.0f}' for x in choice.speed_frac)}% (saves ~{choice.saved_w:,.0f} W)"
        return d.replace(rack_pump_speed_frac=choice.speed_frac, explanation=(*d.explanation, note))

    # ================================================================================================
    # 2-3. proposal
    # ================================================================================================
    def propose(self, snap: StateSnapshot, ctx: StepContext, *, use_solver: bool = True) -> Decision:
        """The models' decision for this step, before the guard (see the module docstring)."""
        if use_solver:
            with self._solving:
                return self._propose(snap, ctx, use_solver=True)
        return self._propose(snap, ctx, use_solver=False)

    def _propose(self, snap: StateSnapshot, ctx: StepContext, *, use_solver: bool) -> Decision:
        t0 = time.perf_counter()
        site, cfg = self.site, self.control
        pending = self._placements.in_flight(ctx, snap)
        load = ctx.load_of(site, snap, pending)
        notes: list[str] = self._unexplained.notes(cfg.rack_margin_w)
        waits: dict[str, QueueWait] = {}
        orders: list[PlacementOrder] = []
        pending_ids = {jid for jid, _ in pending}
        to_place = [q for q in snap.queue if q.job_id not in pending_ids]
        if cfg.control_placement and to_place:
            orders = self._place(load, snap, ctx, to_place, notes, waits)
            if orders:
                load = ctx.load_of(site, snap, [*pending, *((o.job_id, o.cards) for o in orders)])
        try:
            p = self._problem(load, snap, ctx)
            plan, planned = plan_cycle(
                p,
                ctx,
                notes,
                planner=self.planner,
                previous_plan=self._prev_plan,
                mip_rel_gap=cfg.mip_rel_gap,
                use_solver=use_solver,
                rack_names=site.rack_names,
            )
        except ProblemError as exc:
            notes.append(f"no plan ({exc}): current settings held")
            return self._hold(snap, ctx, load, orders, notes, time.perf_counter() - t0).replace(queue_waits=waits)
        decision = self._decision(plan, planned, snap, ctx, load, orders, notes, time.perf_counter() - t0)
        return decision.replace(queue_waits=waits)

    def checkpoint_wake_s(self, jobs: Iterable[JobInfo], after_s: float) -> float:
        """When the next decision is due for a checkpoint's end (``control.checkpoint_end_lead_s``;
        :func:`agent.planning.checkpoint_wake_s`), after the last decision at ``after_s``; inf: none."""
        return checkpoint_wake_s(jobs, after_s, self.control.checkpoint_end_lead_s)

    def propose_incremental(self, snap: StateSnapshot, ctx: StepContext) -> Decision:
        """The last decision adjusted to job events, without a solve (a few ms; for decisions taken
        at once when a job starts, ends or changes phase): every job that computes gets the level
        it had the last time it computed (a new job: the top level), and so does a job that stopped
        computing since the last plan (``resume_lag_s``: it keeps its clock for now); a job pinned
        at the last plan keeps that plan's level (with ``resume_lag_s = 0`` every pinned job gets its
        slowest level meeting its SLO); idle cards keep their state and freed cards sleep, queued jobs are
        placed greedily; the set-point stays. The guard then slows the jobs of least value per
        watt where a cap needs it. The next periodic decision re-optimizes everything."""
        prev = self._last
        if prev is None or prev.n_cards != self.site.n_cards:
            return self.propose(snap, ctx, use_solver=False)
        t0 = time.perf_counter()
        site, cfg = self.site, self.control
        slowest = site.card.n_levels - 1
        blind_card = ctx.blind_card_mask(self._card_rack)
        pending = self._placements.in_flight(ctx, snap)
        load = ctx.load_of(site, snap, pending)
        notes: list[str] = [
            "incremental: the last plan adjusted to job events",
            *self._unexplained.notes(cfg.rack_margin_w),
        ]
        waits: dict[str, QueueWait] = {}
        orders: list[PlacementOrder] = []
        pending_ids = {jid for jid, _ in pending}
        to_place = [q for q in snap.queue if q.job_id not in pending_ids]
        if cfg.control_placement and to_place:
            orders = self._place(load, snap, ctx, to_place, notes, waits, method="greedy")
            if orders:
                load = ctx.load_of(site, snap, [*pending, *((o.job_id, o.cards) for o in orders)])
        level = np.full(site.n_cards, slowest, dtype=np.int64)
        clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
        since = {info.job_id: info.last_event_s for info in snap.jobs}
        for j in load.jobs:
            if bool(blind_card[j.cards].any()):
                continue
            j_since = since.get(j.job_id, ctx.now_s)
            if (
                j.computing
                or (cfg.resume_lag_s > 0.0 and j_since > prev.time_s)
                or checkpoint_ends_soon(j.phase, j.spec, j_since, ctx.now_s, cfg.checkpoint_end_lead_s)
            ):
                # computing, stopped since the last plan (valued as computing: see pinned_value_frac),
                # or at the end of a checkpoint
                level[j.cards] = self._computing_level.get(j.job_id, 0)
            elif cfg.resume_lag_s > 0.0 and prev.card_busy[j.cards].all():
                level[j.cards] = prev.card_level[j.cards]  # pinned at the last plan: its level there
            else:
                rel = relative_throughput(j.spec.compute_share, clocks / clocks[0])
                meets = np.flatnonzero(rel >= j.spec.min_throughput_frac - 1e-12)
                level[j.cards] = int(meets.max()) if meets.size else 0
        snap_lp = np.asarray(snap.card_low_power, dtype=bool)
        was_idle = ~prev.card_busy & ~prev.card_failed
        low = np.where(was_idle, prev.card_low_power, True)  # idle cards keep their state, freed ones sleep
        low = np.where(ctx.unplaceable_card_mask(self._card_rack), snap_lp, low) & ~load.busy  # as _decision
        return self._unpredicted_decision(
            ctx,
            card_level=level,
            card_low_power=low,
            card_power_limit_w=np.full(site.n_cards, site.card.power_limit_w),
            card_failed=np.asarray(snap.card_failed, dtype=bool),
            card_busy=load.busy,
            supply_temp_c=prev.supply_temp_c,
            placements=tuple(orders),
            status="incremental",
            plan_status=prev.plan_status,
            source="incremental",
            solve_time_s=time.perf_counter() - t0,
            explanation=tuple(notes),
            queue_waits=waits,
        )

    def _unpredicted_decision(self, ctx: StepContext, **settings: Any) -> Decision:
        """A decision made without the twin's predictions (an incremental adjustment or a hold): the
        prediction fields are NaN until the guard fills them; ``settings`` are the remaining fields."""
        site = self.site
        nan_r = np.full(site.n_racks, np.nan)
        return Decision(
            cycle=ctx.cycle,
            time_s=ctx.now_s,
            failsafe_racks=ctx.failsafe_racks,
            rack_cap_w=rack_measured_caps_w(site, self.control),
            predicted_rack_power_w=nan_r,
            budget_rack_power_w=nan_r.copy(),
            predicted_rack_max_die_c=nan_r.copy(),
            predicted_it_power_w=math.nan,
            predicted_facility_power_w=math.nan,
            predicted_pue=math.nan,
            max_power_limit_w=site.card.power_limit_w,
            **settings,
        )

    def _problem(self, load: SiteLoad, snap: StateSnapshot, ctx: StepContext) -> CycleProblem:
        """The models' problem for ``load`` in this step (``agent.planning.cycle_problem``)."""
        return cycle_problem(self.site, self.control, load, snap, ctx, margins=self.margins, prices=self.prices)

    def _place(
        self,
        load: SiteLoad,
        snap: StateSnapshot,
        ctx: StepContext,
        queue: Sequence[JobInfo],
        notes: list[str],
        waits: dict[str, QueueWait],
        method: str | None = None,
    ) -> list[PlacementOrder]:
        """Orders for the queued jobs that go now (``agent.placing.place_queued``); ``waits`` gets why
        each of the others stays queued."""
        return place_queued(
            queue,
            load,
            snap,
            ctx,
            notes,
            waits,
            site=self.site,
            cfg=self.control,
            book=self._placements,
            problem_of=lambda on: self._problem(on, snap, ctx),
            card_wait_s=self._hosts.card_wait_s(snap.card_host_off, ctx.now_s),
            method=method,
        )

    # ---- turning a plan into a decision ---------------------------------------------------------
    def _decision(
        self,
        plan: CyclePlan,
        p: CycleProblem,
        snap: StateSnapshot,
        ctx: StepContext,
        load: SiteLoad,
        orders: list[PlacementOrder],
        notes: list[str],
        elapsed_s: float,
    ) -> Decision:
        site = self.site
        dv = plan.dvfs
        n = site.n_cards
        slowest = site.card.n_levels - 1
        snap_lp = np.asarray(snap.card_low_power, dtype=bool)
        if dv is None:  # pragma: no cover - plans always carry a DVFS plan
            return self._hold(snap, ctx, load, orders, notes, elapsed_s)
        level = np.asarray(dv.card_level, dtype=np.int64).copy()
        # idle cards at the slowest level: the plan's card levels already say so (models.plans.assess_dvfs
        # gives every card without a job the slowest level, and the plan's problem has this step's load),
        # so this only keeps it true should a plan ever say otherwise (a mutation that drops it lives)
        level[load.idle] = slowest
        # which idle cards stay awake: in each rack as many as the plan says there (its rack power counts
        # them: more on a rack with little room puts the rack over its cap, and the guard slows its jobs
        # or puts them all to sleep), the ones awake now first (no card woken needlessly), then cards on
        # the hosts that stay on (``agent.hosts`` keeps the hosts holding awake cards on first): hosts
        # with a busy card, then the most recently used
        idle_model = p.idle_mask()
        budget = np.asarray(dv.rack_awake, dtype=np.int64)
        low = np.ones(n, dtype=bool)
        low[load.busy] = False
        low[_first_per_rack(idle_model & ~snap_lp, self._card_rack, budget)] = False
        left = budget - np.bincount(self._card_rack[idle_model & ~low], minlength=site.n_racks)
        card_host = site.card_host()
        host_busy = host_any(site, load.busy)[card_host]
        host_used_s = np.nan_to_num(self._hosts.busy_last_s, nan=ctx.now_s)[card_host]
        for r in np.flatnonzero(left > 0):
            cand = np.flatnonzero(idle_model & low & (self._card_rack == r))  # idle_model: not on an off host
            cand = cand[np.lexsort((-host_used_s[cand], ~host_busy[cand]))][: int(left[r])]
            low[cand] = False
        # idle cards no command reaches keep the state they report: those the agent cannot see, and
        # those a card_failed refusal keeps out of placement (agent.command_diff leaves them out)
        low = np.where(ctx.unplaceable_card_mask(self._card_rack) & load.idle, snap_lp, low)
        status = plan.status.value if plan.status.value in ("optimal", "feasible", "infeasible") else "fallback"
        lines = [
            f"plan {plan.status.value} ({plan.source}) in {plan.solve_time_s:.3f} s "
            f"at supply {plan.supply_temp_c:g} deg C"
        ]
        return Decision(
            cycle=ctx.cycle,
            time_s=ctx.now_s,
            card_level=level,
            card_low_power=low,
            card_power_limit_w=np.full(n, site.card.power_limit_w),
            card_failed=np.asarray(snap.card_failed, dtype=bool),
            card_busy=load.busy,
            supply_temp_c=float(plan.supply_temp_c),
            placements=tuple(orders),
            status=status,
            plan_status=plan.status.value,
            source=plan.source,
            solve_time_s=elapsed_s,
            failsafe_racks=ctx.failsafe_racks,
            rack_cap_w=rack_measured_caps_w(site, self.control),
            predicted_rack_power_w=dv.rack_power_w + ctx.rack_extra_w,
            budget_rack_power_w=dv.rack_power_w + ctx.rack_extra_w,
            predicted_rack_max_die_c=dv.rack_max_die_temp_c.copy(),
            predicted_it_power_w=dv.it_power_w,
            predicted_facility_power_w=dv.facility_power_w,
            predicted_pue=dv.pue,
            max_power_limit_w=site.card.power_limit_w,
            job_levels={j.job_id: int(level[j.cards[0]]) for j in load.jobs},
            explanation=(*lines, *notes),
            choose_setpoint=ctx.choose_setpoint,
            plan=plan,
        )

    def _hold(
        self,
        snap: StateSnapshot,
        ctx: StepContext,
        load: SiteLoad,
        orders: list[PlacementOrder],
        notes: list[str],
        elapsed_s: float,
    ) -> Decision:
        """Keep the settings in force (the guard still enforces the caps)."""
        site = self.site
        lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
        return self._unpredicted_decision(
            ctx,
            card_level=np.clip(np.asarray(snap.card_level, dtype=np.int64), 0, site.card.n_levels - 1),
            card_low_power=np.asarray(snap.card_low_power, dtype=bool).copy(),
            card_power_limit_w=np.where(np.isfinite(lim), lim, site.card.power_limit_w),
            card_failed=np.asarray(snap.card_failed, dtype=bool),
            card_busy=load.busy,
            supply_temp_c=ctx.setpoint_c,
            placements=tuple(orders),
            status="fallback",
            plan_status="error",
            source="hold",
            solve_time_s=elapsed_s,
            explanation=tuple(notes),
        )

    # ================================================================================================
    # 6. commit
    # ================================================================================================
    def commit(self, decision: Decision, snap: StateSnapshot, ctx: StepContext) -> None:
        """Remember what the next step needs: placements in flight, the set-point evaluation, the
        fail-safe hold, the measured rack power the twin does not explain, the plan."""
        cfg = self.control
        now = ctx.now_s
        self._cycle = max(self._cycle, ctx.cycle) + 1
        if decision.plan is not None:
            self._prev_plan = decision.plan
        self._last = decision
        running = {j.job_id: j for j in snap.jobs}
        blind_card = ctx.blind_card_mask(self._card_rack)
        levels = {jid: lv for jid, lv in self._computing_level.items() if jid in running}
        for jid, lv in decision.job_levels.items():
            info = running.get(jid)
            if info is not None and info.phase == Phase.COMPUTE and not blind_card[list(info.cards)].any():
                levels[jid] = lv  # (a blind rack's jobs run slow for safety, not by choice)
        self._computing_level = levels
        if decision.choose_setpoint:
            self._last_setpoint_eval_s = now
        self._setpoint_c = decision.supply_temp_c
        self._placements.commit(
            decision.placements, running, now, cfg.command_ttl_s, seen_s=orders_seen_until(ctx, snap)
        )
        for r in (*ctx.stale_racks, *ctx.stuck_racks):
            self._blind_until[r] = now + cfg.failsafe_hold_s
        for c in ctx.stuck_cards:
            self._capped_until[self._card_rack[c]] = now + cfg.failsafe_hold_s
        if self.site.hosts_managed:
            self._hosts.commit(decision.card_busy, decision.host_off, snap.card_host_off, now)
        self._unexplained.update_pdu(snap, ctx.failsafe_racks)

    # ---- introspection ---------------------------------------------------------------------------
    @property
    def cycle(self) -> int:
        return self._cycle

    def resume_cycle(self, last_cycle: int) -> None:
        """Continue the cycle numbering of a previous run (from the journal)."""
        self._cycle = max(self._cycle, last_cycle + 1)

    def pending_placements(self) -> dict[str, tuple[int, ...]]:
        return self._placements.placements()

    def placement_refused(self, job_id: str, cards: Sequence[int], issued_s: float) -> bool:
        """The scheduler did not apply the placement of ``job_id`` on ``cards`` whose command was issued
        at ``issued_s`` (an ack ``rejected`` or ``expired``): the order is no longer in flight, its job
        may be placed again and its cards are free for the next decision
        (:meth:`agent.placing.PlacementBook.refused`; a newer order of the job stays). Returns whether
        an order was forgotten. Runs on the event loop, like :meth:`commit`."""
        return self._placements.refused(job_id, cards, issued_s)
