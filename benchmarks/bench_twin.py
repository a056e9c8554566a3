"""Speed of the virtual plant (twin.plant) and of the agent-side state and estimator.

Headline (issue 2): one simulated day of the 512-card site at 1 s steps in under 60 s on a 2-core
machine, readings taken every second; the 8,192-card site (16 supernodes) at 100x real time or
better. The day is simulated in full (never extrapolated from a shorter run): a generated workload
(Kalos statistics, 65% card allocation, ~1,000 jobs), job events drained every step, readings at
the given period.

Also ``fit-thermal`` (``twin.thermal.fit_thermal``) on a 100,000-sample series (a day of one card
at ~1 s): the whole fit, and one evaluation of its simulated response by the vectorized scan
(``first_order_scan``) against the sample-by-sample loop it replaced, side by side.

Usage:
    python benchmarks/bench_twin.py            # the full set (about 3 minutes)
    python benchmarks/bench_twin.py --quick    # a smoke run: 1 simulated hour, 1 run each
    python benchmarks/bench_twin.py --fit-only # only the fit-thermal part

Results: benchmarks/results-twin.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twin.estimate import Estimator
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec, load_site
from twin.state import TwinState
from twin.thermal import first_order_scan, fit_thermal
from twin.workload import generate_jobs

SITE = Path(__file__).resolve().parents[1] / "examples" / "supernode-512.toml"


def run_plant(
    site: SiteSpec, horizon_s: float, dt_s: float, read_every_s: float, seed: int, warmup_s: float = 0.0
) -> dict[str, float]:
    """Simulate ``horizon_s`` (after an untimed warm-up) and return timings."""
    jobs = generate_jobs(site.n_cards, warmup_s + horizon_s, seed=seed)
    plant = Plant(site, jobs, config=PlantConfig(seed=seed))
    if warmup_s > 0:
        plant.run(warmup_s, dt_s)
        plant.drain_events()
    steps = round(horizon_s / dt_s)
    read_every = round(read_every_s / dt_s) if read_every_s > 0 else 0
    t0 = time.perf_counter()
    for k in range(steps):
        plant.step(dt_s)
        plant.drain_events()
        if read_every and k % read_every == 0:
            plant.readings()
    wall = time.perf_counter() - t0
    acc = plant.accounting()
    return {
        "wall_s": wall,
        "ms_per_step": 1e3 * wall / steps,
        "rtf": horizon_s / wall,
        "jobs": float(acc.jobs_submitted),
        "alloc": acc.work_card_s / (site.n_cards * plant.time_s),
    }


def run_agent_side(site: SiteSpec, n_updates: int, seed: int) -> dict[str, float]:
    """Cost of TwinState.update + snapshot and Estimator.update per reading (1 s readings)."""
    jobs = generate_jobs(site.n_cards, 7200, seed=seed)
    plant = Plant(site, jobs, config=PlantConfig(seed=seed))
    plant.run(1800.0, 1.0)
    readings = []
    events = []
    for _ in range(n_updates):
        plant.step(1.0)
        readings.append(plant.readings())
        events.append(plant.drain_events())
    state = TwinState(site)
    est = Estimator(site)
    t0 = time.perf_counter()
    for r, ev in zip(readings, events, strict=True):
        state.update(r)
        state.apply_events(ev)
    t1 = time.perf_counter()
    for _ in range(n_updates):
        state.snapshot()
    t2 = time.perf_counter()
    for r in readings:
        est.update(r)
    t3 = time.perf_counter()
    return {
        "state_ms": 1e3 * (t1 - t0) / n_updates,
        "snapshot_ms": 1e3 * (t2 - t1) / n_updates,
        "estimator_ms": 1e3 * (t3 - t2) / n_updates,
    }


def _loop_response(a: np.ndarray, b: np.ndarray, x0: float) -> np.ndarray:
    """The sample-by-sample recurrence fit_thermal used before the scan (the reference)."""
    x = np.empty(a.size + 1)
    x[0] = x0
    for k in range(a.size):
        x[k + 1] = a[k] * x[k] + b[k]
    return x


def bench_fit_thermal(n: int, runs: int) -> None:
    """fit_thermal on an n-sample step series (R 0.053 K/W, tau 9 s, 0.2 K noise), and one response
    evaluation by scan vs loop on the same data (medians of ``runs``)."""
    rng = np.random.default_rng(0)
    t = np.arange(n, dtype=np.float64)
    power = np.where((t // 600) % 2 == 0, 650.0, 150.0) + rng.normal(0.0, 5.0, n)
    inlet = 30.0 + 2.0 * np.sin(t / 3000.0)
    a = np.full(n - 1, np.exp(-1.0 / 9.0))
    die = _loop_response(a, (1.0 - a) * (inlet[:-1] + 0.053 * power[:-1]), inlet[0] + 0.053 * power[0])
    die += rng.normal(0.0, 0.2, n)
    fits, scans, loops = [], [], []
    fit = None
    for _ in range(runs):
        t0 = time.perf_counter()
        fit = fit_thermal(t, power, inlet, die)
        fits.append(time.perf_counter() - t0)
        b = (1.0 - a) * power[:-1]
        t0 = time.perf_counter()
        first_order_scan(a, b)
        scans.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _loop_response(a, b, 0.0)
        loops.append(time.perf_counter() - t0)
    assert fit is not None
    scan_s, loop_s = statistics.median(scans), statistics.median(loops)
    print(f"fit-thermal, {n:,} samples ({runs} runs, medians):")
    print(
        "| fit_thermal s | fitted R K/W (true 0.053) | fitted tau s (true 9) | one response: scan ms | loop ms"
        " | loop / scan |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {statistics.median(fits):.2f} | {fit.r_th_k_per_w:.5f} | {fit.tau_s:.2f} | {1e3 * scan_s:.1f} | "
        f"{1e3 * loop_s:.1f} | {loop_s / scan_s:.0f}x |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 simulated hour, one run each (smoke test)")
    ap.add_argument("--runs", type=int, default=3, help="runs of the headline cases (median reported)")
    ap.add_argument("--fit-only", action="store_true", help="only the fit-thermal part")
    args = ap.parse_args()
    if args.fit_only:
        bench_fit_thermal(100_000, max(args.runs, 1))
        return 0
    runs = 1 if args.quick else args.runs
    day = 3600.0 if args.quick else 86400.0
    site = load_site(SITE)
    big = site.with_supernodes(16)
    print(f"python {platform.python_version()}, {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    rows = []

    def case(name: str, s: SiteSpec, horizon: float, read_every: float, n: int, warmup: float = 0.0) -> None:
        results = [run_plant(s, horizon, 1.0, read_every, seed=1 + i, warmup_s=warmup) for i in range(n)]
        med = statistics.median(r["wall_s"] for r in results)
        mid = min(results, key=lambda r: abs(r["wall_s"] - med))
        rows.append((name, s.n_cards, horizon, read_every, n, mid))
        print(
            f"  {name}: {med:.1f} s wall, {mid['ms_per_step']:.3f} ms/step, {mid['rtf']:.0f}x real time "
            f"(runs: {', '.join(format(r['wall_s'], '.1f') for r in results)})",
            flush=True,
        )

    print("plant, 1 s steps:")
    span = "1 h (quick)" if args.quick else "1 day"
    case(f"512 cards, {span}, readings every 1 s", site, day, 1.0, runs)
    case(f"512 cards, {span}, readings every 10 s", site, day, 10.0, 1)
    case(f"512 cards, {span}, no readings", site, day, 0.0, 1)
    big_h = 600.0 if args.quick else 3600.0
    span = "10 min (quick)" if args.quick else "1 h"
    case(f"8192 cards, {span} after 1 h warm-up, readings every 1 s", big, big_h, 1.0, runs, warmup=3600.0)
    case(f"8192 cards, {span} after 1 h warm-up, readings every 10 s", big, big_h, 10.0, 1, warmup=3600.0)

    print()
    print("| case | cards | simulated s | readings every s | runs | wall s (median) | ms/step | x real time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, n_cards, horizon, every, n, r in rows:
        every_txt = f"{every:g}" if every else "-"
        print(
            f"| {name} | {n_cards} | {horizon:.0f} | {every_txt} | {n} | {r['wall_s']:.1f} | "
            f"{r['ms_per_step']:.3f} | {r['rtf']:.0f} |"
        )

    print()
    print("agent side, per 1 s reading (TwinState.update + apply_events, snapshot, Estimator.update):")
    print("| cards | state update ms | snapshot ms | estimator ms |")
    print("|---:|---:|---:|---:|")
    for s in (site, big):
        a = run_agent_side(s, 60 if args.quick else 300, seed=3)
        print(f"| {s.n_cards} | {a['state_ms']:.3f} | {a['snapshot_ms']:.3f} | {a['estimator_ms']:.3f} |")
    print()
    bench_fit_thermal(10_000 if args.quick else 100_000, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
