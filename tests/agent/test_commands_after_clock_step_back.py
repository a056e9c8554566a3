"""The agent's open commands after the site clock stepped back (a simulator restarted 760 s back, a
site's time source corrected): what they set, what they hold and whether they go out again.

A command is stamped with its issue time and an absolute expiry on the site's clock
(docs/protocol.md, "Which commands a rack applies"): after the site's clock went back D seconds, one
stamped on the old timeline is more than ``wire.MAX_ISSUE_AHEAD_S`` ahead of every rack's clock
(refused ``issued_ahead``), and its expiry lies D seconds further than its life. Left open, it held
what it set (a card's level, a placement on its way, the set-point) for D + ``command_ttl_s``: the
decisions saw a level the restarted racks did not have, and commanded nothing. As the controller's
own holds (``Controller.clock_went_back``), what is open on the old timeline lasts no longer than it
can from the new now: a command no rack accepts is closed at once, expired (journaled so), and the
next decision commands what it wants, stamped on the new timeline; a command a rack still accepts (a
small step back) stays open, its retries due from now."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_helpers import belief, example_site, job
from test_publish import decision_like

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from agent.clock import SiteClock
from agent.config import ControlConfig
from agent.decision import Decision, PlacementOrder
from agent.journal import Journal, JournalError
from agent.mqtt_options import MqttOptions
from agent.publish import CommandBook, OpenCommand, Publisher, new_commands
from sim.commands import CommandHandler
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent

NOW = 100_000.0
STEP_S = 760.0  # a simulator restarted 760 s back
TTL_S = 30.0


@pytest.fixture(scope="module")
def scene() -> tuple[SiteSpec, StateSnapshot]:
    site = example_site()
    _plant, state = belief(site, [job("a", 64), job("b", 64)], 5)
    return site, state.snapshot()


def decision(snap: StateSnapshot, **changes: Any) -> Decision:
    """A decision that keeps every card as ``snap`` reports it (and its set-point), at this file's NOW;
    ``changes`` replace fields."""
    return decision_like(snap, **{"time_s": NOW, **changes})


def slower_cards_0_to_7(snap: StateSnapshot, level: int = 3) -> Decision:
    lvl = np.asarray(snap.card_level).copy()
    assert (lvl[0:8] != level).all()
    lvl[0:8] = level
    return decision(snap, card_level=lvl)


def book_for(site: SiteSpec, **control: Any) -> tuple[wire.Codec, CommandBook]:
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    return codec, CommandBook(site, codec, ControlConfig(command_ttl_s=TTL_S, **control))


def decoded(codec: wire.Codec, oc: OpenCommand) -> Any:
    return codec.decode(oc.topic, oc.payload)


def restarted_rack(site: SiteSpec, codec: wire.Codec, clock_s: float) -> CommandHandler:
    """A rack as a freshly started simulator has it: every card at the initial level, its clock at ``clock_s``."""
    plant = Plant(site, [], config=PlantConfig(seed=1))
    return CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: clock_s)


def answer(rack: CommandHandler, codec: wire.Codec, oc: OpenCommand) -> wire.Acknowledgement:
    ack = codec.decode(*next((o.topic, o.payload) for o in rack.handle(oc.topic, oc.payload) if not o.retain))
    assert isinstance(ack, wire.Acknowledgement)
    return ack


def test_after_a_step_back_a_card_level_left_unanswered_is_commanded_again_on_the_new_timeline(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Cards 0..7 were ordered to level 3 at NOW, unanswered (the simulator restarted). The site's
    clock restarts 760 s back, the restarted racks report the cards at their initial level, and the
    next decision still wants level 3: it commands it again, stamped on the new timeline, and the
    restarted rack applies it. The old command is closed (expired), never sent again: a rack on the
    new timeline refuses it (``issued_ahead``). Before, its expiry (NOW + 30) held the level as
    commanded until the new clock got there: no command for ~790 site s."""
    site, snap = scene
    codec, book = book_for(site)
    applied = np.full(site.n_cards, -1)
    (old,) = book.commands(slower_cards_0_to_7(snap), snap, applied, NOW)
    new_now = NOW - STEP_S
    rack = restarted_rack(site, codec, new_now)
    # what sending it again would do
    assert wire.reason_code(answer(rack, codec, old).reason) == wire.AckReason.ISSUED_AHEAD

    # the decision right after the step back (before the publisher's next step)
    (again,) = book.commands(slower_cards_0_to_7(snap), snap, applied, new_now)
    msg = decoded(codec, again)
    assert isinstance(msg, wire.RackCommand) and msg.cards == tuple(range(8)) and msg.setting.dvfs_level == 3
    assert msg.ts_s == new_now and msg.expires_s == new_now + TTL_S
    ack = answer(rack, codec, again)
    assert ack.result is wire.AckResult.APPLIED, ack.reason
    assert rack.level[0:8].tolist() == [3] * 8
    # the old one is closed, as expired, though its own expiry is still ahead: not open, not re-sent
    assert old.command_id not in book.open and again.command_id in book.open
    assert [oc.command_id for oc in book.expire(new_now + 0.25)] == [old.command_id]
    assert book.expire(new_now + 0.5) == []


def test_after_a_step_back_the_publisher_closes_left_behind_commands_before_it_sends_anything(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """The publisher's step (``CommandBook.expire``) closes them too when no decision came first;
    what they set counts as what the racks report again."""
    site, snap = scene
    _codec, book = book_for(site)
    applied = np.full(site.n_cards, -1)
    (old,) = book.commands(slower_cards_0_to_7(snap), snap, applied, NOW)
    new_now = NOW - STEP_S
    assert [oc.command_id for oc in book.expire(new_now)] == [old.command_id] and not book.open
    reported = np.zeros(site.n_cards)
    assert (book.overlays.have(old.kind, reported, new_now)[0:8] == 0).all()


def test_after_a_step_back_a_placement_left_unanswered_is_sent_again_at_once(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A placement sent at NOW, unanswered; the clock restarts 760 s back and the next decision
    places the job again: a new scheduler command goes (before: the old one's ``placing`` entry,
    until NOW + 30, skipped the job for ~790 site s, while the controller's own placement in flight
    lasted its 30 s from the new now)."""
    site, snap = scene
    codec, book = book_for(site)
    applied = np.full(site.n_cards, -1)
    place = decision(snap, placements=(PlacementOrder("q", (200, 201, 202, 203)),))
    (old,) = book.commands(place, snap, applied, NOW)
    assert isinstance(decoded(codec, old), wire.SchedulerCommand)
    assert book.commands(place, snap, applied, NOW + 5.0) == []  # on its way: not sent twice
    new_now = NOW - STEP_S
    (again,) = book.commands(place, snap, applied, new_now)
    msg = decoded(codec, again)
    assert isinstance(msg, wire.SchedulerCommand) and msg.job_id == "q" and msg.ts_s == new_now
    assert book.overlays.placing["q"][0] == new_now + TTL_S


def test_after_a_step_back_the_set_point_left_unanswered_is_commanded_again(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    site, snap = scene
    assert snap.facility is not None
    codec, book = book_for(site)
    applied = np.full(site.n_cards, -1)
    warmer = decision(snap, supply_temp_c=snap.facility.supply_setpoint_c + 2.0)
    (old,) = book.commands(warmer, snap, applied, NOW)
    assert isinstance(decoded(codec, old), wire.FacilityCommand)
    (again,) = book.commands(warmer, snap, applied, NOW - STEP_S)
    msg = decoded(codec, again)
    assert isinstance(msg, wire.FacilityCommand) and msg.ts_s == NOW - STEP_S


def test_a_setting_refused_as_issued_ahead_by_a_restarted_rack_is_sent_again_once_the_clock_followed(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """The simulator restarted 760 s back; until the agent's clock follows (2 + 1 wall s of messages
    on the new timeline), its decisions are stamped on the old one, and the restarted rack refuses
    them as ``issued_ahead``. Once the clock stepped back, the next decision sends the setting again,
    stamped on the new timeline, and the rack applies it. Before, the refusal held the cards back
    ``command_ttl_s`` from the refusal on the old timeline: ~790 site s without a level for them
    (seen with mosquitto: no command reached the restarted racks in the 120 s it ran)."""
    site, snap = scene
    codec, book = book_for(site)
    applied = np.full(site.n_cards, -1)
    new_now = NOW - STEP_S
    rack = restarted_rack(site, codec, new_now)
    (cmd,) = book.commands(slower_cards_0_to_7(snap), snap, applied, NOW)
    refusal = answer(rack, codec, cmd)
    assert wire.reason_code(refusal.reason) == wire.AckReason.ISSUED_AHEAD
    assert book.on_ack(refusal, NOW + 1.0) is cmd
    assert book.commands(slower_cards_0_to_7(snap), snap, applied, NOW + 5.0) == []  # held back, as any refusal
    (again,) = book.commands(slower_cards_0_to_7(snap), snap, applied, new_now + 5.0)  # the clock followed
    assert decoded(codec, again).ts_s == new_now + 5.0
    ack = answer(rack, codec, again)
    assert ack.result is wire.AckResult.APPLIED, ack.reason
    assert rack.level[0:8].tolist() == [3] * 8


def test_after_a_small_step_back_a_refused_setting_is_held_back_at_most_its_time_from_the_new_now(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A rack refused the level of cards 0..7 at NOW: they get none for ``command_ttl_s`` (30 s). The
    agent's clock, which ran ahead of a simulator at 20x, steps back 45 s (within the 200 site s a
    rack accepts ahead: the refusal stands): the hold lasts at most 30 s from the new now (before:
    until NOW + 30, 75 s from it)."""
    site, snap = scene
    codec, book = book_for(site, time_scale=1 / 20)
    applied = np.full(site.n_cards, -1)
    (cmd,) = book.commands(slower_cards_0_to_7(snap), snap, applied, NOW)
    msg = decoded(codec, cmd)
    refusal = wire.Acknowledgement(msg.rack, msg.command_id, wire.AckResult.REJECTED, NOW, 1, "sim", "out_of_range")
    assert book.on_ack(refusal, NOW) is cmd
    assert book.commands(slower_cards_0_to_7(snap), snap, applied, NOW + 10.0) == []  # held back
    back = NOW - 45.0
    assert book.commands(slower_cards_0_to_7(snap), snap, applied, back + 10.0) == []  # held: 30 s from now
    (again,) = book.commands(slower_cards_0_to_7(snap), snap, applied, back + 10.0 + TTL_S)
    assert decoded(codec, again).cards == tuple(range(8))


def test_a_small_step_back_a_rack_still_accepts_keeps_the_open_command(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """The agent's clock ran ahead of a simulator starved of CPU and steps back 45 s at 20x (a rack
    accepts ten wall seconds, 200 site s, ahead): the open command is not closed (the rack applies
    it, and its ack closes it), not repeated by the next decision, and its retry is due a retry
    interval from the new now (not once the clock is back at its last send)."""
    site, snap = scene
    codec, book = book_for(site, time_scale=1 / 20)
    applied = np.full(site.n_cards, -1)
    (cmd,) = book.commands(slower_cards_0_to_7(snap), snap, applied, NOW)
    cmd.attempts, cmd.first_sent_s, cmd.last_sent_s = 2, NOW, NOW + 10.0
    back = NOW - 45.0
    assert book.commands(slower_cards_0_to_7(snap), snap, applied, back) == []
    assert book.expire(back) == [] and cmd.command_id in book.open
    assert (cmd.first_sent_s, cmd.last_sent_s) == (back, back)
    rack = CommandHandler(Plant(site, [], config=PlantConfig(seed=1)), codec, wire.Sequencer("sim"), lambda: back,
                          max_issue_ahead_s=200.0)  # fmt: skip
    assert answer(rack, codec, cmd).result is wire.AckResult.APPLIED


def test_a_restarted_agent_does_not_resend_journaled_commands_of_the_old_timeline(
    scene: tuple[SiteSpec, StateSnapshot], tmp_path: Path
) -> None:
    """An agent restarted after the site's clock went back re-opens its journal's open commands
    (``CommandBook.resume``: the journal still has them open, their expiries ahead of the new now):
    those stamped on the old timeline are closed at the first step, before anything is sent."""
    site, snap = scene
    _codec, book = book_for(site)
    applied = np.full(site.n_cards, -1)
    (cmd,) = book.commands(slower_cards_0_to_7(snap), snap, applied, NOW)
    journal = Journal(tmp_path / "journal.sqlite")
    journal.record_decision(1, NOW, "enforce", "optimal", 0.0, {}, new_commands([cmd]))
    new_now = NOW - STEP_S
    _codec, restarted = book_for(site)
    rows = [(c.command_id, c.target, c.topic, c.payload, c.issued_s, c.expires_s, c.attempts)
            for c in journal.unacked(new_now)]  # fmt: skip
    (resumed,) = restarted.resume(rows)
    assert [oc.command_id for oc in restarted.expire(new_now)] == [resumed.command_id] and not restarted.open
    journal.close()


def stepped_clock(start_s: float) -> tuple[SiteClock, list[float]]:
    """A site clock on a wall clock the test moves (``wall[0]``), at ``start_s``."""
    wall = [0.0]
    clock = SiteClock(1.0, infer=False, ahead_tolerance_s=3600.0, wall=lambda: wall[0])
    clock.observe(start_s)
    return clock, wall


def step_back(clock: SiteClock, wall: list[float], to_s: float) -> None:
    """Messages behind the clock's timeline after it fell silent (2 s), advancing for 1 s: the clock steps back."""
    wall[0] += 3.0
    clock.observe(to_s)
    wall[0] += 1.1
    clock.observe(to_s + 1.1)
    assert clock.corrections == 1


def journaled_level_command(
    tmp_path: Path,
) -> tuple[ControlConfig, CommandBook, SiteClock, list[float], Journal, OpenCommand]:
    """A level command to cards 0-1 of r0, stamped NOW and journaled (a decision's) in ``tmp_path``, open
    in a command book of the example site, with a site clock at NOW on a wall clock the test moves."""
    site = example_site()
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    control = ControlConfig(command_ttl_s=TTL_S)
    book = CommandBook(site, codec, control)
    clock, wall = stepped_clock(NOW)
    journal = Journal(tmp_path / "journal.sqlite")
    cmd = wire.RackCommand("r0", (0, 1), wire.CardSetting.dvfs(3), uuid.uuid4(), NOW + TTL_S, NOW, 1, "agent")
    out = codec.outgoing(cmd)
    (oc,) = book.resume([(str(cmd.command_id), "r0", out.topic, out.payload, NOW, NOW + TTL_S, 0)])
    journal.record_decision(1, NOW, "enforce", "optimal", 0.0, {}, new_commands([oc]))
    return control, book, clock, wall, journal, oc


async def test_the_publisher_never_resends_a_command_the_site_clock_left_behind(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A command sent at TS, unanswered; the site's clock steps back 760 s (``SiteClock``). At its
    next step the publisher closes it, as expired (counted, reported ``unacked``, journaled
    ``expired``), and sends it no more: not at once, not a retry interval later. Before, it stayed
    open and unsent until the clock got back to TS + 10 (its retry) and was then sent with its old
    stamp, for a rack to refuse as issued ahead."""
    control, book, clock, wall, journal, oc = journaled_level_command(tmp_path)
    sent: list[bytes] = []
    closed: list[str] = []
    async with Bus(mosquitto.options(), name="agent") as bus:
        await bus.wait_connected(10)
        publisher = Publisher(
            bus, book, journal, clock, control,
            on_sent=lambda o, _r: sent.append(o.payload), on_closed=lambda o, why: closed.append(why),
        )  # fmt: skip
        publisher.submit([oc])
        await publisher.step()
        assert oc.attempts == 1
        step_back(clock, wall, NOW - STEP_S)
        await publisher.step()
        assert closed == ["unacked"] and publisher.stats.unacked_expired == 1 and not book.open
        for _ in range(3):  # a retry interval and more on the new timeline
            wall[0] += publisher.retry_after_s
            clock.observe(NOW - STEP_S + wall[0])
            await publisher.step()
    assert sent == [oc.payload] and oc.attempts == 1
    assert publisher.acks_missing == {}  # closed by the agent, not an ack gone missing
    row = journal.command(oc.command_id)
    assert row is not None and row.state == "expired"
    journal.close()


def test_a_command_stamped_within_what_a_rack_accepts_ahead_is_kept() -> None:
    """The rule's edge, from docs/protocol.md: a rack applies a command stamped up to
    ``wire.MAX_ISSUE_AHEAD_S`` (10 s at 1x) ahead of its clock; the book keeps such a command open
    and closes one stamped further ahead."""
    site = example_site()
    _codec, book = book_for(site)
    assert book.accept_ahead_s() == wire.MAX_ISSUE_AHEAD_S
    kept = OpenCommand("kept", "r0", "t", b"", NOW, NOW + TTL_S, stamp_s=NOW)
    left = OpenCommand("left", "r0", "t", b"", NOW, NOW + TTL_S, stamp_s=NOW + 0.5)
    book.open = {"kept": kept, "left": left}
    gone = book.expire(NOW - wire.MAX_ISSUE_AHEAD_S)
    assert [oc.command_id for oc in gone] == ["left"] and list(book.open) == ["kept"]
    assert math.isnan(OpenCommand("x", "r0", "t", b"", NOW, NOW + 1.0).stamp_s)
    assert OpenCommand("x", "r0", "t", b"", NOW, NOW + 1.0).ts_s == NOW


class _Link:
    """A broker link that takes every publish at once (what the publisher sends)."""

    options = MqttOptions(port=1)

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool, timeout_s: float) -> None:
        self.sent.append(payload)


async def test_a_left_behind_command_whose_expiry_write_failed_is_journaled_expired_at_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal write that closes the commands the site clock left behind fails once (a full disk,
    a locked file). The journal's own expiry never closes them (their expiries lie on the old
    timeline, 760 s ahead), so the publisher writes them again at its next step: the journal does not
    keep 'sent' a command no rack applies (a restarted agent would take it up again). Before, the
    write was lost and the row stayed 'sent' until the clock got back to its expiry."""
    control, book, clock, wall, journal, oc = journaled_level_command(tmp_path)
    publisher = Publisher(_Link(), book, journal, clock, control)
    publisher.journal_retry_s = 0.0  # the next step writes again
    publisher.submit([oc])
    await publisher.step()
    step_back(clock, wall, NOW - STEP_S)
    real = journal.expire_commands
    failures = [0]

    def fails_once(ids: Any) -> None:
        if not failures[0]:
            failures[0] += 1
            raise JournalError("disk full")
        real(ids)

    monkeypatch.setattr(journal, "expire_commands", fails_once)
    await publisher.step()
    assert not book.open and failures[0] == 1 and set(publisher.journal_errors) == {"expired at a clock step back"}
    row = journal.command(oc.command_id)
    assert row is not None and row.state == "sent"
    await publisher.step()
    row = journal.command(oc.command_id)
    assert row is not None and row.state == "expired"
    assert publisher.journal_errors == {}
    journal.close()
