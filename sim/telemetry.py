"""The plant's readings and job events as wire messages (``agent.wire``).

One telemetry round is, per rack that reports (a rack under ``SensorDropout`` publishes nothing):
its card batch (``rack/{rack}/cards``, every card of the rack, rack-local indices), its CDU
(``rack/{rack}/cdu``) and its PDU (``rack/{rack}/pdu``); then the facility (``facility``). Time
stamps are the site clock: ``ts = start_epoch_s + plant time``.

What the plant's sensor faults look like on the wire: a card's NaN readings are encoded as JSON
``null`` and its implausible values (-1234.5 W, 1e4 deg C, utilization 700%) as they are, in a batch
the receiver accepts (its belief refuses those cards' readings and takes the others:
docs/protocol.md); a loop's NaN or implausible values get its CDU message rejected (``non_finite``,
``out_of_range``); a stuck rack repeats its frozen values with fresh
time stamps. A failed card stays in its rack's batch with 0 W, 0 MHz, utilization 0 and
``low_power`` false (the only way a card reads 0 MHz while awake); its die temperature falls as it
cools down.

Where the site's hosts are managed (``rack.hosts_per_rack`` > 0) the card batch carries ``host_off``
(the card's host is powered off; its card then reads ``low_power`` and 0 W, except a failed card,
which keeps reading failed: awake at 0 MHz); elsewhere the column is left out.

Values are rounded to what such sensors resolve (and to keep messages small): card power 0.01 W, die
temperature 0.01 deg C, utilization 0.01 %, coolant temperatures 0.01 deg C, flow 0.01 L/min, pump
power 0.1 W, pump speed 0.01 % (of nominal: the fraction to 4 decimals), delta pressure 1 Pa, PDU
power 0.01 W, facility powers 0.1 W; clocks and power limits are exact.

Delta pressure is not modelled by the plant: the CDU reading reports the pump head scaled with the
square of the measured flow (affinity law), ``pump_head_kpa * (flow / nominal flow)^2``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from agent import wire
from twin.readings import JobEvent, Readings
from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase

__all__ = ["JobTable", "TelemetryEncoder"]


class TelemetryEncoder:
    """Turns plant readings and job events into :class:`agent.wire.Outgoing` messages."""

    def __init__(self, codec: wire.Codec, site: SiteSpec, sequencer: wire.Sequencer) -> None:
        self.codec = codec
        self.site = site
        self.sequencer = sequencer
        self.publisher = sequencer.publisher
        self._names = site.rack_names
        self._cpr = site.cards_per_rack
        self._hosts_managed = site.hosts_managed  # else no host_off column (all hosts are always on)
        self._nominal_flow_lpm = site.loop_flow_per_rack_lpm()
        self._head_pa = site.loop.pump_head_kpa * 1000.0
        topics = codec.topics
        self._topics = [(topics.cards(r), topics.cdu(r), topics.pdu(r)) for r in self._names]
        self._facility_topic = topics.facility
        self._events_topic = topics.job_events
        self._state_topic = topics.job_state
        #: the scheduler's jobs as its events announced them (what ``jobs/state`` sends)
        self.jobs = JobTable()

    def _seq(self, topic: str) -> int:
        return self.sequencer.next(topic)

    def readings(self, readings: Readings, ts_s: float) -> list[wire.Outgoing]:
        """All telemetry messages of one reading (cards, CDU and PDU per reporting rack, facility)."""
        out: list[wire.Outgoing] = []
        cpr = self._cpr
        pub = self.publisher
        for rr in readings.racks:
            r = rr.rack
            name = self._names[r]
            t_cards, t_cdu, t_pdu = self._topics[r]
            b = rr.cards
            if b is not None:
                msg = wire.CardBatch(
                    rack=name,
                    card_index=np.asarray(b.card_index, dtype=np.int64) - r * cpr,
                    power_w=np.round(b.power_w, 2),
                    temp_c=np.round(b.die_temp_c, 2),
                    sm_clock_mhz=b.clock_mhz,
                    utilization=np.round(b.utilization * 100.0, 2) / 100.0,
                    power_limit_w=b.power_limit_w,
                    low_power=b.low_power,
                    ts_s=ts_s,
                    seq=self._seq(t_cards),
                    publisher=pub,
                    host_off=b.host_off if self._hosts_managed and b.host_off is not None else None,
                )
                out.append(wire.Outgoing(t_cards, wire.encode_card_batch(msg), 0, False))
            lp = rr.loop
            if lp is not None:
                frac = lp.flow_lpm / self._nominal_flow_lpm
                cdu = wire.CduReading(
                    rack=name,
                    supply_temp_c=round(lp.supply_temp_c, 2),
                    return_temp_c=round(lp.return_temp_c, 2),
                    flow_lpm=round(lp.flow_lpm, 2),
                    delta_pressure_pa=round(self._head_pa * frac * frac, 0),
                    pump_power_w=round(lp.pump_power_w, 1),
                    ts_s=ts_s,
                    seq=self._seq(t_cdu),
                    publisher=pub,
                    pump_speed_frac=round(lp.pump_speed_frac, 4),
                )
                out.append(wire.Outgoing(t_cdu, wire.encode_cdu(cdu), 0, False))
            if rr.pdu is not None:
                pdu = wire.PduReading(
                    rack=name, power_w=round(rr.pdu.power_w, 2), ts_s=ts_s, seq=self._seq(t_pdu), publisher=pub
                )
                out.append(wire.Outgoing(t_pdu, wire.encode_pdu(pdu), 0, False))
        f = readings.facility
        if f is not None:
            fac = wire.FacilityReading(
                ambient_temp_c=round(f.ambient_temp_c, 2),
                supply_temp_c=round(f.facility_supply_temp_c, 2),
                return_temp_c=round(f.facility_return_temp_c, 2),
                cooling_power_w=round(f.cooling_power_w, 1),
                it_power_w=round(f.it_power_w, 1),
                facility_power_w=round(f.facility_power_w, 1),
                supply_setpoint_c=f.supply_setpoint_c,
                ts_s=ts_s,
                seq=self._seq(self._facility_topic),
                publisher=pub,
            )
            out.append(wire.Outgoing(self._facility_topic, wire.encode_facility(fac), 0, False))
        return out

    def cards_by_rack(self, cards: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """Site card indices -> ``{rack name: rack-local indices}`` (the wire's card maps)."""
        out: dict[str, list[int]] = {}
        for c in cards:
            r, local = divmod(int(c), self._cpr)
            out.setdefault(self._names[r], []).append(local)
        return {r: tuple(v) for r, v in out.items()}

    def job_event(self, ev: JobEvent, start_epoch_s: float) -> wire.Outgoing | None:
        """A plant job event as a ``racktwin.job_event/1`` message (None for an unknown kind); the
        scheduler's job table (:attr:`jobs`, what :meth:`job_state` sends) takes it in."""
        ts_s = start_epoch_s + ev.time_s
        job = None
        cards = None
        phase: Phase | None = None
        reason = ev.detail[:1024] if ev.detail else None
        if ev.kind == "submitted":
            kind = wire.JobEventType.SUBMITTED
            if ev.job is not None:
                job = dataclasses.replace(ev.job, submit_time_s=start_epoch_s + ev.job.submit_time_s)
            reason = None
        elif ev.kind == "started":
            kind = wire.JobEventType.STARTED
            cards = self.cards_by_rack(ev.cards)
            reason = None
        elif ev.kind == "phase":
            kind = wire.JobEventType.PHASE_CHANGED
            phase = ev.phase
            reason = None
        elif ev.kind == "requeued":
            kind = wire.JobEventType.REQUEUED
        elif ev.kind == "finished":
            kind = wire.JobEventType.FINISHED
        elif ev.kind == "failed":
            kind = wire.JobEventType.FAILED
        else:  # pragma: no cover - the plant has no other kinds
            return None
        self.jobs.take(kind, ev.job_id, job=job, cards=cards, phase=ev.phase)
        topic = self._events_topic
        msg = wire.JobEvent(
            event=kind,
            job_id=ev.job_id,
            ts_s=ts_s,
            seq=self._seq(topic),
            publisher=self.publisher,
            job=job,
            cards=cards,
            phase=phase,
            reason=reason,
        )
        return wire.Outgoing(topic, wire.encode_job_event(msg), 1, False)

    def job_state(self, ts_s: float) -> wire.Outgoing:
        """The scheduler's jobs now (:attr:`jobs`) as a retained ``racktwin.job_state/1`` snapshot,
        numbered by the job events' ``seq`` counter: after every event it includes, before any later one."""
        msg = wire.JobState(
            jobs=self.jobs.entries(), ts_s=ts_s, seq=self._seq(self._events_topic), publisher=self.publisher
        )
        return wire.Outgoing(self._state_topic, wire.encode_job_state(msg), 1, True)


class JobTable:
    """The queued and running jobs as the job events announce them (wire form: epoch submit times,
    rack -> card maps): the fold of the events, so that a snapshot says what an agent that took every
    event knows. Queued jobs in the order they were queued (a requeued job last)."""

    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}
        self._queued: dict[str, None] = {}
        self._running: dict[str, tuple[dict[str, tuple[int, ...]], Phase]] = {}

    def take(
        self,
        kind: wire.JobEventType,
        job_id: str,
        *,
        job: JobSpec | None = None,
        cards: dict[str, tuple[int, ...]] | None = None,
        phase: Phase = Phase.WAITING,
    ) -> None:
        if kind is wire.JobEventType.SUBMITTED:
            if job is not None:
                self._specs[job_id] = job
                self._queued[job_id] = None
        elif job_id not in self._specs:
            return
        elif kind is wire.JobEventType.STARTED:
            self._queued.pop(job_id, None)
            self._running[job_id] = (dict(cards or {}), Phase.WAITING)
        elif kind is wire.JobEventType.PHASE_CHANGED:
            if job_id in self._running:
                self._running[job_id] = (self._running[job_id][0], phase)
        elif kind is wire.JobEventType.REQUEUED:
            self._running.pop(job_id, None)
            self._queued[job_id] = None
        else:  # finished, failed
            self._running.pop(job_id, None)
            self._queued.pop(job_id, None)
            del self._specs[job_id]

    def entries(self) -> tuple[wire.JobStateEntry, ...]:
        running = tuple(
            wire.JobStateEntry(self._specs[j], cards=cards, phase=phase) for j, (cards, phase) in self._running.items()
        )
        return running + tuple(wire.JobStateEntry(self._specs[j]) for j in self._queued)

    def __len__(self) -> int:
        return len(self._specs)
