"""A card a rack refuses as failed (``card_failed``) while its telemetry reads it alive (a stuck
sensor: the BMC's status of the card is stale). The first refusal marks it failed until a newer
reading, as for a card that failed unseen; the next reading clears the mark, and every command to
its rack would include it again and be refused whole: the rack's other cards never got their levels
or power limits. A card refused as failed again after a reading had cleared its mark is held out of
commands for a hold that doubles with each repeat (``agent.command_overlays``), whatever its readings
say, and commanded again after it (a card repaired meanwhile takes the command).

In process, with the real book (``agent.publish.CommandBook``) and the simulator's rack
(``sim.commands.CommandHandler``) over a plant whose card 4 of rack r1 fails while its sensor is stuck.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import small_site
from guard_helpers import proposal

from agent import wire
from agent.command_overlays import FAILED_HOLD_MAX_S, Overlays
from agent.config import ControlConfig
from agent.controller import Controller
from agent.journal import Journal
from agent.publish import CommandBook
from agent.resume import FailedCardsRecord, load_journal
from sim.commands import CommandHandler
from twin.faults import CardFailure, StuckSensor
from twin.plant import Fault, Plant, PlantConfig
from twin.readings import Readings
from twin.state import TwinState

pytestmark = pytest.mark.agent

DEAD = 20  # card 4 of rack r1 (2 racks of 16 cards)
R1 = np.arange(16, 32)
OTHERS = R1[R1 != DEAD]
TTL_S = 30.0
PERIOD_S = 10.0
SLOW = 3  # the level every card is told to run at (the plant starts them at 0)
CAP_W = 500.0  # the power limit every card is told


class _Site:
    """A plant, the belief fed from its readings every second, the agent's book deciding every
    ``PERIOD_S`` and the simulator's rack answering its commands at once (acks into the book)."""

    def __init__(self, faults: Sequence[Fault]) -> None:
        self.site = small_site(racks=2, xy=(4, 4))
        self.plant = Plant(self.site, [], list(faults), PlantConfig(seed=3))
        self.state = TwinState(self.site)
        codec = wire.Codec(wire.SiteLayout.from_spec(self.site, site="site1"))
        self.codec = codec
        self.book = CommandBook(self.site, codec, ControlConfig(command_ttl_s=TTL_S))
        self.t = 0.0
        self.level = SLOW  # the level every card is told to run at now
        self.rack = CommandHandler(self.plant, codec, wire.Sequencer("sim"), lambda: self.t)
        self.refused: list[tuple[float, tuple[int, ...]]] = []  # (when, the rack's cards) of refused commands

    def run(self, until_s: float) -> None:
        while self.t < until_s:
            self.plant.step(1.0)
            self.t += 1.0
            self.state.update(_dead_card_read_alive(self.plant.readings()))
            self.state.apply_events(self.plant.drain_events())
            if self.t % PERIOD_S == 0:
                self.decide()

    def decide(self) -> None:
        snap = self.state.snapshot()
        n = self.site.n_cards
        decision = proposal(self.site, self.level, time_s=self.t, card_power_limit_w=np.full(n, CAP_W))
        self.book.expire(self.t)
        applied = np.full(n, -1, dtype=np.int64)
        for oc in self.book.commands(decision, snap, applied, self.t):
            msg = self.codec.decode(oc.topic, oc.payload)
            (ack,) = [
                self.codec.decode(o.topic, o.payload) for o in self.rack.handle(oc.topic, oc.payload) if not o.retain
            ]
            assert isinstance(ack, wire.Acknowledgement)
            if ack.result is not wire.AckResult.APPLIED:
                assert isinstance(msg, wire.RackCommand)
                assert wire.reason_code(ack.reason) == wire.AckReason.CARD_FAILED, ack.reason
                self.refused.append((self.t, msg.cards))
            self.book.on_ack(ack, self.t)

    def others_commanded(self) -> bool:
        """Whether r1's other cards have the level and the power limit the agent wants."""
        return bool(np.all(self.rack.level[OTHERS] == self.level) and np.all(self.rack.power_limit_w[OTHERS] == CAP_W))


def _dead_card_read_alive(readings: Readings) -> Readings:
    """The readings with the dead card's status read alive, as its stuck BMC reports it. (Over the wire
    the agent infers a failure from 0 MHz at 0 W, which the stuck sensor alone freezes at the card's
    live values; in process the belief takes the plant's flag.)"""
    racks = list(readings.racks)
    r1 = racks[1]
    assert r1.cards is not None
    failed = np.asarray(r1.cards.failed, dtype=bool).copy()
    failed[DEAD - 16] = False
    racks[1] = dataclasses.replace(r1, cards=dataclasses.replace(r1.cards, failed=failed))
    return dataclasses.replace(readings, racks=tuple(racks))


def _stale_dead_card(repair_after_s: float = float("inf")) -> list[Fault]:
    """Card 4 of r1 fails at 5 s; its sensor stuck from 0 s on, so its readings go on showing it alive."""
    return [
        StuckSensor(rack=1, start_s=0.0, card=DEAD),
        CardFailure(card=DEAD, at_s=5.0, repair_after_s=repair_after_s),
    ]


def test_the_other_cards_get_their_commands_although_the_dead_card_reads_alive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first refusal (10 s) is as for any card failed unseen: it names the card, so it holds the
    other cards back no longer, and the card counts as failed until a newer reading, which clears the
    mark; the next decision (20 s) sends the card the setting again with them, refused again: a repeat.
    From then on it is left out for 30 s, then 60, 120, 240, 480 s (one warning each time, per card,
    not per command): the other cards of r1 have their level and power limit from the decision after
    the repeat (30 s) on; each time a hold ends the card alone is refused. Without the holds every
    command to r1 was refused (one level and one limit command every decision) and its other cards
    never got either; with the refusal's backoff kept on them (as before) they waited ``command_ttl_s``
    for the repeat (40 s) and got their settings at 50 s."""
    s = _Site(_stale_dead_card())
    with caplog.at_level(logging.WARNING, logger="racktwin.agent"):
        s.run(20.0)
        assert not s.state.snapshot().card_failed[DEAD]  # its telemetry reads it alive
        assert np.all(s.rack.level[:16] == SLOW)  # rack r0 commanded at once
        # its level and its limit command, refused whole at 10 s and, the first mark cleared by a
        # reading, again at 20 s
        assert s.refused == [(10.0, tuple(range(16)))] * 2 + [(20.0, tuple(range(16)))] * 2
        assert not s.others_commanded()
        s.run(30.0)
        assert s.others_commanded()  # the next decision leaves the dead card out
        s.run(600.0)
    assert s.others_commanded() and s.rack.level[DEAD] == 0 and s.rack.power_limit_w[DEAD] != CAP_W
    # holds of 30, 60, 120 and 240 s from 20 s: refused alone at 50, 110, 230 and 470 s
    assert s.refused[4:] == [(t, (DEAD - 16,)) for t in (50.0, 110.0, 230.0, 470.0) for _ in range(2)]
    warned = [r.getMessage() for r in caplog.records if "refused as failed again" in r.getMessage()]
    assert warned == [
        f"rack r1 card 4 refused as failed again although its telemetry reads it alive: left out of commands "
        f"for {hold} s"
        for hold in (30, 60, 120, 240, 480)
    ]


def test_a_card_repaired_during_its_hold_is_commanded_after_it_and_counts_from_the_start_again() -> None:
    """The card is repaired at 105 s, during its 60-s hold (50-110 s): the decision at 110 s sends it
    the level and limit, which its rack applies. Failing again later (300 s), its first refusal is a
    first one again: no hold, the mark cleared by the next reading, and the refusal of the decision
    after it the first repeat."""
    s = _Site([*_stale_dead_card(repair_after_s=100.0), CardFailure(card=DEAD, at_s=300.0)])
    s.run(109.0)
    assert [t for t, _cards in s.refused] == [10.0, 10.0, 20.0, 20.0, 50.0, 50.0]
    assert s.rack.level[DEAD] == 0 and s.book.overlays.failed_repeats[DEAD] == 2
    s.run(110.0)
    assert s.rack.level[DEAD] == SLOW and s.rack.power_limit_w[DEAD] == CAP_W  # repaired: applied
    assert s.book.overlays.failed_repeats[DEAD] == 0
    # failing again (300 s), it takes the next change of plan (r1 one level faster at 310 s) down with
    # it: refused whole, the mark cleared by a reading, refused whole again at the next decision
    # (320 s): a first refusal, then the first repeat
    s.run(300.0)
    s.level = SLOW - 1
    s.run(329.0)
    assert s.refused[6:] == [(310.0, tuple(range(16))), (320.0, tuple(range(16)))]
    assert s.book.overlays.failed_repeats[DEAD] == 1
    s.run(330.0)
    assert s.others_commanded() and s.rack.level[DEAD] == SLOW


def test_the_hold_doubles_from_the_command_ttl_up_to_an_hour() -> None:
    """Refused again and again, each time right after its hold ended and a reading showed the card
    alive: held 30, 60, ... 1920 s, then an hour each time, also after 10,000 repeats; a refusal of a
    command issued before the mark was cleared (the same decision's other command) is no repeat."""
    site = small_site(racks=2, xy=(4, 4))
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=TTL_S))
    snap = TwinState(site).snapshot()
    n = site.n_cards
    now = 1000.0
    holds: list[float] = []
    for level in range(12):
        if level == 11:  # refused again every hour for more than a year (the doubling overflowed a float)
            book.overlays.failed_repeats[DEAD] = 10_000
        decision = proposal(site, level % 2 + 1, time_s=now, card_power_limit_w=np.full(n, CAP_W))
        seen = dataclasses.replace(snap, card_last_seen_s=np.full(n, now - 0.5))
        sent = book.commands(decision, seen, np.full(n, -1, dtype=np.int64), now)
        to_dead = [oc for oc in sent if DEAD in oc.cards]
        assert len(to_dead) == 2  # its level and its limit
        for oc in to_dead:
            reason = wire.card_failed_reason("r1", [DEAD - 16])
            ack = wire.Acknowledgement("r1", uuid.UUID(oc.command_id), wire.AckResult.REJECTED, now, 0, "sim", reason)
            book.on_ack(ack, now)
        for oc in sent:
            book.open.pop(oc.command_id, None)
            book.forget(oc)
        if book.overlays.failed_repeats[DEAD]:
            holds.append(float(book.overlays.failed_hold_s[DEAD]))
            until = float(book.overlays.failed_hold_until_s[DEAD])
            assert until == now + holds[-1]
            # held out until its end whatever the readings say
            later = dataclasses.replace(snap, card_last_seen_s=np.full(n, until - 1.0))
            assert book.overlays.failed_now(np.asarray(later.card_last_seen_s), until - 0.5)[DEAD]
            now = until
        else:
            now += TTL_S  # the first refusal: until a newer reading
    assert holds == [30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0] + [FAILED_HOLD_MAX_S] * 4
    assert FAILED_HOLD_MAX_S == 3600.0


def test_a_restarted_agent_keeps_the_hold_and_the_count(tmp_path: Path) -> None:
    """The repeats are journaled with the ``card_failed`` marks (``agent.resume.FailedCardsRecord``): an
    agent restarted during the card's 60-s hold (50-110 s) leaves it out until the hold ends, although
    its readings show it alive, and its next refusal holds it 120 s. Without them the restarted agent
    sent it its setting at once and counted from a first refusal again."""
    s = _Site(_stale_dead_card())
    s.run(75.0)
    assert s.book.overlays.failed_repeat_holds() == {DEAD: (2, 110.0, 60.0)}
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    FailedCardsRecord(journal, s.site).save(s.book, s.state.snapshot())
    journal.close()

    s.book = CommandBook(s.site, s.codec, ControlConfig(command_ttl_s=TTL_S))  # restarted
    journal = Journal(path)
    load_journal(journal, Controller(s.site), TwinState(s.site), s.book)
    journal.close()
    before = len(s.refused)
    s.run(109.0)
    assert s.refused[before:] == [] and s.others_commanded()
    s.run(111.0)
    assert s.refused[before:] == [(110.0, (DEAD - 16,))] * 2
    assert s.book.overlays.failed_repeat_holds() == {DEAD: (3, 230.0, 120.0)}


def test_a_refusal_of_a_command_issued_during_a_repeats_hold_is_no_further_repeat() -> None:
    """A repeat is a refusal of a command issued after a decision found the card's mark cleared
    (``Overlays.failed_now``). While a repeat's hold is in force a decision counts the card failed
    whatever its readings say: it finds no mark cleared, and a command it sends with the card (one
    that covers the whole host) refused ``card_failed`` is no further repeat; the hold stays as given."""
    overlays = Overlays(small_site(racks=2, xy=(4, 4)))
    card = np.asarray([DEAD], dtype=np.int64)
    seen = np.zeros(32)
    overlays.mark_failed(card, 10.0, 5.0, 10.0, TTL_S)  # the first refusal: a mark
    seen[DEAD] = 20.0
    assert not overlays.failed_now(seen, 20.0)[DEAD]  # a reading cleared it
    overlays.mark_failed(card, 25.0, 22.0, 25.0, TTL_S)  # refused again: a repeat, held out 30 s
    assert (int(overlays.failed_repeats[DEAD]), overlays.failed_hold_until_s[DEAD]) == (1, 55.0)
    seen[DEAD] = 30.0
    assert overlays.failed_now(seen, 30.0)[DEAD]  # read alive, but held
    overlays.mark_failed(card, 40.0, 35.0, 40.0, TTL_S)  # a command issued during the hold, refused
    assert (int(overlays.failed_repeats[DEAD]), overlays.failed_hold_until_s[DEAD]) == (1, 55.0)
