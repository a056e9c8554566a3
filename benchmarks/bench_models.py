"""Benchmark of the optimization models: build and solve times, control-cycle re-solves, quality.

Run from the repository root (numbers go to benchmarks/results-models.md)::

    python3 benchmarks/bench_models.py                 # all sections, 512 / 2,048 / 8,192 cards
    python3 benchmarks/bench_models.py --sizes 512 --cycles 3 --sections dvfs

Instances: the example supernode (examples/supernode-512.toml) with ``site.with_supernodes(n)``;
a seeded synthetic workload (models.synthetic) at 95% allocation, compute shares 0.90-0.99 so that
full racks exceed 50 kW - 1 kW margin at the top clock (binding caps), 8 DVFS levels. Two job
mixes: "mixed" (sizes 8-256 cards, uniform) and "small" (8-16 cards: many more jobs, the hard
case). A control cycle changes parameters as a control loop does: every rack's limit moves by up to
1.5 kW (a dynamic cap) and 5% of the jobs switch between COMPUTE and CHECKPOINT.

Sections:
  dvfs       DVFS + idle at a fixed set-point: variants side by side in the same run (Pyomo rebuilt
             every cycle, Pyomo persistent, + warm start, decomposed, the same matrix straight into
             highspy, the greedy), first solve and repeated cycles, quality gap to the best plan;
             and the full cycle as a controller calls it (``CyclePlanner.plan``).
  setpoint   choosing the coolant set-point: enumeration (a MILP per option), screening
             (refine_top=2), one joint MILP.
  placement  a naive job x rack binary placement MILP vs the decomposed MILP vs the greedy.

Every time is a median over cycles (and over repeats for first solves); the machine is shared and
noisy, so compare numbers within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.solver_output import isolate_solver_output
from models.cooling import solve_joint_setpoint
from models.dvfs import dvfs_matrix
from models.dvfs_highspy import solve_matrix_highspy
from models.dvfs_solver import DecomposedDvfsSolver, DvfsSolver, highs_solve
from models.heuristic import greedy_dvfs
from models.placement import (
    PlacementProblem,
    QueuedJob,
    greedy_placement,
    make_placement_problem,
    milp_placement,
)
from models.plans import SolveStatus, assess_dvfs
from models.problem import (
    CycleProblem,
    dvfs_tables,
    facility_line,
    it_power_range_w,
    make_problem,
)
from models.solve import CyclePlanner
from models.synthetic import synthetic_workload
from twin.spec import SiteSpec, load_site
from twin.workload import Phase

ROOT = Path(__file__).resolve().parents[1]
MIXES = {"mixed": (8, 16, 32, 64, 128, 256), "small": (8, 16)}
SUPPLY_C = 30.0
GAP = 1e-3  # the control-cycle default (models.solve.DEFAULT_GAP)
LIMIT_S = 30.0


def med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def site_of(n_cards: int) -> SiteSpec:
    base = load_site(ROOT / "examples" / "supernode-512.toml")
    return base.with_supernodes(max(1, n_cards // base.n_cards))


def cycles(site: SiteSpec, mix: str, n_cycles: int, seed: int = 1) -> list[CycleProblem]:
    """The same jobs over ``n_cycles`` control cycles with moving rack limits and phases."""
    wl = synthetic_workload(
        site,
        seed=seed,
        allocation=0.95,
        sizes=MIXES[mix],
        compute_share=(0.9, 0.99),
        phase_weights=(0.9, 0.04, 0.04, 0.02),
    )
    rng = np.random.default_rng(seed + 100)
    phases = list(wl.job_phase)
    out = []
    for c in range(n_cycles):
        limits = site.rack.power_limit_w - (rng.uniform(0.0, 1500.0, site.n_racks) if c else np.zeros(site.n_racks))
        if c:
            flip = rng.random(len(phases)) < 0.05
            phases = [
                (Phase.CHECKPOINT if ph == Phase.COMPUTE else Phase.COMPUTE) if f else ph
                for ph, f in zip(phases, flip, strict=True)
            ]
        out.append(
            make_problem(
                site,
                jobs=wl.jobs,
                job_cards=wl.job_cards,
                job_phase=phases,
                rack_limit_w=limits,
                supply_temp_c=SUPPLY_C,
                ambient_c=25.0,
                ready_reserve_cards=16,
            )
        )
    return out


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "-"
            return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# DVFS + idle
# --------------------------------------------------------------------------------------------


def bench_dvfs(sizes: list[int], n_cycles: int, mixes: list[str], repeats: int) -> None:
    print("\n## DVFS + idle at a fixed set-point (30 deg C), binding caps\n")
    print(f"mip_rel_gap {GAP:g} on the loss scale (lost value + energy cost), time limit {LIMIT_S:g} s, threads 1.")
    print("first = the first cycle (build + solve); cycle = median of the following cycles; HiGHS = solver's own time;")
    print("gap = objective below the best plan of the cycle among all variants (twin-evaluated), in % of the best")
    print("plan's loss (value given up + energy cost) and in % of its objective (value - energy cost).\n")
    summary: list[list[Any]] = []
    for mix in mixes:
        for n in sizes:
            site = site_of(n)
            probs = cycles(site, mix, n_cycles)
            t0 = dvfs_tables(probs[0], SUPPLY_C)
            n_jobs, n_pairs = t0.n_jobs, t0.pair_job.size
            n_vars = n_jobs * t0.n_levels + int((t0.rack_idle > 0).sum()) + 1
            print(f"### {n:,} cards, {mix} jobs ({n_jobs} jobs, {n_pairs} job-rack pairs, {n_vars} columns)\n")
            rows = _dvfs_variants(probs, repeats)
            print(
                table(
                    [
                        "variant",
                        "first s",
                        "cycle s",
                        "HiGHS cycle s",
                        "build/update s",
                        "gap % of loss (median/max)",
                        "gap % of objective (max)",
                        "status",
                    ],
                    rows,
                )
            )
            # the full cycle as a controller calls it
            full: dict[str, list[float]] = {}
            for name, planner in (
                ("plan_cycle monolithic, persistent", CyclePlanner(chunk_cards=None)),
                ("plan_cycle chunks of 512 cards, persistent", CyclePlanner(chunk_cards=512)),
                ("plan_cycle default (auto: chunks above 128 jobs)", CyclePlanner()),
            ):
                ts = []
                for p in probs:
                    c0 = time.perf_counter()
                    cp = planner.plan(p, choose_setpoint=False, time_limit_s=LIMIT_S, mip_rel_gap=GAP)
                    ts.append(time.perf_counter() - c0)
                    assert cp.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE), cp.status
                full[name] = ts
            print()
            print(
                table(
                    ["full cycle (tables + greedy + MILP + twin check)", "first s", "cycle s"],
                    [[k, v[0], med(v[1:])] for k, v in full.items()],
                )
            )
            print()
            best_full = min(med(v[1:]) for v in full.values())
            summary.append([n, mix, n_jobs, best_full, {512: 0.2, 2048: 0.5, 8192: 2.0}.get(n, float("nan"))])
    print("### Summary: full DVFS + idle cycle (best variant) against the targets\n")
    print(table(["cards", "mix", "jobs", "cycle s (median)", "target s"], summary))


def _dvfs_variants(probs: list[CycleProblem], repeats: int) -> list[list[Any]]:
    site = probs[0].site
    prep = []
    for p in probs:
        c0 = time.perf_counter()
        t = dvfs_tables(p, SUPPLY_C)
        lo, hi = it_power_range_w(p, t)
        line = facility_line(site, SUPPLY_C, p.ambient_c, lo, hi)
        t_tab = time.perf_counter() - c0
        c0 = time.perf_counter()
        g = greedy_dvfs(p, t, line)
        t_greedy = time.perf_counter() - c0
        prep.append((p, t, line, g, t_tab, t_greedy))
    results: dict[str, dict[str, list[float]]] = {}
    plans: dict[str, list[float]] = {}
    statuses: dict[str, set[str]] = {}

    def record(name: str, i: int, wall: float, highs: float, build: float, level: Any, awake: Any, status: str) -> None:
        r = results.setdefault(name, {"wall": [], "highs": [], "build": []})
        r["wall"].append(wall)
        r["highs"].append(highs)
        r["build"].append(build)
        p, t, _line, _g, _a, _b = prep[i]
        obj = assess_dvfs(p, level, awake, SUPPLY_C, t).objective_per_h if level is not None else float("nan")
        plans.setdefault(name, []).append(obj)
        statuses.setdefault(name, set()).add(status)

    solvers: dict[str, tuple[Callable[[], Any], float]] = {
        "Pyomo, rebuilt every cycle": (lambda: DvfsSolver(persistent=False), GAP),
        "Pyomo persistent (mutable params)": (lambda: DvfsSolver(persistent=True), GAP),
        "Pyomo persistent, gap 1e-4": (lambda: DvfsSolver(persistent=True), 1e-4),
        "Pyomo persistent + greedy warm start": (lambda: DvfsSolver(persistent=True, warm_start=True), GAP),
        "decomposed (chunks of 1,024 cards), persistent": (lambda: DecomposedDvfsSolver(1024, persistent=True), GAP),
        "decomposed (chunks of 512 cards), persistent": (lambda: DecomposedDvfsSolver(512, persistent=True), GAP),
    }
    firsts: dict[str, list[float]] = {}
    for name, (make, gap) in solvers.items():
        for rep in range(repeats):  # repeats re-measure the first solve with a fresh solver
            solver = make()
            for i, (p, t, line, g, _a, _b) in enumerate(prep if rep == 0 else prep[:1]):
                c0 = time.perf_counter()
                info, level, awake = solver.solve(p, t, line, LIMIT_S, gap, (g.job_level, g.rack_awake), g)
                wall = time.perf_counter() - c0
                if i == 0:
                    firsts.setdefault(name, []).append(wall)
                if rep == 0:
                    build = getattr(solver, "last_build_s", float("nan"))
                    record(name, i, wall, info.highs_time_s, build, level, awake, info.status.value)
    for rep in range(repeats):
        for i, (p, t, line, _g, _a, _b) in enumerate(prep if rep == 0 else prep[:1]):
            c0 = time.perf_counter()
            mat = dvfs_matrix(p, t, line)
            t_mat = time.perf_counter() - c0
            info, sol = solve_matrix_highspy(mat, LIMIT_S, GAP)
            wall = time.perf_counter() - c0
            if i == 0:
                firsts.setdefault("highspy direct (same matrix)", []).append(wall)
            if rep == 0:
                level = awake = None
                if sol is not None:
                    x = sol[: mat.n_x].reshape(t.n_jobs, t.n_levels)
                    level = np.argmax(x, axis=1).astype(np.int64)
                    awake = np.zeros(t.n_racks, dtype=np.int64)
                    awake[mat.idle_racks] = np.round(sol[mat.n_x : mat.n_x + mat.idle_racks.size]).astype(np.int64)
                record(
                    "highspy direct (same matrix)", i, wall, info.highs_time_s, t_mat, level, awake, info.status.value
                )
    for i, (_p, _t, _line, g, t_tab, t_greedy) in enumerate(prep):
        record("greedy (tables + heuristic)", i, t_tab + t_greedy, 0.0, t_tab, g.job_level, g.rack_awake, "fallback")
        if i == 0:
            firsts["greedy (tables + heuristic)"] = [t_tab + t_greedy]
    # quality: loss above the best plan of each cycle
    best = [max(plans[k][i] for k in plans) for i in range(len(prep))]
    vmax = [float(t.job_value.max(axis=1, initial=0.0).sum()) for (_p, t, *_rest) in prep]
    rows = []
    for name, r in results.items():
        gaps = [100.0 * (best[i] - plans[name][i]) / max(vmax[i] - best[i], 1e-9) for i in range(len(prep))]
        gaps_obj = [100.0 * (best[i] - plans[name][i]) / abs(best[i]) for i in range(len(prep))]
        rows.append(
            [
                name,
                med(firsts[name]),
                med(r["wall"][1:]),
                med(r["highs"][1:]),
                med(r["build"][1:]),
                f"{med(gaps):.3f} / {max(gaps):.3f}",
                f"{max(gaps_obj):.4f}",
                ",".join(sorted(statuses[name])),
            ]
        )
    return rows


# --------------------------------------------------------------------------------------------
# Set-point
# --------------------------------------------------------------------------------------------


def bench_setpoint(sizes: list[int], repeats: int) -> None:
    print("\n## Choosing the coolant set-point (6 options, mixed jobs, ambient 28 deg C)\n")
    rows = []
    for n in sizes:
        site = site_of(n)
        p = dataclasses.replace(cycles(site, "mixed", 1)[0], ambient_c=28.0)
        res: dict[str, tuple[list[float], float, float]] = {}
        for name, fn in (
            (
                "enumeration (MILP per option)",
                lambda p=p: CyclePlanner().plan(p, time_limit_s=LIMIT_S, mip_rel_gap=GAP),
            ),
            (
                "screening: greedy at all, MILP at best 2",
                lambda p=p: CyclePlanner().plan(p, time_limit_s=LIMIT_S, mip_rel_gap=GAP, refine_top=2),
            ),
        ):
            ts = []
            for _ in range(repeats):
                c0 = time.perf_counter()
                cp = fn()
                ts.append(time.perf_counter() - c0)
            res[name] = (ts, cp.supply_temp_c, cp.objective_per_h or float("nan"))
        if n <= 2048:
            ts = []
            for _ in range(repeats):
                c0 = time.perf_counter()
                _st, plan, sp, _dt = solve_joint_setpoint(p, LIMIT_S, GAP)
                ts.append(time.perf_counter() - c0)
            res["one joint MILP (binary per set-point)"] = (
                ts,
                sp.supply_temp_c,
                plan.objective_per_h if plan is not None else float("nan"),
            )
        best = max(v[2] for v in res.values())
        for name, (ts, s, obj) in res.items():
            rows.append([f"{n:,}", name, med(ts), f"{s:g}", obj, f"{best - obj:.4f}"])
    print(
        table(["cards", "method", "wall s (first solve, fresh)", "chosen deg C", "objective /h", "below best /h"], rows)
    )


# --------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------


def naive_placement(pp: PlacementProblem, time_limit_s: float) -> tuple[str, int, float]:
    """BASELINES' naive model: a binary per (job, rack), an integer count per (job, rack), a binary
    per (job, supernode); all jobs in one MILP."""
    import pyomo.environ as pyo
    from pyomo.contrib.solver.solvers.highs import Highs

    site = pp.site
    free_r = np.bincount(site.card_rack()[pp.free], minlength=site.n_racks)
    sn_of = site.rack_supernode()
    jobs = range(len(pp.queue))
    m = pyo.ConcreteModel()
    m.J = pyo.Set(initialize=list(jobs))
    m.R = pyo.RangeSet(0, site.n_racks - 1)
    m.N = pyo.RangeSet(0, site.supernodes - 1)
    m.y = pyo.Var(m.J, m.R, domain=pyo.Binary)
    m.z = pyo.Var(m.J, m.N, domain=pyo.Binary)
    m.c = pyo.Var(m.J, m.R, domain=pyo.NonNegativeIntegers, bounds=lambda m, j, r: (0, int(free_r[r])))
    m.one_sn = pyo.Constraint(m.J, rule=lambda m, j: sum(m.z[j, n] for n in m.N) <= 1)
    m.in_sn = pyo.Constraint(m.J, m.R, rule=lambda m, j, r: m.y[j, r] <= m.z[j, int(sn_of[r])])
    m.cnt = pyo.Constraint(m.J, m.R, rule=lambda m, j, r: m.c[j, r] <= int(free_r[r]) * m.y[j, r])
    m.all = pyo.Constraint(
        m.J, rule=lambda m, j: sum(m.c[j, r] for r in m.R) == pp.queue[j].spec.n_cards * sum(m.z[j, n] for n in m.N)
    )
    m.cap = pyo.Constraint(m.R, rule=lambda m, r: sum(m.c[j, r] for j in m.J) <= int(free_r[r]))
    m.obj = pyo.Objective(
        expr=sum(1000.0 * pp.queue[j].spec.n_cards * m.z[j, n] for j in m.J for n in m.N)
        - sum(m.y[j, r] for j in m.J for r in m.R),
        sense=pyo.maximize,
    )
    info = highs_solve(Highs(), m, time_limit_s, 1e-3)
    placed = 0
    if info.objective is not None:
        placed = sum(pp.queue[j].spec.n_cards for j in jobs if sum((pyo.value(m.z[j, n]) or 0.0) for n in m.N) > 0.5)
    return info.status.value, placed, info.wall_time_s


def bench_placement(sizes: list[int], repeats: int) -> None:
    print("\n## Placement: 6 queued jobs (8-256 cards) per supernode onto a site 30% busy\n")
    rows = []
    for n in sizes:
        site = site_of(n)
        wl = synthetic_workload(site, seed=5, allocation=0.3, queue_jobs=6 * site.supernodes)
        p = make_problem(site, jobs=wl.jobs, job_cards=wl.job_cards, job_phase=wl.job_phase, queue=wl.queue)
        pp = make_placement_problem(p, [QueuedJob(q) for q in wl.queue])
        asked = sum(q.n_cards for q in wl.queue)
        for name, fn in (
            ("greedy", lambda pp=pp: greedy_placement(pp)),
            ("decomposed MILP (supernode knapsack + windows)", lambda pp=pp: milp_placement(pp, time_limit_s=10.0)),
        ):
            ts, plan = [], None
            for _ in range(repeats):
                c0 = time.perf_counter()
                plan = fn()
                ts.append(time.perf_counter() - c0)
            assert plan is not None
            placed = sum(int(c.size) for c in plan.cards.values())
            racks = sum(len(r) for r in plan.racks.values())
            rows.append([f"{n:,}", name, med(ts), f"{placed}/{asked}", racks, plan.status])
        c0 = time.perf_counter()
        status, placed, _wall = naive_placement(pp, 10.0)
        rows.append(
            [f"{n:,}", "naive job x rack MILP (limit 10 s)", time.perf_counter() - c0, f"{placed}/{asked}", "-", status]
        )
    print(table(["cards", "method", "wall s", "cards placed", "racks used", "status"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,2048,8192")
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mixes", default="mixed,small")
    ap.add_argument("--sections", default="dvfs,setpoint,placement")
    ap.add_argument(
        "--pyomo-capture",
        action="store_true",
        help="leave on pyomo's capture of stdout/stderr around each HiGHS call (how this benchmark ran "
        "until 2026-12-02; the agent and racktwin evaluate switch it off: agent.solver_output)",
    )
    a = ap.parse_args()
    if not a.pyomo_capture:
        isolate_solver_output()
    sizes = [int(s) for s in a.sizes.split(",")]
    sections = a.sections.split(",")
    print("# racktwin models benchmark\n")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; Python {platform.python_version()}; command: python3 benchmarks/bench_models.py "
        + " ".join(sys.argv[1:])
    )
    if "dvfs" in sections:
        bench_dvfs(sizes, a.cycles, a.mixes.split(","), a.repeats)
    if "setpoint" in sections:
        bench_setpoint(sizes, a.repeats)
    if "placement" in sections:
        bench_placement(sizes, a.repeats)


if __name__ == "__main__":
    main()
