"""The journal: decisions and commands are durable, acks close commands, expired ones never return."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from agent.journal import CommandState, Journal, JournalError, NewCommand

pytestmark = pytest.mark.agent


def cmd(cid: str, issued: float, ttl: float = 30.0) -> NewCommand:
    return NewCommand(cid, "r0", "racktwin/v1/s/r0/cmd", b'{"x":1}', issued, issued + ttl)


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
    assert j2.command("b") is not None and j2.command("b").state is CommandState.EXPIRED  # type: ignore[union-attr]


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
    assert j._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    j.set_meta("schema_version", "999")
    j.close()
    with pytest.raises(JournalError, match="schema version 999"):
        Journal(path)


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

    assert j.prune(time.time() - 3600.0) == (0, 0, 0)  # nothing is an hour old yet
    cut = time.time() + 1.0  # everything journaled is older than this
    assert j.prune(cut, max_decisions=1) == (1, 2, 2)  # the oldest decision only: cycle 1, its commands and acks
    assert j.prune(cut) == (1, 0, 0)  # then cycle 3 (no commands); cycle 2 has an open one
    assert j.command("done") is None and j.command("refused") is None
    open_cmd = j.command("open")
    assert open_cmd is not None and open_cmd.state is CommandState.SENT  # still resent after a restart
    assert j.command("last") is not None  # the newest decision's commands stay with it
    assert j.decision_count() == 2  # cycle 2 (open command) and cycle 4 (the newest)
    j.close()
    j2 = Journal(path)
    assert j2.last_decision() == (4, 45.0, {"newest": True})
    assert [c.command_id for c in j2.unacked(50.0)] == ["open"]
