"""``racktwin demo``'s run without the agent shows progress on stderr like the run with it (docs/evaluation.md,
"racktwin demo"): at ``--minutes`` of days it lasts minutes of wall time, which were silent. A line every
``--progress-interval-s`` wall seconds, in the demo's style (``racktwin demo: ...``), nothing on stdout
(``--json`` must stay one object there)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from agent.commands.demo import DEFAULT_SCENARIO, _baseline
from twin.scenario import load_run_scenario

pytestmark = pytest.mark.agent

LINE = re.compile(
    r"^racktwin demo: without the agent: (\d+):(\d\d):(\d\d) of 1:00:00 site time \(\s*\d+%\), [\d,]+x real time, "
    r"(~[\d,]+ s left|done)$"
)


def test_a_long_enough_baseline_run_prints_progress_lines_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    # an hour of site time is four of the plant's 900-s reports; an interval far below the wall time of one
    # report makes every report due (the interval is the only thing that decides it, never a timing)
    scenario = dataclasses.replace(load_run_scenario(DEFAULT_SCENARIO, duration_s=3600.0), duration_s=3600.0)
    metrics = _baseline(scenario, progress_interval_s=1e-9)
    out, err = capsys.readouterr()
    assert out == ""
    lines = [line for line in err.splitlines() if "without the agent" in line]
    assert len(lines) >= 1, err
    assert all(LINE.match(line) for line in lines), lines
    # site time advances line by line and the last report is the end of the run
    matches = [LINE.match(line) for line in lines]
    times = [int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) for m in matches if m is not None]
    assert times == sorted(times) and times[-1] == 3600 and lines[-1].endswith("done")
    assert metrics["it_energy_kwh"] > 0


def test_no_progress_lines_when_the_interval_has_not_passed(capsys: pytest.CaptureFixture[str]) -> None:
    # a short run (one 900-s report) well within the interval: silent, as the run with the agent is
    scenario = load_run_scenario(DEFAULT_SCENARIO, duration_s=600.0)
    _baseline(scenario, progress_interval_s=3600.0)
    assert "without the agent" not in capsys.readouterr().err
