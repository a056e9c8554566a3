"""What the simulator answers, without a broker: the clock range a ``set_clock_range`` leaves in the
rack's applied state is the range asked for trimmed to the card's table (the agent reads its settings
back from it after a restart), a malformed command with a readable id is answered rejected on its
target's ack topic, and a payload over the size limit is not read, so not answered, even when it
carries a command id."""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path

import pytest

from agent import wire
from sim.commands import CommandHandler
from twin.plant import Plant, PlantConfig
from twin.spec import load_site

pytestmark = pytest.mark.unit

TS = 1_800_000_000.0
SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"
_SEQ = itertools.count()


def _setup() -> tuple[CommandHandler, wire.Codec]:
    site = load_site(SITE)
    plant = Plant(site, [], config=PlantConfig(seed=1))
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    return CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: TS), codec


def _send(
    handler: CommandHandler, codec: wire.Codec, cards: tuple[int, ...], setting: wire.CardSetting
) -> tuple[wire.Acknowledgement, wire.AppliedState]:
    cmd = wire.RackCommand("r1", cards, setting, uuid.uuid4(), TS + 30.0, TS - 1.0, next(_SEQ), "agent")
    out = handler.handle(codec.topics.rack_cmd("r1"), wire.encode(cmd))
    ack, state = (codec.decode(o.topic, o.payload) for o in out)
    assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cmd.command_id
    assert isinstance(state, wire.AppliedState) and state.last_command_id == cmd.command_id
    return ack, state


def test_a_clock_range_wider_than_the_table_is_trimmed_to_it_in_the_applied_state() -> None:
    # the example card's table: 1980 (level 0) .. 1210 MHz (level 7), 110 MHz apart
    handler, codec = _setup()
    ack, state = _send(handler, codec, (2, 3), wire.CardSetting.clock_range(500.0, 2500.0))
    assert ack.result is wire.AckResult.APPLIED
    assert state.dvfs_level[2:4].tolist() == [0, 0]  # the fastest clock inside
    assert state.min_clock_mhz[2:4].tolist() == [1210.0, 1210.0] and state.max_clock_mhz[2:4].tolist() == [1980.0] * 2
    # a range inside the table is kept as asked; its fastest table clock is 1650 MHz (level 3)
    ack, state = _send(handler, codec, (4,), wire.CardSetting.clock_range(1300.0, 1700.0))
    assert ack.result is wire.AckResult.APPLIED
    assert (state.dvfs_level[4], state.min_clock_mhz[4], state.max_clock_mhz[4]) == (3, 1300.0, 1700.0)
    # a range whose bounds are table clocks holds them: one clock, 1540 MHz (level 4), pins the card
    ack, state = _send(handler, codec, (5,), wire.CardSetting.clock_range(1540.0, 1540.0))
    assert ack.result is wire.AckResult.APPLIED
    assert (state.dvfs_level[5], state.min_clock_mhz[5], state.max_clock_mhz[5]) == (4, 1540.0, 1540.0)


def test_a_payload_over_the_size_limit_is_not_read_nor_answered() -> None:
    handler, codec = _setup()
    cid = str(uuid.uuid4())
    big = json.dumps({"command_id": cid, "pad": "x" * wire.MAX_PAYLOAD_BYTES}).encode()
    assert len(big) > wire.MAX_PAYLOAD_BYTES
    assert handler.handle(codec.topics.rack_cmd("r1"), big) == []
    assert handler.counts.unanswered == 1 and handler.counts.malformed_acked == 0 and handler.counts.rejected == 0
    assert codec.counter.snapshot()["too_large"] == 1
    # the same command id in a payload within the limit that the codec refuses is answered rejected
    small = json.dumps({"command_id": cid, "pad": "x"}).encode()
    (out,) = handler.handle(codec.topics.rack_cmd("r1"), small)
    ack = codec.decode(out.topic, out.payload)
    assert isinstance(ack, wire.Acknowledgement) and str(ack.command_id) == cid
    assert ack.result is wire.AckResult.REJECTED and handler.counts.malformed_acked == 1


@pytest.mark.parametrize("target", ["rack", "cdu", "facility", "scheduler"])
def test_a_malformed_command_with_a_readable_id_is_answered_rejected_on_its_targets_ack_topic(target: str) -> None:
    """On each of the site's command topics, a payload the codec refuses that carries a readable
    ``command_id`` is answered ``rejected`` with the codec's reason, on the ack topic of its target,
    so that its sender learns what happened to it."""
    handler, codec = _setup()
    t = codec.topics
    cmd_topic, ack_topic = {
        "rack": (t.rack_cmd("r1"), t.rack_ack("r1")),
        "cdu": (t.cdu_cmd("r1"), t.rack_ack("r1")),
        "facility": (t.facility_cmd, t.facility_ack),
        "scheduler": (t.scheduler_cmd, t.scheduler_ack),
    }[target]
    cid = uuid.uuid4()
    (out,) = handler.handle(cmd_topic, json.dumps({"command_id": str(cid), "schema": "nonsense"}).encode())
    assert out.topic == ack_topic
    ack = codec.decode(out.topic, out.payload)
    assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cid and ack.result is wire.AckResult.REJECTED
    assert ack.reason is not None and wire.reason_code(ack.reason) in {r.value for r in wire.RejectReason}, ack.reason
    assert handler.counts.malformed_acked == 1 and handler.counts.unanswered == 0
