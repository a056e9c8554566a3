"""Encoding (code -> wire). Encoders trust their input: NaN is written as null, which the receiver
rejects as non_finite except in a card batch's sensor columns (a card without a reading); build
messages from validated numbers.

Also the kind and topic of a message (:func:`kind_of`) and :class:`Outgoing`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import msgspec
import numpy as np

from agent.wire.messages import (
    _PARAM_WIRE,
    Acknowledgement,
    AgentAdvice,
    AgentStatus,
    AppliedState,
    BoolArray,
    CardBatch,
    CardSetting,
    CduCommand,
    CduReading,
    FacilityCommand,
    FacilityReading,
    FloatArray,
    IntArray,
    JobEvent,
    JobState,
    Message,
    PduReading,
    RackCommand,
    SchedulerCommand,
)
from agent.wire.schemas import (
    _PHASE_NAMES,
    _AckW,
    _AdviceItemW,
    _AdviceW,
    _AgentStatusW,
    _AppliedW,
    _CardsW,
    _CduCmdW,
    _CduW,
    _FacilityCmdW,
    _FacilityW,
    _JobEventW,
    _JobStateEntryW,
    _JobStateW,
    _JobW,
    _PduW,
    _PlacementW,
    _RackCmdW,
    _SchedulerCmdW,
)
from agent.wire.topics import _KINDS, FACILITY, SCHEDULER, Kind
from twin.workload import JobSpec

_encoder = msgspec.json.Encoder()


def _floats(a: FloatArray, scale: float = 1.0) -> list[float]:
    arr = np.asarray(a, dtype=np.float64)
    return (arr * scale if scale != 1.0 else arr).tolist()  # type: ignore[no-any-return]


def _readings(a: FloatArray, scale: float = 1.0) -> list[float | None]:
    """A column of sensor readings (msgspec writes a NaN, no reading, as JSON ``null``)."""
    return cast("list[float | None]", _floats(a, scale))


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
            power_watts=_readings(m.power_w),
            temperature_celsius=_readings(m.temp_c),
            sm_clock_mhz=_readings(m.sm_clock_mhz),
            utilization_percent=_readings(m.utilization, 100.0),
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
            pump_speed_percent=None if m.pump_speed_frac is None else m.pump_speed_frac * 100.0,
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


def _job_wire(j: JobSpec) -> _JobW:
    return _JobW(
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


def encode_job_event(m: JobEvent) -> bytes:
    job = None if m.job is None else _job_wire(m.job)
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


def encode_job_state(m: JobState) -> bytes:
    return _encoder.encode(
        _JobStateW(
            schema="racktwin.job_state/1",
            ts=m.ts_s,
            seq=m.seq,
            publisher=m.publisher,
            jobs=[
                _JobStateEntryW(
                    job_id=e.job.job_id,
                    state="running" if e.cards is not None else "queued",
                    job=_job_wire(e.job),
                    cards=None if e.cards is None else _card_map(e.cards),
                    phase=None if e.phase is None else _PHASE_NAMES[e.phase],  # type: ignore[arg-type]
                )
                for e in m.jobs
            ],
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
    JobState: encode_job_state,
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
    JobState: Kind.JOB_STATE,
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
