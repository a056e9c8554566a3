"""``racktwin demo`` with a real broker (mutation audit of agent/commands/demo.py): ``--broker URL`` is
used and no embedded broker started; the embedded broker is gone, its port free, when the demo ends
(at the end of the run and on Ctrl-C); a simulator that dies is a failed demo, not exit status 0.
Short runs: 30 site seconds (two control periods) at 30x."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from demo_testing import wait_for_truth_log

from agent.broker import EmbeddedBroker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHORT = ("--minutes", "0.5", "--speed", "30")


def demo(*args: str, stderr: IO[str] | None = None) -> subprocess.Popen[str]:
    """``racktwin demo`` with ``args``; its stderr piped, or written to ``stderr`` (a file the test can
    read while the demo runs)."""
    return subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "demo", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr,
        text=True,
    )


def embedded_port(err: str) -> int:
    found = re.search(r"racktwin demo: embedded \w+ broker at mqtt://127\.0\.0\.1:(\d+)", err)
    assert found, err[-2000:]
    return int(found.group(1))


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2.0)
        return s.connect_ex(("127.0.0.1", port)) != 0


def sim_child_pid(out_dir: Path) -> int | None:
    """The demo's simulator child (``python -m sim`` writing into ``out_dir``)."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    for line in ps.splitlines():
        pid, _, cmd = line.strip().partition(" ")
        if "-m sim" in cmd and str(out_dir) in cmd:
            return int(pid)
    return None


def test_broker_option_is_used_and_no_embedded_broker_is_started(mosquitto: EmbeddedBroker, tmp_path: Path) -> None:
    (tmp_path / "journal.sqlite").write_text("an earlier run's journal, not a database")  # replaced, not reused
    proc = demo(*SHORT, "--broker", mosquitto.url, "--json", "--out", str(tmp_path))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "embedded" not in err  # nothing started: the given broker carried the run
    log = mosquitto.log_text()
    assert f"racktwin-demo-agent-{proc.pid}" in log  # the agent connected to the given broker
    obj = json.loads(out)
    assert set(obj) == {"agent", "baseline"}
    sim = json.loads((tmp_path / "summary.json").read_text())
    assert sim["commands_applied"] > 0  # the agent's commands reached the racks through it
    # the agent's rack-seconds over the limit, as docs/evaluation.md defines them, from the truth log
    # (docs/sim.md): true rack power over 50 kW, each row's step counted when it starts after the first
    # control period (15 s)
    with open(tmp_path / "truth.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    over_s, prev = 0.0, 0.0
    for row in rows:
        t = float(row["time_s"])
        if prev >= 15.0 - 1e-9:
            over_s += (t - prev) * sum(1 for i in range(8) if float(row[f"r{i}_power_w"]) > 50_000.0)
        prev = t
    assert obj["agent"]["limit_violation_s"] == pytest.approx(over_s)
    assert float(rows[-1]["time_s"]) == pytest.approx(30.0)


def test_the_embedded_broker_is_stopped_and_its_port_freed_at_the_end(tmp_path: Path) -> None:
    proc = demo(*SHORT, "--out", str(tmp_path))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    port = embedded_port(err)
    assert port_is_free(port)
    assert out.startswith("racktwin demo: day-demo, 0.5 site minutes in ")  # 30 site s, not "0 site minutes"
    saved = json.loads((tmp_path / "demo-summary.json").read_text())  # the summary printed, kept in --out
    facility = next(line for line in out.splitlines() if line.startswith("facility energy (kWh)")).split()
    assert facility[3:5] == [
        f"{saved['agent']['facility_energy_kwh']:,.1f}",
        f"{saved['baseline']['facility_energy_kwh']:,.1f}",
    ]


def test_sigterm_stops_everything_cleanly_and_summarizes_the_same_window(tmp_path: Path) -> None:
    # docs/evaluation.md: "Ctrl-C (or SIGTERM) stops the simulator and the agent cleanly and summarizes
    # the time run so far (exit status 130)"; the simulator stopped cleanly writes its summary (docs/sim.md)
    # progress: the racks' true power against the limit, from the truth log
    progress = re.compile(r"racktwin demo: 0:\d\d:\d\d  racks kW \[[ 0-9.]+\] \(limit 50\)  PUE ")
    err_path = tmp_path / "demo-stderr.txt"
    with open(err_path, "w", encoding="utf-8") as err_file:
        proc = demo(
            "--minutes", "60", "--speed", "30", "--json", "--out", str(tmp_path), "--progress-interval-s", "0.5",
            stderr=err_file,
        )  # fmt: skip
    truth = tmp_path / "truth.csv"
    try:
        # some site time run, and a progress line out (a slow machine takes longer: a bound on a hang only)
        deadline = time.monotonic() + 120
        while not (truth.exists() and truth.stat().st_size >= 5_000 and progress.search(err_path.read_text())):
            assert proc.poll() is None, err_path.read_text()[-2000:]
            assert time.monotonic() < deadline, f"no progress line in 120 s: {err_path.read_text()[-2000:]}"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = err_path.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert port_is_free(embedded_port(err))
    obj = json.loads(out)  # the partial summary still comes, alone on stdout
    assert set(obj) == {"agent", "baseline"}
    assert (tmp_path / "summary.json").exists()  # the simulator was stopped, not killed
    # the run without the agent covers the same site time: energies of one order, not 60 minutes against a few
    ratio = obj["agent"]["facility_energy_kwh"] / obj["baseline"]["facility_energy_kwh"]
    assert 0.5 < ratio < 1.2


def test_a_simulator_that_dies_fails_the_demo(tmp_path: Path) -> None:
    proc = demo("--minutes", "60", "--speed", "30", "--json", "--out", str(tmp_path))
    wait_for_truth_log(proc, tmp_path / "truth.csv", 5_000)
    pid = sim_child_pid(tmp_path)
    assert pid is not None, "no simulator child running, its truth log written"
    os.kill(pid, signal.SIGKILL)  # e.g. the kernel's out-of-memory killer
    out, err = proc.communicate(timeout=60)
    assert "the simulator exited with status -9" in err
    assert proc.returncode == 1, err[-2000:]  # a script running the demo must see that it failed
    assert port_is_free(embedded_port(err))
    assert set(json.loads(out)) == {"agent", "baseline"}  # what ran is still summarized
