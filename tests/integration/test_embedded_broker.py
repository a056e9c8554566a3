"""agent.broker.EmbeddedBroker: the mosquitto path, the forced amqtt fallback (subprocess and thread),
and the error when no broker is available."""

from __future__ import annotations

import socket

import pytest
from mqtt_helpers import WAIT_S, next_messages
from mqtt_testing import sample_messages

from agent import broker as broker_mod
from agent.broker import AmqttMode, Backend, BrokerTls, BrokerUnavailable, EmbeddedBroker, free_ports, mqtt_answers
from agent.bus import Bus, check_connection
from agent.wire import Codec

pytestmark = pytest.mark.integration


async def _round_trip(b: EmbeddedBroker, codec: Codec) -> None:
    pdu = codec.outgoing(sample_messages()[2])
    async with Bus(b.options(), subscriptions=[pdu.topic]) as sub, Bus(b.options()) as pub:
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        await pub.publish(pdu.topic, pdu.payload, qos=1)
        [m] = await next_messages(sub, 1)
    assert codec.decode(m.topic, m.payload) == codec.decode(pdu.topic, pdu.payload)


def test_mosquitto_starts_on_a_free_loopback_port_and_stops(mosquitto_path: str) -> None:
    with EmbeddedBroker() as b:  # "auto" picks mosquitto when it is installed
        assert b.backend == "mosquitto"
        assert b.host == "127.0.0.1" and b.running
        assert b.url == f"mqtt://127.0.0.1:{b.port}"
        assert mqtt_answers(b.host, b.port)
        port = b.port
    assert not b.running
    assert not mqtt_answers("127.0.0.1", port)


def test_free_ports_are_different_and_free() -> None:
    """Ports for two listeners of one broker are picked together: never the same port twice (two
    free_port() calls in a row once gave the shipped mosquitto.conf's plain and TLS listeners one port)."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    held = []
    try:
        for port in ports:  # each can be bound now
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in held:
            s.close()


async def test_mosquitto_as_an_async_context_manager(mosquitto_path: str, codec: Codec) -> None:
    async with EmbeddedBroker(backend="mosquitto") as b:
        await _round_trip(b, codec)
        await check_connection(b.options())
    assert not b.running


@pytest.mark.parametrize("mode", ["subprocess", "thread"])
async def test_the_amqtt_fallback_can_be_forced(mode: AmqttMode, codec: Codec) -> None:
    pytest.importorskip("amqtt", reason="amqtt is the optional fallback broker (the [broker] extra)")
    async with EmbeddedBroker(backend="amqtt", amqtt_mode=mode) as b:
        assert b.backend == "amqtt"
        await _round_trip(b, codec)
        port = b.port
    assert not b.running
    assert not mqtt_answers("127.0.0.1", port)


@pytest.mark.parametrize("backend", ["mosquitto", "amqtt"])
async def test_a_client_gets_only_the_topics_it_subscribed_to(backend: Backend, request: pytest.FixtureRequest) -> None:
    """amqtt 0.12 sends every connecting client the retained messages of every other client's
    subscriptions: the simulator got the agent's retained status and counted it a bad command. The
    bus drops what none of its subscriptions matches, on either broker."""
    if backend == "mosquitto":
        request.getfixturevalue("mosquitto_path")
    else:
        pytest.importorskip("amqtt", reason="amqtt is the optional fallback broker (the [broker] extra)")
    status, cmd = "racktwin/v1/site1/agent/status", "racktwin/v1/site1/rack/+/cmd"
    async with (
        EmbeddedBroker(backend=backend) as b,
        Bus(b.options(), subscriptions=[status]) as agent,
    ):
        await agent.wait_connected(WAIT_S)
        await agent.publish(status, b"online", qos=1, retain=True)
        async with Bus(b.options(), subscriptions=[cmd]) as rack:
            await rack.wait_connected(WAIT_S)
            await agent.publish("racktwin/v1/site1/rack/r0/cmd", b"level 3", qos=1)
            [m] = await next_messages(rack, 1)
            assert m.topic == "racktwin/v1/site1/rack/r0/cmd" and m.payload == b"level 3"
            assert rack.pending() == 0
            if backend == "amqtt":
                assert rack.stats.unsubscribed == 1  # the retained status: sent, and dropped
            else:
                assert rack.stats.unsubscribed == 0
        [own] = await next_messages(agent, 1)  # the agent's own subscription still gets it
        assert own.topic == status and own.payload == b"online"


def test_amqtt_fallback_sync_context_manager() -> None:
    pytest.importorskip("amqtt", reason="amqtt is the optional fallback broker (the [broker] extra)")
    with EmbeddedBroker(backend="amqtt") as b:
        assert mqtt_answers(b.host, b.port)
    assert not b.running


def test_no_broker_at_all_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_mod, "find_mosquitto", lambda: None)
    monkeypatch.setattr(broker_mod, "amqtt_available", lambda: False)
    with pytest.raises(BrokerUnavailable, match=r"install mosquitto.*pip install 'amqtt>=0.11'"):
        EmbeddedBroker().start()
    with pytest.raises(BrokerUnavailable, match="mosquitto is not installed"):
        EmbeddedBroker(backend="mosquitto").start()


def test_security_options_need_mosquitto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_mod, "find_mosquitto", lambda: None)
    with pytest.raises(BrokerUnavailable, match="need mosquitto"):
        EmbeddedBroker(acl_file="acl").start()
    with pytest.raises(BrokerUnavailable, match="need mosquitto"):
        EmbeddedBroker(backend="amqtt", tls=BrokerTls("ca", "crt", "key")).start()


def test_a_failing_mosquitto_says_why(mosquitto_path: str, tmp_path: object) -> None:
    with pytest.raises(BrokerUnavailable, match="exited"):
        EmbeddedBroker(backend="mosquitto", extra_config="no_such_option 1").start()


def test_a_taken_port_is_reported(mosquitto: EmbeddedBroker) -> None:
    with pytest.raises(BrokerUnavailable, match=r"(?i)address already in use"):
        EmbeddedBroker(backend="mosquitto", port=mosquitto.port).start()
