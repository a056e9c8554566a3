"""Low-power churn of a policy over part of a scenario, in process: the cards its decisions put to sleep
and wake, per site hour, and the commands the service would publish for them.

    python benchmarks/bench_lowpower_churn.py                                # racktwin, day-nominal.toml, 6 site h
    python benchmarks/bench_lowpower_churn.py --duration-s 86400 --json churn.json
    python benchmarks/bench_lowpower_churn.py --tree /tmp/old                # another checkout's packages
    python benchmarks/bench_lowpower_churn.py --control reserve_wake_tie_w=1  # a [control] setting (repeatable)

``--tree DIR`` imports the packages of DIR (a ``git worktree add /tmp/old <commit>`` of an older commit)
in place of this checkout's, so that two commits run side by side (one process each, at the same time);
the scenario file is this checkout's unless ``--scenario`` says otherwise. ``--duration-s`` shortens the
scenario as ``racktwin evaluate --duration`` and ``benchmarks/bench_policy_cpu.py`` do (its workload is
drawn for that duration: 6 site hours of day-nominal are not the first 6 hours of its whole day), so the
facility energy and throughput printed at the end are the ones ``bench_policy_cpu.py`` prints.

It wraps ``agent.loop.apply_to_plant`` (the in-process loop's only way to the plant) and, for each
decision, compares it with the plant's true state just before it is applied:

* cards slept / woken: the cards ``apply_to_plant`` moves into / out of low-power idle (its own
  selection: idle, not failed; counted only when the plant accepted the command);
* swapped: per decision, the smaller of the two (a card slept while another is woken in the same
  decision, on the same rack or another): the churn a plan's per-rack split moving between racks makes;
* low-power commands: one per rack and direction (sleep, wake) with a card in it, as
  ``agent.command_diff.CommandDiff`` groups them for the wire;
* commands: those and the others the service would publish for the same change (DVFS levels: one per
  rack, direction and level; power limits: one per rack and direction among cards moved by more than
  0.5 W; hosts: one per rack and direction; the set-point; each placement; pump speeds that change by
  more than 0.005). Counted from the plant's truth, not from what the racks last reported (the in-process
  loop has no delay and no expired commands), and without the periodic renewal of a slowed pump: an
  estimate of the wire traffic, exact for the low-power part;
* placed cards / asleep: the cards of each placement and those of them in low-power idle when it is
  applied (a job placed there waits the cards' wake latency).

The last line adds the share of host-seconds with the host off (``host_off_frac``, run_policy's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _rack_groups(card_rack: Any, cards: Any, values: Any = None) -> int:
    """Commands for ``cards``: one per rack (and per distinct value of ``values`` in it)."""
    import numpy as np

    if cards.size == 0:
        return 0
    if values is None:
        return int(np.unique(card_rack[cards]).size)
    pairs = np.stack([card_rack[cards], np.asarray(values)[cards]], axis=1)
    return int(np.unique(pairs, axis=0).shape[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "examples" / "day-nominal.toml"), help="run-scenario TOML")
    ap.add_argument("--policy", default="racktwin", help="greedy or racktwin (the policies with decisions)")
    ap.add_argument("--duration-s", type=float, default=21600.0, help="site seconds from the start (default 21600)")
    ap.add_argument("--tree", type=Path, default=REPO, help="the checkout whose packages run (default this one)")
    ap.add_argument("--json", type=Path, help="also write the hourly rows and totals here")
    ap.add_argument(
        "--control", action="append", default=[], metavar="KEY=VALUE", help="a [control] setting (as evaluate)"
    )
    args = ap.parse_args()
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))

    import numpy as np

    import agent.commands.evaluate
    import agent.evaluate
    import agent.loop
    import twin.scenario

    for mod in (agent.commands.evaluate, agent.evaluate, agent.loop, twin.scenario):
        if tree not in Path(str(mod.__file__)).resolve().parents:
            raise SystemExit(f"{mod.__name__} came from {mod.__file__}, not from {tree}")

    scenario = twin.scenario.load_run_scenario(Path(args.scenario), duration_s=args.duration_s)
    site = scenario.site
    card_rack = site.card_rack()
    card_host = site.card_host()
    start_s: list[float] = []
    hours: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    inner = agent.loop.apply_to_plant

    def counted(decision: Any, plant: Any) -> Any:
        truth = plant.truth()
        limit_w = np.asarray(plant._limit, dtype=np.float64).copy()  # no public accessor
        failed = truth.failed | decision.card_failed
        free = np.zeros(plant.n_cards, dtype=bool)
        free[plant.free_cards()] = True
        sleep = np.flatnonzero(decision.card_low_power & ~truth.low_power & ~failed & free)
        wake = np.flatnonzero(~decision.card_low_power & truth.low_power & ~failed)
        rep = inner(decision, plant)
        if not start_s:
            start_s.append(truth.time_s)
        h = hours[int((truth.time_s - start_s[0]) // 3600.0)]
        h["decisions"] += 1
        slept = sleep.size if rep.slept else 0
        woken = wake.size if rep.woken else 0
        h["slept"] += slept
        h["woken"] += woken
        h["swapped"] += min(slept, woken)
        h["decisions_both"] += int(slept > 0 and woken > 0)
        lp_cmds = (_rack_groups(card_rack, sleep) if rep.slept else 0) + (
            _rack_groups(card_rack, wake) if rep.woken else 0
        )
        h["lowpower_cmds"] += lp_cmds
        alive = np.flatnonzero(~failed)
        lv = np.asarray(decision.card_level)
        up = alive[lv[alive] < truth.level[alive]]
        down = alive[lv[alive] > truth.level[alive]]
        lim_w = np.clip(decision.card_power_limit_w, plant.config.min_power_limit_w, site.card.power_limit_w)
        want_w = np.floor(lim_w * 10.0) / 10.0
        moved = np.abs(want_w - limit_w) > 0.5
        other = _rack_groups(card_rack, up, lv) + _rack_groups(card_rack, down, lv)
        other += _rack_groups(card_rack, alive[moved[alive] & (want_w[alive] < limit_w[alive])])
        other += _rack_groups(card_rack, alive[moved[alive] & (want_w[alive] > limit_w[alive])])
        if decision.host_off is not None:
            off_now = truth.host_off[card_host]
            want_off = np.asarray(decision.host_off, dtype=bool)[card_host]
            other += _rack_groups(card_rack, np.flatnonzero(want_off & ~off_now))
            other += _rack_groups(card_rack, np.flatnonzero(~want_off & off_now))
        other += int(rep.setpoint_c is not None) + len(decision.placements)
        if decision.rack_pump_speed_frac is not None:
            other += int((np.abs(decision.rack_pump_speed_frac - truth.rack_pump_speed_frac) > 0.005).sum())
        h["commands"] += lp_cmds + other
        for order in decision.placements:
            placed = np.asarray(order.cards, dtype=np.int64)
            h["placed_cards"] += int(placed.size)
            h["placed_asleep"] += int(truth.low_power[placed].sum())
        return rep

    agent.loop.apply_to_plant = counted
    cpu0 = time.process_time()
    control = agent.commands.evaluate.control_of(args.control)
    m = agent.evaluate.run_policy(scenario, args.policy, control=control).metrics
    cpu_s = time.process_time() - cpu0

    keys = (
        "decisions",
        "slept",
        "woken",
        "swapped",
        "decisions_both",
        "lowpower_cmds",
        "commands",
        "placed_cards",
        "placed_asleep",
    )
    settings = "".join(f", --control {c}" for c in args.control)
    print(f"{args.policy}, {args.duration_s:g} site s of {Path(args.scenario).name}, packages of {tree}{settings}")
    print("| site hour | " + " | ".join(keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    total = {k: sum(hours[i][k] for i in hours) for k in keys}
    for i in sorted(hours):
        print(f"| {i} | " + " | ".join(str(hours[i][k]) for k in keys) + " |")
    print("| all | " + " | ".join(str(total[k]) for k in keys) + " |")
    print(
        f"facility {m['facility_energy_kwh']:.3f} kWh, throughput {m['throughput']:.5f}, "
        f"low-power card frac {m['low_power_card_frac']:.4f}, host off frac {m['host_off_frac']:.4f}, {cpu_s:.0f} CPU s"
    )
    if args.json is not None:
        out = {
            "tree": str(tree),
            "policy": args.policy,
            "control": args.control,
            "duration_s": args.duration_s,
            "hours": {str(i): dict(hours[i]) for i in sorted(hours)},
            "total": total,
            "facility_energy_kwh": m["facility_energy_kwh"],
            "throughput": m["throughput"],
            "low_power_card_frac": m["low_power_card_frac"],
            "host_off_frac": m["host_off_frac"],
            "cpu_s": cpu_s,
        }
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
