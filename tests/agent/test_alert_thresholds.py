"""The shipped alert rules (deploy/prometheus/racktwin-alerts.yml) agree with the agent they watch: each
threshold tied to one of the agent's defaults is that default (its header names them), and each label
an alert's text names is one its series carry (docs/agent.md's metrics table, which
test_metrics_audit.py ties to what is exported). test_deploy.py checks the series names.

RacktwinTelemetryStale used to fire at an age over 60 s held for 1 min (2 min of silence) while the
agent's deadline is 30 s: from 30 s the rack is at fail-safe caps and its power, loop and die series are
gone, so RacktwinRackOverLimit and RacktwinDieHot had ended and nothing fired for 90 s."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_metrics_audit import _documented

from agent import bus
from agent.config import ControlConfig, load_config
from agent.metrics import AgentMetrics
from twin.spec import load_site

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "racktwin-alerts.yml"


def _rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def _seconds(duration: str) -> float:
    """A Prometheus duration of one unit (``30s``, ``2m``, ``1h``) in seconds."""
    m = re.fullmatch(r"(\d+)(s|m|h)", duration)
    assert m, duration
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def _threshold(expr: str, series: str, op: str) -> float:
    m = re.fullmatch(rf"{series}\s*{re.escape(op)}\s*([0-9.]+)", expr.strip())
    assert m, expr
    return float(m.group(1))


def test_the_telemetry_stale_alert_starts_at_the_agents_telemetry_deadline() -> None:
    """The age at which the rack goes to fail-safe caps (the default deadline, and the example's) is the
    alert's threshold; held no longer than RacktwinRackOverLimit waits, so the gap between the
    measured series going and this alert firing is at most that long."""
    deadline_s = ControlConfig().telemetry_deadline_s
    example = load_config(REPO / "examples" / "agent.toml", env={}).config.control.telemetry_deadline_s
    assert deadline_s == example == 30.0
    rules = _rules()
    stale = rules["RacktwinTelemetryStale"]
    assert _threshold(stale["expr"], "racktwin_telemetry_age_seconds", ">") == deadline_s
    assert _seconds(stale["for"]) <= _seconds(rules["RacktwinRackOverLimit"]["for"])


def test_the_over_limit_alert_waits_two_control_periods() -> None:
    """Its comment: measured power over the limit for longer than two control periods (the agent gets a
    period to bring the rack back and one for the rack to apply it)."""
    rule = _rules()["RacktwinRackOverLimit"]
    assert rule["expr"].strip() == "racktwin_rack_power_watts > racktwin_rack_power_limit_watts"
    assert _seconds(rule["for"]) == 2 * ControlConfig().period_s == 30.0


def test_the_die_hot_alert_is_the_guards_die_limit_on_the_example_site() -> None:
    """The guard slows a job whose die is predicted above slowdown less the die margin: 87 - 2 = 85 deg C
    on the example site (H100 SXM)."""
    site = load_site(REPO / "examples" / "supernode-512.toml")
    limit_c = site.card.slowdown_temp_c - ControlConfig().die_margin_k
    assert limit_c == 85.0
    assert _threshold(_rules()["RacktwinDieHot"]["expr"], "racktwin_rack_max_die_temperature_celsius", ">") == limit_c


def test_the_client_id_alert_is_the_agents_take_over_rule() -> None:
    """docs/agent.md: after three take-overs in ten minutes the agent says its client id is contested;
    the alert counts the same number in the same window."""
    expr = _rules()["RacktwinClientIdInUse"]["expr"]
    m = re.fullmatch(r"increase\(racktwin_broker_takeovers_total\[(\w+)\]\)\s*>=\s*(\d+)", expr.strip())
    assert m, expr
    assert _seconds(m.group(1)) == bus._TAKEOVER_WINDOW_S == 600.0
    assert int(m.group(2)) == bus._TAKEOVERS_CONTESTED == 3


def test_the_settings_changed_alert_fires_on_one_count_of_a_change_outside_the_agents_commands() -> None:
    """``racktwin_applied_state_disproved_total`` counts only disprovals no late applied state explained
    (``agent.ingest``): the agent's own commands, whose reading overtook their applied state, are not
    counted (0 in a demo run with no reset), so one count is a rack reset or changed by someone else. The
    increase of one count stays above 0 for the window: the hold is shorter, so that one reset fires it."""
    rule = _rules()["RacktwinRackSettingsChanged"]
    m = re.fullmatch(r"increase\(racktwin_applied_state_disproved_total\[(\w+)\]\)\s*>\s*0", rule["expr"].strip())
    assert m, rule["expr"]
    window_s = _seconds(m.group(1))
    assert _seconds(rule["for"]) < window_s
    assert rule["labels"]["severity"] == "warning"
    summary = rule["annotations"]["summary"]
    assert "$labels.rack" in summary and "$labels.setting" in summary


def test_the_out_of_order_applied_states_alert_waits_out_a_burst_and_fires_on_a_steady_count() -> None:
    """``racktwin_applied_states_old_total{rack}`` counts a burst when a rack restarts on a new timeline (its
    applied states refused until the agent's clock follows it back) or a broker bridge reorders a few: the
    increase of a burst stays above 0 for the window only, so the hold is longer than the window (two
    restarts within it do not fire either: racktwin-alerts.test.yml); a count in every window for the hold
    is a second publisher for the rack, named per rack."""
    rule = _rules()["RacktwinAppliedStatesOutOfOrder"]
    m = re.fullmatch(r"increase\(racktwin_applied_states_old_total\[(\w+)\]\)\s*>\s*0", rule["expr"].strip())
    assert m, rule["expr"]
    assert _seconds(rule["for"]) >= 2 * _seconds(m.group(1))
    assert rule["labels"]["severity"] == "warning"
    assert "$labels.rack" in rule["annotations"]["summary"]
    assert "racktwin_applied_states_old_dropped_total" in rule["annotations"]["description"]


def test_every_label_an_alert_names_is_carried_by_the_series_it_fires_on() -> None:
    """``{{ $labels.rack }}`` in an alert's text says nothing unless every racktwin series of its
    expression has a ``rack`` label (``instance`` and ``job`` come from the scrape)."""
    documented = _documented()
    for name, rule in _rules().items():
        text = " ".join(str(v) for v in rule["annotations"].values())
        named = set(re.findall(r"\$labels\.(\w+)", text)) - {"instance", "job"}
        series = set(re.findall(r"\bracktwin_[a-z_]+", rule["expr"]))
        for s in series:
            assert named <= documented[s], (name, s, named)


#: the series each group of agent.metric_updates brings up to date (docs/agent.md, "A metrics update that
#: fails", and its metrics table)
GROUP_SERIES = {
    "broker_link": {"racktwin_broker_connected", "racktwin_broker_takeovers_total"},
    "message_counts": {
        "racktwin_rejected_messages_total",
        "racktwin_messages_stamped_ahead_total",
        "racktwin_late_readings_total",
        "racktwin_job_snapshot_changes_total",
        "racktwin_applied_state_disproved_total",
        "racktwin_applied_states_old_total",
        "racktwin_applied_states_old_dropped_total",
    },
    "invalid_readings": {"racktwin_invalid_readings_total"},
    "rack_power": {"racktwin_rack_power_watts", "racktwin_rack_power_limit_watts"},
    "telemetry_age": {"racktwin_telemetry_age_seconds"},
    "loop_temperatures": {"racktwin_rack_supply_temperature_celsius", "racktwin_rack_return_temperature_celsius"},
    "die_temperatures": {"racktwin_card_die_temperature_celsius", "racktwin_rack_max_die_temperature_celsius"},
    "facility": {
        "racktwin_it_power_watts",
        "racktwin_facility_power_watts",
        "racktwin_cooling_power_watts",
        "racktwin_pue_ratio",
        "racktwin_ambient_temperature_celsius",
    },
    "stuck_sensors": {"racktwin_anomalies"},
    "open_commands": {"racktwin_open_commands"},
    "standby": {"racktwin_agent_standby", "racktwin_competing_agents"},
    "site_clock": {"racktwin_site_time_seconds", "racktwin_site_clock_rate_ratio"},
}


def test_a_failing_metrics_group_has_an_alert_naming_the_alerts_it_blinds() -> None:
    """While a group's update raises, its measured series have no sample and its others stand still: the
    alerts on them cannot fire. RacktwinMetricsNotUpdated fires on ``racktwin_metrics_group_failing``
    (1 while failing), no later than the staleness alert would have, and its description names, per
    group, every shipped alert on one of that group's series, and asks for the log line to report."""
    exported = {
        s.labels["group"]
        for fam in AgentMetrics(["r0"]).registry.collect()
        for s in fam.samples
        if s.name == "racktwin_metrics_group_failing"
    }
    assert exported == set(GROUP_SERIES)  # every group's series, from the start
    rules = _rules()
    rule = rules["RacktwinMetricsNotUpdated"]
    assert rule["expr"].strip() == "racktwin_metrics_group_failing == 1"
    assert rule["labels"]["severity"] == "warning"
    assert _seconds(rule["for"]) <= _seconds(rules["RacktwinTelemetryStale"]["for"])
    text = rule["annotations"]["description"]
    assert "health metrics not updated" in text and "report" in text
    blinded = 0
    for group, series in GROUP_SERIES.items():
        m = re.search(rf"\b{group}: ([^;]*)", text)
        named = m.group(1) if m else ""
        assert group in text, group
        for name, other in rules.items():
            if set(re.findall(r"\bracktwin_[a-z_]+", other["expr"])) & series:
                assert name in named, (group, name)
                blinded += 1
    assert blinded >= 7  # over limit, stale, die hot, broker, client id, clock ahead, invalid, another agent
