"""SIGTERM or Ctrl-C to ``racktwin optimize`` and ``evaluate`` while a C extension module initialises:
matplotlib's ``ft2font`` as the report is drawn, HiGHS's ``highspy._core`` as the solver is loaded. Exit
status 130 with the one ``interrupted`` line that says which files were written, as anywhere else in them.

The KeyboardInterrupt came in the Python code that the extension's initialisation calls (pybind11 making its
enums): the import failed (``ImportError: initialization failed``) and the interpreter aborted as it
finalised (-6), about every second run of tests/agent/test_cli_sigterm.py's report case once it signalled
as the report began. Each test holds the command inside that initialisation, not by timing:
tests/agent/import_hold.py, armed by a ``sitecustomize`` on its PYTHONPATH, says so on stderr and waits
for a byte on a pipe that the test writes only after its signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from import_hold import HELD

from agent.commands.common import sigterm_interrupts
from agent.commands.deferred_signals import signals_deferred

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
LEFT_AS_THEY_WERE = "(none half-written; any from an earlier run are as they were)"


def _interrupted_while_initialising(
    argv: list[str], module: str, signum: int, tmp_path: Path
) -> tuple[int, bytes, list[str], list[str]]:
    """(exit status, stdout, stderr lines before the hold, stderr lines after it) of ``racktwin ARGV``
    sent ``signum`` while ``module`` initialises (run in ``tmp_path``)."""
    hold = tmp_path / "hold"
    hold.mkdir()
    # Ctrl-C raises KeyboardInterrupt as in a terminal's foreground process, whatever started the tests: a
    # shell's background job (`pytest ... &`, nohup) has SIGINT ignored, which its children inherit (a
    # clean-clone run started that way saw the Ctrl-C case exit 0; test_cli_audit.py's _WITH_CTRL_C)
    (hold / "sitecustomize.py").write_text(
        "import signal\n\nimport import_hold\n\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import_hold.install()\n"
    )
    read_end, write_end = os.pipe()  # the test keeps its read end too: the byte never meets a closed pipe
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(hold), str(REPO), str(Path(__file__).parent)]),
        IMPORT_HOLD_MODULE=module,
        IMPORT_HOLD_FD=str(read_end),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(read_end,),
    )
    assert proc.stderr is not None
    try:
        before: list[str] = []
        while not (before and before[-1] == f"{HELD} {module}"):
            line = proc.stderr.readline()
            assert line, before  # it ended (or initialised the module) without the hold
            before.append(line.decode().rstrip("\n"))
        proc.send_signal(signum)  # while it is held inside the module's initialisation
        os.write(write_end, b"x")  # the hold goes on (once the signal is handled, in the command)
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(read_end)
        os.close(write_end)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, before[:-1], err.decode().splitlines()


def _old_files(out: Path, names: tuple[str, ...]) -> None:
    out.mkdir()
    for name in names:
        (out / name).write_text("old")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_signal_as_optimize_imports_matplotlib_for_its_report_is_the_130_line(signum: int, tmp_path: Path) -> None:
    """SIGTERM or Ctrl-C as ``racktwin optimize`` imports matplotlib for report.html (plan.json and
    racks.csv written): exit status 130 and the line naming the two files written, report.html the earlier
    run's, whole (it was an ImportError traceback and -6)."""
    out = tmp_path / "out"
    names = ("plan.json", "racks.csv", "report.html")
    _old_files(out, names)
    argv = ["optimize", str(EXAMPLES / "scenario-nominal.toml"), "--out", str(out), "--quiet"]
    rc, stdout, before, after = _interrupted_while_initialising(argv, "matplotlib.ft2font", signum, tmp_path)
    assert (rc, after) == (
        130,
        [
            f"racktwin optimize: interrupted: wrote {out}/plan.json, racks.csv; report.html not written "
            + LEFT_AS_THEY_WERE
        ],
    ), (before, after)
    assert stdout == b""  # no summary line
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary file left
    assert (out / "plan.json").read_text().startswith("{") and (out / "report.html").read_text() == "old"


def test_sigterm_as_optimize_loads_highs_is_the_130_line(tmp_path: Path) -> None:
    """SIGTERM as ``racktwin optimize`` loads HiGHS to plan (no file written yet): exit status 130 and the
    line saying no file was written, the earlier run's files as they were."""
    out = tmp_path / "out"
    names = ("plan.json", "racks.csv", "report.html")
    _old_files(out, names)
    argv = ["optimize", str(EXAMPLES / "scenario-nominal.toml"), "--out", str(out), "--quiet"]
    rc, stdout, before, after = _interrupted_while_initialising(argv, "highspy._core", signal.SIGTERM, tmp_path)
    assert (rc, after) == (
        130,
        [f"racktwin optimize: interrupted: no file written to {out} {LEFT_AS_THEY_WERE}"],
    ), (before, after)
    assert stdout == b""
    assert all((out / name).read_text() == "old" for name in names)


def test_sigterm_as_evaluate_imports_matplotlib_for_its_report_is_the_130_line(tmp_path: Path) -> None:
    """SIGTERM as ``racktwin evaluate`` (30 site seconds of the baseline) imports matplotlib for report.html:
    exit status 130 and the line naming the three files written, report.html the earlier run's."""
    out = tmp_path / "out"
    names = ("metrics.json", "metrics.csv", "series.csv", "report.html")
    _old_files(out, names)
    argv = ["evaluate", "--scenario", str(EXAMPLES / "day-nominal.toml"), "--duration", "30", "--policy", "baseline"]
    argv += ["--jobs", "1", "--quiet", "--out", str(out)]
    rc, _, before, after = _interrupted_while_initialising(argv, "matplotlib.ft2font", signal.SIGTERM, tmp_path)
    assert (rc, after[-1:]) == (
        130,
        [
            f"racktwin evaluate: interrupted: wrote {out}/metrics.json, metrics.csv, series.csv; report.html not "
            f"written {LEFT_AS_THEY_WERE}"
        ],
    ), (before, after)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary file left
    assert (out / "report.html").read_text() == "old"


def test_a_signal_within_signals_deferred_is_handled_once_as_the_block_ends() -> None:
    """The mechanism in process: two SIGTERMs within the block reach its handler once, after the block,
    and the handler is the one before it again."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")
    came: list[int] = []

    def handler(signum: int, frame: object) -> None:
        came.append(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with signals_deferred():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            inside = list(came)
        assert (inside, came, signal.getsignal(signal.SIGTERM)) == ([], [signal.SIGTERM], handler)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_interrupts_leaves_the_import_system_as_it_was() -> None:
    """Its finder (extensions initialised with the signals deferred) is there within the block only."""
    before = list(sys.meta_path)
    with sigterm_interrupts():
        assert len(sys.meta_path) == len(before) + (threading.current_thread() is threading.main_thread())
    assert sys.meta_path == before
