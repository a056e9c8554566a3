"""The log lines of commands refused ``issued_ahead`` (:class:`AheadRefusals`).

A rack (the facility, the scheduler) refuses a command stamped more than it accepts ahead of its
clock (``issued_ahead``: docs/protocol.md, "Which commands a rack applies"). After the site's clock
stepped back (a simulator restarted on an earlier clock, a site's time source corrected) the agent's
clock follows only once the new timeline is confirmed (``agent.clock``: ``confirm_s`` wall seconds):
every command of the decisions made meanwhile, stamped on the old timeline, is refused so (39 in a
few wall seconds at 20x with two racks and the facility, measured by
tests/integration/test_agent_clock_step_back.py). They were each logged at WARNING as "command
rejected", on every simulator restart.

Such refusals are one episode: the first is logged at WARNING at once (the site's clocks are behind
the agent's), the next ones are counted per target and logged at DEBUG, with a WARNING line at most
once every :data:`agent.failure_lines.LOG_INTERVAL_S` of wall time naming how many came since (a rack
whose clock lags on while the others keep the agent's clock where it is). The episode ends with one
INFO line naming how many each target refused: when the agent's clock steps back (the commands were
decided on the timeline it left, or while it ran ahead of the site during a silence: the line says
which, ``agent.command_outcomes``) or, for one target, when that target applies a command again. A
refusal of a command stamped beyond what the target accepts ahead of the agent's clock once that has
stepped back (``CommandBook._leave_old_timeline`` closes such commands) is counted without a WARNING.
Each is still counted in ``racktwin_commands_total{result="rejected"}`` (docs/agent.md, "Metrics").
"""

from __future__ import annotations

import dataclasses

from agent.failure_lines import FailureLines

__all__ = ["AheadRefusals"]


@dataclasses.dataclass
class AheadRefusals:
    """The ``issued_ahead`` refusals of the episode in course, per target, and the rhythm of their
    WARNING lines (see the module docstring)."""

    lines: FailureLines = dataclasses.field(default_factory=FailureLines)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # refusals per target since the episode began

    def refused(self, target: str, *, left_behind: bool = False) -> int | None:
        """One more refusal of ``target``. None: no WARNING line now (log it at DEBUG); else a WARNING
        line is due, naming that many refusals since the last one (this one included). A refusal of a
        command the clock left behind (``left_behind``) is counted and never calls for a line."""
        self.counts[target] = self.counts.get(target, 0) + 1
        if left_behind:
            return None
        return self.lines.failed()

    def applied(self, target: str) -> int:
        """``target`` applied a command: its refusals of the episode (0: none), forgotten; the episode
        ends when no target is left in it (the next refusal is logged at once)."""
        n = self.counts.pop(target, 0)
        if n and not self.counts:
            self.lines.recovered()
        return n

    def clock_stepped_back(self) -> dict[str, int]:
        """The agent's clock stepped back: the episode's refusals per target (empty: none), forgotten."""
        out, self.counts = self.counts, {}
        self.lines.recovered()
        return out
