"""Jobs and their phases; speed vs clock; generators and trace replay.

A synchronous training job runs on ``n_cards`` cards. One training step at the top clock takes
``step_time_s``, of which ``compute_share`` scales with 1/clock and the rest (communication that
is not overlapped, input) does not (DESIGN.md)::

    step_time(f) = step_time_s * (compute_share * f_top / f + (1 - compute_share))

All cards of a job run at the speed of the slowest one. Phases: COMPUTE (training steps),
COMMUNICATION (long collective stalls: cards wait on the network), CHECKPOINT (cards idle for
about a minute, 20 s to 5 min, about every 15 minutes while state is written), WAITING (input stalls, a failed card,
not yet started).

Work is counted in *top-clock-equivalent card-seconds*: a job of ``n`` cards that makes training
progress at relative throughput ``rho`` (1 at the top clock) does ``rho * n`` card-seconds of work
per second; a finished job has done ``n_cards * work_steps * step_time_s``.

This module also holds

* :class:`PhaseModel`: how long start-up, stalls and restarts last and how busy cards are in each
  phase (documented assumptions, used by ``twin.plant_jobs``);
* :func:`generate_jobs`: a seeded generator whose sizes and run times follow a cluster row of
  ``acme_cluster_summary.csv`` (AcmeTrace, NSDI'24), scaled to whole-host jobs of a supernode, with
  Poisson arrivals at the rate Little's law gives for a target card allocation;
* :func:`load_trace` / :func:`trace_csv`: job traces as CSV (columns in :data:`TRACE_COLUMNS`); the
  caller writes the text where it wants it (the twin reads files, it does not write them).
"""

from __future__ import annotations

import csv
import difflib
import enum
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from twin.tables import rng

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "KALOS",
    "MAX_STALL_SIGMA",
    "TRACE_COLUMNS",
    "CsvError",
    "CsvTable",
    "GeneratorConfig",
    "JobSpec",
    "Phase",
    "PhaseModel",
    "TraceError",
    "WorkloadStats",
    "acme_stats",
    "checkpoint_problem",
    "compute_utilization",
    "expected_job_card_seconds",
    "generate_jobs",
    "load_trace",
    "noncompute_utilization_of",
    "read_csv_table",
    "relative_step_time",
    "relative_throughput",
    "synchronous_utilization",
    "trace_csv",
]


class Phase(enum.IntEnum):
    COMPUTE = 0
    COMMUNICATION = 1
    CHECKPOINT = 2
    WAITING = 3


@dataclass(frozen=True)
class JobSpec:
    """A job as submitted. Times in s; work in training steps."""

    job_id: str
    n_cards: int
    work_steps: float
    step_time_s: float
    compute_share: float
    priority: float = 1.0
    submit_time_s: float = 0.0
    checkpoint_interval_s: float = 900.0
    checkpoint_duration_s: float = 60.0
    # utilization (0..1) of a card during the part of a step that does not scale with the clock
    # (memory-bound kernels keep it busy, exposed communication does not)
    noncompute_utilization: float = 0.2
    # SLO: the job's throughput must stay at or above this fraction of its top-clock throughput
    min_throughput_frac: float = 0.0
    # training time (s at the top clock) before the job's first checkpoint; None: a whole
    # checkpoint_interval_s (a job starting fresh). A job that was running before it was submitted
    # here (a warm start) is part way through its interval: its last checkpoint lies behind it.
    first_checkpoint_after_s: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.n_cards < 1:
            problems.append(f"n_cards must be >= 1, got {self.n_cards}")
        if not (self.work_steps > 0 and np.isfinite(self.work_steps)):
            problems.append(f"work_steps must be positive, got {self.work_steps}")
        if not (self.step_time_s > 0 and np.isfinite(self.step_time_s)):
            problems.append(f"step_time_s must be positive, got {self.step_time_s}")
        if not 0.0 <= self.compute_share <= 1.0:
            problems.append(f"compute_share must be within 0..1, got {self.compute_share}")
        if not 0.0 <= self.noncompute_utilization <= 1.0:
            problems.append(f"noncompute_utilization must be within 0..1, got {self.noncompute_utilization}")
        if not 0.0 <= self.min_throughput_frac <= 1.0:
            problems.append(f"min_throughput_frac must be within 0..1, got {self.min_throughput_frac}")
        if not self.priority > 0:
            problems.append(f"priority must be positive, got {self.priority}")
        if not (self.checkpoint_interval_s > 0 and self.checkpoint_duration_s >= 0):
            problems.append("checkpoint_interval_s must be positive and checkpoint_duration_s >= 0")
        first = self.first_checkpoint_after_s
        if first is not None and not 0.0 < first <= self.checkpoint_interval_s:
            problems.append(
                f"first_checkpoint_after_s must be within (0, checkpoint_interval_s = {self.checkpoint_interval_s}],"
                f" got {first}"
            )
        if not (self.submit_time_s >= 0 and math.isfinite(self.submit_time_s)):
            problems.append(f"submit_time_s must be >= 0, got {self.submit_time_s}")
        if problems:
            raise ValueError(f"job {self.job_id}: " + "; ".join(problems))

    @property
    def duration_s(self) -> float:
        """Training time at the top clock, without checkpoints, stalls or start-up."""
        return self.work_steps * self.step_time_s

    @property
    def work_card_s(self) -> float:
        """The job's whole work in top-clock-equivalent card-seconds."""
        return self.n_cards * self.work_steps * self.step_time_s


def checkpoint_problem(checkpoint_interval_s: float, checkpoint_duration_s: float) -> str:
    """What is wrong with a job's checkpoints, or "": a checkpoint may not hold the cards longer than
    the training between two (the job would spend most of its time writing checkpoints)."""
    if checkpoint_duration_s <= checkpoint_interval_s:
        return ""
    return (
        f"a checkpoint of {checkpoint_duration_s:g} s would hold the cards longer than the "
        f"{checkpoint_interval_s:g} s of training between two (checkpoint_interval_s): at most that"
    )


def relative_step_time(compute_share: float | FloatArray, clock_rel: float | FloatArray) -> FloatArray:
    """Step time at clock ``f`` relative to the top clock (``clock_rel = f / f_top``)."""
    return np.asarray(compute_share / clock_rel + (1.0 - compute_share), dtype=np.float64)


def relative_throughput(compute_share: float | FloatArray, clock_rel: float | FloatArray) -> FloatArray:
    """Training throughput at clock ``f`` relative to the top clock (<= 1)."""
    return np.asarray(1.0 / relative_step_time(compute_share, clock_rel), dtype=np.float64)


def compute_utilization(
    compute_share: float | FloatArray, clock_rel: float | FloatArray, noncompute_utilization: float | FloatArray
) -> FloatArray:
    """Average utilization of a card during COMPUTE at clock ``f``: the busy share of a step.

    The clock-sensitive part keeps the card fully busy (u = 1); the rest at
    ``noncompute_utilization``. A slower clock stretches the busy part, so utilization rises.
    """
    busy = compute_share / clock_rel
    rest = 1.0 - compute_share
    return np.asarray((busy + rest * noncompute_utilization) / (busy + rest), dtype=np.float64)


def noncompute_utilization_of(
    compute_share: float | FloatArray, exposed_comm_utilization: float | FloatArray, profile_compute_share: float
) -> FloatArray:
    """Utilization of the clock-insensitive part of a step whose clock-sensitive share is
    ``compute_share``: the measured computation (share ``compute_share / profile_compute_share`` of
    the step; its own clock-insensitive part memory-bound, busy) plus exposed communication (the
    rest, at ``exposed_comm_utilization``). See :class:`GeneratorConfig`."""
    c = np.asarray(compute_share, dtype=np.float64)
    computation = np.minimum(c / profile_compute_share, 1.0)
    memory = computation * (1.0 - profile_compute_share)
    comm = 1.0 - computation
    rest = memory + comm
    u = (memory + comm * np.asarray(exposed_comm_utilization, dtype=np.float64)) / np.where(rest > 0, rest, 1.0)
    return np.asarray(np.where(rest > 0, np.clip(u, 0.0, 1.0), 1.0), dtype=np.float64)


def synchronous_utilization(
    compute_share: float | FloatArray,
    clock_rel: float | FloatArray,
    slowest_clock_rel: float | FloatArray,
    noncompute_utilization: float | FloatArray,
) -> FloatArray:
    """Utilization of a card during COMPUTE when its job runs at the pace of its slowest card.

    A card at clock ``f`` finishes its compute part in ``compute_share * f_top / f`` of a top-clock
    step, then waits (at ``noncompute_utilization``) for the slowest card, whose step sets the
    job's pace. Equals :func:`compute_utilization` for the slowest card itself.
    """
    r = 1.0 / np.asarray(clock_rel, dtype=np.float64)
    r_slow = np.maximum(1.0 / np.asarray(slowest_clock_rel, dtype=np.float64), r)
    cs = np.asarray(compute_share, dtype=np.float64)
    step = cs * r_slow + (1.0 - cs)
    busy = cs * r
    return np.asarray((busy + (step - busy) * noncompute_utilization) / step, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Phase dynamics (used by twin.plant_jobs)
# --------------------------------------------------------------------------------------------


#: Largest lognormal shape of a stall's duration: at 3 the mean stall is exp(4.5) = 90 times the
#: median and one stall in a thousand lasts 10,000 times it; far beyond, exp(sigma^2 / 2) overflows.
MAX_STALL_SIGMA = 3.0


#: Longest ``PhaseModel.startup_s`` and ``restart_delay_s`` (a day).
MAX_PHASE_DELAY_S = 86400.0


@dataclass(frozen=True)
class PhaseModel:
    """Durations and card utilization of the non-training phases. Values are assumptions
    (no public per-phase measurements); each names what it stands for.

    * ``startup_s``: WAITING after placement (container start, NCCL initialisation, loading the
      last checkpoint) before the first step.
    * ``restart_delay_s``: WAITING after a card failure before the job, rolled back to its last
      checkpoint, is queued again (detection by the framework's watchdog, teardown).
    * communication stalls (phase COMMUNICATION: a straggler or congested collective holds every
      card) arrive as a Poisson process at ``comm_stalls_per_hour`` while the job computes, and last
      a lognormal time of median ``comm_stall_median_s`` and shape ``stall_sigma`` (at most
      :data:`MAX_STALL_SIGMA`);
    * input stalls (phase WAITING: the data loader or storage is late) likewise.
    * ``max_restarts``: a job that loses cards more often than this fails for good.

    Utilization during a COMMUNICATION stall is ``communication_utilization`` (every card waits in a
    collective whose kernels spin at low SM activity: 0.2, the middle of the 0.1-0.3 range the
    generator draws for exposed communication, assumption); CHECKPOINT and WAITING leave the cards
    idle (0). ``twin.power`` turns utilization into switching power.
    """

    # at most a day: a longer start or restart is no job's (a unit slip, ms for s), and the job's cards
    # would wait for nothing all run
    startup_s: float = field(default=60.0, metadata=rng(0.0, MAX_PHASE_DELAY_S))
    restart_delay_s: float = field(default=180.0, metadata=rng(0.0, MAX_PHASE_DELAY_S))
    comm_stalls_per_hour: float = 2.0
    comm_stall_median_s: float = 20.0
    input_stalls_per_hour: float = 1.0
    input_stall_median_s: float = 30.0
    stall_sigma: float = field(default=0.5, metadata=rng(0.0, MAX_STALL_SIGMA))
    communication_utilization: float = 0.2
    checkpoint_utilization: float = 0.0
    waiting_utilization: float = 0.0
    max_restarts: int = field(default=3, metadata=rng(0, 1000))

    def __post_init__(self) -> None:
        for name in ("startup_s", "restart_delay_s", "comm_stalls_per_hour", "comm_stall_median_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"PhaseModel.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("input_stalls_per_hour", "input_stall_median_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"PhaseModel.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.stall_sigma <= MAX_STALL_SIGMA:
            raise ValueError(f"PhaseModel.stall_sigma must be within 0..{MAX_STALL_SIGMA:g}, got {self.stall_sigma}")
        for name in ("communication_utilization", "checkpoint_utilization", "waiting_utilization"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PhaseModel.{name} must be within 0..1, got {getattr(self, name)}")
        if self.max_restarts < 0:
            raise ValueError(f"PhaseModel.max_restarts must be >= 0, got {self.max_restarts}")

    def stall_fraction(self) -> float:
        """Expected seconds of stalls per second of computing (lognormal means); a computing job
        spends ``f / (1 + f)`` of its time in stalls."""
        stretch = math.exp(self.stall_sigma**2 / 2.0)
        comm = self.comm_stalls_per_hour * self.comm_stall_median_s
        inp = self.input_stalls_per_hour * self.input_stall_median_s
        return (comm + inp) * stretch / 3600.0

    def wall_time_stretch(self, checkpoint_interval_s: float, checkpoint_duration_s: float) -> float:
        """Expected wall time per second of top-clock training: 1 plus the stalls' share plus the
        checkpoints' (``checkpoint_duration_s`` every ``checkpoint_interval_s``)."""
        return 1.0 + self.stall_fraction() + checkpoint_duration_s / checkpoint_interval_s

    def expected_wall_time_s(
        self, duration_s: float, checkpoint_interval_s: float, checkpoint_duration_s: float
    ) -> float:
        """Expected time a job holds its cards for ``duration_s`` of top-clock training."""
        return self.startup_s + duration_s * self.wall_time_stretch(checkpoint_interval_s, checkpoint_duration_s)


# --------------------------------------------------------------------------------------------
# Generator
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadStats:
    """Job size and run time statistics of one cluster (a row of ``acme_cluster_summary.csv``)."""

    name: str
    median_gpus: float
    mean_gpus: float
    median_run_time_s: float
    mean_run_time_s: float
    max_run_time_s: float

    def __post_init__(self) -> None:
        if not (0 < self.median_gpus <= self.mean_gpus):
            raise ValueError(f"{self.name}: need 0 < median_gpus <= mean_gpus (a right-skewed size distribution)")
        if not (0 < self.median_run_time_s <= self.mean_run_time_s <= self.max_run_time_s):
            raise ValueError(f"{self.name}: need 0 < median_run_time_s <= mean_run_time_s <= max_run_time_s")


#: Kalos, the LLM training cluster of AcmeTrace (Hu et al., NSDI'24): GPU jobs' median/mean GPUs
#: 1 / 26.77 and median/mean/max run time 124 / 1259.689 / 625740 s
#: (../shared/data/acme_cluster_summary.csv, row "Kalos").
KALOS = WorkloadStats(
    name="Kalos",
    median_gpus=1.0,
    mean_gpus=26.77,
    median_run_time_s=124.0,
    mean_run_time_s=1259.689,
    max_run_time_s=625740.0,
)


def acme_stats(path: str | Path, cluster: str) -> WorkloadStats:
    """Read one cluster's row of an AcmeTrace ``cluster_summary.csv`` (columns ``id``,
    ``med_gpu_num``, ``avg_gpu_num``, ``med_run_time_gpu``, ``avg_run_time_gpu``, ``max_run_time_gpu``)."""
    source = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise TraceError(source, 0, "", f"cannot read: {exc.strerror or exc}") from None
    for line, row in enumerate(rows, start=2):
        if row.get("id") == cluster:
            try:
                return WorkloadStats(
                    name=cluster,
                    median_gpus=float(row["med_gpu_num"]),
                    mean_gpus=float(row["avg_gpu_num"]),
                    median_run_time_s=float(row["med_run_time_gpu"]),
                    mean_run_time_s=float(row["avg_run_time_gpu"]),
                    max_run_time_s=float(row["max_run_time_gpu"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise TraceError(source, line, "", f"cluster {cluster!r}: {exc}") from None
    known = ", ".join(r.get("id", "?") for r in rows)
    raise TraceError(source, 0, "id", f"no cluster {cluster!r} (known: {known})")


@dataclass(frozen=True)
class GeneratorConfig:
    """How :func:`generate_jobs` draws jobs. Defaults and their sources:

    * sizes: ``n = granularity * ceil(X / granularity)`` clipped to ``[granularity, max_cards]``,
      ``X`` lognormal with the cluster's median and mean GPUs per job (heavy-tailed: on Kalos 79%
      of jobs take one 8-card host, 1.6% take the 256-card maximum = half a supernode);
    * top-clock run times: lognormal with the cluster's median and mean run time, clipped to
      ``[min_duration_s, max_run_time_s]``, times ``duration_scale``; sizes and run times are
      drawn independently;
    * arrivals: Poisson, rate ``target_allocation * n_site_cards / E[n_cards * wall time]``
      (Little's law), wall time from :meth:`PhaseModel.expected_wall_time_s`;
    * step time: lognormal, median ``step_time_median_s`` (2 s, typical of large-model training
      iterations; assumption) and shape 0.5, clipped to 0.2..30 s;
    * compute share: uniform in ``compute_share_range`` (0.60..0.87; 0.87 is the clock-sensitive
      share of the GPT-3 stage profile, a fit of time vs 1/f to
      ``perseus_stage_profile_gpt3-175b+a100_sxm_bf16.csv``; lower values stand for jobs with
      exposed communication, assumption);
    * checkpoint every ``checkpoint_interval_s`` (900 s, DESIGN.md), lasting lognormal median
      ``checkpoint_median_s`` (60 s) shape 0.3 clipped to 20..300 s (assumption);
    * noncompute utilization (the card's utilization in the part of a step that does not scale with
      the clock) from the compute share ``c``: a step is the measured computation (a share
      ``c / s`` of it, ``s = profile_compute_share`` = 0.87, the GPT-3 profile's clock-sensitive
      share) plus exposed communication (the rest). The computation's clock-insensitive part is
      memory-bound and keeps the card busy (utilization 1: the Perseus profile's power, which the
      card model is calibrated on, averages over the whole computation, so a job of share 0.87
      draws the calibrated training power); exposed communication runs at a utilization drawn
      uniform in ``exposed_communication_utilization_range`` (0.1..0.3, assumption). So
      ``ncu = ((c / s)(1 - s) + (1 - c / s) u_comm) / (1 - c)``: 1 at ``c = s``, 0.30..0.46 at 0.60
      (0.38 at the range's middle);
    * priority 0.5 / 1 / 2 with probabilities ``priority_probs`` (0.2 / 0.6 / 0.2), SLO
      (``min_throughput_frac``) 0 / 0.7 / 0.9 by priority (assumption).
    """

    stats: WorkloadStats = KALOS
    target_allocation: float = 0.65
    granularity: int = 8
    max_cards: int = 256
    min_duration_s: float = 60.0
    duration_scale: float = 1.0
    step_time_median_s: float = 2.0
    compute_share_range: tuple[float, float] = (0.60, 0.87)
    checkpoint_interval_s: float = 900.0
    checkpoint_median_s: float = 60.0
    profile_compute_share: float = 0.87
    exposed_communication_utilization_range: tuple[float, float] = (0.1, 0.3)
    priorities: tuple[float, ...] = (0.5, 1.0, 2.0)
    priority_probs: tuple[float, ...] = (0.2, 0.6, 0.2)
    slo_by_priority: tuple[float, ...] = (0.0, 0.7, 0.9)
    phases: PhaseModel = PhaseModel()

    def __post_init__(self) -> None:
        if not 0.0 < self.target_allocation <= 1.0:
            raise ValueError(f"target_allocation must be within (0, 1], got {self.target_allocation}")
        if self.granularity < 1 or self.max_cards < self.granularity:
            raise ValueError("need 1 <= granularity <= max_cards")
        if not (len(self.priorities) == len(self.priority_probs) == len(self.slo_by_priority)):
            raise ValueError("priorities, priority_probs and slo_by_priority must have the same length")
        if abs(sum(self.priority_probs) - 1.0) > 1e-9:
            raise ValueError("priority_probs must sum to 1")
        if not 0.0 <= self.compute_share_range[0] <= self.compute_share_range[1] <= 1.0:
            raise ValueError("compute_share_range must be an ordered pair within 0..1")
        if not self.duration_scale > 0:
            raise ValueError("duration_scale must be positive")
        if not 0.0 < self.profile_compute_share <= 1.0:
            raise ValueError("profile_compute_share must be within (0, 1]")
        lo, hi = self.exposed_communication_utilization_range
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError("exposed_communication_utilization_range must be an ordered pair within 0..1")

    # ---- the two distributions -----------------------------------------------------------------
    def _size_lognormal(self) -> tuple[float, float]:
        st = self.stats
        return math.log(st.median_gpus), math.sqrt(2.0 * math.log(st.mean_gpus / st.median_gpus))

    def _duration_lognormal(self) -> tuple[float, float]:
        st = self.stats
        return math.log(st.median_run_time_s), math.sqrt(2.0 * math.log(st.mean_run_time_s / st.median_run_time_s))

    def size_distribution(self) -> tuple[npt.NDArray[np.int64], FloatArray]:
        """Possible job sizes and their probabilities."""
        mu, sigma = self._size_lognormal()
        g = self.granularity
        sizes = np.arange(g, self.max_cards + 1, g, dtype=np.int64)
        upper = [_norm_cdf((math.log(s) - mu) / sigma) if sigma > 0 else float(s >= math.exp(mu)) for s in sizes]
        upper[-1] = 1.0
        probs = np.diff(np.concatenate([[0.0], np.asarray(upper)]))
        return sizes, np.asarray(probs, dtype=np.float64)

    def mean_size_cards(self) -> float:
        sizes, probs = self.size_distribution()
        return float(np.dot(sizes, probs))

    def mean_duration_s(self) -> float:
        """Mean top-clock run time of the clipped, scaled lognormal."""
        mu, sigma = self._duration_lognormal()
        return self.duration_scale * _clipped_lognormal_mean(mu, sigma, self.min_duration_s, self.stats.max_run_time_s)

    def mean_checkpoint_s(self) -> float:
        return self.checkpoint_median_s * math.exp(0.3**2 / 2.0)


def _norm_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[min(max(X, lo), hi)] for X = exp(N(mu, sigma^2))."""
    if sigma <= 0:
        return float(min(max(math.exp(mu), lo), hi))
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    inner = math.exp(mu + sigma**2 / 2.0) * (_norm_cdf(b - sigma) - _norm_cdf(a - sigma))
    return lo * _norm_cdf(a) + hi * (1.0 - _norm_cdf(b)) + inner


def expected_job_card_seconds(config: GeneratorConfig) -> float:
    """E[n_cards * wall time] of a generated job (sizes and run times are independent)."""
    wall = config.phases.expected_wall_time_s(
        config.mean_duration_s(), config.checkpoint_interval_s, config.mean_checkpoint_s()
    )
    return config.mean_size_cards() * wall


def generate_jobs(
    n_site_cards: int,
    horizon_s: float,
    seed: int,
    config: GeneratorConfig | None = None,
    start_s: float = 0.0,
    id_prefix: str = "j",
) -> list[JobSpec]:
    """Jobs submitted in ``[start_s, start_s + horizon_s)`` to a site of ``n_site_cards`` cards.

    Seeded and reproducible: the same arguments give the same jobs. The arrival rate follows
    Little's law so that, in the long run, ``config.target_allocation`` of the site's cards are
    held by jobs (if the scheduler keeps up). Job ids are ``{id_prefix}{index:06d}``.
    """
    cfg = config if config is not None else GeneratorConfig()
    if n_site_cards < 1:
        raise ValueError("n_site_cards must be >= 1")
    if not horizon_s >= 0:
        raise ValueError("horizon_s must be >= 0")
    rng = np.random.default_rng(seed)
    rate_per_s = cfg.target_allocation * n_site_cards / expected_job_card_seconds(cfg)
    # arrivals: draw a generous batch of gaps, extend if needed
    times: list[float] = []
    t = start_s
    while True:
        gaps = rng.exponential(1.0 / rate_per_s, size=max(16, int(rate_per_s * horizon_s * 1.2) + 16))
        arrivals = t + np.cumsum(gaps)
        inside = arrivals[arrivals < start_s + horizon_s]
        times.extend(inside.tolist())
        if inside.size < arrivals.size:
            break
        t = float(arrivals[-1])
    n = len(times)
    sizes, probs = cfg.size_distribution()
    n_cards = rng.choice(sizes, size=n, p=probs).astype(np.int64)
    n_cards = np.minimum(n_cards, (n_site_cards // cfg.granularity) * cfg.granularity or n_site_cards)
    mu_d, sigma_d = cfg._duration_lognormal()
    duration = np.clip(rng.lognormal(mu_d, sigma_d, size=n), cfg.min_duration_s, cfg.stats.max_run_time_s)
    duration = duration * cfg.duration_scale
    step = np.clip(rng.lognormal(math.log(cfg.step_time_median_s), 0.5, size=n), 0.2, 30.0)
    cs = rng.uniform(cfg.compute_share_range[0], cfg.compute_share_range[1], size=n)
    ckpt = np.clip(rng.lognormal(math.log(cfg.checkpoint_median_s), 0.3, size=n), 20.0, 300.0)
    u_comm = rng.uniform(*cfg.exposed_communication_utilization_range, size=n)
    ncu = noncompute_utilization_of(cs, u_comm, cfg.profile_compute_share)
    prio_idx = rng.choice(len(cfg.priorities), size=n, p=np.asarray(cfg.priority_probs))
    jobs = []
    for i in range(n):
        k = int(prio_idx[i])
        jobs.append(
            JobSpec(
                job_id=f"{id_prefix}{i:06d}",
                n_cards=int(n_cards[i]),
                work_steps=float(duration[i] / step[i]),
                step_time_s=float(step[i]),
                compute_share=float(cs[i]),
                priority=float(cfg.priorities[k]),
                submit_time_s=float(times[i]),
                checkpoint_interval_s=float(cfg.checkpoint_interval_s),
                checkpoint_duration_s=float(ckpt[i]),
                noncompute_utilization=float(ncu[i]),
                min_throughput_frac=float(cfg.slo_by_priority[k]),
            )
        )
    return jobs


# --------------------------------------------------------------------------------------------
# Trace replay
# --------------------------------------------------------------------------------------------

#: Trace CSV columns: name -> (required, meaning). Exactly one of duration_s / work_steps is needed.
TRACE_COLUMNS: dict[str, tuple[bool, str]] = {
    "job_id": (True, "unique job name"),
    "submit_time_s": (True, "submission time, s from the start of the run (>= 0)"),
    "n_cards": (True, "cards the job needs (integer >= 1)"),
    "duration_s": (False, "training time at the top clock, s (or give work_steps)"),
    "work_steps": (False, "training steps to run (or give duration_s)"),
    "step_time_s": (True, "time of one step at the top clock, s"),
    "compute_share": (True, "share of a step that scales with 1/clock, 0..1"),
    "priority": (False, "relative value of the job's work (> 0, default 1)"),
    "checkpoint_interval_s": (False, "training time between checkpoints at the top clock, s (default 900)"),
    "checkpoint_duration_s": (False, "time a checkpoint holds the cards idle, s (default 60; <= the interval)"),
    "min_throughput_frac": (False, "SLO: least throughput as a fraction of top-clock throughput, 0..1 (default 0)"),
    "noncompute_utilization": (False, "card utilization in the non-scaling part of a step, 0..1 (default 0.2)"),
}


class CsvError(ValueError):
    """A CSV file is wrong. The message names the file, the line, the column and the problem."""

    def __init__(self, source: str, line: int, column: str, problem: str) -> None:
        self.source = source
        self.line = line
        self.column = column
        self.problem = problem
        where = source + (f":{line}" if line else "") + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}")


class TraceError(CsvError):
    """A trace file is wrong. The message names the file, the line, the column and the problem."""


@dataclass(frozen=True)
class CsvTable:
    """A CSV file as :func:`read_csv_table` reads it: the header's column names and the data rows,
    each with the file line it came from and exactly one (stripped) field per column."""

    source: str
    header_line: int  # 0: the file has no header (no data lines at all)
    header: tuple[str, ...]
    rows: tuple[tuple[int, tuple[str, ...]], ...]


def read_csv_table(path: str | Path) -> CsvTable:
    """Read a CSV file with a header line (blank lines and lines starting with ``#`` are skipped).

    Raises :class:`CsvError` naming the file, line and column when the file cannot be read, is not
    UTF-8, names a column twice, or has a data line with more or fewer fields than the header has
    columns (each line is one record: a quoted field may not span lines). An empty file is a table
    with no header; a header alone is a table with no rows (the caller says what it expected).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise CsvError(source, 0, "", "file not found") from None
    except IsADirectoryError:
        raise CsvError(source, 0, "", "is a directory, expected a CSV file") from None
    except UnicodeDecodeError:
        raise CsvError(source, 0, "", "not a UTF-8 text file") from None
    except OSError as exc:
        raise CsvError(source, 0, "", f"cannot read: {exc.strerror or exc}") from None
    numbered = [
        (i, line)
        for i, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not numbered:
        return CsvTable(source, 0, (), ())
    # one record per line: a quote left open on one line must not swallow the lines after it (a
    # field spanning lines would leave fewer records than lines, and no line to name)
    parsed = [next(csv.reader([line]), []) for _, line in numbered]
    header_line = numbered[0][0]
    header = tuple(h.strip() for h in parsed[0])
    if len(set(header)) != len(header):
        dup = next(c for c in header if header.count(c) > 1)
        raise CsvError(source, header_line, dup, "column appears twice")
    rows: list[tuple[int, tuple[str, ...]]] = []
    for (lineno, line), row in zip(numbered[1:], parsed[1:], strict=True):
        if len(row) != len(header):
            quote = "; a quoted field must end on its line" if line.count('"') % 2 else ""
            raise CsvError(
                source, lineno, "", f"expected {len(header)} fields (one per header column), got {len(row)}{quote}"
            )
        rows.append((lineno, tuple(v.strip() for v in row)))
    return CsvTable(source, header_line, header, tuple(rows))


def load_trace(path: str | Path) -> list[JobSpec]:
    """Read a job trace CSV (see :data:`TRACE_COLUMNS`; lines starting with ``#`` are comments).

    Jobs come back sorted by submission time (stable). Any problem raises :class:`TraceError`
    naming the file, line and column.
    """
    try:
        table = read_csv_table(path)
    except CsvError as exc:
        raise TraceError(exc.source, exc.line, exc.column, exc.problem) from None
    source, header_line, header = table.source, table.header_line, table.header
    if not header:
        raise TraceError(source, 0, "", "empty trace: expected a header line and at least one job")
    for col in header:
        if col not in TRACE_COLUMNS:
            close = difflib.get_close_matches(col, list(TRACE_COLUMNS), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known columns: {', '.join(TRACE_COLUMNS)}"
            raise TraceError(source, header_line, col, f"unknown column{hint}")
    for col, (required, meaning) in TRACE_COLUMNS.items():
        if required and col not in header:
            raise TraceError(source, header_line, col, f"missing required column ({meaning})")
    if ("duration_s" in header) == ("work_steps" in header):
        raise TraceError(source, header_line, "duration_s", "give exactly one of the columns duration_s and work_steps")
    if not table.rows:
        raise TraceError(source, header_line, "", "no jobs after the header")
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for lineno, row in table.rows:
        rec = dict(zip(header, row, strict=True))
        jobs.append(_job_from_record(rec, source, lineno, seen))
    jobs.sort(key=lambda j: j.submit_time_s)
    return jobs


def _number(rec: dict[str, str], col: str, source: str, line: int, *, integer: bool = False) -> float:
    raw = rec[col]
    if raw == "":
        raise TraceError(source, line, col, "empty value")
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(source, line, col, f"not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise TraceError(source, line, col, f"must be finite, got {raw!r}")
    if integer and value != int(value):
        raise TraceError(source, line, col, f"must be an integer, got {raw!r}")
    return value


def _job_from_record(rec: dict[str, str], source: str, line: int, seen: dict[str, int]) -> JobSpec:
    job_id = rec["job_id"]
    if not job_id:
        raise TraceError(source, line, "job_id", "empty value")
    if job_id in seen:
        raise TraceError(source, line, "job_id", f"duplicate job id {job_id!r} (first on line {seen[job_id]})")
    seen[job_id] = line
    ranges: dict[str, tuple[float, float, bool]] = {  # lo, hi, lo_open
        "submit_time_s": (0.0, math.inf, False),
        "n_cards": (1.0, 1e7, False),
        "duration_s": (0.0, math.inf, True),
        "work_steps": (0.0, math.inf, True),
        "step_time_s": (0.0, math.inf, True),
        "compute_share": (0.0, 1.0, False),
        "priority": (0.0, math.inf, True),
        "checkpoint_interval_s": (0.0, math.inf, True),
        "checkpoint_duration_s": (0.0, math.inf, False),
        "min_throughput_frac": (0.0, 1.0, False),
        "noncompute_utilization": (0.0, 1.0, False),
    }
    values: dict[str, float] = {}
    for col, (lo, hi, lo_open) in ranges.items():
        if col not in rec:
            continue
        v = _number(rec, col, source, line, integer=col == "n_cards")
        if v < lo or (lo_open and v <= lo) or v > hi:
            bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
            span = f"{bound} and <= {hi:g}" if math.isfinite(hi) else bound
            raise TraceError(source, line, col, f"must be {span}, got {rec[col]!r}")
        values[col] = v
    step = values["step_time_s"]
    work = values["work_steps"] if "work_steps" in values else values["duration_s"] / step
    problem = checkpoint_problem(values.get("checkpoint_interval_s", 900.0), values.get("checkpoint_duration_s", 60.0))
    if problem:
        raise TraceError(source, line, "checkpoint_duration_s", problem)
    return JobSpec(
        job_id=job_id,
        n_cards=int(values["n_cards"]),
        work_steps=work,
        step_time_s=step,
        compute_share=values["compute_share"],
        priority=values.get("priority", 1.0),
        submit_time_s=values["submit_time_s"],
        checkpoint_interval_s=values.get("checkpoint_interval_s", 900.0),
        checkpoint_duration_s=values.get("checkpoint_duration_s", 60.0),
        noncompute_utilization=values.get("noncompute_utilization", 0.2),
        min_throughput_frac=values.get("min_throughput_frac", 0.0),
    )


def trace_csv(jobs: Sequence[JobSpec]) -> str:
    """Jobs as the text of a trace CSV that :func:`load_trace` reads back unchanged (work_steps form)."""
    cols = [
        "job_id",
        "submit_time_s",
        "n_cards",
        "work_steps",
        "step_time_s",
        "compute_share",
        "priority",
        "checkpoint_interval_s",
        "checkpoint_duration_s",
        "min_throughput_frac",
        "noncompute_utilization",
    ]
    out = io.StringIO(newline="")
    w = csv.writer(out)
    w.writerow(cols)
    for j in jobs:
        w.writerow([repr(getattr(j, c)) if isinstance(getattr(j, c), float) else getattr(j, c) for c in cols])
    return out.getvalue()
