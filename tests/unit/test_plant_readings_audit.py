"""The plant's sensors (``twin.plant_readings.PlantSensors``), fed a true state chosen by hand: what each
reading is in which unit, what a card in a state reads, the noise docs/twin.md documents
(``SensorNoise``: power 3 W, die 0.5 K, utilization 1% relative, coolant 0.1 K, flow 1%, PDU 0.5%,
facility 1%, ambient 0.2 K), drawn from the sensors' own seeded stream, fresh at each reading, added
to the reading and never to the true state, which the sensors read and do not keep."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from readings_testing import cards_of

from twin.cooling import CoolingPoint
from twin.faults import GarbageReadings
from twin.plant_readings import PlantSensors
from twin.plant_types import PlantConfig, SensorNoise
from twin.readings import Readings
from twin.spec import SiteSpec

pytestmark = pytest.mark.unit

CLOCKS_MHZ = np.array([800.0, 1400.0, 1980.0])

COOLING = CoolingPoint(
    it_power_w=40_000.0,
    heat_w=39_000.0,
    supply_temp_c=32.0,
    facility_supply_temp_c=28.0,
    facility_return_temp_c=38.0,
    ambient_temp_c=21.0,
    rack_pump_w=300.0,
    facility_pump_w=700.0,
    dry_cooler_fan_w=1_500.0,
    dry_cooler_fan_speed_frac=0.6,
    chiller_w=500.0,
    chiller_heat_w=0.0,
    chiller_cop=5.0,
    ups_loss_w=1_200.0,
    other_overhead_w=300.0,
)


def _state(site: SiteSpec) -> dict[str, Any]:
    """A true state: every card at 500 W, 60 deg C, utilization 0.5, level 2 (1,980 MHz), awake."""
    n, n_r = site.n_cards, site.n_racks
    return {
        "time_s": 100.0,
        "power_w": np.full(n, 500.0),
        "die_temp_c": np.full(n, 60.0),
        "utilization": np.full(n, 0.5),
        "effective_level": np.full(n, 2, dtype=np.int64),
        "level": np.full(n, 2, dtype=np.int64),
        "low_power": np.zeros(n, dtype=bool),
        "waking": np.zeros(n, dtype=bool),
        "power_limit_w": np.full(n, 700.0),
        "failed": np.zeros(n, dtype=bool),
        "card_host_off": np.zeros(n, dtype=bool),
        "n_low": 0,
        "n_failed": 0,
        "n_hosts_off": 0,
        "supply_c": 32.0,
        "rack_return_c": np.array([41.0, 43.0])[:n_r],
        "flow_frac": np.array([1.0, 0.8])[:n_r],
        "rack_power_w": np.array([9_000.0, 11_000.0])[:n_r],
        "rack_pump_w": np.array([150.0, 77.0])[:n_r],
        "pump_speed_frac": np.array([1.0, 0.8])[:n_r],
        "cooling": COOLING,
        "ambient_c": 21.0,
        "setpoint_c": 32.5,
        "jobs": (),
    }


def _sensors(site: SiteSpec, noise: SensorNoise | None = None, seed: int = 7) -> PlantSensors:
    cfg = PlantConfig(seed=seed, noise=SensorNoise() if noise is None else noise)
    return PlantSensors(site, cfg, CLOCKS_MHZ)


def _cards(readings: Readings, column: str) -> np.ndarray:
    return np.concatenate([getattr(r.cards, column) for r in readings.racks])


def test_exact_sensors_read_the_true_state_in_the_units_their_names_say(small_site: SiteSpec) -> None:
    site = small_site
    state = _state(site)
    state["power_limit_w"][3] = 450.0
    state["effective_level"][5] = 0  # its own protection slows it: level 2 commanded, 800 MHz run
    state["waking"][9] = True
    rd = _sensors(site, SensorNoise.none()).read(**state)
    assert rd.time_s == 100.0 and [r.rack for r in rd.racks] == [0, 1]
    assert all(r.time_s == 100.0 for r in rd.racks)
    # cards in site order: rack 1 holds cards 16..31
    np.testing.assert_array_equal(cards_of(rd.racks[1]).card_index, np.arange(16, 32))
    np.testing.assert_array_equal(_cards(rd, "power_w"), np.full(32, 500.0))
    np.testing.assert_array_equal(_cards(rd, "die_temp_c"), np.full(32, 60.0))
    np.testing.assert_array_equal(_cards(rd, "utilization"), np.full(32, 0.5))
    clock = _cards(rd, "clock_mhz")
    assert clock[5] == 800.0 and clock[4] == 1980.0 and _cards(rd, "level")[5] == 2
    assert _cards(rd, "power_limit_w")[3] == 450.0 and _cards(rd, "power_limit_w")[4] == 700.0
    waking = _cards(rd, "waking")
    assert waking[9] and waking.sum() == 1 and not _cards(rd, "low_power").any()
    loop0, loop1 = (r.loop for r in rd.racks)
    assert loop0 is not None and loop1 is not None
    # flow in litres per minute: the rack's nominal loop flow (flow per card x cards per rack) x fraction
    nominal_lpm = site.loop.flow_per_card_lpm * site.cards_per_rack
    assert loop0.flow_lpm == pytest.approx(nominal_lpm) and loop1.flow_lpm == pytest.approx(0.8 * nominal_lpm)
    assert (loop0.supply_temp_c, loop0.return_temp_c, loop1.return_temp_c) == (32.0, 41.0, 43.0)
    assert (loop0.pump_power_w, loop1.pump_power_w) == (150.0, 77.0)  # watts
    assert (loop0.pump_speed_frac, loop1.pump_speed_frac) == (1.0, 0.8)  # fraction of nominal, not percent
    assert [r.pdu.power_w for r in rd.racks if r.pdu is not None] == [9_000.0, 11_000.0]
    fac = rd.facility
    assert fac is not None and fac.time_s == 100.0
    assert (fac.ambient_temp_c, fac.facility_supply_temp_c, fac.facility_return_temp_c) == (21.0, 28.0, 38.0)
    assert fac.cooling_power_w == pytest.approx(300.0 + 700.0 + 1_500.0 + 500.0)
    assert fac.it_power_w == 40_000.0
    assert fac.facility_power_w == pytest.approx(COOLING.facility_power_w)
    assert fac.supply_setpoint_c == 32.5


def test_sleeping_failed_and_host_off_cards_read_as_docs_say_even_with_noise(small_site: SiteSpec) -> None:
    """A sleeping or failed card reads no clock, a failed card no power or utilization, a card of an off
    host no power; the others read their noisy values."""
    state = _state(small_site)
    state["low_power"][2] = True
    state["n_low"] = 1
    state["failed"][20] = True
    state["n_failed"] = 1
    state["card_host_off"][[6, 7]] = True
    state["low_power"][[6, 7]] = True
    state["n_low"] = 3
    state["n_hosts_off"] = 2
    rd = _sensors(small_site).read(**state)
    clock, power, util = _cards(rd, "clock_mhz"), _cards(rd, "power_w"), _cards(rd, "utilization")
    assert clock[2] == 0.0 and power[2] > 400.0 and util[2] > 0.4  # asleep: no clock, still a reading
    assert (clock[20], power[20], util[20]) == (0.0, 0.0, 0.0)
    assert power[6] == 0.0 and power[7] == 0.0 and clock[6] == 0.0
    awake = np.setdiff1d(np.arange(32), [2, 6, 7, 20])
    assert (clock[awake] == 1980.0).all() and (power[awake] > 400.0).all()
    assert _cards(rd, "failed")[20] and _cards(rd, "host_off")[[6, 7]].all()


def _many(site: SiteSpec, n_readings: int, **changes: Any) -> list[Readings]:
    sensors = _sensors(site)
    state = _state(site)
    state.update(changes)
    return [sensors.read(**state) for _ in range(n_readings)]


def _sd_within(values: np.ndarray, expected_sd: float, rel_tol: float) -> bool:
    return abs(float(np.std(values)) - expected_sd) <= rel_tol * expected_sd


def test_the_noise_has_the_documented_spread_in_the_documented_units(small_site: SiteSpec) -> None:
    """400 readings: 12,800 card samples, 800 rack samples, 400 facility samples; an sd estimate
    from N samples is within ~2.5/sqrt(2N) of the truth (12%, 9%, 6% at 3 sigma): bounds of 15-20%."""
    rds = _many(small_site, 400)
    power, die, util = (np.concatenate([_cards(r, c) for r in rds]) for c in ("power_w", "die_temp_c", "utilization"))
    assert abs(power.mean() - 500.0) < 0.2 and _sd_within(power, 3.0, 0.1)  # watts, absolute
    assert abs(die.mean() - 60.0) < 0.05 and _sd_within(die, 0.5, 0.1)  # kelvin, absolute
    assert _sd_within(util, 0.5 * 0.01, 0.1)  # relative: 1% of 0.5
    loops = [r.loop for rd in rds for r in rd.racks if r.loop is not None]
    sup = np.array([lp.supply_temp_c for lp in loops])
    ret = np.array([lp.return_temp_c for lp in loops])
    assert _sd_within(sup, 0.1, 0.15) and _sd_within(ret - np.tile([41.0, 43.0], 400), 0.1, 0.15)
    # supply and return are two sensors: their noise is independent, so their difference spreads by sqrt(2)
    assert _sd_within(ret - sup - np.tile([9.0, 11.0], 400), math.sqrt(2) * 0.1, 0.15)
    flow0 = np.array([rd.racks[0].loop.flow_lpm for rd in rds if rd.racks[0].loop is not None])
    nominal_lpm = small_site.loop.flow_per_card_lpm * small_site.cards_per_rack
    assert _sd_within(flow0, 0.01 * nominal_lpm, 0.2)  # 1% of the flow
    pdu1 = np.array([rd.racks[1].pdu.power_w for rd in rds if rd.racks[1].pdu is not None])
    assert _sd_within(pdu1, 0.005 * 11_000.0, 0.2)  # 0.5% of the rack's power
    assert all(lp.pump_power_w in (150.0, 77.0) and lp.pump_speed_frac in (1.0, 0.8) for lp in loops)  # no noise
    facs = [rd.facility for rd in rds if rd.facility is not None]
    assert _sd_within(np.array([f.ambient_temp_c for f in facs]), 0.2, 0.2)
    assert _sd_within(np.array([f.facility_supply_temp_c for f in facs]), 0.1, 0.2)
    assert _sd_within(np.array([f.facility_return_temp_c for f in facs]), 0.1, 0.2)
    assert _sd_within(np.array([f.cooling_power_w for f in facs]), 0.01 * COOLING.cooling_power_w, 0.2)
    assert _sd_within(np.array([f.it_power_w for f in facs]), 0.01 * 40_000.0, 0.2)
    assert _sd_within(np.array([f.facility_power_w for f in facs]), 0.01 * COOLING.facility_power_w, 0.2)
    assert {f.supply_setpoint_c for f in facs} == {32.5}  # the set-point in force is known, not measured


def test_readings_stay_in_their_physical_range_under_noise(small_site: SiteSpec) -> None:
    """An idle card reads exactly 0 utilization (the noise is relative), a card at full load at most 1,
    a card drawing ~nothing no negative power."""
    n = small_site.n_cards
    util = np.where(np.arange(n) % 2 == 0, 0.0, 1.0)
    rds = _many(small_site, 50, utilization=util, power_w=np.full(n, 0.5))
    u = np.stack([_cards(r, "utilization") for r in rds])
    assert (u[:, 0::2] == 0.0).all()
    assert (u[:, 1::2] <= 1.0).all() and (u[:, 1::2] < 1.0).any()
    p = np.stack([_cards(r, "power_w") for r in rds])
    assert (p >= 0.0).all() and (p > 0.5).any()


def test_sensors_read_the_true_state_without_changing_or_keeping_it(small_site: SiteSpec) -> None:
    state = _state(small_site)
    state["failed"][1] = True
    state["n_failed"] = 1
    before = {k: v.copy() for k, v in state.items() if isinstance(v, np.ndarray)}
    rd = _sensors(small_site).read(**state)
    for k, v in before.items():
        np.testing.assert_array_equal(state[k], v, err_msg=f"reading changed the true {k}")
    kept = {c: _cards(rd, c).copy() for c in ("power_w", "die_temp_c", "level", "failed", "waking", "power_limit_w")}
    for k in before:  # the plant goes on: its arrays change in place
        state[k][...] = state[k][::-1] if state[k].dtype == bool else state[k] + 1
    for c, v in kept.items():
        np.testing.assert_array_equal(_cards(rd, c), v, err_msg=f"reading's {c} follows the true state")


def test_the_noise_comes_from_the_sensors_own_seeded_stream_fresh_at_each_reading(small_site: SiteSpec) -> None:
    """One seed, one sequence of readings (also under a garbage-readings fault, whose garbage is drawn
    from that stream); two readings of one state differ; another seed gives other readings."""

    def run(seed: int) -> list[np.ndarray]:
        s = _sensors(small_site, seed=seed)
        s.faults.switch(GarbageReadings(rack=1, start_s=0.0, mode="garbage", fraction=0.5), on=True)
        out = []
        for _ in range(3):
            rd = s.read(**_state(small_site))
            assert rd.facility is not None and rd.racks[0].loop is not None
            out.append(np.concatenate([_cards(rd, "power_w"), _cards(rd, "utilization"), [rd.facility.it_power_w]]))
            out.append(np.array([rd.racks[0].loop.supply_temp_c, rd.racks[0].loop.flow_lpm]))
        return out

    a, b, c = run(3), run(3), run(4)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], a[2]) and not np.array_equal(a[1], a[3])  # fresh noise each reading
    assert not np.array_equal(a[0], c[0])
