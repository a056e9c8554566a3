"""What the agent believes runs where, and what the twin predicts a set of card settings will draw.

:func:`site_load` turns a :class:`twin.state.StateSnapshot` into one list of jobs on cards:

* ``running``: jobs the scheduler reported (``started`` events), on their cards that have not failed;
* ``placing``: queued jobs the agent has asked the scheduler to place (not started yet);
* ``unknown``: busy cards of no known job (the agent started after the job, or missed its event):
  a card awake and not failed with a measured utilization above ``unknown_utilization``. They are
  grouped per rack into a pseudo-job (``?busy/r3``) so that their power is budgeted and they are
  never put to sleep. A card whose last reading's interval (since its previous reading) began before
  a job left it is not one: that reading still covers the job's last moments, whatever the telemetry
  period (taking it for unknown work kept a 256-card job's freed cards from being placed on or put
  to sleep until the next reading). Unknown work is budgeted at its worst until the job's events
  say what it is: every card fully utilized at any clock (u = 1; a guess of compute share 0.8 read
  jobs computing 97% of the time 1.4 kW low on a rack of 16 cards, over its limit for as long).

:func:`predict` is the twin's prediction of card settings (levels, low-power states, power limits)
with ``twin.steady.card_steady_power_w`` (leakage at the predicted die temperature): per card power
and die temperature, per rack power (cards + host overhead + a measured extra). With
``worst_case=True`` every busy card is assumed to compute at its level during the whole period (a
job in a stall or a checkpoint may resume at any moment): that is the power a decision must budget.
Controller and guard share these functions; the guard's checks do not depend on the solver's rows.

:func:`model_gap_w` checks the card power model against the cards' own readings: per card of a
computing job, what it draws beyond the twin's power at the settings in force (its level and power
limit, computing, leakage at its measured die). A job whose work is not what the agent believes
(a wrong spec, an unknown job's guess) shows there; the controller budgets that gap.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from twin.power import PowerModel
from twin.spec import CardSpec, SiteSpec
from twin.state import JobInfo, StateSnapshot
from twin.steady import card_steady_power_w
from twin.thermal import ThermalParams
from twin.workload import JobSpec, Phase, PhaseModel, compute_utilization, relative_throughput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: The phase model the agent and the models assume (the plant may run another).
_PHASES = PhaseModel()

__all__ = [
    "MAX_DIE_OFFSET_K",
    "UNKNOWN_JOB_PREFIX",
    "JobLoad",
    "Prediction",
    "SiteLoad",
    "SiteLoads",
    "die_offsets_k",
    "job_value_per_h",
    "model_gap_w",
    "power_model",
    "predict",
    "predict_at",
    "site_load",
    "spec_of_info",
    "spec_r_total_k_per_w",
    "steady_die_c",
]

#: Job id prefix of the pseudo-jobs standing for busy cards of no known job.
UNKNOWN_JOB_PREFIX = "?busy/"
#: Assumed shape of an unknown job's work: the worst case (every card busy at any clock, u = 1).
_UNKNOWN_COMPUTE_SHARE = 1.0
_UNKNOWN_NONCOMPUTE_UTILIZATION = 1.0
#: Largest die-temperature excess over the twin's prediction that is believed (K); beyond it the
#: sensor is more likely wrong than the card (the rack's stuck/garbage checks handle that).
MAX_DIE_OFFSET_K = 40.0


@dataclass(frozen=True, eq=False)
class JobLoad:
    """One job on cards. ``spec.n_cards == cards.size`` (failed cards are left out)."""

    job_id: str
    spec: JobSpec
    cards: IntArray
    phase: Phase
    origin: str  # "running", "placing" or "unknown"

    @property
    def computing(self) -> bool:
        return self.phase == Phase.COMPUTE


@dataclass(frozen=True, eq=False)
class SiteLoad:
    jobs: tuple[JobLoad, ...]
    card_job: IntArray  # index into jobs, -1 for idle (or failed) cards
    failed: BoolArray

    @property
    def busy(self) -> BoolArray:
        return np.asarray(self.card_job >= 0, dtype=np.bool_)

    @property
    def idle(self) -> BoolArray:
        return np.asarray((self.card_job < 0) & ~self.failed, dtype=np.bool_)

    def index_of(self, job_id: str) -> int | None:
        for i, j in enumerate(self.jobs):
            if j.job_id == job_id:
                return i
        return None


def _spec_of(info_spec: JobSpec | None, job_id: str, n: int, cs: float, ncu: float, prio: float, slo: float) -> JobSpec:
    if info_spec is not None:  # specs are frozen: the job's own one where it holds all its cards
        return info_spec if info_spec.n_cards == n else replace(info_spec, n_cards=n)
    return JobSpec(
        job_id=job_id,
        n_cards=n,
        work_steps=1e9,
        step_time_s=1.0,
        compute_share=min(max(cs, 0.0), 1.0),
        priority=prio if prio > 0 else 1.0,
        noncompute_utilization=min(max(ncu, 0.0), 1.0),
        min_throughput_frac=min(max(slo, 0.0), 1.0),
    )


def spec_of_info(info: JobInfo) -> JobSpec:
    """The job's spec (one is made up from the event's fields when the spec is not known)."""
    return _spec_of(
        info.spec,
        info.job_id,
        info.n_cards,
        info.compute_share,
        info.noncompute_utilization,
        info.priority,
        info.min_throughput_frac,
    )


def site_load(
    site: SiteSpec,
    snap: StateSnapshot,
    placements: Sequence[tuple[str, Sequence[int] | IntArray]] = (),
    *,
    unknown_utilization: float = 0.05,
) -> SiteLoad:
    """Jobs on cards as the agent believes them (see the module docstring). ``placements`` are
    ``(job_id, cards)`` of queued jobs being placed; invalid ones (unknown job, wrong number of
    cards, a card busy, failed or listed twice) are left out."""
    n = site.n_cards
    failed = np.asarray(snap.card_failed, dtype=bool)
    card_job = np.full(n, -1, dtype=np.int64)
    jobs: list[JobLoad] = []
    cj = np.asarray(snap.card_job, dtype=np.int64)
    if snap.jobs:
        order = np.argsort(cj, kind="stable")
        sorted_j = cj[order]
        bounds = np.searchsorted(sorted_j, np.arange(len(snap.jobs) + 1))
        for i, info in enumerate(snap.jobs):
            cards = order[bounds[i] : bounds[i + 1]]
            cards = np.sort(cards[~failed[cards]]).astype(np.int64)
            if cards.size == 0:
                continue
            spec = _spec_of(
                info.spec,
                info.job_id,
                int(cards.size),
                info.compute_share,
                info.noncompute_utilization,
                info.priority,
                info.min_throughput_frac,
            )
            card_job[cards] = len(jobs)
            jobs.append(JobLoad(info.job_id, spec, cards, info.phase, "running"))
    queued = {q.job_id: q for q in snap.queue}
    for job_id, raw in placements:
        q = queued.get(job_id)
        if q is None:
            continue
        cards = np.asarray(raw, dtype=np.int64).reshape(-1)
        if (
            cards.size != q.n_cards
            or cards.size == 0
            or np.any((cards < 0) | (cards >= n))
            or np.unique(cards).size != cards.size
            or np.any(failed[cards])
            or np.any(card_job[cards] >= 0)
        ):
            continue
        spec = dataclasses.replace(spec_of_info(q), n_cards=int(cards.size))
        card_job[cards] = len(jobs)
        jobs.append(JobLoad(job_id, spec, np.sort(cards), Phase.WAITING, "placing"))
    util = np.asarray(snap.card_utilization, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        unknown = (card_job < 0) & ~failed & ~np.asarray(snap.card_low_power, dtype=bool) & (util > unknown_utilization)
        # only a reading whose whole interval (from the card's previous reading) came after the last job
        # left the card is evidence of work the agent does not know of
        unknown &= np.asarray(snap.card_prev_seen_s) >= np.asarray(snap.card_released_s)
    if unknown.any():
        rack = site.card_rack()
        for r in np.unique(rack[unknown]):
            cards = np.flatnonzero(unknown & (rack == r)).astype(np.int64)
            job_id = f"{UNKNOWN_JOB_PREFIX}{site.rack_names[int(r)]}"
            spec = _spec_of(
                None, job_id, int(cards.size), _UNKNOWN_COMPUTE_SHARE, _UNKNOWN_NONCOMPUTE_UTILIZATION, 1.0, 0.0
            )
            card_job[cards] = len(jobs)
            jobs.append(JobLoad(job_id, spec, cards, Phase.COMPUTE, "unknown"))
    return SiteLoad(tuple(jobs), card_job, failed)


class SiteLoads:
    """:func:`site_load` of one snapshot, built once per set of placements: one decision's loads.

    A step asks for the load of its snapshot several times (the context, the proposal before and after
    placing, the pump speeds, the guard's checks, the hosts' due cards), mostly with the same
    placements; each distinct ``placements`` is built once here (``StepContext.loads``). The loads
    handed out are shared, so their arrays are read-only. A snapshot other than this one's is not
    kept: its load is built as :func:`site_load` builds it."""

    def __init__(self, site: SiteSpec, snap: StateSnapshot, *, unknown_utilization: float = 0.05) -> None:
        self.site = site
        self.snap = snap
        self.unknown_utilization = unknown_utilization
        self._built: dict[tuple[tuple[str, tuple[int, ...]], ...], SiteLoad] = {}

    def of(self, snap: StateSnapshot, placements: Sequence[tuple[str, Sequence[int] | IntArray]] = ()) -> SiteLoad:
        """``site_load(site, snap, placements)``, the same arrays (read-only), built once per placements."""
        if snap is not self.snap:
            return site_load(self.site, snap, placements, unknown_utilization=self.unknown_utilization)
        key = tuple(
            (job_id, tuple(np.asarray(cards, dtype=np.int64).reshape(-1).tolist())) for job_id, cards in placements
        )
        load = self._built.get(key)
        if load is None:
            load = site_load(self.site, snap, key, unknown_utilization=self.unknown_utilization)
            # (``failed`` is the snapshot's own array: a read-only view of it, the snapshot's left as it is)
            load = replace(load, failed=load.failed.view())
            for a in (load.card_job, load.failed, *(j.cards for j in load.jobs)):
                a.flags.writeable = False
            self._built[key] = load
        return load


def site_load_of_problem(
    jobs: Sequence[JobSpec], job_phase: Sequence[Phase], card_job: IntArray, failed: BoolArray
) -> SiteLoad:
    """The load of a models' problem (``models.problem.CycleProblem``'s ``jobs``, ``job_phase``,
    ``card_job``, ``failed``): every job running on its cards, as ``racktwin optimize`` plans it."""
    card_job = np.asarray(card_job, dtype=np.int64)
    loads = [
        JobLoad(spec.job_id, spec, np.flatnonzero(card_job == j).astype(np.int64), job_phase[j], "running")
        for j, spec in enumerate(jobs)
    ]
    return SiteLoad(tuple(loads), card_job.copy(), np.asarray(failed, dtype=bool).copy())


# --------------------------------------------------------------------------------------------
# Predictions with the twin
# --------------------------------------------------------------------------------------------


def spec_r_total_k_per_w(site: SiteSpec) -> FloatArray:
    """Die-to-coolant-inlet resistance of every card per the spec (nominal flow)."""
    return np.asarray(ThermalParams.from_site(site).r_total_k_per_w, dtype=np.float64)


def _job_arrays(site: SiteSpec, load: SiteLoad) -> tuple[FloatArray, FloatArray, BoolArray]:
    """Per card: compute share, noncompute utilization, computing now (busy cards only)."""
    # one value per job (a trailing 0 for idle cards, card_job -1), gathered per card
    cs_j = np.array([j.spec.compute_share for j in load.jobs] + [0.0], dtype=np.float64)
    ncu_j = np.array([j.spec.noncompute_utilization for j in load.jobs] + [0.0], dtype=np.float64)
    comp_j = np.array([j.computing for j in load.jobs] + [False], dtype=bool)
    idx = np.where(load.card_job >= 0, load.card_job, len(load.jobs))
    return cs_j[idx], ncu_j[idx], comp_j[idx]


def card_utilization(
    site: SiteSpec, load: SiteLoad, level: IntArray, *, worst_case: bool, phase_now: bool = False
) -> FloatArray:
    """Utilization of every card at ``level``: busy cards computing (``worst_case``, or when their
    job computes now), in the job's current phase otherwise; idle and failed cards 0."""
    clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
    cs, ncu, comp = _job_arrays(site, load)
    busy = load.busy
    u_comp = compute_utilization(cs, clocks[level] / clocks[0], ncu)
    if worst_case:
        return np.where(busy, u_comp, 0.0)
    u = np.zeros(site.n_cards)
    u[busy & comp] = u_comp[busy & comp]
    for j in load.jobs:
        if not j.computing and j.phase == Phase.COMMUNICATION:
            u[j.cards] = _PHASES.communication_utilization
    return u


@dataclass(frozen=True, eq=False)
class Prediction:
    card_power_w: FloatArray
    card_die_c: FloatArray
    rack_power_w: FloatArray  # cards + host overhead + extra
    rack_max_die_c: FloatArray  # hottest awake card of each rack


def power_model(site: SiteSpec) -> PowerModel:
    """The site's card power model (``PowerModel.from_card``), built once per card spec: callers
    must not modify its arrays."""
    card = site.card
    hit = _POWER_MODELS.get(id(card))
    if hit is not None and hit[0] is card:
        return hit[1]
    model = PowerModel.from_card(card)
    _POWER_MODELS[id(card)] = (card, model)
    return model


#: ``power_model``'s cache: the card spec (kept alive, so its id is not reused) and its model.
_POWER_MODELS: dict[int, tuple[CardSpec, PowerModel]] = {}


def predict(
    site: SiteSpec,
    load: SiteLoad,
    level: IntArray,
    low_power: BoolArray,
    power_limit_w: FloatArray,
    inlet_c: FloatArray,
    r_total_k_per_w: FloatArray,
    die_offset_k: FloatArray,
    *,
    worst_case: bool = True,
    rack_extra_w: FloatArray | None = None,
) -> Prediction:
    """The twin's steady prediction of card settings (see the module docstring).

    A card above its power limit is held at the limit by its own power brake (the card runs the
    fastest level within it), so its power is ``min(P, limit)``; low-power and failed cards ignore
    limits (low-power idle power, 0 W). ``inlet_c`` is per card (its rack's supply)."""
    model = power_model(site)
    lv = np.clip(np.asarray(level, dtype=np.int64), 0, model.n_levels - 1)
    lp = np.asarray(low_power, dtype=bool) & ~load.busy
    u = card_utilization(site, load, lv, worst_case=worst_case)
    return predict_at(site, load, lv, lp, u, power_limit_w, inlet_c, r_total_k_per_w, die_offset_k, rack_extra_w)


def predict_at(
    site: SiteSpec,
    load: SiteLoad,
    lv: IntArray,
    lp: BoolArray,
    u: FloatArray,
    power_limit_w: FloatArray,
    inlet_c: FloatArray,
    r_total_k_per_w: FloatArray,
    die_offset_k: FloatArray,
    rack_extra_w: FloatArray | None = None,
) -> Prediction:
    """:func:`predict` from its clipped levels ``lv``, low-power cards ``lp`` (not busy) and
    utilizations ``u`` (``card_utilization``): for callers that vary only the thermal inputs.

    ``r_total_k_per_w`` and ``die_offset_k`` may also be one row of per-card values per option
    (shape (options, n_cards)): then every field of the prediction has one row per option, each
    row the same to the bit as a call with that row alone (the same elementwise operations, each
    rack's power summed over its cards in the same order)."""
    model = power_model(site)
    power, die = card_steady_power_w(model, lv, u, lp, inlet_c, r_total_k_per_w)
    off = np.asarray(die_offset_k, dtype=np.float64)
    leak = np.where(lp, model.low_power_leak_w_per_k, model.leak_w_per_k[lv])
    power = power + leak * off
    power = np.where(lp, power, np.minimum(power, np.asarray(power_limit_w, dtype=np.float64)))
    power = np.where(load.failed, 0.0, power)
    die = np.where(load.failed, np.nan, inlet_c + r_total_k_per_w * power + off)
    n_r = site.n_racks
    rows = power.shape[:-1]
    n_rows = math.prod(rows)
    # each row's racks are bins of their own: bincount adds each bin's cards in card order, as for one row
    rack = (np.arange(n_rows, dtype=np.int64)[:, None] * n_r + site.card_rack()).reshape(-1)
    rack_w = np.asarray(np.bincount(rack, weights=power.reshape(-1), minlength=n_rows * n_r), dtype=np.float64)
    rack_p = rack_w.reshape(*rows, n_r) + site.rack.host_overhead_w
    if rack_extra_w is not None:
        rack_p = rack_p + rack_extra_w
    die_awake = np.where(lp | load.failed, -np.inf, die)
    rack_die = np.full(n_rows * n_r, -np.inf)
    np.maximum.at(rack_die, rack, die_awake.reshape(-1))
    rack_die = rack_die.reshape(*rows, n_r)
    return Prediction(power, die, rack_p, rack_die)


def model_gap_w(site: SiteSpec, snap: StateSnapshot, load: SiteLoad, seen: BoolArray) -> FloatArray:
    """Per card of a job that computes now, with a finite power and die reading in ``seen``: its
    measured power minus the twin's power at the settings in force (reported level and power limit,
    the job's computing utilization, leakage at the measured die); NaN for every other card. Leakage
    at the measured die and computing cards only keep thermal and phase transients out (a job in a
    checkpoint or a stall draws less than its computing power and says nothing about it)."""
    model = power_model(site)
    lv = np.clip(np.asarray(snap.card_level, dtype=np.int64), 0, model.n_levels - 1)
    _cs, _ncu, computing = _job_arrays(site, load)
    u = card_utilization(site, load, lv, worst_case=True)
    die = np.asarray(snap.card_die_temp_c, dtype=np.float64)
    measured = np.asarray(snap.card_power_w, dtype=np.float64)
    lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
    lim = np.where(np.isfinite(lim), lim, site.card.power_limit_w)
    ok = seen & load.busy & computing & ~np.asarray(snap.card_low_power, dtype=bool) & ~load.failed
    ok &= np.isfinite(die) & np.isfinite(measured)
    twin_w = np.minimum(model.active_power_w(lv, u, np.where(ok, die, model.reference_temp_c)), lim)
    return np.asarray(np.where(ok, measured - twin_w, np.nan), dtype=np.float64)


def steady_die_c(
    site: SiteSpec,
    level: IntArray,
    utilization: FloatArray,
    low_power: BoolArray,
    power_limit_w: FloatArray,
    inlet_c: FloatArray,
    r_total_k_per_w: FloatArray,
) -> FloatArray:
    """The twin's steady die temperature of cards at ``level`` and ``utilization`` (low-power cards
    at their idle power), each held to its power limit by its own power brake."""
    model = power_model(site)
    lv = np.clip(np.asarray(level, dtype=np.int64), 0, model.n_levels - 1)
    lp = np.asarray(low_power, dtype=bool)
    power, _die = card_steady_power_w(model, lv, utilization, lp, inlet_c, r_total_k_per_w)
    power = np.where(lp, power, np.minimum(power, np.asarray(power_limit_w, dtype=np.float64)))
    return np.asarray(inlet_c + r_total_k_per_w * power, dtype=np.float64)


def die_offsets_k(
    site: SiteSpec,
    snap: StateSnapshot,
    load: SiteLoad,
    inlet_c: FloatArray,
    r_total_k_per_w: FloatArray,
) -> FloatArray:
    """The RAW, instantaneous excess of each card's measured die over the twin's steady prediction at
    its current level, phase and power limit (0..40 K; 0 where there is no valid measurement).

    Right after a change (a job leaving COMPUTE, a slower level, a cooler supply) this is a transient
    of up to tens of K, not a model error: decisions use ``agent.offsets.DieOffsetFilter``'s offsets
    (``StepContext.die_offset_k``), which take it only when the card is thermally settled."""
    model = power_model(site)
    lv = np.clip(np.asarray(snap.card_level, dtype=np.int64), 0, model.n_levels - 1)
    u = card_utilization(site, load, lv, worst_case=False)
    lp = np.asarray(snap.card_low_power, dtype=bool) & ~load.busy
    lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
    lim = np.where(np.isfinite(lim), lim, site.card.power_limit_w)
    die_pred = steady_die_c(site, lv, u, lp, lim, inlet_c, r_total_k_per_w)
    measured = np.asarray(snap.card_die_temp_c, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        off = np.where(np.isfinite(measured) & ~load.failed, measured - die_pred, 0.0)
    return np.asarray(np.clip(off, 0.0, MAX_DIE_OFFSET_K), dtype=np.float64)


def job_value_per_h(site: SiteSpec, job: JobLoad, level: int, card_hour_value: float) -> float:
    """Priority-weighted training value per hour of ``job`` at ``level`` (0 when it does not compute)."""
    if not job.computing:
        return 0.0
    clocks = site.card.clocks_mhz
    rel = float(relative_throughput(job.spec.compute_share, clocks[level] / clocks[0]))
    return job.spec.priority * card_hour_value * job.spec.n_cards * rel


def finite_or(value: float | None, default: float) -> float:
    """``value`` when it is a finite number, else ``default``."""
    return float(value) if value is not None and math.isfinite(value) else default
