"""Holds a process inside a C extension module's initialisation, for a test to signal it there
(tests/agent/test_cli_sigterm_import.py), not by timing.

A ``sitecustomize.py`` that calls :func:`install` (on the child's PYTHONPATH) arms it: when the module named
in ``IMPORT_HOLD_MODULE`` is imported, at the first Python function its initialisation calls (the
extension's C code calling Python: pybind11 making its enums), the process says ``HELD`` and the module's
name on stderr and reads one byte from the file descriptor ``IMPORT_HOLD_FD`` (a pipe's read end the
test passes it), then goes on. A signal the test sends after reading that line comes while the
initialisation is in progress.
"""

from __future__ import annotations

import _imp
import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import FrameType, ModuleType
from typing import Any

HELD = "import_hold: held in"


class _Arm(importlib.abc.MetaPathFinder):
    """First in ``sys.meta_path``: at the import of the held module, profiles the calls until the hold
    (finds nothing: the import goes on as ever)."""

    def __init__(self, module: str, fd: int) -> None:
        self.module = module
        self.fd = fd
        self.initialising = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == self.module:
            sys.meta_path.remove(self)
            sys.setprofile(self.profile)
        return None

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and arg in (_imp.create_dynamic, _imp.exec_dynamic):
            # importlib's _call_with_frames_removed(f, *args): args[0] is the spec or the module
            first = frame.f_locals.get("args", (None,))[0]
            self.initialising = getattr(first, "name", getattr(first, "__name__", None)) == self.module
        elif event in ("c_return", "c_exception") and arg in (_imp.create_dynamic, _imp.exec_dynamic):
            if self.initialising and arg is _imp.exec_dynamic:  # its initialisation called no Python code:
                sys.setprofile(None)  # no hold (the test reads stderr to its end, and says so)
            self.initialising = False
        elif event == "call" and self.initialising:  # Python code that the extension's C code calls
            sys.setprofile(None)
            sys.stderr.write(f"{HELD} {self.module}\n")
            sys.stderr.flush()
            os.read(self.fd, 1)


def install() -> None:
    """Arm the hold when ``IMPORT_HOLD_MODULE`` and ``IMPORT_HOLD_FD`` are set."""
    module, fd = os.environ.get("IMPORT_HOLD_MODULE"), os.environ.get("IMPORT_HOLD_FD")
    if module and fd:
        sys.meta_path.insert(0, _Arm(module, int(fd)))
