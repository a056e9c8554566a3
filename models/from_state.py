"""A :class:`models.problem.CycleProblem` from the agent's belief (``twin.state.StateSnapshot``).

The snapshot's running jobs, card-to-job map, failed cards, measured die temperatures and current
levels become a problem through :func:`models.problem.make_problem`, so the same validation holds.
Reconciliation of what a live belief may hold but a problem must not:

* a failed card still listed in a running job leaves the job (the job keeps its other cards);
* a job's size is the number of cards the belief maps to it (a job that lost a card is smaller);
* non-finite die temperatures (never-seen cards) are replaced by the supply temperature;
* levels outside the DVFS table are clamped.

Ambient and the set-point in force come from the facility reading when there is one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from models.problem import CycleProblem, Margins, Prices, make_problem
from twin.spec import SiteSpec
from twin.state import JobInfo, StateSnapshot
from twin.thermal import ThermalParams
from twin.workload import JobSpec

__all__ = ["job_spec_of", "problem_from_snapshot"]


def job_spec_of(info: JobInfo, n_cards: int | None = None) -> JobSpec:
    """The JobSpec of a belief's job (its submitted spec when known), with ``n_cards`` overridden."""
    if info.spec is not None:
        spec = info.spec
    else:
        spec = JobSpec(
            job_id=info.job_id,
            n_cards=max(info.n_cards, 1),
            work_steps=1.0,
            step_time_s=max(info.step_time_s, 1e-3),
            compute_share=info.compute_share,
            priority=info.priority,
            submit_time_s=info.submit_time_s,
            noncompute_utilization=info.noncompute_utilization,
            min_throughput_frac=info.min_throughput_frac,
        )
    return dataclasses.replace(spec, n_cards=n_cards) if n_cards is not None else spec


def problem_from_snapshot(
    site: SiteSpec,
    snap: StateSnapshot,
    *,
    ambient_c: float | None = None,
    supply_temp_c: float | None = None,
    supply_options_c: Sequence[float] | None = None,
    rack_limit_w: npt.NDArray[np.float64] | float | None = None,
    thermal: ThermalParams | None = None,
    ready_reserve_cards: int | None = None,
    margins: Margins | None = None,
    prices: Prices | None = None,
) -> CycleProblem:
    """Build the cycle problem from a belief snapshot (see the module docstring)."""
    n = site.n_cards
    failed = np.asarray(snap.card_failed, dtype=bool).copy()
    card_job = np.asarray(snap.card_job, dtype=np.int64).copy()
    card_job[failed] = -1
    jobs: list[JobSpec] = []
    cards: list[npt.NDArray[np.int64]] = []
    phases = []
    for j, info in enumerate(snap.jobs):
        mine = np.flatnonzero(card_job == j).astype(np.int64)
        if mine.size == 0:
            continue
        jobs.append(job_spec_of(info, int(mine.size)))
        cards.append(mine)
        phases.append(info.phase)
    fac = snap.facility
    amb = ambient_c if ambient_c is not None else (fac.ambient_temp_c if fac is not None else None)
    supply = supply_temp_c if supply_temp_c is not None else (fac.supply_setpoint_c if fac is not None else None)
    supply_f = float(site.facility.supply_temp_c if supply is None else supply)
    die = np.asarray(snap.card_die_temp_c, dtype=np.float64).copy()
    die[~np.isfinite(die)] = supply_f
    n_lv = site.card.n_levels
    level = np.clip(np.asarray(snap.card_level, dtype=np.int64), 0, n_lv - 1)
    queue = [job_spec_of(q) for q in snap.queue]
    return make_problem(
        site,
        jobs=jobs,
        job_cards=cards,
        job_phase=phases,
        failed=failed if failed.shape == (n,) else None,
        die_temp_c=die,
        current_level=level,
        thermal=thermal,
        ambient_c=amb,
        supply_temp_c=supply_f,
        supply_options_c=supply_options_c,
        rack_limit_w=rack_limit_w,
        ready_reserve_cards=ready_reserve_cards,
        margins=margins,
        prices=prices,
        queue=queue,
    )
