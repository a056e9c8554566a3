"""Pump pricing (``agent.pumps``): the cost each rack's pump choice minimizes weighs the rack's
power with its jobs *in their current phases*, while its bounds are judged with every busy card
computing. Kills the mutant that prices with the worst case (agent/pumps.py:215 ``expected`` ->
``worst``): the two differ for a rack whose job is in a checkpoint.

The example site with the facility pump's head at 0 (its power 0: every rack's choice is its own)
and two speed options, full and the slowest (0.4 / 1.2 L/min of plate flow = 1/3). Per rack the
choice minimizes ``b x rack power + rack pump power`` (``b`` = 1.04 here) among the allowed speeds:
the slow speed is taken where the pump power it saves is more than ``b x`` the leakage power its
warmer dies add. A card's steady power at die-to-inlet resistance ``R`` is
``(p_ref + k (T_in - T_ref)) / (1 - k R)`` (twin.steady, twin.power): a checkpointing card idles
(utilization 0, ``p_ref`` = its level's idle power), a computing one adds ``u x`` its dynamic power,
so slowing the pump costs a computing card ~7 times the leakage a checkpointing one costs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from agent_helpers import SITE_FILE, belief, job

from agent.config import ControlConfig
from agent.controller import Controller
from agent.load import site_load
from agent.pumps import choose_pump_speeds
from twin.power import PowerModel
from twin.spec import SiteSpec, site_from_dict
from twin.steady import card_steady_power_w
from twin.tables import read_toml
from twin.thermal import plate_resistance_k_per_w
from twin.workload import Phase, compute_utilization

pytestmark = pytest.mark.agent

CFG = ControlConfig()
B = 1.04  # facility W per IT W
LEVEL = 2  # every busy card's planned level
SUPPLY_C = 30.0
SLOW = 1.0 / 3.0


def _site(pump_head_kpa: float) -> SiteSpec:
    data = read_toml(SITE_FILE)
    data["loop"] = {**data["loop"], "pump_head_kpa": pump_head_kpa}
    data["cdu"] = {**data["cdu"], "facility_pump_head_kpa": 0.0}
    return site_from_dict(data, source="pump-pricing")


def _r_k_per_w(site: SiteSpec, speed: float) -> float:
    """A card's die-to-inlet resistance with its rack's pump at ``speed`` (nominal pump)."""
    cp = site.cold_plate
    q = site.loop.flow_per_card_lpm * speed
    return float(
        site.card.r_die_to_case_k_per_w + plate_resistance_k_per_w(cp.flow_lpm, cp.r_case_to_coolant_k_per_w, q)
    )


def _added_w(site: SiteSpec, utilization: float, low_power: bool) -> float:
    """What one card draws more at the slowest speed than at full speed (twin.steady)."""
    model = PowerModel.from_card(site.card)
    lv, u, lp = np.array([LEVEL]), np.array([utilization]), np.array([low_power])
    full = card_steady_power_w(model, lv, u, lp, SUPPLY_C, _r_k_per_w(site, 1.0))[0][0]
    slow = card_steady_power_w(model, lv, u, lp, SUPPLY_C, _r_k_per_w(site, SLOW))[0][0]
    return float(slow - full)


def _saving_w(site: SiteSpec, head_kpa: float) -> float:
    """Rack pump power saved at the slowest speed: head x flow / efficiency x (1 - 1/27)."""
    flow_m3_s = site.loop.flow_per_card_lpm * site.cards_per_rack / 60_000.0
    return head_kpa * 1e3 * flow_m3_s / site.loop.pump_efficiency * (1.0 - SLOW**3)


@pytest.mark.parametrize("phase", [Phase.CHECKPOINT, Phase.COMPUTE], ids=["checkpoint", "compute"])
def test_a_rack_whose_job_checkpoints_is_priced_at_the_power_it_draws_now(phase: Phase) -> None:
    """An 8-card job (the rest of its rack asleep). The pump head is set so that the slow speed
    saves ``b x`` (the asleep cards' added leakage + 8 x the mean of a checkpointing and a computing
    card's): more than the checkpointing rack's added power costs, less than the computing rack's.
    The bounds allow the slow speed either way (8 cards computing at ~0.5 kW: dies ~64 deg C under
    85, ~17 kW under the 49 kW cap, a ~10 K rise under 16.3 K at a third of the flow). So the rack
    whose job checkpoints gets the slowest speed, the same rack computing keeps full speed."""
    site0 = _site(250.0)
    spec = job("j", 8, share=0.95)
    u_comp = float(
        compute_utilization(
            spec.compute_share, site0.card.clocks_mhz[LEVEL] / site0.card.clocks_mhz[0], spec.noncompute_utilization
        )
    )
    asleep_w = (site0.cards_per_rack - 8) * _added_w(site0, 0.0, True)
    ckpt_w, comp_w = _added_w(site0, 0.0, False), _added_w(site0, u_comp, False)
    assert comp_w > 5.0 * ckpt_w > 0.0  # the leakage a slow pump costs grows with the card's power
    target_w = B * (asleep_w + 8 * (ckpt_w + comp_w) / 2.0)
    head_kpa = 250.0 * target_w / _saving_w(site0, 250.0)
    site = _site(head_kpa)
    assert _saving_w(site, head_kpa) == pytest.approx(target_w)

    _plant, state = belief(site, [spec], 30)
    snap = state.snapshot()
    snap = dataclasses.replace(snap, jobs=tuple(dataclasses.replace(j, phase=phase) for j in snap.jobs))
    load = site_load(site, snap)
    rack = site.card_rack()[load.busy]
    assert load.busy.sum() == 8 and np.all(rack == rack[0])
    n = site.n_cards
    choice = choose_pump_speeds(
        site,
        load,
        np.where(load.busy, LEVEL, site.card.n_levels - 1),
        ~load.busy,
        np.full(n, site.card.power_limit_w),
        np.full(n, SUPPLY_C),
        np.full(n, _r_k_per_w(site, 1.0)),
        np.zeros(n),
        np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        np.ones(site.n_racks),
        site.rack_power_limits_w() - CFG.rack_margin_w,
        np.zeros(site.n_racks),
        site.card.slowdown_temp_c - CFG.die_margin_k,
        facility_w_per_it_w=B,
        steps=2,
    )
    expected = SLOW if phase == Phase.CHECKPOINT else 1.0
    assert choice.speed_frac[rack[0]] == pytest.approx(expected)


@pytest.mark.parametrize(("ups_loss_fraction", "speed"), [(0.5, 1.0), (0.0, SLOW)])
def test_the_agent_prices_its_pump_choice_with_the_ups_loss(ups_loss_fraction: float, speed: float) -> None:
    """Kills the controller's copy of the pricing without the UPS loss (agent/controller.py:411
    ``1.0 + ups_loss_fraction`` -> ``1.0``; ``racktwin optimize``'s copy: test_optimize_mutants2.py).

    Each W of rack power costs ``1 + ups_loss_fraction`` W at the facility (``agent.pumps``). An idle
    site, in-process controller: no idle reserve, hosts left on, so every card is asleep; the plan
    moves the supply to 35 deg C (above every measured inlet: the cards' inlet for the pump choice).
    An asleep card draws ``(52.8 + 0.4 (35 - 42)) / (1 - 0.4 R)`` W (twin.steady): 0.333 W more at a
    third of the speed (R 0.0689 instead of 0.053 K/W), ~21.4 W a rack of 64. The rack pump's head is
    set so that the slow speed saves 1.25 x that: with a UPS loss of 50% the leakage costs 1.5 x, more
    than the saving (full speed); without a UPS loss 1 x, less (a third of the speed)."""
    site0 = _site(250.0)
    model = PowerModel.from_card(site0.card)
    lp = np.array([True])

    def asleep_w(speed_frac: float) -> float:
        p = card_steady_power_w(model, np.array([0]), np.zeros(1), lp, 35.0, _r_k_per_w(site0, speed_frac))[0]
        return float(p[0])

    rack_added_w = site0.cards_per_rack * (asleep_w(SLOW) - asleep_w(1.0))
    assert rack_added_w == pytest.approx(21.4, abs=0.1)
    head_kpa = 250.0 * 1.25 * rack_added_w / _saving_w(site0, 250.0)
    data = read_toml(SITE_FILE)
    data["loop"] = {**data["loop"], "pump_head_kpa": head_kpa}
    data["cdu"] = {**data["cdu"], "facility_pump_head_kpa": 0.0}
    data["facility"] = {**data["facility"], "ups_loss_fraction": ups_loss_fraction}
    site = site_from_dict(data, source="ups")

    _plant, state = belief(site, [], 60)
    snap = state.snapshot()
    ctl = Controller(site, ControlConfig(pump_speed_steps=2, idle_reserve_cards=0, control_host_power=False))
    ctx = ctl.context(snap, 60.0)
    d = ctl.review(ctl.propose(snap, ctx), snap, ctx)
    assert d.supply_temp_c == 35.0 and float(np.max(ctx.card_inlet_c)) < 35.0
    assert np.all(d.card_low_power) and not np.any(d.card_busy)
    assert d.rack_pump_speed_frac is not None
    assert d.rack_pump_speed_frac == pytest.approx([speed] * site.n_racks, abs=1e-9)
