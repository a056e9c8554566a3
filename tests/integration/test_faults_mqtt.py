"""Every fault of the day-fault scenarios through the MQTT path: the simulator (``python -m sim``, a child
process) and the agent service (enforce mode, its default control configuration, clock scaled to the
simulator's speed) over a real mosquitto, in accelerated site time.

A small site (2 racks of 16 cards, host overhead and rack limit scaled from the example site so that
the limit binds) at full load keeps each run to a few seconds; the full numbers on the 512-card site
come from ``benchmarks/bench_evaluate.py --faults``. What users rely on, judged on the simulator's
truth log: no rack over its limit for longer than two control periods, no die over its maximum, the
service runs to a clean stop, and it did what the fault calls for (fail-safe caps on a silent or
stuck rack, bad readings refused).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from site_testing import write_capped_small_site

from agent.broker import EmbeddedBroker
from agent.commands.demo import MqttRun, run_closed_loop
from agent.config import ControlConfig
from twin.scenario import load_run_scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LIMIT_W = 12_500.0
SPEED = 30.0  # a command lives 30 s = 1 s of wall time: at 60x a loaded machine let most expire
DURATION_S = 240.0
PERIOD_S = ControlConfig().period_s

FAULTS: dict[str, str] = {
    "heat-wave": """
[[faults]]
kind = "heat_wave"
start_s = 40.0
peak_delta_k = 12.0
ramp_s = 40.0
hold_s = 120.0
""",
    "pump": """
[[faults]]
kind = "pump_degradation"
rack = "r1"
start_s = 40.0
flow_fraction = 0.3
ramp_s = 30.0
""",
    "dropout": """
[[faults]]
kind = "sensor_dropout"
rack = "r1"
start_s = 60.0
end_s = 150.0
""",
    "stuck": """
[[faults]]
kind = "stuck_sensor"
rack = "r0"
start_s = 40.0
end_s = 160.0

[[faults]]
kind = "stuck_sensor"
rack = "r1"
card = 20
start_s = 40.0
""",
    "card-failure": """
[[faults]]
kind = "card_failure"
card = 3
at_s = 40.0

[[faults]]
kind = "card_failure"
card = 20
at_s = 60.0
repair_after_s = 60.0
""",
    "garbage": """
[[faults]]
kind = "garbage_readings"
rack = "r1"
start_s = 40.0
end_s = 120.0
mode = "nan"
fraction = 0.5

[[faults]]
kind = "garbage_readings"
rack = "r0"
start_s = 130.0
end_s = 190.0
mode = "garbage"
fraction = 1.0
""",
}


def write_site(folder: Path) -> Path:
    return write_capped_small_site(folder, LIMIT_W)


def write_scenario(folder: Path, kind: str) -> Path:
    """Full load (compute-bound jobs on every card) on the small site, a warm afternoon, one fault kind."""
    write_site(folder)
    jobs = "".join(
        f"""
[[jobs]]
id = "{name}"
n_cards = 8
duration_s = 100000.0
step_time_s = {step}
compute_share = 0.97
noncompute_utilization = 0.9
priority = {prio}
min_throughput_frac = {slo}
running_at_start = true
"""
        for name, step, prio, slo in (
            ("a", 2.0, 2.0, 0.9),
            ("b", 1.5, 1.0, 0.7),
            ("c", 1.0, 1.0, 0.0),
            ("d", 3.0, 0.5, 0.0),
        )
    )
    text = f"""name = "faults-{kind}"
site = "site.toml"
duration_s = {DURATION_S}
seed = 9
[workload]
source = "none"
[ambient]
kind = "constant"
temp_c = 30.0
{FAULTS[kind]}
{jobs}"""
    path = folder / f"{kind}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def open_files_in(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open (Linux: /proc/self/fd)."""
    held = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(folder)):
                held.append(target)
    return held


async def run_fault(broker: EmbeddedBroker, folder: Path, kind: str) -> tuple[MqttRun, Any]:
    """One closed loop in this process; it gives the caller's logging back and leaves no file open
    (the tests run six loops in one process, as benchmarks/bench_evaluate.py does)."""
    path = write_scenario(folder, kind)
    scenario = load_run_scenario(path)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    res = await run_closed_loop(path, scenario, broker.url, folder, speed=SPEED)
    assert root.handlers == handlers and root.level == level
    assert open_files_in(folder) == []
    return res, scenario


@pytest.mark.parametrize("kind", list(FAULTS))
async def test_the_service_survives_the_fault_within_the_limits(
    kind: str, mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    res, scenario = await run_fault(mosquitto, tmp_path, kind)
    m = res.metrics
    assert res.stopped_by == "duration" and res.agent_error == "" and res.sim_returncode == 0
    assert m["duration_s"] >= DURATION_S - 1.0
    assert res.decisions >= DURATION_S / PERIOD_S  # it kept deciding through the fault
    # no rack over its limit for longer than two control periods; no die over its maximum
    assert m["limit_violation_longest_s"] <= 2 * PERIOD_S, m
    assert m["max_die_temp_c"] < scenario.site.card.max_temp_c
    if kind in ("dropout", "stuck"):
        rack = "r1" if kind == "dropout" else "r0"
        assert rack in res.failsafe_racks, res
    if kind == "garbage":
        assert res.invalid_readings + res.rejected_messages > 0, res
    if kind == "card-failure":
        # the job of the failed card rolled back and was queued again; no command reached a failed card
        assert res.sim_summary["lost_work_card_s"] > 0
        assert not any("has failed" in r for r in res.sim_summary["command_refusals"]), res.sim_summary


def test_the_fault_scenarios_of_the_benchmark_load_and_name_their_faults() -> None:
    kinds = {
        "heat-wave": {"HeatWave"},
        "pump": {"PumpDegradation"},
        "dropout": {"SensorDropout"},
        "stuck": {"StuckSensor"},
        "card-failure": {"CardFailure"},
        "garbage": {"GarbageReadings"},
    }
    for kind, classes in kinds.items():
        sc = load_run_scenario(REPO / "examples" / f"day-fault-{kind}.toml")
        assert {type(f).__name__ for f in sc.faults} == classes
        assert sum(j.n_cards for j in sc.jobs) == sc.site.n_cards  # full load: the limits bind
