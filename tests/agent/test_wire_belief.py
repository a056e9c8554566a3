"""``racktwin evaluate`` feeds the agent's belief the plant's readings directly; the service gets them
as MQTT messages from the simulator (``sim.telemetry.TelemetryEncoder`` -> bytes -> ``agent.wire``
-> ``agent.ingest.Ingest``). The two beliefs must agree: to the sensors' resolution on the wire
(0.01 W, 0.01 deg C, 0.01 % utilization, ...) and exactly in what they know of cards, hosts and jobs,
so that the controller decides the same and an evaluation measures what the service would do."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from agent_helpers import example_site, job
from readings_testing import loop_of

from agent import wire
from agent.clock import SiteClock
from agent.ingest import Ingest
from sim.telemetry import TelemetryEncoder
from twin.faults import Fault
from twin.plant import CardFailure, GarbageReadings, Plant, PlantConfig, SensorDropout, StuckSensor
from twin.readings import JobEvent, Readings
from twin.spec import SiteSpec
from twin.state import StateSnapshot, TwinState

pytestmark = pytest.mark.agent

START = 1_800_000_000.0


def _same_belief(direct: StateSnapshot, wired: StateSnapshot) -> None:
    assert wired.time_s == pytest.approx(START + direct.time_s, abs=1e-6)
    # (not card_waking: the wire has no such column, a waking card reads awake at 0 utilization as
    # docs/protocol.md says, and nothing in the agent reads it)
    for name in ("card_level", "card_low_power", "card_failed", "card_host_off", "card_job"):
        assert np.array_equal(getattr(direct, name), getattr(wired, name)), name
    assert np.array_equal(direct.card_clock_mhz, wired.card_clock_mhz)
    assert np.array_equal(direct.card_power_limit_w, wired.card_power_limit_w)
    assert np.allclose(direct.card_power_w, wired.card_power_w, rtol=0.0, atol=0.005 + 1e-9)
    assert np.allclose(direct.card_die_temp_c, wired.card_die_temp_c, rtol=0.0, atol=0.005 + 1e-9)
    assert np.allclose(direct.card_utilization, wired.card_utilization, rtol=0.0, atol=5e-5 + 1e-12)
    assert np.allclose(direct.rack_power_w, wired.rack_power_w, rtol=0.0, atol=0.005 + 1e-9)
    for name in ("rack_supply_temp_c", "rack_return_temp_c", "rack_flow_lpm"):
        assert np.allclose(getattr(direct, name), getattr(wired, name), rtol=0.0, atol=0.005 + 1e-9), name
    assert np.allclose(direct.rack_pump_speed_frac, wired.rack_pump_speed_frac, rtol=0.0, atol=5e-5 + 1e-12)
    assert direct.stuck_racks == wired.stuck_racks and direct.stuck_cards == wired.stuck_cards
    assert [(j.job_id, j.cards, j.phase, j.state) for j in direct.jobs] == [
        (j.job_id, j.cards, j.phase, j.state) for j in wired.jobs
    ]
    assert [q.job_id for q in direct.queue] == [q.job_id for q in wired.queue]
    assert direct.facility is not None and wired.facility is not None
    assert direct.facility.supply_setpoint_c == wired.facility.supply_setpoint_c
    assert abs(direct.facility.it_power_w - wired.facility.it_power_w) <= 0.05 + 1e-9


class _TwoBeliefs:
    """The same plant readings and job events folded into a belief directly (as ``racktwin evaluate``)
    and through the simulator's encoder, the bytes, the codec and ``Ingest`` (as the service)."""

    def __init__(self, site: SiteSpec) -> None:
        self.direct = TwinState(site)
        self.wired = TwinState(site)
        self.ingest = Ingest(site, self.wired, SiteClock(1.0))
        self.codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
        self.encoder = TelemetryEncoder(self.codec, site, wire.Sequencer("sim"))
        self.rejected: list[wire.Rejection] = []

    def feed(self, plant: Plant) -> tuple[StateSnapshot, StateSnapshot]:
        """One telemetry round and the events since the last; both snapshots after it."""
        return self.feed_readings(plant.readings(), plant.drain_events())

    def feed_readings(self, readings: Readings, events: list[JobEvent]) -> tuple[StateSnapshot, StateSnapshot]:
        self.direct.update(readings)
        self.direct.apply_events(events)
        messages = self.encoder.readings(readings, START + readings.time_s)
        messages += [m for m in (self.encoder.job_event(ev, START) for ev in events) if m is not None]
        for out in messages:
            msg = self.codec.decode(out.topic, out.payload)
            if isinstance(msg, wire.Rejection):
                self.rejected.append(msg)
            else:
                self.ingest.handle(msg)
        self.ingest.flush()
        return self.direct.snapshot(), self.wired.snapshot()


def test_the_belief_from_the_wire_is_the_belief_from_the_readings() -> None:
    """Ten site minutes of the example site with jobs starting, checkpointing and ending, a card
    failing, cards put to sleep and woken, a job slowed, hosts powered off and on, a slowed pump and a
    new set-point: after every round, both beliefs agree."""
    site = example_site()
    jobs = [
        job("j0", 64, work_steps=200, checkpoint_interval_s=120.0, checkpoint_duration_s=20.0),
        job("j1", 128, work_steps=900),
        job("j2", 32, work_steps=400, checkpoint_interval_s=100.0, checkpoint_duration_s=15.0),
        job("j3", 96, work_steps=900),
        job("late", 64, work_steps=300, submit_s=250.0),
    ]
    plant = Plant(site, jobs, [CardFailure(card=70, at_s=150.0)], PlantConfig(seed=3))
    beliefs = _TwoBeliefs(site)
    slowest_pump = 1.0
    for t in range(600):
        if t == 60:  # idle cards of r6 and r7 to sleep, r7's last two hosts off, a job slowed
            asleep = plant.free_cards()[-80:-64]
            plant.enter_low_power(asleep)
            plant.power_off_hosts([62, 63])
            plant.set_levels(plant.job_cards("j1"), 4)
            plant.set_pump_speed([5], 0.6)
            plant.set_supply_temp(35.0)
        if t == 300:
            plant.power_on_hosts([62])
            plant.wake(asleep[:8])
        plant.step(1.0)
        direct, snap = beliefs.feed(plant)
        _same_belief(direct, snap)
        slowest_pump = min(slowest_pump, float(snap.rack_pump_speed_frac[5]))
    # what the ten minutes went through, as both beliefs have it
    records = {r.job_id: r.state for r in plant.job_records()}
    assert records["j0"] == "finished" and records["late"] in ("running", "finished")
    assert snap.card_failed[70] and snap.card_host_off[504:512].all() and not snap.card_host_off[496:504].any()
    assert snap.card_low_power.sum() >= 8 and (snap.card_level == 4).sum() >= 128
    assert slowest_pump == pytest.approx(0.6) and snap.facility is not None  # (back to full speed since)
    assert snap.facility.supply_setpoint_c == 35.0
    assert beliefs.rejected == []


def test_the_pump_speed_goes_on_the_wire_to_0_01_percent_and_full_speed_stays_full() -> None:
    """The CDU's pump speed resolves 0.01 % of nominal on the wire (docs/sim.md: the simulator rounds
    the fraction to 4 decimals), and the agent reads back that value: full speed exactly (the agent
    takes any speed under 1 for a slowed pump), a speed between two steps to the nearer one, and the
    edges (a speed that rounds to 0 reads 0), except the site's lowest speed, which reads 33.33 %: the
    belief takes it for the lowest, not a hair under it. Until this test only the tolerance of one
    lockstep test (tests/agent/test_lockstep_paths.py) noticed a change of this rounding."""
    site = example_site()
    plant = Plant(site, [], [], PlantConfig(seed=0))
    lowest = site.min_pump_speed_frac()  # 1/3 on the example site
    # rack -> (speed in force, pump_speed_percent on the wire): r0 stays at full speed
    cases = {0: (1.0, 100.0), 1: (lowest, 33.33), 2: (0.456789, 45.68), 3: (0.99996, 100.0), 4: (0.99994, 99.99)}
    cases |= {5: (0.6, 60.0), 6: (0.0, 0.0), 7: (0.00004, 0.0)}  # r6, r7: below the plant's range, set below
    for r in range(1, 6):
        plant.set_pump_speed([r], cases[r][0])
    plant.step(1.0)
    readings = plant.readings()
    racks = list(readings.racks)
    for r in (6, 7):
        loop = racks[r].loop
        assert loop is not None
        racks[r] = dataclasses.replace(racks[r], loop=dataclasses.replace(loop, pump_speed_frac=cases[r][0]))
    readings = dataclasses.replace(readings, racks=tuple(racks))
    beliefs = _TwoBeliefs(site)
    on_wire: dict[int, float] = {}
    decoded: dict[int, float | None] = {}
    for out in beliefs.encoder.readings(readings, START + readings.time_s):
        msg = beliefs.codec.decode(out.topic, out.payload)
        if isinstance(msg, wire.CduReading):
            r = site.rack_names.index(msg.rack)
            on_wire[r] = json.loads(out.payload)["pump_speed_percent"]
            decoded[r] = msg.pump_speed_frac
        assert not isinstance(msg, wire.Rejection), msg
        beliefs.ingest.handle(msg)
    beliefs.ingest.flush()
    assert sorted(on_wire) == list(range(site.n_racks))
    for r, (_speed, percent) in cases.items():
        assert on_wire[r] == pytest.approx(percent, rel=0.0, abs=1e-9), r
        assert decoded[r] == pytest.approx(percent / 100.0, rel=0.0, abs=1e-12), r
    assert (on_wire[0], decoded[0], on_wire[3], decoded[3]) == (100.0, 1.0, 100.0, 1.0)  # exactly full speed
    believed = beliefs.wired.snapshot().rack_pump_speed_frac
    assert believed[0] == 1.0 and believed[3] == 1.0
    assert believed[1] == lowest and believed[1] >= site.min_pump_speed_frac()
    assert believed[2:6] == pytest.approx([0.4568, 1.0, 0.9999, 0.6], rel=0.0, abs=1e-12)


def test_a_pump_speed_no_pump_runs_at_is_no_loop_reading_in_process_and_on_the_wire_alike() -> None:
    """A CDU reading whose pump speed is beyond full speed (the plant refuses more, the controller never
    plans more) or negative is rejected whole on the wire (0 .. 100 %). The belief fed in process
    (``racktwin evaluate``) took speeds up to 150 % for a pump's speed, and took the loop's temperatures
    and flow with any speed: now both beliefs refuse the reading and keep the one before."""
    site = example_site()
    plant = Plant(site, [], [], PlantConfig(seed=0))
    plant.step(1.0)
    beliefs = _TwoBeliefs(site)
    before, _ = beliefs.feed(plant)
    plant.step(1.0)
    readings = plant.readings()
    racks = list(readings.racks)
    for r, speed in ((2, 1.2), (3, 1.5), (4, -0.01)):
        loop = racks[r].loop
        assert loop is not None
        odd = dataclasses.replace(loop, supply_temp_c=loop.supply_temp_c + 3.0, pump_speed_frac=speed)
        racks[r] = dataclasses.replace(racks[r], loop=odd)
    direct, wired = beliefs.feed_readings(dataclasses.replace(readings, racks=tuple(racks)), [])
    _same_belief(direct, wired)
    assert sorted(rej.topic for rej in beliefs.rejected) == [
        f"racktwin/v1/site1/rack/{site.rack_names[r]}/cdu" for r in (2, 3, 4)
    ]
    for snap in (direct, wired):
        assert snap.rack_supply_temp_c[2:5] == pytest.approx(before.rack_supply_temp_c[2:5], abs=0.005)
        assert (snap.rack_pump_speed_frac[2:5] == 1.0).all() and snap.rack_pump_speed_reported is not None
        assert snap.rack_pump_speed_reported[2:5].all()  # (full speed, as the last reading said)
    assert beliefs.direct.rack_invalid_count[2:5].tolist() == [1, 1, 1]
    # full speed itself is a reading like any other
    assert direct.rack_supply_temp_c[5] == pytest.approx(loop_of(readings.racks[5]).supply_temp_c)


@pytest.mark.parametrize(
    "fault",
    [
        GarbageReadings(rack=2, start_s=60.0, end_s=120.0, mode="nan", fraction=0.5),
        GarbageReadings(rack=3, start_s=60.0, end_s=120.0, mode="garbage", fraction=0.1),
        StuckSensor(rack=1, start_s=60.0, end_s=160.0, card=70),
        StuckSensor(rack=1, start_s=60.0, end_s=160.0),
        SensorDropout(rack=4, start_s=60.0, end_s=100.0),
    ],
    ids=["nan", "garbage", "stuck-card", "stuck-rack", "dropout"],
)
def test_sensor_faults_reach_both_beliefs_alike(fault: Fault) -> None:
    site = example_site()
    jobs = [job("j1", 128, work_steps=900), job("j3", 96, work_steps=900), job("j4", 128, work_steps=900)]
    # card 130 (rack r2, where the NaN readings fall) fails first: a dead card read as missing
    plant = Plant(site, jobs, [CardFailure(card=130, at_s=10.0), fault], PlantConfig(seed=4))
    beliefs = _TwoBeliefs(site)
    for _t in range(200):
        plant.step(1.0)
        a, b = beliefs.feed(plant)
        _same_belief(a, b)
        assert np.allclose(a.card_last_seen_s + START, b.card_last_seen_s, rtol=0.0, atol=1e-6, equal_nan=True)
        assert np.allclose(a.rack_last_seen_s + START, b.rack_last_seen_s, rtol=0.0, atol=1e-6, equal_nan=True)
