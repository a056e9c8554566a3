"""The scenario file of ``racktwin optimize``: its schema (:class:`ScenarioFile`, one dataclass per
section, :class:`JobEntry` for ``[[jobs]]`` and ``[[queue]]``) and :func:`load_scenario`, which reads
and checks it into a :class:`Scenario`: the site, the running jobs with their cards and phases, the
queue and the failed cards. A ``[generate]`` workload is drawn here too (``models.synthetic``); its
jobs that a failed card or a listed job sits in run around it or are dropped, each said in
:attr:`Scenario.moved` and :attr:`Scenario.dropped`. Every problem is a :class:`UserError` naming
the file and the field. The format is described in docs/models.md and the comments of
examples/scenario-*.toml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from agent.commands.common import UserError
from twin.scenario import missing_site_hint
from twin.spec import MAX_RACK_POWER_W, SiteSpec, SpecError, check_file_kind, load_site
from twin.tables import choices, decode_table, read_toml, rng
from twin.workload import JobSpec, Phase

IntArray = npt.NDArray[np.int64]

_PHASES = {
    "compute": Phase.COMPUTE,
    "communication": Phase.COMMUNICATION,
    "checkpoint": Phase.CHECKPOINT,
    "waiting": Phase.WAITING,
}


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
    rack_margin_w: float = field(default=1000.0, metadata=rng(0.0, MAX_RACK_POWER_W))
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
    margin_problem = site.rack_margin_problem(sf.margins.rack_margin_w)  # as the agent's control.rack_margin_w
    if margin_problem is not None:
        raise UserError(f"{src}: margins.rack_margin_w: {margin_problem}")
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
            hint = missing_site_hint(sf.site, site_path)
            raise SpecError(src, "site", f"cannot load site spec {sf.site!r}: {exc}{hint}") from None
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
