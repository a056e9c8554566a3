"""What a restarted agent takes up from its journal: the cycle count, the calibration, the jobs it
knew and the cards racks refused commands for as failed (:func:`load_journal`; written by
:class:`JobsRecord` and :class:`FailedCardsRecord` when they change, both saved with each decision by
:class:`RestartRecords`) and the commands still open (:func:`open_commands_to_resume`: those not
expired are sent again, an expired command is never sent again).

The jobs and ``card_failed`` records hold site-wide card numbers: each names the site layout it
was written for (:func:`site_layout`), and a restart on a site of another layout (racks or cards per
rack changed) does not take them up, with a warning: card 70 of 4 racks of 64 cards is card 6 of
rack r1, of 2 racks of 128 cards card 70 of rack r0. A record without a layout (written before the
records named one) is taken up as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import asdict
from typing import Any

from agent.controller import Controller
from agent.failure_lines import WriteFailures
from agent.journal import CALIBRATION_LAYOUT_KEY, Journal, JournalError
from agent.publish import CommandBook, OpenCommand
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import StateSnapshot, TwinState
from twin.workload import JobSpec, Phase

__all__ = [
    "FailedCardsRecord",
    "JobsRecord",
    "RestartRecords",
    "load_journal",
    "open_commands_to_resume",
    "restore_jobs",
    "site_layout",
    "site_layout_json",
]

log = logging.getLogger("racktwin.agent")


def load_journal(journal: Journal, controller: Controller, state: TwinState, book: CommandBook) -> None:
    """Take up the last run's cycle count and calibration (into ``controller``), the jobs it knew
    (into ``state``) and its ``card_failed`` marks (into ``book``); a record that cannot be read is
    passed over."""
    j = journal
    last = j.last_decision()
    if last is not None:
        controller.resume_cycle(last[0])
    layout = site_layout(state.site)
    cards, r_th, leak = j.load_calibration()
    if cards.size and not _for_another_layout(j.get_meta(CALIBRATION_LAYOUT_KEY), "calibration", layout):
        controller.load_calibration(cards, r_th, leak)
    else:
        cards = cards[:0]
    doc = _record(j, JobsRecord.key, layout)
    if doc is not None:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            restore_jobs(state, doc)
    doc = _record(j, FailedCardsRecord.key, layout)
    if doc is not None:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            marks = doc["marks"] if "site" in doc else doc  # without a layout: card -> stamp
            book.overlays.restore_failed_marks({int(c): float(t) for c, t in marks.items()})
            holds = doc.get("repeats", {}) if "site" in doc else {}  # none before the repeats were kept
            book.overlays.restore_failed_repeat_holds(
                {int(c): (int(h["repeats"]), float(h["hold_until_s"]), float(h["hold_s"])) for c, h in holds.items()}
            )
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


def site_layout(site: SiteSpec) -> dict[str, int]:
    """What a site-wide card number means on ``site`` (card ``c`` is card ``c % cards_per_rack`` of
    rack ``c // cards_per_rack``), as the journal's records name it."""
    return {"racks": int(site.n_racks), "cards_per_rack": int(site.cards_per_rack)}


def site_layout_json(site: SiteSpec) -> str:
    """:func:`site_layout` as the journal keeps it with the calibration (``Journal.save_calibration``)."""
    return json.dumps(site_layout(site), sort_keys=True, separators=(",", ":"))


def _layout_text(layout: Any) -> str:
    if isinstance(layout, dict):
        return f"{layout.get('racks')} racks of {layout.get('cards_per_rack')} cards"
    return repr(layout)


def _record(journal: Journal, key: str, layout: dict[str, int]) -> dict[str, Any] | None:
    """The journal's record ``key`` (a JSON object), or None: none, unreadable, or written for a site
    of another layout than ``layout`` (logged: its card numbers mean other cards here)."""
    raw = journal.get_meta(key)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if "site" in doc and _for_another_layout(doc["site"], key, layout):
        return None
    return doc


def _for_another_layout(written: Any, key: str, layout: dict[str, int]) -> bool:
    """Whether the journal's record ``key`` was written for a site of another layout than ``layout``
    (``written``: the layout it names, as a dict or its JSON text; None: it names none, as before the
    layouts were kept, taken as this one). Logged: its card numbers mean other cards here."""
    if written is None:
        return False
    if isinstance(written, str):
        try:
            written = json.loads(written)
        except ValueError:
            written = {"unreadable": written}
    if written == layout:
        return False
    log.warning(
        "journal record %r not taken up: written for a site of %s, this site has %s",
        key,
        _layout_text(written),
        _layout_text(layout),
        extra={"fields": {"record": key, "journal_layout": written, "site_layout": layout}},
    )
    return True


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
    """The jobs the agent knows (running: spec, cards, phase; queued: spec) on a site of ``site``'s
    layout, written to the journal's ``jobs`` entry with each decision, when they changed. A failed
    write raises :class:`agent.journal.JournalError` (and is written at the next call)."""

    key = "jobs"

    def __init__(self, journal: Journal, site: SiteSpec) -> None:
        self.journal = journal
        self.layout = site_layout(site)
        self._hash = ""

    def save(self, snap: StateSnapshot) -> None:
        def spec_of(info: Any) -> dict[str, Any] | None:
            return asdict(info.spec) if info.spec is not None else None

        doc = {
            "site": self.layout,
            "running": [
                {"spec": spec_of(j), "cards": list(j.cards), "phase": int(j.phase)} for j in snap.jobs if j.spec
            ],
            "queue": [{"spec": spec_of(q)} for q in snap.queue if q.spec],
        }
        raw = json.dumps(doc, separators=(",", ":"))
        digest = hashlib.sha1(raw.encode()).hexdigest()
        if digest != self._hash:
            self.journal.set_meta(self.key, raw)
            self._hash = digest


class FailedCardsRecord:
    """The cards a rack refused a command for as failed (``card_failed``) that no reading has shown
    since (card -> the refusal's stamp: ``agent.command_overlays.Overlays.failed_marks``), written to
    the journal's ``failed_cards`` entry with each decision, when they changed. Without it a
    restarted agent sent a silent rack's caps to its dead cards again and had them refused once
    more before it knew. The entry names the site layout (``{"site": ..., "marks": {card: stamp},
    "repeats": {card: {"repeats": n, "hold_until_s": t, "hold_s": h}}}``); ``repeats`` are the cards
    refused as failed again although their telemetry read them alive
    (``Overlays.failed_repeat_holds``: a restarted agent holds them out for the rest of their hold, and
    their next refusal doubles it), absent in entries written before they were kept (taken up without
    repeats; an agent of before reads the marks only). A failed write raises
    :class:`agent.journal.JournalError` (and is written at the next call)."""

    key = "failed_cards"

    def __init__(self, journal: Journal, site: SiteSpec) -> None:
        self.journal = journal
        self.layout = site_layout(site)
        self._raw = ""

    def save(self, book: CommandBook, snap: StateSnapshot) -> None:
        marks = book.overlays.failed_marks(snap.card_last_seen_s)
        holds = book.overlays.failed_repeat_holds()
        doc: dict[str, Any] = {"site": self.layout, "marks": {str(c): t for c, t in marks.items()}}
        if holds:
            doc["repeats"] = {
                str(c): {"repeats": n, "hold_until_s": until, "hold_s": hold} for c, (n, until, hold) in holds.items()
            }
        raw = json.dumps(doc, separators=(",", ":"))
        if raw != self._raw:
            self.journal.set_meta(self.key, raw)
            self._raw = raw


class RestartRecords:
    """The jobs known (:class:`JobsRecord`) and the ``card_failed`` marks in force
    (:class:`FailedCardsRecord`), saved with each decision (:meth:`save`) for a restart. A failed write
    is kept as :attr:`error` (the agent is not ready) and logged once, then at most once a minute with
    a count (:class:`agent.failure_lines.FailureLines`), and once when it works again; it is tried
    again with the next decision (a record remembers only what it wrote)."""

    def __init__(self, journal: Journal, site: SiteSpec) -> None:
        self.jobs = JobsRecord(journal, site)
        self.failed_cards = FailedCardsRecord(journal, site)
        self._writes = WriteFailures()

    @property
    def error(self) -> str | None:
        """Why the last write of the jobs or card_failed marks failed (None: it worked): the agent is not ready."""
        return self._writes.error

    def save(self, book: CommandBook, snap: StateSnapshot) -> None:
        """Both records, each written when it changed; a failure is logged, never raised (the decision
        is acted on all the same)."""
        failed: dict[str, str] = {}  # what was not saved: why
        try:
            self.jobs.save(snap)
        except JournalError as exc:
            failed["jobs"] = str(exc)
        try:
            self.failed_cards.save(book, snap)
        except JournalError as exc:
            failed["card_failed marks"] = str(exc)
        if failed:
            since = self._writes.failed_with("; ".join(f"{what} not saved: {err}" for what, err in failed.items()))
            if since is not None:
                log.warning(
                    "journal write failed: %s not saved for a restart (tried again with the next decision); "
                    "the decision is acted on (%d decision(s) failed to save them since the last such line)",
                    " and ".join(failed),
                    since,
                    extra={"fields": {"error": self.error}},
                )
        elif n := self._writes.succeeded():
            log.info(
                "journal written again: jobs and card_failed marks saved for a restart (after %d failed write(s))", n
            )


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
