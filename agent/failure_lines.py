"""The rhythm of the service's log lines for failures that repeat (:class:`FailureLines`): a message
whose handling raises, a round whose estimation raises, a journal write on a full disk tried each
cycle. Each is counted; a line is logged at most once every :data:`LOG_INTERVAL_S` of wall time,
with the number failed since the last line, so that a failure that repeats does not flood the log.
"""

from __future__ import annotations

import dataclasses
import math
import time

__all__ = ["LOG_INTERVAL_S", "FailureLines", "WriteFailures"]

LOG_INTERVAL_S = 60.0  # wall s between two log lines of the same failure (messages, rounds, journal writes)


@dataclasses.dataclass
class FailureLines:
    """Failures counted, and logged at most once every ``LOG_INTERVAL_S`` of wall time.
    A failure that lasts (a journal write on a full disk, tried each cycle) counts itself with
    :meth:`failed` and ends with :meth:`recovered`: its first failure is logged at once, the repeats
    once a minute with their number, and the next failure after a recovery at once again."""

    last_wall: float = -math.inf
    last_count: int = 0
    failures: int = 0  # since the last recovery (counted by :meth:`failed`)

    def due(self, count: int) -> int | None:
        """With ``count`` failures so far: None while the last line is recent, else the number failed since
        that line (this one is then said to be logged)."""
        wall = time.monotonic()
        if wall - self.last_wall < LOG_INTERVAL_S:
            return None
        since, self.last_wall, self.last_count = count - self.last_count, wall, count
        return since

    def failed(self) -> int | None:
        """One more failure: :meth:`due` on the failures since the last recovery."""
        self.failures += 1
        return self.due(self.failures)

    def recovered(self) -> int:
        """The failures since the last recovery (0: none), forgotten, and so is the last line's time."""
        n = self.failures
        self.last_wall, self.last_count, self.failures = -math.inf, 0, 0
        return n


@dataclasses.dataclass
class WriteFailures(FailureLines):
    """A write tried again and again (a journal write each cycle or interval): why the last one failed
    (:attr:`error`, None once one works: the agent's readiness reads it) and the rhythm of its log lines."""

    error: str | None = None

    def failed_with(self, error: str) -> int | None:
        """The write failed for ``error``: :meth:`failed`'s answer (a line is due when not None)."""
        self.error = error
        return self.failed()

    def succeeded(self) -> int:
        """The write worked: the failures it ends (0: none, no line due; else a line saying it works again)."""
        if self.error is None:
            return 0
        self.error = None
        return self.recovered()
