"""``racktwin optimize SCENARIO.toml``: offline placement, DVFS / low-power idle, set-point and pumps.

Reads a scenario (format in docs/models.md and the comments of examples/scenario-*.toml), places
the queued jobs, decides which hosts no job needs go off, keeping a reserve on for arriving jobs and
the hosts that hold the ready reserve of awake idle cards (``agent.hosts``; ``[solver]
choose_host_power``, on sites whose hosts can be powered off), plans DVFS levels, idle states and
the coolant set-point with the models for the site with those hosts off (``CycleProblem.host_off``:
the caps and the explanation of an infeasible run count what they save), then gives each rack
loop's pump the slowest speed the plan allows (``agent.pumps``, as the agent does; ``[solver]
choose_pump_speed``), judges the plan with the twin (``twin.steady.site_steady_state``)
against the all-cards-at-top-clock, full-pump-speed baseline and the greedy plan, and writes
``plan.json``, ``racks.csv`` and ``report.html`` (plots embedded as PNG) to ``--out`` (default
``./out/<scenario name>``). ``--json`` prints a summary object. Each file is written whole or not at
all; a Ctrl-C or SIGTERM ends the command with exit status 130 and one line saying which it wrote
(:class:`agent.commands.common.WrittenFiles`), a write that fails (a full disk) with exit status 2 and
such a line, after the summary on stdout.

The modules: ``agent.commands.optimize_scenario`` (the scenario file and :func:`load_scenario`),
``agent.commands.optimize_hosts`` (the hosts off), ``agent.commands.optimize_judge`` (the twin's
judgement of a plan and the baseline) and ``agent.commands.optimize_outputs`` (plan.json, racks.csv,
report.html, the ``--json`` summary and the closing line); this one has the options and the run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from agent.commands.common import (
    Interrupted,
    UserError,
    WrittenFiles,
    folder_name,
    path_arg,
    prepare_output_dir,
    print_json,
    sigterm_interrupts,
)
from agent.commands.optimize_hosts import hosts_off
from agent.commands.optimize_judge import baseline, judge
from agent.commands.optimize_outputs import json_summary, summary_line, write_plan_json, write_racks_csv, write_report
from agent.commands.optimize_scenario import load_scenario
from twin.workload import Phase

#: what each exit status of ``racktwin optimize`` means, as its ``--help`` and the README (Command line) say it
EXIT_STATUSES = (
    "Exit status 0 with a plan; 1 when no plan meets the limits (the files are still written, why on "
    "stderr); 2 for a bad scenario or option (one line naming the file and the field), or a file it cannot "
    "write (the summary is printed all the same, then one line says which files it wrote); 130 when stopped by "
    "Ctrl-C or SIGTERM (one line says which files it wrote: none is left half-written, one not yet written is "
    "left as it was); 141 when the reader of its output went away before all of it was written (`| head`; the "
    "files are written)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = (
        "Offline plan for a snapshot scenario (the site, running jobs, the queue, ambient, prices): placements, "
        "hosts off, DVFS levels and low-power idle, pump speeds and the coolant set-point under every rack's "
        "limit, judged by the twin against a baseline (every card at its top clock, every host on, pumps at full "
        "speed); one summary line (or --json) on "
        "stdout, progress on stderr, plan.json, racks.csv and report.html in --out."
    )
    parser.epilog = f"{EXIT_STATUSES} docs/models.md"
    parser.add_argument(
        "scenario", type=path_arg, metavar="SCENARIO.toml", help="scenario TOML file (see examples/scenario-*.toml)"
    )
    parser.add_argument("--out", type=path_arg, metavar="DIR", help="output folder (default: ./out/<scenario name>)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="S",
        help="solver time limit, 0 < S <= 3600 seconds, for the DVFS + set-point cycle and for placement (default: the "
        "scenario's [solver] time_limit_s, 2 unless set)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines on stderr (warnings and why a plan is infeasible still print)",
    )


def _progress(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(f"racktwin optimize: {msg}", file=sys.stderr, flush=True)


def _warn(msg: str) -> None:
    print(f"racktwin optimize: warning: {msg}", file=sys.stderr, flush=True)


#: what ``racktwin optimize`` writes to ``--out``, in this order, each whole or not at all
#: (``write_text_replacing``)
OUTPUT_FILES = ("plan.json", "racks.csv", "report.html")


def run(args: argparse.Namespace, command: str) -> int:
    written = WrittenFiles(OUTPUT_FILES)
    with sigterm_interrupts():  # as Ctrl-C: exit status 130 with a line saying what was written
        try:
            return _run(args, written)
        except KeyboardInterrupt:
            raise Interrupted(written.left()) from None


def _run(args: argparse.Namespace, written: WrittenFiles) -> int:
    from models.placement import QueuedJob, make_placement_problem, place_jobs
    from models.plans import SolveStatus
    from models.problem import Margins, Prices, ProblemError, make_problem
    from models.solve import greedy_cycle, plan_cycle

    t_all = time.perf_counter()
    sc = load_scenario(args.scenario)
    sf = sc.file
    site = sc.site
    time_limit = float(args.time_limit) if args.time_limit is not None else sf.solver.time_limit_s
    if not (0 < time_limit <= 3600):  # as the scenario's [solver] time_limit_s
        raise UserError(f"--time-limit must be within (0, 3600] seconds, got {args.time_limit:g}")
    out_dir = Path(args.out) if args.out else Path("out") / folder_name(sc.name)
    written.out_dir = out_dir
    prepare_output_dir(out_dir, OUTPUT_FILES)
    prices = Prices(sf.prices.card_hour_value, sf.prices.energy_price_per_kwh, sf.prices.pue_penalty_per_kwh)
    margins = Margins(sf.margins.rack_margin_w, sf.margins.die_margin_k)
    supply = sf.supply_temp_c if sf.supply_temp_c is not None else site.facility.supply_temp_c
    common: dict[str, Any] = {
        "failed": sc.failed,
        "ambient_c": sf.ambient_c,
        "supply_temp_c": supply,
        "margins": margins,
        "prices": prices,
    }
    _progress(args, f"{sc.name}: {site.n_cards} cards, {len(sc.jobs)} running jobs, {len(sc.queue)} queued")
    for job_id, how in sc.moved.items():
        _progress(args, f"{job_id}: {how}")
    for job_id, why in sc.dropped.items():  # a job lost from the plan is said even with --quiet
        _warn(f"{args.scenario}: {job_id}: {why}")
    try:
        p0 = make_problem(
            site,
            jobs=sc.jobs,
            job_cards=sc.job_cards,
            job_phase=sc.job_phase,
            queue=[q.spec() for q in sc.queue],
            **common,
        )
        # ---- placement
        t0 = time.perf_counter()
        placement = None
        jobs, cards, phases = list(sc.jobs), list(sc.job_cards), list(sc.job_phase)
        unplaced: dict[str, str] = {}
        if sc.queue:
            _progress(args, f"placing {len(sc.queue)} queued jobs ({sf.solver.placement})")
            pp = make_placement_problem(p0, [QueuedJob(q.spec(), q.max_racks) for q in sc.queue], supply)
            placement = place_jobs(pp, method=sf.solver.placement, time_limit_s=time_limit)
            for q in sc.queue:
                if q.id in placement.cards:
                    jobs.append(q.spec())
                    cards.append(placement.cards[q.id])
                    phases.append(Phase.COMPUTE)
            unplaced = dict(placement.unplaced)
        t_place = time.perf_counter() - t0
        still_queued = [q.spec() for q in sc.queue if q.id in unplaced]
        unplaced.update(sc.dropped)  # plan.json: every job not in the plan, with the reason
        mine: dict[str, Any] = {
            "jobs": jobs,
            "job_cards": cards,
            "job_phase": phases,
            "queue": still_queued,
            "ready_reserve_cards": sf.ready_reserve_cards,
        }
        host_off = hosts_off(make_problem(site, **mine, **common), sf.solver)
        # the plan is made for the site with these hosts off: the caps count what they save
        p1 = make_problem(site, **mine, **common, host_off=host_off)
    except ProblemError as exc:
        raise UserError(f"{args.scenario}: {exc}") from None
    if host_off is not None:
        _progress(args, f"hosts: {int(host_off.sum())} of {site.n_hosts} off")
    n_opt = len(p1.supply_options_c) if sf.solver.choose_setpoint else 1
    _progress(args, f"planning DVFS + idle for {len(jobs)} jobs at {n_opt} set-point(s), limit {time_limit:g} s")
    plan = plan_cycle(
        p1, time_limit_s=time_limit, mip_rel_gap=sf.solver.mip_rel_gap, choose_setpoint=sf.solver.choose_setpoint
    )
    _progress(
        args,
        f"plan: {plan.status.value} ({plan.source}) in {plan.solve_time_s:.3f} s, supply {plan.supply_temp_c:g} deg C",
    )
    # why there is no plan, or why a set-point kept the greedy plan: not progress, so even with --quiet
    kind = "infeasible" if plan.status is SolveStatus.INFEASIBLE else "fallback"
    for line in plan.explanation.splitlines():
        print(f"racktwin optimize: {kind}: {line}", file=sys.stderr, flush=True)
    greedy = greedy_cycle(p1, choose_setpoint=sf.solver.choose_setpoint)
    judged = judge(p1, plan.dvfs, plan.supply_temp_c, sf.solver) if plan.dvfs is not None else None
    greedy_j = judge(p1, greedy.dvfs, greedy.supply_temp_c, sf.solver) if greedy.dvfs is not None else None
    if judged is not None:
        speeds = ", ".join(f"{100 * x:.0f}" for x in judged["pump_speed_frac"])
        _progress(args, f"pumps at {speeds}% of full speed")
    base = baseline(p1, supply)
    summary = json_summary(site, p1, plan, judged, base)
    _progress(args, f"writing {out_dir}/plan.json, racks.csv, report.html")
    failed: UserError | None = None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_plan_json(out_dir / "plan.json", sc, p1, plan, placement, unplaced, judged, base, t_place)
        written.wrote("plan.json")
        write_racks_csv(out_dir / "racks.csv", p1, judged, greedy_j, base)
        written.wrote("racks.csv")
        write_report(out_dir / "report.html", sc, p1, plan, judged, greedy, greedy_j, base, t_place)
        written.wrote("report.html")
    except OSError as exc:  # the plan still goes to stdout, then one line saying which files were written
        failed = written.failed(exc)
    if failed is None:
        _progress(args, f"done in {time.perf_counter() - t_all:.1f} s")
    if args.json:
        print_json(summary)
    elif judged is not None:
        print(summary_line(sc.name, site, plan, judged, base, out_dir))
    if failed is not None:
        raise failed
    return 0 if plan.status.has_plan else 1
