"""The rack power the twin does not explain (``agent.unexplained_power.UnexplainedPower``): the PDU's
power above the cards and hosts, and the cards' power above the twin's model of their work, each
smoothed (0.3 per step) and budgeted beyond a 300 W dead band; a rise of a card's part is taken once
two readings in a row show it, a fall slowly; fail-safe racks and readings that are not new keep theirs."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np
import pytest
from agent_helpers import belief, example_site, job, small_site

from agent.load import SiteLoad, model_gap_w, site_load
from agent.unexplained_power import UnexplainedPower
from twin.state import StateSnapshot, TwinState

pytestmark = pytest.mark.agent

SITE = small_site()  # 2 racks of 16 cards, 2200 W of host overhead per rack
N = SITE.n_cards
OVERHEAD_W = SITE.rack.host_overhead_w


@cache
def computing() -> StateSnapshot:
    """Jobs "a" (cards 0-7) and "b" (cards 8-11) computing on rack 0 at t = 90 s; rack 1 idle."""
    _plant, state = belief(SITE, [job("a", 8, checkpoint_interval_s=1e9), job("b", 4, checkpoint_interval_s=1e9)], 90)
    snap = state.snapshot()
    assert [(j.job_id, j.cards) for j in snap.jobs] == [("a", tuple(range(8))), ("b", tuple(range(8, 12)))]
    return snap


def pdu_reading(card_w: float, rack_excess_w: tuple[float, float], **changes: Any) -> StateSnapshot:
    """Every card reading ``card_w``; each rack's PDU its cards' readings plus the host overhead plus
    ``rack_excess_w``; ``changes`` replace fields."""
    snap = computing()
    power = np.full(N, card_w)
    pdu = np.array([16 * card_w + OVERHEAD_W + rack_excess_w[0], 16 * card_w + OVERHEAD_W + rack_excess_w[1]])
    return dataclasses.replace(snap, card_power_w=power, rack_power_w=pdu, **changes)


def test_the_pdu_part_is_smoothed_and_budgeted_beyond_its_dead_band() -> None:
    up = UnexplainedPower(SITE)
    snap = pdu_reading(500.0, (1000.0, -500.0))  # rack 1's PDU reads below its cards and hosts: nothing
    up.update_pdu(snap, ())
    np.testing.assert_allclose(up.budget_w(), [0.0, 0.0])  # 0.3 x 1000 = 300: within the dead band
    up.update_pdu(snap, ())
    np.testing.assert_allclose(up.budget_w(), [0.7 * 300.0 + 0.3 * 1000.0 - 300.0, 0.0])  # 210 W
    for _ in range(60):
        up.update_pdu(snap, ())
    np.testing.assert_allclose(up.budget_w(), [700.0, 0.0], atol=1e-3)
    # the excess gone, it falls as slowly as it rose
    up.update_pdu(pdu_reading(500.0, (0.0, 0.0)), ())
    np.testing.assert_allclose(up.budget_w(), [0.7 * 1000.0 - 300.0, 0.0], atol=1e-3)
    # rack 1's PDU read below its cards and hosts for long: that is no credit against a real excess
    up.update_pdu(pdu_reading(500.0, (0.0, 1000.0)), ())
    up.update_pdu(pdu_reading(500.0, (0.0, 1000.0)), ())
    assert up.budget_w()[1] == pytest.approx(210.0)
    # nor is a PDU reading below its cards and hosts a credit against an excess already measured:
    # it counts as no excess, the part falling as slowly as ever (0.7 x 1000 = 700, not 0.7 x 1000 - 300)
    for _ in range(60):
        up.update_pdu(pdu_reading(500.0, (1000.0, 0.0)), ())
    up.update_pdu(pdu_reading(500.0, (-1000.0, 0.0)), ())
    assert up.budget_w()[0] == pytest.approx(0.7 * 1000.0 - 300.0, abs=1e-3)  # 400 W


def test_failed_cards_and_cards_without_a_reading_count_for_nothing_in_the_pdu_part() -> None:
    up = UnexplainedPower(SITE)
    failed = np.zeros(N, dtype=bool)
    failed[5] = True
    snap = pdu_reading(500.0, (0.0, 0.0), card_failed=failed)
    snap.card_power_w[6] = np.nan
    up.update_pdu(snap, ())  # rack 0: two cards' 1000 W are not the cards' (PDU over 14 cards + hosts)
    up.update_pdu(snap, ())
    np.testing.assert_allclose(up.budget_w(), [210.0, 0.0])


def test_a_failsafe_rack_or_one_without_a_pdu_reading_keeps_its_pdu_part() -> None:
    up = UnexplainedPower(SITE)
    snap = pdu_reading(500.0, (2000.0, 2000.0))
    up.update_pdu(snap, ())
    up.update_pdu(snap, ())
    kept = 0.7 * 600.0 + 0.3 * 2000.0 - 300.0  # 720 W
    np.testing.assert_allclose(up.budget_w(), [kept, kept])
    gone = pdu_reading(500.0, (0.0, 0.0))
    gone.rack_power_w[1] = np.nan
    up.update_pdu(gone, (0,))  # rack 0 at fail-safe caps, rack 1 without a PDU reading
    np.testing.assert_allclose(up.budget_w(), [kept, kept])
    up.update_pdu(gone, (1,))
    np.testing.assert_allclose(up.budget_w(), [0.7 * 1020.0 - 300.0, kept])


def test_a_host_reported_off_draws_its_off_power_instead_of_its_share_of_the_overhead() -> None:
    site = example_site()  # 8 racks of 64 cards, hosts of 8 cards managed
    assert site.hosts_managed and site.cards_per_host == 8
    saving_w = site.host_saving_w()
    assert saving_w > 0
    off = np.zeros(site.n_cards, dtype=bool)
    off[64:72] = True  # one host of rack 1 off: its cards draw nothing
    power = np.where(off, 0.0, 600.0)
    cards_w = np.array([64 * 600.0, 56 * 600.0, *([64 * 600.0] * 6)])
    hosts_w = np.full(site.n_racks, site.rack.host_overhead_w)
    hosts_w[1] -= saving_w
    snap = dataclasses.replace(
        TwinState(site).snapshot(), card_power_w=power, card_host_off=off, rack_power_w=cards_w + hosts_w + 1000.0
    )
    up = UnexplainedPower(site)
    up.update_pdu(snap, ())
    up.update_pdu(snap, ())
    np.testing.assert_allclose(up.budget_w(), np.full(site.n_racks, 210.0))  # every rack alike


def card_reading(load: SiteLoad, gap_w: dict[int, float], seen_s: float) -> StateSnapshot:
    """The cards of computing jobs read at ``seen_s``, each ``gap_w[card]`` (0 elsewhere) above the
    twin's power model of its work at the settings in force."""
    snap = computing()
    gap0 = np.nan_to_num(model_gap_w(SITE, snap, load, np.ones(N, dtype=bool)))
    want = np.zeros(N)
    for c, g in gap_w.items():
        want[c] = g
    power = snap.card_power_w - gap0 + want
    return dataclasses.replace(snap, card_power_w=power, card_last_seen_s=np.full(N, seen_s))


def test_a_cards_rise_is_taken_once_two_readings_show_it_and_a_fall_slowly() -> None:
    load = site_load(SITE, computing())
    seen = np.ones(N, dtype=bool)
    up = UnexplainedPower(SITE)
    up.update_cards(card_reading(load, {}, 91.0), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [0.0, 0.0])
    up.update_cards(card_reading(load, {0: 1000.0}, 92.0), load, seen, set())  # one reading: a level change
    np.testing.assert_allclose(up.budget_w(), [0.0, 0.0])
    up.update_cards(card_reading(load, {0: 1000.0}, 93.0), load, seen, set())  # two in a row: taken at once
    np.testing.assert_allclose(up.budget_w(), [700.0, 0.0])
    up.update_cards(card_reading(load, {0: 0.0}, 94.0), load, seen, set())  # a fall: smoothed
    np.testing.assert_allclose(up.budget_w(), [0.7 * 1000.0 - 300.0, 0.0])
    # no new reading (same time), a fail-safe rack or a card not seen: the card keeps its part
    up.update_cards(card_reading(load, {0: 0.0}, 94.0), load, seen, set())
    up.update_cards(card_reading(load, {0: 0.0}, 95.0), load, seen, {0})
    unseen = seen.copy()
    unseen[0] = False
    up.update_cards(card_reading(load, {0: 0.0}, 96.0), load, unseen, set())
    np.testing.assert_allclose(up.budget_w(), [400.0, 0.0])


def test_the_cards_part_of_a_rack_sums_its_busy_cards_and_is_dropped_when_another_job_takes_a_card() -> None:
    load = site_load(SITE, computing())
    seen = np.ones(N, dtype=bool)
    up = UnexplainedPower(SITE)
    high = {0: 500.0, 1: 500.0, 8: 500.0}
    for t in (91.0, 92.0):
        up.update_cards(card_reading(load, high, t), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [1200.0, 0.0])
    # job "a" leaves its cards to job "a2": the gaps measured on "a" are not "a2"'s
    moved = SiteLoad(
        jobs=(dataclasses.replace(load.jobs[0], job_id="a2"), load.jobs[1]), card_job=load.card_job, failed=load.failed
    )
    up.update_cards(card_reading(load, high, 92.0), moved, seen, set())  # no new reading yet
    np.testing.assert_allclose(up.budget_w(), [200.0, 0.0])  # card 8's only
    # "a2"'s first reading of card 0 has no earlier one of its job to compare with: taken alone
    # (1500 W, not what "a"'s last reading of 500 W and it both show)
    up.update_cards(card_reading(load, {0: 1500.0, 8: 500.0}, 93.0), moved, seen, set())
    np.testing.assert_allclose(up.budget_w(), [1500.0 + 500.0 - 300.0, 0.0])
    # job "b" ends (and "a" holds card 0 again: "a2"'s part is dropped): nothing budgeted
    ended = SiteLoad(jobs=load.jobs[:1], card_job=np.where(load.card_job == 1, -1, load.card_job), failed=load.failed)
    up.update_cards(card_reading(load, high, 92.0), ended, seen, set())
    np.testing.assert_allclose(up.budget_w(), [0.0, 0.0])


def test_a_further_rise_also_needs_two_readings_and_a_failsafe_reading_is_not_one_of_them() -> None:
    load = site_load(SITE, computing())
    seen = np.ones(N, dtype=bool)
    up = UnexplainedPower(SITE)
    for t in (91.0, 92.0):
        up.update_cards(card_reading(load, {0: 1000.0}, t), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [700.0, 0.0])
    # a rise on top of a part held: one reading is a level change, the part stays at what both show
    up.update_cards(card_reading(load, {0: 2000.0}, 93.0), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [700.0, 0.0])
    up.update_cards(card_reading(load, {0: 2000.0}, 94.0), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [1700.0, 0.0])
    # card 1 reads 1000 W above the model while its rack is at fail-safe caps: that reading is no
    # observation, so the next one alone does not show a rise
    up.update_cards(card_reading(load, {0: 2000.0}, 95.0), load, seen, set())
    up.update_cards(card_reading(load, {0: 2000.0, 1: 1000.0}, 96.0), load, seen, {0})
    up.update_cards(card_reading(load, {0: 2000.0, 1: 1000.0}, 97.0), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [1700.0, 0.0])
    up.update_cards(card_reading(load, {0: 2000.0, 1: 1000.0}, 98.0), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [2700.0, 0.0])


def test_a_card_below_the_model_offsets_its_racks_cards_part_slowly_but_never_its_pdu_part() -> None:
    load = site_load(SITE, computing())
    seen = np.ones(N, dtype=bool)
    up = UnexplainedPower(SITE)
    # card 0 1000 W above the model, card 1 500 W below: the rack's cards draw their sum above it;
    # card 1's fall from 0 is smoothed: 0.3 x -500 = -150, then 0.7 x -150 + 0.3 x -500 = -255
    for t in (91.0, 92.0):
        up.update_cards(card_reading(load, {0: 1000.0, 1: -500.0}, t), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [1000.0 - 255.0 - 300.0, 0.0])  # 445 W
    for t in range(93, 153):
        up.update_cards(card_reading(load, {0: 1000.0, 1: -500.0}, float(t)), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [1000.0 - 500.0 - 300.0, 0.0], atol=1e-3)  # 200 W
    # a rack whose cards draw less than the model: no credit against what its PDU shows
    up2 = UnexplainedPower(SITE)
    for t in (91.0, 92.0):  # card 0: -300, then 0.7 x -300 + 0.3 x -1000 = -510
        up2.update_cards(card_reading(load, {0: -1000.0}, t), load, seen, set())
    up2.update_pdu(pdu_reading(500.0, (4000.0, 0.0)), ())  # 0.3 x 4000 = 1200 W
    np.testing.assert_allclose(up2.budget_w(), [900.0, 0.0])
    assert up2.notes(1000.0) == [
        f"{SITE.rack_names[0]} draws 1.20 kW more than the twin predicts at the settings in force (its cards "
        "0.00 kW beyond the power model of their work, its PDU 1.20 kW beyond its cards and hosts): budgeted"
    ]


def test_after_the_clock_went_back_earlier_readings_are_new() -> None:
    load = site_load(SITE, computing())
    seen = np.ones(N, dtype=bool)
    up = UnexplainedPower(SITE)
    for t in (91.0, 92.0):
        up.update_cards(card_reading(load, {0: 1000.0}, t), load, seen, set())
    up.update_cards(card_reading(load, {0: 0.0}, 10.0), load, seen, set())  # older than the last: not new
    np.testing.assert_allclose(up.budget_w(), [700.0, 0.0])
    up.clock_went_back()
    up.update_cards(card_reading(load, {0: 0.0}, 10.0), load, seen, set())
    np.testing.assert_allclose(up.budget_w(), [400.0, 0.0])


def test_notes_name_the_racks_drawing_more_than_the_margin_above_the_twin() -> None:
    load = site_load(SITE, computing())
    up = UnexplainedPower(SITE)
    for t in (91.0, 92.0):
        up.update_cards(card_reading(load, {0: 600.0}, t), load, np.ones(N, dtype=bool), set())
    up.update_pdu(pdu_reading(500.0, (2000.0, 0.0)), ())  # 600 W of the PDU's part
    assert up.notes(1000.0) == [
        f"{SITE.rack_names[0]} draws 1.20 kW more than the twin predicts at the settings in force (its cards "
        "0.60 kW beyond the power model of their work, its PDU 0.60 kW beyond its cards and hosts): budgeted"
    ]
    assert up.notes(1200.0) == []
    np.testing.assert_allclose(up.budget_w(), [600.0, 0.0])  # each part beyond its own dead band
