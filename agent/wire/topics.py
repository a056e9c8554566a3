"""Topics: protocol constants, message kinds (:class:`Kind`, their topic, schema, QoS and retain
flag), :class:`Topics` (a site's topic names), :class:`TopicInfo` and :class:`SiteLayout`."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

PROTOCOL_PREFIX: Final = "racktwin/v1"
#: Payloads larger than this are rejected unread (a 64-card batch is ~2.7 KB; 4,096 cards ~170 KB).
MAX_PAYLOAD_BYTES: Final = 256 * 1024
#: No rack may hold more cards than this (bounds every per-card array before the site check).
MAX_CARDS_PER_RACK: Final = 4096
#: Ack targets that are not racks.
FACILITY: Final = "facility"
SCHEDULER: Final = "scheduler"
_RESERVED_NAMES: Final = frozenset({FACILITY, SCHEDULER, "rack", "jobs", "agent", "observer", "sim"})
#: A site or rack name: one topic level. ``\Z``, not ``$``: ``$`` also matches before a final
#: newline, so ``"r0\n"`` passed.
NAME_PATTERN: Final = r"^[A-Za-z0-9_.:@-]{1,64}\Z"
_NAME_RE: Final = re.compile(NAME_PATTERN)
#: A publisher or job id in a payload (longer than a topic level may be; ``\Z`` as above).
IDENT_PATTERN: Final = r"^[A-Za-z0-9_.:@-]{1,128}\Z"
_IDENT_RE: Final = re.compile(IDENT_PATTERN)


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
    JOB_STATE = "job_state"
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
    Kind.JOB_STATE: _KindSpec("jobs/state", False, "racktwin.job_state/1", 1, True),
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
    Kind.JOB_STATE,
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
    """Whether a kind is published retained (applied state, the scheduler's job snapshot and the agent
    status only; never commands)."""
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
    def job_state(self) -> str:
        return self.of(Kind.JOB_STATE)

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
        """What the agent subscribes to: all telemetry, acks, applied state, job events and the job snapshot."""
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
