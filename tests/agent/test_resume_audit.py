"""Audit of what a restarted agent takes up from its journal (``agent.resume``; docs/agent.md, "Journal
and restarts"), on a real journal (SQLite in ``tmp_path``): the cycle count, the jobs it knew (queued
and running, in their phase), records it cannot read passed over, the restart records written again
after a failed write, and the open commands (those not expired sent again with their expiry and
attempts, the expired ones closed and never sent again). Each test kills mutants of ``agent.resume``
the tests in test_resume.py let live."""

from __future__ import annotations

import json
import logging
import sqlite3
import uuid
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import job, small_site

from agent import wire
from agent.config import ControlConfig
from agent.controller import Controller
from agent.journal import CALIBRATION_LAYOUT_KEY, CommandState, Journal, NewCommand
from agent.publish import CommandBook
from agent.resume import JobsRecord, RestartRecords, load_journal, open_commands_to_resume
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import Phase

pytestmark = pytest.mark.agent

NOW = 1000.0


def book_of(site: SiteSpec) -> CommandBook:
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    return CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))


def restart(path: Path, site: SiteSpec) -> tuple[Controller, TwinState, CommandBook]:
    controller, state, book = Controller(site), TwinState(site), book_of(site)
    journal = Journal(path)
    try:
        load_journal(journal, controller, state, book)
    finally:
        journal.close()
    return controller, state, book


def test_the_cycle_count_continues_from_the_last_decision(tmp_path: Path) -> None:
    """The cycle count continues: after decisions 40 and 41 (at site time 1,000 s) the next is 42."""
    site = small_site(2, (4, 4))
    journal = Journal(tmp_path / "journal.sqlite")
    journal.record_decision(40, NOW - 1.0, "enforce", "optimal", 0.01, {})
    journal.record_decision(41, NOW, "enforce", "optimal", 0.01, {})
    journal.close()
    controller, _, _ = restart(tmp_path / "journal.sqlite", site)
    assert controller.cycle == 42


def test_queued_and_running_jobs_are_taken_up_as_they_were(tmp_path: Path) -> None:
    """The jobs record holds the running jobs (spec, cards, phase) and the queued ones (spec): a
    restart knows job ``a`` running on cards 0-7 in its communication phase and job ``b`` queued."""
    site = small_site(2, (4, 4))
    state = TwinState(site)
    state.apply_events(
        [
            JobEvent(NOW, "a", "submitted", Phase.WAITING, job=job("a", 8)),
            JobEvent(NOW, "a", "started", Phase.COMPUTE, cards=tuple(range(8))),
            JobEvent(NOW, "a", "phase", Phase.COMMUNICATION),
            JobEvent(NOW, "b", "submitted", Phase.WAITING, job=job("b", 4)),
        ]
    )
    journal = Journal(tmp_path / "journal.sqlite")
    JobsRecord(journal, site).save(state.snapshot())
    journal.close()
    _, restarted, _ = restart(tmp_path / "journal.sqlite", site)
    running = restarted.jobs["a"]
    assert running.state == "running" and running.cards == tuple(range(8)) and running.phase is Phase.COMMUNICATION
    assert [(q.job_id, q.state, q.n_cards) for q in restarted.queue()] == [("b", "queued", 4)]


def test_a_job_known_without_its_spec_is_left_out_and_the_others_are_taken_up(tmp_path: Path) -> None:
    """A job the state knows without its spec (a submission that named none) cannot be restored: the
    record leaves it out, running or queued, so that the jobs it does hold (``a`` running on cards
    0-7, ``b`` queued) are still taken up. Written with it, its ``"spec": null`` made the whole
    record unreadable and a restart knew no job at all."""
    site = small_site(2, (4, 4))
    state = TwinState(site)
    state.apply_events(
        [
            JobEvent(NOW, "a", "submitted", Phase.WAITING, job=job("a", 8)),
            JobEvent(NOW, "a", "started", Phase.COMPUTE, cards=tuple(range(8))),
            JobEvent(NOW, "x", "submitted", Phase.WAITING),  # no spec
            JobEvent(NOW, "x", "started", Phase.COMPUTE, cards=(8, 9)),
            JobEvent(NOW, "b", "submitted", Phase.WAITING, job=job("b", 4)),
            JobEvent(NOW, "y", "submitted", Phase.WAITING),  # no spec, queued
        ]
    )
    assert state.jobs["x"].state == "running" and state.jobs["x"].spec is None
    journal = Journal(tmp_path / "journal.sqlite")
    JobsRecord(journal, site).save(state.snapshot())
    journal.close()
    _, restarted, _ = restart(tmp_path / "journal.sqlite", site)
    assert {jid: (info.state, info.cards) for jid, info in restarted.jobs.items()} == {
        "a": ("running", tuple(range(8))),
        "b": ("queued", ()),
    }


@pytest.mark.parametrize(
    "jobs_text",
    ["{not json", '{"running": [{"spec": {"job_id": "a"}, "cards": [0], "phase": 1}], "queue": []}', "[1, 2]"],
    ids=["not JSON", "a spec without its fields", "not an object"],
)
def test_a_record_that_cannot_be_read_is_passed_over_and_the_others_are_taken_up(
    tmp_path: Path, jobs_text: str
) -> None:
    """A record that cannot be read is passed over: a hand-edited or truncated ``jobs`` entry does not
    stop the restart, and the ``card_failed`` marks and the cycle count are taken up all the same."""
    site = small_site(2, (4, 4))
    journal = Journal(tmp_path / "journal.sqlite")
    journal.record_decision(7, NOW, "enforce", "optimal", 0.01, {})
    journal.set_meta("jobs", jobs_text)
    journal.set_meta("failed_cards", json.dumps({"site": {"racks": 2, "cards_per_rack": 16}, "marks": {"20": NOW}}))
    journal.close()
    controller, state, book = restart(tmp_path / "journal.sqlite", site)
    assert state.jobs == {} and controller.cycle == 8
    shown = np.asarray(state.snapshot().card_last_seen_s, dtype=np.float64)
    assert book.overlays.failed_marks(shown) == {20: NOW}


def test_a_calibration_whose_layout_cannot_be_read_is_not_taken_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The calibration's rows are site-wide card numbers: with a layout that cannot be read the site
    they were made on is not known to be this one, so they are passed over (with the warning), and
    the "journal opened" line counts no calibrated card."""
    site = small_site(2, (4, 4))
    journal = Journal(tmp_path / "journal.sqlite")
    journal.save_calibration(np.arange(4, dtype=np.int64), np.full(4, 0.05), np.ones(4), NOW)
    journal.set_meta(CALIBRATION_LAYOUT_KEY, "2 racks of 16")
    journal.close()
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    controller, _, _ = restart(tmp_path / "journal.sqlite", site)
    assert controller.calibration()[0].tolist() == []
    assert any("'calibration' not taken up" in r.getMessage() for r in caplog.records)
    (opened,) = [r for r in caplog.records if r.getMessage() == "journal opened"]
    assert opened.__dict__["fields"]["calibrated_cards"] == 0  # logged with extra={"fields": ...}


def test_the_restart_records_are_written_with_the_next_decision_after_a_failed_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the journal's write lock (a ``sqlite3`` shell inside a transaction): the
    jobs and ``card_failed`` marks are not saved, which is said (``error``, a warning naming both) and
    never raised; once the lock is gone the next save writes both (a record remembers only what it
    wrote), the error clears and the recovery is logged."""
    site = small_site(2, (4, 4))
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    records = RestartRecords(journal, site)
    state, book = TwinState(site), book_of(site)
    state.apply_events(
        [
            JobEvent(NOW, "a", "submitted", Phase.WAITING, job=job("a", 8)),
            JobEvent(NOW, "a", "started", Phase.COMPUTE, cards=tuple(range(8))),
        ]
    )
    book.overlays.restore_failed_marks({20: NOW})
    holder = sqlite3.connect(path, isolation_level=None)
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    try:
        holder.execute("BEGIN EXCLUSIVE")
        records.save(book, state.snapshot())  # never raises
        assert records.error is not None
        assert "jobs not saved" in records.error and "card_failed marks not saved" in records.error
        assert any(r.levelno == logging.WARNING and "journal write failed" in r.getMessage() for r in caplog.records)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert journal.get_meta("jobs") is None and journal.get_meta("failed_cards") is None
    records.save(book, state.snapshot())  # the same jobs and marks: written now
    assert records.error is None
    assert any("journal written again" in r.getMessage() for r in caplog.records)
    assert json.loads(journal.get_meta("jobs") or "{}")["running"][0]["cards"] == list(range(8))
    assert json.loads(journal.get_meta("failed_cards") or "{}")["marks"] == {"20": NOW}
    journal.close()


def rack_command(codec: wire.Codec, level: int, issued_s: float, expires_s: float) -> NewCommand:
    cmd = wire.RackCommand(
        "r0", (level,), wire.CardSetting.dvfs(level), uuid.uuid4(), expires_s, issued_s, level, "agent"
    )
    out = codec.outgoing(cmd)
    return NewCommand(str(cmd.command_id), "r0", out.topic, out.payload, issued_s, expires_s)


def state_of(journal: Journal, command_id: str) -> CommandState:
    """The journaled state of a command the test wrote (``Journal.command`` is None for an unknown id)."""
    c = journal.command(command_id)
    assert c is not None, command_id
    return c.state


def test_open_commands_not_expired_are_sent_again_and_expired_ones_never(tmp_path: Path) -> None:
    """A restart at site time 1,000 s: of the commands the journal still has open, the one that
    expired at 990 s and the one that expires at 1,000 s (no longer valid then) are closed
    ``expired`` and never sent again; the two valid ones come back to be sent again, each with its own
    expiry and the attempts already made. Commands already answered stay as they are."""
    site = small_site(2, (4, 4))
    book = book_of(site)
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    old = rack_command(book.codec, 1, NOW - 40.0, NOW - 10.0)
    at_now = rack_command(book.codec, 2, NOW - 30.0, NOW)
    sent = rack_command(book.codec, 3, NOW - 5.0, NOW + 25.0)
    pending = rack_command(book.codec, 4, NOW - 1.0, NOW + 29.0)
    journal.record_decision(1, NOW - 40.0, "enforce", "optimal", 0.01, {}, [old])
    journal.record_decision(2, NOW - 30.0, "enforce", "optimal", 0.01, {}, [at_now])
    journal.record_decision(3, NOW - 5.0, "enforce", "optimal", 0.01, {}, [sent])
    journal.record_decision(4, NOW - 1.0, "enforce", "optimal", 0.01, {}, [pending])
    journal.mark_sent([old.command_id, sent.command_id])
    journal.mark_sent([sent.command_id])
    journal.close()

    journal = Journal(path)  # the restarted agent's
    try:
        opened, expired = open_commands_to_resume(journal, book, NOW)
        assert expired == 2
        assert [(c.command_id, c.expires_s, c.attempts) for c in opened] == [
            (sent.command_id, NOW + 25.0, 2),
            (pending.command_id, NOW + 29.0, 0),
        ]
        assert set(book.open) == {sent.command_id, pending.command_id}
        states = {cid: state_of(journal, cid) for cid in (old.command_id, at_now.command_id)}
        assert {str(s) for s in states.values()} == {"expired"}, states
        # a second restart finds nothing more to close and the same two to send
        again, expired_again = open_commands_to_resume(journal, book_of(site), NOW)
        assert expired_again == 0 and [c.command_id for c in again] == [sent.command_id, pending.command_id]
    finally:
        journal.close()
