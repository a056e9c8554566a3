"""What became of the agent's commands (:class:`CommandOutcomes`): the acks the ingest hands over,
and the publisher's sends, closes and unconfirmed sends.

An ack goes to the command book (which closes the open command it answers) and to the journal's
batch (``agent.journal_upkeep.JournalAcks``), and is counted once per ack message
(:attr:`CommandOutcomes.acks_received`: a broker's second delivery is not counted again) and by
result in ``racktwin_commands_total``; a copy sent again and answered again counts in
``racktwin_repeated_acks_total``, an ack of a command the agent never sent (another agent's, or a
forged one) in ``racktwin_foreign_acks_total``. A refusal is logged (``issued_ahead`` ones as one
episode, ``agent.ahead_refusals``); a refused placement, or one the site clock left behind, frees
its job and cards for the next decision (``Controller.placement_refused``).

The first send of a decision's commands (or its advice) closes the wall time from the message that
triggered the decision: :attr:`CommandOutcomes.latencies_s` and ``racktwin_decision_latency_seconds``.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid

from agent import wire
from agent.ahead_refusals import AheadRefusals
from agent.clock import SiteClock
from agent.controller import Controller
from agent.journal import Journal, JournalError
from agent.journal_upkeep import JournalAcks, knows_command
from agent.metrics import AgentMetrics
from agent.publish import CommandBook, OpenCommand

__all__ = ["CommandOutcomes"]

#: the words of the line that ends an episode of ``issued_ahead`` refusals (:meth:`CommandOutcomes.ahead_episode_ends`)
#: by the kind of step back of the agent's clock (its ``clock_step`` field): what stepped back, when the
#: refused commands were decided
_STEP_WORDS = {
    "timeline_left": ("the site clock stepped back", "on the old timeline"),
    "ran_ahead": (
        "the agent's clock stepped back to the site's (it had run ahead of the site during a silence)",
        "while it ran ahead",
    ),
    "both": (
        "the site clock stepped back, and the agent's clock had run ahead of the site",
        "on the old timeline or while the agent's clock ran ahead",
    ),
}

log = logging.getLogger("racktwin.agent")

_ACK_KEYS_KEPT = 10_000  # ack messages remembered to count a second delivery once (acks_received)
_LATENCIES_KEPT = 100_000  # latencies (and their triggers' kinds) kept for a benchmark to read


class CommandOutcomes:
    """The acks taken in (:meth:`on_ack`, the ingest's callback) and the publisher's callbacks
    (:meth:`on_sent`, :meth:`on_closed`, :meth:`on_unconfirmed`), with what they are counted in."""

    def __init__(
        self,
        *,
        clock: SiteClock,
        book: CommandBook,
        journal: Journal,
        journal_acks: JournalAcks,
        controller: Controller,
        metrics: AgentMetrics,
    ) -> None:
        self.clock = clock
        self.book = book
        self.journal = journal
        self.journal_acks = journal_acks
        self.controller = controller
        self.metrics = metrics
        #: acks taken in (ours, copies answered again, other agents'), a broker's second delivery of one not
        #: counted (the last ``_ACK_KEYS_KEPT`` ack messages are remembered by command, publisher and seq:
        #: a restarted publisher numbers from 0 again)
        self.acks_received = 0
        self._ack_keys: dict[tuple[uuid.UUID, str, int], None] = {}
        # issued_ahead refusals: one episode's lines (agent.ahead_refusals); the clock's step backs seen, of
        # each kind (SiteClock.timelines_left, SiteClock.extrapolation_corrections)
        self._ahead = AheadRefusals()
        self._ahead_steps = (0, 0)
        # command id -> (wall time of the message that triggered its decision, "period" or "event"):
        # the first command of each decision's, until it is sent (or closed unsent)
        self._first_send: dict[str, tuple[float, str]] = {}
        #: wall seconds from the message that triggered a decision to its first command (or advice) sent
        self.latencies_s: collections.deque[float] = collections.deque(maxlen=_LATENCIES_KEPT)
        #: what triggered each of them: "period" (a telemetry message crossing a period boundary) or "event"
        #: (a job event; its decision waits for ``min_replan_interval_s`` after the last one, and is a full
        #: one if the period boundary passes meanwhile)
        self.latency_kinds: collections.deque[str] = collections.deque(maxlen=_LATENCIES_KEPT)

    # ---- the latency from a decision's trigger to its first send ----------------------------------------
    def await_first_send(self, command_id: str, trigger_wall: float, kind: str) -> None:
        """Command ``command_id`` is the first of a decision triggered at ``trigger_wall`` (``kind``):
        its first send observes the latency."""
        self._first_send[command_id] = (trigger_wall, kind)

    def never_sent(self, command_id: str) -> None:
        """Command ``command_id`` will not be sent (dropped on standing by): no latency to observe."""
        self._first_send.pop(command_id, None)

    def observe_latency(self, trigger_wall: float, kind: str) -> None:
        """A decision triggered at ``trigger_wall`` (wall, ``kind``) sent its first command or its advice now."""
        lat = time.monotonic() - trigger_wall
        self.latencies_s.append(lat)
        self.latency_kinds.append(kind)
        self.metrics.decision_latency_seconds.observe(lat)

    # ---- the publisher's callbacks ----------------------------------------------------------------------
    def on_sent(self, oc: OpenCommand, retry: bool) -> None:
        self.metrics.commands_total.labels(result="retried" if retry else "sent").inc()
        trigger = self._first_send.pop(oc.command_id, None)
        if trigger is not None:
            self.observe_latency(*trigger)

    def on_closed(self, oc: OpenCommand, why: str) -> None:
        self.metrics.commands_total.labels(result=why).inc()
        self._first_send.pop(oc.command_id, None)  # closed unsent (e.g. expired while the broker was away)
        if oc.left_behind:  # no scheduler on the new timeline applies it (its ack, if any, finds it closed)
            self._placement_not_applied(oc)

    def on_unconfirmed(self, _oc: OpenCommand) -> None:
        self.metrics.commands_total.labels(result="unconfirmed").inc()

    # ---- acks -------------------------------------------------------------------------------------------
    def on_ack(self, ack: wire.Acknowledgement) -> None:
        """An ack the ingest took in (the ingest's ``on_ack``)."""
        key = (ack.command_id, ack.publisher, ack.seq)
        if key not in self._ack_keys:
            self.acks_received += 1
            self._ack_keys[key] = None
            if len(self._ack_keys) > _ACK_KEYS_KEPT:
                del self._ack_keys[next(iter(self._ack_keys))]
        now = self.clock.now()
        oc = self.book.on_ack(ack, now if now is not None else ack.ts_s)
        self.journal_acks.add(ack)
        if oc is None and self.book.acked_before(str(ack.command_id)):
            self.metrics.repeated_acks_total.inc()
            return  # a copy sent again answered again (journaled, counted once)
        if oc is None and not knows_command(self.journal, str(ack.command_id)):
            self.metrics.foreign_acks_total.inc()
            return  # another agent's command, or a forged ack
        self.metrics.commands_total.labels(result=ack.result.value).inc()
        self.ahead_episode_ends(now)
        if ack.result is wire.AckResult.APPLIED:
            n = self._ahead.applied(ack.target)
            if n:
                log.info(
                    "%s applies commands again after %d refused as issued ahead of its clock",
                    ack.target,
                    n,
                    extra={"fields": {"target": ack.target, "refused": n}},
                )
            return
        fields = {"command_id": str(ack.command_id), "target": ack.target, "reason": ack.reason}
        if wire.reason_code(ack.reason) == wire.AckReason.ISSUED_AHEAD:
            since = self._ahead.refused(ack.target, left_behind=self._left_behind(oc, str(ack.command_id), now))
            if since is None:
                log.debug("command %s", ack.result.value, extra={"fields": fields})
            else:
                log.warning(
                    "command %s: issued ahead of the target's clock (%d such refusal(s) since the last such line; "
                    "the rest are counted, and summed up when the agent's clock steps back or the target applies "
                    "a command)",
                    ack.result.value,
                    since,
                    extra={"fields": {**fields, "since_last_line": since}},
                )
        else:
            log.warning("command %s", ack.result.value, extra={"fields": fields})
        if oc is not None:
            self._placement_not_applied(oc)

    def ahead_episode_ends(self, now: float | None) -> None:
        """When the agent's clock has stepped back since the last call, of either kind (the site's clock
        went back: ``SiteClock.timelines_left``; or the agent's ran ahead of the site during a silence and
        came back to it: ``SiteClock.extrapolation_corrections``; commands decided meanwhile were stamped
        ahead of the targets' clocks just the same): one INFO line of the ``issued_ahead`` refusals the
        episode counted (``agent.ahead_refusals``), its words and its ``clock_step`` field
        (:data:`_STEP_WORDS`) saying which kind. Each ack and each decision calls it."""
        steps = (self.clock.timelines_left, self.clock.extrapolation_corrections)
        if steps == self._ahead_steps:
            return
        left, ran_ahead = (new != old for new, old in zip(steps, self._ahead_steps, strict=True))
        self._ahead_steps = steps
        refused = self._ahead.clock_stepped_back()
        if refused:
            kind = "both" if left and ran_ahead else "timeline_left" if left else "ran_ahead"
            step, decided = _STEP_WORDS[kind]
            log.info(
                "%s: %d command(s) decided %s had been refused as issued ahead of the targets' clocks (%s)",
                step,
                sum(refused.values()),
                decided,
                ", ".join(f"{t} {n}" for t, n in refused.items()),
                extra={"fields": {"refused": refused, "site_time_s": now, "clock_step": kind}},
            )

    def _left_behind(self, oc: OpenCommand | None, command_id: str, now: float | None) -> bool:
        """Whether a command of ours (``oc``, or the journal's row of one closed already) is stamped
        beyond what a target accepts ahead of the agent's clock ``now``: decided on a timeline the
        site clock has left (``CommandBook._leave_old_timeline``; a journaled command's issue time,
        which its stamp is never before)."""
        if now is None:
            return False
        if oc is not None:
            stamp = oc.ts_s
        else:
            try:
                row = self.journal.command(command_id)
            except JournalError:
                return False
            if row is None:
                return False
            stamp = row.issued_s
        return stamp > now + self.book.accept_ahead_s()

    def _placement_not_applied(self, oc: OpenCommand) -> None:
        """A placement the scheduler refused (or got after its expiry), or one the site clock left behind
        (closed unacked: stamped beyond what the scheduler accepts after the clock stepped back,
        ``CommandBook.expire``), no longer holds its job and cards (``Controller.placement_refused``):
        the next decision may place the job again at once, not ``command_ttl_s`` later. Only an ack
        that closes an open command does this; a late ack, for a command already closed by its
        expiry, names an order whose time to live is over (the ``PlacementBook`` forgets it by its own
        rule) and cannot tell it from a newer one of the job."""
        placed = self.book.placement_of(oc)
        if placed is not None and self.controller.placement_refused(*placed, oc.issued_s):
            log.info(
                "placement of %s not applied: the job may be placed again",
                placed[0],
                extra={"fields": {"command_id": oc.command_id, "job_id": placed[0]}},
            )
