"""A second ack for one command (a copy the agent sent again because the first ack came late, answered
again by the rack; or a broker's second delivery): journaled, but counted once in the agent's
metrics and not logged again.

What users rely on: ``racktwin_commands_total{result}`` counts commands, as ``racktwin journal`` does;
a rack that answers a copy ``duplicate: ... was expired before`` does not log a second "command
expired" warning."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from agent import wire
from agent.bus import MqttOptions
from agent.config import load_config
from agent.publish import OpenCommand
from agent.service import AgentService

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _count(service: AgentService, name: str, **labels: str) -> float:
    value = service.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_repeated_ack_is_counted_apart_and_not_logged_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    service = AgentService(loaded, mqtt=MqttOptions(port=1), http=False)  # not run: no connection
    cid = uuid.uuid4()
    topic = service.codec.topics.rack_cmd("r0")
    service.book.open[str(cid)] = OpenCommand(str(cid), "r0", topic, b"{}", 100.0, 130.0, attempts=2)

    def ack(seq: int, reason: str | None) -> wire.Acknowledgement:
        return wire.Acknowledgement("r0", cid, wire.AckResult.EXPIRED, 131.0, seq, "sim", reason)

    service.outcomes.on_ack(ack(0, None))
    again = ack(1, f"duplicate: command {cid} was expired before; not applied again")
    service.outcomes.on_ack(again)
    service.outcomes.on_ack(again)  # the broker delivers that answer twice (QoS 1 is at least once)
    assert _count(service, "racktwin_commands_total", result="expired") == 1.0
    assert _count(service, "racktwin_repeated_acks_total") == 2.0
    assert _count(service, "racktwin_foreign_acks_total") == 0.0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == ["command expired"]
    assert service.acks_received == 2  # two ack messages (the second delivery is not a third)
    # every ack goes to the journal, which counts the command once (tests/agent/test_journal_report.py)
    assert [a[0] for a in service.journal_acks.pending] == [str(cid)] * 3
