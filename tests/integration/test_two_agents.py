"""Two agents on one site over a real mosquitto (docs/agent.md, "Another agent on the site"): the
cases tests/integration/test_agent_service.py does not cover, where the later agent must not command
while the first one does (a link of its own cut for longer than the other's silence)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from site_testing import write_capped_small_site
from test_agent_service import LIMIT_W, SITE_ID, START, loaded_config, wait_for
from test_agent_service import write_config as write_agent_config

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus, Incoming, MqttOptions
from agent.service import AgentService
from sim.runner import SimOptions, Simulator
from twin.scenario import RunScenario, run_scenario_from_dict
from twin.spec import load_site

pytestmark = pytest.mark.integration

SPEED = 20.0
#: how long another agent may be silent before it is taken for gone here (35 s in a deployment)
SILENT_S = 2.5
#: what mosquitto logs when a CONNECT takes the session of a client id that is connected
SESSION_TAKEN = "already connected, closing old connection"


def write_config(folder: Path, *, ttl_s: float = 30.0) -> Path:
    """An agent's configuration and its site (test_agent_service's, at :data:`SPEED`) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_capped_small_site(folder, LIMIT_W)
    return write_agent_config(folder, speed=SPEED, ttl_s=ttl_s)


def two_jobs(site_path: Path, submit_b_s: float) -> RunScenario:
    """Job a (16 cards) running from the start, job b (8 cards) submitted at ``submit_b_s``."""
    jobs = [
        {"id": "a", "n_cards": 16, "duration_s": 36000.0, "compute_share": 0.97, "running_at_start": True},
        {"id": "b", "n_cards": 8, "duration_s": 36000.0, "compute_share": 0.97, "submit_time_s": submit_b_s},
    ]
    return run_scenario_from_dict(
        {
            "name": "two-agents",
            "duration_s": 400.0,
            "seed": 7,
            "workload": {"source": "none"},
            "ambient": {"kind": "constant", "temp_c": 25.0},
            "jobs": jobs,
        },
        source="two-agents",
        site=load_site(site_path),
    )


def agent_on(host: str, cfg: Path, broker: EmbeddedBroker, mqtt: MqttOptions) -> AgentService:
    """An agent as if on ``host`` (agents of one test share a process: on one host with one pid, each
    would take the other for an earlier run of itself whose process is gone)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("agent.other_agents.host_name", lambda: host)
        return AgentService(loaded_config(cfg, broker), mqtt=mqtt, http=False)


@dataclasses.dataclass(frozen=True)
class Check:
    """One application of an agent's rule on the other agents (``Standby.check``), as it left the agent."""

    wall: float  # time.monotonic() just after it
    connected: bool
    standing_by: bool  # standing by for another agent
    commanding: bool


def checks_of(agent: AgentService, monkeypatch: pytest.MonkeyPatch) -> list[Check]:
    """Every check of ``agent``'s from now on: at each status and command of another agent's, and at
    each of its health rounds (every second). The agent's own checks are what a test waits for, not
    wall time: an event loop starved of CPU makes them late, and a test that samples the agent's state
    on its own clock sees nothing happen."""
    seen: list[Check] = []
    check = agent.standby.check

    def recorded() -> None:
        check()
        seen.append(Check(time.monotonic(), agent.bus.connected, agent.standing_by_for is not None, agent.commanding()))

    monkeypatch.setattr(agent.standby, "check", recorded)
    return seen


@contextlib.asynccontextmanager
async def commands_seen(broker: EmbeddedBroker, site_path: Path) -> AsyncIterator[list[tuple[float, Any]]]:
    """Every command published on the site, with the wall time it arrived."""
    codec = wire.Codec(wire.SiteLayout.from_spec(load_site(site_path), site=SITE_ID))
    t = codec.topics
    seen: list[tuple[float, Any]] = []

    def handle(m: Incoming) -> None:
        msg = codec.decode(m.topic, m.payload)
        if isinstance(msg, wire.RackCommand | wire.CduCommand | wire.FacilityCommand | wire.SchedulerCommand):
            seen.append((time.monotonic(), msg))

    subs = [t.filter(wire.Kind.RACK_CMD), t.filter(wire.Kind.CDU_CMD), t.facility_cmd, t.scheduler_cmd]
    async with Bus(broker.options(), subscriptions=subs, on_message=handle, name="observer") as bus:
        await bus.wait_connected(10)
        yield seen


class CuttableLink:
    """A TCP proxy to the broker that can be cut (its connections closed, new ones refused) and
    restored on the same port: one client's own link to the broker going down and coming back; or
    frozen: nothing passes and nothing is closed, as when the client's host dies (the broker keeps
    the connection, and its last will, until the keepalive runs out)."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.frozen = False  # nothing passes, and no connection is closed (a host that died)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.broker_port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    if not self.frozen:
                        dst.write(data)
                        await dst.drain()
            if not self.frozen:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in self._writers:
            w.close()
        self._writers = []


async def test_a_standby_cut_off_from_the_broker_goes_on_standing_by(
    mosquitto: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent B stands by for agent A (one client id shared by mistake: B under its own standby id).
    B's own link to the broker goes down for longer than A may be silent (35 s; 2.5 s here, statuses
    every 0.5 s) while A goes on commanding: until B has checked, cut off, with A silent on the wall
    clock for twice that. B heard nothing from A because it heard nothing at all:
    it must not take that for A's end. It used to: cut off, it logged A gone and took over (its
    status, /readyz and racktwin_agent_standby said it commanded), and went back to the shared client
    id, so that its reconnection took A's session from A (A's connection closed, its will published)."""
    monkeypatch.setattr("agent.other_agents.PEER_SILENT_S", SILENT_S)
    monkeypatch.setattr("agent.status.STATUS_EVERY_S", 0.5)
    cfg_a, cfg_b = write_config(tmp_path / "a"), write_config(tmp_path / "b")
    scenario = two_jobs(tmp_path / "a" / "site.toml", submit_b_s=150.0)
    link = CuttableLink(mosquitto.port)
    await link.up()
    shared = {"client_id": "racktwin-agent", "clean_session": False}
    async with commands_seen(mosquitto, tmp_path / "a" / "site.toml") as seen:
        a = agent_on("host-a", cfg_a, mosquitto, mosquitto.options(**shared))
        a_task = asyncio.create_task(a.run())
        await wait_for(lambda: a.bus.connected and a.bus.stats.published > 0, what="agent A online")
        b_options = dataclasses.replace(
            mosquitto.options(**shared), port=link.port, reconnect_min_s=0.05, reconnect_max_s=0.2
        )
        b = agent_on("host-b", cfg_b, mosquitto, b_options)
        b_task = asyncio.create_task(b.run())
        standing_by: list[bool] = []
        checks = checks_of(b, monkeypatch)
        sim_task: asyncio.Task[Any] | None = None
        try:
            await wait_for(lambda: b.standing_by_for is not None, 30, "agent B standing by")
            await wait_for(lambda: b.bus.connected and a.bus.connected, 30, "B under its standby id, A connected")
            sim = Simulator(
                SimOptions(
                    scenario=scenario, mqtt=mosquitto.options(), site_id=SITE_ID, speed=SPEED, start_epoch_s=START
                )
            )
            sim_task = asyncio.create_task(sim.run())
            await wait_for(lambda: bool(seen) and b.decisions >= 2, 60, "agent A commanding, B deciding")
            a_connects = a.bus.stats.connects
            takeovers = mosquitto.log_text().count(SESSION_TAKEN)
            await link.cut()
            cut_wall = time.monotonic()
            await wait_for(lambda: not b.bus.connected, 30, "agent B cut off")
            # A goes on commanding; B, cut off, last heard from A before the cut: a check of B's while
            # still cut off, twice A's allowed silence after the cut, would find A gone on the wall clock
            await wait_for(
                lambda: any(c.wall > cut_wall + 2 * SILENT_S and not c.connected for c in checks),
                60,
                f"a check of agent B's, cut off, {2 * SILENT_S} s after the cut",
            )
            standing_by = [c.standing_by and not c.commanding for c in checks if c.wall > cut_wall]
            await link.up()
            await wait_for(lambda: b.bus.connected, 30, "agent B back")
            # the broker closes the connection whose client id a CONNECT takes (and logs it) before it
            # answers that CONNECT: B connected again, the take-over would be in the log by now
            takeovers_since = mosquitto.log_text().count(SESSION_TAKEN) - takeovers
            assert takeovers_since == 0, "B's reconnection took A's session"
            await wait_for(lambda: any(w > cut_wall for w, _m in seen), 60, "a command after the cut")
            assert a.commanding() and a.bus.connected
            assert a.bus.stats.connects == a_connects
            assert b.standing_by_for is not None and b.standing_by_for.publisher == a.instance.publisher
            assert (b.bus.options.client_id or "").startswith("racktwin-agent-standby-")
        finally:
            a.stop()
            b.stop()
            await link.cut()
            await asyncio.wait_for(asyncio.gather(a_task, b_task, return_exceptions=True), 15)
            if sim_task is not None:
                sim_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sim_task
    assert all(standing_by), f"agent B took over while cut off from the broker: {standing_by}"
    after = [m.publisher for wall, m in seen if wall > cut_wall]
    assert after and set(after) == {a.instance.publisher}, f"agent B commanded: {after.count(b.instance.publisher)}"


async def test_an_agent_that_took_over_from_a_silent_one_is_not_held_back_by_its_old_commands(
    mosquitto: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's host dies (its link frozen: no will before the keepalive runs out); B, standing by under its
    own id, takes over once A has been silent (35 s; 2.5 s here) and goes back to its configured,
    persistent session, where the broker kept A's last commands for it. Those copies (command_ttl_s
    longer than the silence) are no sign that A lives now. They used to be: B stood by again for
    another silence, and the site went without an agent twice as long."""
    monkeypatch.setattr("agent.other_agents.PEER_SILENT_S", SILENT_S)
    monkeypatch.setattr("agent.status.STATUS_EVERY_S", 0.5)
    cfg_a, cfg_b = write_config(tmp_path / "a", ttl_s=300.0), write_config(tmp_path / "b", ttl_s=300.0)
    scenario = two_jobs(tmp_path / "a" / "site.toml", submit_b_s=20.0)
    link = CuttableLink(mosquitto.port)
    await link.up()
    a_options = dataclasses.replace(
        mosquitto.options(client_id="agent-a", clean_session=False), port=link.port, keepalive_s=60
    )
    a = agent_on("host-a", cfg_a, mosquitto, a_options)
    a_task = asyncio.create_task(a.run())
    sim_task: asyncio.Task[Any] | None = None
    b_task: asyncio.Task[None] | None = None
    standing_by: list[bool] = []
    try:
        await wait_for(lambda: a.bus.connected and a.bus.stats.published > 0, what="agent A online")
        b = agent_on("host-b", cfg_b, mosquitto, mosquitto.options(client_id="agent-b", clean_session=False))
        checks = checks_of(b, monkeypatch)
        b_task = asyncio.create_task(b.run())
        await wait_for(lambda: b.standing_by_for is not None, 30, "agent B standing by")
        await wait_for(lambda: (b.bus.options.client_id or "").startswith("agent-b-standby-"), 30, "B's standby id")
        sim = Simulator(
            SimOptions(scenario=scenario, mqtt=mosquitto.options(), site_id=SITE_ID, speed=SPEED, start_epoch_s=START)
        )
        sim_task = asyncio.create_task(sim.run())
        await wait_for(lambda: a.publisher.stats.sent > 0 and b.decisions >= 3, 60, "agent A commanding")
        link.frozen = True
        frozen_at = len(checks)
        await wait_for(lambda: b.standing_by_for is None, 30, "agent B taking over")
        await wait_for(lambda: b.bus.options.client_id == "agent-b" and b.bus.connected, 30, "B in its own session")
        # the broker hands B its session's backlog first, then what is published from now on: once B has
        # taken in a marker published now (an agent saying it is offline: nobody to stand by for), it
        # has taken in A's commands kept for it (a slow machine takes longer, the order is the same)
        async with Bus(mosquitto.options(), name="marker") as marker:
            await marker.wait_connected(30)
            offline = wire.AgentStatus(wire.AgentState.OFFLINE, "0", ts_s=START, seq=0, publisher="marker")
            await marker.publish(wire.Topics(SITE_ID).agent_status, wire.encode(offline), qos=1)
        await wait_for(lambda: "marker" in b.standby.others.peers, 30, "B taking in its session's backlog")
        backlog_in = time.monotonic()
        # and a silence more, connected: until a check of B's says so (each of A's old commands in the
        # backlog was a check of B's too, so B standing by for one is among the checks on any machine)
        await wait_for(
            lambda: any(c.wall > backlog_in + SILENT_S and c.connected for c in checks),
            60,
            f"a check of agent B's {SILENT_S} s after it took in its session's backlog",
        )
        took_over = next(i for i in range(frozen_at, len(checks)) if not checks[i].standing_by)
        standing_by = [not c.commanding for c in checks[took_over:]]
    finally:
        a.stop()
        if b_task is not None:
            b.stop()
        await link.cut()
        await asyncio.wait_for(asyncio.gather(a_task, *([b_task] if b_task else []), return_exceptions=True), 15)
        if sim_task is not None:
            sim_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sim_task
    assert not any(standing_by), f"agent B stood by again for agent A, silent since: {standing_by}"
