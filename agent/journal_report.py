"""What the agent did, read back from its journal (``racktwin journal``).

The journal (``agent.journal``) holds every decision with its summary, the commands it caused and
how each ended, and the acks. This module reads it **read-only** (an SQLite ``mode=ro`` connection:
it never creates, migrates or writes the file, and takes no lock, so it is safe while the agent
runs; WAL readers do not block the writer) and condenses it into what an operator asks first: how
many decisions of which status, how long the solves took, which racks were held at fail-safe caps
and when, what the guard changed (its actions, ``agent.guard.GUARD_ACTIONS``, counted from each summary's
``guard_actions``), how the commands ended (by kind), why racks refused any, which commands are still
open, and the last few decisions with their explanations. :func:`decision_detail` gives one decision with
its commands and acks.

The per-decision fields are read with SQLite's JSON functions (built in since SQLite 3.38), so a
30-day journal (~170,000 decisions) is summarized without decoding every summary in Python
(``benchmarks/bench_journal.py`` measures it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from agent.decision import STATUSES
from agent.journal import SCHEMA_VERSION, CommandState, JournalError

__all__ = [
    "CommandRow",
    "DecisionDetail",
    "DecisionRow",
    "FailsafeRack",
    "JournalSummary",
    "command_kind",
    "decision_detail",
    "guard_action_counts",
    "open_read_only",
    "read_journal",
    "summarize",
]

_T = TypeVar("_T")

#: Command states in the order they are shown (open ones first).
_STATE_ORDER = tuple(s.value for s in CommandState)
#: Rejection reasons listed one by one (the rest are counted together).
TOP_REASONS = 10


def _file_state(p: Path) -> tuple[int, int, int, bool]:
    """What changes when a process opens or writes the journal: its inode, size, modification time,
    and whether its write-ahead log exists."""
    st = os.stat(p)
    return st.st_ino, st.st_size, st.st_mtime_ns, Path(f"{p}-wal").exists()


def read_journal(path: str | Path, read: Callable[[sqlite3.Connection], _T], attempts: int = 3) -> _T:
    """``read(connection)`` on the journal at ``path`` (opened by :func:`open_read_only`), again if
    it was opened as immutable and an agent started on it meanwhile: an immutable connection does not
    see another process's writes (a 30-day summary takes ~3 s: an agent starting then made the read
    fail with "database disk image is malformed", or would give counts of no single moment); the
    next read finds the ``-wal`` file and is an ordinary read-only one."""
    p = Path(path)
    for _ in range(attempts):
        try:
            before = _file_state(p)
        except OSError:
            before = None
        db = open_read_only(p)
        try:
            result = read(db)
        except sqlite3.DatabaseError:
            if before is None or before[3] or _file_state(p) == before:
                raise
            continue  # the file changed under an immutable read: read it again
        finally:
            db.close()
        if before is None or before[3] or _file_state(p) == before:
            return result
    raise JournalError(f"journal {p}: changed during each of {attempts} reads; run again")


def open_read_only(path: str | Path) -> sqlite3.Connection:
    """A read-only connection to the journal at ``path``; :class:`JournalError` (one line) when it is
    missing, is not a racktwin journal or has another schema version.

    While a process has the journal open, its write-ahead log (``<path>-wal``) exists: the connection
    is then an ordinary read-only one (read it in one transaction for a consistent view, as
    :func:`summarize` does). Without it nothing has the journal open, and the file is opened as
    immutable: a read-only connection would otherwise create the ``-wal`` and ``-shm`` files beside
    it (and leave them, or fail where the folder is not writable)."""
    p = Path(path)
    if not p.exists():
        raise JournalError(f"journal {p}: no such file (the agent's journal.path; has the agent run there?)")
    if not p.is_file():
        raise JournalError(f"journal {p}: not a file")
    if not os.access(p, os.R_OK):  # SQLite would say only "unable to open database file"
        raise JournalError(f"journal {p}: cannot read it (permission denied)")
    in_use = Path(f"{p}-wal").exists()
    uri = f"file:{quote(str(p.resolve()))}?mode=ro" + ("" if in_use else "&immutable=1")
    try:
        db = sqlite3.connect(uri, uri=True, timeout=0.5)
    except sqlite3.Error as exc:
        raise JournalError(f"journal {p}: {exc}") from None
    try:
        tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"meta", "decisions", "commands", "acks"} <= tables:
            raise JournalError(f"journal {p}: not a racktwin journal (no decisions/commands tables)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or row[0] != str(SCHEMA_VERSION):
            found = "none" if row is None else row[0]
            raise JournalError(f"journal {p}: schema version {found}, this racktwin reads {SCHEMA_VERSION}")
        db.execute("SELECT json_extract('{}', '$')")
    except sqlite3.DatabaseError as exc:
        db.close()
        what = "SQLite without JSON functions" if "json_extract" in str(exc) else str(exc)
        raise JournalError(f"journal {p}: {what}") from None
    except BaseException:
        db.close()
        raise
    return db


def command_kind(topic: str) -> str:
    """A command's kind from its topic (``racktwin/v1/{site}/rack/{rack}/cmd`` -> ``rack_cmd``,
    ``.../rack/{rack}/cdu_cmd`` -> ``cdu_cmd``, ``.../facility/cmd`` -> ``facility_cmd``,
    ``.../scheduler/cmd`` -> ``scheduler_cmd``); the last part of the topic otherwise."""
    parts = topic.split("/")
    if len(parts) >= 2 and parts[-1] == "cmd":
        return "rack_cmd" if len(parts) >= 3 and parts[-3] == "rack" else f"{parts[-2]}_cmd"
    return parts[-1]


@dataclass(frozen=True)
class DecisionRow:
    """One journaled decision: its columns and a few fields of its summary."""

    id: int
    cycle: int
    site_time_s: float
    wall_time_s: float
    mode: str
    status: str
    solve_s: float
    summary: dict[str, Any]


@dataclass(frozen=True)
class FailsafeRack:
    """A rack some decisions held at fail-safe caps: in how many decisions, in how many episodes
    (runs of consecutive decisions), and the wall times of the first and last of them."""

    rack: str
    decisions: int
    episodes: int
    first_wall_s: float
    last_wall_s: float


@dataclass(frozen=True)
class JournalSummary:
    path: str
    since_wall_s: float | None  # only decisions (and their commands) from this wall time on
    decisions: int
    first: DecisionRow | None
    last: DecisionRow | None
    statuses: dict[str, int]  # worst first (agent.decision.STATUSES)
    modes: dict[str, int]
    solve_median_s: float
    solve_p99_s: float
    solve_max_s: float
    failsafe: list[FailsafeRack]
    commands_by_state: dict[str, int]
    commands_by_kind: dict[str, dict[str, int]]  # kind -> state -> count
    open_commands: int
    sent_more_than_once: int
    acks_by_result: dict[str, int]  # each acked command once, by its first ack
    repeated_acks: int  # acks after a command's first (copies answered again, second deliveries)
    rejection_reasons: list[tuple[str, int]]  # every reason with its count, the most frequent first
    calibrated_cards: int
    last_calibration_site_s: float | None
    # what the guard changed: per action, how many times it was taken (the most frequent first), in how
    # many decisions it took any, and how many decisions' summaries have no record of it (journaled by a
    # racktwin before Decision.guard_actions, or hand-written)
    guard_actions: dict[str, int] = field(default_factory=dict)
    guard_decisions: int = 0
    guard_unrecorded: int = 0
    recent: list[DecisionRow] = field(default_factory=list)  # newest last

    @property
    def top_rejection_reasons(self) -> list[tuple[str, int]]:
        """The TOP_REASONS most frequent rejection reasons (what the text view lists one by one)."""
        return self.rejection_reasons[:TOP_REASONS]

    @property
    def other_rejections(self) -> int:
        """Rejections whose reason is not among :attr:`top_rejection_reasons` (counted, not reasons)."""
        return sum(n for _, n in self.rejection_reasons[TOP_REASONS:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "journal": self.path,
            "since_wall_s": self.since_wall_s,
            "decisions": self.decisions,
            "first_wall_s": None if self.first is None else self.first.wall_time_s,
            "last_wall_s": None if self.last is None else self.last.wall_time_s,
            "first_site_s": None if self.first is None else self.first.site_time_s,
            "last_site_s": None if self.last is None else self.last.site_time_s,
            "statuses": self.statuses,
            "modes": self.modes,
            "solve_s": {"median": self.solve_median_s, "p99": self.solve_p99_s, "max": self.solve_max_s},
            "failsafe_racks": {
                f.rack: {
                    "decisions": f.decisions,
                    "episodes": f.episodes,
                    "first_wall_s": f.first_wall_s,
                    "last_wall_s": f.last_wall_s,
                }
                for f in self.failsafe
            },
            "commands": {
                "by_state": self.commands_by_state,
                "by_kind": self.commands_by_kind,
                "open": self.open_commands,
                "sent_more_than_once": self.sent_more_than_once,
            },
            "acks": self.acks_by_result,
            "repeated_acks": self.repeated_acks,
            "rejections": {  # every reason (the text view lists the TOP_REASONS most frequent)
                "total": sum(n for _, n in self.rejection_reasons),
                "by_reason": [{"reason": r, "count": n} for r, n in self.rejection_reasons],
            },
            "calibration": {"cards": self.calibrated_cards, "last_site_s": self.last_calibration_site_s},
            "guard": {
                "decisions": self.guard_decisions,
                "actions": self.guard_actions,
                "unrecorded_decisions": self.guard_unrecorded,
            },
            "recent": [_decision_dict(d) for d in self.recent],
        }


def _decision_dict(d: DecisionRow) -> dict[str, Any]:
    return {
        "id": d.id,
        "cycle": d.cycle,
        "site_time_s": d.site_time_s,
        "wall_time_s": d.wall_time_s,
        "mode": d.mode,
        "status": d.status,
        "solve_s": d.solve_s,
        "summary": d.summary,
    }


_DECISION_COLUMNS = "id, cycle, site_time_s, wall_time_s, mode, status, solve_s, summary"
#: Decisions in the order they were journaled, by their wall time (the id breaks ties): SQLite then
#: reads them through the ``decisions_wall`` index; ordered by id it scanned the whole table, every
#: summary included, for ``--since 1h`` too (90 ms on a 30-day journal).
_IN_ORDER = "ORDER BY wall_time_s, id"
_NEWEST_FIRST = "ORDER BY wall_time_s DESC, id DESC"


def _decision(row: tuple[Any, ...]) -> DecisionRow:
    try:
        summary = json.loads(row[7])
    except (TypeError, ValueError):
        summary = {}
    return DecisionRow(
        int(row[0]),
        int(row[1]),
        float(row[2]),
        float(row[3]),
        str(row[4]),
        str(row[5]),
        float(row[6]),
        summary if isinstance(summary, dict) else {},
    )


def guard_action_counts(summary: dict[str, Any]) -> dict[str, int] | None:
    """A decision summary's ``guard_actions`` (action -> times the guard took it; ``{}``: it changed
    nothing); None where the summary has no such record (journaled by a racktwin before it, or
    hand-written), and counts that are not whole numbers above 0 left out."""
    counts = summary.get("guard_actions")
    if not isinstance(counts, dict):
        return None
    return {str(k): n for k, n in counts.items() if isinstance(n, int) and not isinstance(n, bool) and n > 0}


def _guard_totals(rows: list[str | None]) -> tuple[dict[str, int], int, int]:
    """From each decision's ``guard_actions`` as ``json_extract`` gives it (JSON text, None where the
    summary has none): the totals per action (the most frequent first), the decisions with any action,
    the decisions without a record."""
    totals: Counter[str] = Counter()
    changed = unrecorded = 0
    for text in rows:
        if text == "{}":  # the guard changed nothing: most decisions, not decoded
            continue
        try:
            value = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            value = None
        counts = guard_action_counts({"guard_actions": value})
        if counts is None:
            unrecorded += 1
        elif counts:
            changed += 1
            totals.update(counts)
    return dict(sorted(totals.items(), key=lambda kn: (-kn[1], kn[0]))), changed, unrecorded


def _ordered(counts: Counter[str], order: tuple[str, ...]) -> dict[str, int]:
    known = {k: counts[k] for k in order if counts[k]}
    return known | {k: n for k, n in sorted(counts.items()) if k not in known and n}


def _p99(values: list[float]) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


def _failsafe(rows: list[tuple[float, str | None]]) -> list[FailsafeRack]:
    """Fail-safe racks from (wall time, JSON list of rack names) per decision, oldest first."""
    stats: dict[str, list[float]] = {}  # rack -> [decisions, episodes, first, last]
    before: set[str] = set()
    for wall_s, text in rows:
        try:
            now = {str(r) for r in json.loads(text or "[]")}
        except (TypeError, ValueError):
            now = set()
        for rack in now:
            s = stats.setdefault(rack, [0, 0, wall_s, wall_s])
            s[0] += 1
            s[1] += rack not in before
            s[3] = wall_s
        before = now
    return [
        FailsafeRack(rack, int(s[0]), int(s[1]), s[2], s[3])
        for rack, s in sorted(stats.items(), key=lambda kv: (-kv[1][0], kv[0]))
    ]


@contextlib.contextmanager
def _one_read(db: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: every query inside sees the same state of a journal the agent writes."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.execute("ROLLBACK")


def summarize(db: sqlite3.Connection, since_wall_s: float | None = None, recent: int = 5) -> JournalSummary:
    """The journal (from ``since_wall_s`` on, wall clock, when given) condensed; ``recent``: how many
    of the newest decisions to include whole."""
    with _one_read(db):
        return _summarize(db, since_wall_s, recent)


def _summarize(db: sqlite3.Connection, since_wall_s: float | None, recent: int) -> JournalSummary:
    since = -math.inf if since_wall_s is None else since_wall_s
    where = "wall_time_s >= ?"
    decisions = db.execute(
        "SELECT status, mode, solve_s, wall_time_s, "
        "CASE WHEN json_valid(summary) THEN json_extract(summary, '$.failsafe_racks') END, "
        "CASE WHEN json_valid(summary) THEN json_extract(summary, '$.guard_actions') END "
        f"FROM decisions WHERE {where} {_IN_ORDER}",
        (since,),
    ).fetchall()
    statuses: Counter[str] = Counter(str(r[0]) for r in decisions)
    modes: Counter[str] = Counter(str(r[1]) for r in decisions)
    solves = [float(r[2]) for r in decisions]
    first = db.execute(f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE {where} {_IN_ORDER} LIMIT 1", (since,))
    first_row = first.fetchone()
    newest = db.execute(
        f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE {where} {_NEWEST_FIRST} LIMIT ?",
        (since, max(recent, 1)),
    ).fetchall()
    # commands and acks of those decisions; without a start, all of them
    args: tuple[float, ...] = () if since_wall_s is None else (since,)
    in_range = "1" if since_wall_s is None else f"decision_id IN (SELECT id FROM decisions WHERE {where})"
    acks = "1" if since_wall_s is None else f"command_id IN (SELECT command_id FROM commands WHERE {in_range})"
    by_kind: dict[str, Counter[str]] = {}
    by_state: Counter[str] = Counter()
    for topic, state, n in db.execute(
        f"SELECT topic, state, COUNT(*) FROM commands WHERE {in_range} GROUP BY topic, state", args
    ):
        by_kind.setdefault(command_kind(str(topic)), Counter())[str(state)] += int(n)
        by_state[str(state)] += int(n)
    retried = db.execute(f"SELECT COUNT(*) FROM commands WHERE {in_range} AND attempts > 1", args).fetchone()[0]
    # a command's first ack is the rack's answer; later ones answer copies sent again (or are the
    # broker's second delivery): counted apart, and taken out of the results and the reasons (one
    # pass over the few repeated acks serves both; benchmarks/bench_journal.py times it)
    ack_results: Counter[str] = Counter()
    for r, n in db.execute(f"SELECT result, COUNT(*) FROM acks WHERE {acks} GROUP BY result", args):
        ack_results[str(r)] += int(n)
    reason_counts: Counter[str] = Counter()
    for why, n in db.execute(
        f"SELECT COALESCE(reason, ''), COUNT(*) FROM acks WHERE {acks} AND result = 'rejected' GROUP BY 1", args
    ):
        reason_counts[str(why)] += int(n)
    repeated = 0
    for r, why, n in db.execute(
        "SELECT a.result, COALESCE(a.reason, ''), COUNT(*) FROM acks a JOIN (SELECT command_id, MIN(id) AS first "
        f"FROM acks WHERE {acks} GROUP BY command_id HAVING COUNT(*) > 1) m "
        "ON a.command_id = m.command_id AND a.id > m.first GROUP BY 1, 2",
        args,
    ):
        repeated += int(n)
        ack_results[str(r)] -= int(n)
        if r == "rejected":
            reason_counts[str(why)] -= int(n)
    reasons = sorted(((why, n) for why, n in reason_counts.items() if n > 0), key=lambda wn: (-wn[1], wn[0]))
    calibration = db.execute("SELECT COUNT(*), MAX(site_time_s) FROM calibration").fetchone()
    guard_totals, guard_changed, guard_unrecorded = _guard_totals([r[5] for r in decisions])
    return JournalSummary(
        path=str(db.execute("PRAGMA database_list").fetchone()[2]),
        since_wall_s=since_wall_s,
        decisions=len(decisions),
        first=None if first_row is None else _decision(first_row),
        last=_decision(newest[0]) if newest else None,
        statuses=_ordered(statuses, STATUSES),
        modes=dict(sorted(modes.items())),
        solve_median_s=statistics.median(solves) if solves else math.nan,
        solve_p99_s=_p99(solves),
        solve_max_s=max(solves) if solves else math.nan,
        failsafe=_failsafe([(float(r[3]), r[4]) for r in decisions]),
        commands_by_state=_ordered(by_state, _STATE_ORDER),
        commands_by_kind={k: _ordered(c, _STATE_ORDER) for k, c in sorted(by_kind.items())},
        open_commands=sum(by_state[s.value] for s in CommandState if s.open),
        sent_more_than_once=int(retried),
        acks_by_result={r: n for r, n in sorted(ack_results.items()) if n > 0},
        repeated_acks=repeated,
        rejection_reasons=reasons,
        calibrated_cards=int(calibration[0]),
        last_calibration_site_s=None if calibration[1] is None else float(calibration[1]),
        guard_actions=guard_totals,
        guard_decisions=guard_changed,
        guard_unrecorded=guard_unrecorded,
        recent=[_decision(r) for r in reversed(newest[:recent])],
    )


@dataclass(frozen=True)
class CommandRow:
    """One command of a decision: how it ended and the acks it got (result, reason, site time)."""

    command_id: str
    target: str
    kind: str
    state: str
    attempts: int
    issued_s: float
    expires_s: float
    payload: dict[str, Any]
    acks: list[tuple[str, str | None, float]]


@dataclass(frozen=True)
class DecisionDetail:
    decision: DecisionRow
    commands: list[CommandRow]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": _decision_dict(self.decision),
            "commands": [
                {
                    "command_id": c.command_id,
                    "target": c.target,
                    "kind": c.kind,
                    "state": c.state,
                    "attempts": c.attempts,
                    "issued_s": c.issued_s,
                    "expires_s": c.expires_s,
                    "payload": c.payload,
                    "acks": [{"result": r, "reason": why, "site_time_s": t} for r, why, t in c.acks],
                }
                for c in self.commands
            ],
        }


def decision_detail(db: sqlite3.Connection, decision_id: int) -> DecisionDetail | None:
    """One decision with its commands (in the order journaled) and their acks; None when the journal
    has no such decision (never made, or pruned)."""
    with _one_read(db):
        return _decision_detail(db, decision_id)


def _decision_detail(db: sqlite3.Connection, decision_id: int) -> DecisionDetail | None:
    row = db.execute(f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE id = ?", (decision_id,)).fetchone()
    if row is None:
        return None
    acks: dict[str, list[tuple[str, str | None, float]]] = {}
    for cid, result, reason, t in db.execute(
        "SELECT command_id, result, reason, site_time_s FROM acks WHERE command_id IN "
        "(SELECT command_id FROM commands WHERE decision_id = ?) ORDER BY id",
        (decision_id,),
    ):
        acks.setdefault(str(cid), []).append((str(result), None if reason is None else str(reason), float(t)))
    commands = []
    for cid, target, topic, payload, issued, expires, state, attempts in db.execute(
        "SELECT command_id, target, topic, payload, issued_s, expires_s, state, attempts FROM commands "
        "WHERE decision_id = ? ORDER BY rowid",
        (decision_id,),
    ):
        try:
            body = json.loads(bytes(payload))
        except (TypeError, ValueError):
            body = {}
        commands.append(
            CommandRow(
                str(cid),
                str(target),
                command_kind(str(topic)),
                str(state),
                int(attempts),
                float(issued),
                float(expires),
                body if isinstance(body, dict) else {},
                acks.get(str(cid), []),
            )
        )
    return DecisionDetail(_decision(row), commands)
