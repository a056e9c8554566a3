"""Steady state of a whole site: card power with leakage, die temperatures, racks, facility, PUE.

Used by ``racktwin twin steady`` (what-if), by the models to predict a plan's power and
temperatures, and by tests of the energy balance.

At a fixed level, a card's power is linear in its die temperature, ``P = P_r + k (T - T_ref)``,
and its steady die temperature is ``T = T_in + R P``; both hold at once for
``P = (P_r + k (T_in - T_ref)) / (1 - k R)``, solved exactly (``k R`` is ~0.03, far below 1).
The card's own protection (power brake, thermal slowdown, ``PowerModel.protected_level``) may
lower its level: a card runs at the fastest level at or below the commanded one where its
protection, at that level's steady power and die temperature, asks for no slower level (as the
plant's firmware settles it). Power and die temperature fall with the level, so levels fall one at
a time while iterating and that level is reached in at most ``L`` rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from twin.cooling import CoolingPoint, facility_cooling, rack_mass_flow_kg_s, rack_return_temp_c
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.thermal import ThermalParams

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class SiteSteadyState:
    level: IntArray  # level each card runs at after its protection (n_cards,)
    card_power_w: FloatArray
    die_temp_c: FloatArray
    plate_temp_c: FloatArray
    rack_power_w: FloatArray  # cards + host overhead (n_racks,)
    rack_heat_to_coolant_w: FloatArray
    rack_max_die_temp_c: FloatArray
    rack_supply_temp_c: float
    rack_return_temp_c: FloatArray
    cooling: CoolingPoint

    @property
    def it_power_w(self) -> float:
        return float(self.rack_power_w.sum())


def card_steady_power_w(
    model: PowerModel,
    level: IntArray,
    utilization: FloatArray,
    low_power: BoolArray,
    inlet_c: float | FloatArray,
    r_total_k_per_w: float | FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Exact steady (power, die temperature) of cards at fixed levels, including leakage."""
    t_ref = model.reference_temp_c
    p_ref = np.where(low_power, model.low_power_idle_w, model.idle_w[level] + utilization * model.dyn_w[level])
    k = np.where(low_power, model.low_power_leak_w_per_k, model.leak_w_per_k[level])
    power = (p_ref + k * (inlet_c - t_ref)) / (1.0 - k * r_total_k_per_w)
    return power, inlet_c + r_total_k_per_w * power


def site_steady_state(
    site: SiteSpec,
    level: IntArray | int = 0,
    utilization: FloatArray | float = 1.0,
    supply_temp_c: float | None = None,
    ambient_c: float | None = None,
    low_power: BoolArray | None = None,
    thermal: ThermalParams | None = None,
    protection: bool = True,
    flow_fraction: float | FloatArray = 1.0,
    host_off: BoolArray | None = None,
) -> SiteSteadyState:
    """Steady state of every card, rack and the facility.

    ``level`` and ``utilization`` are per card (arrays) or one value for all; ``supply_temp_c``
    and ``ambient_c`` default to the spec's facility values; ``flow_fraction`` is each rack loop's
    flow as a fraction of nominal (its pump's speed; per rack, or one value for all); ``host_off``
    is per host (``site.n_hosts``; only where ``site.hosts_managed``) the hosts powered off: such a
    host draws ``rack.host_off_power_w`` instead of ``rack.host_power_w`` and its cards nothing
    (their dies sit at the supply temperature), as in ``twin.plant``.
    """
    n = site.n_cards
    model = PowerModel.from_card(site.card)
    supply = site.facility.supply_temp_c if supply_temp_c is None else float(supply_temp_c)
    ambient = site.facility.ambient_temp_c if ambient_c is None else float(ambient_c)
    frac = np.broadcast_to(np.asarray(flow_fraction, dtype=np.float64), (site.n_racks,))
    if thermal is None:
        thermal = ThermalParams.from_site(site, site.loop.flow_per_card_lpm * frac[site.card_rack()])
    th = thermal
    lv = np.broadcast_to(np.asarray(level, dtype=np.int64), (n,)).copy()
    if np.any((lv < 0) | (lv >= model.n_levels)):
        raise ValueError(f"level must be within 0..{model.n_levels - 1}")
    u = np.broadcast_to(np.asarray(utilization, dtype=np.float64), (n,))
    lp = np.zeros(n, dtype=bool) if low_power is None else np.asarray(low_power, dtype=bool)
    r_tot = th.r_total_k_per_w

    card_rack = site.card_rack()
    rack_overhead_w = np.full(site.n_racks, site.rack.host_overhead_w)
    unpowered = np.zeros(n, dtype=bool)  # cards of hosts that are off
    if host_off is not None:
        off = np.asarray(host_off, dtype=bool)
        if off.shape != (site.n_hosts,):
            raise ValueError(f"host_off must have one entry per host ({site.n_hosts}), got shape {off.shape}")
        if off.any() and not site.hosts_managed:
            raise ValueError("host_off: the site's hosts cannot be powered off (rack.hosts_per_rack = 0)")
        unpowered = off[site.card_host()]
        rack_overhead_w -= off.reshape(site.n_racks, -1).sum(axis=1) * site.host_saving_w()

    def steady(levels: IntArray) -> tuple[FloatArray, FloatArray]:
        p, d = card_steady_power_w(model, levels, u, lp, supply, r_tot)
        return np.where(unpowered, 0.0, p), np.where(unpowered, supply, d)

    power, die = steady(lv)
    if protection:
        # One level at a time, as long as the firmware, commanded ``lv0``, would slow the card below
        # the level tried, at that level's die temperature. Taking the firmware's answer at a
        # faster level whole overshoots: it is judged at that level's hotter die.
        lv0 = lv.copy()
        for _ in range(model.n_levels):
            slower = (model.protected_level(lv0, u, die) > lv) & ~(lp | unpowered)
            new = np.where(slower, lv + 1, lv)
            if np.array_equal(new, lv):
                break
            lv = new
            power, die = steady(lv)
    plate = supply + th.r_case_coolant_k_per_w * power

    rack_cards_w = np.bincount(card_rack, weights=power, minlength=site.n_racks).astype(np.float64)
    rack_power = rack_cards_w + rack_overhead_w
    # heat into each rack loop: through the cold plates, plus host overhead
    plate_heat = (plate - supply) / th.r_case_coolant_k_per_w
    rack_heat = np.bincount(card_rack, weights=plate_heat, minlength=site.n_racks).astype(np.float64)
    rack_heat += rack_overhead_w
    rack_max_die = np.full(site.n_racks, -np.inf)
    np.maximum.at(rack_max_die, card_rack, die)
    m_dot = rack_mass_flow_kg_s(site, frac)
    ret = rack_return_temp_c(supply, rack_heat, m_dot, site.loop.specific_heat_j_per_kg_k)
    cooling = facility_cooling(
        site, float(rack_power.sum()), supply, ambient, heat_w=float(rack_heat.sum()), flow_fraction=frac
    )
    return SiteSteadyState(
        level=lv,
        card_power_w=power,
        die_temp_c=die,
        plate_temp_c=plate,
        rack_power_w=rack_power,
        rack_heat_to_coolant_w=rack_heat,
        rack_max_die_temp_c=rack_max_die,
        rack_supply_temp_c=supply,
        rack_return_temp_c=ret,
        cooling=cooling,
    )
