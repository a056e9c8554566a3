"""``agent.decision``'s promises a mutation audit checked: which cards the agent cannot see
(``StepContext.unseen_card_mask``) and what that means for a decision (never placed on, woken or put
to sleep: docs/agent.md "Safety"), the statuses that count as fallbacks, and a decision's summary.

Scene (tests/agent/guard_helpers.py): rack r0 runs job "a" on cards 0-7 and "b" on 8-15, rack r1
runs "b" on cards 16-19 and has idle, awake cards 20-31; rack limit 12.5 kW, margin 1 kW, hosts
2.2 kW, 16 cards per rack, a card accepts 200-700 W."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from guard_helpers import proposal, scene, step_context

from agent.config import ControlConfig
from agent.decision import QueueWait, fell_back
from agent.guard import Guard

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)


def _asleep(n: int) -> np.ndarray:
    return np.ones(n, dtype=bool)


def test_unseen_cards_are_those_of_blind_racks_and_stuck_cards() -> None:
    site, _snap = scene()
    ctx = step_context(site, blind_racks=(0,), stuck_cards=(20, 31), failsafe_racks=(0, 1))
    unseen = ctx.unseen_card_mask(site.card_rack())
    assert np.flatnonzero(unseen).tolist() == [*range(16), 20, 31]
    # the blind mask alone is the racks' (a stuck card's rack is not blind)
    assert np.flatnonzero(ctx.blind_card_mask(site.card_rack())).tolist() == list(range(16))
    # nothing unseen when every rack reports
    assert not step_context(site).unseen_card_mask(site.card_rack()).any()


def test_idle_cards_of_a_blind_rack_are_not_put_to_sleep_on_stale_data() -> None:
    """Fails on the old guard (``lp | snap_lp``), which let a proposal sleep cards it cannot see."""
    site, snap = scene()
    ctx = step_context(site, stale_racks=(1,), blind_racks=(1,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(proposal(site, card_low_power=_asleep(site.n_cards)), snap, ctx)
    assert not d.card_low_power[20:].any()  # awake when last seen: kept awake


def test_a_stuck_idle_card_is_not_put_to_sleep_while_its_seen_neighbours_are() -> None:
    """Fails on the old guard (``lp | snap_lp``)."""
    site, snap = scene()
    ctx = step_context(site, stuck_cards=(25,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(proposal(site, card_low_power=_asleep(site.n_cards)), snap, ctx)
    assert not d.card_low_power[25]
    assert d.card_low_power[[20, 24, 26, 31]].all()  # seen idle cards sleep as proposed
    assert not d.card_low_power[:20].any()  # busy cards are awake


def test_a_blind_rack_over_its_cap_does_not_sleep_cards_it_cannot_see() -> None:
    """8 kW on r1's PDU that the twin does not explain leaves 12.5 - 1 - 8 = 3.5 kW for its cards and
    hosts: less than the hosts' 2.2 kW plus 16 cards at the lowest limit a card accepts (200 W), so
    the rack cannot be held. Putting its unseen idle cards to sleep is not the guard's lever there
    (it cannot see them); fails on the old guard, whose cap step slept them."""
    site, snap = scene()
    extra = np.array([0.0, 8000.0])
    ctx = step_context(site, stale_racks=(1,), blind_racks=(1,), failsafe_racks=(1,), rack_extra_w=extra)
    d = Guard(site, CFG).review(proposal(site), snap, ctx)
    assert not d.card_low_power[20:].any()
    assert any("cannot be held" in e for e in d.explanation)
    # a rack with only a stuck card still sleeps the idle cards it sees for the cap
    ctx2 = step_context(site, stuck_cards=(25,), failsafe_racks=(1,), rack_extra_w=extra)
    d2 = Guard(site, CFG).review(proposal(site), snap, ctx2)
    assert not d2.card_low_power[25]
    assert d2.card_low_power[[20, 24, 26, 31]].all()


def test_a_blind_cards_sleep_is_kept() -> None:
    site, snap = scene()
    lp = snap.card_low_power.copy()
    lp[[21, 22]] = True
    asleep = dataclasses.replace(snap, card_low_power=lp)
    ctx = step_context(site, stale_racks=(1,), blind_racks=(1,), failsafe_racks=(1,))
    d = Guard(site, CFG).review(proposal(site), asleep, ctx)  # the plan wakes every card
    assert d.card_low_power[[21, 22]].all()
    assert not d.card_low_power[[20, 23]].any()


# ---- fell_back, QueueWait and the summary (agent.decision's docstrings) -----------------------------


def test_a_fallback_is_a_decisions_own_solve_that_was_late_failed_or_infeasible() -> None:
    assert not fell_back("optimal", "milp") and not fell_back("feasible", "milp")
    assert fell_back("fallback", "greedy") and fell_back("infeasible", "milp") and fell_back("time_limit", "hold")
    # an incremental adjustment makes no solve: not a fallback, whatever plan it adjusts
    assert not fell_back("fallback", "incremental") and not fell_back("infeasible", "incremental")


def test_a_queue_wait_has_one_of_the_known_kinds() -> None:
    assert QueueWait("no_window", "x").kind == "no_window"
    with pytest.raises(ValueError, match=r"QueueWait\.kind"):
        QueueWait("bored", "x")


def test_the_summary_counts_live_cards_names_racks_and_lists_at_most_16_queue_waits() -> None:
    site, _snap = scene()
    n = site.n_cards
    busy = np.zeros(n, dtype=bool)
    busy[:10] = True
    failed = np.zeros(n, dtype=bool)
    failed[[0, 20]] = True  # a failed busy card and a failed idle one: counted nowhere
    level = np.full(n, 7, dtype=np.int64)
    level[:4] = 2
    low = np.zeros(n, dtype=bool)
    low[[20, 21, 22]] = True
    limit = np.full(n, site.card.power_limit_w)
    limit[[0, 5, 6]] = 500.0  # card 0 failed: 2 capped cards
    waits = {f"j{i:02d}": QueueWait("no_window" if i % 3 else "no_spec", f"why {i}") for i in range(20)}
    d = proposal(
        site,
        card_level=level,
        card_busy=busy,
        card_failed=failed,
        card_low_power=low,
        card_power_limit_w=limit,
        max_power_limit_w=site.card.power_limit_w,
        failsafe_racks=(1,),
        rack_pump_speed_frac=np.array([0.5, 1.0]),
        host_off=np.array([True, False, True, False]),
        queue_waits=waits,
    )
    s = d.summary(("left", "right"))
    assert s["busy_cards"] == 9 and s["low_power_cards"] == 2 and s["capped_cards"] == 2
    assert s["busy_levels"] == {"2": 3, "7": 6}  # cards 1-3 at level 2, 4-9 at level 7
    assert s["failsafe_racks"] == ["right"]
    assert s["pump_speed_pct"] == [50.0, 100.0]
    assert s["hosts_off"] == 2
    assert len(s["queue_waits"]) == 16 and s["queue_waits"]["j01"] == "no_window: why 1"
    assert s["queue_waits_by_kind"] == {"no_spec": 7, "no_window": 13} == d.queue_wait_counts()
    assert proposal(site).summary()["hosts_off"] is None and proposal(site).summary()["pump_speed_pct"] is None
