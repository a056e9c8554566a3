"""``agent.pumps.full_speed_flow_lpm`` at the edges its docstring names, where a hand mutation pass
(2026-12-04) found ``>`` and ``>=`` interchangeable for every other test: a pump reporting exactly 5%
of its speed counts as stalled (its measured flow is its full-speed flow), and a full-speed flow of
exactly ``1 - FLOW_DEADBAND_FRAC`` of nominal counts as nominal."""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import example_site

from agent.pumps import FLOW_DEADBAND_FRAC, full_speed_flow_lpm, offset_at_speed

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


def test_a_die_offset_measured_on_a_stopped_pump_is_scaled_from_five_percent_flow_not_dropped() -> None:
    # A pump reading 0% speed (tripped) gives 0 L/min: the offset measured now is scaled as if measured
    # at 5% of the flow (the least the estimate trusts), so it is not divided away by an infinite plate
    # resistance. Example site, 1.2 L/min per plate at full speed: now 0.06 L/min, below the OCP table
    # (0.4 L/min: 0.0389 K/W, 0.5 L/min: 0.0325 K/W), extrapolated linearly in 1/flow:
    # 0.0389 + (0.0389 - 0.0325) / (2.5 - 2.0) x (1 / 0.06 - 2.5) = 0.22023 K/W. At a third of the
    # speed (0.4 L/min) the plate is 0.0389 K/W; the larger of the plate's ratio (0.0389 / 0.22023 =
    # 0.1766) and the whole path's ((0.03 + 0.0389) / (0.03 + 0.22023) = 0.2753): a 10 K offset reads
    # 2.753 K. (Without the 5% floor the plate at 0 L/min is ~1e4 K/W and the offset ~0 K.)
    site = example_site()
    n_r = site.n_racks
    off = np.zeros(site.n_cards)
    off[0] = 10.0  # card 0, rack 0
    flow = np.full(n_r, site.loop_flow_per_rack_lpm())
    got = offset_at_speed(site, off, flow, np.zeros(n_r), np.full(n_r, site.min_pump_speed_frac()))
    r_now = 0.0389 + (0.0389 - 0.0325) / (2.5 - 2.0) * (1.0 / 0.06 - 2.5)
    assert got[0] == pytest.approx(10.0 * (0.03 + 0.0389) / (0.03 + r_now), rel=1e-6)
    assert got[0] == pytest.approx(2.753, abs=1e-3)
    assert np.all(got[1:] == 0.0)
