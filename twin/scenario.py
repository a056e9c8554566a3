"""Run scenarios: a site in time with its workload, weather and faults, for sim, evaluate and demo.

A run scenario is a TOML file (format: docs/sim.md, "Run-scenario files"; examples in
``examples/sim-*.toml`` and ``examples/fault-*.toml``) that this module parses into plain plant
inputs: the site, the jobs, the plant faults (``twin.faults``), the simulator-only faults
(:class:`BrokerDisconnect`), a :class:`twin.plant.PlantConfig` and the telemetry period. It does no
I/O beyond reading the scenario, its site spec and its job trace, and nothing here knows about MQTT.

Every problem is a :class:`twin.tables.SpecError` naming the file and the field
(``faults[2].rack: rack 9 is not in the site (0..7)``). :func:`default_run_scenario` is the scenario
the simulator runs when none is given: the twin's generated workload at 65% allocation, already in
steady state at t = 0 (``warm_start``), a diurnal ambient around the site's ``ambient_temp_c``.

Time: ``t = 0`` is the start of the run and, for the diurnal ambient, midnight.

Warm start: the generator's Poisson arrivals are drawn over ``[-W, duration)`` (``W`` = the longest
job run time); a job that arrived before 0 and whose expected wall time reaches past 0 is running at
t = 0 with the work it has left (length-biased, as in a site that has been running for days). Those
jobs are listed in :attr:`RunScenario.running_at_start` and :func:`build_plant` places them at t = 0
(compact first fit) before the first step; they compute from t = 0 (no start-up wait), their cards
at the thermal steady state of their power. Arrivals before t = 0 are not limited by the site: where
the jobs still running need more cards than it has, those that do not fit wait in the queue at t = 0.
Listed jobs marked ``running_at_start`` are placed first and must fit the site together.

The loader is in parts: this module reads the file's top level, ``[plant]``, ``[ambient]``,
``[phases]`` and ``[targets]`` and builds the plant; :mod:`twin.scenario_jobs` the jobs
(``[workload]``: generated or traced, and the listed ``[[jobs]]``); :mod:`twin.scenario_faults` the
``[[faults]]``; :mod:`twin.scenario_checks` what they share. Import every name from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from twin.faults import Ambient, ConstantAmbient, DiurnalAmbient, Fault, PiecewiseAmbient
from twin.plant import CardVariation, Plant, PlantConfig, SensorNoise
from twin.plant_types import DEFAULT_PUMP_HOLD_S
from twin.scenario_checks import MAX_DURATION_S, MIN_DURATION_S, wrap_value_error
from twin.scenario_faults import FAULT_KINDS, BrokerDisconnect, SimFault, decode_faults
from twin.scenario_jobs import (
    JOB_ID_PATTERN,
    MAX_GENERATED_JOBS,
    WorkloadSection,
    check_generated_count,
    check_jobs,
    check_listed_running,
    check_source_keys,
    conditioned_jobs,
    decode_listed_jobs,
    generated_line,
    generator_config,
    jobs_line,
    offered_allocation,
    traced_jobs,
    workload_line,
)
from twin.spec import SiteSpec, check_file_kind, load_site, site_spec_sections
from twin.tables import SpecError, choices, decode_table, read_toml, rng
from twin.workload import JobSpec, PhaseModel

__all__ = [
    "DEFAULT_EXTERNAL_TIMEOUT_S",
    "FAULT_KINDS",
    "JOB_ID_PATTERN",
    "MAX_DURATION_S",
    "MAX_GENERATED_JOBS",
    "MIN_DURATION_S",
    "BrokerDisconnect",
    "RunScenario",
    "ScenarioTargets",
    "SimFault",
    "build_plant",
    "default_run_scenario",
    "jobs_line",
    "load_run_scenario",
    "offered_allocation",
    "place_compact",
    "run_scenario_from_dict",
]


#: Default placement mode of a run scenario: the agent places queued jobs (``scheduler/cmd``); a
#: job the agent has not placed after this many seconds in the queue is placed by the plant's
#: built-in first-fit scheduler, so that a site with no agent never starves.
DEFAULT_EXTERNAL_TIMEOUT_S = 120.0

#: Most of a computing job's time that its stalls (``[phases]``) may take: beyond, a job barely computes.
MAX_STALL_SHARE = 0.9

#: Largest seed, in the file and as an override (``--seed``): a 64-bit signed integer, as TOML holds.
MAX_SEED = 2**63 - 1


_AMBIENT_KINDS: Mapping[str, type[Any]] = {
    "constant": ConstantAmbient,
    "diurnal": DiurnalAmbient,
    "piecewise": PiecewiseAmbient,
}


@dataclass(frozen=True)
class RunScenario:
    """A time-based scenario for ``racktwin sim``, ``evaluate`` and ``demo`` (see the module docstring).

    ``jobs`` are in submission order; ``running_at_start`` names the jobs (submitted at 0) that
    :func:`build_plant` places at t = 0. ``plant_config.seed`` is the scenario's seed.
    """

    name: str
    source: str  # the file it came from, or "embedded default"
    site: SiteSpec
    duration_s: float
    seed: int
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...]
    sim_faults: tuple[SimFault, ...]
    plant_config: PlantConfig
    telemetry_period_s: float
    running_at_start: tuple[str, ...] = ()
    workload: str = ""  # one line: where the jobs come from (:func:`workload_line`)
    # share of the site's card-seconds the jobs would hold over the run with unlimited cards
    # (:func:`offered_allocation`; generated workloads only, else NaN)
    offered_allocation: float = math.nan
    targets: ScenarioTargets | None = None  # ``[targets]``, checked by ``racktwin evaluate``
    # the generator's seed the jobs were drawn with (``allocation_tolerance`` may move it past
    # ``seed``); None for traces and explicit job lists
    workload_seed: int | None = None
    # what loading warned about (each also passed to the loader's ``warn``): faults and listed jobs
    # that a ``duration_s`` override shortening the run leaves after its end
    warnings: tuple[str, ...] = ()
    # the files it was read from: the scenario file (:func:`load_run_scenario`), the site spec it
    # names (not one the caller passed) and its trace; what a command must not write over (not part
    # of what the scenario is: two scenarios read from different files may be equal)
    input_files: tuple[Path, ...] = field(default=(), compare=False)
    # the scenario's own ``duration_s`` (its file's), which a ``duration_s`` override replaced; the run
    # its ``targets`` are set for (``racktwin evaluate`` says when ``--duration`` shortened it). None for
    # a scenario not built by :func:`run_scenario_from_dict`. Not part of what the run is, as ``input_files``
    file_duration_s: float | None = field(default=None, compare=False)


# --------------------------------------------------------------------------------------------
# File sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioTargets:
    """``[targets]``: what one policy must show on this scenario, checked by ``racktwin evaluate``
    (``agent.targets``), which reports each as met or missed, by how much and why.

    Every bound is optional; a scenario without ``[targets]`` is only measured. Savings and losses
    are against the baseline policy of the same run; limit violations are rack-seconds of TRUE rack
    power over the limit from the end of the first control period. ``better_than`` names policies
    the judged one must beat on facility energy (by at least 0.01%: closer is a tie) at equal or
    better throughput ("equal": within ``equal_throughput_tolerance_pct`` of theirs). Policy names
    are checked by ``racktwin evaluate`` (this module does not know the policies). ``reference``
    says where the targets come from.
    """

    policy: str = "racktwin"
    facility_saving_pct_min: float | None = field(default=None, metadata=rng(-100.0, 100.0))
    throughput_loss_pct_max: float | None = field(default=None, metadata=rng(-100.0, 100.0))
    pue_max: float | None = field(default=None, metadata=rng(1.0, 10.0))
    limit_violation_s_max: float | None = field(default=None, metadata=rng(0.0, 1e12))
    limit_violation_longest_s_max: float | None = field(default=None, metadata=rng(0.0, 1e12))
    die_over_max_card_s_max: float | None = field(default=None, metadata=rng(0.0, 1e12))
    better_than: tuple[str, ...] | None = None
    equal_throughput_tolerance_pct: float = field(default=0.0, metadata=rng(0.0, 100.0))
    reference: str | None = None


@dataclass(frozen=True)
class _PlantSection:
    """``[plant]``: how the virtual plant behaves beyond the site spec (``twin.plant.PlantConfig``)."""

    placement: str = field(default="external", metadata=choices("builtin", "external"))
    external_timeout_s: float = field(default=DEFAULT_EXTERNAL_TIMEOUT_S, metadata=rng(0.0, 1e9))
    backfill_wait_s: float = field(default=1800.0, metadata=rng(0.0, 1e9))
    supply_time_constant_s: float = field(default=120.0, metadata=rng(0.0, 1e6))
    min_power_limit_w: float = field(default=200.0, metadata=rng(0.0, 1e4))
    initial_level: int = field(default=0, metadata=rng(0, 255))
    initial_low_power: bool = False
    noise: bool = True
    variation: bool = True
    pump_hold_s: float = field(default=DEFAULT_PUMP_HOLD_S, metadata=rng(0.0, 1e9, lo_open=True))


@dataclass(frozen=True)
class _RunFile:
    """The top level of a run-scenario file (``ambient``, ``phases``, ``jobs`` and ``faults`` are
    decoded separately)."""

    name: str
    duration_s: float = field(metadata=rng(0.0, lo_open=True))  # at most MAX_DURATION_S (checked with overrides)
    site: str | None = None
    supernodes: int | None = field(default=None, metadata=rng(1, 10_000))
    seed: int = field(default=0, metadata=rng(0, MAX_SEED))
    telemetry_period_s: float = field(default=1.0, metadata=rng(0.01, 3600.0))
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    plant: _PlantSection = field(default_factory=_PlantSection)
    targets: ScenarioTargets | None = None


_SEPARATE_KEYS = ("ambient", "phases", "jobs", "faults")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_run_scenario(
    path: str | Path,
    *,
    site: SiteSpec | None = None,
    seed: int | None = None,
    duration_s: float | None = None,
    supernodes: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunScenario:
    """Read a run-scenario TOML file. ``site`` replaces the file's ``site`` key (the file's
    ``supernodes`` still applies); ``seed``, ``duration_s`` and ``supernodes`` override the file's
    (the generated workload is drawn for them). Any problem is a :class:`SpecError` naming the file
    and the field.

    A fault that starts, or a listed job submitted, at or after the end of the run is an error, unless
    the run ends before it only because ``duration_s`` shortened it: then the scenario's ``warnings``
    say so (and ``warn``, when given, gets each line; the commands print them) and the fault or job
    stays (it never happens)."""
    data = read_toml(path)
    scenario = run_scenario_from_dict(
        data,
        source=str(path),
        base_dir=Path(path).parent,
        site=site,
        seed=seed,
        duration_s=duration_s,
        supernodes=supernodes,
        warn=warn,
    )
    return dataclasses.replace(scenario, input_files=(Path(path), *scenario.input_files))


def run_scenario_from_dict(
    data: Mapping[str, Any],
    *,
    source: str = "<scenario>",
    base_dir: str | Path = ".",
    site: SiteSpec | None = None,
    seed: int | None = None,
    duration_s: float | None = None,
    supernodes: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunScenario:
    """Build a :class:`RunScenario` from parsed TOML (relative paths are taken from ``base_dir``;
    the other arguments as :func:`load_run_scenario`'s)."""
    if not isinstance(data, Mapping):
        raise SpecError(source, "(top level)", f"expected a table, got {type(data).__name__}")
    base = Path(base_dir)
    _check_not_a_site_spec(data, source)
    check_file_kind(data, "run scenario", source)
    main = {k: v for k, v in data.items() if k not in _SEPARATE_KEYS}
    top = decode_table(_RunFile, main, source, other_keys=_SEPARATE_KEYS)
    the_seed, duration = _seed_and_duration(top, seed, duration_s, source)
    shortened_from = top.duration_s if duration < top.duration_s else None
    inputs: list[Path] = []
    if site is None:
        site = _run_site(top, base, source, inputs)
    scale = supernodes if supernodes is not None else top.supernodes
    if scale is not None:
        scaled_site = site  # a site of more than MAX_SITE_CARDS cards is refused at `supernodes`
        site = wrap_value_error(source, "supernodes", lambda: scaled_site.with_supernodes(scale))
    ambient = _ambient(data.get("ambient"), site, source)
    phases = PhaseModel()
    if "phases" in data:
        phases = wrap_value_error(source, "phases", lambda: decode_table(PhaseModel, data["phases"], source, "phases"))
        _check_stalls(phases, source)
    config = _plant_config(data, top, site, ambient, phases, the_seed, source)

    # ---- workload: generated or traced, then the listed jobs -----------------------------------
    w = top.workload
    check_source_keys(data.get("workload", {}), w, source)
    wseed: int | None = None
    offered = math.nan
    running: list[str] = []
    jobs: list[JobSpec] = []
    what: str | None = None  # where the [workload] jobs come from; None: none
    if w.source == "generate":
        cfg = generator_config(site, w, phases, source)
        check_generated_count(site, duration, w, cfg, source)
        from_seed = the_seed if w.seed is None else w.seed
        gen_jobs, running, wseed, offered = conditioned_jobs(site, duration, from_seed, w, cfg, source)
        jobs.extend(gen_jobs)
        what = generated_line(w, from_seed, wseed, offered)
    elif w.source == "trace":
        jobs.extend(traced_jobs(w, base, source, inputs))
        what = f"trace {w.trace}"
    listed = data.get("jobs", [])
    if not isinstance(listed, list):
        raise SpecError(source, "jobs", "expected a list of tables ([[jobs]])")
    warnings: list[str] = []
    listed_jobs, listed_running = decode_listed_jobs(listed, source, duration, shortened_from, the_seed, warnings)
    jobs.extend(listed_jobs)
    check_jobs(jobs, site, source, listed_from=len(jobs) - len(listed))
    check_listed_running(listed_running, site, source)
    # the listed running jobs are placed first (they were running); generated ones that do not fit
    # beside them wait in the queue at t = 0
    running = [job.job_id for _, job in listed_running] + running
    jobs.sort(key=lambda j: j.submit_time_s)

    # ---- faults ------------------------------------------------------------------------------
    faults, sim_faults = decode_faults(data.get("faults", []), site, source, duration, shortened_from, warnings.append)
    if warn is not None:
        for message in warnings:
            warn(message)

    return RunScenario(
        name=top.name,
        source=source,
        site=site,
        duration_s=duration,
        seed=the_seed,
        jobs=tuple(jobs),
        faults=tuple(faults),
        sim_faults=tuple(sim_faults),
        plant_config=config,
        telemetry_period_s=top.telemetry_period_s,
        running_at_start=tuple(running),
        workload=workload_line(what, len(listed)),
        offered_allocation=offered if w.source == "generate" else math.nan,
        targets=top.targets,
        workload_seed=wseed,
        warnings=tuple(warnings),
        input_files=tuple(inputs),
        file_duration_s=float(top.duration_s),
    )


def _seed_and_duration(top: _RunFile, seed: int | None, duration_s: float | None, source: str) -> tuple[int, float]:
    """The run's seed and duration: the file's unless given in their place (command-line options)."""
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise SpecError(source, "seed", f"must be within 0..{MAX_SEED} (as in the file), got {seed}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError(source, "duration_s", f"must be a positive number of seconds, got {duration_s}")
    the_seed = top.seed if seed is None else seed
    duration = top.duration_s if duration_s is None else float(duration_s)
    if duration > MAX_DURATION_S:
        asked = "" if duration_s is None else " (the duration asked for in place of the file's, e.g. --duration)"
        raise SpecError(
            source,
            "duration_s",
            f"{duration:.10g} s{asked} is longer than a run may be: at most {MAX_DURATION_S:.0f} s (365 days)",
        )
    if duration < MIN_DURATION_S:
        raise SpecError(
            source,
            "duration_s",
            f"{duration:g} s is shorter than one plant step ({MIN_DURATION_S:g} s): the run would record nothing",
        )
    return the_seed, duration


def _run_site(top: _RunFile, base: Path, source: str, inputs: list[Path]) -> SiteSpec:
    """The site spec file the scenario names (appended to ``inputs``)."""
    if top.site is None:
        raise SpecError(source, "site", "missing required value: the site spec file (or pass --site)")
    site_path = base / top.site
    inputs.append(site_path)
    try:
        return load_site(site_path)
    except SpecError as exc:
        raise SpecError(source, "site", f"{exc}{missing_site_hint(top.site, site_path)}") from None


def missing_site_hint(named: str, resolved: Path) -> str:
    """What to do when the site spec a scenario names by a relative path is not there: such a path is
    taken from the scenario's folder (a scenario copied out of ``examples/`` to be edited loses its
    site spec); "" when the file exists or the path was absolute."""
    if Path(named).is_absolute() or resolved.exists():
        return ""
    return " (a relative site is taken from the scenario's folder: give the site spec's path, or copy it there)"


def _plant_config(
    data: Mapping[str, Any],
    top: _RunFile,
    site: SiteSpec,
    ambient: Ambient,
    phases: PhaseModel,
    seed: int,
    source: str,
) -> PlantConfig:
    """The ``[plant]`` section with the ambient and the phase model: the plant's configuration."""
    p = top.plant
    given_plant = data.get("plant", {})
    if p.placement != "external" and "external_timeout_s" in given_plant:
        raise SpecError(source, "plant.external_timeout_s", "only used with placement = 'external'")
    if p.min_power_limit_w > site.card.power_limit_w:
        raise SpecError(
            source,
            "plant.min_power_limit_w",
            f"must not exceed the card's power limit (card.power_limit_w = {site.card.power_limit_w:g} W), "
            f"got {p.min_power_limit_w:g}",
        )
    if p.initial_level >= site.card.n_levels:
        raise SpecError(
            source, "plant.initial_level", f"must be within 0..{site.card.n_levels - 1}, got {p.initial_level}"
        )
    return wrap_value_error(
        source,
        "plant",
        lambda: PlantConfig(
            seed=seed,
            noise=SensorNoise() if p.noise else SensorNoise.none(),
            variation=CardVariation() if p.variation else CardVariation.none(),
            ambient=ambient,
            phases=phases,
            placement=p.placement,
            external_timeout_s=p.external_timeout_s,
            backfill_wait_s=p.backfill_wait_s,
            supply_time_constant_s=p.supply_time_constant_s,
            min_power_limit_w=p.min_power_limit_w,
            initial_level=p.initial_level,
            initial_low_power=p.initial_low_power,
            pump_hold_s=p.pump_hold_s,
        ),
    )


def _check_not_a_site_spec(data: Mapping[str, Any], source: str) -> None:
    """A site spec given where a run scenario belongs (``racktwin sim`` takes both ``--site`` and
    ``--scenario``) is named as such, not reported as its first unknown key."""
    sections = site_spec_sections(data)
    if sections and "duration_s" not in data:
        raise SpecError(
            source,
            "",
            f"this looks like a site spec ({', '.join(f'[{k}]' for k in sections)}), not a run scenario: name it in "
            "a run scenario's `site` key (racktwin sim also takes it with --site)",
        )


def default_run_scenario(site: SiteSpec, duration_s: float = 86400.0, seed: int = 0) -> RunScenario:
    """The embedded default: generated workload at 65% allocation (warm start), diurnal ambient
    (+-5 K around the site's ``ambient_temp_c``, warmest at 15:00), no faults, telemetry every
    second, external placement with a 120 s fallback."""
    return run_scenario_from_dict(
        {"name": "default", "duration_s": float(duration_s), "seed": int(seed)},
        source="embedded default",
        site=site,
    )


def _ambient(raw: Any, site: SiteSpec, source: str) -> Ambient:
    if raw is None:
        return DiurnalAmbient(site.facility.ambient_temp_c)
    if not isinstance(raw, Mapping):
        raise SpecError(source, "ambient", f"expected a table, got {type(raw).__name__}")
    table = dict(raw)
    kind = table.pop("kind", "diurnal")
    if kind not in _AMBIENT_KINDS:
        raise SpecError(source, "ambient.kind", f"must be one of {', '.join(map(repr, _AMBIENT_KINDS))}, got {kind!r}")
    cls = _AMBIENT_KINDS[kind]
    if kind == "diurnal":
        table.setdefault("mean_c", site.facility.ambient_temp_c)
    elif kind == "constant":
        table.setdefault("temp_c", site.facility.ambient_temp_c)
    result: Ambient = wrap_value_error(
        source, "ambient", lambda: decode_table(cls, table, source, "ambient", other_keys=("kind",))
    )
    return result


def _check_stalls(phases: PhaseModel, source: str) -> None:
    """Stalls that would leave a computing job (almost) no time to compute are refused."""
    per_s = phases.stall_fraction()
    share = per_s / (1.0 + per_s)
    if share > MAX_STALL_SHARE:
        raise SpecError(
            source,
            "phases",
            f"stalls would take {100 * share:.4g}% of a computing job's time ({per_s:.3g} s of stalls per second "
            "of computing: comm_stalls_per_hour x comm_stall_median_s + input_stalls_per_hour x "
            "input_stall_median_s, times exp(stall_sigma^2 / 2), per 3600 s), leaving it almost no time to "
            f"compute: at most {MAX_STALL_SHARE:.0%}",
        )


# --------------------------------------------------------------------------------------------
# Plant
# --------------------------------------------------------------------------------------------


def place_compact(plant: Plant, job_ids: Sequence[str], *, running: bool = False) -> list[str]:
    """Place queued jobs, in order, compactly (the first supernode with enough free cards, its
    free cards in index order; else free cards across the site). Returns the ids placed; a job
    that does not fit stays queued. ``running``: the jobs were already running (warm start), so
    they skip the start-up wait (``PhaseModel.startup_s``) and compute from the next step, or from
    now after :meth:`Plant.settle_warm_start` (as :func:`build_plant` does)."""
    site = plant.site
    per_sn = site.cards_per_supernode
    queued = {j.job_id: j for j in plant.queued_jobs()}
    placed: list[str] = []
    free = np.zeros(plant.n_cards, dtype=bool)
    free[plant.free_cards()] = True
    for job_id in job_ids:
        spec = queued.get(job_id)
        if spec is None or spec.n_cards > int(free.sum()):
            continue
        counts = free.reshape(site.supernodes, per_sn).sum(axis=1)
        fits = np.flatnonzero(counts >= spec.n_cards)
        if fits.size:
            sn = int(fits[0])
            cards = np.flatnonzero(free[sn * per_sn : (sn + 1) * per_sn])[: spec.n_cards] + sn * per_sn
        else:
            cards = np.flatnonzero(free)[: spec.n_cards]
        plant.place_job(job_id, cards, already_running=running)
        free[cards] = False
        placed.append(job_id)
    return placed


def build_plant(scenario: RunScenario) -> Plant:
    """The scenario's plant at t = 0, with the jobs of ``running_at_start`` placed and computing
    (no start-up wait: they were running before t = 0), so the t = 0 readings show them busy, at
    their power, with their dies at its thermal steady state (:meth:`Plant.settle_warm_start`).
    Faults starting at t = 0 are in force before the placement: no job is placed on a card that
    has failed."""
    plant = Plant(scenario.site, scenario.jobs, scenario.faults, scenario.plant_config)
    if scenario.running_at_start:
        place_compact(plant, scenario.running_at_start, running=True)
        plant.settle_warm_start()
    return plant
