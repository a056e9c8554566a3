"""EASY backfilling's rule (twin.easy_backfill), which the plant's scheduler and the agent's placement
share: when a blocked job can start, which jobs may start ahead of it, and that its reservation is a
promise that does not slip."""

from __future__ import annotations

import math

import pytest

from twin.easy_backfill import Reservation, keep_promise, reservation_from_ends, spare_after_backfill

pytestmark = pytest.mark.unit

# three running jobs, by expected end: 8 cards at 100 s, 16 at 250 s, 32 at 900 s
ENDS = [(100.0, 8), (250.0, 16), (900.0, 32)]


def test_a_blocked_job_starts_when_enough_cards_are_released_with_the_rest_spare() -> None:
    # 4 free now: 20 cards are free once the first two jobs ended (4 + 8 + 16 = 28, 8 spare)
    assert reservation_from_ends(ENDS, 20, 4, 10.0) == Reservation(250.0, 8.0)
    # exactly enough at the first release: nothing spare
    assert reservation_from_ends(ENDS, 12, 4, 10.0) == Reservation(100.0, 0.0)
    # enough free now: it starts now
    assert reservation_from_ends(ENDS, 3, 4, 10.0) == Reservation(10.0, 1.0)
    # more cards than will ever be free: no reservation, so nothing behind it is held back
    never = reservation_from_ends(ENDS, 61, 4, 10.0)
    assert never.shadow_s == math.inf and never.spare_cards == math.inf
    assert spare_after_backfill(1.0e9, 60, never, never.spare_cards) == math.inf


def test_jobs_start_ahead_only_if_they_end_before_the_reservation_or_fit_in_its_spare_cards() -> None:
    res = Reservation(250.0, 8.0)
    # ends before the reserved start: any size, the spare cards stay
    assert spare_after_backfill(240.0, 32, res, 8.0) == 8.0
    assert spare_after_backfill(250.0 + 1e-9, 32, res, 8.0) == 8.0  # float noise counts as before
    # ends after it: only within the spare cards, which it then uses up
    assert spare_after_backfill(251.0, 6, res, 8.0) == 2.0
    assert spare_after_backfill(251.0, 8, res, 8.0) == 0.0
    assert spare_after_backfill(251.0, 9, res, 8.0) is None
    # the spare cards are shared in turn: after a 6-card job, a 4-card one no longer fits
    assert spare_after_backfill(400.0, 4, res, 2.0) is None


def test_a_reservation_is_a_promise_that_does_not_slip_when_running_jobs_overrun() -> None:
    promised = ("big", 250.0)
    # recomputed later (the jobs ahead overran): the promise stands and no card is spare
    assert keep_promise(promised, "big", Reservation(400.0, 12.0)) == Reservation(250.0, 0.0)
    # recomputed earlier (jobs ended early): the earlier start is taken
    assert keep_promise(promised, "big", Reservation(200.0, 12.0)) == Reservation(200.0, 12.0)
    # another job's reservation, or none promised yet: as computed
    assert keep_promise(promised, "other", Reservation(400.0, 12.0)) == Reservation(400.0, 12.0)
    assert keep_promise(None, "big", Reservation(400.0, 12.0)) == Reservation(400.0, 12.0)


def test_a_job_that_can_no_longer_fit_keeps_no_promise_and_reserves_nothing() -> None:
    """Cards failed since "big" was promised 250 s: too few healthy ones are left for it. Its
    reservation holds no card back (every job may start ahead of it), as for a job that never fit."""
    never = Reservation(math.inf, math.inf)
    assert keep_promise(("big", 250.0), "big", never) == never
    assert spare_after_backfill(1e9, 64, keep_promise(("big", 250.0), "big", never), math.inf) == math.inf
    # a start put off to no expected end (the cards it needs are held by a job with no known end)
    # still lacks the cards: the promise stands
    assert keep_promise(("big", 250.0), "big", Reservation(math.inf, 8.0)) == Reservation(250.0, 0.0)
