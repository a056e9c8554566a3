"""Mutation audit of ``agent.loop``: the in-process loop's cadence (a decision at the start and every
``period_s`` of plant time; on job events at once, at most every ``min_replan_interval_s``, and only
when such an event came), when telemetry is read (``TelemetryRounds``), and what
``apply_to_plant`` does with failed cards and refused commands. Expectations from the module
docstring and docs/agent.md ("Using the controller in process"), on 2 racks of 16 cards.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from agent_helpers import job, small_site

from agent.config import ControlConfig
from agent.controller import Controller, decides_again_on
from agent.decision import Decision, PlacementOrder
from agent.loop import ApplyReport, ClosedLoop, TelemetryRounds, apply_to_plant
from twin.faults import CardFailure
from twin.plant import Plant, PlantConfig

pytestmark = pytest.mark.agent


def trace(loop: ClosedLoop) -> list[tuple[str, float, Any]]:
    """What the loop does, in order: ("events", t, job events that ask for a decision) as the loop
    drains them, ("decision", t, incremental) as it decides."""
    log: list[tuple[str, float, Any]] = []
    plant = loop.plant
    drain = plant.drain_events
    placing = loop.controller.control.control_placement

    def drained() -> Any:
        events = drain()
        asking = [e for e in events if decides_again_on(e, placing)]
        if asking:
            log.append(("events", plant.time_s, asking))
        return events

    plant.drain_events = drained  # type: ignore[method-assign]  # test double
    loop.on_decision = lambda d, r: log.append(("decision", plant.time_s, d.source == "incremental"))
    return log


def decision_times(log: list[tuple[str, float, Any]], *, incremental: bool | None = None) -> list[float]:
    return [t for kind, t, inc in log if kind == "decision" and (incremental is None or inc == incremental)]


def test_a_decision_at_the_start_and_every_period_of_plant_time() -> None:
    """ "a decision every ``period_s`` of plant time": the first at once (t = 0), then 15, 30, 45 in a
    minute at a 15 s period, whatever the jobs do when job events are not asked to trigger any."""
    site = small_site()
    plant = Plant(site, [job("a", 16), job("b", 8, submit_s=20.0)], config=PlantConfig(seed=2))
    loop = ClosedLoop(
        plant, Controller(site, ControlConfig(period_s=15.0)), estimator=False, replan_on_job_events=False
    )
    log = trace(loop)
    loop.run(60.0)
    assert decision_times(log) == [0.0, 15.0, 30.0, 45.0], log
    assert loop.decisions == 4


def test_job_events_ask_for_a_decision_at_once_at_most_every_min_replan_interval() -> None:
    """A job submitted between periods (the loop places jobs) is decided on at once, incrementally;
    decisions on events keep ``min_replan_interval_s`` from the last decision; every incremental
    decision follows an event that asked for one after the last decision (none without)."""
    site = small_site()
    jobs = [job("a", 16), job("b", 8, submit_s=7.0), job("c", 4, submit_s=15.0), job("d", 4, submit_s=31.0)]
    plant = Plant(site, jobs, config=PlantConfig(seed=2))
    cfg = ControlConfig(period_s=15.0, min_replan_interval_s=3.0)
    loop = ClosedLoop(plant, Controller(site, cfg), estimator=False)
    log = trace(loop)
    loop.run(60.0)
    assert decision_times(log, incremental=False) == [0.0, 15.0, 30.0, 45.0], log
    incremental = decision_times(log, incremental=True)
    assert 7.0 in incremental, log  # at once: the submission at 7 s is 7 s past the last decision
    assert 33.0 in incremental and 31.0 not in incremental, log  # 3 s after the decision at 30 s
    times = decision_times(log)
    assert all(b - a >= 3.0 for a, b in itertools.pairwise(times) if b in incremental), times
    asked = False
    for kind, _t, inc in log:
        if kind == "events":
            asked = True
        elif kind == "decision":
            assert asked or not inc, log
            asked = False


def test_job_events_decide_nothing_when_not_asked_to() -> None:
    site = small_site()
    plant = Plant(site, [job("a", 16), job("b", 8, submit_s=7.0)], config=PlantConfig(seed=2))
    cfg = ControlConfig(period_s=15.0, replan_on_job_events=False)
    loop = ClosedLoop(plant, Controller(site, cfg), estimator=False)
    log = trace(loop)
    loop.run(30.0)
    assert any(kind == "events" for kind, _, _ in log), log
    assert decision_times(log) == [0.0, 15.0], log


def test_telemetry_rounds_are_read_at_the_start_and_every_period_after() -> None:
    """``TelemetryRounds``: at ``start_s`` and every ``telemetry_period_s`` after (on the step that
    reaches it, never twice for one round), or at every step when the period is at most a step."""
    rounds = TelemetryRounds(100.0, 5.0)
    assert [t for t in range(100, 121) if rounds.due(float(t))] == [100, 105, 110, 115, 120]
    late = TelemetryRounds(0.0, 5.0)
    assert late.due(0.0)
    assert late.due(12.0)  # the rounds of 5 and 10 s fall in one long step: read once
    assert not late.due(13.0) and not late.due(14.0) and late.due(15.0)
    every = TelemetryRounds(0.0, 1.0)
    assert all(every.due(float(t)) for t in range(5))
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="telemetry_period_s"):
            TelemetryRounds(0.0, bad)


def _first_decision(plant: Plant) -> Decision:
    site = plant.site
    loop = ClosedLoop(plant, Controller(site, ControlConfig(period_s=15.0)), estimator=False)
    loop.run(2.0)
    assert loop.last_decision is not None
    return loop.last_decision


def test_apply_leaves_a_failed_card_alone_even_when_the_decision_does_not_know_it() -> None:
    """ "Cards that failed are left alone": a card that failed after the decision was made is not
    commanded (no refusal either), every other card gets its power limit."""
    site = small_site()
    plant = Plant(site, [job("a", 16)], faults=[CardFailure(card=20, at_s=3.0)], config=PlantConfig(seed=2))
    decision = _first_decision(plant).replace(placements=())  # job a was placed by it already
    assert not decision.card_failed[20]
    plant.step(2.0)
    assert plant.truth().failed[20]
    rep = apply_to_plant(decision, plant)
    assert rep.power_limits == site.n_cards - 1
    assert rep.refused == [], rep.refused


def test_apply_reports_a_refused_command_and_goes_on() -> None:
    """ "a command the plant refuses (... a job no longer queued) is reported, not raised": placing a
    job the plant does not have queued is a refusal in the report; the other commands are applied."""
    site = small_site()
    plant = Plant(site, [job("a", 16)], config=PlantConfig(seed=2))
    decision = _first_decision(plant).replace(placements=(PlacementOrder("no-such-job", (30, 31)),))
    rep = apply_to_plant(decision, plant)
    assert isinstance(rep, ApplyReport)
    assert len(rep.refused) == 1 and rep.refused[0].startswith("place_job no-such-job: "), rep.refused
    assert rep.placed == []
    assert rep.power_limits == site.n_cards
    assert np.all(plant.truth().failed == False)  # noqa: E712
