"""How many applied states a normal closed-loop run refuses as older than the one taken (what
``racktwin_applied_states_old_total{rack}`` and ``racktwin_applied_states_old_dropped_total{rack}`` export,
and alert ``RacktwinAppliedStatesOutOfOrder`` fires on): the demo's run through MQTT (embedded mosquitto, the
simulator in a child process, the agent in enforce mode in this process), one publisher per rack.

    python benchmarks/bench_applied_old.py                    # examples/day-demo.toml, 15 site minutes at 30x
    python benchmarks/bench_applied_old.py --minutes 75 --speed 30 --scenario examples/day-demo.toml

Prints the agent's applied states taken, those refused as older and dropped, per rack, and the cards whose
confirmed setting was disproved (``racktwin_applied_state_disproved_total``) as the service's ingest counted
them at the end of the run, with the agent's log line for each count (its rack, setting, cards and the
stamp by which no applied state explained it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's packages, not an installed racktwin's


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default=str(REPO / "examples" / "day-demo.toml"))
    parser.add_argument("--minutes", type=float, default=15.0, help="site minutes (default 15)")
    parser.add_argument("--speed", type=float, default=30.0, help="site seconds per wall second (default 30)")
    args = parser.parse_args()

    from agent.broker import EmbeddedBroker
    from agent.commands import demo
    from twin.scenario import load_run_scenario

    path = Path(args.scenario)
    scenario = load_run_scenario(path, duration_s=args.minutes * 60.0)
    services: list[Any] = []
    make = demo._agent_service

    def kept(*a: Any, **kw: Any) -> Any:  # the run's service, to read its ingest's counts after the run
        services.append(make(*a, **kw))
        return services[-1]

    demo._agent_service = kept
    counted: list[str] = []  # the ingest's warning for each disproval it counts (agent.applied_states)

    class Counted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "was disproved" in record.getMessage():
                counted.append(record.getMessage())

    logging.getLogger("racktwin.agent.ingest").addHandler(Counted(logging.WARNING))
    broker = EmbeddedBroker().start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            t0 = time.perf_counter()
            res = asyncio.run(demo.run_closed_loop(path, scenario, broker.url, Path(folder), speed=args.speed))
            wall_s = time.perf_counter() - t0
    finally:
        broker.stop()
    stats = services[0].ingest.stats
    racks = services[0].site.rack_names
    print(
        f"{path.name}: {res.metrics['duration_s'] / 60:.1f} site minutes at {args.speed:g}x in {wall_s:.0f} s wall "
        f"({res.stopped_by}, agent error: {res.agent_error or 'none'}), {res.decisions} decisions, "
        f"commands applied {res.sim_summary.get('commands_applied', '-')}"
    )
    print(f"applied states taken in: {stats.by_kind.get('applied', 0)}")
    print("| rack | refused as older | dropped |")
    print("|---|---:|---:|")
    for rack in racks:
        print(f"| {rack} | {stats.applied_states_old.get(rack, 0)} | {stats.applied_states_old_dropped.get(rack, 0)} |")
    print(f"cards disproved (setting, rack): {stats.applied_disproved or 'none'}")
    for line in counted:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
