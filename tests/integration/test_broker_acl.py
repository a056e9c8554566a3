"""The shipped mosquitto security (deploy/mosquitto): the ACL with a generated password file, and
the shipped mosquitto.conf itself with its TLS listener."""

from __future__ import annotations

import getpass
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqtt_helpers import WAIT_S, delivered, next_messages, wait_for
from mqtt_testing import SHIPPED_ACL, SHIPPED_CONF, SecuredBroker, TlsFiles, write_password_file

from agent import wire
from agent.broker import free_ports, mqtt_answers
from agent.bus import Bus, BusConnectError, MqttOptions, check_connection
from agent.wire import Codec

pytestmark = pytest.mark.integration

TS = 1_790_000_000.0


def _command(codec: Codec, rack: str, publisher: str, kind: wire.Kind = wire.Kind.RACK_CMD) -> wire.Outgoing:
    cmd: wire.Command
    if kind is wire.Kind.CDU_CMD:
        cmd = wire.CduCommand(rack, 0.5, wire.new_command_id(), TS + 30, TS, 0, publisher)
    else:
        cmd = wire.RackCommand(rack, (0,), wire.CardSetting.dvfs(4), wire.new_command_id(), TS + 30, TS, 0, publisher)
    return codec.outgoing(cmd)


async def test_anonymous_and_wrong_passwords_are_refused(secured_mosquitto: SecuredBroker) -> None:
    with pytest.raises(BusConnectError, match="refused"):
        await check_connection(secured_mosquitto.options(None), timeout_s=WAIT_S)
    with pytest.raises(BusConnectError, match="refused"):
        await check_connection(secured_mosquitto.options("agent", password="guess"), timeout_s=WAIT_S)
    with pytest.raises(BusConnectError, match="refused"):
        await check_connection(secured_mosquitto.options("r99", password="pw-r99-secret"), timeout_s=WAIT_S)
    await check_connection(secured_mosquitto.options("agent"), timeout_s=WAIT_S)


async def test_a_bus_with_bad_credentials_says_why(secured_mosquitto: SecuredBroker) -> None:
    async with Bus(secured_mosquitto.options("agent", password="guess")) as bus:
        await wait_for(lambda: bus.stats.failed_connects >= 1, what="a refused attempt")  # its error is the why
        with pytest.raises(BusConnectError, match=r"(?i)not authori|bad user"):
            await bus.wait_connected(0.1)


async def test_only_the_agent_may_publish_commands(secured_mosquitto: SecuredBroker, codec: Codec) -> None:
    s = secured_mosquitto
    watcher = Bus(s.options("observer"), subscriptions=["racktwin/v1/#"], name="observer")
    async with watcher, Bus(s.options("r0"), name="r0") as r0, Bus(s.options("agent"), name="agent") as agent:
        for bus in (watcher, r0, agent):
            await bus.wait_connected(WAIT_S)
        forged = _command(codec, "r0", "r0")  # a rack trying to command itself
        forged_other = _command(codec, "r1", "r0")  # ... or another rack
        genuine = _command(codec, "r0", "agent")
        seen = await delivered(
            watcher,
            [(r0, forged.topic, forged.payload), (r0, forged_other.topic, forged_other.payload)],
            sentinel=(agent, genuine.topic, genuine.payload),
        )
        assert seen == []  # the rack's commands never reached a subscriber; the agent's did (sentinel)


@pytest.mark.parametrize("kind", [wire.Kind.RACK_CMD, wire.Kind.CDU_CMD])
async def test_a_rack_reads_only_its_own_commands(
    secured_mosquitto: SecuredBroker, codec: Codec, kind: wire.Kind
) -> None:
    s = secured_mosquitto
    rack = Bus(s.options("r0"), subscriptions=[codec.topics.filter(kind)], name="r0")
    async with rack, Bus(s.options("agent"), name="agent") as agent:
        await rack.wait_connected(WAIT_S)
        await agent.wait_connected(WAIT_S)
        for_r1, for_r0 = _command(codec, "r1", "agent", kind), _command(codec, "r0", "agent", kind)
        seen = await delivered(rack, [(agent, for_r1.topic, for_r1.payload)], (agent, for_r0.topic, for_r0.payload))
        assert seen == []  # r1's command was not delivered to r0, r0's was (sentinel)


# (user, topic, may publish). Rack users are named after their rack.
MATRIX: list[tuple[str, str, bool]] = [
    ("r0", "racktwin/v1/site1/rack/r0/cards", True),
    ("r0", "racktwin/v1/site1/rack/r0/cdu", True),
    ("r0", "racktwin/v1/site1/rack/r0/pdu", True),
    ("r0", "racktwin/v1/site1/rack/r0/ack", True),
    ("r0", "racktwin/v1/site1/rack/r0/applied", True),
    ("r0", "racktwin/v1/site1/rack/r1/cards", False),
    ("r0", "racktwin/v1/site1/rack/r1/applied", False),
    ("r0", "racktwin/v1/site1/rack/r0/cmd", False),
    ("r0", "racktwin/v1/site1/rack/r0/cdu_cmd", False),
    ("r0", "racktwin/v1/site1/facility/cmd", False),
    ("r0", "racktwin/v1/site1/scheduler/cmd", False),
    ("r0", "racktwin/v1/site1/agent/status", False),
    ("r0", "racktwin/v1/site1/agent/advice", False),
    ("r0", "racktwin/v1/site1/jobs/events", False),
    ("r0", "racktwin/v1/site1/facility", False),
    ("r5", "racktwin/v1/site1/rack/r5/cards", True),
    ("r5", "racktwin/v1/site1/rack/r0/cards", False),
    ("agent", "racktwin/v1/site1/rack/r3/cmd", True),
    ("agent", "racktwin/v1/site1/rack/r3/cdu_cmd", True),
    ("agent", "racktwin/v1/site1/facility/cmd", True),
    ("agent", "racktwin/v1/site1/scheduler/cmd", True),
    ("agent", "racktwin/v1/site1/agent/status", True),
    ("agent", "racktwin/v1/site1/agent/advice", True),
    ("agent", "racktwin/v1/site1/rack/r3/cards", False),
    ("agent", "racktwin/v1/site1/rack/r3/ack", False),
    ("agent", "racktwin/v1/site1/facility", False),
    ("facility", "racktwin/v1/site1/facility", True),
    ("facility", "racktwin/v1/site1/facility/ack", True),
    ("facility", "racktwin/v1/site1/facility/cmd", False),
    ("facility", "racktwin/v1/site1/rack/r0/cards", False),
    ("scheduler", "racktwin/v1/site1/jobs/events", True),
    ("scheduler", "racktwin/v1/site1/scheduler/ack", True),
    ("scheduler", "racktwin/v1/site1/scheduler/cmd", False),
    ("observer", "racktwin/v1/site1/rack/r0/cards", False),
    ("observer", "racktwin/v1/site1/rack/r0/cmd", False),
    ("observer", "racktwin/v1/site1/agent/status", False),
    ("sim", "racktwin/v1/site1/rack/r7/cards", True),
    ("sim", "racktwin/v1/site1/rack/r7/applied", True),
    ("sim", "racktwin/v1/site1/facility", True),
    ("sim", "racktwin/v1/site1/jobs/events", True),
    ("sim", "racktwin/v1/site1/rack/r7/cmd", False),
    ("sim", "racktwin/v1/site1/agent/status", False),
]


async def test_the_acl_matrix(secured_mosquitto: SecuredBroker) -> None:
    """Every role publishes to topics it may and may not use; the observer sees exactly the allowed ones."""
    s = secured_mosquitto
    users = sorted({u for u, _, _ in MATRIX})
    buses = {u: Bus(s.options(u), name=u) for u in users}
    watcher = Bus(s.options("observer"), subscriptions=["racktwin/v1/#"], name="watcher")
    for bus in (*buses.values(), watcher):
        bus.start()
    try:
        for bus in (*buses.values(), watcher):
            await bus.wait_connected(WAIT_S)
        attempts = [(buses[u], topic, f"probe-{i}".encode()) for i, (u, topic, _) in enumerate(MATRIX)]
        seen = await delivered(watcher, attempts, (buses["agent"], "racktwin/v1/site1/agent/advice", b"end"))
    finally:
        for bus in (*buses.values(), watcher):
            await bus.close()
    got = {m.payload.decode() for m in seen}
    expected = {f"probe-{i}" for i, (_, _, ok) in enumerate(MATRIX) if ok}
    wrong = [(MATRIX[int(p.split("-")[1])], "allowed" if p in got else "denied") for p in sorted(got ^ expected)]
    assert got == expected, f"ACL differs from the table: {wrong}"


async def test_a_rack_bridge_with_the_shipped_acl_restores_its_applied_state(
    secured_mosquitto: SecuredBroker, codec: Codec
) -> None:
    s = secured_mosquitto
    topic = codec.topics.applied("r2")
    async with Bus(s.options("r2")) as bridge:
        await bridge.wait_connected(WAIT_S)
        await bridge.publish(topic, b"state-of-r2", qos=1, retain=True)
    async with Bus(s.options("r2"), subscriptions=[topic]) as restarted:
        [m] = await next_messages(restarted, 1)
    assert (m.payload, m.retain) == (b"state-of-r2", True)


# ---- the shipped mosquitto.conf, TLS included ---------------------------------------------------


def _rewrite_shipped_conf(folder: Path, plain_port: int, tls_port: int, log_file: Path) -> str:
    """The shipped config with its ports, paths and log destination moved into ``folder``."""
    text = SHIPPED_CONF.read_text(encoding="utf-8")
    text = text.replace("/etc/mosquitto/racktwin/", f"{folder}/").replace("/var/lib/mosquitto/", f"{folder}/")
    text = re.sub(r"^listener 1883 127\.0\.0\.1$", f"listener {plain_port} 127.0.0.1", text, flags=re.M)
    text = re.sub(r"^listener 8883$", f"listener {tls_port} 127.0.0.1", text, flags=re.M)
    text = re.sub(r"^log_dest .*$", "", text, flags=re.M)
    assert f"listener {plain_port}" in text and f"listener {tls_port}" in text, "shipped listeners changed"
    return text + f"\nlog_dest file {log_file}\nuser {getpass.getuser()}\n"


@pytest.fixture
def shipped_broker(
    tmp_path: Path, mosquitto_path: str, mosquitto_passwd_path: str, tls_files: TlsFiles
) -> Iterator[tuple[int, int]]:
    """mosquitto running deploy/mosquitto/mosquitto.conf (ports, paths rewritten); yields (plain, tls) ports."""
    for name, src in (("ca.crt", tls_files.ca_file), ("server.crt", tls_files.cert_file)):
        (tmp_path / name).write_bytes(Path(src).read_bytes())
    (tmp_path / "server.key").write_bytes(Path(tls_files.key_file).read_bytes())
    (tmp_path / "acl").write_bytes(SHIPPED_ACL.read_bytes())
    write_password_file(tmp_path / "passwd", {"agent": "agent-pw", "r0": "r0-pw"}, mosquitto_passwd_path)
    conf = tmp_path / "mosquitto.conf"
    log_file = tmp_path / "mosquitto.log"
    for attempt in range(3):  # a picked free port can be taken by another process meanwhile: pick again
        plain, tls = free_ports(2)
        conf.write_text(_rewrite_shipped_conf(tmp_path, plain, tls, log_file), encoding="utf-8")
        proc = subprocess.Popen([mosquitto_path, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + WAIT_S
        while not (mqtt_answers("127.0.0.1", plain) and mqtt_answers("127.0.0.1", tls, tls=True)):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        else:
            break  # both listeners answer
        err = proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else ""
        proc.kill()
        proc.wait(10)
        if "Address already in use" not in err or attempt == 2:
            log = log_file.read_text() if log_file.exists() else ""
            pytest.fail(f"the shipped mosquitto.conf did not start: {err} {log}", pytrace=False)
    try:
        yield plain, tls
    finally:
        proc.terminate()
        proc.wait(10)


async def test_the_shipped_config_refuses_anonymous_and_serves_tls(
    shipped_broker: tuple[int, int], tls_files: TlsFiles, codec: Codec
) -> None:
    plain, tls = shipped_broker
    with pytest.raises(BusConnectError, match="refused"):
        await check_connection(MqttOptions(port=plain), timeout_s=WAIT_S)
    with pytest.raises(BusConnectError, match="refused"):
        await check_connection(MqttOptions(port=tls, ca_file=tls_files.ca_file), timeout_s=WAIT_S)
    # a client that does not trust the broker's CA does not connect
    with pytest.raises(BusConnectError):
        await check_connection(
            MqttOptions(port=tls, ca_file=tls_files.other_ca_file, username="agent", password="agent-pw"),
            timeout_s=WAIT_S,
        )
    # plain MQTT to the TLS port gets no answer
    with pytest.raises(BusConnectError):
        await check_connection(MqttOptions(port=tls, username="agent", password="agent-pw"), timeout_s=1.0)

    agent_opts = MqttOptions(port=tls, ca_file=tls_files.ca_file, username="agent", password="agent-pw")
    rack_opts = MqttOptions(port=tls, ca_file=tls_files.ca_file, username="r0", password="r0-pw")
    cmd = _command(codec, "r0", "agent")
    async with Bus(rack_opts, subscriptions=[cmd.topic]) as rack, Bus(agent_opts) as agent:
        await rack.wait_connected(WAIT_S)
        await agent.wait_connected(WAIT_S)
        assert rack.options.url.startswith("mqtts://")
        await agent.send(cmd)
        [m] = await next_messages(rack, 1)
    assert codec.decode(m.topic, m.payload) == codec.decode(cmd.topic, cmd.payload)
