"""The cycle problem built from the agent's belief (TwinState fed by the virtual plant)."""

from __future__ import annotations

import numpy as np
import pytest
from models_helpers import judge

from models.from_state import problem_from_snapshot
from models.plans import SolveStatus
from models.solve import plan_cycle
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import generate_jobs

pytestmark = pytest.mark.models


def test_problem_from_a_live_belief_plans_within_caps(site: SiteSpec) -> None:
    plant = Plant(site, generate_jobs(site.n_cards, 3600, seed=2), [], PlantConfig(seed=2))
    state = TwinState(site)
    for _ in range(240):
        plant.step(1.0)
        state.update(plant.readings())
        state.apply_events(plant.drain_events())
    snap = state.snapshot()
    p = problem_from_snapshot(site, snap)
    assert p.n_jobs == len([j for j in range(len(snap.jobs)) if np.any(snap.card_job == j)])
    assert int((p.card_job >= 0).sum()) == int(((snap.card_job >= 0) & ~snap.card_failed).sum())
    assert snap.facility is not None and p.ambient_c == snap.facility.ambient_temp_c
    plan = plan_cycle(p, time_limit_s=10.0)
    assert plan.status.has_plan and plan.dvfs is not None
    assert plan.status != SolveStatus.INFEASIBLE
    rack_w, die = judge(p, plan.dvfs, plan.supply_temp_c)
    assert np.all(rack_w <= p.rack_cap_w() + 1e-6)
    assert np.all(die[p.card_job >= 0] <= p.die_limit_c + 1e-6)
