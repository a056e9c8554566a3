"""Decomposition of the DVFS + idle MILP into independent parts (by connected racks, in chunks).

Rack rows couple only the jobs on that rack, and a job couples the racks it spans. Jobs never
cross a supernode (placement's rule), so the job-rack graph falls apart into connected components
of at most one supernode each. Only two rows are site-wide:

* the ready reserve (``sum_{r in n} a[r] >= reserve[n]`` per supernode ``n``: a part holds racks of
  several supernodes, a supernode's racks may fall in several parts): it is split before solving, each
  part getting, per supernode, the awake cards the greedy plan placed in its racks (the greedy fills
  each supernode's reserve in that supernode's racks: the idle cards awake now first, then racks with
  the most headroom); inside a part the MILP may still move them between its racks of the same
  supernode (its wake tie-break keeps them on the cards awake now where racks tie);
* the soft PUE row: its penalty is linear in IT power while the PUE target is exceeded (or not).
  Each part prices IT power at the marginal rate of the greedy plan's state:
  ``energy_price * b + pue_penalty * (b - pue_target) * [greedy plan exceeds the target]``.

Components are packed into chunks of about ``chunk_cards`` cards (whole components only) so that
Pyomo's per-model overhead does not dominate. Each chunk is an ordinary DVFS model
(``models.dvfs.build_dvfs_model`` on restricted tables). A chunk whose solve fails keeps the
greedy levels for its jobs; because chunks share no rack, the combination stays within every cap.
The loss in optimality against the monolithic MILP is measured in benchmarks/results-models.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.heuristic import GreedyDvfs
from models.problem import CycleProblem, DvfsTables, FacilityLine

IntArray = npt.NDArray[np.int64]

__all__ = ["Chunk", "it_price_per_wh", "restrict_tables", "split_chunks"]


@dataclass(frozen=True, eq=False)
class Chunk:
    jobs: IntArray  # global job indices
    racks: IntArray  # global rack indices
    tables: DvfsTables  # restricted and renumbered (job i of the chunk = jobs[i], rack r = racks[r])


def _components(t: DvfsTables) -> list[IntArray]:
    """Rack sets of the connected components of the job-rack graph (racks without jobs alone)."""
    parent = np.arange(t.n_racks)

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = int(parent[r])
        return r

    order = np.argsort(t.pair_job, kind="stable")
    pj, pr = t.pair_job[order], t.pair_rack[order]
    for i in range(1, pj.size):
        if pj[i] == pj[i - 1]:
            a, b = find(int(pr[i])), find(int(pr[i - 1]))
            if a != b:
                parent[a] = b
    roots = np.array([find(r) for r in range(t.n_racks)])
    return [np.flatnonzero(roots == root).astype(np.int64) for root in np.unique(roots)]


def restrict_tables(t: DvfsTables, jobs: IntArray, racks: IntArray, reserve: IntArray) -> DvfsTables:
    """The tables of a subset of jobs and racks (every rack of every job must be in ``racks``), with
    ``reserve`` per supernode of the site (its numbering is kept: ``rack_supernode``)."""
    job_map = np.full(t.n_jobs, -1, dtype=np.int64)
    job_map[jobs] = np.arange(jobs.size)
    rack_map = np.full(t.n_racks, -1, dtype=np.int64)
    rack_map[racks] = np.arange(racks.size)
    keep = job_map[t.pair_job] >= 0
    if np.any(rack_map[t.pair_rack[keep]] < 0):
        raise ValueError("restrict_tables: a job spans a rack outside the subset")
    empty = np.zeros((0, t.n_levels))
    return dataclasses.replace(
        t,
        n_racks=int(racks.size),
        job_power_w=t.job_power_w[jobs],
        job_die_max_c=t.job_die_max_c[jobs],
        job_value=t.job_value[jobs],
        job_throughput=t.job_throughput[jobs],
        allowed=t.allowed[jobs],
        die_ok=t.die_ok[jobs],
        slo_ok=t.slo_ok[jobs],
        fixed=t.fixed[jobs],
        cheapest_level=t.cheapest_level[jobs],
        pair_job=job_map[t.pair_job[keep]],
        pair_rack=rack_map[t.pair_rack[keep]],
        pair_cards=t.pair_cards[keep],
        pair_power_w=t.pair_power_w[keep],
        rack_base_w=t.rack_base_w[racks],
        rack_idle=t.rack_idle[racks],
        rack_wake_w=t.rack_wake_w[racks],
        rack_cap_w=t.rack_cap_w[racks],
        rack_awake_now=t.rack_awake_now[racks],
        rack_supernode=t.rack_supernode[racks],
        reserve=np.asarray(reserve, dtype=np.int64),
        card_level_power_w=empty,
        card_level_die_c=empty,
    )


def split_chunks(t: DvfsTables, greedy: GreedyDvfs, chunk_cards: int, cards_per_rack: int) -> list[Chunk]:
    """Components packed in rack order into chunks of about ``chunk_cards`` cards."""
    comps = sorted(_components(t), key=lambda c: int(c[0]))
    per_chunk = max(1, chunk_cards // max(cards_per_rack, 1))
    groups: list[list[IntArray]] = [[]]
    size = 0
    for c in comps:
        if size and size + c.size > per_chunk:
            groups.append([])
            size = 0
        groups[-1].append(c)
        size += c.size
    rack_of_job = np.zeros(t.n_jobs, dtype=np.int64)
    rack_of_job[t.pair_job] = t.pair_rack
    chunks: list[Chunk] = []
    for g in groups:
        if not g:
            continue
        racks = np.sort(np.concatenate(g))
        in_chunk = np.zeros(t.n_racks, dtype=bool)
        in_chunk[racks] = True
        jobs = np.flatnonzero(in_chunk[rack_of_job]).astype(np.int64) if t.n_jobs else np.zeros(0, dtype=np.int64)
        n_sn = t.reserve.size
        reserve = np.bincount(t.rack_supernode[racks], weights=greedy.rack_awake[racks], minlength=n_sn)
        reserve = reserve.astype(np.int64)
        chunks.append(Chunk(jobs, racks, restrict_tables(t, jobs, racks, reserve)))
    return chunks


def it_price_per_wh(p: CycleProblem, line: FacilityLine, greedy_it_w: float) -> float:
    """Marginal price of one W of IT power for one hour, PUE penalty linearized at the greedy plan."""
    price = p.prices.energy_price_per_kwh / 1000.0 * line.b
    excess = line.a_w + line.b * greedy_it_w - p.site.pue_target * greedy_it_w
    if excess > 0:
        price += p.prices.pue_penalty_per_kwh / 1000.0 * (line.b - p.site.pue_target)
    return float(price)
