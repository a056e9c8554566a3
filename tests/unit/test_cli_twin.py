"""racktwin fit-power, fit-thermal, twin steady, twin sweep-supply: outputs and user errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PERSEUS_EXAMPLE = REPO / "examples" / "sweep-perseus.csv"
THERMAL_EXAMPLE = REPO / "examples" / "thermal-step.csv"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_power_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "900,1100"], capsys)
    assert code == 0
    assert "dynamic_power_w" in out and "mape" in out and "1100.0" in out
    code, out, _ = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "900,1100", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"params", "mape", "predictions"}
    assert data["mape"] < 0.01
    assert [p["clock_mhz"] for p in data["predictions"]] == [900.0, 1100.0]
    assert all(set(p) == {"clock_mhz", "power_w"} for p in data["predictions"])
    assert 230 < data["predictions"][0]["power_w"] < 260  # measured 246 W at 900 MHz
    assert {"idle_power_w", "dynamic_power_w", "leakage_w_per_k"} <= set(data["params"])


def test_fit_power_with_utilization_and_temperature(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["clock_mhz,power_w,utilization,temperature_c"]
    for i, f in enumerate(range(1000, 2000, 100)):
        for u in (0.5, 1.0):
            t = 50 + 3 * (i % 4)
            rows.append(f"{f},{(80 + 560 * u * f / 1980) + 0.5 * (t - 55):.3f},{u},{t}")
    path = tmp_path / "sweep.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    code, out, _ = _run(["fit-power", str(path), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["params"]["leakage_w_per_k"] == pytest.approx(0.5, rel=0.1)
    assert data["predictions"] == []


def test_fit_power_notes_every_parameter_it_cannot_identify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A constant temperature_c cannot identify leakage, utilization 0 throughout cannot identify
    dynamic power: each is reported as 0 with a note, as leakage is without a temperature column."""
    lines = [line for line in PERSEUS_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")]
    const_t = tmp_path / "tconst.csv"
    const_t.write_text("\n".join([lines[0] + ",temperature_c"] + [r + ",60" for r in lines[1:]]) + "\n")
    code, out, err = _run(["fit-power", str(const_t)], capsys)
    assert code == 0 and err == ""
    assert "(temperature_c spans 0 K, not more than 0.5 K: leakage not identifiable, reported as 0)" in out
    assert "no temperature_c column" not in out
    u0 = tmp_path / "u0.csv"
    u0.write_text("\n".join([lines[0] + ",utilization"] + [r + ",0" for r in lines[1:]]) + "\n")
    code, out, _ = _run(["fit-power", str(u0)], capsys)
    assert code == 0
    assert "(utilization 0 on every line: dynamic power not identifiable, reported as 0)" in out
    assert "(no temperature_c column: leakage not identifiable, reported as 0)" in out
    # identified parameters get no note (the example sweep: utilization 1, no temperature column)
    code, out, _ = _run(["fit-power", str(PERSEUS_EXAMPLE)], capsys)
    assert code == 0 and "dynamic power not identifiable" not in out


def _thermal_csv(path: Path, t: np.ndarray, power: np.ndarray, inlet: np.ndarray, die: np.ndarray) -> Path:
    rows = ["t_s,power_w,inlet_temp_c,die_temp_c"] + [
        f"{a:g},{b:g},{c:g},{d:.4f}" for a, b, c, d in zip(t, power, inlet, die, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _first_order(t: np.ndarray, power: np.ndarray, inlet_c: float, r_k_per_w: float, tau_s: float) -> np.ndarray:
    die = np.empty(t.size)
    die[0] = inlet_c + r_k_per_w * power[0]
    for k in range(1, t.size):
        a = np.exp(-(t[k] - t[k - 1]) / tau_s)
        die[k] = a * die[k - 1] + (1 - a) * (inlet_c + r_k_per_w * power[k - 1])
    return die


def test_fit_thermal_time_constant_beyond_the_series_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A card whose die has not settled by the end of the series (tau 5000 s, 600 s recorded): the
    best tau is the upper end of the search and the resistance is arbitrary too (it came out 0.034
    for a true 0.05 K/W): refused, not printed."""
    t = np.arange(0.0, 600.0, 2.0)
    power = np.where(t < 60.0, 100.0, 600.0)
    path = _thermal_csv(
        tmp_path / "slow.csv", t, power, np.full(t.size, 30.0), _first_order(t, power, 30.0, 0.05, 5000.0)
    )
    code, out, err = _run(["fit-thermal", str(path), "--json"], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and str(path) in lines[0]
    assert "time constant is not identified" in lines[0] and "upper end" in lines[0] and "2990 s" in lines[0]


def test_fit_thermal_time_constant_below_the_sampling_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every 20th sample of the example (40 s apart; the card's time constant is ~6 s): the die has
    settled at every sample, tau is the lower end of the search (2 s), so not identified: one
    warning line on stderr; the steady-state resistance is still fitted."""
    lines = [line for line in THERMAL_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")]
    path = tmp_path / "sparse.csv"
    path.write_text("\n".join([lines[0], *lines[1::20]]) + "\n", encoding="utf-8")
    code, out, err = _run(["fit-thermal", str(path), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["tau_s"] == pytest.approx(2.0, rel=1e-6)
    assert data["r_th_k_per_w"] == pytest.approx(0.053, rel=0.05)
    err_lines = err.strip().splitlines()
    assert len(err_lines) == 1 and "warning" in err_lines[0] and str(path) in err_lines[0]
    assert "lower end of the search" in err_lines[0] and "time constant is not identified" in err_lines[0]


def test_fit_thermal_time_in_milliseconds_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A card of tau 6 s sampled every 2 s, its t_s written in milliseconds: the fit is 1000 times too
    slow (6000 s), no cold plate's; one warning line names the likely unit mistake. The resistance, a
    steady-state gain, is the same in either unit."""
    t = np.arange(0.0, 600.0, 2.0)
    power = np.where((t >= 60.0) & (t < 300.0), 600.0, 100.0)
    die = _first_order(t, power, 30.0, 0.05, 6.0)
    inlet = np.full(t.size, 30.0)
    code, out, err = _run(
        ["fit-thermal", str(_thermal_csv(tmp_path / "s.csv", t, power, inlet, die)), "--json"], capsys
    )
    assert code == 0 and err == ""
    in_s = json.loads(out)
    path = _thermal_csv(tmp_path / "ms.csv", t * 1000.0, power, inlet, die)
    code, out, err = _run(["fit-thermal", str(path), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["tau_s"] == pytest.approx(1000.0 * in_s["tau_s"], rel=1e-3)
    assert in_s["tau_s"] == pytest.approx(6.0, rel=0.01)
    assert data["r_th_k_per_w"] == pytest.approx(in_s["r_th_k_per_w"], rel=1e-6)
    err_lines = err.strip().splitlines()
    assert len(err_lines) == 1 and "warning" in err_lines[0] and str(path) in err_lines[0]
    assert "t_s in milliseconds" in err_lines[0] and "median sample interval is 2000 s" in err_lines[0]
    assert "tau_s is 6 s" in err_lines[0]


def test_fit_thermal_warns_when_the_fit_explains_little_of_the_series(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example with its power column inverted (the die cools as the power rises): the fit still
    gives a positive resistance (0.17 K/W, tau 352 s: neither implausible on its own), but its error
    is 11 K of the die's 31 K rise range; one warning line says the fit is not to be trusted and what to
    check. The example itself (an error of 0.5 K) warns of nothing (the test below)."""
    lines = [line for line in THERMAL_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")]
    header = lines[0].split(",")
    rows = [line.split(",") for line in lines[1:]]
    k = header.index("power_w")
    powers = [float(row[k]) for row in rows]
    top, bottom = max(powers), min(powers)
    for row, power in zip(rows, powers, strict=True):
        row[k] = f"{top + bottom - power:g}"
    path = tmp_path / "inverted.csv"
    path.write_text("\n".join([lines[0], *(",".join(row) for row in rows)]) + "\n", encoding="utf-8")
    code, out, err = _run(["fit-thermal", str(path), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["r_th_k_per_w"] > 0 and data["rmse_k"] > 10.0
    err_lines = err.strip().splitlines()
    assert len(err_lines) == 1 and "warning" in err_lines[0] and str(path) in err_lines[0], err
    assert "the fit explains little of the series" in err_lines[0] and "not to be trusted" in err_lines[0]


def test_fit_thermal_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["fit-thermal", str(THERMAL_EXAMPLE)], capsys)
    assert code == 0 and "r_th_k_per_w" in out
    assert err == ""  # an identified time constant: no warning
    code, out, _ = _run(["fit-thermal", str(THERMAL_EXAMPLE), "--json"], capsys)
    data = json.loads(out)
    assert set(data) == {"r_th_k_per_w", "tau_s", "rmse_k"}
    assert data["r_th_k_per_w"] == pytest.approx(0.053, rel=0.03)


@pytest.mark.parametrize(
    ("command", "text", "fragments"),
    [
        ("fit-power", "clock_mhz,watts\n1000,300\n", ["missing column 'power_w'", ":1:"]),
        ("fit-power", "clock_mhz,power_w\n1000,300\n1100,abc\n", [":3:", "column 'power_w'", "not a number"]),
        ("fit-power", "clock_mhz,power_w\n1000,300\n1100,nan\n", [":3:", "column 'power_w'", "finite"]),
        ("fit-power", "clock_mhz,power_w\n1000,300\n1000,301\n1100,320\n", ["at least 4 distinct clocks"]),
        ("fit-power", "clock_mhz,power_w,utilization\n1000,300,0.9\n1100,300,90\n", [":3:", "utilization", "0..1"]),
        ("fit-power", "", ["empty file"]),
        ("fit-power", "clock_mhz,power_w\n", ["no data lines"]),
        ("fit-power", "clock_mhz,power_w,power_w\n900,246,1\n1000,260,1\n", [":1:", "'power_w'", "appears twice"]),
        ("fit-power", "clock_mhz,power_w\n900,246,77,5\n1000,260\n", [":2:", "expected 2 fields", "got 4"]),
        ("fit-power", "clock_mhz,power_w\n900,246\n1000\n", [":3:", "expected 2 fields", "got 1"]),
        (
            "fit-power",
            "clock_mhz,power_w\n900,246\n1000,1e300\n",
            [":3:", "column 'power_w'", "power 1e+300 W is not a card's power (0 < P < 10000 W)"],
        ),
        (
            "fit-power",
            "clock_mhz,power_w\n1e6,246\n1000,260\n",
            [":2:", "column 'clock_mhz'", "clock 1e+06 MHz out of range (0 < f < 10000 MHz)"],
        ),
        (
            "fit-power",
            "clock_mhz,power_w,temperature_c\n900,246,50\n1000,260,5000\n",
            [":3:", "column 'temperature_c'", "not a die temperature"],
        ),
        (
            "fit-power",
            "clock_mhz,power_w\n900,0.246\n1000,0.260\n1100,0.292\n1200,0.31\n",
            [":5:", "column 'power_w'", "0.31 W is the largest value", "wrong unit? this column is in W, not kW"],
        ),
        (
            "fit-power",
            "clock_mhz,power_w\n0.9,246\n1.0,260\n1.1,292\n1.2,310\n",
            [":5:", "column 'clock_mhz'", "1.2 MHz is the largest value", "this column is in MHz, not GHz"],
        ),
        ("fit-thermal", "t_s,power_w,inlet_temp_c\n0,1,2\n", ["missing column 'die_temp_c'"]),
        (
            "fit-thermal",
            "t_s,power_w,inlet_temp_c,die_temp_c\n0,100,30,35\n1,-50,30,35\n",
            [":3:", "column 'power_w'", "power -50 W is not a card's power (0 < P < 10000 W)"],
        ),
        (
            "fit-thermal",
            "t_s,power_w,inlet_temp_c,die_temp_c\n0,100,30,35\n1,100,30,308.15\n",
            [":3:", "column 'die_temp_c'", "temperature 308.15 deg C is not a die temperature"],
        ),
        (
            "fit-thermal",
            "t_s,power_w,inlet_temp_c,die_temp_c\n0,100,-60,35\n1,100,30,35\n",
            [":2:", "column 'inlet_temp_c'", "temperature -60 deg C is not a coolant temperature"],
        ),
        (
            "fit-thermal",
            "t_s,power_w,inlet_temp_c,die_temp_c\n0,0.1,30,35\n1,0.6,30,36\n",
            [":3:", "column 'power_w'", "0.6 W is the largest value", "not kW"],
        ),
        ("fit-thermal", "t_s,power_w,inlet_temp_c,die_temp_c\n0,100,30,35\n1,100,30,inf\n", [":3:", "finite"]),
        ("fit-thermal", "t_s,power_w,inlet_temp_c,die_temp_c\n0,100,30,35\n1,100,30,35\n", ["at least 10 samples"]),
    ],
)
def test_bad_csv_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str, fragments: list[str]
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    code, out, err = _run([command, str(path)], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert str(path) in lines[0]  # the message names the file
    for f in fragments:
        assert f in lines[0]


def test_missing_csv_and_bad_predict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["fit-power", str(tmp_path / "nope.csv")], capsys)
    assert code == 2 and "file not found" in err
    code, _, err = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "900,fast"], capsys)
    assert code == 2 and "--predict" in err


def test_predict_far_outside_the_sweep_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # sweep-perseus.csv measures 855-1410 MHz: 1e9 MHz would be 6.6e19 W
    code, out, err = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "900,1e9"], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "--predict 1e+09" in lines[0] and "427.5-2115 MHz" in lines[0] and str(PERSEUS_EXAMPLE) in lines[0]
    code, _, err = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "400"], capsys)
    assert code == 2 and "--predict 400" in err


def test_predict_outside_the_measured_clocks_warns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "800,900,1500", "--json"], capsys)
    assert code == 0
    assert [p["clock_mhz"] for p in json.loads(out)["predictions"]] == [800.0, 900.0, 1500.0]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "extrapolates" in lines[0]
    assert "800, 1500 MHz" in lines[0] and "855-1410 MHz" in lines[0]
    code, _, err = _run(["fit-power", str(PERSEUS_EXAMPLE), "--predict", "900,1100"], capsys)
    assert code == 0 and err == ""


def test_twin_steady_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["twin", "steady", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert {"racks", "it_power_w", "facility_power_w", "pue"} <= set(data)
    assert len(data["racks"]) == 8
    assert all({"rack", "power_w", "max_die_temp_c"} <= set(r) for r in data["racks"])
    assert data["racks"][0]["rack"] == "r0"
    assert data["pue"] == pytest.approx(data["facility_power_w"] / data["it_power_w"])
    assert sum(r["power_w"] for r in data["racks"]) == pytest.approx(data["it_power_w"])


def test_twin_steady_options_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["twin", "steady", "--clock-mhz", "1650", "--supply-temp-c", "40", "--ambient-c", "10"], capsys)
    assert code == 0
    assert "1650 MHz" in out and "PUE" in out and "r7" in out
    code, out, _ = _run(["twin", "steady", "--level", "4", "--utilization", "0.5", "--json"], capsys)
    low = json.loads(out)
    code, out, _ = _run(["twin", "steady", "--json"], capsys)
    assert low["it_power_w"] < json.loads(out)["it_power_w"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["twin", "steady", "--level", "9"], "--level must be within 0..7"),
        (["twin", "steady", "--utilization", "80"], "--utilization"),
        (["twin", "steady", "--clock-mhz", "3000"], "--clock-mhz"),
        (["twin", "steady", "--site", "/nonexistent/site.toml"], "file not found"),
        (["twin", "sweep-supply", "--from-c", "40", "--to-c", "30"], "--to-c"),
        (["twin", "sweep-supply", "--compute-share", "2"], "--compute-share must be within 0..1, got 2"),
    ],
)
def test_twin_user_errors(capsys: pytest.CaptureFixture[str], args: list[str], fragment: str) -> None:
    code, _, err = _run(args, capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    # the subcommand is named, as argparse names it in its own errors (it said "racktwin twin: error:")
    assert err.startswith(f"racktwin twin {args[1]}: error: "), err


@pytest.mark.parametrize("action", ["steady", "sweep-supply"])
def test_twin_argument_errors_name_the_subcommand(capsys: pytest.CaptureFixture[str], action: str) -> None:
    """An option the subcommand does not know, or a bad value of one it knows: the subcommand's usage
    and its name (argparse reported unknown options as "racktwin twin: error:")."""
    for extra in (["--bogus"], ["--level", "x"]):
        assert main(["twin", action, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: racktwin twin {action} "), err
        assert err.strip().splitlines()[-1].startswith(f"racktwin twin {action}: error: "), err


def test_sweep_supply_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["twin", "sweep-supply", "--from-c", "20", "--to-c", "50", "--step-k", "2", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    pts = data["points"]
    assert [p["supply_temp_c"] for p in pts] == [float(t) for t in range(20, 51, 2)]
    assert 20.0 < data["best_supply_temp_c"] < 50.0
    powers = [p["facility_power_w"] for p in pts]
    assert min(powers) == data["best_facility_power_w"]
    code, out, _ = _run(["twin", "sweep-supply", "--step-k", "5"], capsys)
    assert code == 0 and "<- best" in out and "least facility power" in out
