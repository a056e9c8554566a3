"""A placement in flight (sent, its job not yet seen started) holds its cards busy through the whole
decision, the guard included: they are neither put to low-power idle nor their hosts powered off
until readings newer than the order's time to live show its job still queued (lost, or refused: the
agent does not release a refused order earlier) or its job is seen started or finished.

Seen in every late-agent run (tests/integration/test_late_agent_jobs.py): the agent placed job
``later`` on a job event; the periodic decision 0.7 s later, on readings that still showed ``later``
queued and its cards asleep, proposed them awake and busy, but the guard counted only the decision's
own placements, took the cards for idle ones and, their low-power state having changed within
``low_power_hold_s``, sent them back to low-power idle: the rack refused (``card 16 is busy with job
later``). With the agent started first the periodic decision fell on the submission and placed the
job itself, so no decision came between the order and the job's start.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import belief, job
from site_testing import write_capped_small_site

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision, PlacementOrder
from twin.readings import JobEvent
from twin.spec import load_site
from twin.state import StateSnapshot
from twin.workload import Phase

pytestmark = pytest.mark.agent


def at(snap: StateSnapshot, t: float, low_power: np.ndarray) -> StateSnapshot:
    """``snap`` with every reading moved to site time ``t`` and the cards' low-power state ``low_power``."""
    dt = t - snap.time_s
    return dataclasses.replace(
        snap,
        time_s=t,
        card_last_seen_s=snap.card_last_seen_s + dt,
        card_prev_seen_s=snap.card_prev_seen_s + dt,
        rack_last_seen_s=snap.rack_last_seen_s + dt,
        card_low_power=np.asarray(low_power, dtype=bool).copy(),
    )


class Scene:
    """The late-agent test's site (2 racks of 16 cards, 2 hosts of 8 cards per rack; hosts idle for
    20 s go off, none kept in reserve) running job ``a`` on 8 cards; the agent put the 24 idle cards to
    sleep at t = 1,000 (telemetry shows them asleep from 1,005); ``q`` (8 cards) is submitted at 1,025
    and placed at once (an event decision); the periodic decision follows at 1,025.7 on the same
    readings (q still queued, its cards asleep, its host idle for 25.7 s)."""

    def __init__(self, folder: Path) -> None:
        site = load_site(write_capped_small_site(folder, 12_500.0))
        self.site = site
        _plant, state = belief(site, [job("a", 8)], 60)
        before = state.snapshot()
        state.apply_events([JobEvent(time_s=60.0, job_id="q", kind="submitted", phase=Phase.WAITING, job=job("q", 8))])
        after = state.snapshot()
        cfg = ControlConfig(
            period_s=5.0, command_ttl_s=30.0, idle_reserve_cards=0, host_off_after_s=20.0, host_reserve_per_supernode=0
        )
        self.ctl = Controller(site, cfg)
        awake = np.zeros(site.n_cards, dtype=bool)
        d0 = self.ctl.step(at(before, 1000.0, awake), 1000.0)
        self.asleep = np.asarray(d0.card_low_power, dtype=bool)
        assert int(self.asleep.sum()) == 24  # every idle card sleeps
        self.before_q = self.ctl.step(at(before, 1005.0, self.asleep), 1005.0)  # telemetry shows them asleep
        self.queued = at(after, 1025.0, self.asleep)
        self.placing = self.ctl.step(self.queued, 1025.0, incremental=True)
        (order,) = self.placing.placements
        assert order.job_id == "q" and self.asleep[list(order.cards)].all()
        self.q_cards = list(order.cards)

    def periodic(self, now_s: float = 1025.7) -> Decision:
        return self.ctl.step(self.queued, now_s)


def test_the_periodic_decision_after_a_placement_keeps_its_cards_awake_and_busy(tmp_path: Path) -> None:
    scene = Scene(tmp_path)
    assert not scene.placing.card_low_power[scene.q_cards].any()  # the event decision wakes them
    d = scene.periodic()
    assert d.placements == ()  # not placed twice
    # was: low-power idle on all 8 (the guard's low-power hold: they read asleep, changed 20.7 s ago)
    assert not d.card_low_power[scene.q_cards].any()
    assert d.card_busy[scene.q_cards].all() and int(d.card_busy.sum()) == 16
    assert "q" in d.job_levels  # was: missing, the guard budgeted q's cards asleep
    assert d.host_off is not None and not d.host_off[np.unique(scene.site.card_host()[scene.q_cards])].any()
    assert d.host_off.any()  # (hosts do go off here: the other idle host of q's rack)


def test_the_guard_budgets_the_cards_of_a_placement_in_flight_as_computing(tmp_path: Path) -> None:
    scene = Scene(tmp_path)
    d = scene.periodic()
    r = int(scene.site.card_rack()[scene.q_cards[0]])
    # by hand (examples/supernode-512.toml): at the slowest level (1210 MHz, 0.851 V) a computing card
    # draws ~84.5 + 569 x 0.611 x 0.851^2 x 0.95 ~ 320 W, a sleeping one ~53 W: q's 8 cards add well
    # over 8 x 150 W to their rack's budget (was: nothing, the guard budgeted them asleep)
    assert d.budget_rack_power_w[r] >= scene.before_q.budget_rack_power_w[r] + 8 * 150.0


def test_the_cards_of_a_placement_in_flight_sleep_again_once_its_order_expires_unstarted(tmp_path: Path) -> None:
    scene = Scene(tmp_path)
    # readings from after the order's time to live (30 s) still show q queued: the order was lost; q
    # is placed again, on cards the decision chooses, and no card is held busy by the lost order
    late = at(scene.queued, 1056.0, scene.asleep)
    d = scene.ctl.step(late, 1056.0)
    assert [o.job_id for o in d.placements] == ["q"]
    assert int(d.card_busy.sum()) == 16


def test_the_guard_drops_an_order_for_the_cards_of_another_jobs_placement_in_flight(tmp_path: Path) -> None:
    scene = Scene(tmp_path)
    ctl, snap = scene.ctl, scene.queued
    snap2 = dataclasses.replace(snap, queue=(*snap.queue, dataclasses.replace(snap.queue[0], job_id="r")))
    ctx = ctl.context(snap2, 1025.7)
    proposal = ctl.propose(snap2, ctx, use_solver=False)
    clash = proposal.replace(placements=(PlacementOrder("r", tuple(scene.q_cards)),))
    reviewed = ctl.guard.review(clash, snap2, ctx, in_flight=[("q", tuple(scene.q_cards))])
    assert reviewed.placements == ()
    assert reviewed.queue_waits["r"].kind == "placement_dropped"
