"""Benchmarks of the MQTT protocol (agent/wire/) and client (agent/bus.py). Prints markdown tables.

1. decode + validate of one 64-card telemetry message: racktwin's columnar schema (what Codec.decode
   does: topic, size, msgspec typed decode with range checks, cross-field checks, conversion to numpy),
   the per-card-object alternative it was chosen over, and raw JSON parsers (msgspec untyped, orjson,
   json) on the same payloads. Per message and per card reading; medians of several repeats.
2. loopback throughput through a real mosquitto (started here): publish rates of one agent.bus.Bus
   (aiomqtt) against mosquitto_pub --repeat; ingest of one stream by a Bus subscriber that decodes and
   validates every message, beside mosquitto_sub receiving the same stream in the same run.

    python benchmarks/bench_wire.py                 # everything (~1-2 minutes on 2 cores)
    python benchmarks/bench_wire.py --only decode   # part 1 only (no broker needed)
    python benchmarks/bench_wire.py --quick         # fewer messages and repeats
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import wire
from agent.broker import EmbeddedBroker, find_mosquitto
from agent.bus import Bus, Incoming
from agent.wire import Codec, Rejection, SiteLayout
from agent.wire.schemas import _CardsW

try:
    import orjson
except ImportError:  # pragma: no cover - optional
    orjson = None  # type: ignore[assignment]

N_CARDS = 64
LAYOUT = SiteLayout("site1", tuple(f"r{i}" for i in range(8)), cards_per_rack=N_CARDS, n_levels=8)
TOPIC = "racktwin/v1/site1/rack/r0/cards"


# ---- the per-card-object alternative (not used by racktwin; here to compare) ---------------------

_P = Annotated[float, Meta(ge=0.0, le=5000.0)]
_T = Annotated[float, Meta(ge=-50.0, le=200.0)]
_U = Annotated[float, Meta(ge=0.0, le=100.0)]
_C = Annotated[float, Meta(ge=0.0, le=10000.0)]
_I = Annotated[int, Meta(ge=0, le=4095)]


class _CardRow(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    card_index: _I
    power_watts: _P
    temperature_celsius: _T
    sm_clock_mhz: _C
    utilization_percent: _U
    power_limit_watts: _P
    low_power: bool


class _CardsRows(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    schema: Literal["racktwin.cards/1"]
    ts: Annotated[float, Meta(ge=0.0, le=1e11)]
    seq: Annotated[int, Meta(ge=0, le=2**63 - 1)]
    publisher: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")]
    cards: Annotated[list[_CardRow], Meta(max_length=4096)]


_rows_decoder = msgspec.json.Decoder(_CardsRows)


def decode_rows(payload: bytes) -> wire.CardBatch | None:
    """Per-card objects: the same checks and the same numpy result as Codec.decode (None = rejected)."""
    try:
        m = _rows_decoder.decode(payload)
    except msgspec.DecodeError:
        return None
    cards = m.cards
    idx = [c.card_index for c in cards]
    if idx and (max(idx) >= N_CARDS or len(set(idx)) != len(idx)):
        return None
    block = np.array(
        [
            (c.power_watts, c.temperature_celsius, c.sm_clock_mhz, c.utilization_percent, c.power_limit_watts)
            for c in cards
        ],
        dtype=np.float64,
    ).T.copy()
    block[3] /= 100.0
    return wire.CardBatch(
        "r0",
        np.array(idx, dtype=np.int64),
        block[0],
        block[1],
        block[2],
        block[3],
        block[4],
        np.array([c.low_power for c in cards], dtype=np.bool_),
        m.ts,
        m.seq,
        m.publisher,
    )


def sample_batch(seq: int = 0) -> wire.CardBatch:
    rng = np.random.default_rng(seq)
    n = N_CARDS
    return wire.CardBatch(
        rack="r0",
        card_index=np.arange(n, dtype=np.int64),
        power_w=np.round(rng.uniform(80.0, 700.0, n), 1),
        temp_c=np.round(rng.uniform(30.0, 85.0, n), 2),
        sm_clock_mhz=rng.choice([1980.0, 1870.0, 1760.0, 1210.0], n),
        utilization=np.round(rng.uniform(0.0, 1.0, n), 3),
        power_limit_w=np.full(n, 700.0),
        low_power=rng.uniform(size=n) < 0.05,
        ts_s=1_790_000_000.0 + seq * 0.5,
        seq=seq,
        publisher="sim-r0",
    )


def rows_payload(b: wire.CardBatch) -> bytes:
    body = {
        "schema": "racktwin.cards/1",
        "ts": b.ts_s,
        "seq": b.seq,
        "publisher": b.publisher,
        "cards": [
            {
                "card_index": int(b.card_index[i]),
                "power_watts": float(b.power_w[i]),
                "temperature_celsius": float(b.temp_c[i]),
                "sm_clock_mhz": float(b.sm_clock_mhz[i]),
                "utilization_percent": float(b.utilization[i] * 100.0),
                "power_limit_watts": float(b.power_limit_w[i]),
                "low_power": bool(b.low_power[i]),
            }
            for i in range(len(b.card_index))
        ],
    }
    return msgspec.json.encode(body)


# ---- part 1: decode + validate ----------------------------------------------------------------


def per_call_us(fn: Callable[[], Any], repeats: int, budget_s: float = 0.25) -> list[float]:
    """Per-call time (us) of ``repeats`` timing runs, each long enough to be measured well."""
    n = 1
    while True:
        t = timeit.timeit(fn, number=n)
        if t > budget_s / 5 or n > 1_000_000:
            break
        n *= 4
    n = max(1, int(n * (budget_s / max(t, 1e-9))))
    return [timeit.timeit(fn, number=n) / n * 1e6 for _ in range(repeats)]


def bench_decode(repeats: int) -> str:
    codec = Codec(LAYOUT)
    batch = sample_batch(1)
    col = wire.encode(batch)
    rows = rows_payload(batch)
    assert wire.approx_equal(codec.decode(TOPIC, col), batch)
    assert wire.approx_equal(decode_rows(rows), batch)
    col_typed = msgspec.json.Decoder(_CardsW)
    raw = msgspec.json.Decoder()
    bad = col.replace(b'"power_watts":[', b'"power_watts":[-1.0,', 1)
    cases: list[tuple[str, str, int, Callable[[], Any]]] = [
        (
            "racktwin columnar: Codec.decode (parse+validate+numpy)",
            "columnar",
            len(col),
            lambda: codec.decode(TOPIC, col),
        ),
        ("  of which msgspec typed decode with range checks", "columnar", len(col), lambda: col_typed.decode(col)),
        ("per-card objects: typed decode+validate+numpy", "rows", len(rows), lambda: decode_rows(rows)),
        ("  of which msgspec typed decode with range checks", "rows", len(rows), lambda: _rows_decoder.decode(rows)),
        ("msgspec untyped decode (no validation)", "columnar", len(col), lambda: raw.decode(col)),
        ("msgspec untyped decode (no validation)", "rows", len(rows), lambda: raw.decode(rows)),
    ]
    if orjson is not None:
        cases += [
            ("orjson.loads (no validation)", "columnar", len(col), lambda: orjson.loads(col)),
            ("orjson.loads (no validation)", "rows", len(rows), lambda: orjson.loads(rows)),
        ]
    cases += [
        ("json.loads, stdlib (no validation)", "columnar", len(col), lambda: json.loads(col)),
        ("racktwin: rejection of a bad value (counted)", "columnar", len(bad), lambda: codec.decode(TOPIC, bad)),
        ("racktwin: encode_card_batch", "columnar", len(col), lambda: wire.encode(batch)),
    ]
    import logging

    logging.getLogger("racktwin.wire").setLevel(logging.ERROR)  # the rejection case logs (rate-limited)
    ref = statistics.median(per_call_us(lambda: raw.decode(col), repeats))
    lines = [
        f"| what ({N_CARDS}-card message) | layout | bytes | us / message (median of {repeats}) "
        "| us / card reading | vs msgspec untyped, columnar |",
        "|---|---|---|---|---|---|",
    ]
    for name, layout, size, fn in cases:
        times = per_call_us(fn, repeats)
        med = statistics.median(times)
        lines.append(
            f"| {name} | {layout} | {size:,} | {med:.1f} ({min(times):.1f}-{max(times):.1f}) "
            f"| {med / N_CARDS:.3f} | {med / ref:.2f}x |"
        )
    return "\n".join(lines)


# ---- part 2: through mosquitto ----------------------------------------------------------------


def _tool(name: str) -> str:
    mosq = find_mosquitto()
    found = shutil.which(name) or (str(Path(mosq).parent / name) if mosq else None)
    for p in (found, f"/usr/bin/{name}"):
        if p and Path(p).exists():
            return p
    raise SystemExit(f"{name} not found (apt-get install mosquitto-clients)")


async def bus_publish_rate(broker: EmbeddedBroker, payloads: list[bytes], qos: int, window: int) -> float:
    """Messages/s one Bus publishes (``window`` publishes in flight; 1 = await each)."""
    opts = broker.options(max_inflight=max(20, window))
    async with Bus(opts, name="bench-pub") as bus:
        await bus.wait_connected(10)
        t0 = time.perf_counter()
        if window == 1:
            for p in payloads:
                await bus.publish(TOPIC, p, qos=qos)
        else:
            for i in range(0, len(payloads), window):
                await asyncio.gather(*(bus.publish(TOPIC, p, qos=qos) for p in payloads[i : i + window]))
        dt = time.perf_counter() - t0
    return len(payloads) / dt


async def bus_encode_publish_rate(broker: EmbeddedBroker, batches: list[wire.CardBatch]) -> float:
    codec = Codec(LAYOUT)
    async with Bus(broker.options(), name="bench-pub") as bus:
        await bus.wait_connected(10)
        t0 = time.perf_counter()
        for b in batches:
            await bus.send(codec.outgoing(b))
        dt = time.perf_counter() - t0
    return len(batches) / dt


def mosquitto_pub_rate(broker: EmbeddedBroker, payload_file: Path, n: int, qos: int) -> float:
    cmd = [_tool("mosquitto_pub"), "-h", broker.host, "-p", str(broker.port), "-t", TOPIC, "-q", str(qos)]
    cmd += ["-f", str(payload_file), "--repeat", str(n), "--repeat-delay", "0"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return n / (time.perf_counter() - t0)


async def ingest_side_by_side(
    broker: EmbeddedBroker, payload_file: Path, n: int, mode: str
) -> tuple[float, int, float, int, int]:
    """One stream of ``n`` messages (mosquitto_pub --repeat, QoS 0) to mosquitto_sub and a Bus subscriber
    that decodes + validates each. Returns (sub rate, sub received, bus rate, bus received, rejected)."""
    codec = Codec(LAYOUT)
    received = 0
    rejected = 0
    first = last = 0.0
    done = asyncio.Event()

    def handle(m: Incoming) -> None:
        nonlocal received, rejected, first, last
        now = time.perf_counter()
        if received == 0:
            first = now
        last = now
        received += 1
        if isinstance(codec.decode(m.topic, m.payload), Rejection):
            rejected += 1
        if received >= n:
            done.set()

    sub_cmd = [_tool("mosquitto_sub"), "-h", broker.host, "-p", str(broker.port), "-t", TOPIC, "-C", str(n)]
    sub_cmd += ["-F", "%U", "-W", "120"]
    stamps_file = payload_file.with_name("stamps.txt")  # a file, not a pipe: a full pipe would stall mosquitto_sub
    sub = subprocess.Popen(sub_cmd, stdout=stamps_file.open("wb"), stderr=subprocess.DEVNULL)
    bus = Bus(
        broker.options(max_queued_incoming=n + 10),
        subscriptions=[(TOPIC, 0)],
        on_message=handle if mode == "on_message" else None,
        name="bench-sub",
    )
    async with bus:
        await bus.wait_connected(10)

        async def consume() -> None:
            async for m in bus.messages():
                handle(m)
                if done.is_set():
                    return

        consumer = asyncio.create_task(consume()) if mode == "messages" else None
        await asyncio.sleep(0.5)  # let mosquitto_sub subscribe
        pub = await asyncio.create_subprocess_exec(
            _tool("mosquitto_pub"),
            *("-h", broker.host, "-p", str(broker.port), "-t", TOPIC, "-q", "0", "-f", str(payload_file)),
            *("--repeat", str(n), "--repeat-delay", "0"),
        )
        await pub.wait()
        with contextlib.suppress(TimeoutError):  # QoS 0 may drop for a slow subscriber: report what arrived
            await asyncio.wait_for(done.wait(), 60 + n / 500)
        if consumer is not None:
            consumer.cancel()
    await asyncio.to_thread(sub.wait)
    stamps = [float(x) for x in stamps_file.read_text().split()]
    sub_rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
    bus_rate = (received - 1) / (last - first) if received > 1 else float("nan")
    return sub_rate, len(stamps), bus_rate, received, rejected


async def drain_side_by_side(
    broker: EmbeddedBroker, payload_file: Path, n: int, run: int, client: str = "bus"
) -> tuple[float, int, float, int, int]:
    """The ingest ceiling: both subscribers hold persistent sessions (QoS 1), go offline, the broker
    queues ``n`` messages for each, then both reconnect at once and drain their backlog as fast as they
    can. Returns (mosquitto_sub rate, received, Bus rate, received, rejected)."""
    codec = Codec(LAYOUT)
    sub_id, bus_id = f"bench-sub-{client}-{run}", f"bench-bus-{client}-{run}"
    host = ("-h", broker.host, "-p", str(broker.port))
    subprocess.run([_tool("mosquitto_sub"), *host, "-c", "-i", sub_id, "-q", "1", "-t", TOPIC, "-E"], check=True)
    opts = broker.options(client_id=bus_id, clean_session=False, max_queued_incoming=n + 10)
    async with Bus(opts, subscriptions=[(TOPIC, 1)]) as bus:
        await bus.wait_connected(10)
    pub = [_tool("mosquitto_pub"), *host, "-t", TOPIC, "-q", "1", "-f", str(payload_file)]
    subprocess.run([*pub, "--repeat", str(n), "--repeat-delay", "0"], check=True)

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
        if isinstance(codec.decode(m.topic, m.payload), Rejection):
            rejected += 1
        if received >= n:
            done.set()

    sub_cmd = [_tool("mosquitto_sub"), *host, "-c", "-i", sub_id, "-q", "1", "-t", TOPIC, "-C", str(n)]
    stamps_file = payload_file.with_name("stamps.txt")  # a file, not a pipe: a full pipe would stall mosquitto_sub
    sub = subprocess.Popen(
        [*sub_cmd, "-F", "%U", "-W", "300"], stdout=stamps_file.open("wb"), stderr=subprocess.DEVNULL
    )
    if client == "bus":
        async with Bus(opts, subscriptions=[(TOPIC, 1)], on_message=handle):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 60 + n / 200)
    else:  # aiomqtt's own message iterator, for comparison (agent.bus forwards messages without it)
        import aiomqtt

        async with aiomqtt.Client(broker.host, broker.port, identifier=bus_id, clean_session=False) as c:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(60 + n / 200):
                    async for m in c.messages:
                        handle(Incoming(m.topic.value, m.payload, bool(m.retain), int(m.qos)))  # type: ignore[arg-type]
                        if done.is_set():
                            break
    await asyncio.to_thread(sub.wait)
    stamps = [float(x) for x in stamps_file.read_text().split()]
    sub_rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
    bus_rate = (received - 1) / (last - first) if received > 1 else float("nan")
    return sub_rate, len(stamps), bus_rate, received, rejected


def bench_broker(n: int, repeats: int) -> str:
    batches = [sample_batch(i) for i in range(64)]
    payloads = [wire.encode(batches[i % 64]) for i in range(n)]
    lines: list[str] = []
    with (
        EmbeddedBroker(backend="mosquitto", max_queued_messages=max(100_000, 2 * n)) as broker,
        tempfile.TemporaryDirectory() as d,
    ):
        payload_file = Path(d) / "cards.json"
        payload_file.write_bytes(payloads[0])
        size = len(payloads[0])
        rows: list[tuple[str, list[float]]] = []
        for label, fn in [
            ("Bus.publish, QoS 0, awaiting each", lambda: asyncio.run(bus_publish_rate(broker, payloads, 0, 1))),
            ("Bus.publish, QoS 0, 256 in flight", lambda: asyncio.run(bus_publish_rate(broker, payloads, 0, 256))),
            ("Bus.publish, QoS 1, awaiting each", lambda: asyncio.run(bus_publish_rate(broker, payloads, 1, 1))),
            ("Bus.publish, QoS 1, 256 in flight", lambda: asyncio.run(bus_publish_rate(broker, payloads, 1, 256))),
            (
                "encode_card_batch + Bus.send (QoS 0), awaiting each",
                lambda: asyncio.run(bus_encode_publish_rate(broker, [batches[i % 64] for i in range(n)])),
            ),
            ("mosquitto_pub --repeat, QoS 0", lambda: mosquitto_pub_rate(broker, payload_file, n, 0)),
            ("mosquitto_pub --repeat, QoS 1", lambda: mosquitto_pub_rate(broker, payload_file, n, 1)),
        ]:
            rows.append((label, [fn() for _ in range(repeats)]))
        ref = statistics.median(rows[-2][1])
        lines += [
            f"Publish ({n:,} messages of {size:,} bytes = {N_CARDS} cards each, one client, loopback):",
            "",
            f"| publisher | messages/s (median of {repeats}) | card readings/s | vs mosquitto_pub QoS 0 |",
            "|---|---|---|---|",
        ]
        for label, rates in rows:
            med = statistics.median(rates)
            spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
            lines.append(f"| {label} | {med:,.0f} ({spread}) | {med * N_CARDS:,.0f} | {med / ref:.2f}x |")
        lines += [
            "",
            f"Ingest of one stream (mosquitto_pub --repeat {n:,}, QoS 0) by two subscribers in the same run:",
            "",
            "| run | mosquitto_sub msg/s (received) | Bus + Codec.decode msg/s (received, rejected) "
            "| card readings/s decoded | Bus / mosquitto_sub |",
            "|---|---|---|---|---|",
        ]
        for mode in ("on_message", "messages"):
            results = [asyncio.run(ingest_side_by_side(broker, payload_file, n, mode)) for _ in range(repeats)]
            for k, (sr, sn, br, bn, rej) in enumerate(results):
                lines.append(
                    f"| {mode} #{k + 1} | {sr:,.0f} ({sn:,}) | {br:,.0f} ({bn:,}, {rej}) "
                    f"| {br * N_CARDS:,.0f} | {br / sr:.2f} |"
                )
            lines.append(_median_row(f"{mode}: median", results))
        lines += [
            "",
            f"Ingest ceiling: a backlog of {n:,} QoS 1 messages queued by the broker for two persistent sessions, "
            "drained by both at once:",
            "",
            "| run | mosquitto_sub msg/s (received) | Python client + Codec.decode msg/s (received, rejected) "
            "| card readings/s decoded | Bus / mosquitto_sub |",
            "|---|---|---|---|---|",
        ]
        for client, label in (("bus", "Bus"), ("aiomqtt", "raw aiomqtt iterator")):
            results = [asyncio.run(drain_side_by_side(broker, payload_file, n, k, client)) for k in range(repeats)]
            for k, (sr, sn, br, bn, rej) in enumerate(results):
                lines.append(
                    f"| {label} #{k + 1} | {sr:,.0f} ({sn:,}) | {br:,.0f} ({bn:,}, {rej}) "
                    f"| {br * N_CARDS:,.0f} | {br / sr:.2f} |"
                )
            lines.append(_median_row(f"{label}: median", results))
    return "\n".join(lines)


def _median_row(label: str, results: list[tuple[float, int, float, int, int]]) -> str:
    sub_med = statistics.median(r[0] for r in results)
    bus_med = statistics.median(r[2] for r in results)
    return (
        f"| **{label}** | **{sub_med:,.0f}** | **{bus_med:,.0f}** | **{bus_med * N_CARDS:,.0f}** "
        f"| **{bus_med / sub_med:.2f}** |"
    )


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    import aiomqtt

    mosq = find_mosquitto()
    mv = "-"
    if mosq:
        r = subprocess.run([mosq, "-h"], capture_output=True, text=True)
        mv = (r.stdout or r.stderr).splitlines()[0] if (r.stdout or r.stderr) else "?"
    return (
        f"{platform.node()} | {cpu} | {os.cpu_count()} CPUs | Python {platform.python_version()} | "
        f"msgspec {msgspec.__version__} | orjson {getattr(orjson, '__version__', '-')} | "
        f"aiomqtt {aiomqtt.__version__} | {mv} | numpy {np.__version__}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["decode", "broker"], default=None)
    ap.add_argument("--quick", action="store_true", help="fewer messages and repeats")
    ap.add_argument("--messages", type=int, default=None, help="messages per broker run (default 20,000)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 5 / 3)")
    args = ap.parse_args()
    n = args.messages or (5_000 if args.quick else 20_000)
    print(f"# bench_wire ({time.strftime('%Y-%m-%d %H:%M')})\n\n{machine()}\n")
    print(f"command: python benchmarks/bench_wire.py {' '.join(sys.argv[1:])}\n")
    if args.only in (None, "decode"):
        print(bench_decode(args.repeats or (3 if args.quick else 7)))
        print()
    if args.only in (None, "broker"):
        print(bench_broker(n, args.repeats or (2 if args.quick else 3)))


if __name__ == "__main__":
    main()
