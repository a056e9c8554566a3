"""The guard counts on no setting that no command carries to a card a ``card_failed`` refusal marks.

What users rely on: every decision keeps each rack within its cap as the cards will really draw.
A card a ``card_failed`` refusal says failed, no reading having confirmed it
(``StepContext.refused_failed_cards``), gets no command at all: ``agent.command_diff`` leaves it out of
levels, power limits, low-power idle and wakes (``Overlays.failed_now``). Such a card whose rack reads it
alive (a stale scheduler's refusal, a repeat's hold) keeps drawing what its reported settings give. Before,
the guard brought a rack under its cap by putting such an awake idle card to sleep, slowing it with its job
or cutting its power limit: its budget counted the card at settings it never got, up to (awake idle -
low-power idle) per idle card and (its level's power - the limit) per busy one above the cap.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from guard_helpers import drawn_rack_power_w, proposal, scene, step_context

from agent.config import ControlConfig
from agent.controller import Controller
from agent.guard import Guard, rack_measured_caps_w

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)
SITE, SNAP = scene()  # 2 racks of 16 cards: "a" on 0-7, "b" on 8-19 (16-19 in r1), 20-31 idle and awake, all at 700 W
IDLE_R1 = tuple(range(20, 32))


def test_awake_idle_refused_cards_are_not_put_to_sleep_for_a_cap_other_levers_hold_it() -> None:
    # r1 has 11500 - 7300 = 4200 W for cards and hosts: "b" at the slowest level and 12 awake idle cards
    # draw 4 x 302 + 12 x 81 + 2200 = 4380 W. The idle cards are refused: no sleep reaches them, so the
    # cap is held by the fail-safe limits on "b"'s cards (200 W, the lowest a card accepts): 3972 W
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 7300.0]), refused_failed_cards=IDLE_R1)
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert np.all(drawn <= rack_measured_caps_w(SITE, CFG) + 1e-6)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert not d.card_low_power[list(IDLE_R1)].any()  # as they report
    assert d.job_levels["b"] == 7
    assert d.card_power_limit_w[16:20].tolist() == [200.0] * 4
    assert not any("idle cards to low power" in e for e in d.explanation)
    assert "guard: r1: still over its cap at the slowest levels; power limits of 200 W per card" in d.explanation
    assert "cap_not_held" not in d.guard_actions


def test_only_the_idle_cards_commands_reach_are_put_to_sleep_for_a_cap() -> None:
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 7300.0]), refused_failed_cards=IDLE_R1[:4])
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    # with "b" at level 0 the 8 others asleep are not enough (4 x 618 + 4 x 81 + 8 x 49 + 2200 = 5387 W):
    # "b" slows to level 7, which leaves room for 2 of them awake again: 4 x 302 + 6 x 81 + 6 x 49 + 2200
    # = 4187 W <= 4200 W, no power limit needed
    assert not d.card_low_power[20:24].any() and d.card_low_power[24:30].all() and not d.card_low_power[30:].any()
    assert d.job_levels["b"] == 7
    assert "guard: r1: 6 of 8 awake idle cards to low power for the cap" in d.explanation
    assert d.card_power_limit_w.tolist() == [700.0] * SITE.n_cards
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, CFG) + 1e-6)


def test_a_sleeping_refused_idle_card_is_not_woken() -> None:
    lp = np.asarray(SNAP.card_low_power, dtype=bool).copy()
    lp[24:28] = True
    snap = dataclasses.replace(SNAP, card_low_power=lp)
    ctx = step_context(SITE, refused_failed_cards=(24, 25, 26, 27))
    d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)  # the proposal wakes them
    assert d.card_low_power[24:28].all()
    assert not d.card_low_power[28:].any()


def test_a_refused_busy_card_is_budgeted_at_its_reported_level_and_limit_and_a_cap_it_breaks_is_said_not_held() -> None:
    # r1 has 11500 - 7800 = 3700 W. Card 16 ("b") is refused: its job's slowing and the fail-safe limit do
    # not reach it; it keeps computing at level 0 and 700 W: 3 x 200 + 618 + 12 x 49 + 2200 = 4006 W
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 7800.0]), refused_failed_cards=(16,))
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert drawn[1] > rack_measured_caps_w(SITE, CFG)[1]
    assert d.guard_actions.count("cap_not_held") == 1
    not_held = [e for e in d.explanation if "cannot be held under its cap" in e]
    assert len(not_held) == 1 and not_held[0].startswith("guard: r1: ")
    assert "1 card no command reaches" in not_held[0]
    # the job's level is the one its other cards get; the refused card is as it reports
    assert d.job_levels["b"] == 7
    assert d.card_level[16] == 0 and d.card_power_limit_w[16] == 700.0
    assert d.card_level[17:20].tolist() == [7] * 3 and d.card_power_limit_w[17:20].tolist() == [200.0] * 3


def test_a_hot_refused_busy_card_gets_no_power_limit_and_its_die_is_said_not_held() -> None:
    # r0's inlet at 70 deg C: every die over 85 deg C until the power limit (85 - 70) / 0.053 = 283 W at the
    # slowest level; card 3 ("a") is refused: neither reaches it
    inlet = np.full(SITE.n_cards, 30.0)
    inlet[:16] = 70.0
    ctx = step_context(SITE, card_inlet_c=inlet, refused_failed_cards=(3,))
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    assert d.card_level[3] == 0 and d.card_power_limit_w[3] == 700.0
    others = [c for c in range(16) if c != 3]
    assert d.card_power_limit_w[others].tolist() == [283.0] * 15
    assert d.job_levels == {"a": 7, "b": 7}
    lines = [e for e in d.explanation if e.startswith("guard: dies of job(s) a cannot be held")]
    assert len(lines) == 1 and "no command reaches" in lines[0]
    assert d.guard_actions.count("die_not_held") == 1
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)


@pytest.mark.parametrize("use_solver", [True, False])
def test_the_controller_never_counts_on_sleeping_refused_idle_cards_for_a_cap(use_solver: bool) -> None:
    """Through the controller (the MILP and the greedy plan, then the guard): r1's unexplained power leaves
    its cap no room for 12 awake idle cards; they are refused, so they stay awake and the cap holds anyway."""
    ctl = Controller(
        SITE,
        ControlConfig(
            control_placement=False, control_host_power=False, control_pump_speed=False, idle_reserve_cards=0
        ),
    )
    refused = np.zeros(SITE.n_cards, dtype=bool)
    refused[list(IDLE_R1)] = True
    ctx = dataclasses.replace(ctl.context(SNAP, 100.0, refused_failed=refused), rack_extra_w=np.array([0.0, 7300.0]))
    d = ctl.review(ctl.propose(SNAP, ctx, use_solver=use_solver), SNAP, ctx)
    assert not d.card_low_power[list(IDLE_R1)].any()
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, ctl.control) + 1e-6)


# the property over any proposal and any refused cards (with settings held back too):
# test_guard_held_back.test_every_budget_is_what_the_cards_draw_with_held_settings_as_reported


@pytest.mark.parametrize("refused", [(16,), (16, 20, 21)])
def test_a_fail_safe_racks_card_limits_hold_its_cap_with_refused_cards_at_the_limits_they_report(
    refused: tuple[int, ...],
) -> None:
    """A fail-safe rack is held by its cards' power limits alone, whatever its stale readings say: the
    limits of all its cards plus its hosts within its cap. A refused card keeps the limit it reports (700 W
    here), so the cards commands reach share what it leaves; at the 581 W every card of r1 gets without
    refusals, r1's limits would sum to 15 x 581 + 700 + 2200 = 11,615 W > 11,500 W per refused card."""
    blind = (1,)
    ctx = step_context(SITE, refused_failed_cards=refused, stale_racks=blind, blind_racks=blind, failsafe_racks=blind)
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    kept = np.zeros(SITE.n_cards, dtype=bool)
    kept[list(refused)] = True
    limit = np.where(kept, np.asarray(SNAP.card_power_limit_w), d.card_power_limit_w)
    r1 = SITE.card_rack() == 1
    assert limit[kept].tolist() == [700.0] * len(refused)  # as they report: no command reaches them
    assert float(limit[r1].sum()) + SITE.rack.host_overhead_w <= rack_measured_caps_w(SITE, CFG)[1] + 1e-6
    # the other rack's fail-safe-free limits are untouched
    assert d.card_power_limit_w[~r1].tolist() == [700.0] * int((~r1).sum())
