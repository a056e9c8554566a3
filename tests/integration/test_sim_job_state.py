"""The simulator's retained job snapshot (``jobs/state``, docs/sim.md) through a real mosquitto: a client
that subscribes after the jobs started learns every queued and running job, with the running jobs'
cards and phase, from the broker's retained copy; each snapshot follows its step's events in the
events' ``seq`` order; a run without jobs replaces a snapshot an earlier run left retained."""

from __future__ import annotations

import asyncio

import pytest
from mqtt_helpers import WAIT_S
from sim_testing import SITE_ID, START_EPOCH_S, command_times, job, observer, running, scenario, small_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.integration

SITE = small_site()


async def test_a_late_subscriber_learns_the_running_and_queued_jobs_from_the_retained_snapshot(
    mosquitto: EmbeddedBroker,
) -> None:
    sc = scenario(
        jobs=[job("big", 16, running_at_start=True), job("queued", 8), job("late", 8, submit_time_s=5.0)],
        plant={"placement": "external", "external_timeout_s": 1e6},
        duration_s=600.0,
    )
    async with observer(mosquitto, SITE) as first, running(mosquitto, sc) as (sim, _):
        await first.wait_for(lambda m: isinstance(m, wire.JobEvent) and m.job_id == "late")
        await first.wait_for(lambda m: isinstance(m, wire.JobState) and any(e.job_id == "late" for e in m.jobs))
        async with observer(mosquitto, SITE) as late:  # connects now: the events are gone, the snapshot is not
            snap = await late.wait_for(lambda m: isinstance(m, wire.JobState), label="the retained snapshot")
            assert not late.of(wire.JobEvent) or all(e.job_id != "big" for e in late.of(wire.JobEvent))
            by_id = {e.job_id: e for e in snap.jobs}
            assert set(by_id) == {"big", "queued", "late"}
            big = by_id["big"]
            assert big.running and big.cards == {"r0": tuple(range(16))}  # the cards the plant gave it
            assert [int(c) for c in sim.plant.job_cards("big")] == list(range(16))
            assert big.phase is not None
            assert not by_id["queued"].running and not by_id["late"].running
            # the spec as the submitted event carried it (submit time on the site clock)
            submitted = next(
                m for m in first.of(wire.JobEvent) if m.job_id == "late" and m.event is wire.JobEventType.SUBMITTED
            )
            assert isinstance(submitted.job, JobSpec) and by_id["late"].job == submitted.job
            assert by_id["late"].job.submit_time_s == START_EPOCH_S + 5.0
            # numbered after every event it includes (the events' seq counter), at the time of the last
            events = first.of(wire.JobEvent)
            included = [e for e in events if e.ts_s <= snap.ts_s]
            assert snap.seq > max(e.seq for e in included)
            assert snap.ts_s == max(e.ts_s for e in included)
            # placing the queued job: a newer snapshot shows it running on the cards given
            ts, exp = command_times(first)
            cards = {"r1": (8, 9, 10, 11, 12, 13, 14, 15)}
            place = wire.SchedulerCommand("queued", cards, wire.new_command_id(), exp, ts, 0, "agent")
            await first.send(place)
            assert (await first.ack_of(place.command_id)).result is wire.AckResult.APPLIED
            started = await late.wait_for(
                lambda m: isinstance(m, wire.JobEvent) and m.job_id == "queued" and m.event is wire.JobEventType.STARTED
            )
            after = await late.wait_for(
                lambda m: isinstance(m, wire.JobState) and (m.ts_s, m.seq) > (started.ts_s, started.seq)
            )
            placed = {e.job_id: e for e in after.jobs}["queued"]
            assert placed.running and placed.cards == cards
    assert not [m for m in first.received if isinstance(m, wire.Rejection)]


async def test_a_run_without_jobs_replaces_the_snapshot_an_earlier_run_left_retained(
    mosquitto: EmbeddedBroker,
) -> None:
    codec = wire.Codec(wire.SiteLayout(SITE_ID, tuple(SITE.rack_names), SITE.cards_per_rack))
    old = wire.JobState(
        jobs=(
            wire.JobStateEntry(JobSpec("gone", 4, 100.0, 1.0, 0.9), cards={"r0": (0, 1, 2, 3)}, phase=Phase.COMPUTE),
        ),
        ts_s=START_EPOCH_S - 3600.0,
        seq=99,
        publisher="sim",
    )
    async with Bus(mosquitto.options(), name="earlier-run") as bus:
        await bus.wait_connected(WAIT_S)
        await bus.send(codec.outgoing(old))
    sc = scenario(duration_s=600.0)
    async with running(mosquitto, sc) as (sim, _):
        async with asyncio.timeout(WAIT_S):
            while sim.messages_published < 2:  # the snapshot, then telemetry: both went out
                await asyncio.sleep(0.01)
        async with observer(mosquitto, SITE) as late:
            # the retained copy comes with the subscription, a snapshot the simulator published before this
            # reading comes before it (one publisher's messages stay in order): every JobState is here now
            await late.wait_for(lambda m: isinstance(m, wire.FacilityReading))
            states = late.of(wire.JobState)
            assert len(states) == 1, states  # the broker's retained copy is the run's, not the earlier one
            assert states[0].jobs == () and states[0].ts_s == START_EPOCH_S
            assert sim.job_snapshots == 1
