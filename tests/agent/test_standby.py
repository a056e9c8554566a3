"""Whether an agent commands its site or stands by (``agent.standby.Standby``), on the statuses and
commands it hears: what it tells the service (commanding, the callbacks, /readyz, the status to
publish). The rule itself is tested in tests/agent/test_other_agents.py; the service around it over
mosquitto in tests/integration/test_agent_service.py and test_two_agents.py."""

from __future__ import annotations

import time

import pytest
from test_other_agents import ME, dead_pid, other, status

from agent.other_agents import AgentInstance, OtherAgents
from agent.standby import Standby

pytestmark = pytest.mark.agent


class Site:
    """A :class:`Standby` for :data:`ME` with what it tells the service recorded."""

    def __init__(self, mode: str = "enforce") -> None:
        self.connected = True
        self.stood_by = 0
        self.took_up = 0
        self.standby = Standby(
            OtherAgents(ME),
            mode=mode,
            site_id="site1",
            connected=lambda: self.connected,
            on_stand_by=self._stand_by,
            on_commanding=self._commanding,
        )

    def _stand_by(self) -> None:
        self.stood_by += 1

    def _commanding(self) -> None:
        self.took_up += 1

    def status_due(self) -> bool:
        """Whether a status is to be published now (and clear it, as the status publisher does)."""
        due = self.standby.status_due.is_set()
        self.standby.status_due.clear()
        return due


def test_an_agent_alone_commands_and_takes_up_its_open_commands() -> None:
    site = Site()
    site.standby.check()
    assert site.standby.commanding() and site.took_up == 1
    assert site.standby.readiness() == [] and not site.status_due()


def test_an_agent_that_started_later_stands_by_says_so_and_commands_again_once_the_other_is_offline() -> None:
    site, older = Site(), other(ME.started_ms - 1000)
    site.standby.on_status(status(older, seq=1), retained=False)
    sb = site.standby
    assert sb.standing_by_for is not None and sb.standing_by_for.publisher == older.publisher
    assert not sb.commanding() and site.stood_by == 1 and site.took_up == 0
    assert site.status_due()  # the status says whom it stands by for
    assert not sb.take_answer_due()  # that status tells a change: no answer (held by the answer gap)
    assert sb.readiness() and "standing by: agent bbbbbbbbbbbb on host host-b" in sb.readiness()[0]
    assert [p.publisher for p in sb.competing()] == [older.publisher]
    sb.on_status(status(older, seq=2), retained=False)  # its next status: nothing new
    assert site.stood_by == 1 and not site.status_due() and not sb.take_answer_due()  # a standby does not answer
    sb.on_status(status(older, "offline", seq=3), retained=False)
    assert sb.standing_by_for is None and sb.commanding() and site.took_up == 1
    assert site.status_due()  # the status says it commands again
    assert sb.readiness() == [] and sb.competing() == []


def test_an_agent_commands_again_once_the_other_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.other_agents.PEER_SILENT_S", 0.3)
    site = Site()
    site.standby.on_status(status(other(ME.started_ms - 1000)), retained=False)
    assert site.standby.standing_by_for is not None and site.status_due()
    time.sleep(0.4)
    site.standby.check()  # the service checks every period
    assert site.standby.commanding() and site.took_up == 1 and site.status_due()


def test_silence_while_cut_off_from_the_broker_is_no_sign_that_the_other_agent_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agent.other_agents.PEER_SILENT_S", 0.3)
    site = Site()
    site.standby.on_status(status(other(ME.started_ms - 1000)), retained=False)
    site.connected = False
    site.standby.check()
    time.sleep(0.4)
    site.standby.check()
    assert site.standby.standing_by_for is not None and not site.standby.commanding() and site.took_up == 0


def test_a_retained_online_status_holds_the_agent_back_until_it_is_confirmed_or_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agent.standby.PEER_PROOF_S", 0.3)
    monkeypatch.setattr("agent.other_agents.PEER_PROOF_S", 0.3)
    site, older = Site(), other(ME.started_ms - 1000)
    sb = site.standby
    sb.on_status(status(older, seq=4), retained=True)  # what a subscription gets: no sign of life yet
    sb.check()
    assert sb.unconfirmed is not None and sb.standing_by_for is None
    assert not sb.commanding() and site.took_up == 0 and site.stood_by == 0  # its open commands stay
    assert site.status_due()  # the status says whom it waits for
    assert sb.readiness() and "not commanding yet: the retained status says agent bbbbbbbbbbbb" in sb.readiness()[0]
    time.sleep(0.4)  # no sign of life: a host that died before its will
    sb.check()
    assert sb.unconfirmed is None and sb.commanding() and site.took_up == 1 and site.status_due()
    # confirmed instead: it stands by
    site2 = Site()
    site2.standby.on_status(status(older, seq=4), retained=True)
    site2.standby.check()
    assert site2.status_due()
    site2.standby.on_status(status(older, seq=5), retained=False)
    assert site2.standby.standing_by_for is not None and site2.standby.unconfirmed is None
    assert site2.stood_by == 1 and site2.status_due()


def test_another_agents_status_is_answered_once_while_this_one_commands() -> None:
    site, newer = Site(), other(ME.started_ms + 1000)
    sb = site.standby
    sb.on_status(status(newer, seq=1), retained=False)  # it started later: it stands by, this one commands
    assert sb.commanding() and site.status_due()
    assert sb.take_answer_due() and not sb.take_answer_due()  # answered once
    assert [p.publisher for p in sb.competing()] == [newer.publisher]  # counted all the same


def test_a_status_that_changes_whether_this_agent_commands_is_no_status_to_answer() -> None:
    """Only an agent that commands answers another's status (the status publisher holds an answer up
    to a second after its last status, against ping-pong). The status that makes this agent stand by
    or wait used to be taken for one to answer (the flag was set before the check): the change went
    out up to a second late, and the flag stayed set where the publisher reconnected under the
    stand-by client id instead."""
    site, older = Site(), other(ME.started_ms - 1000)
    sb = site.standby
    sb.on_status(status(older, seq=1), retained=False)
    assert not sb.commanding() and site.status_due() and not sb.take_answer_due()
    sb.on_status(status(older, "offline", seq=2), retained=False)  # commanding again: a change too
    assert sb.commanding() and site.status_due() and not sb.take_answer_due()
    site, newer = Site(), other(ME.started_ms + 1000)  # one that started later: answered
    site.standby.on_status(status(newer, seq=1), retained=False)
    assert site.standby.commanding() and site.status_due() and site.standby.take_answer_due()


def test_an_agent_in_advisory_mode_never_commands_nor_stands_by() -> None:
    site, older = Site(mode="advisory"), other(ME.started_ms - 1000)
    sb = site.standby
    sb.on_status(status(older), retained=False)
    assert sb.standing_by_for is None and sb.unconfirmed is None and not sb.commanding()
    assert sb.competing() == [] and sb.readiness() == [] and site.stood_by == 0 and site.took_up == 0
    assert not sb.take_answer_due()  # it does not answer either


def test_commands_of_another_publisher_count_and_those_of_an_earlier_run_here_do_not() -> None:
    site = Site()
    sb = site.standby
    earlier = AgentInstance(ME.host, dead_pid(), ME.started_ms - 5_000, "cccccccccccc")
    assert sb.on_command(earlier.publisher, age_s=0.0) is False  # a run before this one, gone
    assert sb.standing_by_for is None and not sb.others.peers
    older = other(ME.started_ms - 1000)
    sb.on_status(status(older, seq=1), retained=False)
    sb.on_status(status(older, "offline", seq=2), retained=False)
    assert sb.on_command(older.publisher, age_s=1.0) is False  # an old copy of an agent gone offline
    assert sb.commanding()
    site.status_due()  # (published)
    assert sb.on_command("agent", age_s=0.0) is True  # another program: it cannot be asked to stand by
    assert sb.standing_by_for is not None and sb.standing_by_for.publisher == "agent" and site.stood_by == 2
    assert site.status_due()  # the status says whom it stands by for


def test_another_agent_not_heard_from_for_an_hour_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    site, newer = Site(), other(ME.started_ms + 1000)
    site.standby.on_status(status(newer, "offline"), retained=False)
    assert newer.publisher in site.standby.others.peers
    site.standby.check()
    assert newer.publisher in site.standby.others.peers  # not yet
    monkeypatch.setattr("agent.standby._PEER_FORGET_S", 0.0)
    time.sleep(0.01)
    site.standby.check()
    assert newer.publisher not in site.standby.others.peers
