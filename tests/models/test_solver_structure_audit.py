"""Mutation audit of models/dvfs.py, models/placement.py, models/dvfs_solver.py and models/solve.py (the
Pyomo/HiGHS models, the solve wrapper and the cycle planner): behaviour an operator relies on that no
other test held."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from models_helpers import job, judge, problem, rack_cards
from pyomo.contrib.solver.solvers.highs import Highs

from models.dvfs_solver import DecomposedDvfsSolver, DvfsSolver, SolveInfo
from models.placement import PlacementProblem, QueuedJob, greedy_placement
from models.plans import CyclePlan, SolveStatus
from models.problem import CycleProblem, dvfs_tables, facility_line, it_power_range_w, make_problem
from models.solve import CyclePlanner, greedy_cycle
from models.synthetic import synthetic_workload
from twin.spec import SiteSpec

pytestmark = pytest.mark.models


def test_a_persistent_planner_caps_the_rack_a_job_moved_into(site: SiteSpec) -> None:
    """Jobs a and b swap racks between two cycles (a: r0 -> r1, b: r1 -> r0); the jobs, their card
    counts and the racks with idle cards stay the same, so only which rack holds which job differs.
    r0's limit holds a full rack of this work only at level 2 or slower. A persistent planner that
    kept its first model would still cap a (now in the roomy r1) by r0's limit and leave b (now in
    r0) free: r0 over its cap. The second cycle must slow b as a was slowed, run a as fast as b ran,
    and be the MILP's optimal plan, within every rack's cap as the twin judges it."""

    def cycle(a_rack: int, b_rack: int, limits: np.ndarray | None) -> CycleProblem:
        return problem(
            site, [job("a", 64), job("b", 64)], [rack_cards(a_rack), rack_cards(b_rack)], limit_w=limits, options=[30.0]
        )

    t = dvfs_tables(cycle(0, 1, None))
    limits = np.full(site.n_racks, 50_000.0)
    limits[0] = t.rack_base_w[0] + t.pair_power_w[0, 2] + 1000.0 + 1.0  # cap (limit - 1 kW margin) just over level 2
    planner = CyclePlanner(persistent=True)
    first = planner.plan(cycle(0, 1, limits), choose_setpoint=False, time_limit_s=5.0)
    assert (first.status, first.source) == (SolveStatus.OPTIMAL, "milp") and first.dvfs is not None
    tight, roomy = first.dvfs.job_level.tolist()
    assert tight >= 2 > roomy  # a slowed to fit r0, b faster in r1 (the energy price may keep it off the top clock)
    second = planner.plan(cycle(1, 0, limits), choose_setpoint=False, time_limit_s=5.0)
    assert (second.status, second.source) == (SolveStatus.OPTIMAL, "milp") and second.dvfs is not None
    assert second.dvfs.job_level.tolist() == [roomy, tight]
    rack_w, _die = judge(cycle(1, 0, limits), second.dvfs, second.supply_temp_c)
    assert np.all(rack_w <= cycle(1, 0, limits).rack_cap_w() + 1e-6)


def _optimal_info() -> SolveInfo:
    return SolveInfo(SolveStatus.OPTIMAL, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1e-3)


def test_a_solver_plan_over_a_rack_cap_or_a_die_limit_is_replaced_by_the_greedy_plan(site: SiteSpec) -> None:
    """The planner holds a solved plan to the twin before it keeps it: a plan that takes a rack over
    its cap (limit - margin), or a busy card over its die limit, is never sent; the greedy plan is
    (status FALLBACK). The MILP's own rows and bounds keep its plans inside both, so this is the
    check behind them, exercised with the level one step faster than allowed: level 3 for a 64-card
    job whose rack's cap holds level 4 (3.8 kW over), level 0 for a 32-card job whose dies are
    within the limit only at level 1 or slower. The idle cards of the other racks make the planner's
    idle-card exemption take part in both checks."""
    from models.solve import _greedy_options, _judge_solution

    full = problem(site, [job("a", 64)], [rack_cards(0)], options=[30.0])
    t = dvfs_tables(full)
    limits = np.full(site.n_racks, 50_000.0)
    limits[0] = t.rack_base_w[0] + t.pair_power_w[0, 4] + 1000.0 + 1.0  # r0's cap holds level 4 or slower
    half = problem(site, [job("a", 32)], [rack_cards(0, 32)], options=[30.0])  # within the cap at any level
    t = dvfs_tables(half)
    assert t.allowed[0].all()
    hot = np.zeros(site.n_cards)
    hot[rack_cards(0, 32)] = half.die_limit_c - t.job_die_max_c[0, 1] - 0.1  # level 1 just within, level 0 over
    cases = {  # the problem, and the level one step faster than it allows
        "rack cap": (problem(site, [job("a", 64)], [rack_cards(0)], options=[30.0], limit_w=limits), 3),
        "die limit": (dataclasses.replace(half, die_offset_k=hot), 0),
    }
    awake = np.zeros(site.n_racks, dtype=np.int64)
    for what, (p, too_fast) in cases.items():
        (c,) = _greedy_options(p, (30.0,), [], [])
        assert c.greedy_plan.within_caps(p), what
        reasons: list[str] = []
        out = _judge_solution(p, c, _optimal_info(), np.array([too_fast]), awake, reasons)
        assert (out.status, out.source) == (SolveStatus.FALLBACK, "greedy"), what
        assert out.plan is c.greedy_plan, what
        # the same call with a level within both is kept as the MILP's plan
        ok = _judge_solution(p, c, _optimal_info(), c.greedy.job_level, awake, reasons)
        assert (ok.status, ok.source) == (SolveStatus.OPTIMAL, "milp"), what


def test_awake_cards_read_off_a_solved_model_are_rounded_not_truncated(site: SiteSpec) -> None:
    """HiGHS holds an integer column within its tolerances (9.9999999 for 10): the awake cards read
    off the model are the nearest whole number, so a ready reserve of 10 is not read as 9 awake."""
    from models.dvfs import build_dvfs_model, extract_dvfs
    from models.problem import facility_line, it_power_range_w

    p = problem(site, [job("a", 64)], [rack_cards(0)], reserve=10, options=[30.0])
    t = dvfs_tables(p)
    m = build_dvfs_model(p, t, facility_line(site, 30.0, p.ambient_c, *it_power_range_w(p, t)))
    for k in range(t.n_levels):
        m.x[0, k].set_value(1.0 - 1e-7 if k == 3 else 1e-7, skip_validation=True)
    racks = list(m.RI)
    for r in racks:
        m.a[r].set_value(0.0, skip_validation=True)
    m.a[racks[0]].set_value(10.0 - 1e-7, skip_validation=True)
    m.a[racks[1]].set_value(1e-7, skip_validation=True)
    level, awake = extract_dvfs(m, t)
    assert level.tolist() == [3]
    assert awake[racks[0]] == 10 and awake.sum() == 10


def test_a_queued_job_limited_to_no_rack_is_refused(site: SiteSpec) -> None:
    """``max_racks`` below 1 is an error in the queue, not "any number of racks" (0 is falsy where
    the limit is read); a job asking for more cards than the site has is refused, one asking for
    all of them is not."""
    from models.placement import QueuedJob, make_placement_problem
    from models.problem import ProblemError

    p = problem(site, [], [], options=[30.0])
    with pytest.raises(ProblemError, match="max_racks must be >= 1"):
        make_placement_problem(p, [QueuedJob(job("q", 8), max_racks=0)])
    make_placement_problem(p, [QueuedJob(job("q", 8), max_racks=1)])
    with pytest.raises(ProblemError, match="cards requested but the site has"):
        make_placement_problem(p, [QueuedJob(job("q", site.n_cards + 1))])
    make_placement_problem(p, [QueuedJob(job("q", site.n_cards))])


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_a_job_takes_cards_of_a_host_that_is_up_before_a_booting_one(method: str) -> None:
    """Hosts not up come last, whatever else ranks them (module docstring of models.placement): a ring
    of 6 cards in two hosts of 3, host {0, 1, 2} booting (60 s left) with card 0 failed (so it is
    partly free, the class a 2-card job fills first among hosts that are up), host {3, 4, 5} up and
    wholly free. A 2-card job takes two adjacent cards of the host that is up, not cards 1 and 2 of
    the booting one (it would wait a minute for cards that were free and up)."""
    from test_placement_mutants2 import _ring_site

    from models.placement import PlacementProblem, QueuedJob, place_jobs

    site = _ring_site(6, 2)
    free = np.array([False, True, True, True, True, True])
    wait = np.array([60.0, 60.0, 60.0, 0.0, 0.0, 0.0])
    pp = PlacementProblem(site, free, (QueuedJob(job("q", 2)),), np.array([1e6]), np.array([500.0]), wait)
    plan = place_jobs(pp, method=method)
    assert plan.cards["q"].tolist() in ([3, 4], [4, 5])


def test_the_greedy_looks_at_racks_whose_hosts_are_up_before_roomier_ones_that_must_boot(site: SiteSpec) -> None:
    """Every card free; r0..r4 have the most power headroom but all their hosts are booting (300 s);
    r5..r7 are up, r5 the roomiest of them. An 8-card job fits every rack without overload: it goes
    to r5 (no boot to wait for), not to a roomier rack it would wait 5 minutes for. (The greedy scores
    only a few windows per length: the ones with enough cards on hosts that are up must be among them.)"""
    from models.placement import PlacementProblem, QueuedJob, greedy_placement

    free = np.ones(site.n_cards, dtype=bool)
    wait = np.zeros(site.n_cards)
    wait[: 5 * 64] = 300.0
    head = np.array([40e3, 39e3, 38e3, 37e3, 36e3, 10e3, 6e3, 5e3])
    pp = PlacementProblem(site, free, (QueuedJob(job("q", 8)),), head, np.array([500.0]), wait)
    plan = greedy_placement(pp)
    assert plan.racks["q"] == (5,)
    assert np.all(wait[plan.cards["q"]] == 0.0)


def _pp(site: SiteSpec, jobs: list[int], head_w: list[float], wait_s: np.ndarray | None = None) -> PlacementProblem:
    """Every card free; queued jobs of ``jobs`` cards (q0, q1, ...) at 500 W a card; per-rack headroom."""
    queue = tuple(QueuedJob(job(f"q{i}", n)) for i, n in enumerate(jobs))
    free = np.ones(site.n_cards, dtype=bool)
    return PlacementProblem(site, free, queue, np.array(head_w), np.full(len(jobs), 500.0), wait_s)


def test_the_greedy_puts_a_job_in_the_rack_with_the_most_power_headroom(site: SiteSpec) -> None:
    """Eight free racks, each with room for an 8-card job (4 kW): the job goes to the rack with the
    most headroom (r6), not to one of those with the least (the greedy scores a few windows per
    length after ranking them by headroom, roomiest first)."""
    plan = greedy_placement(_pp(site, [8], [9e3, 8e3, 7e3, 6e3, 5e3, 11e3, 20e3, 10e3]))
    assert plan.racks["q0"] == (6,)
    assert plan.overload_w == 0.0


def test_the_greedy_takes_a_booting_rack_with_room_before_an_up_rack_it_would_overload(site: SiteSpec) -> None:
    """r0's hosts are up but it has 1 kW of headroom (an 8-card job adds 4 kW); every other rack's
    hosts are booting (300 s) with 40 kW of headroom. The documented score weighs the overload before
    the wait: the job goes to a booting rack, with no overload, not over r0's limit."""
    wait = np.full(site.n_cards, 300.0)
    wait[rack_cards(0)] = 0.0
    plan = greedy_placement(_pp(site, [8], [1e3] + [40e3] * 7, wait))
    assert plan.racks["q0"] != (0,)
    assert plan.overload_w == 0.0


def test_the_greedy_counts_the_power_of_the_jobs_it_placed_before_the_next_one(site: SiteSpec) -> None:
    """Two 8-card jobs (4 kW each); r0 has room for one (5 kW), r1 for one (4.5 kW), the others for
    none. The first takes r0; the second must see r0 with 1 kW left and take r1, not r0 again
    (r0 3 kW over its limit)."""
    plan = greedy_placement(_pp(site, [8, 8], [5e3, 4.5e3] + [0.0] * 6))
    assert (plan.racks["q0"], plan.racks["q1"]) == ((0,), (1,))
    assert plan.overload_w == 0.0


def test_the_milp_places_each_job_once_on_two_supernodes(site: SiteSpec) -> None:
    """Two supernodes with 8 free cards each (r0 and r8), two 8-card jobs, a before b (priority).
    Each job goes to one supernode, so both run: a on one rack, b on the other, 16 distinct free
    cards. (A job handed to both supernodes is placed twice: its first cards are taken but not
    its, and b finds no free card left and stays queued.)"""
    from models.placement import milp_placement

    big = site.with_supernodes(2)
    free = np.zeros(big.n_cards, dtype=bool)
    free[rack_cards(0, 8)] = free[rack_cards(8, 8)] = True
    queue = (QueuedJob(job("a", 8, priority=2.0)), QueuedJob(job("b", 8, priority=1.0)))
    pp = PlacementProblem(big, free, queue, np.full(big.n_racks, 40e3), np.full(2, 500.0))
    plan = milp_placement(pp, time_limit_s=10.0)
    assert plan.unplaced == {}
    assert (plan.status, plan.source) == ("optimal", "milp")
    assert sorted([plan.racks["a"], plan.racks["b"]]) == [(0,), (8,)]
    taken = np.concatenate([plan.cards["a"], plan.cards["b"]])
    assert sorted(taken.tolist()) == np.flatnonzero(free).tolist()


def test_auto_placement_keeps_the_milp_plan_when_it_places_more(site: SiteSpec) -> None:
    """16 free cards in r0, 8 in r4; a (8 cards, priority 2) before b (16 cards on one rack). The greedy
    gives a the roomier r0 and leaves b queued; the MILP puts a in r4 and b in r0. ``place_jobs``
    ("auto", one supernode) keeps the plan that places more: both jobs run."""
    from models.placement import place_jobs

    free = np.zeros(site.n_cards, dtype=bool)
    free[rack_cards(0, 16)] = free[rack_cards(4, 8)] = True
    queue = (QueuedJob(job("a", 8, priority=2.0)), QueuedJob(job("b", 16), max_racks=1))
    head = np.full(site.n_racks, 20e3)
    head[0] = 30e3
    pp = PlacementProblem(site, free, queue, head, np.full(2, 500.0))
    assert set(greedy_placement(pp).unplaced) == {"b"}
    plan = place_jobs(pp, time_limit_s=10.0)
    assert plan.source == "milp" and plan.unplaced == {}
    assert (plan.racks["a"], plan.racks["b"]) == ((4,), (0,))


def test_auto_placement_keeps_the_greedy_plan_when_the_milp_does_no_better(site: SiteSpec) -> None:
    """One 8-card job, every card free, room everywhere: both plans place it with no overload, and
    "auto" keeps the greedy plan (``place_jobs``: the greedy's when it places at least as many
    priority-weighted cards)."""
    from models.placement import place_jobs

    plan = place_jobs(_pp(site, [8], [40e3] * 8), time_limit_s=10.0)
    assert plan.source == "greedy" and set(plan.cards) == {"q0"}


class _StoppedHighsSolver(DvfsSolver):
    """A :class:`DvfsSolver` whose HiGHS runs with ``options`` that stop it early, the same at every
    run (as a deadline stops it, but deterministic): ``mip_max_improving_sols = 1`` stops it at its
    first improving solution, ``mip_max_nodes = 0`` before it has any (pyomo reports both as
    ``iterationLimit``)."""

    def __init__(self, **options: object) -> None:
        super().__init__()
        self.options = options

    def _prepare(self, *args: Any) -> tuple[Any, Highs]:
        model, solver = super()._prepare(*args)
        solver.config.solver_options.update(self.options)
        return model, solver


class _StoppedHighsPlanner(CyclePlanner):
    """A planner whose every solver is a :class:`_StoppedHighsSolver` with ``options``."""

    def __init__(self, **options: object) -> None:
        super().__init__()
        self.options = options

    def solver_for(self, supply_c: float, chunk: int | None = None) -> DvfsSolver:
        return _StoppedHighsSolver(**self.options)


def _seed5(site: SiteSpec) -> CycleProblem:
    wl = synthetic_workload(site, seed=5, allocation=0.9, compute_share=(0.9, 0.99))
    return make_problem(
        site, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, rack_limit_w=46_000.0,
        ready_reserve_cards=8, supply_options_c=[30.0],
    )  # fmt: skip


def test_a_solve_stopped_with_an_incumbent_gives_its_plan_flagged_feasible_with_its_gap(site: SiteSpec) -> None:
    """A MILP stopped before it proved its incumbent within the gap (here 0.6% from the bound) still
    has a plan within the caps, here better than the greedy one: the planner sends it, as FEASIBLE
    (not OPTIMAL) with the gap HiGHS left, not the greedy plan as if there were no solution."""
    p = _seed5(site)
    planner = _StoppedHighsPlanner(mip_max_improving_sols=1)
    plan = planner.plan(p, choose_setpoint=False, time_limit_s=10.0, mip_rel_gap=1e-6)
    assert (plan.status, plan.source) == (SolveStatus.FEASIBLE, "milp"), plan.explanation
    assert plan.mip_gap is not None and plan.mip_gap > 5e-3
    assert plan.dvfs is not None and plan.dvfs.within_caps(p)


def test_a_solve_stopped_without_a_solution_falls_back_to_the_greedy_plan(site: SiteSpec) -> None:
    """A MILP stopped before it found any solution has no levels to give: the plan is the greedy
    one, as it is, flagged FALLBACK (never HiGHS's column values of an unsolved model, read as
    levels)."""
    from models.problem import facility_line, it_power_range_w

    p = _seed5(site)
    planner = _StoppedHighsPlanner(mip_max_nodes=0)
    t = dvfs_tables(p)
    line = facility_line(site, p.supply_temp_c, p.ambient_c, *it_power_range_w(p, t))
    info, level, awake = planner.solver_for(30.0).solve(p, t, line, 10.0, 1e-3)
    assert info.status == SolveStatus.TIMEOUT_NO_SOLUTION
    assert info.objective is None and level is None and awake is None
    plan = planner.plan(p, choose_setpoint=False, time_limit_s=10.0)
    greedy = greedy_cycle(p, choose_setpoint=False)
    assert (plan.status, plan.source) == (SolveStatus.FALLBACK, "greedy")
    assert plan.dvfs is not None and greedy.dvfs is not None
    assert plan.dvfs.job_level.tolist() == greedy.dvfs.job_level.tolist()
    assert plan.dvfs.rack_awake.tolist() == greedy.dvfs.rack_awake.tolist()


def test_refine_top_runs_the_milp_only_at_the_best_set_points(site: SiteSpec) -> None:
    """Three set-points, ``refine_top=1`` (the agent asks for 2 to save time): the MILP runs at the
    set-point whose greedy plan scores best; the two others keep their greedy plans (FALLBACK)."""
    p = problem(site, [job("a", 64), job("b", 32)], [rack_cards(0), rack_cards(1, 32)], options=[30.0, 35.0, 40.0])
    plan = CyclePlanner().plan(p, time_limit_s=10.0, refine_top=1)
    assert sorted(r.status.value for r in plan.setpoint.options) == ["fallback", "fallback", "optimal"]
    assert (plan.status, plan.source) == (SolveStatus.OPTIMAL, "milp")


@pytest.fixture
def placement_highs_stopped_before_a_solution() -> Iterator[None]:
    """The placement MILP's HiGHS (``models.placement``'s per-thread interface) stopped before it has
    any solution (``mip_max_nodes = 0``, no presolve nor heuristics: as a deadline that comes first),
    for the test's duration."""
    import models.placement as placement

    highs = Highs()
    highs.config.solver_options.update(mip_max_nodes=0, presolve="off", mip_heuristic_effort=0.0)
    placement._solvers.highs = highs
    try:
        yield
    finally:
        del placement._solvers.highs


@pytest.mark.usefixtures("placement_highs_stopped_before_a_solution")
def test_a_placement_milp_with_no_solution_is_reported_as_the_greedy_fallback(site: SiteSpec) -> None:
    """Stage 1 of the placement MILP ends without a solution: the plan is the greedy one, reported as
    such (status "fallback", source "greedy"), not as an optimal MILP plan."""
    from models.placement import milp_placement

    plan = milp_placement(_pp(site, [8, 16], [40e3] * 8), time_limit_s=10.0)
    assert (plan.status, plan.source) == ("fallback", "greedy")
    assert sorted(plan.cards) == ["q0", "q1"] and plan.unplaced == {}


class _FailingSolver(DvfsSolver):
    """A :class:`DvfsSolver` whose solve raises (a solver crash, as the planner meets it)."""

    def solve(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("HiGHS crashed")


class _FailingPlanner(CyclePlanner):
    def solver_for(self, supply_c: float, chunk: int | None = None) -> DvfsSolver:
        return _FailingSolver()


def test_every_fallback_of_the_planner_says_why(site: SiteSpec) -> None:
    """A plan that falls back to the greedy one says why in its explanation (the agent's decision log and
    ``racktwin optimize`` show it): it used to say why only when HiGHS reported the problem infeasible,
    so a solve stopped with no solution (a node limit here, a time limit alike), a late one, a failed one
    or one over the caps gave a FALLBACK with an empty explanation."""
    p = _seed5(site)
    stopped = _StoppedHighsPlanner(mip_max_nodes=0).plan(p, choose_setpoint=False, time_limit_s=10.0)
    assert stopped.status == SolveStatus.FALLBACK
    assert stopped.explanation == (
        "supply 30 deg C: HiGHS stopped at a limit before it found a solution (iterationLimit); greedy plan used"
    )
    failed = _FailingPlanner().plan(p, choose_setpoint=False, time_limit_s=10.0)
    assert failed.status == SolveStatus.FALLBACK
    assert failed.explanation == "supply 30 deg C: solver error RuntimeError('HiGHS crashed'); greedy plan used"
    no_time = CyclePlanner().plan(p, choose_setpoint=False, time_limit_s=1e-6)  # the greedy plans used it up
    assert no_time.status == SolveStatus.FALLBACK
    assert no_time.explanation == "supply 30 deg C: the time limit was used up before its solve; greedy plan used"
    # a solution the twin finds over a rack's cap (as in the test above: level 3 where r0's cap holds 4)
    from models.solve import _greedy_options, _judge_solution

    t = dvfs_tables(problem(site, [job("a", 64)], [rack_cards(0)], options=[30.0]))
    limits = np.full(site.n_racks, 50_000.0)
    limits[0] = t.rack_base_w[0] + t.pair_power_w[0, 4] + 1000.0 + 1.0
    capped = problem(site, [job("a", 64)], [rack_cards(0)], options=[30.0], limit_w=limits)
    (c,) = _greedy_options(capped, (30.0,), [], [])
    reasons: list[str] = []
    _judge_solution(capped, c, _optimal_info(), np.array([3]), np.zeros(site.n_racks, dtype=np.int64), reasons)
    assert reasons == [
        "supply 30 deg C: the solver's plan (optimal) has 1 rack(s) over their cap (r0) as the twin rates it; "
        "greedy plan used"
    ]
    # an optimal plan has nothing to explain
    assert CyclePlanner().plan(p, choose_setpoint=False, time_limit_s=10.0).explanation == ""


def test_a_chunked_solve_names_the_chunks_with_no_solution_and_how_each_ended(site: SiteSpec) -> None:
    """Two supernodes, a chunk of 512 cards each (racks r0-r7 and r8-r15). Where a chunk's HiGHS stops
    before it has a solution (``mip_max_nodes = 0``) that chunk keeps the greedy levels: the plan says
    which chunk, its racks and how its solve ended, whether the other chunk's solution is used
    (FEASIBLE) or no chunk has one (the greedy plan). The solve's message said only "2 chunks", and a
    plan with a chunk left greedy said nothing."""
    big = site.with_supernodes(2)
    wl = synthetic_workload(big, seed=5, allocation=0.9, compute_share=(0.9, 0.99))
    p = make_problem(
        big, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, rack_limit_w=46_000.0,
        ready_reserve_cards=8, supply_options_c=[30.0],
    )  # fmt: skip
    stopped = "timeout_no_solution, iterationLimit"
    chunk_0 = f"chunk 0 (racks r0, r1, r2, r3 and 4 more: {stopped})"
    chunk_1 = f"chunk 1 (racks r8, r9, r10, r11 and 4 more: {stopped})"

    def plan(stopped_chunks: list[int]) -> CyclePlan:
        planner = CyclePlanner(chunk_cards=512)
        solver = planner.solver_for(30.0, 512)
        assert isinstance(solver, DecomposedDvfsSolver)
        for i in stopped_chunks:
            solver._parts[i] = _StoppedHighsSolver(mip_max_nodes=0)
        return planner.plan(p, choose_setpoint=False, time_limit_s=20.0)

    partly = plan([1])
    assert (partly.status, partly.source) == (SolveStatus.FEASIBLE, "milp")
    assert partly.explanation == f"supply 30 deg C: 1 of 2 chunks had no solution: {chunk_1}; their greedy levels used"
    none = plan([0, 1])
    assert (none.status, none.source) == (SolveStatus.FALLBACK, "greedy")
    assert none.explanation == (
        "supply 30 deg C: HiGHS stopped at a limit before it found a solution (2 chunks: 2 timeout_no_solution; "
        f"no solution in {chunk_0}, {chunk_1}); greedy plan used"
    )
    assert plan([]).explanation == ""


def test_a_late_solve_says_it_was_late(site: SiteSpec) -> None:
    """The solve still running at the end of its share of the time limit is cancelled: the greedy plan,
    and why."""
    from solver_testing import LatePlanner

    p = _seed5(site)
    plan = LatePlanner().plan(p, choose_setpoint=False, time_limit_s=0.05)
    assert plan.status == SolveStatus.FALLBACK
    assert plan.explanation.startswith("supply 30 deg C: the solve was still running at the end of its ")
    assert plan.explanation.endswith(" s share of the time limit; greedy plan used")


def test_a_chunk_stopped_with_a_solution_is_used_beside_a_chunk_stopped_without_one(site: SiteSpec) -> None:
    """The scene of the test above: chunk 0's HiGHS stops before it has a solution, chunk 1's at its
    first improving solution (``mip_max_improving_sols = 1``: a solution, not proven optimal, as a
    deadline leaves one). The chunked solve has a solution (FEASIBLE): chunk 1's levels, chunk 0 at
    the greedy levels, said in ``greedy_parts``; the first chunk's status does not decide the whole."""
    big = site.with_supernodes(2)
    wl = synthetic_workload(big, seed=5, allocation=0.9, compute_share=(0.9, 0.99))
    p = make_problem(
        big, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, rack_limit_w=46_000.0,
        ready_reserve_cards=8, supply_options_c=[30.0],
    )  # fmt: skip
    t = dvfs_tables(p)
    line = facility_line(big, p.supply_temp_c, p.ambient_c, *it_power_range_w(p, t))
    solver = DecomposedDvfsSolver(chunk_cards=512)
    solver._parts[0] = _StoppedHighsSolver(mip_max_nodes=0)
    solver._parts[1] = _StoppedHighsSolver(mip_max_improving_sols=1)
    info, level, awake = solver.solve(p, t, line, 20.0, 1e-4)
    assert info.status == SolveStatus.FEASIBLE and level is not None and awake is not None
    chunk_0 = "chunk 0 (racks r0, r1, r2, r3 and 4 more: timeout_no_solution, iterationLimit)"
    assert info.message == f"2 chunks: 1 timeout_no_solution, 1 feasible; no solution in {chunk_0}"
    assert info.greedy_parts == f"1 of 2 chunks had no solution: {chunk_0}"


def test_a_chunked_solve_of_a_site_with_no_jobs_is_optimal_and_says_no_chunk_was_solved(site: SiteSpec) -> None:
    """No job anywhere: no chunk has anything to solve, so the greedy levels are the optimum (OPTIMAL,
    not FEASIBLE) and the solve's message says none was solved."""
    big = site.with_supernodes(2)
    p = make_problem(big, jobs=[], job_cards=[], ready_reserve_cards=8, supply_options_c=[30.0])
    t = dvfs_tables(p)
    line = facility_line(big, p.supply_temp_c, p.ambient_c, *it_power_range_w(p, t))
    info, level, awake = DecomposedDvfsSolver(chunk_cards=512).solve(p, t, line, 5.0, 1e-3)
    assert (info.status, info.message, info.greedy_parts) == (
        SolveStatus.OPTIMAL,
        "2 chunks: none solved (no jobs)",
        "",
    )
    assert level is not None and awake is not None
    got = CyclePlanner(chunk_cards=512).plan(p, choose_setpoint=False, time_limit_s=5.0)
    assert (got.status, got.source, got.explanation) == (SolveStatus.OPTIMAL, "milp", "")
