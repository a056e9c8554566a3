"""Expected starts of queued jobs (``agent.backfill.expected_starts_s``), which tell the host
power-down which waiting jobs need their hosts up soon: a job starts when its cards are expected to
be free, a job holding a reservation at its promised start, and no job behind it earlier."""

from __future__ import annotations

import pytest
from agent_helpers import belief, job, small_site

from agent.backfill import expected_starts_s, reservation
from agent.load import site_load
from twin.readings import JobEvent
from twin.workload import Phase

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
