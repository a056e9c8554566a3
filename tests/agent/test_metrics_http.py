"""The HTTP endpoint: /metrics in Prometheus text format, /healthz, /readyz with reasons; bounded in
time, size and connections against slow, many or hostile clients (it shares the agent's event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest
from http_testing import http_get

from agent.metrics import AgentMetrics, HttpEndpoint, serve_http

pytestmark = pytest.mark.agent


async def test_endpoints() -> None:
    m = AgentMetrics(["r0", "r1"])
    m.rack_power_watts.labels(rack="r0").set(48_000.0)
    m.rejected_messages_total.labels(reason="malformed_json").inc(3)
    m.pue_ratio.set(1.07)
    reasons: list[str] = ["no telemetry from r1"]
    server = await serve_http(m, lambda: list(reasons), "127.0.0.1", 0)
    port = server.port
    try:
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert 'racktwin_rack_power_watts{rack="r0"} 48000.0' in body
        assert 'racktwin_rejected_messages_total{reason="malformed_json"} 3.0' in body
        assert "racktwin_pue_ratio 1.07" in body
        assert "racktwin_ready 0.0" in body  # what /readyz says, for alert rules
        assert (await http_get(port, "/healthz"))[0] == 200
        status, body = await http_get(port, "/readyz")
        assert status == 503 and json.loads(body)["reasons"] == ["no telemetry from r1"]
        reasons.clear()
        assert (await http_get(port, "/readyz"))[0] == 200
        server.metrics_max_age_s = 0.0  # rendered again at once
        assert "racktwin_ready 1.0" in (await http_get(port, "/metrics"))[1]
        assert (await http_get(port, "/nope"))[0] == 404
    finally:
        server.close()
        await server.wait_closed()


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _ended_without_an_answer(reader: asyncio.StreamReader, timeout_s: float = 2.0) -> bool:
    """The server closed the connection (end of stream, or a reset: it closed on unread data)."""
    try:
        return await asyncio.wait_for(reader.read(), timeout_s) == b""
    except ConnectionResetError:
        return True


async def test_a_client_that_trickles_its_headers_is_cut_off_at_the_head_deadline() -> None:
    """The whole request head has one deadline: a client sending a header line every 0.1 s (each
    within a per-line timeout) used to hold its connection for as long as it liked."""
    endpoint = HttpEndpoint(AgentMetrics(["r0"]), list, head_timeout_s=0.3)
    await endpoint.start("127.0.0.1", 0)
    reader, writer = await _open(endpoint.port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        start = time.monotonic()
        with contextlib.suppress(ConnectionError):
            for k in range(40):  # 4 s of headers if it were let
                writer.write(f"X-Slow-{k}: 1\r\n".encode())
                await writer.drain()
                await asyncio.sleep(0.1)
                if reader.at_eof() or writer.is_closing():
                    break
        assert await _ended_without_an_answer(reader)
        assert time.monotonic() - start < 2.0
    finally:
        writer.close()
        endpoint.close()
        await endpoint.wait_closed()


async def test_an_oversized_request_line_gets_431_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = HttpEndpoint(AgentMetrics(["r0"]), list, max_line_bytes=1024)
    await endpoint.start("127.0.0.1", 0)
    try:
        status, _body = await http_get(endpoint.port, "/" + "x" * 5000)
        assert status == 431
        assert (await http_get(endpoint.port, "/healthz"))[0] == 200
    finally:
        endpoint.close()
        await endpoint.wait_closed()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_connections_over_the_cap_are_answered_503_and_close_ends_the_open_ones() -> None:
    endpoint = HttpEndpoint(AgentMetrics(["r0"]), list, max_connections=2)
    await endpoint.start("127.0.0.1", 0)
    idle = [await _open(endpoint.port) for _ in range(2)]  # connected, sending nothing
    await asyncio.sleep(0.05)
    status, body = await http_get(endpoint.port, "/healthz")
    assert (status, body) == (503, "too many connections\n") and endpoint.refused == 1
    endpoint.close()
    await asyncio.wait_for(endpoint.wait_closed(), 2.0)  # the idle ones are ended, not waited for
    for reader, writer in idle:
        assert await _ended_without_an_answer(reader)
        writer.close()


async def test_a_burst_of_scrapes_renders_the_metrics_once() -> None:
    m = AgentMetrics(["r0"])
    endpoint = HttpEndpoint(m, list, metrics_max_age_s=30.0)  # the burst, however slow, within it
    await endpoint.start("127.0.0.1", 0)
    rendered = [0]
    render = m.exposition

    def counting() -> bytes:
        rendered[0] += 1
        return render()

    m.exposition = counting  # type: ignore[method-assign]  # test double
    try:
        m.pue_ratio.set(1.05)
        bodies = await asyncio.gather(*(http_get(endpoint.port, "/metrics") for _ in range(20)))
        assert rendered[0] == 1 and all("racktwin_pue_ratio 1.05" in b for _s, b in bodies)
        m.pue_ratio.set(1.06)
        endpoint.metrics_max_age_s = 0.05
        await asyncio.sleep(0.1)  # older than metrics_max_age_s: rendered again
        assert "racktwin_pue_ratio 1.06" in (await http_get(endpoint.port, "/metrics"))[1]
        assert rendered[0] == 2
    finally:
        endpoint.close()
        await endpoint.wait_closed()
