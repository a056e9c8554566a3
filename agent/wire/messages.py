"""The code's message types (SI units, numpy arrays for per-card data), and command helpers
(:func:`new_command_id`, :func:`is_expired`, :func:`ack_for`, :class:`Sequencer`, :func:`approx_equal`)."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from agent.wire.schemas import MAX_TEXT_CHARS
from agent.wire.topics import _IDENT_RE, FACILITY, SCHEDULER
from twin.readings import MAX_PUMP_SPEED_FRAC
from twin.workload import JobSpec, Phase

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]


def _fields_equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y)):
                return False
        elif x != y:
            return False
    return True


@dataclass(frozen=True, eq=False)
class CardBatch:
    """One rack's card readings (``racktwin.cards/1``). Arrays are parallel, one entry per card in
    ``card_index`` (a batch may hold a subset of the rack's cards, e.g. when a card is missing).
    ``utilization`` is a fraction 0..1 (percent on the wire). ``host_off``: the card's host is
    powered off (its card is then also ``low_power`` and draws nothing); None where the publisher does
    not say (a site without host power management, or a publisher older than the column)."""

    rack: str
    card_index: IntArray
    power_w: FloatArray
    temp_c: FloatArray
    sm_clock_mhz: FloatArray
    utilization: FloatArray
    power_limit_w: FloatArray
    low_power: BoolArray
    ts_s: float
    seq: int
    publisher: str
    host_off: BoolArray | None = None

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class CduReading:
    """A rack loop's CDU (``racktwin.cdu/1``): secondary supply/return temperature, flow, pump."""

    rack: str
    supply_temp_c: float
    return_temp_c: float
    flow_lpm: float
    delta_pressure_pa: float
    pump_power_w: float
    ts_s: float
    seq: int
    publisher: str
    # the pump's commanded speed, fraction of nominal (percent on the wire); None: not reported, as the
    # wire's absent field (publishers before it), and so when a caller leaves it out: the belief then
    # knows no speed (twin.readings.LoopReading's NaN), and reads a pump slowed on purpose as neither
    # weak (twin.estimate) nor at full speed (agent.controller: the speed last commanded)
    pump_speed_frac: float | None = None


@dataclass(frozen=True, slots=True)
class PduReading:
    """A rack's power as its PDUs measure it (``racktwin.pdu/1``): cards + host overhead."""

    rack: str
    power_w: float
    ts_s: float
    seq: int
    publisher: str


@dataclass(frozen=True, slots=True)
class FacilityReading:
    """The facility (``racktwin.facility/1``): ambient, facility water loop, powers, set-point."""

    ambient_temp_c: float
    supply_temp_c: float
    return_temp_c: float
    cooling_power_w: float
    it_power_w: float
    facility_power_w: float
    supply_setpoint_c: float
    ts_s: float
    seq: int
    publisher: str


class JobEventType(enum.StrEnum):
    SUBMITTED = "submitted"  # carries ``job`` (the JobSpec)
    STARTED = "started"  # carries ``cards`` (rack -> card indices)
    PHASE_CHANGED = "phase_changed"  # carries ``phase``
    FINISHED = "finished"
    FAILED = "failed"  # may carry ``reason``
    REQUEUED = "requeued"  # a card failed: the job lost its cards and is queued again (may carry ``reason``)


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job's life (``racktwin.job_event/1``) from the site's scheduler (or the simulator)."""

    event: JobEventType
    job_id: str
    ts_s: float
    seq: int
    publisher: str
    job: JobSpec | None = None
    cards: Mapping[str, tuple[int, ...]] | None = None
    phase: Phase | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JobStateEntry:
    """One job of a :class:`JobState`: its spec (as in ``submitted``) and, for a running job, its
    ``cards`` (rack -> card indices, as in ``started``) and ``phase``; both None for a queued job."""

    job: JobSpec
    cards: Mapping[str, tuple[int, ...]] | None = None
    phase: Phase | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def running(self) -> bool:
        return self.cards is not None


@dataclass(frozen=True, slots=True)
class JobState:
    """The scheduler's jobs (``racktwin.job_state/1``, retained): every queued and running job, sent
    after the job events of a change and numbered by the same ``seq`` counter as those events (so a
    receiver tells which is newer: a later ``ts``, or the same ``ts`` and a higher ``seq``)."""

    jobs: tuple[JobStateEntry, ...]
    ts_s: float
    seq: int
    publisher: str


class CardAction(enum.StrEnum):
    SET_DVFS_LEVEL = "set_dvfs_level"  # dvfs_level
    SET_CLOCK_RANGE = "set_clock_range"  # min_clock_mhz, max_clock_mhz
    SET_POWER_LIMIT = "set_power_limit"  # power_limit_w (one value for every card, or one per card)
    LOW_POWER_IDLE = "low_power_idle"
    WAKE = "wake"
    # whole hosts: ``cards`` lists every card of each host to switch (rack-local, like every action)
    HOST_POWER_OFF = "host_power_off"
    HOST_POWER_ON = "host_power_on"


_ACTION_PARAMS: Final[dict[CardAction, frozenset[str]]] = {
    CardAction.SET_DVFS_LEVEL: frozenset({"dvfs_level"}),
    CardAction.SET_CLOCK_RANGE: frozenset({"min_clock_mhz", "max_clock_mhz"}),
    CardAction.SET_POWER_LIMIT: frozenset({"power_limit_w"}),
    CardAction.LOW_POWER_IDLE: frozenset(),
    CardAction.WAKE: frozenset(),
    CardAction.HOST_POWER_OFF: frozenset(),
    CardAction.HOST_POWER_ON: frozenset(),
}
_PARAM_WIRE: Final = {
    "dvfs_level": "dvfs_level",
    "min_clock_mhz": "min_sm_clock_mhz",
    "max_clock_mhz": "max_sm_clock_mhz",
    "power_limit_w": "power_limit_watts",
}


@dataclass(frozen=True, slots=True)
class CardSetting:
    """What to do to cards: an action and exactly the parameters it takes. Use the constructors.

    ``power_limit_w`` is one limit for every listed card, or a tuple of limits aligned with the
    command's ``cards`` (one per card: the guard's die limits differ card by card, and one command per
    distinct value would flood the wire); :meth:`limits_w` gives the per-card values either way."""

    action: CardAction
    dvfs_level: int | None = None
    min_clock_mhz: float | None = None
    max_clock_mhz: float | None = None
    power_limit_w: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        problem = _setting_problem(self)
        if problem:
            raise ValueError(problem)

    @classmethod
    def dvfs(cls, level: int) -> CardSetting:
        return cls(CardAction.SET_DVFS_LEVEL, dvfs_level=level)

    @classmethod
    def clock_range(cls, min_clock_mhz: float, max_clock_mhz: float) -> CardSetting:
        return cls(CardAction.SET_CLOCK_RANGE, min_clock_mhz=min_clock_mhz, max_clock_mhz=max_clock_mhz)

    @classmethod
    def power_limit(cls, power_limit_w: float | Sequence[float]) -> CardSetting:
        """One limit for every card (a number) or one per card (a sequence aligned with ``cards``)."""
        if isinstance(power_limit_w, int | float):
            return cls(CardAction.SET_POWER_LIMIT, power_limit_w=float(power_limit_w))
        return cls(CardAction.SET_POWER_LIMIT, power_limit_w=tuple(float(x) for x in power_limit_w))

    @property
    def per_card(self) -> bool:
        """The setting carries one value per card (a columnar ``power_limit_watts``)."""
        return isinstance(self.power_limit_w, tuple)

    def limits_w(self, n_cards: int) -> tuple[float, ...]:
        """The power limit of each of ``n_cards`` listed cards (a single value repeated)."""
        v = self.power_limit_w
        if v is None:
            raise ValueError(f"action {self.action.value} sets no power limit")
        if isinstance(v, tuple):
            if len(v) != n_cards:
                raise ValueError(f"power_limit_watts has {len(v)} values for {n_cards} cards")
            return v
        return (float(v),) * n_cards

    @classmethod
    def low_power_idle(cls) -> CardSetting:
        return cls(CardAction.LOW_POWER_IDLE)

    @classmethod
    def wake(cls) -> CardSetting:
        return cls(CardAction.WAKE)

    @classmethod
    def host_power_off(cls) -> CardSetting:
        """Power off the hosts of the listed cards (the command must list every card of each host)."""
        return cls(CardAction.HOST_POWER_OFF)

    @classmethod
    def host_power_on(cls) -> CardSetting:
        """Power on (boot) the hosts of the listed cards (every card of each host listed)."""
        return cls(CardAction.HOST_POWER_ON)


def _param_list(names: Iterable[str]) -> str:
    return ", ".join(sorted(_PARAM_WIRE[n] for n in names)) or "no parameters"


def _setting_problem(s: CardSetting) -> str | None:
    want = _ACTION_PARAMS[s.action]
    given = {p for p in _PARAM_WIRE if getattr(s, p) is not None}
    if given != want:
        return f"action {s.action.value} takes {_param_list(want)}, got {_param_list(given)}"
    if s.dvfs_level is not None and not 0 <= s.dvfs_level <= 255:
        return f"dvfs_level {s.dvfs_level} outside 0..255"
    if s.min_clock_mhz is not None and s.max_clock_mhz is not None and not 0 < s.min_clock_mhz <= s.max_clock_mhz:
        return f"clock range needs 0 < min_sm_clock_mhz <= max_sm_clock_mhz, got {s.min_clock_mhz}..{s.max_clock_mhz}"
    if isinstance(s.power_limit_w, tuple):
        if not s.power_limit_w:
            return "power_limit_watts must not be an empty list"
        bad = [x for x in s.power_limit_w if not (math.isfinite(x) and x > 0)]
        if bad:
            return f"power_limit_watts must be positive, got {bad[0]}"
    elif s.power_limit_w is not None and not (math.isfinite(s.power_limit_w) and s.power_limit_w > 0):
        return f"power_limit_watts must be positive, got {s.power_limit_w}"
    return None


def _cards_problem(cards: Sequence[int], setting: CardSetting) -> str | None:
    if isinstance(setting.power_limit_w, tuple) and len(setting.power_limit_w) != len(cards):
        return f"power_limit_watts has {len(setting.power_limit_w)} values for {len(cards)} cards"
    return None


@dataclass(frozen=True, slots=True)
class RackCommand:
    """A command to cards of one rack (``racktwin.rack_cmd/1``, QoS 1, never retained).

    ``ts_s`` is the issue time, ``expires_s`` the absolute time after which it must not be applied
    (:func:`is_expired`), both on the site's clock."""

    rack: str
    cards: tuple[int, ...]
    setting: CardSetting
    command_id: uuid.UUID
    expires_s: float
    ts_s: float
    seq: int
    publisher: str

    def __post_init__(self) -> None:
        problem = _cards_problem(self.cards, self.setting)
        if problem:
            raise ValueError(problem)


@dataclass(frozen=True, slots=True)
class CduCommand:
    """A new pump speed for one rack loop's CDU (``racktwin.cdu_cmd/1``, QoS 1, never retained).

    ``pump_speed_frac`` is a fraction of the nominal speed (percent on the wire); the loop's flow
    follows it. The plant holds a slowed pump only for a while after the last command (its
    ``pump_hold_s``) and then returns it to full speed: the agent renews it."""

    rack: str
    pump_speed_frac: float
    command_id: uuid.UUID
    expires_s: float
    ts_s: float
    seq: int
    publisher: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.pump_speed_frac) and 0.0 < self.pump_speed_frac <= MAX_PUMP_SPEED_FRAC):
            raise ValueError(f"pump_speed_frac must be within (0, {MAX_PUMP_SPEED_FRAC:g}], got {self.pump_speed_frac}")


@dataclass(frozen=True, slots=True)
class FacilityCommand:
    """A new coolant supply set-point for the facility (``racktwin.facility_cmd/1``)."""

    supply_setpoint_c: float
    command_id: uuid.UUID
    expires_s: float
    ts_s: float
    seq: int
    publisher: str


@dataclass(frozen=True, slots=True)
class SchedulerCommand:
    """Place a queued job on given cards (``racktwin.scheduler_cmd/1``)."""

    job_id: str
    cards: Mapping[str, tuple[int, ...]]
    command_id: uuid.UUID
    expires_s: float
    ts_s: float
    seq: int
    publisher: str


Command: TypeAlias = RackCommand | CduCommand | FacilityCommand | SchedulerCommand


class AckResult(enum.StrEnum):
    APPLIED = "applied"
    REJECTED = "rejected"  # with a reason
    EXPIRED = "expired"  # received after its expiry, not applied


class AckReason(enum.StrEnum):
    """The codes a rack puts first in an ack's ``reason`` (``"<code>: <detail>"``) for the rules of
    docs/protocol.md, "Which commands a rack applies", so that a sender can tell them apart
    (:func:`reason_code`). Refusals by the hardware itself (a level outside the table, a busy card)
    carry free text."""

    TTL_TOO_LONG = "ttl_too_long"  # rejected: expires_at - ts above MAX_COMMAND_TTL_S
    ISSUED_AHEAD = "issued_ahead"  # rejected: ts too far ahead of the target's clock
    DUPLICATE = "duplicate"  # a copy of a command already answered: that answer again, not applied again
    SUPERSEDED = "superseded"  # rejected: a command issued later was applied to a card (pump, set-point) of it
    HOST_OFF = "host_off"  # rejected: a card of it is on a powered-off host (the card cannot be reached)
    CARD_FAILED = "card_failed"  # rejected: cards of it have failed (named: failed_cards_of); the others would take it


#: The longest a command may live, ``expires_at - ts`` (site seconds): a rack refuses a longer one
#: (``ttl_too_long``). A command is meant for the next minutes; the agent sends 30 s by default.
MAX_COMMAND_TTL_S: Final = 3600.0
#: How far a command's ``ts`` may lie ahead of its target's clock (a rack's, the facility's, the
#: scheduler's; site seconds) before the target refuses it (``issued_ahead``). The simulator allows
#: ten wall seconds of its site time when that is more.
MAX_ISSUE_AHEAD_S: Final = 10.0


def card_failed_reason(rack: str, cards: Sequence[int]) -> str:
    """The reason of a rack command refused because cards of it have failed: ``card_failed: card 36 of
    rack r2 has failed`` or ``card_failed: cards 4, 36 of rack r2 have failed`` (rack-local indices,
    every failed card of the command), read back by :func:`failed_cards_of`. Within the wire's text
    bound (``MAX_TEXT_CHARS``): a list too long for it names the first cards that fit and ``and N
    more`` (all 256 cards of a rack: ``cards 0, 1, ..., 202 and 53 more of rack r2 have failed``), so
    that no number is cut."""
    return _card_failed_text({rack: cards}, "a dead card takes no setting; the command's other cards would")


def placement_card_failed_reason(cards: Mapping[str, Sequence[int]]) -> str:
    """The reason of a scheduler's ``place`` refused because cards of it have failed, naming every
    failed card of the placement per rack (rack-local indices), one clause per rack in the form of
    :func:`card_failed_reason`, joined by ``; ``: ``card_failed: card 5 of rack r0 has failed; cards
    2, 7 of rack r1 have failed (...)``, read back by :func:`failed_cards_by_rack`. Within the wire's
    text bound (``MAX_TEXT_CHARS``): the racks' clauses that fit whole, then the first cards of the
    next that fit with ``and N more``; the racks after it are left out (the next refusal names them)."""
    return _card_failed_text(cards, "a dead card takes no job; the placement may be sent again without it")


def _card_failed_text(cards: Mapping[str, Sequence[int]], note: str) -> str:
    head = f"{AckReason.CARD_FAILED.value}: "
    tail = f" ({note})"
    room = MAX_TEXT_CHARS - len(head) - len(tail)
    clauses: list[str] = []
    for rack, local in cards.items():
        if not local:
            continue
        sep = "; " if clauses else ""
        verb = "has" if len(local) == 1 else "have"
        noun = "card" if len(local) == 1 else "cards"
        names = [str(int(c)) for c in local]
        whole = f"{sep}{noun} {', '.join(names)} of rack {rack} {verb} failed"
        if len(whole) <= room:
            clauses.append(whole)
            room -= len(whole)
            continue
        # the first cards that fit, and how many more (counted after each card: one digit less may let
        # the next card fit): no number is cut
        kept: list[str] = []
        used = 0
        for name in names:
            add = len(name) + (2 if kept else 0)
            left = len(names) - len(kept) - 1
            fixed = len(f"{sep}{noun}  and {left} more of rack {rack} {verb} failed")
            if fixed + used + add > room:
                break
            kept.append(name)
            used += add
        if kept:
            clauses.append(
                f"{sep}{noun} {', '.join(kept)} and {len(names) - len(kept)} more of rack {rack} {verb} failed"
            )
        break
    return head + "".join(clauses) + tail


# the list ends where the reason goes on ("and N more", "of rack"): a reason cut inside its list (by a
# sender that cuts its text) names no card
_FAILED_CARDS = re.compile(r"\s*cards?\s+(\d+(?:\s*,\s*\d+)*)(?:\s+and\s+\d+\s+more)?\s+of\s+rack\b")
# one rack's clause of a placement's card_failed reason, read whole (its rack and "failed" included)
_FAILED_CLAUSE = re.compile(
    r"\s*cards?\s+(\d+(?:\s*,\s*\d+)*)(?:\s+and\s+\d+\s+more)?\s+of\s+rack\s+([A-Za-z0-9_.:@-]+)\s+(?:has|have)\s+failed"
)
_MAX_CARD_DIGITS: Final = 9  # a longer number is no card of any rack (MAX_CARDS_PER_RACK): passed over


def failed_cards_of(reason: str | None) -> tuple[int, ...]:
    """The rack-local cards a ``card_failed`` refusal names (:func:`card_failed_reason`; with ``and N
    more``, those listed); empty for any other reason, or one whose list cannot be read."""
    if reason_code(reason) != AckReason.CARD_FAILED or reason is None:
        return ()
    m = _FAILED_CARDS.match(reason.partition(":")[2])  # (a bare "card_failed" names none)
    if not m:
        return ()
    return _card_numbers(m[1])


def failed_cards_by_rack(reason: str | None) -> dict[str, tuple[int, ...]]:
    """The cards a ``card_failed`` refusal names, per rack (rack name -> rack-local cards): the
    clauses of :func:`placement_card_failed_reason` (a rack command's :func:`card_failed_reason` is
    one clause), read in order up to the first that cannot be read whole (a reason cut inside a
    clause names none of its cards); empty for any other reason."""
    if reason_code(reason) != AckReason.CARD_FAILED or reason is None:
        return {}
    text = reason.partition(":")[2]
    out: dict[str, tuple[int, ...]] = {}
    pos = 0
    while True:
        m = _FAILED_CLAUSE.match(text, pos)
        if not m:
            return out
        out[m[2]] = out.get(m[2], ()) + _card_numbers(m[1])
        pos = m.end()
        if not text.startswith(";", pos):
            return out
        pos += 1


def _card_numbers(listed: str) -> tuple[int, ...]:
    return tuple(int(c) for c in (t.strip() for t in listed.split(",")) if len(c) <= _MAX_CARD_DIGITS)


def reason_code(reason: str | None) -> str:
    """The code before the first ``:`` of an ack's reason (``"superseded"``; ``""`` for none)."""
    if not reason:
        return ""
    return reason.split(":", 1)[0].strip()


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """The answer to a command (``racktwin.ack/1``). ``target`` is the rack name, ``"facility"``
    or ``"scheduler"`` and decides the topic."""

    target: str
    command_id: uuid.UUID
    result: AckResult
    ts_s: float
    seq: int
    publisher: str
    reason: str | None = None


@dataclass(frozen=True, eq=False)
class AppliedState:
    """What a rack has applied to its cards (``racktwin.applied/1``, retained), per card.
    ``dvfs_level`` is the level whose clock is the applied maximum clock. ``host_off``: the card's
    host is powered off (None where the publisher does not say)."""

    rack: str
    card_index: IntArray
    dvfs_level: IntArray
    min_clock_mhz: FloatArray
    max_clock_mhz: FloatArray
    power_limit_w: FloatArray
    low_power: BoolArray
    last_command_id: uuid.UUID | None
    ts_s: float
    seq: int
    publisher: str
    host_off: BoolArray | None = None

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


class AgentState(enum.StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """The agent's status (``racktwin.agent_status/1``, retained; its last will says offline)."""

    state: AgentState
    version: str
    ts_s: float
    seq: int
    publisher: str
    mode: str | None = None  # "advisory" or "enforce"
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class AdviceItem:
    """One recommended card setting (what the agent would command in enforce mode)."""

    rack: str
    cards: tuple[int, ...]
    setting: CardSetting

    def __post_init__(self) -> None:
        problem = _cards_problem(self.cards, self.setting)
        if problem:
            raise ValueError(problem)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    cards: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class AgentAdvice:
    """The agent's advice (``racktwin.advice/1``): settings, set-point and placements it recommends,
    with the powers it predicts for them."""

    items: tuple[AdviceItem, ...]
    ts_s: float
    seq: int
    publisher: str
    supply_setpoint_c: float | None = None
    placements: tuple[Placement, ...] = ()
    predicted_it_power_w: float | None = None
    predicted_facility_power_w: float | None = None
    summary: str | None = None
    pump_speeds: Mapping[str, float] = dataclasses.field(default_factory=dict)  # rack -> fraction of nominal


Message: TypeAlias = (
    CardBatch
    | CduReading
    | PduReading
    | FacilityReading
    | JobEvent
    | JobState
    | RackCommand
    | CduCommand
    | FacilityCommand
    | SchedulerCommand
    | Acknowledgement
    | AppliedState
    | AgentStatus
    | AgentAdvice
)


def new_command_id() -> uuid.UUID:
    return uuid.uuid4()


def is_expired(cmd: Command, now_s: float) -> bool:
    """True when ``now_s`` (site clock) is at or past the command's expiry: it must not be applied."""
    return now_s >= cmd.expires_s


def command_time_problem(cmd: Command, now_s: float, max_ahead_s: float = MAX_ISSUE_AHEAD_S) -> str | None:
    """Why the target (a rack, the facility, the scheduler) must refuse ``cmd`` for its times (an ack
    reason, ``"<code>: <detail>"``), or None: it lives longer than :data:`MAX_COMMAND_TTL_S`, or its
    issue time is more than ``max_ahead_s`` ahead of the target's clock ``now_s`` (the reason names
    whose: ``the clock of rack r0``, ``of the facility``, ``of the scheduler``). Judge
    :func:`is_expired` first."""
    ttl_s = cmd.expires_s - cmd.ts_s
    if ttl_s > MAX_COMMAND_TTL_S:
        return (
            f"{AckReason.TTL_TOO_LONG.value}: expires_at is {ttl_s:.6g} s after ts; "
            f"a command may live at most {MAX_COMMAND_TTL_S:g} s"
        )
    ahead_s = cmd.ts_s - now_s
    if ahead_s > max_ahead_s:
        return (
            f"{AckReason.ISSUED_AHEAD.value}: ts {cmd.ts_s:.3f} is {ahead_s:.6g} s ahead of the clock of "
            f"{_target_words(cmd)} ({now_s:.3f}); at most {max_ahead_s:g} s is accepted"
        )
    return None


def ack_for(
    cmd: Command, result: AckResult, *, ts_s: float, seq: int, publisher: str, reason: str | None = None
) -> Acknowledgement:
    """The acknowledgement of ``cmd`` (its target follows the command's kind: a rack's pump command is
    acked on the rack's ack topic)."""
    target = _target(cmd)
    return Acknowledgement(target, cmd.command_id, result, ts_s=ts_s, seq=seq, publisher=publisher, reason=reason)


def _target(cmd: Command) -> str:
    """Who applies ``cmd``: its rack (a card or pump command), :data:`FACILITY` or :data:`SCHEDULER`."""
    if isinstance(cmd, RackCommand | CduCommand):
        return cmd.rack
    return FACILITY if isinstance(cmd, FacilityCommand) else SCHEDULER


def _target_words(cmd: Command) -> str:
    """``_target`` in a reason's words: ``rack r0``, ``the facility``, ``the scheduler``."""
    return f"rack {cmd.rack}" if isinstance(cmd, RackCommand | CduCommand) else f"the {_target(cmd)}"


class Sequencer:
    """Per-topic sequence numbers of one publisher: ``seq = sequencer.next(topic)`` (0, 1, 2, ...)."""

    __slots__ = ("_next", "publisher")

    def __init__(self, publisher: str) -> None:
        if not _IDENT_RE.match(publisher):  # what a receiver accepts (wire.schemas)
            raise ValueError(f"publisher id {publisher!r}: use 1-128 of A-Z a-z 0-9 _ . : @ -")
        self.publisher = publisher
        self._next: dict[str, int] = {}

    def next(self, topic: str) -> int:
        n = self._next.get(topic, 0)
        self._next[topic] = n + 1
        return n

    def mark(self) -> dict[str, int]:
        """The next numbers per topic, for :meth:`rewind`."""
        return dict(self._next)

    def rewind(self, mark: dict[str, int]) -> None:
        """Number again from ``mark`` (:meth:`mark`): the numbers drawn since were never published (a
        receiver would see a gap in the sequence)."""
        self._next = dict(mark)


def approx_equal(a: Any, b: Any, *, rel_tol: float = 1e-9, abs_tol: float = 1e-12) -> bool:
    """Equality up to float rounding (unit conversions like percent <-> fraction are not exact)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.shape == b.shape
            and a.dtype.kind == b.dtype.kind
            and bool(np.allclose(a, b, rtol=rel_tol, atol=abs_tol, equal_nan=False))
        )
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
        )
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(
            approx_equal(getattr(a, f.name), getattr(b, f.name), rel_tol=rel_tol, abs_tol=abs_tol)
            for f in dataclasses.fields(a)
        )
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(approx_equal(a[k], b[k], rel_tol=rel_tol, abs_tol=abs_tol) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(
            approx_equal(x, y, rel_tol=rel_tol, abs_tol=abs_tol) for x, y in zip(a, b, strict=True)
        )
    return bool(a == b)
