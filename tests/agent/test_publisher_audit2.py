"""The Publisher's contract (``agent.publish``, ``agent.publisher``), second audit: the loose ends.

* ``abandoned``: a command is closed ``abandoned`` (retries used up) only when it outlives its
  retries: with the retry interval ``command_ttl_s / (command_retries + 1)`` the last retry's
  interval ends at the expiry, so an ordinary command expires (``unacked``) instead. A re-send after
  a reconnect counts as a send: a command sent again at once after a reconnect has its retries used
  up before it expires and is abandoned then.
* Site time 0.0 (a simulator started with ``--start-epoch-s 0``) is a site time like any other.
* The warning that the broker does not acknowledge commands comes at most once every
  ``unconfirmed_warning_interval_s`` (a minute, docs/agent.md).
* The service tells the publisher when its broker connection comes back (``AgentService._on_connect``):
  every open command goes out again at once, not at its next retry.

Each test drives a Publisher against a real mosquitto, as ``test_publisher_audit`` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from pathlib import Path

import pytest
from agent_helpers import example_site
from mqtt_testing import PubackDroppingProxy, fast_reconnects, wait_for
from site_testing import write_capped_small_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from agent.clock import SiteClock
from agent.command_book import CommandBook
from agent.config import ControlConfig, load_config
from agent.journal import Journal
from agent.publish import OpenCommand, Publisher, new_commands
from agent.service import AgentService

pytestmark = pytest.mark.agent

TS = 1_790_000_000.0


@dataclasses.dataclass
class Desk:
    """What a Publisher works with: a codec, a command book (a 30 s command life, 2 retries: one every
    10 s), a site clock and a journal."""

    codec: wire.Codec
    control: ControlConfig
    book: CommandBook
    clock: SiteClock
    journal: Journal
    cycle: int = 0

    def issue(self, rack: str, cards: tuple[int, ...], level: int, ts: float, life_s: float = 30.0) -> OpenCommand:
        """One DVFS command for ``cards`` of ``rack`` issued at ``ts``, open in the book and journaled
        with its decision."""
        self.cycle += 1
        cmd = wire.RackCommand(
            rack, cards, wire.CardSetting.dvfs(level), uuid.uuid4(), ts + life_s, ts, self.cycle, "agent"
        )
        out = self.codec.outgoing(cmd)
        (oc,) = self.book.resume([(str(cmd.command_id), rack, out.topic, out.payload, ts, ts + life_s, 0)])
        self.journal.record_decision(self.cycle, ts, "enforce", "optimal", 0.0, {}, new_commands([oc]))
        return oc


def desk(tmp_path: Path, clock: SiteClock | None = None) -> Desk:
    site = example_site()
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    control = ControlConfig()
    if clock is None:
        clock = SiteClock(1.0, ahead_tolerance_s=3600.0)  # the tests move site time on by one message far ahead
        clock.observe(TS)
    return Desk(codec, control, CommandBook(site, codec, control), clock, Journal(tmp_path / "journal.sqlite"))


# ---- abandoned ------------------------------------------------------------------------------------


async def test_a_command_sent_again_after_a_reconnect_is_abandoned_once_its_retries_are_used_up(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two commands of the default 30 s life. One is issued at 0 s, goes out then, again at once
    after a reconnect at 5 s and retried at 15 s: three sends, its retries used up; at 25 s, 5 s
    before its expiry, it is closed ``abandoned``: counted, reported to ``on_closed`` (the service's
    ``racktwin_commands_total{result="abandoned"}``), journaled ``abandoned``, an ack missing (its
    rack was heard from) with its warning. The other, issued after the reconnect at 5 s, goes out at
    5, 15 and 25 s (2 retries, one every 10 s) and at 35 s, its last retry's interval over, it has
    expired: closed ``unacked``, never ``abandoned``."""
    wall = [0.0]
    clock = SiteClock(1.0, infer=False, wall=lambda: wall[0])  # site time exactly as the test sets it
    clock.observe(TS)
    d = desk(tmp_path, clock)
    closed: list[tuple[str, str]] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus,
            d.book,
            d.journal,
            d.clock,
            d.control,
            on_closed=lambda oc, why: closed.append((oc.target, why)),
            heard_since=lambda target, site_s: True,
        )
        resent = d.issue("r1", (0,), 1, ts=TS)
        publisher.submit([resent])
        await publisher.step()
        wall[0] = 5.0
        publisher.reconnected()  # what the service does when its broker connection comes back
        await publisher.step()
        assert resent.attempts == 2  # the reconnect sends every open command again
        plain = d.issue("r0", (0,), 1, ts=TS + 5.0)
        publisher.submit([plain])
        await publisher.step()
        wall[0] = 15.0
        await publisher.step()
        assert (plain.attempts, resent.attempts) == (2, 3) and closed == []
        wall[0] = 25.0
        await publisher.step()
        assert closed == [("r1", "abandoned")] and publisher.stats.abandoned == 1 and plain.attempts == 3
        wall[0] = 35.0
        await publisher.step()
    assert closed == [("r1", "abandoned"), ("r0", "unacked")]
    assert publisher.stats.abandoned == 1 and publisher.stats.unacked_expired == 1 and publisher.stats.sent == 6
    assert publisher.acks_missing == {"r0": 1, "r1": 1}
    assert any(r.getMessage().startswith("no ack from r1 for 1 command(s)") for r in caplog.records)
    rows = {oc.target: d.journal.command(oc.command_id) for oc in (plain, resent)}
    assert {k: (row.state, row.attempts) for k, row in rows.items() if row is not None} == {
        "r0": ("expired", 3),
        "r1": ("abandoned", 3),
    }
    d.journal.close()


# ---- site time 0.0 --------------------------------------------------------------------------------


async def test_commands_at_site_time_zero_are_sent_retried_and_closed_on_that_timeline(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A site whose clock starts at 0.0 (the simulator with ``--start-epoch-s 0``; the wire takes any
    ``ts >= 0``): a command issued at 0.0 counts as sent at 0.0, goes out again at 10 s and 20 s (not
    before) and closes unacked at its expiry, 30 s. The clock reads exactly 0.0 at the first send (its
    wall clock held still), which a truthiness test would take for "no site time"."""
    wall = [100.0]
    clock = SiteClock(1.0, infer=False, wall=lambda: wall[0])
    clock.observe(0.0)
    d = desk(tmp_path, clock)
    sends: list[float] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus, d.book, d.journal, d.clock, d.control, on_sent=lambda oc, retry: sends.append(oc.last_sent_s)
        )
        oc = d.issue("r0", (0,), 1, ts=0.0)
        publisher.submit([oc])
        for t in (0.0, 9.5, 10.0, 19.5, 20.0, 29.5):
            wall[0] = 100.0 + t
            await publisher.step()
        assert oc.command_id in d.book.open
        wall[0] = 130.0
        await publisher.step()
    assert sends == [0.0, 10.0, 20.0] and oc.first_sent_s == 0.0
    assert oc.command_id not in d.book.open and publisher.stats.unacked_expired == 1
    d.journal.close()


# ---- the warning that the broker does not acknowledge commands ------------------------------------


def unconfirmed_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("the broker does not acknowledge")]


async def test_the_broker_not_acknowledging_is_warned_about_at_most_once_an_interval(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Sends without a PUBACK (a proxy drops them): the first is warned about, the next at once is
    not (a minute by default: ``unconfirmed_warning_interval_s``, docs/agent.md "at most once a
    minute"); once that interval has passed, the next is warned about again."""
    d = desk(tmp_path)
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = dataclasses.replace(mosquitto.options(), port=proxy.port)
        async with Bus(options, name="agent") as bus:
            await bus.wait_connected(10)
            publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
            assert publisher.unconfirmed_warning_interval_s == 60.0
            publisher.puback_timeout_s = 0.1
            for card in (0, 1):
                publisher.submit([d.issue("r0", (card,), 1, ts=TS)])
                await publisher.step()
            assert len(unconfirmed_warnings(caplog)) == 1
            publisher.unconfirmed_warning_interval_s = 0.5
            await asyncio.sleep(0.6)
            publisher.submit([d.issue("r0", (2,), 1, ts=TS)])
            await publisher.step()
    assert publisher.stats.unconfirmed == 3 and len(unconfirmed_warnings(caplog)) == 2
    d.journal.close()


# ---- the service's reconnect hook -----------------------------------------------------------------


def agent_service(broker: EmbeddedBroker, folder: Path) -> AgentService:
    """A service (not started) on the small test site (2 racks of 16 cards), commands of the default
    30 s life, 2 retries: one every 10 s."""
    write_capped_small_site(folder, 12_500.0)
    lines = ['site = "site.toml"', 'site_id = "site1"', 'mode = "enforce"', "[journal]", 'path = "journal.sqlite"']
    (folder / "agent.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = load_config(folder / "agent.toml", env={"RACKTWIN_BROKER_URL": f"mqtt://127.0.0.1:{broker.port}"})
    options = fast_reconnects(broker.options(client_id=f"agent-{uuid.uuid4().hex[:8]}"))
    return AgentService(loaded, mqtt=options, http=False)


async def test_after_the_service_reconnects_its_open_commands_go_out_again_at_once(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A broker restarted without persistence forgets the commands it had not delivered: when the
    service's connection comes back (its ``on_connect``) the next publisher step sends every open
    command again, before the retry interval (10 s) is up, and counts it a retry
    (``racktwin_commands_total{result="retried"}``)."""
    service = agent_service(mosquitto, tmp_path)
    try:
        d = Desk(service.codec, service.config.control, service.book, service.clock, service.journal)
        d.clock.observe(TS)
        value = service.metrics.registry.get_sample_value
        async with service.bus as bus:
            await bus.wait_connected(10)
            assert service.publisher.retry_after_s == 10.0
            oc = d.issue(service.site.rack_names[0], (0,), 1, ts=TS)
            service.publisher.submit([oc])
            await service.publisher.step()
            assert oc.attempts == 1
            await asyncio.to_thread(mosquitto.restart)
            await wait_for("the reconnect", lambda: value("racktwin_broker_reconnects_total") == 2.0 and bus.connected)
            await service.publisher.step()
            now = d.clock.now()
            assert oc.attempts == 2 and now is not None and now - TS < 10.0  # before the retry interval
            assert value("racktwin_commands_total", {"result": "retried"}) == 1.0
            await service.publisher.step()
            assert oc.attempts == 2  # once
    finally:
        service.journal.close()


async def test_a_broker_that_keeps_not_acknowledging_is_warned_about_again_each_interval(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that never acknowledges, a command sent at each step: the warning comes again once
    the interval has passed since the last warning, with the number of sends unconfirmed since it
    (the rhythm of failures that repeat, ``agent.failure_lines``). It used to count the interval from
    the last unconfirmed send, so a failure that lasted gave one warning at its start and none after,
    however long it went on."""
    d = desk(tmp_path)
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = dataclasses.replace(mosquitto.options(), port=proxy.port)
        async with Bus(options, name="agent") as bus:
            await bus.wait_connected(10)
            publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
            publisher.puback_timeout_s = 0.1  # each send waits this long: at most 10 sends a second
            publisher.unconfirmed_warning_interval_s = 1.0
            publisher.submit([d.issue("r0", (0,), 0, ts=TS)])
            await publisher.step()
            assert len(unconfirmed_warnings(caplog)) == 1  # the first unconfirmed send is warned about
            # counted from after the first warning (not from before the first send, which on a loaded
            # machine may take longer than the margin): the send after the loop is past the interval
            first = asyncio.get_running_loop().time()
            card = 1
            while asyncio.get_running_loop().time() - first < 1.2:  # past the interval, then one more send
                publisher.submit([d.issue("r0", (card % 64,), card % 8, ts=TS)])
                await publisher.step()
                card += 1
            publisher.submit([d.issue("r1", (0,), 1, ts=TS)])
            await publisher.step()
    warnings = unconfirmed_warnings(caplog)
    assert publisher.stats.unconfirmed == card + 1
    assert len(warnings) >= 2, warnings
    since = [re.search(r"\((\d+) send\(s\) unconfirmed since the last warning\)", w) for w in warnings[1:]]
    counts = [int(m.group(1)) for m in since if m is not None]
    assert len(counts) == len(warnings) - 1 and min(counts) >= 1, warnings
    assert sum(counts) <= publisher.stats.unconfirmed - 1  # the sends after the first, each in one line at most
    d.journal.close()


async def test_a_reconnect_sends_again_a_command_whose_retries_are_used_up(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """``Publisher.reconnected``: "send every open command again", also one whose retries are used up
    (the broker may have lost its last copy). A command of the default 30 s life sent at 0, 10 and
    20 s (2 retries, one every 10 s: used up); the connection comes back at 22 s: it goes out a fourth
    time at once, not closed ``abandoned``; at 30 s, before another retry interval is over (32 s), it
    expires: closed ``unacked``."""
    wall = [0.0]
    clock = SiteClock(1.0, infer=False, wall=lambda: wall[0])
    clock.observe(TS)
    d = desk(tmp_path, clock)
    closed: list[str] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, on_closed=lambda oc, why: closed.append(why))
        oc = d.issue("r0", (0,), 1, ts=TS)
        publisher.submit([oc])
        for t in (0.0, 10.0, 20.0):
            wall[0] = t
            await publisher.step()
        assert oc.attempts == 3 and closed == []
        wall[0] = 22.0
        publisher.reconnected()
        await publisher.step()
        assert oc.attempts == 4 and closed == [] and oc.command_id in d.book.open
        wall[0] = 30.0
        await publisher.step()
    assert closed == ["unacked"] and publisher.stats.abandoned == 0
    d.journal.close()


async def test_the_commands_abandoned_at_one_step_are_journaled_in_one_transaction(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """After a reconnect every open command has gone out once more, so their retries run out
    together: the commands a step abandons are journaled ``abandoned`` in one transaction (as a
    batch is marked sent), not one per command (each a write on the event loop)."""
    wall = [0.0]
    clock = SiteClock(1.0, infer=False, wall=lambda: wall[0])
    clock.observe(TS)
    d = desk(tmp_path, clock)
    statements: list[str] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        opened = [d.issue(f"r{k}", (0,), 1, ts=TS) for k in range(5)]
        publisher.submit(opened)
        await publisher.step()
        wall[0] = 5.0
        publisher.reconnected()
        await publisher.step()
        wall[0] = 15.0
        await publisher.step()
        assert [oc.attempts for oc in opened] == [3] * 5
        wall[0] = 25.0
        d.journal._conn.set_trace_callback(statements.append)
        await publisher.step()
        d.journal._conn.set_trace_callback(None)
    assert publisher.stats.abandoned == 5 and d.journal.command_counts() == {"abandoned": 5}
    assert sum(s.startswith("BEGIN") for s in statements) == 1, statements
    d.journal.close()
