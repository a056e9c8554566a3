"""What the simulator puts on the wire (``sim.telemetry.TelemetryEncoder``), read back as the JSON a
bridge or the agent receives: hand-made plant readings and job events, and the payloads they must
give by docs/protocol.md (field names, units, rounding, rack-local indices, site-clock time stamps,
the order of a round, per-topic sequence numbers, QoS). Expected values are worked out by hand from
the readings; the site is two racks of 16 cards (hosts of 2 cards, nominal loop flow 19.2 L/min,
pump head 250 kPa)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from readings_testing import card_batch

from agent import wire
from sim.telemetry import TelemetryEncoder
from twin.plant import CardFailure, Plant, PlantConfig
from twin.readings import FacilityReading, JobEvent, LoopReading, PduReading, RackReading, Readings
from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase

pytestmark = pytest.mark.unit

START = 1_800_000_000.0
PREFIX = "racktwin/v1/site1/"


def _encoder(site: SiteSpec) -> TelemetryEncoder:
    return TelemetryEncoder(wire.Codec(wire.SiteLayout.from_spec(site, "site1")), site, wire.Sequencer("sim"))


def _json(out: wire.Outgoing) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(out.payload)
    return d


def _r1_cards() -> Any:
    """Rack r1's 16 cards (site cards 16..31) at the readings' defaults (300 W, 50 deg C, 1980 MHz,
    50 %, limit 700 W, awake) but: card 16 at 300.456 W, 54.2249 deg C, 12.3456 % and a 612.345 W
    limit; card 18 asleep (0 W, 0 MHz); card 19 waking (no column on the wire: it reads awake, at 0 %);
    cards 30 and 31 on a powered-off host (0 W, asleep)."""
    n = 16
    power = np.full(n, 300.0)
    temp = np.full(n, 50.0)
    clock = np.full(n, 1980.0)
    util = np.full(n, 0.5)
    limit = np.full(n, 700.0)
    low = np.zeros(n, dtype=bool)
    host_off = np.zeros(n, dtype=bool)
    waking = np.zeros(n, dtype=bool)
    waking[3], util[3] = True, 0.0
    power[0], temp[0], util[0], limit[0] = 300.456, 54.2249, 0.123456, 612.345
    power[2], clock[2], util[2], low[2] = 0.0, 0.0, 0.0, True
    power[14:], clock[14:], util[14:], low[14:], host_off[14:] = 0.0, 0.0, 0.0, True, True
    return card_batch(
        np.arange(16, 32),
        power_w=power,
        die_temp_c=temp,
        clock_mhz=clock,
        utilization=util,
        power_limit_w=limit,
        low_power=low,
        waking=waking,
        host_off=host_off,
    )


def _r1(time_s: float) -> RackReading:
    return RackReading(
        rack=1,
        time_s=time_s,
        cards=_r1_cards(),
        # half the nominal flow, the pump at 61.234 % of its speed
        loop=LoopReading(32.004, 41.456, 9.6, 480.04, pump_speed_frac=0.61234),
        pdu=PduReading(power_w=12345.678),
    )


def _facility(time_s: float) -> FacilityReading:
    return FacilityReading(
        time_s=time_s,
        ambient_temp_c=25.004,
        facility_supply_temp_c=30.126,
        facility_return_temp_c=40.444,
        cooling_power_w=1234.56,
        it_power_w=23456.78,
        facility_power_w=30000.04,
        supply_setpoint_c=32.123,
    )


def test_a_racks_round_reads_in_the_documented_fields_units_and_resolution(small_site: SiteSpec) -> None:
    """Rack r0 has dropped out (publishes nothing); r1 reports its cards (rack-local indices 0..15),
    its CDU and its PDU, then the facility follows, all stamped with the site clock
    (``START`` + plant time 120 s), each the first message of its topic."""
    enc = _encoder(small_site)
    out = enc.readings(Readings(time_s=120.0, racks=(_r1(120.0),), facility=_facility(120.0)), START + 120.0)
    assert [o.topic for o in out] == [PREFIX + t for t in ("rack/r1/cards", "rack/r1/cdu", "rack/r1/pdu", "facility")]
    assert all(o.qos == 0 and not o.retain for o in out)  # periodic telemetry: QoS 0, never retained
    cards, cdu, pdu, fac = (_json(o) for o in out)
    for d in (cards, cdu, pdu, fac):
        assert d["ts"] == START + 120.0 and d["seq"] == 0 and d["publisher"] == "sim"

    assert cards["schema"] == "racktwin.cards/1"
    assert cards["card_index"] == list(range(16))
    assert cards["power_watts"][:3] == [300.46, 300.0, 0.0] and cards["power_watts"][14:] == [0.0, 0.0]
    assert cards["temperature_celsius"][0] == 54.22 and cards["temperature_celsius"][1] == 50.0
    assert cards["sm_clock_mhz"][:3] == [1980.0, 1980.0, 0.0] and cards["sm_clock_mhz"][14:] == [0.0, 0.0]
    assert cards["utilization_percent"][0] == pytest.approx(12.35, abs=1e-9)  # 0.123456 -> 12.35 %
    assert cards["utilization_percent"][1] == pytest.approx(50.0, abs=1e-9) and cards["utilization_percent"][3] == 0.0
    assert cards["power_limit_watts"][:2] == [612.345, 700.0]  # limits are exact
    assert cards["low_power"] == [False, False, True] + [False] * 11 + [True, True]
    assert cards["host_off"] == [False] * 14 + [True, True]

    assert cdu["schema"] == "racktwin.cdu/1"
    assert cdu["supply_temperature_celsius"] == 32.0 and cdu["return_temperature_celsius"] == 41.46
    assert cdu["flow_liters_per_minute"] == 9.6 and cdu["pump_power_watts"] == 480.0
    # the pump head scaled with the square of the flow's share of nominal: 250 kPa x 0.5^2
    assert cdu["delta_pressure_kpa"] == pytest.approx(62.5, abs=1e-9)
    assert cdu["pump_speed_percent"] == pytest.approx(61.23, abs=1e-9)

    assert pdu["schema"] == "racktwin.pdu/1" and pdu["power_watts"] == 12345.68

    assert fac["schema"] == "racktwin.facility/1"
    assert fac["ambient_temperature_celsius"] == 25.0
    assert fac["supply_temperature_celsius"] == 30.13 and fac["return_temperature_celsius"] == 40.44
    assert fac["cooling_power_watts"] == 1234.6 and fac["it_power_watts"] == 23456.8
    assert fac["facility_power_watts"] == 30000.0
    assert fac["supply_setpoint_celsius"] == 32.123  # the set-point in force, as commanded


def test_each_rack_reports_cards_cdu_pdu_in_rack_order_then_the_facility_and_seq_counts_per_topic(
    small_site: SiteSpec,
) -> None:
    """Two rounds of both racks: per rack its cards, CDU, PDU, then the facility; each topic's
    sequence numbers go 0, 1 (no gaps: a gap would read as a lost message); r0's batch holds its
    own cards 0..15 at rack-local indices 0..15 too; the second round is stamped a second later."""
    enc = _encoder(small_site)
    r0 = RackReading(
        rack=0,
        time_s=0.0,
        cards=card_batch(np.arange(16)),
        loop=LoopReading(32.0, 40.0, 19.2, 400.0, pump_speed_frac=1.0),
        pdu=PduReading(power_w=9000.0),
    )
    rounds = [
        enc.readings(Readings(time_s=t, racks=(r0, _r1(t)), facility=_facility(t)), START + t) for t in (0.0, 1.0)
    ]
    expected_topics = [
        PREFIX + t
        for t in ("rack/r0/cards", "rack/r0/cdu", "rack/r0/pdu", "rack/r1/cards", "rack/r1/cdu", "rack/r1/pdu")
    ] + [PREFIX + "facility"]
    for k, out in enumerate(rounds):
        assert [o.topic for o in out] == expected_topics
        assert [_json(o)["seq"] for o in out] == [k] * 7
        assert {_json(o)["ts"] for o in out} == {START + k}
    r0_cards = _json(rounds[0][0])
    assert r0_cards["card_index"] == list(range(16)) and r0_cards["power_watts"] == [300.0] * 16
    # at nominal flow the CDU reads the whole pump head, at full speed 100 %
    r0_cdu = _json(rounds[0][1])
    assert r0_cdu["delta_pressure_kpa"] == pytest.approx(250.0, abs=1e-9) and r0_cdu["pump_speed_percent"] == 100.0


def test_the_facility_reports_when_every_rack_has_dropped_out(small_site: SiteSpec) -> None:
    enc = _encoder(small_site)
    out = enc.readings(Readings(time_s=5.0, racks=(), facility=_facility(5.0)), START + 5.0)
    assert [o.topic for o in out] == [PREFIX + "facility"]
    assert _json(out[0])["ts"] == START + 5.0 and _json(out[0])["it_power_watts"] == 23456.8


def test_failed_asleep_and_host_off_cards_read_as_the_protocol_says(small_site: SiteSpec) -> None:
    """The plant's own readings on the wire, rack r1: card 20 (local 4) failed reads 0 W, 0 MHz, 0 %
    and awake (``low_power`` false); card 18 (local 2) asleep reads ``low_power`` at 0 MHz; the cards
    of host 15 (cards 30, 31: local 14, 15) powered off read ``host_off``, ``low_power`` and 0 W;
    card 28 (local 12), failed on host 14 powered off, keeps reading failed (awake at 0 MHz, 0 W)."""
    plant = Plant(small_site, [], [CardFailure(card=20, at_s=0.0), CardFailure(card=28, at_s=0.0)], PlantConfig(seed=3))
    plant.step(1.0)  # the failures take effect
    plant.enter_low_power([18])
    plant.power_off_hosts([14, 15])
    plant.step(1.0)
    out = _encoder(small_site).readings(plant.readings(), START + plant.time_s)
    (r1,) = [_json(o) for o in out if o.topic == PREFIX + "rack/r1/cards"]
    assert r1["ts"] == START + 2.0 and r1["card_index"] == list(range(16))
    failed = 4
    assert r1["power_watts"][failed] == 0.0 and r1["sm_clock_mhz"][failed] == 0.0
    assert r1["utilization_percent"][failed] == 0.0 and r1["low_power"][failed] is False
    assert r1["low_power"][2] is True and r1["sm_clock_mhz"][2] == 0.0
    for c in (14, 15):
        assert r1["host_off"][c] is True and r1["low_power"][c] is True and r1["power_watts"][c] == 0.0
    assert r1["host_off"][12] is True and r1["low_power"][12] is False
    assert r1["sm_clock_mhz"][12] == 0.0 and r1["power_watts"][12] == 0.0
    assert r1["host_off"][13] is True and r1["low_power"][13] is True
    awake = [c for c in range(16) if c not in (2, 4, 12, 13, 14, 15)]
    assert all(r1["sm_clock_mhz"][c] > 0.0 and r1["low_power"][c] is False for c in awake)
    assert not any(r1["host_off"][c] for c in awake)


def _event(enc: TelemetryEncoder, ev: JobEvent) -> dict[str, Any]:
    out = enc.job_event(ev, START)
    assert out is not None and out.topic == PREFIX + "jobs/events"
    assert out.qos == 1 and not out.retain  # a scheduler's event stream must not be lost
    return _json(out)


def test_job_events_carry_site_clock_times_rack_local_cards_and_only_their_own_fields(small_site: SiteSpec) -> None:
    enc = _encoder(small_site)
    spec = JobSpec("late", 4, work_steps=300.0, step_time_s=1.0, compute_share=0.8, submit_time_s=250.0)
    sub = _event(enc, JobEvent(250.0, "late", "submitted", Phase.WAITING, job=spec, detail="queued"))
    assert sub["event"] == "submitted" and sub["job_id"] == "late" and sub["ts"] == START + 250.0
    assert sub["job"]["submit_ts"] == START + 250.0 and sub["job"]["n_cards"] == 4
    assert "reason" not in sub and "cards" not in sub and "phase" not in sub

    # site cards 17, 3, 16, 31: r1's 1, 0, 15 and r0's 3
    started = _event(enc, JobEvent(260.5, "late", "started", Phase.WAITING, cards=(17, 3, 16, 31), detail="placed"))
    assert started["event"] == "started" and started["ts"] == START + 260.5 and "reason" not in started
    assert {r: sorted(v) for r, v in started["cards"].items()} == {"r0": [3], "r1": [0, 1, 15]}

    phase = _event(enc, JobEvent(300.0, "late", "phase", Phase.CHECKPOINT, detail="checkpoint"))
    assert phase["event"] == "phase_changed" and phase["phase"] == "checkpoint" and "reason" not in phase

    kinds = {"requeued": "requeued", "finished": "finished", "failed": "failed"}
    for seq, (kind, name) in enumerate(kinds.items(), start=3):
        ev = _event(enc, JobEvent(400.0 + seq, "late", kind, Phase.WAITING, detail=f"card 20 failed ({kind})"))
        assert ev["event"] == name and ev["reason"] == f"card 20 failed ({kind})" and ev["seq"] == seq
        assert ev["ts"] == START + 400.0 + seq and "cards" not in ev and "job" not in ev

    long = _event(enc, JobEvent(500.0, "late", "failed", Phase.WAITING, detail="x" * 2000))
    assert long["reason"] == "x" * 1024  # (the wire takes reasons of at most 1024 characters)
    assert [sub["seq"], started["seq"], phase["seq"]] == [0, 1, 2]


def test_the_job_table_forgets_a_job_once_it_finished_or_failed(small_site: SiteSpec) -> None:
    """The job table (what the retained ``jobs/state`` snapshot sends, and the job count the
    simulator's oversized-snapshot warning names) holds the queued and running jobs only: a finished
    or failed job leaves it, and an event about it afterwards does not bring it back."""
    enc = _encoder(small_site)
    for job_id in ("a", "b"):
        spec = JobSpec(job_id, 2, work_steps=100.0, step_time_s=1.0, compute_share=1.0, submit_time_s=0.0)
        enc.job_event(JobEvent(0.0, job_id, "submitted", Phase.WAITING, job=spec), START)
    enc.job_event(JobEvent(1.0, "a", "started", Phase.WAITING, cards=(0, 1)), START)
    assert len(enc.jobs) == 2 and [e.job.job_id for e in enc.jobs.entries()] == ["a", "b"]
    enc.job_event(JobEvent(50.0, "a", "finished", Phase.WAITING, detail="done"), START)
    enc.job_event(JobEvent(60.0, "b", "failed", Phase.WAITING, detail="cancelled"), START)
    assert len(enc.jobs) == 0 and enc.jobs.entries() == ()
    enc.job_event(JobEvent(70.0, "a", "started", Phase.WAITING, cards=(2, 3)), START)
    assert len(enc.jobs) == 0 and _json(enc.job_state(START + 70.0))["jobs"] == []
