"""Mutation audit of the service's ``estimate`` task (``agent.estimation_loop.EstimationLoop``): the
rhythm of its anomaly reports and calibration saves, what it counts as a failed round, and what a
calibration write that fails leaves behind (a real journal in ``tmp_path``; no broker: the task reads
a queue). The rounds are a small plant's telemetry, one a site second from t = 1 s."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_helpers import small_site

from agent.clock import SiteClock
from agent.controller import Controller
from agent.estimation_loop import ClockWentBack, EstimationLoop
from agent.journal import Journal
from agent.metrics import AgentMetrics
from twin.estimate import Anomaly
from twin.plant import Plant, PlantConfig
from twin.readings import Readings
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import JobSpec

pytestmark = pytest.mark.agent

EVERY_S = 5.0  # calibration_every_s of these tests (site seconds)


def _rounds(site: SiteSpec, n: int) -> Iterator[Readings]:
    jobs = [
        JobSpec("a", site.n_cards, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=300.0)
    ]
    plant = Plant(site, jobs, [], config=PlantConfig(seed=3))
    for _ in range(n):
        plant.step(1.0)
        yield plant.readings()


class _Task:
    """An EstimationLoop on a real journal, fed one round at a time."""

    def __init__(self, tmp_path: Path, clock: SiteClock | None = None, calibrated: bool = True) -> None:
        self.site = small_site()
        self.path = tmp_path / "journal.sqlite"
        self.journal = Journal(self.path)
        self.controller = Controller(self.site)
        self.cards = np.array([1, 5, 17], dtype=np.int64)
        self.r_th = np.array([0.051, 0.062, 0.055])
        self.leak = np.array([1.0, 1.25, 0.9])
        if calibrated:  # a restarted agent's calibration, from the journal: there is something to save
            self.controller.load_calibration(self.cards, self.r_th, self.leak)
        self.metrics = AgentMetrics(self.site.rack_names)
        self.queue: asyncio.Queue[Readings | ClockWentBack] = asyncio.Queue()
        self.state = TwinState(self.site)
        self.loop = EstimationLoop(
            self.site,
            rounds=self.queue,
            state=self.state,
            clock=clock or SiteClock(1.0),  # no message stamped it: the rounds' own times count
            controller=self.controller,
            journal=self.journal,
            metrics=self.metrics,
            calibration_every_s=EVERY_S,
        )
        self.task: asyncio.Task[None] | None = None

    async def feed(self, r: Readings) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self.loop.run())
        self.queue.put_nowait(r)
        for _ in range(5):
            await asyncio.sleep(0)
        assert self.queue.empty() and not self.task.done()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def saved_times(self) -> list[float]:
        with sqlite3.connect(self.path) as db:
            return sorted({float(t) for (t,) in db.execute("SELECT site_time_s FROM calibration")})


async def test_anomalies_are_reported_every_ten_site_seconds_from_the_first_round(tmp_path: Path) -> None:
    """The first round reports (t = 1 s), then every 10 site s: t = 1, 11, 21, 31 over 35 rounds."""
    t = _Task(tmp_path)
    reported: list[float] = []
    update = t.loop.anomaly_history.update

    def spy(found: Sequence[Anomaly], now_s: float) -> list[Anomaly]:
        reported.append(now_s)
        return update(found, now_s)

    t.loop.anomaly_history.update = spy  # type: ignore[method-assign]  # test double
    try:
        for r in _rounds(t.site, 35):
            await t.feed(r)
    finally:
        await t.stop()
    assert reported == [1.0, 11.0, 21.0, 31.0]
    assert t.loop.errors == 0


async def test_the_calibration_is_saved_every_interval_not_at_the_first_round(tmp_path: Path) -> None:
    """The first round (t = 1 s) starts the interval: nothing is saved then; saves follow at t = 6 and
    11 s (every 5 site s), each with every card's resistance and leakage scale as calibrated."""
    t = _Task(tmp_path)
    rounds = _rounds(t.site, 12)
    try:
        await t.feed(next(rounds))
        assert t.saved_times() == []
        for r in rounds:
            await t.feed(r)
    finally:
        await t.stop()
    assert t.saved_times() == [11.0]  # the save at 6 s was overwritten (one row per card) by the one at 11 s
    cards, r_th, leak = t.journal.load_calibration()
    t.journal.close()
    np.testing.assert_array_equal(cards, t.cards)
    np.testing.assert_allclose(r_th, t.r_th, rtol=1e-12)
    np.testing.assert_allclose(leak, t.leak, rtol=1e-12)


async def test_saves_are_stamped_with_the_site_clock_when_messages_set_it(tmp_path: Path) -> None:
    """The site clock (message timestamps) wins over the round's own stamp: with the clock at
    5000 s + the wall seconds since (time scale 1), the save after the first interval is stamped
    5000 + 5 s, not the round's 6 s; an anomaly is first flagged at the clock's 5000 s, not at 1 s."""
    wall = [0.0]
    clock = SiteClock(1.0, infer=False, wall=lambda: wall[0])
    clock.observe(5000.0)
    assert clock.now() == 5000.0
    t = _Task(tmp_path, clock=clock)
    weak = Anomaly("weak_pump", 1, None, 0.6, 0.8, "r1: weak pump")
    t.loop.estimator.anomalies = lambda: [weak]  # type: ignore[method-assign]  # test double
    try:
        for r in _rounds(t.site, 6):
            await t.feed(r)
            wall[0] += 1.0
    finally:
        await t.stop()
    assert t.saved_times() == [5005.0]
    assert t.loop.anomaly_history.first_s[("weak_pump", 1, None)] == 5000.0  # flagged at the clock's time too


async def test_two_fouled_plates_count_two_and_each_anomaly_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The metrics count the anomalies flagged per kind (two fouled plates: 2, one weak pump: 1), and
    the log says each once (when first flagged), as a warning, however many reports repeat it."""
    caplog.set_level(logging.WARNING, logger="racktwin.agent")
    t = _Task(tmp_path)
    flagged = [
        Anomaly("fouled_cold_plate", 0, 3, 1.8, 1.5, "card 3 of r0: cold plate fouled"),
        Anomaly("fouled_cold_plate", 1, 20, 2.0, 1.5, "card 20 of r1: cold plate fouled"),
        Anomaly("weak_pump", 1, None, 0.6, 0.8, "r1: weak pump"),
    ]
    t.loop.estimator.anomalies = lambda: list(flagged)  # type: ignore[method-assign]  # test double
    try:
        for r in _rounds(t.site, 25):  # reports at 1, 11, 21 s
            await t.feed(r)
    finally:
        await t.stop()
    value = t.metrics.registry.get_sample_value
    assert value("racktwin_anomalies", {"kind": "fouled_cold_plate"}) == 2.0
    assert value("racktwin_anomalies", {"kind": "weak_pump"}) == 1.0
    lines = [r for r in caplog.records if r.getMessage().startswith("anomaly: ")]
    assert sorted(r.getMessage() for r in lines) == sorted(f"anomaly: {a.detail}" for a in flagged)
    assert all(r.levelno == logging.WARNING for r in lines)


async def test_the_sensors_the_belief_found_stuck_are_no_observations(tmp_path: Path) -> None:
    """Every round, the cards and racks the belief (``TwinState``) finds stuck go to the estimator as
    frozen."""
    t = _Task(tmp_path)
    seen: list[dict[str, Any]] = []
    update = t.loop.estimator.update

    def spy(readings: Readings, **kwargs: Any) -> None:
        seen.append(kwargs)
        update(readings, **kwargs)

    t.loop.estimator.update = spy  # type: ignore[method-assign]  # test double
    t.state.stuck_cards = lambda: (5, 9)  # type: ignore[method-assign]  # test double
    t.state.stuck_racks = lambda: (1,)  # type: ignore[method-assign]  # test double
    try:
        for r in _rounds(t.site, 3):
            await t.feed(r)
    finally:
        await t.stop()
    assert len(seen) == 3
    assert all(list(kw["frozen_cards"]) == [5, 9] and list(kw["frozen_racks"]) == [1] for kw in seen)


async def test_a_round_failing_with_any_exception_is_counted_and_the_task_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not only a RuntimeError: a defect raising ValueError in the second round's update is counted
    (errors and the metric), logged with its traceback, and the later rounds are estimated."""
    caplog.set_level(logging.ERROR, logger="racktwin.agent")
    t = _Task(tmp_path)
    update = t.loop.estimator.update

    def defective(readings: Readings, **kwargs: Any) -> None:
        if readings.time_s == 2.0:
            raise ValueError("an injected defect")
        update(readings, **kwargs)

    t.loop.estimator.update = defective  # type: ignore[method-assign]  # test double
    try:
        for r in _rounds(t.site, 4):
            await t.feed(r)
    finally:
        await t.stop()
    assert t.loop.errors == 1
    assert t.metrics.registry.get_sample_value("racktwin_estimation_errors_total") == 1.0
    assert t.loop.estimator.time_s == 4.0
    (line,) = [r for r in caplog.records if "estimation of the telemetry round at 2.0" in r.getMessage()]
    assert line.exc_info is not None


async def test_a_calibration_write_that_fails_leaves_the_agent_not_ready_until_one_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal that cannot be written (closed under the task: a real ``JournalError``): the save's
    failure is kept as ``calibration_error`` (not ready) and logged at once, and it is no failed
    round; the next interval's save, to a journal that works again, clears it and says so once, with
    the number of failed writes. Saves that work say nothing."""
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    t = _Task(tmp_path)
    rounds = _rounds(t.site, 16)
    try:
        for _ in range(6):  # saves at 6 s (works)
            await t.feed(next(rounds))
        assert t.saved_times() == [6.0] and t.loop.calibration_error is None
        t.journal.close()
        for _ in range(5):  # the save at 11 s fails
            await t.feed(next(rounds))
        assert t.loop.calibration_error is not None and "closed" in t.loop.calibration_error
        assert t.loop.errors == 0
        failed = [r for r in caplog.records if r.getMessage().startswith("journal write failed: calibration")]
        assert len(failed) == 1 and failed[0].levelno == logging.ERROR
        t.loop.journal = t.journal = Journal(t.path)
        for r in rounds:  # the save at 16 s works
            await t.feed(r)
    finally:
        await t.stop()
    assert t.loop.calibration_error is None
    assert t.saved_times() == [16.0]
    again = [r for r in caplog.records if r.getMessage().startswith("journal written again")]
    assert [r.getMessage() for r in again] == ["journal written again: calibration saved (after 1 failed write(s))"]
    t.journal.close()


async def test_after_the_site_clock_steps_back_reports_and_saves_go_on_from_the_new_time(tmp_path: Path) -> None:
    """The site restarts its clock (a simulator restarted: rounds stamped 1..25 s, then 1..12 s again;
    ``agent.clock`` steps back too). The anomalies are reported at once and every 10 s of the new time
    (1, 11 s), and the calibration is saved every 5 s from it (6, 11 s): not only once the new time has
    passed the old one's (21 s), which froze the metrics and the journal for as long as the clock had run."""
    t = _Task(tmp_path)
    reported: list[float] = []
    update = t.loop.anomaly_history.update

    def spy(found: Sequence[Anomaly], now_s: float) -> list[Anomaly]:
        reported.append(now_s)
        return update(found, now_s)

    t.loop.anomaly_history.update = spy  # type: ignore[method-assign]  # test double
    try:
        for r in _rounds(t.site, 25):
            await t.feed(r)
        assert reported == [1.0, 11.0, 21.0] and t.saved_times() == [21.0]
        for r in _rounds(t.site, 12):
            await t.feed(r)
    finally:
        await t.stop()
    assert reported == [1.0, 11.0, 21.0, 1.0, 11.0]
    assert t.saved_times() == [11.0]
    assert t.loop.errors == 0
    t.journal.close()
