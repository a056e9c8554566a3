"""The MQTT protocol (agent/wire/) without a broker: topics, round trips, units, rejections."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import numpy as np
import pytest
from mqtt_testing import REPO, sample_messages

from agent import wire
from agent.wire import Codec, Kind, Rejection, RejectReason, SiteLayout, Topics
from agent.wire.codec import _non_finite_literal
from agent.wire.schemas import _JobEventW
from twin.spec import load_site

pytestmark = pytest.mark.unit

TS = 1_790_000_000.0


# ---- topics ------------------------------------------------------------------------------------


def test_topic_names_follow_the_documented_table() -> None:
    t = Topics("site1")
    assert t.cards("r0") == "racktwin/v1/site1/rack/r0/cards"
    assert t.cdu("r0") == "racktwin/v1/site1/rack/r0/cdu"
    assert t.pdu("r0") == "racktwin/v1/site1/rack/r0/pdu"
    assert t.rack_cmd("r0") == "racktwin/v1/site1/rack/r0/cmd"
    assert t.rack_ack("r0") == "racktwin/v1/site1/rack/r0/ack"
    assert t.applied("r0") == "racktwin/v1/site1/rack/r0/applied"
    assert t.facility == "racktwin/v1/site1/facility"
    assert t.facility_cmd == "racktwin/v1/site1/facility/cmd"
    assert t.facility_ack == "racktwin/v1/site1/facility/ack"
    assert t.job_events == "racktwin/v1/site1/jobs/events"
    assert t.scheduler_cmd == "racktwin/v1/site1/scheduler/cmd"
    assert t.scheduler_ack == "racktwin/v1/site1/scheduler/ack"
    assert t.agent_status == "racktwin/v1/site1/agent/status"
    assert t.advice == "racktwin/v1/site1/agent/advice"
    assert t.filter(Kind.CARDS) == "racktwin/v1/site1/rack/+/cards"
    assert "racktwin/v1/site1/rack/+/cmd" in t.plant_filters()
    assert t.plant_filters(["r1"])[0] == "racktwin/v1/site1/rack/r1/cmd"
    assert set(t.agent_filters()).isdisjoint(t.plant_filters())


@pytest.mark.parametrize("bad", ["", "a/b", "a+b", "#", "agent", "facility", "x" * 65, "s p", "r0\n"])
def test_site_and_rack_names_must_be_single_safe_topic_levels(bad: str) -> None:
    with pytest.raises(ValueError):
        Topics(bad)
    with pytest.raises(ValueError):
        SiteLayout("site1", ("r0", bad), 64)


def test_layout_from_the_example_site() -> None:
    spec = load_site(REPO / "examples" / "supernode-512.toml")
    layout = SiteLayout.from_spec(spec, site="site1")
    assert layout.racks == tuple(f"r{i}" for i in range(8))
    assert layout.cards_per_rack == 64
    assert layout.n_levels == spec.card.n_levels


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("racktwin/v1/site1/rack/r9/cards", RejectReason.UNKNOWN_RACK),
        ("racktwin/v1/site1/rack/r0/voltage", RejectReason.UNKNOWN_TOPIC),
        ("racktwin/v1/site1/rack/r0/cards/extra", RejectReason.UNKNOWN_TOPIC),
        ("racktwin/v1/other/rack/r0/cards", RejectReason.UNKNOWN_TOPIC),
        ("racktwin/v2/site1/rack/r0/cards", RejectReason.UNKNOWN_TOPIC),
        ("racktwin/v1/site1/r0/cards", RejectReason.UNKNOWN_TOPIC),
        ("racktwin/v1/site1/facility/cmd/x", RejectReason.UNKNOWN_TOPIC),
        ("", RejectReason.UNKNOWN_TOPIC),
    ],
)
def test_bad_topics_are_rejected_and_counted(codec: Codec, topic: str, reason: RejectReason) -> None:
    result = codec.decode(topic, b"{}")
    assert isinstance(result, Rejection)
    assert result.reason is reason
    assert codec.counter.count(reason) == 1
    assert codec.counter.total == 1


def test_parse_topic(codec: Codec) -> None:
    assert codec.parse_topic("racktwin/v1/site1/rack/r5/applied") == wire.TopicInfo(Kind.APPLIED, "r5")
    assert codec.parse_topic("racktwin/v1/site1/jobs/events") == wire.TopicInfo(Kind.JOB_EVENT, None)


# ---- round trips -------------------------------------------------------------------------------


def test_every_message_kind_round_trips(codec: Codec, all_messages: list[Any]) -> None:
    kinds = set()
    for msg in all_messages:
        out = codec.outgoing(msg)
        back = codec.decode(out.topic, out.payload)
        assert not isinstance(back, Rejection), back
        assert back == msg, type(msg).__name__
        assert wire.approx_equal(back, msg)
        kinds.add(wire.kind_of(msg))
    assert kinds == set(Kind)
    assert codec.counter.total == 0


def test_qos_and_retain_per_kind(codec: Codec, all_messages: list[Any]) -> None:
    for msg in all_messages:
        out = codec.outgoing(msg)
        kind = wire.kind_of(msg)
        if isinstance(msg, wire.RackCommand | wire.FacilityCommand | wire.SchedulerCommand):
            assert (out.qos, out.retain) == (1, False)
        elif kind in (Kind.APPLIED, Kind.AGENT_STATUS, Kind.JOB_STATE):
            assert (out.qos, out.retain) == (1, True)
        elif kind in (Kind.CARDS, Kind.CDU, Kind.PDU, Kind.FACILITY):
            assert (out.qos, out.retain) == (0, False)
        else:
            assert (out.qos, out.retain) == (1, False)


def test_ack_topics_follow_their_target(codec: Codec) -> None:
    cid = wire.new_command_id()
    for target, topic in [
        ("r1", "racktwin/v1/site1/rack/r1/ack"),
        (wire.FACILITY, "racktwin/v1/site1/facility/ack"),
        (wire.SCHEDULER, "racktwin/v1/site1/scheduler/ack"),
    ]:
        ack = wire.Acknowledgement(target, cid, wire.AckResult.APPLIED, ts_s=TS, seq=0, publisher="sim")
        assert codec.topic_for(ack) == topic


def test_wire_names_and_units(codec: Codec, all_messages: list[Any]) -> None:
    cards, cdu = all_messages[0], all_messages[1]
    payload = json.loads(wire.encode(cards))
    assert payload["schema"] == "racktwin.cards/1"
    assert set(payload) == {
        "schema",
        "ts",
        "seq",
        "publisher",
        "card_index",
        "power_watts",
        "temperature_celsius",
        "sm_clock_mhz",
        "utilization_percent",
        "power_limit_watts",
        "low_power",
    }
    assert payload["utilization_percent"] == pytest.approx(list(cards.utilization * 100.0))
    payload = json.loads(wire.encode(cdu))
    assert payload["delta_pressure_kpa"] == pytest.approx(cdu.delta_pressure_pa / 1000.0)
    assert payload["flow_liters_per_minute"] == cdu.flow_lpm
    decoded = codec.decode(codec.topics.cdu("r3"), wire.encode(cdu))
    assert isinstance(decoded, wire.CduReading)
    assert decoded.delta_pressure_pa == pytest.approx(150_000.0)


def test_card_batches_decode_to_numpy_arrays(codec: Codec, all_messages: list[Any]) -> None:
    batch = codec.decode(codec.topics.cards("r3"), wire.encode(all_messages[0]))
    assert isinstance(batch, wire.CardBatch)
    assert batch.card_index.dtype == np.int64
    assert batch.power_w.dtype == np.float64
    assert batch.low_power.dtype == np.bool_
    assert float(batch.utilization.max()) <= 1.0
    assert batch.rack == "r3"


def test_a_batch_may_hold_a_subset_of_cards(codec: Codec) -> None:
    payload = _cards_payload(card_index=[5, 2, 63])
    batch = codec.decode(codec.topics.cards("r0"), payload)
    assert isinstance(batch, wire.CardBatch)
    assert batch.card_index.tolist() == [5, 2, 63]


def test_percent_conversion_is_approximately_exact() -> None:
    layout = SiteLayout("s", ("r0",), 4)
    codec = Codec(layout)
    u = np.array([0.1, 0.29, 0.57, 1.0 / 3.0])
    batch = wire.CardBatch(
        "r0", np.arange(4), np.ones(4), np.ones(4), np.ones(4), u, np.ones(4), np.zeros(4, bool), TS, 0, "p"
    )
    back = codec.decode(codec.topics.cards("r0"), wire.encode(batch))
    assert wire.approx_equal(back, batch)


# ---- commands ----------------------------------------------------------------------------------


def test_expiry_and_acks(all_messages: list[Any], codec: Codec) -> None:
    cmd = next(m for m in all_messages if isinstance(m, wire.RackCommand))
    assert not wire.is_expired(cmd, cmd.ts_s)
    assert not wire.is_expired(cmd, cmd.expires_s - 1e-3)
    assert wire.is_expired(cmd, cmd.expires_s)
    ack = wire.ack_for(cmd, wire.AckResult.EXPIRED, ts_s=cmd.expires_s + 1, seq=0, publisher="sim")
    assert (ack.target, ack.command_id, ack.result) == ("r2", cmd.command_id, wire.AckResult.EXPIRED)
    fac = next(m for m in all_messages if isinstance(m, wire.FacilityCommand))
    assert wire.ack_for(fac, wire.AckResult.APPLIED, ts_s=TS, seq=0, publisher="sim").target == wire.FACILITY
    sched = next(m for m in all_messages if isinstance(m, wire.SchedulerCommand))
    assert wire.ack_for(sched, wire.AckResult.APPLIED, ts_s=TS, seq=0, publisher="sim").target == wire.SCHEDULER
    # a rack's pump command is acked by the rack, on the rack's ack topic (the broker's ACL lets a rack
    # write only there)
    pump = next(m for m in all_messages if isinstance(m, wire.CduCommand))
    pump_ack = wire.ack_for(pump, wire.AckResult.APPLIED, ts_s=TS, seq=0, publisher="sim")
    assert pump_ack.target == pump.rack == "r2"
    assert codec.outgoing(pump_ack).topic == "racktwin/v1/site1/rack/r2/ack"


def test_a_command_may_live_an_hour_and_be_issued_up_to_ten_seconds_ahead_of_the_rack() -> None:
    """``wire.command_time_problem`` at its bounds (docs/protocol.md): a life of MAX_COMMAND_TTL_S
    (3600 s) and an issue time MAX_ISSUE_AHEAD_S (10 s, or the rack's own bound) ahead are accepted;
    a millisecond more is refused with its code."""

    def cmd(ts: float, life_s: float) -> wire.RackCommand:
        return wire.RackCommand("r0", (0,), wire.CardSetting.dvfs(3), uuid.uuid4(), ts + life_s, ts, 0, "agent")

    assert wire.command_time_problem(cmd(TS, 3600.0), TS) is None
    assert wire.reason_code(wire.command_time_problem(cmd(TS, 3600.001), TS)) == wire.AckReason.TTL_TOO_LONG
    assert wire.command_time_problem(cmd(TS + 10.0, 30.0), TS) is None
    assert wire.reason_code(wire.command_time_problem(cmd(TS + 10.001, 30.0), TS)) == wire.AckReason.ISSUED_AHEAD
    assert wire.command_time_problem(cmd(TS + 200.0, 30.0), TS, max_ahead_s=200.0) is None
    assert wire.command_time_problem(cmd(TS + 200.001, 30.0), TS, max_ahead_s=200.0) is not None


def test_a_command_issued_ahead_is_refused_naming_the_clock_of_its_target() -> None:
    """The ``issued_ahead`` reason names whose clock the command is ahead of (docs/protocol.md,
    "Which commands a rack applies"): the rack's for a rack or pump command, the facility's, the
    scheduler's. It said "the rack's clock" for the facility and the scheduler too."""
    cid, ts = uuid.uuid4(), TS + 20.0
    commands: list[tuple[wire.Command, str]] = [
        (wire.RackCommand("r0", (0,), wire.CardSetting.dvfs(3), cid, ts + 30, ts, 0, "agent"), "rack r0"),
        (wire.CduCommand("r2", 0.8, cid, ts + 30, ts, 0, "agent"), "rack r2"),
        (wire.FacilityCommand(20.0, cid, ts + 30, ts, 0, "agent"), "the facility"),
        (wire.SchedulerCommand("j", {"r1": (0,)}, cid, ts + 30, ts, 0, "agent"), "the scheduler"),
    ]
    for command, whose in commands:
        reason = wire.command_time_problem(command, TS)
        assert reason == (
            f"issued_ahead: ts {ts:.3f} is 20 s ahead of the clock of {whose} ({TS:.3f}); at most 10 s is accepted"
        )


def test_card_settings_take_exactly_their_parameters() -> None:
    with pytest.raises(ValueError, match="takes dvfs_level"):
        wire.CardSetting(wire.CardAction.SET_DVFS_LEVEL)
    with pytest.raises(ValueError, match="takes no parameters"):
        wire.CardSetting(wire.CardAction.WAKE, power_limit_w=100.0)
    with pytest.raises(ValueError, match="min_sm_clock_mhz <= max"):
        wire.CardSetting.clock_range(1500.0, 1200.0)
    with pytest.raises(ValueError, match="positive"):
        wire.CardSetting.power_limit(0.0)
    with pytest.raises(ValueError, match="positive"):
        wire.CardSetting.power_limit([300.0, -1.0])
    for not_finite in (float("inf"), float("nan")):  # no JSON number: the wire could not carry it
        with pytest.raises(ValueError, match="positive"):
            wire.CardSetting.power_limit(not_finite)
        with pytest.raises(ValueError, match="positive"):
            wire.CardSetting.power_limit([300.0, not_finite])
    with pytest.raises(ValueError, match="empty"):
        wire.CardSetting.power_limit([])
    # one limit per card: as many values as cards, in the cards' order
    per_card = wire.CardSetting.power_limit([300.0, 450.0])
    assert per_card.per_card and per_card.limits_w(2) == (300.0, 450.0)
    assert wire.CardSetting.power_limit(300.0).limits_w(3) == (300.0, 300.0, 300.0)
    with pytest.raises(ValueError, match="2 values for 3 cards"):
        wire.RackCommand("r0", (0, 1, 2), per_card, uuid.uuid4(), TS + 30, TS, 0, "agent")


def test_a_per_card_power_limit_travels_as_one_column(codec: Codec) -> None:
    cmd = wire.RackCommand(
        "r1", (3, 7, 9), wire.CardSetting.power_limit([210.0, 287.5, 700.0]), uuid.uuid4(), TS + 30, TS, 4, "agent"
    )
    out = codec.outgoing(cmd)
    body = json.loads(out.payload)
    assert body["cards"] == [3, 7, 9] and body["power_limit_watts"] == [210.0, 287.5, 700.0]
    assert codec.decode(out.topic, out.payload) == cmd


def test_host_power_actions_take_no_parameters_and_round_trip(codec: Codec) -> None:
    for setting, action in (
        (wire.CardSetting.host_power_off(), "host_power_off"),
        (wire.CardSetting.host_power_on(), "host_power_on"),
    ):
        assert setting.action.value == action
        cmd = wire.RackCommand("r1", tuple(range(8, 16)), setting, uuid.uuid4(), TS + 30, TS, 3, "agent")
        out = codec.outgoing(cmd)
        body = json.loads(out.payload)
        assert body["action"] == action and body["cards"] == list(range(8, 16))
        assert not {"dvfs_level", "min_sm_clock_mhz", "max_sm_clock_mhz", "power_limit_watts"} & set(body)
        assert codec.decode(out.topic, out.payload) == cmd
        item = wire.AdviceItem("r1", (0, 1), setting)  # advisory mode recommends host power too
        advice = wire.AgentAdvice((item,), ts_s=TS, seq=0, publisher="agent")
        assert codec.decode(codec.topics.advice, wire.encode(advice)) == advice
    with pytest.raises(ValueError, match="takes no parameters"):
        wire.CardSetting(wire.CardAction.HOST_POWER_OFF, dvfs_level=1)
    with pytest.raises(ValueError, match="takes no parameters"):
        wire.CardSetting(wire.CardAction.HOST_POWER_ON, power_limit_w=300.0)


def test_the_host_off_column_is_optional(codec: Codec) -> None:
    # a payload without it (publishers before the column, sites without host power) still decodes
    old = codec.decode(CARDS, _cards_payload())
    assert isinstance(old, wire.CardBatch) and old.host_off is None
    new = codec.decode(CARDS, _cards_payload(host_off=[True, True, False, False]))
    assert isinstance(new, wire.CardBatch) and new.host_off is not None
    assert new.host_off.dtype == np.bool_ and new.host_off.tolist() == [True, True, False, False]
    assert old != new
    # encoding: the column is written when known and left out when not
    assert "host_off" not in json.loads(wire.encode(old))
    assert json.loads(wire.encode(new))["host_off"] == [True, True, False, False]
    assert codec.decode(CARDS, wire.encode(new)) == new
    # the applied state carries it the same way
    applied = {
        "schema": "racktwin.applied/1",
        "ts": TS,
        "seq": 0,
        "publisher": "sim",
        "card_index": [0, 1],
        "dvfs_level": [0, 0],
        "min_sm_clock_mhz": [1210.0, 1210.0],
        "max_sm_clock_mhz": [1980.0, 1980.0],
        "power_limit_watts": [700.0, 700.0],
        "low_power": [True, False],
    }
    topic = codec.topics.applied("r0")
    state = codec.decode(topic, json.dumps(applied))
    assert isinstance(state, wire.AppliedState) and state.host_off is None
    state = codec.decode(topic, json.dumps({**applied, "host_off": [True, False]}))
    assert isinstance(state, wire.AppliedState) and state.host_off is not None
    assert state.host_off.tolist() == [True, False]
    bad = codec.decode(topic, json.dumps({**applied, "host_off": [True]}))
    assert isinstance(bad, Rejection) and bad.reason is RejectReason.LENGTH_MISMATCH


def test_command_ids_are_uuids(codec: Codec, all_messages: list[Any]) -> None:
    cmd = next(m for m in all_messages if isinstance(m, wire.RackCommand))
    payload = json.loads(wire.encode(cmd))
    assert uuid.UUID(payload["command_id"]) == cmd.command_id
    assert payload["expires_at"] == cmd.expires_s


# ---- rejections --------------------------------------------------------------------------------


def _cards_payload(**changes: Any) -> bytes:
    n = 4
    body: dict[str, Any] = {
        "schema": "racktwin.cards/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "card_index": list(range(n)),
        "power_watts": [300.0] * n,
        "temperature_celsius": [55.0] * n,
        "sm_clock_mhz": [1980.0] * n,
        "utilization_percent": [90.0] * n,
        "power_limit_watts": [700.0] * n,
        "low_power": [False] * n,
    }
    if "card_index" in changes and "power_watts" not in changes:
        m = len(changes["card_index"])
        for k in ("power_watts", "temperature_celsius", "sm_clock_mhz", "utilization_percent", "power_limit_watts"):
            body[k] = body[k][:1] * m
        body["low_power"] = [False] * m
    for key, value in changes.items():
        if value is _DELETE:
            del body[key]
        else:
            body[key] = value
    return json.dumps(body).encode()


def _cdu_payload(**changes: Any) -> bytes:
    body: dict[str, Any] = {
        "schema": "racktwin.cdu/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "supply_temperature_celsius": 30.0,
        "return_temperature_celsius": 38.0,
        "flow_liters_per_minute": 64.0,
        "delta_pressure_kpa": 40.0,
        "pump_power_watts": 90.0,
        "pump_speed_percent": 100.0,
    }
    return json.dumps({**body, **changes}).encode()


def _pdu_payload(**changes: Any) -> bytes:
    body: dict[str, Any] = {"schema": "racktwin.pdu/1", "ts": TS, "seq": 1, "publisher": "sim", "power_watts": 30e3}
    return json.dumps({**body, **changes}).encode()


def _cmd_payload(**changes: Any) -> bytes:
    body: dict[str, Any] = {
        "schema": "racktwin.rack_cmd/1",
        "ts": TS,
        "seq": 1,
        "publisher": "agent",
        "command_id": str(uuid.uuid4()),
        "expires_at": TS + 30,
        "cards": [0, 1],
        "action": "set_dvfs_level",
        "dvfs_level": 2,
    }
    for key, value in changes.items():
        if value is _DELETE:
            del body[key]
        else:
            body[key] = value
    return json.dumps(body).encode()


def _applied_payload(**changes: Any) -> bytes:
    body: dict[str, Any] = {
        "schema": "racktwin.applied/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "card_index": [0, 1],
        "dvfs_level": [0, 7],
        "min_sm_clock_mhz": [1210.0, 1210.0],
        "max_sm_clock_mhz": [1980.0, 1980.0],
        "power_limit_watts": [700.0, 700.0],
        "low_power": [False, False],
    }
    return json.dumps({**body, **changes}).encode()


_DELETE = object()
CARDS = "racktwin/v1/site1/rack/r0/cards"
CMD = "racktwin/v1/site1/rack/r0/cmd"
CDU = "racktwin/v1/site1/rack/r0/cdu"
PDU = "racktwin/v1/site1/rack/r0/pdu"
APPLIED = "racktwin/v1/site1/rack/r0/applied"

REJECTED: list[tuple[str, str, bytes | str, RejectReason]] = [
    ("not json", CARDS, b"power=300", RejectReason.MALFORMED_JSON),
    ("truncated", CARDS, _cards_payload()[:-5], RejectReason.MALFORMED_JSON),
    ("trailing data", CARDS, _cards_payload() + b" {}", RejectReason.MALFORMED_JSON),
    ("not utf-8", CARDS, b'{"schema": "\xff\xfe"}', RejectReason.MALFORMED_JSON),
    ("empty", CARDS, b"", RejectReason.MALFORMED_JSON),
    ("NaN literal", CARDS, _cards_payload().replace(b"300.0", b"NaN", 1), RejectReason.NON_FINITE),
    ("Infinity literal", CARDS, _cards_payload().replace(b"55.0", b"-Infinity", 1), RejectReason.NON_FINITE),
    ("overflow to inf", CARDS, _cards_payload().replace(b"300.0", b"1e400", 1), RejectReason.NON_FINITE),
    # "NaN" or "Infinity" in a string is JSON: a payload malformed elsewhere is malformed, not non_finite
    ("NaN in a string, truncated", CARDS, _cards_payload(publisher="NaN")[:-5], RejectReason.MALFORMED_JSON),
    (
        "Infinity in a string, trailing data",
        CARDS,
        _cards_payload(publisher="Infinity") + b"}",
        RejectReason.MALFORMED_JSON,
    ),
    (
        "NaN literal after a string NaN",
        CARDS,
        _cards_payload(publisher="NaN").replace(b"300.0", b"NaN", 1),
        RejectReason.NON_FINITE,
    ),
    ("NaN in a string, not json", CDU, '{"publisher": "NaN" oops}', RejectReason.MALFORMED_JSON),
    ("top-level array", CARDS, b"[1, 2]", RejectReason.WRONG_TYPE),
    ("missing field", CARDS, _cards_payload(sm_clock_mhz=_DELETE), RejectReason.MISSING_FIELD),
    ("missing schema", CARDS, _cards_payload(schema=_DELETE), RejectReason.MISSING_FIELD),
    ("missing seq", CARDS, _cards_payload(seq=_DELETE), RejectReason.MISSING_FIELD),
    ("extra field", CARDS, _cards_payload(voltage_volts=[1.0] * 4), RejectReason.UNKNOWN_FIELD),
    ("wrong type str", CARDS, _cards_payload(ts="yesterday"), RejectReason.WRONG_TYPE),
    ("wrong type bool", CARDS, _cards_payload(power_watts=[True, 1.0, 1.0, 1.0]), RejectReason.WRONG_TYPE),
    ("float index", CARDS, _cards_payload(card_index=[0.0, 1, 2, 3]), RejectReason.WRONG_TYPE),
    ("column not a list", CARDS, _cards_payload(power_watts=300.0), RejectReason.WRONG_TYPE),
    ("wrong schema version", CARDS, _cards_payload(schema="racktwin.cards/2"), RejectReason.WRONG_SCHEMA),
    ("other kind's schema", CARDS, _cards_payload(schema="racktwin.cdu/1"), RejectReason.WRONG_SCHEMA),
    ("null power limit", CARDS, _cards_payload(power_limit_watts=[None, 1.0, 1.0, 1.0]), RejectReason.NON_FINITE),
    ("negative power limit", CARDS, _cards_payload(power_limit_watts=[-1.0, 1.0, 1.0, 1.0]), RejectReason.OUT_OF_RANGE),
    ("null loop temperature", CDU, _cdu_payload(return_temperature_celsius=None), RejectReason.NON_FINITE),
    ("negative flow", CDU, _cdu_payload(flow_liters_per_minute=-1.0), RejectReason.OUT_OF_RANGE),
    ("coolant too hot", CDU, _cdu_payload(supply_temperature_celsius=250.0), RejectReason.OUT_OF_RANGE),
    ("pump speed > 100", CDU, _cdu_payload(pump_speed_percent=101.0), RejectReason.OUT_OF_RANGE),
    ("negative rack power", PDU, _pdu_payload(power_watts=-1.0), RejectReason.OUT_OF_RANGE),
    ("null rack power", PDU, _pdu_payload(power_watts=None), RejectReason.NON_FINITE),
    ("negative ts", CARDS, _cards_payload(ts=-1.0), RejectReason.OUT_OF_RANGE),
    ("huge seq", CARDS, _cards_payload(seq=2**70), RejectReason.OUT_OF_RANGE),
    ("bad publisher id", CARDS, _cards_payload(publisher="a b/c"), RejectReason.OUT_OF_RANGE),
    ("negative card index", CARDS, _cards_payload(card_index=[-1, 0, 1, 2]), RejectReason.OUT_OF_RANGE),
    ("card outside rack", CARDS, _cards_payload(card_index=[0, 1, 2, 64]), RejectReason.CARD_OUT_OF_RACK),
    ("duplicate card", CARDS, _cards_payload(card_index=[0, 1, 1, 3]), RejectReason.DUPLICATE_CARD),
    ("column too short", CARDS, _cards_payload(power_watts=[1.0, 2.0]), RejectReason.LENGTH_MISMATCH),
    ("huge payload", CARDS, b" " * (wire.MAX_PAYLOAD_BYTES + 1), RejectReason.TOO_LARGE),
    ("host_off column too short", CARDS, _cards_payload(host_off=[True, False]), RejectReason.LENGTH_MISMATCH),
    ("host_off not booleans", CARDS, _cards_payload(host_off=[1, 0, 0, 0]), RejectReason.WRONG_TYPE),
    ("host_off null", CARDS, _cards_payload(host_off=[None, False, False, False]), RejectReason.WRONG_TYPE),
    ("host power off with a level", CMD, _cmd_payload(action="host_power_off"), RejectReason.INCONSISTENT),
    (
        "host power on with a limit",
        CMD,
        _cmd_payload(action="host_power_on", dvfs_level=_DELETE, power_limit_watts=300.0),
        RejectReason.INCONSISTENT,
    ),
    (
        "host power for no cards",
        CMD,
        _cmd_payload(action="host_power_off", dvfs_level=_DELETE, cards=[]),
        RejectReason.OUT_OF_RANGE,
    ),
    (
        "host power beyond the rack",
        CMD,
        _cmd_payload(action="host_power_off", dvfs_level=_DELETE, cards=list(range(60, 68))),
        RejectReason.CARD_OUT_OF_RACK,
    ),
    ("expired at issue", CMD, _cmd_payload(expires_at=TS), RejectReason.INCONSISTENT),
    ("missing parameter", CMD, _cmd_payload(dvfs_level=_DELETE), RejectReason.INCONSISTENT),
    ("extra parameter", CMD, _cmd_payload(power_limit_watts=500.0), RejectReason.INCONSISTENT),
    ("level beyond table", CMD, _cmd_payload(dvfs_level=8), RejectReason.OUT_OF_RANGE),
    ("applied level beyond table", APPLIED, _applied_payload(dvfs_level=[0, 8]), RejectReason.OUT_OF_RANGE),
    (
        "applied clock range reversed",
        APPLIED,
        _applied_payload(min_sm_clock_mhz=[1210.0, 1500.0], max_sm_clock_mhz=[1980.0, 1000.0]),
        RejectReason.INCONSISTENT,
    ),
    ("unknown action", CMD, _cmd_payload(action="overclock"), RejectReason.OUT_OF_RANGE),
    ("bad uuid", CMD, _cmd_payload(command_id="1234"), RejectReason.WRONG_TYPE),
    ("no cards", CMD, _cmd_payload(cards=[]), RejectReason.OUT_OF_RANGE),
    ("duplicate command card", CMD, _cmd_payload(cards=[3, 3]), RejectReason.DUPLICATE_CARD),
    (
        "clock range reversed",
        CMD,
        _cmd_payload(action="set_clock_range", dvfs_level=_DELETE, min_sm_clock_mhz=1500.0, max_sm_clock_mhz=1000.0),
        RejectReason.INCONSISTENT,
    ),
    (
        "zero power limit",
        CMD,
        _cmd_payload(action="set_power_limit", dvfs_level=_DELETE, power_limit_watts=0.0),
        RejectReason.OUT_OF_RANGE,
    ),
    (
        "per-card limits not one per card",
        CMD,
        _cmd_payload(action="set_power_limit", dvfs_level=_DELETE, power_limit_watts=[300.0, 300.0, 300.0]),
        RejectReason.LENGTH_MISMATCH,
    ),
    (
        "a zero per-card limit",
        CMD,
        _cmd_payload(action="set_power_limit", dvfs_level=_DELETE, power_limit_watts=[300.0, 0.0]),
        RejectReason.OUT_OF_RANGE,
    ),
    (
        "rejected ack without reason",
        "racktwin/v1/site1/rack/r0/ack",
        json.dumps(
            {
                "schema": "racktwin.ack/1",
                "ts": TS,
                "seq": 0,
                "publisher": "sim",
                "command_id": str(uuid.uuid4()),
                "result": "rejected",
            }
        ),
        RejectReason.INCONSISTENT,
    ),
    (
        "job started without cards",
        "racktwin/v1/site1/jobs/events",
        json.dumps(
            {"schema": "racktwin.job_event/1", "ts": TS, "seq": 0, "publisher": "s", "event": "started", "job_id": "j"}
        ),
        RejectReason.INCONSISTENT,
    ),
    (
        "job on an unknown rack",
        "racktwin/v1/site1/jobs/events",
        json.dumps(
            {
                "schema": "racktwin.job_event/1",
                "ts": TS,
                "seq": 0,
                "publisher": "s",
                "event": "started",
                "job_id": "j",
                "cards": {"r99": [0]},
            }
        ),
        RejectReason.UNKNOWN_RACK,
    ),
    (
        "placement outside the rack",
        "racktwin/v1/site1/scheduler/cmd",
        json.dumps(
            {
                "schema": "racktwin.scheduler_cmd/1",
                "ts": TS,
                "seq": 0,
                "publisher": "agent",
                "command_id": str(uuid.uuid4()),
                "expires_at": TS + 5,
                "action": "place",
                "job_id": "j",
                "cards": {"r0": [64]},
            }
        ),
        RejectReason.CARD_OUT_OF_RACK,
    ),
    (
        "facility set-point impossible",
        "racktwin/v1/site1/facility/cmd",
        json.dumps(
            {
                "schema": "racktwin.facility_cmd/1",
                "ts": TS,
                "seq": 0,
                "publisher": "agent",
                "command_id": str(uuid.uuid4()),
                "expires_at": TS + 5,
                "supply_setpoint_celsius": 500.0,
            }
        ),
        RejectReason.OUT_OF_RANGE,
    ),
]


@pytest.mark.parametrize(("topic", "payload", "reason"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED])
def test_bad_payloads_are_rejected_with_their_reason_and_counted(
    codec: Codec, topic: str, payload: bytes, reason: RejectReason
) -> None:
    result = codec.decode(topic, payload)
    assert isinstance(result, Rejection)
    assert result.reason is reason, result.detail
    assert result.topic == topic
    assert not result  # rejections are falsy
    assert codec.counter.count(reason) == 1
    assert codec.counter.snapshot()[reason.value] == 1
    assert codec.counter.total == 1


@pytest.mark.parametrize(
    ("raw", "non_finite"),
    [
        (b'{"a": NaN}', True),
        (b'{"a": -Infinity, "b": 1', True),
        (b'{"a": "NaN"', False),  # cut off after a string
        (b'{"a": "Infinity', False),  # cut off inside one
        (b'{"a": "x\\"NaN", "b": 1,}', False),  # an escaped quote does not end the string
        (b'{"a": "x\\\\", "b": NaN}', True),  # an escaped backslash does
    ],
)
def test_a_non_finite_literal_is_told_from_one_in_a_string_where_the_parser_gives_no_position(
    raw: bytes, non_finite: bool
) -> None:
    """Without msgspec's "(byte N)" in its error, the literals outside the payload's strings decide."""
    assert _non_finite_literal(raw, "JSON is malformed") is non_finite


def test_valid_reference_payloads_pass(codec: Codec) -> None:
    assert isinstance(codec.decode(CARDS, _cards_payload()), wire.CardBatch)
    assert isinstance(codec.decode(CDU, _cdu_payload()), wire.CduReading)
    assert isinstance(codec.decode(PDU, _pdu_payload()), wire.PduReading)
    assert isinstance(codec.decode(CMD, _cmd_payload()), wire.RackCommand)
    assert codec.counter.total == 0


def test_rejections_are_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    counter = wire.RejectionCounter(log_interval_s=10.0, log_burst=3, clock=lambda: now[0])
    codec = Codec(SiteLayout("site1", ("r0",), 4), counter=counter)
    with caplog.at_level(logging.WARNING, logger="racktwin.wire"):
        for _ in range(20):
            codec.decode(CARDS, b"garbage")
        assert len(caplog.records) == 3
        now[0] = 11.0
        codec.decode(CARDS, b"garbage")
    assert len(caplog.records) == 4
    assert "17 more malformed_json rejections not logged" in caplog.records[-1].getMessage()
    assert counter.count("malformed_json") == 21


def test_each_interval_logs_a_fresh_burst_and_reports_what_the_last_one_left_out_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flood lasting several intervals logs ``log_burst`` lines in each; the first line of an
    interval says how many the one before left out, the others say nothing of it."""
    now = [0.0]
    counter = wire.RejectionCounter(log_interval_s=10.0, log_burst=3, clock=lambda: now[0])
    rej = Rejection(RejectReason.MALFORMED_JSON, "not json", CARDS)
    lines: list[list[str]] = []
    with caplog.at_level(logging.WARNING, logger="racktwin.wire"):
        for t in (0.0, 11.0, 22.0):
            now[0] = t
            caplog.clear()
            for _ in range(20):
                counter.record(rej)
            lines.append([r.getMessage() for r in caplog.records])
    assert [len(ls) for ls in lines] == [3, 3, 3]
    assert not any("more" in line for line in lines[0])
    for later in lines[1:]:
        assert "17 more malformed_json rejections not logged" in later[0]
        assert not any("more" in line for line in later[1:]), later
    assert counter.total == 60


def test_a_flood_of_one_rejection_reason_does_not_silence_another(caplog: pytest.LogCaptureFixture) -> None:
    """The log's rate limit is per reason: after a flood of malformed payloads, the first rejections
    of another reason are still logged; ``total`` counts all of them."""
    counter = wire.RejectionCounter(log_interval_s=10.0, log_burst=3, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="racktwin.wire"):
        for _ in range(20):
            counter.record(Rejection(RejectReason.MALFORMED_JSON, "not json", CARDS))
        caplog.clear()
        counter.record(Rejection(RejectReason.UNKNOWN_RACK, "rack 'r9' is not in the site", CARDS))
    assert len(caplog.records) == 1 and "unknown_rack" in caplog.records[0].getMessage()
    assert counter.total == 21 and counter.snapshot()["unknown_rack"] == 1


def test_a_rejection_log_line_is_bounded_whatever_the_message(caplog: pytest.LogCaptureFixture) -> None:
    """A publisher's topic and detail are cut in the log line: a long one cannot flood the log."""
    counter = wire.RejectionCounter()
    with caplog.at_level(logging.WARNING, logger="racktwin.wire"):
        counter.record(Rejection(RejectReason.INVALID, "d" * 100_000, "racktwin/v1/site1/" + "t" * 100_000))
    (record,) = caplog.records
    assert len(record.getMessage()) < 1000


def test_sequencer_counts_per_topic(codec: Codec) -> None:
    seq = wire.Sequencer("sim")
    assert [seq.next("a"), seq.next("a"), seq.next("b"), seq.next("a")] == [0, 1, 0, 2]
    with pytest.raises(ValueError):
        wire.Sequencer("bad id")
    # a publisher may use every id a receiver accepts (1-128 characters), and no other
    longest = wire.Sequencer("p" * 128).publisher
    reading = wire.PduReading("r0", 1000.0, ts_s=TS, seq=0, publisher=longest)
    out = codec.outgoing(reading)
    assert codec.decode(out.topic, out.payload) == reading
    with pytest.raises(ValueError, match="1-128"):
        wire.Sequencer("p" * 129)
    too_long = out.payload.replace(longest.encode(), b"p" * 129)
    assert isinstance(codec.decode(out.topic, too_long), Rejection)


def test_ids_and_names_with_a_final_newline_are_refused(codec: Codec) -> None:
    """A job id, a publisher id or a rack name is its documented characters and nothing else: a final
    newline is not one of them (a pattern ending in ``$`` matched before it and let "job-17\n" in)."""
    with pytest.raises(ValueError, match="1-128"):
        wire.Sequencer("sim\n")
    started = wire.JobEvent(wire.JobEventType.STARTED, "job-17", TS, 0, "scheduler", cards={"r0": (0, 1)})
    out = codec.outgoing(started)
    assert codec.decode(out.topic, out.payload) == started
    for good, bad in ((b'"job-17"', b'"job-17\\n"'), (b'"scheduler"', b'"scheduler\\n"'), (b'"r0"', b'"r0\\n"')):
        assert good in out.payload
        refused = codec.decode(out.topic, out.payload.replace(good, bad))
        assert isinstance(refused, Rejection), bad


def test_a_scenario_accepts_the_job_ids_the_wire_accepts() -> None:
    """A scenario's job ids must go on the wire: ``twin`` cannot import the wire, so it keeps its own
    copy of the pattern (both needed the same ``\\Z`` fix); this holds them equal."""
    from twin.scenario import JOB_ID_PATTERN

    assert JOB_ID_PATTERN.pattern == wire.topics.IDENT_PATTERN


def test_samples_cover_every_kind() -> None:
    assert {wire.kind_of(m) for m in sample_messages()} == set(Kind)


def test_job_phases_on_the_wire_are_the_twins_phases() -> None:
    import typing

    from twin.workload import Phase

    literal = typing.get_type_hints(_JobEventW, include_extras=True)["phase"]
    allowed = {a for arg in typing.get_args(literal) for a in typing.get_args(arg)}
    assert allowed == {p.name.lower() for p in Phase}


def test_the_counter_reports_every_reason() -> None:
    snap = wire.RejectionCounter().snapshot()
    assert set(snap) == {r.value for r in RejectReason}
    assert all(v == 0 for v in snap.values())


def test_a_cdu_that_does_not_report_its_pump_speed_reads_as_unknown(codec: Codec) -> None:
    """The pump speed is optional on the wire (publishers before the field). Absent, it is unknown
    (None; NaN in the twin's readings), not full speed: a pump the agent slowed would otherwise read
    as a weak one."""
    topic = codec.topics.cdu("r0")
    body = {
        "schema": "racktwin.cdu/1",
        "ts": TS,
        "seq": 0,
        "publisher": "cdu-r0",
        "supply_temperature_celsius": 30.0,
        "return_temperature_celsius": 38.0,
        "flow_liters_per_minute": 64.0,
        "delta_pressure_kpa": 40.0,
        "pump_power_watts": 90.0,
    }
    old = codec.decode(topic, json.dumps(body))
    assert isinstance(old, wire.CduReading) and old.pump_speed_frac is None
    assert json.loads(wire.encode(old)).get("pump_speed_percent") is None
    assert codec.decode(topic, wire.encode(old)) == old
    new = codec.decode(topic, json.dumps({**body, "pump_speed_percent": 50.0}))
    assert isinstance(new, wire.CduReading) and new.pump_speed_frac == pytest.approx(0.5)


def test_one_cards_missing_or_implausible_reading_does_not_cost_its_racks_other_cards(codec: Codec) -> None:
    """A sensor that gives no reading (``null``, what JSON encoders write for NaN) or an implausible
    one (negative power, a die at 250 deg C, 101% utilization) spoils that card's reading only: the
    batch is accepted (no rejection counted), the value decodes as NaN or as sent, and the belief
    refuses that card's reading (``TwinState.invalid_count``) while it takes the others. Refusing the
    whole batch would blind the agent to a rack for one bad sensor (and the in-process evaluation,
    whose belief refuses per card, would not measure what the service does)."""
    from agent.clock import SiteClock
    from agent.ingest import Ingest
    from twin.state import TwinState

    payload = _cards_payload(
        power_watts=[None, -1.0, 300.0, 300.0],
        temperature_celsius=[55.0, 55.0, 250.0, 55.0],
        utilization_percent=[90.0, 90.0, 90.0, 101.0],
    )
    batch = codec.decode(CARDS, payload)
    assert isinstance(batch, wire.CardBatch) and codec.counter.total == 0
    assert np.isnan(batch.power_w[0]) and batch.power_w[1] == -1.0 and batch.temp_c[2] == 250.0
    assert batch.utilization[3] == pytest.approx(1.01)
    good = codec.decode(CARDS, _cards_payload(card_index=[4, 5]))
    assert isinstance(good, wire.CardBatch)
    site = load_site(REPO / "examples" / "supernode-512.toml")
    state = TwinState(site)
    ingest = Ingest(site, state, SiteClock(1.0))
    for b in (batch, good):
        ingest.handle(b)
    ingest.flush()
    assert state.invalid_count[:6].tolist() == [1, 1, 1, 1, 0, 0]
    assert state.card_power_w[4:6].tolist() == [300.0, 300.0]
    assert np.isfinite(state.card_last_seen_s[4:6]).all() and not np.isfinite(state.card_last_seen_s[:4]).any()


def test_an_implausible_clock_reading_is_refused_and_sets_neither_level_nor_failure(codec: Codec) -> None:
    """A clock of 1e300 MHz (a broken exporter's value; finite, so the wire takes it) is refused by the
    belief like any implausible reading: before the rack reports its applied levels, the card's DVFS
    level is not inferred from it (the nearest clock would be the top level), and a dead card (0 W)
    reading it is not taken for alive again."""
    from agent.clock import SiteClock
    from agent.ingest import Ingest
    from twin.state import TwinState

    site = load_site(REPO / "examples" / "supernode-512.toml")
    state = TwinState(site)
    ingest = Ingest(site, state, SiteClock(1.0))
    clocks = site.card.clocks_mhz
    first = _cards_payload(power_watts=[0.0, 300.0, 300.0, 300.0], sm_clock_mhz=[0.0, clocks[1], clocks[1], clocks[1]])
    msg = codec.decode(CARDS, first)
    assert not isinstance(msg, Rejection)
    ingest.handle(msg)
    ingest.flush()
    assert state.card_failed[:4].tolist() == [True, False, False, False]
    assert state.card_level[1:4].tolist() == [1, 1, 1]
    later = json.loads(first)
    later["ts"] = TS + 1.0
    later["sm_clock_mhz"] = [1e300, 1e300, clocks[1], 5.0 * max(clocks) + 1.0]
    msg = codec.decode(CARDS, json.dumps(later).encode())
    assert not isinstance(msg, Rejection)
    ingest.handle(msg)
    ingest.flush()
    assert codec.counter.total == 0
    assert state.invalid_count[:4].tolist() == [1, 1, 0, 1]
    assert state.card_failed[:4].tolist() == [True, False, False, False]
    assert state.card_level[1:4].tolist() == [1, 1, 1]
