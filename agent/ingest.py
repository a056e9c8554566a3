"""Incoming wire messages -> the agent's belief (``twin.state.TwinState``) and the site clock.

:class:`Ingest` takes decoded messages (``agent.wire``) one by one:

* telemetry (card batches, CDU, PDU, facility) becomes ``twin.readings`` objects, collected into
  *rounds* (:class:`twin.readings.Readings` with at most one reading of each kind per rack) that
  :meth:`Ingest.flush` folds into the ``TwinState`` in arrival order. Rack-local card indices
  become site indices; the DVFS level of each card is what the rack last reported as applied
  (``racktwin.applied/1``) or, before that, the level of its clock; a card reading 0 W at 0 MHz
  while awake has failed (that is how a rack reports a dead card);
* a card reading disproves what the rack confirmed where it cannot be (:meth:`Ingest._disprove`):
  stamped after the applied state by more than the rack's confirmation margin
  (:data:`CONFIRMATION_MARGIN_S`, or :data:`CONFIRMATION_PERIODS` of the rack's reading interval where
  that is longer: the interval is learnt from the stamps of its card readings,
  :attr:`Ingest.reading_interval_s`), a clock more than half a DVFS step above the confirmed level's
  (a card never runs faster than its applied level allows), a card awake that was confirmed asleep, a
  power limit apart from the confirmed one; that part of the confirmation is forgotten at once, so the
  level comes from the clock again and the commands' diff commands the card again. The retained applied
  state outlives a rack that reset its cards or had them changed without republishing it: trusted, it
  had the agent plan such a card at the old slower level and never command it; a copy of the one a
  reading disproved (handed over again at a new subscription) is not taken
  (:meth:`Ingest._disproved_copies`). The disproval is counted (:class:`IngestStats`, exported as
  ``racktwin_applied_state_disproved_total``) only when no late applied state explains it
  (:meth:`Ingest._explain`: the reading that showed the agent's own command overtook its rack's applied
  state) by the time the site clock is the rack's confirmation margin plus the telemetry deadline past
  the reading (:meth:`Ingest.settle_disprovals`: after each message, and on the service's health tick,
  so that a count does not wait for the telemetry to come back after a silence);
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
* acks are handed to the caller (``on_ack``); applied states are kept (``applied_level``,
  ``applied_power_limit_w``, ``applied_low_power``: what each rack confirmed applying to each card,
  which its telemetry shows up to one period later), but not for a card whose applied state taken is
  stamped after the new one and not after the site's now (:meth:`Ingest._older_than_taken`: a second
  publisher for the rack, a broker bridge reordering; counted in ``IngestStats.applied_states_old``
  and logged): taken, it set the cards back to settings the rack had left and the next reading
  counted a reset that never happened. The one refused last per rack is tried again when the site
  clock steps back (a restarted rack's, stamped on its new timeline before the old one's);
* every round folded into the belief is handed to ``on_round`` (the service's estimator);
* every other message's timestamp drives the :class:`agent.clock.SiteClock`.

What a flush folds in is also returned; :class:`agent.round_merger.RoundMerger` merges those partial readings
into one :class:`twin.readings.Readings` per telemetry round for the estimator.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.clock import SiteClock
from agent.job_catchup import reconcile
from twin.readings import CardBatch, FacilityReading, JobEvent, LoopReading, PduReading, RackReading, Readings
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import Phase

IntArray = npt.NDArray[np.int64]

__all__ = ["DISPROVABLE_SETTINGS", "Ingest", "IngestStats"]

log = logging.getLogger("racktwin.agent.ingest")

#: jobs whose latest event stamp is remembered (to date events stamped far ahead in their order)
_DATES_KEPT = 4096

#: a card reading stamped more than this after its rack's applied state may disprove it
#: (:meth:`Ingest._disprove`): a reading stamped earlier may have been taken before the setting
#: applied. 1.5 telemetry periods at the 1 s period of every example site; a rack that reads its cards
#: less often gets :data:`CONFIRMATION_PERIODS` of its own interval instead (the agent is not told the
#: period: it learns it from the stamps, :attr:`Ingest.reading_interval_s`)
CONFIRMATION_MARGIN_S = 1.5
#: ... at least this many of the rack's reading intervals. A reading stamped ``t`` may show its cards
#: as they were at any time of the period before ``t`` (a sample taken at the period's start and sent
#: at its end, or an average over the period): only one stamped more than a whole period after the
#: applied state was surely taken after the setting applied; the half period more is room for the
#: stamps' jitter and a rack whose interval varies. A longer margin only delays, by that much, the
#: agent's noticing a rack reset without a new applied state; a shorter one has it forget, and command
#: again, settings the rack did apply (a 5 s rack's reading 3 s after a slow-down, taken before it).
CONFIRMATION_PERIODS = 1.5
#: a rack's reading interval is the median of its last this many gaps between the stamps of its cards'
#: successive readings (positive gaps no longer than the telemetry deadline: a copy, a late reading or a
#: silence is no period), known once it has :data:`_INTERVAL_MIN_GAPS` of them (one odd gap is no period
#: either); a gap is a card's, not the rack's: a rack may send its cards in several batches stamped apart
_INTERVAL_GAPS = 7
_INTERVAL_MIN_GAPS = 3
#: a power limit reading this far from the confirmed one disproves it (the wire's 0.1 W, with room)
_LIMIT_TOL_W = 0.5
#: the settings of a rack's applied state a card reading may disprove, in the order of :class:`Ingest`'s
#: pending disprovals (``racktwin_applied_state_disproved_total{setting}``)
DISPROVABLE_SETTINGS = ("level", "power_limit", "low_power")
_LEVEL, _LIMIT, _LOW = range(3)


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
    #: or ``low_power`` (:data:`DISPROVABLE_SETTINGS`), a later reading disproved and no late applied state
    #: explained (:meth:`Ingest._disprove`): a rack reset or changed outside the agent's commands, not
    #: republished. Counted once the bound passed (:meth:`Ingest.settle_disprovals`)
    applied_disproved: dict[tuple[str, str], int] = field(default_factory=dict)
    #: disprovals a late applied state explained (the agent's own command: the rack's applied state
    #: reached the agent after a reading that already showed it), not counted above
    applied_disprovals_explained: int = 0
    #: applied states older, for some of their cards, than the one taken for them: not taken for those cards
    #: (a second publisher for the rack, messages reordered; :meth:`Ingest._older_than_taken`)
    applied_states_old: int = 0

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
        #: per card: the DVFS level the rack reports as applied (-1: not reported yet)
        self.applied_level = np.full(site.n_cards, -1, dtype=np.int64)
        #: per card: the power limit the rack reports as applied (NaN: not reported yet)
        self.applied_power_limit_w = np.full(site.n_cards, np.nan)
        #: per card: the low-power state the rack reports as applied (1.0 asleep, 0.0 awake or waking;
        #: NaN: not reported yet)
        self.applied_low_power = np.full(site.n_cards, np.nan)
        #: per card: the stamp of the applied state that confirmed it (NaN: none)
        self._applied_ts_s = np.full(site.n_cards, np.nan)
        #: ... and its ``seq`` (-1: none)
        self._applied_seq = np.full(site.n_cards, -1, dtype=np.int64)
        #: per card: the stamp and ``seq`` of the applied state a reading disproved last (NaN, -1: none), to
        #: tell a copy of it (:meth:`_disproved_copies`)
        self._disproved_ts_s = np.full(site.n_cards, np.nan)
        self._disproved_seq = np.full(site.n_cards, -1, dtype=np.int64)
        #: per level k >= 1: halfway between its clock and the next faster level's (level 0: +inf)
        self._faster_than_mhz = np.concatenate(([math.inf], 0.5 * (self._clocks[1:] + self._clocks[:-1])))
        #: a gap between a rack's card readings longer than this is a silence, not its period (the
        #: deadline after which the controller takes the rack for stale, ``control.telemetry_deadline_s``)
        self.telemetry_deadline_s = telemetry_deadline_s
        #: per rack: the site seconds between two readings of its cards, the median of its last gaps
        #: (:data:`_INTERVAL_GAPS`; NaN: not known yet, before :data:`_INTERVAL_MIN_GAPS` gaps)
        self.reading_interval_s = np.full(site.n_racks, np.nan)
        self._gaps_s: list[deque[float]] = [deque(maxlen=_INTERVAL_GAPS) for _ in range(site.n_racks)]
        #: per card: the stamp of its newest reading (NaN: none yet, or the site clock stepped back)
        self._cards_ts_s = np.full(site.n_cards, np.nan)
        #: per setting (:data:`DISPROVABLE_SETTINGS`) and card: a disproval not counted yet
        #: (:meth:`_disprove`), as the newest stamp an applied state that explains it may have (the
        #: reading's stamp plus the rack's confirmation margin; NaN: none pending)
        self._explain_by_s = np.full((len(DISPROVABLE_SETTINGS), site.n_cards), np.nan)
        #: per card: what the reading of a pending disproval showed, its clock and its power limit
        self._shown_clock_mhz = np.full(site.n_cards, np.nan)
        self._shown_limit_w = np.full(site.n_cards, np.nan)
        #: no pending disproval is due before this site time (inf: none pending)
        self._next_due_s = math.inf
        self._round: dict[int, _Partial] = {}
        self._facility: FacilityReading | None = None
        self._round_t = -math.inf
        # per job: the newest stamp of its events and the site time it was dated at
        self._event_dates: dict[str, tuple[float, float]] = {}
        #: (ts, seq) of the newest job event or job snapshot taken (None: none yet, or the clock went back)
        self._jobs_seen: tuple[float, int] | None = None
        #: the newest job snapshot received while the site clock was not known yet
        self._pending_snapshot: wire.JobState | None = None
        #: per rack: the newest applied state refused as older than the one taken (:meth:`_refuse_older`)
        self._older_applied: dict[int, wire.AppliedState] = {}

    # ---- messages -------------------------------------------------------------------------------
    def _observe(self, ts: float) -> bool:
        """The message's timestamp to the site clock; when the clock steps back, the belief's times
        beyond it go back with it (``TwinState.clock_went_back``; what was collected on the old
        timeline is folded in first). False when the clock found the message stamped too far ahead
        of the site's time (``SiteClock.last_was_ahead``): its readings are not taken (a reading
        stamped an hour ahead would keep its rack fresh for an hour, and newer readings would be
        refused as older than it). When the clock steps back, the applied state refused last per rack as
        older than the one taken (:meth:`_refuse_older`) is tried again: a restarted rack's first, on
        its new timeline, comes before the telemetry that has the clock follow it back."""
        corrections, timelines_left = self.clock.corrections, self.clock.timelines_left
        self.clock.observe(ts)
        if self.clock.corrections != corrections:
            now = self.clock.now()
            if now is not None:
                self.flush()
                self.state.clock_went_back(now)
            self._event_dates.clear()  # stamps of the old timeline
            self._jobs_seen = None
            self._cards_ts_s.fill(np.nan)  # (a rack's reading interval stays: its period did not change)
        if self.clock.timelines_left != timelines_left:
            # an applied state of the new timeline cannot explain a reading of the old one; after a mere
            # step back (the clock ran ahead during a silence: a broker outage, a late batch) the late
            # applied state of the same timeline may still come and explain it
            self._count_disprovals(np.isfinite(self._explain_by_s))
            self._disproved_ts_s.fill(np.nan)  # a restarted rack's applied state may repeat a stamp and seq
        if self.clock.corrections != corrections:
            older, self._older_applied = self._older_applied, {}
            for msg in older.values():  # refused as older than the old timeline's: maybe the new one's
                self._applied_state(msg, again=True)
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
            self._applied_state(msg)
        else:
            self.stats.ignored += 1
        if self._pending_snapshot is not None:
            self._take_pending_snapshot()
        self.settle_disprovals()
        return kind

    def _applied_state(self, msg: wire.AppliedState, *, again: bool = False) -> None:
        """Keep what a rack confirmed applying to each card it names, but not for a card where ``msg`` is
        a copy of the applied state a reading disproved (:meth:`_disproved_copies`) or older than the one
        taken (:meth:`_older_than_taken`; counted and kept, unless ``again``: the kept one, tried again
        when the site clock stepped back)."""
        r = self._rack.get(msg.rack)
        if r is None:
            return
        idx = np.asarray(msg.card_index, dtype=np.int64)
        ok = (idx >= 0) & (idx < self._cpr)
        ok[np.flatnonzero(ok)[self._disproved_copies(idx[ok] + r * self._cpr, msg)]] = False
        older = self._older_than_taken(idx[ok] + r * self._cpr, msg)
        if older.any():
            if not again:
                self._refuse_older(r, msg, idx[ok][older] + r * self._cpr)
            ok[np.flatnonzero(ok)[older]] = False
        elif ok.any():
            self._older_applied.pop(r, None)  # the rack spoke since the one kept: that one is no new timeline's
        lv = np.asarray(msg.dvfs_level, dtype=np.int64)[ok]
        good = (lv >= 0) & (lv < self._clocks.size)
        self.applied_level[idx[ok][good] + r * self._cpr] = lv[good]
        lim = np.asarray(msg.power_limit_w, dtype=np.float64)[ok]
        known = np.isfinite(lim) & (lim > 0.0)
        self.applied_power_limit_w[idx[ok][known] + r * self._cpr] = lim[known]
        self.applied_low_power[idx[ok] + r * self._cpr] = np.asarray(msg.low_power, dtype=bool)[ok]
        self._applied_ts_s[idx[ok] + r * self._cpr] = msg.ts_s
        self._applied_seq[idx[ok] + r * self._cpr] = msg.seq
        self._explain(idx[ok] + r * self._cpr, msg, ok)

    def _older_than_taken(self, cards: IntArray, msg: wire.AppliedState) -> npt.NDArray[np.bool_]:
        """Which of ``cards`` (site indices) hold an applied state stamped after ``msg`` and not after the
        site's now. MQTT keeps the order of one topic's messages, but a second publisher for the rack (a
        stale bridge) or a broker bridge can deliver an older one after a newer: taken, it set the cards
        back to settings the rack had left (the diff commanded them again), and the next reading, showing
        the newer setting, disproved it and counted a reset that never happened
        (``racktwin_applied_state_disproved_total``). A taken one stamped after the site's now may be another
        timeline's (a retained copy an earlier run left, the site's clock since gone back): the rack's
        applied state on the new timeline, stamped before it, is taken; one refused while the clock had
        not yet followed the site back is taken when it does (:meth:`_observe`)."""
        now = self.clock.now()
        if now is None:
            return np.zeros(cards.size, dtype=bool)
        held_s = self._applied_ts_s[cards]
        return np.asarray((msg.ts_s < held_s) & (held_s <= now), dtype=np.bool_)  # False where NaN

    def _refuse_older(self, r: int, msg: wire.AppliedState, cards: IntArray) -> None:
        """Count and log rack ``r``'s applied state ``msg``, older than the one taken for ``cards``, and
        keep it (the newest such per rack) to be taken if the site clock steps back (:meth:`_observe`)."""
        self.stats.applied_states_old += 1
        kept = self._older_applied.get(r)
        if kept is None or msg.ts_s >= kept.ts_s:
            self._older_applied[r] = msg
        log.info(
            "applied state of %s from %s (ts %.3f, seq %d) is older than the one taken for %d of its cards "
            "(ts %.3f): not taken for them (a second publisher for the rack, or messages reordered)",
            msg.rack,
            msg.publisher,
            msg.ts_s,
            msg.seq,
            cards.size,
            float(np.nanmax(self._applied_ts_s[cards])),
        )

    def _cards(self, b: wire.CardBatch) -> CardBatch | None:
        r = self._rack.get(b.rack)
        if r is None:
            return None
        local = np.asarray(b.card_index, dtype=np.int64)
        idx = local + r * self._cpr
        margin_s = self._confirmation_margin_s(r, idx, b.ts_s)
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
        self._disprove(
            idx,
            b.ts_s,
            margin_s,
            np.where(plausible, clock, np.nan),
            low,
            np.asarray(b.power_limit_w, dtype=np.float64),
        )
        known = self.applied_level[idx]
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

    def _confirmation_margin_s(self, r: int, idx: IntArray, ts_s: float) -> float:
        """Rack ``r``'s confirmation margin, once its reading of cards ``idx`` stamped ``ts_s`` is counted
        into its reading interval (:attr:`reading_interval_s`): :data:`CONFIRMATION_PERIODS` of the
        interval, at least :data:`CONFIRMATION_MARGIN_S` (all of it while the interval is not known).
        The gap is to the newest earlier reading of the same cards, not of the rack: a rack whose cards
        come in several batches (one per host, stamped apart) reads each card once a period."""
        prev_s = self._cards_ts_s[idx]
        last_s = float(np.fmax.reduce(prev_s)) if prev_s.size else math.nan  # NaN: none of them read yet
        gap_s = ts_s - last_s
        if 0.0 < gap_s <= self.telemetry_deadline_s:
            gaps = self._gaps_s[r]
            gaps.append(gap_s)
            if len(gaps) >= _INTERVAL_MIN_GAPS:
                self.reading_interval_s[r] = sorted(gaps)[len(gaps) // 2]
        self._cards_ts_s[idx] = np.fmax(prev_s, ts_s)  # a late reading leaves the newer stamps
        interval_s = float(self.reading_interval_s[r])
        if interval_s * CONFIRMATION_PERIODS > CONFIRMATION_MARGIN_S:  # False while NaN
            return interval_s * CONFIRMATION_PERIODS
        return CONFIRMATION_MARGIN_S

    def _disprove(
        self,
        idx: IntArray,
        ts_s: float,
        margin_s: float,
        clock_mhz: npt.NDArray[np.float64],
        low: npt.NDArray[np.bool_],
        limit_w: npt.NDArray[np.float64],
    ) -> None:
        """Forget what a card reading stamped ``ts_s`` disproves of its rack's confirmation (the
        retained applied state outlives the rack: reset to defaults or changed by an operator, a rack
        that does not republish would have the agent believe, and never command, the old settings).
        A card never runs faster than its applied level's clock, so a clock (``clock_mhz``, NaN where
        implausible) nearer a faster level's clock than the confirmed level's (above halfway to it:
        a reading's noise and averaging stay well under half a DVFS step, and it is the rule levels
        are read from clocks by) disproves the confirmed level; a reading awake, a confirmed sleep; a
        reading's power limit more than 0.5 W from the confirmed one, that limit. Only readings
        stamped more than ``margin_s`` (:meth:`_confirmation_margin_s`) after the applied state count
        (just after a confirmed slow-down, a reading taken before it applied still shows the faster
        clock: up to a telemetry period after it applied, whether sampled or averaged), or any
        when the applied state is stamped too far ahead of the site clock (a retained copy from an
        earlier run of the rack, on another timeline); none of a card or rack the belief holds stuck
        (``TwinState.stuck_cards``, ``stuck_racks``)."""
        at = self._applied_ts_s[idx]
        after = ts_s > at + margin_s  # False where NaN: nothing confirmed
        pending = at[np.isfinite(at) & ~after]
        for t in np.unique(pending) if pending.size else ():
            if self.clock.stamped_too_far_ahead(float(t)):
                after |= at == t
        if not after.any():
            return
        known = self.applied_level[idx]
        with np.errstate(invalid="ignore"):
            faster = after & (known >= 1) & (clock_mhz > self._faster_than_mhz[np.maximum(known, 0)])
            conf_lim = self.applied_power_limit_w[idx]
            lim_off = after & (limit_w > 0.0) & (np.abs(limit_w - conf_lim) > _LIMIT_TOL_W)
        awake = after & ~low & (self.applied_low_power[idx] == 1.0)
        if not (faster.any() or lim_off.any() or awake.any()):
            return
        stuck_cards, stuck_racks = self.state.stuck_cards(), self.state.stuck_racks()
        if stuck_cards or stuck_racks:  # a frozen sensor repeats the clock it read before a slow-down
            frozen = np.isin(idx, stuck_cards) | np.isin(idx // self._cpr, stuck_racks)
            faster, lim_off, awake = faster & ~frozen, lim_off & ~frozen, awake & ~frozen
        hit = idx[faster | lim_off | awake]
        self._disproved_ts_s[hit], self._disproved_seq[hit] = self._applied_ts_s[hit], self._applied_seq[hit]
        if faster.any():
            self.applied_level[idx[faster]] = -1
            self._shown_clock_mhz[idx[faster]] = clock_mhz[faster]
        if lim_off.any():
            self.applied_power_limit_w[idx[lim_off]] = np.nan
            self._shown_limit_w[idx[lim_off]] = limit_w[lim_off]
        if awake.any():
            self.applied_low_power[idx[awake]] = np.nan
        for k, hit in ((_LEVEL, faster), (_LIMIT, lim_off), (_LOW, awake)):
            if hit.any():
                cards = idx[hit]
                # one pending per card and setting: one still pending when its card's setting was confirmed
                # again and disproved again was not explained by then, nor can it be now
                self._count_disprovals(self._pending_of(k, cards))
                self._explain_by_s[k, cards] = ts_s + margin_s
                self._next_due_s = min(self._next_due_s, ts_s + margin_s + self.telemetry_deadline_s)

    def _pending_of(self, k: int, cards: IntArray) -> npt.NDArray[np.bool_]:
        """A mask over the pending disprovals: setting ``k``'s of ``cards`` that are pending."""
        mask = np.zeros(self._explain_by_s.shape, dtype=bool)
        mask[k, cards] = np.isfinite(self._explain_by_s[k, cards])
        return mask

    def _disproved_copies(self, cards: IntArray, msg: wire.AppliedState) -> npt.NDArray[np.bool_]:
        """Which of ``cards`` (site indices) ``msg`` is a copy of the applied state a reading disproved (the
        same stamp and ``seq``): the broker hands a rack's retained applied state over again at every new
        subscription (and QoS 1 may deliver one twice). Such a copy is not taken: taken, it confirmed again
        what the reading had disproved (the belief planned a reset card at its old level, the diff did not
        command it) until the next reading disproved it once more and counted the card a second time."""
        same = (self._disproved_ts_s[cards] == msg.ts_s) & (self._disproved_seq[cards] == msg.seq)
        return np.asarray(same, dtype=np.bool_)

    def _explain(self, cards: IntArray, msg: wire.AppliedState, ok: npt.NDArray[np.bool_]) -> None:
        """Cancel the pending disprovals of ``cards`` (site indices) that their rack's applied state
        ``msg`` (its entries ``ok``) explains: stamped no later than the disproving reading's stamp plus
        the rack's confirmation margin, and agreeing with what that reading showed (a clock its level
        allows, its power limit, awake). MQTT keeps no order between a QoS 0 reading and a QoS 1 applied
        state: the reading that showed a setting the agent had just commanded, applied, often reached the
        agent before the applied state stamped up to a second before it (0.3 to 2.2 site s after the
        reading in a demo run), and disproved the confirmation before it: the agent's own command, not a
        change behind its back."""
        within = msg.ts_s <= self._explain_by_s[:, cards]  # False where NaN: none pending
        if not within.any():
            return
        lv = np.asarray(msg.dvfs_level, dtype=np.int64)[ok]
        valid = (lv >= 0) & (lv < self._clocks.size)
        lim = np.asarray(msg.power_limit_w, dtype=np.float64)[ok]
        with np.errstate(invalid="ignore"):
            allowed = valid & ~(self._shown_clock_mhz[cards] > self._faster_than_mhz[np.where(valid, lv, 0)])
            same_limit = np.abs(self._shown_limit_w[cards] - lim) <= _LIMIT_TOL_W
        awake = ~np.asarray(msg.low_power, dtype=bool)[ok]
        explained = within & np.stack((allowed, same_limit, awake))
        if explained.any():
            sel, col = np.nonzero(explained)
            self._explain_by_s[sel, cards[col]] = np.nan
            self.stats.applied_disprovals_explained += int(sel.size)

    def settle_disprovals(self) -> None:
        """Count the pending disprovals no applied state explained in time: the site clock (``now``) is
        past the reading's stamp plus the rack's confirmation margin plus the telemetry deadline. An
        applied state that late is as late as telemetry the agent takes for stale (its rack at fail-safe
        caps), 15 times the latest measured in a demo run (2.2 s), and a reset shows in the counts about
        half a minute (1.5 + 30 s by default) after the first reading that showed it.

        Called after each message (:meth:`handle`) and, without messages, on the service's health tick
        while it is connected to the broker (``agent.service``): in a silence the site clock's ``now``
        extrapolates from the newest stamp, so a count shows during a telemetry blackout too. Cheap when
        nothing is due."""
        now = self.clock.now()
        if now is None or not now > self._next_due_s:
            return
        with np.errstate(invalid="ignore"):
            self._count_disprovals(self._explain_by_s + self.telemetry_deadline_s < now)  # False where NaN
        pending = np.isfinite(self._explain_by_s)
        self._next_due_s = (
            float(self._explain_by_s[pending].min()) + self.telemetry_deadline_s if pending.any() else math.inf
        )

    def _count_disprovals(self, mask: npt.NDArray[np.bool_]) -> None:
        """Count the pending disprovals in ``mask`` (setting x card) per setting and rack, and clear them."""
        if not mask.any():
            return
        names = self.site.rack_names
        for k, setting in enumerate(DISPROVABLE_SETTINGS):
            racks, counts = np.unique(np.flatnonzero(mask[k]) // self._cpr, return_counts=True)
            for r, n in zip(racks.tolist(), counts.tolist(), strict=True):
                key = (setting, names[r])
                self.stats.applied_disproved[key] = self.stats.applied_disproved.get(key, 0) + n
        self._explain_by_s[mask] = np.nan

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
