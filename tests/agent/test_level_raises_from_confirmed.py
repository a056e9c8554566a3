"""The guard's rate limit on level raises counts from the level a card runs at, its rack's confirmed one
included: the agent never slows a card below the level its rack confirmed unless something asks for it.

What users rely on: the agent changes a card's clock only for a reason (a plan, a cap, a die, a blind
rack), and does not make a card's clock go down and up again by itself. A rack confirms a setting it
applied at once (the retained applied state, ``agent.ingest.Ingest.applied_level``); its telemetry, and
with it the belief's level (``agent.ingest``: a card's level is the one its rack last confirmed when
its reading came), up to one telemetry period later. The commands' diff counts from the confirmed level
(``agent.command_diff``), the guard's step 2 (``max_level_raise_per_period``) counted from the reported
one. Where a card's rack confirmed a level faster than ``reported - max_level_raise_per_period`` since
its last reading (a slow-down applied just before the reading and a raise decided on the reading before
that applied just after it; a raise of another publisher), a decision in that lag (a job event's comes
at once) held the card ``max_level_raise_per_period`` faster than the reported level, slower than it
ran, and the diff sent that slow-down; the decision after the next reading raised it again (r0 below:
level 1 confirmed, 7 read, level 4 sent, then 1 again). Now step 2 counts from the faster of the
reported and the confirmed level (as step 3a keeps a level in force: ``agent.guard_in_force.kept_levels``), and so does
the fail-safe's "no faster than now" for blind cards (``failsafe_lowest_level = false``). Where no
rack confirmed a level (-1; the in-process loop passes none), as reported.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from guard_helpers import proposal, scene, step_context
from test_refusals_during_solve import R0, _applied_state, _Site

from agent import wire
from agent.config import ControlConfig
from agent.guard import Guard
from agent.open_commands import LEVEL
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)
G_SITE, G_SNAP = scene()  # 2 racks of 16 cards: "a" on 0-7, "b" on 8-19 (16-19 in r1), 20-31 idle and awake
N = G_SITE.n_cards
A = list(range(8))
B = list(range(8, 20))
IDLE = list(range(20, 32))
SLOWING = {"cap_jobs_slowed", "cap_idle_to_low_power", "cap_power_limited", "die_jobs_slowed", "die_power_limited"}


def _read_at(level: int) -> StateSnapshot:
    return dataclasses.replace(G_SNAP, card_level=np.full(N, level, dtype=np.int64))


def _confirmed(levels: dict[int, int]) -> npt.NDArray[np.int64]:
    out = np.full(N, -1, dtype=np.int64)
    for card, level in levels.items():
        out[card] = level
    return out


def test_level_raises_are_limited_from_the_faster_of_the_reported_and_the_confirmed_level() -> None:
    # every card reads level 7; r0/r1 confirmed level 1 for "a" and 5 for "b" since, nothing for the idle
    # cards. The plan wants level 0 everywhere, 3 levels up at most per decision
    snap = _read_at(7)
    ctx = step_context(G_SITE, applied_level=_confirmed({**dict.fromkeys(A, 1), **dict.fromkeys(B, 5)}))
    d = Guard(G_SITE, CFG).review(proposal(G_SITE, 0), snap, ctx)
    assert not SLOWING & set(d.guard_actions)  # nothing asks for slower clocks
    assert d.card_level[A].tolist() == [0] * len(A)  # from level 1: 0 is in reach (before: 4, slower than 1)
    assert d.card_level[B].tolist() == [2] * len(B)  # from level 5: 3 up (before: 4, from the 7 read)
    assert d.card_level[IDLE].tolist() == [4] * len(IDLE)  # nothing confirmed: from the 7 read
    assert d.guard_actions.count("level_raise_limited") == 1


def test_without_confirmed_levels_the_raises_count_from_the_reported_ones() -> None:
    """The in-process loop passes no applied state (None): the same decision as before."""
    snap = _read_at(7)
    d = Guard(G_SITE, CFG).review(proposal(G_SITE, 0), snap, step_context(G_SITE))
    assert d.card_level.tolist() == [4] * N


def test_blind_cards_stay_at_the_faster_level_their_rack_confirmed_not_the_one_last_read() -> None:
    """r1 is blind and ``failsafe_lowest_level`` is off: its cards and the jobs on them may go no faster
    than now. Its cards last read level 7; r1 confirmed level 2 for all of them since (applied before its
    telemetry stopped showing it): they run at level 2, and stay there (before: slowed to 7 on a reading
    older than the confirmation, "b" with them)."""
    blind = (1,)
    snap = _read_at(7)
    ctx = step_context(
        G_SITE,
        applied_level=np.full(N, 2, dtype=np.int64),
        stale_racks=blind,
        blind_racks=blind,
        failsafe_racks=blind,
    )
    cfg = dataclasses.replace(CFG, failsafe_lowest_level=False)
    d = Guard(G_SITE, cfg).review(proposal(G_SITE, 0), snap, ctx)
    r1 = G_SITE.card_rack() == 1
    assert d.card_level[r1].tolist() == [2] * int(r1.sum())  # no faster than they run, and no slower
    assert d.card_level[B].tolist() == [2] * len(B)  # "b" touches r1: its r0 cards follow
    assert d.card_level[A].tolist() == [0] * len(A)  # r0 is seen: from level 2, 0 is in reach


async def test_the_service_sends_no_slow_down_below_a_level_its_rack_confirmed_after_the_last_reading(
    tmp_path: Path,
) -> None:
    """r0's job computes; the first decision raises its cards to level 1 (read at 0: the plant's). A
    slow-down to level 7 reaches r0 first (r0 confirms it), r0's next reading shows 7, and then r0
    applies the raise to 1 and confirms it. The next decision (before r0's next reading), whose plan
    still wants level 1, sends r0 no level command (before: level 4, 3 up from the 7 read; the decision
    after the next reading raised the cards to 1 again)."""
    site = _Site(tmp_path, max_level_raise_per_period=3)
    try:
        site.run_to(300.0)  # past the job's start-up: it computes
        first, sent = await site.decide()
        assert first.card_level[R0].tolist() == [1] * len(R0)
        (raise_r0,) = [oc for oc in sent if oc.kind == LEVEL and oc.target == "r0"]
        no_low_power = np.zeros(len(R0), dtype=bool)
        site.plant.set_levels(R0, 7)
        site.svc.ingest.handle(_applied_state("r0", np.full(len(R0), 7), no_low_power))
        site.run_to(310.0)
        assert site.svc.state.snapshot().card_level[R0].tolist() == [7] * len(R0)  # read at 7
        site.plant.set_levels(R0, 1)  # the raise applied and confirmed, not read yet
        site.svc.ingest.handle(_applied_state("r0", np.full(len(R0), 1), no_low_power))
        ack = wire.Acknowledgement("r0", uuid.UUID(raise_r0.command_id), wire.AckResult.APPLIED, 310.5, 0, "sim", None)
        site.svc.outcomes.on_ack(ack)

        decision, sent = await site.decide()
        assert not SLOWING & set(decision.guard_actions)  # nothing asks for slower clocks
        assert decision.card_level[R0].tolist() == [1] * len(R0)
        assert not [oc for oc in sent if oc.kind == LEVEL and oc.target == "r0"]
    finally:
        await site.svc._close()
