"""``racktwin evaluate`` and ``racktwin optimize`` when writing their files fails after the work is done
(a disk that filled during a day-long run, a quota, a file replaced by a folder meanwhile): the results
still reach stdout as they would have, then one line on stderr names the file, the OS error and which
files were written and which not, exit status 2 (their ``--help``).

An OSError there was a traceback: evaluate's table or ``--json`` object, and optimize's summary, were
never printed, the numbers of a run that may have taken hours lost. The write fails for real here, not
through a mock: the temporary file the command writes first (``NAME.tmp``, then renamed over ``NAME``)
is a link to ``/dev/full`` (every write: "No space left on device") or into a folder that is gone ("No
such file or directory"), neither of which the checks before the run judge (where a link leads a write
is left to the write; a folder there is refused before the run: tests/agent/test_cli_outputs.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WHOLE = "(none half-written; any from an earlier run are as they were)"


def _in_the_way(tmp: Path, kind: str) -> None:
    """Make the write to ``tmp`` fail: a link to /dev/full (a full disk) or into a folder that is gone."""
    if kind == "full":
        tmp.symlink_to("/dev/full")
    else:
        tmp.symlink_to(tmp.parent / "gone" / tmp.name)


def _files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


@needs_dev_full
@pytest.mark.parametrize(
    ("kind", "failing", "why", "left"),
    [
        ("full", "metrics.json", "No space left on device", "no file written to {out} " + WHOLE),
        (
            "gone",
            "series.csv",
            "No such file or directory: '{out}/series.csv.tmp'",
            "wrote {out}/metrics.json, metrics.csv; series.csv, report.html not written " + WHOLE,
        ),
    ],
    ids=["full-disk-first-file", "folder-gone-third-file"],
)
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_evaluate_prints_its_results_then_says_which_files_it_could_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, failing: str, why: str, left: str, as_json: bool
) -> None:
    """30 site seconds of the baseline with ``metrics.json`` (a full disk) or ``series.csv`` (a link into a
    folder that is gone) unwritable: the table or the ``--json`` object on stdout as after a good run, then
    ``racktwin evaluate: error: cannot write OUT/FILE: WHY; wrote ...`` as the last line on stderr, exit
    status 2; the files before it are written, the later ones are not tried, no temporary file of the
    command's is left."""
    out = tmp_path / "out"
    out.mkdir()
    _in_the_way(out / f"{failing}.tmp", kind)
    argv = ["evaluate", "--scenario", str(EXAMPLES / "day-full-load.toml"), "--duration", "30", "--policy", "baseline"]
    rc = main([*argv, "--jobs", "1", "--out", str(out), *(["--json"] if as_json else [])])
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    last = captured.err.splitlines()[-1]
    why, left = why.format(out=out), left.format(out=out)
    assert last == f"racktwin evaluate: error: cannot write {out}/{failing}: {why}; {left}"
    assert "wrote" not in "".join(captured.err.splitlines()[:-1])  # no progress line says the files went out
    if as_json:
        policies = json.loads(captured.out)["policies"]
        assert list(policies) == ["baseline"] and policies["baseline"]["limit_violation_s"] == 120
    else:
        assert captured.out.splitlines()[0].split()[:3] == ["policy", "facility", "kWh"]
        assert captured.out.splitlines()[1].split()[0] == "baseline"
    names = ["metrics.json", "metrics.csv", "series.csv", "report.html"]
    done = names[: names.index(failing)]
    assert _files(out) == sorted(done)  # the link in the way is removed as a temporary file of the command's
    assert all((out / name).stat().st_size > 0 for name in done)


@needs_dev_full
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "line"])
def test_optimize_prints_its_summary_then_says_which_files_it_could_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """``racktwin optimize`` with a full disk under ``racks.csv``: its summary (the line, or the
    ``--json`` object) on stdout all the same, then one line saying plan.json was written and the others
    were not, exit status 2 (it printed ``cannot write to OUT: No space left on device`` alone, the plan's
    numbers and which files were written left unsaid)."""
    out = tmp_path / "out"
    out.mkdir()
    _in_the_way(out / "racks.csv.tmp", "full")
    extra = ["--json"] if as_json else []
    rc = main(["optimize", str(EXAMPLES / "scenario-nominal.toml"), "--out", str(out), "--quiet", *extra])
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert captured.err.splitlines()[-1] == (
        f"racktwin optimize: error: cannot write {out}/racks.csv: No space left on device; wrote {out}/plan.json; "
        f"racks.csv, report.html not written {WHOLE}"
    )
    if as_json:
        assert json.loads(captured.out)["status"] == "optimal"
    else:
        assert captured.out.startswith("nominal: optimal, supply ")
    assert _files(out) == ["plan.json"]
