"""What holding Ctrl-C and SIGTERM back during C extensions' initialisation costs (agent/commands/deferred_signals.py).

    python benchmarks/bench_cli_signals.py                      # held windows and import overhead, 9 runs each
    python benchmarks/bench_cli_signals.py --against 38f800c    # also `racktwin --help` here vs a commit

Three figures, each the median of ``--runs`` fresh processes (the 2-core machine is shared: medians, and
``--against`` alternates which tree goes first):

- held: how long a signal may wait, the longest single extension module's initialisation under
  ``extension_inits_uninterrupted`` while ``matplotlib.pyplot`` (Agg) and ``highspy`` are imported as
  optimize's and evaluate's runs import them (numpy already imported), and how many windows were held;
- import: the wall time of those imports with the deferral and without (its overhead);
- ``--help``: ``python -m agent.cli --help`` in this checkout and at COMMIT (``git archive`` into a
  temporary folder), as a user's start-up (the deferral's module is imported with agent.commands.common).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: One process's measurement (``python -c``, this checkout first on the path): JSON on stdout.
_IMPORTS = """
import json, sys, time, contextlib
import numpy
import agent.commands.deferred_signals as d
held = []
inner = d.signals_deferred
@contextlib.contextmanager
def timed(*args):
    t = time.perf_counter()
    with inner(*args):
        yield
    held.append(time.perf_counter() - t)
d.signals_deferred = timed
t0 = time.perf_counter()
with (d.extension_inits_uninterrupted() if sys.argv[1] == "deferred" else contextlib.nullcontext()):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    import highspy
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "held_max_s": max(held, default=0.0), "held_n": len(held)}))
"""


def _imports(mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTS, mode],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def _help_s(root: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "agent.cli", "--help"],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="fresh processes per figure (default 9)")
    ap.add_argument("--against", metavar="COMMIT", help="also time `racktwin --help` at COMMIT")
    args = ap.parse_args()
    with_d: list[dict[str, float]] = []
    without: list[dict[str, float]] = []
    for i in range(args.runs):
        pair = [("deferred", with_d), ("plain", without)]
        for mode, results in pair if i % 2 else pair[::-1]:
            results.append(_imports(mode))
    med = statistics.median
    held = [r["held_max_s"] for r in with_d]
    print(f"{args.runs} runs each, medians: matplotlib.pyplot + highspy imported")
    print(f"- held: the longest initialisation {1e3 * med(held):.1f} ms (max {1e3 * max(held):.1f} ms), ", end="")
    print(f"{int(med(r['held_n'] for r in with_d))} windows held (an extension module's create and exec each)")
    w, p = med(r["wall_s"] for r in with_d), med(r["wall_s"] for r in without)
    print(f"- import: {1e3 * w:.0f} ms with the deferral, {1e3 * p:.0f} ms without ({1e3 * (w - p):+.0f} ms)")
    if args.against:
        with tempfile.TemporaryDirectory(prefix="racktwin-help-") as tmp:
            archive = subprocess.run(["git", "archive", args.against], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            here: list[float] = []
            there: list[float] = []
            for i in range(args.runs):
                trees = [(REPO, here), (Path(tmp), there)]
                for root, times in trees if i % 2 else trees[::-1]:
                    times.append(_help_s(root))
        print(f"- racktwin --help: {1e3 * med(here):.0f} ms here, {1e3 * med(there):.0f} ms at {args.against}")


if __name__ == "__main__":
    main()
