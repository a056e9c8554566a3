"""Mutation audit of ``racktwin evaluate``'s numbers (docs/evaluation.md, "Metrics"): each metric key
carries the quantity its row documents, checked against the plant's true values step by step.

What users rely on (issue 6's published results rest on these numbers): the limit counts in the
metrics are the judged window's rack-seconds, episodes, longest run and kW x s; throughput is the
work kept (after rollbacks) per second and ``throughput_frac`` that per card of the site; the host
and set-point shares are time averages over the run; ``solve_max_s`` and ``fallbacks`` are the
controller's; the series count neither a failed card as held nor an empty peak at t = 0; a missed
throughput bound names the jobs behind it.
"""

from __future__ import annotations

from typing import Any

import pytest
from agent_helpers import example_site, small_site, true_violations
from evaluate_helpers import full_load_scenario

from agent.evaluate import Recorder, _metrics, evaluate
from agent.policies import ControlStats
from twin.faults import CardFailure
from twin.plant import Plant
from twin.scenario import RunScenario, build_plant, run_scenario_from_dict

pytestmark = pytest.mark.agent


def _run(plant: Plant, rec: Recorder, steps_s: list[float]) -> list[tuple[float, float, Any]]:
    """Step the plant, recording each step; the step's start, length and the truth after it."""
    seen: list[tuple[float, float, Any]] = []
    for dt in steps_s:
        t0 = plant.time_s
        plant.step(dt)
        rec.on_step()
        seen.append((t0, dt, plant.truth()))
    rec.finish()
    return seen


def test_the_limit_metrics_are_the_judged_windows_counts_by_hand() -> None:
    """Rack r1 capped under its limit from 20 s to 40 s, then over again: the metrics' rack-seconds,
    episodes, longest run and kW x s are those of the true rack powers from t = 10 s (the judged
    window) on; the first sample of each rack's series is its power at t = 0, not an empty peak."""
    sc = full_load_scenario(600.0)
    plant = build_plant(sc)
    limit = plant.site.rack_power_limits_w()
    p0 = plant.truth().rack_power_w.copy()
    rec = Recorder(plant, judge_from_s=10.0, sample_s=10.0)
    seen: list[tuple[float, float, Any]] = []
    for i in range(60):
        if i == 20:
            plant.set_power_limits(range(16, 32), 600.0)
        if i == 40:
            plant.set_power_limits(range(16, 32), plant.site.card.power_limit_w)
        seen += _run(plant, rec, [1.0])
    m = _metrics(sc, plant, rec, ControlStats())

    rack_s, kws, episodes, longest, _max_w = true_violations(seen, limit, 10.0)
    assert episodes >= 3 and longest > rack_s / episodes  # several episodes of different lengths
    assert m["limit_violation_s"] == pytest.approx(rack_s, rel=1e-12)
    assert m["limit_violation_episodes"] == episodes
    assert m["limit_violation_longest_s"] == longest
    assert m["limit_violation_kws"] == pytest.approx(kws, rel=1e-12) and kws != pytest.approx(rack_s)
    for r in range(plant.site.n_racks):
        assert rec.rack_series[r][0] == float(p0[r]) > 0.0


def test_throughput_is_the_work_kept_after_a_rollback_per_second_and_per_card() -> None:
    """A card fails at 30 s: its job rolls back to its last checkpoint (work lost); the throughput is
    the jobs' work kept over the run's length, ``throughput_frac`` that over the site's cards; the
    cards held in the series leave the failed card out."""
    sc = full_load_scenario(600.0)
    plant = build_plant(sc)
    plant.add_fault(CardFailure(card=3, at_s=30.0))
    rec = Recorder(plant, judge_from_s=15.0, sample_s=10.0)
    _run(plant, rec, [1.0] * 120)
    m = _metrics(sc, plant, rec, ControlStats())
    kept = sum(r.work_done_card_s for r in plant.job_records())
    assert m["lost_work_card_s"] > 0.0
    assert m["throughput"] == pytest.approx(kept / 120.0, rel=1e-12)
    assert m["throughput_frac"] == pytest.approx(kept / 120.0 / plant.site.n_cards, rel=1e-12)
    tr = plant.truth()
    held = int((tr.card_busy_in_step & ~tr.failed).sum())
    assert bool(tr.failed[3]) and rec.series["allocated_cards"][-1] == float(held)


def _idle_example_site(duration_s: float) -> RunScenario:
    """The example site (8 racks, hosts that can be powered off) with no jobs."""
    data: dict[str, Any] = {"name": "idle", "duration_s": duration_s, "seed": 1, "workload": {"source": "none"}}
    return run_scenario_from_dict(data, source="idle", site=example_site())


def test_hosts_off_and_the_set_point_are_time_averages_over_the_run() -> None:
    """Two of the example site's hosts powered off at 20 s of a 100 s run; the set-point raised at
    50 s: ``host_off_frac`` is the host-seconds off over the run's host-seconds, the mean set-point
    the set-point's time average, both from the true state after each step."""
    sc = _idle_example_site(100.0)
    plant = build_plant(sc)
    site = plant.site
    assert site.hosts_managed
    rec = Recorder(plant, judge_from_s=15.0)
    seen: list[tuple[float, float, Any]] = []
    for i in range(100):
        if i == 20:
            plant.power_off_hosts([0, 1])
        if i == 50:
            plant.set_supply_temp(plant.truth().supply_setpoint_c + 4.0)
        seen += _run(plant, rec, [1.0])
    m = _metrics(sc, plant, rec, ControlStats())
    off_s = sum(float(tr.host_off.sum()) * dt for _t, dt, tr in seen)
    setpoint = sum(tr.supply_setpoint_c * dt for _t, dt, tr in seen) / 100.0
    assert off_s > 0.0 and seen[0][2].supply_setpoint_c != seen[-1][2].supply_setpoint_c
    assert m["host_off_frac"] == pytest.approx(off_s / 100.0 / site.n_hosts, rel=1e-12)
    assert m["mean_supply_setpoint_c"] == pytest.approx(setpoint, rel=1e-12)


def test_the_controllers_counts_are_reported_under_their_own_keys() -> None:
    """``solve_max_s`` is the slowest decision (not the last), ``fallbacks`` the decisions whose
    solve fell back, apart from the fail-safe counts."""
    sc = _idle_example_site(10.0)
    plant = build_plant(sc)
    rec = Recorder(plant, judge_from_s=15.0)
    _run(plant, rec, [1.0] * 10)
    stats = ControlStats(decisions=3, fallbacks=2, failsafe_entries=1, failsafe_decisions=4)
    stats.solve_times_s.extend([0.02, 0.5, 0.03])
    m = _metrics(sc, plant, rec, stats)
    assert m["solve_max_s"] == 0.5 and m["solve_median_s"] == 0.03
    assert (m["decisions"], m["fallbacks"], m["failsafe_entries"], m["failsafe_decisions"]) == (3, 2, 1, 4)


def test_evaluate_names_the_jobs_behind_a_missed_throughput_bound() -> None:
    """One 16-card rack, two jobs from t = 0; the static cap slows them: its throughput bound (0.1%
    of the baseline's) is missed and the why names the jobs, from the runs' per-job work."""

    def j(job_id: str) -> dict[str, Any]:
        return {"id": job_id, "n_cards": 8, "duration_s": 1e5, "step_time_s": 1.0, "compute_share": 0.97}

    data: dict[str, Any] = {
        "name": "slowed",
        "duration_s": 120.0,
        "seed": 1,
        "workload": {"source": "none"},
        "jobs": [{**j("a"), "running_at_start": True}, {**j("b"), "running_at_start": True}],
        "targets": {"policy": "static-cap", "throughput_loss_pct_max": 0.1},
    }
    sc = run_scenario_from_dict(data, source="slowed", site=small_site(1))
    ev = evaluate(sc, ["static-cap"], jobs=1)
    (loss,) = ev.targets
    assert loss.met is False
    assert "by job (" in loss.why and "a (8 cards" in loss.why and "b (8 cards" in loss.why
