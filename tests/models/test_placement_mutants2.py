"""Placement on sites whose hosts can be powered off: the compact block, host by host.

docs/models.md and ``models.placement``: a job takes "the ``n`` free cards nearest to the best seed
position (torus distance)"; where hosts are managed, cards are taken whole host by whole host in
classes (a job that is not a whole number of hosts fills partly used hosts first), "each class by
distance to the block's centre", a host's distance being "its nearest free card's distance to the
seed". Two rings of cards (torus x = 1, one rack), small enough to derive every placement by hand;
both planners (the greedy and the decomposed MILP, real HiGHS) pick their cards the same way.
"""

from __future__ import annotations

import numpy as np
import pytest
from models_helpers import EXAMPLES, job

from models.placement import PlacementProblem, QueuedJob, place_jobs
from twin.spec import SiteSpec, site_from_dict
from twin.tables import read_toml

pytestmark = pytest.mark.models


def _ring_site(cards: int, hosts: int) -> SiteSpec:
    """The example hardware as one rack of ``cards`` cards on a ring (torus 1 x cards x 1) in
    ``hosts`` hosts of consecutive cards; rack limit and host power scaled per card."""
    data = read_toml(EXAMPLES / "supernode-512.toml")
    data.update(name=f"ring-{cards}", torus_dims=[1, cards, 1], racks_per_supernode=1, supernodes=1)
    data["rack"] = {
        **data["rack"],
        "hosts_per_rack": hosts,
        "power_limit_w": 50000.0 * cards / 64,
        "host_overhead_w": 8800.0 * cards / 64,
        "host_power_w": 1000.0 * cards / 64 * 8 / hosts,
        "host_off_power_w": 50.0 * cards / 64 * 8 / hosts,
    }
    return site_from_dict(data, source="ring")


def _place(site: SiteSpec, free_cards: list[int], n: int, method: str) -> list[int]:
    free = np.zeros(site.n_cards, dtype=bool)
    free[free_cards] = True
    pp = PlacementProblem(
        site=site,
        free=free,
        queue=(QueuedJob(job("q", n)),),
        rack_headroom_w=np.array([1e6]),  # power does not decide here: only the block's shape
        card_power_w=np.array([500.0]),
    )
    plan = place_jobs(pp, method=method)
    assert "q" in plan.cards, plan.unplaced
    return [int(c) for c in plan.cards["q"]]


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_a_job_that_takes_part_of_a_free_host_takes_its_cards_nearest_the_block_centre(method: str) -> None:
    """(Kills ``_pick_hosts`` ordering a host's cards farthest first, placement.py:251 ``+ d`` -> ``- d``.)

    A ring of 6 cards in two hosts of 3 ({0, 1, 2} and {3, 4, 5}), every card free, a 2-card job:
    not a whole number of hosts, no host partly used, so it takes 2 cards of one host. The nearest
    2 free cards to any seed are the seed and a neighbour on the ring (total distance 1), and some
    neighbour is in the seed's host: two adjacent cards of one host ({0, 1}, {1, 2}, {3, 4} or {4, 5}).
    Taking a host's cards farthest from the seed first gives two cards 2 apart ({0, 2})."""
    site = _ring_site(6, 2)
    cards = _place(site, list(range(6)), 2, method)
    assert cards in ([0, 1], [1, 2], [3, 4], [4, 5])


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_partly_used_hosts_are_taken_by_their_nearest_free_card(method: str) -> None:
    """(Kills ``_pick_hosts`` ranking hosts by their farthest free card, placement.py:244 ``min`` -> ``max``.)

    A ring of 9 cards in three hosts of 3 ({0, 1, 2}, {3, 4, 5}, {6, 7, 8}); free: 0, 3, 5, 6, 7, so
    every host is partly used (one class). A 3-card job (a whole host's worth, but no host is wholly
    free). The compact block: 3 consecutive free cards around a seed, total distance 1 + 0 + 1 = 2;
    the only such run is 5, 6, 7 (4 and 8 are busy, 0's neighbours 8 and 1 too). By the documented
    rule, with the seed at 6: host {6, 7, 8} first (nearest free card 6, distance 0), then host
    {3, 4, 5} (card 5, distance 1) before host {0, 1, 2} (card 0, distance 3): 6, 7, then 5.
    Ranking hosts by their farthest free card ({3, 4, 5}: card 3 at 3; {0, 1, 2}: card 0 at 3) loses
    that order and the block (it takes 3, 5, 6, total distance 3 around seed 5)."""
    site = _ring_site(9, 3)
    cards = _place(site, [0, 3, 5, 6, 7], 3, method)
    assert cards == [5, 6, 7]
