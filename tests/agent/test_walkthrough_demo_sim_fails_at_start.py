"""An operator's walk-through of `racktwin demo` whose simulator stops before its first second.

The demo then has nothing to summarize ("the simulator stopped before its first second of site time",
exit status 2), yet it first ran the same scenario without the agent for one site second, the
comparison it threw away. Now that run is skipped.

The simulator is made to fail at its start by a small driver (:data:`FAILING_SIM_DEMO`, in the test's
own child process): the real ``python -m sim``, given an option it does not know, exits with status 2
before it has run a second; the broker and the agent are the demo's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.agent

ROOT = Path(__file__).resolve().parents[2]
#: ``racktwin`` with the demo's simulator command given an option the simulator refuses
FAILING_SIM_DEMO = """
import sys
import agent.commands.demo as demo
from agent.cli import main

simulator_command = demo._simulator_command
demo._simulator_command = lambda *args, **kwargs: [*simulator_command(*args, **kwargs), "--no-such-option"]
raise SystemExit(main(sys.argv[1:]))
"""


def test_a_simulator_that_stops_at_once_is_not_compared_with_a_run_without_the_agent(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-c", FAILING_SIM_DEMO, "demo", "--minutes", "0.5", "--speed", "30"]
    proc = subprocess.run(
        [*argv, "--out", str(tmp_path)], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    err = proc.stderr
    assert "racktwin sim: error: unrecognized arguments: --no-such-option" in err, err  # it failed at its start
    assert "racktwin demo: the simulator exited with status 2" in err, err
    assert "the same run without the agent" not in err, err  # no comparison run for nothing to compare
    assert err.rstrip().endswith(
        "racktwin demo: error: the simulator stopped before its first second of site time (see the messages above)"
    ), err
    assert proc.returncode == 2, err
    assert proc.stdout == ""
