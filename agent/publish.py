"""Decisions -> commands on the wire, and the commands' lives until they are acknowledged.

:class:`CommandBook` turns a guarded :class:`agent.decision.Decision` into the commands that change
what differs from what the racks have: per rack and setting one ``racktwin.rack_cmd/1`` (a DVFS level
per distinct level, low-power idle, wake, and ONE power-limit command per rack and direction whose
``power_limit_watts`` is a value per card when the cards' limits differ: a rack gets a handful of
commands per decision, not one per distinct limit), one ``racktwin.facility_cmd/1`` for a new
set-point, one ``racktwin.scheduler_cmd/1`` per placement, one ``racktwin.cdu_cmd/1`` per rack whose
pump speed changes (and, for a slowed pump, again every ``pump_renew_s``: the plant returns a pump to
full speed when no command renews it). Where the decision manages hosts (``Decision.host_off``), one
``host_power_off`` per rack listing every card of the hosts to switch off that the racks report on
(never a host with a busy card: the plant would refuse it) and one ``host_power_on`` for hosts to
switch on that are reported off; the cards of hosts that are (to be) off get no low-power idle or
wake (they are asleep with their host; a wake would boot it). A card whose host is reported or
commanded off counts as asleep whatever the racks last said of the card: a host powered on again
boots with its cards asleep, so they get a wake after the power-on where the decision wants them
awake, and never a sleep (which the rack, its host still off, would refuse). "What the racks have" is what they
report (telemetry, retained applied state) overlaid with the agent's own open commands until they
expire, so a command is not repeated every period while telemetry catches up. Commands that lower
power (slower levels, lower limits, host power-off, sleep, faster pumps) come first, then the set-point
and placements, then the ones that raise power or die temperatures (faster levels, host power-on,
wake, slower pumps): a rack applies its commands in order, so it never passes through a state above
both plans.

Every command carries a fresh id, its issue time and an absolute expiry (``command_ttl_s`` later,
site time, at most ``wire.MAX_COMMAND_TTL_S``: a rack refuses a longer life), goes at QoS 1 and is
never retained (``agent.wire``). Issue times never go back: when the agent's clock steps back (it ran
ahead of a site that slowed during a silence: ``agent.clock``), the next commands keep the newest
issue time given so far, ordered after it by ``seq``, so that racks do not refuse them as
``superseded`` by the agent's own earlier commands until the site's clock has caught up (seen: 45
site s of refusals at 20x). The hold is bounded by how far ahead of its clock a rack accepts a
command (half of it: :meth:`CommandBook.stamp_hold_s`); a larger step back (a restarted simulator,
a clock set back by hours) stamps the clock's time again. Commands re-opened from the journal after
a restart count as given. The book keeps each open command (topic, payload, expiry, attempts).
An ack ``applied`` closes it; ``rejected`` or ``expired`` closes it and lets the next decision try
again (after ``command_ttl_s`` for a rejected setting of a card, so that a refusal is not repeated
every period; at once, less the failed card, when a card of the refused command reads failed since:
a rack refuses a command whole for one failed card; at once for a refusal as ``superseded``: the
rack holds a newer command). Cards of hosts that are (reported or commanded) off get no level or
power-limit commands: the rack cannot reach them and refuses them (``host_off``); the next decision
after the host is on sends them. Nor do the cards of hosts the same decision powers off (a faster
level after the power-off would be refused). The same diff, unregistered, is the advice of advisory mode
(:meth:`CommandBook.advice`).

A newer command for what an open command sets (a card's level, its power limit, its power state: a
sleep or wake an older sleep or wake, a host power command an older one or a sleep or wake of its
cards; a rack's pump; the set-point) supersedes it: the open one is closed at once
(:attr:`CommandBook.superseded`, ``superseded`` to the publisher) and never sent again, not even for
its cards the newer one does not list (their overlay is cleared: the next decision commands them
again unless the racks report them so). A retry of an old command after a newer one would otherwise
undo the newer one on a rack that applies what it gets (acks lost to a broker ACL: re-sends put 16
cards back at full clock and the rack 2% over its limit); a rack that follows docs/protocol.md
refuses such an old command (``superseded``) anyway.

:class:`Publisher` sends what the book hands it, in order and pipelined (a batch of up to the client's
in-flight window is handed to the client at once and the broker's PUBACKs are awaited together, so a
decision's commands leave within one round trip instead of one round trip each), and retries: a command not acknowledged
``command_ttl_s / (command_retries + 1)`` after it was sent is sent again, at most
``command_retries`` times, never after its expiry; every open command is sent again after the broker
connection comes back (a broker restarted without persistence forgets what it had not delivered).
The sends of a batch are journaled in one transaction (``Journal.mark_sent``) after the broker
acknowledged them; the commands themselves were journaled before, with their decision. A journal
write of the publisher that fails (a full disk: ``JournalError``) does not stop it: the commands were
journaled before they were sent, so what is lost is their record of being sent, expired or abandoned
(a restarted agent sends again what its journal still has open and valid, and closes the rest).
A command superseded by a newer one is journaled ``superseded``, counted in
:attr:`PublishStats.superseded` and reported as closed ``superseded``. A command closed without
an ack although it went out a retry interval before (expired, abandoned or superseded) is an ack
missing: counted per target (:attr:`Publisher.acks_missing`) and logged as a warning, at
most once a minute per target (acks dropped by a broker ACL are otherwise silent), unless the
target has been silent since the command first went out (``heard_since``: its telemetry stopped
too, which has its own signs: stale telemetry, fail-safe caps; a simulator that ended).
The failure is logged once and kept in :attr:`Publisher.journal_errors` (the service's ``/readyz``)
until the same write succeeds again (any error, once a batch is marked sent); for 2 s after a failure
the publisher does not try its journal writes (each try may wait for SQLite's busy timeout).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.aio import wait_event
from agent.bus import Bus, BusError, BusNotConnected, BusPubackTimeout
from agent.clock import SiteClock
from agent.config import ControlConfig
from agent.decision import Decision
from agent.journal import Journal, JournalError, NewCommand
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["CommandBook", "OpenCommand", "Publisher", "new_commands"]

log = logging.getLogger("racktwin.agent.publish")

_LEVEL, _SLEEP, _LIMIT, _HOST = 0, 1, 2, 3
_N_OVERLAYS = 4
#: the open commands a newer one of a kind supersedes on its cards: those of the kinds that set the
#: same (docs/protocol.md: a card's DVFS level, its power limit, its power state). A host power command
#: also overrides the sleep or wake of its cards; a sleep or wake does not make a host command
#: obsolete (a decision powers a host on, then wakes cards of it)
_SUPERSEDES = {_LEVEL: (_LEVEL,), _LIMIT: (_LIMIT,), _SLEEP: (_SLEEP,), _HOST: (_SLEEP, _HOST)}

Command = wire.RackCommand | wire.CduCommand | wire.FacilityCommand | wire.SchedulerCommand
#: (overlay kind or -1, command, whether it lowers power)
Item = tuple[int, Command, bool]
_LIMIT_TOL_W = 0.5


@dataclass(frozen=True)
class _HostChanges:
    """What one :meth:`CommandBook.diff` does to hosts: per host, whether to power it off or on now,
    and whether the decision wants it off."""

    off: BoolArray
    on: BoolArray
    wanted_off: BoolArray


@dataclass
class _Outbox:
    """The commands of one :meth:`CommandBook.diff` as it builds them, in three groups sent in this
    order: those that lower power, the set-point and placements, those that raise power."""

    now_s: float
    expires_s: float
    low: list[Item] = field(default_factory=list)
    mid: list[Item] = field(default_factory=list)
    high: list[Item] = field(default_factory=list)


@dataclass
class OpenCommand:
    """A command the book is waiting on (sent or about to be)."""

    command_id: str
    target: str  # rack name, "facility" or "scheduler"
    topic: str
    payload: bytes
    issued_s: float
    expires_s: float
    kind: int = -1  # _LEVEL / _SLEEP / _LIMIT / _HOST for rack commands, -1 otherwise
    cards: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    key: int = 0
    attempts: int = 0
    first_sent_s: float = -math.inf  # site time of its first send by this process
    last_sent_s: float = -math.inf
    acked: bool = False
    superseded_by: str | None = None  # the newer command that closed it


def new_commands(opens: Iterable[OpenCommand]) -> list[NewCommand]:
    """The journal's view of commands (an id, a target, a topic and bytes)."""
    return [NewCommand(o.command_id, o.target, o.topic, o.payload, o.issued_s, o.expires_s) for o in opens]


#: acked command ids the book remembers, to tell a repeated ack from a late one (a few hours of a site)
_ACKED_KEPT = 100_000


class CommandBook:
    """Commands from decisions and their acks (see the module docstring)."""

    def __init__(
        self,
        site: SiteSpec,
        codec: wire.Codec,
        control: ControlConfig,
        publisher: str = "agent",
        site_rate: Callable[[], float] | None = None,
    ) -> None:
        """``site_rate``: site seconds per wall second as the site clock measures them (the service
        passes its ``SiteClock``'s); None: ``1 / control.time_scale``."""
        self.site = site
        self.codec = codec
        self.control = control
        self._site_rate = site_rate
        self.sequencer = wire.Sequencer(publisher)
        n = site.n_cards
        self._cpr = site.cards_per_rack
        self._card_rack = site.card_rack()
        self._names = site.rack_names
        # overlays: what our open commands will have set, until when, and which command set it
        # (_HOST: per card, whether the card's host is (to be) off; a host command covers all its cards)
        self._ov_value = np.zeros((_N_OVERLAYS, n))
        self._ov_until = np.full((_N_OVERLAYS, n), -math.inf)
        self._ov_key = np.zeros((_N_OVERLAYS, n), dtype=np.int64)
        self._backoff = np.full((_N_OVERLAYS, n), -math.inf)
        self._refused_key = np.zeros((_N_OVERLAYS, n), dtype=np.int64)  # the refused command of a backoff
        # when a rack refused a command because these cards had failed (its ack's stamp): a card counts
        # as failed until a reading of it newer than that shows what it is (a silent rack shows nothing)
        self._failed_by_ack_s = np.full(n, -math.inf)
        self._card_host = site.card_host()
        self._sp: tuple[float, float, int] | None = None  # set-point, until, key
        self._placing: dict[str, tuple[float, int]] = {}  # job id -> until, key
        self._pump: dict[int, tuple[float, float, int]] = {}  # rack -> speed, until, key
        self._pump_sent = np.full(site.n_racks, -math.inf)  # rack -> when its last pump command was issued
        self._last_stamp_s = -math.inf  # the newest issue time given to a command
        self._acked: dict[str, None] = {}  # the ids of the last commands acked, oldest first
        self.open: dict[str, OpenCommand] = {}
        self._by_key: dict[int, OpenCommand] = {}  # the open commands by key
        #: open commands closed by a newer one for what they set, not yet taken (:meth:`take_superseded`)
        self.superseded: list[OpenCommand] = []
        self._next_key = 1

    # ---- what differs -------------------------------------------------------------------------
    def _have(self, kind: int, reported: FloatArray, now_s: float) -> FloatArray:
        live = self._ov_until[kind] > now_s
        return np.where(live, self._ov_value[kind], reported)

    def diff(self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float) -> list[Item]:
        """The commands the decision needs, as ``(kind, message, lowers_power)``, lowering first."""
        # after the site clock stepped back, a mark from the old timeline dates from now at the latest
        # (the belief's last-seen times were moved back too), so that a reading on the new one clears it
        np.minimum(self._failed_by_ack_s, now_s, out=self._failed_by_ack_s)
        said_failed = self._failed_by_ack_s > np.nan_to_num(snap.card_last_seen_s, nan=-math.inf)
        alive = ~(np.asarray(decision.card_failed, dtype=bool) | np.asarray(snap.card_failed, dtype=bool) | said_failed)
        ttl = min(self.control.command_ttl_s, wire.MAX_COMMAND_TTL_S)  # a rack refuses a longer life
        out = _Outbox(now_s=now_s, expires_s=now_s + ttl)
        self._lift_refusals_a_failure_explains(~alive, now_s)
        ok_now = self._backoff <= now_s
        # the cards of hosts that are (or are commanded) off: a rack refuses their levels and limits
        # (host_off: the card cannot be reached); sent once the host is on. Nor do the cards of hosts
        # this diff powers off get any (a raise would come after the power-off and be refused)
        host_off_now = np.zeros(self.site.n_cards, dtype=bool)
        if self.site.hosts_managed:
            host_off_now = self._have(_HOST, np.asarray(snap.card_host_off, dtype=np.float64), now_s) > 0.5
        hosts = self._host_changes(decision, host_off_now, ok_now[_HOST])
        reachable = alive & ~host_off_now
        if hosts is not None:
            reachable &= ~hosts.off[self._card_host]
        self._level_items(out, decision, snap, applied_level, reachable & ok_now[_LEVEL])
        self._limit_items(out, decision, snap, reachable & ok_now[_LIMIT])
        host_cards = self._host_items(out, hosts)
        self._sleep_items(out, decision, snap, alive & ~host_cards & ok_now[_SLEEP], host_off_now)
        self._setpoint_item(out, decision, snap)
        self._pump_items(out, decision, snap)
        self._placement_items(out, decision)
        return out.low + out.mid + out.high

    def _rack_commands(
        self, out: _Outbox, cards: IntArray, values: FloatArray, make: Callable[[float], wire.CardSetting]
    ) -> list[wire.RackCommand]:
        """One command per rack and distinct value among ``cards``."""
        res: list[wire.RackCommand] = []
        for r in np.unique(self._card_rack[cards]):
            in_r = cards[self._card_rack[cards] == r]
            vals = values[in_r]
            for v in np.unique(vals):
                sel = in_r[vals == v]
                res.append(self._rack_command(out, int(r), sel, make(float(v))))
        return res

    def _rack_command(self, out: _Outbox, rack: int, cards: IntArray, setting: wire.CardSetting) -> wire.RackCommand:
        local = tuple(int(c) - rack * self._cpr for c in cards)
        return wire.RackCommand(
            rack=self._names[rack],
            cards=local,
            setting=setting,
            command_id=uuid.uuid4(),
            expires_s=out.expires_s,
            ts_s=out.now_s,
            seq=0,
            publisher=self.sequencer.publisher,
        )

    def _level_items(
        self, out: _Outbox, decision: Decision, snap: StateSnapshot, applied_level: IntArray, may: BoolArray
    ) -> None:
        """DVFS levels of the cards that ``may`` get one and whose level is not the decision's."""
        reported_lv = np.where(applied_level >= 0, applied_level, snap.card_level).astype(np.float64)
        have_lv = self._have(_LEVEL, reported_lv, out.now_s)
        want_lv = decision.card_level.astype(np.float64)
        moved = may & (want_lv != have_lv)
        dvfs = lambda v: wire.CardSetting.dvfs(int(v))  # noqa: E731
        slower = self._rack_commands(out, np.flatnonzero(moved & (want_lv > have_lv)), want_lv, dvfs)
        faster = self._rack_commands(out, np.flatnonzero(moved & (want_lv < have_lv)), want_lv, dvfs)
        out.low += [(_LEVEL, cmd, True) for cmd in slower]
        out.high += [(_LEVEL, cmd, False) for cmd in faster]

    def _limit_items(self, out: _Outbox, decision: Decision, snap: StateSnapshot, may: BoolArray) -> None:
        """Power limits: one command per rack and direction, the cards' limits as one value or one per
        card."""
        rep_lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
        rep_lim = np.where(np.isfinite(rep_lim), rep_lim, self.site.card.power_limit_w)
        have_lim = self._have(_LIMIT, rep_lim, out.now_s)
        # to 0.1 W, rounded down (a limit is never raised by its encoding)
        want_lim = np.asarray(np.floor(decision.card_power_limit_w * 10.0 + 1e-6) / 10.0, dtype=np.float64)
        changed = may & (np.abs(want_lim - have_lim) > _LIMIT_TOL_W)
        for lowers, cards in (
            (True, np.flatnonzero(changed & (want_lim < have_lim))),
            (False, np.flatnonzero(changed & (want_lim > have_lim))),
        ):
            for r in np.unique(self._card_rack[cards]):
                sel = cards[self._card_rack[cards] == r]
                vals = want_lim[sel]
                one = bool(np.all(vals == vals[0]))
                setting = wire.CardSetting.power_limit(float(vals[0]) if one else [float(v) for v in vals])
                (out.low if lowers else out.high).append(
                    (_LIMIT, self._rack_command(out, int(r), sel, setting), lowers)
                )

    def _host_changes(self, decision: Decision, host_off_now: BoolArray, may: BoolArray) -> _HostChanges | None:
        """The hosts to power off and on (whole hosts whose cards ``may`` get a command; never a host
        with a busy card: the plant would refuse it), from what the racks have (``host_off_now``, per
        card: reported or commanded off); None when the decision does not manage hosts."""
        if decision.host_off is None or not self.site.hosts_managed:
            return None
        n_h, cph = self.site.n_hosts, self.site.cards_per_host
        want_off = np.asarray(decision.host_off, dtype=bool).reshape(n_h)
        have_off = host_off_now.reshape(n_h, cph)
        host_ok = may.reshape(n_h, cph).all(axis=1)
        busy = np.asarray(decision.card_busy, dtype=bool).reshape(n_h, cph).any(axis=1)
        return _HostChanges(
            off=want_off & ~have_off.all(axis=1) & ~busy & host_ok,
            on=~want_off & have_off.any(axis=1) & host_ok,
            wanted_off=want_off,
        )

    def _host_items(self, out: _Outbox, hosts: _HostChanges | None) -> BoolArray:
        """Host power: whole hosts, one command per rack and direction. Returns, per card, whether its
        host is wanted off (a host being or staying off gets no sleep or wake for its cards: they are
        asleep; a wake would boot it)."""
        n = self.site.n_cards
        if hosts is None:
            return np.zeros(n, dtype=bool)
        ones_n = np.ones(n, dtype=np.float64)
        off_cards = np.flatnonzero(hosts.off[self._card_host])
        on_cards = np.flatnonzero(hosts.on[self._card_host])
        out.low += [(_HOST, c, True) for c in self._rack_commands(out, off_cards, ones_n, _host_off)]
        out.high += [(_HOST, c, False) for c in self._rack_commands(out, on_cards, ones_n, _host_on)]
        return np.asarray(hosts.wanted_off[self._card_host], dtype=bool)

    def _sleep_items(
        self, out: _Outbox, decision: Decision, snap: StateSnapshot, may: BoolArray, host_off: BoolArray
    ) -> None:
        """Low-power idle and wake for the cards that ``may`` get one. A card whose host is (reported
        or commanded) ``host_off`` is asleep with it, whatever the racks last reported of the card (a
        host powered on boots with its cards asleep): it gets no sleep, which its rack would refuse,
        and, where the decision wants it awake and powers its host on, a wake after the power-on."""
        have_lp = self._have(_SLEEP, np.asarray(snap.card_low_power, dtype=np.float64), out.now_s) > 0.5
        have_lp |= host_off
        want_lp = np.asarray(decision.card_low_power, dtype=bool)
        sleep = np.flatnonzero(may & want_lp & ~have_lp & ~decision.card_busy)
        wake = np.flatnonzero(may & ~want_lp & have_lp)
        ones_n = np.ones(self.site.n_cards, dtype=np.float64)
        asleep = self._rack_commands(out, sleep, ones_n, lambda v: wire.CardSetting.low_power_idle())
        woken = self._rack_commands(out, wake, ones_n, lambda v: wire.CardSetting.wake())
        out.low += [(_SLEEP, cmd, True) for cmd in asleep]
        out.high += [(_SLEEP, cmd, False) for cmd in woken]

    def _setpoint_item(self, out: _Outbox, decision: Decision, snap: StateSnapshot) -> None:
        """A new supply set-point, when the decision's differs from what the facility has."""
        fac = snap.facility
        have_sp = fac.supply_setpoint_c if fac is not None else math.nan
        if self._sp is not None and self._sp[1] > out.now_s:
            have_sp = self._sp[0]
        if not math.isfinite(decision.supply_temp_c) or abs(decision.supply_temp_c - have_sp) <= 0.01:
            return
        fc = wire.FacilityCommand(
            supply_setpoint_c=float(decision.supply_temp_c),
            command_id=uuid.uuid4(),
            expires_s=out.expires_s,
            ts_s=out.now_s,
            seq=0,
            publisher=self.sequencer.publisher,
        )
        out.mid.append((-1, fc, decision.supply_temp_c < have_sp))

    def _pump_items(self, out: _Outbox, decision: Decision, snap: StateSnapshot) -> None:
        """Pump speeds: a change, or a slowed pump's renewal (faster pumps lower die temperatures)."""
        if decision.rack_pump_speed_frac is None:
            return
        reported = np.asarray(snap.rack_pump_speed_frac, dtype=np.float64)
        renew = self.control.pump_renew_s
        for r, want in enumerate(np.asarray(decision.rack_pump_speed_frac, dtype=np.float64).tolist()):
            pump_held = self._pump.get(r)
            have = pump_held[0] if pump_held is not None and pump_held[1] > out.now_s else float(reported[r])
            due = want < 1.0 and out.now_s - self._pump_sent[r] >= renew
            if abs(want - have) <= 0.005 and not due:
                continue
            cc = wire.CduCommand(
                rack=self._names[r],
                pump_speed_frac=float(want),
                command_id=uuid.uuid4(),
                expires_s=out.expires_s,
                ts_s=out.now_s,
                seq=0,
                publisher=self.sequencer.publisher,
            )
            (out.low if want > have else out.high).append((-1, cc, want > have))

    def _placement_items(self, out: _Outbox, decision: Decision) -> None:
        """One scheduler command per placement not already on its way."""
        for o in decision.placements:
            held = self._placing.get(o.job_id)
            if held is not None and held[0] > out.now_s:
                continue
            by_rack: dict[str, list[int]] = {}
            for c in o.cards:
                r = int(self._card_rack[c])
                by_rack.setdefault(self._names[r], []).append(int(c) - r * self._cpr)
            sc = wire.SchedulerCommand(
                job_id=o.job_id,
                cards={k: tuple(v) for k, v in by_rack.items()},
                command_id=uuid.uuid4(),
                expires_s=out.expires_s,
                ts_s=out.now_s,
                seq=0,
                publisher=self.sequencer.publisher,
            )
            out.mid.append((-1, sc, False))

    # ---- enforce mode -----------------------------------------------------------------------------
    def stamp_hold_s(self) -> float:
        """How far a command's issue time may stay ahead of the agent's clock after the clock stepped
        back: half of how far ahead of its clock a rack accepts one (``wire.MAX_ISSUE_AHEAD_S``; a
        simulator at ``speed`` x accepts ten wall seconds of its site time: ``sim.runner``), at the
        slower of the configured and the measured rate (the agent's clock may still run a little
        ahead of the rack's)."""
        rate = 1.0 / self.control.time_scale
        if self._site_rate is not None:
            rate = min(rate, self._site_rate())
        return 0.5 * max(wire.MAX_ISSUE_AHEAD_S, wire.MAX_ISSUE_AHEAD_S * rate)

    def _stamp(self, now_s: float) -> float:
        """The issue time of commands made at ``now_s``: never before the newest one given (within
        :meth:`stamp_hold_s`)."""
        last = self._last_stamp_s
        stamp = last if now_s < last <= now_s + self.stamp_hold_s() else now_s
        self._last_stamp_s = stamp
        return stamp

    def commands(
        self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float
    ) -> list[OpenCommand]:
        """The commands of a decision, encoded, registered as open (overlays set); send in order."""
        out: list[OpenCommand] = []
        items = self.diff(decision, snap, applied_level, now_s)
        stamp = self._stamp(now_s) if items else now_s
        for kind, msg, _low in items:
            if stamp != now_s:  # the clock stepped back: the newest issue time, the same life
                msg = dataclasses.replace(msg, ts_s=stamp, expires_s=msg.expires_s + (stamp - now_s))
            msg = _with_seq(msg, self.sequencer.next(self.codec.topic_for(msg)))
            o = self.codec.outgoing(msg)
            target = (
                msg.rack
                if isinstance(msg, wire.RackCommand | wire.CduCommand)
                else (wire.FACILITY if isinstance(msg, wire.FacilityCommand) else wire.SCHEDULER)
            )
            oc = OpenCommand(str(msg.command_id), target, o.topic, o.payload, now_s, msg.expires_s, kind=kind)
            self._register(oc, msg)
            out.append(oc)
        return out

    def _register(self, oc: OpenCommand, msg: Command) -> None:
        key = self._next_key
        self._next_key += 1
        oc.key = key
        if isinstance(msg, wire.RackCommand):
            r = self.site.rack_names.index(msg.rack)
            cards = np.asarray(msg.cards, dtype=np.int64) + r * self._cpr
            oc.cards = cards
            s = msg.setting
            value: float | FloatArray
            if s.action is wire.CardAction.SET_DVFS_LEVEL:
                kind, value = _LEVEL, float(s.dvfs_level or 0)
            elif s.action is wire.CardAction.SET_POWER_LIMIT:
                kind, value = _LIMIT, np.asarray(s.limits_w(cards.size), dtype=np.float64)
            elif s.action is wire.CardAction.LOW_POWER_IDLE:
                kind, value = _SLEEP, 1.0
            elif s.action is wire.CardAction.WAKE:
                kind, value = _SLEEP, 0.0
            elif s.action is wire.CardAction.HOST_POWER_OFF:
                kind, value = _HOST, 1.0
            elif s.action is wire.CardAction.HOST_POWER_ON:
                kind, value = _HOST, 0.0
            else:  # pragma: no cover - the agent sends no clock ranges
                kind, value = -1, 0.0
            oc.kind = kind
            if kind >= 0:
                for k in _SUPERSEDES[kind]:
                    self._supersede(self._ov_key[k, cards], oc)
                self._ov_value[kind, cards] = value
                self._ov_until[kind, cards] = msg.expires_s
                self._ov_key[kind, cards] = key
        elif isinstance(msg, wire.CduCommand):
            r = self.site.rack_names.index(msg.rack)
            pump = self._pump.get(r)
            if pump is not None:
                self._supersede([pump[2]], oc)
            self._pump[r] = (msg.pump_speed_frac, msg.expires_s, key)
            self._pump_sent[r] = max(self._pump_sent[r], msg.ts_s)
        elif isinstance(msg, wire.FacilityCommand):
            if self._sp is not None:
                self._supersede([self._sp[2]], oc)
            self._sp = (msg.supply_setpoint_c, msg.expires_s, key)
        else:
            self._placing[msg.job_id] = (msg.expires_s, key)
        self.open[oc.command_id] = oc
        self._by_key[key] = oc

    def _supersede(self, keys: Iterable[int] | IntArray, newer: OpenCommand) -> None:
        """Close the open commands of ``keys`` (those that last set what ``newer`` sets): they are
        never sent again (see the module docstring), and go to :attr:`superseded`."""
        for key in np.unique(np.asarray(keys, dtype=np.int64)).tolist():
            old = self._by_key.get(key)
            if old is None or old is newer:
                continue
            del self.open[old.command_id]
            self.forget(old)
            old.superseded_by = newer.command_id
            self.superseded.append(old)

    def take_superseded(self) -> list[OpenCommand]:
        """The commands superseded since the last call (the publisher journals and counts them)."""
        gone, self.superseded = self.superseded, []
        return gone

    def acked_before(self, command_id: str) -> bool:
        """Whether one of the last ``_ACKED_KEPT`` commands acked had this id: a second ack for it
        answers a copy sent again (or is the broker's second delivery)."""
        return command_id in self._acked

    def resume(self, commands: Iterable[tuple[str, str, str, bytes, float, float, int]]) -> list[OpenCommand]:
        """Re-open journaled commands after a restart: ``(id, target, topic, payload, issued, expires,
        attempts)``; their overlays are set again. Returns them (to be sent again)."""
        out: list[OpenCommand] = []
        for cid, target, topic, payload, issued, expires, attempts in commands:
            msg = self.codec.decode(topic, payload)
            if not isinstance(msg, wire.RackCommand | wire.CduCommand | wire.FacilityCommand | wire.SchedulerCommand):
                continue
            oc = OpenCommand(cid, target, topic, payload, issued, expires, attempts=attempts)
            self._register(oc, msg)
            self._last_stamp_s = max(self._last_stamp_s, msg.ts_s)  # the next ones are not issued before them
            out.append(oc)
        return out

    def on_ack(self, ack: wire.Acknowledgement, now_s: float) -> OpenCommand | None:
        """An ack for one of ours closes it (None for an unknown id, or one acked before:
        :meth:`acked_before`). A refusal or a late arrival clears what the command would have set, so
        the next decision tries again (a refused card setting after ``command_ttl_s``, unless the rack
        refused it as ``superseded``)."""
        oc = self.open.pop(str(ack.command_id), None)
        if oc is None:
            return None
        self._acked[oc.command_id] = None
        if len(self._acked) > _ACKED_KEPT:
            del self._acked[next(iter(self._acked))]
        oc.acked = True
        self._by_key.pop(oc.key, None)
        if ack.result is not wire.AckResult.APPLIED:
            self.forget(oc)
            held = wire.reason_code(ack.reason) != wire.AckReason.SUPERSEDED  # the rack holds a newer one
            if ack.result is wire.AckResult.REJECTED and oc.kind >= 0 and held:
                mine = oc.cards
                self._backoff[oc.kind, mine] = now_s + self.control.command_ttl_s
                self._refused_key[oc.kind, mine] = oc.key
                self._note_failed(oc, ack, now_s)
        return oc

    def _note_failed(self, oc: OpenCommand, ack: wire.Acknowledgement, now_s: float) -> None:
        """A ``card_failed`` refusal names the command's dead cards: they count as failed (the next
        decision's commands leave them out, and the refusal no longer holds the others back) until a
        reading of them newer than the ack. A card may fail unseen: its rack silent (the fail-safe caps
        of a silent rack were refused every ``command_ttl_s`` for the whole silence) or after the
        reading the decision used."""
        local = [c for c in wire.failed_cards_of(ack.reason) if 0 <= c < self._cpr]
        if not local or not oc.cards.size:
            return
        named = np.asarray(local, dtype=np.int64) + int(self._card_rack[oc.cards[0]]) * self._cpr
        dead = named[np.isin(named, oc.cards)]
        # never later than the agent's clock: an ack stamped ahead would hold the mark past readings
        # that show the card alive (the belief refuses readings stamped that far ahead)
        stamp = min(ack.ts_s, now_s) if math.isfinite(ack.ts_s) else now_s
        self._failed_by_ack_s[dead] = np.maximum(self._failed_by_ack_s[dead], stamp)

    def _lift_refusals_a_failure_explains(self, failed: BoolArray, now_s: float) -> None:
        """A rack refuses a command whole when one of its cards has failed, and the card may fail
        after the reading the command was decided on: once a card of a refused command reads failed,
        the refusal is explained and the command's other cards are not held back for the rest of
        their backoff (the decision leaves the failed card out)."""
        held = self._backoff > now_s
        explained = held & failed[np.newaxis, :]
        if not explained.any():
            return
        for kind in range(_N_OVERLAYS):
            keys = np.unique(self._refused_key[kind, explained[kind]])
            if keys.size:
                self._backoff[kind, held[kind] & np.isin(self._refused_key[kind], keys)] = -math.inf

    def forget(self, oc: OpenCommand) -> None:
        """Forget what a closed command would have set (what it alone set: not what a newer command
        set since). The caller has taken it out of :attr:`open` (expired, abandoned, not journaled)."""
        if self._by_key.get(oc.key) is oc:
            del self._by_key[oc.key]
        if oc.kind >= 0 and oc.cards.size:
            mine = oc.cards[self._ov_key[oc.kind, oc.cards] == oc.key]
            self._ov_until[oc.kind, mine] = -math.inf
        if self._sp is not None and self._sp[2] == oc.key:
            self._sp = None
        for r, (_speed, _until, key) in list(self._pump.items()):
            if key == oc.key:
                del self._pump[r]
                self._pump_sent[r] = -math.inf  # not applied: send again at the next decision
        for jid, (_until, key) in list(self._placing.items()):
            if key == oc.key:
                del self._placing[jid]

    def expire(self, now_s: float) -> list[OpenCommand]:
        """Close open commands past their expiry without an ack (returned)."""
        gone = [oc for oc in self.open.values() if oc.expires_s <= now_s]
        for oc in gone:
            del self.open[oc.command_id]
            self.forget(oc)
        return gone

    # ---- advisory mode ----------------------------------------------------------------------------
    def advice(
        self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float
    ) -> wire.AgentAdvice:
        """What enforce mode would command now, as advice (nothing is registered)."""
        items: list[wire.AdviceItem] = []
        setpoint: float | None = None
        placements: list[wire.Placement] = []
        pumps: dict[str, float] = {}
        saved = (self._ov_until.copy(), self._sp, dict(self._placing))
        for _kind, msg, _low in self.diff(decision, snap, applied_level, now_s):
            if isinstance(msg, wire.RackCommand):
                items.append(wire.AdviceItem(msg.rack, msg.cards, msg.setting))
            elif isinstance(msg, wire.CduCommand):
                pumps[msg.rack] = msg.pump_speed_frac
            elif isinstance(msg, wire.FacilityCommand):
                setpoint = msg.supply_setpoint_c
            else:
                placements.append(wire.Placement(msg.job_id, msg.cards))
        self._ov_until, self._sp, self._placing = saved
        fs = ", ".join(self._names[r] for r in decision.failsafe_racks)
        summary = (
            f"cycle {decision.cycle}: {decision.status} ({decision.source}), supply {decision.supply_temp_c:g} deg C"
            + (f", fail-safe {fs}" if fs else "")
        )
        return wire.AgentAdvice(
            items=tuple(items),
            ts_s=now_s,
            seq=self.sequencer.next(self.codec.topics.advice),
            publisher=self.sequencer.publisher,
            supply_setpoint_c=setpoint,
            placements=tuple(placements),
            predicted_it_power_w=_finite(decision.predicted_it_power_w),
            predicted_facility_power_w=_finite(decision.predicted_facility_power_w),
            summary=summary[:1024],
            pump_speeds=pumps,
        )


def _host_off(_v: float) -> wire.CardSetting:
    return wire.CardSetting.host_power_off()


def _host_on(_v: float) -> wire.CardSetting:
    return wire.CardSetting.host_power_on()


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) and x >= 0 else None


def _with_seq(msg: Command, seq: int) -> Command:
    return dataclasses.replace(msg, seq=seq)


# --------------------------------------------------------------------------------------------------
# Sending
# --------------------------------------------------------------------------------------------------


@dataclass
class PublishStats:
    sent: int = 0
    retried: int = 0
    unacked_expired: int = 0  # expired before any ack (lost or unanswered)
    abandoned: int = 0  # retries exhausted
    superseded: int = 0  # closed unacked by a newer command for what they set (never sent again)
    acks_missing: int = 0  # closed without an ack (of the above) although sent a retry interval before
    not_connected_waits: int = 0
    unconfirmed: int = 0  # sends the broker did not acknowledge within puback_timeout_s (counted in sent)


class Publisher:
    """Sends open commands in order, retries the unacknowledged ones (see the module docstring).

    ``on_sent(command, retry)``, ``on_closed(command, why)`` (closed without an ack: ``why`` is
    ``unacked`` (expired), ``abandoned`` or ``superseded``) and ``on_unconfirmed(command)`` report to
    the caller (metrics). ``heard_since(target, site_s)``: whether the target (a rack) sent anything
    stamped after ``site_s`` (the service's belief; without it every target counts as heard).

    A send whose PUBACK does not come within :attr:`puback_timeout_s` (an overloaded broker) counts
    as sent, unconfirmed: the client keeps the message and delivers it when it can, so it is not
    published again at once (that only piled copies into the client); the rack's ack closes it, and
    the retry interval applies as to any command not acknowledged. The next batch goes on."""

    #: wall seconds a send waits for the broker's PUBACK
    puback_timeout_s = 5.0
    #: wall seconds the publisher's journal writes are skipped after one failed
    journal_retry_s = 2.0
    #: wall seconds between two warnings about one target's missing acks
    ack_warning_interval_s = 60.0

    def __init__(
        self,
        bus: Bus,
        book: CommandBook,
        journal: Journal,
        clock: SiteClock,
        control: ControlConfig,
        *,
        on_sent: Callable[[OpenCommand, bool], None] | None = None,
        on_closed: Callable[[OpenCommand, str], None] | None = None,
        on_unconfirmed: Callable[[OpenCommand], None] | None = None,
        heard_since: Callable[[str, float], bool] | None = None,
    ) -> None:
        self.bus = bus
        self.book = book
        self.journal = journal
        self.clock = clock
        self.control = control
        self.on_sent = on_sent
        self.on_closed = on_closed
        self.on_unconfirmed = on_unconfirmed
        self.heard_since = heard_since
        self.stats = PublishStats()
        self._queue: collections.deque[OpenCommand] = collections.deque()
        #: commands in flight at once (awaiting their PUBACK); the client's own in-flight window
        self.max_in_flight = max(1, bus.options.max_inflight)
        self._wake = asyncio.Event()
        self._resend_all = False
        self._stepping = asyncio.Lock()  # one step at a time (the run loop's, a clean shutdown's)
        #: the publisher's journal writes that failed last time they were tried ("sent", "expired",
        #: "abandoned", "superseded"), with the error; an entry goes when that write succeeds again
        self.journal_errors: dict[str, str] = {}
        self._journal_retry_wall = -math.inf  # time.monotonic() before which journal writes are skipped
        #: time.monotonic() of the last send the broker did not acknowledge in time, and why
        self.last_unconfirmed_wall = -math.inf
        self.last_unconfirmed_error = ""
        #: per target (rack, "facility", "scheduler"): commands closed without an ack although sent
        #: a retry interval before (expired, abandoned or superseded unanswered)
        self.acks_missing: dict[str, int] = {}
        self._ack_warned: dict[str, tuple[float, int]] = {}  # target -> (time.monotonic(), acks_missing then)

    @property
    def retry_after_s(self) -> float:
        return self.control.command_ttl_s / (self.control.command_retries + 1)

    def submit(self, commands: Iterable[OpenCommand]) -> None:
        self._queue.extend(commands)
        self._wake.set()

    def reconnected(self) -> None:
        """The broker connection came back: send every open command again."""
        self._resend_all = True
        self._wake.set()

    def backlog(self) -> int:
        return len(self._queue)

    def _journal_write(self, what: str, write: Callable[[], object]) -> None:
        """One journal write (``what`` names it in the log); a failure is logged once and kept in
        :attr:`journal_errors`, never raised: the command has been journaled and sent already. For
        ``journal_retry_s`` after a failure the publisher's writes are skipped (each try may wait for
        SQLite's busy timeout on the event loop, and a step comes every 0.25 s): what they would
        record is lost as when they fail (expiries are recorded by the next one that succeeds). An
        entry of :attr:`journal_errors` goes when a write of its kind succeeds, every entry when a
        batch is marked sent (rows written: the journal takes writes again)."""
        if time.monotonic() < self._journal_retry_wall:
            return
        try:
            write()
        except JournalError as exc:
            if what not in self.journal_errors:
                log.error("journal write failed: commands %s not recorded", what, extra={"fields": {"error": str(exc)}})
            self.journal_errors[what] = str(exc)
            self._journal_retry_wall = time.monotonic() + self.journal_retry_s
            return
        if what == "sent" and self.journal_errors:
            log.info("journal written again: commands sent recorded")
            self.journal_errors.clear()
        elif self.journal_errors.pop(what, None) is not None:
            log.info("journal written again: commands %s recorded", what)

    async def run(self) -> None:
        while True:
            await wait_event(self._wake, 0.25)
            self._wake.clear()
            await self.step()

    async def step(self) -> None:
        """Expire, queue retries, send what is queued (returns when the queue is empty or the link is
        down). A step called while another runs starts when that one has ended: a clean shutdown's
        step returns once what the last decision handed over has been sent, whichever step sent it."""
        async with self._stepping:
            await self._step()

    async def _step(self) -> None:
        now = self.clock.now()
        if now is None:
            return
        for oc in self.book.expire(now):
            self.stats.unacked_expired += 1
            self._no_ack(oc, now)
            if self.on_closed is not None:
                self.on_closed(oc, "unacked")
        self._journal_write("expired", functools.partial(self.journal.expire, now))
        superseded = self.book.take_superseded()
        if superseded:
            # the journal has no state of its own for them: closed unacked, never sent again
            ids = [oc.command_id for oc in superseded]
            self._journal_write("superseded", functools.partial(self.journal.supersede, ids))
            for oc in superseded:
                self.stats.superseded += 1
                self._no_ack(oc, now)
                if self.on_closed is not None:
                    self.on_closed(oc, "superseded")
        queued = {oc.command_id for oc in self._queue}
        resend_all, self._resend_all = self._resend_all, False
        for oc in list(self.book.open.values()):
            if oc.command_id in queued or oc.attempts == 0:
                continue
            due = resend_all or now - oc.last_sent_s >= self.retry_after_s
            if not due:
                continue
            if oc.attempts > self.control.command_retries and not resend_all:
                self.book.open.pop(oc.command_id, None)
                self.book.forget(oc)
                self._journal_write("abandoned", functools.partial(self.journal.abandon, [oc.command_id]))
                self.stats.abandoned += 1
                self._no_ack(oc, now)
                if self.on_closed is not None:
                    self.on_closed(oc, "abandoned")
                continue
            self._queue.append(oc)
        while self._queue:
            now = self.clock.now() or now
            batch: list[OpenCommand] = []
            while self._queue and len(batch) < self.max_in_flight:
                oc = self._queue.popleft()
                if oc.command_id in self.book.open and oc.expires_s > now:
                    batch.append(oc)
                # else: acked meanwhile, or expired: never sent late
            if not batch:
                break
            # pipelined: every command of the batch is handed to the client now, in order (aiomqtt passes
            # each publish to paho synchronously when its task starts, and tasks start in creation order),
            # and the PUBACKs are awaited together: one round trip per batch, not one per command
            tasks = [asyncio.ensure_future(self._send(oc, now)) for oc in batch]
            results = await asyncio.gather(*tasks)
            sent = [oc for oc, ok in zip(batch, results, strict=True) if ok is None]
            if sent:
                ids = [oc.command_id for oc in sent]
                self._journal_write("sent", functools.partial(self.journal.mark_sent, ids))  # one transaction
            failed = [oc for oc, ok in zip(batch, results, strict=True) if ok is not None]
            if failed:
                self._queue.extendleft(reversed(failed))  # sent again, in order, at the next step
                if any(isinstance(r, BusNotConnected) for r in results):
                    self.stats.not_connected_waits += 1
                else:
                    exc = next(r for r in results if r is not None)
                    log.warning("%d command(s), first to %s, not sent: %s", len(failed), failed[0].target, exc)
                return

    def _no_ack(self, oc: OpenCommand, now_s: float) -> None:
        """``oc`` closed without an ack: an ack missing if it went out a retry interval before and its
        target sent something since (counted per target; a warning at most every
        ``ack_warning_interval_s`` per target)."""
        if oc.attempts == 0 or now_s - oc.issued_s < self.retry_after_s:
            return
        # since it first went out, not last: a rack whose telemetry comes less often than the retries
        # (every 20 s against a retry every 10 s) is often not heard between the last copy and the close
        if self.heard_since is not None and not self.heard_since(oc.target, oc.first_sent_s):
            return  # the target went silent (its telemetry too): not an ack lost on its way
        self.stats.acks_missing += 1
        n = self.acks_missing[oc.target] = self.acks_missing.get(oc.target, 0) + 1
        wall = time.monotonic()
        last_wall, last_n = self._ack_warned.get(oc.target, (-math.inf, 0))
        if wall - last_wall < self.ack_warning_interval_s:
            return
        self._ack_warned[oc.target] = (wall, n)
        log.warning(
            "no ack from %s for %d command(s) sent %g s or more before they closed: it does not get its commands, "
            "or its acks do not reach the agent (a broker ACL that drops them?)",
            oc.target,
            n - last_n,
            self.retry_after_s,
            extra={"fields": {"acks_missing": n, "last_command_id": oc.command_id, "attempts": oc.attempts}},
        )

    async def _send(self, oc: OpenCommand, now: float) -> BusError | None:
        """Publish one command (QoS 1) and note it sent once the broker acknowledged it (or did not
        within ``puback_timeout_s``: sent, unconfirmed); the error when it could not be sent."""
        try:
            await self.bus.publish(oc.topic, oc.payload, qos=1, retain=False, timeout_s=self.puback_timeout_s)
        except BusPubackTimeout as exc:  # handed over, not confirmed: see the class docstring
            if time.monotonic() - self.last_unconfirmed_wall > 60.0:
                log.warning("the broker does not acknowledge commands: %s", exc)
            self.stats.unconfirmed += 1
            self.last_unconfirmed_wall = time.monotonic()
            self.last_unconfirmed_error = str(exc)
            if self.on_unconfirmed is not None:
                self.on_unconfirmed(oc)
        except BusError as exc:
            return exc
        retry = oc.attempts > 0
        oc.attempts += 1
        oc.last_sent_s = self.clock.now() or now
        if oc.first_sent_s == -math.inf:
            oc.first_sent_s = oc.last_sent_s
        if retry:
            self.stats.retried += 1
        self.stats.sent += 1
        if self.on_sent is not None:
            self.on_sent(oc, retry)
        return None
