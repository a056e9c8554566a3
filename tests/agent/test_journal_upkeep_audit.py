"""The service's care of its journal (agent.journal_upkeep), on real SQLite files under tmp_path.

What users rely on (docs/agent.md, "Journal and restarts" and ``journal.keep_days``): history older
than ``keep_days`` (wall clock) is deleted once an hour, a first prune of a long history goes on a
second later until it is done, the newest decision always stays, 0 keeps everything, and a prune
that fails is logged and tried again (the service goes on); every 2 s the service checks that the
journal's path still names its file, logs a removal once and says so in ``/readyz`` until the file
is back; acks are written once per burst (every 1,000 in a burst that does not end), each exactly
once; acks whose write fails are kept (up to 100,000, the oldest go), tried again 2 s later or at
once when the agent stops, the failure logged once and ``/readyz`` saying why until a write works.

The module's clocks (``time.monotonic`` for its intervals, ``time.time`` for the age cut) are a
stand-in the test moves by hand; the journal, its files and its lock are real.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import journal_upkeep, wire
from agent.journal import Journal, NewCommand
from agent.journal_upkeep import JournalAcks, JournalUpkeep, knows_command

pytestmark = pytest.mark.agent

DAY_S = 86_400.0


class _Clock:
    """What the module reads as ``time``: a monotonic clock moved by hand and the wall clock shifted
    by ``ahead_s`` (history written now is ``ahead_s`` old to the upkeep)."""

    def __init__(self) -> None:
        self.mono_s = 1000.0
        self.ahead_s = 0.0

    def monotonic(self) -> float:
        return self.mono_s

    def time(self) -> float:
        return time.time() + self.ahead_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(journal_upkeep, "time", c)
    return c


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite", lock=True)
    yield j
    j.close()


def _decisions(journal: Journal, n: int, *, command: str | None = None) -> None:
    for i in range(n):
        cmds = [NewCommand(command, "r1", "t", b"{}", 0.0, 1e9)] if command is not None and i == 0 else []
        journal.record_decision(i + 1, float(i), "enforce", "optimal", 0.01, {"i": i}, cmds)


def _held(path: str) -> sqlite3.Connection:
    """Another process's write lock on the journal (a ``sqlite3`` shell inside a transaction)."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def _acks(path: str) -> list[tuple[str, float, str, str | None]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT command_id, site_time_s, result, reason FROM acks ORDER BY id").fetchall()
    return [(str(c), float(t), str(r), reason) for c, t, r, reason in rows]


def _ack(command_id: str, ts_s: float, reason: str | None = None) -> wire.Acknowledgement:
    result = wire.AckResult.REJECTED if reason else wire.AckResult.APPLIED
    return wire.Acknowledgement("r1", uuid.UUID(command_id), result, ts_s, 0, "sim", reason)


# ---- pruning --------------------------------------------------------------------------------------------


def test_history_older_than_keep_days_goes_and_the_newest_decision_stays(journal: Journal, clock: _Clock) -> None:
    """keep_days is in days of wall clock: 23 h old history is kept at keep_days = 1, 25 h old goes
    (decisions and closed commands with their acks), except the newest decision."""
    cid = str(uuid.uuid4())
    _decisions(journal, 4, command=cid)
    journal.mark_sent([cid])
    journal.record_acks([(cid, 1.0, "applied", None)])
    clock.ahead_s = 23 * 3600.0
    upkeep = JournalUpkeep(journal, keep_days=1.0)
    upkeep.prune()
    assert journal.decision_count() == 4 and journal.command(cid) is not None
    clock.ahead_s, clock.mono_s = 25 * 3600.0, clock.mono_s + 3600.0
    upkeep.prune()
    last = journal.last_decision()
    assert journal.decision_count() == 1 and last is not None
    assert last[0] == 4  # the newest: the cycle count goes on
    assert journal.command(cid) is None and _acks(journal.path) == []


def test_keep_days_0_keeps_everything(journal: Journal, clock: _Clock) -> None:
    _decisions(journal, 3)
    clock.ahead_s = 365 * DAY_S
    upkeep = JournalUpkeep(journal, keep_days=0.0)
    for _ in range(3):
        upkeep.prune()
        clock.mono_s += 3600.0
    assert journal.decision_count() == 3


def test_an_open_command_and_its_decision_are_kept(journal: Journal, clock: _Clock) -> None:
    cid = str(uuid.uuid4())
    _decisions(journal, 3, command=cid)  # the first decision's command is still open (sent, unanswered)
    journal.mark_sent([cid])
    clock.ahead_s = 10 * DAY_S
    JournalUpkeep(journal, keep_days=1.0).prune()
    assert journal.decision_count() == 2  # the open command's decision and the newest
    assert knows_command(journal, cid)


def test_the_prune_runs_once_an_hour(journal: Journal, clock: _Clock) -> None:
    """The first prune at once (the service's start), the next an hour later: not a second before."""
    clock.ahead_s = 2 * DAY_S
    upkeep = JournalUpkeep(journal, keep_days=1.0)
    _decisions(journal, 2)
    upkeep.prune()
    assert journal.decision_count() == 1
    _decisions(journal, 2)
    clock.mono_s += 3599.0
    upkeep.prune()
    assert journal.decision_count() == 3
    clock.mono_s += 1.0
    upkeep.prune()
    assert journal.decision_count() == 1


def test_a_backlog_longer_than_one_batch_goes_on_a_second_later(journal: Journal, clock: _Clock) -> None:
    """A first prune of a long history deletes 5,000 decisions (a short pause of the event loop),
    the rest on the next health tick (1 s later), then waits an hour again."""
    with sqlite3.connect(journal.path) as db:
        db.executemany(
            "INSERT INTO decisions(cycle, site_time_s, wall_time_s, mode, status, solve_s, summary) "
            "VALUES (?, ?, ?, 'enforce', 'optimal', 0.01, '{}')",
            [(i, float(i), time.time() - 40 * DAY_S + i) for i in range(5_003)],
        )
    upkeep = JournalUpkeep(journal, keep_days=30.0)
    upkeep.prune()
    assert journal.decision_count() == 3
    clock.mono_s += 1.0
    upkeep.prune()
    assert journal.decision_count() == 1  # the newest stays
    _decisions(journal, 2)  # now two decisions old enough to go, two newer than the newest kept
    clock.ahead_s = 40 * DAY_S
    clock.mono_s += 1.0
    upkeep.prune()  # the backlog is done: the next prune waits an hour
    assert journal.decision_count() == 3


def test_a_backlog_goes_on_a_second_later_when_an_open_command_keeps_one_of_the_oldest(
    journal: Journal, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision kept for an open command does not slow a backlog down: it is passed over, and each
    full batch of decisions deleted is followed by the next a second later. Batches of 4 here: 10
    decisions 40 days old, the first with an open command; d2-d5 go, then d6-d9, then nothing is
    left that can go (d1 open, d10 the newest) and the prune waits an hour."""
    monkeypatch.setattr(journal_upkeep, "_JOURNAL_PRUNE_BATCH", 4)
    cid = str(uuid.uuid4())
    _decisions(journal, 10, command=cid)
    journal.mark_sent([cid])
    clock.ahead_s = 40 * DAY_S
    upkeep = JournalUpkeep(journal, keep_days=1.0)
    counts = []
    for _ in range(3):
        upkeep.prune()
        counts.append(journal.decision_count())
        clock.mono_s += 1.0
    assert counts == [6, 2, 2]  # d2-d5, then d6-d9 deleted; d1 (open command) and d10 (the newest) stay
    _decisions(journal, 2)  # two more decisions old enough to go: the last prune found none, they wait an hour
    upkeep.prune()
    assert journal.decision_count() == 4
    clock.mono_s += 3600.0
    upkeep.prune()
    assert journal.decision_count() == 2  # d1 and the newest
    assert knows_command(journal, cid)


def test_the_oldest_decisions_all_kept_for_open_commands_do_not_stop_the_prune(
    journal: Journal, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 2: decisions 1 and 2 have open commands (kept), 3 and 4 are as old and can go, 5 is
    the newest. Before, each hourly prune looked at decisions 1 and 2 only, kept both and deleted
    nothing, so while they stayed open the journal never shrank (a silent disk leak). Now 3 and 4 go
    at the first prune, and 1 and 2 once their commands are answered."""
    monkeypatch.setattr(journal_upkeep, "_JOURNAL_PRUNE_BATCH", 2)
    cids = [str(uuid.uuid4()) for _ in range(2)]
    for i, cid in enumerate(cids):
        cmd = NewCommand(cid, "r1", "t", b"{}", 0.0, 1e9)
        journal.record_decision(i + 1, float(i), "enforce", "optimal", 0.01, {}, [cmd])
    for cycle in (3, 4, 5):
        journal.record_decision(cycle, float(cycle), "enforce", "optimal", 0.01, {}, [])
    journal.mark_sent(cids)
    clock.ahead_s = 40 * DAY_S
    upkeep = JournalUpkeep(journal, keep_days=1.0)
    upkeep.prune()  # a full batch (3 and 4) deleted: the next prune a second later
    assert journal.decision_count() == 3
    clock.mono_s += 1.0
    upkeep.prune()  # nothing more can go: the next prune an hour later
    assert journal.decision_count() == 3
    journal.record_acks([(cid, 5.0, "applied", None) for cid in cids])  # now 1 and 2 can go
    clock.mono_s += 1.0
    upkeep.prune()  # not a second later
    assert journal.decision_count() == 3
    clock.mono_s += 3599.0
    upkeep.prune()  # an hour later
    assert journal.decision_count() == 1


def test_a_failed_prune_is_logged_and_tried_again_and_the_service_goes_on(
    journal: Journal, clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    _decisions(journal, 3)
    clock.ahead_s = 2 * DAY_S
    upkeep = JournalUpkeep(journal, keep_days=1.0)
    other = _held(journal.path)
    try:
        with caplog.at_level(logging.WARNING, logger="racktwin.agent"):
            upkeep.prune()  # does not raise: the health task goes on
    finally:
        other.rollback()
        other.close()
    assert any("journal prune failed" in r.getMessage() for r in caplog.records)
    assert journal.decision_count() == 3
    clock.mono_s += 3600.0
    upkeep.prune()
    assert journal.decision_count() == 1


# ---- the journal file ---------------------------------------------------------------------------------


def test_a_removed_journal_file_is_noticed_within_2_s_logged_once_and_its_return_too(
    journal: Journal, clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    upkeep = JournalUpkeep(journal, keep_days=30.0)
    with caplog.at_level(logging.INFO, logger="racktwin.agent"):
        upkeep.check_file()
        assert upkeep.file_problem is None
        os.rename(journal.path, journal.path + ".moved")
        for _ in range(3):  # three checks, 2 s apart, see it gone
            clock.mono_s += 2.0
            upkeep.check_file()
            assert upkeep.file_problem == (
                f"journal file {journal.path} was removed or replaced: decisions are not being kept"
            )
        os.rename(journal.path + ".moved", journal.path)
        clock.mono_s += 2.0
        upkeep.check_file()
        assert upkeep.file_problem is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "was removed" in r.getMessage()]
    assert len(errors) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == ["journal file is back"]


def test_a_replaced_journal_file_is_a_problem(journal: Journal, clock: _Clock) -> None:
    upkeep = JournalUpkeep(journal, keep_days=30.0)
    os.rename(journal.path, journal.path + ".old")
    Path(journal.path).write_bytes(b"")  # another file at its path
    upkeep.check_file()
    assert upkeep.file_problem is not None and "was removed or replaced" in upkeep.file_problem


# ---- acks -------------------------------------------------------------------------------------------------


def _one_command(journal: Journal) -> str:
    cid = str(uuid.uuid4())
    _decisions(journal, 1, command=cid)
    journal.mark_sent([cid])
    return cid


def test_acks_of_a_burst_are_written_once_each_with_their_time_result_and_reason(
    journal: Journal, clock: _Clock
) -> None:
    cid = _one_command(journal)
    acks = JournalAcks(journal)
    acks.add(_ack(cid, 12.5, "card_failed"))
    acks.add(_ack(cid, 13.0))
    assert _acks(journal.path) == []  # not before the burst is taken in
    acks.write()
    acks.write()  # nothing new: nothing written again
    assert _acks(journal.path) == [(cid, 12.5, "rejected", "card_failed"), (cid, 13.0, "applied", None)]
    assert acks.pending == [] and acks.error is None


def test_a_burst_that_does_not_end_is_written_every_1000_acks(journal: Journal, clock: _Clock) -> None:
    cid = _one_command(journal)
    acks = JournalAcks(journal)
    for i in range(999):
        acks.add(_ack(cid, float(i)))
    assert _acks(journal.path) == []
    acks.add(_ack(cid, 999.0))
    assert len(_acks(journal.path)) == 1000 and acks.pending == []


def test_acks_whose_write_fails_are_kept_retried_2_s_later_and_logged_once(
    journal: Journal, clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    cid = _one_command(journal)
    acks = JournalAcks(journal)
    other = _held(journal.path)
    with caplog.at_level(logging.INFO, logger="racktwin.agent"):
        try:
            acks.add(_ack(cid, 1.0))
            acks.write()
            assert acks.error is not None  # /readyz: journal (acks): ...
            acks.add(_ack(cid, 2.0))
            clock.mono_s += 2.0
            acks.write()  # fails again: not logged again
            assert acks.error is not None
        finally:
            other.rollback()
            other.close()
        acks.add(_ack(cid, 3.0))
        clock.mono_s += 1.9
        acks.write()  # the journal is free again, but the retry is 2 s after the last failure
        assert _acks(journal.path) == [] and acks.error is not None
        clock.mono_s += 0.1
        acks.write()
    assert [t for _c, t, _r, _why in _acks(journal.path)] == [1.0, 2.0, 3.0]
    assert acks.error is None and acks.pending == []
    failed = [r for r in caplog.records if r.levelno == logging.ERROR and "acks not recorded" in r.getMessage()]
    assert len(failed) == 1
    assert any(r.getMessage() == "journal written again: acks recorded" for r in caplog.records)


def test_at_shutdown_kept_acks_are_written_at_once(journal: Journal, clock: _Clock) -> None:
    cid = _one_command(journal)
    acks = JournalAcks(journal)
    other = _held(journal.path)
    try:
        acks.add(_ack(cid, 1.0))
        acks.write()
    finally:
        other.rollback()
        other.close()
    acks.write(now_or_never=True)  # within the 2 s: the agent is stopping
    assert [t for _c, t, _r, _why in _acks(journal.path)] == [1.0]


def test_no_acks_no_write_a_locked_journal_does_not_make_the_agent_unready(journal: Journal, clock: _Clock) -> None:
    acks = JournalAcks(journal)
    other = _held(journal.path)
    try:
        acks.write()
    finally:
        other.rollback()
        other.close()
    assert acks.error is None


def test_at_most_100000_acks_are_kept_while_the_journal_fails_the_oldest_go(journal: Journal, clock: _Clock) -> None:
    cid = _one_command(journal)
    acks = JournalAcks(journal)
    other = _held(journal.path)
    try:
        for i in range(100_002):  # the flood writes at 1,000 fail; later ones wait for the retry
            acks.add(_ack(cid, float(i)))
        clock.mono_s += 2.0
        acks.write()  # fails again: 2 of them go
    finally:
        other.rollback()
        other.close()
    clock.mono_s += 2.0
    acks.write()
    times = [t for _c, t, _r, _why in _acks(journal.path)]
    assert len(times) == 100_000 and times[0] == 2.0 and times[-1] == 100_001.0


def test_knows_command(journal: Journal) -> None:
    cid = _one_command(journal)
    assert knows_command(journal, cid)
    assert not knows_command(journal, str(uuid.uuid4()))
    journal.close()
    assert not knows_command(journal, cid)  # the journal cannot be read: not known
