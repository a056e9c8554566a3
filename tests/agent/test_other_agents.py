"""The rule by which an agent leaves a site to another (``agent.other_agents.OtherAgents``), on statuses and
commands as the broker delivers them. The service around it is tested over mosquitto in
tests/integration/test_agent_service.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent import wire
from agent.other_agents import MAX_PEERS, AgentInstance, OtherAgents

pytestmark = pytest.mark.agent

ME = AgentInstance("host-a", 4242, 1_800_000_000_000, "aaaaaaaaaaaa")


def status(who: AgentInstance | str, state: str = "online", *, mode: str = "enforce", seq: int = 0) -> wire.AgentStatus:
    publisher = who if isinstance(who, str) else who.publisher
    return wire.AgentStatus(wire.AgentState(state), "1", 1.0, seq, publisher, mode=mode, detail="")


def other(started_ms: int, host: str = "host-b", pid: int = 99, instance_id: str = "bbbbbbbbbbbb") -> AgentInstance:
    return AgentInstance(host, pid, started_ms, instance_id)


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(proc.stdout)


def test_an_instance_is_named_by_its_publisher_and_read_back() -> None:
    me = AgentInstance.current()
    assert AgentInstance.parse(me.publisher) == me
    assert wire.Sequencer(me.publisher).publisher == me.publisher  # a publisher id the wire accepts
    assert AgentInstance.parse("agent") is None and AgentInstance.parse("sim") is None
    assert "started 2027-01-15T08:00:00Z" in ME.describe() and "host host-a" in ME.describe()


def test_the_agent_that_started_first_commands_and_both_sides_agree() -> None:
    older, newer = other(ME.started_ms - 1), other(ME.started_ms + 1)
    for peer, blocked in ((older, True), (newer, False)):
        watch = OtherAgents(ME)
        assert watch.on_status(status(peer), retained=False, now_wall=0.0) is not None
        found = watch.blocker(0.5)
        assert (found is not None) is blocked
        assert len(watch.competing(0.5)) == 1  # either way the other agent is counted
        # and the other agent, seeing this one, decides the opposite
        theirs = OtherAgents(peer)
        theirs.on_status(status(ME), retained=False, now_wall=0.0)
        assert (theirs.blocker(0.5) is not None) is not blocked
    # same start to the millisecond: the instance id decides, the same way on both sides
    twin = other(ME.started_ms, instance_id="000000000000")
    watch = OtherAgents(ME)
    watch.on_status(status(twin), retained=False, now_wall=0.0)
    assert watch.blocker(0.0) is not None


def test_advisory_agents_and_offline_agents_do_not_block() -> None:
    older = other(ME.started_ms - 1000)
    watch = OtherAgents(ME)
    watch.on_status(status(older, mode="advisory"), retained=False, now_wall=0.0)
    assert watch.blocker(0.0) is None and not watch.competing(0.0)
    watch.on_status(status(older, seq=1), retained=False, now_wall=1.0)  # now in enforce mode
    assert watch.blocker(1.0) is not None
    watch.on_status(status(older, "offline", seq=2), retained=False, now_wall=2.0)  # its clean stop or its will
    assert watch.blocker(2.0) is None and not watch.competing(2.0)


def test_a_retained_online_status_waits_for_a_sign_of_life_then_counts_as_stale() -> None:
    older = other(ME.started_ms - 60_000)
    watch = OtherAgents(ME)
    assert watch.on_status(status(older, seq=5), retained=True, now_wall=0.0) is None  # no sign of life yet
    found = watch.blocker(1.0)
    assert found is not None and found[1] is False  # unconfirmed: not commanding meanwhile
    assert watch.blocker(13.0) is None  # no sign of life for 12 s: a host that died before its will
    # a newer retained copy is a sign of life (it published since: a fight for one client id)
    watch2 = OtherAgents(ME)
    watch2.on_status(status(older, seq=5), retained=True, now_wall=0.0)
    assert watch2.on_status(status(older, seq=6), retained=True, now_wall=0.5) is not None
    assert watch2.blocker(20.0) == (watch2.peers[older.publisher], True)
    assert watch2.blocker(40.0) is None  # silent for 35 s: gone


def test_an_earlier_run_on_this_host_whose_process_is_gone_is_not_waited_for() -> None:
    earlier = AgentInstance(ME.host, dead_pid(), ME.started_ms - 5_000, "cccccccccccc")
    watch = OtherAgents(ME)
    watch.on_status(status(earlier), retained=True, now_wall=0.0)  # a kill -9 before the will
    assert watch.blocker(0.0) is None
    # the same pid as ours (a container restarted: pid 1 again) is an earlier run too
    watch.on_status(status(AgentInstance(ME.host, ME.pid, ME.started_ms - 9, "dddddddddddd")), True, 0.0)
    assert watch.blocker(0.0) is None
    # but one whose process is alive is waited for, and once it shows a sign of life it commands
    alive = AgentInstance(ME.host, 1, ME.started_ms - 9, "eeeeeeeeeeee")  # pid 1 lives
    watch.on_status(status(alive), retained=True, now_wall=0.0)
    assert watch.blocker(0.0) == (watch.peers[alive.publisher], False)
    watch.on_status(status(alive, seq=1), retained=False, now_wall=0.1)
    assert watch.blocker(0.2) == (watch.peers[alive.publisher], True)


def test_commands_from_a_publisher_that_names_no_instance_always_win() -> None:
    """An agent from before instance ids (publisher "agent") or another program commanding the site
    cannot be asked to stand by: this agent does, until it has been silent for 35 s."""
    watch = OtherAgents(ME)
    peer = watch.on_command("agent", now_wall=0.0)
    assert peer is not None and peer.mode == "enforce" and watch.blocker(1.0) == (peer, True)
    assert watch.blocker(36.0) is None
    # a command from a newer agent does not make this one stand by
    watch.on_command(other(ME.started_ms + 5).publisher, now_wall=40.0)
    assert watch.blocker(40.0) is None and len(watch.competing(40.0)) == 1


def test_its_own_status_is_not_another_agent() -> None:
    watch = OtherAgents(ME)
    assert watch.on_status(status(ME), retained=False, now_wall=0.0) is None
    assert not watch.peers and watch.blocker(0.0) is None


def test_old_copies_from_a_persistent_sessions_backlog_do_not_bring_an_agent_back() -> None:
    """An agent that resumes its persistent session gets what the broker kept for it meanwhile: the
    other agent's statuses and commands from before it stopped. They do not make it alive again."""
    older = other(ME.started_ms - 1)
    watch = OtherAgents(ME)
    watch.on_status(status(older, seq=3), retained=False, now_wall=0.0)
    watch.on_status(status(older, "offline", seq=2), retained=False, now_wall=1.0)  # its will, numbered at connect
    assert watch.blocker(1.0) is None
    assert watch.on_status(status(older, seq=3), retained=False, now_wall=2.0) is None  # a copy
    assert watch.on_command(older.publisher, now_wall=2.0) is None  # a command it sent before it stopped
    assert watch.blocker(2.0) is None
    watch.on_status(status(older, seq=5), retained=False, now_wall=3.0)  # it connected again
    assert watch.blocker(3.0) is not None


def test_publishers_not_heard_from_for_an_hour_are_forgotten_whether_offline_or_not() -> None:
    """Each run of an agent is a new publisher: the runs whose ``offline`` this agent missed (a clean
    session reconnecting meanwhile), programs that sent a command or two, a retained status never
    confirmed, were kept for good (1,000 publishers of commands: 1,000 entries ten hours later)."""
    watch = OtherAgents(ME)
    gone, stale = other(1, instance_id="111111111111"), other(2, instance_id="222222222222")
    watch.on_status(status(gone), retained=False, now_wall=0.0)
    watch.on_status(status(gone, "offline", seq=1), retained=False, now_wall=1.0)
    watch.on_status(status(stale), retained=True, now_wall=0.0)  # a host that died: never confirmed
    missed = other(3, instance_id="333333333333")
    watch.on_status(status(missed), retained=False, now_wall=1.0)  # its offline never came
    for i in range(1000):
        watch.on_command(f"script-{i}", now_wall=2.0)
    watch.forget(before_wall=0.5)  # (the service passes an hour ago)
    assert len(watch.peers) == MAX_PEERS  # the least recently heard beyond MAX_PEERS go at once
    assert all(p.publisher.startswith("script-") for p in watch.peers.values())
    watch.on_status(status(missed, seq=1), retained=False, now_wall=2.5)  # heard again: kept
    watch.forget(before_wall=2.2)
    assert set(watch.peers) == {missed.publisher}
    assert watch.blocker(2.5) == (watch.peers[missed.publisher], True)  # an earlier run: it commands


def test_silence_counts_only_while_this_agent_hears_the_broker() -> None:
    """Cut off from the broker, an agent hears nobody: the agent it stands by for is not gone for
    that (it used to be after 35 s, and the agent took over while it could not hear it)."""
    older = other(ME.started_ms - 1)
    watch = OtherAgents(ME)
    watch.listening(True, 0.0)
    watch.on_status(status(older), retained=False, now_wall=0.0)
    watch.listening(False, 10.0)  # cut off 10 s after the last status
    assert watch.blocker(500.0) == (watch.peers[older.publisher], True)
    assert len(watch.competing(500.0)) == 1
    watch.listening(True, 500.0)  # back: 25 s left to hear from it
    assert watch.blocker(524.0) is not None
    assert watch.blocker(526.0) is None
    # a retained "online" waits its 12 s of listening too
    watch2 = OtherAgents(ME)
    watch2.on_status(status(older, seq=3), retained=True, now_wall=0.0)
    watch2.listening(False, 5.0)
    watch2.listening(True, 100.0)
    assert watch2.blocker(106.0) == (watch2.peers[older.publisher], False)
    assert watch2.blocker(108.0) is None


def test_a_command_is_a_sign_of_life_as_of_its_stamp() -> None:
    """The commands of an agent silent since, that a persistent session kept for this one, arrive
    late: they do not bring it back (they made the agent that took over stand by again)."""
    older = other(ME.started_ms - 1)
    watch = OtherAgents(ME)
    watch.on_status(status(older), retained=False, now_wall=0.0)
    assert watch.blocker(36.0) is None  # silent for 35 s: gone
    assert watch.on_command(older.publisher, now_wall=36.0, age_s=40.0) is not None  # stamped before its status
    assert watch.blocker(36.0) is None
    watch.on_command(older.publisher, now_wall=36.0, age_s=0.5)  # a live one
    assert watch.blocker(36.0) == (watch.peers[older.publisher], True)
    watch.on_command(older.publisher, now_wall=37.0, age_s=30.0)  # an old copy does not date it back
    assert watch.peers[older.publisher].alive_wall == 35.5
