"""Mutation audit of the service's top level (``agent.service``): its cadence and its lifecycle.

What docs/agent.md promises and nothing else tested: a periodic decision every ``control.period_s``
of site time (not every other period); a stop asked between two periods ends the run at once, not
at the next period; a stop before any telemetry ends cleanly too (retained ``offline`` with
``clean shutdown``, the journal's lock released); ``/readyz`` is not ready before the first
telemetry. Against a real mosquitto (the ``mosquitto`` fixture) and the simulator in accelerated
site time, on 2 racks of 16 cards.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mqtt_testing import wait_for
from site_testing import write_capped_small_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus, Incoming
from agent.config import load_config
from agent.journal import Journal
from agent.service import AgentService, HttpListenError
from sim.runner import SimOptions, Simulator
from twin.scenario import RunScenario, run_scenario_from_dict
from twin.spec import SiteSpec

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
SITE_ID = "site1"
START = 1_800_000_000.0
LATE = "solve late: greedy plan"  # what a decision says when its solve missed its deadline
STILL_RUNNING = "previous solve still running: greedy plan"  # ... and the next ones until it returns


def write_site(folder: Path) -> Path:
    """The example hardware as 2 racks of 16 cards (the rack limit scaled with the cards)."""
    return write_capped_small_site(folder, 12_500.0)


def service_on(
    broker: EmbeddedBroker,
    folder: Path,
    *,
    period_s: float,
    speed: float,
    mode: str = "advisory",
    replan: bool = False,
    min_replan_s: float = 1.0,
    http_listen: tuple[str, int] | None = None,
    **control: Any,
) -> AgentService:
    """A service (not started) on the test site, its journal in ``folder``; site time runs ``speed``
    times the wall clock; no job events ask for decisions (only the period does) unless ``replan``;
    ``control``: more of the ``[control]`` table; ``http_listen``: its HTTP endpoint (none without)."""
    write_site(folder)
    control = {
        "period_s": period_s,
        "solve_deadline_s": 0.1,
        "telemetry_deadline_s": 2 * period_s,
        "time_scale": 1.0 / speed,
        "replan_on_job_events": replan,
        "min_replan_interval_s": min_replan_s,
        "command_ttl_s": max(30.0, period_s),
        **control,
    }
    lines = [
        'site = "site.toml"',
        f'site_id = "{SITE_ID}"',
        f'mode = "{mode}"',
        "[control]",
        *(f"{k} = {json.dumps(v)}" for k, v in control.items()),
        "[journal]",
        'path = "journal.sqlite"',
        "[log]",
        'format = "text"',
    ]
    cfg = folder / "agent.toml"
    cfg.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = load_config(cfg, env={"RACKTWIN_BROKER_URL": f"mqtt://127.0.0.1:{broker.port}"})
    options = broker.options(client_id=f"agent-{uuid.uuid4().hex[:8]}")
    return AgentService(loaded, mqtt=options, http=http_listen is not None, http_listen=http_listen)


def busy_site(site: SiteSpec, duration_s: float, jobs: list[dict[str, Any]] | None = None) -> RunScenario:
    if jobs is None:  # both racks busy from the start
        jobs = [
            {"id": j, "n_cards": 16, "duration_s": 36000.0, "compute_share": 0.97, "running_at_start": True}
            for j in ("a", "b")
        ]
    data: dict[str, Any] = {
        "name": "service-audit",
        "duration_s": duration_s,
        "seed": 3,
        "workload": {"source": "none"},
        "ambient": {"kind": "constant", "temp_c": 25.0},
        "jobs": jobs,
    }
    return run_scenario_from_dict(data, source="service-audit", site=site)


def simulator(
    broker: EmbeddedBroker, site: SiteSpec, duration_s: float, speed: float, jobs: list[dict[str, Any]] | None = None
) -> Simulator:
    return Simulator(
        SimOptions(
            scenario=busy_site(site, duration_s, jobs),
            mqtt=broker.options(client_id=f"sim-{uuid.uuid4().hex[:6]}"),
            site_id=SITE_ID,
            speed=speed,
            start_epoch_s=START,
        )
    )


@contextlib.asynccontextmanager
async def running(service: AgentService) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(service.run())
    try:
        await wait_for("the agent's connection", lambda: service.bus.connected)
        yield task
    finally:
        service.stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def simulating(broker: EmbeddedBroker, site: SiteSpec, duration_s: float, speed: float) -> AsyncIterator[None]:
    """The simulator of :func:`simulator` running beside the block, cancelled at its end."""
    sim_task = asyncio.create_task(simulator(broker, site, duration_s, speed).run())
    try:
        yield
    finally:
        sim_task.cancel()
        with contextlib.suppress(BaseException):
            await sim_task


def decisions(journal: Path) -> list[tuple[float, str]]:
    """(site time from START, status) of every decision journaled."""
    with contextlib.closing(sqlite3.connect(journal)) as db:
        rows = db.execute("SELECT site_time_s, status FROM decisions ORDER BY id").fetchall()
    return [(float(t) - START, str(s)) for t, s in rows]


async def retained_status(broker: EmbeddedBroker, site: SiteSpec) -> wire.AgentStatus:
    """The agent's retained status, as a client connecting now gets it."""
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site=SITE_ID))
    got: list[wire.AgentStatus] = []

    def take(m: Incoming) -> None:
        msg = codec.decode(m.topic, m.payload)
        if isinstance(msg, wire.AgentStatus):
            got.append(msg)

    async with Bus(broker.options(), subscriptions=(codec.topics.agent_status,), on_message=take, name="reader"):
        await wait_for("the retained status", lambda: bool(got))
    return got[-1]


# --------------------------------------------------------------------------------------------------
# the cadence
# --------------------------------------------------------------------------------------------------


async def test_a_decision_every_period_of_site_time(mosquitto: EmbeddedBroker, tmp_path: Path) -> None:
    """docs/agent.md: "every control period asks the models"; with no job events asking, the
    decisions come one per ``period_s`` of site time. 60 site seconds of telemetry after the first
    decision at a 10 s period are 6 more periods: 6 or 7 decisions in all after it, give or take
    the one whose boundary falls at the end (a period skipped, or one of two, would be 3)."""
    period_s, speed, duration_s = 10.0, 10.0, 90.0
    service = service_on(mosquitto, tmp_path, period_s=period_s, speed=speed)
    site = service.site
    async with running(service):
        await simulator(mosquitto, site, duration_s, speed).run()
    made = decisions(tmp_path / "journal.sqlite")
    assert made, "no decision"
    first = made[0][0]
    later = [t for t, _ in made if first < t <= first + 60.0]
    assert 5 <= len(later) <= 7, made
    gaps = [b - a for a, b in itertools.pairwise([first, *later])]
    assert all(period_s * 0.5 < g < period_s * 1.5 for g in gaps), gaps


# --------------------------------------------------------------------------------------------------
# stopping
# --------------------------------------------------------------------------------------------------


async def test_a_stop_between_periods_ends_the_run_without_waiting_for_the_next_period(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """``stop()`` (the SIGTERM / SIGINT handler) wakes the control loop: with telemetry gone quiet
    after the first decision and a period of 10 minutes of site time at the wall clock's pace, the
    run ends at once, cleanly, with the one decision made and the clock nowhere near the next one."""
    period_s, speed = 600.0, 1.0
    service = service_on(mosquitto, tmp_path, period_s=period_s, speed=speed)
    site = service.site
    async with running(service) as task:
        async with simulating(mosquitto, site, 600.0, 20.0):
            await wait_for("the first decision", lambda: service.decisions >= 1, 30.0)
        service.stop()
        await wait_for("the run's end after stop()", task.done, 15.0)
    assert task.exception() is None
    assert service.decisions == 1
    status = await retained_status(mosquitto, site)
    assert status.state == wire.AgentState.OFFLINE and status.detail == "clean shutdown", status


async def test_a_stop_before_any_telemetry_is_a_clean_shutdown_that_releases_the_journal(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """Connected but nothing heard yet: not ready ("no telemetry received yet"), no decision; a stop
    then ends the run (no exception), the retained status says ``offline`` / ``clean shutdown`` and
    the journal's lock is free for the next agent."""
    service = service_on(mosquitto, tmp_path, period_s=5.0, speed=20.0)
    site = service.site
    async with running(service) as task:
        reasons = service.readiness()
        assert "no telemetry received yet" in reasons, reasons
        assert not any("not connected" in r for r in reasons), reasons
        service.stop()
        await wait_for("the run's end after stop()", task.done, 15.0)
    assert task.exception() is None
    assert service.decisions == 0
    assert not service.bus.connected  # its client is gone, not left running
    status = await retained_status(mosquitto, site)
    assert status.state == wire.AgentState.OFFLINE and status.detail == "clean shutdown", status
    Journal(tmp_path / "journal.sqlite", lock=True).close()  # not held any more


async def test_a_stop_during_a_solve_lets_that_cycle_finish_and_journal_its_decision(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """docs/agent.md: "SIGTERM or SIGINT stops it cleanly: the current control cycle finishes". A
    stop that comes while a cycle's solve runs in its thread (here the stop is asked from that thread,
    the solve taking 0.2 s of its 0.35 s allowance) still sees that cycle's decision journaled: every
    solve begun belongs to a decision in the journal."""
    service = service_on(mosquitto, tmp_path, period_s=10.0, speed=10.0)
    site = service.site
    loop = asyncio.get_running_loop()
    real_propose = service.controller.propose
    solves: list[float] = []

    def propose(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_solver", True):
            solves.append(time.monotonic())
            if len(solves) == 2:  # the second cycle: stop while its solve runs
                loop.call_soon_threadsafe(service.stop, "test")
                time.sleep(0.2)
        return real_propose(*args, **kwargs)

    service.controller.propose = propose  # type: ignore[method-assign]  # test double
    async with running(service) as task, simulating(mosquitto, site, 600.0, 10.0):
        await wait_for("the run's end after the stop", task.done, 30.0)
    assert task.exception() is None
    assert len(solves) == 2, solves
    assert len(decisions(tmp_path / "journal.sqlite")) == 2 == service.decisions


async def test_a_late_solve_gives_the_greedy_plan_and_no_new_solve_until_it_returns(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """docs/agent.md and the module docstring: a solve past its deadline gives "the greedy plan now,
    and no new solve until the late one returns". While the second solve hangs, the decisions go on
    (greedy); the first says the solve was late, the next ones that the previous solve still runs
    (none of them starts a solve of its own); once it returns, solves come again."""
    service = service_on(mosquitto, tmp_path, period_s=5.0, speed=20.0)
    site = service.site
    real_propose = service.controller.propose
    real_commit = service.controller.commit
    release = threading.Event()
    solves: list[float] = []
    notes: list[tuple[int, str]] = []  # (solves begun, what the decision says of its greedy plan)

    def propose(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_solver", True):
            solves.append(time.monotonic())
            if len(solves) == 2:
                release.wait(30.0)
        return real_propose(*args, **kwargs)

    def commit(decision: Any, *args: Any, **kwargs: Any) -> None:
        said = [line for line in decision.explanation if line in (LATE, STILL_RUNNING)]
        notes.append((len(solves), said[0] if said else ""))
        real_commit(decision, *args, **kwargs)

    service.controller.propose = propose  # type: ignore[method-assign]  # test double
    service.controller.commit = commit  # type: ignore[method-assign]  # test double
    async with running(service) as task, simulating(mosquitto, site, 2000.0, 20.0):
        try:
            await wait_for("four decisions while the second solve hangs", lambda: len(notes) >= 5, 30.0)
            hung = list(notes)
            release.set()
            await wait_for("a solve after the late one returned", lambda: len(solves) >= 3, 30.0)
        finally:
            release.set()  # before the stop: a hung solve would hold it
    assert task.exception() is None
    after_hang = [note for n, note in hung[1:]]
    assert after_hang[0] == LATE, hung
    assert all(note == STILL_RUNNING for note in after_hang[1:]), hung
    assert all(n == 2 for n, _ in hung[1:]), hung  # no new solve while the late one runs


async def test_acks_taken_in_during_a_stop_on_a_busy_bus_are_journaled_before_it_closes(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """docs/agent.md: a clean stop "waits up to 2 s for the acks of the commands in flight: the
    journal then records them ``applied`` or ``rejected``, not ``sent``". Acks go to the journal in
    batches, when the client has nothing more waiting; on a busy bus (here: the client always has
    more waiting once the stop is asked) the acks the stop waited for are in no batch yet, and the
    journal the agent closes must still have them."""
    service = service_on(mosquitto, tmp_path, period_s=5.0, speed=20.0, mode="enforce")
    site = service.site
    last: list[str] = []
    submit = service.publisher.submit
    pending = service.bus.pending
    stopping: list[bool] = []

    def submit_then_stop(commands: Any) -> None:
        commands = list(commands)
        submit(commands)
        if commands and not last:
            last.extend(oc.command_id for oc in commands)
            stopping.append(True)
            service.stop("test")

    service.publisher.submit = submit_then_stop  # type: ignore[method-assign]  # test double
    service.bus.pending = lambda: 1 if stopping else pending()  # type: ignore[method-assign]  # test double
    async with running(service) as task, simulating(mosquitto, site, 600.0, 20.0):
        await wait_for("the run's end after the stop", task.done, 30.0)
    assert task.exception() is None
    assert last, "no decision sent commands"
    with contextlib.closing(sqlite3.connect(tmp_path / "journal.sqlite")) as db:
        states = dict(db.execute("SELECT command_id, state FROM commands").fetchall())
    assert {states[i] for i in last} == {"applied"}, [states[i] for i in last]


async def test_a_loop_that_fell_behind_by_periods_decides_once_then_one_period_on(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A cycle that took two seconds (its advice held up on the way out: 20 s of site time, two
    periods at 10x) is not followed by a burst of decisions for the periods it missed: the next one
    comes at once, the one after it a period later (no two decisions less than half a period apart).
    The service's docstring said "a period is never skipped": these two are, by design."""
    service = service_on(mosquitto, tmp_path, period_s=10.0, speed=10.0)
    site = service.site
    real_send = service.bus.send
    sends: list[float] = []

    async def send(*args: Any, **kwargs: Any) -> Any:
        sends.append(time.monotonic())
        if len(sends) == 2:
            await asyncio.sleep(2.0)  # a decision's advice waits for the broker (the 1st send is the status)
        return await real_send(*args, **kwargs)

    service.bus.send = send  # type: ignore[method-assign]  # test double
    async with running(service), simulating(mosquitto, site, 600.0, 10.0):
        await wait_for("five decisions", lambda: service.decisions >= 5, 30.0)
    made = [t for t, _ in decisions(tmp_path / "journal.sqlite")]
    assert len(made) >= 5, made
    gaps = [b - a for a, b in itertools.pairwise(made)]
    assert max(gaps) > 15.0, made  # the held-up cycle took two periods
    assert min(gaps) > 5.0, made


async def test_racks_gone_silent_make_the_agent_not_ready_and_say_which(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """docs/agent.md: ``/readyz`` is 200 only when "every rack's telemetry is fresh". Ready while the
    simulator reports; once it stops, past ``telemetry_deadline_s`` (10 s of site time), not ready,
    naming both racks."""
    service = service_on(mosquitto, tmp_path, period_s=5.0, speed=20.0)
    site = service.site
    async with running(service):
        async with simulating(mosquitto, site, 600.0, 20.0):
            await wait_for("ready", lambda: service.readiness() == [] and service.decisions >= 1, 30.0)
        await wait_for("not ready for stale telemetry", lambda: "no fresh telemetry from r0, r1" in service.readiness())


async def test_job_events_get_a_decision_at_once_at_most_every_min_replan_interval(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """docs/agent.md: a decision every period "and at once (at most every ``min_replan_interval_s``)
    when a job starts, ends, ... or is submitted when the agent places jobs", the incremental one.
    Jobs submitted at 23 s and 24 s of a 10 s period (the first placed at once, its start another
    event) get incremental decisions between the periodic ones, none within 3 s of the last one."""
    service = service_on(mosquitto, tmp_path, period_s=10.0, speed=10.0, replan=True, min_replan_s=3.0)
    site = service.site
    jobs = [
        {"id": "a", "n_cards": 16, "duration_s": 36000.0, "compute_share": 0.97, "running_at_start": True},
        {"id": "b", "n_cards": 8, "duration_s": 36000.0, "compute_share": 0.97, "submit_time_s": 23.0},
        {"id": "c", "n_cards": 4, "duration_s": 36000.0, "compute_share": 0.97, "submit_time_s": 24.0},
    ]
    async with running(service):
        await simulator(mosquitto, site, 45.0, 10.0, jobs).run()
    made = decisions(tmp_path / "journal.sqlite")
    incremental = [t for t, status in made if status == "incremental"]
    assert any(23.0 <= t < 27.0 for t in incremental), made  # b's submission, at once (or 3 s on)
    gaps = [(b[0] - a[0], b[1]) for a, b in itertools.pairwise(made)]
    assert all(gap >= 3.0 for gap, status in gaps if status == "incremental"), made


async def test_the_solve_deadline_is_capped_at_six_tenths_of_the_periods_wall_time(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """docs/agent.md (``control.solve_deadline_s``): "the service also caps it at 0.6 of the period's
    wall time". A 10 s period at 10x is 1 s of wall time: a configured 8 s deadline gives the solver
    0.6 s, and a solve that takes 2 s is late (the greedy plan) instead of holding up the decision."""
    service = service_on(mosquitto, tmp_path, period_s=10.0, speed=10.0, solve_deadline_s=8.0)
    site = service.site
    real_context = service.controller.context
    real_propose = service.controller.propose
    limits: list[float] = []
    notes: list[str] = []

    def context(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["time_limit_s"])
        return real_context(*args, **kwargs)

    def propose(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_solver", True):
            time.sleep(2.0)
        return real_propose(*args, **kwargs)

    real_commit = service.controller.commit

    def commit(decision: Any, *args: Any, **kwargs: Any) -> None:
        notes.extend(line for line in decision.explanation if line in (LATE, STILL_RUNNING))
        real_commit(decision, *args, **kwargs)

    service.controller.context = context  # type: ignore[method-assign]  # test double
    service.controller.propose = propose  # type: ignore[method-assign]  # test double
    service.controller.commit = commit  # type: ignore[method-assign]  # test double
    async with running(service), simulating(mosquitto, site, 600.0, 10.0):
        await wait_for("a decision", lambda: service.decisions >= 1, 30.0)
    assert limits and max(limits) == pytest.approx(0.6, rel=0.05), limits
    assert notes[:1] == [LATE], notes


async def test_an_http_port_taken_fails_the_start_and_releases_the_journal(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """A start error (docs/agent.md: ``http.port``, the HTTP port is taken) raised by ``run()``
    leaves the journal free: the caller that catches it can start again on the same journal."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = service_on(mosquitto, tmp_path, period_s=5.0, speed=20.0, http_listen=("127.0.0.1", port))
        with pytest.raises(HttpListenError):
            await asyncio.wait_for(service.run(), 15)
    Journal(tmp_path / "journal.sqlite", lock=True).close()  # not held any more
