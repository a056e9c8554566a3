"""Helpers for the model tests: small jobs and problems on the example site."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from models.plans import DvfsPlan
from models.problem import CycleProblem, Margins, Prices, make_problem
from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def job(job_id: str, n: int, share: float = 0.95, priority: float = 1.0, slo: float = 0.0, nu: float = 0.5) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        n_cards=n,
        work_steps=1e5,
        step_time_s=1.0,
        compute_share=share,
        priority=priority,
        noncompute_utilization=nu,
        min_throughput_frac=slo,
    )


def problem(
    site: SiteSpec,
    jobs: Sequence[JobSpec],
    cards: Sequence[Sequence[int]],
    phases: Sequence[Phase] | None = None,
    *,
    limit_w: float | Sequence[float] | npt.NDArray[np.float64] | None = None,
    margin_w: float = 1000.0,
    die_margin_k: float = 2.0,
    supply_c: float = 30.0,
    ambient_c: float = 25.0,
    reserve: int = 0,
    options: Sequence[float] | None = None,
    prices: Prices | None = None,
) -> CycleProblem:
    return make_problem(
        site,
        jobs=jobs,
        job_cards=[np.asarray(c, dtype=np.int64) for c in cards],
        job_phase=phases,
        rack_limit_w=limit_w,
        margins=Margins(margin_w, die_margin_k),
        supply_temp_c=supply_c,
        ambient_c=ambient_c,
        ready_reserve_cards=reserve,
        supply_options_c=options,
        prices=prices,
    )


def rack_cards(r: int, n: int = 64, start: int = 0) -> list[int]:
    """``n`` cards of rack ``r`` (64 cards per rack in the example site) from offset ``start``."""
    return list(range(64 * r + start, 64 * r + start + n))


def card_power_w(site: SiteSpec, share: float, nu: float, level: int, supply_c: float) -> float:
    """Steady power of one busy card in COMPUTE at ``level`` (the twin's own functions)."""
    from twin.power import PowerModel
    from twin.steady import card_steady_power_w
    from twin.thermal import ThermalParams
    from twin.workload import compute_utilization

    model = PowerModel.from_card(site.card)
    clocks = np.asarray(site.card.clocks_mhz)
    u = compute_utilization(share, clocks[level] / clocks[0], nu)
    r = ThermalParams.from_site(site).r_total_k_per_w[:1]
    p, _die = card_steady_power_w(model, np.array([level]), np.atleast_1d(u), np.array([False]), supply_c, r)
    return float(p[0])


def card_die_c(site: SiteSpec, share: float, nu: float, level: int, supply_c: float) -> float:
    from twin.thermal import ThermalParams

    r = float(ThermalParams.from_site(site).r_total_k_per_w[0])
    return supply_c + r * card_power_w(site, share, nu, level, supply_c)


def judge(p: CycleProblem, plan_dvfs: DvfsPlan | None, supply_c: float) -> tuple[np.ndarray, np.ndarray]:
    """(rack power W, card die temperature deg C) of a plan as the twin computes them
    (``twin.steady.site_steady_state`` at the plan's levels and idle states, firmware protection on)."""
    from models.problem import phase_utilization
    from twin.steady import site_steady_state

    assert plan_dvfs is not None, "the plan has no DVFS part to judge"
    level = plan_dvfs.card_level
    low = plan_dvfs.card_low_power
    u = np.zeros(p.n_cards)
    for j, jb in enumerate(p.jobs):
        cards = p.card_job == j
        u[cards] = phase_utilization(jb, p.job_phase[j], p.site, level[cards])
    ss = site_steady_state(
        p.site, level=level, utilization=u, supply_temp_c=supply_c, ambient_c=p.ambient_c, low_power=low | p.failed
    )
    return ss.rack_power_w, ss.die_temp_c
