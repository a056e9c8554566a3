"""What the plant's sensor faults do to its telemetry: dropouts, stuck sensors and garbage readings.

The plant (``twin.plant``) computes the true state and its noisy readings; this module holds the
sensor faults in force and applies them to those readings, in the order the plant builds them:

- **dropout** (``SensorDropout``): the rack publishes nothing;
- **stuck rack** (``StuckSensor`` without a card): the rack repeats its reading of the moment the
  fault began, whole (cards, loop, PDU), with a fresh time stamp, as a collector re-publishing its
  cache does;
- **stuck card** (``StuckSensor`` with a card): that card's power, die temperature, utilisation and
  clock stay at the values of the fault's first reading; the rest of the rack reads true;
- **garbage** (``GarbageReadings``): a random share of the rack's card readings is NaN (``nan``) or
  out of any physical range (``garbage``: -1234.5 W, 10,000 deg C, utilisation 7); at a share of 1 the
  loop goes bad too (``nan``: its supply and return temperatures NaN; ``garbage``: a return of
  -273 deg C and a flow of -1 l/min).

Faults may overlap. Dropouts and stuck sensors count their windows in force, and a frozen value is
forgotten when the last window on it ends (a new window freezes the values of its own first
reading); overlapping garbage windows each apply with their own draw (two windows of share 0.5 hit
about three cards in four).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from twin.faults import Fault, GarbageReadings, SensorDropout, StuckSensor
from twin.readings import CardBatch, LoopReading, RackReading

FloatArray = npt.NDArray[np.float64]

#: what a ``garbage`` reading says: a negative power, a die hotter than any metal stays solid, a
#: utilisation of seven
GARBAGE_POWER_W = -1234.5
GARBAGE_DIE_TEMP_C = 1.0e4
GARBAGE_UTILIZATION = 7.0


class SensorFaults:
    """The sensor faults in force on a site of ``n_racks`` racks and the readings they hold frozen."""

    def __init__(self, n_racks: int) -> None:
        self._dropout = np.zeros(n_racks, dtype=np.int64)  # windows in force per rack
        self._stuck_rack = np.zeros(n_racks, dtype=np.int64)
        self._stuck_cards: dict[int, int] = {}  # card -> windows in force
        self._frozen_rack: dict[int, RackReading] = {}
        self._frozen_card: dict[int, tuple[float, float, float, float]] = {}  # power, die, util, clock
        self._garbage: dict[int, list[GarbageReadings]] = {}

    def switch(self, fault: Fault, on: bool) -> None:
        """A sensor fault's window begins (``on``) or ends; other faults are not this module's."""
        d = 1 if on else -1
        if isinstance(fault, SensorDropout):
            self._dropout[fault.rack] += d
        elif isinstance(fault, StuckSensor):
            if fault.card is None:
                self._stuck_rack[fault.rack] += d
                if not on and self._stuck_rack[fault.rack] == 0:
                    self._frozen_rack.pop(fault.rack, None)
            else:
                cnt = self._stuck_cards.get(fault.card, 0) + d
                if cnt <= 0:
                    self._stuck_cards.pop(fault.card, None)
                    self._frozen_card.pop(fault.card, None)
                else:
                    self._stuck_cards[fault.card] = cnt
        elif isinstance(fault, GarbageReadings):
            in_force = self._garbage.get(fault.rack)
            if on:
                self._garbage.setdefault(fault.rack, []).append(fault)
            elif in_force is not None and fault in in_force:
                in_force.remove(fault)
                if not in_force:
                    del self._garbage[fault.rack]

    def freeze_stuck_cards(self, power: FloatArray, die: FloatArray, util: FloatArray, clock: FloatArray) -> None:
        """Overwrite (in place) each stuck card's values of this reading with those it froze at; a
        card whose fault began since the last reading freezes at this one's."""
        for c in self._stuck_cards:
            frozen = self._frozen_card.get(c)
            if frozen is None:
                self._frozen_card[c] = (float(power[c]), float(die[c]), float(util[c]), float(clock[c]))
            else:
                power[c], die[c], util[c], clock[c] = frozen

    def dropped(self, rack: int) -> bool:
        """The rack publishes nothing now."""
        return bool(self._dropout[rack])

    def frozen_rack(self, rack: int, time_s: float) -> RackReading | None:
        """A stuck rack's frozen reading, stamped ``time_s``; None where the rack reads afresh (not
        stuck, or stuck since this reading: :meth:`seen` freezes it)."""
        if not self._stuck_rack[rack]:
            return None
        frozen = self._frozen_rack.get(rack)
        return None if frozen is None else replace(frozen, time_s=time_s)

    def garble(
        self, rack: int, batch: CardBatch, loop: LoopReading, rng: np.random.Generator
    ) -> tuple[CardBatch, LoopReading]:
        """The rack's card and loop readings with its garbage faults applied (unchanged without one;
        ``rng`` draws which cards each fault hits)."""
        faults = self._garbage.get(rack)
        if not faults:
            return batch, loop
        power, die, util = batch.power_w.copy(), batch.die_temp_c.copy(), batch.utilization.copy()
        for f in faults:
            hit = rng.random(power.size) < f.fraction
            if f.mode == "nan":
                power[hit], die[hit], util[hit] = np.nan, np.nan, np.nan
                if f.fraction >= 1.0:
                    loop = replace(loop, return_temp_c=math.nan, supply_temp_c=math.nan)
            else:
                power[hit], die[hit], util[hit] = GARBAGE_POWER_W, GARBAGE_DIE_TEMP_C, GARBAGE_UTILIZATION
                if f.fraction >= 1.0:
                    loop = replace(loop, return_temp_c=-273.0, flow_lpm=-1.0)
        return replace(batch, power_w=power, die_temp_c=die, utilization=util), loop

    def seen(self, reading: RackReading) -> None:
        """The rack's reading as published: a stuck rack freezes at it."""
        if self._stuck_rack[reading.rack]:
            self._frozen_rack[reading.rack] = reading
