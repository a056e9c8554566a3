"""The protocol through a real mosquitto: round trips of every message kind, commands at QoS 1,
retained state, the agent's last will, and hostile payloads rejected and counted in the receive loop."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_helpers import WAIT_S, delivered, messages_until, next_messages
from mqtt_testing import REPO, TEST_RACKS, TEST_SITE, sample_messages

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from agent.wire import Codec, Rejection, RejectReason, SiteLayout

pytestmark = pytest.mark.integration

ALL = f"racktwin/v1/{TEST_SITE}/#"


async def test_every_kind_round_trips_through_mosquitto(mosquitto: EmbeddedBroker, codec: Codec) -> None:
    messages = sample_messages()
    async with Bus(mosquitto.options(), subscriptions=[ALL], name="sub") as sub, Bus(mosquitto.options()) as pub:
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        for msg in messages:
            await pub.send(codec.outgoing(msg))
        received = await next_messages(sub, len(messages))
    # QoS 0 and QoS 1 messages from one publisher may be delivered in either order: match by topic+payload
    by_payload = {m.payload: m for m in received}
    for msg in messages:
        out = codec.outgoing(msg)
        got = by_payload[out.payload]
        assert got.topic == out.topic
        assert got.qos == out.qos  # subscribed at QoS 1: delivered at the publish QoS
        decoded = codec.decode(got.topic, got.payload)
        assert decoded == msg, type(msg).__name__
    assert codec.counter.total == 0


async def test_a_command_goes_at_qos1_not_retained_and_reaches_its_rack(
    mosquitto: EmbeddedBroker, codec: Codec
) -> None:
    cmd = wire.RackCommand(
        "r2",
        (0, 5),
        wire.CardSetting.power_limit(450.0),
        wire.new_command_id(),
        1_790_000_030.0,
        1_790_000_000.0,
        0,
        "agent",
    )
    rack_side = Bus(mosquitto.options(), subscriptions=codec.topics.plant_filters(["r2"]), name="rack-r2")
    async with rack_side, Bus(mosquitto.options(), name="agent") as agent:
        await rack_side.wait_connected(WAIT_S)
        await agent.wait_connected(WAIT_S)
        out = codec.outgoing(cmd)
        assert (out.topic, out.qos, out.retain) == ("racktwin/v1/site1/rack/r2/cmd", 1, False)
        await agent.send(out)
        [m] = await next_messages(rack_side, 1)
    assert (m.qos, m.retain) == (1, False)
    got = codec.decode(m.topic, m.payload)
    assert got == cmd
    assert isinstance(got, wire.RackCommand) and not wire.is_expired(got, got.ts_s)
    # never retained: a late subscriber gets nothing, the applied state (retained) instead is replayed
    async with (
        Bus(mosquitto.options(), subscriptions=[codec.topics.rack_cmd("r2")]) as late,
        Bus(mosquitto.options()) as probe,
    ):
        await late.wait_connected(WAIT_S)
        await probe.wait_connected(WAIT_S)
        await probe.publish(codec.topics.rack_cmd("r2"), b"marker", qos=1)
        [first] = await next_messages(late, 1)
    assert first.payload == b"marker"


async def test_retained_state_reaches_late_subscribers(mosquitto: EmbeddedBroker, codec: Codec) -> None:
    applied = next(m for m in sample_messages() if isinstance(m, wire.AppliedState))
    status = next(m for m in sample_messages() if isinstance(m, wire.AgentStatus))
    async with Bus(mosquitto.options()) as pub:
        await pub.wait_connected(WAIT_S)
        await pub.send(codec.outgoing(applied))
        await pub.send(codec.outgoing(status))
    subs = [codec.topics.applied("r2"), codec.topics.agent_status]
    async with Bus(mosquitto.options(), subscriptions=subs) as late:
        got = await next_messages(late, 2)
    assert all(m.retain for m in got)
    decoded = {type(d): d for d in (codec.decode(m.topic, m.payload) for m in got)}
    assert decoded[wire.AppliedState] == applied
    assert decoded[wire.AgentStatus] == status


_CRASHING_AGENT = """
import asyncio, os, sys
from agent import wire
from agent.bus import Bus, LastWill, MqttOptions

async def main() -> None:
    codec = wire.Codec(wire.SiteLayout("site1", ("r0",), 64))
    def status(state, detail=None):
        return codec.outgoing(wire.AgentStatus(state, "0.1.0", ts_s=1.0, seq=0, publisher="agent", detail=detail))
    will = status(wire.AgentState.OFFLINE, "connection lost")
    async with Bus(MqttOptions(port=int(sys.argv[1])), will=LastWill(will.topic, will.payload)) as bus:
        await bus.wait_connected(10)
        await bus.send(status(wire.AgentState.ONLINE))
        print("online", flush=True)
        sys.stdin.readline()
        os._exit(0)  # die without DISCONNECT, like a crash

asyncio.run(main())
"""


async def test_agent_status_last_will_says_offline_after_a_crash(mosquitto: EmbeddedBroker, codec: Codec) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_AGENT, str(mosquitto.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None  # both piped
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), WAIT_S)
        assert line.strip() == b"online"
        async with Bus(mosquitto.options(), subscriptions=[codec.topics.agent_status]) as watcher:
            [retained] = await next_messages(watcher, 1)
            online = codec.decode(retained.topic, retained.payload)
            assert isinstance(online, wire.AgentStatus) and online.state is wire.AgentState.ONLINE
            proc.stdin.write(b"crash\n")
            proc.stdin.flush()
            [will] = await next_messages(watcher, 1)
    finally:
        proc.kill()
        proc.wait()
    offline = codec.decode(will.topic, will.payload)
    assert isinstance(offline, wire.AgentStatus)
    assert offline.state is wire.AgentState.OFFLINE and offline.detail == "connection lost"
    # and it is retained for whoever looks later
    async with Bus(mosquitto.options(), subscriptions=[codec.topics.agent_status]) as later:
        [m] = await next_messages(later, 1)
    assert m.retain and codec.decode(m.topic, m.payload) == offline


# ---- hostile payloads through the broker --------------------------------------------------------

LAYOUT = SiteLayout(TEST_SITE, TEST_RACKS, cards_per_rack=64, n_levels=8)
_VALID = [Codec(LAYOUT).outgoing(m) for m in sample_messages()]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def hostile(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(kind, topic, payload): random bytes, a valid payload with one field replaced/removed/added, a
    NaN or Infinity put in place of its ``ts`` number, or an oversized payload."""
    out = draw(st.sampled_from(_VALID))
    kind = draw(st.sampled_from(["bytes", "mutate", "non_finite", "huge"]))
    if kind == "bytes":
        return kind, out.topic, draw(st.binary(max_size=300))
    if kind == "huge":
        return kind, out.topic, b"[" + b"1," * (wire.MAX_PAYLOAD_BYTES // 2) + b"1]"
    body: dict[str, Any] = msgspec.json.decode(out.payload)
    if kind == "non_finite":
        token = draw(st.sampled_from([b"NaN", b"-Infinity", b"Infinity"]))
        payload, n = re.subn(rb'"ts":-?[0-9][0-9.eE+-]*', b'"ts":' + token, out.payload, count=1)
        assert n == 1, out.payload
        return kind, out.topic, payload
    key = draw(st.sampled_from(sorted(body)))
    if draw(st.booleans()):
        body[key] = draw(_JSON)
    else:
        del body[key]
    return kind, out.topic, msgspec.json.encode(body)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(hostile(), min_size=10, max_size=25))
def test_hostile_payloads_through_mosquitto_are_rejected_counted_and_never_raise(
    mosquitto: EmbeddedBroker, batch: list[tuple[str, str, bytes]]
) -> None:
    asyncio.run(_hostile_round(mosquitto, batch))


async def _hostile_round(broker: EmbeddedBroker, batch: list[tuple[str, str, bytes]]) -> None:
    codec = Codec(LAYOUT)
    sentinel_topic = codec.topics.pdu("r0")
    sentinel = wire.encode(wire.PduReading("r0", 1000.0, ts_s=1.0, seq=0, publisher=f"s-{uuid.uuid4().hex[:8]}"))
    async with Bus(broker.options(), subscriptions=[ALL]) as sub, Bus(broker.options()) as pub:
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        for _kind, topic, payload in batch:
            await pub.publish(topic, payload, qos=1)
        await pub.publish(sentinel_topic, sentinel, qos=1)
        received = await messages_until(sub, lambda m: m.payload == sentinel)
        # the receive loop of a service: decode everything, never raises
        results = [codec.decode(m.topic, m.payload) for m in received]
    assert [m.payload for m in received] == [payload for _k, _t, payload in batch]  # all of them, in order
    rejected = [r for r in results if isinstance(r, Rejection)]
    assert codec.counter.total == len(rejected)
    for (kind, _topic, payload), result in zip(batch, results, strict=True):
        if kind == "non_finite":
            assert isinstance(result, Rejection) and result.reason is RejectReason.NON_FINITE, (payload, result)
        elif kind != "mutate":  # random bytes, arrays, oversized: never a message
            assert isinstance(result, Rejection), (payload, result)


async def test_the_receive_loop_survives_hostile_traffic(mosquitto: EmbeddedBroker, codec: Codec) -> None:
    """A loop that decodes as it receives keeps going after garbage, and still takes good messages."""
    good = sample_messages()[2]  # a PDU reading
    out = codec.outgoing(good)
    garbage = [b"", b"\xff\xfe", b"NaN", b"[]", b'{"schema":"racktwin.pdu/1"}', b"{" * 10_000]
    async with Bus(mosquitto.options(), subscriptions=[ALL]) as sub, Bus(mosquitto.options()) as pub:
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        for g in garbage:
            await pub.publish(out.topic, g, qos=1)
        attempts = [(pub, out.topic, out.payload)]
        seen = await delivered(sub, [], (pub, "racktwin/v1/site1/agent/advice", b"end"))
        assert len(seen) == len(garbage)
        assert all(isinstance(codec.decode(m.topic, m.payload), Rejection) for m in seen)
        for bus, topic, payload in attempts:
            await bus.publish(topic, payload, qos=0)
        [m] = await next_messages(sub, 1)
    assert codec.decode(m.topic, m.payload) == good
    assert codec.counter.total == len(garbage)
