"""Calibration of the power model against public measurements (../shared/data)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from twin.power import FIT_VOLTAGE_FLOOR_REL, FitError, PowerModel, fit_power
from twin.spec import SiteSpec
from twin.workload import GeneratorConfig, compute_utilization, generate_jobs, noncompute_utilization_of

pytestmark = pytest.mark.unit

PERSEUS = "perseus_stage_profile_gpt3-175b+a100_sxm_bf16.csv"
BIOHPC = "biohpc_cbsugpu08_2xH100_hourly.tsv"


def _perseus(shared_data: Path) -> tuple[np.ndarray, np.ndarray]:
    """Average power per locked clock: total energy / total time over stages and instructions."""
    acc: dict[float, list[float]] = defaultdict(lambda: [0.0, 0.0])
    with open(shared_data / PERSEUS, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            a = acc[float(row["frequency"])]
            a[0] += float(row["time"])
            a[1] += float(row["energy"])
    f = np.array(sorted(acc))
    p = np.array([acc[x][1] / acc[x][0] for x in f])
    return f, p


def test_perseus_fit_on_alternate_clocks_predicts_the_others_within_5_percent(shared_data: Path) -> None:
    f, p = _perseus(shared_data)
    assert f.size == 38
    fit = fit_power(f[::2], p[::2])
    pred = fit.predict_w(f[1::2])
    mape = float(np.mean(np.abs(pred - p[1::2]) / p[1::2]))
    assert mape < 0.05
    # the whole sweep fits within 1%, and P(1005)/P(1410) is the measured 0.57 within 5%
    full = fit_power(f, p)
    assert full.mape < 0.01
    # the reported MAPE is that of the fit's own predictions, relative to the measurements
    assert full.mape == pytest.approx(float(np.mean(np.abs(full.predict_w(f) - p) / p)), rel=1e-12)
    ratio = float(full.predict_w(1005.0) / full.predict_w(1410.0))
    assert ratio == pytest.approx(float(p[f == 1005][0] / p[f == 1410][0]), rel=0.05)


def test_a_generated_job_of_the_profiles_share_draws_the_calibrated_training_power(
    shared_data: Path, site: SiteSpec
) -> None:
    """The card model is calibrated on the Perseus GPT-3 profile's average power over its whole
    computation (utilization 1: 95% of TDP at the top clock, 665 W on the site's card at a 65 deg C
    die). A generated job with that profile's clock-sensitive share must draw exactly that, at every
    clock (its memory-bound part keeps the card busy), and follow the measured curve's shape; jobs
    with exposed communication (lower shares) draw less, never more."""
    f, p = _perseus(shared_data)
    cfg = GeneratorConfig()
    s = cfg.profile_compute_share
    model = PowerModel.from_card(site.card)
    clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
    rel_clock = clocks / clocks[0]

    def power_w(share: float, u_comm: float) -> np.ndarray:
        u = compute_utilization(share, rel_clock, noncompute_utilization_of(share, u_comm, s))
        return np.asarray(model.idle_w + u * model.dyn_w + model.leak_w_per_k * (65.0 - model.reference_temp_c))

    for u_comm in cfg.exposed_communication_utilization_range:
        top = power_w(s, u_comm)
        assert top[0] == pytest.approx(665.0, rel=0.005)
        assert top[0] / site.card.power_limit_w == pytest.approx(p[-1] / 500.0, abs=0.01)  # 95% of TDP
        measured = np.interp(rel_clock, f / f[-1], p / p[-1])
        assert float(np.mean(np.abs(top / top[0] - measured) / measured)) < 0.05
        assert np.all(power_w(cfg.compute_share_range[0], u_comm) < top)
    # the generator's jobs: the same relation, per job
    jobs = generate_jobs(512, 86400.0, seed=3, config=cfg)
    for j in jobs[:200]:
        u_top = float(compute_utilization(j.compute_share, 1.0, j.noncompute_utilization))
        lo = float(compute_utilization(j.compute_share, 1.0, noncompute_utilization_of(j.compute_share, 0.1, s)))
        hi = float(compute_utilization(j.compute_share, 1.0, noncompute_utilization_of(j.compute_share, 0.3, s)))
        assert lo - 1e-12 <= u_top <= hi + 1e-12 <= 1.0 + 1e-12


def test_biohpc_idle_leakage_slope_matches_the_spec_low_power_parameters(shared_data: Path, site: SiteSpec) -> None:
    power, temp = [], []
    with open(shared_data / BIOHPC, encoding="utf-8-sig") as fh:
        for line in fh:
            if not line.startswith("cbsugpu"):
                continue  # the SQL footer
            cols = line.rstrip("\n").split("\t")
            p_ave, t_ave, u_max = float(cols[2]), float(cols[5]), float(cols[10])
            if u_max == 0.0 and 32.0 <= t_ave <= 37.0:  # idle hours in the low-power state
                power.append(p_ave)
                temp.append(t_ave)
    assert len(power) > 1000
    slope, intercept = np.polyfit(temp, power, 1)
    card = site.card
    assert slope == pytest.approx(card.low_power_leakage_w_per_k, abs=0.05)
    at_35 = card.low_power_idle_w + card.low_power_leakage_w_per_k * (35.0 - card.reference_temp_c)
    assert at_35 == pytest.approx(slope * 35.0 + intercept, abs=1.0)


def test_biohpc_active_idle_hours_match_the_spec_idle_power_and_leakage(shared_data: Path, site: SiteSpec) -> None:
    """The active idle state (no utilization, above the low-power state's ~50 W): every 1/8 K bin of
    40-44 deg C with five hours or more within 1 W of idle_power_w + leakage_w_per_k (T - 42)."""
    by_temp: dict[float, list[float]] = defaultdict(list)
    with open(shared_data / BIOHPC, encoding="utf-8-sig") as fh:
        for line in fh:
            if not line.startswith("cbsugpu"):
                continue
            cols = line.rstrip("\n").split("\t")
            p_ave, p_min, t_ave, u_max = float(cols[2]), float(cols[3]), float(cols[5]), float(cols[10])
            if u_max == 0.0 and p_min > 70.0 and 40.0 <= t_ave < 44.0:
                by_temp[t_ave].append(p_ave)
    bins = {t: float(np.mean(p)) for t, p in by_temp.items() if len(p) >= 5}
    assert len(bins) >= 20 and sum(len(p) for p in by_temp.values()) > 500
    card = site.card
    model = {t: card.idle_power_w + card.leakage_w_per_k * (t - card.reference_temp_c) for t in bins}
    worst = max(abs(model[t] - bins[t]) for t in bins)
    assert worst <= 1.0, f"worst bin off by {worst:.2f} W"
    hours_41_43 = [p for t, ps in by_temp.items() if 41.0 <= t <= 43.0 for p in ps]
    assert float(np.mean(hours_41_43)) == pytest.approx(card.idle_power_w, abs=0.5)


def test_fit_recovers_synthetic_parameters_with_temperature() -> None:
    rng = np.random.default_rng(0)
    f = np.repeat(np.linspace(900, 1980, 12), 5)
    t = rng.uniform(40, 80, f.size)
    u = rng.uniform(0.5, 1.0, f.size)
    v = np.maximum(0.85, 1 - 0.6 * (1 - f / 1980))
    p = v**2 * (80 + u * 550 * f / 1980) + 0.5 * v * (t - np.median(t))
    fit = fit_power(f, p, u, t)
    assert fit.mape < 0.002
    assert fit.leakage_w_per_k == pytest.approx(0.5, rel=0.05)
    assert fit.dynamic_power_w == pytest.approx(550, rel=0.02)
    # it predicts the generating model at the corners of the sweep within 0.1%: the slowest clock
    # (V on its 0.85 floor) with a hot die, where leakage scales with V (not V^2), and the top clock
    t_med = float(np.median(t))
    for clock, util, temp in [(900.0, 1.0, 80.0), (1980.0, 1.0, 40.0), (900.0, 0.5, 40.0)]:
        v_c = max(0.85, 1 - 0.6 * (1 - clock / 1980))
        true_w = v_c**2 * (80 + util * 550 * clock / 1980) + 0.5 * v_c * (temp - t_med)
        assert float(fit.predict_w(clock, util, temp)) == pytest.approx(true_w, rel=1e-3)


def test_a_temperature_spread_too_narrow_leaves_leakage_unidentified() -> None:
    """A sweep whose die temperature spans only 0.4 K (under LEAKAGE_MIN_TEMP_SPAN_K) cannot
    separate leakage from idle power: the slope is reported as 0 and flagged as not identified."""
    rng = np.random.default_rng(0)
    f = np.repeat(np.linspace(900, 1980, 12), 5)
    u = rng.uniform(0.5, 1.0, f.size)
    t = 50.0 + np.linspace(0.0, 0.4, f.size)
    v = np.maximum(0.85, 1 - 0.6 * (1 - f / 1980))
    fit = fit_power(f, v**2 * (80 + u * 550 * f / 1980) + 0.5 * v * (t - 50.2), u, t)
    assert not fit.leakage_identified and fit.leakage_w_per_k == 0.0
    assert fit.dynamic_identified


@pytest.mark.parametrize(
    ("floor_rel", "slope_rel", "fitted_floor_rel"),
    [(0.4, 1.0, 0.4), (0.3, 1.0, 0.4), (1.0, 0.0, None), (0.6, 3.0, None)],
)
def test_the_voltage_floor_is_fitted_within_its_search_range_at_its_edges(
    floor_rel: float, slope_rel: float, fitted_floor_rel: float | None
) -> None:
    """Sweeps whose voltage curve lies at or past the edges of ``FIT_VOLTAGE_FLOOR_REL`` (a floor at
    its lower bound 0.4, under it at 0.3, no floor and no slope: V constant, and a slope past the
    searched 0..2): the fit stays within the range, its refined grids never inverted; a floor of 0.4 is
    recovered exactly and one of 0.3 is reported at the bound."""
    f = np.linspace(200.0, 1400.0, 25)
    v = np.maximum(floor_rel, 1.0 - slope_rel * (1.0 - f / 1400.0))
    fit = fit_power(f, v**2 * (80.0 + 300.0 * f / 1400.0))
    lo, hi = FIT_VOLTAGE_FLOOR_REL
    assert lo <= fit.voltage_floor_rel <= hi and 0.0 <= fit.voltage_slope_rel <= 2.2
    if fitted_floor_rel is not None:
        assert fit.voltage_floor_rel == fitted_floor_rel
    if floor_rel >= lo and slope_rel <= 2.0:  # within the model's reach: predicted to rounding
        assert fit.mape < 1e-6


def test_fit_refuses_too_few_clocks_and_nan() -> None:
    with pytest.raises(FitError, match="distinct clocks"):
        fit_power(np.array([1000.0, 1000.0, 1200.0]), np.array([300.0, 301.0, 350.0]))
    with pytest.raises(FitError, match="non-finite"):
        fit_power(np.array([900.0, 1000.0, 1100.0, 1200.0]), np.array([300.0, np.nan, 340.0, 350.0]))


def test_perseus_derived_example_csv_reproduces_the_holdout_check() -> None:
    """The committed derivative examples/sweep-perseus.csv (average power per clock of the Perseus
    file) supports the same check where ../shared is not beside the checkout."""
    path = Path(__file__).resolve().parents[2] / "examples" / "sweep-perseus.csv"
    rows = [line.split(",") for line in path.read_text().splitlines() if line and not line.startswith("#")]
    header, data = rows[0], np.array([[float(x) for x in r] for r in rows[1:]])
    f, p = data[:, header.index("clock_mhz")], data[:, header.index("power_w")]
    assert f.size == 38
    fit = fit_power(f[::2], p[::2])
    mape = float(np.mean(np.abs(fit.predict_w(f[1::2]) - p[1::2]) / p[1::2]))
    assert mape < 0.05
