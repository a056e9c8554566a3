"""Expected starts of queued jobs (``agent.backfill.expected_starts_s``), which tell the host
power-down which waiting jobs need their hosts up soon: a job starts when its cards are expected to
be free, a job holding a reservation at its promised start, and no job behind it earlier."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from agent_helpers import belief, job, small_site

from agent.backfill import (
    Reservation,
    backfill_candidates,
    expected_hold_s,
    expected_starts_s,
    release_times,
    reservation,
)
from agent.load import site_load, spec_of_info
from twin.readings import JobEvent
from twin.state import JobInfo, TwinState
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.agent


def test_queued_jobs_start_when_their_cards_are_free_or_not_before_a_held_reservation() -> None:
    site = small_site()  # 2 racks of 16 cards
    _plant, state = belief(site, [job("run", 24, work_steps=3000.0)], 90)
    queued = [job("big", 28, submit_s=50.0), job("small", 4, submit_s=60.0), job("huge", 64, submit_s=70.0)]
    state.apply_events([JobEvent(q.submit_time_s, q.job_id, "submitted", Phase.WAITING, job=q) for q in queued])
    snap = state.snapshot()
    load = site_load(site, snap)
    n_free = int(load.idle.sum())
    assert n_free == 8
    run_end_s = reservation(snap, load, 28, n_free, 90.0, {}).shadow_s
    assert 2500.0 < run_end_s < 4000.0  # the running job's ~3,000 s of work
    starts = expected_starts_s(snap, load, snap.queue, n_free, 90.0, {})
    assert [q.job_id for q in snap.queue] == ["big", "small", "huge"]
    assert starts[0] == run_end_s  # "big" needs the running job's cards
    assert starts[1] == 90.0  # "small" fits now
    assert starts[2] == float("inf")  # more cards than the site has
    # "big" holds a reservation promised earlier than the recomputed one: it starts then, and no
    # job behind it before
    held = ("big", run_end_s - 500.0)
    starts = expected_starts_s(snap, load, snap.queue, n_free, 90.0, {}, held=held)
    assert starts[:2] == [run_end_s - 500.0, run_end_s - 500.0]
    # but a job the backfilling picked to start ahead of it (placed on no card yet) starts as if first
    starts = expected_starts_s(snap, load, snap.queue, n_free, 90.0, {}, held=held, ahead={"small"})
    assert starts[:2] == [run_end_s - 500.0, 90.0]
    # a promise later than the recomputed start: the job starts at the earlier one, the others not before
    starts = expected_starts_s(snap, load, snap.queue, n_free, 90.0, {}, held=("big", run_end_s + 500.0))
    assert starts[:2] == [run_end_s, run_end_s + 500.0]
    # nothing free now: "small" waits for the running job's 24 cards, "big" (28) can never start
    assert expected_starts_s(snap, load, snap.queue, 0, 90.0, {})[:2] == [math.inf, run_end_s]


# The default phase model's stretch of top-clock training (twin.workload.PhaseModel): stalls of
# 2/h x 20 s (communication) and 1/h x 30 s (input) medians, lognormal sigma 0.5 (mean = median x
# exp(sigma^2 / 2)), and a 60 s checkpoint every 900 s (agent_helpers.job's).
STRETCH = 1.0 + (2 * 20.0 + 1 * 30.0) * math.exp(0.5**2 / 2) / 3600.0 + 60.0 / 900.0
STARTUP_S = 60.0


def test_a_jobs_expected_hold_is_its_start_up_and_remaining_work_stretched_by_stalls_and_checkpoints() -> None:
    spec = job("j", 8, work_steps=2000.0)
    total = 2000.0 * STRETCH
    assert expected_hold_s(spec) == pytest.approx(STARTUP_S + total, rel=1e-12)
    # running for 100 s without reported progress: that much less
    assert expected_hold_s(spec, running_s=100.0) == pytest.approx(STARTUP_S + total - 100.0, rel=1e-12)
    # reported progress: the rest of the work (start-up is over), whatever the time running
    assert expected_hold_s(spec, progress_frac=0.25) == pytest.approx(0.75 * total, rel=1e-12)
    assert expected_hold_s(spec, progress_frac=0.25, running_s=100.0) == pytest.approx(0.75 * total, rel=1e-12)
    # overrunning its expected end, or reported past its work: it is expected to end now, not before
    assert expected_hold_s(spec, running_s=STARTUP_S + total + 500.0) == 0.0
    assert expected_hold_s(spec, progress_frac=1.5) == 0.0
    # a job the agent has no spec for never ends
    assert expected_hold_s(None) == math.inf
    assert expected_hold_s(None, progress_frac=0.5, running_s=100.0) == math.inf


def test_running_and_placed_jobs_release_their_cards_in_the_order_of_their_expected_ends() -> None:
    """At t = 10 s: "a" (8 cards, 2,000 s of work) seen running since 0 s, "b" (16 cards, 500 s)
    since 5 s, neither with reported progress (as over MQTT); "q" (4 cards, 100 s) being placed."""
    site = small_site()
    _plant, state = belief(site, [job("a", 8, work_steps=2000.0), job("b", 16, work_steps=500.0)], 10)
    state.apply_events(
        [JobEvent(9.0, "q", "submitted", Phase.WAITING, job=job("q", 4, work_steps=100.0, submit_s=9.0))]
    )
    snap = state.snapshot()
    snap = dataclasses.replace(snap, jobs=tuple(dataclasses.replace(j, progress_frac=0.0) for j in snap.jobs))
    assert sorted(j.job_id for j in snap.jobs) == ["a", "b"]
    free = np.flatnonzero(site_load(site, snap).idle)
    load = site_load(site, snap, [("q", free[:4])])
    ends = release_times(snap, load, 10.0, {"a": 0.0, "b": 5.0})
    assert [n for _, n in ends] == [4, 16, 8]
    assert [t for t, _ in ends] == pytest.approx(
        [
            10.0 + STARTUP_S + 100.0 * STRETCH,  # "q": not started yet
            10.0 + STARTUP_S + 500.0 * STRETCH - 5.0,  # "b": running 5 s
            10.0 + STARTUP_S + 2000.0 * STRETCH - 10.0,  # "a": running 10 s
        ],
        rel=1e-12,
    )
    # with progress reported, the rest of the work from now
    half = dataclasses.replace(snap, jobs=tuple(dataclasses.replace(j, progress_frac=0.5) for j in snap.jobs))
    ends = release_times(half, load, 10.0, {"a": 0.0, "b": 5.0})
    assert [n for _, n in ends] == [4, 16, 8]
    expected = [10.0 + STARTUP_S + 100.0 * STRETCH, 10.0 + 250.0 * STRETCH, 10.0 + 1000.0 * STRETCH]
    assert [t for t, _ in ends] == pytest.approx(expected, rel=1e-12)


def test_jobs_start_ahead_of_a_reservation_if_they_end_before_it_or_fit_in_the_cards_left_spare_in_turn() -> None:
    """A reservation 1,000 s from now with 6 cards spare; in queue order: "long4" (4 cards, runs past
    it) takes 4 of them, "long4b" would need 4 of the 2 left, "short8" (8 cards, ~170 s) ends before
    it, "long2" takes the last 2, "nospec" (1 card, no spec: never ends) finds none left."""
    now = 100.0
    infos = [
        _queued("long4", job("long4", 4)),
        _queued("long4b", job("long4b", 4)),
        _queued("short8", job("short8", 8, work_steps=100.0)),
        _queued("long2", job("long2", 2)),
        dataclasses.replace(_queued("nospec", job("nospec", 1)), spec=None),
    ]
    specs = [spec_of_info(q) for q in infos]
    assert backfill_candidates(infos, specs, Reservation(now + 1000.0, 6.0), now) == [0, 2, 3]
    # a job without a spec never ends before a reservation, however far (its made-up spec's work
    # would end after ~1e9 s)
    assert backfill_candidates(infos[4:], specs[4:], Reservation(now + 1e12, 0.0), now) == []


def _queued(job_id: str, spec: JobSpec) -> JobInfo:
    """``spec`` as a queued job in a belief."""
    state = TwinState(small_site())
    state.apply_events([JobEvent(spec.submit_time_s, job_id, "submitted", Phase.WAITING, job=spec)])
    (info,) = state.snapshot().queue
    return info
