"""What a restarted agent takes up from its journal: the cycle count, the calibration, the jobs it
knew and the cards racks refused commands for as failed (:func:`load_journal`; written by
:class:`JobsRecord` and :class:`FailedCardsRecord` when they change) and the commands still open
(:func:`open_commands_to_resume`: those not expired are sent again, an expired command is never
sent again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import asdict
from typing import Any

from agent.controller import Controller
from agent.journal import Journal
from agent.publish import CommandBook, OpenCommand
from twin.readings import JobEvent
from twin.state import StateSnapshot, TwinState
from twin.workload import JobSpec, Phase

__all__ = ["FailedCardsRecord", "JobsRecord", "load_journal", "open_commands_to_resume", "restore_jobs"]

log = logging.getLogger("racktwin.agent")


def load_journal(journal: Journal, controller: Controller, state: TwinState, book: CommandBook) -> None:
    """Take up the last run's cycle count and calibration (into ``controller``), the jobs it knew
    (into ``state``) and its ``card_failed`` marks (into ``book``); a record that cannot be read is
    passed over."""
    j = journal
    last = j.last_decision()
    if last is not None:
        controller.resume_cycle(last[0])
    cards, r_th, leak = j.load_calibration()
    if cards.size:
        controller.load_calibration(cards, r_th, leak)
    raw = j.get_meta("jobs")
    if raw:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            restore_jobs(state, json.loads(raw))
    raw = j.get_meta(FailedCardsRecord.key)
    if raw:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            book.overlays.restore_failed_marks({int(c): float(t) for c, t in json.loads(raw).items()})
    log.info(
        "journal opened",
        extra={
            "fields": {
                "path": j.path,
                "decisions": j.decision_count(),
                "calibrated_cards": int(cards.size),
                "jobs": len(state.jobs),
            }
        },
    )


def restore_jobs(state: TwinState, doc: dict[str, Any]) -> None:
    """The jobs of a record :class:`JobsRecord` wrote, as job events into ``state``."""
    events: list[JobEvent] = []
    for item in (*doc.get("queue", []), *doc.get("running", [])):
        spec = JobSpec(**item["spec"])
        events.append(JobEvent(0.0, spec.job_id, "submitted", Phase.WAITING, job=spec))
    for item in doc.get("running", []):
        jid = item["spec"]["job_id"]
        events.append(JobEvent(0.0, jid, "started", Phase(item["phase"]), cards=tuple(item["cards"])))
        events.append(JobEvent(0.0, jid, "phase", Phase(item["phase"])))
    state.apply_events(events)


class JobsRecord:
    """The jobs the agent knows (running: spec, cards, phase; queued: spec), written to the
    journal's ``jobs`` entry with each decision, when they changed. A failed write raises
    :class:`agent.journal.JournalError`."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._hash = ""

    def save(self, snap: StateSnapshot) -> None:
        def spec_of(info: Any) -> dict[str, Any] | None:
            return asdict(info.spec) if info.spec is not None else None

        doc = {
            "running": [
                {"spec": spec_of(j), "cards": list(j.cards), "phase": int(j.phase)} for j in snap.jobs if j.spec
            ],
            "queue": [{"spec": spec_of(q)} for q in snap.queue if q.spec],
        }
        raw = json.dumps(doc, separators=(",", ":"))
        digest = hashlib.sha1(raw.encode()).hexdigest()
        if digest != self._hash:
            self.journal.set_meta("jobs", raw)
            self._hash = digest


class FailedCardsRecord:
    """The cards a rack refused a command for as failed (``card_failed``) that no reading has shown
    since (card -> the refusal's stamp: ``agent.command_overlays.Overlays.failed_marks``), written to
    the journal's ``failed_cards`` entry with each decision, when they changed. Without it a
    restarted agent sent a silent rack's caps to its dead cards again and had them refused once
    more before it knew. A failed write raises :class:`agent.journal.JournalError`."""

    key = "failed_cards"

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._raw = ""

    def save(self, book: CommandBook, snap: StateSnapshot) -> None:
        marks = book.overlays.failed_marks(snap.card_last_seen_s)
        raw = json.dumps({str(c): t for c, t in marks.items()}, separators=(",", ":"))
        if raw != self._raw:
            self.journal.set_meta(self.key, raw)
            self._raw = raw


def open_commands_to_resume(journal: Journal, book: CommandBook, now_s: float) -> tuple[list[OpenCommand], int]:
    """Commands still open in the journal at site time ``now_s``: expired ones are closed (never sent
    again), the others opened again in ``book``. Returns those (to send again) and the number expired."""
    expired = journal.expire(now_s)
    rows = [
        (c.command_id, c.target, c.topic, c.payload, c.issued_s, c.expires_s, c.attempts)
        for c in journal.unacked(now_s)
    ]
    opened = book.resume(rows)
    if rows or expired:
        log.info(
            "resumed open commands from the journal",
            extra={"fields": {"resent": len(opened), "expired_not_resent": expired}},
        )
    return opened, expired
