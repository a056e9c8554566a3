"""An unreachable broker is not fatal: the service keeps retrying, /readyz says why, /healthz is up,
and a stop request still shuts it down cleanly. Errors of its own side tasks (metrics, a late solve)
are logged, never silent. A construction that fails releases the journal it opened."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from http_testing import http_get

from agent.broker import free_port
from agent.bus import MqttOptions
from agent.config import load_config
from agent.control_loop import _report_late_solve
from agent.failure_lines import FailureLines, WriteFailures
from agent.journal import Journal
from agent.service import AgentService

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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


def test_a_construction_that_fails_after_opening_the_journal_releases_it(tmp_path: Path) -> None:
    """The constructor closed the journal (and released its lock) only when loading the journal
    failed: any later step that raised left the lock held until the process ended, so a caller that
    caught the error and tried again was refused its own journal. Here the broker's password file,
    read after the journal is opened, was removed between the configuration's check and the start."""
    journal = tmp_path / "j.sqlite"
    password = tmp_path / "agent.password"
    password.write_text("secret\n")
    env = {
        "RACKTWIN_JOURNAL_PATH": str(journal),
        "RACKTWIN_BROKER_USERNAME": "agent",
        "RACKTWIN_BROKER_PASSWORD_FILE": str(password),
    }
    loaded = load_config(EXAMPLES / "agent.toml", env=env)
    password.unlink()
    with pytest.raises(FileNotFoundError, match=str(password)):
        AgentService(loaded, http=False)
    assert journal.exists()  # it failed after the journal was opened
    Journal(journal, lock=True).close()  # not held any more
    password.write_text("secret\n")  # the file back: the same configuration starts on the same journal
    service = AgentService(loaded, http=False)
    assert service.mqtt.password == "secret"
    service.journal.close()


async def test_a_failing_metrics_update_is_logged_once_and_the_service_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The health task used to swallow every error of the metrics update: the gauges froze (the
    broker link gauge among them) and nothing said so. Now the first failure is logged with its
    traceback, a repeat of the same error is not, and the recovery is logged."""
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    options = MqttOptions(port=free_port(), reconnect_min_s=0.05, reconnect_max_s=0.2, connect_timeout_s=1.0)
    service = AgentService(loaded, mqtt=options, http=False)
    update = service.metric_updates.update
    calls = [0]

    def failing_update() -> None:
        calls[0] += 1
        if calls[0] <= 3:
            raise ValueError("a gauge's labels do not match")
        update()

    monkeypatch.setattr(service.metric_updates, "update", failing_update)
    monkeypatch.setattr("agent.service._HEALTH_INTERVAL_S", 0.05)
    task = asyncio.create_task(service.run())
    for _ in range(200):
        if calls[0] >= 5:
            break
        await asyncio.sleep(0.02)
    service.stop()
    await asyncio.wait_for(task, 10)
    assert calls[0] >= 5 and task.exception() is None
    failed = [r for r in caplog.records if r.getMessage().startswith("health metrics not updated")]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert "a gauge's labels do not match" in failed[0].getMessage()
    assert sum(r.getMessage() == "health metrics updated again" for r in caplog.records) == 1


async def test_a_late_solve_that_fails_is_logged_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    """A solve that outlived its deadline is awaited by nobody: its failure used to surface only as
    asyncio's "exception was never retrieved" at garbage collection, if at all."""
    loop = asyncio.get_running_loop()
    late: asyncio.Future[Any] = loop.create_future()
    late.add_done_callback(_report_late_solve)
    late.set_exception(RuntimeError("HiGHS crashed"))
    await asyncio.sleep(0)  # done callbacks run on the loop
    [record] = [r for r in caplog.records if r.getMessage().startswith("control: a late solve failed")]
    assert "HiGHS crashed" in record.getMessage() and record.exc_info is not None
    finished: asyncio.Future[Any] = loop.create_future()
    finished.add_done_callback(_report_late_solve)
    finished.set_result(None)
    await asyncio.sleep(0)
    assert len([r for r in caplog.records if "late solve" in r.getMessage()]) == 1


def test_a_lasting_failure_is_logged_first_then_once_a_minute_with_a_count_and_again_after_it_recovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rhythm of the service's lines for a write that fails every cycle (a full journal disk):
    the first failure at once, then one line a minute with the number failed since the last line;
    after a recovery (which says how many failed) the next failure is logged at once again."""
    wall = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: wall[0])  # the clock of agent.failure_lines
    lines = FailureLines()
    logged: list[int | None] = []
    for _ in range(130):  # a cycle every second for 130 s
        logged.append(lines.failed())
        wall[0] += 1.0
    assert [(i, n) for i, n in enumerate(logged) if n is not None] == [(0, 1), (60, 60), (120, 60)]
    assert lines.recovered() == 130
    assert lines.failed() == 1  # a new failure, at once, 10 s after the last line
    assert lines.recovered() == 1 and lines.recovered() == 0


def test_a_write_that_keeps_failing_holds_its_reason_until_one_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """``WriteFailures`` (the decision, calibration and restart-record writes): the last failure's
    reason is kept for readiness until a write works; a write that works after failures says how many
    (one line), one that works with none before says 0 (no line)."""
    wall = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: wall[0])  # the clock of agent.failure_lines
    writes = WriteFailures()
    assert writes.succeeded() == 0 and writes.error is None
    assert writes.failed_with("disk full") == 1
    wall[0] += 1.0
    assert writes.failed_with("disk still full") is None  # within the minute: no line
    assert writes.error == "disk still full"
    assert writes.succeeded() == 2 and writes.error is None
    assert writes.succeeded() == 0
    assert writes.failed_with("read-only") == 1  # at once again after the recovery
