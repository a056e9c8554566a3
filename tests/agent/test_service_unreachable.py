"""An unreachable broker is not fatal: the service keeps retrying, /readyz says why, /healthz is up,
and a stop request still shuts it down cleanly."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from http_testing import http_get

from agent.bus import MqttOptions
from agent.config import load_config
from agent.service import AgentService

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_broker_keeps_retrying_and_readiness_says_why(tmp_path: Path) -> None:
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    port = free_port()  # nothing listens there
    options = MqttOptions(port=port, reconnect_min_s=0.05, reconnect_max_s=0.2, connect_timeout_s=1.0)
    service = AgentService(loaded, mqtt=options, http_listen=("127.0.0.1", 0))
    task = asyncio.create_task(service.run())
    for _ in range(200):
        if service.http_port is not None and service.bus.stats.failed_connects >= 2:
            break
        await asyncio.sleep(0.02)
    assert service.bus.stats.failed_connects >= 2  # it keeps trying
    assert service.http_port is not None
    status, body = await http_get(service.http_port, "/readyz")
    assert status == 503
    reasons = json.loads(body)["reasons"]
    assert any(f"127.0.0.1:{port}" in r and "not connected" in r for r in reasons)
    assert any("no telemetry" in r for r in reasons)
    assert (await http_get(service.http_port, "/healthz"))[0] == 200
    service.stop()
    await asyncio.wait_for(task, 10)
    assert task.done() and task.exception() is None
