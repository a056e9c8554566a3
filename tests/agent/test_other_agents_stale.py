"""Old copies of another agent's commands (stamped more than 35 s ago: a persistent session's backlog)
and the 12 s wait a retained "online" status of that agent starts (docs/agent.md, "Another agent on the
site": "Restarts are not held back"). Such a copy is a sign of life as of its stamp, so it says nothing
of whether the agent is alive now: it neither confirms the retained status nor ends the wait early.
``agent.other_agents.OtherAgents`` with explicit wall times."""

from __future__ import annotations

import pytest

from agent import wire
from agent.other_agents import AgentInstance, OtherAgents

pytestmark = pytest.mark.agent

ME = AgentInstance("host-a", 4242, 1_800_000_000_000, "aaaaaaaaaaaa")
OLDER = AgentInstance("host-b", 99, ME.started_ms - 60_000, "bbbbbbbbbbbb")  # outranks ME: started first


def retained_online(seq: int = 7) -> wire.AgentStatus:
    return wire.AgentStatus(wire.AgentState.ONLINE, "1", 1.0, seq, OLDER.publisher, mode="enforce", detail="")


def waiting(watch: OtherAgents, now_wall: float) -> bool:
    """This agent holds its commands back waiting for a sign of life (the retained status unconfirmed)."""
    return watch.blocker(now_wall) == (watch.peers[OLDER.publisher], False)


def test_an_old_command_copy_after_the_retained_status_does_not_end_the_wait() -> None:
    watch = OtherAgents(ME)
    watch.on_status(retained_online(), retained=True, now_wall=100.0)
    assert waiting(watch, 100.0)
    watch.on_command(OLDER.publisher, now_wall=101.0, age_s=40.0)  # sent 39 s before the status arrived
    # 12 s from the retained status: still waiting, neither confirmed nor given up
    assert waiting(watch, 101.0)
    assert waiting(watch, 111.9)
    assert watch.blocker(112.1) is None  # no sign of life within 12 s: stale, this agent commands
    assert not watch.competing(112.1)


def test_an_old_command_copy_before_the_retained_status_does_not_confirm_it() -> None:
    """A resumed persistent session delivers its backlog before the subscriptions' retained copies."""
    watch = OtherAgents(ME)
    watch.on_command(OLDER.publisher, now_wall=100.0, age_s=50.0)
    assert watch.blocker(100.0) is None  # an old command alone holds nothing back
    watch.on_status(retained_online(), retained=True, now_wall=100.2)
    assert not watch.competing(100.5)  # not alive now: the retained copy is no sign of life
    assert waiting(watch, 100.5)
    assert waiting(watch, 111.9)
    assert watch.blocker(112.5) is None  # 12 s without a sign of life (it used to stand by for 35 s)


def test_a_sign_of_life_during_the_wait_still_confirms_it() -> None:
    watch = OtherAgents(ME)
    watch.on_status(retained_online(), retained=True, now_wall=100.0)
    watch.on_command(OLDER.publisher, now_wall=101.0, age_s=40.0)  # an old copy
    watch.on_command(OLDER.publisher, now_wall=105.0, age_s=0.2)  # a live command: it commands now
    assert watch.blocker(105.0) == (watch.peers[OLDER.publisher], True)
    assert watch.blocker(139.0) == (watch.peers[OLDER.publisher], True)  # alive until 35 s after its stamp
    assert watch.blocker(140.0) is None
    # a live status confirms it too
    watch2 = OtherAgents(ME)
    watch2.on_status(retained_online(), retained=True, now_wall=100.0)
    watch2.on_command(OLDER.publisher, now_wall=101.0, age_s=40.0)
    watch2.on_status(retained_online(seq=8), retained=False, now_wall=103.0)
    assert watch2.blocker(103.0) == (watch2.peers[OLDER.publisher], True)


def test_a_command_stamped_within_35_s_confirms_it_until_35_s_after_its_stamp_then_the_wait_resumes() -> None:
    """A copy stamped 30 s ago proves the agent alive 30 s ago: it commands for 5 s more, and this agent
    then waits out the rest of the 12 s rather than commanding at once."""
    watch = OtherAgents(ME)
    watch.on_status(retained_online(), retained=True, now_wall=100.0)
    watch.on_command(OLDER.publisher, now_wall=100.0, age_s=30.0)
    assert watch.blocker(104.0) == (watch.peers[OLDER.publisher], True)
    assert waiting(watch, 106.0)
    assert watch.blocker(112.5) is None
