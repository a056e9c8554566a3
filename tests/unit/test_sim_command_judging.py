"""How the simulator judges a rack command before it applies it (docs/protocol.md, "Which commands a
rack applies"), without a broker: expiry at the instant of ``expires_at``, copies of refused commands
answered as copies (not judged anew, so never applied later), which settings a command is ordered
with, and what a rack publishes (the retained applied state, acks not retained; after a burst answered
at once, one applied state per rack it changed, stamped when made).

What users rely on: an agent retries a command it got no ack for, and a broker may deliver an old
command late; a copy of a command the rack refused must not be applied once the cause went away (a
powered-on host, a clock that caught up), and an older command must not undo a newer one that set
the same thing under another action (a clock range after a level, a wake after a power-off)."""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent import wire
from sim.commands import CommandHandler
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec, site_from_dict
from twin.workload import JobSpec

pytestmark = pytest.mark.unit

TS = 1_800_000_000.0
EXAMPLE_SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"
HOST = tuple(range(8, 16))  # every card of host 3 (rack r1's second host)
R1 = 16  # r1's first site card


class Clock:
    def __init__(self) -> None:
        self.now_s = TS

    def __call__(self) -> float:
        return self.now_s


def _site() -> SiteSpec:
    """Two racks of 16 cards, two hosts of 8 cards per rack."""
    d = tomllib.loads(EXAMPLE_SITE.read_text(encoding="utf-8"))
    d["name"] = "small-32"
    d["torus_dims"] = [4, 4, 2]
    d["racks_per_supernode"] = 2
    d["rack"]["hosts_per_rack"] = 2
    return site_from_dict(d, source="test")


def _setup() -> tuple[Plant, CommandHandler, wire.Codec, Clock]:
    site = _site()
    queued = JobSpec("queued", 2, work_steps=1e9, step_time_s=1.0, compute_share=1.0)
    plant = Plant(site, [queued], config=PlantConfig(seed=1))
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    clock = Clock()
    return plant, CommandHandler(plant, codec, wire.Sequencer("sim"), clock), codec, clock


def _cmd(
    setting: wire.CardSetting,
    ts_s: float,
    seq: int,
    cards: tuple[int, ...] = HOST,
    cid: uuid.UUID | None = None,
    expires_s: float | None = None,
) -> wire.RackCommand:
    expires = ts_s + 30.0 if expires_s is None else expires_s
    return wire.RackCommand("r1", cards, setting, cid or uuid.uuid4(), expires, ts_s, seq, "agent")


def _answer(handler: CommandHandler, codec: wire.Codec, cmd: wire.Command) -> list[wire.Message | wire.Rejection]:
    topics: dict[type, Callable[[Any], str]] = {
        wire.RackCommand: lambda c: codec.topics.rack_cmd(c.rack),
        wire.CduCommand: lambda c: codec.topics.cdu_cmd(c.rack),
        wire.FacilityCommand: lambda _c: codec.topics.facility_cmd,
        wire.SchedulerCommand: lambda _c: codec.topics.scheduler_cmd,
    }
    topic = topics[type(cmd)](cmd)
    return [codec.decode(o.topic, o.payload) for o in handler.handle(topic, wire.encode(cmd))]


def _ack(handler: CommandHandler, codec: wire.Codec, cmd: wire.Command) -> wire.Acknowledgement:
    ack = _answer(handler, codec, cmd)[0]
    assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cmd.command_id
    return ack


# ---- expiry --------------------------------------------------------------------------------------


def test_a_command_arriving_at_its_expiry_instant_is_expired_and_not_applied() -> None:
    """At or after ``expires_at`` on the rack's clock a command is acked ``expired``, not applied."""
    _plant, handler, codec, clock = _setup()
    at = _cmd(wire.CardSetting.dvfs(5), TS - 10.0, 0, cards=(1,), expires_s=TS)
    ack = _ack(handler, codec, at)
    assert ack.result is wire.AckResult.EXPIRED and ack.reason is None
    assert handler.level[R1 + 1] != 5
    # an instant before its expiry it is applied
    clock.now_s = TS - 1e-3
    before = _cmd(wire.CardSetting.dvfs(5), TS - 10.0, 1, cards=(2,), expires_s=TS)
    assert _ack(handler, codec, before).result is wire.AckResult.APPLIED
    assert handler.level[R1 + 2] == 5
    assert (handler.counts.applied, handler.counts.expired) == (1, 1)


def test_the_rules_are_judged_in_their_order() -> None:
    """A command breaking several rules is answered for the first of them (docs/protocol.md): expiry
    before its times (an expired command with a too long life is ``expired``), the order of commands
    before a powered-off host (an older level to a card of an off host is ``superseded``)."""
    _plant, handler, codec, _clock = _setup()
    long_dead = _cmd(wire.CardSetting.dvfs(5), TS - 10_000.0, 0, cards=(1,), expires_s=TS - 1.0)
    assert long_dead.expires_s - long_dead.ts_s > wire.MAX_COMMAND_TTL_S
    assert _ack(handler, codec, long_dead).result is wire.AckResult.EXPIRED
    assert _ack(handler, codec, _cmd(wire.CardSetting.dvfs(2), TS - 5.0, 1)).result is wire.AckResult.APPLIED
    assert _ack(handler, codec, _cmd(wire.CardSetting.host_power_off(), TS - 4.0, 2)).result is wire.AckResult.APPLIED
    older = _ack(handler, codec, _cmd(wire.CardSetting.dvfs(6), TS - 6.0, 0))
    assert older.result is wire.AckResult.REJECTED and wire.reason_code(older.reason) == "superseded", older.reason
    c = handler.counts
    assert (c.expired, c.superseded) == (1, 1) and c.rejection_reasons == {"rack.superseded": 1}


# ---- copies of commands answered before ----------------------------------------------------------


def test_a_copy_of_an_applied_command_says_so_and_carries_no_other_reason() -> None:
    _plant, handler, codec, _clock = _setup()
    cmd = _cmd(wire.CardSetting.dvfs(3), TS - 1.0, 0)
    first = _ack(handler, codec, cmd)
    assert first.result is wire.AckResult.APPLIED and first.reason is None
    copy = _ack(handler, codec, cmd)
    assert copy.result is wire.AckResult.APPLIED
    assert copy.reason == f"duplicate: command {cmd.command_id} was applied before; not applied again"


def _refused(handler: CommandHandler, codec: wire.Codec, cmd: wire.RackCommand, code: str) -> wire.Acknowledgement:
    first = _ack(handler, codec, cmd)
    assert first.result is wire.AckResult.REJECTED and first.reason is not None
    assert wire.reason_code(first.reason) == code, first.reason
    return first


def _is_copy_of(copy: wire.Acknowledgement, first: wire.Acknowledgement) -> None:
    """``copy`` answers what ``first`` answered, as a copy, saying why the command was refused."""
    assert copy.result is first.result and copy.reason is not None and first.reason is not None
    assert copy.reason.startswith(f"duplicate: command {first.command_id} was rejected before"), copy.reason
    assert first.reason in copy.reason and copy.reason.endswith("not applied again"), copy.reason


def test_a_copy_of_a_command_issued_ahead_is_not_applied_once_the_clock_caught_up() -> None:
    _plant, handler, codec, clock = _setup()
    ahead = _cmd(wire.CardSetting.dvfs(6), TS + 60.0, 0)
    first = _refused(handler, codec, ahead, "issued_ahead")
    clock.now_s = TS + 60.0  # a retry or a broker's queue delivers it again, now within the limit
    _is_copy_of(_ack(handler, codec, ahead), first)
    assert not np.any(handler.level[R1 + 8 : R1 + 16] == 6)
    c = handler.counts
    assert (c.applied, c.rejected, c.duplicates) == (0, 1, 1)


def test_a_copy_of_a_command_refused_for_an_off_host_is_not_applied_once_it_is_on() -> None:
    plant, handler, codec, _clock = _setup()
    assert _ack(handler, codec, _cmd(wire.CardSetting.host_power_off(), TS - 5.0, 0)).result is wire.AckResult.APPLIED
    level = _cmd(wire.CardSetting.dvfs(6), TS - 4.0, 1)
    first = _refused(handler, codec, level, "host_off")
    assert _ack(handler, codec, _cmd(wire.CardSetting.host_power_on(), TS - 3.0, 2)).result is wire.AckResult.APPLIED
    assert not plant.host_off().any()
    _is_copy_of(_ack(handler, codec, level), first)
    assert not np.any(handler.level[R1 + 8 : R1 + 16] == 6)
    assert handler.counts.rejection_reasons == {"rack.host_off": 1}


def test_a_copy_of_a_command_the_plant_refused_is_answered_as_a_copy_and_counted_once() -> None:
    _plant, handler, codec, _clock = _setup()
    too_low = _cmd(wire.CardSetting.power_limit(1.0), TS - 1.0, 0)  # below the card's range
    first = _refused(handler, codec, too_low, "set_power_limits")
    _is_copy_of(_ack(handler, codec, too_low), first)
    c = handler.counts
    assert (c.rejected, c.duplicates) == (1, 1) and c.rejection_reasons == {"rack.set_power_limit": 1}
    # a refused command does not count in the order: one issued before it is still applied
    assert _ack(handler, codec, _cmd(wire.CardSetting.power_limit(450.0), TS - 2.0, 1)).result is wire.AckResult.APPLIED
    assert handler.power_limit_w[R1 + 8 : R1 + 16].tolist() == [450.0] * 8


def test_a_copy_of_a_superseded_command_is_answered_as_a_copy_and_counted_once() -> None:
    _plant, handler, codec, _clock = _setup()
    assert _ack(handler, codec, _cmd(wire.CardSetting.dvfs(2), TS - 1.0, 1)).result is wire.AckResult.APPLIED
    old = _cmd(wire.CardSetting.dvfs(6), TS - 2.0, 0)
    first = _refused(handler, codec, old, "superseded")
    _is_copy_of(_ack(handler, codec, old), first)
    c = handler.counts
    assert (c.applied, c.rejected, c.superseded, c.duplicates) == (1, 1, 1, 1)
    assert c.rejection_reasons == {"rack.superseded": 1}


# ---- order: what a command sets ------------------------------------------------------------------

_ACTIONS = {
    "level": wire.CardSetting.dvfs(4),
    "clock range": wire.CardSetting.clock_range(1210.0, 1540.0),
    "power limit": wire.CardSetting.power_limit(500.0),
    "low power": wire.CardSetting.low_power_idle(),
    "wake": wire.CardSetting.wake(),
    "host off": wire.CardSetting.host_power_off(),
    "host on": wire.CardSetting.host_power_on(),
}


@pytest.mark.parametrize(
    ("newer", "older", "sets"),
    [
        ("level", "clock range", "DVFS level"),
        ("clock range", "level", "DVFS level"),
        ("level", "power limit", None),
        ("power limit", "level", None),
        ("power limit", "clock range", None),
        ("wake", "low power", "power state"),
        ("low power", "wake", "power state"),
        ("host on", "host off", "power state"),
        ("host off", "wake", "power state"),
        ("host on", "low power", "power state"),
        ("low power", "level", None),
        ("wake", "power limit", None),
    ],
)
def test_an_older_command_is_superseded_by_a_newer_one_that_set_the_same_setting(
    newer: str, older: str, sets: str | None
) -> None:
    """Each card keeps the issue stamp of the last command applied to its DVFS level (``set_dvfs_level``,
    ``set_clock_range``), its power limit, and its power state (``low_power_idle``, ``wake``,
    ``host_power_off``, ``host_power_on``): an older command for one of them is refused whole, naming
    the first card of it; a command for another one is applied."""
    plant, handler, codec, _clock = _setup()
    assert _ack(handler, codec, _cmd(_ACTIONS[newer], TS - 1.0, 1)).result is wire.AckResult.APPLIED
    ack = _ack(handler, codec, _cmd(_ACTIONS[older], TS - 2.0, 0))
    if sets is None:
        assert ack.result is wire.AckResult.APPLIED, ack.reason
        return
    assert ack.result is wire.AckResult.REJECTED and ack.reason is not None
    assert ack.reason.startswith(f"superseded: the {sets} of card 8 of rack r1 has applied a command"), ack.reason
    if newer == "host off":  # the older wake did not boot the host
        assert plant.host_off()[3]
    if newer == "host on":
        assert not plant.host_off().any()


def test_one_publishers_command_stamped_like_the_last_applied_one_is_not_newer() -> None:
    """Same ``ts`` from the same publisher: only a higher ``seq`` is newer; an equal one is not."""
    _plant, handler, codec, _clock = _setup()
    assert _ack(handler, codec, _cmd(wire.CardSetting.dvfs(2), TS - 1.0, 7)).result is wire.AckResult.APPLIED
    same = _ack(handler, codec, _cmd(wire.CardSetting.dvfs(6), TS - 1.0, 7))
    assert same.result is wire.AckResult.REJECTED and wire.reason_code(same.reason) == "superseded"
    assert _ack(handler, codec, _cmd(wire.CardSetting.dvfs(6), TS - 1.0, 8)).result is wire.AckResult.APPLIED
    assert handler.level[R1 + 8 : R1 + 16].tolist() == [6] * 8


# ---- what a rack publishes -----------------------------------------------------------------------


def test_the_applied_state_is_retained_and_acks_are_not() -> None:
    """The applied state is retained (an agent that starts reads the rack's settings from it); an ack
    answers one command once (QoS 1, not retained). A command that changes no card setting (the
    pump, the set-point, a job's placement) is answered with its ack alone."""
    _plant, handler, codec, _clock = _setup()
    out = handler.handle(codec.topics.rack_cmd("r1"), wire.encode(_cmd(wire.CardSetting.dvfs(3), TS - 1.0, 0)))
    assert [(o.topic, o.qos, o.retain) for o in out] == [
        (codec.topics.rack_ack("r1"), 1, False),
        (codec.topics.applied("r1"), 1, True),
    ]
    # each applied state of a rack takes the next seq; it shows every setting as applied
    first = codec.decode(out[1].topic, out[1].payload)
    second = _answer(handler, codec, _cmd(wire.CardSetting.power_limit(450.0), TS - 1.0, 1))[1]
    assert isinstance(first, wire.AppliedState) and isinstance(second, wire.AppliedState)
    assert second.seq == first.seq + 1
    assert second.dvfs_level[8:].tolist() == [3] * 8 and second.max_clock_mhz[8:].tolist() == [1650.0] * 8
    assert second.power_limit_w[8:].tolist() == [450.0] * 8 and second.power_limit_w[0] == 700.0
    pump = wire.CduCommand("r1", 0.8, uuid.uuid4(), TS + 30.0, TS - 1.0, 0, "agent")
    setpoint = wire.FacilityCommand(35.0, uuid.uuid4(), TS + 30.0, TS - 1.0, 0, "agent")
    place = wire.SchedulerCommand("queued", {"r0": (0, 1)}, uuid.uuid4(), TS + 30.0, TS - 1.0, 0, "agent")
    for cmd in (pump, setpoint, place):
        (only,) = _answer(handler, codec, cmd)
        assert isinstance(only, wire.Acknowledgement) and only.result is wire.AckResult.APPLIED


def test_a_burst_answered_at_once_republishes_each_touched_racks_applied_state_stamped_when_made() -> None:
    """The simulator answers a burst of commands at once (``applied_with_ack=False``): the acks come
    out one by one, and afterwards every rack a command of the burst changed gets its retained
    applied state, one per rack however many of its commands were applied, stamped with the site
    clock when it is made and showing every command of the burst. A rack left out would keep a stale
    retained state: an agent that starts reads its settings back from it."""
    plant, _handler, codec, clock = _setup()
    handler = CommandHandler(plant, codec, wire.Sequencer("sim"), clock, applied_with_ack=False)
    r0 = wire.RackCommand("r0", (0, 1), wire.CardSetting.dvfs(5), uuid.uuid4(), TS + 30.0, TS - 1.0, 1, "agent")
    burst = [_cmd(wire.CardSetting.dvfs(3), TS - 1.0, 0), r0, _cmd(wire.CardSetting.power_limit(450.0), TS - 1.0, 2)]
    for cmd in burst:
        (ack,) = _answer(handler, codec, cmd)  # the ack alone
        assert isinstance(ack, wire.Acknowledgement) and ack.result is wire.AckResult.APPLIED and ack.ts_s == TS
    clock.now_s = TS + 5.0
    states = [codec.decode(o.topic, o.payload) for o in handler.applied_states()]
    assert all(isinstance(s, wire.AppliedState) for s in states)
    by_rack = {s.rack: s for s in states if isinstance(s, wire.AppliedState)}
    assert len(states) == 2 and set(by_rack) == {"r0", "r1"}
    assert {s.ts_s for s in by_rack.values()} == {TS + 5.0}
    r1_state = by_rack["r1"]
    assert r1_state.last_command_id == burst[2].command_id
    assert r1_state.dvfs_level[8:].tolist() == [3] * 8 and r1_state.power_limit_w[8:].tolist() == [450.0] * 8
    r0_state = by_rack["r0"]
    assert r0_state.last_command_id == r0.command_id
    assert r0_state.dvfs_level[:3].tolist() == [5, 5, plant.config.initial_level]
    assert handler.applied_states() == []  # nothing changed since
