"""What the agent believes runs where (``agent.load.site_load``).

What users rely on: busy cards of no known job are budgeted as an unknown job (and so never put to
sleep or placed on), but a job's cards are free the moment its end event is in, even though the
readings of that second still show its utilization.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from agent_helpers import example_site, job

from agent.load import UNKNOWN_JOB_PREFIX, site_load
from twin.plant import Plant, PlantConfig
from twin.state import TwinState

pytestmark = pytest.mark.agent


@pytest.mark.parametrize("events_first", [False, True])
def test_a_finished_jobs_cards_are_free_at_once_and_unknown_work_is_still_seen(events_first: bool) -> None:
    site = example_site()
    plant = Plant(site, [job("short", 64, work_steps=20.0), job("long", 64)], [], PlantConfig(seed=1))
    state = TwinState(site, stuck_after_readings=20)
    finished_at = None
    for _ in range(120):
        plant.step(1.0)
        readings, events = plant.readings(), plant.drain_events()
        if events_first:  # over MQTT the end event may come before the telemetry of the same second
            state.apply_events(events)
            state.update(readings)
        else:
            state.update(readings)
            state.apply_events(events)
        if any(e.kind == "finished" and e.job_id == "short" for e in events):
            finished_at = plant.time_s
            break
    assert finished_at is not None, "the short job did not finish"
    snap = state.snapshot()
    freed = np.flatnonzero(snap.card_released_s > -1.0e9)
    assert freed.size == 64 and np.all(snap.card_job[freed] == -1)
    assert np.all(snap.card_utilization[freed] > 0.5)  # the last reading still shows the job's work
    load = site_load(site, snap)
    assert [j.job_id for j in load.jobs] == ["long"]
    assert np.all(load.idle[freed])
    assert np.all(snap.card_prev_seen_s[freed] < snap.card_released_s[freed] - 1e-9)
    # a card that still reads busy over a whole reading interval after its job left is work the agent
    # does not know of (a telemetry period of 10 s here: the rule does not assume one)
    released = snap.card_released_s
    later = dataclasses.replace(snap, card_prev_seen_s=released + 10.0, card_last_seen_s=released + 20.0)
    unknown = [j for j in site_load(site, later).jobs if j.origin == "unknown"]
    assert [j.job_id for j in unknown] == [f"{UNKNOWN_JOB_PREFIX}{site.rack_names[int(site.card_rack()[freed[0]])]}"]
    assert unknown[0].cards.tolist() == freed.tolist()
