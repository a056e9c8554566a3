"""Rack-loop pump speeds: each rack's pump as slow as its plan allows, priced by the twin.

A rack loop's pump power follows the cube of its speed (affinity laws, ``twin.cooling``) and so does
the facility pump's share, while every cold plate's resistance rises as its flow falls (the measured
OCP table, ``twin.thermal.plate_resistance_k_per_w``): a slower pump saves pump power, warms every
die of the rack and adds leakage power. The DVFS plan is made at full speed (so a slow pump never
makes the models slow a job); :func:`choose_pump_speeds` then gives each rack the speed, from
``steps`` options (``control.pump_speed_steps``) between the site's ``min_pump_speed_frac`` and 1,
that minimizes

    b x predicted rack power (jobs in their current phases) + rack pump power + facility pump power

(the facility pump's flow is the racks' total, so its power is the cube of the racks' mean speed,
weighted by their flows: not separable per rack. Each rack is first given its best speed with the
facility pump priced as its own share, nominal / racks x speed^3; then racks are re-chosen one at a
time against the exact facility pump power, the others held, until no rack moves. Each move lowers
the total, so this ends; with a convex facility term it is the usual coordinate descent. It ends
where no single rack's move lowers the total: with each rack's cost convex in its speed, as the
twin's is, that was the brute-force optimum of every small instance tried
(``tests/agent/test_pumps_search.py``); with costs that are not, a move of two racks at once can
do better.)

among the speeds at which, with every busy card *computing* at its planned level (as the guard
judges), the twin predicts

* every die at or under the die limit (slowdown - margin, measured die offsets included),
* the rack's power at or under its cap (leakage rises with temperature),
* the loop's return - supply rise at or under the loop's ``max_delta_t_k``.

Full speed is always allowed. The caller pins racks to full speed (``full_speed_racks``: the
controller pins racks at fail-safe caps, weak pumps and racks where a measured die reached its
limit in the last 10 minutes; the guard enforces the fail-safe rule again, ``agent.guard``). A
card's measured die offset (``agent.offsets``, measured at the flow of now) is scaled to another
speed by the larger of its plate's and its whole path's resistance ratios (:func:`offset_at_speed`):
exact for a fouled plate (the excess is extra plate resistance), an overestimate for extra power (the
excess follows the whole path) when the pump slows, and the whole path's ratio, closer to 1, when it
speeds up. Resistances scale with the spec's ratio: a card's calibrated die-to-inlet resistance at
full speed times ``R_spec(q_s) / R_spec(q_full)``, where ``q_full`` is the flow the rack's pump gives
at full speed now (measured flow / reported speed, so a weak pump counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.load import SiteLoad, card_utilization, power_model, predict_at
from twin.cooling import facility_pump_power_w, rack_mass_flow_kg_s, rack_pump_power_w
from twin.spec import SiteSpec
from twin.thermal import plate_resistance_k_per_w

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "MIN_FLOW_FRAC",
    "PumpChoice",
    "choose_pump_speeds",
    "full_speed_flow_lpm",
    "offset_at_speed",
    "r_at_speed",
    "speed_options",
]


def speed_options(site: SiteSpec, steps: int) -> FloatArray:
    """``steps`` speeds from full speed down to the site's lowest, fastest first."""
    lo = site.min_pump_speed_frac()
    return np.linspace(1.0, lo, max(int(steps), 2)) if lo < 1.0 else np.ones(1)


#: A pump whose full-speed flow is within this fraction of nominal counts as nominal (the flow
#: sensor's noise must not move every prediction, and with it the models' ties, from reading to reading).
FLOW_DEADBAND_FRAC = 0.05


#: The least full-speed flow a rack's pump is taken to give, as a fraction of nominal: a loop that
#: reads 0 L/min (a tripped pump) is planned as this weak (every die prediction then far over its
#: limit: pump at full speed, cards at their slowest levels) rather than divided by zero.
MIN_FLOW_FRAC = 0.01


def full_speed_flow_lpm(site: SiteSpec, flow_lpm: FloatArray, speed_frac: FloatArray) -> FloatArray:
    """Per rack: the loop flow its pump gives at full speed now: measured flow / reported speed; the
    measured flow itself where the speed is unknown or at most 5% (a stalled pump: speeding it up
    may not help); the nominal flow where the flow is unknown (NaN) or within ``FLOW_DEADBAND_FRAC`` of
    nominal; at most the nominal flow (a healthy pump gives no more) and at least ``MIN_FLOW_FRAC`` of
    it. A measured 0 L/min is a failed pump, not an unknown flow."""
    nominal = site.loop_flow_per_rack_lpm()
    flow = np.asarray(flow_lpm, dtype=np.float64)
    speed = np.asarray(speed_frac, dtype=np.float64)
    known = np.isfinite(flow) & (flow >= 0)
    by_speed = known & np.isfinite(speed) & (speed > 0.05)
    full = np.where(by_speed, flow / np.where(by_speed, speed, 1.0), np.where(known, flow, nominal))
    full = np.where(full >= (1.0 - FLOW_DEADBAND_FRAC) * nominal, nominal, np.maximum(full, MIN_FLOW_FRAC * nominal))
    return np.asarray(full, dtype=np.float64)


def _spec_r_plate(site: SiteSpec, flow_per_card_lpm: FloatArray) -> FloatArray:
    cp = site.cold_plate
    return np.asarray(plate_resistance_k_per_w(cp.flow_lpm, cp.r_case_to_coolant_k_per_w, flow_per_card_lpm))


def _spec_r_total(site: SiteSpec, flow_per_card_lpm: FloatArray) -> FloatArray:
    return np.asarray(site.card.r_die_to_case_k_per_w + _spec_r_plate(site, flow_per_card_lpm), dtype=np.float64)


def _rack_flow_per_card_lpm(site: SiteSpec, rack_flow_lpm: FloatArray) -> FloatArray:
    """Per rack: the flow through each of its cold plates (the rack's flow / cards per rack)."""
    return np.asarray(np.asarray(rack_flow_lpm, dtype=np.float64) / site.cards_per_rack, dtype=np.float64)


def offset_at_speed(
    site: SiteSpec,
    die_offset_k: FloatArray,
    rack_flow_full_lpm: FloatArray,
    speed_now_frac: FloatArray,
    speed_frac: FloatArray,
) -> FloatArray:
    """Per card: its die offset (measured with its rack's pump at ``speed_now_frac``) with the pump at
    ``speed_frac``: times the larger of the plate's and the whole path's resistance ratios.

    ``speed_frac`` is per rack, or one row of per-rack speeds per option (shape (options, racks)):
    then one row of per-card offsets per option, each row the same to the bit as a call with that
    row alone (the same elementwise operations)."""
    # every card of a rack has its rack's flow: the ratios are computed once per rack
    q_full = _rack_flow_per_card_lpm(site, rack_flow_full_lpm)
    q_now = q_full * np.clip(np.asarray(speed_now_frac, dtype=np.float64), 0.05, 1.0)
    q = q_full * np.asarray(speed_frac, dtype=np.float64)
    plate_q, plate_now = _spec_r_plate(site, q), _spec_r_plate(site, q_now)
    r_dc = site.card.r_die_to_case_k_per_w
    ratio = np.maximum(plate_q / plate_now, (r_dc + plate_q) / (r_dc + plate_now))
    return np.asarray(np.asarray(die_offset_k, dtype=np.float64) * ratio[..., site.card_rack()], dtype=np.float64)


def r_at_speed(
    site: SiteSpec, r_full_k_per_w: FloatArray, rack_flow_full_lpm: FloatArray, speed_frac: FloatArray
) -> FloatArray:
    """Per card: die-to-inlet resistance with its rack's pump at ``speed_frac`` (per rack), from the
    resistance at full speed scaled by the spec's ratio (module docstring).

    ``speed_frac`` may also be one row of per-rack speeds per option (shape (options, racks)): then
    one row of per-card resistances per option, each the same to the bit as a call with that row."""
    rack = site.card_rack()
    q_full = _rack_flow_per_card_lpm(site, rack_flow_full_lpm)
    q = q_full * np.asarray(speed_frac, dtype=np.float64)
    return np.asarray(
        r_full_k_per_w * _spec_r_total(site, q)[..., rack] / _spec_r_total(site, q_full)[rack], dtype=np.float64
    )


@dataclass(frozen=True)
class PumpChoice:
    """Per rack: the chosen speed, and the predicted facility power saved against full speed (W)."""

    speed_frac: FloatArray
    saved_w: float


def choose_pump_speeds(
    site: SiteSpec,
    load: SiteLoad,
    level: IntArray,
    low_power: BoolArray,
    power_limit_w: FloatArray,
    inlet_c: FloatArray,
    r_full_k_per_w: FloatArray,
    die_offset_k: FloatArray,
    rack_flow_full_lpm: FloatArray,
    rack_speed_now_frac: FloatArray,
    rack_cap_w: FloatArray,
    rack_extra_w: FloatArray,
    die_limit_c: float,
    *,
    facility_w_per_it_w: float,
    steps: int = 9,
    full_speed_racks: BoolArray | None = None,
) -> PumpChoice:
    """The speed of every rack's pump (module docstring); ``full_speed_racks`` are kept at 1.

    ``rack_cap_w``: each rack's usable power (its limit minus the margin); ``rack_extra_w``: rack
    power the card model does not explain (the agent: the measured excess, >= 0; ``racktwin
    optimize``: the hosts its plan powers off, < 0). The extra is part of the predicted rack power
    that is held to ``rack_cap_w`` and the loop's rise, so it must not also be taken off the cap."""
    n_r = site.n_racks
    options = speed_options(site, steps)
    loop = site.loop
    rack_flow_full = np.asarray(rack_flow_full_lpm, dtype=np.float64)
    mcp_full = rack_flow_full / 60_000.0 * loop.density_kg_per_m3 * loop.specific_heat_j_per_kg_k
    fac_nominal = facility_pump_power_w(site)
    # what does not depend on the speed, once (predict's levels and utilizations; the resistances
    # below are per rack, where every card of a rack has the same flow)
    lv = np.clip(np.asarray(level, dtype=np.int64), 0, power_model(site).n_levels - 1)
    lp = np.asarray(low_power, dtype=bool) & ~load.busy
    u_worst = card_utilization(site, load, lv, worst_case=True)
    u_expected = card_utilization(site, load, lv, worst_case=False)
    # every option's resistances and offsets at once (rows: options), the cold plate's curve
    # evaluated twice per call instead of four times per option
    speeds = np.repeat(options[:, None], n_r, axis=1)
    r_opt = r_at_speed(site, r_full_k_per_w, rack_flow_full, speeds)
    off_opt = offset_at_speed(site, die_offset_k, rack_flow_full, rack_speed_now_frac, speeds)
    # and every option's predictions at once (rows: options), each row as a call with that row alone
    worst = predict_at(site, load, lv, lp, u_worst, power_limit_w, inlet_c, r_opt, off_opt, rack_extra_w)
    expected = predict_at(site, load, lv, lp, u_expected, power_limit_w, inlet_c, r_opt, off_opt, rack_extra_w)
    s = options[:, None]
    rise_k = worst.rack_power_w / np.maximum(mcp_full * s, 1e-9)
    ok = (
        (worst.rack_max_die_c <= die_limit_c + 1e-9)
        & (worst.rack_power_w <= rack_cap_w + 1e-6)
        & (rise_k <= loop.max_delta_t_k + 1e-9)
    )
    c = facility_w_per_it_w * expected.rack_power_w + rack_pump_power_w(site, speeds)
    cost = np.where(ok | (s >= 1.0), c, np.inf)
    pinned = np.zeros(n_r, dtype=bool) if full_speed_racks is None else np.asarray(full_speed_racks, dtype=bool)
    # first pass: the facility pump priced per rack as its share of the nominal
    best = np.argmin(cost + fac_nominal / n_r * options[:, None] ** 3, axis=0)
    best = np.where(pinned, 0, best)
    mass = rack_mass_flow_kg_s(site)
    best = _descend_facility_pump(cost, options, best, pinned, mass, fac_nominal)
    speed = options[best]
    full_total = float(np.sum(cost[0])) + fac_nominal
    chosen_total = float(np.sum(cost[best, np.arange(n_r)])) + _facility_w(fac_nominal, mass, speed)
    return PumpChoice(np.asarray(speed, dtype=np.float64), full_total - chosen_total)


def _facility_w(fac_nominal_w: float, mass_kg_s: FloatArray, speed: FloatArray) -> float:
    """Facility pump power with the racks' pumps at ``speed`` (its flow is their total flow)."""
    total = float(np.sum(mass_kg_s))
    return fac_nominal_w * (float(np.dot(mass_kg_s, speed)) / total) ** 3 if total > 0 else 0.0


def _descend_facility_pump(
    cost: FloatArray,
    options: FloatArray,
    best: IntArray,
    pinned: BoolArray,
    mass_kg_s: FloatArray,
    fac_nominal_w: float,
) -> IntArray:
    """Re-choose each rack's option (rows of ``cost``: options, columns: racks; ``inf`` where not
    allowed) against the exact facility pump power, the other racks held, until no rack moves (at
    most ``2 x racks + 1`` sweeps, a bound not reached in practice: random instances of 2-8 racks
    settle within 5)."""
    best = np.asarray(best, dtype=np.int64).copy()
    total = float(np.sum(mass_kg_s))
    if total <= 0 or fac_nominal_w <= 0:
        return best
    flow = float(np.dot(mass_kg_s, options[best]))
    for _sweep in range(2 * cost.shape[1] + 1):
        moved = False
        for r in np.flatnonzero(~pinned):
            rest = flow - mass_kg_s[r] * options[best[r]]
            c = cost[:, r] + fac_nominal_w * ((rest + mass_kg_s[r] * options) / total) ** 3
            k = int(np.argmin(c))
            if c[k] < c[best[r]] - 1e-9:
                best[r] = k
                flow = rest + mass_kg_s[r] * options[k]
                moved = True
        if not moved:
            break
    return best
