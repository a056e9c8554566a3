"""The final report of ``racktwin sim`` (agent/commands/sim_cmd.py, docs/sim.md): every count in it
carries thousands separators, as ``messages_published`` always did, so that ``1,373 applied`` reads
next to ``114,295 published``; and it says which signal stopped the run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.commands.sim_cmd import _report
from sim.runner import SimSummary
from twin.plant_types import Accounting

pytestmark = pytest.mark.unit


def _summary(**counts: object) -> SimSummary:
    accounting = Accounting(
        time_s=86_400.0,
        it_energy_j=3.6e9,  # 1,000 kWh
        cooling_energy_j=3.6e8,
        facility_energy_j=3.96e9,
        work_card_s=2_500_000.0,
        lost_work_card_s=0.0,
        jobs_submitted=12_000,
        jobs_finished=10_500,
        jobs_failed=0,
        jobs_running=1_200,
        jobs_queued=1_300,
        jobs_placed_by_plant=0,
        slo_violation_s=0.0,
        rack_over_limit_s=0.0,
        rack_over_limit_j=0.0,
        throttled_card_s=0.0,
        max_die_temp_c=70.0,
    )
    fields: dict[str, object] = {
        "scenario": "t",
        "site": "s",
        "site_id": "site1",
        "n_cards": 512,
        "n_racks": 8,
        "rack_power_limit_w": 50e3,
        "accounting": accounting,
        "start_epoch_s": 0.0,
        "site_time_s": 86_400.0,
        "wall_s": 1_440.0,
        "cpu_s": 720.0,
        "speed_requested": 60.0,
    }
    fields.update(counts)
    return SimSummary(**fields)  # type: ignore[arg-type]


def test_every_count_in_the_report_has_thousands_separators(capsys: pytest.CaptureFixture[str]) -> None:
    s = _summary(
        messages_published=114_295,
        commands_applied=1_373,
        commands_rejected=2_001,
        commands_expired=1_002,
        commands_after_end=1_500,
        rejected_messages={"bad json": 1_234},
        truth_rows=86_400,
    )
    _report(s, SimpleNamespace(truth_log=Path("truth.csv"), summary_path=None))
    err = capsys.readouterr().err
    assert "114,295 published" in err
    assert "commands 1,373 applied, 2,001 rejected, 1,002 expired, 1,500 after the end (not taken)" in err
    assert "bad messages 1,234" in err
    assert "jobs finished 10,500, running 1,200, queued 1,300" in err
    assert "truth log: truth.csv (86,400 rows)" in err


@pytest.mark.parametrize(
    ("stopped_by", "signal_name", "words"),
    [
        ("stop", "SIGINT", "racktwin sim: stopped by SIGINT after 86,400 s"),
        ("stop", "SIGTERM", "racktwin sim: stopped by SIGTERM after 86,400 s"),
        ("duration", None, "racktwin sim: stopped by duration after 86,400 s"),
    ],
)
def test_the_report_says_what_stopped_the_run(
    capsys: pytest.CaptureFixture[str], stopped_by: str, signal_name: str | None, words: str
) -> None:
    _report(
        _summary(stopped_by=stopped_by),
        SimpleNamespace(truth_log=None, summary_path=None),
        signal_name=signal_name,
    )
    err = capsys.readouterr().err
    assert err.startswith(words) and "stopped by stop" not in err
