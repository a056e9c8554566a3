"""Other agents on the site (docs/agent.md, "Another agent on the site").

Each run of the agent names itself in the ``publisher`` of its status and commands
(:class:`AgentInstance`); :class:`OtherAgents` keeps what one agent knows of the others on its site
from their statuses and from commands it did not send, and decides (:meth:`OtherAgents.blocker`)
whether it must stand by: of two agents in enforce mode the one that started first commands, a rule
both sides apply to the same two publishers. ``agent.standby`` applies it; the service
(``agent.service``) does the I/O.
"""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from agent import wire
from agent.config import host_name

__all__ = ["MAX_PEERS", "PEER_PROOF_S", "PEER_SILENT_S", "STATUS_EVERY_S", "AgentInstance", "OtherAgents", "Peer"]

STATUS_EVERY_S = 10.0  # wall seconds between publications of the agent's status: its sign of life
PEER_SILENT_S = 35.0  # wall seconds without a sign of life after which another agent is taken for gone
PEER_PROOF_S = 12.0  # wall seconds a retained "online" of another agent waits for a sign of life
MAX_PEERS = 256  # publishers on the status and command topics kept at most (the least recently heard go)

_PUBLISHER_RE = re.compile(r"agent@([A-Za-z0-9_.-]{1,64}):(\d{1,10}):(\d{1,16}):([0-9a-f]{12})")


@dataclass(frozen=True)
class AgentInstance:
    """One run of an agent, named on the wire by the ``publisher`` of its status and commands:
    ``agent@<host>:<pid>:<start, Unix ms>:<random id>``. Of two agents in enforce mode on one site,
    the one that started first commands (:meth:`rank`: start time, then id, the same on both sides)."""

    host: str
    pid: int
    started_ms: int
    instance_id: str

    @classmethod
    def current(cls) -> AgentInstance:
        return cls(host_name(), os.getpid(), int(time.time() * 1000), uuid.uuid4().hex[:12])

    @classmethod
    def parse(cls, publisher: str) -> AgentInstance | None:
        """The instance a publisher names, or None (another program, or an agent before instance ids)."""
        m = _PUBLISHER_RE.fullmatch(publisher)
        return None if m is None else cls(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4))

    @property
    def publisher(self) -> str:
        return f"agent@{self.host}:{self.pid}:{self.started_ms}:{self.instance_id}"

    def rank(self) -> tuple[int, str]:
        return (self.started_ms, self.instance_id)

    def describe(self) -> str:
        started = datetime.fromtimestamp(self.started_ms / 1000.0, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"agent {self.instance_id} on host {self.host} (pid {self.pid}, started {started})"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user has that pid
        return True
    return True


@dataclass
class Peer:
    """Another publisher on the site's agent status or command topics."""

    publisher: str
    instance: AgentInstance | None  # None: not an agent that names its instance (another program, an older agent)
    mode: str | None  # "enforce" or "advisory" as its status says; "enforce" once it was seen commanding
    online: bool
    seen_wall: float  # when first seen (time.monotonic() less the time cut off from the broker, as below)
    alive_wall: float = -math.inf  # its last sign of life: a status published while we listened, a command
    seq: int = -1  # the highest ``seq`` of its statuses seen
    detail: str = ""

    def name(self) -> str:
        return self.instance.describe() if self.instance is not None else f"publisher {self.publisher!r}"


def _last_heard(peer: Peer) -> float:
    return max(peer.alive_wall, peer.seen_wall)


class OtherAgents:
    """What an agent knows of the other agents on its site, from their statuses (retained on
    ``agent/status``, published again every :data:`STATUS_EVERY_S`) and from commands on the site's
    command topics that it did not send.

    A status counts as a sign of life when it is published while this agent listens (not the retained
    copy a subscription gets) or when a retained copy is newer than a status seen before; a command
    always does, as of its stamp. An agent is *alive* while online with a sign of life in the last
    :data:`PEER_SILENT_S`; a retained "online" without one since it was first seen (copies of its
    commands stamped more than :data:`PEER_SILENT_S` ago prove nothing now, nor end the wait) is
    *unconfirmed* for :data:`PEER_PROOF_S` after it was first seen (then stale: a host that died before its will was
    published), unless it names an earlier run on this host whose process is gone (a restart after a
    crash: stale at once). :meth:`blocker` applies the rule both sides agree on.

    Silence counts only while this agent listens (:meth:`listening`): the times kept and compared
    here are on a clock that stops while this agent is cut off from the broker, so that an agent it
    could not hear is not taken for gone (nor a retained status for stale) for that reason."""

    def __init__(self, me: AgentInstance) -> None:
        self.me = me
        self.peers: dict[str, Peer] = {}
        self._deaf_since: float | None = None  # wall time this agent was cut off from the broker, or None
        self._deaf_s = 0.0  # wall seconds it was cut off before that

    def listening(self, connected: bool, now_wall: float) -> None:
        """Whether this agent is connected to the broker now (the service says so before each use)."""
        if not connected and self._deaf_since is None:
            self._deaf_since = now_wall
        elif connected and self._deaf_since is not None:
            self._deaf_s += max(now_wall - self._deaf_since, 0.0)
            self._deaf_since = None

    def _t(self, now_wall: float) -> float:
        """``now_wall`` on the listening clock (stopped while cut off from the broker)."""
        if self._deaf_since is not None:
            now_wall = min(now_wall, self._deaf_since)
        return now_wall - self._deaf_s

    def _peer(self, publisher: str, now_wall: float) -> Peer:
        peer = self.peers.get(publisher)
        if peer is None:
            peer = Peer(publisher, AgentInstance.parse(publisher), None, False, now_wall)
            self.peers[publisher] = peer
        return peer

    def on_status(self, status: wire.AgentStatus, retained: bool, now_wall: float) -> Peer | None:
        """Take another agent's status; the agent when the status was a sign of life, else None. An
        "online" no newer (by ``seq``) than a status seen before is an old copy (a persistent session's
        backlog) and changes nothing; an "offline" always counts (its last will was numbered when it
        connected, before the statuses that followed)."""
        if status.publisher == self.me.publisher:
            return None
        now_wall = self._t(now_wall)
        known = status.publisher in self.peers and self.peers[status.publisher].seq >= 0  # a status seen before
        peer = self._peer(status.publisher, now_wall)
        online = status.state is wire.AgentState.ONLINE
        if known and online and status.seq <= peer.seq:
            return None
        live = not retained or known
        peer.online = online
        if status.mode is not None:
            peer.mode = status.mode
        peer.seq = max(peer.seq, status.seq)
        peer.detail = status.detail or ""
        if live:
            peer.alive_wall = now_wall
        return peer if live else None

    def on_command(self, publisher: str, now_wall: float, age_s: float = 0.0) -> Peer | None:
        """A command this agent did not send, stamped ``age_s`` wall seconds ago: its publisher
        commanded the site then (None: an agent whose last status said offline, so an old copy). It
        is a sign of life as of its stamp, not of its arrival: the copies a persistent session kept
        while this agent was under another client id do not bring back an agent silent since."""
        now_wall = self._t(now_wall)
        peer = self._peer(publisher, now_wall)
        if peer.seq >= 0 and not peer.online:
            return None
        peer.online = True
        peer.mode = "enforce"
        peer.alive_wall = max(peer.alive_wall, now_wall - max(age_s, 0.0))
        return peer

    def earlier_run_here(self, instance: AgentInstance | None) -> bool:
        """An earlier run of an agent on this host whose process is gone (or whose pid is ours now)."""
        me = self.me
        return (
            instance is not None
            and instance.host == me.host
            and instance.rank() < me.rank()
            and (instance.pid == me.pid or not _pid_alive(instance.pid))
        )

    def forget(self, before_wall: float) -> None:
        """Drop the publishers not heard from since before ``before_wall``, offline or not (each run of
        an agent is a new one: a run whose ``offline`` this agent missed, a program that stopped
        sending commands, would otherwise be kept for good), and the least recently heard beyond
        :data:`MAX_PEERS`."""
        before_wall = self._t(before_wall)
        for key in [k for k, p in self.peers.items() if _last_heard(p) < before_wall]:
            del self.peers[key]
        if len(self.peers) > MAX_PEERS:
            for key in sorted(self.peers, key=lambda k: _last_heard(self.peers[k]))[: len(self.peers) - MAX_PEERS]:
                del self.peers[key]

    def alive(self, now_wall: float) -> list[Peer]:
        now_wall = self._t(now_wall)
        return [p for p in self.peers.values() if p.online and now_wall - p.alive_wall <= PEER_SILENT_S]

    def unconfirmed(self, now_wall: float) -> list[Peer]:
        """Agents whose status says online (a retained copy) with no sign of life since they were first
        seen (none at all, or only copies of commands stamped before: a sign of life then, not now),
        within :data:`PEER_PROOF_S` of that."""
        now_wall = self._t(now_wall)
        return [
            p
            for p in self.peers.values()
            if p.online
            and p.seq >= 0
            and p.alive_wall < p.seen_wall
            and now_wall - p.seen_wall < PEER_PROOF_S
            and not self.earlier_run_here(p.instance)
        ]

    def outranks(self, peer: Peer) -> bool:
        """Whether ``peer`` commands rather than this agent: it is in enforce mode and started first,
        or it is a publisher of commands that names no instance (it cannot be asked to stand by)."""
        return peer.mode == "enforce" and (peer.instance is None or peer.instance.rank() < self.me.rank())

    def blocker(self, now_wall: float) -> tuple[Peer, bool] | None:
        """The agent this one must leave the site to, and whether it is confirmed alive (False: a
        retained "online" not yet confirmed); None: this agent may command."""
        for confirmed, peers in ((True, self.alive(now_wall)), (False, self.unconfirmed(now_wall))):
            ranked = sorted(
                (p for p in peers if self.outranks(p)),
                key=lambda p: (1, *p.instance.rank()) if p.instance is not None else (0, 0, p.publisher),
            )
            if ranked:
                return ranked[0], confirmed
        return None

    def competing(self, now_wall: float) -> list[Peer]:
        """Other agents alive in enforce mode (and publishers of commands) on this site."""
        return [p for p in self.alive(now_wall) if p.mode == "enforce"]
