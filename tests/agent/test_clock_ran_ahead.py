"""The site clock's two kinds of step back, and what each one resets in the agent.

The clock steps back when a message comes stamped more than its tolerance (1 s at rate 1) behind what
it extrapolated. Either the site's clock itself went back (a simulator restarted, a clock reset,
confirmed by a run of messages stamped behind the newest stamp seen: ``SiteClock.timelines_left``),
or the clock only ran ahead of the site: a silence in which the site ran slower, or a stall of the
agent's own event loop, after which :meth:`SiteClock.now` was read (extrapolating) before the messages
queued meanwhile were handled. Such a message is newer than every stamp seen
(``SiteClock.extrapolation_corrections``): what was dated at the clock's now comes back with it, but
what is keyed on the stamps seen stays. Every consumer of the clock's step backs used to take the
second kind for the first: the first decision's wait started its period again, a retained job
snapshot older than the job events taken was taken again, an applied state refused as older than
the one taken was taken after all, the dates of job events stamped far ahead were forgotten (a copy
of a ``started`` read as the job's restart), and the round the estimator's merger held went out half.
On fake walls the tests move; the service, ingest, belief, merger and estimator are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_clock_ingest import T0, FakeWall, _rack_applied, cards_msg
from test_estimation_after_clock_step_back import _plant, _Site
from test_first_round import DEADLINE_S, PERIOD_S, _belief_heard_at
from test_job_catchup import event, snapshot, spec

from agent import wire
from agent.clock import SiteClock
from agent.estimation_loop import ClockWentBack
from agent.first_round import await_first_round
from agent.ingest import Ingest
from twin.readings import JobEvent, Readings
from twin.state import TwinState
from twin.workload import Phase

pytestmark = pytest.mark.agent

TOP_MHZ = 1980.0  # the example site's level 0


def _stalled(clock: SiteClock, wall: FakeWall, stall_s: float = 3.0) -> float:
    """The agent's loop stalls ``stall_s`` wall seconds and reads the site clock after it (extrapolating)."""
    wall.t += stall_s
    now = clock.now()
    assert now is not None
    return now


def test_the_clock_counts_a_step_back_after_running_ahead_apart_from_a_new_timeline() -> None:
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    clock.observe(T0)
    wall.t += 1.5
    assert clock.now() == pytest.approx(T0 + 1.5)
    assert clock.observe(T0 + 0.2)  # queued behind the stall: newer than every stamp seen
    assert clock.now() == pytest.approx(T0 + 0.2)
    assert (clock.extrapolation_corrections, clock.timelines_left, clock.corrections) == (1, 0, 1)
    wall.t += 2.0  # the site restarts 600 s back
    for i in range(4):
        clock.observe(T0 - 600.0 + i)
        wall.t += 0.25
    assert (clock.extrapolation_corrections, clock.timelines_left, clock.corrections) == (1, 1, 2)


class _SteppingWall(FakeWall):
    """A wall that, once ``run_to`` is set, moves 0.5 s at each read up to ``run_to``, where a waiter's
    reads are counted: after ``give_up_reads`` of them ``stop`` is set."""

    def __init__(self, stop: asyncio.Event, give_up_reads: int = 20) -> None:
        super().__init__()
        self.stop = stop
        self.give_up_reads = give_up_reads
        self.run_to: float | None = None
        self.reads_at_end = 0

    def __call__(self) -> float:
        if self.run_to is not None:
            if self.t < self.run_to:
                self.t = min(self.t + 0.5, self.run_to)
            else:
                self.reads_at_end += 1
                if self.reads_at_end >= self.give_up_reads:
                    self.stop.set()
        return super().__call__()


async def _first_round_after(step: str) -> tuple[float, bool, int]:
    """The first decision's wait (every rack's readings older than the deadline on either timeline: it
    waits its period)
    on a clock that steps back as ``step`` says 3 site s after the first message; the wall then runs
    to 10.5 site s after the first message's stamp and on: returns the site time the wait ended at,
    whether it ended on its period (it let the ingest take in the client's messages first, not ended
    by ``stop``), and the clock's step backs."""
    stop = asyncio.Event()
    wall = _SteppingWall(stop)
    clock = SiteClock(1.0, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    clock.observe(T0)
    drained: list[int] = []

    def pending() -> int:  # the wait drains the client's messages only once its period ended
        drained.append(1)
        return 0

    task = asyncio.create_task(
        await_first_round(
            T0,
            clock=clock,
            state=_belief_heard_at(T0 - 700.0),  # stale on either timeline
            period_s=PERIOD_S,
            telemetry_deadline_s=DEADLINE_S,
            stop=stop,
            pending=pending,
        )
    )
    await asyncio.sleep(0)  # the wait has begun
    if step == "stall":
        _stalled(clock, wall)  # now T0 + 3
        clock.observe(T0 + 1.0)  # the messages queued behind the stall
        run_to = wall.t + 9.5  # the site's T0 + 10.5: past the period
    else:  # the site's clock went back 600 s (a simulator restarted): a run of messages behind
        wall.t += 2.0
        for i in range(4):
            clock.observe(T0 - 600.0 + i)
            wall.t += 0.25
        run_to = wall.t + 9.5  # T0 - 597 + 9.5: within a period of the new timeline
    wall.run_to = run_to
    async with asyncio.timeout(30.0):  # (a hang guard only: the wall's reads end the wait)
        ended_s = await task
    return ended_s, bool(drained) and not stop.is_set(), clock.corrections


async def test_a_stall_of_the_agents_loop_as_it_starts_does_not_restart_the_first_decisions_period() -> None:
    """The agent's loop stalls 3 s just after the first message, the site clock is read after it (T0 + 3),
    then the messages queued behind the stall come, stamped T0 + 1: the clock steps back to them. The site's
    time went on; the period the first decision waits (10 s from T0) ends at T0 + 10. It used to start again
    from the step back (T0 + 11), as if the site had gone to another timeline: a site with a rack not heard
    from got its first decision that much later (up to a period, for a longer stall or silence)."""
    ended_s, on_period, corrections = await _first_round_after("stall")
    assert corrections == 1
    assert on_period and T0 + PERIOD_S <= ended_s < T0 + PERIOD_S + 1.0


async def test_a_new_timeline_still_restarts_the_first_decisions_period() -> None:
    """The site's clock went back 600 s (a simulator restarted) during the wait: the period counts on the
    new timeline (from its first message), and the wall runs only 9.5 s into it: the wait has not ended."""
    ended_s, on_period, corrections = await _first_round_after("restart")
    assert corrections == 1
    assert not on_period and ended_s < T0 - 580.0  # (stopped on the new timeline)


def _ingest(wall: FakeWall) -> tuple[TwinState, Ingest, list[JobEvent]]:
    from agent_helpers import example_site

    site = example_site()
    state = TwinState(site)
    handed: list[JobEvent] = []
    clock = SiteClock(1.0, infer=False, wall=wall)
    return state, Ingest(site, state, clock, on_event=handed.append), handed


def test_a_retained_job_snapshot_older_than_the_events_taken_stays_old_after_a_stall() -> None:
    """The scheduler's retained snapshot (seq 3) lists no job; j1 was submitted (seq 4) and started (seq 5)
    since. After a stall of the agent's loop the clock steps back to the queued telemetry, then the broker
    hands the retained snapshot over again (a new subscription). It is older than the events taken, as
    before the stall: ignored. It used to be taken (the step back forgot the newest job stamp seen, as if
    the site had gone to another timeline): j1 was dropped from the agent's belief, its busy cards free
    for placements and sleep."""
    wall = FakeWall()
    state, ing, _handed = _ingest(wall)
    ing.handle(cards_msg("r0", T0))
    retained = snapshot(T0 + 2.0, 3)
    ing.handle(retained)
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0 + 3.0, 4, job=spec("j1", 4)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0 + 4.0, 5, cards={"r1": (0, 1, 2, 3)}))
    ing.handle(cards_msg("r0", T0 + 5.0))
    assert state.jobs["j1"].state == "running"
    _stalled(ing.clock, wall)  # T0 + 8
    ing.handle(cards_msg("r1", T0 + 6.0))  # queued behind the stall
    assert ing.clock.extrapolation_corrections == 1
    ing.handle(retained)
    assert state.jobs["j1"].state == "running" and state.jobs_dropped == 0
    assert ing.stats.job_snapshots_old == 1


def test_an_older_applied_state_refused_stays_refused_after_a_stall() -> None:
    """Rack r0 confirmed its cards at the top level in an applied state stamped T0 + 1 (after its last
    reading, T0); a second publisher's older one (T0 + 0.5, level 5) is refused once the clock has passed
    T0 + 1. After a stall (the clock read at T0 + 3) the reading queued behind it, stamped T0 + 0.2, steps
    the clock back to T0 + 0.2. The site's clock did not go back: the refused one stays refused (it used
    to be tried again at the step back, and as the one taken was then stamped after the clock's now, it
    set the cards back to level 5: the next reading counted 64 cards reset behind the agent's back)."""
    wall = FakeWall()
    _state, ing, _handed = _ingest(wall)
    top = np.full(64, TOP_MHZ)
    ing.handle(cards_msg("r0", T0, sm_clock_mhz=top))
    ing.handle(_rack_applied("r0", T0 + 1.0, 0))
    wall.t += 2.0
    older = dataclasses.replace(_rack_applied("r0", T0 + 0.5, 5), publisher="bridge-r0")
    ing.handle(older)
    assert np.all(ing.applied_level[:64] == 0) and ing.stats.applied_states_old == {"r0": 1}
    _stalled(ing.clock, wall, 1.0)  # T0 + 3
    ing.handle(cards_msg("r0", T0 + 0.2, sm_clock_mhz=top))
    assert ing.clock.extrapolation_corrections == 1
    assert np.all(ing.applied_level[:64] == 0) and ing.stats.applied_states_old == {"r0": 1}


def test_a_copy_of_a_start_stamped_far_ahead_is_still_a_copy_after_a_stall() -> None:
    """j1's ``started`` and then its checkpoint come stamped an hour ahead of the site clock (a scheduler
    whose clock runs ahead): dated at the site's now, in their stamps' order. After a stall (the clock read
    3 s on) the telemetry queued behind it steps the clock back; the belief's job dates come back with it,
    and so do the ingest's dates of those stamps. A copy of the ``started`` (at-least-once delivery) a
    second later is dated before the checkpoint, as before the stall: an old copy, ignored. The step back
    used to forget the dates: the copy, dated at the clock's now, read as j1 started again, and its
    checkpoint was lost (its phase back to the start's)."""
    wall = FakeWall()
    state, ing, _handed = _ingest(wall)
    ahead = T0 + 3600.0
    cards = {"r1": (0, 1, 2, 3)}
    ing.handle(cards_msg("r0", T0))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 4)))
    started = event(wire.JobEventType.STARTED, "j1", ahead + 1.0, 1, cards=cards)
    ing.handle(started)
    wall.t += 0.5
    ing.handle(event(wire.JobEventType.PHASE_CHANGED, "j1", ahead + 5.0, 2, phase=Phase.CHECKPOINT))
    assert state.jobs["j1"].phase == Phase.CHECKPOINT
    _stalled(ing.clock, wall)  # T0 + 3.5
    ing.handle(cards_msg("r0", T0 + 1.0))  # queued behind the stall
    assert ing.clock.extrapolation_corrections == 1
    wall.t += 1.0
    ing.handle(started)
    assert state.jobs["j1"].state == "running" and state.jobs["j1"].phase == Phase.CHECKPOINT


async def test_a_stall_between_two_racks_of_a_round_gives_the_estimator_the_round_whole(tmp_path: Path) -> None:
    """The service (not connected) takes a minute of a small plant's telemetry (2 racks), then in the next
    round rack r0's messages come and are flushed (the client had nothing more waiting), the agent's loop
    stalls 3 s with the site clock read after it, and rack r1's messages of the same round, stamped 50 ms
    later, come behind the stall: the clock steps back to them. The site's time did not go back: the
    estimator gets the round whole, one round of both racks, and no step back of its time. It used to get
    a ``ClockWentBack`` (which changed nothing: every stamp it took was behind the new now) and the round
    the merger held, r0's half, at once: two rounds where there was one (the estimator costs the same for
    one rack as for all)."""
    s = _Site(tmp_path)
    plant = _plant()
    got: list[Readings | ClockWentBack] = []
    to_estimator = s.svc._to_estimator

    def record(item: Readings | ClockWentBack) -> None:
        got.append(item)
        to_estimator(item)

    s.svc._to_estimator = record  # type: ignore[method-assign]  # (records, then the service's own)
    try:
        for k in range(60):
            await s.send(plant, T0 + k)
        plant.step(1.0)
        s.wall[0] += 1.0
        outs = s.encoder.readings(plant.readings(), T0 + 60.0) + s.encoder.readings(plant.readings(), T0 + 60.05)
        msgs = []
        for o in outs:
            msg = s.svc.codec.decode(o.topic, o.payload)
            assert not isinstance(msg, wire.Rejection), msg
            msgs.append(msg)
        first = [m for m in msgs[: len(msgs) // 2] if getattr(m, "rack", "r0") == "r0"]
        second = [m for m in msgs[len(msgs) // 2 :] if getattr(m, "rack", "r0") == "r1"]
        for m in first:
            s.svc.ingest.handle(m)
        s.svc.ingest.flush()
        s.wall[0] += 3.0
        assert s.svc.clock.now() == pytest.approx(T0 + 63.0)
        for m in second:
            s.svc.ingest.handle(m)
        s.svc.ingest.flush()
        assert s.svc.clock.extrapolation_corrections == 1 and s.svc.clock.timelines_left == 0
        await s.send(plant, T0 + 61.0)  # the next round: the one held goes out
        assert not any(isinstance(item, ClockWentBack) for item in got)
        rounds = [item for item in got if isinstance(item, Readings) and T0 + 60.0 <= item.time_s < T0 + 61.0]
        assert len(rounds) == 1 and sorted(rr.rack for rr in rounds[0].racks) == [0, 1]
        assert s.svc.estimator.estimates().time_s == pytest.approx(T0 + 60.05)
    finally:
        await s.close()
