"""What a restarted agent takes up from its journal's records (``agent.resume``): the jobs it knew
and the ``card_failed`` marks in force, and its calibration, on a site of the same layout only (their card numbers mean
other cards on a site of other racks or cards per rack)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from agent_helpers import job, small_site

from agent import wire
from agent.config import ControlConfig
from agent.controller import Controller
from agent.journal import Journal
from agent.publish import CommandBook
from agent.resume import FailedCardsRecord, JobsRecord, load_journal, site_layout_json
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import TwinState
from twin.workload import Phase

pytestmark = pytest.mark.agent

NOW = 1000.0
FAILED_CARD = 20  # card 4 of rack r1 on 2 racks of 16 cards; card 4 of rack r2 on 4 racks of 8 cards


def book_of(site: SiteSpec) -> CommandBook:
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    return CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))


def write_records(path: Path, site: SiteSpec) -> None:
    """An agent on ``site`` that knew job ``a`` running on cards 0-7 and had card 20 marked failed by a
    refusal no reading has contradicted, journaled as with each decision."""
    state = TwinState(site)
    spec = job("a", 8)
    state.apply_events(
        [
            JobEvent(NOW, "a", "submitted", Phase.WAITING, job=spec),
            JobEvent(NOW, "a", "started", Phase.COMPUTE, cards=tuple(range(8))),
        ]
    )
    book = book_of(site)
    book.overlays.restore_failed_marks({FAILED_CARD: NOW})
    journal = Journal(path)
    try:
        JobsRecord(journal, site).save(state.snapshot())
        FailedCardsRecord(journal, site).save(book, state.snapshot())
    finally:
        journal.close()


def restart(path: Path, site: SiteSpec) -> tuple[TwinState, CommandBook]:
    """A restarted agent's belief and command book on ``site``, from the journal at ``path``."""
    state, book = TwinState(site), book_of(site)
    journal = Journal(path)
    try:
        load_journal(journal, Controller(site), state, book)
    finally:
        journal.close()
    return state, book


def failed_marks(state: TwinState, book: CommandBook) -> dict[int, float]:
    return book.overlays.failed_marks(np.asarray(state.snapshot().card_last_seen_s, dtype=np.float64))


def test_a_restart_on_the_same_layout_takes_up_the_jobs_and_the_card_failed_marks(tmp_path: Path) -> None:
    site = small_site(2, (4, 4))
    write_records(tmp_path / "journal.sqlite", site)
    state, book = restart(tmp_path / "journal.sqlite", site)
    assert set(state.jobs) == {"a"} and state.jobs["a"].cards == tuple(range(8))
    assert failed_marks(state, book) == {FAILED_CARD: NOW}


@pytest.mark.parametrize("layout", [(4, (2, 4)), (3, (4, 4))], ids=["same cards, other racks", "a rack more"])
def test_a_restart_on_a_site_of_another_layout_takes_up_neither_record_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, layout: tuple[int, tuple[int, int]]
) -> None:
    """The records hold site-wide card numbers: on 4 racks of 8 cards, card 20 of a journal written
    on 2 racks of 16 cards is another rack's card, and job ``a``'s cards 0-7 a whole other rack. A
    restart on a site of another layout (here the same 32 cards, or a rack added) does not take them
    up (it marked a healthy card failed and placed the job on cards it does not run on), and says
    which records it passed over and why."""
    written = small_site(2, (4, 4))
    racks, xy = layout
    now = small_site(racks, xy)
    assert (now.n_racks, now.cards_per_rack) != (written.n_racks, written.cards_per_rack)
    write_records(tmp_path / "journal.sqlite", written)
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    state, book = restart(tmp_path / "journal.sqlite", now)
    assert state.jobs == {}
    assert failed_marks(state, book) == {}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    there = f"{now.n_racks} racks of {now.cards_per_rack} cards"
    assert warned == [
        f"journal record 'jobs' not taken up: written for a site of 2 racks of 16 cards, this site has {there}",
        f"journal record 'failed_cards' not taken up: written for a site of 2 racks of 16 cards, this site has {there}",
    ], warned


def test_records_without_a_layout_are_taken_up_as_before(tmp_path: Path) -> None:
    """Records an agent wrote before they named the site layout (``failed_cards``: card -> stamp) are
    taken up: the layout they were written for is not known."""
    site = small_site(2, (4, 4))
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    spec = dataclasses.asdict(job("a", 8))
    journal.set_meta("jobs", json.dumps({"running": [{"spec": spec, "cards": [8, 9], "phase": 1}], "queue": []}))
    journal.set_meta("failed_cards", json.dumps({str(FAILED_CARD): NOW}))
    journal.close()
    state, book = restart(path, site)
    assert set(state.jobs) == {"a"} and state.jobs["a"].cards == (8, 9)
    assert failed_marks(state, book) == {FAILED_CARD: NOW}


def test_the_records_name_the_layout_they_were_written_for(tmp_path: Path) -> None:
    site = small_site(2, (4, 4))
    write_records(tmp_path / "journal.sqlite", site)
    journal = Journal(tmp_path / "journal.sqlite")
    try:
        for key in ("jobs", "failed_cards"):
            doc = json.loads(journal.get_meta(key) or "{}")
            assert doc["site"] == {"racks": 2, "cards_per_rack": 16}, (key, doc)
        assert json.loads(journal.get_meta("failed_cards") or "{}")["marks"] == {str(FAILED_CARD): NOW}
    finally:
        journal.close()


def test_the_calibration_is_taken_up_on_a_site_of_its_layout_only_and_saved_anew_for_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal's calibration rows are keyed by site-wide card number too: saved with the layout
    they were made on, taken up on a site of that layout, passed over (and said so) on another, and
    dropped when the calibration of another layout is saved over them (a card of the new layout not
    calibrated yet would otherwise take another card's resistance)."""
    written, other = small_site(2, (4, 4)), small_site(4, (2, 4))
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    cards = np.arange(4, dtype=np.int64)
    journal.save_calibration(cards, np.full(4, 0.05), np.ones(4), NOW, layout=site_layout_json(written))
    journal.close()

    def calibrated_on(site: SiteSpec) -> list[int]:
        controller = Controller(site)
        journal = Journal(path)
        try:
            load_journal(journal, controller, TwinState(site), book_of(site))
        finally:
            journal.close()
        return cast(list[int], controller.calibration()[0].tolist())

    assert calibrated_on(written) == [0, 1, 2, 3]
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    assert calibrated_on(other) == []
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "journal record 'calibration' not taken up: written for a site of 2 racks of 16 cards,"
        " this site has 4 racks of 8 cards"
    ]
    # the other layout's agent saves its first card's calibration: the rows of the old layout go
    journal = Journal(path)
    journal.save_calibration(cards[:1], np.full(1, 0.06), np.ones(1), NOW + 300.0, layout=site_layout_json(other))
    assert journal.load_calibration()[0].tolist() == [0]
    journal.save_calibration(cards[1:2], np.full(1, 0.06), np.ones(1), NOW + 600.0, layout=site_layout_json(other))
    assert journal.load_calibration()[0].tolist() == [0, 1]  # the same layout: rows kept
    journal.close()
    assert calibrated_on(other) == [0, 1]


def test_a_calibration_saved_without_a_layout_is_taken_up_as_before(tmp_path: Path) -> None:
    site = small_site(2, (4, 4))
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    journal.save_calibration(np.arange(2, dtype=np.int64), np.full(2, 0.05), np.ones(2), NOW)
    journal.close()
    controller = Controller(site)
    journal = Journal(path)
    load_journal(journal, controller, TwinState(site), book_of(site))
    journal.close()
    assert controller.calibration()[0].tolist() == [0, 1]
