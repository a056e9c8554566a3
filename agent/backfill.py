"""EASY backfilling for the agent's placements: the rule of ``twin.easy_backfill``, which the plant's
own scheduler follows too, fed with what the agent knows.

Queued jobs are placed as soon as they fit. Once the job that has waited longest has waited
``placement_backfill_wait_s`` and still does not fit, it holds a reservation (the expected time
enough cards are free for it and how many are spare then); a job behind it is placed only if it fits
now AND either is expected to end before the reservation or fits in the cards the reservation leaves
spare, so big jobs do not starve and small jobs do not leave cards idle meanwhile (the agent used to
place nothing behind such a job, which left cards idle and queues long: issue "queue wait
regression"). The controller holds a job's reservation at the earliest time computed for it
(``twin.easy_backfill.keep_promise``), so it does not slip when jobs ahead of it overrun their
expected ends (then no card is spare: the site drains for it).

Expected hold times are what a wall-time request would tell a batch scheduler: start-up plus the
job's remaining top-clock training stretched by the expected stalls and checkpoints
(``twin.workload.PhaseModel.wall_time_stretch`` with the default phase model). The remaining
work is the job's reported progress where the scheduler reports it, else its full work less the
time it has been running; a job the agent has no spec for never ends (it frees nothing).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from agent.load import SiteLoad
from twin.easy_backfill import Reservation, reservation_from_ends, spare_after_backfill
from twin.state import JobInfo, StateSnapshot
from twin.workload import JobSpec, PhaseModel

__all__ = [
    "Reservation",
    "backfill_candidates",
    "expected_hold_s",
    "expected_starts_s",
    "release_times",
    "reservation",
]

_PHASES = PhaseModel()


def expected_hold_s(spec: JobSpec | None, *, progress_frac: float = 0.0, running_s: float = 0.0) -> float:
    """Expected time from now that a job holds its cards: start-up (if it has not run yet) plus its
    remaining top-clock training stretched by stalls and checkpoints; ``inf`` without a spec."""
    if spec is None:
        return math.inf
    total = (
        spec.work_steps
        * spec.step_time_s
        * _PHASES.wall_time_stretch(spec.checkpoint_interval_s, spec.checkpoint_duration_s)
    )
    if progress_frac > 0.0:
        return max(1.0 - progress_frac, 0.0) * total
    if running_s > 0.0:
        return max(_PHASES.startup_s + total - running_s, 0.0)
    return _PHASES.startup_s + total


def release_times(
    snap: StateSnapshot, load: SiteLoad, now_s: float, running_since_s: Mapping[str, float]
) -> list[tuple[float, int]]:
    """``(expected end s, cards)`` of every job of ``load``, earliest first: the order running jobs
    (and jobs being placed) are expected to release their cards."""
    running = {j.job_id: j for j in snap.jobs}
    queued = {q.job_id: q for q in snap.queue}
    ends: list[tuple[float, int]] = []
    for j in load.jobs:
        info: JobInfo | None = running.get(j.job_id) or queued.get(j.job_id)
        spec = info.spec if info is not None else None
        if j.origin == "placing":
            hold = expected_hold_s(spec)
        else:
            progress = info.progress_frac if info is not None else 0.0
            since = running_since_s.get(j.job_id, now_s)
            hold = expected_hold_s(spec, progress_frac=progress, running_s=now_s - since)
        ends.append((now_s + hold, int(j.cards.size)))
    ends.sort()
    return ends


def reservation(
    snap: StateSnapshot,
    load: SiteLoad,
    n_need: int,
    n_free: int,
    now_s: float,
    running_since_s: Mapping[str, float],
) -> Reservation:
    """When ``n_need`` cards are expected to be free (``n_free`` are free now; every busy card of
    ``load`` is released at its job's expected end) and how many are spare then. A job that can
    never fit reserves nothing (``inf``, unlimited spare)."""
    return reservation_from_ends(release_times(snap, load, now_s, running_since_s), n_need, n_free, now_s)


def expected_starts_s(
    snap: StateSnapshot,
    load: SiteLoad,
    queue: Sequence[JobInfo],
    n_free: int,
    now_s: float,
    running_since_s: Mapping[str, float],
    held: tuple[str, float] | None = None,
    ahead: Collection[str] = (),
) -> list[float]:
    """Per queued job of ``queue``: the earliest time it is expected to start, as if it were first in
    line (when its cards are expected to be free, :func:`reservation`), except that where a job holds
    a reservation (``held``: its id and promised start) it starts then, and no job behind it before
    but those that may start ahead of it (:func:`backfill_candidates`): most are placed at once and
    are no longer queued; ``ahead`` names those still queued (the placement found no window for them
    on the cards it offers: those of hosts that are off are not offered), which start as if first in
    line. ``inf`` for a job that can never fit."""
    ends = release_times(snap, load, now_s, running_since_s)
    out: list[float] = []
    for q in queue:
        start = reservation_from_ends(ends, q.n_cards, n_free, now_s).shadow_s
        if held is not None:
            if q.job_id == held[0]:
                start = min(start, held[1])
            elif q.job_id not in ahead:
                start = max(start, held[1])
        out.append(start)
    return out


def backfill_candidates(
    queue: Sequence[JobInfo], specs: Sequence[JobSpec], res: Reservation, now_s: float
) -> list[int]:
    """Indices of the queued jobs (in queue order) that may start ahead of the reserved job: those
    expected to end before the reservation, and those that fit in its spare cards (taken in turn)."""
    spare = res.spare_cards
    out: list[int] = []
    for i, (q, spec) in enumerate(zip(queue, specs, strict=True)):
        end = now_s + expected_hold_s(spec if q.spec is not None else None)
        left = spare_after_backfill(end, spec.n_cards, res, spare)
        if left is not None:
            spare = left
            out.append(i)
    return out
