"""SIGTERM (``kill``, ``timeout``, systemd or a batch scheduler stopping a job) to ``racktwin journal``,
``twin``, ``fit-*``, ``optimize`` and ``evaluate``, as processes: their ``--help`` says 130 with one line,
as for a Ctrl-C, and optimize's and evaluate's lines say which of their files they wrote (evaluate
during its runs: tests/agent/test_walkthrough_evaluate_sigterm.py).

SIGTERM took its default action in these commands: the process died (exit 143 in a shell, -15 here)
with no word on stderr, an operator left to guess whether ``optimize`` had written its plan. Each test
holds the command where it is working, not by timing: on its output (a pipe it fills that this test
does not read yet), or, for optimize and evaluate, on a file it is about to write (a FIFO where its
temporary file goes, which blocks the write until a reader comes), after the command has said so on
stderr or has replaced the file it writes before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.journal import Journal

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _racktwin(*argv: str, cwd: Path = REPO) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "agent.cli", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _journal_of_many_decisions(path: Path, n: int) -> Path:
    """A journal whose text (``--last n``) is far more than a pipe holds: n decisions with a long
    explanation each."""
    j = Journal(path)
    for i in range(n):
        summary = {"status": "optimal", "source": "milp", "explanation": [f"decision {i}: " + "x" * 1000]}
        j.record_decision(i, 100.0 * (i + 1), "enforce", "optimal", 0.01, summary, [])
    j.close()
    return path


def _stopped_while_writing_its_output(argv: list[str]) -> tuple[int, bytes]:
    """(exit status, stderr) of ``racktwin ARGV`` sent SIGTERM once it has begun an output that the pipe
    cannot hold whole: it is blocked writing the rest until it is read."""
    proc = _racktwin(*argv)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.read(1)  # it is writing its output and waits on us for the rest
        assert first, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        proc.stdout.read()
        err = proc.stderr.read()
        return proc.wait(timeout=120), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", ["journal", "twin sweep-supply", "fit-power"])
def test_sigterm_is_exit_status_130_with_one_line(command: str, tmp_path: Path) -> None:
    """SIGTERM while ``journal`` prints 300 decisions, ``twin sweep-supply --json`` 700 points,
    ``fit-power`` 20,000 predictions: exit status 130 and ``racktwin COMMAND: interrupted`` alone on
    stderr, as a Ctrl-C (it was killed: -15, nothing said)."""
    argv = {
        "journal": [
            "journal",
            "--journal",
            str(_journal_of_many_decisions(tmp_path / "j.sqlite", 300)),
            "--last",
            "300",
        ],
        "twin sweep-supply": ["twin", "sweep-supply", "--step-k", "0.05", "--json"],
        "fit-power": ["fit-power", str(EXAMPLES / "sweep-perseus.csv"), "--predict", ",".join(["1000"] * 20_000)],
    }[command]
    assert _stopped_while_writing_its_output(argv) == (130, f"racktwin {command}: interrupted\n".encode())


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _until_blocked_on_a_fifo(proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``proc`` is blocked opening a FIFO for writing (Linux: ``/proc/PID/wchan`` reads
    ``wait_for_partner``), or has ended: the test's one FIFO, so the files before it are written. The
    file before it being replaced is not enough: the command may still be rendering the next one
    (``racktwin optimize`` imports matplotlib for report.html: a SIGTERM inside that C extension's
    initialisation ended it with -6 or an ImportError, about every second run, until such a signal was
    held back to the initialisation's end; tests/agent/test_cli_sigterm_import.py signals it there)."""
    wchan = Path(f"/proc/{proc.pid}/wchan")
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if wchan.read_text().strip() == "wait_for_partner":
                return
        time.sleep(0.02)


def _files(folder: Path) -> list[str]:
    """The regular files in ``folder`` (not the FIFO of the test, which the command removes only when
    the signal came in the write it blocks)."""
    return sorted(p.name for p in folder.iterdir() if p.is_file())


def _optimize_held_at(tmp_path: Path, held: str) -> tuple[subprocess.Popen[bytes], Path, list[bytes]]:
    """``racktwin optimize examples/scenario-nominal.toml --out OUT`` over the files of an earlier run
    (``old``), held as it writes ``held`` (a FIFO at ``held.tmp``: opening it blocks until a reader
    comes); returned once it has said on stderr that it is writing its files, with its stderr so far."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("plan.json", "racks.csv", "report.html"):
        (out / name).write_text("old")
    _fifo(out / f"{held}.tmp")
    proc = _racktwin("optimize", str(EXAMPLES / "scenario-nominal.toml"), "--out", str(out), cwd=tmp_path)
    assert proc.stderr is not None
    lines: list[bytes] = []
    while not (lines and lines[-1].startswith(b"racktwin optimize: writing ")):
        line = proc.stderr.readline()
        assert line, b"".join(lines)  # it ended before writing
        lines.append(line)
    return proc, out, lines


def _stop(proc: subprocess.Popen[bytes], lines: list[bytes]) -> tuple[int, list[str]]:
    """SIGTERM to ``proc``: its exit status and the lines it wrote on stderr after ``lines``."""
    assert proc.stdout is not None and proc.stderr is not None
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == b"", out  # no summary line
    return proc.returncode, err.decode().splitlines()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_sigterm_before_optimize_writes_its_files_says_none_was_written(tmp_path: Path) -> None:
    """SIGTERM as ``racktwin optimize`` begins to write: exit status 130 and one line saying no file was
    written (an earlier run's files there are as they were, none half-written)."""
    proc, out, lines = _optimize_held_at(tmp_path, "plan.json")
    rc, after = _stop(proc, lines)
    assert (rc, after) == (
        130,
        [
            f"racktwin optimize: interrupted: no file written to {out} (none half-written; any from an earlier "
            "run are as they were)"
        ],
    ), b"".join(lines)
    assert _files(out) == ["plan.json", "racks.csv", "report.html"]  # no temporary file left
    assert all((out / name).read_text() == "old" for name in ("plan.json", "racks.csv", "report.html"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_sigterm_while_optimize_writes_its_files_says_which_it_wrote(tmp_path: Path) -> None:
    """SIGTERM once ``racktwin optimize`` has written plan.json and is writing racks.csv: exit status 130
    and one line saying plan.json was written and racks.csv and report.html were not (they are the
    earlier run's, whole)."""
    proc, out, lines = _optimize_held_at(tmp_path, "racks.csv")
    _until_blocked_on_a_fifo(proc)  # at the held file: every file before it is replaced
    rc, after = _stop(proc, lines)
    assert (rc, after) == (
        130,
        [
            f"racktwin optimize: interrupted: wrote {out}/plan.json; racks.csv, report.html not written (none "
            "half-written; any from an earlier run are as they were)"
        ],
    ), b"".join(lines)
    assert (out / "plan.json").read_text().startswith("{")
    assert _files(out) == ["plan.json", "racks.csv", "report.html"]  # no temporary file left
    assert (out / "racks.csv").read_text() == "old" and (out / "report.html").read_text() == "old"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_sigterm_while_evaluate_writes_its_files_says_which_it_wrote(tmp_path: Path) -> None:
    """SIGTERM once ``racktwin evaluate`` (30 site seconds of the baseline, in process) has written
    metrics.json and is writing metrics.csv: exit status 130 and one line saying metrics.json was written
    and the others were not (they are the earlier run's, whole). Its line said ``interrupted`` alone, its
    --help "nothing written"; and SIGTERM here, after the runs, took its default action (-15, no word)."""
    out = tmp_path / "out"
    out.mkdir()
    names = ("metrics.json", "metrics.csv", "series.csv", "report.html")
    for name in names:
        (out / name).write_text("old")
    _fifo(out / "metrics.csv.tmp")
    argv = ["evaluate", "--scenario", str(EXAMPLES / "day-nominal.toml"), "--duration", "30", "--policy", "baseline"]
    proc = _racktwin(*argv, "--jobs", "1", "--quiet", "--out", str(out), cwd=tmp_path)
    _until_blocked_on_a_fifo(proc)  # at the held file: every file before it is replaced
    rc, after = _stop(proc, [])
    assert (rc, after[-1:]) == (
        130,
        [
            f"racktwin evaluate: interrupted: wrote {out}/metrics.json; metrics.csv, series.csv, report.html not "
            "written (none half-written; any from an earlier run are as they were)"
        ],
    ), after
    assert (out / "metrics.json").read_text().startswith("{")
    assert _files(out) == sorted(names)  # no temporary file left
    assert all((out / name).read_text() == "old" for name in names[1:])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_sigterm_while_optimize_writes_its_report_names_the_two_files_it_wrote(tmp_path: Path) -> None:
    """SIGTERM once ``racktwin optimize`` has written plan.json and racks.csv and is writing report.html:
    the line names both files written and report.html not written (the earlier run's, whole)."""
    proc, out, lines = _optimize_held_at(tmp_path, "report.html")
    _until_blocked_on_a_fifo(proc)  # at the held file: every file before it is replaced
    rc, after = _stop(proc, lines)
    assert (rc, after) == (
        130,
        [
            f"racktwin optimize: interrupted: wrote {out}/plan.json, racks.csv; report.html not written (none "
            "half-written; any from an earlier run are as they were)"
        ],
    ), b"".join(lines)
    assert (out / "plan.json").read_text().startswith("{") and (out / "racks.csv").read_text() != "old"
    assert (out / "report.html").read_text() == "old"


def test_optimize_interrupted_before_its_folder_is_known_or_after_its_files_says_so() -> None:
    """The line of a Ctrl-C or SIGTERM before ``racktwin optimize`` knows its ``--out`` (reading the
    scenario) and after it has written all three files (printing its summary)."""
    from agent.commands.common import WrittenFiles
    from agent.commands.optimize import OUTPUT_FILES

    written = WrittenFiles(OUTPUT_FILES)
    assert written.left() == "no file written"
    written.out_dir = Path("out/nominal")
    written.files.extend(OUTPUT_FILES)
    assert written.left() == f"wrote {Path('out/nominal') / 'plan.json'}, racks.csv, report.html"
