"""Measured die offsets are the twin's persistent error, never a thermal transient.

What users rely on: a job that leaves COMPUTE (a checkpoint) with its dies still hot is not throttled
by the guard; a card that truly runs hot (a fouled cold plate) is still kept under the die limit, also
through checkpoints and resumes; once the estimator's calibrated resistance explains a hot card, its
offset does not count the same excess twice.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from agent_helpers import belief, example_site, job, small_site

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.load import site_load, spec_r_total_k_per_w
from agent.loop import ApplyReport, ClosedLoop
from agent.offsets import DieOffsetFilter, slow_time_constants_s
from twin.faults import ColdPlateFouling
from twin.plant import ConstantAmbient, Plant, PlantConfig
from twin.spec import SiteSpec
from twin.state import StateSnapshot
from twin.workload import Phase

pytestmark = pytest.mark.agent

SUPPLY_C = 45.0  # the warmest set-point option: dies of compute-bound jobs near 80 deg C at the top clock


def _hot_jobs(fouled_card: int | None = None) -> tuple[Plant, Controller]:
    site = example_site()
    jobs = [job(f"hot{i}", 64, share=0.97, checkpoint_interval_s=150.0, checkpoint_duration_s=40.0) for i in range(2)]
    faults = [] if fouled_card is None else [ColdPlateFouling(card=fouled_card, start_s=0.0, r_factor=2.0)]
    plant = Plant(site, jobs, faults, PlantConfig(seed=7, ambient=ConstantAmbient(30.0)))
    plant.set_supply_temp(SUPPLY_C)
    return plant, Controller(site, ControlConfig(period_s=15.0, control_setpoint=False))


def test_a_checkpoint_does_not_make_the_guard_throttle_a_healthy_job() -> None:
    plant, ctl = _hot_jobs()
    decisions: list[tuple[Decision, dict[str, Phase]]] = []
    loop: ClosedLoop

    def note(d: Decision, r: ApplyReport) -> None:
        decisions.append((d, {j.job_id: j.phase for j in loop.state.snapshot().jobs}))

    loop = ClosedLoop(plant, ctl, on_decision=note)
    checkpoints = 0
    prev: dict[str, Phase] = {}
    for _ in range(480):
        loop.run(1.0)
        phases = {j.job_id: j.phase for j in loop.state.snapshot().jobs}
        if any(p == Phase.CHECKPOINT and prev.get(k) == Phase.COMPUTE for k, p in phases.items()):
            # a decision right as a checkpoint begins (any job event or the period may fall there): the
            # dies are still at their computing temperature while the twin predicts an idle card
            loop.decide(incremental=True)
            checkpoints += 1
        prev = phases
    assert checkpoints >= 2
    limit_w = plant.site.card.power_limit_w
    for d, _phases in decisions:
        assert not any("to keep dies under" in line for line in d.explanation), d.explanation
        assert np.all(d.card_power_limit_w[d.card_busy] == limit_w)
    # the jobs compute as fast as the racks' caps allow every time they compute
    computing = [d.job_levels[j] for d, ph in decisions for j, p in ph.items() if p == Phase.COMPUTE]
    assert computing and max(computing) <= 1
    assert plant.accounting().throttled_card_s == 0.0


@pytest.mark.parametrize("estimator", [False, True])
def test_a_fouled_cold_plate_is_kept_under_the_die_limit(estimator: bool) -> None:
    fouled = 70  # a card of the job on rack r1
    plant, ctl = _hot_jobs(fouled)
    levels: dict[str, list[int]] = {}
    loop = ClosedLoop(
        plant,
        ctl,
        estimator=estimator,
        on_decision=lambda d, r: [levels.setdefault(j, []).append(lv) for j, lv in d.job_levels.items()],
    )
    die_limit = plant.site.card.slowdown_temp_c - ctl.control.die_margin_k
    hottest_later = 0.0
    for _ in range(600):
        loop.run(1.0)
        if plant.time_s >= 420.0:  # after the first settled reading (and the estimator's first minutes)
            hottest_later = max(hottest_later, float(plant.truth().die_temp_c[fouled]))
    assert hottest_later <= die_limit + 0.5
    # kept there by slowing its job (through checkpoints and resumes), not the healthy one
    snap = loop.state.snapshot()
    hot = next(j.job_id for j in snap.jobs if fouled in j.cards)
    healthy = next(j.job_id for j in snap.jobs if fouled not in j.cards)
    assert max(levels[healthy][-10:]) <= 1  # as fast as the rack's cap allows (see the test above)
    assert min(levels[hot][-10:]) > max(levels[healthy][-10:])  # slower than the healthy job


def _steady() -> tuple[SiteSpec, StateSnapshot]:
    """Two racks of 16 cards, two jobs computing for 200 s (settled)."""
    site = small_site()
    _plant, state = belief(site, [job("a", 16, share=0.95), job("b", 8, share=0.9)], 200)
    return site, state.snapshot()


def _with_excess(snap: StateSnapshot, card: int, excess_k: float) -> StateSnapshot:
    die = np.asarray(snap.card_die_temp_c).copy()
    die[card] += excess_k
    return dataclasses.replace(snap, card_die_temp_c=die)


def test_the_offset_is_taken_only_from_settled_readings_and_held_through_transients() -> None:
    site, snap = _steady()
    assert snap.jobs and all(j.phase == Phase.COMPUTE for j in snap.jobs)
    load = site_load(site, snap)
    inlet = np.asarray(snap.rack_supply_temp_c)[site.card_rack()]
    r = spec_r_total_k_per_w(site)
    settle_s = float(5 * slow_time_constants_s(site, r).max())
    card = int(load.jobs[0].cards[0])
    hot = _with_excess(snap, card, 6.0)  # this card runs 6 K hotter than the twin says: a persistent error
    f = DieOffsetFilter(site)
    t = 0.0
    assert f.update(hot, load, inlet, r, t)[card] == 0.0  # one reading is no settled reading
    while t < settle_s + 15.0:
        t += 15.0
        off = f.update(hot, load, inlet, r, t)
    assert off[card] >= 4.5 and off[card] == pytest.approx(f.last_raw_k[card], abs=1e-9)
    settled = off.copy()
    # the jobs checkpoint: their dies are still hot while the twin predicts idle cards (a transient of
    # tens of K): the offsets stay what the settled readings said
    ckpt = dataclasses.replace(hot, jobs=tuple(dataclasses.replace(j, phase=Phase.CHECKPOINT) for j in snap.jobs))
    ckpt_load = site_load(site, ckpt)
    for dt in (2.0, 15.0, 30.0):
        off = f.update(ckpt, ckpt_load, inlet, r, t + dt)
        assert f.last_raw_k[np.asarray(ckpt_load.busy)].min() > 15.0  # what the raw excess would have added
        np.testing.assert_allclose(off, settled)  # the hot card's 6 K, the others' few tenths (card spread)


def test_after_the_site_clock_steps_back_a_card_is_measured_again_on_the_new_clock() -> None:
    """A card ran 8 K hot, then its excess went (its fault healed), then the
    simulator restarted 1,200 s back. The controller's offsets follow the card on the new clock
    within a settle window; before, the old 8 K stood until the new clock passed the old times (the
    guard would have kept throttling a healthy card for 20 minutes)."""
    site, snap = _steady()
    load = site_load(site, snap)
    settle_s = float(5 * slow_time_constants_s(site, spec_r_total_k_per_w(site)).max())
    card = int(load.jobs[0].cards[0])
    ctl = Controller(site, ControlConfig(period_s=15.0, control_setpoint=False))
    hot = _with_excess(snap, card, 8.0)

    def at(s: StateSnapshot, t_s: float) -> StateSnapshot:  # the readings, fresh at t_s
        seen = np.full(site.n_cards, t_s)
        return dataclasses.replace(
            s,
            time_s=t_s,
            card_last_seen_s=seen,
            card_prev_seen_s=seen - 1.0,
            rack_last_seen_s=np.full(site.n_racks, t_s),
        )

    t = 1000.0
    while t < 1000.0 + settle_s + 30.0:
        off = ctl.context(at(hot, t), t).die_offset_k
        t += 15.0
    assert off[card] == pytest.approx(8.0, abs=1.0)
    ctl.context(at(snap, t), t)  # the excess goes, on the old timeline; then the clock steps back
    now = t - 1200.0
    for _ in range(int((settle_s + 60.0) // 15.0)):
        off = ctl.context(at(snap, now), now).die_offset_k
        now += 15.0
    assert off[card] < 1.0  # the card's own spread (a few tenths), not the old 8 K


def test_a_calibrated_resistance_and_the_offset_do_not_double_count() -> None:
    site, snap = _steady()
    load = site_load(site, snap)
    inlet = np.asarray(snap.rack_supply_temp_c)[site.card_rack()]
    r = spec_r_total_k_per_w(site)
    card = int(load.jobs[0].cards[0])
    hot = _with_excess(snap, card, 8.0)
    f = DieOffsetFilter(site)
    for k in range(8):
        off = f.update(hot, load, inlet, r, 15.0 * k)
    assert off[card] > 6.5
    # the estimator explains the hot card with a 30% larger die-to-inlet resistance (+0.016 K/W at
    # ~600 W: about 10 K): the same settled reading, predicted with it, leaves no excess
    r_cal = r.copy()
    r_cal[card] *= 1.3
    off_cal = f.offsets_k(r_cal)
    assert off_cal[card] < 0.5
    mask = np.arange(site.n_cards) != card
    np.testing.assert_allclose(off_cal[mask], f.offsets_k(r)[mask])


@pytest.mark.parametrize("how", ["rack frozen", "card frozen", "rack silent"])
def test_a_die_reading_the_agent_cannot_trust_is_no_offset(how: str) -> None:
    """A rack's readings freeze (or stop) at the top clock with its dies hot while the agent has put
    it at the slowest level; then the rack reports again. Read against the slowest level, the frozen
    dies would be a large offset that outlived the fault by minutes and made the plan infeasible
    (the MQTT stuck-sensor run, 2026-11-30: 48 fallbacks after r1 came back); they are no
    observation, and the offsets stay what they were."""
    site = example_site()
    _plant, state = belief(site, [job(f"j{i}", 64, share=0.97) for i in range(2)], 240)
    ctl = Controller(site, ControlConfig(period_s=15.0, control_setpoint=False))
    snap = state.snapshot()
    rack1 = np.flatnonzero(site.card_rack() == 1)
    t0 = float(snap.time_s)
    before = ctl.context(snap, t0).die_offset_k[rack1].max()
    level = np.asarray(snap.card_level, dtype=np.int64).copy()
    level[rack1] = site.card.n_levels - 1  # what the agent commanded (and the simulator acknowledged)
    worst = 0.0
    for k in range(1, 60):  # 15 minutes
        t = t0 + 15.0 * k
        seen = np.asarray(snap.card_last_seen_s, dtype=np.float64) + 15.0 * k
        if how == "rack silent":
            seen[rack1] = t0
        frozen = dataclasses.replace(
            snap,
            time_s=t,
            card_level=level,
            card_last_seen_s=seen,
            stuck_racks=(1,) if how == "rack frozen" else (),
            stuck_cards=(int(rack1[5]),) if how == "card frozen" else (),
        )
        offsets = ctl.context(frozen, t).die_offset_k
        worst = max(worst, float(offsets[rack1[5]] if how == "card frozen" else offsets[rack1].max()))
    assert worst <= before + 0.5
