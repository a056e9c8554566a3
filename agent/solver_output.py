"""Keep the solver off the process's stdout: pyomo's HiGHS interface (:func:`isolate_solver_output`)
and native libraries' stray output while a command's stdout must carry only its result
(:func:`stdout_to_stderr`).

``pyomo.contrib.solver.solvers.highs`` wraps every solve, and every new model it loads, in
``capture_output(capture_fd=True)``: it points file descriptors 1 and 2 at a pipe for the length of
the call and starts a thread that polls the pipe (every 0.1 ms at first) into the solver log. The
models run HiGHS with ``output_flag=False``, so that log is empty, and the redirection does harm:

* it is process-wide: with the solve in a worker thread, every line the event loop of
  ``racktwin agent`` writes meanwhile goes into pyomo's capture and is lost, and a process stopping
  mid-solve crashes pyomo's reader thread;
* where the solve runs in a worker thread while its caller waits (the agent, the evaluation
  runs), the reader thread is a third one competing for the interpreter lock: over the nominal
  day's first site hour the racktwin policy's solves took 2.95 and 3.07 s of wall time with the
  capture off against 3.69 and 3.78 s with it on, its whole run 11.26 / 11.58 s against 11.92 /
  12.31 s (two pairs side by side on the same code, every result the same;
  ``benchmarks/bench_policy_cpu.py --split``, benchmarks/results-evaluation.md). A solve on the
  calling thread shows no difference beyond noise (``benchmarks/bench_models.py --pyomo-capture``).

The service (``agent.service``) and every in-process evaluation run (``agent.evaluate.run_policy``)
call it once per process before their first solve. It patches pyomo for the whole process, for
good: a caller that wants HiGHS's log through pyomo (``tee``) gets nothing once it ran (the models
run HiGHS with ``output_flag=False`` and read no solver log).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["isolate_solver_output", "stdout_to_stderr"]

_isolated = False
_isolating = threading.Lock()  # two threads' first calls must not both swap fd 1


@contextlib.contextmanager
def _no_capture(*_args: Any, **_kwargs: Any) -> Iterator[None]:
    yield None


def isolate_solver_output() -> None:
    """Stop pyomo's HiGHS interface from redirecting stdout/stderr around its calls (see the module
    docstring). HiGHS prints a banner on stdout the first time a process makes a solver instance:
    that first instance is made here with stdout on /dev/null (``racktwin demo`` showed the banner
    among its progress lines; ``--json`` outputs must carry nothing else). Idempotent."""
    global _isolated
    with _isolating:
        if _isolated:
            return
        import highspy
        import pyomo.contrib.solver.solvers.highs as pyomo_highs

        pyomo_highs.capture_output = _no_capture
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            with _stdout_fd_to(devnull):
                highspy.Highs()  # type: ignore[no-untyped-call]  # the banner, once per process, into /dev/null
        finally:
            os.close(devnull)
        _isolated = True


def stdout_to_stderr() -> contextlib.AbstractContextManager[None]:
    """Send file descriptor 1 to stderr for a while: C libraries (the HiGHS banner) write there
    directly, and stdout must carry only a command's table or its one JSON object
    (``racktwin evaluate``, ``racktwin demo``)."""
    return _stdout_fd_to(2)


@contextlib.contextmanager
def _stdout_fd_to(fd: int) -> Iterator[None]:
    """File descriptor 1 pointed at ``fd`` for a while (Python's buffered stdout flushed around it)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(fd, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
