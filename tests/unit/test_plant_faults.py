"""twin.plant_faults: the checks of a fault against the site, the timeline actions each fault brings
(when a failure is repaired, the 20 steps of a pump's ramp, when a sensor fault ends), the edges the
simulator lands its steps on, and what overlapping faults leave in force (the lowest pump flow, the
product of foulings, the sum of heat waves). The plant under each fault is in tests/unit/test_plant.py.

What users rely on: a fault scenario's fault hits the rack or card it names, from ``start_s`` (or
``at_s``) to ``end_s`` (or the repair), and a fault naming a rack or card the site lacks is refused
rather than hitting another one."""

from __future__ import annotations

import numpy as np
import pytest

from twin.faults import (
    CardFailure,
    ColdPlateFouling,
    Fault,
    GarbageReadings,
    HeatWave,
    PumpDegradation,
    SensorDropout,
    StuckSensor,
)
from twin.plant_faults import PlantFaults
from twin.spec import SiteSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        (SensorDropout(rack=2, start_s=0.0), "rack 2 is not in 0..1"),
        (StuckSensor(rack=2, start_s=0.0), "rack 2 is not in 0..1"),
        (GarbageReadings(rack=2, start_s=0.0), "rack 2 is not in 0..1"),
        (PumpDegradation(rack=2, start_s=0.0, flow_fraction=0.5), "rack 2 is not in 0..1"),
        (SensorDropout(rack=-1, start_s=0.0), "rack -1 is not in 0..1"),  # not the last rack by wrap-around
        (CardFailure(card=32, at_s=0.0), "card 32 is not in 0..31"),
        (ColdPlateFouling(card=32, start_s=0.0, r_factor=2.0), "card 32 is not in 0..31"),
        (ColdPlateFouling(card=-1, start_s=0.0, r_factor=2.0), "card -1 is not in 0..31"),
        (StuckSensor(rack=0, start_s=0.0, card=16), "card 16 is not in rack 0"),  # card 16 is r1's first
        (StuckSensor(rack=1, start_s=0.0, card=15), "card 15 is not in rack 1"),
        (StuckSensor(rack=1, start_s=0.0, card=32), "card 32 is not in rack 1"),
    ],
)
def test_a_fault_on_a_rack_or_card_the_site_lacks_is_refused_and_not_kept(
    small_site: SiteSpec, fault: Fault, why: str
) -> None:
    pf = PlantFaults(small_site)
    with pytest.raises(ValueError, match=why):
        pf.schedule(fault)
    assert pf.next_change_s(0.0) == np.inf  # nothing kept
    # the last rack and card are the site's
    assert pf.schedule(StuckSensor(rack=1, start_s=1.0, card=31)) == [(1.0, "sensor_on", StuckSensor(1, 1.0, card=31))]
    assert pf.schedule(CardFailure(card=31, at_s=2.0)) == [(2.0, "fail", 31)]


def test_each_fault_brings_the_actions_of_its_window(small_site: SiteSpec) -> None:
    pf = PlantFaults(small_site)
    # a failure repaired 50 s after it came; a permanent one has no repair
    assert pf.schedule(CardFailure(card=3, at_s=100.0, repair_after_s=50.0)) == [
        (100.0, "fail", 3),
        (150.0, "repair", 3),
    ]
    assert pf.schedule(CardFailure(card=4, at_s=10.0)) == [(10.0, "fail", 4)]
    # a pump ramp of 200 s in 20 steps of 10 s (the first at the start, the last at the end of the
    # ramp), then the end of the fault
    ramp = pf.schedule(PumpDegradation(rack=1, start_s=100.0, flow_fraction=0.4, ramp_s=200.0, end_s=1000.0))
    assert [a[0] for a in ramp] == [100.0 + 10.0 * i for i in range(21)] + [1000.0]
    assert {a[1] for a in ramp} == {"flow"}
    # without a ramp: once at the start (and the end where it has one)
    assert pf.schedule(PumpDegradation(rack=0, start_s=5.0, flow_fraction=0.4)) == [(5.0, "flow", None)]
    foul = ColdPlateFouling(card=7, start_s=20.0, r_factor=3.0, end_s=80.0)
    assert pf.schedule(foul) == [(20.0, "flow", None), (80.0, "flow", None)]
    drop = SensorDropout(rack=0, start_s=30.0, end_s=40.0)
    assert pf.schedule(drop) == [(30.0, "sensor_on", drop), (40.0, "sensor_off", drop)]
    stuck = StuckSensor(rack=1, start_s=50.0)
    assert pf.schedule(stuck) == [(50.0, "sensor_on", stuck)]
    assert pf.schedule(HeatWave(start_s=0.0, peak_delta_k=5.0)) == []  # smooth: no action, no edge


def test_next_change_is_the_first_edge_after_now_whatever_the_order_faults_came_in(small_site: SiteSpec) -> None:
    pf = PlantFaults(small_site)
    pf.schedule(SensorDropout(rack=0, start_s=50.0, end_s=60.0))
    pf.schedule(CardFailure(card=3, at_s=10.0, repair_after_s=0.25))  # 10 .. 10.25
    pf.schedule(HeatWave(start_s=5.0, peak_delta_k=5.0))
    edges, t = [], 0.0
    while np.isfinite(t := pf.next_change_s(t)):
        edges.append(t)
    assert edges == [10.0, 10.25, 50.0, 60.0]
    assert pf.next_change_s(10.0) == 10.25  # an edge a quarter second away is not skipped
    assert pf.next_change_s(60.0) == np.inf


def test_overlapping_faults_leave_the_lowest_flow_the_product_of_foulings_and_the_sum_of_heat_waves(
    small_site: SiteSpec,
) -> None:
    pf = PlantFaults(small_site)
    pf.schedule(PumpDegradation(rack=1, start_s=0.0, flow_fraction=0.5, end_s=100.0))
    pf.schedule(PumpDegradation(rack=1, start_s=50.0, flow_fraction=0.8, end_s=200.0))
    pf.schedule(PumpDegradation(rack=0, start_s=150.0, flow_fraction=0.6))
    pf.schedule(PumpDegradation(rack=0, start_s=400.0, flow_fraction=0.9))
    assert pf.pump_flow_frac(10.0).tolist() == [1.0, 0.5]
    assert pf.pump_flow_frac(60.0).tolist() == [1.0, 0.5]  # both on r1: the lower of the two
    assert pf.pump_flow_frac(100.0).tolist() == [1.0, 0.8]  # the first ended at 100 s
    assert pf.pump_flow_frac(160.0).tolist() == [0.6, 0.8]
    assert pf.pump_flow_frac(200.0).tolist() == [0.6, 1.0]
    assert pf.pump_flow_frac(500.0).tolist() == [0.6, 1.0]  # the milder later one does not raise r0's flow
    pf.schedule(ColdPlateFouling(card=5, start_s=10.0, r_factor=2.0, end_s=30.0))
    pf.schedule(ColdPlateFouling(card=5, start_s=20.0, r_factor=3.0))
    pf.schedule(ColdPlateFouling(card=6, start_s=20.0, r_factor=4.0, end_s=25.0))
    foul = {t: pf.fouling_factor(t) for t in (9.5, 10.0, 20.0, 25.0, 30.0)}
    assert np.all(foul[9.5] == 1.0)  # not yet
    assert foul[10.0][5] == 2.0 and foul[20.0][5] == 6.0 and foul[30.0][5] == 3.0  # from start to end
    assert foul[20.0][6] == 4.0 and foul[25.0][6] == 1.0
    assert np.count_nonzero(foul[20.0] != 1.0) == 2  # only the fouled cards
    pf.schedule(HeatWave(start_s=0.0, peak_delta_k=6.0, ramp_s=100.0, hold_s=1000.0))
    pf.schedule(HeatWave(start_s=500.0, peak_delta_k=4.0, ramp_s=0.0, hold_s=100.0))
    assert pf.heat_wave_delta_k(50.0) == pytest.approx(3.0)
    assert pf.heat_wave_delta_k(550.0) == pytest.approx(10.0)  # the two add up
