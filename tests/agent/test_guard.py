"""The guard's rules one at a time, on the scene of tests/agent/guard_helpers.py (rack r0: job "a",
priority 1, on cards 0-7 and job "b", priority 2, on cards 8-15; rack r1: "b" on cards 16-19 and idle
cards 20-31; "q" queued for 4 cards). Rack limit 12.5 kW, margin 1 kW: 11.5 kW for cards and 2.2 kW
of hosts; die limit 87 - 2 = 85 deg C; 0.053 K/W from die to inlet. The values below are the twin's
steady powers at a 30 deg C inlet (``agent.guard_caps.power_table_w``): per card of "a" 650, 574, 503 W at levels
0-2; of "b" 618 W at level 0 and 302 W at level 7; an idle card 81 W awake, 49 W asleep. The property
test (test_guard_properties.py) covers random plans; these pin what it cannot reach."""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import numpy.typing as npt
import pytest
from guard_helpers import proposal, scene, step_context

from agent.config import ControlConfig
from agent.decision import Decision, PlacementOrder
from agent.guard import Guard

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)


def test_a_level_rises_toward_faster_clocks_by_at_most_the_rate_limit() -> None:
    site, snap = scene()
    at_slowest = dataclasses.replace(snap, card_level=np.full(site.n_cards, 7))
    d = Guard(site, CFG).review(proposal(site, 0), at_slowest, step_context(site))
    # 7 - 3 = 4, the caps allow it (r0 about 8.2 kW of its 11.5 kW)
    assert d.card_level.tolist() == [4] * site.n_cards
    assert "guard: level raises limited to 3 per decision" in d.explanation


def test_every_card_of_a_job_gets_the_slowest_level_proposed_for_any_of_them() -> None:
    site, snap = scene()
    level = np.zeros(site.n_cards, dtype=np.int64)
    level[7] = 5  # one card of "a"
    d = Guard(site, CFG).review(proposal(site, level), snap, step_context(site))
    assert d.card_level[:8].tolist() == [5] * 8
    assert d.job_levels == {"a": 5, "b": 0}


def test_a_fractional_level_is_rounded_to_the_slower_one_and_an_infinite_one_is_the_slowest() -> None:
    """Levels count up toward slower clocks (0 the top clock, 7 the slowest of the scene's table): a
    proposal that is not a whole level errs on the side of less power, never more."""
    site, snap = scene()
    level = np.zeros(site.n_cards)
    level[:8] = 4.5  # job "a": between levels 4 and 5
    level[8:20] = -np.inf  # job "b": undefined
    # float levels on purpose (a proposal's levels need not be whole): the guard rounds them
    off_grid = cast(npt.NDArray[np.int64], level)
    d = Guard(site, CFG).review(dataclasses.replace(proposal(site, 0), card_level=off_grid), snap, step_context(site))
    assert d.job_levels == {"a": 5, "b": 7}


def test_an_idle_card_keeps_a_low_power_state_that_changed_less_than_the_hold_ago() -> None:
    site, snap = scene()
    hold = CFG.low_power_hold_s  # 60 s
    guard = Guard(site, CFG)
    guard.review(proposal(site), snap, step_context(site, now_s=100.0))
    lp = snap.card_low_power.copy()
    lp[25] = True  # telemetry shows card 25 asleep at t = 110
    asleep = dataclasses.replace(snap, card_low_power=lp)
    guard.review(proposal(site, card_low_power=lp), asleep, step_context(site, now_s=110.0))
    wake_25_sleep_26 = np.zeros(site.n_cards, dtype=bool)
    wake_25_sleep_26[26] = True
    d = guard.review(
        proposal(site, card_low_power=wake_25_sleep_26), asleep, step_context(site, now_s=110.0 + hold - 1.0)
    )
    assert d.card_low_power[25]  # changed 59 s ago: held asleep
    assert d.card_low_power[26]  # never changed: free to sleep
    d = guard.review(
        proposal(site, card_low_power=wake_25_sleep_26), asleep, step_context(site, now_s=110.0 + hold + 1.0)
    )
    assert not d.card_low_power[25]


@pytest.mark.parametrize(
    ("cards", "kept"),
    [
        ((28, 29, 30, 31), True),
        ((29, 30, 31), False),  # "q" asks for 4 cards
        ((28, 29, 30, 31, 27), False),
        ((24, 25, 26, 27), False),  # card 25's sensor is stuck: its state is not seen
        ((16, 28, 29, 30), False),  # card 16 runs "b"
    ],
)
def test_a_placement_is_kept_only_on_as_many_free_seen_cards_as_its_job_asks(
    cards: tuple[int, ...], kept: bool
) -> None:
    site, snap = scene()
    ctx = step_context(site, stuck_cards=(25,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(proposal(site, placements=(PlacementOrder("q", cards),)), snap, ctx)
    if kept:
        assert d.placements == (PlacementOrder("q", cards),)
        assert "q" not in d.queue_waits
    else:
        assert d.placements == ()
        assert d.queue_waits["q"].kind == "placement_dropped"


def test_a_placement_onto_a_card_a_refusal_says_failed_is_dropped_and_the_card_budgeted_alive() -> None:
    """A card a ``card_failed`` refusal says failed (``StepContext.refused_failed_cards``) while its
    readings show it alive and idle: no placement onto it, but the rack's budget is that of the same
    decision without the refusal (the card draws its power)."""
    site, snap = scene()
    order = PlacementOrder("q", (28, 29, 30, 31))
    plain = Guard(site, CFG).review(proposal(site, placements=(order,)), snap, step_context(site))
    refused = step_context(site, refused_failed_cards=(29,))
    d = Guard(site, CFG).review(proposal(site, placements=(order,)), snap, refused)
    assert plain.placements == (order,)
    assert d.placements == () and d.queue_waits["q"].kind == "placement_dropped"
    d_free = Guard(site, CFG).review(proposal(site), snap, refused)
    free = Guard(site, CFG).review(proposal(site), snap, step_context(site))
    assert not d_free.card_failed[29]
    assert d_free.budget_rack_power_w == pytest.approx(free.budget_rack_power_w, rel=1e-12)


def test_idle_cards_asleep_on_a_rack_the_agent_cannot_see_are_not_woken() -> None:
    site, snap = scene()
    lp = snap.card_low_power.copy()
    lp[24:28] = True
    asleep = dataclasses.replace(snap, card_low_power=lp)
    awake = proposal(site)  # wakes them
    seen = Guard(site, CFG).review(awake, asleep, step_context(site))
    assert not seen.card_low_power[24:28].any()
    blind = step_context(site, stale_racks=(1,), blind_racks=(1,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(awake, asleep, blind)
    assert d.card_low_power[24:28].all()
    assert not d.card_low_power[20:24].any() and not d.card_low_power[28:].any()  # awake as they were


def test_a_rack_over_its_cap_slows_the_job_that_gives_up_the_least_value_per_watt_saved() -> None:
    site, snap = scene()
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site))
    # r0 at level 0: 8 x 650 + 8 x 618 + 2200 = 12345 W > 11500 W. "a" (priority 1) loses half the
    # value per watt of "b" (priority 2): at level 1 r0 still draws 8 x 574 + 4942 + 2200 = 11732 W,
    # at level 2 8 x 503 + 4942 + 2200 = 11168 W
    assert d.job_levels == {"a": 2, "b": 0}
    assert d.card_power_limit_w.tolist() == [700.0] * site.n_cards
    assert d.budget_rack_power_w[0] <= 11500.0


def _r1_over_by(extra_w: float, level: object, **ctx: object) -> Decision:
    """The guard's review of a plan at ``level`` with ``extra_w`` on r1's PDU the twin does not explain."""
    site, snap = scene()
    return Guard(site, CFG).review(
        proposal(site, level), snap, step_context(site, rack_extra_w=np.array([0.0, extra_w]), **ctx)
    )


# "a" and "b" at the slowest level, r1's idle cards awake at level 0
SLOWEST_JOBS = np.array([7] * 20 + [0] * 12)


def test_a_rack_over_its_cap_by_a_little_puts_only_as_many_idle_cards_to_sleep_as_the_cap_needs() -> None:
    """The others stay awake: the ready reserve for the next job (a sleeping card waits its wake latency
    first). Until 2026-12-05 every awake idle card of the rack went to sleep."""
    # r1: 4 x 301.8 + 12 x 80.9 + 2200 = 4377.7 W, over the 11500 - 7170 = 4330 W it has by 47.7 W; a
    # sleep saves 80.9 - 49.0 = 31.8 W: 2 cards, the first in card order (all save the same)
    d = _r1_over_by(7170.0, SLOWEST_JOBS)
    assert np.flatnonzero(d.card_low_power).tolist() == [20, 21]
    assert d.job_levels == {"a": 7, "b": 7}
    assert d.card_power_limit_w.tolist() == [700.0] * 32
    assert d.budget_rack_power_w[1] <= 11500.0
    assert "guard: r1: 2 of 12 awake idle cards to low power for the cap" in d.explanation


def test_the_idle_cards_whose_sleep_saves_the_most_sleep_first() -> None:
    # cards 28-31 at a 45 deg C inlet leak more: 88.1 W awake, 55.2 W asleep (32.9 W saved, 31.8 W for
    # the others); r1 draws 4 x 7.2 W more, 4406.6 W: over by 76.6 W, 3 of the warm cards sleep
    inlet = np.full(32, 30.0)
    inlet[28:] = 45.0
    d = _r1_over_by(7170.0, SLOWEST_JOBS, card_inlet_c=inlet)
    assert np.flatnonzero(d.card_low_power).tolist() == [28, 29, 30]
    assert d.budget_rack_power_w[1] <= 11500.0
    assert "guard: r1: 3 of 12 awake idle cards to low power for the cap" in d.explanation


def test_a_rack_over_its_cap_puts_idle_cards_to_sleep_before_it_slows_a_job() -> None:
    """A sleep loses no work now, a slower job does (on all its cards, every rack): the idle cards go
    first. Until 2026-12-05 the rack's jobs slowed first, here "b" (on r0 too) by a level."""
    # r0 is over at level 0 (12345 W): "a" slows to 2 (below). r1: 4 x 617.7 + 12 x 80.9 + 2200 =
    # 5641.4 W, over the 11500 - 5956 = 5544 W it has by 97.4 W: 4 idle cards asleep hold it
    d = _r1_over_by(5956.0, 0)
    assert d.job_levels == {"a": 2, "b": 0}
    assert np.flatnonzero(d.card_low_power).tolist() == [20, 21, 22, 23]
    assert d.budget_rack_power_w[1] <= 11500.0
    assert "guard: r1: 4 of 12 awake idle cards to low power for the cap" in d.explanation
    assert "guard: slowed job(s) a -> 2 to keep racks under their caps (worst-case phases)" in d.explanation


def test_when_its_idle_cards_asleep_are_not_enough_a_racks_jobs_slow_and_cards_they_made_room_for_wake() -> None:
    d = _r1_over_by(7300.0, 0)
    # r1 has 11500 - 7300 = 4200 W for cards and hosts: "b" at level 0 and 12 idle cards asleep draw
    # 4 x 617.7 + 12 x 49.0 + 2200 = 5259.4 W, so "b" slows too: to level 5, 4 x 343.6 W (level 6 would
    # be 322.8 W); 4200 - 2200 - 4 x 343.6 - 12 x 49.0 = 37.2 W left, room for 1 card awake (31.8 W
    # more). No power limit needs cutting. Until 2026-12-05 "b" went to level 7 and all 12 slept
    assert d.job_levels["b"] == 5
    assert np.flatnonzero(d.card_low_power).tolist() == list(range(20, 31))
    assert d.card_power_limit_w.tolist() == [700.0] * 32
    assert d.budget_rack_power_w[1] <= 11500.0
    assert "guard: r1: 11 of 12 awake idle cards to low power for the cap" in d.explanation


def test_a_die_over_its_limit_slows_its_job_to_the_first_level_under_it() -> None:
    site, snap = scene()
    inlet = np.full(site.n_cards, 30.0)
    inlet[:16] = 52.0
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site, card_inlet_c=inlet))
    # at a 52 deg C inlet a card of "b" draws 628 W at level 0 (die 52 + 0.053 x 628 = 85.3 deg C, over
    # 85) and 557 W at level 1 (81.5 deg C); "a" is at level 2 for r0's cap (as above)
    assert d.job_levels == {"a": 2, "b": 1}
    assert d.predicted_rack_max_die_c[0] <= 85.0
    assert "guard: slowed job(s) b -> 1 to keep dies under 85 deg C" in d.explanation
    assert not any("power-limited" in e or "cannot be held" in e for e in d.explanation)


def test_a_job_too_hot_at_its_slowest_level_gets_the_power_limit_its_die_allows() -> None:
    site, snap = scene()
    inlet = np.full(site.n_cards, 30.0)
    inlet[:16] = 70.0
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site, card_inlet_c=inlet))
    assert d.job_levels == {"a": 7, "b": 7}
    # (85 - 70) / 0.053 = 283.02 W, down to a whole watt; r1's cards run at 30 deg C, unlimited
    assert d.card_power_limit_w[:16].tolist() == [283.0] * 16
    assert d.card_power_limit_w[16:].tolist() == [700.0] * 16
    # "a" went from level 2 (r0's cap) and "b" from 0 to the slowest, then the 16 cards of r0 were limited
    assert "guard: slowed job(s) a -> 7, b -> 7 to keep dies under 85 deg C" in d.explanation
    assert (
        "guard: power-limited job(s) a, b at the slowest level to keep dies under 85 deg C "
        "(16 cards, lowest limit 283 W)" in d.explanation
    )


def test_a_job_already_at_its_slowest_level_is_said_to_be_power_limited_not_slowed() -> None:
    """An operator reads the notes in ``racktwin journal``: a job that only got a lower power limit was
    not slowed (it proposed the slowest level itself)."""
    site, snap = scene()
    inlet = np.full(site.n_cards, 30.0)
    inlet[:16] = 70.0
    d = Guard(site, CFG).review(proposal(site, 7), snap, step_context(site, card_inlet_c=inlet))
    assert d.job_levels == {"a": 7, "b": 7}
    assert d.card_power_limit_w.tolist() == [283.0] * 16 + [700.0] * 16  # (85 - 70) / 0.053 = 283.02 W
    guard_notes = [e for e in d.explanation if e.startswith("guard: ")]
    assert guard_notes == [
        "guard: power-limited job(s) a, b at the slowest level to keep dies under 85 deg C "
        "(16 cards, lowest limit 283 W)"
    ]


def test_a_die_the_lowest_power_limit_cannot_hold_is_said_to_be_over_its_limit() -> None:
    """At an 80 deg C inlet a die allows (85 - 80) / 0.053 = 94 W, under the 200 W a card accepts: at
    200 W it is predicted at 80 + 0.053 x 200 = 90.6 deg C (the slowest level draws more than that).
    The guard has no lever left and says so rather than that it held the dies."""
    site, snap = scene()
    inlet = np.full(site.n_cards, 30.0)
    inlet[:16] = 80.0
    d = Guard(site, CFG).review(proposal(site, 7), snap, step_context(site, card_inlet_c=inlet))
    assert d.card_power_limit_w.tolist() == [200.0] * 16 + [700.0] * 16
    assert (
        "guard: power-limited job(s) a, b at the slowest level to keep dies under 85 deg C "
        "(16 cards, lowest limit 200 W)" in d.explanation
    )
    assert (
        "guard: dies of job(s) a, b cannot be held under 85 deg C: up to 90.6 deg C predicted at the "
        "lowest power limit a card accepts (200 W)" in d.explanation
    )
    assert d.predicted_rack_max_die_c[0] == pytest.approx(90.6)
    # "up to": the hottest of the jobs not held. With b's cards of r0 (8-15) at a 79 deg C inlet, b is
    # not held either ((85 - 79) / 0.053 = 113 W < 200 W) but runs cooler: 79 + 0.053 x 200 = 89.6 deg C
    inlet[8:16] = 79.0
    d = Guard(site, CFG).review(proposal(site, 7), snap, step_context(site, card_inlet_c=inlet))
    assert (
        "guard: dies of job(s) a, b cannot be held under 85 deg C: up to 90.6 deg C predicted at the "
        "lowest power limit a card accepts (200 W)" in d.explanation
    )


def test_with_no_set_point_in_force_or_proposed_the_site_design_one_leaves_and_the_caps_hold() -> None:
    # an undefined proposed set-point keeps the one in force; with none known either, the site's design
    # set-point (30 deg C here) leaves. At 30 deg C the caps need "a" at level 2 in r0: at level 0 it is
    # 8 x 650 + 8 x 618 + 2200 = 12.3 kW, at 1 8 x 574 + 4944 + 2200 = 11.7 kW, at 2 8 x 503 + 7144 = 11.2 kW
    site, snap = scene()
    nan = float("nan")
    d = Guard(site, CFG).review(proposal(site, 0, supply_temp_c=nan), snap, step_context(site, setpoint_c=nan))
    assert d.supply_temp_c == site.facility.supply_temp_c == 30.0
    assert d.job_levels == {"a": 2, "b": 0}
    assert np.all(d.budget_rack_power_w <= site.rack.power_limit_w - CFG.rack_margin_w)
