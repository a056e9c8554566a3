"""The applied states refused as older than the one taken, kept to be tried again (:class:`RefusedApplied`).

``agent.applied_states.AppliedStates`` refuses, for a card, a rack's applied state stamped before the one
it took for that card (a second publisher for the rack, a broker bridge reordering), and tries the refused
ones again when the site clock goes back to a new timeline: a restarted rack's first applied state, on its
new timeline, is stamped before the old run's and comes before the telemetry the clock follows back.

Until 2026-12-05 only the newest-stamped refused applied state was kept per rack: a rack that confirmed
its cards in two messages (one per command) had the first one's cards left at the old run's settings, and
an old-timeline message of a second publisher (a stale bridge), stamped after the restarted rack's own,
displaced it (and, stamped ahead of the new timeline, was dropped at the retry: the rack's own was lost
until it published again). Now every refused one is kept, with the cards it was refused for, up to
:data:`REFUSED_KEPT_PER_RACK` per rack; a copy of one kept (the same stamp, ``seq`` and publisher: the
broker's retained copy at a new subscription, a QoS 1 duplicate) is kept once. Past the bound the
oldest-stamped is dropped (counted in ``IngestStats.applied_states_old_dropped`` by the caller, and
logged): the newest ones stay, as the single one did before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent import wire

IntArray = npt.NDArray[np.int64]

__all__ = ["REFUSED_KEPT_PER_RACK", "RefusedApplied"]

#: at most this many refused applied states are kept per rack (distinct stamp, ``seq`` and publisher). A
#: restarted rack publishes its retained applied state and one per command it applies, and the agent's
#: clock follows it back within a few wall seconds (``agent.clock``), the book of a rack being cleared when
#: it confirms a newer one: 8 is several times what a restart or a stale bridge's replay brings
REFUSED_KEPT_PER_RACK = 8


@dataclass
class _Kept:
    msg: wire.AppliedState
    cards: IntArray  # the site cards it was refused for (sorted, unique)


class RefusedApplied:
    """Per rack, the applied states refused as older than the one taken and the cards they were refused for
    (see the module docstring)."""

    def __init__(self) -> None:
        self._by_rack: dict[int, list[_Kept]] = {}

    def __len__(self) -> int:
        """How many are kept, all racks together."""
        return sum(len(kept) for kept in self._by_rack.values())

    def keep(self, r: int, msg: wire.AppliedState, cards: IntArray) -> wire.AppliedState | None:
        """Keep rack ``r``'s applied state ``msg``, refused for the site cards ``cards``; a copy of one kept
        adds its cards to that one's. Returns the one dropped past :data:`REFUSED_KEPT_PER_RACK` (the
        oldest-stamped, lowest ``seq`` at a tie; maybe ``msg`` itself), None if none."""
        kept = self._by_rack.setdefault(r, [])
        for k in kept:
            if (k.msg.ts_s, k.msg.seq, k.msg.publisher) == (msg.ts_s, msg.seq, msg.publisher):
                k.cards = np.union1d(k.cards, cards)
                return None
        kept.append(_Kept(msg, np.unique(cards)))
        if len(kept) <= REFUSED_KEPT_PER_RACK:
            return None
        oldest = min(range(len(kept)), key=lambda i: (kept[i].msg.ts_s, kept[i].msg.seq))
        return kept.pop(oldest).msg

    def forget(self, r: int) -> None:
        """Rack ``r`` confirmed an applied state taken since: the ones kept are no new timeline's."""
        self._by_rack.pop(r, None)

    def take_all(self) -> list[tuple[wire.AppliedState, IntArray]]:
        """Every one kept, with its cards, oldest-stamped first (``seq`` at a tie: taken in that order, a
        card ends at its newest), and the book emptied."""
        kept = [k for ks in self._by_rack.values() for k in ks]
        self._by_rack = {}
        kept.sort(key=lambda k: (k.msg.ts_s, k.msg.seq))
        return [(k.msg, k.cards) for k in kept]
