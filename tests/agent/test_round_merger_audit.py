"""Mutation audit of the round merger (``agent.round_merger.RoundMerger``): the window of a round (anchored
at its earliest part, 0.25 s wide, its edge included), the stamps of a merged round and rack, the order in
which late parts and the rounds they overtook reach the estimator (it drops a rack's reading stamped
before one it took), a rack's second reading of a part never merged over its first and sent after or
before it by that part's stamps (not the round's newest), one late round per window, a rack's host
batches joined across its CDU's own stamp, and the old timeline's facility reading when the clock steps
back. Each test failed on a mutant of the merger that the other tests let pass."""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import example_site
from test_clock_ingest import T0, _cdu, cards_msg
from test_rounds_with_clock_offsets import _host_batches

from agent.clock import SiteClock
from agent.ingest import Ingest
from agent.round_merger import ROUND_TOLERANCE_S, RoundMerger
from twin.readings import CardBatch, FacilityReading, LoopReading, PduReading, RackReading, Readings
from twin.state import TwinState

pytestmark = pytest.mark.agent


def _pdu(rack: int, t: float) -> RackReading:
    return RackReading(rack=rack, time_s=t, pdu=PduReading(40_000.0))


def _round(*racks: RackReading, facility: FacilityReading | None = None) -> Readings:
    return Readings(time_s=max(rr.time_s for rr in racks), racks=racks, facility=facility)


def _racks(rounds: list[Readings]) -> list[list[tuple[int, float]]]:
    """Each round's racks as (rack, stamp - T0), stamps rounded to the millisecond."""
    return [[(rr.rack, round(rr.time_s - T0, 3)) for rr in r.racks] for r in rounds]


def test_a_part_stamped_the_tolerance_after_the_rounds_first_is_of_that_round() -> None:
    assert ROUND_TOLERANCE_S == 0.25
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0), _pdu(1, T0 + 0.25))) == []
    assert _racks(merger.add(_round(_pdu(0, T0 + 1.0)))) == [[(0, 0.0), (1, 0.25)]]


def test_the_window_is_anchored_at_the_earliest_part_of_a_flush_whatever_the_order_of_its_racks() -> None:
    """Parts stamped T0 + 0.2 (r0), T0 (r1) and T0 + 0.4 (r2) in one flush: the round is T0's, r0 joins it,
    r2 (0.4 s after its first part) begins the next. Anchored at the first rack's part, all three made one
    round 0.4 s wide."""
    merger = RoundMerger()
    out = merger.add(_round(_pdu(0, T0 + 0.2), _pdu(1, T0), _pdu(2, T0 + 0.4)))
    assert _racks(out) == [[(0, 0.2), (1, 0.0)]]
    assert merger.held_s == T0 + 0.4


def test_a_part_merged_late_into_its_round_leaves_the_round_and_its_rack_at_their_newest_stamp() -> None:
    """r0's PDU stamped T0 + 0.01 is held; r0's loop stamped T0 then r1's stamped T0 + 0.005 come later (a
    rack's CDU behind its PDU on the way): both join the round, whose stamp (what the estimator's time
    follows) stays its newest part's, T0 + 0.01, as does r0's reading's; each part keeps its own stamp."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0 + 0.01))) == []
    loop = RackReading(rack=0, time_s=T0, loop=LoopReading(30.0, 40.0, 128.0, 100.0))
    assert merger.add(_round(loop)) == []
    assert merger.held_s == T0 + 0.01
    assert merger.add(_round(_pdu(1, T0 + 0.005))) == []
    assert merger.held_s == T0 + 0.01
    (r,) = merger.add(_round(_pdu(0, T0 + 1.0)))
    assert r.time_s == T0 + 0.01
    r0 = r.racks[0]
    assert (r0.time_s, r0.part_time_s("pdu"), r0.part_time_s("loop")) == (T0 + 0.01, T0 + 0.01, T0)


def test_a_racks_reading_stamped_between_the_rounds_first_and_newest_parts_goes_out_before_the_round() -> None:
    """The round held has r1 at T0 and r0 at T0 + 0.1; r0's PDU stamped T0 + 0.05 arrives (reordered): it
    clashes with r0's part held, and it is older than the round's newest part, so it goes out at once and
    the estimator gets r0's readings in the order of their stamps (given after T0 + 0.1, it dropped it as
    late). Taken for the next round's, it completed the round held and went out after it."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(1, T0), _pdu(0, T0 + 0.1))) == []
    out = merger.add(_round(_pdu(0, T0 + 0.05)))
    out += merger.drain()
    assert _racks(out) == [[(0, 0.05)], [(0, 0.1), (1, 0.0)]]


def test_late_parts_of_one_window_go_out_in_one_round_before_the_round_they_arrived_with() -> None:
    """The round held is T0 + 1's (r0). One flush brings r1 and r2 stamped T0 and T0 + 0.1 (late: one round
    for the estimator, not one each) and r0 at T0 + 2 (the next round's: the one held is complete). The
    estimator gets the late round first, then the one held: in the order of their stamps."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0 + 1.0))) == []
    out = merger.add(_round(_pdu(0, T0 + 2.0), _pdu(1, T0), _pdu(2, T0 + 0.1)))
    assert _racks(out) == [[(1, 0.0), (2, 0.1)], [(0, 1.0)]]
    assert merger.held_s == T0 + 2.0


def test_a_late_reading_and_the_round_it_overtook_go_out_in_the_order_of_their_stamps() -> None:
    """The round held has r0 at T0 + 1; one flush brings r0's reading stamped T0 + 0.9 (late, reordered)
    and r1's at T0 + 2 (the next round's). Both rounds go out at once: r0's T0 + 0.9 first (after its
    T0 + 1 the estimator drops it as late)."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0 + 1.0))) == []
    out = merger.add(_round(_pdu(0, T0 + 0.9), _pdu(1, T0 + 2.0)))
    assert _racks(out) == [[(0, 0.9)], [(0, 1.0)]]


def test_a_rack_sending_its_cards_per_host_with_its_cdu_stamped_apart_is_one_round_a_second() -> None:
    """Rack r0 sends its cards in two batches stamped alike (one per host) and its CDU reading 3 ms after
    them: the ingest flushes at the second batch, so the merger gets r0's first batch and CDU, then its
    second batch, stamped apart from the rack's newest part. The cards of both batches are stamped alike:
    they are joined, and the estimator gets one round a second with r0's 64 cards, not two."""
    site = example_site()
    merger = RoundMerger()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    for i in range(3):
        t = T0 + i
        first, second = _host_batches("r0", t)
        ing.handle(first)
        ing.handle(_cdu("r0", t + 0.003))
        ing.handle(second)
        ing.flush()
    rounds += merger.drain()
    assert len(rounds) == 3
    for i, r in enumerate(rounds):
        (r0,) = r.racks
        assert r0.cards is not None and sorted(r0.cards.card_index.tolist()) == list(range(64))
        assert r0.part_time_s("cards") == T0 + i and r0.part_time_s("loop") == pytest.approx(T0 + i + 0.003)


def _cards_reaching_the_estimator(rounds: list[Readings], rack: int) -> list[tuple[float, float]]:
    """``rack``'s card readings in what the estimator was given, in order: (stamp - T0, die temperature)."""
    return [
        (round(rr.part_time_s("cards") - T0, 3), float(rr.cards.die_temp_c[0]))
        for r in rounds
        for rr in r.racks
        if rr.rack == rack and rr.cards is not None
    ]


@pytest.mark.parametrize("other_rack_s", [None, 1.01])
def test_a_racks_cards_overtaken_by_its_next_cdu_reading_reach_the_estimator_in_order(
    other_rack_s: float | None,
) -> None:
    """r0's cards at T0, then its CDU reading at T0 + 1 (ahead of its cards of T0 + 1 on the way), then
    those cards: the ingest flushes at the second batch, {cards T0, loop T0 + 1} then {cards T0 + 1},
    two readings stamped alike (the newest of their parts). Both card readings reach the estimator, in
    the order of their stamps. Taken as one reading of one stamp, the newer cards replaced the older:
    the estimator never got them. ``other_rack_s``: r1's cards, stamped 10 ms after r0's (its clock
    ahead), come in between; judged against the round's newest part, r0's cards of T0 + 1 went out as
    late, before those of T0, which the estimator then dropped as late."""
    site = example_site()
    merger = RoundMerger()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    ing.handle(cards_msg("r0", T0, temp_c=np.full(64, 50.0)))
    ing.handle(_cdu("r0", T0 + 1.0))
    if other_rack_s is not None:
        ing.handle(cards_msg("r1", T0 + other_rack_s))
    ing.handle(cards_msg("r0", T0 + 1.0, temp_c=np.full(64, 51.0)))
    ing.flush()
    ing.handle(cards_msg("r0", T0 + 2.0, temp_c=np.full(64, 52.0)))
    ing.flush()
    rounds += merger.drain()
    assert _cards_reaching_the_estimator(rounds, 0) == [(0.0, 50.0), (1.0, 51.0), (2.0, 52.0)]
    assert [rr.part_time_s("loop") for r in rounds for rr in r.racks if rr.loop is not None] == [T0 + 1.0]


def test_a_racks_next_reading_stamped_before_another_racks_part_of_the_round_goes_out_after_it() -> None:
    """The round held has r0's PDU at T0 and r1's at T0 + 0.15 (its clock ahead); r0's next PDU reading,
    at T0 + 0.1 (a rack that reads more often than the window), clashes with r0's: it is r0's next, not a
    late one, and the estimator gets r0's readings in the order of their stamps. Judged against the
    round's newest part (r1's), it went out first and r0's at T0 was dropped as late."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0), _pdu(1, T0 + 0.15))) == []
    out = merger.add(_round(_pdu(0, T0 + 0.1)))
    out += merger.drain()
    assert _racks(out) == [[(0, 0.0), (1, 0.15)], [(0, 0.1)]]


def test_when_the_clock_steps_back_the_old_timelines_facility_reading_goes_out_with_its_round() -> None:
    """The merger holds r0's round at T0 + 10 when the clock steps back to T0 + 5; the flush brings r1
    stamped T0 + 4 (the new timeline) and the facility's reading stamped T0 + 10.1 (the old one's): that
    goes out with the old timeline's round, and the new timeline's round held is r1's, at T0 + 4. Kept on
    the new side, it anchored a round 6 s ahead of the new timeline, and every new part went out as late."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0 + 10.0))) == []
    fac = FacilityReading(T0 + 10.1, 20.0, 30.0, 38.0, 10_000.0, 300_000.0, 320_000.0, 30.0)
    out, new = merger.step_back(_round(_pdu(1, T0 + 4.0), facility=fac), T0 + 5.0)
    assert _racks(out) == [[(0, 10.0)]] and out[0].facility is fac
    assert new == [] and merger.held_s == T0 + 4.0
    (r,) = merger.add(_round(_pdu(1, T0 + 5.0)))
    assert _racks([r]) == [[(1, 4.0)]] and r.facility is None
    assert merger.held_s == T0 + 5.0


def test_a_host_batch_delivered_twice_reaches_the_estimator_once_per_card() -> None:
    """Rack r0 sends its cards in two batches stamped alike (one per host), and the broker delivers the
    second one twice (QoS 1): the ingest flushes at the copy, and the merger joins the copy with the
    round's batches. The estimator gets r0's 64 cards once each, a round a second. Joined with all the
    cards held, the copied host's 32 cards reached it twice (96 entries)."""
    site = example_site()
    merger = RoundMerger()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    for i in range(2):
        first, second = _host_batches("r0", T0 + i)
        for msg in (first, second, second):
            ing.handle(msg)
        ing.flush()
    rounds += merger.drain()
    assert len(rounds) == 2
    for r in rounds:
        (r0,) = r.racks
        assert r0.cards is not None and sorted(r0.cards.card_index.tolist()) == list(range(64))


def test_the_facilitys_next_reading_within_the_window_goes_out_after_its_first_and_a_copy_is_merged() -> None:
    """The round held has r0's PDU and the facility's reading at T0. A copy of the facility's reading (the
    same stamp) merges into it; its next reading, at T0 + 0.1 (a facility that reads more often than the
    window), completes it: the estimator gets both facility readings, in the order of their stamps. Merged
    over the first, the facility's reading of T0 never reached the estimator; the copy refused, it went out
    in a round of its own."""
    merger = RoundMerger()
    fac = FacilityReading(T0, 20.0, 30.0, 38.0, 10_000.0, 300_000.0, 320_000.0, 30.0)
    assert merger.add(_round(_pdu(0, T0), facility=fac)) == []
    assert merger.add(Readings(time_s=T0, racks=(), facility=fac)) == []
    nxt = FacilityReading(T0 + 0.1, 20.0, 30.0, 38.0, 10_000.0, 300_000.0, 320_000.0, 30.0)
    out = merger.add(Readings(time_s=T0 + 0.1, racks=(), facility=nxt))
    out += merger.drain()
    assert [(_racks([r])[0], r.facility) for r in out] == [([(0, 0.0)], fac), ([], nxt)]


def test_a_late_reading_goes_out_before_the_round_it_was_late_to_when_the_same_flush_completes_it() -> None:
    """The round held has r1 at T0 and r0 at T0 + 0.1; one flush brings r0's PDU stamped T0 + 0.05 (late: it
    clashes with r0's part held and is stamped before it) and r2's at T0 + 1 (the next round's: the one held
    is complete). r0's T0 + 0.05 goes out first, as it does when the two come in separate flushes. Ordered
    by the stamps of the rounds' first parts, the round held (T0) went out before it, and the estimator,
    given r0's T0 + 0.1 first, dropped r0's T0 + 0.05 as late."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(1, T0), _pdu(0, T0 + 0.1))) == []
    out = merger.add(_round(_pdu(0, T0 + 0.05), _pdu(2, T0 + 1.0)))
    assert _racks(out) == [[(0, 0.05)], [(0, 0.1), (1, 0.0)]]
    assert merger.held_s == T0 + 1.0


def test_late_parts_of_two_windows_go_out_in_one_round_per_window() -> None:
    """The round held is T0 + 5's (r0). One flush brings r1 at T0, r2 at T0 + 1 and r3 at T0 + 1.1, all late:
    the estimator gets two late rounds (T0's; T0 + 1's with r2 and r3), oldest first, not one per part."""
    merger = RoundMerger()
    assert merger.add(_round(_pdu(0, T0 + 5.0))) == []
    out = merger.add(_round(_pdu(1, T0), _pdu(2, T0 + 1.0), _pdu(3, T0 + 1.1)))
    assert _racks(out) == [[(1, 0.0)], [(2, 1.0), (3, 1.1)]]
    assert merger.held_s == T0 + 5.0


def _host_cards(cards: range, *, host_off: bool) -> CardBatch:
    """A batch of one host's cards, its host powered off or on (its cards asleep where off)."""
    n = len(cards)
    off = np.full(n, host_off)
    zeros = np.zeros(n)
    return CardBatch(
        card_index=np.asarray(cards, dtype=np.int64),
        power_w=np.where(off, 0.0, 300.0),
        die_temp_c=np.full(n, 40.0),
        clock_mhz=np.where(off, 0.0, 1980.0),
        utilization=zeros,
        level=np.zeros(n, dtype=np.int64),
        low_power=off.copy(),
        waking=np.zeros(n, dtype=bool),
        power_limit_w=np.full(n, 700.0),
        failed=np.zeros(n, dtype=bool),
        host_off=off,
    )


def test_joined_host_batches_keep_each_cards_host_off_with_it() -> None:
    """Rack r0's two host batches stamped alike, the first host on (cards 0-31), the second powered off
    (32-63), come in two flushes: joined, each card keeps its own host's ``host_off``. Joined in the other
    order, cards 0-31 were read as on a powered-off host and 32-63 as on a running one."""
    merger = RoundMerger()
    assert merger.add(_round(RackReading(rack=0, time_s=T0, cards=_host_cards(range(32), host_off=False)))) == []
    assert merger.add(_round(RackReading(rack=0, time_s=T0, cards=_host_cards(range(32, 64), host_off=True)))) == []
    ((r0,),) = [r.racks for r in merger.drain()]
    assert r0.cards is not None and r0.cards.host_off is not None
    off = dict(zip(r0.cards.card_index.tolist(), r0.cards.host_off.tolist(), strict=True))
    assert off == {c: c >= 32 for c in range(64)}
