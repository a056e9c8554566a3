"""Invalid problem data is refused with a clear ProblemError (a ValueError) before any model is built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypedDict

import numpy as np
import pytest
from models_helpers import job, rack_cards

from models.problem import Margins, Prices, ProblemError, make_problem
from twin.spec import SiteSpec
from twin.workload import JobSpec

pytestmark = pytest.mark.models


def test_problem_error_is_a_value_error() -> None:
    assert issubclass(ProblemError, ValueError)


class ProblemFields(TypedDict, total=False):
    """The ``make_problem`` arguments the cases below set (of the right type, with values it refuses)."""

    jobs: Sequence[JobSpec]
    job_cards: Sequence[Sequence[int]]
    failed: np.ndarray
    die_temp_c: np.ndarray
    rack_limit_w: float | Sequence[float]
    ambient_c: float
    ready_reserve_cards: int


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jobs": [job("a", 600)], "job_cards": [list(range(600))]}, "site has only 512"),
        ({"jobs": [job("a", 8)], "job_cards": [[0, 1, 2, 3, 4, 5, 6, 9999]]}, "unknown card index 9999"),
        ({"jobs": [job("a", 8)], "job_cards": [[0, 1, 2, 3, 4, 5, 6, -1]]}, "unknown card index -1"),
        ({"jobs": [job("a", 8)], "job_cards": [[0, 0, 1, 2, 3, 4, 5, 6]]}, "listed twice"),
        (
            {"jobs": [job("a", 8), job("b", 8)], "job_cards": [list(range(8)), list(range(7, 15))]},
            "card 7 is assigned to both job a and job b",
        ),
        ({"jobs": [job("a", 8), job("a", 8)], "job_cards": [list(range(8)), list(range(8, 16))]}, "appears twice"),
        ({"jobs": [job("a", 8)], "job_cards": [list(range(7))]}, "7 cards given"),
        ({"jobs": [job("a", 8)], "job_cards": []}, "job_cards has 0 entries"),
        ({"die_temp_c": np.full(512, np.nan)}, "die_temp_c: non-finite"),
        ({"rack_limit_w": -50_000.0}, "rack_limit_w must be positive"),
        ({"rack_limit_w": [50_000.0] * 7}, "rack_limit_w: expected shape (8,)"),
        ({"ambient_c": float("nan")}, "ambient_c"),
        ({"ready_reserve_cards": -3}, "ready_reserve_cards must be >= 0"),
        (
            {"jobs": [job("a", 8)], "job_cards": [list(range(8))], "failed": np.arange(512) == 3},
            "card 3 is marked failed but assigned to job a",
        ),
    ],
)
def test_bad_data_is_refused(site: SiteSpec, kwargs: ProblemFields, message: str) -> None:
    with pytest.raises(ProblemError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_problem(site, **kwargs)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: Prices(energy_price_per_kwh=-0.1), "prices.energy_price_per_kwh"),
        (lambda: Prices(card_hour_value=float("nan")), "prices.card_hour_value"),
        (lambda: Margins(rack_margin_w=-1.0), "margins.rack_margin_w"),
    ],
)
def test_bad_prices_and_margins(factory: Callable[[], object], message: str) -> None:
    with pytest.raises(ProblemError, match=message):
        factory()


def test_valid_problem_from_plain_arrays(site: SiteSpec) -> None:
    p = make_problem(
        site,
        jobs=[job("a", 64), job("b", 8)],
        job_cards=[rack_cards(0), rack_cards(1, 8)],
        die_temp_c=np.full(512, 40.0),
        current_level=np.zeros(512, dtype=np.int64),
        queue=[job("q", 32)],
    )
    assert p.n_jobs == 2
    assert int((p.card_job == 0).sum()) == 64 and int((p.card_job == 1).sum()) == 8
    assert p.ready_reserve_cards == 32  # default: the largest queued job
    # measured 40 deg C is below the steady prediction of busy cards: no offset (offsets are only ever >= 0)
    assert float(p.die_offset_k[p.card_job >= 0].max()) == 0.0
    assert float(p.die_offset_k.min()) >= 0.0


def test_the_facility_line_is_fitted_over_the_it_power_every_plan_can_reach(site: SiteSpec) -> None:
    # One 64-card job in r0 (share 0.95), 448 idle cards. The least IT power of any plan is the job at
    # its cheapest level (the slowest: 7) with every idle card asleep; the most, the job at the top
    # clock with every idle card awake. The facility line must be fitted over exactly that range (the
    # twin's assessment of those two plans), or the model prices plans outside its fit.
    from models.plans import assess_dvfs
    from models.problem import dvfs_tables, facility_line, it_power_range_w

    p = make_problem(site, jobs=[job("a", 64)], job_cards=[rack_cards(0)], supply_temp_c=30.0, ready_reserve_cards=0)
    t = dvfs_tables(p)
    assert int(t.cheapest_level[0]) == 7
    least = assess_dvfs(p, np.array([7]), np.zeros(8, dtype=np.int64), 30.0)
    most = assess_dvfs(p, np.array([0]), np.array([0] + [64] * 7), 30.0)
    lo, hi = it_power_range_w(p, t)
    assert lo == pytest.approx(least.it_power_w, rel=1e-9)
    assert hi == pytest.approx(most.it_power_w, rel=1e-9)
    line = facility_line(site, 30.0, p.ambient_c, lo, hi)
    assert (line.it_lo_w, line.it_hi_w) == (lo, hi)
