"""Card power model and the card's own protection (power brake, thermal slowdown)."""

from __future__ import annotations

import numpy as np
import pytest

from twin.power import SLOWDOWN_K_PER_LEVEL, PowerModel
from twin.spec import SiteSpec

pytestmark = pytest.mark.unit


def test_power_formula_matches_the_spec(site: SiteSpec) -> None:
    card = site.card
    m = PowerModel.from_card(card)
    lvl = np.array([0, 3, 7])
    u = np.array([1.0, 0.5, 0.0])
    t = np.array([65.0, 50.0, 42.0])
    v = np.asarray(card.voltages_v)[lvl] / card.voltages_v[0]
    f = np.asarray(card.clocks_mhz)[lvl] / card.clocks_mhz[0]
    expected = (
        card.idle_power_w * v**2
        + card.leakage_w_per_k * v * (t - card.reference_temp_c)
        + u * card.dynamic_power_w * f * v**2
    )
    np.testing.assert_allclose(m.active_power_w(lvl, u, t), expected)


def test_power_falls_with_level_and_rises_with_temperature(site: SiteSpec) -> None:
    m = PowerModel.from_card(site.card)
    levels = np.arange(m.n_levels)
    p = m.active_power_w(levels, np.ones(m.n_levels), np.full(m.n_levels, 60.0))
    assert np.all(np.diff(p) < 0)
    hot = m.active_power_w(np.zeros(1, dtype=np.int64), np.ones(1), np.array([70.0]))
    cold = m.active_power_w(np.zeros(1, dtype=np.int64), np.ones(1), np.array([60.0]))
    assert float(hot[0] - cold[0]) == pytest.approx(10 * site.card.leakage_w_per_k)


def test_low_power_state_draws_less_than_active_idle(site: SiteSpec) -> None:
    m = PowerModel.from_card(site.card)
    t = np.array([40.0])
    low = m.card_power_w(np.zeros(1, dtype=np.int64), np.zeros(1), t, np.array([True]))
    idle = m.card_power_w(np.zeros(1, dtype=np.int64), np.zeros(1), t, np.array([False]))
    assert float(low[0]) < float(idle[0])


def test_power_brake_engages_over_the_limit(site: SiteSpec) -> None:
    m = PowerModel.from_card(site.card)
    req = np.zeros(3, dtype=np.int64)
    u = np.ones(3)
    t = np.full(3, 65.0)
    p0 = float(m.active_power_w(req[:1], u[:1], t[:1])[0])
    limits = np.array([p0 + 1.0, p0 - 30.0, 100.0])
    lvl = m.protected_level(req, u, t, limits)
    assert lvl[0] == 0  # within its limit: untouched
    assert lvl[1] > 0  # braked to the fastest level within the limit
    assert m.active_power_w(lvl[1:2], u[1:2], t[1:2])[0] <= limits[1]
    assert m.active_power_w(lvl[1:2] - 1, u[1:2], t[1:2])[0] > limits[1]
    assert lvl[2] == m.n_levels - 1  # no level is within 100 W: the slowest


def test_thermal_slowdown_above_the_slowdown_temperature(site: SiteSpec) -> None:
    m = PowerModel.from_card(site.card)
    sd = site.card.slowdown_temp_c
    temps = np.array([sd - 1.0, sd + 0.5, sd + 2.5 * SLOWDOWN_K_PER_LEVEL])
    lvl = m.protected_level(np.zeros(3, dtype=np.int64), np.zeros(3), temps)
    assert lvl.tolist() == [0, 1, 3]


def test_power_never_falls_below_half_the_idle_power(site: SiteSpec) -> None:
    """The linear leakage term extrapolated to a die far below the reference temperature would eat the
    idle power (and go negative): power is floored at half the level's idle power (twin/power.py's
    modelling guard). By hand, a die at -100 deg C (142 K under the 42 deg C reference): awake at
    level 0 and u = 0, 84.5 - 0.47 x 142 = 17.76 W, floored at 42.25 W; in low-power idle,
    52.8 - 0.4 x 142 = -4.0 W, floored at 26.4 W. At 60 deg C nothing is floored."""
    m = PowerModel.from_card(site.card)
    lvl = np.zeros(2, dtype=np.int64)
    u = np.zeros(2)
    t = np.array([-100.0, 60.0])
    np.testing.assert_allclose(m.active_power_w(lvl, u, t), [42.25, 84.5 + 0.47 * 18.0])
    np.testing.assert_allclose(m.low_power_w(t), [26.4, 52.8 + 0.4 * 18.0])
    np.testing.assert_allclose(m.level_power_table_w(u, t)[:, 0], [42.25, 84.5 + 0.47 * 18.0])


def test_the_power_floor_is_half_of_each_levels_own_idle_power(site: SiteSpec) -> None:
    """The floor scales with the level: at the slowest level (V = 0.851 of top) the idle power is
    84.5 x 0.851^2 = 61.195 W, and a die at -100 deg C (61.195 - 0.47 x 0.851 x 142 = 4.40 W) is
    floored at half of it, 30.597 W, not at half the top level's 84.5 W."""
    m = PowerModel.from_card(site.card)
    slowest = np.array([m.n_levels - 1])
    cold = np.array([-100.0])
    np.testing.assert_allclose(m.active_power_w(slowest, np.zeros(1), cold), [30.59749225])
    np.testing.assert_allclose(m.level_power_table_w(np.zeros(1), cold)[:, -1], [30.59749225])
