"""What the guard changed, as data (``Decision.guard_actions``, docs/agent.md "What the guard changed"):
one action per ``guard: ...`` explanation line, from the documented vocabulary, on the scene of
tests/agent/guard_helpers.py (rack r0: job "a" on cards 0-7 and "b" on cards 8-15; rack r1: "b" on
cards 16-19, idle cards 20-31; "q" queued for 4 cards). Rack limit 12.5 kW, margin 1 kW: 11.5 kW for
cards, hosts and the power the twin does not explain; 2.2 kW of hosts; die limit 87 - 2 = 85 deg C;
0.053 K/W from die to inlet; the lowest power limit a card accepts 200 W. The twin's steady powers at a
30 deg C inlet (tests/agent/test_guard.py): a card of "a" 650, 574, 503 W at levels 0-2, of "b" 618 W
at level 0 and 302 W at its slowest level 7; an idle card 81 W awake, 49 W asleep.

Which line is which action is read off the lines themselves (docs/agent.md's table of the guard's
lines), so that a line written without its action, or an action without its line, shows."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from guard_helpers import proposal, scene, step_context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import ControlConfig
from agent.decision import Decision, PlacementOrder
from agent.guard import GUARD_ACTIONS, Guard

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)

#: docs/agent.md's table: the beginning of each of the guard's lines -> its action
LINES = (
    (r"guard: placements dropped \(", "placements_dropped"),
    (r"guard: level raises limited to \d+ per decision$", "level_raise_limited"),
    (r"guard: set-point move \S+ -> \S+ deg C limited to ", "setpoint_limited"),
    (r"guard: fail-safe caps \(\d+ W per card\) on ", "failsafe_caps"),
    (r"guard: pumps of .+ at full speed ", "pumps_full_speed"),
    (r"guard: slowed job\(s\) .+ to keep racks under their caps ", "cap_jobs_slowed"),
    (r"guard: [\w-]+: \d+ of \d+ awake idle cards to low power for the cap$", "cap_idle_to_low_power"),
    (r"guard: [\w-]+: still over its cap at the slowest levels; power limits of ", "cap_power_limited"),
    (r"guard: [\w-]+: cannot be held under its cap: ", "cap_not_held"),
    (r"guard: slowed job\(s\) .+ to keep dies under ", "die_jobs_slowed"),
    (r"guard: power-limited job\(s\) .+ at the slowest level to keep dies under ", "die_power_limited"),
    (r"guard: dies of job\(s\) .+ cannot be held under ", "die_not_held"),
)


def actions_said(d: Decision) -> list[str]:
    """The action each ``guard:`` line of ``d``'s explanation names (each must name exactly one)."""
    said = []
    for line in d.explanation:
        if not line.startswith("guard:"):
            continue
        named = [action for pattern, action in LINES if re.match(pattern, line)]
        assert len(named) == 1, (line, named)
        said.append(named[0])
    return said


def _inlet(r0_c: float) -> np.ndarray:
    inlet = np.full(32, 30.0)
    inlet[:16] = r0_c
    return inlet


def review(changes: dict[str, object] | None = None, level: int = 0, **ctx: object) -> Decision:
    site, snap = scene()
    return Guard(site, CFG).review(proposal(site, level, **(changes or {})), snap, step_context(site, **ctx))


# ------------------------------------------------------------------------------------------------
# the two limits the guard cannot hold, and an ordinary slowdown
# ------------------------------------------------------------------------------------------------
def test_a_rack_the_lowest_power_limits_cannot_hold_records_cap_not_held() -> None:
    """r1 with 8.5 kW on its PDU the twin does not explain has 11.5 - 8.5 = 3 kW for its cards and
    hosts. At its jobs' slowest level, its idle cards asleep and every card at 200 W it still draws
    4 x 200 + 12 x 49 + 2200 = 3588 W: no lever is left. r0 (no extra) is held by slowing "a"."""
    d = review(rack_extra_w=np.array([0.0, 8500.0]))
    assert d.card_power_limit_w[16:].tolist() == [200.0] * 16
    assert d.budget_rack_power_w[1] == pytest.approx(3588.0 + 8500.0, abs=1.0)  # over the 11.5 kW cap
    assert Counter(d.guard_actions) == {
        "cap_jobs_slowed": 1,  # one line for both racks' jobs
        "cap_idle_to_low_power": 1,
        "cap_power_limited": 1,
        "cap_not_held": 1,
    }
    assert "guard: r1: 12 of 12 awake idle cards to low power for the cap" in d.explanation


def test_a_die_the_lowest_power_limit_cannot_hold_records_die_not_held() -> None:
    """At an 80 deg C inlet a die allows (85 - 80) / 0.053 = 94 W, under the 200 W a card accepts:
    the guard power-limits r0's jobs (already at their slowest level) and cannot hold their dies."""
    d = review(level=7, card_inlet_c=_inlet(80.0))
    assert d.card_power_limit_w[:16].tolist() == [200.0] * 16
    assert d.predicted_rack_max_die_c[0] == pytest.approx(80.0 + 0.053 * 200.0)  # 90.6 deg C
    assert d.guard_actions == ("die_power_limited", "die_not_held")


def test_an_ordinary_cap_slowdown_records_cap_jobs_slowed_and_not_cap_not_held() -> None:
    """r0 at level 0: 8 x 650 + 8 x 618 + 2200 = 12.3 kW > 11.5 kW; "a" at level 2 brings it to
    8 x 503 + 8 x 618 + 2200 = 11.2 kW, held."""
    d = review()
    assert d.job_levels == {"a": 2, "b": 0}
    assert d.guard_actions == ("cap_jobs_slowed",)


def test_a_plan_the_guard_lets_through_unchanged_records_no_action() -> None:
    d = review(level=2)  # r0: 11.2 kW (above), dies at 30 + 0.053 x 618 = 62.8 deg C
    assert d.guard_actions == ()
    assert not any(e.startswith("guard:") for e in d.explanation)


# ------------------------------------------------------------------------------------------------
# every line has its action: the scenes of test_guard.py and one per remaining action
# ------------------------------------------------------------------------------------------------
def _at_slowest() -> Decision:
    site, snap = scene()
    at_slowest = dataclasses.replace(snap, card_level=np.full(site.n_cards, 7))
    return Guard(site, CFG).review(proposal(site, 0), at_slowest, step_context(site))


SCENES: dict[str, Callable[[], Decision]] = {
    "level raises limited": _at_slowest,
    "placement on a busy card": lambda: review({"placements": (PlacementOrder("q", (16, 28, 29, 30)),)}),
    "blind rack": lambda: review(stale_racks=(1,), blind_racks=(1,), failsafe_racks=(1,)),
    "stuck card": lambda: review(stuck_cards=(25,), failsafe_racks=(1,)),
    "set-point too far": lambda: review({"supply_temp_c": 45.0}),
    "pumps too slow for warm dies": lambda: review(
        {"rack_pump_speed_frac": np.array([0.1, 0.1])}, card_inlet_c=_inlet(52.0)
    ),
    "cap: jobs slowed": review,
    "cap: idle cards asleep": lambda: review(rack_extra_w=np.array([0.0, 7300.0])),
    "cap: not held": lambda: review(rack_extra_w=np.array([0.0, 8500.0])),
    "die: job slowed": lambda: review(card_inlet_c=_inlet(52.0)),
    "die: power-limited": lambda: review(card_inlet_c=_inlet(70.0)),
    "die: not held": lambda: review(level=7, card_inlet_c=_inlet(80.0)),
}


@pytest.mark.parametrize("name", list(SCENES))
def test_each_guard_line_of_a_scene_has_its_action_and_each_action_its_line(name: str) -> None:
    d = SCENES[name]()
    said = actions_said(d)
    assert said, "the scene makes the guard change something"
    assert list(d.guard_actions) == said


def test_the_scenes_reach_every_documented_action() -> None:
    """The vocabulary is what the guard writes: no action that no line names, none missing."""
    reached = {a for make in SCENES.values() for a in make().guard_actions}
    assert reached == set(GUARD_ACTIONS)


def test_a_reviewed_decision_reviewed_again_keeps_the_first_reviews_actions_as_it_keeps_its_lines() -> None:
    site, snap = scene()
    guard = Guard(site, CFG)
    once = guard.review(proposal(site, 0), snap, step_context(site))
    twice = guard.review(once.replace(rack_pump_speed_frac=None), snap, step_context(site))
    assert list(twice.guard_actions) == actions_said(twice) == ["cap_jobs_slowed"]


# ------------------------------------------------------------------------------------------------
# the same for any plan (random levels, sleep states, set-points, pump speeds, placements, stale
# racks, warm inlets, unexplained power up to 10 kW)
# ------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lv=st.lists(st.integers(-2, 9), min_size=32, max_size=32),
    lp=st.lists(st.booleans(), min_size=32, max_size=32),
    setpoint=st.floats(10.0, 60.0),
    inlet=st.lists(st.floats(20.0, 84.0), min_size=2, max_size=2),
    stale=st.lists(st.booleans(), min_size=2, max_size=2),
    extra=st.lists(st.floats(0.0, 10_000.0), min_size=2, max_size=2),
    speed=st.one_of(st.none(), st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2)),
    place=st.sampled_from([(), ((20, 21, 22, 23),), ((16, 28, 29, 30),), ((28, 29, 30),)]),
)
def test_every_guard_line_names_one_recorded_action_for_any_plan(
    lv: list[int],
    lp: list[bool],
    setpoint: float,
    inlet: list[float],
    stale: list[bool],
    extra: list[float],
    speed: list[float] | None,
    place: tuple[tuple[int, ...], ...],
) -> None:
    site, snap = scene()
    blind = tuple(r for r, s in enumerate(stale) if s)
    ctx = step_context(
        site,
        stale_racks=blind,
        blind_racks=blind,
        failsafe_racks=blind,
        card_inlet_c=np.asarray(inlet)[site.card_rack()],
        rack_extra_w=np.asarray(extra),
    )
    planned = proposal(
        site,
        np.asarray(lv),
        card_low_power=np.asarray(lp),
        supply_temp_c=setpoint,
        placements=tuple(PlacementOrder("q", cards) for cards in place),
        rack_pump_speed_frac=None if speed is None else np.asarray(speed),
    )
    d = Guard(site, CFG).review(planned, snap, ctx)
    said = actions_said(d)
    assert set(d.guard_actions) <= set(GUARD_ACTIONS)
    # the explanation keeps the guard's first 12 lines; the actions are all recorded
    assert len(said) == min(len(d.guard_actions), 12)
    assert list(d.guard_actions[: len(said)]) == said
    # a rack the twin predicts over its cap (every busy card computing) is one the guard says it cannot hold
    over = np.flatnonzero(d.budget_rack_power_w > d.rack_cap_w + 1e-3)
    assert Counter(d.guard_actions)["cap_not_held"] == over.size
