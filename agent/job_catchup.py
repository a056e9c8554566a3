"""Catching up with the scheduler's job snapshot (``racktwin.job_state/1``, retained on ``jobs/state``).

Job events are the primary stream; an agent that connects after jobs started (a restart, an upgrade,
a fresh agent on a running site) never received their events and, without the snapshot, would take
the busy cards of a job in a checkpoint for idle ones. :func:`reconcile` compares the snapshot with
the belief's job table (``TwinState.jobs``) and returns the job events that make the table say what
the snapshot says, all dated at ``time_s``:

* a job the belief does not hold: ``submitted`` (with the snapshot's spec) and, when it runs,
  ``started`` on its cards in its phase (added);
* a running job whose cards, phase or state differ (or a queued one the snapshot lists running):
  ``started`` on the snapshot's cards in its phase, or ``phase``; a running job the snapshot lists
  queued: ``requeued`` (corrected);
* a job the belief holds that the snapshot does not list: ``finished`` marked ``dropped`` (it ended
  while the agent was not listening, or its end was lost; finished or cancelled, the agent cannot
  tell): its cards are free and the service decides again as on a ``finished``, but the belief counts
  it in ``TwinState.jobs_dropped``, not in ``jobs_finished``. A snapshot that overtook the job's
  ``finished`` (a broker with no order across topics: a bridge, a cluster) drops it the same way; the
  event, when it comes, finds no job and counts nothing: only the count says dropped, not finished.

The caller (:class:`agent.ingest.Ingest`) applies a snapshot only when it is newer than the last job
event it took (a later ``ts``, or the same ``ts`` and a higher ``seq``: the scheduler numbers both
with one counter); an agent that has taken every event finds nothing to change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from agent import wire
from twin.readings import JobEvent
from twin.state import JobInfo
from twin.workload import Phase

__all__ = ["Catchup", "reconcile"]


@dataclass(frozen=True)
class Catchup:
    """What a snapshot changed: the events that do it and how many jobs were added, corrected, dropped."""

    events: tuple[JobEvent, ...]
    added: int = 0
    corrected: int = 0
    dropped: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.events)


def _after(time_s: float, info: JobInfo) -> float:
    """``time_s``, or just after the job's last event when that is not earlier (the belief takes a
    ``started`` of a running job stamped at its last event for a copy, and drops older events)."""
    return time_s if time_s > info.last_event_s else math.nextafter(info.last_event_s, math.inf)


def reconcile(
    snapshot: wire.JobState,
    jobs: Mapping[str, JobInfo],
    site_cards: Mapping[str, tuple[int, ...]],
    time_s: float,
) -> Catchup:
    """The events that make ``jobs`` (the belief's table) what ``snapshot`` lists (module docstring).
    ``site_cards``: each running entry's cards as sorted site indices, by job id (rack-local -> site
    is the ingest's conversion); ``time_s``: the snapshot's date in site time."""
    events: list[JobEvent] = []
    added = corrected = dropped = 0
    listed: set[str] = set()
    for entry in snapshot.jobs:
        jid = entry.job_id
        listed.add(jid)
        info = jobs.get(jid)
        cards = site_cards.get(jid, ())
        phase = entry.phase
        if info is None:
            events.append(JobEvent(time_s, jid, "submitted", Phase.WAITING, job=entry.job))
            if entry.running and phase is not None:
                events.append(JobEvent(time_s, jid, "started", phase, cards=cards))
            added += 1
        elif entry.running and phase is not None:
            if info.state != "running" or tuple(sorted(info.cards)) != cards:
                events.append(JobEvent(_after(time_s, info), jid, "started", phase, cards=cards))
                corrected += 1
            elif info.phase != phase:
                events.append(JobEvent(_after(time_s, info), jid, "phase", phase))
                corrected += 1
        elif info.state == "running":
            events.append(JobEvent(_after(time_s, info), jid, "requeued", Phase.WAITING))
            corrected += 1
    for jid, info in jobs.items():
        if jid not in listed:
            events.append(
                JobEvent(
                    _after(time_s, info),
                    jid,
                    "finished",
                    info.phase,
                    detail="not in the scheduler's snapshot",
                    dropped=True,
                )
            )
            dropped += 1
    return Catchup(tuple(events), added, corrected, dropped)
