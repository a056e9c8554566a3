"""The evaluation days' workload: a day at the allocation it claims, and a scheduler that keeps it.

What users rely on: ``allocation_tolerance`` draws a day that offers the target allocation (the
generator's sizes and run times are heavy-tailed, so one day of a seed may offer half or twice the
target); the example days load; the plant's scheduler lets small jobs use cards a blocked big job
cannot use yet without delaying it (EASY backfilling), so a blocked 256-card job does not idle
half the site.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import example_site, job

from twin.plant import Plant, PlantConfig
from twin.scenario import load_run_scenario, offered_allocation, run_scenario_from_dict

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_nominal_day_offers_its_target_allocation() -> None:
    sc = load_run_scenario(EXAMPLES / "day-nominal.toml")
    assert sc.duration_s == 86400.0
    assert abs(sc.offered_allocation - 0.65) <= 0.02
    assert sc.offered_allocation == pytest.approx(offered_allocation(sc.jobs, sc.site.n_cards, sc.duration_s))
    assert "offering" in sc.workload and sc.running_at_start


def test_conditioning_picks_the_first_seed_that_offers_the_target() -> None:
    site = example_site()
    base = {"name": "t", "duration_s": 86400.0, "seed": 0}
    plain = [run_scenario_from_dict({**base, "seed": s}, site=site).offered_allocation for s in range(3)]
    assert max(abs(a - 0.65) for a in plain) > 0.05  # one day of a seed: far from the target
    cond = run_scenario_from_dict({**base, "workload": {"allocation_tolerance": 0.02}}, site=site)
    assert abs(cond.offered_allocation - 0.65) <= 0.02
    seed = int(cond.workload.split("seed ")[1].split()[0])
    for s in range(seed):  # every earlier seed was outside the band
        a = run_scenario_from_dict({**base, "seed": s}, site=site).offered_allocation
        assert abs(a - 0.65) > 0.02


def test_a_blocked_big_job_keeps_its_reservation_while_small_jobs_backfill() -> None:
    site = example_site()
    jobs = [
        job("long", 256, work_steps=10_000.0),  # holds half the site for ~3 h
        job("short", 128, work_steps=600.0),  # ends after ~11 min: then "big" fits
        job("big", 256, submit_s=10.0, work_steps=1_000.0),  # cannot start before "short" ends
        job("fill", 64, submit_s=20.0, work_steps=300.0),  # fits now and ends before "short"
        job("late", 64, submit_s=30.0, work_steps=5_000.0),  # fits now but would delay "big"
    ]
    plant = Plant(site, jobs, config=PlantConfig(seed=1, backfill_wait_s=0.0))
    plant.run(900.0)
    recs = {r.job_id: r for r in plant.job_records()}
    assert recs["fill"].start_time_s is not None and recs["fill"].start_time_s < 60.0  # backfilled at once
    assert recs["big"].start_time_s is not None  # got its cards when "short" and "fill" ended
    assert recs["late"].start_time_s is None or recs["late"].start_time_s >= recs["big"].start_time_s
