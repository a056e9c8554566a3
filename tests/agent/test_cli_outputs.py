"""Output folders and files of the commands: checked before a run (a long evaluation is not lost to a
folder named like its report), one line and exit status 2 when they cannot be written; a scenario's
name never leads the default output folder out of ./out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.cli import main
from agent.commands.common import UserError, check_output_file, folder_name, prepare_output_dir, write_text_replacing

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("day-nominal", "day-nominal"),
        ("../../escaped", "_.._escaped"),
        ("/etc/racktwin", "_etc_racktwin"),
        ("a\x00b", "a_b"),
        ("..", "unnamed"),
        ("nominal day (v2)", "nominal_day_v2_"),
    ],
)
def test_a_scenario_name_becomes_one_safe_folder_name(name: str, folder: str) -> None:
    assert folder_name(name) == folder
    assert Path("out", folder_name(name)).parent == Path("out")


def test_output_folders_and_files_are_checked_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper"
    prepare_output_dir(out, ("a.json", "b.csv"))  # created with its parents
    assert out.is_dir()
    (out / "b.csv").mkdir()
    with pytest.raises(UserError, match=r"b\.csv: exists and is not a regular file"):
        prepare_output_dir(out, ("a.json", "b.csv"))
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    with pytest.raises(UserError, match="cannot create the folder"):
        prepare_output_dir(a_file / "sub", ())
    with pytest.raises(UserError, match="plain: exists and is not a folder"):  # not mkdir's bare "File exists"
        prepare_output_dir(a_file, ())
    with pytest.raises(UserError, match="does not exist"):
        check_output_file(tmp_path / "missing" / "t.csv", "--truth-log")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        check_output_file(fifo, "--summary")
    with pytest.raises(UserError, match="not a usable path"):
        check_output_file(tmp_path / "a\x00b", "--summary")


def _one_line_error(capsys: pytest.CaptureFixture[str], rc: int, words: str) -> None:
    """Exit 2 with one error line (warnings about the scenario may come before it: a demo run
    shortened with --minutes says once that the later jobs are not submitted)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if ": warning: " not in line]
    assert rc == 2
    assert len(err) == 1 and words in err[0], err


def test_evaluate_refuses_an_unwritable_report_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out" / "metrics.json").mkdir(parents=True)
    scen = str(EXAMPLES / "day-nominal.toml")
    rc = main(
        ["evaluate", "--scenario", scen, "--duration", "60", "--policy", "baseline", "--out", str(tmp_path / "out")]
    )
    _one_line_error(capsys, rc, "metrics.json: exists and is not a regular file")
    assert not (tmp_path / "out" / "report.html").exists()  # nothing ran


def test_optimize_keeps_a_hostile_scenario_name_inside_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (EXAMPLES / "scenario-nominal.toml").read_text(encoding="utf-8")
    text = text.replace('name = "nominal"', 'name = "../../escaped"', 1)
    text = text.replace('site = "supernode-512.toml"', f'site = "{EXAMPLES / "supernode-512.toml"}"', 1)
    scen = tmp_path / "work" / "s.toml"
    scen.parent.mkdir()
    scen.write_text(text, encoding="utf-8")
    monkeypatch.chdir(scen.parent)
    assert main(["optimize", str(scen), "--quiet"]) == 0
    capsys.readouterr()
    assert (scen.parent / "out" / "_.._escaped" / "plan.json").is_file()
    assert not (tmp_path / "escaped").exists()


def test_demo_refuses_an_unwritable_out_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "truth.csv").mkdir()
    rc = main(["demo", "--minutes", "1", "--out", str(tmp_path)])
    _one_line_error(capsys, rc, "truth.csv: exists and is not a regular file")


def test_the_temporary_files_of_the_outputs_are_checked_before_writing(tmp_path: Path) -> None:
    """Each output replaced whole is written through NAME.tmp: a folder there (or a link to one) is
    refused with the outputs, a stale regular file there is not (it is written over)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.json.tmp").write_text("a failed run's\n", encoding="utf-8")
    prepare_output_dir(out, ("a.json", "b.csv"))
    (out / "b.csv.tmp").mkdir()
    with pytest.raises(UserError, match=r"b\.csv\.tmp: is a folder \(the temporary file b\.csv is written through"):
        prepare_output_dir(out, ("a.json", "b.csv"))
    prepare_output_dir(out, ("a.json", "b.csv"), replaced_whole=("a.json",))  # b.csv is written in place
    (out / "c.json.tmp").symlink_to(out / "b.csv.tmp")
    with pytest.raises(UserError, match=r"c\.json\.tmp: is a folder"):
        check_output_file(out / "c.json", "--summary", replaced_whole=True)
    check_output_file(out / "c.json", "--summary")  # not through a temporary: it is not looked at
    with pytest.raises(UserError, match="not a usable path"):  # not a traceback
        check_output_file(out / ("x" * 300), "--summary")


@pytest.mark.parametrize(
    ("command", "file"),
    [("optimize", "plan.json"), ("evaluate", "report.html"), ("demo", "demo-summary.json"), ("demo", "summary.json")],
)
def test_a_folder_where_an_output_is_written_through_is_refused_before_any_work(
    command: str, file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder NAME.tmp failed the command at the end, its work done: now one line before the work."""
    out = tmp_path / "out"
    (out / f"{file}.tmp").mkdir(parents=True)
    args = {
        "optimize": ["optimize", str(EXAMPLES / "scenario-nominal.toml"), "--quiet"],
        "evaluate": ["evaluate", "--scenario", str(EXAMPLES / "day-nominal.toml"), "--duration", "60"],
        "demo": ["demo", "--minutes", "1"],
    }[command]
    rc = main([*args, "--out", str(out)])
    _one_line_error(capsys, rc, f"{out / file}.tmp: is a folder (the temporary file {file} is written through")
    assert sorted(p.name for p in out.iterdir()) == [f"{file}.tmp"]  # nothing ran


@pytest.mark.parametrize(
    ("command", "phrases"),
    [
        (
            "demo",
            [
                "--minutes N site minutes to run, more than one control period of the agent (0.25, i.e. 15 s) "
                "and at most 10080 (a week) (default 75)",
                "--speed X site seconds per wall second, 1..1000 (default 30;",
                "wall seconds between progress lines (the run with the agent, then the one without), > 0 (default 5)",
            ],
        ),
        (
            "evaluate",
            [
                "--duration S site seconds to run, more than one control period (period_s, 15 s unless --control "
                "sets it) and at most 31536000 (365 days)",
                "--sample-s S time-series resolution in the report, 1..86400 site seconds (default 60)",
                "--jobs N worker processes, 1..256",
                "--seed N override the scenario's seed, >= 0",
            ],
        ),
        (
            "optimize",
            [
                "--time-limit S solver time limit, 0 < S <= 3600 seconds, for the DVFS + set-point cycle and for "
                "placement (default: the scenario's [solver] time_limit_s, 2 unless set)",
                "--quiet no progress lines on stderr (warnings and why a plan is infeasible still print)",
            ],
        ),
    ],
)
def test_help_gives_the_units_ranges_and_defaults_of_the_options(
    command: str, phrases: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # as one line, however argparse wraps it
    for phrase in phrases:
        assert phrase in text, phrase


def test_an_output_file_is_replaced_whole_or_left_as_it_was(tmp_path: Path) -> None:
    """A write that fails part way (here a text the encoder refuses after its first characters, as a
    full disk would) leaves the earlier file as it was and no temporary file; one that succeeds
    replaces it whole, CSV row ends kept as written."""
    path = tmp_path / "plan.json"
    path.write_text("earlier run\n", encoding="utf-8")
    with pytest.raises(UnicodeEncodeError):
        write_text_replacing(path, "new run " * 10_000 + "\ud800")
    assert path.read_text(encoding="utf-8") == "earlier run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    write_text_replacing(path, "a,b\r\n1,2\r\n", newline="")
    assert path.read_bytes() == b"a,b\r\n1,2\r\n"


def test_an_output_whose_temporary_name_just_fits_is_accepted_and_written(tmp_path: Path) -> None:
    """NAME.tmp exactly as long as the file system takes (``PC_NAME_MAX`` bytes) can be written: the output is
    accepted, and written whole through it. Refused at that length, a name the write takes was refused."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("s" * (name_max - len(".tmp")))
    check_output_file(path, "--summary", replaced_whole=True)
    prepare_output_dir(tmp_path, (path.name,))
    write_text_replacing(path, "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    with pytest.raises(UserError, match="the name is too long for the temporary file"):
        check_output_file(tmp_path / (path.name + "s"), "--summary", replaced_whole=True)
