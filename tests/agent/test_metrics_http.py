"""The HTTP endpoint: /metrics in Prometheus text format, /healthz, /readyz with reasons."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent.metrics import AgentMetrics, serve_http

pytestmark = pytest.mark.agent


async def get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_endpoints() -> None:
    m = AgentMetrics(["r0", "r1"])
    m.rack_power_watts.labels(rack="r0").set(48_000.0)
    m.rejected_messages_total.labels(reason="malformed_json").inc(3)
    m.pue_ratio.set(1.07)
    reasons: list[str] = ["no telemetry from r1"]
    server = await serve_http(m, lambda: list(reasons), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        status, body = await get(port, "/metrics")
        assert status == 200
        assert 'racktwin_rack_power_watts{rack="r0"} 48000.0' in body
        assert 'racktwin_rejected_messages_total{reason="malformed_json"} 3.0' in body
        assert "racktwin_pue_ratio 1.07" in body
        assert (await get(port, "/healthz"))[0] == 200
        status, body = await get(port, "/readyz")
        assert status == 503 and json.loads(body)["reasons"] == ["no telemetry from r1"]
        reasons.clear()
        assert (await get(port, "/readyz"))[0] == 200
        assert (await get(port, "/nope"))[0] == 404
    finally:
        server.close()
        await server.wait_closed()
