"""``racktwin_competing_agents`` follows the other agents as they come and go (docs/agent.md: other agents
alive in enforce mode on this site, and publishers of its commands that name no agent, while this agent
is in enforce mode; alert RacktwinAnotherAgentOnSite): it counts up with each agent in enforce mode that
says it is online, not one in advisory mode, and back down as each says it goes offline, with
``racktwin_agent_standby`` 1 while one that started earlier commands. test_metric_gaps.py checks the
first count from a command publisher; this checks that the value is updated both ways.

In process, on the service built from examples/agent.toml in enforce mode (not run: no broker); the
statuses handed to its standby as the ingest does, live (not retained)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_metric_gaps import _at, _scrape, _service

from agent import wire
from agent.other_agents import AgentInstance

pytestmark = pytest.mark.agent


def _status(who: AgentInstance, state: str, mode: str = "enforce") -> wire.AgentStatus:
    return wire.AgentStatus(wire.AgentState(state), "1", 1.0, 0, who.publisher, mode=mode, detail="")


def test_competing_agents_counts_up_and_down_as_other_agents_come_and_go(tmp_path: Path) -> None:
    service = _service(tmp_path, RACKTWIN_MODE="enforce")
    try:
        me = service.standby.instance
        earlier = AgentInstance("host-b", 99, me.started_ms - 60_000, "bbbbbbbbbbbb")  # started a minute before
        later = AgentInstance("host-c", 98, me.started_ms + 60_000, "cccccccccccc")
        watcher = AgentInstance("host-d", 97, me.started_ms - 120_000, "dddddddddddd")
        standby = service.standby
        assert _at(_scrape(service), "racktwin_competing_agents") == 0.0

        standby.on_status(_status(watcher, "online", mode="advisory"), False)  # commands nothing: not counted
        s = _scrape(service)
        assert _at(s, "racktwin_competing_agents") == 0.0 and _at(s, "racktwin_agent_standby") == 0.0

        standby.on_status(_status(later, "online"), False)
        s = _scrape(service)
        assert _at(s, "racktwin_competing_agents") == 1.0
        assert _at(s, "racktwin_agent_standby") == 0.0  # it started later: this one commands

        standby.on_status(_status(earlier, "online"), False)
        s = _scrape(service)
        assert _at(s, "racktwin_competing_agents") == 2.0
        assert _at(s, "racktwin_agent_standby") == 1.0  # the earlier one commands: this one stands by

        standby.on_status(_status(earlier, "offline"), False)
        s = _scrape(service)
        assert _at(s, "racktwin_competing_agents") == 1.0
        assert _at(s, "racktwin_agent_standby") == 0.0  # commands again

        standby.on_status(_status(later, "offline"), False)
        s = _scrape(service)
        assert _at(s, "racktwin_competing_agents") == 0.0 and _at(s, "racktwin_agent_standby") == 0.0
    finally:
        service.journal.close()
