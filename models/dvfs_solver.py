"""The HiGHS back end of the DVFS MILP: one solve through Pyomo with a verified time limit and gap,
status mapping, a persistent model across control cycles (:class:`DvfsSolver`), the same in
independent chunks (:class:`DecomposedDvfsSolver`), and a deadline enforced outside the solver
(:func:`run_with_deadline`). The cycle planner that uses them is :mod:`models.solve`.

Pitfalls handled (BASELINES.md): the limit and gap are passed on every call *and read back from
HiGHS* after it (:class:`SolverConfigError` if HiGHS did not take them); ``pyomo.contrib.solver``'s
HiGHS is asked not to raise on non-optimal results and not to load solutions, and the status is
mapped here; HiGHS may overrun its own limit, so the solve runs in a worker thread that is waited
for only until the deadline, then cancelled (``Highs.cancelSolve``); the planner then returns the
greedy plan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyomo.environ as pyo
from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition
from pyomo.contrib.solver.solvers.highs import Highs

from models.decompose import it_price_per_wh as it_price_per_wh_for
from models.decompose import split_chunks
from models.dvfs import build_dvfs_model, dvfs_structure_key, set_dvfs_data
from models.heuristic import GreedyDvfs, greedy_dvfs
from models.plans import SolveStatus
from models.problem import CycleProblem, DvfsTables, FacilityLine

IntArray = npt.NDArray[np.int64]
T = TypeVar("T")

__all__ = [
    "DecomposedDvfsSolver",
    "DvfsSolver",
    "SolveInfo",
    "SolverConfigError",
    "highs_option",
    "highs_solve",
    "relative_gap",
    "run_with_deadline",
]


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


def relative_gap(obj: float | None, bound: float | None) -> float | None:
    if obj is None or bound is None or not np.isfinite(bound):
        return None
    return abs(bound - obj) / max(abs(obj), 1e-9)


def run_with_deadline(fn: Callable[[], T], deadline_s: float, cancel: Callable[[], None]) -> tuple[bool, T | None]:
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


def highs_option(h: Any, name: str) -> float:
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
    tl = highs_option(h, "time_limit")
    gp = highs_option(h, "mip_rel_gap")
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
        gap=relative_gap(obj, bound) if status != SolveStatus.OPTIMAL else (relative_gap(obj, bound) or 0.0),
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
            gap=relative_gap(obj, bound) if has else None,
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
