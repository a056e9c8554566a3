"""Helpers for the tests that run ``racktwin demo`` as a child process."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest


def wait_for_truth_log(proc: subprocess.Popen[str], truth: Path, min_bytes: int, wait_s: float = 120.0) -> None:
    """Until the demo's simulator child has written ``min_bytes`` of its truth log ``truth`` (some
    site time run). The test fails, saying what did not happen, when the demo ends first or after
    ``wait_s`` (a bound on a hang, not a timing: a slow machine takes longer); a demo still running
    then is killed, and its stderr (a pipe) shown."""
    deadline = time.monotonic() + wait_s
    while not (truth.exists() and truth.stat().st_size >= min_bytes):
        ended = proc.poll() is not None
        if ended or time.monotonic() > deadline:
            if not ended:
                proc.kill()
            _out, err = proc.communicate()
            size = truth.stat().st_size if truth.exists() else 0
            what = f"the demo ended (exit status {proc.returncode})" if ended else f"{wait_s:.0f} s passed"
            pytest.fail(
                f"{what} before its truth log {truth} had {min_bytes} bytes (it has {size}): {(err or '')[-2000:]}"
            )
        time.sleep(0.2)
