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
