"""Jobs: speed vs clock, the generator's statistics, trace replay with clear errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from twin.workload import (
    KALOS,
    GeneratorConfig,
    JobSpec,
    PhaseModel,
    TraceError,
    WorkloadStats,
    acme_stats,
    compute_utilization,
    expected_job_card_seconds,
    generate_jobs,
    load_trace,
    relative_throughput,
    synchronous_utilization,
    trace_csv,
)

pytestmark = pytest.mark.unit


def test_throughput_is_sublinear_in_clock() -> None:
    assert float(relative_throughput(0.8, 1.0)) == 1.0
    half = float(relative_throughput(0.8, 0.5))
    assert half == pytest.approx(1.0 / (0.8 * 2 + 0.2))
    assert 0.5 < half < 1.0
    assert float(relative_throughput(0.0, 0.5)) == 1.0  # nothing scales with the clock


def test_a_card_faster_than_its_job_waits() -> None:
    own = float(compute_utilization(0.8, 0.7, 0.2))
    assert float(synchronous_utilization(0.8, 0.7, 0.7, 0.2)) == pytest.approx(own)
    waiting = float(synchronous_utilization(0.8, 1.0, 0.7, 0.2))
    assert waiting < float(compute_utilization(0.8, 1.0, 0.2))
    # by hand: the slowest card sets the step, 0.8 / 0.7 + 0.2 = 1.342857 top-clock steps; the fast
    # card is busy 0.8 of it and waits the other 0.542857 at 0.2: (0.8 + 0.108571) / 1.342857
    assert waiting == pytest.approx(0.6765957, rel=1e-6)


def test_generator_is_seeded_and_reproducible() -> None:
    a = generate_jobs(512, 6 * 3600, seed=7)
    b = generate_jobs(512, 6 * 3600, seed=7)
    c = generate_jobs(512, 6 * 3600, seed=8)
    assert a == b
    assert a != c


def test_generated_sizes_and_durations_follow_the_cluster_statistics() -> None:
    cfg = GeneratorConfig()
    jobs = generate_jobs(8192, 7 * 86400, seed=1, config=cfg)
    n = np.array([j.n_cards for j in jobs])
    d = np.array([j.duration_s for j in jobs])
    assert np.all(n % 8 == 0) and n.min() == 8 and n.max() == 256
    assert np.mean(n == 8) == pytest.approx(0.79, abs=0.02)  # heavy-tailed: most jobs are one host
    assert np.median(d) == pytest.approx(KALOS.median_run_time_s, rel=0.1)
    assert np.mean(d) == pytest.approx(cfg.mean_duration_s(), rel=0.1)
    assert all(0.60 <= j.compute_share <= 0.87 for j in jobs)
    assert {j.checkpoint_interval_s for j in jobs} == {900.0}
    times = np.array([j.submit_time_s for j in jobs])
    assert np.all(np.diff(times) >= 0) and times.max() < 7 * 86400


def test_arrival_rate_follows_littles_law() -> None:
    cfg = GeneratorConfig(target_allocation=0.65)
    horizon = 7 * 86400
    jobs = generate_jobs(8192, horizon, seed=3, config=cfg)
    expected_jobs = 0.65 * 8192 * horizon / expected_job_card_seconds(cfg)
    assert len(jobs) == pytest.approx(expected_jobs, rel=0.02)
    # offered load: expected card-seconds of wall time per second / site cards
    ph = cfg.phases
    wall = [ph.expected_wall_time_s(j.duration_s, j.checkpoint_interval_s, j.checkpoint_duration_s) for j in jobs]
    offered = sum(j.n_cards * w for j, w in zip(jobs, wall, strict=True)) / horizon / 8192
    assert offered == pytest.approx(0.65, rel=0.25)  # heavy tails: a week is a noisy sample


def test_acme_stats_reads_a_cluster_row(shared_data: Path) -> None:
    stats = acme_stats(shared_data / "acme_cluster_summary.csv", "Kalos")
    assert stats == KALOS
    with pytest.raises(TraceError, match="no cluster 'Nope'"):
        acme_stats(shared_data / "acme_cluster_summary.csv", "Nope")


def test_phase_model_expected_wall_time() -> None:
    ph = PhaseModel(startup_s=60, comm_stalls_per_hour=0, input_stalls_per_hour=0)
    assert ph.expected_wall_time_s(900.0, 900.0, 60.0) == pytest.approx(60 + 960)


def test_trace_round_trip(tmp_path: Path) -> None:
    jobs = generate_jobs(512, 3600, seed=2)
    path = tmp_path / "trace.csv"
    path.write_text(trace_csv(jobs), encoding="utf-8", newline="")
    assert load_trace(path) == jobs


def test_trace_with_duration_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "# a comment\njob_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share,priority\n"
        "b,10,16,3600,2.0,0.8,2\na,0,8,600,1.5,0.7,1\n",
        encoding="utf-8",
    )
    jobs = load_trace(path)
    assert [j.job_id for j in jobs] == ["a", "b"]  # sorted by submission time
    assert jobs[1] == JobSpec(
        "b", 16, work_steps=1800.0, step_time_s=2.0, compute_share=0.8, priority=2.0, submit_time_s=10.0
    )


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("job_id,submit_time_s,n_cards,duration_s,step_time_s\n", 1, "compute_share", "missing required column"),
        ("job_id,submit_time,n_cards,duration_s,step_time_s,compute_share\n", 1, "submit_time", "did you mean"),
        (
            "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\nx,0,8,100,abc,0.5\n",
            2,
            "step_time_s",
            "not a number",
        ),
        (
            "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\nx,0,8,100,1,nan\n",
            2,
            "compute_share",
            "finite",
        ),
        (
            "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\nx,0,8.5,100,1,0.5\n",
            2,
            "n_cards",
            "integer",
        ),
        (
            "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\nx,0,8,100,1,1.5\n",
            2,
            "compute_share",
            "<= 1",
        ),
        (
            "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\nx,0,8,100,1,0.5\nx,1,8,100,1,0.5\n",
            3,
            "job_id",
            "duplicate",
        ),
        (
            "job_id,submit_time_s,n_cards,duration_s,work_steps,step_time_s,compute_share\n",
            1,
            "duration_s",
            "exactly one",
        ),
        # a quote left open on its line (here one that a CSV writer would close on the next line,
        # leaving the record 6 fields): was a bare ValueError from zip(), naming no file or line
        (
            'job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\n"a\n",0,8,100,1,0.5\n',
            2,
            "",
            "expected 6 fields (one per header column), got 1; a quoted field must end on its line",
        ),
        (
            'job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share\n"a,0,8,100,1,0.5\nb,0,8,100,1,0.5\n',
            2,
            "",
            "got 1; a quoted field must end on its line",
        ),
    ],
)
def test_trace_errors_name_file_line_and_column(
    tmp_path: Path, text: str, line: int, column: str, fragment: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert err.line == line and err.column == column
    assert fragment in str(err)
    assert str(path) in str(err)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="file not found"):
        load_trace(tmp_path / "none.csv")


# ------------------------------------------------------------------------------------------------
# the generator's draws, against the rules GeneratorConfig documents (expected values by hand)
# ------------------------------------------------------------------------------------------------
def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


#: Kalos (acme_cluster_summary.csv): median / mean GPUs 1 / 26.77, run time 124 / 1259.689 s, max 625740 s;
#: a lognormal of median m and mean a has sigma = sqrt(2 ln(a / m))
SIZE_SIGMA = math.sqrt(2.0 * math.log(26.77 / 1.0))
RUN_SIGMA = math.sqrt(2.0 * math.log(1259.689 / 124.0))


def _clipped_lognormal_mean_by_quadrature(median: float, sigma: float, lo: float, hi: float) -> float:
    z = np.linspace(-12.0, 12.0, 480_001)
    weight = np.exp(-(z**2) / 2.0) / math.sqrt(2.0 * math.pi)
    x = np.clip(median * np.exp(sigma * z), lo, hi)
    return float(np.sum(x * weight) * (z[1] - z[0]))


@pytest.fixture(scope="module")
def day_of_jobs() -> list[JobSpec]:
    return generate_jobs(8192, 86400.0, seed=11)


def test_generated_sizes_are_whole_hosts_of_a_lognormal_rounded_up(day_of_jobs: list[JobSpec]) -> None:
    """``8 ceil(X / 8)`` within 8..256, X lognormal of median 1 and mean 26.77 GPUs."""
    n = np.array([j.n_cards for j in day_of_jobs])
    assert np.mean(n == 8) == pytest.approx(_phi(math.log(8) / SIZE_SIGMA), abs=0.01)  # 0.791
    assert np.mean(n == 16) == pytest.approx(_phi(math.log(16) / SIZE_SIGMA) - _phi(math.log(8) / SIZE_SIGMA), abs=0.01)
    assert np.mean(n == 256) == pytest.approx(1.0 - _phi(math.log(248) / SIZE_SIGMA), abs=0.004)  # 0.0158


def test_generated_run_times_are_the_clusters_lognormal_clipped(day_of_jobs: list[JobSpec]) -> None:
    """Top-clock run time lognormal of median 124 s and mean 1259.689 s, clipped to 60 s..625740 s."""
    d = np.array([j.duration_s for j in day_of_jobs])
    assert d.min() == pytest.approx(60.0) and d.max() <= 625740.0 * (1 + 1e-12)
    assert np.mean(np.isclose(d, 60.0)) == pytest.approx(_phi(math.log(60.0 / 124.0) / RUN_SIGMA), abs=0.015)  # 0.368
    assert np.mean(d <= 124.0) == pytest.approx(0.5, abs=0.015)
    assert np.mean(d > 1000.0) == pytest.approx(1.0 - _phi(math.log(1000.0 / 124.0) / RUN_SIGMA), abs=0.015)


def test_generated_steps_shares_checkpoints_and_priorities_follow_their_draws(day_of_jobs: list[JobSpec]) -> None:
    """Step time lognormal median 2 s shape 0.5 in 0.2..30 s; compute share uniform 0.60..0.87;
    checkpoint every 900 s lasting lognormal median 60 s shape 0.3 in 20..300 s; priorities
    0.5 / 1 / 2 at 20 / 60 / 20% with SLOs 0 / 0.7 / 0.9; noncompute utilization from the share and an
    exposed-communication utilization uniform 0.1..0.3 (``((c/s)(1-s) + (1-c/s) u) / (1-c)``, s = 0.87)."""
    jobs = day_of_jobs
    above_one_sigma = 1.0 - _phi(1.0)  # 0.1587
    step = np.array([j.step_time_s for j in jobs])
    assert step.min() >= 0.2 and step.max() <= 30.0
    assert np.median(step) == pytest.approx(2.0, rel=0.03)
    assert np.mean(step > 2.0 * math.exp(0.5)) == pytest.approx(above_one_sigma, abs=0.01)
    ckpt = np.array([j.checkpoint_duration_s for j in jobs])
    assert ckpt.min() >= 20.0 and ckpt.max() <= 300.0
    assert np.median(ckpt) == pytest.approx(60.0, rel=0.03)
    assert np.mean(ckpt > 60.0 * math.exp(0.3)) == pytest.approx(above_one_sigma, abs=0.01)
    assert np.mean(ckpt > 100.0) == pytest.approx(1.0 - _phi(math.log(100.0 / 60.0) / 0.3), abs=0.008)  # 0.044
    assert {j.checkpoint_interval_s for j in jobs} == {900.0}
    c = np.array([j.compute_share for j in jobs])
    assert c.min() >= 0.60 and c.max() <= 0.87
    assert np.mean(c) == pytest.approx(0.735, abs=0.005)
    assert np.mean(c < 0.70) == pytest.approx(0.10 / 0.27, abs=0.015)
    s = 0.87
    ncu = np.array([j.noncompute_utilization for j in jobs])
    u_comm = (ncu * (1.0 - c) - (c / s) * (1.0 - s)) / (1.0 - c / s)
    assert u_comm.min() >= 0.1 - 1e-9 and u_comm.max() <= 0.3 + 1e-9
    assert np.mean(u_comm) == pytest.approx(0.2, abs=0.005)
    prio = np.array([j.priority for j in jobs])
    for p, share in ((0.5, 0.2), (1.0, 0.6), (2.0, 0.2)):
        assert np.mean(prio == p) == pytest.approx(share, abs=0.015)
    assert {(j.priority, j.min_throughput_frac) for j in jobs} == {(0.5, 0.0), (1.0, 0.7), (2.0, 0.9)}
    assert all(j.duration_s == pytest.approx(j.work_steps * j.step_time_s) for j in jobs[:100])


def test_expected_job_card_seconds_by_hand() -> None:
    """Little's law's denominator for the defaults: E[cards] x E[wall time], the wall time 60 s of
    start-up plus the top-clock run time stretched by stalls ((2 x 20 + 1 x 30) s an hour, lognormal
    means: x exp(0.5^2 / 2)) and checkpoints (mean 60 exp(0.3^2 / 2) s every 900 s)."""
    sizes = np.arange(8, 257, 8)
    upper = np.array([_phi(math.log(k) / SIZE_SIGMA) for k in sizes])
    upper[-1] = 1.0
    mean_cards = float(np.dot(sizes, np.diff(np.concatenate([[0.0], upper]))))
    mean_run_s = _clipped_lognormal_mean_by_quadrature(124.0, RUN_SIGMA, 60.0, 625740.0)
    stretch = 1.0 + 70.0 * math.exp(0.125) / 3600.0 + 60.0 * math.exp(0.045) / 900.0
    cfg = GeneratorConfig()
    assert cfg.mean_size_cards() == pytest.approx(mean_cards, rel=1e-9)
    assert cfg.mean_duration_s() == pytest.approx(mean_run_s, rel=1e-4)
    assert expected_job_card_seconds(cfg) == pytest.approx(mean_cards * (60.0 + mean_run_s * stretch), rel=1e-4)
    scaled = GeneratorConfig(duration_scale=3.0)
    assert scaled.mean_duration_s() == pytest.approx(3.0 * mean_run_s, rel=1e-4)


def test_duration_scale_stretches_the_clipped_run_times() -> None:
    """``duration_scale`` multiplies the clipped run time: at 3 the clip at 60 s becomes 180 s."""
    jobs = generate_jobs(8192, 86400.0, seed=11, config=GeneratorConfig(duration_scale=3))
    d = np.array([j.duration_s for j in jobs])
    assert np.mean(np.isclose(d, 180.0)) == pytest.approx(_phi(math.log(60.0 / 124.0) / RUN_SIGMA), abs=0.015)
    assert np.median(d) == pytest.approx(3 * 124.0, rel=0.05)


def test_generated_jobs_fall_in_their_window_and_fit_the_site() -> None:
    """Submissions lie in ``[start_s, start_s + horizon_s)``; a job never asks for more whole hosts
    than the site has."""
    jobs = generate_jobs(8192, 3600.0, seed=5, start_s=50_000.0)
    times = np.array([j.submit_time_s for j in jobs])
    assert times.min() >= 50_000.0 and times.max() < 53_600.0
    assert len(jobs) == pytest.approx(0.65 * 8192 * 3600.0 / expected_job_card_seconds(GeneratorConfig()), rel=0.1)
    small = generate_jobs(100, 30 * 86400.0, seed=5)
    assert max(j.n_cards for j in small) == 96


def test_the_configured_checkpoint_interval_is_every_generated_jobs() -> None:
    jobs = generate_jobs(512, 86400.0, seed=5, config=GeneratorConfig(checkpoint_interval_s=600.0))
    assert {j.checkpoint_interval_s for j in jobs} == {600.0}


def test_the_phase_models_defaults_are_the_documented_ones() -> None:
    """docs/sim.md ("[phases]") and docs/twin.md list these defaults, and the agent and the models
    assume them: start-up 60 s, restart delay 180 s, 2 collective stalls an hour of median 20 s, 1 input
    stall of median 30 s, shape 0.5, a collective stall at utilization 0.2, checkpoints and waiting
    at 0, 3 restarts."""
    assert PhaseModel() == PhaseModel(
        startup_s=60.0,
        restart_delay_s=180.0,
        comm_stalls_per_hour=2.0,
        comm_stall_median_s=20.0,
        input_stalls_per_hour=1.0,
        input_stall_median_s=30.0,
        stall_sigma=0.5,
        communication_utilization=0.2,
        checkpoint_utilization=0.0,
        waiting_utilization=0.0,
        max_restarts=3,
    )


HEADER = "job_id,submit_time_s,n_cards,duration_s,step_time_s,compute_share"


@pytest.mark.parametrize(
    ("extra_columns", "extra_values", "column", "fragment"),
    [
        ("", "", "", ""),  # the base row is fine
        (",checkpoint_duration_s", ",0", "", ""),  # a checkpoint may take no time (>= 0)
        (",checkpoint_duration_s", ",900", "", ""),  # at most the default 900-s interval: equal is fine
        (",checkpoint_duration_s", ",901", "checkpoint_duration_s", "longer than"),
        (",checkpoint_interval_s,checkpoint_duration_s", ",600,600", "", ""),
        (",checkpoint_interval_s,checkpoint_duration_s", ",600,601", "checkpoint_duration_s", "longer than"),
        (",priority", ",0", "priority", "must be > 0"),
        (",checkpoint_interval_s", ",0", "checkpoint_interval_s", "must be > 0"),
    ],
)
def test_trace_values_at_their_documented_bounds(
    tmp_path: Path, extra_columns: str, extra_values: str, column: str, fragment: str
) -> None:
    """TRACE_COLUMNS' ranges, at their edges: ``checkpoint_duration_s`` >= 0 and at most the interval
    (900 s unless given), ``priority`` and ``checkpoint_interval_s`` > 0."""
    path = tmp_path / "t.csv"
    path.write_text(f"{HEADER}{extra_columns}\nx,0,8,3600,2,0.8{extra_values}\n", encoding="utf-8")
    if not column:
        (j,) = load_trace(path)
        assert j.work_steps == 1800.0
        return
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.column == column and info.value.line == 2 and fragment in str(info.value)


@pytest.mark.parametrize("column", ["duration_s", "step_time_s"])
def test_a_zero_duration_or_step_time_in_a_trace_names_its_column(tmp_path: Path, column: str) -> None:
    values = {"duration_s": "3600", "step_time_s": "2", column: "0"}
    path = tmp_path / "t.csv"
    path.write_text(f"{HEADER}\nx,0,8,{values['duration_s']},{values['step_time_s']},0.8\n", encoding="utf-8")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.column == column and "must be > 0" in str(info.value)


def test_a_warm_started_job_may_be_at_the_very_start_of_its_interval() -> None:
    """``first_checkpoint_after_s`` lies in (0, checkpoint_interval_s]: a whole interval is allowed."""
    spec = JobSpec("a", 8, 100.0, 1.0, 0.8, checkpoint_interval_s=900.0, first_checkpoint_after_s=900.0)
    assert spec.first_checkpoint_after_s == 900.0


def test_a_cluster_whose_jobs_are_all_alike_draws_them_alike() -> None:
    """Median = mean is a valid cluster row (no spread): every job takes ``8 ceil(16 / 8)`` = 16 cards
    and runs the median 600 s."""
    alike = WorkloadStats("alike", 16.0, 16.0, 600.0, 600.0, 600.0)
    jobs = generate_jobs(512, 86400.0, seed=1, config=GeneratorConfig(stats=alike))
    assert len(jobs) > 100
    assert {j.n_cards for j in jobs} == {16}
    assert all(j.duration_s == pytest.approx(600.0) for j in jobs)
