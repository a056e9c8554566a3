"""The DVFS model passed straight to highspy, without Pyomo (for benchmarks: the least modelling
overhead; the controller solves through :mod:`models.dvfs_solver`)."""

from __future__ import annotations

import time
from typing import Any

import highspy
import numpy as np
from pyomo.common.tee import capture_output

from models.dvfs import DvfsMatrix
from models.dvfs_solver import SolveInfo, highs_option, relative_gap
from models.plans import SolveStatus


def solve_matrix_highspy(mat: DvfsMatrix, time_limit_s: float, mip_rel_gap: float) -> tuple[SolveInfo, Any]:
    """The same DVFS model passed straight to highspy (benchmark: the least modelling overhead)."""
    t0 = time.perf_counter()
    with capture_output(capture_fd=True):  # HiGHS prints a banner on construction
        h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    lp = highspy.HighsLp()
    n_col, n_row = mat.c.size, mat.row_lo.size
    lp.num_col_, lp.num_row_ = n_col, n_row
    lp.col_cost_ = mat.c
    lp.offset_ = mat.c0
    lp.col_lower_, lp.col_upper_ = mat.col_lo, mat.col_hi
    lp.row_lower_, lp.row_upper_ = mat.row_lo, mat.row_hi
    lp.sense_ = highspy.ObjSense.kMaximize
    order = np.lexsort((mat.rows, mat.cols))
    cols, rows, vals = mat.cols[order], mat.rows[order], mat.vals[order]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(cols, np.arange(n_col + 1)).astype(np.int32)
    lp.a_matrix_.index_ = rows.astype(np.int32)
    lp.a_matrix_.value_ = vals
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in mat.integer]
    h.passModel(lp)
    h.run()
    ms = h.getModelStatus()
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2
    if ms == highspy.HighsModelStatus.kOptimal:
        st = SolveStatus.OPTIMAL
    elif ms == highspy.HighsModelStatus.kInfeasible:
        st = SolveStatus.INFEASIBLE
    elif ms == highspy.HighsModelStatus.kTimeLimit:
        st = SolveStatus.FEASIBLE if has_sol else SolveStatus.TIMEOUT_NO_SOLUTION
    else:
        st = SolveStatus.FEASIBLE if has_sol else SolveStatus.ERROR
    obj = float(info.objective_function_value) if has_sol else None
    bound = float(info.mip_dual_bound)
    sol = np.asarray(h.getSolution().col_value) if has_sol else None
    return (
        SolveInfo(
            status=st,
            wall_time_s=time.perf_counter() - t0,
            highs_time_s=float(h.getRunTime()),
            objective=obj,
            bound=bound,
            gap=relative_gap(obj, bound),
            time_limit_s=highs_option(h, "time_limit"),
            mip_rel_gap=highs_option(h, "mip_rel_gap"),
        ),
        sol,
    )
