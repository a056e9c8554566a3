"""The MQTT simulator against a real mosquitto on a random loopback port: telemetry, commands and
acks, placement, the broker-disconnect fault, truth log and summary, the command line."""

from __future__ import annotations

import asyncio
import csv
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mqtt_helpers import WAIT_S
from sim_testing import (
    REPO,
    SITE_ID,
    START_EPOCH_S,
    command_times,
    job,
    observer,
    running,
    scenario,
    small_site,
)

from agent import wire
from agent.broker import EmbeddedBroker
from agent.wire.messages import Command
from sim.runner import SimOptions, Simulator
from sim.truth import truth_columns
from twin.workload import Phase

pytestmark = pytest.mark.integration

SITE = small_site()
CLOCKS = SITE.card.clocks_mhz


async def test_telemetry_round_trip_matches_the_plant_readings(mosquitto: EmbeddedBroker) -> None:
    sc = scenario(jobs=[job("train", 16, running_at_start=True)], duration_s=30.0)
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, capture=True, speed=30.0) as (_, captured):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= START_EPOCH_S + 10)
    assert not [m for m in obs.received if isinstance(m, wire.Rejection)]
    batches = obs.of(wire.CardBatch)
    assert {b.rack for b in batches} == {"r0", "r1"}
    checked = 0
    for b in batches:
        t = round(b.ts_s - START_EPOCH_S, 6)
        rr = next(r for r in captured[t].racks if SITE.rack_names[r.rack] == b.rack)
        r = SITE.rack_names.index(b.rack)
        assert rr.cards is not None
        np.testing.assert_array_equal(b.card_index, rr.cards.card_index - r * SITE.cards_per_rack)
        # exact, to the sensors' resolution (0.01 W, 0.01 deg C, 0.01 %)
        np.testing.assert_array_equal(b.power_w, np.round(rr.cards.power_w, 2))
        np.testing.assert_array_equal(b.temp_c, np.round(rr.cards.die_temp_c, 2))
        np.testing.assert_array_equal(b.sm_clock_mhz, rr.cards.clock_mhz)
        np.testing.assert_allclose(b.utilization, rr.cards.utilization, rtol=0, atol=0.5e-4 + 1e-12)
        np.testing.assert_array_equal(b.power_limit_w, rr.cards.power_limit_w)
        np.testing.assert_array_equal(b.low_power, rr.cards.low_power)
        checked += 1
    assert checked >= 2 * 10
    # PDU, CDU and facility readings every period too (the loops below check each of them)
    pdus, cdus, facs = obs.of(wire.PduReading), obs.of(wire.CduReading), obs.of(wire.FacilityReading)
    assert len(pdus) >= 2 * 10 and len(cdus) >= 2 * 10 and len(facs) >= 10
    for p in pdus:
        t = round(p.ts_s - START_EPOCH_S, 6)
        rr = next(r for r in captured[t].racks if SITE.rack_names[r.rack] == p.rack)
        assert rr.pdu is not None and p.power_w == round(rr.pdu.power_w, 2)
    for c in cdus:
        rr = next(r for r in captured[round(c.ts_s - START_EPOCH_S, 6)].racks if SITE.rack_names[r.rack] == c.rack)
        assert rr.loop is not None
        assert (c.supply_temp_c, c.return_temp_c, c.flow_lpm) == (
            round(rr.loop.supply_temp_c, 2),
            round(rr.loop.return_temp_c, 2),
            round(rr.loop.flow_lpm, 2),
        )
    for f in facs:
        fr = captured[round(f.ts_s - START_EPOCH_S, 6)].facility
        assert fr is not None
        assert (f.it_power_w, f.facility_power_w, f.supply_setpoint_c) == (
            round(fr.it_power_w, 1),
            round(fr.facility_power_w, 1),
            fr.supply_setpoint_c,
        )
    # one message per rack and period, seq +1 each, ts = the site clock on the period grid
    r0 = [b for b in batches if b.rack == "r0"]
    assert [b.seq for b in r0] == list(range(len(r0)))
    assert [b.ts_s - START_EPOCH_S for b in r0] == [float(i) for i in range(len(r0))]
    # job events: the listed job was submitted and started on the first 16 cards (rack r0), announced
    # before the first telemetry round (as a site's scheduler knows its jobs before its racks report)
    events = obs.of(wire.JobEvent)
    kinds = [e.event for e in events if e.job_id == "train"]
    assert kinds[:2] == [wire.JobEventType.SUBMITTED, wire.JobEventType.STARTED]
    first_batch = next(i for i, m in enumerate(obs.received) if isinstance(m, wire.CardBatch))
    before = [m.event for m in obs.received[:first_batch] if isinstance(m, wire.JobEvent) and m.job_id == "train"]
    assert before[:2] == [wire.JobEventType.SUBMITTED, wire.JobEventType.STARTED]
    started = next(e for e in events if e.event is wire.JobEventType.STARTED)
    assert started.cards == {"r0": tuple(range(16))}
    submitted = next(e for e in events if e.event is wire.JobEventType.SUBMITTED)
    assert submitted.job is not None and submitted.job.n_cards == 16 and submitted.job.submit_time_s == START_EPOCH_S
    # the retained applied state of every rack came on connect
    assert {a.rack for a in obs.of(wire.AppliedState)} == {"r0", "r1"}


async def test_commands_are_applied_acked_and_visible(mosquitto: EmbeddedBroker) -> None:
    steady = {"startup_s": 0.0, "comm_stalls_per_hour": 0.0, "input_stalls_per_hour": 0.0}
    sc = scenario(jobs=[job("busy", 8, running_at_start=True)], phases=steady, duration_s=600.0)
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, speed=10.0) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading), label="telemetry")
        ts, exp = command_times(obs)
        # DVFS level 3 on idle cards 10..13 of r1: acked applied, in the applied state at once,
        # in the card batch after the card's DVFS latency
        cmd = wire.RackCommand(
            "r1", (10, 11, 12, 13), wire.CardSetting.dvfs(3), wire.new_command_id(), exp, ts, 0, "agent"
        )
        await obs.send(cmd)
        ack = await obs.ack_of(cmd.command_id)
        assert ack.result is wire.AckResult.APPLIED and ack.target == "r1" and ack.reason is None
        applied = await obs.wait_for(
            lambda m: isinstance(m, wire.AppliedState) and m.rack == "r1" and m.last_command_id == cmd.command_id
        )
        assert applied.dvfs_level[10:14].tolist() == [3] * 4 and applied.dvfs_level[:10].tolist() == [0] * 10
        assert applied.max_clock_mhz[10] == CLOCKS[3]
        later = ack.ts_s + SITE.card.dvfs_latency_s
        batch = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.rack == "r1" and m.ts_s > later)
        assert batch.sm_clock_mhz[10:14].tolist() == [CLOCKS[3]] * 4
        assert batch.sm_clock_mhz[0] == CLOCKS[0]

        # a power limit of 200 W on busy cards: applied at once; the cards' own power brake slows them
        ts, exp = command_times(obs)
        cap = wire.RackCommand(
            "r0", (0, 1), wire.CardSetting.power_limit(200.0), wire.new_command_id(), exp, ts, 1, "agent"
        )
        await obs.send(cap)
        assert (await obs.ack_of(cap.command_id)).result is wire.AckResult.APPLIED
        batch = await obs.wait_for(
            lambda m: (
                isinstance(m, wire.CardBatch) and m.rack == "r0" and m.ts_s > ts + 5 and m.power_limit_w[0] == 200.0
            )
        )
        assert batch.sm_clock_mhz[0] < CLOCKS[0] and batch.sm_clock_mhz[2] == CLOCKS[0]

        # low-power idle on idle cards, then wake: visible as low_power / 0 MHz in telemetry
        ts, exp = command_times(obs)
        sleep = wire.RackCommand(
            "r1", (15,), wire.CardSetting.low_power_idle(), wire.new_command_id(), exp, ts, 2, "agent"
        )
        await obs.send(sleep)
        assert (await obs.ack_of(sleep.command_id)).result is wire.AckResult.APPLIED
        batch = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.rack == "r1" and bool(m.low_power[15]))
        assert batch.sm_clock_mhz[15] == 0.0
        ts, exp = command_times(obs)
        wake = wire.RackCommand("r1", (15,), wire.CardSetting.wake(), wire.new_command_id(), exp, ts, 3, "agent")
        await obs.send(wake)
        assert (await obs.ack_of(wake.command_id)).result is wire.AckResult.APPLIED
        assert sim.plant.truth().low_power[16 + 15] == np.False_

        # a clock range maps to the fastest DVFS level inside it
        ts, exp = command_times(obs)
        rng_cmd = wire.RackCommand(
            "r1", (9,), wire.CardSetting.clock_range(1300.0, 1700.0), wire.new_command_id(), exp, ts, 4, "agent"
        )
        await obs.send(rng_cmd)
        assert (await obs.ack_of(rng_cmd.command_id)).result is wire.AckResult.APPLIED
        assert sim.commands.level[16 + 9] == CLOCKS.index(1650.0)

        # the facility set-point
        ts, exp = command_times(obs)
        fac = wire.FacilityCommand(35.0, wire.new_command_id(), exp, ts, 5, "agent")
        await obs.send(fac)
        assert (await obs.ack_of(fac.command_id)).result is wire.AckResult.APPLIED
        f = await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.supply_setpoint_c == 35.0)
        assert f.ts_s >= ts

        # a CDU pump at half speed: acked on the rack's ack topic, half the flow in the CDU reading;
        # a speed below the site's lowest is rejected with the reason
        ts, exp = command_times(obs)
        pump = wire.CduCommand("r1", 0.5, wire.new_command_id(), exp, ts, 6, "agent")
        await obs.send(pump)
        ack = await obs.ack_of(pump.command_id)
        assert ack.result is wire.AckResult.APPLIED and ack.target == "r1"
        cdu = await obs.wait_for(lambda m: isinstance(m, wire.CduReading) and m.rack == "r1" and m.ts_s > ts)
        assert cdu.pump_speed_frac == 0.5
        assert cdu.flow_lpm == pytest.approx(0.5 * SITE.loop_flow_per_rack_lpm(), rel=0.1)  # with sensor noise
        ts, exp = command_times(obs)
        too_slow = wire.CduCommand("r0", 0.2, wire.new_command_id(), exp, ts, 7, "agent")
        await obs.send(too_slow)
        ack = await obs.ack_of(too_slow.command_id)
        assert ack.result is wire.AckResult.REJECTED and ack.reason is not None and "is not within" in ack.reason
        assert sim.plant.truth().rack_pump_speed_frac.tolist()[:2] == [1.0, 0.5]
    s = sim.summary
    assert s is not None and s.commands_applied == 7 and s.commands_rejected == 1 and s.commands_expired == 0


async def test_a_burst_of_commands_is_applied_in_order_and_all_acked(mosquitto: EmbeddedBroker) -> None:
    """Commands handed to the broker at once (the agent pipelines them) are all applied in the order
    sent and acked; per-card power limits (one value per card) land on their cards; the rack's retained
    applied state ends with the last of them."""
    async with observer(mosquitto, SITE) as obs, running(mosquitto, scenario(duration_s=600.0), speed=10.0) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading), label="telemetry")
        ts, exp = command_times(obs)
        limits = [200.0 + 10.0 * c for c in range(16)]
        burst = [
            wire.RackCommand(
                "r0", tuple(range(16)), wire.CardSetting.power_limit(limits), wire.new_command_id(), exp, ts, 0, "agent"
            )
        ]
        # then 40 level commands on r1's cards, each card ending at the level of its last command
        for k in range(40):
            burst.append(
                wire.RackCommand(
                    "r1", (k % 16,), wire.CardSetting.dvfs(k % 8), wire.new_command_id(), exp, ts, k + 1, "agent"
                )
            )
        out = [obs.codec.outgoing(m) for m in burst]
        await asyncio.gather(*(asyncio.ensure_future(obs.bus.send(o)) for o in out))  # all in flight at once
        acks = [await obs.ack_of(m.command_id) for m in burst]
        assert all(a.result is wire.AckResult.APPLIED for a in acks)
        assert sim.commands.power_limit_w[:16].tolist() == limits
        seen = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.rack == "r0" and m.ts_s > acks[0].ts_s)
        assert seen.power_limit_w.tolist() == limits  # enforced by the cards, as telemetry shows
        final = [max(k % 8 for k in range(40) if k % 16 == c) for c in range(16)]
        assert sim.commands.level[16:32].tolist() == final
        last = burst[-1].command_id
        applied = await obs.wait_for(
            lambda m: isinstance(m, wire.AppliedState) and m.rack == "r1" and m.last_command_id == last
        )
        assert applied.dvfs_level.tolist() == final
    s = sim.summary
    assert s is not None and s.commands_applied == 41 and s.commands_expired == 0
    # one applied state per rack and burst, and no seq number drawn for one that was not published:
    # a receiver that counts gaps as lost messages sees none
    for rack in ("r0", "r1"):
        seqs = [a.seq for a in obs.of(wire.AppliedState) if a.rack == rack]
        assert seqs == list(range(len(seqs))), (rack, seqs)


async def test_a_command_the_simulator_fails_on_costs_no_other_commands_ack(
    mosquitto: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A defect while handling one command of a burst (injected) is logged and costs only that
    command: the others of the burst, applied, are still acked (the burst's answers used to be
    dropped with it, and the agent retried commands the racks had applied)."""
    async with observer(mosquitto, SITE) as obs, running(mosquitto, scenario(duration_s=600.0), speed=10.0) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading), label="telemetry")
        ts, exp = command_times(obs)
        burst = [
            wire.RackCommand("r1", (k % 16,), wire.CardSetting.dvfs(k % 8), wire.new_command_id(), exp, ts, k, "agent")
            for k in range(41)
        ]
        poison = obs.codec.outgoing(burst[20]).payload
        handle = sim.commands.handle

        def handle_failing_on_one(topic: str, payload: bytes) -> list[wire.Outgoing]:
            if payload == poison:
                raise RuntimeError("injected defect")
            return handle(topic, payload)

        sim.commands.handle = handle_failing_on_one  # type: ignore[method-assign]  # test double
        out = [obs.codec.outgoing(m) for m in burst]
        await asyncio.gather(*(asyncio.ensure_future(obs.bus.send(o)) for o in out))  # all in flight at once
        acks = [await obs.ack_of(m.command_id) for k, m in enumerate(burst) if k != 20]
        assert all(a.result is wire.AckResult.APPLIED for a in acks)
    assert any("could not be handled" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_commands_are_applied_while_the_answers_of_earlier_ones_cannot_go_out(
    mosquitto: EmbeddedBroker,
) -> None:
    """A rack applies what it gets whether or not its answers go out: while the acks of a first
    command hang (injected: as a publish in flight when the broker stopped waits out its 10 s
    timeout), a later command is applied at once, and both are acked, in order, once the first
    answers go. (The consumer awaited each burst's answers: after a broker restart an agent's
    commands went unapplied for the rest of a 170 s run at 20x.)"""
    async with observer(mosquitto, SITE) as obs, running(mosquitto, scenario(duration_s=600.0), speed=10.0) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading), label="telemetry")
        ts, exp = command_times(obs)
        first = wire.RackCommand("r0", (0,), wire.CardSetting.dvfs(3), wire.new_command_id(), exp, ts, 0, "agent")
        later = wire.RackCommand("r1", (0,), wire.CardSetting.dvfs(5), wire.new_command_id(), exp, ts, 1, "agent")
        release = asyncio.Event()
        answer_all = sim._answer_all
        held: list[int] = []

        async def first_burst_hangs(bus: Any, answers: list[wire.Outgoing]) -> None:
            if not held:
                held.append(len(answers))
                await release.wait()
            await answer_all(bus, answers)

        sim._answer_all = first_burst_hangs  # type: ignore[method-assign]  # test double
        await obs.send(first)
        async with asyncio.timeout(WAIT_S):
            while not held:  # the first command applied, its answers held
                await asyncio.sleep(0.02)
        await obs.send(later)
        r1_card0 = sim.site.cards_per_rack
        async with asyncio.timeout(WAIT_S):
            while int(sim.plant.truth().level[r1_card0]) != 5:
                await asyncio.sleep(0.02)
        assert int(sim.plant.truth().level[0]) == 3  # the first was applied too, only its answers wait
        release.set()
        assert (await obs.ack_of(first.command_id)).result is wire.AckResult.APPLIED
        assert (await obs.ack_of(later.command_id)).result is wire.AckResult.APPLIED


async def test_expired_command_is_acked_expired_and_not_applied(mosquitto: EmbeddedBroker) -> None:
    async with observer(mosquitto, SITE) as obs, running(mosquitto, scenario(duration_s=600.0)) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= START_EPOCH_S + 5)
        now, _ = command_times(obs)
        stale = wire.RackCommand(
            "r0", (0, 1), wire.CardSetting.dvfs(5), wire.new_command_id(), now - 2.0, now - 10.0, 0, "agent"
        )
        await obs.send(stale)
        ack = await obs.ack_of(stale.command_id)
        assert ack.result is wire.AckResult.EXPIRED and ack.ts_s >= stale.expires_s
        fac = wire.FacilityCommand(40.0, wire.new_command_id(), now - 1.0, now - 30.0, 1, "agent")
        await obs.send(fac)
        fac_ack = await obs.ack_of(fac.command_id)
        assert fac_ack.result is wire.AckResult.EXPIRED
        async with asyncio.timeout(WAIT_S):  # 10 site seconds on: the DVFS latency has long passed
            while sim.site_time_s < max(ack.ts_s, fac_ack.ts_s) + 10.0:
                await asyncio.sleep(0.02)
        truth = sim.plant.truth()
        assert truth.level[:2].tolist() == [0, 0] and truth.supply_setpoint_c == SITE.facility.supply_temp_c
        assert sim.commands.level[:2].tolist() == [0, 0]
    assert sim.summary is not None and sim.summary.commands_expired == 2 and sim.summary.commands_applied == 0


async def test_commands_outside_the_cards_range_are_rejected_with_a_reason(mosquitto: EmbeddedBroker) -> None:
    sc = scenario(jobs=[job("busy", 16, running_at_start=True)], duration_s=600.0)
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading))
        ts, exp = command_times(obs)

        def rack(setting: wire.CardSetting, cards: tuple[int, ...] = (0,), r: str = "r1") -> wire.RackCommand:
            return wire.RackCommand(r, cards, setting, wire.new_command_id(), exp, ts, 0, "agent")

        cases: list[tuple[Command, str]] = [
            (rack(wire.CardSetting.dvfs(12)), "outside the card's table 0..7"),
            (rack(wire.CardSetting.power_limit(50.0)), "50 W is not within 200..700 W"),
            (rack(wire.CardSetting.power_limit(900.0)), "900 W is not within 200..700 W"),
            (rack(wire.CardSetting.clock_range(100.0, 900.0)), "no DVFS clock of the card within 100..900 MHz"),
            (rack(wire.CardSetting.low_power_idle(), (3,), "r0"), "card 3 is busy with job busy"),
            (wire.FacilityCommand(70.0, wire.new_command_id(), exp, ts, 0, "agent"), "70 deg C is not within 20..45"),
            (wire.SchedulerCommand("nope", {"r1": (0,)}, wire.new_command_id(), exp, ts, 0, "agent"), "unknown job"),
        ]
        for msg, reason in cases:
            await obs.send(msg)
            ack = await obs.ack_of(msg.command_id)
            assert ack.result is wire.AckResult.REJECTED
            assert ack.reason is not None and reason in ack.reason, (ack.reason, reason)
        # nothing of them was applied
        truth = sim.plant.truth()
        assert truth.level.max() == 0 and not truth.low_power.any()
        assert truth.supply_setpoint_c == SITE.facility.supply_temp_c
    s = sim.summary
    assert s is not None and s.commands_rejected == len(cases) and s.commands_applied == 0
    assert s.command_refusals["rack.set_power_limit"] == 2


async def test_hosts_are_powered_off_and_on_by_whole_host_commands(mosquitto: EmbeddedBroker) -> None:
    assert SITE.hosts_managed and SITE.cards_per_host == 2  # 8 hosts of 2 cards per rack
    sc = scenario(jobs=[job("busy", 16, running_at_start=True)], duration_s=600.0)  # all of r0
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc) as (sim, _):
        first = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.rack == "r1", label="telemetry")
        assert first.host_off is not None and not first.host_off.any()  # the column is there, every host on
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading))
        ts, exp = command_times(obs)
        # hosts 10 and 11 (cards 4..7 of r1) off: acked applied, in the applied state and in the next card batch
        off = wire.RackCommand(
            "r1", (4, 5, 6, 7), wire.CardSetting.host_power_off(), wire.new_command_id(), exp, ts, 0, "a"
        )
        await obs.send(off)
        ack = await obs.ack_of(off.command_id)
        assert ack.result is wire.AckResult.APPLIED and ack.target == "r1", ack.reason
        applied = await obs.wait_for(
            lambda m: isinstance(m, wire.AppliedState) and m.rack == "r1" and m.last_command_id == off.command_id
        )
        assert applied.host_off is not None and np.flatnonzero(applied.host_off).tolist() == [4, 5, 6, 7]
        assert np.flatnonzero(applied.low_power).tolist() == [4, 5, 6, 7]
        batch = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.rack == "r1" and m.ts_s > ack.ts_s)
        assert batch.host_off is not None and np.flatnonzero(batch.host_off).tolist() == [4, 5, 6, 7]
        assert batch.low_power[4:8].all() and (batch.power_w[4:8] == 0.0).all() and batch.power_w[8] > 0.0
        assert sim.plant.truth().host_off.tolist() == [False] * 10 + [True, True] + [False] * 4
        # part of a host, or a host with a busy card: rejected with the reason, nothing applied
        ts, exp = command_times(obs)
        part = wire.RackCommand("r1", (8,), wire.CardSetting.host_power_off(), wire.new_command_id(), exp, ts, 1, "a")
        busy = wire.RackCommand("r0", (2, 3), wire.CardSetting.host_power_off(), wire.new_command_id(), exp, ts, 2, "a")
        for cmd, reason in ((part, "cards must be whole hosts of 2 cards"), (busy, "busy with job busy")):
            await obs.send(cmd)
            ack = await obs.ack_of(cmd.command_id)
            assert ack.result is wire.AckResult.REJECTED and ack.reason is not None and reason in ack.reason, ack.reason
        assert sim.plant.truth().host_off.tolist() == [False] * 10 + [True, True] + [False] * 4
        # on again: the next card batch shows every host on (the cards asleep until woken)
        ts, exp = command_times(obs)
        on = wire.RackCommand(
            "r1", (4, 5, 6, 7), wire.CardSetting.host_power_on(), wire.new_command_id(), exp, ts, 3, "a"
        )
        await obs.send(on)
        ack = await obs.ack_of(on.command_id)
        assert ack.result is wire.AckResult.APPLIED
        batch = await obs.wait_for(lambda m: isinstance(m, wire.CardBatch) and m.rack == "r1" and m.ts_s > ack.ts_s)
        assert batch.host_off is not None and not batch.host_off.any() and batch.low_power[4:8].all()
    assert not [m for m in obs.received if isinstance(m, wire.Rejection)]
    s = sim.summary
    assert s is not None and s.commands_applied == 2 and s.commands_rejected == 2
    assert s.command_refusals["rack.host_power_off"] == 2


async def test_scheduler_places_queued_jobs_and_bad_placements_are_rejected(mosquitto: EmbeddedBroker) -> None:
    sc = scenario(
        jobs=[job("big", 16, running_at_start=True), job("queued", 8), job("late", 8, submit_time_s=5.0)],
        plant={"placement": "external", "external_timeout_s": 1e6},
        duration_s=600.0,
    )
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc) as (sim, _):
        await obs.wait_for(
            lambda m: isinstance(m, wire.JobEvent) and m.job_id == "late" and m.event is wire.JobEventType.SUBMITTED
        )
        assert [j.job_id for j in sim.plant.queued_jobs()] == ["queued", "late"]  # the plant waits for the agent
        ts, exp = command_times(obs)
        busy = wire.SchedulerCommand("queued", {"r0": tuple(range(8))}, wire.new_command_id(), exp, ts, 0, "agent")
        await obs.send(busy)
        ack = await obs.ack_of(busy.command_id)
        assert ack.result is wire.AckResult.REJECTED and ack.reason is not None and "busy" in ack.reason
        short = wire.SchedulerCommand("queued", {"r1": (0, 1)}, wire.new_command_id(), exp, ts, 1, "agent")
        await obs.send(short)
        ack = await obs.ack_of(short.command_id)
        assert ack.result is wire.AckResult.REJECTED and ack.reason is not None and "needs 8 cards, got 2" in ack.reason
        cards = {"r1": (8, 9, 10, 11, 12, 13, 14, 15)}
        place = wire.SchedulerCommand("queued", cards, wire.new_command_id(), exp, ts, 2, "agent")
        await obs.send(place)
        assert (await obs.ack_of(place.command_id)).result is wire.AckResult.APPLIED
        started = await obs.wait_for(
            lambda m: isinstance(m, wire.JobEvent) and m.job_id == "queued" and m.event is wire.JobEventType.STARTED
        )
        assert started.cards == {"r1": (8, 9, 10, 11, 12, 13, 14, 15)}
        computing = await obs.wait_for(
            lambda m: isinstance(m, wire.JobEvent) and m.job_id == "queued" and m.phase is Phase.COMPUTE
        )
        assert computing.ts_s >= started.ts_s + sc.plant_config.phases.startup_s
        # a rack the site does not have inside the payload: the codec refuses it, the sender is told why
        ts, exp = command_times(obs)
        elsewhere = wire.SchedulerCommand("late", {"r1": tuple(range(8))}, wire.new_command_id(), exp, ts, 3, "agent")
        payload = obs.codec.outgoing(elsewhere).payload
        assert payload.count(b'"r1"') == 1
        await obs.publish_raw(obs.codec.topics.scheduler_cmd, payload.replace(b'"r1"', b'"r9"'))
        ack = await obs.ack_of(elsewhere.command_id)
        assert ack.result is wire.AckResult.REJECTED and ack.target == wire.SCHEDULER
        assert ack.reason is not None and ack.reason.startswith("unknown_rack:") and "'r9'" in ack.reason
        ts, exp = command_times(obs)
        again = wire.SchedulerCommand("queued", {"r1": tuple(range(8))}, wire.new_command_id(), exp, ts, 4, "agent")
        await obs.send(again)
        ack = await obs.ack_of(again.command_id)
        assert ack.result is wire.AckResult.REJECTED and ack.reason is not None and "running, not queued" in ack.reason
        assert [j.job_id for j in sim.plant.queued_jobs()] == ["late"]


async def test_queued_jobs_fall_back_to_the_builtin_scheduler_without_an_agent(mosquitto: EmbeddedBroker) -> None:
    sc = scenario(jobs=[job("waits", 8)], plant={"external_timeout_s": 20.0}, duration_s=600.0)
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc):
        started = await obs.wait_for(
            lambda m: isinstance(m, wire.JobEvent) and m.event is wire.JobEventType.STARTED and m.job_id == "waits"
        )
    assert started.ts_s - START_EPOCH_S == pytest.approx(20.0)


async def test_the_builtin_schedulers_placement_publishes_the_applied_state_of_the_cards_it_woke(
    mosquitto: EmbeddedBroker,
) -> None:
    """The cards start asleep and no agent places the job: the plant's scheduler does, after
    ``external_timeout_s``, and wakes its cards. The rack publishes its applied state again, naming
    them awake (docs/protocol.md: a rack republishes it when its settings change other than by a
    command), so an agent counts no ``low_power`` disproval and budgets them awake."""
    sc = scenario(jobs=[job("waits", 8)], plant={"external_timeout_s": 20.0, "initial_low_power": True})
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc):
        started = await obs.wait_for(
            lambda m: isinstance(m, wire.JobEvent) and m.event is wire.JobEventType.STARTED and m.job_id == "waits"
        )
        ((rack, cards),) = started.cards.items()
        woken: wire.AppliedState = await obs.wait_for(
            lambda m: isinstance(m, wire.AppliedState) and m.rack == rack and not m.low_power.all(),
            label="an applied state naming the placed cards awake",
        )
    assert np.flatnonzero(~woken.low_power).tolist() == sorted(cards)
    assert woken.ts_s - START_EPOCH_S == pytest.approx(20.0)
    first = next(a for a in obs.of(wire.AppliedState) if a.rack == rack)
    assert first.low_power.all() and woken.seq == first.seq + 1  # on connect, then once for the placement


async def test_broker_disconnect_loses_telemetry_and_delivers_queued_commands(mosquitto: EmbeddedBroker) -> None:
    sc = scenario(
        faults=[{"kind": "broker_disconnect", "start_s": 10.0, "duration_s": 30.0}],
        jobs=[job("j", 8, running_at_start=True), job("late", 8, submit_time_s=20.0)],
        plant={"placement": "builtin"},
        duration_s=600.0,
    )
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, speed=5.0) as (sim, _):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= START_EPOCH_S + 9)
        async with asyncio.timeout(WAIT_S):  # the simulator goes offline at 10 s
            while sim.connected:
                await asyncio.sleep(0.02)
        ts = START_EPOCH_S + 12.0
        keep = wire.RackCommand("r1", (4,), wire.CardSetting.dvfs(2), wire.new_command_id(), ts + 600.0, ts, 0, "agent")
        lapse = wire.RackCommand("r1", (5,), wire.CardSetting.dvfs(6), wire.new_command_id(), ts + 8.0, ts, 1, "agent")
        await obs.send(keep)
        await obs.send(lapse)
        back = await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s > START_EPOCH_S + 9)
        assert back.ts_s - START_EPOCH_S == pytest.approx(40.0)  # nothing published during the gap
        assert (await obs.ack_of(keep.command_id)).result is wire.AckResult.APPLIED
        assert (await obs.ack_of(lapse.command_id)).result is wire.AckResult.EXPIRED
        # the job event of the gap came after reconnecting, with its own time stamp
        late = await obs.wait_for(lambda m: isinstance(m, wire.JobEvent) and m.job_id == "late")
        assert late.event is wire.JobEventType.SUBMITTED and late.ts_s == START_EPOCH_S + 20.0
        assert sim.commands.level[16 + 4] == 2 and sim.commands.level[16 + 5] == 0
    times = sorted({round(m.ts_s - START_EPOCH_S) for m in obs.of(wire.FacilityReading)})
    assert 9 in times and 40 in times and not [t for t in times if 9 < t < 40]  # lost: [10, 40)
    s = sim.summary
    assert s is not None and s.disconnects == 1 and s.telemetry_dropped == 30 * (3 * 2 + 1)
    applied_states = [a for a in obs.of(wire.AppliedState) if a.rack == "r0"]
    assert len(applied_states) >= 2  # on the first connect and again on the reconnect


async def test_truth_log_and_summary(mosquitto: EmbeddedBroker, tmp_path: Path) -> None:
    sc = scenario(
        jobs=[job("a", 16, running_at_start=True), job("b", 8, submit_time_s=3.0, duration_s=30.0)],
        faults=[{"kind": "card_failure", "card": 30, "at_s": 12.0}],
        plant={"noise": False, "placement": "builtin"},
        telemetry_period_s=2.0,
        duration_s=121.0,
    )
    truth, summary = tmp_path / "truth.csv", tmp_path / "summary.json"
    lines: list[str] = []
    runs = running(
        mosquitto, sc, speed=0.0, truth_log=truth, summary_path=summary, progress=lines.append, progress_interval_s=1e-9
    )
    async with observer(mosquitto, SITE) as obs, runs as (sim, _):
        end_s = START_EPOCH_S + 120
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= end_s)
        racks = set(SITE.rack_names)  # and the last round's other messages: each rack's PDU reading
        await obs.wait_for(lambda _m: {p.rack for p in obs.of(wire.PduReading) if p.ts_s >= end_s} == racks)
    rows = list(csv.DictReader(truth.open(encoding="utf-8")))
    assert list(rows[0]) == truth_columns(SITE)
    # one row per period, and the final state at the end (121 s is between two periods)
    assert [float(r["time_s"]) for r in rows] == [float(t) for t in range(0, 121, 2)] + [121.0]
    assert float(rows[-1]["ts_s"]) == START_EPOCH_S + 121.0
    # without sensor noise, the PDU telemetry is the true rack power of the same instant
    pdu = {(m.rack, round(m.ts_s - START_EPOCH_S)): m.power_w for m in obs.of(wire.PduReading)}
    for r in rows[:-1]:
        t = round(float(r["time_s"]))
        assert float(r["r0_power_w"]) == pytest.approx(pdu[("r0", t)], rel=1e-6)
        assert float(r["r1_power_w"]) == pytest.approx(pdu[("r1", t)], rel=1e-6)
        total = float(r["r0_power_w"]) + float(r["r1_power_w"])
        assert float(r["it_power_w"]) == pytest.approx(total, rel=1e-6)
    assert rows[0]["failed_cards"] == "0" and rows[-1]["failed_cards"] == "1"
    d = json.loads(summary.read_text(encoding="utf-8"))
    acc = sim.plant.accounting()
    assert d["duration_s"] == 121.0 and d["stopped_by"] == "duration"
    assert d["start_ts_s"] == START_EPOCH_S and d["end_ts_s"] == START_EPOCH_S + 121.0
    assert d["facility_energy_kwh"] == pytest.approx(acc.facility_energy_j / 3.6e6)
    assert d["facility_energy_kwh"] == pytest.approx(float(rows[-1]["facility_energy_kwh"]), rel=1e-6)
    assert d["work_card_s"] == pytest.approx(float(rows[-1]["work_card_s"]), rel=1e-6)
    assert d["jobs_finished"] == 1 and d["jobs_submitted"] == 2
    assert d["max_rack_power_w"] == pytest.approx(max(float(r["max_rack_power_w"]) for r in rows), rel=1e-6)
    assert d["max_die_temp_c"] == pytest.approx(acc.max_die_temp_c)
    assert d["truth_rows"] == len(rows) == 62
    assert d["messages_published"] >= 61 * 7 and d["card_readings_published"] == 61 * 32
    for key in ("it_energy_kwh", "pue", "rack_over_limit_s", "commands_applied", "rejected_messages", "cpu_share"):
        assert key in d
    assert math.isfinite(d["pue"]) and d["pue"] > 1.0
    # progress: a line per step here, and no last line repeating the end with a speed of "0.00x"
    found = [re.search(r"t=([\d,.]+) s", line) for line in lines]
    shown = [float(m[1].replace(",", "")) for m in found if m is not None]
    assert len(shown) == len(lines), lines  # every line shows the time
    assert shown[-1] == 121.0 and all(a < b for a, b in itertools.pairwise(shown)), shown[-3:]


async def test_a_peak_after_the_last_telemetry_round_is_the_summarys_maximum(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """Telemetry every 30 s, a run of 75 s, and a job of 16 cards submitted at 1 s that computes from
    ~62 s on (its cards woken, its hosts booted, started up): rack power peaks after the last round
    (60 s). The summary's maximum rack power still counts that peak, as the truth log's last row
    does: a peak between the last round and the end is no less a peak."""
    sc = scenario(
        jobs=[job("a", 4, running_at_start=True), job("b", 16, submit_time_s=1.0)],
        plant={"noise": False, "placement": "builtin"},
        telemetry_period_s=30.0,
        duration_s=75.0,
    )
    truth = tmp_path / "truth.csv"
    sim = Simulator(
        SimOptions(
            scenario=sc,
            mqtt=mosquitto.options(),
            site_id=SITE_ID,
            speed=0.0,
            start_epoch_s=START_EPOCH_S,
            truth_log=truth,
        )
    )
    async with asyncio.timeout(WAIT_S):
        summary = await sim.run()
    rows = list(csv.DictReader(truth.open(encoding="utf-8")))
    assert [float(r["time_s"]) for r in rows] == [0.0, 30.0, 60.0, 75.0]
    *published, last = (float(r["max_rack_power_w"]) for r in rows)
    assert last > 1.2 * max(published)  # the peak came after the last round
    assert summary.max_rack_power_w == pytest.approx(last, abs=0.01)  # the log rounds to 0.01 W


def test_command_line_with_embedded_broker_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    truth, summary = tmp_path / "truth.csv", tmp_path / "summary.json"
    cmd = [
        sys.executable, "-m", "sim", "--scenario", str(REPO / "examples" / "fault-broker-disconnect.toml"),
        "--speed", "20", "--truth-log", str(truth), "--summary", str(summary), "--progress-interval-s", "0.5",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "embedded" in first and "mqtt://127.0.0.1:" in first
        deadline = WAIT_S
        while not (truth.exists() and truth.stat().st_size > 0 and len(truth.read_text().splitlines()) > 40):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            deadline -= 0.1
            assert deadline > 0
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "sim: t=" in err and "racktwin sim: stopped by SIGTERM after" in err
    d = json.loads(summary.read_text(encoding="utf-8"))
    assert d["stopped_by"] == "stop" and 40 <= d["duration_s"] < 1800
    rows = list(csv.DictReader(truth.open(encoding="utf-8")))
    assert len(rows) == d["truth_rows"] and float(rows[-1]["time_s"]) <= d["duration_s"]


def test_command_line_reports_bad_scenarios_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nduration_s = 60\nsite = "nowhere.toml"\n', encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "sim", "--scenario", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "bad.toml: site:" in done.stderr and "file not found" in done.stderr


async def test_plant_faults_on_the_wire(mosquitto: EmbeddedBroker) -> None:
    sc = scenario(
        jobs=[job("a", 8, running_at_start=True)],
        phases={"startup_s": 0.0, "restart_delay_s": 2.0, "comm_stalls_per_hour": 0.0, "input_stalls_per_hour": 0.0},
        plant={"placement": "builtin"},
        faults=[
            {"kind": "sensor_dropout", "rack": 1, "start_s": 5.0, "end_s": 10.0},
            {"kind": "card_failure", "card": 3, "at_s": 6.0},
            {"kind": "garbage_readings", "rack": 0, "mode": "nan", "start_s": 12.0, "end_s": 14.0},
            {"kind": "garbage_readings", "rack": 1, "mode": "garbage", "start_s": 15.0, "end_s": 17.0},
            {"kind": "stuck_sensor", "rack": "r1", "start_s": 18.0, "end_s": 22.0},
            {"kind": "pump_degradation", "rack": 0, "start_s": 0.0, "flow_fraction": 0.5},
            {"kind": "heat_wave", "start_s": 0.0, "peak_delta_k": 10.0, "ramp_s": 10.0, "hold_s": 100.0},
        ],
        ambient={"kind": "constant", "temp_c": 20.0},
        duration_s=600.0,
    )
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, speed=20.0):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= START_EPOCH_S + 25)
    bad = obs.codec.counter.snapshot()

    def at(cls: type, rack: str | None = None) -> dict[int, Any]:
        return {
            round(m.ts_s - START_EPOCH_S): m for m in obs.of(cls) if rack is None or getattr(m, "rack", None) == rack
        }

    r1_cards, r0_cards = at(wire.CardBatch, "r1"), at(wire.CardBatch, "r0")
    # sensor dropout: r1 publishes nothing in [5, 10)
    for cls in (wire.CardBatch, wire.CduReading, wire.PduReading):
        times = at(cls, "r1")
        assert 4 in times and 10 in times and not [t for t in times if 5 <= t < 10]
    # card failure: 0 W, 0 MHz, awake; its job is requeued and starts again on healthy cards
    assert r0_cards[7].power_w[3] == 0.0 and r0_cards[7].sm_clock_mhz[3] == 0.0 and not r0_cards[7].low_power[3]
    assert r0_cards[5].sm_clock_mhz[3] == CLOCKS[0]
    kinds = [(e.event, e.reason) for e in obs.of(wire.JobEvent) if e.job_id == "a"]
    assert (wire.JobEventType.REQUEUED, "card 3 failed") in kinds
    restarted = [e for e in obs.of(wire.JobEvent) if e.event is wire.JobEventType.STARTED][-1]
    assert restarted.cards is not None and 3 not in restarted.cards["r0"] and len(restarted.cards["r0"]) == 8
    # a card's NaN readings are null on the wire, its implausible ones sent as they are, in batches a
    # receiver accepts (its belief refuses those cards' readings); the loop's get the CDU message
    # rejected as non_finite / out_of_range
    for t in (12, 13):
        assert np.isnan(r0_cards[t].power_w).all() and np.isnan(r0_cards[t].temp_c).all()
    assert np.isfinite(r0_cards[14].power_w).all()
    assert 12 not in at(wire.CduReading, "r0") and bad["non_finite"] >= 2  # r0's CDU at 12 and 13
    for t in (15, 16):
        assert (r1_cards[t].power_w < 0).all() and (r1_cards[t].temp_c > 1000).all()
    assert (r1_cards[17].power_w >= 0).all()
    assert 15 not in at(wire.CduReading, "r1") and bad["out_of_range"] >= 2
    # stuck: the same values with fresh time stamps
    np.testing.assert_array_equal(r1_cards[19].power_w, r1_cards[18].power_w)
    np.testing.assert_array_equal(r1_cards[21].temp_c, r1_cards[18].temp_c)
    assert r1_cards[19].ts_s > r1_cards[18].ts_s
    assert not np.array_equal(r1_cards[23].power_w, r1_cards[18].power_w)
    # pump degradation: half the flow in r0's loop; heat wave: ambient 20 -> 30 deg C
    cdu0, cdu1 = at(wire.CduReading, "r0"), at(wire.CduReading, "r1")
    assert cdu0[20].flow_lpm == pytest.approx(0.5 * cdu1[20].flow_lpm, rel=0.05)
    assert cdu0[20].delta_pressure_pa == pytest.approx(0.25 * cdu1[20].delta_pressure_pa, rel=0.1)
    fac = at(wire.FacilityReading)
    assert fac[0].ambient_temp_c == pytest.approx(20.0, abs=1.0) and fac[20].ambient_temp_c == pytest.approx(
        30.0, abs=1.0
    )


async def test_faults_from_t0_show_in_the_first_round_and_at_the_warm_start(mosquitto: EmbeddedBroker) -> None:
    """Faults that start at t = 0 are in force before the first telemetry round and before the jobs
    running at the start are placed: a job is never placed on a card that is dead from the start."""
    sc = scenario(
        jobs=[job("a", 24, running_at_start=True)],  # r0's 16 cards and 8 of r1
        phases={"max_restarts": 0, "restart_delay_s": 1.0},
        plant={"placement": "builtin"},
        faults=[
            {"kind": "sensor_dropout", "rack": 0, "start_s": 0.0, "end_s": 2.0},
            {"kind": "card_failure", "card": 16 + 3, "at_s": 0.0},
        ],
        duration_s=60.0,
    )
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, speed=20.0):
        await obs.wait_for(lambda m: isinstance(m, wire.FacilityReading) and m.ts_s >= START_EPOCH_S + 4)
    r0 = sorted(round(b.ts_s - START_EPOCH_S) for b in obs.of(wire.CardBatch) if b.rack == "r0")
    assert r0[0] == 2  # nothing from r0 while its sensors are out, the t = 0 round included
    r1_first = min((b for b in obs.of(wire.CardBatch) if b.rack == "r1"), key=lambda b: b.ts_s)
    assert r1_first.ts_s == START_EPOCH_S
    assert r1_first.power_w[3] == 0.0 and r1_first.sm_clock_mhz[3] == 0.0  # failed in the t = 0 round
    events = [e for e in obs.of(wire.JobEvent) if e.job_id == "a"]
    started = next(e for e in events if e.event is wire.JobEventType.STARTED)
    assert started.cards is not None and 3 not in started.cards["r1"] and len(started.cards["r1"]) == 8
    assert not [e for e in events if e.event in (wire.JobEventType.REQUEUED, wire.JobEventType.FAILED)]


async def test_a_long_step_lands_on_plant_fault_edges(mosquitto: EmbeddedBroker) -> None:
    """``step_s`` is shortened to land on each plant fault's edge, as on each period: a card failing
    at 15 s with 10 s steps stops its job at 15 s, not at the next period."""
    sc = scenario(
        jobs=[job("a", 8, running_at_start=True)],
        phases={"restart_delay_s": 5.0, "comm_stalls_per_hour": 0.0, "input_stalls_per_hour": 0.0},
        plant={"placement": "builtin"},
        faults=[{"kind": "card_failure", "card": 3, "at_s": 15.0}],
        telemetry_period_s=10.0,
        duration_s=60.0,
    )
    async with observer(mosquitto, SITE) as obs, running(mosquitto, sc, speed=0.0, step_s=10.0):
        requeued = await obs.wait_for(lambda m: isinstance(m, wire.JobEvent) and m.event is wire.JobEventType.REQUEUED)
    stopped = [
        e for e in obs.of(wire.JobEvent) if e.event is wire.JobEventType.PHASE_CHANGED and e.phase is Phase.WAITING
    ]
    assert stopped[0].ts_s - START_EPOCH_S == pytest.approx(15.0)
    assert requeued.reason == "card 3 failed" and requeued.ts_s - START_EPOCH_S == pytest.approx(20.0)


async def test_a_run_that_cannot_keep_up_with_its_speed_runs_late_and_says_so(mosquitto: EmbeddedBroker) -> None:
    """Asked for 1e9x, the run cannot keep up: it skips no physics (every site second is run) and
    the summary says how far behind it ran."""
    sim = Simulator(
        SimOptions(
            scenario=scenario(duration_s=30.0),
            mqtt=mosquitto.options(),
            site_id=SITE_ID,
            speed=1e9,
            start_epoch_s=START_EPOCH_S,
        )
    )
    async with asyncio.timeout(WAIT_S):
        summary = await sim.run()
    assert summary.accounting.time_s == 30.0 and summary.truth_rows == 0
    d = summary.to_dict()
    assert d["max_behind_s"] > 0.0 and d["max_behind_s"] == summary.max_behind_s
    assert d["speed_achieved"] < d["speed_requested"]
