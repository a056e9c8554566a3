"""``racktwin fit-power`` and ``racktwin fit-thermal``: calibrate the card models from CSV files.

fit-power FILE.csv [--predict CLOCKS] [--json]
    Columns ``clock_mhz,power_w`` and optionally ``utilization`` (0..1) and ``temperature_c``: a clock
    sweep under load (nvidia-smi / DCGM samples). Fits ``twin.power.fit_power`` and prints the
    parameters, the mean absolute percentage error and predictions at ``--predict 900,1100``.
    Values must be a card's: 0 < clock_mhz < 10000, 0 < power_w < 10000, -50 < temperature_c < 200;
    a sweep with every clock under 50 MHz (in GHz?) or every power under 5 W (in kW?) is refused.
    A ``--predict`` clock outside half the lowest to 1.5 times the highest measured clock is refused
    (one line on stderr); one outside the measured clocks but within that span is predicted, with a
    warning line on stderr that the prediction extrapolates the fit. A parameter the sweep cannot
    identify (leakage without a varying temperature_c, dynamic power with utilization 0 throughout)
    is reported as 0 with a note saying so.
    ``--json`` prints exactly ``{"params": {...}, "mape": float, "predictions": [{"clock_mhz": float,
    "power_w": float}, ...]}``.

fit-thermal FILE.csv [--json]
    Columns ``t_s,power_w,inlet_temp_c,die_temp_c``: a time series of one card. Fits
    ``twin.thermal.fit_thermal`` (first-order response, exact between samples). Values must be a
    card's: 0 < power_w < 10000 (not all under 5 W), -50 < inlet_temp_c, die_temp_c < 200. A time
    constant at the upper end of the search (the die does not settle within the series) is refused;
    one at the lower end (the die follows the power within a sample) is printed with a warning line
    on stderr. So is one beyond ``MAX_PLAUSIBLE_TAU_S`` (1000 s), which no cold plate and die has:
    the warning names the likely mistake, ``t_s`` in milliseconds (tau comes out 1000 times too long;
    r_th_k_per_w, the steady-state gain, holds either way). So is a fit whose ``rmse_k`` is over
    ``MAX_PLAUSIBLE_RMSE_SHARE`` (20%) of the range of the die's rise over the inlet: the model explains
    little of the series (a power column inverted or another card's, temperature columns swapped).
    ``--json`` prints ``{"r_th_k_per_w": float, "tau_s": float, "rmse_k": float}``.

Lines starting with ``#`` are comments; extra columns are ignored. A bad file (missing, not UTF-8,
missing columns, a column named twice, a line with more or fewer fields than the header, a value
that is not a finite number or out of range, a ``t_s`` not after the previous line's, too few
distinct points) is one line naming the file, line and column. Files are read as job traces are
(``twin.workload.read_csv_table``). What each exit status means: :data:`EXIT_STATUSES` (``--help``
and the README's "Exit statuses" give its words).
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import numpy.typing as npt

from agent.commands.common import UserError, path_arg, print_json, sigterm_interrupts
from twin.power import LEAKAGE_MIN_TEMP_SPAN_K, FitError, fit_power
from twin.thermal import ThermalFitError, fit_thermal
from twin.workload import CsvError, read_csv_table

FloatArray = npt.NDArray[np.float64]

POWER_COLUMNS = ("clock_mhz", "power_w")
POWER_OPTIONAL = ("utilization", "temperature_c")
THERMAL_COLUMNS = ("t_s", "power_w", "inlet_temp_c", "die_temp_c")
_LINE = "__line__"  # key of the file line number of every data row in read_columns' result

#: what each exit status of ``racktwin fit-power`` and ``racktwin fit-thermal`` means, as their ``--help``
#: and the README (Command line) say it
EXIT_STATUSES = (
    "Exit status 0 with the fit (a warning on stderr, such as a prediction that extrapolates or a time "
    "constant no card has, does not change it); 2 for a bad option or file or data the model cannot be "
    "fitted to (one line on stderr); 130 when stopped by Ctrl-C or SIGTERM; 141 when the reader of its output went "
    "away before all of it was written (`| head`)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.epilog = f"{EXIT_STATUSES} docs/twin.md"
    if command == "fit-power":
        parser.description = (
            "Fit the card power model P = V^2 (idle + u dyn f/f_top) + leak V (T - T_ref) to a clock "
            "sweep. CSV columns: clock_mhz, power_w, optional utilization (0-1) and temperature_c."
        )
        parser.add_argument("file", type=path_arg, metavar="FILE.csv", help="clock sweep samples")
        parser.add_argument(
            "--predict",
            metavar="CLOCKS",
            default="",
            help="comma-separated clocks (MHz) to predict the power at, e.g. 900,1100; clocks outside half the "
            "lowest to 1.5 times the highest clock of the file are refused, those outside the file's clocks "
            "are predicted with a warning on stderr (the fit extrapolates)",
        )
    else:
        parser.description = (
            "Fit a card's effective thermal resistance (die to coolant inlet) and time constant to a "
            "time series. CSV columns: t_s, power_w, inlet_temp_c, die_temp_c."
        )
        parser.add_argument("file", type=path_arg, metavar="FILE.csv", help="time series of one card")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace, command: str) -> int:
    with sigterm_interrupts():  # as Ctrl-C: exit status 130 with one line, not killed without a word
        if command == "fit-power":
            return _run_power(args)
        return _run_thermal(args)


# ------------------------------------------------------------------------------------------------
def read_columns(path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, FloatArray]:
    """Read numeric columns of a CSV; any problem is a :class:`UserError` naming file, line, column.
    The result also maps ``"__line__"`` to the file line number of each data row. The file is read
    as a trace is (``twin.workload.read_csv_table``): a column named twice and a line with more or
    fewer fields than the header has columns are refused."""
    try:
        table = read_csv_table(path)
    except CsvError as exc:
        raise UserError(str(exc)) from None
    if not table.header:
        raise UserError(f"{path}: empty file: expected a header line with columns {', '.join(required)}")
    header = table.header
    missing = [c for c in required if c not in header]
    if missing:
        raise UserError(
            f"{path}:{table.header_line}: missing column {missing[0]!r} "
            f"(need {', '.join(required)}; found {', '.join(header)})"
        )
    if not table.rows:
        raise UserError(f"{path}: no data lines after the header")
    wanted = [c for c in (*required, *optional) if c in header]
    pos = {c: header.index(c) for c in wanted}
    values: dict[str, list[float]] = {c: [] for c in wanted}
    line_numbers: list[float] = []
    for lineno, row in table.rows:
        line_numbers.append(float(lineno))
        for c in wanted:
            raw = row[pos[c]]
            try:
                v = float(raw)
            except ValueError:
                raise UserError(f"{path}:{lineno}: column {c!r}: not a number: {raw!r}") from None
            if not math.isfinite(v):
                raise UserError(f"{path}:{lineno}: column {c!r}: must be a finite number, got {raw!r}")
            values[c].append(v)
    out = {c: np.asarray(v, dtype=np.float64) for c, v in values.items()}
    out[_LINE] = np.asarray(line_numbers, dtype=np.float64)
    return out


#: Values a clock sweep of one card can hold: column -> (lo, hi, what a value outside is). The
#: bounds are open: nonsense (a power of 1e300 W, a clock in Hz instead of MHz) is refused, not fitted.
POWER_RANGES: dict[str, tuple[float, float, str]] = {
    "clock_mhz": (0.0, 10_000.0, "clock {v:g} MHz out of range (0 < f < 10000 MHz)"),
    "power_w": (0.0, 10_000.0, "power {v:g} W is not a card's power (0 < P < 10000 W)"),
    "temperature_c": (-50.0, 200.0, "temperature {v:g} deg C is not a die temperature (-50 < T < 200 deg C)"),
}

#: The same for a card's time series (fit-thermal); ``t_s`` is free (relative or epoch seconds).
THERMAL_RANGES: dict[str, tuple[float, float, str]] = {
    "power_w": POWER_RANGES["power_w"],
    "inlet_temp_c": (-50.0, 200.0, "temperature {v:g} deg C is not a coolant temperature (-50 < T < 200 deg C)"),
    "die_temp_c": POWER_RANGES["temperature_c"],
}

#: A column whose every value is under its floor is in the wrong unit: column -> (floor, unit,
#: the wrong unit it looks like). No card's clock sweep stays under 50 MHz (GPUs clock down to
#: ~200 MHz at the least; the Perseus A100 sweep spans 855-1410 MHz) and no card draws under 5 W
#: throughout (the Perseus sweep: 237-476 W; the BioHPC H100s: 47.9 W the lowest hourly minimum),
#: while a sweep in GHz or kW of any card up to 10000 MHz or 10000 W lies entirely below the
#: floors. One low value alone is not refused.
UNIT_FLOORS: dict[str, tuple[float, str, str]] = {
    "clock_mhz": (50.0, "MHz", "GHz"),
    "power_w": (5.0, "W", "kW"),
}

#: A fitted die-to-inlet time constant above this (s) is no liquid-cooled card's: the die (the example
#: site's 60 J/K behind 0.03 K/W, ~2 s) and its cold plate (390 J/K behind 0.023-0.039 K/W, 9-15 s)
#: settle within seconds to a minute (examples/thermal-step.csv fits 6.45 s); even ten times the
#: plate's mass at twice its resistance stays under 500 s. Beyond it, ``t_s`` is most likely in
#: milliseconds, which makes tau 1000 times too long (1.8 s to 6000 s and more) and leaves R as it is.
MAX_PLAUSIBLE_TAU_S = 1000.0
#: An error of the fitted response (``rmse_k``) above this share of the range of the die's rise over the
#: inlet means the first-order model explains little of the series: columns swapped or inverted, another
#: card's power, a throttling die. A clean fit is far below it (examples/thermal-step.csv: 1.6%, its
#: noise of 0.2 K sd included; 0.6-0.8% sampled every 10-20 s); its power column inverted: 36-39%
#: (R comes out positive all the same).
MAX_PLAUSIBLE_RMSE_SHARE = 0.2

#: ``--predict`` clocks are refused outside this multiple of the fitted clock range (lowest x 0.5
#: to highest x 1.5); inside it but outside the measured clocks, a warning says the fit extrapolates.
PREDICT_SPAN = (0.5, 1.5)


def _check_range(path: str, cols: dict[str, FloatArray], name: str, lo: float, hi: float, what: str) -> None:
    """Refuse values of column ``name`` outside the open range (lo, hi); ``what`` is the problem,
    formatted with the value ``v``."""
    if name not in cols:
        return
    arr = cols[name]
    bad = np.flatnonzero((arr <= lo) | (arr >= hi))
    if bad.size:
        line = int(cols[_LINE][bad[0]])
        raise UserError(f"{path}:{line}: column {name!r}: {what.format(v=float(arr[bad[0]]))}")


def _check_unit_floor(path: str, cols: dict[str, FloatArray], name: str) -> None:
    """Refuse column ``name`` when every value is under its ``UNIT_FLOORS`` floor (wrong unit);
    the message names the line of the largest value."""
    if name not in cols:
        return
    floor, unit, wrong = UNIT_FLOORS[name]
    arr = cols[name]
    top = int(np.argmax(arr))
    if float(arr[top]) < floor:
        line = int(cols[_LINE][top])
        raise UserError(
            f"{path}:{line}: column {name!r}: {float(arr[top]):g} {unit} is the largest value, and no card's data "
            f"stays under {floor:g} {unit} (wrong unit? this column is in {unit}, not {wrong})"
        )


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


def _check_predict(path: str, clocks: list[float], measured: FloatArray) -> None:
    """Refuse ``--predict`` clocks far outside the measured ones; warn (stderr) for those outside."""
    f_min, f_max = float(measured.min()), float(measured.max())
    lo, hi = PREDICT_SPAN[0] * f_min, PREDICT_SPAN[1] * f_max
    for f in clocks:
        if not lo <= f <= hi:
            raise UserError(
                f"--predict {f:g}: outside {lo:g}-{hi:g} MHz (half the lowest to 1.5 times the highest clock "
                f"of {path}, {f_min:g}-{f_max:g} MHz): the fitted model does not reach that far"
            )
    outside = [f for f in clocks if not f_min <= f <= f_max]
    if outside:
        print(
            f"racktwin fit-power: warning: --predict {', '.join(f'{f:g}' for f in outside)} MHz: outside the "
            f"measured clocks of {path} ({f_min:g}-{f_max:g} MHz): the prediction extrapolates the fit",
            file=sys.stderr,
            flush=True,
        )


def _run_power(args: argparse.Namespace) -> int:
    path = str(args.file)
    clocks = _parse_clocks(args.predict)
    cols = read_columns(path, POWER_COLUMNS, POWER_OPTIONAL)
    for name, (lo, hi, what) in POWER_RANGES.items():
        _check_range(path, cols, name, lo, hi, what)
    for name in POWER_COLUMNS:
        _check_unit_floor(path, cols, name)
    utilization = cols.get("utilization")
    if utilization is not None:
        bad = np.flatnonzero((utilization < 0.0) | (utilization > 1.0))
        if bad.size:
            line = int(cols[_LINE][bad[0]])
            raise UserError(
                f"{path}:{line}: column 'utilization': utilization is a fraction 0..1 (not percent), "
                f"got {utilization[bad[0]]:g}"
            )
    try:
        fit = fit_power(cols["clock_mhz"], cols["power_w"], cols.get("utilization"), cols.get("temperature_c"))
    except FitError as exc:
        raise UserError(f"{path}: {exc}") from None
    _check_predict(path, clocks, cols["clock_mhz"])
    preds = [{"clock_mhz": f, "power_w": float(fit.predict_w(f))} for f in clocks]
    if args.json:
        print_json({"params": fit.params(), "mape": fit.mape, "predictions": preds})
        return 0
    n_distinct = int(np.unique(cols["clock_mhz"]).size)
    print(f"fit-power: {path}: {fit.n_samples} samples, {n_distinct} distinct clocks")
    for k, v in fit.params().items():
        print(f"  {k:<22} {v:12.4f}")
    print(f"  {'mape':<22} {100 * fit.mape:11.2f}%")
    if not fit.leakage_identified:
        if "temperature_c" not in cols:
            print("  (no temperature_c column: leakage not identifiable, reported as 0)")
        else:
            span_k = float(np.ptp(cols["temperature_c"]))
            print(
                f"  (temperature_c spans {span_k:g} K, not more than {LEAKAGE_MIN_TEMP_SPAN_K:g} K: "
                "leakage not identifiable, reported as 0)"
            )
    if not fit.dynamic_identified:
        print("  (utilization 0 on every line: dynamic power not identifiable, reported as 0)")
    if preds:
        print(f"  {'clock_mhz':>10} {'power_w':>10}")
        for row in preds:
            print(f"  {row['clock_mhz']:10.1f} {row['power_w']:10.1f}")
    return 0


def _run_thermal(args: argparse.Namespace) -> int:
    path = str(args.file)
    cols = read_columns(path, THERMAL_COLUMNS)
    for name, (lo, hi, what) in THERMAL_RANGES.items():
        _check_range(path, cols, name, lo, hi, what)
    _check_unit_floor(path, cols, "power_w")
    t_s = cols["t_s"]
    back = np.flatnonzero(np.diff(t_s) <= 0.0)
    if back.size:  # named here with its line: twin.thermal only knows the series is not increasing
        k = int(back[0]) + 1
        raise UserError(
            f"{path}:{int(cols[_LINE][k])}: column 't_s': {t_s[k]:g} s is not after the previous sample's "
            f"{t_s[k - 1]:g} s (t_s must be strictly increasing)"
        )
    try:
        fit = fit_thermal(cols["t_s"], cols["power_w"], cols["inlet_temp_c"], cols["die_temp_c"])
    except ThermalFitError as exc:
        raise UserError(f"{path}: {exc}") from None
    if fit.tau_at_lower_bound:
        print(
            f"racktwin fit-thermal: warning: {path}: tau_s {fit.tau_s:.3g} s is the lower end of the search "
            f"(the shortest sample interval is {float(np.diff(cols['t_s']).min()):g} s): the die follows the power "
            "within one sample, so the time constant is not identified (sample faster to measure it); "
            "r_th_k_per_w, the steady-state gain, still holds",
            file=sys.stderr,
            flush=True,
        )
    elif fit.tau_s > MAX_PLAUSIBLE_TAU_S:
        print(
            f"racktwin fit-thermal: warning: {path}: tau_s {fit.tau_s:.4g} s is implausible for a die and its cold "
            f"plate (they settle within seconds to a minute; over {MAX_PLAUSIBLE_TAU_S:g} s is none's) and the median "
            f"sample interval is {float(np.median(np.diff(cols['t_s']))):g} s: is t_s in milliseconds? (then tau_s "
            f"is {fit.tau_s / 1000.0:.3g} s: divide t_s by 1000); r_th_k_per_w, the steady-state gain, holds "
            "either way",
            file=sys.stderr,
            flush=True,
        )
    rise_range_k = float(np.ptp(cols["die_temp_c"] - cols["inlet_temp_c"]))
    # (not with tau at the lower end: a die that follows the power within a sample misses the steps by a
    # sample, which is that warning's case; the example sampled every 40 s errs by 30% of its range so)
    if not fit.tau_at_lower_bound and fit.rmse_k > MAX_PLAUSIBLE_RMSE_SHARE * rise_range_k:
        print(
            f"racktwin fit-thermal: warning: {path}: the fit explains little of the series: rmse_k {fit.rmse_k:.3g} K "
            f"against a {rise_range_k:.3g} K range of the die's rise over the inlet (over "
            f"{MAX_PLAUSIBLE_RMSE_SHARE:.0%} of it): check that power_w is this card's power and rises with its "
            "die's temperature (not inverted or shifted) and that die_temp_c and inlet_temp_c are not swapped; "
            "r_th_k_per_w and tau_s are not to be trusted",
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        print_json({"r_th_k_per_w": fit.r_th_k_per_w, "tau_s": fit.tau_s, "rmse_k": fit.rmse_k})
        return 0
    print(f"fit-thermal: {path}: {fit.n_samples} samples")
    print(f"  r_th_k_per_w  {fit.r_th_k_per_w:10.5f}   (die to coolant inlet)")
    print(f"  tau_s         {fit.tau_s:10.2f}")
    print(f"  rmse_k        {fit.rmse_k:10.3f}")
    return 0
