"""Jobs and their phases; speed vs clock; generators and trace replay.

A synchronous training job runs on ``n_cards`` cards. One training step at the top clock takes
``step_time_s``, of which ``compute_share`` scales with 1/clock and the rest (communication that
is not overlapped, input) does not (DESIGN.md)::

    step_time(f) = step_time_s * (compute_share * f_top / f + (1 - compute_share))

All cards of a job run at the speed of the slowest one. Phases: COMPUTE (training steps),
COMMUNICATION (long collective stalls: cards wait on the network), CHECKPOINT (cards idle for
minutes about every 15 minutes while state is written), WAITING (input stalls, a failed card,
not yet started).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


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
    noncompute_utilization: float = 0.2
    # SLO: the job's throughput must stay at or above this fraction of its top-clock throughput
    min_throughput_frac: float = 0.0

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
        if problems:
            raise ValueError(f"job {self.job_id}: " + "; ".join(problems))


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
