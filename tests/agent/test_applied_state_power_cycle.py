"""What a rack confirmed applying (``Ingest.applied_*``) across a power cycle of its host and a card
repaired on a host that is off: the simulator's plant, its command handler (acks and the rack's
retained applied state), its telemetry encoder, the wire and the agent's ingest, no broker.

A rack publishes its applied state with every command it applies, each naming every card of the
rack, so the ``host_power_off`` and ``host_power_on`` commands themselves supersede what was
confirmed before: the belief takes no confirmation from before a power cycle that the rack did not
send again with it. A card's level and power limit survive the cycle (the plant keeps them, and the
applied states say so); a rack that resets its cards at boot and does not republish has the reset
disproved by the first reading of the woken cards (``AppliedStates._disprove``). The one confirmation no
applied state renews, a card that failed awake and was repaired asleep on an off host, stays "awake"
only while the belief holds the card failed (a failure is kept while its host is off: budgeted at
0 W, kept by no guard step) and is superseded by the power-on's applied state.
"""

from __future__ import annotations

import itertools
import math
import uuid

import numpy as np
import pytest
from agent_helpers import SITE_FILE

from agent import wire
from agent.clock import SiteClock
from agent.ingest import Ingest
from sim.commands import CommandHandler
from sim.telemetry import TelemetryEncoder
from twin.plant import CardFailure, Plant, PlantConfig
from twin.spec import SiteSpec, site_from_dict
from twin.state import TwinState
from twin.tables import read_toml

pytestmark = pytest.mark.agent

START = 1_800_000_000.0
HOST = list(range(8, 16))  # host 1 of rack r0 (hosts of 8 cards)
REPAIRED = 9


def _site() -> SiteSpec:
    """2 racks of 16 cards, 2 hosts of 8 cards each (the example site's rack otherwise)."""
    data = read_toml(SITE_FILE)
    data["name"], data["torus_dims"], data["racks_per_supernode"] = "small-2x16", [4, 4, 2], 2
    data["rack"]["hosts_per_rack"] = 2
    site = site_from_dict(data, source="test")
    assert site.cards_per_host == 8 and site.hosts_managed
    return site


class _Rack:
    """The plant behind the simulator's command handler and encoder, read by the agent's ingest."""

    def __init__(self, site: SiteSpec, plant: Plant) -> None:
        self.site, self.plant = site, plant
        self.codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
        self.handler = CommandHandler(plant, self.codec, wire.Sequencer("sim"), lambda: START + plant.time_s)
        self.encoder = TelemetryEncoder(self.codec, site, wire.Sequencer("sim"))
        self.state = TwinState(site)
        self.ingest = Ingest(site, self.state, SiteClock(1.0, infer=False, wall=lambda: plant.time_s))
        self._seq = itertools.count()

    def send(self, setting: wire.CardSetting) -> None:
        """A command to host 1's cards, stamped now; its ack and applied state to the ingest."""
        t = START + self.plant.time_s
        cmd = wire.RackCommand("r0", tuple(HOST), setting, uuid.uuid4(), t + 30.0, t, next(self._seq), "agent")
        out = [
            self.codec.decode(o.topic, o.payload)
            for o in self.handler.handle(self.codec.topics.rack_cmd("r0"), wire.encode(cmd))
        ]
        ack = out[0]
        assert isinstance(ack, wire.Acknowledgement) and ack.result is wire.AckResult.APPLIED, ack
        assert any(isinstance(m, wire.AppliedState) for m in out)  # every applied command: the rack's applied state
        for m in out:
            self._take(m)

    def _take(self, m: wire.Message | wire.Rejection) -> None:
        assert not isinstance(m, wire.Rejection), m
        self.ingest.handle(m)

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.plant.step(1.0)
            for o in self.encoder.readings(self.plant.readings(), START + self.plant.time_s):
                self._take(self.codec.decode(o.topic, o.payload))
            self.ingest.flush()

    def confirmed_as_run(self) -> None:
        """Host 1's confirmed level, power limit and low-power state are what its cards run at."""
        truth, ing = self.plant.truth(), self.ingest
        assert ing.applied_level[HOST].tolist() == truth.level[HOST].tolist()
        assert ing.applied_power_limit_w[HOST].tolist() == self.state.card_power_limit_w[HOST].tolist()
        assert (ing.applied_low_power[HOST] == 1.0).tolist() == truth.low_power[HOST].tolist()
        assert self.state.card_level[HOST].tolist() == truth.level[HOST].tolist()


def test_a_power_cycle_and_a_repair_on_the_off_host_leave_no_confirmation_the_rack_did_not_send_again() -> None:
    site = _site()
    plant = Plant(site, [], [CardFailure(card=REPAIRED, at_s=5.0, repair_after_s=30.0)], config=PlantConfig(seed=3))
    rack = _Rack(site, plant)
    ing, state = rack.ingest, rack.state
    rack.run(2)
    rack.send(wire.CardSetting.dvfs(3))
    rack.send(wire.CardSetting.power_limit(500.0))
    rack.run(8)  # card 9 fails awake at 5 s
    assert state.card_failed[REPAIRED] and not plant.truth().low_power[REPAIRED]
    rack.confirmed_as_run()
    rack.send(wire.CardSetting.host_power_off())
    rack.run(3)
    rack.confirmed_as_run()  # asleep but the failed card (it reads failed while its host is off)
    assert ing.applied_level[HOST].tolist() == [3] * 8 and ing.applied_power_limit_w[HOST].tolist() == [500.0] * 8
    rack.run(30)  # repaired at 35 s on the off host: asleep like its neighbours, no applied state sent
    assert plant.truth().low_power[REPAIRED] and not plant.truth().failed[REPAIRED]
    # the one stale confirmation: awake, from the power-off; the belief keeps the card failed while its
    # host is off (no reading can tell), so it is budgeted at 0 W and no guard step keeps its sleep
    assert ing.applied_low_power[REPAIRED] == 0.0
    assert state.card_failed[REPAIRED] and state.card_low_power[REPAIRED]
    rack.send(wire.CardSetting.host_power_on())
    rack.run(3)
    rack.confirmed_as_run()  # the power-on's applied state: asleep, the level and limit kept
    assert ing.applied_low_power[REPAIRED] == 1.0 and not state.card_failed[REPAIRED]
    rack.run(math.ceil(site.rack.host_boot_s))
    rack.send(wire.CardSetting.wake())
    rack.run(10)
    rack.confirmed_as_run()  # awake at the level and limit confirmed before the cycle, as the plant runs them
    assert plant.truth().level[HOST].tolist() == [3] * 8
    assert ing.stats.applied_disproved == {}


def test_a_rack_that_resets_its_cards_at_boot_without_saying_so_is_disproved_by_the_woken_cards_readings() -> None:
    """The rack's cards come back from the power cycle at their defaults (the fastest level, the full
    power limit), and the rack does not republish: its wake's applied state still names level 3 and
    500 W. The first readings of the woken cards (stamped past the confirmation margin) disprove both:
    the belief's level comes from their clock and nothing of the old confirmation is left."""
    site = _site()
    plant = Plant(site, [], config=PlantConfig(seed=3))
    rack = _Rack(site, plant)
    ing, state = rack.ingest, rack.state
    rack.run(2)
    rack.send(wire.CardSetting.dvfs(3))
    rack.send(wire.CardSetting.power_limit(500.0))
    rack.run(3)
    rack.send(wire.CardSetting.host_power_off())
    rack.run(3)
    rack.send(wire.CardSetting.host_power_on())
    plant.set_levels(HOST, 0)  # the reset at boot, behind the rack's record of what it applied
    plant.set_power_limits(HOST, site.card.power_limit_w)
    rack.run(math.ceil(site.rack.host_boot_s))
    rack.send(wire.CardSetting.wake())
    assert ing.applied_level[HOST].tolist() == [3] * 8  # the wake's applied state: the old settings
    rack.run(math.ceil(site.card.wake_latency_s) + 5)
    assert plant.truth().level[HOST].tolist() == [0] * 8
    assert ing.applied_level[HOST].tolist() == [-1] * 8
    assert np.isnan(ing.applied_power_limit_w[HOST]).all()
    assert state.card_level[HOST].tolist() == [0] * 8
    assert ing.applied_low_power[HOST].tolist() == [0.0] * 8
