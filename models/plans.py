"""Plans the models hand back (plain dataclasses, never Pyomo) and their assessment by the twin.

:func:`assess_dvfs` expands a plan's decisions (one level per job, awake idle cards per rack, the
supply set-point) to every card and predicts its steady power and die temperature with the twin
(``twin.steady.card_steady_power_w``, leakage at the predicted die temperature) and the facility
with ``twin.cooling.facility_cooling``: the numbers a plan is judged by, not the model's rows.
Hosts the problem powers off (``CycleProblem.host_off``) are judged as the twin does: their cards
draw nothing (dies at the supply temperature) and the host draws its off power.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.problem import CycleProblem, DvfsTables, phase_utilization
from twin.cooling import facility_cooling
from twin.power import PowerModel
from twin.steady import card_steady_power_w
from twin.workload import Phase, relative_throughput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["CyclePlan", "DvfsPlan", "SetpointOption", "SetpointPlan", "SolveStatus", "assess_dvfs"]


class SolveStatus(enum.Enum):
    """What a solve gave. OPTIMAL: within the requested gap. FEASIBLE: the time limit hit with an
    incumbent. INFEASIBLE: no plan meets the caps (see the explanation). TIMEOUT_NO_SOLUTION: the
    limit hit before any incumbent. ERROR: the solver failed. FALLBACK: the plan is the greedy
    heuristic's (the solver gave nothing usable in time)."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    TIMEOUT_NO_SOLUTION = "timeout_no_solution"
    ERROR = "error"
    FALLBACK = "fallback"

    @property
    def has_plan(self) -> bool:
        return self in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE, SolveStatus.FALLBACK)


@dataclass(frozen=True, eq=False)
class DvfsPlan:
    """A DVFS + low-power idle plan at one supply set-point, with the twin's predictions.

    ``job_level[j]``: the level of job ``j``. ``rack_awake[r]``: idle cards of rack ``r`` kept awake
    (ready for queued work); the others are in low-power idle. Per card: ``card_level`` (idle cards
    hold the slowest level) and ``card_low_power``. Predictions: per card power and steady die
    temperature, per rack power (cards + host), IT and facility power (twin, exact), PUE.
    """

    supply_temp_c: float
    job_level: IntArray
    rack_awake: IntArray
    card_level: IntArray
    card_low_power: BoolArray
    card_power_w: FloatArray
    card_die_temp_c: FloatArray
    rack_power_w: FloatArray
    rack_max_die_temp_c: FloatArray
    it_power_w: float
    facility_power_w: float
    pue: float
    pue_excess_w: float  # facility power above pue_target x IT (the soft constraint's slack)
    throughput: float  # top-clock card equivalents of jobs in COMPUTE
    value_per_h: float
    energy_cost_per_h: float
    objective_per_h: float  # value - energy cost - PUE penalty, evaluated with the twin

    def rack_headroom_w(self, p: CycleProblem) -> FloatArray:
        return np.asarray(p.rack_cap_w() - self.rack_power_w, dtype=np.float64)

    def within_caps(self, p: CycleProblem, tol_w: float = 1e-6, tol_k: float = 1e-6) -> bool:
        """True if every rack is within limit - margin and every card within its die limit."""
        return bool(
            np.all(self.rack_power_w <= p.rack_cap_w() + tol_w)
            and np.all(self.card_die_temp_c <= p.die_limit_c + tol_k)
        )


@dataclass(frozen=True)
class SetpointOption:
    supply_temp_c: float
    status: SolveStatus
    objective_per_h: float | None
    facility_power_w: float | None
    it_power_w: float | None
    solve_time_s: float


@dataclass(frozen=True)
class SetpointPlan:
    """The chosen coolant supply set-point and what each option gave (infeasible ones included)."""

    supply_temp_c: float
    options: tuple[SetpointOption, ...]


@dataclass(frozen=True, eq=False)
class CyclePlan:
    """What a controller needs every control period (see :func:`models.solve.plan_cycle`)."""

    status: SolveStatus
    dvfs: DvfsPlan | None
    setpoint: SetpointPlan
    solve_time_s: float
    explanation: str
    objective_per_h: float | None
    mip_gap: float | None
    source: str  # "milp" or "greedy"

    @property
    def supply_temp_c(self) -> float:
        return self.setpoint.supply_temp_c


def awake_cards(p: CycleProblem, rack_awake: IntArray) -> BoolArray:
    """Which idle cards are awake: the first ``rack_awake[r]`` idle cards of each rack (cards of hosts
    that are off are not idle, ``CycleProblem.idle_mask``)."""
    site = p.site
    idle = p.idle_mask()
    card_rack = site.card_rack()
    awake = np.zeros(site.n_cards, dtype=bool)
    idle_idx = np.flatnonzero(idle)
    if idle_idx.size == 0:
        return awake
    racks = card_rack[idle_idx]
    # rank of each idle card inside its rack (idle_idx is sorted, so ranks follow card order)
    start = np.searchsorted(racks, racks, side="left")
    rank = np.arange(idle_idx.size) - start
    awake[idle_idx[rank < np.asarray(rack_awake)[racks]]] = True
    return awake


def assess_dvfs(
    p: CycleProblem,
    job_level: IntArray,
    rack_awake: IntArray,
    supply_c: float,
    tables: DvfsTables | None = None,
) -> DvfsPlan:
    """Expand decisions to every card and predict power, temperatures and the facility with the twin."""
    site = p.site
    model = PowerModel.from_card(site.card)
    n = site.n_cards
    idle_lv = model.n_levels - 1
    jl = np.asarray(job_level, dtype=np.int64)
    ra = np.asarray(rack_awake, dtype=np.int64)
    busy = p.card_job >= 0
    level = np.full(n, idle_lv, dtype=np.int64)
    level[busy] = jl[p.card_job[busy]]
    util = np.zeros(n)
    for j, job in enumerate(p.jobs):
        cards = p.card_job == j
        util[cards] = phase_utilization(job, p.job_phase[j], site, int(jl[j]))
    low_power = ~busy & ~awake_cards(p, ra)
    power, die = card_steady_power_w(model, level, util, low_power, supply_c, p.r_total_k_per_w)
    die = die + p.die_offset_k
    unpowered = p.unpowered()
    power = np.where(unpowered, 0.0, power)
    die = np.where(unpowered, float(supply_c), die)
    card_rack = site.card_rack()
    rack_power = np.bincount(card_rack, weights=power, minlength=site.n_racks).astype(np.float64)
    rack_power += p.rack_host_w()
    rack_max_die = np.full(site.n_racks, -np.inf)
    np.maximum.at(rack_max_die, card_rack, die)
    it = float(rack_power.sum())
    cp = facility_cooling(site, it, supply_c, p.ambient_c)
    fac = cp.facility_power_w
    excess = max(0.0, fac - site.pue_target * it)
    thr = 0.0
    val = 0.0
    clocks = model.clocks_mhz
    for j, job in enumerate(p.jobs):
        if p.job_phase[j] == Phase.COMPUTE:
            t = job.n_cards * float(relative_throughput(job.compute_share, clocks[jl[j]] / clocks[0]))
            thr += t
            val += job.priority * p.prices.card_hour_value * t
    cost = p.prices.energy_price_per_kwh * fac / 1000.0
    obj = val - cost - p.prices.pue_penalty_per_kwh * excess / 1000.0
    return DvfsPlan(
        supply_temp_c=float(supply_c),
        job_level=jl,
        rack_awake=ra,
        card_level=level,
        card_low_power=low_power,
        card_power_w=power,
        card_die_temp_c=die,
        rack_power_w=rack_power,
        rack_max_die_temp_c=rack_max_die,
        it_power_w=it,
        facility_power_w=fac,
        pue=cp.pue,
        pue_excess_w=excess,
        throughput=thr,
        value_per_h=val,
        energy_cost_per_h=cost,
        objective_per_h=obj,
    )
