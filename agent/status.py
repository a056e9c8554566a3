"""The agent's status on ``agent/status`` (retained): ``online`` with its mode and who it is, or
``offline`` (the broker's last will, or the agent's own at shutdown).

:class:`StatusPublisher` publishes it on every connect, again every :data:`STATUS_EVERY_S` (a sign of
life for the other agents on the site, and a retained status that is never older), at once when
:class:`agent.standby.Standby` says it changes, and in answer to another agent's status while this
one commands. Standing by, the agent connects under a client id of its own
(:meth:`StatusPublisher.wanted_mqtt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time

from agent import racktwin_version, wire
from agent.aio import wait_event
from agent.bus import Bus, BusError, LastWill, MqttOptions
from agent.clock import SiteClock
from agent.other_agents import STATUS_EVERY_S
from agent.standby import Standby

__all__ = ["STATUS_EVERY_S", "VERSION", "StatusPublisher"]

log = logging.getLogger("racktwin.agent")

VERSION = racktwin_version()
_STATUS_ANSWER_GAP_S = 1.0  # a commanding agent answers another's status, but never twice within this


class StatusPublisher:
    """The status of the agent that ``standby`` speaks for, published on ``bus``; ``mqtt`` is the
    configured client options (:meth:`wanted_mqtt` changes them while standing by)."""

    def __init__(self, bus: Bus, codec: wire.Codec, clock: SiteClock, standby: Standby, *, mqtt: MqttOptions) -> None:
        self.bus = bus
        self.codec = codec
        self.clock = clock
        self.standby = standby
        self.instance = standby.instance
        self._mqtt = mqtt
        self._seq = wire.Sequencer(self.instance.publisher)
        self._wall = -math.inf  # time.monotonic() of the last status published

    def message(self, state: wire.AgentState, detail: str) -> wire.Outgoing:
        topic = self.codec.topics.agent_status
        msg = wire.AgentStatus(
            state=state,
            version=VERSION,
            ts_s=self.clock.now_or(time.time()),
            seq=self._seq.next(topic),
            publisher=self.instance.publisher,
            mode=self.standby.mode,
            detail=detail,
        )
        return self.codec.outgoing(msg)

    def online_detail(self) -> str:
        """``enforce mode; agent <id> on host <host> (pid, started), client id <id>``, and whom it
        stands by for or waits for."""
        mode = self.standby.mode
        me = f"{self.instance.describe()}, client id {self.bus.options.client_id or '(random)'}"
        if self.standby.standing_by_for is not None:
            return f"{mode} mode, standing by: {self.standby.standing_by_for.name()} commands this site; {me}"
        if self.standby.unconfirmed is not None:
            return f"{mode} mode, waiting for a sign of life from {self.standby.unconfirmed.name()}; {me}"
        return f"{mode} mode; {me}"

    def will(self) -> LastWill:
        out = self.message(wire.AgentState.OFFLINE, "connection lost")
        return LastWill(out.topic, out.payload, qos=1, retain=True)

    async def publish_online(self, bus: Bus) -> None:
        """On a connect (``bus`` is the one connecting): ``online``, retained."""
        self._wall = time.monotonic()
        await bus.send(self.message(wire.AgentState.ONLINE, self.online_detail()))

    async def publish_offline(self, detail: str) -> None:
        """At shutdown, while connected: ``offline`` with ``detail`` (``clean shutdown``, ``error: ...``)."""
        if self.bus.connected:
            with contextlib.suppress(BusError, TimeoutError):
                await self.bus.send(self.message(wire.AgentState.OFFLINE, detail), timeout_s=2.0)

    async def run(self) -> None:
        """Publish the status every :data:`STATUS_EVERY_S` (a sign of life for the other agents and
        a retained status that is never older), at once when this agent starts or stops standing by,
        and in answer to another agent's status while this one commands (so that a new agent learns
        within a round trip that this one is alive, and the retained status names the agent that
        commands). Standing by, the agent connects under a client id of its own (see
        :meth:`wanted_mqtt`)."""
        due = self.standby.status_due
        while True:
            wait_s = self._wall + STATUS_EVERY_S - time.monotonic()
            await wait_event(due, max(wait_s, 0.0))
            due.clear()
            if self.wanted_mqtt() == self.bus.options and self.standby.take_answer_due():
                # at most one status per _STATUS_ANSWER_GAP_S: no ping-pong
                await asyncio.sleep(max(self._wall + _STATUS_ANSWER_GAP_S - time.monotonic(), 0.0))
            wanted = self.wanted_mqtt()
            if wanted != self.bus.options:
                log.info(
                    "reconnecting as client id %s",
                    wanted.client_id,
                    extra={"fields": {"standing_by": self.standby.standing_by_for is not None}},
                )
                await self.bus.reconnect_with(wanted)  # its on_connect publishes the status
                self._wall = time.monotonic()
                continue
            self._wall = time.monotonic()
            if self.bus.connected:
                with contextlib.suppress(BusError):
                    await self.bus.send(self.message(wire.AgentState.ONLINE, self.online_detail()), timeout_s=2.0)

    def wanted_mqtt(self) -> MqttOptions:
        """The configured MQTT options; standing by, a client id of this run with a clean session,
        so that another agent with the same client id keeps its session (the broker would otherwise
        hand it back and forth: each connect closes the other's connection)."""
        cid = self._mqtt.client_id
        if self.standby.standing_by_for is None or not cid:
            return self._mqtt
        return dataclasses.replace(
            self._mqtt, client_id=f"{cid}-standby-{self.instance.instance_id[:8]}", clean_session=True
        )
