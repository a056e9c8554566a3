"""An operator's walk-through of `racktwin --help` and `racktwin agent --help`.

`racktwin agent --help` listed three options and nothing else: not how the service stops, what its exit
statuses mean (the systemd unit restarts it after 1 and 75, not after 2: docs/agent.md "Running it"),
nor where the configuration's keys are described -- the first questions of someone starting it.
`racktwin twin --help` named only the steady state, though `twin sweep-supply` is its other action.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]


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


def test_top_help_lists_version_among_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    """The epilog pointed at `racktwin --version`, but the options listed only -h."""
    assert "--version print racktwin's version and exit" in _help(capsys)


#: ``[--opt VALUE]`` in a synopsis, or either side of ``[--a X | --b Y]``
_SYNOPSIS_OPTION = re.compile(r"(?:\[|\| )(--[a-z][a-z0-9-]*) ([A-Z][A-Za-z0-9_.]*)(?=\]| \|)")


def _usage_options(capsys: pytest.CaptureFixture[str], *argv: str) -> set[tuple[str, str]]:
    usage = _help(capsys, *argv).split(" options: ")[0]
    return set(re.findall(r"(--[a-z][a-z0-9-]*) ([A-Z][A-Za-z0-9_.]*)", usage))


@pytest.mark.parametrize(
    ("argv", "doc", "start"),
    [
        (("sim",), "docs/sim.md", "racktwin sim [--site FILE]"),
        (("twin", "steady"), "docs/twin.md", "### `racktwin twin steady ["),
        (("demo",), "docs/evaluation.md", "## `racktwin demo ["),
    ],
)
def test_the_docs_synopsis_names_each_value_as_help_does(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], doc: str, start: str
) -> None:
    """docs/sim.md wrote `racktwin sim [--site FILE] [--speed X] [--site-id ID] [--seed N]` where
    `--help` showed `--site SITE`, `--speed SPEED`, `--site-id SITE_ID`, `--seed SEED` (argparse's
    defaults); `twin steady --help` showed `--ambient-c AMBIENT_C` against the doc's `--ambient-c A`."""
    text = (REPO / doc).read_text(encoding="utf-8")
    synopsis = text[text.index(start) :].split("\n\n", 1)[0].split("```", 1)[0]
    written = set(_SYNOPSIS_OPTION.findall(synopsis))
    assert len(written) >= 5, synopsis
    assert written <= _usage_options(capsys, *argv), sorted(written - _usage_options(capsys, *argv))


def test_journal_help_says_which_options_do_not_go_with_decision(capsys: pytest.CaptureFixture[str]) -> None:
    """--since and --last with --decision are refused (exit status 2); the help did not say so."""
    text = _help(capsys, "journal")
    assert "offset: 2026-12-01T10:00+01:00); not with --decision" in text
    assert "(default 5; not with --decision)" in text
