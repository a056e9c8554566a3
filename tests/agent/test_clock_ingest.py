"""The site clock (follows telemetry timestamps) and the ingest of wire messages into the belief."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import sqlite3
import uuid
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np
import pytest
from agent_helpers import example_site

from agent import wire
from agent.bus import MqttOptions
from agent.clock import SiteClock
from agent.config import load_config
from agent.estimation_loop import ClockWentBack
from agent.ingest import _DATES_KEPT, Ingest
from agent.logs import JsonFormatter
from agent.round_merger import RoundMerger
from agent.service import AgentService
from twin.readings import FacilityReading, LoopReading, PduReading, RackReading, Readings
from twin.state import TwinState
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.agent

T0 = 1_800_000_000.0
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class FakeWall:
    """A wall clock the test moves; counts how often it is read (a waiter reads it at each check)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t


def test_the_clock_follows_timestamps_extrapolates_at_its_rate_and_never_goes_back_for_jitter() -> None:
    wall = FakeWall()
    clock = SiteClock(0.1, infer=False, wall=wall)  # 10 site s per wall s
    assert clock.now() is None and not clock.known
    assert clock.observe(T0)
    wall.t += 0.5
    assert clock.now() == pytest.approx(T0 + 5.0, abs=1e-6)
    assert not clock.observe(T0 - 3.0)  # a late message does not move it
    clock.observe(T0 + 4.8)  # jitter just behind the extrapolation: no step back
    assert clock.now() == pytest.approx(T0 + 5.0, abs=1e-6)
    assert clock.wall_seconds(15.0) == pytest.approx(1.5)


def test_the_clock_infers_its_rate_and_steps_back_to_the_site_after_running_ahead() -> None:
    wall = FakeWall()
    clock = SiteClock(1.0, infer=True, wall=wall)
    for i in range(40):  # the site runs 20x wall time
        clock.observe(T0 + 20.0 * 0.25 * i)
        wall.t += 0.25
    assert clock.rate == pytest.approx(20.0, rel=0.05)
    ahead = clock.now()
    assert ahead is not None
    wall.t += 2.0  # a silence: 40 site s extrapolated, but the site only advanced 10 s
    assert (clock.now() or 0) > ahead + 35.0
    clock.observe(ahead + 10.0)
    assert clock.corrections == 1
    assert clock.now() == pytest.approx(ahead + 10.0, abs=1e-6)


def test_the_clock_follows_a_site_whose_clock_went_back_but_not_a_late_message() -> None:
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)  # 20 site s per wall s
    for i in range(20):  # timeline A
        clock.observe(T0 + i)
        wall.t += 0.05
    newest = T0 + 19
    # a late message while A goes on: ignored
    assert not clock.observe(newest - 300.0)
    clock.observe(newest + 1)
    # A falls silent for 3 wall s; a straggler of A's past arrives, then A resumes: no step back
    wall.t += 3.0
    assert not clock.observe(newest - 300.0)
    assert clock.observe(newest + 62.0)
    assert clock.corrections == 0
    # A falls silent again; B (a restarted simulator) stamps 500 s behind and keeps going
    wall.t += 3.0
    b0 = newest + 62.0 - 500.0
    accepted = []
    for i in range(30):
        accepted.append(clock.observe(b0 + i))
        wall.t += 0.05
    assert not any(accepted[:19]) and all(accepted[21:])  # ignored for confirm_s (1 wall s), then followed
    assert clock.corrections == 1
    assert clock.now() == pytest.approx(b0 + 29 + 0.05 * 20, abs=0.5)


def test_the_clock_ignores_messages_behind_it_while_its_timeline_paused_for_less_than_the_reset_time() -> None:
    """The site's messages stop for 1.5 wall s (reset_after_s: 2 s) while a publisher 300 s behind
    keeps sending, advancing: late messages, not a site whose clock went back. Only after its timeline
    has been silent for reset_after_s would they count (and then for confirm_s more)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)  # 20 site s per wall s
    for i in range(40):
        clock.observe(T0 + i)
        wall.t += 0.05
    behind = []
    for i in range(30):  # 1.5 wall s
        wall.t += 0.05
        behind.append(clock.observe(T0 - 300.0 + i))
    assert not any(behind) and clock.corrections == 0
    assert clock.observe(T0 + 70.0)


def test_the_clock_accepts_a_message_up_to_two_wall_seconds_of_site_time_ahead() -> None:
    """At 20 site s per wall s, a message 30 site s beyond the clock's extrapolation is within two wall
    seconds of it (40 s): taken; one 45 s beyond is not."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    clock.observe(T0)
    assert not clock.observe(T0 + 45.0) and clock.last_was_ahead
    assert clock.observe(T0 + 30.0) and not clock.last_was_ahead
    assert clock.now() == pytest.approx(T0 + 30.0, abs=1e-6)


def test_the_inferred_rate_follows_the_last_window_not_the_whole_history() -> None:
    """The site ran 20x for a wall minute, then 10x: once the 30 wall s window has passed, the rate is
    10 (the average since the start would be 16)."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=True, wall=wall, window_s=30.0)
    t = T0
    for rate, seconds in ((20.0, 60.0), (10.0, 40.0)):
        for _ in range(int(seconds / 0.25)):
            clock.observe(t)
            t += rate * 0.25
            wall.t += 0.25
    assert clock.rate == pytest.approx(10.0, rel=0.02)


async def test_a_waiter_returns_when_the_clock_steps_back() -> None:
    clock = SiteClock(0.05, infer=False, reset_after_s=0.05, confirm_s=0.05)
    clock.observe(T0)
    waiter = asyncio.create_task(clock.wait_until(T0 + 1e6))  # far ahead on the old timeline
    await asyncio.sleep(0.1)
    assert not waiter.done()
    for i in range(5):  # a new timeline far behind, advancing
        clock.observe(T0 - 1000.0 + i)
        await asyncio.sleep(0.03)
    assert clock.corrections == 1
    assert await asyncio.wait_for(waiter, 1.0) is True


def test_when_the_clock_steps_back_the_beliefs_times_come_back_with_it() -> None:
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    for i in range(10):
        for r in range(site.n_racks):
            ing.handle(cards_msg(f"r{r}", T0 + i))
        ing.flush()
        wall.t += 0.05
    assert state.card_last_seen_s.max() == pytest.approx(T0 + 9, abs=1e-6)
    wall.t += 2.0  # the site restarts 600 s back; only rack r0 reports on the new timeline
    for i in range(12):
        ing.handle(cards_msg("r0", T0 - 600.0 + i))
        ing.flush()
        wall.t += 0.05
    assert clock.corrections == 1
    now = clock.now()
    assert now is not None and now < T0 - 580.0
    assert state.card_last_seen_s.max() <= now
    # r0 is fresh on the new timeline; the racks silent since are stale on it, not fresh until T0 + 9
    assert 0 not in {r for r in range(site.n_racks) if state.card_last_seen_s[r * 64] < now - 5.0}
    assert set(state.stale_racks(now, 5.0)) >= set(range(1, site.n_racks))


def _service(tmp_path: Path, clock: SiteClock | None = None) -> AgentService:
    """The example agent's service, not run (no connection is made); ``clock``: its site clock."""
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    return AgentService(loaded, mqtt=MqttOptions(port=1), http=False, clock=clock)


def _service_on_a_fake_wall(tmp_path: Path) -> tuple[AgentService, FakeWall, tuple[range, range]]:
    """The service with its site clock on a wall the test moves (20 site s per wall s; a step back or
    jump confirmed after 0.5 wall s), and its racks in two halves (a round in two bursts)."""
    wall = FakeWall()
    svc = _service(tmp_path, SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5))
    n_racks = svc.site.n_racks
    return svc, wall, (range(n_racks // 2), range(n_racks // 2, n_racks))


def test_every_part_of_the_service_reads_the_one_site_clock_it_was_given(tmp_path: Path) -> None:
    """The service hands its one site clock to every part that reads the site's time (the ingest, the
    publisher, the status, the metrics, the estimator's task, the control loop, the commands'
    outcomes): a part with a clock of its own would date commands, acks and decisions on another
    timeline. Tests that move the site's time give their clock to the service for the same reason
    (they used to replace it part by part, and a part added later kept the real one unnoticed)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    svc = _service(tmp_path, clock)
    try:
        holders = {name: part for name, part in vars(svc).items() if hasattr(part, "clock")}
        assert {"ingest", "publisher", "status", "metric_updates", "estimation", "control", "outcomes"} <= set(holders)
        assert {name: part.clock is clock for name, part in holders.items()} == dict.fromkeys(holders, True)
        assert svc.clock is clock
    finally:
        svc.control._executor.shutdown(wait=True)
        svc.journal.close()


def test_the_service_tells_the_publisher_whether_a_rack_was_heard_from_since_a_time(tmp_path: Path) -> None:
    """What the publisher asks before it reports a missing ack (``agent.publish.Publisher``): a rack
    heard from after the command went out (any of its cards, its loop or its PDU) did not get it or
    its ack was lost; a silent one is not reported. The facility and the scheduler count as heard."""
    svc = _service(tmp_path)
    try:
        svc.ingest.handle(cards_msg("r2", T0 + 5.0))
        svc.ingest.handle(_cdu("r3", T0 + 7.0))
        svc._flush()
        assert svc._heard_since("r2", T0 + 4.9) and not svc._heard_since("r2", T0 + 5.0)
        assert svc._heard_since("r3", T0 + 6.0) and not svc._heard_since("r3", T0 + 7.0)
        assert not svc._heard_since("r0", T0 - 1e6)  # never heard from
        assert svc._heard_since("facility", T0 + 1e6) and svc._heard_since("scheduler", T0 + 1e6)
    finally:
        svc.control._executor.shutdown(wait=True)
        svc.journal.close()


def test_when_the_clock_steps_back_the_estimator_gets_the_old_timelines_last_round_first(tmp_path: Path) -> None:
    """The service merges the partial rounds its ingest flushes (a burst holds part of a round) into
    whole ones for the estimator. When the site's clock steps back (a simulator restarted 600 s
    back), the round the merger still held from the old timeline is newer than anything the new one
    sends for ten minutes: it goes to the estimator when the clock steps back, and the new
    timeline's rounds after it whole and in order (it used to stay held, so that every half round
    of the new timeline went out alone at once, and the old round out of order ten minutes later)."""
    svc, wall, halves = _service_on_a_fake_wall(tmp_path)
    try:
        n_racks = svc.site.n_racks

        def send_round(ts: float) -> None:
            for half in halves:  # two bursts, a flush after each
                for r in half:
                    svc.ingest.handle(cards_msg(f"r{r}", ts))
                    svc.ingest.handle(_cdu(f"r{r}", ts))
                svc._flush()
            wall.t += 0.05

        for i in range(10):
            send_round(T0 + i)
        wall.t += 2.0  # the old timeline falls silent; the site restarts 600 s back
        for i in range(30):
            send_round(T0 - 600.0 + i)
        assert svc.clock.corrections == 1
        items = [svc._rounds.get_nowait() for _ in range(svc._rounds.qsize())]
        (step,) = [i for i, x in enumerate(items) if isinstance(x, ClockWentBack)]
        rounds = [x for x in items if isinstance(x, Readings)]
        times = [r.time_s - T0 for r in rounds]
        assert times[:9] == [float(i) for i in range(9)]
        last_old = times.index(9.0)  # out when the clock stepped back (before: the new timeline's late halves)
        after = rounds[last_old + 1 :]
        # the estimator is told of the step right after the old timeline's last round, before the new ones
        assert step == last_old + 1 and items[step + 1 :] == after
        marker = items[step]
        assert isinstance(marker, ClockWentBack) and T0 - 600.0 < marker.now_s < after[0].time_s + 1.0
        assert len(after) >= 15 and all(r.time_s < T0 - 570.0 for r in after)
        assert [r.time_s for r in after] == sorted({r.time_s for r in after})  # in order, once each
        assert all(len(r.racks) == n_racks for r in rounds if r.time_s >= T0)  # the old timeline's: whole
        assert all(len(r.racks) == n_racks for r in after)
    finally:
        svc.control._executor.shutdown(wait=True)
        svc.journal.close()


def test_when_the_first_publisher_was_an_hour_ahead_its_last_round_is_not_held_for_an_hour(tmp_path: Path) -> None:
    """The agent's first message came from r0, whose exporter runs an hour ahead of the other racks:
    the clock follows the others once they outvote it (a step back at the first timeline). The ingest
    flushes what it collected when the clock steps back, r0's latest reading among it: it used to stay
    in the merger as the newest round, so that every round of the other racks went to the estimator in
    halves, as soon as part of it arrived, for an hour. It goes out at the step back, and the other
    racks' rounds whole after it."""
    svc, wall, halves = _service_on_a_fake_wall(tmp_path)
    try:
        n_racks = svc.site.n_racks
        for i in range(40):
            for half in halves:  # two bursts, a flush after each; r0 first in the first one
                for r in half:
                    ts = T0 + i + (3600.0 if r == 0 else 0.0)
                    svc.ingest.handle(cards_msg(f"r{r}", ts))
                    svc.ingest.handle(_cdu(f"r{r}", ts))
                svc._flush()
            wall.t += 0.05
        assert svc.clock.corrections == 1
        now = svc.clock.now()
        assert now is not None and now < T0 + 41.0
        items = [svc._rounds.get_nowait() for _ in range(svc._rounds.qsize())]
        (step,) = [i for i, x in enumerate(items) if isinstance(x, ClockWentBack)]
        marker = items[step]  # the estimator told of the step after r0's rounds an hour ahead
        assert isinstance(marker, ClockWentBack) and T0 <= marker.now_s <= now
        assert all(isinstance(x, Readings) and x.time_s <= now for x in items[step + 1 :])
        rounds = [x for x in items if isinstance(x, Readings)]
        ahead = [i for i, r in enumerate(rounds) if r.time_s > now]
        assert ahead  # r0's rounds (before the step back, between the others' halves)
        after = rounds[ahead[-1] + 1 :]
        assert len(after) >= 20 and all(len(r.racks) == n_racks - 1 for r in after)  # r0's are ahead: dropped
        assert [r.time_s for r in after] == sorted({r.time_s for r in after})
        held_s = svc._merger.held_s
        assert held_s is None or held_s <= now  # nothing from an hour ahead held
    finally:
        svc.control._executor.shutdown(wait=True)
        svc.journal.close()


def test_one_message_stamped_far_ahead_does_not_move_the_clock() -> None:
    """One bad stamp an hour ahead used to become the site's time at once: every other rack read as
    stale and the control loop's wait for its next period returned at once."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=True, wall=wall)
    for i in range(30):
        assert clock.observe(T0 + i)
        if i == 20:
            assert not clock.observe(T0 + i + 3600.0) and clock.last_was_ahead
        wall.t += 1.0
    assert clock.now() == pytest.approx(T0 + 30.0, abs=1e-6)
    assert clock.ahead_ignored == 1 and clock.jumps == 0 and clock.corrections == 0
    assert clock.observe(T0 + 38.0)  # a few seconds ahead of the extrapolation: within the tolerance


def test_the_clock_follows_a_site_whose_clock_jumped_ahead_once_its_old_timeline_is_silent() -> None:
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)  # 20 site s per wall s
    for i in range(20):
        clock.observe(T0 + i)
        wall.t += 0.05
    # a publisher far ahead while the others keep the site's time: never followed
    for i in range(60):
        assert not clock.observe(T0 + 5000.0 + i)
        clock.observe(T0 + 20 + i)
        wall.t += 0.05
    assert clock.jumps == 0 and (clock.now() or 0.0) < T0 + 100.0
    # the site restarts 5000 s later: its old timeline falls silent, the new one keeps coming
    wall.t += 3.0
    b0 = T0 + 5000.0
    accepted = []
    for i in range(30):
        accepted.append(clock.observe(b0 + i))
        wall.t += 0.05
    assert not any(accepted[:19]) and all(accepted[21:])  # ignored for confirm_s (1 wall s), then followed
    assert clock.jumps == 1 and clock.corrections == 0
    assert clock.now() == pytest.approx(b0 + 29 + 0.05 * 20, abs=0.5)


def test_a_simulator_faster_than_the_configured_rate_is_followed_after_one_confirmation() -> None:
    """The agent is configured for real time but the simulator runs 60x and publishes every 15 site
    s: each message reads 15 s ahead of a clock running at 1x. The run of such messages is followed
    after confirm_s, at its own pace, and the clock keeps up from then on."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=True, wall=wall)
    accepted = []
    for i in range(200):
        accepted.append(clock.observe(T0 + 15.0 * i))
        wall.t += 0.25
    assert clock.jumps == 1 and clock.ahead_ignored <= 5
    assert all(accepted[10:])
    assert clock.rate == pytest.approx(60.0, rel=0.05)


async def test_a_message_far_ahead_does_not_end_the_wait_for_the_next_period() -> None:
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    clock.observe(T0)
    waiter = asyncio.create_task(clock.wait_until(T0 + 15.0, max_sleep_s=0.01))
    await asyncio.sleep(0)  # its first check
    clock.observe(T0 + 3600.0)
    read = wall.reads
    # a check of the waiter's after the message (it reads the wall at each), not 0.05 s of wall time in
    # which a slow machine might have run none
    async with asyncio.timeout(10.0):
        while wall.reads == read:
            await asyncio.sleep(0.001)
    assert not waiter.done()
    wall.t += 15.0
    clock.observe(T0 + 15.0)
    assert await asyncio.wait_for(waiter, 1.0) is True


class CardColumns(TypedDict, total=False):
    """The ``wire.CardBatch`` columns ``cards_msg`` sets or a test overrides."""

    power_w: np.ndarray
    temp_c: np.ndarray
    sm_clock_mhz: np.ndarray
    utilization: np.ndarray
    power_limit_w: np.ndarray
    low_power: np.ndarray
    host_off: np.ndarray | None


def cards_msg(rack: str, ts: float, n: int = 64, **cols: Unpack[CardColumns]) -> wire.CardBatch:
    base: CardColumns = {
        "power_w": np.full(n, 300.0),
        "temp_c": np.full(n, 50.0),
        "sm_clock_mhz": np.full(n, 1870.0),
        "utilization": np.full(n, 0.5),
        "power_limit_w": np.full(n, 700.0),
        "low_power": np.zeros(n, dtype=bool),
        **cols,
    }
    return wire.CardBatch(rack=rack, card_index=np.arange(n), ts_s=ts, seq=0, publisher="sim", **base)


def test_ingest_maps_rack_cards_to_site_cards_levels_failures_and_rounds() -> None:
    site = example_site()
    state = TwinState(site)
    clock = SiteClock(1.0)
    acks: list[wire.Acknowledgement] = []
    ing = Ingest(site, state, clock, on_ack=acks.append)
    power = np.full(64, 300.0)
    power[5] = 0.0
    clock_mhz = np.full(64, 1870.0)
    clock_mhz[5] = 0.0  # card 5 of r1: 0 W at 0 MHz while awake = failed
    ing.handle(cards_msg("r1", T0, power_w=power, sm_clock_mhz=clock_mhz))
    ing.handle(wire.PduReading(rack="r1", power_w=30_000.0, ts_s=T0, seq=0, publisher="sim"))
    ing.handle(cards_msg("r1", T0 + 1))  # a second batch of r1: the first round is folded in
    assert ing.stats.rounds == 1
    assert state.card_failed[64 + 5] and not state.card_failed[64 + 6]
    assert state.rack_power_w[1] == 30_000.0
    r = ing.flush()
    assert r is not None and ing.stats.rounds == 2
    assert clock.latest_ts_s == T0 + 1
    assert np.all(state.card_level[64:128] == 1)  # 1870 MHz is level 1
    # applied state overrides levels inferred from clocks (a card may run slower than commanded)
    applied = wire.AppliedState(
        rack="r1",
        card_index=np.arange(64),
        dvfs_level=np.full(64, 0),
        min_clock_mhz=np.full(64, 1210.0),
        max_clock_mhz=np.full(64, 1980.0),
        power_limit_w=np.full(64, 700.0),
        low_power=np.zeros(64, dtype=bool),
        last_command_id=None,
        ts_s=T0 + 1,
        seq=0,
        publisher="sim",
    )
    ing.handle(applied)
    ing.handle(cards_msg("r1", T0 + 2))
    ing.flush()
    assert np.all(state.card_level[64:128] == 0)
    # job events: rack-local cards become site cards
    spec = JobSpec(job_id="j1", n_cards=4, work_steps=100.0, step_time_s=1.0, compute_share=0.9)
    ing.handle(wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", T0 + 2, 0, "sim", job=spec))
    ing.handle(wire.JobEvent(wire.JobEventType.STARTED, "j1", T0 + 2, 1, "sim", cards={"r1": (0, 1), "r2": (3, 4)}))
    ing.handle(wire.JobEvent(wire.JobEventType.PHASE_CHANGED, "j1", T0 + 3, 2, "sim", phase=Phase.CHECKPOINT))
    snap = state.snapshot()
    assert snap.jobs[0].cards == (64, 65, 131, 132) and snap.jobs[0].phase == Phase.CHECKPOINT
    ack = wire.Acknowledgement("r1", uuid.uuid4(), wire.AckResult.APPLIED, T0 + 3, 0, "sim")
    ing.handle(ack)
    assert acks == [ack]


def test_ingest_carries_host_off_into_the_belief_and_keeps_it_when_a_batch_does_not_say() -> None:
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    off = np.zeros(64, dtype=bool)
    off[8:16] = True  # r2's second host (cards 8..15) is off: its cards are asleep at 0 W
    power = np.where(off, 0.0, 300.0)
    clock_mhz = np.where(off, 0.0, 1870.0)
    ing.handle(cards_msg("r2", T0, power_w=power, sm_clock_mhz=clock_mhz, low_power=off.copy(), host_off=off))
    ing.flush()
    snap = state.snapshot()
    assert np.flatnonzero(snap.card_host_off).tolist() == list(range(128 + 8, 128 + 16))
    assert not snap.card_failed[128 + 8 : 128 + 16].any()  # asleep, not failed
    # a batch without the column (an older publisher) leaves what was known
    ing.handle(cards_msg("r2", T0 + 1, power_w=power, sm_clock_mhz=clock_mhz, low_power=off.copy()))
    ing.flush()
    assert np.flatnonzero(state.snapshot().card_host_off).tolist() == list(range(128 + 8, 128 + 16))
    # the host is on again
    ing.handle(cards_msg("r2", T0 + 2, host_off=np.zeros(64, dtype=bool)))
    ing.flush()
    assert not state.snapshot().card_host_off.any()


def test_a_failed_card_stays_failed_while_its_host_is_off_and_reads_asleep() -> None:
    """On the wire a failed card reads 0 MHz and 0 W while awake; once its idle host is powered off it
    reads asleep at 0 W like its healthy neighbours. The belief keeps the failure until the host is
    on again (through MQTT the agent used to forget it and kept placing a job on the failed card)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    dead = np.zeros(64, dtype=bool)
    dead[6] = True  # card 6 of r1 (host 0 of the rack) has failed
    on = np.zeros(64, dtype=bool)
    ing.handle(
        cards_msg("r1", T0, power_w=np.where(dead, 0.0, 300.0), sm_clock_mhz=np.where(dead, 0.0, 1870.0), host_off=on)
    )
    ing.flush()
    assert np.flatnonzero(state.snapshot().card_failed).tolist() == [64 + 6]
    off = np.zeros(64, dtype=bool)
    off[:8] = True  # its host goes off: all of its cards read asleep at 0 W
    asleep: dict[str, Any] = dict(
        power_w=np.where(off, 0.0, 300.0), sm_clock_mhz=np.where(off, 0.0, 1870.0), low_power=off.copy()
    )
    ing.handle(cards_msg("r1", T0 + 1, host_off=off, **asleep))
    ing.flush()
    snap = state.snapshot()
    assert np.flatnonzero(snap.card_failed).tolist() == [64 + 6]  # still failed
    assert snap.card_host_off[64:72].all()
    # on again and repaired: the card reads healthy and the belief follows
    ing.handle(cards_msg("r1", T0 + 2, host_off=on))
    ing.flush()
    assert not state.snapshot().card_failed.any()


def test_json_log_lines_carry_their_fields() -> None:
    rec = logging.LogRecord("racktwin.agent", logging.INFO, __file__, 1, "decision", (), None)
    rec.fields = {"cycle": 3, "status": "optimal"}
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["msg"] == "decision" and doc["cycle"] == 3 and doc["status"] == "optimal" and doc["level"] == "info"


def _cdu(rack: str, ts: float) -> wire.CduReading:
    return wire.CduReading(
        rack=rack,
        supply_temp_c=30.0,
        return_temp_c=40.0,
        flow_lpm=128.0,
        delta_pressure_pa=0.0,
        pump_power_w=100.0,
        ts_s=ts,
        seq=0,
        publisher="sim",
    )


def test_a_cdu_reading_made_without_its_pump_speed_is_unknown_as_on_the_wire() -> None:
    """A CduReading made in code without ``pump_speed_frac`` means what the wire's absent field means:
    unknown (it was 1.0, "full speed", so a pump the agent had slowed read as running at full speed
    and as weak). The belief keeps the last speed reported and says it is not reported now."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    assert _cdu("r1", T0).pump_speed_frac is None and math.isnan(LoopReading(30.0, 40.0, 100.0, 500.0).pump_speed_frac)
    ing.handle(dataclasses.replace(_cdu("r1", T0), pump_speed_frac=0.5))
    ing.flush()
    snap = state.snapshot()
    assert snap.rack_pump_speed_reported is not None and snap.rack_pump_speed_reported[1]
    assert snap.rack_pump_speed_frac[1] == 0.5
    ing.handle(_cdu("r1", T0 + 1.0))
    ing.flush()
    snap = state.snapshot()
    assert snap.rack_pump_speed_reported is not None and not snap.rack_pump_speed_reported[1]
    assert snap.rack_pump_speed_frac[1] == 0.5  # the last reported, not full speed
    ing.handle(_cdu("r1", T0 + 2.0))
    r = ing.flush()  # what the estimator gets: unknown too (it takes a speed of 0 for full speed)
    assert r is not None and r.racks[0].loop is not None and math.isnan(r.racks[0].loop.pump_speed_frac)
    assert "pump_speed_percent" not in json.loads(wire.encode(_cdu("r1", T0)))  # absent on the wire too


def test_a_card_exporter_lagging_behind_its_racks_cdu_and_pdu_makes_the_rack_stale() -> None:
    """Rack r0's card batches arrive 60 s behind its CDU and PDU readings. Merged into one round
    they took the newest time, so the cards looked fresh and a hung exporter never made the rack
    stale; each part keeps its own time, in the belief and in what goes to the estimator."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    merger = RoundMerger()
    whole: list[Readings] = []
    for i in range(120):
        for r in range(site.n_racks):
            ts = T0 + i
            ing.handle(cards_msg(f"r{r}", ts - 60.0 if r == 0 else ts))
            ing.handle(_cdu(f"r{r}", ts))
            ing.handle(wire.PduReading(rack=f"r{r}", power_w=40_000.0, ts_s=ts, seq=0, publisher="sim"))
        readings = ing.flush()
        assert readings is not None
        whole.extend(merger.add(readings))
        wall.t += 1.0
    now = clock.now()
    assert now is not None
    assert state.card_last_seen_s[0] == T0 + 59.0 and state.rack_loop_seen_s[0] == T0 + 119.0
    assert state.stale_racks(now, 30.0) == (0,)
    r0 = whole[-1].racks[0]
    assert r0.time_s == T0 + 118.0 and r0.part_time_s("cards") == T0 + 58.0 and r0.part_time_s("pdu") == T0 + 118.0


def test_readings_stamped_far_ahead_are_not_taken_into_the_belief() -> None:
    """Rack r3 stamps one round an hour ahead: its readings would keep it fresh for an hour (and
    make every newer reading look late); they are dropped. A job event stamped ahead still
    happened: it is taken, at the site's time."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(1.0, infer=True, wall=wall)
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    for i in range(40):
        for r in range(site.n_racks):
            ts = T0 + i + (3600.0 if (r == 3 and i == 20) else 0.0)
            ing.handle(cards_msg(f"r{r}", ts, temp_c=np.full(64, 50.0 + 0.01 * i)))
            ing.handle(_cdu(f"r{r}", ts))
        ing.flush()
        wall.t += 1.0
    assert ing.stats.ahead == 2 and clock.ahead_ignored == 2
    assert state.card_last_seen_s.max() == T0 + 39.0 and state.late_count == 0
    assert state.card_die_temp_c[3 * 64] == pytest.approx(50.39)
    spec = JobSpec(job_id="j1", n_cards=4, work_steps=100.0, step_time_s=1.0, compute_share=0.9)
    ing.handle(wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", T0 + 7200.0, 0, "sim", job=spec))
    assert state.jobs["j1"].last_event_s == pytest.approx(clock.now() or 0.0, abs=1e-6)


def _scheduler_an_hour_ahead() -> tuple[FakeWall, TwinState, Ingest, JobSpec, float, wire.JobEvent]:
    """An ingest on the example site whose scheduler's clock runs an hour (``ahead``) ahead: job
    "j1" (4 cards) and its ``started`` event, stamped a second after ``ahead``, on r1's cards 0-3."""
    site = example_site()
    wall = FakeWall()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0, infer=False, wall=wall))
    spec = JobSpec(job_id="j1", n_cards=4, work_steps=100.0, step_time_s=1.0, compute_share=0.9)
    ahead = T0 + 3600.0
    started = wire.JobEvent(wire.JobEventType.STARTED, "j1", ahead + 1.0, 1, "sched", cards={"r1": (0, 1, 2, 3)})
    return wall, state, ing, spec, ahead, started


def test_job_events_stamped_far_ahead_keep_their_order() -> None:
    """A scheduler whose clock runs an hour ahead: its events are dated at the site's now, but a
    copy of its ``started`` (QoS 1 delivers at least once) is still the same start, and an older
    ``phase`` overtaken by a newer one is still older (dated at now, the copy looked like a restart
    and reset the running job's phase)."""
    wall, state, ing, spec, ahead, started = _scheduler_an_hour_ahead()
    events = [
        wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", ahead, 0, "sched", job=spec),
        started,
        wire.JobEvent(wire.JobEventType.PHASE_CHANGED, "j1", ahead + 9.0, 3, "sched", phase=Phase.CHECKPOINT),
        started,  # the same start again
        wire.JobEvent(wire.JobEventType.PHASE_CHANGED, "j1", ahead + 5.0, 2, "sched", phase=Phase.COMPUTE),
    ]
    for i, ev in enumerate(events):
        ing.handle(cards_msg("r0", T0 + i))
        ing.handle(ev)
        wall.t += 1.0
    assert ing.stats.ahead == len(events) and ing.stats.job_events == len(events)
    info = state.jobs["j1"]
    assert info.state == "running" and info.cards == (64, 65, 66, 67) and info.phase == Phase.CHECKPOINT
    assert T0 + 2.0 <= info.last_event_s <= T0 + 3.0  # the site's time, not an hour ahead


def test_a_first_message_from_a_publisher_far_ahead_does_not_anchor_the_site_clock() -> None:
    """Rack r5's BMC runs an hour ahead and happens to publish first. The clock used to anchor there
    and, as that BMC kept publishing, every other rack read as an hour behind: stale, at fail-safe
    caps for good. The first timeline is confirmed by a majority as forward jumps are: the messages
    behind it outnumber it, so the clock steps back to them and only r5 goes stale."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(1.0, infer=True, wall=wall)
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    order = [5, 0, 1, 2, 3, 4, 6, 7]
    for i in range(40):
        for r in order:
            ts = T0 + i + (3600.0 if r == 5 else 0.0)
            ing.handle(cards_msg(f"r{r}", ts))
            ing.handle(_cdu(f"r{r}", ts))
            ing.handle(wire.PduReading(rack=f"r{r}", power_w=40_000.0, ts_s=ts, seq=0, publisher="sim"))
        ing.flush()
        wall.t += 1.0
        if i == 2:
            now = clock.now()
            assert now is not None and now < T0 + 10.0 and state.stale_racks(now, 30.0) == ()
    now = clock.now()
    assert now is not None
    assert now == pytest.approx(T0 + 40.0, abs=1e-6) and clock.corrections == 1 and clock.jumps == 0
    assert state.stale_racks(now, 30.0) == (5,)
    assert state.card_last_seen_s.max() == T0 + 39.0


def test_a_publisher_far_behind_does_not_outvote_the_first_timeline() -> None:
    """The other way round: the first message is on the site's time and one publisher lags an hour
    behind. It is outnumbered: the clock stays."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)  # 20 site s per wall s
    for i in range(60):
        clock.observe(T0 + i)
        assert not clock.observe(T0 - 3600.0 + i)
        clock.observe(T0 + i + 0.5)
        wall.t += 0.05
    assert clock.corrections == 0 and clock.now() == pytest.approx(T0 + 59.5 + 1.0, abs=1e-6)


def test_a_card_asleep_at_0_mhz_and_0_w_has_not_failed() -> None:
    """A rack reports a dead card as awake at 0 MHz and 0 W; a card in low-power idle may read 0 MHz and
    0 W too: asleep, not failed (a failed card is never commanded, placed on or woken)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    power, clock_mhz, low = np.full(64, 300.0), np.full(64, 1870.0), np.zeros(64, dtype=bool)
    power[[3, 4]] = 0.0
    clock_mhz[[3, 4]] = 0.0
    low[3] = True  # card 3 asleep, card 4 awake: dead
    ing.handle(cards_msg("r0", T0, power_w=power, sm_clock_mhz=clock_mhz, low_power=low))
    ing.flush()
    assert state.card_failed[:8].tolist() == [False, False, False, False, True, False, False, False]


def test_a_second_pdu_or_facility_reading_before_a_flush_folds_the_first_in_first() -> None:
    """Two readings of one kind of one rack (or of the facility) in one burst are two rounds: the first
    is folded into the belief and handed to the estimator before the second, not overwritten by it."""
    site = example_site()
    state = TwinState(site)
    rounds: list[Readings] = []
    ing = Ingest(site, state, SiteClock(1.0), on_round=rounds.append)
    for i, kw in enumerate((30_000.0, 31_000.0)):
        ing.handle(wire.PduReading(rack="r2", power_w=kw, ts_s=T0 + i, seq=i, publisher="sim"))
    fac = [
        wire.FacilityReading(
            ambient_temp_c=20.0 + i,
            supply_temp_c=30.0,
            return_temp_c=38.0,
            cooling_power_w=10_000.0,
            it_power_w=300_000.0,
            facility_power_w=320_000.0,
            supply_setpoint_c=30.0,
            ts_s=T0 + 2 + i,
            seq=i,
            publisher="sim",
        )
        for i in range(2)
    ]
    for m in fac:
        ing.handle(m)
    ing.flush()
    pdus = [(rr.time_s - T0, rr.pdu.power_w) for r in rounds for rr in r.racks if rr.pdu is not None]
    assert pdus == [(0.0, 30_000.0), (1.0, 31_000.0)]
    ambients = [r.facility.ambient_temp_c for r in rounds if r.facility is not None]
    assert ambients == [20.0, 21.0]


def test_a_copy_of_a_start_stamped_far_ahead_is_not_a_restart() -> None:
    """A scheduler an hour ahead sends ``started`` twice (QoS 1): the copy, stamped as the original,
    is dated as the original, so the belief takes it for the same start: the job never left its
    cards (a restart would mark them released, as by a job that ended)."""
    wall, state, ing, spec, ahead, started = _scheduler_an_hour_ahead()
    for i, ev in enumerate([wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", ahead, 0, "sched", job=spec), started]):
        ing.handle(cards_msg("r0", T0 + i))
        ing.handle(ev)
        wall.t += 1.0
    first = state.jobs["j1"].last_event_s
    ing.handle(cards_msg("r0", T0 + 2))
    ing.handle(started)  # the copy
    assert state.jobs["j1"].last_event_s == first
    assert state.jobs["j1"].state == "running"
    assert np.all(state.snapshot().card_released_s[64:68] == -np.inf)


def _pdu_round(t: float, *racks: int) -> Readings:
    return Readings(time_s=t, racks=tuple(RackReading(rack=r, time_s=t, pdu=PduReading(40_000.0)) for r in racks))


def test_after_the_clock_stepped_back_parts_stamped_at_the_new_now_are_merged_into_their_round() -> None:
    """The merger holds r0's round at T0 + 10 when the clock steps back to T0 + 5: that round is the
    old timeline's and goes out at once; r1's part stamped T0 + 5 is on the new timeline (the clock's
    now) and waits for the rest of its round (r2), which goes out whole once a later one begins."""
    merger = RoundMerger()
    assert merger.add(_pdu_round(T0 + 10.0, 0)) == []
    out, new = merger.step_back(_pdu_round(T0 + 5.0, 1), T0 + 5.0)
    assert [(r.time_s - T0, [rr.rack for rr in r.racks]) for r in out] == [(10.0, [0])] and new == []
    assert merger.add(_pdu_round(T0 + 5.0, 2)) == []
    out = merger.add(_pdu_round(T0 + 6.0, 0))
    assert [(r.time_s - T0, [rr.rack for rr in r.racks]) for r in out] == [(5.0, [1, 2])]


def test_after_the_clock_stepped_back_a_job_event_stamped_far_ahead_is_dated_at_the_new_now() -> None:
    """A job known on the old timeline (its ``submitted`` at T0 + 5); the site's clock steps back 600 s
    (a restarted simulator); then the job's ``started`` comes stamped an hour ahead of the new time. It
    is dated at the new timeline's now: the dates of the old timeline are forgotten at the step (kept,
    the start was dated after the old ``submitted``, ~600 s in the new timeline's future, and the
    belief took the job as started 10 minutes from now)."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    state = TwinState(site)
    dated: list[float] = []
    ing = Ingest(site, state, clock, on_event=lambda ev: dated.append(ev.time_s))
    spec = JobSpec(job_id="j1", n_cards=4, work_steps=100.0, step_time_s=1.0, compute_share=0.9)
    for i in range(10):
        ing.handle(cards_msg("r0", T0 + i))
        if i == 5:
            ing.handle(wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", T0 + 5.0, 0, "sim", job=spec))
        wall.t += 0.05
    assert dated == [T0 + 5.0]
    wall.t += 2.0  # the site restarts 600 s back
    for i in range(12):
        ing.handle(cards_msg("r0", T0 - 600.0 + i))
        wall.t += 0.05
    assert clock.corrections == 1
    now = clock.now()
    assert now is not None and T0 - 590.0 < now < T0 - 580.0
    started = wire.JobEvent(wire.JobEventType.STARTED, "j1", now + 3600.0, 1, "sched", cards={"r1": (0, 1, 2, 3)})
    ing.handle(started)
    assert ing.stats.ahead == 1
    assert dated[-1] == now  # the new timeline's now (was: just after T0 + 5, 594 s ahead of it)
    assert state.jobs["j1"].last_event_s == now


def _facility(ts: float) -> wire.FacilityReading:
    return wire.FacilityReading(
        ambient_temp_c=20.0,
        supply_temp_c=30.0,
        return_temp_c=38.0,
        cooling_power_w=10_000.0,
        it_power_w=300_000.0,
        facility_power_w=320_000.0,
        supply_setpoint_c=30.0,
        ts_s=ts,
        seq=0,
        publisher="sim",
    )


def _applied(rack: str, cards: list[int], levels: list[int], ts: float) -> wire.AppliedState:
    n = len(cards)
    return wire.AppliedState(
        rack=rack,
        card_index=np.asarray(cards, dtype=np.int64),
        dvfs_level=np.asarray(levels, dtype=np.int64),
        min_clock_mhz=np.full(n, 1210.0),
        max_clock_mhz=np.full(n, 1980.0),
        power_limit_w=np.full(n, 700.0),
        low_power=np.zeros(n, dtype=bool),
        last_command_id=None,
        ts_s=ts,
        seq=0,
        publisher="sim",
    )


def test_ingest_keeps_the_level_and_power_limit_each_rack_confirmed_applying() -> None:
    """A rack's retained applied state says, per card, the level and power limit it applied (at once,
    telemetry up to a period later): kept per site card (``applied_level``, -1, and
    ``applied_power_limit_w``, NaN, where no rack said), what the guard keeps a card no command reaches
    at (``agent.guard``, step 3a); an undefined or non-positive limit says nothing."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    assert (ing.applied_level == -1).all() and np.isnan(ing.applied_power_limit_w).all()
    msg = _applied("r1", [0, 1, 2, 3], [0, 2, 4, 7], T0)
    msg = dataclasses.replace(msg, power_limit_w=np.array([450.0, math.nan, 0.0, 700.0]))
    ing.handle(msg)
    cpr = site.cards_per_rack
    assert ing.applied_level[cpr : cpr + 4].tolist() == [0, 2, 4, 7]
    assert ing.applied_power_limit_w[[cpr, cpr + 3]].tolist() == [450.0, 700.0]
    assert np.isnan(ing.applied_power_limit_w[[cpr + 1, cpr + 2]]).all()  # undefined, 0 W: not confirmed
    others = np.ones(site.n_cards, dtype=bool)
    others[cpr : cpr + 4] = False
    assert (ing.applied_level[others] == -1).all() and np.isnan(ing.applied_power_limit_w[others]).all()


def test_ingest_keeps_the_low_power_state_each_rack_confirmed_applying() -> None:
    """A rack's retained applied state says, per card, whether it is in low-power idle (a wake it applied
    at once, telemetry up to a period later): kept per site card (``applied_low_power``: 1.0 asleep, 0.0
    awake, NaN where no rack said), the newest applied state replacing an older one, what the guard keeps
    an idle card no command reaches awake by (``agent.guard``, step 3a)."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    assert np.isnan(ing.applied_low_power).all()
    asleep = dataclasses.replace(_applied("r1", [0, 1, 2], [7, 7, 7], T0), low_power=np.array([True, True, False]))
    ing.handle(asleep)
    cpr = site.cards_per_rack
    assert ing.applied_low_power[cpr : cpr + 3].tolist() == [1.0, 1.0, 0.0]
    woken = dataclasses.replace(_applied("r1", [1], [7], T0 + 1.0), low_power=np.array([False]))
    ing.handle(woken)  # card 1 woken: confirmed awake before its telemetry shows it
    assert ing.applied_low_power[cpr : cpr + 3].tolist() == [1.0, 0.0, 0.0]
    others = np.ones(site.n_cards, dtype=bool)
    others[cpr : cpr + 3] = False
    assert np.isnan(ing.applied_low_power[others]).all()


def test_a_round_is_dated_at_its_newest_stamp_also_one_of_the_facility_alone() -> None:
    """A round of a rack's readings is dated at their stamp, and so is a round of the facility alone
    (every rack's exporters are silent and the facility still reports); the belief's time moves with
    them (not left where the last rack reading put it)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(cards_msg("r0", T0))
    r = ing.flush()
    assert r is not None and r.time_s == T0 and state.snapshot().time_s == T0
    ing.handle(_facility(T0 + 3.0))
    r = ing.flush()
    assert r is not None and r.time_s == T0 + 3.0 and r.racks == () and r.facility is not None
    assert state.snapshot().time_s == T0 + 3.0


def test_an_acks_timestamp_drives_the_site_clock() -> None:
    """Every message's stamp drives the site clock, an ack's too (a restarted agent's persistent session
    delivers the acks queued while it was away before any telemetry)."""
    site = example_site()
    clock = SiteClock(1.0)
    acks: list[wire.Acknowledgement] = []
    ing = Ingest(site, TwinState(site), clock, on_ack=acks.append)
    ack = wire.Acknowledgement("r1", uuid.uuid4(), wire.AckResult.APPLIED, T0, 0, "sim")
    ing.handle(ack)
    assert acks == [ack]
    assert clock.latest_ts_s == T0 and clock.now() is not None


def test_an_applied_state_naming_cards_or_levels_the_site_lacks_sets_no_level() -> None:
    """An applied state made in code (a rack bridge; the codec refuses these on the wire) that names
    card 64 of a 64-card rack, level -1 or a level past the table: none of it is taken. r1's cards
    keep the levels their rack applied before, r2's card 0 (site card 128, "card 64 of r1") its
    level read from its clock (1870 MHz: level 1)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(_applied("r1", [0, 1], [2, 2], T0))
    ing.handle(_applied("r1", [0, 1, 64], [-1, site.card.n_levels, 0], T0))
    ing.handle(cards_msg("r1", T0))
    ing.handle(cards_msg("r2", T0))
    ing.flush()
    assert state.card_level[64:66].tolist() == [2, 2]
    assert state.card_level[128] == 1


def test_a_negative_clock_reading_changes_no_cards_failure() -> None:
    """A clock of -1 MHz (a broken exporter's value) is no clock: a live card reading it at 0 W is not
    taken for failed, a dead card reading it at 300 W is not taken for alive again."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    power, clock_mhz = np.full(64, 300.0), np.full(64, 1870.0)
    power[0], clock_mhz[0] = 0.0, 0.0  # card 0: awake at 0 MHz and 0 W, dead
    ing.handle(cards_msg("r0", T0, power_w=power, sm_clock_mhz=clock_mhz))
    ing.flush()
    assert state.card_failed[:2].tolist() == [True, False]
    power, clock_mhz = np.full(64, 300.0), np.full(64, 1870.0)
    power[1] = 0.0
    clock_mhz[:2] = -1.0
    ing.handle(cards_msg("r0", T0 + 1.0, power_w=power, sm_clock_mhz=clock_mhz))
    ing.flush()
    assert state.card_failed[:2].tolist() == [True, False]


def test_a_job_events_cards_are_the_site_cards_of_its_racks_in_order() -> None:
    """A job event (made in code: the codec refuses such cards on the wire) places the job on
    rack-local cards of several racks, listed out of order, with a card past its rack's last and a
    rack the site lacks: the belief holds the site cards that exist, in order (card 64 of r1 is not
    r2's card 0)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    spec = JobSpec(job_id="j1", n_cards=4, work_steps=100.0, step_time_s=1.0, compute_share=0.9)
    ing.handle(wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", T0, 0, "sim", job=spec))
    cards = {"r2": (4, 3), "r1": (1, 0, 64), "r9": (0,)}
    ing.handle(wire.JobEvent(wire.JobEventType.STARTED, "j1", T0 + 1.0, 1, "sim", cards=cards))
    assert state.jobs["j1"].cards == (64, 65, 131, 132)
    assert state.jobs["j1"].phase == Phase.WAITING  # a start that does not say its phase: starting up


def test_a_restart_stamped_after_the_start_is_a_restart_while_the_site_clock_stands() -> None:
    """A scheduler an hour ahead restarts j1 on other cards 5 s (its time) after starting it, both
    events arriving before the site's clock moves on: each is dated after the one before it, so the
    belief takes the restart for one (dated at the same now, it looked like a copy of the start and
    the job stayed on its old cards)."""
    _wall, state, ing, spec, ahead, started = _scheduler_an_hour_ahead()
    ing.handle(cards_msg("r0", T0))
    ing.handle(wire.JobEvent(wire.JobEventType.SUBMITTED, "j1", ahead, 0, "sched", job=spec))
    ing.handle(started)
    assert state.jobs["j1"].cards == (64, 65, 66, 67)
    ing.handle(wire.JobEvent(wire.JobEventType.STARTED, "j1", ahead + 6.0, 2, "sched", cards={"r2": (0, 1, 2, 3)}))
    assert ing.stats.ahead == 3
    assert state.jobs["j1"].cards == (128, 129, 130, 131)


def test_the_dates_of_the_jobs_heard_from_last_are_kept_when_many_jobs_are() -> None:
    """With more jobs than the ingest remembers the dates of (stamped far ahead), it forgets the job
    heard from longest ago: a copy of the ``started`` of a job heard from recently (``j0``: started
    after 4095 other jobs were submitted) or last (``jx``) is still a copy, not a restart that
    releases its cards."""
    wall, state, ing, spec, ahead, started = _scheduler_an_hour_ahead()
    ing.handle(cards_msg("r0", T0))

    def submitted(job_id: str) -> wire.JobEvent:
        return wire.JobEvent(
            wire.JobEventType.SUBMITTED, job_id, ahead, 0, "sched", job=dataclasses.replace(spec, job_id=job_id)
        )

    for i in range(_DATES_KEPT):
        ing.handle(submitted(f"j{i}"))
    j0 = dataclasses.replace(started, job_id="j0")
    ing.handle(j0)
    ing.handle(submitted("jx"))
    jx = wire.JobEvent(wire.JobEventType.STARTED, "jx", ahead + 1.0, 1, "sched", cards={"r2": (0, 1, 2, 3)})
    ing.handle(jx)
    # the site's clock moves on (less than the wall second that would confirm the scheduler's timeline
    # as the site's): a forgotten job's copy would be dated at the new now, later than its start
    wall.t += 0.5
    ing.handle(j0)
    ing.handle(jx)
    assert state.jobs["j0"].state == "running" and state.jobs["jx"].state == "running"
    assert np.all(state.snapshot().card_released_s[[64, 65, 66, 67, 128, 129, 130, 131]] == -np.inf)


def test_a_facility_reading_stamped_at_the_new_now_is_merged_into_its_round() -> None:
    """As a rack's part (above): a facility reading stamped at the clock's new now, when it stepped
    back, is on the new timeline and waits for the rest of its round; only the old round goes out."""
    merger = RoundMerger()
    assert merger.add(_pdu_round(T0 + 10.0, 0)) == []
    fac = FacilityReading(T0 + 5.0, 20.0, 30.0, 38.0, 10_000.0, 300_000.0, 320_000.0, 30.0)
    out, new = merger.step_back(Readings(time_s=T0 + 5.0, racks=(), facility=fac), T0 + 5.0)
    assert [r.time_s - T0 for r in out] == [10.0] and new == []
    assert merger.add(_pdu_round(T0 + 5.0, 1)) == []
    out = merger.add(_pdu_round(T0 + 6.0, 0))
    assert [(r.time_s - T0, [rr.rack for rr in r.racks], r.facility) for r in out] == [(5.0, [1], fac)]


def test_a_racks_round_split_by_a_newer_cdu_reading_gives_the_estimator_both_loop_readings() -> None:
    """r0's PDU and CDU report at T0, its cards at T0 + 1, then its CDU again at T0 + 1: two partial
    rounds (a second reading of a kind folds the first in) of one time stamp. The estimator gets both
    loop readings, in the order of their stamps, each part at its own time (the PDU's is T0, not made
    fresh by the round's). Merged into one round as readings of one stamp, the loop reading at T0
    never reached it."""
    site = example_site()
    merger = RoundMerger()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    ing.handle(wire.PduReading(rack="r0", power_w=40_000.0, ts_s=T0, seq=0, publisher="sim"))
    ing.handle(_cdu("r0", T0))
    ing.handle(cards_msg("r0", T0 + 1.0))
    ing.handle(dataclasses.replace(_cdu("r0", T0 + 1.0), flow_lpm=120.0))
    ing.flush()
    assert ing.stats.rounds == 2
    ing.handle(cards_msg("r0", T0 + 2.0))
    ing.flush()
    assert len(rounds) == 2
    loops = [(rr.part_time_s("loop"), rr.loop.flow_lpm) for r in rounds for rr in r.racks if rr.loop is not None]
    assert loops == [(T0, 128.0), (T0 + 1.0, 120.0)]
    (rr,) = rounds[0].racks
    assert rr.pdu is not None and rr.part_time_s("pdu") == T0
    assert rr.cards is not None and rr.part_time_s("cards") == T0 + 1.0


def _rack_applied(rack: str, ts: float, level: int, *, limit_w: float = 700.0, low: bool = False) -> wire.AppliedState:
    """A rack's applied state: every one of its 64 cards at ``level``, ``limit_w`` and ``low``."""
    msg = _applied(rack, list(range(64)), [level] * 64, ts)
    return dataclasses.replace(msg, power_limit_w=np.full(64, limit_w), low_power=np.full(64, low))


def past_the_bound(ing: Ingest, from_s: float, rack: str = "r7") -> float:
    """PDU readings of ``rack`` every 5 site s (the site clock follows: never too far ahead of it) from the
    site's now until twice the telemetry deadline after ``from_s``: past the bound a disproval by a reading
    stamped ``from_s`` waits for a late applied state to explain it (the rack's confirmation margin plus
    the deadline), so that it is counted. Returns the last stamp."""
    t = ing.clock.now_or(from_s)
    while t < from_s + 2.0 * ing.applied.telemetry_deadline_s:
        t += 5.0
        ing.handle(wire.PduReading(rack=rack, power_w=20_000.0, ts_s=t, seq=0, publisher="sim"))
    ing.flush()
    return t


def _confirmed_level_5(clock: SiteClock | None = None) -> tuple[TwinState, Ingest]:
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, clock or SiteClock(1.0))
    ing.handle(_rack_applied("r0", T0 + 10.0, 5))  # level 5: 1430 MHz at most
    return state, ing


def test_a_confirmed_level_a_later_reading_runs_faster_than_is_forgotten() -> None:
    """A card never runs faster than its applied level's clock: the retained applied state outlives a
    rack that reset its cards to the top clock (or an operator's change) and did not republish it, and a
    reading stamped a telemetry period after it at the top clock disproves its level. Kept, the belief
    had the card at level 5 for good (planned at that level's power) and the diff, counting from the
    confirmed level, never commanded it again."""
    state, ing = _confirmed_level_5()
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.flush()
    assert np.all(state.card_level[:64] == 0)  # from the clock
    assert np.all(ing.applied_level[:64] == -1)  # the diff counts from the belief's level again
    assert np.all(ing.applied_level[64:] == -1)  # (nothing confirmed elsewhere)
    # the confirmed limit and sleep were not disproved: the readings show the same
    assert np.all(ing.applied_power_limit_w[:64] == 700.0) and np.all(ing.applied_low_power[:64] == 0.0)
    # the rack confirms again (the agent commanded it): taken, and kept by readings that agree
    ing.handle(_rack_applied("r0", T0 + 21.0, 5))
    ing.handle(cards_msg("r0", T0 + 25.0, sm_clock_mhz=np.full(64, 1430.0)))
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5) and np.all(state.card_level[:64] == 5)
    past_the_bound(ing, T0 + 25.0)
    assert ing.stats.applied_levels_disproved == 64  # level 5 again: it does not explain the top clock
    assert ing.stats.applied_disproved == {("level", "r0"): 64}


def test_a_reading_taken_before_a_confirmed_slow_down_applied_does_not_disprove_it() -> None:
    """Just after a confirmed slow-down, telemetry taken before it applied still shows the faster clock:
    a reading stamped within the margin of the applied state keeps the confirmation."""
    state, ing = _confirmed_level_5()
    ing.handle(cards_msg("r0", T0 + 10.4, sm_clock_mhz=np.full(64, 1980.0)))
    ing.handle(cards_msg("r0", T0 + 9.0, sm_clock_mhz=np.full(64, 1980.0)))  # late, stamped before
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5) and np.all(state.card_level[:64] == 5)


def test_a_card_running_below_or_near_its_confirmed_levels_clock_keeps_the_level() -> None:
    """A capped or throttled card runs below its level's clock: that disproves nothing (its level is the
    confirmed one, not its clock's). Nor does a clock within half a DVFS step above it (1430 MHz + 50)."""
    state, ing = _confirmed_level_5()
    clock_mhz = np.full(64, 1210.0)  # throttled to the bottom clock
    clock_mhz[1] = 1480.0  # 5 MHz under halfway to level 4 (1540 MHz)
    clock_mhz[2] = 1430.0
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=clock_mhz))
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5) and np.all(state.card_level[:64] == 5)


def test_a_confirmed_sleep_or_limit_the_readings_disprove_is_forgotten_and_only_that() -> None:
    """A reading awake after the margin disproves a confirmed sleep, a reading's power limit apart from the
    confirmed one disproves that limit; what agrees stays confirmed."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(_rack_applied("r0", T0 + 10.0, 0, limit_w=500.0, low=True))
    low = np.ones(64, dtype=bool)
    low[0] = False  # card 0 reads awake
    limit_w = np.full(64, 500.0)
    limit_w[1] = 700.0  # card 1 reads the default limit
    clock_mhz = np.where(low, 0.0, 1980.0)
    ing.handle(cards_msg("r0", T0 + 10.5, low_power=low, power_limit_w=limit_w, sm_clock_mhz=clock_mhz))
    assert np.all(ing.applied_low_power[:64] == 1.0) and np.all(ing.applied_power_limit_w[:64] == 500.0)
    ing.handle(cards_msg("r0", T0 + 12.0, low_power=low, power_limit_w=limit_w, sm_clock_mhz=clock_mhz))
    ing.flush()
    assert np.isnan(ing.applied_low_power[0]) and np.all(ing.applied_low_power[1:64] == 1.0)
    assert np.isnan(ing.applied_power_limit_w[1]) and ing.applied_power_limit_w[0] == 500.0
    assert np.all(ing.applied_power_limit_w[2:64] == 500.0) and np.all(ing.applied_level[:64] == 0)
    past_the_bound(ing, T0 + 12.0)
    assert (ing.stats.applied_low_power_disproved, ing.stats.applied_limits_disproved) == (1, 1)


def test_an_applied_state_from_an_earlier_run_stamped_far_ahead_is_disproved_by_the_readings() -> None:
    """A retained applied state from an earlier run of the rack on another timeline (stamped an hour ahead
    of the site's time) cannot be judged by the stamps: the readings disprove it at once."""
    wall = FakeWall()
    state, ing = _confirmed_level_5(SiteClock(1.0, wall=wall))
    ing.handle(cards_msg("r0", T0 - 3600.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.flush()
    assert np.all(ing.applied_level[:64] == -1) and np.all(state.card_level[:64] == 0)


def test_a_stuck_cards_frozen_clock_does_not_disprove_its_confirmed_level() -> None:
    """A card whose sensor froze before its slow-down repeats the faster clock: the belief holds it stuck,
    and its frozen reading disproves nothing (it would have the agent command it again and again)."""
    state, ing = _confirmed_level_5()
    rng = np.random.default_rng(1)
    for i in range(state.stuck_after_readings + 2):
        power = 300.0 + rng.uniform(-5.0, 5.0, 64)
        power[0], clock_mhz = 300.0, np.full(64, 1430.0)
        clock_mhz[0] = 1980.0  # card 0: frozen at the top clock
        ing.handle(cards_msg("r0", T0 + 10.4 + i * 0.1, power_w=power, sm_clock_mhz=clock_mhz))
        ing.handle(cards_msg("r1", T0 + 10.4 + i * 0.1, power_w=power))
        ing.flush()
    assert 0 in state.stuck_cards()
    power = np.where(np.arange(64) == 0, 300.0, 310.0)
    ing.handle(cards_msg("r0", T0 + 20.0, power_w=power, sm_clock_mhz=np.where(np.arange(64) == 0, 1980.0, 1430.0)))
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5)


def _every(ing: Ingest, rack: str, start_s: float, period_s: float, n: int, **cols: Unpack[CardColumns]) -> float:
    """``n`` card readings of ``rack`` every ``period_s`` from ``start_s``; returns the last one's stamp."""
    for i in range(n):
        ing.handle(cards_msg(rack, start_s + i * period_s, **cols))
    ing.flush()
    return start_s + (n - 1) * period_s


def test_a_rack_reading_every_5_s_keeps_a_confirmation_its_next_reading_taken_before_it_contradicts() -> None:
    """A rack that reads its cards every 5 s (or averages over its 5 s) sends, 3 s after it confirmed a
    slow-down and a raised power limit, a reading taken before they applied: the old clock and the old
    limit. The margin is 1.5 of the rack's reading interval, learnt from its stamps (7.5 s): that reading
    disproves nothing. With the fixed 1.5 s margin the agent forgot both, took the level from the old
    clock and commanded the rack again. A reading past the margin still disproves (a reset rack)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    old: CardColumns = {"sm_clock_mhz": np.full(64, 1980.0), "power_limit_w": np.full(64, 500.0)}
    last_s = _every(ing, "r0", T0, 5.0, 4, **old)  # level 0, limit 500 W
    ing.handle(_rack_applied("r0", last_s + 2.0, 5, limit_w=700.0))  # slowed to level 5, limit raised
    ing.handle(cards_msg("r0", last_s + 5.0, **old))  # 3 s after the applied state: taken before it
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5) and np.all(state.card_level[:64] == 5)
    assert np.all(ing.applied_power_limit_w[:64] == 700.0)
    assert (ing.stats.applied_levels_disproved, ing.stats.applied_limits_disproved) == (0, 0)
    assert ing.applied.reading_interval_s[0] == 5.0 and np.isnan(ing.applied.reading_interval_s[1])
    new: CardColumns = {"sm_clock_mhz": np.full(64, 1430.0), "power_limit_w": np.full(64, 700.0)}
    ing.handle(cards_msg("r0", last_s + 10.0, **new))  # the settings in force: agrees
    ing.handle(cards_msg("r0", last_s + 15.0, **old))  # 13 s after: reset to the defaults
    ing.flush()
    assert np.all(ing.applied_level[:64] == -1) and np.all(state.card_level[:64] == 0)
    assert np.all(np.isnan(ing.applied_power_limit_w[:64]))
    past_the_bound(ing, last_s + 15.0)
    assert (ing.stats.applied_levels_disproved, ing.stats.applied_limits_disproved) == (64, 64)


def test_a_rack_reading_every_second_keeps_the_1_5_s_margin() -> None:
    """At the 1 s period of the example sites (and of the in-process loop) the margin stays 1.5 s: a
    reading 0.8 s after the applied state keeps it, one 1.8 s after disproves it."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    last_s = _every(ing, "r0", T0, 1.0, 10, sm_clock_mhz=np.full(64, 1980.0))
    assert ing.applied.reading_interval_s[0] == 1.0
    ing.handle(_rack_applied("r0", last_s + 0.2, 5))
    ing.handle(cards_msg("r0", last_s + 1.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5)
    ing.handle(cards_msg("r0", last_s + 2.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.flush()
    assert np.all(ing.applied_level[:64] == -1)
    past_the_bound(ing, last_s + 2.0)
    assert ing.stats.applied_levels_disproved == 64


def test_a_racks_reading_interval_ignores_copies_late_readings_silences_and_a_clock_step_back() -> None:
    """The interval is the median of the rack's last gaps between reading stamps, once it has three (one
    odd gap is no period): a copy (the same stamp), a late reading (stamped before the newest: here one
    after every reading), a silence longer than the telemetry deadline and a missed reading now and then
    do not change it. When the site's clock steps back (a simulator restarted, here
    with another period) the new timeline's gaps count at once (the old timeline's stamps are forgotten:
    measured from them, every gap was negative until the new timeline caught up, 10 minutes here)."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    ing = Ingest(site, TwinState(site), clock, telemetry_deadline_s=30.0)

    def read(ts_s: float, wall_s: float) -> None:
        wall.t += wall_s
        ing.handle(cards_msg("r0", ts_s))
        ing.flush()

    for i in range(4):
        read(T0 + 40.0 * i, 40.0)  # 40 s silent, three times: past the deadline
    assert np.isnan(ing.applied.reading_interval_s[0])
    read(T0 + 125.0, 5.0)
    read(T0 + 130.0, 5.0)
    assert np.isnan(ing.applied.reading_interval_s[0])  # two gaps: not known yet
    for ts_s in (T0 + 135.0, T0 + 140.0, T0 + 145.0, T0 + 155.0, T0 + 160.0):  # one missed
        read(ts_s, ts_s - (clock.now() or ts_s))
        read(ts_s, 0.0)  # a copy
        read(ts_s - 2.5, 0.0)  # late
        if ts_s == T0 + 135.0:
            assert ing.applied.reading_interval_s[0] == 5.0  # three gaps: known
    assert ing.applied.reading_interval_s[0] == 5.0 and np.isnan(ing.applied.reading_interval_s[1])
    wall.t += 3.0  # the site restarts 600 s back and reads its cards every 2 s
    for i in range(12):
        read(T0 - 600.0 + 2.0 * i, 2.0)
    assert clock.corrections == 1
    assert ing.applied.reading_interval_s[0] == 2.0


def test_a_rack_that_sends_its_cards_in_batches_per_host_learns_the_period_of_its_cards() -> None:
    """A batch may hold a subset of the rack's cards (docs/protocol.md): a rack whose hosts each send their
    own cards every 5 s, 0.2 s apart, has readings stamped 0.2 s apart but reads each card every 5 s. Its
    interval is 5 s and its margin 7.5 s: the next round, 3..4.4 s after a confirmed slow-down and taken
    before it, disproves nothing. Learnt from the gaps between any two batches of the rack, the interval
    was 0.2 s, the margin 1.5 s, and all 64 confirmations were forgotten and the cards commanded again."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    hosts = [np.arange(8 * h, 8 * h + 8) for h in range(8)]

    def round_at(ts_s: float, clock_mhz: float) -> None:
        for h, cards in enumerate(hosts):
            full = cards_msg("r0", ts_s + 0.2 * h, n=8, sm_clock_mhz=np.full(8, clock_mhz))
            ing.handle(dataclasses.replace(full, card_index=cards))
        ing.flush()

    for i in range(5):
        round_at(T0 + 5.0 * i, 1980.0)  # level 0
    assert ing.applied.reading_interval_s[0] == 5.0
    last_s = T0 + 20.0
    ing.handle(_rack_applied("r0", last_s + 2.0, 5))  # slowed to level 5
    round_at(last_s + 5.0, 1980.0)  # taken before it applied
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_levels_disproved == 0
    round_at(last_s + 10.0, 1980.0)  # 8..9.4 s after: the rack was reset
    assert np.all(ing.applied_level[:64] == -1)
    past_the_bound(ing, last_s + 11.4)
    assert ing.stats.applied_levels_disproved == 64


def test_a_journal_busy_when_the_open_commands_are_taken_up_is_tried_again_not_fatal(tmp_path: Path) -> None:
    """When the agent starts to command, it takes up the journal's open commands (expired ones closed,
    the others sent again). Another process holding the journal's write lock past the busy timeout made
    that a JournalError: raised out of the health tick or the control loop it stopped the agent, and
    the take-up was marked done first, so it never came. Now it is logged and tried again at the next
    check (`/readyz` says why it waits): once the lock is free, the expired command is closed."""
    from agent.journal import Journal, NewCommand

    path = tmp_path / "j.sqlite"
    old = NewCommand(str(uuid.uuid4()), "r0", "racktwin/v1/x/racks/r0/cmd", b"{}", T0 - 40.0, T0 - 10.0)
    journal = Journal(path)  # the previous run's
    journal.record_decision(1, T0 - 40.0, "enforce", "optimal", 0.01, {}, [old])
    journal.close()
    wall = FakeWall()
    svc = _service(tmp_path, SiteClock(1.0, infer=False, wall=wall))
    other = None
    try:
        svc.clock.observe(T0)
        assert svc.clock.now() is not None
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        svc._take_up_journal_commands()  # raised JournalError
        assert svc.journal.command(old.command_id).state == "pending"  # type: ignore[union-attr]
        waiting = [r for r in svc.readiness() if r.startswith("journal (open commands not taken up yet)")]
        assert len(waiting) == 1 and "locked" in waiting[0], svc.readiness()  # /readyz says why
        other.execute("ROLLBACK")
        svc._take_up_journal_commands()  # the next check
        assert svc.journal.command(old.command_id).state == "expired"  # type: ignore[union-attr]
        assert svc.expired_on_resume == 1
        assert not [r for r in svc.readiness() if "open commands not taken up" in r]
    finally:
        if other is not None:
            other.close()
        svc.control._executor.shutdown(wait=True)
        svc.journal.close()
