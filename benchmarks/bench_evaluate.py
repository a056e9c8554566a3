"""Closed-loop evaluation benchmark: the numbers of benchmarks/results-evaluation.md and docs/evaluation.md.

    python benchmarks/bench_evaluate.py                 # nominal and full-load days, all five policies
    python benchmarks/bench_evaluate.py --days nominal  # one day
    python benchmarks/bench_evaluate.py --faults        # the six day-fault scenarios, in process and via MQTT
    python benchmarks/bench_evaluate.py --faults --mqtt-speed 20 --mqtt-duration 2400
    python benchmarks/bench_evaluate.py --faults --fault card-failure   # one fault scenario
    python benchmarks/bench_evaluate.py --days nominal --seeds 5   # five different nominal days
    python benchmarks/bench_evaluate.py --host-sweep   # racktwin with host power-down settings side by side
    python benchmarks/bench_evaluate.py --plant-fallback   # racktwin with and without the plant's fallback
    python benchmarks/bench_evaluate.py --days nominal --seeds 5 --setting host_reserve_per_supernode=0  # vs defaults

Days: ``racktwin evaluate`` (the command itself, in a child process, ``--jobs`` workers) on
examples/day-<name>.toml; prints the evaluation table, where the energy went, and the wall time of
the whole command (the speed target: all five policies on the nominal day in under 10 minutes on the
2-core machine). Faults: each examples/day-fault-*.toml (1) in process, baseline / reactive / racktwin,
the whole 2 hours, and (2) through MQTT: the simulator (``python -m sim``) and the agent service in
enforce mode over an embedded mosquitto (amqtt if none), for ``--mqtt-duration`` site seconds at
``--mqtt-speed``; judged on true values: the longest time a rack stayed over its limit, the hottest
die, and what the agent did (fail-safe entries, fallbacks, readings refused, anomalies).
Seeds (``--seeds N``): the day at N different workloads, all five policies each: the scenario's own
day, then each next seed the scenario's ``allocation_tolerance`` accepts (the same offered load, other
jobs, weather noise and sensor noise); one row per day and the median / min / max of every column,
so that a verdict that depends on one day's draw (which job the schedule reached by midnight) shows
as such.
Host sweep (``--host-sweep``): the nominal day, racktwin only (and the baseline it is judged against),
once per setting of the agent's host power-down (``racktwin evaluate --control ...``): the defaults,
a shorter and longer idle times before a host goes off, no reserve and a larger one, and no host
power-down; the runs go side by side (one process each), one row per setting.
Plant fallback (``--plant-fallback``): the nominal day, racktwin (and the baseline), once as the scenario
has it (the plant's scheduler places a job the agent has not placed within ``external_timeout_s`` =
120 s) and once with that fallback off (a copy of the scenario with ``external_timeout_s = 1e9``, written
to the output folder), and once with the plant's scheduler placing every job (``--control
control_placement=false``: the agent plans everything else), side by side; how many jobs the plant
placed and what the agent's schedule alone does.
Setting over workloads (``--days nominal --seeds N --setting KEY=VALUE`` [``--setting ...``]): the nominal
day at N workloads, racktwin with the agent's defaults and with the settings (``racktwin evaluate --control``),
side by side per workload (each run with the baseline and reactive); one row per workload: saving,
loss, work against reactive and queue waits of each, and what the settings change, priced at the
agent's own prices (``[prices]``: a card-hour of work 2.0, a kWh 0.15), so that a setting that wins on
one day's draw shows as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DAYS = ("nominal", "full-load")
FAULTS = ("heat-wave", "pump", "dropout", "stuck", "card-failure", "garbage")
POLICIES = ("baseline", "static-cap", "reactive", "greedy", "racktwin")


def machine() -> str:
    import os

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def day_command(
    day: str, folder: Path, jobs: int | None, seed: int | None = None, policies: tuple[str, ...] = POLICIES
) -> list[str]:
    cmd = [sys.executable, "-m", "agent.cli", "evaluate", "--scenario", str(REPO / "examples" / f"day-{day}.toml")]
    for p in policies:
        cmd += ["--policy", p]
    cmd += ["--out", str(folder), "--quiet"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    return cmd


def run_day(day: str, out: Path, jobs: int | None, seed: int | None = None) -> tuple[dict[str, Any], float]:
    """``racktwin evaluate`` on one day with all five policies (at ``seed``: the scenario's
    otherwise); (metrics.json, wall s)."""
    folder = out / f"day-{day}"
    t0 = time.perf_counter()
    subprocess.run(day_command(day, folder, jobs, seed), check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return json.loads((folder / "metrics.json").read_text()), wall


def run_side_by_side(cmds: Sequence[list[str]]) -> float:
    """Run ``cmds`` at once (one process each, from the repository); the wall seconds until all ended."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL) for cmd in cmds]
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"{proc.args!r} failed")
    return time.perf_counter() - t0


#: (label, racktwin evaluate --control settings) of the host sweep
HOST_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("defaults (off after the break-even time, 311 s idle; 2 hosts kept on)", ()),
    ("off after 60 s idle", ("host_off_after_s=60",)),
    ("no idle host kept on", ("host_reserve_per_supernode=0",)),
    ("off after 600 s idle (AWS PCS's default)", ("host_off_after_s=600",)),
    ("off after 1,800 s idle", ("host_off_after_s=1800",)),
    ("8 hosts kept on", ("host_reserve_per_supernode=8",)),
    ("no host power-down", ("control_host_power=false",)),
)


def host_sweep(out: Path) -> str:
    """The nominal day, racktwin at each of :data:`HOST_SETTINGS`, side by side (one process each)."""
    cmds = []
    for i, (_label, settings) in enumerate(HOST_SETTINGS):
        cmd = day_command("nominal", out / f"hosts-{i}", 1, policies=("baseline", "racktwin"))
        for kv in settings:
            cmd += ["--control", kv]
        cmds.append(cmd)
    wall = run_side_by_side(cmds)
    lines = [
        f"### racktwin's host power-down settings, nominal day "
        f"({wall / 60:.1f} min wall, {len(cmds)} runs side by side)",
        "",
        "| setting | facility kWh | vs baseline | hosts kWh | hosts off (share of host-time) | throughput | loss % "
        "| wait mean/p95/max s | over limit rack-s | max die C |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (label, settings) in enumerate(HOST_SETTINGS):
        full = json.loads((out / f"hosts-{i}" / "metrics.json").read_text())
        m = full["policies"]["racktwin"]["metrics"]
        hosts = full["policies"]["racktwin"]["energy_breakdown_kwh"]["hosts"]
        flags = " ".join(f"`--control {kv}`" for kv in settings)
        lines.append(
            f"| {label}{' ' + flags if flags else ''} | {m['facility_energy_kwh']:,.1f} | "
            f"{-m['facility_energy_saving_pct']:+.2f}% | {hosts:,.1f} | {100 * m['host_off_frac']:.1f}% | "
            f"{m['throughput']:.1f} | {m['throughput_loss_pct']:+.2f} | {m['queue_wait_mean_s']:.0f} / "
            f"{m['queue_wait_p95_s']:.0f} / {m['queue_wait_max_s']:,.0f} | {m['limit_violation_s']:,.0f} | "
            f"{m['max_die_temp_c']:.1f} |"
        )
    return "\n".join(lines)


#: ``racktwin evaluate`` arguments under which the agent leaves placement to the plant's scheduler
CONTROL_SITE_PLACES = ["--control", "control_placement=false"]


def fallback_table(out: Path) -> str:
    """The nominal day, racktwin (and the baseline) as the scenario has it, with the plant's fallback
    scheduler off (``external_timeout_s`` so long the agent places every job itself) and with the plant's
    scheduler placing every job, side by side."""
    src = REPO / "examples" / "day-nominal.toml"
    text = src.read_text(encoding="utf-8")
    site_line = 'site = "supernode-512.toml"'
    if site_line not in text or "external_timeout_s = 120.0" not in text:
        raise RuntimeError(f"{src} no longer has the lines --plant-fallback rewrites")
    off = out / "day-nominal-no-fallback.toml"
    off.parent.mkdir(parents=True, exist_ok=True)
    off.write_text(
        text.replace(site_line, f'site = "{REPO / "examples" / "supernode-512.toml"}"').replace(
            "external_timeout_s = 120.0", "external_timeout_s = 1.0e9"
        ),
        encoding="utf-8",
    )
    runs: tuple[tuple[str, Path | None, list[str]], ...] = (
        ("as the scenario has it (`external_timeout_s = 120`)", None, []),
        ("fallback off (`1e9`)", off, []),
        ("the plant's scheduler places every job (`--control control_placement=false`)", None, CONTROL_SITE_PLACES),
    )
    cmds = []
    for i, (_label, scenario, extra) in enumerate(runs):
        cmd = day_command("nominal", out / f"fallback-{i}", 1, policies=("baseline", "racktwin")) + extra
        if scenario is not None:
            cmd[cmd.index("--scenario") + 1] = str(scenario)
        cmds.append(cmd)
    wall = run_side_by_side(cmds)
    lines = [
        f"### racktwin with and without the plant's fallback scheduler, nominal day ({wall / 60:.1f} min wall, "
        f"{len(runs)} runs side by side)",
        "",
        "| plant fallback | facility kWh | vs baseline | throughput | loss % | jobs placed by the plant | "
        "wait mean/p95/max s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (label, _scenario, _extra) in enumerate(runs):
        m = json.loads((out / f"fallback-{i}" / "metrics.json").read_text())["policies"]["racktwin"]["metrics"]
        lines.append(
            f"| {label} | {m['facility_energy_kwh']:,.1f} | {-m['facility_energy_saving_pct']:+.2f}% | "
            f"{m['throughput']:.2f} | {m['throughput_loss_pct']:+.2f} | {m['jobs_placed_by_plant']:,} of "
            f"{m['jobs_submitted']:,} | {m['queue_wait_mean_s']:.0f} / {m['queue_wait_p95_s']:.0f} / "
            f"{m['queue_wait_max_s']:,.0f} |"
        )
    return "\n".join(lines)


def day_tables(day: str, full: dict[str, Any], wall: float) -> str:
    pol = full["policies"]
    base = pol["baseline"]["metrics"]
    lines = [
        f"### day-{day} ({full['scenario']['workload']}; {wall / 60:.1f} min wall for all five policies)",
        "",
        "| policy | facility kWh | vs baseline | IT kWh | cooling kWh | PUE | throughput | loss % | SLO miss job-s |"
        " wait mean/p95/max s | over limit rack-s (longest) | max rack kW | max die C | throttled card-s |"
        " solve median/p99 s | fallbacks | held / low-power cards | mean set-point C | mean pump speed | CPU s |",
        "|---|" + "---:|" * 19,
    ]
    for name in POLICIES:
        m = pol[name]["metrics"]
        lines.append(
            f"| {name} | {m['facility_energy_kwh']:,.1f} | {m['facility_energy_saving_pct']:+.2f}% | "
            f"{m['it_energy_kwh']:,.1f} | {m['cooling_energy_kwh']:,.1f} | {m['pue']:.4f} | {m['throughput']:,.1f} | "
            f"{m['throughput_loss_pct']:+.2f} | {m['slo_violation_s']:,.0f} | "
            f"{m['queue_wait_mean_s']:,.0f} / {m['queue_wait_p95_s']:,.0f} / {m['queue_wait_max_s']:,.0f} | "
            f"{m['limit_violation_s']:,.0f} ({m['limit_violation_longest_s']:,.0f}) | "
            f"{m['max_rack_power_w'] / 1e3:.2f} | {m['max_die_temp_c']:.1f} | {m['throttled_card_s']:,.0f} | "
            f"{m['solve_median_s']:.3f} / {m['solve_p99_s']:.3f} | {m['fallbacks']} | "
            f"{m['allocated_card_frac']:.1%} / {m['low_power_card_frac']:.1%} | {m['mean_supply_setpoint_c']:.1f} | "
            f"{m['mean_pump_speed_frac']:.0%} | "
            f"{pol[name]['cpu_s']:,.0f} |"
        )
    keys = list(pol["baseline"]["energy_breakdown_kwh"])
    lines += ["", "Where the facility energy went (kWh):", ""]
    lines.append("| policy | " + " | ".join(k.replace("_", " ") for k in keys) + " |")
    lines.append("|---|" + "---:|" * len(keys))
    for name in POLICIES:
        b = pol[name]["energy_breakdown_kwh"]
        lines.append(f"| {name} | " + " | ".join(f"{b[k]:,.1f}" for k in keys) + " |")
    rt = pol["racktwin"]["energy_breakdown_kwh"]
    bb = pol["baseline"]["energy_breakdown_kwh"]
    saved = {k: bb[k] - rt[k] for k in keys}
    total = base["facility_energy_kwh"]
    lines += ["", "racktwin's saving against the baseline, by where it came from:", ""]
    lines += [
        f"- {k.replace('_', ' ')}: {v:+,.1f} kWh ({100 * v / total:+.2f}% of the baseline)" for k, v in saved.items()
    ]
    return "\n".join(lines + targets_lines(full.get("targets")))


def workload_seeds(day: str, n: int) -> list[int]:
    """The first ``n`` workload seeds the day's scenario accepts: its own, then each next one."""
    from twin.scenario import load_run_scenario

    seeds: list[int] = []
    nxt = 0
    while len(seeds) < n:
        sc = load_run_scenario(REPO / "examples" / f"day-{day}.toml", seed=nxt)
        if sc.workload_seed is None:
            raise SystemExit(f"day-{day}: not a generated workload, --seeds does not apply")
        seeds.append(sc.workload_seed)
        nxt = sc.workload_seed + 1
    return seeds


def _rel_pct(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


#: The spread table's columns: (header, format, value from the policies' metrics).
_SPREAD_COLUMNS: tuple[tuple[str, str, Callable[[dict[str, dict[str, float]]], float]], ...] = (
    ("racktwin saving %", "{:.2f}", lambda m: m["racktwin"]["facility_energy_saving_pct"]),
    ("racktwin loss %", "{:.2f}", lambda m: m["racktwin"]["throughput_loss_pct"]),
    (
        "racktwin energy per work vs baseline %",
        "{:.2f}",
        lambda m: _rel_pct(
            m["racktwin"]["facility_kwh_per_work_card_h"], m["baseline"]["facility_kwh_per_work_card_h"]
        ),
    ),
    ("racktwin over rack-s", "{:.0f}", lambda m: m["racktwin"]["limit_violation_s"]),
    ("racktwin PUE", "{:.4f}", lambda m: m["racktwin"]["pue"]),
    ("baseline over rack-s", "{:.0f}", lambda m: m["baseline"]["limit_violation_s"]),
    ("static-cap saving %", "{:.2f}", lambda m: m["static-cap"]["facility_energy_saving_pct"]),
    ("static-cap loss %", "{:.2f}", lambda m: m["static-cap"]["throughput_loss_pct"]),
    ("reactive saving %", "{:.2f}", lambda m: m["reactive"]["facility_energy_saving_pct"]),
    ("reactive loss %", "{:.2f}", lambda m: m["reactive"]["throughput_loss_pct"]),
    ("reactive over rack-s", "{:.0f}", lambda m: m["reactive"]["limit_violation_s"]),
    (
        "racktwin work vs static-cap %",
        "{:.2f}",
        lambda m: _rel_pct(m["racktwin"]["throughput"], m["static-cap"]["throughput"]),
    ),
    (
        "racktwin work vs reactive %",
        "{:.2f}",
        lambda m: _rel_pct(m["racktwin"]["throughput"], m["reactive"]["throughput"]),
    ),
    (
        "racktwin energy vs greedy %",
        "{:.2f}",
        lambda m: _rel_pct(m["racktwin"]["facility_energy_kwh"], m["greedy"]["facility_energy_kwh"]),
    ),
    ("racktwin work vs greedy %", "{:.2f}", lambda m: _rel_pct(m["racktwin"]["throughput"], m["greedy"]["throughput"])),
    ("cards held % (baseline)", "{:.1f}", lambda m: 100.0 * m["baseline"]["allocated_card_frac"]),
    ("racktwin longest wait s", "{:.0f}", lambda m: m["racktwin"].get("queue_wait_max_s", float("nan"))),
    ("baseline longest wait s", "{:.0f}", lambda m: m["baseline"].get("queue_wait_max_s", float("nan"))),
)


def seed_table(day: str, n: int, out: Path, jobs: int | None) -> str:
    """All five policies on ``n`` different workloads of the day: :func:`spread_table` of the runs."""
    runs: list[dict[str, Any]] = []
    for i, seed in enumerate(workload_seeds(day, n)):
        full, wall = run_day(day, out / f"seed-{seed}", jobs, seed=seed)
        runs.append(full)
        print(f"  day-{day} seed {seed}: {wall:.0f} s ({i + 1}/{n})", file=sys.stderr, flush=True)
    return spread_table(day, runs)


def setting_table(day: str, n: int, settings: Sequence[str], out: Path) -> str:
    """racktwin with the defaults and with ``settings`` on ``n`` workloads of the day, side by side per
    workload (baseline and reactive in each run); one row per workload, then the medians."""
    from agent.config import PricesConfig

    prices = PricesConfig()
    policies = ("baseline", "reactive", "racktwin")
    flags = " ".join(f"`--control {kv}`" for kv in settings)
    lines = [
        f"### day-{day} at {n} workloads: racktwin with the defaults and with {flags}",
        "",
        "| workload | saving % defaults / setting | loss % defaults / setting | work vs reactive % defaults / "
        "setting | wait mean s defaults / setting | wait p95 s defaults / setting | energy saved kWh | work lost "
        "card-h | net at the agent's prices | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    net_all: list[float] = []
    for i, seed in enumerate(workload_seeds(day, n)):
        cmds = []
        for tag, kvs in (("defaults", ()), ("setting", tuple(settings))):
            cmd = day_command(day, out / f"setting-{seed}-{tag}", 1, seed=seed, policies=policies)
            for kv in kvs:
                cmd += ["--control", kv]
            cmds.append(cmd)
        wall = run_side_by_side(cmds)
        got = [
            json.loads((out / f"setting-{seed}-{tag}" / "metrics.json").read_text())["policies"]
            for tag in ("defaults", "setting")
        ]
        m = [g["racktwin"]["metrics"] for g in got]
        reactive = [g["reactive"]["metrics"]["throughput"] for g in got]
        saved_kwh = m[0]["facility_energy_kwh"] - m[1]["facility_energy_kwh"]
        # throughput is the run's mean of cards computing at top speed: x its hours = card-hours of work
        lost_card_h = (m[0]["throughput"] - m[1]["throughput"]) * m[0]["duration_s"] / 3600.0
        net = saved_kwh * prices.energy_per_kwh - lost_card_h * prices.card_hour_value
        net_all.append(net)

        def pair(key: str, fmt: str, ms: list[dict[str, Any]] = m) -> str:
            return " / ".join(fmt.format(x[key]) for x in ms)

        vs_r = " / ".join(f"{_rel_pct(x['throughput'], r):+.3f}" for x, r in zip(m, reactive, strict=True))
        lines.append(
            f"| seed {seed} | {pair('facility_energy_saving_pct', '{:.2f}')} | {pair('throughput_loss_pct', '{:.3f}')} "
            f"| {vs_r} | {pair('queue_wait_mean_s', '{:.0f}')} | {pair('queue_wait_p95_s', '{:.0f}')} "
            f"| {saved_kwh:+.1f} | {lost_card_h:+.2f} | {net:+.1f} | {wall:.0f} |"
        )
        print(f"  day-{day} seed {seed}: {wall:.0f} s ({i + 1}/{n})", file=sys.stderr, flush=True)
    lines += [
        "",
        f"Net: the energy saved at {prices.energy_per_kwh:g} a kWh less the work lost at {prices.card_hour_value:g} "
        f"a card-hour (positive: the setting pays at the agent's prices); median {float(np.median(net_all)):+.1f}, "
        f"positive on {sum(x > 0 for x in net_all)} of {len(net_all)} workloads. Queue waits are not priced.",
    ]
    return "\n".join(lines)


def spread_table(day: str, runs: list[dict[str, Any]]) -> str:
    """One row per run (metrics.json of all five policies), then the median / min / max of each column."""
    n = len(runs)
    rows = [
        [fn({k: v["metrics"] for k, v in full["policies"].items()}) for _h, _f, fn in _SPREAD_COLUMNS] for full in runs
    ]
    labels = [
        f"seed {full['scenario']['workload_seed']} (offers {100 * full['scenario']['offered_allocation']:.1f}%)"
        for full in runs
    ]
    arr = np.array(rows)
    fmt = [f for _h, f, _fn in _SPREAD_COLUMNS]
    col = {h: k for k, (h, _f, _fn) in enumerate(_SPREAD_COLUMNS)}
    lines = [
        f"### day-{day} at {n} workloads (all five policies each; `--seeds {n}`)",
        "",
        "| day | " + " | ".join(h for h, _f, _fn in _SPREAD_COLUMNS) + " |",
        "|---|" + "---:|" * len(_SPREAD_COLUMNS),
    ]
    for label, r in zip(labels, rows, strict=True):
        lines.append(f"| {label} | " + " | ".join(f.format(v) for f, v in zip(fmt, r, strict=True)) + " |")
    for name, agg in (("median", np.median), ("min", np.min), ("max", np.max)):
        vals = agg(arr, axis=0)
        lines.append(f"| **{name}** | " + " | ".join(f.format(v) for f, v in zip(fmt, vals, strict=True)) + " |")
    wins = int(
        np.sum(
            (arr[:, col["racktwin work vs static-cap %"]] >= 0.0) & (arr[:, col["racktwin work vs reactive %"]] >= 0.0)
        )
    )
    ties = int(
        np.sum(
            (np.abs(arr[:, col["racktwin energy vs greedy %"]]) < 0.05)
            & (np.abs(arr[:, col["racktwin work vs greedy %"]]) < 0.05)
        )
    )
    lines += [
        "",
        f"racktwin did at least the work of static-cap and reactive on {wins} of {n} days; its energy and work "
        f"were within 0.05% of greedy's on {ties} of {n} days.",
    ]
    gaps = [
        (label, _missed_why(full.get("targets"), "better than reactive"))
        for label, full in zip(labels, runs, strict=True)
    ]
    if any(why for _l, why in gaps):
        lines += ["", "Where racktwin did less work than reactive (the target's why, by job):", ""]
        lines += [f"- {label}: {why}" for label, why in gaps if why]
    return "\n".join(lines)


def _missed_why(targets: dict[str, Any] | None, name: str) -> str:
    """The why of the target check ``name`` where it was missed ("" where met or not judged)."""
    for c in (targets or {}).get("checks", []):
        if c["name"] == name and c["met"] is False:
            return str(c["why"])
    return ""


def targets_lines(targets: dict[str, Any] | None) -> list[str]:
    """The scenario's [targets] as judged by ``racktwin evaluate`` (metrics.json ``targets``), as markdown."""
    if not targets:
        return []
    checks = targets["checks"]
    met = sum(1 for c in checks if c["met"] is True)
    head = f"The scenario's targets for {targets['policy']}, as `racktwin evaluate` judged them"
    out = ["", f"{head} ({met} of {len(checks)} met):", ""]
    for c in checks:
        verdict = "not judged" if c["met"] is None else ("met" if c["met"] else "**missed**")
        extra = f", {c['shortfall']}" if c["shortfall"] else ""
        out.append(f"- {verdict}: {c['name']}: {c['measured']} (target {c['target']}{extra})")
        if c["why"]:
            out.append(f"  - why: {c['why']}")
    return out


def _verdicts(checks: Any) -> str:
    """'2 of 2 met' (names of the missed ones after it) for the in-process fault table."""
    missed = [c.name for c in checks if c.met is False]
    met = sum(1 for c in checks if c.met is True)
    return f"{met} of {len(checks)} met" + (f" (missed: {', '.join(missed)})" if missed else "")


def run_faults(out: Path, speed: float, mqtt_duration: float, jobs: int | None, kinds: Sequence[str] = FAULTS) -> str:
    from agent.broker import EmbeddedBroker
    from agent.commands.demo import run_closed_loop
    from agent.evaluate import evaluate
    from twin.scenario import load_run_scenario

    rows_ip: list[str] = []
    rows_mq: list[str] = []
    broker = EmbeddedBroker().start()
    try:
        for kind in kinds:
            path = REPO / "examples" / f"day-fault-{kind}.toml"
            sc = load_run_scenario(path)
            t0 = time.perf_counter()
            ev = evaluate(sc, ["baseline", "reactive", "racktwin"], jobs=jobs or 2)
            wall = time.perf_counter() - t0
            for name in ("baseline", "reactive", "racktwin"):
                m = ev.results[name].metrics
                st = ev.results[name].stats
                rows_ip.append(
                    f"| {kind} | {name} | {m['limit_violation_s']:,.0f} | {m['limit_violation_longest_s']:,.0f} | "
                    f"{m['max_rack_power_w'] / 1e3:.2f} | {m['max_die_temp_c']:.1f} | "
                    f"{m['die_over_max_card_s']:,.0f} | "
                    f"{m['facility_energy_kwh']:,.1f} | {m['throughput']:,.1f} | {m['failsafe_entries']} "
                    f"({m['failsafe_racks'] or '-'}) | {m['fallbacks']} | {m['invalid_readings']:,} | "
                    f"{m['anomalies'] or '-'} | {m['commands_refused']} | {st.statuses or '-'} | "
                    + (_verdicts(ev.targets) if name == ev.targets_policy else "-")
                    + f" | {wall:,.0f} |"
                )
            folder = out / f"mqtt-{kind}"
            folder.mkdir(parents=True, exist_ok=True)
            short = load_run_scenario(path, duration_s=mqtt_duration)
            t0 = time.perf_counter()
            res = asyncio.run(run_closed_loop(path, short, broker.url, folder, speed=speed))
            wall = time.perf_counter() - t0
            m = res.metrics
            rows_mq.append(
                f"| {kind} | {m['duration_s']:,.0f} | {res.stopped_by} | {res.agent_error or 'none'} | "
                f"{m['limit_violation_s']:,.0f} | {m['limit_violation_longest_s']:,.0f} | "
                f"{m['max_rack_power_w'] / 1e3:.2f} | {m['max_die_temp_c']:.1f} | {res.decisions} | "
                f"{res.failsafe_entries} ({', '.join(res.failsafe_racks) or '-'}) | {res.fallbacks} | "
                f"{res.invalid_readings:,} / {res.rejected_messages:,} | {', '.join(res.anomalies) or '-'} | "
                f"{res.sim_summary.get('commands_applied', '-')} / {res.sim_summary.get('commands_rejected', '-')} / "
                f"{res.sim_summary.get('commands_expired', '-')} | {wall:,.0f} |"
            )
            print(rows_ip[-1], file=sys.stderr, flush=True)
            print(rows_mq[-1], file=sys.stderr, flush=True)
    finally:
        broker.stop()
    head_ip = (
        "| fault | policy | over limit rack-s | longest s | max rack kW | max die C | die over max card-s | "
        "facility kWh | throughput | fail-safe entries | fallbacks | readings refused | anomalies | "
        "commands refused | decision statuses | scenario targets | wall s (3 policies) |\n|---|---|" + "---:|" * 15
    )
    head_mq = (
        "| fault | site s | stopped by | agent error | over limit rack-s | longest s | max rack kW | max die C | "
        "decisions | fail-safe entries | fallbacks | readings refused / messages rejected | anomalies | "
        "commands applied / rejected / expired | wall s |\n|---|" + "---:|" * 14
    )
    return (
        "### Faults in process (2 hours each, true values)\n\n"
        + head_ip
        + "\n"
        + "\n".join(rows_ip)
        + f"\n\n### Faults through MQTT (simulator + agent service + broker, {speed:g}x)\n\n"
        + head_mq
        + "\n"
        + "\n".join(rows_mq)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", nargs="*", default=list(DAYS), choices=DAYS)
    ap.add_argument("--faults", action="store_true", help="run the fault scenarios instead of the days")
    ap.add_argument(
        "--fault",
        action="append",
        choices=FAULTS,
        metavar="KIND",
        help=f"with --faults: only this one (repeatable; {', '.join(FAULTS)})",
    )
    ap.add_argument("--mqtt-speed", type=float, default=20.0)
    ap.add_argument("--mqtt-duration", type=float, default=2400.0, help="site seconds of each MQTT fault run")
    ap.add_argument(
        "--seeds", type=int, default=0, metavar="N", help="each day at N different workloads (a table of the spread)"
    )
    ap.add_argument("--host-sweep", action="store_true", help="racktwin's host power-down settings side by side")
    ap.add_argument(
        "--plant-fallback",
        action="store_true",
        help=(
            "racktwin on the nominal day with and without the plant's fallback scheduler, and with the plant "
            "placing every job, side by side"
        ),
    )
    ap.add_argument(
        "--setting",
        action="append",
        metavar="KEY=VALUE",
        help="with --seeds: racktwin with this [control] setting against its defaults on each workload (repeatable)",
    )
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--out", default="/tmp/racktwin-bench-evaluate")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# bench_evaluate: {time.strftime('%Y-%m-%d %H:%M')}, {machine()}\n")
    if args.faults:
        print(run_faults(out, args.mqtt_speed, args.mqtt_duration, args.jobs, args.fault or FAULTS))
        return 0
    if args.host_sweep:
        print(host_sweep(out))
        return 0
    if args.plant_fallback:
        print(fallback_table(out))
        return 0
    if args.seeds < 0:
        ap.error("--seeds must be >= 0")
    if args.seeds:
        for day in args.days:  # before any run: a day of listed jobs would end the run after the others
            workload_seeds(day, 1)
    if args.setting:
        if not args.seeds:
            ap.error("--setting needs --seeds N")
        for kv in args.setting:
            if "=" not in kv:
                ap.error(f"--setting {kv!r}: expected KEY=VALUE")
        for day in args.days:
            print(setting_table(day, args.seeds, args.setting, out))
            print()
        return 0
    for day in args.days:
        if args.seeds:
            print(seed_table(day, args.seeds, out, args.jobs))
            print()
            continue
        full, wall = run_day(day, out, args.jobs)
        print(day_tables(day, full, wall))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
