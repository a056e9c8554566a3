"""What the codec refuses at the boundary, and why, where no other test held it (mutation audit of
agent/wire/codec.py and agent/wire/encoding.py): topics, the size limit, per-card columns, command
expiry of every command kind, job events with fields of another event, acks, advice, the detail of a
rejection and the agent status' detail on the wire."""

from __future__ import annotations

import array
import dataclasses
import json
import uuid
from typing import Any

import pytest
from mqtt_testing import sample_messages

from agent import wire
from agent.wire import Codec, Kind, Rejection, RejectReason

pytestmark = pytest.mark.unit

TS = 1_790_000_000.0
CARDS = "racktwin/v1/site1/rack/r0/cards"
APPLIED = "racktwin/v1/site1/rack/r0/applied"
ADVICE = "racktwin/v1/site1/agent/advice"
EVENTS = "racktwin/v1/site1/jobs/events"


def _rejected(result: object, reason: RejectReason) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result.detail
    return result


def _cards_body(n: int = 4) -> dict[str, Any]:
    return {
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
        "host_off": [False] * n,
    }


def _applied_body(n: int = 4) -> dict[str, Any]:
    return {
        "schema": "racktwin.applied/1",
        "ts": TS,
        "seq": 1,
        "publisher": "sim",
        "card_index": list(range(n)),
        "dvfs_level": [0] * n,
        "min_sm_clock_mhz": [1210.0] * n,
        "max_sm_clock_mhz": [1980.0] * n,
        "power_limit_watts": [700.0] * n,
        "low_power": [False] * n,
        "host_off": [False] * n,
    }


def _sample(cls: type) -> Any:
    return next(m for m in sample_messages(TS) if isinstance(m, cls))


# ---- topics --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    ["racktwin/v1/site1/racks/r0/cards", "racktwin/v1/site1/jobs/r0/cards", "racktwin/v1/site1/facility/r0/cmd"],
)
def test_a_three_level_topic_is_a_rack_topic_only_under_rack(codec: Codec, topic: str) -> None:
    """``rack/{rack}/...`` is the only per-rack prefix: another first level is not a topic of the protocol."""
    _rejected(codec.decode(topic, json.dumps(_cards_body())), RejectReason.UNKNOWN_TOPIC)
    assert codec.counter.total == 1


def test_parse_topic_refuses_and_counts_a_rack_the_site_does_not_have(codec: Codec) -> None:
    _rejected(codec.parse_topic("racktwin/v1/site1/rack/r99/cards"), RejectReason.UNKNOWN_RACK)
    assert codec.counter.count(RejectReason.UNKNOWN_RACK) == 1
    assert codec.parse_topic("racktwin/v1/site1/rack/r7/cards") == wire.TopicInfo(Kind.CARDS, "r7")


@pytest.mark.parametrize("rack", ["r99", None])
def test_decode_kind_refuses_a_rack_kind_for_a_rack_the_site_does_not_have(codec: Codec, rack: str | None) -> None:
    _rejected(codec.decode_kind(Kind.CARDS, json.dumps(_cards_body()), rack=rack), RejectReason.UNKNOWN_RACK)
    assert codec.counter.total == 1
    assert isinstance(codec.decode_kind(Kind.CARDS, json.dumps(_cards_body()), rack="r0"), wire.CardBatch)


# ---- size ----------------------------------------------------------------------------------------


def test_a_payload_of_exactly_the_size_limit_is_parsed(codec: Codec) -> None:
    """At most 256 KiB: one of exactly that size is taken, one byte more is not."""
    body = json.dumps(_cards_body()).encode()
    exact = body + b" " * (wire.MAX_PAYLOAD_BYTES - len(body))
    assert len(exact) == wire.MAX_PAYLOAD_BYTES
    assert isinstance(codec.decode(CARDS, exact), wire.CardBatch)
    _rejected(codec.decode(CARDS, exact + b" "), RejectReason.TOO_LARGE)


def test_the_size_limit_counts_bytes_whatever_the_payload_is_given_as(codec: Codec) -> None:
    """256 KiB of UTF-8, also for a str payload (a non-ASCII character is 2-4 bytes) or a memoryview
    of wider items: such a payload over the limit was parsed, its characters or items counted as bytes."""
    ack = {"schema": "racktwin.ack/1", "ts": TS, "seq": 0, "publisher": "sim", "command_id": str(uuid.uuid4())}
    text = json.dumps({**ack, "result": "rejected", "reason": "température"}, ensure_ascii=False)
    exact = text + " " * (wire.MAX_PAYLOAD_BYTES - len(text.encode()))
    assert len(exact.encode()) == wire.MAX_PAYLOAD_BYTES and len(exact) < wire.MAX_PAYLOAD_BYTES
    got = codec.decode("racktwin/v1/site1/rack/r0/ack", exact)
    assert isinstance(got, wire.Acknowledgement) and got.reason == "température"
    over = '{"publisher": "' + "é" * (wire.MAX_PAYLOAD_BYTES // 2) + '"}'
    assert len(over) < wire.MAX_PAYLOAD_BYTES < len(over.encode())
    _rejected(codec.decode(CARDS, over), RejectReason.TOO_LARGE)
    wide = memoryview(array.array("d", [0.0] * (wire.MAX_PAYLOAD_BYTES // 8 + 1)))
    assert len(wide) < wire.MAX_PAYLOAD_BYTES < wide.nbytes
    _rejected(codec.decode(CARDS, wide), RejectReason.TOO_LARGE)
    as_str = json.dumps(_cards_body()) + " " * 10
    assert isinstance(codec.decode(CARDS, as_str), wire.CardBatch)
    assert isinstance(codec.decode(CARDS, bytearray(as_str.encode())), wire.CardBatch)
    assert isinstance(codec.decode(CARDS, memoryview(as_str.encode())), wire.CardBatch)


# ---- per-card columns ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "body", "column"),
    [
        *((CARDS, _cards_body(), c) for c in list(_cards_body())[5:]),
        *((APPLIED, _applied_body(), c) for c in list(_applied_body())[5:]),
    ],
)
def test_every_per_card_column_has_one_entry_per_listed_card(
    codec: Codec, topic: str, body: dict[str, Any], column: str
) -> None:
    short = {**body, column: body[column][:-1]}
    result = _rejected(codec.decode(topic, json.dumps(short)), RejectReason.LENGTH_MISMATCH)
    assert column in result.detail
    assert not isinstance(codec.decode(topic, json.dumps(body)), Rejection)


@pytest.mark.parametrize("limits", [[300.0], [300.0, 300.0, 300.0]])
def test_per_card_power_limits_are_one_per_listed_card_neither_fewer_nor_more(
    codec: Codec, limits: list[float]
) -> None:
    cmd = json.loads(wire.encode(_sample(wire.RackCommand)))
    body = {k: v for k, v in cmd.items() if k not in ("dvfs_level", "min_sm_clock_mhz", "max_sm_clock_mhz")}
    body.update(cards=[0, 1], action="set_power_limit", power_limit_watts=limits)
    _rejected(codec.decode(codec.topics.rack_cmd("r0"), json.dumps(body)), RejectReason.LENGTH_MISMATCH)
    ok = codec.decode(codec.topics.rack_cmd("r0"), json.dumps({**body, "power_limit_watts": [300.0, 250.0]}))
    assert isinstance(ok, wire.RackCommand) and ok.setting.power_limit_w == (300.0, 250.0)


# ---- commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [wire.RackCommand, wire.CduCommand, wire.FacilityCommand, wire.SchedulerCommand])
def test_every_command_kind_must_expire_after_it_was_issued(
    codec: Codec,
    cls: type[wire.RackCommand] | type[wire.CduCommand] | type[wire.FacilityCommand] | type[wire.SchedulerCommand],
) -> None:
    msg = _sample(cls)
    out = codec.outgoing(msg)
    body = json.loads(out.payload)
    _rejected(codec.decode(out.topic, json.dumps({**body, "expires_at": body["ts"]})), RejectReason.INCONSISTENT)
    _rejected(codec.decode(out.topic, json.dumps({**body, "expires_at": body["ts"] - 1})), RejectReason.INCONSISTENT)
    later = codec.decode(out.topic, json.dumps({**body, "expires_at": body["ts"] + 0.5}))
    assert isinstance(later, cls) and later.expires_s == body["ts"] + 0.5


@pytest.mark.parametrize("reason", ["", None])
def test_a_rejected_ack_must_say_why(codec: Codec, reason: str | None) -> None:
    body: dict[str, Any] = {
        "schema": "racktwin.ack/1",
        "ts": TS,
        "seq": 0,
        "publisher": "sim",
        "command_id": str(uuid.uuid4()),
        "result": "rejected",
    }
    if reason is not None:
        body["reason"] = reason
    _rejected(codec.decode("racktwin/v1/site1/rack/r0/ack", json.dumps(body)), RejectReason.INCONSISTENT)
    # an applied or expired ack needs none
    for result in ("applied", "expired"):
        ack = codec.decode("racktwin/v1/site1/rack/r0/ack", json.dumps({**body, "result": result}))
        assert isinstance(ack, wire.Acknowledgement) and ack.result.value == result


# ---- job events ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "fields"),
    [
        ("finished", {"cards": {"r0": [0]}}),
        ("failed", {"phase": "compute"}),
        ("requeued", {"cards": {"r0": [0]}, "reason": "card 3 failed"}),
        ("started", {"cards": {"r0": [0]}, "phase": "compute"}),
        ("phase_changed", {"phase": "checkpoint", "reason": "why"}),
    ],
)
def test_a_job_event_with_a_field_of_another_event_is_inconsistent(
    codec: Codec, event: str, fields: dict[str, Any]
) -> None:
    """docs/protocol.md: "A field that does not belong to the event is rejected"."""
    body = {"schema": "racktwin.job_event/1", "ts": TS, "seq": 0, "publisher": "s", "event": event, "job_id": "j"}
    _rejected(codec.decode(EVENTS, json.dumps({**body, **fields})), RejectReason.INCONSISTENT)


# ---- advice --------------------------------------------------------------------------------------


def _advice_body() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(wire.encode(_sample(wire.AgentAdvice)))
    return body


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b: b["items"][0].update(rack="r99"), RejectReason.UNKNOWN_RACK),
        (lambda b: b["items"][0].update(cards=[0, 64]), RejectReason.CARD_OUT_OF_RACK),
        (lambda b: b["items"][0].update(cards=[1, 1]), RejectReason.DUPLICATE_CARD),
        (lambda b: b["pump_speed_percent"].update(r99=50.0), RejectReason.UNKNOWN_RACK),
        (lambda b: b["placements"][0].update(cards={"r4": [64]}), RejectReason.CARD_OUT_OF_RACK),
        (lambda b: b["placements"][0].update(cards={"r99": [0]}), RejectReason.UNKNOWN_RACK),
    ],
    ids=[
        "item on an unknown rack",
        "item card beyond the rack",
        "item card twice",
        "pump of an unknown rack",
        "placement card beyond the rack",
        "placement on an unknown rack",
    ],
)
def test_advice_names_only_racks_and_cards_of_the_site(codec: Codec, change: Any, reason: RejectReason) -> None:
    body = _advice_body()
    assert isinstance(codec.decode(ADVICE, json.dumps(body)), wire.AgentAdvice)
    change(body)
    _rejected(codec.decode(ADVICE, json.dumps(body)), reason)


# ---- what a rejection and a status say -----------------------------------------------------------


def test_a_schema_rejection_names_the_field_it_is_about(codec: Codec) -> None:
    """An operator reads the detail (log line) to find which field of a bridge's payload is wrong."""
    body = _cards_body()
    body["temperature_celsius"] = [55.0, 55.0, "hot", 55.0]
    result = _rejected(codec.decode(CARDS, json.dumps(body)), RejectReason.WRONG_TYPE)
    assert result.detail.endswith("at `$.temperature_celsius[2]`"), result.detail


def test_the_agent_status_detail_travels(codec: Codec) -> None:
    """The detail names the instance and, standing by, the agent that commands (docs/protocol.md)."""
    status = wire.AgentStatus(
        wire.AgentState.ONLINE,
        "0.1.0",
        ts_s=TS,
        seq=3,
        publisher="agent",
        mode="enforce",
        detail="standing by: agent X commands this site",
    )
    out = codec.outgoing(status)
    assert json.loads(out.payload)["detail"] == "standing by: agent X commands this site"
    assert codec.decode(out.topic, out.payload) == status


# ---- card indices beyond any rack ----------------------------------------------------------------


def _with_card(msg_cls: type, card: int) -> tuple[str, bytes]:
    """The topic and payload of a sample message of ``msg_cls`` whose last listed card is ``card``."""
    out = Codec(wire.SiteLayout("site1", tuple(f"r{i}" for i in range(8)), cards_per_rack=64)).outgoing(
        _sample(msg_cls)
    )
    body = json.loads(out.payload)
    if msg_cls is wire.CardBatch:
        body["card_index"][-1] = card
    elif msg_cls is wire.AgentAdvice:
        body["items"][0]["cards"][-1] = card
    elif msg_cls is wire.SchedulerCommand:
        next(iter(body["cards"].values()))[-1] = card
    else:
        body["cards"][-1] = card
    return out.topic, json.dumps(body).encode()


@pytest.mark.parametrize("msg_cls", [wire.CardBatch, wire.RackCommand, wire.SchedulerCommand, wire.AgentAdvice])
@pytest.mark.parametrize("card", [64, 4095, 4096, 5000, 2**40])
def test_a_card_index_beyond_the_rack_is_card_out_of_rack_however_far(codec: Codec, msg_cls: type, card: int) -> None:
    """docs/protocol.md: ``card_out_of_rack``, "a card index >= cards per rack". An index beyond the
    largest rack the schema allows (4,096 cards) was ``out_of_range`` while one of 64 .. 4,095 was
    ``card_out_of_rack``: a bridge that numbers cards site-wide (card 5000) was told its values were
    outside the allowed ones, not that they were no cards of the rack."""
    topic, payload = _with_card(msg_cls, card)
    _rejected(codec.decode(topic, payload), RejectReason.CARD_OUT_OF_RACK)
    assert codec.counter.total == 1


def test_a_card_index_beyond_any_rack_in_a_job_event_is_card_out_of_rack(codec: Codec) -> None:
    body = {"schema": "racktwin.job_event/1", "ts": TS, "seq": 0, "publisher": "s", "event": "started", "job_id": "j"}
    for card in (64, 5000):
        result = codec.decode(EVENTS, json.dumps({**body, "cards": {"r0": [0, card]}}))
        _rejected(result, RejectReason.CARD_OUT_OF_RACK)


def test_a_negative_card_index_stays_out_of_range_and_a_big_level_is_no_card(codec: Codec) -> None:
    topic, payload = _with_card(wire.RackCommand, -1)
    _rejected(codec.decode(topic, payload), RejectReason.OUT_OF_RANGE)
    body = json.loads(wire.encode(_sample(wire.RackCommand)))
    body.update(action="set_dvfs_level", dvfs_level=5000)
    for k in ("min_sm_clock_mhz", "max_sm_clock_mhz", "power_limit_watts"):
        body.pop(k, None)
    _rejected(codec.decode(codec.topics.rack_cmd("r0"), json.dumps(body)), RejectReason.OUT_OF_RANGE)


def test_a_card_beyond_the_rack_is_found_wherever_it_is_listed(codec: Codec) -> None:
    body = _cards_body()
    body["card_index"] = [64, 0, 1, 2]
    _rejected(codec.decode(CARDS, json.dumps(body)), RejectReason.CARD_OUT_OF_RACK)
    cmd = json.loads(wire.encode(_sample(wire.RackCommand)))
    cmd["cards"] = [70, *cmd["cards"][1:]]
    _rejected(codec.decode(codec.topics.rack_cmd("r0"), json.dumps(cmd)), RejectReason.CARD_OUT_OF_RACK)


# ---- the codec's settings ------------------------------------------------------------------------


def test_a_codec_takes_its_own_payload_limit(site_layout: wire.SiteLayout) -> None:
    small = Codec(site_layout, max_payload_bytes=2000)
    body = json.dumps(_cards_body()).encode()
    assert len(body) < 2000
    assert isinstance(small.decode(CARDS, body + b" " * (2000 - len(body))), wire.CardBatch)
    _rejected(small.decode(CARDS, body + b" " * (2001 - len(body))), RejectReason.TOO_LARGE)


def test_a_site_without_a_level_table_takes_any_level_the_wire_allows(site_layout: wire.SiteLayout) -> None:
    """``SiteLayout.n_levels`` None: the levels are not known, so only the wire's bound (0..255) holds."""
    codec = Codec(wire.SiteLayout(site_layout.site, site_layout.racks, cards_per_rack=64))
    cmd = json.loads(wire.encode(_sample(wire.RackCommand)))
    cmd.update(action="set_dvfs_level", dvfs_level=200)
    for k in ("min_sm_clock_mhz", "max_sm_clock_mhz", "power_limit_watts"):
        cmd.pop(k, None)
    got = codec.decode(codec.topics.rack_cmd("r0"), json.dumps(cmd))
    assert isinstance(got, wire.RackCommand) and got.setting.dvfs_level == 200
    applied = {**_applied_body(), "dvfs_level": [0, 1, 2, 200]}
    got_applied = codec.decode(APPLIED, json.dumps(applied))
    assert isinstance(got_applied, wire.AppliedState) and got_applied.dvfs_level.tolist() == [0, 1, 2, 200]


# ---- symmetry ------------------------------------------------------------------------------------


def test_every_kind_round_trips_its_own_envelope(codec: Codec) -> None:
    """The publisher, seq and ts of each message travel as they are (not the samples' common values)."""
    for k, msg in enumerate(sample_messages(TS)):
        other = dataclasses.replace(msg, publisher=f"bridge-{k}", seq=1000 + k, ts_s=TS + k + 0.5)
        if hasattr(other, "expires_s"):
            other = dataclasses.replace(other, expires_s=other.ts_s + 17.0)
        out = codec.outgoing(other)
        back = codec.decode(out.topic, out.payload)
        assert not isinstance(back, Rejection), back
        assert (back.publisher, back.seq, back.ts_s) == (f"bridge-{k}", 1000 + k, TS + k + 0.5)
        assert wire.approx_equal(back, other), type(msg).__name__


def test_a_submitted_job_keeps_its_own_submit_time_and_cards_keep_their_order(codec: Codec) -> None:
    """A job's ``submit_ts`` is the time it was submitted, not the event's ``ts``; the cards a job,
    command or placement lists keep the order the sender gave them."""
    event = next(m for m in sample_messages(TS) if isinstance(m, wire.JobEvent) and m.job is not None)
    assert event.job is not None
    job = dataclasses.replace(event.job, submit_time_s=TS - 600.0)
    submitted = dataclasses.replace(event, job=job, ts_s=TS + 3.0)
    out = codec.outgoing(submitted)
    assert json.loads(out.payload)["job"]["submit_ts"] == TS - 600.0
    back = codec.decode(out.topic, out.payload)
    assert isinstance(back, wire.JobEvent) and back.job is not None
    assert back.job.submit_time_s == TS - 600.0 and back.ts_s == TS + 3.0

    started = wire.JobEvent(
        wire.JobEventType.STARTED, "j", ts_s=TS, seq=1, publisher="s", cards={"r1": (5, 2, 9), "r0": (3, 1)}
    )
    place = wire.SchedulerCommand("j", {"r1": (7, 0)}, uuid.uuid4(), TS + 30, TS, 2, "agent")
    for msg in (started, place):
        got = codec.decode(codec.topic_for(msg), wire.encode(msg))
        assert got == msg
        assert json.loads(wire.encode(got)) == json.loads(wire.encode(msg))  # lists: the same order


def test_each_advice_item_keeps_its_own_setting(codec: Codec) -> None:
    advice = dataclasses.replace(
        _sample(wire.AgentAdvice),
        items=(
            wire.AdviceItem("r1", (0, 1), wire.CardSetting.dvfs(2)),
            wire.AdviceItem("r2", (3,), wire.CardSetting.power_limit(450.0)),
            wire.AdviceItem("r2", (4, 5), wire.CardSetting.clock_range(1210.0, 1650.0)),
        ),
    )
    back = codec.decode(ADVICE, wire.encode(advice))
    assert isinstance(back, wire.AgentAdvice)
    assert [(it.rack, it.cards, it.setting) for it in back.items] == [
        (it.rack, it.cards, it.setting) for it in advice.items
    ]


def test_a_batch_or_applied_state_of_no_cards_decodes(codec: Codec) -> None:
    """A batch may hold a subset of the rack's cards (docs/protocol.md), the empty one included (every
    card of the rack failed or unreadable): it is no malformed message."""
    for topic, body in ((CARDS, _cards_body(0)), (APPLIED, _applied_body(0))):
        got = codec.decode(topic, json.dumps(body))
        assert isinstance(got, wire.CardBatch | wire.AppliedState), got
        assert got.card_index.tolist() == []
