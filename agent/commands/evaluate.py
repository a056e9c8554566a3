"""``racktwin evaluate --scenario FILE --policy NAME [--policy NAME ...]``: closed-loop comparison of policies.

Runs each policy (``agent.policies``: baseline, static-cap, reactive, greedy, racktwin) in process
against the scenario's plant (no broker, as fast as the machine allows), from the same seed, in
``--jobs`` worker processes, judges every run on the plant's true values (``agent.evaluate``) and
writes ``metrics.json``, ``metrics.csv``, ``series.csv`` and ``report.html`` to ``--out``. The table
goes to stdout (``--json``: one object ``{"policies": {NAME: {...}}}``), progress to stderr. Each file
is written whole or not at all; a Ctrl-C or SIGTERM stops the workers and ends the command with exit
status 130 and one line saying which files it wrote (none before the runs end;
:class:`agent.commands.common.WrittenFiles`); a write that fails after the runs (a full disk) ends it
with exit status 2 and such a line, after the results on stdout. Documentation: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
import tomllib
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from agent.commands.common import (
    Interrupted,
    UserError,
    WrittenFiles,
    add_progress_interval_argument,
    check_progress_interval,
    check_telemetry_period,
    folder_name,
    json_safe,
    path_arg,
    prepare_output_dir,
    print_json,
    sigterm_interrupts,
    write_text_replacing,
)
from agent.config import ControlConfig, check_control
from agent.durations import hms, percent_done
from agent.evaluate import BREAKDOWN_KEYS, Evaluation, EvaluationError, default_jobs, evaluate
from agent.policies import POLICY_NAMES
from agent.report import figures_html, page, png_base64, pyplot, table_html
from agent.solver_output import stdout_to_stderr
from agent.targets import TargetCheck, TargetsError, validate_targets
from twin.scenario import MAX_DURATION_S, RunScenario, jobs_line
from twin.tables import SpecError, decode_table

#: Colours of the policies in the plots.
_COLOURS = {
    "baseline": "#999999",
    "static-cap": "#d9a441",
    "reactive": "#c0504d",
    "greedy": "#8fb3d9",
    "racktwin": "#1f5fa8",
}


#: what each exit status of ``racktwin evaluate`` means, as its ``--help`` and the README (Command line) say it
EXIT_STATUSES = (
    "Exit status 0 after the runs (a missed target is reported, not an error); 130 when stopped by "
    "Ctrl-C or SIGTERM (the workers too; one line says which files it wrote: none before the runs end; none "
    "is left half-written, one not yet written is left as it was); 2 for a bad option or scenario (one line on "
    "stderr), or a file it cannot write after the runs (their results are printed all the same, then one line "
    "says which files it wrote)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = (
        "Closed-loop evaluation: run control policies in process against the same virtual plant (same "
        "workload, weather, noise and faults) and compare energy, throughput, limits and temperatures."
    )
    parser.epilog = f"{EXIT_STATUSES} docs/evaluation.md"
    parser.add_argument(
        "--scenario",
        default=None,
        type=path_arg,
        metavar="FILE",
        help="run-scenario TOML (required; e.g. examples/day-nominal.toml; docs/sim.md)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=None,
        metavar="NAME",
        help=f"a policy to run, repeatable: {', '.join(POLICY_NAMES)} (default: all; the baseline always runs)",
    )
    parser.add_argument(
        "--out", default=None, type=path_arg, metavar="DIR", help="output folder (default ./out/evaluate-<scenario>)"
    )
    parser.add_argument("--json", action="store_true", help='print {"policies": {NAME: metrics}} as one JSON object')
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help=f"worker processes, 1..256 (default: the CPUs available, at least 2; here {default_jobs()}); 1 runs in "
        "process",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="site seconds to run, more than one control period (period_s, 15 s unless --control sets it) and at "
        f"most {MAX_DURATION_S:.0f} ({MAX_DURATION_S / 86400:.0f} days) (default: the scenario's duration_s)",
    )
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="override the scenario's seed, >= 0")
    parser.add_argument(
        "--sample-s",
        type=float,
        default=60.0,
        metavar="S",
        help="time-series resolution in the report, 1..86400 site seconds (default %(default)g)",
    )
    parser.add_argument(
        "--control",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a [control] key of the agent's configuration for this run (docs/agent.md), e.g. "
        "--control host_off_after_s=1800 --control control_host_power=false; repeatable, each key once; values as in "
        "TOML (default: the agent's defaults). greedy and racktwin use every key; static-cap its cap "
        "(rack_margin_w, min_power_limit_w), reactive min_power_limit_w only (its 3 s period and bands are fixed)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress on stderr (warnings and the targets' verdicts still print)"
    )
    add_progress_interval_argument(
        parser, default_s=PROGRESS_INTERVAL_S, lines=" (per policy, after its 900-s reports; one at its end)"
    )


#: Default wall seconds between a policy's progress lines (``--progress-interval-s``).
PROGRESS_INTERVAL_S = 10.0
#: What ``--out`` receives (checked writable before the run), in the order :func:`write_outputs` writes it.
OUTPUT_FILES = ("metrics.json", "metrics.csv", "series.csv", "report.html")


def _fail(msg: str) -> UserError:
    return UserError(msg)


def _check(args: argparse.Namespace) -> tuple[list[str], int]:
    if args.scenario is None:
        raise _fail("--scenario FILE is required (e.g. examples/day-nominal.toml)")
    policies = list(dict.fromkeys(args.policy or POLICY_NAMES))  # a policy asked twice runs (and is named) once
    for p in policies:
        if p not in POLICY_NAMES:
            raise _fail(f"unknown policy {p!r} (choose from {', '.join(POLICY_NAMES)})")
    jobs = default_jobs() if args.jobs is None else args.jobs
    if not 1 <= jobs <= 256:
        raise _fail(f"--jobs must be within 1..256, got {jobs}")

    if args.duration is not None and not (math.isfinite(args.duration) and 0 < args.duration <= MAX_DURATION_S):
        raise _fail(
            f"--duration must be a positive number of seconds, at most {MAX_DURATION_S:.0f} "
            f"({MAX_DURATION_S / 86400:.0f} days), "
            f"got {args.duration:g}"
        )
    if args.seed is not None and args.seed < 0:
        raise _fail(f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.sample_s) and 1.0 <= args.sample_s <= 86400.0):
        raise _fail(f"--sample-s must be within 1..86400 s, got {args.sample_s:g}")
    check_progress_interval(args.progress_interval_s)
    return policies, jobs


def control_of(settings: list[str]) -> ControlConfig | None:
    """The agent's ``[control]`` with ``KEY=VALUE`` settings (TOML values), validated as in a config
    file; None without settings."""
    if not settings:
        return None
    table: dict[str, Any] = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise _fail(f"--control {item!r}: expected KEY=VALUE, e.g. host_off_after_s=1800")
        if key in table:  # as a key twice in a TOML table: which one was meant cannot be told
            raise _fail(f"--control {key}: given twice; give each key once")
        try:
            table[key] = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            table[key] = raw.strip()  # a bare word: a string (e.g. placement_method=greedy)
    try:
        return decode_table(ControlConfig, table, "--control")
    except SpecError as exc:
        raise _fail(str(exc)) from None


def run(args: argparse.Namespace, command: str) -> int:
    written = WrittenFiles(OUTPUT_FILES)
    # as Ctrl-C: the worker processes are stopped, not left running; exit status 130 with a line saying
    # what was written
    with sigterm_interrupts():
        try:
            return _run(args, command, written)
        except KeyboardInterrupt:
            raise Interrupted(written.left()) from None


def _run(args: argparse.Namespace, command: str, written: WrittenFiles) -> int:
    policies, jobs = _check(args)
    control = control_of(args.control)
    path = _scenario_path(args.scenario)
    scenario = _load_scenario(args, path, control or ControlConfig(), policies, command)
    out_dir = Path(args.out) if args.out is not None else Path("out") / f"evaluate-{folder_name(scenario.name)}"
    written.out_dir = out_dir
    try:
        prepare_output_dir(out_dir, OUTPUT_FILES)
    except UserError as exc:
        raise _fail(str(exc)) from None
    if not args.quiet:
        _announce(scenario, policies, jobs)
    ev = _run_policies(
        scenario, path, policies, jobs, control, args.sample_s, _progress_printer(args.quiet, args.progress_interval_s)
    )
    failed: UserError | None = None
    try:
        write_outputs(ev, out_dir, written)
    except OSError as exc:  # a disk that filled during the runs: their numbers still go to stdout, then one line
        failed = written.failed(exc)
    if not args.quiet and failed is None:
        print(
            f"racktwin evaluate: {len(ev.results)} runs in {ev.wall_s:,.1f} s wall; wrote {out_dir}/report.html, "
            "metrics.json, metrics.csv, series.csv",
            file=sys.stderr,
            flush=True,
        )
    _print_results(ev, _targets_text(ev, scenario), as_json=args.json)
    if failed is not None:
        raise failed
    return 0


def _scenario_path(scenario: str) -> Path:
    """``--scenario``'s file, refused when it is a folder or missing."""
    path = Path(scenario)
    if path.is_dir():
        raise _fail(f"{path}: is a directory, expected a TOML file")
    if not path.is_file():
        raise _fail(f"{path}: scenario file not found")
    return path


def _load_scenario(
    args: argparse.Namespace, path: Path, control: ControlConfig, policies: list[str], command: str
) -> RunScenario:
    """The scenario at ``path`` (``--seed``, ``--duration`` applied), checked against the control in
    force: longer than one control period, telemetry within the agent's deadline, targets naming
    known policies; its warnings go to stderr."""
    from twin.scenario import load_run_scenario

    period_s = control.period_s

    def too_short(duration_s: float) -> UserError:
        return _fail(
            f"{path}: the run ({duration_s:g} s) is not longer than one control period ({period_s:g} s): "
            "the first period is not judged (no policy has acted yet), so nothing would be"
        )

    # what the arguments alone decide is refused before the scenario loads (a generated day takes seconds)
    if args.duration is not None and args.duration <= period_s:
        raise too_short(args.duration)
    try:
        check_control(control, None, "--control", prefix="")  # deadlines within the period
        scenario = load_run_scenario(path, seed=args.seed, duration_s=args.duration)
        # and the margins within the site's limits
        check_control(control, scenario.site, "--control", prefix="")
    except SpecError as exc:
        raise _fail(str(exc)) from None
    for warning in scenario.warnings:
        print(f"racktwin {command}: warning: {warning}", file=sys.stderr, flush=True)
    # the simulator's own faults (those within the run; the others were warned of above): in process
    # there is no broker to lose
    if n := sum(f.start_s < scenario.duration_s for f in scenario.sim_faults):
        print(
            f"racktwin {command}: warning: {path}: {n} broker_disconnect fault{'s' if n > 1 else ''} not run: "
            "evaluate runs the policies in process, with no broker to lose (racktwin sim and demo run them)",
            file=sys.stderr,
            flush=True,
        )
    if scenario.duration_s <= period_s:
        raise too_short(scenario.duration_s)
    if any(p in ("greedy", "racktwin") for p in policies):  # the agent's policies: stale racks go to fail-safe
        deadline_s, setting = control.telemetry_deadline_s, "--control telemetry_deadline_s=S sets it"
        check_telemetry_period(path, scenario.telemetry_period_s, deadline_s, setting)
    if scenario.targets is not None:
        try:
            validate_targets(scenario.targets, POLICY_NAMES)
        except TargetsError as exc:
            raise _fail(f"{path}: {exc}") from None
    return scenario


def _progress_printer(
    quiet: bool, interval_s: float = PROGRESS_INTERVAL_S
) -> Callable[[str, float, float, float], None]:
    """``evaluate``'s progress callback: a policy's report (every 900 site seconds, ``agent.evaluate``)
    makes a stderr line when it is the policy's first, its last, or ``interval_s`` wall seconds
    (``--progress-interval-s``) or more after its previous line (nothing with ``--quiet``)."""
    last: dict[str, float] = {}

    def progress(name: str, t_s: float, duration_s: float, wall_s: float) -> None:
        if quiet:
            return
        now = time.monotonic()
        if t_s < duration_s - 1e-6 and now - last.get(name, -math.inf) < interval_s:
            return
        last[name] = now
        rate = t_s / wall_s if wall_s > 0 else math.inf
        eta = (duration_s - t_s) / rate if rate > 0 else math.inf
        print(
            f"racktwin evaluate: {name:<10} {hms(t_s)} of {hms(duration_s)} ({percent_done(t_s, duration_s):3d}%), "
            f"{rate:,.0f}x real time, {wall_s:,.0f} s" + (f", ~{eta:,.0f} s left" if t_s < duration_s else ", done"),
            file=sys.stderr,
            flush=True,
        )

    return progress


def _announce(sc: RunScenario, policies: list[str], jobs: int) -> None:
    """One stderr line saying what is about to run."""
    print(
        f"racktwin evaluate: {sc.name} [{sc.source}]: {sc.site.n_cards} cards, {hms(sc.duration_s)}, "
        f"{jobs_line(len(sc.jobs), sc.workload)}, {len(sc.faults)} faults; policies {', '.join(policies)}"
        + ("" if "baseline" in policies else " (+ baseline as reference)")
        + f"; {jobs} worker process{'es' if jobs > 1 else ''}",
        file=sys.stderr,
        flush=True,
    )


def _run_policies(
    scenario: RunScenario,
    path: Path,
    policies: list[str],
    jobs: int,
    control: ControlConfig | None,
    sample_s: float,
    progress: Callable[[str, float, float, float], None],
) -> Evaluation:
    """Every policy run and judged (``agent.evaluate.evaluate``); a policy's crash or targets that
    cannot be judged are a UserError (the solvers' chatter goes to stderr)."""
    try:
        with stdout_to_stderr():
            return evaluate(scenario, policies, jobs=jobs, control=control, sample_s=sample_s, progress=progress)
    except EvaluationError as exc:
        raise _fail(str(exc).splitlines()[0] + " (see the traceback above)") from exc
    except TargetsError as exc:
        raise _fail(f"{path}: {exc}") from None


def _targets_text(ev: Evaluation, scenario: RunScenario) -> str:
    """The targets' verdicts as printed ("" when the scenario has none); when ``--duration`` made the
    run shorter than the file's ``duration_s`` (``scenario.file_duration_s``), a line under the heading
    says the targets were set for the file's run and judged on this one (a 10-minute run of a day's
    scenario cannot meet a day's saving: a host's boot alone takes 300 s)."""
    if ev.targets_policy is not None:
        text = format_targets(ev.targets_policy, ev.targets)
        file_duration_s = scenario.file_duration_s
        if file_duration_s is not None and scenario.duration_s < file_duration_s - 1e-9:
            head, _, rest = text.partition("\n")
            note = (
                f"  (judged on this {hms(scenario.duration_s)} run: --duration shortened the scenario's "
                f"{hms(file_duration_s)}, for which its targets were set)"
            )
            text = "\n".join((head, note, rest)) if rest else f"{head}\n{note}"
        return text
    if scenario.targets is not None:  # the policy they judge was not asked for: say so, in one line
        tp = scenario.targets.policy
        return f"targets for {tp} (the scenario's [targets]): not judged, {tp} did not run (add --policy {tp})"
    return ""


def _print_results(ev: Evaluation, targets: str, *, as_json: bool) -> None:
    """The table (or with ``--json`` the documented object) on stdout, then the targets' verdicts."""
    if as_json:  # stdout: the documented object only; the targets are in metrics.json
        print_json({"policies": ev.policies_json()})
        if targets:  # --quiet drops the progress, not the verdicts
            print(targets, file=sys.stderr, flush=True)
    else:
        print(format_table(ev))
        if targets:
            print(targets)


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------

#: (key, header, scale, format) of the table's columns.
_TABLE = (
    ("facility_energy_kwh", "facility kWh", 1.0, "{:,.1f}"),
    ("facility_energy_saving_pct", "saved %", 1.0, "{:+.2f}"),
    ("it_energy_kwh", "IT kWh", 1.0, "{:,.1f}"),
    ("cooling_energy_kwh", "cooling kWh", 1.0, "{:,.1f}"),
    ("pue", "PUE", 1.0, "{:.4f}"),
    ("throughput", "throughput", 1.0, "{:,.1f}"),
    ("throughput_loss_pct", "loss %", 1.0, "{:+.2f}"),
    ("slo_violation_s", "SLO miss s", 1.0, "{:,.0f}"),
    ("queue_wait_mean_s", "wait s", 1.0, "{:,.0f}"),
    ("limit_violation_s", "over s", 1.0, "{:,.0f}"),
    ("max_rack_power_w", "max rack kW", 1e3, "{:.2f}"),
    ("max_die_temp_c", "max die C", 1.0, "{:.1f}"),
    ("throttled_card_s", "throttled card-s", 1.0, "{:,.0f}"),
    ("solve_p99_s", "solve p99 s", 1.0, "{:.3f}"),
    ("fallbacks", "fallbacks", 1.0, "{:d}"),
)


def _cell(v: Any, scale: float, fmt: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, int) and "d" in fmt:
        return fmt.format(v)
    return fmt.format(float(v) / scale)


def format_table(ev: Evaluation) -> str:
    names = _policy_order(ev)
    heads = ["policy"] + [h for _k, h, _s, _f in _TABLE]
    rows = [[n] + [_cell(ev.results[n].metrics[k], s, f) for k, _h, s, f in _TABLE] for n in names]
    widths = [max(len(heads[i]), *(len(r[i]) for r in rows)) for i in range(len(heads))]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(heads, widths, strict=True)))]
    for r in rows:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    sc = ev.scenario
    lines.append(
        f"scenario {sc['name']}: {sc['n_cards']} cards, {hms(sc['duration_s'])}; throughput = top-clock-equivalent "
        "cards of training (work done, the same jobs for every policy); over s = rack-seconds of true power over a "
        "limit after the first control period"
    )
    return "\n".join(lines)


def _verdict(c: TargetCheck) -> str:
    return "not judged" if c.met is None else ("met" if c.met else "MISSED")


def format_targets(policy: str, checks: list[TargetCheck]) -> str:
    """The scenario's targets for ``policy``, one line each, with the reason under a missed one."""
    lines = [f"targets for {policy} (the scenario's [targets]):"]
    for c in checks:
        extra = f", {c.shortfall}" if c.shortfall else ""
        lines.append(f"  {_verdict(c):<10} {c.name}: {c.measured} (target {c.target}{extra})")
        if c.why:
            lines.append(f"             why: {c.why}")
    n_met = sum(1 for c in checks if c.met is True)
    n_missed = sum(1 for c in checks if c.met is False)
    n_open = len(checks) - n_met - n_missed
    tally = f"  {n_met} of {len(checks)} targets met" + (f", {n_missed} missed" if n_missed else "")
    lines.append(tally + (f", {n_open} not judged" if n_open else "") if checks else "  (no target given)")
    return "\n".join(lines)


def write_outputs(ev: Evaluation, out_dir: Path, written: WrittenFiles) -> None:
    """:data:`OUTPUT_FILES` to ``out_dir``, in that order, each whole or not at all, each added to
    ``written`` once written."""
    names = list(ev.results)
    full = {
        "scenario": ev.scenario,
        "wall_s": ev.wall_s,
        "targets": (
            {"policy": ev.targets_policy, "checks": [c.as_dict() for c in ev.targets]}
            if ev.targets_policy is not None
            else None
        ),
        "policies": {
            n: {
                "metrics": r.metrics,
                "energy_breakdown_kwh": r.breakdown_kwh,
                "control": {
                    "statuses": r.stats.statuses,
                    "capping_actions": r.stats.capping_actions,
                    "first_failsafe_s": r.stats.first_failsafe_s,
                    "notes": r.stats.notes,
                },
                "wall_s": r.wall_s,
                "cpu_s": r.cpu_s,
            }
            for n, r in ev.results.items()
        },
    }
    # each file whole or not at all: a run stopped while writing leaves the earlier run's files as they were
    write_text_replacing(out_dir / "metrics.json", json.dumps(json_safe(full), indent=1) + "\n")
    written.wrote("metrics.json")
    keys = list(ev.results[names[0]].metrics)
    fh = io.StringIO()
    w = csv.writer(fh)
    w.writerow(["policy", *keys, *(f"energy_{k}_kwh" for k in BREAKDOWN_KEYS)])
    for n, r in ev.results.items():
        cells = (json.dumps(v) if isinstance(v := r.metrics[k], dict) else v for k in keys)  # guard_actions: JSON
        w.writerow([n, *cells, *(r.breakdown_kwh[k] for k in BREAKDOWN_KEYS)])
    write_text_replacing(out_dir / "metrics.csv", fh.getvalue(), newline="")
    written.wrote("metrics.csv")
    fh = io.StringIO()
    w = csv.writer(fh)
    first = ev.results[names[0]]
    cols = list(first.series)
    n_r = len(first.rack_series_w)
    w.writerow(["policy", *cols, *(f"r{i}_max_power_w" for i in range(n_r))])
    for n, r in ev.results.items():
        for i in range(len(r.series["time_s"])):
            w.writerow([n, *(r.series[c][i] for c in cols), *(r.rack_series_w[k][i] for k in range(n_r))])
    write_text_replacing(out_dir / "series.csv", fh.getvalue(), newline="")
    written.wrote("series.csv")
    write_text_replacing(out_dir / "report.html", _report_html(ev))
    written.wrote("report.html")


#: The "More" table's metrics in the report.
_MORE_KEYS = (
    "allocated_card_frac",
    "boot_wait_card_frac",
    "low_power_card_frac",
    "mean_supply_setpoint_c",
    "mean_pump_speed_frac",
    "jobs_finished",
    "jobs_never_started",
    "queue_wait_p95_s",
    "slo_jobs_missed",
    "limit_violation_episodes",
    "limit_violation_longest_s",
    "limit_violation_kws",
    "die_over_slowdown_card_s",
    "failsafe_entries",
    "decisions",
    "solve_median_s",
)


def _report_html(ev: Evaluation) -> str:
    """report.html: the scenario, the table, the targets' verdicts, where the energy went, more
    metrics, the plots and examples of what the controllers did."""
    sc = ev.scenario
    names = _policy_order(ev)
    notes = _notes_html(ev, names)
    body = (
        _intro_html(ev)
        + _table_html(ev, names)
        + _targets_html(ev)
        + "<p>throughput: top-clock-equivalent cards of training (work done per second, the same jobs for every "
        "policy; a slowed policy finishes fewer jobs, so work done is what is compared); loss and saving against "
        "the baseline; over s: rack-seconds of true power over a limit from the end of the first control period; "
        "max rack: largest true rack power over the same window.</p>"
        + "<h2>Where the energy went (kWh)</h2>"
        + _breakdown_table_html(ev, names)
        + "<h2>More</h2>"
        + _more_table_html(ev, names)
        + figures_html(_figures(ev, names))
        + ("<h2>What the controllers did (examples)</h2>" + notes if notes else "")
    )
    return page(f"racktwin evaluate: {sc['name']}", body)


def _policy_order(ev: Evaluation) -> list[str]:
    """The policies as asked for, then the ones that ran as reference (the baseline)."""
    return list(ev.requested) + [n for n in ev.results if n not in ev.requested]


def _intro_html(ev: Evaluation) -> str:
    sc = ev.scenario
    return (
        f"<p>Scenario <b>{escape(sc['name'])}</b> ({escape(str(sc['source']))}): {sc['n_cards']} cards in "
        f"{sc['n_racks']} racks of {sc['rack_power_limit_w'] / 1e3:g} kW, {hms(sc['duration_s'])}, "
        f"{escape(jobs_line(sc['jobs'], sc['workload']))}, faults: {escape(', '.join(sc['faults']) or 'none')}. "
        f"Every policy ran the same plant (same jobs, weather, card spread, sensor noise, faults) in process; all "
        f"numbers are the plant's true values. {len(ev.results)} runs took {ev.wall_s:,.0f} s wall.</p>"
    )


def _table_html(ev: Evaluation, names: list[str]) -> str:
    """The printed table's columns, one row per policy."""
    heads = ["policy"] + [h for _k, h, _s, _f in _TABLE]
    rows = [[n] + [_cell(ev.results[n].metrics[k], s, f) for k, _h, s, f in _TABLE] for n in names]
    return table_html(heads, rows)


def _breakdown_table_html(ev: Evaluation, names: list[str]) -> str:
    rows = [[n] + [f"{ev.results[n].breakdown_kwh[k]:,.1f}" for k in BREAKDOWN_KEYS] for n in names]
    return table_html(["policy", *(k.replace("_", " ") for k in BREAKDOWN_KEYS)], rows)


def _more_table_html(ev: Evaluation, names: list[str]) -> str:
    rows = [[n] + [_fmt_any(ev.results[n].metrics[k]) for k in _MORE_KEYS] for n in names]
    return table_html(["policy", *(k.replace("_", " ") for k in _MORE_KEYS)], rows)


def _notes_html(ev: Evaluation, names: list[str]) -> str:
    """Per policy, the controller's first notes and its anomalies ("" when no policy has any)."""
    res = ev.results
    return "".join(
        f"<h3>{escape(n)}</h3><ul>"
        + "".join(f"<li>{escape(x)}</li>" for x in res[n].stats.notes[:20])
        + (f"<li>anomalies flagged: {escape(res[n].metrics['anomalies'])}</li>" if res[n].metrics["anomalies"] else "")
        + "</ul>"
        for n in names
        if res[n].stats.notes or res[n].metrics["anomalies"]
    )


# --------------------------------------------------------------------------------------------
# The report's plots: each a (title, base64 PNG) pair
# --------------------------------------------------------------------------------------------


def _figures(ev: Evaluation, names: list[str]) -> list[tuple[str, str]]:
    plt = pyplot()
    return [
        _facility_power_figure(plt, ev, names),
        _rack_power_figure(plt, ev, names),
        _energy_pue_throughput_figure(plt, ev, names),
        _breakdown_figure(plt, ev, names),
        _cooling_figure(plt, ev, names),
        _die_figure(plt, ev, names),
    ]


def _hours(r: Any) -> list[float]:
    return [t / 3600.0 for t in r.series["time_s"]]


def _png(plt: Any, fig: Any) -> str:
    """The figure as base64 PNG, closed."""
    png = png_base64(fig)
    plt.close(fig)
    return png


def _facility_power_figure(plt: Any, ev: Evaluation, names: list[str]) -> tuple[str, str]:
    res = ev.results
    fig, ax = plt.subplots(figsize=(10, 3.4))
    for n in names:
        kw = [p / 1e3 for p in res[n].series["facility_power_w"]]
        ax.plot(_hours(res[n]), kw, label=n, color=_COLOURS.get(n), lw=1)
    ax.set_xlabel("hour")
    ax.set_ylabel("facility power (kW)")
    ax.legend(fontsize=7, ncol=len(names))
    return "Facility power", _png(plt, fig)


def _rack_power_figure(plt: Any, ev: Evaluation, names: list[str]) -> tuple[str, str]:
    res = ev.results
    fig, ax = plt.subplots(figsize=(10, 3.4))
    for n in names:
        kw = [p / 1e3 for p in res[n].series["max_rack_power_w"]]
        ax.plot(_hours(res[n]), kw, label=n, color=_COLOURS.get(n), lw=1)
    ax.axhline(ev.scenario["rack_power_limit_w"] / 1e3, color="red", lw=1.2, label="rack limit")
    ax.set_xlabel("hour")
    ax.set_ylabel("largest true rack power (kW)")
    ax.legend(fontsize=7, ncol=len(names) + 1)
    return "Largest rack power against the limit (peak of each sample interval)", _png(plt, fig)


def _energy_pue_throughput_figure(plt: Any, ev: Evaluation, names: list[str]) -> tuple[str, str]:
    res, pue_target = ev.results, ev.scenario["pue_target"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    cols = [_COLOURS.get(n, "#555555") for n in names]
    axes[0].bar(names, [res[n].metrics["facility_energy_kwh"] for n in names], color=cols)
    axes[0].set_ylabel("facility energy (kWh)")
    axes[1].bar(names, [res[n].metrics["pue"] for n in names], color=cols)
    axes[1].axhline(pue_target, color="red", lw=1.0, label="target")
    axes[1].set_ylim(1.0, max(max(res[n].metrics["pue"] for n in names), pue_target) + 0.02)
    axes[1].set_ylabel("time-weighted PUE")
    axes[2].bar(names, [res[n].metrics["throughput"] for n in names], color=cols)
    axes[2].set_ylabel("throughput (top-clock cards)")
    for a in axes:
        a.tick_params(axis="x", labelsize=7, rotation=20)
    fig.tight_layout()
    return "Energy, PUE and throughput", _png(plt, fig)


def _breakdown_figure(plt: Any, ev: Evaluation, names: list[str]) -> tuple[str, str]:
    fig, ax = plt.subplots(figsize=(10, 3.6))
    bottom = [0.0] * len(names)
    palette = plt.get_cmap("tab10")
    for i, k in enumerate(BREAKDOWN_KEYS):
        vals = [ev.results[n].breakdown_kwh[k] for n in names]
        ax.bar(names, vals, bottom=bottom, label=k.replace("_", " "), color=palette(i))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("facility energy (kWh)")
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    return "Where the facility energy went", _png(plt, fig)


def _cooling_figure(plt: Any, ev: Evaluation, names: list[str]) -> tuple[str, str]:
    res = ev.results
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    for n in names:
        axes[0].plot(_hours(res[n]), res[n].series["supply_setpoint_c"], label=n, color=_COLOURS.get(n), lw=1)
        axes[1].plot(_hours(res[n]), res[n].series["low_power_cards"], label=n, color=_COLOURS.get(n), lw=1)
        pumps = [100.0 * x for x in res[n].series["mean_pump_speed_frac"]]
        axes[2].plot(_hours(res[n]), pumps, label=n, color=_COLOURS.get(n), lw=1)
    first = res[names[0]]
    axes[0].plot(_hours(first), first.series["ambient_c"], label="ambient", color="k", lw=0.8, ls=":")
    axes[0].set_ylabel("supply set-point / ambient (deg C)")
    axes[1].set_ylabel("cards in low-power idle")
    axes[2].set_ylabel("mean rack pump speed (%)")
    for a in axes:
        a.set_xlabel("hour")
        a.legend(fontsize=7)
    fig.tight_layout()
    return "Coolant set-point, low-power idle and pump speed", _png(plt, fig)


def _die_figure(plt: Any, ev: Evaluation, names: list[str]) -> tuple[str, str]:
    res = ev.results
    fig, ax = plt.subplots(figsize=(10, 3.0))
    for n in names:
        ax.plot(_hours(res[n]), res[n].series["max_die_temp_c"], label=n, color=_COLOURS.get(n), lw=1)
    ax.set_xlabel("hour")
    ax.set_ylabel("hottest die (deg C)")
    ax.legend(fontsize=7, ncol=len(names))
    return "Hottest die", _png(plt, fig)


def _targets_html(ev: Evaluation) -> str:
    if ev.targets_policy is None:
        return ""
    rows = [[c.name, c.target, c.measured, _verdict(c), c.shortfall, c.why] for c in ev.targets]
    return f"<h2>Targets for {escape(ev.targets_policy)} (the scenario's [targets])</h2>" + table_html(
        ["target", "bound", "measured", "verdict", "by how much", "why"], rows
    )


def _fmt_any(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,d}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)
