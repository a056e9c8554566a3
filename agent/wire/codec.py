"""Decoding (wire -> code) with validation, and :class:`Codec` (topic-aware decoding for one site,
with counted rejections; encoding to :class:`Outgoing`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
import numpy as np

from agent.wire.encoding import Outgoing, _rack_of, encode, kind_of
from agent.wire.messages import (
    Acknowledgement,
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
)
from agent.wire.rejections import Rejection, RejectionCounter, RejectReason, _Reject
from agent.wire.schemas import (
    _EVENT_FIELDS,
    _PHASES,
    _WIRE_TYPES,
    _AckW,
    _AdviceItemW,
    _AdviceW,
    _AgentStatusW,
    _AppliedW,
    _CardsW,
    _CduCmdW,
    _CduW,
    _CommandW,
    _FacilityCmdW,
    _FacilityW,
    _JobEventW,
    _JobStateW,
    _JobW,
    _PduW,
    _RackCmdW,
    _SchedulerCmdW,
)
from agent.wire.topics import (
    _KINDS,
    _RACK_PATHS,
    _SITE_PATHS,
    FACILITY,
    MAX_CARDS_PER_RACK,
    MAX_PAYLOAD_BYTES,
    SCHEDULER,
    Kind,
    SiteLayout,
    TopicInfo,
    Topics,
)
from twin.workload import JobSpec

_PATH_RE: Final = re.compile(r" - at `(.*)`$")
_AT_BYTE_RE: Final = re.compile(r"\(byte (\d+)\)$")  # where msgspec's parser stopped on malformed JSON
_NON_FINITE_LITERALS: Final = (b"NaN", b"Infinity")  # what Python's json (and others) write for NaN and inf
#: JSON strings (the last one may be cut off by the end of the payload), and the literals outside them
_STRING_RE: Final = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.S)
_NON_FINITE_RE: Final = re.compile(rb"NaN|Infinity")
#: a card index above the schema's bound (the largest rack, ``MAX_CARDS_PER_RACK``): beyond the rack's cards
#: like any index >= cards per rack, not a value outside the allowed ones
_CARD_BOUND: Final = f"Expected `int` <= {MAX_CARDS_PER_RACK - 1}"
_CARD_PATH_RE: Final = re.compile(r"\.card(?:s|_index)(?:\[\.\.\.\])?\[\d+\]$")


def _non_finite_literal(raw: bytes, text: str) -> bool:
    """Whether malformed JSON is so because of a NaN or Infinity literal (not JSON) where a value goes: the
    parser stopped at one (msgspec says at which byte), or, where it does not say, one stands outside the
    payload's strings (``"NaN"`` in a string is JSON, and a payload malformed elsewhere is malformed)."""
    at = _AT_BYTE_RE.search(text)
    if at is not None:
        return raw.startswith(_NON_FINITE_LITERALS, int(at.group(1)))
    return _NON_FINITE_RE.search(_STRING_RE.sub(b'""', raw)) is not None


def _size_bytes(payload: bytes | bytearray | memoryview | str) -> int:
    """The payload's size in bytes (its UTF-8 encoding for a str; a memoryview's bytes, whatever its format)."""
    if isinstance(payload, bytes):
        return len(payload)
    if isinstance(payload, str):  # a non-ASCII character takes 2-4 bytes
        return len(payload) if payload.isascii() else len(payload.encode("utf-8", "surrogatepass"))
    return memoryview(payload).nbytes


def _classify(exc: msgspec.DecodeError, payload: Any) -> tuple[RejectReason, str]:
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        raw = (
            bytes(payload)
            if isinstance(payload, bytes | bytearray | memoryview)
            else str(payload).encode("utf-8", "replace")
        )
        if _non_finite_literal(raw, text):
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
    if text.startswith(_CARD_BOUND) and _CARD_PATH_RE.search(path):
        return RejectReason.CARD_OUT_OF_RACK, text
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
            size = _size_bytes(payload)
            if size > self.max_payload_bytes:
                raise _Reject(RejectReason.TOO_LARGE, f"{size} bytes > {self.max_payload_bytes}")
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
        # absent (a publisher before the field): unknown, not full speed (a pump the agent slowed would read weak)
        pump_speed_frac=None if w.pump_speed_percent is None else w.pump_speed_percent / 100.0,
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


def _job_spec(job_id: str, j: _JobW, where: str) -> JobSpec:
    try:
        return JobSpec(
            job_id=job_id,
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
        raise _Reject(RejectReason.INCONSISTENT, f"{where}: {exc}") from None


def _conv_job_state(c: Codec, w: _JobStateW, rack: str | None) -> JobState:
    """Each job once; a running job with its cards and phase, a queued one with neither; no card held
    by two running jobs."""
    entries = []
    seen: set[str] = set()
    holder: dict[tuple[str, int], str] = {}
    for k, e in enumerate(w.jobs):
        where = f"jobs[{k}]"
        if e.job_id in seen:
            raise _Reject(RejectReason.INCONSISTENT, f"{where}: job {e.job_id!r} is listed twice")
        seen.add(e.job_id)
        running = e.state == "running"
        if running != (e.cards is not None) or running != (e.phase is not None):
            takes = "takes cards and phase" if running else "takes neither cards nor phase"
            raise _Reject(RejectReason.INCONSISTENT, f"{where}: a {e.state} job {takes}")
        cards = None
        if e.cards is not None:
            cards = c._card_map(e.cards, f"{where}.cards")
            for r, idx in cards.items():
                for i in idx:
                    other = holder.setdefault((r, i), e.job_id)
                    if other != e.job_id:
                        raise _Reject(
                            RejectReason.INCONSISTENT,
                            f"{where}: card {i} of rack {r} is held by jobs {other!r} and {e.job_id!r}",
                        )
        entries.append(
            JobStateEntry(
                job=_job_spec(e.job_id, e.job, f"{where}.job"),
                cards=cards,
                phase=None if e.phase is None else _PHASES[e.phase],
            )
        )
    return JobState(jobs=tuple(entries), ts_s=w.ts, seq=w.seq, publisher=w.publisher)


def _conv_job_event(c: Codec, w: _JobEventW, rack: str | None) -> JobEvent:
    required, optional = _EVENT_FIELDS[w.event]
    present = {f for f in ("job", "cards", "phase", "reason") if getattr(w, f) is not None}
    if not required <= present or not present <= required | optional:
        raise _Reject(
            RejectReason.INCONSISTENT,
            f"event {w.event} takes {sorted(required)} (optional {sorted(optional)}), got {sorted(present)}",
        )
    job = None if w.job is None else _job_spec(w.job_id, w.job, "job")
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
    Kind.JOB_STATE: _conv_job_state,
    Kind.SCHEDULER_CMD: _conv_scheduler_cmd,
    Kind.SCHEDULER_ACK: _ack_converter(SCHEDULER),
    Kind.AGENT_STATUS: _conv_agent_status,
    Kind.ADVICE: _conv_advice,
}
