"""An operator's walk-through of `racktwin demo`'s summary.

The simulator's own report, printed just above the demo's summary, counts from t = 0 ("from t = 0:
racks over limit 21 rack-s, max rack 51.26 kW"), while the summary judged from the end of the first
control period ("over a rack limit 0.0", "largest rack power 49.12"). The summary's note explained the
window for the time over a limit only, so the two largest-rack figures read as a contradiction.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.commands.demo import _format, truth_log_metrics

pytestmark = pytest.mark.agent

FIELDS = ["time_s", "r0_power_w", "r1_power_w", "max_rack_power_w", "max_die_temp_c", "it_energy_kwh"]
FIELDS += ["facility_energy_kwh", "work_card_s"]


def _truth_log(path: Path) -> None:
    # one second per row; r0 at 51 kW (over its 50 kW limit) in the first 15 s, before the agent's
    # first decision; from 15 s on both racks at 48 and 40 kW
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for t in range(31):
            r0 = 51_000.0 if t <= 15 else 48_000.0
            w.writerow(
                {
                    "time_s": t,
                    "r0_power_w": r0,
                    "r1_power_w": 40_000.0,
                    "max_rack_power_w": r0,
                    "max_die_temp_c": 60.0,
                    "it_energy_kwh": t * 0.025,
                    "facility_energy_kwh": t * 0.026,
                    "work_card_s": t * 64.0,
                }
            )


def test_the_summary_says_its_largest_rack_power_is_judged_after_the_first_control_period(tmp_path: Path) -> None:
    path = tmp_path / "truth.csv"
    _truth_log(path)
    site = SimpleNamespace(rack=SimpleNamespace(power_limit_w=50_000.0), rack_names=["r0", "r1"])
    m = truth_log_metrics(path, site, judge_from_s=15.0)
    # the 51 kW of the first period is not judged: the largest rack power from 15 s on is 48 kW
    assert m["max_rack_power_w"] == pytest.approx(48_000.0)
    assert m["limit_violation_s"] == 0.0
    summary = {"agent": m, "baseline": dict(m)}
    text = _format(summary, SimpleNamespace(name="walk"), 30.0, 1.0, {"decisions": 2})
    assert "largest rack power (kW)" in text
    note = " ".join(text.splitlines()[-1:])
    assert "over a limit and largest rack power: true rack power, after the first control period" in note
    assert "counts from t = 0" in note
