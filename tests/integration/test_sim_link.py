"""The simulator's MQTT link against a real mosquitto on a random loopback port: job events kept
through a broker disconnect go out once each, in order; disconnect windows that touch are one
outage, and one shorter than a step still happens; a restarted simulator does not apply what the
broker queued for the run before it; a connection lost during the run is counted in the summary."""

from __future__ import annotations

import asyncio

import pytest
from mqtt_helpers import WAIT_S
from sim_testing import SITE_ID, START_EPOCH_S, job, observer, running, scenario, small_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from sim.runner import SimOptions, Simulator

pytestmark = pytest.mark.integration

SITE = small_site()


async def test_job_events_of_a_disconnect_go_out_once_each_in_order(mosquitto: EmbeddedBroker) -> None:
    """Many job events kept while offline, and more coming in while they are flushed after the
    reconnect: both the step loop and the reconnect flush the backlog, one at a time, so every event
    reaches the broker once and in order, and the run ends normally."""
    stalls = {
        "comm_stalls_per_hour": 1800.0,
        "input_stalls_per_hour": 1800.0,
        "comm_stall_median_s": 1.0,
        "input_stall_median_s": 1.0,
    }
    sc = scenario(
        jobs=[job(f"j{i}", 2, running_at_start=True) for i in range(16)],
        phases=stalls,
        plant={"placement": "builtin"},
        faults=[{"kind": "broker_disconnect", "start_s": 5.0, "duration_s": 40.0}],
        duration_s=80.0,
    )
    async with observer(mosquitto, SITE) as obs:
        sim = Simulator(
            SimOptions(scenario=sc, mqtt=mosquitto.options(), site_id=SITE_ID, speed=0.0, start_epoch_s=START_EPOCH_S)
        )
        async with asyncio.timeout(WAIT_S):
            summary = await sim.run()
        assert summary.stopped_by == "duration" and summary.disconnects == 1
        n = summary.job_events_published
        assert n > 200  # a long backlog, and events on almost every step after it
        # the job snapshots (jobs/state) share the events' seq counter: together they number 0, 1, 2, ...
        total = n + sim.job_snapshots
        await obs.wait_for(
            lambda m: isinstance(m, wire.JobEvent | wire.JobState) and m.seq == total - 1, label="the last one"
        )
    seqs = [e.seq for e in obs.received if isinstance(e, wire.JobEvent | wire.JobState)]
    assert seqs == list(range(total))
    assert len(obs.of(wire.JobEvent)) == n


async def test_disconnect_windows_that_touch_are_one_outage(mosquitto: EmbeddedBroker) -> None:
    """Two broker disconnects back to back (the second starts when the first ends): the link stays
    down over both, no telemetry of 2 <= t < 6 goes out."""
    sc = scenario(
        faults=[
            {"kind": "broker_disconnect", "start_s": 2.0, "duration_s": 2.0},
            {"kind": "broker_disconnect", "start_s": 4.0, "duration_s": 2.0},
        ],
        duration_s=8.0,
    )
    async with observer(mosquitto, SITE) as obs:
        sim = Simulator(
            SimOptions(scenario=sc, mqtt=mosquitto.options(), site_id=SITE_ID, speed=0.0, start_epoch_s=START_EPOCH_S)
        )
        async with asyncio.timeout(WAIT_S):
            summary = await sim.run()
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s == START_EPOCH_S + 8.0)
    times = sorted(round(m.ts_s - START_EPOCH_S) for m in obs.of(wire.FacilityReading))
    # (the rounds just before the disconnect are QoS 0 and, at full speed, may die with the connection)
    assert not [t for t in times if 2 <= t < 6] and times[-3:] == [6, 7, 8]
    assert summary.telemetry_dropped == 4 * (3 * 2 + 1) and summary.disconnects == 1


async def test_a_restarted_simulator_does_not_apply_commands_queued_for_the_run_before(
    mosquitto: EmbeddedBroker,
) -> None:
    """The simulator's session is persistent for its own reconnects only: a command an agent sent
    while no simulator was running (queued by the broker for the previous run's session) is not
    delivered to the next run, though it has not expired on that run's clock."""
    sc = scenario(duration_s=600.0)
    async with observer(mosquitto, SITE) as obs:
        async with running(mosquitto, sc, speed=10.0) as (first, _):
            await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading), label="telemetry of the first run")
        assert not first.connected
        stale = wire.RackCommand(
            "r0",
            (0, 1, 2, 3),
            wire.CardSetting.power_limit(200.0),
            wire.new_command_id(),
            START_EPOCH_S + 100_000.0,  # in date on the next run's clock too
            START_EPOCH_S,
            0,
            "agent",
        )
        await obs.send(stale)  # the broker queues it for the stopped simulator's session
        start2 = START_EPOCH_S + 10_000.0  # (telemetry of the second run is told apart by its clock)
        async with running(mosquitto, sc, speed=10.0, start_epoch_s=start2) as (second, _):
            await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= start2 + 1)
            # a command of this run: queued commands would have been delivered (and acked) before it
            ts = max(m.ts_s for m in obs.of(wire.FacilityReading))
            fresh = wire.RackCommand(
                "r1", (0,), wire.CardSetting.dvfs(2), wire.new_command_id(), ts + 60.0, ts, 1, "agent"
            )
            await obs.send(fresh)
            assert (await obs.ack_of(fresh.command_id)).result is wire.AckResult.APPLIED
        assert not [a for a in obs.of(wire.Acknowledgement) if a.command_id == stale.command_id]
        assert second.commands.power_limit_w[:4].tolist() == [SITE.card.power_limit_w] * 4
        assert second.commands.counts.applied == 1


async def test_a_broker_outage_shorter_than_a_step_still_happens(mosquitto: EmbeddedBroker) -> None:
    """Steps of 10 s and an outage from 12 s to 16 s: the step is shortened to land on both of its
    edges (stepping over it, the run skipped the outage: the scenario's fault never happened)."""
    sc = scenario(
        faults=[{"kind": "broker_disconnect", "start_s": 12.0, "duration_s": 4.0}],
        telemetry_period_s=10.0,
        duration_s=30.0,
    )
    sim = Simulator(
        SimOptions(
            scenario=sc, mqtt=mosquitto.options(), site_id=SITE_ID, speed=0.0, start_epoch_s=START_EPOCH_S, step_s=10.0
        )
    )
    async with asyncio.timeout(WAIT_S):
        summary = await sim.run()
    assert summary.disconnects == 1 and summary.telemetry_dropped == 0
    assert summary.accounting.time_s == 30.0


async def test_a_connection_lost_during_the_run_counts_in_the_summarys_link_losses(mosquitto: EmbeddedBroker) -> None:
    """Another client connects with the simulator's client id during the run: the broker closes the
    simulator's connection, which reconnects and runs to its end. That unplanned loss of the link it
    ended the run on is in the summary's ``link_losses`` (not in ``disconnects``: no fault planned it)."""
    sc = scenario(duration_s=60.0)
    sim = Simulator(
        SimOptions(
            scenario=sc,
            mqtt=mosquitto.options(client_id="sim-taken", reconnect_min_s=0.05, reconnect_max_s=0.1),
            site_id=SITE_ID,
            speed=20.0,
            start_epoch_s=START_EPOCH_S,
        )
    )
    task = asyncio.create_task(sim.run())
    async with asyncio.timeout(WAIT_S):
        while not sim.connected:
            await asyncio.sleep(0.01)
        async with Bus(mosquitto.options(client_id="sim-taken"), name="intruder") as intruder:
            await intruder.wait_connected(WAIT_S)  # the broker closed the simulator's connection for it
        while not sim.connected:
            await asyncio.sleep(0.01)
        summary = await task
    assert summary.stopped_by == "duration" and summary.site_time_s == START_EPOCH_S + 60.0
    assert summary.disconnects == 0 and summary.link_losses >= 1
