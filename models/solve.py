"""Solver handling: HiGHS through Pyomo with a verified time limit and gap, status mapping, a
persistent model across control cycles, a deadline enforced outside the solver, and the greedy
fallback.

Entry points for a synchronous controller:

* :func:`plan_cycle` (or :meth:`CyclePlanner.plan` to keep the solver warm across cycles): DVFS
  levels per job, awake / low-power idle cards per rack and the coolant set-point for one cycle;
* :func:`models.placement.place_jobs`: placement of queued jobs (re-exported here).

Pitfalls handled (BASELINES.md): the limit and gap are passed on every call *and read back from
HiGHS* after it (:class:`SolverConfigError` if HiGHS did not take them); ``pyomo.contrib.solver``'s
HiGHS is asked not to raise on non-optimal results and not to load solutions, and the status is
mapped here; HiGHS may overrun its own limit, so the solve runs in a worker thread that is waited
for only until the deadline, then cancelled (``Highs.cancelSolve``) and the greedy plan returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import highspy
import numpy as np
import numpy.typing as npt
import pyomo.environ as pyo
from pyomo.common.tee import capture_output
from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition
from pyomo.contrib.solver.solvers.highs import Highs

from models.decompose import it_price_per_wh as it_price_per_wh_for
from models.decompose import split_chunks
from models.dvfs import (
    DvfsMatrix,
    build_dvfs_model,
    dvfs_structure_key,
    set_dvfs_data,
)
from models.heuristic import GreedyDvfs, greedy_dvfs
from models.placement import PlacementPlan, place_jobs
from models.plans import CyclePlan, DvfsPlan, SetpointOption, SetpointPlan, SolveStatus, assess_dvfs
from models.problem import CycleProblem, DvfsTables, FacilityLine, dvfs_tables, facility_line, it_power_range_w

IntArray = npt.NDArray[np.int64]
T = TypeVar("T")

__all__ = [
    "CyclePlanner",
    "DecomposedDvfsSolver",
    "DvfsSolver",
    "PlacementPlan",
    "SolveInfo",
    "SolverConfigError",
    "greedy_cycle",
    "place_jobs",
    "plan_cycle",
    "solve_matrix_highspy",
]

#: Default relative MIP gap, on the loss scale (value given up + energy cost + PUE penalty): 1e-3
#: of a loss of a few % of the total is ~1e-5 of the objective, far inside "0.5% of optimal".
DEFAULT_GAP = 1e-3

#: Above this many jobs, "auto" decomposes the DVFS MILP into chunks of AUTO_CHUNK_CARDS cards
#: (benchmarks/results-models.md: monolithic is faster up to ~100 jobs, chunks of 512 cards beyond).
AUTO_DECOMPOSE_JOBS = 128
AUTO_CHUNK_CARDS = 512

#: Time the deadline watcher grants beyond the solver's own limit before cancelling it.
DEADLINE_GRACE_S = 0.05


class SolverConfigError(RuntimeError):
    """HiGHS did not take the time limit or gap it was given (a silent overwrite, see BASELINES)."""


@dataclass(frozen=True)
class SolveInfo:
    status: SolveStatus
    wall_time_s: float  # the whole call incl. Pyomo's update / load
    highs_time_s: float  # HiGHS's own run time
    objective: float | None
    bound: float | None
    gap: float | None
    time_limit_s: float  # as read back from HiGHS
    mip_rel_gap: float  # as read back from HiGHS
    # HiGHS's termination condition; a chunked solve's: each status's chunks, and which had no solution
    message: str = ""
    # the part of a plan with a solution that kept the greedy levels (a chunked solve's chunks with no
    # solution, :class:`DecomposedDvfsSolver`); empty when none did
    greedy_parts: str = ""


def _map_status(tc: TerminationCondition, has_solution: bool) -> SolveStatus:
    if tc == TerminationCondition.convergenceCriteriaSatisfied:
        return SolveStatus.OPTIMAL
    if tc in (TerminationCondition.provenInfeasible, TerminationCondition.infeasibleOrUnbounded):
        return SolveStatus.INFEASIBLE
    if tc in (TerminationCondition.maxTimeLimit, TerminationCondition.interrupted, TerminationCondition.iterationLimit):
        return SolveStatus.FEASIBLE if has_solution else SolveStatus.TIMEOUT_NO_SOLUTION
    return SolveStatus.FEASIBLE if has_solution else SolveStatus.ERROR


def _gap(obj: float | None, bound: float | None) -> float | None:
    if obj is None or bound is None or not np.isfinite(bound):
        return None
    return abs(bound - obj) / max(abs(obj), 1e-9)


def _run_with_deadline(fn: Callable[[], T], deadline_s: float, cancel: Callable[[], None]) -> tuple[bool, T | None]:
    """Run ``fn`` in a worker thread; wait until ``deadline_s`` (monotonic), then ``cancel`` it.

    Returns (finished, result). A thread still running after the cancel is left to finish on
    its own (daemon); its solver must not be reused (the caller drops it).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    th = threading.Thread(target=target, name="racktwin-solve", daemon=True)
    th.start()
    th.join(max(deadline_s - time.monotonic(), 0.0))
    if th.is_alive():
        cancel()
        th.join(0.5)
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box["result"]


def _option(h: Any, name: str) -> float:
    """An option's value (highspy returns (status, value) pairs)."""
    v = h.getOptionValue(name)
    return float(v[1] if isinstance(v, tuple) else v)


def highs_solve(
    solver: Highs, model: pyo.ConcreteModel, time_limit_s: float, mip_rel_gap: float, *, load_vars: bool = True
) -> SolveInfo:
    """One HiGHS solve through ``pyomo.contrib.solver`` with the limit and gap verified. ``load_vars=False``
    leaves the solution in HiGHS (the model's variables keep their values) for a caller that reads
    it from there (:meth:`DvfsSolver.solve`)."""
    t0 = time.perf_counter()
    # HiGHS's run time is cumulative over runs of one instance: measure the difference (a model the
    # solver does not hold yet is loaded into a new HiGHS instance, whose time starts at 0)
    h0 = solver._solver_model
    before = float(h0.getRunTime()) if h0 is not None and model is solver._model else 0.0
    res = solver.solve(
        model,
        time_limit=float(time_limit_s),
        rel_gap=float(mip_rel_gap),
        load_solutions=False,
        raise_exception_on_nonoptimal_result=False,
        solver_options={"output_flag": False, "threads": 1},
    )
    h = solver._solver_model
    tl = _option(h, "time_limit")
    gp = _option(h, "mip_rel_gap")
    if abs(tl - time_limit_s) > 1e-9 or abs(gp - mip_rel_gap) > 1e-12:
        raise SolverConfigError(
            f"HiGHS runs with time_limit={tl}, mip_rel_gap={gp}; asked {time_limit_s}, {mip_rel_gap}"
        )
    has_sol = res.solution_status in (SolutionStatus.optimal, SolutionStatus.feasible)
    status = _map_status(res.termination_condition, has_sol)
    if has_sol and load_vars:
        res.solution_loader.load_vars()
    obj = res.incumbent_objective if has_sol else None
    bound = res.objective_bound
    info = h.getInfo()
    if bound is None and info.mip_node_count >= 0:
        bound = float(info.mip_dual_bound)
    return SolveInfo(
        status=status,
        wall_time_s=time.perf_counter() - t0,
        highs_time_s=float(h.getRunTime()) - before,
        objective=obj,
        bound=bound,
        gap=_gap(obj, bound) if status != SolveStatus.OPTIMAL else (_gap(obj, bound) or 0.0),
        time_limit_s=tl,
        mip_rel_gap=gp,
        message=str(res.termination_condition.name),
    )


class DvfsSolver:
    """One Pyomo DVFS model and one persistent HiGHS instance, kept across control cycles.

    When a new cycle's tables have the same structure (same jobs on the same racks, same racks
    with idle cards), only the mutable parameters are updated and HiGHS re-solves the modified
    model; otherwise the model is rebuilt. ``persistent=False`` rebuilds every time (for measuring).
    """

    def __init__(self, persistent: bool = True, warm_start: bool = False) -> None:
        self.persistent = persistent
        self.warm_start = warm_start
        self._model: pyo.ConcreteModel | None = None
        self._key: tuple[object, ...] | None = None
        self._solver: Highs | None = None
        self.builds = 0
        self.last_build_s = 0.0

    def _prepare(
        self, p: CycleProblem, t: DvfsTables, line: FacilityLine, it_price: float | None
    ) -> tuple[pyo.ConcreteModel, Highs]:
        key = dvfs_structure_key(t)
        t0 = time.perf_counter()
        if self.persistent and self._model is not None and self._solver is not None and key == self._key:
            changed = set_dvfs_data(self._model, p, t, line, it_price)
            if changed and self._solver._model is self._model:  # else HiGHS reads them when loading
                self._solver.update_variables(changed)
            self.last_build_s = time.perf_counter() - t0
            return self._model, self._solver
        model = build_dvfs_model(p, t, line)
        if it_price is not None:
            set_dvfs_data(model, p, t, line, it_price)
        # the solver of the last model, when there is one: a model it does not hold is loaded anew
        # (pyomo's set_instance starts from a clean interface and a new HiGHS instance, keeping only
        # the options), so a new pyomo Highs object per build bought nothing but its construction
        solver = self._solver if self._solver is not None else _parameter_only_highs()
        self._model, self._solver, self._key = model, solver, key
        self.builds += 1
        self.last_build_s = time.perf_counter() - t0
        return model, solver

    def drop(self) -> None:
        """Forget the model and the solver (after a cancelled solve, the HiGHS instance must not be reused)."""
        self._model = self._solver = None
        self._key = None

    def cancel(self) -> None:
        if self._solver is not None and self._solver._solver_model is not None:
            self._solver._solver_model.cancelSolve()

    def solve(
        self,
        p: CycleProblem,
        t: DvfsTables,
        line: FacilityLine,
        time_limit_s: float,
        mip_rel_gap: float,
        start: tuple[IntArray, IntArray] | None = None,
        greedy: GreedyDvfs | None = None,
        it_price_per_wh: float | None = None,
    ) -> tuple[SolveInfo, IntArray | None, IntArray | None]:
        """Solve the cycle's DVFS MILP. ``greedy`` is unused here (see :class:`DecomposedDvfsSolver`);
        ``it_price_per_wh`` prices IT power directly (a part of a decomposed problem)."""
        model, solver = self._prepare(p, t, line, it_price_per_wh)
        if self.warm_start and start is not None and solver._solver_model is not None:
            self._set_start(model, solver, t, start)
        info = highs_solve(solver, model, time_limit_s, mip_rel_gap, load_vars=False)
        if info.objective is None:
            return info, None, None
        level, awake = _dvfs_from_highs(model, solver, t)
        return info, level, awake

    def _set_start(
        self, model: pyo.ConcreteModel, solver: Highs, t: DvfsTables, start: tuple[IntArray, IntArray]
    ) -> None:
        level, awake = start
        vmap = solver._pyomo_var_to_solver_var_map
        if not vmap or solver._model is not model:  # not yet loaded into HiGHS: its first solve has no start
            return
        idx: list[int] = []
        val: list[float] = []
        for j in range(t.n_jobs):
            for k in range(t.n_levels):
                idx.append(vmap[id(model.x[j, k])])
                val.append(1.0 if k == level[j] else 0.0)
        for r in model.RI:
            idx.append(vmap[id(model.a[r])])
            val.append(float(awake[r]))
        solver._solver_model.setSolution(len(idx), np.asarray(idx, dtype=np.int32), np.asarray(val))


def _parameter_only_highs() -> Highs:
    """A pyomo HiGHS interface that, between solves of one model, looks only for changed parameter
    values (the DVFS model's structure never changes; new variable bounds are passed explicitly)."""
    solver = Highs()
    cfg = solver.config.auto_updates
    for name in (
        "check_for_new_or_removed_constraints",
        "check_for_new_or_removed_vars",
        "check_for_new_or_removed_params",
        "check_for_new_objective",
        "update_constraints",
        "update_vars",
        "update_named_expressions",
        "update_objective",
    ):
        setattr(cfg, name, False)
    cfg.update_parameters = True
    return solver


def _dvfs_from_highs(model: pyo.ConcreteModel, solver: Highs, t: DvfsTables) -> tuple[IntArray, IntArray]:
    """``extract_dvfs`` read from HiGHS's solution columns (the values ``load_vars`` would put in the
    model's variables: every ``x`` and ``a`` is in a row), without loading them into the model first:
    the same levels (the first largest ``x[j, k]`` of each job) and awake cards (``a[r]`` rounded)."""
    cols = getattr(model, "_solution_cols", None)
    if cols is None:  # the model's columns in HiGHS (fixed for the model's life: its structure never changes)
        vmap = solver._pyomo_var_to_solver_var_map
        x_cols = np.asarray(
            [[vmap[id(model.x[j, k])] for k in range(t.n_levels)] for j in range(t.n_jobs)], dtype=np.int64
        ).reshape(t.n_jobs, t.n_levels)
        racks = np.asarray(list(model.RI), dtype=np.int64)
        a_cols = np.asarray([vmap[id(model.a[int(r)])] for r in racks], dtype=np.int64)
        cols = model._solution_cols = (x_cols, racks, a_cols)
    x_cols, racks, a_cols = cols
    value = np.asarray(solver._solver_model.getSolution().col_value, dtype=np.float64)
    level = np.full(t.n_jobs, t.n_levels - 1, dtype=np.int64)
    if t.n_jobs:
        level[:] = np.argmax(value[x_cols], axis=1)
    awake = np.zeros(t.n_racks, dtype=np.int64)
    awake[racks] = [round(v) for v in value[a_cols].tolist()]
    return level, awake


class DecomposedDvfsSolver:
    """The DVFS MILP solved in independent chunks (``models.decompose``), one persistent
    :class:`DvfsSolver` per chunk. Same interface as :class:`DvfsSolver`; needs the greedy plan
    (reserve split, PUE state, and the levels of any chunk whose solve fails)."""

    def __init__(self, chunk_cards: int, persistent: bool = True, warm_start: bool = False) -> None:
        self.chunk_cards = chunk_cards
        self.persistent = persistent
        self.warm_start = warm_start
        self._parts: dict[int, DvfsSolver] = {}
        self._current: DvfsSolver | None = None
        self.last_chunks = 0

    @property
    def builds(self) -> int:
        return sum(s.builds for s in self._parts.values())

    def drop(self) -> None:
        self._parts.clear()

    def cancel(self) -> None:
        if self._current is not None:
            self._current.cancel()

    def solve(
        self,
        p: CycleProblem,
        t: DvfsTables,
        line: FacilityLine,
        time_limit_s: float,
        mip_rel_gap: float,
        start: tuple[IntArray, IntArray] | None = None,
        greedy: GreedyDvfs | None = None,
        it_price_per_wh: float | None = None,
    ) -> tuple[SolveInfo, IntArray | None, IntArray | None]:
        t0 = time.perf_counter()
        g = greedy if greedy is not None else greedy_dvfs(p, t, line)
        chunks = split_chunks(t, g, self.chunk_cards, p.site.cards_per_rack)
        self.last_chunks = len(chunks)
        g_it = float(t.rack_base_w.sum() + t.job_power_w[np.arange(t.n_jobs), g.job_level].sum())
        g_it += float((t.rack_wake_w * g.rack_awake).sum())
        price = it_price_per_wh_for(p, line, g_it) if it_price_per_wh is None else it_price_per_wh
        level, awake = g.job_level.copy(), g.rack_awake.copy()
        deadline = time.perf_counter() + time_limit_s
        obj = bound = 0.0
        statuses: list[SolveStatus] = []
        unsolved: list[str] = []  # the chunks that keep the greedy levels, and why
        highs_s = 0.0
        for i, c in enumerate(chunks):
            if c.jobs.size == 0:
                continue
            lim = (deadline - time.perf_counter()) / (len(chunks) - i)
            if lim < 1e-3:
                statuses.append(SolveStatus.TIMEOUT_NO_SOLUTION)
                unsolved.append(_chunk_line(p, i, c.racks, SolveStatus.TIMEOUT_NO_SOLUTION, "no time left"))
                continue
            part = self._parts.get(i)
            if part is None:
                part = self._parts[i] = DvfsSolver(self.persistent, self.warm_start)
            self._current = part
            sub_start = (level[c.jobs], awake[c.racks]) if start is None else (start[0][c.jobs], start[1][c.racks])
            info, lv, aw = part.solve(p, c.tables, line, lim, mip_rel_gap, sub_start, None, price)
            self._current = None
            highs_s += info.highs_time_s
            statuses.append(info.status)
            if lv is None or aw is None or info.objective is None:
                unsolved.append(_chunk_line(p, i, c.racks, info.status, info.message))
                continue  # this chunk keeps the greedy levels
            level[c.jobs] = lv
            awake[c.racks] = aw
            obj += info.objective
            bound += info.bound if info.bound is not None else info.objective
        if statuses and all(s == SolveStatus.OPTIMAL for s in statuses):
            status = SolveStatus.OPTIMAL
        elif any(s in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE) for s in statuses) or not statuses:
            status = SolveStatus.FEASIBLE if statuses else SolveStatus.OPTIMAL
        else:
            status = statuses[0]
        has = status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
        info = SolveInfo(
            status=status,
            wall_time_s=time.perf_counter() - t0,
            highs_time_s=highs_s,
            objective=obj if has else None,
            bound=bound if has else None,
            gap=_gap(obj, bound) if has else None,
            time_limit_s=time_limit_s,
            mip_rel_gap=mip_rel_gap,
            message=_chunks_message(len(chunks), statuses, unsolved),
            greedy_parts=_greedy_chunks(len(chunks), unsolved) if has else "",
        )
        return (info, level, awake) if has else (info, None, None)


#: Chunks (and racks of a chunk) a chunked solve's message names one by one (the others are counted).
_CHUNKS_NAMED = 4


def _chunk_line(p: CycleProblem, i: int, racks: IntArray, status: SolveStatus, why: str) -> str:
    """One chunk with no solution, for an operator: its index, its racks (the first few) and how its
    solve ended (HiGHS's termination, or no time left for it)."""
    names = _listed([p.site.rack_names[int(r)] for r in racks])
    return f"chunk {i} (racks {names}: {status.value}, {why})"


def _listed(items: list[str]) -> str:
    """The first :data:`_CHUNKS_NAMED` of ``items``, then how many more."""
    more = len(items) - _CHUNKS_NAMED
    return ", ".join(items[:_CHUNKS_NAMED]) + (f" and {more} more" if more > 0 else "")


def _chunks_message(n_chunks: int, statuses: list[SolveStatus], unsolved: list[str]) -> str:
    """A chunked solve's ``SolveInfo.message``: how many chunks ended in each status (chunks with no
    jobs are not solved), then the chunks with no solution: ``8 chunks: 7 optimal, 1
    timeout_no_solution; no solution in chunk 7 (racks r7: timeout_no_solution, no time left)``."""
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    tally = ", ".join(f"{k} {s.value}" for s, k in counts.items()) or "none solved (no jobs)"
    return f"{n_chunks} chunks: {tally}" + (f"; no solution in {_listed(unsolved)}" if unsolved else "")


def _greedy_chunks(n_chunks: int, unsolved: list[str]) -> str:
    """``SolveInfo.greedy_parts`` of a chunked solve with a plan: its chunks with no solution."""
    if not unsolved:
        return ""
    return f"{len(unsolved)} of {n_chunks} chunks had no solution: {_listed(unsolved)}"


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
            gap=_gap(obj, bound),
            time_limit_s=_option(h, "time_limit"),
            mip_rel_gap=_option(h, "mip_rel_gap"),
        ),
        sol,
    )


# --------------------------------------------------------------------------------------------
# One control cycle
# --------------------------------------------------------------------------------------------


def _tables_and_line(p: CycleProblem, supply_c: float) -> tuple[DvfsTables, FacilityLine]:
    t = dvfs_tables(p, supply_c)
    lo, hi = it_power_range_w(p, t)
    return t, facility_line(p.site, supply_c, p.ambient_c, lo, hi)


def greedy_cycle(p: CycleProblem, choose_setpoint: bool = True) -> CyclePlan:
    """The heuristic equivalent of :func:`plan_cycle` (no solver): greedy plan per set-point. An
    infeasible set-point's reason reads as :func:`plan_cycle`'s: prefixed with the set-point only when
    there are several."""
    t0 = time.perf_counter()
    options = p.supply_options_c if choose_setpoint else (p.supply_temp_c,)
    records: list[SetpointOption] = []
    reasons: list[str] = []
    best: DvfsPlan | None = None
    for c in _greedy_options(p, options, records, reasons):  # the planner's own first step
        plan = c.greedy_plan
        records.append(
            SetpointOption(
                c.supply_c, SolveStatus.FALLBACK, plan.objective_per_h, plan.facility_power_w, plan.it_power_w, 0.0
            )
        )
        if best is None or plan.objective_per_h > best.objective_per_h:
            best = plan
    records.sort(key=lambda r: options.index(r.supply_temp_c))  # in the options' order, as before (stable)
    return _finish(p, best, records, reasons, [], time.perf_counter() - t0, SolveStatus.FALLBACK, None, "greedy")


def _over_caps(plan: DvfsPlan, p: CycleProblem) -> str:
    """What of ``plan`` the twin finds over the caps ("" when it is within them: ``plan.within_caps(p)``),
    the cards of the problem's least-power jobs and the cards that run no job exempt from the die limit:
    a plan sets no level of an idle card (its die is left to the agent's guard, as the greedy plan leaves
    it); an idle card reading hot made every solver plan a fallback."""
    exempt = p.die_exempt_cards() | (p.card_job < 0)
    racks = np.flatnonzero(plan.rack_power_w > p.rack_cap_w() + 1e-6)
    hot = np.flatnonzero(~exempt & (plan.card_die_temp_c > p.die_limit_c + 1e-6))
    over = []
    if racks.size:
        names = ", ".join(p.site.rack_names[int(r)] for r in racks[:4]) + (", ..." if racks.size > 4 else "")
        over.append(f"{racks.size} rack(s) over their cap ({names})")
    if hot.size:
        over.append(f"{hot.size} card(s) over the die limit")
    return " and ".join(over)


def _finish(
    p: CycleProblem,
    best: DvfsPlan | None,
    records: list[SetpointOption],
    reasons: list[str],
    fallbacks: list[str],
    elapsed: float,
    status: SolveStatus,
    gap: float | None,
    source: str,
) -> CyclePlan:
    """The plan: ``best`` (None: no set-point has a feasible plan), explained by ``reasons`` (why none
    is feasible) when it is None, else by ``fallbacks`` (why set-points kept their greedy plans)."""
    if best is None:
        # nothing feasible: the greedy heuristic's least-power plan at the set-point in force, flagged
        # INFEASIBLE (its source is "greedy" whatever was tried, no MILP plan is in it). Not the
        # coolest option: no option is feasible, so cooling does not fix what is infeasible (one
        # job's SLO over its rack's cap had the set-point stepped down 5 K at every evaluation, 30 ->
        # 20 deg C at 40 deg C ambient, +11% facility power for the same work)
        s = p.supply_temp_c
        t, line = _tables_and_line(p, s)
        g = greedy_dvfs(p, t, line)
        plan = assess_dvfs(p, g.job_level, g.rack_awake, s, t)
        return CyclePlan(
            status=SolveStatus.INFEASIBLE,
            dvfs=plan,
            setpoint=SetpointPlan(s, tuple(records)),
            solve_time_s=elapsed,
            explanation="\n".join(reasons),
            objective_per_h=None,
            mip_gap=None,
            source="greedy",
        )
    return CyclePlan(
        status=status,
        dvfs=best,
        setpoint=SetpointPlan(best.supply_temp_c, tuple(records)),
        solve_time_s=elapsed,
        explanation="\n".join(fallbacks),
        objective_per_h=best.objective_per_h,
        mip_gap=gap,
        source=source,
    )


@dataclass(frozen=True)
class _Option:
    """A set-point whose greedy plan is feasible: the twin's tables and facility line there, the
    greedy levels (the MILP's start and fallback) and the greedy plan as the twin rates it."""

    supply_c: float
    tables: DvfsTables
    line: FacilityLine
    greedy: GreedyDvfs
    greedy_plan: DvfsPlan

    def fallback(self) -> _Outcome:
        """The greedy plan, as it is (status FALLBACK)."""
        return _Outcome(SolveStatus.FALLBACK, self.greedy_plan, None, "greedy")


@dataclass(frozen=True)
class _Outcome:
    """The plan kept at one set-point: its status, the MILP's gap and where the plan came from."""

    status: SolveStatus
    plan: DvfsPlan
    gap: float | None
    source: str  # "milp" or "greedy"

    def record(self, supply_c: float, time_s: float) -> SetpointOption:
        """What :attr:`CyclePlan.setpoint` reports of this set-point (``time_s``: the time spent on it)."""
        plan = self.plan
        return SetpointOption(
            supply_c, self.status, plan.objective_per_h, plan.facility_power_w, plan.it_power_w, time_s
        )


def _check_limits(time_limit_s: float, mip_rel_gap: float) -> None:
    """A positive, finite time limit and a relative gap within [0, 1) (a ValueError if not)."""
    if not (time_limit_s > 0 and np.isfinite(time_limit_s)):
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
    if not (0 <= mip_rel_gap < 1):
        raise ValueError(f"mip_rel_gap must be within [0, 1), got {mip_rel_gap}")


def _greedy_options(
    p: CycleProblem, options: tuple[float, ...], records: list[SetpointOption], reasons: list[str]
) -> list[_Option]:
    """Step 1 of :meth:`CyclePlanner.plan`: the twin's tables and the greedy plan at every set-point.
    A set-point where the greedy plan is infeasible gets an INFEASIBLE record and its reason (prefixed
    with the set-point when there are several); the others are returned, in ``options``' order."""
    cands: list[_Option] = []
    for s in options:
        t1 = time.monotonic()
        t, line = _tables_and_line(p, s)
        g = greedy_dvfs(p, t, line)
        if not g.feasible:
            reasons.append(f"supply {s:g} deg C: {g.explanation}" if len(options) > 1 else g.explanation)
            records.append(SetpointOption(s, SolveStatus.INFEASIBLE, None, None, None, time.monotonic() - t1))
            continue
        cands.append(_Option(s, t, line, g, assess_dvfs(p, g.job_level, g.rack_awake, s, t)))
    return cands


def _warm_start(previous_plan: CyclePlan | None, c: _Option) -> tuple[IntArray, IntArray]:
    """The MILP's start: the previous cycle's levels and awake cards when they fit this problem's
    jobs, else the greedy plan's."""
    if previous_plan is not None and previous_plan.dvfs is not None:
        prev = previous_plan.dvfs
        if prev.job_level.size == c.tables.n_jobs:
            return prev.job_level, prev.rack_awake
    return c.greedy.job_level, c.greedy.rack_awake


def _judge_solution(
    p: CycleProblem,
    c: _Option,
    info: SolveInfo,
    level: IntArray | None,
    awake: IntArray | None,
    reasons: list[str],
) -> _Outcome:
    """A finished solve at one set-point, judged by the twin: a solution within the caps keeps HiGHS's
    status and gap, and its plan unless the twin rates the greedy plan higher (the model's facility
    line is an affine fit: the rare case keeps the greedy plan, source "greedy"); no solution or one
    over the caps gives the greedy plan (status FALLBACK), with its reason in ``reasons``
    (:func:`_fallback_reason`): what the twin found over the caps, or how HiGHS ended without one. A
    chunked solution used with chunks that had none (``SolveInfo.greedy_parts``) says which, in ``reasons``."""
    if level is not None and awake is not None:
        cand = assess_dvfs(p, level, awake, c.supply_c, c.tables)
        over = _over_caps(cand, p)
        if not over:
            if cand.objective_per_h >= c.greedy_plan.objective_per_h - 1e-9:
                if info.greedy_parts:  # a chunked solve, partly: say which chunks kept the greedy levels
                    reasons.append(f"supply {c.supply_c:g} deg C: {info.greedy_parts}; their greedy levels used")
                return _Outcome(info.status, cand, info.gap, "milp")
            return _Outcome(info.status, c.greedy_plan, info.gap, "greedy")
        why = f"the solver's plan ({info.status.value}) has {over} as the twin rates it"
    elif info.status == SolveStatus.INFEASIBLE:  # cannot happen when the greedy is feasible
        why = "HiGHS reports infeasible"
    elif info.status == SolveStatus.TIMEOUT_NO_SOLUTION:
        why = f"HiGHS stopped at a limit before it found a solution ({info.message})"
    else:
        why = f"HiGHS ended with no solution ({info.status.value}, {info.message})"
    reasons.append(_fallback_reason(c.supply_c, why))
    return c.fallback()


def _fallback_reason(supply_c: float, why: str) -> str:
    """One line of a plan's explanation: why the plan at set-point ``supply_c`` is the greedy fallback."""
    return f"supply {supply_c:g} deg C: {why}; greedy plan used"


class CyclePlanner:
    """Plans control cycles, keeping one persistent :class:`DvfsSolver` per set-point alive.

    ``plan(problem)`` is :func:`plan_cycle` with the solvers reused across calls (a controller
    keeps one planner for its lifetime).
    """

    def __init__(
        self, persistent: bool = True, warm_start: bool = False, chunk_cards: int | str | None = "auto"
    ) -> None:
        if not (chunk_cards is None or chunk_cards == "auto" or (isinstance(chunk_cards, int) and chunk_cards > 0)):
            raise ValueError(f"chunk_cards must be a positive int, 'auto' or None, got {chunk_cards!r}")
        self.persistent = persistent
        self.warm_start = warm_start
        self.chunk_cards = chunk_cards
        self._solvers: dict[tuple[float, int | None], DvfsSolver | DecomposedDvfsSolver] = {}

    def chunking(self, t: DvfsTables) -> int | None:
        """Chunk size for these tables: ``chunk_cards``, or with "auto" :data:`AUTO_CHUNK_CARDS`
        once there are more than :data:`AUTO_DECOMPOSE_JOBS` jobs (measured in benchmarks/)."""
        if self.chunk_cards == "auto":
            return AUTO_CHUNK_CARDS if t.n_jobs > AUTO_DECOMPOSE_JOBS else None
        return self.chunk_cards if isinstance(self.chunk_cards, int) else None

    def solver_for(self, supply_c: float, chunk: int | None = None) -> DvfsSolver | DecomposedDvfsSolver:
        key = (supply_c, chunk)
        s = self._solvers.get(key)
        if s is None:
            if chunk is not None:
                s = DecomposedDvfsSolver(chunk, self.persistent, self.warm_start)
            else:
                s = DvfsSolver(self.persistent, self.warm_start)
            self._solvers[key] = s
        return s

    def plan(
        self,
        p: CycleProblem,
        previous_plan: CyclePlan | None = None,
        *,
        time_limit_s: float = 1.0,
        mip_rel_gap: float = DEFAULT_GAP,
        choose_setpoint: bool = True,
        refine_top: int | None = None,
    ) -> CyclePlan:
        """DVFS levels, idle states and (optionally) the set-point for one cycle.

        ``time_limit_s`` bounds the whole call (shared by the set-point options; the last one
        gets what is left), but for a solve still running at its share's end: it is cancelled and
        waited for up to 0.5 s more, then given up (a solve that ignores the cancel can make the
        call that much longer); ``previous_plan`` warm-starts the solver (when ``warm_start``). The
        greedy plan is always computed first, at every set-point, so a late, failed or worse solve
        falls back to it. ``refine_top=k`` runs the MILP only at the ``k`` set-points whose greedy
        plans score best (None: at all of them).

        The plan's ``explanation`` holds one line per reason: with no feasible plan (INFEASIBLE), why
        each set-point has none; otherwise why each set-point the MILP was run for kept its greedy plan
        (late, failed, stopped with no solution, infeasible, over the caps as the twin rates it, or no
        time left: ``supply 30 deg C: ...; greedy plan used``), so that a FALLBACK always says why (a
        set-point ``refine_top`` left out keeps its greedy plan with no line: it was not asked for), and
        which chunks of a chunked solve whose plan is used kept their greedy levels (``supply 30 deg C:
        1 of 8 chunks had no solution: chunk 7 (racks r7: timeout_no_solution, no time left); their
        greedy levels used``).
        """
        _check_limits(time_limit_s, mip_rel_gap)
        t_start = time.monotonic()
        deadline = t_start + time_limit_s
        options = p.supply_options_c if choose_setpoint else (p.supply_temp_c,)
        records: list[SetpointOption] = []
        reasons: list[str] = []  # why a set-point has no feasible plan
        fallbacks: list[str] = []  # why a set-point the MILP was run for keeps its greedy plan
        # 1. the twin's tables and the greedy plan at every set-point (cheap; also the fallback)
        cands = _greedy_options(p, options, records, reasons)
        # 2. the MILP for the set-points whose greedy plans score best (all unless refine_top), each
        #    given an equal share of the time left; the best plan of all set-points is kept
        cands.sort(key=lambda c: -c.greedy_plan.objective_per_h)
        n_refine = len(cands) if refine_top is None else min(max(refine_top, 1), len(cands))
        best: _Outcome | None = None
        for i, c in enumerate(cands):
            t1 = time.monotonic()
            left = deadline - time.monotonic()
            share = left / (n_refine - i) if i < n_refine else 0.0
            if share > 0.005:
                out = self._refine(p, c, previous_plan, share, mip_rel_gap, fallbacks)
            else:  # left out by refine_top (by request: no reason), or no time left for it
                out = c.fallback()
                if i < n_refine:
                    fallbacks.append(_fallback_reason(c.supply_c, "the time limit was used up before its solve"))
            records.append(out.record(c.supply_c, time.monotonic() - t1))
            if best is None or out.plan.objective_per_h > best.plan.objective_per_h:
                best = out
        # 3. the result (nothing feasible at any set-point: the greedy plan flagged infeasible)
        records.sort(key=lambda r: r.supply_temp_c)
        elapsed = time.monotonic() - t_start
        if best is None:
            return _finish(p, None, records, reasons, fallbacks, elapsed, SolveStatus.OPTIMAL, None, "milp")
        return _finish(p, best.plan, records, reasons, fallbacks, elapsed, best.status, best.gap, best.source)

    def _refine(
        self,
        p: CycleProblem,
        c: _Option,
        previous_plan: CyclePlan | None,
        share: float,
        mip_rel_gap: float,
        reasons: list[str],
    ) -> _Outcome:
        """Step 2 of :meth:`plan` at one set-point: the MILP, warm-started, run until ``share`` seconds
        (plus :data:`DEADLINE_GRACE_S`) are up; the greedy plan (:meth:`_Option.fallback`) when the
        solve is late, fails or finds nothing (why, in ``reasons``), otherwise :func:`_judge_solution`'s."""
        solver = self.solver_for(c.supply_c, self.chunking(c.tables))
        start = _warm_start(previous_plan, c)
        lim = max(share - DEADLINE_GRACE_S / 2, 0.001)

        def call() -> tuple[SolveInfo, IntArray | None, IntArray | None]:
            return solver.solve(p, c.tables, c.line, lim, mip_rel_gap, start, c.greedy)

        try:
            done, out = _run_with_deadline(call, time.monotonic() + share + DEADLINE_GRACE_S, solver.cancel)
        except SolverConfigError:
            raise
        except Exception as exc:  # the solver failed: fall back
            solver.drop()
            reasons.append(_fallback_reason(c.supply_c, f"solver error {exc!r}"))
            return c.fallback()
        if not done:  # late: cancelled, and the solver (maybe still running) is not reused
            solver.drop()
            reasons.append(
                _fallback_reason(
                    c.supply_c, f"the solve was still running at the end of its {share:.3f} s share of the time limit"
                )
            )
            return c.fallback()
        if out is None:  # pragma: no cover - the solve returns a tuple
            reasons.append(_fallback_reason(c.supply_c, "the solver returned nothing"))
            return c.fallback()
        return _judge_solution(p, c, *out, reasons)


def plan_cycle(
    problem: CycleProblem,
    previous_plan: CyclePlan | None = None,
    *,
    time_limit_s: float = 1.0,
    mip_rel_gap: float = DEFAULT_GAP,
    choose_setpoint: bool = True,
    refine_top: int | None = None,
    planner: CyclePlanner | None = None,
) -> CyclePlan:
    """One control cycle (see :meth:`CyclePlanner.plan`); pass a ``planner`` to keep solvers warm."""
    pl = planner if planner is not None else CyclePlanner()
    return pl.plan(
        problem,
        previous_plan,
        time_limit_s=time_limit_s,
        mip_rel_gap=mip_rel_gap,
        choose_setpoint=choose_setpoint,
        refine_top=refine_top,
    )
