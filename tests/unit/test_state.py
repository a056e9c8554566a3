"""TwinState: belief from the plant's readings and job events; freshness, stuck and bad sensors."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TypedDict, Unpack, cast

import numpy as np
import pytest
from readings_testing import card_batch, cards_of

from twin.plant import CardFailure, GarbageReadings, Plant, PlantConfig, SensorDropout, StuckSensor
from twin.readings import CardBatch, JobEvent, JobReading, LoopReading, PduReading, RackReading, Readings
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import JobSpec, Phase, PhaseModel

pytestmark = pytest.mark.unit

PHASES = PhaseModel(startup_s=5.0, restart_delay_s=20.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)


class JobFields(TypedDict, total=False):
    """The ``JobSpec`` fields a test here sets besides ``_job``'s."""

    priority: float
    min_throughput_frac: float


def _job(job_id: str, n: int, **kw: Unpack[JobFields]) -> JobSpec:
    return JobSpec(job_id, n, work_steps=1e6, step_time_s=1.0, compute_share=0.8, **kw)


def _feed(p: Plant, st: TwinState, seconds: float, dt: float = 1.0) -> None:
    end = p.time_s + seconds
    while p.time_s < end - 1e-9:
        p.step(dt)
        st.update(p.readings())
        st.apply_events(p.drain_events())


def test_state_follows_the_plant(small_site: SiteSpec) -> None:
    p = Plant(small_site, [_job("a", 16, priority=2.0, min_throughput_frac=0.9)], config=PlantConfig(phases=PHASES))
    st = TwinState(small_site)
    _feed(p, st, 60.0)
    tr = p.truth()
    np.testing.assert_allclose(st.card_power_w, tr.card_power_w, atol=15.0)
    np.testing.assert_allclose(st.card_die_temp_c, tr.die_temp_c, atol=2.5)
    np.testing.assert_allclose(st.rack_power_w, tr.rack_power_w, rtol=0.03)
    np.testing.assert_allclose(st.rack_return_temp_c, tr.rack_return_temp_c, atol=0.5)
    snap = st.snapshot()
    assert snap.time_s == p.time_s
    assert [j.job_id for j in snap.jobs] == ["a"]
    info = snap.jobs[0]
    assert info.phase == Phase.COMPUTE and info.priority == 2.0 and info.min_throughput_frac == 0.9
    assert info.cards == tuple(range(16)) and 0 < info.progress_frac < 1 and info.throughput_frac == 1.0
    assert snap.card_job[:16].tolist() == [0] * 16 and snap.card_job[16:].tolist() == [-1] * 16
    assert snap.facility is not None and snap.facility.facility_power_w > snap.facility.it_power_w
    # a snapshot is a copy
    snap.card_power_w[:] = 0
    assert st.card_power_w[0] > 0
    assert st.stale_racks(p.time_s, 5.0) == ()


def test_queue_requeue_and_finish_from_events(small_site: SiteSpec) -> None:
    a = _job("a", 32)
    b = JobSpec("b", 8, work_steps=20.0, step_time_s=1.0, compute_share=0.8, submit_time_s=10.0)
    fail = CardFailure(card=2, at_s=30.0, repair_after_s=60.0)
    p = Plant(small_site, [a, b], [fail], config=PlantConfig(phases=PHASES))
    st = TwinState(small_site)
    _feed(p, st, 15.0)
    assert [j.job_id for j in st.queue()] == ["b"] and st.jobs["a"].state == "running"
    _feed(p, st, 40.0)  # card 2 failed at 30 s; a requeued at 50 s; b fits beside the failed card
    assert bool(st.card_failed[2])
    assert [j.job_id for j in st.queue()] == ["a"] and st.jobs["a"].cards == ()
    assert st.jobs["b"].state == "running"
    _feed(p, st, 30.0)  # b finished at about 75 s
    assert "b" not in st.jobs and st.jobs_finished == 1
    _feed(p, st, 10.0)  # card 2 repaired at 90 s: a is placed again on all 32 cards
    assert st.jobs["a"].state == "running" and st.queue() == ()
    assert st.snapshot().card_job.tolist() == [0] * 32


def test_dropout_makes_a_rack_stale(small_site: SiteSpec) -> None:
    p = Plant(small_site, [_job("a", 32)], [SensorDropout(rack=1, start_s=20.0, end_s=40.0)], config=PlantConfig())
    st = TwinState(small_site)
    _feed(p, st, 30.0)
    assert st.stale_racks(p.time_s, 5.0) == (1,)
    assert st.stale_cards(p.time_s, 5.0) == tuple(range(16, 32))
    _feed(p, st, 15.0)
    assert st.stale_racks(p.time_s, 5.0) == ()


def test_stuck_rack_and_stuck_card_are_detected(small_site: SiteSpec) -> None:
    faults = [StuckSensor(rack=0, start_s=10.0, end_s=40.0), StuckSensor(rack=1, start_s=10.0, card=20)]
    p = Plant(small_site, [_job("a", 32)], faults, config=PlantConfig())
    st = TwinState(small_site, stuck_after_readings=10)
    _feed(p, st, 15.0)
    assert st.stuck_racks() == () and st.stuck_cards() == ()
    _feed(p, st, 10.0)
    assert st.stuck_racks() == (0,)
    assert st.stuck_cards() == (20,)
    assert st.snapshot().stuck_racks == (0,)
    _feed(p, st, 20.0)  # the rack recovers
    assert st.stuck_racks() == ()


def test_no_stuck_flags_when_nothing_changes_anywhere(small_site: SiteSpec) -> None:
    st = TwinState(small_site, stuck_after_readings=3)
    p = Plant(
        small_site,
        config=PlantConfig(noise=dataclasses.replace(PlantConfig().noise, power_sd_w=0.0, die_temp_sd_k=0.0)),
    )
    p.run(600.0, 10.0)  # steady idle site without noise: nothing moves
    for _ in range(6):
        st.update(p.readings())
    assert st.stuck_racks() == () and st.stuck_cards() == ()


def test_garbage_is_refused_and_goes_stale(small_site: SiteSpec) -> None:
    faults = [
        GarbageReadings(rack=1, start_s=10.0, mode="nan"),
        GarbageReadings(rack=0, start_s=10.0, mode="garbage", fraction=0.5),
    ]
    p = Plant(small_site, [_job("a", 32)], faults, config=PlantConfig(seed=2))
    st = TwinState(small_site)
    _feed(p, st, 9.0)
    before = st.card_die_temp_c.copy()
    _feed(p, st, 20.0)
    assert np.all(np.isfinite(st.card_die_temp_c))
    assert np.all(st.card_die_temp_c < 150.0) and np.all(st.card_power_w >= 0.0)
    np.testing.assert_array_equal(st.card_die_temp_c[16:], before[16:])  # only NaN since: kept
    assert st.invalid_count[16:].min() >= 19 and st.invalid_count[:16].sum() > 0
    assert 1 in st.stale_racks(p.time_s, 5.0)


def test_partial_rack_readings_from_separate_messages(small_site: SiteSpec) -> None:
    p = Plant(small_site, config=PlantConfig())
    p.step(1.0)
    full = p.readings()
    st = TwinState(small_site)
    cards_only = Readings(
        time_s=1.0, racks=tuple(RackReading(rack=r.rack, time_s=1.0, cards=r.cards) for r in full.racks)
    )
    st.update(cards_only)
    assert np.all(np.isfinite(st.card_power_w)) and np.all(np.isnan(st.rack_power_w))
    assert st.stale_racks(1.0, 5.0) == (0, 1)  # no loop or PDU reading yet
    batch = full.racks[0].cards
    assert isinstance(batch, CardBatch)
    st.update(
        Readings(
            time_s=2.0, racks=tuple(RackReading(rack=r.rack, time_s=2.0, loop=r.loop, pdu=r.pdu) for r in full.racks)
        )
    )
    assert st.stale_racks(2.0, 5.0) == ()


def _with_die(readings: Readings, fn: Callable[[CardBatch], np.ndarray]) -> Readings:
    """``readings`` with every card batch's die column replaced by ``fn(batch)``."""
    racks = []
    for rr in readings.racks:
        if rr.cards is not None:
            rr = dataclasses.replace(rr, cards=dataclasses.replace(rr.cards, die_temp_c=fn(rr.cards)))
        racks.append(rr)
    return dataclasses.replace(readings, racks=tuple(racks))


def _die_of_card_5_at(value: float, b: CardBatch) -> np.ndarray:
    return np.where(b.card_index == 5, value, b.die_temp_c)


def test_a_die_frozen_alone_is_stuck_once_its_power_or_supply_moves(small_site: SiteSpec) -> None:
    """Card 5's die sensor freezes while its power keeps reporting; its job checkpoints (power drops)
    and the supply warms: the die cannot hold its value through that, so the card is stuck (it
    used to need power and die frozen together and was never flagged; the belief read 10 K low)."""
    jobs = [JobSpec("a", 32, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=120.0)]
    p = Plant(small_site, jobs, config=PlantConfig(seed=3, phases=PHASES))
    st = TwinState(small_site, stuck_after_readings=10)
    frozen = np.nan
    flagged_at = None
    for t in range(400):
        if t == 250:
            p.set_supply_temp(40.0)
        p.step(1.0)
        readings = p.readings()
        if t == 60:
            frozen = float(cards_of(readings.racks[0]).die_temp_c[5])
        if t >= 60:
            readings = _with_die(readings, functools.partial(_die_of_card_5_at, frozen))
        st.update(readings)
        if flagged_at is None and st.stuck_cards() == (5,):
            flagged_at = t
        assert set(st.stuck_cards()) <= {5} and st.stuck_racks() == ()
    assert flagged_at is not None and st.stuck_cards() == (5,)
    assert st.snapshot().stuck_cards == (5,)


def test_a_die_sensor_reading_whole_degrees_is_not_stuck(small_site: SiteSpec) -> None:
    """Real die sensors read whole degrees: at a steady load the value repeats for minutes while the
    power jitters, and a supply change moves it only after a few seconds. None of it is a frozen
    sensor."""
    jobs = [JobSpec("a", 32, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=120.0)]
    p = Plant(small_site, jobs, config=PlantConfig(seed=3, phases=PHASES))
    st = TwinState(small_site, stuck_after_readings=10)
    repeats = 0
    for t in range(400):
        if t in (150, 300):
            p.set_supply_temp(35.0 if t == 150 else 30.0)
        p.step(1.0)
        before = st.card_die_temp_c.copy()
        st.update(_with_die(p.readings(), lambda b: np.round(b.die_temp_c)))
        repeats += int((st.card_die_temp_c == before).sum())
        assert st.stuck_cards() == () and st.stuck_racks() == ()
    assert repeats > 32 * 100  # the whole degrees did repeat, often


def test_a_late_reading_does_not_overwrite_a_newer_one(small_site: SiteSpec) -> None:
    p = Plant(small_site, config=PlantConfig())
    p.step(1.0)
    old = p.readings()
    p.step(10.0)
    new = p.readings()
    st = TwinState(small_site)
    st.update(new)
    power, die, supply, pdu = (
        st.card_power_w.copy(),
        st.card_die_temp_c.copy(),
        st.rack_supply_temp_c.copy(),
        st.rack_power_w.copy(),
    )
    st.update(old)  # reordered on the way: older than what the belief holds, per card, loop and PDU
    np.testing.assert_array_equal(st.card_power_w, power)
    np.testing.assert_array_equal(st.card_die_temp_c, die)
    np.testing.assert_array_equal(st.rack_supply_temp_c, supply)
    np.testing.assert_array_equal(st.rack_power_w, pdu)
    assert st.late_count == small_site.n_cards + 2 * small_site.n_racks
    assert st.card_last_seen_s.min() == new.time_s
    assert st.time_s == new.time_s and st.rack_cards_seen_s.tolist() == [new.time_s] * small_site.n_racks


def test_each_part_of_a_rack_reading_keeps_its_own_time(small_site: SiteSpec) -> None:
    """Rack 0's card exporter lags 60 s behind its CDU and PDU: its cards are as old as their batch,
    so the rack goes stale (merged into one reading stamped with the newest time they looked fresh)."""
    p = Plant(small_site, config=PlantConfig())
    st = TwinState(small_site)
    for _ in range(120):
        p.step(1.0)
        full = p.readings()
        racks = [dataclasses.replace(rr, cards_time_s=rr.time_s - 60.0) if rr.rack == 0 else rr for rr in full.racks]
        st.update(dataclasses.replace(full, racks=tuple(racks)))
    assert st.card_last_seen_s[:16].max() == pytest.approx(60.0)
    assert st.rack_loop_seen_s[0] == st.rack_pdu_seen_s[0] == pytest.approx(120.0)
    assert st.stale_racks(120.0, 30.0) == (0,)
    assert RackReading(rack=0, time_s=5.0, loop_time_s=3.0).part_time_s("loop") == 3.0
    assert RackReading(rack=0, time_s=5.0).part_time_s("cards") == 5.0


def test_a_dropped_job_frees_its_cards_and_is_counted_apart_from_finished_ones(small_site: SiteSpec) -> None:
    """A ``finished`` marked ``dropped`` (the agent inferred it: the scheduler stopped listing the job)
    frees the job's cards like a received one, and a late copy of its submission stays ignored, but the
    belief cannot say the job finished: it is counted in ``jobs_dropped``."""
    spec = _job("j1", 8)
    st = TwinState(small_site)
    submitted = JobEvent(0.0, "j1", "submitted", Phase.WAITING, job=spec)
    st.apply_events([submitted, JobEvent(1.0, "j1", "started", Phase.COMPUTE, cards=tuple(range(8)))])
    st.apply_events([JobEvent(50.0, "j1", "finished", Phase.COMPUTE, dropped=True), submitted])
    assert st.jobs == {} and st.queue() == () and st.snapshot().card_job[:8].tolist() == [-1] * 8
    assert (st.jobs_finished, st.jobs_failed, st.jobs_dropped) == (0, 0, 1)


def test_a_repeated_submission_does_not_requeue_a_running_or_finished_job(small_site: SiteSpec) -> None:
    """Job events come at least once (MQTT QoS 1): a second ``submitted`` of a job the belief knows
    (running, queued or finished since) is the same event again, not a new job."""
    spec = _job("j1", 8)
    st = TwinState(small_site)
    submitted = JobEvent(0.0, "j1", "submitted", Phase.WAITING, job=spec)
    st.apply_events([submitted, JobEvent(1.0, "j1", "started", Phase.WAITING, cards=tuple(range(8)))])
    st.apply_events([JobEvent(70.0, "j1", "phase", Phase.COMPUTE), submitted])
    snap = st.snapshot()
    assert [j.job_id for j in snap.jobs] == ["j1"] and snap.queue == ()
    assert snap.jobs[0].phase == Phase.COMPUTE and snap.card_job[:8].tolist() == [0] * 8
    st.apply_events([JobEvent(2.0, "j2", "submitted", Phase.WAITING, job=_job("j2", 4)), submitted])
    assert [j.job_id for j in st.queue()] == ["j2"]
    st.apply_events([JobEvent(90.0, "j1", "finished", Phase.WAITING), submitted])
    assert "j1" not in st.jobs and st.jobs_finished == 1
    # the same id submitted again after it finished is a new job
    st.apply_events([JobEvent(100.0, "j1", "submitted", Phase.WAITING, job=spec)])
    assert [j.job_id for j in st.queue()] == ["j2", "j1"]


def test_a_repeated_or_overtaken_job_event_does_not_move_a_job_back(small_site: SiteSpec) -> None:
    """Job events come at least once and may be reordered (MQTT QoS 1): an old ``phase`` arriving
    after a newer one used to overwrite it, a copy of ``started`` reset the running job's phase to
    the start's, and a ``requeued`` overtaken by the restart it led to queued the running job."""
    a, b = tuple(range(8)), tuple(range(8, 16))
    st = TwinState(small_site)
    started = JobEvent(1.0, "j1", "started", Phase.WAITING, cards=a)
    st.apply_events([JobEvent(0.0, "j1", "submitted", Phase.WAITING, job=_job("j1", 8)), started])
    st.apply_events([JobEvent(1.0, "j1", "phase", Phase.COMPUTE), started])  # a phase at the start's time
    assert st.jobs["j1"].phase == Phase.COMPUTE
    st.apply_events([JobEvent(20.0, "j1", "phase", Phase.CHECKPOINT), JobEvent(10.0, "j1", "phase", Phase.COMPUTE)])
    # (a cast: mypy keeps the phase narrowed to COMPUTE by the assert above across apply_events)
    assert cast(Phase, st.jobs["j1"].phase) == Phase.CHECKPOINT and st.jobs["j1"].last_event_s == 20.0
    st.apply_events([started])
    info = st.jobs["j1"]
    assert info.state == "running" and info.phase == Phase.CHECKPOINT and info.cards == a
    # requeued at 50 s and restarted on other cards at 80 s; the restart arrives first
    restart = JobEvent(80.0, "j1", "started", Phase.WAITING, cards=b)
    st.apply_events([restart, JobEvent(50.0, "j1", "requeued", Phase.WAITING)])
    info = st.jobs["j1"]
    assert info.state == "running" and info.cards == b and info.phase == Phase.WAITING and st.queue() == ()
    snap = st.snapshot()
    assert snap.card_job[8:16].tolist() == [0] * 8 and snap.card_job[:8].tolist() == [-1] * 8
    assert snap.card_released_s[:8].tolist() == [80.0] * 8
    # the job's times come back with the site's clock: a start on the new timeline is a start
    st.clock_went_back(30.0)
    st.apply_events([JobEvent(31.0, "j1", "started", Phase.WAITING, cards=a)])
    assert st.jobs["j1"].cards == a and st.jobs["j1"].last_event_s == 31.0


def _with_power(readings: Readings, fn: Callable[[CardBatch], np.ndarray]) -> Readings:
    """``readings`` with every card batch's power column replaced by ``fn(batch)``."""
    racks = []
    for rr in readings.racks:
        if rr.cards is not None:
            rr = dataclasses.replace(rr, cards=dataclasses.replace(rr.cards, power_w=fn(rr.cards)))
        racks.append(rr)
    return dataclasses.replace(readings, racks=tuple(racks))


def test_a_power_sensor_frozen_alone_is_stuck_once_utilization_or_level_moves(small_site: SiteSpec) -> None:
    """Card 5's power sensor freezes at ~600 W while its die and utilization keep reporting; its job
    checkpoints (utilization to 0, the card draws ~75 W) and later runs a slower level. The power
    cannot hold its value through that, so the card is stuck (it used to need power and die frozen
    together and was never flagged: the rack's budget and the estimator's resistance read a power
    the card did not draw)."""
    jobs = [JobSpec("a", 32, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=120.0)]
    p = Plant(small_site, jobs, config=PlantConfig(seed=3, phases=PHASES))
    st = TwinState(small_site, stuck_after_readings=10)
    frozen = np.nan
    flagged_at = None
    for t in range(200):
        if t == 150:
            p.set_levels(np.arange(32), np.full(32, 3))
        p.step(1.0)
        readings = p.readings()
        if t == 60:
            frozen = float(cards_of(readings.racks[0]).power_w[5])
        if t >= 60:

            def held(b: CardBatch, w: float = frozen) -> np.ndarray:
                return np.where(b.card_index == 5, w, b.power_w)

            readings = _with_power(readings, held)
        st.update(readings)
        if flagged_at is None and st.stuck_cards() == (5,):
            flagged_at = t
        assert set(st.stuck_cards()) <= {5} and st.stuck_racks() == ()
    assert flagged_at is not None and 120 <= flagged_at < 150  # ten readings into the first checkpoint
    assert st.snapshot().stuck_cards == (5,)


def test_a_power_sensor_reading_whole_watts_is_not_stuck(small_site: SiteSpec) -> None:
    """Power read in whole watts (or 5 W steps) repeats at a steady load and at idle; through load
    steps, level changes, power limits, sleep and wake it moves. None of it is a frozen sensor."""
    jobs = [JobSpec("a", 24, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=90.0)]
    p = Plant(small_site, jobs, config=PlantConfig(seed=3, phases=PHASES))
    st = TwinState(small_site, stuck_after_readings=3)
    repeats = 0
    for t in range(400):
        if t in (100, 250):
            p.set_levels(np.arange(24), np.full(24, 3 if t == 100 else 0))
        if t == 180:
            p.set_power_limits(np.arange(24), np.full(24, 400.0))
        if t in (150, 300):
            (p.enter_low_power if t == 150 else p.wake)(np.arange(24, 32))
        p.step(1.0)
        before = st.card_power_w.copy()
        step_w = 5.0 if t >= 200 else 1.0

        def quantized(b: CardBatch, q: float = step_w) -> np.ndarray:
            return np.round(b.power_w / q) * q

        st.update(_with_power(p.readings(), quantized))
        repeats += int((st.card_power_w == before).sum())
        assert st.stuck_cards() == () and st.stuck_racks() == ()
    assert repeats > 1000  # the rounded values did repeat, often


def test_a_site_frozen_as_a_whole_is_stuck_once_its_pdus_see_its_cards_load_move(small_site: SiteSpec) -> None:
    """Every card reading of the site freezes at once (a collector re-publishing its cache with fresh
    time stamps) while the PDUs, read apart, go on. No rack changes, so no rack was stuck; but when
    the job checkpoints the PDUs drop by more than all of a rack's hosts could draw: only its cards
    can have moved."""
    rack = dataclasses.replace(small_site.rack, host_overhead_w=2200.0, power_limit_w=12500.0)  # 16 cards' share
    site = dataclasses.replace(small_site, rack=rack)
    jobs = [JobSpec("a", 32, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=120.0)]
    p = Plant(site, jobs, config=PlantConfig(seed=3, phases=PHASES))
    st = TwinState(site, stuck_after_readings=10)
    cache = p.readings()
    flagged_at = None
    for t in range(200):
        p.step(1.0)
        readings = p.readings()
        if t == 60:
            cache = readings
        if t >= 60:
            racks = (
                dataclasses.replace(rr, cards=cr.cards) for rr, cr in zip(readings.racks, cache.racks, strict=True)
            )
            readings = dataclasses.replace(readings, racks=tuple(racks))
        st.update(readings)
        if flagged_at is None and st.stuck_racks():
            flagged_at = t
    assert flagged_at is not None and 120 <= flagged_at < 150  # ten PDU readings into the first checkpoint
    assert st.stuck_racks() == (0, 1) and st.stuck_cards() == ()


def test_a_site_frozen_with_its_pdus_is_stuck_once_the_job_events_move_its_cards(small_site: SiteSpec) -> None:
    """Every reading of the site freezes at once, its PDUs' and loops' too (a collector re-publishing
    its whole cache with fresh time stamps), while the scheduler's job events go on. When the job
    next checkpoints or resumes, its cards' activity changes, and readings that stay bit for bit the
    same through that are a frozen source: the job's cards are stuck ten readings later (their racks
    get the fail-safe caps). Before the freeze, through the same phase changes, nothing is stuck."""
    jobs = [JobSpec("a", 24, work_steps=1e6, step_time_s=1.0, compute_share=0.85, checkpoint_interval_s=120.0)]
    p = Plant(small_site, jobs, config=PlantConfig(seed=3, phases=PHASES))
    st = TwinState(small_site, stuck_after_readings=10)
    cache = None
    moved_at = flagged_at = None
    for t in range(400):
        p.step(1.0)
        readings = p.readings()
        if t == 200:
            cache = readings
        if cache is not None:
            racks = tuple(dataclasses.replace(rr, time_s=readings.time_s) for rr in cache.racks)
            readings = dataclasses.replace(cache, time_s=readings.time_s, racks=racks)
        st.update(readings)
        events = p.drain_events()
        st.apply_events(events)
        if t <= 200:
            assert st.stuck_cards() == () and st.stuck_racks() == ()
        elif moved_at is None and any(e.kind == "phase" for e in events):
            moved_at = t
        if flagged_at is None and st.stuck_cards():
            flagged_at = t
    assert moved_at is not None and flagged_at is not None
    assert moved_at + 9 <= flagged_at <= moved_at + 10  # ten readings after the event
    assert st.stuck_cards() == tuple(range(24))  # the job's cards; the idle ones' activity never moved
    assert st.stuck_racks() == ()  # nothing changed anywhere: no rack stands out


def _as_lists(readings: Readings) -> Readings:
    """The same readings with every card array a list (decoded payloads may carry lists; the plant sends arrays)."""
    racks = []
    for rr in readings.racks:
        b = rr.cards
        if b is not None:
            b = dataclasses.replace(
                b,
                **{
                    f.name: getattr(b, f.name).tolist() for f in dataclasses.fields(b) if getattr(b, f.name) is not None
                },
            )
        racks.append(dataclasses.replace(rr, cards=b))
    return dataclasses.replace(readings, racks=tuple(racks))


def test_array_and_list_batches_give_the_same_belief_bit_for_bit(small_site: SiteSpec) -> None:
    """The fast path for batches of one-dimensional arrays (concatenated and cast at once) and the
    general one (each part through np.asarray) fold the same readings into the same belief."""
    faults = (StuckSensor(rack=1, start_s=20.0, card=20), GarbageReadings(rack=0, start_s=30.0, fraction=0.2))
    p = Plant(small_site, [_job("a", 16), _job("b", 8)], faults, config=PlantConfig(phases=PHASES))
    fast, slow = TwinState(small_site), TwinState(small_site)
    for _ in range(60):
        p.step(1.0)
        readings = p.readings()
        events = p.drain_events()
        fast.update(readings)
        slow.update(_as_lists(readings))
        fast.apply_events(events)
        slow.apply_events(events)
    a, b = fast.snapshot(), slow.snapshot()
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f.name
        else:
            assert x == y, f.name
    assert fast.invalid_count.tolist() == slow.invalid_count.tolist()


def test_nan_to_num_is_numpys_bit_for_bit() -> None:
    from twin.state import _nan_to_num

    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2e308, 5e-324])
    assert _nan_to_num(x).tobytes() == np.nan_to_num(x).tobytes()
    assert np.isnan(x[0])  # the input is left alone


# ---- hand-made readings: every value known, so the belief's answer can be derived by hand --------
def _cards(rack: int, **cols: object) -> CardBatch:
    """Rack ``rack``'s 16 cards of the small site at ``readings_testing.CARD_DEFAULTS`` (300 W,
    50 deg C, 1980 MHz, half utilization, level 0, awake, a 700 W limit); ``cols`` replaces a column
    (a scalar: on every card)."""
    return card_batch(np.arange(16 * rack, 16 * rack + 16), **cols)


def _loop(supply_c: float = 30.0, **kw: float) -> LoopReading:
    return LoopReading(supply_temp_c=supply_c, return_temp_c=supply_c + 8.0, flow_lpm=100.0, pump_power_w=500.0, **kw)


def _at(t: float, *racks: RackReading) -> Readings:
    return Readings(time_s=t, racks=racks)


def test_the_small_sites_card_is_the_one_the_hand_made_readings_assume(small_site: SiteSpec) -> None:
    card = small_site.card
    assert card.power_limit_w == 700.0 and max(card.clocks_mhz) == 1980.0 and card.n_levels == 8
    assert card.r_die_to_case_k_per_w + min(small_site.cold_plate.r_case_to_coolant_k_per_w) == pytest.approx(0.0497)


@pytest.mark.parametrize(
    ("column", "value", "taken"),
    [
        ("power_w", 3490.0, True),  # below 5 x the 700 W limit
        ("power_w", 3510.0, False),  # above it
        ("power_w", -0.5, False),
        ("die_temp_c", -19.5, True),
        ("die_temp_c", -20.5, False),
        ("die_temp_c", 149.5, True),
        ("die_temp_c", 150.5, False),
        ("utilization", 1.0, True),
        ("utilization", 1.01, False),
        ("utilization", -0.01, False),
        ("clock_mhz", 9900.0, True),  # 5 x the top clock (1980 MHz)
        ("clock_mhz", 9910.0, False),
    ],
)
def test_a_card_reading_is_taken_within_the_documented_bounds_and_refused_outside(
    small_site: SiteSpec, column: str, value: float, taken: bool
) -> None:
    st = TwinState(small_site)
    st.update(_at(1.0, RackReading(0, 1.0, cards=_cards(0))))
    st.update(_at(2.0, RackReading(0, 2.0, cards=_cards(0, **{column: value}))))
    held = getattr(st, f"card_{column}")[:16]
    if taken:
        assert held.tolist() == [value] * 16 and st.card_last_seen_s[:16].tolist() == [2.0] * 16
        assert st.invalid_count.sum() == 0
    else:  # the card keeps its previous reading and does not look fresher
        assert held.tolist() == [getattr(_cards(0), column)[0]] * 16 and st.card_last_seen_s[:16].tolist() == [1.0] * 16
        assert st.invalid_count[:16].tolist() == [1] * 16


def test_a_level_outside_the_table_or_a_power_limit_not_above_zero_is_not_taken(small_site: SiteSpec) -> None:
    """The rest of such a reading is taken: the card keeps its level (3) and limit (500 W)."""
    st = TwinState(small_site)
    st.update(_at(1.0, RackReading(0, 1.0, cards=_cards(0, level=3, power_limit_w=500.0))))
    st.update(_at(2.0, RackReading(0, 2.0, cards=_cards(0, power_w=310.0, level=8, power_limit_w=0.0))))
    st.update(_at(3.0, RackReading(0, 3.0, cards=_cards(0, power_w=320.0, level=-1, power_limit_w=-700.0))))
    assert st.card_level[:16].tolist() == [3] * 16 and st.card_power_limit_w[:16].tolist() == [500.0] * 16
    assert st.card_power_w[:16].tolist() == [320.0] * 16 and st.card_last_seen_s[:16].tolist() == [3.0] * 16


def test_a_reading_delivered_again_is_neither_late_nor_new_evidence(small_site: SiteSpec) -> None:
    """At-least-once delivery: every reading arrives three times. A copy (the same time stamp) is not
    late (``late_count``: ``racktwin_late_readings_total``), not a repetition of a frozen sensor,
    and not the card's next reading (``card_prev_seen_s``: where the interval the latest covers
    begins, the agent's test of work it does not know of)."""
    p = Plant(small_site, [_job("a", 32)], config=PlantConfig(phases=PHASES))
    st = TwinState(small_site, stuck_after_readings=2)
    for _ in range(30):
        p.step(1.0)
        readings = p.readings()
        for _copy in range(3):
            st.update(readings)
        assert st.stuck_cards() == () and st.stuck_racks() == ()
    assert st.late_count == 0
    assert st.card_last_seen_s.tolist() == [30.0] * 32 and st.card_prev_seen_s.tolist() == [29.0] * 32


def test_a_sensor_is_stuck_after_exactly_stuck_after_readings_repeats(small_site: SiteSpec) -> None:
    """stuck_after_readings=3: card 5 (and later all of rack 0) repeats its first reading (t=1) at
    t=2, 3, 4 while the other cards change: stuck from the third repeat (t=4), not before."""
    st = TwinState(small_site, stuck_after_readings=3)

    def moving(t: float, rack: int) -> CardBatch:
        return _cards(rack, power_w=300.0 + t, die_temp_c=50.0 + 0.1 * t)

    first = moving(1.0, 0)

    def frozen_card_5(t: float) -> CardBatch:
        b, card_5 = moving(t, 0), first.card_index == 5
        power, die = np.where(card_5, first.power_w, b.power_w), np.where(card_5, first.die_temp_c, b.die_temp_c)
        return dataclasses.replace(b, power_w=power, die_temp_c=die)

    for t in (1.0, 2.0, 3.0, 4.0):
        st.update(_at(t, RackReading(0, t, cards=frozen_card_5(t)), RackReading(1, t, cards=moving(t, 1))))
        assert st.stuck_cards() == ((5,) if t == 4.0 else ()), t
    assert st.stuck_racks() == ()
    # rack 0 freezes as a whole at t=5 (its t=5 reading from then on) while rack 1 changes
    for t in (5.0, 6.0, 7.0, 8.0):
        st.update(_at(t, RackReading(0, t, cards=moving(5.0, 0)), RackReading(1, t, cards=moving(t, 1))))
        assert st.stuck_racks() == ((0,) if t == 8.0 else ()), t


def test_a_frozen_die_is_stuck_once_its_power_or_supply_moved_it_by_stuck_die_move_k(small_site: SiteSpec) -> None:
    """stuck_die_move_k=3 K through the lowest die-to-coolant resistance, 0.03 + 0.0197 = 0.0497 K/W:
    a power step of 65 W (3.2 K) with the die frozen is a stuck die after 3 readings, one of 50 W
    (2.5 K) is not (a die reading whole degrees may hold through it); a supply step of 4 K (power
    moving by a watt) is."""

    def run(power_w: tuple[float, float], supply_c: tuple[float, float]) -> tuple[int, ...]:
        st = TwinState(small_site, stuck_after_readings=3)
        for t in range(1, 6):
            k = 0 if t == 1 else 1
            cards = _cards(0, power_w=power_w[k] + (t % 2))
            st.update(_at(float(t), RackReading(0, float(t), cards=cards, loop=_loop(supply_c[k] + 0.01 * t))))
        return st.stuck_cards()

    assert run((300.0, 365.0), (30.0, 30.0)) == tuple(range(16))
    assert run((300.0, 350.0), (30.0, 30.0)) == ()
    assert run((300.0, 300.0), (30.0, 34.0)) == tuple(range(16))
    assert run((300.0, 300.0), (30.0, 32.0)) == ()


def test_a_rack_whose_loop_alone_repeats_is_stuck_only_while_another_rack_changes(small_site: SiteSpec) -> None:
    """Rack 0's loop repeats its reading while its cards change; rack 1's cards (no loop) repeat.
    Rack 1 is stuck: rack 0 changed. Rack 0 is not: no other rack changed (its own cards do not
    count: a loop steady while nothing else moves is a steady site)."""
    st = TwinState(small_site, stuck_after_readings=3)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        rack0 = RackReading(0, t, cards=_cards(0, power_w=300.0 + t), loop=_loop())
        st.update(_at(t, rack0, RackReading(1, t, cards=_cards(1))))
    assert st.stuck_racks() == (1,)


def test_stale_is_not_seen_within_the_deadline(small_site: SiteSpec) -> None:
    """Seen at 10 s: within a 5 s deadline at 15 s (not stale), no longer at 15.5 s."""
    st = TwinState(small_site)
    st.update(_at(10.0, *(RackReading(r, 10.0, cards=_cards(r), loop=_loop(), pdu=PduReading(20e3)) for r in (0, 1))))
    assert st.stale_racks(15.0, 5.0) == () and st.stale_cards(15.0, 5.0) == ()
    assert st.stale_racks(15.5, 5.0) == (0, 1) and st.stale_cards(15.5, 5.0) == tuple(range(32))


def test_a_failed_card_that_sends_garbage_makes_neither_itself_nor_its_rack_stale(small_site: SiteSpec) -> None:
    """Card 3 fails at 2 s and reads NaN from then on (refused: it is not seen again); the rest of
    rack 0 reports until 20 s. Neither card 3 nor rack 0 is stale at 20 s; a rack whose cards all
    failed is judged by when its card batch last came (its cards are no longer seen at all)."""
    st = TwinState(small_site)
    dead3 = _cards(0, failed=np.arange(16) == 3, die_temp_c=np.where(np.arange(16) == 3, np.nan, 50.0))
    all_dead = _cards(1, failed=True, die_temp_c=np.nan)
    st.update(_at(1.0, *(RackReading(r, 1.0, cards=_cards(r), loop=_loop(), pdu=PduReading(20e3)) for r in (0, 1))))
    st.update(_at(2.0, *(RackReading(r, 2.0, cards=b) for r, b in ((0, dead3), (1, all_dead)))))
    for t in range(3, 21):
        racks = [RackReading(0, float(t), cards=dead3)] if t < 20 else []
        racks += [RackReading(r, float(t), loop=_loop(), pdu=PduReading(20e3)) for r in (0, 1)]
        st.update(_at(float(t), *racks))
    assert st.card_last_seen_s[3] == 1.0 and bool(st.card_failed[3])
    assert st.stale_cards(20.0, 5.0) == ()
    assert st.rack_last_seen_s().tolist() == [19.0, 2.0]  # rack 1: its last card batch
    assert st.stale_racks(20.0, 5.0) == (1,)


def test_a_clock_gone_back_brings_every_time_the_belief_holds_back_to_it(small_site: SiteSpec) -> None:
    st = TwinState(small_site)
    for t in (100.0, 101.0):
        st.update(_at(t, RackReading(0, t, cards=_cards(0), loop=_loop(), pdu=PduReading(20e3))))
    st.apply_events(
        [
            JobEvent(100.0, "j", "submitted", Phase.WAITING, job=_job("j", 4)),
            JobEvent(100.0, "j", "started", Phase.WAITING, cards=(0, 1, 2, 3)),
            JobEvent(101.0, "j", "requeued", Phase.WAITING),
        ]
    )
    st.clock_went_back(50.0)
    for name in ("card_last_seen_s", "card_prev_seen_s", "card_released_s"):
        assert getattr(st, name)[:4].tolist() == [50.0] * 4, name
    assert st.card_prev_seen_s[4:16].tolist() == [50.0] * 12
    assert st.rack_cards_seen_s[0] == st.rack_loop_seen_s[0] == st.rack_pdu_seen_s[0] == 50.0
    assert st.time_s == 50.0 and st.jobs["j"].last_event_s == 50.0


def test_a_late_copy_of_the_submission_of_a_job_that_failed_at_once_does_not_queue_it(small_site: SiteSpec) -> None:
    """Submitted, started and failed within the same second: a copy of its submission (at-least-once
    delivery) is not a new job."""
    st = TwinState(small_site)
    submitted = JobEvent(5.0, "j", "submitted", Phase.WAITING, job=_job("j", 4))
    st.apply_events([submitted, JobEvent(5.0, "j", "started", Phase.WAITING, cards=(0, 1, 2, 3))])
    st.apply_events([JobEvent(5.0, "j", "failed", Phase.WAITING), submitted])
    assert st.queue() == () and st.jobs == {} and st.jobs_failed == 1


def test_a_requeued_job_goes_to_the_front_of_the_queue_as_the_scheduler_puts_it(small_site: SiteSpec) -> None:
    st = TwinState(small_site)
    st.apply_events(
        [
            JobEvent(0.0, "a", "submitted", Phase.WAITING, job=_job("a", 8)),
            JobEvent(1.0, "a", "started", Phase.WAITING, cards=tuple(range(8))),
            JobEvent(2.0, "b", "submitted", Phase.WAITING, job=_job("b", 32)),
            JobEvent(3.0, "a", "requeued", Phase.WAITING),
        ]
    )
    assert [j.job_id for j in st.queue()] == ["a", "b"]


def test_a_job_reading_as_new_as_the_jobs_last_event_is_taken_an_older_one_is_not(small_site: SiteSpec) -> None:
    st = TwinState(small_site)
    st.apply_events(
        [
            JobEvent(0.0, "j", "submitted", Phase.WAITING, job=_job("j", 4)),
            JobEvent(10.0, "j", "started", Phase.WAITING, cards=(0, 1, 2, 3)),
        ]
    )
    st.update(Readings(9.0, (), jobs=(JobReading("j", Phase.COMPUTE, 4, 0.5, 1.0),)))
    assert st.jobs["j"].phase == Phase.WAITING and st.jobs["j"].progress_frac == 0.0
    st.update(Readings(10.0, (), jobs=(JobReading("j", Phase.COMPUTE, 4, 0.25, 1.0),)))
    # (a cast: mypy keeps the phase narrowed to WAITING by the assert above across update)
    assert cast(Phase, st.jobs["j"].phase) == Phase.COMPUTE and st.jobs["j"].progress_frac == 0.25


def test_a_loop_reading_with_a_pump_speed_outside_0_to_full_speed_is_refused_nan_is_not_reported(
    small_site: SiteSpec,
) -> None:
    """No pump runs above full speed (the plant refuses it, the wire rejects more than 100 %) or below 0:
    such a reading is refused whole and counted, as the wire rejects the CDU message (the belief took
    up to 150 % for the speed, and the loop's temperatures and flow with any speed). A NaN speed is one
    not reported: the loop's readings are taken, the speed before kept. 0 is a stopped pump."""
    st = TwinState(small_site)
    st.update(_at(1.0, RackReading(0, 1.0, loop=_loop(pump_speed_frac=0.5))))
    assert st.rack_pump_speed_frac[0] == 0.5 and bool(st.rack_pump_speed_reported[0])
    for n, (t, speed) in enumerate(((2.0, -0.01), (3.0, 1.0001), (4.0, 1.2), (5.0, 1.5), (6.0, 2.0)), start=1):
        st.update(_at(t, RackReading(0, t, loop=_loop(supply_c=31.0, pump_speed_frac=speed))))
        assert st.rack_invalid_count[0] == n and st.rack_loop_seen_s[0] == 1.0, speed
        assert st.rack_supply_temp_c[0] == 30.0 and st.rack_pump_speed_frac[0] == 0.5, speed
        assert bool(st.rack_pump_speed_reported[0]), speed
    st.update(_at(7.0, RackReading(0, 7.0, loop=_loop(supply_c=31.0, pump_speed_frac=float("nan")))))
    assert st.rack_supply_temp_c[0] == 31.0 and st.rack_pump_speed_frac[0] == 0.5
    assert not st.rack_pump_speed_reported[0]
    st.update(_at(8.0, RackReading(0, 8.0, loop=_loop(pump_speed_frac=1.0))))  # full speed: a reading
    assert st.rack_pump_speed_frac[0] == 1.0 and bool(st.rack_pump_speed_reported[0])
    # 0 %: the pump stopped (was: not reported, the speed before kept)
    st.update(_at(9.0, RackReading(0, 9.0, loop=_loop(pump_speed_frac=0.0))))
    assert st.rack_pump_speed_frac[0] == 0.0 and bool(st.rack_pump_speed_reported[0])
    assert st.rack_invalid_count[0] == 5


def test_a_pump_speed_a_hair_under_the_sites_lowest_is_the_lowest(small_site: SiteSpec) -> None:
    """The CDU reports its pump's speed to 0.01 % (docs/sim.md): the site's lowest speed, 1/3 of nominal
    (its plate's least measured flow over its nominal one), reads 0.3333. The belief takes a speed within
    half of that step under the lowest as the lowest (``speed >= lowest`` holds), and no more: a speed a
    step under it (a pump below its range) and speeds above it are kept as they are reported."""
    lo = small_site.min_pump_speed_frac()
    assert lo == pytest.approx(1.0 / 3.0, abs=1e-12)
    st = TwinState(small_site)
    cases = [(0.3333, lo), (1.0 / 3.0, lo), (lo - 0.5e-4, lo), (0.3332, 0.3332), (0.3334, 0.3334), (1.0, 1.0)]
    for t, (speed, believed) in enumerate(cases, start=1):
        st.update(_at(float(t), RackReading(0, float(t), loop=_loop(pump_speed_frac=speed))))
        assert st.rack_pump_speed_frac[0] == believed and bool(st.rack_pump_speed_reported[0]), speed


def test_cards_asleep_or_of_a_host_off_are_not_stuck_for_holding_still(small_site: SiteSpec) -> None:
    """Cards 0-3, asleep at 0 W and 30 deg C, are given a job (their activity moves, but asleep
    their readings may hold until they wake); cards of hosts powered off hold theirs while the
    supply steps by 4 K (a die of a powered-off host is not read)."""
    asleep = _cards(0, power_w=0.0, die_temp_c=30.0, clock_mhz=0.0, utilization=0.0, low_power=True)
    for host_off in (False, True):
        st = TwinState(small_site, stuck_after_readings=3)
        cards = dataclasses.replace(asleep, host_off=np.full(16, host_off))
        st.apply_events([JobEvent(0.0, "j", "submitted", Phase.WAITING, job=_job("j", 4))])
        for t in range(1, 7):
            if t == 2:
                st.apply_events([JobEvent(1.5, "j", "started", Phase.WAITING, cards=(0, 1, 2, 3))])
            supply = 30.0 + 0.01 * t + (4.0 if host_off and t > 1 else 0.0)
            st.update(_at(float(t), RackReading(0, float(t), cards=cards, loop=_loop(supply))))
        assert st.stuck_cards() == () and st.stuck_racks() == (), host_off


def test_a_cards_release_time_is_the_latest_a_job_left_it(small_site: SiteSpec) -> None:
    """Job a leaves cards 0-3 at 20 s; job b's start on them at 5 s and its end at 8 s arrive after
    that (overtaken on the way): the cards were last released at 20 s."""
    st = TwinState(small_site)
    st.apply_events(
        [
            JobEvent(0.0, "a", "submitted", Phase.WAITING, job=_job("a", 4)),
            JobEvent(0.0, "b", "submitted", Phase.WAITING, job=_job("b", 4)),
            JobEvent(1.0, "a", "started", Phase.WAITING, cards=(0, 1, 2, 3)),
            JobEvent(20.0, "a", "requeued", Phase.WAITING),
            JobEvent(5.0, "b", "started", Phase.WAITING, cards=(0, 1, 2, 3)),
            JobEvent(8.0, "b", "finished", Phase.WAITING),
        ]
    )
    assert st.card_released_s[:4].tolist() == [20.0] * 4


def test_a_rack_whose_cards_went_silent_is_stale_not_stuck_whatever_its_pdu_reads(small_site: SiteSpec) -> None:
    """Rack 0's card batches stop after 1 s while its PDU goes on, jumping by 15 kW (more than
    stuck_pdu_move_w): the cards do not repeat anything, they are not there."""
    st = TwinState(small_site, stuck_after_readings=3)
    st.update(_at(1.0, RackReading(0, 1.0, cards=_cards(0), pdu=PduReading(20e3))))
    for t in range(2, 8):
        st.update(_at(float(t), RackReading(0, float(t), pdu=PduReading(20e3 if t == 2 else 35e3))))
    assert st.stuck_racks() == () and 0 in st.stale_racks(7.0, 5.0)
