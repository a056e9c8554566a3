"""The publisher's journal writes that close commands, as the operator sees them (agent/publisher.py,
docs/agent.md "Journal").

* Each kind of write has its own entry in ``Publisher.journal_errors`` (``/readyz``, the log's
  ``journal write failed`` / ``journal written again`` lines): the journal's expiry pass (``expired``)
  and the close of commands the site clock left behind (``expired at a clock step back``) both mark
  rows ``expired`` but are not one write. Before, they shared the key ``expired``: the expiry pass,
  which writes nothing before the first open command's expiry and so "succeeds" on a full disk,
  logged "journal written again" and cleared the close's error at every retry while the close kept
  failing; and a close written cleared the expiry pass's error while that kept failing.
* Closes not journaled yet are counted per state (``Publisher.unjournaled_closes``) and named by
  ``/readyz`` until written; a shutdown writes them once more whatever ``journal_retry_s`` says and
  logs what it could not write (before, they were lost, and a restarted agent sent those commands
  again while valid, ``agent.resume``).

Journal writes fail for real: SQLite's ``query_only`` (every write refused, as on a full disk) or a
trigger that refuses one row's update; the publisher sends to a real mosquitto."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from agent_helpers import example_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus, MqttOptions
from agent.clock import SiteClock
from agent.config import load_config
from agent.journal import Journal
from agent.publish import CommandBook, OpenCommand, Publisher, new_commands
from agent.service import AgentService

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = 100_000.0
STEP_S = 760.0  # the site clock steps back this far (a simulator restarted)
LEFT_BEHIND = "expired at a clock step back"  # its key in journal_errors


def command(
    codec: wire.Codec, book: CommandBook, journal: Journal, cycle: int, ts: float, *, attempts: int = 0
) -> OpenCommand:
    """One DVFS command for card ``cycle`` of r0, issued at ``ts`` (30 s of life), open in ``book`` and
    journaled with decision ``cycle`` (``attempts``: sends journaled before)."""
    ttl_s = book.control.command_ttl_s
    msg = wire.RackCommand("r0", (cycle,), wire.CardSetting.dvfs(3), uuid.uuid4(), ts + ttl_s, ts, cycle, "agent")
    out = codec.outgoing(msg)
    (oc,) = book.resume([(str(msg.command_id), "r0", out.topic, out.payload, ts, ts + ttl_s, attempts)])
    journal.record_decision(cycle, ts, "enforce", "optimal", 0.0, {}, new_commands([oc]))
    return oc


def stepped_clock() -> tuple[SiteClock, list[float]]:
    """A site clock at NOW on a wall clock the test moves (``wall[0]``)."""
    wall = [0.0]
    clock = SiteClock(1.0, infer=False, ahead_tolerance_s=3600.0, wall=lambda: wall[0])
    clock.observe(NOW)
    return clock, wall


def step_back(clock: SiteClock, wall: list[float]) -> None:
    """Messages STEP_S behind the clock's timeline after a 2 s silence, for 1 s: the clock steps back."""
    wall[0] += 3.0
    clock.observe(NOW - STEP_S)
    wall[0] += 1.1
    clock.observe(NOW - STEP_S + 1.1)
    assert clock.corrections == 1


def state_of(journal: Journal, oc: OpenCommand) -> str:
    row = journal.command(oc.command_id)
    assert row is not None
    return str(row.state)


def messages(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]


async def test_a_failing_left_behind_close_stays_a_journal_error_while_the_expiry_pass_writes_nothing(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk after the site clock stepped back: the close of the command left behind fails at
    every step, and the journal's expiry pass writes nothing (no open command expires before NOW +
    30 s), so it does not fail. The close's error stays in ``journal_errors`` (``/readyz``), is
    logged once and said to be written again only once it is; before, each retry logged "journal
    written again: commands expired recorded" and the failure once more."""
    caplog.set_level(logging.INFO, logger="racktwin.agent.publish")
    site = example_site()
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, load_config(EXAMPLES / "agent.toml").config.control)
    clock, wall = stepped_clock()
    journal = Journal(tmp_path / "journal.sqlite")
    oc = command(codec, book, journal, 1, NOW)
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, book, journal, clock, book.control)
        publisher.journal_retry_s = 0.0  # every step tries every write
        publisher.submit([oc])
        await publisher.step()
        assert state_of(journal, oc) == "sent" and publisher.journal_errors == {}
        step_back(clock, wall)
        journal._conn.execute("PRAGMA query_only = ON")  # every write fails from here on
        for _ in range(4):
            await publisher.step()
            assert set(publisher.journal_errors) == {LEFT_BEHIND}
            assert publisher.unjournaled_closes() == {"expired": 1}
        assert not book.open and state_of(journal, oc) == "sent"
        assert messages(caplog, "journal written again") == []
        failed = messages(caplog, "journal write failed")
        assert failed == [f"journal write failed: commands {LEFT_BEHIND} not recorded"]
        journal._conn.execute("PRAGMA query_only = OFF")
        await publisher.step()
    assert state_of(journal, oc) == "expired"
    assert publisher.journal_errors == {} and publisher.unjournaled_closes() == {}
    assert messages(caplog, "journal written again") == [f"journal written again: commands {LEFT_BEHIND} recorded"]
    journal.close()


async def test_a_failing_expiry_pass_stays_a_journal_error_when_a_left_behind_close_is_written(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The journal refuses the expiry of one row (a trigger) and takes every other write. The expiry
    pass fails at every step; the close of a command the site clock left behind is written. The
    expiry pass's error stays in ``journal_errors``; before, the close written cleared it (one key,
    ``expired``, for both) and ``/readyz`` said ready while the expiry pass kept failing."""
    site = example_site()
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, load_config(EXAMPLES / "agent.toml").config.control)
    clock, wall = stepped_clock()
    journal = Journal(tmp_path / "journal.sqlite")
    oc = command(codec, book, journal, 1, NOW)
    # a command of an earlier decision, past its expiry on the timeline the clock steps back to
    # (in the journal only: its row is the expiry pass's to close)
    old = command(codec, CommandBook(site, codec, book.control), journal, 2, NOW - STEP_S - 100.0)
    journal._conn.execute(
        "CREATE TEMP TRIGGER refuse_old BEFORE UPDATE OF state ON commands "
        f"WHEN OLD.command_id = '{old.command_id}' BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(bus, book, journal, clock, book.control)
        publisher.journal_retry_s = 0.0
        publisher.submit([oc])
        await publisher.step()  # its expiry pass fails; the batch marked sent clears every error
        assert state_of(journal, oc) == "sent" and publisher.journal_errors == {}
        step_back(clock, wall)
        await publisher.step()  # the expiry pass fails again; the close of the one left behind is written
        assert state_of(journal, oc) == "expired" and state_of(journal, old) == "pending"
        assert set(publisher.journal_errors) == {"expired"}
        assert "database or disk is full" in publisher.journal_errors["expired"]
        assert publisher.unjournaled_closes() == {}
    journal.close()


def service_with_a_command(tmp_path: Path, retry_s: float) -> tuple[AgentService, OpenCommand]:
    """The service of examples/agent.toml (not run: no broker), its journal in ``tmp_path``, with one
    command journaled at NOW whose retries ran out (its next publisher step closes it ``abandoned``),
    every journal write refused (``query_only``) and the publisher's writes skipped ``retry_s`` after
    a failure."""
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    service = AgentService(loaded, mqtt=MqttOptions(port=1), http=False)
    retries = service.config.control.command_retries
    oc = command(service.codec, service.book, service.journal, 1, NOW, attempts=retries + 1)
    service.journal.mark_sent([oc.command_id])
    service.clock.observe(NOW)
    service.publisher.journal_retry_s = retry_s
    service.journal._conn.execute("PRAGMA query_only = ON")
    return service, oc


async def test_readyz_names_the_closes_not_journaled_until_they_are(tmp_path: Path) -> None:
    service, oc = service_with_a_command(tmp_path, retry_s=0.0)
    await service.publisher.step()  # closed abandoned; its write refused
    assert not service.book.open and state_of(service.journal, oc) == "sent"
    reasons = service.readiness()
    assert (
        "journal (commands closed): 1 close(s) not written yet (abandoned 1); "
        "a restart would send those commands again while valid"
    ) in reasons, reasons
    assert any(r.startswith("journal (commands abandoned): ") for r in reasons), reasons
    service.journal._conn.execute("PRAGMA query_only = OFF")
    await service.publisher.step()
    assert state_of(service.journal, oc) == "abandoned"
    assert not any(r.startswith("journal (commands") for r in service.readiness())
    await service._close()


async def test_a_shutdown_journals_the_closes_that_a_failed_write_left_pending(tmp_path: Path) -> None:
    """A write failed a moment ago and the publisher skips its writes for ``journal_retry_s``: the
    close stays pending. The journal takes writes again before the agent stops: the shutdown writes
    the close (before, it was lost: the row stayed ``sent`` and a restart sent the command again)."""
    service, oc = service_with_a_command(tmp_path, retry_s=3600.0)
    await service.publisher.step()  # a write fails: the publisher skips its writes (the close) for an hour
    assert service.publisher.unjournaled_closes() == {"abandoned": 1}
    service.journal._conn.execute("PRAGMA query_only = OFF")
    await service._close()
    journal = Journal(tmp_path / "j.sqlite")
    assert state_of(journal, oc) == "abandoned"
    journal.close()


async def test_a_shutdown_logs_the_closes_it_cannot_journal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service, oc = service_with_a_command(tmp_path, retry_s=0.0)
    await service.publisher.step()
    await service._close()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("stopping with")]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "stopping with 1 command close(s) not journaled (abandoned 1): a restart sends those commands again while valid"
    )
    assert record.__dict__["fields"] == {"closes": {"abandoned": 1}, "command_ids": [oc.command_id]}
    journal = Journal(tmp_path / "j.sqlite")
    assert state_of(journal, oc) == "sent"  # a restart sends it again while valid
    journal.close()


async def test_commands_dropped_on_standing_by_stay_pending_until_the_journal_takes_their_close(tmp_path: Path) -> None:
    """Another agent commands the site: this one closes its open commands ``abandoned``. A refused
    write keeps the closes with the publisher's (``/readyz`` names them) and the next step writes
    them (before, the failure was only logged: the rows stayed ``sent`` and a restarted agent sent
    the commands again while valid)."""
    service, oc = service_with_a_command(tmp_path, retry_s=0.0)
    service._drop_open_commands()
    assert not service.book.open and state_of(service.journal, oc) == "sent"
    assert service.publisher.unjournaled_closes() == {"abandoned": 1}
    assert any(r.startswith("journal (commands closed): 1 close(s)") for r in service.readiness())
    service.journal._conn.execute("PRAGMA query_only = OFF")
    await service.publisher.step()
    assert state_of(service.journal, oc) == "abandoned"
    assert service.publisher.unjournaled_closes() == {}
    await service._close()


async def test_commands_dropped_on_standing_by_are_journaled_closed_at_once(tmp_path: Path) -> None:
    """Standing by (another agent commands the site), the agent journals its open commands
    ``abandoned`` as it drops them, not at the publisher's next step: killed right after, a restarted
    agent finds them closed and does not send them again while valid (``agent.resume``)."""
    service, oc = service_with_a_command(tmp_path, retry_s=0.0)
    service.journal._conn.execute("PRAGMA query_only = OFF")  # the journal takes writes
    service._drop_open_commands()
    assert state_of(service.journal, oc) == "abandoned"
    assert service.publisher.unjournaled_closes() == {}
    await service._close()


async def test_a_defect_in_the_shutdowns_journal_writes_still_closes_the_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception in the shutdown's last journal writes is logged and the journal is
    still closed: its lock is released, so another agent (or a restart in the same process, as the
    demo's) can open it (before, the exception skipped ``Journal.close``)."""
    service, _ = service_with_a_command(tmp_path, retry_s=0.0)
    service.journal._conn.execute("PRAGMA query_only = OFF")

    def broken() -> dict[str, list[str]]:
        raise RuntimeError("a defect")

    monkeypatch.setattr(service.publisher, "journal_closes_now", broken)
    await service._close()
    assert any(r.getMessage() == "journal not brought up to date at shutdown" for r in caplog.records)
    Journal(tmp_path / "j.sqlite", lock=True).close()  # the lock is free (flock: another descriptor would wait)
