"""Whole-site steady state: energy balance, leakage, protection, facility power and PUE."""

from __future__ import annotations

import numpy as np
import pytest

from twin.cooling import chiller_cop, facility_cooling, rack_mass_flow_kg_s
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.steady import card_steady_power_w, site_steady_state
from twin.thermal import ThermalParams

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
    """Facility power of 400 kW of IT heat (the design heat: 8 racks x 50 kW), worked out by hand from
    the example spec's figures (twin/cooling.py's formulas, the spec's numbers typed in, not read back
    through the code). The facility total, the PUE, the fans, UPS and fixed overheads were asserted
    only as the sum of the point's own fields (the properties that define them), so none of them was
    checked: UPS losses or the fixed 4 kW set to 0, or the fans' cube law, went unnoticed.

    Pumps (full speed): rack loop 64 x 1.2 L/min = 1.28e-3 m3/s at 250 kPa / 0.6 = 533.33 W, x 8 racks
    = 4266.67 W; facility loop 8 x 1.28e-3 x 1020 kg/m3 = 10.4448 kg/s x 1.03 = 10.758 kg/s of water,
    1.0758e-2 m3/s at 150 kPa / 0.7 = 2305.32 W. UPS 2.5% of IT = 10 kW; other 4 kW.

    Warm water (40 deg C supply, 25 deg C air): facility supply 37 deg C, 12 K above the air; the dry
    cooler needs speed 6 K x (400/400 kW) / 12 K = 0.5 (above the 0.2 minimum): fans 1.2% x 400 kW x
    0.5^3 = 600 W, no chiller. Facility = 400 + 0.6 + 4.26667 + 2.30532 + 10 + 4 kW = 421.17198 kW,
    PUE 1.0529300.

    Cold water (20 deg C supply): facility supply 17 deg C is below the air, fans at full speed (4.8 kW);
    m c_p = 10.758 x 4180 = 44969 W/K, return 17 + 400e3/44969 = 25.895 deg C; the dry cooler takes
    44969 x 0.895 / (1 + 44969 x 6 / 400e3) = 24.035 kW, the chiller the other 375.965 kW at
    COP 0.45 x 288.15 K / (33 - 15) K = 7.2037: 52.190 kW.
    """
    cold_water = facility_cooling(site, 400e3, 20.0, 25.0)
    warm_water = facility_cooling(site, 400e3, 40.0, 25.0)
    p = warm_water
    assert p.chiller_w == 0.0 and p.chiller_heat_w == 0.0 and p.free_cooling_fraction == 1.0
    assert p.dry_cooler_fan_speed_frac == pytest.approx(0.5, rel=1e-9)
    assert p.dry_cooler_fan_w == pytest.approx(600.0, rel=1e-9)
    assert p.rack_pump_w == pytest.approx(4266.667, rel=1e-6)
    assert p.facility_pump_w == pytest.approx(2305.317, rel=1e-6)
    assert p.ups_loss_w == pytest.approx(10_000.0, rel=1e-9)
    assert p.other_overhead_w == pytest.approx(4000.0, rel=1e-9)
    assert p.facility_power_w == pytest.approx(421_171.98, rel=1e-7)
    assert p.pue == pytest.approx(1.0529300, rel=1e-7)

    c = cold_water
    assert c.dry_cooler_fan_speed_frac == 1.0 and c.dry_cooler_fan_w == pytest.approx(4800.0, rel=1e-9)
    assert c.chiller_cop == pytest.approx(7.20375, rel=1e-9)
    assert c.chiller_heat_w == pytest.approx(375_964.9, rel=1e-6)
    assert c.chiller_w == pytest.approx(52_190.16, rel=1e-6)
    assert c.free_cooling_fraction == pytest.approx(24_035.12 / 400e3, rel=1e-5)
    assert c.facility_power_w == pytest.approx(477_562.15, rel=1e-7)
    assert warm_water.facility_power_w < cold_water.facility_power_w

    # a light load needs less than the fans' minimum speed (6 K x 100/400 kW / 12 K = 0.125): they
    # turn at the minimum 0.2, 4.8 kW x 0.2^3 = 38.4 W
    light = facility_cooling(site, 100e3, 40.0, 25.0)
    assert light.dry_cooler_fan_speed_frac == pytest.approx(0.2) and light.dry_cooler_fan_w == pytest.approx(38.4)

    # COP = 0.45 T_evap / lift (kelvin), T_evap = facility supply - 2 K, T_cond = air + 8 K: it falls
    # with lift (15 -> 13 deg C evaporating, 43 deg C condensing: 0.45 x 286.15 / 30 = 4.2922; 25 ->
    # 23 deg C: 0.45 x 296.15 / 20 = 6.6634), and is capped at chiller_max_cop = 10 at a small lift
    # (40 deg C water, 25 deg C air: the uncapped formula would give 0.45 x 311.15 / 1 = 140)
    assert chiller_cop(site, 15.0, 35.0) == pytest.approx(4.29225, rel=1e-9)
    assert chiller_cop(site, 25.0, 35.0) == pytest.approx(6.663375, rel=1e-9)
    assert chiller_cop(site, 40.0, 25.0) == 10.0


def test_pump_power_follows_the_cube_of_flow(site: SiteSpec) -> None:
    full = facility_cooling(site, 400e3, 40.0, 25.0, flow_fraction=1.0)
    half = facility_cooling(site, 400e3, 40.0, 25.0, flow_fraction=0.5)
    assert half.rack_pump_w == pytest.approx(full.rack_pump_w / 8)
    assert half.facility_pump_w == pytest.approx(full.facility_pump_w / 8)


def test_ups_losses_follow_the_it_power_and_the_plant_the_heat(site: SiteSpec) -> None:
    """In a transient the heat reaching the coolant differs from the IT power drawn (the dies and
    plates store or release some): the UPS and distribution losses are on the electrical power
    (2.5% of 400 kW = 10 kW), the dry cooler works on the heat. By hand, 380 kW of heat at 40 deg C
    water and 25 deg C air: fan speed 6 K x (380/400) / 12 K = 0.475, fans 4.8 kW x 0.475^3 = 514.425 W."""
    p = facility_cooling(site, 400e3, 40.0, 25.0, heat_w=380e3)
    assert p.it_power_w == 400e3 and p.heat_w == 380e3
    assert p.ups_loss_w == pytest.approx(10_000.0, rel=1e-12)
    assert p.dry_cooler_fan_speed_frac == pytest.approx(0.475, rel=1e-12)
    assert p.dry_cooler_fan_w == pytest.approx(514.425, rel=1e-9)


def test_a_slower_loop_returns_warmer_facility_water_and_frees_more_cooling(site: SiteSpec) -> None:
    """The facility flow is ``facility_flow_ratio`` times the rack loops' (as its pump power assumes):
    at half the rack flow, by hand for 400 kW, 20 deg C supply (facility supply 17 deg C), 25 deg C air:
    m c_p = 8 x 76.8 L/min x 1020 kg/m3 x 0.5 x 1.03 x 4180 J/(kg K) = 22484.52 W/K, return
    17 + 400e3 / 22484.52 = 34.790 deg C; the dry cooler at full fans takes
    22484.52 x 9.790 / (1 + 22484.52 x 6 / 400e3) = 164.607 kW (24.035 kW at full flow), the chiller
    the other 235.393 kW at COP 7.20375: 32.676 kW."""
    half = facility_cooling(site, 400e3, 20.0, 25.0, flow_fraction=0.5)
    assert half.facility_return_temp_c == pytest.approx(34.790017, rel=1e-7)
    assert half.chiller_heat_w == pytest.approx(235_392.86, rel=1e-7)
    assert half.chiller_w == pytest.approx(32_676.434, rel=1e-7)
    full = facility_cooling(site, 400e3, 20.0, 25.0, flow_fraction=1.0)
    assert full.facility_return_temp_c == pytest.approx(25.895008, rel=1e-7)


def test_half_the_flow_warms_the_dies_along_the_plate_table_and_doubles_the_loop_rise(site: SiteSpec) -> None:
    """At half the pump speed each card gets 0.6 L/min, where the OCP table gives the plate 0.0300 K/W
    (0.0230 at the nominal 1.2 L/min): the steady die is T_in + P (0.03 + 0.0300). Each loop carries its
    heat at half the mass flow, so m c_p (T_return - T_supply) = Q with m half the nominal."""
    ss = site_steady_state(site, level=2, utilization=0.7, supply_temp_c=35.0, flow_fraction=0.5)
    np.testing.assert_allclose(ss.die_temp_c, 35.0 + ss.card_power_w * (0.03 + 0.0300), rtol=1e-9)
    m_half = 64 * 1.2 / 60_000 * 1020.0 * 0.5  # kg/s per rack
    carried = m_half * 3900.0 * (ss.rack_return_temp_c - 35.0)
    np.testing.assert_allclose(carried, ss.rack_heat_to_coolant_w, rtol=1e-9)


def test_without_heat_the_dry_cooler_fans_stop(site: SiteSpec) -> None:
    """With no heat to reject (every rack off) the dry cooler's fans stand still rather than turn at
    their minimum speed; the pumps still circulate (4266.67 W + 2305.32 W, as at 400 kW)."""
    p = facility_cooling(site, 0.0, 40.0, 25.0)
    assert p.dry_cooler_fan_speed_frac == 0.0 and p.dry_cooler_fan_w == 0.0 and p.chiller_w == 0.0
    assert p.cooling_power_w == pytest.approx(4266.667 + 2305.317, rel=1e-6)


def test_an_overheating_card_slows_only_as_far_as_its_firmware_asks(site: SiteSpec) -> None:
    """A card whose plate is fouled (4 x the resistance) overheats at full load and 45 deg C water.
    Its firmware slows it one level per K over the 87 deg C slowdown temperature (twin.power); the
    steady state is the fastest level at which that asks for no slower level: level 5, with the die
    between 4 and 5 K over (one level faster, level 4, the die would be more than 4 K over, asking for
    5 levels). Not the slowest level, where the first guess (the die at the top clock, ~13 K over)
    would send it. Its neighbours are untouched."""
    th = ThermalParams.from_site(site)
    th.r_case_coolant_k_per_w[3] *= 4.0
    ss = site_steady_state(site, level=0, utilization=1.0, supply_temp_c=45.0, thermal=th)
    slowdown = site.card.slowdown_temp_c
    assert int(ss.level[3]) == 5
    assert slowdown + 4.0 < ss.die_temp_c[3] <= slowdown + 5.0
    model = PowerModel.from_card(site.card)
    _, die_at_4 = card_steady_power_w(
        model, np.array([4]), np.ones(1), np.zeros(1, dtype=bool), 45.0, th.r_total_k_per_w[3:4]
    )
    assert float(die_at_4[0]) > slowdown + 4.0
    assert np.all(np.delete(ss.level, 3) == 0)
