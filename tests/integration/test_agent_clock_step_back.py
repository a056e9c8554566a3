"""The agent service, a simulator that ends and one restarted 760 s back on the site clock (a
``racktwin sim`` restarted with an earlier epoch), over a real mosquitto: the commands the agent had
open on the old timeline (the fail-safe caps it kept sending to the silent racks) are closed, expired,
when its clock steps back, and the restarted racks get what the decisions want at once."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from site_testing import write_agent_config, write_capped_small_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus, Incoming
from agent.config import load_config
from agent.service import AgentService
from sim.runner import SimOptions, Simulator
from twin.scenario import RunScenario, run_scenario_from_dict
from twin.spec import SiteSpec, load_site

pytestmark = pytest.mark.integration

SITE_ID = "site1"
START = 1_800_000_000.0
SPEED = 20.0
PERIOD_S = 5.0
TTL_S = 30.0
FAILSAFE_HOLD_S = 20.0
STEP_S = 760.0
SIM2_S = 120.0  # the restarted simulator's run (6 s wall)


def write_config(folder: Path) -> Path:
    control = {
        "period_s": PERIOD_S,
        "solve_deadline_s": 0.1,
        "rack_margin_w": 250.0,
        "telemetry_deadline_s": 2 * PERIOD_S,
        "failsafe_hold_s": FAILSAFE_HOLD_S,
        "command_ttl_s": TTL_S,
        "time_scale": 1.0 / SPEED,
        "idle_reserve_cards": 0,
        "min_replan_interval_s": 1.0,
        "setpoint_interval_s": 60.0,
    }
    return write_agent_config(folder, SITE_ID, control, mode="enforce", http_port=None)


def full_load(site: SiteSpec, duration_s: float) -> RunScenario:
    jobs = [
        {"id": j, "n_cards": 16, "duration_s": 36000.0, "compute_share": 0.97, "running_at_start": True}
        for j in ("a", "b")
    ]
    data: dict[str, Any] = {
        "name": "step-back",
        "duration_s": duration_s,
        "seed": 7,
        "workload": {"source": "none"},
        "ambient": {"kind": "constant", "temp_c": 25.0},
        "jobs": jobs,
    }
    return run_scenario_from_dict(data, source="step-back", site=site)


async def wait_for(cond: Any, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_after_a_simulator_restarted_760_s_back_the_old_timelines_commands_close_and_the_racks_get_new_ones(
    mosquitto: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A first simulator runs 40 s and ends; the racks fall silent and the agent caps them (fail-safe),
    commands nobody answers. A second simulator starts 760 s back on the site clock (new session,
    nothing queued for it). Once the agent's clock has stepped back: the caps stamped on the old
    timeline are closed, expired in the journal (before, they stayed open, 'sent', until the new clock
    got back to their expiries, ~790 site s), and the restarted racks get the caps the decisions still
    want while the fail-safe hold lasts (before, the open caps' overlays said the racks had them: the
    restarted racks ran uncapped through the hold), stamped on the new timeline and applied. The
    commands decided on the old timeline before the agent's clock followed, refused ``issued_ahead``
    by the restarted racks, make one WARNING line and one INFO line with their number once the clock
    stepped back (before: a WARNING line each, ~39)."""
    caplog.set_level(logging.INFO, logger="racktwin.agent")
    site = load_site(write_capped_small_site(tmp_path, 12_500.0))
    cfg = write_config(tmp_path)
    loaded = load_config(cfg, env={"RACKTWIN_BROKER_URL": f"mqtt://127.0.0.1:{mosquitto.port}"})
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site=SITE_ID))
    seen: list[tuple[float, Any]] = []  # (wall, message)

    def on_message(m: Incoming) -> None:
        msg = codec.decode(m.topic, m.payload)
        if isinstance(msg, wire.RackCommand | wire.Acknowledgement):
            seen.append((time.monotonic(), msg))

    subs = [codec.topics.filter(wire.Kind.RACK_CMD), *codec.topics.agent_filters()]
    service = AgentService(
        loaded, mqtt=mosquitto.options(client_id=f"agent-{uuid.uuid4().hex[:8]}", clean_session=False), http=False
    )
    async with Bus(mosquitto.options(), subscriptions=subs, on_message=on_message, name="observer") as bus:
        await bus.wait_connected(10)
        agent = asyncio.create_task(service.run())
        try:
            await wait_for(lambda: service.bus.connected, 60, "the agent's connection")
            sim1 = Simulator(
                SimOptions(scenario=full_load(site, 40.0), mqtt=mosquitto.options(), site_id=SITE_ID, speed=SPEED,
                           start_epoch_s=START)
            )  # fmt: skip
            await sim1.run()

            # silence: the racks go stale and get fail-safe caps, open, unanswered
            def caps_open() -> bool:
                return any(oc.issued_s > START + 40.0 for oc in service.book.open.values())

            await wait_for(caps_open, 60, "fail-safe caps sent to the silent racks")
            old_open = {oc.command_id for oc in service.book.open.values()}
            corrections = service.clock.corrections
            new_start = START + 40.0 - STEP_S
            sim2 = Simulator(
                SimOptions(scenario=full_load(site, SIM2_S), mqtt=mosquitto.options(client_id="sim-2"),
                           site_id=SITE_ID, speed=SPEED, start_epoch_s=new_start)
            )  # fmt: skip
            sim2_task = asyncio.create_task(sim2.run())
            await wait_for(lambda: service.clock.corrections > corrections, 60, "the agent's clock stepping back")
            stepped_wall = time.monotonic()
            stepped_s = service.clock.now()
            assert stepped_s is not None and stepped_s < START
            await sim2_task

            # the estimator's time followed the clock (it kept the old timeline's until the new one passed it)
            def estimator_on_new_timeline() -> bool:
                return new_start < service.estimator.estimates().time_s <= new_start + SIM2_S

            await wait_for(estimator_on_new_timeline, 10, "the estimator's time on the new timeline")
        finally:
            service.stop()
            await asyncio.wait_for(agent, 15)

    db = sqlite3.connect(tmp_path / "journal.sqlite")
    try:
        rows = db.execute("SELECT command_id, issued_s, expires_s, state FROM commands").fetchall()
    finally:
        db.close()
    end_s = new_start + SIM2_S + wire.MAX_ISSUE_AHEAD_S * SPEED  # the new timeline's end, and more
    stamped_old = [(cid, state) for cid, issued_s, _expires_s, state in rows if issued_s > end_s]
    assert old_open and stamped_old
    # nothing of the old timeline is left open in the journal (their expiries, on it, never came)
    assert not [cid for cid, state in stamped_old if state in ("pending", "sent")]
    # the restarted racks got commands stamped on the new timeline while the fail-safe hold lasted, and applied them
    acks = {m.command_id: m for _w, m in seen if isinstance(m, wire.Acknowledgement)}
    new = [m for w, m in seen if isinstance(m, wire.RackCommand) and w >= stepped_wall - 1.0 and m.ts_s < START]
    early = [m for m in new if m.ts_s <= stepped_s + FAILSAFE_HOLD_S]
    assert early, "no command to the restarted racks during the fail-safe hold"
    assert {m.rack for m in early} == {"r0", "r1"}
    assert all(acks[m.command_id].result is wire.AckResult.APPLIED for m in early if m.command_id in acks)
    # nothing stamped on the old timeline went to the restarted racks
    assert not [m for w, m in seen if isinstance(m, wire.RackCommand) and w >= stepped_wall and m.ts_s > START]
    # the refusals as issued ahead: one WARNING line, then one INFO line with their number
    ahead = [m for _w, m in seen if isinstance(m, wire.Acknowledgement) and (m.reason or "").startswith("issued_ahead")]
    assert len(ahead) >= 2
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.getMessage().startswith("command ")]
    assert len(warned) == 1 and "issued_ahead" in warned[0].fields["reason"]  # type: ignore[attr-defined]
    (summed,) = [r for r in caplog.records if r.getMessage().startswith("the site clock stepped back:")]
    assert summed.levelno == logging.INFO
    # (an answer that came after the clock stepped back, of a command stamped on the old timeline, is
    # counted apart without a line)
    assert 2 <= sum(summed.fields["refused"].values()) <= len(ahead)  # type: ignore[attr-defined]
