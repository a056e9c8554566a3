"""The controller's holds, in time and across a step back of the site clock (mutation audit of
``agent.controller``).

What users rely on: a rack with a stuck card keeps its fail-safe caps ``failsafe_hold_s`` after the
card reports again, no longer; a rack whose measured die reached the die limit keeps its pump at full
speed for ten minutes (``_PUMP_LATCH_S``), no longer; and after the site clock went back every hold
and time the controller keeps (fail-safe caps, the pump latch, the set-point's re-optimization, the
guard's low-power toggles, the cards' power above the model) lasts at most its time from the new now.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from agent_helpers import SITE_FILE, belief, example_site, full_load_jobs, job, small_site
from guard_helpers import proposal, scene, step_context

from agent.config import ControlConfig
from agent.controller import Controller
from agent.open_commands import LEVEL, LIMIT, N_KINDS
from twin.readings import JobEvent
from twin.spec import SiteSpec, site_from_dict
from twin.state import StateSnapshot
from twin.tables import read_toml
from twin.workload import Phase

pytestmark = pytest.mark.agent


def at(snap: StateSnapshot, t: float, **changes: object) -> StateSnapshot:
    """``snap`` with every reading (cards, racks, facility) moved to site time ``t``."""
    dt = t - snap.time_s
    fac = snap.facility
    moved: dict[str, object] = {
        "time_s": t,
        "card_last_seen_s": snap.card_last_seen_s + dt,
        "card_prev_seen_s": snap.card_prev_seen_s + dt,
        "rack_last_seen_s": snap.rack_last_seen_s + dt,
        "facility": None if fac is None else dataclasses.replace(fac, time_s=fac.time_s + dt),
    }
    return dataclasses.replace(snap, **{**moved, **changes})  # type: ignore[arg-type]


def _full_load() -> tuple[SiteSpec, StateSnapshot]:
    site = small_site()
    _plant, state = belief(site, full_load_jobs(site, 8), 60)
    return site, state.snapshot()


HOLD = ControlConfig(period_s=15.0, telemetry_deadline_s=30.0, failsafe_hold_s=30.0)


def test_a_stuck_cards_rack_keeps_its_fail_safe_caps_for_the_hold_time_after_the_card_reports_again() -> None:
    site, snap = _full_load()
    ctl = Controller(site, HOLD)
    assert ctl.step(at(snap, 5000.0, stuck_cards=(3,)), 5000.0).failsafe_racks == (0,)
    for t, held in ((5015.0, (0,)), (5029.0, (0,)), (5031.0, ())):  # card 3 reports again from 5015 on
        assert ctl.step(at(snap, t), t).failsafe_racks == held, t


def test_after_the_clock_went_back_a_stuck_cards_rack_is_held_its_time_from_the_new_now() -> None:
    site, snap = _full_load()
    ctl = Controller(site, HOLD)
    assert ctl.step(at(snap, 5000.0, stuck_cards=(3,)), 5000.0).failsafe_racks == (0,)
    # the site restarts 4,000 s back, card 3 reporting again: held 30 s from the new now, not to 5,030
    assert ctl.step(at(snap, 1000.0), 1000.0).failsafe_racks == (0,)
    assert ctl.step(at(snap, 1031.0), 1031.0).failsafe_racks == ()


def _hot(site: SiteSpec, snap: StateSnapshot, cfg: ControlConfig) -> np.ndarray:
    """r0's card 5 reading exactly the die limit (slowdown - margin)."""
    die = snap.card_die_temp_c.copy()
    die[5] = site.card.slowdown_temp_c - cfg.die_margin_k
    return die


def _pump0(ctl: Controller, snap: StateSnapshot, t: float, **changes: object) -> float:
    d = ctl.step(at(snap, t, **changes), t)
    assert d.rack_pump_speed_frac is not None and d.failsafe_racks == ()
    return float(d.rack_pump_speed_frac[0])


def test_a_rack_whose_die_reached_the_die_limit_keeps_its_pump_at_full_speed_ten_minutes() -> None:
    site, snap = _full_load()
    cfg = ControlConfig(period_s=15.0)
    ctl = Controller(site, cfg)
    assert _pump0(ctl, snap, 60.0) < 1.0  # the plan slows r0's pump
    assert _pump0(ctl, snap, 75.0, card_die_temp_c=_hot(site, snap, cfg)) == 1.0
    assert _pump0(ctl, snap, 75.0 + 599.0) == 1.0  # the die back to normal: still latched
    assert _pump0(ctl, snap, 75.0 + 601.0) < 1.0


def test_after_the_clock_went_back_the_pump_latch_lasts_its_ten_minutes_from_the_new_now() -> None:
    site, snap = _full_load()
    cfg = ControlConfig(period_s=15.0)
    ctl = Controller(site, cfg)
    assert _pump0(ctl, snap, 5000.0, card_die_temp_c=_hot(site, snap, cfg)) == 1.0
    assert _pump0(ctl, snap, 1000.0) == 1.0  # the site restarts 4,000 s back: latched from the new now
    assert _pump0(ctl, snap, 1000.0 + 601.0) < 1.0  # not until 5,600 s


def test_after_the_clock_went_back_the_set_point_is_reoptimized_an_interval_after_the_new_now() -> None:
    site, snap = _full_load()
    ctl = Controller(site, ControlConfig(period_s=15.0, setpoint_interval_s=600.0))
    assert ctl.step(at(snap, 5000.0), 5000.0).choose_setpoint
    assert not ctl.step(at(snap, 1000.0), 1000.0).choose_setpoint  # the clock went back 4,000 s
    assert not ctl.step(at(snap, 1599.0), 1599.0).choose_setpoint
    assert ctl.step(at(snap, 1600.0), 1600.0).choose_setpoint  # not at 5,600 s


def test_after_the_clock_went_back_the_guards_low_power_hold_counts_from_the_new_now() -> None:
    """The controller's step back reaches its guard: a card that went to sleep at t = 110 on the old
    timeline may be woken ``low_power_hold_s`` after the new now (t = 50), not only 60 s after 110."""
    site, snap = scene()
    cfg = ControlConfig()
    ctl = Controller(site, cfg)
    ctl.guard.review(proposal(site), snap, step_context(site, now_s=100.0))
    lp = snap.card_low_power.copy()
    lp[25] = True
    asleep = dataclasses.replace(snap, card_low_power=lp)
    ctl.guard.review(proposal(site, card_low_power=lp), asleep, step_context(site, now_s=110.0))
    ctl.clock_went_back(50.0)
    wake, hold_s = proposal(site), cfg.low_power_hold_s
    assert ctl.guard.review(wake, asleep, step_context(site, now_s=50.0 + hold_s - 1.0)).card_low_power[25]
    free = ctl.guard.review(wake, asleep, step_context(site, now_s=50.0 + hold_s + 1.0))
    assert not free.card_low_power[25]


def test_after_the_clock_went_back_the_cards_readings_keep_the_power_above_the_model_up_to_date() -> None:
    """Cards read 60 W above the power model on the old timeline (budgeted on r0); after the step back
    their readings, on the new timeline, are new: back at the model, the budgeted power comes down
    (was: frozen at its old value until the new clock passed the old readings' times)."""
    site = small_site()
    _plant, state = belief(site, [job("a", 16, share=0.97)], 120)
    snap = state.snapshot()
    hot = np.where(snap.card_job >= 0, snap.card_power_w + 60.0, snap.card_power_w)
    ctl = Controller(site, ControlConfig(period_s=15.0, rack_margin_w=500.0))

    def extra_w(t: float, power_w: np.ndarray) -> float:
        return float(ctl.context(at(snap, t, card_power_w=power_w), t).rack_extra_w[0])

    extra_w(5000.0, hot)
    before = extra_w(5015.0, hot)
    assert before > 0.0  # two readings above the model
    assert extra_w(1000.0, snap.card_power_w) < before


def test_a_step_back_of_a_few_periods_bounds_the_holds_too() -> None:
    """A step back of four periods (60 s) is a step back (``clock_went_back``): a silent rack reporting
    again is held 30 s from the new now, not 90 s."""
    site, snap = _full_load()
    ctl = Controller(site, HOLD)
    last = np.full(site.n_racks, 5000.0)
    last[1] = 4900.0
    assert ctl.step(at(snap, 5000.0, rack_last_seen_s=last), 5000.0).failsafe_racks == (1,)
    assert ctl.step(at(snap, 4940.0), 4940.0).failsafe_racks == (1,)
    assert ctl.step(at(snap, 4971.0), 4971.0).failsafe_racks == ()


def test_the_steps_after_a_step_back_are_no_step_back_a_reading_not_renewed_counts_once() -> None:
    """After the clock went back, the next steps on the new timeline are ordinary ones: a reading above
    the power model that telemetry has not renewed is still one reading, not budgeted (was the step
    back taken again at every step until the new clock caught up, every reading counted new)."""
    site = small_site()
    _plant, state = belief(site, [job("a", 16, share=0.97)], 120)
    snap = state.snapshot()
    hot = np.where(snap.card_job >= 0, snap.card_power_w + 60.0, snap.card_power_w)
    ctl = Controller(site, ControlConfig(period_s=15.0, rack_margin_w=500.0))
    ctl.context(at(snap, 5000.0), 5000.0)
    assert float(ctl.context(at(snap, 1000.0, card_power_w=hot), 1000.0).rack_extra_w[0]) == 0.0
    lagging = dataclasses.replace(at(snap, 1000.0, card_power_w=hot), time_s=1015.0)  # no newer reading
    assert float(ctl.context(lagging, 1015.0).rack_extra_w[0]) == 0.0


def test_a_rack_whose_telemetry_is_exactly_the_deadline_old_is_not_stale() -> None:
    """``telemetry_deadline_s``: a rack whose telemetry is *older* goes to fail-safe caps."""
    site, snap = _full_load()
    for age_s, failsafe in ((30.0, ()), (31.0, (1,))):
        last = np.full(site.n_racks, 5000.0)
        last[1] = 5000.0 - age_s
        ctl = Controller(site, HOLD)
        assert ctl.step(at(snap, 5000.0, rack_last_seen_s=last), 5000.0).failsafe_racks == failsafe, age_s


def test_a_rack_stuck_as_a_whole_keeps_its_fail_safe_caps_for_the_hold_time_after_it_moves_again() -> None:
    """A rack whose readings froze as a whole is blind like a silent one: held ``failsafe_hold_s`` after
    its readings move again, and released exactly then."""
    site, snap = _full_load()
    ctl = Controller(site, HOLD)
    assert ctl.step(at(snap, 5000.0, stuck_racks=(1,)), 5000.0).failsafe_racks == (1,)
    for t, held in ((5015.0, (1,)), (5029.0, (1,)), (5030.0, ())):
        assert ctl.step(at(snap, t), t).failsafe_racks == held, t


def test_the_solve_gets_the_shorter_of_its_deadline_and_the_time_the_caller_has_left() -> None:
    """``time_limit_s`` (the service: what is left of the period) shortens the solve below
    ``solve_deadline_s``, never lengthens it."""
    site, snap = _full_load()
    ctl = Controller(site, ControlConfig(period_s=15.0, solve_deadline_s=5.0))
    assert ctl.context(at(snap, 100.0), 100.0, time_limit_s=0.5).solver_time_limit_s == 0.5
    assert ctl.context(at(snap, 115.0), 115.0, time_limit_s=50.0).solver_time_limit_s == 5.0


def test_after_the_clock_went_back_idle_hosts_go_off_their_idle_time_after_the_new_now() -> None:
    """Hosts idle since t = 5,000 s on the old timeline: after the site restarts 4,000 s back they go
    off ``host_off_after_s`` after the new now (was: not before the new clock passed 5,000 + 600 s)."""
    site = example_site()
    assert site.hosts_managed
    _plant, state = belief(site, [job("a", 8)], 60)
    snap = state.snapshot()
    ctl = Controller(site, ControlConfig(period_s=15.0, host_off_after_s=600.0))
    d = ctl.step(at(snap, 5000.0), 5000.0)
    assert d.host_off is not None and not d.host_off.any()  # first seen at 5,000 s: none idle long enough
    back = ctl.step(at(snap, 1000.0), 1000.0)
    assert back.host_off is not None and not back.host_off.any()
    later = ctl.step(at(snap, 1601.0), 1601.0)
    assert later.host_off is not None and later.host_off.any()


def test_a_level_and_a_power_limit_a_refusal_holds_back_reach_the_guard_and_stay_as_reported() -> None:
    """``held_back`` (the service: ``Overlays.held_back``) per kind of setting: a card whose level a
    refusal holds back keeps the level it reports, one whose power limit is held back keeps its limit
    (no command reaches them, so the decision and its budget must not count on another)."""
    site, snap = scene()
    limits = np.asarray(snap.card_power_limit_w, dtype=np.float64).copy()
    limits[3] = 650.0
    snap = dataclasses.replace(snap, card_power_limit_w=limits)
    held = np.zeros((N_KINDS, site.n_cards), dtype=bool)
    held[LEVEL, 2] = True
    held[LIMIT, 3] = True
    cfg = ControlConfig(control_placement=False, control_host_power=False, control_pump_speed=False)
    ctl = Controller(site, cfg)
    ctx = ctl.context(snap, 100.0, held_back=held)
    assert (ctx.held_level_cards, ctx.held_limit_cards, ctx.held_sleep_cards) == ((2,), (3,), ())
    d = ctl.review(ctl.propose(snap, ctx, use_solver=False), snap, ctx)
    assert d.card_level[2] == snap.card_level[2]
    assert d.card_power_limit_w[3] == 650.0


def test_a_periodic_decision_reviewed_after_an_event_placed_a_job_keeps_that_jobs_host_on() -> None:
    """The service reviews a periodic proposal after an event decision may have placed a job meanwhile
    (``Controller.with_hosts``): the placed job's cards count busy, so their host is not powered off
    under the job (2 racks of 2 hosts of 8 cards, "a" on r0's two hosts, r1's hosts idle 700 s, no
    idle host kept as a reserve)."""
    data: dict[str, Any] = read_toml(SITE_FILE)
    data.update(name="small-2x16-hosts", racks_per_supernode=2, torus_dims=[4, 4, 2])
    data["rack"] = {**data["rack"], "host_overhead_w": 2200.0, "hosts_per_rack": 2, "power_limit_w": 12500.0}
    site = site_from_dict(data, source="2 racks of 2 hosts of 8 cards")
    _plant, state = belief(site, [job("a", 16)], 60)
    snap = state.snapshot()
    state.apply_events([JobEvent(time_s=60.0, job_id="q", kind="submitted", phase=Phase.WAITING, job=job("q", 8))])
    with_q = state.snapshot()
    cfg = ControlConfig(period_s=15.0, host_off_after_s=600.0, host_reserve_per_supernode=0)
    ctl = Controller(site, cfg)
    ctl.step(at(snap, 1000.0), 1000.0)  # every host first seen at 1,000 s
    ctx = ctl.context(at(snap, 1700.0), 1700.0)
    periodic = ctl.propose(at(snap, 1700.0), ctx)  # the solve ran on a snapshot without q
    event = ctl.step(at(with_q, 1700.0), 1700.0, incremental=True)  # meanwhile q was submitted and placed
    (order,) = event.placements
    reviewed = ctl.review(periodic, at(snap, 1700.0), ctx)
    assert reviewed.host_off is not None
    q_hosts = sorted({c // site.cards_per_host for c in order.cards})
    assert q_hosts and not reviewed.host_off[q_hosts].any()


def test_idle_hosts_of_a_rack_the_agent_cannot_see_are_never_powered_off() -> None:
    """Hosts idle long enough go off, but not those of a silent rack (fail-safe: its cards' state is
    not seen, so nothing is switched there)."""
    site = example_site()
    _plant, state = belief(site, [job("a", 8)], 60)
    snap = state.snapshot()
    ctl = Controller(site, ControlConfig(period_s=15.0, host_off_after_s=600.0))
    ctl.step(at(snap, 1000.0), 1000.0)
    silent = at(snap, 1601.0)
    on_r3 = site.card_rack() == 3
    seen = np.where(on_r3, 1500.0, silent.card_last_seen_s)
    racks_seen = silent.rack_last_seen_s.copy()
    racks_seen[3] = 1500.0
    d = ctl.step(dataclasses.replace(silent, card_last_seen_s=seen, rack_last_seen_s=racks_seen), 1601.0)
    assert 3 in d.failsafe_racks and d.host_off is not None
    host_rack = site.card_rack()[:: site.cards_per_host]
    assert d.host_off[host_rack != 3].any()  # idle hosts elsewhere go off
    assert not d.host_off[host_rack == 3].any()


def test_an_incremental_decision_says_which_rack_draws_more_than_the_twin_predicts() -> None:
    """The unexplained-power report is in every decision, the fast ones on job events included."""
    site = small_site()
    _plant, state = belief(site, [job("a", 16, share=0.97)], 120)
    snap = state.snapshot()
    hot = np.where(snap.card_job >= 0, snap.card_power_w + 60.0, snap.card_power_w)
    ctl = Controller(site, ControlConfig(period_s=15.0, rack_margin_w=500.0))
    for t in (5000.0, 5015.0):
        ctl.step(at(snap, t, card_power_w=hot), t)
    d = ctl.step(at(snap, 5020.0, card_power_w=hot), 5020.0, incremental=True)
    assert d.source == "incremental"
    assert any(e.startswith("r0 draws") for e in d.explanation)


def test_an_incremental_decision_runs_a_job_new_since_the_last_plan_at_the_top_level() -> None:
    """ "every job that computes gets the level it had the last time it computed (a new job: the top
    level)" -- one rack's worth of load, no cap binding."""
    site = small_site()
    _plant, before = belief(site, [job("a", 4)], 120)
    _plant, after = belief(site, [job("a", 4), job("b", 4)], 120)
    ctl = Controller(site, ControlConfig(period_s=15.0, control_placement=False))
    ctl.step(before.snapshot(), 120.0)
    d = ctl.step(after.snapshot(), 125.0, incremental=True)
    assert d.source == "incremental" and d.job_levels["b"] == 0


def test_an_incremental_decision_puts_the_cards_a_finished_job_freed_to_sleep() -> None:
    """ "idle cards keep their state and freed cards sleep": the cards of a job that ended since the
    last plan go to low-power idle at once, not at the next periodic decision."""
    site = small_site()
    _plant, both = belief(site, [job("a", 4), job("b", 4)], 120)
    _plant, a_only = belief(site, [job("a", 4)], 120)
    snap = both.snapshot()
    ctl = Controller(site, ControlConfig(period_s=15.0, control_placement=False))
    first = ctl.step(snap, 120.0)
    b_cards = np.flatnonzero(np.asarray(snap.card_job) == next(i for i, j in enumerate(snap.jobs) if j.job_id == "b"))
    assert b_cards.size == 4 and not first.card_low_power[b_cards].any()
    d = ctl.step(a_only.snapshot(), 125.0, incremental=True)
    assert not d.card_busy[b_cards].any() and d.card_low_power[b_cards].all()


def test_a_silent_facility_keeps_the_set_point_in_force_not_the_sites_default() -> None:
    """The set-point in force (here the facility's report, 2 K below the site's default, not
    re-optimized) is remembered: when the facility falls silent the decisions keep it."""
    site, snap = _full_load()
    assert snap.facility is not None
    in_force_c = site.facility.supply_temp_c - 2.0
    fac = dataclasses.replace(snap.facility, supply_setpoint_c=in_force_c)
    ctl = Controller(site, ControlConfig(period_s=15.0, telemetry_deadline_s=30.0, control_setpoint=False))
    reporting = at(dataclasses.replace(snap, facility=fac), 1000.0)
    assert ctl.step(reporting, 1000.0).supply_temp_c == in_force_c
    silent = dataclasses.replace(at(snap, 1060.0), facility=reporting.facility)  # its last report 60 s old
    assert ctl.step(silent, 1060.0).supply_temp_c == in_force_c


def test_a_job_on_a_rack_that_was_blind_gets_back_the_level_it_had_before() -> None:
    """A blind rack's jobs run slow for safety, not by choice: once the rack is seen again, the fast
    decisions on job events give its job the level it last computed at by choice (here the top)."""
    site = small_site()
    _plant, state = belief(site, [job("a", 4)], 120)
    snap = state.snapshot()
    ctl = Controller(site, HOLD)
    assert ctl.step(at(snap, 1000.0), 1000.0).job_levels["a"] == 0
    last = at(snap, 1015.0).rack_last_seen_s.copy()
    last[0] = 900.0
    blind = ctl.step(at(snap, 1015.0, rack_last_seen_s=last), 1015.0)
    assert 0 in blind.failsafe_racks and blind.job_levels["a"] == site.card.n_levels - 1
    d = ctl.step(at(snap, 1100.0), 1100.0, incremental=True)  # seen again, the hold over
    assert d.failsafe_racks == () and d.job_levels["a"] == 0


def test_a_periodic_decision_committed_after_an_event_decision_does_not_number_back() -> None:
    """The service commits an event decision while a periodic solve is in flight (its context taken
    before): the cycle counter goes on from the event's, it does not fall back to the periodic's."""
    site, snap = _full_load()
    ctl = Controller(site, ControlConfig(period_s=15.0))
    ctl.step(at(snap, 1000.0), 1000.0)
    n = ctl.cycle
    ctx = ctl.context(at(snap, 1015.0), 1015.0)
    periodic = ctl.propose(at(snap, 1015.0), ctx, use_solver=False)
    ctl.step(at(snap, 1016.0), 1016.0, incremental=True)
    assert ctl.cycle == n + 1
    ctl.commit(ctl.review(periodic, at(snap, 1015.0), ctx), at(snap, 1015.0), ctx)
    assert ctl.cycle == n + 2
