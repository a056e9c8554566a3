"""The ``racktwin`` front end as its help, its docstrings, docs/agent.md and CONTRIBUTING describe it:
a usage error is the help on stderr with exit status 2; ``--help`` is the help on stdout, exit 0; a
problem the user can fix is one line on stderr, ``racktwin COMMAND: error: ...``, exit 2, never a
traceback; Ctrl-C is exit 130; a reader that went away (``| head``) is exit 141; otherwise the exit
status is the command's. ``racktwin agent --check-config`` vouches for the configuration;
``racktwin journal`` reads the journal named by ``--journal`` or the configuration.

Written for a mutation audit of agent/cli.py, agent/commands/common.py, agent_cmd.py and
journal_cmd.py: each test kills a mutant the other tests let live."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from agent.cli import COMMANDS, main
from agent.commands.common import UserError, check_telemetry_period, print_json
from agent.commands.journal_cmd import parse_since, site_time
from agent.journal import Journal

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE = EXAMPLES / "supernode-512.toml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc: int, out: str, err: str, command: str) -> str:
    assert rc == 2, (rc, err)
    assert out == "" and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"racktwin {command}: error: "), err
    return lines[0]


# ---- the dispatcher -------------------------------------------------------------------------------


def test_no_command_is_a_usage_error_with_the_help_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys)
    assert rc == 2 and out == ""
    assert err.startswith("usage: racktwin") and "journal" in err and "fit-thermal" in err


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_is_on_stdout_with_exit_status_0(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, flag)
    assert rc == 0 and err == ""
    assert out.startswith("usage: racktwin") and all(name in out for name in COMMANDS)


@pytest.mark.parametrize(
    ("command", "statuses"),
    [
        ("agent", ("With --check-config: exit status 0", "status 0", "2:", "75:", "1:")),
        ("demo", ("status 0", "130 ", "1 ", "2 ")),
        ("sim", ("status 0", "status 2", "130:", "141:")),
        ("optimize", ("status 0", "1 when no plan", "2 for a bad scenario", "130 when", "141 when")),
        ("evaluate", ("status 0", "130 ", "2 for a bad option")),
    ],
)
def test_the_help_of_a_long_running_command_says_what_its_exit_statuses_mean(
    command: str, statuses: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """A script or a unit file that runs one of them needs to know what its exit status means (the
    README and docs say it; only ``racktwin agent --help`` did): optimize's 1 for an infeasible plan,
    demo's 1 for a run that failed, 130 for an interrupted demo or evaluation, optimize's 130 and 141
    and sim's 141, which --help did not say, and what --check-config's 0 and 2 mean."""
    rc, out, _ = run(capsys, command, "--help")
    text = " ".join(out.split())  # argparse wraps the epilog
    assert rc == 0 and "Exit status" in text
    for status in statuses:
        assert status in text, (command, status)


def test_an_unknown_command_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "jounral")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "racktwin: error: unknown command 'jounral' (choose from demo, agent, journal," in err


def test_an_option_a_command_does_not_know_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "journal", "--journal", "j.sqlite", "--lsat", "3")
    assert rc == 2
    assert "racktwin journal: error: unrecognized arguments: --lsat 3" in err


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["jounral"], 2),  # an unknown command
        (["journal", "--lsat", "3"], 2),  # an option the command does not know
        (["agent", "--mode", "enforcing"], 2),  # a value argparse refuses
        (["twin", "steady", "--bogus"], 2),  # a subcommand's unknown option
        (["journal", "--help"], 0),
    ],
)
def test_main_returns_the_exit_status_of_a_usage_error_to_an_in_process_caller(
    argv: list[str], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main(argv) -> int``, as with a UserError (2) or a command's own status: argparse's usage errors
    raised ``SystemExit(2)`` (and a command's --help ``SystemExit(0)``) out of it instead."""
    rc, out, err = run(capsys, *argv)
    assert rc == status
    if status == 2:
        assert out == "" and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("racktwin"), err  # argparse's own message, on stderr
        assert ": error: " in err.strip().splitlines()[-1], err
    else:
        assert out.startswith("usage: racktwin journal")


def test_python_m_agent_cli_still_exits_2_after_a_usage_error() -> None:
    """The process (``python -m agent.cli``, as the ``racktwin`` entry point: ``sys.exit(main())``)
    exits with the status ``main`` returns."""

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "jounral"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "racktwin: error: unknown command 'jounral'" in proc.stderr and proc.stdout == ""


def _probe(monkeypatch: pytest.MonkeyPatch, outcome: BaseException | int) -> None:
    """``racktwin probe``: a command module (agent/commands/<module>.py's interface) whose run ends
    with ``outcome``: an exit status, or an exception raised."""
    module = types.ModuleType("agent.commands._audit_probe")

    def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
        parser.add_argument("--x", default=None)

    def run_probe(args: argparse.Namespace, command: str) -> int:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    module.__dict__.update(add_arguments=add_arguments, run=run_probe)  # a module made at run time: no declared names
    monkeypatch.setitem(sys.modules, "agent.commands._audit_probe", module)
    monkeypatch.setitem(COMMANDS, "probe", ("_audit_probe", "a probe"))


@pytest.mark.parametrize("status", [0, 1, 3])
def test_the_exit_status_is_the_commands(
    status: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _probe(monkeypatch, status)
    assert run(capsys, "probe")[0] == status


def test_a_user_error_is_one_line_on_stderr_with_exit_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _probe(monkeypatch, UserError("--x 3: too many"))
    one_error(*run(capsys, "probe", "--x", "3"), "probe")
    assert True


def test_ctrl_c_is_exit_status_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _probe(monkeypatch, KeyboardInterrupt())
    rc, out, err = run(capsys, "probe")
    assert (rc, out, err) == (130, "", "racktwin probe: interrupted\n")


def test_a_reader_that_went_away_is_exit_status_141_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _probe(monkeypatch, BrokenPipeError())
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # main replaces it; monkeypatch puts it back
    rc = main(["probe"])
    assert rc == 141 and capsys.readouterr().err == ""


#: ``racktwin twin sweep-supply`` writing 700 points as one JSON object (about 215 kB, more than a pipe
#: holds): the command is still writing it while its reader waits or goes away
_SWEEP = ["twin", "sweep-supply", "--step-k", "0.05", "--json"]


#: ``racktwin`` (its arguments) with Ctrl-C raising KeyboardInterrupt, as in a foreground process of a
#: terminal, whatever the test's own launcher did: a shell's background job (``pytest ... &``, ``nohup``)
#: starts with SIGINT ignored, its children inherit that, and Python then leaves SIGINT ignored (a
#: clean-clone run started that way saw this test's command finish its output and exit 0)
_WITH_CTRL_C = (
    "import runpy, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "sys.argv = ['racktwin', *sys.argv[1:]]\n"
    "runpy.run_module('agent.cli', run_name='__main__')\n"
)


def _racktwin_process(*argv: str, ctrl_c: bool = False) -> subprocess.Popen[bytes]:
    root = Path(__file__).resolve().parents[2]
    start = ["-c", _WITH_CTRL_C] if ctrl_c else ["-m", "agent.cli"]
    return subprocess.Popen([sys.executable, *start, *argv], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_command_whose_reader_went_away_exits_141_quietly_as_a_process() -> None:
    """``racktwin twin sweep-supply --json | head -c 100`` exits 141 with nothing on stderr, as its
    ``--help`` says: the status of the process running a real command, not only of ``main`` around a
    probe that raises ``BrokenPipeError``."""
    proc = _racktwin_process(*_SWEEP)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.read(100)
    proc.stdout.close()  # the reader goes away with the rest of the object unread
    err = proc.stderr.read()
    assert (proc.wait(timeout=120), err) == (141, b"")
    assert first.startswith(b'{"site":')


def test_a_command_stopped_by_ctrl_c_exits_130_with_one_line_as_a_process() -> None:
    """Ctrl-C while ``racktwin twin sweep-supply`` writes its output (blocked on a reader that has
    not read it yet): exit status 130 and ``racktwin twin sweep-supply: interrupted``, as its
    ``--help`` says, not a traceback."""
    proc = _racktwin_process(*_SWEEP, ctrl_c=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1)  # it has begun its output, which the pipe cannot hold whole: it waits on us
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    err = proc.stderr.read()
    assert (proc.wait(timeout=120), err) == (130, b"racktwin twin sweep-supply: interrupted\n")


def _racktwin_without_reader(*argv: str, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(exit status, stderr) of ``racktwin ARGV`` whose stdout is a pipe with no reader left, before it
    starts: each write to it fails, whenever the command makes it (``racktwin ... | true``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", *argv],
            cwd=Path(__file__).resolve().parents[2],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
        )
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def test_optimize_whose_reader_went_away_exits_141_with_its_files_written(tmp_path: Path) -> None:
    """``racktwin optimize ... --json`` whose reader went away before the summary was printed exits
    141, as its ``--help`` says, after writing its files: the summary is printed after them."""
    out = tmp_path / "out"
    status = _racktwin_without_reader(
        "optimize", str(EXAMPLES / "scenario-nominal.toml"), "--out", str(out), "--json", "--quiet"
    )
    assert status == (141, b"")
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "racks.csv", "report.html"]


def test_sim_whose_reader_went_away_before_the_brokers_url_exits_141_without_running(tmp_path: Path) -> None:
    """``racktwin sim`` with its embedded broker prints the broker's URL on stdout before the run: a
    reader gone by then is exit status 141, as its ``--help`` says, and the run does not start (no
    summary written). The broker is stopped with its temporary folder (it was left behind: the line was
    printed outside the ``finally`` that stops the broker)."""
    summary = tmp_path / "summary.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = ("sim", "--duration", "60", "--speed", "0", "--summary", str(summary))
    status = _racktwin_without_reader(*argv, env=dict(os.environ, TMPDIR=str(tmp)))
    assert status == (141, b"")
    assert not summary.exists()
    assert list(tmp.iterdir()) == []


#: the start of a driver of ``racktwin`` (:func:`_sim_driven`): the embedded broker's process id is written
#: to $BROKER_PID_FILE once the broker is ready
_BROKER_PID_WRITTEN = """
import asyncio, os, selectors, signal, sys
from pathlib import Path
from agent.broker import EmbeddedBroker
from agent.cli import main

wait_ready = EmbeddedBroker._wait_ready

def ready_pid_written(self, marker):
    wait_ready(self, marker)
    Path(os.environ["BROKER_PID_FILE"]).write_text(str(self._proc.pid))

EmbeddedBroker._wait_ready = ready_pid_written
"""

#: ``racktwin`` (its arguments after the first) with the signal named by the first (SIGINT, a Ctrl-C, or
#: SIGTERM) sent to itself as ``asyncio.run`` creates its event loop (from within
#: ``BaseSelectorEventLoop.__init__``, before the loop has its self-pipe): it lands there, whatever the
#: machine's speed
SIGNAL_IN_LOOP_CREATION = (
    _BROKER_PID_WRITTEN
    + """
sig = signal.Signals[sys.argv[1]]
asyncio_run, default_selector = asyncio.run, selectors.DefaultSelector

def signal_then_selector(*args, **kwargs):
    selectors.DefaultSelector = default_selector
    os.kill(os.getpid(), sig)
    return default_selector(*args, **kwargs)

def run_with_signal(main, **kwargs):
    selectors.DefaultSelector = signal_then_selector
    return asyncio_run(main, **kwargs)

asyncio.run = run_with_signal
raise SystemExit(main(sys.argv[2:]))
"""
)

#: ``racktwin`` (its arguments after the first two) sending itself the signal named by the first argument
#: once its embedded broker is ready, within ``EmbeddedBroker.start`` (``-``: none), and the one named by the
#: second as the broker's stop begins (``-``: none)
SIGNALS_AT_THE_BROKERS_START_AND_STOP = (
    _BROKER_PID_WRITTEN
    + """
at_start, at_stop = sys.argv[1:3]
ready, kill = EmbeddedBroker._wait_ready, EmbeddedBroker._kill
stopping = []

def ready_then_signal(self, marker):
    ready(self, marker)
    if at_start != "-":
        os.kill(os.getpid(), signal.Signals[at_start])

def signal_then_kill(self):
    if at_stop != "-" and not stopping:  # once: EmbeddedBroker.__del__ kills too
        stopping.append(True)
        os.kill(os.getpid(), signal.Signals[at_stop])
    kill(self)

EmbeddedBroker._wait_ready, EmbeddedBroker._kill = ready_then_signal, signal_then_kill
raise SystemExit(main(sys.argv[3:]))
"""
)


#: ``racktwin`` (its arguments after the first) sending itself the signal named by the first as soon as
#: ``asyncio.run`` has returned: the run's event loop closed, the embedded broker's stop not yet begun
SIGNAL_AFTER_THE_EVENT_LOOP_CLOSED = (
    _BROKER_PID_WRITTEN
    + """
sig = signal.Signals[sys.argv[1]]
asyncio_run = asyncio.run

def run_then_signal(main, **kwargs):
    result = asyncio_run(main, **kwargs)
    os.kill(os.getpid(), sig)
    return result

asyncio.run = run_then_signal
raise SystemExit(main(sys.argv[2:]))
"""
)


def _sim_driven(tmp_path: Path, driver: str, *argv: str) -> tuple[subprocess.CompletedProcess[bytes], bool, list[str]]:
    """``python -c DRIVER ARGV`` (a driver of ``racktwin``, beginning with :data:`_BROKER_PID_WRITTEN`) with
    $TMPDIR an empty folder: the finished process, whether the embedded broker's process was still running
    after it (then killed here) and what was left in $TMPDIR (the broker's temporary folder)."""
    root = Path(__file__).resolve().parents[2]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_file = tmp_path / "broker.pid"
    proc = subprocess.run(
        [sys.executable, "-c", driver, *argv],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root), TMPDIR=str(tmp), BROKER_PID_FILE=str(pid_file)),
        capture_output=True,
        timeout=300,
    )
    pid = int(pid_file.read_text())
    try:  # still our broker (not a zombie, not another process): its command line names its folder in $TMPDIR
        running = str(tmp) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        running = False
    if running:
        os.kill(pid, signal.SIGKILL)
    return proc, running, sorted(p.name for p in tmp.iterdir())


#: ``racktwin sim`` of 60 site seconds, as fast as it can, with its embedded broker
_SIM = ("sim", "--duration", "60", "--speed", "0", "--progress-interval-s", "0")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_sim_stopped_by_a_signal_as_its_event_loop_is_created_exits_130_with_one_line(tmp_path: Path, sig: str) -> None:
    """Ctrl-C or SIGTERM while ``racktwin sim`` creates its event loop, its embedded broker running: exit
    status 130 with ``racktwin sim: interrupted`` alone on stderr (a Ctrl-C also put an AttributeError of the
    half-made loop and "coroutine '_run' was never awaited" there; a SIGTERM killed the process, exit 143,
    the broker left running), the broker stopped with its temporary folder, the run not started."""
    summary = tmp_path / "summary.json"
    proc, running, left = _sim_driven(tmp_path, SIGNAL_IN_LOOP_CREATION, sig, *_SIM, "--summary", str(summary))
    assert (proc.returncode, proc.stderr, running, left) == (130, b"racktwin sim: interrupted\n", False, [])
    assert proc.stdout.startswith(b"racktwin sim: embedded ")  # the broker had started
    assert not summary.exists()


def test_sim_stopped_by_sigterm_as_its_broker_starts_exits_130_with_the_broker_stopped(tmp_path: Path) -> None:
    """SIGTERM as ``racktwin sim``'s embedded broker has started is a Ctrl-C, as its ``--help`` says: exit
    status 130 with ``racktwin sim: interrupted``, the broker's process stopped and its temporary folder
    removed (its default action ended the process at once, exit 143, and left the broker running in its
    own session with its folder)."""
    proc, running, left = _sim_driven(tmp_path, SIGNALS_AT_THE_BROKERS_START_AND_STOP, "SIGTERM", "-", *_SIM)
    assert (proc.returncode, proc.stderr, running, left) == (130, b"racktwin sim: interrupted\n", False, [])


@pytest.mark.parametrize(
    ("at_start", "at_stop", "status"),
    [
        ("SIGINT", "SIGINT", 130),  # a second Ctrl-C raised KeyboardInterrupt in the stop
        ("SIGTERM", "SIGTERM", 130),
        ("-", "SIGTERM", 0),  # after the run, the event loop had put SIGTERM's default action back
        ("-", "SIGINT", 0),
    ],
)
def test_a_signal_during_sims_broker_stop_does_not_cut_it_short(
    tmp_path: Path, at_start: str, at_stop: str, status: int
) -> None:
    """A signal as ``racktwin sim`` stops its embedded broker (a second one after a Ctrl-C or SIGTERM as it
    started, or one as the run has ended) is kept until the stop is done: the broker's process stopped,
    its temporary folder removed, the exit status what it would have been without it (the run complete:
    0 with its report)."""
    proc, running, left = _sim_driven(tmp_path, SIGNALS_AT_THE_BROKERS_START_AND_STOP, at_start, at_stop, *_SIM)
    assert (proc.returncode, running, left) == (status, False, [])
    if status == 130:
        assert proc.stderr == b"racktwin sim: interrupted\n"
    else:
        assert b"racktwin sim: stopped by duration after 60 s of site time" in proc.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_as_sims_event_loop_has_closed_does_not_cut_its_end_short(tmp_path: Path, sig: str) -> None:
    """A signal just after ``racktwin sim``'s run, its event loop closed and its embedded broker's stop not
    yet begun, is kept as one during the broker's stop is: the run's report, exit status 0, the broker's
    process stopped and its temporary folder removed (the closing loop had put SIGTERM's default action
    back: exit 143, the broker left running in its own session with its folder; a Ctrl-C there was exit
    130 without the report of the complete run)."""
    summary = tmp_path / "summary.json"
    proc, running, left = _sim_driven(
        tmp_path, SIGNAL_AFTER_THE_EVENT_LOOP_CLOSED, sig, *_SIM, "--summary", str(summary)
    )
    assert (proc.returncode, running, left) == (0, False, [])
    assert b"racktwin sim: stopped by duration after 60 s of site time" in proc.stderr
    assert json.loads(summary.read_text())["stopped_by"] == "duration"


def test_another_error_is_not_taken_for_an_interruption(monkeypatch: pytest.MonkeyPatch) -> None:
    _probe(monkeypatch, RuntimeError("a bug"))
    with pytest.raises(RuntimeError):
        main(["probe"])


def test_a_command_missing_from_the_build_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(COMMANDS, "gone", ("_audit_no_such_module", "not built"))
    rc, out, err = run(capsys, "gone")
    assert (rc, out) == (2, "")
    assert err == "racktwin gone: not available in this build (agent.commands._audit_no_such_module missing)\n"


# ---- common ---------------------------------------------------------------------------------------


def test_telemetry_as_far_apart_as_the_deadline_is_taken() -> None:
    """ "give at most {deadline} s": the deadline itself is allowed, a little more is not."""
    check_telemetry_period("s.toml", 30.0, 30.0, "agent.toml")
    with pytest.raises(UserError, match="give at most 30 s"):
        check_telemetry_period("s.toml", 30.5, 30.0, "agent.toml")


def test_json_output_is_strict_json_also_inside_tuples(capsys: pytest.CaptureFixture[str]) -> None:
    print_json({"pair": (1.0, math.nan), "inf": [math.inf]})
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}")) == {
        "pair": [1.0, None],
        "inf": [None],
    }


# ---- racktwin agent -------------------------------------------------------------------------------


def agent_config(folder: Path, *lines: str) -> Path:
    path = folder / "agent.toml"
    body = [f'site = "{SITE}"', f'journal.path = "{folder / "journal.sqlite"}"', *lines]
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    return path


def test_config_and_check_config_naming_one_file_two_ways_is_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = agent_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "agent", "--config", "agent.toml", "--check-config", str(cfg))
    assert rc == 0 and ": OK" in out, err


def test_config_and_check_config_naming_two_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "b").mkdir()
    a, b = agent_config(tmp_path), agent_config(tmp_path / "b")
    line = one_error(*run(capsys, "agent", "--config", str(a), "--check-config", str(b)), "agent")
    assert "name two files" in line


def test_check_config_alone_needs_the_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(*run(capsys, "agent", "--check-config"), "agent")
    assert "give the configuration: --config FILE" in line


def test_mode_overrides_the_files_mode_in_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = agent_config(tmp_path, 'mode = "advisory"')
    rc, out, _ = run(capsys, "agent", "--check-config", str(cfg), "--mode", "enforce")
    assert rc == 0
    assert [line.split()[:2] for line in out.splitlines() if line.strip().startswith("mode ")] == [["mode", "enforce"]]


def test_an_unknown_mode_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "agent", "--check-config", str(agent_config(tmp_path)), "--mode", "enforcing")
    assert rc == 2 and "invalid choice: 'enforcing'" in err


def test_check_config_vouches_for_the_brokers_certificate_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/agent.md: problems at the start are one line naming the field; the check reads the
    certificate files, so that a file TLS cannot use fails the check, not the service later."""
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    cfg = agent_config(tmp_path, "[broker]", 'url = "mqtts://127.0.0.1"', f'tls_ca_file = "{junk}"')
    line = one_error(*run(capsys, "agent", "--check-config", str(cfg)), "agent")
    assert f"{cfg}: broker.tls_ca_file: {junk}: " in line, line


# ---- racktwin journal -----------------------------------------------------------------------------


def make_journal(path: Path, wall_times_s: list[float], summaries: list[dict[str, Any]] | None = None) -> Path:
    """Decisions 1..n at site times 100, 200, ... s and the given wall times."""
    j = Journal(path)
    for i, _ in enumerate(wall_times_s):
        summary = {"status": "optimal", "source": "milp"} if summaries is None else summaries[i]
        j.record_decision(i, 100.0 * (i + 1), "enforce", str(summary.get("status", "optimal")), 0.01, summary, [])
    j.close()
    db = sqlite3.connect(path)
    with db:
        for i, wall_s in enumerate(wall_times_s):
            db.execute("UPDATE decisions SET wall_time_s = ? WHERE id = ?", (wall_s, i + 1))
    db.close()
    return path


def journal_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc, out, err = run(capsys, "journal", *argv, "--json")
    assert rc == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.mark.parametrize(
    ("text", "back_s"), [("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1.5h", 5400.0), ("7d", 604800.0)]
)
def test_since_takes_a_duration_back_from_now(text: str, back_s: float) -> None:
    assert parse_since(text, 1.0e9) == pytest.approx(1.0e9 - back_s)


def test_since_reads_a_time_without_an_offset_as_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    utc = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC).timestamp()
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_since("2026-12-01T10:00", 0.0) == utc
        assert parse_since("2026-12-01T10:00+01:00", 0.0) == utc - 3600.0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_since_7d_keeps_the_last_week(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    path = make_journal(tmp_path / "j.sqlite", [now - 8 * 86400.0, now - 6 * 86400.0, now - 60.0])
    s = journal_json(capsys, "--journal", str(path), "--since", "7d")
    assert s["decisions"] == 2 and s["since_wall_s"] == pytest.approx(now - 7 * 86400.0, abs=60.0)
    rc, out, _ = run(capsys, "journal", "--journal", str(path), "--since", "7d")
    assert rc == 0 and out.splitlines()[0].startswith(f"journal {path} (since ")


def test_a_since_out_of_the_range_of_dates_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_journal(tmp_path / "j.sqlite", [time.time()])
    line = one_error(*run(capsys, "journal", "--journal", str(path), "--since", "99999999d"), "journal")
    assert "out of the range of dates" in line


def test_the_newest_five_decisions_by_default_and_last_n_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    path = make_journal(tmp_path / "j.sqlite", [now - 600.0 + 60.0 * i for i in range(7)])
    assert [d["id"] for d in journal_json(capsys, "--journal", str(path))["recent"]] == [3, 4, 5, 6, 7]
    assert journal_json(capsys, "--journal", str(path), "--last", "0")["recent"] == []  # "0 or more"
    assert len(journal_json(capsys, "--journal", str(path), "--last", str(2**70))["recent"]) == 7  # all of it
    line = one_error(*run(capsys, "journal", "--journal", str(path), "--last", "-1"), "journal")
    assert "--last -1: must be 0 or more" in line


def test_a_decision_id_beyond_what_sqlite_holds_is_no_such_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_journal(tmp_path / "j.sqlite", [time.time()])
    line = one_error(*run(capsys, "journal", "--journal", str(path), "--decision", str(2**63)), "journal")
    assert f"no decision {2**63}" in line


def test_no_journal_given_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(*run(capsys, "journal"), "journal")
    assert "give the journal: --config FILE" in line


@pytest.mark.parametrize("extra", [[], ["--decision", "1"]])
def test_a_file_that_is_no_journal_is_one_line(
    extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "journal.sqlite"
    junk.write_bytes(b"SQLite format 3\x00" + b"\xff" * 2000)  # a corrupt database
    line = one_error(*run(capsys, "journal", "--journal", str(junk), *extra), "journal")
    assert str(junk) in line


def test_the_text_gives_the_span_and_the_site_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Decisions 90 s apart: the span in seconds (under 2 min), site times of a clock started at 0 (a
    simulator's ``--start-epoch-s 0``) as its seconds, ``t=100 s``, not ``0:01:40``, which reads as a time
    of day; a decision whose source is not its status shows both."""
    now = time.time()
    summaries = [{"status": "optimal", "source": "milp"}, {"status": "fallback", "source": "previous plan"}]
    path = make_journal(tmp_path / "j.sqlite", [now - 90.0, now], summaries)
    rc, out, _ = run(capsys, "journal", "--journal", str(path))
    assert rc == 0
    assert "(90 s; site time t=100 s to t=200 s)" in out, out
    assert "  (site t=200 s)  fallback  previous plan" in out, out
    assert site_time(3725.0) == "t=3,725 s"


def test_a_site_time_that_is_a_date_says_utc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A site clock in epoch seconds (a rack's, the simulator's default) reads as a UTC date, as the wall
    times beside it do, not as a date of no zone; --json keeps the seconds."""
    path = make_journal(tmp_path / "j.sqlite", [time.time()])
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE decisions SET site_time_s = ?", (1_796_471_771.0,))
    db.close()
    rc, out, _ = run(capsys, "journal", "--journal", str(path))
    assert rc == 0
    assert "site time 2026-12-05 11:56:11 UTC to 2026-12-05 11:56:11 UTC)" in out, out
    assert "  (site 2026-12-05 11:56:11 UTC)  optimal" in out, out
    assert journal_json(capsys, "--journal", str(path))["last_site_s"] == 1_796_471_771.0


def test_a_boolean_in_a_summary_is_no_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_journal(tmp_path / "j.sqlite", [time.time()], [{"status": "optimal", "busy_cards": True}])
    rc, out, _ = run(capsys, "journal", "--journal", str(path))
    assert rc == 0 and "busy" not in out


@pytest.mark.parametrize("extra", [[], ["--decision", "250"]])
def test_a_journal_whose_data_pages_are_damaged_is_one_line(
    extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The schema reads, the decisions do not ("database disk image is malformed"): one line, exit 2."""
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    for i in range(300):
        j.record_decision(i, 10.0 * (i + 1), "enforce", "optimal", 0.01, {"explanation": ["x" * 200]}, [])
    j.close()
    pages = path.stat().st_size // 4096
    with path.open("r+b") as f:  # the second half of the pages overwritten
        f.seek(pages // 2 * 4096)
        f.write(b"\xa5" * 4096 * (pages - pages // 2))
    line = one_error(*run(capsys, "journal", "--journal", str(path), *extra), "journal")
    assert f"journal {path}: " in line
