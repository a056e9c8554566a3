"""With the opt-in wake tie-break (``CycleProblem.wake_tie_w``, the agent's ``control.reserve_wake_tie_w``)
the ready reserve stays on the idle cards awake now where racks tie; off (0, the default) the plans are
the plans without it.

Racks with room for the reserve differ by fractions of a watt in a card's wake power, so every plan is
indifferent to the reserve's split between them, and the split moves between decisions: the agent
(each rack keeps the awake idle cards the plan counts there) sleeps cards on one rack and wakes cards on
another (+21% low-power transitions over the nominal day, benchmarks/results-evaluation.md). With the
tie-break each model charges a card kept awake beyond those awake now on its rack a watt's worth (here
1 W): the Pyomo MILP (one-shot and persistent), its direct highspy matrix, the greedy plan, the chunked
solve and the joint set-point MILP all keep the reserve on the cards awake now, and the tie-break never
costs a job's level. Off, the models are built as without it (no column, row or term: the solver takes
the same path), and the reserve goes where it went before the tie-break, cards awake now or not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyomo.environ as pyo
import pytest
from models_helpers import job, problem, rack_cards

from models.cooling import build_joint_setpoint_model, solve_joint_setpoint
from models.dvfs import build_dvfs_model, dvfs_matrix
from models.dvfs_highspy import solve_matrix_highspy
from models.dvfs_solver import DecomposedDvfsSolver, DvfsSolver
from models.heuristic import greedy_dvfs
from models.plans import SolveStatus
from models.problem import (
    CycleProblem,
    DvfsTables,
    FacilityLine,
    ProblemError,
    dvfs_tables,
    facility_line,
    it_power_range_w,
    make_problem,
)
from models.solve import CyclePlanner, plan_cycle
from twin.spec import SiteSpec

pytestmark = pytest.mark.models

IntArray = npt.NDArray[np.int64]

#: the weight the tie-break was measured at (benchmarks/results-evaluation.md)
TIE_W = 1.0


def _tables(p: CycleProblem) -> tuple[DvfsTables, FacilityLine]:
    t = dvfs_tables(p)
    return t, facility_line(p.site, p.supply_temp_c, p.ambient_c, *it_power_range_w(p, t))


def _pyomo(p: CycleProblem) -> tuple[IntArray, IntArray]:
    t, line = _tables(p)
    info, level, awake = DvfsSolver(persistent=False).solve(p, t, line, 30.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and level is not None and awake is not None
    return level, awake


def _highspy(p: CycleProblem) -> tuple[IntArray, IntArray]:
    t, line = _tables(p)
    mat = dvfs_matrix(p, t, line)
    info, sol = solve_matrix_highspy(mat, 30.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and sol is not None
    level = np.argmax(sol[: mat.n_x].reshape(t.n_jobs, t.n_levels), axis=1).astype(np.int64)
    awake = np.zeros(t.n_racks, dtype=np.int64)
    awake[mat.idle_racks] = np.round(sol[mat.n_x : mat.n_x + mat.idle_racks.size]).astype(np.int64)
    return level, awake


def _greedy(p: CycleProblem) -> tuple[IntArray, IntArray]:
    t, line = _tables(p)
    g = greedy_dvfs(p, t, line)
    assert g.feasible
    return g.job_level, g.rack_awake


def _chunked(p: CycleProblem) -> tuple[IntArray, IntArray]:
    t, line = _tables(p)
    info, level, awake = DecomposedDvfsSolver(chunk_cards=64).solve(p, t, line, 30.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and level is not None and awake is not None
    return level, awake


def _joint(p: CycleProblem) -> tuple[IntArray, IntArray]:
    status, plan, _sp, _s = solve_joint_setpoint(p, time_limit_s=30.0, mip_rel_gap=1e-6)
    assert status == SolveStatus.OPTIMAL and plan is not None
    return plan.job_level, plan.rack_awake


def _cycle(p: CycleProblem) -> tuple[IntArray, IntArray]:
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=30.0, mip_rel_gap=1e-6)
    assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None and plan.source == "milp"
    return plan.dvfs.job_level, plan.dvfs.rack_awake


PLANS: dict[str, Callable[[CycleProblem], tuple[IntArray, IntArray]]] = {
    "pyomo": _pyomo,
    "highspy": _highspy,
    "greedy": _greedy,
    "chunked": _chunked,
    "joint": _joint,
    "plan_cycle": _cycle,
}


def _site_problem(
    site: SiteSpec, reserve: int, awake: list[int], limit_w: float | None = None, tie_w: float = TIE_W
) -> CycleProblem:
    """Jobs a (all of r0), b (32 of r1's cards) and c (48 of r2's): 32, 16 and 64 idle cards on r1, r2
    and r3..r7, every rack with room for the reserve; ``awake`` lists the cards awake now, ``tie_w`` weighs
    the wake tie-break."""
    jobs = [job("a", 64), job("b", 32), job("c", 48)]
    cards = [rack_cards(0), rack_cards(1, 32), rack_cards(2, 48)]
    p = problem(site, jobs, cards, reserve=reserve, options=[30.0], limit_w=limit_w)
    mask = np.zeros(site.n_cards, dtype=bool)
    mask[awake] = True
    return dataclasses.replace(p, awake_now=mask, wake_tie_w=tie_w)


@pytest.mark.parametrize("name", list(PLANS))
def test_the_reserve_stays_on_the_rack_whose_idle_cards_are_awake_now(site: SiteSpec, name: str) -> None:
    """8 idle cards of r6 are awake now and the reserve is 8: every plan keeps those 8 (r1..r7 tie: the
    same cards, the same room). Was: the MILPs put the reserve on r3 (the first racks), the greedy plan
    on r3 (the most headroom, first in rack order), waking 8 and putting r6's 8 to sleep."""
    p = _site_problem(site, 8, rack_cards(6, 8, start=10))
    t = dvfs_tables(p)
    assert t.rack_awake_now.tolist() == [0, 0, 0, 0, 0, 0, 8, 0]
    _level, awake = PLANS[name](p)
    assert awake.tolist() == [0, 0, 0, 0, 0, 0, 8, 0]


@pytest.mark.parametrize("name", list(PLANS))
def test_a_reserve_beyond_the_cards_awake_now_keeps_all_of_them_and_wakes_the_rest(site: SiteSpec, name: str) -> None:
    """5 cards awake now on r3 and 5 on r6 (and b's 32 busy cards on r1, which are no idle cards): a
    reserve of 12 keeps all 10 and wakes 2 more; a reserve of 8 keeps 8 of the 10 and wakes none."""
    awake_now = rack_cards(3, 5, start=20) + rack_cards(6, 5) + rack_cards(1, 32)
    _level, awake = PLANS[name](_site_problem(site, 12, awake_now))
    assert awake.sum() == 12 and awake[3] >= 5 and awake[6] >= 5
    _level, awake = PLANS[name](_site_problem(site, 8, awake_now))
    assert awake.sum() == 8 and awake[3] + awake[6] == 8


@pytest.mark.parametrize("name", list(PLANS))
def test_the_tie_break_never_costs_a_level(site: SiteSpec, name: str) -> None:
    """Job a on 56 of r0's cards, whose other 8 are idle and awake now; r0's cap holds a at its top clock
    with 3 of them awake, not 4. With a reserve of 8, every plan runs a at its top clock and keeps at most
    3 awake on r0, the rest woken elsewhere (and where no card is awake now, the same levels)."""
    jobs = [job("a", 56)]
    p0 = problem(site, jobs, [rack_cards(0, 56)], reserve=8, options=[30.0])
    t0 = dvfs_tables(p0)
    limits = np.full(site.n_racks, 50_000.0)
    limits[0] = t0.rack_base_w[0] + t0.pair_power_w[0, 0] + 1000.0 + 3.5 * t0.rack_wake_w[0]
    p = dataclasses.replace(p0, rack_limit_w=limits)
    awake_now = np.zeros(site.n_cards, dtype=bool)
    awake_now[rack_cards(0, 8, start=56)] = True
    level_before, _ = PLANS[name](p)
    level, awake = PLANS[name](dataclasses.replace(p, awake_now=awake_now, wake_tie_w=TIE_W))
    assert level.tolist() == level_before.tolist() == [0]
    assert awake.sum() == 8 and awake[0] <= 3


def test_a_persistent_re_solve_follows_the_cards_awake_now_without_a_rebuild(site: SiteSpec) -> None:
    """One planner, three cycles with the same jobs: the cards awake now move from r6 to r4 and back; each
    plan keeps the reserve where they are, on one model (the count is a parameter, not a rebuild)."""
    planner = CyclePlanner(persistent=True)
    for r in (6, 4, 6):
        p = _site_problem(site, 8, rack_cards(r, 8))
        plan = planner.plan(p, choose_setpoint=False, time_limit_s=30.0, mip_rel_gap=1e-6)
        assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None and plan.source == "milp"
        assert plan.dvfs.rack_awake.tolist() == [8 if q == r else 0 for q in range(site.n_racks)]
    assert planner.solver_for(30.0, planner.chunking(dvfs_tables(p))).builds == 1


def test_pyomo_and_highspy_give_the_same_plan_with_cards_awake_now(site: SiteSpec) -> None:
    """The direct highspy matrix is the Pyomo model: the same levels and the same split, on a problem
    whose caps bind (jobs slowed) and whose cards awake now are spread over four racks."""
    awake_now = rack_cards(1, 3, start=40) + rack_cards(2, 4, start=50) + rack_cards(5, 2) + rack_cards(7, 6)
    p = _site_problem(site, 12, awake_now, limit_w=45_000.0)
    level_p, awake_p = _pyomo(p)
    level_h, awake_h = _highspy(p)
    assert level_p.tolist() == level_h.tolist()
    assert awake_p.tolist() == awake_h.tolist()
    assert awake_p.sum() == 12 and int(dvfs_tables(p).rack_awake_now.sum()) == 15


@pytest.mark.parametrize("name", list(PLANS))
def test_off_by_default_the_reserve_goes_where_it_went_without_the_tie_break(site: SiteSpec, name: str) -> None:
    """The scene of the first test with the tie-break off (0, the default of ``make_problem`` and of the
    agent's ``control.reserve_wake_tie_w``): the cards awake now on r6 change nothing, every plan puts
    the reserve where it puts it knowing no card awake (r3: the MILPs' first racks, the greedy plan's most
    headroom first in rack order), and so the agent's default decisions are those before the tie-break."""
    p = _site_problem(site, 8, rack_cards(6, 8, start=10), tie_w=0.0)
    assert dvfs_tables(p).rack_awake_now.tolist() == [0, 0, 0, 0, 0, 0, 8, 0]  # counted, not charged
    unknown = dataclasses.replace(p, awake_now=None)
    level, awake = PLANS[name](p)
    level_unknown, awake_unknown = PLANS[name](unknown)
    assert awake.tolist() == awake_unknown.tolist() == [0, 0, 0, 8, 0, 0, 0, 0]
    assert level.tolist() == level_unknown.tolist()


def test_off_the_models_have_no_tie_break_column_row_or_term(site: SiteSpec) -> None:
    """At 0 the Pyomo model, its highspy matrix and the joint set-point model are built without the
    tie-break (no ``u``/``woken`` columns, no rows for them): the same model, so the same solver path, as
    before it; at 1 W each has one column and one row per rack with idle cards (per set-point, jointly)."""
    p_off = _site_problem(site, 8, rack_cards(6, 8), tie_w=0.0)
    p_on = dataclasses.replace(p_off, wake_tie_w=TIE_W)
    t_off, line = _tables(p_off)
    t_on, _ = _tables(p_on)
    n_idle = int((t_off.rack_idle > 0).sum())
    assert n_idle == 7
    m_off, m_on = build_dvfs_model(p_off, t_off, line), build_dvfs_model(p_on, t_on, line)
    assert not hasattr(m_off, "u") and not hasattr(m_off, "woken") and not hasattr(m_off, "awake_now")
    n_var = [sum(1 for _ in m.component_data_objects(pyo.Var)) for m in (m_off, m_on)]
    n_row = [sum(1 for _ in m.component_data_objects(pyo.Constraint)) for m in (m_off, m_on)]
    assert n_var[1] - n_var[0] == n_idle and n_row[1] - n_row[0] == n_idle
    mat_off, mat_on = dvfs_matrix(p_off, t_off, line), dvfs_matrix(p_on, t_on, line)
    assert mat_off.c.size == mat_off.n_x + n_idle + 1 and mat_on.c.size == mat_off.c.size + n_idle
    assert mat_on.row_lo.size - mat_off.row_lo.size == n_idle
    n_s = len(p_off.supply_options_c)
    tabs = [t_off] * n_s
    joint_off = build_joint_setpoint_model(p_off, tabs, [line] * n_s, [True] * n_s)
    joint_on = build_joint_setpoint_model(p_on, [t_on] * n_s, [line] * n_s, [True] * n_s)
    assert not hasattr(joint_off, "woken") and not hasattr(joint_off, "kept_awake")
    assert sum(1 for _ in joint_on.woken.values()) == n_idle * n_s


def test_a_persistent_planner_rebuilds_once_when_the_tie_break_is_switched_on(site: SiteSpec) -> None:
    """The tie-break's columns are structure (``dvfs_structure_key``), its weight a parameter: a planner
    whose problems switch it on builds a second model and plans with it; a new weight re-solves it."""
    planner = CyclePlanner(persistent=True)
    for tie_w, where in ((0.0, 3), (TIE_W, 6), (2.0, 6)):
        p = _site_problem(site, 8, rack_cards(6, 8), tie_w=tie_w)
        plan = planner.plan(p, choose_setpoint=False, time_limit_s=30.0, mip_rel_gap=1e-6)
        assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None and plan.source == "milp"
        assert plan.dvfs.rack_awake.tolist() == [8 if q == where else 0 for q in range(site.n_racks)]
    assert planner.solver_for(30.0, planner.chunking(dvfs_tables(p))).builds == 2


@pytest.mark.parametrize("tie_w", [-1.0, float("nan"), float("inf")])
def test_a_wake_tie_break_that_is_no_finite_weight_of_at_least_0_is_refused(site: SiteSpec, tie_w: float) -> None:
    with pytest.raises(ProblemError, match="wake_tie_w must be a finite number >= 0"):
        make_problem(site, wake_tie_w=tie_w)
