"""What each rack confirmed applying to its cards (``racktwin.applied/1``), and the readings that disprove it.

:class:`AppliedStates` is the ingest's (``agent.ingest.Ingest``) book of its racks' retained applied
states, per site card:

* applied states are kept (:attr:`AppliedStates.level`, :attr:`AppliedStates.power_limit_w`,
  :attr:`AppliedStates.low_power`: what each rack confirmed applying to each card, which its telemetry
  shows up to one period later; the ingest's ``applied_level``, ``applied_power_limit_w`` and
  ``applied_low_power``), but not for a card whose applied state taken is stamped after the new one
  and not after the site's now (:meth:`AppliedStates._older_than_taken`: a second publisher for the
  rack, a broker bridge reordering; counted in ``IngestStats.applied_states_old`` and logged): taken,
  it set the cards back to settings the rack had left and the next reading counted a reset that never
  happened. The ones refused are kept, each with the cards it was refused for (``agent.refused_applied``,
  up to :data:`agent.refused_applied.REFUSED_KEPT_PER_RACK` per rack), and tried again when the site clock
  goes back to a new timeline (a restarted rack's, stamped on its new timeline before the old one's:
  :meth:`AppliedStates.clock_stepped_back`; not when it only steps back after running ahead of the site:
  the stamps seen are still the site's);
* a card reading disproves what the rack confirmed where it cannot be (:meth:`AppliedStates._disprove`):
  stamped after the applied state by more than the rack's confirmation margin
  (:data:`CONFIRMATION_MARGIN_S`, or :data:`CONFIRMATION_PERIODS` of the rack's reading interval where
  that is longer: the interval is learnt from the stamps of its card readings,
  :attr:`AppliedStates.reading_interval_s`), a clock more than half a DVFS step above the confirmed
  level's (a card never runs faster than its applied level allows), a card awake that was confirmed
  asleep, a power limit apart from the confirmed one; that part of the confirmation is forgotten at
  once, so the level comes from the clock again and the commands' diff commands the card again. The
  retained applied state outlives a rack that reset its cards or had them changed without republishing
  it: trusted, it had the agent plan such a card at the old slower level and never command it; a copy
  of the one a reading disproved (handed over again at a new subscription) is not taken
  (:meth:`AppliedStates._disproved_copies`). The disproval is counted (``IngestStats``, exported as
  ``racktwin_applied_state_disproved_total``) only when no late applied state explains it
  (:meth:`AppliedStates._explain`: the reading that showed the agent's own command overtook its rack's
  applied state) by the time the site clock is the rack's confirmation margin plus the telemetry
  deadline past the reading (:meth:`AppliedStates.settle_disprovals`: after each message, and on the
  service's health tick, so that a count does not wait for the telemetry to come back after a silence),
  and logged (a warning naming the rack, the setting and its cards); a card's confirmation taken while
  its disproval was pending, stamped within that one's bound, and disproved again is the same disproval
  (:meth:`AppliedStates._hold_pending`: the card counts once at most, and the applied state that
  explains the first explains it).

The ingest hands it each applied state (:meth:`AppliedStates.take`), each card reading
(:meth:`AppliedStates.note_reading`, before it reads the cards' levels from :attr:`AppliedStates.level`)
and the site clock's going back to a new timeline (:meth:`AppliedStates.new_timeline`, then
:meth:`AppliedStates.clock_stepped_back`); it counts into the ingest's ``IngestStats`` and logs as the
ingest (``racktwin.agent.ingest``).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.clock import SiteClock
from agent.refused_applied import REFUSED_KEPT_PER_RACK, RefusedApplied
from twin.spec import SiteSpec
from twin.state import TwinState

if TYPE_CHECKING:  # the ingest holds an AppliedStates and hands it its stats
    from agent.ingest import IngestStats

IntArray = npt.NDArray[np.int64]

__all__ = ["CONFIRMATION_MARGIN_S", "CONFIRMATION_PERIODS", "DISPROVABLE_SETTINGS", "AppliedStates"]

log = logging.getLogger("racktwin.agent.ingest")

#: a card reading stamped more than this after its rack's applied state may disprove it
#: (:meth:`AppliedStates._disprove`): a reading stamped earlier may have been taken before the setting
#: applied. 1.5 telemetry periods at the 1 s period of every example site; a rack that reads its cards
#: less often gets :data:`CONFIRMATION_PERIODS` of its own interval instead (the agent is not told the
#: period: it learns it from the stamps, :attr:`AppliedStates.reading_interval_s`)
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
#: How far ahead of the new timeline's now a refused applied state may be stamped and still be tried again
#: when the site clock goes back (:meth:`AppliedStates.clock_stepped_back`): racks' clocks differ by
#: milliseconds, and a restarted rack's applied state precedes the readings the clock follows back.
RETRY_AHEAD_S = 1.0
#: the settings of a rack's applied state a card reading may disprove, in the order of
#: :class:`AppliedStates`'s pending disprovals (``racktwin_applied_state_disproved_total{setting}``)
DISPROVABLE_SETTINGS = ("level", "power_limit", "low_power")
_LEVEL, _LIMIT, _LOW = range(3)


class AppliedStates:
    """The racks' confirmed settings per site card and their disprovals (see the module docstring)."""

    def __init__(
        self, site: SiteSpec, state: TwinState, clock: SiteClock, stats: IngestStats, telemetry_deadline_s: float
    ) -> None:
        self.state = state  # read only: the cards and racks whose sensors the belief holds stuck
        self.clock = clock
        self.stats = stats
        self._rack_names = site.rack_names
        self._rack = {name: i for i, name in enumerate(site.rack_names)}
        self._cpr = site.cards_per_rack
        self._clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
        #: per card: the DVFS level the rack reports as applied (-1: not reported yet)
        self.level = np.full(site.n_cards, -1, dtype=np.int64)
        #: per card: the power limit the rack reports as applied (NaN: not reported yet)
        self.power_limit_w = np.full(site.n_cards, np.nan)
        #: per card: the low-power state the rack reports as applied (1.0 asleep, 0.0 awake or waking;
        #: NaN: not reported yet)
        self.low_power = np.full(site.n_cards, np.nan)
        #: per card: the stamp of the applied state that confirmed it (NaN: none)
        self._ts_s = np.full(site.n_cards, np.nan)
        #: ... and its ``seq`` (-1: none)
        self._seq = np.full(site.n_cards, -1, dtype=np.int64)
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
        #: per card: the stamp of its newest reading (NaN: none yet, or the site clock went back to a new timeline)
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
        #: per rack: the applied states refused as older than the one taken, with the cards they were
        #: refused for (:meth:`_refuse_older`)
        self.refused = RefusedApplied()

    # ---- the site clock stepping back -----------------------------------------------------------
    def new_timeline(self) -> None:
        """The site clock went back to a new timeline (``SiteClock.timelines_left`` grew): the pending
        disprovals are counted (an applied state of the new timeline cannot explain a reading of the old
        one; after a mere step back, the clock having run ahead during a silence, a broker outage, a late
        batch, the late applied state of the same timeline may still come and explain it), and the
        disproved applied states forgotten (a restarted rack's applied state may repeat a stamp and seq).
        Called before :meth:`clock_stepped_back`."""
        self._count_disprovals(np.isfinite(self._explain_by_s))
        self._disproved_ts_s.fill(np.nan)

    def clock_stepped_back(self, now_s: float) -> None:
        """The site clock went back to a new timeline (``SiteClock.timelines_left`` grew) and reads
        ``now_s``: the cards' reading stamps, of the old timeline, are forgotten (a rack's reading interval
        stays: its period did not change), and the applied states refused as older than the one taken
        (:meth:`_refuse_older`) are tried again for the cards they were refused for, oldest-stamped first
        (a card ends at the newest of them), those stamped no later than ``now_s`` (within
        :data:`RETRY_AHEAD_S`): a restarted rack's, on its new timeline, come before the telemetry that has
        the clock follow it back. One stamped further ahead is the old timeline's (a stale bridge's, say)
        and is dropped: the new timeline would take it. Not called after a step back of the clock that ran
        ahead of the site (a silence, a stall of the agent's loop): the stamps seen are the site's still,
        and the one refused, tried against the earlier now, was taken wherever the one held is stamped
        after it."""
        self._cards_ts_s.fill(np.nan)
        for msg, cards in self.refused.take_all():  # refused as older than the old timeline's: maybe the new one's
            if msg.ts_s <= now_s + RETRY_AHEAD_S:
                self._take(msg, cards)

    # ---- applied states -------------------------------------------------------------------------
    def take(self, msg: wire.AppliedState) -> None:
        """Keep what a rack confirmed applying to each card it names, but not for a card where ``msg`` is
        a copy of the applied state a reading disproved (:meth:`_disproved_copies`) or older than the one
        taken (:meth:`_older_than_taken`; counted and kept for those cards, :meth:`_refuse_older`)."""
        self._take(msg, None)

    def _take(self, msg: wire.AppliedState, again: IntArray | None) -> None:
        """:meth:`take`, or with ``again`` the site cards a kept refused ``msg`` is tried again for (when the
        site clock went back to a new timeline), for those only and not refused again."""
        r = self._rack.get(msg.rack)
        if r is None:
            return
        idx = np.asarray(msg.card_index, dtype=np.int64)
        ok = (idx >= 0) & (idx < self._cpr)
        if again is not None:
            ok &= np.isin(idx + r * self._cpr, again)
        ok[np.flatnonzero(ok)[self._disproved_copies(idx[ok] + r * self._cpr, msg)]] = False
        older = self._older_than_taken(idx[ok] + r * self._cpr, msg)
        if older.any():
            if again is None:
                self._refuse_older(r, msg, idx[ok][older] + r * self._cpr)
            ok[np.flatnonzero(ok)[older]] = False
        elif ok.any():
            self.refused.forget(r)  # the rack spoke since the ones kept: they are no new timeline's
        lv = np.asarray(msg.dvfs_level, dtype=np.int64)[ok]
        good = (lv >= 0) & (lv < self._clocks.size)
        self.level[idx[ok][good] + r * self._cpr] = lv[good]
        lim = np.asarray(msg.power_limit_w, dtype=np.float64)[ok]
        known = np.isfinite(lim) & (lim > 0.0)
        self.power_limit_w[idx[ok][known] + r * self._cpr] = lim[known]
        self.low_power[idx[ok] + r * self._cpr] = np.asarray(msg.low_power, dtype=bool)[ok]
        self._ts_s[idx[ok] + r * self._cpr] = msg.ts_s
        self._seq[idx[ok] + r * self._cpr] = msg.seq
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
        not yet followed the site back is taken when it does (:meth:`clock_stepped_back`)."""
        now = self.clock.now()
        if now is None:
            return np.zeros(cards.size, dtype=bool)
        held_s = self._ts_s[cards]
        return np.asarray((msg.ts_s < held_s) & (held_s <= now), dtype=np.bool_)  # False where NaN

    def _refuse_older(self, r: int, msg: wire.AppliedState, cards: IntArray) -> None:
        """Count and log rack ``r``'s applied state ``msg``, older than the one taken for ``cards``, and
        keep it for those cards, to be taken if the site clock goes back to a new timeline
        (:meth:`clock_stepped_back`); past :data:`agent.refused_applied.REFUSED_KEPT_PER_RACK` kept for the
        rack, the oldest-stamped is dropped (counted in ``IngestStats.applied_states_old_dropped`` and
        logged)."""
        stats = self.stats
        stats.applied_states_old[msg.rack] = stats.applied_states_old.get(msg.rack, 0) + 1
        dropped = self.refused.keep(r, msg, cards)
        if dropped is not None:
            stats.applied_states_old_dropped[dropped.rack] = stats.applied_states_old_dropped.get(dropped.rack, 0) + 1
            log.warning(
                "more than %d applied states of %s refused as older than the one taken: the oldest (ts %.3f, "
                "seq %d, from %s) is dropped, not tried again if the site clock goes back to a new timeline",
                REFUSED_KEPT_PER_RACK,
                dropped.rack,
                dropped.ts_s,
                dropped.seq,
                dropped.publisher,
            )
        log.info(
            "applied state of %s from %s (ts %.3f, seq %d) is older than the one taken for %d of its cards "
            "(ts %.3f): not taken for them (a second publisher for the rack, or messages reordered)",
            msg.rack,
            msg.publisher,
            msg.ts_s,
            msg.seq,
            cards.size,
            float(np.nanmax(self._ts_s[cards])),
        )

    # ---- readings -------------------------------------------------------------------------------
    def note_reading(
        self,
        r: int,
        idx: IntArray,
        ts_s: float,
        clock_mhz: npt.NDArray[np.float64],
        low: npt.NDArray[np.bool_],
        limit_w: npt.NDArray[np.float64],
    ) -> None:
        """Rack ``r``'s reading of cards ``idx`` (site indices) stamped ``ts_s``: counted into the rack's
        reading interval (:meth:`_confirmation_margin_s`), and what it disproves of the rack's confirmation
        forgotten (:meth:`_disprove`; ``clock_mhz`` NaN where implausible)."""
        margin_s = self._confirmation_margin_s(r, idx, ts_s)
        self._disprove(idx, ts_s, margin_s, clock_mhz, low, limit_w)

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
        (``TwinState.stuck_cards``, ``stuck_racks``). Each disproval is held pending
        (:meth:`_hold_pending`) with what the reading showed."""
        at = self._ts_s[idx]
        after = ts_s > at + margin_s  # False where NaN: nothing confirmed
        pending = at[np.isfinite(at) & ~after]
        for t in np.unique(pending) if pending.size else ():
            if self.clock.stamped_too_far_ahead(float(t)):
                after |= at == t
        if not after.any():
            return
        known = self.level[idx]
        with np.errstate(invalid="ignore"):
            faster = after & (known >= 1) & (clock_mhz > self._faster_than_mhz[np.maximum(known, 0)])
            conf_lim = self.power_limit_w[idx]
            lim_off = after & (limit_w > 0.0) & (np.abs(limit_w - conf_lim) > _LIMIT_TOL_W)
        awake = after & ~low & (self.low_power[idx] == 1.0)
        if not (faster.any() or lim_off.any() or awake.any()):
            return
        stuck_cards, stuck_racks = self.state.stuck_cards(), self.state.stuck_racks()
        if stuck_cards or stuck_racks:  # a frozen sensor repeats the clock it read before a slow-down
            frozen = np.isin(idx, stuck_cards) | np.isin(idx // self._cpr, stuck_racks)
            faster, lim_off, awake = faster & ~frozen, lim_off & ~frozen, awake & ~frozen
        hit = idx[faster | lim_off | awake]
        self._disproved_ts_s[hit], self._disproved_seq[hit] = self._ts_s[hit], self._seq[hit]
        if faster.any():
            self.level[idx[faster]] = -1
        if lim_off.any():
            self.power_limit_w[idx[lim_off]] = np.nan
        if awake.any():
            self.low_power[idx[awake]] = np.nan
        for k, hit, shown, values in (
            (_LEVEL, faster, self._shown_clock_mhz, clock_mhz),
            (_LIMIT, lim_off, self._shown_limit_w, limit_w),
            (_LOW, awake, None, None),
        ):
            if hit.any():
                fresh = self._hold_pending(k, idx[hit], ts_s + margin_s)
                if shown is not None and values is not None:
                    shown[idx[hit][fresh]] = values[hit][fresh]

    def _hold_pending(self, k: int, cards: IntArray, explain_by_s: float) -> npt.NDArray[np.bool_]:
        """Hold the disproval of setting ``k`` of ``cards`` (site indices) by a reading, pending until an
        applied state stamped no later than ``explain_by_s`` explains it (:meth:`_explain`) or the bound
        passes (:meth:`settle_disprovals`); which of ``cards`` hold a new pending one (the reading's).

        One pending per card and setting. A card whose setting an earlier reading disproved, still pending,
        and confirmed again since by an applied state stamped within that pending one's bound (a late one
        that did not explain it: published before the reading, it showed the old setting), may still get
        the applied state that explains it: the rack's come in order (an older one is refused), and the
        next may be stamped within the bound too. Its disproval by this reading is the same one, kept
        pending as it is: the card counts once at most. Counted at once (before 2026-12-05), it was a false
        alarm: a 75-minute demo run counted 8 cards' low power on a rack whose readings showing a wake
        overtook the applied states of the commands it had applied a second before (still asleep) and of
        the wake, which explained both. A pending one whose bound the confirmation disproved now is stamped
        after was not explained, nor can it be now: counted."""
        held = self._explain_by_s[k, cards]
        same = self._ts_s[cards] <= held  # False where NaN: none pending
        self._count_disprovals(self._pending_of(k, cards[~same]))
        fresh = np.asarray(~same, dtype=np.bool_)
        self._explain_by_s[k, cards[fresh]] = explain_by_s
        if fresh.any():
            self._next_due_s = min(self._next_due_s, explain_by_s + self.telemetry_deadline_s)
        return fresh

    # ---- disprovals -----------------------------------------------------------------------------
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

        Called after each message (``Ingest.handle``) and, without messages, on the service's health tick
        while it is connected to the broker (``agent.service``, through ``Ingest.settle_disprovals``): in a
        silence the site clock's ``now`` extrapolates from the newest stamp, so a count shows during a
        telemetry blackout too. Cheap when nothing is due."""
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
        names = self._rack_names
        for k, setting in enumerate(DISPROVABLE_SETTINGS):
            cards = np.flatnonzero(mask[k])
            racks, counts = np.unique(cards // self._cpr, return_counts=True)
            for r, n in zip(racks.tolist(), counts.tolist(), strict=True):
                key = (setting, names[r])
                self.stats.applied_disproved[key] = self.stats.applied_disproved.get(key, 0) + n
                mine = cards[cards // self._cpr == r]
                log.warning(
                    "%s: the %s of %d card(s) as the rack's applied state confirmed it was disproved by a reading "
                    "and no applied state stamped by ts %.3f explained it (a reset or a change outside the agent's "
                    "commands?): cards %s",
                    names[r],
                    setting,
                    n,
                    float(np.nanmax(self._explain_by_s[k, mine])),
                    _card_runs(mine - r * self._cpr),
                )
        self._explain_by_s[mask] = np.nan


def _card_runs(cards: IntArray) -> str:
    """Sorted rack-local card indices as runs: ``0-3, 8, 40-47``."""
    runs: list[str] = []
    for run in np.split(cards, np.flatnonzero(np.diff(cards) != 1) + 1):
        runs.append(f"{run[0]}-{run[-1]}" if run.size > 1 else f"{run[0]}")
    return ", ".join(runs)
