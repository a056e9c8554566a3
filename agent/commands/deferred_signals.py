"""Ctrl-C and SIGTERM held back while a C extension module initialises, then handled as they would have been.

A KeyboardInterrupt raised in the Python code that an extension module's initialisation calls (pybind11
making its enums in ``matplotlib.ft2font`` and ``highspy._core``, for one) does not reach the command as
one: the initialisation fails, the process ends with an ``ImportError: initialization failed`` traceback
or aborts (-6) as the interpreter finalises the half-made module. ``racktwin optimize`` and ``evaluate``
import matplotlib (their reports) and HiGHS lazily, with their signal handlers in place
(:func:`agent.commands.common.sigterm_interrupts`): a SIGTERM or Ctrl-C there crashed them instead of
their one ``interrupted`` line and exit status 130. Within :func:`extension_inits_uninterrupted` every
extension module found on ``sys.path`` is initialised under :func:`signals_deferred`, so a signal that
comes meanwhile is handled when that initialisation has finished: milliseconds (matplotlib's and HiGHS's
longest under 40 ms, benchmarks/results-agent.md). The Python code of an import is not held: a
KeyboardInterrupt stops it cleanly.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib.machinery import ExtensionFileLoader, ModuleSpec, PathFinder
from types import FrameType, ModuleType
from typing import Any

__all__ = ["DEFERRED_SIGNALS", "extension_inits_uninterrupted", "signals_deferred"]

#: the signals held back: Ctrl-C, and SIGTERM (a KeyboardInterrupt too where a command makes it one)
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers


def _handle(signum: int, frame: FrameType | None, handler: Handler) -> None:
    """What ``handler`` (as :func:`signal.signal` returned it) does with ``signum``."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:  # e.g. SIGTERM outside sigterm_interrupts: its default action, now
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    # SIG_IGN: nothing


@contextlib.contextmanager
def signals_deferred(signums: Sequence[int] = DEFERRED_SIGNALS) -> Iterator[None]:
    """Within the block ``signums`` are recorded, not handled; after it their handlers are back and each
    signal that came is raised again (once), so it is handled as it would have been, only later (a Ctrl-C:
    KeyboardInterrupt as the block ends). Outside the main thread (no signal handlers there) a plain block.
    A handler that Python did not install (``signal.getsignal`` is None) is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    holding = True
    previous: dict[int, Handler] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        if holding:
            came.append(signum)
        else:  # came while the handlers were being put back: as the one before would have
            _handle(signum, frame, previous[signum])

    try:
        for signum in signums:
            handler = signal.getsignal(signum)
            if handler is not None:
                signal.signal(signum, hold)
                previous[signum] = handler
        yield
    finally:
        holding = False  # from here on `hold` passes a signal on, should one come before its handler is back
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


class _DeferringExtensionLoader(ExtensionFileLoader):
    """An extension module's loader that initialises it under :func:`signals_deferred`."""

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        with signals_deferred():
            return super().create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with signals_deferred():
            super().exec_module(module)


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Before :class:`PathFinder` in ``sys.meta_path``: its spec, with a deferring loader for an extension
    module (the finders before it in ``sys.meta_path`` have had their turn)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is ExtensionFileLoader:
            spec.loader = _DeferringExtensionLoader(spec.loader.name, spec.loader.path)
        return spec


@contextlib.contextmanager
def extension_inits_uninterrupted() -> Iterator[None]:
    """Within the block every extension module imported (found on ``sys.path``) is initialised with Ctrl-C
    and SIGTERM deferred (:func:`signals_deferred`)."""
    finder = _DeferringFinder()
    at = sys.meta_path.index(PathFinder) if PathFinder in sys.meta_path else len(sys.meta_path)
    sys.meta_path.insert(at, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
