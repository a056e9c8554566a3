"""CPU seconds of one policy over part of a scenario, in process: for side-by-side runs of two commits.

    python benchmarks/bench_policy_cpu.py                                  # racktwin, the nominal day's first hour
    python benchmarks/bench_policy_cpu.py --policy greedy --duration-s 7200

``racktwin evaluate``'s wall time hangs on the machine as much as on the code (the shared 2-core
machine here ran the baseline policy in 22 CPU s one day and 39 the next). To tell a slower code
from a slower machine, run the same policy at two commits at once, one process each, and compare
(the results must be the same to the digit when the controller did not change):

    git worktree add /tmp/old <commit>
    (cd /tmp/old && PYTHONPATH=$PWD python benchmarks/bench_policy_cpu.py) &
    PYTHONPATH=$PWD python benchmarks/bench_policy_cpu.py; wait

It prints the policy's CPU seconds (the process's, the run alone: loading the scenario excluded),
its facility energy and its throughput. The side-by-side pairs in benchmarks/results-evaluation.md
("Re-measured 2026-12-02 09:54") come from the first version of this script (a scratch copy).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from agent.evaluate import run_policy
from twin.scenario import load_run_scenario

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "examples" / "day-nominal.toml"), help="run-scenario TOML")
    ap.add_argument("--policy", default="racktwin", help="baseline, static-cap, reactive, greedy or racktwin")
    ap.add_argument("--duration-s", type=float, default=3600.0, help="site seconds from the start (default 3600)")
    args = ap.parse_args()
    scenario = load_run_scenario(Path(args.scenario), duration_s=args.duration_s)
    cpu0 = time.process_time()
    res = run_policy(scenario, args.policy)
    cpu_s = time.process_time() - cpu0
    m = res.metrics
    print(
        f"{args.policy}: {cpu_s:.1f} CPU s for {args.duration_s:g} site s; "
        f"facility {m['facility_energy_kwh']:.3f} kWh, throughput {m['throughput']:.5f}"
    )


if __name__ == "__main__":
    main()
