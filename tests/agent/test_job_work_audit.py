"""Job-by-job work (agent.job_work): the accounting it reads and the differences it names.

What users rely on (docs/twin.md "Work and throughput", docs/evaluation.md "By job"): a job's work is
in top-clock-equivalent card-seconds, ``n * relative_throughput(c, f/f0)`` per second while it
trains and nothing while it checkpoints or waits, ``n * work_steps * step_time_s`` once finished
(no more after); two policies' per-job work differs by P's less O's (a job missing from one did no
work there) from a whole card-second on, largest loss of P first; the text names the largest gaps
(by size, gains too), with how much later or earlier each was placed and began computing (times
that print as 0 s are the same time), "then ran slower/faster" where the gap exceeds what the delay
explains (cards times delay, plus a tenth, plus a second of the job's work), sums the rest, and
gives each as a share of O's work.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from agent_helpers import job, small_site

from agent.job_work import JobWork, describe_work_gap, job_work, work_differences
from twin.plant import Plant, PlantConfig
from twin.plant_types import JobRecord
from twin.workload import Phase

pytestmark = pytest.mark.agent


def test_job_work_keeps_each_records_times_and_card_seconds() -> None:
    rec = JobRecord(
        job_id="j",
        state="running",
        phase=Phase.COMPUTE,
        n_cards=8,
        priority=1.0,
        submit_time_s=0.0,
        start_time_s=10.0,
        finish_time_s=None,
        compute_start_s=70.0,
        work_done_card_s=1234.5,
        work_total_card_s=1e6,
        slo_violation_s=0.0,
        restarts=0,
        cards=tuple(range(8)),
    )
    assert job_work([rec]) == (JobWork("j", 8, 10.0, 1234.5, 70.0),)  # card-seconds, not seconds per card


def test_work_accrues_at_n_cards_times_the_relative_throughput_of_the_clock_and_stops_at_the_end() -> None:
    """8 cards at level k, compute share 0.9, 2 s steps: each second of training adds
    8 / (0.9 f0/fk + 0.1) card-s (whatever the step time); a checkpoint adds none, also while the other
    job trains; the finished job has done 8 x work_steps x 2 s, and no more while the other goes on.
    The other job (share 0.7, top clock) adds 8 card-s a second of training."""
    site = small_site(racks=1, xy=(4, 4))
    c, n, steps, step_s = 0.9, 8, 350.0, 2.0
    spec = replace(
        job("j", n, share=c, work_steps=steps, checkpoint_interval_s=120.0, checkpoint_duration_s=20.0),
        step_time_s=step_s,
    )
    other = job("busy", n, share=0.7, checkpoint_interval_s=300.0, checkpoint_duration_s=30.0)
    plant = Plant(site, [spec, other], config=PlantConfig(seed=5, placement="external", external_timeout_s=1e6))
    plant.step(1.0)
    plant.place_job("j", np.arange(n))
    plant.place_job("busy", np.arange(n, 2 * n))
    clocks = site.card.clocks_mhz
    k = len(clocks) // 2
    plant.set_levels(np.arange(n), k)
    rates = {"j": n / (c * clocks[0] / clocks[k] + 1.0 - c), "busy": float(n)}  # card-s per second
    training: dict[str, list[float]] = {"j": [], "busy": []}
    checkpointing: dict[str, list[float]] = {"j": [], "busy": []}
    while plant.time_s < 3000.0:
        before = {r.job_id: r for r in plant.job_records()}
        if before["j"].state == "finished":
            break
        plant.step(1.0)
        for r in plant.job_records():
            gained = r.work_done_card_s - before[r.job_id].work_done_card_s
            if before[r.job_id].phase == r.phase == Phase.COMPUTE and plant.time_s > 5.0:
                training[r.job_id].append(gained)
            if before[r.job_id].phase == r.phase == Phase.CHECKPOINT:
                checkpointing[r.job_id].append(gained)
    for jid, rate in rates.items():
        assert len(training[jid]) > 100 and len(checkpointing[jid]) > 5  # it trained and checkpointed
        assert training[jid] == pytest.approx([rate] * len(training[jid]), rel=1e-6)
        assert checkpointing[jid] == [0.0] * len(checkpointing[jid])
    done = {w.job_id: w for w in job_work(plant.job_records())}
    assert done["j"].work_card_s == pytest.approx(n * steps * step_s, rel=1e-9)
    plant.run(120.0)  # an ended job does no more work; the other goes on
    later = {w.job_id: w for w in job_work(plant.job_records())}
    assert later["j"].work_card_s == done["j"].work_card_s
    assert later["busy"].work_card_s > done["busy"].work_card_s


def test_differences_are_p_less_o_and_a_job_missing_from_one_did_no_work_there() -> None:
    o = [JobWork("a", 8, 40.0, 800.0, 50.0), JobWork("b", 16, 5.0, 300.0, 20.0)]
    p = [JobWork("a", 8, 100.0, 500.0, 130.0), JobWork("c", 32, 0.0, 900.0, 10.0)]
    diffs = {d.job_id: d for d in work_differences(p, o)}
    a, b, c = diffs["a"], diffs["b"], diffs["c"]
    assert (a.work_delta_card_s, a.start_delta_s, a.compute_start_delta_s) == (-300.0, 60.0, 80.0)
    assert a.started == (True, True) and a.computing == (True, True)
    assert (b.work_delta_card_s, b.start_delta_s) == (-300.0, None)  # b: not under p
    assert b.started == (False, True) and b.computing == (False, True)
    assert (c.work_delta_card_s, c.start_delta_s, c.started, c.computing) == (900.0, None, (True, False), (True, False))
    assert [d.job_id for d in work_differences(p, o)] == ["a", "b", "c"]  # largest loss of p first (ties by id)
    late = work_differences([JobWork("a", 8, 0.0, 0.0, None)], [JobWork("a", 8, 0.0, 0.0, 30.0)], min_card_s=0.0)
    assert late[0].computing == (False, True) and late[0].compute_start_delta_s is None


def test_every_job_missing_from_p_did_no_work_there_however_many_follow_each_other() -> None:
    """Two jobs only under o, one after the other: each counts its whole work as p's loss (the second
    does not inherit the first's)."""
    o = [JobWork("a", 8, 0.0, 100.0), JobWork("b", 8, 0.0, 300.0), JobWork("c", 8, 0.0, 500.0)]
    diffs = work_differences([JobWork("a", 8, 0.0, 100.0)], o)
    assert [(d.job_id, d.work_delta_card_s, d.started) for d in diffs] == [
        ("c", -500.0, (False, True)),
        ("b", -300.0, (False, True)),
    ]


def test_times_are_the_same_only_when_they_print_as_0_s() -> None:
    text = describe_work_gap([JobWork("j", 8, 100.7, 992.0)], [JobWork("j", 8, 100.0, 1000.0)], "o")
    assert "j (8 cards, placed 1 s later than under o) -8 card-s" in text  # 0.7 s prints as 1 s


def test_a_job_placed_and_computing_later_by_the_same_delay_names_only_the_placement() -> None:
    text = describe_work_gap([JobWork("j", 8, 160.0, 520.0, 170.0)], [JobWork("j", 8, 100.0, 1000.0, 110.0)], "o")
    assert "j (8 cards, placed 60 s later than under o) -480 card-s" in text


def test_a_job_placed_only_under_p_says_so() -> None:
    text = describe_work_gap([JobWork("j", 8, 10.0, 400.0, 20.0)], [JobWork("j", 8, None, 0.0, None)], "o")
    assert "j (8 cards, placed; under o never) +400 card-s" in text
    assert "(+" not in text.split("card-s", 1)[1]  # o did no work: no share


def test_ran_slower_or_faster_only_beyond_what_the_delay_explains() -> None:
    """10 cards placed 100 s later explain up to 1.1 x 10 x 100 = 1,100 card-s, plus a second of the
    job's work (10 card-s): a loss of 1,105 is the delay, of 1,115 the delay and a slower run."""
    o = [JobWork("j", 10, 0.0, 5000.0)]
    assert "slower" not in describe_work_gap([JobWork("j", 10, 100.0, 3895.0)], o, "o")
    assert "placed 100 s later than under o, then ran slower) -1,115 card-s" in describe_work_gap(
        [JobWork("j", 10, 100.0, 3885.0)], o, "o"
    )
    # placed 10 s later: up to 110 + 10 card-s is the delay
    assert "slower" not in describe_work_gap([JobWork("j", 10, 10.0, 4885.0)], o, "o")
    # placed 100 s earlier and gained 2,000: beyond 1,100 + 10, it ran faster too
    gain = describe_work_gap([JobWork("j", 8, 0.0, 3000.0)], [JobWork("j", 8, 100.0, 1000.0)], "o")
    assert "placed 100 s earlier than under o, then ran faster) +2,000 card-s" in gain


def test_the_largest_gaps_are_named_gains_too_and_the_rest_summed_once() -> None:
    o = [JobWork(f"j{i}", 8, 0.0, 1000.0) for i in range(5)]
    deltas = [+500.0, -100.0, -50.0, +20.0, -10.0]
    p = [JobWork(f"j{i}", 8, 0.0, 1000.0 + d) for i, d in enumerate(deltas)]
    text = describe_work_gap(p, o, "o")  # 3 named by default
    assert text.startswith("by job (+360 card-s in all, 5 jobs differ): j0 (8 cards, ")
    assert "+500 card-s (+10.00%); j1 " in text and "j2 (8 cards" in text
    assert text.endswith("; 2 other jobs +10 card-s (+0.20%)")
    one_rest = describe_work_gap(p[:4] + o[4:], o, "o")
    assert one_rest.endswith("; 1 other job +20 card-s (+0.40%)")
    two = describe_work_gap(p[:2] + o[2:], o, "o")
    assert two.startswith("by job (+400 card-s in all, 2 jobs differ)")


def test_how_each_job_fared_is_told_as_the_docs_say() -> None:
    o = [JobWork("j", 256, 100.0, 900_000.0, 110.0)]
    assert describe_work_gap(o, o, "o") == ""  # no job differs: nothing to say
    assert describe_work_gap([JobWork("j", 256, 100.0, 900_000.5, 110.0)], o, "o") == ""  # under a card-second
    late = describe_work_gap([JobWork("j", 256, 1315.0, 588_960.0, 1325.0)], o, "o")
    assert "j (256 cards, placed 1,215 s later than under o) -311,040 card-s (-34.56%)" in late
    never = describe_work_gap([JobWork("j", 256, 100.0, 0.0, None)], o, "o")
    assert "placed with o, never computing; under o it was" in never
    only_p = describe_work_gap(o, [JobWork("j", 256, 100.0, 0.0, None)], "o")
    assert "placed with o, computing; under o never" in only_p
    assert "placed and computing with o, ran slower" in describe_work_gap(
        [JobWork("j", 256, 100.0, 899_000.0, 110.0)], o, "o"
    )
    assert "placed and computing with o, ran faster" in describe_work_gap(
        [JobWork("j", 256, 100.0, 901_000.0, 110.0)], o, "o"
    )
    booted = describe_work_gap([JobWork("j", 256, 100.0, 827_040.0, 395.0)], o, "o")
    assert "placed at the same time, computing 285 s later than under o" in booted
    # placed 100 s earlier yet 500 card-s short: the earlier start explains none of a loss
    earlier = describe_work_gap([JobWork("s", 8, 0.0, 1000.0)], [JobWork("s", 8, 100.0, 1500.0)], "o")
    assert "placed 100 s earlier than under o, then ran slower) -500 card-s" in earlier
