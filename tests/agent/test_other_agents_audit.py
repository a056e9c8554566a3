"""Audit of the rule by which an agent shares its site with other agents (``agent.other_agents``;
docs/agent.md, "Another agent on the site"): the 12 s a retained "online" holds an agent back and
the 35 s of silence after which another agent is gone, which agent it stands by for when several
outrank it, what a status without a mode, a retained "offline" or a command stamped ahead of its
arrival mean, and how a run names itself. Each test kills mutants of ``agent.other_agents`` the tests
in test_other_agents.py and test_standby.py let live."""

from __future__ import annotations

import os
import time

import pytest
from test_other_agents import ME, other, status

from agent import wire
from agent.other_agents import MAX_PEERS, AgentInstance, OtherAgents

pytestmark = pytest.mark.agent


def test_a_retained_online_holds_this_agent_back_12_s_at_most() -> None:
    """At most 12 s: unconfirmed at 11.5 s after it was first seen, stale at 12.5 s."""
    older = other(ME.started_ms - 60_000)
    watch = OtherAgents(ME)
    watch.on_status(status(older, seq=4), retained=True, now_wall=100.0)
    assert watch.blocker(111.5) == (watch.peers[older.publisher], False)
    assert watch.blocker(112.5) is None


def test_another_agent_is_gone_after_35_s_without_a_sign_of_life() -> None:
    """Gone after 35 s without a sign of life: still commanding 34.5 s after its last status, gone at 35.5 s."""
    older = other(ME.started_ms - 1000)
    watch = OtherAgents(ME)
    watch.on_status(status(older, seq=1), retained=False, now_wall=100.0)
    assert watch.blocker(134.5) == (watch.peers[older.publisher], True)
    assert watch.blocker(135.5) is None


def test_of_several_agents_that_started_earlier_it_stands_by_for_the_first() -> None:
    """Three agents in enforce mode: the one that started first commands, and the two later ones both
    name it as the agent they stand by for (the status, the log and /readyz say whom), whatever the
    order they were heard in; on the same start the smaller id is first."""
    first = other(ME.started_ms - 2000, instance_id="cccccccccccc", pid=97)
    second = other(ME.started_ms - 1000, instance_id="bbbbbbbbbbbb", pid=98)
    for order in ((first, second), (second, first)):
        watch = OtherAgents(ME)
        for peer in order:
            watch.on_status(status(peer, seq=1), retained=False, now_wall=0.0)
        assert watch.blocker(1.0) == (watch.peers[first.publisher], True)
    twin_a = other(ME.started_ms - 500, instance_id="000000000001", pid=95)
    twin_b = other(ME.started_ms - 500, instance_id="000000000000", pid=96)
    watch = OtherAgents(ME)
    for peer in (twin_a, twin_b):
        watch.on_status(status(peer, seq=1), retained=False, now_wall=0.0)
    assert watch.blocker(1.0) == (watch.peers[twin_b.publisher], True)


def test_a_publisher_of_commands_that_names_no_agent_is_the_one_stood_by_for() -> None:
    """A script (or an agent from before instance ids) commanding the site "always wins": with an
    agent that started earlier alive too, the one this agent leaves the site to is the script (the
    earlier agent stands by for it as well)."""
    older = other(ME.started_ms - 1000)
    watch = OtherAgents(ME)
    watch.on_status(status(older, seq=1), retained=False, now_wall=0.0)
    watch.on_command("agent", now_wall=0.5)
    assert watch.blocker(1.0) == (watch.peers["agent"], True)


def test_an_agent_alive_comes_before_a_retained_status_not_confirmed() -> None:
    """An agent that started earlier and is alive makes this one stand by, even while a retained
    "online" of an even earlier run waits for its sign of life: that one holds it back 12 s at most,
    the live one for as long as it lives (this agent must not command at 12 s)."""
    stale = other(ME.started_ms - 60_000, host="host-c", instance_id="cccccccccccc")
    alive = other(ME.started_ms - 1000)
    watch = OtherAgents(ME)
    watch.on_status(status(stale, seq=9), retained=True, now_wall=0.0)
    watch.on_status(status(alive, seq=1), retained=False, now_wall=0.0)
    assert watch.blocker(1.0) == (watch.peers[alive.publisher], True)
    watch.on_status(status(alive, seq=2), retained=False, now_wall=10.0)
    assert watch.blocker(13.0) == (watch.peers[alive.publisher], True)


def test_a_retained_offline_status_holds_nothing_back() -> None:
    """The retained status of an agent that stopped (its clean stop or its will) says ``offline``:
    nothing to wait for."""
    older = other(ME.started_ms - 1000)
    watch = OtherAgents(ME)
    assert watch.on_status(status(older, "offline", seq=3), retained=True, now_wall=0.0) is None
    assert watch.blocker(0.5) is None and watch.unconfirmed(0.5) == [] and watch.competing(0.5) == []


def test_an_earlier_run_with_this_processs_pid_is_not_waited_for() -> None:
    """A restarted container runs the agent under the same pid as its run before (pid 1 again): a
    retained "online" of that run (its will never published) names this process's pid, which is
    alive, and is stale all the same."""
    me = AgentInstance(ME.host, os.getpid(), ME.started_ms, ME.instance_id)
    earlier = AgentInstance(ME.host, os.getpid(), ME.started_ms - 5_000, "cccccccccccc")
    watch = OtherAgents(me)
    watch.on_status(status(earlier, seq=2), retained=True, now_wall=0.0)
    assert watch.blocker(0.0) is None and watch.unconfirmed(0.0) == []


def test_a_status_without_a_mode_counts_for_nobody_until_its_agent_commands() -> None:
    """A peer's mode is "enforce" or "advisory" as its status says, and "enforce" once it was seen
    commanding: a status that names no mode neither makes this agent stand by nor undoes a command
    seen from the same agent."""
    older = other(ME.started_ms - 1000)
    watch = OtherAgents(ME)
    watch.on_status(wire.AgentStatus(wire.AgentState.ONLINE, "1", 1.0, 1, older.publisher), False, 0.0)
    assert watch.blocker(0.5) is None and watch.competing(0.5) == []
    watch.on_command(older.publisher, now_wall=1.0)  # seen commanding: enforce mode
    assert watch.blocker(1.0) == (watch.peers[older.publisher], True)
    watch.on_status(wire.AgentStatus(wire.AgentState.ONLINE, "1", 1.0, 2, older.publisher), False, 2.0)
    assert watch.blocker(2.0) == (watch.peers[older.publisher], True)


def test_a_command_stamped_ahead_of_its_arrival_is_a_sign_of_life_as_of_its_arrival() -> None:
    """A command stamped 100 s ahead (a sender's clock ahead of this agent's) is a sign of life no later
    than when it arrived: its publisher is gone 35 s after that, not 135 s."""
    watch = OtherAgents(ME)
    watch.on_command("agent", now_wall=0.0, age_s=-100.0)
    assert watch.blocker(34.0) is not None
    assert watch.blocker(36.0) is None


def test_a_publisher_names_an_instance_only_in_the_documented_form() -> None:
    """``agent@<host>:<pid>:<start, Unix ms>:<random id>`` and nothing around it: a publisher with
    more (or less) is not an agent instance (it cannot be asked to stand by: it always wins)."""
    assert AgentInstance.parse(ME.publisher) == ME
    assert AgentInstance.parse(ME.publisher + "0") is None
    assert AgentInstance.parse(ME.publisher + ":x") is None
    assert AgentInstance.parse("x" + ME.publisher) is None
    assert AgentInstance.parse(ME.publisher[:-1]) is None


def test_a_run_started_now_is_outranked_by_one_started_a_second_ago() -> None:
    """A run names its start in Unix milliseconds: an agent whose publisher says it started a second
    before this run's start commands, and this run stands by."""
    earlier = other(int(time.time() * 1000) - 1000)
    me = AgentInstance.current()
    watch = OtherAgents(me)
    watch.on_status(status(earlier, seq=1), retained=False, now_wall=0.0)
    assert watch.blocker(0.5) == (watch.peers[earlier.publisher], True)
    later = other(me.started_ms + 1000)
    assert (later.started_ms - me.started_ms) == 1000
    theirs = OtherAgents(later)
    theirs.on_status(status(me, seq=1), retained=False, now_wall=0.0)
    assert theirs.blocker(0.5) is not None


def test_one_publisher_more_than_kept_drops_the_least_recently_heard() -> None:
    """At most MAX_PEERS publishers are kept: one more, and the one heard least recently goes."""
    watch = OtherAgents(ME)
    for i in range(MAX_PEERS + 1):
        watch.on_command(f"script-{i}", now_wall=float(i))
    watch.forget(before_wall=-1.0)
    assert len(watch.peers) == MAX_PEERS and "script-0" not in watch.peers
