"""``racktwin twin`` and ``racktwin fit-power`` / ``fit-thermal`` against their documentation
(docs/twin.md, the modules' docstrings), the example site and the measured Perseus sweep: what a
mutation audit of agent/commands/twin_cmd.py and agent/commands/fit.py found the existing tests let
through. Expected values are derived from the site spec, the data and the physics, not from a run."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
SITE_TOML = tomllib.loads((REPO / "examples" / "supernode-512.toml").read_text(encoding="utf-8"))
CLOCKS = [float(f) for f in SITE_TOML["card"]["clocks_mhz"]]  # 1980 .. 1210 MHz, 8 levels
PERSEUS = REPO / "examples" / "sweep-perseus.csv"
THERMAL = REPO / "examples" / "thermal-step.csv"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == "", (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _facility_from_parts(it_w: float, cooling_w: float) -> float:
    """The facility's draw by the spec: IT + cooling + UPS and distribution loss (a fraction of IT)
    + the room's other overhead (docs/twin.md, [facility])."""
    fac = SITE_TOML["facility"]
    return float(it_w * (1.0 + fac["ups_loss_fraction"]) + cooling_w + fac["other_overhead_w"])


# ---- twin steady ------------------------------------------------------------------------------


def test_steady_energy_adds_up_and_every_figure_is_in_its_unit(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "twin", "steady")
    # facility = IT + cooling + UPS loss + other overhead; the chiller is a part of cooling
    assert d["facility_power_w"] == pytest.approx(_facility_from_parts(d["it_power_w"], d["cooling_power_w"]))
    assert 0.0 <= d["chiller_power_w"] < d["cooling_power_w"]  # pumps and dry-cooler fans run too
    assert d["pue"] == pytest.approx(d["facility_power_w"] / d["it_power_w"])
    assert d["pue_target"] == SITE_TOML["pue_target"]
    # every card at level 0 and u = 1 below the slowdown temperature: none throttles (docs' table: 0)
    assert d["level"] == 0 and d["clock_mhz"] == CLOCKS[0] and d["throttled_cards"] == 0
    # each rack's coolant warms on its way through: return above the supply it was given
    assert all(r["return_temp_c"] > d["supply_temp_c"] + 1.0 for r in d["racks"])
    assert d["max_die_temp_c"] == pytest.approx(max(r["max_die_temp_c"] for r in d["racks"]))
    limit = SITE_TOML["rack"]["power_limit_w"]
    assert all(r["power_limit_w"] == limit for r in d["racks"])
    assert d["racks_over_limit"] == sum(r["power_w"] > limit for r in d["racks"])


def test_steady_table_and_json_say_the_same_in_kw(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "twin", "steady")
    code, out, _ = _run(capsys, "twin", "steady")
    assert code == 0

    def kw(label: str) -> float:
        m = re.search(rf"^{label}\s+([0-9.]+) kW", out, re.MULTILINE)
        assert m is not None, out
        return float(m.group(1))

    assert kw("IT power") == pytest.approx(d["it_power_w"] / 1e3, abs=0.06)
    assert kw("cooling power") == pytest.approx(d["cooling_power_w"] / 1e3, abs=0.06)
    assert kw("facility power") == pytest.approx(d["facility_power_w"] / 1e3, abs=0.06)
    row = next(line for line in out.splitlines() if line.startswith("r0 "))
    power_kw, limit_kw = (float(x) for x in row.split()[1:3])
    assert power_kw == pytest.approx(d["racks"][0]["power_w"] / 1e3, abs=0.006)
    assert limit_kw == SITE_TOML["rack"]["power_limit_w"] / 1e3


def test_steady_takes_the_level_clock_supply_and_ambient_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "twin", "steady", "--level", "4", "--supply-temp-c", "40", "--ambient-c", "10")
    assert (d["level"], d["clock_mhz"]) == (4, CLOCKS[4])
    assert d["supply_temp_c"] == 40.0 and d["ambient_temp_c"] == 10.0
    # --clock-mhz: the slowest level whose clock is at or above it (1700 MHz: level 2, 1760 MHz)
    d = _json(capsys, "twin", "steady", "--clock-mhz", "1700")
    assert (d["level"], d["clock_mhz"]) == (2, CLOCKS[2])
    d = _json(capsys, "twin", "steady", "--clock-mhz", str(CLOCKS[0]))  # the table's ends are within it
    assert d["level"] == 0
    d = _json(capsys, "twin", "steady", "--clock-mhz", str(CLOCKS[-1]))
    assert d["level"] == len(CLOCKS) - 1
    # the last level and the ends of the documented ranges are accepted
    assert _json(capsys, "twin", "steady", "--level", str(len(CLOCKS) - 1))["clock_mhz"] == CLOCKS[-1]
    assert _json(capsys, "twin", "steady", "--ambient-c", "55")["ambient_temp_c"] == 55.0
    assert _json(capsys, "twin", "steady", "--supply-temp-c", "60")["supply_temp_c"] == 60.0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--level", "8"], "--level must be within 0..7"),  # 8 levels: 0..7
        (["--level", "-1"], "--level must be within 0..7"),
        (["--utilization", "1.5"], "--utilization must be within 0..1"),
        (["--ambient-c", "55.5"], "--ambient-c must be within -40..55 deg C"),
        (["--supply-temp-c", "60.5"], "--supply-temp-c must be within 5..60 deg C"),
        (["--supply-temp-c", "4.9"], "--supply-temp-c must be within 5..60 deg C"),
        (["--clock-mhz", "1981"], "--clock-mhz must be within 1210..1980 MHz"),
    ],
)
def test_steady_refuses_values_just_outside_the_documented_ranges(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert words in _error(capsys, "twin", "steady", *args)


def test_steady_throttles_every_card_above_the_throttle_onset(capsys: pytest.CaptureFixture[str]) -> None:
    """At a 60 deg C supply every die of the example site is past its slowdown temperature (docs/twin.md:
    512 throttled from 52 deg C): each card is counted once, at a slower level than asked."""
    d = _json(capsys, "twin", "steady", "--supply-temp-c", "60")
    assert d["throttled_cards"] == 512


# ---- twin sweep-supply ------------------------------------------------------------------------


def test_sweep_energy_adds_up_at_every_point_and_the_best_is_the_least(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "twin", "sweep-supply", "--from-c", "20", "--to-c", "56", "--step-k", "4", "--ambient-c", "25")
    assert d["ambient_temp_c"] == 25.0
    pts = d["points"]
    for p in pts:
        assert p["facility_power_w"] == pytest.approx(_facility_from_parts(p["it_power_w"], p["cooling_power_w"]))
        assert 0.0 <= p["chiller_power_w"] <= p["cooling_power_w"]
        assert p["pue"] == pytest.approx(p["facility_power_w"] / p["it_power_w"])
    calm = [p for p in pts if p["throttled_cards"] == 0]
    best = min(calm, key=lambda p: p["facility_power_w"])
    assert d["best_supply_temp_c"] == best["supply_temp_c"]
    assert d["best_facility_power_w"] == best["facility_power_w"]


def test_sweep_takes_the_ambient_level_and_utilization_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """A point of the sweep is the steady state at that supply temperature: the same figures as
    ``twin steady`` with the same level, utilization, supply and ambient."""
    args = ["--level", "3", "--utilization", "0.5", "--ambient-c", "10"]
    sweep = _json(capsys, "twin", "sweep-supply", "--from-c", "30", "--to-c", "30", *args)
    assert sweep["ambient_temp_c"] == 10.0 and sweep["level"] == 3 and sweep["utilization"] == 0.5
    [point] = sweep["points"]  # --from-c = --to-c: one point
    steady = _json(capsys, "twin", "steady", "--supply-temp-c", "30", *args)
    for key in ("it_power_w", "cooling_power_w", "facility_power_w", "max_die_temp_c"):
        assert point[key] == pytest.approx(steady[key], rel=1e-9), key


def test_sweep_compute_share_zero_keeps_the_speed_of_a_throttled_site(capsys: pytest.CaptureFixture[str]) -> None:
    """Throughput relative to the top clock with a clock-sensitive share s of each step: 1 / (s f_top / f
    + 1 - s). With s = 0 the clock does not matter: 1.0 even where every card throttles (56 deg C)."""
    args = ["twin", "sweep-supply", "--from-c", "56", "--to-c", "56"]
    [p] = _json(capsys, *args, "--compute-share", "0")["points"]
    assert p["throttled_cards"] == 512 and p["throughput_frac"] == pytest.approx(1.0)
    [default] = _json(capsys, *args)["points"]  # s = 0.8
    [p] = _json(capsys, *args, "--compute-share", "1")["points"]
    assert p["throughput_frac"] < default["throughput_frac"] < 1.0  # the more clock-bound, the slower


def test_sweep_table_columns_match_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "twin", "sweep-supply", "--from-c", "30", "--to-c", "34", "--step-k", "2")
    code, out, _ = _run(capsys, "twin", "sweep-supply", "--from-c", "30", "--to-c", "34", "--step-k", "2")
    assert code == 0
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+3[024]\.0 ", line)]
    assert len(rows) == 3
    for row, p in zip(rows, d["points"], strict=True):
        assert float(row[0]) == p["supply_temp_c"]
        assert float(row[1]) == pytest.approx(p["it_power_w"] / 1e3, abs=0.06)
        assert float(row[2]) == pytest.approx(p["cooling_power_w"] / 1e3, abs=0.006)
        assert float(row[3]) == pytest.approx(p["chiller_power_w"] / 1e3, abs=0.006)
        assert float(row[4]) == pytest.approx(p["facility_power_w"] / 1e3, abs=0.06)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--step-k", "0"], "--step-k must be a positive finite number of kelvin, got 0"),
        (["--step-k", "inf"], "--step-k must be a positive finite number of kelvin, got inf"),
        # the limit and the count are named (the line said only "too many points")
        (
            ["--step-k", "0.01", "--from-c", "5", "--to-c", "60"],
            "--step-k 0.01: 5,500 steps from 5 to 60 deg C, more than 1,000: make --step-k larger",
        ),
        (["--compute-share", "1.5"], "--compute-share must be within 0..1, got 1.5"),
        (["--from-c", "4"], "--from-c must be within 5..60 deg C"),
        (["--to-c", "61"], "--to-c must be within 5..60 deg C"),
        (["--level", "8"], "--level must be within 0..7"),
        (["--ambient-c", "56"], "--ambient-c must be within -40..55 deg C"),
    ],
)
def test_sweep_refuses_values_outside_the_documented_ranges(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert words in _error(capsys, "twin", "sweep-supply", *args)


# ---- fit-power ------------------------------------------------------------------------------------


def _perseus_rows() -> list[tuple[float, float]]:
    """(clock MHz, W) of the example sweep, the Perseus A100 profile reduced to power per clock."""
    rows = []
    for line in PERSEUS.read_text(encoding="utf-8").splitlines()[1:]:
        if line and not line.startswith("#") and not line.startswith("clock_mhz"):
            f, p = line.split(",")
            rows.append((float(f), float(p)))
    return rows


def _write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def test_fit_power_reads_columns_by_name_not_by_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reference = _json(capsys, "fit-power", str(PERSEUS), "--predict", "900,1300")
    shuffled = _write(
        tmp_path / "shuffled.csv", "gpu,power_w,clock_mhz", [f"0,{p:.2f},{f:g}" for f, p in _perseus_rows()]
    )
    again = _json(capsys, "fit-power", str(shuffled), "--predict", "900,1300")
    assert again["params"] == pytest.approx(reference["params"])
    assert [p["power_w"] for p in again["predictions"]] == pytest.approx(
        [p["power_w"] for p in reference["predictions"]]
    )


def test_fit_power_predicts_the_measured_sweep_at_each_clock_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """The Perseus A100 draws 246 W at 900 MHz and 346 W at 1200 MHz (examples/sweep-perseus.csv, from
    shared/data): each prediction is the fit at its own clock, near the measured power, and the fit's
    error is reported as a fraction. (Not at 1365-1410 MHz, where the measured power stays at ~475 W,
    the card's cap, and the model, which has none, runs 2-4% above it.)"""
    measured = dict(_perseus_rows())
    d = _json(capsys, "fit-power", str(PERSEUS), "--predict", "1200,900,1050")
    assert [p["clock_mhz"] for p in d["predictions"]] == [1200.0, 900.0, 1050.0]
    for p in d["predictions"]:
        assert p["power_w"] == pytest.approx(measured[p["clock_mhz"]], rel=0.02)
    assert 0.0 < d["mape"] < 0.02  # a fraction (docs: 0.79%), not percent
    code, out, _ = _run(capsys, "fit-power", str(PERSEUS))
    m = re.search(r"mape\s+([0-9.]+)%", out)
    assert code == 0 and m is not None
    assert float(m.group(1)) == pytest.approx(100 * d["mape"], abs=0.006)


def test_fit_power_counts_samples_and_distinct_clocks_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [f"{f:g},{p:.2f}" for f, p in _perseus_rows()]
    doubled = _write(tmp_path / "twice.csv", "clock_mhz,power_w", rows + rows)
    code, out, _ = _run(capsys, "fit-power", str(doubled))
    assert code == 0
    assert f"{2 * len(rows)} samples, {len(rows)} distinct clocks" in out


def test_fit_power_predict_span_ends_are_inclusive(capsys: pytest.CaptureFixture[str]) -> None:
    """855-1410 MHz measured: half the lowest (427.5) to 1.5 times the highest (2115) is predicted, with
    a warning; the measured ends themselves are no extrapolation; just beyond the span is refused."""
    code, out, err = _run(capsys, "fit-power", str(PERSEUS), "--predict", "427.5,2115", "--json")
    assert code == 0 and len(json.loads(out)["predictions"]) == 2
    assert "427.5, 2115 MHz" in err and "extrapolates" in err
    code, out, err = _run(capsys, "fit-power", str(PERSEUS), "--predict", "855,1410")
    assert code == 0 and err == ""
    assert "--predict 2116" in _error(capsys, "fit-power", str(PERSEUS), "--predict", "2116")
    assert "--predict 427" in _error(capsys, "fit-power", str(PERSEUS), "--predict", "427")


def test_fit_power_one_low_value_is_not_a_wrong_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The unit floors refuse a column whose every value is low; one low value (a sample taken while the
    card idled at 3 W, first in the file) is a card's and fits."""
    rows = [f"{f:g},{p:.2f}" for f, p in _perseus_rows()]
    path = _write(tmp_path / "one-low.csv", "clock_mhz,power_w", ["900,3", *rows])
    code, _, err = _run(capsys, "fit-power", str(path), "--json")
    assert code == 0, err


def test_fit_power_in_kw_of_a_700_w_card_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An H100 SXM (700 W) sweep written in kW lies between 0.2 and 0.7: every value under the 5 W floor."""
    rows = [f"{f:g},{p * 1.48 / 1000:.4f}" for f, p in _perseus_rows()]  # up to 0.70 kW
    path = _write(tmp_path / "kw.csv", "clock_mhz,power_w", rows)
    line = _error(capsys, "fit-power", str(path))
    assert "column 'power_w'" in line and "not kW" in line


@pytest.mark.parametrize(
    ("header", "bad_row", "words"),
    [
        ("clock_mhz,power_w", "1000,0", "power 0 W is not a card's power (0 < P < 10000 W)"),
        ("clock_mhz,power_w", "10000,300", "clock 10000 MHz out of range (0 < f < 10000 MHz)"),
        ("clock_mhz,power_w,temperature_c", "1000,300,250", "temperature 250 deg C is not a die temperature"),
        ("clock_mhz,power_w,utilization", "1000,300,1.5", "utilization is a fraction 0..1 (not percent), got 1.5"),
        ("clock_mhz,power_w,utilization", "1000,300,-0.5", "utilization is a fraction 0..1 (not percent), got -0.5"),
    ],
)
def test_fit_power_refuses_values_at_and_just_past_the_open_bounds(
    header: str, bad_row: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = "" if header == "clock_mhz,power_w" else (",50" if "temperature" in header else ",1")
    rows = [f"{f:g},{p:.2f}{extra}" for f, p in _perseus_rows()[:6]]
    path = _write(tmp_path / "bad.csv", header, [*rows, bad_row])
    line = _error(capsys, "fit-power", str(path))
    assert f"{path}:8:" in line and words in line, line


# ---- fit-thermal ----------------------------------------------------------------------------------


def _first_order(t: np.ndarray, power: np.ndarray, inlet: np.ndarray, r_k_per_w: float, tau_s: float) -> np.ndarray:
    """A die behind resistance R with time constant tau, power held between samples (exact)."""
    die = np.empty(t.size)
    die[0] = inlet[0] + r_k_per_w * power[0]
    for k in range(1, t.size):
        a = np.exp(-(t[k] - t[k - 1]) / tau_s)
        die[k] = a * die[k - 1] + (1 - a) * (inlet[k - 1] + r_k_per_w * power[k - 1])
    return die


def _thermal(path: Path, t: np.ndarray, power: np.ndarray, inlet: np.ndarray, die: np.ndarray) -> Path:
    rows = [f"{a:g},{b:g},{c:g},{d:.5f}" for a, b, c, d in zip(t, power, inlet, die, strict=True)]
    return _write(path, "t_s,power_w,inlet_temp_c,die_temp_c", rows)


def test_fit_thermal_reports_r_tau_and_the_rms_residual_in_kelvin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R 0.05 K/W, tau 6 s, and a +-0.4 K alternating sensor error on top: the residual's RMS is that
    error, 0.4 K (not its square, 0.16), and the fit finds R and tau through it."""
    t = np.arange(0.0, 600.0, 1.0)
    power = np.where((t >= 60.0) & (t < 300.0), 600.0, 100.0)
    inlet = np.full(t.size, 30.0)
    noise = np.where(np.arange(t.size) % 2 == 0, 0.4, -0.4)
    die = _first_order(t, power, inlet, 0.05, 6.0) + noise
    # extra columns and another order of the columns are read by name
    rows = [f"x,{d:.5f},{b:g},{a:g},{c:g}" for a, b, c, d in zip(t, power, inlet, die, strict=True)]
    path = _write(tmp_path / "noisy.csv", "card,die_temp_c,power_w,t_s,inlet_temp_c", rows)
    d = _json(capsys, "fit-thermal", str(path))
    assert d["r_th_k_per_w"] == pytest.approx(0.05, rel=0.02)
    assert d["tau_s"] == pytest.approx(6.0, rel=0.1)
    assert d["rmse_k"] == pytest.approx(0.4, rel=0.1)
    code, out, _ = _run(capsys, "fit-thermal", str(path))
    assert code == 0
    shown = {k: float(v) for k, v in re.findall(r"^\s+(r_th_k_per_w|tau_s|rmse_k)\s+([0-9.]+)", out, re.MULTILINE)}
    assert shown["r_th_k_per_w"] == pytest.approx(d["r_th_k_per_w"], abs=6e-6)
    assert shown["tau_s"] == pytest.approx(d["tau_s"], abs=0.006)
    assert shown["rmse_k"] == pytest.approx(d["rmse_k"], abs=6e-4)


def test_fit_thermal_takes_a_hot_coolant_within_the_documented_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-50 < inlet_temp_c < 200 (docs/twin.md): a 120 deg C loop (a test rig, not a data hall) fits."""
    t = np.arange(0.0, 300.0, 1.0)
    power = np.where(t >= 60.0, 500.0, 100.0)
    inlet = np.full(t.size, 120.0)
    path = _thermal(tmp_path / "hot.csv", t, power, inlet, _first_order(t, power, inlet, 0.05, 6.0))
    d = _json(capsys, "fit-thermal", str(path))
    assert d["r_th_k_per_w"] == pytest.approx(0.05, rel=0.01)


@pytest.mark.parametrize(("line", "t_s", "before"), [(52, "49", "49"), (12, "5", "9")])
def test_fit_thermal_names_the_line_where_time_goes_back(
    line: int, t_s: str, before: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A repeated or earlier ``t_s`` is a line to blame: the error names it, as every other bad value's
    does (docs/twin.md; it said only "t_s must be strictly increasing")."""
    t = np.arange(0.0, 100.0, 1.0)
    power = np.where(t >= 30.0, 500.0, 100.0)
    inlet = np.full(t.size, 30.0)
    die = _first_order(t, power, inlet, 0.05, 6.0)
    path = _thermal(tmp_path / "back.csv", t, power, inlet, die)
    lines = path.read_text(encoding="utf-8").splitlines()
    fields = lines[line - 1].split(",")
    lines[line - 1] = ",".join([t_s, *fields[1:]])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    err = _error(capsys, "fit-thermal", str(path))
    assert f"{path}:{line}: column 't_s': {t_s} s is not after the previous sample's {before} s" in err, err
