"""Pump speeds (``agent.pumps``): rules a mutation audit found untested. What users rely on (module
docstring and docs/agent.md "How a decision is made", step 4): a rack's pump is slowed only as far
as its dies, cap and loop rise allow "with every busy card computing at its planned level", whatever
the plan says of low power for a busy card (a busy card is awake)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from agent_helpers import belief, example_site, job

from agent.config import ControlConfig
from agent.load import Prediction, predict, site_load, spec_r_total_k_per_w
from agent.pumps import choose_pump_speeds, r_at_speed

pytestmark = pytest.mark.agent

CFG = ControlConfig()


def _choose(low_power_busy: bool, die_limit_c: float = 85.0) -> tuple[np.ndarray, Callable[[np.ndarray], Prediction]]:
    """r0 full of a compute-bound job at level 2 (its cap's level), r1 half busy, the rest idle and
    asleep, at a 45 deg C supply (dies leave the full rack's pump little room)."""
    site = example_site()
    _plant, state = belief(site, [job("full", 64, share=0.97), job("half", 32, share=0.8)], 60)
    load = site_load(site, state.snapshot())
    n = site.n_cards
    low_power = np.ones(n, dtype=bool) if low_power_busy else ~load.busy
    level = np.where(load.busy, 2, site.card.n_levels - 1)
    speed = choose_pump_speeds(
        site,
        load,
        level,
        low_power,
        np.full(n, site.card.power_limit_w),
        np.full(n, 45.0),
        spec_r_total_k_per_w(site),
        np.zeros(n),
        np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        np.ones(site.n_racks),
        site.rack_power_limits_w() - CFG.rack_margin_w,
        np.zeros(site.n_racks),
        die_limit_c,
        facility_w_per_it_w=1.04,
    ).speed_frac

    def at(speed_frac: np.ndarray) -> Prediction:
        r = r_at_speed(
            site, spec_r_total_k_per_w(site), np.full(site.n_racks, site.loop_flow_per_rack_lpm()), speed_frac
        )
        return predict(
            site, load, level, ~load.busy, np.full(n, site.card.power_limit_w), np.full(n, 45.0), r, np.zeros(n)
        )

    return speed, at


def test_a_busy_card_the_plan_marks_low_power_still_counts_as_computing() -> None:
    awake, _at = _choose(low_power_busy=False)
    assert awake[0] > example_site().min_pump_speed_frac()  # the full rack's pump is held above the lowest
    marked, _at = _choose(low_power_busy=True)
    assert marked.tolist() == awake.tolist()


@pytest.mark.parametrize("die_margin_k", [2.0, 14.0])
def test_a_pump_is_slowed_only_as_far_as_every_die_stays_within_slowdown_minus_the_margin(die_margin_k: float) -> None:
    """At a 45 deg C supply the half-busy rack r1 (32 cards at level 2, under 500 W each) has its dies
    under 45 + 0.0689 K/W x 500 = 79.5 deg C at the lowest speed (1/3) and about 45 + 0.053 x 480 = 70
    deg C at full speed: with a 14 K margin (a 73 deg C limit) its pump must run faster than with 2 K.
    Whatever the margin, no rack's die is over the limit at the chosen speeds."""
    site = example_site()
    die_limit = site.card.slowdown_temp_c - die_margin_k
    speed, at = _choose(low_power_busy=False, die_limit_c=die_limit)
    assert np.all(at(speed).rack_max_die_c <= die_limit + 1e-9)


def test_with_every_pump_pinned_at_full_speed_nothing_is_saved() -> None:
    site = example_site()
    _plant, state = belief(site, [job("full", 64, share=0.97)], 60)
    load = site_load(site, state.snapshot())
    n = site.n_cards
    choice = choose_pump_speeds(
        site,
        load,
        np.where(load.busy, 2, site.card.n_levels - 1),
        ~load.busy,
        np.full(n, site.card.power_limit_w),
        np.full(n, 30.0),
        spec_r_total_k_per_w(site),
        np.zeros(n),
        np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        np.ones(site.n_racks),
        site.rack_power_limits_w() - CFG.rack_margin_w,
        np.zeros(site.n_racks),
        site.card.slowdown_temp_c - CFG.die_margin_k,
        facility_w_per_it_w=1.04,
        full_speed_racks=np.ones(site.n_racks, dtype=bool),
    )
    assert choice.speed_frac.tolist() == [1.0] * site.n_racks
    # the facility power saved against full speed, full speed chosen: 0 W
    assert choice.saved_w == pytest.approx(0.0, abs=1e-6)
