"""Placing queued jobs onto free cards: a greedy heuristic and an aggregated, decomposed MILP.

Rules (issue 3): a job runs inside one supernode, on as few racks as possible (at most its
``max_racks``), on a compact block of the supernode's 3D torus (a rack is one z-plane, so a job on
``m`` racks takes ``m`` consecutive planes: a *window*), preferring racks with power headroom. A
job that cannot be placed stays queued with the reason. Thermal headroom is not weighed: a queued
job's card power is predicted at the site's mean thermal resistance, so a rack with a weak pump or
fouled plates is not avoided (its jobs then run slower under the die limit; the DVFS plan sees it).

Candidates: for a job of ``n`` cards, windows of ``ceil(n / cards_per_rack)`` up to ``max_racks``
consecutive racks (ring order) of one supernode holding at least ``n`` free cards.

Greedy (:func:`greedy_placement`): jobs by priority (then submit time, then size); each takes the
window with the fewest racks, then the least power overload, the most headroom left and the most
compact block (sum of torus distances of the chosen cards to the block's centre).

MILP (:func:`build_placement_model`, per supernode): BASELINES measured a naive job x card/rack
binary model exploding at 2,048 cards, so the MILP is aggregated and decomposed:

1. jobs are assigned to supernodes by a small knapsack MILP on free-card counts
   (``z[j,n]`` binary, ``sum_j n_j z[j,n] <= free_n``, ``sum_n z[j,n] <= 1``, maximise placed
   priority-weighted cards) -- one binary per (job, supernode);
2. inside each supernode, one binary per (job, window) and an integer card count per
   (job, rack): ``sum_w y[j,w] = z_j``, ``c[j,r] <= free_r sum_{w contains r} y[j,w]``,
   ``sum_r c[j,r] = n_j sum_w y[j,w]``, ``sum_j c[j,r] <= free_r``, overload
   ``o[r] >= sum_j p_j c[j,r] - headroom_r``; objective: placed cards first, then fewer racks
   (``y`` weighted by window length), then little overload.

Cards inside the chosen racks are then picked compactly by the same routine as the greedy, unless
that block would take the racks further over their headroom than the MILP's per-rack counts: then
each rack's count is picked compactly within the rack. A plan's ``overload_w`` is what its cards
really add over the racks' headroom (greedy and MILP alike).

Hosts (sites whose racks' hosts can be powered off, ``site.hosts_managed``): cards are picked whole
host by whole host (a host's cards share its NVLink domain, and whole idle hosts can be powered
off): a job of whole hosts takes wholly free hosts that are on, then the free cards of partly used
hosts; any other job the other way round (it fills what is left of partly used hosts); then hosts that
are not up (``PlacementProblem.card_wait_s``: a job placed on a host that is not up waits for it; the
agent offers booting hosts with the rest of their boot and marks the idle cards of off hosts unusable,
powering hosts on for queued jobs instead), the shortest wait first; each class by distance to the
block's centre. The greedy ranks windows that hold enough free cards on hosts that are up first and
scores, after the overload, the card-seconds of waiting a window needs, then the wholly free hosts it
breaks into.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyomo.environ as pyo
from pyomo.contrib.solver.solvers.highs import Highs

from models.problem import CycleProblem, ProblemError, dvfs_tables
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.steady import card_steady_power_w
from twin.workload import JobSpec, compute_utilization

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "PlacementPlan",
    "PlacementProblem",
    "QueuedJob",
    "build_placement_model",
    "greedy_placement",
    "make_placement_problem",
    "place_jobs",
]


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for cards; ``max_racks`` limits how many racks it may span (locality)."""

    spec: JobSpec
    max_racks: int | None = None


@dataclass(frozen=True, eq=False)
class PlacementProblem:
    site: SiteSpec
    free: BoolArray  # (n_cards,) idle and not failed
    queue: tuple[QueuedJob, ...]
    rack_headroom_w: FloatArray  # (n_racks,) cap - predicted power now
    card_power_w: FloatArray  # (n_queue,) predicted power of one card of each queued job at the top level
    card_wait_s: FloatArray | None = None  # (n_cards,) until the card's host is up: off or booting (None: all up)


@dataclass(frozen=True, eq=False)
class PlacementPlan:
    """Where queued jobs go. ``cards[job_id]`` card indices, ``racks[job_id]`` rack indices;
    ``unplaced[job_id]`` the reason a job stays queued."""

    cards: dict[str, IntArray]
    racks: dict[str, tuple[int, ...]]
    unplaced: dict[str, str]
    status: str
    solve_time_s: float
    source: str
    overload_w: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def card_job_ids(self, n_cards: int) -> list[str | None]:
        out: list[str | None] = [None] * n_cards
        for jid, cards in self.cards.items():
            for c in cards:
                out[int(c)] = jid
        return out


def make_placement_problem(
    p: CycleProblem,
    queue: Sequence[QueuedJob] | None = None,
    supply_c: float | None = None,
    card_wait_s: FloatArray | None = None,
) -> PlacementProblem:
    """Placement data from a cycle problem: free cards, and headroom with running jobs at the top
    level (what they may draw once caps allow) and idle cards awake; ``card_wait_s``: per card, how
    long until its host is up (0 where it is; a boot for an off host)."""
    site = p.site
    q = tuple(queue) if queue is not None else tuple(QueuedJob(j) for j in p.queue)
    for qj in q:
        if qj.max_racks is not None and qj.max_racks < 1:
            raise ProblemError(f"job {qj.spec.job_id}: max_racks must be >= 1, got {qj.max_racks}")
        if qj.spec.n_cards > site.n_cards:
            raise ProblemError(
                f"job {qj.spec.job_id}: {qj.spec.n_cards} cards requested but the site has {site.n_cards}"
            )
    supply = p.supply_temp_c if supply_c is None else supply_c
    t = dvfs_tables(p, supply)
    top = np.zeros(t.n_jobs, dtype=np.int64)
    rack_p = t.rack_base_w + t.rack_wake_w * t.rack_idle
    np.add.at(rack_p, t.pair_rack, t.pair_power_w[np.arange(t.pair_job.size), top[t.pair_job]])
    model = PowerModel.from_card(site.card)
    r = np.array([float(np.mean(p.r_total_k_per_w))])
    # a new job's card replaces an awake idle card (already counted in rack_p): only the difference is new
    lp_w = float(
        card_steady_power_w(model, np.array([model.n_levels - 1]), np.zeros(1), np.array([True]), supply, r)[0][0]
    )
    awake_w = lp_w + float(np.max(t.rack_wake_w, initial=0.0))
    pw = np.zeros(len(q))
    for i, qj in enumerate(q):
        u = np.atleast_1d(compute_utilization(qj.spec.compute_share, 1.0, qj.spec.noncompute_utilization))
        top_w = float(card_steady_power_w(model, np.array([0]), u, np.array([False]), supply, r)[0][0])
        pw[i] = max(top_w - awake_w, 0.0)
    wait = None if card_wait_s is None else np.asarray(card_wait_s, dtype=np.float64)
    return PlacementProblem(
        site=site,
        free=p.idle_mask(),
        queue=q,
        rack_headroom_w=p.rack_cap_w() - rack_p,
        card_power_w=pw,
        card_wait_s=wait,
    )


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


def _windows(site: SiteSpec, n_racks_min: int, n_racks_max: int) -> list[tuple[int, tuple[int, ...]]]:
    """(supernode, racks) of every window of consecutive racks (ring order within a supernode)."""
    z = site.racks_per_supernode
    out: list[tuple[int, tuple[int, ...]]] = []
    for sn in range(site.supernodes):
        for length in range(n_racks_min, min(n_racks_max, z) + 1):
            starts = [0] if length == z else list(range(z))
            for s0 in starts:
                out.append((sn, tuple(sn * z + (s0 + i) % z for i in range(length))))
    return out


def _torus_dist(a: IntArray, b: IntArray, dims: tuple[int, ...]) -> IntArray:
    d = np.abs(a - b)
    return np.asarray(np.minimum(d, np.asarray(dims) - d).sum(axis=-1), dtype=np.int64)


def _pick_compact(
    site: SiteSpec,
    free: BoolArray,
    racks: Sequence[int],
    n: int,
    xyz: IntArray,
    card_wait_s: FloatArray | None = None,
) -> tuple[IntArray, int]:
    """``n`` free cards of ``racks`` forming a compact block: the seed position (x, y) whose ``n``
    nearest free cards (torus distance, z measured from the window's middle plane) are closest.
    Where hosts are managed, whole hosts in the order of the module docstring."""
    if site.hosts_managed:
        return _pick_hosts(site, free, racks, n, xyz, card_wait_s)
    cpr = site.cards_per_rack
    cand = np.concatenate([np.arange(r * cpr, (r + 1) * cpr) for r in racks])
    cand = cand[free[cand]]
    if cand.size < n:
        return np.empty(0, dtype=np.int64), 0
    dims = tuple(int(d) for d in site.torus_dims)
    zs = xyz[cand, 2]
    z_mid = int(xyz[racks[0] * cpr, 2] + len(racks) // 2) % dims[2]
    gx, gy = np.meshgrid(np.arange(dims[0]), np.arange(dims[1]), indexing="ij")
    seeds = np.stack([gx.ravel(), gy.ravel(), np.full(gx.size, z_mid)], axis=1)  # (S, 3)
    d = _torus_dist(xyz[cand][None, :, :], seeds[:, None, :], dims)  # (S, C)
    order = np.argsort(d * 1000 + zs[None, :], axis=1, kind="stable")[:, :n]
    cost = np.take_along_axis(d, order, axis=1).sum(axis=1)
    best = int(np.argmin(cost))
    return np.sort(cand[order[best]]), int(cost[best])


def _pick_hosts(
    site: SiteSpec, free: BoolArray, racks: Sequence[int], n: int, xyz: IntArray, card_wait_s: FloatArray | None
) -> tuple[IntArray, int]:
    """``n`` free cards of ``racks`` host by host (see the module docstring): per seed position, hosts
    ordered by class (whole and on or partly used, in the order that suits ``n``; off last), then by
    their nearest free card's distance to the seed; the seed whose pick is of the lowest classes and
    closest wins."""
    cpr, cph = site.cards_per_rack, site.cards_per_host
    cand = np.concatenate([np.arange(r * cpr, (r + 1) * cpr) for r in racks])
    cand = cand[free[cand]]
    if cand.size < n:
        return np.empty(0, dtype=np.int64), 0
    dims = tuple(int(d) for d in site.torus_dims)
    z_mid = int(xyz[racks[0] * cpr, 2] + len(racks) // 2) % dims[2]
    gx, gy = np.meshgrid(np.arange(dims[0]), np.arange(dims[1]), indexing="ij")
    seeds = np.stack([gx.ravel(), gy.ravel(), np.full(gx.size, z_mid)], axis=1)  # (S, 3)
    d = _torus_dist(xyz[cand][None, :, :], seeds[:, None, :], dims)  # (S, C)
    host = cand // cph
    hosts, pos = np.unique(host, return_inverse=True)
    whole = free.reshape(-1, cph)[hosts].all(axis=1)
    wait = card_wait_s.reshape(-1, cph)[hosts].max(axis=1) if card_wait_s is not None else np.zeros(hosts.size)
    off = wait > 0.0
    # a job of whole hosts takes whole hosts first; any other job fills partly used hosts first
    whole_first = n % cph == 0
    cls = np.where(off, 2, np.where(whole, 0 if whole_first else 1, 1 if whole_first else 0))[pos]  # (C,)
    host_d = np.full((seeds.shape[0], hosts.size), np.iinfo(np.int64).max)
    for k in range(hosts.size):
        host_d[:, k] = d[:, pos == k].min(axis=1)
    span = int(d.max()) + 1
    # hosts not up: the shortest wait first (then distance)
    wait_rank = np.unique(wait, return_inverse=True)[1].astype(np.int64)
    host_d = np.where(off[None, :], wait_rank[None, :] * span + host_d, host_d)
    span = int(host_d.max()) + 1
    d_span = int(d.max()) + 1
    key = ((cls[None, :] * (span + 1) + host_d[:, pos]) * (hosts.size + 1) + pos[None, :]) * d_span + d
    order = np.argsort(key, axis=1, kind="stable")[:, :n]
    cost = np.take_along_axis(d, order, axis=1).sum(axis=1)
    cls_sum = cls[order].sum(axis=1)
    best = int(np.lexsort((cost, cls_sum))[0])
    return np.sort(cand[order[best]]), int(cost[best])


def _whole_free_hosts(site: SiteSpec, free: BoolArray) -> BoolArray:
    """Per host: every card free (empty where hosts are not managed: no host term in the score)."""
    if not site.hosts_managed:
        return np.zeros(0, dtype=bool)
    return np.asarray(free.reshape(site.n_hosts, site.cards_per_host).all(axis=1))


#: Windows per job length scored in full (compact block, exact per-rack power) after a cheap
#: pre-ranking by total headroom: keeps the greedy fast at 16 supernodes.
_WINDOWS_SCORED = 4


def _order(queue: Sequence[QueuedJob]) -> list[int]:
    return sorted(
        range(len(queue)),
        key=lambda i: (-queue[i].spec.priority, queue[i].spec.submit_time_s, -queue[i].spec.n_cards, i),
    )


def _why_not(pp: PlacementProblem, qj: QueuedJob, free: BoolArray) -> str:
    site = pp.site
    n = qj.spec.n_cards
    per_sn = site.cards_per_supernode
    if n > per_sn:
        return f"needs {n} cards but a supernode has only {per_sn} (a job must stay inside one supernode)"
    max_r = qj.max_racks or site.racks_per_supernode
    need_r = math.ceil(n / site.cards_per_rack)
    if need_r > max_r:
        return f"needs {n} cards = at least {need_r} racks of {site.cards_per_rack}, but max_racks is {max_r}"
    cpr = site.cards_per_rack
    free_r = np.add.reduceat(free.astype(np.int64), np.arange(0, site.n_cards, cpr))
    best = max((int(sum(free_r[r] for r in w)) for _sn, w in _windows(site, 1, max_r)), default=0)
    return (
        f"needs {n} free cards in at most {max_r} consecutive racks of one supernode; the best such window has {best}"
    )


# --------------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------------


def greedy_placement(pp: PlacementProblem) -> PlacementPlan:
    t0 = time.perf_counter()
    site = pp.site
    free = pp.free.copy()
    head = pp.rack_headroom_w.copy()
    xyz = site.card_torus_xyz()
    cpr = site.cards_per_rack
    card_rack = site.card_rack()
    cph = site.cards_per_host
    wait_s = pp.card_wait_s if pp.card_wait_s is not None else np.zeros(site.n_cards)
    up = wait_s <= 0.0
    cards: dict[str, IntArray] = {}
    racks: dict[str, tuple[int, ...]] = {}
    unplaced: dict[str, str] = {}
    for i in _order(pp.queue):
        qj = pp.queue[i]
        n = qj.spec.n_cards
        max_r = min(qj.max_racks or site.racks_per_supernode, site.racks_per_supernode)
        need_r = math.ceil(n / cpr)
        free_r = np.bincount(card_rack[free], minlength=site.n_racks)
        on_r = np.bincount(card_rack[free & up], minlength=site.n_racks)
        chosen: tuple[tuple[float, float, int, float, float, int], IntArray] | None = None
        whole = _whole_free_hosts(site, free)
        for length in range(need_r, max_r + 1):
            fits = [w for _sn, w in _windows(site, length, length) if int(free_r[list(w)].sum()) >= n]
            # enough free cards on hosts that are up first (no boot to wait for), then most headroom
            fits.sort(key=lambda w: (int(on_r[list(w)].sum()) < n, -float(np.sum(head[list(w)]))))
            for w in fits[:_WINDOWS_SCORED]:
                picked, compact = _pick_compact(site, free, w, n, xyz, pp.card_wait_s)
                if picked.size < n:
                    continue
                add = np.bincount(card_rack[picked], minlength=site.n_racks) * pp.card_power_w[i]
                after = head - add
                over = float(np.maximum(-after[list(w)], 0.0).sum())
                wait = float(wait_s[picked].sum())
                n_whole = int(whole[np.unique(picked // cph)].sum()) if whole.size else 0
                score = (over, wait, n_whole, -float(after[list(w)].min()), float(compact), len(w))
                if chosen is None or score < chosen[0]:
                    chosen = (score, picked)
            if chosen is not None:
                break  # fewest racks first
        if chosen is None:
            unplaced[qj.spec.job_id] = _why_not(pp, qj, free)
            continue
        picked = chosen[1]
        free[picked] = False
        add = np.bincount(card_rack[picked], minlength=site.n_racks) * pp.card_power_w[i]
        head -= add
        cards[qj.spec.job_id] = picked
        racks[qj.spec.job_id] = tuple(sorted({int(r) for r in card_rack[picked]}))
    return PlacementPlan(
        cards, racks, unplaced, "heuristic", time.perf_counter() - t0, "greedy", _overload_w(pp, cards)
    )


# --------------------------------------------------------------------------------------------
# MILP (aggregated per rack counts, decomposed by supernode)
# --------------------------------------------------------------------------------------------


def build_supernode_assignment_model(pp: PlacementProblem, jobs: Sequence[int]) -> pyo.ConcreteModel:
    """Stage 1: ``z[j,n]`` job to supernode (knapsack on free cards per supernode)."""
    site = pp.site
    per_sn = site.cards_per_supernode
    free_sn = np.add.reduceat(pp.free.astype(np.int64), np.arange(0, site.n_cards, per_sn))
    m = pyo.ConcreteModel(name="placement_supernodes")
    m.J = pyo.Set(initialize=list(jobs))
    m.N = pyo.RangeSet(0, site.supernodes - 1)
    # (job, supernode) pairs where at least one window holds enough free cards for the job alone
    free_r = np.bincount(site.card_rack()[pp.free], minlength=site.n_racks)
    pairs = set()
    for j in jobs:
        qj = pp.queue[j]
        need_r = math.ceil(qj.spec.n_cards / site.cards_per_rack)
        max_r = min(qj.max_racks or site.racks_per_supernode, site.racks_per_supernode)
        for sn, w in _windows(site, need_r, max_r):
            if int(free_r[list(w)].sum()) >= qj.spec.n_cards:
                pairs.add((j, sn))
    m.z = pyo.Var(m.J, m.N, domain=pyo.Binary, bounds=lambda m, j, n: (0, 1 if (j, n) in pairs else 0))
    _add_assignment_constraints(m, pp, free_sn)
    m.obj = pyo.Objective(
        expr=sum(
            pp.queue[j].spec.priority * pp.queue[j].spec.n_cards * m.z[j, n] * (1.0 + 1e-3 * free_sn[n] / per_sn)
            for j in m.J
            for n in m.N
        ),
        sense=pyo.maximize,
    )
    return m


def _add_assignment_constraints(m: pyo.ConcreteModel, pp: PlacementProblem, free_sn: IntArray) -> None:
    """``sum_n z[j,n] <= 1`` (one supernode per job); ``sum_j n_j z[j,n] <= free_n``."""
    m.one_sn = pyo.Constraint(m.J, rule=lambda m, j: sum(m.z[j, n] for n in m.N) <= 1)
    m.sn_cap = pyo.Constraint(
        m.N, rule=lambda m, n: sum(pp.queue[j].spec.n_cards * m.z[j, n] for j in m.J) <= int(free_sn[n])
    )


def build_placement_model(pp: PlacementProblem, supernode: int, jobs: Sequence[int]) -> pyo.ConcreteModel:
    """Stage 2: windows and per-rack card counts of ``jobs`` inside one supernode."""
    site = pp.site
    cpr = site.cards_per_rack
    z = site.racks_per_supernode
    racks = list(range(supernode * z, (supernode + 1) * z))
    free_r = np.bincount(site.card_rack()[pp.free], minlength=site.n_racks)
    m = pyo.ConcreteModel(name=f"placement_sn{supernode}")
    win: dict[tuple[int, int], tuple[int, ...]] = {}
    for j in jobs:
        qj = pp.queue[j]
        need_r = math.ceil(qj.spec.n_cards / cpr)
        max_r = min(qj.max_racks or z, z)
        w_i = 0
        for sn, w in _windows(site, need_r, max_r):
            if sn != supernode or int(free_r[list(w)].sum()) < qj.spec.n_cards:
                continue
            win[(j, w_i)] = w
            w_i += 1
    m.J = pyo.Set(initialize=list(jobs))
    m.W = pyo.Set(initialize=list(win), dimen=2)
    m.R = pyo.Set(initialize=racks)
    m.JR = pyo.Set(initialize=[(j, r) for j in jobs for r in racks], dimen=2)
    m._win = win
    m._free_r = {r: int(free_r[r]) for r in racks}
    m.y = pyo.Var(m.W, domain=pyo.Binary)
    m.c = pyo.Var(m.JR, domain=pyo.NonNegativeIntegers, bounds=lambda m, j, r: (0, m._free_r[r]))
    m.o = pyo.Var(m.R, domain=pyo.NonNegativeReals)
    _add_window_constraints(m, pp)
    _add_rack_capacity_constraints(m, pp)
    _add_headroom_constraints(m, pp)
    big = 1.0 + max((pp.queue[j].spec.priority * pp.queue[j].spec.n_cards for j in jobs), default=1.0)
    m.obj = pyo.Objective(
        expr=sum(big * pp.queue[j].spec.priority * pp.queue[j].spec.n_cards * m.y[j, w] for (j, w) in m.W)
        - sum(len(win[(j, w)]) * m.y[j, w] for (j, w) in m.W)
        - 1e-4 * sum(m.o[r] for r in m.R),
        sense=pyo.maximize,
    )
    return m


def _add_window_constraints(m: pyo.ConcreteModel, pp: PlacementProblem) -> None:
    """At most one window per job; cards only in the chosen window's racks; all cards or none:
    ``sum_w y[j,w] <= 1``, ``c[j,r] <= free_r sum_{w contains r} y[j,w]``, ``sum_r c[j,r] = n_j sum_w y[j,w]``."""
    by_job: dict[int, list[int]] = {}
    for j, w in m._win:
        by_job.setdefault(j, []).append(w)

    def one_window(m: pyo.ConcreteModel, j: int) -> object:
        if j not in by_job:
            return pyo.Constraint.Skip
        return sum(m.y[j, w] for w in by_job[j]) <= 1

    def in_window(m: pyo.ConcreteModel, j: int, r: int) -> object:
        if j not in by_job:
            return m.c[j, r] == 0
        return m.c[j, r] <= m._free_r[r] * sum(m.y[j, w] for w in by_job[j] if r in m._win[(j, w)])

    def all_cards(m: pyo.ConcreteModel, j: int) -> object:
        if j not in by_job:
            return pyo.Constraint.Skip
        return sum(m.c[j, r] for r in m.R) == pp.queue[j].spec.n_cards * sum(m.y[j, w] for w in by_job[j])

    m.one_window = pyo.Constraint(m.J, rule=one_window)
    m.in_window = pyo.Constraint(m.JR, rule=in_window)
    m.all_cards = pyo.Constraint(m.J, rule=all_cards)


def _add_rack_capacity_constraints(m: pyo.ConcreteModel, pp: PlacementProblem) -> None:
    """Free cards: ``sum_j c[j,r] <= free_r``."""
    m.rack_free = pyo.Constraint(m.R, rule=lambda m, r: sum(m.c[j, r] for j in m.J) <= m._free_r[r])


def _add_headroom_constraints(m: pyo.ConcreteModel, pp: PlacementProblem) -> None:
    """Power headroom (soft; DVFS absorbs the rest): ``o[r] >= sum_j p_j c[j,r] - headroom_r``."""
    m.headroom = pyo.Constraint(
        m.R,
        rule=lambda m, r: (
            m.o[r] >= sum(float(pp.card_power_w[j]) * m.c[j, r] for j in m.J) - float(pp.rack_headroom_w[r])
        ),
    )


#: One pyomo HiGHS interface per thread for the placement models: each solve gives it a new model,
#: which it loads into a new HiGHS instance from a clean state (pyomo's set_instance), so reusing it
#: saves only the interface's construction, per solve.
_solvers = threading.local()


def _solve(m: pyo.ConcreteModel, time_limit_s: float, gap: float) -> bool:
    # looked up when called, so that a wrapper set on the module (benchmarks/bench_policy_cpu.py --split) counts it
    from models.dvfs_solver import highs_solve

    solver = getattr(_solvers, "highs", None)
    if solver is None:
        solver = _solvers.highs = Highs()
    info = highs_solve(solver, m, max(time_limit_s, 0.01), gap)
    return info.objective is not None


def milp_placement(pp: PlacementProblem, time_limit_s: float = 2.0, mip_rel_gap: float = 1e-3) -> PlacementPlan:
    """The decomposed MILP (module docstring). Jobs the MILP leaves out get the greedy's reason."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    site = pp.site
    xyz = site.card_torus_xyz()
    card_rack = site.card_rack()
    jobs = [i for i in _order(pp.queue) if pp.queue[i].spec.n_cards <= site.cards_per_supernode]
    m1 = build_supernode_assignment_model(pp, jobs)
    if not jobs or not _solve(m1, deadline - time.perf_counter(), mip_rel_gap):
        g = greedy_placement(pp)
        return PlacementPlan(g.cards, g.racks, g.unplaced, "fallback", time.perf_counter() - t0, "greedy", g.overload_w)
    by_sn: dict[int, list[int]] = {}
    for j in jobs:
        for n in range(site.supernodes):
            if (pyo.value(m1.z[j, n], exception=False) or 0.0) > 0.5:
                by_sn.setdefault(n, []).append(j)
    free = pp.free.copy()
    cards: dict[str, IntArray] = {}
    racks: dict[str, tuple[int, ...]] = {}
    status = "optimal"
    for n, js in sorted(by_sn.items()):
        m2 = build_placement_model(pp, n, js)
        left = (deadline - time.perf_counter()) / max(len(by_sn), 1)
        if not _solve(m2, left, mip_rel_gap):
            status = "partial"
            continue
        for j, w in m2._win:
            if (pyo.value(m2.y[j, w], exception=False) or 0.0) < 0.5:
                continue
            qj = pp.queue[j]
            counts = {r: cnt for r in m2._win[(j, w)] if (cnt := round(pyo.value(m2.c[j, r], exception=False) or 0.0))}
            picked = _pick_planned(pp, j, free, counts, xyz, cards)
            if picked.size != qj.spec.n_cards:  # left to the greedy pass below, as a stage that failed
                status = "partial"
                continue
            free[picked] = False
            cards[qj.spec.job_id] = picked
            racks[qj.spec.job_id] = tuple(sorted({int(r) for r in card_rack[picked]}))
    # jobs the decomposition left out (stage 2 could not fit them): a greedy pass on what is left
    left_idx = [i for i in range(len(pp.queue)) if pp.queue[i].spec.job_id not in cards]
    unplaced: dict[str, str] = {}
    if left_idx:
        head = pp.rack_headroom_w.copy()
        for i, q in enumerate(pp.queue):
            if q.spec.job_id in cards:
                head -= np.bincount(card_rack[cards[q.spec.job_id]], minlength=site.n_racks) * pp.card_power_w[i]
        rest = PlacementProblem(
            site,
            free,
            tuple(pp.queue[i] for i in left_idx),
            head,
            pp.card_power_w[np.asarray(left_idx)],
            pp.card_wait_s,
        )
        g = greedy_placement(rest)
        cards.update(g.cards)
        racks.update(g.racks)
        unplaced.update(g.unplaced)
    return PlacementPlan(cards, racks, unplaced, status, time.perf_counter() - t0, "milp", _overload_w(pp, cards))


def _pick_planned(
    pp: PlacementProblem, j: int, free: BoolArray, counts: dict[int, int], xyz: IntArray, placed: dict[str, IntArray]
) -> IntArray:
    """The cards for queued job ``j`` from the MILP's per-rack ``counts``: the compact block of its
    racks when that is no more over the racks' headroom (given the jobs ``placed`` so far) than
    taking each rack's count there, else each rack's count (compactly within the rack). The compact
    block of a window ignores the counts, and a block leaning on the rack with less headroom took a
    rack 660 W over where the counts planned 141 W. No cards when the counts do not add up to the
    job's cards (read off HiGHS's solution and rounded; ``sum_r c[j,r] = n_j`` holds only within
    the solver's tolerances): a count too many took a card more than the job asked for (the caller
    leaves the job to the greedy pass, as when a stage fails)."""
    site = pp.site
    n = pp.queue[j].spec.n_cards
    if sum(counts.values()) != n:
        return np.empty(0, dtype=np.int64)
    block, _ = _pick_compact(site, free, sorted(counts), n, xyz, pp.card_wait_s)
    left = free.copy()
    parts: list[IntArray] = []
    for r, cnt in sorted(counts.items()):
        part, _ = _pick_compact(site, left, [r], cnt, xyz, pp.card_wait_s)
        left[part] = False
        parts.append(part)
    by_count = np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
    if by_count.size < n:
        return block
    if block.size < n:
        return by_count
    job_id = pp.queue[j].spec.job_id
    if _overload_w(pp, {**placed, job_id: by_count}) < _overload_w(pp, {**placed, job_id: block}) - 1e-6:
        return by_count
    return block


def _overload_w(pp: PlacementProblem, cards: dict[str, IntArray]) -> float:
    """What the placed jobs' cards (each at ``pp.card_power_w``) take the racks over their headroom,
    summed over racks (a rack over before any placement counts only what the jobs add)."""
    site = pp.site
    card_rack = site.card_rack()
    load = np.zeros(site.n_racks)
    for i, q in enumerate(pp.queue):
        c = cards.get(q.spec.job_id)
        if c is not None:
            load += np.bincount(card_rack[c], minlength=site.n_racks) * pp.card_power_w[i]
    return float(np.maximum(load - np.maximum(pp.rack_headroom_w, 0.0), 0.0).sum())


def place_jobs(
    pp: PlacementProblem, *, method: str = "auto", time_limit_s: float = 2.0, mip_rel_gap: float = 1e-3
) -> PlacementPlan:
    """Place queued jobs. ``method``: "greedy", "milp", or "auto" (MILP, keeping the greedy plan
    when it places at least as many priority-weighted cards; the greedy at 16+ supernodes)."""
    if method == "greedy":
        return greedy_placement(pp)
    g = greedy_placement(pp)
    if method == "auto" and pp.site.supernodes >= 16:
        return g
    m = milp_placement(pp, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap)
    if method == "milp":
        return m

    def score(plan: PlacementPlan) -> tuple[float, float]:
        placed = sum(q.spec.priority * q.spec.n_cards for q in pp.queue if q.spec.job_id in plan.cards)
        return placed, -plan.overload_w

    return m if score(m) > score(g) else g
