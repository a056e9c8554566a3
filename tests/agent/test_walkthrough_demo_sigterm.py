"""An operator's walk-through of stopping `racktwin demo` with SIGTERM (docs/evaluation.md: "Ctrl-C (or
SIGTERM) stops the simulator and the agent cleanly and summarizes the time run so far (exit status
130)").

SIGTERM while the demo ran the same scenario without the agent (after the simulator and the agent
had finished) took its default action: the demo died at once (status -15, no summary) and its embedded
mosquitto, started in a session of its own, kept running with its temporary folder, listening on its
port for good. Now SIGTERM there is a Ctrl-C: the broker is stopped, the agent's run is summarized
without the comparison, exit status 130.

That run takes well under a second (60 site minutes in process) after half a minute with the agent:
a SIGTERM sent when its first line is read could come after it has ended, on a busy machine. So the
demo runs under a small driver (:data:`HELD_DEMO`, in the test's own child process; nothing in the
product changes) that holds the real run without the agent after its first 900 site seconds until
the signal comes: the SIGTERM lands in that run, however late the test gets to send it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.agent

ROOT = Path(__file__).resolve().parents[2]
#: wall seconds the driver holds the run without the agent, waiting for the test's SIGTERM
HOLD_S = 60.0
HELD = "test driver: the run without the agent holds"
#: ``racktwin`` (``python -m agent.cli``), its run without the agent (``agent.evaluate.run_policy``,
#: imported by the demo when that run starts) held at its first progress call: after 900 site seconds
#: of the real in-process run, inside the demo's SIGTERM-is-Ctrl-C block
HELD_DEMO = f"""
import sys, time
import agent.evaluate
from agent.cli import main

run_policy = agent.evaluate.run_policy

def held_run_policy(*args, progress=None, **kwargs):
    held = []
    def progress_then_hold(name, t_s, duration_s, wall_s):
        if progress is not None:
            progress(name, t_s, duration_s, wall_s)
        if not held:
            held.append(t_s)
            print("{HELD} at", t_s, "site s", file=sys.stderr, flush=True)
            time.sleep({HOLD_S})
    return run_policy(*args, progress=progress_then_hold, **kwargs)

agent.evaluate.run_policy = held_run_policy
raise SystemExit(main(sys.argv[1:]))
"""


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_during_the_run_without_the_agent_stops_the_broker_and_summarizes(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "out"
    # 60 site minutes at 1000x: the closed loop takes about half a minute, the run without it held (HELD_DEMO)
    argv = [sys.executable, "-c", HELD_DEMO, "demo", "--minutes", "60", "--speed", "1000", "--out", str(out)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stderr is not None and proc.stdout is not None
    port = None
    err_lines = []
    try:
        for line in proc.stderr:
            err_lines.append(line)
            if m := re.search(r"broker at mqtt://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
            if line.startswith(HELD):
                proc.send_signal(signal.SIGTERM)
                break
        stdout, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(err_lines) + rest
    assert port is not None, err
    assert proc.returncode == 130, err
    assert not _accepts(port), "the embedded broker outlived the demo"
    assert "racktwin demo: the same run without the agent" in err, err  # the SIGTERM came during that run
    # the agent's run is summarized; the comparison it did not finish reads '-'
    assert "racktwin demo: interrupted during the run without the agent" in err
    table = {line[:28].strip(): line[28:].split() for line in stdout.splitlines()[2:9]}
    assert table["facility energy (kWh)"][1] == "-" and float(table["facility energy (kWh)"][0]) > 0
    summary = json.loads((out / "demo-summary.json").read_text())
    assert summary["agent"]["facility_energy_kwh"] > 0 and summary["baseline"]["facility_energy_kwh"] is None


#: where the test driver (:data:`SIGNAL_AT_END_DEMO`) sends the demo its own SIGTERM, once the
#: simulator has run its whole time: just before the agent takes in the racks' last acks; when the run
#: with the agent has returned, its event loop still running; when ``asyncio.run`` has returned, before
#: the run without the agent
END_POINTS = ("last acks", "run returned", "loop closed")
SIGNALLED = "test driver: SIGTERM at"
#: ``racktwin`` with the demo's own functions wrapped so that the signal comes at ``END_POINTS[i]``
#: (argv[1]), from the demo's own process: it lands there, whatever the machine's speed
SIGNAL_AT_END_DEMO = f"""
import asyncio, os, signal, sys
import agent.commands.demo as demo
from agent.cli import main

point = sys.argv.pop(1)

def sigterm():
    print("{SIGNALLED}", point, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

take_in_last_acks, run_closed_loop, asyncio_run = demo._take_in_last_acks, demo.run_closed_loop, asyncio.run

async def signal_then_take_in_last_acks(*args, **kwargs):
    sigterm()
    await take_in_last_acks(*args, **kwargs)

async def run_closed_loop_then_signal(*args, **kwargs):
    res = await run_closed_loop(*args, **kwargs)
    sigterm()
    return res

def asyncio_run_then_signal(main, **kwargs):
    demo_run = getattr(main, "__name__", "") == "_demo"
    res = asyncio_run(main, **kwargs)
    if demo_run:
        sigterm()
    return res

if point == "{END_POINTS[0]}":
    demo._take_in_last_acks = signal_then_take_in_last_acks
elif point == "{END_POINTS[1]}":
    demo.run_closed_loop = run_closed_loop_then_signal
else:
    asyncio.run = asyncio_run_then_signal
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("point", END_POINTS)
def test_sigterm_at_the_end_of_the_run_with_the_agent_skips_the_comparison(tmp_path: Path, point: str) -> None:
    # A Ctrl-C once the simulator had run its whole time was lost, or cost the whole run without the agent
    # (minutes for a long demo): in the event loop's own handlers it went unnoticed when the run had looked
    # at its stop event for the last time (exit 0 after the comparison), else it came after that run
    # (exit 130); after the event loop had closed, a SIGTERM killed the demo (-15, no summary, the broker
    # left running). Now each is a Ctrl-C at the end of the agent's run: its whole run summarized, '-' for
    # the comparison, which is not run.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "out"
    argv = [sys.executable, "-c", SIGNAL_AT_END_DEMO, point, "demo", "--minutes", "0.5", "--speed", "30"]
    proc = subprocess.run(
        [*argv, "--out", str(out)], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=180
    )
    err = proc.stderr
    assert f"{SIGNALLED} {point}" in err, err
    assert proc.returncode == 130, err
    port = re.search(r"broker at mqtt://127\.0\.0\.1:(\d+)", err)
    assert port is not None and not _accepts(int(port.group(1))), "the embedded broker outlived the demo"
    assert "racktwin demo: the same run without the agent" not in err, err  # no comparison run after the signal
    assert "racktwin demo: interrupted at the end of the run with the agent" in err, err
    assert "partial run" not in err, err  # the agent's whole run
    table = {line[:28].strip(): line[28:].split() for line in proc.stdout.splitlines()[2:9]}
    assert table["facility energy (kWh)"][1] == "-" and float(table["facility energy (kWh)"][0]) > 0
    summary = json.loads((out / "demo-summary.json").read_text())
    assert summary["agent"]["facility_energy_kwh"] > 0 and summary["baseline"]["facility_energy_kwh"] is None


#: where the test driver (:data:`SIGNAL_AT_START_DEMO`) sends the demo its own SIGTERM: just after the
#: embedded broker has started (before the demo's run with the agent); as the demo starts that run, then a
#: second one from inside ``EmbeddedBroker.stop`` (wrapping the real one, then calling it), as an
#: impatient double Ctrl-C or a wrapper's SIGTERM after the operator's Ctrl-C would
START_POINTS = ("broker started", "run starting, again as the broker stops")
#: the broker's process id and its temporary folder, printed by the driver once it has started
STARTED = "test driver: broker started"
#: ``racktwin`` with the demo's own functions wrapped so that the signals come at ``START_POINTS[i]``
#: (argv[1]). The driver holds the broker and ends with ``os._exit``: only the demo's own stop ends it, not
#: ``EmbeddedBroker.__del__`` when the garbage collector gets to the object (after a KeyboardInterrupt that
#: skipped the stop it did, but the broker's folder stayed, and a process killed meanwhile, by a SIGTERM
#: once the demo's handlers were gone, left mosquitto running)
SIGNAL_AT_START_DEMO = f"""
import os, signal, sys
import agent.commands.demo as demo
from agent.broker import EmbeddedBroker
from agent.cli import main

point = sys.argv.pop(1)

def sigterm(where):
    print("{SIGNALLED}", where, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

start_embedded_broker, run_with_agent, stop = demo._start_embedded_broker, demo._demo, EmbeddedBroker.stop

held = []

def start_embedded_broker_then_signal(*args, **kwargs):
    broker = start_embedded_broker(*args, **kwargs)
    held.append(broker)
    print("{STARTED}", broker.pid, broker.log_path.parent, file=sys.stderr, flush=True)
    if point == "{START_POINTS[0]}":
        sigterm("broker started")
    return broker

def signal_then_run_with_agent(*args, **kwargs):
    sigterm("run starting")
    return run_with_agent(*args, **kwargs)

def signal_then_stop(self, *args, **kwargs):
    sigterm("broker stopping")
    stop(self, *args, **kwargs)

demo._start_embedded_broker = start_embedded_broker_then_signal
if point == "{START_POINTS[1]}":
    demo._demo = signal_then_run_with_agent
    EmbeddedBroker.stop = signal_then_stop
status = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
"""


def _broker_running(pid: int, folder: str) -> bool:
    """Whether the process ``pid`` runs, as the broker whose files are in ``folder`` (not a process that got
    its id since)."""
    try:
        return folder in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@pytest.mark.parametrize("point", START_POINTS)
def test_a_signal_as_the_demo_starts_or_again_as_it_stops_stops_the_broker(tmp_path: Path, point: str) -> None:
    # A SIGTERM that came just after the embedded broker had started, before the block whose `finally`
    # stops it, left mosquitto running; a second one while the broker stopped (a Ctrl-C as the demo
    # started, then another while it cleaned up) cut `EmbeddedBroker.stop` short, the same. Now the broker
    # is stopped, its process gone, its temporary folder removed, and the demo says it was interrupted.
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    argv = [sys.executable, "-c", SIGNAL_AT_START_DEMO, point, "demo", "--minutes", "0.5", "--speed", "30"]
    proc = subprocess.run(
        [*argv, "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    err = proc.stderr
    started = re.search(rf"{STARTED} (\d+) (\S+)", err)
    port = re.search(r"broker at mqtt://127\.0\.0\.1:(\d+)", err)
    assert started is not None and port is not None, err
    pid, folder = int(started.group(1)), started.group(2)
    try:
        assert f"{SIGNALLED} {point.split(',')[0]}" in err, err
        if point == START_POINTS[1]:
            assert f"{SIGNALLED} broker stopping" in err, err
        assert proc.returncode == 130, err
        assert "racktwin demo: interrupted" in err, err
        assert not _accepts(int(port.group(1))), "the embedded broker outlived the demo"
        assert not _broker_running(pid, folder), "the embedded broker's process outlived the demo"
        assert not Path(folder).exists(), "the embedded broker's temporary folder was left behind"
        assert proc.stdout == ""  # nothing ran: no summary
    finally:  # a broker the demo left running does not outlive the test
        if _broker_running(pid, folder):
            os.kill(pid, signal.SIGTERM)
