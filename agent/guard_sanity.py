"""The guard's step 1, sanity (``agent.guard``'s module docstring): :func:`check_shapes` refuses a
proposal without one setting per card; :func:`sanitize` clips levels and power limits into the card's
range, keeps only valid placements (:func:`_valid_placements`: the job queued, its cards free, seen and
not held by a placement in flight) and wakes busy cards, giving the :class:`agent.guard_draft.Draft`
the later steps change. No I/O."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.decision import Decision, PlacementOrder, QueueWait, StepContext
from agent.guard_draft import BoolArray, Draft, GuardSetup, IntArray, Notes, Sight
from twin.state import StateSnapshot

__all__ = ["check_shapes", "sanitize"]


def check_shapes(gs: GuardSetup, proposal: Decision) -> None:
    """A proposal has one level, low-power flag and power limit per card (a ValueError if not)."""
    n = gs.site.n_cards
    for name in ("card_level", "card_low_power", "card_power_limit_w"):
        if np.shape(getattr(proposal, name)) != (n,):
            raise ValueError(f"decision.{name} must have one entry per card ({n})")


def sanitize(
    gs: GuardSetup,
    proposal: Decision,
    snap: StateSnapshot,
    ctx: StepContext,
    sight: Sight,
    notes: Notes,
    in_flight: Sequence[tuple[str, Sequence[int]]] = (),
) -> Draft:
    """Step 1 (``agent.guard``'s module docstring), sanity: levels clipped to the DVFS table (an undefined
    one, NaN or infinite, is the slowest; a fractional one is rounded to the slower level), power limits
    to the card's range (an undefined one is the largest), placements kept only when valid
    (:func:`_valid_placements`; a queued job whose placement is dropped gets a ``placement_dropped`` queue
    wait), and busy cards awake."""
    site, cfg = gs.site, gs.control
    slowest = gs.model.n_levels - 1
    raw = np.asarray(proposal.card_level, dtype=np.float64)
    # the safe side: an undefined level (NaN, +-inf) is the slowest, a fractional one the slower of its two
    raw = np.clip(np.where(np.isfinite(raw), np.ceil(raw), slowest), 0, slowest)
    lvl: IntArray = raw.astype(np.int64)
    max_lim = site.card.power_limit_w
    lim = np.asarray(proposal.card_power_limit_w, dtype=np.float64)
    lim = np.clip(np.where(np.isfinite(lim), lim, max_lim), cfg.min_power_limit_w, max_lim)
    lp = np.asarray(proposal.card_low_power, dtype=bool).copy()
    # placements in flight: valid ones only (site_load), the decision's own order for a job replaces them
    own = {o.job_id for o in proposal.placements}
    flying = [(jid, tuple(int(c) for c in cards)) for jid, cards in in_flight if jid not in own]
    flying_load = ctx.load_of(site, snap, flying)
    held = [(j.job_id, tuple(int(c) for c in j.cards)) for j in flying_load.jobs if j.origin == "placing"]
    orders, dropped = _valid_placements(gs, proposal.placements, snap, ctx, sight.unplaceable_card, held)
    queue_waits = dict(proposal.queue_waits)
    if dropped:
        notes.add(
            "placements_dropped", f"placements dropped ({', '.join(dropped[:5])}): cards not free or job not queued"
        )
        queued_ids = {q.job_id for q in snap.queue}
        why = "the guard dropped its placement: cards not free, not seen or said failed by a refusal"
        placed_ids = {o.job_id for o in orders}
        queue_waits.update(
            (jid, QueueWait("placement_dropped", why)) for jid in dropped if jid in queued_ids - placed_ids
        )
    load = ctx.load_of(site, snap, [*held, *((o.job_id, o.cards) for o in orders)])
    lp[load.busy] = False
    return Draft(load, orders, queue_waits, lvl, lp, lim)


def _valid_placements(
    gs: GuardSetup,
    placements: tuple[PlacementOrder, ...],
    snap: StateSnapshot,
    ctx: StepContext,
    unplaceable_card: BoolArray,
    in_flight: Sequence[tuple[str, tuple[int, ...]]] = (),
) -> tuple[list[PlacementOrder], list[str]]:
    """Step 1 (``agent.guard``'s module docstring), placements: the orders kept (cards sorted) and the job
    ids of those dropped. An order is kept when its job is queued, not placed by an earlier order, and its
    cards are as many as the job asks, distinct, free (idle, not failed), placeable (not
    ``unplaceable_card``: seen, not said failed by a refusal, ``StepContext.unplaceable_card_mask``) and
    not taken by an earlier order nor by a placement in flight (``in_flight``, other jobs')."""
    n = gs.site.n_cards
    now_load = ctx.load_of(gs.site, snap)
    free = now_load.idle & ~unplaceable_card
    queued = {q.job_id: q.n_cards for q in snap.queue}
    taken = np.zeros(n, dtype=bool)
    for _jid, held in in_flight:
        taken[list(held)] = True
    placed: set[str] = set()  # a job is placed once: then it is no longer queued
    ok: list[PlacementOrder] = []
    dropped: list[str] = []
    for o in placements:
        cards = np.asarray(o.cards, dtype=np.int64).reshape(-1)
        good = (
            o.job_id in queued
            and cards.size == queued[o.job_id]
            and cards.size > 0
            and bool(np.all((cards >= 0) & (cards < n)))
            and np.unique(cards).size == cards.size
        )
        if good and o.job_id not in placed and bool(np.all(free[cards])) and not bool(np.any(taken[cards])):
            taken[cards] = True
            placed.add(o.job_id)
            ok.append(PlacementOrder(o.job_id, tuple(int(c) for c in np.sort(cards))))
        else:
            dropped.append(o.job_id)
    return ok, dropped
