"""Greedy plans: the fallback when a solve is late or fails, and the baseline the MILPs are judged by.

DVFS + idle (:func:`greedy_dvfs`), always within the rack caps and die limits whenever any plan is:

1. every job starts at its cheapest allowed level (die limit and SLO; jobs that do no
   clock-sensitive work stay there), every idle card in low-power idle; by monotonicity this is
   the least power every rack can reach, so if it breaks a cap no plan meets it (see
   ``models.explain``);
2. each supernode's ready reserve is woken in its racks with the most headroom first (each rack
   takes as many as fit), which fits whenever any plan's reserve fits, because step 1 left every rack
   at its least power. With a wake tie-break (``DvfsTables.wake_tie_w`` > 0) it is first kept on the idle cards
   awake now (``DvfsTables.rack_awake_now``) where their rack holds them with its jobs at their most
   power (so that keeping them there never stops a job's level from rising in step 3), racks with the
   most headroom first, and only the rest is woken as above (the order moves no card beyond a rack's
   room); a split by headroom alone moves between decisions and sleeps cards on one rack while it
   wakes others on another;
3. levels are raised, best gain per watt first (gain = priority-weighted throughput value minus
   the marginal facility energy cost), each move only if every rack the job spans keeps its cap.
   A lazy max-heap keeps this O(moves log jobs): headroom only shrinks, so a move that no longer
   fits never fits again and the job's next best move is pushed instead.

Placement (:func:`greedy_placement`) lives in ``models.placement`` next to its MILP.
"""

from __future__ import annotations

import heapq
import math
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
    # ready reserve: racks with the most headroom first; with a wake tie-break, the idle cards awake now
    # first (where their rack holds them with its jobs at their most power), then cards woken
    remaining = t.reserve.copy()  # per supernode, filled in its racks
    room = reserve_capacity(t, rack_p)
    order = np.argsort(-(t.rack_cap_w - rack_p), kind="stable")
    limits = [room]
    if t.wake_tie_w > 0.0:
        limits.insert(0, np.minimum(reserve_capacity(t, _most_power_w(t, level)), t.rack_awake_now))
    for limit in limits:
        for r in order:
            n = t.rack_supernode[r]
            k = int(min(limit[r] - awake[r], remaining[n]))
            if k <= 0:
                continue
            awake[r] += k
            rack_p[r] += k * t.rack_wake_w[r]
            remaining[n] -= k

    e_price = p.prices.energy_price_per_kwh / 1000.0 * line.b  # currency per W-hour of IT power
    order = np.argsort(t.pair_job, kind="stable")
    bounds = np.searchsorted(t.pair_job[order], np.arange(t.n_jobs + 1))
    job_pairs = [order[bounds[j] : bounds[j + 1]] for j in range(t.n_jobs)]

    # per job: its allowed levels, its powers and values at every level, its racks and its pairs' powers
    # at every level, as Python floats: a job spans a rack or two and has a handful of levels, where
    # numpy's per-call cost outweighs the arithmetic (the same IEEE operations, so the same plan)
    moves: list[tuple[list[int], list[float], list[float], list[int], list[list[float]]]] = []
    for j in range(t.n_jobs):
        pairs = job_pairs[j]
        moves.append(
            (
                np.flatnonzero(t.allowed[j]).tolist(),
                t.job_power_w[j].tolist(),
                t.job_value[j].tolist(),
                t.pair_rack[pairs].tolist(),
                t.pair_power_w[pairs].tolist(),
            )
        )
    cap_w: list[float] = t.rack_cap_w.tolist()
    rack_w: list[float] = rack_p.tolist()

    def best_move(j: int) -> tuple[float, int] | None:
        """The job's move of best gain per watt that every rack it spans has room for (the first
        such level on a tie), or None."""
        cur = int(level[j])
        ks, power_w, value, racks, pair_power_w = moves[j]
        head = [cap_w[r] - rack_w[r] + 1e-9 for r in racks]
        best_k, best_ratio = -1, -math.inf
        for k in ks:
            d_p = power_w[k] - power_w[cur]
            gain = (value[k] - value[cur]) - e_price * d_p
            if not gain > 1e-12:
                continue
            if any(pw[k] - pw[cur] > h for pw, h in zip(pair_power_w, head, strict=True)):
                continue  # a rack it spans has no room for it
            ratio = gain / d_p if d_p > 1e-9 else math.inf
            if best_k < 0 or ratio > best_ratio:
                best_k, best_ratio = k, ratio
        return None if best_k < 0 else (best_ratio, best_k)

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
        _ks, _power_w, _value, racks, pair_power_w = moves[j]
        delta = [pw[k] - pw[cur] for pw in pair_power_w]
        if all(d <= cap_w[r] - rack_w[r] + 1e-9 for d, r in zip(delta, racks, strict=True)):
            level[j] = k
            for d, r in zip(delta, racks, strict=True):
                rack_w[r] += d
        mv = best_move(j)
        if mv is not None:
            heapq.heappush(heap, (-mv[0], j, mv[1]))
    return GreedyDvfs(level, awake, True, "")


def _most_power_w(t: DvfsTables, start: IntArray) -> npt.NDArray[np.float64]:
    """Per rack: its power with every job at the most power step 3 may raise it to (a job's allowed
    levels; a fixed job stays at ``start``, its first level) and no idle card awake."""
    pairs = np.arange(t.pair_job.size)
    allowed = t.allowed[t.pair_job] & ~t.fixed[t.pair_job][:, None]
    allowed[pairs, start[t.pair_job]] = True
    most = np.where(allowed, t.pair_power_w, -np.inf).max(axis=1, initial=-np.inf)
    rack_w = t.rack_base_w.copy()
    np.add.at(rack_w, t.pair_rack, most)
    return rack_w
