"""Hostile and malformed payloads on the simulator's command topics (hypothesis, bounded): each is
rejected with a reason and counted, or (when a mutation happens to stay valid) answered like any
command; the simulator keeps running and publishing."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_testing import START_EPOCH_S, command_times, job, observer, running, scenario, small_site

from agent import wire
from agent.broker import EmbeddedBroker

pytestmark = pytest.mark.integration

SITE = small_site()
PREFIX = "racktwin/v1/site1"
TOPICS = (
    f"{PREFIX}/rack/r0/cmd",
    f"{PREFIX}/rack/r1/cmd",
    f"{PREFIX}/facility/cmd",
    f"{PREFIX}/scheduler/cmd",
    f"{PREFIX}/rack/r99/cmd",  # a rack the site does not have (matches the simulator's rack/+/cmd)
)

_TS = START_EPOCH_S + 1.0
_VALID: dict[str, dict[str, Any]] = {
    f"{PREFIX}/rack/r0/cmd": {
        "schema": "racktwin.rack_cmd/1", "ts": _TS, "seq": 0, "publisher": "agent",
        "command_id": "0b0e8a2c-51f6-4d55-9a37-8a1d25e3c001", "expires_at": _TS + 1e6,
        "cards": [0, 1], "action": "set_dvfs_level", "dvfs_level": 2,
    },
    f"{PREFIX}/facility/cmd": {
        "schema": "racktwin.facility_cmd/1", "ts": _TS, "seq": 0, "publisher": "agent",
        "command_id": "0b0e8a2c-51f6-4d55-9a37-8a1d25e3c002", "expires_at": _TS + 1e6, "supply_setpoint_celsius": 30.0,
    },
    f"{PREFIX}/scheduler/cmd": {
        "schema": "racktwin.scheduler_cmd/1", "ts": _TS, "seq": 0, "publisher": "agent",
        "command_id": "0b0e8a2c-51f6-4d55-9a37-8a1d25e3c003", "expires_at": _TS + 1e6, "action": "place",
        "job_id": "nope", "cards": {"r1": [0, 1]},
    },
}  # fmt: skip
_VALID[f"{PREFIX}/rack/r1/cmd"] = _VALID[f"{PREFIX}/rack/r0/cmd"]
_VALID[f"{PREFIX}/rack/r99/cmd"] = _VALID[f"{PREFIX}/rack/r0/cmd"]

_HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "NaN", "x" * 5000, "0b0e8a2c-51f6-4d55-9a37-8a1d25e3c00z", "set_dvfs_level", "r0"]),
    st.lists(st.integers(min_value=-5, max_value=10_000), max_size=70),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def hostile_message(draw: st.DrawFn) -> tuple[str, bytes]:
    topic = draw(st.sampled_from(TOPICS))
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "dropped", "extra", "truncated"]))
    if kind == "bytes":
        return topic, draw(st.binary(max_size=300))
    if kind == "json":
        return topic, json.dumps(draw(_JSONISH), allow_nan=True).encode()
    valid = dict(_VALID[topic])
    if kind == "mutated":
        valid[draw(st.sampled_from(sorted(valid)))] = draw(_HOSTILE)
    elif kind == "dropped":
        del valid[draw(st.sampled_from(sorted(valid)))]
    elif kind == "extra":
        valid[draw(st.text(min_size=1, max_size=12))] = draw(_HOSTILE)
    payload = json.dumps(valid, allow_nan=True).encode()
    if kind == "truncated":
        payload = payload[: draw(st.integers(min_value=0, max_value=len(payload) - 1))]
    return topic, payload


def draw_messages(n: int) -> list[tuple[str, bytes]]:
    """``n`` hostile messages drawn by hypothesis (deterministic, no example database)."""
    out: list[tuple[str, bytes]] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(hostile_message())
    def collect(m: tuple[str, bytes]) -> None:
        out.append(m)

    collect()
    return out[:n]


async def test_fuzzed_command_payloads_are_rejected_counted_and_the_simulator_keeps_publishing(
    mosquitto: EmbeddedBroker,
) -> None:
    messages = draw_messages(300)
    messages.append((f"{PREFIX}/rack/r0/cmd", b"\xff" * (wire.MAX_PAYLOAD_BYTES + 10)))  # too large
    messages.append((f"{PREFIX}/rack/r0/cmd", b'{"schema": "racktwin.rack_cmd/1", "ts": NaN}'))
    sc = scenario(jobs=[job("j", 8, running_at_start=True)], duration_s=3600.0)
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, speed=10.0) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading))
        for topic, payload in messages:
            await obs.publish_raw(topic, payload)
        # a valid command after them: once it is acked, every earlier message has been handled
        ts, exp = command_times(obs)
        sentinel = wire.RackCommand("r1", (3,), wire.CardSetting.dvfs(1), wire.new_command_id(), exp, ts, 0, "agent")
        await obs.send(sentinel)
        assert (await obs.ack_of(sentinel.command_id)).result is wire.AckResult.APPLIED
        rejected = sim.codec.counter.total
        c = sim.commands.counts
        # every hostile message was refused by the codec (counted by reason; acked "rejected" when its
        # command_id was readable) or was a valid command that the plant answered
        assert rejected == c.malformed_acked + c.unanswered
        valid = c.applied + (c.rejected - c.malformed_acked) + c.expired - 1  # less the sentinel
        assert rejected + valid == len(messages)
        assert rejected >= len(messages) // 2
        snap = sim.codec.counter.snapshot()
        assert snap["malformed_json"] > 0 and snap["too_large"] == 1 and snap["unknown_rack"] > 0
        assert snap["non_finite"] > 0 and snap["unknown_field"] > 0 and snap["missing_field"] > 0
        # rejected messages that carried a readable command_id were answered with the reason
        reasons = [m.reason for m in obs.of(wire.Acknowledgement) if m.result is wire.AckResult.REJECTED]
        assert reasons and all(r for r in reasons)
        assert any(r.split(":")[0] in {x.value for x in wire.RejectReason} for r in reasons)
        # ... and it keeps publishing telemetry
        t_after = max(m.ts_s for m in obs.received if isinstance(m, wire.FacilityReading))
        later = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.ts_s > t_after + 2)
        assert later.rack in ("r0", "r1")
    assert sim.summary is not None and sim.summary.stopped_by == "stop"
    assert math.isclose(sum(sim.summary.rejected_messages.values()), rejected)
    d = sim.summary.to_dict()  # the --summary JSON: every refused message once, by reason and in all
    assert d["rejected_messages_total"] == rejected and d["commands_malformed"] == rejected


def test_hostile_messages_are_drawn_deterministically() -> None:
    a, b = draw_messages(20), draw_messages(20)
    assert a == b and len(a) == 20 and all(isinstance(p, bytes) for _, p in a)
