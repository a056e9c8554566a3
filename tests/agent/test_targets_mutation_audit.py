"""Mutation audit of the verdicts ``racktwin evaluate`` prints (``agent.targets``), at their edges.

What users rely on: only a "better than" miss that spent more energy for more work (or less for
less) is priced; a miss at exactly the same energy is no trade; a trade whose work is worth exactly
its energy at the controller's prices is not worth making (the objective gains nothing); a policy
compared with one whose energy is not a number is not judged (never missed by "nan"); the why of a
longest-time-over miss gives the rack-seconds over and the episodes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from agent_helpers import example_site, job

from agent.config import PricesConfig
from agent.targets import check_targets
from twin.scenario import ScenarioTargets

pytestmark = pytest.mark.agent

HOUR_S = 3600.0


def _metrics(kwh: float, work_card_h: float) -> dict[str, Any]:
    return {"facility_energy_kwh": kwh, "throughput": work_card_h, "work_card_s": work_card_h * HOUR_S}


def test_less_work_at_the_same_energy_is_no_trade() -> None:
    metrics = {
        "baseline": _metrics(1000.0, 1000.0),
        "racktwin": _metrics(1000.0, 990.0),
        "greedy": _metrics(1000.0, 1000.0),
    }
    (check,) = check_targets(ScenarioTargets(better_than=("greedy",)), metrics, {}, example_site(), [job("a", 8)])
    assert check.met is False and "work -1.00% against greedy" in check.why
    assert "a trade" not in check.why


def test_a_trade_worth_exactly_its_energy_is_not_worth_it() -> None:
    """10 kWh more at 0.5 per kWh for 1 card-hour more at 5.0 per card-hour: +0.00, not worth it."""
    metrics = {
        "baseline": _metrics(1000.0, 1000.0),
        "racktwin": _metrics(1010.0, 1001.0),
        "greedy": _metrics(1000.0, 1000.0),
    }
    prices = PricesConfig(energy_per_kwh=0.5, card_hour_value=5.0)
    tg = ScenarioTargets(better_than=("greedy",))
    (check,) = check_targets(tg, metrics, {}, example_site(), [job("a", 8)], prices=prices)
    assert check.met is False and "used +10.0 kWh for +1.0 card-hours" in check.why
    assert "+0.00 at the prices it plans with" in check.why and "not worth it by its own objective" in check.why


def test_better_than_a_policy_whose_energy_is_not_a_number_is_not_judged() -> None:
    metrics = {
        "baseline": _metrics(1000.0, 1000.0),
        "racktwin": _metrics(990.0, 1000.0),
        "greedy": _metrics(math.nan, 1000.0),
    }
    (check,) = check_targets(ScenarioTargets(better_than=("greedy",)), metrics, {}, example_site(), [job("a", 8)])
    assert check.met is None and check.measured == "-" and check.why.startswith("not measured"), check


def test_a_longest_time_over_missed_says_the_rack_seconds_over_and_the_episodes() -> None:
    m = {
        **_metrics(1000.0, 1000.0),
        "limit_violation_s": 30.0,
        "limit_violation_episodes": 3,
        "limit_violation_longest_s": 20.0,
        "limit_violation_kws": 7.5,
    }
    tg = ScenarioTargets(limit_violation_longest_s_max=10.0)
    (check,) = check_targets(tg, {"baseline": m, "racktwin": m}, {}, example_site(), [job("a", 8)])
    assert check.met is False and check.shortfall == "10 s too long"
    assert check.why == "30 rack-s over in 3 episodes"
