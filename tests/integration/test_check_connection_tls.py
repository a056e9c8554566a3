"""``agent.bus.check_connection`` (``racktwin agent --check-connection``, the probe before a start)
against a real mosquitto whose TLS listener requires client certificates: a client that presents
none is told that the broker refused the TLS handshake (closed the connection), not that the broker
did not answer (it said "no answer from ... within 5 s" after waiting out the whole timeout)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest
from mqtt_testing import TlsFiles

from agent.broker import EmbeddedBroker
from agent.bus import BusConnectError, MqttOptions, check_connection

pytestmark = pytest.mark.integration

WAIT_S = 30.0  # far above how long a refusal takes: a wait that ran out would say "no answer"


async def test_a_client_without_the_certificate_the_broker_requires_is_told_the_handshake_was_refused(
    mosquitto_factory: Callable[..., EmbeddedBroker], tls_files: TlsFiles
) -> None:
    tls = dataclasses.replace(tls_files.broker_tls(), require_certificate=True)
    broker = mosquitto_factory(tls=tls, startup_timeout_s=5.0)
    with pytest.raises(BusConnectError) as info:
        await check_connection(broker.options(ca_file=tls_files.ca_file), timeout_s=WAIT_S)
    msg = str(info.value)
    assert broker.url in msg, msg
    assert "no answer" not in msg, msg
    assert "TLS" in msg and "refused" in msg and "client certificate" in msg, msg
    # with the certificate it connects (the same broker, the same CA)
    with_cert = broker.options(ca_file=tls_files.ca_file, cert_file=tls_files.cert_file, key_file=tls_files.key_file)
    await check_connection(with_cert, timeout_s=WAIT_S)


async def test_a_server_that_closes_the_connection_before_answering_connect_is_told_at_once() -> None:
    """Without TLS the same early end (a server that is not the broker, one that drops the client) says
    the connection was closed before CONNECT was answered, not "no answer"."""

    async def close_at_once(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(BusConnectError) as info:
            await check_connection(MqttOptions.from_url(f"mqtt://127.0.0.1:{port}"), timeout_s=WAIT_S)
    msg = str(info.value)
    assert msg.startswith(f"mqtt://127.0.0.1:{port} closed the connection before answering MQTT CONNECT"), msg
