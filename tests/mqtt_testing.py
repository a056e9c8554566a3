"""Plain helpers and data shared by the MQTT tests (fixtures are in tests/conftest.py).

Import as ``from mqtt_testing import ...`` (tests/ is on sys.path through its conftest.py); do not
import from ``conftest``, which is ambiguous when several conftest.py files exist.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from agent.broker import BrokerTls, EmbeddedBroker
from agent.bus import Bus, Incoming, MqttOptions

REPO = Path(__file__).resolve().parents[1]
SHIPPED_MOSQUITTO_DIR = REPO / "deploy" / "mosquitto"
SHIPPED_ACL = SHIPPED_MOSQUITTO_DIR / "acl"
SHIPPED_CONF = SHIPPED_MOSQUITTO_DIR / "mosquitto.conf"

#: Site used by the protocol tests: 8 racks r0..r7 of 64 cards, 8 DVFS levels (as examples/supernode-512).
TEST_SITE = "site1"
TEST_RACKS = tuple(f"r{i}" for i in range(8))

#: Users of the shipped ACL: one per rack (named after the rack), the agent and the other roles.
SECURED_USERS = ("agent", "observer", "facility", "scheduler", "sim", *TEST_RACKS)


@dataclass(frozen=True)
class SecuredBroker:
    """mosquitto with ``deploy/mosquitto/acl`` and a password file for :data:`SECURED_USERS`."""

    broker: EmbeddedBroker
    passwords: dict[str, str]

    def options(self, user: str | None, password: str | None = None, **kw: Any) -> MqttOptions:
        """Client options logging in as ``user`` (None: anonymous) with its password unless given."""
        if user is None:
            return self.broker.options(**kw)
        return self.broker.options(username=user, password=password or self.passwords[user], **kw)


def write_password_file(path: Path, passwords: dict[str, str], mosquitto_passwd: str) -> Path:
    """A mosquitto password file (hashed with ``mosquitto_passwd -U``) for ``passwords``."""
    path.write_text("".join(f"{u}:{p}\n" for u, p in passwords.items()), encoding="utf-8")
    subprocess.run([mosquitto_passwd, "-U", str(path)], check=True, capture_output=True)
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class TlsFiles:
    ca_file: str
    cert_file: str  # server certificate for 127.0.0.1 / localhost, signed by ca_file
    key_file: str
    other_ca_file: str  # an unrelated CA: clients trusting only it must fail

    def broker_tls(self) -> BrokerTls:
        return BrokerTls(self.ca_file, self.cert_file, self.key_file)


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1/localhost, made with the openssl commands that
    deploy/mosquitto/README.md documents."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is needed to make test certificates (apt-get install openssl)", pytrace=False)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=racktwin test CA",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other CA",
        "-keyout", "other.key", "-out", "other.crt")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr")
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n", encoding="utf-8")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "server.ext", "-out", "server.crt")  # fmt: skip
    return TlsFiles(
        str(folder / "ca.crt"), str(folder / "server.crt"), str(folder / "server.key"), str(folder / "other.crt")
    )


def sample_messages(ts_s: float = 1_790_000_000.25) -> list[Any]:
    """One message of every kind, with values that survive the wire's unit conversions exactly."""
    import uuid

    import numpy as np

    from agent import wire
    from twin.workload import JobSpec, Phase

    n = 64
    rng = np.random.default_rng(7)
    cmd_id = uuid.UUID("0b0e8a2c-51f6-4d55-9a37-8a1d25e3c001")
    return [
        wire.CardBatch(
            rack="r3",
            card_index=np.arange(n, dtype=np.int64),
            power_w=np.round(rng.uniform(80.0, 700.0, n), 1),
            temp_c=np.round(rng.uniform(30.0, 85.0, n), 2),
            sm_clock_mhz=rng.choice([1980.0, 1870.0, 1210.0], n),
            utilization=np.round(rng.uniform(0.0, 1.0, n), 2),
            power_limit_w=np.full(n, 700.0),
            low_power=rng.uniform(size=n) < 0.1,
            ts_s=ts_s,
            seq=41,
            publisher="sim",
        ),
        wire.CduReading("r3", 32.0, 41.5, 96.0, 150_000.0, 480.0, ts_s=ts_s, seq=7, publisher="sim"),
        wire.CduReading("r4", 32.0, 52.5, 44.8, 40_000.0, 60.0, ts_s=ts_s, seq=7, publisher="sim", pump_speed_frac=0.5),
        wire.PduReading("r3", 48_750.0, ts_s=ts_s, seq=8, publisher="sim"),
        wire.FacilityReading(21.0, 30.0, 39.5, 12_000.0, 380_000.0, 410_000.0, 30.0, ts_s=ts_s, seq=9, publisher="sim"),
        wire.JobEvent(
            wire.JobEventType.SUBMITTED,
            "job-17",
            ts_s=ts_s,
            seq=1,
            publisher="scheduler",
            job=JobSpec("job-17", 16, 5000.0, 1.5, 0.75, priority=2.0, submit_time_s=ts_s, min_throughput_frac=0.5),
        ),
        wire.JobEvent(
            wire.JobEventType.STARTED,
            "job-17",
            ts_s=ts_s,
            seq=2,
            publisher="scheduler",
            cards={"r0": (0, 1), "r1": (5,)},
        ),
        wire.JobEvent(
            wire.JobEventType.PHASE_CHANGED, "job-17", ts_s=ts_s, seq=3, publisher="sim", phase=Phase.CHECKPOINT
        ),
        wire.JobEvent(wire.JobEventType.FAILED, "job-17", ts_s=ts_s, seq=4, publisher="sim", reason="card r1/5 failed"),
        wire.JobState(  # the scheduler's retained snapshot: a running job and a queued one
            jobs=(
                wire.JobStateEntry(
                    JobSpec("job-17", 3, 5000.0, 1.5, 0.75, priority=2.0, submit_time_s=ts_s),
                    cards={"r0": (0, 1), "r1": (5,)},
                    phase=Phase.CHECKPOINT,
                ),
                wire.JobStateEntry(JobSpec("job-18", 8, 900.0, 2.0, 0.5, submit_time_s=ts_s, min_throughput_frac=0.25)),
            ),
            ts_s=ts_s,
            seq=5,
            publisher="sim",
        ),
        wire.RackCommand(
            "r2",
            (0, 1, 2, 3),
            wire.CardSetting.dvfs(3),
            cmd_id,
            expires_s=ts_s + 30,
            ts_s=ts_s,
            seq=5,
            publisher="agent",
        ),
        wire.RackCommand("r2", (7,), wire.CardSetting.clock_range(1210.0, 1650.0), cmd_id, ts_s + 30, ts_s, 6, "agent"),
        wire.RackCommand("r2", (8, 9), wire.CardSetting.power_limit(550.0), cmd_id, ts_s + 30, ts_s, 7, "agent"),
        wire.RackCommand(  # one limit per card (columnar power_limit_watts, aligned with cards)
            "r2", (11, 12, 13), wire.CardSetting.power_limit([250.0, 312.0, 455.5]), cmd_id, ts_s + 30, ts_s, 7, "agent"
        ),
        wire.RackCommand("r2", (10,), wire.CardSetting.low_power_idle(), cmd_id, ts_s + 30, ts_s, 8, "agent"),
        wire.RackCommand("r2", (10,), wire.CardSetting.wake(), cmd_id, ts_s + 30, ts_s, 9, "agent"),
        wire.CduCommand("r2", 0.4583, cmd_id, ts_s + 30, ts_s, 10, "agent"),
        wire.FacilityCommand(32.0, cmd_id, ts_s + 60, ts_s, 10, "agent"),
        wire.SchedulerCommand("job-18", {"r4": (0, 1, 2, 3), "r5": (0, 1, 2, 3)}, cmd_id, ts_s + 60, ts_s, 11, "agent"),
        wire.Acknowledgement("r2", cmd_id, wire.AckResult.APPLIED, ts_s=ts_s, seq=12, publisher="sim"),
        wire.Acknowledgement(
            wire.FACILITY, cmd_id, wire.AckResult.REJECTED, ts_s=ts_s, seq=13, publisher="sim", reason="out of range"
        ),
        wire.Acknowledgement(wire.SCHEDULER, cmd_id, wire.AckResult.EXPIRED, ts_s=ts_s, seq=14, publisher="sim"),
        wire.AppliedState(
            rack="r2",
            card_index=np.arange(n, dtype=np.int64),
            dvfs_level=np.full(n, 3, dtype=np.int64),
            min_clock_mhz=np.full(n, 1210.0),
            max_clock_mhz=np.full(n, 1650.0),
            power_limit_w=np.full(n, 700.0),
            low_power=np.zeros(n, dtype=np.bool_),
            last_command_id=cmd_id,
            ts_s=ts_s,
            seq=15,
            publisher="sim",
        ),
        wire.AgentStatus(wire.AgentState.ONLINE, "0.1.0", ts_s=ts_s, seq=16, publisher="agent", mode="advisory"),
        wire.AgentAdvice(
            items=(wire.AdviceItem("r1", (0, 1, 2), wire.CardSetting.dvfs(2)),),
            ts_s=ts_s,
            seq=17,
            publisher="agent",
            supply_setpoint_c=34.0,
            placements=(wire.Placement("job-18", {"r4": (0, 1)}),),
            predicted_it_power_w=390_000.0,
            predicted_facility_power_w=415_000.0,
            summary="cap r1 to level 2",
            pump_speeds={"r1": 0.5, "r3": 1.0},
        ),
        # host power management: a batch with the optional host_off column, whole-host commands,
        # an applied state that says which hosts are off (rack r6: 8 hosts of 8 cards)
        wire.CardBatch(
            rack="r6",
            card_index=np.arange(16, dtype=np.int64),
            power_w=np.array([0.0] * 8 + [350.25] * 8),
            temp_c=np.full(16, 31.5),
            sm_clock_mhz=np.array([0.0] * 8 + [1980.0] * 8),
            utilization=np.array([0.0] * 8 + [0.5] * 8),
            power_limit_w=np.full(16, 700.0),
            low_power=np.array([True] * 8 + [False] * 8),
            ts_s=ts_s,
            seq=42,
            publisher="sim",
            host_off=np.array([True] * 8 + [False] * 8),
        ),
        wire.RackCommand(
            "r6", tuple(range(8)), wire.CardSetting.host_power_off(), cmd_id, ts_s + 30, ts_s, 18, "agent"
        ),
        wire.RackCommand(
            "r6", tuple(range(8, 24)), wire.CardSetting.host_power_on(), cmd_id, ts_s + 30, ts_s, 19, "agent"
        ),
        wire.AppliedState(
            rack="r6",
            card_index=np.arange(n, dtype=np.int64),
            dvfs_level=np.zeros(n, dtype=np.int64),
            min_clock_mhz=np.full(n, 1210.0),
            max_clock_mhz=np.full(n, 1980.0),
            power_limit_w=np.full(n, 700.0),
            low_power=np.arange(n) < 8,
            last_command_id=cmd_id,
            ts_s=ts_s,
            seq=20,
            publisher="sim",
            host_off=np.arange(n) < 8,
        ),
    ]


class PubackDroppingProxy:
    """A TCP proxy on loopback in front of a broker that drops every PUBACK (MQTT packet type 4) on
    its way to the client, as a broker too overloaded to acknowledge would look (while ``dropping``;
    set it False to let them through). ``publishes`` counts the PUBLISH packets (type 3) the client
    sent through it, ``pubacks_dropped`` the PUBACKs it dropped, ``clients_ended`` the client
    connections whose end it passed on (everything such a client sent is counted). The broker's end
    of a connection ends the client's."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.dropping = True
        self.publishes = 0
        self.pubacks_dropped = 0
        self.clients_ended = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: list[asyncio.Task[Any]] = []

    async def __aenter__(self) -> PubackDroppingProxy:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        for t in self._handlers:
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._handlers.append(me)
        broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [client_w, broker_w]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, to_broker: bool) -> None:
            try:
                while (packet := await read_mqtt_packet(r)) is not None:
                    kind = packet[0] >> 4
                    if to_broker and kind == 3:
                        self.publishes += 1
                    if not to_broker and kind == 4 and self.dropping:
                        self.pubacks_dropped += 1
                        continue
                    w.write(packet)
                    await w.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()
                if to_broker:
                    self.clients_ended += 1

        await asyncio.gather(pipe(client_r, broker_w, True), pipe(broker_r, client_w, False))


async def read_mqtt_packet(r: asyncio.StreamReader) -> bytes | None:
    """One MQTT control packet (fixed header, remaining length, body), or None at the end of the stream
    (``asyncio.IncompleteReadError`` when it ends inside a packet)."""
    try:
        header = await r.readexactly(1)
    except asyncio.IncompleteReadError:
        return None
    length, multiplier, encoded = 0, 1, b""
    while True:
        byte = await r.readexactly(1)
        encoded += byte
        length += (byte[0] & 0x7F) * multiplier
        multiplier *= 128
        if not byte[0] & 0x80:
            break
    return header + encoded + (await r.readexactly(length) if length else b"")


def mqtt_publish_packet(topic: str, payload: bytes) -> bytes:
    """An MQTT 3.1.1 PUBLISH packet, QoS 0, not retained (the protocol the bus speaks), to send on a
    connection the test holds at the TCP level."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + payload
    length, encoded = len(body), b""
    while True:
        byte, length = length % 128, length // 128
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return bytes([0x30]) + encoded + body


def reconnect_waits_s(caplog: pytest.LogCaptureFixture, since: int) -> dict[str, list[float]]:
    """The waits before a reconnect each bus logged (``NAME: reconnecting in S s``, at INFO on
    ``racktwin.bus``), by bus name, from ``caplog``'s record ``since`` on."""
    out: dict[str, list[float]] = {}
    for r in caplog.records[since:]:
        if r.name == "racktwin.bus" and r.msg == "%s: reconnecting in %.2f s" and isinstance(r.args, tuple):
            name, wait_s = r.args
            out.setdefault(str(name), []).append(float(cast(float, wait_s)))
    return out


def fast_reconnects(options: MqttOptions) -> MqttOptions:
    """``options`` with reconnects 0.05..0.3 s apart (a test that restarts its broker waits less)."""
    return dataclasses.replace(options, reconnect_min_s=0.05, reconnect_max_s=0.3)


async def wait_for(
    what: str, cond: Callable[[], bool], wait_s: float = 15.0, *, found: Callable[[], str] | None = None
) -> None:
    """Wait until ``cond()`` holds; fail the test naming ``what`` after ``wait_s`` (a bound on a hang,
    not a timing assertion), with what ``found()`` says there is instead when given."""
    try:
        async with asyncio.timeout(wait_s):
            while not cond():
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"no {what} within {wait_s} s" + ("" if found is None else f" ({found()})"))


async def until_sentinel(bus: Bus, sentinel: bytes, wait_s: float = 15.0) -> list[Incoming]:
    """What ``bus`` takes from :meth:`Bus.messages` before the message whose payload is ``sentinel``."""
    out: list[Incoming] = []
    async with asyncio.timeout(wait_s):
        async for m in bus.messages():
            if m.payload == sentinel:
                return out
            out.append(m)
    return out
