"""The agent's catch-up with the scheduler's retained job snapshot (``jobs/state``), in process
(``agent.ingest.Ingest`` -> ``agent.job_catchup``): an agent that missed the events learns the queued
and running jobs (cards, phase), corrects running jobs' cards, drops jobs the scheduler no longer
lists; a snapshot older than the last event taken (a retained copy arriving late) changes nothing, and
neither does one that says what the events said. Example site: 8 racks of 64 cards (rack r1's card 0
is site card 64)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from agent_helpers import example_site

from agent import wire
from agent.clock import SiteClock
from agent.controller import decides_again_on
from agent.ingest import Ingest
from twin.readings import JobEvent
from twin.state import TwinState
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.agent

T0 = 1_800_000_000.0


def spec(job_id: str, n_cards: int) -> JobSpec:
    return JobSpec(job_id=job_id, n_cards=n_cards, work_steps=1000.0, step_time_s=1.0, compute_share=0.9)


def running(job_id: str, cards: dict[str, tuple[int, ...]], phase: Phase) -> wire.JobStateEntry:
    return wire.JobStateEntry(spec(job_id, sum(len(c) for c in cards.values())), cards=cards, phase=phase)


def queued(job_id: str, n_cards: int) -> wire.JobStateEntry:
    return wire.JobStateEntry(spec(job_id, n_cards))


def snapshot(ts_s: float, seq: int, *entries: wire.JobStateEntry) -> wire.JobState:
    return wire.JobState(jobs=entries, ts_s=ts_s, seq=seq, publisher="sim")


def event(kind: wire.JobEventType, job_id: str, ts_s: float, seq: int, **kw: object) -> wire.JobEvent:
    return wire.JobEvent(kind, job_id, ts_s, seq, "sim", **kw)  # type: ignore[arg-type]


class Agent:
    """An ingest on the example site, recording the job events it hands on (the service replans on them)."""

    def __init__(self) -> None:
        self.site = example_site()
        self.state = TwinState(self.site)
        self.handed: list[JobEvent] = []
        self.clock = SiteClock(1.0, infer=False)
        self.clock.observe(T0 + 30)  # the site's time known (telemetry came first), as a snapshot waits for it
        self.ingest = Ingest(self.site, self.state, self.clock, on_event=self.handed.append)

    def busy_cards(self) -> dict[str, tuple[int, ...]]:
        snap = self.state.snapshot()
        return {j.job_id: tuple(int(c) for c in np.flatnonzero(snap.card_job == k)) for k, j in enumerate(snap.jobs)}


def test_an_agent_that_missed_the_events_learns_the_running_and_queued_jobs_from_the_snapshot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The walk-through's case: jobs started before the agent listened. The snapshot gives it j1 on
    r1's cards 0-3 in a checkpoint (cards that read idle, yet busy) and j2 queued."""
    agent = Agent()
    with caplog.at_level(logging.INFO, logger="racktwin.agent.ingest"):
        agent.ingest.handle(
            snapshot(T0 + 30, 7, running("j1", {"r1": (0, 1, 2, 3)}, Phase.CHECKPOINT), queued("j2", 8))
        )
    jobs = agent.state.jobs
    assert set(jobs) == {"j1", "j2"}
    assert jobs["j1"].state == "running" and jobs["j1"].phase is Phase.CHECKPOINT
    assert jobs["j1"].cards == (64, 65, 66, 67)
    assert agent.busy_cards() == {"j1": (64, 65, 66, 67)}  # what the controller reads as busy
    assert jobs["j1"].spec == spec("j1", 4)  # priority, SLO, checkpoint plan: what placing and pricing read
    assert [j.job_id for j in agent.state.queue()] == ["j2"] and jobs["j2"].n_cards == 8
    assert {ev.kind for ev in agent.handed} >= {"submitted", "started"}  # the service decides again
    lines = [r.getMessage() for r in caplog.records if "job snapshot" in r.getMessage()]
    assert len(lines) == 1 and "2 added, 0 corrected, 0 dropped" in lines[0]


def test_the_snapshot_corrects_a_running_jobs_cards_and_phase_and_drops_jobs_it_does_not_list() -> None:
    agent = Agent()
    ing = agent.ingest
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 4)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0, 1, cards={"r1": (0, 1, 2, 3)}))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j2", T0, 2, job=spec("j2", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j2", T0, 3, cards={"r2": (0, 1)}))
    ing.handle(event(wire.JobEventType.SUBMITTED, "gone", T0, 4, job=spec("gone", 2)))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j3", T0, 5, job=spec("j3", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j3", T0, 6, cards={"r3": (0, 1)}))
    # events lost meanwhile: j1 restarted on r4's cards, j2 entered a checkpoint, "gone" ended,
    # j3 lost a card and waits in the queue again
    ing.handle(
        snapshot(
            T0,
            9,
            running("j1", {"r4": (4, 5, 6, 7)}, Phase.COMPUTE),
            running("j2", {"r2": (0, 1)}, Phase.CHECKPOINT),
            queued("j3", 2),
        )
    )
    jobs = agent.state.jobs
    assert set(jobs) == {"j1", "j2", "j3"}
    assert jobs["j1"].cards == (260, 261, 262, 263) and jobs["j1"].phase is Phase.COMPUTE
    assert jobs["j2"].phase is Phase.CHECKPOINT and jobs["j2"].cards == (128, 129)
    assert jobs["j3"].state == "queued" and jobs["j3"].cards == ()
    assert agent.busy_cards() == {"j1": (260, 261, 262, 263), "j2": (128, 129)}  # r1's and r3's cards free
    # "gone": its end was not seen (finished or cancelled, the agent cannot tell): dropped, not finished
    assert (agent.state.jobs_finished, agent.state.jobs_dropped) == (0, 1)
    assert ing.stats.job_snapshots_changed == 1


def test_a_job_the_snapshot_drops_is_counted_apart_from_the_finished_ones() -> None:
    """A job the agent held running that the scheduler no longer lists may have finished or been
    cancelled while the agent was not listening: the belief frees its cards and counts it dropped, not
    finished (a job whose ``finished`` event came is); the service still decides again on it (its cards
    are free for the queue)."""
    agent = Agent()
    ing = agent.ingest
    ing.handle(event(wire.JobEventType.SUBMITTED, "done", T0, 0, job=spec("done", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "done", T0, 1, cards={"r1": (0, 1)}))
    ing.handle(event(wire.JobEventType.SUBMITTED, "gone", T0, 2, job=spec("gone", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "gone", T0, 3, cards={"r2": (0, 1)}))
    ing.handle(event(wire.JobEventType.SUBMITTED, "waiting", T0, 4, job=spec("waiting", 4)))
    ing.handle(event(wire.JobEventType.FINISHED, "done", T0 + 5, 5))
    agent.handed.clear()
    ing.handle(snapshot(T0 + 10, 9))  # the scheduler lists no job any more
    assert agent.state.jobs == {} and agent.busy_cards() == {}
    assert agent.state.jobs_finished == 1  # "done" alone: its event said so
    assert agent.state.jobs_dropped == 2  # "gone" (running) and "waiting" (queued)
    assert {ev.job_id for ev in agent.handed if decides_again_on(ev)} == {"gone", "waiting"}


def test_a_snapshot_older_than_the_last_event_taken_is_ignored() -> None:
    """A retained copy that arrives after newer events (same ts and a lower seq, or an earlier ts):
    it would undo the events (restore a finished job, move a restarted one back)."""
    agent = Agent()
    ing = agent.ingest
    old = snapshot(T0, 2, running("j1", {"r1": (0, 1)}, Phase.COMPUTE))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0, 1, cards={"r1": (0, 1)}))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0 + 5, 3, cards={"r2": (0, 1)}))
    ing.handle(old)  # same ts as some events, older seq than the last
    assert agent.state.jobs["j1"].cards == (128, 129)
    ing.handle(event(wire.JobEventType.FINISHED, "j1", T0 + 9, 4))
    ing.handle(snapshot(T0 + 5, 8, running("j1", {"r2": (0, 1)}, Phase.COMPUTE)))  # earlier ts, higher seq
    assert agent.state.jobs == {}
    assert ing.stats.job_snapshots_old == 2 and ing.stats.job_snapshots == 0


def test_a_snapshot_that_says_what_the_events_said_changes_nothing() -> None:
    """The scheduler sends one after the events of every change: an agent that took every event gets no
    new event, no replan, no log line from it."""
    agent = Agent()
    ing = agent.ingest
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0, 1, cards={"r1": (0, 1)}))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j2", T0, 2, job=spec("j2", 8)))
    ing.handle(snapshot(T0, 3, running("j1", {"r1": (0, 1)}, Phase.WAITING), queued("j2", 8)))
    ing.handle(event(wire.JobEventType.PHASE_CHANGED, "j1", T0 + 1, 4, phase=Phase.COMPUTE))
    before = (agent.state.jobs, agent.state.queue(), list(agent.handed))
    ing.handle(snapshot(T0 + 1, 5, running("j1", {"r1": (1, 0)}, Phase.COMPUTE), queued("j2", 8)))
    assert (agent.state.jobs, agent.state.queue(), agent.handed) == before
    assert ing.stats.job_snapshots == 2 and ing.stats.job_snapshots_changed == 0


def test_events_after_a_snapshot_go_on_as_before() -> None:
    """The snapshot is the catch-up; the events stay the stream: a job learnt from the snapshot
    finishes by its event, and a copy of its start stamped before the snapshot is not taken."""
    agent = Agent()
    ing = agent.ingest
    ing.handle(snapshot(T0 + 10, 20, running("j1", {"r1": (0, 1)}, Phase.COMPUTE)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0 + 2, 5, cards={"r5": (0, 1)}))  # a late copy
    assert agent.state.jobs["j1"].cards == (64, 65)
    assert [agent.state.jobs["j1"].phase] == [Phase.COMPUTE]
    ing.handle(event(wire.JobEventType.PHASE_CHANGED, "j1", T0 + 12, 21, phase=Phase.CHECKPOINT))
    assert [agent.state.jobs["j1"].phase] == [Phase.CHECKPOINT]
    ing.handle(event(wire.JobEventType.FINISHED, "j1", T0 + 15, 22))
    assert agent.state.jobs == {} and agent.busy_cards() == {}


def _facility(ts_s: float) -> wire.FacilityReading:
    return wire.FacilityReading(
        ts_s=ts_s,
        seq=0,
        publisher="facility",
        ambient_temp_c=25.0,
        supply_temp_c=30.0,
        return_temp_c=38.0,
        cooling_power_w=1000.0,
        it_power_w=100_000.0,
        facility_power_w=104_000.0,
        supply_setpoint_c=30.0,
    )


def test_a_snapshot_that_comes_before_any_telemetry_waits_for_the_site_clock() -> None:
    """A retained snapshot is delivered at subscription, before any telemetry: it is taken once a
    reading makes the site's time known, not before, and its stamp never sets the clock."""
    site = example_site()
    state = TwinState(site)
    clock = SiteClock(1.0, infer=False)
    ingest = Ingest(site, state, clock)
    ingest.handle(snapshot(T0 + 30, 7, running("j1", {"r1": (0, 1, 2, 3)}, Phase.CHECKPOINT)))
    assert state.jobs == {} and clock.now() is None  # waiting; the snapshot's stamp did not start the clock
    ingest.handle(_facility(T0 + 31))
    assert set(state.jobs) == {"j1"} and ingest.stats.job_snapshots == 1


def test_a_retained_snapshot_from_an_earlier_run_stamped_ahead_of_the_site_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fault benchmark's case: a simulator restarted at t = 0 on the same broker, whose predecessor
    left its last snapshot retained 2,400 s later on the same epoch. Taken as the site's time it drove the
    agent's clock 2,192 s ahead (every command refused ``issued_ahead``) and its jobs hid the new run's.
    Now: ignored with a warning, the clock follows the telemetry, the new run's events are taken."""
    site = example_site()
    state = TwinState(site)
    clock = SiteClock(1.0, infer=False)
    ingest = Ingest(site, state, clock)
    with caplog.at_level(logging.WARNING, logger="racktwin.agent.ingest"):
        ingest.handle(snapshot(T0 + 2400, 900, running("old", {"r0": (0, 1, 2, 3)}, Phase.COMPUTE)))
        ingest.handle(_facility(T0 + 1))
    now = clock.now()
    assert now is not None and now < T0 + 2  # the clock is the telemetry's, not the snapshot's
    assert state.jobs == {} and ingest.stats.job_snapshots_ahead == 1 and ingest.stats.job_snapshots == 0
    assert any("2399 s ahead of the site clock" in r.getMessage() for r in caplog.records), caplog.records
    # the new run's own events are taken (a snapshot taken at T0 + 2400 would have made them "older")
    ingest.handle(event(wire.JobEventType.SUBMITTED, "new", T0 + 2, 1, job=spec("new", 4)))
    ingest.handle(event(wire.JobEventType.STARTED, "new", T0 + 3, 2, cards={"r2": (0, 1, 2, 3)}))
    assert set(state.jobs) == {"new"}
    # 10 s ahead or less (the clock's own tolerance at 1x) is the same timeline: taken
    ingest.handle(snapshot(T0 + 12, 3, running("new", {"r2": (0, 1, 2, 3)}, Phase.COMPUTE)))
    assert ingest.stats.job_snapshots == 1 and ingest.stats.job_snapshots_ahead == 1


class _Wall:
    """A wall clock the test moves (the site clock extrapolates on it)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_job_event_stamped_far_ahead_does_not_make_later_snapshots_old() -> None:
    """One bad stamp an hour ahead on a job event: the clock ignores the stamp and the event is dated at
    the site's now (``Ingest._dated``). Its stamp used to become the newest job message seen, so every
    snapshot of the next hour read as older than it and the catch-up was blocked for that hour. Now the
    event counts at the date it was given: a later snapshot is taken, and one made before the event
    (stamped before that date) is still old (taken, it would drop the job the event submitted)."""
    site = example_site()
    state = TwinState(site)
    wall = _Wall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    ing = Ingest(site, state, clock)
    ing.handle(_facility(T0))
    wall.t += 5.0
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0 + 3600.0, 4, job=spec("j1", 2)))
    assert ing.stats.ahead == 1 and set(state.jobs) == {"j1"}
    ing.handle(snapshot(T0 + 4.0, 3))  # made before the event: it does not list j1 yet
    assert ing.stats.job_snapshots_old == 1 and set(state.jobs) == {"j1"}
    wall.t += 1.0
    ing.handle(_facility(T0 + 6.0))
    ing.handle(snapshot(T0 + 6.0, 5, running("j1", {"r1": (0, 1)}, Phase.COMPUTE)))  # the event's start was lost
    assert ing.stats.job_snapshots == 1 and ing.stats.job_snapshots_old == 1
    assert state.jobs["j1"].state == "running" and state.jobs["j1"].cards == (64, 65)
