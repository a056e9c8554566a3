"""After the site's clock steps back, the estimator and the calibration follow the new timeline.

The service (not connected: no broker) reads a small plant's telemetry through the simulator's
encoder, the wire and its ingest, on a site clock whose wall the test moves (one site second a wall
second); its ``estimate`` task runs for real on the queue the service fills. The site's clock then
steps back (a simulator restarted with an earlier epoch, a publisher's clock stepped): the site clock
and the belief follow it at once (``agent.clock``, ``TwinState.clock_went_back``). The estimator kept
its time (the newest stamp it took) until the new timeline passed the old one: a small step back
dropped every loop reading as late (a pump slowed just after it was not seen, and the cards' learnt
resistances read the slowed flow's as fouled plates), learning did not pause in a pump step, and the
calibration merged every report into the old time's (its two-minute hold lasted as long as the clock
had gone back). The service now tells the estimator of the step, in order with the rounds
(``agent.estimation_loop.ClockWentBack``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import small_site

from agent import wire
from agent.bus import MqttOptions
from agent.clock import SiteClock
from agent.config import AgentConfig, JournalConfig, LoadedConfig
from agent.estimation_loop import ClockWentBack
from agent.load import spec_r_total_k_per_w
from agent.service import AgentService
from sim.telemetry import TelemetryEncoder
from twin.faults import Fault
from twin.plant import ColdPlateFouling, Plant, PlantConfig
from twin.readings import Readings
from twin.workload import JobSpec, PhaseModel

pytestmark = pytest.mark.agent

SITE = small_site()  # 2 racks of 16 cards
T0 = 1_800_000_000.0  # the site's epoch on the first timeline


def _plant(faults: list[Fault] | None = None) -> Plant:
    """Every card busy with one long job, warm (600 s run before the agent hears it), pumps at full speed."""
    jobs = [JobSpec("a", SITE.n_cards, work_steps=1e7, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=1e6)]
    plant = Plant(SITE, jobs, faults or [], config=PlantConfig(seed=3, phases=PhaseModel(startup_s=10.0)))
    plant.run(600.0, 1.0)
    return plant


class _Site:
    """The service on a wall the test moves, fed the plant's telemetry stamped as the test says."""

    def __init__(self, tmp_path: Path) -> None:
        cfg = AgentConfig(
            site="(test)",
            mode="advisory",
            journal=JournalConfig(path=str(tmp_path / "journal.sqlite"), calibration_every_s=10.0),
        )
        self.wall = [0.0]
        clock = SiteClock(1.0, infer=False, wall=lambda: self.wall[0])
        loaded = LoadedConfig(config=cfg, site=SITE, source="(test)", overrides=())
        self.svc = AgentService(loaded, mqtt=MqttOptions(port=1), http=False, clock=clock)
        self.encoder = TelemetryEncoder(self.svc.codec, SITE, wire.Sequencer("sim"))
        self.task: asyncio.Task[None] | None = None

    async def send(self, plant: Plant, ts_s: float) -> None:
        """The plant steps a second and its round goes out stamped ``ts_s``; the ``estimate`` task takes
        what the service queued."""
        if self.task is None:
            self.task = asyncio.create_task(self.svc.estimation.run())
        plant.step(1.0)
        self.wall[0] += 1.0
        for out in self.encoder.readings(plant.readings(), ts_s):
            msg = self.svc.codec.decode(out.topic, out.payload)
            assert not isinstance(msg, wire.Rejection), msg
            self.svc.ingest.handle(msg)
        self.svc.ingest.flush()
        for _ in range(20):
            if self.svc._rounds.empty():
                break
            await asyncio.sleep(0)
        assert self.svc._rounds.empty() and not self.task.done()

    def silence(self, plant: Plant, seconds: int) -> None:
        """The site publishes nothing for ``seconds`` (its clock is being stepped)."""
        for _ in range(seconds):
            plant.step(1.0)
            self.wall[0] += 1.0

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.svc.control._executor.shutdown(wait=True)
        self.svc.journal.close()


async def test_a_pump_slowed_right_after_a_small_step_back_is_no_fouled_plate(tmp_path: Path) -> None:
    """Five minutes at full pump speed (every card's resistance learnt, none fouled); then the site's
    clocks step back 250 s and both racks' pumps are slowed to a third at once. The estimator took
    every loop reading of the new timeline for a late one (older than its last, by less than the
    gap after which a loop restarts) and dropped it: it never saw the slower flow, the cards' models
    restarted on the new timeline and read the higher resistance of a slowed plate (29% over the
    spec at full flow) as fouling: every card was flagged a fouled cold plate about 150 s after the
    step, for as long as the new timeline stayed behind the old one. Now the loops' readings are
    taken from the step on: no card is flagged, and the resistances are still the plant's."""
    s = _Site(tmp_path)
    plant = _plant()
    try:
        for k in range(300):
            await s.send(plant, T0 + k)
        assert np.all(s.svc.estimator.estimates().r_ratio_sd < 0.05)  # learnt
        s.silence(plant, 3)
        back_s = T0 + 300.0 - 250.0
        for k in range(240):
            if k % 10 == 0:  # (renewed well within the plant's hold)
                plant.set_pump_speed([0, 1], 0.34)
            await s.send(plant, back_s + k)
        assert s.svc.clock.timelines_left == 1
        flagged = sorted({kind for kind, _rack, _card in s.svc.anomaly_history.first_s})
        assert flagged == []
        est = s.svc.estimator.estimates()
        assert est.time_s == back_s + 238.0  # the new timeline's (its last round waits for a later one)
        true_ratio = plant._s_r  # the plant's true resistance scales (private; read on purpose)
        assert np.all(np.abs(est.r_ratio - true_ratio) < 0.06), np.abs(est.r_ratio - true_ratio).max()
        np.testing.assert_allclose(est.rack_flow_deficit, 0.0, atol=0.03)  # the slowed flow, as its speed says
    finally:
        await s.close()


async def test_after_a_simulator_restarted_760_s_back_the_calibration_hold_runs_on_the_new_timeline(
    tmp_path: Path,
) -> None:
    """Card 5's plate is fouled (twice its plate's resistance: 1.45 times the spec's die-to-inlet
    resistance) on the first timeline: the calibration the planner uses and the journal keeps learns
    it. The simulator restarts 760 s back with the plate clean. The estimator keeps what it learnt
    (card 5 stays at 1.45 while its model settles on the new timeline), then learns the clean plate
    (a minute of readings off by a third confirms the change); the calibration holds the larger
    value two minutes of the new timeline more (its hold: brought up to date every 10 s), then
    follows. It used to hold the fouled value until the new timeline passed the old one's last stamp
    and two minutes more (every report of the estimator, whose time stood at that stamp, was merged
    into the one of that time): card 5 was planned as fouled for as long as the clock had gone back."""
    s = _Site(tmp_path)
    r_spec = spec_r_total_k_per_w(SITE)[5]
    try:
        fouled = _plant([ColdPlateFouling(card=5, start_s=0.0, r_factor=2.0)])
        for k in range(300):
            await s.send(fouled, T0 + k)
        _cards, r_th, _leak = s.svc.controller.calibration()
        assert r_th[5] / r_spec > 1.4  # learnt (the plant's healthy card 5 is ~1.01 of the spec)
        s.silence(fouled, 3)
        clean = _plant()  # the restarted simulator's plant
        back_s = T0 + 300.0 - 760.0
        estimated, held = [], []  # card 5's resistance / the spec's, each second of the new timeline
        for k in range(450):
            await s.send(clean, back_s + k)
            estimated.append(float(s.svc.estimator.estimates().r_ratio[5]))
            _cards, r_th, _leak = s.svc.controller.calibration()
            held.append(float(r_th[5] / r_spec))
        assert s.svc.clock.timelines_left == 1
        assert min(held[:100]) > 1.4  # learnt, and kept while the model settles
        learnt_s = next(k for k, g in enumerate(estimated) if g < 1.2)  # the clean plate learnt
        true_ratio = float(clean._s_r[5])  # the plant's true resistance scale (private; read on purpose)
        assert held[-1] == pytest.approx(true_ratio, abs=0.03)  # 450 s on, well before the old time's 760 s
        followed_s = next(k for k, r in enumerate(held) if r < 1.2)
        assert 120 <= followed_s - learnt_s <= 120 + 10, (learnt_s, followed_s)
        assert s.svc.estimator.estimates().time_s == back_s + 448.0  # (its last round waits for a later one)
    finally:
        await s.close()


async def test_a_full_queue_drops_its_oldest_round_never_a_step_back(tmp_path: Path) -> None:
    """The estimator far behind (its queue full: 256 items), the oldest item makes room for the next
    round. A round is dropped (counted, and exported for the operator from 0 on:
    ``racktwin_estimation_rounds_dropped_total``); a step back of the clock at the head is applied at
    once instead (every round before it has been estimated), not lost: the estimator would keep the
    old timeline's time. Rounds keep their order."""
    s = _Site(tmp_path)
    try:
        svc = s.svc
        dropped = "racktwin_estimation_rounds_dropped_total"
        assert f"{dropped} 0.0" in svc.metrics.exposition().decode()
        svc.estimator.update(Readings(T0 + 100.0, racks=()))
        svc._to_estimator(ClockWentBack(T0))
        while not svc._rounds.full():
            svc._to_estimator(Readings(T0 + svc._rounds.qsize(), racks=()))
        svc._to_estimator(Readings(T0 + 500.0, racks=()))
        assert svc.estimator.estimates().time_s == T0 and svc.rounds_dropped == 0
        assert svc.metrics.registry.get_sample_value(dropped) == 0.0
        svc._to_estimator(Readings(T0 + 501.0, racks=()))
        assert svc.rounds_dropped == 1
        assert f"{dropped} 1.0" in svc.metrics.exposition().decode()
        items = [svc._rounds.get_nowait() for _ in range(svc._rounds.qsize())]
        times = [r.time_s - T0 for r in items if isinstance(r, Readings)]
        assert len(times) == len(items) and times == [*range(2, 256), 500.0, 501.0]
    finally:
        await s.close()
