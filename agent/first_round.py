"""The wait before the agent's first decision (:func:`await_first_round`): until every rack has
reported, or one period of site time has passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from agent.aio import wait_event
from agent.clock import SiteClock
from twin.state import TwinState

__all__ = ["await_first_round"]

#: wall seconds the first decision may wait for the clock to confirm a jump to the telemetry's time
_FIRST_ROUND_JUMP_WAIT_S = 5.0


async def await_first_round(
    start_s: float,
    *,
    clock: SiteClock,
    state: TwinState,
    period_s: float,
    telemetry_deadline_s: float,
    stop: asyncio.Event,
    pending: Callable[[], int],
) -> float:
    """Hold the first decision until every rack has reported (cards, loop and PDU, fresh) or one
    period of site time has passed; return the site time it is made at. Deciding on the first
    message alone would put every rack not heard from yet at fail-safe caps for a period (a site
    throttled at each agent restart) and treat the cards of jobs not yet announced as idle.
    The period counts on the clock's current timeline: when the clock jumps or steps to another one
    (``SiteClock.jumps``, ``SiteClock.timelines_left``: a restarted agent's persistent session first
    delivers the acks and job events queued while it was away, stamped behind the telemetry that
    follows), it starts again from there; not when the clock only steps back after running ahead of
    the site (``SiteClock.extrapolation_corrections``: a stall of the agent's loop as it starts, the
    messages queued meanwhile handled after it): the site's time went on, and the period ends where it
    did (it used to start again: a site with a rack not heard from waited up to a period more). While
    such a jump waits for its confirmation (``SiteClock.jump_pending``, for at most
    ``_FIRST_ROUND_JUMP_WAIT_S`` wall seconds) the period does not end. It used to end on the old
    timeline or at once on the jump, with every rack not heard from on the new one at fail-safe caps.
    ``stop`` ends the wait; ``pending`` tells the messages the client holds that the ingest task has
    not taken in yet (see :func:`_drain_inbox`)."""
    end_s = start_s + period_s
    timeline = (clock.jumps, clock.timelines_left)
    jump_wait_end = time.monotonic() + _FIRST_ROUND_JUMP_WAIT_S
    while not stop.is_set():
        now = clock.now()
        if now is None:  # not before the first message (the control task waits for it)
            return start_s
        if (clock.jumps, clock.timelines_left) != timeline:
            timeline = (clock.jumps, clock.timelines_left)
            end_s = now + period_s
        jumping = clock.jump_pending and time.monotonic() < jump_wait_end
        fresh = state.rack_last_seen_s() >= now - telemetry_deadline_s
        if (now >= end_s and not jumping) or bool(np.all(fresh)):
            await _drain_inbox(stop, pending)
            return clock.now_or(now)
        await wait_event(stop, max(0.005, min(0.05, clock.wall_seconds(end_s - now))))
    return clock.now_or(start_s)


async def _drain_inbox(stop: asyncio.Event, pending: Callable[[], int], max_wall_s: float = 0.2) -> None:
    """Let the ingest task take in what the client has already received (job events that came
    in one burst with the telemetry), for at most ``max_wall_s``: the first decision must not see
    a job submitted and not yet started that its next message says is running."""
    deadline = time.monotonic() + max_wall_s
    while pending() > 0 and time.monotonic() < deadline and not stop.is_set():
        await asyncio.sleep(0.005)
