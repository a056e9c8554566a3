"""Racks whose clocks differ by milliseconds and the agent's estimator. Prints a markdown table.

Every rack of a real site stamps its telemetry with its own clock (NTP keeps them milliseconds apart).
Per site size, the plant of examples/sim-default.toml for some site seconds: each second's telemetry as
the simulator encodes it, stamped by the site's clock (shared) or each rack's clock 0-50 ms ahead
of it (offset), decoded by the agent's codec, taken in by its ingest (one flush a second),
merged into rounds (``agent.round_merger.RoundMerger``) and estimated (``twin.estimate.Estimator``): the
estimator's updates a site second, its time a site second, the racks of a round, and whether the
estimates at the end are the same (to the bit) as the shared clock's.

    python benchmarks/bench_round_merge.py                    # 512, 2,048 and 8,192 cards (~1 minute)
    python benchmarks/bench_round_merge.py --sizes 512 --seconds 60
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import wire
from agent.bus import MqttOptions
from agent.clock import SiteClock
from agent.ingest import Ingest
from agent.round_merger import RoundMerger
from sim.runner import SimOptions, Simulator
from twin.estimate import Estimates, Estimator
from twin.readings import Readings
from twin.scenario import load_run_scenario
from twin.state import TwinState

SCENARIO = Path(__file__).resolve().parents[1] / "examples" / "sim-default.toml"
START_S = 1_800_000_000.0


def run(
    supernodes: int, seconds: int, offsets_s: npt.NDArray[np.float64] | None
) -> tuple[Estimates, int, float, float]:
    """Estimates at the end, estimator updates, estimator seconds, median racks a round."""
    sc = load_run_scenario(SCENARIO, supernodes=supernodes)
    sim = Simulator(SimOptions(scenario=sc, mqtt=MqttOptions(port=1), speed=0.0, start_epoch_s=START_S))
    plant, site = sim.plant, sc.site
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    state = TwinState(site)
    wall = [0.0]
    est = Estimator(site)
    merger = RoundMerger()
    spent = [0.0]
    racks: list[int] = []

    def estimate(rounds: list[Readings]) -> None:
        for r in rounds:
            t0 = time.perf_counter()
            est.update(r, frozen_cards=state.stuck_cards(), frozen_racks=state.stuck_racks())
            spent[0] += time.perf_counter() - t0
            racks.append(len(r.racks))

    ing = Ingest(
        site, state, SiteClock(1.0, infer=False, wall=lambda: wall[0]), on_round=lambda r: estimate(merger.add(r))
    )
    for _ in range(seconds):
        wall[0] = plant.time_s
        rd, ts = plant.readings(), sim.site_time_s
        outs: list[wire.Outgoing] = []
        for rr in rd.racks:
            off = 0.0 if offsets_s is None else float(offsets_s[rr.rack])
            outs += sim.telemetry.readings(Readings(time_s=rd.time_s, racks=(rr,)), ts + off)
        outs += sim.telemetry.readings(Readings(time_s=rd.time_s, racks=(), facility=rd.facility), ts)
        for o in outs:
            msg = codec.decode(o.topic, o.payload)
            if not isinstance(msg, wire.Rejection):
                ing.handle(msg)
        ing.flush()
        plant.step(1.0)
    estimate(merger.drain())
    return est.estimates(), len(racks), spent[0], float(np.median(racks))


def same(a: Estimates, b: Estimates) -> bool:
    names = ("r_ratio", "r_ratio_sd", "idle_scale", "dynamic_scale", "leakage_scale", "rack_flow_deficit")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names) and np.array_equal(
        a.rack_dt_ratio, b.rack_dt_ratio, equal_nan=True
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 2048, 8192], help="cards (multiples of 512)")
    ap.add_argument("--seconds", type=int, default=0, help="site seconds per run (default: 40 at 512, 20 above)")
    args = ap.parse_args()
    print(f"# bench_round_merge ({time.strftime('%Y-%m-%d %H:%M')})\n")
    print(f"{platform.node()} | Python {platform.python_version()} | numpy {np.__version__}\n")
    print(f"command: python benchmarks/bench_round_merge.py {' '.join(sys.argv[1:])}\n")
    print(
        "| cards | racks | clocks | estimator updates / site s | racks / round (median) | estimator ms / site s "
        "| estimates as shared |"
    )
    print("|---:|---:|---|---:|---:|---:|---|")
    for cards in args.sizes:
        sn = cards // 512
        seconds = args.seconds or (40 if cards <= 512 else 20)
        base, n0, s0, k0 = run(sn, seconds, None)
        n_r = 8 * sn
        offsets = np.random.default_rng(1).uniform(0.0, 0.05, n_r)
        est, n1, s1, k1 = run(sn, seconds, offsets)
        print(f"| {cards:,} | {n_r} | shared | {n0 / seconds:.1f} | {k0:.0f} | {1e3 * s0 / seconds:.2f} | - |")
        print(
            f"| {cards:,} | {n_r} | 0-50 ms apart | {n1 / seconds:.1f} | {k1:.0f} | {1e3 * s1 / seconds:.2f} | "
            f"{'yes' if same(est, base) else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
