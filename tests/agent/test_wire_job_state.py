"""The scheduler's retained job snapshot, ``racktwin.job_state/1`` on ``jobs/state`` (docs/protocol.md):
its wire form written out by hand, the round trip, QoS 1 and retained, and what the codec refuses."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agent import wire
from agent.wire import Codec, Kind, Rejection, RejectReason
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.unit

TS = 1_790_000_000.5
STATE = "racktwin/v1/site1/jobs/state"


def _job(n_cards: int) -> dict[str, Any]:
    return {
        "n_cards": n_cards,
        "work_steps": 5000.0,
        "step_time_seconds": 1.5,
        "compute_share": 0.75,
        "priority": 2.0,
        "submit_ts": TS - 100.0,
        "checkpoint_interval_seconds": 900.0,
        "checkpoint_duration_seconds": 60.0,
        "noncompute_utilization_percent": 20.0,
        "min_throughput_percent": 50.0,
    }


def _body() -> dict[str, Any]:
    """A running job on r0's cards 0, 1 and r1's card 5, in a checkpoint; a queued job of 8 cards."""
    return {
        "schema": "racktwin.job_state/1",
        "ts": TS,
        "seq": 12,
        "publisher": "sim",
        "jobs": [
            {
                "job_id": "j1",
                "state": "running",
                "job": _job(3),
                "cards": {"r0": [0, 1], "r1": [5]},
                "phase": "checkpoint",
            },
            {"job_id": "j2", "state": "queued", "job": _job(8)},
        ],
    }


def _decode(codec: Codec, body: dict[str, Any]) -> Any:
    return codec.decode(STATE, json.dumps(body).encode())


def _rejected(result: object, reason: RejectReason, *words: str) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result.detail
    for w in words:
        assert w in result.detail, result.detail
    return result


def test_the_topic_is_site_wide_qos_1_and_retained(codec: Codec) -> None:
    assert codec.topics.job_state == STATE
    assert wire.SCHEMAS[Kind.JOB_STATE] == "racktwin.job_state/1"
    assert (wire.qos_of(Kind.JOB_STATE), wire.retain_of(Kind.JOB_STATE)) == (1, True)
    assert STATE in codec.topics.agent_filters()  # the agent subscribes to it
    assert STATE not in codec.topics.plant_filters()  # the scheduler does not read its own snapshot


def test_a_snapshot_written_by_hand_decodes_to_the_jobs_it_lists(codec: Codec) -> None:
    msg = _decode(codec, _body())
    assert isinstance(msg, wire.JobState), msg
    assert (msg.ts_s, msg.seq, msg.publisher) == (TS, 12, "sim")
    running, queued = msg.jobs
    assert running.job_id == "j1" and running.running
    assert running.cards == {"r0": (0, 1), "r1": (5,)}
    assert running.phase is Phase.CHECKPOINT
    # the spec in the code's units, as a submitted event carries it: percent -> fraction
    assert running.job == JobSpec(
        "j1",
        3,
        5000.0,
        1.5,
        0.75,
        priority=2.0,
        submit_time_s=TS - 100.0,
        checkpoint_interval_s=900.0,
        checkpoint_duration_s=60.0,
        noncompute_utilization=0.2,
        min_throughput_frac=0.5,
    )
    assert queued.job_id == "j2" and not queued.running
    assert (queued.cards, queued.phase) == (None, None)


def test_a_snapshot_round_trips_and_an_empty_one_too(codec: Codec) -> None:
    msg = _decode(codec, _body())
    out = codec.outgoing(msg)
    assert (out.topic, out.qos, out.retain) == (STATE, 1, True)
    assert json.loads(out.payload) == _body()  # queued jobs carry no cards and no phase (omitted, not null)
    assert codec.decode(out.topic, out.payload) == msg
    empty = wire.JobState(jobs=(), ts_s=TS, seq=0, publisher="sim")
    assert codec.decode(STATE, wire.encode(empty)) == empty  # no job: the scheduler has none
    assert codec.counter.total == 0


@pytest.mark.parametrize(
    ("change", "reason", "words"),
    [
        (lambda b: b["jobs"][0].pop("cards"), RejectReason.INCONSISTENT, ("jobs[0]", "running job takes cards")),
        (lambda b: b["jobs"][0].pop("phase"), RejectReason.INCONSISTENT, ("jobs[0]",)),
        (lambda b: b["jobs"][1].update(phase="compute"), RejectReason.INCONSISTENT, ("jobs[1]", "queued job")),
        (lambda b: b["jobs"][1].update(cards={"r2": [0]}), RejectReason.INCONSISTENT, ("jobs[1]",)),
        (lambda b: b["jobs"][1].update(job_id="j1"), RejectReason.INCONSISTENT, ("listed twice",)),
        (
            lambda b: b["jobs"][1].update(state="running", cards={"r1": [5, 6]}, phase="compute"),
            RejectReason.INCONSISTENT,
            ("card 5 of rack r1", "'j1' and 'j2'"),
        ),
        (lambda b: b["jobs"][0].update(cards={"r9": [0]}), RejectReason.UNKNOWN_RACK, ("r9",)),
        (lambda b: b["jobs"][0].update(cards={"r0": [64]}), RejectReason.CARD_OUT_OF_RACK, ()),
        (lambda b: b["jobs"][0].update(cards={"r0": [3, 3]}), RejectReason.DUPLICATE_CARD, ()),
        (lambda b: b["jobs"][0].update(cards={"r0": []}), RejectReason.OUT_OF_RANGE, ()),
        (lambda b: b["jobs"][0].update(phase="sleeping"), RejectReason.OUT_OF_RANGE, ()),
        (lambda b: b["jobs"][0].update(state="done"), RejectReason.OUT_OF_RANGE, ()),
        (lambda b: b["jobs"][0].update(progress=0.5), RejectReason.UNKNOWN_FIELD, ()),
        (lambda b: b["jobs"][0].pop("job"), RejectReason.MISSING_FIELD, ()),
        (lambda b: b["jobs"][0]["job"].update(compute_share=1.5), RejectReason.OUT_OF_RANGE, ()),
        (lambda b: b["jobs"][0].update(job_id="a b"), RejectReason.OUT_OF_RANGE, ()),
        (lambda b: b.pop("jobs"), RejectReason.MISSING_FIELD, ()),
        (lambda b: b.update(schema="racktwin.job_event/1"), RejectReason.WRONG_SCHEMA, ()),
        (lambda b: b.update(schema="racktwin.job_state/2"), RejectReason.WRONG_SCHEMA, ()),
    ],
)
def test_what_a_snapshot_may_not_say_is_refused_with_its_reason(
    codec: Codec, change: Any, reason: RejectReason, words: tuple[str, ...]
) -> None:
    body = copy.deepcopy(_body())
    change(body)
    _rejected(_decode(codec, body), reason, *words)
    assert codec.counter.snapshot()[reason.value] == 1
