"""A metrics update that raises part way (a defect) stops only its own group of gauges (agent.metric_updates,
"Each group of gauges is brought up to date in its own guarded step"): the other groups go on moving; the
failing group keeps its last values, but a measured group's series go (no sample) since what they show is
no longer known to be current; each step's failure is logged once per distinct error, with its
traceback, and its recovery once. Before, the first error froze every gauge after it in the update (the
site clock, the facility, open commands, standby ...), and the log said only that "health metrics" failed.
``racktwin_metrics_group_failing{group}`` reads 1 while a group fails, 0 otherwise: before, only the log
said that a group's alerts (RacktwinTelemetryStale, RacktwinRackOverLimit, RacktwinDieHot ...) were blind.

In process, on the service built from examples/agent.toml (not run: no broker); the failure comes from
a method of the real twin state or of the codec's rejection counter made to raise; every value checked
is the one a scrape sees."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_metric_gaps import T0, _at, _readings, _scrape, _service, _SiteNow

from agent.service import AgentService

pytestmark = pytest.mark.agent


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def _frozen_readings_fail(*_args: object) -> tuple[np.ndarray, np.ndarray]:
    raise RuntimeError("stuck-sensor arrays out of shape")


def test_a_twin_state_method_that_raises_stops_only_the_gauges_that_need_it(
    service: AgentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TwinState.frozen_readings`` raises: the loop temperatures and the dies (which need it to know
    which readings a stuck sensor froze) cannot be brought up to date, and their series go rather than
    showing the last values as current. Rack power, telemetry age, the facility, the site clock, the
    open commands and the stuck-sensor count, which do not need it, follow the readings that come
    meanwhile (before: frozen at the first reading's values, the update raising at the loops). When it
    works again, the loops and dies are back."""
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    r0 = service.site.rack_names[0]
    service.state.update(_readings(service, T0))
    s = _scrape(service)
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r0) == 30.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="0") == 60.0
    assert _at(s, "racktwin_site_time_seconds") == T0

    monkeypatch.setattr(service.state, "frozen_readings", _frozen_readings_fail)
    service.state.update(_readings(service, T0 + 10, die_c=65.0, pdu_w={0: 41_000.0}))
    clock.t_s = T0 + 12
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=r0) == 41_000.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r0) == 2.0
    assert _at(s, "racktwin_site_time_seconds") == T0 + 12
    assert _at(s, "racktwin_it_power_watts") == 300_000.0
    assert _at(s, "racktwin_open_commands") == 0.0
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 0.0
    assert _at(s, "racktwin_broker_connected") == 0.0
    # the groups that need the failing method: no stale value shown as current
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r0) is None
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=r0) is None
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="0") is None
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) is None
    assert set(service.metric_updates.failing) == {"loop temperatures", "die temperatures"}

    monkeypatch.undo()
    s = _scrape(service)
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r0) == 30.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="0") == 65.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == 65.0
    assert service.metric_updates.failing == {}


def test_a_failure_in_the_first_steps_leaves_the_later_ones_to_go_on(
    service: AgentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The codec's rejection counter raises (the second thing the update used to read): the rejection
    counts stop, and everything after them still moves (before: only the broker link gauge, read first,
    was ever set again)."""
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock

    def snapshot_fails() -> dict[str, int]:
        raise KeyError("reason")

    monkeypatch.setattr(service.codec.counter, "snapshot", snapshot_fails)
    r1 = service.site.rack_names[1]
    service.state.update(_readings(service, T0, die_c=70.0))
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=r1) == 40_100.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r1) == 70.0
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) == 31.0
    assert _at(s, "racktwin_site_time_seconds") == T0
    assert set(service.metric_updates.failing) == {"message counts"}


def test_each_steps_failure_is_logged_once_per_error_and_its_recovery_once(
    service: AgentService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three updates with one error: one line per failing step, with the traceback (the loops and the
    dies both need the failing method: two lines, each naming its group and the error); another error
    of the same step is logged again; once it works, one line per step saying so."""
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    mu = service.metric_updates
    service.state.update(_readings(service, T0))
    mu.clock = _SiteNow(T0)
    monkeypatch.setattr(service.state, "frozen_readings", _frozen_readings_fail)
    for _ in range(3):
        mu.update()

    def failed() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("health metrics not updated")]

    assert sorted(r.getMessage() for r in failed()) == [
        "health metrics not updated: die temperatures: RuntimeError: stuck-sensor arrays out of shape",
        "health metrics not updated: loop temperatures: RuntimeError: stuck-sensor arrays out of shape",
    ]
    assert all(r.exc_info is not None for r in failed())

    def other_error(*_args: object) -> tuple[np.ndarray, np.ndarray]:
        raise ValueError("another defect")

    monkeypatch.setattr(service.state, "frozen_readings", other_error)
    mu.update()
    mu.update()
    assert len(failed()) == 4
    monkeypatch.undo()
    mu.update()
    mu.update()
    again = sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("health metrics updated"))
    assert again == [
        "health metrics updated again: die temperatures",
        "health metrics updated again: loop temperatures",
    ]


def test_a_failing_telemetry_age_step_shows_no_age_rather_than_its_last_one(
    service: AgentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TwinState.rack_last_seen_s`` (which only the telemetry age needs) raises. The age's series go
    while it does: before, each rack's age stayed at its last value, 5 s, while its readings grew 40 s
    old, past the 30-s deadline, so RacktwinTelemetryStale (``racktwin_telemetry_age_seconds > 30``)
    read a fresh rack. The other groups go on; when it works again the ages are back, 40 s."""
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    r0, r1 = service.site.rack_names[:2]
    service.state.update(_readings(service, T0))
    clock.t_s = T0 + 5
    s = _scrape(service)
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r0) == 5.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r1) == 5.0

    def last_seen_fails() -> np.ndarray:
        raise IndexError("rack index out of range")

    monkeypatch.setattr(service.state, "rack_last_seen_s", last_seen_fails)
    clock.t_s = T0 + 40
    s = _scrape(service)
    assert all(name != "racktwin_telemetry_age_seconds" for name, _ in s)  # no rack's age: not known
    assert set(service.metric_updates.failing) == {"telemetry age"}
    assert _at(s, "racktwin_site_time_seconds") == T0 + 40  # the others go on

    monkeypatch.undo()
    s = _scrape(service)
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r0) == 40.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r1) == 40.0
    assert service.metric_updates.failing == {}


def _failing(scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """``racktwin_metrics_group_failing`` as a scrape shows it: group -> value."""
    return {
        dict(labels)["group"]: v for (name, labels), v in scrape.items() if name == "racktwin_metrics_group_failing"
    }


GROUPS = {  # docs/agent.md, "A metrics update that fails": the groups, by the id the gauge names them with
    "broker_link",
    "message_counts",
    "invalid_readings",
    "rack_power",
    "telemetry_age",
    "loop_temperatures",
    "die_temperatures",
    "facility",
    "stuck_sensors",
    "open_commands",
    "standby",
    "site_clock",
}


def test_a_failing_group_is_said_by_its_gauge_while_it_fails_and_not_after(
    service: AgentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the telemetry age's update raises, its series are gone, so RacktwinTelemetryStale cannot fire;
    before, only the log said so. ``racktwin_metrics_group_failing{group="telemetry_age"}`` reads 1 then
    (every other group 0), and 0 again once the update works. Every group's series is there from the
    start, at 0 (before the first update: no group has failed), so that a rule on it sees the change."""
    assert _failing(_scrape_before_update(service)) == dict.fromkeys(GROUPS, 0.0)
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    service.state.update(_readings(service, T0))
    assert _failing(_scrape(service)) == dict.fromkeys(GROUPS, 0.0)

    def last_seen_fails() -> np.ndarray:
        raise IndexError("rack index out of range")

    monkeypatch.setattr(service.state, "rack_last_seen_s", last_seen_fails)
    clock.t_s = T0 + 40
    for _ in range(2):  # a repeat of the same error (not logged again) still reads failing
        s = _scrape(service)
        assert all(name != "racktwin_telemetry_age_seconds" for name, _ in s)  # the blind alert's series
        assert _failing(s) == {**dict.fromkeys(GROUPS, 0.0), "telemetry_age": 1.0}

    monkeypatch.undo()
    s = _scrape(service)
    assert _at(s, "racktwin_telemetry_age_seconds", rack=service.site.rack_names[0]) == 40.0
    assert _failing(s) == dict.fromkeys(GROUPS, 0.0)


def test_one_failing_method_behind_two_groups_sets_both(service: AgentService, monkeypatch: pytest.MonkeyPatch) -> None:
    """``TwinState.frozen_readings`` raising stops the loop temperatures and the dies (RacktwinDieHot's
    series): both groups read 1, and 0 when it works again."""
    service.metric_updates.clock = _SiteNow(T0)
    service.state.update(_readings(service, T0))
    monkeypatch.setattr(service.state, "frozen_readings", _frozen_readings_fail)
    failing = _failing(_scrape(service))
    assert {g for g, v in failing.items() if v == 1.0} == {"loop_temperatures", "die_temperatures"}
    monkeypatch.undo()
    assert set(_failing(_scrape(service)).values()) == {0.0}


def _scrape_before_update(service: AgentService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = service.metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }


class _RateFails:
    """A site clock whose time reads but whose rate raises: only the site clock's step needs it."""

    def __init__(self, t_s: float) -> None:
        self.t_s = t_s

    def now(self) -> float:
        return self.t_s

    @property
    def rate(self) -> float:
        raise ArithmeticError("rate of no samples")


def test_a_failing_site_clock_step_is_said_under_its_own_group(service: AgentService) -> None:
    """Each step is said failing under its own group id and log words (``agent.metrics.METRICS_GROUPS``):
    the site clock's rate raising sets ``group="site_clock"`` alone (the standby step, next to it, runs
    and reads 0), so that the alert names the series that went blind."""
    service.metric_updates.clock = _RateFails(T0)
    service.state.update(_readings(service, T0))
    failing = _failing(_scrape(service))
    assert {g for g, v in failing.items() if v == 1.0} == {"site_clock"}
    assert set(service.metric_updates.failing) == {"site clock"}
