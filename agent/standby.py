"""Whether this agent commands its site or stands by for another (docs/agent.md, "Another agent on
the site").

:class:`Standby` feeds what the service hears of the other agents (their statuses, commands this
agent did not send) to :class:`agent.other_agents.OtherAgents`, applies its rule
(:meth:`OtherAgents.blocker`) and says what changed: the log lines, :attr:`Standby.status_due` for
the status publisher (``agent.status``), and two callbacks for the service: ``on_stand_by`` (the
open commands are dropped: the other agent decides now) and ``on_commanding`` (the journal's open
commands are taken up, once). It sends nothing itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agent import wire
from agent.other_agents import PEER_PROOF_S, PEER_SILENT_S, AgentInstance, OtherAgents, Peer

__all__ = ["Standby"]

log = logging.getLogger("racktwin.agent")

_PEER_FORGET_S = 3600.0  # wall seconds after which another publisher not heard from is forgotten


class Standby:
    """This agent's place on its site: commanding, standing by for another agent
    (:attr:`standing_by_for`), or waiting for a sign of life from an agent a retained status says is
    online (:attr:`unconfirmed`). ``mode`` is the configured one (only an agent in enforce mode
    commands); ``connected`` says whether the agent hears the broker now (another agent's silence
    counts only while it does)."""

    def __init__(
        self,
        others: OtherAgents,
        *,
        mode: str,
        site_id: str,
        connected: Callable[[], bool],
        on_stand_by: Callable[[], None],
        on_commanding: Callable[[], None],
    ) -> None:
        self.others = others
        self.instance = others.me
        self.mode = mode
        self.site_id = site_id
        self._connected = connected
        self._on_stand_by = on_stand_by
        self._on_commanding = on_commanding
        #: the agent this one leaves the site to (standby: it commands nothing), or None
        self.standing_by_for: Peer | None = None
        self.unconfirmed: Peer | None = None  # a retained "online" that keeps this agent waiting
        #: publish the status now: it says something new (standing by, waiting) or answers another agent's
        self.status_due = asyncio.Event()
        self._answer_due = False  # another agent's status came while this one commands: answer it
        self._peers_reported: set[str] = set()  # other agents logged as alive

    def commanding(self) -> bool:
        """Whether the agent sends commands now: enforce mode, and no other agent to leave the site to."""
        return self.mode == "enforce" and self.standing_by_for is None and self.unconfirmed is None

    def take_answer_due(self) -> bool:
        """Whether another agent's status is to be answered (said once: the flag is cleared)."""
        due, self._answer_due = self._answer_due, False
        return due

    def competing(self) -> list[Peer]:
        """Other agents alive in enforce mode (and publishers of commands) on the site; none in advisory mode."""
        return self.others.competing(self._listening_wall()) if self.mode == "enforce" else []

    def _listening_wall(self) -> float:
        """time.monotonic(), once :class:`OtherAgents` knows whether this agent hears the broker now
        (another agent's silence counts only while it does)."""
        now_wall = time.monotonic()
        self.others.listening(self._connected(), now_wall)
        return now_wall

    def on_status(self, status: wire.AgentStatus, retained: bool) -> None:
        """Another agent's status (or this agent's own, which changes nothing)."""
        peer = self.others.on_status(status, retained, self._listening_wall())
        if peer is None:
            return
        if not peer.online:
            level = logging.WARNING if peer.publisher in self._peers_reported else logging.INFO
            self._peers_reported.discard(peer.publisher)
            log.log(level, "%s went offline", peer.name(), extra={"fields": {"detail": peer.detail}})
        commanded = self.commanding()
        self.check()
        # answered only while this agent commands, before and after: a status that makes it stand by
        # (or command again) is a change, published at once by check(), not held as an answer
        if commanded and self.commanding():
            self._answer_due = True
            self.status_due.set()

    def on_command(self, publisher: str, age_s: float) -> bool:
        """A command this agent did not send (neither this run nor an earlier one on its journal, and
        not expired), stamped ``age_s`` wall seconds ago; True when it counts as another publisher's
        (not an earlier run on this host, with another journal, nor an old copy of an agent gone offline)."""
        if self.others.earlier_run_here(AgentInstance.parse(publisher)):
            return False  # an earlier run on this host, with another journal: gone
        if self.others.on_command(publisher, self._listening_wall(), age_s) is None:
            return False
        self.check()
        return True

    def check(self) -> None:
        """Apply :meth:`OtherAgents.blocker`: stand by (and say so) when another agent commands the
        site and outranks this one, command again when it is gone (silent for :data:`PEER_SILENT_S`
        while this agent was connected: cut off from the broker, it hears nobody); log agents appearing."""
        now_wall = self._listening_wall()
        self.others.forget(now_wall - _PEER_FORGET_S)
        self._peers_reported.intersection_update(self.others.peers)
        for peer in self.others.competing(now_wall) if self.mode == "enforce" else []:
            if peer.publisher not in self._peers_reported:
                self._peers_reported.add(peer.publisher)
                who = "it commands" if self.others.outranks(peer) else "it started later and stands by"
                log.error(
                    "another agent in enforce mode on site %s: %s (%s); this is %s",
                    self.site_id,
                    peer.name(),
                    who,
                    self.instance.describe(),
                    extra={"fields": {"other": peer.publisher, "other_status": peer.detail}},
                )
        found = self.others.blocker(now_wall) if self.mode == "enforce" else None
        blocker, confirmed = found if found is not None else (None, False)
        was = self.standing_by_for
        self.standing_by_for = blocker if confirmed else None
        unconfirmed = None if confirmed else blocker
        if unconfirmed is not None and self.unconfirmed is None:
            log.warning(
                "the retained status says %s is online in enforce mode: waiting up to %.0f s for a sign of life "
                "from it before commanding",
                unconfirmed.name(),
                PEER_PROOF_S,
            )
        elif unconfirmed is None and self.unconfirmed is not None and self.standing_by_for is None:
            log.info(
                "%s does not hold this agent back: %s",
                self.unconfirmed.name(),
                "offline" if not self.unconfirmed.online else f"no sign of life for {PEER_PROOF_S:.0f} s",
            )
        if (unconfirmed is None) != (self.unconfirmed is None):
            self.status_due.set()  # the status says whom it waits for
        self.unconfirmed = unconfirmed
        by = self.standing_by_for
        if by is not None and (was is None or was.publisher != by.publisher):
            log.error(
                "standing by: %s commands site %s; this agent (%s) sends no command until it is gone "
                "(stop one of them; the agent that started first commands)",
                by.name(),
                self.site_id,
                self.instance.describe(),
                extra={"fields": {"other": by.publisher}},
            )
            self._on_stand_by()
            self.status_due.set()
        elif by is None and was is not None:
            gone = "offline" if not was.online else f"silent for {PEER_SILENT_S:.0f} s"
            log.warning("%s is gone (%s): commanding site %s again", was.name(), gone, self.site_id)
            self.status_due.set()
        if self.commanding():
            self._on_commanding()

    def readiness(self) -> list[str]:
        """Why this agent does not command (for ``/readyz``): standing by, or waiting for a sign of life."""
        if self.standing_by_for is not None:
            return [
                f"standing by: {self.standing_by_for.name()} commands site {self.site_id}; this agent "
                f"({self.instance.describe()}) sends no command until it is gone (stop one of them)"
            ]
        if self.unconfirmed is not None:
            return [
                f"not commanding yet: the retained status says {self.unconfirmed.name()} is online in enforce "
                f"mode; waiting up to {PEER_PROOF_S:.0f} s for a sign of life from it"
            ]
        return []
