"""The guard counts on no setting that a refusal's backoff keeps from being sent.

What users rely on: every decision keeps each rack within its cap as the cards will really draw.
After a rack refuses a card setting (for a reason other than a failed card), ``Overlays.refuse``
holds that kind of setting (a level, a power limit, low-power idle or a wake) back on the refused
command's cards for ``command_ttl_s``: ``agent.command_diff`` sends them none of it, whatever the
decision wants (``StepContext.held_level_cards``, ``held_limit_cards``, ``held_sleep_cards``). Before,
the guard budgeted the decision's value of the held kind: a decision that slowed such a card, cut its
power limit or put it to sleep to hold a cap counted power the rack really draws (r1 below, whose cap
leaves 4.20 kW: its idle cards' sleep held back, 4.38 kW drawn against 4.00 kW budgeted). Now the held
kind stays as the card reports it and the other levers (or the card's other settings) hold the cap, or
the rack is said not held.
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import numpy.typing as npt
import pytest
from guard_helpers import drawn_rack_power_w, in_force, proposal, scene, step_context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import wire
from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import PlacementOrder
from agent.guard import Guard, rack_measured_caps_w
from agent.open_commands import LEVEL, LIMIT, SLEEP
from agent.publish import CommandBook

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)
SITE, SNAP = scene()  # 2 racks of 16 cards: "a" on 0-7, "b" on 8-19 (16-19 in r1), 20-31 idle and awake, all at 700 W
IDLE_R1 = tuple(range(20, 32))
B_R1 = (16, 17, 18, 19)


def _mask(cards: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    out = np.zeros(SITE.n_cards, dtype=bool)
    out[list(cards)] = True
    return out


def test_idle_cards_whose_sleep_is_held_back_stay_awake_and_get_the_cap_s_power_limit() -> None:
    # r1 has 11500 - 7300 = 4200 W for cards and hosts: "b" at the slowest level and 12 awake idle cards
    # draw 4 x 302 + 12 x 81 + 2200 = 4380 W. A refused sleep holds the idle cards' sleep back (the old
    # guard budgeted them asleep: 4 x 302 + 12 x 49 + 2200 = 3996 W): the fail-safe limits hold the cap
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 7300.0]), held_sleep_cards=IDLE_R1)
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, CFG) + 1e-6)
    assert not d.card_low_power[list(IDLE_R1)].any()  # as they report
    assert not any("idle cards to low power" in e for e in d.explanation)
    # their power limits are still sent: only the held kind is kept
    assert d.card_power_limit_w[16:32].tolist() == [200.0] * 16
    assert "cap_not_held" not in d.guard_actions


def test_cards_whose_level_is_held_back_keep_it_and_the_cap_is_held_by_their_power_limits() -> None:
    # r1 has 11500 - 7800 = 3700 W. "b"'s cards in r1 have their level held back (a refused level): they
    # keep computing at level 0 (618 W at their 700 W limits; the old guard budgeted "b" at level 7,
    # 302 W); the idle cards sleep and the cards' power limits hold the cap: 4 x 200 + 12 x 49 + 2200 W
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 7800.0]), held_level_cards=B_R1)
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, CFG) + 1e-6)
    assert d.card_level[list(B_R1)].tolist() == [0] * 4
    assert d.card_power_limit_w[list(B_R1)].tolist() == [200.0] * 4
    assert d.job_levels["b"] == int(d.card_level[8])  # its other cards' level
    assert "cap_not_held" not in d.guard_actions


def test_a_cap_held_only_by_power_limits_a_refusal_holds_back_is_said_not_held_and_budgeted_as_drawn() -> None:
    # as above, but the refused setting is "b"'s power limit in r1: at the slowest level with the idle
    # cards asleep r1 draws 4 x 302 + 12 x 49 + 2200 = 3996 W > 3700 W; the old guard budgeted the 200 W
    # limits no command carries (3588 W)
    ctx = step_context(SITE, rack_extra_w=np.array([0.0, 7800.0]), held_limit_cards=B_R1)
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert drawn[1] > rack_measured_caps_w(SITE, CFG)[1]
    assert d.card_power_limit_w[list(B_R1)].tolist() == [700.0] * 4
    assert d.card_level[list(B_R1)].tolist() == [7] * 4  # their level is still sent
    not_held = [e for e in d.explanation if "cannot be held under its cap" in e]
    assert len(not_held) == 1 and not_held[0].startswith("guard: r1: ")
    assert "4 cards at a setting a refusal holds back" in not_held[0]
    assert d.guard_actions.count("cap_not_held") == 1


@pytest.mark.parametrize("held", [(16,), (16, 17, 18)])
def test_a_fail_safe_racks_card_limits_hold_its_cap_beside_limits_a_refusal_holds_back(held: tuple[int, ...]) -> None:
    """A fail-safe rack is held by its cards' power limits alone: a card whose limit a refusal holds back
    keeps the one it reports (700 W), so the others share what it leaves (15 x 581 + 700 + 2200 W would
    be over r1's 11.5 kW cap)."""
    blind = (1,)
    ctx = step_context(SITE, held_limit_cards=held, stale_racks=blind, blind_racks=blind, failsafe_racks=blind)
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    kept = _mask(held)
    limit = np.where(kept, np.asarray(SNAP.card_power_limit_w), d.card_power_limit_w)
    r1 = SITE.card_rack() == 1
    assert d.card_power_limit_w[kept].tolist() == [700.0] * len(held)
    assert float(limit[r1].sum()) + SITE.rack.host_overhead_w <= rack_measured_caps_w(SITE, CFG)[1] + 1e-6


def test_a_hot_card_whose_level_is_held_back_gets_the_power_limit_its_die_allows() -> None:
    # r0's inlet at 70 deg C: every die over 85 deg C until the power limit (85 - 70) / 0.053 = 283 W at the
    # slowest level; card 3 ("a") keeps level 0 (its level held back) and gets that limit like the others
    inlet = np.full(SITE.n_cards, 30.0)
    inlet[:16] = 70.0
    ctx = step_context(SITE, card_inlet_c=inlet, held_level_cards=(3,))
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    assert d.card_level[3] == 0 and d.card_level[[0, 1, 2, 4]].tolist() == [7] * 4
    assert d.card_power_limit_w[:16].tolist() == [283.0] * 16
    assert "die_not_held" not in d.guard_actions
    assert d.budget_rack_power_w == pytest.approx(drawn_rack_power_w(SITE, d, SNAP, ctx), rel=1e-12)


def test_a_hot_card_whose_power_limit_is_held_back_is_said_not_held() -> None:
    inlet = np.full(SITE.n_cards, 30.0)
    inlet[:16] = 70.0
    ctx = step_context(SITE, card_inlet_c=inlet, held_limit_cards=(3,))
    d = Guard(SITE, CFG).review(proposal(SITE, 0), SNAP, ctx)
    assert d.card_power_limit_w[3] == 700.0 and d.card_level[3] == 7  # slowed with its job, not limited
    lines = [e for e in d.explanation if e.startswith("guard: dies of job(s) a cannot be held")]
    assert len(lines) == 1 and "whose power limit a refusal holds back" in lines[0]
    assert d.budget_rack_power_w == pytest.approx(drawn_rack_power_w(SITE, d, SNAP, ctx), rel=1e-12)


N = SITE.n_cards
_CARDS = st.sets(st.integers(0, N - 1), max_size=12).map(lambda s: tuple(sorted(s)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    held_level=_CARDS,
    held_limit=_CARDS,
    held_sleep=_CARDS,
    refused=_CARDS,
    lv=st.lists(st.integers(0, 7), min_size=N, max_size=N),
    lp=st.lists(st.booleans(), min_size=N, max_size=N),
    reported_lv=st.lists(st.integers(0, 7), min_size=N, max_size=N),
    reported_lp=st.lists(st.booleans(), min_size=N, max_size=N),
    reported_lim=st.lists(st.sampled_from([200.0, 450.0, 700.0]), min_size=N, max_size=N),
    confirmed_lv=st.lists(st.integers(-1, 7), min_size=N, max_size=N),
    confirmed_lim=st.lists(st.sampled_from([np.nan, 200.0, 450.0, 700.0]), min_size=N, max_size=N),
    confirmed_lp=st.lists(st.sampled_from([np.nan, 0.0, 1.0]), min_size=N, max_size=N),
    extra=st.lists(st.floats(0.0, 8000.0), min_size=2, max_size=2),
    inlet=st.lists(st.floats(25.0, 70.0), min_size=2, max_size=2),
    stale=st.lists(st.booleans(), min_size=2, max_size=2),
    place=st.lists(st.integers(20, N - 1), min_size=4, max_size=4, unique=True),
)
def test_every_budget_is_what_the_cards_draw_with_held_settings_as_reported(
    held_level: tuple[int, ...],
    held_limit: tuple[int, ...],
    held_sleep: tuple[int, ...],
    refused: tuple[int, ...],
    lv: list[int],
    lp: list[bool],
    reported_lv: list[int],
    reported_lp: list[bool],
    reported_lim: list[float],
    confirmed_lv: list[int],
    confirmed_lim: list[float],
    confirmed_lp: list[float],
    extra: list[float],
    inlet: list[float],
    stale: list[bool],
    place: list[int],
) -> None:
    """Any proposal, any settings held back (per kind, idle or busy cards, with or without cards no command
    reaches), any levels, limits and low-power states the racks confirmed (or not): the guard's budget is
    what the racks will draw with the held kinds (and every kind on the refused cards) in force (as
    reported, or as confirmed where that draws more: ``guard_helpers.in_force``), each rack within its cap
    or said not held, no idle card whose sleep is held or that is refused woken or put to sleep (kept in
    its low-power state in force), and no job placed on a refused card."""
    busy = np.asarray(SNAP.card_job) >= 0
    snap = dataclasses.replace(
        SNAP,
        card_level=np.asarray(reported_lv, dtype=np.int64),
        card_low_power=np.asarray(reported_lp, dtype=bool) & ~busy,
        card_power_limit_w=np.asarray(reported_lim, dtype=np.float64),
    )
    blind = tuple(r for r, s in enumerate(stale) if s)
    ctx = step_context(
        SITE,
        refused_failed_cards=refused,
        held_level_cards=held_level,
        held_limit_cards=held_limit,
        held_sleep_cards=held_sleep,
        rack_extra_w=np.asarray(extra),
        card_inlet_c=np.asarray(inlet)[SITE.card_rack()],
        stale_racks=blind,
        blind_racks=blind,
        failsafe_racks=blind,
        applied_level=np.asarray(confirmed_lv, dtype=np.int64),
        applied_power_limit_w=np.asarray(confirmed_lim, dtype=np.float64),
        applied_low_power=np.asarray(confirmed_lp, dtype=np.float64),
    )
    planned = proposal(
        SITE,
        np.asarray(lv),
        card_low_power=np.asarray(lp, dtype=bool),
        placements=(PlacementOrder("q", tuple(place)),),
    )
    d = Guard(SITE, CFG).review(planned, snap, ctx)
    drawn = drawn_rack_power_w(SITE, d, snap, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-9)
    cap = rack_measured_caps_w(SITE, CFG)
    not_held = {e.split(":")[1].strip() for e in d.explanation if "cannot be held under its cap" in e}
    for r in range(SITE.n_racks):
        assert drawn[r] <= cap[r] + 1e-6 or SITE.rack_names[r] in not_held
    idle_kept = [c for c in set(held_sleep) | set(refused) if not d.card_busy[c]]
    assert (d.card_low_power[idle_kept] == in_force(snap, ctx)[2][idle_kept]).all()
    assert not any(c in refused for p in d.placements for c in p.cards)  # no placement on a refused card


# ---- through the command book: the refusal, the context, the guard and the commands ----------------

NOW = 100.0


def _book() -> tuple[CommandBook, wire.Codec]:
    codec = wire.Codec(wire.SiteLayout.from_spec(SITE, site="site1"))
    return CommandBook(SITE, codec, ControlConfig(command_ttl_s=30.0)), codec


def _refuse_sleep_of_r1_idle_cards(book: CommandBook, codec: wire.Codec) -> None:
    """A decision puts r1's idle cards to sleep; r1 refuses the command (not for a failed card)."""
    lp = np.zeros(N, dtype=bool)
    lp[list(IDLE_R1)] = True
    want = proposal(SITE, np.asarray(SNAP.card_level), card_low_power=lp, card_busy=np.asarray(SNAP.card_job) >= 0)
    (sleep,) = book.commands(want, SNAP, np.full(N, -1), NOW - 5.0)
    assert codec.decode(sleep.topic, sleep.payload).setting.action is wire.CardAction.LOW_POWER_IDLE  # type: ignore[union-attr]
    ack = wire.Acknowledgement("r1", uuid.UUID(sleep.command_id), wire.AckResult.REJECTED, NOW - 4.0, 0, "sim", "no")
    assert book.on_ack(ack, NOW - 4.0) is not None


@pytest.mark.parametrize("use_solver", [True, False])
def test_a_refused_sleep_is_neither_sent_nor_budgeted_while_it_is_held_back(use_solver: bool) -> None:
    """In process, as the service does it: the refusal holds the idle cards' sleep back, the controller's
    context says so, the decision keeps them awake (its budget is what r1 draws) and its commands carry
    no sleep to them; r1's cap is held by power limits."""
    book, codec = _book()
    _refuse_sleep_of_r1_idle_cards(book, codec)
    ctl = Controller(
        SITE,
        ControlConfig(
            control_placement=False, control_host_power=False, control_pump_speed=False, idle_reserve_cards=0
        ),
    )
    refused = book.unplaceable(np.asarray(SNAP.card_last_seen_s, dtype=np.float64), NOW)
    held = book.held_back(np.asarray(SNAP.card_failed, dtype=bool) | refused, NOW)
    assert np.flatnonzero(held[SLEEP]).tolist() == list(IDLE_R1) and not held[[LEVEL, LIMIT]].any()
    ctx = ctl.context(SNAP, NOW, refused_failed=refused, held_back=held)
    assert ctx.held_sleep_cards == IDLE_R1 and ctx.held_level_cards == () and ctx.held_limit_cards == ()
    ctx = dataclasses.replace(ctx, rack_extra_w=np.array([0.0, 7300.0]))
    d = ctl.review(ctl.propose(SNAP, ctx, use_solver=use_solver), SNAP, ctx)
    assert not d.card_low_power[list(IDLE_R1)].any()
    drawn = drawn_rack_power_w(SITE, d, SNAP, ctx)
    assert d.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    assert np.all(drawn <= rack_measured_caps_w(SITE, ctl.control) + 1e-6)
    sent = [codec.decode(c.topic, c.payload) for c in book.commands(d, SNAP, np.full(N, -1), NOW)]
    actions = {m.setting.action for m in sent if isinstance(m, wire.RackCommand) and m.rack == "r1"}
    assert wire.CardAction.LOW_POWER_IDLE not in actions and wire.CardAction.WAKE not in actions


def test_a_refusal_a_failed_card_explains_holds_nothing_back() -> None:
    """A rack refuses a command whole for one failed card: once a card of it reads (or is said) failed,
    the others' setting is sent again (``Overlays.lift_refusals_a_failure_explains``), so nothing is held
    back for the guard either."""
    book, codec = _book()
    _refuse_sleep_of_r1_idle_cards(book, codec)
    failed = np.zeros(N, dtype=bool)
    failed[25] = True
    assert not book.held_back(failed, NOW).any()
    assert book.held_back(np.zeros(N, dtype=bool), NOW)[SLEEP, list(IDLE_R1)].all()
    assert not book.held_back(np.zeros(N, dtype=bool), NOW + 26.0).any()  # 30 s from the refusal
