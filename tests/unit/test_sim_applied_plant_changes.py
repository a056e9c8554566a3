"""The simulator's rack publishes its applied state again when the plant changes what it said other
than by a rack command (docs/protocol.md, ``racktwin.applied/1``): a job placed on sleeping cards
wakes them (a scheduler ``place``, or the plant's own placement of a job no one placed within
``external_timeout_s``), booting their hosts; a card that fails asleep leaves the low-power state; a
card repaired on an off host enters it. The simulator's plant, command handler (answering bursts, as
the simulator does: ``applied_with_ack=False``, then ``applied_states``), telemetry encoder and the
agent's ingest, no broker."""

from __future__ import annotations

import itertools
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest

from agent import wire
from agent.clock import SiteClock
from agent.ingest import Ingest
from sim.commands import CommandHandler
from sim.telemetry import TelemetryEncoder
from twin.faults import Fault
from twin.plant import CardFailure, Plant, PlantConfig
from twin.spec import SiteSpec, site_from_dict
from twin.state import TwinState
from twin.workload import JobSpec

pytestmark = pytest.mark.unit

START = 1_800_000_000.0
EXAMPLE_SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"
_SEQ = itertools.count()


def _site() -> SiteSpec:
    """Two racks of 16 cards, two hosts of 8 cards per rack (r0: hosts 0, 1; r1: hosts 2, 3)."""
    d = tomllib.loads(EXAMPLE_SITE.read_text(encoding="utf-8"))
    d["name"], d["torus_dims"], d["racks_per_supernode"] = "small-32", [4, 4, 2], 2
    d["rack"]["hosts_per_rack"] = 2
    return site_from_dict(d, source="test")


def _job(job_id: str, n_cards: int) -> JobSpec:
    return JobSpec(job_id, n_cards, work_steps=1e6, step_time_s=1.0, compute_share=0.9)


class _Rack:
    """The simulator's command handler in front of a plant whose cards all start asleep."""

    def __init__(self, jobs: list[JobSpec], faults: list[Fault] | None = None, **config: float | str) -> None:
        self.site = site = _site()
        self.plant = Plant(site, jobs, faults or [], config=PlantConfig(seed=3, initial_low_power=True, **config))  # type: ignore[arg-type]
        self.codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
        self.handler = CommandHandler(
            self.plant, self.codec, wire.Sequencer("sim"), lambda: START + self.plant.time_s, applied_with_ack=False
        )

    def applied(self) -> dict[str, wire.AppliedState]:
        """The applied states the simulator publishes now (after a burst, or after a step), by rack."""
        out: dict[str, wire.AppliedState] = {}
        for o in self.handler.applied_states():
            m = self.codec.decode(o.topic, o.payload)
            assert isinstance(m, wire.AppliedState) and o.retain
            out[m.rack] = m
        return out

    def command(self, rack: str, cards: tuple[int, ...], setting: wire.CardSetting) -> dict[str, wire.AppliedState]:
        """A rack command, applied; the applied states of its burst."""
        t = START + self.plant.time_s
        cmd = wire.RackCommand(rack, cards, setting, uuid.uuid4(), t + 30.0, t, next(_SEQ), "agent")
        (ack,) = [
            self.codec.decode(o.topic, o.payload)
            for o in self.handler.handle(self.codec.topics.rack_cmd(rack), wire.encode(cmd))
        ]
        assert isinstance(ack, wire.Acknowledgement) and ack.result is wire.AckResult.APPLIED, ack
        return self.applied()

    def place(self, job_id: str, cards: dict[str, tuple[int, ...]]) -> None:
        t = START + self.plant.time_s
        cmd = wire.SchedulerCommand(job_id, cards, uuid.uuid4(), t + 30.0, t, next(_SEQ), "agent")
        (ack,) = [
            self.codec.decode(o.topic, o.payload)
            for o in self.handler.handle(self.codec.topics.scheduler_cmd, wire.encode(cmd))
        ]
        assert isinstance(ack, wire.Acknowledgement) and ack.result is wire.AckResult.APPLIED, ack


def test_a_placement_on_sleeping_cards_publishes_their_racks_applied_state_naming_them_awake() -> None:
    rack = _Rack([_job("j", 8)], placement="external", external_timeout_s=1e6)
    rack.plant.step(1.0)  # submitted, queued: the plant waits for the agent
    assert rack.applied() == {}
    rack.place("j", {"r0": (4, 5, 6, 7), "r1": (0, 1, 2, 3)})  # cards of hosts 0 and 2, all asleep
    applied = rack.applied()  # the burst's applied states: one per rack the placement woke cards of
    assert sorted(applied) == ["r0", "r1"]
    assert np.flatnonzero(~applied["r0"].low_power).tolist() == [4, 5, 6, 7]
    assert np.flatnonzero(~applied["r1"].low_power).tolist() == [0, 1, 2, 3]
    assert applied["r0"].last_command_id is None  # no rack command was applied: the plant changed it
    assert rack.applied() == {}  # once: nothing changed since
    rack.plant.run(60.0)  # the cards finish waking, the job starts: nothing the applied state says
    assert rack.applied() == {}


def test_a_placement_on_an_off_host_publishes_the_host_on_and_its_placed_cards_awake() -> None:
    rack = _Rack([_job("j", 4)], placement="external", external_timeout_s=1e6)
    assert sorted(rack.command("r0", tuple(range(8, 16)), wire.CardSetting.host_power_off())) == ["r0"]
    rack.place("j", {"r0": (8, 9, 10, 11)})
    (applied,) = rack.applied().values()
    assert applied.host_off is not None and not applied.host_off.any()  # the placement booted host 1
    assert np.flatnonzero(~applied.low_power).tolist() == [8, 9, 10, 11]  # its other cards stay asleep


def test_the_plants_own_placement_publishes_the_applied_state_of_the_cards_it_woke() -> None:
    """No agent places the job: the plant's scheduler does, ``external_timeout_s`` after it was queued,
    and wakes the cards; the applied state published after that step names them awake."""
    rack = _Rack([_job("j", 8)], placement="external", external_timeout_s=20.0)
    woken_at = None
    for _ in range(30):
        rack.plant.step(1.0)
        applied = rack.applied()  # what the simulator publishes after each step
        if applied:
            assert woken_at is None, "published once"
            woken_at = rack.plant.time_s
            (state,) = applied.values()
            cards = rack.plant.job_cards("j") - rack.site.cards_per_rack * rack.site.rack_names.index(state.rack)
            assert np.flatnonzero(~state.low_power).tolist() == sorted(cards.tolist())
    assert woken_at == pytest.approx(20.0)
    assert rack.plant.accounting().jobs_placed_by_plant == 1


def test_a_card_failing_asleep_and_repaired_on_an_off_host_publishes_the_applied_state() -> None:
    rack = _Rack([], [CardFailure(card=20, at_s=5.0, repair_after_s=10.0)])  # r1's card 4, host 2
    rack.plant.step(1.0)
    assert sorted(rack.command("r1", tuple(range(8, 16)), wire.CardSetting.host_power_off())) == ["r1"]
    rack.plant.run(5.0)  # card 20 fails asleep: no longer in the low-power state
    (applied,) = rack.applied().values()
    assert applied.rack == "r1" and not applied.low_power[4] and applied.low_power[[0, 1, 2, 3, 5, 6, 7]].all()
    (off,) = rack.command("r1", tuple(range(8)), wire.CardSetting.host_power_off()).values()
    assert off.host_off is not None and off.host_off.all() and not off.low_power[4]  # failed: not asleep
    rack.plant.run(10.0)  # repaired on the off host: asleep like its neighbours
    (applied,) = rack.applied().values()
    assert applied.low_power.all()


def test_the_agent_counts_no_disproval_for_cards_the_plant_woke_for_a_placement() -> None:
    """The agent's ingest takes what the simulator publishes: the retained applied state (all asleep),
    then the placement's ack and the applied state after it, then telemetry of the woken cards. No
    ``low_power`` disproval (``racktwin_applied_state_disproved_total``): the rack said they woke."""
    rack = _Rack([_job("j", 8)], placement="external", external_timeout_s=1e6)
    site, plant, codec = rack.site, rack.plant, rack.codec
    encoder = TelemetryEncoder(codec, site, wire.Sequencer("sim"))
    ingest = Ingest(site, TwinState(site), SiteClock(1.0, infer=False, wall=lambda: plant.time_s))

    def take(out: list[wire.Outgoing]) -> None:
        for o in out:
            m = codec.decode(o.topic, o.payload)
            assert not isinstance(m, wire.Rejection), m
            ingest.handle(m)

    take([rack.handler.applied_state(r) for r in range(site.n_racks)])  # on connect
    assert (ingest.applied_low_power == 1.0).all()
    plant.step(1.0)
    rack.place("j", {"r0": tuple(range(8))})
    take(rack.handler.applied_states())
    for _ in range(60):
        plant.step(1.0)
        take(rack.handler.applied_states())
        take(encoder.readings(plant.readings(), START + plant.time_s))
        ingest.flush()
    assert not plant.truth().low_power[:8].any()  # awake, in telemetry too
    assert ingest.applied_low_power[:8].tolist() == [0.0] * 8
    assert ingest.stats.applied_disproved == {}
