"""A site time of 0.0 (a simulator started with ``--start-epoch-s 0``, which the wire accepts: ``ts >= 0``)
is a site time like any other, not a missing one: ``SiteClock.now_or`` gives it back, and what the agent
stamps with the site time (its status) carries it, not the wall clock's epoch seconds."""

from __future__ import annotations

import json

import pytest

from agent import wire
from agent.bus import Bus, MqttOptions
from agent.clock import SiteClock
from agent.other_agents import AgentInstance, OtherAgents
from agent.standby import Standby
from agent.status import StatusPublisher

pytestmark = pytest.mark.agent


class StillWall:
    """A wall clock that does not move (the site clock then reads its newest stamp exactly)."""

    def __call__(self) -> float:
        return 50.0


def clock_at_zero() -> SiteClock:
    clock = SiteClock(1.0, infer=False, wall=StillWall())
    clock.observe(0.0)
    return clock


def test_now_or_gives_a_site_time_of_zero_back_and_the_fallback_only_before_the_first_stamp() -> None:
    unknown = SiteClock(1.0, infer=False, wall=StillWall())
    assert unknown.now_or(7.0) == 7.0
    clock = clock_at_zero()
    assert clock.now() == 0.0
    assert clock.now_or(7.0) == 0.0


def test_the_agent_status_at_site_time_zero_is_stamped_zero_not_with_the_wall_epoch() -> None:
    instance = AgentInstance("host-a", 4242, 1_800_000_000_000, "aaaaaaaaaaaa")
    standby = Standby(
        OtherAgents(instance),
        mode="enforce",
        site_id="site1",
        connected=lambda: True,
        on_stand_by=lambda: None,
        on_commanding=lambda: None,
    )
    mqtt = MqttOptions()
    bus = Bus(mqtt, name="agent")  # never started: the message is only built
    codec = wire.Codec(wire.SiteLayout("site1", ("r0",), 4))
    status = StatusPublisher(bus, codec, clock_at_zero(), standby, mqtt=mqtt)
    out = status.message(wire.AgentState.ONLINE, "test")
    assert json.loads(out.payload)["ts"] == 0.0
