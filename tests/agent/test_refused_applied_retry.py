"""The applied states refused as older than the one taken and tried again when the site clock goes back to a
new timeline (``agent.refused_applied``, ``AppliedStates.clock_stepped_back``): every one refused is kept
with its cards (up to ``REFUSED_KEPT_PER_RACK`` per rack), not only the newest-stamped of its rack. In process
on the example site (rack r0's cards 0-63; level 0 is the top clock, level 5 1430 MHz); the old run confirmed
level 5 at T0 + 9 and the site restarts about 600 s behind (``test_ingest_order``'s helpers)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from agent_helpers import example_site
from test_clock_ingest import T0, FakeWall, _applied, _rack_applied, cards_msg
from test_ingest_order import _r0_confirmed_5, _restart_behind

from agent import wire
from agent.applied_states import RETRY_AHEAD_S
from agent.clock import SiteClock
from agent.ingest import Ingest
from agent.refused_applied import REFUSED_KEPT_PER_RACK, RefusedApplied
from twin.state import TwinState

pytestmark = pytest.mark.agent

LEVEL_5_MHZ = 1430.0  # what r0's cards read on both timelines: it disproves none of the levels confirmed here


def _r0_applied(cards: range, ts_s: float, level: int, *, seq: int = 0, publisher: str = "sim") -> wire.AppliedState:
    """Rack r0's applied state for ``cards`` (rack-local), all at ``level``."""
    msg = _applied("r0", list(cards), [level] * len(cards), ts_s)
    return dataclasses.replace(msg, seq=seq, publisher=publisher)


def test_a_restarted_racks_refused_applied_states_for_different_cards_are_all_taken_once_the_clock_follows() -> None:
    """The restarted rack confirms its cards in two applied states (one per command: cards 0-31 at level 0,
    then 32-63 at level 2), both refused while the site clock is still the old run's. Once the clock has
    followed the new timeline back, both are taken. Only the newest-stamped used to be kept: cards 0-31
    kept the old run's level 5 until the rack published again."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_r0_applied(range(32), T0 - 600.0, 0, seq=0))
    ing.handle(_r0_applied(range(32, 64), T0 - 599.0, 2, seq=1))
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {"r0": 2}
    _restart_behind(ing, wall, clock, T0 - 598.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:32] == 0) and np.all(ing.applied_level[32:64] == 2)
    assert ing.stats.applied_states_old == {"r0": 2} and ing.stats.applied_states_old_dropped == {}


@pytest.mark.parametrize("bridge_first", [False, True])
def test_a_stale_bridges_refused_applied_state_does_not_displace_the_restarted_racks_own(bridge_first: bool) -> None:
    """While the site clock is still the old run's, the restarted rack's applied state (T0 - 600, level 0) and
    an old-timeline one of a second publisher (a stale bridge: T0 + 5, level 3) are both refused as older
    than the one taken (T0 + 9). Once the clock has followed the new timeline back, the rack's own is taken;
    the bridge's, stamped far ahead of the new timeline's now, is not. The bridge's, stamped after the
    rack's, used to be the one kept for the rack in either order, and was then dropped at the retry: the
    rack's cards kept the old run's level 5."""
    wall, clock, ing = _r0_confirmed_5()
    own = _rack_applied("r0", T0 - 600.0, 0)
    stale = dataclasses.replace(_rack_applied("r0", T0 + 5.0, 3), seq=7, publisher="bridge-r0")
    for msg in (stale, own) if bridge_first else (own, stale):
        ing.handle(msg)
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {"r0": 2}
    _restart_behind(ing, wall, clock, T0 - 600.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:64] == 0)


def test_a_copy_of_a_refused_applied_state_is_kept_once_and_past_the_bound_the_oldest_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The restarted rack's refused applied states: one for cards 0-3 (T0 - 600), then others for cards 4-63.
    A copy of the first (the broker hands the retained one over again at a new subscription) is counted
    refused again but kept once. One more than ``REFUSED_KEPT_PER_RACK`` distinct ones drops the
    oldest-stamped, counted (``IngestStats.applied_states_old_dropped``) and logged: cards 0-3 keep the old
    run's confirmation after the clock follows back; the newest of the rest is taken."""
    wall, clock, ing = _r0_confirmed_5()
    first = _r0_applied(range(4), T0 - 600.0, 1)
    ing.handle(first)
    for i in range(REFUSED_KEPT_PER_RACK - 1):
        ing.handle(_r0_applied(range(4, 64), T0 - 599.0 + i, 2, seq=i + 1))
    ing.handle(first)
    assert ing.stats.applied_states_old == {"r0": REFUSED_KEPT_PER_RACK + 1}
    assert len(ing.applied.refused) == REFUSED_KEPT_PER_RACK and ing.stats.applied_states_old_dropped == {}
    with caplog.at_level(logging.WARNING, logger="racktwin.agent.ingest"):
        ing.handle(_r0_applied(range(4, 64), T0 - 590.0, 3, seq=REFUSED_KEPT_PER_RACK))
    assert len(ing.applied.refused) == REFUSED_KEPT_PER_RACK and ing.stats.applied_states_old_dropped == {"r0": 1}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "of r0" in lines[0] and f"ts {T0 - 600.0:.3f}" in lines[0], lines
    _restart_behind(ing, wall, clock, T0 - 589.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:4] == 5) and np.all(ing.applied_level[4:64] == 3)
    assert len(ing.applied.refused) == 0


# ---- mutation audit of the book and its retry: each test below failed on a mutant the tests above let pass


def test_two_publishers_of_a_rack_that_number_alike_are_kept_apart() -> None:
    """Rack r0's cards are confirmed by two publishers (one per host controller), each numbering its applied
    states from 0: both stamped T0 - 600 with ``seq`` 0, for cards 0-31 (level 0) and 32-63 (level 2), both
    refused while the clock is the old run's. Told apart by their publisher, both are taken once the clock
    follows back; taken for one (a copy of the other), cards 32-63 kept the old run's level 5."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_r0_applied(range(32), T0 - 600.0, 0, publisher="host-a"))
    ing.handle(_r0_applied(range(32, 64), T0 - 600.0, 2, publisher="host-b"))
    assert len(ing.applied.refused) == 2
    _restart_behind(ing, wall, clock, T0 - 598.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:32] == 0) and np.all(ing.applied_level[32:64] == 2)


def _r0_half_confirmed_5() -> tuple[FakeWall, SiteClock, Ingest]:
    """As ``_r0_confirmed_5``, but the old run confirmed level 5 for r0's cards 0-31 only (T0 + 9)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    site = example_site()
    ing = Ingest(site, TwinState(site), clock)
    for i in range(10):
        ing.handle(cards_msg("r0", T0 + i, sm_clock_mhz=np.full(64, LEVEL_5_MHZ)))
        wall.t += 0.05
    ing.handle(_r0_applied(range(32), T0 + 9.0, 5))
    return wall, clock, ing


def test_an_applied_state_refused_for_some_of_its_cards_is_taken_for_them_once_the_clock_follows() -> None:
    """The old run confirmed r0's cards 0-31 only; the restarted rack's applied state (T0 - 600, level 0) for
    all 64 is taken for cards 32-63 and refused for 0-31 (kept for them). Once the clock follows back, it
    is taken for cards 0-31 as well. Forgotten as soon as it was taken for some (the rack spoke), cards 0-31
    kept the old run's level 5."""
    wall, clock, ing = _r0_half_confirmed_5()
    ing.handle(_r0_applied(range(64), T0 - 600.0, 0))
    assert np.all(ing.applied_level[:32] == 5) and np.all(ing.applied_level[32:64] == 0)
    assert len(ing.applied.refused) == 1
    _restart_behind(ing, wall, clock, T0 - 598.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:64] == 0)


def test_a_copy_refused_for_more_cards_than_the_first_is_tried_again_for_all_of_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The old run confirmed only r0's cards 0-31 (T0 + 9). The restarted rack's applied state (T0 - 600,
    level 0) is taken for cards 32-63 and refused for 0-31 (its log line says so: 32 cards); a stale
    bridge's (T0 + 5, level 3) is refused for 0-31 and taken for 32-63; the broker hands the rack's over
    again (a new subscription): refused for all 64 now. Once the clock follows back, the rack's is taken
    for all 64 cards and the bridge's for none. Kept for the cards of its first refusal only, cards 32-63
    stayed at the bridge's level 3."""
    wall, clock, ing = _r0_half_confirmed_5()
    own = _r0_applied(range(64), T0 - 600.0, 0)
    with caplog.at_level(logging.INFO, logger="racktwin.agent.ingest"):
        ing.handle(own)
    (line,) = [r.getMessage() for r in caplog.records if "is older than the one taken" in r.getMessage()]
    assert "for 32 of its cards" in line, line
    ing.handle(_r0_applied(range(64), T0 + 5.0, 3, seq=7, publisher="bridge-r0"))
    assert np.all(ing.applied_level[:32] == 5) and np.all(ing.applied_level[32:64] == 3)
    ing.handle(own)
    assert ing.stats.applied_states_old == {"r0": 3} and len(ing.applied.refused) == 2
    _restart_behind(ing, wall, clock, T0 - 600.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:64] == 0)


def test_past_the_bound_of_two_stamped_alike_the_lower_seq_is_dropped() -> None:
    """The two oldest refused applied states for cards 0-3 are stamped alike (T0 - 600), ``seq`` 1 (level 2)
    arriving before ``seq`` 0 (level 1); past the bound the one dropped is ``seq`` 0, the older, and cards
    0-3 end at level 2 once the clock follows back. Dropped by arrival at the tie, cards 0-3 ended at level
    1, the setting the rack had left."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_r0_applied(range(4), T0 - 600.0, 2, seq=1))
    ing.handle(_r0_applied(range(4), T0 - 600.0, 1, seq=0))
    for i in range(REFUSED_KEPT_PER_RACK - 1):
        ing.handle(_r0_applied(range(4, 64), T0 - 599.0 + i, 3, seq=2 + i))
    assert ing.stats.applied_states_old_dropped == {"r0": 1}
    _restart_behind(ing, wall, clock, T0 - 589.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:4] == 2) and np.all(ing.applied_level[4:64] == 3)


def test_of_two_refused_stamped_alike_the_higher_seq_is_taken_whatever_their_order() -> None:
    """The restarted rack's two applied states are stamped alike (the same millisecond), ``seq`` 1 (level 2)
    delivered before ``seq`` 0 (level 0) (a bridge reordering). Once the clock follows back, the cards end
    at ``seq`` 1's level 2, the newer. Tried again in the order they came (or newest first), they ended
    at ``seq`` 0's level 0."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_r0_applied(range(64), T0 - 600.0, 2, seq=1))
    ing.handle(_r0_applied(range(64), T0 - 600.0, 0, seq=0))
    _restart_behind(ing, wall, clock, T0 - 598.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:64] == 2)


@pytest.mark.parametrize("ahead_s", [0.5, 1.0])
def test_a_refused_applied_state_stamped_just_ahead_of_the_new_now_ends_the_cards_at_its_level(ahead_s: float) -> None:
    """The restarted rack's applied states T0 - 600 (level 0) and ``ahead_s`` after the new timeline's now
    (level 2: its clock ahead of the telemetry the site clock follows back to T0 - 589; up to
    ``RETRY_AHEAD_S``, 1 s, included): both refused, both tried again, the newest last, so the cards end at
    level 2. Tried newest first, the older was not refused against it (a stamp ahead of the now is another
    timeline's) and set the cards back to level 0; the newest not tried, they stayed at level 0 too."""
    assert RETRY_AHEAD_S == 1.0
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_r0_applied(range(64), T0 - 600.0, 0, seq=0))
    ing.handle(_r0_applied(range(64), T0 - 589.0 + ahead_s, 2, seq=1))
    _restart_behind(ing, wall, clock, T0 - 600.0, LEVEL_5_MHZ)  # followed back at its reading of T0 - 589
    assert clock.now() == T0 - 588.0  # a site second (the wall's 0.05 s) since
    assert np.all(ing.applied_level[:64] == 2)


def test_a_retry_older_than_a_new_timelines_confirmation_is_neither_taken_nor_refused_again() -> None:
    """The old run confirmed r0's cards 0-31 (T0 + 9); the restarted rack's applied state (T0 - 600, level 0)
    is taken for 32-63; an earlier one of the rack's (T0 - 610, level 2), delivered late, is refused for all
    64 (counted once). Once the clock follows back, it is taken for cards 0-31 only (cards 32-63 hold the
    newer T0 - 600 of the new timeline), and neither counted again (``racktwin_applied_states_old_total``
    counts messages, not tries) nor kept to be tried at the next new timeline. Refused again, it was."""
    wall, clock, ing = _r0_half_confirmed_5()
    ing.handle(_r0_applied(range(32, 64), T0 - 600.0, 0, seq=1))
    ing.handle(_r0_applied(range(64), T0 - 610.0, 2, seq=0))
    assert np.all(ing.applied_level[:32] == 5) and np.all(ing.applied_level[32:64] == 0)
    assert ing.stats.applied_states_old == {"r0": 1}
    _restart_behind(ing, wall, clock, T0 - 600.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:32] == 2) and np.all(ing.applied_level[32:64] == 0)
    assert ing.stats.applied_states_old == {"r0": 1} and len(ing.applied.refused) == 0


def test_a_refused_applied_state_of_another_rack_than_the_first_is_taken_for_its_own_cards() -> None:
    """Rack r1 (site cards 64-127) confirmed level 5 on the old run (T0 + 9); its restarted applied state (T0 -
    600, level 0) is refused, and taken for r1's cards once the clock follows back (r0's readings lead
    it). Tried for the rack-local indices as site cards, r1's cards kept level 5."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_rack_applied("r1", T0 + 9.0, 5))
    ing.handle(_rack_applied("r1", T0 - 600.0, 0))
    assert np.all(ing.applied_level[64:128] == 5) and ing.stats.applied_states_old == {"r1": 1}
    _restart_behind(ing, wall, clock, T0 - 598.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[64:128] == 0) and np.all(ing.applied_level[:64] == 5)


def test_a_refused_applied_state_of_the_new_timelines_stamps_is_forgotten_once_its_rack_confirms_a_newer_one() -> None:
    """A stale copy stamped T0 - 600 (level 0) is refused; then the rack confirms level 3 (T0 + 10). When the
    site restarts about 600 s behind, the one refused (stamped within the new timeline's now) is not
    taken: the rack spoke since, and its newest confirmation stands. Kept, it set the cards to level 0."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_r0_applied(range(64), T0 - 600.0, 0))
    ing.handle(_r0_applied(range(64), T0 + 10.0, 3, seq=1))
    assert np.all(ing.applied_level[:64] == 3) and len(ing.applied.refused) == 0
    _restart_behind(ing, wall, clock, T0 - 598.0, LEVEL_5_MHZ)
    assert np.all(ing.applied_level[:64] == 3)


def test_the_book_is_emptied_when_its_applied_states_are_tried_again() -> None:
    """What the retry at a new timeline takes from the book is gone from it, dropped or taken: a stale
    bridge's applied state dropped at one restart (stamped far ahead of the new now) is not tried at a
    later one."""
    book = RefusedApplied()
    book.keep(0, _r0_applied(range(4), T0 + 5.0, 3), np.arange(4))
    book.keep(1, dataclasses.replace(_r0_applied(range(4), T0 + 6.0, 3), rack="r1"), np.arange(64, 68))
    assert [m.ts_s for m, _cards in book.take_all()] == [T0 + 5.0, T0 + 6.0]
    assert len(book) == 0 and book.take_all() == []


def test_a_restarted_racks_applied_state_repeating_one_disproved_on_the_old_timeline_is_taken() -> None:
    """r0 confirmed level 5 (T0 + 9, ``seq`` 0); its readings at the top clock from T0 + 10 disprove it. The
    site restarts on the same start epoch (a simulator started again as before), 60 s behind; when the new
    timeline reaches T0 + 9 the rack applies level 5 again, its applied state stamped T0 + 9 with ``seq`` 0
    as before: it is the new timeline's, and taken. Taken for a copy of the one disproved (a retained copy
    handed over again), the cards stayed unconfirmed (level -1) until the rack published again."""
    wall, clock, ing = _r0_confirmed_5()
    for t in (T0 + 10.0, T0 + 11.0):
        ing.handle(cards_msg("r0", t, sm_clock_mhz=np.full(64, 1980.0)))
        wall.t += 0.05
    assert np.all(ing.applied_level[:64] == -1)
    _restart_behind(ing, wall, clock, T0 - 60.0, LEVEL_5_MHZ)
    for i in range(-48, 10):  # the new timeline runs on to the stamp of the rack's applied state
        ing.handle(cards_msg("r0", T0 + i, sm_clock_mhz=np.full(64, LEVEL_5_MHZ)))
        wall.t += 0.05
    assert clock.timelines_left == 1 and clock.now() == T0 + 10.0
    ing.handle(_r0_applied(range(64), T0 + 9.0, 5))
    assert np.all(ing.applied_level[:64] == 5)
