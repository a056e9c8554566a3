"""A decision's commands: what differs between what it wants and what the racks have.

:class:`CommandDiff` turns a guarded :class:`agent.decision.Decision` into the commands that change
what differs from what the racks have (reported, overlaid with the agent's open commands until they
expire: ``agent.command_overlays``), as :data:`agent.open_commands.Item` (kind, message, whether it
lowers power), not yet encoded (``seq`` 0: the book numbers them), lowering first; ``agent.publish``
explains which commands and in which order. It registers nothing: ``agent.command_book`` does.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.command_overlays import Overlays
from agent.config import ControlConfig
from agent.decision import Decision
from agent.open_commands import HOST, LEVEL, LIMIT, SLEEP, Item
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["CommandDiff"]

_LIMIT_TOL_W = 0.5


@dataclass(frozen=True)
class _HostChanges:
    """What one :meth:`CommandDiff.diff` does to hosts: per host, whether to power it off or on now,
    and whether the decision wants it off."""

    off: BoolArray
    on: BoolArray
    wanted_off: BoolArray


@dataclass
class _Outbox:
    """The commands of one :meth:`CommandDiff.diff` as it builds them, in three groups sent in this
    order: those that lower power, the set-point and placements, those that raise power."""

    now_s: float
    expires_s: float
    low: list[Item] = field(default_factory=list)
    mid: list[Item] = field(default_factory=list)
    high: list[Item] = field(default_factory=list)


class CommandDiff:
    """The commands of a decision (see the module docstring), stamped by ``sequencer``'s publisher."""

    def __init__(self, site: SiteSpec, control: ControlConfig, sequencer: wire.Sequencer, overlays: Overlays) -> None:
        self.site = site
        self.control = control
        self.sequencer = sequencer
        self.overlays = overlays
        self._cpr = site.cards_per_rack
        self._card_rack = site.card_rack()
        self._names = site.rack_names
        self._card_host = site.card_host()

    def diff(self, decision: Decision, snap: StateSnapshot, applied_level: IntArray, now_s: float) -> list[Item]:
        """The commands the decision needs, as ``(kind, message, lowers_power)``, lowering first."""
        # cards a card_failed refusal marks (until a newer reading, or a repeat's hold ends)
        said_failed = self.overlays.failed_now(np.asarray(snap.card_last_seen_s, dtype=np.float64), now_s)
        alive = ~(np.asarray(decision.card_failed, dtype=bool) | np.asarray(snap.card_failed, dtype=bool) | said_failed)
        ttl = min(self.control.command_ttl_s, wire.MAX_COMMAND_TTL_S)  # a rack refuses a longer life
        out = _Outbox(now_s=now_s, expires_s=now_s + ttl)
        self.overlays.lift_refusals_a_failure_explains(~alive, now_s)
        # a refused setting is held back command_ttl_s from its refusal: after the site clock stepped
        # back, at most that from now (not until the new clock gets back to the old timeline's end)
        np.minimum(self.overlays.backoff, now_s + self.control.command_ttl_s, out=self.overlays.backoff)
        ok_now = self.overlays.backoff <= now_s
        # the cards of hosts that are (or are commanded) off: a rack refuses their levels and limits
        # (host_off: the card cannot be reached); sent once the host is on. Nor do the cards of hosts
        # this diff powers off get any (a raise would come after the power-off and be refused)
        host_off_now = np.zeros(self.site.n_cards, dtype=bool)
        if self.site.hosts_managed:
            host_off_now = self.overlays.have(HOST, np.asarray(snap.card_host_off, dtype=np.float64), now_s) > 0.5
        hosts = self._host_changes(decision, host_off_now, ok_now[HOST])
        reachable = alive & ~host_off_now
        if hosts is not None:
            reachable &= ~hosts.off[self._card_host]
        self._level_items(out, decision, snap, applied_level, reachable & ok_now[LEVEL])
        self._limit_items(out, decision, snap, reachable & ok_now[LIMIT])
        host_cards = self._host_items(out, hosts)
        self._sleep_items(out, decision, snap, alive & ~host_cards & ok_now[SLEEP], host_off_now)
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
        have_lv = self.overlays.have(LEVEL, reported_lv, out.now_s)
        want_lv = decision.card_level.astype(np.float64)
        moved = may & (want_lv != have_lv)
        dvfs = lambda v: wire.CardSetting.dvfs(int(v))  # noqa: E731
        slower = self._rack_commands(out, np.flatnonzero(moved & (want_lv > have_lv)), want_lv, dvfs)
        faster = self._rack_commands(out, np.flatnonzero(moved & (want_lv < have_lv)), want_lv, dvfs)
        out.low += [(LEVEL, cmd, True) for cmd in slower]
        out.high += [(LEVEL, cmd, False) for cmd in faster]

    def _limit_items(self, out: _Outbox, decision: Decision, snap: StateSnapshot, may: BoolArray) -> None:
        """Power limits: one command per rack and direction, the cards' limits as one value or one per
        card. What the racks have is the reported limit (overlaid), not the one a rack confirmed
        (``agent.ingest.Ingest.applied_power_limit_w``; levels count from the confirmed level, which the
        belief's levels are too): a retained applied state changes only when a command is applied, so it
        can be older than the telemetry (a limit changed outside the agent's commands), and counting from
        it could hold back a cut the guard budgeted."""
        rep_lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
        rep_lim = np.where(np.isfinite(rep_lim), rep_lim, self.site.card.power_limit_w)
        have_lim = self.overlays.have(LIMIT, rep_lim, out.now_s)
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
                (out.low if lowers else out.high).append((LIMIT, self._rack_command(out, int(r), sel, setting), lowers))

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
        out.low += [(HOST, c, True) for c in self._rack_commands(out, off_cards, ones_n, _host_off)]
        out.high += [(HOST, c, False) for c in self._rack_commands(out, on_cards, ones_n, _host_on)]
        return np.asarray(hosts.wanted_off[self._card_host], dtype=bool)

    def _sleep_items(
        self, out: _Outbox, decision: Decision, snap: StateSnapshot, may: BoolArray, host_off: BoolArray
    ) -> None:
        """Low-power idle and wake for the cards that ``may`` get one. A card whose host is (reported
        or commanded) ``host_off`` is asleep with it, whatever the racks last reported of the card (a
        host powered on boots with its cards asleep): it gets no sleep, which its rack would refuse,
        and, where the decision wants it awake and powers its host on, a wake after the power-on."""
        have_lp = self.overlays.have(SLEEP, np.asarray(snap.card_low_power, dtype=np.float64), out.now_s) > 0.5
        have_lp |= host_off
        want_lp = np.asarray(decision.card_low_power, dtype=bool)
        sleep = np.flatnonzero(may & want_lp & ~have_lp & ~decision.card_busy)
        wake = np.flatnonzero(may & ~want_lp & have_lp)
        ones_n = np.ones(self.site.n_cards, dtype=np.float64)
        asleep = self._rack_commands(out, sleep, ones_n, lambda v: wire.CardSetting.low_power_idle())
        woken = self._rack_commands(out, wake, ones_n, lambda v: wire.CardSetting.wake())
        out.low += [(SLEEP, cmd, True) for cmd in asleep]
        out.high += [(SLEEP, cmd, False) for cmd in woken]

    def _setpoint_item(self, out: _Outbox, decision: Decision, snap: StateSnapshot) -> None:
        """A new supply set-point, when the decision's differs from what the facility has."""
        fac = snap.facility
        have_sp = fac.supply_setpoint_c if fac is not None else math.nan
        if self.overlays.setpoint is not None and self.overlays.setpoint[1] > out.now_s:
            have_sp = self.overlays.setpoint[0]
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
        """Pump speeds: a change, or a slowed pump's renewal (faster pumps lower die temperatures).
        After the site clock stepped back, a rack's last pump command dates from now at the latest:
        its stamp on the old timeline would put the next renewal off by the step, and the CDU's hold
        (the simulator's 60 s) run out meanwhile."""
        np.minimum(self.overlays.pump_sent, out.now_s, out=self.overlays.pump_sent)
        if decision.rack_pump_speed_frac is None:
            return
        reported = np.asarray(snap.rack_pump_speed_frac, dtype=np.float64)
        renew = self.control.pump_renew_s
        for r, want in enumerate(np.asarray(decision.rack_pump_speed_frac, dtype=np.float64).tolist()):
            pump_held = self.overlays.pump.get(r)
            have = pump_held[0] if pump_held is not None and pump_held[1] > out.now_s else float(reported[r])
            due = want < 1.0 and out.now_s - self.overlays.pump_sent[r] >= renew
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
            held = self.overlays.placing.get(o.job_id)
            if held is not None and held[0] > out.now_s:
                continue
            by_rack = self.site.cards_by_rack(o.cards)
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


def _host_off(_v: float) -> wire.CardSetting:
    return wire.CardSetting.host_power_off()


def _host_on(_v: float) -> wire.CardSetting:
    return wire.CardSetting.host_power_on()
