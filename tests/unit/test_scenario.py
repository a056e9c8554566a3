"""twin.scenario: run-scenario files (every example loads; every problem names the file and the field),
the embedded default, the warm start, listed and traced jobs, faults, and the plant built from them."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from twin.faults import CardFailure, DiurnalAmbient, HeatWave, PiecewiseAmbient, PumpDegradation, StuckSensor
from twin.plant import SensorNoise
from twin.scenario import (
    DEFAULT_EXTERNAL_TIMEOUT_S,
    FAULT_KINDS,
    MAX_DURATION_S,
    MAX_GENERATED_JOBS,
    BrokerDisconnect,
    build_plant,
    default_run_scenario,
    jobs_line,
    load_run_scenario,
    offered_allocation,
    run_scenario_from_dict,
)
from twin.scenario_jobs import WorkloadSection, check_generated_count, generator_config
from twin.spec import SiteSpec
from twin.tables import SpecError, decode_table
from twin.workload import KALOS, GeneratorConfig, JobSpec, Phase, PhaseModel, generate_jobs

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_EXAMPLES = sorted([*EXAMPLES.glob("sim-*.toml"), *EXAMPLES.glob("fault-*.toml"), *EXAMPLES.glob("day-*.toml")])


def test_there_are_examples_of_every_fault_kind() -> None:
    kinds = {p.stem.removeprefix("fault-").replace("-", "_") for p in EXAMPLES.glob("fault-*.toml")}
    assert kinds == set(FAULT_KINDS)


@pytest.mark.parametrize("path", RUN_EXAMPLES, ids=lambda p: p.name)
def test_every_example_scenario_loads(path: Path) -> None:
    sc = load_run_scenario(path, duration_s=600.0)  # a shorter horizon keeps the generated workloads small
    assert sc.name and sc.source == str(path) and sc.duration_s == 600.0
    assert sc.telemetry_period_s > 0 and sc.site.n_cards >= 512
    assert {j.job_id for j in sc.jobs} >= set(sc.running_at_start)
    kind = path.stem.removeprefix("fault-").replace("-", "_")
    if path.stem.startswith("fault-"):
        got = [type(f) for f in (*sc.faults, *sc.sim_faults)]
        assert FAULT_KINDS[kind] in got


def test_the_default_scenario(site: SiteSpec) -> None:
    sc = default_run_scenario(site, 3600.0, seed=3)
    assert sc.name == "default" and sc.duration_s == 3600.0 and sc.seed == 3
    cfg = sc.plant_config
    assert cfg.placement == "external" and cfg.external_timeout_s == DEFAULT_EXTERNAL_TIMEOUT_S
    assert cfg.seed == 3 and isinstance(cfg.ambient, DiurnalAmbient)
    assert cfg.ambient.mean_c == site.facility.ambient_temp_c
    assert sc.faults == () and sc.sim_faults == () and sc.telemetry_period_s == 1.0
    # warm start: jobs already running at t = 0 hold a good share of the site
    assert sc.running_at_start
    held = sum(j.n_cards for j in sc.jobs if j.job_id in sc.running_at_start)
    assert held >= 0.3 * site.n_cards
    assert all(j.submit_time_s == 0.0 for j in sc.jobs if j.job_id in sc.running_at_start)
    assert [j.submit_time_s for j in sc.jobs] == sorted(j.submit_time_s for j in sc.jobs)
    # the same seed gives the same scenario, another seed another one
    assert default_run_scenario(site, 3600.0, seed=3).jobs == sc.jobs
    assert default_run_scenario(site, 3600.0, seed=4).jobs != sc.jobs


def test_sim_default_toml_is_the_embedded_default_written_out() -> None:
    """examples/sim-default.toml says it is `racktwin sim`'s embedded default with every key at its
    default: loading it gives the same scenario but for its name and source."""
    written = load_run_scenario(EXAMPLES / "sim-default.toml")
    embedded = default_run_scenario(written.site)
    assert dataclasses.replace(written, name=embedded.name, source=embedded.source) == embedded


def test_generated_allocation_follows_the_target_over_a_day(site: SiteSpec) -> None:
    big = site.with_supernodes(4)
    sc = run_scenario_from_dict({"name": "x", "duration_s": 86400.0, "seed": 2}, site=big)
    cold = run_scenario_from_dict(
        {"name": "x", "duration_s": 86400.0, "seed": 2, "workload": {"warm_start": False}}, site=big
    )
    assert cold.running_at_start == () and all(j.submit_time_s >= 0 for j in cold.jobs)
    # Little's law: arrivals x expected card-seconds over the day ~ 65% of the cards
    ph = sc.plant_config.phases
    demand = sum(
        j.n_cards * ph.expected_wall_time_s(j.duration_s, j.checkpoint_interval_s, j.checkpoint_duration_s)
        for j in cold.jobs
    )
    assert 0.3 < demand / (big.n_cards * 86400.0) < 1.3


def test_build_plant_places_the_jobs_running_at_start(site: SiteSpec) -> None:
    sc = default_run_scenario(site, 600.0, seed=1)
    plant = build_plant(sc)
    running = {j.job_id for j in plant.running_jobs()}
    queued = {j.job_id for j in plant.queued_jobs()}
    assert running and running <= set(sc.running_at_start)
    assert set(sc.running_at_start) <= running | queued  # what did not fit waits
    # compact: every placed job is inside one supernode and on distinct cards
    cards = np.concatenate([plant.job_cards(j) for j in running])
    assert np.unique(cards).size == cards.size
    events = plant.drain_events()
    assert {e.job_id for e in events if e.kind == "started"} == running
    # they were running before t = 0: computing already at t = 0, no start-up wait
    phases = {r.job_id: r.phase for r in plant.job_records() if r.job_id in running}
    assert set(phases.values()) == {Phase.COMPUTE}
    assert {e.job_id for e in events if e.kind == "phase" and e.phase == Phase.COMPUTE} == running
    plant.step(1.0)
    assert plant.config.phases.startup_s == sc.plant_config.phases.startup_s == 60.0
    assert plant.accounting().work_card_s > 0


def test_the_warm_start_reads_as_running_from_t0(site: SiteSpec) -> None:
    """Jobs running before t = 0 show in the t = 0 readings as they do a second later: their cards
    busy and at their power, their dies at the steady state of that power (no cold-die transient
    that a controller would see at its first decision), and the energy balance still closes."""
    sc = default_run_scenario(site, 600.0, seed=1)
    plant = build_plant(sc)
    busy = np.zeros(plant.n_cards, dtype=bool)
    for job in plant.running_jobs():
        busy[plant.job_cards(job.job_id)] = True
    t0 = plant.truth()
    assert busy.any() and (t0.utilization[busy] > 0.5).all()
    plant.step(1.0)
    t1 = plant.truth()
    # within a job's first second no stall is due on these seeds' jobs (checked: all still computing)
    assert {r.phase for r in plant.job_records() if r.state == "running"} == {Phase.COMPUTE}
    np.testing.assert_allclose(t1.card_power_w, t0.card_power_w, rtol=1e-6)
    np.testing.assert_allclose(t1.die_temp_c, t0.die_temp_c, atol=1e-3)
    assert t0.die_temp_c[busy].mean() > t0.die_temp_c[~busy].mean() + 10.0
    acc = plant.accounting()
    assert acc.it_energy_j == pytest.approx(float(t0.rack_power_w.sum()), rel=1e-6)


def test_the_warm_start_is_settled_only_before_the_first_step(site: SiteSpec) -> None:
    plant = build_plant(default_run_scenario(site, 600.0, seed=1))
    plant.step(1.0)
    with pytest.raises(RuntimeError, match="before the first step"):
        plant.settle_warm_start()


@pytest.mark.parametrize("name", ["day-nominal.toml", "day-full-load.toml"])
def test_jobs_running_at_the_start_do_not_checkpoint_together(name: str) -> None:
    """Jobs started before t = 0 at unrelated times are at unrelated points of their checkpoint
    intervals: their first checkpoints here spread over the interval (left at a whole interval, every
    one of them checkpointed at ~900 s: on the full-load day the whole site at once)."""
    sc = load_run_scenario(EXAMPLES / name)
    running = [j for j in sc.jobs if j.job_id in sc.running_at_start]
    firsts = [j.first_checkpoint_after_s for j in running]
    assert len(running) >= 10 and all(
        f is not None and 0.0 < f <= j.checkpoint_interval_s for f, j in zip(firsts, running, strict=True)
    )
    assert max(f or 0.0 for f in firsts) - min(f or 0.0 for f in firsts) > 0.5 * running[0].checkpoint_interval_s
    assert all(j.first_checkpoint_after_s is None for j in sc.jobs if j.job_id not in sc.running_at_start)
    # the same file gives the same draw
    assert [j.first_checkpoint_after_s for j in load_run_scenario(EXAMPLES / name).jobs] == [
        j.first_checkpoint_after_s for j in sc.jobs
    ]


def test_a_listed_running_job_may_say_where_it_is_in_its_interval(site: SiteSpec) -> None:
    base: dict[str, Any] = {"name": "x", "duration_s": 600.0, "workload": {"source": "none"}}
    entry = {"id": "a", "n_cards": 8, "duration_s": 3600.0, "running_at_start": True, "first_checkpoint_after_s": 120.0}
    sc = run_scenario_from_dict({**base, "jobs": [entry]}, source="x.toml", site=site)
    assert sc.jobs[0].first_checkpoint_after_s == 120.0
    fresh = {**entry, "running_at_start": False}
    with pytest.raises(SpecError, match=r"jobs\[0\]\.first_checkpoint_after_s.*only for a job running at the start"):
        run_scenario_from_dict({**base, "jobs": [fresh]}, source="x.toml", site=site)
    with pytest.raises(SpecError, match="first_checkpoint_after_s must be within"):
        run_scenario_from_dict(
            {**base, "jobs": [{**entry, "first_checkpoint_after_s": 1000.0}]}, source="x.toml", site=site
        )


def test_the_warm_start_avoids_cards_that_fail_at_t0(site: SiteSpec) -> None:
    """A card failing at t = 0 has failed before the jobs running at the start are placed: none is
    placed on it (such a job would be stopped and requeued at once, and fail with max_restarts = 0)."""
    data = {
        "name": "t0",
        "duration_s": 600.0,
        "workload": {"source": "none"},
        "phases": {"max_restarts": 0},
        "plant": {"placement": "builtin"},
        "jobs": [{"id": "a", "n_cards": 8, "duration_s": 3600.0, "running_at_start": True}],
        "faults": [{"kind": "card_failure", "card": 3, "at_s": 0.0}],
    }
    plant = build_plant(run_scenario_from_dict(data, source="t0.toml", site=site))
    assert plant.truth().failed[3]
    assert plant.job_cards("a").tolist() == [0, 1, 2, 4, 5, 6, 7, 8]
    plant.run(400.0, 1.0)
    assert [e.kind for e in plant.drain_events() if e.kind in ("requeued", "failed")] == []
    assert plant.accounting().jobs_failed == 0 and plant.accounting().lost_work_card_s == 0.0


def test_listed_jobs_ambient_plant_and_faults(site: SiteSpec, tmp_path: Path) -> None:
    text = """
name = "listed"
duration_s = 900
seed = 4
telemetry_period_s = 2.5
[workload]
source = "none"
[ambient]
kind = "piecewise"
times_s = [0, 600]
temps_c = [20, 30]
[plant]
placement = "builtin"
noise = false
variation = false
initial_level = 2
[phases]
startup_s = 10.0
[[jobs]]
id = "a"
n_cards = 64
work_steps = 1000
running_at_start = true
[[jobs]]
id = "b"
n_cards = 8
duration_s = 100
step_time_s = 0.5
compute_share = 0.6
priority = 2
min_throughput_frac = 0.8
submit_time_s = 30
[[faults]]
kind = "card_failure"
card = 5
at_s = 60
[[faults]]
kind = "pump_degradation"
rack = "r3"
start_s = 100
flow_fraction = 0.5
[[faults]]
kind = "stuck_sensor"
rack = 1
card = 70
start_s = 10
[[faults]]
kind = "heat_wave"
start_s = 0
peak_delta_k = 8
[[faults]]
kind = "broker_disconnect"
start_s = 300
duration_s = 30
"""
    p = tmp_path / "s.toml"
    p.write_text(
        text.replace(
            "duration_s = 900\n", f'duration_s = 900\nsite = "{(EXAMPLES / "supernode-512.toml").as_posix()}"\n'
        )
    )
    sc = load_run_scenario(p)
    assert sc.telemetry_period_s == 2.5 and sc.seed == 4 and sc.workload == "listed jobs"
    a, b = sc.jobs
    assert (a.job_id, a.n_cards, a.work_steps, a.step_time_s, a.compute_share) == ("a", 64, 1000.0, 2.0, 0.8)
    assert b.work_steps == 200.0 and b.priority == 2.0 and b.min_throughput_frac == 0.8 and b.submit_time_s == 30.0
    assert sc.running_at_start == ("a",)
    cfg = sc.plant_config
    assert cfg.placement == "builtin" and cfg.noise == SensorNoise.none() and cfg.initial_level == 2
    assert cfg.phases.startup_s == 10.0 and isinstance(cfg.ambient, PiecewiseAmbient)
    assert sc.faults == (
        CardFailure(card=5, at_s=60.0),
        PumpDegradation(rack=3, start_s=100.0, flow_fraction=0.5),
        StuckSensor(rack=1, start_s=10.0, card=70),
        HeatWave(start_s=0.0, peak_delta_k=8.0),
    )
    assert sc.sim_faults == (BrokerDisconnect(start_s=300.0, duration_s=30.0),)
    plant = build_plant(sc)
    assert [j.job_id for j in plant.running_jobs()] == ["a"]
    assert plant.ambient_c(600.0) == pytest.approx(30.0 + 8.0 * (600.0 / 3600.0))
    # overrides: site, seed, duration
    other = load_run_scenario(p, site=site.with_supernodes(2), seed=9, duration_s=60.0)
    assert other.site.n_cards == 1024 and other.seed == 9 and other.duration_s == 60.0 and other.plant_config.seed == 9


def test_trace_workload(tmp_path: Path) -> None:
    sc = load_run_scenario(EXAMPLES / "sim-trace.toml")
    assert sc.workload == "trace sim-trace.csv" and len(sc.jobs) == 9 and sc.running_at_start == ()
    assert sc.jobs[0].job_id == "llm-pretrain" and sc.jobs[0].n_cards == 256
    assert sc.plant_config.external_timeout_s == 60.0


_TWO_LISTED = [{"id": "a", "n_cards": 8, "duration_s": 10}, {"id": "b", "n_cards": 8, "duration_s": 10}]
_GENERATED = "generated (AcmeTrace Kalos, 65% allocation, seed 3)"


@pytest.mark.parametrize(
    ("workload", "listed", "expected_workload", "expected_line"),
    [
        # only listed jobs: was "2 jobs (listed jobs only + 2 listed)"
        ({"source": "none"}, _TWO_LISTED, "listed jobs", "2 listed jobs"),
        ({"source": "none"}, _TWO_LISTED[:1], "listed jobs", "1 listed job"),
        ({"source": "none"}, [], "no jobs", "no jobs"),  # was "0 jobs (listed jobs only)"
        ({"source": "trace", "trace": "sim-trace.csv"}, [], "trace sim-trace.csv", "9 jobs (trace sim-trace.csv)"),
        (
            {"source": "trace", "trace": "sim-trace.csv"},
            _TWO_LISTED,
            "trace sim-trace.csv + 2 listed",
            "11 jobs (trace sim-trace.csv + 2 listed)",
        ),
        ({"seed": 3, "warm_start": False}, [], _GENERATED, "{n} jobs (" + _GENERATED + ")"),
        (
            {"seed": 3, "warm_start": False},
            _TWO_LISTED,
            _GENERATED + " + 2 listed",
            "{n} jobs (" + _GENERATED + " + 2 listed)",
        ),
    ],
)
def test_the_jobs_line_reads_naturally_for_every_source(
    site: SiteSpec, workload: dict[str, Any], listed: list[Any], expected_workload: str, expected_line: str
) -> None:
    """What ``racktwin sim`` and ``evaluate`` print (and the report says) of a run's jobs."""
    data = {**BASE, "workload": workload, "jobs": listed}
    sc = run_scenario_from_dict(data, source="x.toml", base_dir=EXAMPLES, site=site)
    assert sc.workload == expected_workload
    assert jobs_line(len(sc.jobs), sc.workload) == expected_line.format(n=len(sc.jobs))


def test_supernodes_scale_the_site() -> None:
    sc = load_run_scenario(EXAMPLES / "sim-2048.toml", duration_s=60.0)
    assert sc.site.n_cards == 2048 and sc.site.n_racks == 32 and sc.site.name.endswith("-x4")


# ---- problems name the file and the field ------------------------------------------------------


def fault(**table: Any) -> dict[str, Any]:
    """A scenario change with one ``[[faults]]`` table."""
    return {"faults": [table]}


BASE: dict[str, Any] = {"name": "bad", "duration_s": 600.0, "workload": {"source": "none"}}


def _bad(site: SiteSpec, change: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    data = copy.deepcopy(BASE if base is None else base)
    data.update(change)
    with pytest.raises(SpecError) as info:
        run_scenario_from_dict(data, source="bad.toml", site=site)
    msg = str(info.value)
    assert msg.startswith("bad.toml: "), msg
    return msg


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"duration_s": -5.0}, "duration_s", "must be > 0"),
        ({"durration_s": 5.0}, "durration_s", "did you mean 'duration_s'"),
        ({"telemetry_period_s": 0.0}, "telemetry_period_s", ">= 0.01"),
        ({"seed": "x"}, "seed", "expected an integer"),
        ({"workload": {"source": "magic"}}, "workload.source", "must be one of"),
        ({"workload": {"source": "trace"}}, "workload.trace", "missing"),
        ({"workload": {"source": "trace", "trace": "nope.csv"}}, "workload.trace", "file not found"),
        ({"workload": {"target_allocation": 1.5}}, "workload.target_allocation", "<= 1"),
        ({"plant": {"placement": "random"}}, "plant.placement", "must be one of"),
        ({"plant": {"initial_level": 9}}, "plant.initial_level", "0..7"),
        ({"ambient": {"kind": "tropical"}}, "ambient.kind", "must be one of"),
        ({"ambient": {"kind": "piecewise", "times_s": [0, 1], "temps_c": [20]}}, "ambient", "equal length"),
        ({"ambient": {"kind": "constant", "temp_f": 70}}, "ambient.temp_f", "unknown key"),
        ({"phases": {"startup_s": -1.0}}, "phases.startup_s", "must be >= 0"),
        ({"phases": {"max_restarts": -1}}, "phases.max_restarts", "must be >= 0"),
        ({"phases": {"stall_sigma": 50.0}}, "phases.stall_sigma", "must be <= 3"),  # was an OverflowError
        ({"phases": {"comm_stalls_per_hour": 1e9}}, "phases", "leaving it almost no time to compute"),
        ({"phases": {"input_stall_median_s": 3600.0 * 9.5}}, "phases", "at most 90%"),
        ({"workload": {"duration_scale": 1e-6}}, "workload.duration_scale", "at least one plant step (1 s)"),
        ({"workload": {"max_cards": 2048}}, "workload.max_cards", "more than the site's 512 cards"),
        ({"workload": {"max_cards": 4}}, "workload.max_cards", "one whole host (8 cards)"),
        ({"workload": {"allocation_tolerance": 1e-6}}, "workload.allocation_tolerance", ">= 0.01"),
        ({"workload": {"compute_share_range": [0.9, 0.6]}}, "workload.compute_share_range", "lo <= hi"),
        ({"workload": {"compute_share_range": [0.7]}}, "workload.compute_share_range", "expected [lo, hi]"),
        ({"workload": {"compute_share_range": [0.5, 1.5]}}, "workload.compute_share_range[1]", "<= 1"),
        ({"workload": {"compute_share_range": 0.8}}, "workload.compute_share_range", "expected a list"),
        (
            {"workload": {"source": "none", "compute_share_range": [0.6, 0.8]}},
            "workload.compute_share_range",
            "only used with source = 'generate'",
        ),
        (
            {"workload": {"source": "none", "allocation_tolerance": 0.02}},
            "workload.allocation_tolerance",
            "only used with source = 'generate'",
        ),
        ({"plant": {"min_power_limit_w": 5000.0}}, "plant.min_power_limit_w", "card's power limit"),
        ({"duration_s": 0.5}, "duration_s", "shorter than one plant step"),
        ({"jobs": [{"id": "a", "n_cards": 8}]}, "jobs[0].duration_s", "exactly one of duration_s and work_steps"),
        ({"jobs": [{"id": "a b", "n_cards": 8, "duration_s": 10}]}, "jobs[0].id", "wire identifier"),
        # a final newline is not a character of an id ("$" alone let it through)
        ({"jobs": [{"id": "a\n", "n_cards": 8, "duration_s": 10}]}, "jobs[0].id", "job id 'a\\n': use 1-128 of"),
        ({"jobs": [{"id": "a", "n_cards": 9999, "duration_s": 10}]}, "jobs[0].n_cards", "the site has 512"),
        (
            {"jobs": [{"id": "a", "n_cards": 8, "duration_s": 10}, {"id": "a", "n_cards": 8, "duration_s": 10}]},
            "jobs[1].id",
            "duplicate job id",
        ),
        (
            {"jobs": [{"id": "a", "n_cards": 8, "duration_s": 10, "submit_time_s": 5, "running_at_start": True}]},
            "jobs[0].running_at_start",
            "submit_time_s = 0",
        ),
        ({"jobs": [{"id": "a", "n_cards": 8, "duration_s": 10, "priority": 0}]}, "jobs[0].priority", "> 0"),
        (
            {"jobs": [{"id": "a", "n_cards": 8, "duration_s": 10, "checkpoint_duration_s": 1e8}]},
            "jobs[0].checkpoint_duration_s",
            "longer than the 900 s of training between two",
        ),
        (
            {"jobs": [{"id": "a", "n_cards": 8, "duration_s": 10, "submit_time_s": 600}]},
            "jobs[0].submit_time_s",
            "at or after the end of the run (600 s): the job would never be submitted",
        ),
        (
            {"jobs": [{"id": f"r{i}", "n_cards": 64, "duration_s": 10, "running_at_start": True} for i in range(9)]},
            "jobs[8].running_at_start",
            "need 576 cards (576 in all), the site has 512: they cannot all be running at t = 0",
        ),
        (fault(rack=1, start_s=0), "faults[0].kind", "missing"),
        (fault(kind="meteor", start_s=0), "faults[0].kind", "must be one of"),
        (fault(kind="sensor_dropout", rack=8, start_s=0), "faults[0].rack", "not in the site"),
        (fault(kind="sensor_dropout", rack="r9", start_s=0), "faults[0].rack", "not in the site"),
        (
            fault(kind="sensor_dropout", rack=1, start_s=10, end_s=5),
            "faults[0]",
            "must be after start_s",
        ),
        (fault(kind="card_failure", card=512, at_s=0), "faults[0].card", "not in the site"),
        (fault(kind="stuck_sensor", rack=0, card=70, start_s=0), "faults[0].card", "not in rack 0"),
        (fault(kind="pump_degradation", rack=0, start_s=0), "faults[0].flow_fraction", "missing"),
        (fault(kind="pump_degradation", rack=0, start_s=0, flow_fraction=0), "faults[0].flow_fraction", ">= 0.05"),
        (fault(kind="garbage_readings", rack=0, start_s=0, mode="junk"), "faults[0].mode", "one of"),
        # it garbled nothing: a fault that is no fault, as a zero-length window or broker outage
        (fault(kind="garbage_readings", rack=0, start_s=0, fraction=0), "faults[0].fraction", "must be > 0, got 0"),
        (fault(kind="heat_wave", start_s=0, peak_delta_k="hot"), "faults[0].peak_delta_k", "expected a number"),
        # faults that change nothing, likewise: a pump at full flow, an unfouled plate, a wave of 0 K
        (fault(kind="pump_degradation", rack=0, start_s=0, flow_fraction=1), "faults[0].flow_fraction", "< 1, got 1"),
        (fault(kind="cold_plate_fouling", card=0, start_s=0, r_factor=1.0), "faults[0].r_factor", "> 1, got 1.0"),
        (
            fault(kind="heat_wave", start_s=0, peak_delta_k=0),
            "faults[0].peak_delta_k",
            "must be within -30..30 K and not 0, got 0",
        ),
        (fault(kind="heat_wave", start_s=0, peak_delta_k=-0.0), "faults[0].peak_delta_k", "not 0, got -0.0"),
        (fault(kind="broker_disconnect", start_s=10), "faults[0].duration_s", "missing"),
        (fault(kind="broker_disconnect", start_s=10, duration_s=0), "faults[0].duration_s", "> 0"),
        (
            {"faults": [{"kind": "broker_disconnect", "start_s": 10, "duration_s": 60},
                        {"kind": "broker_disconnect", "start_s": 30, "duration_s": 5}]},
            "faults[1].start_s",
            "overlap",
        ),
        ({"faults": {"kind": "heat_wave"}}, "faults", "list of tables"),
        (fault(kind="heat_wave", start_s=1e9, peak_delta_k=5), "faults[0].start_s", "after the end of the run (600 s)"),
        (fault(kind="card_failure", card=5, at_s=600), "faults[0].at_s", "after the end of the run (600 s)"),
        (fault(kind="broker_disconnect", start_s=700, duration_s=5), "faults[0].start_s", "after the end"),
    ],
)  # fmt: skip
def test_problems_name_the_file_and_the_field(site: SiteSpec, change: dict[str, Any], field: str, words: str) -> None:
    msg = _bad(site, change)
    assert msg.startswith(f"bad.toml: {field}: "), msg
    assert words in msg, msg


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=re.escape(f"{tmp_path / 'none.toml'}: file not found")):
        load_run_scenario(tmp_path / "none.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "x"\nduration_s = \n', encoding="utf-8")
    with pytest.raises(SpecError, match=r"broken\.toml: not valid TOML"):
        load_run_scenario(broken)
    nosite = tmp_path / "nosite.toml"
    nosite.write_text('name = "x"\nduration_s = 60\n', encoding="utf-8")
    with pytest.raises(SpecError, match=r"nosite.toml: site: missing required value"):
        load_run_scenario(nosite)
    badsite = tmp_path / "badsite.toml"
    badsite.write_text('name = "x"\nduration_s = 60\nsite = "other.toml"\n', encoding="utf-8")
    with pytest.raises(SpecError, match=r"badsite.toml: site: .*other.toml: file not found"):
        load_run_scenario(badsite)
    missing_name = tmp_path / "noname.toml"
    missing_name.write_text("duration_s = 60\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"noname.toml: name: missing required value"):
        load_run_scenario(missing_name)


def test_bad_trace_names_the_trace_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\nx,0,8,abc,1,0.5\n"
    )
    (tmp_path / "s.toml").write_text(
        f'name = "t"\nduration_s = 60\nsite = "{(EXAMPLES / "supernode-512.toml").as_posix()}"\n'
        '[workload]\nsource = "trace"\ntrace = "t.csv"\n'
    )
    with pytest.raises(SpecError) as info:
        load_run_scenario(tmp_path / "s.toml")
    msg = str(info.value)
    assert "s.toml: workload.trace: " in msg and "t.csv:2: column 'duration_s': not a number" in msg


def test_override_checks(site: SiteSpec) -> None:
    with pytest.raises(SpecError, match="duration_s"):
        run_scenario_from_dict(BASE, source="x", site=site, duration_s=math.nan)
    with pytest.raises(SpecError, match=r"duration_s: 0\.5 s is shorter than one plant step"):
        run_scenario_from_dict(BASE, source="x", site=site, duration_s=0.5)


def test_fault_after_a_shortened_end_is_a_warning(site: SiteSpec, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**BASE, **fault(kind="heat_wave", start_s=300.0, peak_delta_k=5)}  # within the file's 600 s
    warned: list[str] = []
    sc = run_scenario_from_dict(data, source="x.toml", site=site, duration_s=60.0, warn=warned.append)
    assert len(sc.faults) == 1 and sc.warnings == tuple(warned)
    assert len(warned) == 1 and warned[0].startswith("x.toml: faults[0].start_s: 300 s is at or after the end")
    assert "shortened from 600 s" in warned[0]
    assert capsys.readouterr().err == ""
    quiet = run_scenario_from_dict(data, source="x.toml", site=site, duration_s=60.0)  # twin/ prints nothing
    assert quiet.warnings == tuple(warned) and capsys.readouterr().err == ""
    # not shortened: no warning; after the file's own end too: still an error
    assert run_scenario_from_dict(data, source="x.toml", site=site, duration_s=900.0).warnings == ()
    late = {**BASE, **fault(kind="heat_wave", start_s=1e7, peak_delta_k=5)}
    with pytest.raises(SpecError, match=r"faults\[0\]\.start_s: 1e\+07 s is at or after the end of the run \(60 s\)"):
        run_scenario_from_dict(late, source="x.toml", site=site, duration_s=60.0)
    # a longer run reaches a fault the file's duration does not
    assert len(run_scenario_from_dict(late, source="x.toml", site=site, duration_s=2e7).faults) == 1
    with pytest.raises(SpecError, match="seed"):
        run_scenario_from_dict(BASE, source="x", site=site, seed=-1)


def test_a_listed_job_after_a_shortened_end_is_a_warning(site: SiteSpec) -> None:
    data = {**BASE, "jobs": [{"id": "late", "n_cards": 8, "duration_s": 10, "submit_time_s": 300}]}
    warned: list[str] = []
    sc = run_scenario_from_dict(data, source="x.toml", site=site, duration_s=60.0, warn=warned.append)
    assert warned == [
        "x.toml: jobs[0].submit_time_s: 300 s is at or after the end of this run (60 s, shortened from 600 s): "
        "the job is not submitted"
    ]
    assert [j.job_id for j in sc.jobs] == ["late"] and sc.warnings == tuple(warned)
    # many such jobs (a demo shortened with --minutes): one line, not one per job
    many = {
        **BASE,
        "jobs": [{"id": f"j{i}", "n_cards": 8, "duration_s": 10, "submit_time_s": 100 + i} for i in range(5)],
    }
    assert run_scenario_from_dict(many, source="x.toml", site=site, duration_s=60.0).warnings == (
        "x.toml: 5 listed jobs are submitted at or after the end of this run (60 s, shortened from 600 s): "
        "they are not submitted",
    )


def test_a_tolerance_no_seed_meets_fails_fast_naming_the_closest_offer(site: SiteSpec) -> None:
    """A cold 10-minute run offers far less than 100% whatever the seed: refused after a bounded
    search, with the closest offer found (it used to try 1,000 seeds, 81 s for a day)."""
    data = {
        "name": "x",
        "duration_s": 600.0,
        "workload": {"warm_start": False, "target_allocation": 1.0, "allocation_tolerance": 0.01},
    }
    with pytest.raises(SpecError) as info:
        run_scenario_from_dict(data, source="x.toml", site=site)
    msg = str(info.value)
    assert msg.startswith("x.toml: workload.allocation_tolerance: no workload seed in 0..199 offers 1 +- 0.01; ")
    closest = re.search(r"the closest, seed (\d+), offers (0\.\d{4}) \((0\.\d{4}) off\)$", msg)
    assert closest is not None, msg
    seed, offer, miss = int(closest[1]), float(closest[2]), float(closest[3])
    plain = {"warm_start": False, "target_allocation": 1.0}
    one = run_scenario_from_dict({**data, "seed": seed, "workload": plain}, source="x", site=site)
    assert one.offered_allocation == pytest.approx(offer, abs=1e-4) and miss == pytest.approx(1.0 - offer, abs=1e-4)


def test_the_workload_line_says_when_a_seed_draws_another_seeds_jobs() -> None:
    """allocation_tolerance maps seeds 11-13 of the nominal day to workload seed 13: the same jobs.
    The line `racktwin sim` and `racktwin evaluate` print says so where the seed given is not the one used."""
    day = EXAMPLES / "day-nominal.toml"
    eleven, thirteen = load_run_scenario(day, seed=11), load_run_scenario(day, seed=13)
    assert eleven.jobs == thirteen.jobs and eleven.workload_seed == thirteen.workload_seed == 13
    assert eleven.seed == 11 and eleven.plant_config.seed == 11  # the noise and the card spread still differ
    assert "workload seed 13 offering 63.6% (the first from seed 11 within 65% +- 2%: seeds 11..13 all draw" in (
        eleven.workload
    )
    assert "seed 13 offering 63.6%, warm start" in thirteen.workload and "seeds" not in thirteen.workload


def test_compute_share_range_sets_the_generated_jobs_mix_and_nothing_else(site: SiteSpec) -> None:
    base = {"name": "x", "duration_s": 3600.0, "seed": 3}
    default = run_scenario_from_dict(base, source="x", site=site)
    explicit = run_scenario_from_dict({**base, "workload": {"compute_share_range": [0.6, 0.87]}}, source="x", site=site)
    assert explicit.jobs == default.jobs  # the default is the generator's (0.60, 0.87)
    assert {round(j.compute_share, 9) for j in default.jobs} != {0.87}
    pinned = run_scenario_from_dict({**base, "workload": {"compute_share_range": [0.87, 0.87]}}, source="x", site=site)
    assert {j.compute_share for j in pinned.jobs} == {0.87}
    assert all(j.noncompute_utilization == 1.0 for j in pinned.jobs)  # the profile's own share: all busy
    same = ("job_id", "n_cards", "submit_time_s", "duration_s", "step_time_s", "checkpoint_duration_s", "priority")
    assert [[getattr(j, k) for k in same] for j in pinned.jobs] == [[getattr(j, k) for k in same] for j in default.jobs]
    assert pinned.running_at_start == default.running_at_start


def test_listed_running_jobs_are_placed_before_a_generated_warm_start(site: SiteSpec) -> None:
    """A generated warm start whose running jobs need more than the site leaves the rest queued at t = 0
    (a queue, as on a real site); a job listed as running is running."""
    data = {
        "name": "x",
        "duration_s": 600.0,
        "seed": 1,
        "jobs": [{"id": "whole", "n_cards": 512, "duration_s": 3600.0, "running_at_start": True}],
    }
    sc = run_scenario_from_dict(data, source="x", site=site)
    assert sc.running_at_start[0] == "whole" and len(sc.running_at_start) > 1
    plant = build_plant(sc)
    assert [j.job_id for j in plant.running_jobs()] == ["whole"]
    assert {j.job_id for j in plant.queued_jobs()} >= set(sc.running_at_start[1:])


def test_a_trace_checkpoint_longer_than_its_interval_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share,checkpoint_interval_s,checkpoint_duration_s\n"
        "x,0,8,100,1,0.5,600,601\n"
    )
    (tmp_path / "s.toml").write_text(
        f'name = "t"\nduration_s = 60\nsite = "{(EXAMPLES / "supernode-512.toml").as_posix()}"\n'
        '[workload]\nsource = "trace"\ntrace = "t.csv"\n'
    )
    with pytest.raises(SpecError, match=r"t\.csv:2: column 'checkpoint_duration_s': a checkpoint of 601 s would hold"):
        load_run_scenario(tmp_path / "s.toml")


def test_a_phase_model_refuses_a_stall_shape_that_overflows() -> None:
    with pytest.raises(ValueError, match=r"stall_sigma must be within 0\.\.3"):
        PhaseModel(stall_sigma=50.0)
    assert PhaseModel(stall_sigma=3.0).stall_fraction() > 0


# ---- limits, keys that do not apply, misplaced files -------------------------------------------


def test_a_run_is_at_most_a_year_in_the_file_and_as_an_override(site: SiteSpec) -> None:
    """The longest run is one year, whether the file or an override (``--duration`` of sim and
    evaluate) asks for it: a longer one used to reach the generator (108 GiB for 1e12 s: a
    MemoryError traceback) or run practically forever with a listed workload."""
    assert MAX_DURATION_S == 365 * 86400.0
    year = f"at most {MAX_DURATION_S:.0f} s (365 days)"
    msg = _bad(site, {"duration_s": 4e7})
    assert msg.startswith("bad.toml: duration_s: 40000000 s is longer than a run may be: ") and year in msg, msg
    for too_long in (MAX_DURATION_S + 1.0, 1e12, 1e15):
        with pytest.raises(SpecError) as info:
            run_scenario_from_dict(BASE, source="x.toml", site=site, duration_s=too_long)
        msg = str(info.value)
        assert msg.startswith(
            f"x.toml: duration_s: {too_long:.10g} s (the duration asked for in place of the file's, e.g. --duration) "
        ), msg
        assert year in msg, msg
    with pytest.raises(SpecError, match=re.escape(year)):  # the embedded default of `racktwin sim` too
        default_run_scenario(site, 1e12)
    assert run_scenario_from_dict(BASE, source="x", site=site, duration_s=MAX_DURATION_S).duration_s == MAX_DURATION_S


def test_a_generated_workload_too_large_to_hold_is_refused_before_it_is_drawn(site: SiteSpec) -> None:
    """A day of 1,953 supernodes (the most a site may have: twin.spec.MAX_SITE_CARDS) would be ~1.7e7
    jobs: refused from the expected count, at once, naming the count and the limit (and what to
    change), instead of failing to allocate."""
    data = {"name": "big", "duration_s": 86400.0, "supernodes": 1_953}
    with pytest.raises(SpecError) as info:
        run_scenario_from_dict(data, source="big.toml", site=site)
    msg = str(info.value)
    assert msg.startswith("big.toml: workload: the generator would draw about ") and "jobs" in msg, msg
    assert f"at most {MAX_GENERATED_JOBS:,}" in msg and "999,936 cards" in msg, msg
    # listed jobs only: nothing is generated, nothing refused
    assert run_scenario_from_dict({**data, "workload": {"source": "none"}}, source="x", site=site).jobs == ()


@pytest.mark.parametrize(
    ("section", "typo", "meant"),
    [
        ("ambient", "ambiant", "ambient"),
        ("faults", "fault", "faults"),
        ("jobs", "job", "jobs"),
        ("jobs", "Jobs", "jobs"),
        ("phases", "phase", "phases"),
        ("workload", "workloads", "workload"),
    ],
)
def test_a_misspelt_section_is_pointed_at_the_section(site: SiteSpec, section: str, typo: str, meant: str) -> None:
    """The sections decoded apart from the top level (ambient, phases, jobs, faults) are known keys
    too: `[ambiant]` used to get "did you mean 'plant'?", `[[fault]]` a list without 'faults'."""
    value: Any = [{"id": "a"}] if section in ("jobs", "faults") else {}
    msg = _bad(site, {typo: value})
    assert msg == f"bad.toml: {typo}: unknown key; did you mean '{meant}'?", msg


def test_the_known_keys_of_a_scenario_list_every_section(site: SiteSpec) -> None:
    msg = _bad(site, {"zzz": 1})
    assert msg.startswith("bad.toml: zzz: unknown key; known keys here: "), msg
    known = msg.split("known keys here: ", 1)[1].split(", ")
    assert {"name", "duration_s", "workload", "plant", "targets", "ambient", "phases", "jobs", "faults"} <= set(known)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"ambient": {"knd": "constant"}}, "ambient.knd", "did you mean 'kind'?"),
        (fault(kind="heat_wave", start_s=0, peak_delta_k=5, knd="x"), "faults[0].knd", "did you mean 'kind'?"),
    ],
)
def test_a_misspelt_kind_is_pointed_at_kind(site: SiteSpec, change: dict[str, Any], field: str, words: str) -> None:
    msg = _bad(site, change)
    assert msg.startswith(f"bad.toml: {field}: unknown key; {words}"), msg


def test_a_site_spec_given_as_a_scenario_says_so() -> None:
    """`racktwin sim --scenario SITE.toml` (sim takes both --site and --scenario) used to say
    `pue_target: unknown key; did you mean 'targets'?`."""
    path = EXAMPLES / "supernode-512.toml"
    with pytest.raises(SpecError) as info:
        load_run_scenario(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: this looks like a site spec ([card], [cold_plate], [rack], "), msg
    assert msg.endswith(
        "not a run scenario: name it in a run scenario's `site` key (racktwin sim also takes it with --site)"
    )


@pytest.mark.parametrize(
    ("workload", "field", "words"),
    [
        ({"source": "none", "target_allocation": 0.9}, "workload.target_allocation",
         "only used with source = 'generate'"),
        ({"source": "none", "max_cards": 16}, "workload.max_cards", "only used with source = 'generate'"),
        ({"source": "none", "warm_start": False}, "workload.warm_start", "only used with source = 'generate'"),
        ({"source": "none", "duration_scale": 2.0}, "workload.duration_scale", "only used with source = 'generate'"),
        ({"source": "none", "seed": 4}, "workload.seed", "only used with source = 'generate'"),
        ({"source": "none", "time_offset_s": 60.0}, "workload.time_offset_s", "only used with source = 'trace'"),
        ({"source": "none", "trace": "t.csv"}, "workload.trace", "only used with source = 'trace'"),
        ({"source": "trace", "trace": "t.csv", "target_allocation": 0.9}, "workload.target_allocation",
         "only used with source = 'generate'"),
        ({"time_offset_s": 60.0}, "workload.time_offset_s", "only used with source = 'trace'"),
    ],
)  # fmt: skip
def test_workload_keys_of_another_source_are_refused(
    site: SiteSpec, workload: dict[str, Any], field: str, words: str
) -> None:
    """A key the chosen source does not read was silently ignored (`source = "none"` with
    `target_allocation = 0.9` ran the listed jobs only); now refused, as `trace` with `generate` was."""
    msg = _bad(site, {"workload": workload})
    assert msg.startswith(f"bad.toml: {field}: {words}"), msg


def test_an_external_timeout_with_builtin_placement_is_refused(site: SiteSpec) -> None:
    msg = _bad(site, {"plant": {"placement": "builtin", "external_timeout_s": 60.0}})
    assert msg.startswith("bad.toml: plant.external_timeout_s: only used with placement = 'external'"), msg
    # either setting alone is fine
    for plant in ({"placement": "builtin"}, {"external_timeout_s": 60.0}):
        assert run_scenario_from_dict({**BASE, "plant": plant}, source="x", site=site).name == "bad"


def test_input_files_are_the_files_the_scenario_was_read_from(tmp_path: Path) -> None:
    """What `racktwin sim` keeps its outputs off: the scenario, its site spec and its trace."""
    sc = load_run_scenario(EXAMPLES / "sim-trace.toml", duration_s=60.0)
    assert sc.input_files == (
        EXAMPLES / "sim-trace.toml",
        EXAMPLES / "supernode-512.toml",
        EXAMPLES / "sim-trace.csv",
    )
    given = load_run_scenario(EXAMPLES / "sim-trace.toml", duration_s=60.0, site=sc.site)
    assert given.input_files == (EXAMPLES / "sim-trace.toml", EXAMPLES / "sim-trace.csv")  # the caller's site


# ---- where the jobs come from: bounds and rules (expected values worked out by hand) ------------


def test_max_cards_is_a_whole_number_of_hosts_from_one_host_to_the_site(site: SiteSpec) -> None:
    """`max_cards` bounds every generated job; 8 (one host) and the site's 512 cards are both allowed
    (docs/sim.md: "8 (one host) up to the site's cards"); a size between two whole hosts is refused
    (12 acted as 8: the generator's sizes are multiples of 8)."""
    base = {"name": "x", "duration_s": 3600.0, "seed": 3}
    one_host = run_scenario_from_dict({**base, "workload": {"max_cards": 8}}, source="x", site=site)
    assert one_host.jobs and {j.n_cards for j in one_host.jobs} == {8}
    assert max(j.n_cards for j in run_scenario_from_dict(base, source="x", site=site).jobs) > 8  # the default's are not
    whole_site = run_scenario_from_dict({**base, "workload": {"max_cards": 512}}, source="x", site=site)
    assert whole_site.jobs and max(j.n_cards for j in whole_site.jobs) <= 512
    msg = _bad(site, {"workload": {"max_cards": 12}}, base={**base, "name": "bad"})
    assert msg == (
        "bad.toml: workload.max_cards: must be a whole number of hosts (8 cards each: the generator's sizes are "
        "multiples of 8), got 12 (it would act as 8)"
    ), msg


def test_the_smallest_duration_scale_is_one_sixtieth(site: SiteSpec) -> None:
    """docs/sim.md: duration_scale is at least 1/60, so that the shortest generated job (60 s of
    training before scaling) lasts one plant step: 1/60 itself is allowed."""
    data = {"name": "x", "duration_s": 600.0, "seed": 1, "workload": {"duration_scale": 1 / 60}}
    sc = run_scenario_from_dict(data, source="x", site=site)
    fresh = [j for j in sc.jobs if j.job_id not in sc.running_at_start]
    assert fresh and min(j.duration_s for j in fresh) >= 1.0 - 1e-9


@pytest.mark.parametrize(
    ("supernodes", "duration_s", "workload", "refused"),
    [
        # docs/sim.md and MAX_GENERATED_JOBS: a year of 4 supernodes (2,048 cards) at 65% fits
        # (measured: 1.53 million jobs); at 100% it is ~1.53 / 0.65 = 2.35 million: refused
        (4, 365 * 86400.0, {}, False),
        (4, 365 * 86400.0, {"target_allocation": 1.0}, True),
        # a year of the example site is ~380,000 jobs: ~742 per card over a year and its 625,800 s
        # window, so the window alone is ~14.4 per card; 400 supernodes (204,800 cards): ~2.96
        # million for a warm-started minute (refused), ~280 for a cold one
        (400, 60.0, {}, True),
        (400, 60.0, {"warm_start": False}, False),
    ],
)
def test_the_generated_count_is_judged_from_the_rate_the_target_and_the_warm_start_window(
    site: SiteSpec, supernodes: int, duration_s: float, workload: dict[str, Any], refused: bool
) -> None:
    """Judged before drawing (the accepted cases are not drawn here: a year of 2,048 cards takes ~47 s)."""
    big = site.with_supernodes(supernodes)
    w = decode_table(WorkloadSection, workload, "x.toml", "workload")
    cfg = generator_config(big, w, PhaseModel(), "x.toml")
    if not refused:
        check_generated_count(big, duration_s, w, cfg, "x.toml")
        return
    with pytest.raises(SpecError, match=r"^x\.toml: workload: the generator would draw about "):
        check_generated_count(big, duration_s, w, cfg, "x.toml")


def test_a_tolerance_no_seed_meets_names_the_closest_of_all_seeds_tried(site: SiteSpec) -> None:
    """A cold 10-minute run offers less than 100% whatever the seed, so the closest is the largest
    offer: the seed named offers at least as much as each of the first ten seeds tried."""
    data = {
        "name": "x",
        "duration_s": 600.0,
        "workload": {"warm_start": False, "target_allocation": 1.0, "allocation_tolerance": 0.01},
    }
    with pytest.raises(SpecError) as info:
        run_scenario_from_dict(data, source="x.toml", site=site)
    closest = re.search(r"the closest, seed (\d+), offers (0\.\d{4})", str(info.value))
    assert closest is not None, str(info.value)
    plain = {"warm_start": False, "target_allocation": 1.0}
    offers = [
        run_scenario_from_dict({**data, "seed": s, "workload": plain}, source="x", site=site).offered_allocation
        for s in range(10)
    ]
    assert all(a < 0.99 for a in offers)
    assert float(closest[2]) >= round(max(offers), 4)


def test_offered_allocation_counts_each_job_from_submission_for_its_expected_wall_time() -> None:
    """Without stalls, a job of d s of training holds its cards startup + d x (1 + checkpoint / interval):
    100 + 900 x (1 + 90/900) = 1,090 s; the run's end cuts it, and a job submitted at or after the
    end (a trace reaching past it) holds nothing. 16 cards x 2,000 s = 32,000 card-seconds."""
    ph = PhaseModel(startup_s=100.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)

    def job(job_id: str, n_cards: int, submit_s: float) -> JobSpec:
        return JobSpec(
            job_id, n_cards, work_steps=450.0, step_time_s=2.0, compute_share=0.8, submit_time_s=submit_s,
            checkpoint_interval_s=900.0, checkpoint_duration_s=90.0,
        )  # fmt: skip

    whole = job("whole", 8, 0.0)  # 8 x 1,090 = 8,720 card-s
    cut = job("cut", 8, 1500.0)  # 8 x (2,000 - 1,500) = 4,000 card-s
    at_end, past_end = job("at-end", 16, 2000.0), job("past-end", 16, 2500.0)  # nothing
    assert offered_allocation([whole], 16, 2000.0, ph) == pytest.approx(8720.0 / 32000.0)
    assert offered_allocation([whole, cut, at_end, past_end], 16, 2000.0, ph) == pytest.approx(12720.0 / 32000.0)
    assert offered_allocation([past_end], 16, 2000.0, ph) == 0.0


def test_a_scenarios_offered_allocation_uses_its_own_phases(site: SiteSpec) -> None:
    """With a day of start-up ([phases] startup_s = 86400) every job of an hour's run holds its cards
    from its submission to the end: the offer is sum(n_cards x (3600 - submit)) / (512 x 3600)
    (with the default phases most of these jobs would end within the hour)."""
    data = {"name": "x", "duration_s": 3600.0, "seed": 3, "phases": {"startup_s": 86400.0}}
    sc = run_scenario_from_dict(data, source="x", site=site)
    by_hand = sum(j.n_cards * (3600.0 - j.submit_time_s) for j in sc.jobs) / (512 * 3600.0)
    assert sc.offered_allocation == pytest.approx(by_hand, rel=1e-12)


def test_a_warm_start_draws_one_scaled_longest_run_time_before_t0_and_keeps_the_work_left(site: SiteSpec) -> None:
    """The warm-start rule (docs/sim.md, `warm_start`) checked against the generator's own draw: arrivals
    come from one longest run time (x duration_scale) plus the start-up before t = 0; one that arrived
    at t < 0 and whose expected wall time reaches past 0 runs from 0 with the share of its training
    still to go (its wall time left / its wall time), and its first checkpoint here completes the
    interval its training so far began (training gone by + first checkpoint = a whole number of
    intervals); the others arrive at their time minus the window."""
    data = {"name": "x", "duration_s": 600.0, "seed": 5, "workload": {"duration_scale": 2.0}}
    sc = run_scenario_from_dict(data, source="x", site=site)
    ph = PhaseModel()
    window_s = 2.0 * KALOS.max_run_time_s + ph.startup_s
    cfg = GeneratorConfig(duration_scale=2.0, phases=ph)
    drawn = generate_jobs(site.n_cards, window_s + 600.0, 5, cfg)
    got = {j.job_id: j for j in sc.jobs}
    running: list[str] = []
    for orig in drawn:
        t = orig.submit_time_s - window_s
        if t >= 0.0:
            assert got[orig.job_id] == dataclasses.replace(orig, submit_time_s=t)
            continue
        wall = ph.expected_wall_time_s(orig.duration_s, orig.checkpoint_interval_s, orig.checkpoint_duration_s)
        if t + wall <= 0.0:
            assert orig.job_id not in got  # ended before t = 0
            continue
        running.append(orig.job_id)
        job = got[orig.job_id]
        assert job.submit_time_s == 0.0
        assert job.duration_s == pytest.approx(orig.duration_s * (t + wall) / wall, rel=1e-9)
        first = job.first_checkpoint_after_s
        assert first is not None and 0.0 < first <= orig.checkpoint_interval_s
        intervals = (orig.duration_s - job.duration_s + first) / orig.checkpoint_interval_s
        assert intervals == pytest.approx(round(intervals), abs=1e-6) and round(intervals) >= 1
    assert sc.running_at_start == tuple(running) and len(running) >= 5
    assert len(sc.jobs) == len(got)  # no job twice


def test_the_workload_line_of_a_cold_start_says_no_warm_start(site: SiteSpec) -> None:
    data = {"name": "x", "duration_s": 600.0, "seed": 3, "workload": {"warm_start": False}}
    sc = run_scenario_from_dict(data, source="x", site=site)
    assert sc.workload == "generated (AcmeTrace Kalos, 65% allocation, seed 3)"
    assert run_scenario_from_dict({**data, "workload": {}}, source="x", site=site).workload == (
        "generated (AcmeTrace Kalos, 65% allocation, seed 3, warm start)"
    )
    # the target as given, as the tolerance's clause writes it (it read "66%" for 0.655)
    half = run_scenario_from_dict({**data, "workload": {"target_allocation": 0.655}}, source="x", site=site)
    assert half.workload.startswith("generated (AcmeTrace Kalos, 65.5% allocation, seed 3")


def test_time_offset_s_delays_every_traced_submission(site: SiteSpec) -> None:
    """examples/sim-trace.csv submits at 0, 0, 120, 300, 330, 600, 660, 900 and 1500 s; 100 s later
    with time_offset_s = 100."""
    data: dict[str, Any] = {
        "name": "x",
        "duration_s": 3600.0,
        "workload": {"source": "trace", "trace": "sim-trace.csv"},
    }
    plain = run_scenario_from_dict(data, source="x", base_dir=EXAMPLES, site=site)
    assert [j.submit_time_s for j in plain.jobs] == [0.0, 0.0, 120.0, 300.0, 330.0, 600.0, 660.0, 900.0, 1500.0]
    later = {**data, "workload": {**data["workload"], "time_offset_s": 100.0}}
    sc = run_scenario_from_dict(later, source="x", base_dir=EXAMPLES, site=site)
    assert [j.submit_time_s for j in sc.jobs] == [100.0, 100.0, 220.0, 400.0, 430.0, 700.0, 760.0, 1000.0, 1600.0]
    assert [dataclasses.replace(j, submit_time_s=0.0) for j in sc.jobs] == [
        dataclasses.replace(j, submit_time_s=0.0) for j in plain.jobs
    ]


def test_two_listed_jobs_after_a_shortened_end_are_one_warning_line(site: SiteSpec) -> None:
    data = {**BASE, "jobs": [{"id": f"j{i}", "n_cards": 8, "duration_s": 10, "submit_time_s": 100 + i} for i in (0, 1)]}
    assert run_scenario_from_dict(data, source="x.toml", site=site, duration_s=60.0).warnings == (
        "x.toml: 2 listed jobs are submitted at or after the end of this run (60 s, shortened from 600 s): "
        "they are not submitted",
    )


def test_a_listed_job_at_the_files_own_end_is_an_error_even_in_a_shortened_run(site: SiteSpec) -> None:
    """Only a job that the file's own duration reaches is a warning when an override shortens the run;
    one submitted at the file's end (600 s) is never submitted in either run."""
    data = {**BASE, "jobs": [{"id": "a", "n_cards": 8, "duration_s": 10, "submit_time_s": 600}]}
    with pytest.raises(SpecError, match=r"^x\.toml: jobs\[0\]\.submit_time_s: 600 s is at or after the end of the run"):
        run_scenario_from_dict(data, source="x.toml", site=site, duration_s=60.0)
    late = {**BASE, "jobs": [{"id": "a", "n_cards": 8, "duration_s": 10, "submit_time_s": 599}]}
    assert len(run_scenario_from_dict(late, source="x.toml", site=site, duration_s=60.0).warnings) == 1


def test_every_key_of_a_listed_job_reaches_the_job(site: SiteSpec) -> None:
    """A fresh listed job checkpoints after a whole interval (first_checkpoint_after_s None); its
    work is duration_s / step_time_s = 3,000 / 1.5 = 2,000 steps."""
    entry = {
        "id": "a" * 128,  # the longest id: 128 characters
        "n_cards": 16,
        "duration_s": 3000.0,
        "step_time_s": 1.5,
        "compute_share": 0.55,
        "priority": 3.0,
        "submit_time_s": 45.0,
        "checkpoint_interval_s": 1200.0,
        "checkpoint_duration_s": 30.0,
        "noncompute_utilization": 0.35,
        "min_throughput_frac": 0.6,
    }
    sc = run_scenario_from_dict({**BASE, "jobs": [entry]}, source="x.toml", site=site)
    assert sc.jobs == (
        JobSpec(
            "a" * 128, 16, work_steps=2000.0, step_time_s=1.5, compute_share=0.55, priority=3.0, submit_time_s=45.0,
            checkpoint_interval_s=1200.0, checkpoint_duration_s=30.0, noncompute_utilization=0.35,
            min_throughput_frac=0.6, first_checkpoint_after_s=None,
        ),
    )  # fmt: skip
    assert sc.running_at_start == ()


def test_a_listed_running_jobs_first_checkpoint_is_drawn_from_the_seed_and_the_id(site: SiteSpec) -> None:
    data = {
        **BASE,
        "jobs": [{"id": i, "n_cards": 8, "duration_s": 3600.0, "running_at_start": True} for i in ("a", "b")],
    }

    def firsts(seed: int) -> list[float | None]:
        return [j.first_checkpoint_after_s for j in run_scenario_from_dict(data, source="x", site=site, seed=seed).jobs]

    one, other = firsts(1), firsts(2)
    assert all(f is not None and 0.0 < f <= 900.0 for f in [*one, *other])
    assert one[0] != one[1]  # another id, another draw
    assert one[0] != other[0] and one[1] != other[1]  # another seed, another draw
    assert firsts(1) == one


def test_a_listed_jobs_problem_names_its_own_index_after_a_traced_workload(site: SiteSpec) -> None:
    """Behind the trace's 9 jobs, the listed jobs are still jobs[0], jobs[1], ... of the file."""
    base = {"name": "bad", "duration_s": 3600.0, "workload": {"source": "trace", "trace": "sim-trace.csv"}}
    ok = {"id": "ok", "n_cards": 8, "duration_s": 10}
    for listed, field, words in [
        (
            [ok, {"id": "big", "n_cards": 1024, "duration_s": 10}],
            "jobs[1].n_cards",
            "needs 1024 cards, the site has 512",
        ),
        ([{**ok, "id": "debug"}], "jobs[0].id", "duplicate job id 'debug'"),  # a job id of the trace
    ]:
        with pytest.raises(SpecError) as info:
            run_scenario_from_dict({**base, "jobs": listed}, source="bad.toml", base_dir=EXAMPLES, site=site)
        assert str(info.value).startswith(f"bad.toml: {field}: ") and words in str(info.value), str(info.value)
