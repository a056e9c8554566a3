"""The progress lines of ``racktwin evaluate`` and ``racktwin demo`` (docs/evaluation.md):

* ``--progress-interval-s`` is the same option in both (name, help, validation: a non-positive or
  non-finite value is one error line and exit status 2); evaluate's sets how often a policy's line
  comes, where it was fixed at 10 wall seconds;
* site times read ``H:MM:SS`` and the share done in whole percent, both rounded DOWN: a progress line
  never shows more done than is done (evaluate rounded to the nearest second: 3599.6 s of an hour read
  ``1:00:00 of 1:00:00 (100%)`` beside "~0 s left");
* the scenario keeps its file's ``duration_s`` (``RunScenario.file_duration_s``), from which evaluate
  tells a run ``--duration`` shortened (it read the file a second time for it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.cli import main
from twin.scenario import load_run_scenario

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: an hour of listed jobs only: four of the plant's 900-s reports, no generated workload to draw
SCENARIO = f"""
name = "hour"
site = "{EXAMPLES / "supernode-512.toml"}"
duration_s = 3600.0
seed = 1

[workload]
source = "none"

[[jobs]]
id = "train"
n_cards = 64
duration_s = 100000.0
step_time_s = 2.0
compute_share = 0.8
"""

BASELINE_LINE = re.compile(r"^racktwin evaluate: baseline   (\d:\d\d:\d\d) of 1:00:00 \(\s*(\d+)%\), ")


def _baseline_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str], interval: str) -> list[tuple[str, str]]:
    scen = tmp_path / "hour.toml"
    scen.write_text(SCENARIO)
    argv = ["evaluate", "--scenario", str(scen), "--policy", "baseline", "--jobs", "1", "--sample-s", "900"]
    assert main([*argv, "--out", str(tmp_path / f"out-{interval}"), "--progress-interval-s", interval]) == 0
    err = capsys.readouterr().err.splitlines()
    return [(m[1], m[2]) for line in err if (m := BASELINE_LINE.match(line))]


def test_a_short_interval_shows_every_900_s_report_of_a_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an interval far below the wall time of one report (milliseconds of plant time at least): every
    # report is due; the default (10 s) showed the first and the last of a run this short
    lines = _baseline_lines(tmp_path, capsys, "1e-9")
    assert lines == [("0:15:00", "25"), ("0:30:00", "50"), ("0:45:00", "75"), ("1:00:00", "100")]


def test_a_long_interval_leaves_the_first_report_and_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no run of an hour of site time takes an hour of wall time here: the reports between are not due
    assert _baseline_lines(tmp_path, capsys, "3600") == [("0:15:00", "25"), ("1:00:00", "100")]


@pytest.mark.parametrize("command", ["evaluate", "demo"])
@pytest.mark.parametrize(("value", "shown"), [("0", "0"), ("-1", "-1"), ("nan", "nan"), ("inf", "inf")])
def test_a_non_positive_or_non_finite_interval_is_one_error_line_in_both_commands(
    command: str, value: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scen = tmp_path / "hour.toml"
    scen.write_text(SCENARIO)
    out = tmp_path / "out"
    argv = [command, "--scenario", str(scen), "--out", str(out), "--progress-interval-s", value]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"racktwin {command}: error: --progress-interval-s must be positive, got {shown}"
    ]
    assert not out.exists()  # refused before anything ran


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks depend on the terminal's width


def test_both_commands_document_the_option_in_the_same_words(capsys: pytest.CaptureFixture[str]) -> None:
    evaluate_help, demo_help = _help("evaluate", capsys), _help("demo", capsys)
    assert "--progress-interval-s S wall seconds between progress lines (per policy" in evaluate_help
    assert "> 0 (default 10)" in evaluate_help
    assert "--progress-interval-s S wall seconds between progress lines (the run with the agent" in demo_help
    assert "> 0 (default 5)" in demo_help


def test_a_progress_line_never_shows_more_done_than_is_done(capsys: pytest.CaptureFixture[str]) -> None:
    from agent.commands.evaluate import _progress_printer

    _progress_printer(False)("baseline", 3599.6, 3600.0, 2.0)  # 0.4 s of site time left
    printed = capsys.readouterr().err.splitlines()
    assert len(printed) == 1
    assert printed[0].startswith("racktwin evaluate: baseline   0:59:59 of 1:00:00 ( 99%), ")
    assert printed[0].endswith(" s left")


def test_the_scenario_keeps_its_files_duration_under_an_override(tmp_path: Path) -> None:
    scen = tmp_path / "hour.toml"
    scen.write_text(SCENARIO)
    shortened = load_run_scenario(scen, duration_s=600.0)
    assert (shortened.duration_s, shortened.file_duration_s) == (600.0, 3600.0)
    own = load_run_scenario(scen)
    assert (own.duration_s, own.file_duration_s) == (3600.0, 3600.0)
