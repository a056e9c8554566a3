"""The gaps the last metrics audit left (docs/agent.md, "Observability"): a measured gauge whose source
has gone silent or sends only values the belief refuses (NaN among them) for longer than
``control.telemetry_deadline_s`` has no sample (its labelled series is removed; the facility's gauges,
without labels, read NaN) while ``racktwin_telemetry_age_seconds`` keeps counting, and it is back with
the source's next valid reading; before the facility's first reading its gauges read NaN, not 0;
``racktwin_open_commands``, ``racktwin_competing_agents`` and ``racktwin_anomalies{kind="stuck_sensor"}``
follow the service's state.

In process, on the service built from examples/agent.toml (not run: no broker); every value checked is
the one a scrape sees: the exposition parsed with prometheus_client's own text parser."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import belief, job
from prometheus_client.parser import text_string_to_metric_families
from readings_testing import card_batch
from test_publish import decision_like

from agent import wire
from agent.bus import MqttOptions
from agent.config import load_config
from agent.service import AgentService
from twin.readings import FacilityReading, LoopReading, PduReading, RackReading, Readings

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0 = 1_790_000_000.0


class _SiteNow:
    """A site clock read at a time set by hand (the real one follows message arrival in wall time)."""

    rate = 1.0

    def __init__(self, t_s: float) -> None:
        self.t_s = t_s

    def now(self) -> float:
        return self.t_s


def _service(tmp_path: Path, **env: str) -> AgentService:
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite"), **env})
    return AgentService(loaded, mqtt=MqttOptions(port=1), http=False)  # not run: no connection


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def _scrape(service: AgentService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics shows now: sample name and labels -> value."""
    service.metric_updates.update()
    body = service.metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }


def _at(scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return scrape.get((name, tuple(sorted(labels.items()))))


def _readings(
    service: AgentService,
    t: float,
    *,
    die_c: float = 60.0,
    card_die_c: dict[int, float] | None = None,
    card_power_w: dict[int, float] | None = None,
    pdu_w: dict[int, float] | None = None,
    supply_c: dict[int, float] | None = None,
    racks: tuple[int, ...] | None = None,
    facility: bool = True,
) -> Readings:
    """Every card at ``die_c`` and 500 W but those named (site index -> value; NaN: a null on the wire),
    each rack's loop at 30 + r deg C supply, 40 + r return and PDU 40 kW + 100 W r but those named."""
    site = service.site
    cpr = site.cards_per_rack
    die = np.full(site.n_cards, die_c)
    power = np.full(site.n_cards, 500.0)
    for c, v in (card_die_c or {}).items():
        die[c] = v
    for c, v in (card_power_w or {}).items():
        power[c] = v
    out = []
    for r in range(site.n_racks) if racks is None else racks:
        sl = slice(r * cpr, (r + 1) * cpr)
        batch = card_batch(np.arange(r * cpr, (r + 1) * cpr), power_w=power[sl], die_temp_c=die[sl], utilization=0.9)
        sup = (supply_c or {}).get(r, 30.0 + r)
        loop = LoopReading(sup, 40.0 + r, 100.0, 200.0, 1.0)
        out.append(RackReading(r, t, batch, loop, PduReading((pdu_w or {}).get(r, 40_000.0 + 100.0 * r))))
    fac = FacilityReading(t, 18.0, 28.0, 38.0, 30_000.0, 300_000.0, 345_000.0, 30.0) if facility else None
    return Readings(t, tuple(out), fac)


# ------------------------------------------------------------------------------------------------
# a source gone unknown: no stale value, the age says so, the value back with the next reading
# ------------------------------------------------------------------------------------------------
def test_a_rack_whose_readings_turn_nan_past_the_deadline_shows_no_stale_value_then_the_new_one(
    service: AgentService,
) -> None:
    """Rack r1's PDU and loop supply, and card 3 of r0 (its hottest die), read NaN (refused: the belief
    keeps their last valid value, which no longer changes). Within the telemetry deadline the agent
    still controls with that value and exports it; past it, r1's power, supply and return series and
    the card's die series have no sample, r0's hottest die is the hottest of its cards still read, and
    the age of both racks keeps growing; their next valid readings bring the series back with the new
    values. (Before: the last valid values stayed on /metrics for good, an alert on them a lie.)"""
    deadline_s = service.config.control.telemetry_deadline_s
    assert deadline_s == 30.0  # examples/agent.toml
    site = service.site
    r0, r1, r2 = site.rack_names[:3]
    hot = 3  # card 3 of r0
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    service.state.update(_readings(service, T0, card_die_c={hot: 70.0}))
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=r1) == 40_100.0
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) == 31.0
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=r1) == 41.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") == 70.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == 70.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r1) == 0.0

    def gone_nan(t: float) -> Readings:
        """Every other source moves to 61 deg C dies; r1's PDU and supply and r0's card 3 die are NaN."""
        return _readings(
            service, t, die_c=61.0, card_die_c={hot: math.nan}, pdu_w={1: math.nan}, supply_c={1: math.nan}
        )

    half = T0 + deadline_s / 2
    service.state.update(gone_nan(half))
    clock.t_s = half
    s = _scrape(service)  # within the deadline: the belief's value, what the agent controls with
    assert _at(s, "racktwin_rack_power_watts", rack=r1) == 40_100.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") == 70.0

    late = T0 + deadline_s + 1.0
    service.state.update(gone_nan(late))
    clock.t_s = late
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=r1) is None
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) is None
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=r1) is None  # one loop reading: both
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") is None
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == 61.0  # not the stale 70
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r1) == deadline_s + 1.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r0) == deadline_s + 1.0  # its card 3
    # the rest as read, and what does not depend on a reading
    assert _at(s, "racktwin_rack_power_watts", rack=r2) == 40_200.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="4") == 61.0
    assert _at(s, "racktwin_rack_power_limit_watts", rack=r1) == site.rack.power_limit_w
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r2) == 0.0

    back = late + 1.0
    service.state.update(_readings(service, back, card_die_c={hot: 65.0}, pdu_w={1: 41_000.0}, supply_c={1: 33.0}))
    clock.t_s = back
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=r1) == 41_000.0
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) == 33.0
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=r1) == 41.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") == 65.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == 65.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r1) == 0.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=r0) == 0.0


def test_a_silent_rack_has_no_power_temperatures_or_dies_past_the_deadline_only_its_age(
    service: AgentService,
) -> None:
    """A rack that stops publishing altogether: past the deadline none of its measured series has a
    sample (its hottest die neither: no die of it is known), its age is the time since it reported; its
    next round brings them back. (Scraped while it reports first, so that each series shown to go was
    exported: a rack's hottest die kept its value while every die of the rack went unknown, untested.)"""
    deadline_s = service.config.control.telemetry_deadline_s
    name = service.site.rack_names[2]
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    service.state.update(_readings(service, T0))
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=name) == 40_200.0
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=name) == 32.0
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=name) == 42.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=name) == 60.0
    for card in range(service.site.cards_per_rack):
        assert _at(s, "racktwin_card_die_temperature_celsius", rack=name, card=str(card)) == 60.0
    others = tuple(r for r in range(service.site.n_racks) if r != 2)
    t = T0 + deadline_s + 5.0
    service.state.update(_readings(service, t, racks=others))
    clock.t_s = t
    s = _scrape(service)
    for metric in (
        "racktwin_rack_power_watts",
        "racktwin_rack_supply_temperature_celsius",
        "racktwin_rack_return_temperature_celsius",
        "racktwin_rack_max_die_temperature_celsius",
    ):
        assert _at(s, metric, rack=name) is None, metric
    for card in range(service.site.cards_per_rack):
        assert _at(s, "racktwin_card_die_temperature_celsius", rack=name, card=str(card)) is None
    assert _at(s, "racktwin_telemetry_age_seconds", rack=name) == deadline_s + 5.0
    assert _at(s, "racktwin_rack_failsafe", rack=name) == 0.0  # (set by decisions, not by readings)
    back = t + 1.0
    service.state.update(_readings(service, back, die_c=62.0))
    clock.t_s = back
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=name) == 40_200.0
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=name) == 32.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=name) == 62.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=name, card="0") == 62.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=name) == 0.0


def test_the_facility_reads_nan_before_its_first_reading_and_once_it_is_past_the_deadline(
    service: AgentService,
) -> None:
    """No 0 W IT power, PUE 0 or 0 deg C outdoors before the facility has reported (before: 0), no frozen
    value once it stops reporting (before: its last one); its values as read in between."""
    deadline_s = service.config.control.telemetry_deadline_s
    names = (
        "racktwin_it_power_watts",
        "racktwin_facility_power_watts",
        "racktwin_cooling_power_watts",
        "racktwin_pue_ratio",
        "racktwin_ambient_temperature_celsius",
    )
    body = service.metrics.exposition().decode()  # as built, before any update
    first = {s.name: s.value for fam in text_string_to_metric_families(body) for s in fam.samples}
    for name in names:
        assert math.isnan(first[name]), name
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    s = _scrape(service)
    for name in names:
        assert math.isnan(_at(s, name) or 0.0), name
    service.state.update(_readings(service, T0))
    s = _scrape(service)
    assert _at(s, "racktwin_pue_ratio") == pytest.approx(345_000.0 / 300_000.0)
    assert _at(s, "racktwin_ambient_temperature_celsius") == 18.0
    t = T0 + deadline_s + 1.0
    service.state.update(_readings(service, t, facility=False))
    clock.t_s = t
    s = _scrape(service)
    for name in names:
        assert math.isnan(_at(s, name) or 0.0), name
    service.state.update(_readings(service, t + 1.0))
    clock.t_s = t + 1.0
    s = _scrape(service)
    assert _at(s, "racktwin_it_power_watts") == 300_000.0


# ------------------------------------------------------------------------------------------------
# open commands, competing agents, stuck sensors
# ------------------------------------------------------------------------------------------------
def test_open_commands_count_the_books_commands_until_acked_or_expired(service: AgentService) -> None:
    """``racktwin_open_commands``: commands journaled and not yet closed by an ack or expiry."""
    site = service.site
    _plant, state = belief(site, [job("a", 64)], 5)
    snap = state.snapshot()
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = 3  # r0's first cards one level down: one rack command
    lvl[64:72] = 3  # and r1's
    now = 1000.0
    opened = service.book.commands(decision_like(snap, card_level=lvl), snap, np.full(site.n_cards, -1), now)
    assert len(opened) == 2
    assert _at(_scrape(service), "racktwin_open_commands") == 2.0
    first = opened[0]
    ack = wire.Acknowledgement(first.target, uuid.UUID(first.command_id), wire.AckResult.APPLIED, now + 1, 0, "sim")
    assert service.book.on_ack(ack, now + 1) is not None
    assert _at(_scrape(service), "racktwin_open_commands") == 1.0
    assert len(service.book.expire(opened[1].expires_s)) == 1
    assert _at(_scrape(service), "racktwin_open_commands") == 0.0


def test_competing_agents_counts_other_publishers_of_commands_in_enforce_mode_only(tmp_path: Path) -> None:
    """docs/agent.md: other agents alive in enforce mode on the site, and publishers of its commands that
    name no agent, while this agent is in enforce mode; 0 in advisory mode (alert RacktwinAnotherAgentOnSite)."""
    enforce = _service(tmp_path / "e", RACKTWIN_MODE="enforce")
    try:
        assert _at(_scrape(enforce), "racktwin_competing_agents") == 0.0
        assert enforce.standby.on_command("a-script-of-the-site", 0.0)
        s = _scrape(enforce)
        assert _at(s, "racktwin_competing_agents") == 1.0
        assert _at(s, "racktwin_agent_standby") == 1.0  # it names no agent: it commands, this one stands by
    finally:
        enforce.journal.close()
    advisory = _service(tmp_path / "a")
    try:
        advisory.standby.on_command("a-script-of-the-site", 0.0)
        s = _scrape(advisory)
        assert _at(s, "racktwin_competing_agents") == 0.0
        assert _at(s, "racktwin_agent_standby") == 0.0
    finally:
        advisory.journal.close()


def test_stuck_sensor_anomalies_count_stuck_cards_and_racks_and_clear_when_they_move(service: AgentService) -> None:
    """docs (twin.state): a card whose power and die repeat exactly over ``stuck_after_readings``
    readings while its rack's other cards change is stuck; a rack whose loop readings repeat while the
    other racks' change is stuck. Card 5 (r0) and r1's loop are frozen: two flags; once they move: 0."""
    n = service.config.control.stuck_after_readings
    assert n == 20  # examples/agent.toml
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    n_racks = service.site.n_racks

    def reading(k: int, frozen: bool) -> Readings:
        moving = 60.0 + 0.01 * k
        card = 62.0 if frozen else moving + 1.0
        supply = {r: 30.0 + r + 0.01 * k for r in range(n_racks)}
        if frozen:
            supply[1] = 31.0
        return _readings(service, T0 + k, die_c=moving, card_die_c={5: card}, supply_c=supply)

    for k in range(n + 1):
        service.state.update(reading(k, frozen=True))
        clock.t_s = T0 + k
    assert service.state.stuck_cards() == (5,) and service.state.stuck_racks() == (1,)
    assert _at(_scrape(service), "racktwin_anomalies", kind="stuck_sensor") == 2.0
    service.state.update(reading(n + 1, frozen=False))
    clock.t_s = T0 + n + 1
    assert _at(_scrape(service), "racktwin_anomalies", kind="stuck_sensor") == 0.0


def test_the_decided_set_point_and_predicted_facility_power_read_nan_until_the_first_decision(
    service: AgentService,
) -> None:
    """Before any decision there is no decided set-point and no prediction (before: 0 deg C and 0 W, a
    set-point no plant could run at); after one, the decision's own values."""
    s = _scrape(service)
    assert math.isnan(_at(s, "racktwin_supply_setpoint_celsius") or 0.0)
    assert math.isnan(_at(s, "racktwin_predicted_facility_power_watts") or 0.0)
    _plant, state = belief(service.site, [job("a", 64)], 5)
    d = decision_like(state.snapshot(), supply_temp_c=32.0, predicted_facility_power_w=412_000.0)
    service.metric_updates.after_decision(d)
    s = _scrape(service)
    assert _at(s, "racktwin_supply_setpoint_celsius") == 32.0
    assert _at(s, "racktwin_predicted_facility_power_watts") == 412_000.0


# ------------------------------------------------------------------------------------------------
# edges the mutation audit of agent/metric_updates.py found untested
# ------------------------------------------------------------------------------------------------
def test_a_reading_exactly_the_deadline_old_is_still_shown_and_one_a_moment_older_is_not(
    service: AgentService,
) -> None:
    """The controller takes a source read ``control.telemetry_deadline_s`` ago for fresh (``last >= now -
    deadline``: no fail-safe caps yet); /metrics shows its value as long, not a moment less, so that a
    rack's power never goes missing while the agent still controls with it."""
    deadline_s = service.config.control.telemetry_deadline_s
    name = service.site.rack_names[1]
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    service.state.update(_readings(service, T0))
    clock.t_s = T0 + deadline_s
    s = _scrape(service)
    assert _at(s, "racktwin_rack_power_watts", rack=name) == 40_100.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=name) == deadline_s
    clock.t_s = T0 + deadline_s + 0.25
    assert _at(_scrape(service), "racktwin_rack_power_watts", rack=name) is None


def test_a_rack_that_never_reported_has_no_age_until_its_first_reading(service: AgentService) -> None:
    """docs/agent.md: ``racktwin_telemetry_age_seconds`` has no sample before the rack's first reading (not
    an infinite age, nor 0); the racks that report have theirs, and the rack's first reading brings its own."""
    names = service.site.rack_names
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    service.state.update(_readings(service, T0, racks=(0, 1)))  # r2 has not reported yet
    clock.t_s = T0 + 5.0
    s = _scrape(service)
    assert _at(s, "racktwin_telemetry_age_seconds", rack=names[0]) == 5.0
    assert _at(s, "racktwin_telemetry_age_seconds", rack=names[2]) is None
    service.state.update(_readings(service, T0 + 5.0, racks=(2,)))
    s = _scrape(service)
    assert _at(s, "racktwin_telemetry_age_seconds", rack=names[2]) == 0.0


def test_a_facility_drawing_no_it_power_shows_its_readings_with_no_pue(service: AgentService) -> None:
    """A facility reading of 0 W IT power (the wire allows it: every host off, a site at rest) has no PUE
    (NaN, not a division by zero), but its facility and cooling power and outdoor temperature are shown
    as read, and the facility group's update does not fail (a division by 0 W would raise, leave every
    facility gauge NaN and set ``racktwin_metrics_group_failing{group="facility"}``)."""
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    fac = FacilityReading(T0, 12.0, 28.0, 38.0, 4_000.0, 0.0, 6_000.0, 30.0)
    service.state.update(Readings(T0, (), fac))
    s = _scrape(service)
    assert _at(s, "racktwin_it_power_watts") == 0.0
    assert _at(s, "racktwin_facility_power_watts") == 6_000.0
    assert _at(s, "racktwin_cooling_power_watts") == 4_000.0
    assert _at(s, "racktwin_ambient_temperature_celsius") == 12.0
    assert math.isnan(_at(s, "racktwin_pue_ratio") or 0.0)
    assert _at(s, "racktwin_metrics_group_failing", group="facility") == 0.0
