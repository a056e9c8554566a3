"""The objective HiGHS holds for the DVFS MILP is the one models.dvfs documents, per hour:
``sum V[j,k] x[j,k] - Vmax - price (a + b IT) - penalty s`` with ``IT = B + sum P x + sum w a``,
so the cost of column ``x[j,k]`` is ``V - price b P``, of ``a[r]`` ``-price b w``, and the offset
``-Vmax - price (a + b B)``; also after a persistent re-solve with another price (a decomposed
problem's part prices IT power at ``it_price`` with ``a = 0``, ``b = 1``), when only parameters change."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from models_helpers import job, problem, rack_cards

from models.dvfs_solver import DvfsSolver
from models.problem import dvfs_tables, facility_line, it_power_range_w
from twin.spec import SiteSpec

pytestmark = pytest.mark.models


def _highs_objective(
    solver: DvfsSolver, n_jobs: int, n_levels: int, idle_racks: list[int]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]:
    """The column costs of x[j,k] and a[r] and the offset in the HiGHS instance the solver holds."""
    model, highs = solver._model, solver._solver
    assert model is not None and highs is not None
    lp = highs._solver_model.getLp()
    cost = np.asarray(lp.col_cost_)
    col = highs._pyomo_var_to_solver_var_map
    x = np.array([[cost[col[id(model.x[j, k])]] for k in range(n_levels)] for j in range(n_jobs)])
    a = np.array([cost[col[id(model.a[r])]] for r in idle_racks])
    return x, a, float(lp.offset_)


def _highs_slack_cost(solver: DvfsSolver) -> float:
    """The column cost of the PUE slack ``s`` (facility W above the target) in the HiGHS instance."""
    model, highs = solver._model, solver._solver
    assert model is not None and highs is not None
    return float(highs._solver_model.getLp().col_cost_[highs._pyomo_var_to_solver_var_map[id(model.s)]])


def test_highs_objective_is_value_less_energy_cost_also_after_a_price_change(site: SiteSpec) -> None:
    # job a fills rack r0, job b half of r1: r1 keeps 32 idle cards, r2..r7 all theirs (columns a[r])
    p = problem(site, [job("a", 64), job("b", 32, priority=2.0)], [rack_cards(0), rack_cards(1, 32)], reserve=4)
    t = dvfs_tables(p, p.supply_temp_c)
    line = facility_line(p.site, p.supply_temp_c, p.ambient_c, *it_power_range_w(p, t))
    idle = [int(r) for r in np.flatnonzero(t.rack_idle > 0)]
    assert idle == list(range(1, 8))
    base_w = float(t.rack_base_w.sum())
    v_max = float(t.job_value.max(axis=1).sum())
    solver = DvfsSolver(persistent=True)

    price_w = p.prices.energy_price_per_kwh / 1000.0  # per W-hour
    solver.solve(p, t, line, time_limit_s=10.0, mip_rel_gap=1e-6)
    x, a, offset = _highs_objective(solver, t.n_jobs, t.n_levels, idle)
    assert x == pytest.approx(t.job_value - price_w * line.b * t.job_power_w, rel=1e-12)
    assert a == pytest.approx(-price_w * line.b * t.rack_wake_w[idle], rel=1e-12)
    assert offset == pytest.approx(-v_max - price_w * (line.a_w + line.b * base_w), rel=1e-12)
    # "- penalty s": each W-hour of facility power above the target costs pue_penalty_per_kwh / 1000
    penalty_w = p.prices.pue_penalty_per_kwh / 1000.0
    assert penalty_w > 0.0  # the problem's default prices (models.problem.Prices: 0.20 per kWh)
    assert _highs_slack_cost(solver) == pytest.approx(-penalty_w, rel=1e-12)

    it_price = 7.5 * price_w  # the same structure: HiGHS's model is updated, not rebuilt
    solver.solve(p, t, line, time_limit_s=10.0, mip_rel_gap=1e-6, it_price_per_wh=it_price)
    assert solver.builds == 1
    x, a, offset = _highs_objective(solver, t.n_jobs, t.n_levels, idle)
    assert x == pytest.approx(t.job_value - it_price * t.job_power_w, rel=1e-12)
    assert a == pytest.approx(-it_price * t.rack_wake_w[idle], rel=1e-12)
    assert offset == pytest.approx(-v_max - it_price * base_w, rel=1e-12)


def _highs_row(solver: DvfsSolver, con: object) -> tuple[npt.NDArray[np.float64], float, float]:
    """One row of the HiGHS instance the solver holds: its dense coefficients and its bounds."""
    highs = solver._solver
    assert highs is not None
    lp = highs._solver_model.getLp()
    row = highs._pyomo_con_to_solver_con_map[con]
    start, index, value = (np.asarray(v) for v in (lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_))
    dense = np.zeros((lp.num_row_, lp.num_col_))
    colwise = lp.a_matrix_.format_ == type(lp.a_matrix_.format_).kColwise
    for outer in range(lp.num_col_ if colwise else lp.num_row_):
        for q in range(start[outer], start[outer + 1]):
            if colwise:
                dense[index[q], outer] += value[q]
            else:
                dense[outer, index[q]] += value[q]
    return dense[row], float(lp.row_lower_[row]), float(lp.row_upper_[row])


def test_highs_pue_row_is_facility_power_within_the_target_also_after_a_price_change(site: SiteSpec) -> None:
    # models.dvfs: (b - pue) IT - s <= -a with IT = B + sum P x + sum w a, so the row holds
    # (b - pue) P for x[j,k], (b - pue) w for a[r], -1 for s, and the upper bound -a - (b - pue) B;
    # a decomposed problem's part switches the row off (a = 0, b = pue = 1): -s <= 0
    p = problem(site, [job("a", 64), job("b", 32, priority=2.0)], [rack_cards(0), rack_cards(1, 32)], reserve=4)
    t = dvfs_tables(p, p.supply_temp_c)
    line = facility_line(p.site, p.supply_temp_c, p.ambient_c, *it_power_range_w(p, t))
    idle = [int(r) for r in np.flatnonzero(t.rack_idle > 0)]
    base_w = float(t.rack_base_w.sum())
    solver = DvfsSolver(persistent=True)
    solver.solve(p, t, line, time_limit_s=10.0, mip_rel_gap=1e-6)
    model, highs = solver._model, solver._solver
    assert model is not None and highs is not None
    col = highs._pyomo_var_to_solver_var_map
    x_cols = [[col[id(model.x[j, k])] for k in range(t.n_levels)] for j in range(t.n_jobs)]
    a_cols = [col[id(model.a[r])] for r in idle]
    s_col = col[id(model.s)]
    coef = line.b - p.site.pue_target
    assert coef != 0.0  # the row's coefficients are not all zero here

    row, lo, hi = _highs_row(solver, model.pue_soft)
    assert row[x_cols] == pytest.approx(coef * t.job_power_w, rel=1e-12)
    assert row[a_cols] == pytest.approx(coef * t.rack_wake_w[idle], rel=1e-12)
    assert row[s_col] == -1.0
    assert lo == -np.inf
    assert hi == pytest.approx(-line.a_w - coef * base_w, rel=1e-12)

    solver.solve(p, t, line, time_limit_s=10.0, mip_rel_gap=1e-6, it_price_per_wh=1e-3)
    assert solver.builds == 1  # updated in place
    row, lo, hi = _highs_row(solver, model.pue_soft)
    assert not row[x_cols].any() and not row[a_cols].any()
    assert row[s_col] == -1.0
    assert hi == 0.0
