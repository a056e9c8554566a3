"""The racktwin MQTT protocol, version 1: topics, payload schemas, encode/decode and validation.

Everything that crosses the broker is defined here, and only here are wire units converted to the
code's units. See ``docs/protocol.md`` for the topic table and every payload.

* Topics live under ``racktwin/v1/{site}/``: per rack
  ``rack/{rack}/{cards,cdu,pdu,cmd,cdu_cmd,ack,applied}``,
  per site ``facility``, ``facility/cmd``, ``facility/ack``, ``jobs/events``, ``scheduler/cmd``,
  ``scheduler/ack``, ``agent/status``, ``agent/advice``. :class:`Topics` builds them.
* Payloads are JSON objects with ``schema`` (``"racktwin.cards/1"``: name and major version),
  ``ts`` (seconds since the epoch on the publisher's clock; a simulator's accelerated clock is its
  clock), ``seq`` (per publisher and topic, +1 per message) and ``publisher`` (the sender's id).
  Field names follow Redfish and DCGM in snake_case with the unit spelled out
  (``power_watts``, ``temperature_celsius``, ``flow_liters_per_minute``, ``delta_pressure_kpa``).
* Decoding never raises into the caller: :meth:`Codec.decode` returns a typed message or a
  :class:`Rejection` whose :class:`RejectReason` is counted by a :class:`RejectionCounter` and
  logged (rate-limited). Validation is done by msgspec while it parses (types, required and unknown
  fields, physical ranges), then by a few cross-field checks (card indices inside the rack and not
  repeated, equal column lengths, command parameters that fit the action, expiry after issue).

Conversions (wire -> code): percent -> fraction 0..1 (``utilization``), kPa -> Pa, everything else
keeps its unit under the code's short name (``power_watts`` -> ``power_w``, ``temperature_celsius``
-> ``temp_c``, ``flow_liters_per_minute`` -> ``flow_lpm`` as in ``twin``, ``sm_clock_mhz`` ->
``sm_clock_mhz``, ``ts`` -> ``ts_s``).

Card telemetry is columnar (one array per field, ``card_index`` says which cards): a 64-card
message is 2.9 KB and decodes + validates + converts to numpy in ~31 us (0.5 us per card reading),
against 10.5 KB and ~49 us for a list of per-card objects (``benchmarks/bench_wire.py``,
``benchmarks/results-wire.md``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, TypeAlias

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Meta

from twin.workload import JobSpec, Phase

__all__ = [
    "FACILITY",
    "MAX_CARDS_PER_RACK",
    "MAX_PAYLOAD_BYTES",
    "PROTOCOL_PREFIX",
    "SCHEDULER",
    "SCHEMAS",
    "AckResult",
    "Acknowledgement",
    "AdviceItem",
    "AgentAdvice",
    "AgentState",
    "AgentStatus",
    "AppliedState",
    "CardAction",
    "CardBatch",
    "CardSetting",
    "CduCommand",
    "CduReading",
    "Codec",
    "FacilityCommand",
    "FacilityReading",
    "JobEvent",
    "JobEventType",
    "Kind",
    "Message",
    "Outgoing",
    "PduReading",
    "Placement",
    "RackCommand",
    "RejectReason",
    "Rejection",
    "RejectionCounter",
    "SchedulerCommand",
    "Sequencer",
    "SiteLayout",
    "TopicInfo",
    "Topics",
    "ack_for",
    "approx_equal",
    "encode",
    "encode_ack",
    "encode_advice",
    "encode_agent_status",
    "encode_applied",
    "encode_card_batch",
    "encode_cdu",
    "encode_cdu_command",
    "encode_facility",
    "encode_facility_command",
    "encode_job_event",
    "encode_pdu",
    "encode_rack_command",
    "encode_scheduler_command",
    "is_expired",
    "kind_of",
    "new_command_id",
]

log = logging.getLogger("racktwin.wire")

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

PROTOCOL_PREFIX: Final = "racktwin/v1"
#: Payloads larger than this are rejected unread (a 64-card batch is ~2.7 KB; 4,096 cards ~170 KB).
MAX_PAYLOAD_BYTES: Final = 256 * 1024
#: No rack may hold more cards than this (bounds every per-card array before the site check).
MAX_CARDS_PER_RACK: Final = 4096
#: Ack targets that are not racks.
FACILITY: Final = "facility"
SCHEDULER: Final = "scheduler"
_RESERVED_NAMES: Final = frozenset({FACILITY, SCHEDULER, "rack", "jobs", "agent", "observer", "sim"})
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")

# --------------------------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------------------------


class Kind(enum.StrEnum):
    """One kind of message; each has its own topic, schema, QoS and retain flag."""

    CARDS = "cards"
    CDU = "cdu"
    PDU = "pdu"
    RACK_CMD = "rack_cmd"
    CDU_CMD = "cdu_cmd"
    RACK_ACK = "rack_ack"
    APPLIED = "applied"
    FACILITY = "facility"
    FACILITY_CMD = "facility_cmd"
    FACILITY_ACK = "facility_ack"
    JOB_EVENT = "job_event"
    SCHEDULER_CMD = "scheduler_cmd"
    SCHEDULER_ACK = "scheduler_ack"
    AGENT_STATUS = "agent_status"
    ADVICE = "advice"


@dataclass(frozen=True, slots=True)
class _KindSpec:
    path: str  # after racktwin/v1/{site}/ ; rack kinds: after rack/{rack}/
    rack_scoped: bool
    schema: str
    qos: int
    retain: bool


_KINDS: Final[dict[Kind, _KindSpec]] = {
    Kind.CARDS: _KindSpec("cards", True, "racktwin.cards/1", 0, False),
    Kind.CDU: _KindSpec("cdu", True, "racktwin.cdu/1", 0, False),
    Kind.PDU: _KindSpec("pdu", True, "racktwin.pdu/1", 0, False),
    Kind.RACK_CMD: _KindSpec("cmd", True, "racktwin.rack_cmd/1", 1, False),
    Kind.CDU_CMD: _KindSpec("cdu_cmd", True, "racktwin.cdu_cmd/1", 1, False),
    Kind.RACK_ACK: _KindSpec("ack", True, "racktwin.ack/1", 1, False),
    Kind.APPLIED: _KindSpec("applied", True, "racktwin.applied/1", 1, True),
    Kind.FACILITY: _KindSpec("facility", False, "racktwin.facility/1", 0, False),
    Kind.FACILITY_CMD: _KindSpec("facility/cmd", False, "racktwin.facility_cmd/1", 1, False),
    Kind.FACILITY_ACK: _KindSpec("facility/ack", False, "racktwin.ack/1", 1, False),
    Kind.JOB_EVENT: _KindSpec("jobs/events", False, "racktwin.job_event/1", 1, False),
    Kind.SCHEDULER_CMD: _KindSpec("scheduler/cmd", False, "racktwin.scheduler_cmd/1", 1, False),
    Kind.SCHEDULER_ACK: _KindSpec("scheduler/ack", False, "racktwin.ack/1", 1, False),
    Kind.AGENT_STATUS: _KindSpec("agent/status", False, "racktwin.agent_status/1", 1, True),
    Kind.ADVICE: _KindSpec("agent/advice", False, "racktwin.advice/1", 1, False),
}
_RACK_PATHS: Final = {s.path: k for k, s in _KINDS.items() if s.rack_scoped}
_SITE_PATHS: Final = {s.path: k for k, s in _KINDS.items() if not s.rack_scoped}

#: kind -> schema name/version carried in the payload's ``schema`` field.
SCHEMAS: Final[Mapping[Kind, str]] = {k: s.schema for k, s in _KINDS.items()}

#: Kinds a plant (rack bridge, facility bridge, scheduler, simulator) publishes and the agent reads.
PLANT_KINDS: Final = (
    Kind.CARDS,
    Kind.CDU,
    Kind.PDU,
    Kind.RACK_ACK,
    Kind.APPLIED,
    Kind.FACILITY,
    Kind.FACILITY_ACK,
    Kind.JOB_EVENT,
    Kind.SCHEDULER_ACK,
)
#: Kinds only the agent publishes.
AGENT_KINDS: Final = (
    Kind.RACK_CMD,
    Kind.CDU_CMD,
    Kind.FACILITY_CMD,
    Kind.SCHEDULER_CMD,
    Kind.AGENT_STATUS,
    Kind.ADVICE,
)


def qos_of(kind: Kind) -> int:
    """MQTT QoS for a kind: 0 for periodic telemetry (the next reading replaces a lost one), else 1."""
    return _KINDS[kind].qos


def retain_of(kind: Kind) -> bool:
    """Whether a kind is published retained (applied state and agent status only; never commands)."""
    return _KINDS[kind].retain


def _check_name(what: str, name: str) -> None:
    if not _NAME_RE.match(name) or name in _RESERVED_NAMES:
        raise ValueError(
            f"{what} {name!r} cannot be a topic level: use 1-64 of A-Z a-z 0-9 _ . : @ - "
            f"and none of {sorted(_RESERVED_NAMES)}"
        )


class Topics:
    """Topic names of one site: ``Topics("site1").cards("r0") == "racktwin/v1/site1/rack/r0/cards"``."""

    __slots__ = ("prefix", "site")

    def __init__(self, site: str) -> None:
        _check_name("site", site)
        self.site = site
        self.prefix = f"{PROTOCOL_PREFIX}/{site}"

    def of(self, kind: Kind, rack: str | None = None) -> str:
        """The topic of ``kind`` (``rack`` required exactly for rack-scoped kinds)."""
        spec = _KINDS[kind]
        if spec.rack_scoped:
            if rack is None:
                raise ValueError(f"{kind} is published per rack: give the rack")
            return f"{self.prefix}/rack/{rack}/{spec.path}"
        if rack is not None:
            raise ValueError(f"{kind} is a site topic: no rack")
        return f"{self.prefix}/{spec.path}"

    def cards(self, rack: str) -> str:
        return self.of(Kind.CARDS, rack)

    def cdu(self, rack: str) -> str:
        return self.of(Kind.CDU, rack)

    def pdu(self, rack: str) -> str:
        return self.of(Kind.PDU, rack)

    def rack_cmd(self, rack: str) -> str:
        return self.of(Kind.RACK_CMD, rack)

    def cdu_cmd(self, rack: str) -> str:
        return self.of(Kind.CDU_CMD, rack)

    def rack_ack(self, rack: str) -> str:
        return self.of(Kind.RACK_ACK, rack)

    def applied(self, rack: str) -> str:
        return self.of(Kind.APPLIED, rack)

    @property
    def facility(self) -> str:
        return self.of(Kind.FACILITY)

    @property
    def facility_cmd(self) -> str:
        return self.of(Kind.FACILITY_CMD)

    @property
    def facility_ack(self) -> str:
        return self.of(Kind.FACILITY_ACK)

    @property
    def job_events(self) -> str:
        return self.of(Kind.JOB_EVENT)

    @property
    def scheduler_cmd(self) -> str:
        return self.of(Kind.SCHEDULER_CMD)

    @property
    def scheduler_ack(self) -> str:
        return self.of(Kind.SCHEDULER_ACK)

    @property
    def agent_status(self) -> str:
        return self.of(Kind.AGENT_STATUS)

    @property
    def advice(self) -> str:
        return self.of(Kind.ADVICE)

    def filter(self, kind: Kind) -> str:
        """Subscription filter for ``kind`` over all racks (``.../rack/+/cards``) or the site topic."""
        spec = _KINDS[kind]
        return f"{self.prefix}/rack/+/{spec.path}" if spec.rack_scoped else f"{self.prefix}/{spec.path}"

    def filters(self, kinds: Iterable[Kind]) -> tuple[str, ...]:
        return tuple(self.filter(k) for k in kinds)

    def agent_filters(self) -> tuple[str, ...]:
        """What the agent subscribes to: all telemetry, acks, applied state and job events."""
        return self.filters(PLANT_KINDS)

    def plant_filters(self, racks: Iterable[str] | None = None) -> tuple[str, ...]:
        """What a plant (the simulator) subscribes to: commands to its racks, the facility, the scheduler."""
        if racks is None:
            rack_cmds: tuple[str, ...] = (self.filter(Kind.RACK_CMD), self.filter(Kind.CDU_CMD))
        else:
            rack_cmds = tuple(t for r in racks for t in (self.rack_cmd(r), self.cdu_cmd(r)))
        return (*rack_cmds, self.facility_cmd, self.scheduler_cmd)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A parsed topic: its kind and rack (None for site topics)."""

    kind: Kind
    rack: str | None


@dataclass(frozen=True)
class SiteLayout:
    """What decoding needs to know about the site: its topic name, rack names and sizes.

    ``n_levels`` (the DVFS table's length) bounds DVFS levels in commands and applied state when given.
    """

    site: str
    racks: tuple[str, ...]
    cards_per_rack: int
    n_levels: int | None = None

    def __post_init__(self) -> None:
        _check_name("site", self.site)
        for r in self.racks:
            _check_name("rack", r)
        if len(set(self.racks)) != len(self.racks):
            raise ValueError("rack names must be unique")
        if not 1 <= self.cards_per_rack <= MAX_CARDS_PER_RACK:
            raise ValueError(f"cards_per_rack must be within 1..{MAX_CARDS_PER_RACK}, got {self.cards_per_rack}")
        if self.n_levels is not None and not 1 <= self.n_levels <= 256:
            raise ValueError(f"n_levels must be within 1..256, got {self.n_levels}")

    @classmethod
    def from_spec(cls, spec: Any, site: str | None = None) -> SiteLayout:
        """From a :class:`twin.spec.SiteSpec` (racks ``r0..r{n-1}``); ``site`` defaults to ``spec.name``."""
        return cls(
            site=site if site is not None else str(spec.name),
            racks=tuple(spec.rack_names),
            cards_per_rack=int(spec.cards_per_rack),
            n_levels=int(spec.card.n_levels),
        )


# --------------------------------------------------------------------------------------------
# Rejections
# --------------------------------------------------------------------------------------------


class RejectReason(enum.StrEnum):
    """Why an incoming message was rejected. A fixed set: each is a Prometheus label value."""

    UNKNOWN_TOPIC = "unknown_topic"  # not a racktwin/v1/{site}/... topic of this protocol
    UNKNOWN_RACK = "unknown_rack"  # a rack (in the topic or a payload) that the site does not have
    TOO_LARGE = "too_large"  # payload above the size limit, not parsed
    MALFORMED_JSON = "malformed_json"  # not JSON, not UTF-8, trailing data
    NON_FINITE = "non_finite"  # NaN, Infinity, a number out of float range, or null where a number goes
    WRONG_SCHEMA = "wrong_schema"  # schema name/version is not the one of this topic
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    WRONG_TYPE = "wrong_type"
    OUT_OF_RANGE = "out_of_range"  # physically impossible or outside the allowed values / lengths
    CARD_OUT_OF_RACK = "card_out_of_rack"  # a card index >= cards per rack
    DUPLICATE_CARD = "duplicate_card"
    LENGTH_MISMATCH = "length_mismatch"  # per-card columns of unequal length
    INCONSISTENT = "inconsistent"  # fields that contradict each other (action vs parameters, expiry)
    INVALID = "invalid"  # anything else (should not happen; logged with the detail)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A message that was not accepted: why (a fixed reason), a human detail, and its topic."""

    reason: RejectReason
    detail: str
    topic: str = ""

    def __bool__(self) -> bool:  # so that ``if (msg := codec.decode(...)):`` skips rejections
        return False


class RejectionCounter:
    """Counts rejections by reason and logs them, at most ``log_burst`` lines per reason per
    ``log_interval_s`` (the number left out is reported with the next line). Thread-safe.

    The service exposes :meth:`snapshot` as ``racktwin_rejected_messages_total{reason=...}``.
    """

    def __init__(
        self,
        *,
        logger: logging.Logger | None = None,
        log_interval_s: float = 10.0,
        log_burst: int = 5,
        clock: Any = time.monotonic,
    ) -> None:
        self._counts: dict[RejectReason, int] = dict.fromkeys(RejectReason, 0)
        self._lock = threading.Lock()
        self._logger = logger or log
        self._interval_s = log_interval_s
        self._burst = log_burst
        self._clock = clock
        self._window: dict[RejectReason, tuple[float, int, int]] = {}  # start, logged, suppressed

    def record(self, rejection: Rejection) -> None:
        reason = rejection.reason
        now = self._clock()
        with self._lock:
            self._counts[reason] += 1
            start, logged, suppressed = self._window.get(reason, (now, 0, 0))
            if now - start >= self._interval_s:
                start, logged = now, 0
            if logged < self._burst:
                self._window[reason] = (start, logged + 1, 0)
                emit, left_out = True, suppressed
            else:
                self._window[reason] = (start, logged, suppressed + 1)
                emit, left_out = False, 0
        if emit:
            more = f" ({left_out} more {reason} rejections not logged)" if left_out else ""
            self._logger.warning(
                "rejected message on %r: %s: %s%s", rejection.topic[:200], reason, rejection.detail[:300], more
            )

    def count(self, reason: RejectReason | str) -> int:
        return self._counts[RejectReason(reason)]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def snapshot(self) -> dict[str, int]:
        """Counts by reason value, every reason present (zero included)."""
        with self._lock:
            return {r.value: n for r, n in self._counts.items()}


class _Reject(Exception):
    """Internal: raised by cross-field checks, turned into a Rejection by the codec."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------------------------
# The code's message types (SI units, numpy arrays for per-card data)
# --------------------------------------------------------------------------------------------


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
    pump_speed_frac: float = 1.0  # the pump's commanded speed, fraction of nominal (percent on the wire)


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
        if not (math.isfinite(self.pump_speed_frac) and 0.0 < self.pump_speed_frac <= 1.0):
            raise ValueError(f"pump_speed_frac must be within (0, 1], got {self.pump_speed_frac}")


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


def ack_for(
    cmd: Command, result: AckResult, *, ts_s: float, seq: int, publisher: str, reason: str | None = None
) -> Acknowledgement:
    """The acknowledgement of ``cmd`` (its target follows the command's kind)."""
    if isinstance(cmd, RackCommand):
        target = cmd.rack
    elif isinstance(cmd, FacilityCommand):
        target = FACILITY
    else:
        target = SCHEDULER
    return Acknowledgement(target, cmd.command_id, result, ts_s=ts_s, seq=seq, publisher=publisher, reason=reason)


class Sequencer:
    """Per-topic sequence numbers of one publisher: ``seq = sequencer.next(topic)`` (0, 1, 2, ...)."""

    __slots__ = ("_next", "publisher")

    def __init__(self, publisher: str) -> None:
        if not _NAME_RE.match(publisher):
            raise ValueError(f"publisher id {publisher!r}: use 1-64 of A-Z a-z 0-9 _ . : @ -")
        self.publisher = publisher
        self._next: dict[str, int] = {}

    def next(self, topic: str) -> int:
        n = self._next.get(topic, 0)
        self._next[topic] = n + 1
        return n


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


# --------------------------------------------------------------------------------------------
# Wire schemas (msgspec): types carry the physical bounds, checked in C while parsing
# --------------------------------------------------------------------------------------------

_Ts = Annotated[float, Meta(ge=0.0, le=1.0e11)]
_Seq = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_Ident = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")]
_Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:@-]{1,64}$")]
_Text = Annotated[str, Meta(max_length=1024)]
_CardIdx = Annotated[int, Meta(ge=0, le=MAX_CARDS_PER_RACK - 1)]
_Level = Annotated[int, Meta(ge=0, le=255)]
_CardPowerW = Annotated[float, Meta(ge=0.0, le=5000.0)]
_PositivePowerW = Annotated[float, Meta(gt=0.0, le=5000.0)]
_RackPowerW = Annotated[float, Meta(ge=0.0, le=1.0e7)]
_SitePowerW = Annotated[float, Meta(ge=0.0, le=1.0e10)]
_TempC = Annotated[float, Meta(ge=-50.0, le=200.0)]
_Percent = Annotated[float, Meta(ge=0.0, le=100.0)]
_ClockMhz = Annotated[float, Meta(ge=0.0, le=10000.0)]
_FlowLpm = Annotated[float, Meta(ge=0.0, le=1.0e5)]
_PressureKpa = Annotated[float, Meta(ge=-100.0, le=1.0e4)]


_MaxCards = Meta(max_length=MAX_CARDS_PER_RACK)
_IdxCol = Annotated[list[_CardIdx], _MaxCards]
_LevelCol = Annotated[list[_Level], _MaxCards]
_CardPowerCol = Annotated[list[_CardPowerW], _MaxCards]
_TempCol = Annotated[list[_TempC], _MaxCards]
_ClockCol = Annotated[list[_ClockMhz], _MaxCards]
_PercentCol = Annotated[list[_Percent], _MaxCards]
_BoolCol = Annotated[list[bool], _MaxCards]
_Cards = Annotated[list[_CardIdx], Meta(min_length=1, max_length=MAX_CARDS_PER_RACK)]
_PositivePowerCol = Annotated[list[_PositivePowerW], Meta(min_length=1, max_length=MAX_CARDS_PER_RACK)]
_CardMap = Annotated[dict[_Name, _Cards], Meta(min_length=1, max_length=4096)]


class _W(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Envelope fields of every payload (``schema`` is redeclared as a Literal by each schema)."""

    schema: str
    ts: _Ts
    seq: _Seq
    publisher: _Ident


class _CardsW(_W, kw_only=True):
    schema: Literal["racktwin.cards/1"]
    card_index: _IdxCol
    power_watts: _CardPowerCol
    temperature_celsius: _TempCol
    sm_clock_mhz: _ClockCol
    utilization_percent: _PercentCol
    power_limit_watts: _CardPowerCol
    low_power: _BoolCol
    host_off: _BoolCol | None = None  # absent: not known (no host power management, older publishers)


class _CduW(_W, kw_only=True):
    schema: Literal["racktwin.cdu/1"]
    supply_temperature_celsius: _TempC
    return_temperature_celsius: _TempC
    flow_liters_per_minute: _FlowLpm
    delta_pressure_kpa: _PressureKpa
    pump_power_watts: _RackPowerW
    pump_speed_percent: _Percent | None = None  # absent: full speed (publishers before the field)


class _PduW(_W, kw_only=True):
    schema: Literal["racktwin.pdu/1"]
    power_watts: _RackPowerW


class _FacilityW(_W, kw_only=True):
    schema: Literal["racktwin.facility/1"]
    ambient_temperature_celsius: _TempC
    supply_temperature_celsius: _TempC
    return_temperature_celsius: _TempC
    cooling_power_watts: _SitePowerW
    it_power_watts: _SitePowerW
    facility_power_watts: _SitePowerW
    supply_setpoint_celsius: _TempC


class _JobW(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    n_cards: Annotated[int, Meta(ge=1, le=10_000_000)]
    work_steps: Annotated[float, Meta(gt=0.0, le=1.0e15)]
    step_time_seconds: Annotated[float, Meta(gt=0.0, le=1.0e6)]
    compute_share: Annotated[float, Meta(ge=0.0, le=1.0)]
    priority: Annotated[float, Meta(gt=0.0, le=1.0e6)]
    submit_ts: _Ts
    checkpoint_interval_seconds: Annotated[float, Meta(gt=0.0, le=1.0e8)]
    checkpoint_duration_seconds: Annotated[float, Meta(ge=0.0, le=1.0e8)]
    noncompute_utilization_percent: _Percent
    min_throughput_percent: _Percent


_PHASE_NAMES: Final = {p: p.name.lower() for p in Phase}
_PHASES: Final = {v: k for k, v in _PHASE_NAMES.items()}


class _JobEventW(_W, kw_only=True):
    schema: Literal["racktwin.job_event/1"]
    event: Literal["submitted", "started", "phase_changed", "finished", "failed", "requeued"]
    job_id: _Ident
    job: _JobW | None = None
    cards: _CardMap | None = None
    phase: Literal["compute", "communication", "checkpoint", "waiting"] | None = None
    reason: _Text | None = None


_EVENT_FIELDS: Final = {
    "submitted": ({"job"}, set()),
    "started": ({"cards"}, set()),
    "phase_changed": ({"phase"}, set()),
    "finished": (set(), {"reason"}),
    "failed": (set(), {"reason"}),
    "requeued": (set(), {"reason"}),
}  # event -> (required, optional) among job, cards, phase, reason


class _CommandW(_W, kw_only=True):
    command_id: uuid.UUID
    expires_at: _Ts


_Action = Literal[
    "set_dvfs_level",
    "set_clock_range",
    "set_power_limit",
    "low_power_idle",
    "wake",
    "host_power_off",
    "host_power_on",
]


class _RackCmdW(_CommandW, kw_only=True):
    schema: Literal["racktwin.rack_cmd/1"]
    cards: _Cards
    action: _Action
    dvfs_level: _Level | None = None
    min_sm_clock_mhz: _ClockMhz | None = None
    max_sm_clock_mhz: _ClockMhz | None = None
    power_limit_watts: _PositivePowerW | _PositivePowerCol | None = None


class _CduCmdW(_CommandW, kw_only=True):
    schema: Literal["racktwin.cdu_cmd/1"]
    pump_speed_percent: Annotated[float, Meta(gt=0.0, le=100.0)]


class _FacilityCmdW(_CommandW, kw_only=True):
    schema: Literal["racktwin.facility_cmd/1"]
    supply_setpoint_celsius: _TempC


class _SchedulerCmdW(_CommandW, kw_only=True):
    schema: Literal["racktwin.scheduler_cmd/1"]
    action: Literal["place"]
    job_id: _Ident
    cards: _CardMap


class _AckW(_W, kw_only=True):
    schema: Literal["racktwin.ack/1"]
    command_id: uuid.UUID
    result: Literal["applied", "rejected", "expired"]
    reason: _Text | None = None


class _AppliedW(_W, kw_only=True):
    schema: Literal["racktwin.applied/1"]
    card_index: _IdxCol
    dvfs_level: _LevelCol
    min_sm_clock_mhz: _ClockCol
    max_sm_clock_mhz: _ClockCol
    power_limit_watts: _CardPowerCol
    low_power: _BoolCol
    last_command_id: uuid.UUID | None = None
    host_off: _BoolCol | None = None  # absent: not known


class _AgentStatusW(_W, kw_only=True):
    schema: Literal["racktwin.agent_status/1"]
    state: Literal["online", "offline"]
    version: Annotated[str, Meta(max_length=64)]
    mode: Literal["advisory", "enforce"] | None = None
    detail: _Text | None = None


class _AdviceItemW(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    rack: _Name
    cards: _Cards
    action: _Action
    dvfs_level: _Level | None = None
    min_sm_clock_mhz: _ClockMhz | None = None
    max_sm_clock_mhz: _ClockMhz | None = None
    power_limit_watts: _PositivePowerW | _PositivePowerCol | None = None


class _PlacementW(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    job_id: _Ident
    cards: _CardMap


class _AdviceW(_W, kw_only=True):
    schema: Literal["racktwin.advice/1"]
    items: Annotated[list[_AdviceItemW], Meta(max_length=100_000)]
    supply_setpoint_celsius: _TempC | None = None
    placements: Annotated[list[_PlacementW], Meta(max_length=100_000)] = []
    predicted_it_power_watts: _SitePowerW | None = None
    predicted_facility_power_watts: _SitePowerW | None = None
    summary: _Text | None = None
    pump_speed_percent: Annotated[dict[_Name, Annotated[float, Meta(gt=0.0, le=100.0)]], Meta(max_length=4096)] = {}


_WIRE_TYPES: Final[dict[Kind, type[_W]]] = {
    Kind.CARDS: _CardsW,
    Kind.CDU: _CduW,
    Kind.PDU: _PduW,
    Kind.RACK_CMD: _RackCmdW,
    Kind.CDU_CMD: _CduCmdW,
    Kind.RACK_ACK: _AckW,
    Kind.APPLIED: _AppliedW,
    Kind.FACILITY: _FacilityW,
    Kind.FACILITY_CMD: _FacilityCmdW,
    Kind.FACILITY_ACK: _AckW,
    Kind.JOB_EVENT: _JobEventW,
    Kind.SCHEDULER_CMD: _SchedulerCmdW,
    Kind.SCHEDULER_ACK: _AckW,
    Kind.AGENT_STATUS: _AgentStatusW,
    Kind.ADVICE: _AdviceW,
}

_encoder = msgspec.json.Encoder()

# --------------------------------------------------------------------------------------------
# Encoding (code -> wire). Encoders trust their input: NaN is written as null and rejected by
# the receiver as non_finite; build messages from validated numbers.
# --------------------------------------------------------------------------------------------


def _floats(a: FloatArray, scale: float = 1.0) -> list[float]:
    arr = np.asarray(a, dtype=np.float64)
    return (arr * scale if scale != 1.0 else arr).tolist()  # type: ignore[no-any-return]


def _ints(a: IntArray) -> list[int]:
    return np.asarray(a, dtype=np.int64).tolist()  # type: ignore[no-any-return]


def _bools(a: BoolArray) -> list[bool]:
    return np.asarray(a, dtype=np.bool_).tolist()  # type: ignore[no-any-return]


def _opt_bools(a: BoolArray | None) -> list[bool] | None:
    return None if a is None else _bools(a)


def _card_map(cards: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    return {r: [int(i) for i in idx] for r, idx in cards.items()}


def _setting_wire(s: CardSetting) -> dict[str, Any]:
    out: dict[str, Any] = {"action": s.action.value}
    for name, wire in _PARAM_WIRE.items():
        v = getattr(s, name)
        if v is None:
            continue
        if isinstance(v, tuple):
            out[wire] = [float(x) for x in v]
        else:
            out[wire] = int(v) if name == "dvfs_level" else float(v)
    return out


def encode_card_batch(m: CardBatch) -> bytes:
    return _encoder.encode(
        _CardsW(
            schema="racktwin.cards/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            card_index=_ints(m.card_index),
            power_watts=_floats(m.power_w),
            temperature_celsius=_floats(m.temp_c),
            sm_clock_mhz=_floats(m.sm_clock_mhz),
            utilization_percent=_floats(m.utilization, 100.0),
            power_limit_watts=_floats(m.power_limit_w),
            low_power=_bools(m.low_power),
            host_off=_opt_bools(m.host_off),
        )
    )


def encode_cdu(m: CduReading) -> bytes:
    return _encoder.encode(
        _CduW(
            schema="racktwin.cdu/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            supply_temperature_celsius=m.supply_temp_c,
            return_temperature_celsius=m.return_temp_c,
            flow_liters_per_minute=m.flow_lpm,
            delta_pressure_kpa=m.delta_pressure_pa / 1000.0,
            pump_power_watts=m.pump_power_w,
            pump_speed_percent=m.pump_speed_frac * 100.0,
        )
    )


def encode_pdu(m: PduReading) -> bytes:
    return _encoder.encode(
        _PduW(schema="racktwin.pdu/1", ts=m.ts_s, seq=m.seq, publisher=m.publisher, power_watts=m.power_w)
    )


def encode_facility(m: FacilityReading) -> bytes:
    return _encoder.encode(
        _FacilityW(
            schema="racktwin.facility/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            ambient_temperature_celsius=m.ambient_temp_c,
            supply_temperature_celsius=m.supply_temp_c,
            return_temperature_celsius=m.return_temp_c,
            cooling_power_watts=m.cooling_power_w,
            it_power_watts=m.it_power_w,
            facility_power_watts=m.facility_power_w,
            supply_setpoint_celsius=m.supply_setpoint_c,
        )
    )


def encode_job_event(m: JobEvent) -> bytes:
    job = None
    if m.job is not None:
        j = m.job
        job = _JobW(
            n_cards=j.n_cards,
            work_steps=j.work_steps,
            step_time_seconds=j.step_time_s,
            compute_share=j.compute_share,
            priority=j.priority,
            submit_ts=j.submit_time_s,
            checkpoint_interval_seconds=j.checkpoint_interval_s,
            checkpoint_duration_seconds=j.checkpoint_duration_s,
            noncompute_utilization_percent=j.noncompute_utilization * 100.0,
            min_throughput_percent=j.min_throughput_frac * 100.0,
        )
    return _encoder.encode(
        _JobEventW(
            schema="racktwin.job_event/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            event=m.event.value,
            job_id=m.job_id,
            job=job,
            cards=None if m.cards is None else _card_map(m.cards),
            phase=None if m.phase is None else _PHASE_NAMES[m.phase],  # type: ignore[arg-type]
            reason=m.reason,
        )
    )


def encode_rack_command(m: RackCommand) -> bytes:
    return _encoder.encode(
        _RackCmdW(
            schema="racktwin.rack_cmd/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            command_id=m.command_id,
            expires_at=m.expires_s,
            cards=[int(i) for i in m.cards],
            **_setting_wire(m.setting),
        )
    )


def encode_cdu_command(m: CduCommand) -> bytes:
    return _encoder.encode(
        _CduCmdW(
            schema="racktwin.cdu_cmd/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            command_id=m.command_id,
            expires_at=m.expires_s,
            pump_speed_percent=m.pump_speed_frac * 100.0,
        )
    )


def encode_facility_command(m: FacilityCommand) -> bytes:
    return _encoder.encode(
        _FacilityCmdW(
            schema="racktwin.facility_cmd/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            command_id=m.command_id,
            expires_at=m.expires_s,
            supply_setpoint_celsius=m.supply_setpoint_c,
        )
    )


def encode_scheduler_command(m: SchedulerCommand) -> bytes:
    return _encoder.encode(
        _SchedulerCmdW(
            schema="racktwin.scheduler_cmd/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            command_id=m.command_id,
            expires_at=m.expires_s,
            action="place",
            job_id=m.job_id,
            cards=_card_map(m.cards),
        )
    )


def encode_ack(m: Acknowledgement) -> bytes:
    return _encoder.encode(
        _AckW(
            schema="racktwin.ack/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            command_id=m.command_id,
            result=m.result.value,
            reason=m.reason,
        )
    )


def encode_applied(m: AppliedState) -> bytes:
    return _encoder.encode(
        _AppliedW(
            schema="racktwin.applied/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            card_index=_ints(m.card_index),
            dvfs_level=_ints(m.dvfs_level),
            min_sm_clock_mhz=_floats(m.min_clock_mhz),
            max_sm_clock_mhz=_floats(m.max_clock_mhz),
            power_limit_watts=_floats(m.power_limit_w),
            low_power=_bools(m.low_power),
            last_command_id=m.last_command_id,
            host_off=_opt_bools(m.host_off),
        )
    )


def encode_agent_status(m: AgentStatus) -> bytes:
    return _encoder.encode(
        _AgentStatusW(
            schema="racktwin.agent_status/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            state=m.state.value,
            version=m.version,
            mode=m.mode,  # type: ignore[arg-type]
            detail=m.detail,
        )
    )


def encode_advice(m: AgentAdvice) -> bytes:
    return _encoder.encode(
        _AdviceW(
            schema="racktwin.advice/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            items=[
                _AdviceItemW(rack=it.rack, cards=[int(i) for i in it.cards], **_setting_wire(it.setting))
                for it in m.items
            ],
            supply_setpoint_celsius=m.supply_setpoint_c,
            placements=[_PlacementW(job_id=p.job_id, cards=_card_map(p.cards)) for p in m.placements],
            predicted_it_power_watts=m.predicted_it_power_w,
            predicted_facility_power_watts=m.predicted_facility_power_w,
            summary=m.summary,
            pump_speed_percent={r: v * 100.0 for r, v in m.pump_speeds.items()},
        )
    )


_ENCODERS: Final[dict[type, Any]] = {
    CardBatch: encode_card_batch,
    CduReading: encode_cdu,
    PduReading: encode_pdu,
    FacilityReading: encode_facility,
    JobEvent: encode_job_event,
    RackCommand: encode_rack_command,
    CduCommand: encode_cdu_command,
    FacilityCommand: encode_facility_command,
    SchedulerCommand: encode_scheduler_command,
    Acknowledgement: encode_ack,
    AppliedState: encode_applied,
    AgentStatus: encode_agent_status,
    AgentAdvice: encode_advice,
}


def encode(msg: Message) -> bytes:
    """The JSON payload of any message."""
    return _ENCODERS[type(msg)](msg)  # type: ignore[no-any-return]


_SIMPLE_KINDS: Final[dict[type, Kind]] = {
    CardBatch: Kind.CARDS,
    CduReading: Kind.CDU,
    PduReading: Kind.PDU,
    FacilityReading: Kind.FACILITY,
    JobEvent: Kind.JOB_EVENT,
    RackCommand: Kind.RACK_CMD,
    CduCommand: Kind.CDU_CMD,
    FacilityCommand: Kind.FACILITY_CMD,
    SchedulerCommand: Kind.SCHEDULER_CMD,
    AppliedState: Kind.APPLIED,
    AgentStatus: Kind.AGENT_STATUS,
    AgentAdvice: Kind.ADVICE,
}


def kind_of(msg: Message) -> Kind:
    if isinstance(msg, Acknowledgement):
        if msg.target == FACILITY:
            return Kind.FACILITY_ACK
        if msg.target == SCHEDULER:
            return Kind.SCHEDULER_ACK
        return Kind.RACK_ACK
    return _SIMPLE_KINDS[type(msg)]


def _rack_of(msg: Message) -> str | None:
    if isinstance(msg, Acknowledgement):
        return msg.target if kind_of(msg) is Kind.RACK_ACK else None
    return getattr(msg, "rack", None) if _KINDS[kind_of(msg)].rack_scoped else None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message ready to publish: topic, payload, QoS and retain flag."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


# --------------------------------------------------------------------------------------------
# Decoding (wire -> code) with validation
# --------------------------------------------------------------------------------------------

_PATH_RE: Final = re.compile(r" - at `(.*)`$")


def _classify(exc: msgspec.DecodeError, payload: Any) -> tuple[RejectReason, str]:
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        raw = (
            payload if isinstance(payload, bytes | bytearray | memoryview) else str(payload).encode("utf-8", "replace")
        )
        if b"NaN" in raw or b"Infinity" in raw:
            return RejectReason.NON_FINITE, f"NaN or Infinity is not JSON ({text})"
        return RejectReason.MALFORMED_JSON, text
    m = _PATH_RE.search(text)
    path = m.group(1) if m else ""
    if path == "$.schema":
        return RejectReason.WRONG_SCHEMA, text
    if text.startswith("Object missing required field"):
        return RejectReason.MISSING_FIELD, text
    if text.startswith("Object contains unknown field"):
        return RejectReason.UNKNOWN_FIELD, text
    if text.startswith("Number out of range") or (text.startswith("Expected `float`") and "got `null`" in text):
        return RejectReason.NON_FINITE, text
    if text.startswith("Expected `") and ", got `" in text:
        return RejectReason.WRONG_TYPE, text
    if text.startswith(("Expected `", "Invalid enum value")):
        return RejectReason.OUT_OF_RANGE, text  # bounds, lengths, regex, allowed values
    if text.startswith("Invalid UUID"):
        return RejectReason.WRONG_TYPE, text
    return RejectReason.INVALID, text


class Codec:
    """Topic-aware decoding for one site, with counted rejections; encoding to :class:`Outgoing`.

    >>> codec = Codec(SiteLayout("site1", ("r0", "r1"), cards_per_rack=64))
    >>> msg = codec.decode(topic, payload)        # a message, or a Rejection (falsy), never raises
    >>> codec.counter.snapshot()["malformed_json"]
    """

    def __init__(
        self,
        layout: SiteLayout,
        *,
        counter: RejectionCounter | None = None,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        self.layout = layout
        self.topics = Topics(layout.site)
        self.counter = counter if counter is not None else RejectionCounter()
        self.max_payload_bytes = max_payload_bytes
        self._racks = frozenset(layout.racks)
        self._decoders = {k: msgspec.json.Decoder(t) for k, t in _WIRE_TYPES.items()}
        self._site_prefix = self.topics.prefix + "/"
        self._topic_cache: dict[str, TopicInfo] = {}

    # ---- topics ---------------------------------------------------------------------------
    def _parse(self, topic: str) -> TopicInfo | Rejection:
        info = self._topic_cache.get(topic)
        if info is not None:
            return info
        if not topic.startswith(self._site_prefix):
            return Rejection(RejectReason.UNKNOWN_TOPIC, f"not under {self._site_prefix}", topic)
        rest = topic[len(self._site_prefix) :]
        parts = rest.split("/")
        if len(parts) == 3 and parts[0] == "rack":
            kind = _RACK_PATHS.get(parts[2])
            if kind is None:
                return Rejection(RejectReason.UNKNOWN_TOPIC, f"unknown rack topic {parts[2]!r}", topic)
            if parts[1] not in self._racks:
                return Rejection(RejectReason.UNKNOWN_RACK, f"rack {parts[1][:64]!r} is not in the site", topic)
            info = TopicInfo(kind, parts[1])
        else:
            kind = _SITE_PATHS.get(rest)
            if kind is None:
                return Rejection(RejectReason.UNKNOWN_TOPIC, "not a topic of racktwin/v1", topic)
            info = TopicInfo(kind, None)
        if len(self._topic_cache) < 100_000:
            self._topic_cache[topic] = info
        return info

    def parse_topic(self, topic: str) -> TopicInfo | Rejection:
        """The kind and rack of a topic, or a (counted) rejection."""
        info = self._parse(topic)
        if isinstance(info, Rejection):
            self.counter.record(info)
        return info

    def topic_for(self, msg: Message) -> str:
        return self.topics.of(kind_of(msg), _rack_of(msg))

    def outgoing(self, msg: Message) -> Outgoing:
        """Topic, payload, QoS and retain flag of ``msg`` (commands: QoS 1, never retained)."""
        kind = kind_of(msg)
        spec = _KINDS[kind]
        return Outgoing(self.topics.of(kind, _rack_of(msg)), encode(msg), spec.qos, spec.retain)

    # ---- decoding -------------------------------------------------------------------------
    def decode(self, topic: str, payload: bytes | bytearray | memoryview | str) -> Message | Rejection:
        """Parse the topic, then decode and validate the payload. Never raises."""
        info = self._parse(topic)
        if isinstance(info, Rejection):
            self.counter.record(info)
            return info
        return self.decode_kind(info.kind, payload, rack=info.rack, topic=topic)

    def decode_kind(
        self, kind: Kind, payload: bytes | bytearray | memoryview | str, *, rack: str | None = None, topic: str = ""
    ) -> Message | Rejection:
        """Decode a payload of a known kind (``rack`` for rack-scoped kinds). Never raises."""
        try:
            if len(payload) > self.max_payload_bytes:
                raise _Reject(RejectReason.TOO_LARGE, f"{len(payload)} bytes > {self.max_payload_bytes}")
            if _KINDS[kind].rack_scoped and rack not in self._racks:
                raise _Reject(RejectReason.UNKNOWN_RACK, f"rack {str(rack)[:64]!r} is not in the site")
            wire = self._decoders[kind].decode(payload)
            msg: Message = _CONVERTERS[kind](self, wire, rack)
            return msg
        except _Reject as exc:
            rej = Rejection(exc.reason, exc.detail, topic)
        except msgspec.DecodeError as exc:
            reason, detail = _classify(exc, payload)
            rej = Rejection(reason, detail[:300], topic)
        except Exception as exc:  # never let a hostile payload raise into the receive loop
            rej = Rejection(RejectReason.INVALID, f"{type(exc).__name__}: {exc}"[:300], topic)
        self.counter.record(rej)
        return rej

    # ---- cross-field checks ---------------------------------------------------------------
    def _check_cards(self, cards: Sequence[int], where: str) -> None:
        if not cards:
            return
        n = self.layout.cards_per_rack
        if max(cards) >= n:
            raise _Reject(RejectReason.CARD_OUT_OF_RACK, f"{where}: card index {max(cards)} >= {n} cards per rack")
        if len(set(cards)) != len(cards):
            raise _Reject(RejectReason.DUPLICATE_CARD, f"{where}: a card index appears twice")

    def _card_map(self, cards: Mapping[str, list[int]], where: str) -> dict[str, tuple[int, ...]]:
        for r, idx in cards.items():
            if r not in self._racks:
                raise _Reject(RejectReason.UNKNOWN_RACK, f"{where}: rack {r!r} is not in the site")
            self._check_cards(idx, f"{where}.{r}")
        return {r: tuple(idx) for r, idx in cards.items()}

    def _setting(self, w: _RackCmdW | _AdviceItemW, where: str) -> CardSetting:
        limit = w.power_limit_watts
        if isinstance(limit, list) and len(limit) != len(w.cards):
            raise _Reject(
                RejectReason.LENGTH_MISMATCH,
                f"{where}: power_limit_watts has {len(limit)} values, cards has {len(w.cards)}",
            )
        try:
            s = CardSetting(
                CardAction(w.action),
                dvfs_level=w.dvfs_level,
                min_clock_mhz=w.min_sm_clock_mhz,
                max_clock_mhz=w.max_sm_clock_mhz,
                power_limit_w=tuple(limit) if isinstance(limit, list) else limit,
            )
        except ValueError as exc:
            raise _Reject(RejectReason.INCONSISTENT, f"{where}: {exc}") from None
        n_levels = self.layout.n_levels
        if s.dvfs_level is not None and n_levels is not None and s.dvfs_level >= n_levels:
            raise _Reject(RejectReason.OUT_OF_RANGE, f"{where}: dvfs_level {s.dvfs_level} >= {n_levels} levels")
        return s

    @staticmethod
    def _check_expiry(w: _CommandW) -> None:
        if not w.expires_at > w.ts:
            raise _Reject(RejectReason.INCONSISTENT, f"expires_at {w.expires_at} is not after ts {w.ts}")

    def _columns(self, w: _CardsW | _AppliedW, names: Sequence[str]) -> int:
        n = len(w.card_index)
        for name in (*names, "host_off"):
            col = getattr(w, name)
            if col is not None and len(col) != n:
                raise _Reject(RejectReason.LENGTH_MISMATCH, f"{name} has {len(col)} entries, card_index has {n}")
        self._check_cards(w.card_index, "card_index")
        return n


_CARD_COLUMNS: Final = (
    "power_watts",
    "temperature_celsius",
    "sm_clock_mhz",
    "utilization_percent",
    "power_limit_watts",
    "low_power",
)
_APPLIED_COLUMNS: Final = (
    "dvfs_level",
    "min_sm_clock_mhz",
    "max_sm_clock_mhz",
    "power_limit_watts",
    "low_power",
)


def _conv_cards(c: Codec, w: _CardsW, rack: str | None) -> CardBatch:
    c._columns(w, _CARD_COLUMNS)
    block = np.array(
        [w.power_watts, w.temperature_celsius, w.sm_clock_mhz, w.utilization_percent, w.power_limit_watts],
        dtype=np.float64,
    ).reshape(5, len(w.card_index))
    block[3] /= 100.0
    return CardBatch(
        rack=str(rack),
        card_index=np.array(w.card_index, dtype=np.int64),
        power_w=block[0],
        temp_c=block[1],
        sm_clock_mhz=block[2],
        utilization=block[3],
        power_limit_w=block[4],
        low_power=np.array(w.low_power, dtype=np.bool_),
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
        host_off=None if w.host_off is None else np.array(w.host_off, dtype=np.bool_),
    )


def _conv_cdu(c: Codec, w: _CduW, rack: str | None) -> CduReading:
    return CduReading(
        rack=str(rack),
        supply_temp_c=w.supply_temperature_celsius,
        return_temp_c=w.return_temperature_celsius,
        flow_lpm=w.flow_liters_per_minute,
        delta_pressure_pa=w.delta_pressure_kpa * 1000.0,
        pump_power_w=w.pump_power_watts,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
        pump_speed_frac=1.0 if w.pump_speed_percent is None else w.pump_speed_percent / 100.0,
    )


def _conv_pdu(c: Codec, w: _PduW, rack: str | None) -> PduReading:
    return PduReading(rack=str(rack), power_w=w.power_watts, ts_s=w.ts, seq=w.seq, publisher=w.publisher)


def _conv_facility(c: Codec, w: _FacilityW, rack: str | None) -> FacilityReading:
    return FacilityReading(
        ambient_temp_c=w.ambient_temperature_celsius,
        supply_temp_c=w.supply_temperature_celsius,
        return_temp_c=w.return_temperature_celsius,
        cooling_power_w=w.cooling_power_watts,
        it_power_w=w.it_power_watts,
        facility_power_w=w.facility_power_watts,
        supply_setpoint_c=w.supply_setpoint_celsius,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
    )


def _conv_job_event(c: Codec, w: _JobEventW, rack: str | None) -> JobEvent:
    required, optional = _EVENT_FIELDS[w.event]
    present = {f for f in ("job", "cards", "phase", "reason") if getattr(w, f) is not None}
    if not required <= present or not present <= required | optional:
        raise _Reject(
            RejectReason.INCONSISTENT,
            f"event {w.event} takes {sorted(required)} (optional {sorted(optional)}), got {sorted(present)}",
        )
    job = None
    if w.job is not None:
        j = w.job
        try:
            job = JobSpec(
                job_id=w.job_id,
                n_cards=j.n_cards,
                work_steps=j.work_steps,
                step_time_s=j.step_time_seconds,
                compute_share=j.compute_share,
                priority=j.priority,
                submit_time_s=j.submit_ts,
                checkpoint_interval_s=j.checkpoint_interval_seconds,
                checkpoint_duration_s=j.checkpoint_duration_seconds,
                noncompute_utilization=j.noncompute_utilization_percent / 100.0,
                min_throughput_frac=j.min_throughput_percent / 100.0,
            )
        except ValueError as exc:
            raise _Reject(RejectReason.INCONSISTENT, str(exc)) from None
    return JobEvent(
        event=JobEventType(w.event),
        job_id=w.job_id,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
        job=job,
        cards=None if w.cards is None else c._card_map(w.cards, "cards"),
        phase=None if w.phase is None else _PHASES[w.phase],
        reason=w.reason,
    )


def _conv_rack_cmd(c: Codec, w: _RackCmdW, rack: str | None) -> RackCommand:
    c._check_cards(w.cards, "cards")
    c._check_expiry(w)
    return RackCommand(
        rack=str(rack),
        cards=tuple(w.cards),
        setting=c._setting(w, "command"),
        command_id=w.command_id,
        expires_s=w.expires_at,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
    )


def _conv_cdu_cmd(c: Codec, w: _CduCmdW, rack: str | None) -> CduCommand:
    c._check_expiry(w)
    return CduCommand(
        rack=str(rack),
        pump_speed_frac=w.pump_speed_percent / 100.0,
        command_id=w.command_id,
        expires_s=w.expires_at,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
    )


def _conv_facility_cmd(c: Codec, w: _FacilityCmdW, rack: str | None) -> FacilityCommand:
    c._check_expiry(w)
    return FacilityCommand(
        supply_setpoint_c=w.supply_setpoint_celsius,
        command_id=w.command_id,
        expires_s=w.expires_at,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
    )


def _conv_scheduler_cmd(c: Codec, w: _SchedulerCmdW, rack: str | None) -> SchedulerCommand:
    c._check_expiry(w)
    return SchedulerCommand(
        job_id=w.job_id,
        cards=c._card_map(w.cards, "cards"),
        command_id=w.command_id,
        expires_s=w.expires_at,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
    )


def _ack_converter(target: str | None) -> Any:
    def conv(c: Codec, w: _AckW, rack: str | None) -> Acknowledgement:
        if w.result == "rejected" and not w.reason:
            raise _Reject(RejectReason.INCONSISTENT, "a rejected ack must say why (reason)")
        return Acknowledgement(
            target=str(rack) if target is None else target,
            command_id=w.command_id,
            result=AckResult(w.result),
            ts_s=w.ts,
            seq=w.seq,
            publisher=w.publisher,
            reason=w.reason,
        )

    return conv


def _conv_applied(c: Codec, w: _AppliedW, rack: str | None) -> AppliedState:
    n = c._columns(w, _APPLIED_COLUMNS)
    levels = np.array(w.dvfs_level, dtype=np.int64)
    if c.layout.n_levels is not None and n and int(levels.max()) >= c.layout.n_levels:
        raise _Reject(RejectReason.OUT_OF_RANGE, f"dvfs_level {int(levels.max())} >= {c.layout.n_levels} levels")
    block = np.array([w.min_sm_clock_mhz, w.max_sm_clock_mhz, w.power_limit_watts], dtype=np.float64).reshape(3, n)
    if np.any(block[0] > block[1]):
        raise _Reject(RejectReason.INCONSISTENT, "min_sm_clock_mhz above max_sm_clock_mhz")
    return AppliedState(
        rack=str(rack),
        card_index=np.array(w.card_index, dtype=np.int64),
        dvfs_level=levels,
        min_clock_mhz=block[0],
        max_clock_mhz=block[1],
        power_limit_w=block[2],
        low_power=np.array(w.low_power, dtype=np.bool_),
        last_command_id=w.last_command_id,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
        host_off=None if w.host_off is None else np.array(w.host_off, dtype=np.bool_),
    )


def _conv_agent_status(c: Codec, w: _AgentStatusW, rack: str | None) -> AgentStatus:
    return AgentStatus(
        state=AgentState(w.state),
        version=w.version,
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
        mode=w.mode,
        detail=w.detail,
    )


def _conv_advice(c: Codec, w: _AdviceW, rack: str | None) -> AgentAdvice:
    items = []
    for k, it in enumerate(w.items):
        if it.rack not in c._racks:
            raise _Reject(RejectReason.UNKNOWN_RACK, f"items[{k}]: rack {it.rack!r} is not in the site")
        c._check_cards(it.cards, f"items[{k}].cards")
        items.append(AdviceItem(it.rack, tuple(it.cards), c._setting(it, f"items[{k}]")))
    return AgentAdvice(
        items=tuple(items),
        ts_s=w.ts,
        seq=w.seq,
        publisher=w.publisher,
        supply_setpoint_c=w.supply_setpoint_celsius,
        placements=tuple(
            Placement(p.job_id, c._card_map(p.cards, f"placements[{k}].cards")) for k, p in enumerate(w.placements)
        ),
        predicted_it_power_w=w.predicted_it_power_watts,
        predicted_facility_power_w=w.predicted_facility_power_watts,
        summary=w.summary,
        pump_speeds=_pump_speeds(c, w.pump_speed_percent),
    )


def _pump_speeds(c: Codec, pct: Mapping[str, float]) -> dict[str, float]:
    for r in pct:
        if r not in c._racks:
            raise _Reject(RejectReason.UNKNOWN_RACK, f"pump_speed_percent: rack {r!r} is not in the site")
    return {r: v / 100.0 for r, v in pct.items()}


_CONVERTERS: Final[dict[Kind, Any]] = {
    Kind.CARDS: _conv_cards,
    Kind.CDU: _conv_cdu,
    Kind.PDU: _conv_pdu,
    Kind.RACK_CMD: _conv_rack_cmd,
    Kind.CDU_CMD: _conv_cdu_cmd,
    Kind.RACK_ACK: _ack_converter(None),
    Kind.APPLIED: _conv_applied,
    Kind.FACILITY: _conv_facility,
    Kind.FACILITY_CMD: _conv_facility_cmd,
    Kind.FACILITY_ACK: _ack_converter(FACILITY),
    Kind.JOB_EVENT: _conv_job_event,
    Kind.SCHEDULER_CMD: _conv_scheduler_cmd,
    Kind.SCHEDULER_ACK: _ack_converter(SCHEDULER),
    Kind.AGENT_STATUS: _conv_agent_status,
    Kind.ADVICE: _conv_advice,
}
