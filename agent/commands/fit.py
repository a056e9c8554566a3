"""``racktwin fit-power`` and ``racktwin fit-thermal``: calibrate the card models from CSV files.

fit-power FILE.csv [--predict CLOCKS] [--json]
    Columns ``clock_mhz,power_w`` and optionally ``utilization`` (0..1) and ``temperature_c``: a clock
    sweep under load (nvidia-smi / DCGM samples). Fits ``twin.power.fit_power`` and prints the
    parameters, the mean absolute percentage error and predictions at ``--predict 900,1100``.
    ``--json`` prints exactly ``{"params": {...}, "mape": float, "predictions": [{"clock_mhz": float,
    "power_w": float}, ...]}``.

fit-thermal FILE.csv [--json]
    Columns ``t_s,power_w,inlet_temp_c,die_temp_c``: a time series of one card. Fits
    ``twin.thermal.fit_thermal`` (first-order response, exact between samples). ``--json`` prints
    ``{"r_th_k_per_w": float, "tau_s": float, "rmse_k": float}``.

Lines starting with ``#`` are comments; extra columns are ignored. A bad file (missing, not UTF-8,
missing columns, a value that is not a finite number, too few distinct points) is one line naming
the file, line and column, exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
import numpy.typing as npt

from agent.commands.common import UserError, print_json
from twin.power import FitError, fit_power
from twin.thermal import ThermalFitError, fit_thermal

FloatArray = npt.NDArray[np.float64]

POWER_COLUMNS = ("clock_mhz", "power_w")
POWER_OPTIONAL = ("utilization", "temperature_c")
THERMAL_COLUMNS = ("t_s", "power_w", "inlet_temp_c", "die_temp_c")
_LINE = "__line__"  # key of the file line number of every data row in read_columns' result


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    if command == "fit-power":
        parser.description = (
            "Fit the card power model P = V^2 (idle + u dyn f/f_top) + leak V (T - T_ref) to a clock "
            "sweep. CSV columns: clock_mhz, power_w, optional utilization (0-1) and temperature_c."
        )
        parser.add_argument("file", metavar="FILE.csv", help="clock sweep samples")
        parser.add_argument(
            "--predict",
            metavar="CLOCKS",
            default="",
            help="comma-separated clocks (MHz) to predict the power at, e.g. 900,1100",
        )
    else:
        parser.description = (
            "Fit a card's effective thermal resistance (die to coolant inlet) and time constant to a "
            "time series. CSV columns: t_s, power_w, inlet_temp_c, die_temp_c."
        )
        parser.add_argument("file", metavar="FILE.csv", help="time series of one card")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace, command: str) -> int:
    if command == "fit-power":
        return _run_power(args)
    return _run_thermal(args)


# ------------------------------------------------------------------------------------------------
def read_columns(path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, FloatArray]:
    """Read numeric columns of a CSV; any problem is a :class:`UserError` naming file, line, column.
    The result also maps ``"__line__"`` to the file line number of each data row."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a CSV file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    lines = [(i, line) for i, line in lines if not line.lstrip().startswith("#")]
    if not lines:
        raise UserError(f"{path}: empty file: expected a header line with columns {', '.join(required)}")
    rows = list(csv.reader([line for _, line in lines]))
    header_line = lines[0][0]
    header = [h.strip() for h in rows[0]]
    missing = [c for c in required if c not in header]
    if missing:
        raise UserError(
            f"{path}:{header_line}: missing column {missing[0]!r} "
            f"(need {', '.join(required)}; found {', '.join(header)})"
        )
    wanted = [c for c in (*required, *optional) if c in header]
    pos = {c: header.index(c) for c in wanted}
    values: dict[str, list[float]] = {c: [] for c in wanted}
    line_numbers: list[float] = []
    for (lineno, _), row in zip(lines[1:], rows[1:], strict=True):
        line_numbers.append(float(lineno))
        for c in wanted:
            j = pos[c]
            if j >= len(row):
                raise UserError(f"{path}:{lineno}: column {c!r}: missing value (the line has {len(row)} fields)")
            raw = row[j].strip()
            try:
                v = float(raw)
            except ValueError:
                raise UserError(f"{path}:{lineno}: column {c!r}: not a number: {raw!r}") from None
            if not math.isfinite(v):
                raise UserError(f"{path}:{lineno}: column {c!r}: must be a finite number, got {raw!r}")
            values[c].append(v)
    if len(rows) < 2:
        raise UserError(f"{path}: no data lines after the header")
    out = {c: np.asarray(v, dtype=np.float64) for c, v in values.items()}
    out[_LINE] = np.asarray(line_numbers, dtype=np.float64)
    return out


def _check_range(path: str, cols: dict[str, FloatArray], name: str, lo: float, hi: float, what: str) -> None:
    if name not in cols:
        return
    arr = cols[name]
    bad = np.flatnonzero((arr < lo) | (arr > hi))
    if bad.size:
        line = int(cols[_LINE][bad[0]])
        raise UserError(f"{path}:{line}: column {name!r}: {what}, got {arr[bad[0]]:g}")


def _parse_clocks(text: str) -> list[float]:
    if not text.strip():
        return []
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = float(part)
        except ValueError:
            raise UserError(f"--predict: not a clock in MHz: {part!r} (write e.g. 900,1100)") from None
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"--predict: clocks must be positive MHz, got {part!r}")
        out.append(v)
    return out


def _run_power(args: argparse.Namespace) -> int:
    path = str(args.file)
    clocks = _parse_clocks(args.predict)
    cols = read_columns(path, POWER_COLUMNS, POWER_OPTIONAL)
    _check_range(path, cols, "clock_mhz", 1e-9, 1e5, "a clock must be positive MHz")
    _check_range(path, cols, "power_w", 1e-9, 1e5, "power must be positive W")
    _check_range(path, cols, "utilization", 0.0, 1.0, "utilization is a fraction 0..1 (not percent)")
    try:
        fit = fit_power(cols["clock_mhz"], cols["power_w"], cols.get("utilization"), cols.get("temperature_c"))
    except FitError as exc:
        raise UserError(f"{path}: {exc}") from None
    preds = [{"clock_mhz": f, "power_w": float(fit.predict_w(f))} for f in clocks]
    if args.json:
        print_json({"params": fit.params(), "mape": fit.mape, "predictions": preds})
        return 0
    n_distinct = int(np.unique(cols["clock_mhz"]).size)
    print(f"fit-power: {path}: {fit.n_samples} samples, {n_distinct} distinct clocks")
    for k, v in fit.params().items():
        print(f"  {k:<22} {v:12.4f}")
    print(f"  {'mape':<22} {100 * fit.mape:11.2f}%")
    if fit.leakage_w_per_k == 0.0 and "temperature_c" not in cols:
        print("  (no temperature_c column: leakage not identifiable, reported as 0)")
    if preds:
        print(f"  {'clock_mhz':>10} {'power_w':>10}")
        for row in preds:
            print(f"  {row['clock_mhz']:10.1f} {row['power_w']:10.1f}")
    return 0


def _run_thermal(args: argparse.Namespace) -> int:
    path = str(args.file)
    cols = read_columns(path, THERMAL_COLUMNS)
    try:
        fit = fit_thermal(cols["t_s"], cols["power_w"], cols["inlet_temp_c"], cols["die_temp_c"])
    except ThermalFitError as exc:
        raise UserError(f"{path}: {exc}") from None
    if args.json:
        print_json({"r_th_k_per_w": fit.r_th_k_per_w, "tau_s": fit.tau_s, "rmse_k": fit.rmse_k})
        return 0
    print(f"fit-thermal: {path}: {fit.n_samples} samples")
    print(f"  r_th_k_per_w  {fit.r_th_k_per_w:10.5f}   (die to coolant inlet)")
    print(f"  tau_s         {fit.tau_s:10.2f}")
    print(f"  rmse_k        {fit.rmse_k:10.3f}")
    return 0
