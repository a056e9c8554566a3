"""An operator's walk-through of stopping `racktwin evaluate` with SIGTERM (a `timeout`, a CI job
cancelled, `kill`).

SIGTERM took its default action in the command's process: it died (status -15) and its worker
processes went on computing their policies as orphans, holding the cores (and the pipes of whoever
ran the command) until their runs ended, minutes for a day. Now SIGTERM is a Ctrl-C: the workers are
stopped, exit status 130, and the last line says that no file was written (it said ``interrupted``
alone; one stopped while it writes its files: tests/agent/test_cli_sigterm.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.agent

ROOT = Path(__file__).resolve().parents[2]


def _workers_of(pid: int) -> list[int]:
    """The multiprocessing children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"multiprocessing" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_sigterm_stops_the_worker_processes_and_exits_130(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    scen = ROOT / "examples" / "day-nominal.toml"
    argv = [sys.executable, "-m", "agent.cli", "evaluate", "--scenario", str(scen), "--duration", "7200"]
    argv += ["--policy", "racktwin", "--policy", "greedy", "--jobs", "2", "--out", str(tmp_path / "out")]
    with open(tmp_path / "err.txt", "w") as err_fh:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err_fh, cwd=tmp_path)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = [w for w in _workers_of(proc.pid) if b"spawn_main" in Path(f"/proc/{w}/cmdline").read_bytes()]
        assert len(workers) == 2, (tmp_path / "err.txt").read_text()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [w for w in workers if _alive(w)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert rc == 130, (tmp_path / "err.txt").read_text()
    assert left == [], "worker processes outlived racktwin evaluate"
    assert (tmp_path / "err.txt").read_text().splitlines()[-1] == (
        f"racktwin evaluate: interrupted: no file written to {tmp_path / 'out'} (none half-written; any from an "
        "earlier run are as they were)"
    )
