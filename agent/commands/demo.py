"""``racktwin demo``: the whole system on one machine, then a summary against the same run without the agent.

1. an embedded MQTT broker on a free loopback port (mosquitto when installed, else amqtt; or
   ``--broker URL``);
2. the agent service (``agent.service.AgentService``, enforce mode, the agent's default control
   configuration with its clock scaled to the simulator's speed) in this process;
3. the simulator (``python -m sim``) in a child process on its own core, running
   ``examples/day-demo.toml`` (or ``--scenario``) for ``--minutes`` of site time at ``--speed`` site
   seconds per wall second, writing its ground-truth log;
4. live progress on stderr from the truth log: every rack's true power against its limit, PUE, energy
   so far, seconds over a limit, the hottest die, the agent's decisions;
5. at the end (or on Ctrl-C: everything is stopped and the summary covers the time run so far; at
   the end the agent first takes in the racks' last acks, at most 10 s, so its journal has them), the
   same scenario and seed without the agent -- the in-process plant with every card at its top clock,
   no idle management, the site's fixed set-point and its own scheduler (``agent.policies.BaselinePolicy``)
   -- and a summary of both: facility and IT energy, throughput, PUE, time over a limit, the largest
   rack power and the hottest die. ``--json`` prints it as ``{"agent": {...}, "baseline": {...}}``. The
   run without the agent shows its progress on stderr too, at the same interval (site time done,
   speed, wall seconds left). A Ctrl-C during that run, or one that comes once the simulator has run its
   whole time (the agent taking in the last acks or stopping), summarizes the agent's whole run with '-'
   for the comparison (it is not run, or not to its end). SIGTERM is a Ctrl-C throughout
   (:mod:`agent.commands.command_signals`).

What each exit status means: :data:`EXIT_STATUSES` (``--help`` and the README's "Exit statuses" give
its words).

The agent's numbers come from the simulator's truth log (true values, one row per site second), the
baseline's from the in-process plant; both are judged from the end of the first control period on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.commands.command_signals import CommandSignals
from agent.commands.common import (
    EXAMPLES_DIR,
    UserError,
    add_progress_interval_argument,
    check_broker_option,
    check_progress_interval,
    check_telemetry_period,
    json_safe,
    path_arg,
    prepare_output_dir,
    print_json,
    write_text_replacing,
)
from agent.config import ControlConfig
from agent.durations import hms, percent_done
from agent.solver_output import stdout_to_stderr

if TYPE_CHECKING:  # the service is imported when the demo runs (it loads the solver stack)
    from agent.broker import EmbeddedBroker
    from agent.service import AgentService

DEFAULT_SCENARIO = EXAMPLES_DIR / "day-demo.toml"
#: Written afresh by each run (the old ones removed first).
_FRESH_FILES = ("truth.csv", "summary.json", "journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm")
#: What ``--out`` receives (checked writable before the run).
OUTPUT_FILES = (*_FRESH_FILES, "agent.log", "demo-summary.json")
#: Those of :data:`OUTPUT_FILES` written whole or not at all, through ``NAME.tmp`` (checked too).
_REPLACED_WHOLE = ("summary.json", "demo-summary.json")
DEFAULT_MINUTES = 75.0
MAX_MINUTES = 7 * 24 * 60.0
#: the control period of the demo's agent (the default control configuration), site seconds
_PERIOD_S = ControlConfig().period_s
_TELEMETRY_DEADLINE_S = ControlConfig().telemetry_deadline_s
DEFAULT_SPEED = 30.0
SITE_ID = "site1"
#: after the simulator ended, how long the agent may still take in the acks the racks sent last
_LAST_ACKS_WAIT_S = 10.0
#: Keys of a summary (``--json``: ``{"agent": M, "baseline": M}``).
SUMMARY_KEYS = (
    "facility_energy_kwh",
    "it_energy_kwh",
    "throughput",
    "pue",
    "limit_violation_s",
    "max_rack_power_w",
    "max_die_temp_c",
)


#: what each exit status of ``racktwin demo`` means, as its ``--help`` and the README (Command line) say it
EXIT_STATUSES = (
    "Exit status 0 after the run; 130 when stopped by Ctrl-C or SIGTERM (the time run so far is "
    "summarized); 1 when the simulator or the agent stopped with an error (the summary covers what ran); "
    "2 for a bad option or scenario, a broker it cannot start or reach, or a simulator that stopped before "
    "its first second (one line on stderr)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = (
        "Closed-loop demo: an embedded MQTT broker, the rack simulator (a child process) on the example "
        "supernode and the agent service in enforce mode; live progress, then a summary against the same "
        "run without the agent."
    )
    parser.epilog = f"{EXIT_STATUSES} docs/evaluation.md (racktwin demo)"
    parser.add_argument(
        "--minutes",
        type=float,
        default=DEFAULT_MINUTES,
        metavar="N",
        help=f"site minutes to run, more than one control period of the agent ({_PERIOD_S / 60:g}, i.e. "
        f"{_PERIOD_S:g} s) and at most {MAX_MINUTES:g} (a week) (default {DEFAULT_MINUTES:g})",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=DEFAULT_SPEED,
        metavar="X",
        help=f"site seconds per wall second, 1..1000 (default {DEFAULT_SPEED:g}; the agent's clock follows)",
    )
    parser.add_argument("--json", action="store_true", help='print {"agent": {...}, "baseline": {...}} at the end')
    parser.add_argument("--broker", default=None, metavar="URL", help="use this broker instead of an embedded one")
    parser.add_argument(
        "--out",
        default=None,
        type=path_arg,
        metavar="DIR",
        help="truth log, simulator summary, agent journal (default ./out/demo)",
    )
    parser.add_argument(
        "--scenario",
        default=None,
        type=path_arg,
        metavar="FILE",
        help="run-scenario TOML (default examples/day-demo.toml)",
    )
    add_progress_interval_argument(parser, default_s=5.0, lines=" (the run with the agent, then the one without)")


def _check(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.minutes) and 0 < args.minutes <= MAX_MINUTES):
        raise UserError(f"--minutes must be > 0 and <= {MAX_MINUTES:g} (a week), got {args.minutes:g}")
    if args.minutes * 60.0 <= _PERIOD_S:  # as evaluate refuses it (the scenario's own checks would blame the file)
        raise UserError(
            f"--minutes {args.minutes:g} ({args.minutes * 60.0:g} s) is not longer than one control period "
            f"({_PERIOD_S:g} s): the first period is not judged (the agent has not acted yet), so nothing would be"
        )
    if not (math.isfinite(args.speed) and 1.0 <= args.speed <= 1000.0):
        raise UserError(f"--speed must be within 1..1000, got {args.speed:g}")
    check_progress_interval(args.progress_interval_s)


def run(args: argparse.Namespace, command: str) -> int:
    from twin.scenario import load_run_scenario
    from twin.tables import SpecError

    _check(args)
    path = Path(args.scenario) if args.scenario is not None else DEFAULT_SCENARIO
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a TOML file")
    if not path.is_file():
        raise UserError(f"{path}: scenario file not found")
    duration_s = args.minutes * 60.0
    try:
        scenario = load_run_scenario(path, duration_s=duration_s)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    for warning in scenario.warnings:
        print(f"racktwin demo: warning: {warning}", file=sys.stderr, flush=True)
    check_telemetry_period(path, scenario.telemetry_period_s, _TELEMETRY_DEADLINE_S, "the demo's agent runs with it")
    if args.broker is not None:  # the demo's simulator and agent connect without credentials
        check_broker_option(args.broker, credentials="a broker without them (the demo passes none)")
    out_dir = Path(args.out) if args.out is not None else Path("out") / "demo"
    prepare_output_dir(out_dir, OUTPUT_FILES, replaced_whole=_REPLACED_WHOLE)
    # one pair of signal handlers from the broker's start to the end of the run without the agent: a SIGTERM's
    # default action killed the demo and left the embedded broker running; a signal at the end of the run with
    # the agent, in its event loop's handlers, went unnoticed
    with CommandSignals() as signals:
        # started within the try (the object, no process yet, made before it): a signal just after the start
        # raised KeyboardInterrupt with no `finally` to stop the broker
        broker = _embedded_broker() if args.broker is None else None
        try:
            url = _start_embedded_broker(broker).url if broker is not None else args.broker
            t0 = time.monotonic()
            with stdout_to_stderr():  # stray output of libraries (the HiGHS banner) must not spoil --json
                res = asyncio.run(_demo(args, scenario, path, url, out_dir, signals))
                comparison, base_m = _run_without_agent(
                    scenario, res.metrics["duration_s"], args.progress_interval_s, signals
                )
        finally:
            if broker is not None:
                with signals.remembering():  # a second Ctrl-C, a SIGTERM after it, must not cut the stop short
                    broker.stop()
    wall_s = time.monotonic() - t0
    agent_m = dict(res.metrics)
    stopped_by = "interrupted" if signals.received else res.stopped_by
    if comparison == "interrupted":
        _say("interrupted during the run without the agent: the summary has no comparison ('-')")
    elif comparison == "skipped":
        _say("interrupted at the end of the run with the agent: no run without it, the summary has no comparison ('-')")
    if res.agent_error:
        _say(f"the agent stopped with an error: {res.agent_error}")
    if stopped_by == "simulator stopped":
        _say(f"the simulator exited with status {res.sim_returncode} (see its messages above)")
    stats = {"decisions": res.decisions, "statuses": res.statuses}
    ran_s = agent_m.pop("duration_s")
    agent_m = {k: agent_m[k] for k in (*SUMMARY_KEYS, "limit_violation_longest_s")}
    if ran_s <= 0:
        raise UserError("the simulator stopped before its first second of site time (see the messages above)")
    if ran_s < duration_s - 1.0:
        _say(f"partial run ({stopped_by}): {ran_s / 60:.1f} of {args.minutes:g} site minutes")
    summary = {"agent": agent_m, "baseline": base_m}
    write_text_replacing(out_dir / "demo-summary.json", json.dumps(json_safe(summary), indent=1) + "\n")
    if args.json:
        print_json(summary)
    else:
        print(_format(summary, scenario, ran_s, wall_s, stats))
    if stopped_by == "interrupted":
        return 130
    # the summary covers what ran, but a demo whose simulator or agent failed did not do its job: a script
    # running it (scripts/demo.sh) must see that (a killed simulator exited 0)
    return 1 if stopped_by in ("simulator stopped", "agent stopped") or res.agent_error else 0


def _run_without_agent(
    scenario: Any, ran_s: float, progress_interval_s: float, signals: CommandSignals
) -> tuple[str, dict[str, float]]:
    """The same scenario without the agent for the ``ran_s`` site seconds the run with it covered
    (:func:`_baseline`), and how that went: "run"; "interrupted" by a signal (Ctrl-C, SIGTERM) during it;
    "skipped", the signal came once the simulator had run its whole time (the agent taking in the last
    acks, stopping): the agent's run is complete and the operator wants to stop, not wait as long again;
    "not run", the simulator stopped before its first second (nothing to compare: the demo says so and
    exits). Not run, or not to its end, its summary is NaN ('-') everywhere."""
    nothing = {k: math.nan for k in (*SUMMARY_KEYS, "limit_violation_longest_s")}
    if ran_s <= 0:  # the simulator stopped before its first second: the demo has nothing to summarize
        return "not run", nothing
    if signals.received and ran_s >= scenario.duration_s - 1.0:
        return "skipped", nothing
    try:
        with signals.raising():  # before the line that announces it (a SIGTERM may follow it at once)
            _say("the same run without the agent (in-process plant, same scenario and seed) ...")
            return "run", _baseline(dataclasses.replace(scenario, duration_s=ran_s), progress_interval_s)
    except KeyboardInterrupt:  # summarize the agent's run, without the comparison
        return "interrupted", nothing


def _embedded_broker() -> EmbeddedBroker:
    """The demo's broker, not started: on a free loopback port, mosquitto when installed, else amqtt."""
    from agent.broker import EmbeddedBroker

    return EmbeddedBroker()


def _start_embedded_broker(broker: EmbeddedBroker) -> EmbeddedBroker:
    """``broker`` started, said on stderr; a UserError when it does not start. The caller stops it, also when
    this is interrupted (a broker child already running must not outlive the demo)."""
    from agent.broker import BrokerUnavailable

    try:
        broker.start()
    except BrokerUnavailable as exc:
        raise UserError(str(exc)) from None
    _say(f"embedded {broker.backend} broker at {broker.url}")
    return broker


def _say(msg: str) -> None:
    print(f"racktwin demo: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The run: agent service in this process, simulator in a child
# --------------------------------------------------------------------------------------------


async def _demo(
    args: argparse.Namespace, scenario: Any, path: Path, url: str, out_dir: Path, signals: CommandSignals
) -> MqttRun:
    """The demo's run: ``signals`` stop it cleanly; progress lines on stderr."""
    stop = asyncio.Event()
    control = ControlConfig(time_scale=1.0 / args.speed)
    site = scenario.site
    _say(
        f"simulator: {scenario.name} ({site.n_cards} cards, {site.n_racks} racks of "
        f"{site.rack.power_limit_w / 1e3:g} kW) for {scenario.duration_s / 60:g} site minutes at {args.speed:g}x "
        f"(~{scenario.duration_s / args.speed:.0f} s); agent in enforce mode, a decision every "
        f"{control.period_s:g} site s; Ctrl-C stops both and summarizes"
    )
    with signals.stopping(stop.set):
        return await run_closed_loop(
            path,
            scenario,
            url,
            out_dir,
            speed=args.speed,
            control=control,
            progress_interval_s=args.progress_interval_s,
            stop=stop,
        )


@dataclasses.dataclass
class MqttRun:
    """What one closed-loop run through MQTT did (see :func:`run_closed_loop`)."""

    metrics: dict[str, float]  # truth_log_metrics, plus duration_s
    stopped_by: str  # "duration", "interrupted", "agent stopped", "simulator stopped"
    decisions: int
    statuses: dict[str, int]  # decision status -> count (from the journal)
    failsafe_entries: int  # times a rack went to fail-safe caps
    failsafe_racks: list[str]
    first_failsafe_s: float  # site seconds from the start (NaN: never)
    fallbacks: int  # decisions whose solve was late, failed or infeasible (agent.decision.fell_back)
    invalid_readings: int  # card values the belief refused
    rejected_messages: int  # messages the codec refused
    anomalies: list[str]  # every anomaly flagged during the run, from when; ", cleared" if no longer flagged
    agent_error: str  # "" when the agent ran to a clean stop
    sim_returncode: int | None
    sim_summary: dict[str, Any]


async def run_closed_loop(
    scenario_path: Path,
    scenario: Any,
    url: str,
    out_dir: Path,
    *,
    speed: float,
    control: Any = None,
    progress_interval_s: float = 0.0,
    stop: asyncio.Event | None = None,
) -> MqttRun:
    """The agent service (enforce mode, in this process) against the simulator (``python -m sim``, a
    child process) over the broker at ``url``, for ``scenario.duration_s`` site seconds at ``speed``.
    ``control``: the agent's ``ControlConfig`` (default: the defaults, clock scaled to ``speed``).
    Writes truth.csv, summary.json, journal.sqlite and agent.log to ``out_dir``. ``stop`` ends it early."""
    for name in _FRESH_FILES:
        with contextlib.suppress(FileNotFoundError):
            (out_dir / name).unlink()
    if control is None:
        control = ControlConfig(time_scale=1.0 / speed)
    with (
        _agent_logging_to(out_dir / "agent.log"),
        _Progress(out_dir / "truth.csv", scenario.site, control.period_s) as progress,
    ):
        service = _agent_service(scenario_path, scenario, url, out_dir, control)
        agent_task = asyncio.create_task(service.run(), name="agent")
        stop = stop if stop is not None else asyncio.Event()
        sim: subprocess.Popen[bytes] | None = None
        try:
            await _wait_until_connected(service, agent_task, url)
            cmd = _simulator_command(scenario_path, scenario, url, speed, out_dir)
            sim = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, env=_child_env())
            stopped_by = await _watch(sim, service, agent_task, stop, progress, progress_interval_s)
            stopped_by = await _how_it_ended(stopped_by, sim, service, agent_task, stop, out_dir / "summary.json")
        finally:
            await _clean_up(sim, service, agent_task)
    return _collect(out_dir, scenario.site, control.period_s, stopped_by, sim, service, agent_task)


@contextlib.contextmanager
def _agent_logging_to(path: Path) -> Iterator[None]:
    """While the run lasts, the agent's warnings (commands expired or refused while the simulator starts,
    ...) go to the file at ``path`` and its errors also to stderr; afterwards the root logger has its
    handlers and level back and the file is closed (a caller that runs several loops in one process,
    the MQTT fault tests, the benchmarks, keeps its own logging and leaks no file)."""
    from agent.logs import setup_logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with open(path, "w", encoding="utf-8") as log_fh:
        setup_logging("warning", "text", stream=log_fh)
        errors = logging.StreamHandler(sys.stderr)
        errors.setLevel(logging.ERROR)
        errors.setFormatter(logging.Formatter("racktwin demo: agent: %(levelname)s %(name)s: %(message)s"))
        root.addHandler(errors)
        try:
            yield
        finally:
            for h in list(root.handlers):
                root.removeHandler(h)
            for h in handlers:
                root.addHandler(h)
            root.setLevel(level)


def _agent_service(scenario_path: Path, scenario: Any, url: str, out_dir: Path, control: Any) -> AgentService:
    """The demo's agent: enforce mode, ``control``, its journal in ``out_dir``, no HTTP endpoint."""
    from agent.config import AgentConfig, HttpConfig, JournalConfig, LoadedConfig, LogConfig
    from agent.mqtt_options import MqttOptions
    from agent.service import AgentService

    cfg = AgentConfig(
        site=str(scenario_path),
        site_id=SITE_ID,
        mode="enforce",
        control=control,
        journal=JournalConfig(path=str(out_dir / "journal.sqlite")),
        http=HttpConfig(port=0),
        log=LogConfig(level="warning", format="text"),
    )
    loaded = LoadedConfig(config=cfg, site=scenario.site, source="racktwin demo", overrides=())
    try:
        mqtt = MqttOptions.from_url(url, client_id=f"racktwin-demo-agent-{os.getpid()}")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return AgentService(loaded, mqtt=mqtt, http=False)


#: wall seconds the agent has to connect to the broker before the demo gives up (exit status 2)
CONNECT_TIMEOUT_S = 15.0


async def _wait_until_connected(service: AgentService, agent_task: asyncio.Task[Any], url: str) -> None:
    """Until the agent is connected to the broker; a UserError naming the bus's last error (refused, a
    name not resolved, a TLS failure) if it stopped or took more than ``CONNECT_TIMEOUT_S``."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while not service.bus.connected:
        if agent_task.done() or time.monotonic() > deadline:
            why = service.bus.stats.last_error
            raise UserError(
                f"the agent could not connect to the broker {url} within {CONNECT_TIMEOUT_S:g} s"
                + (f" (last error: {why})" if why else "")
            )
        await asyncio.sleep(0.05)


async def _watch(
    sim: subprocess.Popen[bytes],
    service: AgentService,
    agent_task: asyncio.Task[Any],
    stop: asyncio.Event,
    progress: _Progress,
    progress_interval_s: float,
) -> str:
    """Until the simulator exits, ``stop`` is set or the agent stops, with a progress line on stderr every
    ``progress_interval_s`` wall seconds (none when 0): "agent stopped" when the agent did, else "duration"."""
    next_print = time.monotonic() + progress_interval_s
    while sim.poll() is None and not stop.is_set():
        if agent_task.done():
            return "agent stopped"
        await asyncio.sleep(0.1)
        if progress_interval_s > 0 and time.monotonic() >= next_print:
            next_print += progress_interval_s
            line = progress.line(service)
            if line:
                print(line, file=sys.stderr, flush=True)
    return "duration"


async def _how_it_ended(
    stopped_by: str,
    sim: subprocess.Popen[bytes],
    service: AgentService,
    agent_task: asyncio.Task[Any],
    stop: asyncio.Event,
    summary_path: Path,
) -> str:
    """What stopped the run (:attr:`MqttRun.stopped_by`), from what :func:`_watch` saw: ``stop`` set
    ("interrupted") or the simulator failing ("simulator stopped") come first. After a clean end of the
    simulator the agent first takes in the racks' last acks."""
    if stop.is_set():
        return "interrupted"
    if sim.returncode not in (None, 0):
        return "simulator stopped"
    if sim.returncode == 0 and not agent_task.done():
        await _take_in_last_acks(service, summary_path, stop)
        if stop.is_set():
            return "interrupted"
    return stopped_by


async def _clean_up(sim: subprocess.Popen[bytes] | None, service: AgentService, agent_task: asyncio.Task[Any]) -> None:
    """However the run ended: the simulator stopped (killed when it does not stop), the agent stopped
    (waited for at most 15 s; its logging is undone after, by :func:`_agent_logging_to`)."""
    if sim is not None:
        await _stop_simulator(sim)
    service.stop()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(15):
            await agent_task


def _collect(
    out_dir: Path,
    site: Any,
    period_s: float,
    stopped_by: str,
    sim: subprocess.Popen[bytes] | None,
    service: AgentService,
    agent_task: asyncio.Task[Any],
) -> MqttRun:
    """What the run did: the truth log's metrics (judged after the first control period ``period_s``),
    the journal's decisions, the agent's counters and how it stopped, the simulator's summary."""
    agent_error = ""
    if agent_task.done() and not agent_task.cancelled() and agent_task.exception() is not None:
        agent_error = repr(agent_task.exception())
    elif not agent_task.done():
        agent_error = "the agent did not stop within 15 s"
    journal = _journal_decisions(out_dir / "journal.sqlite", site, period_s)
    sim_summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        sim_summary = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    return MqttRun(
        metrics=truth_log_metrics(out_dir / "truth.csv", site, judge_from_s=period_s),
        stopped_by=stopped_by,
        decisions=service.decisions,
        statuses=journal["statuses"],
        failsafe_entries=journal["failsafe_entries"],
        failsafe_racks=journal["failsafe_racks"],
        first_failsafe_s=journal["first_failsafe_s"],
        fallbacks=journal["fallbacks"],
        invalid_readings=int(service.state.invalid_count.sum()),
        rejected_messages=int(service.codec.counter.total),
        anomalies=service.anomaly_history.describe(site.rack_names, since_s=journal["t0_s"]),
        agent_error=agent_error,
        sim_returncode=sim.returncode if sim is not None else None,
        sim_summary=sim_summary,
    )


def _simulator_command(scenario_path: Path, scenario: Any, url: str, speed: float, out_dir: Path) -> list[str]:
    """``python -m sim`` for the scenario at ``speed``, its truth log and summary in ``out_dir``."""
    return [
        sys.executable,
        "-m",
        "sim",
        "--scenario",
        str(scenario_path),
        "--broker",
        url,
        "--site-id",
        SITE_ID,
        "--speed",
        f"{speed:g}",
        "--duration",
        f"{scenario.duration_s:g}",
        "--seed",
        str(scenario.seed),
        "--truth-log",
        str(out_dir / "truth.csv"),
        "--summary",
        str(out_dir / "summary.json"),
        "--progress-interval-s",
        "0",
        "--no-scenario-warnings",  # the demo printed them (run() prints each once)
    ]


async def _stop_simulator(sim: subprocess.Popen[bytes]) -> None:
    """A still running simulator is asked to stop (SIGINT: a clean stop, its summary written), killed
    after 10 s."""
    if sim.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        sim.send_signal(signal.SIGINT)
    for _ in range(100):
        if sim.poll() is not None:
            return
        await asyncio.sleep(0.1)
    sim.kill()
    sim.wait()


def _child_env() -> dict[str, str]:
    """The simulator child's environment: this checkout first on the path when run from a checkout
    (never an installed package's site-packages: it would come before the standard library)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    if (Path(root) / "pyproject.toml").is_file() and (Path(root) / "sim" / "__main__.py").exists():
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


async def _take_in_last_acks(service: AgentService, summary_path: Path, stop: asyncio.Event) -> None:
    """After the simulator ended: let the agent take in the acks the racks sent last (still at the
    broker, which may run behind on a loaded machine) before it stops, so that the journal has every
    ack the summary counts; at most ``_LAST_ACKS_WAIT_S``."""
    try:
        sim = json.loads(summary_path.read_text(encoding="utf-8"))
        sent = sum(int(sim[f"commands_{k}"]) for k in ("applied", "rejected", "expired", "duplicate"))
    except (OSError, ValueError, KeyError, TypeError):
        return
    deadline = time.monotonic() + _LAST_ACKS_WAIT_S
    while service.acks_received < sent and time.monotonic() < deadline and not stop.is_set():
        await asyncio.sleep(0.05)


def _journal_decisions(path: Path, site: Any, judge_from_s: float) -> dict[str, Any]:
    """Statuses, fail-safe entries and fallbacks of the decisions the agent journaled. Fail-safe
    entries count from ``judge_from_s`` after the first decision on (the agent starts with no
    telemetry, so its very first decisions may hold every rack at fail-safe caps)."""
    import sqlite3

    from agent.decision import fell_back

    out: dict[str, Any] = {
        "statuses": {},
        "failsafe_entries": 0,
        "failsafe_racks": [],
        "first_failsafe_s": math.nan,
        "fallbacks": 0,
        "t0_s": 0.0,  # site time of the first decision
    }
    if not path.exists():
        return out
    db = sqlite3.connect(path)
    try:
        rows = list(db.execute("SELECT site_time_s, summary FROM decisions ORDER BY id"))
    except sqlite3.Error:
        return out
    finally:
        db.close()
    prev: set[str] = set()
    t0: float | None = None
    for t, text in rows:
        d = json.loads(text)
        if t0 is None:
            t0 = out["t0_s"] = float(t)
        status = str(d.get("status", "?"))
        out["statuses"][status] = out["statuses"].get(status, 0) + 1
        if fell_back(str(d.get("plan_status")), str(d.get("source"))):
            out["fallbacks"] += 1
        fs = set(d.get("failsafe_racks", []))
        if float(t) - t0 < judge_from_s:
            prev = fs
            continue
        out["failsafe_entries"] += len(fs - prev)
        for r in sorted(fs - prev):
            if r not in out["failsafe_racks"]:
                out["failsafe_racks"].append(r)
        if fs - prev and math.isnan(out["first_failsafe_s"]):
            out["first_failsafe_s"] = float(t) - t0
        prev = fs
    return out


class _Progress:
    """Reads the truth log as it grows and makes one progress line; a context manager that closes the
    log when the run ends."""

    def __init__(self, path: Path, site: Any, period_s: float) -> None:
        self.path = path
        self.site = site
        self.period_s = period_s
        self._fh: Any = None
        self._header: list[str] | None = None
        self._partial = ""
        self.last: dict[str, str] = {}
        self.over_s = 0.0
        self._prev_t: float | None = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _read(self) -> None:
        if self._fh is None:
            if not self.path.exists():
                return
            self._fh = open(self.path, encoding="utf-8")  # noqa: SIM115 - read as it grows, closed by __exit__
        chunk = self._fh.read()
        if not chunk:
            return
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        limit = self.site.rack.power_limit_w
        for line in lines:
            if not line:
                continue
            cells = line.split(",")
            if self._header is None:
                self._header = cells
                continue
            if len(cells) != len(self._header):
                continue
            row = dict(zip(self._header, cells, strict=True))
            t = float(row["time_s"])
            dt = t - self._prev_t if self._prev_t is not None else 0.0
            self._prev_t = t
            if t - dt >= self.period_s - 1e-9:
                over = sum(1 for r in self.site.rack_names if float(row[f"{r}_power_w"]) > limit)
                self.over_s += over * dt
            self.last = row

    def line(self, service: Any) -> str:
        self._read()
        row = self.last
        if not row:
            return ""
        limit_kw = self.site.rack.power_limit_w / 1e3
        racks = " ".join(f"{float(row[f'{r}_power_w']) / 1e3:4.1f}" for r in self.site.rack_names)
        t = float(row["time_s"])
        dec = service.last_decision
        status = dec.status if dec is not None else "-"
        return (
            f"racktwin demo: {hms(t)}  racks kW [{racks}] "
            f"(limit {limit_kw:g})  PUE {float(row['pue']):.3f}  facility {float(row['facility_energy_kwh']):,.1f} kWh"
            f"  over {self.over_s:,.0f} s  hottest die {float(row['max_die_temp_c']):.1f} C  "
            f"low-power cards {int(float(row['low_power_cards']))}  agent {service.decisions} decisions ({status})"
        )


def truth_log_metrics(path: Path, site: Any, judge_from_s: float) -> dict[str, float]:
    """A summary from a simulator truth log (docs/sim.md): energies and work at the last row; seconds of
    true rack power over a limit (rack-seconds, rows at or after ``judge_from_s``) and the longest time
    one rack stayed over; the largest rack power over the same rows; the hottest die over the run."""
    out = {k: math.nan for k in SUMMARY_KEYS}
    out["duration_s"] = 0.0
    out["limit_violation_longest_s"] = math.nan
    if not path.exists():
        return out
    limit = site.rack.power_limit_w
    names = site.rack_names
    over_s = 0.0
    run_s = [0.0] * len(names)
    longest = 0.0
    max_rack = 0.0
    max_die = -math.inf
    prev_t: float | None = None
    last: dict[str, str] | None = None
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            try:
                t = float(row["time_s"])
                racks = [float(row[f"{r}_power_w"]) for r in names]
                die = float(row["max_die_temp_c"])
                peak = float(row["max_rack_power_w"])
            except (TypeError, ValueError, KeyError):
                continue  # a row cut short by a killed run
            dt = t - prev_t if prev_t is not None else 0.0
            prev_t = t
            if t - dt >= judge_from_s - 1e-9 and dt > 0:
                over_s += sum(1 for p in racks if p > limit) * dt
                max_rack = max(max_rack, peak, *racks)
                run_s = [r + dt if p > limit else 0.0 for r, p in zip(run_s, racks, strict=True)]
                longest = max(longest, *run_s)
            if math.isfinite(die):
                max_die = max(max_die, die)
            last = row
    if last is None:
        return out
    t_end = float(last["time_s"])
    it = float(last["it_energy_kwh"])
    fac = float(last["facility_energy_kwh"])
    out.update(
        facility_energy_kwh=fac,
        it_energy_kwh=it,
        throughput=float(last["work_card_s"]) / t_end if t_end > 0 else 0.0,
        pue=fac / it if it > 0 else math.nan,
        limit_violation_s=over_s,
        limit_violation_longest_s=longest,
        max_rack_power_w=max_rack,
        max_die_temp_c=max_die,
        duration_s=t_end,
    )
    return out


def _baseline(scenario: Any, progress_interval_s: float = 0.0) -> dict[str, float]:
    """The run without the agent (``agent.evaluate.run_policy``'s ``baseline``), in this process, with a
    progress line on stderr every ``progress_interval_s`` wall seconds (none when 0), as the run with the
    agent has: ``racktwin demo: without the agent: H:MM:SS of H:MM:SS site time (N%), Xx real time, ~S s
    left``. The plant reports every 900 site seconds, so a line comes at most that often in site time."""
    from agent.evaluate import run_policy

    next_print_s = progress_interval_s

    def progress(_name: str, t_s: float, duration_s: float, wall_s: float) -> None:
        nonlocal next_print_s
        if progress_interval_s <= 0 or wall_s < next_print_s:
            return
        next_print_s = wall_s + progress_interval_s
        rate = t_s / wall_s if wall_s > 0 else math.inf
        left = f"~{(duration_s - t_s) / rate:,.0f} s left" if t_s < duration_s - 1e-6 and rate > 0 else "done"
        _say(
            f"without the agent: {hms(t_s)} of {hms(duration_s)} site time ({percent_done(t_s, duration_s)}%), "
            f"{rate:,.0f}x real time, {left}"
        )

    m = run_policy(scenario, "baseline", progress=progress).metrics
    return {k: float(m[k]) for k in (*SUMMARY_KEYS, "limit_violation_longest_s")}


def _format(summary: dict[str, dict[str, float]], scenario: Any, ran_s: float, wall_s: float, stats: Any) -> str:
    a, b = summary["agent"], summary["baseline"]
    rows = (
        ("facility energy", "facility_energy_kwh", "kWh", 1.0, "{:,.1f}"),
        ("IT energy", "it_energy_kwh", "kWh", 1.0, "{:,.1f}"),
        ("throughput", "throughput", "cards", 1.0, "{:,.1f}"),
        ("PUE", "pue", "", 1.0, "{:.4f}"),
        ("over a rack limit", "limit_violation_s", "rack-min", 60.0, "{:,.1f}"),
        ("largest rack power", "max_rack_power_w", "kW", 1e3, "{:.2f}"),
        ("hottest die", "max_die_temp_c", "deg C", 1.0, "{:.1f}"),
    )
    lines = [
        f"racktwin demo: {scenario.name}, {round(ran_s / 60, 1):g} site minutes in {wall_s:.0f} s wall "
        f"(agent: {stats.get('decisions', 0)} decisions)",
        f"{'':28}{'with agent':>12}{'without':>12}{'change':>9}",
    ]
    for label, key, unit, scale, fmt in rows:
        va, vb = a[key] / scale, b[key] / scale
        change = ""
        if key in ("facility_energy_kwh", "it_energy_kwh", "throughput") and vb > 0:
            change = f"{100.0 * (va / vb - 1.0):+.1f}%"
        sa = fmt.format(va) if math.isfinite(va) else "-"
        sb = fmt.format(vb) if math.isfinite(vb) else "-"
        lines.append(f"{label + (' (' + unit + ')' if unit else ''):28}{sa:>12}{sb:>12}{change:>9}")
    lines.append(
        "throughput: top-clock-equivalent cards of training (work done); 'without': every card at its top clock, "
        "no idle management, fixed set-point, the plant's own scheduler (same scenario and seed, in process) -- "
        "it runs racks over their limits, which the agent may not; over a limit and largest rack power: true rack "
        "power, after the first control period (the simulator's report above counts from t = 0)."
    )
    return "\n".join(lines)
