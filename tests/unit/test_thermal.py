"""RC network die -> cold plate -> coolant: analytic steady state, exact discretization, fitting."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from twin.spec import SiteSpec
from twin.thermal import (
    ThermalFitError,
    ThermalNetwork,
    ThermalParams,
    first_order_scan,
    fit_thermal,
    plate_resistance_k_per_w,
)

pytestmark = pytest.mark.unit


def _network(site: SiteSpec) -> ThermalNetwork:
    return ThermalNetwork(ThermalParams.from_site(site))


def test_plate_resistance_follows_the_ocp_table(site: SiteSpec) -> None:
    cp = site.cold_plate
    r = plate_resistance_k_per_w(cp.flow_lpm, cp.r_case_to_coolant_k_per_w, np.asarray(cp.flow_lpm))
    np.testing.assert_allclose(r, cp.r_case_to_coolant_k_per_w)
    # between table points linear in 1/flow (the convective term): at 1.1 L/min, between 1.0 L/min
    # (0.0245 K/W) and 1.2 L/min (0.0230 K/W), (1/1.1 - 1/1.2) / (1/1.0 - 1/1.2) = 0.4545 of the way:
    # 0.0230 + 0.4545 x 0.0015 = 0.0236818 K/W (linear in flow would give 0.02375)
    mid = plate_resistance_k_per_w(cp.flow_lpm, cp.r_case_to_coolant_k_per_w, np.array([1.1]))
    assert float(mid[0]) == pytest.approx(0.0236818, rel=1e-5)
    # less flow, more resistance, also below the table (a weak pump)
    low = plate_resistance_k_per_w(cp.flow_lpm, cp.r_case_to_coolant_k_per_w, np.array([0.3, 0.2]))
    assert cp.r_case_to_coolant_k_per_w[0] < low[0] < low[1]


def test_steady_die_temperature_matches_analytic_within_0_1_k(site: SiteSpec) -> None:
    net = _network(site)
    n = site.n_cards
    rng = np.random.default_rng(1)
    power = rng.uniform(50, 700, n)
    inlet = 30.0
    die = np.full(n, inlet)
    plate = np.full(n, inlet)
    for _ in range(40):
        die, plate = net.step(die, plate, power, inlet, 30.0)
    r_total = site.card.r_die_to_case_k_per_w + np.asarray(net.params.r_case_coolant_k_per_w)
    np.testing.assert_allclose(die, inlet + power * r_total, atol=0.1)
    # heat into the coolant equals the electrical power at steady state
    np.testing.assert_allclose(net.heat_to_coolant_w(plate, inlet), power, rtol=1e-9)


@pytest.mark.parametrize("dt_s", [0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0])
def test_exact_discretization_is_stable_and_does_not_overshoot(site: SiteSpec, dt_s: float) -> None:
    net = ThermalNetwork(ThermalParams.from_site(site.with_supernodes(1)))
    n = site.n_cards
    power = np.full(n, 650.0)
    inlet = 35.0
    die_ss, _ = net.steady_state(power, inlet)
    die = np.full(n, inlet)
    plate = np.full(n, inlet)
    horizon = 600.0
    steps = max(round(horizon / dt_s), 1)
    trace = []
    for _ in range(min(steps, 60_000)):
        die, plate = net.step(die, plate, power, inlet, dt_s)
        trace.append(float(die[0]))
    tr = np.asarray(trace)
    assert np.all(np.isfinite(tr))
    assert np.all(np.diff(tr) >= -1e-9), "a heating step response rises monotonically"
    assert tr.max() <= float(die_ss[0]) + 1e-9, "no overshoot"
    assert tr[-1] == pytest.approx(float(die_ss[0]), abs=1e-3)


def test_exact_step_equals_many_small_steps(site: SiteSpec) -> None:
    net = _network(site)
    n = site.n_cards
    power = np.linspace(80, 700, n)
    die0 = np.full(n, 40.0)
    plate0 = np.full(n, 36.0)
    big = net.step(die0, plate0, power, 30.0, 5.0)
    d, p = die0, plate0
    for _ in range(500):
        d, p = net.step(d, p, power, 30.0, 0.01)
    np.testing.assert_allclose(big[0], d, atol=1e-9)
    np.testing.assert_allclose(big[1], p, atol=1e-9)


def test_time_constants_are_seconds_to_tens_of_seconds(site: SiteSpec) -> None:
    fast, slow = _network(site).time_constants_s()
    assert 0.1 < float(fast[0]) < 5.0
    assert 5.0 < float(slow[0]) < 60.0


def test_fit_thermal_recovers_resistance(site: SiteSpec) -> None:
    single = ThermalParams.from_site(site)
    params = ThermalParams(
        single.r_die_case_k_per_w[:1],
        single.r_case_coolant_k_per_w[:1],
        single.c_die_j_per_k[:1],
        single.c_plate_j_per_k[:1],
    )
    net = ThermalNetwork(params)
    t = np.arange(0.0, 900.0, 1.0)
    power = np.where((t // 120) % 2 == 0, 650.0, 150.0)
    inlet = np.full(t.size, 30.0)
    d, p = net.steady_state(np.array([150.0]), 30.0)
    die = np.empty(t.size)
    for k in range(t.size):
        die[k] = d[0]
        d, p = net.step(d, p, power[k : k + 1], 30.0, 1.0)
    fit = fit_thermal(t, power, inlet, die)
    assert fit.r_th_k_per_w == pytest.approx(float(params.r_total_k_per_w[0]), rel=0.02)
    fast, slow = net.time_constants_s()
    assert float(fast[0]) < fit.tau_s < float(slow[0]) * 1.5
    assert fit.rmse_k < 1.0
    assert not fit.tau_at_lower_bound


def test_fit_thermal_refuses_a_time_constant_the_series_does_not_reach() -> None:
    """A die still rising at the end of the series (tau 5000 s, 600 s recorded): the best tau is the
    upper end of the search (5 times the span) and R would be arbitrary: ThermalFitError."""
    t = np.arange(0.0, 600.0, 2.0)
    power = np.where(t < 60.0, 100.0, 600.0)
    a = np.exp(-2.0 / 5000.0)
    die = np.empty(t.size)
    die[0] = 30.0 + 0.05 * power[0]
    for k in range(1, t.size):
        die[k] = a * die[k - 1] + (1 - a) * (30.0 + 0.05 * power[k - 1])
    with pytest.raises(ThermalFitError, match="time constant is not identified: the best fit is the upper end"):
        fit_thermal(t, power, np.full(t.size, 30.0), die)


def test_first_order_scan_equals_the_sample_by_sample_recurrence() -> None:
    """The vectorized scan behind fit_thermal gives every state of x[k+1] = a x[k] + b, as the
    loop does, for irregular steps, a forgotten past (a ~ 0) and two drives at once."""
    rng = np.random.default_rng(5)
    n = 5000
    a = np.exp(-rng.uniform(0.0, 3.0, n))
    a[::97] = 0.0  # a step so long the past is forgotten
    b = rng.normal(50.0, 20.0, (n, 2))
    gain, offset = first_order_scan(a, b)
    x0 = np.array([31.0, 0.0])
    x = x0.copy()
    for k in range(n):
        x = a[k] * x + b[k]
        assert np.allclose(gain[k] * x0 + offset[k], x, rtol=1e-12, atol=1e-9)


def test_the_cold_plate_and_cdu_figures_are_those_of_the_measurements(shared_data: Path, site: SiteSpec) -> None:
    """The spec's plate table is the OCP PG25 table row for row; the CDU's approach, facility flow
    ratio and the loop's largest rise are the Deschutes data sheet's; the pump heads lie within it."""
    with open(shared_data / "ocp_oam_1kW_coldplate_R_vs_flow.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["fluid"] == "PG25"]
    pg25 = [(float(r["flow_lpm"]), float(r["R_thermal_K_per_W"])) for r in rows]
    plate = site.cold_plate
    assert [f for f, _ in pg25] == list(plate.flow_lpm)
    assert [r for _, r in pg25] == list(plate.r_case_to_coolant_k_per_w)
    with open(shared_data / "cdu_datasheet_specs.csv", newline="", encoding="utf-8") as fh:
        deschutes = next(r for r in csv.DictReader(fh) if r["cdu"].startswith("Google_Project_Deschutes"))
    assert site.cdu.approach_k == float(deschutes["approach_K"])
    m_it, m_fac = float(deschutes["it_loop_flow_kg_s"]), float(deschutes["facility_loop_flow_kg_s"])
    assert site.cdu.facility_flow_ratio == pytest.approx(m_fac / m_it, abs=0.005)
    rise_k = float(deschutes["thermal_load_kW"]) * 1e3 / (m_it * site.loop.specific_heat_j_per_kg_k)
    assert site.loop.max_delta_t_k == pytest.approx(rise_k, abs=0.05)
    fac_lo, fac_hi = (float(x) / 1e3 for x in deschutes["facility_loop_dp_Pa"].split("-"))
    assert fac_lo <= site.cdu.facility_pump_head_kpa <= fac_hi
    it_lo, _it_hi = (float(x) / 1e3 for x in deschutes["it_loop_dp_available_Pa"].split("-"))
    assert site.loop.pump_head_kpa <= it_lo  # one rack's short loop needs less than a row-scale CDU offers


def test_time_constants_are_those_of_the_rc_ladder_and_govern_the_step_response(site: SiteSpec) -> None:
    """For the two-node ladder the eigenvalues of the network satisfy, by hand,
    tau_fast x tau_slow = R_dc R_pc C_d C_p and tau_fast + tau_slow = R_pc C_p + (R_dc + R_pc) C_d.
    With the spec's R_dc 0.03 K/W, C_d 60 J/K, C_p 390 J/K and the OCP plate at 1.2 L/min (0.0230 K/W):
    16.146 s^2 and 12.15 s, so tau_slow = 10.6313 s and tau_fast = 1.5187 s. Once the fast mode has
    died out, the die's distance to its steady state shrinks by exp(-dt / tau_slow) per step."""
    net = _network(site)
    fast, slow = net.time_constants_s()
    assert float(slow[0]) == pytest.approx(10.631273, rel=1e-6)
    assert float(fast[0]) == pytest.approx(1.518727, rel=1e-6)
    power = np.full(site.n_cards, 650.0)
    die_ss, _ = net.steady_state(power, 30.0)
    die, plate = np.full(site.n_cards, 30.0), np.full(site.n_cards, 30.0)
    gaps = []
    for _ in range(40):
        die, plate = net.step(die, plate, power, 30.0, 1.0)
        gaps.append(float(die_ss[0] - die[0]))
    assert gaps[-1] / gaps[-2] == pytest.approx(np.exp(-1.0 / 10.631273), rel=1e-6)


def test_fit_thermal_recovers_a_first_order_die_exactly_and_reports_the_noise() -> None:
    """On samples of exactly the model it fits (tau dT/dt = T_in + R P - T, power held between samples,
    tau 30 s, R 0.05 K/W) the fit returns R and tau to rounding and an RMSE of ~0; with 0.2 K of
    Gaussian sensor noise added, the RMSE is that noise, in kelvin."""
    t = np.arange(0.0, 900.0, 1.0)
    power = np.where((t // 120) % 2 == 0, 650.0, 150.0)
    inlet = np.full(t.size, 30.0)
    a = np.exp(-1.0 / 30.0)
    die = np.empty(t.size)
    die[0] = 30.0 + 0.05 * 150.0
    for k in range(1, t.size):
        die[k] = a * die[k - 1] + (1 - a) * (inlet[k - 1] + 0.05 * power[k - 1])
    fit = fit_thermal(t, power, inlet, die)
    assert fit.r_th_k_per_w == pytest.approx(0.05, rel=1e-9)
    assert fit.tau_s == pytest.approx(30.0, rel=1e-9)
    assert fit.rmse_k < 1e-6
    noisy = fit_thermal(t, power, inlet, die + np.random.default_rng(3).normal(0.0, 0.2, t.size))
    assert noisy.r_th_k_per_w == pytest.approx(0.05, rel=0.01)
    assert noisy.rmse_k == pytest.approx(0.2, rel=0.1)
