"""CPU seconds of one policy over part of a scenario, in process: for side-by-side runs of two commits.

    python benchmarks/bench_policy_cpu.py                                  # racktwin, the nominal day's first hour
    python benchmarks/bench_policy_cpu.py --policy greedy --duration-s 7200
    python benchmarks/bench_policy_cpu.py --split      # also: wall seconds in HiGHS and in Pyomo's layers

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

``--split`` times the solver's layers with wrappers (no profiler, whose overhead falls mostly on
Pyomo's many small calls): HiGHS's own ``Highs.run``, Pyomo's model loading (``set_instance``), its
parameter updates and solve wrapper, and racktwin's model building and data setting. The wrappers
cost a few microseconds per call; the split is of wall time in the calls (the solve runs in a worker
thread while the caller waits, so wall and CPU agree).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.evaluate import run_policy
from twin.scenario import load_run_scenario

REPO = Path(__file__).resolve().parents[1]


def _time_calls(owner: Any, name: str, key: str, spent_s: dict[str, float]) -> None:
    """Replace ``owner.name`` by a wrapper adding the wall seconds of each call to ``spent_s[key]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent_s[key] += time.perf_counter() - t0

    setattr(owner, name, timed)


def time_solver_layers() -> dict[str, float]:
    """Wrap the solver's layers (before the run); the counter fills as the policy runs."""
    import highspy
    from pyomo.contrib.solver.solvers.highs import Highs

    import models.solve as solve

    layers = (
        (solve, "highs_solve", "solves through Pyomo, in all"),
        (highspy.Highs, "run", "  HiGHS's run (the solver itself)"),
        (Highs, "set_instance", "  Pyomo: load a new model"),
        (Highs, "update_parameters", "  Pyomo: update its parameters"),
        (solve, "build_dvfs_model", "racktwin: build a DVFS model"),
        (solve, "set_dvfs_data", "racktwin: set a DVFS model's data"),
    )
    spent_s = {key: 0.0 for _, _, key in layers}  # in this order when printed
    for owner, name, key in layers:
        _time_calls(owner, name, key, spent_s)
    return spent_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "examples" / "day-nominal.toml"), help="run-scenario TOML")
    ap.add_argument("--policy", default="racktwin", help="baseline, static-cap, reactive, greedy or racktwin")
    ap.add_argument("--duration-s", type=float, default=3600.0, help="site seconds from the start (default 3600)")
    ap.add_argument("--split", action="store_true", help="also time HiGHS and Pyomo's layers (wall s)")
    args = ap.parse_args()
    spent_s = time_solver_layers() if args.split else None
    scenario = load_run_scenario(Path(args.scenario), duration_s=args.duration_s)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res = run_policy(scenario, args.policy)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    m = res.metrics
    print(
        f"{args.policy}: {cpu_s:.1f} CPU s for {args.duration_s:g} site s; "
        f"facility {m['facility_energy_kwh']:.3f} kWh, throughput {m['throughput']:.5f}"
    )
    if spent_s is not None:
        print(f"{'wall s of the run':34s} {wall_s:7.2f}")
        for key in spent_s:
            print(f"{key:34s} {spent_s[key]:7.2f}  ({spent_s[key] / wall_s:.0%})")


if __name__ == "__main__":
    main()
