"""The service's running care of its journal: acks written in batches (:class:`JournalAcks`), the
journal file watched and old rows pruned (:class:`JournalUpkeep`). A write that fails is logged
once, kept as the reason the agent is not ready (``/readyz``), and the service goes on.
"""

from __future__ import annotations

import logging
import math
import time

from agent import wire
from agent.journal import Journal, JournalError

__all__ = ["JournalAcks", "JournalUpkeep", "knows_command"]

log = logging.getLogger("racktwin.agent")

_JOURNAL_PRUNE_INTERVAL_S = 3600.0  # wall seconds between deletions of journal rows past journal.keep_days
_JOURNAL_PRUNE_BATCH = 5000  # decisions looked at per deletion (a short pause of the event loop); more: again 1 s later
_JOURNAL_CHECK_INTERVAL_S = 2.0  # wall seconds between checks that the journal file is still the one open
_ACK_RETRY_S = 2.0  # wall seconds before acks whose journal write failed are tried again
_ACK_BATCH = 1000  # acks written at once at the latest, when the ingest task finds no end to a burst
_ACKS_KEPT = 100_000  # acks kept for the journal while it cannot be written (the oldest go first)


def knows_command(journal: Journal, command_id: str) -> bool:
    """Whether the journal holds command ``command_id`` (False when it cannot be read)."""
    try:
        return journal.command(command_id) is not None
    except JournalError:
        return False


class JournalAcks:
    """Acks received and not yet written to the journal (:attr:`pending`), and why the last write
    failed (:attr:`error`, None after a write that worked)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.pending: list[tuple[str, float, str, str | None]] = []  # received, not yet written
        self.error: str | None = None  # the last ack write failed: why
        self._retry_wall = -math.inf  # time.monotonic() before which a failed ack write is not retried

    def add(self, ack: wire.Acknowledgement) -> None:
        self.pending.append((str(ack.command_id), ack.ts_s, ack.result.value, ack.reason))
        if len(self.pending) >= _ACK_BATCH:  # a burst that does not end (a flood): write as it comes
            self.write()

    def write(self, *, now_or_never: bool = False) -> None:
        """Write the acks received since the last write in one transaction (the ingest task calls
        this when it has taken in what the client received: one write per burst, not one per ack).
        After a failed write (a full disk, another process holding the lock for longer than the
        busy timeout) the acks are kept and tried again after ``_ACK_RETRY_S``, so that each burst
        does not wait for the lock again; ``now_or_never`` (at shutdown) tries at once."""
        if not self.pending or (not now_or_never and time.monotonic() < self._retry_wall):
            return
        try:
            self.journal.record_acks(self.pending)
        except JournalError as exc:
            if self.error is None:
                log.error("journal write failed: acks not recorded", extra={"fields": {"error": str(exc)}})
            self.error = str(exc)
            self._retry_wall = time.monotonic() + _ACK_RETRY_S
            if len(self.pending) > _ACKS_KEPT:
                del self.pending[: len(self.pending) - _ACKS_KEPT]  # the oldest go
            return
        if self.error is not None:
            log.info("journal written again: acks recorded")
        self.error = None
        self.pending = []


class JournalUpkeep:
    """Called every second or so (the health task): the journal file is still the one open
    (:attr:`file_problem` says what is wrong, else None), and rows older than ``keep_days`` go
    (0: kept for ever)."""

    def __init__(self, journal: Journal, keep_days: float) -> None:
        self.journal = journal
        self.keep_days = keep_days
        self.file_problem: str | None = None  # the journal file was removed or replaced
        self._checked_wall = -math.inf  # time.monotonic() of the last check of the journal file
        self._pruned_wall = -math.inf  # time.monotonic() of the last prune

    def check_file(self) -> None:
        """Every few seconds: the journal's path still names the file the service has open. A removed
        or replaced file is not recreated (what was journaled is gone or elsewhere): the error is
        logged once and ``/readyz`` says so until the file is back."""
        if time.monotonic() - self._checked_wall < _JOURNAL_CHECK_INTERVAL_S:
            return
        self._checked_wall = time.monotonic()
        problem = self.journal.file_problem()
        if problem is not None and self.file_problem is None:
            log.error(problem, extra={"fields": {"path": self.journal.path}})
        elif problem is None and self.file_problem is not None:
            log.info("journal file is back", extra={"fields": {"path": self.journal.path}})
        self.file_problem = problem

    def prune(self) -> None:
        """Once an hour: delete decisions and closed commands older than ``journal.keep_days``."""
        keep_days = self.keep_days
        if keep_days <= 0 or time.monotonic() - self._pruned_wall < _JOURNAL_PRUNE_INTERVAL_S:
            return
        self._pruned_wall = time.monotonic()
        try:
            decisions, commands, acks, looked_at = self.journal.prune(
                time.time() - keep_days * 86_400.0, _JOURNAL_PRUNE_BATCH
            )
        except JournalError as exc:
            log.warning("journal prune failed: %s", exc)
            return
        if looked_at >= _JOURNAL_PRUNE_BATCH and decisions:
            # a full batch deleted: a backlog (a first prune of a long history), the rest soon. The batch holds
            # only decisions that can go (those kept for an open command are passed over, so a run of them
            # among the oldest does not stop the prune from reaching newer history).
            self._pruned_wall = -math.inf
        if decisions or commands:
            log.info(
                "journal pruned",
                extra={"fields": {"decisions": decisions, "commands": commands, "acks": acks, "keep_days": keep_days}},
            )
