"""Wire schemas (msgspec): types carry the physical bounds, checked in C while parsing."""

from __future__ import annotations

import uuid
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from agent.wire.topics import IDENT_PATTERN, MAX_CARDS_PER_RACK, NAME_PATTERN, Kind
from twin.readings import MAX_PUMP_SPEED_FRAC
from twin.workload import Phase

_Ts = Annotated[float, Meta(ge=0.0, le=1.0e11)]
_Seq = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_Ident = Annotated[str, Meta(pattern=IDENT_PATTERN)]
_Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
#: The longest free text a message carries (an ack's reason, an event's detail), in characters.
MAX_TEXT_CHARS: Final = 1024
_Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
_CardIdx = Annotated[int, Meta(ge=0, le=MAX_CARDS_PER_RACK - 1)]
_Level = Annotated[int, Meta(ge=0, le=255)]
_CardPowerW = Annotated[float, Meta(ge=0.0, le=5000.0)]
_PositivePowerW = Annotated[float, Meta(gt=0.0, le=5000.0)]
_RackPowerW = Annotated[float, Meta(ge=0.0, le=1.0e7)]
_SitePowerW = Annotated[float, Meta(ge=0.0, le=1.0e10)]
_TempC = Annotated[float, Meta(ge=-50.0, le=200.0)]
_Percent = Annotated[float, Meta(ge=0.0, le=100.0)]
_PumpSpeedPercent = Annotated[float, Meta(ge=0.0, le=100.0 * MAX_PUMP_SPEED_FRAC)]  # 0: a stopped pump
_PumpSpeedCmdPercent = Annotated[float, Meta(gt=0.0, le=100.0 * MAX_PUMP_SPEED_FRAC)]
_ClockMhz = Annotated[float, Meta(ge=0.0, le=10000.0)]
_FlowLpm = Annotated[float, Meta(ge=0.0, le=1.0e5)]
_PressureKpa = Annotated[float, Meta(ge=-100.0, le=1.0e4)]


_MaxCards = Meta(max_length=MAX_CARDS_PER_RACK)
_IdxCol = Annotated[list[_CardIdx], _MaxCards]
_LevelCol = Annotated[list[_Level], _MaxCards]
_CardPowerCol = Annotated[list[_CardPowerW], _MaxCards]
_ClockCol = Annotated[list[_ClockMhz], _MaxCards]
_BoolCol = Annotated[list[bool], _MaxCards]
#: a column of sensor readings: a number per card, ``null`` where the sensor gave none (what JSON
#: encoders write for NaN). Not range-checked here: the belief refuses an implausible or missing
#: reading of one card (``twin.state``, counted) and keeps the rack's other cards' readings
_ReadingCol = Annotated[list[float | None], _MaxCards]
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
    power_watts: _ReadingCol
    temperature_celsius: _ReadingCol
    sm_clock_mhz: _ReadingCol
    utilization_percent: _ReadingCol
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
    pump_speed_percent: _PumpSpeedPercent | None = None  # absent: unknown (publishers before the field)


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


#: The most jobs a snapshot lists (the payload limit, 256 KiB, bounds it sooner: ~300 bytes a queued job).
MAX_SNAPSHOT_JOBS: Final = 100_000


class _JobStateEntryW(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    job_id: _Ident
    state: Literal["queued", "running"]
    job: _JobW
    cards: _CardMap | None = None  # running jobs only
    phase: Literal["compute", "communication", "checkpoint", "waiting"] | None = None  # running jobs only


class _JobStateW(_W, kw_only=True):
    schema: Literal["racktwin.job_state/1"]
    jobs: Annotated[list[_JobStateEntryW], Meta(max_length=MAX_SNAPSHOT_JOBS)]


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
    pump_speed_percent: _PumpSpeedCmdPercent


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
    pump_speed_percent: Annotated[dict[_Name, _PumpSpeedCmdPercent], Meta(max_length=4096)] = {}


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
    Kind.JOB_STATE: _JobStateW,
    Kind.SCHEDULER_CMD: _SchedulerCmdW,
    Kind.SCHEDULER_ACK: _AckW,
    Kind.AGENT_STATUS: _AgentStatusW,
    Kind.ADVICE: _AdviceW,
}
