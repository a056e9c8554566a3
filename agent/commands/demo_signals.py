"""Ctrl-C and SIGTERM in ``racktwin demo``: one pair of handlers from the embedded broker's start to the end
of the run without the agent, so that no signal in between is lost or kills the demo.

An event loop's own handlers (``loop.add_signal_handler``) would not do: their signal waits in the loop's
self-pipe for the loop's next turn (one that comes after the run has looked at its ``stop`` event for the
last time is never acted on, and one that comes as the loop closes is never read), and when the loop
closes SIGTERM is put back to its default action, which ends the demo at once (no summary, the embedded
broker left running) until a handler of ours is installed again.
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


class DemoSignals:
    """While entered, SIGINT and SIGTERM set :attr:`received`, then by what the demo is doing:

    - within :meth:`stopping` (the run with the agent, in its event loop): set that run's ``stop`` event,
      the run stops cleanly;
    - from the end of :meth:`stopping` until :meth:`raising`, and within :meth:`remembering` (the broker
      stopping): nothing more (the event loop closes, the broker stops; the demo looks at :attr:`received`
      when it has);
    - otherwise (the broker starting; within :meth:`raising`, the run without the agent): raise
      KeyboardInterrupt, so that the ``finally`` blocks that stop what the demo started run.

    The previous handlers are put back on exit. Not in the main thread nothing is installed (signals
    reach only the main thread's handlers) and :attr:`received` stays false."""

    def __init__(self) -> None:
        self.received = False
        #: what a signal does beyond setting ``received``; None: raise KeyboardInterrupt
        self._then: Callable[[], None] | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> DemoSignals:
        with contextlib.suppress(ValueError):  # not the main thread
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        if self._then is None:
            raise KeyboardInterrupt
        self._then()

    @contextlib.contextmanager
    def stopping(self, stop: asyncio.Event) -> Iterator[None]:
        """Within (in the running event loop that waits on ``stop``), a signal sets ``stop``, also one
        received before; after, a signal is only remembered."""
        loop = asyncio.get_running_loop()

        def set_stop() -> None:  # the handler runs between two steps of the loop: hand it over safely
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(stop.set)

        self._then = set_stop
        if self.received:
            stop.set()
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
