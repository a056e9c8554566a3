"""``racktwin journal``: what the agent did, from its journal (read-only, safe while it runs).

The journal is the agent's ``journal.path`` (``--config FILE``, environment overrides included) or
``--journal PATH``. Without ``--decision`` it prints a summary: decisions by status and mode, solve
times, racks held at fail-safe caps (in how many decisions and episodes, first and last time), what
the guard changed (in how many decisions, each action with its count), how the commands ended by
kind, commands still open, rejection reasons, calibration, and the newest decisions with the guard's
actions and their explanations. ``--since`` keeps only the decisions from then on (wall clock)
and their commands. ``--decision ID`` prints one decision with each of its commands, how it ended
and its acks. ``--json`` prints the same as one JSON object. What each exit status means:
:data:`EXIT_STATUSES` (``--help`` and the README's "Exit statuses" give its words).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import sqlite3
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.journal_report import DecisionDetail, DecisionRow, JournalSummary

from agent.commands.common import UserError, path_arg, print_json, sigterm_interrupts

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: site times (the telemetry's clock, epoch seconds) from this on (2001-09-09) are dates (real racks, the
#: simulator's default clock); below, a clock started near 0 (``racktwin sim --start-epoch-s 0``, whose
#: site time is then the seconds since the run's start)
_EPOCH_SITE_S = 1.0e9
#: the largest decision id (and number of decisions) SQLite can hold (a signed 64-bit integer)
_MAX_ID = 2**63 - 1

#: what each exit status of ``racktwin journal`` means, as its ``--help`` and the README (Command line) say it
EXIT_STATUSES = (
    "Exit status 0 after the summary or the decision; 2 for a journal that is missing or is not a "
    "racktwin journal, a decision it does not hold, a configuration it cannot read or a bad option (one "
    "line on stderr); 130 when stopped by Ctrl-C or SIGTERM; 141 when the reader of its output went away before "
    "all of it was written (`| head`)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = (
        "What the agent did, read from its journal (read-only; safe while the agent runs): decisions by "
        "status, solve times, racks held at fail-safe caps, what the guard changed (its actions, counted), "
        "how the commands ended by kind, rejection reasons, and the newest decisions with their explanations."
    )
    parser.epilog = (
        f"{EXIT_STATUSES} "
        "examples: racktwin journal --config /etc/racktwin/agent.toml --since 2h; "
        "racktwin journal --journal out/demo/journal.sqlite --decision 120 --json"
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--config", type=path_arg, metavar="FILE", help="agent configuration whose journal.path to read")
    src.add_argument("--journal", type=path_arg, metavar="PATH", help="the journal file itself (SQLite)")
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only decisions from then on: a duration back from now (90s, 30m, 2h, 7d) or a UTC time "
        "(2026-12-01T10:00, or with an offset: 2026-12-01T10:00+01:00); not with --decision",
    )
    parser.add_argument(
        "--last",
        type=int,
        metavar="N",
        help="newest decisions shown with their explanation, 0 or more (default 5; not with --decision)",
    )
    parser.add_argument("--decision", type=int, metavar="ID", help="one decision (its id) with its commands and acks")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text")


def parse_since(text: str, now_s: float) -> float:
    """Wall time (s since the epoch) of ``--since``: a duration back from ``now_s`` or a time (UTC
    unless it names an offset)."""
    m = _DURATION.match(text)
    if m:
        return _in_range(now_s - float(m.group(1)) * _UNIT_S[m.group(2)], text)
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(
            f"--since {text!r}: give a duration back from now (90s, 30m, 2h, 7d) or a time (2026-12-01T10:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return _in_range(when.timestamp(), text)


def _in_range(t_s: float, text: str) -> float:
    try:
        dt.datetime.fromtimestamp(t_s, dt.UTC)
    except (ValueError, OverflowError, OSError):
        raise UserError(f"--since {text!r}: out of the range of dates (years 1 to 9999)") from None
    return t_s


def _journal_path(args: argparse.Namespace) -> str:
    if args.journal is not None:
        return str(args.journal)
    if args.config is None:
        raise UserError("give the journal: --config FILE (the agent's configuration) or --journal PATH")
    from agent.commands.agent_cmd import config_read
    from agent.config import journal_path_of

    return config_read(args.config, journal_path_of)  # a reader needs no write access, secrets or site spec


def run(args: argparse.Namespace, command: str) -> int:
    with sigterm_interrupts():  # as Ctrl-C: exit status 130 with one line, not killed without a word
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from agent.journal import JournalError
    from agent.journal_report import decision_detail, read_journal, summarize

    if args.decision is not None and (args.since is not None or args.last is not None):
        given = " and ".join(o for o, v in (("--since", args.since), ("--last", args.last)) if v is not None)
        raise UserError(f"{given} cannot be combined with --decision (it shows one decision, whatever its time)")
    last_n = 5 if args.last is None else args.last
    if last_n < 0:
        raise UserError(f"--last {last_n}: must be 0 or more")
    last = min(last_n, _MAX_ID)  # more than the journal holds is all of it
    if args.decision is not None and args.decision < 1:
        raise UserError(f"--decision {args.decision}: must be 1 or more (the journal numbers decisions from 1)")
    since = None if args.since is None else parse_since(args.since, time.time())
    path = _journal_path(args)
    if args.decision is not None:
        wanted = args.decision
        try:  # the journal is opened (and checked) whatever the id: one beyond SQLite's integers is none
            detail = read_journal(path, lambda db: decision_detail(db, wanted) if wanted <= _MAX_ID else None)
        except JournalError as exc:
            raise UserError(str(exc)) from None
        except sqlite3.Error as exc:
            raise UserError(f"journal {path}: {exc}") from None
        if detail is None:
            raise UserError(f"journal {path}: no decision {args.decision} (never made, or pruned)")
        if args.json:
            print_json(detail.to_dict())
        else:
            print(format_detail(detail))
        return 0
    try:
        summary = read_journal(path, lambda db: summarize(db, since_wall_s=since, recent=last))
    except JournalError as exc:
        raise UserError(str(exc)) from None
    except sqlite3.Error as exc:
        raise UserError(f"journal {path}: {exc}") from None
    if args.json:
        print_json(summary.to_dict())
    else:
        print(format_summary(summary))
    return 0


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------


def wall_time(t_s: float) -> str:
    return dt.datetime.fromtimestamp(t_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def site_time(t_s: float) -> str:
    """A point on the site clock: a UTC date (``2026-12-05 11:56:11 UTC``), or below ``_EPOCH_SITE_S``
    the seconds on a clock started near 0 (``t=7,200 s``, as the simulator's progress lines and the
    evaluation's anomalies write it; ``2:00:00`` read as two o'clock, not two hours into the run)."""
    if t_s >= _EPOCH_SITE_S:
        return dt.datetime.fromtimestamp(t_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"t={t_s:,.0f} s"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in counts.items()) or "none"


def _n(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _secs(t_s: float) -> str:
    return "-" if math.isnan(t_s) else f"{t_s:.3f} s"


def _number(value: object) -> float | None:
    """A summary's number, or None where it is missing or not a number (summaries are JSON a
    hand or an older agent may have written)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _decision_line(d: DecisionRow) -> str:
    s = d.summary
    parts = [f"#{d.id}", wall_time(d.wall_time_s), f"(site {site_time(d.site_time_s)})", d.status]
    source = s.get("source")
    if source is not None and source != d.status:
        parts.append(str(source))
    if d.solve_s > 0:
        parts.append(f"solve {d.solve_s:.3f} s")
    for key, label in (("busy_cards", "busy"), ("low_power_cards", "low-power"), ("hosts_off", "hosts off")):
        if (n := _number(s.get(key))) is not None:
            parts.append(f"{label} {n:g}")
    if (supply := _number(s.get("supply_temp_c"))) is not None:
        parts.append(f"supply {supply:g} degC")
    if (pue := _number(s.get("predicted_pue"))) is not None:
        parts.append(f"PUE {pue:.4f}")
    racks = s.get("failsafe_racks")
    if racks and isinstance(racks, list):
        parts.append("fail-safe " + ",".join(str(r) for r in racks))
    return "  ".join(parts)


def _guard_line(d: DecisionRow) -> list[str]:
    """``guard actions: ...`` (each action the guard took, with how many times) where it changed the
    decision; nothing where it did not, or the summary has no record of it (an older journal)."""
    from agent.journal_report import guard_action_counts

    counts = guard_action_counts(d.summary)
    return [f"guard actions: {_counts(counts)}"] if counts else []


def _guard_totals(s: JournalSummary) -> str:
    text = (
        f"{_n(s.guard_decisions, 'decision')} changed: {_counts(s.guard_actions)}"
        if s.guard_decisions
        else "no decision changed"
    )
    if s.guard_unrecorded:
        text += f"; {_n(s.guard_unrecorded, 'decision')} without a record of it (journaled by an older racktwin)"
    return "  guard        " + text


def _explanation(d: DecisionRow) -> list[str]:
    lines = d.summary.get("explanation", [])
    return [str(e) for e in lines] if isinstance(lines, list) else [str(lines)]


def format_summary(s: JournalSummary) -> str:
    lines = [f"journal {s.path}" + ("" if s.since_wall_s is None else f" (since {wall_time(s.since_wall_s)})")]
    if s.first is None or s.last is None:
        lines.append("  decisions    none" + (" in that time" if s.since_wall_s is not None else ""))
    else:
        span = s.last.wall_time_s - s.first.wall_time_s
        lines.append(
            f"  decisions    {s.decisions:,} from {wall_time(s.first.wall_time_s)} to {wall_time(s.last.wall_time_s)} "
            f"({_span(span)}; site time {site_time(s.first.site_time_s)} to {site_time(s.last.site_time_s)})"
        )
        lines.append(f"  status       {_counts(s.statuses)}; mode {_counts(s.modes)}")
        lines.append(
            f"  solve        median {_secs(s.solve_median_s)}, p99 {_secs(s.solve_p99_s)}, max {_secs(s.solve_max_s)}"
        )
    if not s.failsafe:
        lines.append("  fail-safe    no rack")
    for i, f in enumerate(s.failsafe):
        head = "  fail-safe    " if i == 0 else " " * 15
        lines.append(
            f"{head}{f.rack}: {_n(f.decisions, 'decision')} in {_n(f.episodes, 'episode')}, "
            f"{wall_time(f.first_wall_s)} to {wall_time(f.last_wall_s)}"
        )
    if s.decisions:
        lines.append(_guard_totals(s))
    total = sum(s.commands_by_state.values())
    still_open = "none open" if s.open_commands == 0 else f"{s.open_commands:,} open (pending or sent)"
    lines.append(
        f"  commands     {total:,}: {_counts(s.commands_by_state)}; {still_open}; "
        f"{s.sent_more_than_once:,} sent more than once"
    )
    width = max((len(k) for k in s.commands_by_kind), default=0)
    for kind, counts in s.commands_by_kind.items():
        lines.append(f"    {kind:<{width}}  {sum(counts.values()):,}: {_counts(counts)}")
    repeated = f"; {s.repeated_acks:,} repeated (copies sent again)" if s.repeated_acks else ""
    lines.append(f"  acks         {_counts(s.acks_by_result)}{repeated}")
    if s.rejection_reasons:
        for i, (reason, n) in enumerate(s.top_rejection_reasons):
            head = "  rejected     " if i == 0 else " " * 15
            lines.append(f"{head}{n:,} x {reason or '(no reason given)'}")
        if s.other_rejections:
            n_others = len(s.rejection_reasons) - len(s.top_rejection_reasons)
            lines.append(" " * 15 + f"{s.other_rejections:,} x other reasons ({n_others:,} more; --json lists each)")
    if s.calibrated_cards:
        last = s.last_calibration_site_s
        lines.append(
            f"  calibration  {s.calibrated_cards:,} cards"
            + ("" if last is None else f", last at site time {site_time(last)}")
        )
    if s.recent:
        newest = "the newest decision" if len(s.recent) == 1 else f"the newest {len(s.recent)} decisions"
        lines.append(f"{newest} (racktwin journal --decision ID: one with its commands):")
        for d in s.recent:
            lines.append("  " + _decision_line(d))
            lines.extend(f"      {e}" for e in (*_guard_line(d), *_explanation(d)))
    return "\n".join(lines)


def _span(t_s: float) -> str:
    if t_s < 120:
        return f"{t_s:.0f} s"
    if t_s < 7200:
        return f"{t_s / 60:.0f} min"
    if t_s < 172800:
        return f"{t_s / 3600:.1f} h"
    return f"{t_s / 86400:.1f} days"


def format_detail(detail: DecisionDetail) -> str:
    d = detail.decision
    s = d.summary
    lines = [_decision_line(d), f"  cycle {d.cycle}, mode {d.mode}, plan {s.get('plan_status', '?')}"]
    lines.extend(f"  {e}" for e in (*_guard_line(d), *_explanation(d)))
    for key, label in (("queue_waits_by_kind", "queued jobs waiting"), ("placements", "placements")):
        value = s.get(key)
        if value and isinstance(value, dict):
            text = ", ".join(f"{k} {v if not isinstance(v, list) else f'{len(v)} cards'}" for k, v in value.items())
            lines.append(f"  {label}: {text}")
    if not detail.commands:
        lines.append("  no commands")
    else:
        lines.append(f"  {_n(len(detail.commands), 'command')} (--json adds each payload):")
    for c in detail.commands:
        acks = "; ".join(f"{r}" + (f" ({why})" if why else "") for r, why, _t in c.acks) or "no ack"
        lines.append(
            f"    {c.command_id}  {c.kind} {c.target}  {c.state}, sent {c.attempts}x, "
            f"expires site {site_time(c.expires_s)}  ack: {acks}"
        )
    return "\n".join(lines)
