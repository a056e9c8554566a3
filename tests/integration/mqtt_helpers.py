"""Helpers for the MQTT integration tests (imported by tests in this folder)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agent.bus import Bus, Incoming

#: Upper bound on any single wait in these tests (a hang fails the test; no timing is asserted).
WAIT_S = 15.0


async def next_messages(bus: Bus, n: int, timeout_s: float = WAIT_S) -> list[Incoming]:
    """The next ``n`` messages the bus receives."""
    out: list[Incoming] = []
    async with asyncio.timeout(timeout_s):
        async for m in bus.messages():
            out.append(m)
            if len(out) == n:
                break
    return out


async def messages_until(bus: Bus, last: Callable[[Incoming], bool], timeout_s: float = WAIT_S) -> list[Incoming]:
    """Messages received up to and excluding the first for which ``last`` is true."""
    out: list[Incoming] = []
    async with asyncio.timeout(timeout_s):
        async for m in bus.messages():
            if last(m):
                return out
            out.append(m)
    return out


async def delivered(
    watcher: Bus,
    attempts: Sequence[tuple[Bus, str, bytes]],
    sentinel: tuple[Bus, str, bytes],
) -> list[Incoming]:
    """Publish each attempt at QoS 1 (awaiting the broker's PUBACK, sent after the broker has routed
    or dropped it), then the sentinel; return what ``watcher`` received before the sentinel. The
    broker queues deliveries in the order it handles publishes, so an attempt that got through
    arrives before the sentinel."""
    for bus, topic, payload in attempts:
        await bus.publish(topic, payload, qos=1)
    s_bus, s_topic, s_payload = sentinel
    await s_bus.publish(s_topic, s_payload, qos=1)
    return await messages_until(watcher, lambda m: m.topic == s_topic and m.payload == s_payload)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    """Poll ``predicate`` every 10 ms until it holds."""
    try:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}") from None
