"""The HTTP endpoint: /metrics in Prometheus text format, /healthz, /readyz with reasons."""

from __future__ import annotations

import json

import pytest
from http_testing import http_get

from agent.metrics import AgentMetrics, serve_http

pytestmark = pytest.mark.agent


async def test_endpoints() -> None:
    m = AgentMetrics(["r0", "r1"])
    m.rack_power_watts.labels(rack="r0").set(48_000.0)
    m.rejected_messages_total.labels(reason="malformed_json").inc(3)
    m.pue_ratio.set(1.07)
    reasons: list[str] = ["no telemetry from r1"]
    server = await serve_http(m, lambda: list(reasons), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert 'racktwin_rack_power_watts{rack="r0"} 48000.0' in body
        assert 'racktwin_rejected_messages_total{reason="malformed_json"} 3.0' in body
        assert "racktwin_pue_ratio 1.07" in body
        assert (await http_get(port, "/healthz"))[0] == 200
        status, body = await http_get(port, "/readyz")
        assert status == 503 and json.loads(body)["reasons"] == ["no telemetry from r1"]
        reasons.clear()
        assert (await http_get(port, "/readyz"))[0] == 200
        assert (await http_get(port, "/nope"))[0] == 404
    finally:
        server.close()
        await server.wait_closed()
