"""A decision its journal cannot take changes nothing the agent holds (``agent.control_loop.ControlLoop.act``,
``CommandBook.undo``; docs/agent.md "Journal").

What users rely on: a decision that cannot be journaled is not acted on, and the commands open
before it stay open as they were: held and retried until acked or expired, journaled as before.
Before, the commands of the failed decision were dropped but those they replaced had already been
closed ``superseded`` by the book: the publisher journaled and counted them superseded although
nothing replaced them on the wire, and what they set (here cards 0-7 at level 3) was no longer held
or retried until a later decision commanded it again.

The service of examples/agent.toml in enforce mode (not run: no broker), its real journal made to
refuse every write by SQLite's ``query_only`` (as on a full disk), decisions acted on by the
service's own ``control.act``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import belief, example_site, job
from test_publish import NOW, decision_like
from test_publisher_journal_closes import EXAMPLES, state_of

from agent.bus import MqttOptions
from agent.config import load_config
from agent.decision import Decision
from agent.open_commands import LEVEL
from agent.service import AgentService
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent


@pytest.fixture(scope="module")
def snap() -> StateSnapshot:
    _plant, state = belief(example_site(), [job("a", 64), job("b", 64)], 5)
    return state.snapshot()


def cards_0_to_7_at(snap: StateSnapshot, level: int, cycle: int) -> Decision:
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = level
    return decision_like(snap, card_level=lvl).replace(cycle=cycle)


def enforcing_service(tmp_path: Path) -> AgentService:
    env = {"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite"), "RACKTWIN_MODE": "enforce"}
    service = AgentService(load_config(EXAMPLES / "agent.toml", env=env), mqtt=MqttOptions(port=1), http=False)
    service.clock.observe(NOW)
    assert service.commanding()
    return service


async def test_a_decision_the_journal_refuses_leaves_the_commands_it_would_replace_open(
    tmp_path: Path, snap: StateSnapshot
) -> None:
    service = enforcing_service(tmp_path)
    book, journal, publisher = service.book, service.journal, service.publisher
    publisher.journal_retry_s = 0.0  # every step tries every write
    await service.control.act(cards_0_to_7_at(snap, 3, 1), snap, NOW, time.monotonic(), "period")
    (old,) = book.open.values()
    old.attempts, old.first_sent_s, old.last_sent_s = 1, NOW, NOW  # sent once (no broker here)
    journal.mark_sent([old.command_id])
    held = (book.overlays.key[LEVEL, 0:8].copy(), book.overlays.until[LEVEL, 0:8].copy())

    journal._conn.execute("PRAGMA query_only = ON")  # every write fails (a full disk)
    await service.control.act(cards_0_to_7_at(snap, 5, 2), snap, NOW + 1.0, time.monotonic(), "period")
    assert any(r.startswith("journal: ") for r in service.readiness())  # the decision's write failed
    assert list(book.open.values()) == [old]
    assert (old.expires_s, old.attempts, old.last_sent_s, old.superseded_by) == (NOW + 30.0, 1, NOW, None)
    assert book.overlays.key[LEVEL, 0:8].tolist() == held[0].tolist()
    assert book.overlays.until[LEVEL, 0:8].tolist() == held[1].tolist()
    service.clock.observe(NOW + 1.0)
    await publisher.step()  # no broker: nothing goes out, nothing is closed
    assert publisher.stats.superseded == 0 and publisher.unjournaled_closes() == {}
    assert list(book.open.values()) == [old]

    journal._conn.execute("PRAGMA query_only = OFF")  # the journal takes writes again
    await service.control.act(cards_0_to_7_at(snap, 5, 3), snap, NOW + 2.0, time.monotonic(), "period")
    (new,) = book.open.values()
    assert old.superseded_by == new.command_id
    service.clock.observe(NOW + 2.0)
    await publisher.step()
    assert publisher.stats.superseded == 1 and state_of(journal, old) == "superseded"
    assert state_of(journal, new) == "pending"  # waits for the broker
    await service._close()
