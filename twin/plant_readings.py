"""The plant's sensors: the noisy telemetry ``Plant.readings()`` gives of the plant's true state.

``twin.plant.Plant`` holds one :class:`PlantSensors` and hands it its true state at each reading;
this module owns what sensors add to that state:

- **noise** (``PlantConfig.noise``, a ``SensorNoise``): Gaussian, drawn from the sensors' own random
  stream (seeded from ``PlantConfig.seed``), so how often readings are taken does not change the
  physics; card power, die temperature and utilization per card, coolant temperatures, flow and PDU
  power per rack, the facility's temperatures and powers;
- **what a card in a state reads**: a sleeping or failed card reads no clock, a failed card no power
  or utilization, a card of an off host no power;
- **sensor faults** (``twin.sensor_faults.SensorFaults``, switched on and off by the plant's
  timeline): dropped racks publish nothing, stuck racks and cards repeat old values, garbage
  readings replace some.
"""

from __future__ import annotations

import numpy as np

from twin.cooling import CoolingPoint
from twin.plant_types import BoolArray, FloatArray, IntArray, PlantConfig
from twin.readings import CardBatch, FacilityReading, JobReading, LoopReading, PduReading, RackReading, Readings
from twin.sensor_faults import SensorFaults
from twin.spec import SiteSpec

__all__ = ["PlantSensors"]


class PlantSensors:
    """The sensors of a site: their noise, their random stream and the sensor faults in force."""

    def __init__(self, site: SiteSpec, config: PlantConfig, clocks_mhz: FloatArray) -> None:
        self._site = site
        self._config = config
        self._clocks = clocks_mhz
        self._n, self._n_racks, self._cpr = site.n_cards, site.n_racks, site.cards_per_rack
        self._card_index = np.arange(self._n, dtype=np.int64)
        self._rng = np.random.default_rng([config.seed, 2])
        self.faults = SensorFaults(self._n_racks)

    def read(
        self,
        *,
        time_s: float,
        power_w: FloatArray,
        die_temp_c: FloatArray,
        utilization: FloatArray,
        effective_level: IntArray,
        level: IntArray,
        low_power: BoolArray,
        waking: BoolArray,
        power_limit_w: FloatArray,
        failed: BoolArray,
        card_host_off: BoolArray,
        n_low: int,
        n_failed: int,
        n_hosts_off: int,
        supply_c: float,
        rack_return_c: FloatArray,
        flow_frac: FloatArray,
        rack_power_w: FloatArray,
        rack_pump_w: FloatArray,
        pump_speed_frac: FloatArray,
        cooling: CoolingPoint,
        ambient_c: float,
        setpoint_c: float,
        jobs: tuple[JobReading, ...],
    ) -> Readings:
        """Noisy telemetry of the plant's true state at ``time_s``, with sensor faults applied.

        Per card (site order): ``power_w``, ``die_temp_c``, ``utilization``, the ``effective_level``
        its clock runs at and the commanded ``level``, ``low_power``, ``waking``, ``power_limit_w``,
        ``failed``, ``card_host_off`` (its host is off); ``n_low``, ``n_failed``, ``n_hosts_off``:
        how many cards are asleep, cards have failed, hosts are off. Per rack: ``rack_return_c``,
        ``flow_frac`` (of nominal flow), ``rack_power_w``, ``rack_pump_w``, ``pump_speed_frac``;
        ``supply_c`` the loops' supply temperature. Facility: ``cooling``, ``ambient_c``,
        ``setpoint_c``. ``jobs``: the jobs' readings. The arrays are read, not kept."""
        t = time_s
        nz = self._config.noise
        n, n_r, cpr = self._n, self._n_racks, self._cpr
        rng = self._rng
        z = rng.standard_normal((3, n))
        power = np.maximum(power_w + nz.power_sd_w * z[0], 0.0)  # (a card just powered has no power yet)
        die = die_temp_c + nz.die_temp_sd_k * z[1]
        util = np.clip(utilization * (1.0 + nz.utilization_sd * z[2]), 0.0, 1.0)
        clock = self._clocks[effective_level]
        if n_low or n_failed:
            off = low_power | failed
            clock = np.where(off, 0.0, clock)
            if n_failed:
                power = np.where(failed, 0.0, power)
                util = np.where(failed, 0.0, util)
        if n_hosts_off:
            power = np.where(card_host_off, 0.0, power)
        level = level.copy()
        low = low_power.copy()
        waking = waking.copy()
        limit = power_limit_w.copy()
        failed = failed.copy()
        host_off = card_host_off.copy()
        zr = rng.standard_normal((4, n_r))
        sup = (supply_c + nz.coolant_temp_sd_k * zr[0]).tolist()
        ret = (rack_return_c + nz.coolant_temp_sd_k * zr[1]).tolist()
        flow_true = self._site.loop_flow_per_rack_lpm() * flow_frac
        flow = (flow_true * (1.0 + nz.flow_sd_frac * zr[2])).tolist()
        pdu = (rack_power_w * (1.0 + nz.pdu_power_sd_frac * zr[3])).tolist()
        pump = rack_pump_w.tolist()
        speed = pump_speed_frac.tolist()
        faults = self.faults
        faults.freeze_stuck_cards(power, die, util, clock)
        racks: list[RackReading] = []
        idx = self._card_index
        for r in range(n_r):
            if faults.dropped(r):
                continue
            frozen = faults.frozen_rack(r, t)
            if frozen is not None:
                racks.append(frozen)
                continue
            sl = slice(r * cpr, (r + 1) * cpr)
            batch = CardBatch(
                card_index=idx[sl],
                power_w=power[sl],
                die_temp_c=die[sl],
                clock_mhz=clock[sl],
                utilization=util[sl],
                level=level[sl],
                low_power=low[sl],
                waking=waking[sl],
                power_limit_w=limit[sl],
                failed=failed[sl],
                host_off=host_off[sl],
            )
            loop = LoopReading(sup[r], ret[r], flow[r], pump[r], pump_speed_frac=speed[r])
            batch, loop = faults.garble(r, batch, loop, rng)
            rr = RackReading(rack=r, time_s=t, cards=batch, loop=loop, pdu=PduReading(power_w=pdu[r]))
            faults.seen(rr)
            racks.append(rr)
        cp = cooling
        zf = rng.standard_normal(6)
        ff = nz.facility_sd_frac
        facility = FacilityReading(
            time_s=t,
            ambient_temp_c=float(ambient_c + nz.ambient_sd_k * zf[0]),
            facility_supply_temp_c=float(cp.facility_supply_temp_c + nz.coolant_temp_sd_k * zf[1]),
            facility_return_temp_c=float(cp.facility_return_temp_c + nz.coolant_temp_sd_k * zf[2]),
            cooling_power_w=float(cp.cooling_power_w * (1.0 + ff * zf[3])),
            it_power_w=float(cp.it_power_w * (1.0 + ff * zf[4])),
            facility_power_w=float(cp.facility_power_w * (1.0 + ff * zf[5])),
            supply_setpoint_c=setpoint_c,
        )
        return Readings(time_s=t, racks=tuple(racks), facility=facility, jobs=jobs)
