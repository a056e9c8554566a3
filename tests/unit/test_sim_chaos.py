"""The simulator's broker-disconnect schedule (``sim.chaos.DisconnectSchedule``), without a broker:
the link goes down at ``start_s`` and comes back at ``start_s + duration_s`` (site time), so the
telemetry of ``start_s <= t < start_s + duration_s`` is what a disconnect drops (docs/sim.md, "Broker
disconnect"); windows that touch or overlap are one outage. The runner asks ``transition(t)`` at
every step and steps no further than ``next_change_s()``: the times below are the steps it lands on."""

from __future__ import annotations

import math

import pytest

from sim.chaos import DisconnectSchedule
from twin.scenario import BrokerDisconnect

pytestmark = pytest.mark.unit


def _walk(schedule: DisconnectSchedule, times: list[float]) -> list[tuple[float, str]]:
    """The link changes a run stepping through ``times`` meets (each time asked once, in order)."""
    return [(t, c) for t in times if (c := schedule.transition(t)) is not None]


def test_the_link_is_down_from_the_start_to_the_end_of_a_window() -> None:
    """An outage from 10 s for 30 s: down at the step of t = 10 (its telemetry is dropped), still down
    at 39.5, up again at the step of t = 40 (whose telemetry goes out). The runner lands on both edges:
    the next change is 10, then 40, then none."""
    s = DisconnectSchedule([BrokerDisconnect(start_s=10.0, duration_s=30.0)])
    assert s.next_change_s() == 10.0 and not s.down
    assert s.transition(0.0) is None and s.transition(9.5) is None and not s.down
    assert s.transition(10.0) == "disconnect" and s.down
    assert s.next_change_s() == 40.0
    assert s.transition(10.5) is None and s.transition(39.5) is None and s.down
    assert s.transition(40.0) == "reconnect" and not s.down
    assert s.next_change_s() == math.inf
    assert s.transition(41.0) is None and s.transition(1e6) is None and not s.down


def test_windows_that_touch_are_one_outage_whatever_order_the_scenario_lists_them() -> None:
    """2..4 s and 4..6 s, listed late one first: one disconnect at 2, one reconnect at 6 (the link is
    not brought up at 4 to go down again)."""
    s = DisconnectSchedule(
        [BrokerDisconnect(start_s=4.0, duration_s=2.0), BrokerDisconnect(start_s=2.0, duration_s=2.0)]
    )
    assert s.next_change_s() == 2.0
    assert _walk(s, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]) == [(2.0, "disconnect"), (6.0, "reconnect")]
    assert s.next_change_s() == math.inf


def test_a_window_inside_another_keeps_the_link_down_to_the_outer_end() -> None:
    """10..70 s and 30..35 s (the scenario file refuses such overlaps; the schedule takes them as the
    class says): down from 10 to 70, not up again at 35."""
    s = DisconnectSchedule(
        [BrokerDisconnect(start_s=10.0, duration_s=60.0), BrokerDisconnect(start_s=30.0, duration_s=5.0)]
    )
    assert _walk(s, [float(t) for t in range(0, 81, 5)]) == [(10.0, "disconnect"), (70.0, "reconnect")]


def test_windows_a_second_apart_are_two_outages() -> None:
    """2..4 s and 5..6 s: the link is up from 4 to 5 (the telemetry of t = 4 goes out)."""
    s = DisconnectSchedule(
        [BrokerDisconnect(start_s=2.0, duration_s=2.0), BrokerDisconnect(start_s=5.0, duration_s=1.0)]
    )
    changes = _walk(s, [float(t) for t in range(8)])
    assert changes == [(2.0, "disconnect"), (4.0, "reconnect"), (5.0, "disconnect"), (6.0, "reconnect")]


def test_a_window_the_run_has_already_passed_is_skipped() -> None:
    """A run asked first at t = 50 (e.g. stopped stepping over it): the outage of 10..20 s is over and
    does not take the link down; the next one (60..70 s) still does."""
    s = DisconnectSchedule(
        [BrokerDisconnect(start_s=10.0, duration_s=10.0), BrokerDisconnect(start_s=60.0, duration_s=10.0)]
    )
    assert s.transition(50.0) is None and not s.down
    assert s.next_change_s() == 60.0
    assert _walk(s, [59.0, 60.0, 65.0, 70.0]) == [(60.0, "disconnect"), (70.0, "reconnect")]


def test_no_windows_no_changes() -> None:
    s = DisconnectSchedule([])
    assert s.next_change_s() == math.inf and s.transition(0.0) is None and not s.down
