"""What a clean shutdown does for the commands in flight, so that the journal records how the last
decision's commands ended: :func:`await_acks` waits (a short while) for their acks before the ingest
stops, :func:`journal_last_closes` writes the closes the journal has not recorded yet once more.
Whatever stays open or unwritten is logged: a restart sends those commands again while valid
(``agent.resume``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from agent.bus import Bus
from agent.clock import SiteClock
from agent.publish import CommandBook, OpenCommand, Publisher

__all__ = ["await_acks", "journal_last_closes"]

log = logging.getLogger("racktwin.agent")


async def await_acks(book: CommandBook, publisher: Publisher, clock: SiteClock, bus: Bus, max_wall_s: float) -> None:
    """Before the ingest task stops: wait (at most ``max_wall_s``, while connected) for the acks
    of the commands in flight (sent less than the publisher's retry interval ago and still open),
    so that the journal records how the last decision's commands ended (they would otherwise stay
    ``sent`` although applied, and be sent again on restart). Commands unanswered for longer (a
    silent rack) are not waited for. What is still open is logged."""
    deadline = time.monotonic() + max_wall_s
    now = clock.now()
    if now is None:
        return
    recent = now - publisher.retry_after_s
    in_flight = [oc.command_id for oc in book.open.values() if oc.attempts > 0 and oc.last_sent_s > recent]

    def unacked() -> list[OpenCommand]:
        return [book.open[i] for i in in_flight if i in book.open]

    while unacked() and bus.connected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    left = unacked()
    if left:
        log.warning(
            "stopping with %d command(s) sent and not acknowledged (sent again on restart while valid)",
            len(left),
            extra={"fields": {"targets": sorted({oc.target for oc in left})[:16]}},
        )


def journal_last_closes(publisher: Publisher) -> None:
    """At shutdown, the commands closed without an ack whose close the journal has not recorded (it
    failed, or was skipped for ``Publisher.journal_retry_s`` after a failure): written now, once
    more; what is still not written is logged (a restart sends those commands again while valid,
    ``agent.resume``)."""
    left = publisher.journal_closes_now()
    if not left:
        return
    ids = [cid for state_ids in left.values() for cid in state_ids]
    log.error(
        "stopping with %d command close(s) not journaled (%s): a restart sends those commands again while valid",
        len(ids),
        ", ".join(f"{state} {len(state_ids)}" for state, state_ids in left.items()),
        extra={"fields": {"closes": {s: len(v) for s, v in left.items()}, "command_ids": ids[:16]}},
    )
