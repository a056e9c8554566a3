"""The greedy DVFS + idle plan (``models.heuristic.greedy_dvfs``): what its module docstring promises."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from models_helpers import card_power_w, job, problem, rack_cards

from models.heuristic import greedy_dvfs
from models.problem import dvfs_tables, facility_line, it_power_range_w
from twin.spec import SiteSpec
from twin.workload import relative_throughput

pytestmark = pytest.mark.models


def test_the_ready_reserve_is_woken_in_the_racks_with_the_most_headroom_first(site: SiteSpec) -> None:
    """Racks r1..r7 idle, each with room under its cap for k awake idle cards (k + 0.5 cards' wake
    power above its asleep power and the 1 kW margin): r2 has room for 6, r5 for 4, r1 for 1, the
    others for 2. A reserve of 9 goes to the most headroom first: 6 in r2, then 3 in r5 (least
    first would be 1 in r1, then 2 in each of four racks)."""
    p0 = problem(site, [job("a", 64)], [rack_cards(0)], reserve=9, options=[30.0])
    t0 = dvfs_tables(p0)
    room = np.array([0, 1, 6, 2, 2, 4, 2, 2], dtype=np.float64)
    limits = t0.rack_base_w + 1000.0 + (room + 0.5) * t0.rack_wake_w
    limits[0] = 50_000.0  # the busy rack: no idle card to wake, whatever its headroom
    p = problem(site, [job("a", 64)], [rack_cards(0)], reserve=9, limit_w=limits, options=[30.0])
    t = dvfs_tables(p)
    assert t.reserve == 9 and t.rack_idle[0] == 0
    lo, hi = it_power_range_w(p, t)
    g = greedy_dvfs(p, t, facility_line(site, 30.0, 25.0, lo, hi))
    assert g.feasible
    assert g.rack_awake.tolist() == [0, 0, 6, 0, 0, 3, 0, 0]


def test_levels_are_raised_best_gain_per_watt_first(site: SiteSpec) -> None:
    """Jobs H (priority 2, 16 cards) and L (priority 1, 48 cards, same share) share r0, whose cap is
    host + 16 P(0) + 48 P(2) + 1 W. Raising H earns twice what raising L earns per watt (same cards,
    same throughput per level), so the greedy raises H to the top clock first and L as far as the
    rest allows: (0, 2), the optimum (brute force over the 64 pairs below). Best gain first (not per
    watt) would raise L first (48 cards x 1 > 16 cards x 2 per level) and leave H at level 4."""
    p_k = [card_power_w(site, 0.95, 0.5, k, 30.0) for k in range(8)]
    tp = [float(relative_throughput(0.95, site.card.clocks_mhz[k] / site.card.clocks_mhz[0])) for k in range(8)]
    cap = 8800.0 + 16 * p_k[0] + 48 * p_k[2] + 1.0
    limits = np.full(8, 50_000.0)
    limits[0] = cap + 1000.0
    jobs = [job("H", 16, share=0.95, priority=2.0), job("L", 48, share=0.95)]
    p = problem(site, jobs, [rack_cards(0, 16), rack_cards(0, 48, start=16)], limit_w=limits, options=[30.0])
    fits = [(h, lo) for h, lo in itertools.product(range(8), range(8)) if 8800.0 + 16 * p_k[h] + 48 * p_k[lo] <= cap]
    assert max(fits, key=lambda hl: 2 * 16 * tp[hl[0]] + 48 * tp[hl[1]]) == (0, 2)
    t = dvfs_tables(p)
    g = greedy_dvfs(p, t, facility_line(site, 30.0, 25.0, *it_power_range_w(p, t)))
    assert g.feasible
    assert g.job_level.tolist() == [0, 2]
