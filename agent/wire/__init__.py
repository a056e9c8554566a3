"""The racktwin MQTT protocol, version 1, as a package: topics, payload schemas, encode/decode and
validation.

* ``topics``: protocol constants, :class:`Kind` (topic, schema, QoS, retain), :class:`Topics`,
  :class:`TopicInfo`, :class:`SiteLayout`.
* ``rejections``: :class:`RejectReason`, :class:`Rejection`, :class:`RejectionCounter`.
* ``messages``: the code's message types (:class:`CardBatch` ... :class:`AgentAdvice`) and command
  helpers (:func:`new_command_id`, :func:`is_expired`, :func:`command_time_problem`, :func:`ack_for`,
  :class:`Sequencer`, ...), :class:`AckReason` and the commands' time limits.
* ``schemas``: the msgspec wire schemas (private), which carry the physical bounds.
* ``encoding``: code -> wire (``encode_*``, :func:`encode`, :func:`kind_of`, :class:`Outgoing`).
* ``codec``: wire -> code with validation, and :class:`Codec`.

Import the public names from the package (``from agent.wire import Codec``); they are re-exported here.

Everything that crosses the broker is defined here, and only here are wire units converted to the
code's units. See ``docs/protocol.md`` for the topic table and every payload.

* Topics live under ``racktwin/v1/{site}/``: per rack
  ``rack/{rack}/{cards,cdu,pdu,cmd,cdu_cmd,ack,applied}``,
  per site ``facility``, ``facility/cmd``, ``facility/ack``, ``jobs/events``, ``jobs/state``, ``scheduler/cmd``,
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

from agent.wire.codec import Codec
from agent.wire.encoding import (
    Outgoing,
    encode,
    encode_ack,
    encode_advice,
    encode_agent_status,
    encode_applied,
    encode_card_batch,
    encode_cdu,
    encode_cdu_command,
    encode_facility,
    encode_facility_command,
    encode_job_event,
    encode_job_state,
    encode_pdu,
    encode_rack_command,
    encode_scheduler_command,
    kind_of,
)
from agent.wire.messages import (
    MAX_COMMAND_TTL_S,
    MAX_ISSUE_AHEAD_S,
    Acknowledgement,
    AckReason,
    AckResult,
    AdviceItem,
    AgentAdvice,
    AgentState,
    AgentStatus,
    AppliedState,
    CardAction,
    CardBatch,
    CardSetting,
    CduCommand,
    CduReading,
    FacilityCommand,
    FacilityReading,
    JobEvent,
    JobEventType,
    JobState,
    JobStateEntry,
    Message,
    PduReading,
    Placement,
    RackCommand,
    SchedulerCommand,
    Sequencer,
    ack_for,
    approx_equal,
    card_failed_reason,
    command_time_problem,
    failed_cards_by_rack,
    failed_cards_of,
    is_expired,
    new_command_id,
    placement_card_failed_reason,
    reason_code,
)
from agent.wire.messages import BoolArray as BoolArray
from agent.wire.messages import Command as Command
from agent.wire.messages import FloatArray as FloatArray
from agent.wire.messages import IntArray as IntArray
from agent.wire.rejections import Rejection, RejectionCounter, RejectReason
from agent.wire.rejections import log as log
from agent.wire.schemas import MAX_TEXT_CHARS
from agent.wire.topics import AGENT_KINDS as AGENT_KINDS
from agent.wire.topics import (
    FACILITY,
    MAX_CARDS_PER_RACK,
    MAX_PAYLOAD_BYTES,
    PROTOCOL_PREFIX,
    SCHEDULER,
    SCHEMAS,
    Kind,
    SiteLayout,
    TopicInfo,
    Topics,
)
from agent.wire.topics import PLANT_KINDS as PLANT_KINDS
from agent.wire.topics import qos_of as qos_of
from agent.wire.topics import retain_of as retain_of

__all__ = [
    "FACILITY",
    "MAX_CARDS_PER_RACK",
    "MAX_COMMAND_TTL_S",
    "MAX_ISSUE_AHEAD_S",
    "MAX_PAYLOAD_BYTES",
    "MAX_TEXT_CHARS",
    "PROTOCOL_PREFIX",
    "SCHEDULER",
    "SCHEMAS",
    "AckReason",
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
    "JobState",
    "JobStateEntry",
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
    "card_failed_reason",
    "command_time_problem",
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
    "encode_job_state",
    "encode_pdu",
    "encode_rack_command",
    "encode_scheduler_command",
    "failed_cards_by_rack",
    "failed_cards_of",
    "is_expired",
    "kind_of",
    "new_command_id",
    "placement_card_failed_reason",
    "reason_code",
]
