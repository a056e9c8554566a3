"""``agent.bus.Bus`` (the agent's and ``racktwin sim``'s connection) against a broker that closes the
connection before it answers CONNECT: each attempt ends as soon as the broker closes, and the reason
goes to the log and to ``stats.last_error`` (which ``wait_connected``'s error and the agent's /readyz
show). It used to wait ``connect_timeout_s`` per attempt and say "Operation timed out", forever: an
operator whose client lacks the certificate the broker requires saw only time-outs.

The real mosquitto with ``require_certificate`` (TLS 1.3: the refusal, alert certificate_required,
comes after the client sent CONNECT). ``connect_timeout_s`` is set far above every wait here, so a bus
that waited for it would fail these tests instead of being slow."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable

import pytest
from mqtt_helpers import WAIT_S, wait_for
from mqtt_testing import TlsFiles

from agent.broker import EmbeddedBroker
from agent.bus import Bus, BusConnectError, MqttOptions, check_connection

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT_S = 120.0  # aiomqtt's wait for a CONNACK: far above WAIT_S
MIN_S, MAX_S = 0.1, 0.8  # the reconnect backoff: delays in [0.05, 0.1), [0.1, 0.2), [0.2, 0.4), [0.4, 0.8)


def patient(options: MqttOptions) -> MqttOptions:
    return dataclasses.replace(
        options, connect_timeout_s=CONNECT_TIMEOUT_S, reconnect_min_s=MIN_S, reconnect_max_s=MAX_S
    )


def reconnect_delays_s(caplog: pytest.LogCaptureFixture, name: str) -> list[float]:
    """The delays the bus logged ("<name>: reconnecting in 0.07 s"), in order."""
    found = (re.fullmatch(rf"{name}: reconnecting in ([0-9.]+) s", r.getMessage()) for r in caplog.records)
    return [float(m.group(1)) for m in found if m is not None]


async def test_a_bus_without_the_client_certificate_the_broker_requires_says_so_at_every_attempt(
    mosquitto_factory: Callable[..., EmbeddedBroker], tls_files: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="racktwin.bus")
    tls = dataclasses.replace(tls_files.broker_tls(), require_certificate=True)
    broker = mosquitto_factory(tls=tls, startup_timeout_s=5.0)
    async with Bus(patient(broker.options(ca_file=tls_files.ca_file)), name="nocert") as bus:
        await wait_for(lambda: bus.stats.failed_connects >= 4, what="four refused attempts")
        assert not bus.connected and bus.stats.connects == 0
        with pytest.raises(BusConnectError) as info:
            await bus.wait_connected(0.2)
    why = bus.stats.last_error
    assert why is not None
    assert "refused the TLS handshake" in why and "requires a client certificate" in why, why
    assert "presents none" in why and broker.url in why, why
    msg = str(info.value)
    assert msg.startswith(f"nocert: not connected to {broker.url} after 0.2 s (last error: ") and why in msg, msg
    refusals = [r for r in caplog.records if r.getMessage().startswith(f"nocert: cannot connect: {broker.url} refused")]
    assert len(refusals) >= 4 and all("requires a client certificate" in r.getMessage() for r in refusals)
    assert all(r.getMessage().count(broker.url) == 1 for r in refusals)  # the URL once, not twice
    assert all(r.levelno == logging.ERROR for r in refusals)  # a configuration to fix, as bad credentials
    assert not any("timed out" in r.getMessage() for r in caplog.records)
    # the backoff grows as documented (min(max, min * 2**attempt) times a factor in [0.5, 1)): no hot loop
    delays = reconnect_delays_s(caplog, "nocert")
    assert len(delays) >= 4, delays
    for attempt, delay in enumerate(delays[:4]):
        base = min(MAX_S, MIN_S * 2**attempt)
        assert base / 2 - 0.005 <= delay <= base + 0.005, (attempt, delays)
    assert delays[3] > delays[0], delays


async def test_a_bus_with_the_certificate_connects_to_that_broker_and_survives_its_restart(
    mosquitto_factory: Callable[..., EmbeddedBroker], tls_files: TlsFiles
) -> None:
    """The early-close detection does not get in the way of a connection that succeeds (over TLS, with
    the client certificate) nor of a reconnect after the broker went away."""
    tls = dataclasses.replace(tls_files.broker_tls(), require_certificate=True)
    broker = mosquitto_factory(tls=tls, startup_timeout_s=5.0)
    options = broker.options(ca_file=tls_files.ca_file, cert_file=tls_files.cert_file, key_file=tls_files.key_file)
    topic = "racktwin/v1/site1/rack/r0/cmd"
    async with Bus(patient(options), subscriptions=[topic], name="withcert") as bus:
        await bus.wait_connected(WAIT_S)
        assert bus.stats.failed_connects == 0 and bus.stats.last_error is None
        broker.restart()
        await wait_for(lambda: bus.stats.connects >= 2 and bus.connected, what="a reconnect after the restart")
        await bus.publish(topic, b"after", qos=1)  # subscribed again: the message comes back
        async with asyncio.timeout(WAIT_S):
            async for m in bus.messages():
                assert m.payload == b"after"
                break


async def test_a_bus_told_the_server_closed_the_connection_before_answering_connect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without TLS, a server that closes every connection at once (not a broker, or one that drops
    the client): each attempt says so, not "Operation timed out"."""
    accepted = 0

    async def close_at_once(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        async with Bus(patient(MqttOptions.from_url(f"mqtt://127.0.0.1:{port}")), name="plain") as bus:
            await wait_for(lambda: bus.stats.failed_connects >= 2, what="two closed attempts")
            with pytest.raises(BusConnectError) as info:
                await bus.wait_connected(0.1)
    expected = f"mqtt://127.0.0.1:{port} closed the connection before answering MQTT CONNECT"
    assert bus.stats.last_error is not None and bus.stats.last_error.startswith(expected), bus.stats.last_error
    assert expected in str(info.value)
    assert accepted >= 2


async def test_a_client_that_gives_up_on_a_silent_server_is_not_told_the_server_closed_the_connection() -> None:
    """A server that accepts the connection and never answers: paho itself ends the connection once
    ``keepalive_s`` passed without a CONNACK. The server closed nothing: the bus and check_connection
    say the wait timed out (aiomqtt's "Operation timed out" after ``connect_timeout_s``), as they did
    before the early-close detection, not "closed the connection before answering MQTT CONNECT"."""

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        # keepalive 1 s: paho gives up after 1 to 2 s (its check runs every second), before aiomqtt's 3 s
        options = MqttOptions.from_url(f"mqtt://127.0.0.1:{port}", keepalive_s=1, connect_timeout_s=3.0)

        async def bus_error() -> str | None:
            async with Bus(options, name="silent") as bus:
                await wait_for(lambda: bus.stats.failed_connects >= 1, what="a failed attempt")
            return bus.stats.last_error

        async def check_error() -> str:
            with pytest.raises(BusConnectError) as info:
                await check_connection(options, timeout_s=WAIT_S)
            return str(info.value)

        bus_why, check_why = await asyncio.gather(bus_error(), check_error())
    assert bus_why == "Operation timed out", bus_why
    assert check_why == f"cannot connect to mqtt://127.0.0.1:{port}: Operation timed out", check_why
