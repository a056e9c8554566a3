"""Agent service benchmark: decision latency, CPU and memory at steady state, against the simulator.

    python benchmarks/bench_agent.py                   # 512 and 2,048 cards, 3 min of wall time each
    python benchmarks/bench_agent.py --quick           # 512 and 2,048 cards, 45 s each
    python benchmarks/bench_agent.py --sizes 512 --minutes 5 --speed 10

Per site size: an embedded mosquitto, the simulator in its own process (``racktwin sim``: the
default scenario, generated workload at 65% allocation with warm start, diurnal ambient, jobs
arriving, stalls and checkpoints) at ``--speed`` site seconds per wall second, and the agent
(``agent.service.AgentService``, enforce mode, 15 s period of site time) in this process, so that
this process's CPU time and memory are the agent's. After ``--warmup-s`` the script measures over
the rest of the run:

* **latency**: wall time from the arrival of the message that triggers a decision to the publication
  of the first command it causes (``AgentService.latencies_s``), by trigger: ``period`` (the
  telemetry message that crosses a period boundary: a full MILP decision) and ``event`` (a job event
  that asks for a decision at once: the incremental adjustment, or the full one when the period
  boundary passes while it waits; includes the deliberate ``min_replan_interval_s`` spacing); only
  decisions that command something count. Median, p90,
  p99, max.
* **decision time**: wall time the service takes to make a decision and hand over its commands
  (``AgentService.decision_walls_s``: context, plan, guard, journal), by kind: ``full`` (periodic)
  and ``incremental`` (job events). The latency above adds the waits: an event decision comes at
  most every ``min_replan_interval_s`` of site time (2 s), so where job events come every few
  seconds (thousands of cards at real time) that spacing, not the computing, sets the latency.
* **commands in flight**: from the site time a command was issued to the site time its ack came back
  (the journal), against ``command_ttl_s`` (30 site s: one wall second at 30x); and how many
  commands the simulator received after their expiry (its summary's ``commands_expired``).
* **event loop lag**: a probe task in the agent's process sleeps 10 ms at a time and records how
  late it wakes (GIL contention with the solver thread and the ingest both show up here).
* **CPU**: this process's CPU time (``time.process_time``) per wall second (1.0 = one core busy).
* **memory**: resident set size at the end and its peak (``/proc/self/status`` VmRSS / VmHWM).
* decisions, commands sent / acknowledged applied, solve time (median of the decisions' solve time).

``--quality`` instead runs the controller in process (``agent.loop.ClosedLoop``, no MQTT) against the
uncontrolled baseline (every card at the top clock, idle cards awake, the site's 30 deg C set-point)
on the default scenario of the 512-card site for ``--hours`` of site time, and prints facility and
IT energy, work (top-clock card-seconds), energy per work, PUE, seconds over a rack limit and SLO
seconds lost. (The full comparison with the other policies is ``racktwin evaluate``.)

Prints Markdown tables (machine, date, command first); paste them into benchmarks/results-agent.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.broker import EmbeddedBroker  # noqa: E402
from agent.config import load_config  # noqa: E402
from agent.logs import setup_logging  # noqa: E402
from agent.service import AgentService  # noqa: E402


def _rss_kib() -> tuple[int, int]:
    cur = peak = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return cur, peak


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _write_site(folder: Path, supernodes: int) -> Path:
    text = (REPO / "examples" / "supernode-512.toml").read_text(encoding="utf-8")
    text = text.replace("supernodes = 1\n", f"supernodes = {supernodes}\n", 1)
    path = folder / f"site-{supernodes}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _write_config(folder: Path, site: Path, speed: float) -> Path:
    path = folder / "agent.toml"
    path.write_text(
        "\n".join(
            [
                f'site = "{site}"',
                'mode = "enforce"',
                "[control]",
                "period_s = 15.0",
                "solve_deadline_s = 1.0",
                f"time_scale = {1.0 / speed}",
                "[journal]",
                f'path = "{folder / "journal.sqlite"}"',
                "[http]",
                "port = 0",
                "[log]",
                'level = "warning"',
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    return path


@dataclasses.dataclass
class Result:
    cards: int
    speed: float
    wall_s: float
    site_s: float
    latencies: list[float]
    kinds: list[str]
    cpu_share: float
    rss_mib: float
    peak_rss_mib: float
    decisions: int
    commands_sent: int
    commands_applied: int
    solve_median_s: float
    sim_cpu_share: float
    ack_delays_s: list[float] = dataclasses.field(default_factory=list)  # site s, issue -> ack
    expired_in_flight: int = -1  # the simulator's commands_expired
    loop_lags_s: list[float] = dataclasses.field(default_factory=list)
    decision_walls_s: list[float] = dataclasses.field(default_factory=list)
    decision_kinds: list[str] = dataclasses.field(default_factory=list)


async def run_one(cards: int, speed: float, minutes: float, warmup_s: float) -> Result:
    supernodes = cards // 512
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp_s:
        tmp = Path(tmp_s)
        cfg_path = _write_config(tmp, _write_site(tmp, supernodes), speed)
        wall = minutes * 60.0
        async with EmbeddedBroker(backend="mosquitto") as broker:
            loaded = load_config(cfg_path, env={"RACKTWIN_BROKER_URL": f"mqtt://127.0.0.1:{broker.port}"})
            service = AgentService(loaded, mqtt=broker.options(client_id="bench-agent"), http=False)
            agent = asyncio.create_task(service.run())
            sim = subprocess.Popen(
                [
                    sys.executable, "-m", "agent.cli", "sim", "--broker", f"mqtt://127.0.0.1:{broker.port}",
                    "--speed", str(speed), "--duration", str((wall + 20.0) * speed), "--supernodes", str(supernodes),
                    "--seed", "1", "--summary", str(tmp / "sim.json"), "--progress-interval-s", "0",
                ],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            lags: list[float] = []
            probe = asyncio.create_task(_loop_probe(lags))
            try:
                await asyncio.sleep(warmup_s)
                lags.clear()
                t_issue0 = service.clock.now() or 0.0
                lat0 = len(service.latencies_s)
                walls0 = len(service.decision_walls_s)
                dec0 = service.decisions
                sent0 = service.publisher.stats.sent
                applied0 = _applied(service)
                cpu0, w0 = time.process_time(), time.monotonic()
                site0 = service.clock.now() or 0.0
                solves: list[float] = []
                end = w0 + wall - warmup_s
                seen = dec0
                while time.monotonic() < end:
                    await asyncio.sleep(0.5)
                    if service.decisions > seen and service.last_decision is not None:
                        solves.append(service.last_decision.solve_time_s)
                        seen = service.decisions
                cpu1, w1 = time.process_time(), time.monotonic()
                site1 = service.clock.now() or 0.0
                lats = list(service.latencies_s)[lat0:]
                kinds = list(service.latency_kinds)[lat0:]
                rss, peak = _rss_kib()
                res = Result(
                    cards=cards,
                    speed=speed,
                    wall_s=w1 - w0,
                    site_s=site1 - site0,
                    latencies=lats,
                    kinds=kinds,
                    cpu_share=(cpu1 - cpu0) / (w1 - w0),
                    rss_mib=rss / 1024,
                    peak_rss_mib=peak / 1024,
                    decisions=service.decisions - dec0,
                    commands_sent=service.publisher.stats.sent - sent0,
                    commands_applied=_applied(service) - applied0,
                    solve_median_s=statistics.median(solves) if solves else float("nan"),
                    sim_cpu_share=float("nan"),
                    ack_delays_s=_ack_delays(service, t_issue0),
                    loop_lags_s=list(lags),
                    decision_walls_s=list(service.decision_walls_s)[walls0:],
                    decision_kinds=list(service.decision_kinds)[walls0:],
                )
            finally:
                probe.cancel()
                sim.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    sim.wait(10)
                service.stop()
                await asyncio.wait_for(agent, 30)
            with contextlib.suppress(Exception):
                import json

                summ = json.loads((tmp / "sim.json").read_text())
                res.sim_cpu_share = float(summ.get("cpu_share", float("nan")))
                res.expired_in_flight = int(summ.get("commands_expired", -1))
            return res


async def _loop_probe(lags: list[float], interval_s: float = 0.01) -> None:
    """How late the event loop wakes a task that sleeps ``interval_s`` (s), appended to ``lags``."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(interval_s)
        lags.append(max(time.perf_counter() - t0 - interval_s, 0.0))


def _ack_delays(service: AgentService, since_s: float) -> list[float]:
    """Site seconds from each command's issue to its ack, for commands issued after ``since_s``."""
    rows = service.journal._db.execute(
        "SELECT MIN(a.site_time_s) - c.issued_s FROM commands c JOIN acks a ON a.command_id = c.command_id "
        "WHERE c.issued_s >= ? GROUP BY c.command_id",
        (since_s,),
    ).fetchall()
    return [float(r[0]) for r in rows if r[0] is not None]


def _applied(service: AgentService) -> int:
    for metric in service.metrics.commands_total.collect():
        for s in metric.samples:
            if s.name.endswith("_total") and s.labels.get("result") == "applied":
                return int(s.value)
    return 0


def quality(hours: float, seed: int) -> None:
    from agent.config import ControlConfig
    from agent.controller import Controller
    from agent.loop import ClosedLoop
    from twin.scenario import build_plant, default_run_scenario
    from twin.spec import load_site

    site = load_site(REPO / "examples" / "supernode-512.toml")
    duration = hours * 3600.0
    scenario = default_run_scenario(site, duration, seed=seed)
    rows = []
    for name in ("baseline", "racktwin"):
        plant = build_plant(scenario)
        t0 = time.perf_counter()
        if name == "baseline":
            plant.run(duration)
        else:
            ClosedLoop(plant, Controller(site, ControlConfig(period_s=15.0))).run(duration)
        rows.append((name, plant.accounting(), time.perf_counter() - t0))
    base = rows[0][1]
    print(f"default scenario, 512 cards, {hours:g} h of site time, seed {seed}\n")
    print("| policy | facility kWh | IT kWh | PUE | work (card-h) | facility J / work | over limit | SLO s | run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, a, wall in rows:
        dw = 100 * (a.work_card_s / base.work_card_s - 1)
        de = 100 * (a.facility_energy_per_work_j / base.facility_energy_per_work_j - 1)
        print(
            f"| {name} | {a.facility_energy_j / 3.6e6:,.1f} | {a.it_energy_j / 3.6e6:,.1f} | {a.pue:.4f} | "
            f"{a.work_card_s / 3600:,.0f} ({dw:+.1f}%) | {a.facility_energy_per_work_j:.1f} ({de:+.1f}%) | "
            f"{a.rack_over_limit_s:.0f} s | {a.slo_violation_s:.0f} | {wall:.0f} s |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,2048", help="site sizes in cards (multiples of 512)")
    ap.add_argument("--speed", type=float, default=10.0, help="site seconds per wall second")
    ap.add_argument("--minutes", type=float, default=3.0, help="wall minutes per size (warm-up included)")
    ap.add_argument("--warmup-s", type=float, default=30.0, help="wall seconds before measuring")
    ap.add_argument("--quick", action="store_true", help="45 s per size, 15 s warm-up")
    ap.add_argument("--quality", action="store_true", help="in-process control quality against the baseline")
    ap.add_argument("--hours", type=float, default=2.0, help="site hours for --quality")
    ap.add_argument("--seed", type=int, default=1, help="scenario seed for --quality")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.warmup_s = 0.75, 15.0
    sizes = [int(x) for x in args.sizes.split(",")]
    setup_logging("error", "text")
    # the report goes to a copy of stdout; native output (the banner HiGHS prints on its first instance) goes nowhere
    report = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = report
    import numpy
    import pyomo.version

    print(
        f"{platform.node() or 'vm'} | {platform.processor() or platform.machine()} | {os.cpu_count()} CPUs | "
        f"Python {platform.python_version()} | numpy {numpy.__version__} | pyomo {pyomo.version.version} | "
        f"{dt.date.today().isoformat()}"
    )
    print(f"\ncommand: python benchmarks/bench_agent.py {' '.join(sys.argv[1:])}\n")
    if args.quality:
        quality(args.hours, args.seed)
        return
    results = [asyncio.run(run_one(n, args.speed, args.minutes, args.warmup_s)) for n in sizes]
    print("| cards | site s measured (x real time) | decisions | trigger | samples | median | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for kind in ("all", "period", "event"):
            ms = [1e3 * x for x, k in zip(r.latencies, r.kinds, strict=True) if kind in ("all", k)]
            print(
                f"| {r.cards:,} | {r.site_s:,.0f} ({r.site_s / r.wall_s:.1f}x) | {r.decisions} | {kind} | {len(ms)} | "
                f"{_pct(ms, 0.5):.0f} ms | {_pct(ms, 0.9):.0f} ms | {_pct(ms, 0.99):.0f} ms | "
                f"{max(ms, default=float('nan')):.0f} ms |"
            )
    print()
    print("| cards | decision | made and handed over in: median | p90 | p99 | max |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for kind in ("full", "incremental"):
            ms = [1e3 * x for x, k in zip(r.decision_walls_s, r.decision_kinds, strict=True) if k == kind]
            print(
                f"| {r.cards:,} | {kind} ({len(ms)}) | {_pct(ms, 0.5):.0f} ms | {_pct(ms, 0.9):.0f} ms | "
                f"{_pct(ms, 0.99):.0f} ms | {max(ms, default=float('nan')):.0f} ms |"
            )
    print()
    print(
        "| cards | agent CPU (1 = one core) | RSS end | RSS peak | solve median | commands sent | applied | sim CPU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.cards:,} | **{r.cpu_share:.3f}** | {r.rss_mib:.0f} MiB | {r.peak_rss_mib:.0f} MiB | "
            f"{1e3 * r.solve_median_s:.0f} ms | {r.commands_sent} | {r.commands_applied} | {r.sim_cpu_share:.3f} |"
        )
    print()
    print(
        "| cards | speed | command issued -> acked, site s: median / p99 / max | acked | expired at the simulator "
        "(whole run) | event loop lag: median / p99 / max |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        d = r.ack_delays_s
        lag = [1e3 * x for x in r.loop_lags_s]
        print(
            f"| {r.cards:,} | {r.speed:g}x | {_pct(d, 0.5):.1f} / {_pct(d, 0.99):.1f} / "
            f"{max(d, default=float('nan')):.1f} | {len(d)} | {r.expired_in_flight} | "
            f"{_pct(lag, 0.5):.1f} / {_pct(lag, 0.99):.1f} / {max(lag, default=float('nan')):.0f} ms |"
        )


if __name__ == "__main__":
    main()
