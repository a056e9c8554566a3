"""Mutation audit of ``agent.loop`` (second round): the decision a checkpoint's end calls for.

With ``checkpoint_end_lead_s`` the in-process loop decides at once (the incremental adjustment) when
a job's checkpoint comes within the lead of its declared end (the module docstring; docs/agent.md,
``control.checkpoint_end_lead_s``): one decision for that end, not one every ``min_replan_interval_s``
until the checkpoint is over. On 2 racks of 16 cards, one job of 16 cards that checkpoints for 45 s
every 60 s of compute (no stalls: those have no declared end).
"""

from __future__ import annotations

import pytest
from agent_helpers import job, small_site

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.loop import ApplyReport, ClosedLoop
from twin.plant import Plant, PlantConfig
from twin.workload import Phase, PhaseModel

pytestmark = pytest.mark.agent


def test_a_checkpoints_end_gets_one_decision_at_its_lead_not_one_every_min_replan_interval() -> None:
    """Period 60 s, lead 3 s, ``min_replan_interval_s`` 1 s, no decisions on job events: besides the
    periodic decisions the loop decides once per checkpoint, 42 s into it (its declared 45 s less the
    3 s lead), and not again at 43 and 44 s (the checkpoint's end is still near then, but the decision
    for it was made: the loop's wake time moves past it). 400 s hold three checkpoints' ends (the 60 s
    between checkpoints are training seconds at the top clock, ``JobSpec.checkpoint_interval_s``: at the
    plan's lower clocks they take longer in plant time, 95% of a step scaling with 1/clock)."""
    site = small_site()
    no_stalls = PhaseModel(comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)
    plant = Plant(
        site,
        [job("c", 16, checkpoint_interval_s=60.0, checkpoint_duration_s=45.0)],
        config=PlantConfig(seed=5, phases=no_stalls),
    )
    control = ControlConfig(period_s=60.0, checkpoint_end_lead_s=3.0, min_replan_interval_s=1.0)
    # (plant time, the job's phase, seconds since its phase began) at each incremental decision
    woken: list[tuple[float, Phase, float]] = []
    loop: ClosedLoop

    def note(decision: Decision, _report: ApplyReport) -> None:
        if decision.source == "incremental":
            (info,) = loop.state.snapshot().jobs
            woken.append((decision.time_s, info.phase, decision.time_s - info.last_event_s))

    loop = ClosedLoop(plant, Controller(site, control), estimator=False, replan_on_job_events=False, on_decision=note)
    loop.run(400.0)
    # Exactly 3. At most: training runs no faster than at the top clock, so a checkpoint cycle takes at
    # least 60 s of training + 45 s of checkpoint = 105 s, and even a job training from 0 s would come
    # within the lead of its 4th checkpoint's end at 60 + 3 * 105 + 42 = 417 s > 400 s (one decision per
    # checkpoint: the next assertion has each 42 s into one). At least: the job starts at the decision at
    # 60 s (the one at 0 s is made before the loop has read it), and its 3rd checkpoint's decision comes at
    # 60 + 3 * T + 2 * 45 + 42 <= 400 s while its 60 s of training take T <= 69.3 s of plant time (a step
    # time at most 1.155 times the top clock's: clocks of at least 86% of the top on a rack far under its cap).
    assert len(woken) == 3, woken
    assert all(phase == Phase.CHECKPOINT and into_s == 42.0 for _, phase, into_s in woken), woken
    periodic = loop.decisions - len(woken)
    assert periodic == 7  # at 0, 60, ..., 360
