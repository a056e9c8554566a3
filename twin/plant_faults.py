"""The plant's faults: which are in force, when they change, and what they do to flow and ambient.

``twin.plant.Plant`` holds one :class:`PlantFaults`. :meth:`PlantFaults.schedule` checks a fault
against the site and turns it into the timeline actions the plant applies when they fall due:

- ``CardFailure``: ``fail`` at ``at_s`` and, when it is repaired, ``repair`` ``repair_after_s`` later
  (payload: the card);
- ``PumpDegradation`` and ``ColdPlateFouling``: ``flow`` at each change (a ramp in 20 steps), after
  which the plant asks :meth:`PlantFaults.pump_flow_frac` and :meth:`PlantFaults.fouling_factor`
  what is in force;
- sensor faults (``SensorDropout``, ``StuckSensor``, ``GarbageReadings``): ``sensor_on`` and
  ``sensor_off`` (payload: the fault) for the plant's sensors (``twin.plant_readings``);
- ``HeatWave``: no action; it changes the ambient smoothly (:meth:`PlantFaults.heat_wave_delta_k`).

The times of those actions are the faults' edges (:meth:`PlantFaults.next_change_s`).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from twin.faults import (
    CardFailure,
    ColdPlateFouling,
    Fault,
    GarbageReadings,
    HeatWave,
    PumpDegradation,
    SensorDropout,
    StuckSensor,
)
from twin.plant_types import FloatArray
from twin.spec import SiteSpec

__all__ = ["PlantFaults", "TimelineAction"]

_EPS_S = 1e-6
_INF = math.inf
# a pump degradation's ramp is applied in this many equal steps
_PUMP_RAMP_STEPS = 20

#: one action for the plant's timeline: (site time, kind, payload)
TimelineAction = tuple[float, str, Any]


class PlantFaults:
    """The plant faults scheduled on a site: the ones that act on flow and ambient, and the times
    at which any of them starts, changes or ends."""

    def __init__(self, site: SiteSpec) -> None:
        self._n, self._n_racks = site.n_cards, site.n_racks
        self._card_rack = site.card_rack()
        self._heat_waves: list[HeatWave] = []
        self._pump_faults: list[PumpDegradation] = []
        self._fouling: list[ColdPlateFouling] = []
        self._edges: list[float] = []  # sorted times at which a plant fault starts, changes or ends

    def schedule(self, fault: Fault) -> list[TimelineAction]:
        """Check ``fault`` against the site (``ValueError`` if it names a rack or card the site does
        not have; nothing is kept then) and keep it; the timeline actions it brings, in the order
        the plant is to add them."""
        if isinstance(fault, HeatWave):
            self._heat_waves.append(fault)
            return []
        if isinstance(fault, SensorDropout | StuckSensor | GarbageReadings | PumpDegradation) and not (
            0 <= fault.rack < self._n_racks
        ):
            raise ValueError(f"{type(fault).__name__}: rack {fault.rack} is not in 0..{self._n_racks - 1}")
        if isinstance(fault, CardFailure | ColdPlateFouling) and not 0 <= fault.card < self._n:
            raise ValueError(f"{type(fault).__name__}: card {fault.card} is not in 0..{self._n - 1}")
        if (
            isinstance(fault, StuckSensor)
            and fault.card is not None
            and (not 0 <= fault.card < self._n or self._card_rack[fault.card] != fault.rack)
        ):
            raise ValueError(f"StuckSensor: card {fault.card} is not in rack {fault.rack}")
        actions: list[TimelineAction] = []
        if isinstance(fault, CardFailure):
            actions.append((fault.at_s, "fail", fault.card))
            if math.isfinite(fault.repair_after_s):
                actions.append((fault.at_s + fault.repair_after_s, "repair", fault.card))
        elif isinstance(fault, PumpDegradation):
            self._pump_faults.append(fault)
            steps = _PUMP_RAMP_STEPS if fault.ramp_s > 0 else 0
            for i in range(steps + 1):
                actions.append((fault.start_s + fault.ramp_s * i / max(steps, 1), "flow", None))
            if math.isfinite(fault.end_s):
                actions.append((fault.end_s, "flow", None))
        elif isinstance(fault, ColdPlateFouling):
            self._fouling.append(fault)
            actions.append((fault.start_s, "flow", None))
            if math.isfinite(fault.end_s):
                actions.append((fault.end_s, "flow", None))
        else:  # sensor faults
            actions.append((fault.start_s, "sensor_on", fault))
            if math.isfinite(fault.end_s):
                actions.append((fault.end_s, "sensor_off", fault))
        for time_s, _kind, _payload in actions:
            bisect.insort(self._edges, time_s)
        return actions

    def next_change_s(self, t: float) -> float:
        """Site time of the first fault edge after ``t``; inf when none is left."""
        edges = self._edges
        i = bisect.bisect_right(edges, t + _EPS_S)
        return edges[i] if i < len(edges) else _INF

    def heat_wave_delta_k(self, t: float) -> float:
        """What the heat waves add to the ambient at ``t`` (K)."""
        return sum(h.delta_k(t) for h in self._heat_waves)

    def pump_flow_frac(self, t: float) -> FloatArray:
        """Per rack: the fraction of nominal flow the pump degradations in force at ``t`` leave
        (the lowest of those on the rack; 1 with none)."""
        frac = np.ones(self._n_racks)
        for f in self._pump_faults:
            frac[f.rack] = min(frac[f.rack], f.fraction_at(t + _EPS_S))
        return frac

    def fouling_factor(self, t: float) -> FloatArray:
        """Per card: the factor on its cold plate's resistance from the fouling in force at ``t``
        (the product of the windows in force; 1 with none)."""
        foul = np.ones(self._n)
        for g in self._fouling:
            if g.start_s <= t + _EPS_S < g.end_s:
                foul[g.card] *= g.r_factor
        return foul
