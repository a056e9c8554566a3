"""Edges of the broker-disconnect schedule (``sim.chaos.DisconnectSchedule``) that the runner's float
clock reaches (a mutation audit found them untested): the plant's time is a sum of steps
(``Plant.step``: ``t + dt``), so with steps such as 0.1 s it lands a hair before a window's edge, and a
window's end (``start_s + duration_s``) may fall a hair before the next window's start although the
scenario wrote them back to back. Either way the link must change at that step: telemetry of
``start_s <= t < start_s + duration_s`` is what a disconnect drops, no more and no less (docs/sim.md,
"Broker disconnect"), and windows that touch are one outage."""

from __future__ import annotations

import pytest

from sim.chaos import DisconnectSchedule
from twin.scenario import BrokerDisconnect

pytestmark = pytest.mark.unit

_EPS_S = 1e-9  # the runner's tolerance for landing on an edge (sim.runner)


def _run(schedule: DisconnectSchedule, step_s: float, end_s: float) -> list[tuple[float, str]]:
    """The link changes a run meets, stepping as ``sim.runner`` does: ask ``transition(t)`` at each
    step, then step by at most ``step_s``, shortened to land on the schedule's next change (unless
    that is no further than the tolerance away), the plant's clock a running float sum."""
    t = 0.0
    changes = []
    while True:
        if (c := schedule.transition(t)) is not None:
            changes.append((t, c))
        if t >= end_s - _EPS_S:
            return changes
        dt = min(step_s, end_s - t)
        link_change_s = schedule.next_change_s() - t
        if link_change_s > _EPS_S:
            dt = min(dt, link_change_s)
        t = t + dt


def test_the_link_changes_at_the_step_that_lands_a_hair_before_an_edge() -> None:
    """An outage from 0.8 s for 0.4 s, a run in 0.1-s steps: its clock reads 0.7999999999999999 at
    the eighth step and 1.2 (below 0.8 + 0.4 = 1.2000000000000002) at the twelfth. The link goes down
    at the eighth step (its telemetry is lost, not sent) and comes back at the twelfth (its telemetry
    goes out), not one step late each."""
    s = DisconnectSchedule([BrokerDisconnect(start_s=0.8, duration_s=0.4)])
    changes = _run(s, 0.1, 2.0)
    assert [c for _, c in changes] == ["disconnect", "reconnect"]
    assert changes[0][0] < 0.8 and changes[0][0] == pytest.approx(0.8, abs=1e-12)
    assert changes[1][0] < 0.8 + 0.4 and changes[1][0] == pytest.approx(1.2, abs=1e-12)


def test_windows_written_back_to_back_are_one_outage_though_the_first_end_falls_short_in_floats() -> None:
    """0.7 s for 0.1 s, then 0.8 s for 1 s: 0.7 + 0.1 is 0.7999999999999999 in floats, below 0.8, yet
    the scenario wrote two windows that touch: one disconnect at 0.7, one reconnect at 1.8 (the link
    is not brought up for a moment at 0.7999999999999999 to go down again)."""
    s = DisconnectSchedule(
        [BrokerDisconnect(start_s=0.7, duration_s=0.1), BrokerDisconnect(start_s=0.8, duration_s=1.0)]
    )
    assert s.next_change_s() == 0.7
    assert s.transition(0.7) == "disconnect" and s.next_change_s() == 1.8
    assert s.transition(0.7 + 0.1) is None and s.transition(0.8) is None and s.down
    assert s.transition(1.8) == "reconnect" and s.next_change_s() == float("inf")


def test_a_window_first_met_at_its_end_is_over() -> None:
    """The window is half-open: a run asked first at t = 20, the end of the 10..20-s outage, is not
    in it (the telemetry of t = 20 goes out), so the link is not taken down there."""
    s = DisconnectSchedule([BrokerDisconnect(start_s=10.0, duration_s=10.0)])
    assert s.transition(20.0) is None and not s.down
    assert s.next_change_s() == float("inf")
