"""Durable record of decisions, commands, acks and calibrated parameters (SQLite in WAL mode).

The rule (DESIGN.md): what must not be lost is written here *before* it is acted on. A command is
journaled as ``pending`` in the same transaction as the decision that caused it, then published,
then marked ``sent``; its ack marks it ``applied``, ``rejected`` or ``expired``. A restarted agent
calls :meth:`Journal.expire` with the current site time (commands past their expiry are never
re-sent) and re-publishes :meth:`Journal.unacked` commands that are still valid.

Durability: WAL with ``synchronous=NORMAL`` survives a killed process (every committed
transaction is in the WAL file); an operating-system crash may lose the last transactions, which
the expiry of commands makes harmless. Times are site times (the clock in telemetry timestamps),
so expiry works the same against real racks and an accelerated simulator.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import functools
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

SCHEMA_VERSION = 1
#: seconds a write waits for another process's lock on the journal (sqlite's busy timeout; its default,
#: 5 s, blocked the agent's event loop that long per write while e.g. a sqlite3 shell held the lock)
BUSY_TIMEOUT_S = 0.5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cycle INTEGER NOT NULL,
    site_time_s REAL NOT NULL,
    wall_time_s REAL NOT NULL,
    mode TEXT NOT NULL,
    status TEXT NOT NULL,
    solve_s REAL NOT NULL,
    summary TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS commands (
    command_id TEXT PRIMARY KEY,
    decision_id INTEGER REFERENCES decisions(id),
    target TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    issued_s REAL NOT NULL,
    expires_s REAL NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    updated_wall_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS commands_state ON commands(state);
CREATE INDEX IF NOT EXISTS commands_decision ON commands(decision_id);
CREATE INDEX IF NOT EXISTS decisions_wall ON decisions(wall_time_s);
CREATE TABLE IF NOT EXISTS acks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    command_id TEXT NOT NULL,
    site_time_s REAL NOT NULL,
    result TEXT NOT NULL,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS acks_command ON acks(command_id);
CREATE TABLE IF NOT EXISTS calibration (
    card INTEGER PRIMARY KEY,
    r_th_k_per_w REAL NOT NULL,
    leak_scale REAL NOT NULL,
    site_time_s REAL NOT NULL
);
"""


def prune_candidates_sql(max_decisions: int) -> str:
    """The decisions a prune looks at (parameter: the wall-time cut): the oldest by wall time that can
    go, never the newest and never one with an open command. Ordered by ``wall_time_s`` so that SQLite
    walks the ``decisions_wall`` index: ordered by ``id`` it scanned the table by rowid, every summary
    (~1 KB each) included, three times per prune: 0.25 s on the event loop each hour on a 30-day
    journal with nothing to delete (``benchmarks/bench_journal.py``). The decisions kept for an open
    command are skipped here (one lookup each in ``commands_decision``), not counted in the batch:
    when they were, a batch of only such decisions was looked at again each hour and nothing newer
    was ever deleted."""
    return (
        "SELECT d.id FROM decisions d WHERE d.wall_time_s < ? AND d.id < (SELECT MAX(id) FROM decisions) "
        "AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.decision_id = d.id AND c.state IN ('pending', 'sent')) "
        f"ORDER BY d.wall_time_s, d.id LIMIT {int(max_decisions)}"
    )


class CommandState(enum.StrEnum):
    PENDING = "pending"  # journaled, not yet published
    SENT = "sent"  # published at QoS 1, no ack yet
    APPLIED = "applied"
    REJECTED = "rejected"
    EXPIRED = "expired"  # expired before an ack (or acked as expired)
    ABANDONED = "abandoned"  # retries exhausted
    SUPERSEDED = "superseded"  # closed unacked by a newer command for what it set (never sent again)

    @property
    def open(self) -> bool:
        return self in (CommandState.PENDING, CommandState.SENT)


#: states a rack's ack settles for good: a later ack of the same command does not change them
_ANSWERED_STATES = (CommandState.APPLIED.value, CommandState.REJECTED.value)


@dataclass(frozen=True)
class JournaledCommand:
    command_id: str
    decision_id: int | None
    target: str
    topic: str
    payload: bytes
    issued_s: float
    expires_s: float
    state: CommandState
    attempts: int


@dataclass(frozen=True)
class NewCommand:
    """A command about to be published (the journal's view: an id, a topic and bytes)."""

    command_id: str
    target: str
    topic: str
    payload: bytes
    issued_s: float
    expires_s: float


#: The ``meta`` key naming the site layout the calibration rows were saved for (``save_calibration``).
CALIBRATION_LAYOUT_KEY = "calibration_site"


class JournalError(RuntimeError):
    """The journal file cannot be opened or written (disk full, wrong schema, permissions). Every
    ``sqlite3`` error of a :class:`Journal` method (the ``COMMIT`` of a transaction included) and every
    operating-system error of opening it is raised as this."""


class JournalInUseError(JournalError):
    """Another agent holds the journal's lock (``<journal>.lock``): two agents must not decide on one journal."""

    def __init__(self, path: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(f"journal {path} is in use by another racktwin agent ({who})")
        self.path = path
        self.pid = pid


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _journal_errors(method: Callable[Concatenate[Journal, _P], _R]) -> Callable[Concatenate[Journal, _P], _R]:
    """Raise the ``sqlite3`` errors of a :class:`Journal` method as :class:`JournalError`."""

    @functools.wraps(method)
    def wrapper(self: Journal, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from exc

    return wrapper


class Journal:
    """The journal at ``path``. ``lock=True`` (the service) first takes an exclusive lock on
    ``<path>.lock`` (``flock``, held until :meth:`close`; the operating system releases it when the
    process dies) and raises :class:`JournalInUseError` if another process holds it. Readers (tests,
    reports) open it without the lock."""

    def __init__(self, path: str | Path, *, lock: bool = False) -> None:
        self.path = str(path)
        self.lock_path: str | None = None
        self._lock_fd: int | None = None
        self._db: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        #: no open command expires before this site time (-inf: not known yet): :meth:`expire` writes
        #: nothing before it. Kept by this connection's writes (commands are inserted only by
        #: :meth:`record_decision`, and the service's lock keeps other agents out); a command another
        #: connection inserts with an earlier expiry is expired at this time, or after a reopen
        self._first_expiry_s = -math.inf
        memory = self.path == ":memory:"
        try:
            if not memory:
                folder = Path(self.path).parent
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    why = "a file is in the way" if exc.errno in (errno.EEXIST, errno.ENOTDIR) else exc.strerror
                    raise JournalError(f"journal {self.path}: cannot create its folder {folder}: {why or exc}") from exc
                if lock:
                    self._lock()
            try:
                self._db = db = sqlite3.connect(
                    self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
                )
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
            except sqlite3.Error as exc:
                raise JournalError(f"journal {self.path}: {exc}") from exc
            except OSError as exc:
                raise JournalError(f"journal {self.path}: {exc.strerror or exc}") from exc
            version = self.get_meta("schema_version")
            if version is None:
                self.set_meta("schema_version", str(SCHEMA_VERSION))
            elif version != str(SCHEMA_VERSION):
                raise JournalError(f"journal {self.path}: schema version {version}, this agent writes {SCHEMA_VERSION}")
            if not memory:
                with contextlib.suppress(OSError):
                    st = os.stat(self.path)
                    self._identity = (st.st_dev, st.st_ino)
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        lock_path = self.path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise JournalError(
                f"journal {self.path}: cannot open its lock file {lock_path}: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder: int | None = None
            with contextlib.suppress(OSError, ValueError):
                holder = int(os.pread(fd, 32, 0).decode("ascii").strip())
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise JournalInUseError(self.path, holder) from None
            raise JournalError(f"journal {self.path}: cannot lock {lock_path}: {exc.strerror or exc}") from exc
        with contextlib.suppress(OSError):  # who holds it, for the error message of the next one
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._lock_fd = fd
        self.lock_path = lock_path

    def close(self) -> None:
        """Close the database, then release the lock (if taken). Closing twice is harmless."""
        db, self._db = self._db, None
        try:
            if db is not None:
                db.close()
        finally:
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)  # releases the flock

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        return self._db

    def file_problem(self) -> str | None:
        """What is wrong with the journal file on disk (None: nothing): it was removed, or another file
        now has its path (what is written goes to the open, unlinked file and is lost)."""
        if self._identity is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"journal file {self.path} was removed or replaced: decisions are not being kept"
        except OSError as exc:
            return f"journal file {self.path} cannot be checked ({exc.strerror or exc}): decisions may not be kept"
        if (st.st_dev, st.st_ino) != self._identity:
            return f"journal file {self.path} was removed or replaced: decisions are not being kept"
        return None

    # ---- meta -----------------------------------------------------------------------------------
    @_journal_errors
    def get_meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @_journal_errors
    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    # ---- decisions and commands -------------------------------------------------------------------
    @_journal_errors
    def record_decision(
        self,
        cycle: int,
        site_time_s: float,
        mode: str,
        status: str,
        solve_s: float,
        summary: dict[str, Any],
        commands: Sequence[NewCommand] = (),
    ) -> int:
        """Write a decision and the commands it causes (state ``pending``) in one transaction."""
        now = time.time()
        try:
            with self._transaction():
                cur = self._conn.execute(
                    "INSERT INTO decisions(cycle, site_time_s, wall_time_s, mode, status, solve_s, summary) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (cycle, site_time_s, now, mode, status, solve_s, summary_json(summary)),
                )
                decision_id = int(cur.lastrowid or 0)
                self._conn.executemany(
                    "INSERT INTO commands(command_id, decision_id, target, topic, payload, issued_s, expires_s, "
                    "state, attempts, updated_wall_s) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?)",
                    [
                        (c.command_id, decision_id, c.target, c.topic, c.payload, c.issued_s, c.expires_s, now)
                        for c in commands
                    ],
                )
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from None
        self._first_expiry_s = min([self._first_expiry_s, *(c.expires_s for c in commands)])
        return decision_id

    @_journal_errors
    def mark_sent(self, command_ids: Iterable[str]) -> None:
        now = time.time()
        with self._transaction():
            self._conn.executemany(
                "UPDATE commands SET state = CASE WHEN state IN ('pending', 'sent') THEN 'sent' ELSE state END, "
                "attempts = attempts + 1, updated_wall_s = ? WHERE command_id = ?",
                [(now, cid) for cid in command_ids],
            )

    def record_ack(self, command_id: str, site_time_s: float, result: str, reason: str | None = None) -> bool:
        """Record an ack; returns False for an unknown command id (another agent's, or forged)."""
        return self.record_acks([(command_id, site_time_s, result, reason)])[0]

    @_journal_errors
    def record_acks(self, acks: Sequence[tuple[str, float, str, str | None]]) -> list[bool]:
        """Record acks ``(command_id, site_time_s, result, reason)`` in one transaction; for each,
        whether its command is known (False: another agent's, or forged; nothing is written for it).
        Every ack of a known command is kept; the command takes the ack's result unless a rack had
        already answered it ``applied`` or ``rejected``: a later ack (to a copy sent again, or one
        the broker delivered twice) does not undo what the rack did."""
        state = {"applied": CommandState.APPLIED, "rejected": CommandState.REJECTED, "expired": CommandState.EXPIRED}
        for _cid, _t, result, _r in acks:
            if result not in state:
                raise ValueError(f"unknown ack result {result!r}")
        known: list[bool] = []
        now = time.time()
        with self._transaction():
            for command_id, site_time_s, result, reason in acks:
                # one statement for the usual ack (an open command); a lookup only when it changed nothing
                cur = self._conn.execute(
                    "UPDATE commands SET state = ?, updated_wall_s = ? WHERE command_id = ? AND state NOT IN (?, ?)",
                    (state[result].value, now, command_id, *_ANSWERED_STATES),
                )
                is_known = cur.rowcount > 0 or (
                    self._conn.execute("SELECT 1 FROM commands WHERE command_id = ?", (command_id,)).fetchone()
                    is not None
                )
                known.append(is_known)
                if is_known:
                    self._conn.execute(
                        "INSERT INTO acks(command_id, site_time_s, result, reason) VALUES (?, ?, ?, ?)",
                        (command_id, site_time_s, result, reason),
                    )
        return known

    @_journal_errors
    def expire(self, site_time_s: float) -> int:
        """Mark open commands past their expiry as expired; returns how many. Before the first expiry
        of the open commands nothing is written (no transaction: the publisher calls this every
        0.25 s, and an empty one still takes the write lock, waiting up to the busy timeout for
        another process that holds it)."""
        if site_time_s < self._first_expiry_s:
            return 0
        with self._transaction():
            cur = self._conn.execute(
                "UPDATE commands SET state = 'expired', updated_wall_s = ? "
                "WHERE state IN ('pending', 'sent') AND expires_s <= ?",
                (time.time(), site_time_s),
            )
            expired = int(cur.rowcount)
            first = self._conn.execute(
                "SELECT MIN(expires_s) FROM commands WHERE state IN ('pending', 'sent')"
            ).fetchone()[0]
        self._first_expiry_s = math.inf if first is None else float(first)
        return expired

    @_journal_errors
    def expire_commands(self, command_ids: Iterable[str]) -> None:
        """Mark open commands expired before their expiry: the site clock stepped back past their
        issue, and no rack applies them now (``CommandBook.expire``)."""
        self._close_open(command_ids, CommandState.EXPIRED)

    @_journal_errors
    def abandon(self, command_ids: Iterable[str]) -> None:
        """Close open commands whose retries ran out."""
        self._close_open(command_ids, CommandState.ABANDONED)

    @_journal_errors
    def supersede(self, command_ids: Iterable[str]) -> None:
        """Close open commands a newer command for what they set replaced (never sent again)."""
        self._close_open(command_ids, CommandState.SUPERSEDED)

    def _close_open(self, command_ids: Iterable[str], state: CommandState) -> None:
        with self._transaction():
            self._conn.executemany(
                "UPDATE commands SET state = ?, updated_wall_s = ? "
                "WHERE command_id = ? AND state IN ('pending', 'sent')",
                [(state.value, time.time(), cid) for cid in command_ids],
            )

    @_journal_errors
    def unacked(self, site_time_s: float) -> list[JournaledCommand]:
        """Open commands (pending or sent) that have not expired at ``site_time_s``, oldest first."""
        rows = self._conn.execute(
            "SELECT command_id, decision_id, target, topic, payload, issued_s, expires_s, state, attempts "
            "FROM commands WHERE state IN ('pending', 'sent') AND expires_s > ? ORDER BY issued_s, rowid",
            (site_time_s,),
        ).fetchall()
        return [_command(r) for r in rows]

    @_journal_errors
    def command(self, command_id: str) -> JournaledCommand | None:
        row = self._conn.execute(
            "SELECT command_id, decision_id, target, topic, payload, issued_s, expires_s, state, attempts "
            "FROM commands WHERE command_id = ?",
            (command_id,),
        ).fetchone()
        return None if row is None else _command(row)

    @_journal_errors
    def command_counts(self) -> dict[str, int]:
        rows = self._conn.execute("SELECT state, COUNT(*) FROM commands GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}

    @_journal_errors
    def last_decision(self) -> tuple[int, float, dict[str, Any]] | None:
        """(cycle, site time, summary) of the newest decision, or None."""
        row = self._conn.execute(
            "SELECT cycle, site_time_s, summary FROM decisions ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        return int(row[0]), float(row[1]), json.loads(row[2])

    @_journal_errors
    def decision_count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])

    @_journal_errors
    def prune(self, before_wall_s: float, max_decisions: int = 5000) -> tuple[int, int, int, int]:
        """Delete what is journaled before ``before_wall_s`` (wall clock) and no longer needed: closed
        commands (applied, rejected, expired, abandoned, superseded) with their acks, and decisions none of whose
        commands is still open. Open commands, their decisions and the newest decision (the cycle count
        continues from it after a restart) are always kept. At most the ``max_decisions`` oldest
        decisions that can go are looked at per call (a short transaction; those kept for an open
        command are passed over, not counted). Returns (decisions, commands, acks) deleted and the
        number of decisions looked at: while that is ``max_decisions``, there may be more to delete
        (call again). SQLite reuses the freed pages; the file does not shrink."""
        old = prune_candidates_sql(max_decisions)
        closed = f"decision_id IN ({old}) AND state NOT IN ('pending', 'sent')"
        try:
            with self._transaction():
                looked_at = self._conn.execute(f"SELECT COUNT(*) FROM ({old})", (before_wall_s,)).fetchone()[0]
                acks = self._conn.execute(
                    f"DELETE FROM acks WHERE command_id IN (SELECT command_id FROM commands WHERE {closed})",
                    (before_wall_s,),
                ).rowcount
                commands = self._conn.execute(f"DELETE FROM commands WHERE {closed}", (before_wall_s,)).rowcount
                decisions = self._conn.execute(
                    f"DELETE FROM decisions WHERE id IN ({old}) "
                    "AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.decision_id = decisions.id)",
                    (before_wall_s,),
                ).rowcount
        except sqlite3.Error as exc:
            raise JournalError(f"journal {self.path}: {exc}") from None
        return int(decisions), int(commands), int(acks), int(looked_at)

    # ---- calibration ------------------------------------------------------------------------------
    @_journal_errors
    def save_calibration(
        self,
        cards: npt.NDArray[np.int64],
        r_th_k_per_w: npt.NDArray[np.float64],
        leak_scale: npt.NDArray[np.float64],
        site_time_s: float,
        layout: str | None = None,
    ) -> None:
        """Each card's calibration, stamped ``site_time_s``. ``layout`` (what a card number means on the
        site, ``agent.resume.site_layout`` as JSON) is kept with it: rows saved for another layout are
        dropped first, as their card numbers mean other cards now."""
        with self._transaction():
            if layout is not None:
                row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (CALIBRATION_LAYOUT_KEY,)).fetchone()
                if row is not None and str(row[0]) != layout:
                    self._conn.execute("DELETE FROM calibration")
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (CALIBRATION_LAYOUT_KEY, layout)
                )
            self._conn.executemany(
                "INSERT OR REPLACE INTO calibration(card, r_th_k_per_w, leak_scale, site_time_s) VALUES (?, ?, ?, ?)",
                [
                    (int(c), float(r), float(k), site_time_s)
                    for c, r, k in zip(cards, r_th_k_per_w, leak_scale, strict=True)
                ],
            )

    @_journal_errors
    def load_calibration(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        rows = self._conn.execute("SELECT card, r_th_k_per_w, leak_scale FROM calibration ORDER BY card").fetchall()
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
        arr = np.asarray(rows, dtype=np.float64)
        return arr[:, 0].astype(np.int64), arr[:, 1].copy(), arr[:, 2].copy()

    # ---- internals ----------------------------------------------------------------------------------
    def _transaction(self) -> _Tx:
        return _Tx(self._conn)


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:  # e.g. disk full: the transaction must not stay open (the next BEGIN fails)
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise
        else:
            with contextlib.suppress(sqlite3.Error):  # the error that got us here is the one to raise
                self._db.execute("ROLLBACK")


def _command(row: Sequence[Any]) -> JournaledCommand:
    return JournaledCommand(
        command_id=str(row[0]),
        decision_id=None if row[1] is None else int(row[1]),
        target=str(row[2]),
        topic=str(row[3]),
        payload=bytes(row[4]),
        issued_s=float(row[5]),
        expires_s=float(row[6]),
        state=CommandState(row[7]),
        attempts=int(row[8]),
    )


def summary_json(summary: dict[str, Any]) -> str:
    """A decision's summary as strict JSON: numpy values as Python's, non-finite numbers as null
    (``json.dumps`` writes NaN and Infinity, which SQLite's JSON functions and other readers refuse:
    one such summary made ``racktwin journal`` fail on the whole journal)."""
    return json.dumps(_finite(summary), default=_json_default, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _finite(obj.tolist())
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    return obj


def _json_default(obj: object) -> Any:
    if isinstance(obj, np.generic):  # numpy integers and booleans (_finite turned arrays and floats)
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
