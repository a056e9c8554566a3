"""Mutation audit of ``twin.thermal``: what the existing tests left unchecked.

Each test kills a mutant that passed every test that covers the module: a network that kept its
step propagator across a parameter change, a fit that held the inlet of the next sample over a
step, a golden-section search bracketed on one side of the grid's best point only, and a fit that
returned a negative thermal resistance.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from twin.spec import SiteSpec
from twin.thermal import ThermalFitError, ThermalNetwork, ThermalParams, fit_thermal

pytestmark = pytest.mark.unit


def _first_order_die(t: np.ndarray, power: np.ndarray, inlet: np.ndarray, r: float, tau: float) -> np.ndarray:
    """Exactly the model ``fit_thermal`` fits: tau dT/dt = T_in + R P - T, with power and inlet held
    from each sample to the next (zero-order hold), starting at the steady state of the first sample."""
    die = np.empty(t.size)
    die[0] = inlet[0] + r * power[0]
    for k in range(1, t.size):
        a = np.exp(-(t[k] - t[k - 1]) / tau)
        die[k] = a * die[k - 1] + (1.0 - a) * (inlet[k - 1] + r * power[k - 1])
    return die


def test_new_parameters_replace_the_cached_step(site: SiteSpec) -> None:
    """A fault or a calibration changes the parameters of a running network (``set_params``, as the
    plant and the estimator do): the next step at a ``dt`` already used must follow the new
    parameters, not the propagator cached for the old ones. A plate fouled to 4 x its resistance
    (0.092 K/W instead of 0.0230) warms the die faster and further: the step equals a fresh network's."""
    params = ThermalParams.from_site(site.with_supernodes(1))
    net = ThermalNetwork(params)
    n = params.c_die_j_per_k.size
    power = np.full(n, 650.0)
    die, plate = np.full(n, 30.0), np.full(n, 30.0)
    clean = net.step(die, plate, power, 30.0, 5.0)
    fouled = dataclasses.replace(params, r_case_coolant_k_per_w=params.r_case_coolant_k_per_w * 4.0)
    net.set_params(fouled)
    after = net.step(die, plate, power, 30.0, 5.0)
    fresh = ThermalNetwork(fouled).step(die, plate, power, 30.0, 5.0)
    np.testing.assert_allclose(after[0], fresh[0], rtol=1e-12)
    np.testing.assert_allclose(after[1], fresh[1], rtol=1e-12)
    assert np.all(after[1] > clean[1])  # the fouled plate holds more of the heat


def test_fit_thermal_follows_an_inlet_that_moves() -> None:
    """The coolant inlet is not constant (a new supply set-point, the loop warming with its load):
    on samples of exactly the fitted model with the inlet stepping 30 -> 36 deg C at 300 s and then
    ramping 0.01 K/s, besides the power steps, the fit returns R 0.05 K/W and tau 30 s to rounding.
    (Every other fit test holds the inlet constant: a fit driving the die with the next sample's
    inlet went unnoticed.)"""
    t = np.arange(0.0, 900.0, 1.0)
    power = np.where((t // 120) % 2 == 0, 650.0, 150.0)
    inlet = np.where(t < 300.0, 30.0, 36.0) + np.where(t >= 600.0, 0.01 * (t - 600.0), 0.0)
    die = _first_order_die(t, power, inlet, r=0.05, tau=30.0)
    fit = fit_thermal(t, power, inlet, die)
    assert fit.r_th_k_per_w == pytest.approx(0.05, rel=1e-9)
    assert fit.tau_s == pytest.approx(30.0, rel=1e-9)
    assert fit.rmse_k < 1e-6


@pytest.mark.parametrize("tau_s", [2.0, 7.0, 13.0, 45.0, 110.0])
def test_fit_thermal_finds_any_time_constant_between_its_grid_points(tau_s: float) -> None:
    """``tau`` is searched on an 80-point log grid, then refined by golden section around the grid's
    best point: the optimum may lie on either side of it, so time constants from seconds to minutes
    (a bare die to a slow plate) come back to rounding, with R 0.04 K/W."""
    t = np.arange(0.0, 1200.0, 0.5)
    power = np.where((t // 150) % 2 == 0, 600.0, 120.0)
    inlet = np.full(t.size, 32.0)
    die = _first_order_die(t, power, inlet, r=0.04, tau=tau_s)
    fit = fit_thermal(t, power, inlet, die)
    assert fit.tau_s == pytest.approx(tau_s, rel=1e-6)
    assert fit.r_th_k_per_w == pytest.approx(0.04, rel=1e-6)


def test_fit_thermal_refuses_die_and_inlet_columns_swapped() -> None:
    """With the die and inlet columns swapped the "die" sits under the "inlet" by R P: the fitted
    resistance is negative, and the fit is refused with the message that says to check the columns
    rather than returned as a negative thermal resistance (-0.05 K/W)."""
    t = np.arange(0.0, 900.0, 1.0)
    power = np.where((t // 120) % 2 == 0, 650.0, 150.0)
    inlet = np.full(t.size, 30.0)
    die = _first_order_die(t, power, inlet, r=0.05, tau=30.0)
    with pytest.raises(ThermalFitError, match="does not rise with power: check the columns"):
        fit_thermal(t, power, die, inlet)


def test_fit_thermal_refuses_a_series_without_a_power_step() -> None:
    """At constant power the die's rise over the inlet cannot be told from a sensor offset, nor its
    time constant from anything: a series whose power varies by less than 1 W is refused as such,
    not fitted."""
    t = np.arange(0.0, 900.0, 1.0)
    power = 650.0 + 0.4 * np.sin(t / 50.0)
    inlet = np.full(t.size, 30.0)
    die = _first_order_die(t, power, inlet, r=0.05, tau=30.0)
    with pytest.raises(ThermalFitError, match=r"power_w hardly varies \(< 1 W\)"):
        fit_thermal(t, power, inlet, die)
