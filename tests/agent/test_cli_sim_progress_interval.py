"""``racktwin sim --progress-interval-s`` is the option ``racktwin demo`` and ``racktwin evaluate``
have (``agent.commands.common.add_progress_interval_argument``): the same help words and the same
error line for a value it refuses. The simulator's alone takes 0 for no progress lines (the demo runs
its simulator so; a run with 0 prints none: tests/agent/test_sim_twin_fit_cmd_audit_sim.py)."""

from __future__ import annotations

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks depend on the terminal's width


def test_sim_documents_the_option_in_the_demos_and_evaluates_words(capsys: pytest.CaptureFixture[str]) -> None:
    sim_help = _help("sim", capsys)
    assert "--progress-interval-s S wall seconds between progress lines on stderr, > 0, or 0: none (default 5)" in (
        sim_help
    )
    for command in ("demo", "evaluate"):
        assert "--progress-interval-s S wall seconds between progress lines (" in _help(command, capsys)


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf"])
def test_a_negative_or_non_finite_interval_is_one_error_line_before_anything_runs(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--duration", "5", "--speed", "0", "--progress-interval-s", value]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no embedded broker started (its URL would be on stdout)
    assert captured.err.splitlines() == [
        f"racktwin sim: error: --progress-interval-s must be positive, or 0 for no progress lines, got {value}"
    ]
