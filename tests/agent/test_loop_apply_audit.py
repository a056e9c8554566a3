"""Mutation audit of ``agent.loop`` where the evaluation's numbers depend on it: the loop ends a run
at its exact length (a last step shorter than a second), and ``apply_to_plant`` sends to low-power
idle only the cards no job holds (a busy card in a sleep order would have the plant refuse the whole
command, leaving every idle card awake) and renews only the pumps it slows.
"""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import job, small_site

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.loop import ClosedLoop, apply_to_plant
from twin.plant import Plant, PlantConfig

pytestmark = pytest.mark.agent


def _loop(plant: Plant) -> ClosedLoop:
    return ClosedLoop(plant, Controller(plant.site, ControlConfig(period_s=15.0)), estimator=False)


def _first_decision(plant: Plant) -> Decision:
    loop = _loop(plant)
    loop.run(2.0)
    assert loop.last_decision is not None
    return loop.last_decision


def test_a_run_ends_at_its_length_with_a_last_step_shorter_than_a_second() -> None:
    plant = Plant(small_site(), [job("a", 8)], config=PlantConfig(seed=2))
    loop = _loop(plant)
    steps: list[float] = []
    loop.on_step = lambda p: steps.append(p.time_s)
    loop.run(2.5)
    assert plant.time_s == 2.5 and steps == [1.0, 2.0, 2.5]
    loop.run(1.25)
    assert plant.time_s == 3.75


def test_a_sleep_order_reaching_busy_cards_sends_only_the_free_ones_to_low_power() -> None:
    site = small_site()
    plant = Plant(site, [job("a", 8)], config=PlantConfig(seed=2))
    decision = _first_decision(plant)
    free = np.zeros(site.n_cards, dtype=bool)
    free[plant.free_cards()] = True
    awake = free & ~plant.truth().low_power
    assert 0 < free.sum() < site.n_cards and awake.any()
    all_asleep = decision.replace(placements=(), card_low_power=np.ones(site.n_cards, dtype=bool))
    rep = apply_to_plant(all_asleep, plant)
    assert rep.refused == [] and rep.slept == int(awake.sum())
    assert (plant.truth().low_power == free).all()


def test_pumps_at_full_speed_are_not_set_again() -> None:
    site = small_site()
    plant = Plant(site, [job("a", 8)], config=PlantConfig(seed=2))
    decision = _first_decision(plant)
    full = decision.replace(placements=(), rack_pump_speed_frac=np.ones(site.n_racks))
    apply_to_plant(full, plant)  # the first decision slowed them: back to full speed
    assert (plant.truth().rack_pump_speed_frac == 1.0).all()
    assert apply_to_plant(full, plant).pumps == 0
    rep = apply_to_plant(decision.replace(placements=(), rack_pump_speed_frac=np.array([1.0, 0.6])), plant)
    assert rep.pumps == 1 and plant.truth().rack_pump_speed_frac.tolist() == [1.0, 0.6]
