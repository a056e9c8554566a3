"""An operator's walk-through of `racktwin --help` and `racktwin agent --help`.

`racktwin agent --help` listed three options and nothing else: not how the service stops, what its exit
statuses mean (the systemd unit restarts it after 1 and 75, not after 2: docs/agent.md "Running it"),
nor where the configuration's keys are described -- the first questions of someone starting it.
`racktwin twin --help` named only the steady state, though `twin sweep-supply` is its other action.
"""

from __future__ import annotations

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words


def test_agent_help_says_how_it_stops_what_its_exit_statuses_mean_and_where_the_keys_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys, "agent")
    assert "SIGTERM or SIGINT" in text and "exit status 0" in text
    assert "Exit status 2: a bad configuration" in text
    assert "75: a start problem that may pass" in text
    assert "1: an unexpected error" in text
    assert "docs/agent.md" in text and "/readyz" in text and "racktwin journal --config FILE" in text


def test_top_help_names_both_twin_actions(capsys: pytest.CaptureFixture[str]) -> None:
    top = _help(capsys)
    assert "steady state of a site, supply set-point sweep" in top
    twin = _help(capsys, "twin")
    assert "steady" in twin and "sweep-supply" in twin
