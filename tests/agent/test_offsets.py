"""Measured die offsets are the twin's persistent error, never a thermal transient.

What users rely on: a job that leaves COMPUTE (a checkpoint) with its dies still hot is not throttled
by the guard; a card that truly runs hot (a fouled cold plate) is still kept under the die limit, also
through checkpoints and resumes; once the estimator's calibrated resistance explains a hot card, its
offset does not count the same excess twice. A card is measured only after five slow time constants
at its flow now, any change of its operating point (job, phase, level, power limit, supply, flow, an
unexplained die jump) restarts the wait, and a card that never settles is covered by its smallest
excess over a window.
"""

from __future__ import annotations

import dataclasses
from typing import TypedDict, Unpack

import numpy as np
import pytest
from agent_helpers import belief, example_site, job, small_site

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.load import die_offsets_k, site_load, spec_r_total_k_per_w
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

    def record(d: Decision, r: ApplyReport) -> None:
        for j, lv in d.job_levels.items():
            levels.setdefault(j, []).append(lv)

    loop = ClosedLoop(plant, ctl, estimator=estimator, on_decision=record)
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


class StepInputs(TypedDict, total=False):
    """What a test gives ``_step`` instead of the snapshot's supply and the spec's resistance (``r_scale``: none)."""

    inlet: np.ndarray
    r: np.ndarray
    r_scale: np.ndarray


def _step(f: DieOffsetFilter, snap: StateSnapshot, t: float, **kw: Unpack[StepInputs]) -> np.ndarray:
    site = f.site
    inlet = kw.get("inlet", np.asarray(snap.rack_supply_temp_c)[site.card_rack()])
    r = kw.get("r", spec_r_total_k_per_w(site))
    return f.update(snap, site_load(site, snap), inlet, r, t, r_scale=kw.get("r_scale"))


def test_a_card_is_measured_after_five_slow_time_constants_at_its_flow_now_and_a_cool_card_has_no_offset() -> None:
    """A pump slowed to 1/1.25 of the plate's resistance: the estimator's nominal resistance times
    the flow's ratio is the spec's resistance (the readings' plant). The wait is five slow time
    constants at the resistance now, and the offset is the excess over the prediction at it."""
    site, snap = _steady()
    load = site_load(site, snap)
    card, cool = int(load.jobs[0].cards[0]), int(load.jobs[0].cards[1])
    snap = _with_excess(_with_excess(snap, card, 6.0), cool, -6.0)
    r = spec_r_total_k_per_w(site)
    scale = np.full(site.n_cards, 1.25)
    settle_s = float(5 * slow_time_constants_s(site, r)[card])
    f = DieOffsetFilter(site)
    t = 0.0
    while t + 5.0 < settle_s:
        off = _step(f, snap, t, r=r / scale, r_scale=scale)
        assert off[card] == 0.0, t
        t += 5.0
    off = _step(f, snap, settle_s + 1.0, r=r / scale, r_scale=scale)
    assert 4.5 <= off[card] <= 6.5 and off[card] == pytest.approx(f.last_raw_k[card], abs=1e-9)
    assert off[cool] == 0.0


@pytest.mark.parametrize("how", ["level", "power limit", "supply", "supply drift", "flow", "job", "die jump"])
def test_a_change_of_a_cards_operating_point_restarts_its_wait(how: str) -> None:
    """A card 6 K hot, settled; then its operating point changes while its die is where it was (the
    plate's lag): what it reads until it settles again is a transient, and its offset stays."""
    site, snap = _steady()
    load = site_load(site, snap)
    card = int(load.jobs[0].cards[0])
    hot = _with_excess(snap, card, 6.0)
    inlet = np.asarray(snap.rack_supply_temp_c)[site.card_rack()]
    f = DieOffsetFilter(site)
    t = 0.0
    for _ in range(6):
        settled = _step(f, hot, t, inlet=inlet)
        t += 15.0
    assert settled[card] >= 4.5
    after = hot
    kw: StepInputs = {}
    if how == "level":  # the agent slowed the job: the die is still at its old level's temperature
        level = np.asarray(hot.card_level).copy()
        level[load.jobs[0].cards] = 3
        after = dataclasses.replace(hot, card_level=level)
    elif how == "power limit":
        lim = np.asarray(hot.card_power_limit_w).copy()
        lim[load.jobs[0].cards] = 450.0
        after = dataclasses.replace(hot, card_power_limit_w=lim)
    elif how == "job":  # another job, less compute-bound, on the same cards
        other = dataclasses.replace(hot.jobs[0], job_id="a2", compute_share=0.6, spec=None)
        after = dataclasses.replace(hot, jobs=(other, *hot.jobs[1:]))
    elif how == "die jump":  # something the snapshots did not show (a short stall between two steps)
        after = _with_excess(hot, card, 16.0)
    for k in range(3):
        if how == "supply":  # its rack's supply cooled (the other rack's cards stay settled)
            kw = {"inlet": np.where(site.card_rack() == site.card_rack()[card], inlet - 5.0, inlet)}
        elif how == "supply drift":  # 0.6 K a step: each within the 1 K tolerance of the last
            kw = {"inlet": inlet - 0.6 * (k + 1)}
        elif how == "flow":  # the pump sped up: the plate cools, the die not yet
            kw = {"r_scale": np.full(site.n_cards, 0.8)}
        off = _step(f, after, t + 5.0 * k, **kw)  # well within the wait (~53 s; ~40 s at the faster flow)
        # within a step's drift of the settled offset (the first drift step is one the card is still
        # settled at, within the supply's tolerance)
        assert off[card] == pytest.approx(settled[card], abs=0.8 if how == "supply drift" else 1e-9), (k, off[card])


def test_a_card_that_never_settles_is_covered_by_its_smallest_excess_over_a_window() -> None:
    """Its power limit reads 700 W and 699 W in turn (above what it draws: the same prediction), so its
    operating point changes at every step; it runs 6 K hot, then 10 K."""
    site, snap = _steady()
    card = int(site_load(site, snap).jobs[0].cards[0])
    settle_s = float(5 * slow_time_constants_s(site, spec_r_total_k_per_w(site))[card])
    f = DieOffsetFilter(site)

    def jittered(k: int, excess_k: float) -> StateSnapshot:
        lim = np.asarray(snap.card_power_limit_w).copy()
        lim[card] = 700.0 - k % 2
        return dataclasses.replace(_with_excess(snap, card, excess_k), card_power_limit_w=lim)

    k = 0
    while 15.0 * k < settle_s:  # not a full window of readings yet
        assert _step(f, jittered(k, 6.0), 15.0 * k)[card] == 0.0
        k += 1
    for _ in range(4):
        off = _step(f, jittered(k, 6.0), 15.0 * k)
        assert 4.5 <= off[card] == pytest.approx(f.last_raw_k[card], abs=1e-9)
        k += 1
    six = off[card]
    start = 15.0 * k
    while 15.0 * k < start + settle_s:  # a rise is taken only once it lasted a window
        assert _step(f, jittered(k, 10.0), 15.0 * k)[card] == pytest.approx(six, abs=1e-9)
        k += 1
    assert _step(f, jittered(k, 10.0), 15.0 * k)[card] == pytest.approx(six + 4.0, abs=1e-9)
    assert not f.settled(15.0 * k, spec_r_total_k_per_w(site))[card]
    # one reading 3 K lower (its die still cool after a short stall): the smallest excess of the window
    k += 1
    assert _step(f, jittered(k, 7.0), 15.0 * k)[card] == pytest.approx(six + 1.0, abs=1e-9)
    k += 1
    start = 15.0 * k  # it stands until the next reading is the last one at or before the window's start
    while 15.0 * k < start + settle_s:
        assert _step(f, jittered(k, 10.0), 15.0 * k)[card] == pytest.approx(six + 1.0, abs=1e-9)
        k += 1
    assert _step(f, jittered(k, 10.0), 15.0 * k)[card] == pytest.approx(six + 4.0, abs=1e-9)
    # the site's clock steps back 1,200 s (a restarted simulator) and the card runs 4 K hotter still:
    # the cooler readings of the old timeline are no part of the new one's window
    back = 15.0 * k - 1200.0
    for i in range(int(settle_s // 15.0) + 2):
        off = _step(f, jittered(k + i + 1, 14.0), back + 15.0 * i)
    assert off[card] == pytest.approx(six + 8.0, abs=1e-9)


def test_a_power_limit_read_back_with_a_fraction_of_a_watt_is_the_same_operating_point() -> None:
    site, snap = _steady()
    r = spec_r_total_k_per_w(site)
    settle_s = float(5 * slow_time_constants_s(site, r).max())
    f = DieOffsetFilter(site)
    k = 0
    while 15.0 * k <= settle_s + 15.0:
        lim = np.asarray(snap.card_power_limit_w, dtype=np.float64) + 0.3 * (k % 2)  # 700.0, 700.3, ...
        _step(f, dataclasses.replace(snap, card_power_limit_w=lim), 15.0 * k)
        k += 1
    assert f.settled(15.0 * (k - 1), r).all()


def test_a_busy_card_read_in_low_power_is_measured_at_its_jobs_work() -> None:
    """A reading that still says low power while a job computes on the card (it lags the wake): the
    card is predicted awake at its job's work (as ``agent.load.predict`` does), not idle."""
    site, snap = _steady()
    card = int(site_load(site, snap).jobs[0].cards[0])
    low = np.asarray(snap.card_low_power).copy()
    low[card] = True
    stale = dataclasses.replace(_with_excess(snap, card, 6.0), card_low_power=low)
    f, g = DieOffsetFilter(site), DieOffsetFilter(site)
    for k in range(8):
        off = _step(f, stale, 15.0 * k)
        ref = _step(g, _with_excess(snap, card, 6.0), 15.0 * k)
    assert 4.5 <= off[card] == pytest.approx(ref[card], abs=1e-9)
    inlet = np.asarray(snap.rack_supply_temp_c)[site.card_rack()]
    raw = die_offsets_k(site, stale, site_load(site, stale), inlet, spec_r_total_k_per_w(site))
    assert raw[card] == pytest.approx(f.last_raw_k[card], abs=1e-9)


def test_a_card_held_at_its_power_limit_is_measured_against_the_die_at_the_limit() -> None:
    """Its power brake holds it at 450 W: its die reads 6 K over supply + R x 450 W."""
    site, snap = _steady()
    card = int(site_load(site, snap).jobs[0].cards[0])
    r = spec_r_total_k_per_w(site)
    inlet = np.asarray(snap.rack_supply_temp_c)[site.card_rack()]
    lim = np.asarray(snap.card_power_limit_w).copy()
    lim[card] = 450.0
    die = np.asarray(snap.card_die_temp_c).copy()
    die[card] = inlet[card] + r[card] * 450.0 + 6.0
    held = dataclasses.replace(snap, card_power_limit_w=lim, card_die_temp_c=die)
    f = DieOffsetFilter(site)
    for k in range(8):
        off = _step(f, held, 15.0 * k)
    assert off[card] == pytest.approx(6.0, abs=1e-9)
    assert f.offsets_k(r)[card] == pytest.approx(6.0, abs=1e-9)  # the settled one, held through transients
    assert die_offsets_k(site, held, site_load(site, held), inlet, r)[card] == pytest.approx(6.0, abs=1e-9)


def test_a_card_without_a_die_reading_has_no_offset_and_keeps_the_one_it_had() -> None:
    """A card the belief has no die reading of (NaN: never read) is no observation: its offset is 0,
    not NaN (a NaN offset reaches the planner's and the guard's die predictions); a hot card whose
    die reading goes missing keeps the offset of its last settled reading."""
    site, snap = _steady()
    cards = site_load(site, snap).jobs[0].cards
    card, blind = int(cards[0]), int(cards[1])
    hot = _with_excess(snap, card, 6.0)
    die = np.asarray(hot.card_die_temp_c).copy()
    die[blind] = np.nan
    unread = dataclasses.replace(hot, card_die_temp_c=die)
    f = DieOffsetFilter(site)
    for k in range(8):
        off = _step(f, unread, 15.0 * k)
        assert np.isfinite(off).all() and off[blind] == 0.0, k
    assert off[card] >= 4.5
    settled = off.copy()
    die[card] = np.nan
    both_unread = dataclasses.replace(hot, card_die_temp_c=die)
    for k in range(8, 16):
        off = _step(f, both_unread, 15.0 * k)
        np.testing.assert_array_equal(off, settled)


@pytest.mark.parametrize("settle_time_constants", [0.0, -1.0, float("nan")])
def test_a_settle_wait_of_no_time_is_refused(settle_time_constants: float) -> None:
    """With no wait every reading would be "settled": a checkpoint's transient taken as an offset."""
    with pytest.raises(ValueError, match="settle_time_constants"):
        DieOffsetFilter(small_site(), settle_time_constants=settle_time_constants)


def test_an_idle_card_put_in_low_power_waits_again() -> None:
    """An idle card 3 K hot, settled, is put in low power: its die is still at the idle temperature
    while the twin predicts the cooler low-power die; that transient is no offset (taken as one, it
    would follow the card into its next job)."""
    site, snap = _steady()
    idle = int(np.flatnonzero(~np.asarray(site_load(site, snap).busy))[0])
    hot = _with_excess(snap, idle, 3.0)
    f = DieOffsetFilter(site)
    t = 0.0
    for _ in range(6):
        settled = _step(f, hot, t)
        t += 15.0
    assert settled[idle] >= 2.0
    low = np.asarray(hot.card_low_power).copy()
    low[idle] = True
    asleep = dataclasses.replace(hot, card_low_power=low)
    for k in range(3):
        off = _step(f, asleep, t + 5.0 * k)
        assert f.last_raw_k[idle] > settled[idle] + 1.0  # what the transient would have added
        assert off[idle] == pytest.approx(settled[idle], abs=1e-9), k
    t += 60.0  # settled in low power: measured against the low-power die
    off = _step(f, asleep, t)
    assert off[idle] == pytest.approx(f.last_raw_k[idle], abs=1e-9)
    assert f.offsets_k(spec_r_total_k_per_w(site))[idle] == pytest.approx(off[idle], abs=1e-9)


def test_a_die_still_warming_within_the_wait_does_not_restart_it() -> None:
    """A hot card's job resumes: its die, still cool, warms 4 K a step toward its 6 K excess over
    the twin's prediction. Moves within the wait are the transient the wait is for: the card is
    measured five slow time constants after its operating point began (restarted by each move, the
    wait would outlast the warm-up by another five, the card unprotected meanwhile: the window's
    smallest excess is the cool die's 0)."""
    site, snap = _steady()
    card = int(site_load(site, snap).jobs[0].cards[0])
    settle_s = float(5 * slow_time_constants_s(site, spec_r_total_k_per_w(site))[card])
    assert 45.0 < settle_s <= 60.0
    f = DieOffsetFilter(site)
    for k, excess_k in enumerate((-6.0, -2.0, 2.0, 6.0)):
        assert _step(f, _with_excess(snap, card, excess_k), 15.0 * k)[card] == 0.0
    off = _step(f, _with_excess(snap, card, 6.0), 60.0)
    assert 4.5 <= off[card] == pytest.approx(f.last_raw_k[card], abs=1e-9)


def test_a_failed_cards_readings_are_no_observation_its_offset_stands_through_the_failure() -> None:
    """A card 6 K hot fails for two minutes, its die cooling to its supply, then comes back: what it
    read while failed is not its error (measured then, the cool die would have wiped its offset
    and left it unprotected on its return until it settled again)."""
    site, snap = _steady()
    card = int(site_load(site, snap).jobs[0].cards[0])
    hot = _with_excess(snap, card, 6.0)
    f = DieOffsetFilter(site)
    t = 0.0
    for _ in range(6):
        settled = _step(f, hot, t)
        t += 15.0
    assert settled[card] >= 4.5
    failed = np.asarray(hot.card_failed).copy()
    failed[card] = True
    die = np.asarray(hot.card_die_temp_c).copy()
    die[card] = float(np.asarray(hot.rack_supply_temp_c)[site.card_rack()[card]])
    down = dataclasses.replace(hot, card_failed=failed, card_die_temp_c=die)
    for _ in range(8):
        assert _step(f, down, t)[card] == pytest.approx(settled[card], abs=1e-9), t
        t += 15.0
    assert _step(f, hot, t)[card] == pytest.approx(settled[card], abs=1e-9)


def test_an_idle_card_back_from_a_failure_waits_from_its_return() -> None:
    """An idle card fails and comes back idle: its operating point begins when it is back (its die
    then still at its supply), not at its last failed reading."""
    site, snap = _steady()
    idle = int(np.flatnonzero(~np.asarray(site_load(site, snap).busy))[0])
    r = spec_r_total_k_per_w(site)
    settle_s = float(5 * slow_time_constants_s(site, r)[idle])
    failed = np.asarray(snap.card_failed).copy()
    failed[idle] = True
    down = dataclasses.replace(snap, card_failed=failed)
    f = DieOffsetFilter(site)
    for k in range(6):
        _step(f, snap if k < 4 else down, 15.0 * k)
    back_s = 90.0
    _step(f, snap, back_s)
    assert not f.settled(back_s + settle_s - 1.0, r)[idle]
    assert f.settled(back_s + settle_s, r)[idle]
