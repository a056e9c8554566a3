"""What a job does on its cards (twin.plant_jobs), checked against the documented rules with steps
that are not one second long: progress at a clock, checkpoints every interval of *training steps*,
work, SLO seconds, stalls, a card failure's rollback and restart, and the queue order after it.

Expected values are worked out by hand from the rules in twin/workload.py and docs/twin.md
("Jobs"): a step at the top clock takes ``step_time_s``, of which ``compute_share`` scales with
1/clock, so a job with ``compute_share`` 1 at clock ``f`` trains at ``f / f_top`` of its top-clock
pace; work is top-clock-equivalent card-seconds; checkpoints come every
``checkpoint_interval_s / step_time_s`` steps and hold the cards ``checkpoint_duration_s``.
The example card's clocks are 1980 MHz (level 0) down to 1210 MHz in 110 MHz steps; level 4 is
1540 MHz, so such a job trains at 1540 / 1980 = 7/9 of its top-clock pace there.
"""

from __future__ import annotations

import itertools
import math
from typing import TypedDict, Unpack

import numpy as np
import pytest

from twin.plant import CardFailure, CardVariation, Plant, PlantConfig, SensorNoise
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase, PhaseModel

pytestmark = pytest.mark.unit

SEVEN_NINTHS = 1540.0 / 1980.0  # level 4 of the example card, relative to the top clock


class PlantFields(TypedDict, total=False):
    """The ``PlantConfig`` fields a test here sets besides ``_config``'s."""

    backfill_wait_s: float
    initial_level: int


class PhaseDelays(TypedDict, total=False):
    """The ``PhaseModel`` delays ``_quiet`` takes."""

    startup_s: float
    restart_delay_s: float


class _JobOptions(TypedDict, total=False):
    """The ``JobSpec`` fields with a default that ``_job`` sets or a test here overrides."""

    submit_time_s: float
    checkpoint_interval_s: float
    checkpoint_duration_s: float
    noncompute_utilization: float
    min_throughput_frac: float


class JobFields(_JobOptions, total=False):
    """What a test here may override in ``_job``."""

    work_steps: float
    step_time_s: float
    compute_share: float


class _JobArgs(_JobOptions):
    """``_job``'s arguments of ``JobSpec`` after the id and the card count."""

    work_steps: float
    step_time_s: float
    compute_share: float


def _config(phases: PhaseModel, **kw: Unpack[PlantFields]) -> PlantConfig:
    return PlantConfig(variation=CardVariation.none(), noise=SensorNoise.none(), phases=phases, **kw)


def _quiet(**kw: Unpack[PhaseDelays]) -> PhaseModel:
    """No stalls; start-up and restart delay as given."""
    return PhaseModel(comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0, **kw)


def _job(job_id: str, n_cards: int, **kw: Unpack[JobFields]) -> JobSpec:
    """A job whose whole step scales with the clock, two seconds a step at the top clock."""
    args: _JobArgs = {
        "work_steps": 1e9,
        "step_time_s": 2.0,
        "compute_share": 1.0,
        "checkpoint_interval_s": 1e9,
        "checkpoint_duration_s": 0.0,
        "noncompute_utilization": 0.0,
        **kw,
    }
    return JobSpec(job_id, n_cards, **args)


def _phase_times(events: list[JobEvent], phase: Phase) -> list[float]:
    return [e.time_s for e in events if e.kind == "phase" and e.phase == phase]


def test_a_slowed_job_checkpoints_every_interval_of_training_steps(small_site: SiteSpec) -> None:
    """At 7/9 of the top clock a job of 2-s steps with a 600-s interval trains 300 steps between
    checkpoints: 600 / (7/9) = 771.43 s of computing each; its work and readings follow its pace."""
    spec = _job("a", 16, work_steps=10_000.0, checkpoint_interval_s=600.0, checkpoint_duration_s=30.0)
    p = Plant(small_site, [spec], config=_config(_quiet(startup_s=10.0), initial_level=4))
    p.run(500.0, 1.0)
    # computing from t = 10: 490 s at 7/9 of the top pace, 2 s a step
    trained_s = 490.0 * SEVEN_NINTHS
    assert p.accounting().work_card_s == pytest.approx(16 * trained_s, rel=1e-9)
    rec = {r.job_id: r for r in p.job_records()}["a"]
    assert rec.compute_start_s == 10.0
    assert rec.work_done_card_s == pytest.approx(16 * trained_s, rel=1e-9)
    (reading,) = p.readings().jobs
    assert reading.phase == Phase.COMPUTE
    assert reading.throughput_frac == pytest.approx(SEVEN_NINTHS, rel=1e-12)
    assert reading.progress_frac == pytest.approx(trained_s / 2.0 / 10_000.0, rel=1e-9)

    p.run(300.0, 1.0)  # t = 800: in the first checkpoint (from the step ending at 10 + 771.43 s)
    (reading,) = p.readings().jobs
    assert reading.phase == Phase.CHECKPOINT
    assert reading.throughput_frac == 0.0  # no training in a checkpoint

    p.run(1000.0, 1.0)
    ckpt = _phase_times(p.drain_events(), Phase.CHECKPOINT)
    # the second checkpoint: another 300 steps after the first one's 30 s
    assert ckpt == pytest.approx([782.0, 782.0 + 30.0 + 771.43], abs=1.0)


def test_a_job_ends_when_its_work_is_done_whatever_the_step_length(small_site: SiteSpec) -> None:
    """450 steps of 2 s at 7/9 of the top clock: 1157.14 s of computing, plus one 30-s checkpoint
    (at 300 steps) and 10 s of start-up; the work is exactly the job's, however long the steps."""
    spec = _job("a", 16, work_steps=450.0, checkpoint_interval_s=600.0, checkpoint_duration_s=30.0)
    for dt_s in (1.0, 0.5, 2.0):
        p = Plant(small_site, [spec], config=_config(_quiet(startup_s=10.0), initial_level=4))
        p.run(1300.0, dt_s)
        events = p.drain_events()
        (end,) = [e for e in events if e.kind == "finished"]
        assert end.time_s == pytest.approx(10.0 + 900.0 / SEVEN_NINTHS + 30.0, abs=dt_s)
        assert _phase_times(events, Phase.CHECKPOINT) == pytest.approx([10.0 + 600.0 / SEVEN_NINTHS], abs=dt_s)
        assert p.accounting().work_card_s == pytest.approx(spec.work_card_s, rel=1e-9)
        assert spec.work_card_s == 16 * 900.0


def test_slo_seconds_count_computing_time_below_the_jobs_minimum(small_site: SiteSpec) -> None:
    """At 7/9 of the top pace a job asking for 0.9 misses its SLO every second it computes (not
    during start-up or its checkpoint, while the other job computes); one asking for 0.7 never does.
    Counted in seconds, not steps."""
    strict = _job("strict", 16, min_throughput_frac=0.9, checkpoint_interval_s=600.0, checkpoint_duration_s=30.0)
    lax = _job("lax", 16, min_throughput_frac=0.7)  # computes through the other's checkpoint
    for dt_s in (1.0, 0.5):
        p = Plant(small_site, [strict, lax], config=_config(_quiet(startup_s=10.0), initial_level=4))
        p.run(1000.0, dt_s)
        # computing 10..782 (the checkpoint begins at the end of the step crossing 781.43 s) and 812..1000
        computing_s = (782.0 - 10.0) + (1000.0 - 812.0) if dt_s == 1.0 else (781.5 - 10.0) + (1000.0 - 811.5)
        recs = {r.job_id: r for r in p.job_records()}
        assert recs["strict"].slo_violation_s == pytest.approx(computing_s)
        assert recs["lax"].slo_violation_s == 0.0
        assert p.accounting().slo_violation_s == pytest.approx(computing_s)


def test_stalls_arrive_while_computing_at_the_phase_models_rates(small_site: SiteSpec) -> None:
    """Collective and input stalls arrive as Poisson processes while the job computes, at 80 and 40
    an hour (one every 30 s of computing, two thirds of them collective), and last a lognormal time
    of the given median: half of them last longer than it. Checkpoints do not stop them for good."""
    phases = PhaseModel(
        startup_s=0.0,
        comm_stalls_per_hour=80.0,
        comm_stall_median_s=8.0,
        input_stalls_per_hour=40.0,
        input_stall_median_s=12.0,
        stall_sigma=1.0,
    )
    spec = _job("a", 16, step_time_s=1.0, checkpoint_interval_s=1800.0, checkpoint_duration_s=20.0)
    p = Plant(small_site, [spec], config=_config(phases))
    p.run(30_000.0, 1.0)
    changes = [e for e in p.drain_events() if e.kind == "phase"]
    computing_s = 0.0
    durations: dict[Phase, list[float]] = {Phase.COMMUNICATION: [], Phase.WAITING: []}
    for e, nxt in itertools.pairwise(changes):
        if e.phase == Phase.COMPUTE:
            computing_s += nxt.time_s - e.time_s
        elif e.phase in durations:
            assert e.detail == ("collective stall" if e.phase == Phase.COMMUNICATION else "input stall")
            assert nxt.phase == Phase.COMPUTE
            durations[e.phase].append(nxt.time_s - e.time_s)
    n_comm, n_input = len(durations[Phase.COMMUNICATION]), len(durations[Phase.WAITING])
    n = n_comm + n_input
    assert n > 500
    # 120 stalls an hour of computing: one per 30 s (each gap ends at the end of a 1-s step: +0.5 s)
    assert computing_s / n == pytest.approx(30.5, rel=0.1)
    assert n_comm / n == pytest.approx(2.0 / 3.0, abs=0.07)
    # the median is the median: a stall of 1-s steps lasts longer than 8 s iff its draw does
    longer = np.mean(np.asarray(durations[Phase.COMMUNICATION]) > 8.0)
    assert longer == pytest.approx(0.5, abs=0.1)
    assert np.mean(np.asarray(durations[Phase.WAITING]) > 12.0) == pytest.approx(0.5, abs=0.15)
    # and the lognormal's mean: median x exp(sigma^2 / 2), plus half a step of rounding up
    assert np.mean(durations[Phase.COMMUNICATION]) == pytest.approx(8.0 * math.exp(0.5) + 0.5, rel=0.15)
    assert _phase_times(changes, Phase.CHECKPOINT)[0] > 1800.0  # the checkpoints came, and stalls after them
    assert max(e.time_s for e in changes if e.phase == Phase.COMMUNICATION) > 25_000.0


def test_a_card_failure_rolls_the_job_back_to_its_last_checkpoint_in_seconds_of_training(
    small_site: SiteSpec,
) -> None:
    """A job of 2-s steps checkpoints every 300 s of training (150 steps): computing from 10, its
    checkpoint runs 310..330; a card failing at 500 loses the 170 s trained since, holds the cards
    60 s, and the job restarts at 560 from 150 steps (its next checkpoint 300 s of training later).
    A second card failing during that wait changes nothing. Its first placement and first step of
    training stay what they were."""
    phases = _quiet(startup_s=10.0, restart_delay_s=60.0)
    spec = _job("a", 16, work_steps=5000.0, checkpoint_interval_s=300.0, checkpoint_duration_s=20.0)
    faults = (CardFailure(card=3, at_s=500.0), CardFailure(card=4, at_s=520.0))
    p = Plant(small_site, [spec], faults, config=_config(phases))
    p.run(499.0, 1.0)
    assert p.accounting().work_card_s == pytest.approx(16 * (300.0 + 169.0))
    p.run(1.0, 1.0)
    acc = p.accounting()
    assert acc.lost_work_card_s == pytest.approx(16 * 170.0)
    assert acc.work_card_s == pytest.approx(16 * 300.0)
    p.run(500.0, 1.0)  # to t = 1000
    events = p.drain_events()
    assert [e.time_s for e in events if e.kind == "requeued"] == [560.0]
    (restart,) = [e for e in events if e.kind == "started" and e.time_s > 0]
    assert restart.time_s == 560.0 and not {3, 4} & set(restart.cards)
    # start-up 10 s, then 300 s of training to the next checkpoint
    assert _phase_times(events, Phase.CHECKPOINT) == [310.0, 870.0]
    acc = p.accounting()
    assert acc.lost_work_card_s == pytest.approx(16 * 170.0)  # the second failure lost nothing more
    assert acc.work_card_s == pytest.approx(16 * (300.0 + 300.0 + (1000.0 - 890.0)))
    assert acc.jobs_submitted == 1  # a requeue is no new submission
    rec = {r.job_id: r for r in p.job_records()}["a"]
    assert rec.restarts == 1
    assert rec.start_time_s == 0.0 and rec.compute_start_s == 10.0


def test_a_requeued_job_goes_to_the_front_of_the_queue(small_site: SiteSpec) -> None:
    """A 24-card job loses a card; a 16-card job waits behind it for cards. When the first job is
    queued again it is at the front: it restarts on the 31 healthy cards and the other keeps waiting."""
    phases = _quiet(startup_s=0.0, restart_delay_s=30.0)
    big, other = _job("big", 24), _job("other", 16, submit_time_s=5.0)
    p = Plant(small_site, [big, other], [CardFailure(card=0, at_s=100.0, repair_after_s=1e6)], config=_config(phases))
    p.run(131.0, 1.0)
    events = p.drain_events()
    assert [(e.job_id, e.time_s) for e in events if e.kind == "requeued"] == [("big", 130.0)]
    assert [(e.job_id, e.time_s) for e in events if e.kind == "started"] == [("big", 0.0), ("big", 130.0)]
    assert [j.job_id for j in p.queued_jobs()] == ["other"]


def test_a_job_fails_for_good_on_the_failure_after_its_last_allowed_restart(small_site: SiteSpec) -> None:
    """``max_restarts = 2``: the first two card failures requeue the job, the third fails it."""
    phases = PhaseModel(
        startup_s=0.0, restart_delay_s=10.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0, max_restarts=2
    )
    faults = tuple(CardFailure(card=c, at_s=t) for c, t in ((0, 20.0), (1, 60.0), (2, 100.0)))
    p = Plant(small_site, [_job("a", 16)], faults, config=_config(phases))
    p.run(150.0, 1.0)
    events = p.drain_events()
    assert [e.time_s for e in events if e.kind == "requeued"] == [30.0, 70.0]
    (failed,) = [e for e in events if e.kind == "failed"]
    assert failed.time_s == 110.0 and "gave up after 2 restarts" in failed.detail
    assert p.accounting().jobs_failed == 1


def test_jobs_backfilled_in_one_pass_share_the_cards_a_reservation_leaves_spare(small_site: SiteSpec) -> None:
    """EASY backfilling (docs/twin.md, "Built-in scheduler"): "big" (12 cards) is blocked behind
    "long" (16) and "short" (8, ends at about 300 s); its reservation at short's end leaves 4 cards
    spare. Two 4-card jobs that would run past it arrive together: the first takes the 4 spare
    cards, the second would delay "big" and waits; "big" starts when "short" ends."""
    jobs = [
        _job("long", 16),
        _job("short", 8, work_steps=150.0),  # 300 s of 2-s steps
        _job("big", 12, submit_time_s=10.0),
        _job("f1", 4, submit_time_s=20.0),
        _job("f2", 4, submit_time_s=20.0),
    ]
    p = Plant(small_site, jobs, config=_config(_quiet(startup_s=0.0), backfill_wait_s=0.0))
    p.run(400.0, 1.0)
    recs = {r.job_id: r for r in p.job_records()}
    assert recs["f1"].start_time_s == 20.0
    assert recs["f2"].start_time_s is None
    short_end = recs["short"].finish_time_s
    assert short_end is not None and recs["big"].start_time_s == short_end


def test_a_job_that_does_not_fit_beside_the_ones_placed_in_the_same_pass_waits(small_site: SiteSpec) -> None:
    """Three jobs at once on 32 cards: 16 and 16 fill the site, the 8-card one waits for cards."""
    p = Plant(small_site, [_job("a", 16), _job("b", 16), _job("c", 8)], config=_config(_quiet(startup_s=0.0)))
    p.step(1.0)
    assert [len(p.job_cards(j)) for j in ("a", "b")] == [16, 16]
    assert [j.job_id for j in p.queued_jobs()] == ["c"]


def test_a_job_that_exactly_fills_what_a_supernode_has_left_goes_there(small_site: SiteSpec) -> None:
    """Compact first fit: the first supernode with *enough* free cards, equal counting as enough."""
    two = small_site.with_supernodes(2)  # 32 cards each
    p = Plant(two, [_job("a", 16), _job("b", 16), _job("c", 8)], config=_config(_quiet(startup_s=0.0)))
    p.step(1.0)
    assert p.job_cards("b").tolist() == list(range(16, 32))
    assert p.job_cards("c").tolist() == list(range(32, 40))


def test_each_phase_keeps_the_cards_at_its_own_utilization(small_site: SiteSpec) -> None:
    """COMPUTE: the busy share of a step (compute share 0.5 busy, the rest at the job's 0.2: 0.6);
    a collective stall at ``communication_utilization``, an input stall at ``waiting_utilization``,
    a checkpoint at ``checkpoint_utilization`` (0.35, 0.05 and 0.1 here: each its own)."""
    phases = PhaseModel(
        startup_s=0.0,
        comm_stalls_per_hour=60.0,
        comm_stall_median_s=20.0,
        input_stalls_per_hour=60.0,
        input_stall_median_s=20.0,
        stall_sigma=0.0,
        communication_utilization=0.35,
        checkpoint_utilization=0.1,
        waiting_utilization=0.05,
    )
    spec = _job(
        "a",
        16,
        step_time_s=1.0,
        compute_share=0.5,
        noncompute_utilization=0.2,
        checkpoint_interval_s=120.0,
        checkpoint_duration_s=20.0,
    )
    p = Plant(small_site, [spec], config=_config(phases))
    seen: dict[Phase, set[float]] = {}
    before = None
    for _ in range(3000):
        p.step(1.0)
        now = {r.job_id: r for r in p.job_records()}["a"].phase
        if now == before:  # a whole step in one phase
            seen.setdefault(now, set()).update(np.round(p.truth().utilization[:16], 9).tolist())
        before = now
    assert seen == {Phase.COMPUTE: {0.6}, Phase.COMMUNICATION: {0.35}, Phase.WAITING: {0.05}, Phase.CHECKPOINT: {0.1}}


def test_a_failure_after_a_checkpoint_loses_only_the_training_since_it(small_site: SiteSpec) -> None:
    """The checkpoint holds what the job had trained when it began (the end of the step that reached
    its interval: 772 s of computing at 7/9 of the top pace); a card failing 88 s after the 30-s
    checkpoint loses those 88 s of training, nothing from before the checkpoint."""
    spec = _job("a", 16, checkpoint_interval_s=600.0, checkpoint_duration_s=30.0)
    p = Plant(
        small_site,
        [spec],
        [CardFailure(card=0, at_s=900.0)],
        config=_config(_quiet(startup_s=10.0), initial_level=4),
    )
    p.run(900.0, 1.0)
    acc = p.accounting()
    assert acc.lost_work_card_s == pytest.approx(16 * 88.0 * SEVEN_NINTHS, rel=1e-9)
    assert acc.work_card_s == pytest.approx(16 * 772.0 * SEVEN_NINTHS, rel=1e-9)


def test_each_job_draws_its_stalls_from_its_own_stream(small_site: SiteSpec) -> None:
    """A job's stalls come from its own random stream: the same with or without another job beside
    it, and not the other job's (two jobs started together do not stall in lockstep)."""
    phases = PhaseModel(startup_s=0.0, comm_stalls_per_hour=60.0, input_stalls_per_hour=30.0)

    def stall_times(p: Plant, job_id: str) -> list[float]:
        return [e.time_s for e in p.drain_events() if e.job_id == job_id and e.kind == "phase"]

    alone = Plant(small_site, [_job("a", 16)], config=_config(phases))
    alone.run(3600.0, 1.0)
    together = Plant(small_site, [_job("a", 16), _job("b", 16)], config=_config(phases))
    together.run(3600.0, 1.0)
    events = together.drain_events()
    a_times = [e.time_s for e in events if e.job_id == "a" and e.kind == "phase"]
    b_times = [e.time_s for e in events if e.job_id == "b" and e.kind == "phase"]
    assert a_times == stall_times(alone, "a")
    assert len(a_times) > 20 and len(b_times) > 20
    assert a_times != b_times


def test_a_job_is_backfilled_only_if_its_start_up_and_training_end_before_the_reservation(
    small_site: SiteSpec,
) -> None:
    """EASY backfilling judges a job by its expected hold: start-up (60 s) plus its training in
    seconds (150 steps of 2 s = 300 s). "big" (16 cards) waits for "short" (8 cards, computing 60..360);
    "f" (8 cards, arriving at 20) would hold its cards until 20 + 60 + 300 = 380 > 360 and would
    delay "big": it waits, and "big" starts when "short" ends."""
    jobs = [
        _job("long", 16),
        _job("short", 8, work_steps=150.0),
        _job("big", 16, submit_time_s=10.0),
        _job("f", 8, submit_time_s=20.0, work_steps=150.0),
    ]
    p = Plant(small_site, jobs, config=_config(_quiet(startup_s=60.0), backfill_wait_s=0.0))
    p.run(400.0, 1.0)
    recs = {r.job_id: r for r in p.job_records()}
    assert recs["short"].finish_time_s == 360.0
    assert recs["big"].start_time_s == 360.0
    assert recs["f"].start_time_s is None


def test_a_reservation_counts_only_the_healthy_cards_a_failing_job_will_free(small_site: SiteSpec) -> None:
    """Job "a" (12 cards) loses card 0 at 50 s and lets its cards go at 150 s (restart delay 100 s): 11
    healthy ones. "big" (16 cards, blocked at 60 s with 8 free) expects 8 + 11 = 19 cards then: 3
    spare, so a 4-card job arriving at 70 s that would run past 150 s would delay it, and waits."""
    phases = _quiet(startup_s=0.0, restart_delay_s=100.0)
    jobs = [_job("a", 12), _job("c", 12), _job("big", 16, submit_time_s=60.0), _job("f", 4, submit_time_s=70.0)]
    p = Plant(small_site, jobs, (CardFailure(card=0, at_s=50.0),), config=_config(phases, backfill_wait_s=0.0))
    p.run(140.0, 1.0)
    assert [j.job_id for j in p.queued_jobs()] == ["big", "f"]
