"""An agent that connects after the simulator's jobs started (docs/agent.md, "Against the simulator, by
hand"), through a real mosquitto: the job events of t = 0 went out before it listened; the retained
job snapshot (``jobs/state``) tells it which cards those jobs hold, so it sends no low-power idle (nor
host power-off) to the cards of a job in a checkpoint (they read idle: utilization 0) and places no
queued job on them. Without the snapshot the rack refused such commands as ``busy``.

A small site (2 racks of 16 cards, docs in tests/site_testing.py) at 20x: job ``ckpt`` (8 cards of
r0) checkpoints from 20 s to 60 s and from 120 s to 160 s (after 20 s of training, then every 60 s, 40 s
each), ``steady`` (the other 8 cards of r0) computes; ``later`` (8 cards) is submitted at 30 s, for the
agent to place. The agent starts 10 s into the run; the run lasts 150 s.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from site_testing import write_agent_config, write_capped_small_site

from agent.broker import EmbeddedBroker
from agent.config import load_config
from agent.service import AgentService
from sim.runner import SimOptions, Simulator
from twin.scenario import run_scenario_from_dict
from twin.spec import SiteSpec, load_site

pytestmark = pytest.mark.integration

SITE_ID = "site1"
START = 1_800_000_000.0
SPEED = 20.0
AGENT_AFTER_S = 10.0  # site seconds the simulator runs before the agent starts


def write_config(folder: Path, speed: float = SPEED) -> Path:
    control = {
        "period_s": 5.0,
        "solve_deadline_s": 0.1,
        "rack_margin_w": 250.0,
        "telemetry_deadline_s": 10.0,
        "command_ttl_s": 30.0,
        "time_scale": 1.0 / speed,
        "idle_reserve_cards": 0,  # every idle card sleeps: the walk-through's refusals came from that
        "host_off_after_s": 20.0,
        "host_reserve_per_supernode": 0,
        "min_replan_interval_s": 1.0,
        "setpoint_interval_s": 60.0,
    }
    return write_agent_config(folder, SITE_ID, control, mode="enforce", http_port=0)


def refused_busy(journal: Path) -> list[tuple[str, dict[str, Any], str]]:
    """(topic, command, the rack's or scheduler's reason) of every command refused because a card was busy."""
    db = sqlite3.connect(journal)
    try:
        rows = db.execute(
            "SELECT c.topic, c.payload, a.reason FROM commands c JOIN acks a ON a.command_id = c.command_id "
            "WHERE a.result = 'rejected' AND a.reason LIKE '%busy%'"
        ).fetchall()
    finally:
        db.close()
    return [(t, json.loads(p), r) for t, p, r in rows]


def commands_sent(journal: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(journal)
    try:
        return [json.loads(p) for (p,) in db.execute("SELECT payload FROM commands")]
    finally:
        db.close()


async def run(
    broker: EmbeddedBroker, tmp_path: Path, *, agent_after_s: float | None, speed: float = SPEED, **top: Any
) -> tuple[AgentService, Simulator, SiteSpec, Path]:
    """The scenario above, the agent started ``agent_after_s`` site seconds after the simulator (None:
    the agent first, connected before the simulator starts), site time ``speed`` times the wall clock;
    ``top``: more scenario keys (faults)."""
    site = load_site(write_capped_small_site(tmp_path, 12_500.0))
    base = {"duration_s": 36000.0, "compute_share": 0.97}
    jobs = [
        {"id": "ckpt", "n_cards": 8, "running_at_start": True, **base, "checkpoint_interval_s": 60.0,
         "checkpoint_duration_s": 40.0, "first_checkpoint_after_s": 20.0},
        {"id": "steady", "n_cards": 8, "running_at_start": True, **base},
        {"id": "later", "n_cards": 8, "submit_time_s": 30.0, **base},
    ]  # fmt: skip
    scenario = run_scenario_from_dict(
        {
            "name": "late-agent",
            "duration_s": 150.0,
            "seed": 7,
            "workload": {"source": "none"},
            "ambient": {"kind": "constant", "temp_c": 25.0},
            "jobs": jobs,
            **top,
        },
        source="late-agent",
        site=site,
    )
    sim = Simulator(
        SimOptions(scenario=scenario, mqtt=broker.options(), site_id=SITE_ID, speed=speed, start_epoch_s=START)
    )
    cfg = write_config(tmp_path, speed)
    loaded = load_config(cfg, env={"RACKTWIN_BROKER_URL": f"mqtt://127.0.0.1:{broker.port}"})
    service = AgentService(
        loaded, mqtt=broker.options(client_id=f"agent-{uuid.uuid4().hex[:8]}", clean_session=False), http=False
    )
    agent: asyncio.Task[Any] | None = None
    if agent_after_s is None:
        agent = asyncio.create_task(service.run())
        async with asyncio.timeout(30):
            while not service.bus.connected:
                await asyncio.sleep(0.02)
    sim_task = asyncio.create_task(sim.run())
    try:
        if agent is None:
            async with asyncio.timeout(30):
                while sim.plant.time_s < (agent_after_s or 0.0):  # the t = 0 events are gone when the agent connects
                    await asyncio.sleep(0.02)
            agent = asyncio.create_task(service.run())
        summary = await asyncio.wait_for(sim_task, 60)
    finally:
        service.stop()
        if agent is not None:
            await asyncio.wait_for(agent, 15)
    assert summary.stopped_by == "duration"
    return service, sim, site, Path(loaded.config.journal.path)


async def test_an_agent_started_after_the_simulator_sends_nothing_to_the_busy_cards_of_its_jobs(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    service, sim, site, journal = await run(mosquitto, tmp_path, agent_after_s=AGENT_AFTER_S)
    assert service.ingest.stats.job_snapshots_changed == 1  # the retained snapshot: then the events
    sent = commands_sent(journal)
    assert any(c.get("action") == "low_power_idle" for c in sent)  # the agent did put idle cards to sleep
    t0_cards = {int(c) for j in ("ckpt", "steady") for c in sim.plant.job_cards(j)}

    def site_cards(topic: str, body: dict[str, Any]) -> set[int]:
        if "job_id" in body:  # a placement: rack -> cards
            return {rack_base[r] + int(i) for r, idx in body["cards"].items() for i in idx}
        return {rack_base[topic.split("/")[-2]] + int(i) for i in body["cards"]}

    rack_base = {r: k * site.cards_per_rack for k, r in enumerate(site.rack_names)}
    # every refusal counts, also one to the cards of "later" (the periodic decision right after its
    # placement used to send them low-power idle: tests/agent/test_placing_in_flight.py)
    busy = refused_busy(journal)
    assert not busy, [(t.rsplit("/", 2)[-2:], c.get("action", c.get("job_id")), r[:80]) for t, c, r in busy]
    placed = [c for c in sent if c.get("job_id") == "later"]
    assert placed  # the agent placed the queued job, on free cards only
    assert not [c for c in placed if site_cards("", c) & t0_cards]


async def test_an_agent_that_took_every_event_finds_nothing_to_change_in_the_snapshots(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The agent started first (the demo's order) takes every event; the snapshot after each change
    says what the events said, so it changes nothing the agent decides on: also through a card failure
    (its job requeued and started again elsewhere) and the checkpoints."""
    fail = {"kind": "card_failure", "card": 9, "at_s": 45.0}  # a card of "steady"
    service, sim, _site, journal = await run(
        mosquitto, tmp_path, agent_after_s=None, faults=[fail], phases={"restart_delay_s": 10.0}
    )
    stats = service.ingest.stats
    assert stats.job_snapshots >= 5 and stats.job_snapshots_changed == 0
    assert any(r.restarts >= 1 for r in sim.plant.job_records())  # the requeue happened
    assert not refused_busy(journal)


def refused_ahead(journal: Path) -> int:
    db = sqlite3.connect(journal)
    try:
        (n,) = db.execute(
            "SELECT COUNT(*) FROM acks WHERE result = 'rejected' AND reason LIKE 'issued_ahead%'"
        ).fetchone()
    finally:
        db.close()
    return int(n)


async def test_a_snapshot_left_retained_by_an_earlier_run_does_not_move_the_agents_clock(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The six-fault benchmark's case: one broker, runs one after another, each simulator starting at
    the same epoch. The first run leaves its last snapshot retained, stamped ~150 s into its run; the
    second run's agent, started first, gets it before any telemetry. Taken as the site's time it put
    the agent's clock ahead of the racks', and they refused its commands ``issued_ahead`` (the
    benchmark's pump, dropout and stuck days ran ~15,000 rack-s over a limit); now it is ignored."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    # the first run only leaves what a finished run leaves retained (its last snapshot, stamped in site
    # time; its agent's offline status; the racks' applied states) and nothing of it is judged: at twice
    # the speed it leaves them in half the wall time
    await run(mosquitto, tmp_path / "first", agent_after_s=None, speed=2 * SPEED)
    service, _sim, _site, journal = await run(mosquitto, tmp_path / "second", agent_after_s=None)
    stats = service.ingest.stats
    assert stats.job_snapshots_ahead == 1  # the first run's snapshot, ignored
    # before: it moved the clock ~150 s ahead, onto the first run's timeline, which the clock then left
    # for the racks' (timelines_left 1), and put the first run's jobs in the table (2 snapshots changed
    # it); an agent that took every event finds nothing. Not "no correction at all": the simulator runs
    # in this process, and on a loaded machine a stall of the process stalls the site's time with it
    # (the simulator runs late, it never skips), the clock extrapolates past the site and steps back to
    # the next message, as it should (the site is the authority), on the same timeline
    assert service.clock.timelines_left == 0
    assert stats.job_snapshots_changed == 0
    assert refused_ahead(journal) == 0  # 150 s ahead is within what a rack accepts; 2,192 s was not
    assert not refused_busy(journal)
