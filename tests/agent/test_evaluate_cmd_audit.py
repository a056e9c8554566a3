"""``racktwin evaluate`` as a command (mutation audit of agent/commands/evaluate.py): what a user reads
and scripts on -- the table's columns, ``--json`` on a clean stdout with the documented keys and units,
``--policy`` repeated, the progress on stderr, ``--quiet`` and ``--out`` over an earlier report.

The numbers asserted are derived by hand from the scenario: on examples/day-full-load.toml every card
is busy, so the baseline (every card at its top clock) runs all 8 racks over their 50 kW limit for the
whole judged window: 8 racks x (60 s - the first 15 s control period) = 360 rack-seconds, and its
loss and saving against itself are 0.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FULL = str(EXAMPLES / "day-full-load.toml")
#: docs/evaluation.md: the keys every policy of ``--json`` has at least
JSON_KEYS = (
    "facility_energy_kwh",
    "it_energy_kwh",
    "pue",
    "throughput",
    "throughput_loss_pct",
    "limit_violation_s",
    "max_rack_power_w",
    "max_die_temp_c",
    "solve_p99_s",
)
#: the table's columns, in order (docs/evaluation.md, the command's output)
HEADS = (
    "policy",
    "facility kWh",
    "saved %",
    "IT kWh",
    "cooling kWh",
    "PUE",
    "throughput",
    "loss %",
    "SLO miss s",
    "wait s",
    "over s",
    "max rack kW",
    "max die C",
    "throttled card-s",
    "solve p99 s",
    "fallbacks",
)
BASELINE_OVER_S = 8 * (60.0 - 15.0)  # all 8 racks over their limit after the first control period


def evaluate(tmp: Path, *extra: str) -> int:
    return main(["evaluate", "--scenario", FULL, "--duration", "60", "--jobs", "1", "--out", str(tmp), *extra])


def table(out: str) -> dict[str, dict[str, str]]:
    """The table's rows by policy: {policy: {header: cell}}; the headers split on runs of 2+ spaces."""
    lines = out.splitlines()
    head = lines[0].split()
    assert " ".join(head) == " ".join(HEADS)  # the headers in the documented order
    rows: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        cells = line.split()
        if len(cells) != len(HEADS):
            break
        rows[cells[0]] = dict(zip(HEADS, cells, strict=True))
    return rows


def test_json_alone_on_stdout_with_the_documented_keys_in_their_units_and_progress_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # progress is on (no --quiet): it must not reach stdout; the policy asked twice runs once
    rc = evaluate(tmp_path, "--policy", "static-cap", "--policy", "static-cap", "--json")
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    obj = json.loads(cap.out)  # one JSON object, nothing else on stdout
    assert list(obj) == ["policies"] and list(obj["policies"]) == ["static-cap"]  # baseline ran, not asked
    m = obj["policies"]["static-cap"]
    for key in JSON_KEYS:
        assert isinstance(m[key], float | int) and not isinstance(m[key], bool), key
    # units: W (a rack of this site draws tens of kW; static-cap keeps it under 50 kW), kWh, seconds
    assert 20_000.0 < m["max_rack_power_w"] <= 50_000.0
    assert m["limit_violation_s"] == 0.0  # static-cap's cap keeps every rack under its limit
    assert m["pue"] == pytest.approx(m["facility_energy_kwh"] / m["it_energy_kwh"], rel=1e-6)
    assert m["throughput_loss_pct"] > 0  # capped cards do less work than the baseline's top clocks
    # 512 busy cards of several hundred W for 60 s: a few kWh (not J, not Wh)
    assert 1.0 < m["it_energy_kwh"] < 20.0
    err = cap.err.splitlines()
    # progress: the header names each policy once, then a closing line per run, baseline included
    assert "policies static-cap (+ baseline as reference)" in err[0]
    done = [line for line in err if line.endswith(", done")]
    assert sorted(line.split()[2] for line in done) == ["baseline", "static-cap"]


def test_the_table_has_the_documented_columns_and_the_baseline_reads_as_derived_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = evaluate(tmp_path, "--policy", "static-cap", "--quiet")
    cap = capsys.readouterr()
    assert rc == 0 and cap.err == ""  # --quiet: nothing on stderr (no target fails on this day's run)
    rows = table(cap.out)
    assert list(rows) == ["static-cap", "baseline"]  # the asked policies first, the reference after
    base, cap_row = rows["baseline"], rows["static-cap"]
    assert base["over s"] == f"{BASELINE_OVER_S:,.0f}" and cap_row["over s"] == "0"
    assert base["saved %"] == "+0.00" and base["loss %"] == "+0.00"  # against itself
    assert float(base["max rack kW"]) > 50.0 >= float(cap_row["max rack kW"])  # kW, over / under the limit
    # the table and metrics.json are the same numbers
    full = json.loads((tmp_path / "metrics.json").read_text())["policies"]
    for name, row in rows.items():
        m = full[name]["metrics"]
        assert float(row["facility kWh"]) == pytest.approx(m["facility_energy_kwh"], abs=0.051)
        assert float(row["IT kWh"]) == pytest.approx(m["it_energy_kwh"], abs=0.051)
        assert float(row["PUE"]) == pytest.approx(m["pue"], abs=5e-5)
        assert float(row["throughput"].replace(",", "")) == pytest.approx(m["throughput"], abs=0.051)
        assert float(row["max rack kW"]) == pytest.approx(m["max_rack_power_w"] / 1e3, abs=0.0051)
        assert float(row["saved %"]) == pytest.approx(m["facility_energy_saving_pct"], abs=0.0051)
        assert float(row["loss %"]) == pytest.approx(m["throughput_loss_pct"], abs=0.0051)
    # saving: 1 - facility / baseline's facility, in %
    saving = 100.0 * (1.0 - float(cap_row["facility kWh"]) / float(base["facility kWh"]))
    assert float(cap_row["saved %"]) == pytest.approx(saving, abs=1.0)  # the kWh cells are rounded to 0.1


def test_an_earlier_report_in_out_is_replaced_not_mixed_with_the_new_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert evaluate(tmp_path, "--policy", "static-cap", "--quiet") == 0
    first_html = (tmp_path / "report.html").read_text()
    assert evaluate(tmp_path, "--policy", "reactive", "--quiet") == 0
    capsys.readouterr()
    full = json.loads((tmp_path / "metrics.json").read_text())
    assert set(full["policies"]) == {"reactive", "baseline"}
    with open(tmp_path / "metrics.csv", newline="") as fh:
        assert sorted(r["policy"] for r in csv.DictReader(fh)) == ["baseline", "reactive"]
    with open(tmp_path / "series.csv", newline="") as fh:
        assert {r["policy"] for r in csv.DictReader(fh)} == {"baseline", "reactive"}
    html = (tmp_path / "report.html").read_text()
    assert html != first_html and "reactive" in html and "static-cap" not in html


def test_the_progress_shows_each_run_and_where_the_report_went(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert evaluate(tmp_path, "--policy", "baseline") == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("racktwin evaluate: day-full-load") and "policies baseline;" in err[0]
    assert "(+ baseline as reference)" not in err[0]  # asked for: not added
    # the day's jobs are all listed: said so, as in the report (was "13 jobs (listed jobs only + 13 listed)")
    assert ", 13 listed jobs, 0 faults;" in err[0]
    assert ", 13 listed jobs, faults: none." in (tmp_path / "report.html").read_text()
    assert any(line.startswith("racktwin evaluate: baseline   0:01:00 of 0:01:00 (100%)") for line in err)
    assert f"wrote {tmp_path}/report.html" in err[-1] and err[-1].startswith("racktwin evaluate: 1 runs")


def test_progress_comes_every_900_site_seconds_and_once_at_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/evaluation.md: a line after every 900 site seconds a policy ran, at most one per 10 s of wall
    # time, and one at its end -- a 30-minute baseline run takes a second or two: the 15-minute line, the end
    argv = ["evaluate", "--scenario", FULL, "--duration", "1800", "--jobs", "1", "--out", str(tmp_path)]
    assert main([*argv, "--policy", "baseline", "--sample-s", "600"]) == 0
    err = capsys.readouterr().err.splitlines()
    runs = [line.split(",")[0] for line in err if line.startswith("racktwin evaluate: baseline ")]
    assert runs == [
        "racktwin evaluate: baseline   0:15:00 of 0:30:00 ( 50%)",
        "racktwin evaluate: baseline   0:30:00 of 0:30:00 (100%)",
    ]
    assert err[2].endswith(", done") and "s left" in err[1]


def test_control_seed_and_sample_settings_reach_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # static-cap caps every rack at its limit less --control rack_margin_w (docs/evaluation.md): 50 - 10 kW
    rc = evaluate(
        tmp_path, "--policy", "static-cap", "--control", "rack_margin_w=10000", "--seed", "7", "--sample-s", "10"
    )
    assert rc == 0
    capsys.readouterr()
    full = json.loads((tmp_path / "metrics.json").read_text())
    assert full["scenario"]["seed"] == 7
    assert 30_000.0 < full["policies"]["static-cap"]["metrics"]["max_rack_power_w"] <= 40_000.0
    with open(tmp_path / "series.csv", newline="") as fh:
        times = [float(r["time_s"]) for r in csv.DictReader(fh) if r["policy"] == "static-cap"]
    steps = {round(b - a, 6) for a, b in itertools.pairwise(times)}
    assert steps == {10.0} and times[-1] == 60.0  # every 10 s, a last sample at the run's end


def test_the_default_out_is_named_after_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["evaluate", "--scenario", FULL, "--duration", "60", "--jobs", "1", "--policy", "baseline", "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "out" / "evaluate-day-full-load").iterdir()) == [
        "metrics.csv",
        "metrics.json",
        "report.html",
        "series.csv",
    ]


def test_a_value_that_is_not_a_number_reads_as_a_dash_in_the_table() -> None:
    from agent.commands.evaluate import _cell

    assert _cell(math.nan, 1.0, "{:.4f}") == "-" and _cell(None, 1.0, "{:.4f}") == "-"
    assert _cell(51_340.0, 1e3, "{:.2f}") == "51.34" and _cell(3, 1.0, "{:d}") == "3"


@pytest.mark.parametrize(
    ("argv", "message"),
    [  # the documented ranges (--help, docs/evaluation.md), just outside
        (["--jobs", "257"], "--jobs must be within 1..256, got 257"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--sample-s", "0.5"], "--sample-s must be within 1..86400 s, got 0.5"),
        (["--sample-s", "86401"], "--sample-s must be within 1..86400 s, got 86401"),
        (["--duration", "nan"], "--duration must be a positive number of seconds"),
    ],
)
def test_options_just_outside_their_documented_ranges_are_refused(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a short run after them, so that an option let through fails the test at once (a day takes minutes)
    base = ["evaluate", "--scenario", FULL, "--duration", "60", "--jobs", "1", "--policy", "baseline"]
    assert main([*base, *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"racktwin evaluate: error: {message}")
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_without_policy_every_policy_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --help: "(default: all; the baseline always runs)"
    argv = ["evaluate", "--scenario", FULL, "--duration", "30", "--jobs", "1", "--json", "--quiet"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert list(obj["policies"]) == ["baseline", "static-cap", "reactive", "greedy", "racktwin"]
