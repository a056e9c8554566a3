"""The INFO line that ends an episode of ``issued_ahead`` refusals (``CommandOutcomes.ahead_episode_ends``)
says which clock stepped back: the site's (a simulator restarted on an earlier clock: the commands were
decided on the old timeline) or the agent's own, which had run ahead of the site during a silence (the
site's time never went back: the commands were decided while it ran ahead). Both kinds used to read
"the site clock stepped back: ... decided on the old timeline", untrue of the second, the more common
on a real site (a telemetry gap)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from agent import wire
from agent.bus import MqttOptions
from agent.clock import SiteClock
from agent.config import load_config
from agent.publish import OpenCommand
from agent.service import AgentService

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0 = 1_800_000_000.0


class _Wall:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _refused_twice(service: AgentService, wall: _Wall, issued_s: float) -> None:
    """Two commands to r0 stamped ``issued_s``, refused by r0 as issued ahead of its clock."""
    topic = service.codec.topics.rack_cmd("r0")
    for seq in range(2):
        cid = uuid.uuid4()
        service.book.open[str(cid)] = OpenCommand(str(cid), "r0", topic, b"{}", issued_s, issued_s + 30.0)
        reason = f"issued_ahead: ts {issued_s:.3f} is 9 s ahead of the clock of rack r0; at most 2 s is accepted"
        service.outcomes.on_ack(wire.Acknowledgement("r0", cid, wire.AckResult.REJECTED, issued_s, seq, "sim", reason))
        wall.t += 0.1


def _episode_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, object]]:
    return [
        (r.getMessage(), getattr(r, "fields", {}).get("clock_step"))
        for r in caplog.records
        if r.levelno == logging.INFO and "refused as issued ahead" in r.getMessage()
    ]


@pytest.fixture
def service(tmp_path: Path) -> tuple[AgentService, SiteClock, _Wall]:
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    wall = _Wall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    return AgentService(loaded, mqtt=MqttOptions(port=1), http=False, clock=clock), clock, wall  # not run


def test_the_agents_clock_coming_back_from_running_ahead_is_not_called_a_site_clock_step(
    service: tuple[AgentService, SiteClock, _Wall], caplog: pytest.LogCaptureFixture
) -> None:
    """Telemetry at T0, then 10 wall s of silence: the agent's clock extrapolates to T0 + 10, its commands
    are refused as ahead, and the site's next message, stamped T0 + 1, steps it back (the site's clock
    went on, slowly)."""
    svc, clock, wall = service
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    clock.observe(T0)
    wall.t += 10.0
    now = clock.now()
    assert now == T0 + 10.0
    _refused_twice(svc, wall, now)
    assert clock.observe(T0 + 1.0)
    assert (clock.extrapolation_corrections, clock.timelines_left) == (1, 0)
    svc.outcomes.ahead_episode_ends(clock.now())
    assert _episode_lines(caplog) == [
        (
            "the agent's clock stepped back to the site's (it had run ahead of the site during a silence): "
            "2 command(s) decided while it ran ahead had been refused as issued ahead of the targets' clocks (r0 2)",
            "ran_ahead",
        )
    ]


def test_the_site_clock_going_back_is_a_step_to_a_new_timeline(
    service: tuple[AgentService, SiteClock, _Wall], caplog: pytest.LogCaptureFixture
) -> None:
    """Telemetry at T0 + 100 for 2 wall s, a silence, then a restarted site's stamped T0 + 40, T0 + 41:
    the agent's clock leaves the old timeline, and the commands decided on it had been refused."""
    svc, clock, wall = service
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    for i in range(5):
        clock.observe(T0 + 100.0 + 0.5 * i)
        wall.t += 0.5
    wall.t += 5.0
    now = clock.now()
    assert now is not None
    _refused_twice(svc, wall, now)
    clock.observe(T0 + 40.0)
    wall.t += 1.5
    clock.observe(T0 + 41.0)
    assert (clock.extrapolation_corrections, clock.timelines_left) == (0, 1)
    svc.outcomes.ahead_episode_ends(clock.now())
    assert _episode_lines(caplog) == [
        (
            "the site clock stepped back: 2 command(s) decided on the old timeline had been refused as issued ahead "
            "of the targets' clocks (r0 2)",
            "timeline_left",
        )
    ]


def test_both_steps_before_the_line_are_both_named(
    service: tuple[AgentService, SiteClock, _Wall], caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's clock came back from running ahead, then the site's clock went back, both before the
    next ack or decision: the line names both."""
    svc, clock, wall = service
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    for i in range(5):
        clock.observe(T0 + 100.0 + 0.5 * i)
        wall.t += 0.5
    wall.t += 10.0
    now = clock.now()
    assert now is not None
    _refused_twice(svc, wall, now)
    clock.observe(T0 + 104.0)  # behind the clock's T0 + 112, ahead of every stamp seen
    wall.t += 5.0
    clock.observe(T0 + 40.0)
    wall.t += 1.5
    clock.observe(T0 + 41.0)
    assert (clock.extrapolation_corrections, clock.timelines_left) == (1, 1)
    svc.outcomes.ahead_episode_ends(clock.now())
    assert _episode_lines(caplog) == [
        (
            "the site clock stepped back, and the agent's clock had run ahead of the site: 2 command(s) decided on "
            "the old timeline or while the agent's clock ran ahead had been refused as issued ahead of the "
            "targets' clocks (r0 2)",
            "both",
        )
    ]


# ---- mutation audit of ahead_episode_ends: each test below failed on a mutant the tests above let pass


def _ran_ahead_and_back(clock: SiteClock, wall: _Wall) -> None:
    """Telemetry at T0, then 10 wall s of silence: the agent's clock extrapolates to T0 + 10 (the site's next
    message, stamped T0 + 1, steps it back)."""
    clock.observe(T0)
    wall.t += 10.0
    assert clock.now() == T0 + 10.0


def test_the_next_ack_ends_the_episode_and_the_refusals_after_it_wait_for_the_next_step_back(
    service: tuple[AgentService, SiteClock, _Wall], caplog: pytest.LogCaptureFixture
) -> None:
    """Two commands refused as issued ahead while the agent's clock ran ahead; it steps back; the next ack
    (a refusal of a command decided after) ends the episode with its line at once, without a decision.
    The refusals after it are a new episode: no line until the clock steps back again. The episode's line
    used to wait for the next decision (not at the ack); or each ack after the step ended an episode again,
    a line per refusal."""
    svc, clock, wall = service
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    _ran_ahead_and_back(clock, wall)
    _refused_twice(svc, wall, T0 + 10.0)
    assert clock.observe(T0 + 1.0) and clock.extrapolation_corrections == 1
    _refused_twice(svc, wall, T0 + 9.0)
    assert [step for _line, step in _episode_lines(caplog)] == ["ran_ahead"]
    assert "2 command(s) decided while it ran ahead" in _episode_lines(caplog)[0][0]
    svc.outcomes.ahead_episode_ends(clock.now())  # a decision, the clock not stepped back since
    assert len(_episode_lines(caplog)) == 1


def test_a_step_back_without_refusals_logs_no_episode_line(
    service: tuple[AgentService, SiteClock, _Wall], caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's clock runs ahead during a silence and steps back, no command refused meanwhile: no line
    (there is no episode to end)."""
    svc, clock, wall = service
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    _ran_ahead_and_back(clock, wall)
    assert clock.observe(T0 + 1.0) and clock.extrapolation_corrections == 1
    svc.outcomes.ahead_episode_ends(clock.now())
    assert _episode_lines(caplog) == []
