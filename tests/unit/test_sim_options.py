"""How a simulator run is asked for (``sim.runner.SimOptions``): the values a run cannot use are
refused when the options are made (a program that builds them, not only the command line, which
checks its own), and how far ahead of the site clock a command may be stamped grows with the speed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent import wire
from agent.bus import MqttOptions
from sim.runner import MAX_START_EPOCH_S, SimOptions
from twin.scenario import RunScenario, run_scenario_from_dict
from twin.spec import load_site

pytestmark = pytest.mark.unit

SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"


def _scenario() -> RunScenario:
    data = {"name": "t", "duration_s": 60.0, "seed": 1, "workload": {"source": "none"}}
    return run_scenario_from_dict(data, source="test", site=load_site(SITE))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("duration_s", 0.0),
        ("duration_s", -5.0),
        ("duration_s", math.inf),
        ("duration_s", math.nan),
        ("start_epoch_s", -1.0),
        ("start_epoch_s", MAX_START_EPOCH_S * 1000.0),  # epoch milliseconds
        ("start_epoch_s", math.nan),
        ("speed", -1.0),
        ("step_s", 0.0),
    ],
)
def test_options_a_run_cannot_use_are_refused(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=option):
        # the ignore: the field name is a parameter, so mypy cannot match it (each value has its field's type)
        SimOptions(scenario=_scenario(), mqtt=MqttOptions(), **{option: value})  # type: ignore[arg-type]


def test_the_edges_of_the_ranges_are_taken() -> None:
    opts = SimOptions(scenario=_scenario(), mqtt=MqttOptions(), duration_s=1e-3, start_epoch_s=MAX_START_EPOCH_S)
    assert opts.duration_s == 1e-3 and opts.start_epoch_s == MAX_START_EPOCH_S
    assert SimOptions(scenario=_scenario(), mqtt=MqttOptions(), start_epoch_s=0.0).start_epoch_s == 0.0


@pytest.mark.parametrize(
    ("speed", "ahead_s"),
    [(1.0, wire.MAX_ISSUE_AHEAD_S), (20.0, 200.0), (100.0, 1000.0), (0.0, wire.MAX_COMMAND_TTL_S)],
)
def test_a_command_may_be_stamped_ten_wall_seconds_ahead_at_the_runs_speed(speed: float, ahead_s: float) -> None:
    """An agent's clock runs ahead of a simulator starved of CPU: at 20x, a command stamped up to
    200 site s (ten wall s) ahead is taken (two wall s refused 6 of 21 commands on a loaded machine);
    never less than the wire's own limit; as fast as possible, up to a command's longest life."""
    opts = SimOptions(scenario=_scenario(), mqtt=MqttOptions(), speed=speed)
    assert opts.max_issue_ahead_s == max(ahead_s, wire.MAX_ISSUE_AHEAD_S)
