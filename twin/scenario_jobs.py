"""Where a run scenario's jobs come from (``twin.scenario``): the ``[workload]`` section (generated
by the twin's generator, conditioned on the day's load with ``allocation_tolerance`` and warm-started,
or replayed from a trace) and the listed ``[[jobs]]``, with the checks on them (job ids, sizes, jobs
running at t = 0). :func:`offered_allocation` is the load the jobs offer."""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from twin.scenario_checks import MIN_DURATION_S, check_before_end, wrap_value_error
from twin.spec import SiteSpec
from twin.tables import SpecError, choices, decode_table, rng
from twin.workload import (
    GeneratorConfig,
    JobSpec,
    PhaseModel,
    TraceError,
    checkpoint_problem,
    expected_job_card_seconds,
    generate_jobs,
    load_trace,
)

#: Job ids must be valid on the wire (``agent.wire``: publisher/job ids). ``\Z``, not ``$``: ``$`` also
#: matches before a final newline, so ``"a\n"`` (or 128 characters and a newline) would pass.
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}\Z")

#: Smallest ``[workload] allocation_tolerance``: one day's offered allocation moves in steps of its
#: heavy-tailed jobs (a 256-card job running an hour is 0.6% of a day of the example site), so on
#: the example site 1 seed in 20 offers 0.65 +- 0.01 but 1 in 300 offers 0.65 +- 0.005.
MIN_ALLOCATION_TOLERANCE = 0.01

#: Most jobs the generator may draw for one run (its warm-start window included), judged from the
#: expected count before drawing: each takes ~750 bytes, so this is ~1.5 GB and about a minute to draw
#: (measured: 1.53 million jobs for a year of 2,048 cards, 47 s, 1.1 GB peak). A year of 4 supernodes
#: fits; a larger site (``supernodes``) for a long run does not.
MAX_GENERATED_JOBS = 2_000_000

#: Workload seeds tried by ``allocation_tolerance`` before giving up (about 0.06 s each for a day of
#: the example site; at the smallest tolerance 1 seed in 20 is accepted there).
_MAX_SEED_TRIES = 200


@dataclass(frozen=True)
class WorkloadSection:
    """``[workload]``: where jobs come from (listed ``[[jobs]]`` are added in every case)."""

    source: str = field(default="generate", metadata=choices("generate", "trace", "none"))
    target_allocation: float = field(default=0.65, metadata=rng(0.0, 1.0, lo_open=True))
    warm_start: bool = True
    duration_scale: float = field(default=1.0, metadata=rng(0.0, 1e6, lo_open=True))
    max_cards: int | None = field(default=None, metadata=rng(1, 10_000_000))
    seed: int | None = field(default=None, metadata=rng(0, 2**63 - 1))
    # Condition the generated day on its load: the workload seed is the first of seed, seed + 1, ...
    # whose jobs offer target_allocation +- this (offered_allocation); unset: the seed as given.
    allocation_tolerance: float | None = field(default=None, metadata=rng(MIN_ALLOCATION_TOLERANCE, 1.0))
    # [lo, hi] of the generated jobs' compute shares (uniform); None: the generator's (0.60, 0.87)
    compute_share_range: tuple[float, ...] | None = field(default=None, metadata=rng(0.0, 1.0))
    trace: str | None = None
    time_offset_s: float = field(default=0.0, metadata=rng(0.0, 1e9))


@dataclass(frozen=True)
class _JobEntry:
    """``[[jobs]]``: one listed job (give ``duration_s`` or ``work_steps``)."""

    id: str
    n_cards: int = field(metadata=rng(1, 10_000_000))
    duration_s: float | None = field(default=None, metadata=rng(0.0, 1e12, lo_open=True))
    work_steps: float | None = field(default=None, metadata=rng(0.0, 1e15, lo_open=True))
    step_time_s: float = field(default=2.0, metadata=rng(0.0, 1e6, lo_open=True))
    compute_share: float = field(default=0.8, metadata=rng(0.0, 1.0))
    priority: float = field(default=1.0, metadata=rng(0.0, 1e6, lo_open=True))
    submit_time_s: float = field(default=0.0, metadata=rng(0.0, 1e12))
    checkpoint_interval_s: float = field(default=900.0, metadata=rng(0.0, 1e8, lo_open=True))
    checkpoint_duration_s: float = field(default=60.0, metadata=rng(0.0, 1e8))
    noncompute_utilization: float = field(default=0.2, metadata=rng(0.0, 1.0))
    min_throughput_frac: float = field(default=0.0, metadata=rng(0.0, 1.0))
    running_at_start: bool = False
    # a job running at the start is part way through its checkpoint interval: the training time
    # before its first checkpoint (default: drawn uniform in (0, checkpoint_interval_s])
    first_checkpoint_after_s: float | None = field(default=None, metadata=rng(0.0, 1e8, lo_open=True))


#: ``[workload]`` keys that only one ``source`` reads (the others would be silently ignored)
_SOURCE_KEYS: Mapping[str, tuple[str, ...]] = {
    "generate": (
        "target_allocation",
        "warm_start",
        "duration_scale",
        "max_cards",
        "seed",
        "allocation_tolerance",
        "compute_share_range",
    ),
    "trace": ("trace", "time_offset_s"),
}


def check_source_keys(given_workload: Mapping[str, Any], w: WorkloadSection, source: str) -> None:
    """A ``[workload]`` key of another source than the one chosen is a mistake, not ignored."""
    for used_by, keys in _SOURCE_KEYS.items():
        for key in keys:
            if key in given_workload and w.source != used_by:
                raise SpecError(source, f"workload.{key}", f"only used with source = {used_by!r}")


# --------------------------------------------------------------------------------------------
# Generated
# --------------------------------------------------------------------------------------------


def generator_config(site: SiteSpec, w: WorkloadSection, phases: PhaseModel, source: str) -> GeneratorConfig:
    """The generator's configuration from ``[workload]`` and ``[phases]``, checked against the site."""
    kw: dict[str, Any] = {"target_allocation": w.target_allocation, "duration_scale": w.duration_scale}
    kw["phases"] = phases
    if w.max_cards is not None:
        host = GeneratorConfig.granularity
        if w.max_cards < host:
            raise SpecError(
                source, "workload.max_cards", f"must be at least one whole host ({host} cards), got {w.max_cards}"
            )
        if w.max_cards % host:
            raise SpecError(
                source,
                "workload.max_cards",
                f"must be a whole number of hosts ({host} cards each: the generator's sizes are multiples of "
                f"{host}), got {w.max_cards} (it would act as {w.max_cards // host * host})",
            )
        if w.max_cards > site.n_cards:
            raise SpecError(
                source,
                "workload.max_cards",
                f"{w.max_cards} is more than the site's {site.n_cards} cards: no job can be larger than the site",
            )
        kw["max_cards"] = w.max_cards
    if w.compute_share_range is not None:
        share = w.compute_share_range
        if len(share) != 2:
            raise SpecError(source, "workload.compute_share_range", f"expected [lo, hi], got {len(share)} values")
        if share[0] > share[1]:
            raise SpecError(
                source,
                "workload.compute_share_range",
                f"expected [lo, hi] with lo <= hi, got [{share[0]:g}, {share[1]:g}]",
            )
        kw["compute_share_range"] = (share[0], share[1])
    cfg = wrap_value_error(source, "workload", lambda: GeneratorConfig(**kw))
    shortest_s = cfg.min_duration_s * cfg.duration_scale
    if shortest_s < MIN_DURATION_S:
        raise SpecError(
            source,
            "workload.duration_scale",
            f"{cfg.duration_scale:g} makes the shortest generated job {shortest_s:.3g} s of training (the "
            f"generator's {cfg.min_duration_s:g} s x {cfg.duration_scale:g}): a job must last at least one plant "
            f"step ({MIN_DURATION_S:g} s), so duration_scale must be >= {MIN_DURATION_S / cfg.min_duration_s:.4g}",
        )
    return cfg


def check_generated_count(
    site: SiteSpec, duration_s: float, w: WorkloadSection, cfg: GeneratorConfig, source: str
) -> None:
    """A generated workload too large to hold (a long run of a scaled-up site) is refused from its
    expected number of jobs, before any is drawn (the draw would exhaust the memory)."""
    rate_per_s = cfg.target_allocation * site.n_cards / expected_job_card_seconds(cfg)
    window_s = cfg.stats.max_run_time_s * cfg.duration_scale + cfg.phases.startup_s if w.warm_start else 0.0
    expected = rate_per_s * (window_s + duration_s)
    if expected > MAX_GENERATED_JOBS:
        warm = f" and the {window_s:,.0f} s warm-start window before it" if w.warm_start else ""
        raise SpecError(
            source,
            "workload",
            f"the generator would draw about {expected:,.0f} jobs ({site.n_cards:,} cards at "
            f"{cfg.target_allocation:g} allocation for {duration_s:,.0f} s{warm}): at most "
            f"{MAX_GENERATED_JOBS:,} (~1.5 GB to hold); shorten the run or use fewer supernodes",
        )


def conditioned_jobs(
    site: SiteSpec, duration_s: float, seed: int, w: WorkloadSection, cfg: GeneratorConfig, source: str
) -> tuple[list[JobSpec], list[str], int, float]:
    """Generated jobs, running jobs, the workload seed used and the offered allocation.

    Sizes and run times of the generator are heavy-tailed (AcmeTrace Kalos: a 256-card job may run
    for a week), so one day's offered allocation scatters widely around ``target_allocation`` (one
    day of the example site: 0.41-1.59 over seeds 0-29, median 0.56). ``allocation_tolerance``
    draws from the generator conditioned on the day's load: the first seed from ``seed`` whose day
    offers ``target_allocation +- allocation_tolerance``."""
    tol = w.allocation_tolerance
    closest = (math.inf, seed, math.nan)  # miss, seed, offer
    for k in range(_MAX_SEED_TRIES if tol is not None else 1):
        s = seed + k
        jobs, running = _generated(site, duration_s, s, cfg, w.warm_start)
        offered = offered_allocation(jobs, site.n_cards, duration_s, cfg.phases)
        miss = abs(offered - w.target_allocation)
        if tol is None or miss <= tol:
            return jobs, running, s, offered
        closest = min(closest, (miss, s, offered))
    raise SpecError(
        source,
        "workload.allocation_tolerance",
        f"no workload seed in {seed}..{seed + _MAX_SEED_TRIES - 1} offers {w.target_allocation:g} +- {tol or 0:g}; "
        f"the closest, seed {closest[1]}, offers {closest[2]:.4f} ({closest[0]:.4f} off)",
    )


def _generated(
    site: SiteSpec, duration_s: float, seed: int, cfg: GeneratorConfig, warm_start: bool
) -> tuple[list[JobSpec], list[str]]:
    """Generated jobs (and, with a warm start, those already running at t = 0, in arrival order; those
    that the site cannot hold all at once wait in the queue at t = 0)."""
    phases = cfg.phases
    window = cfg.stats.max_run_time_s * cfg.duration_scale + phases.startup_s if warm_start else 0.0
    raw = generate_jobs(site.n_cards, window + duration_s, seed, cfg)
    jobs: list[JobSpec] = []
    running: list[str] = []
    for j in raw:
        t = j.submit_time_s - window
        if t >= 0.0:
            jobs.append(dataclasses.replace(j, submit_time_s=t))
            continue
        wall = phases.expected_wall_time_s(j.duration_s, j.checkpoint_interval_s, j.checkpoint_duration_s)
        left = t + wall
        if left <= 0.0:
            continue  # finished before the run starts
        # it has trained for the share of its wall time gone by: where that leaves it in its
        # checkpoint interval sets its first checkpoint here (0 would mean one due now)
        trained_s = j.duration_s * (1.0 - left / wall)
        first = j.checkpoint_interval_s - math.fmod(trained_s, j.checkpoint_interval_s)
        jobs.append(
            dataclasses.replace(
                j, submit_time_s=0.0, work_steps=j.work_steps * left / wall, first_checkpoint_after_s=first
            )
        )
        running.append(j.job_id)
    return jobs, running


def generated_line(w: WorkloadSection, from_seed: int, wseed: int, offered: float) -> str:
    """The workload line of a generated run. Where ``allocation_tolerance`` moved the workload seed
    past the seed given, it says so: every seed from the given one to the one used draws these jobs."""
    what = f"generated (AcmeTrace Kalos, {100 * w.target_allocation:g}% allocation, "
    if wseed == from_seed:
        what += f"seed {wseed}"
    else:
        what += f"workload seed {wseed}"
    if w.allocation_tolerance is not None:
        what += f" offering {offered:.1%}"
        if wseed != from_seed:
            what += (
                f" (the first from seed {from_seed} within {100 * w.target_allocation:g}% +- "
                f"{100 * w.allocation_tolerance:g}%: seeds {from_seed}..{wseed} all draw these jobs)"
            )
    return what + (", warm start)" if w.warm_start else ")")


#: ``RunScenario.workload`` of a run with no ``[workload]`` jobs (``source = "none"``): with listed jobs
#: and without any.
LISTED_JOBS_ONLY = "listed jobs"
NO_JOBS = "no jobs"


def workload_line(source_line: str | None, n_listed: int) -> str:
    """Where a run's jobs come from, in one line (``RunScenario.workload``): ``source_line`` (the
    generator's :func:`generated_line`, ``trace FILE``; None: no ``[workload]`` jobs) and the count of
    listed ``[[jobs]]``: ``generated (...) + 13 listed``, ``trace t.csv``, ``listed jobs``, ``no jobs``."""
    if source_line is None:
        return LISTED_JOBS_ONLY if n_listed else NO_JOBS
    return f"{source_line} + {n_listed} listed" if n_listed else source_line


def jobs_line(n_jobs: int, workload: str) -> str:
    """A run's jobs for the summary lines of ``racktwin sim`` and ``evaluate`` and the report: ``18
    listed jobs``, ``no jobs``, else the count and ``workload`` (:func:`workload_line`): ``45 jobs
    (generated (AcmeTrace Kalos, 65% allocation, seed 0) + 13 listed)``, ``1 job (trace t.csv)``."""
    if workload == NO_JOBS and n_jobs == 0:
        return NO_JOBS
    if workload == LISTED_JOBS_ONLY:
        return f"{n_jobs} listed job{'' if n_jobs == 1 else 's'}"
    return f"{n_jobs} job{'' if n_jobs == 1 else 's'} ({workload})"


def offered_allocation(
    jobs: Sequence[JobSpec], n_cards: int, duration_s: float, phases: PhaseModel | None = None
) -> float:
    """The share of ``n_cards x duration_s`` card-seconds that ``jobs`` would hold over ``[0, duration_s)``
    with unlimited cards: each job from its submission for its expected wall time (start-up, training
    at the top clock, expected stalls and checkpoints: ``PhaseModel.expected_wall_time_s``). The
    realized allocation is lower when demand peaks exceed the site (jobs wait) and higher when jobs
    run slower than at the top clock."""
    ph = phases if phases is not None else PhaseModel()
    held = 0.0
    for j in jobs:
        wall = ph.expected_wall_time_s(j.duration_s, j.checkpoint_interval_s, j.checkpoint_duration_s)
        held += j.n_cards * max(min(j.submit_time_s + wall, duration_s) - j.submit_time_s, 0.0)
    return held / (n_cards * duration_s)


# --------------------------------------------------------------------------------------------
# Traced
# --------------------------------------------------------------------------------------------


def traced_jobs(w: WorkloadSection, base: Path, source: str, inputs: list[Path]) -> list[JobSpec]:
    """The jobs of ``workload.trace`` (appended to ``inputs``), shifted by ``time_offset_s``."""
    if w.trace is None:
        raise SpecError(source, "workload.trace", "missing: the trace CSV file (source = 'trace')")
    inputs.append(base / w.trace)
    try:
        traced = load_trace(base / w.trace)
    except TraceError as exc:
        raise SpecError(source, "workload.trace", str(exc)) from None
    if w.time_offset_s:
        traced = [dataclasses.replace(j, submit_time_s=j.submit_time_s + w.time_offset_s) for j in traced]
    return traced


# --------------------------------------------------------------------------------------------
# Listed
# --------------------------------------------------------------------------------------------


def decode_listed_jobs(
    listed: list[Any],
    source: str,
    duration: float,
    shortened_from: float | None,
    seed: int,
    warnings: list[str],
) -> tuple[list[JobSpec], list[tuple[str, JobSpec]]]:
    """The ``[[jobs]]`` entries as jobs, and those running at the start with where they are listed.
    A listed job a shortened run ends before is a warning (one line for several)."""
    jobs: list[JobSpec] = []
    listed_running: list[tuple[str, JobSpec]] = []  # where, job
    late_jobs: list[str] = []
    for i, entry in enumerate(listed):
        where = f"jobs[{i}]"
        je = decode_table(_JobEntry, entry, source, where)
        problem = checkpoint_problem(je.checkpoint_interval_s, je.checkpoint_duration_s)
        if problem:
            raise SpecError(source, f"{where}.checkpoint_duration_s", problem)
        if je.running_at_start:
            if je.submit_time_s != 0.0:
                raise SpecError(
                    source, f"{where}.running_at_start", "a job running at the start must have submit_time_s = 0"
                )
        elif je.first_checkpoint_after_s is not None:
            raise SpecError(
                source,
                f"{where}.first_checkpoint_after_s",
                "only for a job running at the start (a job starting fresh checkpoints after a whole interval)",
            )
        check_before_end(
            je.submit_time_s,
            source,
            f"{where}.submit_time_s",
            duration,
            shortened_from,
            late_jobs.append,
            ("the job would never be submitted", "the job is not submitted"),
        )
        job = _listed_job(je, source, where, seed)
        jobs.append(job)
        if je.running_at_start:
            listed_running.append((where, job))
    if len(late_jobs) > 1 and shortened_from is not None:  # one line, not one per job (a short demo run)
        late_jobs = [
            f"{source}: {len(late_jobs)} listed jobs are submitted at or after the end of this run ({duration:g} s, "
            f"shortened from {shortened_from:g} s): they are not submitted"
        ]
    warnings.extend(late_jobs)
    return jobs, listed_running


def _listed_job(je: _JobEntry, source: str, where: str, seed: int) -> JobSpec:
    if (je.duration_s is None) == (je.work_steps is None):
        raise SpecError(source, f"{where}.duration_s", "give exactly one of duration_s and work_steps")
    work = je.work_steps if je.work_steps is not None else float(je.duration_s or 0.0) / je.step_time_s
    first = je.first_checkpoint_after_s
    if je.running_at_start and first is None:
        first = _part_way_through(je.checkpoint_interval_s, seed, je.id)
    return wrap_value_error(
        source,
        where,
        lambda: JobSpec(
            job_id=je.id,
            n_cards=je.n_cards,
            work_steps=work,
            step_time_s=je.step_time_s,
            compute_share=je.compute_share,
            priority=je.priority,
            submit_time_s=je.submit_time_s,
            checkpoint_interval_s=je.checkpoint_interval_s,
            checkpoint_duration_s=je.checkpoint_duration_s,
            noncompute_utilization=je.noncompute_utilization,
            min_throughput_frac=je.min_throughput_frac,
            first_checkpoint_after_s=first,
        ),
    )


def _part_way_through(interval_s: float, seed: int, job_id: str) -> float:
    """Training time before the first checkpoint of a job that was running before t = 0 and whose
    progress is not known: uniform in (0, ``interval_s``] (jobs started at unrelated times are at
    unrelated points of their intervals; left at a whole interval, every such job would checkpoint
    at the same moment), drawn from the scenario's seed and the job's id."""
    draw = np.random.default_rng([seed, 3, zlib.crc32(job_id.encode("utf-8"))]).random()
    return float(interval_s * (1.0 - draw))


def check_listed_running(listed_running: Sequence[tuple[str, JobSpec]], site: SiteSpec, source: str) -> None:
    """The listed jobs marked ``running_at_start`` were all running at t = 0: together they must fit the site."""
    total = sum(job.n_cards for _, job in listed_running)
    if total <= site.n_cards:
        return
    held = 0
    for where, job in listed_running:
        held += job.n_cards
        if held > site.n_cards:
            raise SpecError(
                source,
                f"{where}.running_at_start",
                f"the jobs marked running_at_start up to this one need {held} cards ({total} in all), the site has "
                f"{site.n_cards}: they cannot all be running at t = 0",
            )


# --------------------------------------------------------------------------------------------
# All jobs
# --------------------------------------------------------------------------------------------


def check_jobs(jobs: Sequence[JobSpec], site: SiteSpec, source: str, listed_from: int) -> None:
    seen: set[str] = set()
    for i, j in enumerate(jobs):
        where = f"jobs[{i - listed_from}]" if i >= listed_from else "workload"
        if not JOB_ID_PATTERN.match(j.job_id):
            raise SpecError(
                source, f"{where}.id" if i >= listed_from else where,
                f"job id {j.job_id[:80]!r}: use 1-128 of A-Z a-z 0-9 _ . : @ - (it is a wire identifier)",
            )  # fmt: skip
        if j.job_id in seen:
            raise SpecError(source, f"{where}.id" if i >= listed_from else where, f"duplicate job id {j.job_id!r}")
        seen.add(j.job_id)
        if j.n_cards > site.n_cards:
            raise SpecError(
                source,
                f"{where}.n_cards" if i >= listed_from else where,
                f"job {j.job_id!r} needs {j.n_cards} cards, the site has {site.n_cards}",
            )
