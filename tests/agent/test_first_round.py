"""The wait before the agent's first decision (``agent.first_round.await_first_round``), on a real
site clock and belief: it ends at once when every rack has reported fresh readings, and not before
a period of site time when a rack's readings are older than the telemetry deadline; it lets the
ingest take in what the client already holds first."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from agent_helpers import example_site

from agent import wire
from agent.clock import SiteClock
from agent.first_round import await_first_round
from agent.ingest import Ingest
from twin.readings import JobEvent
from twin.state import TwinState
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.agent

T0 = 1_800_000_000.0
PERIOD_S = 10.0
DEADLINE_S = 30.0


def _belief_heard_at(ts: float) -> TwinState:
    """The example site's belief after every rack's cards, CDU and PDU reported at ``ts``."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    n = site.cards_per_rack
    for rack in site.rack_names:
        ing.handle(
            wire.CardBatch(
                rack=rack,
                card_index=np.arange(n),
                power_w=np.full(n, 300.0),
                temp_c=np.full(n, 50.0),
                sm_clock_mhz=np.full(n, 1870.0),
                utilization=np.full(n, 0.5),
                power_limit_w=np.full(n, 700.0),
                low_power=np.zeros(n, dtype=bool),
                ts_s=ts,
                seq=0,
                publisher="sim",
            )
        )
        ing.handle(wire.CduReading(rack, 30.0, 40.0, 128.0, 0.0, 100.0, ts, 0, "sim"))
        ing.handle(wire.PduReading(rack=rack, power_w=30_000.0, ts_s=ts, seq=0, publisher="sim"))
    ing.flush()
    return state


async def _first_round(state: TwinState, pending: Callable[[], int] = lambda: 0) -> float:
    clock = SiteClock(0.02)  # 50 site s per wall s: a period is 0.2 wall s
    clock.observe(T0)
    async with asyncio.timeout(5.0):
        return await await_first_round(
            T0,
            clock=clock,
            state=state,
            period_s=PERIOD_S,
            telemetry_deadline_s=DEADLINE_S,
            stop=asyncio.Event(),
            pending=pending,
        )


async def test_the_first_decision_is_made_at_once_when_every_rack_has_reported() -> None:
    assert await _first_round(_belief_heard_at(T0 - 1.0)) < T0 + PERIOD_S


async def test_readings_older_than_the_telemetry_deadline_do_not_end_the_wait() -> None:
    """Every rack reported, but 100 s ago (the deadline is 30 s): none is fresh, and the first
    decision waits its period for them (taken for fresh, the racks went unthrottled on old data)."""
    assert await _first_round(_belief_heard_at(T0 - 100.0)) >= T0 + PERIOD_S


async def test_the_first_decision_sees_the_job_event_that_came_with_the_telemetry() -> None:
    """Every rack has reported, and the client holds one more message the ingest has not taken in
    yet: a job's ``started``. The wait lets the ingest take it first (deciding at once, the first
    decision saw a job submitted and not yet started that in fact runs)."""
    state = _belief_heard_at(T0 - 1.0)
    spec = JobSpec(job_id="j1", n_cards=4, work_steps=100.0, step_time_s=1.0, compute_share=0.9)
    state.apply_events([JobEvent(T0 - 2.0, "j1", "submitted", Phase.WAITING, job=spec)])
    held = [JobEvent(T0 - 1.0, "j1", "started", Phase.WAITING, cards=(0, 1, 2, 3))]

    def take_in() -> None:
        state.apply_events(held)
        held.clear()

    asyncio.get_running_loop().call_later(0.05, take_in)  # the ingest task, a moment later
    await _first_round(state, pending=lambda: len(held))
    assert state.jobs["j1"].state == "running"
