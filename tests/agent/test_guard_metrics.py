"""``racktwin_guard_actions_total{action}`` (docs/agent.md, "What the guard changed" and the metrics
table): every documented action's series exported at 0 from the start (the alert's ``increase()``
needs a sample before the first event), counted once per action a decision records, through
``MetricUpdates.after_decision``; and the alert ``RacktwinGuardCannotHold`` fires on the actions that
mean no lever is left, says what to do, and the dashboard shows the actions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from guard_helpers import proposal
from prometheus_client.parser import text_string_to_metric_families
from test_guard_actions import SCENES

from agent.bus import MqttOptions
from agent.config import load_config
from agent.guard import GUARD_ACTIONS
from agent.metrics import AgentMetrics
from agent.service import AgentService

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
DOCUMENTED_ACTIONS = (
    "placements_dropped",
    "level_raise_limited",
    "setpoint_limited",
    "failsafe_caps",
    "pumps_full_speed",
    "cap_jobs_slowed",
    "cap_idle_to_low_power",
    "cap_power_limited",
    "cap_not_held",
    "die_jobs_slowed",
    "die_power_limited",
    "die_not_held",
)


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    loaded = load_config(REPO / "examples" / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    return AgentService(loaded, mqtt=MqttOptions(port=1), http=False)  # not run: no connection


def _counts(service: AgentService) -> dict[str, float]:
    body = service.metrics.exposition().decode()
    return {
        s.labels["action"]: s.value
        for fam in text_string_to_metric_families(body)
        if fam.name == "racktwin_guard_actions"
        for s in fam.samples
        if s.name == "racktwin_guard_actions_total"
    }


def test_the_vocabulary_is_the_documented_one_in_code_and_in_docs() -> None:
    assert set(GUARD_ACTIONS) == set(DOCUMENTED_ACTIONS)
    docs = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| `racktwin_guard_actions_total`"))
    assert set(re.findall(r"`([a-z_]+)`", row.split("|")[3])) == set(DOCUMENTED_ACTIONS)
    table = {m for m in re.findall(r"^\| `([a-z_]+)` \| `guard: ", docs, re.M)}
    assert table == set(DOCUMENTED_ACTIONS)


def test_every_actions_series_is_exported_at_zero_before_the_first_decision() -> None:
    text = AgentMetrics(["r0"]).exposition().decode()
    for action in DOCUMENTED_ACTIONS:
        assert f'racktwin_guard_actions_total{{action="{action}"}} 0.0' in text, action


def test_each_decision_adds_the_actions_the_guard_recorded(service: AgentService) -> None:
    """A rack the guard cannot hold (tests/agent/test_guard_actions.py: r1 with 8.5 kW the twin does not
    explain), then a die it cannot hold, then a decision where it changed nothing."""
    site, up = service.site, service.metric_updates
    cap = SCENES["cap: not held"]()
    die = SCENES["die: not held"]()
    assert "cap_not_held" in cap.guard_actions and "die_not_held" in die.guard_actions
    up.after_decision(proposal(site, guard_actions=cap.guard_actions))
    counts = _counts(service)
    assert counts["cap_not_held"] == 1.0
    assert counts["cap_jobs_slowed"] == counts["cap_idle_to_low_power"] == counts["cap_power_limited"] == 1.0
    assert counts["die_not_held"] == 0.0
    up.after_decision(proposal(site, guard_actions=die.guard_actions))
    up.after_decision(proposal(site))  # nothing changed by the guard: nothing counted
    counts = _counts(service)
    assert counts["cap_not_held"] == counts["die_not_held"] == counts["die_power_limited"] == 1.0
    assert sum(counts.values()) == 4 + 2
    # two racks not held in one decision: two lines, two counts
    up.after_decision(proposal(site, guard_actions=("cap_power_limited", "cap_not_held") * 2))
    assert _counts(service)["cap_not_held"] == 3.0


def test_the_cannot_hold_alert_fires_on_the_no_lever_left_actions_and_says_what_to_do() -> None:
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "racktwin-alerts.yml").read_text(encoding="utf-8"))
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == "RacktwinGuardCannotHold")
    assert rule["labels"]["severity"] == "critical"
    m = re.fullmatch(r'increase\(racktwin_guard_actions_total\{action=~"([a-z_|]+)"\}\[5m\]\) > 0', rule["expr"])
    assert m and set(m.group(1).split("|")) == {"cap_not_held", "die_not_held"}
    text = rule["annotations"]["description"]
    for what in ("cap_not_held", "die_not_held", "stop jobs", "racktwin journal"):
        assert what in text
    docs = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    assert "RacktwinGuardCannotHold" in docs


def test_the_dashboard_shows_the_guards_actions_by_action() -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "racktwin-dashboard.json").read_text(encoding="utf-8"))
    panel = next(p for p in dash["panels"] if "guard actions" in p["title"].lower())
    assert any("racktwin_guard_actions_total" in t["expr"] and "by (action)" in t["expr"] for t in panel["targets"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
