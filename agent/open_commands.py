"""What the agent's command modules share: an open command (one the agent waits on an ack for), the
kinds of card setting a command overlays, which kinds a newer command supersedes, and a command of a
decision before it is encoded (an :data:`Item`).

The modules: ``agent.command_overlays`` (what the open commands will have set, and what refusals hold
back), ``agent.command_diff`` (a decision's commands), ``agent.command_book`` (the open commands
and their acks), ``agent.publisher`` (sending and retrying them); ``agent.publish`` explains the whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.journal import NewCommand

IntArray = npt.NDArray[np.int64]

__all__ = ["HOST", "LEVEL", "LIMIT", "N_KINDS", "SLEEP", "SUPERSEDES", "Command", "Item", "OpenCommand", "new_commands"]

#: the kinds of card setting a rack command overlays (-1: a command that sets none of them)
LEVEL, SLEEP, LIMIT, HOST = 0, 1, 2, 3
N_KINDS = 4
#: the open commands a newer one of a kind supersedes on its cards: those of the kinds that set the
#: same (docs/protocol.md: a card's DVFS level, its power limit, its power state). A host power command
#: also overrides the sleep or wake of its cards; a sleep or wake does not make a host command
#: obsolete (a decision powers a host on, then wakes cards of it)
SUPERSEDES = {LEVEL: (LEVEL,), LIMIT: (LIMIT,), SLEEP: (SLEEP,), HOST: (SLEEP, HOST)}

Command = wire.RackCommand | wire.CduCommand | wire.FacilityCommand | wire.SchedulerCommand
#: (overlay kind or -1, command, whether it lowers power)
Item = tuple[int, Command, bool]


@dataclass
class OpenCommand:
    """A command the book is waiting on (sent or about to be)."""

    command_id: str
    target: str  # rack name, "facility" or "scheduler"
    topic: str
    payload: bytes
    issued_s: float
    expires_s: float
    kind: int = -1  # LEVEL / SLEEP / LIMIT / HOST for rack commands, -1 otherwise
    cards: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    key: int = 0
    attempts: int = 0
    first_sent_s: float = -math.inf  # site time of its first send by this process
    last_sent_s: float = -math.inf
    superseded_by: str | None = None  # the newer command that closed it
    #: its issue time on the wire (``ts``: ``issued_s``, or the newest stamp given when the site clock
    #: stepped back, ``CommandBook.stamp_hold_s``); NaN: ``issued_s``
    stamp_s: float = math.nan
    #: closed because the site clock stepped back past its stamp (``CommandBook.expire``): no rack applies it
    left_behind: bool = False

    @property
    def ts_s(self) -> float:
        """Its issue time on the wire (``stamp_s``, else ``issued_s``)."""
        return self.stamp_s if math.isfinite(self.stamp_s) else self.issued_s


def new_commands(opens: Iterable[OpenCommand]) -> list[NewCommand]:
    """The journal's view of commands (an id, a target, a topic and bytes)."""
    return [NewCommand(o.command_id, o.target, o.topic, o.payload, o.issued_s, o.expires_s) for o in opens]
