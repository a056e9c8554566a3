"""The joint set-point MILP (``models.cooling``): a mutant that a hand mutation pass (2026-12-04) left
alive: a rack with exactly one idle card must still be able to wake it for the ready reserve
(``idle_racks = rack_idle > 0``; an off-by-one ``> 1`` dropped such racks' wake variable)."""

from __future__ import annotations

import pytest
from models_helpers import job, problem, rack_cards

from models.cooling import solve_joint_setpoint
from models.plans import SolveStatus
from twin.spec import SiteSpec

pytestmark = pytest.mark.models


def test_joint_milp_wakes_a_racks_only_idle_card_for_the_ready_reserve(site: SiteSpec) -> None:
    # Every card of the example site runs a job but card 63 of r0 (a 63-card job there, a 64-card job
    # in each other rack). A ready reserve of 1 awake card can only be that card: the plan must keep
    # it awake (docs/models.md: the reserve of awake idle cards), at either set-point.
    jobs = [job("r0", 63)] + [job(f"r{r}", 64) for r in range(1, 8)]
    cards = [rack_cards(0, 63)] + [rack_cards(r) for r in range(1, 8)]
    p = problem(site, jobs, cards, reserve=1, options=[30.0, 35.0])
    status, plan, _sp, _dt = solve_joint_setpoint(p, time_limit_s=10.0)
    assert status == SolveStatus.OPTIMAL and plan is not None
    assert plan.rack_awake.tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
