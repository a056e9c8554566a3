"""Waits that never lose a cancellation (``agent.aio``).

On Python 3.11 ``asyncio.wait_for`` drops a cancellation that arrives in the instant its awaitable
completes; a simulator cancelled that way while it awaited a PUBACK ran its whole scenario. Each test
sweeps the interleavings: the cancellation comes 0, 1, 2 ... loop iterations after the awaited thing
completed, and must always reach the caller (unless the caller had already returned).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agent.aio import cancel_and_wait, cancellation_kept, wait_ended, wait_event

pytestmark = pytest.mark.agent

_ITERATIONS = range(6)


async def _cancel_after(k: int, waiter: asyncio.Task[object], complete: Callable[[], None]) -> str:
    """Complete what ``waiter`` awaits, let ``k`` loop iterations pass, cancel it; how it ended."""
    complete()
    for _ in range(k):
        await asyncio.sleep(0)
    if waiter.done():
        return "returned before the cancel"
    waiter.cancel()
    try:
        await waiter
    except asyncio.CancelledError:
        return "cancelled"
    return "cancel lost"


async def _sweep(make: Callable[[], tuple[Awaitable[object], Callable[[], None]]]) -> list[str]:
    ends = []
    for k in _ITERATIONS:
        awaitable, complete = make()
        waiter: asyncio.Task[object] = asyncio.ensure_future(awaitable)
        await asyncio.sleep(0)  # the waiter is waiting
        ends.append(await _cancel_after(k, waiter, complete))
    return ends


async def test_a_cancel_as_the_event_is_set_reaches_the_waiter() -> None:
    def make() -> tuple[Awaitable[object], Callable[[], None]]:
        event = asyncio.Event()
        return wait_event(event, 10.0), event.set

    ends = await _sweep(make)
    assert "cancel lost" not in ends, ends
    assert ends[0] == "cancelled"  # the sweep covers both sides of the instant


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5.0) is True
    assert await wait_event(event, 0.0) is True  # already set: at once


async def test_a_cancel_as_the_awaited_task_ends_reaches_the_caller_of_wait_ended() -> None:
    def make() -> tuple[Awaitable[object], Callable[[], None]]:
        gate = asyncio.Event()
        child = asyncio.ensure_future(gate.wait())
        return wait_ended(child), gate.set

    ends = await _sweep(make)
    assert "cancel lost" not in ends, ends
    assert ends[0] == "cancelled"


async def test_cancel_and_wait_ends_the_task_quietly_and_raises_only_the_callers_own_cancel() -> None:
    child = asyncio.ensure_future(asyncio.sleep(3600))
    await cancel_and_wait(child)  # the child's cancellation is not raised here
    assert child.cancelled()

    ending, may_end = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:  # once cancelled, ends only when the test lets it
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ending.set()
            await may_end.wait()
            raise

    slow = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    caller = asyncio.ensure_future(cancel_and_wait(slow))
    await asyncio.wait_for(ending.wait(), 10.0)  # (0.01 s after the cancel, before: the child took 0.2 s to end)
    caller.cancel()  # the caller is cancelled while the child is still ending
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(caller, 10.0)
    assert not slow.done()  # still ending: the caller's cancel did not wait for it
    may_end.set()
    await asyncio.wait({slow}, timeout=10.0)  # (0.3 s of wall time before)
    assert slow.cancelled()


async def test_a_cancel_that_wait_for_drops_is_raised_by_cancellation_kept() -> None:
    async def publish_like(event: asyncio.Event) -> None:  # a library awaiting with asyncio.wait_for
        with cancellation_kept():
            await asyncio.wait_for(event.wait(), 10.0)

    def make() -> tuple[Awaitable[object], Callable[[], None]]:
        event = asyncio.Event()
        return publish_like(event), event.set

    ends = await _sweep(make)
    assert "cancel lost" not in ends, ends
    assert ends[0] == "cancelled"


async def test_cancellation_kept_lets_a_timeout_inside_it_through() -> None:
    # asyncio.timeout cancels and un-cancels: no cancellation is left over for cancellation_kept
    with cancellation_kept(), pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1.0)
    with pytest.raises(ValueError), cancellation_kept():
        raise ValueError("not a cancellation")
