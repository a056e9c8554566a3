"""The DVFS model passed straight to highspy (``models.dvfs_highspy``, the benchmarks' least-overhead
solve): the plan it returns is the Pyomo model's, and what it reports of a solve (status, objective,
bound, gap, limits, times) is what HiGHS ran and found, nothing printed on the way."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from models.dvfs import DvfsMatrix, dvfs_matrix
from models.dvfs_highspy import solve_matrix_highspy
from models.dvfs_solver import DvfsSolver
from models.plans import SolveStatus
from models.problem import CycleProblem, DvfsTables, dvfs_tables, facility_line, it_power_range_w, make_problem
from models.synthetic import synthetic_workload
from twin.spec import SiteSpec

pytestmark = pytest.mark.models

REPO = Path(__file__).resolve().parents[2]
IntArray = npt.NDArray[np.int64]


def _case(site: SiteSpec, seed: int = 3, limit_w: float = 47_000.0) -> tuple[CycleProblem, DvfsTables, DvfsMatrix]:
    wl = synthetic_workload(site, seed=seed, allocation=0.9, compute_share=(0.9, 0.99))
    p = make_problem(
        site, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, rack_limit_w=limit_w, ready_reserve_cards=8
    )
    t = dvfs_tables(p)
    lo, hi = it_power_range_w(p, t)
    return p, t, dvfs_matrix(p, t, facility_line(site, p.supply_temp_c, p.ambient_c, lo, hi))


def _plan(mat: DvfsMatrix, t: DvfsTables, sol: npt.NDArray[np.float64]) -> tuple[IntArray, IntArray]:
    """Job levels and awake idle cards per rack from the direct solution (as ``bench_models`` reads it)."""
    level = np.argmax(sol[: mat.n_x].reshape(t.n_jobs, t.n_levels), axis=1).astype(np.int64)
    awake = np.zeros(t.n_racks, dtype=np.int64)
    awake[mat.idle_racks] = np.round(sol[mat.n_x : mat.n_x + mat.idle_racks.size]).astype(np.int64)
    return level, awake


@pytest.mark.parametrize(("seed", "limit_w"), [(3, 47_000.0), (3, 45_500.0), (5, 47_000.0), (11, 46_000.0)])
def test_the_direct_model_plans_what_the_pyomo_model_plans(site: SiteSpec, seed: int, limit_w: float) -> None:
    p, t, mat = _case(site, seed, limit_w)
    lo, hi = it_power_range_w(p, t)
    line = facility_line(site, p.supply_temp_c, p.ambient_c, lo, hi)
    info_pyomo, want_level, want_awake = DvfsSolver(persistent=False).solve(p, t, line, 10.0, 1e-6)
    info, sol = solve_matrix_highspy(mat, 10.0, 1e-6)
    assert info_pyomo.status == info.status == SolveStatus.OPTIMAL and sol is not None
    assert want_level is not None and want_awake is not None
    level, awake = _plan(mat, t, sol)
    assert level.tolist() == want_level.tolist() and awake.tolist() == want_awake.tolist()
    assert info.objective == pytest.approx(info_pyomo.objective, rel=1e-9)
    assert float(mat.c @ sol + mat.c0) == pytest.approx(info.objective, rel=1e-9)  # the solution's objective
    assert info.wall_time_s >= info.highs_time_s > 0.0


def test_the_limit_and_gap_are_what_highs_ran_with_and_the_bound_brackets_the_optimum(site: SiteSpec) -> None:
    """A loose gap (5 %): HiGHS stops at a plan below the optimum, with a bound above it; the gap
    reported is HiGHS's (the distance of the bound to the objective, relative to the objective), within
    the gap asked for."""
    _p, _t, mat = _case(site)
    best, _ = solve_matrix_highspy(mat, 10.0, 1e-6)
    assert best.status == SolveStatus.OPTIMAL and best.objective is not None
    info, sol = solve_matrix_highspy(mat, 7.25, 0.05)
    assert info.time_limit_s == 7.25 and info.mip_rel_gap == 0.05
    assert info.status == SolveStatus.OPTIMAL and sol is not None
    assert info.objective is not None and info.bound is not None and info.gap is not None
    assert info.objective < best.objective - 1e-6 < best.objective + 1e-6 < info.bound  # stopped early
    assert info.gap == pytest.approx(abs(info.bound - info.objective) / abs(info.objective), rel=1e-12)
    assert 0.0 < info.gap <= 0.05


def test_a_time_limit_highs_refuses_is_reported_as_the_one_it_ran_with(site: SiteSpec) -> None:
    _p, _t, mat = _case(site)
    info, sol = solve_matrix_highspy(mat, -1.0, 1e-6)  # HiGHS keeps its default: no limit
    assert info.time_limit_s == math.inf
    assert info.status == SolveStatus.OPTIMAL and sol is not None


def test_an_infeasible_model_is_infeasible_with_no_plan(site: SiteSpec) -> None:
    _p, _t, mat = _case(site)
    reserve_row = mat.row_lo.size - 2  # rows: one level per job, rack power, the reserve, PUE
    n_idle = float(mat.col_hi[mat.n_x : mat.n_x + mat.idle_racks.size].sum())
    lo = mat.row_lo.copy()
    lo[reserve_row] = n_idle + 1.0  # a reserve of more cards than are idle
    info, sol = solve_matrix_highspy(dataclasses.replace(mat, row_lo=lo), 10.0, 1e-6)
    assert info.status == SolveStatus.INFEASIBLE
    assert sol is None and info.objective is None and info.gap is None


def test_a_time_limit_reached_before_any_plan_is_a_timeout_with_no_plan(site: SiteSpec) -> None:
    _p, _t, mat = _case(site)
    info, sol = solve_matrix_highspy(mat, 1e-9, 1e-6)
    assert info.status == SolveStatus.TIMEOUT_NO_SOLUTION
    assert sol is None and info.objective is None and info.time_limit_s == 1e-9


def test_a_model_highs_cannot_bound_is_an_error_with_no_plan(site: SiteSpec) -> None:
    _p, _t, mat = _case(site)
    c = mat.c.copy()
    c[-1] = 1.0  # the PUE excess (unbounded above) now earns
    info, sol = solve_matrix_highspy(dataclasses.replace(mat, c=c), 10.0, 1e-6)
    assert info.status == SolveStatus.ERROR
    assert sol is None and info.objective is None


_SILENT = """
from pathlib import Path
from models.dvfs import dvfs_matrix
from models.dvfs_highspy import solve_matrix_highspy
from models.problem import dvfs_tables, facility_line, it_power_range_w, make_problem
from models.synthetic import synthetic_workload
from twin.spec import load_site

site = load_site(Path("examples/supernode-512.toml"))
wl = synthetic_workload(site, seed=3, allocation=0.9)
p = make_problem(site, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, ready_reserve_cards=8)
t = dvfs_tables(p)
lo, hi = it_power_range_w(p, t)
mat = dvfs_matrix(p, t, facility_line(site, p.supply_temp_c, p.ambient_c, lo, hi))
info, _ = solve_matrix_highspy(mat, 10.0, 1e-6)
print("status", info.status.value, flush=True)
"""


def test_a_direct_solve_prints_nothing_not_even_highs_banner() -> None:
    """A fresh interpreter (HiGHS prints its banner on the first instance only): the benchmark's tables
    on stdout are all there is."""
    proc = subprocess.run(
        [sys.executable, "-c", _SILENT], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout == "status optimal\n", proc.stdout
