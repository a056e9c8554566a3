"""Host power over the wire in the simulator, without a broker: ``host_power_off`` / ``host_power_on``
rack commands (whole hosts only, busy hosts refused, all or nothing), and the ``host_off`` column of
the card batch and the applied state."""

from __future__ import annotations

import itertools
import json
import tomllib
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent import wire
from sim.commands import CommandHandler
from sim.telemetry import TelemetryEncoder
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec, site_from_dict
from twin.workload import JobSpec

pytestmark = pytest.mark.unit

TS = 1_800_000_000.0
_SEQ = itertools.count()
EXAMPLE_SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"


def _site(hosts_per_rack: int) -> SiteSpec:
    """Two racks of 16 cards; ``hosts_per_rack`` hosts per rack (0: hosts not managed)."""
    d = tomllib.loads(EXAMPLE_SITE.read_text(encoding="utf-8"))
    d["name"] = "small-32"
    d["torus_dims"] = [4, 4, 2]
    d["racks_per_supernode"] = 2
    d["rack"]["hosts_per_rack"] = hosts_per_rack
    if hosts_per_rack == 0:
        for k in ("host_power_w", "host_off_power_w", "host_boot_s"):
            d["rack"].pop(k, None)
    return site_from_dict(d, source="test")


def _handler(site: SiteSpec, jobs: tuple[JobSpec, ...] = ()) -> tuple[Plant, CommandHandler, wire.Codec]:
    plant = Plant(site, list(jobs), config=PlantConfig(seed=3))
    if jobs:
        plant.place_job(jobs[0].job_id, np.arange(jobs[0].n_cards))  # on site cards 0..n-1 (rack r0)
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    return plant, CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: TS), codec


def _send(
    handler: CommandHandler, codec: wire.Codec, rack: str, cards: tuple[int, ...], setting: wire.CardSetting
) -> Any:
    # one publisher's commands stamped alike are ordered by seq: each next command is the newer one
    # (a rack refuses one issued before what it last applied to the same cards: docs/protocol.md)
    cmd = wire.RackCommand(rack, cards, setting, uuid.uuid4(), TS + 30, TS - 1, next(_SEQ), "agent")
    out = handler.handle(codec.topics.rack_cmd(rack), wire.encode(cmd))
    decoded = [codec.decode(o.topic, o.payload) for o in out]
    ack = decoded[0]
    assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cmd.command_id
    applied = [m for m in decoded if isinstance(m, wire.AppliedState)]
    return ack, applied


def test_whole_hosts_are_powered_off_and_on() -> None:
    site = _site(2)  # hosts of 8 cards: r0 holds hosts 0, 1; r1 holds hosts 2, 3
    assert site.cards_per_host == 8
    plant, handler, codec = _handler(site)
    ack, applied = _send(handler, codec, "r1", tuple(range(8, 16)), wire.CardSetting.host_power_off())
    assert ack.result is wire.AckResult.APPLIED and ack.reason is None
    assert plant.truth().host_off.tolist() == [False, False, False, True]
    # the retained applied state says which cards sit on an off host (and that they are asleep)
    (state,) = applied
    assert state.rack == "r1" and state.host_off is not None
    assert state.host_off.tolist() == [False] * 8 + [True] * 8
    assert state.low_power.tolist() == [False] * 8 + [True] * 8
    # so does the card batch; the cards of the off host draw nothing
    plant.step(1.0)
    enc = TelemetryEncoder(codec, site, wire.Sequencer("sim"))
    batches = [codec.decode(o.topic, o.payload) for o in enc.readings(plant.readings(), TS)]
    r1 = next(b for b in batches if isinstance(b, wire.CardBatch) and b.rack == "r1")
    r0 = next(b for b in batches if isinstance(b, wire.CardBatch) and b.rack == "r0")
    assert r1.host_off is not None and r1.host_off.tolist() == [False] * 8 + [True] * 8
    assert r0.host_off is not None and not r0.host_off.any()
    assert np.all(r1.power_w[8:] == 0.0) and np.all(r1.low_power[8:])
    # on again (the order of the cards does not matter): the host boots, its cards stay asleep
    ack, (state,) = _send(handler, codec, "r1", tuple(range(15, 7, -1)), wire.CardSetting.host_power_on())
    assert ack.result is wire.AckResult.APPLIED
    assert not plant.truth().host_off.any() and plant.host_booting().tolist() == [False, False, False, True]
    assert state.host_off is not None and not state.host_off.any() and state.low_power[8:].all()
    assert handler.counts.applied == 2 and handler.counts.rejected == 0


@pytest.mark.parametrize(
    ("cards", "missing"),
    [
        ((8, 9, 10), "host 3 (cards 8..15 of rack r1) is missing card 11"),
        (tuple(range(9)), "host 3 (cards 8..15 of rack r1) is missing card 9"),  # host 2 whole, host 3 cut
        (tuple(range(1, 9)), "host 2 (cards 0..7 of rack r1) is missing card 0"),
    ],
)
def test_a_host_command_must_list_whole_hosts(cards: tuple[int, ...], missing: str) -> None:
    plant, handler, codec = _handler(_site(2))
    ack, applied = _send(handler, codec, "r1", cards, wire.CardSetting.host_power_off())
    assert ack.result is wire.AckResult.REJECTED and ack.reason is not None
    assert "cards must be whole hosts of 8 cards" in ack.reason and missing in ack.reason, ack.reason
    assert not applied and not plant.truth().host_off.any() and not plant.truth().low_power.any()
    assert handler.counts.rejection_reasons == {"rack.host_power_off": 1}


def test_a_host_with_a_busy_card_is_refused_and_nothing_is_applied() -> None:
    busy = JobSpec("busy", 2, work_steps=1e9, step_time_s=1.0, compute_share=1.0)
    plant, handler, codec = _handler(_site(2), (busy,))
    # hosts 0 (cards 0..7, two busy) and 1 (idle): the whole command is refused
    ack, applied = _send(handler, codec, "r0", tuple(range(16)), wire.CardSetting.host_power_off())
    assert ack.result is wire.AckResult.REJECTED and ack.reason is not None
    assert "busy with job busy" in ack.reason
    assert not applied and not plant.truth().host_off.any() and not plant.truth().low_power.any()


def test_hosts_not_managed_refuse_host_commands_and_send_no_host_off_column() -> None:
    site = _site(0)
    assert not site.hosts_managed
    plant, handler, codec = _handler(site)
    for setting in (wire.CardSetting.host_power_off(), wire.CardSetting.host_power_on()):
        ack, applied = _send(handler, codec, "r0", tuple(range(16)), setting)
        assert ack.result is wire.AckResult.REJECTED and ack.reason is not None
        assert "hosts_per_rack = 0" in ack.reason and not applied
    plant.step(1.0)
    enc = TelemetryEncoder(codec, site, wire.Sequencer("sim"))
    for o in enc.readings(plant.readings(), TS):
        if o.topic.endswith("/cards"):
            assert "host_off" not in json.loads(o.payload)
    ack, (state,) = _send(handler, codec, "r0", (0,), wire.CardSetting.low_power_idle())
    assert ack.result is wire.AckResult.APPLIED and state.host_off is None


def test_a_clock_range_to_a_card_of_a_powered_off_host_is_refused_like_a_level() -> None:
    """``set_clock_range`` sets the card's DVFS level as ``set_dvfs_level`` does: a card of an off host
    cannot take it (``host_off``); acked applied, the agent believed a clock the card never got."""
    plant, handler, codec = _handler(_site(2))
    ack, _ = _send(handler, codec, "r1", tuple(range(8, 16)), wire.CardSetting.host_power_off())
    assert ack.result is wire.AckResult.APPLIED
    ack, applied = _send(handler, codec, "r1", (7, 8), wire.CardSetting.clock_range(1210.0, 1430.0))
    assert ack.result is wire.AckResult.REJECTED and ack.reason is not None and not applied
    assert ack.reason.startswith("host_off: card 8 is on host 3 (cards 8..15 of rack r1), which is powered off")
    initial = plant.config.initial_level
    assert handler.level[16 + 7] == initial and handler.level[16 + 8] == initial  # card 7 (host on) neither
    assert handler.counts.rejection_reasons == {"rack.host_off": 1}
