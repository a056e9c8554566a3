"""Mutation audit of ``twin.sweep``: the figures of a sweep point, by hand from the example spec
(supernode-512), and what ``best_point`` and the facility power per throughput mean.

A card at level 2 (1760 MHz, 0.926 V of the top 1.0 V) draws idle 84.5 x 0.926^2 W, switching
569 x (1760 / 1980) x 0.926^2 W at u = 1, leakage 0.47 x 0.926 W/K over the 42 deg C reference;
its die sits 0.03 + 0.0230 = 0.053 K/W x its power over the supply (1.2 L/min per plate); each of
the 8 racks adds 8.8 kW of host overhead. Steady power: (P_r + k (T_in - 42)) / (1 - k x 0.053).
"""

from __future__ import annotations

import pytest

from twin.cooling import facility_cooling
from twin.spec import SiteSpec
from twin.sweep import best_point, supply_sweep

pytestmark = pytest.mark.unit


def _card_power_level_2_w(utilization: float, supply_c: float) -> float:
    v2 = 0.926**2
    idle, dyn, k = 84.5 * v2, 569.0 * (1760.0 / 1980.0) * v2, 0.47 * 0.926
    return (idle + utilization * dyn + k * (supply_c - 42.0)) / (1.0 - k * 0.053)


def test_a_point_reports_the_sites_power_at_the_commanded_level_utilization_and_weather(site: SiteSpec) -> None:
    """Level 2, half load, 20 deg C water, 15 deg C air, a job 60% compute bound: each card draws
    (72.456 + 0.5 x 433.69 - 0.43522 x 22) / 0.97693 = 286.3 W, its die 20 + 0.053 x 286.3 = 35.2 deg C
    (far under the 87 deg C slowdown: nothing throttles); IT = 512 x 286.3 W + 8 x 8.8 kW. The
    throughput is relative to the top clock: 1 / (0.6 x 1980 / 1760 + 0.4) = 0.93023. The facility
    figures are the cooling plant's at that IT power, water and air (twin.cooling, checked by hand in
    test_steady): 17 deg C facility water under 15 deg C air, the chiller trims what the dry cooler
    cannot take."""
    (p,) = supply_sweep(site, [20.0], ambient_c=15.0, level=2, utilization=0.5, compute_share=0.6)
    card_w = _card_power_level_2_w(0.5, 20.0)
    it_w = 512 * card_w + 8 * 8800.0
    assert card_w == pytest.approx(286.3, abs=0.1)
    assert p.it_power_w == pytest.approx(it_w, rel=1e-9)
    assert p.max_die_temp_c == pytest.approx(20.0 + 0.053 * card_w, rel=1e-9)
    assert p.throttled_cards == 0
    assert p.throughput_frac == pytest.approx(1.0 / (0.6 * 1980.0 / 1760.0 + 0.4), rel=1e-12)
    assert p.throughput_frac == pytest.approx(0.930233, abs=1e-6)
    assert p.supply_temp_c == 20.0 and p.ambient_temp_c == 15.0

    c = facility_cooling(site, it_w, 20.0, 15.0)
    assert c.chiller_w > 0.0 and 0.5 < c.free_cooling_fraction < 1.0  # the dry cooler does most, the chiller trims
    assert p.chiller_power_w == pytest.approx(c.chiller_w, rel=1e-9)
    assert p.cooling_power_w == pytest.approx(c.cooling_power_w, rel=1e-9)
    assert p.free_cooling_fraction == pytest.approx(c.free_cooling_fraction, rel=1e-9)
    assert p.facility_power_w == pytest.approx(c.facility_power_w, rel=1e-9)
    assert p.pue == pytest.approx(c.facility_power_w / it_w, rel=1e-9)


def test_throttled_points_cost_their_lost_work_in_facility_power_per_throughput(site: SiteSpec) -> None:
    """At 60 deg C every card throttles (test_sweep): its facility power per unit of work is the
    facility power divided by the work it still does (< 1), so more than the facility power; a point
    at full speed costs exactly its facility power."""
    cool, hot = supply_sweep(site, [35.0, 60.0], ambient_c=25.0)
    assert cool.throughput_frac == 1.0
    assert cool.facility_power_per_throughput_w == pytest.approx(cool.facility_power_w, rel=1e-12)
    assert 0.0 < hot.throughput_frac < 1.0
    assert hot.facility_power_per_throughput_w == pytest.approx(hot.facility_power_w / hot.throughput_frac, rel=1e-12)
    assert hot.facility_power_per_throughput_w > hot.facility_power_w


def test_a_slower_commanded_level_is_not_counted_as_throttling(site: SiteSpec) -> None:
    """Cards commanded to level 2 and running at level 2 (35 deg C water, full load: dies at about
    35 + 0.053 x 600 W = 67 deg C) are not throttled: the best point exists; the work they do is still
    below the top clock's."""
    points = supply_sweep(site, [30.0, 35.0], ambient_c=25.0, level=2)
    assert [p.throttled_cards for p in points] == [0, 0]
    assert best_point(points) is not None
    assert all(p.throughput_frac == pytest.approx(1.0 / (0.8 * 1980.0 / 1760.0 + 0.2)) for p in points)
