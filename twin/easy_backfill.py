"""EASY backfilling, the rule shared by the plant's built-in scheduler and the agent's placement.

Queued jobs start as soon as they fit. Once the job that has waited longest has waited long enough
and still does not fit, it holds a *reservation* (Lifka 1995, "The ANL/IBM SP scheduling system";
Mu'alem and Feitelson 2001, "Utilization, predictability, workloads, and user runtime estimates in
scheduling the IBM SP2 with backfilling"): the expected time enough cards are free for it (running
jobs release their cards in the order of their expected ends) and how many cards are spare then. A
job behind it may start ahead only if it fits now and either is expected to end before the
reservation or fits in the cards the reservation leaves spare. The reservation is a promise: it does
not slip when jobs ahead of it overrun their expected ends (expected run times are means, not the
upper bounds of wall-time requests); once the promised start is past, no card is spare and the site
drains for the job. A job that can no longer fit (cards failed since the promise) reserves nothing.

``twin.plant_jobs.PlantJobs`` (the virtual plant's own scheduler) and ``agent.backfill`` / ``agent.controller``
(the agent's placements) both call these functions, so the two schedules follow one rule; each
computes the expected ends from what it knows (the plant from the true remaining work, the agent
from reported progress). Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Reservation", "keep_promise", "reservation_from_ends", "spare_after_backfill"]

# A job expected to end within this of the reservation ends before it (float noise in sums of times).
_EPS_S = 1e-6


@dataclass(frozen=True)
class Reservation:
    """The reservation of a blocked job: the expected time it can start and the cards spare then
    (``inf`` and ``inf`` for a job that can never fit: it reserves nothing)."""

    shadow_s: float
    spare_cards: float


def reservation_from_ends(ends: Iterable[tuple[float, int]], n_need: int, n_free: int, now_s: float) -> Reservation:
    """When ``n_need`` cards are free, given ``n_free`` free now and the busy ones released as
    ``ends`` says (``(expected end s, cards)``, earliest first), and how many are spare then."""
    avail = n_free
    if avail >= n_need:
        return Reservation(now_s, float(avail - n_need))
    for end_s, n in ends:
        avail += n
        if avail >= n_need:
            return Reservation(end_s, float(avail - n_need))
    return Reservation(math.inf, math.inf)


def keep_promise(promised: tuple[str, float] | None, job_id: str, res: Reservation) -> Reservation:
    """``job_id``'s reservation as promised: where ``promised`` (the blocked job and the earliest
    start computed for it) is this job's and earlier than ``res``, the promise stands and no card is
    spare (the promise already lacks cards: only jobs expected to end before it start ahead).
    Without this a big job waited 8,959 s on the nominal day and never started while a stream of
    small jobs, each expected to end in time, kept its cards busy. A job that can no longer fit
    (``res`` is ``inf`` and ``inf``: cards failed since the promise left too few healthy ones) is
    promised nothing: it reserves nothing (else the site drained, once the promise was due, for a job
    that could not start, and every other job waited behind it)."""
    never_fits = math.isinf(res.shadow_s) and math.isinf(res.spare_cards)
    if promised is not None and promised[0] == job_id and promised[1] < res.shadow_s and not never_fits:
        return Reservation(promised[1], 0.0)
    return res


def spare_after_backfill(hold_end_s: float, n_cards: int, res: Reservation, spare_cards: float) -> float | None:
    """Whether a job of ``n_cards`` that fits now may start ahead of the reservation ``res`` when it
    would hold its cards until ``hold_end_s``: the cards still spare after it (``spare_cards`` before
    it; unchanged for a job that ends before the reservation), or None if it would delay the
    reserved job."""
    if hold_end_s <= res.shadow_s + _EPS_S:
        return spare_cards
    if n_cards <= spare_cards:
        return spare_cards - n_cards
    return None
