"""``agent.pumps.full_speed_flow_lpm`` at the edges its docstring names, where a hand mutation pass
(2026-12-04) found ``>`` and ``>=`` interchangeable for every other test: a pump reporting exactly 5%
of its speed counts as stalled (its measured flow is its full-speed flow), and a full-speed flow of
exactly ``1 - FLOW_DEADBAND_FRAC`` of nominal counts as nominal."""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import example_site

from agent.pumps import FLOW_DEADBAND_FRAC, full_speed_flow_lpm

pytestmark = pytest.mark.agent


def test_a_pump_at_exactly_five_percent_speed_counts_as_stalled() -> None:
    # 2.0 L/min at 5% of the speed: a stalled pump, planned at its measured 2.0 L/min (over the 1%
    # floor of 0.768 L/min), not at 2.0 / 0.05 = 40 L/min; at 6% the flow is scaled by the speed:
    # 2.0 / 0.06 = 33.3 L/min (under 95% of the nominal 64 x 1.2 = 76.8 L/min, so kept).
    site = example_site()
    n_r = site.n_racks
    flow = np.full(n_r, 2.0)
    assert full_speed_flow_lpm(site, flow, np.full(n_r, 0.05)) == pytest.approx(np.full(n_r, 2.0))
    assert full_speed_flow_lpm(site, flow, np.full(n_r, 0.06)) == pytest.approx(np.full(n_r, 2.0 / 0.06))


def test_a_full_speed_flow_at_exactly_the_deadband_counts_as_nominal() -> None:
    # the flow sensor's noise within FLOW_DEADBAND_FRAC (5%) of nominal, edge included, must not move
    # the predictions: 95% of 76.8 L/min at full speed reads as 76.8; a little under it is kept.
    site = example_site()
    nominal = site.loop_flow_per_rack_lpm()
    assert nominal == pytest.approx(76.8)
    edge = (1.0 - FLOW_DEADBAND_FRAC) * nominal
    n_r = site.n_racks
    speed = np.ones(n_r)
    assert full_speed_flow_lpm(site, np.full(n_r, edge), speed) == pytest.approx(np.full(n_r, nominal))
    below = edge - 0.1
    assert full_speed_flow_lpm(site, np.full(n_r, below), speed) == pytest.approx(np.full(n_r, below))
