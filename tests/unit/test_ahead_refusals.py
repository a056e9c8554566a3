"""The rhythm of the log lines of commands refused ``issued_ahead`` (agent.ahead_refusals): the first
refusal of an episode is a line at once, the next ones are counted; the episode ends, with the number
each target refused, when the agent's clock steps back or, per target, when the target applies a
command again."""

from __future__ import annotations

import pytest

from agent.ahead_refusals import AheadRefusals

pytestmark = pytest.mark.unit


def test_a_restart_makes_one_line_then_one_sum_when_the_clock_steps_back() -> None:
    ahead = AheadRefusals()
    lines = [ahead.refused(t) for _ in range(13) for t in ("r0", "r1", "facility")]
    assert lines[0] == 1 and lines[1:] == [None] * 38  # one WARNING line, within a minute of wall time
    assert ahead.clock_stepped_back() == {"r0": 13, "r1": 13, "facility": 13}
    assert ahead.refused("r0") == 1  # a new episode is a line at once


def test_a_rack_whose_clock_lags_keeps_its_episode_while_the_others_apply_commands() -> None:
    ahead = AheadRefusals()
    assert ahead.refused("r3") == 1
    assert ahead.refused("r3") is None
    assert ahead.applied("r0") == 0  # another rack's applied command says nothing of r3's clock
    assert ahead.refused("r3") is None
    assert ahead.applied("r3") == 3
    assert ahead.refused("r3") == 1


def test_refusals_of_commands_the_clock_left_behind_are_counted_without_a_line() -> None:
    ahead = AheadRefusals()
    assert ahead.refused("r0", left_behind=True) is None
    assert ahead.refused("r1", left_behind=True) is None
    assert ahead.clock_stepped_back() == {"r0": 1, "r1": 1}
