"""Rack loops, CDUs and the facility's heat rejection: pumps, dry cooler, trim chiller, PUE.

Heat path (DESIGN.md, "Facility")::

    cards + host --> rack loop (PG25, one per rack, set-point T_s at the rack inlet)
                 --> CDU (approach a_cdu): facility water must arrive at T_fs = T_s - a_cdu
                 --> dry cooler (free cooling) then, if the air is too warm, a trim chiller

* Rack loop: ``Q = m_dot c_p (T_return - T_supply)`` per rack.
* Pumps follow the affinity laws: hydraulic power ``dp * V_dot / eta`` at nominal flow, scaled by
  ``(flow fraction)^3``.
* Dry cooler: at fan speed ``s`` (0..1) it leaves water at
  ``T_amb + approach * (Q / Q_design) / s`` (its approach grows with load and shrinks with
  airflow); fan power ``P_fan_rated * s^3`` with ``P_fan_rated = fan_power_fraction * Q_design``.
  Fans slow down as the water gets warmer, down to a minimum speed.
* When the dry cooler at full speed cannot reach ``T_fs``, the chiller in series removes the rest
  with ``COP = min(COP_max, eta_carnot * T_evap / (T_cond - T_evap))`` (kelvin), where
  ``T_evap = T_fs - evaporator approach`` and ``T_cond = T_amb + condenser approach``: the COP falls
  with lift.
* Other overheads: UPS and distribution losses (a fraction of IT power) and a fixed load.
* ``PUE = facility power / IT power`` where facility power includes IT.

All heat from IT equipment is taken by the liquid loop (cold plates on the cards, the hosts' cold
plates or rear doors for host overhead); the pumps' own heat is neglected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from twin.spec import SiteSpec

FloatArray = npt.NDArray[np.float64]

KELVIN = 273.15
LPM_PER_M3_S = 60_000.0


def lpm_to_m3_s(flow_lpm: float | FloatArray) -> float | FloatArray:
    return flow_lpm / LPM_PER_M3_S


def rack_mass_flow_kg_s(site: SiteSpec, flow_fraction: float | FloatArray = 1.0) -> FloatArray:
    """Coolant mass flow of each rack loop (kg/s), shape (n_racks,)."""
    v = site.loop_flow_per_rack_lpm() / LPM_PER_M3_S
    m = np.asarray(flow_fraction * v * site.loop.density_kg_per_m3, dtype=np.float64)
    # (one value for all: np.full, the same array as broadcasting it, in a third of the time; the
    # facility's cooling asks for it twice per call, at every plant step and plan)
    return np.full(site.n_racks, m) if m.ndim == 0 else np.broadcast_to(m, (site.n_racks,)).copy()


def rack_return_temp_c(
    supply_c: float | FloatArray, heat_w: FloatArray, mass_flow_kg_s: FloatArray, cp_j_per_kg_k: float
) -> FloatArray:
    """Rack loop return temperature from the energy balance ``Q = m c_p dT``."""
    return np.asarray(supply_c + heat_w / (np.maximum(mass_flow_kg_s, 1e-9) * cp_j_per_kg_k), dtype=np.float64)


def rack_pump_power_w(site: SiteSpec, flow_fraction: float | FloatArray = 1.0) -> FloatArray:
    """Pump power of each rack loop (W): ``dp V_dot / eta`` at nominal flow, times fraction^3.

    ``flow_fraction``: one value for all, per rack, or one row of per-rack values per option
    (shape (options, n_racks): then one row of pump powers per option)."""
    v_nom = site.loop_flow_per_rack_lpm() / LPM_PER_M3_S
    p_nom = site.loop.pump_head_kpa * 1e3 * v_nom / site.loop.pump_efficiency
    frac = np.asarray(flow_fraction, dtype=np.float64)
    frac = np.broadcast_to(frac, (*frac.shape[:-1], site.n_racks) if frac.ndim > 1 else (site.n_racks,))
    return np.asarray(p_nom * frac**3, dtype=np.float64)


def facility_pump_power_w(site: SiteSpec, flow_fraction: float | FloatArray = 1.0) -> float:
    """Facility-side pump power (W): its flow is ``facility_flow_ratio`` times the rack loops' total
    (kg/s of water at ~1000 kg/m3), ``dp V_dot / eta`` at nominal flow times (flow / nominal)^3."""
    return _facility_pump_power_w(site, float(np.sum(rack_mass_flow_kg_s(site, flow_fraction))))


def _facility_pump_power_w(site: SiteSpec, rack_mass_flow_sum_kg_s: float) -> float:
    """:func:`facility_pump_power_w` from the racks' total mass flow (``np.sum`` of
    :func:`rack_mass_flow_kg_s` at the flow fraction): callers that have it pass it."""
    cdu = site.cdu
    m_nom = float(rack_mass_flow_kg_s(site).sum())
    if m_nom <= 0:
        return 0.0
    frac = rack_mass_flow_sum_kg_s / m_nom
    v_nom = m_nom * cdu.facility_flow_ratio / 1000.0
    return float(cdu.facility_pump_head_kpa * 1e3 * v_nom / cdu.facility_pump_efficiency * frac**3)


def design_heat_w(site: SiteSpec) -> float:
    """The heat the facility plant is sized for: every rack at its power limit."""
    return float(site.rack.power_limit_w * site.n_racks)


def chiller_cop(site: SiteSpec, facility_supply_c: float, ambient_c: float) -> float:
    fac = site.facility
    t_evap = facility_supply_c - fac.chiller_evaporator_approach_k + KELVIN
    t_cond = ambient_c + fac.chiller_condenser_approach_k + KELVIN
    lift = max(t_cond - t_evap, 1.0)
    return float(min(fac.chiller_max_cop, fac.chiller_carnot_efficiency * t_evap / lift))


@dataclass(frozen=True)
class CoolingPoint:
    """The facility at one operating point (all powers in W)."""

    it_power_w: float
    heat_w: float
    supply_temp_c: float
    facility_supply_temp_c: float
    facility_return_temp_c: float
    ambient_temp_c: float
    rack_pump_w: float
    facility_pump_w: float
    dry_cooler_fan_w: float
    dry_cooler_fan_speed_frac: float
    chiller_w: float
    chiller_heat_w: float
    chiller_cop: float
    ups_loss_w: float
    other_overhead_w: float

    @property
    def cooling_power_w(self) -> float:
        """Power of the cooling plant: pumps, dry cooler fans and chiller."""
        return self.rack_pump_w + self.facility_pump_w + self.dry_cooler_fan_w + self.chiller_w

    @property
    def overhead_power_w(self) -> float:
        return self.cooling_power_w + self.ups_loss_w + self.other_overhead_w

    @property
    def facility_power_w(self) -> float:
        return self.it_power_w + self.overhead_power_w

    @property
    def pue(self) -> float:
        return self.facility_power_w / self.it_power_w if self.it_power_w > 0 else float("inf")

    @property
    def free_cooling_fraction(self) -> float:
        return 1.0 - self.chiller_heat_w / self.heat_w if self.heat_w > 0 else 1.0


def facility_cooling(
    site: SiteSpec,
    it_power_w: float,
    supply_temp_c: float,
    ambient_c: float,
    heat_w: float | None = None,
    flow_fraction: float | FloatArray = 1.0,
) -> CoolingPoint:
    """Cooling plant power for ``heat_w`` (default: all IT power) at a rack supply set-point."""
    q = float(it_power_w if heat_w is None else heat_w)
    fac, cdu = site.facility, site.cdu
    q_design = design_heat_w(site)
    t_fs = supply_temp_c - cdu.approach_k

    m_it_sum = float(rack_mass_flow_kg_s(site, flow_fraction).sum())  # (also the facility pump's flow)
    m_fac = m_it_sum * cdu.facility_flow_ratio
    mcp_fac = max(m_fac * cdu.facility_specific_heat_j_per_kg_k, 1e-9)
    t_fr = t_fs + q / mcp_fac

    fan_rated = fac.dry_cooler_fan_power_fraction * q_design
    itd = t_fs - ambient_c
    load = q / q_design
    needed_speed = fac.dry_cooler_approach_k * load / itd if itd > 0 else np.inf
    if needed_speed <= 1.0:
        speed = max(float(needed_speed), fac.dry_cooler_min_fan_speed_frac) if q > 0 else 0.0
        q_dc, q_ch = q, 0.0
    else:
        # Full fans; water leaves at T_amb + approach * Q_dc/Q_design, so
        # Q_dc = m c_p (T_fr - T_amb - approach Q_dc / Q_design).
        q_dc = mcp_fac * (t_fr - ambient_c) / (1.0 + mcp_fac * fac.dry_cooler_approach_k / q_design)
        q_dc = float(min(max(q_dc, 0.0), q))
        q_ch = q - q_dc
        speed = 1.0 if q_dc > 0 else 0.0
    cop = chiller_cop(site, t_fs, ambient_c)
    chiller_w = q_ch / cop

    fac_pump = _facility_pump_power_w(site, m_it_sum)

    return CoolingPoint(
        it_power_w=float(it_power_w),
        heat_w=q,
        supply_temp_c=float(supply_temp_c),
        facility_supply_temp_c=float(t_fs),
        facility_return_temp_c=float(t_fr),
        ambient_temp_c=float(ambient_c),
        rack_pump_w=float(rack_pump_power_w(site, flow_fraction).sum()),
        facility_pump_w=float(fac_pump),
        dry_cooler_fan_w=float(fan_rated * speed**3),
        dry_cooler_fan_speed_frac=float(speed),
        chiller_w=float(chiller_w),
        chiller_heat_w=float(q_ch),
        chiller_cop=cop,
        ups_loss_w=float(fac.ups_loss_fraction * it_power_w),
        other_overhead_w=float(fac.other_overhead_w),
    )
