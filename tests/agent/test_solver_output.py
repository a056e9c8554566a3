"""pyomo's HiGHS interface kept off stdout (``agent.solver_output.isolate_solver_output``).

Each case runs in a fresh interpreter (the isolation patches pyomo for the whole process and the
capture it removes works on file descriptors): real HiGHS solves through ``models.dvfs_solver`` (and
through an evaluation run, ``agent.evaluate.run_policy``), and a line written to file descriptor 1
from inside each solve, as the agent's event loop writes its log while a solve runs in a worker
thread.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import highspy
    import pyomo.environ as pyo
    from pyomo.contrib.solver.solvers.highs import Highs
    from models.dvfs_solver import highs_solve

    if sys.argv[1] == "isolated":
        from agent.solver_output import isolate_solver_output
        isolate_solver_output()
        isolate_solver_output()  # twice: idempotent

    real_run = highspy.Highs.run
    def run_and_log(self):
        os.write(1, f"log line during solve {run_and_log.n}\\n".encode())
        run_and_log.n += 1
        return real_run(self)
    run_and_log.n = 0
    highspy.Highs.run = run_and_log

    objectives = []
    for k in range(3):
        m = pyo.ConcreteModel()
        m.x = pyo.Var(domain=pyo.Binary)
        m.y = pyo.Var(bounds=(0, 4))
        m.c = pyo.Constraint(expr=m.x + m.y <= 2.5 + k)
        m.o = pyo.Objective(expr=3 * m.x + m.y, sense=pyo.maximize)
        info = highs_solve(Highs(), m, 10.0, 1e-6)
        objectives.append(round(info.objective, 6))
    print("objectives", objectives, flush=True)
    """
)


def _python_stdout(script: str, *args: str, timeout_s: float = 120.0) -> str:
    """Run ``script`` in a fresh interpreter from the checkout; its stdout (it must succeed)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _run(mode: str) -> str:
    return _python_stdout(_SCRIPT, mode)


def test_lines_written_during_solves_reach_stdout_and_the_banner_does_not() -> None:
    out = _run("isolated")
    assert [ln for ln in out.splitlines() if ln.startswith("log line")] == [
        f"log line during solve {i}" for i in range(3)
    ]
    assert "objectives [4.5, 5.5, 6.5]" in out  # the solves themselves are unchanged
    assert "HiGHS" not in out  # the banner HiGHS prints on its first instance went to /dev/null


def test_without_isolation_pyomo_swallows_those_lines() -> None:
    """The defect the isolation removes, shown with the same script: pyomo's capture takes fd 1."""
    out = _run("plain")
    assert "objectives [4.5, 5.5, 6.5]" in out
    assert not [ln for ln in out.splitlines() if ln.startswith("log line")]


_EVALUATION_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import highspy
    import agent.evaluate
    from twin.scenario import load_run_scenario

    if sys.argv[1] == "without":  # the call run_policy makes, taken out
        agent.evaluate.isolate_solver_output = lambda: None

    real_run = highspy.Highs.run
    def run_and_log(self):
        os.write(1, b"log line during solve\\n")
        return real_run(self)
    highspy.Highs.run = run_and_log

    scenario = load_run_scenario(Path("examples/day-demo.toml"), duration_s=60.0)
    agent.evaluate.run_policy(scenario, "racktwin")
    print("run done", flush=True)
    """
)


def _run_evaluation(mode: str) -> str:
    return _python_stdout(_EVALUATION_SCRIPT, mode, timeout_s=300.0)


def test_an_evaluation_run_isolates_its_solves() -> None:
    """racktwin's policy solves in a worker thread: with run_policy's isolation every line written
    during a solve reaches stdout, and without it (the same run, the call removed) none does."""
    isolated = _run_evaluation("with").splitlines()
    assert "run done" in isolated
    assert isolated.count("log line during solve") >= 3  # the first minute's solves
    assert "log line during solve" not in _run_evaluation("without").splitlines()


def test_highspy_prints_its_banner_on_the_first_instance() -> None:
    """What the isolation sends to /dev/null exists (else the banner checks above prove nothing)."""
    assert "HiGHS" in _python_stdout("import highspy; highspy.Highs()")
