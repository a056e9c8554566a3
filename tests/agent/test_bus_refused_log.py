"""One line in the log per refused connection attempt of ``agent.bus.Bus``: the bus's own
("<name>: cannot connect: ... closed the connection before answering MQTT CONNECT: <why>"), which
already carries the reason paho gives. paho's own error line for the same failed socket read
("failed to receive on socket: <why>", through the logger aiomqtt hands it) came as a second error
line per attempt; it is a debug line now, kept where debug lines are asked for.

A real mosquitto that requires a client certificate (with TLS 1.3 it refuses a client without one
after CONNECT was sent), and a server that resets every connection after reading CONNECT."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import struct
from collections.abc import Callable

import pytest
from mqtt_testing import TlsFiles, wait_for

from agent.broker import EmbeddedBroker
from agent.bus import Bus, MqttOptions

pytestmark = pytest.mark.agent

ATTEMPTS = 3


def quick(options: MqttOptions) -> MqttOptions:
    """Reconnect delays of 0.025-0.1 s; a CONNACK wait far above every wait here (a bus that waited
    for it would fail the test, not slow it)."""
    return dataclasses.replace(options, reconnect_min_s=0.05, reconnect_max_s=0.1, connect_timeout_s=120.0)


async def refused_attempts(options: MqttOptions, name: str) -> Bus:
    async with Bus(quick(options), name=name) as bus:
        await wait_for(f"{ATTEMPTS} refused attempts", lambda: bus.stats.failed_connects >= ATTEMPTS)
        assert bus.stats.connects == 0
    return bus


def service_logging(caplog: pytest.LogCaptureFixture) -> None:
    """Logging as the service sets it up at its default level (``agent.logs.setup_logging("info")``):
    the root logger at INFO, ``racktwin.bus.mqtt`` at WARNING, and a handler of no level of its own, so
    the loggers' levels and filters alone decide what is written. (``caplog.set_level`` also gives its
    handler the level, which would hide a line relabelled DEBUG that the service would still write.)"""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.WARNING, logger="racktwin.bus.mqtt")
    caplog.handler.setLevel(logging.NOTSET)


def warnings_and_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """racktwin's warnings and errors (the bus's, paho's and aiomqtt's: ``racktwin.bus.mqtt``). Not
    asyncio's: aiomqtt schedules ``loop.add_writer`` for a socket that paho may have closed before it
    runs, and asyncio then logs "Exception in callback ... Bad file descriptor", rarely, on a loaded
    machine; a defect of aiomqtt, not of these lines."""
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("racktwin")]


def assert_one_line_per_attempt(caplog: pytest.LogCaptureFixture, bus: Bus, says: str) -> None:
    lines = warnings_and_errors(caplog)
    assert len(lines) == bus.stats.failed_connects, [f"{r.name} {r.levelname} {r.getMessage()}" for r in lines]
    for r in lines:
        assert r.name == "racktwin.bus" and r.levelno == logging.ERROR, (r.name, r.getMessage())
        assert r.getMessage().startswith(f"{bus.name}: cannot connect: ") and says in r.getMessage(), r.getMessage()


async def test_a_broker_that_refuses_the_tls_handshake_is_one_error_line_per_attempt(
    mosquitto_factory: Callable[..., EmbeddedBroker], tls_files: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    service_logging(caplog)  # the service's default level
    tls = dataclasses.replace(tls_files.broker_tls(), require_certificate=True)
    broker = mosquitto_factory(tls=tls, startup_timeout_s=5.0)
    bus = await refused_attempts(broker.options(ca_file=tls_files.ca_file), "nocert")
    # the reason paho read from the socket is in the bus's line
    assert_one_line_per_attempt(caplog, bus, "CERTIFICATE_REQUIRED")
    assert not any("failed to receive on socket" in r.getMessage() for r in caplog.records)


async def test_paho_s_line_for_a_refused_attempt_is_a_debug_line_where_debug_lines_are_wanted(
    mosquitto_factory: Callable[..., EmbeddedBroker], tls_files: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # as racktwin agent --log-level debug
    tls = dataclasses.replace(tls_files.broker_tls(), require_certificate=True)
    broker = mosquitto_factory(tls=tls, startup_timeout_s=5.0)
    bus = await refused_attempts(broker.options(ca_file=tls_files.ca_file), "nocert")
    assert_one_line_per_attempt(caplog, bus, "CERTIFICATE_REQUIRED")
    paho = [r for r in caplog.records if r.getMessage().startswith("failed to receive on socket: ")]
    assert paho and all(r.levelno == logging.DEBUG and r.name.startswith("racktwin.bus.mqtt") for r in paho)


async def test_a_server_that_resets_the_connection_is_one_error_line_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without TLS: a reset read (ECONNRESET) before the CONNACK."""
    service_logging(caplog)

    async def reset_after_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the client's CONNECT has come
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        writer.transport.abort()

    server = await asyncio.start_server(reset_after_connect, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        bus = await refused_attempts(MqttOptions.from_url(f"mqtt://127.0.0.1:{port}"), "reset")
    assert_one_line_per_attempt(caplog, bus, "closed the connection before answering MQTT CONNECT")
    assert not any("failed to receive on socket" in r.getMessage() for r in caplog.records)
