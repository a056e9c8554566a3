"""Sending the agent's open commands over MQTT: in order, pipelined, retried until acknowledged.

:class:`Publisher` sends what :class:`agent.command_book.CommandBook` hands it, retries what is not
acknowledged, closes what expires or runs out of retries, journals the sends and reports acks that
go missing; ``agent.publish`` explains the whole.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from agent.aio import wait_event
from agent.bus import BusError, BusNotConnected, BusPubackTimeout
from agent.clock import SiteClock
from agent.command_book import CommandBook
from agent.config import ControlConfig
from agent.failure_lines import LOG_INTERVAL_S
from agent.journal import Journal, JournalError
from agent.mqtt_options import MqttOptions
from agent.open_commands import OpenCommand

__all__ = ["CLOSE_WRITES", "EXPIRY_PASS", "CommandLink", "PublishStats", "Publisher"]


class CommandLink(Protocol):
    """What the publisher uses of :class:`agent.bus.Bus`: its options (the in-flight window) and publishes."""

    @property
    def options(self) -> MqttOptions: ...

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool, timeout_s: float) -> None: ...


log = logging.getLogger("racktwin.agent.publish")

#: the key in :attr:`Publisher.journal_errors` (and the log's name) of the journal's expiry pass (the
#: commands past their expiry, ``Journal.expire``), apart from the closes of :data:`CLOSE_WRITES`
EXPIRY_PASS = "expired"
#: per state a command is closed in without an ack, the key in :attr:`Publisher.journal_errors` (and
#: the log's name) of the write that closes commands in it (:meth:`Publisher._journal_closes`); each
#: its own, so that one write that succeeds never clears another's error while that one fails
CLOSE_WRITES = {
    "expired": "expired at a clock step back",  # left behind by the site clock (CommandBook.expire)
    "abandoned": "abandoned",
    "superseded": "superseded",
}


@dataclass
class PublishStats:
    sent: int = 0
    retried: int = 0
    unacked_expired: int = 0  # expired before any ack (lost or unanswered)
    abandoned: int = 0  # retries exhausted
    superseded: int = 0  # closed unacked by a newer command for what they set (never sent again)
    acks_missing: int = 0  # closed without an ack (of the above) although sent a retry interval before
    not_connected_waits: int = 0
    unconfirmed: int = 0  # sends the broker did not acknowledge within puback_timeout_s (counted in sent)


class Publisher:
    """Sends open commands in order, retries the unacknowledged ones (see ``agent.publish``).

    ``on_sent(command, retry)``, ``on_closed(command, why)`` (closed without an ack: ``why`` is
    ``unacked`` (expired), ``abandoned`` or ``superseded``) and ``on_unconfirmed(command)`` report to
    the caller (metrics). ``heard_since(target, site_s)``: whether the target (a rack) sent anything
    stamped after ``site_s`` (the service's belief; without it every target counts as heard).

    A send whose PUBACK does not come within :attr:`puback_timeout_s` (an overloaded broker) counts
    as sent, unconfirmed: the client keeps the message and delivers it when it can, so it is not
    published again at once (that only piled copies into the client); the rack's ack closes it, and
    the retry interval applies as to any command not acknowledged. The next batch goes on. A warning
    says so at most every :attr:`unconfirmed_warning_interval_s` while it lasts (with the number of
    sends unconfirmed since the last one)."""

    #: wall seconds a send waits for the broker's PUBACK
    puback_timeout_s = 5.0
    #: wall seconds the publisher's journal writes are skipped after one failed
    journal_retry_s = 2.0
    #: wall seconds between two warnings about one target's missing acks
    ack_warning_interval_s = LOG_INTERVAL_S
    #: wall seconds between two warnings that the broker does not acknowledge commands (the log's rhythm
    #: for a failure that repeats, ``agent.failure_lines``: wall time, as the operator reads the log, not
    #: a command's life or the period, which are site time and shrink with a fast simulator)
    unconfirmed_warning_interval_s = LOG_INTERVAL_S

    def __init__(
        self,
        bus: CommandLink,
        book: CommandBook,
        journal: Journal,
        clock: SiteClock,
        control: ControlConfig,
        *,
        on_sent: Callable[[OpenCommand, bool], None] | None = None,
        on_closed: Callable[[OpenCommand, str], None] | None = None,
        on_unconfirmed: Callable[[OpenCommand], None] | None = None,
        heard_since: Callable[[str, float], bool] | None = None,
    ) -> None:
        self.bus = bus
        self.book = book
        self.journal = journal
        self.clock = clock
        self.control = control
        self.on_sent = on_sent
        self.on_closed = on_closed
        self.on_unconfirmed = on_unconfirmed
        self.heard_since = heard_since
        self.stats = PublishStats()
        self._queue: collections.deque[OpenCommand] = collections.deque()
        #: commands in flight at once (awaiting their PUBACK); the client's own in-flight window
        self.max_in_flight = max(1, bus.options.max_inflight)
        self._wake = asyncio.Event()
        self._resend_all = False
        self._stepping = asyncio.Lock()  # one step at a time (the run loop's, a clean shutdown's)
        #: the publisher's journal writes that failed last time they were tried ("sent", the expiry pass
        #: :data:`EXPIRY_PASS`, the closes of :data:`CLOSE_WRITES`), with the error; an entry goes when
        #: that write succeeds again
        self.journal_errors: dict[str, str] = {}
        self._journal_retry_wall = -math.inf  # time.monotonic() before which journal writes are skipped
        #: commands closed without an ack whose close is not journaled yet, by the state they are closed
        #: in ("expired": left behind by the site clock, "abandoned", "superseded"): kept until written
        #: (:meth:`_journal_closes`)
        self._unjournaled_closes: dict[str, list[str]] = {}
        #: time.monotonic() of the last send the broker did not acknowledge in time, and why
        self.last_unconfirmed_wall = -math.inf
        self.last_unconfirmed_error = ""
        self._unconfirmed_warned = (-math.inf, 0)  # (time.monotonic(), stats.unconfirmed) at the last warning
        #: per target (rack, "facility", "scheduler"): commands closed without an ack although sent
        #: a retry interval before (expired, abandoned or superseded unanswered)
        self.acks_missing: dict[str, int] = {}
        self._ack_warned: dict[str, tuple[float, int]] = {}  # target -> (time.monotonic(), acks_missing then)

    @property
    def retry_after_s(self) -> float:
        return self.control.command_ttl_s / (self.control.command_retries + 1)

    def submit(self, commands: Iterable[OpenCommand]) -> None:
        self._queue.extend(commands)
        self._wake.set()

    def reconnected(self) -> None:
        """The broker connection came back: send every open command again."""
        self._resend_all = True
        self._wake.set()

    def backlog(self) -> int:
        return len(self._queue)

    def unjournaled_closes(self) -> dict[str, int]:
        """How many commands closed without an ack are not journaled closed yet, per state (none: an
        empty dict): a restarted agent would take them up from the journal and send them again while
        valid (``agent.resume``). The service's ``/readyz`` names them."""
        return {state: len(ids) for state, ids in self._unjournaled_closes.items() if ids}

    def journal_closes_now(self) -> dict[str, list[str]]:
        """A shutdown's last try (``agent.service``): write the closes not journaled yet, each
        state's write tried whatever ``journal_retry_s`` says; returns the ids still not written, per
        state (an empty dict: all written)."""
        self._journal_closes(force=True)
        return {state: list(ids) for state, ids in self._unjournaled_closes.items() if ids}

    def _journal_write(self, what: str, write: Callable[[], object], *, force: bool = False) -> bool:
        """One journal write (``what`` names it in the log and in :attr:`journal_errors`: one name per
        kind of write); a failure is logged once and kept in :attr:`journal_errors`, never raised: the
        command has been journaled and sent already. For ``journal_retry_s`` after a failure the
        publisher's writes are skipped (each try may wait for SQLite's busy timeout on the event loop,
        and a step comes every 0.25 s) unless ``force``: what they would record is lost as when they
        fail, except closes, which :meth:`_journal_closes` keeps until written (plain expiries are
        recorded by the journal's next expiry pass that succeeds). An entry of :attr:`journal_errors`
        goes when a write of its kind succeeds, every entry when a batch is marked sent (rows written:
        the journal takes writes again; closes still to write show in :meth:`unjournaled_closes`).
        Returns whether it was written."""
        if not force and time.monotonic() < self._journal_retry_wall:
            return False
        try:
            write()
        except JournalError as exc:
            if what not in self.journal_errors:
                log.error("journal write failed: commands %s not recorded", what, extra={"fields": {"error": str(exc)}})
            self.journal_errors[what] = str(exc)
            self._journal_retry_wall = time.monotonic() + self.journal_retry_s
            return False
        if what == "sent" and self.journal_errors:
            log.info("journal written again: commands sent recorded")
            self.journal_errors.clear()
        elif self.journal_errors.pop(what, None) is not None:
            log.info("journal written again: commands %s recorded", what)
        return True

    async def run(self) -> None:
        while True:
            await wait_event(self._wake, 0.25)
            self._wake.clear()
            await self.step()

    async def step(self) -> None:
        """Expire, queue retries, send what is queued (returns when the queue is empty or the link is
        down). A step called while another runs starts when that one has ended: a clean shutdown's
        step returns once what the last decision handed over has been sent, whichever step sent it."""
        async with self._stepping:
            await self._step()

    async def _step(self) -> None:
        now = self.clock.now()
        if now is None:
            return
        gone = self.book.expire(now)
        for oc in gone:
            self.stats.unacked_expired += 1
            self._no_ack(oc, now)
            if self.on_closed is not None:
                self.on_closed(oc, "unacked")
        self._journal_write(EXPIRY_PASS, functools.partial(self.journal.expire, now))
        # closed before their expiry: the site clock stepped back past their issue (CommandBook.expire);
        # the journal's expiry of a later step does not close them (theirs lie on the old timeline)
        self._close_later("expired", [oc for oc in gone if oc.left_behind])
        superseded = self.book.take_superseded()
        if superseded:
            # closed unacked, never sent again
            self._close_later("superseded", superseded)
            for oc in superseded:
                self.stats.superseded += 1
                self._no_ack(oc, now)
                if self.on_closed is not None:
                    self.on_closed(oc, "superseded")
        queued = {oc.command_id for oc in self._queue}
        resend_all, self._resend_all = self._resend_all, False
        abandoned: list[OpenCommand] = []
        for oc in list(self.book.open.values()):
            if oc.command_id in queued or oc.attempts == 0:
                continue
            due = resend_all or now - oc.last_sent_s >= self.retry_after_s
            if not due:
                continue
            if oc.attempts > self.control.command_retries and not resend_all:
                abandoned.append(oc)  # retries used up before its expiry (a re-send after a reconnect counts)
                continue
            self._queue.append(oc)
        if abandoned:
            for oc in abandoned:
                self.book.open.pop(oc.command_id, None)
                self.book.forget(oc)
            self._close_later("abandoned", abandoned)
            for oc in abandoned:
                self.stats.abandoned += 1
                self._no_ack(oc, now)
                if self.on_closed is not None:
                    self.on_closed(oc, "abandoned")
        self._journal_closes()
        while self._queue:
            now = self.clock.now_or(now)
            batch: list[OpenCommand] = []
            while self._queue and len(batch) < self.max_in_flight:
                oc = self._queue.popleft()
                if oc.command_id in self.book.open and oc.expires_s > now:
                    batch.append(oc)
                # else: acked meanwhile, or expired: never sent late (checked again as its send runs: _send)
            if not batch:
                break
            # pipelined: every command of the batch is handed to the client now, in order (aiomqtt passes
            # each publish to paho synchronously when its task starts, and tasks start in creation order),
            # and the PUBACKs are awaited together: one round trip per batch, not one per command
            tasks = [asyncio.ensure_future(self._send(oc, now)) for oc in batch]
            results = await asyncio.gather(*tasks)
            sent = [oc for oc, r in zip(batch, results, strict=True) if r is True]
            if sent:
                ids = [oc.command_id for oc in sent]
                self._journal_write("sent", functools.partial(self.journal.mark_sent, ids))  # one transaction
            errors = [r for r in results if isinstance(r, BusError)]
            if errors:
                failed = [oc for oc, r in zip(batch, results, strict=True) if isinstance(r, BusError)]
                self._queue.extendleft(reversed(failed))  # sent again, in order, at the next step
                if any(isinstance(r, BusNotConnected) for r in errors):
                    self.stats.not_connected_waits += 1
                else:
                    exc = errors[0]
                    log.warning("%d command(s), first to %s, not sent: %s", len(failed), failed[0].target, exc)
                return

    def close_abandoned(self, closed: list[OpenCommand]) -> None:
        """Commands the service closed ``abandoned`` itself (it stands by: another agent commands the
        site), already out of the book: journaled now, or kept with the publisher's other closes until
        a write succeeds (:meth:`unjournaled_closes`), never lost to one failed write."""
        self._close_later("abandoned", closed)
        self._journal_closes()

    def _close_later(self, state: str, closed: list[OpenCommand]) -> None:
        """Commands closed without an ack, to be journaled ``state`` by :meth:`_journal_closes`."""
        if closed:
            self._unjournaled_closes.setdefault(state, []).extend(oc.command_id for oc in closed)

    def _journal_closes(self, *, force: bool = False) -> None:
        """Journal the closes not written yet, one transaction per state; those whose write fails or is
        skipped (``journal_retry_s``, unless ``force``) are kept for the next step.
        Left in the journal ``sent``, a closed command would be re-opened and sent again by a restarted
        agent (``agent.resume``) while its expiry is ahead: a level a newer command replaced, a command
        whose retries ran out, one stamped on a timeline the site clock left. What is kept while the
        journal fails grows with the commands closed meanwhile (each is closed once), none dropped:
        about 130 bytes per command (13 MB for 100,000 closes); :meth:`unjournaled_closes` counts them."""
        j = self.journal
        writes = {"expired": j.expire_commands, "abandoned": j.abandon, "superseded": j.supersede}
        for state, ids in list(self._unjournaled_closes.items()):
            if self._journal_write(CLOSE_WRITES[state], functools.partial(writes[state], list(ids)), force=force):
                del self._unjournaled_closes[state]

    def _no_ack(self, oc: OpenCommand, now_s: float) -> None:
        """``oc`` closed without an ack: an ack missing if it went out a retry interval before and its
        target sent something since (counted per target; a warning at most every
        ``ack_warning_interval_s`` per target)."""
        # an ack is not overdue before the command went out: not its issue (it may have waited out a broker
        # restart); one re-opened from the journal and not sent by this run went out no sooner than its issue
        went_out_s = oc.first_sent_s if math.isfinite(oc.first_sent_s) else oc.issued_s
        if oc.attempts == 0 or now_s - went_out_s < self.retry_after_s:
            return
        # since it first went out, not last: a rack whose telemetry comes less often than the retries
        # (every 20 s against a retry every 10 s) is often not heard between the last copy and the close
        if self.heard_since is not None and not self.heard_since(oc.target, oc.first_sent_s):
            return  # the target went silent (its telemetry too): not an ack lost on its way
        self.stats.acks_missing += 1
        n = self.acks_missing[oc.target] = self.acks_missing.get(oc.target, 0) + 1
        wall = time.monotonic()
        last_wall, last_n = self._ack_warned.get(oc.target, (-math.inf, 0))
        if wall - last_wall < self.ack_warning_interval_s:
            return
        self._ack_warned[oc.target] = (wall, n)
        log.warning(
            "no ack from %s for %d command(s) sent %g s or more before they closed: it does not get its commands, "
            "or its acks do not reach the agent (a broker ACL that drops them?)",
            oc.target,
            n - last_n,
            self.retry_after_s,
            extra={"fields": {"acks_missing": n, "last_command_id": oc.command_id, "attempts": oc.attempts}},
        )

    async def _send(self, oc: OpenCommand, now: float) -> BusError | bool:
        """Publish one command (QoS 1) and note it sent once the broker acknowledged it (or did not
        within ``puback_timeout_s``: sent, unconfirmed): True; the error when it could not be sent;
        False, unsent and not counted, when it is no longer open in the book as its turn comes (acked,
        superseded or otherwise closed after its batch was built: the event loop runs what was ready
        before the batch's sends, an ack, a decision)."""
        if oc.command_id not in self.book.open:
            return False
        try:
            await self.bus.publish(oc.topic, oc.payload, qos=1, retain=False, timeout_s=self.puback_timeout_s)
        except BusPubackTimeout as exc:  # handed over, not confirmed: see the class docstring
            self.stats.unconfirmed += 1
            self.last_unconfirmed_wall = wall = time.monotonic()
            # counted from the last warning, not the last unconfirmed send: a broker that keeps not
            # acknowledging is warned about again each interval, with the sends unconfirmed since
            last_wall, last_n = self._unconfirmed_warned
            if wall - last_wall >= self.unconfirmed_warning_interval_s:
                self._unconfirmed_warned = (wall, self.stats.unconfirmed)
                if math.isfinite(last_wall):
                    since = self.stats.unconfirmed - last_n
                    log.warning(
                        "the broker does not acknowledge commands: %s (%d send(s) unconfirmed since the last warning)",
                        exc,
                        since,
                    )
                else:
                    log.warning("the broker does not acknowledge commands: %s", exc)
            self.last_unconfirmed_error = str(exc)
            if self.on_unconfirmed is not None:
                self.on_unconfirmed(oc)
        except BusError as exc:
            return exc
        retry = oc.attempts > 0
        oc.attempts += 1
        oc.last_sent_s = self.clock.now_or(now)
        if oc.first_sent_s == -math.inf:
            oc.first_sent_s = oc.last_sent_s
        if retry:
            self.stats.retried += 1
        self.stats.sent += 1
        if self.on_sent is not None:
            self.on_sent(oc, retry)
        return True
