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
   each rack's measured supply; every card's die-to-inlet resistance (the estimator's calibration
   where it is confident, the journal's after a restart, else the spec); every card's measured die
   offset (``agent.offsets.DieOffsetFilter``: the twin's persistent error from settled readings,
   no transients; computed once here and used by both the planner and the guard); per rack, power
   the twin does not explain, subtracted from the cap: the PDU's power above what the cards report
   and the spec's host overhead (smoothed), plus what the cards of computing jobs draw above the
   twin's power model for their work at the settings in force (``agent.load.model_gap_w``: a job
   whose work is not what the agent believes; per card, taken once two readings in a row show it,
   let go as slowly as the PDU's part, kept while the job holds the card).
   A decision says so when a rack draws more than the margin above the twin's prediction.
2. **Placement** of queued jobs (``models.placement.place_jobs``) onto free, healthy cards the agent
   sees (not on blind racks, not a card with a stuck sensor); placed jobs are budgeted from this
   step on and not placed twice.
3. **Plan** (``models.solve.CyclePlanner``: DVFS + low-power idle + set-point MILP with the greedy
   fallback). Jobs that compute get the level the MILP gives them (top clocks where the caps allow;
   at full load the jobs with the least value per watt slow down first). Jobs that do not compute
   now (communication stall, checkpoint, waiting) and jobs touching a blind rack are *pinned*:
   they are handed to the MILP as computing jobs of no value, so they get their cheapest (slowest)
   level (for a job with an SLO, the slowest that meets it, so that it meets it the moment it
   resumes; a blind rack's jobs get the slowest), and their power is budgeted as if they
   resumed computing at any moment (with the opt-in ``resume_lag_s`` a pinned job keeps part of
   its value, :func:`pinned_value_frac`, so it slows only once that pays). Idle cards beyond
   ``idle_reserve_cards`` per supernode go to low-power idle (the awake ones stay the same cards
   from step to step). The set-point is re-optimized every ``setpoint_interval_s`` among the options
   within ``max_setpoint_step_k`` of the current one. A late, failed or infeasible solve falls back to
   the greedy plan; a problem no plan can meet is relaxed rack by rack (the guard then caps those
   racks) so that one bad rack never drags the whole site to its slowest levels.
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
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.backfill import Reservation, backfill_candidates, expected_starts_s, reservation
from agent.config import ControlConfig, LoadedConfig
from agent.decision import Decision, PlacementOrder, QueueWait, StepContext
from agent.guard import Guard, rack_measured_caps_w
from agent.hosts import choose_hosts_off, host_any
from agent.load import SiteLoad, finite_or, model_gap_w, site_load, spec_of_info, spec_r_total_k_per_w
from agent.offsets import DieOffsetFilter
from agent.pumps import choose_pump_speeds, full_speed_flow_lpm, r_at_speed
from models.explain import is_feasible, min_rack_power_w
from models.placement import QueuedJob, make_placement_problem, place_jobs
from models.plans import CyclePlan, SolveStatus
from models.problem import CycleProblem, Margins, Prices, ProblemError, dvfs_tables, make_problem
from models.solve import CyclePlanner, greedy_cycle
from twin.easy_backfill import keep_promise
from twin.estimate import Estimates, EstimatorConfig
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import JobInfo, StateSnapshot
from twin.thermal import ThermalParams
from twin.workload import JobSpec, Phase, relative_throughput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["Controller", "decides_again_on", "pinned_value_frac", "prices_from_config"]

#: Priority handed to the models for a job on a blind rack, and the least for a pinned job (one that
#: does no clock-sensitive work now): its value is nil, so the MILP gives it its cheapest level while
#: budgeting its computing power.
_PINNED_PRIORITY = 1e-9

#: A rack limit that never binds (racks the models cannot satisfy are left to the guard).
_UNBOUNDED_W = 1e12
#: Calibration is used once the estimator's resistance ratio is this certain (standard deviation).
_CALIBRATION_SD = 0.05
#: A card's calibrated resistance is the largest confident estimate of this long (site s): the
#: estimator runs the spec's thermal time constants, so a fouled plate (slower than the spec) reads
#: ~10% low for the minute or so it warms up after a resume (and ~10% high while it cools); such a dip
#: must not speed a hot card up (a fouled plate does not heal in minutes). About one warm-up of a
#: fouled plate (a few of its ~20 s slow time constants).
_CALIBRATION_HOLD_S = 120.0
#: Calibrated resistances are kept within these multiples of the spec's (a cooler-than-spec card is
#: believed only a little: underestimating a die is the dangerous direction).
_CALIBRATION_RANGE = (0.9, 3.0)
#: A pump that gives less than (1 - this) of its nominal flow at full speed stays at full speed:
#: the estimator calls such a pump weak.
_WEAK_PUMP_FRAC = EstimatorConfig().pump_threshold_frac
#: A rack where a measured die reached the die limit (slowdown - margin) keeps its pump at full speed
#: this long (site s): the twin under-predicted that die, and its offset may take minutes to measure
#: (it is only taken from settled readings); ten minutes spans several checkpoint cycles.
_PUMP_LATCH_S = 600.0
#: Smoothing (per step) and dead band of the rack power the twin does not explain (each of its two
#: parts: the PDU's power above the cards' readings and the host overhead, and the cards' power above
#: the twin's model of their work).
_EXTRA_SMOOTHING = 0.3
_EXTRA_DEADBAND_W = 300.0


def prices_from_config(loaded: LoadedConfig) -> Prices:
    p = loaded.config.prices
    return Prices(
        card_hour_value=p.card_hour_value,
        energy_price_per_kwh=p.energy_per_kwh,
        pue_penalty_per_kwh=p.pue_penalty_per_kwh,
    )


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


def decides_again_on(ev: JobEvent, placing: bool = True) -> bool:
    """Whether a job event calls for a decision at once (the service and the in-process loop alike):
    a job starts, ends, is requeued or resumes computing, or (when the agent places jobs,
    ``placing``) is submitted."""
    return (
        ev.kind in ("started", "finished", "failed", "requeued")
        or (ev.kind == "phase" and ev.phase == Phase.COMPUTE)
        or (placing and ev.kind == "submitted")
    )


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
        n, n_r = site.n_cards, site.n_racks
        self._card_rack = site.card_rack()
        self._r_spec = spec_r_total_k_per_w(site)
        self._r_journal = np.full(n, np.nan)
        self._r_est = np.full(n, np.nan)
        self._r_hist: collections.deque[tuple[float, FloatArray]] = collections.deque()
        self._leak_scale = np.full(n, np.nan)
        self._cycle = 0
        self._prev_plan: CyclePlan | None = None
        self._last_setpoint_eval_s = -math.inf
        self._latest_now_s = -math.inf  # the site time of the latest step (a later one before it: the clock went back)
        self._setpoint_c = site.facility.supply_temp_c
        self._blind_until = np.full(n_r, -math.inf)  # fail-safe hold of racks stale or stuck as a whole
        self._capped_until = np.full(n_r, -math.inf)  # fail-safe hold of racks with a stuck card
        self._pump_latch_until = np.full(n_r, -math.inf)  # racks whose pump stays at full speed (a die hit its limit)
        self._extra_w = np.zeros(n_r)  # PDU power above the cards' readings and the hosts (smoothed)
        # cards' power above the twin's model of their work (agent.load.model_gap_w), per rack and per card
        self._gap_w = np.zeros(n_r)
        self._card_gap_w = np.zeros(n)  # held while the card's job holds it
        self._card_gap_last_w = np.full(n, np.nan)  # the card's newest reading's gap ...
        self._card_gap_seen_s = np.full(n, -math.inf)  # ... and its time
        self._card_gap_job = np.full(n, "", dtype=object)  # the job it was measured on
        self._pending: dict[str, tuple[tuple[int, ...], float]] = {}
        self._solving = threading.Lock()
        self._last: Decision | None = None
        self._computing_level: dict[str, int] = {}  # each job's level the last time it computed
        self.offsets = DieOffsetFilter(site)  # measured die offsets, updated once per step (context)
        self._running_since: dict[str, float] = {}  # when each running job was first seen running
        self._reserved: tuple[str, float] | None = None  # the blocked job and its earliest expected start
        self._host_busy_last = np.full(site.n_hosts, np.nan)  # per host: last time a card was busy (NaN: not yet seen)
        self._host_up_at = np.full(site.n_hosts, -math.inf)  # per host powered on by a decision: when its boot ends

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
    ) -> Decision:
        """Context, proposal, guard, commit: the decision to apply (see the module docstring).
        ``incremental=True``: the fast adjustment of the last plan made on job events
        (:meth:`propose_incremental`)."""
        ctx = self.context(snap, now_s, estimates)
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
        np.minimum(self._host_up_at, now_s + self.site.rack.host_boot_s, out=self._host_up_at)
        np.minimum(self._host_busy_last, now_s, out=self._host_busy_last)  # NaN (never seen) stays NaN
        self._last_setpoint_eval_s = min(self._last_setpoint_eval_s, now_s)
        self._card_gap_seen_s[:] = -math.inf  # readings on the new timeline are new
        self._running_since = {j: min(t, now_s) for j, t in self._running_since.items()}
        # a placement sent on the old timeline lasts at most its order's time to live from now
        self._pending = {j: (c, min(u, now_s + cfg.command_ttl_s)) for j, (c, u) in self._pending.items()}
        self._reserved = None  # a reservation's promised start is recomputed on the new timeline
        self.guard.clock_went_back(now_s)
        self.offsets.clock_went_back(now_s)

    def context(
        self,
        snap: StateSnapshot,
        now_s: float | None = None,
        estimates: Estimates | None = None,
        *,
        time_limit_s: float | None = None,
    ) -> StepContext:
        """Everything the step needs besides the snapshot (see the module docstring)."""
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
        load = site_load(site, snap)
        offsets = self.offsets.update(seen, load, inlet, r_nominal, now, r_scale=r_now / r_nominal)
        failsafe = blind | capped
        self._update_gap(snap, load, card_seen, failsafe)
        return StepContext(
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
            rack_extra_w=np.maximum(self._extra_w - _EXTRA_DEADBAND_W, 0.0)
            + np.maximum(self._gap_w - _EXTRA_DEADBAND_W, 0.0),
            choose_setpoint=choose,
            solver_time_limit_s=max(limit, 0.005),
        )

    # ---- calibration ------------------------------------------------------------------------------
    def update_calibration(self, est: Estimates) -> None:
        """Take the estimator's die-to-inlet resistances where it is confident: per card the
        largest confident estimate of the last ``_CALIBRATION_HOLD_S`` (a transient dip is not believed)."""
        # the estimator's resistance ratio is against the spec at the measured flow: times the spec at
        # nominal flow, it is the card's resistance at nominal flow whatever the pump's speed was
        ok = np.isfinite(est.r_ratio) & (est.r_ratio_sd < _CALIBRATION_SD)
        r_now = np.asarray(np.where(ok, est.r_ratio * self._r_spec, np.nan), dtype=np.float64)
        t = float(est.time_s) if math.isfinite(est.time_s) else (self._r_hist[-1][0] if self._r_hist else 0.0)
        while self._r_hist and self._r_hist[-1][0] > t:  # the site clock stepped back
            self._r_hist.pop()
        self._r_hist.append((t, r_now))
        while self._r_hist[0][0] < t - _CALIBRATION_HOLD_S:
            self._r_hist.popleft()
        self._r_est = np.asarray(np.fmax.reduce([r for _t, r in self._r_hist]), dtype=np.float64)
        self._leak_scale = np.where(ok, est.leakage_scale, self._leak_scale)

    def load_calibration(self, cards: IntArray, r_th_k_per_w: FloatArray, leak_scale: FloatArray) -> None:
        """Calibration from the journal (a restarted agent), used until the estimator is confident."""
        cards = np.asarray(cards, dtype=np.int64)
        ok = (cards >= 0) & (cards < self.site.n_cards) & np.isfinite(r_th_k_per_w) & (r_th_k_per_w > 0)
        self._r_journal[cards[ok]] = r_th_k_per_w[ok]
        self._leak_scale[cards[ok]] = leak_scale[ok]

    def calibration(self) -> tuple[IntArray, FloatArray, FloatArray]:
        """(cards, die-to-inlet resistance, leakage scale) of the calibrated cards, for the journal."""
        r = np.where(np.isfinite(self._r_est), self._r_est, self._r_journal)
        cards = np.flatnonzero(np.isfinite(r)).astype(np.int64)
        leak = np.where(np.isfinite(self._leak_scale), self._leak_scale, 1.0)
        return cards, r[cards].copy(), leak[cards].copy()

    def r_total_k_per_w(self) -> FloatArray:
        """Per card at nominal flow: the estimator's resistance, else the journal's, else the spec's (clipped)."""
        r = np.where(np.isfinite(self._r_est), self._r_est, self._r_journal)
        r = np.where(np.isfinite(r), r, self._r_spec)
        lo, hi = _CALIBRATION_RANGE
        return np.asarray(np.clip(r, lo * self._r_spec, hi * self._r_spec), dtype=np.float64)

    # ---- pumps and the guard ----------------------------------------------------------------------
    def review(self, proposal: Decision, snap: StateSnapshot, ctx: StepContext) -> Decision:
        """Steps 4-5: the proposal's pump speeds (:meth:`with_pump_speeds`), the guard, then the hosts
        (:meth:`with_hosts`)."""
        return self.with_hosts(self.guard.review(self.with_pump_speeds(proposal, snap, ctx), snap, ctx), snap, ctx)

    def with_hosts(self, d: Decision, snap: StateSnapshot, ctx: StepContext) -> Decision:
        """``d`` with the hosts to have off (``agent.hosts``) and their cards in low-power idle.
        Unchanged where the site's hosts cannot be powered off or host control is off."""
        site, cfg = self.site, self.control
        if not (cfg.control_host_power and site.hosts_managed):
            return d
        now = ctx.now_s
        # busy: the decision's, plus placements committed since its snapshot was taken (the service
        # reviews a periodic proposal after an event decision may have placed a job meanwhile)
        card_busy = np.asarray(d.card_busy, dtype=bool).copy()
        for cards in self._pending_now(self._orders_seen_until(ctx, snap)).values():
            card_busy[list(cards)] = True
        busy = host_any(site, card_busy)
        last = np.where(np.isnan(self._host_busy_last), now, self._host_busy_last)
        last = np.where(busy, now, last)
        choice = choose_hosts_off(
            site,
            now_s=now,
            host_busy_last_s=last,
            card_busy=card_busy,
            host_off_now=host_any(site, snap.card_host_off),
            host_awake=host_any(site, ~d.card_low_power & ~d.card_busy & ~d.card_failed),
            frozen_host=host_any(site, ctx.unseen_card_mask(self._card_rack)),
            off_after_s=cfg.host_idle_off_s(site),
            reserve_per_supernode=cfg.host_reserve_per_supernode,
            due_cards=self._cards_due(d, snap, ctx),
            card_failed=d.card_failed,
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
        load = site_load(site, snap, self._pending_with(ctx, snap, d.placements))
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

    @staticmethod
    def _orders_seen_until(ctx: StepContext, snap: StateSnapshot) -> float:
        """The site time up to which ``snap`` can show what a placement order did: its newest reading,
        not the clock's ``now`` ahead of it. An order still in its time to live at that time may yet
        show as a started job (telemetry behind the clock: a broker backlog, an accelerated simulator
        lagging; the job was placed twice at 60x when orders expired by the clock)."""
        t = float(snap.time_s)
        return min(ctx.now_s, t) if math.isfinite(t) else ctx.now_s

    def _in_flight(self, ctx: StepContext, snap: StateSnapshot) -> list[tuple[str, tuple[int, ...]]]:
        """Placements sent and not yet started (their jobs still queued, their orders not expired by
        the time the snapshot shows)."""
        queued_ids = {q.job_id for q in snap.queue}
        seen = self._orders_seen_until(ctx, snap)
        return [(jid, c) for jid, (c, until) in self._pending.items() if until > seen and jid in queued_ids]

    def _pending_with(
        self, ctx: StepContext, snap: StateSnapshot, orders: Sequence[PlacementOrder]
    ) -> list[tuple[str, tuple[int, ...]]]:
        """Placements in flight plus ``orders``: the jobs about to run."""
        pending = self._in_flight(ctx, snap)
        placing = {jid for jid, _ in pending}
        return [*pending, *((o.job_id, o.cards) for o in orders if o.job_id not in placing)]

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
        unseen_card = ctx.unseen_card_mask(self._card_rack)
        pending = self._in_flight(ctx, snap)
        load = site_load(site, snap, pending)
        notes: list[str] = self._excess_notes()
        waits: dict[str, QueueWait] = {}
        orders: list[PlacementOrder] = []
        pending_ids = {jid for jid, _ in pending}
        to_place = [q for q in snap.queue if q.job_id not in pending_ids]
        if cfg.control_placement and to_place:
            orders = self._place(load, snap, ctx, unseen_card, to_place, notes, waits)
            if orders:
                load = site_load(site, snap, [*pending, *((o.job_id, o.cards) for o in orders)])
        try:
            p = self._problem(load, snap, ctx)
            plan = self._plan(p, ctx, use_solver, notes)
        except ProblemError as exc:
            notes.append(f"no plan ({exc}): current settings held")
            return self._hold(snap, ctx, load, orders, notes, time.perf_counter() - t0).replace(queue_waits=waits)
        decision = self._decision(plan, p, snap, ctx, load, orders, notes, unseen_card, time.perf_counter() - t0)
        return decision.replace(queue_waits=waits)

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
        unseen_card = ctx.unseen_card_mask(self._card_rack)
        pending = self._in_flight(ctx, snap)
        load = site_load(site, snap, pending)
        notes: list[str] = ["incremental: the last plan adjusted to job events", *self._excess_notes()]
        waits: dict[str, QueueWait] = {}
        orders: list[PlacementOrder] = []
        pending_ids = {jid for jid, _ in pending}
        to_place = [q for q in snap.queue if q.job_id not in pending_ids]
        if cfg.control_placement and to_place:
            orders = self._place(load, snap, ctx, unseen_card, to_place, notes, waits, method="greedy")
            if orders:
                load = site_load(site, snap, [*pending, *((o.job_id, o.cards) for o in orders)])
        level = np.full(site.n_cards, slowest, dtype=np.int64)
        clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
        since = {info.job_id: info.last_event_s for info in snap.jobs}
        for j in load.jobs:
            if bool(blind_card[j.cards].any()):
                continue
            if j.computing or (cfg.resume_lag_s > 0.0 and since.get(j.job_id, ctx.now_s) > prev.time_s):
                # computing, or stopped since the last plan (valued as computing: see pinned_value_frac)
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
        low = np.where(unseen_card, snap_lp, low) & ~load.busy
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
        site, cfg = self.site, self.control
        blind_card = ctx.blind_card_mask(self._card_rack)
        jobs: list[JobSpec] = []
        cards: list[IntArray] = []
        since = {info.job_id: info.last_event_s for info in snap.jobs}
        for j in load.jobs:
            spec = j.spec
            if bool(blind_card[j.cards].any()):  # safety first: the slowest level, SLO or not
                spec = dataclasses.replace(spec, priority=_PINNED_PRIORITY, min_throughput_frac=0.0)
            elif not j.computing:  # valued for the work its level costs at the resume (SLO kept)
                frac = pinned_value_frac(cfg.resume_lag_s, ctx.now_s - since.get(j.job_id, ctx.now_s))
                spec = dataclasses.replace(spec, priority=max(spec.priority * frac, _PINNED_PRIORITY))
            jobs.append(spec)
            cards.append(j.cards)
        # idle cards the agent cannot see are out of the models' hands (never woken on stale data), and
        # so are the idle cards of hosts that are off: the plan cannot wake them (a wake would boot the
        # host), so the ready reserve must sit on hosts that are on (budgeted at low-power idle, as now)
        unusable = ctx.unseen_card_mask(self._card_rack) | np.asarray(snap.card_host_off, dtype=bool)
        failed = np.asarray(snap.card_failed, dtype=bool) | (unusable & load.idle)
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
        n_idle = int((load.idle & ~failed).sum())
        reserve = min(cfg.idle_reserve_cards * site.supernodes, n_idle)
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
            rack_limit_w=site.rack_power_limits_w() - ctx.rack_extra_w,
            ready_reserve_cards=reserve,
            margins=self.margins,
            prices=self.prices,
        )

    def _plan(self, p: CycleProblem, ctx: StepContext, use_solver: bool, notes: list[str]) -> CyclePlan:
        """The planner's plan (the greedy one without the solver); where no plan meets every
        constraint, the plan of the problem without what no plan can meet (:meth:`_relax`), flagged
        infeasible."""
        choose = ctx.choose_setpoint and len(p.supply_options_c) > 1
        if use_solver:
            plan = self.planner.plan(
                p,
                self._prev_plan,
                time_limit_s=ctx.solver_time_limit_s,
                mip_rel_gap=self.control.mip_rel_gap,
                choose_setpoint=choose,
                refine_top=2,
            )
        else:
            plan = greedy_cycle(p, choose_setpoint=choose)
            notes.append("greedy plan (the solve was late or not asked for)")
        if plan.status != SolveStatus.INFEASIBLE:
            return plan
        notes.extend(f"infeasible: {line}" for line in plan.explanation.splitlines()[:6])
        q = self._relax(p, choose, notes)
        if use_solver:
            relaxed = self.planner.plan(
                q,
                self._prev_plan,
                time_limit_s=ctx.solver_time_limit_s,
                mip_rel_gap=self.control.mip_rel_gap,
                choose_setpoint=choose and len(q.supply_options_c) > 1,
                refine_top=2,
            )
        else:
            relaxed = greedy_cycle(q, choose_setpoint=choose and len(q.supply_options_c) > 1)
        if not relaxed.status.has_plan:
            return plan
        return dataclasses.replace(relaxed, status=SolveStatus.INFEASIBLE, explanation=plan.explanation)

    def _relax(self, p: CycleProblem, choose: bool, notes: list[str]) -> CycleProblem:
        """No plan meets every constraint: ``p`` without what no plan can meet at the coolest set-point
        within reach (what cooling cannot fix), so that the rest, set-point included, is planned as
        usual and one job or rack never drags the site to its slowest levels or its coolest set-point.
        In order, each only where still needed:

        1. jobs with no level that meets both their SLO and the die limit: a job some level keeps
           under the die limit loses its SLO (it runs as fast as its dies allow); a job no level keeps
           under it runs at its least power, its hot cards left to the guard, and the set-point may
           not rise (``CycleProblem.least_power_jobs``);
        2. racks over their cap at their least power: left to the guard's caps;
        3. the ready reserve;
        4. the measured die offsets (the guard caps hot cards).
        """
        names = self.site.rack_names
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
            q = dataclasses.replace(q, rack_limit_w=np.where(bad, _UNBOUNDED_W, q.rack_limit_w))
            notes.append(f"relaxed: racks {', '.join(names[r] for r in np.flatnonzero(bad))} left to the guard's caps")
            t = dvfs_tables(q, coolest)
        if not is_feasible(q, t):
            q = dataclasses.replace(q, ready_reserve_cards=0)
            notes.append("relaxed: no ready reserve")
            t = dvfs_tables(q, coolest)
        if not is_feasible(q, t):
            q = dataclasses.replace(q, die_offset_k=np.zeros_like(q.die_offset_k))
            notes.append("relaxed: measured die offsets ignored (the guard caps hot cards)")
        return q

    def _place(
        self,
        load: SiteLoad,
        snap: StateSnapshot,
        ctx: StepContext,
        unseen_card: BoolArray,
        queue: Sequence[JobInfo],
        notes: list[str],
        waits: dict[str, QueueWait],
        method: str | None = None,
    ) -> list[PlacementOrder]:
        """Orders for the queued jobs that go now; ``waits`` gets why each of the others stays queued."""
        site, cfg = self.site, self.control
        fits = [q for q in queue if 0 < q.n_cards <= site.n_cards]
        for q in queue:
            if q.n_cards > site.n_cards:
                waits[q.job_id] = QueueWait("too_large", f"needs {q.n_cards} cards, the site has {site.n_cards}")
            elif q.n_cards <= 0:
                waits[q.job_id] = QueueWait("no_spec", "its card count is unknown (no submitted event with its spec)")
        if not fits:
            return []
        how = method if method is not None else cfg.placement_method
        # EASY backfilling (agent.backfill): once a job has waited placement_backfill_wait_s, it is
        # placed first; if it does not fit, it holds a reservation and jobs behind it are placed only
        # where they do not delay it
        starving = sorted(
            (q for q in fits if ctx.now_s - q.last_event_s >= cfg.placement_backfill_wait_s),
            key=lambda q: q.last_event_s,
        )
        if not starving:
            return self._place_jobs(load, snap, ctx, unseen_card, fits, notes, waits, how)
        head = starving[0]
        rest = [q for q in fits if q.job_id != head.job_id]
        orders = self._place_jobs(load, snap, ctx, unseen_card, [head], notes, {}, how)
        if orders:
            self._reserved = None
            if rest:
                placing = [(j.job_id, j.cards) for j in load.jobs if j.origin == "placing"]
                after = site_load(site, snap, [*placing, *((o.job_id, o.cards) for o in orders)])
                orders += self._place_jobs(after, snap, ctx, unseen_card, rest, notes, waits, how)
            return orders
        n_free = int((load.idle & ~unseen_card).sum())
        res = self._held(head.job_id, reservation(snap, load, head.n_cards, n_free, ctx.now_s, self._running_since))
        specs = [spec_of_info(q) for q in rest]
        picked = [rest[i] for i in backfill_candidates(rest, specs, res, ctx.now_s)]
        wait_s = ctx.now_s - head.last_event_s
        if not math.isfinite(res.shadow_s):
            start = "never (too few healthy cards)"
        elif res.shadow_s > ctx.now_s:
            start = f"~{res.shadow_s - ctx.now_s:.0f} s"
        else:
            start = f"now (due {ctx.now_s - res.shadow_s:.0f} s ago: the site drains for it)"
        notes.append(f"{head.job_id} (waiting {wait_s:.0f} s) holds a reservation: expected start in {start}")
        why = f"waiting {wait_s:.0f} s; expected start in {start}"
        waits[head.job_id] = QueueWait("reservation", why, res.shadow_s)
        picked_ids = {q.job_id for q in picked}
        for q in rest:
            if q.job_id not in picked_ids:
                waits[q.job_id] = QueueWait("behind_reservation", f"would delay {head.job_id}'s reserved start")
        if not picked:
            return []
        return self._place_jobs(load, snap, ctx, unseen_card, picked, notes, waits, how)

    def _held(self, job_id: str, res: Reservation) -> Reservation:
        """The reservation of the blocked job ``job_id`` as promised (``twin.easy_backfill.
        keep_promise``): its start is the earliest expected start computed for it, not one that slips
        each time a job ahead of it runs longer than expected."""
        res = keep_promise(self._reserved, job_id, res)
        self._reserved = (job_id, res.shadow_s)
        return res

    def _cards_due(self, d: Decision, snap: StateSnapshot, ctx: StepContext) -> int:
        """Cards of the queued jobs that neither this decision nor one in flight places and that are
        expected to start within a host's boot plus ``host_boot_lead_s`` (``agent.backfill.
        expected_starts_s``: when their cards are expected to be free; a job holding a reservation at
        its promised start, the jobs behind it not before). Their hosts are kept on or powered on;
        hosts waiting for a start further away (a big job's drain) may go off meanwhile."""
        now = ctx.now_s
        placing = {o.job_id for o in d.placements} | set(self._pending_now(self._orders_seen_until(ctx, snap)))
        queue = [q for q in snap.queue if q.job_id not in placing and 0 < q.n_cards <= self.site.n_cards]
        if not queue:
            return 0
        load = site_load(self.site, snap, self._pending_with(ctx, snap, d.placements))
        ids = {q.job_id for q in queue}
        held = self._reserved if self._reserved is not None and self._reserved[0] in ids else None
        starts = expected_starts_s(snap, load, queue, int(load.idle.sum()), now, self._running_since, held)
        horizon = now + self.site.rack.host_boot_s + self.control.host_boot_lead_s
        return sum(q.n_cards for q, start in zip(queue, starts, strict=True) if start <= horizon)

    def _pending_now(self, now_s: float) -> dict[str, tuple[int, ...]]:
        """Placements sent whose orders have not expired: job id -> cards."""
        return {jid: cards for jid, (cards, until) in self._pending.items() if until > now_s}

    def _card_wait_s(self, snap: StateSnapshot, ctx: StepContext) -> FloatArray | None:
        """Per card: how long until its host is up (the rest of the boot for a host a decision powered
        on; a whole boot for an off host, whose idle cards ``_problem`` does not offer); None where
        hosts are not managed."""
        site = self.site
        if not site.hosts_managed:
            return None
        off = host_any(site, snap.card_host_off)
        wait = np.where(off, site.rack.host_boot_s, np.maximum(self._host_up_at - ctx.now_s, 0.0))
        return np.repeat(wait, site.cards_per_host)

    def _place_jobs(
        self,
        load: SiteLoad,
        snap: StateSnapshot,
        ctx: StepContext,
        unseen_card: BoolArray,
        queue: Sequence[JobInfo],
        notes: list[str],
        waits: dict[str, QueueWait],
        method: str,
    ) -> list[PlacementOrder]:
        """``queue`` onto the free cards of ``load`` (``models.placement.place_jobs``); ``waits`` gets
        why each job left out stays queued."""
        specs = [spec_of_info(q) for q in queue]
        if not specs:
            return []
        try:
            p0 = self._problem(load, snap, ctx)
            # cards the agent cannot see are not offered (blind racks, stuck sensors)
            p0 = dataclasses.replace(p0, failed=p0.failed | unseen_card)
            pp = make_placement_problem(p0, [QueuedJob(s) for s in specs], ctx.setpoint_c, self._card_wait_s(snap, ctx))
            placement = place_jobs(pp, method=method, time_limit_s=min(1.0, ctx.solver_time_limit_s))
        except ProblemError as exc:
            notes.append(f"placement skipped: {exc}")
            waits.update((q.job_id, QueueWait("placement_error", str(exc))) for q in queue)
            return []
        orders = [
            PlacementOrder(jid, tuple(int(c) for c in np.sort(cards)))
            for jid, cards in placement.cards.items()
            if len(cards)
        ]
        if orders:
            notes.append(f"placed {', '.join(o.job_id for o in orders[:8])}" + (" ..." if len(orders) > 8 else ""))
        for jid, why in list(placement.unplaced.items())[:3]:
            notes.append(f"{jid} stays queued: {why}")
        waits.update((jid, QueueWait("no_window", why)) for jid, why in placement.unplaced.items())
        return orders

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
        unseen_card: BoolArray,
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
        level[load.idle] = slowest
        # which idle cards stay awake: as many as the plan says, the ones awake now first (an awake
        # idle card draws ~30 W more than a sleeping one, so the rack matters little; the guard
        # puts idle cards to sleep where a cap needs it), then the plan's racks, on the hosts that
        # stay on (``agent.hosts`` keeps the hosts holding awake cards on first): hosts with a busy
        # card, then the most recently used
        low = np.ones(n, dtype=bool)
        low[load.busy] = False
        idle_model = p.idle_mask()
        want = int(dv.rack_awake.sum())
        keep = np.flatnonzero(idle_model & ~snap_lp)[:want]
        low[keep] = False
        left = np.asarray(dv.rack_awake, dtype=np.int64) - np.bincount(self._card_rack[keep], minlength=site.n_racks)
        extra = want - keep.size
        card_host = site.card_host()
        host_busy = host_any(site, load.busy)[card_host]
        host_used_s = np.nan_to_num(self._host_busy_last, nan=ctx.now_s)[card_host]
        for r in np.argsort(-left, kind="stable"):
            if extra <= 0 or left[r] <= 0:
                break
            cand = np.flatnonzero(idle_model & low & (self._card_rack == r))  # idle_model: not on an off host
            cand = cand[np.lexsort((-host_used_s[cand], ~host_busy[cand]))][: min(int(left[r]), extra)]
            low[cand] = False
            extra -= cand.size
        low = np.where(unseen_card & load.idle, snap_lp, low)
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
        self._running_since = {jid: self._running_since.get(jid, now) for jid in running}
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
        # a new dict, bound at once: a late solve in a worker thread may be reading the old one
        pending = dict(self._pending)
        for o in decision.placements:
            pending[o.job_id] = (o.cards, now + cfg.command_ttl_s)
        self._pending = {k: v for k, v in pending.items() if v[1] > now and k not in running}
        for r in (*ctx.stale_racks, *ctx.stuck_racks):
            self._blind_until[r] = now + cfg.failsafe_hold_s
        for c in ctx.stuck_cards:
            self._capped_until[self._card_rack[c]] = now + cfg.failsafe_hold_s
        if self.site.hosts_managed:
            busy_host = host_any(self.site, decision.card_busy)
            self._host_busy_last = np.where(np.isnan(self._host_busy_last) | busy_host, now, self._host_busy_last)
            if decision.host_off is not None:  # hosts this decision powers on (the reserve, a placement) boot
                booting = host_any(self.site, snap.card_host_off) & ~decision.host_off & (self._host_up_at < now)
                self._host_up_at[booting] = now + self.site.rack.host_boot_s
                self._host_busy_last[booting] = now  # a host just powered on is not due to go off again
        self._update_extra(snap, ctx)

    def _update_gap(self, snap: StateSnapshot, load: SiteLoad, card_seen: BoolArray, failsafe: set[int]) -> None:
        """Per rack, the sum over its busy cards of what each draws above the twin's model of its job's
        work (``agent.load.model_gap_w``). Per card, from its readings while its job computes, kept
        while the job holds it (a job that stalls or checkpoints draws it again when it resumes) and
        dropped when another job takes it; a card on a fail-safe rack, or without a new reading since
        the last step, keeps its own. A rise is taken as soon as two readings in a row show it (one
        reading may show a card's new level with the power of the level it left: 680 W read at a
        level the model puts at 587 W, once in a nominal day), a fall as slowly as the PDU's part."""
        site = self.site
        ids = np.array([j.job_id for j in load.jobs] + [""], dtype=object)
        job = ids[np.where(load.card_job >= 0, load.card_job, len(load.jobs))]
        moved = job != self._card_gap_job
        self._card_gap_w = np.where(moved, 0.0, self._card_gap_w)
        self._card_gap_last_w = np.where(moved, np.nan, self._card_gap_last_w)
        self._card_gap_job = job
        gap = model_gap_w(site, snap, load, card_seen)
        seen_s = np.asarray(snap.card_last_seen_s, dtype=np.float64)
        new = np.isfinite(gap) & (seen_s > self._card_gap_seen_s)
        new &= ~np.isin(self._card_rack, np.asarray(sorted(failsafe), dtype=np.int64))
        a = _EXTRA_SMOOTHING
        shown = np.fmin(gap, self._card_gap_last_w)  # what the two newest readings both show
        smoothed = np.maximum(shown, (1 - a) * self._card_gap_w + a * shown)
        self._card_gap_w = np.where(new, smoothed, self._card_gap_w)
        self._card_gap_last_w = np.where(new, gap, self._card_gap_last_w)
        self._card_gap_seen_s = np.where(new, seen_s, self._card_gap_seen_s)
        held = np.where(load.busy, self._card_gap_w, 0.0)
        self._gap_w = np.bincount(self._card_rack, weights=held, minlength=site.n_racks).astype(np.float64)

    def _excess_notes(self) -> list[str]:
        """A line per rack that draws more than the margin above the twin's prediction at the settings
        in force (the power the twin does not explain, smoothed; budgeted)."""
        names = self.site.rack_names
        pdu_w, gap_w = self._extra_w, np.maximum(self._gap_w, 0.0)
        return [
            f"{names[r]} draws {(pdu_w[r] + gap_w[r]) / 1e3:.2f} kW more than the twin predicts at the settings in "
            f"force (its cards {gap_w[r] / 1e3:.2f} kW beyond the power model of their work, its PDU "
            f"{pdu_w[r] / 1e3:.2f} kW beyond its cards and hosts): budgeted"
            for r in np.flatnonzero(pdu_w + gap_w > self.control.rack_margin_w)
        ]

    def _update_extra(self, snap: StateSnapshot, ctx: StepContext) -> None:
        """PDU power above what the cards report plus the spec's host overhead, per fresh rack."""
        site = self.site
        pdu = np.asarray(snap.rack_power_w, dtype=np.float64)
        card_p = np.where(np.isfinite(snap.card_power_w) & ~snap.card_failed, snap.card_power_w, 0.0)
        cards_w = np.bincount(self._card_rack, weights=card_p, minlength=site.n_racks)
        # hosts reported off draw their off power instead of their share of the overhead
        off_per_rack = (
            np.bincount(
                self._card_rack, weights=np.asarray(snap.card_host_off, dtype=np.float64), minlength=site.n_racks
            )
            / site.cards_per_host
        )
        excess = pdu - cards_w - (site.rack.host_overhead_w - off_per_rack * site.host_saving_w())
        fresh = np.isfinite(excess)
        fresh[list(ctx.failsafe_racks)] = False
        a = _EXTRA_SMOOTHING
        self._extra_w = np.where(fresh, (1 - a) * self._extra_w + a * np.maximum(excess, 0.0), self._extra_w)

    # ---- introspection ---------------------------------------------------------------------------
    @property
    def cycle(self) -> int:
        return self._cycle

    def resume_cycle(self, last_cycle: int) -> None:
        """Continue the cycle numbering of a previous run (from the journal)."""
        self._cycle = max(self._cycle, last_cycle + 1)

    def pending_placements(self) -> dict[str, tuple[int, ...]]:
        return {k: v[0] for k, v in self._pending.items()}
