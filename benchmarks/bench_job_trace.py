"""One job second by second under two policies: where its work goes (resumes at a slow level).

    python benchmarks/bench_job_trace.py                          # j006055 of the nominal day, reactive vs racktwin
    python benchmarks/bench_job_trace.py --duration-h 6           # j006055 over the day's first six hours
    python benchmarks/bench_job_trace.py --job j008422            # submitted at 21.4 h: the whole day
    python benchmarks/bench_job_trace.py --control resume_lag_s=10   # racktwin with an agent setting

``racktwin evaluate`` names the jobs whose work differs between two policies (``agent.job_work``);
this script shows why for one of them. It runs each policy over the scenario in process (the same
``agent.policies`` policies ``racktwin evaluate`` runs, from the same seed, one process each, side by
side) and, after every plant second, reads the job's phase, its training progress and the level in
force on its cards (true values). Per policy it reports:

* the seconds the job computed, and how often it resumed computing after each kind of pause;
* the seconds it computed at less than its full rate (the largest rate seen in the run) and the
  card-seconds of work those cost, split into the slow seconds from a resume on (the level it was
  given while paused is still in force: a level takes effect ``card.dvfs_latency_s`` after the
  command, at the plant's next step, and a decision may wait ``min_replan_interval_s``) and the
  others (capping, a slower plan);
* the mean power of its cards in each phase (what pausing at a slower level saves).

The numbers of benchmarks/results-evaluation.md, "Holding the clock through pauses", come from a
first version of this script (2026-12-02, commit d4f418b).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.commands.evaluate import control_of  # noqa: E402
from agent.config import ControlConfig  # noqa: E402
from agent.evaluate import _plant_for  # noqa: E402
from agent.policies import POLICY_NAMES, make_policy  # noqa: E402
from twin.scenario import load_run_scenario  # noqa: E402
from twin.workload import Phase  # noqa: E402

_CHUNK_S = 900.0


@dataclass
class JobTrace:
    """What one policy did with the job, second by second (see the module docstring)."""

    policy: str
    n_cards: int = 0
    compute_s: int = 0
    resumes: Counter[str] = field(default_factory=Counter)  # per phase left
    phase_s: Counter[str] = field(default_factory=Counter)
    phase_power_w: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # summed per second
    increments: list[tuple[float, bool]] = field(default_factory=list)  # (work card-s, first second after a resume)
    work_card_s: float = 0.0

    def slow(self) -> tuple[int, float, int, float]:
        """(slow seconds, their cost card-s, of which in the run of slow seconds a resume starts:
        seconds, card-s)."""
        full = max((w for w, _ in self.increments), default=0.0)
        n_slow = n_res = 0
        cost = cost_res = 0.0
        in_resume_run = False
        for w, resumed in self.increments:
            is_slow = w < full * (1.0 - 1e-6)
            in_resume_run = is_slow and (resumed or in_resume_run)
            if is_slow:
                n_slow += 1
                cost += full - w
            if in_resume_run:
                n_res += 1
                cost_res += full - w
        return n_slow, cost, n_res, cost_res


@dataclass
class _Last:
    """The job as the previous plant second left it."""

    phase: str | None = None
    work_card_s: float | None = None
    resumed: bool = False  # it resumed computing at the end of that second


def trace(
    scenario_path: str, policy_name: str, job_id: str, duration_s: float | None, control: ControlConfig
) -> JobTrace:
    scenario = load_run_scenario(scenario_path)
    policy = make_policy(policy_name, scenario.site, control, None)
    policy.telemetry_period_s = scenario.telemetry_period_s  # as agent.evaluate.run_policy sets it
    plant = _plant_for(scenario, policy)
    policy.bind(plant)
    out = JobTrace(policy_name)
    last = _Last()

    def on_step() -> None:
        rec = next((r for r in plant.job_records() if r.job_id == job_id), None)
        if rec is None or rec.state != "running" or not rec.cards:
            last.phase, last.work_card_s, last.resumed = None, None, False
            return
        out.n_cards = rec.n_cards
        phase = Phase(rec.phase).name.lower()
        out.phase_s[phase] += 1
        out.phase_power_w[phase] += float(plant.truth().card_power_w[list(rec.cards)].mean())
        if last.work_card_s is not None and last.phase == "compute":  # the second just taken computed
            out.compute_s += 1
            out.increments.append((rec.work_done_card_s - last.work_card_s, last.resumed))
        resumed = phase == "compute" and last.phase not in (None, "compute")
        if resumed and last.phase is not None:
            out.resumes[last.phase] += 1
        last.phase, last.work_card_s, last.resumed = phase, rec.work_done_card_s, resumed
        out.work_card_s = rec.work_done_card_s

    end = plant.time_s + (duration_s if duration_s is not None else scenario.duration_s)
    while plant.time_s < end - 1e-9:
        policy.run(min(_CHUNK_S, end - plant.time_s), on_step)
        print(f"  {policy_name}: {plant.time_s:,.0f} s", file=sys.stderr, flush=True)
    return out


def _run(args: tuple[str, str, str, float | None, ControlConfig]) -> JobTrace:
    return trace(*args)


def report(traces: list[JobTrace], job_id: str) -> str:
    phases = sorted({p for t in traces for p in t.phase_s})
    lines = [
        f"### {job_id}, second by second",
        "",
        "| policy | computing s | resumes (after) | slow computing s | their cost card-s | of which from a resume "
        "on: s / card-s | work card-s | vs first |" + "".join(f" mean card W, {p} |" for p in phases),
        "|---|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(phases),
    ]
    for t in traces:
        n_slow, cost, n_res, cost_res = t.slow()
        after = ", ".join(f"{k} {v}" for k, v in sorted(t.resumes.items())) or "-"
        watts = "".join(f" {t.phase_power_w[p] / t.phase_s[p]:.1f} |" if t.phase_s[p] else " - |" for p in phases)
        lines.append(
            f"| {t.policy} | {t.compute_s:,} | {after} | {n_slow:,} | {cost:,.0f} | {n_res:,} / {cost_res:,.0f} "
            f"| {t.work_card_s:,.0f} | {t.work_card_s - traces[0].work_card_s:+,.0f} |{watts}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(REPO / "examples" / "day-nominal.toml"))
    ap.add_argument("--job", default="j006055", help="the job to trace (default: the nominal day's j006055)")
    ap.add_argument(
        "--policy", action="append", choices=POLICY_NAMES, help="two policies (default: reactive and racktwin)"
    )
    ap.add_argument("--duration-h", type=float, help="site hours (default: the scenario's)")
    ap.add_argument("--control", action="append", default=[], metavar="KEY=VALUE", help="an agent [control] setting")
    args = ap.parse_args(argv)
    policies = args.policy or ["reactive", "racktwin"]
    try:
        control = control_of(args.control) or ControlConfig()
    except Exception as exc:  # a UserError naming the setting
        ap.error(str(exc))
    duration = args.duration_h * 3600.0 if args.duration_h is not None else None
    jobs = [(args.scenario, p, args.job, duration, control) for p in policies]
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        traces = pool.map(_run, jobs)
    if not any(t.n_cards for t in traces):
        print(f"{args.job} never ran in {args.scenario}", file=sys.stderr)
        return 1
    print(report(traces, args.job))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
