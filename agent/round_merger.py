"""Partial telemetry readings -> one :class:`twin.readings.Readings` per telemetry round (:class:`RoundMerger`).

What :meth:`agent.ingest.Ingest.flush` folds into the belief is also returned: a burst of messages
holds part of a round, and a rack's second reading of a kind flushes the round collected. The service
merges those partial readings into one per telemetry round for the estimator (which costs the same
whether it is given one rack or all of them): the parts stamped within :data:`ROUND_TOLERANCE_S` of
the round's first, since each rack stamps with its own clock and a real site's clocks differ by
milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np

from twin.readings import CardBatch, FacilityReading, RackReading, Readings

__all__ = ["ROUND_TOLERANCE_S", "RoundMerger"]

#: a telemetry part (a rack's reading, the facility's) stamped within this of a round's first part is of
#: that round (:class:`RoundMerger`). The racks of a site report on one period (1 s on every example
#: site), but each stamps its readings with its own clock, and the clocks of a real site differ by
#: milliseconds (NTP on a LAN; tens of ms where it is loose): merged by the exact stamp, every rack made
#: a round of its own and the estimator, which costs the same for one rack as for all, ran once per rack
#: and period (11x its time at 2,048 cards with clocks 0-50 ms apart, 19x at 8,192). A quarter of the
#: period: a rack whose clock is further off has rounds of its own, as before; one that reads more often
#: than this has each reading in a round of its own (two readings of one part of a rack are never merged)
ROUND_TOLERANCE_S = 0.25
_PARTS: tuple[Literal["cards", "loop", "pdu"], ...] = ("cards", "loop", "pdu")


def _clashing_parts(old: RackReading, new: RackReading) -> list[Literal["cards", "loop", "pdu"]]:
    """The parts that both of one rack's readings hold, stamped apart: two readings of the rack's cards,
    loop or PDU, which the estimator must get one after the other (each is learnt at its own stamp;
    merged, the older is lost)."""
    return [
        p
        for p in _PARTS
        if getattr(old, p) is not None and getattr(new, p) is not None and old.part_time_s(p) != new.part_time_s(p)
    ]


def _joined_cards(old: RackReading, new: RackReading) -> CardBatch | None:
    """The cards of two parts of one rack's round, both with cards stamped alike, as one batch: a rack
    that sends its cards in several batches (one per host) at one stamp has the ingest fold them in one
    by one (it flushes at each second batch of a rack); the newer part's card where both hold one (a
    copy). None where not both hold cards or their stamps differ (the newer part's are the rack's)."""
    a, b = old.cards, new.cards
    if a is None or b is None or old.part_time_s("cards") != new.part_time_s("cards"):
        return None
    keep = ~np.isin(a.card_index, b.card_index)
    if not keep.any():
        return None
    cols = {
        f.name: np.concatenate((getattr(a, f.name)[keep], getattr(b, f.name)))
        for f in fields(CardBatch)
        if f.name != "host_off"
    }
    host_off = None if a.host_off is None or b.host_off is None else np.concatenate((a.host_off[keep], b.host_off))
    return CardBatch(**cols, host_off=host_off)


def _merged(old: RackReading, new: RackReading) -> RackReading | None:
    """One rack's readings ``old`` and ``new`` (which came later) as one: each part from the newer one
    that has it (the cards of both joined where they are stamped alike: :func:`_joined_cards`), at its
    own time. None where they clash: both with a part stamped apart (:func:`_clashing_parts`), whatever
    the readings' own stamps (the newest of their parts: a rack's cards at T and its CDU at T + 1, then
    its cards at T + 1, are two readings stamped T + 1; merged, the cards at T never reached the
    estimator). A part stamped alike in both is taken from the newer (a copy)."""
    if _clashing_parts(old, new):
        return None
    cards = new if new.cards is not None else old
    loop = new if new.loop is not None else old
    pdu = new if new.pdu is not None else old
    return RackReading(
        rack=new.rack,
        time_s=max(old.time_s, new.time_s),
        cards=_joined_cards(old, new) or cards.cards,
        loop=loop.loop,
        pdu=pdu.pdu,
        cards_time_s=cards.part_time_s("cards") if cards.cards is not None else None,
        loop_time_s=loop.part_time_s("loop") if loop.loop is not None else None,
        pdu_time_s=pdu.part_time_s("pdu") if pdu.pdu is not None else None,
    )


@dataclass
class _Round:
    """A round being merged: the stamp of its first part (its window is this +- the tolerance), the
    newest stamp of its parts, each rack's reading and the facility's."""

    anchor_s: float
    newest_s: float = -math.inf
    racks: dict[int, RackReading] = field(default_factory=dict)
    facility: FacilityReading | None = None

    def take(self, part: RackReading | FacilityReading, tolerance_s: float) -> bool:
        """Merge ``part`` in; False (nothing changed) where it is stamped outside the window or clashes
        with what the round holds (:func:`_merged`; a facility reading stamped apart from the one held)."""
        if abs(part.time_s - self.anchor_s) > tolerance_s:
            return False
        if isinstance(part, FacilityReading):
            if self.facility is not None and self.facility.time_s != part.time_s:
                return False
            self.facility = part  # (stamped alike: the newer, as a copy)
        else:
            old = self.racks.get(part.rack)
            merged = part if old is None else _merged(old, part)
            if merged is None:
                return False
            self.racks[part.rack] = merged
        self.newest_s = max(self.newest_s, part.time_s)
        return True

    def is_after(self, part: RackReading | FacilityReading, tolerance_s: float) -> bool:
        """Whether ``part``, which :meth:`take` refused, comes after this round (else it is late: it goes to
        the estimator before it): stamped past its window, or a second reading of one of its parts (a rack's
        cards, loop or PDU, the facility) stamped after the one held. Judged by the round's newest part, a
        rack's next reading stamped before another rack's part (clocks milliseconds apart) went out first,
        and the estimator dropped the rack's reading held as late."""
        if abs(part.time_s - self.anchor_s) > tolerance_s:
            return part.time_s > self.anchor_s
        if isinstance(part, FacilityReading):
            return self.facility is None or part.time_s > self.facility.time_s
        old = self.racks[part.rack]
        return all(part.part_time_s(p) > old.part_time_s(p) for p in _clashing_parts(old, part))

    def readings(self) -> Readings:
        return Readings(
            time_s=self.newest_s, racks=tuple(self.racks[r] for r in sorted(self.racks)), facility=self.facility
        )


class RoundMerger:
    """Merges partial readings (what :meth:`agent.ingest.Ingest.flush` returns) into one :class:`Readings` per
    telemetry round: the parts stamped within ``tolerance_s`` (:data:`ROUND_TOLERANCE_S`) of the round's
    first part, each rack's parts in one reading, each part at its own time (a rack's card batches
    stamped alike, one per host, joined: :func:`_joined_cards`), taken in the order of their stamps. One
    round is held: it is complete when a part stamped past its window arrives, or one that clashes with
    it (a second reading of a rack's cards, loop or PDU, or of the facility, stamped after the first:
    the next round's); a part stamped before its window, or clashing with it and stamped before the
    reading it clashes with (a late reading), goes out at once, in a round of the late parts. The estimator
    costs the same for one rack as for all: racks whose clocks differ by milliseconds must not make a
    round each. :meth:`add` returns the rounds completed, oldest first, a round of late parts before the round
    they were late to (the one held when they came, though they may be stamped after its first part: a
    rack's reading that overtook its next one); :meth:`drain` returns the round
    held (when the site's clock stepped back, what is held is from the old timeline, and newer than
    anything the new one will send for a while: kept, it would take each new part for late, and reach
    the estimator out of order much later); :meth:`step_back` does it when the clock stepped back."""

    def __init__(self, tolerance_s: float = ROUND_TOLERANCE_S) -> None:
        self.tolerance_s = tolerance_s
        self._held: _Round | None = None

    @property
    def held_s(self) -> float | None:
        """The newest stamp of the round held (None: none held)."""
        return None if self._held is None else self._held.newest_s

    def add(self, readings: Readings) -> list[Readings]:
        parts: list[RackReading | FacilityReading] = list(readings.racks)
        if readings.facility is not None:
            parts.append(readings.facility)
        out: list[_Round] = []
        late: list[_Round] = []  # the parts late to the round held, in rounds that go out before it
        tol = self.tolerance_s
        for part in sorted(parts, key=lambda p: p.time_s):
            held = self._held
            if held is not None and held.take(part, tol):
                continue
            if held is not None and not held.is_after(part, tol):  # late (before the window, or a clash before)
                if not late or not late[-1].take(part, tol):
                    late.append(_Round(part.time_s))
                    late[-1].take(part, tol)
                continue
            out += late  # (before the round they were late to: a late part may be stamped after its first)
            late = []
            if held is not None:  # stamped past its window, or the next reading of one of its parts
                out.append(held)
            self._held = held = _Round(part.time_s)
            held.take(part, tol)
        return [r.readings() for r in out + late]

    def drain(self) -> list[Readings]:
        """The round held, complete or not (none: empty)."""
        held, self._held = self._held, None
        return [] if held is None else [held.readings()]

    def step_back(self, readings: Readings, now_s: float) -> tuple[list[Readings], list[Readings]]:
        """The site's clock stepped back to ``now_s`` and ``readings`` came: every round held, and the
        parts of ``readings`` stamped after ``now_s``, are the old timeline's (the ingest flushes what
        it collected when the clock steps back: after the clock stepped, before the belief went back),
        all returned now, oldest first; the other parts are merged as :meth:`add` merges them. Returns
        the two apart, (the old timeline's rounds, the new one's rounds completed), so that the
        estimator can be told of the step between them (``agent.estimation_loop.ClockWentBack``)."""
        racks_old = tuple(rr for rr in readings.racks if rr.time_s > now_s)
        fac = readings.facility
        fac_old = fac is not None and fac.time_s > now_s
        old = Readings(time_s=readings.time_s, racks=racks_old, facility=fac if fac_old else None)
        new = Readings(
            time_s=readings.time_s,
            racks=tuple(rr for rr in readings.racks if rr.time_s <= now_s),
            facility=None if fac_old else fac,
        )
        out = self.add(old) + self.drain()
        return out, self.add(new)
