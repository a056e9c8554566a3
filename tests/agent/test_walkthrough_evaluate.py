"""An operator's walk-through of `racktwin evaluate` (README: "`racktwin evaluate` on a shortened run").

Running a day's scenario with `--duration 600`, as one tries it first, printed the day's targets
judged on ten minutes with nothing saying so: "MISSED facility saving vs baseline: 9.26% (target >=
22%)" reads as a defect of the agent, while a host's boot alone (300 s) is half of such a run. The
verdicts now carry a line saying they were set for the file's run and judged on the shorter one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SCENARIO = f"""
name = "walk"
site = "{EXAMPLES / "supernode-512.toml"}"
duration_s = 3600.0
seed = 1

[workload]
source = "none"

[targets]
policy = "racktwin"
limit_violation_s_max = 0.0

[[jobs]]
id = "train"
n_cards = 64
duration_s = 100000.0
step_time_s = 2.0
compute_share = 0.8
"""


def _targets_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    scen = tmp_path / "walk.toml"
    scen.write_text(SCENARIO)
    argv = ["evaluate", "--scenario", str(scen), "--policy", "racktwin", "--jobs", "1", "--quiet", *extra]
    rc = main([*argv, "--out", str(tmp_path / f"out{len(extra)}")])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("targets for racktwin"))
    return lines[start:]


def test_a_shortened_run_says_its_targets_were_set_for_the_scenarios_duration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _targets_lines(tmp_path, capsys, "--duration", "60")
    assert lines[0] == "targets for racktwin (the scenario's [targets]):"
    # the scenario file runs 1 h (3600 s); --duration 60 ran one minute
    assert lines[1] == (
        "  (judged on this 0:01:00 run: --duration shortened the scenario's 1:00:00, for which its targets were set)"
    )
    assert "true rack power over a limit" in lines[2]


def test_a_run_of_the_scenarios_own_duration_has_no_such_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = SCENARIO.replace("duration_s = 3600.0\nseed", "duration_s = 60.0\nseed")
    scen = tmp_path / "short.toml"
    scen.write_text(short)
    argv = ["evaluate", "--scenario", str(scen), "--policy", "racktwin", "--jobs", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "targets for racktwin (the scenario's [targets]):" in out
    assert "--duration shortened" not in out
    # --duration equal to the file's is not a shortened run either
    assert main([*argv, "--duration", "60", "--out", str(tmp_path / "out2")]) == 0
    assert "--duration shortened" not in capsys.readouterr().out
