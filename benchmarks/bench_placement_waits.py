"""Why queued jobs wait under racktwin's own placement while the site has enough free cards for them.

    python benchmarks/bench_placement_waits.py                  # nominal day, plant fallback off
    python benchmarks/bench_placement_waits.py --duration-h 6   # the first six hours only
    python benchmarks/bench_placement_waits.py --keep-fallback  # as the scenario has it (120 s)
    python benchmarks/bench_placement_waits.py --by-job         # fallback on vs off, job by job

``benchmarks/bench_evaluate.py --plant-fallback`` measured that the plant's fallback scheduler places
81 of the nominal day's 1,051 jobs the agent still holds after 120 s, and that without it racktwin
loses 0.28% more work. This script runs racktwin alone over the nominal day (the same
``agent.policies.AgentPolicy`` ``racktwin evaluate`` runs, in process) and, every plant second, looks
at each queued job for which the plant has at least as many free healthy cards as the job needs (a
first-fit scheduler with no reservation would start it now). It charges that job's card-seconds of
waiting to the reason the agent's last decision gives for it (``Decision.queue_waits``):

* ``next decision``: the job was queued, or enough cards were freed for it, after the last decision
  (right after it was applied the plant had fewer free cards than the job needs);
* ``reservation``: it is the blocked job holding the EASY reservation (its cards are free at the
  plant but not in the agent's view: cards of unseen racks or stuck sensors);
* ``behind a reservation``: another job holds the reservation and backfilling did not pick this one
  (``draining``: the reservation's promised start has passed, so no card is spare and only jobs
  expected to end before it may start);
* ``no window``: the placement found no window of consecutive racks for it (the reason is listed);
  ``no window, hosts off``: the same, while the plant's free cards on hosts that are up (neither off
  nor booting) are fewer than the job needs: the placement does not offer the cards of off hosts, the
  decision powers hosts on for it and the next one places it on them while they boot, so its compute
  start is set by the boot and the wait costs no work (traced job by job on 2026-12-03: each such
  job computed a boot after the decision that found no window);
* ``other``: the decision gives another reason (too large for the site, the placement failed, the
  guard dropped its placement);
* ``not placed``: the decision gives no reason (it did not consider the job).

Job-seconds are summed per reason, with the jobs and the largest waits, so the hold that costs work
shows. The plant's own first-fit would also hold jobs behind its own reservation: the table is an
upper bound of what a first-fit scheduler would have started earlier.

``--by-job`` instead runs racktwin twice side by side (``agent.evaluate.run_policy``, one process
each), with the plant's fallback and without it, and names the jobs whose work differs
(``agent.job_work.describe_work_gap``): a day's work is the sum of its jobs' work.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.decision import Decision, QueueWait  # noqa: E402
from agent.evaluate import _plant_for, run_policy  # noqa: E402
from agent.job_work import JobWork, describe_work_gap  # noqa: E402
from agent.loop import ApplyReport  # noqa: E402
from agent.policies import AgentPolicy  # noqa: E402
from twin.scenario import RunScenario, load_run_scenario  # noqa: E402
from twin.workload import JobSpec  # noqa: E402

REASONS = (
    "next decision",
    "reservation",
    "behind a reservation",
    "behind a reservation, draining",
    "no window",
    "no window, hosts off",
    "other",
    "not placed",
)


@dataclasses.dataclass
class Waits:
    """Card-seconds and job-seconds of waiting with enough free cards, per reason."""

    card_s: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    job_s: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    per_job: dict[tuple[str, str], float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    no_window: dict[str, str] = dataclasses.field(default_factory=dict)  # job -> why, as the last decision said


@dataclasses.dataclass
class LastDecision:
    """What the classification needs of the agent's last decision."""

    time_s: float = -1.0
    waits: dict[str, QueueWait] = dataclasses.field(default_factory=dict)  # Decision.queue_waits
    draining: bool = False  # the reservation's promised start has passed: the site drains for it
    free_cards: int = 0  # free cards at the plant right after the decision was applied
    free_up_cards: int = 0  # of them, those whose host is up (neither off nor booting)


def reason(spec: JobSpec, last: LastDecision, waits: Waits) -> str:
    """Why queued ``spec`` waits although the plant has enough free cards for it (module docstring)."""
    jid = spec.job_id
    if spec.submit_time_s > last.time_s or spec.n_cards > last.free_cards:
        return "next decision"
    wait = last.waits.get(jid)
    if wait is None:
        return "not placed"
    if wait.kind == "reservation":
        return "reservation"
    if wait.kind == "behind_reservation":
        return "behind a reservation, draining" if last.draining else "behind a reservation"
    if wait.kind == "no_window":
        if spec.n_cards > last.free_up_cards:
            return "no window, hosts off"
        waits.no_window[jid] = f"{jid}: {wait.why}"
        return "no window"
    return "other"


def _scenario(path: str, keep_fallback: bool, duration_h: float | None) -> RunScenario:
    scenario = load_run_scenario(path)
    if not keep_fallback:
        scenario = dataclasses.replace(
            scenario, plant_config=dataclasses.replace(scenario.plant_config, external_timeout_s=1.0e9)
        )
    if duration_h is not None:
        scenario = dataclasses.replace(scenario, duration_s=3600.0 * duration_h)
    return scenario


def _racktwin_jobs(path: str, keep_fallback: bool, duration_h: float | None) -> tuple[float, tuple[JobWork, ...]]:
    res = run_policy(_scenario(path, keep_fallback, duration_h), "racktwin")
    return float(res.metrics["throughput"]), res.jobs


def by_job(path: str, duration_h: float | None) -> int:
    """racktwin with the plant's fallback and without it, side by side; the jobs whose work differs."""
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(2) as pool:
        on_r = pool.apply_async(_racktwin_jobs, (path, True, duration_h))
        off_r = pool.apply_async(_racktwin_jobs, (path, False, duration_h))
        (on_work, on_jobs), (off_work, off_jobs) = on_r.get(), off_r.get()
    print(
        f"racktwin on {Path(path).name}, fallback on: {on_work:.2f} work; off: {off_work:.2f} "
        f"({100 * (off_work / on_work - 1):+.2f}%); {time.perf_counter() - t0:.0f} s wall, 2 runs side by side\n"
    )
    gap = describe_work_gap(off_jobs, on_jobs, "the fallback", top=8)
    print("fallback off against fallback on, " + (gap or "no job's work differs"))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default=str(REPO / "examples" / "day-nominal.toml"))
    ap.add_argument("--duration-h", type=float, default=None, help="hours of plant time (default: the scenario's)")
    ap.add_argument("--keep-fallback", action="store_true", help="keep the scenario's external_timeout_s")
    ap.add_argument("--by-job", action="store_true", help="racktwin with and without the fallback, job by job")
    args = ap.parse_args(argv)
    if args.by_job:
        return by_job(args.scenario, args.duration_h)

    scenario = _scenario(args.scenario, args.keep_fallback, args.duration_h)
    duration = scenario.duration_s
    policy = AgentPolicy(scenario.site)
    policy.telemetry_period_s = scenario.telemetry_period_s  # as agent.evaluate.run_policy sets it
    plant = _plant_for(scenario, policy)
    policy.bind(plant)
    last = LastDecision()
    waits = Waits()

    def on_decision(d: Decision, report: ApplyReport) -> None:
        last.time_s, last.waits = d.time_s, d.queue_waits
        last.draining = any(w.kind == "reservation" and w.expected_start_s <= d.time_s for w in d.queue_waits.values())
        free = plant.free_cards()
        last.free_cards = int(free.size)
        down = plant.host_off() | plant.host_booting()
        last.free_up_cards = int((~down[scenario.site.card_host()[free]]).sum())

    policy.decision_listeners.append(on_decision)

    def on_step() -> None:
        queued = plant.queued_jobs()
        if not queued:
            return
        n_free = int(plant.free_cards().size)
        for spec in queued:
            if spec.n_cards <= n_free:
                why = reason(spec, last, waits)
                waits.card_s[why] += spec.n_cards
                waits.job_s[why] += 1.0
                waits.per_job[(why, spec.job_id)] += 1.0

    t0 = time.perf_counter()
    end = plant.time_s + duration
    while plant.time_s < end - 1e-9:
        policy.run(min(900.0, end - plant.time_s), on_step)
        print(f"  t={plant.time_s / 3600:5.2f} h  {time.perf_counter() - t0:6.0f} s wall", file=sys.stderr, flush=True)
    acc = plant.accounting()
    total_card_s = sum(waits.card_s.values())
    print(
        f"racktwin over {duration / 3600:g} h of {Path(args.scenario).name} "
        f"(fallback {'kept' if args.keep_fallback else 'off'}): {acc.jobs_finished} jobs finished, "
        f"{time.perf_counter() - t0:.0f} s wall\n"
    )
    print("| reason a job waited with enough free cards | card-s | job-s | jobs | largest waits (job: s) |")
    print("|---|---:|---:|---:|---|")
    for why in REASONS:
        jobs = sorted(((s, j) for (w, j), s in waits.per_job.items() if w == why), reverse=True)
        top = ", ".join(f"{j}: {s:.0f}" for s, j in jobs[:4])
        print(f"| {why} | {waits.card_s[why]:,.0f} | {waits.job_s[why]:,.0f} | {len(jobs)} | {top} |")
    print(f"| all | {total_card_s:,.0f} | {sum(waits.job_s.values()):,.0f} | | |")
    if waits.no_window:
        print("\nwhy the placement found no window (last note per job, first 8):")
        for note in list(waits.no_window.values())[:8]:
            print(f"- {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
