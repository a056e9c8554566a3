"""Property tests of the protocol's decoder: hostile input never raises, is rejected with a reason
from the fixed set and counted; whatever is accepted is physically plausible; valid batches round trip."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_testing import TEST_RACKS, TEST_SITE, sample_messages

from agent import wire
from agent.wire import Codec, Kind, Rejection, RejectReason, SiteLayout
from agent.wire.topics import _KINDS

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LAYOUT = SiteLayout(TEST_SITE, TEST_RACKS, cards_per_rack=64, n_levels=8)
_CODEC = Codec(LAYOUT)
TOPICS = [_CODEC.topics.of(k, "r1" if _KINDS[k].rack_scoped else None) for k in Kind]
VALID = {_CODEC.outgoing(m).topic: json.loads(_CODEC.outgoing(m).payload) for m in sample_messages()}

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
HOSTILE_TOKENS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"null", b"\xff", b"\x00", b"{", b"]"]


def _check_plausible(msg: Any) -> None:
    """Everything a decoder lets through is finite and inside the documented physical ranges."""
    assert 0.0 <= msg.ts_s <= 1e11
    if isinstance(msg, wire.CardBatch):
        n = len(msg.card_index)
        for arr in (msg.power_w, msg.temp_c, msg.sm_clock_mhz, msg.utilization, msg.power_limit_w, msg.low_power):
            assert len(arr) == n
        # the sensor columns may hold NaN (null) or implausible values: the belief refuses those
        # cards' readings (docs/protocol.md); the power limit is a setting, range-checked
        for arr in (msg.power_w, msg.temp_c, msg.sm_clock_mhz, msg.utilization):
            assert np.asarray(arr).dtype == np.float64
        assert np.all(np.isfinite(msg.power_limit_w)) and np.all(msg.power_limit_w >= 0)
        assert len(set(msg.card_index.tolist())) == n
        assert n == 0 or (msg.card_index.min() >= 0 and msg.card_index.max() < 64)
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, float):
            assert math.isfinite(value), f.name


def _decode_never_raises(topic: str, payload: bytes) -> Any:
    codec = Codec(LAYOUT)
    before = codec.counter.total
    result = codec.decode(topic, payload)  # must not raise
    if isinstance(result, Rejection):
        assert result.reason in set(RejectReason)
        assert codec.counter.total == before + 1
        assert codec.counter.count(result.reason) == 1
    else:
        assert codec.counter.total == before
        _check_plausible(result)
    return result


@FUZZ
@given(topic=st.sampled_from(TOPICS), payload=st.binary(max_size=512))
def test_random_bytes_are_rejected_never_raised(topic: str, payload: bytes) -> None:
    assert isinstance(_decode_never_raises(topic, payload), Rejection)


@FUZZ
@given(topic=st.text(max_size=80), payload=st.binary(max_size=64))
def test_random_topics_never_raise(topic: str, payload: bytes) -> None:
    _decode_never_raises(topic, payload)


@FUZZ
@given(
    topic=st.sampled_from(sorted(VALID)),
    data=st.data(),
)
def test_mutated_valid_payloads_never_raise_and_accepted_ones_are_plausible(topic: str, data: st.DataObject) -> None:
    body = dict(VALID[topic])
    op = data.draw(st.sampled_from(["set", "delete", "add", "set_in_list"]))
    key = data.draw(st.sampled_from(sorted(body)))
    if op == "set":
        body[key] = data.draw(json_values)
    elif op == "delete":
        del body[key]
    elif op == "add":
        body[data.draw(st.text(min_size=1, max_size=12))] = data.draw(json_values)
    else:
        lists = [k for k, v in body.items() if isinstance(v, list) and v]
        if lists:
            k = data.draw(st.sampled_from(lists))
            i = data.draw(st.integers(0, len(body[k]) - 1))
            body[k] = [*body[k][:i], data.draw(json_values), *body[k][i + 1 :]]
    _decode_never_raises(topic, msgspec.json.encode(body))


@FUZZ
@given(
    topic=st.sampled_from(sorted(VALID)),
    token=st.sampled_from(HOSTILE_TOKENS),
    where=st.floats(0.0, 1.0),
)
def test_hostile_tokens_spliced_into_valid_payloads(topic: str, token: bytes, where: float) -> None:
    raw = msgspec.json.encode(VALID[topic])
    i = int(where * len(raw))
    _decode_never_raises(topic, raw[:i] + token + raw[i:])  # inside a string it may stay valid


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 64),
    data=st.data(),
)
def test_valid_card_batches_round_trip(n: int, data: st.DataObject) -> None:
    idx = data.draw(st.permutations(list(range(64))))[:n]

    def col(lo: float, hi: float) -> np.ndarray:
        return np.array(data.draw(st.lists(st.floats(lo, hi), min_size=n, max_size=n)), dtype=np.float64)

    batch = wire.CardBatch(
        rack="r7",
        card_index=np.array(idx, dtype=np.int64),
        power_w=col(0.0, 5000.0),
        temp_c=col(-50.0, 200.0),
        sm_clock_mhz=col(0.0, 10000.0),
        utilization=col(0.0, 1.0),
        power_limit_w=col(0.0, 5000.0),
        low_power=np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=np.bool_),
        ts_s=data.draw(st.floats(0.0, 1e11)),
        seq=data.draw(st.integers(0, 2**63 - 1)),
        publisher=data.draw(st.from_regex(r"\A[A-Za-z0-9_.:@-]{1,64}\Z")),
    )
    codec = Codec(LAYOUT)
    back = codec.decode(codec.topics.cards("r7"), wire.encode(batch))
    assert not isinstance(back, Rejection), back
    assert wire.approx_equal(back, batch)
