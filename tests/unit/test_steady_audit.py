"""Mutation audit of ``twin.steady.site_steady_state``: what the existing tests left unchecked.

By hand from the example spec (supernode-512): a card's die-to-inlet resistance at the nominal
1.2 L/min is 0.03 + 0.0230 = 0.053 K/W; at level 0 and full load its steady power at inlet T is
(84.5 + 569 + 0.47 (T - 42)) / (1 - 0.47 x 0.053) (the module docstring's closed form).
"""

from __future__ import annotations

import numpy as np
import pytest

from twin.spec import SiteSpec
from twin.steady import site_steady_state
from twin.thermal import ThermalParams

pytestmark = pytest.mark.unit


def test_a_level_past_the_slowest_is_refused_with_the_documented_message(site: SiteSpec) -> None:
    """Levels run 0..7 (8 clocks); 8 is refused as a ValueError naming the range, not an IndexError."""
    with pytest.raises(ValueError, match=r"level must be within 0\.\.7"):
        site_steady_state(site, level=8)
    with pytest.raises(ValueError, match=r"level must be within 0\.\.7"):
        site_steady_state(site, level=-1)


def test_each_racks_hottest_die_is_its_hottest_cards_die(site: SiteSpec) -> None:
    """One card of rack 2 (card 2 x 64 + 5) with a plate twice as resistive (0.046 K/W, die-to-inlet
    0.03 + 0.046 = 0.076 K/W) at 30 deg C, level 0, full load: its power is
    (653.5 + 0.47 x (30 - 42)) / (1 - 0.47 x 0.076) = 671.85 W, its die 30 + 0.076 x 671.85 = 81.06 deg C;
    every other card (0.053 K/W) draws (653.5 - 5.64) / (1 - 0.02491) = 664.41 W at 30 + 0.053 x 664.41
    = 65.21 deg C. The rack's hottest die is the fouled card's; the other racks' is 65.21 deg C."""
    th = ThermalParams.from_site(site)
    hot = 2 * 64 + 5
    th.r_case_coolant_k_per_w[hot] *= 2.0
    ss = site_steady_state(site, level=0, utilization=1.0, supply_temp_c=30.0, thermal=th)
    p_hot = (653.5 + 0.47 * (30.0 - 42.0)) / (1.0 - 0.47 * 0.076)
    p_cool = (653.5 + 0.47 * (30.0 - 42.0)) / (1.0 - 0.47 * 0.053)
    assert ss.die_temp_c[hot] == pytest.approx(30.0 + 0.076 * p_hot, abs=1e-6)
    expected = np.full(site.n_racks, 30.0 + 0.053 * p_cool)
    expected[2] = 30.0 + 0.076 * p_hot
    np.testing.assert_allclose(ss.rack_max_die_temp_c, expected, rtol=1e-9)
    assert ss.rack_max_die_temp_c[2] == pytest.approx(81.06, abs=0.01)


def test_a_slower_loop_pays_the_cube_of_its_speed_in_pump_power(site: SiteSpec) -> None:
    """The rack loops' speed reaches the facility figures: at half speed every rack pump draws
    533.33 W / 8 and the facility pump (its flow is the racks' total) 2305.32 W / 8 (test_steady's
    hand figures for full speed), whatever the load."""
    ss = site_steady_state(site, level=3, utilization=0.5, supply_temp_c=35.0, flow_fraction=0.5)
    assert ss.cooling.rack_pump_w == pytest.approx(4266.667 / 8.0, rel=1e-6)
    assert ss.cooling.facility_pump_w == pytest.approx(2305.317 / 8.0, rel=1e-6)
    per_rack = site_steady_state(
        site, level=3, utilization=0.5, supply_temp_c=35.0, flow_fraction=np.array([0.5] * 4 + [1.0] * 4)
    )
    # four racks at half speed, four at full: 4 x 533.33 / 8 + 4 x 533.33; the facility flow is 3/4 of nominal
    assert per_rack.cooling.rack_pump_w == pytest.approx(4 * 533.3333 / 8.0 + 4 * 533.3333, rel=1e-6)
    assert per_rack.cooling.facility_pump_w == pytest.approx(2305.317 * 0.75**3, rel=1e-6)


def test_a_racks_own_pump_speed_sets_its_own_cards_plate_resistance(site: SiteSpec) -> None:
    """Per-rack pump speeds reach the right cards: rack 0 at half speed, the others at full. Rack 0's
    cards get 0.6 L/min, where the OCP table gives the plate 0.0300 K/W, so their dies sit at
    T_in + P (0.03 + 0.0300); every other rack's at T_in + P (0.03 + 0.0230). Rack 0's loop carries its
    heat at half the mass flow (64 x 1.2 L/min x 1020 kg/m3 x 0.5), so its rise is twice the others'
    per watt."""
    frac = np.array([0.5] + [1.0] * 7)
    ss = site_steady_state(site, level=2, utilization=0.7, supply_temp_c=35.0, flow_fraction=frac)
    rack = site.card_rack()
    r_expected = np.where(rack == 0, 0.03 + 0.0300, 0.03 + 0.0230)
    np.testing.assert_allclose(ss.die_temp_c, 35.0 + ss.card_power_w * r_expected, rtol=1e-9)
    m_dot = 64 * 1.2 / 60_000 * 1020.0 * frac  # kg/s per rack
    carried = m_dot * 3900.0 * (ss.rack_return_temp_c - 35.0)
    np.testing.assert_allclose(carried, ss.rack_heat_to_coolant_w, rtol=1e-9)
