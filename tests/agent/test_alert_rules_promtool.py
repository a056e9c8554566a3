"""The shipped alert rules (deploy/prometheus/racktwin-alerts.yml) run in Prometheus's own rule engine:
``promtool check rules`` parses them (PromQL, durations, templates) and ``promtool test rules`` replays
the agent's series of racktwin-alerts.test.yml through them, checking for every alert a case where it
fires (its labels, its annotations rendered) and one where it does not (at or under its threshold, or
not held for its ``for``). test_deploy.py and test_alert_thresholds.py only read the rules as YAML.

promtool is looked for beside the Python running the tests, in the checkout's .venv/bin (where
scripts/test.sh puts it, out of Debian's prometheus package), then on PATH. Without it the two promtool
tests skip, saying so, except where the environment variable CI is set: there they fail.

Found by these tests: RacktwinPlansFallingBack compared each (status, source) series with its threshold
alone, so 6 greedy and 6 infeasible plans in 30 min (12, "more than 10" in all) fired nothing, and it
counted the incremental decisions, which carry the status of the plan they adjust, so one late solve
followed by a job event a minute fired "25 times in 30 min"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "racktwin-alerts.yml"
RULE_TESTS = PROMETHEUS / "racktwin-alerts.test.yml"


def promtool_path() -> str | None:
    """promtool beside the Python running the tests, in the checkout's .venv/bin, else on PATH."""
    search = [
        str(Path(sys.executable).parent),
        str(REPO / ".venv" / "bin"),
        *os.environ.get("PATH", os.defpath).split(os.pathsep),
    ]
    return shutil.which("promtool", path=os.pathsep.join(search))


def promtool_or_skip() -> str:
    """promtool's path; without one the test skips, or fails where the variable CI is set."""
    promtool = promtool_path()
    if promtool is None:
        reason = (
            f"promtool not found beside {sys.executable}, in {REPO / '.venv' / 'bin'} or on PATH "
            "(scripts/test.sh puts Debian's in .venv/bin)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so the alert rules must be checked")
        pytest.skip(reason)
    return promtool


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool_or_skip(), *args], capture_output=True, text=True, timeout=120, cwd=PROMETHEUS, check=False
    )


def test_promtool_accepts_the_alert_rules() -> None:
    result = _promtool("check", "rules", RULES.name)
    assert result.returncode == 0, f"promtool check rules {RULES.name}:\n{result.stdout}{result.stderr}"


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_expect() -> None:
    result = _promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, f"promtool test rules {RULE_TESTS.name}:\n{result.stdout}{result.stderr}"


def _rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    """A new alert without a unit test fails here, and so does a case for an alert the rules do not have
    (promtool passes an empty ``exp_alerts`` for a misspelt name). In one test group, for each alert: a
    case where it fires with the labels and the annotations it carries (promtool compares both whole,
    so an annotation left out would not pass), and an earlier one where it does not fire yet."""
    rules = _rules()
    doc = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert doc["rule_files"] == [RULES.name]
    covered: set[str] = set()
    for group in doc["tests"]:
        cases = group["alert_rule_test"]
        for case in cases:
            assert case["alertname"] in rules, (group["name"], case["alertname"])
        for name in {c["alertname"] for c in cases}:
            mine = [c for c in cases if c["alertname"] == name]
            firing = [c for c in mine if c.get("exp_alerts")]
            quiet = [c for c in mine if not c.get("exp_alerts")]
            for case in firing:
                for alert in case["exp_alerts"]:
                    assert alert["exp_labels"]["severity"] == rules[name]["labels"]["severity"], (name, case)
                    assert set(alert["exp_annotations"]) == set(rules[name]["annotations"]), (name, case)
            if (
                firing
                and quiet
                and min(_seconds(c["eval_time"]) for c in quiet) < min(_seconds(c["eval_time"]) for c in firing)
            ):
                covered.add(name)
    missing = sorted(set(rules) - covered)
    assert missing == [], f"alerts without a firing case and an earlier quiet one in {RULE_TESTS.name}: {missing}"


def _seconds(duration: str) -> float:
    """A promtool eval_time (``45s``, ``2m``, ``1m30s``) in seconds."""
    total, number = 0.0, ""
    for ch in str(duration):
        if ch.isdigit():
            number += ch
        else:
            total += int(number) * {"s": 1, "m": 60, "h": 3600}[ch]
            number = ""
    assert not number, duration
    return total


def test_without_promtool_the_promtool_tests_skip_unless_ci_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI must check the rules: there a missing promtool fails the tests instead of skipping them."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool not found"):
        promtool_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        promtool_or_skip()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "promtool").write_text("#!/bin/sh\n", encoding="utf-8")
    (tmp_path / "bin" / "promtool").chmod(0o755)
    assert promtool_or_skip() == str(tmp_path / "bin" / "promtool")
