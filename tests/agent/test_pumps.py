"""Rack-loop pump speeds (``agent.pumps``): the slowest pump each rack's plan allows, priced by the twin.

What users rely on: an idle rack's pump runs at the site's lowest speed, a loaded rack's only as slow
as its dies, its cap and its loop's rise allow (as the twin predicts with every busy card computing),
and among the allowed speeds the one with the least pump + card power, the facility pump priced as the
cube of the racks' total flow (not per rack); racks the caller pins stay at
full speed; a card the twin does not explain keeps its rack's pump at full speed; a healthy pump's
flow noise does not move the predictions; in closed loop the agent cuts the pumps' energy with no
die over its limit and no rack over its cap.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import TypedDict, Unpack

import numpy as np
import pytest
from agent_helpers import belief, example_site, full_load_jobs, job, small_site
from evaluate_helpers import mixed_scenario

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.evaluate import evaluate
from agent.load import Prediction, SiteLoad, card_utilization, predict, predict_at, site_load, spec_r_total_k_per_w
from agent.pumps import (
    MIN_FLOW_FRAC,
    _descend_facility_pump,
    _facility_w,
    choose_pump_speeds,
    full_speed_flow_lpm,
    offset_at_speed,
    r_at_speed,
    speed_options,
)
from twin.cooling import rack_pump_power_w
from twin.readings import Readings
from twin.spec import SiteSpec
from twin.state import StateSnapshot
from twin.thermal import plate_resistance_k_per_w
from twin.workload import Phase

pytestmark = pytest.mark.agent

CFG = ControlConfig()


class PumpOverrides(TypedDict, total=False):
    """Arguments of ``choose_pump_speeds`` a test sets instead of ``_choose``'s defaults."""

    rack_flow_full_lpm: np.ndarray
    rack_speed_now_frac: np.ndarray
    die_offset_k: np.ndarray
    rack_extra_w: np.ndarray


class PumpArgs(TypedDict):
    """The positional arguments of ``choose_pump_speeds`` by name, as ``_choose`` passed them."""

    site: SiteSpec
    load: SiteLoad
    level: np.ndarray
    low_power: np.ndarray
    power_limit_w: np.ndarray
    inlet_c: np.ndarray
    r_full_k_per_w: np.ndarray
    die_offset_k: np.ndarray
    rack_flow_full_lpm: np.ndarray
    rack_speed_now_frac: np.ndarray
    rack_cap_w: np.ndarray
    rack_extra_w: np.ndarray
    die_limit_c: float


def _scene() -> tuple[SiteSpec, StateSnapshot]:
    """r0 full of a compute-bound job, r1 half busy, the other racks idle."""
    site = example_site()
    jobs = [job("full", 64, share=0.97), job("half", 32, share=0.8)]
    _plant, state = belief(site, jobs, 60)
    return site, state.snapshot()


def _choose(
    site: SiteSpec, snap: StateSnapshot, supply_c: float, **kw: Unpack[PumpOverrides]
) -> tuple[np.ndarray, PumpArgs]:
    load = site_load(site, snap)
    n = site.n_cards
    args: PumpArgs = {
        "site": site,
        "load": load,
        "level": np.where(load.busy, 2, site.card.n_levels - 1),  # the full rack fits its cap at level 2
        "low_power": ~load.busy,
        "power_limit_w": np.full(n, site.card.power_limit_w),
        "inlet_c": np.full(n, supply_c),
        "r_full_k_per_w": spec_r_total_k_per_w(site),
        "die_offset_k": np.zeros(n),
        "rack_flow_full_lpm": np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        "rack_speed_now_frac": np.ones(site.n_racks),
        "rack_cap_w": site.rack_power_limits_w() - CFG.rack_margin_w,
        "rack_extra_w": np.zeros(site.n_racks),
        "die_limit_c": site.card.slowdown_temp_c - CFG.die_margin_k,
        **kw,  # the test's overrides
    }
    choice = choose_pump_speeds(facility_w_per_it_w=1.04, steps=9, **args)
    return choice.speed_frac, args


def _predict_at(site: SiteSpec, args: PumpArgs, r: np.ndarray) -> Prediction:
    """The twin's prediction of the choice's site (``args``) with the plates' resistances ``r``."""
    return predict(
        site,
        args["load"],
        args["level"],
        args["low_power"],
        args["power_limit_w"],
        args["inlet_c"],
        r,
        args["die_offset_k"],
    )


def _bounds_hold(site: SiteSpec, args: PumpArgs, speed: np.ndarray) -> np.ndarray:
    """Per rack: dies, cap and loop rise within bounds at ``speed`` (every busy card computing)."""
    r = r_at_speed(site, args["r_full_k_per_w"], args["rack_flow_full_lpm"], speed)
    pr = _predict_at(site, args, r)
    loop = site.loop
    mcp = (
        np.asarray(args["rack_flow_full_lpm"]) * speed / 60_000 * loop.density_kg_per_m3 * loop.specific_heat_j_per_kg_k
    )
    holds: np.ndarray = (
        (pr.rack_max_die_c <= float(args["die_limit_c"]) + 1e-9)
        & (pr.rack_power_w <= np.asarray(args["rack_cap_w"]) + 1e-6)
        & (pr.rack_power_w / mcp <= loop.max_delta_t_k + 1e-9)
    )
    return holds


def test_idle_racks_run_slowest_loaded_ones_only_as_slow_as_their_bounds_allow() -> None:
    site, snap = _scene()
    lo = site.min_pump_speed_frac()
    opts = speed_options(site, 9)
    for supply in (30.0, 45.0):
        speed, args = _choose(site, snap, supply)
        assert np.all(speed[2:] == pytest.approx(lo))  # idle racks: nothing to cool but sleeping cards
        assert np.all(_bounds_hold(site, args, speed))
        # the loaded rack is not at the slowest option, and the next slower one breaks one of its
        # bounds: as slow as the bounds allow, never faster
        k = int(np.flatnonzero(np.isclose(opts, speed[0]))[0])
        assert k + 1 < opts.size
        slower = speed.copy()
        slower[0] = opts[k + 1]
        assert not _bounds_hold(site, args, slower)[0]
    hot, _ = _choose(site, snap, 45.0)
    cool, _ = _choose(site, snap, 30.0)
    assert hot[0] > cool[0]  # a warm supply leaves the full rack's dies less headroom for a slow pump
    assert hot[0] > lo


def test_pinned_racks_keep_full_speed_and_offsets_follow_the_plate_flow() -> None:
    site, snap = _scene()
    pinned = np.zeros(site.n_racks, dtype=bool)
    pinned[[3, 5]] = True
    load = site_load(site, snap)
    n = site.n_cards
    speed = choose_pump_speeds(
        site,
        load,
        np.where(load.busy, 0, site.card.n_levels - 1),
        ~load.busy,
        np.full(n, site.card.power_limit_w),
        np.full(n, 30.0),
        spec_r_total_k_per_w(site),
        np.zeros(n),
        np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        np.ones(site.n_racks),
        site.rack_power_limits_w() - CFG.rack_margin_w,
        np.zeros(site.n_racks),
        site.card.slowdown_temp_c - CFG.die_margin_k,
        facility_w_per_it_w=1.04,
        full_speed_racks=pinned,
    ).speed_frac
    assert speed[3] == 1.0 and speed[5] == 1.0 and speed[4] < 1.0
    # a die offset measured at full speed grows with the plate's resistance when the pump slows (a
    # fouled plate's excess is plate resistance) and shrinks only as the whole path's when it speeds up
    off = np.zeros(n)
    off[70] = 4.0  # a card of r1
    flow = np.full(site.n_racks, site.loop_flow_per_rack_lpm())
    half = np.full(site.n_racks, 0.5)
    slowed = offset_at_speed(site, off, flow, np.ones(site.n_racks), half)
    cp = site.cold_plate
    q = site.loop.flow_per_card_lpm
    plate_ratio = np.interp(
        1 / (0.5 * q), 1 / np.asarray(cp.flow_lpm)[::-1], np.asarray(cp.r_case_to_coolant_k_per_w)[::-1]
    )
    plate_ratio /= np.interp(1 / q, 1 / np.asarray(cp.flow_lpm)[::-1], np.asarray(cp.r_case_to_coolant_k_per_w)[::-1])
    assert slowed[70] == pytest.approx(4.0 * plate_ratio) and slowed[70] > 4.0
    assert np.all(slowed[np.arange(n) != 70] == 0.0)
    back = offset_at_speed(site, slowed, flow, half, np.ones(site.n_racks))
    assert 4.0 < back[70] < slowed[70]  # conservative: never below the excess it was measured from


def test_the_facility_pump_is_priced_on_the_racks_total_flow() -> None:
    """Racks re-chosen against the exact facility pump (cube of the racks' total flow) end at the
    brute-force optimum of these 40 small instances, pinned racks stay at full speed, and not-allowed
    speeds are never chosen; the per-rack share (nominal / racks x speed^3) alone would miss it. The
    re-choice is a descent, one rack at a time: with costs that are not convex in the speed it can
    stop short of the optimum on other instances (about 1% seen), never above where it started."""
    import itertools

    rng = np.random.default_rng(7)
    options = np.array([1.0, 0.75, 0.5, 0.34])
    fac_w = 3000.0
    n_r = 3
    beat_share = 0

    def total(idx: tuple[int, ...] | np.ndarray, cost: np.ndarray, mass: np.ndarray) -> float:
        i = np.asarray(idx)
        return float(np.sum(cost[i, np.arange(n_r)])) + _facility_w(fac_w, mass, options[i])

    for _ in range(40):
        cost = rng.uniform(0.0, 400.0, size=(options.size, n_r)) + 600.0 * options[:, None] ** 3
        cost[rng.uniform(size=cost.shape) < 0.25] = np.inf
        cost[0] = np.where(np.isfinite(cost[0]), cost[0], 900.0)  # full speed is always allowed
        mass = rng.uniform(0.5, 1.5, size=n_r)
        pinned = np.array([False, False, rng.uniform() < 0.3])
        share = np.argmin(cost + fac_w / n_r * options[:, None] ** 3, axis=0)
        share = np.where(pinned, 0, share)
        best = _descend_facility_pump(cost, options, share, pinned, mass, fac_w)

        combos = [c for c in itertools.product(range(options.size), repeat=n_r) if not (pinned[2] and c[2] != 0)]
        optimum = min(total(c, cost, mass) for c in combos)
        assert total(best, cost, mass) == pytest.approx(optimum, rel=1e-9)
        assert np.all(np.isfinite(cost[best, np.arange(n_r)]))
        assert not pinned[2] or best[2] == 0
        beat_share += total(best, cost, mass) < total(share, cost, mass) - 1e-6
    assert beat_share > 0  # the exact price changes the choice on some instances


def test_a_healthy_pumps_flow_noise_does_not_move_the_full_speed_flow() -> None:
    site = example_site()
    nominal = site.loop_flow_per_rack_lpm()
    flow = nominal * np.array([1.02, 0.98, 0.5, 0.3, np.nan, 0.6, 0.3, 0.96])
    speed = np.array([1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.3, 1.0])
    full = full_speed_flow_lpm(site, flow, speed)
    # noise and a commanded half speed read as nominal; a pump short of its flow at its speed does not
    assert full.tolist() == pytest.approx(
        [nominal, nominal, nominal, 0.6 * nominal, nominal, 0.6 * nominal, nominal, nominal]
    )


def test_a_loop_reading_no_flow_is_a_failed_pump_not_an_unknown_one() -> None:
    site = example_site()
    nominal = site.loop_flow_per_rack_lpm()
    flow = np.array([0.0, 2.0, 2.0, np.nan, 0.0, 4.0, 4.0, nominal])
    speed = np.array([1.0, 0.04, np.nan, 0.0, 0.0, 0.5, 0.01, np.nan])
    full = full_speed_flow_lpm(site, flow, speed)
    # 0 L/min: the floor (a tripped pump); a stalled or unknown speed: the flow it gives now; only an
    # unknown flow reads as nominal (was: nominal for the first three and the fifth)
    floor = MIN_FLOW_FRAC * nominal
    assert full.tolist() == pytest.approx([floor, 2.0, 2.0, nominal, floor, 8.0, 4.0, nominal])


def test_a_rack_whose_pump_stopped_gets_its_pump_at_full_speed_and_its_cards_slowed() -> None:
    site = small_site()
    _plant, state = belief(site, full_load_jobs(site, 8), 60)
    snap0 = state.snapshot()

    def decide(flow_lpm: float) -> Decision:
        flow = snap0.rack_flow_lpm.copy()
        flow[0] = flow_lpm
        snap = dataclasses.replace(snap0, rack_flow_lpm=flow)
        ctl = Controller(site, ControlConfig(period_s=10.0))
        ctx = ctl.context(snap, 60.0)
        return ctl.review(ctl.propose(snap, ctx), snap, ctx)

    healthy, stopped = decide(site.loop_flow_per_rack_lpm()), decide(0.0)
    on_rack0 = (site.card_rack() == 0) & healthy.card_busy
    assert on_rack0.any() and np.array_equal(stopped.card_busy, healthy.card_busy)
    assert healthy.rack_pump_speed_frac is not None and healthy.rack_pump_speed_frac[0] < 1.0
    assert healthy.card_level[on_rack0].min() < site.card.n_levels - 1
    # was: planned as a healthy pump (slowed to 58%, top levels kept)
    assert stopped.rack_pump_speed_frac is not None and stopped.rack_pump_speed_frac[0] == 1.0
    assert np.all(stopped.card_level[on_rack0] == site.card.n_levels - 1)
    assert np.all(stopped.budget_rack_power_w <= stopped.rack_cap_w + 1e-6)


def test_power_the_twin_does_not_explain_counts_once_against_the_rack_cap() -> None:
    """A rack whose PDU reads 2 kW more than the twin explains (``rack_extra_w``) keeps the pump
    speed its plan allows when that 2 kW fits under the cap once; before, the controller and the
    guard took it off the cap *and* added it to the prediction, and sent the pump to full speed."""
    site, snap = _scene()
    ctl = Controller(site, ControlConfig(period_s=15.0))
    ctx = ctl.context(snap, 60.0)
    cap_w = site.rack.power_limit_w - ctl.control.rack_margin_w
    clean = ctl.review(ctl.propose(snap, ctx), snap, ctx)
    assert clean.rack_pump_speed_frac is not None and clean.rack_pump_speed_frac[0] < 1.0
    extra = np.zeros(site.n_racks)
    extra[0] = 2000.0
    ctx_x = dataclasses.replace(ctx, rack_extra_w=extra)
    d = ctl.review(ctl.propose(snap, ctx_x), snap, ctx_x)
    assert d.rack_pump_speed_frac is not None
    assert d.budget_rack_power_w[0] <= cap_w < d.budget_rack_power_w[0] + extra[0]  # counted twice it would not fit
    assert d.rack_pump_speed_frac[0] == pytest.approx(clean.rack_pump_speed_frac[0])
    assert np.array_equal(d.card_level, clean.card_level)


def test_in_closed_loop_the_agent_cuts_pump_energy_within_every_bound() -> None:
    sc = mixed_scenario(900.0)
    ev = evaluate(sc, ["racktwin"], jobs=1)
    agent, base = ev.results["racktwin"], ev.results["baseline"]
    assert agent.breakdown_kwh["pumps"] < 0.5 * base.breakdown_kwh["pumps"]
    m = agent.metrics
    assert m["limit_violation_s"] == 0.0
    assert m["die_over_max_card_s"] == 0.0 and m["die_over_slowdown_card_s"] == 0.0
    assert m["throughput_loss_pct"] < 1.0
    assert 0.0 < m["mean_pump_speed_frac"] < 1.0 and base.metrics["mean_pump_speed_frac"] == 1.0
    # without pump control the same agent leaves the pumps at full speed
    off = evaluate(sc, ["racktwin"], jobs=1, control=ControlConfig(control_pump_speed=False))
    assert off.results["racktwin"].breakdown_kwh["pumps"] == pytest.approx(base.breakdown_kwh["pumps"])


def test_a_cdu_that_does_not_report_its_pump_speed_runs_at_the_speed_last_commanded() -> None:
    """A CDU may omit the pump speed (racktwin.cdu/1: unknown). The agent then takes the speed it
    last commanded: the same decisions as with the speed reported. Read as the last reported speed
    (1 when none), a slowed pump looked weak: every rack's pump was sped up and slowed again at
    every decision and a plate was flagged fouled."""
    from agent.loop import ClosedLoop
    from twin.scenario import build_plant, default_run_scenario

    site = example_site()
    speeds: dict[bool, list[np.ndarray]] = {}
    for report in (True, False):
        plant = build_plant(default_run_scenario(site, 600.0, seed=1))
        read = plant.readings

        def unreported(read: Callable[[], Readings] = read) -> Readings:
            r = read()
            racks = tuple(
                dataclasses.replace(rr, loop=dataclasses.replace(rr.loop, pump_speed_frac=float("nan")))
                if rr.loop is not None
                else rr
                for rr in r.racks
            )
            return dataclasses.replace(r, racks=racks)

        if not report:
            plant.readings = unreported  # type: ignore[method-assign]  # deliberate: the CDUs stop reporting the speed
        seen: list[np.ndarray] = []

        def note(d: Decision, _r: object, seen: list[np.ndarray] = seen) -> None:
            seen.append(np.asarray(d.rack_pump_speed_frac))

        loop = ClosedLoop(plant, Controller(site, ControlConfig(period_s=15.0)), on_decision=note)
        loop.run(600.0)
        if not report:
            reported = loop.state.snapshot().rack_pump_speed_reported
            assert reported is not None and not reported.any()
        speeds[report] = seen
    assert len(speeds[True]) == len(speeds[False])
    assert np.array_equal(np.array(speeds[True]), np.array(speeds[False]))
    assert float(np.array(speeds[False]).mean()) < 0.8  # pumps were slowed


def test_a_cdu_that_reports_its_pump_stopped_is_planned_with_the_flow_it_gives() -> None:
    """A CDU that reports its pump at 0 % (stopped, the flow coasting down) reports its speed: the
    agent reads the measured flow as all the pump gives (a stalled pump; speeding it up may not help).
    Read as "not reported" (before), the agent took the speed it last commanded for the one in force
    and planned the rack with the measured flow over it: 3 times the flow at the lowest speed."""
    from twin.readings import LoopReading, RackReading, Readings

    site = small_site()
    _plant, state = belief(site, [], 60)  # an idle site: the pumps are slowed to the lowest speed
    ctl = Controller(site, ControlConfig(period_s=10.0))
    first = ctl.step(state.snapshot(), 60.0)
    lowest = site.min_pump_speed_frac()
    assert first.rack_pump_speed_frac is not None and first.rack_pump_speed_frac[0] == pytest.approx(lowest)
    coasting_lpm = 0.2 * site.loop_flow_per_rack_lpm()
    stopped = LoopReading(30.0, 31.0, coasting_lpm, 0.0, pump_speed_frac=0.0)
    state.update(Readings(61.0, (RackReading(0, 61.0, loop=stopped),)))
    snap = state.snapshot()
    ctx = ctl.context(snap, 61.0)
    assert ctx.rack_flow_full_lpm[0] == pytest.approx(coasting_lpm)  # was coasting_lpm / lowest
    assert ctx.rack_pump_speed_frac[0] == 0.0
    assert snap.rack_pump_speed_reported is not None and snap.rack_pump_speed_reported[0]


def _per_card_r_total(site: SiteSpec, q: np.ndarray) -> np.ndarray:
    cp = site.cold_plate
    return site.card.r_die_to_case_k_per_w + plate_resistance_k_per_w(cp.flow_lpm, cp.r_case_to_coolant_k_per_w, q)


def test_per_rack_resistance_ratios_are_the_per_card_formulas_bit_for_bit() -> None:
    """r_at_speed and offset_at_speed, computed once per rack (every card of a rack has its flow),
    give the per-card formulas' values to the bit at every speed option (weak pumps, pumps slowed
    now, die offsets)."""
    site, snap = _scene()
    rng = np.random.default_rng(3)
    n, n_r = site.n_cards, site.n_racks
    nominal = site.loop_flow_per_rack_lpm()
    flow = nominal * rng.uniform(0.6, 1.0, n_r)
    now = rng.uniform(0.3, 1.0, n_r)
    off = rng.uniform(0.0, 3.0, n)
    _speed, args = _choose(
        site,
        snap,
        30.0,
        die_offset_k=off,
        rack_flow_full_lpm=flow,
        rack_speed_now_frac=now,
        rack_extra_w=np.full(n_r, 100.0),
    )
    rack = site.card_rack()
    q_full = flow[rack] / site.cards_per_rack
    q_now = q_full * np.clip(now, 0.05, 1.0)[rack]
    cp = site.cold_plate
    plate = functools.partial(plate_resistance_k_per_w, cp.flow_lpm, cp.r_case_to_coolant_k_per_w)
    options = speed_options(site, 9)
    for s in options:
        sp = np.full(n_r, float(s))
        q = q_full * sp[rack]
        r_full = np.asarray(args["r_full_k_per_w"], dtype=np.float64)
        r_ref = r_full * _per_card_r_total(site, q) / _per_card_r_total(site, q_full)
        ratio = np.maximum(plate(q) / plate(q_now), _per_card_r_total(site, q) / _per_card_r_total(site, q_now))
        off_ref = off * ratio
        assert r_at_speed(site, r_full, flow, sp).tobytes() == r_ref.tobytes()
        assert offset_at_speed(site, off, flow, now, sp).tobytes() == off_ref.tobytes()


def test_a_job_in_a_checkpoint_gets_the_pump_speed_it_needs_when_it_computes_again() -> None:
    """The bounds are judged with every busy card computing: a job checkpointing now resumes within a
    decision period, before a slowed pump could be sped up again. The full rack r0 is held by its
    bounds (the next slower option breaks one while it computes: its loop's rise at a 30 deg C supply;
    at 45 deg C with a card whose die reads 10 K over the model, that card's die): its checkpoint
    leaves it there."""
    site, snap = _scene()
    paused = dataclasses.replace(snap, jobs=tuple(dataclasses.replace(j, phase=Phase.CHECKPOINT) for j in snap.jobs))
    opts = speed_options(site, 9)
    hot_card = np.zeros(site.n_cards)
    hot_card[3] = 10.0
    for supply, offsets in ((30.0, np.zeros(site.n_cards)), (45.0, hot_card)):
        computing, args = _choose(site, snap, supply, die_offset_k=offsets)
        k = int(np.flatnonzero(np.isclose(opts, computing[0]))[0])
        slower = computing.copy()
        slower[0] = opts[k + 1]
        flow, now = args["rack_flow_full_lpm"], args["rack_speed_now_frac"]
        scaled = offset_at_speed(site, offsets, flow, now, slower)
        assert not _bounds_hold(site, {**args, "die_offset_k": scaled}, slower)[0]
        checkpoint, _ = _choose(site, paused, supply, die_offset_k=offsets)
        assert checkpoint[0] == computing[0]


def test_a_rack_cap_that_only_full_speed_meets_keeps_the_pump_at_full_speed() -> None:
    """A slower pump warms the dies and their leakage adds power: with r0's usable power 1 W above what
    it draws at full speed, every slower option is over it. With a cap under even that, full speed is
    still taken (always allowed) and the saving it reports is a number."""
    site, snap = _scene()
    speed, args = _choose(site, snap, 30.0)
    assert speed[0] < 1.0
    r = np.asarray(args["r_full_k_per_w"])
    at_full = _predict_at(site, args, r).rack_power_w
    for cap_w in (at_full[0] + 1.0, at_full[0] - 5_000.0):
        cap = np.asarray(args["rack_cap_w"], dtype=np.float64).copy()
        cap[0] = cap_w
        args["rack_cap_w"] = cap
        choice = choose_pump_speeds(facility_w_per_it_w=1.04, steps=9, **args)
        assert choice.speed_frac[0] == 1.0 and choice.speed_frac[1] == speed[1]
        assert np.isfinite(choice.saved_w) and choice.saved_w > 0.0


def test_the_cards_power_is_priced_at_the_facility_power_per_it_watt() -> None:
    """The cost weighs the rack's predicted power by the facility power per IT watt (``b``): the more
    each card watt costs, the faster the loaded racks' pumps (cooler dies, less leakage); when it
    dwarfs the pumps' own power, the loaded racks run at full speed."""
    site, snap = _scene()
    _speed, args = _choose(site, snap, 30.0)

    def speeds(b: float) -> np.ndarray:
        return choose_pump_speeds(facility_w_per_it_w=b, steps=9, **args).speed_frac

    cheap, dear, dearest = speeds(1.04), speeds(5.0), speeds(50.0)
    assert dear[0] > cheap[0] and dear[1] > cheap[1]
    assert dearest[0] == 1.0 and dearest[1] == 1.0


def test_every_option_at_once_gives_each_options_resistances_and_offsets_bit_for_bit() -> None:
    """choose_pump_speeds evaluates all its speed options in one call (rows: options): each row of
    r_at_speed and offset_at_speed is the same to the bit as a call with that row's per-rack speeds
    (weak pumps below the plate table, pumps slowed now, die offsets)."""
    site = example_site()
    rng = np.random.default_rng(11)
    n, n_r = site.n_cards, site.n_racks
    nominal = site.loop_flow_per_rack_lpm()
    flow = nominal * np.array([1.0, 0.9, 0.7, 0.5, 0.3, 0.2, 0.05, MIN_FLOW_FRAC])[:n_r]
    now = rng.uniform(0.3, 1.0, n_r)
    off = rng.uniform(-1.0, 3.0, n)
    r_full = spec_r_total_k_per_w(site) * rng.uniform(1.0, 1.3, n)
    rows = np.vstack([np.full(n_r, float(s)) for s in speed_options(site, 9)] + [rng.uniform(0.3, 1.0, n_r)])
    r_all = r_at_speed(site, r_full, flow, rows)
    off_all = offset_at_speed(site, off, flow, now, rows)
    assert r_all.shape == off_all.shape == (rows.shape[0], n)
    for i, row in enumerate(rows):
        assert r_all[i].tobytes() == r_at_speed(site, r_full, flow, row).tobytes()
        assert off_all[i].tobytes() == offset_at_speed(site, off, flow, now, row).tobytes()


def test_every_option_at_once_gives_each_options_prediction_and_pump_power_bit_for_bit() -> None:
    """choose_pump_speeds predicts all its speed options in one call (rows: options): each row of
    predict_at (card powers and dies, rack powers with the hosts' overhead and the extra, hottest
    awake die per rack) and of rack_pump_power_w is the same to the bit as a call with that row alone,
    with failed, sleeping and power-limited cards among them."""
    site, snap = _scene()
    rng = np.random.default_rng(17)
    n, n_r = site.n_cards, site.n_racks
    load = site_load(site, snap)
    failed = load.failed.copy()
    failed[[3, 70, 200]] = True
    load = dataclasses.replace(load, failed=failed)
    lv = rng.integers(0, site.card.n_levels, n)
    lp = ~load.busy & (rng.uniform(size=n) < 0.5)
    u = card_utilization(site, load, lv, worst_case=False)
    limit = np.where(rng.uniform(size=n) < 0.2, 300.0, site.card.power_limit_w)
    inlet = np.full(n, 32.0)
    extra = rng.uniform(0.0, 500.0, n_r)
    speeds = np.vstack([np.full(n_r, float(s)) for s in speed_options(site, 9)] + [rng.uniform(0.3, 1.0, n_r)])
    flow = np.full(n_r, site.loop_flow_per_rack_lpm())
    r_all = r_at_speed(site, spec_r_total_k_per_w(site) * rng.uniform(1.0, 1.3, n), flow, speeds)
    off_all = offset_at_speed(site, rng.uniform(0.0, 4.0, n), flow, np.ones(n_r), speeds)
    for extra_w in (extra, None):
        every = predict_at(site, load, lv, lp, u, limit, inlet, r_all, off_all, extra_w)
        assert every.rack_power_w.shape == every.rack_max_die_c.shape == (speeds.shape[0], n_r)
        for i in range(speeds.shape[0]):
            one = predict_at(site, load, lv, lp, u, limit, inlet, r_all[i], off_all[i], extra_w)
            for field in ("card_power_w", "card_die_c", "rack_power_w", "rack_max_die_c"):
                assert getattr(every, field)[i].tobytes() == getattr(one, field).tobytes(), field
    pump_all = rack_pump_power_w(site, speeds)
    assert pump_all.shape == speeds.shape
    for i, row in enumerate(speeds):
        assert pump_all[i].tobytes() == rack_pump_power_w(site, row).tobytes()
    # one rack's hottest awake die is what the docs say: failed and sleeping cards are left out
    one = predict_at(site, load, lv, lp, u, limit, inlet, r_all[0], off_all[0], extra)
    awake = ~(lp | load.failed)
    for r in range(n_r):
        dies = one.card_die_c[site.card_rack() == r][awake[site.card_rack() == r]]
        assert one.rack_max_die_c[r] == (dies.max() if dies.size else -np.inf)


def _doc_plate_r_k_per_w(flow_table_lpm: tuple[float, ...], r_table_k_per_w: tuple[float, ...], q_lpm: float) -> float:
    """docs/twin.md: R_plate(flow) is linear in 1/flow between the OCP table's points, extrapolated
    along the last segment below the table's smallest flow; held at the largest flow's value above it."""
    pts = sorted((1.0 / f, r) for f, r in zip(flow_table_lpm, r_table_k_per_w, strict=True))
    x = 1.0 / q_lpm
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, r0), (x1, r1) in itertools.pairwise(pts):
        if x <= x1:
            return r0 + (x - x0) * (r1 - r0) / (x1 - x0)
    (x0, r0), (x1, r1) = pts[-2], pts[-1]
    return r1 + (x - x1) * (r1 - r0) / (x1 - x0)


def test_the_speeds_are_those_of_the_plate_curve_evaluated_one_flow_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a grid of rack loads, supply temperatures, weak pumps and pumps slowed now, the speeds chosen
    with every option evaluated at once are those chosen with the documented plate curve evaluated one
    plate flow at a time (a scalar reference, written from docs/twin.md), and the saving agrees."""
    site, snap = _scene()
    n, n_r = site.n_cards, site.n_racks
    nominal = site.loop_flow_per_rack_lpm()
    rng = np.random.default_rng(5)
    paused = dataclasses.replace(snap, jobs=tuple(dataclasses.replace(j, phase=Phase.CHECKPOINT) for j in snap.jobs))

    def reference_plate(flow_table: tuple[float, ...], r_table: tuple[float, ...], q: np.ndarray) -> np.ndarray:
        flat = [_doc_plate_r_k_per_w(flow_table, r_table, float(v)) for v in np.ravel(q)]
        return np.asarray(flat, dtype=np.float64).reshape(np.shape(q))

    cases: list[tuple[StateSnapshot, float, PumpOverrides]] = []
    for state in (snap, paused):
        for supply in (25.0, 35.0, 45.0):
            for weak in (np.ones(n_r), np.array([1.0, 0.75, 1.0, 0.5, 0.3, 1.0, 0.1, MIN_FLOW_FRAC])[:n_r]):
                now = np.where(weak < 1.0, 1.0, rng.choice([1 / 3, 0.6, 1.0], n_r))
                cases.append(
                    (
                        state,
                        supply,
                        {
                            "rack_flow_full_lpm": nominal * weak,
                            "rack_speed_now_frac": now,
                            "die_offset_k": rng.uniform(0.0, 4.0, n),
                            "rack_extra_w": rng.uniform(0.0, 500.0, n_r),
                        },
                    )
                )
    chosen = []
    for state, supply_c, kw in cases:
        speed, args = _choose(site, state, supply_c, **kw)
        chosen.append((speed, choose_pump_speeds(facility_w_per_it_w=1.04, steps=9, **args).saved_w))
    monkeypatch.setattr("agent.pumps.plate_resistance_k_per_w", reference_plate)
    slowed = 0
    for (state, supply_c, kw), (speed, saved_w) in zip(cases, chosen, strict=True):
        ref, args = _choose(site, state, supply_c, **kw)
        ref_saved = choose_pump_speeds(facility_w_per_it_w=1.04, steps=9, **args).saved_w
        assert speed.tobytes() == ref.tobytes()
        assert saved_w == pytest.approx(ref_saved, rel=1e-9, abs=1e-6)
        slowed += int(np.sum((speed < 1.0) & (speed > site.min_pump_speed_frac() + 1e-9)))
    assert slowed > 0  # some racks are held between the slowest and full speed: the bounds bite
