"""Whole-site steady state: energy balance, leakage, protection, facility power and PUE."""

from __future__ import annotations

import numpy as np
import pytest

from twin.cooling import chiller_cop, facility_cooling, rack_mass_flow_kg_s
from twin.spec import SiteSpec
from twin.steady import site_steady_state

pytestmark = pytest.mark.unit


def test_energy_balance_closes_to_rounding(site: SiteSpec) -> None:
    ss = site_steady_state(site, level=0, utilization=1.0)
    # heat into the coolant equals the electrical power
    assert ss.rack_heat_to_coolant_w.sum() == pytest.approx(ss.it_power_w, rel=1e-9)
    np.testing.assert_allclose(ss.rack_heat_to_coolant_w, ss.rack_power_w, rtol=1e-9)
    # the loop carries it: m c_p (T_return - T_supply) = Q per rack
    m_dot = rack_mass_flow_kg_s(site)
    carried = m_dot * site.loop.specific_heat_j_per_kg_k * (ss.rack_return_temp_c - ss.rack_supply_temp_c)
    np.testing.assert_allclose(carried, ss.rack_heat_to_coolant_w, rtol=1e-9)


def test_steady_die_temperature_is_inlet_plus_power_times_resistance(site: SiteSpec) -> None:
    ss = site_steady_state(site, level=2, utilization=0.7, supply_temp_c=35.0)
    r_total = (ss.die_temp_c - 35.0) / ss.card_power_w
    r_expected = site.card.r_die_to_case_k_per_w + 0.0230  # cold plate at 1.2 L/min (OCP table)
    np.testing.assert_allclose(ss.die_temp_c, 35.0 + ss.card_power_w * r_expected, atol=0.1)
    np.testing.assert_allclose(r_total, r_expected, rtol=1e-6)


def test_full_load_pushes_racks_over_their_limit(site: SiteSpec) -> None:
    ss = site_steady_state(site, level=0, utilization=1.0)
    assert np.all(ss.rack_power_w > site.rack.power_limit_w), "the cap must bind at full load"
    slow = site_steady_state(site, level=3, utilization=1.0)
    assert np.all(slow.rack_power_w < site.rack.power_limit_w)


def test_leakage_raises_power_with_supply_temperature(site: SiteSpec) -> None:
    cool = site_steady_state(site, level=0, utilization=1.0, supply_temp_c=25.0)
    warm = site_steady_state(site, level=0, utilization=1.0, supply_temp_c=35.0)
    per_card = (warm.card_power_w - cool.card_power_w).mean()
    r = float((cool.die_temp_c[0] - 25.0) / cool.card_power_w[0])
    k = site.card.leakage_w_per_k
    assert per_card == pytest.approx(10.0 * k / (1.0 - k * r), rel=1e-6)


def test_thermal_slowdown_when_the_water_is_too_warm(site: SiteSpec) -> None:
    ss = site_steady_state(site, level=0, utilization=1.0, supply_temp_c=55.0)
    assert np.all(ss.level > 0)
    assert ss.die_temp_c.max() <= site.card.slowdown_temp_c + 1.0


def test_free_cooling_turns_the_chiller_off_and_cop_falls_with_lift(site: SiteSpec) -> None:
    cold_water = facility_cooling(site, 400e3, 20.0, 25.0)
    warm_water = facility_cooling(site, 400e3, 40.0, 25.0)
    assert cold_water.chiller_w > 0 and warm_water.chiller_w == 0.0
    assert warm_water.free_cooling_fraction == 1.0
    assert warm_water.facility_power_w < cold_water.facility_power_w
    assert chiller_cop(site, 15.0, 35.0) < chiller_cop(site, 25.0, 35.0)
    p = warm_water
    assert p.pue == pytest.approx(p.facility_power_w / p.it_power_w)
    assert p.facility_power_w == pytest.approx(p.it_power_w + p.cooling_power_w + p.ups_loss_w + p.other_overhead_w)


def test_pump_power_follows_the_cube_of_flow(site: SiteSpec) -> None:
    full = facility_cooling(site, 400e3, 40.0, 25.0, flow_fraction=1.0)
    half = facility_cooling(site, 400e3, 40.0, 25.0, flow_fraction=0.5)
    assert half.rack_pump_w == pytest.approx(full.rack_pump_w / 8)
    assert half.facility_pump_w == pytest.approx(full.facility_pump_w / 8)
