"""Waits that never lose a cancellation.

On Python 3.11 ``asyncio.wait_for`` returns the awaited result, and drops the cancellation, when the
task is cancelled in the instant its awaitable completes (CPython gh-86296, fixed in 3.12 by building
``wait_for`` on ``asyncio.timeout``). A long-running loop that waits that way (for an event with a
timeout, for a PUBACK) can then miss its cancellation and run on: a simulator cancelled while it
awaited a PUBACK ran to the end of its scenario. These waits use ``asyncio.timeout``, which counts
cancellations and never loses one; :func:`wait_ended` and :func:`cancel_and_wait` wait for another
task without swallowing a cancellation of the caller; :func:`cancellation_kept` goes around an await
inside a library that uses ``wait_for`` (aiomqtt's publish) and raises the cancellation it dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["cancel_and_wait", "cancellation_kept", "wait_ended", "wait_event"]


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set, at most ``timeout_s`` seconds (None: no limit); whether it is set."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


async def wait_ended(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended (without cancelling it). Its own cancellation is not an error
    here; a cancellation of the caller while it waits is raised, even one that comes in the instant
    the task ends (``contextlib.suppress(CancelledError)`` around the await would swallow that one
    too, and the caller would run on). Told apart by the caller's count of cancellation requests."""
    me = asyncio.current_task()
    before = me.cancelling() if me is not None else 0
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if me is not None and me.cancelling() > before:
            raise


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended (see :func:`wait_ended`)."""
    task.cancel()
    await wait_ended(task)


@contextlib.contextmanager
def cancellation_kept() -> Iterator[None]:
    """Around an await that may drop a cancellation (``asyncio.wait_for`` on 3.11 inside a library):
    when the task was asked to cancel meanwhile and the await returned (or failed otherwise) anyway,
    raise ``CancelledError`` at the end. Told by the task's count of cancellation requests, which a
    dropped cancellation leaves raised (``asyncio.timeout`` lowers it again for its own)."""
    me = asyncio.current_task()
    before = me.cancelling() if me is not None else 0

    def dropped() -> bool:
        return me is not None and me.cancelling() > before

    try:
        yield
    except asyncio.CancelledError:
        raise
    except BaseException:
        if dropped():
            raise asyncio.CancelledError from None
        raise
    if dropped():
        raise asyncio.CancelledError
