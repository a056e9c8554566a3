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
``./out/<scenario name>``). ``--json`` prints a summary object.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.commands.common import UserError, folder_name, path_arg, prepare_output_dir, print_json
from agent.report import figures_html, page, png_base64, pyplot
from twin.spec import SiteSpec, SpecError, check_file_kind, load_site
from twin.tables import choices, decode_table, read_toml, rng
from twin.workload import JobSpec, Phase

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_PHASES = {
    "compute": Phase.COMPUTE,
    "communication": Phase.COMMUNICATION,
    "checkpoint": Phase.CHECKPOINT,
    "waiting": Phase.WAITING,
}


# --------------------------------------------------------------------------------------------
# Scenario file
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobEntry:
    """A running job (``[[jobs]]``: give ``cards`` or ``racks``) or a queued one (``[[queue]]``)."""

    id: str
    n_cards: int = field(metadata=rng(1, 1_000_000))
    compute_share: float = field(default=0.9, metadata=rng(0.0, 1.0))
    step_time_s: float = field(default=1.0, metadata=rng(0.0, 1e6, lo_open=True))
    work_steps: float = field(default=100_000.0, metadata=rng(0.0, 1e12, lo_open=True))
    priority: float = field(default=1.0, metadata=rng(0.0, 1e6, lo_open=True))
    noncompute_utilization: float = field(default=0.2, metadata=rng(0.0, 1.0))
    min_throughput_frac: float = field(default=0.0, metadata=rng(0.0, 1.0))
    phase: str = field(default="compute", metadata=choices(*_PHASES))
    cards: tuple[int, ...] | None = field(default=None, metadata=rng(0, None))
    racks: tuple[int, ...] | None = field(default=None, metadata=rng(0, None))
    max_racks: int | None = field(default=None, metadata=rng(1, 1_000))

    def spec(self) -> JobSpec:
        return JobSpec(
            job_id=self.id,
            n_cards=self.n_cards,
            work_steps=self.work_steps,
            step_time_s=self.step_time_s,
            compute_share=self.compute_share,
            priority=self.priority,
            noncompute_utilization=self.noncompute_utilization,
            min_throughput_frac=self.min_throughput_frac,
        )


@dataclass(frozen=True)
class GenerateSection:
    """``[generate]``: a seeded workload instead of (or besides) listed jobs. ``source = "synthetic"``
    uses the ranges below (models.synthetic); ``"acme"`` draws jobs from twin.workload.generate_jobs
    (AcmeTrace-fitted sizes, shares, priorities, SLOs) and uses only ``seed``, ``allocation`` and
    ``queue_jobs``."""

    source: str = field(default="synthetic", metadata=choices("synthetic", "acme"))
    seed: int = field(default=0, metadata=rng(0, 2**31))
    allocation: float = field(default=0.65, metadata=rng(0.0, 1.0))
    sizes: tuple[int, ...] = field(default=(8, 16, 32, 64, 128, 256), metadata=rng(1, 1_000_000))
    compute_share_min: float = field(default=0.85, metadata=rng(0.0, 1.0))
    compute_share_max: float = field(default=0.97, metadata=rng(0.0, 1.0))
    noncompute_utilization: float = field(default=0.3, metadata=rng(0.0, 1.0))
    phase_weights: tuple[float, ...] = field(default=(0.85, 0.07, 0.05, 0.03), metadata=rng(0.0, None))
    priorities: tuple[float, ...] = field(default=(1.0, 2.0), metadata=rng(0.0, None, lo_open=True))
    slo_fraction: float = field(default=0.2, metadata=rng(0.0, 1.0))
    slo_min_throughput: float = field(default=0.85, metadata=rng(0.0, 1.0))
    queue_jobs: int = field(default=0, metadata=rng(0, 10_000))


@dataclass(frozen=True)
class PricesSection:
    card_hour_value: float = field(default=2.0, metadata=rng(0.0, 1e6))
    energy_price_per_kwh: float = field(default=0.10, metadata=rng(0.0, 1e3))
    pue_penalty_per_kwh: float = field(default=0.20, metadata=rng(0.0, 1e3))


@dataclass(frozen=True)
class MarginsSection:
    rack_margin_w: float = field(default=1000.0, metadata=rng(0.0, 1e6))
    die_margin_k: float = field(default=2.0, metadata=rng(0.0, 50.0))


@dataclass(frozen=True)
class SolverSection:
    time_limit_s: float = field(default=2.0, metadata=rng(0.0, 3600.0, lo_open=True))
    mip_rel_gap: float = field(default=1e-4, metadata=rng(0.0, 0.5))
    choose_setpoint: bool = True
    # give each rack loop's pump the slowest speed the plan allows (agent.pumps), as the agent does
    choose_pump_speed: bool = True
    pump_speed_steps: int = field(default=9, metadata=rng(2, 100))
    placement: str = field(default="auto", metadata=choices("auto", "milp", "greedy"))
    # power off the hosts none of whose cards runs a job, keeping host_reserve_per_supernode on in
    # each supernode for arriving jobs (agent.hosts, as the agent does); only on sites whose hosts
    # can be powered off (rack.hosts_per_rack > 0)
    choose_host_power: bool = True
    host_reserve_per_supernode: int = field(default=2, metadata=rng(0, 100_000))


@dataclass(frozen=True)
class ScenarioFile:
    """The top level of a scenario TOML file (lists of tables are decoded one by one)."""

    name: str
    site: str
    ambient_c: float = field(metadata=rng(-40.0, 55.0))
    supply_temp_c: float | None = field(default=None, metadata=rng(5.0, 60.0))
    ready_reserve_cards: int | None = field(default=None, metadata=rng(0, 1_000_000))
    failed_cards: tuple[int, ...] | None = field(default=None, metadata=rng(0, None))
    prices: PricesSection = field(default_factory=PricesSection)
    margins: MarginsSection = field(default_factory=MarginsSection)
    solver: SolverSection = field(default_factory=SolverSection)
    generate: GenerateSection | None = None


@dataclass(frozen=True, eq=False)
class Scenario:
    name: str
    path: Path
    site: SiteSpec
    file: ScenarioFile
    jobs: tuple[JobSpec, ...]
    job_cards: tuple[IntArray, ...]
    job_phase: tuple[Phase, ...]
    queue: tuple[JobEntry, ...]
    failed: npt.NDArray[np.bool_]
    # generated jobs ([generate]) a failed card or a listed job sat in: run around it (id -> how) or
    # dropped where their supernode had too few free cards (id -> why)
    moved: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)


@dataclass
class _Running:
    """The running jobs of a scenario as they are read: each job, its cards and phase, and which cards
    are taken (by a job or failed)."""

    used: npt.NDArray[np.bool_]
    jobs: list[JobSpec] = field(default_factory=list)
    cards: list[IntArray] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)

    def add(self, spec: JobSpec, cards: IntArray, phase: Phase) -> None:
        self.used[cards] = True
        self.jobs.append(spec)
        self.cards.append(cards)
        self.phases.append(phase)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every problem is a :class:`UserError` naming file and field."""
    p = Path(path)
    src = str(path)
    sf, entries, site = _read_scenario_file(p, src)
    failed = _failed_cards(sf, site, src)
    if sf.supply_temp_c is not None and sf.supply_temp_c not in site.facility.supply_temp_options_c:
        raise UserError(
            f"{src}: supply_temp_c: must be one of the site's supply_temp_options_c "
            f"{list(site.facility.supply_temp_options_c)}, got {sf.supply_temp_c:g}"
        )
    running = _Running(used=failed.copy())
    for i, e in enumerate(entries["jobs"]):
        running.add(*_listed_running_job(e, i, site, running.used, src))
    queue = list(entries["queue"])
    for i, e in enumerate(queue):
        try:
            e.spec()
        except ValueError as exc:
            raise UserError(f"{src}: queue[{i}]: {exc}") from None
        if e.cards is not None or e.racks is not None:
            raise UserError(f"{src}: queue[{i}] ({e.id}): queued jobs are placed by the optimizer; remove cards/racks")
    moved: dict[str, str] = {}
    dropped: dict[str, str] = {}
    if sf.generate is not None:
        queue += _add_generated(sf.generate, site, failed, running, moved, dropped, src)
    ids = [j.job_id for j in running.jobs] + [q.id for q in queue]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise UserError(f"{src}: job id {dup[0]!r} is used twice (jobs and queue ids must be unique)")
    return Scenario(
        sf.name,
        p,
        site,
        sf,
        tuple(running.jobs),
        tuple(running.cards),
        tuple(running.phases),
        tuple(queue),
        failed,
        moved,
        dropped,
    )


def _read_scenario_file(p: Path, src: str) -> tuple[ScenarioFile, dict[str, list[JobEntry]], SiteSpec]:
    """The file's tables, its ``[[jobs]]`` and ``[[queue]]`` entries and the site spec it names."""
    try:
        data = read_toml(p)
        check_file_kind(data, "optimize scenario", src)
        lists = {k: data.pop(k) for k in ("jobs", "queue") if k in data}
        sf = decode_table(ScenarioFile, data, src, other_keys=("jobs", "queue"))
        entries: dict[str, list[JobEntry]] = {"jobs": [], "queue": []}
        for key, raw in lists.items():
            if not isinstance(raw, list):
                raise SpecError(src, key, f"expected an array of tables ([[{key}]]), got {type(raw).__name__}")
            for i, item in enumerate(raw):
                entries[key].append(decode_table(JobEntry, item, src, f"{key}[{i}]"))
        site_path = (p.parent / sf.site).resolve()
        try:
            site = load_site(site_path)
        except SpecError as exc:
            raise SpecError(src, "site", f"cannot load site spec {sf.site!r}: {exc}") from None
    except SpecError as exc:
        raise UserError(str(exc)) from None
    return sf, entries, site


def _failed_cards(sf: ScenarioFile, site: SiteSpec, src: str) -> npt.NDArray[np.bool_]:
    """``failed_cards`` as a mask over the site's cards."""
    n = site.n_cards
    failed = np.zeros(n, dtype=bool)
    for c in sf.failed_cards or ():
        if c >= n:
            raise UserError(f"{src}: failed_cards: card {c} does not exist (site has cards 0..{n - 1})")
        if failed[c]:
            raise UserError(f"{src}: failed_cards: card {c} is listed twice")
        failed[c] = True
    return failed


def _listed_running_job(
    e: JobEntry, i: int, site: SiteSpec, used: npt.NDArray[np.bool_], src: str
) -> tuple[JobSpec, IntArray, Phase]:
    """A ``[[jobs]]`` entry: its job, its cards (listed, or the first free ones of its racks; none
    already ``used``) and its phase."""
    n, cpr = site.n_cards, site.cards_per_rack
    where = f"{src}: jobs[{i}] ({e.id})"
    try:
        spec = e.spec()
    except ValueError as exc:
        raise UserError(f"{src}: jobs[{i}]: {exc}") from None
    if e.cards is not None and e.racks is not None:
        raise UserError(f"{where}: give either cards or racks, not both")
    if e.cards is not None:
        cards = np.asarray(e.cards, dtype=np.int64)
        if cards.size != e.n_cards:
            raise UserError(f"{where}: cards: {cards.size} cards listed but n_cards = {e.n_cards}")
        if np.any(cards >= n):
            raise UserError(f"{where}: cards: card {int(cards[cards >= n][0])} does not exist (0..{n - 1})")
    elif e.racks is not None:
        if any(r >= site.n_racks for r in e.racks):
            raise UserError(f"{where}: racks: rack index out of range (site has racks 0..{site.n_racks - 1})")
        twice = sorted({r for r in e.racks if e.racks.count(r) > 1})
        if twice:
            raise UserError(f"{where}: racks: rack {twice[0]} is listed twice")
        pool = np.concatenate([np.arange(r * cpr, (r + 1) * cpr) for r in e.racks])
        pool = pool[~used[pool]]
        if pool.size < e.n_cards:
            raise UserError(f"{where}: racks {list(e.racks)} have only {pool.size} free cards for {e.n_cards}")
        cards = pool[: e.n_cards]
    else:
        raise UserError(f"{where}: a running job needs cards = [...] or racks = [...] (or put it in [[queue]])")
    if np.any(used[cards]):
        raise UserError(f"{where}: card {int(cards[used[cards]][0])} is already taken (another job or failed)")
    return spec, cards, _PHASES[e.phase]


def _add_generated(
    g: GenerateSection,
    site: SiteSpec,
    failed: npt.NDArray[np.bool_],
    running: _Running,
    moved: dict[str, str],
    dropped: dict[str, str],
    src: str,
) -> list[JobEntry]:
    """The ``[generate]`` workload's running jobs added to ``running`` (around what is taken: noted in
    ``moved``, or ``dropped``); returns its queue."""
    from models.synthetic import acme_workload, synthetic_workload

    n = site.n_cards
    if len(g.phase_weights) != 4:
        raise UserError(
            f"{src}: generate.phase_weights: need 4 weights (compute, communication, checkpoint, waiting), "
            f"got {len(g.phase_weights)}"
        )
    if sum(g.phase_weights) <= 0:
        raise UserError(f"{src}: generate.phase_weights: the 4 weights must not all be 0")
    if g.sizes and max(g.sizes) > n:
        raise UserError(f"{src}: generate.sizes: {max(g.sizes)} cards is more than the site's {n}")
    if g.compute_share_min > g.compute_share_max:
        raise UserError(f"{src}: generate.compute_share_min: must be <= compute_share_max")
    wl = (
        acme_workload(site, seed=g.seed, allocation=g.allocation, queue_jobs=g.queue_jobs)
        if g.source == "acme"
        else synthetic_workload(
            site,
            seed=g.seed,
            allocation=g.allocation,
            sizes=g.sizes,
            compute_share=(g.compute_share_min, g.compute_share_max),
            noncompute_utilization=g.noncompute_utilization,
            phase_weights=g.phase_weights,
            priorities=g.priorities,
            slo_fraction=g.slo_fraction,
            slo_min_throughput=g.slo_min_throughput,
            queue_jobs=g.queue_jobs,
        )
    )
    generated = list(zip(wl.jobs, wl.job_cards, wl.job_phase, strict=True))
    # the generated jobs whose block is free keep it; those a failed card or a listed job sits in
    # then run around it, on the free cards of their block and the nearest free ones of its
    # supernode, or are dropped where the supernode has too few (reported, never silently)
    used = running.used
    clear = [not np.any(used[cards]) for _spec, cards, _ph in generated]
    for ok, (_spec, cards, _ph) in zip(clear, generated, strict=True):
        if ok:
            used[cards] = True
    listed_ids = [j.job_id for j in running.jobs]
    listed_owner = np.full(n, -1, dtype=np.int64)
    for i, cards in enumerate(running.cards):
        listed_owner[cards] = i
    for ok, (spec, cards, ph) in zip(clear, generated, strict=True):
        if not ok:
            what = _in_the_way(cards, failed, listed_owner, listed_ids)
            new_cards, sn, n_free = _around(site, used, cards)
            span = f"cards {int(cards[0])}..{int(cards[-1])}"
            if new_cards is None:
                dropped[spec.job_id] = (
                    f"generated job dropped: its {span} hold {what}, and supernode {sn} has only {n_free} "
                    f"free cards for its {spec.n_cards}"
                )
                continue
            n_own = int(np.isin(new_cards, cards).sum())
            n_near = spec.n_cards - n_own
            moved[spec.job_id] = (
                f"generated job placed around what is taken: its {span} hold {what}; it runs on the other "
                f"{n_own} and the {n_near} nearest free card{'s' if n_near != 1 else ''} of supernode {sn}"
            )
            cards = new_cards
        running.add(spec, cards, ph)
    return [
        JobEntry(
            id=q.job_id,
            n_cards=q.n_cards,
            compute_share=q.compute_share,
            step_time_s=q.step_time_s,
            work_steps=q.work_steps,
            priority=q.priority,
            noncompute_utilization=q.noncompute_utilization,
            min_throughput_frac=q.min_throughput_frac,
        )
        for q in wl.queue
    ]


def _in_the_way(cards: IntArray, failed: npt.NDArray[np.bool_], owner: IntArray, listed: list[str]) -> str:
    """What sits on a generated job's ``cards``: failed cards and listed jobs (``owner``: the index
    of the listed job on each card, -1 for none)."""
    parts = []
    bad = cards[failed[cards]]
    if bad.size:
        shown = ", ".join(str(int(c)) for c in bad[:5]) + (", ..." if bad.size > 5 else "")
        parts.append(f"failed card{'s' if bad.size > 1 else ''} {shown}")
    for j in sorted({int(o) for o in owner[cards] if o >= 0}):
        parts.append(f"listed job {listed[j]!r} ({int((owner[cards] == j).sum())} cards)")
    return " and ".join(parts)


def _around(site: SiteSpec, used: npt.NDArray[np.bool_], cards: IntArray) -> tuple[IntArray | None, int, int]:
    """Cards for a generated job whose block (``cards``, consecutive, inside one supernode) is partly
    taken: the free cards of its block and, for the rest, the free cards of its supernode nearest to
    the block (lower index first at equal distance); None when the supernode has too few free cards.
    Also the supernode and its number of free cards."""
    per_sn = site.cards_per_supernode
    sn = int(cards[0]) // per_sn
    free = np.flatnonzero(~used[sn * per_sn : (sn + 1) * per_sn]).astype(np.int64) + sn * per_sn
    if free.size < cards.size:
        return None, sn, int(free.size)
    inside = np.isin(free, cards)
    own, others = free[inside], free[~inside]
    dist = np.where(others < cards[0], cards[0] - others, others - cards[-1])
    near = others[np.lexsort((others, dist))][: cards.size - own.size]
    return np.sort(np.concatenate([own, near])), sn, int(free.size)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("scenario", type=path_arg, help="scenario TOML file (see examples/scenario-*.toml)")
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


def run(args: argparse.Namespace, command: str) -> int:
    from models.placement import QueuedJob, make_placement_problem, place_jobs
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
    prepare_output_dir(out_dir, ("plan.json", "racks.csv", "report.html"))
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
        host_off = _hosts_off(make_problem(site, **mine, **common), sf.solver)
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
    if plan.explanation:  # why there is no plan: not progress, so even with --quiet
        for line in plan.explanation.splitlines():
            print(f"racktwin optimize: infeasible: {line}", file=sys.stderr, flush=True)
    greedy = greedy_cycle(p1, choose_setpoint=sf.solver.choose_setpoint)
    judged = _judge(p1, plan.dvfs, plan.supply_temp_c, sf.solver) if plan.dvfs is not None else None
    greedy_j = _judge(p1, greedy.dvfs, greedy.supply_temp_c, sf.solver) if greedy.dvfs is not None else None
    if judged is not None:
        speeds = ", ".join(f"{100 * x:.0f}" for x in judged["pump_speed_frac"])
        _progress(args, f"pumps at {speeds}% of full speed")
    base = _baseline(p1, supply)
    summary: dict[str, Any] = {
        "status": plan.status.value,
        "solve_time_s": plan.solve_time_s,
        "racks": [
            {
                "rack": site.rack_names[r],
                "power_w": float(judged["rack_power_w"][r]) if judged else None,
                "limit_w": float(p1.rack_limit_w[r]),
                "max_die_temp_c": float(judged["rack_max_die_c"][r]) if judged else None,
                "pump_speed_frac": float(judged["pump_speed_frac"][r]) if judged else None,
            }
            for r in range(site.n_racks)
        ],
        "pue": judged["pue"] if judged else None,
        "it_power_w": judged["it_power_w"] if judged else None,
        "facility_power_w": judged["facility_power_w"] if judged else None,
        "hosts_off": int(judged["host_off"].sum()) if judged else None,
        "baseline_facility_power_w": base["facility_power_w"],
        "throughput": judged["throughput"] if judged else None,
        "baseline_throughput": base["throughput"],
    }
    _progress(args, f"writing {out_dir}/plan.json, racks.csv, report.html")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_plan_json(out_dir / "plan.json", sc, p1, plan, placement, unplaced, judged, base, t_place)
        _write_racks_csv(out_dir / "racks.csv", p1, judged, greedy_j, base)
        _write_report(out_dir / "report.html", sc, p1, plan, judged, greedy, greedy_j, base, t_place)
    except OSError as exc:
        raise UserError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    _progress(args, f"done in {time.perf_counter() - t_all:.1f} s")
    if args.json:
        print_json(summary)
    elif judged is not None:
        print(
            f"{sc.name}: {plan.status.value}, supply {plan.supply_temp_c:g} deg C, "
            f"IT {judged['it_power_w'] / 1e3:.1f} kW, "
            f"facility {judged['facility_power_w'] / 1e3:.1f} kW (baseline {base['facility_power_w'] / 1e3:.1f} kW), "
            f"PUE {judged['pue']:.3f}, throughput {judged['throughput']:.1f} (baseline {base['throughput']:.1f})"
            + (f", {int(judged['host_off'].sum())} of {site.n_hosts} hosts off" if site.hosts_managed else "")
            + f"; files in {out_dir}"
        )
    return 0 if plan.status.has_plan else 1


# --------------------------------------------------------------------------------------------
# Judging with the twin
# --------------------------------------------------------------------------------------------


def _card_utilization(p: Any, level: IntArray) -> FloatArray:
    from models.problem import phase_utilization

    u = np.zeros(p.n_cards)
    for j, job in enumerate(p.jobs):
        cards = p.card_job == j
        u[cards] = phase_utilization(job, p.job_phase[j], p.site, level[cards])
    return u


def _pump_speeds(p: Any, dvfs: Any, supply_c: float, solver: SolverSection) -> FloatArray:
    """Each rack loop's pump speed for the plan: the agent's choice (``agent.pumps``) with the
    problem's resistances and die offsets, healthy pumps now at full speed (all at full speed if
    not chosen). The hosts the problem powers off (``p.host_off``) heat their racks less: each by
    ``SiteSpec.host_off_saving_w`` (the host's saving and its cards, counted asleep by the prediction)."""
    from agent.load import site_load_of_problem
    from agent.pumps import choose_pump_speeds

    site = p.site
    if not solver.choose_pump_speed:
        return np.ones(site.n_racks)
    load = site_load_of_problem(p.jobs, p.job_phase, p.card_job, p.failed)
    extra_w = np.zeros(site.n_racks)
    if p.host_off is not None:
        off_per_rack = np.asarray(p.host_off, dtype=np.float64).reshape(site.n_racks, -1).sum(axis=1)
        extra_w = -off_per_rack * site.host_off_saving_w()
    return choose_pump_speeds(
        site,
        load,
        dvfs.card_level,
        dvfs.card_low_power | p.failed,
        np.full(site.n_cards, site.card.power_limit_w),
        np.full(site.n_cards, supply_c),
        p.r_total_k_per_w,
        p.die_offset_k,
        np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        np.ones(site.n_racks),
        p.rack_cap_w(),
        extra_w,
        p.die_limit_c,
        facility_w_per_it_w=1.0 + site.facility.ups_loss_fraction,
        steps=solver.pump_speed_steps,
    ).speed_frac


def _hosts_off(p: Any, solver: SolverSection) -> npt.NDArray[np.bool_] | None:
    """Per host: powered off for the plan, decided before planning from the busy cards (after
    placement), the ready reserve and the queue, for a problem ``p`` with every host on.

    The agent's rule for hosts idle long enough (``agent.hosts.choose_hosts_off``): every host none
    of whose cards runs a job goes off, except ``host_reserve_per_supernode`` per supernode kept on
    for arriving jobs, and none while jobs are still queued (they wait for cards). The ready reserve
    of awake idle cards must sit on hosts that are on: its cards are taken from the idle cards of
    hosts with a busy card (on anyway) first, then from whole idle hosts, in the racks with the most
    headroom first; those hosts stay on (they count toward the supernode's reserve of hosts on, and
    stay on beyond it). The other idle hosts go off in the racks with the least headroom first (a
    snapshot has no idle times to order them by). None where the site's hosts cannot be powered off
    or ``choose_host_power`` is false."""
    from agent.hosts import choose_hosts_off, host_any
    from models.explain import min_rack_power_w
    from models.problem import dvfs_tables

    site = p.site
    if not (solver.choose_host_power and site.hosts_managed):
        return None
    n_h, cph = site.n_hosts, site.cards_per_host
    busy = p.card_job >= 0
    host_busy = host_any(site, busy)
    free = p.idle_mask().reshape(n_h, cph).sum(axis=1)  # cards that can be woken, per host
    host_rack = np.arange(n_h) // site.rack.hosts_per_rack
    # each rack's headroom at its least power with every host that runs no job off
    t = dvfs_tables(p)
    idle_hosts = np.bincount(host_rack[~host_busy], minlength=site.n_racks)
    head = t.rack_cap_w - min_rack_power_w(t) + idle_hosts * site.host_off_saving_w()
    left = min(p.ready_reserve_cards, int(free.sum())) - int(free[host_busy].sum())
    keep = np.zeros(n_h, dtype=bool)  # idle hosts on for the ready reserve
    while left > 0:
        cand = np.flatnonzero(~host_busy & ~keep & (free > 0))
        h = int(cand[np.lexsort((-free[cand], -head[host_rack[cand]]))[0]])
        keep[h] = True
        left -= int(free[h])
        head[host_rack[h]] -= site.host_off_saving_w() + free[h] * t.rack_wake_w[host_rack[h]]
    none = np.zeros(n_h, dtype=bool)
    off = choose_hosts_off(
        site,
        now_s=0.0,
        # a snapshot: every idle host has been idle long enough; the "longest idle" (first off) are
        # those in the racks with the least headroom
        host_busy_last_s=head[host_rack] - float(head.max()) - 1.0,
        card_busy=busy,
        host_off_now=none,
        host_awake=keep,
        frozen_host=none,
        off_after_s=0.0,
        reserve_per_supernode=solver.host_reserve_per_supernode,
        due_cards=sum(q.n_cards for q in p.queue),
    ).host_off
    return np.asarray(off & ~keep, dtype=np.bool_)


def _judge(p: Any, dvfs: Any, supply_c: float, solver: SolverSection) -> dict[str, Any]:
    """The plan as the twin sees it: ``site_steady_state`` at the plan's levels, idle states, pump
    speeds (:func:`_pump_speeds`) and the problem's hosts off (``p.host_off``, :func:`_hosts_off`).
    ``host_saving_w``: the twin's IT power with those hosts on (their cards asleep) less with them off."""
    from twin.steady import site_steady_state

    host_off = p.host_off
    speed = _pump_speeds(p, dvfs, supply_c, solver)
    state: dict[str, Any] = {
        "level": dvfs.card_level,
        "utilization": _card_utilization(p, dvfs.card_level),
        "supply_temp_c": supply_c,
        "ambient_c": p.ambient_c,
        "low_power": dvfs.card_low_power | p.failed,
        "flow_fraction": speed,
    }
    ss = site_steady_state(p.site, **state, host_off=host_off)
    saving = 0.0
    if host_off is not None and host_off.any():
        saving = site_steady_state(p.site, **state).it_power_w - ss.it_power_w
    return {
        "host_off": np.zeros(p.site.n_hosts, dtype=bool) if host_off is None else host_off,
        "host_saving_w": saving,
        "pump_speed_frac": speed,
        "pump_power_w": ss.cooling.rack_pump_w + ss.cooling.facility_pump_w,
        "rack_power_w": ss.rack_power_w,
        "rack_max_die_c": ss.rack_max_die_temp_c,
        "card_power_w": ss.card_power_w,
        "die_c": ss.die_temp_c,
        "it_power_w": ss.it_power_w,
        "facility_power_w": ss.cooling.facility_power_w,
        "pue": ss.cooling.pue,
        "throughput": dvfs.throughput,
        "supply_c": supply_c,
    }


def _baseline(p: Any, supply_c: float) -> dict[str, Any]:
    """No agent: every card at the top clock (idle cards in active idle), the scenario's set-point,
    pumps at full speed, the cards' own firmware protection (power brake, thermal slowdown) as the only limit."""
    from twin.steady import site_steady_state

    level = np.zeros(p.n_cards, dtype=np.int64)
    ss = site_steady_state(
        p.site,
        level=level,
        utilization=_card_utilization(p, level),
        supply_temp_c=supply_c,
        ambient_c=p.ambient_c,
        low_power=p.failed,
    )
    from twin.workload import relative_throughput

    clocks = np.asarray(p.site.card.clocks_mhz)
    thr = 0.0
    for j, job in enumerate(p.jobs):
        if p.job_phase[j] == Phase.COMPUTE:
            lv = int(ss.level[p.card_job == j].max())  # the slowest card sets the pace
            thr += job.n_cards * float(relative_throughput(job.compute_share, clocks[lv] / clocks[0]))
    return {
        "host_off": np.zeros(p.site.n_hosts, dtype=bool),
        "pump_speed_frac": np.ones(p.site.n_racks),
        "pump_power_w": ss.cooling.rack_pump_w + ss.cooling.facility_pump_w,
        "rack_power_w": ss.rack_power_w,
        "rack_max_die_c": ss.rack_max_die_temp_c,
        "die_c": ss.die_temp_c,
        "it_power_w": ss.it_power_w,
        "facility_power_w": ss.cooling.facility_power_w,
        "pue": ss.cooling.pue,
        "throughput": thr,
        "supply_c": supply_c,
    }


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------


def _write_plan_json(
    path: Path,
    sc: Scenario,
    p: Any,
    plan: Any,
    placement: Any,
    unplaced: dict[str, str],
    judged: dict[str, Any] | None,
    base: dict[str, Any],
    t_place: float,
) -> None:
    site = p.site
    clocks = site.card.clocks_mhz
    card_rack = site.card_rack()
    placed = set(placement.cards) if placement is not None else set()
    dv = plan.dvfs
    jobs_out = []
    for j, job in enumerate(p.jobs):
        cards = p.job_cards(j)
        lv = int(dv.job_level[j]) if dv is not None else None
        jobs_out.append(
            {
                "id": job.job_id,
                "phase": p.job_phase[j].name.lower(),
                "placed_now": job.job_id in placed,
                "racks": sorted({int(r) for r in card_rack[cards]}),
                "cards": cards.tolist(),
                "level": lv,
                "clock_mhz": clocks[lv] if lv is not None else None,
            }
        )
    card_host_off = judged["host_off"][site.card_host()] if judged else np.zeros(site.n_cards, dtype=bool)
    cards_out = []
    for i in range(site.n_cards):
        j = int(p.card_job[i])
        if p.failed[i]:
            state = "failed"
        elif j >= 0:
            state = "busy"
        elif card_host_off[i]:
            state = "host_off"
        elif dv is not None and dv.card_low_power[i]:
            state = "low_power"
        else:
            state = "awake"
        cards_out.append(
            {
                "card": i,
                "rack": int(card_rack[i]),
                "job": p.jobs[j].job_id if j >= 0 else None,
                "state": state,
                "level": int(dv.card_level[i]) if dv is not None else None,
                "power_w": float(judged["card_power_w"][i]) if judged else None,
                "die_temp_c": float(judged["die_c"][i]) if judged else None,
            }
        )
    doc = {
        "scenario": sc.name,
        "status": plan.status.value,
        "source": plan.source,
        "explanation": plan.explanation,
        "solve_time_s": plan.solve_time_s,
        "placement_time_s": t_place,
        "mip_gap": plan.mip_gap,
        "supply_temp_c": plan.supply_temp_c,
        "setpoint_options": [
            {
                "supply_temp_c": o.supply_temp_c,
                "status": o.status.value,
                "objective_per_h": o.objective_per_h,
                "facility_power_w": o.facility_power_w,
                "it_power_w": o.it_power_w,
            }
            for o in plan.setpoint.options
        ],
        "objective_per_h": plan.objective_per_h,
        "it_power_w": judged["it_power_w"] if judged else None,
        "facility_power_w": judged["facility_power_w"] if judged else None,
        "pue": judged["pue"] if judged else None,
        "pue_target": site.pue_target,
        # the facility's power above pue_target x IT at the judged plan (the soft constraint's slack)
        "pue_excess_w": max(0.0, judged["facility_power_w"] - site.pue_target * judged["it_power_w"])
        if judged
        else None,
        "pump_speed_frac": [float(x) for x in judged["pump_speed_frac"]] if judged else None,
        "pump_power_w": judged["pump_power_w"] if judged else None,
        "hosts_off": np.flatnonzero(judged["host_off"]).tolist() if judged else None,
        "host_saving_w": judged["host_saving_w"] if judged else None,
        "baseline": {k: base[k] for k in ("it_power_w", "facility_power_w", "pue", "throughput", "pump_power_w")},
        "unplaced": unplaced,
        "jobs": jobs_out,
        "cards": cards_out,
    }
    from agent.commands.common import _clean

    path.write_text(json.dumps(_clean(doc), indent=1) + "\n", encoding="utf-8")


def _write_racks_csv(
    path: Path, p: Any, judged: dict[str, Any] | None, greedy: dict[str, Any] | None, base: dict[str, Any]
) -> None:
    site = p.site
    card_rack = site.card_rack()
    busy = np.bincount(card_rack[p.card_job >= 0], minlength=site.n_racks)
    failed = np.bincount(card_rack[p.failed], minlength=site.n_racks)
    hosts_off = judged["host_off"].reshape(site.n_racks, -1).sum(axis=1) if judged else None
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "rack",
                "limit_w",
                "cap_w",
                "power_w",
                "max_die_temp_c",
                "pump_speed_frac",
                "busy_cards",
                "failed_cards",
                "hosts_off",
                "greedy_power_w",
                "baseline_power_w",
                "baseline_max_die_temp_c",
            ]
        )
        cap = p.rack_cap_w()
        for r in range(site.n_racks):
            w.writerow(
                [
                    site.rack_names[r],
                    f"{p.rack_limit_w[r]:.1f}",
                    f"{cap[r]:.1f}",
                    f"{judged['rack_power_w'][r]:.1f}" if judged else "",
                    f"{judged['rack_max_die_c'][r]:.2f}" if judged else "",
                    f"{judged['pump_speed_frac'][r]:.3f}" if judged else "",
                    int(busy[r]),
                    int(failed[r]),
                    int(hosts_off[r]) if hosts_off is not None else "",
                    f"{greedy['rack_power_w'][r]:.1f}" if greedy else "",
                    f"{base['rack_power_w'][r]:.1f}",
                    f"{base['rack_max_die_c'][r]:.2f}",
                ]
            )


def _write_report(
    path: Path,
    sc: Scenario,
    p: Any,
    plan: Any,
    judged: dict[str, Any] | None,
    greedy: Any,
    greedy_j: dict[str, Any] | None,
    base: dict[str, Any],
    t_place: float,
) -> None:
    plt = pyplot()
    site = p.site
    names = site.rack_names
    x = np.arange(site.n_racks)
    imgs: list[tuple[str, str]] = []
    wide = max(6.0, min(0.25 * site.n_racks, 24.0))

    fig, ax = plt.subplots(figsize=(wide, 3.2))
    wb = 0.27
    ax.bar(x - wb, base["rack_power_w"] / 1e3, wb, label="baseline (top clock)", color="#bbbbbb")
    if greedy_j:
        ax.bar(x, greedy_j["rack_power_w"] / 1e3, wb, label="greedy", color="#8fb3d9")
    if judged:
        ax.bar(x + wb, judged["rack_power_w"] / 1e3, wb, label="plan", color="#1f5fa8")
    ax.axhline(float(p.rack_limit_w.max()) / 1e3, color="red", lw=1.2, label="limit")
    ax.axhline(float(p.rack_cap_w().max()) / 1e3, color="red", lw=0.8, ls="--", label="limit - margin")
    ax.set_ylabel("rack power (kW)")
    ax.set_xticks(x[:: max(1, site.n_racks // 32)], [names[i] for i in x[:: max(1, site.n_racks // 32)]], fontsize=7)
    ax.set_ylim(0.0, float(max(base["rack_power_w"].max(), p.rack_limit_w.max())) / 1e3 + 2.0)
    # above the axes, so that it never hides a bar
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    imgs.append(("Rack power vs limit (twin steady state)", png_base64(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 3.0))
    t_lo = float(min(base["die_c"].min(), judged["die_c"].min() if judged else 99.0)) - 1.0
    bins = [float(b) for b in np.linspace(t_lo, p.site.card.max_temp_c + 1.0, 50)]
    ax.hist(base["die_c"], bins=bins, alpha=0.5, label="baseline", color="#999999")
    if judged:
        ax.hist(judged["die_c"], bins=bins, alpha=0.7, label="plan", color="#1f5fa8")
    ax.axvline(p.die_limit_c, color="red", lw=1.0, ls="--", label="die limit")
    ax.axvline(p.site.card.slowdown_temp_c, color="red", lw=1.2, label="slowdown")
    ax.set_xlabel("steady die temperature (deg C)")
    ax.set_ylabel("cards")
    ax.legend(fontsize=7)
    imgs.append(("Die temperatures", png_base64(fig)))
    plt.close(fig)

    rows = [("baseline", base)] + ([("greedy", greedy_j)] if greedy_j else []) + ([("plan", judged)] if judged else [])
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.0))
    labels = [r[0] for r in rows]
    colors = ["#bbbbbb", "#8fb3d9", "#1f5fa8"][: len(rows)]
    axes[0].bar(labels, [r[1]["facility_power_w"] / 1e3 for r in rows], color=colors)
    axes[0].bar(labels, [r[1]["it_power_w"] / 1e3 for r in rows], color="none", edgecolor="k", hatch="//")
    axes[0].set_ylabel("facility power (kW); hatched: IT")
    axes[1].bar(labels, [r[1]["pue"] for r in rows], color=colors)
    axes[1].axhline(site.pue_target, color="red", lw=1.0, label="target")
    axes[1].set_ylim(1.0, max(max(r[1]["pue"] for r in rows), site.pue_target) + 0.02)
    axes[1].set_ylabel("PUE")
    axes[1].legend(fontsize=7)
    axes[2].bar(labels, [r[1]["throughput"] for r in rows], color=colors)
    axes[2].set_ylabel("throughput (top-clock card equiv.)")
    fig.tight_layout()
    imgs.append(("Energy, PUE and throughput against the baseline and the greedy plan", png_base64(fig)))
    plt.close(fig)

    opts = [o for o in plan.setpoint.options if o.facility_power_w is not None]
    if len(plan.setpoint.options) > 1 and opts:
        fig, ax = plt.subplots(figsize=(6.0, 2.8))
        ax.plot([o.supply_temp_c for o in opts], [o.facility_power_w / 1e3 for o in opts], "o-", label="facility power")
        ax.set_xlabel("rack supply set-point (deg C)")
        ax.set_ylabel("facility power (kW)")
        ax.axvline(plan.supply_temp_c, color="green", ls="--", label="chosen")
        ax.legend(fontsize=7)
        imgs.append(("Coolant set-point options (each with its own DVFS plan)", png_base64(fig)))
        plt.close(fig)

    def fmt(v: Any, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
        return "-" if v is None else f"{v / scale:.{digits}f}{unit}"

    table_rows = "".join(
        f"<tr><td>{escape(n)}</td><td>{fmt(r['it_power_w'], ' kW', 1e3)}</td>"
        f"<td>{fmt(r['facility_power_w'], ' kW', 1e3)}</td>"
        f"<td>{fmt(r['pue'], '', 1, 3)}</td><td>{fmt(r['throughput'])}</td><td>{r['supply_c']:g} deg C</td>"
        f"<td>{fmt(float(r['rack_power_w'].max()), ' kW', 1e3, 2)}</td>"
        f"<td>{fmt(float(r['die_c'].max()), ' deg C')}</td>"
        f"<td>{fmt(r['pump_power_w'], ' kW', 1e3, 2)}"
        f" (mean speed {100 * float(np.mean(r['pump_speed_frac'])):.0f}%)</td>"
        f"<td>{int(r['host_off'].sum())} of {site.n_hosts}</td></tr>"
        for n, r in rows
    )
    expl = f"<pre>{escape(plan.explanation)}</pre>" if plan.explanation else ""
    gen = {**sc.moved, **sc.dropped}
    if gen:
        expl += (
            "<p>Generated jobs a failed card or a listed job sat in:</p><ul>"
            + "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in gen.items())
            + "</ul>"
        )
    body = f"""<p>Site {escape(site.name)}: {site.n_cards} cards, {site.n_racks} racks; {p.n_jobs} jobs running;
ambient {p.ambient_c:g} deg C. Status <b>{escape(plan.status.value)}</b> ({escape(plan.source)}),
solve {plan.solve_time_s:.3f} s, placement {t_place:.3f} s, chosen supply {plan.supply_temp_c:g} deg C.</p>{expl}
<table><tr><th>plan</th><th>IT</th><th>facility</th><th>PUE</th><th>throughput</th><th>supply</th>
<th>max rack</th><th>max die</th><th>pumps</th><th>hosts off</th></tr>
{table_rows}</table>
<p>All numbers are the twin's steady state (<code>twin.steady.site_steady_state</code>) at each plan's levels
idle states and pump speeds (each rack loop's pump as slow as the plan's dies, cap and loop rise allow, as
the agent chooses it; <code>[solver] choose_pump_speed</code>) and hosts off (every host with no busy card but a
reserve of <code>[solver] host_reserve_per_supernode</code> per supernode and the hosts holding the ready reserve of
awake idle cards, none while jobs stay queued, as the agent powers off hosts idle long enough; decided before
planning, so the plan's caps count what they save; <code>[solver] choose_host_power</code>). Baseline: every card
at the top clock, idle cards in active idle, every host on, the scenario's set-point, pumps at full speed, only
the cards' own protection.</p>
{figures_html(imgs)}"""
    path.write_text(page(f"racktwin optimize: {sc.name}", body), encoding="utf-8")
