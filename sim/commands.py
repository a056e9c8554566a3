"""Commands from the agent -> the plant -> an ack (and the rack's retained applied state).

:meth:`CommandHandler.handle` takes one message from a command topic and returns what to publish.
It never raises: a payload the codec rejects is counted by reason (``agent.wire.RejectionCounter``)
and, when it still carries a readable ``command_id`` on a known command topic, answered with a
``rejected`` ack naming the reason, so that the sender learns what happened to it (a rack the site
does not have inside the payload, e.g. in a ``place``'s ``cards``, included; a payload over the size
limit is not read).

A rack command that is applied changes the rack's retained applied state. ``handle`` returns it
with the ack; a handler made with ``applied_with_ack=False`` (the simulator's, which answers a burst
of commands at once) leaves it out and the caller takes :meth:`CommandHandler.applied_states` after
the burst: one applied state per touched rack, made once, so that every ``seq`` number drawn is
published and a receiver sees no gap in the sequence.

A rack also publishes its applied state when its cards' settings change other than by a rack
command (docs/protocol.md): the plant wakes the sleeping cards a job is placed on (a scheduler
``place``, or the plant's own placement of a job no one placed within ``external_timeout_s``),
booting their hosts; a card that fails asleep leaves the low-power state; a card repaired on an off
host enters it. :meth:`CommandHandler.note_plant_changes` marks such racks as touched, as a rack
command does, by comparing the plant's low-power and host-off state with what each rack's last
applied state said; :meth:`CommandHandler.applied_states` calls it first, so the applied states of a
burst include them, and the simulator calls that after each step it has no burst open
(``sim.runner``). A card's level, clock range and power limit are the ones commanded: the plant
changes none of them on its own.

A decoded command is judged by the rules every rack follows (docs/protocol.md, "Which commands a
rack applies"; the ack's reason starts with the code), in this order:

* ``duplicate``: a copy of a command (its ``command_id``) already answered gets that answer again
  (``applied``, ``rejected`` or ``expired``, also after the command's expiry), its reason prefixed
  ``duplicate:``, and is not applied again: each command is counted once (ids are remembered until
  ``REMEMBER_AFTER_EXPIRY_S`` after their command's expiry, at most ``MAX_REMEMBERED_IDS``);
* expiry against the site clock (``wire.is_expired``: at or past ``expires_at`` it is acked
  ``expired`` and NOT applied);
* ``ttl_too_long`` / ``issued_ahead`` (``wire.command_time_problem``): rejected when it would live
  longer than ``wire.MAX_COMMAND_TTL_S``, or its ``ts`` is more than ``max_issue_ahead_s`` ahead of
  the site clock;
* ``superseded``: rejected when a command issued later has been applied to what it sets: per card
  its DVFS level (``set_dvfs_level``, ``set_clock_range``), its power limit, or its power state
  (``low_power_idle``, ``wake``, ``host_power_off``, ``host_power_on``); per rack its pump; the
  set-point. "Later" is by the issue stamp ``ts``; for one publisher's commands stamped alike, by
  its ``seq``. A command is refused whole when any card of it has a later one (:class:`IssueOrder`);
* ``host_off``: ``set_dvfs_level``, ``set_clock_range``, ``set_power_limit`` and ``low_power_idle``
  to a card whose host is powered off are rejected: the card is unpowered, its BMC or driver cannot
  reach it (a ``wake`` boots the host, below).

Then it is applied through the plant, which either applies all of it or refuses all of it with a
reason (``twin.plant.CommandError``); a card command refused because cards of it have failed answers
``card_failed``, naming every failed card of it (``wire.card_failed_reason``; as many as the
reason's 1,024 characters hold, then ``and N more``):

* ``set_dvfs_level``: ``Plant.set_levels``; takes effect ``card.dvfs_latency_s`` later; a level
  outside the card's table is rejected. Applied state: ``dvfs_level`` = the level, clock range =
  lowest table clock .. the level's clock.
* ``set_clock_range``: the fastest DVFS level whose clock lies within ``min..max`` (a range wider
  than the table is trimmed to it); no table clock inside the range: rejected.
* ``set_power_limit``: ``Plant.set_power_limits``, at once, one limit for every listed card or one
  per card (``power_limit_watts`` as a list aligned with ``cards``); any value outside
  ``min_power_limit_w`` .. ``card.power_limit_w``: the whole command is rejected.
* ``low_power_idle``: ``Plant.enter_low_power``; a card running a job is refused (rejected).
* ``wake``: ``Plant.wake``; the card is usable ``card.wake_latency_s`` later (telemetry shows it
  awake, at 0 utilization, meanwhile). A card of a powered-off host boots its host first.
* ``host_power_off`` / ``host_power_on``: ``Plant.power_off_hosts`` / ``Plant.power_on_hosts`` for the
  hosts of the listed cards. ``cards`` must be whole hosts (every card of each host they touch, hosts
  being runs of ``cards_per_host`` consecutive cards of the rack), else the command is rejected; so is
  one to a site without host power management (``rack.hosts_per_rack = 0``) and a power-off of a
  host with a card running (or given) a job. An off host's cards are in the low-power state and draw
  nothing (telemetry and applied state show ``host_off``); a powered-on host boots for
  ``rack.host_boot_s`` and leaves its cards asleep until they are woken.
* CDU ``pump_speed_percent``: ``Plant.set_pump_speed`` for the rack's loop, at once (within the
  site's ``min_pump_speed_frac`` .. 100%); a slowed pump returns to full speed ``pump_hold_s`` after
  the last command for it (the agent renews it). Acked on the rack's ack topic.
* facility ``supply_setpoint_celsius``: ``Plant.set_supply_temp`` (within the site's options'
  range); the rack supply follows with the plant's lag.
* scheduler ``place``: ``Plant.place_job`` (rack-local card indices on the wire); the job must be
  queued, get exactly its number of cards, none failed or busy. A placement with failed cards is
  rejected ``card_failed``, naming every failed card of it per rack
  (``wire.placement_card_failed_reason``), so that the agent places the job on others. The job's
  sleeping cards are woken (their hosts booted): the applied states of their racks follow with the
  burst's (:meth:`CommandHandler.note_plant_changes`).

Commands to a failed card are rejected (``card_failed``), except host power commands (a host with
a failed card can still be powered off and on). After the card's own protection the card may run slower
than commanded (power brake, thermal slowdown): the card batch's ``sm_clock_mhz`` shows it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np
import numpy.typing as npt

from agent import wire
from twin.plant import CommandError, Plant

__all__ = ["MAX_REMEMBERED_IDS", "CommandCounts", "CommandHandler", "IssueOrder"]

log = logging.getLogger("racktwin.sim")

#: The most command ids remembered to answer copies (``duplicate``); an id is forgotten when its
#: command expires, the oldest first beyond this many.
MAX_REMEMBERED_IDS = 100_000
#: site seconds an answered id is remembered after its command's expiry, so that a late copy (an
#: agent's retry, a broker's queue) still gets the earlier answer: the longest life a command may have
REMEMBER_AFTER_EXPIRY_S = wire.MAX_COMMAND_TTL_S
_PRUNE_EVERY = 1024

# what a card command sets (each ordered on its own, :class:`IssueOrder`)
_LEVEL, _LIMIT, _POWER = 0, 1, 2
_SETS = ("DVFS level", "power limit", "power state")
_SLOT = {
    wire.CardAction.SET_DVFS_LEVEL: _LEVEL,
    wire.CardAction.SET_CLOCK_RANGE: _LEVEL,
    wire.CardAction.SET_POWER_LIMIT: _LIMIT,
    wire.CardAction.LOW_POWER_IDLE: _POWER,
    wire.CardAction.WAKE: _POWER,
    wire.CardAction.HOST_POWER_OFF: _POWER,
    wire.CardAction.HOST_POWER_ON: _POWER,
}
#: the actions a card of a powered-off host cannot take (``wake`` boots the host)
_NEED_HOST_ON = frozenset(
    {
        wire.CardAction.SET_DVFS_LEVEL,
        wire.CardAction.SET_CLOCK_RANGE,
        wire.CardAction.SET_POWER_LIMIT,
        wire.CardAction.LOW_POWER_IDLE,
    }
)


@dataclass
class CommandCounts:
    """What happened to commands, in total and per target (``rack``, ``facility``, ``scheduler``)."""

    applied: int = 0
    rejected: int = 0  # rejected acks: refused by the plant, or undecodable with a readable command_id
    expired: int = 0
    superseded: int = 0  # rejected (part of ``rejected``): a command issued later had been applied
    duplicates: int = 0  # copies of commands already answered: answered again, not applied (not in the above)
    malformed_acked: int = 0  # undecodable messages answered with a rejected ack (part of ``rejected``)
    unanswered: int = 0  # undecodable messages with no readable command_id (or no known topic): no ack
    by_target: dict[str, dict[str, int]] = field(default_factory=dict)
    #: refusals by ``{target}.{action}`` (the plant's) or ``{target}.{code}`` (``wire.AckReason``)
    rejection_reasons: dict[str, int] = field(default_factory=dict)

    def count(self, target: str, result: wire.AckResult) -> None:
        if result is wire.AckResult.APPLIED:
            self.applied += 1
        elif result is wire.AckResult.REJECTED:
            self.rejected += 1
        else:
            self.expired += 1
        per = self.by_target.setdefault(target, {"applied": 0, "rejected": 0, "expired": 0})
        per[result.value] += 1


class IssueOrder:
    """The issue stamp of the last command applied to each of ``n`` slots (a card's setting, a rack's
    pump, the set-point): its ``ts``, and its publisher's ``seq`` to order one publisher's commands
    stamped alike. A command is newer than a slot's last when its ``ts`` is later, or equal from the
    same publisher with a higher ``seq`` (a restarted publisher's ``seq`` starts again at 0: only
    ``ts`` orders its commands after those of before)."""

    def __init__(self, n: int) -> None:
        self.ts_s = np.full(n, -np.inf)
        self.publisher = np.full(n, -1, dtype=np.int64)
        self.seq = np.full(n, -1, dtype=np.int64)

    def first_not_older(self, idx: npt.NDArray[np.int64], ts_s: float, publisher: int, seq: int) -> int | None:
        """The first slot of ``idx`` whose last command is not older than this stamp (None: none)."""
        last = self.ts_s[idx]
        tie = (last == ts_s) & ((self.publisher[idx] != publisher) | (self.seq[idx] >= seq))
        hit = np.flatnonzero((last > ts_s) | tie)
        return int(idx[hit[0]]) if hit.size else None

    def record(self, idx: npt.NDArray[np.int64], ts_s: float, publisher: int, seq: int) -> None:
        self.ts_s[idx] = ts_s
        self.publisher[idx] = publisher
        self.seq[idx] = seq


class CommandHandler:
    """Applies wire commands to a plant (see the module docstring). ``max_issue_ahead_s``: how far
    a command's ``ts`` may lie ahead of ``clock()``."""

    def __init__(
        self,
        plant: Plant,
        codec: wire.Codec,
        sequencer: wire.Sequencer,
        clock: Callable[[], float],
        *,
        applied_with_ack: bool = True,
        max_issue_ahead_s: float = wire.MAX_ISSUE_AHEAD_S,
    ) -> None:
        self.plant = plant
        self.max_issue_ahead_s = max_issue_ahead_s
        self.applied_with_ack = applied_with_ack
        self.codec = codec
        self.sequencer = sequencer
        self.publisher = sequencer.publisher
        self.clock = clock  # the site clock (epoch-based seconds)
        self.counts = CommandCounts()
        site = plant.site
        self.site = site
        self._cpr = site.cards_per_rack
        self._rack_index = {name: i for i, name in enumerate(site.rack_names)}
        self._card_host = site.card_host()
        clocks = np.asarray(site.card.clocks_mhz, dtype=np.float64)
        self._clocks = clocks
        n = site.n_cards
        level0 = plant.config.initial_level
        # what each card has been told (the applied state): level, clock range, power limit
        self.level = np.full(n, level0, dtype=np.int64)
        self.min_clock_mhz = np.full(n, clocks[-1])
        self.max_clock_mhz = np.full(n, clocks[level0])
        self.power_limit_w = np.full(n, site.card.power_limit_w)
        self.last_command_id: list[uuid.UUID | None] = [None] * site.n_racks
        # the last command applied to each card setting, pump and the set-point (``superseded``)
        self._card_order = [IssueOrder(n) for _ in _SETS]
        self._pump_order = IssueOrder(site.n_racks)
        self._setpoint_order = IssueOrder(1)
        self._publishers: dict[str, int] = {}
        # command id -> (expiry, result, reason) of the commands answered (``duplicate``)
        self._answered: dict[uuid.UUID, tuple[float, wire.AckResult, str | None]] = {}
        self._since_prune = 0
        self._touched: dict[int, None] = {}  # racks whose applied state changed and was not yet made
        # per card: what the rack's last applied state said of its low-power and host-off state
        # (:meth:`note_plant_changes`); at first the plant's (every rack's is published on connect)
        self._said_low = plant.low_power()
        self._said_host_off = self._card_host_off()
        topics = codec.topics
        # the command topics of the site -> the ack target of a rejected message on them
        self._ack_targets = {topics.facility_cmd: wire.FACILITY, topics.scheduler_cmd: wire.SCHEDULER}
        for name in site.rack_names:
            self._ack_targets[topics.rack_cmd(name)] = name
            self._ack_targets[topics.cdu_cmd(name)] = name

    # ---- entry point ----------------------------------------------------------------------
    def handle(self, topic: str, payload: bytes) -> list[wire.Outgoing]:
        """Decode, judge and apply one message; the ack (and, ``applied_with_ack``, the applied state
        of the rack it changed) to publish. Never raises on a message, whatever it holds (what a
        message does wrong is answered in its ack)."""
        out = self._handle(topic, payload)
        if self.applied_with_ack:
            out.extend(self.applied_states())
        return out

    def applied_states(self) -> list[wire.Outgoing]:
        """The applied state of every rack whose commands were applied, or whose cards the plant
        woke, put to sleep or powered on (:meth:`note_plant_changes`), since the last call, one per
        rack, as it is now."""
        self.note_plant_changes()
        racks, self._touched = self._touched, {}
        if not racks:
            return []
        low = self.plant.low_power()
        return [self.applied_state(r, low) for r in racks]

    def note_plant_changes(self) -> list[int]:
        """Mark as touched (their applied state is made by the next :meth:`applied_states`) the racks
        with a card whose low-power or host-off state the plant changed since the rack's last applied
        state said it, other than by a rack command: cards woken for a job placed on them (by a
        ``place`` command or by the plant's own placement), their hosts booted; a card that failed
        asleep or was repaired on an off host. Returns those racks."""
        changed = self.plant.low_power() != self._said_low
        if self.site.hosts_managed:
            changed |= self._card_host_off() != self._said_host_off
        if not changed.any():
            return []
        racks: list[int] = np.unique(np.flatnonzero(changed) // self._cpr).tolist()
        for r in racks:
            self._touched[r] = None
        return racks

    def _card_host_off(self) -> npt.NDArray[np.bool_]:
        """Per card: its host is powered off (all False where the site's hosts are not managed)."""
        if not self.site.hosts_managed:
            return np.zeros(self.site.n_cards, dtype=np.bool_)
        return self.plant.host_off()[self._card_host]

    def _handle(self, topic: str, payload: bytes) -> list[wire.Outgoing]:
        try:
            msg = self.codec.decode(topic, payload)
            if isinstance(msg, wire.Rejection):
                return self._answer_rejection(topic, payload, msg)
            if isinstance(msg, wire.RackCommand):
                return self._rack(msg)
            if isinstance(msg, wire.CduCommand):
                return self._cdu(msg)
            if isinstance(msg, wire.FacilityCommand):
                return self._facility(msg)
            if isinstance(msg, wire.SchedulerCommand):
                return self._scheduler(msg)
            rej = wire.Rejection(wire.RejectReason.UNKNOWN_TOPIC, f"not a command topic ({type(msg).__name__})", topic)
            self.codec.counter.record(rej)
            return []
        except Exception as exc:  # never let one message stop the simulator
            log.exception("sim: command on %r could not be handled", topic[:200])
            self.codec.counter.record(wire.Rejection(wire.RejectReason.INVALID, f"{type(exc).__name__}: {exc}", topic))
            return []

    # ---- acks -----------------------------------------------------------------------------
    def _ack(
        self,
        target: str,
        command_id: uuid.UUID,
        result: wire.AckResult,
        reason: str | None = None,
        *,
        count: bool = True,
    ) -> wire.Outgoing:
        topics = self.codec.topics
        if target == wire.FACILITY:
            topic, kind = topics.facility_ack, wire.FACILITY
        elif target == wire.SCHEDULER:
            topic, kind = topics.scheduler_ack, wire.SCHEDULER
        else:
            topic, kind = topics.rack_ack(target), "rack"
        if count:
            self.counts.count(kind, result)
        ack = wire.Acknowledgement(
            target=target,
            command_id=command_id,
            result=result,
            ts_s=self.clock(),
            seq=self.sequencer.next(topic),
            publisher=self.publisher,
            reason=None if reason is None else reason[: wire.MAX_TEXT_CHARS],
        )
        return wire.Outgoing(topic, wire.encode_ack(ack), 1, False)

    def _answer_rejection(self, topic: str, payload: bytes, rej: wire.Rejection) -> list[wire.Outgoing]:
        """A rejected message on one of the site's command topics: ack ``rejected`` if its
        command_id is readable (not on other topics, e.g. a rack the site does not have, and not for
        a payload over the size limit, which is not read)."""
        target = self._ack_targets.get(topic)
        if target is None or rej.reason is wire.RejectReason.TOO_LARGE:
            self.counts.unanswered += 1
            return []
        command_id = _readable_command_id(payload)
        if command_id is None:
            self.counts.unanswered += 1
            return []
        self.counts.malformed_acked += 1
        return [self._ack(target, command_id, wire.AckResult.REJECTED, f"{rej.reason.value}: {rej.detail}")]

    def _refuse(
        self, action: str, target: str, command_id: uuid.UUID, reason: str, cmd: wire.Command | None = None
    ) -> list[wire.Outgoing]:
        """A ``rejected`` ack, counted under ``action``; remembered for copies of ``cmd`` when given."""
        key = f"{target if target in (wire.FACILITY, wire.SCHEDULER) else 'rack'}.{action}"
        self.counts.rejection_reasons[key] = self.counts.rejection_reasons.get(key, 0) + 1
        if cmd is not None:
            self._remember(cmd, wire.AckResult.REJECTED, reason)
        return [self._ack(target, command_id, wire.AckResult.REJECTED, reason)]

    def _applied(self, target: str, cmd: wire.Command) -> list[wire.Outgoing]:
        self._remember(cmd, wire.AckResult.APPLIED, None)
        return [self._ack(target, cmd.command_id, wire.AckResult.APPLIED)]

    # ---- the rules of every command: expiry, times, copies, order ------------------------
    def _judge(self, cmd: wire.Command, target: str) -> list[wire.Outgoing] | None:
        """The answer to ``cmd`` when it must not be applied as a copy of one already answered, for
        its expiry or for its times; None to go on. A copy is answered what the command was answered
        before also when it arrives after the command's expiry (while the rack still remembers the
        id): a rack that applied a command does not call a late copy of it ``expired``."""
        seen = self._answered.get(cmd.command_id)
        if seen is not None:
            _expires, result, reason = seen
            self.counts.duplicates += 1
            text = f"{wire.AckReason.DUPLICATE.value}: command {cmd.command_id} was {result.value} before"
            text += f" ({reason}); not applied again" if reason else "; not applied again"
            return [self._ack(target, cmd.command_id, result, text, count=False)]
        now_s = self.clock()
        if wire.is_expired(cmd, now_s):
            self._remember(cmd, wire.AckResult.EXPIRED, None)  # each command counted once, copies as duplicates
            return [self._ack(target, cmd.command_id, wire.AckResult.EXPIRED)]
        problem = wire.command_time_problem(cmd, now_s, self.max_issue_ahead_s)
        if problem is not None:
            return self._refuse(wire.reason_code(problem), target, cmd.command_id, problem, cmd)
        return None

    def _remember(self, cmd: wire.Command, result: wire.AckResult, reason: str | None) -> None:
        answered = self._answered
        answered[cmd.command_id] = (cmd.expires_s, result, reason)
        self._since_prune += 1
        if self._since_prune >= _PRUNE_EVERY:
            self._since_prune = 0
            now_s = self.clock()
            gone_s = now_s - REMEMBER_AFTER_EXPIRY_S
            for cid in [cid for cid, (expires_s, _r, _why) in answered.items() if expires_s <= gone_s]:
                del answered[cid]  # a copy arriving after this is answered ``expired``
        while len(answered) > MAX_REMEMBERED_IDS:
            del answered[next(iter(answered))]

    def _publisher(self, name: str) -> int:
        return self._publishers.setdefault(name, len(self._publishers))

    def _superseded(
        self, order: IssueOrder, idx: npt.NDArray[np.int64], cmd: wire.Command, what: Callable[[int], str]
    ) -> str | None:
        """The ``superseded`` reason when a slot of ``idx`` has had a command issued later applied
        (``what(slot)`` names the slot), else None."""
        slot = order.first_not_older(idx, cmd.ts_s, self._publisher(cmd.publisher), cmd.seq)
        if slot is None:
            return None
        return (
            f"{wire.AckReason.SUPERSEDED.value}: {what(slot)} has applied a command issued at ts "
            f"{order.ts_s[slot]:.3f} (seq {order.seq[slot]}), not before this one's {cmd.ts_s:.3f} (seq {cmd.seq})"
        )

    def _record(self, order: IssueOrder, idx: npt.NDArray[np.int64], cmd: wire.Command) -> None:
        order.record(idx, cmd.ts_s, self._publisher(cmd.publisher), cmd.seq)

    def _host_off_problem(self, idx: npt.NDArray[np.int64], r: int) -> str | None:
        """The ``host_off`` reason when a card of ``idx`` (site indices of rack ``r``) is on a
        powered-off host, else None."""
        if not self.site.hosts_managed:
            return None
        hosts = self._card_host[idx]
        off = self.plant.host_off()[hosts]
        if not off.any():
            return None
        k = int(np.flatnonzero(off)[0])
        h, cph = int(hosts[k]), self.site.cards_per_host
        first = h * cph - r * self._cpr
        return (
            f"{wire.AckReason.HOST_OFF.value}: card {int(idx[k]) - r * self._cpr} is on host {h} (cards {first}.."
            f"{first + cph - 1} of rack {self.site.rack_names[r]}), which is powered off: the card cannot be "
            "reached (power the host on, or wake the card, first)"
        )

    # ---- rack commands --------------------------------------------------------------------
    def _rack(self, cmd: wire.RackCommand) -> list[wire.Outgoing]:
        early = self._judge(cmd, cmd.rack)
        if early is not None:
            return early
        r = self._rack_index[cmd.rack]
        idx = np.asarray(cmd.cards, dtype=np.int64) + r * self._cpr
        s = cmd.setting
        action = s.action.value
        plant = self.plant
        slot = _SLOT[s.action]
        order = self._card_order[slot]
        cpr = self._cpr
        stale = self._superseded(
            order, idx, cmd, lambda c: f"the {_SETS[slot]} of card {c - r * cpr} of rack {cmd.rack}"
        )
        if stale is not None:
            self.counts.superseded += 1
            return self._refuse(wire.AckReason.SUPERSEDED.value, cmd.rack, cmd.command_id, stale, cmd)
        if s.action in _NEED_HOST_ON:
            off = self._host_off_problem(idx, r)
            if off is not None:
                return self._refuse(wire.AckReason.HOST_OFF.value, cmd.rack, cmd.command_id, off, cmd)
        try:
            if s.action is wire.CardAction.SET_DVFS_LEVEL:
                level = int(s.dvfs_level if s.dvfs_level is not None else -1)
                n_levels = self._clocks.size
                if not 0 <= level < n_levels:
                    raise CommandError(
                        f"dvfs_level {level} is outside the card's table 0..{n_levels - 1} ({self.site.card.model})"
                    )
                plant.set_levels(idx, level)
                self._set_levels(idx, level, float(self._clocks[-1]), float(self._clocks[level]))
            elif s.action is wire.CardAction.SET_CLOCK_RANGE:
                lo, hi = float(s.min_clock_mhz or 0.0), float(s.max_clock_mhz or 0.0)
                inside = np.flatnonzero((self._clocks >= lo - 1e-9) & (self._clocks <= hi + 1e-9))
                if inside.size == 0:
                    raise CommandError(
                        f"no DVFS clock of the card within {lo:g}..{hi:g} MHz "
                        f"(the card runs {self._clocks[-1]:g}..{self._clocks[0]:g} MHz)"
                    )
                level = int(inside[0])  # the fastest clock inside the range
                plant.set_levels(idx, level)
                self._set_levels(idx, level, max(lo, float(self._clocks[-1])), min(hi, float(self._clocks[0])))
            elif s.action is wire.CardAction.SET_POWER_LIMIT:
                limits = np.asarray(s.limits_w(idx.size), dtype=np.float64)  # one value, or one per card
                plant.set_power_limits(idx, limits)
                self.power_limit_w[idx] = limits
            elif s.action is wire.CardAction.LOW_POWER_IDLE:
                plant.enter_low_power(idx)
            elif s.action is wire.CardAction.WAKE:
                plant.wake(idx)
            elif s.action is wire.CardAction.HOST_POWER_OFF:
                plant.power_off_hosts(self._whole_hosts(idx, r, action))
            else:
                plant.power_on_hosts(self._whole_hosts(idx, r, action))
        except CommandError as exc:
            reason = exc.reason
            if exc.failed_cards:  # named, so that the sender can send it to the others (docs/protocol.md)
                reason = wire.card_failed_reason(cmd.rack, [c - r * cpr for c in exc.failed_cards])
            return self._refuse(action, cmd.rack, cmd.command_id, reason, cmd)
        self._record(order, idx, cmd)
        self.last_command_id[r] = cmd.command_id
        self._touched[r] = None
        return self._applied(cmd.rack, cmd)

    def _whole_hosts(self, idx: npt.NDArray[np.int64], r: int, action: str) -> npt.NDArray[np.int64]:
        """The site hosts whose cards ``idx`` (site indices, none repeated) are, exactly; a
        :class:`CommandError` when the site's hosts are not managed or a touched host is not whole."""
        site = self.site
        if not site.hosts_managed:
            raise CommandError(f"{action}: the site's hosts cannot be powered off or on (rack.hosts_per_rack = 0)")
        cph = site.cards_per_host
        hosts = np.unique(idx // cph)
        listed = np.zeros(hosts.size * cph, dtype=bool)
        listed[np.searchsorted(hosts, idx // cph) * cph + idx % cph] = True
        if not listed.all():
            k = int(np.flatnonzero(~listed)[0])
            h = int(hosts[k // cph])
            first = h * cph - r * self._cpr
            raise CommandError(
                f"{action}: cards must be whole hosts of {cph} cards; host {h} (cards {first}..{first + cph - 1} "
                f"of rack {site.rack_names[r]}) is missing card {first + k % cph}"
            )
        return hosts

    def _cdu(self, cmd: wire.CduCommand) -> list[wire.Outgoing]:
        early = self._judge(cmd, cmd.rack)
        if early is not None:
            return early
        r = self._rack_index[cmd.rack]
        idx = np.asarray([r], dtype=np.int64)
        stale = self._superseded(self._pump_order, idx, cmd, lambda _r: f"the pump of rack {cmd.rack}")
        if stale is not None:
            self.counts.superseded += 1
            return self._refuse(wire.AckReason.SUPERSEDED.value, cmd.rack, cmd.command_id, stale, cmd)
        try:
            self.plant.set_pump_speed(r, cmd.pump_speed_frac)
        except CommandError as exc:
            return self._refuse("set_pump_speed", cmd.rack, cmd.command_id, exc.reason, cmd)
        self._record(self._pump_order, idx, cmd)
        return self._applied(cmd.rack, cmd)

    def _set_levels(self, idx: npt.NDArray[np.int64], level: int, lo_mhz: float, hi_mhz: float) -> None:
        self.level[idx] = level
        self.min_clock_mhz[idx] = lo_mhz
        self.max_clock_mhz[idx] = hi_mhz

    def applied_state(self, r: int, low_power: npt.NDArray[np.bool_] | None = None) -> wire.Outgoing:
        """Rack ``r``'s retained applied state (``low_power``: the plant's, read now if not given;
        ``host_off`` per card where the site's hosts are managed)."""
        cpr = self._cpr
        sl = slice(r * cpr, (r + 1) * cpr)
        if low_power is None:
            low_power = self.plant.low_power()
        host_off = self.plant.host_off()[self._card_host[sl]] if self.site.hosts_managed else None
        self._said_low[sl] = low_power[sl]
        if host_off is not None:
            self._said_host_off[sl] = host_off
        name = self.site.rack_names[r]
        topic = self.codec.topics.applied(name)
        msg = wire.AppliedState(
            rack=name,
            card_index=np.arange(cpr, dtype=np.int64),
            dvfs_level=self.level[sl],
            min_clock_mhz=self.min_clock_mhz[sl],
            max_clock_mhz=self.max_clock_mhz[sl],
            power_limit_w=self.power_limit_w[sl],
            low_power=np.asarray(low_power[sl], dtype=np.bool_),
            last_command_id=self.last_command_id[r],
            ts_s=self.clock(),
            seq=self.sequencer.next(topic),
            publisher=self.publisher,
            host_off=host_off,
        )
        return wire.Outgoing(topic, wire.encode_applied(msg), 1, True)

    # ---- facility and scheduler -----------------------------------------------------------
    def _facility(self, cmd: wire.FacilityCommand) -> list[wire.Outgoing]:
        early = self._judge(cmd, wire.FACILITY)
        if early is not None:
            return early
        idx = np.zeros(1, dtype=np.int64)
        stale = self._superseded(self._setpoint_order, idx, cmd, lambda _i: "the supply set-point")
        if stale is not None:
            self.counts.superseded += 1
            return self._refuse(wire.AckReason.SUPERSEDED.value, wire.FACILITY, cmd.command_id, stale, cmd)
        try:
            self.plant.set_supply_temp(cmd.supply_setpoint_c)
        except CommandError as exc:
            return self._refuse("set_supply_temp", wire.FACILITY, cmd.command_id, exc.reason, cmd)
        self._record(self._setpoint_order, idx, cmd)
        return self._applied(wire.FACILITY, cmd)

    def _scheduler(self, cmd: wire.SchedulerCommand) -> list[wire.Outgoing]:
        early = self._judge(cmd, wire.SCHEDULER)
        if early is not None:
            return early
        cards = self.site.site_cards(cmd.cards)  # decoded: the codec checked racks and cards
        try:
            self.plant.place_job(cmd.job_id, np.asarray(cards, dtype=np.int64))
        except CommandError as exc:
            reason = exc.reason
            if exc.failed_cards:  # named per rack, so that the agent places the job on others (docs/protocol.md)
                reason = wire.placement_card_failed_reason(self.site.cards_by_rack(exc.failed_cards))
            return self._refuse("place", wire.SCHEDULER, cmd.command_id, reason, cmd)
        return self._applied(wire.SCHEDULER, cmd)


_generic = msgspec.json.Decoder()


def _readable_command_id(payload: bytes) -> uuid.UUID | None:
    """The ``command_id`` of a payload the codec rejected, if it is a JSON object with a valid one."""
    try:
        obj = _generic.decode(payload)
        if isinstance(obj, dict):
            raw = obj.get("command_id")
            if isinstance(raw, str) and len(raw) <= 64:
                return uuid.UUID(raw)
    except Exception:
        return None
    return None
