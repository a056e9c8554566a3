"""``agent.broker``: what a changed line of a mutation audit did not make any other test fail, held
against a real mosquitto.

The embedded broker listens on loopback only, answers MQTT as soon as :meth:`EmbeddedBroker.start`
returns, starts once however often it is asked to, comes back from :meth:`EmbeddedBroker.restart`
as a fresh broker (no retained messages: persistence off), keeps up to ``max_queued_messages`` for a
persistent session that is away (mosquitto's own default keeps 1000), starts with a TLS listener
that requires client certificates (and refuses a client without one), deletes its temporary folder on
:meth:`EmbeddedBroker.stop` (unless told to keep it), is stopped when its owner forgets it, and says
it is not running once its process has died; :func:`mqtt_answers` is true for an MQTT broker only,
not for anything that accepts a TCP connection."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mqtt_testing import TlsFiles, until_sentinel, wait_for

from agent.broker import EmbeddedBroker, mqtt_answers
from agent.bus import Bus, BusConnectError, Incoming, check_connection

pytestmark = pytest.mark.agent

WAIT_S = 15.0  # a bound on every wait (a hang fails the test); nothing here asserts a duration


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) of the TCP sockets listening on ``port``."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(address)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_the_broker_listens_on_loopback_only(mosquitto: EmbeddedBroker) -> None:
    """A broker for the demo, the simulator and the tests, anonymous by default: never reachable from
    another machine."""
    assert _listening_addresses(mosquitto.port) == {"0100007F"}  # 127.0.0.1, not 00000000 (every interface)


def test_start_on_a_running_broker_changes_nothing(mosquitto: EmbeddedBroker) -> None:
    pid, port = mosquitto.pid, mosquitto.port
    assert mosquitto.start() is mosquitto
    assert (mosquitto.pid, mosquitto.port) == (pid, port)


def test_a_broker_whose_process_died_is_not_running(mosquitto: EmbeddedBroker) -> None:
    pid = mosquitto.pid
    assert pid is not None and mosquitto.running
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # reaped here: poll() sees it gone
    assert not mosquitto.running and mosquitto.pid is None
    mosquitto.start()  # and it can be started again, on its port
    assert mosquitto.running and mqtt_answers(mosquitto.host, mosquitto.port)


def test_stop_deletes_the_temporary_folder_unless_told_to_keep_it(mosquitto_path: str) -> None:
    broker = EmbeddedBroker(backend="mosquitto", mosquitto_path=mosquitto_path).start()
    log_path = broker.log_path
    assert log_path is not None and log_path.exists()
    broker.stop(keep_files=True)
    assert log_path.exists() and "running" in log_path.read_text()
    broker.start()
    broker.stop()
    assert not log_path.parent.exists()


def test_a_forgotten_broker_is_stopped_with_its_owner(mosquitto_path: str) -> None:
    broker = EmbeddedBroker(backend="mosquitto", mosquitto_path=mosquitto_path).start()
    pid, port, folder = broker.pid, broker.port, broker.log_path
    assert pid is not None and folder is not None
    del broker
    gc.collect()
    try:
        assert not mqtt_answers("127.0.0.1", port)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # terminated and reaped
        assert not folder.parent.exists()  # its temporary folder removed too (it was left behind)
    finally:
        with_pid_gone(pid)


def with_pid_gone(pid: int) -> None:
    """Clean up after a failing :func:`test_a_forgotten_broker_is_stopped_with_its_owner`."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


async def test_a_restarted_broker_is_a_fresh_one(mosquitto: EmbeddedBroker) -> None:
    """:meth:`EmbeddedBroker.restart` (the simulator's broker-restart fault): the same port, nothing kept
    (persistence off): a retained message published before is gone."""
    async with Bus(mosquitto.options(), name="pub") as pub:
        await pub.wait_connected(WAIT_S)
        await pub.publish("audit/retained", b"old", qos=1, retain=True)
    await asyncio.to_thread(mosquitto.restart)
    async with (
        Bus(mosquitto.options(), subscriptions=["audit/retained", "audit/end"], name="late") as late,
        Bus(mosquitto.options(), name="pub2") as pub2,
    ):
        await late.wait_connected(WAIT_S)
        await pub2.wait_connected(WAIT_S)
        await pub2.publish("audit/end", b"end", qos=1)
        got = await until_sentinel(late, b"end")
    assert got == []


async def test_a_persistent_session_away_gets_more_than_mosquittos_default_1000_queued_messages(
    mosquitto: EmbeddedBroker,
) -> None:
    """``max_queued_messages`` (10,000 by default) is the broker's: an agent away for a restart finds
    every QoS 1 message published meanwhile (mosquitto alone keeps 1000)."""
    session = mosquitto.options(client_id="audit-away", clean_session=False)
    async with Bus(session, subscriptions=["audit/away"], name="away") as away:
        await away.wait_connected(WAIT_S)
    n = 1200
    async with Bus(mosquitto.options(max_inflight=100), name="pub") as pub:
        await pub.wait_connected(WAIT_S)
        for start in range(0, n, 100):
            await asyncio.gather(
                *(pub.publish("audit/away", str(k).encode(), qos=1) for k in range(start, start + 100))
            )
    received: list[Incoming] = []
    async with Bus(session, subscriptions=["audit/away"], on_message=received.append, name="back") as back:
        await back.wait_connected(WAIT_S)
        await wait_for("every queued message", lambda: len(received) >= n)
    assert sorted(int(m.payload) for m in received) == list(range(n))


@dataclasses.dataclass
class _Server:
    port: int


@pytest.fixture
def not_mqtt() -> Iterator[_Server]:
    """A TCP server on a loopback port that answers every connection with an HTTP error, as a web
    server would: it accepts TCP but is no MQTT broker."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield _Server(srv.getsockname()[1])
    finally:
        stop.set()
        t.join(5)
        srv.close()


def test_mqtt_answers_only_for_an_mqtt_broker(not_mqtt: _Server, mosquitto: EmbeddedBroker) -> None:
    assert not mqtt_answers("127.0.0.1", not_mqtt.port)
    assert mqtt_answers(mosquitto.host, mosquitto.port)


async def test_a_tls_listener_that_requires_client_certificates_starts_and_refuses_clients_without_one(
    mosquitto_factory: Callable[..., EmbeddedBroker], tls_files: TlsFiles
) -> None:
    """:class:`BrokerTls` ``require_certificate``: the broker starts (it never did: the readiness probe,
    which has no client certificate, was refused until the start timed out, three times), a client with
    a certificate the CA signed connects (the test's server certificate serves as one), a client without
    one does not."""
    tls = dataclasses.replace(tls_files.broker_tls(), require_certificate=True)
    broker = mosquitto_factory(tls=tls, startup_timeout_s=5.0)
    assert broker.url.startswith("mqtts://") and broker.options().url == broker.url  # its options say TLS
    with_cert = broker.options(ca_file=tls_files.ca_file, cert_file=tls_files.cert_file, key_file=tls_files.key_file)
    await check_connection(with_cert, timeout_s=WAIT_S)
    with pytest.raises(BusConnectError):
        await check_connection(broker.options(ca_file=tls_files.ca_file), timeout_s=3.0)
