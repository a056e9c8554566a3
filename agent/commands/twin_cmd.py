"""``racktwin twin``: what-if runs of the digital twin.

twin steady [--site FILE] [--level N | --clock-mhz MHZ] [--utilization U] [--supply-temp-c C]
            [--ambient-c C] [--json]
    Steady state of the whole site with every card at one level (``twin.steady``): per-rack power
    against its limit, hottest die, coolant temperatures, then IT, cooling and facility power and PUE.

twin sweep-supply [--site FILE] [--from-c C] [--to-c C] [--step-k K] [--ambient-c C]
            [--level N] [--utilization U] [--compute-share SHARE] [--json]
    The supply-temperature trade-off at full load (``twin.sweep``): facility power falls as free
    cooling grows, then rises with leakage; past the throttle onset the site loses speed.

What each exit status means: :data:`EXIT_STATUSES` (``--help`` of ``twin`` and of each action, and the
README's "Exit statuses", give its words).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from agent.commands.common import UserError, load_site_or_fail, path_arg, print_json, sigterm_interrupts
from twin.spec import SiteSpec
from twin.steady import site_steady_state
from twin.sweep import best_point, supply_sweep

#: what each exit status of ``racktwin twin`` (either action) means, as its ``--help`` and the README
#: (Command line) say it
EXIT_STATUSES = (
    "Exit status 0 after the table or the JSON; 2 for a bad option, value or site spec (one line on "
    "stderr); 130 when stopped by Ctrl-C or SIGTERM; 141 when the reader of its output went away before all of it "
    "was written (`| head`)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    epilog = f"{EXIT_STATUSES} docs/twin.md"
    parser.epilog = epilog
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    st = sub.add_parser(
        "steady",
        help="steady state of the site at one DVFS level (what-if)",
        description="Steady state of the site with every card at one DVFS level: card, rack, loop and facility "
        "power, temperatures and PUE (a what-if of the twin, no control).",
        epilog=epilog,
    )
    _common(st)
    which = st.add_mutually_exclusive_group()
    which.add_argument(
        "--level", type=int, default=None, metavar="N", help="DVFS level of every card, 0 = fastest (default 0)"
    )
    which.add_argument(
        "--clock-mhz",
        type=float,
        default=None,
        metavar="MHZ",
        help="clock of every card in MHz, within the card's DVFS table (the nearest level at or above)",
    )
    _utilization(st)
    st.add_argument(
        "--supply-temp-c",
        type=float,
        default=None,
        metavar="C",
        help="rack supply set-point, deg C, 5..60 (default: the spec's)",
    )
    sw = sub.add_parser(
        "sweep-supply",
        help="facility power vs coolant supply temperature at full load",
        description="Facility power, PUE and card throttling over a range of coolant supply temperatures, every "
        "card at one level and utilization (where the set-point that costs least lies).",
        epilog=epilog,
    )
    _common(sw)
    sw.add_argument(
        "--from-c", type=float, default=20.0, metavar="C", help="first supply temperature, deg C, 5..60 (default 20)"
    )
    sw.add_argument(
        "--to-c",
        type=float,
        default=55.0,
        metavar="C",
        help="last supply temperature, deg C, 5..60 (default 55; the sweep ends at the last step at or below it)",
    )
    sw.add_argument(
        "--step-k",
        type=float,
        default=1.0,
        metavar="K",
        help="step between supply temperatures, K, > 0 (default 1; 1,000 steps at most)",
    )
    sw.add_argument(
        "--level", type=int, default=0, metavar="N", help="DVFS level of every card, 0 = fastest (default 0)"
    )
    _utilization(sw)
    sw.add_argument(
        "--compute-share",
        type=float,
        default=0.8,
        metavar="SHARE",
        help="clock-sensitive share of a step, for throughput, 0..1 (default 0.8)",
    )


def _utilization(p: argparse.ArgumentParser) -> None:
    p.add_argument("--utilization", type=float, default=1.0, metavar="U", help="card utilization 0..1 (default 1)")


def _common(p: argparse.ArgumentParser) -> None:
    p.set_defaults(_parser=p)  # agent.cli names "racktwin twin steady" in a UserError's line and unknown options
    p.add_argument(
        "--site",
        default=None,
        type=path_arg,
        metavar="FILE",
        help="site spec TOML (default: examples/supernode-512.toml)",
    )
    p.add_argument(
        "--ambient-c",
        type=float,
        default=None,
        metavar="C",
        help="outdoor (dry-bulb) temperature, deg C, -40..55 (default: the spec's)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: argparse.Namespace, command: str) -> int:
    with sigterm_interrupts():  # as Ctrl-C: exit status 130 with one line, not killed without a word
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    site = load_site_or_fail(args.site)
    _check(args.ambient_c, -40.0, 55.0, "--ambient-c", "deg C")
    _check(args.utilization, 0.0, 1.0, "--utilization", "(a fraction, not percent)")
    if args.action == "steady":
        return _steady(site, args)
    return _sweep(site, args)


def _check(value: float | None, lo: float, hi: float, name: str, unit: str) -> None:
    if value is not None and not (math.isfinite(value) and lo <= value <= hi):
        raise UserError(f"{name} must be within {lo:g}..{hi:g}{' ' + unit if unit else ''}, got {value:g}")


def _level(site: SiteSpec, level: int | None, clock_mhz: float | None) -> int:
    n = site.card.n_levels
    if clock_mhz is not None:
        clocks = site.card.clocks_mhz
        if not (math.isfinite(clock_mhz) and clocks[-1] <= clock_mhz <= clocks[0]):
            raise UserError(f"--clock-mhz must be within {clocks[-1]:g}..{clocks[0]:g} MHz, got {clock_mhz:g}")
        return site.card.level_of_clock(clock_mhz)
    lv = 0 if level is None else level
    if not 0 <= lv < n:
        raise UserError(f"--level must be within 0..{n - 1} for {site.card.model}, got {lv}")
    return lv


def _steady(site: SiteSpec, args: argparse.Namespace) -> int:
    level = _level(site, args.level, args.clock_mhz)
    _check(args.supply_temp_c, 5.0, 60.0, "--supply-temp-c", "deg C")
    ss = site_steady_state(
        site, level=level, utilization=args.utilization, supply_temp_c=args.supply_temp_c, ambient_c=args.ambient_c
    )
    c = ss.cooling
    limit = site.rack.power_limit_w
    names = site.rack_names
    throttled = int(np.count_nonzero(ss.level > level))
    racks: list[dict[str, Any]] = [
        {
            "rack": names[r],
            "power_w": float(ss.rack_power_w[r]),
            "max_die_temp_c": float(ss.rack_max_die_temp_c[r]),
            "return_temp_c": float(ss.rack_return_temp_c[r]),
            "power_limit_w": limit,
            "over_limit": bool(ss.rack_power_w[r] > limit),
        }
        for r in range(site.n_racks)
    ]
    out: dict[str, Any] = {
        "site": site.name,
        "level": level,
        "clock_mhz": site.card.clocks_mhz[level],
        "utilization": args.utilization,
        "supply_temp_c": c.supply_temp_c,
        "ambient_temp_c": c.ambient_temp_c,
        "racks": racks,
        "it_power_w": ss.it_power_w,
        "cooling_power_w": c.cooling_power_w,
        "chiller_power_w": c.chiller_w,
        "facility_power_w": c.facility_power_w,
        "pue": c.pue,
        "pue_target": site.pue_target,
        "free_cooling_fraction": c.free_cooling_fraction,
        "facility_supply_temp_c": c.facility_supply_temp_c,
        "facility_return_temp_c": c.facility_return_temp_c,
        "max_die_temp_c": float(ss.die_temp_c.max()),
        "throttled_cards": throttled,
        "racks_over_limit": sum(1 for r in racks if r["over_limit"]),
    }
    if args.json:
        print_json(out)
        return 0
    print(
        f"{site.name}: {site.n_cards} cards at level {level} ({site.card.clocks_mhz[level]:g} MHz), "
        f"utilization {args.utilization:g}, supply {c.supply_temp_c:g} deg C, ambient {c.ambient_temp_c:g} deg C"
    )
    print(f"{'rack':<6} {'power kW':>9} {'limit kW':>9} {'hottest die C':>14} {'supply C':>9} {'return C':>9}")
    for r in racks:
        flag = "  OVER" if r["over_limit"] else ""
        print(
            f"{r['rack']:<6} {r['power_w'] / 1e3:9.2f} {limit / 1e3:9.1f} {r['max_die_temp_c']:14.1f} "
            f"{c.supply_temp_c:9.1f} {r['return_temp_c']:9.1f}{flag}"
        )
    print(f"IT power        {ss.it_power_w / 1e3:9.1f} kW")
    print(
        f"cooling power   {c.cooling_power_w / 1e3:9.1f} kW  (chiller {c.chiller_w / 1e3:.1f} kW, "
        f"free cooling {100 * c.free_cooling_fraction:.0f}%)"
    )
    print(f"facility power  {c.facility_power_w / 1e3:9.1f} kW")
    print(f"PUE             {c.pue:9.4f}   (target {site.pue_target:g})")
    if throttled:
        print(f"{throttled} cards throttle (slowdown temperature {site.card.slowdown_temp_c:g} deg C or power limit)")
    return 0


#: the most steps ``twin sweep-supply`` takes from --from-c to --to-c
_MAX_SWEEP_STEPS = 1000


def _sweep(site: SiteSpec, args: argparse.Namespace) -> int:
    lo, hi, step = args.from_c, args.to_c, args.step_k
    _check(lo, 5.0, 60.0, "--from-c", "deg C")
    _check(hi, 5.0, 60.0, "--to-c", "deg C")
    if not (math.isfinite(step) and step > 0):
        raise UserError(f"--step-k must be a positive finite number of kelvin, got {step:g}")
    if hi < lo:
        raise UserError(f"--to-c ({hi:g}) must not be below --from-c ({lo:g})")
    if (hi - lo) / step > _MAX_SWEEP_STEPS:
        raise UserError(
            f"--step-k {step:g}: {(hi - lo) / step:,.0f} steps from {lo:g} to {hi:g} deg C, more than "
            f"{_MAX_SWEEP_STEPS:,}: make --step-k larger"
        )
    _check(args.compute_share, 0.0, 1.0, "--compute-share", "")
    level = _level(site, args.level, None)
    temps = [float(x) for x in np.arange(lo, hi + step * 1e-6, step)]
    points = supply_sweep(
        site,
        temps,
        ambient_c=args.ambient_c,
        level=level,
        utilization=args.utilization,
        compute_share=args.compute_share,
    )
    best = best_point(points)
    amb = points[0].ambient_temp_c
    if args.json:
        print_json(
            {
                "site": site.name,
                "ambient_temp_c": amb,
                "level": level,
                "utilization": args.utilization,
                "points": [
                    {
                        "supply_temp_c": p.supply_temp_c,
                        "it_power_w": p.it_power_w,
                        "cooling_power_w": p.cooling_power_w,
                        "chiller_power_w": p.chiller_power_w,
                        "facility_power_w": p.facility_power_w,
                        "pue": p.pue,
                        "free_cooling_fraction": p.free_cooling_fraction,
                        "max_die_temp_c": p.max_die_temp_c,
                        "throttled_cards": p.throttled_cards,
                        "throughput_frac": p.throughput_frac,
                    }
                    for p in points
                ],
                "best_supply_temp_c": best.supply_temp_c if best else None,
                "best_facility_power_w": best.facility_power_w if best else None,
            }
        )
        return 0
    print(
        f"{site.name}: supply temperature sweep at level {level} ({site.card.clocks_mhz[level]:g} MHz), "
        f"utilization {args.utilization:g}, ambient {amb:g} deg C"
    )
    print(
        f"{'supply C':>8} {'IT kW':>8} {'cool kW':>8} {'chill kW':>8} {'fac kW':>8} {'PUE':>7} "
        f"{'free %':>6} {'die C':>6} {'thrott':>6} {'speed':>6}"
    )
    for p in points:
        mark = "  <- best" if best is not None and p is best else ""
        print(
            f"{p.supply_temp_c:8.1f} {p.it_power_w / 1e3:8.1f} {p.cooling_power_w / 1e3:8.2f} "
            f"{p.chiller_power_w / 1e3:8.2f} {p.facility_power_w / 1e3:8.1f} {p.pue:7.4f} "
            f"{100 * p.free_cooling_fraction:6.0f} {p.max_die_temp_c:6.1f} {p.throttled_cards:6d} "
            f"{p.throughput_frac:6.3f}{mark}"
        )
    if best is None:
        print("every point throttles: lower the supply temperature range")
    else:
        print(
            f"least facility power without throttling: {best.facility_power_w / 1e3:.1f} kW at "
            f"{best.supply_temp_c:g} deg C (PUE {best.pue:.4f})"
        )
    return 0
