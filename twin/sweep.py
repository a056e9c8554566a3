"""The coolant supply temperature trade-off: site steady state over a range of set-points.

Warmer supply water lets the dry cooler reject more heat for free (less chiller work, slower
fans) but raises every die temperature, hence leakage power, and past a point the hottest cards
reach their slowdown temperature and throttle (``twin.steady``). At full load the facility power
falls while the chiller still runs, bottoms out once cooling is free, then rises slowly with
leakage; past the throttle onset the site can no longer deliver full speed.

``best`` is the set-point of least facility power among points where no card throttles (a point
that throttles does less work, so it is not a candidate for the set-point: slowing cards is the
DVFS controller's decision, not a side effect of the water temperature).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from twin.spec import SiteSpec
from twin.steady import site_steady_state
from twin.workload import relative_throughput

__all__ = ["SweepPoint", "best_point", "supply_sweep"]


@dataclass(frozen=True)
class SweepPoint:
    supply_temp_c: float
    ambient_temp_c: float
    it_power_w: float
    cooling_power_w: float
    chiller_power_w: float
    facility_power_w: float
    pue: float
    free_cooling_fraction: float
    max_die_temp_c: float
    throttled_cards: int
    throughput_frac: float  # mean relative throughput of the cards (1 = all at the commanded level)

    @property
    def facility_power_per_throughput_w(self) -> float:
        return self.facility_power_w / self.throughput_frac if self.throughput_frac > 0 else float("inf")


def supply_sweep(
    site: SiteSpec,
    supply_temps_c: Sequence[float],
    ambient_c: float | None = None,
    level: int = 0,
    utilization: float = 1.0,
    compute_share: float = 0.8,
) -> list[SweepPoint]:
    """Steady state of the whole site at each supply set-point (every card at ``level`` and
    ``utilization``; throughput with ``compute_share``, relative to the top clock)."""
    clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
    amb = site.facility.ambient_temp_c if ambient_c is None else float(ambient_c)
    out = []
    for t in supply_temps_c:
        ss = site_steady_state(site, level=level, utilization=utilization, supply_temp_c=float(t), ambient_c=amb)
        c = ss.cooling
        thr = float(np.mean(relative_throughput(compute_share, clocks[ss.level] / clocks[0])))
        out.append(
            SweepPoint(
                supply_temp_c=float(t),
                ambient_temp_c=amb,
                it_power_w=ss.it_power_w,
                cooling_power_w=c.cooling_power_w,
                chiller_power_w=c.chiller_w,
                facility_power_w=c.facility_power_w,
                pue=c.pue,
                free_cooling_fraction=c.free_cooling_fraction,
                max_die_temp_c=float(ss.die_temp_c.max()),
                throttled_cards=int(np.count_nonzero(ss.level > level)),
                throughput_frac=thr,
            )
        )
    return out


def best_point(points: Sequence[SweepPoint]) -> SweepPoint | None:
    """The point of least facility power among those where no card throttles (None if all do)."""
    ok = [p for p in points if p.throttled_cards == 0]
    return min(ok, key=lambda p: p.facility_power_w) if ok else None
