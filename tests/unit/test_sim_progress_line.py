"""The progress line of ``racktwin sim`` (sim/runner.py, docs/sim.md) writes its counts as the final
report does (tests/unit/test_sim_report.py): with thousands separators, so that ``1,373 applied``
reads next to ``msgs 114,295``, not ``1373 applied``."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from agent import wire
from agent.mqtt_options import MqttOptions
from sim.runner import SimOptions, Simulator, _Progress, speed_text
from twin.scenario import load_run_scenario

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_progress_line_has_thousands_separators_in_every_count(tmp_path: Path) -> None:
    scen = tmp_path / "quiet.toml"
    scen.write_text(
        f'name = "quiet"\nsite = "{EXAMPLES / "supernode-512.toml"}"\nduration_s = 60.0\n[workload]\nsource = "none"\n'
    )
    sim = Simulator(SimOptions(scenario=load_run_scenario(scen), mqtt=MqttOptions(), start_epoch_s=0.0))
    sim.messages_published = 114_295
    counts = sim.commands.counts
    counts.applied, counts.rejected, counts.expired = 1_373, 2_001, 1_002
    sim.codec.counter = wire.RejectionCounter(logger=logging.getLogger("test-quiet"))
    for _ in range(1_234):
        sim.codec.counter.record(wire.Rejection(wire.RejectReason.MALFORMED_JSON, "not JSON", "racktwin/site1/x"))
    lines: list[str] = []
    # an interval of 0: the line is due at once (nothing here depends on how long anything took)
    _Progress(sim, time.monotonic(), lines.append, 0.0).maybe()
    assert len(lines) == 1, lines
    assert "msgs 114,295 (" in lines[0]
    assert "commands 1,373 applied / 2,001 rejected / 1,002 expired, bad messages 1,234" in lines[0]


def test_the_progress_lines_speeds_have_thousands_separators_as_the_demos_and_evaluates(tmp_path: Path) -> None:
    """A run far faster than real time (speed 0: thousands of site seconds per wall second), or one
    asked for 2,000x that cannot keep up: its speeds read ``12,345.00x`` and ``2,000x``, as the final
    report's ``(12,345.00x)`` and the demo's and evaluate's ``12,345x real time``."""
    scen = tmp_path / "quiet.toml"
    scen.write_text(
        f'name = "quiet"\nsite = "{EXAMPLES / "supernode-512.toml"}"\nduration_s = 60.0\n[workload]\nsource = "none"\n'
    )
    options = SimOptions(scenario=load_run_scenario(scen), mqtt=MqttOptions(), start_epoch_s=0.0, speed=2_000.0)
    sim = Simulator(options)
    sim.behind_s = 1_234.5
    lines: list[str] = []
    progress = _Progress(sim, 0.0, lines.append, 1.0)
    progress.last_t = sim.plant.time_s - 12_345.0  # 12,345 site seconds in the one wall second to 1.0
    progress._line(1.0)
    assert len(lines) == 1, lines
    assert " speed 12,345.00x, " in lines[0]
    assert lines[0].endswith("; BEHIND by 1,234.5 s: cannot keep up with speed 2,000x (physics not skipped)")


def test_a_speed_far_beyond_what_the_loop_reaches_reads_in_digits_not_an_exponent(tmp_path: Path) -> None:
    """``--speed 1e9`` (a rate no run reaches: it runs as fast as it can and says how far behind) reads
    ``1,000,000,000x`` in the BEHIND line, as the speeds beside it, not ``1e+09x``."""
    scen = tmp_path / "quiet.toml"
    scen.write_text(
        f'name = "quiet"\nsite = "{EXAMPLES / "supernode-512.toml"}"\nduration_s = 60.0\n[workload]\nsource = "none"\n'
    )
    options = SimOptions(scenario=load_run_scenario(scen), mqtt=MqttOptions(), start_epoch_s=0.0, speed=1e9)
    sim = Simulator(options)
    sim.behind_s = 59.5
    lines: list[str] = []
    _Progress(sim, 0.0, lines.append, 1.0)._line(1.0)
    assert lines[0].endswith("; BEHIND by 59.5 s: cannot keep up with speed 1,000,000,000x (physics not skipped)")


@pytest.mark.parametrize(
    ("speed", "text"),
    [
        (0.0, "as fast as possible"),
        (float("inf"), "as fast as possible"),
        (1e9, "1,000,000,000x"),
        (123_456_789.0, "123,457,000x"),  # six significant digits
        (2_000.0, "2,000x"),
        (60.0, "60x"),
        (1.5, "1.5x"),
        (1e-7, "0.0000001x"),
        (1e-9, "0.000000001x"),
        # beyond 1e12 and below 1e-9, an exponent: --speed 1e300 was written in 301 digits
        (999_999_999_999.0, "1e12x (out of reach: as fast as it can)"),  # as rounded to six digits
        (1.5e15, "1.5e15x (out of reach: as fast as it can)"),
        (1e300, "1e300x (out of reach: as fast as it can)"),
        (1.7976931348623157e308, "1.79769e308x (out of reach: as fast as it can)"),
        (1e-300, "1e-300x"),
    ],
)
def test_speeds_read_for_people(speed: float, text: str) -> None:
    assert speed_text(speed) == text
