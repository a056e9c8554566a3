"""Placing queued jobs: which go now, onto which cards, and what the agent remembers of it.

:func:`place_queued` turns the queue into placement orders (``models.placement.place_jobs``) onto
the free, healthy cards the agent sees (not on blind racks, not a card with a stuck sensor, not one a
``card_failed`` refusal says failed before a reading confirms it), with
EASY backfilling (``agent.backfill``): once a job has waited ``placement_backfill_wait_s``, it is
placed first; if it does not fit, it holds a reservation and jobs behind it are placed only where
they do not delay it. Every job left queued gets a ``QueueWait`` saying why.

:class:`PlacementBook` is what the next steps must remember: the orders in flight (sent, not yet
started, not expired; their jobs are budgeted from the step they were placed on and not placed
twice), the reservation's promised start (``twin.easy_backfill.keep_promise``) and since when each
running job has run (for the expected ends of ``agent.backfill``). An order the scheduler answers as
not applied is forgotten at once (:meth:`PlacementBook.refused`). :func:`cards_due` tells the
hosts (``agent.hosts``) how many cards queued jobs are expected to need within a host's boot.

The controller (``agent.controller.Controller``) keeps one book; the functions take what they read
as arguments.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from agent.backfill import Reservation, backfill_candidates, expected_starts_s, reservation
from agent.config import ControlConfig
from agent.decision import PlacementOrder, QueueWait, StepContext
from agent.load import SiteLoad, spec_of_info
from models.placement import QueuedJob, make_placement_problem, place_jobs
from models.problem import CycleProblem, ProblemError
from twin.easy_backfill import keep_promise
from twin.spec import SiteSpec
from twin.state import JobInfo, StateSnapshot

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["PlacementBook", "cards_due", "orders_seen_until", "place_queued", "usable_free_cards"]

#: A job id and the cards a placement order gives it.
Placed = tuple[str, tuple[int, ...]]


def orders_seen_until(ctx: StepContext, snap: StateSnapshot) -> float:
    """The site time up to which ``snap`` can show what a placement order did: its newest reading,
    not the clock's ``now`` ahead of it. An order still in its time to live at that time may yet
    show as a started job (telemetry behind the clock: a broker backlog, an accelerated simulator
    lagging; the job was placed twice at 60x when orders expired by the clock)."""
    t = float(snap.time_s)
    return min(ctx.now_s, t) if math.isfinite(t) else ctx.now_s


class PlacementBook:
    """Placement orders in flight, the reservation held and since when each running job runs.

    The dicts are rebound, never changed in place: a late solve in a worker thread may be reading
    the old ones."""

    def __init__(self) -> None:
        # job id -> (cards, order expires, order made at)
        self._pending: dict[str, tuple[tuple[int, ...], float, float]] = {}
        self.reserved: tuple[str, float] | None = None  # the blocked job and its earliest expected start
        self.running_since: dict[str, float] = {}  # when each running job was first seen running

    def placements(self) -> dict[str, tuple[int, ...]]:
        """Placements sent and not yet forgotten: job id -> cards."""
        return {k: v[0] for k, v in self._pending.items()}

    def pending_now(self, now_s: float) -> dict[str, tuple[int, ...]]:
        """Placements sent whose orders have not expired: job id -> cards."""
        return {jid: cards for jid, (cards, until, _made) in self._pending.items() if until > now_s}

    def in_flight(self, ctx: StepContext, snap: StateSnapshot) -> list[Placed]:
        """Placements sent and not yet started (their jobs still queued, their orders not expired by
        the time the snapshot shows)."""
        queued_ids = {q.job_id for q in snap.queue}
        seen = orders_seen_until(ctx, snap)
        return [(jid, c) for jid, (c, until, _made) in self._pending.items() if until > seen and jid in queued_ids]

    def pending_with(self, ctx: StepContext, snap: StateSnapshot, orders: Sequence[PlacementOrder]) -> list[Placed]:
        """Placements in flight plus ``orders``: the jobs about to run."""
        pending = self.in_flight(ctx, snap)
        placing = {jid for jid, _ in pending}
        return [*pending, *((o.job_id, o.cards) for o in orders if o.job_id not in placing)]

    def hold(self, job_id: str, res: Reservation) -> Reservation:
        """The reservation of the blocked job ``job_id`` as promised (``twin.easy_backfill.
        keep_promise``): its start is the earliest expected start computed for it, not one that slips
        each time a job ahead of it runs longer than expected."""
        res = keep_promise(self.reserved, job_id, res)
        self.reserved = (job_id, res.shadow_s)
        return res

    def commit(
        self,
        placements: Sequence[PlacementOrder],
        running: Collection[str],
        now_s: float,
        ttl_s: float,
        seen_s: float | None = None,
    ) -> None:
        """The jobs ``running`` now (a new one runs since ``now_s``) and the orders a decision sent
        (each lasts ``ttl_s``); orders whose jobs run are forgotten, and so are those expired by
        ``seen_s``, the time the step's readings show (:func:`orders_seen_until`; default ``now_s``):
        an order expired by the clock alone may yet show as a started job (forgotten by the clock, it
        was no longer in flight at the next step and its job, still queued in readings behind the
        clock, was placed a second time)."""
        self.running_since = {jid: self.running_since.get(jid, now_s) for jid in running}
        seen = now_s if seen_s is None else min(seen_s, now_s)
        # a new dict, bound at once: a late solve in a worker thread may be reading the old one
        pending = dict(self._pending)
        for o in placements:
            pending[o.job_id] = (o.cards, now_s + ttl_s, now_s)
        self._pending = {k: v for k, v in pending.items() if v[1] > seen and k not in running}

    def clock_went_back(self, now_s: float, ttl_s: float) -> None:
        """The site's clock went back to ``now_s`` (``Controller.clock_went_back``)."""
        self.running_since = {j: min(t, now_s) for j, t in self.running_since.items()}
        # a placement sent on the old timeline lasts at most its order's time to live from now
        self._pending = {j: (c, min(u, now_s + ttl_s), min(m, now_s)) for j, (c, u, m) in self._pending.items()}
        self.reserved = None  # a reservation's promised start is recomputed on the new timeline

    def refused(self, job_id: str, cards: Collection[int], issued_s: float) -> bool:
        """The scheduler answered the placement of ``job_id`` on ``cards`` ordered at ``issued_s`` (the
        issue time of its command: the time of the decision that made it) as not applied: ``rejected``
        (a card busy or failed, the job not queued, ...) or ``expired`` (it came after its expiry).
        The order is forgotten at once: its job is no longer in flight, its cards no longer held busy
        and awake for it, and the next decision may place the job again (before, they stayed held
        until the order's ``command_ttl_s`` ran out, 30 s by default, or longer while readings lagged
        the clock). Only the same order is forgotten: the same job on the same cards, made no later
        than the refused command; a newer placement of the job sent since stays. Returns whether an
        order was forgotten.

        A job placed again at once can be refused again where the agent's view is what was wrong: a
        card the scheduler sees busy or failed that the agent does not see so yet. A card is busy with
        a job whose start the scheduler published (``jobs/events``, ``jobs/state``) before it refused,
        and a failed card shows in its rack's next telemetry, so the agent's view usually catches up
        by the next decision; until it does, a placement refused again costs one command per
        decision, as it did before each time the order expired."""
        held = self._pending.get(job_id)
        if held is None or sorted(held[0]) != sorted(int(c) for c in cards) or held[2] > issued_s:
            return False
        # a new dict, bound at once: a late solve in a worker thread may be reading the old one
        self._pending = {k: v for k, v in self._pending.items() if k != job_id}
        return True


def usable_free_cards(site: SiteSpec, load: SiteLoad, ctx: StepContext) -> BoolArray:
    """Per card: free for a queued job in ``load``, seen (not on a blind rack, its sensor not stuck)
    and not said failed by a refusal no reading has confirmed (``StepContext.unplaceable_card_mask``).
    What :func:`place_queued` places on and counts free for a reservation, and :func:`cards_due`
    counts free for the hosts to keep on."""
    return load.idle & ~ctx.unplaceable_card_mask(site.card_rack())


def place_queued(
    queue: Sequence[JobInfo],
    load: SiteLoad,
    snap: StateSnapshot,
    ctx: StepContext,
    notes: list[str],
    waits: dict[str, QueueWait],
    *,
    site: SiteSpec,
    cfg: ControlConfig,
    book: PlacementBook,
    problem_of: Callable[[SiteLoad], CycleProblem],
    card_wait_s: FloatArray | None,
    method: str | None = None,
) -> list[PlacementOrder]:
    """Orders for the queued jobs that go now; ``waits`` gets why each of the others stays queued.

    ``problem_of``: the models' problem of a load (the step's, ``agent.planning.cycle_problem``);
    ``card_wait_s``: per card, how long until its host is up (None where hosts are not managed);
    ``method``: the placement method (default ``cfg.placement_method``)."""
    unseen_card = ctx.unseen_card_mask(site.card_rack())
    unplaceable = ctx.unplaceable_card_mask(site.card_rack())
    how = method if method is not None else cfg.placement_method

    def place(on: SiteLoad, jobs: Sequence[JobInfo], why: dict[str, QueueWait]) -> list[PlacementOrder]:
        return _place_jobs(on, ctx, unseen_card, unplaceable, jobs, notes, why, how, problem_of, card_wait_s)

    fits = [q for q in queue if 0 < q.n_cards <= site.n_cards]
    for q in queue:
        if q.n_cards > site.n_cards:
            waits[q.job_id] = QueueWait("too_large", f"needs {q.n_cards} cards, the site has {site.n_cards}")
        elif q.n_cards <= 0:
            waits[q.job_id] = QueueWait("no_spec", "its card count is unknown (no submitted event with its spec)")
    if not fits:
        return []
    # EASY backfilling (agent.backfill): once a job has waited placement_backfill_wait_s, it is
    # placed first; if it does not fit, it holds a reservation and jobs behind it are placed only
    # where they do not delay it
    starving = sorted(
        (q for q in fits if ctx.now_s - q.last_event_s >= cfg.placement_backfill_wait_s),
        key=lambda q: q.last_event_s,
    )
    if not starving:
        return place(load, fits, waits)
    head = starving[0]
    rest = [q for q in fits if q.job_id != head.job_id]
    orders = place(load, [head], {})
    if orders:
        book.reserved = None
        if rest:
            placing = [(j.job_id, j.cards) for j in load.jobs if j.origin == "placing"]
            after = ctx.load_of(site, snap, [*placing, *((o.job_id, o.cards) for o in orders)])
            orders += place(after, rest, waits)
        return orders
    n_free = int(usable_free_cards(site, load, ctx).sum())
    res = book.hold(head.job_id, reservation(snap, load, head.n_cards, n_free, ctx.now_s, book.running_since))
    specs = [spec_of_info(q) for q in rest]
    picked = [rest[i] for i in backfill_candidates(rest, specs, res, ctx.now_s)]
    wait_s = ctx.now_s - head.last_event_s
    if not math.isfinite(res.shadow_s):
        start = "never (too few healthy cards)"
    elif res.shadow_s > ctx.now_s:
        start = f"~{res.shadow_s - ctx.now_s:.0f} s"
    else:
        start = f"now (due {ctx.now_s - res.shadow_s:.0f} s ago: the site drains for it)"
    notes.append(f"{head.job_id} (waiting {wait_s:.0f} s) holds a reservation: expected start in {start}")
    why = f"waiting {wait_s:.0f} s; expected start in {start}"
    waits[head.job_id] = QueueWait("reservation", why, res.shadow_s)
    picked_ids = {q.job_id for q in picked}
    for q in rest:
        if q.job_id not in picked_ids:
            waits[q.job_id] = QueueWait("behind_reservation", f"would delay {head.job_id}'s reserved start")
    if not picked:
        return []
    return place(load, picked, waits)


def _place_jobs(
    load: SiteLoad,
    ctx: StepContext,
    unseen_card: BoolArray,
    unplaceable: BoolArray,
    queue: Sequence[JobInfo],
    notes: list[str],
    waits: dict[str, QueueWait],
    method: str,
    problem_of: Callable[[SiteLoad], CycleProblem],
    card_wait_s: FloatArray | None,
) -> list[PlacementOrder]:
    """``queue`` onto the free cards of ``load`` (``models.placement.place_jobs``) but those of
    ``unplaceable`` (``StepContext.unplaceable_card_mask``, of which ``unseen_card`` are also left out of
    the racks' headroom); ``waits`` gets why each job left out stays queued."""
    specs = [spec_of_info(q) for q in queue]
    if not specs:
        return []
    try:
        p0 = problem_of(load)
        # cards the agent cannot see are not offered (blind racks, stuck sensors)
        p0 = dataclasses.replace(p0, failed=p0.failed | unseen_card)
        pp = make_placement_problem(p0, [QueuedJob(s) for s in specs], ctx.setpoint_c, card_wait_s)
        # nor are those a refusal says failed before a reading confirms it (idle ones are out of the
        # problem's idle cards, their racks' headroom counting what they draw as they report:
        # agent.planning.cycle_problem; a busy one is no free card anyway)
        pp = dataclasses.replace(pp, free=pp.free & ~unplaceable)
        placement = place_jobs(pp, method=method, time_limit_s=min(1.0, ctx.solver_time_limit_s))
    except ProblemError as exc:
        notes.append(f"placement skipped: {exc}")
        waits.update((q.job_id, QueueWait("placement_error", str(exc))) for q in queue)
        return []
    orders = [
        PlacementOrder(jid, tuple(int(c) for c in np.sort(cards)))
        for jid, cards in placement.cards.items()
        if len(cards)
    ]
    if orders:
        notes.append(f"placed {', '.join(o.job_id for o in orders[:8])}" + (" ..." if len(orders) > 8 else ""))
    for jid, why in list(placement.unplaced.items())[:3]:
        notes.append(f"{jid} stays queued: {why}")
    waits.update((jid, QueueWait("no_window", why)) for jid, why in placement.unplaced.items())
    return orders


def cards_due(
    site: SiteSpec,
    snap: StateSnapshot,
    ctx: StepContext,
    book: PlacementBook,
    placements: Sequence[PlacementOrder],
    host_boot_lead_s: float,
    waits: Mapping[str, QueueWait] | None = None,
) -> int:
    """Cards of the queued jobs that neither this decision (``placements``) nor one in flight places
    and that are expected to start within a host's boot plus ``host_boot_lead_s``
    (``agent.backfill.expected_starts_s``: when their cards are expected to be free; a job holding a
    reservation at its promised start, the jobs behind it not before, but those the backfilling picked
    to start ahead of it that found no window (``waits``, the decision's ``queue_waits``: kind
    ``no_window``); the cards free now are those :func:`place_queued` may place on,
    :func:`usable_free_cards`). Their hosts are kept on or powered on; hosts waiting for a start
    further away (a big job's drain) may go off meanwhile."""
    now = ctx.now_s
    placing = {o.job_id for o in placements} | set(book.pending_now(orders_seen_until(ctx, snap)))
    queue = [q for q in snap.queue if q.job_id not in placing and 0 < q.n_cards <= site.n_cards]
    if not queue:
        return 0
    load = ctx.load_of(site, snap, book.pending_with(ctx, snap, placements))
    ids = {q.job_id for q in queue}
    held = book.reserved if book.reserved is not None and book.reserved[0] in ids else None
    n_free = int(usable_free_cards(site, load, ctx).sum())  # as place_queued: not blind or stuck cards
    ahead = {jid for jid, w in (waits or {}).items() if w.kind == "no_window"}
    starts = expected_starts_s(snap, load, queue, n_free, now, book.running_since, held, ahead)
    horizon = now + site.rack.host_boot_s + host_boot_lead_s
    return sum(q.n_cards for q, start in zip(queue, starts, strict=True) if start <= horizon)
