"""TwinState: belief from the plant's readings and job events; freshness, stuck and bad sensors."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import pytest

from twin.plant import CardFailure, GarbageReadings, Plant, PlantConfig, SensorDropout, StuckSensor
from twin.readings import CardBatch, JobEvent, RackReading, Readings
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import JobSpec, Phase, PhaseModel

pytestmark = pytest.mark.unit

PHASES = PhaseModel(startup_s=5.0, restart_delay_s=20.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)


def _job(job_id: str, n: int, **kw: object) -> JobSpec:
    return JobSpec(job_id, n, work_steps=1e6, step_time_s=1.0, compute_share=0.8, **kw)  # type: ignore[arg-type]


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
    assert st.summary()["jobs_running"] == 1


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
    assert 1 in st.summary(deadline_s=5.0)["stale_racks"]
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
            frozen = float(readings.racks[0].cards.die_temp_c[5])  # type: ignore[union-attr]
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
    assert st.jobs["j1"].phase == Phase.CHECKPOINT and st.jobs["j1"].last_event_s == 20.0
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
            frozen = float(readings.racks[0].cards.power_w[5])  # type: ignore[union-attr]
        if t >= 60:
            readings = _with_power(readings, lambda b, w=frozen: np.where(b.card_index == 5, w, b.power_w))
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
        st.update(_with_power(p.readings(), lambda b, q=step_w: np.round(b.power_w / q) * q))
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
