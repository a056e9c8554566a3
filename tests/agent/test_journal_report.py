"""``racktwin journal``: what operators read back from the agent's journal.

The journal is written through the agent's own ``Journal`` class (decisions, commands of every kind,
sends, acks, expiries, calibration), then read by the command as a user runs it. What users rely on:
the counts match what was journaled (statuses, fail-safe episodes, commands by kind and state,
rejection reasons), ``--since`` keeps only later decisions and their commands, ``--decision`` shows
one decision's commands and acks, the file is never written or created, it reads a journal the agent
holds open, and bad input is one line with exit status 2.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.cli import main
from agent.commands.journal_cmd import parse_since
from agent.journal import Journal, NewCommand
from agent.journal_report import JournalSummary, command_kind, read_journal, summarize

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
TOPIC = "racktwin/v1/site1"


def _summary(status: str, failsafe: list[str], source: str = "milp") -> dict[str, Any]:
    return {
        "status": status,
        "plan_status": status,
        "source": source,
        "failsafe_racks": failsafe,
        "busy_cards": 100,
        "low_power_cards": 20,
        "hosts_off": 3,
        "supply_temp_c": 40.0,
        "predicted_pue": 1.05,
        "placements": {},
        "explanation": [f"plan {status} ({source})"],
    }


def _cmd(cid: str, kind: str, t_s: float) -> NewCommand:
    topic = {
        "rack_cmd": f"{TOPIC}/rack/r1/cmd",
        "cdu_cmd": f"{TOPIC}/rack/r1/cdu_cmd",
        "facility_cmd": f"{TOPIC}/facility/cmd",
        "scheduler_cmd": f"{TOPIC}/scheduler/cmd",
    }[kind]
    target = {"facility_cmd": "facility", "scheduler_cmd": "scheduler"}.get(kind, "r1")
    payload = json.dumps({"schema": f"racktwin.{kind}/1", "command_id": cid}).encode()
    return NewCommand(cid, target, topic, payload, t_s, t_s + 30.0)


def _set_wall(path: Path, decision_id: int, wall_s: float) -> None:
    """Give a decision another wall time (the journal stamps time.time() when writing)."""
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE decisions SET wall_time_s = ? WHERE id = ?", (wall_s, decision_id))
    db.close()


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    """Six decisions an hour apart (the last two within the last hour): r3 at fail-safe in 2, 3 and 5
    (two episodes), r0 in 3; eleven commands of four kinds ending every way a command can."""
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    statuses = ["optimal", "failsafe", "failsafe", "optimal", "failsafe", "fallback"]
    failsafe = [[], ["r3"], ["r3", "r0"], [], ["r3"], []]
    cmds = {
        1: [_cmd("a1", "rack_cmd", 100.0), _cmd("a2", "cdu_cmd", 100.0)],
        2: [_cmd("b1", "rack_cmd", 200.0)],
        3: [_cmd("c1", "facility_cmd", 300.0)],
        4: [_cmd("d1", "scheduler_cmd", 400.0), _cmd("d2", "scheduler_cmd", 400.0)],
        5: [_cmd("e1", "rack_cmd", 500.0), _cmd("e2", "rack_cmd", 500.0), _cmd("e3", "cdu_cmd", 500.0)],
        6: [_cmd("f1", "rack_cmd", 600.0), _cmd("f2", "facility_cmd", 600.0)],
    }
    for i in range(6):
        j.record_decision(
            i, 100.0 * (i + 1), "enforce", statuses[i], 0.01 * (i + 1), _summary(statuses[i], failsafe[i]), cmds[i + 1]
        )
    j.mark_sent(["a1", "a2", "b1", "c1", "d1", "d2", "e1", "e2", "e3", "f1"])
    j.mark_sent(["b1", "e1"])  # sent again (no ack in time)
    j.record_acks(
        [
            ("a1", 101.0, "applied", None),
            ("a2", 101.0, "applied", None),
            ("b1", 230.0, "expired", None),
            ("c1", 301.0, "applied", None),
            ("d1", 401.0, "rejected", "place_job: card 17 is busy"),
            ("d2", 401.0, "rejected", "place_job: card 17 is busy"),
            ("e1", 501.0, "rejected", "rack r1: card 3 failed"),
            # copies sent again, answered again: more acks, not more commands or rejections
            ("b1", 231.0, "expired", "duplicate: command b1 was expired before; not applied again"),
            ("d1", 402.0, "rejected", "duplicate: command d1 was rejected before (place_job: ...)"),
        ]
    )
    j.expire(531.0)  # e2, e3 (sent, never acked) expire; f1 (sent) and f2 (pending) stay open
    j.save_calibration(np.arange(4), np.full(4, 0.1), np.ones(4), 450.0)
    j.close()
    now = time.time()
    for i in range(6):
        _set_wall(path, i + 1, now - 3600.0 * (5 - i) - 60.0)
    return path


def _wall_times(path: Path) -> dict[int, float]:
    db = sqlite3.connect(path)
    try:
        return {int(i): float(w) for i, w in db.execute("SELECT id, wall_time_s FROM decisions")}
    finally:
        db.close()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["journal", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_journal_says_permission_denied(journal_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SQLite's own message was "unable to open database file"."""
    journal_file.chmod(0)
    try:
        rc, _, err = run_cli(capsys, "--journal", str(journal_file))
    finally:
        journal_file.chmod(0o600)
    assert rc == 2 and "cannot read it (permission denied)" in err


@pytest.mark.parametrize("extra", [["--since", "1h"], ["--last", "0"], ["--since", "2h", "--last", "3"]])
def test_decision_with_since_or_last_is_refused(
    journal_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    """They were silently ignored: `--decision 3 --since 2030-01-01` printed decision 3."""
    rc, out, err = run_cli(capsys, "--journal", str(journal_file), "--decision", "3", *extra)
    assert rc == 2 and out == ""
    assert "cannot be combined with --decision" in err and extra[0] in err


def test_the_summary_counts_what_was_journaled(journal_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--json", "--last", "2")
    assert rc == 0
    s = json.loads(out)
    assert s["decisions"] == 6
    assert s["statuses"] == {"failsafe": 3, "fallback": 1, "optimal": 2}  # worst first
    assert s["failsafe_racks"]["r3"]["decisions"] == 3 and s["failsafe_racks"]["r3"]["episodes"] == 2
    assert s["failsafe_racks"]["r0"]["decisions"] == 1 and s["failsafe_racks"]["r0"]["episodes"] == 1
    c = s["commands"]
    assert c["by_state"] == {"pending": 1, "sent": 1, "applied": 3, "rejected": 3, "expired": 3}
    assert c["by_kind"]["rack_cmd"] == {"sent": 1, "rejected": 1, "expired": 2, "applied": 1}
    assert c["by_kind"]["scheduler_cmd"] == {"rejected": 2}
    assert c["by_kind"]["facility_cmd"] == {"pending": 1, "applied": 1}
    assert c["open"] == 2 and c["sent_more_than_once"] == 2
    assert s["acks"] == {"applied": 3, "expired": 1, "rejected": 3} and s["repeated_acks"] == 2
    assert s["rejections"]["by_reason"] == [
        {"reason": "place_job: card 17 is busy", "count": 2},
        {"reason": "rack r1: card 3 failed", "count": 1},
    ]
    assert s["calibration"] == {"cards": 4, "last_site_s": 450.0}
    assert [d["id"] for d in s["recent"]] == [5, 6]  # the newest, oldest of them first
    assert s["solve_s"]["max"] == pytest.approx(0.06)
    # the racks held most often first, each with the wall times of its first and last decision there
    wall = _wall_times(journal_file)
    assert list(s["failsafe_racks"]) == ["r3", "r0"]
    assert (s["failsafe_racks"]["r3"]["first_wall_s"], s["failsafe_racks"]["r3"]["last_wall_s"]) == (wall[2], wall[5])
    assert (s["first_wall_s"], s["last_wall_s"]) == (wall[1], wall[6])
    assert (s["first_site_s"], s["last_site_s"]) == (100.0, 600.0)
    assert s["since_wall_s"] is None


def test_the_text_names_the_failsafe_racks_the_open_commands_and_the_reasons(
    journal_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--last", "1")
    assert rc == 0
    assert "status       failsafe 3, fallback 1, optimal 2; mode enforce 6" in out
    assert "r3: 3 decisions in 2 episodes" in out and "r0: 1 decision in 1 episode," in out
    assert "2 open (pending or sent)" in out and "2 sent more than once" in out
    assert "2 x place_job: card 17 is busy" in out
    assert "acks         applied 3, expired 1, rejected 3; 2 repeated (copies sent again)" in out
    assert "#6" in out and "plan fallback (milp)" in out and "#5" not in out
    # states in their order (open ones first), for all commands and for each kind
    assert "  commands     11: pending 1, sent 1, applied 3, rejected 3, expired 3; 2 open" in out
    assert "    rack_cmd       5: sent 1, applied 1, rejected 1, expired 2" in out


def test_since_keeps_the_later_decisions_and_their_commands(
    journal_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--json", "--since", "90m")
    assert rc == 0
    s = json.loads(out)
    assert s["decisions"] == 2  # decisions 5 and 6
    assert s["since_wall_s"] == pytest.approx(time.time() - 5400.0, abs=60.0)
    assert s["commands"]["by_state"] == {"pending": 1, "sent": 1, "rejected": 1, "expired": 2}
    assert s["acks"] == {"rejected": 1} and s["repeated_acks"] == 0
    assert list(s["failsafe_racks"]) == ["r3"] and s["failsafe_racks"]["r3"]["episodes"] == 1
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--since", "1m")
    assert rc == 0 and "decisions    none in that time" in out


def test_one_decision_with_its_commands_and_acks(journal_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--decision", "5", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["decision"]["status"] == "failsafe" and d["decision"]["summary"]["failsafe_racks"] == ["r3"]
    by_id = {c["command_id"]: c for c in d["commands"]}
    assert list(by_id) == ["e1", "e2", "e3"]
    assert by_id["e1"]["state"] == "rejected" and by_id["e1"]["attempts"] == 2
    assert by_id["e1"]["acks"] == [{"result": "rejected", "reason": "rack r1: card 3 failed", "site_time_s": 501.0}]
    assert by_id["e3"]["kind"] == "cdu_cmd" and by_id["e3"]["acks"] == [] and by_id["e3"]["state"] == "expired"
    assert by_id["e1"]["payload"]["command_id"] == "e1"
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--decision", "2", "--json")
    (b1,) = json.loads(out)["commands"]  # its acks in the order they came, no reason as null
    assert [(a["reason"], a["site_time_s"]) for a in b1["acks"]] == [
        (None, 230.0),
        ("duplicate: command b1 was expired before; not applied again", 231.0),
    ]
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--decision", "5")
    assert "e1  rack_cmd r1  rejected, sent 2x" in out and "ack: rejected (rack r1: card 3 failed)" in out
    assert "  3 commands (--json adds each payload):" in out
    assert "  1 command (" in run_cli(capsys, "--journal", str(journal_file), "--decision", "3")[1]
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--json", "--last", "99999999999999999999")
    assert rc == 0 and len(json.loads(out)["recent"]) == 6  # more than there are: all of them
    rc, _, err = run_cli(capsys, "--journal", str(journal_file), "--decision", "99")
    assert rc == 2 and "no decision 99 (never made, or pruned)" in err


def test_it_never_writes_the_journal(journal_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = hashlib.sha256(journal_file.read_bytes()).hexdigest()
    files = sorted(p.name for p in journal_file.parent.iterdir())
    for args in (["--json"], ["--decision", "2"], ["--since", "2h"]):
        assert run_cli(capsys, "--journal", str(journal_file), *args)[0] == 0
    assert hashlib.sha256(journal_file.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in journal_file.parent.iterdir()) == files  # no -wal/-shm/lock left behind
    missing = journal_file.parent / "sub" / "none.sqlite"
    rc, _, err = run_cli(capsys, "--journal", str(missing))
    assert rc == 2 and "no such file" in err and not missing.parent.exists()


def test_it_reads_a_journal_the_agent_holds_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "journal.sqlite"
    agent = Journal(path, lock=True)  # as the service holds it: locked, WAL not checkpointed
    try:
        for i in range(3):
            agent.record_decision(i, float(i), "advisory", "optimal", 0.01, _summary("optimal", []))
        rc, out, _ = run_cli(capsys, "--journal", str(path), "--json")
        assert rc == 0 and json.loads(out)["decisions"] == 3 and json.loads(out)["modes"] == {"advisory": 3}
        agent.record_decision(3, 3.0, "advisory", "infeasible", 0.01, _summary("infeasible", []))
        rc, out, _ = run_cli(capsys, "--journal", str(path), "--json")
        assert json.loads(out)["statuses"] == {"infeasible": 1, "optimal": 3}
    finally:
        agent.close()


def test_the_journal_of_a_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cfg").mkdir()
    Journal(tmp_path / "cfg" / "state" / "j.sqlite").close()
    config = tmp_path / "cfg" / "agent.toml"
    # only journal.path is read: an operator who may read the journal need not read the broker's
    # password or the site spec, nor write the journal (all were checked before, as for the agent)
    config.write_text('site = "no-such-site.toml"\n[broker]\nusername = "agent"\npassword_file = "no-such-file"\n'
                      '[journal]\npath = "state/j.sqlite"\n')  # fmt: skip
    rc, out, _ = run_cli(capsys, "--config", str(config))  # relative to the configuration's folder
    assert rc == 0 and f"journal {tmp_path / 'cfg' / 'state' / 'j.sqlite'}" in out and "decisions    none" in out
    config.write_text('site = "s.toml"\n[journal]\npath = 5\n')
    rc, _, err = run_cli(capsys, "--config", str(config))
    assert rc == 2 and "journal.path" in err


def test_an_agent_starting_during_an_immutable_read_makes_it_read_again(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    Journal(path).close()  # no process has it open: the first read is immutable
    writer: list[Journal] = []

    def read(db: sqlite3.Connection) -> int:
        n = int(db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])
        if not writer:  # an agent starts and decides meanwhile (its -wal appears, the file changes)
            writer.append(Journal(path, lock=True))
            writer[0].record_decision(0, 0.0, "enforce", "optimal", 0.0, _summary("optimal", []))
        return n

    try:
        assert read_journal(path, read) == 1  # read again, not the 0 of the stale immutable view
    finally:
        writer[0].close()


def test_a_summary_with_non_finite_numbers_or_odd_fields_does_not_break_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.record_decision(
        0, 0.0, "enforce", "infeasible", 0.0, {**_summary("infeasible", ["r1"]), "predicted_pue": math.inf}
    )
    j.close()
    db = sqlite3.connect(path)
    stored = json.loads(db.execute("SELECT summary FROM decisions").fetchone()[0])
    assert stored["predicted_pue"] is None  # strict JSON (was Infinity, which SQLite's JSON refuses)
    with db:  # hand-written rows: not JSON at all, and fields of the wrong types
        db.execute(
            "INSERT INTO decisions(cycle, site_time_s, wall_time_s, mode, status, solve_s, summary) "
            "VALUES (1, 1.0, 1.0, 'enforce', 'optimal', 0.0, 'not json'), "
            '(2, 2.0, 2.0, \'enforce\', \'failsafe\', 0.0, \'{"failsafe_racks": [1, 2], "supply_temp_c": "x", '
            '"explanation": "one line", "placements": [1]}\')'
        )
    db.close()
    rc, out, err = run_cli(capsys, "--journal", str(path), "--last", "3")
    assert rc == 0, err
    assert "failsafe 1, infeasible 1, optimal 1" in out and "r1: 1 decision in 1 episode" in out
    assert "fail-safe 1,2" in out and "one line" in out
    rc, out, err = run_cli(capsys, "--journal", str(path), "--decision", "3")
    assert rc == 0 and "one line" in out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give the journal: --config FILE"),
        (["--journal", "{not_a_db}"], "file is not a database"),
        (["--journal", "{other_db}"], "not a racktwin journal"),
        (["--journal", "{folder}"], "not a file"),
        (["--journal", "{journal}", "--since", "yesterday"], "--since 'yesterday': give a duration"),
        (["--journal", "{journal}", "--last", "-1"], "--last -1: must be 0 or more"),
        (["--journal", "{journal}", "--since", "1000000d"], "out of the range of dates"),
        (["--journal", "{journal}", "--since", "9999-12-31T23:59-01:00"], "out of the range of dates"),
        (["--journal", "{journal}", "--decision", "99999999999999999999"], "no decision 99999999999999999999"),
        (["--journal", "{journal}", "--decision", "-1"], "--decision -1: must be 1 or more"),
        (["--journal", "{journal}", "--decision", "0"], "--decision 0: must be 1 or more"),
        # the file is checked before the decision is looked for
        (["--journal", "{other_db}", "--decision", "99999999999999999999"], "not a racktwin journal"),
        (["--journal", "{not_a_db}", "--decision", "3"], "file is not a database"),
        (["--config", "{missing}"], "file not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, journal_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not.sqlite").write_text("hello\n" * 100)
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("CREATE TABLE t (x)")
    other.close()
    paths = {
        "not_a_db": tmp_path / "not.sqlite",
        "other_db": tmp_path / "other.sqlite",
        "folder": tmp_path,
        "journal": journal_file,
        "missing": tmp_path / "none.toml",
    }
    rc, out, err = run_cli(capsys, *(a.format(**paths) for a in args))
    assert rc == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_journal_of_another_schema_version_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "j.sqlite"
    Journal(path).close()
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()
    rc, _, err = run_cli(capsys, "--journal", str(path))
    assert rc == 2 and "schema version 99, this racktwin reads 1" in err


def test_since_accepts_durations_and_utc_times() -> None:
    now = 1_800_000_000.0
    assert parse_since("90s", now) == now - 90
    assert parse_since("30m", now) == now - 1800
    assert parse_since("2h", now) == now - 7200
    assert parse_since("1.5d", now) == now - 129600
    assert parse_since("2026-12-01T10:00", now) == 1796119200.0  # UTC when no offset is given
    assert parse_since("2026-12-01T11:00+01:00", now) == 1796119200.0


def test_command_kinds_from_topics() -> None:
    assert command_kind(f"{TOPIC}/rack/r7/cmd") == "rack_cmd"
    assert command_kind(f"{TOPIC}/rack/r7/cdu_cmd") == "cdu_cmd"
    assert command_kind(f"{TOPIC}/facility/cmd") == "facility_cmd"
    assert command_kind(f"{TOPIC}/scheduler/cmd") == "scheduler_cmd"


def _read_summary(path: Path, **kw: Any) -> JournalSummary:
    return read_journal(path, lambda db: summarize(db, **kw))


def test_statuses_worst_first_modes_and_unknown_statuses_are_all_counted(tmp_path: Path) -> None:
    """Worst first is not alphabetical (infeasible before fallback); a status this racktwin does not
    know (a newer agent's) is counted after them, so the counts add up to the decisions."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    for i, (mode, status) in enumerate(
        [("enforce", "fallback"), ("advisory", "infeasible"), ("enforce", "optimal"), ("standby", "paused")]
    ):
        j.record_decision(i, float(i), mode, status, 0.01, _summary(status, []))
    j.close()
    s = _read_summary(path)
    assert list(s.statuses.items()) == [("infeasible", 1), ("fallback", 1), ("optimal", 1), ("paused", 1)]
    assert s.modes == {"advisory": 1, "enforce": 2, "standby": 1}


def test_solve_times_are_the_median_the_nearest_rank_p99_and_the_max(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    for i in range(100):  # 98 quick solves, one of 2 s (the 99th percentile), one of 5 s
        j.record_decision(i, float(i), "enforce", "optimal", {98: 2.0, 99: 5.0}.get(i, 0.01), _summary("optimal", []))
    j.close()
    s = _read_summary(path)
    assert (s.solve_median_s, s.solve_p99_s, s.solve_max_s) == (0.01, 2.0, 5.0)


def test_last_0_shows_no_decision_but_still_counts_them(journal_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--json", "--last", "0")
    s = json.loads(out)
    assert rc == 0 and s["decisions"] == 6 and s["recent"] == [] and s["last_wall_s"] == _wall_times(journal_file)[6]
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--last", "0")
    assert "  decisions    6 from " in out and "newest" not in out


def test_since_keeps_a_decision_made_at_that_very_time(journal_file: Path) -> None:
    wall = _wall_times(journal_file)
    assert _read_summary(journal_file, since_wall_s=wall[5]).decisions == 2


def test_of_decisions_at_the_same_wall_time_the_later_journaled_is_the_newest(
    journal_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _set_wall(journal_file, 5, _wall_times(journal_file)[6])
    rc, out, _ = run_cli(capsys, "--journal", str(journal_file), "--json", "--last", "1")
    assert rc == 0 and [d["id"] for d in json.loads(out)["recent"]] == [6]


def _rejections_journal(path: Path) -> None:
    """Ten reasons three times each, then "rare a" twice and "rare b" once: 33 rejections, 12 reasons."""
    j = Journal(path)
    reasons = [f"reason {k:02d}" for k in range(10) for _ in range(3)] + ["rare a", "rare a", "rare b"]
    cmds = [_cmd(f"c{i}", "rack_cmd", 10.0) for i in range(len(reasons))]
    j.record_decision(0, 10.0, "enforce", "optimal", 0.01, _summary("optimal", []), cmds)
    j.mark_sent([c.command_id for c in cmds])
    j.record_acks([(c.command_id, 11.0, "rejected", why) for c, why in zip(cmds, reasons, strict=True)])
    j.close()


def test_the_ten_most_frequent_rejection_reasons_and_the_count_of_the_others(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    _rejections_journal(path)
    s = _read_summary(path)
    assert s.top_rejection_reasons == [(f"reason {k:02d}", 3) for k in range(10)]
    assert s.other_rejections == 3  # rejections, not reasons
    assert s.rejection_reasons == [*s.top_rejection_reasons, ("rare a", 2), ("rare b", 1)]


def test_json_carries_every_rejection_reason_and_the_text_the_ten_most_frequent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script reading ``--json`` loses no reason (it had only the top ten and a count of the rest);
    the text view keeps its top ten and one line for the others (docs/agent.md)."""
    path = tmp_path / "j.sqlite"
    _rejections_journal(path)
    rc, out, _ = run_cli(capsys, "--journal", str(path), "--json")
    assert rc == 0
    rejections = json.loads(out)["rejections"]
    assert rejections["by_reason"] == [
        *({"reason": f"reason {k:02d}", "count": 3} for k in range(10)),
        {"reason": "rare a", "count": 2},
        {"reason": "rare b", "count": 1},
    ]
    assert rejections["total"] == 33
    rc, out, _ = run_cli(capsys, "--journal", str(path))
    assert rc == 0
    assert "  rejected     3 x reason 00\n" in out and " " * 15 + "3 x reason 09\n" in out
    assert "rare a" not in out and "rare b" not in out
    assert " " * 15 + "3 x other reasons (2 more; --json lists each)\n" in out


def test_a_copy_answered_otherwise_and_the_newest_calibration(tmp_path: Path) -> None:
    """A command's first ack is the rack's answer: a copy answered `rejected` afterwards leaves no
    rejection in the counts (not even one of 0). The calibration's time is its newest."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.record_decision(0, 10.0, "enforce", "optimal", 0.01, _summary("optimal", []), [_cmd("a", "rack_cmd", 10.0)])
    j.mark_sent(["a"])
    j.mark_sent(["a"])
    j.record_acks([("a", 11.0, "applied", None), ("a", 12.0, "rejected", "duplicate: command a was applied")])
    j.save_calibration(np.arange(2), np.full(2, 0.1), np.ones(2), 450.0)
    j.save_calibration(np.arange(2, 3), np.full(1, 0.1), np.ones(1), 100.0)
    j.close()
    s = _read_summary(path)
    assert (s.acks_by_result, s.repeated_acks, s.rejection_reasons) == ({"applied": 1}, 1, [])
    assert (s.calibrated_cards, s.last_calibration_site_s) == (3, 450.0)


def test_summaries_of_other_shapes_are_shown_without_their_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.sqlite"
    Journal(path).close()
    db = sqlite3.connect(path)
    with db:  # hand-written: a JSON list as the summary, a number as the fail-safe racks
        db.execute(
            "INSERT INTO decisions(cycle, site_time_s, wall_time_s, mode, status, solve_s, summary) "
            "VALUES (0, 1.0, 1.0, 'enforce', 'optimal', 0.0, '[1, 2]'), "
            "(1, 2.0, 2.0, 'enforce', 'failsafe', 0.0, '{\"failsafe_racks\": 5}')"
        )
    db.close()
    rc, out, err = run_cli(capsys, "--journal", str(path), "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert s["decisions"] == 2 and s["failsafe_racks"] == {}
    assert [d["summary"] for d in s["recent"]] == [{}, {"failsafe_racks": 5}]
    rc, out, err = run_cli(capsys, "--journal", str(path), "--decision", "1")
    assert rc == 0 and "#1" in out, err


def test_a_read_that_fails_because_an_agent_started_meanwhile_is_read_again(tmp_path: Path) -> None:
    """An immutable read of a file an agent starts writing may fail ("database disk image is
    malformed"): the file changed, so it is read again, now as an ordinary reader."""
    path = tmp_path / "j.sqlite"
    Journal(path).close()
    writer: list[Journal] = []

    def read(db: sqlite3.Connection) -> int:
        if not writer:
            writer.append(Journal(path, lock=True))
            writer[0].record_decision(0, 0.0, "enforce", "optimal", 0.0, _summary("optimal", []))
            raise sqlite3.DatabaseError("database disk image is malformed")
        return int(db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])

    try:
        assert read_journal(path, read) == 1
    finally:
        writer[0].close()


def test_a_journal_whose_path_has_url_characters_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run #3 ?a=1 %20"
    folder.mkdir()
    j = Journal(folder / "j.sqlite")
    j.record_decision(0, 0.0, "enforce", "optimal", 0.0, _summary("optimal", []))
    j.close()
    rc, out, err = run_cli(capsys, "--journal", str(folder / "j.sqlite"), "--json")
    assert rc == 0 and json.loads(out)["decisions"] == 1, err


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); CREATE TABLE decisions (id INTEGER)", "not a racktwin"),
        (
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); CREATE TABLE decisions (id INTEGER); "
            "CREATE TABLE commands (x); CREATE TABLE acks (x)",
            "schema version none, this racktwin reads 1",
        ),
    ],
)
def test_a_database_that_is_not_a_whole_racktwin_journal_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: str, message: str
) -> None:
    path = tmp_path / "j.sqlite"
    db = sqlite3.connect(path)
    db.executescript(schema)
    db.close()
    rc, out, err = run_cli(capsys, "--journal", str(path))
    assert rc == 2 and out == "" and message in err, err
