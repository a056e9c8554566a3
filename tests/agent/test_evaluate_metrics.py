"""What ``racktwin evaluate``'s metrics measure (docs/evaluation.md, "Metrics"), checked against the
plant's true values step by step, or by hand on a tiny queue.

What users rely on (the published results rest on these numbers): rack-limit violations are counted
on TRUE rack power, from the end of the first control period on, as rack-seconds over, episodes, the
longest and kW x s above the limit, including a last step shorter than a second; the largest rack
power leaves out the first period; the energy breakdown files every step's power by the cards'
state and adds up to the plant's integrals; the die counts are card-seconds over the slowdown and
over the maximum temperature; queue waits count a job never started with its wait so far and leave
out the jobs running at t = 0; an SLO miss is a job that ever computed below its floor; throughput
and its loss, and the facility saving, are measured against the baseline of the same run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from agent_helpers import small_site, true_violations
from evaluate_helpers import full_load_scenario

from agent.evaluate import _CARD_CATEGORIES, Recorder, _card_categories, _metrics, evaluate, run_policy
from agent.policies import ControlStats
from twin.faults import CardFailure
from twin.plant import Plant
from twin.scenario import RunScenario, build_plant, run_scenario_from_dict

pytestmark = pytest.mark.agent


def _step(plant: Plant, rec: Recorder, dt: float, seen: list[tuple[float, float, Any]]) -> None:
    """One plant step, recorded, with the step's start, length and the plant's truth after it."""
    t0 = plant.time_s
    plant.step(dt)
    rec.on_step()
    seen.append((t0, dt, plant.truth()))


def test_limit_violations_are_counted_on_true_rack_power_from_the_end_of_the_first_period() -> None:
    """Two racks over their limit at the top clock; rack r1 capped at t = 3..40 s, rack r0 at t = 20..30 s,
    a checkpoint takes r1 under its limit for a while, a last half-second step: the counts are those of
    the true rack powers after each step, judged from t = 5 s on (the end of the first period)."""
    plant = build_plant(full_load_scenario(600.0))
    site = plant.site
    limit = site.rack_power_limits_w()
    top = site.card.power_limit_w
    rec = Recorder(plant, judge_from_s=5.0, sample_s=10.0)
    seen: list[tuple[float, float, Any]] = []
    caps = {3: (np.arange(16, 32), 600.0), 20: (np.arange(16), 600.0), 30: (np.arange(16), top)}
    caps[40] = (np.arange(16, 32), top)
    for i in range(60):
        if i in caps:
            plant.set_power_limits(*caps[i])
        _step(plant, rec, 1.0, seen)
    _step(plant, rec, 0.5, seen)  # the run ends between two whole seconds
    rec.finish()

    rack_s, kws, episodes, longest, window_max = true_violations(seen, limit, 5.0)
    assert episodes >= 4 and longest > 10.0  # the caps and the checkpoint made several episodes
    assert rec.violation_rack_s == pytest.approx(rack_s, rel=1e-12)
    assert (seen[-1][2].rack_power_w > limit).any()  # over during the last half second: half a rack-second
    assert rec.violation_kws == pytest.approx(kws, rel=1e-12)
    assert rec.episodes == episodes
    assert rec.longest_s == longest
    # the largest rack power: from the end of the first period (the racks started higher than that)
    all_max = max(float(tr.rack_power_w.max()) for _t, _dt, tr in seen)
    assert window_max < all_max
    assert rec.max_rack_w == window_max and rec.max_rack_all_w == all_max
    # the series (series.csv): every rack's peak over each sample's interval, not its power at the sample
    times = rec.series["time_s"]
    assert times == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 60.5]
    for r in range(site.n_racks):
        for k in range(1, len(times)):
            peak = max(float(tr.rack_power_w[r]) for t0, dt, tr in seen if times[k - 1] < t0 + dt <= times[k])
            assert rec.rack_series[r][k] == peak
    # the throughput series is the work done in each sample's interval over its length (the last: half
    # a second), so it integrates to the run's work
    thr = rec.series["throughput"]
    work = sum(thr[k] * (times[k] - times[k - 1]) for k in range(1, len(times)))
    assert work == pytest.approx(plant.accounting().work_card_s, rel=1e-12) and thr[-1] > 0.0


def test_the_energy_breakdown_and_the_cards_held_are_counted_by_card_state_up_to_a_last_partial_step() -> None:
    """Busy cards not computing (utilization 0: a checkpoint) are filed apart from those computing; the
    IT parts add up to the plant's IT energy, the cooling parts to its cooling energy, all nine to its
    facility energy, also over a last step of half a second."""
    plant = build_plant(full_load_scenario(600.0))
    rec = Recorder(plant, judge_from_s=0.0)
    plant.add_fault(CardFailure(card=3, at_s=10.0))  # its job holds it (and the rest) while it restarts
    seen: list[tuple[float, float, Any]] = []
    busy_not_computing_j, held_card_s, failed_held_card_s = 0.0, 0.0, 0.0
    for _ in range(60):
        _step(plant, rec, 1.0, seen)
    _step(plant, rec, 0.5, seen)
    for _t0, dt, tr in seen:
        stalled = tr.card_busy_in_step & (tr.utilization == 0.0) & ~tr.low_power & ~tr.failed
        busy_not_computing_j += float(tr.card_power_w[stalled].sum()) * dt
        held_card_s += float((tr.card_busy_in_step & ~tr.failed).sum()) * dt
        failed_held_card_s += float((tr.card_busy_in_step & tr.failed).sum()) * dt
    # cards held by a job (allocated_card_frac): failed cards excluded
    assert failed_held_card_s > 0.0
    assert rec.allocated_card_s == pytest.approx(held_card_s, rel=1e-12)
    acc = plant.accounting()
    e = rec.energy_j
    assert busy_not_computing_j > 0.0  # a checkpoint happened within the minute
    assert e["cards_busy_not_computing"] == pytest.approx(busy_not_computing_j, rel=1e-12)
    it = e["hosts"] + e["cards_computing"] + e["cards_busy_not_computing"] + e["cards_idle_awake"]
    assert it + e["cards_low_power"] == pytest.approx(acc.it_energy_j, rel=1e-9)
    assert e["pumps"] + e["fans"] + e["chiller"] == pytest.approx(acc.cooling_energy_j, rel=1e-9)
    assert sum(e.values()) == pytest.approx(acc.facility_energy_j, rel=1e-9)


def test_dies_over_the_slowdown_and_the_maximum_are_card_seconds_of_true_die_temperature() -> None:
    """Rack r1's loop at 15% flow: its dies pass the slowdown temperature (87 deg C) but not the
    maximum (92 deg C); the card-seconds are those of the true die temperatures after each step."""
    fault = {"kind": "pump_degradation", "rack": "r1", "start_s": 0.0, "flow_fraction": 0.15}
    sc = full_load_scenario(600.0, faults=[fault])
    plant = build_plant(sc)
    card = plant.site.card
    rec = Recorder(plant, judge_from_s=15.0)
    seen: list[tuple[float, float, Any]] = []
    for _ in range(120):
        _step(plant, rec, 1.0, seen)
    _step(plant, rec, 0.5, seen)
    rec.finish()
    over_slowdown = sum(float((tr.die_temp_c > card.slowdown_temp_c).sum()) * dt for _t, dt, tr in seen)
    over_max = sum(float((tr.die_temp_c > card.max_temp_c).sum()) * dt for _t, dt, tr in seen)
    assert over_slowdown > 100.0 and over_max == 0.0
    m = _metrics(sc, plant, rec, ControlStats())
    assert m["die_over_slowdown_card_s"] == pytest.approx(over_slowdown, rel=1e-12)
    assert m["die_over_max_card_s"] == 0.0
    assert m["max_die_temp_c"] == max(float(tr.die_temp_c.max()) for _t, _dt, tr in seen)
    # the cards' own protection: a separate count (a die over the slowdown is not throttled every second)
    assert m["throttled_card_s"] == plant.accounting().throttled_card_s != m["die_over_slowdown_card_s"]


def _queue_scenario() -> RunScenario:
    """One 16-card rack: a job running at t = 0 for 200 s; "b" (8 cards, a 99% throughput floor)
    submitted at 60 s, "c" (16 cards) at 100 s, "d" (8 cards) at 150 s; a 600 s run. "c" never starts
    (b and d hold half the rack by then)."""

    def j(job_id: str, n_cards: int, **extra: Any) -> dict[str, Any]:
        return {"id": job_id, "n_cards": n_cards, "step_time_s": 1.0, "compute_share": 0.97, **extra}

    jobs = [
        j("warm", 16, duration_s=200.0, running_at_start=True, noncompute_utilization=0.9),
        j("b", 8, duration_s=1e5, submit_time_s=60.0, min_throughput_frac=0.99, noncompute_utilization=0.9),
        j("c", 16, duration_s=1e5, submit_time_s=100.0, noncompute_utilization=0.9),
        j("d", 8, duration_s=1e5, submit_time_s=150.0, noncompute_utilization=0.9),
    ]
    data = {"name": "queue", "duration_s": 600.0, "seed": 1, "workload": {"source": "none"}, "jobs": jobs}
    return run_scenario_from_dict(data, source="queue", site=small_site(1))


def test_queue_waits_slo_misses_throughput_and_the_comparison_with_the_baseline_follow_the_docs() -> None:
    ev = evaluate(_queue_scenario(), ["baseline", "static-cap"], jobs=1)
    base, cap = ev.results["baseline"], ev.results["static-cap"]
    for res in (base, cap):
        m = res.metrics
        start = {j.job_id: j.start_s for j in res.jobs}
        assert start["c"] is None and start["b"] is not None and start["d"] is not None
        # submission to first start; "c", never started, with its wait until the end; "warm" left out
        waits = [start["b"] - 60.0, start["d"] - 150.0, 600.0 - 100.0]
        assert m["jobs_never_started"] == 1
        assert m["queue_wait_max_s"] == 500.0
        assert m["queue_wait_mean_s"] == pytest.approx(np.mean(waits), rel=1e-12)
        assert m["queue_wait_p95_s"] == pytest.approx(np.percentile(waits, 95), rel=1e-12)
        assert m["throughput"] == pytest.approx(m["work_card_s"] / 600.0, rel=1e-12)
        assert m["facility_kwh_per_work_card_h"] == pytest.approx(
            m["facility_energy_kwh"] / (m["work_card_s"] / 3600.0), rel=1e-12
        )
        solve = res.stats.solve_times_s
        assert m["solve_median_s"] == np.percentile(solve, 50) and m["solve_p99_s"] == np.percentile(solve, 99)
        br = res.breakdown_kwh
        assert m["cooling_energy_kwh"] == pytest.approx(br["pumps"] + br["fans"] + br["chiller"], rel=1e-9)
    # the static cap slows the jobs: "b" computes below its 99% floor (one job missed), the others have none
    assert base.metrics["slo_violation_s"] == 0.0 and base.metrics["slo_jobs_missed"] == 0
    assert cap.metrics["slo_violation_s"] > 0.0 and cap.metrics["slo_jobs_missed"] == 1
    # against the baseline: less work (a positive loss) for less energy (a positive saving)
    b, c = base.metrics, cap.metrics
    assert c["throughput"] < b["throughput"] and c["facility_energy_kwh"] < b["facility_energy_kwh"]
    assert c["throughput_loss_pct"] == pytest.approx(100.0 * (1.0 - c["throughput"] / b["throughput"]), rel=1e-12)
    saving = 100.0 * (1.0 - c["facility_energy_kwh"] / b["facility_energy_kwh"])
    assert c["facility_energy_saving_pct"] == pytest.approx(saving, rel=1e-12) and saving > 0.0
    assert b["throughput_loss_pct"] == 0.0 and b["facility_energy_saving_pct"] == 0.0


def _two_hosts_one_small_job() -> RunScenario:
    """Two hosts of 16 cards (one rack each), a 4-card job on host 0 running from t = 0; 100 s."""
    site = small_site(2)
    assert site.n_hosts == 2
    job = {"id": "a", "n_cards": 4, "duration_s": 1e5, "step_time_s": 1.0, "running_at_start": True}
    data = {"name": "hosts", "duration_s": 100.0, "seed": 1, "workload": {"source": "none"}, "jobs": [job]}
    return run_scenario_from_dict(data, source="hosts", site=site)


def test_the_card_and_host_shares_are_time_averages_over_the_sites_cards_and_hosts() -> None:
    """Two hosts of 16 cards: a 4-card job on host 0 for 100 s, the 28 other cards asleep. An eighth of
    the cards held, seven eighths asleep, one host with no busy card; one of the two racks' pumps at half speed."""
    sc = _two_hosts_one_small_job()
    plant = build_plant(sc)
    free = plant.free_cards()
    assert free.tolist() == list(range(4, 32))
    plant.enter_low_power(free)
    rec = Recorder(plant, judge_from_s=15.0)
    for i in range(100):
        if i % 30 == 0:
            plant.set_pump_speed([1], 0.5)  # renewed within the pump's hold: rack r1's pump at half speed
        plant.step(1.0)
        rec.on_step()
    rec.finish()
    m = _metrics(sc, plant, rec, ControlStats())
    assert m["mean_pump_speed_frac"] == pytest.approx(0.75, rel=1e-12)  # the mean over the racks' pumps
    assert m["allocated_card_frac"] == pytest.approx(0.125, rel=1e-12)
    assert m["low_power_card_frac"] == pytest.approx(0.875, rel=1e-12)
    assert m["idle_card_s"] == pytest.approx(2800.0, rel=1e-12)
    assert m["idle_host_s"] == pytest.approx(100.0, rel=1e-12)  # host 1; host 0 has a busy card
    assert m["host_off_frac"] == 0.0 and m["boot_wait_card_frac"] == 0.0


def test_a_rack_silent_for_a_minute_enters_fail_safe_once() -> None:
    """``failsafe_entries`` counts the times a rack went to fail-safe caps, not the decisions it stayed
    there (``failsafe_decisions``): rack r1 silent from 60 s to 120 s is stale after the agent's 30 s
    deadline and held at fail-safe caps for several decisions, one entry."""
    fault = {"kind": "sensor_dropout", "rack": "r1", "start_s": 60.0, "end_s": 120.0}
    m = run_policy(full_load_scenario(240.0, faults=[fault]), "racktwin").metrics
    assert m["failsafe_decisions"] >= 2
    assert m["failsafe_entries"] == 1 and m["failsafe_racks"] == "r1"
    assert m["limit_violation_s"] == 0.0


def test_a_host_whose_only_unfree_card_failed_counts_as_idle() -> None:
    """``idle_host_s`` is host-seconds with no card held by a job (docs/evaluation.md): a failed card
    that no job holds does no work, so its host is as idle as one whose cards all are free (host
    power-down could reach it). Two hosts of 16 cards, a 4-card job on host 0, card 20 (host 1)
    failed at 10 s: host 1 is idle all 100 s."""
    sc = _two_hosts_one_small_job()
    plant = build_plant(sc)
    plant.add_fault(CardFailure(card=20, at_s=10.0))
    rec = Recorder(plant, judge_from_s=15.0)
    for _ in range(100):
        plant.step(1.0)
        rec.on_step()
    rec.finish()
    assert bool(plant.truth().failed[20])
    m = _metrics(sc, plant, rec, ControlStats())
    assert m["idle_host_s"] == pytest.approx(100.0, rel=1e-12)  # host 1, before and after its card failed


def test_a_failed_card_is_filed_idle_awake_once_no_job_holds_it() -> None:
    """Where the energy went is filed by whether a job holds the card (docs/evaluation.md): a failed
    card (0 W, awake at 0 MHz) that no job holds is an idle awake card, not a busy one; one its job
    still holds while it restarts is busy not computing. Card 20 (free) and card 2 (of the 4-card
    job on host 0) fail at 10 s."""
    plant = build_plant(_two_hosts_one_small_job())
    plant.add_fault(CardFailure(card=20, at_s=10.0))
    plant.add_fault(CardFailure(card=2, at_s=10.0))
    for _ in range(12):
        plant.step(1.0)
    tr = plant.truth()
    assert tr.failed[[2, 20]].all() and tr.card_busy_in_step[2] and not tr.card_busy_in_step[20]
    assert tr.card_power_w[[2, 20]].tolist() == [0.0, 0.0]
    filed = [_CARD_CATEGORIES[k] for k in _card_categories(tr)]
    assert filed[20] == "cards_idle_awake"
    assert filed[2] == "cards_busy_not_computing"  # its job holds it until it is queued again
    assert filed[0] == "cards_busy_not_computing"  # as do the job's other cards (waiting to restart)
    assert filed[21] == "cards_idle_awake"  # a free card beside it
