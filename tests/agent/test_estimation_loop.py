"""The service's ``estimate`` task (``agent.estimation_loop.EstimationLoop``) on a plant's telemetry
rounds: what it flags reaches the log (once per flag), the metrics and the history the demo prints, and
the calibration goes to the journal every ``journal.calibration_every_s``, not every round."""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
from pathlib import Path

import pytest
from agent_helpers import small_site

from agent.clock import SiteClock
from agent.controller import Controller
from agent.estimation_loop import ClockWentBack, EstimationLoop
from agent.journal import Journal
from agent.metrics import AgentMetrics
from twin.faults import Fault
from twin.plant import ColdPlateFouling, Plant, PlantConfig, PumpDegradation
from twin.readings import Readings
from twin.state import TwinState
from twin.workload import JobSpec, PhaseModel

pytestmark = pytest.mark.agent

CALIBRATION_EVERY_S = 300.0


async def _drained(rounds: asyncio.Queue[Readings | ClockWentBack]) -> None:
    """Turns of the event loop until the ``estimate`` task has taken every item waiting (one a turn)."""
    for _ in range(4 * rounds.qsize() + 4):
        if rounds.empty():
            return
        await asyncio.sleep(0)
    assert rounds.empty(), f"{rounds.qsize()} items still waiting: the estimate task stopped taking them"


async def test_the_estimate_task_reports_a_fouled_plate_and_a_weak_pump_and_saves_the_calibration_on_its_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="racktwin.agent")
    site = small_site()
    half = site.n_cards // 2
    jobs = [
        JobSpec("a", half, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=300.0),
        JobSpec("b", half, work_steps=1e6, step_time_s=2.0, compute_share=0.7, checkpoint_interval_s=450.0),
    ]
    faults: list[Fault] = [
        ColdPlateFouling(card=5, start_s=600.0, r_factor=2.0),
        PumpDegradation(rack=1, start_s=600.0, flow_fraction=0.6),
    ]
    phases = PhaseModel(startup_s=10.0, comm_stalls_per_hour=6.0, input_stalls_per_hour=3.0)
    plant = Plant(site, jobs, faults, config=PlantConfig(seed=11, phases=phases))
    rounds: asyncio.Queue[Readings | ClockWentBack] = asyncio.Queue()
    metrics = AgentMetrics(site.rack_names)
    controller = Controller(site)
    journal = Journal(tmp_path / "journal.sqlite")
    loop = EstimationLoop(
        site,
        rounds=rounds,
        state=TwinState(site),
        clock=SiteClock(1.0),  # no message stamped it: the rounds' own times count
        controller=controller,
        journal=journal,
        metrics=metrics,
        calibration_every_s=CALIBRATION_EVERY_S,
    )
    task = asyncio.create_task(loop.run())
    try:
        while plant.time_s < 2390.0:
            plant.step(1.0)
            rounds.put_nowait(plant.readings())
            if rounds.qsize() >= 100:
                await _drained(rounds)
        last_s = plant.time_s
        await _drained(rounds)
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert loop.errors == 0

    flagged = [("fouled_cold_plate", "r0", 5), ("weak_pump", "r1", None)]
    logged = [r for r in caplog.records if r.getMessage().startswith("anomaly: ")]
    where = [(f["kind"], f["rack"], f["card"]) for f in (r.__dict__["fields"] for r in logged)]
    assert sorted(where, key=str) == flagged, [r.getMessage() for r in logged]  # each once, not every report
    for kind in ("fouled_cold_plate", "weak_pump"):
        assert metrics.registry.get_sample_value("racktwin_anomalies", {"kind": kind}) == 1.0
    assert len(loop.anomaly_history.describe(site.rack_names)) == 2

    cards, r_th, _leak = controller.calibration()  # as of the last save (it is brought up to date there)
    assert cards.size > 0
    saved = dict(zip(*journal.load_calibration()[:2], strict=True))
    journal.close()
    assert {c: saved[c] for c in cards.tolist()} == dict(zip(cards.tolist(), r_th.tolist(), strict=True))
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:
        (last_save_s,) = db.execute("SELECT MAX(site_time_s) FROM calibration").fetchone()
    # the first round (t = 1 s) starts the interval; the saves follow every interval, not every round
    assert last_save_s == 1.0 + CALIBRATION_EVERY_S * ((last_s - 1.0) // CALIBRATION_EVERY_S) < last_s


async def test_a_backlog_of_rounds_leaves_the_other_tasks_a_turn_after_each_round(tmp_path: Path) -> None:
    """The estimator behind (rounds waiting in its queue, a step back of the site clock among them): the
    other tasks (control, ingest, publish, health) get a turn after every item, not once the backlog is
    gone (asyncio.Queue.get suspends nothing while items wait: 256 rounds at ~10 ms each held the event
    loop for seconds at 8,192 cards). Whenever another task runs, every item the estimate task took has
    been handled, in order (the service's ``_to_estimator`` applies a step back at the head of a full
    queue at once on that ground)."""
    site = small_site()
    jobs = [JobSpec("a", site.n_cards, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=1e6)]
    plant = Plant(site, jobs, [], config=PlantConfig(seed=3))
    items: list[Readings | ClockWentBack] = []
    for k in range(16):
        if k == 8:
            items.append(ClockWentBack(2.5))  # the estimator's time comes back to 2.5 s, then goes on with round 9
        plant.step(1.0)
        items.append(plant.readings())
    estimated_s: list[float] = []  # the estimator's time once each item is handled
    for item in items:
        last_s = estimated_s[-1] if estimated_s else -math.inf
        estimated_s.append(min(last_s, item.now_s) if isinstance(item, ClockWentBack) else max(last_s, item.time_s))
    rounds: asyncio.Queue[Readings | ClockWentBack] = asyncio.Queue()
    for item in items:
        rounds.put_nowait(item)
    journal = Journal(tmp_path / "journal.sqlite")
    loop = EstimationLoop(
        site,
        rounds=rounds,
        state=TwinState(site),
        clock=SiteClock(1.0),
        controller=Controller(site),
        journal=journal,
        metrics=AgentMetrics(site.rack_names),
        calibration_every_s=CALIBRATION_EVERY_S,
    )
    task = asyncio.create_task(loop.run())
    seen: list[tuple[int, float]] = []  # (items taken, the estimator's time) each time the other task ran

    async def another_task() -> None:
        while True:
            await asyncio.sleep(0)
            taken = len(items) - rounds.qsize()
            seen.append((taken, loop.estimator.estimates().time_s))
            if taken == len(items):
                return

    try:
        await asyncio.wait_for(another_task(), timeout=60.0)  # (a hang guard, not a timing)
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        journal.close()
    assert loop.errors == 0
    assert {taken for taken, _ in seen} >= set(range(1, len(items) + 1)), seen  # a turn after each item
    for taken, time_s in seen:
        if taken:
            assert time_s == estimated_s[taken - 1], (taken, seen)  # every item taken was handled, in order
