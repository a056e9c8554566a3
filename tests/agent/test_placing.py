"""Placing queued jobs (``agent.placing``): which go now and onto which free cards the agent sees
(with the real HiGHS), EASY backfilling once a job has waited long enough (placed first, or holding a
reservation that jobs behind it may not delay), why each job left queued waits, the orders in flight
the next steps remember (:class:`PlacementBook`) and the cards of the jobs due to start soon
(:func:`cards_due`)."""

from __future__ import annotations

import dataclasses
import math
from functools import cache
from typing import Any

import numpy as np
import pytest
from agent_helpers import belief, job, small_site
from guard_helpers import step_context

from agent.backfill import Reservation, reservation
from agent.config import ControlConfig
from agent.decision import PlacementOrder, QueueWait, StepContext
from agent.load import SiteLoad, site_load
from agent.placing import PlacementBook, cards_due, orders_seen_until, place_queued, usable_free_cards
from agent.planning import cycle_problem
from models.problem import CycleProblem, Margins, Prices, ProblemError
from twin.readings import JobEvent
from twin.state import JobInfo, StateSnapshot
from twin.workload import Phase

pytestmark = pytest.mark.agent

SITE = small_site()  # 2 racks of 16 cards
N = SITE.n_cards


@cache
def site_with_queue() -> StateSnapshot:
    """At t = 90 s: "run" (24 cards, ~3,000 s of work) running, 8 cards free; queued in this order
    "big" (28 cards, submitted at 50 s), "small" (4, at 60 s), "mid" (6, at 65 s), "huge" (64, at 70 s)."""
    _plant, state = belief(SITE, [job("run", 24, work_steps=3000.0)], 90)
    queued = [
        job("big", 28, submit_s=50.0),
        job("small", 4, submit_s=60.0),
        job("mid", 6, submit_s=65.0),
        job("huge", 64, submit_s=70.0),
    ]
    state.apply_events([JobEvent(q.submit_time_s, q.job_id, "submitted", Phase.WAITING, job=q) for q in queued])
    snap = state.snapshot()
    assert [q.job_id for q in snap.queue] == ["big", "small", "mid", "huge"]
    return snap


def queued(snap: StateSnapshot, *ids: str) -> list[JobInfo]:
    by_id = {q.job_id: q for q in snap.queue}
    return [by_id[i] for i in ids]


def place(
    queue: list[JobInfo],
    *,
    snap: StateSnapshot | None = None,
    ctx: StepContext | None = None,
    cfg: ControlConfig | None = None,
    book: PlacementBook | None = None,
    load: SiteLoad | None = None,
    **kw: Any,
) -> tuple[list[PlacementOrder], dict[str, QueueWait], list[str]]:
    snap = snap if snap is not None else site_with_queue()
    ctx = ctx if ctx is not None else step_context(SITE)
    cfg = cfg if cfg is not None else ControlConfig()
    load = load if load is not None else site_load(SITE, snap)
    notes: list[str] = []
    waits: dict[str, QueueWait] = {}

    def problem_of(on: SiteLoad) -> CycleProblem:
        return cycle_problem(SITE, cfg, on, snap, ctx, margins=Margins(), prices=Prices())

    args: dict[str, Any] = dict(
        site=SITE, cfg=cfg, book=book or PlacementBook(), problem_of=problem_of, card_wait_s=None
    )
    args.update(kw)
    orders = place_queued(queue, load, snap, ctx, notes, waits, **args)
    return orders, waits, notes


def free_cards(snap: StateSnapshot) -> set[int]:
    return {int(c) for c in np.flatnonzero(site_load(SITE, snap).idle)}


# ---- place_queued -------------------------------------------------------------------------------


def test_jobs_that_fit_go_onto_free_cards_and_each_other_job_says_why_it_waits() -> None:
    snap = site_with_queue()
    assert len(free_cards(snap)) == 8
    unknown = dataclasses.replace(queued(snap, "small")[0], job_id="nospec", n_cards=0, spec=None)
    orders, waits, notes = place([*queued(snap, "big", "small", "huge"), unknown])
    assert [o.job_id for o in orders] == ["small"]
    assert len(orders[0].cards) == 4 and set(orders[0].cards) <= free_cards(snap)
    assert list(orders[0].cards) == sorted(orders[0].cards)
    assert {jid: w.kind for jid, w in waits.items()} == {"big": "no_window", "huge": "too_large", "nospec": "no_spec"}
    assert waits["huge"].why == "needs 64 cards, the site has 32"
    assert "placed small" in notes


def test_a_queue_of_jobs_that_can_never_run_places_nothing_and_asks_no_problem() -> None:
    snap = site_with_queue()

    def no_problem(on: SiteLoad) -> CycleProblem:
        raise AssertionError("no problem is needed")

    orders, waits, _notes = place(queued(snap, "huge"), problem_of=no_problem)
    assert orders == [] and list(waits) == ["huge"]
    assert place([])[0] == []


def test_cards_the_agent_cannot_see_are_not_offered() -> None:
    snap = site_with_queue()
    free = sorted(free_cards(snap))
    rack_of = SITE.card_rack()
    blind = int(rack_of[free[0]])  # the free cards' rack blind: nothing for "small"
    assert all(rack_of[c] == blind for c in free)
    orders, waits, _ = place(queued(snap, "small"), ctx=step_context(SITE, blind_racks=(blind,)))
    assert orders == [] and waits["small"].kind == "no_window"
    # 5 of the 8 free cards' sensors stuck: 3 left, too few for "small"
    orders, waits, _ = place(queued(snap, "small"), ctx=step_context(SITE, stuck_cards=tuple(free[:5])))
    assert orders == [] and waits["small"].kind == "no_window"
    # 4 stuck: "small" gets the other 4
    orders, _, _ = place(queued(snap, "small"), ctx=step_context(SITE, stuck_cards=tuple(free[:4])))
    assert [o.cards for o in orders] == [tuple(free[4:])]


def test_cards_the_agent_cannot_see_are_not_offered_whatever_the_models_problem_says() -> None:
    snap = site_with_queue()
    free = sorted(free_cards(snap))
    cfg = ControlConfig()

    def seeing_all(on: SiteLoad) -> CycleProblem:  # a problem made from a context that sees every card
        return cycle_problem(SITE, cfg, on, snap, step_context(SITE), margins=Margins(), prices=Prices())

    orders, waits, _ = place(
        queued(snap, "small"), ctx=step_context(SITE, stuck_cards=tuple(free[:5])), problem_of=seeing_all
    )
    assert orders == [] and waits["small"].kind == "no_window"


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_cards_a_refusal_says_failed_are_not_placed_on_nor_counted_free(method: str) -> None:
    """``StepContext.refused_failed_cards`` (a ``card_failed`` refusal no reading confirmed): as stuck
    cards, kept out of placement by either method and of the free cards a reservation and the hosts
    count (``usable_free_cards``), though the cards read alive and idle."""
    snap = site_with_queue()
    free = sorted(free_cards(snap))
    ctx = step_context(SITE, refused_failed_cards=tuple(free[:5]))  # 3 left: too few for "small"
    orders, waits, _ = place(queued(snap, "small"), ctx=ctx, method=method)
    assert orders == [] and waits["small"].kind == "no_window"
    ctx = step_context(SITE, refused_failed_cards=tuple(free[:4]))  # "small" gets the other 4
    orders, _, _ = place(queued(snap, "small"), ctx=ctx, method=method)
    assert [o.cards for o in orders] == [tuple(free[4:])]
    assert int(usable_free_cards(SITE, site_load(SITE, snap), ctx).sum()) == 4


def test_a_job_needing_every_card_of_the_site_is_not_too_large() -> None:
    snap = site_with_queue()
    whole = dataclasses.replace(queued(snap, "big")[0], job_id="whole", n_cards=N, spec=None)
    orders, waits, _ = place([whole])
    assert orders == [] and waits["whole"].kind == "no_window"


def test_a_job_needing_every_card_of_an_idle_site_is_placed_on_all_of_them_and_waits_for_nothing() -> None:
    _plant, state = belief(SITE, [], 5)
    whole = job("whole", N, submit_s=2.0)
    state.apply_events([JobEvent(2.0, "whole", "submitted", Phase.WAITING, job=whole)])
    snap = state.snapshot()
    orders, waits, _ = place(list(snap.queue), snap=snap)
    assert [(o.job_id, o.cards) for o in orders] == [("whole", tuple(range(N)))]
    assert waits == {}


def test_stuck_free_cards_are_not_counted_free_for_a_reservation() -> None:
    snap = site_with_queue()
    free = sorted(free_cards(snap))
    cfg = ControlConfig(placement_backfill_wait_s=45.0)
    ctx = step_context(SITE, stuck_cards=tuple(free[:4]))
    # 4 free cards seen: when "run" ends, 28 cards for "big" and none spare, so "small" would delay it
    orders, waits, _ = place(queued(snap, "big", "small"), ctx=ctx, cfg=cfg)
    assert waits["big"].kind == "reservation"
    assert orders == [] and waits["small"].kind == "behind_reservation"


def test_a_placement_problem_that_cannot_be_made_leaves_every_job_queued_with_the_reason() -> None:
    def broken(on: SiteLoad) -> CycleProblem:
        raise ProblemError("the site's spec is inconsistent")

    snap = site_with_queue()
    orders, waits, notes = place(queued(snap, "small", "mid"), problem_of=broken)
    assert orders == []
    assert waits == {
        "small": QueueWait("placement_error", "the site's spec is inconsistent"),
        "mid": QueueWait("placement_error", "the site's spec is inconsistent"),
    }
    assert notes == ["placement skipped: the site's spec is inconsistent"]


@pytest.mark.parametrize("wait_s", [45.0, 30.0])
def test_a_job_that_waited_long_enough_and_does_not_fit_holds_a_reservation_others_may_not_delay(
    wait_s: float,
) -> None:
    """At t = 100 s "big" has waited 50 s, "small" 40 s, "mid" 35 s: with 45 s only "big" waited long
    enough, with 30 s all three did and the one that waited longest holds the reservation."""
    snap = site_with_queue()
    cfg = ControlConfig(placement_backfill_wait_s=wait_s)
    book = PlacementBook()
    orders, waits, notes = place(queued(snap, "big", "small", "mid"), cfg=cfg, book=book)
    load = site_load(SITE, snap)
    expected = reservation(snap, load, 28, 8, 100.0, {})
    assert 2500.0 < expected.shadow_s < 4000.0  # when "run" is expected to end
    assert expected.spare_cards == 4  # 32 cards then, 28 for "big"
    assert book.reserved == ("big", expected.shadow_s)
    assert waits["big"] == QueueWait(
        "reservation",
        f"waiting 50 s; expected start in ~{expected.shadow_s - 100.0:.0f} s",
        expected.shadow_s,
    )
    # "small" (its ~1e7 s of work runs past the reservation) takes the 4 spare cards; "mid" would delay "big"
    assert [o.job_id for o in orders] == ["small"]
    assert waits["mid"] == QueueWait("behind_reservation", "would delay big's reserved start")
    assert "small" not in waits
    assert f"big (waiting 50 s) holds a reservation: expected start in ~{expected.shadow_s - 100.0:.0f} s" in notes


def test_a_job_that_waited_exactly_the_backfill_wait_holds_a_reservation() -> None:
    """At t = 100 s "big" (submitted at 50 s) has waited exactly placement_backfill_wait_s (50 s):
    it holds a reservation and "mid" (6 cards, its long work past it; 4 spare) may not delay it."""
    snap = site_with_queue()
    orders, waits, _ = place(queued(snap, "big", "mid"), cfg=ControlConfig(placement_backfill_wait_s=50.0))
    assert waits["big"].kind == "reservation"
    assert orders == [] and waits["mid"].kind == "behind_reservation"
    # a second longer to wait: nobody waited long enough, "mid" fits and goes
    orders, waits, _ = place(queued(snap, "big", "mid"), cfg=ControlConfig(placement_backfill_wait_s=51.0))
    assert [o.job_id for o in orders] == ["mid"] and waits["big"].kind == "no_window"


def test_a_reservation_keeps_its_promised_start_when_the_running_jobs_run_late() -> None:
    snap = site_with_queue()
    cfg = ControlConfig(placement_backfill_wait_s=45.0)
    book = PlacementBook()
    book.reserved = ("big", 1000.0)  # promised earlier than the running job now ends
    orders, waits, _notes = place(queued(snap, "big", "small"), cfg=cfg, book=book)
    assert book.reserved == ("big", 1000.0)
    assert waits["big"].expected_start_s == 1000.0
    # no spare cards at a promise already short of them: "small" would delay "big"
    assert orders == [] and waits["small"].kind == "behind_reservation"
    # a promise that has passed: the site drains for it
    book.reserved = ("big", 40.0)
    _orders, waits, _notes = place(queued(snap, "big", "small"), cfg=cfg, book=book)
    assert waits["big"].why == "waiting 50 s; expected start in now (due 60 s ago: the site drains for it)"
    # a job that never fits holds nothing (it needs more healthy cards than there are)
    failed = np.zeros(N, dtype=bool)
    failed[sorted(free_cards(snap))[:5]] = True  # 27 healthy cards left
    sick = dataclasses.replace(snap, card_failed=failed)
    book = PlacementBook()
    _orders, waits, _ = place(queued(sick, "big"), snap=sick, cfg=cfg, book=book)
    assert waits["big"].kind == "reservation" and math.isinf(waits["big"].expected_start_s)
    assert waits["big"].why == "waiting 50 s; expected start in never (too few healthy cards)"


def test_a_job_with_enough_free_cards_on_hosts_that_are_off_holds_a_reservation_due_now() -> None:
    """5 of the 8 free cards are on hosts that are off (the placement does not offer them): "small"
    (4 cards, waited 40 s) is not placed; its cards are free, so its reservation is due now (the hosts
    are booted for it, :func:`cards_due`) with the 4 others spare, which "mid" (6 cards) would exceed."""
    snap = site_with_queue()
    free = sorted(free_cards(snap))
    host_off = np.zeros(N, dtype=bool)
    host_off[free[:5]] = True
    off = dataclasses.replace(snap, card_host_off=host_off)
    cfg = ControlConfig(placement_backfill_wait_s=38.0)
    book = PlacementBook()
    orders, waits, _ = place(queued(off, "small", "mid"), snap=off, cfg=cfg, book=book)
    assert orders == []
    assert waits["small"] == QueueWait(
        "reservation", "waiting 40 s; expected start in now (due 0 s ago: the site drains for it)", 100.0
    )
    assert book.reserved == ("small", 100.0)
    assert waits["mid"].kind == "behind_reservation"
    # each job's start as if first in line, none before the reservation (due now): both are due
    assert cards_due(SITE, off, step_context(SITE), book, [], 0.0) == 4 + 6


def test_a_promise_to_a_job_that_can_no_longer_fit_holds_no_card_back() -> None:
    """The job "big" (28 cards) was promised a start at 1,000 s; then 5 of the running job's cards failed: 27
    healthy cards are left and "big" can never fit. It reserves nothing (the promise cannot be kept),
    so "small" (4 cards, running long past 1,000 s) goes onto 4 of the 8 free cards. Was: the promise
    stood with no card spare, and once due the site drained for a job that could not start (every
    other job behind it, its hosts kept on)."""
    snap = site_with_queue()
    failed = np.zeros(N, dtype=bool)
    failed[:5] = True  # cards of "run" (on cards 0-23)
    assert not (failed & site_load(SITE, snap).idle).any()
    sick = dataclasses.replace(snap, card_failed=failed)
    cfg = ControlConfig(placement_backfill_wait_s=45.0)
    book = PlacementBook()
    book.reserved = ("big", 1000.0)
    orders, waits, _ = place(queued(sick, "big", "small"), snap=sick, cfg=cfg, book=book)
    assert waits["big"].kind == "reservation" and math.isinf(waits["big"].expected_start_s)
    assert waits["big"].why == "waiting 50 s; expected start in never (too few healthy cards)"
    assert [o.job_id for o in orders] == ["small"] and "small" not in waits
    # nor is it due to start: no host is kept on for it
    assert cards_due(SITE, sick, step_context(SITE), book, orders, 1e6) == 0


def test_a_job_that_waited_long_enough_and_fits_goes_first_and_the_others_get_the_cards_left() -> None:
    snap = site_with_queue()
    # without waiting long: "mid" (first in the queue given) takes 6 of the 8 free cards, "small" waits
    orders, waits, _ = place(queued(snap, "mid", "small"))
    assert [o.job_id for o in orders] == ["mid"] and waits["small"].kind == "no_window"
    cfg = ControlConfig(placement_backfill_wait_s=38.0)  # "small" (60 s) waited 40 s, "mid" (65 s) 35 s
    book = PlacementBook()
    book.reserved = ("gone", 500.0)
    orders, waits, _ = place(queued(snap, "mid", "small"), cfg=cfg, book=book)
    assert [o.job_id for o in orders] == ["small"]  # the one that waited long enough first
    assert book.reserved is None
    assert waits["mid"].kind == "no_window"  # 4 cards left, "mid" needs 6


def test_jobs_placed_after_the_head_do_not_share_its_cards() -> None:
    snap = site_with_queue()
    cfg = ControlConfig(placement_backfill_wait_s=38.0)
    small = queued(snap, "small")[0]
    assert small.spec is not None
    other = dataclasses.replace(
        small, job_id="small2", last_event_s=99.0, spec=dataclasses.replace(small.spec, job_id="small2")
    )
    snap2 = dataclasses.replace(snap, queue=(*snap.queue, other))
    orders, waits, _ = place([*queued(snap2, "small"), other], snap=snap2, cfg=cfg)
    assert [o.job_id for o in orders] == ["small", "small2"]
    assert set(orders[0].cards).isdisjoint(orders[1].cards)
    assert set(orders[0].cards) | set(orders[1].cards) == free_cards(snap)
    assert waits == {}


def test_jobs_placed_after_the_head_do_not_take_the_cards_of_orders_in_flight() -> None:
    """The order of "small" (sent earlier, not yet started) holds 4 of the 8 free cards; "a" (waited
    40 s, past the 38 s) takes the other 4, and "b" finds no card left (not "small"'s)."""
    snap = site_with_queue()
    small = queued(snap, "small")[0]
    assert small.spec is not None

    def like_small(job_id: str, last_event_s: float) -> JobInfo:
        assert small.spec is not None
        spec = dataclasses.replace(small.spec, job_id=job_id)
        return dataclasses.replace(small, job_id=job_id, last_event_s=last_event_s, spec=spec)

    a, b = like_small("a", 60.0), like_small("b", 99.0)
    snap2 = dataclasses.replace(snap, queue=(*snap.queue, a, b))
    in_flight = (24, 25, 26, 27)
    load = site_load(SITE, snap2, [("small", in_flight)])
    orders, waits, _ = place([a, b], snap=snap2, load=load, cfg=ControlConfig(placement_backfill_wait_s=38.0))
    assert [(o.job_id, o.cards) for o in orders] == [("a", (28, 29, 30, 31))]
    assert waits["b"].kind == "no_window"


# ---- PlacementBook ------------------------------------------------------------------------------


def test_the_book_remembers_orders_until_their_jobs_run_or_the_orders_expire() -> None:
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running={"run"}, now_s=100.0, ttl_s=30.0)
    assert book.placements() == {"small": (24, 25, 26, 27)}
    assert book.running_since == {"run": 100.0}
    assert book.pending_now(129.9) == {"small": (24, 25, 26, 27)}
    assert book.pending_now(130.0) == {}  # expired at 100 + 30 s
    book.commit([PlacementOrder("mid", (28, 29))], running={"run"}, now_s=110.0, ttl_s=30.0)
    assert set(book.placements()) == {"small", "mid"}
    assert book.running_since == {"run": 100.0}  # since when it was first seen running
    book.commit([], running={"run", "small"}, now_s=120.0, ttl_s=30.0)  # "small" started
    assert set(book.placements()) == {"mid"}
    assert book.running_since == {"run": 100.0, "small": 120.0}
    book.commit([], running={"small"}, now_s=140.0, ttl_s=30.0)  # "run" ended, "mid"'s order expired
    assert book.placements() == {}
    assert book.running_since == {"small": 120.0}


def test_orders_in_flight_are_those_of_queued_jobs_not_expired_by_the_time_the_snapshot_shows() -> None:
    snap = site_with_queue()  # readings of t = 90 s
    book = PlacementBook()
    book.commit(
        [PlacementOrder("small", (24, 25, 26, 27)), PlacementOrder("gone", (28,))], running=(), now_s=80.0, ttl_s=30.0
    )
    # "gone" is no longer queued; "small"'s order expired by the clock (t = 200 s) but not by the
    # readings (90 s): it may yet show as started
    ctx = step_context(SITE, now_s=200.0)
    assert orders_seen_until(ctx, snap) == 90.0
    assert book.in_flight(ctx, snap) == [("small", (24, 25, 26, 27))]
    later = dataclasses.replace(snap, time_s=110.0)
    assert book.in_flight(ctx, later) == []
    assert orders_seen_until(ctx, dataclasses.replace(snap, time_s=float("nan"))) == 200.0
    # no reading yet (the belief's time is -inf): the clock's now, not a time before every order
    assert orders_seen_until(ctx, dataclasses.replace(snap, time_s=-math.inf)) == 200.0
    assert orders_seen_until(step_context(SITE, now_s=50.0), snap) == 50.0
    # in flight plus this decision's orders, each job once
    orders = [PlacementOrder("small", (28, 29, 30, 31)), PlacementOrder("mid", (16, 17, 18, 19, 20, 21))]
    assert book.pending_with(ctx, snap, orders) == [("small", (24, 25, 26, 27)), ("mid", (16, 17, 18, 19, 20, 21))]


def test_an_order_is_forgotten_only_once_the_readings_show_its_time_is_over() -> None:
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running=(), now_s=100.0, ttl_s=30.0)
    # the clock at 140 s, the readings at 115 s: the order (until 130 s) may yet show as started
    book.commit([], running=(), now_s=140.0, ttl_s=30.0, seen_s=115.0)
    assert book.placements() == {"small": (24, 25, 26, 27)}
    book.commit([], running=(), now_s=145.0, ttl_s=30.0, seen_s=130.0)
    assert book.placements() == {}
    # readings ahead of the clock count as the clock
    book.commit([PlacementOrder("mid", (26, 27, 28, 29, 30, 31))], running=(), now_s=200.0, ttl_s=30.0)
    book.commit([], running=(), now_s=229.0, ttl_s=30.0, seen_s=250.0)
    assert book.placements() == {"mid": (26, 27, 28, 29, 30, 31)}
    book.commit([], running=(), now_s=230.0, ttl_s=30.0, seen_s=250.0)
    assert book.placements() == {}


def test_holding_a_reservation_keeps_the_earliest_start_promised_to_the_same_job() -> None:
    book = PlacementBook()
    assert book.hold("big", Reservation(3000.0, 4.0)) == Reservation(3000.0, 4.0)
    assert book.reserved == ("big", 3000.0)
    assert book.hold("big", Reservation(3500.0, 4.0)) == Reservation(3000.0, 0.0)  # the promise stands
    assert book.hold("big", Reservation(2000.0, 4.0)) == Reservation(2000.0, 4.0)  # an earlier start is taken
    assert book.reserved == ("big", 2000.0)
    assert book.hold("other", Reservation(5000.0, 2.0)) == Reservation(5000.0, 2.0)  # another job: no promise
    assert book.reserved == ("other", 5000.0)


def test_when_the_clock_goes_back_orders_last_a_ttl_from_now_and_the_reservation_is_recomputed() -> None:
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running={"run"}, now_s=1000.0, ttl_s=30.0)
    book.reserved = ("big", 4000.0)
    book.clock_went_back(200.0, 30.0)
    assert book.running_since == {"run": 200.0}
    assert book.pending_now(229.0) == {"small": (24, 25, 26, 27)}
    assert book.pending_now(230.0) == {}
    assert book.reserved is None


# ---- cards_due ----------------------------------------------------------------------------------


def test_the_cards_due_are_those_of_waiting_jobs_expected_to_start_within_a_boot_and_its_lead() -> None:
    snap = site_with_queue()
    assert SITE.rack.host_boot_s == 0.0
    ctx = step_context(SITE)
    book = PlacementBook()
    # "small" and "mid" fit now, "big" waits for "run"'s end (~3,000 s), "huge" never fits
    assert cards_due(SITE, snap, ctx, book, [], 60.0) == 4 + 6
    assert cards_due(SITE, snap, ctx, book, [], 5000.0) == 4 + 6 + 28
    # the horizon is a host's boot plus the lead: with a 5,000 s boot, "big" is due without a lead
    slow_boot = dataclasses.replace(SITE, rack=dataclasses.replace(SITE.rack, host_boot_s=5000.0))
    assert cards_due(slow_boot, snap, ctx, book, [], 0.0) == 4 + 6 + 28
    # a job this decision places, or one whose order is in flight, is not waiting, and its cards are
    # not free: "small" on 4 of the 8 free cards leaves "mid" (6) to wait for "run"'s end
    placing = [PlacementOrder("small", (24, 25, 26, 27))]
    assert cards_due(SITE, snap, ctx, book, placing, 60.0) == 0
    assert cards_due(SITE, snap, ctx, book, placing, 5000.0) == 6 + 28
    book.commit([PlacementOrder("mid", (26, 27, 28, 29, 30, 31))], running=(), now_s=95.0, ttl_s=30.0)
    assert cards_due(SITE, snap, ctx, book, [], 60.0) == 0  # 2 cards left for "small"
    # "big" would need "mid"'s cards too (only 26 are free once "run" ends): not due within 5,000 s
    assert cards_due(SITE, snap, ctx, book, [], 5000.0) == 4
    # its order expires at 125 s: by the clock alone, with readings of 90 s, it may yet show as started
    assert cards_due(SITE, snap, step_context(SITE, now_s=130.0), book, [], 60.0) == 0
    seen = dataclasses.replace(snap, time_s=130.0)
    assert cards_due(SITE, seen, step_context(SITE, now_s=130.0), book, [], 60.0) == 4 + 6
    # nor is "mid" itself due (it would be once "run" ends): it is still being placed
    assert cards_due(SITE, snap, step_context(SITE, now_s=130.0), book, [], 5000.0) == 4
    # a job holding a reservation starts at its promise, and the jobs behind it not before
    book = PlacementBook()
    book.reserved = ("big", 130.0)
    assert cards_due(SITE, snap, ctx, book, [], 20.0) == 0
    assert cards_due(SITE, snap, ctx, book, [], 30.0) == 28 + 4 + 6
    # a job the backfilling picked to start ahead that found no window starts as if first in line
    # ("small" fits the 8 free cards now); one waiting behind the reservation does not
    picked = {"small": QueueWait("no_window", "no window of consecutive racks")}
    assert cards_due(SITE, snap, ctx, book, [], 20.0, picked) == 4
    behind = {"small": QueueWait("behind_reservation", "behind big")}
    assert cards_due(SITE, snap, ctx, book, [], 20.0, behind) == 0
    book.reserved = ("gone", 130.0)  # a reservation of a job no longer queued holds nothing back
    assert cards_due(SITE, snap, ctx, book, [], 20.0) == 4 + 6


def test_a_job_needing_every_card_of_an_idle_site_is_due_at_once() -> None:
    _plant, state = belief(SITE, [], 5)
    state.apply_events([JobEvent(2.0, "whole", "submitted", Phase.WAITING, job=job("whole", N, submit_s=2.0))])
    assert cards_due(SITE, state.snapshot(), step_context(SITE), PlacementBook(), [], 60.0) == N


def test_the_cards_due_count_free_only_the_cards_the_placement_may_use() -> None:
    """Free cards the agent cannot see (a blind rack, stuck sensors) are never placed on: no job is
    due to start on them, and no host is kept on for them. ``cards_due`` counted them free (the 8
    free cards: "small" and "mid" due now, 10 cards) while ``place_queued`` placed nothing."""
    snap = site_with_queue()
    free = sorted(free_cards(snap))
    blind = int(SITE.card_rack()[free[0]])
    book = PlacementBook()
    for ctx in (step_context(SITE, blind_racks=(blind,)), step_context(SITE, stuck_cards=tuple(free[:5]))):
        orders, waits, _ = place(queued(snap, "small", "mid"), ctx=ctx)
        assert orders == [] and waits["small"].kind == "no_window"
        assert cards_due(SITE, snap, ctx, book, [], 60.0) == 0
        # once "run" ends: "small" and "mid" on its cards, not "big" (28 cards: the unseen ones too)
        assert cards_due(SITE, snap, ctx, book, [], 5000.0) == 4 + 6
    # 4 free cards seen: "small" is placed on them, and is the one due
    ctx = step_context(SITE, stuck_cards=tuple(free[:4]))
    orders, _, _ = place(queued(snap, "small", "mid"), ctx=ctx)
    assert [(o.job_id, o.cards) for o in orders] == [("small", tuple(free[4:]))]
    assert cards_due(SITE, snap, ctx, book, [], 60.0) == 4


def test_a_refused_order_is_forgotten_at_once_and_its_cards_are_free_again() -> None:
    """The scheduler refused the order of "small" on 4 of the 8 free cards (t = 90 s): "small" is no
    longer in flight (the next decision may place it again) and its cards count free, not 30 s later."""
    snap = site_with_queue()
    ctx = step_context(SITE, now_s=95.0)
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running={"run"}, now_s=90.0, ttl_s=30.0)
    assert book.in_flight(ctx, snap) == [("small", (24, 25, 26, 27))]
    assert not site_load(SITE, snap, book.in_flight(ctx, snap)).idle[24:28].any()
    assert book.refused("small", (27, 26, 25, 24), issued_s=90.0)  # cards in any order
    assert book.in_flight(ctx, snap) == []
    assert book.placements() == {}
    assert book.pending_with(ctx, snap, []) == []
    assert site_load(SITE, snap, book.in_flight(ctx, snap)).idle[24:32].all()  # all 8 free cards
    # nor does it hold the hosts' count of cards due: "small" (4) and "mid" (6) wait to be placed
    assert cards_due(SITE, snap, ctx, book, [], 60.0) == 4 + 6
    assert not book.refused("small", (24, 25, 26, 27), issued_s=90.0)  # a second answer: nothing left


def test_a_refusal_of_an_older_order_leaves_a_newer_order_of_the_job() -> None:
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running=(), now_s=90.0, ttl_s=30.0)
    book.commit([], running=(), now_s=125.0, ttl_s=30.0)  # its order expired (readings of 125 s)
    book.commit([PlacementOrder("small", (28, 29, 30, 31))], running=(), now_s=125.0, ttl_s=30.0)
    assert not book.refused("small", (24, 25, 26, 27), issued_s=90.0)  # the old cards: not this order
    book.commit([], running=(), now_s=160.0, ttl_s=30.0)
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running=(), now_s=160.0, ttl_s=30.0)
    assert not book.refused("small", (24, 25, 26, 27), issued_s=90.0)  # the same cards, ordered since
    assert not book.refused("mid", (24, 25, 26, 27), issued_s=160.0)  # another job
    assert book.placements() == {"small": (24, 25, 26, 27)}
    assert book.refused("small", (24, 25, 26, 27), issued_s=160.0)
    assert book.placements() == {}


def test_an_order_sent_before_the_clock_went_back_is_forgotten_when_refused() -> None:
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running=(), now_s=1000.0, ttl_s=30.0)
    book.clock_went_back(200.0, 30.0)
    assert book.refused("small", (24, 25, 26, 27), issued_s=1000.0)  # its command, stamped on the old timeline
    assert book.placements() == {}


def test_a_late_refusal_from_before_the_clock_went_back_leaves_the_jobs_order_on_other_cards() -> None:
    """After the clock went back, an order's time on the old timeline no longer tells it from a newer
    one: only its cards do. "small", ordered onto 24-27 at 1,000 s on the old timeline, is placed again
    onto 28-31 at 235 s on the new one; the old command's refusal (issued at 1,000 s) then comes: the
    new order stays in flight (forgotten, the job would be placed a third time while its order runs)."""
    book = PlacementBook()
    book.commit([PlacementOrder("small", (24, 25, 26, 27))], running=(), now_s=1000.0, ttl_s=30.0)
    book.clock_went_back(200.0, 30.0)
    book.commit([], running=(), now_s=235.0, ttl_s=30.0)  # its order expired on the new timeline
    book.commit([PlacementOrder("small", (28, 29, 30, 31))], running=(), now_s=235.0, ttl_s=30.0)
    assert not book.refused("small", (24, 25, 26, 27), issued_s=1000.0)
    assert book.placements() == {"small": (28, 29, 30, 31)}


def test_forgetting_a_refused_order_leaves_the_dicts_a_late_solve_reads_as_they_were() -> None:
    book = PlacementBook()
    book.commit(
        [PlacementOrder("small", (24, 25, 26, 27)), PlacementOrder("mid", (16, 17, 18, 19, 20, 21))],
        running=(),
        now_s=90.0,
        ttl_s=30.0,
    )
    before = book._pending
    assert book.refused("small", (24, 25, 26, 27), issued_s=90.0)
    assert set(before) == {"small", "mid"}  # the dict a solve in a worker thread may hold is unchanged
    assert set(book.placements()) == {"mid"}
