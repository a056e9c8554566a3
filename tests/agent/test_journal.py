"""The journal: decisions and commands are durable, acks close commands, expired ones never return."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from agent.journal import CommandState, Journal, JournalError, JournalInUseError, NewCommand, prune_candidates_sql

pytestmark = pytest.mark.agent


def cmd(cid: str, issued: float, ttl: float = 30.0) -> NewCommand:
    return NewCommand(cid, "r0", "racktwin/v1/s/r0/cmd", b'{"x":1}', issued, issued + ttl)


def state_of(j: Journal, command_id: str) -> CommandState:
    """The journaled state of a command the test wrote (``Journal.command`` is None for an unknown id)."""
    c = j.command(command_id)
    assert c is not None, command_id
    return c.state


def test_commands_survive_reopen_and_expired_ones_are_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.record_decision(1, 100.0, "enforce", "optimal", 0.05, {"levels": [0, 1]}, [cmd("a", 100.0), cmd("b", 100.0, 5)])
    j.mark_sent(["a", "b"])
    j.close()  # the agent dies here

    j2 = Journal(path)
    assert j2.last_decision() == (1, 100.0, {"levels": [0, 1]})
    assert j2.expire(110.0) == 1  # b expired at 105
    resumable = j2.unacked(110.0)
    assert [c.command_id for c in resumable] == ["a"]
    assert resumable[0].state is CommandState.SENT and resumable[0].attempts == 1
    b = j2.command("b")
    assert b is not None and b.state is CommandState.EXPIRED


def test_acks_close_commands_and_unknown_ids_are_reported(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    j.record_decision(1, 0.0, "enforce", "optimal", 0.0, {}, [cmd("a", 0.0), cmd("b", 0.0)])
    assert j.record_ack("a", 1.0, "applied")
    assert j.record_ack("b", 1.0, "rejected", "level out of range")
    assert not j.record_ack("zzz", 1.0, "applied")
    assert j.command_counts() == {"applied": 1, "rejected": 1}
    assert j.unacked(2.0) == []
    with pytest.raises(ValueError):
        j.record_ack("a", 1.0, "maybe")


def test_a_later_ack_does_not_undo_what_a_rack_answered_and_every_ack_is_kept(tmp_path: Path) -> None:
    # a copy sent again (or an ack the broker delivered twice) brings a second ack for one command
    j = Journal(tmp_path / "j.sqlite")
    j.record_decision(1, 0.0, "enforce", "optimal", 0.0, {}, [cmd("a", 0.0), cmd("b", 0.0), cmd("c", 0.0, 5)])
    j.mark_sent(["a", "b", "c"])
    assert j.record_acks([("a", 1.0, "applied", None), ("a", 40.0, "expired", None)]) == [True, True]
    assert j.record_acks([("b", 1.0, "rejected", "busy"), ("b", 2.0, "applied", "duplicate: ...")]) == [True, True]
    # an agent-side expiry is not a rack's answer: a late ack says what the rack did
    assert j.expire(10.0) == 1
    assert j.record_ack("c", 11.0, "applied")
    assert j.command_counts() == {"applied": 2, "rejected": 1}
    assert {c: state_of(j, c) for c in "abc"} == {
        "a": CommandState.APPLIED,
        "b": CommandState.REJECTED,
        "c": CommandState.APPLIED,
    }
    j.close()
    db = sqlite3.connect(tmp_path / "j.sqlite")
    assert db.execute("SELECT command_id, result FROM acks ORDER BY id").fetchall() == [
        ("a", "applied"),
        ("a", "expired"),
        ("b", "rejected"),
        ("b", "applied"),
        ("c", "applied"),
    ]
    db.close()


def test_failed_transaction_writes_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    with pytest.raises(JournalError):
        # duplicate command id inside one decision: the whole decision is rolled back
        j.record_decision(1, 0.0, "enforce", "optimal", 0.0, {}, [cmd("a", 0.0), cmd("a", 0.0)])
    assert j.decision_count() == 0 and j.command_counts() == {}


def test_calibration_round_trip(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    cards = np.array([3, 1, 2])
    j.save_calibration(cards, np.array([0.05, 0.06, 0.07]), np.array([1.0, 1.1, 0.9]), 10.0)
    c, r, k = j.load_calibration()
    assert c.tolist() == [1, 2, 3]
    assert r.tolist() == [0.06, 0.07, 0.05] and k.tolist() == [1.1, 0.9, 1.0]


def test_wal_mode_and_schema_version_guard(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    assert j._db is not None
    assert j._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    j.set_meta("schema_version", "999")
    j.close()
    with pytest.raises(JournalError, match="schema version 999"):
        Journal(path)


def test_a_journal_refused_at_open_does_not_keep_its_lock(tmp_path: Path) -> None:
    """The service takes the lock before it reads the schema version: a journal it refuses (written by
    another schema) must not stay locked by the refused open, so that the same process can open the
    journal again once it is put right, and no other agent is told it is in use."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.set_meta("schema_version", "999")
    j.close()
    with pytest.raises(JournalError, match="schema version 999"):
        Journal(path, lock=True)
    fixer = sqlite3.connect(path)
    fixer.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    fixer.commit()
    fixer.close()
    Journal(path, lock=True).close()  # not JournalInUseError (pid of this very process)


def test_prune_deletes_old_closed_history_and_keeps_what_a_restart_needs(tmp_path: Path) -> None:
    """journal.keep_days: decisions and closed commands (with their acks) older than the cut-off go;
    an open command and its decision stay, and so does the newest decision (the cycle continues)."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.record_decision(1, 0.0, "enforce", "optimal", 0.0, {}, [cmd("done", 0.0), cmd("refused", 0.0)])
    j.record_decision(2, 15.0, "enforce", "optimal", 0.0, {}, [cmd("open", 15.0, ttl=600.0)])
    j.record_decision(3, 30.0, "enforce", "optimal", 0.0, {}, [])
    j.record_decision(4, 45.0, "enforce", "optimal", 0.0, {"newest": True}, [cmd("last", 45.0)])
    j.mark_sent(["done", "refused", "open", "last"])
    assert j.record_ack("done", 1.0, "applied")
    assert j.record_ack("refused", 1.0, "rejected", "level out of range")
    assert j.record_ack("last", 46.0, "applied")

    assert j.prune(time.time() - 3600.0) == (0, 0, 0, 0)  # nothing is an hour old yet: nothing looked at
    cut = time.time() + 1.0  # everything journaled is older than this
    assert j.prune(cut, max_decisions=1) == (1, 2, 2, 1)  # the oldest decision only: cycle 1, its commands and acks
    assert j.prune(cut) == (1, 0, 0, 1)  # cycle 3 looked at and gone; cycle 2 (an open command) passed over
    assert j.command("done") is None and j.command("refused") is None
    open_cmd = j.command("open")
    assert open_cmd is not None and open_cmd.state is CommandState.SENT  # still resent after a restart
    assert j.command("last") is not None  # the newest decision's commands stay with it
    assert j.decision_count() == 2  # cycle 2 (open command) and cycle 4 (the newest)
    j.close()
    j2 = Journal(path)
    assert j2.last_decision() == (4, 45.0, {"newest": True})
    assert [c.command_id for c in j2.unacked(50.0)] == ["open"]


def test_decisions_kept_for_open_commands_do_not_hold_back_newer_history(tmp_path: Path) -> None:
    """A prune deletes at most ``max_decisions`` per call, and the decisions an open command keeps
    must not take up that batch: with the 3 oldest decisions all kept (their commands unanswered, as
    after an agent stopped mid-send), the 4 newer old ones still go, 3 per call, and the cycle count's
    newest decision stays. Before, the batch was the 3 oldest whatever their commands: every call
    looked at the same kept decisions and deleted nothing, for ever."""
    j = Journal(tmp_path / "j.sqlite")
    for cycle in (1, 2, 3):
        j.record_decision(cycle, 15.0 * cycle, "enforce", "optimal", 0.0, {}, [cmd(f"open{cycle}", 15.0, ttl=1e9)])
    j.mark_sent(["open1", "open2", "open3"])
    for cycle in (4, 5, 6, 7, 8):
        j.record_decision(cycle, 15.0 * cycle, "enforce", "optimal", 0.0, {}, [cmd(f"done{cycle}", 15.0 * cycle)])
        j.mark_sent([f"done{cycle}"])
        assert j.record_ack(f"done{cycle}", 15.0 * cycle + 1.0, "applied")
    cut = time.time() + 1.0  # all 8 are older than this
    assert j.prune(cut, max_decisions=3) == (3, 3, 3, 3)  # cycles 4-6 with their commands and acks
    assert j.prune(cut, max_decisions=3) == (1, 1, 1, 1)  # cycle 7; cycle 8 is the newest
    assert j.prune(cut, max_decisions=3) == (0, 0, 0, 0)  # nothing left that can go
    assert j.decision_count() == 4  # cycles 1-3 (open commands) and 8 (the newest)
    assert sorted(c.command_id for c in j.unacked(100.0)) == ["open1", "open2", "open3"]
    j.close()


def test_the_prune_finds_old_decisions_through_the_wall_time_index(tmp_path: Path) -> None:
    """The hourly prune must not read every decision's summary: SQLite's plan for the decisions it
    looks at walks the wall-time index (it scanned the table by rowid when they were ordered by id)."""
    j = Journal(tmp_path / "j.sqlite")
    for i in range(50):
        j.record_decision(i, 15.0 * i, "enforce", "optimal", 0.0, {"explanation": ["x" * 1000]})
    plan = " / ".join(
        str(row[3]) for row in j._conn.execute("EXPLAIN QUERY PLAN " + prune_candidates_sql(5000), (time.time(),))
    )
    j.close()
    assert "USING COVERING INDEX decisions_wall" in plan, plan


REPO = Path(__file__).resolve().parents[2]

# Run in a child process: the journal is opened, then the file size limit (ulimit -f) is set just
# above what is there, and calibrations are saved until a write fails (at the COMMIT: the pages go to
# the WAL file then). What the child saw is printed as JSON.
_FULL_DISK = textwrap.dedent(
    """
    import json, os, resource, sys
    import numpy as np
    from agent.journal import Journal, JournalError

    path = sys.argv[1]
    j = Journal(path)
    cards = np.arange(400, dtype=np.int64)
    j.save_calibration(cards, np.full(400, 0.05), np.ones(400), 0.0)
    wal = os.path.getsize(path + "-wal")
    resource.setrlimit(resource.RLIMIT_FSIZE, (wal + 20_000, resource.RLIM_INFINITY))
    out = {"error": None}
    for i in range(1, 50):
        try:
            j.save_calibration(cards, np.full(400, 0.05 + i * 1e-4), np.ones(400), float(i))
        except Exception as exc:
            out = {"error": type(exc).__name__, "message": str(exc), "cause": type(exc.__cause__).__name__}
            break
    out["in_transaction"] = j._db.in_transaction
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    j.save_calibration(cards, np.full(400, 0.07), np.ones(400), 99.0)  # the disk has room again
    out["after"] = j.load_calibration()[1][0]
    print(json.dumps(out))
    """
)


def test_a_write_that_fails_at_commit_is_a_journal_error_and_no_transaction_stays_open(tmp_path: Path) -> None:
    """A full disk (here: the file size limit) fails the COMMIT of a transaction: that is a
    JournalError like every other sqlite error of the journal (the service handles those), and the
    transaction is rolled back, so the journal works again once there is room."""
    path = tmp_path / "j.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["error"] == "JournalError", out
    assert out["message"].startswith(f"journal {path}: ") and out["cause"] == "OperationalError"
    assert out["in_transaction"] is False
    assert out["after"] == pytest.approx(0.07)


def test_the_service_lock_refuses_a_second_holder_and_readers_still_open_it(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    held = Journal(path, lock=True)
    assert Path(f"{path}.lock").read_text().strip() == str(os.getpid())
    with pytest.raises(JournalInUseError) as info:
        Journal(path, lock=True)
    assert str(info.value) == f"journal {path} is in use by another racktwin agent (pid {os.getpid()})"
    assert info.value.pid == os.getpid()
    reader = Journal(path)  # tests and reports read it while the agent runs
    assert reader.decision_count() == 0
    reader.close()
    held.close()
    again = Journal(path, lock=True)  # released on close
    again.close()


def test_the_lock_names_its_holder_over_what_an_earlier_holder_left(tmp_path: Path) -> None:
    """The lock file outlives its holder: a new holder's pid replaces the old one's whole (a longer
    stale pid left behind it made the next refusal say "pid unknown" instead of who holds it)."""
    path = tmp_path / "j.sqlite"
    Path(f"{path}.lock").write_text("4194304999\n")  # a dead agent's pid, longer than ours
    held = Journal(path, lock=True)
    with pytest.raises(JournalInUseError) as info:
        Journal(path, lock=True)
    assert info.value.pid == os.getpid()
    held.close()


def test_a_killed_holder_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    code = (
        "import sys, time; from agent.journal import Journal; "
        "Journal(sys.argv[1], lock=True); print('held', flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(JournalInUseError, match=f"pid {proc.pid}"):
            Journal(path, lock=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    Journal(path, lock=True).close()  # the operating system released it with the process


def test_open_errors_are_journal_errors_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    under_a_file = tmp_path / "file" / "j.sqlite"
    with pytest.raises(JournalError, match=f"journal {under_a_file}: cannot create its folder"):
        Journal(under_a_file)
    (tmp_path / "j.sqlite.lock").mkdir()  # the lock file cannot be opened
    with pytest.raises(JournalError, match=f"journal {tmp_path / 'j.sqlite'}: cannot open its lock file"):
        Journal(tmp_path / "j.sqlite", lock=True)


def test_a_removed_or_replaced_journal_file_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    assert j.file_problem() is None
    path.rename(tmp_path / "moved.sqlite")
    assert j.file_problem() == f"journal file {path} was removed or replaced: decisions are not being kept"
    (tmp_path / "moved.sqlite").rename(path)  # back: the same file
    assert j.file_problem() is None
    other = Journal(tmp_path / "other.sqlite")
    other.close()
    os.replace(tmp_path / "other.sqlite", path)  # another file under its name
    assert j.file_problem() is not None and "removed or replaced" in str(j.file_problem())
    j.close()


def test_a_command_at_its_expiry_is_expired_not_resumed_as_a_rack_judges_it(tmp_path: Path) -> None:
    """A rack calls a command expired at ``expires_at`` itself (``wire.is_expired``): a restarted agent
    at that very time neither sends it again nor leaves it open; a second before, it is resumed."""
    j = Journal(tmp_path / "j.sqlite")
    j.record_decision(1, 100.0, "enforce", "optimal", 0.0, {}, [cmd("a", 100.0), cmd("b", 100.0, 5)])
    j.mark_sent(["a", "b"])
    assert [c.command_id for c in j.unacked(104.0)] == ["a", "b"]
    assert [c.command_id for c in j.unacked(105.0)] == ["a"]  # b expires at 105
    assert j.expire(104.0) == 0
    assert j.expire(105.0) == 1
    assert state_of(j, "b") is CommandState.EXPIRED
    assert state_of(j, "a") is CommandState.SENT


def test_open_commands_are_resumed_oldest_issued_first(tmp_path: Path) -> None:
    """Resent after a restart in the order they were issued (a rack refuses a command issued before one
    it applied to the same cards: the newer must go last), whatever order they were journaled in."""
    j = Journal(tmp_path / "j.sqlite")
    j.record_decision(1, 110.0, "enforce", "optimal", 0.0, {}, [cmd("newer", 110.0)])
    j.record_decision(2, 100.0, "enforce", "optimal", 0.0, {}, [cmd("older", 100.0), cmd("older2", 100.0)])
    assert [c.command_id for c in j.unacked(120.0)] == ["older", "older2", "newer"]


def test_what_a_rack_answered_stays_answered_and_sends_are_counted(tmp_path: Path) -> None:
    """An ack may arrive before the journal records the send (the broker is quick, the write is not):
    the command stays applied; each send counts an attempt. A command answered ``applied`` or
    ``rejected`` is not made expired by the expiry, nor superseded or abandoned by a newer command:
    the journal keeps what the rack did. An ack of another agent's command is not kept."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    cmds = [cmd("a", 0.0), cmd("b", 0.0), cmd("c", 0.0), cmd("d", 0.0), cmd("e", 0.0)]
    j.record_decision(1, 0.0, "enforce", "optimal", 0.0, {}, cmds)
    j.mark_sent(["b", "c", "d", "e"])
    assert j.record_acks([("a", 1.0, "applied", None), ("b", 1.0, "rejected", "busy")]) == [True, True]
    assert j.record_ack("zzz", 1.0, "applied") is False
    j.mark_sent(["a", "b", "c"])  # a's send recorded after its ack; b and c sent again
    a, b, c = (j.command(x) for x in "abc")
    assert a is not None and a.state is CommandState.APPLIED and a.attempts == 1
    assert b is not None and b.state is CommandState.REJECTED and b.attempts == 2
    assert c is not None and c.state is CommandState.SENT and c.attempts == 2
    j.supersede(["a", "c"])
    j.abandon(["b", "d"])
    assert j.expire(100.0) == 1  # e only: the others were answered or closed
    assert {x: state_of(j, x) for x in "abcde"} == {
        "a": CommandState.APPLIED,
        "b": CommandState.REJECTED,
        "c": CommandState.SUPERSEDED,
        "d": CommandState.ABANDONED,
        "e": CommandState.EXPIRED,
    }
    j.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT command_id FROM acks ORDER BY id").fetchall() == [("a",), ("b",)]
    db.close()


def test_expiring_writes_nothing_until_an_open_command_can_have_expired(tmp_path: Path) -> None:
    """The publisher asks the journal to expire commands every 0.25 s: a transaction each time (the
    write lock taken, ~4 a second) although nothing had expired. Only a call at or after the first
    expiry of the open commands writes; one recorded expiring earlier moves that time forward;
    another connection holding the write lock (a sqlite3 shell) does not hold up a call that has
    nothing to expire."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    statements: list[str] = []
    j._conn.set_trace_callback(statements.append)

    def transactions() -> int:
        n = sum(s.startswith("BEGIN") for s in statements)
        statements.clear()
        return n

    assert j.expire(0.0) == 0 and transactions() == 1  # nothing known of the file yet: looked at once
    assert [j.expire(t) for t in (0.25, 1.0, 1e9)] == [0, 0, 0] and transactions() == 0  # no open command
    j.record_decision(1, 100.0, "enforce", "optimal", 0.0, {}, [cmd("a", 100.0), cmd("b", 100.0, ttl=60.0)])
    assert transactions() == 1
    assert [j.expire(100.0 + 0.25 * k) for k in range(119)] == [0] * 119 and transactions() == 0
    j.record_decision(2, 101.0, "enforce", "optimal", 0.0, {}, [cmd("c", 101.0, ttl=5.0)])  # expires first
    transactions()
    assert j.expire(106.0) == 1 and transactions() == 1
    assert j.command_counts() == {"expired": 1, "pending": 2}
    assert j.expire(129.9) == 0 and transactions() == 0
    assert j.expire(130.0) == 1 and transactions() == 1  # "a", at its expiry (as a rack judges it)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    # nothing expires before 160 s: no write is tried, so none waits for the lock (busy timeout 0.5 s)
    # and none fails (a write tried would BEGIN, and raise JournalError once the timeout is over)
    assert j.expire(159.0) == 0 and transactions() == 0
    with pytest.raises(JournalError):
        j.expire(160.0)  # "b" expires: that write waits for the lock, and fails
    holder.execute("ROLLBACK")
    assert j.expire(160.0) == 1 and j.command_counts() == {"expired": 3}
    holder.close()
    j.close()
