"""Placement: one supernode per job, fewest racks, compact blocks, free cards only; reasons for jobs
that stay queued."""

from __future__ import annotations

import numpy as np
import pytest
from models_helpers import job, problem, rack_cards

from models.placement import QueuedJob, make_placement_problem, place_jobs
from twin.spec import SiteSpec

pytestmark = pytest.mark.models


def _check_plan(site: SiteSpec, free: np.ndarray, queue: list[QueuedJob], plan) -> None:  # type: ignore[no-untyped-def,type-arg]
    used = np.zeros(site.n_cards, dtype=int)
    per_sn = site.racks_per_supernode * site.cards_per_rack
    for q in queue:
        if q.spec.job_id not in plan.cards:
            assert q.spec.job_id in plan.unplaced
            continue
        cards = plan.cards[q.spec.job_id]
        assert cards.size == q.spec.n_cards
        assert np.all(free[cards]), "placed on a busy or failed card"
        used[cards] += 1
        assert len(set((cards // per_sn).tolist())) == 1, "job spans supernodes"
        racks = plan.racks[q.spec.job_id]
        assert len(racks) <= (q.max_racks or site.racks_per_supernode)
    assert used.max(initial=0) <= 1, "a card was given to two jobs"


@pytest.mark.parametrize("method", ["greedy", "milp", "auto"])
def test_fewest_racks_and_free_cards_only(site: SiteSpec, method: str) -> None:
    # r0 is full, r1 has 32 busy cards: a 64-card job fits in one empty rack, a 32-card job in r1's
    # free half or an empty rack: each must use exactly one rack.
    p = problem(site, [job("a", 64), job("b", 32)], [rack_cards(0), rack_cards(1, 32)])
    queue = [QueuedJob(job("q64", 64)), QueuedJob(job("q32", 32)), QueuedJob(job("q8", 8))]
    pp = make_placement_problem(p, queue)
    plan = place_jobs(pp, method=method)
    _check_plan(site, pp.free, queue, plan)
    assert set(plan.cards) == {"q64", "q32", "q8"}
    assert all(len(plan.racks[j]) == 1 for j in plan.cards)


def test_big_job_takes_consecutive_racks_of_one_supernode(site: SiteSpec) -> None:
    big = site.with_supernodes(2)
    p = problem(big, [job("a", 64)], [rack_cards(3)])
    queue = [QueuedJob(job("q256", 256))]
    pp = make_placement_problem(p, queue)
    plan = place_jobs(pp, method="greedy")
    _check_plan(big, pp.free, queue, plan)
    racks = plan.racks["q256"]
    assert len(racks) == 4
    z = sorted(r % 8 for r in racks)
    gaps = [(z[(i + 1) % 4] - z[i]) % 8 for i in range(4)]
    assert sorted(gaps)[:3] == [1, 1, 1], f"racks {racks} are not consecutive planes of the torus"


def test_jobs_that_cannot_be_placed_stay_queued_with_the_reason(site: SiteSpec) -> None:
    p = problem(site, [job(f"r{r}", 60) for r in range(8)], [rack_cards(r, 60) for r in range(8)])
    queue = [
        QueuedJob(job("huge", 512)),  # more than the free cards
        QueuedJob(job("local", 16), max_racks=1),
        QueuedJob(job("spread", 16)),
    ]
    pp = make_placement_problem(p, queue)
    for method in ("greedy", "milp"):
        plan = place_jobs(pp, method=method)
        _check_plan(site, pp.free, queue, plan)
        assert "huge" in plan.unplaced and "needs 512 free cards" in plan.unplaced["huge"]
        assert "local" in plan.unplaced and "at most 1 consecutive racks" in plan.unplaced["local"]
        assert "spread" in plan.cards  # 4 free cards per rack: fits across 4 racks


def test_placement_prefers_racks_with_power_headroom(site: SiteSpec) -> None:
    # r0 and r1 both have 32 free cards; r0's other half runs a hot job so r0 has less headroom.
    p = problem(
        site,
        [job("hot", 32, share=0.99, nu=1.0), job("cool", 32, share=0.3, nu=0.0)]
        + [job(f"f{r}", 64) for r in range(2, 8)],
        [rack_cards(0, 32), rack_cards(1, 32)] + [rack_cards(r) for r in range(2, 8)],
    )
    pp = make_placement_problem(p, [QueuedJob(job("q", 32))])
    assert pp.rack_headroom_w[1] > pp.rack_headroom_w[0]
    plan = place_jobs(pp, method="greedy")
    assert plan.racks["q"] == (1,)
