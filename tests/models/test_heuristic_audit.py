"""``models.heuristic.greedy_dvfs``'s promises a mutation audit found untested (module docstring):
the least-power plan when no plan meets the caps, the ready reserve budgeted before levels are
raised, every move kept within the caps of the racks it touches, and jobs with an SLO of the top
clock. Example site: 8 racks of 64 cards, 8.8 kW of hosts per rack, 1 kW margin, 30 deg C supply."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from models_helpers import card_power_w, job, problem, rack_cards

from models.heuristic import GreedyDvfs, greedy_dvfs
from models.problem import CycleProblem, DvfsTables, dvfs_tables, facility_line, it_power_range_w
from twin.spec import SiteSpec

pytestmark = pytest.mark.models

HOST_W = 8800.0


def _greedy(site: SiteSpec, p: CycleProblem) -> tuple[DvfsTables, GreedyDvfs]:
    t = dvfs_tables(p)
    return t, greedy_dvfs(p, t, facility_line(site, 30.0, 25.0, *it_power_range_w(p, t)))


def _rack_power_w(t: DvfsTables, g: GreedyDvfs) -> np.ndarray:
    """The plan's rack powers as the module docstring budgets them: hosts and idle cards asleep,
    each job's cards at its level, each awake reserve card its wake power."""
    rack_p = t.rack_base_w.copy()
    np.add.at(rack_p, t.pair_rack, t.pair_power_w[np.arange(t.pair_job.size), g.job_level[t.pair_job]])
    return np.asarray(rack_p + g.rack_awake * t.rack_wake_w, dtype=np.float64)


def test_with_no_plan_within_the_caps_every_job_is_at_its_least_power(site: SiteSpec) -> None:
    """Job "a" must run at its top clock (SLO 0.99) but is 40 K over the twin: no level meets both its
    SLO and the die limit, so no plan exists. The plan is then the least-power one: "a" at its
    slowest level (least power), "b" (no SLO) at its cheapest, the slowest level too."""
    p = problem(site, [job("a", 16, slo=0.99), job("b", 16)], [rack_cards(0, 16), rack_cards(1, 16)], options=[30.0])
    off = np.zeros(site.n_cards)
    off[:16] = 40.0
    p = dataclasses.replace(p, die_offset_k=off)
    t, g = _greedy(site, p)
    assert t.cheapest_level[0] < 0
    assert not g.feasible and g.explanation
    slowest = site.card.n_levels - 1
    assert g.job_level.tolist() == [slowest, slowest]


def test_the_ready_reserve_is_budgeted_before_levels_are_raised(site: SiteSpec) -> None:
    """Rack r0 runs "a" on 48 cards and has 16 idle ones; the other racks have room for no awake
    card (their cap half a wake above their asleep power). r0's cap leaves room for "a" at level 3
    plus 2 awake cards. A reserve of 4 must sit in r0, so "a" gets only what the 4 awake cards leave:
    the rack, reserve included, stays within its cap (raising "a" first would take the reserve's room)."""
    p0 = problem(site, [job("a", 48)], [rack_cards(0, 48)], reserve=4, options=[30.0])
    t0 = dvfs_tables(p0)
    p_a = [48 * card_power_w(site, 0.95, 0.5, k, 30.0) for k in range(8)]
    limits = t0.rack_base_w + 1000.0 + 0.5 * t0.rack_wake_w
    limits[0] = t0.rack_base_w[0] + 1000.0 + p_a[3] + 2 * t0.rack_wake_w[0]
    p = problem(site, [job("a", 48)], [rack_cards(0, 48)], reserve=4, limit_w=limits.tolist(), options=[30.0])
    t, g = _greedy(site, p)
    assert g.feasible
    assert g.rack_awake.tolist() == [4, 0, 0, 0, 0, 0, 0, 0]
    assert (_rack_power_w(t, g) <= t.rack_cap_w + 1e-6).all()
    assert g.job_level[0] > 3  # slower than level 3: 2 more awake cards than its cap was sized for


def test_two_jobs_never_raise_a_shared_rack_past_its_cap(site: SiteSpec) -> None:
    """Jobs "a" and "b" (16 cards each, the same share and priority) share r0, whose cap has room for
    one of them at its top clock, not both. Each move is taken only if every rack it spans keeps its
    cap, so a move chosen before the other job took the headroom is not taken."""
    p_k = [card_power_w(site, 0.95, 0.5, k, 30.0) for k in range(8)]
    limits = np.full(8, 50_000.0)
    limits[0] = HOST_W + 1000.0 + 16 * p_k[0] + 16 * p_k[7] + 16 * 0.5 * (p_k[6] - p_k[7])
    jobs = [job("a", 16), job("b", 16)]
    p = problem(site, jobs, [rack_cards(0, 16), rack_cards(0, 16, start=16)], limit_w=limits.tolist(), options=[30.0])
    t, g = _greedy(site, p)
    assert g.feasible
    assert _rack_power_w(t, g)[0] <= t.rack_cap_w[0] + 1e-6


def test_a_job_whose_slo_needs_the_top_clock_gets_it_before_the_reserve_takes_its_room(site: SiteSpec) -> None:
    """Job "a" on 48 cards of r0 must run at its top clock (SLO 0.99); r0's cap has room for "a" at
    level 0 and half an awake card; r1..r7 (idle) have room for 4 awake cards each. Step 1 starts
    "a" at its cheapest allowed level, level 0, so r0 has no room for the reserve of 4: it goes to
    r1 and "a" runs at its top clock."""
    p0 = problem(site, [job("a", 48, slo=0.99)], [rack_cards(0, 48)], reserve=4, options=[30.0])
    t0 = dvfs_tables(p0)
    assert t0.cheapest_level[0] == 0
    p_a0 = 48 * card_power_w(site, 0.95, 0.5, 0, 30.0)
    limits = t0.rack_base_w + 1000.0 + 4.5 * t0.rack_wake_w
    limits[0] = t0.rack_base_w[0] + 1000.0 + p_a0 + 0.5 * t0.rack_wake_w[0]
    p = problem(site, [job("a", 48, slo=0.99)], [rack_cards(0, 48)], reserve=4, limit_w=limits.tolist(), options=[30.0])
    t, g = _greedy(site, p)
    assert g.feasible
    assert g.job_level.tolist() == [0]
    assert g.rack_awake.tolist() == [0, 4, 0, 0, 0, 0, 0, 0]
    assert (_rack_power_w(t, g) <= t.rack_cap_w + 1e-6).all()
