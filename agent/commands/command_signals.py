"""Ctrl-C and SIGTERM in ``racktwin sim``, ``racktwin demo`` and ``racktwin agent``: one pair of handlers for the
command's whole life (from the embedded broker's start to the end of its stop; the demo's run without the agent
too; the agent's from its configuration's reading to its exit status), so that no signal in between is lost or
kills the command.

An event loop's own handlers (``loop.add_signal_handler``) would not do: their signal waits in the loop's
self-pipe for the loop's next turn (one that comes after the run has looked at its ``stop`` event for the
last time is never acted on, and one that comes as the loop closes is never read), and when the loop
closes SIGTERM is put back to its default action, which ends the command at once (no report or summary,
the embedded broker, in its own session, left running with its temporary folder) until a handler of ours
is installed again. So the commands install these handlers before their event loop exists and keep them
after it has closed; ``asyncio.run`` then leaves SIGINT alone too (it puts its own handler only in place
of Python's default one).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ignore() -> None:
    pass


class CommandSignals:
    """While entered, SIGINT and SIGTERM are recorded (:attr:`received`, :attr:`first`), then, by what the
    command is doing:

    - within :meth:`stopping` (the run, in its event loop): call that run's ``stop`` in the loop, the run
      stops cleanly;
    - from the end of :meth:`stopping` or :meth:`raising` on, and within :meth:`remembering` (the broker
      stopping): nothing more (the event loop closes, the broker stops; the command looks at
      :attr:`received` when it has);
    - otherwise (from the entry on: the broker starting; within :meth:`raising`): raise KeyboardInterrupt,
      so that the ``finally`` blocks that stop what the command started run. With ``interrupting=False``
      a signal from the entry on is only remembered instead (``racktwin agent`` looks at :attr:`received`
      before it runs its service; :meth:`stopping` stops a run at once for one that came before).

    The previous handlers are put back on exit. Not in the main thread nothing is installed (signals
    reach only the main thread's handlers) and nothing is recorded."""

    def __init__(self, *, interrupting: bool = True) -> None:
        #: the first signal received (SIGINT or SIGTERM); None: none came
        self.first: signal.Signals | None = None
        #: what a signal does beyond being recorded; None: raise KeyboardInterrupt
        self._then: Callable[[], None] | None = None if interrupting else _ignore
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def received(self) -> bool:
        """Whether a signal came."""
        return self.first is not None

    def __enter__(self) -> CommandSignals:
        with contextlib.suppress(ValueError):  # not the main thread
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.first is None:
            self.first = signal.Signals(signum)
        if self._then is None:
            raise KeyboardInterrupt
        self._then()

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """Within (in the running event loop that runs what ``stop`` ends), a signal calls ``stop`` in that
        loop; one received before calls it at once; after, a signal is only remembered."""
        loop = asyncio.get_running_loop()

        def stop_in_loop() -> None:  # the handler runs between two steps of the loop: hand it over safely
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(stop)

        self._then = stop_in_loop
        if self.received:
            stop()
        try:
            yield
        finally:
            self._then = _ignore

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Within, a signal raises KeyboardInterrupt; after, it is only remembered."""
        self._then = None
        try:
            yield
        finally:
            self._then = _ignore

    @contextlib.contextmanager
    def remembering(self) -> Iterator[None]:
        """Within (what must not be cut short: the broker stopping, after a first signal too), a signal is only
        remembered; after, it does what it did before."""
        then, self._then = self._then, _ignore
        try:
            yield
        finally:
            self._then = then
