"""Copies of a command the simulator already answered, without a broker: a copy is answered what the
command was answered before, also when it arrives after the command's expiry, and each command is
counted once (copies under ``duplicates``). And a command refused for failed cards names them.

What users rely on: an agent whose ack came late sends the command again; the rack that applied the
first must not call the late copy ``expired`` (the journal then showed an applied command as expired,
and the simulator's counts no longer matched the journal's)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agent import wire
from sim.commands import REMEMBER_AFTER_EXPIRY_S, CommandHandler
from twin.plant import CardFailure, Plant, PlantConfig
from twin.spec import load_site

pytestmark = pytest.mark.unit

TS = 1_800_000_000.0
SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"


class Clock:
    def __init__(self) -> None:
        self.now_s = TS

    def __call__(self) -> float:
        return self.now_s


def _setup() -> tuple[CommandHandler, wire.Codec, Clock]:
    site = load_site(SITE)
    plant = Plant(site, [], config=PlantConfig(seed=1))
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    clock = Clock()
    return CommandHandler(plant, codec, wire.Sequencer("sim"), clock), codec, clock


def _ack(handler: CommandHandler, codec: wire.Codec, cmd: wire.RackCommand) -> wire.Acknowledgement:
    out = handler.handle(codec.topics.rack_cmd(cmd.rack), wire.encode(cmd))
    ack = codec.decode(out[0].topic, out[0].payload)
    assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cmd.command_id
    return ack


def test_a_late_copy_of_an_applied_command_is_answered_applied_not_expired() -> None:
    handler, codec, clock = _setup()
    cmd = wire.RackCommand("r0", (1, 2), wire.CardSetting.dvfs(3), uuid.uuid4(), TS + 30.0, TS - 1.0, 0, "agent")
    assert _ack(handler, codec, cmd).result is wire.AckResult.APPLIED
    clock.now_s = TS + 60.0  # the copy arrives after the command's expiry
    copy = _ack(handler, codec, cmd)
    assert copy.result is wire.AckResult.APPLIED
    assert copy.reason is not None and copy.reason.startswith("duplicate:") and "not applied again" in copy.reason
    c = handler.counts
    assert (c.applied, c.expired, c.duplicates) == (1, 0, 1)
    # a command the rack never saw, arriving after its expiry: expired; its copy is counted once too
    late = wire.RackCommand("r0", (3,), wire.CardSetting.dvfs(2), uuid.uuid4(), TS + 30.0, TS + 1.0, 1, "agent")
    assert _ack(handler, codec, late).result is wire.AckResult.EXPIRED
    again = _ack(handler, codec, late)
    assert again.result is wire.AckResult.EXPIRED and again.reason is not None and again.reason.startswith("duplicate:")
    assert (c.applied, c.expired, c.duplicates) == (1, 1, 2)
    assert handler.level[3] != 2  # never applied


def test_answers_are_remembered_an_hour_past_expiry_through_the_prunes() -> None:
    """The remembered ids are pruned every 1,024 answers: a late copy still gets its earlier answer
    then, until an hour after its command's expiry (at first the prune dropped every expired id)."""
    handler, codec, clock = _setup()
    cmd = wire.RackCommand("r0", (1,), wire.CardSetting.dvfs(3), uuid.uuid4(), TS + 30.0, TS - 1.0, 0, "agent")
    assert _ack(handler, codec, cmd).result is wire.AckResult.APPLIED

    def others(n: int) -> None:  # enough answers for a prune, each command applied
        for i in range(n):
            t = clock.now_s
            other = wire.RackCommand("r0", (5,), wire.CardSetting.dvfs(i % 8), uuid.uuid4(), t + 30.0, t, i, "agent")
            assert _ack(handler, codec, other).result is wire.AckResult.APPLIED

    clock.now_s = TS + 600.0
    others(1100)
    copy = _ack(handler, codec, cmd)
    assert copy.result is wire.AckResult.APPLIED and copy.reason is not None and copy.reason.startswith("duplicate:")
    clock.now_s = TS + 30.0 + REMEMBER_AFTER_EXPIRY_S + 1.0  # forgotten at the next prune
    others(1100)
    assert _ack(handler, codec, cmd).result is wire.AckResult.EXPIRED


def test_a_command_refused_for_failed_cards_names_each_of_them() -> None:
    """A rack refuses a card command whole when cards of it have failed (docs/protocol.md); its
    ``card_failed`` reason names every failed card of the command, rack-local, so that the agent can
    send the setting to the others (a silent rack's dead card is seen by no reading)."""
    site = load_site(SITE)
    faults = [CardFailure(card=64 + 5, at_s=0.0), CardFailure(card=64 + 9, at_s=0.0), CardFailure(card=3, at_s=0.0)]
    plant = Plant(site, [], faults, config=PlantConfig(seed=1))
    plant.step(1.0)
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    handler = CommandHandler(plant, codec, wire.Sequencer("sim"), Clock())
    cmd = wire.RackCommand(
        "r1", tuple(range(12)), wire.CardSetting.power_limit(500.0), uuid.uuid4(), TS + 30, TS, 0, "a"
    )
    ack = _ack(handler, codec, cmd)
    assert ack.result is wire.AckResult.REJECTED and wire.failed_cards_of(ack.reason) == (5, 9), ack.reason
    assert handler.counts.rejection_reasons == {"rack.set_power_limit": 1}
    ok = wire.RackCommand("r1", (0, 1, 2), wire.CardSetting.power_limit(500.0), uuid.uuid4(), TS + 30, TS, 1, "a")
    assert _ack(handler, codec, ok).result is wire.AckResult.APPLIED


def test_the_remembered_ids_are_capped_the_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rack remembers at most ``MAX_REMEMBERED_IDS`` answered ids (its memory is bounded under a flood
    of commands, also within their lives): beyond it the oldest is forgotten, and its late copy is judged
    anew, here as expired; the newer ones are still answered as copies. (Cap lowered to 3 for the test.)"""
    monkeypatch.setattr("sim.commands.MAX_REMEMBERED_IDS", 3)
    handler, codec, clock = _setup()
    cmds = [
        wire.RackCommand("r0", (i,), wire.CardSetting.dvfs(3), uuid.uuid4(), TS + 30.0, TS - 1.0, i, "agent")
        for i in range(4)
    ]
    for c in cmds:
        assert _ack(handler, codec, c).result is wire.AckResult.APPLIED
    clock.now_s = TS + 60.0  # all four expired: a copy the rack remembers is answered applied
    first = _ack(handler, codec, cmds[0])
    assert first.result is wire.AckResult.EXPIRED and first.reason is None  # forgotten: judged anew
    for c in cmds[2:]:
        copy = _ack(handler, codec, c)
        assert copy.result is wire.AckResult.APPLIED and copy.reason is not None
        assert copy.reason.startswith("duplicate:")
