"""Where two policies' work differs, job by job (agent.job_work), and the targets that cite it.

What users rely on: a run's work is the sum of its jobs' work, so a throughput verdict between two
policies is explained by naming the jobs whose work differs; a job started later is named with how
much later and what it cost, the rest are summed; a job that finished under both does not count; a
missed "better than" or throughput-loss target names those jobs when the runs' job records are
given (tests/agent/test_targets.py), and ``racktwin evaluate`` records them.
"""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import example_site, job, small_site

from agent.evaluate import evaluate
from agent.job_work import JobWork, describe_work_gap, job_work, work_differences
from twin.plant import Plant, PlantConfig
from twin.scenario import run_scenario_from_dict

pytestmark = pytest.mark.agent


def _run(big_start_s: float) -> Plant:
    """A 32-card site: an 8-card job that ends within the run, a 16-card job placed at
    ``big_start_s`` that runs past the end."""
    site = small_site(racks=2)
    jobs = [job("small", 8, work_steps=120.0), job("big", 16, work_steps=1e6)]
    plant = Plant(site, jobs, config=PlantConfig(seed=3, placement="external", external_timeout_s=1e6))
    plant.step(1.0)
    plant.place_job("small", np.arange(8))
    while plant.time_s < big_start_s:
        plant.step(1.0)
    plant.place_job("big", np.arange(16, 32))
    while plant.time_s < 900.0:
        plant.step(1.0)
    return plant


def test_a_big_job_started_later_is_named_with_its_delay_and_cost() -> None:
    early, late = _run(1.0), _run(301.0)
    for plant in (early, late):  # the per-job work adds up to the run's work
        assert sum(j.work_card_s for j in job_work(plant.job_records())) == pytest.approx(
            plant.accounting().work_card_s, rel=1e-9
        )
    w_early, w_late = job_work(early.job_records()), job_work(late.job_records())
    (d,) = work_differences(w_late, w_early)  # "small" finished under both: same work
    assert d.job_id == "big" and d.n_cards == 16
    assert d.start_delta_s == pytest.approx(300.0)
    assert d.work_delta_card_s == pytest.approx(-16 * 300.0, rel=0.1)  # ~300 s of 16 cards' training
    text = describe_work_gap(w_late, w_early, "early")
    assert "big (16 cards, placed 300 s later than under early)" in text
    assert f"{d.work_delta_card_s:+,.0f} card-s" in text
    assert describe_work_gap(w_early, w_early, "itself") == ""


def test_a_job_placed_on_an_off_host_begins_computing_after_the_boot() -> None:
    site = example_site()
    assert site.hosts_managed
    plant = Plant(site, [job("j", 8)], config=PlantConfig(seed=1, placement="external", external_timeout_s=1e6))
    plant.step(1.0)
    plant.power_off_hosts([0])
    plant.run(30.0)
    plant.place_job("j", np.arange(8))  # host 0's cards
    placed_s = plant.time_s
    plant.run(site.rack.host_boot_s + 120.0)
    (rec,) = plant.job_records()
    assert rec.start_time_s == pytest.approx(placed_s)
    assert rec.compute_start_s is not None
    assert rec.compute_start_s >= placed_s + site.rack.host_boot_s  # the boot, then the card wake-up
    (w,) = job_work([rec])
    assert w.compute_start_s == rec.compute_start_s


def test_the_largest_differences_come_first_and_the_rest_are_summed() -> None:
    o = [JobWork(f"j{i}", 8, 0.0, 1000.0) for i in range(6)] + [JobWork("huge", 256, 0.0, 50_000.0)]
    p = [JobWork(f"j{i}", 8, 0.0 if i else -60.0, 1000.0 + 10.0 * (i + 1)) for i in range(6)]
    p.append(JobWork("huge", 256, 1200.0, 20_000.0))
    order = [d.job_id for d in work_differences(p, o)]  # largest loss of p first, largest gain last
    assert order[0] == "huge" and order[-1] == "j5"
    text = describe_work_gap(p, o, "reactive", top=2)
    assert text.startswith("by job (-29,790 card-s in all, 7 jobs differ): huge (256 cards, placed 1,200 s later")
    assert "j5 (8 cards, placed and computing with reactive, ran faster) +60 card-s" in text
    assert text.endswith("5 other jobs +150 card-s (+0.27%)")
    # a job differs from a whole card-second on (min_card_s, 1 by default)
    assert [
        d.work_delta_card_s for d in work_differences([JobWork("a", 8, 0.0, 101.0)], [JobWork("a", 8, 0.0, 100.0)])
    ] == [1.0]
    assert work_differences([JobWork("a", 8, 0.0, 100.5)], [JobWork("a", 8, 0.0, 100.0)]) == []
    not_started, started = [JobWork("a", 8, None, 0.0)], [JobWork("a", 8, 5.0, 40.0)]
    (never,) = work_differences(not_started, started)
    assert never.start_delta_s is None and never.started == (False, True)
    assert "a (8 cards, never placed; under o it was) -40 card-s" in describe_work_gap(not_started, started, "o")
    # placed at the same time, but its hosts booted first: computing later
    booted = describe_work_gap([JobWork("b", 64, 10.0, 100.0, 310.0)], [JobWork("b", 64, 10.0, 900.0, 25.0)], "o")
    assert "b (64 cards, placed at the same time, computing 285 s later than under o) -800 card-s" in booted
    # a gap larger than the delay explains (a card does at most a card-second per second): it ran slower too
    slower = describe_work_gap([JobWork("s", 72, 101.0, 1000.0)], [JobWork("s", 72, 100.0, 5320.0)], "o")
    assert slower.startswith("by job (-4,320 card-s in all, 1 job differs): s (72 cards, placed 1 s later than")
    assert "under o, then ran slower) -4,320 card-s" in slower
    assert "ran slower" not in describe_work_gap(
        [JobWork("s", 72, 101.0, 1000.0)], [JobWork("s", 72, 100.0, 1070.0)], "o"
    )
    earlier = describe_work_gap([JobWork("s", 8, 0.0, 1000.0)], [JobWork("s", 8, 100.0, 1500.0)], "o")
    assert "placed 100 s earlier than under o, then ran slower) -500 card-s" in earlier


def test_evaluate_records_every_jobs_work() -> None:
    site = small_site(racks=2)
    sc = run_scenario_from_dict(
        {
            "name": "jobs",
            "duration_s": 600.0,
            "seed": 2,
            "jobs": [
                {"id": "a", "n_cards": 8, "work_steps": 100.0, "step_time_s": 1.0},
                {"id": "b", "n_cards": 16, "work_steps": 1e6, "step_time_s": 1.0},
            ],
        },
        site=site,
    )
    ev = evaluate(sc, ["baseline"])
    base = ev.results["baseline"]
    assert {j.job_id for j in base.jobs} == {"a", "b"}
    assert sum(j.work_card_s for j in base.jobs) == pytest.approx(base.metrics["work_card_s"], rel=1e-9)
