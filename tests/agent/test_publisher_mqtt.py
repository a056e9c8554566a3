"""The agent's Publisher against a real mosquitto: a decision's commands leave pipelined and in order.

What users rely on: at accelerated site time (30x: a 30 s command lifetime is one wall second) a
decision with a hundred commands must not wait one broker round trip per command, or the last ones
expire in flight (the demo of 2026-11-29: 78 of 363 commands). Every command of a batch is handed to
the client before the first PUBACK is awaited; the broker delivers them in the order decided; the
journal marks them sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import example_site
from mqtt_testing import PubackDroppingProxy, wait_for

from agent import publisher as publisher_module
from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus, Incoming
from agent.clock import SiteClock
from agent.config import ControlConfig
from agent.journal import Journal
from agent.publish import CommandBook, OpenCommand, Publisher, new_commands

pytestmark = pytest.mark.agent

N_COMMANDS = 150
TS = 1_790_000_000.0


@dataclasses.dataclass
class Desk:
    """What a Publisher works with: the example site's codec and command book, a site clock at TS and
    a journal in a temporary folder."""

    codec: wire.Codec
    control: ControlConfig
    book: CommandBook
    clock: SiteClock
    journal: Journal

    def decide(self, n: int, cycle: int = 1, first_card: int = 0) -> list[OpenCommand]:
        """``n`` rack commands (a DVFS level each, over the racks in turn), journaled as decision ``cycle``."""
        racks = self.codec.layout.racks
        rows = []
        for k in range(n):
            rack = racks[k % len(racks)]
            card = first_card + k // len(racks)
            cmd = wire.RackCommand(rack, (card,), wire.CardSetting.dvfs(k % 8), uuid.uuid4(), TS + 30.0, TS, k, "agent")
            out = self.codec.outgoing(cmd)
            rows.append((str(cmd.command_id), rack, out.topic, out.payload, TS, TS + 30.0, 0))
        opened = self.book.resume(rows)
        self.journal.record_decision(cycle, TS, "enforce", "optimal", 0.0, {}, new_commands(opened))
        return opened


def desk(tmp_path: Path, *, still: bool = False) -> Desk:
    """``still``: the site clock's wall stands still, so site time is exactly the newest stamp observed
    (the tests that hold a bound to the instant)."""
    site = example_site()
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    control = ControlConfig()
    # the tests move site time on by one message far ahead
    clock = (
        SiteClock(1.0, infer=False, ahead_tolerance_s=3600.0, wall=lambda: 0.0)
        if still
        else SiteClock(1.0, ahead_tolerance_s=3600.0)
    )
    clock.observe(TS)
    return Desk(codec, control, CommandBook(site, codec, control), clock, Journal(tmp_path / "journal.sqlite"))


async def test_a_decisions_commands_are_pipelined_and_arrive_in_order(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    d = desk(tmp_path)
    codec, book, journal = d.codec, d.book, d.journal
    opened = d.decide(N_COMMANDS)

    received: list[Incoming] = []
    watcher = Bus(mosquitto.options(), subscriptions=[codec.topics.filter(wire.Kind.RACK_CMD)], name="watcher")
    watcher_task: asyncio.Task[None] | None = None

    async def collect() -> None:
        async for m in watcher.messages():
            received.append(m)

    events: list[tuple[str, int]] = []
    async with watcher, Bus(mosquitto.options(), name="agent") as bus:
        await watcher.wait_connected(10)
        await bus.wait_connected(10)
        watcher_task = asyncio.create_task(collect())
        real_publish = bus.publish
        index = {oc.payload: k for k, oc in enumerate(opened)}

        async def spy(topic: str, payload: bytes, **kw: Any) -> None:
            events.append(("start", index[payload]))
            await real_publish(topic, payload, **kw)
            events.append(("done", index[payload]))

        bus.publish = spy  # type: ignore[method-assign]  # test double
        publisher = Publisher(bus, book, journal, d.clock, d.control)
        publisher.submit(opened)
        await publisher.step()
        try:  # the test fails here, naming what did not arrive, rather than going on without it
            await wait_for(
                f"{N_COMMANDS} commands at the watcher",
                lambda: len(received) >= N_COMMANDS,
                found=lambda: f"{len(received)} arrived of the {publisher.stats.sent} sent",
            )
        finally:
            watcher_task.cancel()

    # pipelined: the first batch (the client's in-flight window) is all handed over before any PUBACK
    window = min(publisher.max_in_flight, N_COMMANDS)
    first_done = next(i for i, (what, _k) in enumerate(events) if what == "done")
    assert [k for what, k in events[:first_done]] == list(range(window))
    assert publisher.stats.sent == N_COMMANDS and publisher.backlog() == 0
    # in the order decided, on the wire
    assert [index[m.payload] for m in received] == list(range(N_COMMANDS))
    # journaled as sent (one transaction per batch)
    assert journal.command_counts() == {"sent": N_COMMANDS}
    journal.close()


async def test_a_journal_that_refuses_the_publishers_writes_does_not_stop_it(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """Sends and expiries that cannot be journaled (SQLite refuses every write: ``query_only``, as on
    a full disk) are kept in ``journal_errors``, never raised; they go when a write succeeds again,
    and the journal then records what happened meanwhile."""
    d = desk(tmp_path)
    book, clock, journal = d.book, d.clock, d.journal
    opened = d.decide(4)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, book, journal, clock, d.control)
        publisher.journal_retry_s = 0.0  # every write tried (by default not for 2 s after a failure)
        journal._conn.execute("PRAGMA query_only = ON")  # every write fails from here on
        publisher.submit(opened)
        await publisher.step()  # sent; marking them sent fails (and the step's expiry, with nothing to expire:
        assert publisher.stats.sent == 4  # query_only refuses every writing statement)
        assert set(publisher.journal_errors) == {"sent", "expired"}
        assert publisher.journal_errors["sent"].startswith(f"journal {journal.path}: attempt to write a readonly")
        clock.observe(TS + 31.0)  # unanswered, now past their expiry
        await publisher.step()
        assert set(publisher.journal_errors) == {"sent", "expired"}
        assert not book.open  # closed in memory all the same
        journal._conn.execute("PRAGMA query_only = OFF")
        await publisher.step()
    assert set(publisher.journal_errors) == {"sent"}  # no send since: that write has not been tried again
    assert journal.command_counts() == {"expired": 4}
    journal.close()


class _Monotonic:
    """What ``agent.publisher`` reads as ``time``: a monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.s = 1000.0

    def monotonic(self) -> float:
        return self.s


async def test_after_a_failed_journal_write_the_publisher_waits_before_writing_again(
    mosquitto: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each journal write may wait for SQLite's busy timeout on the event loop and a publisher step
    comes every 0.25 s: after a failure its writes are skipped for ``journal_retry_s``; the next
    batch marked sent clears every error (the journal takes writes again). The publisher's wall clock
    is the test's: a step late on a slow machine is still within (or past) the interval it says."""
    wall = _Monotonic()
    monkeypatch.setattr(publisher_module, "time", wall)  # not time.monotonic itself: the event loop reads it
    d = desk(tmp_path)
    journal = d.journal

    def decide(k: int) -> list[OpenCommand]:
        return d.decide(1, cycle=k, first_card=k)

    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, journal, d.clock, d.control)
        retry_s = publisher.journal_retry_s
        first = decide(1)
        journal._conn.execute("PRAGMA query_only = ON")
        publisher.submit(first)
        await publisher.step()  # the expiry write fails first; marking the batch sent is then not tried
        assert set(publisher.journal_errors) == {"expired"} and publisher.stats.sent == 1
        journal._conn.execute("PRAGMA query_only = OFF")
        second = decide(2)
        publisher.submit(second)
        wall.s += retry_s - 0.25  # the last step within journal_retry_s
        await publisher.step()  # not written although the journal takes writes
        assert journal.command_counts() == {"pending": 2}
        wall.s += 0.5  # past journal_retry_s (0.5 s of wall time before: a slower step got past it too)
        third = decide(3)
        publisher.submit(third)
        await publisher.step()
    assert publisher.journal_errors == {}
    assert journal.command_counts() == {"pending": 2, "sent": 1}  # the skipped marks are lost, as failed ones
    journal.close()


async def test_commands_the_broker_does_not_acknowledge_go_out_once_and_the_next_batch_follows(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A broker too overloaded to acknowledge (a proxy drops every PUBACK): each command is handed to
    the client once, counted sent and unconfirmed, and the batches behind it follow. A batch whose
    PUBACKs timed out used to go back to the front of the queue and be published again at every
    step (the client keeping every copy), and the commands behind it were never tried."""
    n = 250
    d = desk(tmp_path)
    journal = d.journal
    opened = d.decide(n)
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = dataclasses.replace(mosquitto.options(), port=proxy.port)
        async with Bus(options, name="agent") as bus:
            await bus.wait_connected(10)
            publisher = Publisher(bus, d.book, journal, d.clock, d.control)
            publisher.puback_timeout_s = 0.3
            publisher.submit(opened)
            await publisher.step()
            await publisher.step()  # nothing is due again before the retry interval
            assert publisher.max_in_flight < n  # more than one batch
            assert publisher.backlog() == 0
            assert publisher.stats.sent == n and publisher.stats.unconfirmed == n
            assert bus.stats.puback_timeouts == n
        # the bus closed: once the proxy has passed its end on, every PUBLISH it sent is counted (and the
        # window's PUBACKs, dropped)
        window = publisher.max_in_flight
        await wait_for("the client's end", lambda: proxy.clients_ended == 1 and proxy.pubacks_dropped >= window)
        # never a copy: the first window went on the wire, the client holds the rest until PUBACKs come
        assert proxy.publishes == publisher.max_in_flight == proxy.pubacks_dropped
    assert journal.command_counts() == {"sent": n}
    journal.close()


async def test_a_command_superseded_while_unacknowledged_is_never_sent_again(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Acks that never come (a broker ACL dropping a rack's acks, silently): the publisher re-sends
    a command not acknowledged within the retry interval, but never one that a newer command for the
    same cards has superseded: on a rack that applies what it gets, the re-send undid the newer
    command (an audit: "level 0" re-sent over "level 1", 16 cards at the top clock, the rack over its
    limit). The superseded command is closed (journaled and reported ``superseded``); acks
    missing for a retry interval are counted per rack and logged, once a minute at most."""
    d = desk(tmp_path)
    codec, book, journal, clock = d.codec, d.book, d.journal, d.clock

    def issue(level: int, ts: float, cycle: int) -> OpenCommand:
        cmd = wire.RackCommand(
            "r0", tuple(range(8, 16)), wire.CardSetting.dvfs(level), uuid.uuid4(), ts + 30.0, ts, cycle, "agent"
        )
        out = codec.outgoing(cmd)
        opened = book.resume([(str(cmd.command_id), "r0", out.topic, out.payload, ts, ts + 30.0, 0)])
        journal.record_decision(cycle, ts, "enforce", "optimal", 0.0, {}, new_commands(opened))
        return opened[0]

    received: list[Incoming] = []
    closed: list[tuple[str, str]] = []
    watcher = Bus(mosquitto.options(), subscriptions=[codec.topics.rack_cmd("r0")], name="watcher")

    async def collect() -> None:
        async for m in watcher.messages():
            received.append(m)

    async with watcher, Bus(mosquitto.options(), name="agent") as bus:
        await watcher.wait_connected(10)
        await bus.wait_connected(10)
        task = asyncio.create_task(collect())
        publisher = Publisher(
            bus, book, journal, clock, d.control, on_closed=lambda oc, why: closed.append((oc.command_id, why))
        )
        assert publisher.retry_after_s == 10.0  # 30 s, 2 retries
        old = issue(0, TS, 1)
        publisher.submit([old])
        await publisher.step()
        clock.observe(TS + 11.0)  # no ack: the old command is due again, and a newer one comes
        new = issue(1, TS + 11.0, 2)
        publisher.submit([new])
        await publisher.step()
        clock.observe(TS + 22.0)  # the newer one is due again
        await publisher.step()
        clock.observe(TS + 42.0)  # the newer one expires unacknowledged
        await publisher.step()
        # a marker behind every command sent (QoS 1, on the same connection): once it is in, they all are
        await bus.publish(codec.topics.rack_cmd("r0"), b"marker", qos=1)
        async with asyncio.timeout(10):
            while not any(m.payload == b"marker" for m in received):
                await asyncio.sleep(0.01)
        task.cancel()
    order = {old.payload: "old", new.payload: "new"}
    assert [order[m.payload] for m in received[:-1]] == ["old", "new", "new"] and received[-1].payload == b"marker"
    assert closed == [(old.command_id, "superseded"), (new.command_id, "unacked")]
    assert publisher.stats.superseded == 1 and publisher.stats.retried == 1
    old_row, new_row = journal.command(old.command_id), journal.command(new.command_id)
    assert old_row is not None and old_row.state == "superseded" and old_row.attempts == 1
    assert new_row is not None and new_row.state == "expired" and new_row.attempts == 2
    assert publisher.acks_missing == {"r0": 2} and publisher.stats.acks_missing == 2
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no ack from r0")]
    assert len(warnings) == 1 and "for 1 command(s)" in warnings[0], warnings
    journal.close()


@pytest.mark.parametrize("heard", [True, False])
async def test_a_missing_ack_is_reported_only_while_the_rack_is_heard_from(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture, heard: bool
) -> None:
    """A command to r0 sent, never acknowledged, expired. While r0's telemetry keeps coming
    (``heard_since``) its acks are lost on their way (a broker ACL?): counted and logged. A rack
    silent since the command went out (a simulator that ended, a rack cut off: stale telemetry and
    fail-safe caps say so) is no ack lost: the warning would point at an ACL for nothing (it did,
    at the end of every ``racktwin demo`` whose last decision came as the simulator stopped)."""
    d = desk(tmp_path)
    asked: list[tuple[str, float]] = []

    def heard_since(target: str, site_s: float) -> bool:
        asked.append((target, site_s))
        return heard

    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, heard_since=heard_since)
        (oc,) = d.decide(1)
        publisher.submit([oc])
        await publisher.step()
        assert oc.attempts == 1
        d.clock.observe(TS + 31.0)  # expired (at TS + 30), no ack
        await publisher.step()
    row = d.journal.command(oc.command_id)
    assert row is not None and row.state == "expired"
    assert asked == [(oc.target, oc.first_sent_s)] and oc.first_sent_s == oc.last_sent_s  # sent once
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"no ack from {oc.target}")]
    assert publisher.acks_missing == ({oc.target: 1} if heard else {})
    assert len(warnings) == (1 if heard else 0), warnings
    d.journal.close()


async def test_a_rack_heard_from_after_the_first_copy_but_not_after_the_last_is_reported(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A rack whose telemetry comes every 20 s (stamped TS + 15, TS + 35, ...) and whose acks a broker
    ACL drops: its command goes out at TS, TS + 10 and TS + 20 and expires at TS + 30. The rack was
    heard after the first copy, so it is an ack missing; it was not heard after the last copy (it
    was not reported, and with telemetry less often than the retries most missing acks were not)."""
    d = desk(tmp_path)
    stamps = [TS + 15.0, TS + 35.0]

    def heard_since(target: str, site_s: float) -> bool:
        now = d.clock.now()
        return now is not None and any(site_s < t <= now for t in stamps)

    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, heard_since=heard_since)
        (oc,) = d.decide(1)
        publisher.submit([oc])
        await publisher.step()
        for t in (10.5, 21.0):  # the retries (every 10 s: a 30 s life, 2 retries)
            d.clock.observe(TS + t)
            await publisher.step()
        assert oc.attempts == 3 and oc.last_sent_s > TS + 15.0
        d.clock.observe(TS + 31.0)  # expired, no ack
        await publisher.step()
    assert publisher.acks_missing == {oc.target: 1}
    d.journal.close()


async def test_a_command_superseded_within_its_retry_interval_is_no_ack_missing(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The next decision (5 s later) commands r0's card 0 again before the first command's ack could
    be overdue (the retry interval: 10 s): closed ``superseded``, it is not counted or logged as an
    ack missing, though the rack is heard from."""
    d = desk(tmp_path)
    closed: list[str] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus,
            d.book,
            d.journal,
            d.clock,
            d.control,
            on_closed=lambda oc, why: closed.append(why),
            heard_since=lambda target, site_s: True,
        )
        (old,) = d.decide(1)
        publisher.submit([old])
        await publisher.step()
        assert old.attempts == 1
        d.clock.observe(TS + 5.0)
        d.decide(1, cycle=2)  # the same card's level again: supersedes the first
        await publisher.step()
    assert closed == ["superseded"] and publisher.stats.superseded == 1
    assert publisher.acks_missing == {} and publisher.stats.acks_missing == 0
    assert not [r for r in caplog.records if r.getMessage().startswith("no ack from")]
    d.journal.close()


async def send_as_site_time_moves_to(
    mosquitto: EmbeddedBroker, d: Desk, site_s: float, behind: int
) -> tuple[Publisher, list[OpenCommand]]:
    """A decision of one batch (the client's in-flight window) and ``behind`` commands more, handed to
    a publisher's step while site time moves on to ``site_s`` as each command of the first batch is
    sent: the publisher and the commands, in the order decided."""
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        opened = d.decide(publisher.max_in_flight + behind)
        real_publish = bus.publish

        async def publish_then_time_passes(topic: str, payload: bytes, **kw: Any) -> None:
            await real_publish(topic, payload, **kw)
            d.clock.observe(site_s)

        bus.publish = publish_then_time_passes  # type: ignore[method-assign]  # test double
        publisher.submit(opened)
        await publisher.step()
    return publisher, opened


async def test_commands_that_expire_while_the_batches_ahead_of_them_are_sent_are_not_sent_late(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """At accelerated site time the clock may pass a command's expiry while the batches ahead of it
    wait for their PUBACKs: the first batch goes, the rest (expired at TS + 30) never leave (a rack
    would refuse them as expired, and one that applies what it gets would apply a stale plan)."""
    d = desk(tmp_path)
    publisher, opened = await send_as_site_time_moves_to(mosquitto, d, TS + 31.0, behind=5)
    window = publisher.max_in_flight
    assert publisher.stats.sent == window
    assert [oc.attempts for oc in opened] == [1] * window + [0] * 5
    d.journal.close()


async def test_a_command_is_not_sent_at_the_instant_it_expires(mosquitto: EmbeddedBroker, tmp_path: Path) -> None:
    """A rack takes a command received at or after its ``expires_at`` as expired (docs/protocol.md,
    "Expiry"): the site clock reaching a command's expiry exactly (TS + 30) while the batch ahead of
    it waits for its PUBACKs, it never leaves."""
    d = desk(tmp_path, still=True)
    publisher, opened = await send_as_site_time_moves_to(mosquitto, d, TS + 30.0, behind=3)
    window = publisher.max_in_flight
    assert d.clock.now() == TS + 30.0
    assert publisher.stats.sent == window
    assert [oc.attempts for oc in opened] == [1] * window + [0] * 3
    d.journal.close()


async def test_a_command_superseded_a_whole_retry_interval_after_it_went_out_is_an_ack_missing(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """An ack is overdue once a command went out a retry interval (10 s) before, the bound included
    (the warning says "sent 10 s or more before they closed"): the next decision supersedes r0's
    card 0 exactly 10 s after its command went out, unanswered though the rack is heard from."""
    d = desk(tmp_path, still=True)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, heard_since=lambda target, site_s: True)
        (old,) = d.decide(1)
        publisher.submit([old])
        await publisher.step()
        assert (old.attempts, old.first_sent_s, publisher.retry_after_s) == (1, TS, 10.0)
        d.clock.observe(TS + 10.0)
        d.decide(1, cycle=2)  # the same card's level again: supersedes the first
        await publisher.step()
    assert publisher.stats.superseded == 1
    assert publisher.acks_missing == {"r0": 1} and publisher.stats.acks_missing == 1
    d.journal.close()


async def test_steps_with_nothing_to_expire_write_nothing_to_the_journal(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A step comes every 0.25 s and used to open a journal transaction to expire commands each time,
    nothing expired or not: the write lock taken four times a second and, while another process held
    it (a sqlite3 shell), the event loop held up for the busy timeout (0.5 s) at every step and an
    error reported. Steps before any open command expires write nothing; the one after the expiry
    records it."""
    d = desk(tmp_path)
    journal = d.journal
    opened = d.decide(4)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, journal, d.clock, d.control)
        publisher.submit(opened)
        await publisher.step()  # sent (nobody acks them)
        assert publisher.stats.sent == 4 and journal.command_counts() == {"sent": 4}
        statements: list[str] = []
        journal._conn.set_trace_callback(statements.append)
        for k in range(1, 21):  # unanswered, before their retry interval and expiry (TS + 30)
            d.clock.observe(TS + 0.25 * k)
            await publisher.step()
        assert statements == []
        holder = sqlite3.connect(journal.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the journal's write lock
        await publisher.step()
        assert statements == [] and publisher.journal_errors == {}  # not even tried: nothing waited on the lock
        holder.execute("ROLLBACK")
        holder.close()
        d.clock.observe(TS + 31.0)
        await publisher.step()
    assert publisher.stats.unacked_expired == 4 and not d.book.open
    assert sum(s.startswith("BEGIN") for s in statements) == 1 and journal.command_counts() == {"expired": 4}
    journal.close()
