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
from test_clock_ingest import T0, _applied, _rack_applied
from test_ingest_order import _r0_confirmed_5, _restart_behind

from agent import wire
from agent.refused_applied import REFUSED_KEPT_PER_RACK

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
