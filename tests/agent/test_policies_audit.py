"""The comparison policies do what docs/evaluation.md says they do (mutation audit of ``agent.policies``).

What users rely on: static-cap limits every card of every rack; the reactive capper reacts at its
documented thresholds (above ``limit - high_band_w`` it caps, below ``limit - low_band_w`` it uncaps,
between them it holds) and never takes a card below its floor (``min_power_limit_w``); greedy is the
agent planning greedily (no MILP); ``guard_interventions`` counts the decisions the guard changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from agent_helpers import small_site
from evaluate_helpers import full_load_scenario
from readings_testing import cards_of

from agent.decision import Decision
from agent.evaluate import _plant_for
from agent.loop import ApplyReport
from agent.policies import AgentPolicy, ReactivePolicy, make_policy, static_cap_w
from twin.faults import CardFailure
from twin.plant import Plant, PlantConfig
from twin.plant_types import SensorNoise
from twin.scenario import build_plant
from twin.workload import JobSpec

pytestmark = pytest.mark.agent


def test_static_cap_limits_every_live_card_of_every_rack_and_binds_around_a_failed_card() -> None:
    """Static-cap: "one power limit for every card ... set once" -- on every rack, not only the first,
    and a card that failed before the policy took over (the racks refuse commands to it) does not stop
    the others from being capped and run at the top clock."""
    plant = build_plant(full_load_scenario(60.0, racks=3))
    dead = plant.n_cards - 1  # the last card of the last rack
    plant.add_fault(CardFailure(card=dead, at_s=plant.time_s))
    plant.run(1.0)
    assert plant.truth().failed[dead]
    policy = make_policy("static-cap", plant.site)
    policy.bind(plant)
    cap = static_cap_w(plant.site)
    lim = np.concatenate([cards_of(r).power_limit_w for r in plant.readings().racks])
    alive = ~plant.truth().failed
    assert alive.sum() == plant.n_cards - 1
    assert np.all(lim[alive] == cap)
    assert np.all(plant.truth().level[alive] == 0)  # otherwise as baseline: top clock


def _one_rack(limits_w: float | None = None) -> Plant:
    """One 16-card rack (limit 12.5 kW), 15 cards computing at the top clock, one idle; noise-free
    sensors: measured = true power. ``limits_w``: every card's limit for 10 s before it is read."""
    site = small_site(1)
    jobs = [
        JobSpec(n, k, 1e7, 1.0, 0.97, checkpoint_interval_s=1e6, noncompute_utilization=0.9)
        for n, k in (("a", 8), ("b", 7))
    ]
    cfg = PlantConfig(seed=1, noise=SensorNoise.none(), placement="external", external_timeout_s=1e6)
    plant = Plant(site, jobs, [], cfg)
    plant.place_job("a", np.arange(8))
    plant.place_job("b", np.arange(8, 15))
    plant.run(90.0)  # past the jobs' start-up
    if limits_w is not None:
        plant.set_power_limits(np.arange(16), limits_w)
        plant.run(10.0)
    return plant


def _measured(plant: Plant) -> tuple[float, np.ndarray]:
    (rr,) = plant.readings().racks
    assert rr.pdu is not None
    return rr.pdu.power_w, np.asarray(cards_of(rr).power_limit_w)


def _acts(policy: ReactivePolicy, plant: Plant) -> bool:
    """Whether the policy bound to ``plant`` (limits as they are) changes a limit at its next act."""
    _p, before = _measured(plant)
    policy.plant = plant  # act on the plant as it is: bind() would put every card back at the top limit
    actions = policy.stats.capping_actions
    policy.act(plant)
    changed = policy.stats.capping_actions != actions
    assert changed == (not np.array_equal(_measured(plant)[1], before))
    return changed


@pytest.mark.parametrize("above_w", [1.0, -1.0])
def test_the_reactive_capper_caps_exactly_above_its_capping_threshold(above_w: float) -> None:
    """The rack's measured power 1 W above ``limit - high_band_w``: capped; 1 W below: held."""
    plant = _one_rack()
    limit = plant.site.rack.power_limit_w
    p, _lim = _measured(plant)
    policy = ReactivePolicy(plant.site, 3.0, high_band_w=limit - (p - above_w))  # threshold p - above_w
    assert _acts(policy, plant) == (above_w > 0)


@pytest.mark.parametrize("below_w", [1.0, -1.0])
def test_the_reactive_capper_uncaps_exactly_below_its_uncapping_threshold(below_w: float) -> None:
    """Every card held at 380 W (the rack far below its limit): with the rack's measured power 1 W below
    ``limit - low_band_w`` the limits are raised; 1 W above: held."""
    plant = _one_rack(limits_w=380.0)
    limit = plant.site.rack.power_limit_w
    p, _lim = _measured(plant)
    policy = ReactivePolicy(plant.site, 3.0, low_band_w=limit - (p + below_w))  # threshold p + below_w
    assert _acts(policy, plant) == (below_w > 0)


def test_a_cut_deeper_than_the_floor_stops_every_busy_card_at_its_lowest_limit() -> None:
    """``min_power_limit_w`` (``--control``) is reactive's floor: a cut the cards cannot give above it
    leaves each busy card at the floor, never below it."""
    plant = _one_rack()
    limit, top = plant.site.rack.power_limit_w, plant.site.card.power_limit_w
    policy = ReactivePolicy(plant.site, 3.0, min_power_limit_w=400.0, target_band_w=limit - 2000.0)
    assert _acts(policy, plant)
    _p, lim = _measured(plant)
    assert np.all(lim[:15] == 400.0) and lim[15] == top  # the idle card keeps its limit


def _decisions(name: str, duration_s: float, **extra: Any) -> tuple[AgentPolicy, list[Decision]]:
    sc = full_load_scenario(duration_s, **extra)
    policy = make_policy(name, sc.site)
    assert isinstance(policy, AgentPolicy)
    heard: list[Decision] = []

    def listen(d: Decision, _report: ApplyReport) -> None:
        heard.append(d)

    policy.decision_listeners.append(listen)
    policy.bind(_plant_for(sc, policy))
    policy.run(duration_s, lambda: None)
    return policy, heard


def test_greedy_plans_with_the_heuristic_never_the_milp_and_racktwin_with_the_milp() -> None:
    """Greedy is "the agent with ``models.heuristic`` plans instead of the MILP": no decision of it comes
    from the solver, however the loop calls its controller."""
    _greedy, decided = _decisions("greedy", 60.0)
    assert decided and {d.source for d in decided} <= {"greedy", "incremental", "hold"}
    assert any(d.source == "greedy" for d in decided)
    _agent, decided = _decisions("racktwin", 30.0)
    assert any(d.source == "milp" for d in decided)


def test_guard_interventions_count_the_decisions_the_guard_changed() -> None:
    """``guard_interventions``: decisions with at least one action in ``Decision.guard_actions``, and
    ``guard_actions`` the times each action was taken (a rack silent from 20 s on: fail-safe caps)."""
    dropout = {"kind": "sensor_dropout", "rack": "r1", "start_s": 20.0}
    policy, decided = _decisions("greedy", 90.0, faults=[dropout])
    changed = [d for d in decided if d.guard_actions]
    assert changed and len(changed) < len(decided)
    assert policy.stats.guard_notes == len(changed)
    taken: dict[str, int] = {}
    for d in changed:
        for action in d.guard_actions:
            taken[action] = taken.get(action, 0) + 1
    assert policy.stats.guard_actions == taken
