"""Which commands carry a decision, and for how long the agent waits on them (a hand mutation audit of
``agent.command_book``, ``agent.command_diff``, ``agent.command_overlays`` and ``agent.open_commands``):
a command closed at its expiry instant, an ``expired`` ack tried again at once, the acked ids
remembered, the issue times never going back, a held renewal after the site clock stepped back.

In process, with the real book (``agent.publish.CommandBook``) on the example site; the rules are those
of docs/agent.md ("Commands") and docs/protocol.md."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pytest
from agent_helpers import belief, example_site, job
from test_publish import NOW
from test_publish import decision_like as _decision

from agent import command_book, wire
from agent.config import ControlConfig
from agent.decision import Decision, PlacementOrder
from agent.open_commands import LIMIT
from agent.publish import CommandBook, OpenCommand, new_commands
from twin.spec import SiteSpec
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent

TTL_S = 30.0
NO_APPLIED = np.full(512, -1)


@pytest.fixture(scope="module")
def scene() -> tuple[SiteSpec, StateSnapshot]:
    site = example_site()
    _plant, state = belief(site, [job("a", 64), job("b", 64)], 5)
    return site, state.snapshot()


def _cards_0_to_7_at(snap: StateSnapshot, level: int) -> Decision:
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = level
    return _decision(snap, card_level=lvl)


def _book(site: SiteSpec, **control: Any) -> tuple[CommandBook, wire.Codec]:
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    return CommandBook(site, codec, ControlConfig(**{"command_ttl_s": TTL_S, **control})), codec


def _ack(oc: OpenCommand, result: wire.AckResult, reason: str | None = None) -> wire.Acknowledgement:
    return wire.Acknowledgement(oc.target, uuid.UUID(oc.command_id), result, NOW, 0, "sim", reason)


def test_a_command_is_closed_at_its_expiry_instant_and_its_setting_sent_again(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A rack ignores a command at or after its expiry (docs/protocol.md): at that instant the agent
    closes it unanswered, and the next decision sends the setting again (not one period later)."""
    site, snap = scene
    book, _codec = _book(site)
    d = _cards_0_to_7_at(snap, 3)
    (first,) = book.commands(d, snap, NO_APPLIED, NOW)
    assert first.expires_s == NOW + TTL_S
    assert book.expire(NOW + TTL_S - 0.001) == [] and book.commands(d, snap, NO_APPLIED, NOW + TTL_S - 0.001) == []
    assert book.expire(NOW + TTL_S) == [first] and book.open == {}
    (again,) = book.commands(d, snap, NO_APPLIED, NOW + TTL_S)
    assert again.command_id != first.command_id and again.cards.tolist() == list(range(8))


def test_a_command_acked_expired_is_tried_again_at_the_next_decision(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """An ack ``expired`` (the command arrived late) is no refusal: the next decision sends the setting
    again at once; a ``rejected`` one is held back for ``command_ttl_s`` (docs/agent.md, "Commands")."""
    site, snap = scene
    book, _codec = _book(site)
    d = _cards_0_to_7_at(snap, 3)
    (late,) = book.commands(d, snap, NO_APPLIED, NOW)
    assert book.on_ack(_ack(late, wire.AckResult.EXPIRED, "expired: the command expired at ts 1030"), NOW + 1.0)
    (again,) = book.commands(d, snap, NO_APPLIED, NOW + 2.0)
    assert again.cards.tolist() == list(range(8))
    assert book.on_ack(_ack(again, wire.AckResult.REJECTED, "plant: no"), NOW + 3.0)
    assert book.commands(d, snap, NO_APPLIED, NOW + 4.0) == []
    assert book.commands(d, snap, NO_APPLIED, NOW + 3.0 + TTL_S - 0.001) == []
    assert len(book.commands(d, snap, NO_APPLIED, NOW + 3.0 + TTL_S)) == 1


def test_the_acked_ids_remembered_are_exactly_the_last_ones(
    scene: tuple[SiteSpec, StateSnapshot], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The book tells a repeated ack from a late one by the last ``_ACKED_KEPT`` commands acked (a few
    hours of a site: 100,000); here 3, the oldest forgotten first."""
    site, snap = scene
    monkeypatch.setattr(command_book, "_ACKED_KEPT", 3)
    book, _codec = _book(site)
    acked = []
    for i in range(4):
        (oc,) = book.commands(_cards_0_to_7_at(snap, 1 + i), snap, NO_APPLIED, NOW + i)
        assert book.on_ack(_ack(oc, wire.AckResult.APPLIED), NOW + i) is oc
        assert book.on_ack(_ack(oc, wire.AckResult.APPLIED), NOW + i) is None  # a second ack closes nothing
        acked.append(oc.command_id)
        assert [book.acked_before(c) for c in acked] == [True] * len(acked) if i < 3 else [False, True, True, True]


def test_the_journal_keeps_a_command_s_issue_time_and_expiry(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """What the journal records of an open command (``new_commands``): its id, target, topic and bytes,
    its issue time and its expiry (a restart re-opens them in the order they were issued, and retries
    them a retry interval after their issue)."""
    site, snap = scene
    book, _codec = _book(site)
    (oc,) = book.commands(_cards_0_to_7_at(snap, 3), snap, NO_APPLIED, NOW)
    (journaled,) = new_commands([oc])
    assert (journaled.command_id, journaled.target, journaled.topic, journaled.payload) == (
        oc.command_id,
        "r0",
        "racktwin/v1/site1/rack/r0/cmd",
        oc.payload,
    )
    assert (journaled.issued_s, journaled.expires_s) == (NOW, NOW + TTL_S)


def test_issue_times_hold_for_a_step_back_of_exactly_the_hold_and_are_given_only_to_commands(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """After the clock steps back, commands keep the newest issue time given so far while that stays
    within ``stamp_hold_s`` of the clock (5 s at 1x), the bound included; a decision with nothing to
    command gives no issue time (a later step back is not held to it)."""
    site, snap = scene
    book, codec = _book(site)
    assert book.stamp_hold_s() == 5.0

    def stamp_of(level: int, now_s: float) -> float:
        (oc,) = book.commands(_cards_0_to_7_at(snap, level), snap, NO_APPLIED, now_s)
        msg = codec.decode(oc.topic, oc.payload)
        assert isinstance(msg, wire.RackCommand) and msg.expires_s - msg.ts_s == TTL_S
        return msg.ts_s

    assert stamp_of(3, NOW) == NOW
    assert stamp_of(4, NOW - 5.0) == NOW  # exactly the hold back: still held
    assert book.commands(_cards_0_to_7_at(snap, 4), snap, NO_APPLIED, NOW + 10.0) == []  # nothing to command
    assert stamp_of(5, NOW + 8.0) == NOW + 8.0  # the newest issue time given is NOW, not NOW + 10


def test_the_level_a_rack_applied_counts_over_telemetry_the_top_level_too(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A rack's retained applied state says which DVFS level each card runs (``applied_level``; -1:
    none reported): a card applied at level 0 (the top clock) while telemetry still reads an older
    level gets no command for level 0, and one the decision wants elsewhere gets one."""
    site, snap = scene
    book, codec = _book(site)
    read_slow = np.asarray(snap.card_level).copy()
    read_slow[0:16] = 3  # telemetry still reads cards 0..15 slowed
    lagging = snap.__class__(**{**snap.__dict__, "card_level": read_slow})
    applied = NO_APPLIED.copy()
    applied[0:16] = 0  # the rack applied level 0 to them
    top = np.asarray(snap.card_level).copy()
    top[0:16] = 0
    assert book.commands(_decision(lagging, card_level=top), lagging, applied, NOW) == []
    top[8:16] = 2
    (oc,) = book.commands(_decision(lagging, card_level=top), lagging, applied, NOW)
    msg = codec.decode(oc.topic, oc.payload)
    assert isinstance(msg, wire.RackCommand) and msg.cards == tuple(range(8, 16)) and msg.setting.dvfs_level == 2
    # where no level was applied, telemetry's level counts
    assert len(book.commands(_decision(lagging, card_level=top), lagging, NO_APPLIED, NOW + 1.0)) == 1


def test_a_slowed_pump_is_renewed_pump_renew_s_after_its_last_command_also_after_the_clock_stepped_back(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A CDU returns a slowed pump to full speed when no command renews it (the simulator's
    ``pump_hold_s``, 60 s), so the agent renews it at the first decision ``pump_renew_s`` or more after
    its last command for the rack (docs/agent.md; decisions here every 10 s). The site clock steps
    back (``agent.clock``: it ran ahead of a simulator starved of CPU; a restarted simulator) further
    than issue times are held: the last command counts as sent at the step, so the renewal comes at
    the first decision ``pump_renew_s`` or more after the step, not ``pump_renew_s`` after the last
    renewal's stamp on the old timeline (60 s back: 80 s without one, and the pump ran at full speed
    meanwhile)."""
    site, snap = scene
    book, codec = _book(site, pump_renew_s=20.0)
    speed = np.ones(8)
    speed[2] = 0.5
    slowed = snap.__class__(**{**snap.__dict__, "rack_pump_speed_frac": speed})
    d = _decision(slowed, rack_pump_speed_frac=speed)

    def renewed(now_s: float) -> bool:
        msgs = [codec.decode(c.topic, c.payload) for c in book.commands(d, slowed, NO_APPLIED, now_s)]
        assert all(isinstance(m, wire.CduCommand) and m.rack == "r2" for m in msgs)
        for oc in list(book.open.values()):
            book.on_ack(_ack(oc, wire.AckResult.APPLIED), now_s)
        return bool(msgs)

    assert renewed(NOW)  # never renewed by this book: due
    assert not renewed(NOW + 10.0)
    assert renewed(NOW + 20.0)
    back = NOW + 20.0 - 60.0  # the clock steps back 60 s
    assert [renewed(back + s) for s in (0.0, 10.0, 20.0, 30.0, 40.0)] == [False, False, True, False, True]


def test_a_pump_command_at_a_job_events_decision_is_renewed_up_to_a_period_later_than_pump_renew_s(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Decisions come every ``period_s`` (15 s) on their grid and, between, at job events, which leave
    the grid where it is (agent.service). A pump speed changed at an event's decision 10.5 s into a
    period is due again 20 s later (``pump_renew_s``), 0.5 s after a grid decision: the renewal waits
    for the next one, 34.5 s after the command. The worst case is ``pump_renew_s + period_s``, which
    ``racktwin agent --check-config`` states (35 s at the defaults), not the 30 s of renewals on the
    grid alone."""
    site, snap = scene
    book, codec = _book(site, pump_renew_s=20.0, period_s=15.0)

    def at(speed_r2: float) -> StateSnapshot:
        speed = np.ones(8)
        speed[2] = speed_r2
        return snap.__class__(**{**snap.__dict__, "rack_pump_speed_frac": speed})

    def sent(reported: StateSnapshot, want: StateSnapshot, now_s: float) -> list[float]:
        d = _decision(want, rack_pump_speed_frac=np.asarray(want.rack_pump_speed_frac))
        msgs = [codec.decode(c.topic, c.payload) for c in book.commands(d, reported, NO_APPLIED, now_s)]
        for oc in list(book.open.values()):
            book.on_ack(_ack(oc, wire.AckResult.APPLIED), now_s)
        assert all(isinstance(m, wire.CduCommand) and m.rack == "r2" for m in msgs)
        return [m.pump_speed_frac for m in msgs if isinstance(m, wire.CduCommand)]

    assert sent(at(1.0), at(0.5), NOW) == [0.5]  # a grid decision slows r2's pump
    assert sent(at(0.5), at(0.6), NOW + 10.5) == [0.6]  # a job event's decision: a new speed
    assert [sent(at(0.6), at(0.6), NOW + t) for t in (15.0, 30.0)] == [[], []]  # 4.5 s, 19.5 s after it
    assert sent(at(0.6), at(0.6), NOW + 45.0) == [0.6]  # 34.5 s after it


def test_power_limits_are_sent_to_a_tenth_of_a_watt_rounded_down_against_the_card_s_own_limit(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A limit goes to 0.1 W, rounded down (its encoding never raises it); a card that reports no
    limit (NaN) runs at the card's own (the site spec's 700 W): a decision at it sends nothing, and a
    lower one is a lowering command, sent before those that raise power."""
    site, snap = scene
    book, _codec = _book(site)
    assert site.card.power_limit_w == 700.0
    unreported = np.asarray(snap.card_power_limit_w, dtype=np.float64).copy()
    unreported[0:64] = np.nan  # r0 never reported its limits
    silent = snap.__class__(**{**snap.__dict__, "card_power_limit_w": unreported})
    lim = np.where(np.isfinite(unreported), unreported, 700.0)
    assert book.commands(_decision(silent, card_power_limit_w=lim), silent, NO_APPLIED, NOW) == []
    lim[0:8] = 400.06
    ((kind, msg, lowers),) = book.diff(_decision(silent, card_power_limit_w=lim), silent, NO_APPLIED, NOW)
    assert (kind, lowers) == (LIMIT, True) and isinstance(msg, wire.RackCommand)
    assert msg.rack == "r0" and msg.cards == tuple(range(8)) and msg.setting.power_limit_w == 400.0


def test_a_limit_computed_a_hair_under_a_tenth_of_a_watt_is_sent_at_that_tenth(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Rounding down to 0.1 W never takes a tenth off a limit that is a tenth up to floating-point
    error: 700 - 290.4 W computes as 409.59999999999997 and goes as 409.6 W, not 409.5 W."""
    site, snap = scene
    book, _codec = _book(site)
    computed = 700.0 - 0.1 * 2904
    assert computed < 409.6  # one ulp under the tenth
    lim = np.asarray(snap.card_power_limit_w, dtype=np.float64).copy()
    assert (lim[0:8] > 410.0).all()
    lim[0:8] = computed
    ((kind, msg, lowers),) = book.diff(_decision(snap, card_power_limit_w=lim), snap, NO_APPLIED, NOW)
    assert (kind, lowers) == (LIMIT, True) and isinstance(msg, wire.RackCommand)
    assert msg.cards == tuple(range(8)) and msg.setting.power_limit_w == 409.6


def test_a_host_some_of_whose_cards_read_off_is_powered_off_or_on_whole(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Host power goes by whole hosts: a host only some of whose cards read off is not off (powered off
    where the decision wants it off) and not on (powered on where the decision wants it on)."""
    site, snap = scene
    book, codec = _book(site)
    assert (np.asarray(snap.card_job)[128:144] < 0).all()  # r2's hosts 16 and 17 idle
    half = np.zeros(512, dtype=bool)
    half[[128, 129, 130, 131, 136, 137]] = True  # half of host 16, two cards of host 17 read off
    partly = snap.__class__(**{**snap.__dict__, "card_host_off": half})
    host_off = np.zeros(64, dtype=bool)
    host_off[16] = True  # host 16 wanted off, 17 on
    cmds = book.commands(_decision(partly, host_off=host_off), partly, NO_APPLIED, NOW)
    got = [codec.decode(c.topic, c.payload) for c in cmds]
    assert [(m.rack, m.setting.action, m.cards) for m in got if isinstance(m, wire.RackCommand)] == [
        ("r2", wire.CardAction.HOST_POWER_OFF, tuple(range(8))),
        ("r2", wire.CardAction.HOST_POWER_ON, tuple(range(8, 16))),
        ("r2", wire.CardAction.WAKE, (8, 9)),  # read asleep with their host: woken after the power-on
    ]


def test_an_applied_setting_is_held_until_its_command_expires_then_sent_again_where_the_racks_lack_it(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """An ack ``applied`` closes a command; what it set counts as the racks' until the command's expiry
    (telemetry catches up meanwhile: nothing is sent again), and from that instant on what the racks
    report counts: a level, a set-point, a pump speed and a placement they do not show are sent again."""
    site, snap = scene
    book, codec = _book(site, pump_renew_s=3600.0)  # (no renewal of the slowed pump in between)
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = 3
    speed = np.ones(8)
    speed[2] = 0.5
    assert (np.asarray(snap.card_job)[256:260] < 0).all()  # r4's first cards are free
    d = _decision(
        snap,
        card_level=lvl,
        supply_temp_c=35.0,
        rack_pump_speed_frac=speed,
        placements=(PlacementOrder("q", (256, 257, 258, 259)),),
    )
    first = book.commands(d, snap, NO_APPLIED, NOW)
    kinds = sorted(type(codec.decode(c.topic, c.payload)).__name__ for c in first)
    assert kinds == ["CduCommand", "FacilityCommand", "RackCommand", "SchedulerCommand"]
    for oc in first:
        assert book.on_ack(_ack(oc, wire.AckResult.APPLIED), NOW + 1.0) is oc
    assert book.open == {} and book.expire(NOW + TTL_S) == []
    assert book.commands(d, snap, NO_APPLIED, NOW + TTL_S - 0.001) == []
    again = book.commands(d, snap, NO_APPLIED, NOW + TTL_S)
    assert sorted(type(codec.decode(c.topic, c.payload)).__name__ for c in again) == kinds


def test_a_refused_set_point_or_placement_is_sent_again_at_the_next_decision(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A refusal clears what the command would have set: a set-point or a placement the facility or the
    scheduler refused (no card setting: nothing is held back) goes again at the next decision."""
    site, snap = scene
    book, _codec = _book(site)
    d = _decision(snap, supply_temp_c=35.0, placements=(PlacementOrder("q", (256, 257, 258, 259)),))
    first = book.commands(d, snap, NO_APPLIED, NOW)
    assert [c.target for c in first] == ["facility", "scheduler"]
    for oc in first:
        book.on_ack(_ack(oc, wire.AckResult.REJECTED, "plant: no"), NOW + 1.0)
    assert [c.target for c in book.commands(d, snap, NO_APPLIED, NOW + 2.0)] == ["facility", "scheduler"]


def test_a_set_point_change_of_a_twentieth_of_a_degree_is_commanded_and_a_lower_one_lowers(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Only a set-point the facility does not have (to 0.01 deg C) is commanded; a lower one lowers die
    temperatures (the book's ``lowers_power``), a higher one does not."""
    site, snap = scene
    assert snap.facility is not None
    have = snap.facility.supply_setpoint_c
    book, _codec = _book(site)
    assert book.diff(_decision(snap, supply_temp_c=have + 0.005), snap, NO_APPLIED, NOW) == []
    ((_k, up, lowers_up),) = book.diff(_decision(snap, supply_temp_c=have + 0.05), snap, NO_APPLIED, NOW)
    ((_k, down, lowers_down),) = book.diff(_decision(snap, supply_temp_c=have - 0.05), snap, NO_APPLIED, NOW)
    assert isinstance(up, wire.FacilityCommand) and up.supply_setpoint_c == have + 0.05 and not lowers_up
    assert isinstance(down, wire.FacilityCommand) and lowers_down


def test_a_facility_that_never_reported_gets_the_decided_set_point_once(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """With no facility reading (the agent started before the facility's first report), what the
    facility has is unknown: the decided set-point is commanded, and not again while it is open."""
    site, snap = scene
    book, codec = _book(site)
    unheard = snap.__class__(**{**snap.__dict__, "facility": None})
    d = _decision(unheard, supply_temp_c=30.0)
    (sent,) = book.commands(d, unheard, NO_APPLIED, NOW)
    fc = codec.decode(sent.topic, sent.payload)
    assert isinstance(fc, wire.FacilityCommand) and fc.supply_setpoint_c == 30.0
    assert book.commands(d, unheard, NO_APPLIED, NOW + 1.0) == []


def test_a_busy_card_gets_no_sleep_so_the_idle_cards_sleep_command_is_not_refused(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """The plant refuses low-power idle for a busy card, and a rack refuses a command whole: a decision
    that wants a busy card asleep sends the sleep to the idle cards only."""
    site, snap = scene
    book, codec = _book(site)
    busy = np.asarray(snap.card_job) >= 0
    assert busy[0:4].all() and not busy[200:204].any()
    lp = np.asarray(snap.card_low_power).copy()
    lp[[0, 1, 200, 201, 202, 203]] = True
    got = [
        codec.decode(c.topic, c.payload)
        for c in book.commands(_decision(snap, card_low_power=lp), snap, NO_APPLIED, NOW)
    ]
    assert [(m.rack, m.setting.action, m.cards) for m in got if isinstance(m, wire.RackCommand)] == [
        ("r3", wire.CardAction.LOW_POWER_IDLE, (8, 9, 10, 11))
    ]


class _R1:
    """A book and a decision that wants every card of rack r1 (cards 64..127) at a level they do not
    report; :meth:`sent` gives the (cards of r1) of the commands the decision needs now."""

    def __init__(self, scene: tuple[SiteSpec, StateSnapshot], level: int = 3) -> None:
        self.site, self.snap = scene
        self.book, self.codec = _book(self.site)
        lvl = np.asarray(self.snap.card_level).copy()
        assert (lvl[64:128] != level).all()
        lvl[64:128] = level
        self.decision = _decision(self.snap, card_level=lvl)

    def seen(self, card: int, at_s: float) -> StateSnapshot:
        """The snapshot with a reading of ``card`` (of r1) at ``at_s``."""
        seen = np.asarray(self.snap.card_last_seen_s, dtype=np.float64).copy()
        seen[64 + card] = at_s
        return self.snap.__class__(**{**self.snap.__dict__, "card_last_seen_s": seen})

    def sent(
        self, now_s: float, snap: StateSnapshot | None = None, decision: Decision | None = None
    ) -> list[tuple[int, ...]]:
        out = []
        for oc in self.book.commands(decision or self.decision, snap or self.snap, NO_APPLIED, now_s):
            msg = self.codec.decode(oc.topic, oc.payload)
            assert isinstance(msg, wire.RackCommand) and msg.rack == "r1"
            out.append(msg.cards)
        return out

    def refuse_as_failed(self, command_id: str, cards: list[int], at_s: float) -> None:
        reason = wire.card_failed_reason("r1", cards)
        ack = wire.Acknowledgement("r1", uuid.UUID(command_id), wire.AckResult.REJECTED, at_s, 0, "sim", reason)
        assert self.book.on_ack(ack, at_s) is not None


ALL_R1 = tuple(range(64))


def test_a_card_failed_refusal_marks_only_cards_of_the_refused_command(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """A ``card_failed`` refusal names the command's dead cards: a card of the rack it names that the
    command did not include is not marked failed (it gets the next command)."""
    r1 = _R1(scene)
    lvl = np.asarray(r1.decision.card_level).copy()
    lvl[72:128] = np.asarray(r1.snap.card_level)[72:128]  # first only cards 0..7 of r1
    assert r1.sent(NOW, decision=r1.decision.replace(card_level=lvl)) == [tuple(range(8))]
    (oc,) = r1.book.open.values()
    r1.refuse_as_failed(oc.command_id, [5, 20], NOW + 1.0)
    assert r1.sent(NOW + 2.0) == [tuple(c for c in ALL_R1 if c != 5)]


def test_a_refusal_of_a_card_whose_mark_was_cleared_is_a_repeat_though_it_comes_after_later_decisions(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A card refused as failed again in a command issued after a decision found its mark cleared is
    held out of commands whatever its readings say, also when the refusal arrives after further
    decisions (acks come late)."""
    r1 = _R1(scene)
    (first,) = r1.book.commands(r1.decision, r1.snap, NO_APPLIED, NOW)
    r1.refuse_as_failed(first.command_id, [5], NOW + 1.0)
    assert r1.sent(NOW + 2.0) == [tuple(c for c in ALL_R1 if c != 5)]
    alive = r1.seen(5, NOW + 3.0)  # a reading clears the mark (a stale BMC status reads it alive)
    (to_5,) = r1.book.commands(r1.decision, alive, NO_APPLIED, NOW + 4.0)
    assert to_5.cards.tolist() == [64 + 5]
    assert r1.sent(NOW + 6.0, alive) == [] and r1.sent(NOW + 8.0, alive) == []  # decisions while it is open
    r1.refuse_as_failed(to_5.command_id, [5], NOW + 9.0)  # refused again: a repeat, held out for command_ttl_s
    assert r1.book.overlays.failed_repeat_holds() == {69: (1, NOW + 9.0 + TTL_S, TTL_S)}
    newer = r1.seen(5, NOW + 10.0)
    assert r1.sent(NOW + 11.0, newer) == []
    # after the hold (the others' command of NOW + 2 expired unanswered meanwhile: sent again without it)
    assert r1.sent(NOW + 9.0 + TTL_S - 0.001, newer) == [tuple(c for c in ALL_R1 if c != 5)]
    assert r1.sent(NOW + 9.0 + TTL_S, newer) == [(5,)]


def test_a_hold_lasts_no_longer_than_it_was_given_from_a_clock_that_stepped_back(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A card refused as failed again is held out for its hold; after the site clock steps back the hold
    lasts no longer than it was given from the new now (its end on the old timeline would hold a
    healthy card out until the new timeline reached it)."""
    r1 = _R1(scene)
    r1.book.overlays.restore_failed_repeat_holds({69: (1, NOW + 60.0, 60.0)})  # r1's card 5 held until NOW + 60
    assert r1.sent(NOW) == [tuple(c for c in ALL_R1 if c != 5)]
    back = NOW - 600.0
    # the command stamped at NOW is one no rack on the new timeline applies: closed, its cards are
    # commanded again (without card 5), and again once that command expired unanswered
    others = [tuple(c for c in ALL_R1 if c != 5)]
    assert r1.sent(back) == others
    assert r1.sent(back + 59.0) == others and r1.sent(back + 60.0) == [(5,)]


def test_a_repeat_count_below_one_restored_from_a_journal_holds_nothing(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Restored repeats of fewer than one (a damaged journal record) are passed over: the card is no
    repeat and held out of nothing."""
    r1 = _R1(scene)
    r1.book.overlays.restore_failed_repeat_holds({69: (0, NOW + 60.0, 60.0)})
    assert r1.book.overlays.failed_repeat_holds() == {}
    assert r1.sent(NOW) == [ALL_R1]


def test_a_command_applied_to_a_held_card_ends_its_hold(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """A card refused as failed again is held out of commands; a command that included it and that its
    rack then applies (the card repaired, replaced) ends the hold and the repeats: it gets the next
    decision's commands at once."""
    r1 = _R1(scene)
    r1.book.overlays.restore_failed_repeat_holds({69: (1, -np.inf, TTL_S)})  # a repeat before, its hold over
    lim = np.asarray(r1.snap.card_power_limit_w, dtype=np.float64).copy()
    lim[64:128] = 500.0
    both = r1.decision.replace(card_power_limit_w=lim)
    level, limit = r1.book.commands(both, r1.snap, NO_APPLIED, NOW)
    assert (level.kind, limit.kind) == (0, LIMIT) and 69 in level.cards and 69 in limit.cards
    r1.refuse_as_failed(level.command_id, [5], NOW + 1.0)  # refused again: held out
    assert r1.book.overlays.failed_repeat_holds()[69][0] == 2
    assert r1.sent(NOW + 1.5, decision=both) == [tuple(c for c in ALL_R1 if c != 5)]  # the others freed
    applied = wire.Acknowledgement("r1", uuid.UUID(limit.command_id), wire.AckResult.APPLIED, NOW + 2.0, 0, "sim")
    assert r1.book.on_ack(applied, NOW + 2.0) is limit
    assert r1.book.overlays.failed_repeat_holds() == {}
    assert r1.sent(NOW + 3.0, decision=both) == [(5,)]


def test_advice_carries_a_predicted_power_of_zero_and_no_unknown_or_negative_one(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """Advice carries the decision's predicted IT and facility power where known: 0 W is a prediction
    (a value, not an unknown); NaN or a negative value is none (``None`` on the wire)."""
    site, snap = scene
    book, _codec = _book(site)
    d = _decision(snap)
    zero = book.advice(d.replace(predicted_it_power_w=0.0, predicted_facility_power_w=0.0), snap, NO_APPLIED, NOW)
    assert (zero.predicted_it_power_w, zero.predicted_facility_power_w) == (0.0, 0.0)
    unknown = book.advice(
        d.replace(predicted_it_power_w=float("nan"), predicted_facility_power_w=-1.0), snap, NO_APPLIED, NOW
    )
    assert (unknown.predicted_it_power_w, unknown.predicted_facility_power_w) == (None, None)
    assert book.open == {}


def test_cards_never_read_are_commanded(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """A card no reading has shown yet (its last-seen time NaN: a rack silent since the agent started,
    which the fail-safe caps) counts as failed only where a ``card_failed`` refusal names it."""
    r1 = _R1(scene)
    seen = np.asarray(r1.snap.card_last_seen_s, dtype=np.float64).copy()
    seen[64:128] = np.nan
    unseen = r1.snap.__class__(**{**r1.snap.__dict__, "card_last_seen_s": seen})
    (first,) = r1.book.commands(r1.decision, unseen, NO_APPLIED, NOW)
    assert first.cards.tolist() == list(range(64, 128))
    r1.refuse_as_failed(first.command_id, [5], NOW + 1.0)
    assert r1.sent(NOW + 2.0, unseen) == [tuple(c for c in ALL_R1 if c != 5)]


def test_undo_takes_back_a_decisions_commands_and_reopens_those_they_superseded_as_they_were(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A decision the journal refused is not acted on (``agent.service``): ``CommandBook.undo`` drops
    its commands, and the commands they superseded (a level, the set-point, a pump speed, a placement)
    are open again as they were: the same objects with their ids, expiries and retry state, what they
    set held again, none reported superseded, and the sequence numbers drawn given again (a rack would
    count a gap as lost messages). The next decision supersedes them as usual."""
    site, snap = scene
    book, _codec = _book(site, pump_renew_s=3600.0)
    speed = np.ones(8)
    speed[2] = 0.5
    placed = (PlacementOrder("q", (256, 257, 258, 259)),)
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = 3
    d1 = _decision(snap, card_level=lvl, supply_temp_c=35.0, rack_pump_speed_frac=speed, placements=placed)
    first = book.commands(d1, snap, NO_APPLIED, NOW)
    assert len(first) == 4
    for oc in first:
        oc.attempts, oc.first_sent_s, oc.last_sent_s = 2, NOW, NOW + 10.0
    opened, holds = dict(book.open), book.overlays.holds()

    lvl2, speed2 = lvl.copy(), speed.copy()
    lvl2[0:4] = 5  # half of the level command's cards: it is superseded whole
    speed2[2] = 0.6
    d2 = _decision(snap, card_level=lvl2, supply_temp_c=36.0, rack_pump_speed_frac=speed2, placements=placed)
    second = book.commands(d2, snap, NO_APPLIED, NOW + 12.0)
    assert sum(oc.superseded_by is not None for oc in first) == 3  # (the same placement is kept)
    seqs = [json.loads(oc.payload)["seq"] for oc in second]
    book.undo(second)
    assert book.open == opened and all(book.open[oc.command_id] is oc for oc in first)
    assert [(oc.expires_s, oc.attempts, oc.last_sent_s, oc.superseded_by) for oc in first] == [
        (NOW + TTL_S, 2, NOW + 10.0, None)
    ] * 4
    assert book.take_superseded() == []
    after = book.overlays.holds()
    for name in ("value", "until", "key", "pump_sent"):
        assert np.array_equal(getattr(after, name), getattr(holds, name)), name
    assert (after.setpoint, after.placing, after.pump) == (holds.setpoint, holds.placing, holds.pump)
    # what they set is held: the same decision at their time commands nothing
    assert book.diff(d1, snap, NO_APPLIED, NOW + 12.0) == []

    again = book.commands(d2, snap, NO_APPLIED, NOW + 12.0)
    assert [json.loads(oc.payload)["seq"] for oc in again] == seqs
    gone = book.take_superseded()
    assert {oc.command_id for oc in gone} == {oc.command_id for oc in first if oc.target != "scheduler"}
    with pytest.raises(RuntimeError):
        book.undo(again)  # not the book's last change any more: the superseded were taken


def test_undo_of_a_decision_placing_a_new_job_leaves_the_job_to_be_placed_again(
    scene: tuple[SiteSpec, StateSnapshot],
) -> None:
    """A decision the journal refused placed a job no command placed before: after ``CommandBook.undo``
    no placement of it is on its way, so the next decision places it at once (held as on its way, the
    job would wait out the undone command's life, ``command_ttl_s``, unplaced)."""
    site, snap = scene
    book, codec = _book(site)
    placed = (PlacementOrder("q", (256, 257, 258, 259)),)
    undone = book.commands(_decision(snap, placements=placed), snap, NO_APPLIED, NOW)
    assert [oc.target for oc in undone] == ["scheduler"]
    book.undo(undone)
    assert book.overlays.placing == {}
    (again,) = book.commands(_decision(snap, placements=placed), snap, NO_APPLIED, NOW + 1.0)
    msg = codec.decode(again.topic, again.payload)
    assert isinstance(msg, wire.SchedulerCommand) and msg.job_id == "q"


def test_undo_gives_back_the_issue_time_its_commands_took(scene: tuple[SiteSpec, StateSnapshot]) -> None:
    """Issue times never go back while a rack accepts the newest one given (``stamp_hold_s``, 5 s):
    an undone decision's commands never reach a rack, so their issue time is given back with them.
    The next decision, after the clock stepped back a second, is stamped at its own time, as it would
    have been without the undone one (held to it, its commands carried a time no rack saw)."""
    site, snap = scene
    book, codec = _book(site)
    book.commands(_cards_0_to_7_at(snap, 3), snap, NO_APPLIED, NOW - 10.0)
    book.undo(book.commands(_cards_0_to_7_at(snap, 4), snap, NO_APPLIED, NOW))
    (oc,) = book.commands(_cards_0_to_7_at(snap, 4), snap, NO_APPLIED, NOW - 1.0)
    msg = codec.decode(oc.topic, oc.payload)
    assert isinstance(msg, wire.RackCommand) and msg.ts_s == NOW - 1.0
