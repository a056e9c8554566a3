"""The ready reserve is kept on cards a job can be placed on.

What users rely on: ``control.idle_reserve_cards`` awake idle cards per supernode wait for arriving
jobs, so that a job placed on them starts without waiting for a wake. A card a ``card_failed``
refusal keeps out of placement (``StepContext.refused_failed_cards``: marked until a reading of it
at least as new as the refusal, or held out after a repeat, whatever its readings say) takes no job: kept
awake as part of the reserve, the site had fewer usable awake cards than promised (here none of
the 4). Cards of a placement in flight are busy for the plan, never part of the reserve.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from guard_helpers import scene

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.load import site_load
from agent.planning import cycle_problem
from models.problem import Margins, Prices, dvfs_tables

pytestmark = pytest.mark.agent

SITE, SNAP = scene()  # 2 racks of 16 cards: "a" on 0-7, "b" on 8-19, 20-31 idle and awake, "q" (4 cards) queued
REFUSED = (20, 21, 22, 23)  # idle, awake, said failed by a card_failed refusal no reading has cleared


def refused_mask(cards: tuple[int, ...] = REFUSED) -> np.ndarray:
    out = np.zeros(SITE.n_cards, dtype=bool)
    out[list(cards)] = True
    return out


def placeable_awake_idle(d: Decision, unplaceable: np.ndarray) -> list[int]:
    return np.flatnonzero(~d.card_busy & ~d.card_failed & ~d.card_low_power & ~unplaceable).tolist()


@pytest.mark.parametrize("use_solver", [True, False])
def test_the_reserve_is_kept_awake_on_cards_a_job_can_be_placed_on_not_on_refused_ones(use_solver: bool) -> None:
    cfg = ControlConfig(idle_reserve_cards=4, control_placement=False, control_host_power=False)
    ctl = Controller(SITE, cfg)
    d = ctl.step(SNAP, 100.0, use_solver=use_solver, refused_failed=refused_mask())
    assert len(placeable_awake_idle(d, refused_mask())) >= 4
    # the refused cards get no command (agent.command_diff leaves them out): the decision keeps the
    # low-power state they report (awake here), and the guard budgets them so
    assert not d.card_low_power[list(REFUSED)].any()


def test_refused_idle_cards_are_out_of_the_models_idle_cards_and_their_awake_power_is_budgeted() -> None:
    cfg = ControlConfig(idle_reserve_cards=16)
    ctx = Controller(SITE, cfg).context(SNAP, 100.0, refused_failed=refused_mask())
    load = site_load(SITE, SNAP)
    p = cycle_problem(SITE, cfg, load, SNAP, ctx, margins=Margins(), prices=Prices())
    assert np.flatnonzero(p.failed).tolist() == list(REFUSED)
    assert p.ready_reserve_cards == 8  # cards 24-31
    unrefused = dataclasses.replace(ctx, refused_failed_cards=())
    plain = cycle_problem(SITE, cfg, load, SNAP, unrefused, margins=Margins(), prices=Prices())
    assert plain.ready_reserve_cards == 12
    # rack 1 holds the 4 refused cards, awake: what the models price a wake at comes off its limit
    less_w = plain.rack_limit_w - p.rack_limit_w
    assert less_w[0] == 0.0
    assert less_w[1] == pytest.approx(4 * dvfs_tables(plain).rack_wake_w[1], rel=1e-9)
    assert less_w[1] > 0.0


def test_a_refused_busy_card_and_a_refused_card_asleep_change_neither_the_jobs_nor_the_budget() -> None:
    lp = np.asarray(SNAP.card_low_power, dtype=bool).copy()
    lp[24] = True
    snap = dataclasses.replace(SNAP, card_low_power=lp)
    cfg = ControlConfig()
    ctl = Controller(SITE, cfg)
    ctx = ctl.context(snap, 100.0, refused_failed=refused_mask((3, 24)))  # card 3 runs "a"
    p = cycle_problem(SITE, cfg, site_load(SITE, snap), snap, ctx, margins=Margins(), prices=Prices())
    assert np.flatnonzero(p.failed).tolist() == [24]
    assert p.card_job[3] == 0
    assert (p.rack_limit_w == SITE.rack_power_limits_w()).all()  # asleep: the low power the models count


def test_the_cards_of_a_placement_in_flight_are_busy_for_the_plan_never_part_of_the_reserve() -> None:
    cfg = ControlConfig(idle_reserve_cards=4, control_host_power=False)
    ctl = Controller(SITE, cfg)
    first = ctl.step(SNAP, 100.0, use_solver=False)
    assert [o.job_id for o in first.placements] == ["q"]
    placed = list(first.placements[0].cards)
    # the next decision, the job not yet seen started: its order is in flight
    d = ctl.step(dataclasses.replace(SNAP, time_s=105.0), 105.0, use_solver=False)
    assert d.card_busy[placed].all()
    assert ctl.pending_placements() == {"q": tuple(placed)}
    awake = placeable_awake_idle(d, refused_mask(()))
    assert len(awake) >= 4 and not set(awake) & set(placed)
    load = site_load(SITE, SNAP, [("q", tuple(placed))])
    ctx = ctl.context(SNAP, 105.0)
    p = cycle_problem(SITE, cfg, load, SNAP, ctx, margins=Margins(), prices=Prices())
    assert not p.failed[placed].any() and (p.card_job[placed] >= 0).all()
    assert p.idle_mask().sum() == 8 and p.ready_reserve_cards == 4
