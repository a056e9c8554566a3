"""Problem data for the models: plain frozen dataclasses built from numpy arrays and the twin.

A :class:`CycleProblem` is one control cycle's snapshot: which card runs which job (or is idle or
failed), each job's spec and phase, the coolant set-point options, ambient, margins and prices.
:func:`make_problem` builds one from plain arrays and refuses bad data (:class:`ProblemError`, a
``ValueError``) before any model is built.

:func:`dvfs_tables` turns a problem at one supply set-point into the numbers every model and the
heuristic share, all predicted by the twin:

* the steady power of every card of a job at every DVFS level, with leakage at its predicted die
  temperature (``twin.steady.card_steady_power_w``), summed per (job, rack): jobs are aggregated, a
  job's power in a rack is exactly the sum of its cards' powers at the job's level;
* the predicted steady die temperature of every card at every level, reduced to the hottest card
  of each job: a level whose hottest card would exceed the die limit is *excluded* for that job
  (no row is needed since a card's temperature depends only on its own job's level);
* the value of each level (priority-weighted throughput) and the levels an SLO allows;
* per rack: idle cards, their low-power and awake power, failed cards, host overhead, the cap.

A problem may name hosts that are powered off for the cycle (``host_off``, per host, only where the
site's hosts can be powered off; ``racktwin optimize`` decides them before planning, the agent's
controller leaves it ``None``): an off host draws ``rack.host_off_power_w`` instead of
``rack.host_power_w`` and its cards nothing (as ``twin.steady.site_steady_state`` judges it), so its
cards are neither idle nor available for the ready reserve and its rack's base power is that much lower.

A problem may also name jobs to run at their least-power level whatever their die limit and SLO
(``least_power_jobs``, per job, or ``None``): a job whose hottest card no level keeps under the die
limit has no plan, and one such job must not leave every other job without one; the agent's
controller names them (``agent.controller``) and its guard caps their hot cards. Their cards are
exempt from the die limit in the plan's checks (:meth:`CycleProblem.die_exempt_cards`).

A problem may say which cards are awake now (``awake_now``, per card, or ``None``: none known) and
weigh a wake tie-break (``wake_tie_w``, W per card woken; 0, the default, is off), for the ready
reserve's split between racks. The tables count each rack's idle cards awake now
(``DvfsTables.rack_awake_now``) and carry the weight (``DvfsTables.wake_tie_w``); with a weight above 0
every model charges each idle card it keeps awake on a rack beyond that count as much as ``wake_tie_w``
watts of IT power (the greedy plan fills the racks' cards awake now first). The plans are otherwise
indifferent between racks with room for the reserve, and a split that moved between decisions slept
cards on one rack and woke cards on another; the agent's setting is ``control.reserve_wake_tie_w``
(opt-in: it trades fewer sleep/wake transitions for a little energy, docs/models.md). At 0 the models
are built as without it: no extra column, row or parameter, the same greedy order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from twin.cooling import facility_cooling
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.steady import card_steady_power_w
from twin.thermal import ThermalParams
from twin.workload import JobSpec, Phase, PhaseModel, compute_utilization, relative_throughput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: The phase model the agent and the models assume (the plant may run another).
_PHASES = PhaseModel()

__all__ = [
    "CycleProblem",
    "DvfsTables",
    "FacilityLine",
    "Margins",
    "Prices",
    "ProblemError",
    "dvfs_tables",
    "facility_line",
    "make_problem",
    "phase_utilization",
]

#: card index of an idle card in ``card_job``
IDLE = -1


class ProblemError(ValueError):
    """Problem data the models refuse (NaN, negative power, unknown card, duplicate card...)."""


@dataclass(frozen=True)
class Prices:
    """The objective's prices (per hour, one currency unit).

    Defaults: a card-hour of training at the top clock is worth 2.0 (the rental price of an
    H100-class card-hour is 2-4 units), a kWh of facility energy costs 0.10 (an industrial tariff).
    One DVFS level down saves ~70 W (0.007/h) but loses ~5% of a card's throughput (0.10/h):
    the model never trades a meaningful throughput loss for tiny energy savings, it slows jobs only
    when a cap forces it or when a job's phase does no clock-sensitive work.

    ``pue_penalty_per_kwh`` prices each kWh of facility overhead above the PUE target (a soft
    constraint that never makes a problem infeasible). It must stay below ``energy_price_per_kwh *
    b / (pue_target - b)`` (b = marginal facility W per IT W, ~1.03-1.1): above that the model would
    raise IT power (wake idle cards) only to improve the PUE ratio. The default (2x the energy
    price) is far below that bound.
    """

    card_hour_value: float = 2.0
    energy_price_per_kwh: float = 0.10
    pue_penalty_per_kwh: float = 0.20

    def __post_init__(self) -> None:
        for name in ("card_hour_value", "energy_price_per_kwh", "pue_penalty_per_kwh"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ProblemError(f"prices.{name} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True)
class Margins:
    """Safety margins: rack power below its limit (W), die temperature below slowdown (K).

    The die limit of a card is its ``slowdown_temp_c`` (above it the firmware throttles and the
    plan no longer holds) minus ``die_margin_k``.
    """

    rack_margin_w: float = 1000.0
    die_margin_k: float = 2.0

    def __post_init__(self) -> None:
        for name in ("rack_margin_w", "die_margin_k"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ProblemError(f"margins.{name} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True, eq=False)
class CycleProblem:
    """One control cycle. Arrays are per card (``n_cards``) or per rack (``n_racks``).

    ``card_job[i]`` is the index into ``jobs`` of the job card ``i`` runs, or -1 when idle.
    Failed cards (``failed``) run nothing and are commanded to low-power idle.
    ``die_offset_k`` is added to every predicted die temperature of a card (>= 0; see
    :func:`make_problem`, which derives it from measured temperatures when the current levels are known).
    ``host_off`` (per host, or None: all on) names the hosts powered off for the cycle (see module docstring).
    ``ready_reserve_cards`` (per supernode) is the ready reserve: idle cards each supernode keeps awake for
    queued work (a job runs inside one supernode, so a reserve helps only the jobs placed there); the
    tables cap each by its supernode's idle cards.
    ``least_power_jobs`` (per job, or None: none) names the jobs pinned at their least-power level,
    exempt from the die limit and their SLO (see module docstring).
    ``awake_now`` (per card, or None: none) names the cards awake now, not in low-power idle (read for
    the idle cards only); ``wake_tie_w`` (W, >= 0; 0: off) is what the plans charge for each idle card
    kept awake on a rack beyond those awake now there, a tie-break for the ready reserve's split (see
    module docstring).
    """

    site: SiteSpec
    jobs: tuple[JobSpec, ...]
    job_phase: tuple[Phase, ...]
    card_job: IntArray
    failed: BoolArray
    die_temp_c: FloatArray
    die_offset_k: FloatArray
    r_total_k_per_w: FloatArray
    rack_limit_w: FloatArray
    ambient_c: float
    supply_temp_c: float
    supply_options_c: tuple[float, ...]
    ready_reserve_cards: IntArray  # per supernode
    margins: Margins = field(default_factory=Margins)
    prices: Prices = field(default_factory=Prices)
    queue: tuple[JobSpec, ...] = ()
    host_off: BoolArray | None = None
    least_power_jobs: BoolArray | None = None
    awake_now: BoolArray | None = None
    wake_tie_w: float = 0.0

    @property
    def n_cards(self) -> int:
        return self.site.n_cards

    @property
    def n_jobs(self) -> int:
        return len(self.jobs)

    @property
    def die_limit_c(self) -> float:
        return self.site.card.slowdown_temp_c - self.margins.die_margin_k

    def rack_cap_w(self) -> FloatArray:
        """Each rack's usable power: its limit minus the margin."""
        return np.asarray(self.rack_limit_w - self.margins.rack_margin_w, dtype=np.float64)

    def unpowered(self) -> BoolArray:
        """Per card: its host is off (all False when ``host_off`` is None)."""
        if self.host_off is None:
            return np.zeros(self.n_cards, dtype=np.bool_)
        return np.asarray(self.host_off[self.site.card_host()], dtype=np.bool_)

    def idle_mask(self) -> BoolArray:
        """Per card: runs no job, has not failed and its host is on (it may be woken)."""
        return np.asarray((self.card_job < 0) & ~self.failed & ~self.unpowered(), dtype=np.bool_)

    def rack_host_w(self) -> FloatArray:
        """Per rack: everything but the cards (``rack.host_overhead_w``), less what its off hosts save."""
        host = np.full(self.site.n_racks, self.site.rack.host_overhead_w, dtype=np.float64)
        if self.host_off is not None:
            host -= self.host_off.reshape(self.site.n_racks, -1).sum(axis=1) * self.site.host_saving_w()
        return host

    def die_exempt_cards(self) -> BoolArray:
        """Per card: it runs one of ``least_power_jobs`` (its die is left to the agent's guard)."""
        if self.least_power_jobs is None or not self.jobs:
            return np.zeros(self.n_cards, dtype=np.bool_)
        lp = np.asarray(self.least_power_jobs, dtype=np.bool_)
        return np.asarray((self.card_job >= 0) & lp[np.maximum(self.card_job, 0)], dtype=np.bool_)

    def job_cards(self, j: int) -> IntArray:
        return np.flatnonzero(self.card_job == j).astype(np.int64)

    def with_supply(self, supply_temp_c: float) -> CycleProblem:
        from dataclasses import replace

        return replace(self, supply_temp_c=float(supply_temp_c))


def _as_array(name: str, value: object, shape: tuple[int, ...], dtype: type) -> npt.NDArray[Any]:
    try:
        arr: npt.NDArray[Any] = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ProblemError(f"{name}: not an array of {dtype.__name__}: {exc}") from None
    if arr.ndim == 0:
        arr = np.full(shape, arr, dtype=dtype)
    if arr.shape != shape:
        raise ProblemError(f"{name}: expected shape {shape}, got {arr.shape}")
    if dtype is float and not np.all(np.isfinite(arr)):
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ProblemError(f"{name}: non-finite value (NaN or infinity) at index {bad}")
    return arr


def make_problem(
    site: SiteSpec,
    *,
    jobs: Sequence[JobSpec] = (),
    job_cards: Sequence[Sequence[int] | npt.NDArray[np.integer]] = (),
    job_phase: Sequence[Phase] | None = None,
    failed: Sequence[bool] | BoolArray | None = None,
    die_temp_c: FloatArray | Sequence[float] | float | None = None,
    current_level: IntArray | Sequence[int] | None = None,
    die_offset_k: FloatArray | Sequence[float] | float | None = None,
    thermal: ThermalParams | None = None,
    ambient_c: float | None = None,
    supply_temp_c: float | None = None,
    supply_options_c: Sequence[float] | None = None,
    rack_limit_w: FloatArray | Sequence[float] | float | None = None,
    ready_reserve_cards: int | Sequence[int] | IntArray | None = None,
    margins: Margins | None = None,
    prices: Prices | None = None,
    queue: Sequence[JobSpec] = (),
    host_off: Sequence[bool] | BoolArray | None = None,
    awake_now: Sequence[bool] | BoolArray | None = None,
    wake_tie_w: float = 0.0,
) -> CycleProblem:
    """Build and validate a :class:`CycleProblem` from plain arrays.

    ``job_cards[j]`` lists the card indices of ``jobs[j]``; ``job_phase`` defaults to COMPUTE.
    ``die_temp_c`` (measured, per card) defaults to the supply temperature. ``die_offset_k`` (per
    card, K, >= 0) is added to every predicted die temperature of the card: the caller's measure of
    the twin's persistent error (the agent passes ``agent.offsets.DieOffsetFilter``'s, which leaves
    out thermal transients). Without it, when ``current_level`` (per card, the level it runs now) is
    given, every card whose measured die temperature is above the twin's steady prediction at its
    current level and the problem's phases keeps that instantaneous excess as a (conservative)
    offset; note that right after a phase, level or supply change that excess is a transient, not an
    error. Otherwise no offset. ``ready_reserve_cards`` (awake idle cards kept for
    queued work, in each supernode: an integer, or one per supernode) defaults to the size of the
    largest queued job, clipped to each supernode's idle cards.
    ``awake_now`` (per card) names the cards awake now and ``wake_tie_w`` (W per card woken, finite,
    >= 0; 0: off) weighs the wake tie-break (see :class:`CycleProblem`).
    Raises :class:`ProblemError` on any invalid data.
    """
    n = site.n_cards
    jobs = tuple(jobs)
    if len(job_cards) != len(jobs):
        raise ProblemError(f"job_cards has {len(job_cards)} entries but there are {len(jobs)} jobs")
    phases = tuple(Phase.COMPUTE for _ in jobs) if job_phase is None else tuple(job_phase)
    if len(phases) != len(jobs):
        raise ProblemError(f"job_phase has {len(phases)} entries but there are {len(jobs)} jobs")
    for j, ph in enumerate(phases):
        if not isinstance(ph, Phase):
            raise ProblemError(f"job {jobs[j].job_id}: phase {ph!r} is not a twin.workload.Phase")
    ids = [job.job_id for job in jobs] + [job.job_id for job in queue]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ProblemError(f"job id {dup!r} appears twice (running jobs and queue must have unique ids)")
    for job in (*jobs, *queue):
        if not isinstance(job, JobSpec):
            raise ProblemError(f"{job!r} is not a twin.workload.JobSpec")
        if job.n_cards > n:
            raise ProblemError(f"job {job.job_id}: {job.n_cards} cards requested but the site has only {n}")

    card_job = _card_job(jobs, job_cards, n)

    failed_arr = np.zeros(n, dtype=bool) if failed is None else _as_array("failed", failed, (n,), bool)
    busy_failed = np.flatnonzero(failed_arr & (card_job >= 0))
    if busy_failed.size:
        c = int(busy_failed[0])
        raise ProblemError(f"card {c} is marked failed but assigned to job {jobs[int(card_job[c])].job_id}")

    fac = site.facility
    supply = fac.supply_temp_c if supply_temp_c is None else float(supply_temp_c)
    options = tuple(float(x) for x in (fac.supply_temp_options_c if supply_options_c is None else supply_options_c))
    if not options or not all(math.isfinite(x) for x in options):
        raise ProblemError("supply_options_c must be a non-empty list of finite temperatures")
    if not math.isfinite(supply):
        raise ProblemError(f"supply_temp_c must be finite, got {supply}")
    amb = fac.ambient_temp_c if ambient_c is None else float(ambient_c)
    if not (math.isfinite(amb) and -60.0 <= amb <= 60.0):
        raise ProblemError(f"ambient_c must be a finite temperature within -60..60 deg C, got {ambient_c}")

    th = thermal if thermal is not None else ThermalParams.from_site(site)
    r_tot = _as_array("thermal resistance", th.r_total_k_per_w, (n,), float).astype(np.float64)
    if np.any(r_tot <= 0):
        raise ProblemError("thermal resistance must be positive for every card")

    die = _as_array("die_temp_c", supply if die_temp_c is None else die_temp_c, (n,), float).astype(np.float64)
    offset = _die_offset(site, jobs, phases, card_job, failed_arr, die, supply, r_tot, die_offset_k, current_level)

    limits = _as_array(
        "rack_limit_w", site.rack.power_limit_w if rack_limit_w is None else rack_limit_w, (site.n_racks,), float
    ).astype(np.float64)
    if np.any(limits <= 0):
        raise ProblemError("rack_limit_w must be positive for every rack")

    off_arr = _host_off(site, jobs, card_job, host_off)
    unpowered = np.zeros(n, dtype=bool) if off_arr is None else off_arr[site.card_host()]
    idle = (card_job < 0) & ~failed_arr & ~unpowered
    reserve = _ready_reserve(site, ready_reserve_cards, queue, idle)
    tie_w = float(wake_tie_w)
    if not (math.isfinite(tie_w) and tie_w >= 0.0):
        raise ProblemError(f"wake_tie_w must be a finite number >= 0, got {wake_tie_w!r}")
    return CycleProblem(
        site=site,
        jobs=jobs,
        job_phase=phases,
        card_job=card_job,
        failed=failed_arr.astype(np.bool_),
        die_temp_c=die,
        die_offset_k=offset,
        r_total_k_per_w=r_tot,
        rack_limit_w=limits,
        ambient_c=amb,
        supply_temp_c=supply,
        supply_options_c=options,
        ready_reserve_cards=reserve,
        margins=margins if margins is not None else Margins(),
        prices=prices if prices is not None else Prices(),
        queue=tuple(queue),
        host_off=off_arr,
        awake_now=None if awake_now is None else _as_array("awake_now", awake_now, (n,), bool).astype(np.bool_),
        wake_tie_w=tie_w,
    )


def _ready_reserve(
    site: SiteSpec,
    ready_reserve_cards: int | Sequence[int] | IntArray | None,
    queue: Sequence[JobSpec],
    idle: BoolArray,
) -> IntArray:
    """``ready_reserve_cards`` checked, as one count per supernode (an integer: that many in each); the
    default, the largest queued job in each supernode, clipped to that supernode's idle cards."""
    if ready_reserve_cards is None:
        idle_sn = np.bincount(site.rack_supernode()[site.card_rack()[idle]], minlength=site.supernodes)
        largest = max((job.n_cards for job in queue), default=0)
        return np.minimum(idle_sn, largest).astype(np.int64)
    if isinstance(ready_reserve_cards, bool) or not isinstance(ready_reserve_cards, int | np.integer):
        given = np.asarray(ready_reserve_cards)
        if given.shape != (site.supernodes,) or not (given.size and np.issubdtype(given.dtype, np.integer)):
            raise ProblemError(
                f"ready_reserve_cards must be an integer or one integer per supernode ({site.supernodes}), "
                f"got {ready_reserve_cards!r}"
            )
        reserve = given.astype(np.int64)
    else:
        reserve = np.full(site.supernodes, int(ready_reserve_cards), dtype=np.int64)
    if np.any(reserve < 0):
        raise ProblemError(f"ready_reserve_cards must be >= 0, got {ready_reserve_cards}")
    return reserve


def _card_job(
    jobs: Sequence[JobSpec], job_cards: Sequence[Sequence[int] | npt.NDArray[np.integer]], n: int
) -> IntArray:
    """Per card, the index of the job it runs (``IDLE`` for none), from each job's card list."""
    fast = _card_job_checked_at_once(jobs, job_cards, n)
    if fast is not None:
        return fast
    card_job = np.full(n, IDLE, dtype=np.int64)
    for j, cards in enumerate(job_cards):  # (a list the check at once refused: which job, and why)
        idx = np.asarray(cards)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise ProblemError(f"job {jobs[j].job_id}: cards must be a list of integer card indices")
        idx = idx.astype(np.int64)
        if idx.size != jobs[j].n_cards:
            raise ProblemError(
                f"job {jobs[j].job_id}: {idx.size} cards given but the job has n_cards={jobs[j].n_cards}"
            )
        bad = idx[(idx < 0) | (idx >= n)]
        if bad.size:
            raise ProblemError(f"job {jobs[j].job_id}: unknown card index {int(bad[0])} (site has cards 0..{n - 1})")
        if np.unique(idx).size != idx.size:
            raise ProblemError(f"job {jobs[j].job_id}: a card is listed twice")
        taken = card_job[idx] >= 0
        if np.any(taken):
            c = int(idx[np.flatnonzero(taken)[0]])
            raise ProblemError(
                f"card {c} is assigned to both job {jobs[int(card_job[c])].job_id} and job {jobs[j].job_id}"
            )
        card_job[idx] = j
    return card_job


def _card_job_checked_at_once(
    jobs: Sequence[JobSpec], job_cards: Sequence[Sequence[int] | npt.NDArray[np.integer]], n: int
) -> IntArray | None:
    """:func:`_card_job` when every job's card list passes its checks, checked for all jobs at once (a
    decision's problem has a few dozen jobs, where one job at a time took ~10 numpy calls each); None
    when a check fails, for :func:`_card_job` to name the job and the reason."""
    lists = [np.asarray(cards) for cards in job_cards]
    sizes = [a.size for a in lists]
    if not all(
        a.ndim == 1 and a.size == job.n_cards and (not a.size or np.issubdtype(a.dtype, np.integer))
        for a, job in zip(lists, jobs, strict=True)
    ):
        return None
    card_job = np.full(n, IDLE, dtype=np.int64)
    if not lists:
        return card_job
    idx = np.concatenate(lists).astype(np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        return None
    if idx.size and int(np.bincount(idx, minlength=n).max()) > 1:  # a card listed twice, or by two jobs
        return None
    card_job[idx] = np.repeat(np.arange(len(lists), dtype=np.int64), sizes)
    return card_job


def _die_offset(
    site: SiteSpec,
    jobs: Sequence[JobSpec],
    phases: Sequence[Phase],
    card_job: IntArray,
    failed: BoolArray,
    die: FloatArray,
    supply: float,
    r_tot: FloatArray,
    die_offset_k: FloatArray | Sequence[float] | float | None,
    current_level: IntArray | Sequence[int] | None,
) -> FloatArray:
    """The per-card die offset :func:`make_problem` documents: given, else the measured excess over
    the steady prediction at ``current_level``, else none."""
    n = site.n_cards
    if die_offset_k is not None:
        offset = _as_array("die_offset_k", die_offset_k, (n,), float).astype(np.float64)
        if np.any(offset < 0):
            raise ProblemError(f"die_offset_k must be >= 0 (card {int(np.flatnonzero(offset < 0)[0])})")
        return offset
    if current_level is None:
        return np.zeros(n)
    model = PowerModel.from_card(site.card)
    lv = _as_array("current_level", current_level, (n,), int).astype(np.int64)
    if np.any((lv < 0) | (lv >= model.n_levels)):
        raise ProblemError(f"current_level must be within 0..{model.n_levels - 1}")
    util = np.zeros(n)
    for j, job in enumerate(jobs):
        cards = card_job == j
        util[cards] = phase_utilization(job, phases[j], site, lv[cards])
    _p, die_pred = card_steady_power_w(model, lv, util, failed, supply, r_tot)
    return np.asarray(np.maximum(die - die_pred, 0.0), dtype=np.float64)


def _host_off(
    site: SiteSpec, jobs: Sequence[JobSpec], card_job: IntArray, host_off: Sequence[bool] | BoolArray | None
) -> BoolArray | None:
    """``host_off`` checked: a site that manages hosts, no busy card on an off host."""
    if host_off is None:
        return None
    off_arr = _as_array("host_off", host_off, (site.n_hosts,), bool).astype(np.bool_)
    if off_arr.any() and not site.hosts_managed:
        raise ProblemError("host_off: the site's hosts cannot be powered off (rack.hosts_per_rack = 0)")
    busy_off = np.flatnonzero(off_arr[site.card_host()] & (card_job >= 0))
    if busy_off.size:
        c = int(busy_off[0])
        raise ProblemError(
            f"host {int(site.card_host()[c])} is off but its card {c} runs job {jobs[int(card_job[c])].job_id}"
        )
    return off_arr


# --------------------------------------------------------------------------------------------
# Derived tables
# --------------------------------------------------------------------------------------------


def phase_utilization(job: JobSpec, phase: Phase, site: SiteSpec, level: IntArray | int) -> FloatArray:
    """Average card utilization of a job in ``phase`` at ``level``.

    COMPUTE: ``twin.workload.compute_utilization`` (the busy share of a step). COMMUNICATION: the
    default ``PhaseModel.communication_utilization`` (cards wait in a stalled collective).
    CHECKPOINT and WAITING: 0 (the cards are idle while state is written or input is missing).
    """
    clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
    lv = np.asarray(level, dtype=np.int64)
    if phase == Phase.COMPUTE:
        return compute_utilization(job.compute_share, clocks[lv] / clocks[0], job.noncompute_utilization)
    if phase == Phase.COMMUNICATION:
        return np.full(lv.shape, _PHASES.communication_utilization, dtype=np.float64)
    return np.zeros(lv.shape, dtype=np.float64)


@dataclass(frozen=True)
class FacilityLine:
    """Facility power as an affine function of IT power at one set-point:
    ``facility_w ~ a_w + b * it_w``, fitted (least squares) to ``twin.cooling.facility_cooling`` over
    the IT range a plan can reach. ``max_error_w`` is the largest deviation on the fit grid."""

    supply_temp_c: float
    a_w: float
    b: float
    it_lo_w: float
    it_hi_w: float
    max_error_w: float

    def facility_w(self, it_w: float) -> float:
        return self.a_w + self.b * it_w


def facility_line(site: SiteSpec, supply_c: float, ambient_c: float, it_lo_w: float, it_hi_w: float) -> FacilityLine:
    lo, hi = float(it_lo_w), float(max(it_hi_w, it_lo_w + 1.0))
    grid = np.linspace(lo, hi, 9)
    fac = np.array([facility_cooling(site, float(it), supply_c, ambient_c).facility_power_w for it in grid])
    b, a = np.polyfit(grid, fac, 1)
    err = float(np.max(np.abs(a + b * grid - fac)))
    return FacilityLine(float(supply_c), float(a), float(b), lo, hi, err)


@dataclass(frozen=True, eq=False)
class DvfsTables:
    """Everything the DVFS models need at one supply temperature (see module docstring).

    Jobs are split into *free* jobs (a level variable each) and *fixed* jobs (non-COMPUTE phases:
    pinned at their cheapest allowed level, no variable). ``pair_*`` arrays list the (job, rack)
    pairs of every job with the job's summed card power in that rack per level.
    """

    supply_c: float
    n_levels: int
    n_racks: int
    # per job (n_jobs,) / (n_jobs, L)
    job_power_w: FloatArray  # total power of the job's cards per level
    job_die_max_c: FloatArray  # hottest card's predicted steady die temperature per level
    job_value: FloatArray  # value per hour of each level (priority-weighted throughput)
    job_throughput: FloatArray  # throughput in top-clock card equivalents per level
    allowed: BoolArray  # level allowed (die limit and SLO)
    die_ok: BoolArray  # level allowed by the die limit alone
    slo_ok: BoolArray  # level allowed by the SLO alone
    fixed: BoolArray  # job pinned (no clock-sensitive work this cycle)
    cheapest_level: IntArray  # cheapest allowed level (-1 if none)
    # per (job, rack) pair
    pair_job: IntArray
    pair_rack: IntArray
    pair_cards: IntArray
    pair_power_w: FloatArray  # (n_pairs, L)
    # per rack
    rack_base_w: FloatArray  # hosts (less the off ones' saving) + failed and idle cards of hosts on in low power
    rack_idle: IntArray  # idle cards
    rack_wake_w: FloatArray  # extra power of one idle card awake instead of low power (worst card)
    rack_cap_w: FloatArray  # limit - margin
    rack_awake_now: IntArray  # idle cards awake now (CycleProblem.awake_now): kept awake, no wake tie-break
    rack_supernode: IntArray  # the supernode of each rack (the site's numbering)
    reserve: IntArray  # per supernode of the site: awake idle cards required in its racks (capped by their idle cards)
    # per card (for plans)
    card_level_power_w: FloatArray  # (n_cards, L) steady power of each busy card at each level
    card_level_die_c: FloatArray  # (n_cards, L)
    idle_awake_level: int
    # the wake tie-break (CycleProblem.wake_tie_w): W of IT power per idle card kept awake on a rack beyond
    # rack_awake_now; 0 = off, and the models are built without it
    wake_tie_w: float = 0.0

    @property
    def n_jobs(self) -> int:
        return int(self.job_power_w.shape[0])


def dvfs_tables(p: CycleProblem, supply_c: float | None = None) -> DvfsTables:
    """Compute the twin's predictions for every job and level at ``supply_c`` (default: current)."""
    site = p.site
    supply = p.supply_temp_c if supply_c is None else float(supply_c)
    model = PowerModel.from_card(site.card)
    n_lv = model.n_levels
    n, n_racks = site.n_cards, site.n_racks
    card_rack = site.card_rack()
    busy = p.card_job >= 0
    busy_idx = np.flatnonzero(busy)
    jb = p.card_job[busy_idx]
    levels = np.arange(n_lv, dtype=np.int64)

    # utilization per busy card per level (n_busy, L)
    job_util = np.zeros((p.n_jobs, n_lv))
    for j, job in enumerate(p.jobs):
        job_util[j] = phase_utilization(job, p.job_phase[j], site, levels)
    util = job_util[jb]
    lv_grid = np.broadcast_to(levels[None, :], util.shape)
    r_b = p.r_total_k_per_w[busy_idx][:, None]
    pw, die = card_steady_power_w(model, lv_grid, util, np.zeros(util.shape, dtype=bool), supply, r_b)
    die = die + p.die_offset_k[busy_idx][:, None]
    card_level_power = np.zeros((n, n_lv))
    card_level_die = np.zeros((n, n_lv))
    card_level_power[busy_idx] = pw
    card_level_die[busy_idx] = die

    n_jobs = p.n_jobs
    job_power = np.zeros((n_jobs, n_lv))
    np.add.at(job_power, jb, pw)
    job_die = np.full((n_jobs, n_lv), -np.inf)
    np.maximum.at(job_die, jb, die)

    clocks = model.clocks_mhz
    thr = np.zeros((n_jobs, n_lv))
    value = np.zeros((n_jobs, n_lv))
    slo_ok = np.ones((n_jobs, n_lv), dtype=bool)
    fixed = np.zeros(n_jobs, dtype=bool)
    for j, job in enumerate(p.jobs):
        if p.job_phase[j] == Phase.COMPUTE:
            rel = relative_throughput(job.compute_share, clocks / clocks[0])
            thr[j] = job.n_cards * rel
            value[j] = job.priority * p.prices.card_hour_value * thr[j]
            slo_ok[j] = rel >= job.min_throughput_frac - 1e-12
        else:
            fixed[j] = True
    die_ok = job_die <= p.die_limit_c + 1e-9
    allowed = die_ok & slo_ok
    if p.least_power_jobs is not None and n_jobs:  # pinned at their least power, dies and SLO left to the guard
        pinned = np.asarray(p.least_power_jobs, dtype=bool)
        allowed[pinned] = False
        allowed[pinned, np.argmin(job_power[pinned], axis=1)] = True
        fixed |= pinned
    masked = np.where(allowed, job_power, np.inf)
    cheapest = np.where(allowed.any(axis=1), np.argmin(masked, axis=1), -1).astype(np.int64)

    key = jb * n_racks + card_rack[busy_idx]
    uniq, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    pair_power = np.zeros((uniq.size, n_lv))
    np.add.at(pair_power, inv, pw)

    idle = p.idle_mask()
    zeros = np.zeros(n)
    idle_lv = n_lv - 1
    lp_w, _ = card_steady_power_w(model, np.full(n, idle_lv), zeros, np.ones(n, dtype=bool), supply, p.r_total_k_per_w)
    aw_w, _ = card_steady_power_w(model, np.full(n, idle_lv), zeros, np.zeros(n, dtype=bool), supply, p.r_total_k_per_w)
    base = p.rack_host_w()
    powered = ~p.unpowered()  # an off host's cards draw nothing
    base += np.bincount(card_rack, weights=np.where((idle | p.failed) & powered, lp_w, 0.0), minlength=n_racks)
    wake = np.zeros(n_racks)
    np.maximum.at(wake, card_rack[idle], (aw_w - lp_w)[idle])
    rack_idle = np.bincount(card_rack[idle], minlength=n_racks).astype(np.int64)
    awake_idle = idle & (False if p.awake_now is None else p.awake_now)
    rack_awake_now = np.bincount(card_rack[awake_idle], minlength=n_racks).astype(np.int64)
    rack_sn = site.rack_supernode()
    return DvfsTables(
        supply_c=supply,
        n_levels=n_lv,
        n_racks=n_racks,
        job_power_w=job_power,
        job_die_max_c=job_die,
        job_value=value,
        job_throughput=thr,
        allowed=allowed,
        die_ok=die_ok,
        slo_ok=slo_ok,
        fixed=fixed,
        cheapest_level=cheapest,
        pair_job=(uniq // n_racks).astype(np.int64),
        pair_rack=(uniq % n_racks).astype(np.int64),
        pair_cards=counts.astype(np.int64),
        pair_power_w=pair_power,
        rack_base_w=base,
        rack_idle=rack_idle,
        rack_wake_w=wake,
        rack_cap_w=p.rack_cap_w(),
        rack_awake_now=rack_awake_now,
        rack_supernode=rack_sn,
        reserve=np.minimum(
            p.ready_reserve_cards, np.bincount(rack_sn, weights=rack_idle, minlength=site.supernodes)
        ).astype(np.int64),
        card_level_power_w=card_level_power,
        card_level_die_c=card_level_die,
        idle_awake_level=idle_lv,
        wake_tie_w=float(p.wake_tie_w),
    )


def it_power_range_w(p: CycleProblem, t: DvfsTables) -> tuple[float, float]:
    """IT power of the cheapest and of the most expensive plan (for the facility line's fit)."""
    lo_lv = np.where(t.cheapest_level >= 0, t.cheapest_level, t.n_levels - 1)
    lo = float(t.rack_base_w.sum() + t.job_power_w[np.arange(t.n_jobs), lo_lv].sum())
    hi = float(t.rack_base_w.sum() + t.job_power_w.max(axis=1, initial=0.0).sum() + (t.rack_wake_w * t.rack_idle).sum())
    return lo, hi
