"""The search behind ``agent.pumps.choose_pump_speeds`` against the exact facility pump: racks re-chosen
one at a time (``_descend_facility_pump``) until none moves, with the facility pump's flow (the racks'
total, split unevenly where their loops differ) kept up to date after every move.

The brute-force test of ``test_pumps`` (40 random instances) passes with a single sweep or with the
total flow left stale after a move; the instances here do not. Each rack's cost per option is what a
slower pump trades: rack pump power (cube of the speed) against the cards' extra leakage power (rising
as the square of the slow-down here, convex as the twin's is); the facility pump costs
1000 W x (total flow / nominal)^3.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agent.pumps import _descend_facility_pump, _facility_w

pytestmark = pytest.mark.agent

OPTIONS = np.array([1.0, 0.75, 0.5])
FAC_W = 1000.0


def _cost(pump_w: list[float], card_w: list[float]) -> np.ndarray:
    """Options x racks: pump_w x s^3 + card_w x ((1 - s) / 0.5)^2."""
    s = OPTIONS[:, None]
    return np.asarray(np.array(pump_w)[None, :] * s**3 + np.array(card_w)[None, :] * ((1.0 - s) / 0.5) ** 2)


def _total(idx: np.ndarray | tuple[int, ...], cost: np.ndarray, mass: np.ndarray) -> float:
    i = np.asarray(idx)
    return float(np.sum(cost[i, np.arange(cost.shape[1])])) + _facility_w(FAC_W, mass, OPTIONS[i])


def _brute_force(cost: np.ndarray, mass: np.ndarray) -> float:
    n = cost.shape[1]
    return min(_total(c, cost, mass) for c in itertools.product(range(OPTIONS.size), repeat=n))


def test_a_rack_moved_early_is_moved_again_once_the_others_have_moved() -> None:
    """Three racks, the third with twice the others' flow (mass 1, 1, 2 of a total 4). Costs per option
    (full, 3/4, 1/2 speed), by hand from pump 200/150/150 W and extra leakage 150/175/150 W at half speed:

        rack 0: 200, 121.875, 175      rack 1: 150, 107.031, 193.75      rack 2: 150, 100.781, 168.75

    The per-rack share (1000 / 3 x s^3) starts every rack at half speed (total flow 2 of 4: 125 W).
    First sweep, the exact price: rack 0 goes to 3/4 (121.875 + 1000 x (2.25/4)^3 = 299.85 W against
    175 + 125 = 300 W); rack 1, with rack 0's move counted (flow 2.25), goes to 3/4 (107.03 + 244.14 =
    351.17 W < 193.75 + 177.98 = 371.73 W); rack 2 stays. Second sweep: with rack 1 at 3/4, rack 0 is
    better back at half speed (175 + 177.98 = 352.98 W < 121.875 + 244.14 = 366.02 W). End: (1/2, 3/4,
    1/2), 450.78 + 177.98 = 628.76 W, the brute-force optimum. One sweep stops at (3/4, 3/4, 1/2), 641.80 W;
    a stale total flow (rack 1 judged as if rack 0 were still at half speed) ends there too."""
    cost = _cost([200.0, 150.0, 150.0], [150.0, 175.0, 150.0])
    np.testing.assert_allclose(cost[:, 0], [200.0, 121.875, 175.0])
    np.testing.assert_allclose(cost[:, 1], [150.0, 107.03125, 193.75])
    mass = np.array([1.0, 1.0, 2.0])
    pinned = np.zeros(3, dtype=bool)
    share = np.argmin(cost + FAC_W / 3 * OPTIONS[:, None] ** 3, axis=0)
    assert share.tolist() == [2, 2, 2]
    best = _descend_facility_pump(cost, OPTIONS, share, pinned, mass, FAC_W)
    assert OPTIONS[best].tolist() == [0.5, 0.75, 0.5]
    assert _total(best, cost, mass) == pytest.approx(628.76, abs=0.01)
    assert _total(best, cost, mass) == pytest.approx(_brute_force(cost, mass), rel=1e-12)
    assert _total(np.array([1, 1, 2]), cost, mass) == pytest.approx(641.80, abs=0.01)  # where one sweep stops


def test_on_convex_costs_with_split_flows_and_die_bounds_the_search_ends_at_the_brute_force_optimum() -> None:
    """Random instances of that kind (2-3 racks, flows split 1-3 : 1-3, the slowest speeds not allowed
    where a die bound would be crossed, a rack pinned at times): the search's total is the least of every
    allowed combination, pinned racks stay at full speed and no speed that is not allowed is chosen.
    (A property, not a mutant killer: about 3 in 10,000 such instances tell one sweep or a stale flow
    from the search; the other tests here are such instances.)"""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(2, 4))
        cost = _cost(list(rng.integers(1, 8, size=n) * 50.0), list(rng.integers(0, 8, size=n) * 25.0))
        for r, k in enumerate(rng.integers(0, OPTIONS.size, size=n)):
            if k:  # the k slowest speeds put a die over its limit
                cost[OPTIONS.size - k :, r] = np.inf
        mass = rng.integers(1, 4, size=n).astype(np.float64)
        pinned = rng.uniform(size=n) < 0.15
        share = np.where(pinned, 0, np.argmin(cost + FAC_W / n * OPTIONS[:, None] ** 3, axis=0))
        best = _descend_facility_pump(cost, OPTIONS, share, pinned, mass, FAC_W)
        allowed = [
            c
            for c in itertools.product(range(OPTIONS.size), repeat=n)
            if all(c[r] == 0 for r in np.flatnonzero(pinned)) and np.all(np.isfinite(cost[list(c), np.arange(n)]))
        ]
        assert _total(best, cost, mass) == pytest.approx(min(_total(c, cost, mass) for c in allowed), rel=1e-12)
        assert np.all(best[pinned] == 0)
        assert np.all(np.isfinite(cost[best, np.arange(n)]))


@pytest.mark.parametrize(
    ("pump_w", "card_w", "mass"),
    [
        ([50.0, 250.0, 150.0], [50.0, 175.0, 175.0], [2.0, 1.0, 1.0]),
        ([250.0, 200.0, 100.0], [125.0, 150.0, 175.0], [1.0, 1.0, 3.0]),
        ([100.0, 100.0, 100.0], [75.0, 175.0, 100.0], [3.0, 3.0, 1.0]),
    ],
)
def test_where_the_flows_split_unevenly_a_later_move_changes_an_earlier_racks_best_speed(
    pump_w: list[float], card_w: list[float], mass: list[float]
) -> None:
    """More instances of the first test's kind (found by searching 20,000 random ones for those where a
    single sweep, or a stale total flow, ends above the brute-force optimum): the search ends at it."""
    cost = _cost(pump_w, card_w)
    m = np.array(mass)
    share = np.argmin(cost + FAC_W / 3 * OPTIONS[:, None] ** 3, axis=0)
    best = _descend_facility_pump(cost, OPTIONS, share, np.zeros(3, dtype=bool), m, FAC_W)
    assert _total(best, cost, m) == pytest.approx(_brute_force(cost, m), rel=1e-12)
