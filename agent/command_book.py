"""The agent's open commands: registered from a decision, closed by an ack, an expiry or a newer one.

:class:`CommandBook` numbers and encodes the commands of a decision (``agent.command_diff``), stamps
them (issue times never go back), registers them as open (the overlays of ``agent.command_overlays``
set) and closes them: an ack, an expiry, a newer command for what they set (superseded), or a step
back of the site clock that leaves them stamped beyond what a rack accepts (expired). The same
diff, unregistered, is the advice of advisory mode (:meth:`CommandBook.advice`). ``agent.publish``
explains the whole; ``agent.publisher`` sends what the book hands it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.command_diff import CommandDiff
from agent.command_overlays import Holds, Overlays
from agent.config import ControlConfig
from agent.decision import Decision
from agent.open_commands import HOST, LEVEL, LIMIT, SLEEP, SUPERSEDES, Command, Item, OpenCommand
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["CommandBook"]

#: acked command ids the book remembers, to tell a repeated ack from a late one (a few hours of a site)
_ACKED_KEPT = 100_000


class CommandBook:
    """Commands from decisions and their acks (see ``agent.publish``)."""

    def __init__(
        self,
        site: SiteSpec,
        codec: wire.Codec,
        control: ControlConfig,
        publisher: str = "agent",
        site_rate: Callable[[], float] | None = None,
    ) -> None:
        """``site_rate``: site seconds per wall second as the site clock measures them (the service
        passes its ``SiteClock``'s); None: ``1 / control.time_scale``."""
        self.site = site
        self.codec = codec
        self.control = control
        self._site_rate = site_rate
        self.sequencer = wire.Sequencer(publisher)
        self._names = site.rack_names
        #: what our open commands will have set, until when, and which command set it
        self.overlays = Overlays(site)
        self._differ = CommandDiff(site, control, self.sequencer, self.overlays)
        self._last_stamp_s = -math.inf  # the newest issue time given to a command
        self._acked: dict[str, None] = {}  # the ids of the last commands acked, oldest first
        self.open: dict[str, OpenCommand] = {}
        self._by_key: dict[int, OpenCommand] = {}  # the open commands by key
        #: open commands closed by a newer one for what they set, not yet taken (:meth:`take_superseded`)
        self.superseded: list[OpenCommand] = []
        #: open commands closed because the site clock stepped back, not yet taken (:meth:`expire`)
        self._left_behind: list[OpenCommand] = []
        self._next_key = 1
        self._before: _Before | None = None  # the book before the last commands(), for undo()

    def diff(self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float) -> list[Item]:
        """The commands the decision needs, as ``(kind, message, lowers_power)``, lowering first
        (:meth:`agent.command_diff.CommandDiff.diff`; nothing is registered)."""
        return self._differ.diff(decision, snap, applied_level, now_s)

    # ---- enforce mode -----------------------------------------------------------------------------
    def accept_ahead_s(self) -> float:
        """How far ahead of its clock a rack accepts a command's issue time (``wire.MAX_ISSUE_AHEAD_S``;
        a simulator at ``speed`` x accepts ten wall seconds of its site time: ``sim.runner``), at the
        slower of the configured and the measured rate (the agent's clock may still run a little
        ahead of the rack's)."""
        rate = 1.0 / self.control.time_scale
        if self._site_rate is not None:
            rate = min(rate, self._site_rate())
        return max(wire.MAX_ISSUE_AHEAD_S, wire.MAX_ISSUE_AHEAD_S * rate)

    def stamp_hold_s(self) -> float:
        """How far a command's issue time may stay ahead of the agent's clock after the clock stepped
        back: half of how far ahead of its clock a rack accepts one (:meth:`accept_ahead_s`)."""
        return 0.5 * self.accept_ahead_s()

    def _stamp(self, now_s: float) -> float:
        """The issue time of commands made at ``now_s``: never before the newest one given (within
        :meth:`stamp_hold_s`)."""
        last = self._last_stamp_s
        stamp = last if now_s < last <= now_s + self.stamp_hold_s() else now_s
        self._last_stamp_s = stamp
        return stamp

    def commands(
        self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float
    ) -> list[OpenCommand]:
        """The commands of a decision, encoded, registered as open (overlays set); send in order."""
        out: list[OpenCommand] = []
        self._leave_old_timeline(now_s)
        items = self.diff(decision, snap, applied_level, now_s)
        self._before = _Before.of(self) if items else None
        stamp = self._stamp(now_s) if items else now_s
        for kind, msg, _low in items:
            if stamp != now_s:  # the clock stepped back: the newest issue time, the same life
                msg = dataclasses.replace(msg, ts_s=stamp, expires_s=msg.expires_s + (stamp - now_s))
            msg = _with_seq(msg, self.sequencer.next(self.codec.topic_for(msg)))
            o = self.codec.outgoing(msg)
            target = (
                msg.rack
                if isinstance(msg, wire.RackCommand | wire.CduCommand)
                else (wire.FACILITY if isinstance(msg, wire.FacilityCommand) else wire.SCHEDULER)
            )
            oc = OpenCommand(
                str(msg.command_id), target, o.topic, o.payload, now_s, msg.expires_s, kind=kind, stamp_s=msg.ts_s
            )
            self._register(oc, msg)
            out.append(oc)
        if self._before is not None:
            self._before.ids = [oc.command_id for oc in out]
            self._before.made = (self._next_key, len(self.open), len(self.superseded))
        return out

    def undo(self, commands: list[OpenCommand]) -> None:
        """Take back the last :meth:`commands` (its decision could not be journaled: nothing of it is
        sent): its commands are dropped, and those they superseded are open again exactly as before
        (the same objects: ids, expiries, attempts and send times; what they set held again, none of
        them in :attr:`superseded`), as are the issue time and the sequence numbers they took. Call it
        before anything else changes the book (the service does, right after the failed write);
        commands the site clock left behind stay closed (:meth:`_leave_old_timeline`)."""
        if not commands:
            return
        before, self._before = self._before, None
        now = (self._next_key, len(self.open), len(self.superseded))
        if before is None or before.made != now or before.ids != [oc.command_id for oc in commands]:
            raise RuntimeError("CommandBook.undo: not the commands of the book's last change")
        for oc in self.superseded[before.n_superseded :]:
            oc.superseded_by = None
        del self.superseded[before.n_superseded :]
        self.open, self._by_key = before.open, before.by_key
        self._last_stamp_s = before.last_stamp_s
        self.sequencer.rewind(before.seq)
        self.overlays.restore_holds(before.holds)

    def _register(self, oc: OpenCommand, msg: Command) -> None:
        key = self._next_key
        self._next_key += 1
        oc.key = key
        if isinstance(msg, wire.RackCommand):
            cards = np.asarray(self.site.site_cards({msg.rack: msg.cards}), dtype=np.int64)
            oc.cards = cards
            s = msg.setting
            value: float | FloatArray
            if s.action is wire.CardAction.SET_DVFS_LEVEL:
                kind, value = LEVEL, float(s.dvfs_level or 0)
            elif s.action is wire.CardAction.SET_POWER_LIMIT:
                kind, value = LIMIT, np.asarray(s.limits_w(cards.size), dtype=np.float64)
            elif s.action is wire.CardAction.LOW_POWER_IDLE:
                kind, value = SLEEP, 1.0
            elif s.action is wire.CardAction.WAKE:
                kind, value = SLEEP, 0.0
            elif s.action is wire.CardAction.HOST_POWER_OFF:
                kind, value = HOST, 1.0
            elif s.action is wire.CardAction.HOST_POWER_ON:
                kind, value = HOST, 0.0
            else:  # pragma: no cover - the agent sends no clock ranges
                kind, value = -1, 0.0
            oc.kind = kind
            if kind >= 0:
                for k in SUPERSEDES[kind]:
                    self._supersede(self.overlays.key[k, cards], oc)
                self.overlays.hold(kind, cards, value, msg.expires_s, key)
        elif isinstance(msg, wire.CduCommand):
            r = self.site.rack_names.index(msg.rack)
            pump = self.overlays.pump.get(r)
            if pump is not None:
                self._supersede([pump[2]], oc)
            self.overlays.pump[r] = (msg.pump_speed_frac, msg.expires_s, key)
            self.overlays.pump_sent[r] = max(self.overlays.pump_sent[r], msg.ts_s)
        elif isinstance(msg, wire.FacilityCommand):
            if self.overlays.setpoint is not None:
                self._supersede([self.overlays.setpoint[2]], oc)
            self.overlays.setpoint = (msg.supply_setpoint_c, msg.expires_s, key)
        else:
            self.overlays.placing[msg.job_id] = (msg.expires_s, key)
        self.open[oc.command_id] = oc
        self._by_key[key] = oc

    def _supersede(self, keys: Iterable[int] | IntArray, newer: OpenCommand) -> None:
        """Close the open commands of ``keys`` (those that last set what ``newer`` sets): they are
        never sent again (see the module docstring), and go to :attr:`superseded`."""
        for key in np.unique(np.asarray(keys, dtype=np.int64)).tolist():
            old = self._by_key.get(key)
            if old is None or old is newer:
                continue
            del self.open[old.command_id]
            self.forget(old)
            old.superseded_by = newer.command_id
            self.superseded.append(old)

    def take_superseded(self) -> list[OpenCommand]:
        """The commands superseded since the last call (the publisher journals and counts them)."""
        gone, self.superseded = self.superseded, []
        return gone

    def acked_before(self, command_id: str) -> bool:
        """Whether one of the last ``_ACKED_KEPT`` commands acked had this id: a second ack for it
        answers a copy sent again (or is the broker's second delivery)."""
        return command_id in self._acked

    def resume(self, commands: Iterable[tuple[str, str, str, bytes, float, float, int]]) -> list[OpenCommand]:
        """Re-open journaled commands after a restart: ``(id, target, topic, payload, issued, expires,
        attempts)``; their overlays are set again. Returns them (to be sent again)."""
        out: list[OpenCommand] = []
        for cid, target, topic, payload, issued, expires, attempts in commands:
            msg = self.codec.decode(topic, payload)
            if not isinstance(msg, wire.RackCommand | wire.CduCommand | wire.FacilityCommand | wire.SchedulerCommand):
                continue
            oc = OpenCommand(cid, target, topic, payload, issued, expires, attempts=attempts, stamp_s=msg.ts_s)
            self._register(oc, msg)
            self._last_stamp_s = max(self._last_stamp_s, msg.ts_s)  # the next ones are not issued before them
            out.append(oc)
        return out

    def on_ack(self, ack: wire.Acknowledgement, now_s: float) -> OpenCommand | None:
        """An ack for one of ours closes it (None for an unknown id, or one acked before:
        :meth:`acked_before`). A refusal or a late arrival clears what the command would have set, so
        the next decision tries again (a refused card setting after ``command_ttl_s``, unless the rack
        refused it as ``superseded``; a ``card_failed`` refusal marks the cards it names:
        :meth:`agent.command_overlays.Overlays.note_failed`; a refused placement is sent again as soon
        as a decision places the job again: the service tells the controller, :meth:`placement_of`;
        one refused ``card_failed`` marks the cards of it the scheduler names the same way,
        :meth:`agent.command_overlays.Overlays.note_failed_placement`, and the next decision, which
        places no job on them (:meth:`unplaceable`), places the job on others)."""
        oc = self.open.pop(str(ack.command_id), None)
        if oc is None:
            return None
        self._acked[oc.command_id] = None
        if len(self._acked) > _ACKED_KEPT:
            del self._acked[next(iter(self._acked))]
        self._by_key.pop(oc.key, None)
        if ack.result is wire.AckResult.APPLIED:
            self.overlays.note_applied(oc, ack)
        else:
            self.forget(oc)
            held = wire.reason_code(ack.reason) != wire.AckReason.SUPERSEDED  # the rack holds a newer one
            if ack.result is wire.AckResult.REJECTED and oc.kind >= 0 and held:
                self.overlays.refuse(oc, now_s + self.control.command_ttl_s)
                self.overlays.note_failed(oc, ack, now_s, self.control.command_ttl_s)
            if ack.result is wire.AckResult.REJECTED and wire.reason_code(ack.reason) == wire.AckReason.CARD_FAILED:
                placed = self.placement_of(oc)
                if placed is not None:
                    cards = np.asarray(placed[1], dtype=np.int64)
                    self.overlays.note_failed_placement(cards, ack, oc.issued_s, now_s, self.control.command_ttl_s)
        return oc

    def unplaceable(self, last_seen_s: FloatArray, now_s: float | None = None) -> BoolArray:
        """Per card, whether a ``card_failed`` refusal marks it (no reading of it, ``last_seen_s``, since)
        or a repeat's hold holds it out at ``now_s``: the next decision places no job on it and sees
        it otherwise as its readings say (:meth:`agent.command_overlays.Overlays.unplaceable`)."""
        return self.overlays.unplaceable(last_seen_s, now_s)

    def held_back(self, failed: BoolArray, now_s: float) -> BoolArray:
        """Per kind of card setting and card, whether a refusal holds it back at ``now_s`` (``failed``: per
        card, read or said failed): the decision sends none, its guard keeps it as the card reports it
        (:meth:`agent.command_overlays.Overlays.held_back`)."""
        return self.overlays.held_back(failed, now_s)

    def placement_of(self, oc: OpenCommand) -> tuple[str, tuple[int, ...]] | None:
        """The job and the cards (site indices, sorted) of a scheduler command of ours; None for other
        commands (``agent.service`` tells the controller's ``PlacementBook`` of a placement not
        applied: ``Controller.placement_refused``)."""
        if oc.target != wire.SCHEDULER:
            return None
        msg = self.codec.decode(oc.topic, oc.payload)
        if not isinstance(msg, wire.SchedulerCommand):
            return None
        return msg.job_id, tuple(sorted(self.site.site_cards(msg.cards)))  # the codec checked racks and cards

    def forget(self, oc: OpenCommand) -> None:
        """Forget what a closed command would have set (what it alone set: not what a newer command
        set since). The caller has taken it out of :attr:`open` (expired, abandoned, not journaled)."""
        if self._by_key.get(oc.key) is oc:
            del self._by_key[oc.key]
        self.overlays.release(oc)

    def expire(self, now_s: float) -> list[OpenCommand]:
        """Close open commands past their expiry without an ack, and those the site clock left behind
        (:meth:`_leave_old_timeline`: their ``expires_s`` is still ahead of ``now_s``); returns them.
        After the clock stepped back, a command sent on the old timeline counts as sent now at the
        latest (its next retry is due a retry interval from now, not once the clock is back there)."""
        self._leave_old_timeline(now_s)
        left, self._left_behind = self._left_behind, []
        gone = [oc for oc in self.open.values() if oc.expires_s <= now_s]
        for oc in gone:
            del self.open[oc.command_id]
            self.forget(oc)
        for oc in self.open.values():
            oc.last_sent_s = min(oc.last_sent_s, now_s)
            oc.first_sent_s = min(oc.first_sent_s, now_s)
        return left + gone

    def _leave_old_timeline(self, now_s: float) -> None:
        """The site clock stepped back (a restarted simulator, a site's time source corrected; the
        agent's clock ran ahead during a silence): close the open commands stamped more than a rack
        accepts ahead of ``now_s`` (:meth:`accept_ahead_s`). No rack on the new timeline applies them
        (``issued_ahead``: docs/protocol.md, "Which commands a rack applies"); left open, their
        expiries on the old timeline held what they set (a card's level or limit, a placement on its
        way, the set-point, a pump speed) for as long as the step back and their life, and no retry
        was due before the clock got back there: the next decision commands what it still wants,
        stamped on the new timeline. They wait in :attr:`_left_behind` for :meth:`expire` (the
        publisher journals them expired). A command stamped within the allowance stays open: a rack
        accepts it, and it expires at most the allowance and its life from now. The holds of refused
        commands stamped that far ahead are lifted (:meth:`Overlays.lift_refusals_stamped_after`).
        Without a step back no command is stamped that far ahead (an issue time is held at most
        :meth:`stamp_hold_s` ahead)."""
        ahead_s = now_s + self.accept_ahead_s()
        left = [oc for oc in self.open.values() if oc.ts_s > ahead_s]
        for oc in left:
            del self.open[oc.command_id]
            self.forget(oc)
            oc.left_behind = True
        self._left_behind.extend(left)
        # the refusals of such commands hold nothing back (the racks refused most of them as issued
        # ahead: commands decided on the old timeline after the site restarted, before the clock followed)
        self.overlays.lift_refusals_stamped_after(ahead_s)

    # ---- advisory mode ----------------------------------------------------------------------------
    def advice(
        self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float
    ) -> wire.AgentAdvice:
        """What enforce mode would command now (:meth:`commands`' diff), as advice: nothing is registered,
        and the holds of the open commands are left as they were (``Overlays.holds``). Of them the diff
        changes only the pumps' last issue times: after the site clock stepped back it dates them at
        ``now_s`` at the latest (``CommandDiff._pump_items``), which would put the next pump renewal
        :meth:`commands` sends at ``now_s`` plus ``pump_renew_s``, for advice that issued nothing. What
        else the diff changes is a decision's reading of the refusals and failed marks, the same in
        either mode and kept (``Overlays.failed_now``, ``lift_refusals_a_failure_explains``, the
        refusals' holds clipped to ``command_ttl_s`` from ``now_s``). The service asks for advice only in
        advisory mode, whose book registers no command: it holds nothing, refuses nothing, and its
        advice is the commands a fresh book in enforce mode would send."""
        items: list[wire.AdviceItem] = []
        setpoint: float | None = None
        placements: list[wire.Placement] = []
        pumps: dict[str, float] = {}
        held = self.overlays.holds()
        try:
            diffed = self.diff(decision, snap, applied_level, now_s)
        finally:
            self.overlays.restore_holds(held)
        for _kind, msg, _low in diffed:
            if isinstance(msg, wire.RackCommand):
                items.append(wire.AdviceItem(msg.rack, msg.cards, msg.setting))
            elif isinstance(msg, wire.CduCommand):
                pumps[msg.rack] = msg.pump_speed_frac
            elif isinstance(msg, wire.FacilityCommand):
                setpoint = msg.supply_setpoint_c
            else:
                placements.append(wire.Placement(msg.job_id, msg.cards))
        fs = ", ".join(self._names[r] for r in decision.failsafe_racks)
        summary = (
            f"cycle {decision.cycle}: {decision.status} ({decision.source}), supply {decision.supply_temp_c:g} deg C"
            + (f", fail-safe {fs}" if fs else "")
        )
        return wire.AgentAdvice(
            items=tuple(items),
            ts_s=now_s,
            seq=self.sequencer.next(self.codec.topics.advice),
            publisher=self.sequencer.publisher,
            supply_setpoint_c=setpoint,
            placements=tuple(placements),
            predicted_it_power_w=_finite(decision.predicted_it_power_w),
            predicted_facility_power_w=_finite(decision.predicted_facility_power_w),
            summary=summary[:1024],
            pump_speeds=pumps,
        )


@dataclasses.dataclass
class _Before:
    """The book before :meth:`CommandBook.commands` registered a decision's commands (for
    :meth:`CommandBook.undo`); ``made``: its next key and how many commands were open and superseded
    once they were registered, ``ids``: theirs."""

    open: dict[str, OpenCommand]
    by_key: dict[int, OpenCommand]
    n_superseded: int
    last_stamp_s: float
    seq: dict[str, int]
    holds: Holds
    made: tuple[int, int, int] = (0, 0, 0)
    ids: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, book: CommandBook) -> _Before:
        return cls(
            dict(book.open),
            dict(book._by_key),
            len(book.superseded),
            book._last_stamp_s,
            book.sequencer.mark(),
            book.overlays.holds(),
        )


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) and x >= 0 else None


def _with_seq(msg: Command, seq: int) -> Command:
    return dataclasses.replace(msg, seq=seq)
