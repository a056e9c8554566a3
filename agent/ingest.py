"""Incoming wire messages -> the agent's belief (``twin.state.TwinState``) and the site clock.

:class:`Ingest` takes decoded messages (``agent.wire``) one by one:

* telemetry (card batches, CDU, PDU, facility) becomes ``twin.readings`` objects, collected into
  *rounds* (:class:`twin.readings.Readings` with at most one reading of each kind per rack) that
  :meth:`Ingest.flush` folds into the ``TwinState`` in arrival order. Rack-local card indices
  become site indices; the DVFS level of each card is what the rack last reported as applied
  (``racktwin.applied/1``) or, before that, the level of its clock; a card reading 0 W at 0 MHz
  while awake has failed (that is how a rack reports a dead card);
* applied states (``racktwin.applied/1``) are kept per card (:attr:`Ingest.applied_level`,
  :attr:`Ingest.applied_power_limit_w`, :attr:`Ingest.applied_low_power`: what each rack confirmed
  applying to each card, which its telemetry shows up to one period later), but not for a card whose
  applied state taken is newer (a second publisher for the rack, a broker bridge reordering; counted per
  rack in ``IngestStats.applied_states_old``, exported as ``racktwin_applied_states_old_total``, and
  logged). A card reading disproves what its rack confirmed where it cannot be (a clock faster than the
  confirmed level allows, awake where confirmed asleep, another power limit), stamped after the applied
  state by more than the rack's confirmation margin: that part of the confirmation is forgotten at once,
  so the level comes from the clock again and the commands' diff commands the card again; the disproval
  is counted (:class:`IngestStats`, exported as ``racktwin_applied_state_disproved_total``) only when no
  late applied state explains it in time (:meth:`Ingest.settle_disprovals`: after each message, and on
  the service's health tick, so that a count does not wait for the telemetry to come back after a
  silence). That book is
  :attr:`Ingest.applied`, an :class:`agent.applied_states.AppliedStates` (its module tells the rules);
* job events go to the ``TwinState`` at once (after the readings that came before them), dated by
  their stamp; one stamped far ahead of the site clock is dated at the site's now, but in its
  stamp's order among its job's events (:meth:`Ingest._dated`), so that the belief still tells a
  repeated or overtaken event from a new one, and it is newer or older than a job snapshot by that
  date, not by its stamp (by its stamp, every snapshot of the next hour read as older than it);
* the scheduler's retained job snapshot (``racktwin.job_state/1``) is reconciled with the belief's
  job table when it is newer than the last job event taken (``agent.job_catchup``): the catch-up of
  an agent that connects after jobs started. Being retained, a snapshot may come from an earlier
  run of the scheduler on another timeline (a simulator restarted at t = 0 finds its predecessor's
  last snapshot on the broker): it never moves the site clock, waits until the clock is known (the
  first telemetry), and is ignored when stamped ahead of the site's time by more than the clock's
  ahead tolerance (10 s, or two wall seconds of site time if more). Taken as the site's time, such
  a snapshot drove the clock 2,192 s ahead and every command after it was refused ``issued_ahead``.
  One stamped behind is taken however far: the scheduler publishes it when its job set changes, so on
  a quiet site (long jobs, none starting or ending) the one retained may be hours old and still true,
  and it is what keeps an agent that (re)starts from sleeping or placing onto the cards of a job in a
  checkpoint; an earlier run's is replaced by the next run's first snapshot, or undone by its events;
* acks are handed to the caller (``on_ack``);
* every round folded into the belief is handed to ``on_round`` (the service's estimator);
* every other message's timestamp drives the :class:`agent.clock.SiteClock`.

What a flush folds in is also returned; :class:`agent.round_merger.RoundMerger` merges those partial readings
into one :class:`twin.readings.Readings` per telemetry round for the estimator.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.applied_states import AppliedStates
from agent.clock import SiteClock
from agent.job_catchup import reconcile
from twin.readings import CardBatch, FacilityReading, JobEvent, LoopReading, PduReading, RackReading, Readings
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import Phase

IntArray = npt.NDArray[np.int64]

__all__ = ["Ingest", "IngestStats"]

log = logging.getLogger("racktwin.agent.ingest")

#: jobs whose latest event stamp is remembered (to date events stamped far ahead in their order)
_DATES_KEPT = 4096

_EVENT_KINDS = {
    wire.JobEventType.SUBMITTED: "submitted",
    wire.JobEventType.STARTED: "started",
    wire.JobEventType.PHASE_CHANGED: "phase",
    wire.JobEventType.FINISHED: "finished",
    wire.JobEventType.FAILED: "failed",
    wire.JobEventType.REQUEUED: "requeued",
}


@dataclass
class IngestStats:
    by_kind: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    job_events: int = 0
    ignored: int = 0  # decoded messages the agent does not act on (commands of other agents...)
    ahead: int = 0  # messages stamped too far ahead of the site clock (their readings are not taken)
    # job_snapshots*: snapshots; job_snapshot_added, _corrected, _dropped: jobs, one count per job (exported as
    # racktwin_job_snapshot_changes_total{change}: what a snapshot changed, job by job)
    job_snapshots: int = 0  # job snapshots (jobs/state) reconciled with the job table
    job_snapshots_changed: int = 0  # of those, the snapshots that changed it (one job or more)
    job_snapshot_added: int = 0  # jobs those added to the job table (the agent did not hold them)
    job_snapshot_corrected: int = 0  # jobs whose cards, phase or state those corrected
    job_snapshot_dropped: int = 0  # jobs the agent held that those no longer listed (dropped from the table)
    job_snapshots_old: int = 0  # job snapshots not newer than the last job event or snapshot: ignored
    job_snapshots_ahead: int = 0  # job snapshots stamped ahead of the site clock (another timeline): ignored
    #: per (setting, rack name): cards whose confirmed (applied state's) setting, ``level``, ``power_limit``
    #: or ``low_power`` (``agent.applied_states.DISPROVABLE_SETTINGS``), a later reading disproved and no late
    #: applied state explained (``AppliedStates._disprove``): a rack reset or changed outside the agent's
    #: commands, not republished. Counted once the bound passed (``AppliedStates.settle_disprovals``)
    applied_disproved: dict[tuple[str, str], int] = field(default_factory=dict)
    #: disprovals a late applied state explained (the agent's own command: the rack's applied state
    #: reached the agent after a reading that already showed it), not counted above
    applied_disprovals_explained: int = 0
    #: per rack name: applied states older, for some of their cards, than the one taken for them: not taken for
    #: those cards (a second publisher for the rack, messages reordered; ``AppliedStates._older_than_taken``);
    #: one count per message (exported as ``racktwin_applied_states_old_total{rack}``)
    applied_states_old: dict[str, int] = field(default_factory=dict)
    #: per rack name: of those, the ones dropped from the book of refused applied states to try again at a new
    #: timeline, past its bound (``agent.refused_applied.REFUSED_KEPT_PER_RACK`` per rack; the oldest-stamped
    #: goes; exported as ``racktwin_applied_states_old_dropped_total{rack}``)
    applied_states_old_dropped: dict[str, int] = field(default_factory=dict)

    def disproved(self, setting: str) -> int:
        """Cards whose confirmed ``setting`` was disproved and counted, all racks together."""
        return sum(n for (s, _rack), n in self.applied_disproved.items() if s == setting)

    @property
    def applied_levels_disproved(self) -> int:
        return self.disproved("level")

    @property
    def applied_limits_disproved(self) -> int:
        return self.disproved("power_limit")

    @property
    def applied_low_power_disproved(self) -> int:
        return self.disproved("low_power")


@dataclass
class _Partial:
    time_s: float  # the newest of the parts' times
    cards: CardBatch | None = None
    loop: LoopReading | None = None
    pdu: PduReading | None = None
    cards_time_s: float | None = None  # each part's own time stamp
    loop_time_s: float | None = None
    pdu_time_s: float | None = None


class Ingest:
    """Folds wire messages into the belief (see the module docstring)."""

    def __init__(
        self,
        site: SiteSpec,
        state: TwinState,
        clock: SiteClock,
        *,
        on_ack: Callable[[wire.Acknowledgement], None] | None = None,
        on_event: Callable[[JobEvent], None] | None = None,
        on_round: Callable[[Readings], None] | None = None,
        telemetry_deadline_s: float = 30.0,
    ) -> None:
        self.site = site
        self.state = state
        self.clock = clock
        self.on_ack = on_ack
        self.on_event = on_event
        self.on_round = on_round
        self.stats = IngestStats()
        self._rack = {name: i for i, name in enumerate(site.rack_names)}
        self._cpr = site.cards_per_rack
        self._clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
        #: what each rack confirmed applying to each card, and the readings that disprove it
        self.applied = AppliedStates(site, state, clock, self.stats, telemetry_deadline_s)
        self._round: dict[int, _Partial] = {}
        self._facility: FacilityReading | None = None
        self._round_t = -math.inf
        # per job: the newest stamp of its events and the site time it was dated at
        self._event_dates: dict[str, tuple[float, float]] = {}
        #: (ts, seq) of the newest job event or job snapshot taken (None: none yet, or the clock went back)
        self._jobs_seen: tuple[float, int] | None = None
        #: the newest job snapshot received while the site clock was not known yet
        self._pending_snapshot: wire.JobState | None = None

    @property
    def applied_level(self) -> IntArray:
        """Per card: the DVFS level its rack reports as applied (-1: not reported yet;
        :attr:`AppliedStates.level`)."""
        return self.applied.level

    @property
    def applied_power_limit_w(self) -> npt.NDArray[np.float64]:
        """Per card: the power limit its rack reports as applied (NaN: not reported yet;
        :attr:`AppliedStates.power_limit_w`)."""
        return self.applied.power_limit_w

    @property
    def applied_low_power(self) -> npt.NDArray[np.float64]:
        """Per card: the low-power state its rack reports as applied (1.0 asleep, 0.0 awake or waking;
        NaN: not reported yet; :attr:`AppliedStates.low_power`)."""
        return self.applied.low_power

    def settle_disprovals(self) -> None:
        """Count the pending disprovals no applied state explained in time
        (:meth:`AppliedStates.settle_disprovals`): after each message (:meth:`handle`) and on the
        service's health tick."""
        self.applied.settle_disprovals()

    # ---- messages -------------------------------------------------------------------------------
    def _observe(self, ts: float) -> bool:
        """The message's timestamp to the site clock; when the clock steps back (of either kind:
        ``SiteClock.corrections``), the belief's times beyond it go back with it
        (``TwinState.clock_went_back``; what was collected before is folded in first), and so do the
        dates job events stamped far ahead were given (at the clock's now: :meth:`_dated`). Only when
        it went back to a new timeline (``SiteClock.timelines_left``) are the stamps seen before the
        old timeline's: the job events' stamps and the newest job stamp taken are forgotten, and the
        applied states hear of it (:meth:`AppliedStates.new_timeline`, then
        :meth:`AppliedStates.clock_stepped_back`). A step back after the clock ran ahead of the site
        (``SiteClock.extrapolation_corrections``: a silence, a stall of the agent's loop) leaves them:
        the message is newer than every stamp seen. False when the clock found the message stamped
        too far ahead of the site's time (``SiteClock.last_was_ahead``): its readings are not taken (a
        reading stamped an hour ahead would keep its rack fresh for an hour, and newer readings would
        be refused as older than it)."""
        corrections, timelines_left = self.clock.corrections, self.clock.timelines_left
        self.clock.observe(ts)
        new_timeline = self.clock.timelines_left != timelines_left
        if self.clock.corrections != corrections:
            now = self.clock.now()
            if now is not None:
                self.flush()
                self.state.clock_went_back(now)
                if not new_timeline:  # the same stamps, their dates (the site's now then) back with the clock
                    for job_id, (stamp_s, date_s) in list(self._event_dates.items()):
                        if date_s > now:
                            self._event_dates[job_id] = (stamp_s, now)
        if new_timeline:
            self._event_dates.clear()  # stamps of the old timeline
            self._jobs_seen = None
            self.applied.new_timeline()
            now_s = self.clock.now()
            self.applied.clock_stepped_back(ts if now_s is None else now_s)
        if self.clock.last_was_ahead:
            self.stats.ahead += 1
            return False
        return True

    def handle(self, msg: wire.Message) -> str:
        """Take one decoded message; returns its kind (``"cards"``, ``"job_event"``, ...)."""
        kind = wire.kind_of(msg).value
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        ts = getattr(msg, "ts_s", math.nan)
        if isinstance(msg, wire.CardBatch):
            if self._observe(ts):
                self._add(msg.rack, ts, cards=self._cards(msg))
        elif isinstance(msg, wire.CduReading):
            if self._observe(ts):
                speed = math.nan if msg.pump_speed_frac is None else msg.pump_speed_frac  # NaN: unknown
                loop = LoopReading(msg.supply_temp_c, msg.return_temp_c, msg.flow_lpm, msg.pump_power_w, speed)
                self._add(msg.rack, ts, loop=loop)
        elif isinstance(msg, wire.PduReading):
            if self._observe(ts):
                self._add(msg.rack, ts, pdu=PduReading(msg.power_w))
        elif isinstance(msg, wire.FacilityReading):
            if not self._observe(ts):
                return kind
            if self._facility is not None:
                self.flush()
            self._facility = FacilityReading(
                time_s=ts,
                ambient_temp_c=msg.ambient_temp_c,
                facility_supply_temp_c=msg.supply_temp_c,
                facility_return_temp_c=msg.return_temp_c,
                cooling_power_w=msg.cooling_power_w,
                it_power_w=msg.it_power_w,
                facility_power_w=msg.facility_power_w,
                supply_setpoint_c=msg.supply_setpoint_c,
            )
            self._round_t = max(self._round_t, ts)
        elif isinstance(msg, wire.JobEvent):
            ahead = not self._observe(ts)
            ev = self._event(msg)
            if ev is None:
                if not ahead:
                    self._newer_than_jobs_seen(msg.ts_s, msg.seq)
            else:
                ev = self._dated(ev, ahead)
                # noted at its date, not at a stamp the clock ignored: stamped an hour ahead, it had every
                # snapshot of that hour read as older than it (the catch-up blocked)
                self._newer_than_jobs_seen(ev.time_s, msg.seq)
                self.flush()
                self.state.apply_events([ev])
                self.stats.job_events += 1
                if self.on_event is not None:
                    self.on_event(ev)
        elif isinstance(msg, wire.JobState):
            self._pending_snapshot = msg  # retained: it never drives the clock, and waits for it
        elif isinstance(msg, wire.Acknowledgement):
            self._observe(ts)
            if self.on_ack is not None:
                self.on_ack(msg)
        elif isinstance(msg, wire.AppliedState):
            self.applied.take(msg)
        else:
            self.stats.ignored += 1
        if self._pending_snapshot is not None:
            self._take_pending_snapshot()
        self.settle_disprovals()
        return kind

    def _cards(self, b: wire.CardBatch) -> CardBatch | None:
        r = self._rack.get(b.rack)
        if r is None:
            return None
        local = np.asarray(b.card_index, dtype=np.int64)
        idx = local + r * self._cpr
        clock = np.asarray(b.sm_clock_mhz, dtype=np.float64)
        power = np.asarray(b.power_w, dtype=np.float64)
        low = np.asarray(b.low_power, dtype=bool)
        # failed: awake at 0 MHz and (about) 0 W; a missing power reading (NaN) of a card at 0 MHz
        # too; a card whose clock reading is missing, negative or implausible keeps what the belief
        # knew, and its level too until the rack reports the levels it applied
        with np.errstate(invalid="ignore"):
            plausible = np.isfinite(clock) & (clock >= 0.0) & (clock <= self.state.max_plausible_clock_mhz)
            failed = np.where(plausible, ~low & (clock <= 0.0) & ~(power > 0.5), self.state.card_failed[idx])
            from_clock = np.abs(clock[:, None] - self._clocks[None, :]).argmin(axis=1)
        self.applied.note_reading(
            r, idx, b.ts_s, np.where(plausible, clock, np.nan), low, np.asarray(b.power_limit_w, dtype=np.float64)
        )
        known = self.applied.level[idx]
        level = np.where(known >= 0, known, np.where(plausible & (clock > 0), from_clock, -1)).astype(np.int64)
        return CardBatch(
            card_index=idx,
            power_w=power,
            die_temp_c=np.asarray(b.temp_c, dtype=np.float64),
            clock_mhz=clock,
            utilization=np.asarray(b.utilization, dtype=np.float64),
            level=level,
            low_power=low,
            waking=np.zeros(idx.size, dtype=bool),
            power_limit_w=np.asarray(b.power_limit_w, dtype=np.float64),
            failed=failed,
            host_off=None if b.host_off is None else np.asarray(b.host_off, dtype=bool),
        )

    def _event(self, m: wire.JobEvent) -> JobEvent | None:
        kind = _EVENT_KINDS.get(m.event)
        if kind is None:
            return None
        cards = () if m.cards is None else self._site_cards(m.cards)
        phase = m.phase if m.phase is not None else Phase.WAITING
        return JobEvent(
            time_s=m.ts_s, job_id=m.job_id, kind=kind, phase=phase, cards=cards, job=m.job, detail=m.reason or ""
        )

    def _site_cards(self, cards: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
        """rack -> rack-local card indices (the wire's card map) as sorted site indices."""
        out: list[int] = []
        for rack, local in cards.items():
            r = self._rack.get(rack)
            if r is not None:
                out.extend(int(c) + r * self._cpr for c in local if 0 <= c < self._cpr)
        return tuple(sorted(out))

    def _newer_than_jobs_seen(self, ts_s: float, seq: int) -> bool:
        """Whether a job event or snapshot stamped ``(ts_s, seq)`` is newer than every one taken before
        (the scheduler numbers both with one counter); notes it as the newest when it is. A job event
        stamped far ahead of the site clock is given at the date :meth:`_dated` gave it, not its stamp."""
        key = (ts_s, seq)
        if self._jobs_seen is not None and key <= self._jobs_seen:
            return False
        self._jobs_seen = key
        return True

    def _take_pending_snapshot(self) -> None:
        """The job snapshot received last, once the site clock is known: ignored when stamped ahead of
        the site's time by more than the clock's ahead tolerance (a retained copy from an earlier run of
        the scheduler, on another timeline), else reconciled (:meth:`_catch_up`), also when stamped
        hours behind (a quiet site's: see the module docstring)."""
        msg, now = self._pending_snapshot, self.clock.now()
        if msg is None or now is None:
            return
        self._pending_snapshot = None
        if not math.isfinite(msg.ts_s) or self.clock.stamped_too_far_ahead(msg.ts_s):
            self.stats.job_snapshots_ahead += 1
            log.warning(
                "job snapshot of %s stamped %.3f is %.0f s ahead of the site clock (%.3f): from another timeline "
                "(an earlier run of the scheduler?), ignored",
                msg.publisher,
                msg.ts_s,
                msg.ts_s - now,
                now,
            )
            return
        self._catch_up(msg)

    def _catch_up(self, msg: wire.JobState) -> None:
        """The scheduler's job snapshot (``agent.job_catchup``): taken when it is newer than the last
        job event (or snapshot) taken, else ignored (a retained copy that arrived after newer events)."""
        if not self._newer_than_jobs_seen(msg.ts_s, msg.seq):
            self.stats.job_snapshots_old += 1
            return
        self.stats.job_snapshots += 1
        time_s = msg.ts_s
        site_cards = {e.job_id: self._site_cards(e.cards) for e in msg.jobs if e.cards is not None}
        catch = reconcile(msg, self.state.jobs, site_cards, time_s)
        if not catch.changed:
            return
        self.flush()
        self.state.apply_events(catch.events)
        self.stats.job_snapshots_changed += 1
        self.stats.job_snapshot_added += catch.added
        self.stats.job_snapshot_corrected += catch.corrected
        self.stats.job_snapshot_dropped += catch.dropped
        log.info(
            "job snapshot of %s (ts %.3f, seq %d, %d jobs) changed the agent's job table: %d added, %d corrected, "
            "%d dropped",
            msg.publisher,
            msg.ts_s,
            msg.seq,
            len(msg.jobs),
            catch.added,
            catch.corrected,
            catch.dropped,
        )
        if self.on_event is not None:
            for ev in catch.events:
                self.on_event(ev)

    def _dated(self, ev: JobEvent, ahead: bool) -> JobEvent:
        """``ev`` dated in site time. One stamped far ahead of the site clock (``ahead``) happened, but
        not an hour from now: it is dated at the site's now, yet in its stamp's order among its job's
        events: later than the job's last event when stamped later, at that event's date when stamped
        the same (a copy: at-least-once delivery), before it when stamped before (overtaken). Dated
        at now alone, a copy of a job's ``started`` looked like a restart to the belief and reset
        its phase."""
        last = self._event_dates.get(ev.job_id)
        t = ev.time_s
        if ahead:
            now = self.clock.now()
            t = now if now is not None else ev.time_s
            if last is not None:
                stamp_s, date_s = last
                t = max(t, math.nextafter(date_s, math.inf)) if ev.time_s > stamp_s else date_s - (stamp_s - ev.time_s)
        if last is None or ev.time_s >= last[0]:
            self._event_dates.pop(ev.job_id, None)  # most recent last: the oldest is forgotten first
            self._event_dates[ev.job_id] = (ev.time_s, t)
            if len(self._event_dates) > _DATES_KEPT:
                del self._event_dates[next(iter(self._event_dates))]
        return ev if t == ev.time_s else replace(ev, time_s=t)

    # ---- rounds ---------------------------------------------------------------------------------
    def _add(
        self,
        rack: str,
        ts: float,
        *,
        cards: CardBatch | None = None,
        loop: LoopReading | None = None,
        pdu: PduReading | None = None,
    ) -> None:
        r = self._rack.get(rack)
        if r is None:
            return
        part = self._round.get(r)
        clash = part is not None and (
            (cards is not None and part.cards is not None)
            or (loop is not None and part.loop is not None)
            or (pdu is not None and part.pdu is not None)
        )
        if clash:
            self.flush()
            part = None
        if part is None:
            part = self._round[r] = _Partial(ts)
        part.time_s = max(part.time_s, ts)
        # each part keeps its own time: a card exporter that lags behind a current CDU and PDU must
        # not be taken as fresh (its cards' seen times are what staleness is judged on)
        if cards is not None:
            part.cards, part.cards_time_s = cards, ts
        if loop is not None:
            part.loop, part.loop_time_s = loop, ts
        if pdu is not None:
            part.pdu, part.pdu_time_s = pdu, ts
        self._round_t = max(self._round_t, ts)

    def flush(self) -> Readings | None:
        """Fold the collected round into the belief; returns it (None when there was nothing). Every
        round folded, also by the flushes of :meth:`handle` (before a job event, a second reading of a
        kind, a clock stepping back), goes to ``on_round`` (the service's estimator)."""
        if not self._round and self._facility is None:
            return None
        racks = tuple(
            RackReading(
                rack=r,
                time_s=p.time_s,
                cards=p.cards,
                loop=p.loop,
                pdu=p.pdu,
                cards_time_s=p.cards_time_s,
                loop_time_s=p.loop_time_s,
                pdu_time_s=p.pdu_time_s,
            )
            for r, p in sorted(self._round.items())
        )
        readings = Readings(time_s=self._round_t, racks=racks, facility=self._facility)
        self._round = {}
        self._facility = None
        self._round_t = -math.inf
        self.state.update(readings)
        self.stats.rounds += 1
        if self.on_round is not None:
            self.on_round(readings)
        return readings
