"""The guard budgets a card no command reaches at the setting its rack confirmed, not only the one
telemetry last showed: its level, its power limit and, idle, its low-power state.

What users rely on: every decision keeps each rack within its cap as the cards really draw. A card
the guard's step 3a keeps as it is (a ``card_failed`` refusal no reading confirmed, or a kind of
setting a refusal holds back: no command of the decision changes it) draws at the level and power
limit in force. Its rack confirms a setting it applied at once (the retained applied state,
``agent.ingest.Ingest.applied_level`` / ``applied_power_limit_w``; the commands' diff counts from
that level, ``agent.command_diff``), its telemetry up to one telemetry period later. Before, the guard
kept such a card at the level and limit telemetry last showed: after a raise the rack applied, for up
to that period, it budgeted the card slower than it ran (r1 below: 11.16 kW budgeted, 12.26 kW drawn,
11.5 kW cap, no lever taken). Now it keeps the faster level and the higher limit of the two
(``StepContext.applied_level``, ``applied_power_limit_w``); where nothing is confirmed, as reported.
The same for an idle card's low-power state: the guard kept it as telemetry showed it, so after a wake
the rack applied it budgeted the card asleep (~32 W under what it draws awake: r1 below, 12 such cards,
11.46 kW budgeted, 11.84 kW drawn, 11.5 kW cap); now such a card is awake where either its telemetry or
its rack's confirmation (``StepContext.applied_low_power``) says awake.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest
from guard_helpers import drawn_rack_power_w, proposal, scene, step_context

from agent.config import ControlConfig
from agent.guard import Guard, rack_measured_caps_w

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)
SITE, SNAP = scene()  # 2 racks of 16 cards: "a" on 0-7, "b" on 8-19 (16-19 in r1), 20-31 idle and awake, all at 700 W
N = SITE.n_cards
B_R1 = (16, 17, 18, 19)
IDLE_R1 = tuple(range(20, 32))


def _levels(cards: tuple[int, ...], level: int, rest: int = -1) -> npt.NDArray[np.int64]:
    out = np.full(N, rest, dtype=np.int64)
    out[list(cards)] = level
    return out


def _limits(cards: tuple[int, ...], limit_w: float) -> npt.NDArray[np.float64]:
    out = np.full(N, np.nan)
    out[list(cards)] = limit_w
    return out


def _low_power(cards: tuple[int, ...], confirmed: float) -> npt.NDArray[np.float64]:
    out = np.full(N, np.nan)
    out[list(cards)] = confirmed
    return out


def test_idle_cards_whose_sleep_is_held_back_are_budgeted_awake_after_a_wake_their_rack_confirmed() -> None:
    # r1's idle cards read asleep; their rack confirmed waking them (since their last reading) and a refusal
    # holds their sleep back. r1 has 11500 - 7300 = 4200 W for cards and hosts: awake they draw 12 x 32 W
    # more than asleep, so the guard must cut power limits (budgeted asleep: 11.46 kW, 11.84 kW drawn)
    snap = dataclasses.replace(SNAP, card_low_power=np.isin(np.arange(N), IDLE_R1))
    ctx = step_context(
        SITE,
        rack_extra_w=np.array([0.0, 7300.0]),
        held_sleep_cards=IDLE_R1,
        applied_low_power=_low_power(IDLE_R1, 0.0),
    )
    d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)
    assert not d.card_low_power[list(IDLE_R1)].any()  # as in force: awake, as the rack confirmed
    drawn = drawn_rack_power_w(SITE, d, snap, ctx)  # r1's idle cards awake
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, CFG) + 1e-6)
    assert d.card_power_limit_w[16:32].tolist() == [200.0] * 16
    assert "cap_not_held" not in d.guard_actions


def test_refused_idle_cards_a_confirmed_wake_keeps_awake_are_budgeted_so_and_the_cap_said_not_held() -> None:
    # as above, but the idle cards are refused as failed (every kind kept) and r1 has 3800 W: with them
    # awake r1 cannot be held (11.67 kW); asleep, as they read, it seemed to be (11.29 kW)
    snap = dataclasses.replace(SNAP, card_low_power=np.isin(np.arange(N), IDLE_R1))
    ctx = step_context(
        SITE,
        rack_extra_w=np.array([0.0, 7700.0]),
        refused_failed_cards=IDLE_R1,
        applied_low_power=_low_power(IDLE_R1, 0.0),
    )
    d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)
    assert not d.card_low_power[list(IDLE_R1)].any()
    drawn = drawn_rack_power_w(SITE, d, snap, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert drawn[1] > rack_measured_caps_w(SITE, CFG)[1]
    not_held = [e for e in d.explanation if "cannot be held under its cap" in e]
    assert len(not_held) == 1 and "12 cards no command reaches at the settings in force" in not_held[0]
    assert d.guard_actions.count("cap_not_held") == 1


def test_cards_whose_level_is_held_back_are_budgeted_at_the_faster_level_their_rack_confirmed() -> None:
    # "b"'s cards in r1 read level 5, their rack confirmed level 0 (a raise it applied since their last
    # reading) and a refusal holds their level back. r1 has 11500 - 7000 = 4500 W for cards and hosts:
    # at level 0 they draw 4 x 618 W, so the guard must cut their limits (at level 5 it saw room to spare)
    snap = dataclasses.replace(SNAP, card_level=np.where(np.isin(np.arange(N), B_R1), 5, SNAP.card_level))
    ctx = step_context(
        SITE, rack_extra_w=np.array([0.0, 7000.0]), held_level_cards=B_R1, applied_level=_levels(B_R1, 0)
    )
    d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)
    assert d.card_level[list(B_R1)].tolist() == [0] * 4  # as in force: the level the rack confirmed
    drawn = drawn_rack_power_w(SITE, d, snap, ctx)  # "b"'s r1 cards at level 0
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, CFG) + 1e-6)
    assert d.card_power_limit_w[list(B_R1)].tolist() == [200.0] * 4
    assert "cap_not_held" not in d.guard_actions


def test_a_refused_card_is_budgeted_at_the_higher_power_limit_its_rack_confirmed_and_the_cap_said_not_held() -> None:
    # card 16 ("b", computing at level 0) is refused as failed while r1 reads it alive: no command reaches
    # it. It reads a 300 W limit; r1 confirmed 700 W (a raise it applied since). r1 has 3700 W: with card 16
    # at 618 W (700 W limit) the rack cannot be held (4.0 kW); at the 300 W it reads, it seemed to be (3.69 kW)
    snap = dataclasses.replace(SNAP, card_power_limit_w=np.where(np.arange(N) == 16, 300.0, SNAP.card_power_limit_w))
    ctx = step_context(
        SITE,
        rack_extra_w=np.array([0.0, 7800.0]),
        refused_failed_cards=(16,),
        applied_power_limit_w=_limits((16,), 700.0),
    )
    d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)
    assert d.card_level[16] == 0 and d.card_power_limit_w[16] == 700.0
    drawn = drawn_rack_power_w(SITE, d, snap, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert drawn[1] > rack_measured_caps_w(SITE, CFG)[1]
    not_held = [e for e in d.explanation if "cannot be held under its cap" in e]
    assert len(not_held) == 1 and not_held[0].startswith("guard: r1: ")
    assert "1 card no command reaches at the settings in force" in not_held[0]
    assert d.guard_actions.count("cap_not_held") == 1


def test_a_fail_safe_racks_cards_share_what_a_refused_cards_confirmed_limit_leaves() -> None:
    """r1 is blind: its cards' limits alone hold its cap. Refused card 16 reads 300 W but its rack confirmed
    700 W: the others share what 700 W leaves (at the 581 W that 300 W leaves them, r1's limits would sum
    to 15 x 581 + 700 + 2200 = 11,615 W > 11,500 W)."""
    blind = (1,)
    snap = dataclasses.replace(SNAP, card_power_limit_w=np.where(np.arange(N) == 16, 300.0, SNAP.card_power_limit_w))
    ctx = step_context(
        SITE,
        refused_failed_cards=(16,),
        applied_power_limit_w=_limits((16,), 700.0),
        stale_racks=blind,
        blind_racks=blind,
        failsafe_racks=blind,
    )
    d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)
    r1 = SITE.card_rack() == 1
    assert d.card_power_limit_w[16] == 700.0
    assert float(d.card_power_limit_w[r1].sum()) + SITE.rack.host_overhead_w <= rack_measured_caps_w(SITE, CFG)[1]


@pytest.mark.parametrize("reported_asleep", [False, True])
def test_a_confirmed_setting_that_draws_less_than_the_reported_one_changes_nothing(reported_asleep: bool) -> None:
    """The guard keeps the setting that draws more: where the rack confirmed a slower level, a lower
    limit or a sleep (of idle cards that read awake) than its telemetry shows (applied since the reading),
    the reported one; where the rack confirmed what telemetry shows (idle cards asleep), that; and where
    the rack confirmed nothing (-1, NaN), as reported: the same decision as with no confirmed settings."""
    snap = dataclasses.replace(SNAP, card_low_power=np.isin(np.arange(N), IDLE_R1) & reported_asleep)
    held = dict(
        held_level_cards=B_R1, held_limit_cards=B_R1, held_sleep_cards=IDLE_R1, rack_extra_w=np.array([0.0, 7000.0])
    )
    plain = Guard(SITE, CFG).review(proposal(SITE, 0), snap, step_context(SITE, **held))
    for level, limit_w, low in (
        (_levels(B_R1, 7), _limits(B_R1, 200.0), _low_power(IDLE_R1, 1.0)),
        (_levels((), 0), _limits((), 0.0), _low_power((), 0.0)),
    ):
        ctx = step_context(SITE, applied_level=level, applied_power_limit_w=limit_w, applied_low_power=low, **held)
        d = Guard(SITE, CFG).review(proposal(SITE, 0), snap, ctx)
        assert d.card_level.tolist() == plain.card_level.tolist()
        assert d.card_power_limit_w.tolist() == plain.card_power_limit_w.tolist()
        assert d.card_low_power.tolist() == plain.card_low_power.tolist()
        assert d.budget_rack_power_w.tolist() == plain.budget_rack_power_w.tolist()
        assert d.card_level[list(B_R1)].tolist() == [0] * 4  # as reported (level 0, 700 W)
        assert d.card_power_limit_w[list(B_R1)].tolist() == [700.0] * 4
        assert d.card_low_power[list(IDLE_R1)].tolist() == [reported_asleep] * len(IDLE_R1)
