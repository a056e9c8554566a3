"""The shipped deploy files fit the agent: the dashboard and the Prometheus alert rules only query
metrics the agent exports, and the systemd unit runs the checked configuration, restarts on failure
and reads an environment file."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

import pytest
import yaml

from agent.metrics import COMMAND_RESULTS, AgentMetrics

pytestmark = pytest.mark.agent

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def exported_names() -> set[str]:
    m = AgentMetrics(["r0"])
    names: set[str] = set()
    for metric in m.registry.collect():
        for s in metric.samples:
            names.add(s.name)
    # labelled metrics without samples yet still export these series
    for metric in m.registry.collect():
        if metric.type == "gauge":
            names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names.update(metric.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def test_the_dashboard_queries_only_exported_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "racktwin-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\bracktwin_[a-z_]+", e)}
    missing = used - exported_names()
    assert not missing
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for what in ("rack power vs limit", "die", "pue", "solve time", "commands by result", "rejected", "fail-safe"):
        assert what in titles


def test_every_counter_counted_by_kind_has_a_panel_by_its_label() -> None:
    """A counter with a label that says what was counted (not which rack) is shown on the dashboard
    summed by that label, with the rack or not (``sum by (rack, setting) (increase(...))``):
    racktwin_applied_state_disproved_total{setting} had no panel."""
    dash = json.loads((DEPLOY / "grafana" / "racktwin-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    by_label: dict[str, set[str]] = {}
    for metric in AgentMetrics(["r0"]).registry.collect():
        if metric.type == "counter":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    by_label.setdefault(sample.name, set()).update(set(sample.labels) - {"rack"})
    counted = {name: labels for name, labels in by_label.items() if labels}
    assert "racktwin_applied_state_disproved_total" in counted and "racktwin_guard_actions_total" in counted
    missing = [
        name
        for name, labels in sorted(counted.items())
        if not any(re.search(rf"\bby \((rack, )?({'|'.join(labels)})\).*\b{name}\b", e) for e in exprs)
    ]
    assert not missing, missing


#: Metrics agent.metrics declares that the dashboard deliberately shows in no panel, each with the reason.
#: Empty: every metric has a panel (an operator watching the site sees them all); a metric added to
#: agent.metrics goes on the dashboard or here, with why it is left off.
LEFT_OFF_THE_DASHBOARD: dict[str, str] = {}


def declared_metrics() -> dict[str, set[str]]:
    """Every metric agent.metrics declares, by the name it is exported and queried under (a counter's
    with its ``_total``) -> the series names a query may use for it (a histogram's ``_bucket``,
    ``_sum``, ``_count``)."""
    declared: dict[str, set[str]] = {}
    for metric in AgentMetrics(["r0"]).registry.collect():
        if metric.type == "counter":  # (prometheus_client names a counter's family without its _total)
            declared[metric.name + "_total"] = {metric.name + "_total"}
        elif metric.type == "histogram":
            declared[metric.name] = {metric.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            declared[metric.name] = {metric.name}
    return declared


def test_every_declared_metric_has_a_panel_or_a_reason_to_have_none() -> None:
    """An operator sees on the dashboard every metric the agent exports, unless it is left off on
    purpose (:data:`LEFT_OFF_THE_DASHBOARD`): racktwin_rack_pump_speed_ratio, racktwin_rack_hosts_off,
    racktwin_site_time_seconds, racktwin_site_clock_rate_ratio, racktwin_foreign_acks_total and
    racktwin_repeated_acks_total had no panel."""
    dash = json.loads((DEPLOY / "grafana" / "racktwin-dashboard.json").read_text())
    used = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"\bracktwin_[a-z_]+", t["expr"])}
    declared = declared_metrics()
    assert {"racktwin_rack_pump_speed_ratio", "racktwin_foreign_acks_total", "racktwin_solve_seconds"} <= set(declared)
    missing = sorted(
        name for name, series in declared.items() if not series & used and name not in LEFT_OFF_THE_DASHBOARD
    )
    assert not missing, f"no panel shows {missing}: add one, or list them in LEFT_OFF_THE_DASHBOARD with why"
    # the allow-list names declared metrics that are indeed off the dashboard, each with a reason
    for name, why in LEFT_OFF_THE_DASHBOARD.items():
        assert name in declared and not declared[name] & used and why.strip(), name


def test_the_dashboard_panels_do_not_overlap() -> None:
    """Every panel has its own place on Grafana's 24-column grid (a panel laid over another hides it)."""
    dash = json.loads((DEPLOY / "grafana" / "racktwin-dashboard.json").read_text())
    taken: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = p["title"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_every_panel_shows_its_unit_or_words() -> None:
    """A number on the dashboard carries its unit (``celsius``, ``watt``, ``s``; ``short`` for a count,
    ``none`` for a ratio), or the panel maps its values to words (``up`` / ``down``): "Hottest die per
    rack" showed bare numbers beside the deg C of the other temperature panels, and "Decisions by status,
    plans by status and source" counts without a unit."""
    dash = json.loads((DEPLOY / "grafana" / "racktwin-dashboard.json").read_text())
    bare = [
        p["title"]
        for p in dash["panels"]
        if not p["fieldConfig"]["defaults"].get("unit") and not p["fieldConfig"]["defaults"].get("mappings")
    ]
    assert not bare, f"panels without a unit: {bare}"
    units = {p["title"]: p["fieldConfig"]["defaults"].get("unit") for p in dash["panels"]}
    assert units["Hottest die per rack"] == units["Die temperatures (cards)"] == "celsius"
    assert units["Decisions by status, plans by status and source"] == units["Guard actions per 15 min"] == "short"


def test_the_alert_rules_use_only_exported_metrics_and_say_what_to_do() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "racktwin-alerts.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    used = {n for r in alerts for n in re.findall(r"\bracktwin_[a-z_]+", r["expr"])}
    assert used and not used - exported_names()
    for r in alerts:
        assert r["alert"].startswith("Racktwin") and r["labels"]["severity"] in ("critical", "warning", "info")
        assert r["annotations"]["summary"]
    names = {r["alert"] for r in alerts}
    assert {"RacktwinRackOverLimit", "RacktwinRackCannotBeHeld", "RacktwinNotReady", "RacktwinRackFailsafe"} <= names
    # two agents on one site, one client id used by two clients (docs/agent.md, "Another agent on the site")
    assert {"RacktwinAnotherAgentOnSite", "RacktwinClientIdInUse"} <= names
    # results of racktwin_commands_total the rules count are ones the agent emits (docs/agent.md's table)
    results = {x for r in alerts for m in re.findall(r'result=~?"([^"]+)"', r["expr"]) for x in m.split("|")}
    documented = (DEPLOY.parent / "docs" / "agent.md").read_text()
    row = next(line for line in documented.splitlines() if line.startswith("| `racktwin_commands_total`"))
    assert results and all(f"`{x}`" in row for x in results)


def test_counted_series_are_exported_at_zero_before_their_first_event() -> None:
    """increase() in the alert rules needs a sample before the first event of a series."""
    text = AgentMetrics(["r0", "r1"]).exposition().decode()
    for series in (
        'racktwin_invalid_readings_total{rack="r0"} 0.0',
        'racktwin_invalid_readings_total{rack="r1"} 0.0',
        'racktwin_commands_total{result="rejected"} 0.0',
        'racktwin_commands_total{result="unconfirmed"} 0.0',
        'racktwin_plans_total{source="greedy",status="infeasible"} 0.0',
        'racktwin_plans_total{source="milp",status="fallback"} 0.0',
        'racktwin_decisions_total{status="failsafe"} 0.0',
        "racktwin_broker_takeovers_total 0.0",
        "racktwin_foreign_commands_total 0.0",
        "racktwin_competing_agents 0.0",
        "racktwin_agent_standby 0.0",
    ):
        assert series in text
    # every counter an alert rule takes the increase() of has its series from the start
    rules = yaml.safe_load((DEPLOY / "prometheus" / "racktwin-alerts.yml").read_text())
    counted = {
        m for g in rules["groups"] for r in g["rules"] for m in re.findall(r"increase\((racktwin_[a-z_]+)", r["expr"])
    }
    assert counted
    for name in counted:
        assert re.search(rf"^{name}(\{{[^}}]*\}})? 0\.0$", text, re.M), name
    documented = (DEPLOY.parent / "docs" / "agent.md").read_text()
    row = next(line for line in documented.splitlines() if line.startswith("| `racktwin_commands_total`"))
    assert set(re.findall(r"`([a-z]+)`", row.split("|")[3])) == set(COMMAND_RESULTS)


def test_the_systemd_unit() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    # the ignore: configparser's documented idiom to keep the keys' case; typeshed declares a method
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "racktwin-agent.service")
    svc = unit["Service"]
    assert svc["Type"] in ("simple", "notify")
    assert svc["Restart"] == "on-failure"
    assert svc["EnvironmentFile"].lstrip("-").startswith("/etc/racktwin/")
    assert "racktwin agent --config" in svc["ExecStart"]
    assert "--check-config" in svc["ExecStartPre"]
    assert svc["KillSignal"] == "SIGTERM"
    for hardening in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "RestrictAddressFamilies"):
        assert hardening in svc
