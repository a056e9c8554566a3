"""A scheduler's ``place`` refused because cards of it have failed names them, per rack (wire
``placement_card_failed_reason`` / ``failed_cards_by_rack``), as a rack names a card command's dead
cards (docs/protocol.md, "Which commands a rack applies").

What users rely on: the agent learns from the refusal which cards are dead, so that its next
decision (made at once: the failure requeues a job) does not place the job onto the same dead card
again while the rack's telemetry does not show the failure yet.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from agent import wire
from agent.command_overlays import Overlays
from agent.config import ControlConfig
from agent.publish import CommandBook, OpenCommand
from sim.commands import CommandHandler
from twin.plant import CardFailure, Plant, PlantConfig
from twin.spec import load_site
from twin.workload import JobSpec

pytestmark = pytest.mark.unit

TS = 1_800_000_000.0
SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"


def test_a_placement_refusal_names_its_failed_cards_per_rack_and_reads_back() -> None:
    reason = wire.placement_card_failed_reason({"r0": [5], "r1": [2, 7]})
    assert wire.reason_code(reason) == wire.AckReason.CARD_FAILED
    assert reason.startswith("card_failed: card 5 of rack r0 has failed; cards 2, 7 of rack r1 have failed")
    assert wire.failed_cards_by_rack(reason) == {"r0": (5,), "r1": (2, 7)}
    # a rack command's reason is one such clause; other reasons name none
    assert wire.failed_cards_by_rack(wire.card_failed_reason("r2", [4, 36])) == {"r2": (4, 36)}
    assert wire.failed_cards_by_rack("place_job: card 70 is busy") == {}
    assert wire.failed_cards_by_rack("superseded: card 3 of rack r1 has failed") == {}
    # rack names as the wire allows them (IDENT_PATTERN: letters, digits, _ . : @ -)
    odd = {"hall-2.row:A@7": [0, 63], "x_1": [9]}
    assert wire.failed_cards_by_rack(wire.placement_card_failed_reason(odd)) == {"hall-2.row:A@7": (0, 63), "x_1": (9,)}


def test_a_placement_refusal_naming_many_cards_stays_within_the_wire_bound_and_cuts_no_number() -> None:
    """A placement over 8 racks whose 512 cards all failed: the reason is at most 1,024 characters
    (wire.MAX_TEXT_CHARS); it names whole racks first, then the first cards of the next with ``and N
    more``; every card read back is one of the failed, each rack's read back in order, and no rack
    after the cut one is named. A reason cut anywhere (a sender that cuts its text) names no card
    that is not in it whole."""
    dead = {f"r{r}": list(range(64)) for r in range(8)}
    reason = wire.placement_card_failed_reason(dead)
    assert len(reason) <= wire.MAX_TEXT_CHARS and wire.reason_code(reason) == wire.AckReason.CARD_FAILED
    named = wire.failed_cards_by_rack(reason)
    racks = list(named)
    assert racks == [f"r{r}" for r in range(len(racks))] and len(racks) >= 2
    for rack in racks[:-1]:
        assert named[rack] == tuple(range(64))
    last = named[racks[-1]]
    assert 0 < len(last) < 64 and last == tuple(range(len(last)))
    assert f"and {64 - len(last)} more of rack {racks[-1]} have failed" in reason
    for cut in range(len(reason)):
        got = wire.failed_cards_by_rack(reason[:cut])
        assert list(got) == racks[: len(got)]
        for rack, cards in got.items():
            assert cards == named[rack][: len(cards)]
        if got:  # a clause is read only whole: the last rack read is named completely up to the cut
            tail = list(got)[-1]
            assert got[tail] == named[tail]


def test_the_simulated_scheduler_refuses_a_placement_onto_failed_cards_naming_each() -> None:
    """The simulator's scheduler (sim.commands.CommandHandler) refuses ``place`` whole when cards of it
    have failed, as ``card_failed`` naming every failed card of it per rack, rack-local; a busy card
    is refused in the plant's words; the job then goes onto healthy free cards."""
    site = load_site(SITE)
    cpr = site.cards_per_rack
    faults = [CardFailure(card=3, at_s=0.0), CardFailure(card=cpr + 5, at_s=0.0), CardFailure(card=cpr + 6, at_s=0.0)]
    job = JobSpec(job_id="q", n_cards=8, work_steps=1e6, step_time_s=1.0, compute_share=0.9)
    busy = JobSpec(job_id="b", n_cards=8, work_steps=1e6, step_time_s=1.0, compute_share=0.9)
    plant = Plant(site, [job, busy], faults, config=PlantConfig(seed=1, placement="external"))
    plant.place_job("b", list(range(2 * cpr, 2 * cpr + 8)))
    plant.step(1.0)
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    handler = CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: TS)

    def place(cards: dict[str, tuple[int, ...]], seq: int) -> wire.Acknowledgement:
        cmd = wire.SchedulerCommand("q", cards, uuid.uuid4(), TS + 30.0, TS, seq, "agent")
        (out,) = handler.handle(codec.topics.scheduler_cmd, wire.encode(cmd))
        ack = codec.decode(out.topic, out.payload)
        assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cmd.command_id
        return ack

    ack = place({"r0": (0, 1, 2, 3), "r1": (4, 5, 6, 7)}, 0)
    assert ack.result is wire.AckResult.REJECTED and wire.reason_code(ack.reason) == wire.AckReason.CARD_FAILED
    assert wire.failed_cards_by_rack(ack.reason) == {"r0": (3,), "r1": (5, 6)}, ack.reason
    # failed cards of one rack only: one clause
    ack = place({"r1": (0, 1, 2, 3, 4, 5, 6, 7)}, 1)
    assert wire.failed_cards_by_rack(ack.reason) == {"r1": (5, 6)}, ack.reason
    # a busy card (no failed one): refused, but not as card_failed
    ack = place({"r2": (4, 5, 6, 7, 8, 9, 10, 11)}, 2)
    assert ack.result is wire.AckResult.REJECTED and wire.reason_code(ack.reason) != wire.AckReason.CARD_FAILED
    assert wire.failed_cards_by_rack(ack.reason) == {}
    assert place({"r0": (8, 9, 10, 11), "r1": (8, 9, 10, 11)}, 3).result is wire.AckResult.APPLIED
    assert handler.counts.rejection_reasons == {"scheduler.place": 3}


def test_a_card_failed_reason_without_detail_names_no_card() -> None:
    """A bare ``card_failed`` (a rack bridge that sends the code alone) names no card; reading it
    raised IndexError before, in the agent's ack handler (``Overlays.note_failed``)."""
    assert wire.failed_cards_of("card_failed") == () == wire.failed_cards_of(" card_failed ")
    assert wire.failed_cards_by_rack("card_failed") == {}


def test_a_placement_refusal_marks_only_cards_of_the_placement_the_site_has() -> None:
    """The agent reads a scheduler's ``card_failed`` refusal as free text from the wire: a rack the
    site does not have (r99) and a card number outside a rack (64 of r0: 64 cards per rack) name no
    card of ours (not card 0 of r1, which is site card 64), and a card not in the placement (card 9
    of r1) is not marked either; card 3 of r0 (site 3) and card 5 of r1 (site 69) are."""
    site = load_site(SITE)
    assert site.cards_per_rack == 64
    overlays = Overlays(site)
    reason = wire.placement_card_failed_reason({"r99": [2], "r0": [64, 3], "r1": [5, 9]})
    ack = wire.Acknowledgement(wire.SCHEDULER, uuid.uuid4(), wire.AckResult.REJECTED, TS, 0, "sim", reason)
    overlays.note_failed_placement(np.array([3, 64, 69], dtype=np.int64), ack, TS - 1.0, TS, 30.0)
    assert np.flatnonzero(np.isfinite(overlays.failed_by_ack_s)).tolist() == [3, 69]


def test_the_cards_of_a_placement_the_agent_sent_are_read_back_site_wide() -> None:
    """``CommandBook.placement_of`` (what a refused placement held: ``Controller.placement_refused``):
    cards 5 and 0 of r1 and 3 of r0 are site cards 64, 69 and 3, sorted; a scheduler command naming a
    rack the site does not have, or a card outside a rack, is not one of ours: None."""
    site = load_site(SITE)
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    book = CommandBook(site, codec, ControlConfig())

    def sent(cards: dict[str, tuple[int, ...]], layout: wire.SiteLayout = codec.layout) -> OpenCommand:
        cmd = wire.SchedulerCommand("j", cards, uuid.uuid4(), TS + 30.0, TS, 0, "agent")
        out = wire.Codec(layout).outgoing(cmd)
        return OpenCommand(str(cmd.command_id), wire.SCHEDULER, out.topic, out.payload, TS, TS + 30.0)

    assert book.placement_of(sent({"r1": (5, 0), "r0": (3,)})) == ("j", (3, 64, 69))
    wider = wire.SiteLayout("site1", (*codec.layout.racks, "r99"), cards_per_rack=128)
    assert book.placement_of(sent({"r99": (0,)}, wider)) is None
    assert book.placement_of(sent({"r0": (64,)}, wider)) is None


def test_the_simulated_scheduler_refuses_a_placement_on_cards_the_site_does_not_have() -> None:
    """A placement naming card 64 of r0 (64 cards per rack) or a rack r99 is refused, and the job is
    placed nowhere: not on card 0 of r1 (site card 64)."""
    site = load_site(SITE)
    job = JobSpec(job_id="q", n_cards=1, work_steps=1e6, step_time_s=1.0, compute_share=0.9)
    plant = Plant(site, [job], [], config=PlantConfig(seed=1, placement="external"))
    codec = wire.Codec(wire.SiteLayout.from_spec(site, "site1"))
    handler = CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: TS)
    wider = wire.Codec(wire.SiteLayout("site1", (*codec.layout.racks, "r99"), cards_per_rack=128))
    for seq, cards in enumerate([{"r0": (64,)}, {"r99": (0,)}]):
        cmd = wire.SchedulerCommand("q", cards, uuid.uuid4(), TS + 30.0, TS, seq, "agent")
        (out,) = handler.handle(codec.topics.scheduler_cmd, wider.outgoing(cmd).payload)
        ack = codec.decode(out.topic, out.payload)
        assert isinstance(ack, wire.Acknowledgement) and ack.command_id == cmd.command_id
        assert ack.result is wire.AckResult.REJECTED
    assert plant.job_cards("q").size == 0 and plant.free_cards().size == site.n_cards
