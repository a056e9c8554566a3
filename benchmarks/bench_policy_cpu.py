"""CPU seconds of one policy over part of a scenario, in process: for side-by-side runs of two commits.

    python benchmarks/bench_policy_cpu.py                                  # racktwin, day-nominal.toml for 3,600 site s
    python benchmarks/bench_policy_cpu.py --policy greedy --duration-s 7200
    python benchmarks/bench_policy_cpu.py --split      # also: wall seconds in HiGHS and in Pyomo's layers
    python benchmarks/bench_policy_cpu.py --against 3db24c1 --pairs 3      # this checkout vs a commit

``racktwin evaluate``'s wall time hangs on the machine as much as on the code (the shared 2-core
machine here ran the baseline policy in 22 CPU s one day and 39 the next). To tell a slower code
from a slower machine, run the same policy at two commits at once, one process each, and compare
(the results must be the same to the digit when the controller did not change). ``--against
COMMIT`` does that: it checks the commit out in a temporary git worktree, runs the policy in this
checkout and in the worktree at the same time (one process each, ``--pairs`` times, which starts
first alternating), and prints each pair's wall and CPU seconds, their ratio (this checkout / the
commit), the medians, and whether the two runs' facility energy and throughput agree to the digit.
Both runs read this checkout's scenario file; a commit without the packages the runner imports is
refused; a failed run, Ctrl-C or SIGTERM stops both runs and removes the worktree. By hand:

    git worktree add /tmp/old <commit>
    (cd /tmp/old && PYTHONPATH=$PWD python benchmarks/bench_policy_cpu.py) &
    PYTHONPATH=$PWD python benchmarks/bench_policy_cpu.py; wait

It prints the policy's CPU seconds (the process's, the run alone: loading the scenario excluded),
its facility energy and its throughput. ``--duration-s`` shortens the scenario as ``racktwin evaluate
--duration`` does: its generated workload is drawn for that duration (``load_run_scenario``), so the
nominal day's hour is not the first hour of its full-day workload (workload seed 24, not 10). The
side-by-side pairs in benchmarks/results-evaluation.md ("Re-measured 2026-12-02 09:54") come from the
first version of this script (a scratch copy).

``--split`` times the solver's layers with wrappers (no profiler, whose overhead falls mostly on
Pyomo's many small calls): HiGHS's own ``Highs.run``, Pyomo's model loading (``set_instance``), its
parameter updates and solve wrapper, and racktwin's model building and data setting. The wrappers
cost a few microseconds per call; the split is of wall time in the calls (the solve runs in a worker
thread while the caller waits, so wall and CPU agree).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's packages, not an installed racktwin's

from agent.evaluate import run_policy  # noqa: E402
from twin.scenario import load_run_scenario  # noqa: E402


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

    import models.dvfs_solver as dvfs_solver

    layers = (
        (dvfs_solver, "highs_solve", "solves through Pyomo, in all"),
        (highspy.Highs, "run", "  HiGHS's run (the solver itself)"),
        (Highs, "set_instance", "  Pyomo: load a new model"),
        (Highs, "update_parameters", "  Pyomo: update its parameters"),
        (dvfs_solver, "build_dvfs_model", "racktwin: build a DVFS model"),
        (dvfs_solver, "set_dvfs_data", "racktwin: set a DVFS model's data"),
    )
    spent_s = {key: 0.0 for _, _, key in layers}  # in this order when printed
    for owner, name, key in layers:
        _time_calls(owner, name, key, spent_s)
    return spent_s


#: Run in each tree by ``--against`` (``python -c``, the tree's own packages first on the path): one
#: policy run, its times and results as one JSON line. Only ``load_run_scenario`` and ``run_policy``,
#: whose signatures older commits share, so that any recent commit can be measured; a tree whose
#: packages are not the ones imported (a commit without them falls through to the installed
#: checkout's) is refused rather than measured as a mix of two trees.
_PAIR_RUNNER = """
import json, sys, time
from pathlib import Path
tree = Path(sys.argv[4]).resolve()
try:
    import agent.evaluate, twin.scenario
except ImportError as exc:
    sys.exit(f"this tree lacks what the benchmark needs: {exc}")
for mod in (agent.evaluate, twin.scenario):
    if tree not in Path(mod.__file__).resolve().parents:
        sys.exit(f"{mod.__name__} came from {mod.__file__}, not from this tree: the commit lacks it")
scenario_path, policy, duration_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
scenario = twin.scenario.load_run_scenario(Path(scenario_path), duration_s=duration_s)
cpu0, wall0 = time.process_time(), time.perf_counter()
m = agent.evaluate.run_policy(scenario, policy).metrics
print(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0,
                  "facility_energy_kwh": m["facility_energy_kwh"], "throughput": m["throughput"]}))
"""


def _start_run(tree: Path, scenario: str, policy: str, duration_s: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen(
        [sys.executable, "-c", _PAIR_RUNNER, scenario, policy, repr(duration_s), str(tree)],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run_pair(runs: dict[str, subprocess.Popen[str]]) -> dict[str, dict[str, float]]:
    """Wait for both runs; the first to fail stops the other and ends the benchmark."""
    results: dict[str, dict[str, float]] = {}
    while len(results) < len(runs):
        for label, proc in runs.items():
            if label in results or proc.poll() is None:
                continue
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(
                    f"bench_policy_cpu: the run at {label} failed (exit {proc.returncode}):\n{err[-2000:].strip()}"
                )
            results[label] = dict(json.loads(out.strip().splitlines()[-1]))
        time.sleep(0.05)
    return results


def _stop(runs: dict[str, subprocess.Popen[str]]) -> None:
    for proc in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def against(commit: str, pairs: int, scenario: str, policy: str, duration_s: float) -> None:
    """This checkout and ``commit`` side by side (see the module docstring). The scenario file is
    this checkout's (``--scenario``) for both; the two runs start in alternating order."""
    rev = subprocess.run(
        ["git", "rev-parse", "--short", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if rev.returncode != 0:
        raise SystemExit(f"bench_policy_cpu: {commit!r} is not a commit of {REPO}: {rev.stderr.strip()}")
    short = rev.stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True)
    here = head.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")
    scenario_abs = str(Path(scenario).resolve())
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a kill cleans up as Ctrl-C does
    runs: dict[str, subprocess.Popen[str]] = {}
    with tempfile.TemporaryDirectory(prefix="racktwin-against-") as tmp:
        tree = Path(tmp) / short
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), short], cwd=REPO, check=True)
        try:
            print(
                f"{policy}, {duration_s:g} site s of {Path(scenario).name}: this checkout ({here}) vs {short}, "
                f"{pairs} pair(s), one process each at the same time",
                flush=True,
            )
            print("| pair | wall s, this / " + short + " | ratio | CPU s, this / " + short + " | ratio | results |")
            print("|---|---:|---:|---:|---:|---|")
            wall_ratio: list[float] = []
            cpu_ratio: list[float] = []
            for i in range(1, pairs + 1):
                order = [(here, REPO), (short, tree)] if i % 2 else [(short, tree), (here, REPO)]
                runs = {label: _start_run(root, scenario_abs, policy, duration_s) for label, root in order}
                res = _run_pair(runs)
                new, old = res[here], res[short]
                same = (
                    f"{new['facility_energy_kwh']:.6f}" == f"{old['facility_energy_kwh']:.6f}"
                    and f"{new['throughput']:.6f}" == f"{old['throughput']:.6f}"
                )
                results = (
                    f"the same ({new['facility_energy_kwh']:.3f} kWh, {new['throughput']:.5f})"
                    if same
                    else f"DIFFER: {new['facility_energy_kwh']:.6f} vs {old['facility_energy_kwh']:.6f} kWh, "
                    f"{new['throughput']:.6f} vs {old['throughput']:.6f}"
                )
                wall_ratio.append(new["wall_s"] / old["wall_s"])
                cpu_ratio.append(new["cpu_s"] / old["cpu_s"])
                print(
                    f"| {i} | {new['wall_s']:.2f} / {old['wall_s']:.2f} | {wall_ratio[-1]:.3f} | "
                    f"{new['cpu_s']:.1f} / {old['cpu_s']:.1f} | {cpu_ratio[-1]:.3f} | {results} |",
                    flush=True,
                )
            print(
                f"\nmedian ratio, this checkout / {short}: wall {statistics.median(wall_ratio):.3f}, "
                f"CPU {statistics.median(cpu_ratio):.3f} (below 1: this checkout is faster)"
            )
        finally:
            _stop(runs)
            removed = subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True, text=True
            )
            if removed.returncode != 0:
                print(
                    f"bench_policy_cpu: could not remove the worktree {tree}: {removed.stderr.strip()}", file=sys.stderr
                )
            subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "examples" / "day-nominal.toml"), help="run-scenario TOML")
    ap.add_argument("--policy", default="racktwin", help="baseline, static-cap, reactive, greedy or racktwin")
    ap.add_argument("--duration-s", type=float, default=3600.0, help="site seconds from the start (default 3600)")
    ap.add_argument("--split", action="store_true", help="also time HiGHS and Pyomo's layers (wall s)")
    ap.add_argument("--against", metavar="COMMIT", help="run this checkout and COMMIT side by side (see above)")
    ap.add_argument("--pairs", type=int, default=3, help="side-by-side pairs with --against (default 3)")
    args = ap.parse_args()
    if args.against is None and "--pairs" in sys.argv[1:]:
        ap.error("--pairs counts the side-by-side pairs of --against")
    if args.against is not None:
        if args.split:
            ap.error("--split times one run; use it without --against")
        if args.pairs < 1:
            ap.error("--pairs must be at least 1")
        try:
            against(args.against, args.pairs, args.scenario, args.policy, args.duration_s)
        except KeyboardInterrupt:
            raise SystemExit("bench_policy_cpu: interrupted (both runs stopped, the worktree removed)") from None
        return
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
