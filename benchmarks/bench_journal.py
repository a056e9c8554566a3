"""Journal benchmark: what the agent's journal writes cost its event loop (they run on it).

    python benchmarks/bench_journal.py              # 30 days of history for the prune, 5 repeats
    python benchmarks/bench_journal.py --days 3     # a quicker prune part

Measures, on a journal in a temporary folder (WAL, synchronous=NORMAL, as the agent opens it):

* ``record_decision`` by the number of commands of the decision (median and max of ``--repeats``);
* acks: ``--acks`` acks written one transaction each (``record_ack``, how the agent wrote them until
  2026-12-01) against one transaction for the burst (``record_acks``), side by side, and the ratio;
* a write while another connection holds the write lock (a ``sqlite3`` shell inside a transaction):
  how long it waits before it fails (the busy timeout, ``agent.journal.BUSY_TIMEOUT_S``);
* the hourly prune on ``--days`` of history (one decision per 15 s, 10 commands and acks each) with
  nothing to delete (the steady state) and deleting the oldest 5,000 decisions (a prune's batch), with the index on
  ``acks(command_id)`` and without it (dropped on a copy of the same file), side by side;
* ``racktwin journal`` on that history (``agent.journal_report.summarize``, whole and ``--since 1h``;
  ``decision_detail``), and the summary's per-decision fields read with SQLite's ``json_extract``
  against decoding every decision's summary in Python (the alternative), side by side; and the acks
  by result counting each command once (by its first ack; 1% of the history's commands have a
  second ack, as a copy sent again gets) as the report does it, all acks less the repeated ones,
  against selecting each command's first ack (``MIN(id)`` per command), side by side.

Prints Markdown tables (machine, date, command first); paste them into benchmarks/results-agent.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.journal import BUSY_TIMEOUT_S, Journal, JournalError, NewCommand  # noqa: E402
from agent.journal_report import decision_detail, open_read_only, summarize  # noqa: E402

_PAYLOAD = b"p" * 300  # about a rack command's size


def _commands(n: int, t_s: float) -> list[NewCommand]:
    return [
        NewCommand(str(uuid.uuid4()), f"r{k % 8}", f"racktwin/v1/site1/rack/r{k % 8}/cmd", _PAYLOAD, t_s, t_s + 30.0)
        for k in range(n)
    ]


def decision_writes(folder: Path, sizes: list[int], repeats: int) -> list[tuple[int, float, float]]:
    j = Journal(folder / "decisions.sqlite")
    rows = []
    cycle = 0
    for n in sizes:
        times = []
        for _ in range(repeats):
            cycle += 1
            cmds = _commands(n, float(cycle))
            t0 = time.perf_counter()
            j.record_decision(cycle, float(cycle), "enforce", "optimal", 0.1, {"commands": n}, cmds)
            times.append(time.perf_counter() - t0)
        rows.append((n, statistics.median(times), max(times)))
    j.close()
    return rows


def ack_writes(folder: Path, n_acks: int, repeats: int) -> tuple[float, float]:
    """Median seconds to journal ``n_acks`` acks one transaction each, and in one transaction."""
    j = Journal(folder / "acks.sqlite")
    one_by_one, batched = [], []
    for r in range(repeats):
        for mode in ("one", "batch"):
            cmds = _commands(n_acks, float(r))
            j.record_decision(2 * r + (mode == "batch"), float(r), "enforce", "optimal", 0.1, {}, cmds)
            acks = [(c.command_id, float(r) + 1.0, "applied", None) for c in cmds]
            t0 = time.perf_counter()
            if mode == "one":
                for a in acks:
                    j.record_ack(*a)
                one_by_one.append(time.perf_counter() - t0)
            else:
                j.record_acks(acks)
                batched.append(time.perf_counter() - t0)
    j.close()
    return statistics.median(one_by_one), statistics.median(batched)


def locked_write(folder: Path, repeats: int) -> float:
    """Median seconds a write waits, while another connection holds the write lock, before it fails."""
    path = folder / "locked.sqlite"
    j = Journal(path)
    waits = []
    for r in range(repeats):
        holder = sqlite3.connect(path, isolation_level=None, timeout=0.0)
        holder.execute("BEGIN IMMEDIATE")
        t0 = time.perf_counter()
        try:
            j.record_acks([("x", float(r), "applied", None)])
        except JournalError:
            waits.append(time.perf_counter() - t0)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    j.close()
    return statistics.median(waits) if waits else float("nan")


def _summary(i: int) -> str:
    """A decision's journaled summary as the agent writes it on the 512-card example (~1 KB; one
    decision in a hundred with a rack at fail-safe caps)."""
    racks = [f"r{r}" for r in range(8)]
    return json.dumps(
        {
            "cycle": i,
            "time_s": i * 15.0,
            "status": "optimal",
            "plan_status": "optimal",
            "source": "milp",
            "solve_time_s": 0.05,
            "supply_temp_c": 45.0,
            "pump_speed_pct": [58.3] * 8,
            "failsafe_racks": racks[i % 8 : i % 8 + 1] if i % 100 == 0 else [],
            "guard_actions": {"failsafe_caps": 1} if i % 100 == 0 else {},
            "busy_cards": 296,
            "low_power_cards": 208,
            "hosts_off": 25,
            "busy_levels": {"0": 104, "1": 192},
            "capped_cards": 0,
            "placements": {},
            "queue_waits": {},
            "queue_waits_by_kind": {},
            "predicted_rack_power_w": [41234.5] * 8,
            "budget_rack_power_w": [42345.6] * 8,
            "rack_cap_w": [49000.0] * 8,
            "predicted_it_power_w": 331234.5,
            "predicted_facility_power_w": 346123.4,
            "predicted_pue": 1.04496,
            "explanation": [
                "plan optimal (milp) in 0.062 s at supply 45 deg C",
                "pumps at 58, 58, 58, 58, 42, 33, 33, 33% (saves ~5,268 W)",
                "hosts: 25 off (1 powering off, 0 on again)",
            ],
        }
    )


def build_history(path: Path, days: float, per_decision: int = 10) -> tuple[int, int, float]:
    """``days`` of decisions (one per 15 s, each with its ~1 KB summary) up to now, each with commands
    and acks; (decisions, acks, wall time of the first)."""
    j = Journal(path)
    db = j._conn
    n_dec = int(days * 86_400 / 15)
    now = time.time()
    start = now - days * 86_400
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO decisions(cycle, site_time_s, wall_time_s, mode, status, solve_s, summary) VALUES (?,?,?,?,?,?,?)",
        [(i, i * 15.0, start + i * 15.0, "enforce", "optimal", 0.1, _summary(i)) for i in range(n_dec)],
    )
    cmds, acks = [], []
    for d in range(1, n_dec + 1):
        for k in range(per_decision):
            cid = f"{d:09d}-{k:04d}-{'x' * 22}"
            cmds.append((cid, d, "r0", "racktwin/v1/site1/rack/r0/cmd", _PAYLOAD, 0.0, 1.0, "applied", 1, now))
            acks.append((cid, 1.0, "applied", None))
            if k == 0 and d % 10 == 0:  # a copy sent again, answered again
                acks.append((cid, 2.0, "applied", f"duplicate: command {cid} was applied before; not applied again"))
    db.executemany(
        "INSERT INTO commands(command_id, decision_id, target, topic, payload, issued_s, expires_s, state, attempts, "
        "updated_wall_s) VALUES (?,?,?,?,?,?,?,?,?,?)",
        cmds,
    )
    db.executemany("INSERT INTO acks(command_id, site_time_s, result, reason) VALUES (?,?,?,?)", acks)
    db.execute("COMMIT")
    j.close()
    return n_dec, len(acks), start


def prune_times(path: Path, index: bool, repeats: int, start: float) -> tuple[float, float]:
    """(seconds to prune with nothing to delete: median; seconds to delete the oldest 5,000 decisions)."""
    j = Journal(path)
    if not index:
        j._conn.execute("DROP INDEX acks_command")  # as journals were before 2026-12-01
    t0 = time.perf_counter()
    j.prune(start + 5000 * 15.0, 5000)
    first = time.perf_counter() - t0
    idle = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        j.prune(time.time() - 400 * 86_400, 5000)  # nothing that old: the steady state
        idle.append(time.perf_counter() - t0)
    j.close()
    return statistics.median(idle), first


def _acks_less_repeated(db: sqlite3.Connection) -> dict[str, int]:
    """Acks by result, each command once: all acks less those after a command's first (the report's way)."""
    counts = {str(r): int(n) for r, n in db.execute("SELECT result, COUNT(*) FROM acks GROUP BY result")}
    for r, n in db.execute(
        "SELECT a.result, COUNT(*) FROM acks a JOIN (SELECT command_id, MIN(id) AS first FROM acks "
        "GROUP BY command_id HAVING COUNT(*) > 1) m ON a.command_id = m.command_id AND a.id > m.first GROUP BY 1"
    ):
        counts[str(r)] -= int(n)
    return counts


def report_times(path: Path, repeats: int) -> dict[str, float]:
    """Medians of ``racktwin journal`` on the history: the whole summary, ``--since 1h``, one decision;
    and the per-decision fields read by json_extract (as summarize does) vs decoded in Python."""
    db = open_read_only(path)
    times: dict[str, list[float]] = {
        k: [] for k in ("all", "since_1h", "decision", "sql_json", "python_json", "less_repeated", "first_ack")
    }
    last = int(db.execute("SELECT MAX(id) FROM decisions").fetchone()[0])
    for _ in range(repeats):
        for key, call in (
            ("all", lambda: summarize(db)),
            ("since_1h", lambda: summarize(db, since_wall_s=time.time() - 3600.0)),
            ("decision", lambda: decision_detail(db, last)),
            (
                "sql_json",
                lambda: db.execute("SELECT json_extract(summary, '$.failsafe_racks') FROM decisions").fetchall(),
            ),
            (
                "python_json",
                lambda: [json.loads(r[0])["failsafe_racks"] for r in db.execute("SELECT summary FROM decisions")],
            ),
            ("less_repeated", lambda: _acks_less_repeated(db)),
            (
                "first_ack",
                lambda: db.execute(
                    "SELECT result, COUNT(*) FROM acks WHERE id IN (SELECT MIN(id) FROM acks GROUP BY command_id) "
                    "GROUP BY result"
                ).fetchall(),
            ),
        ):
            t0 = time.perf_counter()
            call()
            times[key].append(time.perf_counter() - t0)
    db.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=30.0, help="days of history for the prune (default 30)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per measurement (medians)")
    ap.add_argument("--acks", type=int, default=500, help="acks in the burst (default 500)")
    args = ap.parse_args()
    if args.days * 86_400 / 15 < 10_000 or args.repeats < 1 or args.acks < 1:
        ap.error("--days must hold 10,000 decisions at least (2 days), --repeats and --acks be at least 1")
    print(
        f"{platform.node() or 'vm'} | {platform.processor() or platform.machine()} | {os.cpu_count()} CPUs | "
        f"Python {platform.python_version()} | SQLite {sqlite3.sqlite_version} | {dt.datetime.now():%Y-%m-%d %H:%M}"
    )
    print(f"\ncommand: python benchmarks/bench_journal.py {' '.join(sys.argv[1:])}\n")
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as tmp_s:
        tmp = Path(tmp_s)
        print("| commands in the decision | record_decision: median | max |")
        print("|---|---|---|")
        for n, med, mx in decision_writes(tmp, [10, 100, 1000, 5000], args.repeats):
            print(f"| {n:,} | {1e3 * med:.1f} ms | {1e3 * mx:.1f} ms |")
        one, batch = ack_writes(tmp, args.acks, args.repeats)
        print(f"\n| {args.acks} acks | one transaction each | one transaction | ratio |")
        print("|---|---|---|---|")
        print(f"| medians of {args.repeats} | {1e3 * one:.1f} ms | {1e3 * batch:.1f} ms | {one / batch:.1f}x |")
        wait = locked_write(tmp, min(args.repeats, 3))
        print(f"\nA write while another connection holds the write lock fails after {wait:.2f} s (busy timeout "
              f"{BUSY_TIMEOUT_S} s; SQLite's default is 5 s).\n")  # fmt: skip
        print(f"building {args.days:g} days of history ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        indexed = tmp / "history.sqlite"
        n_dec, n_acks, start = build_history(indexed, args.days)
        bare = tmp / "history-no-index.sqlite"
        shutil.copyfile(indexed, bare)
        size_gb = indexed.stat().st_size / 1e9
        print(f"built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        with_idx = prune_times(indexed, True, args.repeats, start)
        without = prune_times(bare, False, args.repeats, start)
        print(f"| prune, {n_dec:,} decisions, {n_acks:,} acks ({size_gb:.2f} GB) | nothing to delete: median | "
              "deleting 5,000 decisions |")  # fmt: skip
        print("|---|---|---|")
        print(f"| index on acks(command_id) | {1e3 * with_idx[0]:.1f} ms | {1e3 * with_idx[1]:.0f} ms |")
        print(f"| no index (before 2026-12-01) | {1e3 * without[0]:.1f} ms | {1e3 * without[1]:.0f} ms |")
        rep = report_times(indexed, args.repeats)
        with sqlite3.connect(indexed) as count_db:
            n_left = int(count_db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])
        print(f"\n| racktwin journal on that history (medians of {args.repeats}) | time |")
        print("|---|---|")
        print(f"| summary of all {n_left:,} decisions (after the prune above) | {rep['all']:.2f} s |")
        print(f"| summary, --since 1h | {1e3 * rep['since_1h']:.0f} ms |")
        print(f"| --decision ID (10 commands) | {1e3 * rep['decision']:.1f} ms |")
        print(
            f"| every decision's failsafe_racks: json_extract in SQLite / json.loads in Python | "
            f"{rep['sql_json']:.2f} s / {rep['python_json']:.2f} s ({rep['python_json'] / rep['sql_json']:.1f}x) |"
        )
        less, first = rep["less_repeated"], rep["first_ack"]
        print(
            f"| acks by result, each command once: all less the repeated / each command's first ack | "
            f"{less:.2f} s / {first:.2f} s ({first / less:.1f}x) |"
        )


if __name__ == "__main__":
    main()
