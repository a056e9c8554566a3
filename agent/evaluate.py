"""Closed-loop evaluation: every policy drives the same plant, in process, over one run scenario.

:func:`evaluate` runs each policy of :mod:`agent.policies` on a fresh ``twin.plant.Plant`` built from
the scenario (``twin.scenario.build_plant``): the same jobs, weather, card spread, sensor noise and
faults for every policy, because the plant is seeded and its sensor noise has its own random stream.
Policies run in parallel worker processes (``jobs``), each as fast as its core allows; the results do
not depend on how they are spread over processes.

Everything is judged on the plant's TRUE values after every 1 s step (:class:`Recorder`), never on
the telemetry a policy saw:

* energy: facility, IT, cooling (integrals of the plant's true powers), time-weighted PUE = facility
  energy / IT energy, and where the energy went (hosts, computing cards, busy cards not computing,
  awake idle cards, sleeping cards, pumps, fans, chiller, UPS and other overhead);
* work: top-clock-equivalent card-seconds of training kept (after rollbacks) per second of the run
  (``throughput``) and its loss against the baseline. Every policy gets the same jobs; a policy that
  slows jobs finishes fewer of them within the run, so throughput counts work done, not jobs finished;
* jobs: SLO misses (job-seconds computing below the job's ``min_throughput_frac``), queue wait (mean,
  p95; jobs never started count with their wait so far);
* limits: rack-seconds of true rack power over its limit from the end of the first control period
  on (``limit_violation_s``), episodes, the longest, kW x s over; the largest true rack power;
* dies: hottest die, card-seconds over the slowdown and the maximum temperature; card-seconds the
  cards' own protection throttled;
* cards: the share held by jobs (``allocated_card_frac``: from placement to the job's end, in every
  phase, also while the job waits for its host to boot; counted alike for every policy, so a policy
  that makes jobs wait for boots or run slower holds cards longer for the same jobs), of it the share
  on hosts still booting (``boot_wait_card_frac``), the share asleep, hosts off;
* control: the controller's compute time per decision (median, p99), fallbacks, fail-safe entries,
  anomalies flagged, commands refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.config import ControlConfig, PricesConfig
from agent.guard import GUARD_ACTIONS
from agent.job_work import JobWork, job_work
from agent.policies import POLICY_NAMES, ControlStats, Policy, make_policy
from agent.solver_output import isolate_solver_output
from agent.targets import TargetCheck, check_targets, validate_targets
from twin.plant import Plant, Truth
from twin.scenario import RunScenario, build_plant

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "BREAKDOWN_KEYS",
    "Evaluation",
    "EvaluationError",
    "PolicyResult",
    "Recorder",
    "evaluate",
    "run_policy",
]

#: Relative cost of the policies (seconds of CPU per simulated day on the 2-core machine, rounded):
#: the heaviest start first so that parallel runs finish together.
_COST = {"racktwin": 8.0, "greedy": 5.0, "reactive": 1.2, "static-cap": 1.0, "baseline": 1.0}
#: Plant time between progress reports of a run (s).
_CHUNK_S = 900.0

#: Where the facility energy went (keys of ``PolicyResult.breakdown_kwh``), in report order.
BREAKDOWN_KEYS = (
    "hosts",
    "cards_computing",
    "cards_busy_not_computing",
    "cards_idle_awake",
    "cards_low_power",
    "pumps",
    "fans",
    "chiller",
    "ups_and_other",
)
#: The cards' parts of :data:`BREAKDOWN_KEYS`, in the order of :func:`_card_categories`' indices.
_CARD_CATEGORIES = ("cards_computing", "cards_busy_not_computing", "cards_idle_awake", "cards_low_power")


class EvaluationError(RuntimeError):
    """A policy's run failed (the message says which and why)."""


@dataclass
class PolicyResult:
    """One policy's run: flat metrics, where the energy went, time series and what the controller did."""

    name: str
    metrics: dict[str, Any]
    breakdown_kwh: dict[str, float]
    series: dict[str, list[float]]
    rack_series_w: list[list[float]]  # per rack: true power at each sample
    stats: ControlStats
    wall_s: float
    cpu_s: float
    jobs: tuple[JobWork, ...] = ()  # per job: size, first start, work done (agent.job_work)


@dataclass
class Evaluation:
    """All policies' results on one scenario."""

    scenario: dict[str, Any]
    results: dict[str, PolicyResult] = field(default_factory=dict)
    requested: tuple[str, ...] = ()
    wall_s: float = 0.0
    # the scenario's [targets] judged (agent.targets); empty when it has none or its policy did not run
    targets: list[TargetCheck] = field(default_factory=list)
    targets_policy: str | None = None

    def policies_json(self) -> dict[str, dict[str, Any]]:
        """``{name: metrics}`` of the requested policies (the ``--json`` output's ``policies``)."""
        return {n: self.results[n].metrics for n in self.requested if n in self.results}


class Recorder:
    """Judges a plant on its true values after every step (see the module docstring)."""

    def __init__(self, plant: Plant, judge_from_s: float, sample_s: float = 60.0) -> None:
        site = plant.site
        self.plant = plant
        self.site = site
        self.judge_from_s = float(judge_from_s)
        self.sample_s = float(sample_s)
        n_r = site.n_racks
        self._limit = site.rack_power_limits_w()
        self._slowdown_c = site.card.slowdown_temp_c
        self._max_c = site.card.max_temp_c
        self._t = plant.time_s
        self._t0 = plant.time_s
        self._run_s = np.zeros(n_r)
        self.longest_s = 0.0
        self.episodes = 0
        self.violation_rack_s = 0.0
        self.violation_kws = 0.0
        self.max_rack_w = 0.0
        self.max_rack_all_w = 0.0
        self.over_slowdown_card_s = 0.0
        self.over_max_card_s = 0.0
        self.allocated_card_s = 0.0  # card-seconds held by a job (any phase), failed cards excluded
        self.boot_wait_card_s = 0.0  # of which on a host booting during the step
        # per host: booting at the end of the last step (None: the site's hosts are never off)
        self._booting = plant.host_booting() if site.hosts_managed else None
        self.low_power_card_s = 0.0
        self.host_off_s = 0.0
        self.idle_host_s = 0.0  # host-seconds with no busy card (the host lever's reach)
        self.setpoint_c_s = 0.0
        self.pump_speed_s = 0.0
        self.energy_j = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self.series: dict[str, list[float]] = {
            k: []
            for k in (
                "time_s",
                "facility_power_w",
                "it_power_w",
                "cooling_power_w",
                "pue",
                "max_rack_power_w",
                "max_die_temp_c",
                "supply_setpoint_c",
                "mean_pump_speed_frac",
                "ambient_c",
                "allocated_cards",
                "low_power_cards",
                "hosts_off",
                "throughput",
                "jobs_queued",
            )
        }
        self.rack_series: list[list[float]] = [[] for _ in range(n_r)]
        self._next_sample_s = self._t0
        self._last_work = 0.0
        self._last_sample_t = self._t0
        self._peak_rack_w = np.zeros(n_r)
        self._sample()

    def on_step(self) -> None:
        plant = self.plant
        t = plant.time_s
        dt = t - self._t
        if dt <= 0:
            return
        tr = plant.truth()
        rack = tr.rack_power_w
        np.maximum(self._peak_rack_w, rack, out=self._peak_rack_w)
        rmax = float(rack.max())
        self.max_rack_all_w = max(self.max_rack_all_w, rmax)
        if self._t >= self.judge_from_s - 1e-9:
            self.max_rack_w = max(self.max_rack_w, rmax)
            over = rack - self._limit
            pos = over > 0.0
            if pos.any():
                self.violation_rack_s += float(pos.sum()) * dt
                self.violation_kws += float(over[pos].sum()) * dt / 1e3
                self.episodes += int((pos & (self._run_s == 0.0)).sum())
            self._run_s = np.where(pos, self._run_s + dt, 0.0)
            self.longest_s = max(self.longest_s, float(self._run_s.max()))
        die = tr.die_temp_c
        if float(die.max()) > self._slowdown_c:
            self.over_slowdown_card_s += float(np.count_nonzero(die > self._slowdown_c)) * dt
            self.over_max_card_s += float(np.count_nonzero(die > self._max_c)) * dt
        # where the energy went (the powers of the step just taken): one category per card; the hosts'
        # part is the rest of the rack power of that step (their power now counts a boot begun as the
        # step ended)
        by_cat = np.bincount(_card_categories(tr), weights=tr.card_power_w, minlength=4) * dt
        e = self.energy_j
        e["hosts"] += float(tr.rack_power_w.sum() - tr.card_power_w.sum()) * dt
        for k, key in enumerate(_CARD_CATEGORIES):
            e[key] += float(by_cat[k])
        cp = tr.cooling
        e["pumps"] += (cp.rack_pump_w + cp.facility_pump_w) * dt
        e["fans"] += cp.dry_cooler_fan_w * dt
        e["chiller"] += cp.chiller_w * dt
        e["ups_and_other"] += (cp.ups_loss_w + cp.other_overhead_w) * dt
        held = tr.card_busy_in_step & ~tr.failed
        self.allocated_card_s += float(np.count_nonzero(held)) * dt
        if self._booting is not None:  # booting during the step: at its start or at its end
            booting_now = self.plant.host_booting()
            booting = booting_now | self._booting
            self._booting = booting_now
            if booting.any():
                self.boot_wait_card_s += float(held.reshape(self.site.n_hosts, -1)[booting].sum()) * dt
        self.low_power_card_s += float(tr.low_power.sum()) * dt
        self.host_off_s += float(tr.host_off.sum()) * dt
        # a host none of whose cards a job holds (a failed card, held or not, does no work there)
        self.idle_host_s += float((~held).reshape(self.site.n_hosts, -1).all(axis=1).sum()) * dt
        self.setpoint_c_s += tr.supply_setpoint_c * dt
        self.pump_speed_s += float(tr.rack_pump_speed_frac.mean()) * dt
        self._t = t
        if t >= self._next_sample_s - 1e-9:
            self._sample()

    def finish(self) -> None:
        """The last sample, where the run ended between two (the series then cover the whole run)."""
        if self.plant.time_s > self._last_sample_t + 1e-9:
            self._sample()

    def _sample(self) -> None:
        plant = self.plant
        tr = plant.truth()
        acc = plant.accounting()
        t = tr.time_s
        s = self.series
        cp = tr.cooling
        it = tr.it_power_w
        s["time_s"].append(t)
        s["facility_power_w"].append(cp.facility_power_w)
        s["it_power_w"].append(it)
        s["cooling_power_w"].append(cp.cooling_power_w)
        s["pue"].append(cp.facility_power_w / it if it > 0 else math.nan)
        peak = self._peak_rack_w if t > self._t0 else tr.rack_power_w
        s["max_rack_power_w"].append(float(peak.max()))
        s["max_die_temp_c"].append(float(tr.die_temp_c.max()))
        s["supply_setpoint_c"].append(tr.supply_setpoint_c)
        s["mean_pump_speed_frac"].append(float(tr.rack_pump_speed_frac.mean()))
        s["ambient_c"].append(tr.ambient_temp_c)
        s["allocated_cards"].append(float(plant.n_cards - plant.free_cards().size - int(tr.failed.sum())))
        s["low_power_cards"].append(float(tr.low_power.sum()))
        s["hosts_off"].append(float(tr.host_off.sum()))
        dt = t - self._last_sample_t
        s["throughput"].append((acc.work_card_s - self._last_work) / dt if dt > 0 else 0.0)
        s["jobs_queued"].append(float(acc.jobs_queued))
        for r in range(self.site.n_racks):
            self.rack_series[r].append(float(peak[r]))
        self._peak_rack_w = np.zeros(self.site.n_racks)
        self._last_work = acc.work_card_s
        self._last_sample_t = t
        self._next_sample_s = t + self.sample_s


def _card_categories(tr: Truth) -> npt.NDArray[np.intp]:
    """Each card's part of the energy breakdown for the step just taken, as an index into
    :data:`_CARD_CATEGORIES`, by its state during that step (not ``free_cards()``, the state after it,
    which would file the last step of a job that ended with the step as idle): asleep; else
    held by no job (idle awake: a failed card no job holds too, as it reads awake at 0 MHz and draws
    0 W); else computing (utilization > 0) or busy not computing (a failed card its job still holds)."""
    return np.where(tr.low_power, 3, np.where(~tr.card_busy_in_step, 2, np.where(tr.utilization > 0.0, 0, 1)))


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else math.nan


def _plant_for(scenario: RunScenario, policy: Policy) -> Plant:
    cfg = dataclasses.replace(scenario.plant_config, placement=policy.placement)
    return build_plant(dataclasses.replace(scenario, plant_config=cfg))


def run_policy(
    scenario: RunScenario,
    name: str,
    *,
    control: ControlConfig | None = None,
    prices: PricesConfig | None = None,
    sample_s: float = 60.0,
    progress: Callable[[str, float, float, float], None] | None = None,
) -> PolicyResult:
    """Run one policy over the scenario and judge it (see the module docstring).

    ``progress(name, plant_time_s, duration_s, wall_s)`` is called every 900 s of plant time. The
    first call in a process switches off pyomo's capture of stdout/stderr around HiGHS calls for the
    whole process (``agent.solver_output.isolate_solver_output``: it slowed the solves)."""
    control = control if control is not None else ControlConfig()
    isolate_solver_output()  # pyomo's per-solve capture of fds 1 and 2 slows the solves (agent.solver_output)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    site = scenario.site
    policy = make_policy(name, site, control, prices)
    policy.telemetry_period_s = scenario.telemetry_period_s
    plant = _plant_for(scenario, policy)
    policy.bind(plant)
    rec = Recorder(plant, judge_from_s=plant.time_s + control.period_s, sample_s=sample_s)
    duration = scenario.duration_s
    end = plant.time_s + duration
    while plant.time_s < end - 1e-9:
        policy.run(min(_CHUNK_S, end - plant.time_s), rec.on_step)
        if progress is not None:
            progress(name, plant.time_s, duration, time.perf_counter() - t_wall)
    rec.finish()
    policy.finish()
    metrics = _metrics(scenario, plant, rec, policy.stats)
    return PolicyResult(
        name=name,
        metrics=metrics,
        breakdown_kwh={k: v / 3.6e6 for k, v in rec.energy_j.items()},
        series=rec.series,
        rack_series_w=rec.rack_series,
        stats=policy.stats,
        wall_s=time.perf_counter() - t_wall,
        cpu_s=time.process_time() - t_cpu,
        jobs=job_work(plant.job_records()),
    )


def _metrics(scenario: RunScenario, plant: Plant, rec: Recorder, stats: ControlStats) -> dict[str, Any]:
    acc = plant.accounting()
    site = scenario.site
    duration = max(acc.time_s, 1e-9)
    records = plant.job_records()
    running0 = set(scenario.running_at_start)
    waits: list[float] = []
    never = 0
    for r in records:
        if r.job_id in running0 or r.submit_time_s >= acc.time_s:
            continue
        if r.start_time_s is None:
            never += 1
            waits.append(acc.time_s - r.submit_time_s)
        else:
            waits.append(r.start_time_s - r.submit_time_s)
    solve = stats.solve_times_s
    throughput = acc.work_card_s / duration
    it_kwh = acc.it_energy_j / 3.6e6
    fac_kwh = acc.facility_energy_j / 3.6e6
    return {
        "facility_energy_kwh": fac_kwh,
        "it_energy_kwh": it_kwh,
        "cooling_energy_kwh": acc.cooling_energy_j / 3.6e6,
        "pue": acc.pue,
        "throughput": throughput,
        "throughput_frac": throughput / site.n_cards,
        "throughput_loss_pct": math.nan,  # against the baseline: filled in by evaluate()
        "facility_energy_saving_pct": math.nan,
        "facility_kwh_per_work_card_h": fac_kwh / (acc.work_card_s / 3600.0) if acc.work_card_s > 0 else math.nan,
        "work_card_s": acc.work_card_s,
        "lost_work_card_s": acc.lost_work_card_s,
        "jobs_submitted": acc.jobs_submitted,
        "jobs_finished": acc.jobs_finished,
        "jobs_failed": acc.jobs_failed,
        "jobs_running_end": acc.jobs_running,
        "jobs_queued_end": acc.jobs_queued,
        "jobs_placed_by_plant": acc.jobs_placed_by_plant,
        "jobs_never_started": never,
        "slo_violation_s": acc.slo_violation_s,
        "slo_jobs_missed": sum(1 for r in records if r.slo_violation_s > 0),
        "queue_wait_mean_s": float(np.mean(waits)) if waits else 0.0,
        "queue_wait_p95_s": _percentile(waits, 95) if waits else 0.0,
        "queue_wait_max_s": max(waits) if waits else 0.0,  # a job never started: its wait until the end
        "limit_violation_s": rec.violation_rack_s,
        "limit_violation_episodes": rec.episodes,
        "limit_violation_longest_s": rec.longest_s,
        "limit_violation_kws": rec.violation_kws,
        "max_rack_power_w": rec.max_rack_w,
        "max_rack_power_incl_first_period_w": rec.max_rack_all_w,
        "max_die_temp_c": acc.max_die_temp_c,
        "die_over_slowdown_card_s": rec.over_slowdown_card_s,
        "die_over_max_card_s": rec.over_max_card_s,
        "throttled_card_s": acc.throttled_card_s,
        "allocated_card_frac": rec.allocated_card_s / duration / site.n_cards,
        "boot_wait_card_frac": rec.boot_wait_card_s / duration / site.n_cards,
        "low_power_card_frac": rec.low_power_card_s / duration / site.n_cards,
        "host_off_frac": rec.host_off_s / duration / site.n_hosts,
        "idle_host_s": rec.idle_host_s,
        "idle_card_s": site.n_cards * duration - rec.allocated_card_s,
        "mean_supply_setpoint_c": rec.setpoint_c_s / duration,
        "mean_pump_speed_frac": rec.pump_speed_s / duration,
        "decisions": stats.decisions,
        "solve_median_s": _percentile(solve, 50),
        "solve_p99_s": _percentile(solve, 99),
        "solve_max_s": float(max(solve)) if solve else math.nan,
        "fallbacks": stats.fallbacks,
        "failsafe_entries": stats.failsafe_entries,
        "failsafe_decisions": stats.failsafe_decisions,
        "failsafe_racks": ",".join(stats.failsafe_racks),
        "anomalies": "; ".join(stats.anomalies),
        "invalid_readings": stats.invalid_readings,
        "commands_refused": stats.refused_commands,
        "guard_interventions": stats.guard_notes,
        "guard_actions": {a: stats.guard_actions[a] for a in GUARD_ACTIONS if a in stats.guard_actions},
        "duration_s": acc.time_s,
    }


# --------------------------------------------------------------------------------------------
# All policies
# --------------------------------------------------------------------------------------------


def _scenario_info(scenario: RunScenario) -> dict[str, Any]:
    site = scenario.site
    return {
        "name": scenario.name,
        "source": scenario.source,
        "site": site.name,
        "n_cards": site.n_cards,
        "n_racks": site.n_racks,
        "rack_power_limit_w": float(site.rack.power_limit_w),
        "pue_target": site.pue_target,
        "duration_s": scenario.duration_s,
        "seed": scenario.seed,
        "workload": scenario.workload,
        "workload_seed": scenario.workload_seed,
        "jobs": len(scenario.jobs),
        "running_at_start": len(scenario.running_at_start),
        "offered_allocation": scenario.offered_allocation,
        "faults": [type(f).__name__ for f in scenario.faults],
    }


def _compare(ev: Evaluation) -> None:
    base = ev.results.get("baseline")
    if base is None:
        return
    b = base.metrics
    for res in ev.results.values():
        m = res.metrics
        if b["throughput"] > 0:
            m["throughput_loss_pct"] = 100.0 * (1.0 - m["throughput"] / b["throughput"])
        if b["facility_energy_kwh"] > 0:
            m["facility_energy_saving_pct"] = 100.0 * (1.0 - m["facility_energy_kwh"] / b["facility_energy_kwh"])


def _worker(
    scenario: RunScenario,
    name: str,
    control: ControlConfig | None,
    prices: PricesConfig | None,
    sample_s: float,
    out: Any,
) -> None:
    """Runs in a child process: one policy; progress and the result go to ``out`` (a queue)."""

    def progress(n: str, t: float, d: float, w: float) -> None:
        out.put(("progress", n, t, d, w))

    try:
        res = run_policy(scenario, name, control=control, prices=prices, sample_s=sample_s, progress=progress)
        out.put(("result", name, res))
    except BaseException:  # reported to the parent, which raises
        out.put(("error", name, traceback.format_exc(limit=8)))


def default_jobs() -> int:
    """Worker processes by default: the CPUs this process may use (at least 2)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 2
    return max(2, n)


def evaluate(
    scenario: RunScenario,
    policies: Sequence[str] = POLICY_NAMES,
    *,
    jobs: int = 1,
    control: ControlConfig | None = None,
    prices: PricesConfig | None = None,
    sample_s: float = 60.0,
    progress: Callable[[str, float, float, float], None] | None = None,
) -> Evaluation:
    """Run ``policies`` over ``scenario`` (``jobs`` worker processes; 1: in this process) and compare
    them with the baseline (run as well when it is not asked for: the losses are measured against it)."""
    requested = tuple(dict.fromkeys(policies))
    for name in requested:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")
    if scenario.targets is not None:
        validate_targets(scenario.targets, POLICY_NAMES)
    names = list(requested) if "baseline" in requested else [*requested, "baseline"]
    ev = Evaluation(scenario=_scenario_info(scenario), requested=requested)
    t0 = time.perf_counter()
    if jobs <= 1 or len(names) == 1:
        for name in names:
            ev.results[name] = run_policy(
                scenario, name, control=control, prices=prices, sample_s=sample_s, progress=progress
            )
    else:
        ev.results = _run_parallel(scenario, names, jobs, control, prices, sample_s, progress)
    ev.wall_s = time.perf_counter() - t0
    _compare(ev)
    tg = scenario.targets
    if tg is not None and tg.policy in ev.results:
        ev.targets_policy = tg.policy
        ev.targets = check_targets(
            tg,
            {n: r.metrics for n, r in ev.results.items()},
            {n: r.breakdown_kwh for n, r in ev.results.items()},
            scenario.site,
            scenario.jobs,
            job_work={n: r.jobs for n, r in ev.results.items()},
            prices=prices,
        )
    return ev


def _run_parallel(
    scenario: RunScenario,
    names: Sequence[str],
    jobs: int,
    control: ControlConfig | None,
    prices: PricesConfig | None,
    sample_s: float,
    progress: Callable[[str, float, float, float], None] | None,
) -> dict[str, PolicyResult]:
    ctx = mp.get_context("spawn")  # no fork of a process that may hold solver threads
    out: Any = ctx.Queue()
    todo = sorted(names, key=lambda n: -_COST.get(n, 1.0))
    running: dict[str, Any] = {}
    results: dict[str, PolicyResult] = {}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                name = todo.pop(0)
                proc = ctx.Process(
                    target=_worker,
                    args=(scenario, name, control, prices, sample_s, out),
                    name=f"racktwin-evaluate-{name}",
                    daemon=True,
                )
                proc.start()
                running[name] = proc
            try:
                msg = out.get(timeout=1.0)
            except queue.Empty:
                for name, proc in list(running.items()):
                    if not proc.is_alive() and name not in results:
                        # it may have put its result just before exiting: drain once more
                        with contextlib.suppress(queue.Empty):
                            while True:
                                _handle(out.get(timeout=0.5), running, results, progress)
                        if name not in results and name in running:
                            raise EvaluationError(
                                f"policy {name}: worker process died (exit code {proc.exitcode})"
                            ) from None
                continue
            _handle(msg, running, results, progress)
    finally:
        for proc in running.values():
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=5)
    return {n: results[n] for n in names}


def _handle(
    msg: tuple[Any, ...],
    running: dict[str, Any],
    results: dict[str, PolicyResult],
    progress: Callable[[str, float, float, float], None] | None,
) -> None:
    kind, name = msg[0], msg[1]
    if kind == "progress":
        if progress is not None:
            progress(name, msg[2], msg[3], msg[4])
    elif kind == "result":
        results[name] = msg[2]
        proc = running.pop(name, None)
        if proc is not None:
            proc.join(timeout=10)
    elif kind == "error":
        raise EvaluationError(f"policy {name} failed:\n{msg[2]}")
