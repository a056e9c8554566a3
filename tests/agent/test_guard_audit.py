"""The guard's rules a mutation audit found untested (each test names the rule of ``agent.guard``'s
docstring and docs/agent.md "Safety" it pins), on the scene of tests/agent/guard_helpers.py: rack r0
runs job "a" on cards 0-7 and job "b" on cards 8-15, rack r1 runs "b" on cards 16-19 and has idle
cards 20-31; every card at level 0 and a 700 W limit. Rack limit 12.5 kW, margin 1 kW, hosts 2.2 kW,
16 cards per rack, a card accepts 200-700 W. The numbers below are derived by hand from those."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from agent_helpers import belief, job, small_site
from guard_helpers import proposal, scene, step_context

from agent.config import ControlConfig
from agent.decision import PlacementOrder
from agent.guard import Guard, failsafe_card_limit_w
from twin.readings import JobEvent
from twin.workload import Phase

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)


def _blind(rack: int) -> dict[str, tuple[int, ...]]:
    """A rack whose telemetry is stale: blind and at fail-safe caps."""
    return {"stale_racks": (rack,), "blind_racks": (rack,), "failsafe_racks": (rack,)}


def test_the_failsafe_limit_is_the_racks_cap_shared_by_its_cards_rounded_down_to_a_watt() -> None:
    site, snap = scene()
    extra = np.array([7.0, 0.0])
    # r0: (12500 - 1000 - 7 - 2200) / 16 = 580.81 W -> 580 W (581 W would put 16 x 581 + 2207 = 11503 W
    # over the 11500 W cap); r1: 9300 / 16 = 581.25 -> 581 W
    assert failsafe_card_limit_w(site, CFG, extra).tolist() == [580.0, 581.0]
    d = Guard(site, CFG).review(proposal(site, 7), snap, step_context(site, rack_extra_w=extra, **_blind(0)))
    assert d.card_power_limit_w[:16].tolist() == [580.0] * 16
    assert d.card_power_limit_w[16:].tolist() == [700.0] * 16  # r1 is seen: its limits stay


def test_the_failsafe_limit_never_goes_below_what_a_card_accepts() -> None:
    site, _snap = scene()
    # 9 kW the twin does not explain: (11500 - 9000 - 2200) / 16 = 18.75 W, below the 200 W a card
    # accepts: the limit is 200 W (the guard then reports the rack as not holdable)
    assert failsafe_card_limit_w(site, CFG, np.array([9000.0, 0.0])).tolist() == [200.0, 581.0]


def test_proposed_power_limits_are_clipped_to_the_range_a_card_accepts() -> None:
    site, snap = scene()
    lim = np.full(site.n_cards, 700.0)
    lim[20], lim[21] = 50.0, 5000.0  # idle cards: nothing else moves their limits
    d = Guard(site, CFG).review(proposal(site, 7, card_power_limit_w=lim), snap, step_context(site))
    assert d.card_power_limit_w[20] == CFG.min_power_limit_w == 200.0
    assert d.card_power_limit_w[21] == site.card.power_limit_w == 700.0


def test_a_failsafe_rack_keeps_a_lower_power_limit_its_cards_report() -> None:
    """Fail-safe: caps are never raised (a card that reports 300 W is not given the 581 W fail-safe
    limit, nor the 700 W the plan proposes)."""
    site, snap = scene()
    reported = np.full(site.n_cards, 700.0)
    reported[16:] = 300.0
    snap = dataclasses.replace(snap, card_power_limit_w=reported)
    d = Guard(site, CFG).review(proposal(site, 7), snap, step_context(site, **_blind(1)))
    assert d.card_power_limit_w[16:].tolist() == [300.0] * 16
    assert d.card_power_limit_w[:16].tolist() == [700.0] * 16


def test_every_job_touching_a_blind_rack_runs_at_the_slowest_level_on_all_its_racks() -> None:
    site, snap = scene()
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site, **_blind(1)))
    # "b" has 4 cards on blind r1 and 8 on seen r0: all 12 at the slowest level (7)
    assert d.card_level[8:20].tolist() == [7] * 12
    assert d.job_levels["b"] == 7
    assert d.card_level[20:].tolist() == [7] * 12  # r1's idle cards too
    # "a" touches only r0: at r0's cap level with "b" at level 7 (8 x 650 + 8 x 302 + 2200 = 9816 W
    # fits the 11500 W: level 0)
    assert d.job_levels["a"] == 0


def test_a_rack_with_one_stuck_card_keeps_its_jobs_levels_under_failsafe_limits() -> None:
    site, snap = scene()
    ctx = step_context(site, stuck_cards=(17,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(proposal(site, 0), snap, ctx)
    # r1 is seen (its PDU, loop and other dies): "b" keeps level 0 and its idle cards their level;
    # every card of r1 is held to 581 W (a card of "b" would draw 618 W)
    assert d.card_level[8:].tolist() == [0] * 24
    assert d.job_levels["b"] == 0
    assert d.card_power_limit_w[16:].tolist() == [581.0] * 16
    assert d.card_power_limit_w[:16].tolist() == [700.0] * 16


def test_a_stuck_cards_sleep_is_not_ended_on_data_the_agent_cannot_see() -> None:
    site, snap = scene()
    lp = snap.card_low_power.copy()
    lp[[25, 26]] = True
    asleep = dataclasses.replace(snap, card_low_power=lp)
    ctx = step_context(site, stuck_cards=(25,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(proposal(site), asleep, ctx)  # the plan wakes every card
    assert d.card_low_power[25]  # its state is not seen: not woken
    assert not d.card_low_power[26]  # seen: woken as planned


def test_without_the_lowest_level_rule_a_job_on_a_blind_rack_keeps_one_level_no_faster_than_now() -> None:
    """``failsafe_lowest_level = false``: a blind rack's cards are not sped up (they keep at least
    the level they read), and all cards of a job get one level (the job runs at the pace of its
    slowest card). Before the fix, "b" left with level 5 on its blind r1 cards and 3 on its r0 cards
    (and ``job_levels`` said 3)."""
    site, snap = scene()
    now = np.zeros(site.n_cards, dtype=np.int64)
    now[8:20] = 5
    snap = dataclasses.replace(snap, card_level=now)
    level = np.zeros(site.n_cards, dtype=np.int64)
    level[8:20] = 3  # a raise of 2, within the rate limit of 3
    cfg = dataclasses.replace(CFG, failsafe_lowest_level=False)
    d = Guard(site, cfg).review(proposal(site, level), snap, step_context(site, **_blind(1)))
    assert d.card_level[8:20].tolist() == [5] * 12
    assert d.job_levels["b"] == 5


def test_low_power_toggles_made_before_the_clock_went_back_count_as_made_at_the_new_now() -> None:
    site, snap = scene()
    hold = CFG.low_power_hold_s  # 60 s
    guard = Guard(site, CFG)
    guard.review(proposal(site), snap, step_context(site, now_s=100.0))
    lp = snap.card_low_power.copy()
    lp[25] = True  # telemetry shows card 25 asleep at t = 110
    asleep = dataclasses.replace(snap, card_low_power=lp)
    guard.review(proposal(site, card_low_power=lp), asleep, step_context(site, now_s=110.0))
    guard.clock_went_back(50.0)  # the toggle counts as made at t = 50
    wake = proposal(site)
    held = guard.review(wake, asleep, step_context(site, now_s=50.0 + hold - 1.0))
    assert held.card_low_power[25]
    # 61 s after the new now (and 1 s after the old-timeline toggle at 110): the hold is over
    free = guard.review(wake, asleep, step_context(site, now_s=50.0 + hold + 1.0))
    assert not free.card_low_power[25]


# ---- 3b. pumps: r1 runs "b" on cards 16-19 (618 W at level 0, 30 deg C) and 12 idle cards (81 W). The
# measured OCP table gives a plate 0.023 K/W at 1.2 L/min (full speed), 0.0255 at 0.9 (speed 0.75),
# 0.030 at 0.6 (0.5) and 0.0389 at 0.4 (1/3); die to case 0.03 K/W: 0.053, 0.0555, 0.060, 0.0689 K/W
# die to inlet. The loop: 19.2 L/min at full speed, 1020 kg/m3 x 3900 J/(kg K): 1273 W/K at full speed.


def _pumps(*speeds: float) -> np.ndarray:
    return np.asarray(speeds, dtype=np.float64)


def test_a_pump_whose_rack_is_over_its_cap_at_the_proposed_speed_gets_full_speed() -> None:
    site, snap = scene()
    # 7.3 kW the twin does not explain on r1: at level 0, 4 x 618 + 12 x 81 + 2200 + 7300 = 12944 W
    # > 11500 W at any speed; the loop's rise at speed 0.75 (955 W/K) is 13.6 K, within 16.3 K, and
    # the dies (30 + 0.0555 x 620 = 64 deg C) are far under 85: only the cap sends the pump to full speed
    ctx = step_context(site, rack_extra_w=np.array([0.0, 7300.0]))
    d = Guard(site, CFG).review(proposal(site, 0, rack_pump_speed_frac=_pumps(1.0, 0.75)), snap, ctx)
    assert d.rack_pump_speed_frac is not None
    assert d.rack_pump_speed_frac.tolist() == [1.0, 1.0]
    assert "guard: pumps of r1 at full speed (dies, cap or loop rise at the proposed speed)" in d.explanation


def test_a_pump_whose_dies_would_pass_slowdown_minus_the_margin_gets_full_speed() -> None:
    site, snap = scene()
    inlet = np.full(site.n_cards, 30.0)
    inlet[16:] = 48.5
    # a card of "b" on r1 draws about 625 W at a 48.5 deg C inlet: its die at full speed is
    # 48.5 + 0.053 x 625 = 81.6 deg C (under 85), at speed 0.5 48.5 + 0.060 x 626 = 86.1 deg C: over the
    # 85 deg C limit (87 - 2) though under the 87 deg C slowdown. The pump, not the job, gives way
    ctx = step_context(site, card_inlet_c=inlet)
    d = Guard(site, CFG).review(proposal(site, 0, rack_pump_speed_frac=_pumps(1.0, 0.5)), snap, ctx)
    assert d.rack_pump_speed_frac is not None
    assert d.rack_pump_speed_frac.tolist() == [1.0, 1.0]
    assert d.job_levels["b"] == 0


def test_a_die_offset_measured_at_full_speed_grows_with_the_plates_resistance_when_the_pump_slows() -> None:
    site, snap = scene()
    off = np.zeros(site.n_cards)
    off[16:20] = 8.0  # "b"'s cards on r1, measured at full speed
    # at speed 1/3 a card of "b" draws about 630 W: 30 + 0.0689 x 630 = 73.4 deg C plus its offset. The
    # offset at that speed is 8 x 0.0389 / 0.023 = 13.5 K (plate ratio; the path's 0.0689 / 0.053 is
    # smaller): about 87 deg C, over 85 (unscaled, 8 K, it would be about 82.5 deg C and pass)
    ctx = step_context(site, die_offset_k=off)
    d = Guard(site, CFG).review(proposal(site, 0, rack_pump_speed_frac=_pumps(1.0, 1 / 3)), snap, ctx)
    assert d.rack_pump_speed_frac is not None
    assert d.rack_pump_speed_frac.tolist() == [1.0, 1.0]


def test_pump_speeds_are_clipped_to_the_sites_range_and_an_undefined_one_is_full_speed() -> None:
    site, snap = scene()
    lo = site.min_pump_speed_frac()  # 1/3: the least flow of the plate table (0.4 of 1.2 L/min)
    # r1 at 1/3: dies 30 + 0.0689 x 630 = 73 deg C, rise 5.7 kW / 424 W/K = 13.4 K: allowed
    d = Guard(site, CFG).review(proposal(site, 0, rack_pump_speed_frac=_pumps(1.0, 0.1)), snap, step_context(site))
    assert d.rack_pump_speed_frac is not None
    assert d.rack_pump_speed_frac[1] == pytest.approx(lo)
    # clipped up to the site's lowest speed, not sent to full speed: no line says it was
    assert not any(e.startswith("guard: pumps of") for e in d.explanation)
    nan = Guard(site, CFG).review(
        proposal(site, 0, rack_pump_speed_frac=_pumps(1.0, float("nan"))), snap, step_context(site)
    )
    assert nan.rack_pump_speed_frac is not None
    assert nan.rack_pump_speed_frac.tolist() == [1.0, 1.0]
    assert not any(e.startswith("guard: pumps of") for e in nan.explanation)


# ---- 1. sanity: placements and the set-point


def test_a_placement_listing_a_card_twice_is_dropped() -> None:
    site, snap = scene()
    placed = proposal(site, placements=(PlacementOrder("q", (28, 28, 29, 30)),))  # 4 entries, 3 cards
    d = Guard(site, CFG).review(placed, snap, step_context(site))
    assert d.placements == ()
    assert d.queue_waits["q"].kind == "placement_dropped"


def test_a_job_is_placed_once_whatever_the_plan_asks() -> None:
    """Only a queued job is placed: once placed it is no longer queued, so a second placement of it
    (on other free cards, or the same ones) is dropped. Before the fix both were kept: 8 cards busy
    for a 4-card job, its power counted twice against the rack's cap."""
    site, snap = scene()
    for second in ((28, 29, 30, 31), (20, 21, 22, 23)):
        placed = proposal(site, placements=(PlacementOrder("q", (20, 21, 22, 23)), PlacementOrder("q", second)))
        d = Guard(site, CFG).review(placed, snap, step_context(site))
        assert d.placements == (PlacementOrder("q", (20, 21, 22, 23)),)
        assert int(d.card_busy.sum()) == 8 + 12 + 4
        assert "q" not in d.queue_waits  # it was placed


def test_two_queued_jobs_are_never_placed_on_the_same_card() -> None:
    site = small_site()
    jobs = [job("a", 8, share=0.97), job("b", 12, share=0.9, priority=2.0), job("q", 4), job("q2", 4)]
    _plant, state = belief(site, jobs[:2], 90)
    state.apply_events(
        [JobEvent(time_s=90.0, job_id=j.job_id, kind="submitted", phase=Phase.WAITING, job=j) for j in jobs[2:]]
    )
    snap = state.snapshot()
    placed = proposal(site, placements=(PlacementOrder("q", (20, 21, 22, 23)), PlacementOrder("q2", (22, 23, 24, 25))))
    d = Guard(site, CFG).review(placed, snap, step_context(site))
    assert d.placements == (PlacementOrder("q", (20, 21, 22, 23)),)
    assert d.queue_waits["q2"].kind == "placement_dropped"
    assert "q" not in d.queue_waits


@pytest.mark.parametrize(
    ("current_c", "wanted_c", "sent_c"),
    [
        (45.0, 20.0, 40.0),  # down by at most 5 K
        (20.0, 45.0, 25.0),  # up by at most 5 K
        (43.0, 47.0, 45.0),  # within the step, but never above the warmest option (45)
        (22.0, 18.0, 20.0),  # nor below the coolest (20)
    ],
)
def test_the_set_point_moves_by_at_most_its_step_within_the_sites_options(
    current_c: float, wanted_c: float, sent_c: float
) -> None:
    site, snap = scene()
    d = Guard(site, CFG).review(
        proposal(site, 7, supply_temp_c=wanted_c), snap, step_context(site, setpoint_c=current_c)
    )
    assert d.supply_temp_c == sent_c


# ---- 4. caps: the measured die offsets' leakage counts


def test_the_leakage_of_measured_die_offsets_counts_against_the_rack_cap() -> None:
    site, snap = scene()
    off = np.zeros(site.n_cards)
    off[20:] = 20.0  # r1's 12 idle cards (awake at level 0, 0.47 W/K of leakage each): +113 W
    extra = np.array([0.0, 5800.0])  # r1: 11500 - 5800 = 5700 W for its cards and hosts
    # r1 with "b" at level 0: 4 x 618 + 12 x 81 + 2200 = 5644 W fits 5700 W without the offsets'
    # leakage, 5757 W does not: 2 idle cards (90 W awake with it, 57 W asleep) go to sleep (the cap's
    # first lever), "b" keeps its level
    ctx = step_context(site, die_offset_k=off, rack_extra_w=extra)
    d = Guard(site, CFG).review(proposal(site, 0), snap, ctx)
    assert np.flatnonzero(d.card_low_power).tolist() == [20, 21]
    assert d.job_levels["b"] == 0
    assert d.budget_rack_power_w[1] <= 11500.0


def test_the_leakage_of_measured_die_offsets_counts_for_sleeping_cards_too() -> None:
    site, snap = scene()
    lp = np.zeros(site.n_cards, dtype=bool)
    lp[20:] = True
    asleep = dataclasses.replace(snap, card_low_power=lp)
    off = np.zeros(site.n_cards)
    off[20:] = 20.0  # r1's 12 sleeping cards, 0.4 W/K of leakage each in low power: +96 W
    extra = np.array([0.0, 6200.0])  # r1: 5300 W for its cards and hosts
    # r1 with "b" at level 0: 4 x 618 + 12 x 49 + 2200 = 5260 W fits without the offsets' leakage,
    # 5356 W does not: "b" steps down
    ctx = step_context(site, die_offset_k=off, rack_extra_w=extra)
    d = Guard(site, CFG).review(proposal(site, 0, card_low_power=lp), asleep, ctx)
    assert d.card_low_power[20:].all()
    assert d.job_levels["b"] > 0


def test_power_limits_count_toward_the_rack_cap_before_any_job_is_slowed() -> None:
    site, snap = scene()
    lim = np.full(site.n_cards, 700.0)
    lim[:16] = 550.0
    # r0 with every card held to 550 W: 16 x 550 + 2200 = 11000 W, within 11500 W at level 0 (its
    # cards would draw 650 and 618 W): no job slows
    d = Guard(site, CFG).review(proposal(site, 0, card_power_limit_w=lim), snap, step_context(site))
    assert d.job_levels == {"a": 0, "b": 0}
    assert d.card_power_limit_w[:16].tolist() == [550.0] * 16
    assert d.budget_rack_power_w[0] == pytest.approx(11000.0)


def test_failed_cards_draw_nothing_in_the_cap_check() -> None:
    site, snap = scene()
    failed = np.zeros(site.n_cards, dtype=bool)
    failed[:4] = True  # half of "a"'s cards; "a" runs on the other 4
    snap = dataclasses.replace(snap, card_failed=failed)
    extra = np.array([1656.0, 0.0])  # r0: 11500 - 1656 = 9844 W for its cards and hosts
    # r0 at level 0: 4 x 650 + 8 x 618 + 0 + 2200 = 9744 W fits 9844 W (4 failed cards counted even at
    # an idle card's 81 W would make it 10068 W)
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site, rack_extra_w=extra))
    assert d.job_levels == {"a": 0, "b": 0}
    assert d.budget_rack_power_w[0] == pytest.approx(9744.0 + 1656.0, abs=10.0)


def test_a_rack_a_little_over_its_cap_slows_one_step_counting_each_cards_own_limit() -> None:
    site, snap = scene()
    lim = np.full(site.n_cards, 700.0)
    lim[:4] = 400.0  # half of "a"'s cards held to 400 W
    extra = np.array([200.0, 0.0])  # r0: 11300 W for its cards and hosts
    # r0 at level 0: 4 x 400 + 4 x 650 + 8 x 618 + 2200 = 11344 W, 44 W over. "a" one level slower:
    # its limited cards stay at 400 W, the others draw 574 W: 11040 W, within the cap
    d = Guard(site, CFG).review(proposal(site, 0, card_power_limit_w=lim), snap, step_context(site, rack_extra_w=extra))
    assert d.job_levels == {"a": 1, "b": 0}
    assert d.budget_rack_power_w[0] <= 11500.0


def test_a_job_whose_next_level_saves_nothing_under_its_limit_is_judged_by_the_first_level_that_saves() -> None:
    site, snap = scene()
    lim = np.full(site.n_cards, 700.0)
    lim[8:16] = 400.0  # "b"'s cards on r0: at 400 W at level 0 and level 1 alike
    extra = np.array([1000.0, 0.0])  # r0: 10500 W
    # r0 at level 0: 8 x 650 + 8 x 400 + 2200 = 10600 W, 100 W over; "a" one level slower saves
    # 8 x 76 W and gives up the least value: 8 x 574 + 3200 + 2200 = 9992 W
    d = Guard(site, CFG).review(proposal(site, 0, card_power_limit_w=lim), snap, step_context(site, rack_extra_w=extra))
    assert d.job_levels == {"a": 1, "b": 0}


# ---- 5. dies: the measured die offsets count


def test_a_die_hot_only_by_its_measured_offset_slows_its_job() -> None:
    site, snap = scene()
    off = np.zeros(site.n_cards)
    off[16:20] = 25.0  # "b"'s cards on r1
    # at level 0 such a card draws about 618 + 0.47 x 25 = 630 W: 30 + 0.053 x 630 + 25 = 88.4 deg C,
    # over 85 (without its offset 63 deg C)
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site, die_offset_k=off))
    assert d.job_levels["b"] > 0
    assert d.predicted_rack_max_die_c[1] <= 85.0 + 1e-6


def test_the_die_limits_power_limit_leaves_room_for_the_measured_offset() -> None:
    site, snap = scene()
    inlet = np.full(site.n_cards, 30.0)
    inlet[16:] = 65.0
    off = np.zeros(site.n_cards)
    off[16:20] = 5.0
    # "b"'s r1 cards at the slowest level (about 310 W at 65 deg C): 65 + 0.053 x 310 + 5 = 86.4 deg C;
    # their limit: (85 - 65 - 5) / 0.053 = 283.02 W, down to a whole watt
    d = Guard(site, CFG).review(proposal(site, 0), snap, step_context(site, card_inlet_c=inlet, die_offset_k=off))
    assert d.job_levels["b"] == 7
    assert d.card_power_limit_w[16:20].tolist() == [283.0] * 4
    assert d.card_power_limit_w[8:16].tolist() == [700.0] * 8  # its cards on r0 run at 30 deg C
