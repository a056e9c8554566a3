"""What the wire takes, gives and refuses where no other test held it (a mutation audit of agent/wire/:
codec, encoding, messages, schemas, topics, rejections): each facility field in its own field; a card
pinned to one clock; the layouts, topics and payload limit the protocol states; bounds of every kind
whose refusal had another reason or none (a job's fields, pump speeds, texts, times, negative power);
the constructors' bounds; ``card_failed`` reasons read back, and one too long for the wire naming as
many cards as fit; equality of per-card messages; the rejection log's window edge."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np
import pytest
from mqtt_testing import sample_messages

from agent import wire
from agent.wire import Codec

pytestmark = pytest.mark.unit

TS = 1_790_000_000.0
FACILITY = "racktwin/v1/site1/facility"
APPLIED = "racktwin/v1/site1/rack/r0/applied"


def test_each_facility_field_decodes_into_its_own_field(codec: Codec) -> None:
    """Every number differs, so a field read from its neighbour (the supply temperature taken for the
    set-point the agent compares it with) shows."""
    got = codec.decode(FACILITY, json.dumps(_facility()))
    assert got == wire.FacilityReading(
        ambient_temp_c=21.0,
        supply_temp_c=31.5,
        return_temp_c=39.5,
        cooling_power_w=12_000.0,
        it_power_w=380_000.0,
        facility_power_w=410_000.0,
        supply_setpoint_c=30.0,
        ts_s=TS,
        seq=3,
        publisher="bms",
    )


def test_a_card_held_at_one_clock_is_a_valid_applied_state(codec: Codec) -> None:
    """``set_clock_range`` takes min = max (a card pinned to one clock, docs/protocol.md: min <= max):
    the rack then reports that range applied, which is no contradiction; min above max is."""
    got = codec.decode(APPLIED, json.dumps(_applied(min_sm_clock_mhz=[1500.0, 1210.0])))
    assert isinstance(got, wire.AppliedState), got
    assert got.min_clock_mhz.tolist() == [1500.0, 1210.0]
    assert got.max_clock_mhz.tolist() == [1500.0, 1980.0]
    assert codec.counter.total == 0


@pytest.mark.parametrize(
    ("racks", "cards_per_rack", "n_levels"),
    [
        (("r0",), 0, 8),
        (("r0",), wire.MAX_CARDS_PER_RACK + 1, 8),
        (("r0",), 64, 0),
        (("r0",), 64, 257),
        (("r0", "r1", "r0"), 64, 8),
    ],
)
def test_a_layout_the_wire_cannot_carry_is_refused(racks: tuple[str, ...], cards_per_rack: int, n_levels: int) -> None:
    """A rack of no cards, more cards than a card index may name, a level table of no levels or more
    than a level may name (0..255), a rack name twice (two racks on one topic): the site spec is wrong,
    said at start, not message by message."""
    with pytest.raises(ValueError, match=r"cards_per_rack|n_levels|unique"):
        wire.SiteLayout("site1", racks, cards_per_rack=cards_per_rack, n_levels=n_levels)


def test_the_largest_layout_the_wire_carries_takes_its_last_card_and_level() -> None:
    """4,096 cards (indices 0..4095) and 256 levels (0..255): the last card and level are in range."""
    codec = Codec(wire.SiteLayout("site1", ("r0",), cards_per_rack=wire.MAX_CARDS_PER_RACK, n_levels=256))
    body: dict[str, Any] = {
        "schema": "racktwin.applied/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "card_index": [wire.MAX_CARDS_PER_RACK - 1],
        "dvfs_level": [255],
        "min_sm_clock_mhz": [1210.0],
        "max_sm_clock_mhz": [1980.0],
        "power_limit_watts": [700.0],
        "low_power": [False],
    }
    got = codec.decode(APPLIED, json.dumps(body))
    assert isinstance(got, wire.AppliedState), got
    assert (got.card_index.tolist(), got.dvfs_level.tolist()) == ([4095], [255])


def test_a_plant_given_its_racks_subscribes_to_their_card_and_pump_commands() -> None:
    """A rack bridge of r0 and r1 gets both racks' card commands and pump commands, the facility's and
    the scheduler's commands, nothing else (a bridge without the pump topic never hears the agent slow
    a pump)."""
    t = wire.Topics("site1")
    assert t.plant_filters(["r0", "r1"]) == (
        "racktwin/v1/site1/rack/r0/cmd",
        "racktwin/v1/site1/rack/r0/cdu_cmd",
        "racktwin/v1/site1/rack/r1/cmd",
        "racktwin/v1/site1/rack/r1/cdu_cmd",
        "racktwin/v1/site1/facility/cmd",
        "racktwin/v1/site1/scheduler/cmd",
    )
    assert t.plant_filters() == (
        "racktwin/v1/site1/rack/+/cmd",
        "racktwin/v1/site1/rack/+/cdu_cmd",
        "racktwin/v1/site1/facility/cmd",
        "racktwin/v1/site1/scheduler/cmd",
    )


def test_the_payload_limit_is_256_kib(codec: Codec) -> None:
    """docs/protocol.md: at most 256 KiB (262,144 bytes), counted here in bytes, not from the constant
    the other size tests measure against: a 4,096-card batch (~170 KB) fits."""
    body = json.dumps(
        {"schema": "racktwin.pdu/1", "ts": TS, "seq": 0, "publisher": "sim", "power_watts": 30e3}
    ).encode()
    exact = body + b" " * (262_144 - len(body))
    assert isinstance(codec.decode("racktwin/v1/site1/rack/r0/pdu", exact), wire.PduReading)
    got = codec.decode("racktwin/v1/site1/rack/r0/pdu", exact + b" ")
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.TOO_LARGE


def test_a_topic_takes_a_rack_exactly_when_its_kind_is_per_rack() -> None:
    """A rack given for a site topic is a caller's mistake said at once, not a message published on the
    site topic as though the rack had been meant (nor one on a rack topic without its rack)."""
    t = wire.Topics("site1")
    with pytest.raises(ValueError, match="site topic"):
        t.of(wire.Kind.FACILITY_ACK, "r0")
    with pytest.raises(ValueError, match="per rack"):
        t.of(wire.Kind.RACK_ACK)
    assert t.of(wire.Kind.RACK_ACK, "r0") == "racktwin/v1/site1/rack/r0/ack"


@pytest.mark.parametrize("name", ["facility", "scheduler", "rack", "jobs", "agent", "observer", "sim"])
def test_no_rack_or_site_takes_a_name_of_a_topic_level_or_a_broker_user(name: str) -> None:
    """The protocol's own levels and the broker's other users (deploy/mosquitto/acl: a rack bridge
    logs in under its rack's name) are no rack or site names."""
    with pytest.raises(ValueError, match="cannot be a topic level"):
        wire.SiteLayout("site1", ("r0", name), 64)
    with pytest.raises(ValueError, match="cannot be a topic level"):
        wire.Topics(name)


def test_a_site_without_a_level_table_still_refuses_a_level_beyond_the_wire(site_layout: wire.SiteLayout) -> None:
    """``n_levels`` None leaves the wire's bound, 0..255: level 256 in applied state or a command is
    out_of_range (a level no DVFS table of the protocol has), not taken nor called a contradiction."""
    codec = Codec(wire.SiteLayout(site_layout.site, site_layout.racks, cards_per_rack=64))
    applied: dict[str, Any] = {
        "schema": "racktwin.applied/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "card_index": [0],
        "dvfs_level": [256],
        "min_sm_clock_mhz": [1210.0],
        "max_sm_clock_mhz": [1980.0],
        "power_limit_watts": [700.0],
        "low_power": [False],
    }
    got = codec.decode(APPLIED, json.dumps(applied))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got
    cmd: dict[str, Any] = {
        "schema": "racktwin.rack_cmd/1",
        "ts": TS,
        "seq": 0,
        "publisher": "agent",
        "command_id": "6f1f2a4e-2b8c-4d3a-9f1e-0a1b2c3d4e5f",
        "expires_at": TS + 30,
        "cards": [0],
        "action": "set_dvfs_level",
        "dvfs_level": 256,
    }
    got = codec.decode("racktwin/v1/site1/rack/r0/cmd", json.dumps(cmd))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


EVENTS = "racktwin/v1/site1/jobs/events"


def _submitted_event() -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid ``submitted`` job event on :data:`EVENTS`: its job, and the whole body holding it."""
    job: dict[str, Any] = {
        "n_cards": 8,
        "work_steps": 1000.0,
        "step_time_seconds": 1.0,
        "compute_share": 0.7,
        "priority": 1.0,
        "submit_ts": TS,
        "checkpoint_interval_seconds": 600.0,
        "checkpoint_duration_seconds": 30.0,
        "noncompute_utilization_percent": 20.0,
        "min_throughput_percent": 50.0,
    }
    body = {
        "schema": "racktwin.job_event/1",
        "ts": TS,
        "seq": 0,
        "publisher": "sched",
        "event": "submitted",
        "job_id": "j1",
        "job": job,
    }
    return job, body


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_cards", 0),
        ("work_steps", 0.0),
        ("step_time_seconds", 0.0),
        ("compute_share", 1.5),
        ("checkpoint_interval_seconds", 0.0),
        ("noncompute_utilization_percent", 100.5),
        ("min_throughput_percent", 100.5),
    ],
)
def test_a_job_field_outside_its_range_is_out_of_range(codec: Codec, field: str, value: float) -> None:
    """A submitted job of no cards, no work, a share above 1 or a percentage above 100 holds a value
    outside the allowed ones (out_of_range, docs/protocol.md's table), not fields that contradict each
    other (inconsistent)."""
    job, body = _submitted_event()
    assert isinstance(codec.decode(EVENTS, json.dumps(body)), wire.JobEvent)
    got = codec.decode(EVENTS, json.dumps({**body, "job": {**job, field: value}}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


def _cmd(**changes: Any) -> dict[str, Any]:
    return {
        "schema": "racktwin.cdu_cmd/1",
        "ts": TS,
        "seq": 0,
        "publisher": "agent",
        "command_id": "6f1f2a4e-2b8c-4d3a-9f1e-0a1b2c3d4e5f",
        "expires_at": TS + 30,
        **changes,
    }


def test_a_pump_command_to_stop_the_pump_is_out_of_range(codec: Codec) -> None:
    """A commanded pump speed must be above 0 % (a stopped pump is a reading, never a command): 0 is
    out_of_range, counted as such, not an ``invalid`` rejection that "should not happen"."""
    topic = "racktwin/v1/site1/rack/r0/cdu_cmd"
    ok = codec.decode(topic, json.dumps(_cmd(pump_speed_percent=40.0)))
    assert isinstance(ok, wire.CduCommand) and ok.pump_speed_frac == pytest.approx(0.4)
    got = codec.decode(topic, json.dumps(_cmd(pump_speed_percent=0.0)))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got
    assert codec.counter.count(wire.RejectReason.INVALID) == 0


def test_a_differential_pressure_below_vacuum_is_out_of_range(codec: Codec) -> None:
    """``delta_pressure_kpa`` down to -100 kPa (a full vacuum on one side) is physical; below is not."""
    body: dict[str, Any] = {
        "schema": "racktwin.cdu/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "supply_temperature_celsius": 30.0,
        "return_temperature_celsius": 38.0,
        "flow_liters_per_minute": 64.0,
        "delta_pressure_kpa": -100.0,
        "pump_power_watts": 90.0,
    }
    topic = "racktwin/v1/site1/rack/r0/cdu"
    ok = codec.decode(topic, json.dumps(body))
    assert isinstance(ok, wire.CduReading) and ok.delta_pressure_pa == -100_000.0
    got = codec.decode(topic, json.dumps({**body, "delta_pressure_kpa": -100.5}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


def test_a_placement_or_a_start_on_no_cards_is_out_of_range(codec: Codec) -> None:
    """A job placed or started on an empty rack -> cards map would run on nothing: refused like an
    empty card list (out_of_range), not taken."""
    place = _cmd(schema="racktwin.scheduler_cmd/1", action="place", job_id="j1", cards={})
    got = codec.decode("racktwin/v1/site1/scheduler/cmd", json.dumps(place))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got
    started = {
        "schema": "racktwin.job_event/1",
        "ts": TS,
        "seq": 0,
        "publisher": "sched",
        "event": "started",
        "job_id": "j1",
        "cards": {},
    }
    got = codec.decode(EVENTS, json.dumps(started))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


def test_a_text_field_holds_at_most_1024_characters(codec: Codec) -> None:
    """An ack's reason (and every free text) is at most ``MAX_TEXT_CHARS`` = 1,024 characters
    (docs/protocol.md: the 1,024-character reason): exactly that is taken, one more is out_of_range."""
    assert wire.MAX_TEXT_CHARS == 1024
    ack = {
        "schema": "racktwin.ack/1",
        "ts": TS,
        "seq": 0,
        "publisher": "sim",
        "command_id": "6f1f2a4e-2b8c-4d3a-9f1e-0a1b2c3d4e5f",
        "result": "rejected",
    }
    topic = "racktwin/v1/site1/rack/r0/ack"
    got = codec.decode(topic, json.dumps({**ack, "reason": "x" * 1024}))
    assert isinstance(got, wire.Acknowledgement) and got.reason == "x" * 1024
    got = codec.decode(topic, json.dumps({**ack, "reason": "x" * 1025}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


def test_a_submitted_event_takes_its_job_and_nothing_else(codec: Codec) -> None:
    """docs/protocol.md: ``submitted`` carries ``job``; only ``finished``, ``failed`` and ``requeued``
    may carry a ``reason``, and "a field that does not belong to the event is rejected"."""
    _job, body = _submitted_event()
    assert isinstance(codec.decode(EVENTS, json.dumps(body)), wire.JobEvent)
    got = codec.decode(EVENTS, json.dumps({**body, "reason": "resubmitted by hand"}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.INCONSISTENT, got
    for event in ("finished", "failed", "requeued"):
        ended = codec.decode(EVENTS, json.dumps({**body, "event": event, "job": None, "reason": "why"}))
        assert isinstance(ended, wire.JobEvent) and ended.reason == "why", (event, ended)


def test_envelope_and_command_times_out_of_range(codec: Codec) -> None:
    """``seq`` counts from 0 (a negative one is no sequence number) and ``expires_at`` is a time like
    ``ts`` (0 .. 1e11 s): each outside is out_of_range, not taken nor called inconsistent."""
    topic = "racktwin/v1/site1/rack/r0/cdu_cmd"
    assert isinstance(codec.decode(topic, json.dumps(_cmd(pump_speed_percent=40.0, seq=0))), wire.CduCommand)
    for bad in (_cmd(pump_speed_percent=40.0, seq=-1), _cmd(pump_speed_percent=40.0, expires_at=2.0e11)):
        got = codec.decode(topic, json.dumps(bad))
        assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, (bad, got)


def test_the_agent_version_holds_at_most_64_characters(codec: Codec) -> None:
    topic = "racktwin/v1/site1/agent/status"
    body = {"schema": "racktwin.agent_status/1", "ts": TS, "seq": 0, "publisher": "agent", "state": "online"}
    got = codec.decode(topic, json.dumps({**body, "version": "v" * 64}))
    assert isinstance(got, wire.AgentStatus) and got.version == "v" * 64
    got = codec.decode(topic, json.dumps({**body, "version": "v" * 65}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


@pytest.mark.parametrize("percent", [0.0, -5.0, 1000.0])
def test_advice_recommends_only_pump_speeds_a_command_may_set(codec: Codec, percent: float) -> None:
    """Advice names the pump speeds the agent would command (docs/protocol.md): above 0 and at most
    the pump's top speed, like ``cdu_cmd``; another one is out_of_range."""
    body: dict[str, Any] = {
        "schema": "racktwin.advice/1",
        "ts": TS,
        "seq": 0,
        "publisher": "agent",
        "items": [],
        "pump_speed_percent": {"r0": 60.0},
    }
    topic = "racktwin/v1/site1/agent/advice"
    ok = codec.decode(topic, json.dumps(body))
    assert isinstance(ok, wire.AgentAdvice) and ok.pump_speeds == {"r0": pytest.approx(0.6)}
    got = codec.decode(topic, json.dumps({**body, "pump_speed_percent": {"r0": percent}}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


def _facility(**changes: Any) -> dict[str, Any]:
    return {
        "schema": "racktwin.facility/1",
        "ts": TS,
        "seq": 3,
        "publisher": "bms",
        "ambient_temperature_celsius": 21.0,
        "supply_temperature_celsius": 31.5,
        "return_temperature_celsius": 39.5,
        "cooling_power_watts": 12_000.0,
        "it_power_watts": 380_000.0,
        "facility_power_watts": 410_000.0,
        "supply_setpoint_celsius": 30.0,
        **changes,
    }


def _applied(**changes: Any) -> dict[str, Any]:
    return {
        "schema": "racktwin.applied/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "card_index": [0, 1],
        "dvfs_level": [3, 7],
        "min_sm_clock_mhz": [1210.0, 1210.0],
        "max_sm_clock_mhz": [1500.0, 1980.0],
        "power_limit_watts": [700.0, 700.0],
        "low_power": [False, False],
        **changes,
    }


@pytest.mark.parametrize(
    ("topic", "body"),
    [
        (FACILITY, _facility(it_power_watts=-1.0)),
        (FACILITY, _facility(cooling_power_watts=-0.5)),
        (FACILITY, _facility(facility_power_watts=-1.0)),
        (APPLIED, _applied(min_sm_clock_mhz=[-0.5, 1210.0])),
    ],
    ids=["negative IT power", "negative cooling power", "negative facility power", "negative clock"],
)
def test_a_negative_power_or_clock_is_out_of_range(codec: Codec, topic: str, body: dict[str, Any]) -> None:
    """docs/protocol.md: negative power is physically impossible (out_of_range), so is a negative clock."""
    got = codec.decode(topic, json.dumps(body))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.OUT_OF_RANGE, got


# ---- messages: what the constructors refuse, as the wire does ------------------------------------


def test_card_settings_and_pump_commands_hold_the_wire_bounds() -> None:
    """What the code may build is what the wire carries: levels 0..255, a clock range 0 < min <= max
    (min = max pins one clock), a pump speed above 0 up to the top speed; outside, the constructor
    refuses rather than a receiver rejecting the command."""
    assert wire.CardSetting.dvfs(255).dvfs_level == 255
    for level in (-1, 256):
        with pytest.raises(ValueError, match=r"outside 0\.\.255"):
            wire.CardSetting.dvfs(level)
    pinned = wire.CardSetting.clock_range(1500.0, 1500.0)
    assert (pinned.min_clock_mhz, pinned.max_clock_mhz) == (1500.0, 1500.0)
    with pytest.raises(ValueError, match="0 < min_sm_clock_mhz"):
        wire.CardSetting.clock_range(0.0, 1500.0)
    cid = wire.new_command_id()
    assert wire.CduCommand("r0", 1.0, cid, TS + 30, TS, 0, "agent").pump_speed_frac == 1.0
    for frac in (0.0, 1.01, float("nan")):
        with pytest.raises(ValueError, match="pump_speed_frac"):
            wire.CduCommand("r0", frac, cid, TS + 30, TS, 0, "agent")


def test_a_clock_range_pinned_to_one_clock_travels_and_from_zero_is_inconsistent(codec: Codec) -> None:
    cmd: dict[str, Any] = {
        "schema": "racktwin.rack_cmd/1",
        "ts": TS,
        "seq": 0,
        "publisher": "agent",
        "command_id": "6f1f2a4e-2b8c-4d3a-9f1e-0a1b2c3d4e5f",
        "expires_at": TS + 30,
        "cards": [0, 1],
        "action": "set_clock_range",
        "min_sm_clock_mhz": 1500.0,
        "max_sm_clock_mhz": 1500.0,
    }
    topic = "racktwin/v1/site1/rack/r0/cmd"
    got = codec.decode(topic, json.dumps(cmd))
    assert isinstance(got, wire.RackCommand) and got.setting == wire.CardSetting.clock_range(1500.0, 1500.0)
    got = codec.decode(topic, json.dumps({**cmd, "min_sm_clock_mhz": 0.0}))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.INCONSISTENT, got


def test_a_card_failed_reason_that_fits_exactly_names_every_card() -> None:
    """A reason of exactly ``MAX_TEXT_CHARS`` characters lists all its cards, without ``and N more``
    (the agent marks every named card dead; one cut short leaves cards to be commanded again)."""
    cards = list(range(200, 200 + 176))
    short = wire.card_failed_reason("r", cards)
    assert len(short) < wire.MAX_TEXT_CHARS and " more " not in short
    rack = "r" * (1 + wire.MAX_TEXT_CHARS - len(short))
    assert len(rack) <= 64  # a rack name the wire allows
    reason = wire.card_failed_reason(rack, cards)
    assert len(reason) == wire.MAX_TEXT_CHARS
    assert " more " not in reason
    assert wire.failed_cards_of(reason) == tuple(cards)
    assert wire.failed_cards_by_rack(reason) == {rack: tuple(cards)}


def test_card_failed_reasons_read_back_only_as_card_failed_and_in_whole_clauses() -> None:
    """Only a ``card_failed`` reason names dead cards (a ``superseded`` one quoting the words names
    none); clauses are read while ``; `` joins them; a rack of no failed cards takes no clause (the
    racks after it stay readable); the code before ``:`` is read without the spaces around it."""
    assert wire.failed_cards_of("superseded: card 3 of rack r1 has failed") == ()
    assert wire.failed_cards_of(wire.card_failed_reason("r1", [3, 9])) == (3, 9)
    joined = "card_failed: card 5 of rack r0 has failed, card 7 of rack r1 has failed"
    assert wire.failed_cards_by_rack(joined) == {"r0": (5,)}
    reason = wire.placement_card_failed_reason({"r0": [], "r1": [3]})
    assert "r0" not in reason
    assert wire.failed_cards_by_rack(reason) == {"r1": (3,)}
    assert wire.reason_code(" superseded : card 3") == "superseded"


def test_messages_with_per_card_arrays_compare_by_their_values() -> None:
    """``==`` of card batches and applied states compares the arrays' values; ``approx_equal`` neither
    broadcasts one array over another of another shape nor takes a mapping with other keys."""
    a = next(m for m in sample_messages(TS) if isinstance(m, wire.CardBatch))
    power = a.power_w.copy()
    power[0] += 1.0
    assert a == dataclasses.replace(a)
    assert a != dataclasses.replace(a, power_w=power)
    assert not wire.approx_equal(np.array([1.0]), np.array([1.0, 1.0]))
    assert not wire.approx_equal({"r0": 1.0}, {"r0": 1.0, "r1": 2.0})
    assert not wire.approx_equal({"r0": 1.0, "r1": 2.0}, {"r0": 1.0})
    assert wire.approx_equal({"r0": 1.0}, {"r0": 1.0 + 1e-12})


def test_a_new_log_window_opens_exactly_one_interval_after_the_last(caplog: pytest.LogCaptureFixture) -> None:
    """Fixed windows of ``log_interval_s``: at exactly 10 s after a window opened, the next one opens and
    logs again (and says how many the last one left out)."""
    now = [0.0]
    counter = wire.RejectionCounter(log_interval_s=10.0, log_burst=1, clock=lambda: now[0])
    rej = wire.Rejection(wire.RejectReason.MALFORMED_JSON, "not json", "racktwin/v1/site1/rack/r0/cards")
    with caplog.at_level(logging.WARNING, logger="racktwin.wire"):
        counter.record(rej)
        counter.record(rej)
        now[0] = 10.0
        counter.record(rej)
    assert len(caplog.records) == 2
    assert "1 more malformed_json rejections not logged" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("n_cards", [300, 4096])
def test_a_card_failed_reason_too_long_names_as_many_cards_as_fit(n_cards: int) -> None:
    """docs/protocol.md: a list too long for the 1,024-character reason names the cards that fit and
    ``and N more``: naming the next card too would pass the bound, for every length of rack name (one of
    them fills the reason to the last character)."""
    cards = list(range(n_cards))
    exact = 0
    for k in range(1, 65):
        rack = "r" * k
        reason = wire.card_failed_reason(rack, cards)
        kept = wire.failed_cards_of(reason)
        assert len(reason) <= wire.MAX_TEXT_CHARS and kept == tuple(cards[: len(kept)]) and kept
        assert f" and {n_cards - len(kept)} more of rack {rack} have failed" in reason
        one_more = reason.replace(
            f"{kept[-1]} and {n_cards - len(kept)} more",
            f"{kept[-1]}, {cards[len(kept)]} and {n_cards - len(kept) - 1} more",
        )
        assert len(one_more) > wire.MAX_TEXT_CHARS, (k, len(reason))
        exact += len(reason) == wire.MAX_TEXT_CHARS
    assert exact  # the bound itself was reached


def test_per_card_limits_stay_with_their_cards_in_the_order_sent(codec: Codec) -> None:
    """A command's ``cards`` keep the order they were sent in, since a per-card ``power_limit_watts``
    is aligned with it: cards 5, 2, 9 at 300, 450, 600 W are card 5 at 300 W, card 2 at 450 W, card 9
    at 600 W, both written by hand and through the encoder."""
    cmd: dict[str, Any] = {
        "schema": "racktwin.rack_cmd/1",
        "ts": TS,
        "seq": 0,
        "publisher": "agent",
        "command_id": "6f1f2a4e-2b8c-4d3a-9f1e-0a1b2c3d4e5f",
        "expires_at": TS + 30,
        "cards": [5, 2, 9],
        "action": "set_power_limit",
        "power_limit_watts": [300.0, 450.0, 600.0],
    }
    topic = "racktwin/v1/site1/rack/r0/cmd"
    got = codec.decode(topic, json.dumps(cmd))
    assert isinstance(got, wire.RackCommand), got
    assert dict(zip(got.cards, got.setting.limits_w(3), strict=True)) == {5: 300.0, 2: 450.0, 9: 600.0}
    assert json.loads(wire.encode(got))["cards"] == [5, 2, 9]
    back = codec.decode(topic, wire.encode(got))
    assert back == got


def test_a_rejection_detail_is_bounded_whatever_the_payload(codec: Codec) -> None:
    """A rejection's detail (kept with the rejection, logged, shown) is at most 300 characters, also
    when the parser's message quotes a 10,000-character field name of the payload."""
    body = {"schema": "racktwin.pdu/1", "ts": TS, "seq": 0, "publisher": "sim", "power_watts": 1.0, "x" * 10_000: 1}
    got = codec.decode("racktwin/v1/site1/rack/r0/pdu", json.dumps(body))
    assert isinstance(got, wire.Rejection) and got.reason is wire.RejectReason.UNKNOWN_FIELD, got
    assert len(got.detail) <= 300
