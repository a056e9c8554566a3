"""agent.bus against a real mosquitto that goes away and comes back on the same port."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import random
import signal
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from mqtt_helpers import WAIT_S, next_messages, wait_for
from mqtt_testing import PubackDroppingProxy, reconnect_waits_s

from agent import wire
from agent.broker import EmbeddedBroker, free_port
from agent.bus import Bus, BusConnectError, BusNotConnected, MqttOptions, backoff_delay_s, check_connection
from agent.commands.common import UserError
from agent.mqtt_args import add_mqtt_arguments, mqtt_options_from_args
from agent.wire import Codec

pytestmark = pytest.mark.integration


def fast(options: MqttOptions) -> MqttOptions:
    """Reconnect quickly (tests only)."""
    return dataclasses.replace(options, reconnect_min_s=0.05, reconnect_max_s=0.5)


async def test_bus_reconnects_and_resubscribes_after_a_broker_restart(mosquitto: EmbeddedBroker, codec: Codec) -> None:
    topic = codec.topics.rack_cmd("r1")
    onlines: list[int] = []

    async def announce(bus: Bus) -> None:  # runs on every connect, e.g. the agent's retained "online"
        onlines.append(bus.stats.connects)
        await bus.publish(codec.topics.agent_status, b"online", qos=1, retain=True)

    sub = Bus(fast(mosquitto.options()), subscriptions=[topic], on_connect=announce, name="sub")
    async with sub, Bus(fast(mosquitto.options()), name="pub") as pub:
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        await pub.publish(topic, b"before", qos=1)
        [m] = await next_messages(sub, 1)
        assert m.payload == b"before"

        mosquitto.restart()  # same port, fresh broker: no sessions, no subscriptions, no retained messages
        await wait_for(lambda: sub.stats.connects >= 2 and sub.connected, what="subscriber reconnect")
        await wait_for(lambda: pub.stats.connects >= 2 and pub.connected, what="publisher reconnect")
        assert sub.stats.disconnects >= 1

        await pub.publish(topic, b"after", qos=1)  # reaches sub only if it subscribed again
        [m] = await next_messages(sub, 1)
        assert m.payload == b"after"
    assert onlines[:2] == [1, 2]


async def test_an_unexpected_error_on_the_connection_is_logged_and_the_bus_reconnects(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error that is no MqttError (here aiomqtt's own RuntimeError about a message id, in the
    subscribe after a reconnect) used to end the connection task for good, silently: the bus never
    reconnected and ``close()`` raised it. Now it is logged with its traceback and the bus goes on."""
    real_subscribe = aiomqtt.Client.subscribe
    calls = [0]

    async def subscribe_failing_once(self: aiomqtt.Client, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError('There already exists a pending call for message ID "7"')
        return await real_subscribe(self, *args, **kwargs)

    monkeypatch.setattr(aiomqtt.Client, "subscribe", subscribe_failing_once)
    topic = "racktwin/v1/site1/rack/r0/cmd"
    async with Bus(fast(mosquitto.options()), subscriptions=[topic], name="sub") as bus:
        await bus.wait_connected(WAIT_S)
        mosquitto.restart()
        await wait_for(lambda: bus.stats.unexpected_errors == 1, what="the injected error")
        await wait_for(lambda: bus.connected, what="a reconnect after it")
        assert calls[0] == 3 and bus.stats.connects == 2
        assert bus.stats.last_error is not None and bus.stats.last_error.startswith("RuntimeError: ")
        async with Bus(fast(mosquitto.options()), name="pub") as pub:  # and it is subscribed again
            await pub.wait_connected(WAIT_S)
            await pub.publish(topic, b"after", qos=1)
            [m] = await next_messages(bus, 1)
            assert m.payload == b"after"
    logged = [r for r in caplog.records if "unexpected error on the connection" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


async def test_publishing_while_the_broker_is_down_raises_not_connected(mosquitto: EmbeddedBroker) -> None:
    async with Bus(fast(mosquitto.options())) as bus:
        await bus.wait_connected(WAIT_S)
        mosquitto.stop(keep_files=True)
        await wait_for(lambda: not bus.connected, what="disconnect")
        with pytest.raises(BusNotConnected):
            await bus.publish("racktwin/v1/site1/rack/r0/pdu", b"x")
        mosquitto.start()  # same port
        await bus.wait_connected(WAIT_S)
        await bus.publish("racktwin/v1/site1/rack/r0/pdu", b"x")


async def test_a_publish_in_flight_when_the_connection_ends_fails_at_once(mosquitto: EmbeddedBroker) -> None:
    """A QoS 1 publish whose PUBACK does not come (a proxy drops it) when the broker goes away: aiomqtt
    waits for the PUBACK until its timeout, so the simulator's answers to commands, which go out burst
    after burst in order, were held 10 s wall time after a broker restart (200 site s at 20x: no
    command acknowledged for the rest of a test run). Now it raises BusNotConnected as soon as the
    connection ends, and the caller sends again once connected."""
    topic, marker_topic = "racktwin/v1/site1/rack/r0/ack", "racktwin/v1/site1/rack/r0/marker"
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = fast(dataclasses.replace(mosquitto.options(), port=proxy.port))
        async with Bus(options, subscriptions=[marker_topic]) as bus, Bus(mosquitto.options(), name="marker") as other:
            await bus.wait_connected(WAIT_S)
            await other.wait_connected(WAIT_S)
            sending = asyncio.create_task(bus.publish(topic, b"x", qos=1, timeout_s=60.0))
            await wait_for(lambda: proxy.pubacks_dropped == 1, what="the broker's PUBACK, dropped")
            # a message the broker sends on the bus's connection after that PUBACK: once the bus has it,
            # it would have had the PUBACK too (a sleep here said nothing on a slow machine)
            await other.publish(marker_topic, b"marker", qos=1)
            [m] = await next_messages(bus, 1)
            assert m.payload == b"marker"
            assert not sending.done()  # in flight: waiting for its PUBACK
            pid = mosquitto.pid
            assert pid is not None
            proxy.dropping = False  # for the publish after the reconnect
            os.kill(pid, signal.SIGKILL)  # the broker goes away: the connection ends
            with pytest.raises(BusNotConnected, match="connection ended"):
                await asyncio.wait_for(sending, 10.0)  # (before: BusPubackTimeout after 60 s)
            mosquitto.stop()  # reaps the killed process
            mosquitto.start()  # same port
            await bus.wait_connected(WAIT_S)
            await bus.publish(topic, b"x", qos=1)


async def test_a_bus_keeps_trying_until_a_broker_appears() -> None:
    port = free_port()
    async with Bus(fast(MqttOptions(port=port))) as bus:
        with pytest.raises(BusConnectError, match="not connected"):
            await bus.wait_connected(0.3)
        await wait_for(lambda: bus.stats.failed_connects >= 1, what="a failed attempt")
        with EmbeddedBroker(port=port, backend="mosquitto"):
            await bus.wait_connected(WAIT_S)


async def test_check_connection_reports_an_unreachable_broker() -> None:
    with pytest.raises(BusConnectError, match="cannot connect"):
        await check_connection(MqttOptions(port=free_port()), timeout_s=WAIT_S)


async def test_messages_end_when_the_bus_closes(mosquitto: EmbeddedBroker) -> None:
    bus = Bus(mosquitto.options(), subscriptions=["racktwin/v1/site1/#"])
    async with bus:
        await bus.wait_connected(WAIT_S)
    assert [m async for m in bus.messages()] == []


async def test_send_uses_the_protocol_qos_and_retain(mosquitto: EmbeddedBroker, codec: Codec) -> None:
    status = wire.AgentStatus(wire.AgentState.ONLINE, "0.1.0", ts_s=1.0, seq=0, publisher="agent")
    async with Bus(mosquitto.options()) as bus:
        await bus.wait_connected(WAIT_S)
        await bus.send(codec.outgoing(status))
    async with Bus(mosquitto.options(), subscriptions=[codec.topics.agent_status]) as late:
        [m] = await next_messages(late, 1)
    assert m.retain and codec.decode(m.topic, m.payload) == status


def test_backoff_is_randomized_exponential_and_capped() -> None:
    rng = random.Random(1)
    delays = [backoff_delay_s(a, 0.5, 30.0, rng) for a in range(12)]
    for a, d in enumerate(delays):
        base = min(30.0, 0.5 * 2**a)
        assert 0.5 * base <= d < base
    assert max(delays) < 30.0
    assert len({round(d, 6) for d in delays}) == len(delays)


def test_options_from_url() -> None:
    o = MqttOptions.from_url("mqtts://r0:s%40cret@broker.example")
    assert (o.host, o.port, o.username, o.password, o.use_tls) == ("broker.example", 8883, "r0", "s@cret", True)
    assert "s@cret" not in repr(o) and "s@cret" not in o.url
    assert MqttOptions.from_url("mqtt://10.0.0.5:1884").port == 1884
    with pytest.raises(ValueError, match="scheme"):
        MqttOptions.from_url("http://x")
    with pytest.raises(ValueError, match="tls_insecure"):
        MqttOptions(tls_insecure=True)


def test_command_line_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_mqtt_arguments(parser)
    assert mqtt_options_from_args(parser.parse_args([])) is None  # no --broker: embedded broker
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n", encoding="utf-8")
    ca = tmp_path / "ca.crt"
    ca.write_text("x", encoding="utf-8")
    args = ["--broker", "mqtts://b.example", "--mqtt-username", "r0", "--mqtt-password-file", str(pw)]
    ns = parser.parse_args([*args, "--mqtt-ca-file", str(ca), "--mqtt-client-id", "bridge-r0"])
    o = mqtt_options_from_args(ns)
    assert o is not None
    assert (o.host, o.port, o.username, o.password, o.ca_file, o.use_tls, o.tls_insecure, o.client_id) == (
        "b.example",
        8883,
        "r0",
        "s3cret",
        str(ca),
        True,
        False,
        "bridge-r0",
    )
    monkeypatch.setenv("RACKTWIN_MQTT_PASSWORD", "from-env")
    o = mqtt_options_from_args(parser.parse_args(["--broker", "mqtt://h:1", "--mqtt-username", "agent"]))
    assert o is not None and o.password == "from-env"
    monkeypatch.delenv("RACKTWIN_MQTT_PASSWORD")  # else refused first: a password with no user name
    with pytest.raises(UserError, match="--mqtt-ca-file"):
        mqtt_options_from_args(parser.parse_args(["--broker", "mqtts://h", "--mqtt-ca-file", str(tmp_path / "no")]))
    with pytest.raises(UserError, match="--broker"):
        mqtt_options_from_args(parser.parse_args(["--broker", "http://h"]))


async def test_two_clients_with_one_client_id_are_told_apart_from_a_broker_restart_and_slowed_down(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two clients with one client id take the session from each other (the broker closes the older
    connection when the newer one connects; MQTT 3.1.1 says nothing more). Each bus says that another
    client uses its client id, counts the take-overs and backs off: the fight slows from a reconnect
    every backoff minimum (0.05 s here) to one per backoff maximum (each bus waits 0.4 to 0.8 s before
    it reconnects, and each reconnect is the other client's, after its wait). Once a connection
    lasts, it is over."""
    caplog.set_level(logging.INFO, logger="racktwin.bus")
    monkeypatch.setattr("agent.bus.SHORT_LIVED_S", 3.0)
    options = dataclasses.replace(
        mosquitto.options(client_id="one-id", clean_session=False), reconnect_min_s=0.05, reconnect_max_s=0.8
    )
    a = Bus(options, subscriptions=["racktwin/v1/site1/rack/+/ack"], name="a")
    b = Bus(options, subscriptions=["racktwin/v1/site1/rack/+/ack"], name="b")
    async with a:
        await a.wait_connected(WAIT_S)
        async with b:
            await wait_for(lambda: a.contested() is not None and b.contested() is not None, what="both contested")
            why = a.contested()
            assert why is not None and why.startswith("another client uses client id 'one-id'"), why
            assert a.stats.takeovers >= 3 and b.stats.takeovers >= 3
            # the backoff grows with each reconnect (0.05 s doubled 4 times is 0.8 s): counted, not waited
            # for by wall time (a machine slow meanwhile made fewer reconnects, then the fast ones came)
            grown_a, grown_b = a.stats.takeovers + 4, b.stats.takeovers + 4
            await wait_for(
                lambda: a.stats.takeovers >= grown_a and b.stats.takeovers >= grown_b, what="four more reconnects each"
            )
            # from now on each bus waits half the backoff maximum or more before each reconnect: the waits
            # it logs over its next three reconnects (counting connects in 2 s of wall time, a slow machine
            # made fewer whatever the waits)
            since = len(caplog.records)
            await wait_for(
                lambda: all(len(reconnect_waits_s(caplog, since).get(n, [])) >= 3 for n in ("a", "b")),
                30,
                "three more reconnects each, their waits logged",
            )
            waits = reconnect_waits_s(caplog, since)
            assert all(w >= 0.4 for ws in waits.values() for w in ws), waits
        await wait_for(lambda: a.connected, what="a alone")
        alone = (a.stats.connects, a.stats.takeovers)
        # its connection lasts SHORT_LIVED_S: asked of the bus until it says the fight is over (a sleep
        # past SHORT_LIVED_S did not show that it was still that connection)
        await wait_for(lambda: a.contested() is None, 30, "a's fight over once its connection lasted")
        assert a.connected and (a.stats.connects, a.stats.takeovers) == alone  # that same connection


async def test_a_broker_restart_is_no_session_take_over(mosquitto: EmbeddedBroker) -> None:
    async with Bus(fast(mosquitto.options(client_id="alone", clean_session=False)), name="alone") as bus:
        await bus.wait_connected(WAIT_S)
        for _ in range(3):
            mosquitto.stop(keep_files=True)  # the reconnect is refused until the broker is back
            await wait_for(lambda: bus.stats.failed_connects > 0 and not bus.connected, what="a refused reconnect")
            mosquitto.start()
            await wait_for(lambda: bus.connected, what="a reconnect")
            bus.stats.failed_connects = 0
        assert bus.stats.takeovers == 0 and bus.contested() is None


async def test_a_bus_closed_while_it_connects_lets_the_connection_finish_and_disconnects(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close()`` as the broker's CONNACK comes, before the bus took it (the test holds it until the close
    has begun): the bus lets the connection finish, hands it to ``on_connect`` with ``closing`` True (the
    owner's goodbye: the agent's offline status) and ends it with a DISCONNECT, so the broker drops the
    will. It used to cancel the connecting: the connection the broker had taken was
    left without a DISCONNECT, and its will was published when the process ended."""
    from agent.bus import LastWill

    real_on_connack = aiomqtt.client.Client._on_connect
    held: list[Any] = []

    def hold(self: Any, *args: Any, **kwargs: Any) -> None:
        held.append(lambda: real_on_connack(self, *args, **kwargs))

    monkeypatch.setattr(aiomqtt.client.Client, "_on_connect", hold)
    seen: list[tuple[bool, bool]] = []

    async def on_connect(bus: Bus) -> None:
        seen.append((bus.closing, bus.connected))
        await bus.publish("test/closing/status", b"offline", qos=1, retain=True)

    will = LastWill("test/closing/status", b"connection lost", qos=1, retain=True)
    bus = Bus(
        mosquitto.options(client_id="closing-bus"), subscriptions=["test/closing/#"], will=will, on_connect=on_connect
    )
    bus.start()
    await wait_for(lambda: bool(held), what="the CONNACK")
    closing = asyncio.ensure_future(bus.close())
    await asyncio.sleep(0)  # close() has begun: it waits for the connection being made
    assert not closing.done()
    held.pop()()  # the CONNACK comes in
    await closing
    monkeypatch.undo()  # CONNACKs come in again
    assert seen == [(True, True)] and bus.stats.connects == 1
    ended = ("Client closing-bus disconnected.", "Client closing-bus closed its connection.")
    await wait_for(lambda: any(e in mosquitto.log_text() for e in ended), what="the broker's log of the end")
    assert ended[0] in mosquitto.log_text(), mosquitto.log_text()[-2000:]  # a DISCONNECT: the will dropped
    async with Bus(mosquitto.options(client_id="closing-reader"), subscriptions=["test/closing/status"]) as reader:
        [m] = await next_messages(reader, 1)
    assert m.payload == b"offline"


async def test_a_reconnect_with_other_options_while_the_bus_connects_disconnects_the_connection_made(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reconnect_with`` (the agent standing by takes a client id of its own, or gives it back) as the
    broker's CONNACK comes, before the bus took it (held until the switch has begun): the connection made
    under the old options ends with a DISCONNECT (the broker drops its will; no ``on_connect``: the new
    connection says hello), then the bus connects with the new ones. It used to cancel the connecting: the
    connection the broker had taken was left without a DISCONNECT, and its will, ``connection lost``, was
    published over the status the new connection had said."""
    from agent.bus import LastWill

    real_on_connack = aiomqtt.client.Client._on_connect
    held: list[Any] = []
    first = [True]

    def hold(self: Any, *args: Any, **kwargs: Any) -> None:  # the first CONNACK only
        if first.pop() if first else False:
            held.append(lambda: real_on_connack(self, *args, **kwargs))
        else:
            real_on_connack(self, *args, **kwargs)

    monkeypatch.setattr(aiomqtt.client.Client, "_on_connect", hold)
    seen: list[str | None] = []

    async def on_connect(bus: Bus) -> None:
        seen.append(bus.options.client_id)
        await bus.publish("test/switch/status", f"online as {bus.options.client_id}".encode(), qos=1, retain=True)

    will = LastWill("test/switch/status", b"connection lost", qos=1, retain=True)
    bus = Bus(
        mosquitto.options(client_id="switch-one"), subscriptions=["test/switch/#"], will=will, on_connect=on_connect
    )
    async with bus:
        await wait_for(lambda: bool(held), what="the CONNACK")
        switching = asyncio.ensure_future(bus.reconnect_with(mosquitto.options(client_id="switch-two")))
        await asyncio.sleep(0)  # reconnect_with has begun: it waits for the connection being made
        assert not switching.done()
        held.pop()()  # the CONNACK comes in
        await switching
        await wait_for(lambda: bus.connected and bool(seen), what="the connection as switch-two")
        assert seen == ["switch-two"] and bus.options.client_id == "switch-two"
        ended = ("Client switch-one disconnected.", "Client switch-one closed its connection.")
        await wait_for(lambda: any(e in mosquitto.log_text() for e in ended), what="the broker's log of the end")
        assert ended[0] in mosquitto.log_text(), mosquitto.log_text()[-2000:]  # a DISCONNECT: the will dropped
        assert bus.stats.takeovers == 0 and bus.contested() is None
        async with Bus(mosquitto.options(client_id="switch-reader"), subscriptions=["test/switch/status"]) as reader:
            [m] = await next_messages(reader, 1)
        assert m.payload == b"online as switch-two"


async def test_a_close_while_reconnect_with_waits_for_the_connecting_ends_the_bus(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop while ``reconnect_with`` waits for the connection being made: that connection ends with a
    DISCONNECT and the bus makes no new one (the switch does not outlive the close)."""
    real_on_connack = aiomqtt.client.Client._on_connect
    held: list[Any] = []

    def hold(self: Any, *args: Any, **kwargs: Any) -> None:
        held.append(lambda: real_on_connack(self, *args, **kwargs))

    monkeypatch.setattr(aiomqtt.client.Client, "_on_connect", hold)
    bus = Bus(mosquitto.options(client_id="stop-one"), subscriptions=["test/stop/#"])
    bus.start()
    await wait_for(lambda: bool(held), what="the CONNACK")
    switching = asyncio.ensure_future(bus.reconnect_with(mosquitto.options(client_id="stop-two")))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(bus.close())
    await asyncio.sleep(0)
    assert not switching.done() and not closing.done()
    held.pop()()  # the CONNACK comes in
    await asyncio.gather(switching, closing)
    assert bus._task is None and not bus.connected and bus.stats.connects == 1
    await wait_for(lambda: "Client stop-one disconnected." in mosquitto.log_text(), what="the DISCONNECT")
    assert "stop-two" not in mosquitto.log_text()
