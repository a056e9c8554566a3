"""Greedy plans: the fallback when a solve is late or fails, and the baseline the MILPs are judged by.

DVFS + idle (:func:`greedy_dvfs`), always within the rack caps and die limits whenever any plan is:

1. every job starts at its cheapest allowed level (die limit and SLO; jobs that do no
   clock-sensitive work stay there), every idle card in low-power idle; by monotonicity this is
   the least power every rack can reach, so if it breaks a cap no plan meets it (see
   ``models.explain``);
2. the ready reserve is woken in the racks with the most headroom first (each rack takes as many
   as fit), which fits whenever any plan's reserve fits, because step 1 left every rack at its least power;
3. levels are raised, best gain per watt first (gain = priority-weighted throughput value minus
   the marginal facility energy cost), each move only if every rack the job spans keeps its cap.
   A lazy max-heap keeps this O(moves log jobs): headroom only shrinks, so a move that no longer
   fits never fits again and the job's next best move is pushed instead.

Placement (:func:`greedy_placement`) lives in ``models.placement`` next to its MILP.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.explain import explain_infeasible, reserve_capacity
from models.problem import CycleProblem, DvfsTables, FacilityLine

IntArray = npt.NDArray[np.int64]

__all__ = ["GreedyDvfs", "greedy_dvfs"]


@dataclass(frozen=True, eq=False)
class GreedyDvfs:
    job_level: IntArray
    rack_awake: IntArray
    feasible: bool
    explanation: str


def greedy_dvfs(p: CycleProblem, t: DvfsTables, line: FacilityLine) -> GreedyDvfs:
    """The greedy DVFS + idle plan (see module docstring). ``feasible`` is False (with the reason)
    only when no plan meets the caps; the plan is then the least-power one."""
    n_lv = t.n_levels
    level = np.where(t.cheapest_level >= 0, t.cheapest_level, n_lv - 1).astype(np.int64)
    rack_p = t.rack_base_w.copy()
    np.add.at(rack_p, t.pair_rack, t.pair_power_w[np.arange(t.pair_job.size), level[t.pair_job]])
    explanation = explain_infeasible(p, t)
    awake = np.zeros(t.n_racks, dtype=np.int64)
    if explanation:
        return GreedyDvfs(level, awake, False, explanation)
    # ready reserve: racks with the most headroom first
    remaining = t.reserve
    room = reserve_capacity(t, rack_p)
    for r in np.argsort(-(t.rack_cap_w - rack_p), kind="stable"):
        if remaining <= 0:
            break
        k = int(min(room[r], remaining))
        awake[r] = k
        rack_p[r] += k * t.rack_wake_w[r]
        remaining -= k

    e_price = p.prices.energy_price_per_kwh / 1000.0 * line.b  # currency per W-hour of IT power
    order = np.argsort(t.pair_job, kind="stable")
    bounds = np.searchsorted(t.pair_job[order], np.arange(t.n_jobs + 1))
    job_pairs = [order[bounds[j] : bounds[j + 1]] for j in range(t.n_jobs)]

    # per job: its allowed levels, their powers and values, its racks and its pairs' powers at them
    moves = []
    for j in range(t.n_jobs):
        ks = np.flatnonzero(t.allowed[j])
        pairs = job_pairs[j]
        moves.append(
            (ks, t.job_power_w[j, ks], t.job_value[j, ks], t.pair_rack[pairs], t.pair_power_w[np.ix_(pairs, ks)])
        )

    def best_move(j: int) -> tuple[float, int] | None:
        """The job's move of best gain per watt that every rack it spans has room for (the first
        such level on a tie), or None."""
        cur = int(level[j])
        ks, power_w, value, racks, pair_power_w = moves[j]
        d_p = power_w - t.job_power_w[j, cur]
        gain = (value - t.job_value[j, cur]) - e_price * d_p
        head = t.rack_cap_w[racks] - rack_p[racks]
        d_pair = pair_power_w - t.pair_power_w[job_pairs[j], cur][:, None]
        ok = (gain > 1e-12) & ~(d_pair > head[:, None] + 1e-9).any(axis=0)
        if not ok.any():
            return None
        ratio = np.full(ks.size, np.inf)
        np.divide(gain, d_p, out=ratio, where=d_p > 1e-9)
        best = int(np.where(ok, ratio, -np.inf).argmax())
        return float(ratio[best]), int(ks[best])

    heap: list[tuple[float, int, int]] = []
    for j in range(t.n_jobs):
        if t.fixed[j]:
            continue
        mv = best_move(j)
        if mv is not None:
            heap.append((-mv[0], j, mv[1]))
    heapq.heapify(heap)
    while heap:
        _neg, j, k = heapq.heappop(heap)
        cur = int(level[j])
        pairs = job_pairs[j]
        delta = t.pair_power_w[pairs, k] - t.pair_power_w[pairs, cur]
        racks = t.pair_rack[pairs]
        if np.all(delta <= t.rack_cap_w[racks] - rack_p[racks] + 1e-9):
            level[j] = k
            rack_p[racks] += delta
        mv = best_move(j)
        if mv is not None:
            heapq.heappush(heap, (-mv[0], j, mv[1]))
    return GreedyDvfs(level, awake, True, "")
