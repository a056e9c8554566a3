"""Property: whatever plan the guard is given (adversarial levels, sleep states, limits, set-points,
pump speeds, placements, stale racks, weak pumps, measured extras up to 3 kW, where the fail-safe
power limit can hold every rack), the decision it lets out keeps every rack within its limit minus
margin, every busy die under its limit and every slowed loop's rise within its bound, as the twin
computes it at the pump speeds it lets out, never raises a cap, wakes a card or slows a pump on
stale data, and never raises a level faster than its rate limit."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from guard_helpers import proposal, scene
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import ControlConfig
from agent.decision import Decision, PlacementOrder, StepContext
from agent.guard import Guard
from agent.load import die_offsets_k, site_load, spec_r_total_k_per_w
from agent.pumps import offset_at_speed, r_at_speed
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.state import StateSnapshot
from twin.steady import card_steady_power_w
from twin.workload import compute_utilization

pytestmark = pytest.mark.agent

FloatArray = npt.NDArray[np.float64]

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)


def judge(site: SiteSpec, snap: StateSnapshot, ctx: StepContext, d: Decision) -> tuple[FloatArray, FloatArray]:
    """Rack power (cards + hosts + extra) and busy-card die temperatures of a decision, recomputed
    with the twin's functions: every busy card computing at its level, held to its power limit."""
    model = PowerModel.from_card(site.card)
    load = site_load(site, snap, [(p.job_id, p.cards) for p in d.placements])
    busy = load.busy
    assert np.all(d.card_busy == busy)
    cs = np.zeros(site.n_cards)
    ncu = np.zeros(site.n_cards)
    for j in load.jobs:
        cs[j.cards], ncu[j.cards] = j.spec.compute_share, j.spec.noncompute_utilization
    clocks = np.asarray(site.card.clocks_mhz)
    lv = d.card_level
    u = np.where(busy, compute_utilization(cs, clocks[lv] / clocks[0], ncu), 0.0)
    lp = d.card_low_power & ~busy
    inlet = np.maximum(ctx.card_inlet_c, d.supply_temp_c)
    off = ctx.die_offset_k
    r = ctx.r_total_k_per_w
    if d.rack_pump_speed_frac is not None:  # resistances and measured offsets at the pumps' speeds
        r = r_at_speed(site, r, ctx.rack_flow_full_lpm, d.rack_pump_speed_frac)
        off = offset_at_speed(site, off, ctx.rack_flow_full_lpm, ctx.rack_pump_speed_frac, d.rack_pump_speed_frac)
    p, _ = card_steady_power_w(model, lv, u, lp, inlet, r)
    p = p + np.where(lp, model.low_power_leak_w_per_k, model.leak_w_per_k[lv]) * off
    p = np.where(lp, p, np.minimum(p, d.card_power_limit_w))
    p = np.where(snap.card_failed, 0.0, p)
    racks = np.bincount(site.card_rack(), weights=p, minlength=site.n_racks) + site.rack.host_overhead_w
    die = np.where(busy & ~snap.card_failed, inlet + r * p + off, -np.inf)
    return racks + ctx.rack_extra_w, die


n_cards = 32
levels = st.lists(st.integers(-3, 12), min_size=n_cards, max_size=n_cards)
flags = st.lists(st.booleans(), min_size=n_cards, max_size=n_cards)
limits = st.lists(
    st.one_of(st.floats(0.0, 2000.0), st.just(float("nan")), st.just(float("inf"))), min_size=n_cards, max_size=n_cards
)
inlets = st.lists(st.floats(15.0, 50.0), min_size=2, max_size=2)
speeds = st.one_of(st.none(), st.lists(st.one_of(st.floats(0.0, 1.2), st.just(float("nan"))), min_size=2, max_size=2))
placements = st.lists(
    st.tuples(st.sampled_from(["q", "a", "nope"]), st.lists(st.integers(-2, 40), min_size=0, max_size=6)),
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lv=levels,
    lp=flags,
    lim=limits,
    setpoint=st.floats(-10.0, 90.0),
    current_setpoint=st.sampled_from([20.0, 30.0, 45.0]),
    inlet=inlets,
    stale=st.lists(st.booleans(), min_size=2, max_size=2),
    stuck=st.one_of(st.none(), st.integers(0, n_cards - 1)),
    extra=st.lists(st.floats(0.0, 3000.0), min_size=2, max_size=2),
    r_scale=st.floats(0.9, 2.0),
    places=placements,
    speed=speeds,
    pump_health=st.lists(st.floats(0.3, 1.0), min_size=2, max_size=2),
)
def test_no_reviewed_decision_exceeds_a_cap(
    lv: list[int],
    lp: list[bool],
    lim: list[float],
    setpoint: float,
    current_setpoint: float,
    inlet: list[float],
    stale: list[bool],
    stuck: int | None,
    extra: list[float],
    r_scale: float,
    places: list[tuple[str, list[int]]],
    speed: list[float] | None,
    pump_health: list[float],
) -> None:
    site, snap = scene()
    card_inlet = np.asarray(inlet)[site.card_rack()]
    r_total = spec_r_total_k_per_w(site) * r_scale
    # offsets as large as the raw measurement gives (the filter's are never larger than a settled one)
    offsets = die_offsets_k(site, snap, site_load(site, snap), card_inlet, r_total)
    blind = tuple(i for i, s in enumerate(stale) if s)
    stuck_rack = set() if stuck is None else {int(site.card_rack()[stuck])}
    ctx = StepContext(
        now_s=100.0,
        cycle=1,
        stale_racks=tuple(i for i, s in enumerate(stale) if s),
        stuck_racks=(),
        stuck_cards=() if stuck is None else (stuck,),
        blind_racks=blind,
        failsafe_racks=tuple(sorted(set(blind) | stuck_rack)),
        setpoint_c=current_setpoint,
        ambient_c=25.0,
        card_inlet_c=card_inlet,
        r_total_k_per_w=r_total,
        die_offset_k=offsets,
        rack_extra_w=np.asarray(extra),
        rack_flow_full_lpm=site.loop_flow_per_rack_lpm() * np.asarray(pump_health),
        rack_pump_speed_frac=np.ones(site.n_racks),
        choose_setpoint=True,
        solver_time_limit_s=1.0,
    )
    planned = proposal(
        site,
        lv,
        card_low_power=np.asarray(lp, dtype=bool),
        card_power_limit_w=np.asarray(lim, dtype=np.float64),
        supply_temp_c=setpoint,
        placements=tuple(PlacementOrder(j, tuple(c)) for j, c in places),
        rack_pump_speed_frac=None if speed is None else np.asarray(speed, dtype=np.float64),
    )
    d = Guard(site, CFG).review(planned, snap, ctx)
    racks, die = judge(site, snap, ctx, d)
    cap = site.rack.power_limit_w - CFG.rack_margin_w
    assert np.all(racks <= cap + 1e-6), (racks, cap)
    assert np.allclose(d.budget_rack_power_w, racks)
    # dies: under the limit unless the card is already at its slowest level and lowest power limit
    die_limit = site.card.slowdown_temp_c - CFG.die_margin_k
    stuck_hot = (d.card_level == 7) & (d.card_power_limit_w <= CFG.min_power_limit_w)
    assert np.all((die <= die_limit + 1e-6) | stuck_hot)
    # rate limits
    cur = np.asarray(snap.card_level)
    assert np.all(d.card_level >= cur - CFG.max_level_raise_per_period)
    assert abs(d.supply_temp_c - current_setpoint) <= CFG.max_setpoint_step_k + 1e-9
    assert site.facility.supply_temp_options_c[0] <= d.supply_temp_c <= site.facility.supply_temp_options_c[-1]
    # fail-safe racks: no cap raised, caps under the limit; blind (stale) racks: no card woken, everything
    # at the slowest level, nothing placed; a stuck card: not woken, not placed on
    # pumps: within the site's range, at full speed on stale racks, every slowed loop within its rise
    if speed is None:
        assert d.rack_pump_speed_frac is None
    else:
        sp = d.rack_pump_speed_frac
        assert sp is not None and np.all((sp >= site.min_pump_speed_frac() - 1e-12) & (sp <= 1.0))
        assert np.all(sp[list(ctx.failsafe_racks)] == 1.0)
        loop = site.loop
        mcp = ctx.rack_flow_full_lpm * sp / 60_000.0 * loop.density_kg_per_m3 * loop.specific_heat_j_per_kg_k
        assert np.all((sp == 1.0) | (racks / mcp <= loop.max_delta_t_k + 1e-6))
    for r in ctx.failsafe_racks:
        rc = site.card_rack() == r
        assert np.all(d.card_power_limit_w[rc] <= snap.card_power_limit_w[rc] + 1e-9)
        assert d.card_power_limit_w[rc].sum() + site.rack.host_overhead_w + extra[r] <= cap + 1e-6
    unseen = ctx.unseen_card_mask(site.card_rack())
    assert not np.any(unseen & ~d.card_low_power & snap.card_low_power & ~d.card_busy)
    assert np.all(d.card_level[ctx.blind_card_mask(site.card_rack())] == 7)
    assert not any(unseen[list(p.cards)].any() for p in d.placements)
    # busy cards are awake; placements are valid
    assert not np.any(d.card_low_power & d.card_busy)
    for p in d.placements:
        assert p.job_id == "q" and len(p.cards) == 4
    # a queued job whose placement the guard dropped says so (Decision.queue_waits)
    queued = {q.job_id for q in snap.queue}
    kept = {p.job_id for p in d.placements}
    for j, _cards in places:
        if j in queued and j not in kept:
            assert d.queue_waits[j].kind == "placement_dropped"
        else:
            assert j not in d.queue_waits
