"""agent.commands.command_signals: the Ctrl-C / SIGTERM holder of ``racktwin sim`` and ``racktwin demo``,
with real signals sent to this process (pytest runs the tests in the main thread)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agent.commands.command_signals import CommandSignals

pytestmark = pytest.mark.agent


def _send(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)  # delivered, and its Python handler run, before the next line


def test_a_signal_while_starting_is_a_ctrl_c_and_the_first_one_is_the_one_named() -> None:
    """From the entry on a signal raises KeyboardInterrupt; :attr:`first` names the first that came
    (``racktwin sim`` prints it: "stopped by SIGTERM"), not a later one; the previous handlers come back."""
    before = signal.getsignal(signal.SIGTERM)
    with CommandSignals() as signals:
        assert not signals.received
        with pytest.raises(KeyboardInterrupt):
            _send(signal.SIGTERM)
        with signals.remembering():
            _send(signal.SIGINT)  # only remembered
        assert (signals.received, signals.first) == (True, signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("before_the_run", [False, True])
def test_stopping_calls_stop_in_the_loop_also_for_a_signal_received_before(before_the_run: bool) -> None:
    """Within :meth:`stopping` a signal calls the run's ``stop`` in its event loop, and one remembered before
    (after :meth:`raising`, as ``asyncio.run`` sets up) is acted on as the run starts; after it, a signal
    is only remembered (the loop closing, the broker stopping)."""
    stops: list[str] = []

    async def run(signals: CommandSignals) -> None:
        done = asyncio.Event()

        def stop() -> None:
            stops.append("stop")
            done.set()

        with signals.stopping(stop):
            if not before_the_run:
                _send(signal.SIGINT)
            await done.wait()

    with CommandSignals() as signals:
        with signals.raising():
            pass
        if before_the_run:
            _send(signal.SIGINT)  # only remembered
        asyncio.run(run(signals))
        _send(signal.SIGTERM)  # after the run: only remembered, no KeyboardInterrupt, no second stop
    assert (stops, signals.first) == (["stop"], signal.SIGINT)


def test_not_interrupting_a_signal_from_the_entry_on_is_only_remembered_until_stopping() -> None:
    """``CommandSignals(interrupting=False)`` (``racktwin agent``): from the entry on a signal raises nothing
    and is remembered (the command then does not start its run); :meth:`stopping` calls ``stop`` at once for
    it, and one after is only remembered too."""
    stops: list[str] = []

    async def run(signals: CommandSignals) -> None:
        with signals.stopping(lambda: stops.append("stop")):
            pass

    with CommandSignals(interrupting=False) as signals:
        _send(signal.SIGTERM)  # no KeyboardInterrupt
        assert signals.first == signal.SIGTERM
        asyncio.run(run(signals))
        _send(signal.SIGINT)
    assert (stops, signals.first) == (["stop"], signal.SIGTERM)
