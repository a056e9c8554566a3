"""Size of the simulator's retained job snapshot (``jobs/state``, docs/sim.md and docs/protocol.md).

Runs the plant of each run scenario in process, without an agent (the plant's own scheduler places
the jobs after the scenario's ``external_timeout_s``), folds its job events as ``racktwin sim`` does
(``sim.telemetry.TelemetryEncoder``) and encodes one snapshot at t = 0 and one after each 1 s step with
job events, as the simulator publishes them. Prints, per scenario, the snapshots made, their median and
largest size in bytes and the jobs (running) in the largest.

    python benchmarks/bench_job_snapshot.py                      # the three scenarios of docs/sim.md
    python benchmarks/bench_job_snapshot.py examples/sim-2048.toml:3600

A scenario is ``PATH`` or ``PATH:SECONDS`` (its first SECONDS of site time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import wire
from sim.telemetry import TelemetryEncoder
from twin.scenario import build_plant, load_run_scenario

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ("examples/day-nominal.toml", "examples/sim-default.toml", "examples/sim-2048.toml:3600")
EPOCH_S = 1.8e9


def measure(spec: str) -> tuple[int, float, int, int, int, float]:
    """(snapshots, median bytes, largest bytes, jobs and running jobs in the largest, wall s)."""
    path, _, seconds = spec.partition(":")
    sc = load_run_scenario(REPO / path, duration_s=float(seconds) if seconds else None, warn=lambda _line: None)
    plant = build_plant(sc)
    enc = TelemetryEncoder(wire.Codec(wire.SiteLayout.from_spec(sc.site, site="site1")), sc.site, wire.Sequencer("sim"))
    sizes: list[int] = []
    largest = (0, 0, 0)
    t0 = time.perf_counter()
    first = True
    while first or plant.time_s < sc.duration_s - 1e-9:
        if not first:
            plant.step(1.0)
        events = plant.drain_events()
        if events or first:
            for ev in events:
                enc.job_event(ev, EPOCH_S)
            n = len(enc.job_state(EPOCH_S + plant.time_s).payload)
            sizes.append(n)
            if n > largest[0]:
                entries = enc.jobs.entries()
                largest = (n, len(entries), sum(1 for e in entries if e.cards is not None))
        first = False
    return len(sizes), statistics.median(sizes), *largest, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=DEFAULT, help="PATH or PATH:SECONDS (default: %(default)s)")
    args = parser.parse_args()
    print("| scenario | site s | snapshots | median bytes | largest bytes | jobs (running) in the largest | wall s |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for spec in args.scenarios:
        count, median, most, jobs, running, wall = measure(spec)
        path, _, seconds = spec.partition(":")
        print(
            f"| `{path}` | {seconds or 'all'} | {count:,} | {median:,.0f} | {most:,} | {jobs} ({running})"
            f" | {wall:.1f} |"
        )


if __name__ == "__main__":
    main()
