"""The supply temperature trade-off: facility power has its minimum inside the range."""

from __future__ import annotations

import itertools

import pytest

from twin.spec import SiteSpec
from twin.sweep import best_point, supply_sweep

pytestmark = pytest.mark.unit


def test_sweep_minimum_is_strictly_inside_the_range(site: SiteSpec) -> None:
    temps = [float(t) for t in range(20, 51)]
    points = supply_sweep(site, temps, ambient_c=25.0)
    best = best_point(points)
    assert best is not None
    assert temps[0] < best.supply_temp_c < temps[-1]
    assert best.facility_power_w < points[0].facility_power_w
    assert best.facility_power_w < points[-1].facility_power_w
    # falls while the chiller runs, rises with leakage once cooling is free
    first_free = next(p for p in points if p.chiller_power_w == 0.0)
    assert first_free.supply_temp_c <= best.supply_temp_c
    after = [p for p in points if p.supply_temp_c > best.supply_temp_c]
    assert all(b.facility_power_w >= a.facility_power_w for a, b in itertools.pairwise(after))
    assert all(p.it_power_w < q.it_power_w for p, q in itertools.pairwise(points)), "leakage"


def test_warm_water_beyond_the_slowdown_onset_costs_speed(site: SiteSpec) -> None:
    points = supply_sweep(site, [45.0, 50.0, 55.0, 60.0], ambient_c=25.0)
    assert points[0].throttled_cards == 0 and points[0].throughput_frac == 1.0
    assert points[-1].throttled_cards == site.n_cards
    assert points[-1].throughput_frac < points[2].throughput_frac < 1.0
    assert best_point(points[2:]) is None


def test_hotter_weather_moves_the_best_set_point_up(site: SiteSpec) -> None:
    temps = [float(t) for t in range(20, 51)]
    cool = best_point(supply_sweep(site, temps, ambient_c=15.0))
    hot = best_point(supply_sweep(site, temps, ambient_c=35.0))
    assert cool is not None and hot is not None
    assert cool.supply_temp_c < hot.supply_temp_c
