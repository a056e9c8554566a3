"""Planning one control cycle: DVFS levels per job, awake / low-power idle cards per rack and the
coolant set-point, from the greedy plan at every set-point refined by the DVFS MILP (solved through
:mod:`models.dvfs_solver`) within a deadline, every plan judged by the twin, and the greedy plan as
the fallback.

Entry points for a synchronous controller:

* :func:`plan_cycle` (or :meth:`CyclePlanner.plan` to keep the solver warm across cycles): DVFS
  levels per job, awake / low-power idle cards per rack and the coolant set-point for one cycle;
* :func:`greedy_cycle`: the same from the greedy heuristic alone (no solver).

The placement of queued jobs is :func:`models.placement.place_jobs`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.dvfs_solver import DecomposedDvfsSolver, DvfsSolver, SolveInfo, SolverConfigError, run_with_deadline
from models.heuristic import GreedyDvfs, greedy_dvfs
from models.plans import CyclePlan, DvfsPlan, SetpointOption, SetpointPlan, SolveStatus, assess_dvfs
from models.problem import CycleProblem, DvfsTables, FacilityLine, dvfs_tables, facility_line, it_power_range_w

IntArray = npt.NDArray[np.int64]

__all__ = [
    "CyclePlanner",
    "greedy_cycle",
    "plan_cycle",
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
            done, out = run_with_deadline(call, time.monotonic() + share + DEADLINE_GRACE_S, solver.cancel)
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
