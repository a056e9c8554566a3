"""The ready reserve is one per supernode (a job runs inside one supernode: a reserve in another does not
spare it the wake latency), in every plan that expresses it: the Pyomo model, the matrix the direct highspy
model reads, the joint set-point model, the greedy plan, the chunked solve, and the explanation of a
reserve that does not fit.

The scene: the example hardware as two supernodes of 8 racks of 64 cards (r0-r7, r8-r15), no jobs, every
card idle. Supernode 0's racks have 10 kW more headroom (the greedy plan's order) and its cards are cooler
(a smaller case-to-coolant resistance: less leakage, so an awake card there costs fewer watts, the
MILPs' choice): every plan that may put the whole reserve anywhere puts it in supernode 0 (the old
site-wide row did), and supernode 1's arriving jobs would wait the wake latency."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest

from models.cooling import solve_joint_setpoint
from models.dvfs import dvfs_matrix
from models.dvfs_highspy import solve_matrix_highspy
from models.dvfs_solver import DecomposedDvfsSolver, DvfsSolver
from models.explain import explain_infeasible
from models.heuristic import greedy_dvfs
from models.plans import SolveStatus
from models.problem import CycleProblem, DvfsTables, FacilityLine, dvfs_tables, facility_line, it_power_range_w
from models.problem import make_problem as make
from twin.spec import SiteSpec
from twin.thermal import ThermalParams
from twin.workload import JobSpec

pytestmark = pytest.mark.models

IntArray = npt.NDArray[np.int64]


def _scene(
    site: SiteSpec,
    reserve: int | list[int],
    limit_w: npt.NDArray[np.float64] | None = None,
    awake_now: npt.NDArray[np.bool_] | None = None,
    wake_tie_w: float = 0.0,
) -> CycleProblem:
    two = site.with_supernodes(2)
    th = ThermalParams.from_site(two)
    hot = two.rack_supernode()[two.card_rack()] == 1
    r_cc = np.where(hot, 2.0 * th.r_case_coolant_k_per_w, th.r_case_coolant_k_per_w)
    limits = limit_w if limit_w is not None else np.where(np.arange(16) < 8, 60_000.0, 50_000.0)
    return make(
        two,
        rack_limit_w=limits,
        thermal=dataclasses.replace(th, r_case_coolant_k_per_w=r_cc),
        supply_temp_c=30.0,
        ambient_c=25.0,
        supply_options_c=[30.0, 35.0],
        ready_reserve_cards=reserve,
        awake_now=awake_now,
        wake_tie_w=wake_tie_w,
    )


def _tables(p: CycleProblem) -> tuple[DvfsTables, FacilityLine]:
    t = dvfs_tables(p)
    return t, facility_line(p.site, t.supply_c, p.ambient_c, *it_power_range_w(p, t))


def _per_supernode(p: CycleProblem, rack_awake: IntArray) -> list[int]:
    counts = np.bincount(p.site.rack_supernode(), weights=rack_awake, minlength=p.site.supernodes)
    return [int(c) for c in counts]


def test_the_scene_makes_supernode_0_the_cheaper_and_roomier(site: SiteSpec) -> None:
    # what the other tests rely on: an awake card costs more in supernode 1, and it has less headroom
    t, _line = _tables(_scene(site, 8))
    assert t.rack_wake_w[8:].min() > t.rack_wake_w[:8].max()
    assert (t.rack_cap_w - t.rack_base_w)[:8].min() > (t.rack_cap_w - t.rack_base_w)[8:].max()
    assert t.reserve.tolist() == [8, 8] and t.rack_supernode.tolist() == [0] * 8 + [1] * 8


def test_the_problem_carries_one_reserve_per_supernode(site: SiteSpec) -> None:
    assert _scene(site, 8).ready_reserve_cards.tolist() == [8, 8]  # an integer: that many in each
    assert _scene(site, [3, 5]).ready_reserve_cards.tolist() == [3, 5]
    with pytest.raises(ValueError, match="one integer per supernode"):
        _scene(site, [3, 5, 7])
    with pytest.raises(ValueError, match=">= 0"):
        _scene(site, [3, -1])


def test_the_pyomo_model_keeps_each_supernodes_reserve_in_its_racks(site: SiteSpec) -> None:
    p = _scene(site, 6)
    t, line = _tables(p)
    info, _level, awake = DvfsSolver(persistent=False).solve(p, t, line, 10.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and awake is not None
    assert _per_supernode(p, awake) == [6, 6]  # not 6 in the cheaper supernode 0 and none in 1


def test_the_persistent_model_takes_a_new_reserve_per_supernode_without_a_rebuild(site: SiteSpec) -> None:
    solver = DvfsSolver(persistent=True)
    p = _scene(site, [8, 5])
    t, line = _tables(p)
    solver.solve(p, t, line, 10.0, 1e-6)
    q = _scene(site, [2, 9])
    tq, line_q = _tables(q)
    info, _level, awake = solver.solve(q, tq, line_q, 10.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and awake is not None
    assert _per_supernode(q, awake) == [2, 9] and solver.builds == 1


def test_the_matrix_has_one_reserve_row_per_supernode_and_highspy_keeps_them(site: SiteSpec) -> None:
    p = _scene(site, 6)
    t, line = _tables(p)
    mat = dvfs_matrix(p, t, line)
    assert mat.row_lo[-3:-1].tolist() == [6.0, 6.0]  # the reserve rows, before the PUE row (no jobs)
    info, sol = solve_matrix_highspy(mat, 10.0, 1e-6)
    assert info.status == SolveStatus.OPTIMAL and sol is not None
    awake = np.zeros(t.n_racks, dtype=np.int64)
    awake[mat.idle_racks] = np.round(sol[mat.n_x : mat.n_x + mat.idle_racks.size]).astype(np.int64)
    assert _per_supernode(p, awake) == [6, 6]


def test_the_joint_setpoint_model_keeps_each_supernodes_reserve(site: SiteSpec) -> None:
    p = _scene(site, 6)
    status, plan, _sp, _s = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert _per_supernode(p, plan.rack_awake) == [6, 6]


def test_the_greedy_plan_fills_each_supernodes_reserve_in_its_racks(site: SiteSpec) -> None:
    # by headroom: the reserve of supernode 0 in r0 (the roomiest), supernode 1's in r8 (its roomiest)
    p = _scene(site, 6)
    t, line = _tables(p)
    g = greedy_dvfs(p, t, line)
    assert g.feasible and _per_supernode(p, g.rack_awake) == [6, 6]
    assert g.rack_awake[[0, 8]].tolist() == [6, 6]


def test_the_chunked_solve_splits_the_reserve_per_supernode(site: SiteSpec) -> None:
    # chunks of one supernode, and of one rack: each keeps its supernode's share of the greedy's reserve
    p = _scene(site, 6)
    t, line = _tables(p)
    for chunk_cards in (512, 64):
        info, _level, awake = DecomposedDvfsSolver(chunk_cards, persistent=False).solve(p, t, line, 10.0, 1e-6)
        assert info.objective is not None and awake is not None
        assert _per_supernode(p, awake) == [6, 6]


def test_with_the_wake_tie_break_each_supernodes_reserve_stays_on_its_cards_awake_now(site: SiteSpec) -> None:
    # 10 idle cards awake now on r3 (supernode 0) and on r12 (supernode 1), 1 W per card woken: every plan
    # keeps each supernode's 6 there (before: all 6 on r3, r12's cards put to sleep)
    awake = np.zeros(1024, dtype=bool)
    awake[[*range(3 * 64, 3 * 64 + 10), *range(12 * 64, 12 * 64 + 10)]] = True
    p = _scene(site, 6, awake_now=awake, wake_tie_w=1.0)
    t, line = _tables(p)
    want = np.zeros(16, dtype=np.int64)
    want[[3, 12]] = 6
    _info, _level, pyomo_awake = DvfsSolver(persistent=False).solve(p, t, line, 10.0, 1e-6)
    assert pyomo_awake is not None and pyomo_awake.tolist() == want.tolist()
    mat = dvfs_matrix(p, t, line)
    _info, sol = solve_matrix_highspy(mat, 10.0, 1e-6)
    assert sol is not None
    assert np.round(sol[mat.n_x : mat.n_x + mat.idle_racks.size]).astype(int).tolist() == want.tolist()
    assert greedy_dvfs(p, t, line).rack_awake.tolist() == want.tolist()
    _status, plan, _sp, _s = solve_joint_setpoint(p, time_limit_s=10.0)
    assert plan is not None and plan.rack_awake.tolist() == want.tolist()


def test_an_infeasible_reserve_is_explained_for_its_supernode(site: SiteSpec) -> None:
    # supernode 1's racks leave room for only 2 awake cards each (16 in all) at their least power: a reserve
    # of 20 there does not fit, though supernode 0 has room for hundreds more
    probe = _scene(site, 0)
    t0, _line = _tables(probe)
    limits = np.where(np.arange(16) < 8, 60_000.0, t0.rack_base_w + 1000.0 + 2.5 * t0.rack_wake_w)
    p = _scene(site, [4, 20], limit_w=limits)
    t, _line = _tables(p)
    why = explain_infeasible(p, t)
    assert why.startswith("ready reserve: supernode 1 (racks r8-r15): 20 awake idle cards are required but")
    assert "leaves room for only 16" in why and "supernode 0" not in why
    fits = _scene(site, [4, 16], limit_w=limits)
    assert explain_infeasible(fits, _tables(fits)[0]) == ""


def test_the_default_reserve_is_the_largest_queued_job_in_each_supernode(site: SiteSpec) -> None:
    # (``racktwin optimize``'s default): a 24-card job queued; supernode 1 has only 10 cards not failed
    two = site.with_supernodes(2)
    failed = np.zeros(two.n_cards, dtype=bool)
    failed[512 + 10 :] = True
    queued = JobSpec(job_id="q", n_cards=24, work_steps=1e5, step_time_s=1.0, compute_share=0.95)
    p = make(two, failed=failed, queue=[queued], ready_reserve_cards=None)
    assert p.ready_reserve_cards.tolist() == [24, 10]
