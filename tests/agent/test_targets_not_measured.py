"""A target whose measured value is not a number (a PUE of a run with no IT energy, a bound's metric
that came out NaN or infinite) is not judged: the verdict says "not measured" plainly, not a miss by
"nan over"; the printed verdicts and metrics.json's checks hold no NaN token (valid JSON)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from agent_helpers import example_site, job

from agent.commands.common import json_safe
from agent.commands.evaluate import format_targets
from agent.evaluate import BREAKDOWN_KEYS
from agent.targets import TargetCheck, check_targets
from twin.scenario import ScenarioTargets

pytestmark = pytest.mark.agent


def _metrics(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "facility_energy_kwh": 1000.0,
        "it_energy_kwh": 930.0,
        "cooling_energy_kwh": 40.0,
        "pue": 1.0753,
        "throughput": 300.0,
        "throughput_loss_pct": 0.0,
        "facility_energy_saving_pct": 0.0,
        "allocated_card_frac": 0.6,
        "limit_violation_s": 0.0,
        "limit_violation_episodes": 0,
        "limit_violation_longest_s": 0.0,
        "limit_violation_kws": 0.0,
        "max_rack_power_w": 48000.0,
        "die_over_max_card_s": 0.0,
        "max_die_temp_c": 80.0,
    }
    m.update(over)
    return m


def _judge(
    targets: ScenarioTargets, policy: dict[str, Any], baseline: dict[str, Any] | None = None
) -> list[TargetCheck]:
    metrics = {"racktwin": policy, "baseline": baseline if baseline is not None else _metrics()}
    breakdown = {k: dict.fromkeys(BREAKDOWN_KEYS, 0.0) for k in metrics}
    return check_targets(targets, metrics, breakdown, example_site(), [job("a", 8)])


def _no_nan_anywhere(checks: list[TargetCheck]) -> None:
    text = format_targets("racktwin", checks)
    assert re.search(r"\b(nan|inf)\b", text, flags=re.IGNORECASE) is None, text
    json.dumps([c.as_dict() for c in checks], allow_nan=False)  # raises on a NaN token


def test_a_pue_of_a_run_with_no_it_energy_is_not_measured_not_missed() -> None:
    run = _metrics(facility_energy_kwh=0.0, it_energy_kwh=0.0, cooling_energy_kwh=0.0, pue=math.nan)
    (pue,) = _judge(ScenarioTargets(pue_max=1.08), run)
    assert pue.met is None and pue.measured == "-" and pue.shortfall == "", pue
    assert pue.why.startswith("not measured: the run used no IT energy"), pue
    _no_nan_anywhere([pue])
    assert "not judged" in format_targets("racktwin", [pue])


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize(
    ("field", "key"),
    [
        ("limit_violation_s_max", "limit_violation_s"),
        ("limit_violation_longest_s_max", "limit_violation_longest_s"),
        ("die_over_max_card_s_max", "die_over_max_card_s"),
    ],
)
def test_a_bound_on_a_metric_that_is_not_a_number_is_not_measured(field: str, key: str, value: float) -> None:
    bound: dict[str, Any] = {field: 10.0}
    (check,) = _judge(ScenarioTargets(**bound), _metrics(**{key: value}))
    assert check.met is None and check.measured == "-" and check.shortfall == "", check
    assert check.why.startswith(f"not measured: {key} is "), check
    _no_nan_anywhere([check])


def test_a_saving_and_a_loss_with_nothing_to_compare_are_not_judged_without_nan() -> None:
    run = _metrics(facility_energy_saving_pct=math.nan, throughput_loss_pct=math.nan)
    saving, loss = _judge(ScenarioTargets(facility_saving_pct_min=5.0, throughput_loss_pct_max=1.0), run)
    assert saving.met is None and loss.met is None, (saving, loss)
    assert saving.measured == "-" and loss.measured == "-" and not saving.shortfall and not loss.shortfall
    _no_nan_anywhere([saving, loss])


def test_better_than_a_policy_with_no_energy_or_work_says_so_without_nan() -> None:
    base = _metrics(facility_energy_kwh=0.0, throughput=0.0)
    (check,) = _judge(ScenarioTargets(better_than=("baseline",)), _metrics(), baseline=base)
    assert re.search(r"\bnan\b", check.measured, flags=re.IGNORECASE) is None, check
    (check,) = _judge(ScenarioTargets(better_than=("baseline",)), _metrics(facility_energy_kwh=math.nan))
    assert check.met is None and check.measured == "-" and check.why.startswith("not measured"), check
    _no_nan_anywhere([check])


def test_metrics_with_a_nan_pue_serialize_as_valid_json() -> None:
    # what `racktwin evaluate --json` prints and metrics.json holds goes through json_safe: NaN -> null
    out = json.dumps(json_safe({"policies": {"racktwin": _metrics(pue=math.nan)}}), allow_nan=False)
    assert json.loads(out)["policies"]["racktwin"]["pue"] is None
