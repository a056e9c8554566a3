"""Decisions -> commands: only what differs, lowering first, not repeated while open, a refusal not
retried every period, expiry closes, advice registers nothing; and the ``racktwin agent`` command."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from agent_helpers import belief, example_site, job
from guard_helpers import proposal

from agent import wire
from agent.cli import main
from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision, PlacementOrder
from agent.journal import Journal
from agent.publish import CommandBook, OpenCommand
from agent.resume import FailedCardsRecord, load_journal
from sim.commands import CommandHandler
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec
from twin.state import StateSnapshot, TwinState

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = 1000.0


def decision_like(snap: StateSnapshot, **changes: Any) -> Decision:
    """A decision for the example site that keeps every card as ``snap`` reports it (and its set-point); ``changes``
    replace fields."""
    fields: dict[str, Any] = dict(
        time_s=NOW,
        card_low_power=np.asarray(snap.card_low_power).copy(),
        card_power_limit_w=np.asarray(snap.card_power_limit_w).copy(),
        card_busy=snap.card_job >= 0,
        supply_temp_c=snap.facility.supply_setpoint_c if snap.facility else 30.0,
    )
    fields.update(changes)
    return proposal(example_site(), np.asarray(snap.card_level), **fields)


def rack_command(codec: wire.Codec, cmd: OpenCommand) -> wire.RackCommand:
    """``cmd`` decoded, as the rack command it must be (narrows the codec's message-or-rejection for the checker)."""
    msg = codec.decode(cmd.topic, cmd.payload)
    assert isinstance(msg, wire.RackCommand), msg
    return msg


@pytest.fixture(scope="module")
def scene() -> tuple[SiteSpec, StateSnapshot]:
    site = example_site()
    _plant, state = belief(site, [job("a", 64), job("b", 64)], 5)
    return site, state.snapshot()


def test_only_differences_are_commanded_lowering_first_and_not_twice(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(512, -1)
    assert book.commands(decision_like(snap), snap, applied, NOW) == []  # nothing differs
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:64] = 3  # slower (rack r0)
    lp = np.asarray(snap.card_low_power).copy()
    lp[200:210] = True  # idle cards of r3 to sleep
    lim = np.asarray(snap.card_power_limit_w).copy()
    lim[64:128] = 600.0
    d = decision_like(snap, card_level=lvl, card_low_power=lp, card_power_limit_w=lim, supply_temp_c=35.0)
    cmds = book.commands(d, snap, applied, NOW)
    decoded = [codec.decode(c.topic, c.payload) for c in cmds]
    kinds = [(m.rack, m.setting.action.value) if isinstance(m, wire.RackCommand) else type(m).__name__ for m in decoded]
    assert kinds == [
        ("r0", "set_dvfs_level"),
        ("r1", "set_power_limit"),
        ("r3", "low_power_idle"),
        "FacilityCommand",
    ]
    for m in decoded:
        assert not isinstance(m, wire.Rejection)
        assert isinstance(m, wire.RackCommand | wire.FacilityCommand)  # narrows: the kinds above
        assert m.expires_s == NOW + 30.0 and m.ts_s == NOW
    first = decoded[0]
    assert isinstance(first, wire.RackCommand)  # narrows: the kinds above
    assert first.cards == tuple(range(64)) and first.setting.dvfs_level == 3
    # open commands are not repeated while telemetry catches up
    assert book.commands(d, snap, applied, NOW + 1.0) == []
    # a refused setting is not retried within the ttl; an expired command frees the next decision
    sleep = cmds[2]
    book.on_ack(
        wire.Acknowledgement("r3", uuid.UUID(sleep.command_id), wire.AckResult.REJECTED, NOW, 0, "sim", "busy"), NOW
    )
    assert book.commands(d, snap, applied, NOW + 2.0) == []
    gone = book.expire(NOW + 31.0)
    assert {g.command_id for g in gone} == {cmds[0].command_id, cmds[1].command_id, cmds[3].command_id}
    again = book.commands(d, snap, applied, NOW + 31.0)
    assert len(again) == 4  # levels, limits, set-point, and the sleep after its back-off


def test_a_refusal_explained_by_a_failed_card_does_not_hold_back_the_other_cards(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A card that fails after the reading a decision used makes its rack refuse the whole command;
    once telemetry shows it failed, the other cards get the setting at the next decision, not after
    the backoff. A refusal no failure explains stays held."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(512, -1)
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:64] = 3  # rack r0 slower
    lvl[64:128] = 3  # rack r1 slower
    d = decision_like(snap, card_level=lvl)
    first = book.commands(d, snap, applied, NOW)
    assert [c.target for c in first] == ["r0", "r1"]
    for c in first:
        ack = wire.Acknowledgement(c.target, uuid.UUID(c.command_id), wire.AckResult.REJECTED, NOW, 0, "sim", "x")
        book.on_ack(ack, NOW)
    assert book.commands(d, snap, applied, NOW + 2.0) == []  # both held
    failed = np.zeros(512, dtype=bool)
    failed[5] = True  # r0's card 5 reads failed now
    snap_failed = dataclasses.replace(snap, card_failed=failed)
    again = [rack_command(codec, c) for c in book.commands(d, snap_failed, applied, NOW + 4.0)]
    assert [(m.rack, m.cards) for m in again] == [
        ("r0", tuple(c for c in range(64) if c != 5))
    ]  # r1's refusal is not explained by a failure: still held
    assert book.commands(d, snap_failed, applied, NOW + 6.0) == []  # r0's new command is open
    assert [c.target for c in book.commands(d, snap_failed, applied, NOW + 31.0)] == ["r1"]


class _RackR1Slowed:
    """A book that has just sent rack r1 one command (every card one level slower), and its codec."""

    def __init__(self, scene: tuple[SiteSpec, StateSnapshot]) -> None:
        site, self.snap = scene
        self.codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
        self.book = CommandBook(site, self.codec, ControlConfig(command_ttl_s=30.0))
        self.applied = np.full(512, -1)
        lvl = np.asarray(self.snap.card_level).copy()
        lvl[64:128] = 3
        self.decision = decision_like(self.snap, card_level=lvl)
        (self.first,) = self.book.commands(self.decision, self.snap, self.applied, NOW)

    def sent(self, snap: StateSnapshot, now_s: float) -> list[tuple[str, tuple[int, ...]]]:
        """(rack, cards) of the commands the decision needs now."""
        out = []
        for c in self.book.commands(self.decision, snap, self.applied, now_s):
            m = self.codec.decode(c.topic, c.payload)
            assert isinstance(m, wire.RackCommand)
            out.append((m.rack, m.cards))
        return out


def test_a_refusal_that_names_the_failed_cards_frees_the_others_before_any_reading_shows_it(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A rack whose telemetry is silent shows no dead card; its ``card_failed`` refusal names it (wire
    card_failed_reason): the next decision's command leaves it out and the others get the setting at
    once. The card counts as failed until a reading of it at least as new as the refusal; one showing it alive
    (repaired) gives it the setting again. A refusal naming a card of another rack names nothing."""
    r1 = _RackR1Slowed(scene)
    snap, book = r1.snap, r1.book
    reason = wire.card_failed_reason("r1", [5, 9])
    assert wire.reason_code(reason) == wire.AckReason.CARD_FAILED and wire.failed_cards_of(reason) == (5, 9)
    ack = wire.Acknowledgement(
        "r1", uuid.UUID(r1.first.command_id), wire.AckResult.REJECTED, NOW + 1.0, 0, "sim", reason
    )
    book.on_ack(ack, NOW + 1.0)
    assert r1.sent(snap, NOW + 2.0) == [("r1", tuple(c for c in range(64) if c not in (5, 9)))]
    seen = np.asarray(snap.card_last_seen_s, dtype=np.float64).copy()
    seen[64 + 5] = NOW + 3.0  # a reading after the refusal: card 5 is alive (repaired); card 9 unseen
    assert r1.sent(dataclasses.replace(snap, card_last_seen_s=seen), NOW + 4.0) == [("r1", (5,))]
    assert wire.failed_cards_of("card_failed: the card is gone") == () == wire.failed_cards_of("x: card 3")
    assert wire.failed_cards_of("card_failed: card 99999999999999999999 of rack r1 has failed") == ()


def test_a_refusal_naming_more_failed_cards_than_an_ack_reason_holds_names_whole_numbers_only() -> None:
    """An ack's reason is at most 1,024 characters (wire.MAX_TEXT_CHARS): a refusal naming 256 failed
    cards of a rack lists the first that fit and "and N more", every number whole; a reason another
    sender cut inside its list names no card (cut at "2" of "255", it named a card 2 that had not been
    refused)."""
    dead = list(range(0, 512, 2))  # 256 cards of a 512-card rack
    reason = wire.card_failed_reason("r7", dead)
    named = wire.failed_cards_of(reason)
    assert len(reason) <= wire.MAX_TEXT_CHARS and wire.reason_code(reason) == wire.AckReason.CARD_FAILED
    assert 0 < len(named) < len(dead) and named == tuple(dead[: len(named)])
    assert f" and {len(dead) - len(named)} more of rack r7 have failed" in reason
    full = "card_failed: cards " + ", ".join(map(str, dead)) + " of rack r7 have failed"
    cut = full[: full.index(", 256") + 3]  # "..., 254, 2"
    assert wire.failed_cards_of(cut) == () and wire.failed_cards_of(full) == tuple(dead)
    assert wire.failed_cards_of(wire.card_failed_reason("r7", [3])) == (3,)


def test_a_card_failed_mark_outlives_a_restart_until_a_reading_shows_the_card(
    scene: tuple[SiteSpec, StateSnapshot], tmp_path: Path
) -> None:
    """The marks of ``card_failed`` refusals still in force are kept in the journal with each decision:
    a restarted agent sent a silent rack's caps to its dead card again, and the rack refused them
    once more before the mark was relearnt. After a restart the first command leaves the card out
    until a reading of it at least as new as the refusal; then the journal's record is emptied."""
    site, snap = scene
    path = tmp_path / "journal.sqlite"
    r1 = _RackR1Slowed(scene)
    journal = Journal(path)
    record = FailedCardsRecord(journal, site)
    record.save(r1.book, snap)
    assert json.loads(journal.get_meta("failed_cards") or "")["marks"] == {}
    reason = wire.card_failed_reason("r1", [5])
    ack = wire.Acknowledgement(
        "r1", uuid.UUID(r1.first.command_id), wire.AckResult.REJECTED, NOW + 1.0, 0, "sim", reason
    )
    r1.book.on_ack(ack, NOW + 1.0)
    record.save(r1.book, snap)  # the next decision's (r1 silent: no reading since)
    journal.close()

    journal = Journal(path)  # the agent restarted: a new book, the same decision, r1 still silent
    book = CommandBook(site, r1.codec, ControlConfig(command_ttl_s=30.0))
    load_journal(journal, Controller(site), TwinState(site), book)

    def sent(snap: StateSnapshot, now_s: float) -> list[tuple[str, tuple[int, ...]]]:
        msgs = [r1.codec.decode(c.topic, c.payload) for c in book.commands(r1.decision, snap, r1.applied, now_s)]
        return [(m.rack, m.cards) for m in cast(list[wire.RackCommand], msgs)]

    assert sent(snap, NOW + 60.0) == [("r1", tuple(c for c in range(64) if c != 5))]
    seen = np.asarray(snap.card_last_seen_s, dtype=np.float64).copy()
    seen[64 + 5] = NOW + 61.0  # a reading after the refusal: card 5 is alive (repaired)
    shown = dataclasses.replace(snap, card_last_seen_s=seen)
    assert sent(shown, NOW + 62.0) == [("r1", (5,))]
    FailedCardsRecord(journal, site).save(book, shown)
    assert json.loads(journal.get_meta("failed_cards") or "")["marks"] == {}
    journal.close()


@pytest.mark.parametrize("case", ["ack stamped an hour ahead", "clock stepped back", "card out of range"])
def test_a_failure_mark_never_outlives_a_reading_that_shows_the_card(
    scene: tuple[SiteSpec, StateSnapshot], case: str
) -> None:
    """A ``card_failed`` mark holds until a reading of the card newer than it. A rack clock an hour
    ahead (the belief refuses its readings stamped that far ahead, not its acks) must not hold a
    repaired card out for an hour; nor must a mark from before the site clock stepped back (the
    belief's last-seen times step back with it) hold a healthy card out until the new timeline
    reaches the old stamp: its rack, if at fail-safe, would run it uncapped. A named card outside
    the rack names nothing (and does not stop the agent: it raised OverflowError)."""
    r1 = _RackR1Slowed(scene)
    snap, book = r1.snap, r1.book
    stamp, reason, now = NOW + 1.0, wire.card_failed_reason("r1", [5]), NOW + 1.0
    if case == "ack stamped an hour ahead":
        stamp = NOW + 3600.0
    elif case == "card out of range":
        reason = "card_failed: cards 5, 99999999999999999999, 70 of rack r1 have failed"
    ack = wire.Acknowledgement("r1", uuid.UUID(r1.first.command_id), wire.AckResult.REJECTED, stamp, 0, "sim", reason)
    book.on_ack(ack, now)
    assert r1.sent(snap, NOW + 2.0) == [("r1", tuple(c for c in range(64) if c != 5))]
    seen = np.asarray(snap.card_last_seen_s, dtype=np.float64).copy()
    later = NOW + 10.0  # (the command of NOW + 2 is still open: the others need nothing)
    if case == "clock stepped back":
        later = NOW - 600.0  # the belief's times stepped back with the clock: a decision on the new timeline,
        r1.sent(dataclasses.replace(snap, card_last_seen_s=np.minimum(seen, later)), later)
        later += 1.0  # then a reading of the card
    seen[64 + 5] = later
    assert r1.sent(dataclasses.replace(snap, card_last_seen_s=seen), later + 1.0) == [("r1", (5,))]


def test_placements_and_advice(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig())
    applied = np.full(512, -1)
    lvl = np.asarray(snap.card_level).copy()
    lvl[:64] = 0
    lvl[64:128] = 7
    d = decision_like(snap, card_level=lvl, placements=(PlacementOrder("q", (62, 63, 64, 65)),))
    advice = book.advice(d, snap, applied, NOW)
    assert advice.placements[0].cards == {"r0": (62, 63), "r1": (0, 1)}
    assert advice.items and book.open == {}  # advice registers nothing
    assert len(book.commands(d, snap, applied, NOW)) == len(advice.items) + 1


def test_agent_check_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["agent", "--check-config", str(EXAMPLES / "agent.toml")]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "advice only" in out and "fail-safe" in out
    bad = tmp_path / "agent.toml"
    bad.write_text(f'site = "{EXAMPLES / "supernode-512.toml"}"\n[control]\nperiod_s = 10\ncommand_ttl_s = 5\n')
    assert main(["agent", "--config", str(bad), "--check-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "control.command_ttl_s" in err[0] and str(bad) in err[0]
    assert main(["agent"]) == 2
    assert "--config" in capsys.readouterr().err


def test_per_card_power_limits_are_one_command_per_rack_and_direction(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """The guard's die limits differ card by card (the demo: 64 distinct values on a rack); they go as
    one command per rack (per direction: lowering first), one value per card, not one per value."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig())
    applied = np.full(512, -1)
    lim = np.asarray(snap.card_power_limit_w).copy()
    lim[0:64] = np.floor(np.linspace(200.0, 285.0, 64))  # r0: 64 lower limits (whole watts, as the guard's)
    lim[70:74] = 450.0  # r1: one value
    cmds = book.commands(decision_like(snap, card_power_limit_w=lim), snap, applied, NOW)
    decoded = [rack_command(codec, c) for c in cmds]
    assert [(m.rack, m.setting.action.value) for m in decoded] == [
        ("r0", "set_power_limit"),
        ("r1", "set_power_limit"),
    ]
    r0, r1 = decoded
    assert r0.cards == tuple(range(64)) and r0.setting.limits_w(64) == tuple(lim[0:64])
    assert r1.cards == (6, 7, 8, 9) and r1.setting.power_limit_w == 450.0
    # the book remembers each card's value: nothing is repeated while they are open
    assert book.commands(decision_like(snap, card_power_limit_w=lim), snap, applied, NOW + 1.0) == []
    # some limits rise, others fall, in one rack: two commands, the lowering one first
    lim2 = lim.copy()
    lim2[0:10] = 200.0
    lim2[40:50] = 600.0
    cmds2 = book.commands(decision_like(snap, card_power_limit_w=lim2), snap, applied, NOW + 2.0)
    d2 = cast(list[wire.RackCommand], [codec.decode(c.topic, c.payload) for c in cmds2])
    assert [(m.rack, m.cards[0], len(m.cards)) for m in d2] == [("r0", 1, 9), ("r0", 40, 10)]
    assert d2[0].setting.power_limit_w == 200.0 and d2[1].setting.power_limit_w == 600.0


def test_pump_speeds_are_commanded_faster_first_slower_last_and_renewed(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    cfg = ControlConfig(command_ttl_s=30.0, pump_renew_s=20.0)
    book = CommandBook(site, codec, cfg)
    applied = np.full(512, -1)
    reported = np.ones(8)
    reported[5] = 0.5  # r5 runs slowed now
    snap5 = snap.__class__(**{**snap.__dict__, "rack_pump_speed_frac": reported})
    speed = np.ones(8)
    speed[2] = 0.5  # slower
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:64] = 3  # a slower level (lowers power)
    d = decision_like(snap5, card_level=lvl, rack_pump_speed_frac=speed)  # r5 back to full speed: faster
    msgs = cast(
        list[wire.RackCommand | wire.CduCommand],
        [codec.decode(c.topic, c.payload) for c in book.commands(d, snap5, applied, NOW)],
    )
    order = [(type(m).__name__, m.rack) for m in msgs]
    assert order == [("RackCommand", "r0"), ("CduCommand", "r5"), ("CduCommand", "r2")]
    assert [c.topic for c in book.open.values() if "cdu_cmd" in c.topic] == [
        "racktwin/v1/site1/rack/r5/cdu_cmd",
        "racktwin/v1/site1/rack/r2/cdu_cmd",
    ]
    cdu = [m for m in msgs if isinstance(m, wire.CduCommand)]
    assert [m.pump_speed_frac for m in cdu] == [1.0, 0.5]
    # while open, not repeated; a slowed pump is renewed at the first decision pump_renew_s or more after its last
    # command (NOW + 21 here), a full-speed one is not
    d2 = d.replace(card_level=np.asarray(snap.card_level).copy())
    assert [m for m in book.diff(d2, snap5, applied, NOW + 5) if isinstance(m[1], wire.CduCommand)] == []
    for oc in list(book.open.values()):  # everything acked applied
        book.on_ack(
            wire.Acknowledgement(oc.target, uuid.UUID(oc.command_id), wire.AckResult.APPLIED, NOW, 0, "sim"), NOW
        )
    now_slow = np.ones(8)
    now_slow[2] = 0.5
    snap_now = snap.__class__(**{**snap.__dict__, "rack_pump_speed_frac": now_slow})
    assert [m for m in book.diff(d2, snap_now, applied, NOW + 15) if isinstance(m[1], wire.CduCommand)] == []
    renew = [m[1] for m in book.diff(d2, snap_now, applied, NOW + 21) if isinstance(m[1], wire.CduCommand)]
    assert [(m.rack, m.pump_speed_frac) for m in renew] == [("r2", 0.5)]
    # advice carries the speeds and registers nothing
    adv = book.advice(d2, snap_now, applied, NOW + 21)
    assert adv.pump_speeds == {"r2": 0.5}
    back = codec.decode(codec.topics.advice, wire.encode_advice(adv))
    assert isinstance(back, wire.AgentAdvice) and back.pump_speeds == {"r2": 0.5}


def test_a_refused_pump_renewal_is_sent_again_at_the_next_decision(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """A CDU returns its pump to full speed when no command renews the slowed speed: a renewal it
    refused is not one, so the next decision renews again at once, not a whole ``pump_renew_s`` later."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0, pump_renew_s=20.0))
    applied = np.full(512, -1)
    speed = np.ones(8)
    speed[2] = 0.5
    slowed = dataclasses.replace(snap, rack_pump_speed_frac=speed)  # r2 runs at 0.5 already
    d = decision_like(slowed, rack_pump_speed_frac=speed)

    def pumps(now_s: float) -> list[tuple[str, float]]:
        msgs = [codec.decode(c.topic, c.payload) for c in book.commands(d, slowed, applied, now_s)]
        return [(m.rack, m.pump_speed_frac) for m in msgs if isinstance(m, wire.CduCommand)]

    assert pumps(NOW) == [("r2", 0.5)]  # never renewed by this book: due
    (renewal,) = book.open.values()
    refused = wire.Acknowledgement("r2", uuid.UUID(renewal.command_id), wire.AckResult.REJECTED, NOW, 0, "sim", "x")
    book.on_ack(refused, NOW + 1.0)
    assert pumps(NOW + 5.0) == [("r2", 0.5)]
    book.on_ack(
        wire.Acknowledgement("r2", uuid.UUID(next(iter(book.open))), wire.AckResult.APPLIED, NOW + 5.0, 0, "sim"),
        NOW + 6.0,
    )
    assert pumps(NOW + 10.0) == []  # applied at NOW + 5: the next renewal is due at NOW + 25
    assert pumps(NOW + 25.0) == [("r2", 0.5)]


def test_host_power_is_commanded_by_whole_hosts_per_rack_and_not_twice(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    site, snap = scene
    assert site.cards_per_host == 8 and site.n_hosts == 64
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(512, -1)
    assert not snap.card_host_off.any() and snap.card_job[:8].min() >= 0  # host 0 runs job a
    # hosts off: all of r2 (hosts 16..23), r3's last two (30, 31: cards 240..255) and busy host 0;
    # one more card of r3 (host 24) only to sleep
    host_off = np.zeros(64, dtype=bool)
    host_off[[0, *range(16, 24), 30, 31]] = True
    card_off = host_off[site.card_host()]
    lp = np.asarray(snap.card_low_power).copy() | (card_off & (snap.card_job < 0))
    lp[192:200] = True
    d = decision_like(snap, card_low_power=lp, host_off=host_off)
    cmds = book.commands(d, snap, applied, NOW)
    decoded = [rack_command(codec, c) for c in cmds]
    assert all(isinstance(m, wire.RackCommand) for m in decoded)
    got = [(m.rack, m.setting.action.value, m.cards) for m in decoded]
    assert got == [
        ("r2", "host_power_off", tuple(range(64))),  # every card of every host, rack-local
        ("r3", "host_power_off", tuple(range(48, 64))),
        ("r3", "low_power_idle", tuple(range(8))),  # no sleep for cards whose host goes off
    ]  # and nothing for busy host 0: the plant would refuse it
    # open: not sent again while telemetry catches up
    assert book.commands(d, snap, applied, NOW + 1.0) == []
    # applied; the racks report the hosts off (their cards asleep): nothing to send after expiry either,
    # even where the decision would have a card of an off host awake (a wake would boot its host)
    for c in cmds:
        book.on_ack(wire.Acknowledgement(c.target, uuid.UUID(c.command_id), wire.AckResult.APPLIED, NOW, 0, "s"), NOW)
    reported = dataclasses.replace(
        snap, card_host_off=card_off & (snap.card_job < 0), card_low_power=lp & (snap.card_job < 0)
    )
    book.expire(NOW + 31.0)
    assert book.commands(d, reported, applied, NOW + 31.0) == []
    awake = d.replace(card_low_power=lp & ~card_off)
    assert book.commands(awake, reported, applied, NOW + 31.0) == []
    # on again: the hosts reported off get a power-on (before any wake), only host 16's cards woken
    lp_on = lp.copy()
    lp_on[128:136] = False
    d_on = d.replace(host_off=np.zeros(64, dtype=bool), card_low_power=lp_on)
    on = [rack_command(codec, c) for c in book.commands(d_on, reported, applied, NOW + 32.0)]
    assert [(m.rack, m.setting.action.value, m.cards) for m in on] == [
        ("r2", "host_power_on", tuple(range(64))),
        ("r3", "host_power_on", tuple(range(48, 64))),
        ("r2", "wake", tuple(range(8))),
    ]
    # a refused power-on is not retried within the ttl, then it is
    book2 = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    first = book2.commands(d_on, reported, applied, NOW)
    refused = wire.AckResult.REJECTED
    for c in first:
        book2.on_ack(wire.Acknowledgement(c.target, uuid.UUID(c.command_id), refused, NOW, 0, "s", "no"), NOW)
    assert book2.commands(d_on, reported, applied, NOW + 5.0) == []
    assert len(book2.commands(d_on, reported, applied, NOW + 31.0)) == 3
    # hosts not managed by the decision: no host commands, whatever the racks report
    host_actions = {wire.CardAction.HOST_POWER_OFF, wire.CardAction.HOST_POWER_ON}
    unmanaged = book2.advice(d_on.replace(host_off=None), reported, applied, NOW + 62.0).items
    assert unmanaged and not [it for it in unmanaged if it.setting.action in host_actions]
    advice = CommandBook(site, codec, ControlConfig()).advice(d, snap, applied, NOW)
    assert [it.setting.action for it in advice.items][:2] == [wire.CardAction.HOST_POWER_OFF] * 2


def test_a_newer_command_closes_the_open_older_one_for_the_same_setting(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """Acks that never come (a broker ACL dropping a rack's acks) leave commands open; a command still
    open when a newer one for the same cards (pump, set-point) is issued is closed as superseded,
    never to be sent again: its re-send put the cards back under the newer one (an audit: 16 cards at
    the top clock, the rack 2% over its limit). Its cards the newer one does not list are commanded
    again at the next decision, and a rack's ``superseded`` refusal holds nothing back."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(512, -1)
    assert not np.asarray(snap.card_level)[:16].any()
    speed = np.ones(8)

    def levels(**at: int) -> np.ndarray:
        lvl = np.asarray(snap.card_level).copy()
        for cards, v in at.items():
            lo, hi = (int(x) for x in cards[1:].split("_"))
            lvl[lo:hi] = v
        return lvl

    speed[2] = 0.5
    d1 = decision_like(snap, card_level=levels(c0_16=3), supply_temp_c=35.0, rack_pump_speed_frac=speed.copy())
    first = book.commands(d1, snap, applied, NOW)
    assert [oc.target for oc in first] == ["r0", "facility", "r2"]
    speed[2] = 0.6
    d2 = decision_like(snap, card_level=levels(c0_8=3, c8_16=5), supply_temp_c=36.0, rack_pump_speed_frac=speed.copy())
    second = book.commands(d2, snap, applied, NOW + 10.0)
    decoded = [codec.decode(c.topic, c.payload) for c in second]
    assert [(m.rack, m.cards, m.setting.dvfs_level) for m in decoded if isinstance(m, wire.RackCommand)] == [
        ("r0", tuple(range(8, 16)), 5)
    ]
    assert set(book.open) == {oc.command_id for oc in second}  # the first decision's are closed
    gone = book.take_superseded()
    assert {oc.command_id for oc in gone} == {oc.command_id for oc in first}
    level_a = next(oc for oc in gone if oc.target == "r0")
    assert level_a.superseded_by == second[0].command_id
    assert book.take_superseded() == []
    # cards 0..7, which only the closed command set, are commanded again (the racks do not report them at 3)
    third = [rack_command(codec, c) for c in book.commands(d2, snap, applied, NOW + 11.0)]
    assert [(m.rack, m.cards, m.setting.dvfs_level) for m in third] == [("r0", tuple(range(8)), 3)]
    # the rack refuses it as superseded (it holds a newer one): no back-off, the next decision tries again
    c = next(iter(oc for oc in book.open.values() if oc.cards.tolist() == list(range(8))))
    reason = "superseded: the DVFS level of card 0 of rack r0 has applied a command issued at ts 1011.000 (seq 9), ..."
    book.on_ack(
        wire.Acknowledgement("r0", uuid.UUID(c.command_id), wire.AckResult.REJECTED, NOW, 0, "sim", reason), NOW
    )
    assert len(book.commands(d2, snap, applied, NOW + 12.0)) == 1
    # a power state: a host switched off supersedes an open wake of its cards; a host powered on and
    # woken in one decision supersedes nothing
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    awake = np.asarray(snap.card_low_power).copy()
    assert not awake[192:256].any() and (np.asarray(snap.card_job)[192:256] < 0).all()  # r3: idle, awake
    host24 = np.arange(512) // 8 == 24
    asleep = dataclasses.replace(snap, card_low_power=awake | host24)
    wake = book.commands(decision_like(asleep, card_low_power=awake), asleep, applied, NOW)
    assert [rack_command(codec, c).setting.action for c in wake] == [wire.CardAction.WAKE]
    host_off = np.zeros(64, dtype=bool)
    host_off[24] = True
    off = book.commands(decision_like(asleep, host_off=host_off), asleep, applied, NOW + 1.0)
    assert [rack_command(codec, c).setting.action for c in off] == [wire.CardAction.HOST_POWER_OFF]
    assert [oc.command_id for oc in book.take_superseded()] == [wake[0].command_id]
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    reported_off = dataclasses.replace(snap, card_host_off=host24, card_low_power=awake | host24)
    all_on = np.zeros(64, dtype=bool)
    on = book.commands(decision_like(reported_off, host_off=all_on, card_low_power=awake), reported_off, applied, NOW)
    assert [rack_command(codec, c).setting.action for c in on] == [
        wire.CardAction.HOST_POWER_ON,
        wire.CardAction.WAKE,
    ]
    assert book.take_superseded() == [] and set(book.open) == {oc.command_id for oc in on}


def test_cards_of_hosts_that_are_off_get_no_level_or_power_limit(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """A rack refuses a level or a power limit for a card whose host is off (``host_off``: the card
    cannot be reached): the agent sends none to cards of hosts reported or commanded off, and sends
    them once the host is on."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(512, -1)
    assert (np.asarray(snap.card_job)[128:192] < 0).all()  # r2 idle
    reported = dataclasses.replace(snap, card_host_off=np.arange(512) // 8 == 16)  # host 16: cards 128..135
    lvl = np.asarray(snap.card_level).copy()
    lvl[128:140] = 4
    lim = np.asarray(snap.card_power_limit_w).copy()
    lim[130:138] = 400.0
    host_off = np.zeros(64, dtype=bool)
    host_off[16] = True
    d = decision_like(reported, card_level=lvl, card_power_limit_w=lim, host_off=host_off)
    got = [rack_command(codec, c) for c in book.commands(d, reported, applied, NOW)]
    assert [(m.rack, m.setting.action.value, m.cards) for m in got] == [
        ("r2", "set_dvfs_level", (8, 9, 10, 11)),
        ("r2", "set_power_limit", (8, 9)),
    ]
    # host 17 (cards 136..143) powered off by this decision: its cards get no level (one that raised
    # power would come after the power-off and be refused), nor any while the command is open
    host_off[17] = True
    lvl2 = lvl.copy()
    lvl2[136:144] = 6
    d2 = d.replace(host_off=host_off.copy(), card_level=lvl2)
    got2 = [rack_command(codec, c) for c in book.commands(d2, reported, applied, NOW + 1.0)]
    assert [(m.rack, m.setting.action.value, m.cards) for m in got2] == [
        ("r2", "host_power_off", tuple(range(8, 16))),
    ]
    lvl3 = lvl2.copy()
    lvl3[136:144] = 7
    assert book.commands(d2.replace(card_level=lvl3), reported, applied, NOW + 2.0) == []
    # host 16 on again (reported): its cards get their level and limit
    on = dataclasses.replace(snap, card_host_off=np.zeros(512, dtype=bool))
    host_off[16] = False
    d3 = d2.replace(host_off=host_off.copy(), card_level=lvl3)
    got3 = [rack_command(codec, c) for c in book.commands(d3, on, applied, NOW + 3.0)]
    assert [(m.rack, m.setting.action.value, m.cards) for m in got3] == [
        ("r2", "set_dvfs_level", tuple(range(8))),
        ("r2", "set_power_limit", tuple(range(2, 8))),
    ]


def test_a_command_never_lives_longer_than_a_rack_accepts(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """A rack refuses a command that would live longer than ``wire.MAX_COMMAND_TTL_S`` (``ttl_too_long``):
    a longer ``command_ttl_s`` (the configuration allows a day) gives commands that maximum."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=7200.0))
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = 2
    (oc,) = book.commands(decision_like(snap, card_level=lvl), snap, np.full(512, -1), NOW)
    msg = codec.decode(oc.topic, oc.payload)
    assert isinstance(msg, wire.RackCommand) and msg.expires_s - msg.ts_s == 3600.0 and oc.expires_s == NOW + 3600.0
    assert wire.MAX_COMMAND_TTL_S == 3600.0


def test_after_the_agent_clock_steps_back_commands_keep_the_newest_issue_time(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """The agent's clock ran ahead of a simulator starved of CPU and steps back 45 s (``agent.clock``):
    the rack, whose clock is behind, applied the commands stamped on the old timeline; the next ones
    keep that issue time (ordered by ``seq``) instead of being refused ``superseded`` by the agent's
    own earlier commands until the site's clock catches up."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    applied = np.full(512, -1)

    def level_of_cards_0_to_7(level: int) -> Decision:
        lvl = np.asarray(snap.card_level).copy()
        lvl[0:8] = level
        return decision_like(snap, card_level=lvl)

    # an agent following a simulator at 20x: a rack accepts ten wall seconds (200 site s) ahead; the
    # agent holds its stamps half as far
    control_20x = ControlConfig(command_ttl_s=30.0, time_scale=1 / 20)
    book = CommandBook(site, codec, control_20x)
    assert book.stamp_hold_s() == 100.0
    # a simulator measured slower than configured: the slower rate bounds the hold
    assert CommandBook(site, codec, control_20x, site_rate=lambda: 2.0).stamp_hold_s() == 10.0
    plant = Plant(site, [], config=PlantConfig(seed=1))
    rack_now = [NOW - 40.0]
    rack = CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: rack_now[0], max_issue_ahead_s=200.0)

    def send(oc: OpenCommand) -> wire.Acknowledgement:
        ack = codec.decode(*next((o.topic, o.payload) for o in rack.handle(oc.topic, oc.payload) if not o.retain))
        assert isinstance(ack, wire.Acknowledgement)
        return ack

    (first,) = book.commands(level_of_cards_0_to_7(3), snap, applied, NOW)
    assert send(first).result is wire.AckResult.APPLIED
    (second,) = book.commands(level_of_cards_0_to_7(5), snap, applied, NOW - 45.0)  # the clock stepped back
    msg = codec.decode(second.topic, second.payload)
    assert isinstance(msg, wire.RackCommand) and msg.ts_s == NOW and msg.expires_s == NOW + 30.0
    ack = send(second)
    assert ack.result is wire.AckResult.APPLIED, ack.reason
    assert rack.level[0:8].tolist() == [5] * 8
    # once the clock has passed the held stamp, commands carry the clock's time again
    (third,) = book.commands(level_of_cards_0_to_7(2), snap, applied, NOW + 1.0)
    assert rack_command(codec, third).ts_s == NOW + 1.0

    # at 1x a rack accepts 10 s ahead: a larger step back (a restarted site clock) stamps the clock's time
    book_1x = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    assert book_1x.stamp_hold_s() == wire.MAX_ISSUE_AHEAD_S / 2
    book_1x.commands(level_of_cards_0_to_7(3), snap, applied, NOW)
    (small,) = book_1x.commands(level_of_cards_0_to_7(5), snap, applied, NOW - 3.0)
    assert rack_command(codec, small).ts_s == NOW
    (large,) = book_1x.commands(level_of_cards_0_to_7(2), snap, applied, NOW - 60.0)
    assert rack_command(codec, large).ts_s == NOW - 60.0

    # a restarted agent re-opens its journaled commands: the next ones are not issued before them
    restarted = CommandBook(site, codec, control_20x)
    restarted.resume([(first.command_id, first.target, first.topic, first.payload, NOW, NOW + 30.0, 1)])
    (after_restart,) = restarted.commands(level_of_cards_0_to_7(6), snap, applied, NOW - 20.0)
    assert rack_command(codec, after_restart).ts_s == NOW


def test_a_host_powered_on_before_the_racks_reported_it_off_gets_wakes_and_no_sleeps(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """The agent powers host 16 off, then, before telemetry shows it off, wants it on again with two of
    its cards asleep. A host boots with its cards asleep: its cards get no sleep (the rack, its host
    still off, would refuse it: host_off) and the six wanted awake a wake after the power-on."""
    site, snap = scene
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(512, -1)
    assert (np.asarray(snap.card_job)[128:136] < 0).all() and not snap.card_low_power[128:136].any()
    host_off = np.zeros(64, dtype=bool)
    host_off[16] = True  # cards 128..135, r2's 0..7
    lp = np.asarray(snap.card_low_power).copy()
    lp[128:136] = True
    off = [
        rack_command(codec, c)
        for c in book.commands(decision_like(snap, card_low_power=lp, host_off=host_off), snap, applied, NOW)
    ]
    assert [(m.rack, m.setting.action.value) for m in off] == [("r2", "host_power_off")]
    lp2 = np.asarray(snap.card_low_power).copy()
    lp2[128:130] = True
    d_on = decision_like(snap, card_low_power=lp2, host_off=np.zeros(64, dtype=bool))
    on = [rack_command(codec, c) for c in book.commands(d_on, snap, applied, NOW + 5.0)]
    assert [(m.rack, m.setting.action.value, m.cards) for m in on] == [
        ("r2", "host_power_on", tuple(range(8))),
        ("r2", "wake", tuple(range(2, 8))),
    ]
