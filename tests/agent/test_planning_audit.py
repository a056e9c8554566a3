"""``agent.planning``'s promises a mutation audit found untested (each test names the rule of the
module's docstrings or docs/agent.md it pins), on the scene of tests/agent/guard_helpers.py: rack r0
runs job "a" (priority 1) on cards 0-7 and job "b" (priority 2) on cards 8-15, rack r1 runs "b" on
cards 16-19 and has idle, awake cards 20-31; a 30 deg C set-point with options 20..45 deg C in 5 K
steps. The expectations are derived by hand from those rules."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from agent_helpers import SITE_FILE
from guard_helpers import scene, step_context

from agent.config import ControlConfig
from agent.decision import StepContext
from agent.load import site_load
from agent.planning import checkpoint_wake_s, cycle_problem, plan_cycle
from models.explain import min_rack_power_w
from models.plans import CyclePlan
from models.problem import CycleProblem, Margins, Prices, dvfs_tables
from models.solve import CyclePlanner
from twin.spec import SiteSpec, site_from_dict
from twin.state import StateSnapshot
from twin.tables import read_toml
from twin.workload import Phase

pytestmark = pytest.mark.agent

SITE, SNAP = scene()
N = SITE.n_cards
NAMES = SITE.rack_names


def problem(
    cfg: ControlConfig | None = None,
    snap: StateSnapshot = SNAP,
    ctx: StepContext | None = None,
    site: SiteSpec = SITE,
) -> CycleProblem:
    ctx = ctx if ctx is not None else step_context(site)
    return cycle_problem(
        site, cfg or ControlConfig(), site_load(site, snap), snap, ctx, margins=Margins(), prices=Prices()
    )


def with_job(snap: StateSnapshot, i: int, **changes: Any) -> StateSnapshot:
    info = snap.jobs[i]
    spec_changes = changes.pop("spec", {})
    if spec_changes:
        assert info.spec is not None
        changes["spec"] = dataclasses.replace(info.spec, **spec_changes)
    jobs = list(snap.jobs)
    jobs[i] = dataclasses.replace(info, **changes)
    return dataclasses.replace(snap, jobs=tuple(jobs))


def plan(p: CycleProblem, notes: list[str], *, use_solver: bool = True, **ctx_changes: Any) -> CyclePlan:
    got, _planned = plan_cycle(
        p,
        step_context(SITE, **ctx_changes),
        notes,
        planner=CyclePlanner(),
        previous_plan=None,
        mip_rel_gap=1e-4,
        use_solver=use_solver,
        rack_names=NAMES,
    )
    return got


# ---- checkpoint_wake_s ----------------------------------------------------------------------------


def test_a_checkpoint_of_a_job_whose_spec_is_unknown_wakes_nobody() -> None:
    """No ``submitted`` event seen: the agent does not know the checkpoint's declared length, so no
    end is due (and the wake is not a crash)."""
    info = dataclasses.replace(SNAP.jobs[0], phase=Phase.CHECKPOINT, last_event_s=90.0, spec=None)
    assert checkpoint_wake_s([info], 0.0, 16.0) == math.inf


# ---- cycle_problem --------------------------------------------------------------------------------


def test_a_pinned_job_is_valued_at_its_own_priority_times_the_kept_share_and_keeps_its_slo() -> None:
    """Module docstring: a job out of compute is handed to the models "of the value
    pinned_value_frac gives them" (a share of its own value) with its SLO kept. "b" (priority 2,
    SLO 0.5) has checkpointed 600 s with a 60 s resume lag: 2 x 60 / 600 = 0.2."""
    snap = with_job(SNAP, 1, phase=Phase.CHECKPOINT, last_event_s=-500.0, spec={"min_throughput_frac": 0.5})
    b = problem(ControlConfig(resume_lag_s=60.0), snap=snap).jobs[1]
    assert b.priority == pytest.approx(0.2)
    assert b.min_throughput_frac == 0.5


def test_failed_cards_are_out_of_the_models_hands() -> None:
    failed = np.zeros(N, dtype=bool)
    failed[[21, 30]] = True
    p = problem(snap=dataclasses.replace(SNAP, card_failed=failed), ctx=step_context(SITE))
    assert np.flatnonzero(p.failed).tolist() == [21, 30]
    assert problem(ControlConfig(idle_reserve_cards=16)).ready_reserve_cards == 12
    p = problem(ControlConfig(idle_reserve_cards=16), snap=dataclasses.replace(SNAP, card_failed=failed))
    assert p.ready_reserve_cards == 10  # only 10 healthy idle cards


def test_the_ready_reserve_is_per_supernode() -> None:
    """``control.idle_reserve_cards`` counts per supernode, and each supernode keeps its own: the same 2
    racks of 16 cards as two supernodes of one rack, the 12 idle cards all in r1 (supernode 1), keep 4
    there and none in supernode 0, which has no idle card (before: 8 site-wide, all of them in r1)."""
    data: dict[str, Any] = read_toml(SITE_FILE)
    data["torus_dims"] = [4, 4, 1]
    data["racks_per_supernode"] = 1
    data["supernodes"] = 2
    data["name"] = "small-2x1x16"
    data["rack"] = {"host_overhead_w": 8800.0 * 16 / 64, "power_limit_w": 50000.0 * 16 / 64}
    two = site_from_dict(data, source="test")
    assert two.n_cards == N and two.supernodes == 2
    assert problem(
        ControlConfig(idle_reserve_cards=4), site=two, ctx=step_context(two)
    ).ready_reserve_cards.tolist() == [0, 4]
    assert problem(ControlConfig(idle_reserve_cards=4)).ready_reserve_cards.tolist() == [4]


def test_the_measured_die_offsets_and_the_ambient_of_the_step_are_the_models() -> None:
    off = np.zeros(N)
    off[[3, 17]] = [4.0, 7.5]
    p = problem(ctx=step_context(SITE, die_offset_k=off, ambient_c=31.0))
    np.testing.assert_array_equal(p.die_offset_k, off)
    assert p.ambient_c == 31.0


# ---- plan_cycle -----------------------------------------------------------------------------------


def _hot_day() -> tuple[CycleProblem, dict[str, Any]]:
    """A 32 deg C afternoon: at a 30 deg C supply the facility water (supply less the CDU's approach)
    is below the air, so the chiller carries all the heat (COP <= 10: over 1.5 kW for ~17 kW of
    racks); at 35 deg C the dry cooler takes part of it, which saves far more than the ~0.4 W/K of
    leakage per card x 32 cards x 5 K (~64 W) the warmer dies cost. A step that chooses the
    set-point moves to 35; one that does not keeps 30."""
    ctx: dict[str, Any] = {"ambient_c": 32.0}
    p = problem(ctx=step_context(SITE, **ctx))
    assert p.supply_options_c == (25.0, 30.0, 35.0)
    return p, ctx


@pytest.mark.parametrize("use_solver", [True, False])
def test_the_setpoint_is_chosen_only_in_a_step_that_chooses_it(use_solver: bool) -> None:
    p, ctx = _hot_day()
    chosen = plan(p, [], use_solver=use_solver, choose_setpoint=True, **ctx)
    kept = plan(p, [], use_solver=use_solver, choose_setpoint=False, **ctx)
    assert chosen.supply_temp_c == 35.0
    assert kept.supply_temp_c == 30.0


@pytest.mark.parametrize("use_solver", [True, False])
def test_a_relaxed_plan_still_chooses_the_setpoint(use_solver: bool) -> None:
    """Rack r0 capped at 3 kW (no plan fits it): r0 is left to the guard's caps and the rest, the
    set-point included, is planned as usual (``relax``'s docstring)."""
    p, ctx = _hot_day()
    p = dataclasses.replace(p, rack_limit_w=np.array([3000.0, 12500.0]))
    notes: list[str] = []
    got = plan(p, notes, use_solver=use_solver, choose_setpoint=True, **ctx)
    assert f"relaxed: racks {NAMES[0]} left to the guard's caps (idle cards asleep: no reserve)" in notes
    assert got.supply_temp_c == 35.0


def test_relaxing_a_chosen_setpoint_judges_slos_at_the_coolest_option() -> None:
    """Job "a" must run at its top clock (SLO 0.99) and is 1 K over the die limit there at 30 deg C but
    4 K under it at 25 deg C; rack r1 is capped below its least power so that no plan fits. When the
    step chooses the set-point, cooling can meet "a"'s SLO: only r1 is relaxed, not the SLO."""
    p = problem()
    jobs = (dataclasses.replace(p.jobs[0], min_throughput_frac=0.99), p.jobs[1])
    p = dataclasses.replace(p, jobs=jobs)
    hot_k = p.die_limit_c - float(dvfs_tables(p, 30.0).job_die_max_c[0, 0]) + 1.0
    off = np.zeros(N)
    off[:8] = hot_k
    p = dataclasses.replace(p, die_offset_k=off)
    assert dvfs_tables(p, 30.0).cheapest_level[0] < 0 and dvfs_tables(p, 25.0).cheapest_level[0] == 0
    least_w = min_rack_power_w(dvfs_tables(p, 25.0))
    p = dataclasses.replace(p, rack_limit_w=np.array([12500.0, least_w[1] + p.margins.rack_margin_w - 500.0]))
    notes: list[str] = []
    got = plan(p, notes, use_solver=False, choose_setpoint=True)
    assert got.dvfs is not None
    assert f"relaxed: racks {NAMES[1]} left to the guard's caps (idle cards asleep: no reserve)" in notes
    assert not any(n.startswith("relaxed: SLO") for n in notes)


def test_a_rack_over_its_cap_at_least_power_by_less_than_a_kilowatt_is_left_to_the_guard() -> None:
    p = problem()
    least_w = min_rack_power_w(dvfs_tables(p, 30.0))
    limit = np.array([12500.0, least_w[1] + p.margins.rack_margin_w - 10.0])  # 10 W short
    notes: list[str] = []
    got = plan(dataclasses.replace(p, rack_limit_w=limit), notes, use_solver=False)
    assert got.dvfs is not None
    assert f"relaxed: racks {NAMES[1]} left to the guard's caps (idle cards asleep: no reserve)" in notes
