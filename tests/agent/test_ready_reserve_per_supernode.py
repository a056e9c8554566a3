"""``control.idle_reserve_cards`` is a number of awake idle cards per supernode, and the plans keep it in
each supernode (a job runs inside one: a reserve in another spares it no wake latency), through
``agent.planning``'s problem, plan and relaxation, and in the hosts ``racktwin optimize`` keeps on.

The scene: the small site's 2 racks of 16 cards as two supernodes of one rack each; job "a" runs on cards
0-7 (r0, supernode 0), every other card is idle and awake. r1's cards run hotter (twice the calibrated
thermal resistance: more leakage, an awake card there costs more watts) and r1 has more headroom (no job):
the solver's cheapest place for the whole reserve is r0, the greedy plan's roomiest is r1. Before, the
plans kept 8 cards (4 x 2 supernodes) site-wide, all of them in one supernode."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from agent_helpers import SITE_FILE, belief, example_site, job
from guard_helpers import step_context

from agent.commands.optimize_hosts import hosts_off
from agent.commands.optimize_scenario import SolverSection
from agent.config import ControlConfig
from agent.decision import StepContext
from agent.load import site_load
from agent.planning import cycle_problem, plan_cycle
from models.explain import min_rack_power_w
from models.plans import CyclePlan, SolveStatus
from models.problem import CycleProblem, Margins, Prices, dvfs_tables, make_problem
from models.solve import CyclePlanner
from twin.spec import SiteSpec, site_from_dict
from twin.state import StateSnapshot
from twin.tables import read_toml

pytestmark = pytest.mark.agent


def _two_supernodes() -> SiteSpec:
    data: dict[str, Any] = read_toml(SITE_FILE)
    data.update(torus_dims=[4, 4, 1], racks_per_supernode=1, supernodes=2, name="small-2x1x16")
    data["rack"] = {"host_overhead_w": 8800.0 * 16 / 64, "power_limit_w": 50000.0 * 16 / 64}
    return site_from_dict(data, source="test")


SITE = _two_supernodes()
SNAP: StateSnapshot = belief(SITE, [job("a", 8)], 90)[1].snapshot()


def _ctx(extra_w: float = 0.0) -> StepContext:
    base = step_context(SITE)
    r = base.r_total_k_per_w * np.where(SITE.card_rack() == 1, 2.0, 1.0)
    return step_context(SITE, r_total_k_per_w=r, rack_extra_w=np.array([0.0, extra_w]))


def _problem(ctx: StepContext) -> CycleProblem:
    cfg = ControlConfig(idle_reserve_cards=4)
    return cycle_problem(SITE, cfg, site_load(SITE, SNAP), SNAP, ctx, margins=Margins(), prices=Prices())


def _plan(p: CycleProblem, ctx: StepContext, notes: list[str], use_solver: bool) -> tuple[CyclePlan, CycleProblem]:
    return plan_cycle(
        p,
        ctx,
        notes,
        planner=CyclePlanner(),
        previous_plan=None,
        mip_rel_gap=1e-6,
        use_solver=use_solver,
        rack_names=SITE.rack_names,
    )


def test_the_scene_makes_r0_the_cheaper_and_r1_the_roomier() -> None:
    t = dvfs_tables(_problem(_ctx()))
    assert t.rack_wake_w[1] > t.rack_wake_w[0]
    head_w = t.rack_cap_w - min_rack_power_w(t)
    assert head_w[1] > head_w[0]
    assert t.rack_idle.tolist() == [8, 16]


@pytest.mark.parametrize("use_solver", [True, False])
def test_each_supernode_keeps_its_reserve_awake(use_solver: bool) -> None:
    ctx = _ctx()
    p = _problem(ctx)
    plan, planned = _plan(p, ctx, [], use_solver)
    assert plan.dvfs is not None and planned is p
    assert (plan.status, plan.source) == (
        (SolveStatus.OPTIMAL, "milp") if use_solver else (SolveStatus.FALLBACK, "greedy")
    )
    assert plan.dvfs.rack_awake.tolist() == [4, 4]  # one rack per supernode
    assert p.ready_reserve_cards.tolist() == [4, 4]


def test_a_supernode_whose_racks_cannot_hold_its_reserve_is_named_and_relax_drops_every_reserve() -> None:
    # r1 (supernode 1) keeps room for 2.5 awake cards at its least power: its reserve of 4 does not fit,
    # though r0 has room for 8: the plan is infeasible, the reason names supernode 1, and the relaxed
    # problem keeps no reserve anywhere
    probe = dvfs_tables(_problem(_ctx()))
    room_w = float(probe.rack_cap_w[1] - min_rack_power_w(probe)[1])
    ctx = _ctx(extra_w=room_w - 2.5 * float(probe.rack_wake_w[1]))
    p = _problem(ctx)
    notes: list[str] = []
    plan, planned = _plan(p, ctx, notes, use_solver=True)
    assert plan.status == SolveStatus.INFEASIBLE
    assert plan.explanation.startswith(
        "ready reserve: supernode 1 (rack r1): 4 awake idle cards are required but the racks' headroom at the "
        "lowest levels leaves room for only 2"
    )
    assert "supernode 0" not in plan.explanation
    assert "relaxed: no ready reserve" in notes
    assert planned.ready_reserve_cards.tolist() == [0, 0]
    assert plan.dvfs is not None and plan.dvfs.rack_awake.tolist() == [0, 0]


def test_racktwin_optimize_keeps_the_hosts_of_each_supernodes_reserve_on() -> None:
    # The example hardware as two supernodes (8 cards per host), no job, a reserve of 8 in each and no
    # reserve of hosts: one host stays on in each supernode for its awake reserve, the rest go off. Was:
    # one host on in all (the site's 8 cards), in supernode 0.
    two = example_site().with_supernodes(2)
    p = make_problem(two, supply_temp_c=30.0, ambient_c=25.0, ready_reserve_cards=8)
    off = hosts_off(p, SolverSection(host_reserve_per_supernode=0))
    assert off is not None
    host_sn = two.rack_supernode()[np.arange(two.n_hosts) // two.rack.hosts_per_rack]
    assert np.bincount(host_sn[~off], minlength=2).tolist() == [1, 1]
