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
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from twin.faults import (
    Ambient,
    CardFailure,
    ColdPlateFouling,
    ConstantAmbient,
    DiurnalAmbient,
    Fault,
    GarbageReadings,
    HeatWave,
    PiecewiseAmbient,
    PumpDegradation,
    SensorDropout,
    StuckSensor,
)
from twin.plant import CardVariation, Plant, PlantConfig, SensorNoise
from twin.spec import SiteSpec, check_file_kind, load_site, site_spec_sections
from twin.tables import SpecError, choices, decode_table, read_toml, rng
from twin.workload import (
    GeneratorConfig,
    JobSpec,
    PhaseModel,
    TraceError,
    checkpoint_problem,
    expected_job_card_seconds,
    generate_jobs,
    load_trace,
)

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
    "load_run_scenario",
    "offered_allocation",
    "place_compact",
    "run_scenario_from_dict",
]

T = TypeVar("T")

#: Job ids must be valid on the wire (``agent.wire``: publisher/job ids).
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")

#: Default placement mode of a run scenario: the agent places queued jobs (``scheduler/cmd``); a
#: job the agent has not placed after this many seconds in the queue is placed by the plant's
#: built-in first-fit scheduler, so that a site with no agent never starves.
DEFAULT_EXTERNAL_TIMEOUT_S = 120.0

#: Smallest ``[workload] allocation_tolerance``: one day's offered allocation moves in steps of its
#: heavy-tailed jobs (a 256-card job running an hour is 0.6% of a day of the example site), so on
#: the example site 1 seed in 20 offers 0.65 +- 0.01 but 1 in 300 offers 0.65 +- 0.005.
MIN_ALLOCATION_TOLERANCE = 0.01

#: Most of a computing job's time that its stalls (``[phases]``) may take: beyond, a job barely computes.
MAX_STALL_SHARE = 0.9

#: Shortest run: one step of the plant (``Plant.run``'s and the simulator's default ``dt_s``). A
#: shorter run records nothing (``racktwin evaluate --duration 0.5`` would report a 0 kW rack).
MIN_DURATION_S = 1.0

#: Longest run: a year (365 days), in the file (``duration_s``) and as an override (``--duration``
#: of sim and evaluate). More is nothing an operator simulates, and the generated workload grows with
#: the run: a year of the example site's (512 cards at 65% allocation) is ~380,000 jobs, drawn in
#: ~15 s with ~0.3 GB; 1e10 s (the limit before) would have been ~120 million jobs, ~100 GB.
MAX_DURATION_S = 365 * 86400.0

#: Most jobs the generator may draw for one run (its warm-start window included), judged from the
#: expected count before drawing: each takes ~750 bytes, so this is ~1.5 GB and about a minute to draw
#: (measured: 1.53 million jobs for a year of 2,048 cards, 47 s, 1.1 GB peak). A year of 4 supernodes
#: fits; a larger site (``supernodes``) for a long run does not.
MAX_GENERATED_JOBS = 2_000_000


@dataclass(frozen=True)
class BrokerDisconnect:
    """Simulator-only fault: the simulator drops its MQTT connection at ``start_s`` for
    ``duration_s`` seconds (site time) and reconnects (what happens on the wire: docs/sim.md)."""

    start_s: float = field(metadata=rng(0.0))
    duration_s: float = field(metadata=rng(0.0, lo_open=True))

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"BrokerDisconnect: start_s must be a finite time >= 0 s, got {self.start_s}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"BrokerDisconnect: duration_s must be a finite time > 0 s, got {self.duration_s}")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


SimFault = BrokerDisconnect

#: ``kind`` of a ``[[faults]]`` table -> the dataclass it decodes into.
FAULT_KINDS: Mapping[str, type[Any]] = {
    "sensor_dropout": SensorDropout,
    "stuck_sensor": StuckSensor,
    "garbage_readings": GarbageReadings,
    "card_failure": CardFailure,
    "pump_degradation": PumpDegradation,
    "cold_plate_fouling": ColdPlateFouling,
    "heat_wave": HeatWave,
    "broker_disconnect": BrokerDisconnect,
}

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
    workload: str = ""  # one line: where the jobs come from
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
    the judged one must beat on facility energy at equal or better throughput ("equal": within
    ``equal_throughput_tolerance_pct`` of theirs). Policy names are checked by ``racktwin evaluate``
    (this module does not know the policies). ``reference`` says where the targets come from.
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
class _WorkloadSection:
    """``[workload]``: where jobs come from (listed ``[[jobs]]`` are added in every case)."""

    source: str = field(default="generate", metadata=choices("generate", "trace", "none"))
    target_allocation: float = field(default=0.65, metadata=rng(0.0, 1.0, lo_open=True))
    warm_start: bool = True
    duration_scale: float = field(default=1.0, metadata=rng(0.0, 1e6, lo_open=True))
    max_cards: int | None = field(default=None, metadata=rng(1, 10_000_000))
    seed: int | None = field(default=None, metadata=rng(0, 2**63 - 1))
    # Condition the generated day on its load: the workload seed is the first of seed, seed + 1, ...
    # whose jobs offer target_allocation +- this (offered_allocation); unset: the seed as given.
    allocation_tolerance: float | None = field(default=None, metadata=rng(MIN_ALLOCATION_TOLERANCE, 1.0))
    # [lo, hi] of the generated jobs' compute shares (uniform); None: the generator's (0.60, 0.87)
    compute_share_range: tuple[float, ...] | None = field(default=None, metadata=rng(0.0, 1.0))
    trace: str | None = None
    time_offset_s: float = field(default=0.0, metadata=rng(0.0, 1e9))


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
    pump_hold_s: float = field(default=60.0, metadata=rng(0.0, 1e9, lo_open=True))


@dataclass(frozen=True)
class _JobEntry:
    """``[[jobs]]``: one listed job (give ``duration_s`` or ``work_steps``)."""

    id: str
    n_cards: int = field(metadata=rng(1, 10_000_000))
    duration_s: float | None = field(default=None, metadata=rng(0.0, 1e12, lo_open=True))
    work_steps: float | None = field(default=None, metadata=rng(0.0, 1e15, lo_open=True))
    step_time_s: float = field(default=2.0, metadata=rng(0.0, 1e6, lo_open=True))
    compute_share: float = field(default=0.8, metadata=rng(0.0, 1.0))
    priority: float = field(default=1.0, metadata=rng(0.0, 1e6, lo_open=True))
    submit_time_s: float = field(default=0.0, metadata=rng(0.0, 1e12))
    checkpoint_interval_s: float = field(default=900.0, metadata=rng(0.0, 1e8, lo_open=True))
    checkpoint_duration_s: float = field(default=60.0, metadata=rng(0.0, 1e8))
    noncompute_utilization: float = field(default=0.2, metadata=rng(0.0, 1.0))
    min_throughput_frac: float = field(default=0.0, metadata=rng(0.0, 1.0))
    running_at_start: bool = False
    # a job running at the start is part way through its checkpoint interval: the training time
    # before its first checkpoint (default: drawn uniform in (0, checkpoint_interval_s])
    first_checkpoint_after_s: float | None = field(default=None, metadata=rng(0.0, 1e8, lo_open=True))


@dataclass(frozen=True)
class _RunFile:
    """The top level of a run-scenario file (``ambient``, ``phases``, ``jobs`` and ``faults`` are
    decoded separately)."""

    name: str
    duration_s: float = field(metadata=rng(0.0, lo_open=True))  # at most MAX_DURATION_S (checked with overrides)
    site: str | None = None
    supernodes: int | None = field(default=None, metadata=rng(1, 10_000))
    seed: int = field(default=0, metadata=rng(0, 2**63 - 1))
    telemetry_period_s: float = field(default=1.0, metadata=rng(0.01, 3600.0))
    workload: _WorkloadSection = field(default_factory=_WorkloadSection)
    plant: _PlantSection = field(default_factory=_PlantSection)
    targets: ScenarioTargets | None = None


_SEPARATE_KEYS = ("ambient", "phases", "jobs", "faults")

#: ``[workload]`` keys that only one ``source`` reads (the others would be silently ignored)
_SOURCE_KEYS: Mapping[str, tuple[str, ...]] = {
    "generate": (
        "target_allocation",
        "warm_start",
        "duration_scale",
        "max_cards",
        "seed",
        "allocation_tolerance",
        "compute_share_range",
    ),
    "trace": ("trace", "time_offset_s"),
}

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


def _wrap(source: str, where: str, make: Callable[[], T]) -> T:
    """Run a constructor; its ValueError becomes a SpecError at ``where``."""
    try:
        return make()
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(source, where, str(exc)) from None


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
        site = site.with_supernodes(scale)
    ambient = _ambient(data.get("ambient"), site, source)
    phases = PhaseModel()
    if "phases" in data:
        phases = _wrap(source, "phases", lambda: decode_table(PhaseModel, data["phases"], source, "phases"))
        _check_stalls(phases, source)
    config = _plant_config(data, top, site, ambient, phases, the_seed, source)

    # ---- workload: generated or traced, then the listed jobs -----------------------------------
    w = top.workload
    _check_source_keys(data.get("workload", {}), w, source)
    wseed: int | None = None
    offered = math.nan
    running: list[str] = []
    jobs: list[JobSpec] = []
    if w.source == "generate":
        cfg = _generator_config(site, w, phases, source)
        _check_generated_count(site, duration, w, cfg, source)
        from_seed = the_seed if w.seed is None else w.seed
        gen_jobs, running, wseed, offered = _conditioned(site, duration, from_seed, w, cfg, source)
        jobs.extend(gen_jobs)
        what = _generated_line(w, from_seed, wseed, offered)
    elif w.source == "trace":
        jobs.extend(_traced_jobs(w, base, source, inputs))
        what = f"trace {w.trace}"
    else:
        what = "listed jobs only"
    listed = data.get("jobs", [])
    if not isinstance(listed, list):
        raise SpecError(source, "jobs", "expected a list of tables ([[jobs]])")
    warnings: list[str] = []
    listed_jobs, listed_running = _listed_jobs(listed, source, duration, shortened_from, the_seed, warnings)
    jobs.extend(listed_jobs)
    if listed:
        what += f" + {len(listed)} listed"
    _check_jobs(jobs, site, source, listed_from=len(jobs) - len(listed))
    _check_listed_running(listed_running, site, source)
    # the listed running jobs are placed first (they were running); generated ones that do not fit
    # beside them wait in the queue at t = 0
    running = [job.job_id for _, job in listed_running] + running
    jobs.sort(key=lambda j: j.submit_time_s)

    # ---- faults ------------------------------------------------------------------------------
    faults, sim_faults = _faults(data.get("faults", []), site, source, duration, shortened_from, warnings.append)
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
        workload=what,
        offered_allocation=offered if w.source == "generate" else math.nan,
        targets=top.targets,
        workload_seed=wseed,
        warnings=tuple(warnings),
        input_files=tuple(inputs),
    )


def _seed_and_duration(top: _RunFile, seed: int | None, duration_s: float | None, source: str) -> tuple[int, float]:
    """The run's seed and duration: the file's unless given in their place (command-line options)."""
    if seed is not None and seed < 0:
        raise SpecError(source, "seed", f"must be >= 0, got {seed}")
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
        raise SpecError(source, "site", f"{exc}") from None


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
    return _wrap(
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


def _check_source_keys(given_workload: Mapping[str, Any], w: _WorkloadSection, source: str) -> None:
    """A ``[workload]`` key of another source than the one chosen is a mistake, not ignored."""
    for used_by, keys in _SOURCE_KEYS.items():
        for key in keys:
            if key in given_workload and w.source != used_by:
                raise SpecError(source, f"workload.{key}", f"only used with source = {used_by!r}")


def _traced_jobs(w: _WorkloadSection, base: Path, source: str, inputs: list[Path]) -> list[JobSpec]:
    """The jobs of ``workload.trace`` (appended to ``inputs``), shifted by ``time_offset_s``."""
    if w.trace is None:
        raise SpecError(source, "workload.trace", "missing: the trace CSV file (source = 'trace')")
    inputs.append(base / w.trace)
    try:
        traced = load_trace(base / w.trace)
    except TraceError as exc:
        raise SpecError(source, "workload.trace", str(exc)) from None
    if w.time_offset_s:
        traced = [dataclasses.replace(j, submit_time_s=j.submit_time_s + w.time_offset_s) for j in traced]
    return traced


def _listed_jobs(
    listed: list[Any],
    source: str,
    duration: float,
    shortened_from: float | None,
    seed: int,
    warnings: list[str],
) -> tuple[list[JobSpec], list[tuple[str, JobSpec]]]:
    """The ``[[jobs]]`` entries as jobs, and those running at the start with where they are listed.
    A listed job a shortened run ends before is a warning (one line for several)."""
    jobs: list[JobSpec] = []
    listed_running: list[tuple[str, JobSpec]] = []  # where, job
    late_jobs: list[str] = []
    for i, entry in enumerate(listed):
        where = f"jobs[{i}]"
        je = decode_table(_JobEntry, entry, source, where)
        problem = checkpoint_problem(je.checkpoint_interval_s, je.checkpoint_duration_s)
        if problem:
            raise SpecError(source, f"{where}.checkpoint_duration_s", problem)
        if je.running_at_start:
            if je.submit_time_s != 0.0:
                raise SpecError(
                    source, f"{where}.running_at_start", "a job running at the start must have submit_time_s = 0"
                )
        elif je.first_checkpoint_after_s is not None:
            raise SpecError(
                source,
                f"{where}.first_checkpoint_after_s",
                "only for a job running at the start (a job starting fresh checkpoints after a whole interval)",
            )
        _check_before_end(
            je.submit_time_s,
            source,
            f"{where}.submit_time_s",
            duration,
            shortened_from,
            late_jobs.append,
            ("the job would never be submitted", "the job is not submitted"),
        )
        job = _listed_job(je, source, where, seed)
        jobs.append(job)
        if je.running_at_start:
            listed_running.append((where, job))
    if len(late_jobs) > 1 and shortened_from is not None:  # one line, not one per job (a short demo run)
        late_jobs = [
            f"{source}: {len(late_jobs)} listed jobs are submitted at or after the end of this run ({duration:g} s, "
            f"shortened from {shortened_from:g} s): they are not submitted"
        ]
    warnings.extend(late_jobs)
    return jobs, listed_running


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
    result: Ambient = _wrap(
        source, "ambient", lambda: decode_table(cls, table, source, "ambient", other_keys=("kind",))
    )
    return result


def _listed_job(je: _JobEntry, source: str, where: str, seed: int) -> JobSpec:
    if (je.duration_s is None) == (je.work_steps is None):
        raise SpecError(source, f"{where}.duration_s", "give exactly one of duration_s and work_steps")
    work = je.work_steps if je.work_steps is not None else float(je.duration_s or 0.0) / je.step_time_s
    first = je.first_checkpoint_after_s
    if je.running_at_start and first is None:
        first = _part_way_through(je.checkpoint_interval_s, seed, je.id)
    return _wrap(
        source,
        where,
        lambda: JobSpec(
            job_id=je.id,
            n_cards=je.n_cards,
            work_steps=work,
            step_time_s=je.step_time_s,
            compute_share=je.compute_share,
            priority=je.priority,
            submit_time_s=je.submit_time_s,
            checkpoint_interval_s=je.checkpoint_interval_s,
            checkpoint_duration_s=je.checkpoint_duration_s,
            noncompute_utilization=je.noncompute_utilization,
            min_throughput_frac=je.min_throughput_frac,
            first_checkpoint_after_s=first,
        ),
    )


def _part_way_through(interval_s: float, seed: int, job_id: str) -> float:
    """Training time before the first checkpoint of a job that was running before t = 0 and whose
    progress is not known: uniform in (0, ``interval_s``] (jobs started at unrelated times are at
    unrelated points of their intervals; left at a whole interval, every such job would checkpoint
    at the same moment), drawn from the scenario's seed and the job's id."""
    draw = np.random.default_rng([seed, 3, zlib.crc32(job_id.encode("utf-8"))]).random()
    return float(interval_s * (1.0 - draw))


def _check_jobs(jobs: Sequence[JobSpec], site: SiteSpec, source: str, listed_from: int) -> None:
    seen: set[str] = set()
    for i, j in enumerate(jobs):
        where = f"jobs[{i - listed_from}]" if i >= listed_from else "workload"
        if not JOB_ID_PATTERN.match(j.job_id):
            raise SpecError(
                source, f"{where}.id" if i >= listed_from else where,
                f"job id {j.job_id[:80]!r}: use 1-128 of A-Z a-z 0-9 _ . : @ - (it is a wire identifier)",
            )  # fmt: skip
        if j.job_id in seen:
            raise SpecError(source, f"{where}.id" if i >= listed_from else where, f"duplicate job id {j.job_id!r}")
        seen.add(j.job_id)
        if j.n_cards > site.n_cards:
            raise SpecError(
                source,
                f"{where}.n_cards" if i >= listed_from else where,
                f"job {j.job_id!r} needs {j.n_cards} cards, the site has {site.n_cards}",
            )


def offered_allocation(
    jobs: Sequence[JobSpec], n_cards: int, duration_s: float, phases: PhaseModel | None = None
) -> float:
    """The share of ``n_cards x duration_s`` card-seconds that ``jobs`` would hold over ``[0, duration_s)``
    with unlimited cards: each job from its submission for its expected wall time (start-up, training
    at the top clock, expected stalls and checkpoints: ``PhaseModel.expected_wall_time_s``). The
    realized allocation is lower when demand peaks exceed the site (jobs wait) and higher when jobs
    run slower than at the top clock."""
    ph = phases if phases is not None else PhaseModel()
    held = 0.0
    for j in jobs:
        wall = ph.expected_wall_time_s(j.duration_s, j.checkpoint_interval_s, j.checkpoint_duration_s)
        held += j.n_cards * max(min(j.submit_time_s + wall, duration_s) - j.submit_time_s, 0.0)
    return held / (n_cards * duration_s)


#: Workload seeds tried by ``allocation_tolerance`` before giving up (about 0.06 s each for a day of
#: the example site; at the smallest tolerance 1 seed in 20 is accepted there).
_MAX_SEED_TRIES = 200


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


def _generator_config(site: SiteSpec, w: _WorkloadSection, phases: PhaseModel, source: str) -> GeneratorConfig:
    """The generator's configuration from ``[workload]`` and ``[phases]``, checked against the site."""
    kw: dict[str, Any] = {"target_allocation": w.target_allocation, "duration_scale": w.duration_scale}
    kw["phases"] = phases
    if w.max_cards is not None:
        host = GeneratorConfig.granularity
        if w.max_cards < host:
            raise SpecError(
                source, "workload.max_cards", f"must be at least one whole host ({host} cards), got {w.max_cards}"
            )
        if w.max_cards > site.n_cards:
            raise SpecError(
                source,
                "workload.max_cards",
                f"{w.max_cards} is more than the site's {site.n_cards} cards: no job can be larger than the site",
            )
        kw["max_cards"] = w.max_cards
    if w.compute_share_range is not None:
        share = w.compute_share_range
        if len(share) != 2:
            raise SpecError(source, "workload.compute_share_range", f"expected [lo, hi], got {len(share)} values")
        if share[0] > share[1]:
            raise SpecError(
                source,
                "workload.compute_share_range",
                f"expected [lo, hi] with lo <= hi, got [{share[0]:g}, {share[1]:g}]",
            )
        kw["compute_share_range"] = (share[0], share[1])
    cfg = _wrap(source, "workload", lambda: GeneratorConfig(**kw))
    shortest_s = cfg.min_duration_s * cfg.duration_scale
    if shortest_s < MIN_DURATION_S:
        raise SpecError(
            source,
            "workload.duration_scale",
            f"{cfg.duration_scale:g} makes the shortest generated job {shortest_s:.3g} s of training (the "
            f"generator's {cfg.min_duration_s:g} s x {cfg.duration_scale:g}): a job must last at least one plant "
            f"step ({MIN_DURATION_S:g} s), so duration_scale must be >= {MIN_DURATION_S / cfg.min_duration_s:.4g}",
        )
    return cfg


def _check_generated_count(
    site: SiteSpec, duration_s: float, w: _WorkloadSection, cfg: GeneratorConfig, source: str
) -> None:
    """A generated workload too large to hold (a long run of a scaled-up site) is refused from its
    expected number of jobs, before any is drawn (the draw would exhaust the memory)."""
    rate_per_s = cfg.target_allocation * site.n_cards / expected_job_card_seconds(cfg)
    window_s = cfg.stats.max_run_time_s * cfg.duration_scale + cfg.phases.startup_s if w.warm_start else 0.0
    expected = rate_per_s * (window_s + duration_s)
    if expected > MAX_GENERATED_JOBS:
        warm = f" and the {window_s:,.0f} s warm-start window before it" if w.warm_start else ""
        raise SpecError(
            source,
            "workload",
            f"the generator would draw about {expected:,.0f} jobs ({site.n_cards:,} cards at "
            f"{cfg.target_allocation:g} allocation for {duration_s:,.0f} s{warm}): at most "
            f"{MAX_GENERATED_JOBS:,} (~1.5 GB to hold); shorten the run or use fewer supernodes",
        )


def _generated_line(w: _WorkloadSection, from_seed: int, wseed: int, offered: float) -> str:
    """The workload line of a generated run. Where ``allocation_tolerance`` moved the workload seed
    past the seed given, it says so: every seed from the given one to the one used draws these jobs."""
    what = f"generated (AcmeTrace Kalos, {w.target_allocation:.0%} allocation, "
    if wseed == from_seed:
        what += f"seed {wseed}"
    else:
        what += f"workload seed {wseed}"
    if w.allocation_tolerance is not None:
        what += f" offering {offered:.1%}"
        if wseed != from_seed:
            what += (
                f" (the first from seed {from_seed} within {100 * w.target_allocation:g}% +- "
                f"{100 * w.allocation_tolerance:g}%: seeds {from_seed}..{wseed} all draw these jobs)"
            )
    return what + (", warm start)" if w.warm_start else ")")


def _conditioned(
    site: SiteSpec, duration_s: float, seed: int, w: _WorkloadSection, cfg: GeneratorConfig, source: str
) -> tuple[list[JobSpec], list[str], int, float]:
    """Generated jobs, running jobs, the workload seed used and the offered allocation.

    Sizes and run times of the generator are heavy-tailed (AcmeTrace Kalos: a 256-card job may run
    for a week), so one day's offered allocation scatters widely around ``target_allocation`` (one
    day of the example site: 0.41-1.59 over seeds 0-29, median 0.56). ``allocation_tolerance``
    draws from the generator conditioned on the day's load: the first seed from ``seed`` whose day
    offers ``target_allocation +- allocation_tolerance``."""
    tol = w.allocation_tolerance
    closest = (math.inf, seed, math.nan)  # miss, seed, offer
    for k in range(_MAX_SEED_TRIES if tol is not None else 1):
        s = seed + k
        jobs, running = _generated(site, duration_s, s, cfg, w.warm_start)
        offered = offered_allocation(jobs, site.n_cards, duration_s, cfg.phases)
        miss = abs(offered - w.target_allocation)
        if tol is None or miss <= tol:
            return jobs, running, s, offered
        closest = min(closest, (miss, s, offered))
    raise SpecError(
        source,
        "workload.allocation_tolerance",
        f"no workload seed in {seed}..{seed + _MAX_SEED_TRIES - 1} offers {w.target_allocation:g} +- {tol or 0:g}; "
        f"the closest, seed {closest[1]}, offers {closest[2]:.4f} ({closest[0]:.4f} off)",
    )


def _generated(
    site: SiteSpec, duration_s: float, seed: int, cfg: GeneratorConfig, warm_start: bool
) -> tuple[list[JobSpec], list[str]]:
    """Generated jobs (and, with a warm start, those already running at t = 0, in arrival order; those
    that the site cannot hold all at once wait in the queue at t = 0)."""
    phases = cfg.phases
    window = cfg.stats.max_run_time_s * cfg.duration_scale + phases.startup_s if warm_start else 0.0
    raw = generate_jobs(site.n_cards, window + duration_s, seed, cfg)
    jobs: list[JobSpec] = []
    running: list[str] = []
    for j in raw:
        t = j.submit_time_s - window
        if t >= 0.0:
            jobs.append(dataclasses.replace(j, submit_time_s=t))
            continue
        wall = phases.expected_wall_time_s(j.duration_s, j.checkpoint_interval_s, j.checkpoint_duration_s)
        left = t + wall
        if left <= 0.0:
            continue  # finished before the run starts
        # it has trained for the share of its wall time gone by: where that leaves it in its
        # checkpoint interval sets its first checkpoint here (0 would mean one due now)
        trained_s = j.duration_s * (1.0 - left / wall)
        first = j.checkpoint_interval_s - math.fmod(trained_s, j.checkpoint_interval_s)
        jobs.append(
            dataclasses.replace(
                j, submit_time_s=0.0, work_steps=j.work_steps * left / wall, first_checkpoint_after_s=first
            )
        )
        running.append(j.job_id)
    return jobs, running


def _faults(
    raw: Any,
    site: SiteSpec,
    source: str,
    duration_s: float,
    shortened_from_s: float | None,
    warn: Callable[[str], None],
) -> tuple[list[Fault], list[SimFault]]:
    """The plant faults and the simulator faults of ``[[faults]]``. ``shortened_from_s``: the file's
    duration where an override shortened the run (a fault after the shortened end is then a warning)."""
    if not isinstance(raw, list):
        raise SpecError(source, "faults", "expected a list of tables ([[faults]])")
    faults: list[Fault] = []
    sim_faults: list[SimFault] = []
    racks = {name: i for i, name in enumerate(site.rack_names)}
    for i, entry in enumerate(raw):
        where = f"faults[{i}]"
        if not isinstance(entry, Mapping):
            raise SpecError(source, where, f"expected a table, got {type(entry).__name__}")
        table = dict(entry)
        kind = table.pop("kind", None)
        if kind is None:
            raise SpecError(source, f"{where}.kind", f"missing: one of {', '.join(FAULT_KINDS)}")
        if kind not in FAULT_KINDS:
            raise SpecError(source, f"{where}.kind", f"must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        if isinstance(table.get("rack"), str):  # a rack name ("r3") is accepted too
            name = table["rack"]
            if name not in racks:
                raise SpecError(source, f"{where}.rack", f"rack {name!r} is not in the site (r0..r{site.n_racks - 1})")
            table["rack"] = racks[name]
        cls = FAULT_KINDS[kind]
        fault: Any = _decode_fault(cls, table, source, where)
        _check_fault_target(fault, site, source, where)
        _check_fault_start(fault, source, where, duration_s, shortened_from_s, warn)
        if isinstance(fault, BrokerDisconnect):
            sim_faults.append(fault)
        else:
            faults.append(fault)
    sim_faults.sort(key=lambda f: f.start_s)
    for a, b in itertools.pairwise(sim_faults):
        if b.start_s < a.end_s:
            raise SpecError(source, "faults", f"broker disconnects overlap ({a.start_s:g} s and {b.start_s:g} s)")
    return faults, sim_faults


def _decode_fault(cls: type[Any], table: dict[str, Any], source: str, where: str) -> Any:
    try:
        return decode_table(cls, table, source, where, other_keys=("kind",))
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(source, where, str(exc)) from None


def _check_fault_start(
    fault: Any, source: str, where: str, duration_s: float, shortened_from_s: float | None, warn: Callable[[str], None]
) -> None:
    name = "at_s" if isinstance(fault, CardFailure) else "start_s"
    start = float(getattr(fault, name))
    _check_before_end(
        start,
        source,
        f"{where}.{name}",
        duration_s,
        shortened_from_s,
        warn,
        ("it would never happen", "the fault does not happen"),
    )


def _check_before_end(
    start_s: float,
    source: str,
    where: str,
    duration_s: float,
    shortened_from_s: float | None,
    warn: Callable[[str], None],
    outcome: tuple[str, str],
) -> None:
    """A fault that starts, or a listed job submitted, at or after the end of the run would never
    happen: an error, or a warning where the file's own duration reaches it and only an override
    shortened the run. ``outcome``: what the error says, what the warning says."""
    if start_s < duration_s:
        return
    never, not_in_this_run = outcome
    if shortened_from_s is not None and start_s < shortened_from_s:
        warn(
            f"{source}: {where}: {start_s:g} s is at or after the end of this run ({duration_s:g} s, "
            f"shortened from {shortened_from_s:g} s): {not_in_this_run}"
        )
        return
    raise SpecError(source, where, f"{start_s:g} s is at or after the end of the run ({duration_s:g} s): {never}")


def _check_listed_running(listed_running: Sequence[tuple[str, JobSpec]], site: SiteSpec, source: str) -> None:
    """The listed jobs marked ``running_at_start`` were all running at t = 0: together they must fit the site."""
    total = sum(job.n_cards for _, job in listed_running)
    if total <= site.n_cards:
        return
    held = 0
    for where, job in listed_running:
        held += job.n_cards
        if held > site.n_cards:
            raise SpecError(
                source,
                f"{where}.running_at_start",
                f"the jobs marked running_at_start up to this one need {held} cards ({total} in all), the site has "
                f"{site.n_cards}: they cannot all be running at t = 0",
            )


def _check_fault_target(fault: Any, site: SiteSpec, source: str, where: str) -> None:
    rack = getattr(fault, "rack", None)
    if rack is not None and not 0 <= rack < site.n_racks:
        raise SpecError(source, f"{where}.rack", f"rack {rack} is not in the site (0..{site.n_racks - 1})")
    card = getattr(fault, "card", None)
    if card is not None:
        if not 0 <= card < site.n_cards:
            raise SpecError(source, f"{where}.card", f"card {card} is not in the site (0..{site.n_cards - 1})")
        if rack is not None and card // site.cards_per_rack != rack:
            cpr = site.cards_per_rack
            raise SpecError(
                source,
                f"{where}.card",
                f"card {card} is not in rack {rack} (cards {rack * cpr}..{rack * cpr + cpr - 1})",
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
