"""Speed of the MQTT rack simulator (sim/): publishing, real-time CPU share, and ingest of its stream.

1. publish: one simulator process running as fast as possible (``speed = 0``) against mosquitto on a
   loopback port, no subscriber: messages and card readings it publishes per second, site seconds
   per wall second, CPU share of one core.
2. realtime: the simulator at real time (``speed = 1``), one reading per card per second, for the
   2,048-card site (target: under 50% of one core) and the 8,192-card site; CPU time of the
   simulator process (``time.process_time``, the same as ``getrusage(RUSAGE_SELF)``) and of
   mosquitto (``/proc/PID/stat``) over the run, and how far the loop ever fell behind.
3. ingest: the simulator's own stream (2,048-card telemetry rounds encoded by ``sim.telemetry``,
   captured once) replayed at wire speed by a raw-socket publisher, received in the same run by one
   Python subscriber (``agent.bus.Bus`` + ``agent.wire.Codec.decode``: decode and validate every
   message) and by ``mosquitto_sub`` (the broker's own ceiling).

Run ``python benchmarks/bench_sim.py`` (``--quick`` for a short run, ``--only publish|realtime|ingest``).
It starts its own mosquitto. Prints markdown tables (medians of ``--repeats`` runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent import wire  # noqa: E402
from agent.broker import EmbeddedBroker, find_mosquitto  # noqa: E402
from agent.bus import Bus, Incoming  # noqa: E402
from sim.runner import SimOptions, SimSummary, Simulator  # noqa: E402
from sim.telemetry import TelemetryEncoder  # noqa: E402
from twin.scenario import RunScenario, build_plant, run_scenario_from_dict  # noqa: E402
from twin.tables import read_toml  # noqa: E402

SCENARIO = REPO / "examples" / "sim-2048.toml"


def scenario(supernodes: int, duration_s: float) -> RunScenario:
    """examples/sim-2048.toml (4 supernodes) with ``supernodes`` supernodes of 512 cards."""
    data = read_toml(SCENARIO)
    data["supernodes"] = supernodes
    return run_scenario_from_dict(data, source=str(SCENARIO), base_dir=SCENARIO.parent, duration_s=duration_s)


def _ticks(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; nan when unknown."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _broker_pid(broker: EmbeddedBroker) -> int | None:
    proc = getattr(broker, "_proc", None)  # the child process of the embedded broker (benchmark only)
    return getattr(proc, "pid", None)


async def run_sim(broker: EmbeddedBroker, sc: RunScenario, speed: float) -> tuple[SimSummary, float]:
    """One simulator run; returns its summary and mosquitto's CPU seconds during it."""
    sim = Simulator(SimOptions(scenario=sc, mqtt=broker.options(), speed=speed, site_id="site1"))
    pid = _broker_pid(broker)
    b0 = _ticks(pid)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    summary = await sim.run()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    rusage_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    assert abs(rusage_cpu - summary.cpu_s) < 0.05 + 0.05 * summary.cpu_s, (rusage_cpu, summary.cpu_s)
    return summary, _ticks(pid) - b0


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _span(xs: list[float], fmt: str) -> str:
    return f"{format(_med(xs), fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


# ---- 1. publish -----------------------------------------------------------------------------


def bench_publish(broker: EmbeddedBroker, repeats: int, quick: bool) -> str:
    rows = [
        "| site | site s per run | messages/s | card readings/s | x real time | CPU share (1 = one core) |",
        "|---|---|---|---|---|---|",
    ]
    for supernodes, duration in ((1, 120.0 if quick else 300.0), (4, 30.0 if quick else 90.0)):
        sc = scenario(supernodes, duration)
        rates, cards, speeds, cpus = [], [], [], []
        for _ in range(repeats):
            s, _ = asyncio.run(run_sim(broker, sc, 0.0))
            rates.append(s.messages_published / s.wall_s)
            cards.append(s.card_readings_published / s.wall_s)
            speeds.append(s.speed_achieved)
            cpus.append(s.cpu_share)
        rows.append(
            f"| {sc.site.n_cards:,} cards, {sc.site.n_racks} racks | {duration:g} | {_span(rates, ',.0f')} "
            f"| {_span(cards, ',.0f')} | {_span(speeds, ',.1f')} | {_span(cpus, '.2f')} |"
        )
    return "\n".join(rows)


# ---- 2. real time ---------------------------------------------------------------------------


def bench_realtime(broker: EmbeddedBroker, repeats: int, seconds: float) -> str:
    rows = [
        f"| site (1 reading / card / s) | messages/s | simulator CPU share (median, range of {repeats}) "
        "| mosquitto CPU share | max behind (s) | target |",
        "|---|---|---|---|---|---|",
    ]
    for supernodes in (4, 16):
        sc = scenario(supernodes, seconds)
        cpu, mosq, behind, rate = [], [], [], []
        for _ in range(repeats):
            s, broker_cpu = asyncio.run(run_sim(broker, sc, 1.0))
            cpu.append(s.cpu_share)
            mosq.append(broker_cpu / s.wall_s)
            behind.append(s.max_behind_s)
            rate.append(s.messages_published / s.wall_s)
        target = "< 0.50" if supernodes == 4 else "-"
        ok = " (met)" if supernodes == 4 and _med(cpu) < 0.5 else ""
        rows.append(
            f"| {sc.site.n_cards:,} cards, {sc.site.n_racks} racks, {seconds:g} s | {_med(rate):,.0f} "
            f"| **{_span(cpu, '.3f')}** | {_span(mosq, '.3f')} | {max(behind):.3f} | {target}{ok} |"
        )
    return "\n".join(rows)


# ---- 3. ingest ------------------------------------------------------------------------------

_RAW_PUBLISHER = r"""
import socket, sys, time
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(path, "rb").read()
cid = b"bench-sim-raw"
connect = bytes([0x10, 12 + len(cid), 0, 4]) + b"MQTT" + bytes([4, 0x02, 0, 60, 0, len(cid)]) + cid
s = socket.create_connection((host, port))
s.sendall(connect)
assert s.recv(4)[:1] == b"\x20"
t0 = time.perf_counter()
s.sendall(data)
dt = time.perf_counter() - t0
s.sendall(b"\xe0\x00")
s.close()
print(dt)
"""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def capture_stream(rounds: int) -> list[wire.Outgoing]:
    """``rounds`` telemetry rounds of the 2,048-card site as the simulator encodes them."""
    sc = scenario(4, float(rounds))
    plant = build_plant(sc)
    layout = wire.SiteLayout("site1", tuple(sc.site.rack_names), sc.site.cards_per_rack)
    enc = TelemetryEncoder(wire.Codec(layout), sc.site, wire.Sequencer("sim"))
    out: list[wire.Outgoing] = []
    t0 = 1_800_000_000.0
    for _ in range(rounds):
        out.extend(enc.readings(plant.readings(), t0 + plant.time_s))
        plant.step(1.0)
    return out


def _packets(stream: list[wire.Outgoing]) -> bytes:
    parts = []
    for o in stream:
        topic = o.topic.encode()
        body = len(topic).to_bytes(2, "big") + topic + o.payload
        parts.append(b"\x30" + _varint(len(body)) + body)
    return b"".join(parts)


def _tool(name: str) -> str:
    mosq = find_mosquitto()
    for p in (shutil.which(name), str(Path(mosq).parent / name) if mosq else None, f"/usr/bin/{name}"):
        if p and Path(p).exists():
            return p
    raise SystemExit(f"{name} not found (apt-get install mosquitto-clients)")


async def ingest_once(broker: EmbeddedBroker, packets: Path, n: int, cards_per_msg: float) -> dict[str, float]:
    layout = wire.SiteLayout("site1", tuple(f"r{i}" for i in range(32)), 64, 8)
    codec = wire.Codec(layout)
    received = rejected = 0
    first = last = 0.0
    done = asyncio.Event()

    def handle(m: Incoming) -> None:
        nonlocal received, rejected, first, last
        now = time.perf_counter()
        if received == 0:
            first = now
        last = now
        received += 1
        if isinstance(codec.decode(m.topic, m.payload), wire.Rejection):
            rejected += 1
        if received >= n:
            done.set()

    topic = "racktwin/v1/site1/#"
    stamps = packets.with_name("stamps.txt")  # a file, not a pipe: a full pipe would stall mosquitto_sub
    host = ("-h", broker.host, "-p", str(broker.port))
    sub = subprocess.Popen(
        [_tool("mosquitto_sub"), *host, "-t", topic, "-C", str(n), "-F", "%U", "-W", "120"],
        stdout=stamps.open("wb"),
        stderr=subprocess.DEVNULL,
    )
    bus = Bus(broker.options(max_queued_incoming=n + 10), subscriptions=[(topic, 0)], on_message=handle, name="sub")
    async with bus:
        await bus.wait_connected(10)
        await asyncio.sleep(0.5)  # let mosquitto_sub subscribe
        pub = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _RAW_PUBLISHER, broker.host, str(broker.port), str(packets),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await pub.communicate()
        with contextlib.suppress(TimeoutError):  # QoS 0 may drop for a slow subscriber: report what arrived
            await asyncio.wait_for(done.wait(), 30 + n / 500)
    await asyncio.to_thread(sub.wait)
    ts = [float(x) for x in stamps.read_text().split()]
    pub_s = float(out.decode().strip() or "nan")
    return {
        "pub": n / pub_s,
        "sub_rate": (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 else float("nan"),
        "sub_n": len(ts),
        "py_rate": (received - 1) / (last - first) if received > 1 else float("nan"),
        "py_n": received,
        "rejected": rejected,
        "cards_per_msg": cards_per_msg,
    }


def bench_ingest(broker: EmbeddedBroker, repeats: int, rounds: int) -> str:
    stream = capture_stream(rounds)
    n = len(stream)
    cards = sum(1 for o in stream if o.topic.endswith("/cards")) * 64
    with tempfile.TemporaryDirectory() as d:
        packets = Path(d) / "stream.bin"
        packets.write_bytes(_packets(stream))
        size_mb = packets.stat().st_size / 1e6
        results = [asyncio.run(ingest_once(broker, packets, n, cards / n)) for _ in range(repeats)]
    rows = [
        f"Stream: {rounds} telemetry rounds of the 2,048-card site = {n:,} messages ({cards:,} card readings, "
        f"{size_mb:.1f} MB: per round 32 card batches, 32 CDU, 32 PDU, 1 facility), QoS 0.",
        "",
        "| run | raw publisher msg/s | mosquitto_sub msg/s (received) | Bus + Codec.decode msg/s (received, rejected) "
        "| card readings/s decoded | Python / mosquitto_sub |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        rows.append(
            f"| #{i} | {r['pub']:,.0f} | {r['sub_rate']:,.0f} ({r['sub_n']:,}) | {r['py_rate']:,.0f} "
            f"({r['py_n']:,}, {r['rejected']}) | {r['py_rate'] * r['cards_per_msg']:,.0f} | "
            f"{r['py_rate'] / r['sub_rate']:.2f} |"
        )
    py = _med([r["py_rate"] for r in results])
    sub = _med([r["sub_rate"] for r in results])
    rows.append(
        f"| **median** | {_med([r['pub'] for r in results]):,.0f} | **{sub:,.0f}** | **{py:,.0f}** "
        f"| **{py * results[0]['cards_per_msg']:,.0f}** | **{py / sub:.2f}** |"
    )
    return "\n".join(rows)


# ---- main -----------------------------------------------------------------------------------


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import aiomqtt

    mosq = find_mosquitto()
    mv = "-"
    if mosq:
        r = subprocess.run([mosq, "-h"], capture_output=True, text=True)
        mv = (r.stdout or r.stderr).splitlines()[0] if (r.stdout or r.stderr) else "?"
    return (
        f"{platform.node()} | {cpu} | {os.cpu_count()} CPUs | Python {platform.python_version()} | "
        f"numpy {np.__version__} | msgspec {msgspec.__version__} | aiomqtt {aiomqtt.__version__} | {mv}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", choices=["publish", "realtime", "ingest"], default=None)
    ap.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    ap.add_argument("--repeats", type=int, default=None, help="runs per measurement (default 3; --quick 2)")
    ap.add_argument("--realtime-s", type=float, default=None, help="wall seconds per real-time run (default 30)")
    args = ap.parse_args()
    repeats = args.repeats or (2 if args.quick else 3)
    realtime_s = args.realtime_s or (10.0 if args.quick else 30.0)
    print(f"# bench_sim ({time.strftime('%Y-%m-%d %H:%M')})\n\n{machine()}\n")
    print(f"command: python benchmarks/bench_sim.py {' '.join(sys.argv[1:])}\n")
    with EmbeddedBroker(backend="mosquitto", max_queued_messages=100_000) as broker:
        if args.only in (None, "publish"):
            print("## Publishing as fast as possible (one simulator process, no subscriber)\n")
            print(bench_publish(broker, repeats, args.quick), "\n", flush=True)
        if args.only in (None, "realtime"):
            print("## Real time, one reading per card per second\n")
            print(bench_realtime(broker, repeats, realtime_s), "\n", flush=True)
    if args.only in (None, "ingest"):  # a fresh broker: no retained applied states of the runs above
        with EmbeddedBroker(backend="mosquitto", max_queued_messages=100_000) as broker:
            print("## Ingest of the simulator's stream: one Python subscriber beside mosquitto_sub\n")
            print(bench_ingest(broker, repeats, 100 if args.quick else 300), flush=True)


if __name__ == "__main__":
    main()
