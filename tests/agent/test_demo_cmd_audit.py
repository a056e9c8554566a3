"""``racktwin demo``'s summary (mutation audit of agent/commands/demo.py): the agent's numbers from the
simulator's truth log (docs/evaluation.md, "racktwin demo"; the truth log's columns: docs/sim.md) and
the summary table against the run without the agent. Every expected number below is worked out by
hand from a small truth log written here."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.cli import main
from agent.commands.demo import _format, truth_log_metrics

pytestmark = pytest.mark.agent

LIMIT_W = 50_000.0
SITE = SimpleNamespace(rack=SimpleNamespace(power_limit_w=LIMIT_W), rack_names=["r0", "r1"])
COLUMNS = (
    "time_s",
    "max_rack_power_w",
    "max_die_temp_c",
    "it_energy_kwh",
    "facility_energy_kwh",
    "work_card_s",
    "r0_power_w",
    "r1_power_w",
)
# time, largest rack power since the previous row, hottest die, IT / facility kWh and work so far, r0, r1
ROWS = (
    (0.0, 60_000.0, 91.0, 0.0, 0.0, 0.0, 60_000.0, 40_000.0),  # the hottest die of the run: before the window
    (5.0, 61_000.0, 70.0, 0.3, 0.4, 100.0, 60_000.0, 40_000.0),  # over, but within the first period
    (10.0, 40_000.0, 70.0, 0.6, 0.8, 200.0, 40_000.0, 40_000.0),
    (15.0, 58_000.0, 70.0, 0.9, 1.2, 300.0, 40_000.0, 58_000.0),  # the step 10..15 is still the first period
    (20.0, 55_000.0, 70.0, 1.2, 1.6, 400.0, 55_000.0, 52_000.0),  # 15..20: both racks over: 2 x 5 rack-s
    (25.0, 56_000.0, 70.0, 1.5, 1.9, 500.0, 55_000.0, 45_000.0),  # 20..25: r0 over: 5 rack-s; r0 over 10 s
    (30.0, 50_000.0, 70.0, 2.0, 2.5, 600.0, 50_000.0, 45_000.0),  # at the limit is not over it
    (35.0, 52_000.0, 70.0, 2.4, 3.0, 700.0, 52_000.0, 45_000.0),  # 30..35: r0 over again, for 5 s: 5 rack-s
    (40.0, 45_000.0, 70.0, 2.8, 3.5, 800.0, 45_000.0, 45_000.0),
)


def write_truth(path: Path, rows: tuple[tuple[float, ...], ...] = ROWS, tail: str = "") -> Path:
    lines = [",".join(COLUMNS)] + [",".join(f"{v:g}" for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n" + tail, encoding="utf-8")
    return path


def test_the_agents_numbers_come_from_the_truth_log_as_documented(tmp_path: Path) -> None:
    m = truth_log_metrics(write_truth(tmp_path / "truth.csv"), SITE, judge_from_s=15.0)
    assert m["duration_s"] == 40.0
    assert m["facility_energy_kwh"] == 3.5 and m["it_energy_kwh"] == 2.8  # at the last row, not summed
    assert m["pue"] == pytest.approx(3.5 / 2.8)  # facility / IT energy
    assert m["throughput"] == pytest.approx(800.0 / 40.0)  # work / run time: cards of top-clock training
    # rack-seconds over the limit from the end of the first control period: 2 x 5 + 1 x 5 + 1 x 5
    assert m["limit_violation_s"] == pytest.approx(20.0)
    assert m["limit_violation_longest_s"] == pytest.approx(10.0)  # r0 from 15 to 25 (then 30 to 35: 5 s)
    assert m["max_rack_power_w"] == 56_000.0  # over the judged window (61 and 58 kW were in the first period)
    assert m["max_die_temp_c"] == 91.0  # over the whole run


def test_a_row_cut_short_by_a_killed_simulator_is_left_out(tmp_path: Path) -> None:
    path = write_truth(tmp_path / "truth.csv", tail="45,51000,7")  # the simulator killed mid-row
    m = truth_log_metrics(path, SITE, judge_from_s=15.0)
    assert m["duration_s"] == 40.0 and m["limit_violation_s"] == pytest.approx(20.0)


def test_no_truth_log_is_no_run_not_a_perfect_one(tmp_path: Path) -> None:
    m = truth_log_metrics(tmp_path / "missing.csv", SITE, judge_from_s=15.0)
    assert m["duration_s"] == 0.0
    assert all(math.isnan(m[k]) for k in ("facility_energy_kwh", "limit_violation_s", "max_rack_power_w"))


def summary_table(agent: dict[str, float], baseline: dict[str, float]) -> dict[str, list[str]]:
    scenario = SimpleNamespace(name="day-demo")
    text = _format({"agent": agent, "baseline": baseline}, scenario, 4500.0, 150.0, {"decisions": 300})
    lines = text.splitlines()
    assert lines[0] == "racktwin demo: day-demo, 75 site minutes in 150 s wall (agent: 300 decisions)"
    assert lines[1].split() == ["with", "agent", "without", "change"]  # the agent's column first
    rows: dict[str, list[str]] = {}
    for line in lines[2:9]:
        label, cells = line[:28].strip(), line[28:].split()
        rows[label] = cells
    return rows


def test_the_summary_puts_the_agent_first_and_the_change_against_the_run_without_it() -> None:
    agent = {
        "facility_energy_kwh": 300.0,
        "it_energy_kwh": 270.0,
        "throughput": 285.0,
        "pue": 300.0 / 270.0,
        "limit_violation_s": 0.0,
        "max_rack_power_w": 48_610.0,
        "max_die_temp_c": 85.1,
    }
    baseline = {
        "facility_energy_kwh": 400.0,
        "it_energy_kwh": 360.0,
        "throughput": 300.0,
        "pue": 400.0 / 360.0,
        "limit_violation_s": 14_730.0,
        "max_rack_power_w": 51_340.0,
        "max_die_temp_c": math.nan,  # not measured: a dash, not "nan"
    }
    rows = summary_table(agent, baseline)
    assert rows["facility energy (kWh)"] == ["300.0", "400.0", "-25.0%"]  # 300 / 400 - 1
    assert rows["IT energy (kWh)"] == ["270.0", "360.0", "-25.0%"]
    assert rows["throughput (cards)"] == ["285.0", "300.0", "-5.0%"]  # less work: negative
    assert rows["PUE"] == ["1.1111", "1.1111"]  # no change column for a ratio
    assert rows["over a rack limit (rack-min)"] == ["0.0", "245.5"]  # 14,730 rack-s / 60
    assert rows["largest rack power (kW)"] == ["48.61", "51.34"]
    assert rows["hottest die (deg C)"] == ["85.1", "-"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--progress-interval-s", "0"], "--progress-interval-s must be positive, got 0"),
        (["--progress-interval-s", "nan"], "--progress-interval-s must be positive, got nan"),
        (["--speed", "1001"], "--speed must be within 1..1000, got 1001"),
        (["--speed", "inf"], "--speed must be within 1..1000, got inf"),
        (["--minutes", "10081"], "--minutes must be > 0 and <= 10080 (a week), got 10081"),
        (["--minutes", "nan"], "--minutes must be > 0 and <= 10080 (a week), got nan"),
    ],
)
def test_options_out_of_their_documented_ranges_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"racktwin demo: error: {message}"]
    assert list(tmp_path.iterdir()) == []  # refused before anything ran


def test_a_broker_it_cannot_reach_is_one_line_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: exit 2 for a broker it cannot reach; the line names why (the bus's last error), which
    used to be only in out/agent.log: 'could not connect to the broker URL' said neither what failed
    nor how long it had tried."""
    import socket

    import agent.commands.demo as demo

    with socket.socket() as s:  # a loopback port nothing listens on: every connect is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(demo, "CONNECT_TIMEOUT_S", 2.0, raising=False)  # (the old code waited 15 s)
    url = f"mqtt://127.0.0.1:{port}"
    assert main(["demo", "--broker", url, "--minutes", "1", "--out", str(tmp_path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"racktwin demo: error: the agent could not connect to the broker {url} within 2 s")
    assert "(last error: " in last and "refused" in last.lower()
