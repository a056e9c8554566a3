"""``racktwin_job_snapshot_changes_total{change}`` (docs/agent.md, "Observability"): the jobs the
scheduler's retained job snapshot (``jobs/state``) changed in the agent's job table, counted per job as
the catch-up (``agent.job_catchup``) changes them: ``added`` (a job the agent did not hold),
``corrected`` (a job whose cards, phase or state it held wrong), ``dropped`` (a job it held queued or
running that the snapshot no longer lists: its events were lost, or the agent was away). Before, only
the ingest's log line said so.

In process, through the service's ingest (the service built from examples/agent.toml, not run: no
broker); every value checked is the one a scrape sees."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_job_catchup import event, queued, running, snapshot, spec
from test_metric_gaps import _at, _scrape, _service

from agent import wire
from agent.service import AgentService
from twin.workload import Phase

pytestmark = pytest.mark.agent

T0 = 1_790_000_000.0


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def _changes(service: AgentService) -> dict[str, float | None]:
    s = _scrape(service)
    return {c: _at(s, "racktwin_job_snapshot_changes_total", change=c) for c in ("added", "corrected", "dropped")}


def test_each_job_a_snapshot_adds_corrects_or_drops_is_counted_once(service: AgentService) -> None:
    """Four jobs known from their events (j1 and j2 running, "lost" running, "gone" queued); then the
    snapshot lists j1 on other cards (corrected), j2 as the events said (unchanged), two jobs the agent
    never heard of, one running and one queued (added), and neither "lost" nor "gone" (dropped: their
    ends were not received). A second snapshot drops j1 and corrects nothing else; a third that says
    what the table says changes nothing. A snapshot older than the last event taken is ignored and
    counts nothing."""
    r = service.site.rack_names
    assert _changes(service) == {"added": 0.0, "corrected": 0.0, "dropped": 0.0}  # exported from the start
    ing = service.ingest
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 4)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0, 1, cards={r[1]: (0, 1, 2, 3)}, phase=Phase.COMPUTE))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j2", T0, 2, job=spec("j2", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j2", T0, 3, cards={r[2]: (0, 1)}, phase=Phase.COMPUTE))
    ing.handle(event(wire.JobEventType.SUBMITTED, "lost", T0, 4, job=spec("lost", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "lost", T0, 5, cards={r[3]: (0, 1)}))
    ing.handle(event(wire.JobEventType.SUBMITTED, "gone", T0, 6, job=spec("gone", 2)))
    assert set(service.state.jobs) == {"j1", "j2", "lost", "gone"}
    assert _changes(service) == {"added": 0.0, "corrected": 0.0, "dropped": 0.0}  # events are not snapshots

    j2 = running("j2", {r[2]: (0, 1)}, Phase.COMPUTE)
    ing.handle(
        snapshot(
            T0 + 1,
            10,
            running("j1", {r[0]: (4, 5, 6, 7)}, Phase.COMPUTE),
            j2,
            running("new", {r[0]: (0, 1)}, Phase.COMPUTE),
            queued("waits", 8),
        )
    )
    assert set(service.state.jobs) == {"j1", "j2", "new", "waits"}
    assert _changes(service) == {"added": 2.0, "corrected": 1.0, "dropped": 2.0}
    assert _changes(service) == {"added": 2.0, "corrected": 1.0, "dropped": 2.0}  # counted once, not per update

    ing.handle(snapshot(T0 + 2, 12, j2, running("new", {r[0]: (0, 1)}, Phase.COMPUTE), queued("waits", 8)))
    assert _changes(service) == {"added": 2.0, "corrected": 1.0, "dropped": 3.0}  # j1 dropped
    ing.handle(snapshot(T0 + 3, 13, j2, running("new", {r[0]: (0, 1)}, Phase.COMPUTE), queued("waits", 8)))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j5", T0 + 4, 20, job=spec("j5", 2)))
    ing.handle(snapshot(T0 + 4, 15))  # older than j5's event (seq 20): ignored, though it lists nothing
    assert _changes(service) == {"added": 2.0, "corrected": 1.0, "dropped": 3.0}
    assert "j5" in service.state.jobs
