"""A small seeded workload for scenarios and benchmarks: running jobs packed onto a site.

Jobs get sizes from ``sizes`` (powers of two, 8 to 256 cards by default) until ``allocation`` of
the site's cards is reached; they are packed largest first, first fit, onto consecutive cards of
one supernode (a 64-card job fills one rack, a 256-card job four consecutive racks), so every job
is a compact block of the torus and stays inside its supernode. Phases, compute shares, priorities
and SLOs are drawn from the given ranges. Deterministic for a given seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase

IntArray = npt.NDArray[np.int64]

__all__ = ["SyntheticWorkload", "acme_workload", "pack_jobs", "synthetic_workload"]


@dataclass(frozen=True)
class SyntheticWorkload:
    jobs: tuple[JobSpec, ...]
    job_cards: tuple[IntArray, ...]
    job_phase: tuple[Phase, ...]
    queue: tuple[JobSpec, ...]


def pack_jobs(site: SiteSpec, sizes: Sequence[int]) -> list[IntArray | None]:
    """Cards for jobs of ``sizes``: largest first, first fit of blocks of consecutive cards inside
    one supernode (aligned to the job size up to a rack); None where a job does not fit. The
    result is in the order of ``sizes``."""
    per_sn = site.cards_per_supernode
    used = np.zeros(site.n_cards, dtype=bool)
    out: list[IntArray | None] = [None] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        s = int(sizes[i])
        if s > per_sn:
            continue
        step = min(s, site.cards_per_rack) if site.cards_per_rack % min(s, site.cards_per_rack) == 0 else 1
        for sn in range(site.supernodes):
            base = sn * per_sn
            start = next((st for st in range(base, base + per_sn - s + 1, step) if not used[st : st + s].any()), None)
            if start is not None:
                used[start : start + s] = True
                out[i] = np.arange(start, start + s, dtype=np.int64)
                break
    return out


def acme_workload(site: SiteSpec, *, seed: int = 0, allocation: float = 0.65, queue_jobs: int = 0) -> SyntheticWorkload:
    """Running jobs drawn from ``twin.workload.generate_jobs`` (sizes, run times, compute shares,
    priorities and SLOs fitted to the AcmeTrace Kalos cluster) until ``allocation`` of the cards is
    held, packed as in :func:`synthetic_workload`; the next ``queue_jobs`` generated jobs wait in
    the queue. All running jobs are in COMPUTE (phases evolve in the plant, not in a snapshot)."""
    from twin.workload import generate_jobs

    target = round(allocation * site.n_cards)
    stream = generate_jobs(site.n_cards, 30 * 24 * 3600.0, seed)
    running: list[JobSpec] = []
    total = 0
    i = 0
    while i < len(stream) and total + stream[i].n_cards <= target:
        running.append(stream[i])
        total += stream[i].n_cards
        i += 1
    cards = pack_jobs(site, [j.n_cards for j in running])
    kept = [(j, c) for j, c in zip(running, cards, strict=True) if c is not None]
    queue = tuple(stream[i : i + queue_jobs])
    return SyntheticWorkload(
        jobs=tuple(j for j, _c in kept),
        job_cards=tuple(c for _j, c in kept if c is not None),
        job_phase=tuple(Phase.COMPUTE for _ in kept),
        queue=queue,
    )


def synthetic_workload(
    site: SiteSpec,
    *,
    seed: int = 0,
    allocation: float = 0.65,
    sizes: Sequence[int] = (8, 16, 32, 64, 128, 256),
    compute_share: tuple[float, float] = (0.85, 0.97),
    noncompute_utilization: float = 0.3,
    phase_weights: Sequence[float] = (0.85, 0.07, 0.05, 0.03),
    priorities: Sequence[float] = (1.0, 2.0),
    slo_fraction: float = 0.2,
    slo_min_throughput: float = 0.85,
    queue_jobs: int = 0,
) -> SyntheticWorkload:
    """Generate running jobs covering about ``allocation`` of the cards, and ``queue_jobs`` queued jobs.

    ``phase_weights`` are the probabilities of COMPUTE, COMMUNICATION, CHECKPOINT, WAITING.
    """
    if not 0.0 <= allocation <= 1.0:
        raise ValueError(f"allocation must be within 0..1, got {allocation}")
    if any(s < 1 for s in sizes) or not sizes:
        raise ValueError("sizes must be positive card counts")
    rng = np.random.default_rng(seed)
    per_sn = site.cards_per_supernode
    target = round(allocation * site.n_cards)
    sizes_ok = [s for s in sizes if s <= per_sn]
    wanted: list[int] = []
    total = 0
    while total < target:
        fits = [s for s in sizes_ok if total + s <= target]
        if not fits:
            break
        s = int(rng.choice(fits))
        wanted.append(s)
        total += s
    blocks = [b for b in pack_jobs(site, wanted) if b is not None]
    pw = np.asarray(phase_weights, dtype=np.float64)
    pw = pw / pw.sum()
    phases_all = (Phase.COMPUTE, Phase.COMMUNICATION, Phase.CHECKPOINT, Phase.WAITING)

    def make_job(job_id: str, n: int) -> JobSpec:
        slo = slo_min_throughput if rng.random() < slo_fraction else 0.0
        return JobSpec(
            job_id=job_id,
            n_cards=n,
            work_steps=float(rng.integers(10_000, 100_000)),
            step_time_s=float(rng.uniform(0.5, 3.0)),
            compute_share=float(rng.uniform(*compute_share)),
            priority=float(rng.choice(np.asarray(priorities))),
            noncompute_utilization=noncompute_utilization,
            min_throughput_frac=slo,
        )

    jobs = tuple(make_job(f"job{i:03d}", int(b.size)) for i, b in enumerate(blocks))
    phases = tuple(phases_all[int(rng.choice(4, p=pw))] for _ in blocks)
    queue = tuple(make_job(f"queued{i:03d}", int(rng.choice(np.asarray(sizes_ok)))) for i in range(queue_jobs))
    return SyntheticWorkload(jobs=jobs, job_cards=tuple(blocks), job_phase=phases, queue=queue)
