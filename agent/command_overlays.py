"""What the agent's open commands will have set, until they expire, and what refusals hold back.

"What the racks have" is what they report (telemetry, retained applied state) overlaid with the
agent's own open commands until they expire, so that a command is not repeated every period while
telemetry catches up (:meth:`Overlays.have`). Per card and kind of setting (``agent.open_commands``:
a DVFS level, low-power idle, a power limit, the host powered off) :class:`Overlays` keeps the value
an open command sets, its expiry and the command's key (a host command covers all its host's cards);
per facility, rack pump and job the same for the set-point, the pump speeds and the placements.

A rejected card setting is held back for ``command_ttl_s`` on the cards of the refused command
(:meth:`Overlays.refuse`), unless the refusal names a card of it as failed (``card_failed``:
:meth:`Overlays.note_failed`) or a card of it reads failed since
(:meth:`Overlays.lift_refusals_a_failure_explains`): a rack refuses a command whole for one failed card.
The decisions' guard keeps a held setting as in force (:meth:`Overlays.held_back`,
``agent.decision.StepContext.held_level_cards`` and its siblings), so that it budgets what they draw.

A card a ``card_failed`` refusal names counts as failed until a reading of it at least as new
as the refusal: left out of card commands, and out of the decisions' placements
(:meth:`Overlays.unplaceable`), so that no job is placed on it; the decisions budget it as its
readings say (a card a stale scheduler calls failed may be alive and draw power). A scheduler's refusal of a
placement names its failed cards per rack (``wire.placement_card_failed_reason``) and marks them
the same way (:meth:`Overlays.note_failed_placement`).

A card refused as failed again after a reading had cleared its mark (its telemetry reads it
alive: a stale BMC status) would be put back into every command to its rack, refused whole each time,
and the rack's other cards would never get their settings (a scheduler with a stale view of it would
refuse every placement onto it): such a card is held out of commands, and, idle, out of placements
(:meth:`Overlays.unplaceable`), for ``command_ttl_s``, twice that at the next repeat, and so on
up to :data:`FAILED_HOLD_MAX_S`, whatever its readings say; a card setting its rack applies to it
(repaired, replaced) ends the repeats (:meth:`Overlays.note_applied`; a placement the scheduler
applies does not: the rack, not the scheduler, is the authority on a card's health).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.open_commands import N_KINDS, OpenCommand
from twin.spec import SiteSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["FAILED_HOLD_MAX_S", "Holds", "Overlays"]

log = logging.getLogger("racktwin.agent")

#: the longest a card refused as failed again, though its telemetry reads it alive, is held out of
#: commands at a time (the holds double from ``command_ttl_s`` up to it)
FAILED_HOLD_MAX_S = 3600.0


@dataclass(frozen=True)
class Holds:
    """A copy of what :class:`Overlays` holds for the open commands (:meth:`Overlays.holds`)."""

    value: FloatArray
    until: FloatArray
    key: IntArray
    setpoint: tuple[float, float, int] | None
    placing: dict[str, tuple[float, int]]
    pump: dict[int, tuple[float, float, int]]
    pump_sent: FloatArray


class Overlays:
    """What the agent's open commands will have set, until when, and which command set it (see the
    module docstring). :class:`agent.command_book.CommandBook` writes them as commands open and close;
    :class:`agent.command_diff.CommandDiff` reads them."""

    def __init__(self, site: SiteSpec) -> None:
        n = site.n_cards
        self._site = site
        self._cpr = site.cards_per_rack
        self._card_rack = site.card_rack()
        # per kind and card: the value our open commands will have set, until when, and which command
        # set it (HOST: whether the card's host is (to be) off; a host command covers all its cards)
        self.value = np.zeros((N_KINDS, n))
        self.until = np.full((N_KINDS, n), -math.inf)
        self.key = np.zeros((N_KINDS, n), dtype=np.int64)
        self.backoff = np.full((N_KINDS, n), -math.inf)
        self.refused_key = np.zeros((N_KINDS, n), dtype=np.int64)  # the refused command of a backoff
        self.refused_stamp_s = np.full((N_KINDS, n), -math.inf)  # its issue time on the wire
        # when a rack refused a command because these cards had failed (its ack's stamp): a card counts
        # as failed until a reading of it at least as new as that shows what it is (a silent rack shows nothing)
        self.failed_by_ack_s = np.full(n, -math.inf)
        # a card refused as failed again after a reading had cleared its mark: how many times in a row,
        # held out of commands until when whatever its readings say, and for how long that hold was
        self.failed_repeats = np.zeros(n, dtype=np.int64)
        self.failed_hold_until_s = np.full(n, -math.inf)
        self.failed_hold_s = np.zeros(n)
        # when a decision found the card's mark cleared (by a reading, the hold over); inf while a mark
        # is in force or none was ever cleared: a refusal of a command issued since is a repeat
        self._failed_cleared_s = np.full(n, math.inf)
        # the time of the last decision that read the marks (:meth:`_date_marks`; -inf: none yet)
        self._decided_s = -math.inf
        self._rack_names = site.rack_names
        self.setpoint: tuple[float, float, int] | None = None  # set-point, until, key
        self.placing: dict[str, tuple[float, int]] = {}  # job id -> until, key
        self.pump: dict[int, tuple[float, float, int]] = {}  # rack -> speed, until, key
        self.pump_sent = np.full(site.n_racks, -math.inf)  # rack -> when its last pump command was issued

    def have(self, kind: int, reported: FloatArray, now_s: float) -> FloatArray:
        """Per card, what the racks have of a kind of setting: ``reported``, where no open command of
        ours sets it."""
        live = self.until[kind] > now_s
        return np.where(live, self.value[kind], reported)

    def hold(self, kind: int, cards: IntArray, value: float | FloatArray, until_s: float, key: int) -> None:
        """The command ``key`` sets ``value`` on ``cards`` until ``until_s``."""
        self.value[kind, cards] = value
        self.until[kind, cards] = until_s
        self.key[kind, cards] = key

    def holds(self) -> Holds:
        """A copy of what the open commands will have set (the values, expiries and keys of
        :meth:`hold`, the set-point, the pumps, the placements), for :meth:`restore_holds`."""
        return Holds(
            self.value.copy(),
            self.until.copy(),
            self.key.copy(),
            self.setpoint,
            dict(self.placing),
            dict(self.pump),
            self.pump_sent.copy(),
        )

    def restore_holds(self, holds: Holds) -> None:
        """Put back what :meth:`holds` copied (``CommandBook.undo``, ``CommandBook.advice``), in place;
        refusals and failed marks stay."""
        self.value[:], self.until[:], self.key[:] = holds.value, holds.until, holds.key
        self.pump_sent[:] = holds.pump_sent
        self.setpoint = holds.setpoint
        self.placing.clear()
        self.placing.update(holds.placing)
        self.pump.clear()
        self.pump.update(holds.pump)

    def refuse(self, oc: OpenCommand, until_s: float) -> None:
        """A rack refused ``oc`` (a card setting): its cards get no setting of its kind before ``until_s``."""
        mine = oc.cards
        self.backoff[oc.kind, mine] = until_s
        self.refused_key[oc.kind, mine] = oc.key
        self.refused_stamp_s[oc.kind, mine] = oc.ts_s

    def lift_refusals_stamped_after(self, t_s: float) -> None:
        """Lift the holds of refused commands stamped after ``t_s``: the site clock stepped back past
        them (``CommandBook``), and a rack on the new timeline judges their settings again (a refusal
        of one as ``issued_ahead``, its stamp on the old timeline, said nothing of the setting)."""
        self.backoff[self.refused_stamp_s > t_s] = -math.inf

    def note_failed(self, oc: OpenCommand, ack: wire.Acknowledgement, now_s: float, first_hold_s: float) -> None:
        """A ``card_failed`` refusal names the command's dead cards: the refusal no longer holds the
        command's other cards back, and the dead ones count as failed (the next decision's commands
        leave them out) until a reading of them at least as new as the ack. A card may fail unseen: its rack
        silent (the fail-safe caps of a silent rack were refused every ``command_ttl_s`` for the whole
        silence) or after the reading the decision used. A card refused again in a command issued after
        a decision found its mark cleared is held out of commands whatever its readings say:
        ``first_hold_s`` (``command_ttl_s``) the first time, twice as long at each further repeat, at
        most :data:`FAILED_HOLD_MAX_S` (logged once per card and repeat)."""
        local = [c for c in wire.failed_cards_of(ack.reason) if 0 <= c < self._cpr]
        if not local or not oc.cards.size:
            return
        rack = int(self._card_rack[oc.cards[0]])
        named = np.asarray(local, dtype=np.int64) + rack * self._cpr
        dead = named[np.isin(named, oc.cards)]
        if not dead.size:
            return
        # the refusal is explained: the command's other cards are not held back (the next decision
        # leaves the dead cards out while their marks or holds are in force; a card whose mark a
        # reading clears first is sent the setting again with them, and refused again, is a repeat)
        mine = oc.cards[self.refused_key[oc.kind, oc.cards] == oc.key]
        self.backoff[oc.kind, mine] = -math.inf
        self.mark_failed(dead, ack.ts_s, oc.issued_s, now_s, first_hold_s)

    def note_failed_placement(
        self, cards: IntArray, ack: wire.Acknowledgement, issued_s: float, now_s: float, first_hold_s: float
    ) -> None:
        """A scheduler refused a placement on ``cards`` (site indices) issued at ``issued_s`` as
        ``card_failed`` (``wire.placement_card_failed_reason``): the cards of the placement it names
        count as failed as those of a card setting's refusal (:meth:`note_failed`: until a reading of
        them at least as new as the ack; a repeat is held out), so that the next decision neither places the
        job on them again nor sends them settings (a job requeued by the failure asks for a decision
        at once, before the rack's telemetry shows the card)."""
        # free text from the wire: racks the site does not have and cards outside a rack name none of ours
        named = {
            rack: [c for c in local if 0 <= c < self._cpr]
            for rack, local in wire.failed_cards_by_rack(ack.reason).items()
            if rack in self._rack_names
        }
        dead = np.unique(np.asarray(self._site.site_cards(named), dtype=np.int64))
        dead = dead[np.isin(dead, cards)]
        if dead.size:
            self.mark_failed(dead, ack.ts_s, issued_s, now_s, first_hold_s)

    def mark_failed(self, dead: IntArray, ack_ts_s: float, issued_s: float, now_s: float, first_hold_s: float) -> None:
        """Cards ``dead`` (site indices) refused as failed by an ack stamped ``ack_ts_s`` to a command
        issued at ``issued_s``: marked failed until a reading of them at least as new as the ack; those refused
        again after a decision found their marks cleared are held out (:meth:`note_failed`). A rack's
        ack and its readings are stamped by its own clock: a rack whose clock lags the agent's (the other
        racks keep the agent's clock) is judged on it, its next reading after the ack clears the mark."""
        # never later than the agent's clock: an ack stamped ahead would hold the mark past readings
        # that show the card alive (the belief refuses readings stamped that far ahead)
        stamp = min(ack_ts_s, now_s) if math.isfinite(ack_ts_s) else now_s
        self.failed_by_ack_s[dead] = np.maximum(self.failed_by_ack_s[dead], stamp)
        again = dead[issued_s >= self._failed_cleared_s[dead]]
        self._failed_cleared_s[dead] = math.inf
        for c in again.tolist():
            rack = c // self._cpr
            self.failed_repeats[c] += 1
            doublings = min(int(self.failed_repeats[c]) - 1, 64)  # (an hourly repeat for years: no overflow)
            hold_s = min(max(first_hold_s, 1.0) * 2.0**doublings, FAILED_HOLD_MAX_S)
            self.failed_hold_s[c] = hold_s
            self.failed_hold_until_s[c] = now_s + hold_s
            log.warning(
                "rack %s card %d refused as failed again although its telemetry reads it alive: left out of "
                "commands for %g s",
                self._rack_names[rack],
                c - rack * self._cpr,
                hold_s,
                extra={"fields": {"rack": self._rack_names[rack], "card": c - rack * self._cpr, "hold_s": hold_s}},
            )

    def note_applied(self, oc: OpenCommand, ack: wire.Acknowledgement) -> None:
        """A rack applied ``oc`` (a card setting): those of its cards refused as failed before the ack
        are alive (repaired, replaced): their marks and repeats are dropped, and a later refusal of
        them is a first one again. A placement the scheduler applied (``kind`` -1) changes nothing:
        the scheduler takes a card it believes healthy, it does not reach the card, and its view of a
        failure may lag the rack's; a mark ends with the card's next reading anyway, and the decisions
        place no job on a card marked or held (:meth:`unplaceable`), so such a placement
        was sent before the refusal."""
        if oc.kind < 0 or not oc.cards.size:
            return
        alive = oc.cards[np.isfinite(self.failed_by_ack_s[oc.cards]) & (self.failed_by_ack_s[oc.cards] < ack.ts_s)]
        self.failed_by_ack_s[alive] = -math.inf
        self.failed_repeats[alive] = 0
        self.failed_hold_until_s[alive] = -math.inf
        self.failed_hold_s[alive] = 0.0
        self._failed_cleared_s[alive] = math.inf

    def failed_now(self, last_seen_s: FloatArray, now_s: float) -> BoolArray:
        """Per card, whether the decision at ``now_s`` counts it failed by a ``card_failed`` refusal: a
        mark no reading has cleared (:meth:`said_failed`) or a repeat's hold in force. Notes the marks
        found cleared (a refusal of a command issued since is a repeat). Marks and holds from before a
        step back of the site clock are dated on the new timeline first (:meth:`_date_marks`)."""
        self._date_marks(now_s)
        marked = self.said_failed(last_seen_s)
        held = self.failed_hold_until_s > now_s
        cleared = np.isfinite(self.failed_by_ack_s) & ~marked & ~held & (self._failed_cleared_s == math.inf)
        self._failed_cleared_s[cleared] = now_s
        return np.asarray(marked | held, dtype=np.bool_)

    def _date_marks(self, now_s: float) -> None:
        """After the site clock stepped back to before ``now_s``'s decision, the marks and holds of the
        old timeline on the new one: a mark stamped after ``now_s`` dates from just after it, so that it
        lasts until a reading of the card stamped after the first decision on the new timeline (the
        last-seen times the belief brought back to the step, ``TwinState.clock_went_back``, are no new
        readings: a mark dated ``now_s`` itself was cleared by them when the decision came at the
        step's instant, and the card's next refusal counted as a repeat); a hold lasts no longer than
        it was given from ``now_s``. Called with each decision's time before its marks are read: the
        same for its placements (:meth:`unplaceable`) and its commands (:meth:`failed_now`). A step
        back is a decision's time before the last one's (and the first decision, whose marks may come
        from a journal written on another timeline); without one it changes nothing: an ack noted while
        a decision is made (the service's solve runs off the event loop) is stamped after that
        decision's time, and dated back to it, a reading taken before the refusal would clear its mark."""
        stepped_back = now_s < self._decided_s or self._decided_s == -math.inf
        self._decided_s = now_s
        if not stepped_back:
            return
        after = float(np.nextafter(now_s, math.inf))
        np.minimum(self.failed_by_ack_s, after, out=self.failed_by_ack_s)
        np.minimum(self.failed_hold_until_s, now_s + self.failed_hold_s, out=self.failed_hold_until_s)

    def said_failed(self, last_seen_s: FloatArray) -> BoolArray:
        """Per card, whether a ``card_failed`` refusal marks it failed: no reading of it (``last_seen_s``,
        the belief's; NaN: never read) is as new as the refusal (a reading stamped the refusal's own
        instant clears the mark: both come from one step of the rack)."""
        return self.failed_by_ack_s > np.nan_to_num(last_seen_s, nan=-math.inf)

    def unplaceable(self, last_seen_s: FloatArray, now_s: float | None = None) -> BoolArray:
        """Per card, whether the next decision, at ``now_s``, is to place no job on it: a
        ``card_failed`` refusal marks it (:meth:`said_failed`: no reading of it, ``last_seen_s``, since)
        or a repeat's hold holds it out (refused as failed again although its telemetry read it alive;
        from ``now_s``, when given). A job requeued by a card's failure asks for a decision at once,
        before the rack's telemetry shows the card; a scheduler whose view of a card is stale would
        refuse every placement on it again, one per reading of the card. Only placement (and so the
        ready reserve) leaves such a card out (``agent.decision.StepContext.refused_failed_cards``):
        the decision budgets and levels it as its readings say, an idle one in the low-power state it
        reports (a card a stale scheduler calls failed while its rack reads it alive draws its power);
        a busy one is no free card anyway. Notes no mark cleared (unlike :meth:`failed_now`); with
        ``now_s``, dates the marks and holds of a timeline the site clock stepped back from as
        :meth:`failed_now` does (:meth:`_date_marks`), so that the decision at ``now_s`` judges them
        alike for its placements and its commands."""
        if now_s is not None:
            self._date_marks(now_s)
        out = self.said_failed(np.asarray(last_seen_s, dtype=np.float64))
        if now_s is not None:
            out |= self.failed_hold_until_s > now_s
        return out

    def failed_marks(self, last_seen_s: FloatArray) -> dict[int, float]:
        """The marks in force (:meth:`said_failed`): card -> the refusal's stamp (kept in the journal
        for a restart: ``agent.resume.FailedCardsRecord``)."""
        return {int(c): float(self.failed_by_ack_s[c]) for c in np.flatnonzero(self.said_failed(last_seen_s))}

    def restore_failed_marks(self, marks: dict[int, float]) -> None:
        """Marks kept by :meth:`failed_marks` before a restart (a card outside the site is passed over)."""
        for card, stamp in marks.items():
            if 0 <= card < self.failed_by_ack_s.size and math.isfinite(stamp):
                self.failed_by_ack_s[card] = max(self.failed_by_ack_s[card], stamp)

    def failed_repeat_holds(self) -> dict[int, tuple[int, float, float]]:
        """The cards refused as failed again (card -> repeats, the hold's end, its length), kept in the
        journal with the marks for a restart (``agent.resume.FailedCardsRecord``)."""
        return {
            int(c): (int(self.failed_repeats[c]), float(self.failed_hold_until_s[c]), float(self.failed_hold_s[c]))
            for c in np.flatnonzero(self.failed_repeats > 0)
        }

    def restore_failed_repeat_holds(self, holds: dict[int, tuple[int, float, float]]) -> None:
        """Repeats kept by :meth:`failed_repeat_holds` before a restart (restore the marks first): a
        hold goes on to its end; the next refusal of a card whose mark is not in force is a repeat
        (a card outside the site, or a repeat count below 1, is passed over)."""
        for card, (repeats, until_s, hold_s) in holds.items():
            if not (0 <= card < self.failed_repeats.size and repeats >= 1 and math.isfinite(hold_s) and hold_s >= 0):
                continue
            self.failed_repeats[card] = repeats
            self.failed_hold_s[card] = min(hold_s, FAILED_HOLD_MAX_S)
            self.failed_hold_until_s[card] = until_s if math.isfinite(until_s) else -math.inf
            if not math.isfinite(self.failed_by_ack_s[card]):
                self._failed_cleared_s[card] = -math.inf

    def lift_refusals_a_failure_explains(self, failed: BoolArray, now_s: float) -> None:
        """A rack refuses a command whole when one of its cards has failed, and the card may fail
        after the reading the command was decided on: once a card of a refused command reads failed,
        the refusal is explained and the command's other cards are not held back for the rest of
        their backoff (the decision leaves the failed card out)."""
        self.backoff[self._explained(self.backoff > now_s, failed)] = -math.inf

    def held_back(self, failed: BoolArray, now_s: float) -> BoolArray:
        """Per kind of card setting (``agent.open_commands``: LEVEL, SLEEP, LIMIT, HOST) and card, whether
        a refusal holds that setting back at ``now_s``: the decision at ``now_s`` sends the card none of
        that kind (``agent.command_diff``), and the guard keeps it as the card reports it. ``failed``: per
        card, read failed or said failed by a ``card_failed`` refusal; a refusal such a card explains holds
        nothing back (:meth:`lift_refusals_a_failure_explains`, which the diff applies first)."""
        held = self.backoff > now_s
        return np.asarray(held & ~self._explained(held, np.asarray(failed, dtype=bool)), dtype=np.bool_)

    def _explained(self, held: BoolArray, failed: BoolArray) -> BoolArray:
        """Per kind and card, the ``held`` refusals a ``failed`` card explains: those of every refused
        command with a failed card among the cards it holds back."""
        out = np.zeros_like(held)
        explained = held & failed[np.newaxis, :]
        if not explained.any():
            return out
        for kind in range(N_KINDS):
            keys = np.unique(self.refused_key[kind, explained[kind]])
            if keys.size:
                out[kind] = held[kind] & np.isin(self.refused_key[kind], keys)
        return out

    def release(self, oc: OpenCommand) -> None:
        """Clear what a closed command would have set (what it alone set: not what a newer command
        set since)."""
        if oc.kind >= 0 and oc.cards.size:
            mine = oc.cards[self.key[oc.kind, oc.cards] == oc.key]
            self.until[oc.kind, mine] = -math.inf
        if self.setpoint is not None and self.setpoint[2] == oc.key:
            self.setpoint = None
        for r, (_speed, _until, key) in list(self.pump.items()):
            if key == oc.key:
                del self.pump[r]
                self.pump_sent[r] = -math.inf  # not applied: send again at the next decision
        for jid, (_until, key) in list(self.placing.items()):
            if key == oc.key:
                del self.placing[jid]
