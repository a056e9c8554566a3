"""What the simulator's telemetry says where a mutation audit of ``sim.telemetry.TelemetryEncoder``
found it untested: every reading at exactly its sensor's resolution (docs/sim.md, "What the simulator
publishes": not coarser, which hides what the agent estimates from, nor finer), clocks exact; and the
plant's bad sensors as a receiver gets them (docs/protocol.md): a card's NaN readings as ``null`` and
its implausible ones as they are, in a batch the receiver accepts, so that its belief refuses just
those cards' readings; a bad loop's CDU message rejected. Read back through the receiving
``agent.wire.Codec``, as an agent or bridge reads it. The site is two racks of 16 cards (nominal loop
flow 19.2 L/min, pump head 250 kPa)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from readings_testing import card_batch

from agent import wire
from sim.telemetry import TelemetryEncoder
from twin.faults import Fault, GarbageReadings
from twin.plant import Plant, PlantConfig
from twin.readings import FacilityReading, LoopReading, PduReading, RackReading, Readings
from twin.sensor_faults import GARBAGE_DIE_TEMP_C, GARBAGE_POWER_W, GARBAGE_UTILIZATION
from twin.spec import SiteSpec

pytestmark = pytest.mark.unit

START = 1_800_000_000.0
PREFIX = "racktwin/v1/site1/"


def _codec(site: SiteSpec) -> wire.Codec:
    return wire.Codec(wire.SiteLayout.from_spec(site, "site1"))


def _json(out: wire.Outgoing) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(out.payload)
    return d


def test_each_reading_goes_out_at_its_sensors_resolution_and_clocks_exact(small_site: SiteSpec) -> None:
    """Values with digits below each resolution: each must read rounded to its own resolution (a
    tenth of it more, or ten times it less, reads differently). Card clocks under a power brake are
    fractional and go out exact; the delta pressure is 250 kPa x (9.647 / 19.2)^2 = 63113.477 Pa,
    63113 Pa to 1 Pa."""
    enc = TelemetryEncoder(_codec(small_site), small_site, wire.Sequencer("sim"))
    rack = RackReading(
        rack=0,
        time_s=7.0,
        cards=card_batch(np.arange(16), clock_mhz=np.linspace(1873.456, 1980.0, 16)),
        loop=LoopReading(32.047, 41.456, 9.647, 480.36, pump_speed_frac=0.61234),
        pdu=PduReading(power_w=12345.678),
    )
    facility = FacilityReading(7.0, 25.047, 30.126, 40.444, 1234.56, 23456.78, 30000.06, 32.123)
    cards, cdu, _, fac = (_json(o) for o in enc.readings(Readings(7.0, (rack,), facility), START + 7.0))

    assert cards["sm_clock_mhz"] == np.linspace(1873.456, 1980.0, 16).tolist()
    assert cards["sm_clock_mhz"][0] == 1873.456

    assert cdu["supply_temperature_celsius"] == 32.05  # 0.01 deg C
    assert cdu["flow_liters_per_minute"] == 9.65  # 0.01 L/min
    assert cdu["pump_power_watts"] == 480.4  # 0.1 W
    assert cdu["delta_pressure_kpa"] == pytest.approx(63.113, abs=1e-9)  # 1 Pa

    assert fac["ambient_temperature_celsius"] == 25.05  # 0.01 deg C
    assert fac["facility_power_watts"] == 30000.1  # 0.1 W


def test_bad_card_sensors_reach_the_receiver_as_null_or_as_they_are_and_bad_loops_are_rejected(
    small_site: SiteSpec,
) -> None:
    """The plant with every card reading of rack r0 NaN and every one of r1 garbage (``fraction``
    1: the loops go bad too). The receiver accepts both card batches: r0's power, die temperature
    and utilization ``null`` (NaN; its clocks still read), r1's -1234.5 W, 10,000 deg C and 700 %
    as the sensors said them (not zeroed or clipped into a range its belief would take as a
    reading). Both CDU messages are rejected: r0's NaN temperatures as ``non_finite``, r1's
    -273 deg C return as ``out_of_range``; the PDUs and the facility still read."""
    faults: list[Fault] = [
        GarbageReadings(rack=0, start_s=0.0, mode="nan", fraction=1.0),
        GarbageReadings(rack=1, start_s=0.0, mode="garbage", fraction=1.0),
    ]
    plant = Plant(small_site, [], faults, PlantConfig(seed=3))
    plant.step(1.0)
    codec = _codec(small_site)
    out = TelemetryEncoder(codec, small_site, wire.Sequencer("sim")).readings(plant.readings(), START + 1.0)
    got = {o.topic.removeprefix(PREFIX): codec.decode(o.topic, o.payload) for o in out}
    assert set(got) == {f"rack/{r}/{k}" for r in ("r0", "r1") for k in ("cards", "cdu", "pdu")} | {"facility"}

    r0, r1 = got["rack/r0/cards"], got["rack/r1/cards"]
    assert isinstance(r0, wire.CardBatch) and isinstance(r1, wire.CardBatch)
    raw = _json(next(o for o in out if o.topic == PREFIX + "rack/r0/cards"))
    for col in ("power_watts", "temperature_celsius", "utilization_percent"):
        assert raw[col] == [None] * 16, col
    assert np.isnan(r0.power_w).all() and np.isnan(r0.temp_c).all() and np.isnan(r0.utilization).all()
    assert np.isfinite(r0.sm_clock_mhz).all()

    assert (r1.power_w == GARBAGE_POWER_W).all() and (r1.temp_c == GARBAGE_DIE_TEMP_C).all()
    assert r1.utilization == pytest.approx(np.full(16, GARBAGE_UTILIZATION), abs=1e-12)
    assert _json(next(o for o in out if o.topic == PREFIX + "rack/r1/cards"))["utilization_percent"] == [700.0] * 16

    cdu0, cdu1 = got["rack/r0/cdu"], got["rack/r1/cdu"]
    assert isinstance(cdu0, wire.Rejection) and cdu0.reason == "non_finite"
    assert isinstance(cdu1, wire.Rejection) and cdu1.reason == "out_of_range"
    assert all(isinstance(got[t], wire.PduReading) for t in ("rack/r0/pdu", "rack/r1/pdu"))
    assert isinstance(got["facility"], wire.FacilityReading)
