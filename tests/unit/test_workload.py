"""Jobs: speed vs clock, the generator's statistics, trace replay with clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from twin.workload import (
    KALOS,
    GeneratorConfig,
    JobSpec,
    PhaseModel,
    TraceError,
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
