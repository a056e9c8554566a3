"""The greedy DVFS + idle plan (``models.heuristic.greedy_dvfs``): what its module docstring promises."""

from __future__ import annotations

import numpy as np
import pytest
from models_helpers import job, problem, rack_cards

from models.heuristic import greedy_dvfs
from models.problem import dvfs_tables, facility_line, it_power_range_w
from twin.spec import SiteSpec

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
