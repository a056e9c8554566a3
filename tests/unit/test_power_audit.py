"""Mutation audit of ``twin.power``: what the existing tests left unchecked.

By hand from the example spec (supernode-512): at level k, full load and die temperature T a card
draws idle_w[k] + leak_w_per_k[k] (T - 42) + dyn_w[k], with idle 84.5, 78.363, 72.457 W, leakage
0.47, 0.4526, 0.4352 W/K and dynamic 569, 498.358, 433.692 W at levels 0, 1, 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from twin.power import PowerModel, fit_power
from twin.spec import SiteSpec

pytestmark = pytest.mark.unit


def test_the_power_brake_and_the_thermal_slowdown_add_up(site: SiteSpec) -> None:
    """A hot card over its power limit is slowed by both protections, one after the other: with a die
    at 89.5 deg C (2.5 K over the 87 deg C slowdown) at full load, level 0 draws
    84.5 + 0.47 x 47.5 + 569 = 675.825 W and level 1 598.219 W, over a 550 W limit; level 2 draws
    72.457 + 0.4352 x 47.5 + 433.692 = 526.822 W, within it. The brake gives level 2, the 2.5 K over
    the slowdown temperature 3 more levels: level 5 (not the larger of the two, 3). Under the card's
    own 700 W limit only the slowdown acts (level 3); 8.5 K over asks for 9 levels past the brake's 2
    and stops at the slowest, 7."""
    m = PowerModel.from_card(site.card)
    die = np.array([89.5, 89.5, 95.5])
    levels = m.protected_level(np.zeros(3, dtype=np.int64), np.ones(3), die, np.array([550.0, 700.0, 550.0]))
    assert levels.tolist() == [5, 3, 7]


def test_a_fit_never_reports_a_negative_coefficient() -> None:
    """Power that falls as the die warms (a temperature column that is not the die's, an air-cooled
    card whose fans speed up): the least-squares slope would be negative, which would make the
    twin's steady state run cooler the more it leaks. The fit keeps every coefficient at 0 or above:
    on samples of 84.5 W idle and 569 W dynamic (V floor 0.85, slope 0.6) with power falling 3 W/K
    around 55 deg C, the leakage is 0 and the idle and dynamic powers stay within 0.1 W of the truth,
    rather than a leakage of -2.9 W/K with the idle power taken to 0."""
    f = np.repeat(np.linspace(1000.0, 1980.0, 8), 3)
    x = f / 1980.0
    v = np.maximum(0.85, 1.0 - 0.6 * (1.0 - x))
    t = np.tile([40.0, 55.0, 70.0], 8)
    p = v**2 * (84.5 + 569.0 * x) - 3.0 * v * (t - 55.0)
    fit = fit_power(f, p, temperature_c=t)
    assert fit.leakage_w_per_k == 0.0
    assert fit.idle_power_w == pytest.approx(84.5, abs=0.1)
    assert fit.dynamic_power_w == pytest.approx(569.0, abs=0.1)
