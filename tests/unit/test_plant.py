"""The virtual plant: physics against the analytic solution, protection, latencies, scheduling,
jobs, faults, determinism."""

from __future__ import annotations

import math
from typing import TypedDict, Unpack

import numpy as np
import pytest
from readings_testing import cards_of

from twin.faults import Ambient, Fault
from twin.plant import (
    CardFailure,
    CardVariation,
    ColdPlateFouling,
    CommandError,
    ConstantAmbient,
    DiurnalAmbient,
    GarbageReadings,
    HeatWave,
    Plant,
    PlantConfig,
    PumpDegradation,
    SensorDropout,
    SensorNoise,
    StuckSensor,
)
from twin.power import SLOWDOWN_K_PER_LEVEL, PowerModel
from twin.readings import Readings
from twin.spec import SiteSpec
from twin.steady import site_steady_state
from twin.thermal import ThermalParams
from twin.workload import GeneratorConfig, JobSpec, Phase, PhaseModel, generate_jobs, relative_throughput

pytestmark = pytest.mark.unit

QUIET = PhaseModel(startup_s=0.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)


class PlantFields(TypedDict, total=False):
    """The ``PlantConfig`` fields ``exact`` sets or a test here overrides."""

    variation: CardVariation
    noise: SensorNoise
    phases: PhaseModel
    ambient: Ambient | None
    placement: str
    external_timeout_s: float
    supply_time_constant_s: float
    initial_low_power: bool
    pump_hold_s: float


class _JobOptions(TypedDict, total=False):
    """The ``JobSpec`` fields with a default that ``job`` sets or a test here overrides."""

    submit_time_s: float
    checkpoint_interval_s: float
    checkpoint_duration_s: float
    first_checkpoint_after_s: float | None
    noncompute_utilization: float


class JobFields(_JobOptions, total=False):
    """What a test here may override in ``job``."""

    step_time_s: float
    compute_share: float


class _JobArgs(_JobOptions):
    """``job``'s arguments of ``JobSpec`` after ``work_steps``."""

    step_time_s: float
    compute_share: float


def exact(**kw: Unpack[PlantFields]) -> PlantConfig:
    """No card spread, no sensor noise, no stalls: results comparable with closed forms."""
    base: PlantFields = {
        "variation": CardVariation.none(),
        "noise": SensorNoise.none(),
        "phases": QUIET,
        **kw,
    }
    return PlantConfig(**base)


def job(job_id: str, n_cards: int, work_steps: float = 1e9, **kw: Unpack[JobFields]) -> JobSpec:
    args: _JobArgs = {
        "step_time_s": 1.0,
        "compute_share": 1.0,
        "checkpoint_interval_s": 1e9,
        "noncompute_utilization": 0.0,
        **kw,
    }
    return JobSpec(job_id, n_cards, work_steps=work_steps, **args)


# ------------------------------------------------------------------------------------------------
# physics
# ------------------------------------------------------------------------------------------------
def test_plant_energy_balance_and_die_temperature_at_steady_state(site: SiteSpec) -> None:
    p = Plant(site, [job("all", site.n_cards)], config=exact())
    p.run(900.0, 1.0)
    tr = p.truth()
    assert np.all(tr.utilization == 1.0) and np.all(tr.effective_level == 0)
    # heat into the coolant = electrical power, per rack and in total (closed to rounding)
    np.testing.assert_allclose(tr.rack_heat_w, tr.rack_power_w, rtol=1e-9)
    m_cp = site.loop_flow_per_rack_lpm() / 60_000 * site.loop.density_kg_per_m3 * site.loop.specific_heat_j_per_kg_k
    np.testing.assert_allclose(m_cp * (tr.rack_return_temp_c - tr.rack_supply_temp_c), tr.rack_heat_w, rtol=1e-9)
    # steady die temperature = T_in + P R within 0.1 K, and the same state as twin.steady
    np.testing.assert_allclose(tr.die_temp_c, tr.rack_supply_temp_c[0] + tr.card_power_w * tr.r_total_k_per_w, atol=0.1)
    ss = site_steady_state(site, level=0, utilization=1.0)
    np.testing.assert_allclose(tr.card_power_w, ss.card_power_w, rtol=1e-6)
    np.testing.assert_allclose(tr.die_temp_c, ss.die_temp_c, atol=0.01)
    assert tr.cooling.facility_power_w == pytest.approx(ss.cooling.facility_power_w, rel=1e-6)


@pytest.mark.parametrize("dt_s", [1.0, 10.0, 60.0])
def test_energy_is_conserved_through_transients_at_any_step(small_site: SiteSpec, dt_s: float) -> None:
    """A cold start, then a set-point step and a job ending: every joule the cards and hosts draw is
    heat to the coolant or heat stored in the dies and plates, step by step, whatever the step. The
    facility plant works on that heat (not on the power drawn), the UPS losses on the power drawn
    (2.5%), and the accounting integrates the cooling and facility powers of every step and keeps the
    hottest die seen."""
    site = small_site
    p = Plant(site, [job("a", site.n_cards, work_steps=300.0)], config=exact())
    c_die, c_plate = site.card.die_heat_capacity_j_per_k, site.cold_plate.heat_capacity_j_per_k

    def stored_j() -> float:
        tr = p.truth()
        return float((c_die * tr.die_temp_c + c_plate * tr.plate_temp_c).sum())

    e0 = stored_j()
    drawn_j = heat_j = cooling_j = facility_j = 0.0
    hottest_c = float(p.truth().die_temp_c.max())
    steps = round(600.0 / dt_s)
    for k in range(steps):
        if k == steps // 2:
            p.set_supply_temp(40.0)
        p.step(dt_s)
        tr = p.truth()
        drawn_j += float(tr.rack_power_w.sum()) * dt_s  # the powers of the step just taken
        heat_j += float(tr.rack_heat_w.sum()) * dt_s
        cooling_j += tr.cooling.cooling_power_w * dt_s
        facility_j += tr.cooling.facility_power_w * dt_s
        hottest_c = max(hottest_c, float(tr.die_temp_c.max()))
        assert tr.cooling.heat_w == pytest.approx(float(tr.rack_heat_w.sum()), rel=1e-12)
        assert tr.cooling.ups_loss_w == pytest.approx(0.025 * float(tr.rack_power_w.sum()), rel=1e-12)
    acc = p.accounting()
    assert acc.it_energy_j == pytest.approx(drawn_j, rel=1e-12)
    assert acc.cooling_energy_j == pytest.approx(cooling_j, rel=1e-12)
    assert acc.facility_energy_j == pytest.approx(facility_j, rel=1e-12)
    assert acc.max_die_temp_c == hottest_c > float(tr.die_temp_c.max())
    stored = stored_j() - e0
    assert abs(stored) > 0.005 * drawn_j  # a real transient: the dies and plates took up heat
    assert drawn_j - heat_j == pytest.approx(stored, rel=1e-9, abs=1e-9 * drawn_j)


def test_step_size_does_not_change_the_steady_state(small_site: SiteSpec) -> None:
    finals = []
    for dt in (0.1, 1.0, 30.0, 300.0):
        p = Plant(small_site, [job("a", small_site.n_cards)], config=exact())
        p.run(1200.0, dt)
        finals.append(p.truth().die_temp_c)
    for f in finals[1:]:
        np.testing.assert_allclose(f, finals[0], atol=1e-3)


def test_energy_integrals_accumulate_power(small_site: SiteSpec) -> None:
    p = Plant(small_site, config=exact())
    p.run(100.0, 1.0)
    tr = p.truth()
    acc = p.accounting()
    assert acc.it_energy_j == pytest.approx(tr.it_power_w * 100.0, rel=1e-9)
    assert acc.facility_energy_j == pytest.approx(tr.cooling.facility_power_w * 100.0, rel=1e-9)
    assert acc.pue == pytest.approx(tr.cooling.pue)


# ------------------------------------------------------------------------------------------------
# the card's own protection and latencies
# ------------------------------------------------------------------------------------------------
def test_power_brake_holds_each_card_within_its_limit(small_site: SiteSpec) -> None:
    p = Plant(small_site, [job("a", small_site.n_cards)], config=exact())
    p.run(60.0, 1.0)
    p.set_power_limits(np.arange(8), 450.0)
    for _ in range(120):
        p.step(1.0)
        tr = p.truth()
        assert np.all(tr.card_power_w[:8] <= 450.0 + 1e-9)
    assert np.all(tr.effective_level[:8] > 0) and np.all(tr.level[:8] == 0)
    # the brake picks the fastest level within the limit (as twin.power's protected_level): one level
    # faster, the card (at utilization 1, its job's slowest) would draw more than 450 W
    model = PowerModel.from_card(small_site.card)
    np.testing.assert_array_equal(
        tr.effective_level[:8], model.protected_level(tr.level[:8], tr.utilization[:8], tr.die_temp_c[:8], 450.0)
    )
    assert np.all(model.active_power_w(tr.effective_level[:8] - 1, tr.utilization[:8], tr.die_temp_c[:8]) > 450.0)
    # throttled card-seconds: the 8 braked cards, 120 s each; the others run at their commanded level
    assert p.accounting().throttled_card_s == pytest.approx(8 * 120.0)
    # the job runs at the pace of its slowest (braked) card; the others wait at lower utilization
    assert np.all(tr.utilization[8:] < 1.0)


def test_the_power_brake_judges_the_power_the_card_draws_at_its_utilization(small_site: SiteSpec) -> None:
    """A job computing half of each step (the rest at utilization 0.2) keeps its cards at
    utilization 0.6: ~431 W at the top clock, ~659 W had they computed all the time. Under a 500 W
    limit nothing is braked: the brake acts on the power the card would draw, not on its worst case."""
    p = Plant(small_site, [job("a", small_site.n_cards, compute_share=0.5, noncompute_utilization=0.2)], config=exact())
    p.run(300.0, 1.0)
    p.set_power_limits(np.arange(small_site.n_cards), 500.0)
    p.run(60.0, 1.0)
    tr = p.truth()
    np.testing.assert_allclose(tr.utilization, 0.6)
    assert np.all(tr.effective_level == 0) and tr.card_power_w.max() < 500.0
    assert p.accounting().throttled_card_s == 0.0


def test_the_power_brake_holds_cards_that_differ_from_the_spec(small_site: SiteSpec) -> None:
    """With the default card-to-card spread (idle, dynamic, leakage power and thermal resistance),
    every card stays within its own limit, whatever the limit: the brake works on each card's own
    parameters. One single-card job per card, so each runs at utilization 1 at its own braked level."""
    jobs = [job(f"j{c}", 1) for c in range(small_site.n_cards)]
    p = Plant(small_site, jobs, config=exact(variation=CardVariation()))
    p.run(120.0, 1.0)
    limits = np.linspace(380.0, 640.0, small_site.n_cards)
    p.set_power_limits(np.arange(small_site.n_cards), limits)
    for _ in range(60):
        p.step(1.0)
        assert np.all(p.truth().card_power_w <= limits + 1e-9)


def test_rack_over_limit_accounting_integrates_each_racks_excess(site: SiteSpec) -> None:
    """At full load and the top clock a busy rack draws more than its 50 kW limit (twin.steady): the
    accounting adds, per step, the seconds of each rack over its limit and the energy above it."""
    p = Plant(site, [job("a", 256)], config=exact())
    over_s = over_j = 0.0
    limit_w = site.rack.power_limit_w
    for _ in range(120):
        p.step(1.0)
        excess = p.truth().rack_power_w - limit_w
        over_s += float((excess > 0).sum())
        over_j += float(excess[excess > 0].sum())
    busy = p.truth().rack_power_w > limit_w
    assert 0 < busy.sum() < site.n_racks  # some racks over, some not: per rack, not per site
    acc = p.accounting()
    assert acc.rack_over_limit_s == pytest.approx(over_s, rel=1e-12) and over_s > 120.0
    assert acc.rack_over_limit_j == pytest.approx(over_j, rel=1e-12)


def test_thermal_slowdown_above_the_slowdown_temperature(small_site: SiteSpec) -> None:
    fouled = ColdPlateFouling(card=3, start_s=0.0, r_factor=2.5)
    p = Plant(small_site, [job("a", small_site.n_cards)], [fouled], config=exact())
    p.set_supply_temp(45.0)
    p.run(1800.0, 1.0)
    tr = p.truth()
    slowdown = small_site.card.slowdown_temp_c
    # firmware steps one level down per K over the slowdown temperature (twin.power): the die
    # settles just above it, at a lower level, instead of running away
    assert tr.effective_level[3] > 0
    assert tr.die_temp_c[3] <= slowdown + SLOWDOWN_K_PER_LEVEL * (tr.effective_level[3] + 1)
    assert tr.die_temp_c[3] < small_site.card.max_temp_c
    healthy = np.arange(small_site.n_cards) != 3
    assert np.all(tr.die_temp_c[healthy] < slowdown)
    assert np.all(tr.effective_level[healthy] == 0)


def test_the_steady_state_predicts_where_an_overheating_card_settles(small_site: SiteSpec) -> None:
    """twin.steady (which judges racktwin optimize's plans) puts a card throttled by its firmware where
    the plant settles it: a plate fouled to 4 x its resistance at 45 deg C water runs at level 5 with
    its die 4.2 K over the slowdown temperature, in both (its job's other cards wait for it at a lower
    utilization)."""
    fouled = ColdPlateFouling(card=3, start_s=0.0, r_factor=4.0)
    p = Plant(small_site, [job("a", small_site.n_cards)], [fouled], config=exact(supply_time_constant_s=0.0))
    p.set_supply_temp(45.0)
    p.run(1800.0, 1.0)
    tr = p.truth()
    th = ThermalParams.from_site(small_site)
    th.r_case_coolant_k_per_w[3] *= 4.0
    ss = site_steady_state(small_site, level=0, utilization=tr.utilization, supply_temp_c=45.0, thermal=th)
    np.testing.assert_array_equal(ss.level, tr.effective_level)
    assert int(ss.level[3]) == 5
    np.testing.assert_allclose(ss.die_temp_c, tr.die_temp_c, atol=0.01)


def test_dvfs_commands_take_effect_after_the_latency(small_site: SiteSpec) -> None:
    p = Plant(small_site, config=exact())
    latency = small_site.card.dvfs_latency_s
    p.run(10.0, 0.1)
    p.set_levels([0, 1], 3)
    p.run(latency - 0.1, 0.1)
    assert p.truth().level[0] == 0
    p.run(0.2, 0.1)
    assert p.truth().level[:2].tolist() == [3, 3]


def test_wake_latency_is_honoured_and_a_job_on_sleeping_cards_waits(small_site: SiteSpec) -> None:
    cfg = exact(placement="external", external_timeout_s=1e9)
    p = Plant(small_site, [job("a", 4)], config=cfg)
    p.enter_low_power(np.arange(small_site.n_cards))
    p.step(1.0)
    assert p.truth().card_power_w[0] < small_site.card.idle_power_w
    p.place_job("a", [0, 1, 2, 3])
    wake = small_site.card.wake_latency_s
    t0 = p.time_s
    r = p.readings()
    assert r.racks[0].cards is not None and bool(r.racks[0].cards.waking[0])
    phases: list[tuple[float, Phase]] = []
    while p.time_s < t0 + wake + 2.0:
        p.step(0.5)
        phases.extend((e.time_s, e.phase) for e in p.drain_events() if e.kind == "phase")
    start = [t for t, ph in phases if ph == Phase.COMPUTE]
    assert start and start[0] >= t0 + wake - 1e-9
    assert not cards_of(p.readings().racks[0]).waking[0]


def test_a_card_put_back_to_sleep_while_waking_waits_its_whole_next_wake(small_site: SiteSpec) -> None:
    """The end of a wake cut short by ``enter_low_power`` used to end the next wake early."""
    wake = small_site.card.wake_latency_s
    p = Plant(small_site, config=exact(initial_low_power=True))
    p.wake([0])
    p.step(0.5 * wake)
    p.enter_low_power([0])
    t0 = p.time_s
    p.wake([0])  # ready at t0 + wake, after the first wake's end (at wake)
    p.step(0.75 * wake)  # past the first wake's end, before t0 + wake
    cards = p.readings().racks[0].cards
    assert cards is not None and bool(cards.waking[0])
    p.run(t0 + wake - p.time_s)
    cards = p.readings().racks[0].cards
    assert cards is not None and not cards.waking[0] and not cards.low_power[0]


def test_commands_refuse_invalid_requests_with_a_reason(small_site: SiteSpec) -> None:
    p = Plant(small_site, [job("a", 4)], [CardFailure(card=30, at_s=0.0)], config=exact())
    p.step(1.0)
    n_levels = small_site.card.n_levels
    with pytest.raises(CommandError, match=f"not in 0..{n_levels - 1}"):
        p.set_levels([5], n_levels)
    with pytest.raises(CommandError, match="card 30 has failed"):
        p.set_levels([30], 1)
    with pytest.raises(CommandError, match="card 0 is busy with job a"):
        p.enter_low_power([0, 10])
    with pytest.raises(CommandError, match="not within"):
        p.set_power_limits([1], 50.0)
    with pytest.raises(CommandError, match=r"not in 0\.\.31"):
        p.wake([99])
    with pytest.raises(CommandError, match="deg C is not within"):
        p.set_supply_temp(80.0)
    with pytest.raises(CommandError, match="unknown job"):
        p.place_job("zzz", [1])
    with pytest.raises(CommandError, match="is running, not queued"):
        p.place_job("a", [10, 11, 12, 13])
    assert not p.truth().low_power[10], "a refused command changes nothing"


def test_commands_with_values_that_do_not_fit_their_targets_are_refused(small_site: SiteSpec) -> None:
    """A command takes one value for all its targets or one each; anything else, or values that
    are not numbers, is a ``CommandError`` (as the module promises), and nothing is applied."""
    p = Plant(small_site, config=exact())
    p.step(1.0)
    before, limits_before = p.truth(), p._limit.copy()
    with pytest.raises(CommandError, match=r"set_levels: 2 levels for 3 targets"):
        p.set_levels([1, 2, 3], [1, 2])
    with pytest.raises(CommandError, match="set_levels: levels must be numbers"):
        p.set_levels([1], ["fast"])
    with pytest.raises(CommandError, match="set_levels: levels must be numbers"):
        p.set_levels([1], True)
    with pytest.raises(CommandError, match=r"set_power_limits: 3 limits for 2 targets"):
        p.set_power_limits([1, 2], [400.0, 500.0, 600.0])
    with pytest.raises(CommandError, match=r"set_pump_speed: 2 speeds for 1 targets"):
        p.set_pump_speed([0], [0.8, 0.9])
    with pytest.raises(CommandError, match="set_pump_speed: speeds must be numbers"):
        p.set_pump_speed([0], None)
    p.step(1.0)
    after = p.truth()
    assert np.array_equal(after.level, before.level)
    assert np.array_equal(p._limit, limits_before)
    assert np.array_equal(after.rack_pump_speed_frac, before.rack_pump_speed_frac)
    p.set_levels([1, 2], [3, 4])  # one each: taken
    p.set_power_limits([1, 2], 500.0)  # one for all: taken
    p.step(1.0 + small_site.card.dvfs_latency_s)
    assert p.truth().level[1:3].tolist() == [3, 4]
    assert p._limit[1:3].tolist() == [500.0, 500.0]


# ------------------------------------------------------------------------------------------------
# scheduling and jobs
# ------------------------------------------------------------------------------------------------
def test_builtin_first_fit_is_compact_and_prefers_one_supernode(site: SiteSpec) -> None:
    two = site.with_supernodes(2)
    p = Plant(two, [job("a", 256), job("b", 384), job("c", 128)], config=exact())
    p.step(1.0)
    assert p.job_cards("a").tolist() == list(range(256))
    assert p.job_cards("b").tolist() == list(range(512, 896))  # 384 do not fit beside a in supernode 0
    assert p.job_cards("c").tolist() == list(range(256, 384))


def test_external_placement_and_fallback_after_the_timeout(small_site: SiteSpec) -> None:
    cfg = exact(placement="external", external_timeout_s=60.0)
    p = Plant(small_site, [job("a", 8), job("b", 8)], config=cfg)
    p.step(1.0)
    assert {j.job_id for j in p.queued_jobs()} == {"a", "b"}
    p.place_job("b", [31, 30, 29, 28, 27, 26, 25, 24])
    assert p.job_cards("b").tolist() == list(range(24, 32))
    p.run(50.0, 1.0)
    assert [j.job_id for j in p.queued_jobs()] == ["a"]
    assert p.accounting().jobs_placed_by_plant == 0  # b was the agent's
    p.run(15.0, 1.0)
    assert p.queued_jobs() == ()
    assert p.job_cards("a").tolist() == list(range(8))
    assert p.accounting().jobs_placed_by_plant == 1  # a was the fallback's
    builtin = Plant(small_site, [job("a", 8)], config=exact())
    builtin.step(1.0)
    assert builtin.accounting().jobs_placed_by_plant == 0  # the builtin scheduler is no fallback


def test_job_lifecycle_checkpoints_and_work_accounting(small_site: SiteSpec) -> None:
    spec = job("a", 16, work_steps=2000.0, checkpoint_interval_s=900.0, checkpoint_duration_s=60.0)
    p = Plant(
        small_site,
        [spec],
        config=exact(phases=PhaseModel(startup_s=30.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)),
    )
    events = []
    while p.accounting().jobs_finished == 0 and p.time_s < 5000:
        p.step(1.0)
        events.extend(p.drain_events())
    kinds = [(e.kind, e.phase) for e in events]
    assert kinds[0] == ("submitted", Phase.WAITING)
    assert kinds[1] == ("started", Phase.WAITING) and len(events[1].cards) == 16
    assert [ph for k, ph in kinds if k == "phase"] == [
        Phase.COMPUTE,
        Phase.CHECKPOINT,
        Phase.COMPUTE,
        Phase.CHECKPOINT,
        Phase.COMPUTE,
    ]
    ckpt = [e.time_s for e in events if e.kind == "phase" and e.phase == Phase.CHECKPOINT]
    assert ckpt[0] == pytest.approx(30.0 + 900.0, abs=1.0)
    assert ckpt[1] == pytest.approx(30.0 + 1800.0 + 60.0, abs=2.0)
    assert kinds[-1][0] == "finished"
    assert events[-1].time_s == pytest.approx(30.0 + 2000.0 + 120.0, abs=2.0)
    acc = p.accounting()
    assert acc.work_card_s == pytest.approx(spec.work_card_s, rel=1e-9)
    rec = {r.job_id: r for r in p.job_records()}["a"]
    assert rec.state == "finished" and rec.work_done_card_s == pytest.approx(spec.work_card_s)


def test_a_job_part_way_through_its_checkpoint_interval(small_site: SiteSpec) -> None:
    """A job that was running before it was submitted here (warm start) checkpoints first after
    ``first_checkpoint_after_s`` of training, then every interval; a card failure before that first
    checkpoint rolls it back to its last one, which lies before its progress 0 (that work is lost too)."""
    phases = PhaseModel(startup_s=0.0, restart_delay_s=60.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)
    a = job(
        "a",
        16,
        work_steps=5000.0,
        checkpoint_interval_s=900.0,
        checkpoint_duration_s=0.0,
        first_checkpoint_after_s=200.0,
    )
    p = Plant(small_site, [a], config=exact(phases=phases))
    p.run(1200.0, 1.0)
    ckpt = [e.time_s for e in p.drain_events() if e.kind == "phase" and e.phase == Phase.CHECKPOINT]
    assert ckpt == pytest.approx([200.0, 1100.0], abs=1.0)

    b = job("b", 16, work_steps=5000.0, checkpoint_interval_s=900.0, first_checkpoint_after_s=200.0)
    p = Plant(small_site, [b], [CardFailure(card=3, at_s=150.0)], config=exact(phases=phases))
    p.run(151.0, 1.0)
    acc = p.accounting()
    # 150 s of training here plus the 700 s it had trained since its last checkpoint before
    assert acc.lost_work_card_s == pytest.approx((150.0 + 700.0) * 16, abs=16.0)
    assert acc.work_card_s == pytest.approx(-700.0 * 16, abs=16.0)
    assert [r.progress_frac for r in p.readings().jobs] == [0.0]  # reported within 0..1


def test_first_checkpoint_after_is_checked(small_site: SiteSpec) -> None:
    with pytest.raises(ValueError, match="first_checkpoint_after_s must be within"):
        job("a", 8, checkpoint_interval_s=900.0, first_checkpoint_after_s=901.0)
    with pytest.raises(ValueError, match="first_checkpoint_after_s must be within"):
        job("a", 8, checkpoint_interval_s=900.0, first_checkpoint_after_s=0.0)


def test_communication_stalls_run_at_the_phase_models_utilization(small_site: SiteSpec) -> None:
    """A stalled collective spins at ``PhaseModel.communication_utilization`` whatever the job's
    noncompute utilization (its steps' clock-insensitive part, which may be memory-bound and busy)."""
    spec = job("a", 16, compute_share=0.5, noncompute_utilization=0.9)
    phases = PhaseModel(
        startup_s=0.0,
        comm_stalls_per_hour=360.0,
        comm_stall_median_s=30.0,
        input_stalls_per_hour=0.0,
        communication_utilization=0.35,
    )
    p = Plant(small_site, [spec], config=exact(phases=phases))
    seen: dict[Phase, set[float]] = {}
    before = None
    for _ in range(900):
        p.step(1.0)
        now = {r.job_id: r for r in p.job_records()}["a"].phase
        if now == before:  # a whole step in one phase
            seen.setdefault(now, set()).update(np.round(p.truth().utilization[:16], 9).tolist())
        before = now
    assert seen[Phase.COMMUNICATION] == {0.35}
    assert seen[Phase.COMPUTE] == {0.95}  # 0.5 busy + 0.5 x 0.9


def test_a_job_runs_at_the_pace_of_its_slowest_card(small_site: SiteSpec) -> None:
    cs = 0.8
    spec = job("a", 16, compute_share=cs, noncompute_utilization=0.2)
    p = Plant(small_site, [spec], config=exact())
    p.run(10.0, 1.0)
    p.set_levels([5], 7)
    p.run(2.0, 1.0)
    w0 = p.accounting().work_card_s
    p.run(100.0, 1.0)
    clocks = small_site.card.clocks_mhz
    expected = float(relative_throughput(cs, clocks[7] / clocks[0])) * 16 * 100.0
    assert p.accounting().work_card_s - w0 == pytest.approx(expected, rel=1e-9)
    u = p.truth().utilization
    assert u[5] > u[0]  # the fast cards wait for card 5


def test_card_failure_requeues_the_job_from_its_last_checkpoint(small_site: SiteSpec) -> None:
    phases = PhaseModel(startup_s=10.0, restart_delay_s=60.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)
    spec = job("a", 16, work_steps=5000.0, checkpoint_interval_s=300.0, checkpoint_duration_s=20.0)
    fail = CardFailure(card=3, at_s=500.0, repair_after_s=1000.0)
    p = Plant(small_site, [spec], [fail], config=exact(phases=phases))
    events = []
    p.run(499.0, 1.0)
    work_before = p.accounting().work_card_s
    p.run(2.0, 1.0)
    events.extend(p.drain_events())
    assert events[-1].kind == "phase" and events[-1].phase == Phase.WAITING and "card 3 failed" in events[-1].detail
    tr = p.truth()
    assert tr.failed[3] and tr.card_power_w[3] == 0.0
    with pytest.raises(CommandError, match="has failed"):
        p.set_power_limits([3], 300.0)
    acc = p.accounting()
    assert acc.lost_work_card_s > 0
    assert acc.work_card_s == pytest.approx(work_before - acc.lost_work_card_s + 16.0, abs=20.0)
    p.run(70.0, 1.0)
    events = p.drain_events()
    kinds = [e.kind for e in events]
    assert "requeued" in kinds and "started" in kinds
    started = next(e for e in events if e.kind == "started")
    assert 3 not in started.cards and len(started.cards) == 16
    rec = {r.job_id: r for r in p.job_records()}["a"]
    assert rec.restarts == 1
    p.run(1000.0, 10.0)
    assert not p.truth().failed[3]


def test_a_job_that_keeps_losing_cards_fails(small_site: SiteSpec) -> None:
    phases = PhaseModel(
        startup_s=0.0, restart_delay_s=10.0, comm_stalls_per_hour=0, input_stalls_per_hour=0, max_restarts=1
    )
    faults = [CardFailure(card=0, at_s=5.0), CardFailure(card=16, at_s=50.0)]
    p = Plant(small_site, [job("a", 30)], faults, config=exact(phases=phases))
    p.run(100.0, 1.0)
    kinds = [e.kind for e in p.drain_events()]
    assert kinds.count("requeued") == 1 and kinds[-1] == "failed"
    assert p.accounting().jobs_failed == 1


def test_overlapping_failures_of_a_card_end_with_the_last_repair(small_site: SiteSpec) -> None:
    """A card is failed while any failure of it is in force: the repair of a short failure does not
    heal a permanent one that came in the meantime, and of two repaired ones the later repair counts."""
    faults = [
        CardFailure(card=3, at_s=2.0, repair_after_s=1.0),  # 2..3
        CardFailure(card=3, at_s=2.5),  # for good
        CardFailure(card=20, at_s=2.0, repair_after_s=3.0),  # 2..5
        CardFailure(card=20, at_s=4.0, repair_after_s=4.0),  # 4..8
    ]
    p = Plant(small_site, [], faults, config=exact())
    failed: dict[int, tuple[bool, bool]] = {}
    for _ in range(10):
        p.step(1.0)
        tr = p.truth()
        failed[round(p.time_s)] = (bool(tr.failed[3]), bool(tr.failed[20]))
    assert [failed[t][0] for t in range(1, 11)] == [False] + [True] * 9
    assert [failed[t][1] for t in range(1, 11)] == [False] + [True] * 6 + [False] * 3


# ------------------------------------------------------------------------------------------------
# faults and sensors
# ------------------------------------------------------------------------------------------------
def test_sensor_faults(small_site: SiteSpec) -> None:
    faults: list[Fault] = [
        SensorDropout(rack=0, start_s=10.0, end_s=20.0),
        StuckSensor(rack=1, start_s=30.0, end_s=60.0),
        GarbageReadings(rack=0, start_s=40.0, end_s=50.0, mode="nan"),
        GarbageReadings(rack=1, start_s=70.0, end_s=80.0, mode="garbage", fraction=1.0),
        StuckSensor(rack=0, start_s=90.0, card=5),
    ]
    p = Plant(small_site, [job("a", 32)], faults, config=PlantConfig(seed=1))

    def at(t: float) -> Readings:
        p.run(t - p.time_s, 1.0)
        return p.readings()

    assert [r.rack for r in at(15.0).racks] == [1]
    assert [r.rack for r in at(25.0).racks] == [0, 1]
    first = at(31.0).racks[1]
    again = at(45.0).racks[1]
    assert again.time_s == 45.0
    assert again.cards is not None and first.cards is not None
    np.testing.assert_array_equal(again.cards.die_temp_c, first.cards.die_temp_c)
    nan = at(46.0).racks[0]
    assert nan.cards is not None and np.all(np.isnan(nan.cards.power_w))
    moving = at(61.0).racks[1]
    assert moving.cards is not None and not np.array_equal(moving.cards.die_temp_c, first.cards.die_temp_c)
    garbage = at(75.0).racks[1]
    assert garbage.cards is not None and np.all(garbage.cards.die_temp_c > 1000)
    a = at(91.0).racks[0].cards
    b = at(99.0).racks[0].cards
    assert a is not None and b is not None
    assert a.power_w[5] == b.power_w[5] and a.power_w[6] != b.power_w[6]


def test_each_fault_is_in_force_from_its_start_up_to_its_end(small_site: SiteSpec) -> None:
    """Read at every second: each fault shows from the reading at its start (``start_s``, ``at_s``) up to
    the one before its end (``end_s``, the repair), on the rack or card it names and no other: a fault
    a step late or early at either end would shift every figure judged on the truth log. A heat wave
    without a ramp is a step like the others: in force for its ``hold_s``, from ``start_s`` on."""
    base = ConstantAmbient(20.0)
    faults: list[Fault] = [
        SensorDropout(rack=0, start_s=3.0, end_s=6.0),
        GarbageReadings(rack=1, start_s=4.0, end_s=7.0, mode="nan"),
        CardFailure(card=3, at_s=5.0, repair_after_s=3.0),
        PumpDegradation(rack=1, start_s=2.0, flow_fraction=0.5, end_s=6.0),
        ColdPlateFouling(card=20, start_s=3.0, r_factor=4.0, end_s=7.0),
        HeatWave(start_s=4.0, peak_delta_k=10.0, ramp_s=0.0, hold_s=3.0),
    ]
    p = Plant(small_site, [], faults, config=exact(ambient=base))
    nominal_lpm = small_site.loop_flow_per_rack_lpm()
    seen: dict[str, list[int]] = {k: [] for k in ("dropped", "nan", "failed", "slow", "fouled", "hot", "other")}
    for t in range(11):
        if t:
            p.step(1.0)
        assert p.time_s == t
        r, tr = p.readings(), p.truth()
        by_rack = {rr.rack: rr for rr in r.racks}
        r1 = by_rack[1].cards
        assert r1 is not None
        for key, now in (
            ("dropped", 0 not in by_rack),
            ("nan", bool(np.all(np.isnan(r1.power_w)))),
            ("failed", bool(tr.failed[3])),
            ("slow", tr.rack_flow_lpm[1] == pytest.approx(0.5 * nominal_lpm)),
            ("fouled", tr.r_total_k_per_w[20] > 1.5 * tr.r_total_k_per_w[21]),  # same rack, same flow
            ("hot", tr.ambient_temp_c == pytest.approx(30.0)),
        ):
            if now:
                seen[key].append(t)
        # and nowhere else
        others = (
            tr.failed.sum() - tr.failed[3] > 0
            or tr.rack_flow_lpm[0] != pytest.approx(nominal_lpm)
            or np.ptp(np.delete(tr.r_total_k_per_w[16:], 4)) > 1e-12
            or (0 in by_rack and np.isnan(cards_of(by_rack[0]).power_w).any())
        )
        if others:
            seen["other"].append(t)
    assert seen == {
        "dropped": [3, 4, 5],
        "nan": [4, 5, 6],
        "failed": [5, 6, 7],
        "slow": [2, 3, 4, 5],
        "fouled": [3, 4, 5, 6],
        "hot": [4, 5, 6],
        "other": [],
    }


def test_faults_from_t0_are_in_force_before_the_first_step(small_site: SiteSpec) -> None:
    """A fault starting at t = 0 shows in the readings and truth of t = 0, taken before any step
    (the simulator publishes them as its first telemetry round)."""
    faults: list[Fault] = [
        SensorDropout(rack=0, start_s=0.0, end_s=5.0),
        GarbageReadings(rack=1, start_s=0.0, end_s=5.0, mode="garbage", fraction=1.0),
        CardFailure(card=19, at_s=0.0),
        PumpDegradation(rack=1, start_s=0.0, flow_fraction=0.3),
    ]
    p = Plant(small_site, [], faults, config=exact())
    r = p.readings()
    assert r.time_s == 0.0 and [rr.rack for rr in r.racks] == [1]
    r1 = r.racks[0]
    assert r1.cards is not None and r1.loop is not None
    assert np.all(r1.cards.power_w == -1234.5) and r1.loop.flow_lpm == -1.0
    tr = p.truth()
    assert tr.failed[19] and tr.card_power_w[19] == 0.0
    assert tr.rack_flow_lpm[1] == pytest.approx(0.3 * small_site.loop_flow_per_rack_lpm())
    assert tr.rack_power_w[1] == pytest.approx(tr.card_power_w[16:].sum() + small_site.rack.host_overhead_w)
    # and nothing is applied twice: the first step goes on from there
    p.step(1.0)
    assert p.truth().failed.sum() == 1 and [rr.rack for rr in p.readings().racks] == [1]


def test_next_fault_change_is_the_next_edge_of_a_plant_fault(small_site: SiteSpec) -> None:
    faults: list[Fault] = [
        CardFailure(card=3, at_s=15.0, repair_after_s=10.0),
        SensorDropout(rack=0, start_s=7.5, end_s=8.0),
        HeatWave(start_s=1.0, peak_delta_k=5.0),  # smooth: no edge
    ]
    p = Plant(small_site, [job("a", 4, submit_time_s=3.0)], faults, config=exact())  # a submission: no edge
    edges = []
    while math.isfinite(p.next_fault_change_s()):
        edges.append(p.next_fault_change_s())
        p.step(edges[-1] - p.time_s)
    assert edges == [7.5, 8.0, 15.0, 25.0]


def test_pump_degradation_raises_return_and_die_temperatures(small_site: SiteSpec) -> None:
    fault = PumpDegradation(rack=1, start_s=600.0, flow_fraction=0.5, ramp_s=60.0)
    p = Plant(small_site, [job("a", 32)], [fault], config=exact())
    p.run(590.0, 1.0)
    before = p.truth()
    p.run(900.0, 1.0)
    after = p.truth()
    assert after.rack_flow_lpm[1] == pytest.approx(0.5 * before.rack_flow_lpm[1])
    dt_before = before.rack_return_temp_c - before.rack_supply_temp_c
    dt_after = after.rack_return_temp_c - after.rack_supply_temp_c
    assert dt_after[1] == pytest.approx(2.0 * dt_before[1], rel=0.02)
    assert dt_after[0] == pytest.approx(dt_before[0], rel=1e-3)
    assert after.die_temp_c[16:].mean() > before.die_temp_c[16:].mean() + 2.0
    assert after.r_total_k_per_w[16] > before.r_total_k_per_w[16]
    loop = p.readings().racks[1].loop
    assert loop is not None and loop.flow_lpm == pytest.approx(after.rack_flow_lpm[1])


def test_heat_wave_adds_to_the_ambient_profile(small_site: SiteSpec) -> None:
    base = DiurnalAmbient(mean_c=25.0, amplitude_k=5.0, peak_time_s=15 * 3600.0)
    wave = HeatWave(start_s=3600.0, peak_delta_k=10.0, ramp_s=1800.0, hold_s=3600.0)
    p = Plant(small_site, [job("a", 32)], [wave], config=exact(ambient=base))
    assert p.ambient_c(0.0) == pytest.approx(25.0 + 5.0 * math.cos(2 * math.pi * -15 / 24))
    assert p.ambient_c(3600.0 + 900.0) == pytest.approx(base.temp_at_c(4500.0) + 5.0)
    assert p.ambient_c(3600.0 + 3000.0) == pytest.approx(base.temp_at_c(6600.0) + 10.0)
    assert p.ambient_c(20000.0) == pytest.approx(base.temp_at_c(20000.0))
    p.run(3000.0, 10.0)
    cool = p.truth().cooling
    p.run(3000.0, 10.0)
    hot = p.truth().cooling
    assert hot.ambient_temp_c > cool.ambient_temp_c + 9.0
    assert hot.cooling_power_w > cool.cooling_power_w


# ------------------------------------------------------------------------------------------------
# determinism
# ------------------------------------------------------------------------------------------------
def _trajectory(site: SiteSpec, seed: int, read_every: int) -> tuple[list[np.ndarray], list[str]]:
    cfg = GeneratorConfig(max_cards=16, duration_scale=0.1, target_allocation=0.9)
    jobs = generate_jobs(site.n_cards, 1800, seed=seed, config=cfg)
    faults: list[Fault] = [CardFailure(card=7, at_s=400.0), PumpDegradation(rack=0, start_s=300.0, flow_fraction=0.7)]
    p = Plant(site, jobs, faults, config=PlantConfig(seed=seed))
    truth, events = [], []
    for k in range(900):
        p.step(2.0)
        if read_every and k % read_every == 0:
            p.readings()
        if k % 100 == 0:
            truth.append(p.truth().die_temp_c)
    events = [f"{e.time_s}:{e.job_id}:{e.kind}:{e.phase}" for e in p.drain_events()]
    return truth, events


def test_plant_is_deterministic_and_readings_do_not_perturb_it(small_site: SiteSpec) -> None:
    a_truth, a_events = _trajectory(small_site, 5, read_every=1)
    b_truth, b_events = _trajectory(small_site, 5, read_every=0)
    assert a_events == b_events and len(a_events) > 10
    for x, y in zip(a_truth, b_truth, strict=True):
        np.testing.assert_array_equal(x, y)
    c_truth, _ = _trajectory(small_site, 6, read_every=1)
    assert not np.array_equal(a_truth[-1], c_truth[-1])


def test_same_seed_same_readings(small_site: SiteSpec) -> None:
    def run() -> Readings:
        p = Plant(small_site, [job("a", 16)], config=PlantConfig(seed=3))
        p.run(30.0, 1.0)
        return p.readings()

    a, b = run(), run()
    for ra, rb in zip(a.racks, b.racks, strict=True):
        assert ra.cards is not None and rb.cards is not None
        np.testing.assert_array_equal(ra.cards.power_w, rb.cards.power_w)
        assert ra.loop == rb.loop and ra.pdu == rb.pdu
    assert a.facility == b.facility and a.jobs == b.jobs


def test_a_slowed_pump_cuts_pump_power_by_the_cube_and_warms_the_rack(small_site: SiteSpec) -> None:
    p = Plant(small_site, [job("a", 32)], config=exact())
    p.run(600.0, 1.0)
    before = p.truth()
    p.set_pump_speed([1], 0.5)
    p.run(50.0, 1.0)  # within the hold
    after = p.truth()
    assert after.rack_pump_speed_frac.tolist() == [1.0, 0.5]
    assert after.rack_flow_lpm[1] == pytest.approx(0.5 * before.rack_flow_lpm[1])
    full_w = float(before.cooling.rack_pump_w) / 2
    assert after.cooling.rack_pump_w == pytest.approx(full_w + full_w * 0.5**3)
    assert after.cooling.facility_pump_w == pytest.approx(before.cooling.facility_pump_w * 0.75**3)
    dt_before = before.rack_return_temp_c - before.rack_supply_temp_c
    dt_after = after.rack_return_temp_c - after.rack_supply_temp_c
    assert dt_after[1] == pytest.approx(2.0 * dt_before[1], rel=0.03)
    assert after.die_temp_c[16:].mean() > before.die_temp_c[16:].mean() + 1.0  # plates at half the flow
    assert after.die_temp_c[:16].mean() == pytest.approx(before.die_temp_c[:16].mean(), abs=0.05)
    loop = p.readings().racks[1].loop
    assert loop is not None and loop.pump_speed_frac == 0.5
    assert loop.flow_lpm == pytest.approx(after.rack_flow_lpm[1])


def test_a_slowed_pump_returns_to_full_speed_unless_renewed(small_site: SiteSpec) -> None:
    p = Plant(small_site, [job("a", 32)], config=exact(pump_hold_s=30.0))
    p.set_pump_speed([0, 1], [0.5, 0.6])
    p.run(20.0, 1.0)
    p.set_pump_speed([1], 0.6)  # renewed: holds 30 s from now
    p.run(15.0, 1.0)
    assert p.truth().rack_pump_speed_frac.tolist() == [1.0, 0.6]  # r0 was not renewed
    p.run(20.0, 1.0)
    assert p.truth().rack_pump_speed_frac.tolist() == [1.0, 1.0]
    assert p.truth().rack_flow_lpm[1] == pytest.approx(small_site.loop_flow_per_rack_lpm())


def test_pump_speeds_outside_the_site_range_are_refused_whole(small_site: SiteSpec) -> None:
    p = Plant(small_site, [job("a", 32)], config=exact())
    lo = small_site.min_pump_speed_frac()
    assert lo == pytest.approx(small_site.cold_plate.flow_lpm[0] / small_site.loop.flow_per_card_lpm)
    for racks, speed, why in [
        ([0, 1], [0.8, lo / 2], "is not within"),
        ([0], 1.2, "is not within"),
        ([0], float("nan"), "is not within"),
        ([2], 0.8, "rack 2 is not in"),
    ]:
        with pytest.raises(CommandError, match=why):
            p.set_pump_speed(racks, speed)
    assert p.truth().rack_pump_speed_frac.tolist() == [1.0, 1.0]
    p.set_pump_speed([0], lo)
    assert p.truth().rack_pump_speed_frac[0] == pytest.approx(lo)


def test_a_degraded_pump_at_reduced_speed_gives_both_fractions(small_site: SiteSpec) -> None:
    fault = PumpDegradation(rack=1, start_s=0.0, flow_fraction=0.6)
    p = Plant(small_site, [job("a", 32)], [fault], config=exact())
    p.run(10.0, 1.0)
    p.set_pump_speed([1], 0.5)
    p.run(5.0, 1.0)
    assert p.truth().rack_flow_lpm[1] == pytest.approx(0.3 * small_site.loop_flow_per_rack_lpm())
