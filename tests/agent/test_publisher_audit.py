"""The Publisher's contract (``agent.publish``, ``agent.publisher``) where no other test held it.

A mutation audit of ``agent/publisher.py`` found behaviours that users rely on and that a changed
line did not make any test fail: retries counted from the last send (from when the client gave up
waiting for a PUBACK, too) and at most ``command_retries`` of them (then the command is closed
``abandoned``), every open command sent again once after a reconnect, commands that could not be
sent (the broker away, a connection ended under a batch, a publish refused) kept in order, not
journaled sent, tried once per step, and never sent once they expired or were superseded, a resumed
command sent once, a batch marked sent in one transaction, journal errors logged once and all
cleared by a batch marked sent, warnings about missing acks per target and counting those since the
last one, a step waiting for the one in progress, ``on_unconfirmed`` called. Each test drives a
Publisher against a real mosquitto, as ``test_publisher_mqtt`` does."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_helpers import example_site
from mqtt_testing import PubackDroppingProxy, fast_reconnects, wait_for

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus, BusError, BusNotConnected, Incoming, MqttOptions
from agent.clock import SiteClock
from agent.config import ControlConfig
from agent.journal import Journal
from agent.publish import CommandBook, OpenCommand, Publisher, new_commands
from agent.resume import open_commands_to_resume

pytestmark = pytest.mark.agent

TS = 1_790_000_000.0


@dataclasses.dataclass
class Desk:
    """What a Publisher works with: the example site's codec and command book (a 30 s command life,
    2 retries: one every 10 s), a site clock at TS and a journal in a temporary folder."""

    codec: wire.Codec
    control: ControlConfig
    book: CommandBook
    clock: SiteClock
    journal: Journal
    cycle: int = 0

    def issue(
        self, rack: str, cards: tuple[int, ...], level: int, ts: float = TS, life_s: float = 30.0, attempts: int = 0
    ) -> OpenCommand:
        """One DVFS command for ``cards`` of ``rack`` issued at ``ts``, open in the book and journaled
        with its decision (``attempts``: sends journaled by an earlier run)."""
        self.cycle += 1
        cmd = wire.RackCommand(
            rack, cards, wire.CardSetting.dvfs(level), uuid.uuid4(), ts + life_s, ts, self.cycle, "agent"
        )
        out = self.codec.outgoing(cmd)
        (oc,) = self.book.resume([(str(cmd.command_id), rack, out.topic, out.payload, ts, ts + life_s, attempts)])
        self.journal.record_decision(self.cycle, ts, "enforce", "optimal", 0.0, {}, new_commands([oc]))
        return oc

    def at(self, dt: float) -> None:
        self.clock.observe(TS + dt)


def desk(tmp_path: Path) -> Desk:
    site = example_site()
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    control = ControlConfig()
    clock = SiteClock(1.0, ahead_tolerance_s=3600.0)  # the tests move site time on by one message far ahead
    clock.observe(TS)
    return Desk(codec, control, CommandBook(site, codec, control), clock, Journal(tmp_path / "journal.sqlite"))


@dataclass
class Watch:
    """The rack commands on the wire, as a rack sees them (``received``); :meth:`flush` after the last send."""

    codec: wire.Codec
    received: list[Incoming] = field(default_factory=list)
    flushed: bool = False

    async def flush(self, bus: Bus) -> None:
        """A marker published on ``bus`` (the publisher's, after its last send), waited for: the broker
        passes one client's messages on in order, so every command sent before it is in ``received``."""
        marker = f"marker {uuid.uuid4()}".encode()
        await bus.publish(self.codec.topics.rack_cmd("r0"), marker, qos=1)  # QoS 1: queued behind the commands
        await wait_for("the marker", lambda: any(m.payload == marker for m in self.received), 10)
        self.received[:] = [m for m in self.received if m.payload != marker]
        self.flushed = True


@asynccontextmanager
async def watching(options: MqttOptions, codec: wire.Codec) -> AsyncIterator[Watch]:
    """A :class:`Watch` of the rack command topics; the test calls :meth:`Watch.flush` at its end."""
    watch = Watch(codec)
    watcher = Bus(options, subscriptions=[codec.topics.filter(wire.Kind.RACK_CMD)], name="watcher")

    async def collect() -> None:
        async for m in watcher.messages():
            watch.received.append(m)

    async with watcher:
        await watcher.wait_connected(10)
        task = asyncio.create_task(collect())
        try:
            yield watch
            assert watch.flushed, "flush(bus) after the last send: a command on its way would be missed"
        finally:
            task.cancel()


async def test_a_command_is_sent_again_a_retry_interval_after_its_last_send_and_no_sooner(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """Unacknowledged, a command goes out again ``command_ttl_s / (command_retries + 1)`` (10 s)
    after it was last sent: at TS, TS + 10.5 and TS + 21, not at TS + 15 (which is 10 s after its
    issue, not after its last send); ``on_sent`` says which sends are retries."""
    d = desk(tmp_path)
    sent: list[bool] = []
    async with watching(mosquitto.options(), d.codec) as watch, Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, on_sent=lambda oc, retry: sent.append(retry))
        assert publisher.retry_after_s == 10.0
        oc = d.issue("r0", (0,), 3)
        publisher.submit([oc])
        attempts = []
        for t in (0.0, 9.5, 10.5, 15.0, 20.0, 21.0, 25.0):
            d.at(t)
            await publisher.step()
            attempts.append(oc.attempts)
        await watch.flush(bus)
    assert attempts == [1, 1, 2, 2, 2, 3, 3]
    assert sent == [False, True, True] and publisher.stats.retried == 2 and publisher.stats.sent == 3
    assert [m.payload for m in watch.received] == [oc.payload] * 3
    row = d.journal.command(oc.command_id)
    assert row is not None and row.state == "sent" and row.attempts == 3
    d.journal.close()


async def test_a_command_that_outlives_its_retries_is_abandoned_after_command_retries_retries(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A command living longer than the retries cover (60 s: journaled by a run with a longer
    ``command_ttl_s``) goes out once and ``command_retries`` (2) times more; when the next retry
    would be due it is closed ``abandoned``: counted, reported, journaled, out of the book and its
    overlay released (the next decision may command the card again), never sent again."""
    d = desk(tmp_path)
    closed: list[str] = []
    async with watching(mosquitto.options(), d.codec) as watch, Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, on_closed=lambda oc, why: closed.append(why))
        oc = d.issue("r1", (4, 5), 2, life_s=60.0)
        publisher.submit([oc])
        for t in (0.0, 10.5, 21.0):
            d.at(t)
            await publisher.step()
        assert oc.attempts == 3 and closed == []
        d.at(31.5)  # the third retry would be due
        await publisher.step()
        assert closed == ["abandoned"] and publisher.stats.abandoned == 1
        assert oc.command_id not in d.book.open
        reported = np.full(d.book.site.n_cards, -1.0)
        have = d.book.overlays.have(oc.kind, reported, TS + 31.5)
        assert (have[oc.cards] == -1.0).all()  # what the racks report counts again
        d.at(45.0)
        await publisher.step()
        await watch.flush(bus)
    assert [m.payload for m in watch.received] == [oc.payload] * 3
    assert publisher.stats.sent == 3 and publisher.acks_missing == {"r1": 1}
    row = d.journal.command(oc.command_id)
    assert row is not None and row.state == "abandoned" and row.attempts == 3
    d.journal.close()


async def test_after_a_reconnect_every_open_command_is_sent_again_once(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A broker restarted without persistence forgets what it had not delivered: after the reconnect
    every open command goes out again at the next step, before its retry interval and also one whose
    retries ran out; once, not at every step after. A command whose retries ran out is abandoned at
    its next retry interval."""
    d = desk(tmp_path)
    connects: list[int] = []
    holder: list[Publisher] = []

    async def on_connect(bus: Bus) -> None:  # as the service does
        connects.append(1)
        if holder:
            holder[0].reconnected()

    closed: list[tuple[str, str]] = []
    async with Bus(fast_reconnects(mosquitto.options()), name="agent", on_connect=on_connect) as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus, d.book, d.journal, d.clock, d.control, on_closed=lambda oc, why: closed.append((oc.command_id, why))
        )
        holder.append(publisher)
        old = d.issue("r0", (0,), 1, life_s=60.0)  # sent at TS, TS + 10.5, TS + 21: its retries ran out
        publisher.submit([old])
        for t in (0.0, 10.5, 21.0):
            d.at(t)
            await publisher.step()
        new = d.issue("r1", (0,), 1, ts=TS + 21.0)  # sent once at TS + 21
        publisher.submit([new])
        await publisher.step()
        assert (old.attempts, new.attempts) == (3, 1)
        d.at(25.0)
        await asyncio.to_thread(mosquitto.restart)
        await wait_for("the reconnect", lambda: len(connects) >= 2 and bus.connected)
        d.at(25.5)
        await publisher.step()
        assert (old.attempts, new.attempts) == (4, 2) and closed == []
        d.at(26.0)
        await publisher.step()
        assert (old.attempts, new.attempts) == (4, 2)  # once
        d.at(36.0)  # 10 s after the re-sends: the old one abandoned, the new one retried
        await publisher.step()
    assert closed == [(old.command_id, "abandoned")]
    assert new.attempts == 3 and publisher.stats.sent == 7
    d.journal.close()


async def test_commands_that_cannot_be_sent_wait_in_order_unjournaled_until_the_broker_is_back(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The broker away: a step sends nothing, counts a wait and returns; the commands stay queued in
    the order decided and ``pending`` in the journal (marked sent only once the broker acknowledged
    them); when the broker is back the next step sends them all, in that order."""
    d = desk(tmp_path)
    async with Bus(fast_reconnects(mosquitto.options()), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        n = publisher.max_in_flight + 3  # more than one batch
        opened = [d.issue(f"r{k % 8}", (k // 8,), k % 8) for k in range(n)]
        await asyncio.to_thread(mosquitto.stop, keep_files=True)
        await wait_for("the lost connection", lambda: not bus.connected)
        publisher.submit(opened)
        async with asyncio.timeout(5):
            await publisher.step()
        assert publisher.stats.sent == 0 and publisher.stats.not_connected_waits == 1
        assert publisher.backlog() == n and d.journal.command_counts() == {"pending": n}
        await asyncio.to_thread(mosquitto.start)
        await wait_for("the reconnect", lambda: bus.connected)
        async with watching(mosquitto.options(), d.codec) as watch:
            d.at(1.0)
            await publisher.step()
            await watch.flush(bus)
    assert publisher.stats.sent == n and publisher.backlog() == 0
    index = {oc.payload: k for k, oc in enumerate(opened)}
    assert [index[m.payload] for m in watch.received] == list(range(n))
    assert d.journal.command_counts() == {"sent": n}
    d.journal.close()


async def test_a_send_that_fails_within_a_batch_is_not_journaled_sent_and_goes_first_at_the_next_step(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The connection ends under a batch: the broker acknowledged some of its commands, not two of
    them. Only those acknowledged are marked sent (the two stay ``pending``, as they are on no
    broker); the next step sends the two first, in their order, then the commands behind them."""
    d = desk(tmp_path)
    async with watching(mosquitto.options(), d.codec) as watch, Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        n = publisher.max_in_flight + 2
        opened = [d.issue(f"r{k % 8}", (k // 8,), k % 8) for k in range(n)]
        lost = {opened[1].payload, opened[3].payload}
        real_publish = bus.publish

        async def connection_ends_under_two(topic: str, payload: bytes, **kw: Any) -> None:
            if payload in lost:
                raise BusNotConnected("agent: the connection ended before the PUBACK")
            await real_publish(topic, payload, **kw)

        bus.publish = connection_ends_under_two  # type: ignore[method-assign]  # test double
        publisher.submit(opened)
        async with asyncio.timeout(10):  # a hang guard: a step that retried the lost two would spin till they expire
            await publisher.step()
        assert publisher.stats.sent == publisher.max_in_flight - 2 and publisher.stats.not_connected_waits == 1
        states = {k: row.state for k in (1, 3) if (row := d.journal.command(opened[k].command_id))}
        assert states == {1: "pending", 3: "pending"}  # the two behind the batch are pending too
        assert d.journal.command_counts() == {"sent": n - 4, "pending": 4}
        bus.publish = real_publish  # type: ignore[method-assign]  # test double
        await publisher.step()
        await watch.flush(bus)
    assert publisher.stats.sent == n and d.journal.command_counts() == {"sent": n}
    index = {oc.payload: k for k, oc in enumerate(opened)}
    window = publisher.max_in_flight
    assert [index[m.payload] for m in watch.received] == [k for k in range(window) if k not in (1, 3)] + [
        1,
        3,
        *range(window, n),
    ]
    d.journal.close()


async def test_a_publish_that_fails_otherwise_ends_the_step_and_is_tried_again_at_the_next(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A publish that fails while the link is up (a ``BusError`` that is neither the link down nor a
    PUBACK timeout: the client refused it): the step tries each command of the batch once, logs one
    warning, journals nothing sent and returns; the commands wait, in order and ``pending``, for the
    next step, which sends them once publishing works again. A step that went on to the next batch
    instead would try the same commands again at once, without end (the event loop kept busy until
    they expired): the step is awaited under a bound far longer than it takes, so that such a step
    fails this test rather than hanging it, and the tries are counted."""
    d = desk(tmp_path)
    async with watching(mosquitto.options(), d.codec) as watch, Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        opened = [d.issue("r0", (k,), 2) for k in range(3)]
        real_publish = bus.publish
        tries: list[bytes] = []

        async def refused(topic: str, payload: bytes, **kw: Any) -> None:
            tries.append(payload)
            raise BusError(f"agent: publish to {topic!r} failed: refused by the client")

        bus.publish = refused  # type: ignore[method-assign]  # test double
        publisher.submit(opened)
        async with asyncio.timeout(10):  # a hang guard, not a timing: the step takes milliseconds
            await publisher.step()
        assert tries == [oc.payload for oc in opened]  # each tried once
        assert publisher.stats.sent == 0 and publisher.stats.not_connected_waits == 0
        assert publisher.backlog() == 3 and d.journal.command_counts() == {"pending": 3}
        warnings = [r.getMessage() for r in caplog.records if "not sent:" in r.getMessage()]
        assert warnings == [
            f"3 command(s), first to r0, not sent: agent: publish to {opened[0].topic!r} failed: refused by the client"
        ]
        bus.publish = real_publish  # type: ignore[method-assign]  # test double
        await publisher.step()
        await watch.flush(bus)
    assert publisher.stats.sent == 3 and d.journal.command_counts() == {"sent": 3}
    assert [m.payload for m in watch.received] == [oc.payload for oc in opened]
    d.journal.close()


async def test_commands_that_expire_or_are_superseded_while_the_broker_is_away_are_never_sent(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Queued while the broker is away: a command that expires meanwhile is closed ``unacked`` and a
    command a newer one supersedes is closed ``superseded``; neither goes out when the broker is back
    (the newer one does), and neither is an ack missing: they never went out."""
    d = desk(tmp_path)
    closed: list[tuple[str, str]] = []
    async with Bus(fast_reconnects(mosquitto.options()), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus,
            d.book,
            d.journal,
            d.clock,
            d.control,
            on_closed=lambda oc, why: closed.append((oc.command_id, why)),
            heard_since=lambda target, site_s: True,
        )
        expiring = d.issue("r0", (1,), 2)  # expires at TS + 30
        old = d.issue("r1", (1,), 0, ts=TS + 20.0)
        await asyncio.to_thread(mosquitto.stop, keep_files=True)
        await wait_for("the lost connection", lambda: not bus.connected)
        publisher.submit([expiring, old])
        d.at(20.0)
        await publisher.step()
        assert publisher.backlog() == 2 and publisher.stats.sent == 0
        d.at(31.0)
        new = d.issue("r1", (1,), 7, ts=TS + 31.0)  # the same card's level again: supersedes the old one
        publisher.submit([new])
        await asyncio.to_thread(mosquitto.start)
        await wait_for("the reconnect", lambda: bus.connected)
        async with watching(mosquitto.options(), d.codec) as watch:
            await publisher.step()
            await watch.flush(bus)
    assert [m.payload for m in watch.received] == [new.payload]
    assert sorted(closed) == sorted([(expiring.command_id, "unacked"), (old.command_id, "superseded")])
    assert publisher.acks_missing == {} and publisher.stats.acks_missing == 0
    assert not [r for r in caplog.records if r.getMessage().startswith("no ack from")]
    states = {c: row.state for c in (expiring.command_id, old.command_id) if (row := d.journal.command(c))}
    assert states == {expiring.command_id: "expired", old.command_id: "superseded"}
    d.journal.close()


async def test_a_retry_closed_after_its_batch_is_built_but_before_it_is_sent_does_not_go_out(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """Retries of two commands are taken into a batch; before their sends run (the event loop runs what
    was ready first: the ack path, a decision) one is acked and a newer command supersedes the other.
    Neither retry goes out, nor counts as sent or failed (the newer command does go out); before, both
    were published after their close, and the old level undid the newer one on a rack that applies
    what it gets."""
    d = desk(tmp_path)
    sent: list[tuple[str, bool]] = []
    async with watching(mosquitto.options(), d.codec) as watch, Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus, d.book, d.journal, d.clock, d.control, on_sent=lambda oc, retry: sent.append((oc.command_id, retry))
        )
        acked, old = d.issue("r0", (0,), 3), d.issue("r1", (0,), 3)
        publisher.submit([acked, old])
        await publisher.step()
        assert publisher.stats.sent == 2
        newer: list[OpenCommand] = []

        def closed_meanwhile() -> None:
            ack = wire.Acknowledgement("r0", uuid.UUID(acked.command_id), wire.AckResult.APPLIED, TS + 11.0, 0, "sim")
            assert d.book.on_ack(ack, TS + 11.0) is acked
            newer.append(d.issue("r1", (0,), 5, ts=TS + 11.0))  # the same card's level: supersedes the old one
            publisher.submit(newer)

        d.at(10.5)  # both retries due
        asyncio.get_running_loop().call_soon(closed_meanwhile)  # runs once the step has built the batch
        await publisher.step()
        await watch.flush(bus)
    assert newer and old.superseded_by == newer[0].command_id
    assert [m.payload for m in watch.received] == [acked.payload, old.payload, newer[0].payload]
    assert (acked.attempts, old.attempts) == (1, 1) and (publisher.stats.sent, publisher.stats.retried) == (3, 0)
    assert sent == [(acked.command_id, False), (old.command_id, False), (newer[0].command_id, False)]
    assert publisher.stats.not_connected_waits == 0 and publisher.backlog() == 0
    assert [row.attempts for oc in (acked, old) if (row := d.journal.command(oc.command_id))] == [1, 1]
    d.journal.close()


async def test_a_command_resumed_from_the_journal_goes_out_once(mosquitto: EmbeddedBroker, tmp_path: Path) -> None:
    """A restarted agent hands the publisher the journal's open commands, sent before by the run that
    ended (``attempts`` 1): each goes out once, as a retry (it is also due for one: it was never
    sent by this run), not twice."""
    d = desk(tmp_path)
    sent: list[bool] = []
    async with watching(mosquitto.options(), d.codec) as watch, Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, on_sent=lambda oc, retry: sent.append(retry))
        oc = d.issue("r2", (9,), 4, attempts=1)
        d.at(2.0)
        publisher.submit([oc])
        await publisher.step()
        await watch.flush(bus)
    assert [m.payload for m in watch.received] == [oc.payload]
    assert oc.attempts == 2 and sent == [True] and publisher.stats.sent == 1
    d.journal.close()


async def test_each_batch_is_marked_sent_in_one_journal_transaction(mosquitto: EmbeddedBroker, tmp_path: Path) -> None:
    """The sends of a batch (up to the client's in-flight window) are journaled in one transaction
    (``Journal.mark_sent``), not one per command: two batches and one command, three transactions."""
    d = desk(tmp_path)
    statements: list[str] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        n = 2 * publisher.max_in_flight + 1
        opened = [d.issue(f"r{k % 8}", (k // 8,), k % 8) for k in range(n)]
        publisher.submit(opened)
        d.journal.expire(TS)  # the journal's first expiry pass (it writes: it knows no expiry before it)
        d.journal._conn.set_trace_callback(statements.append)
        await publisher.step()
        d.journal._conn.set_trace_callback(None)
    assert publisher.stats.sent == n and d.journal.command_counts() == {"sent": n}
    assert sum(s.startswith("BEGIN") for s in statements) == 3
    d.journal.close()


async def test_journal_errors_are_logged_once_and_all_cleared_by_a_batch_marked_sent(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every publisher write refused (SQLite ``query_only``, as a full disk): each kind of write is
    logged once however many steps fail it, and kept in ``journal_errors``; the first batch marked
    sent once the journal takes writes again clears them all, ``superseded`` included (``/readyz``
    ready again)."""
    d = desk(tmp_path)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        publisher.journal_retry_s = 0.0  # every write tried
        old = d.issue("r0", (3,), 0)
        publisher.submit([old])
        await publisher.step()
        d.at(5.0)
        new = d.issue("r0", (3,), 6, ts=TS + 5.0)  # supersedes the old one
        other = d.issue("r1", (3,), 6, ts=TS + 5.0)
        d.journal._conn.execute("PRAGMA query_only = ON")
        publisher.submit([new])
        await publisher.step()
        d.at(6.0)
        publisher.submit([other])
        await publisher.step()  # marking a batch sent fails again
        assert publisher.stats.sent == 3 and set(publisher.journal_errors) == {"superseded", "sent"}
        d.journal._conn.execute("PRAGMA query_only = OFF")
        later = d.issue("r2", (3,), 6, ts=TS + 6.0)
        publisher.submit([later])
        await publisher.step()
    assert publisher.journal_errors == {}
    errors = [r.getMessage() for r in caplog.records if r.getMessage().startswith("journal write failed")]
    assert sorted(errors) == sorted(
        f"journal write failed: commands {what} not recorded" for what in ("superseded", "sent")
    ), errors
    d.journal.close()


async def test_missing_ack_warnings_are_per_target_and_count_the_commands_since_the_last_one(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Acks missing from r0 and r1 at once: a warning for each (the once-a-minute limit is per
    target). Two more of r0 within the interval: counted, no warning. One more after it: a warning
    for the three since the last one."""
    d = desk(tmp_path)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        publisher.ack_warning_interval_s = 2.0

        async def unanswered(targets: list[tuple[str, int]], t: float) -> None:
            d.at(t)
            publisher.submit([d.issue(r, (card,), 1, ts=TS + t) for r, card in targets])
            await publisher.step()
            d.at(t + 31.0)  # expired, no ack
            await publisher.step()

        await unanswered([("r0", 0), ("r1", 0)], 0.0)
        await unanswered([("r0", 1), ("r0", 2)], 40.0)
        warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no ack from")]
        assert len(warnings) == 2 and {w.split()[3] for w in warnings} == {"r0", "r1"}, warnings
        await asyncio.sleep(2.1)
        await unanswered([("r0", 3)], 80.0)
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no ack from r0")]
    assert len(warnings) == 2 and "for 3 command(s)" in warnings[1], warnings
    assert publisher.acks_missing == {"r0": 4, "r1": 1} and publisher.stats.acks_missing == 5
    d.journal.close()


async def test_a_step_returns_once_the_step_in_progress_has_sent_what_it_took(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A clean shutdown's step while the run loop's step waits for PUBACKs: it returns once those
    commands are sent, not at once because the queue is empty (the shutdown would close the link
    under them)."""
    d = desk(tmp_path)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        n = publisher.max_in_flight
        publisher.submit([d.issue(f"r{k % 8}", (k // 8,), k % 8) for k in range(n)])
        running = asyncio.create_task(publisher.step())
        await asyncio.sleep(0)  # the running step has taken the batch and awaits its PUBACKs
        assert publisher.backlog() == 0
        await publisher.step()
        assert publisher.stats.sent == n
        await running
    d.journal.close()


async def test_a_send_the_broker_does_not_acknowledge_is_reported_unconfirmed(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """No PUBACK within ``puback_timeout_s`` (a proxy drops them): the command counts as sent and
    ``on_unconfirmed`` reports it (the service's metric), with the error kept for ``/readyz``."""
    d = desk(tmp_path)
    unconfirmed: list[str] = []
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = dataclasses.replace(mosquitto.options(), port=proxy.port)
        async with Bus(options, name="agent") as bus:
            await bus.wait_connected(10)
            publisher = Publisher(
                bus, d.book, d.journal, d.clock, d.control, on_unconfirmed=lambda oc: unconfirmed.append(oc.command_id)
            )
            publisher.puback_timeout_s = 0.2
            oc = d.issue("r3", (0,), 5)
            publisher.submit([oc])
            await publisher.step()
    assert unconfirmed == [oc.command_id] and publisher.stats.unconfirmed == 1 and oc.attempts == 1
    assert "no PUBACK within 0.2 s" in publisher.last_unconfirmed_error
    d.journal.close()


async def test_a_send_unconfirmed_for_longer_than_the_retry_interval_is_not_published_again_at_once(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """At 20x site time a 0.6 s wait for a PUBACK that never comes is 12 site s, more than the retry
    interval (10 s): the retry interval counts from when the client gave up waiting (the client
    holds the message), so the next step does not publish it again at once (that only piled copies
    into the client)."""
    d = desk(tmp_path)
    d.clock = SiteClock(1 / 20, ahead_tolerance_s=3600.0)
    d.clock.observe(TS)
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = dataclasses.replace(mosquitto.options(), port=proxy.port)
        async with Bus(options, name="agent") as bus:
            await bus.wait_connected(10)
            publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
            publisher.puback_timeout_s = 0.6
            oc = d.issue("r4", (0,), 5)
            publisher.submit([oc])
            await publisher.step()
            assert oc.last_sent_s >= TS + 10.0  # site time went on while the client waited
            await publisher.step()
        assert proxy.publishes == 1
    assert oc.attempts == 1 and publisher.stats.sent == 1 and publisher.stats.retried == 0
    d.journal.close()


@pytest.mark.parametrize(("superseded_after_s", "missing"), [(1.0, False), (11.0, True)])
async def test_an_ack_is_missing_a_retry_interval_after_the_command_went_out_not_after_its_issue(
    mosquitto: EmbeddedBroker,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    superseded_after_s: float,
    missing: bool,
) -> None:
    """A command issued while the broker was away goes out when it is back, 15 s later, and the next
    decision supersedes it: 1 s after it went out its ack is not overdue (the retry interval: 10 s),
    11 s after it is. It used to count from the issue: every command that waited out a broker restart
    and was superseded before its ack came was reported as an ack missing, with a warning pointing at
    a broker ACL."""
    d = desk(tmp_path)
    async with Bus(fast_reconnects(mosquitto.options()), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control, heard_since=lambda target, site_s: True)
        await asyncio.to_thread(mosquitto.stop, keep_files=True)
        await wait_for("the lost connection", lambda: not bus.connected)
        old = d.issue("r5", (2,), 0)
        publisher.submit([old])
        await publisher.step()
        assert old.attempts == 0
        await asyncio.to_thread(mosquitto.start)
        await wait_for("the reconnect", lambda: bus.connected)
        d.at(15.0)
        await publisher.step()
        assert old.attempts == 1 and old.first_sent_s >= TS + 15.0
        d.at(15.0 + superseded_after_s)
        d.issue("r5", (2,), 1, ts=TS + 15.0 + superseded_after_s)  # the same card's level: supersedes it
        await publisher.step()
    assert publisher.stats.superseded == 1
    assert publisher.acks_missing == ({"r5": 1} if missing else {})
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no ack from r5")]
    assert len(warnings) == (1 if missing else 0), warnings
    d.journal.close()


@pytest.mark.parametrize("why", ["superseded", "abandoned"])
async def test_a_close_the_journal_could_not_take_is_written_later_and_a_restart_does_not_reopen_it(
    mosquitto: EmbeddedBroker, tmp_path: Path, why: str
) -> None:
    """A command closed ``superseded`` (a newer command for the same card) or ``abandoned`` (its
    retries used up) at a step whose journal writes fail: the step's expiry write fails first (a
    full disk), the close is then skipped (``journal_retry_s``). Once the journal takes writes again
    the next step records the close, and a restarted agent (``open_commands_to_resume``) re-opens
    only what is still open: never the closed command, which no rack is to apply. The plain expiry
    of the step is recorded too (the journal's next expiry pass). Before, the close was lost: the
    row stayed ``sent`` and a restart sent the closed command again."""
    d = desk(tmp_path)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, d.book, d.journal, d.clock, d.control)
        publisher.journal_retry_s = 0.3
        if why == "superseded":
            close_at, still_open = 5.0, 1  # the newer command
            old = d.issue("r0", (3,), 0)
            expiring = d.issue("r1", (2,), 1, life_s=close_at - 1.0)
            publisher.submit([old, expiring])
            await publisher.step()
            d.at(close_at)
            newer = d.issue("r0", (3,), 6, ts=TS + close_at)  # the same card's level: supersedes the old one
            publisher.submit([newer])
        else:
            close_at, still_open = 31.5, 0
            old = d.issue("r1", (4, 5), 2, life_s=60.0)  # outlives its retries (every 10 s, 2 of them)
            expiring = d.issue("r0", (1,), 1, life_s=close_at - 1.0)
            publisher.submit([old, expiring])
            for t in (0.0, 10.5, 21.0):
                d.at(t)
                await publisher.step()
            d.at(close_at)  # the third retry would be due: abandoned
        d.journal._conn.execute("PRAGMA query_only = ON")  # this step's writes fail (or are skipped)
        await publisher.step()
        d.journal._conn.execute("PRAGMA query_only = OFF")
        assert getattr(publisher.stats, why) == 1 and old.command_id not in d.book.open
        row = d.journal.command(old.command_id)
        assert row is not None and row.state == "sent"  # not closed yet
        await asyncio.sleep(publisher.journal_retry_s + 0.1)  # the journal is tried again from here on
        d.at(close_at + 1.0)
        await publisher.step()
    assert publisher.journal_errors == {}
    d.journal.close()
    journal = Journal(tmp_path / "journal.sqlite")  # the agent restarted
    book = CommandBook(d.book.site, d.codec, d.control)
    opened, _expired = open_commands_to_resume(journal, book, TS + close_at + 2.0)
    assert old.command_id not in {oc.command_id for oc in opened} and len(opened) == still_open
    states = {c: row.state for c in (old.command_id, expiring.command_id) if (row := journal.command(c))}
    assert states == {old.command_id: why, expiring.command_id: "expired"}
    journal.close()
