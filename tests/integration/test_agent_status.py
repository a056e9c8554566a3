"""The agent's status on ``agent/status`` (``agent.status.StatusPublisher``) over a real mosquitto:
what it says, its last will, its client id while standing by, and how often it is published (a sign
of life every STATUS_EVERY_S, an answer to another agent's status at most once a second). The two
agents it serves are tested in test_agent_service.py and test_two_agents.py."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from mqtt_helpers import WAIT_S

from agent import wire
from agent.aio import wait_event
from agent.broker import EmbeddedBroker
from agent.bus import Bus, Incoming, MqttOptions
from agent.clock import SiteClock
from agent.other_agents import AgentInstance, OtherAgents
from agent.standby import Standby
from agent.status import STATUS_EVERY_S, VERSION, StatusPublisher

pytestmark = pytest.mark.integration

SITE_ID = "site1"
ME = AgentInstance("host-a", 4242, 1_800_000_000_000, "aaaaaaaaaaaa")
OLDER = AgentInstance("host-b", 99, ME.started_ms - 1000, "bbbbbbbbbbbb")
NEWER = AgentInstance("host-c", 98, ME.started_ms + 1000, "cccccccccccc")
SITE_TS_S = 1_700_000_000.0
#: far longer than any wait of these tests (WAIT_S): what is held back that long does not come during a test
LONG_S = 4 * WAIT_S


def codec() -> wire.Codec:
    return wire.Codec(wire.SiteLayout(SITE_ID, ("r0",), 4))


def publisher(mqtt: MqttOptions, mode: str = "enforce", wall: Callable[[], float] = time.monotonic) -> StatusPublisher:
    """The status publisher of agent :data:`ME` on a bus not yet started (as the service makes it);
    ``wall``: its site clock's wall clock."""
    clock = SiteClock(1.0, wall=wall)
    clock.observe(SITE_TS_S)
    standby = Standby(
        OtherAgents(ME),
        mode=mode,
        site_id=SITE_ID,
        connected=lambda: True,
        on_stand_by=lambda: None,
        on_commanding=lambda: None,
    )
    made: list[StatusPublisher] = []
    # as the service wires it: the status's will, and the status published on every connect
    bus = Bus(mqtt, will=lambda: made[0].will(), on_connect=lambda b: made[0].publish_online(b), name="agent")
    made.append(StatusPublisher(bus, codec(), clock, standby, mqtt=mqtt))
    return made[0]


def other_status(who: AgentInstance, seq: int, state: str = "online") -> wire.AgentStatus:
    return wire.AgentStatus(wire.AgentState(state), "1", SITE_TS_S, seq, who.publisher, mode="enforce", detail="")


@asynccontextmanager
async def statuses(broker: EmbeddedBroker) -> AsyncIterator[list[tuple[float, bool, wire.AgentStatus]]]:
    """Every status on the site's topic as it arrives: (wall time, retained, status)."""
    c = codec()
    seen: list[tuple[float, bool, wire.AgentStatus]] = []

    def handle(m: Incoming) -> None:
        msg = c.decode(m.topic, m.payload)
        if isinstance(msg, wire.AgentStatus):
            seen.append((time.monotonic(), m.retain, msg))

    async with Bus(broker.options(), subscriptions=[c.topics.agent_status], on_message=handle, name="watch") as bus:
        await bus.wait_connected(WAIT_S)
        yield seen


async def wait_until(cond: Callable[[], object], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def mine(seen: list[tuple[float, bool, wire.AgentStatus]]) -> list[wire.AgentStatus]:
    return [s for _w, _r, s in seen if s.publisher == ME.publisher]


async def test_the_status_says_who_commands_and_the_will_says_offline(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online on connect (retained, stamped on the site clock, with the mode and who the agent is),
    offline with why at a stop; the broker's last will is a retained offline too. The publisher's run
    sends no status of its own when it starts: the next one is due STATUS_EVERY_S (LONG_S here, longer
    than the test) after the connect's."""
    monkeypatch.setattr("agent.status.STATUS_EVERY_S", LONG_S)
    waits_s: list[float | None] = []

    async def recorded_wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
        waits_s.append(timeout_s)
        return await wait_event(event, timeout_s)

    monkeypatch.setattr("agent.status.wait_event", recorded_wait_event)
    status = publisher(mosquitto.options(client_id="agent-x"))
    async with statuses(mosquitto) as seen, status.bus:
        await wait_until(lambda: mine(seen), "the online status")
        task = asyncio.create_task(status.run())
        # until the run waits for its next status (after any it would send at once), however long that takes
        await wait_until(lambda: any(w is not None and w > 0 for w in waits_s), "the run waiting for its next status")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await status.publish_offline("clean shutdown")  # on the same topic, after any status the run sent
        await wait_until(lambda: mine(seen)[-1].state is wire.AgentState.OFFLINE, "the offline status")
    assert len(mine(seen)) == 2, mine(seen)  # none from the run in between
    online, offline = mine(seen)
    assert online.state is wire.AgentState.ONLINE and online.mode == "enforce" and online.version == VERSION
    assert online.ts_s == pytest.approx(SITE_TS_S, abs=5.0)  # the site's time, not the wall clock's
    assert online.detail == f"enforce mode; {ME.describe()}, client id agent-x"
    assert offline.state is wire.AgentState.OFFLINE and offline.detail == "clean shutdown"
    assert offline.seq > online.seq
    will = status.will()
    assert will.retain and will.qos == 1 and will.topic == codec().topics.agent_status
    dead = codec().decode(will.topic, will.payload)
    assert isinstance(dead, wire.AgentStatus) and dead.state is wire.AgentState.OFFLINE
    assert dead.detail == "connection lost" and dead.publisher == ME.publisher
    advisory = publisher(mosquitto.options(client_id="agent-x"), mode="advisory")
    says = codec().decode(codec().topics.agent_status, advisory.message(wire.AgentState.ONLINE, "").payload)
    assert isinstance(says, wire.AgentStatus) and says.mode == "advisory"
    assert advisory.online_detail().startswith("advisory mode; ")
    # a later subscriber gets the last status, retained
    async with statuses(mosquitto) as later:
        await wait_until(lambda: mine(later), "the retained status")
    assert later[0][1] and mine(later)[0].state is wire.AgentState.OFFLINE


async def test_standing_by_the_agent_says_for_whom_under_a_client_id_of_its_own(mosquitto: EmbeddedBroker) -> None:
    """Another agent that started first commands: this one's status names it at once, and it
    reconnects under ``<client id>-standby-<its id>`` with a clean session (the configured id's
    session stays with the other agent); once the other is offline, back to the configured id."""
    mqtt = mosquitto.options(client_id="agent-x", clean_session=False)
    status = publisher(mqtt)
    assert status.wanted_mqtt() == mqtt
    async with statuses(mosquitto) as seen, status.bus:
        task = asyncio.create_task(status.run())
        try:
            await wait_until(lambda: mine(seen), "the online status")
            status.standby.on_status(other_status(OLDER, 1), retained=False)
            await wait_until(lambda: status.bus.connected and status.bus.options != mqtt, "the standby client id")
            await wait_until(lambda: "standing by" in (mine(seen)[-1].detail or ""), "the standing-by status")
            assert status.bus.options.client_id == "agent-x-standby-aaaaaaaa" and status.bus.options.clean_session
            assert mine(seen)[-1].detail == (
                f"enforce mode, standing by: {OLDER.describe()} commands this site; "
                f"{ME.describe()}, client id agent-x-standby-aaaaaaaa"
            )
            status.standby.on_status(other_status(OLDER, 2, "offline"), retained=False)
            await wait_until(lambda: status.bus.connected and status.bus.options == mqtt, "the configured client id")
            await wait_until(lambda: mine(seen)[-1].detail == f"enforce mode; {ME.describe()}, client id agent-x", "")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    # without a configured client id (a random one) there is no session to leave alone
    anon = publisher(mosquitto.options())
    anon.standby.on_status(other_status(OLDER, 1), retained=False)
    assert anon.standby.standing_by_for is not None and anon.wanted_mqtt() == mosquitto.options()
    # a retained "online" of an agent that started first, not confirmed yet: the status says so, and
    # the agent keeps its client id meanwhile
    waiting = publisher(mqtt)
    waiting.standby.on_status(other_status(OLDER, 1), retained=True)
    waiting.standby.check()
    assert waiting.online_detail() == (
        f"enforce mode, waiting for a sign of life from {OLDER.describe()}; {ME.describe()}, client id agent-x"
    )
    assert waiting.wanted_mqtt() == mqtt


async def test_the_status_that_says_the_agent_stands_by_goes_out_at_once(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a configured client id (no reconnect to stand by): the status that says whom the agent
    stands by for goes out at once after the other agent's status, not held back as an answer to it
    (answers go out at most once per _STATUS_ANSWER_GAP_S after the last status: here the connect's,
    with the gap and the sign of life both far longer than the test waits)."""
    monkeypatch.setattr("agent.status._STATUS_ANSWER_GAP_S", LONG_S)
    monkeypatch.setattr("agent.status.STATUS_EVERY_S", LONG_S)
    status = publisher(mosquitto.options())
    async with statuses(mosquitto) as seen, status.bus:
        task = asyncio.create_task(status.run())
        try:
            await wait_until(lambda: mine(seen), "the online status")
            status.standby.on_status(other_status(OLDER, 1), retained=False)
            await wait_until(lambda: "standing by" in (mine(seen)[-1].detail or ""), "the standing-by status")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert len(mine(seen)) == 2


class _FakeWall:
    """The wall clock of the status publisher and of its site clock, which only its waits move: a wait
    for the status's event that is not set passes its whole timeout at once (the event loop still runs
    in between), until the wall reaches ``end_s``; there it waits for the event, ``parked`` set."""

    def __init__(self, end_s: float) -> None:
        self.s = 0.0
        self.end_s = end_s
        self.parked = asyncio.Event()

    def monotonic(self) -> float:
        return self.s

    async def wait_event(self, event: asyncio.Event, timeout_s: float | None) -> bool:
        await asyncio.sleep(0)
        if event.is_set():
            return True
        if timeout_s is None or self.s + timeout_s > self.end_s:
            self.parked.set()
            await event.wait()
            return True
        self.s += timeout_s
        return False


async def test_the_status_is_a_sign_of_life_every_status_every_s(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Published every STATUS_EVERY_S of wall time while commanding, no more often and no less: on a
    fake wall clock that only the publisher's waits move (its site clock's too, so each status is
    stamped with the wall time it went out), the connect's status and five signs of life in the first
    5.5 periods, stamped exactly a period apart. No timing is asserted: the stamps are the fake wall's."""
    period_s = STATUS_EVERY_S
    wall = _FakeWall(end_s=5.5 * period_s)
    monkeypatch.setattr("agent.status.time", types.SimpleNamespace(monotonic=wall.monotonic, time=time.time))
    monkeypatch.setattr("agent.status.wait_event", wall.wait_event)
    status = publisher(mosquitto.options(client_id="agent-x"), wall=wall.monotonic)
    async with statuses(mosquitto) as seen, status.bus:
        await wait_until(lambda: mine(seen), "the online status")
        task = asyncio.create_task(status.run())
        try:
            await wait_until(wall.parked.is_set, f"the publisher's wall at {wall.end_s:g} s")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await status.publish_offline("end of the test")  # on the same topic, after every status the run sent
        await wait_until(lambda: mine(seen)[-1].state is wire.AgentState.OFFLINE, "the offline status")
    online = [s for s in mine(seen) if s.state is wire.AgentState.ONLINE]
    assert [s.ts_s - SITE_TS_S for s in online] == [k * period_s for k in range(6)]


async def test_another_agents_status_is_answered_at_once_then_at_most_once_a_gap(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another agent's statuses are answered within a round trip (not at the next sign of life), but
    never twice within _STATUS_ANSWER_GAP_S (1 s; LONG_S here) however fast they come. The publisher's
    clock is moved on by two gaps once it has published its connect's status, so that the first
    answer is not held back; the sign of life is due only after the test."""
    monkeypatch.setattr("agent.status.STATUS_EVERY_S", 10 * LONG_S)
    monkeypatch.setattr("agent.status._STATUS_ANSWER_GAP_S", LONG_S)
    ahead_s = [0.0]
    clock = types.SimpleNamespace(monotonic=lambda: time.monotonic() + ahead_s[0], time=time.time)
    monkeypatch.setattr("agent.status.time", clock)
    status = publisher(mosquitto.options(client_id="agent-x"))
    async with statuses(mosquitto) as seen, status.bus:
        task = asyncio.create_task(status.run())
        try:
            await wait_until(lambda: mine(seen), "the online status")
            ahead_s[0] = 2 * LONG_S  # the connect's status went out two gaps ago
            t1 = time.monotonic()
            status.standby.on_status(other_status(NEWER, 1), retained=False)
            await wait_until(lambda: len(mine(seen)) == 2, "the answer")
            for seq in range(2, 22):  # a status every 0.05 s for a second, from an agent that started later
                status.standby.on_status(other_status(NEWER, seq), retained=False)
                await asyncio.sleep(0.05)
            await status.publish_offline("end of the test")  # after every answer published so far
            await wait_until(lambda: mine(seen)[-1].state is wire.AgentState.OFFLINE, "the offline status")
            elapsed_s = time.monotonic() - t1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    answers = [s for s in mine(seen)[1:] if s.state is wire.AgentState.ONLINE]
    assert 1 <= len(answers) <= 1 + elapsed_s / LONG_S, len(answers)  # the first at once, then one a gap
