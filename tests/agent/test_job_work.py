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


def test_a_job_placed_under_both_that_began_training_under_one_only_says_so() -> None:
    """Placed at the same time, but under P its hosts were still booting at the end: it never computed
    there. It read "placed and computing with o, ran slower" (and placed later: "then ran slower")."""
    never = describe_work_gap([JobWork("j", 64, 100.0, 0.0, None)], [JobWork("j", 64, 100.0, 5000.0, 110.0)], "o")
    assert never == (
        "by job (-5,000 card-s in all, 1 job differs): j (64 cards, placed with o, never computing; under o it was) "
        "-5,000 card-s (-100.00%)"
    )
    later = describe_work_gap([JobWork("j", 64, 130.0, 0.0, None)], [JobWork("j", 64, 100.0, 5000.0, 110.0)], "o")
    assert "j (64 cards, placed 30 s later than under o, never computing; under o it was) -5,000 card-s" in later
    o = [JobWork("j", 64, 100.0, 0.0, None), JobWork("k", 8, 0.0, 1000.0, 0.0)]
    only_p = describe_work_gap([JobWork("j", 64, 100.0, 5000.0, 110.0), o[1]], o, "o")
    assert "j (64 cards, placed with o, computing; under o never) +5,000 card-s (+500.00%)" in only_p


def test_times_that_print_as_0_s_count_as_the_same_time() -> None:
    """Half a second rounds to "0 s" in the text: it read "placed 0 s later" / "computing 0 s later"."""
    half = describe_work_gap([JobWork("j", 64, 100.5, 5000.0, 110.5)], [JobWork("j", 64, 100.0, 5100.0, 110.0)], "o")
    assert "j (64 cards, placed and computing with o, ran slower) -100 card-s" in half
    waited = describe_work_gap([JobWork("j", 64, 100.0, 5000.0, 110.5)], [JobWork("j", 64, 100.0, 5100.0, 110.0)], "o")
    assert "j (64 cards, placed and computing with o, ran slower)" in waited
    # 1.5 s prints as 2 s; 100 card-s is within 1.1 x 64 cards x 1.5 s + 64: the delay explains it
    late = describe_work_gap([JobWork("j", 64, 101.5, 5000.0, 111.5)], [JobWork("j", 64, 100.0, 5100.0, 110.0)], "o")
    assert "j (64 cards, placed 2 s later than under o) -100 card-s" in late


def test_a_gap_beyond_what_the_delay_explains_is_said_to_come_after_the_start() -> None:
    """5 cards placed 20 s later explain 1.1 x 5 x 20 = 110 card-s, plus a second of the job's work (5):
    up to 115 card-s is the delay alone, 116 also ran slower. A job placed earlier that gained what the
    earlier start explains ran no faster; one placed later that gained ran faster."""

    def how(p: JobWork, o: JobWork) -> str:
        return describe_work_gap([p], [o], "o")

    assert "(5 cards, placed 20 s later than under o) -115 card-s" in how(
        JobWork("s", 5, 20.0, 885.0), JobWork("s", 5, 0.0, 1000.0)
    )
    assert "(5 cards, placed 20 s later than under o) -113 card-s" in how(
        JobWork("s", 5, 20.0, 887.0), JobWork("s", 5, 0.0, 1000.0)
    )
    assert "(5 cards, placed 20 s later than under o, then ran slower) -116 card-s" in how(
        JobWork("s", 5, 20.0, 884.0), JobWork("s", 5, 0.0, 1000.0)
    )
    assert "(8 cards, placed 100 s earlier than under o) +800 card-s" in how(
        JobWork("s", 8, 0.0, 1800.0), JobWork("s", 8, 100.0, 1000.0)
    )
    assert "(8 cards, placed 100 s later than under o, then ran faster) +800 card-s" in how(
        JobWork("s", 8, 100.0, 1800.0), JobWork("s", 8, 0.0, 1000.0)
    )


def test_the_named_jobs_the_rest_and_the_total_add_up() -> None:
    """Four jobs of 1,000 card-s each under o (4,000 in all): p lost 400, 300 and 100 on three and gained
    200 on one. Named by size of the gap (3 by default), each with its signed share of o's work."""
    o = [JobWork(j, 8, 0.0, 1000.0) for j in "abcd"]
    p = [JobWork("a", 8, 0.0, 600.0), JobWork("b", 8, 0.0, 700.0), JobWork("c", 8, 0.0, 1200.0)]
    p.append(JobWork("d", 8, 0.0, 900.0))
    assert describe_work_gap(p, o, "o") == (
        "by job (-600 card-s in all, 4 jobs differ): a (8 cards, placed and computing with o, ran slower) -400 card-s "
        "(-10.00%); b (8 cards, placed and computing with o, ran slower) -300 card-s (-7.50%); c (8 cards, placed and "
        "computing with o, ran faster) +200 card-s (+5.00%); 1 other job -100 card-s (-2.50%)"
    )
    one = describe_work_gap(p, o, "o", top=1)  # the rest summed with their signs: -300 + 200 - 100
    assert one.startswith("by job (-600 card-s in all, 4 jobs differ): a (")
    assert one.endswith("; 3 other jobs -200 card-s (-5.00%)")


def test_a_job_missing_from_one_run_counts_as_no_work_there_and_ties_go_by_job_id() -> None:
    o = [JobWork("a", 8, 0.0, 1000.0), JobWork("x", 8, 0.0, 500.0)]
    p = [JobWork("a", 8, 0.0, 1000.0), JobWork("y", 4, 0.0, 300.0)]
    assert [(d.job_id, d.work_delta_card_s) for d in work_differences(p, o)] == [("x", -500.0), ("y", 300.0)]
    text = describe_work_gap(p, o, "o")
    assert "x (8 cards, never placed; under o it was) -500 card-s (-33.33%)" in text  # of o's 1,500
    assert "y (4 cards, placed; under o never) +300 card-s (+20.00%)" in text
    # o did no work at all: no share of it (it read "(+nan%)")
    assert describe_work_gap([JobWork("j", 8, 0.0, 800.0, 0.0)], [JobWork("j", 8, None, 0.0)], "o") == (
        "by job (+800 card-s in all, 1 job differs): j (8 cards, placed; under o never) +800 card-s"
    )
    # equal losses: in job-id order, whatever order the records came in
    ties = [JobWork("b", 8, 0.0, 900.0), JobWork("a", 8, 0.0, 900.0)]
    same = [JobWork("a", 8, 0.0, 1000.0), JobWork("b", 8, 0.0, 1000.0)]
    assert [d.job_id for d in work_differences(ties, same)] == ["a", "b"]
