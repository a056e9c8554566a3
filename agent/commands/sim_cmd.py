"""``racktwin sim``: the MQTT rack simulator (the virtual plant behind the racktwin protocol).

racktwin sim [--site FILE] [--scenario FILE] [--broker URL] [--speed X] [--duration S]
             [--site-id ID] [--telemetry-period-s P] [--truth-log FILE.csv] [--summary FILE.json]
             [--seed N] [--supernodes N] [--start-epoch-s T] [--step-s S] [--progress-interval-s S]
             [MQTT options]

Runs a run scenario (``twin.scenario``; default: the embedded one, a generated workload at 65%
allocation and a diurnal ambient, for a day) at ``--speed`` site seconds per wall second, publishes
its telemetry, applies and acks commands, and writes the truth log and the summary. Without
``--broker`` it starts an embedded broker (mosquitto, else amqtt) on a free loopback port, prints
its URL on stdout and stops it on exit. SIGINT / SIGTERM stop it cleanly (summary written); while it
starts, either is a Ctrl-C (exit status 130, the embedded broker stopped), and neither cuts the embedded
broker's stop short (one pair of handlers for the whole command: :mod:`agent.commands.command_signals`).
Progress lines go to stderr. Documentation: docs/sim.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.bus import BusConnectError
from agent.commands.command_signals import CommandSignals
from agent.commands.common import (
    DEFAULT_SITE,
    UserError,
    add_progress_interval_argument,
    check_broker_option,
    check_output_file,
    check_progress_interval,
    load_site_or_fail,
    path_arg,
)
from agent.mqtt_args import add_mqtt_arguments, check_tls_files_of_args, mqtt_options_from_args
from twin.spec import SiteSpec
from twin.tables import SpecError

if TYPE_CHECKING:
    from sim.runner import SimSummary
    from twin.scenario import RunScenario

DEFAULT_DURATION_S = 86400.0


#: how ``racktwin sim`` stops and what each exit status means, as its ``--help`` and the README
#: (Command line) say it
EXIT_STATUSES = (
    "It runs for --duration site seconds or until SIGINT or SIGTERM (the truth log is flushed and the "
    "summary written): exit status 0. Exit status 2: a bad option, scenario or site, an output it cannot "
    "write, a broker it cannot reach within 10 s (one line on stderr); 130: stopped by Ctrl-C or SIGTERM "
    "while it starts, before the run; 141: the reader of its output went away before the embedded broker's URL "
    "was written (the run does not start)."
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = (
        "Run the virtual plant (twin.plant) behind the racktwin MQTT protocol: telemetry, job events, "
        "commands with acks, faults from a scenario, a ground-truth log."
    )
    parser.epilog = f"{EXIT_STATUSES} docs/sim.md"
    parser.add_argument(
        "--site",
        default=None,
        type=path_arg,
        metavar="FILE",
        help="site spec TOML (default: the scenario's, else examples/supernode-512.toml)",
    )
    parser.add_argument(
        "--scenario",
        default=None,
        type=path_arg,
        metavar="FILE",
        help="run-scenario TOML (default: the embedded one; docs/sim.md)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="site seconds per wall second (default 1 = real time; 0 or inf = as fast as possible)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        # twin.scenario.MAX_DURATION_S (not imported here: `racktwin sim --help` stays light)
        help="site seconds to run, at most 31536000 (365 days) (default: the scenario's; 86400 without one)",
    )
    parser.add_argument("--site-id", default="site1", metavar="ID", help="site id in the MQTT topics (default site1)")
    parser.add_argument(
        "--telemetry-period-s",
        type=float,
        default=None,
        metavar="P",
        help="publishing period in site seconds, 0.01..3600 (default: the scenario's, 1)",
    )
    parser.add_argument(
        "--truth-log",
        default=None,
        type=path_arg,
        metavar="FILE.csv",
        help="write the ground-truth log (one row per period)",
    )
    parser.add_argument(
        "--summary", default=None, type=path_arg, metavar="FILE.json", help="write the final summary as JSON"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="seed of the workload, the plant and its sensors, >= 0 (default: the scenario's)",
    )
    parser.add_argument(
        "--supernodes",
        type=int,
        default=None,
        metavar="N",
        help=(
            "scale the site to N supernodes, 1..10000 and at most 1,000,000 cards in all (1,953 supernodes of the "
            "default site; SiteSpec.with_supernodes; default: the scenario's or site's)"
        ),
    )
    parser.add_argument(
        "--start-epoch-s",
        type=float,
        default=None,
        metavar="T",
        help="site clock at t = 0, epoch seconds, 0..1e10 (default: now)",
    )
    parser.add_argument(
        "--step-s", type=float, default=1.0, metavar="S", help="plant time step in site seconds (default 1)"
    )
    add_progress_interval_argument(parser, default_s=5.0, lines=" on stderr", zero_for_none=True)
    parser.add_argument(
        "--no-scenario-warnings",
        action="store_true",
        help="do not print the scenario's warnings (listed jobs or faults after the end of the run); racktwin demo "
        "passes it to its simulator, having printed them itself",
    )
    add_mqtt_arguments(parser, client_id_default="racktwin-sim-SITE_ID, a persistent session")


def _scenario(args: argparse.Namespace) -> RunScenario:
    from twin.scenario import MAX_DURATION_S, default_run_scenario, load_run_scenario

    if args.duration is not None and not (math.isfinite(args.duration) and 0 < args.duration <= MAX_DURATION_S):
        raise UserError(
            f"--duration must be a positive number of seconds, at most {MAX_DURATION_S:.0f} s (365 days), "
            f"got {args.duration:.10g}"
        )
    if args.seed is not None and args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    if args.supernodes is not None and not 1 <= args.supernodes <= 10_000:
        raise UserError(f"--supernodes must be within 1..10000, got {args.supernodes}")
    site: SiteSpec | None = None
    if args.site is not None or args.scenario is None:
        site = load_site_or_fail(args.site)
    try:
        if args.scenario is not None:  # --supernodes wins over the scenario's `supernodes`
            scenario = load_run_scenario(
                args.scenario, site=site, seed=args.seed, duration_s=args.duration, supernodes=args.supernodes
            )
        else:
            assert site is not None
            if args.supernodes is not None:
                try:
                    site = site.with_supernodes(args.supernodes)
                except ValueError as exc:  # more cards than a site may have (twin.spec.MAX_SITE_CARDS)
                    raise UserError(f"--supernodes: {exc}") from None
            duration = args.duration if args.duration is not None else DEFAULT_DURATION_S
            scenario = default_run_scenario(site, duration, args.seed if args.seed is not None else 0)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    for warning in () if args.no_scenario_warnings else scenario.warnings:
        print(f"racktwin sim: warning: {warning}", file=sys.stderr, flush=True)
    if args.telemetry_period_s is not None:
        p = args.telemetry_period_s
        if not (math.isfinite(p) and 0.01 <= p <= 3600):
            raise UserError(f"--telemetry-period-s must be within 0.01..3600 s, got {p:g}")
        scenario = dataclasses.replace(scenario, telemetry_period_s=float(p))
    return scenario


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (another spelling, a link, a hard link)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except (OSError, ValueError):
        return False


def _check_outputs_spare_inputs(
    args: argparse.Namespace, scenario: RunScenario, outputs: list[tuple[str, Path]]
) -> None:
    """An output (``--truth-log``, ``--summary``) that is an input of the run or the other output
    would be overwritten: refused before the run."""
    inputs: list[tuple[str, Path]] = []
    if args.scenario is not None:
        inputs.append((f"the scenario (--scenario {args.scenario})", Path(args.scenario)))
    if args.site is not None:
        inputs.append((f"the site spec (--site {args.site})", Path(args.site)))
    elif args.scenario is None:
        inputs.append((f"the site spec ({DEFAULT_SITE}, used without --site)", DEFAULT_SITE))
    for path in scenario.input_files:
        inputs.append((f"a file the scenario reads ({path})", path))
    for dest in ("mqtt_password_file", "mqtt_ca_file", "mqtt_cert_file", "mqtt_key_file"):
        value = getattr(args, dest, None)
        if value is not None:
            inputs.append((f"--{dest.replace('_', '-')} {value}", Path(value)))
    for i, (option, path) in enumerate(outputs):
        for what, source in inputs:
            if _same_file(path, source):
                raise UserError(f"{option} {path}: is {what}: it would be overwritten; write it elsewhere")
        for other_option, other in outputs[:i]:
            if _same_file(path, other):
                raise UserError(f"{option} {path}: is the same file as {other_option} {other}: give each its own path")


def run(args: argparse.Namespace, command: str) -> int:
    from agent.broker import BrokerUnavailable, EmbeddedBroker
    from agent.wire import Topics
    from sim.runner import MAX_START_EPOCH_S, SimOptions

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr)
    if math.isnan(args.speed) or args.speed < 0:
        raise UserError(f"--speed must be >= 0 (0 or inf: as fast as possible), got {args.speed:g}")
    if not (math.isfinite(args.step_s) and args.step_s > 0):
        raise UserError(f"--step-s must be positive, got {args.step_s:g}")
    interval = args.progress_interval_s
    check_progress_interval(interval, zero_for_none=True)
    try:  # checked here, not after the embedded broker has started and printed its URL
        Topics(args.site_id)
    except ValueError as exc:
        raise UserError(f"--site-id: {exc}") from None
    epoch = args.start_epoch_s
    if epoch is not None and not 0 <= epoch <= MAX_START_EPOCH_S:
        raise UserError(f"--start-epoch-s must be epoch seconds within 0..{MAX_START_EPOCH_S:g}, got {epoch:g}")
    if args.broker is not None:
        check_broker_option(args.broker, credentials="--mqtt-username and --mqtt-password-file")
    # the output files are checked before the run, not found unwritable at its end
    truth_log = None if args.truth_log is None else Path(args.truth_log)
    summary_path = None if args.summary is None else Path(args.summary)
    if truth_log is not None:
        check_output_file(truth_log, "--truth-log")
    if summary_path is not None:
        check_output_file(summary_path, "--summary", replaced_whole=True)  # through SUMMARY.tmp
    scenario = _scenario(args)
    outputs = [(option, path) for option, path in (("--truth-log", truth_log), ("--summary", summary_path)) if path]
    _check_outputs_spare_inputs(args, scenario, outputs)
    mqtt = mqtt_options_from_args(args)
    if mqtt is not None:
        check_tls_files_of_args(mqtt)
    progress = None
    if interval > 0:

        def progress(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    broker = EmbeddedBroker() if mqtt is None else None
    # one pair of signal handlers for the whole command, not the event loop's: a SIGTERM as the loop closed
    # (asyncio puts its default action back then) killed sim and left the embedded broker running
    with CommandSignals() as signals:
        # started within the try, so that every way out stops it: a URL line to no reader (exit 141) left its folder
        try:
            with signals.raising():  # starting: a signal is a Ctrl-C (exit status 130, the broker stopped)
                if broker is not None:
                    try:
                        broker.start()
                    except BrokerUnavailable as exc:
                        raise UserError(str(exc)) from None
                    mqtt = broker.options(client_id=args.mqtt_client_id)
                    print(f"racktwin sim: embedded {broker.backend} broker at {broker.url}", flush=True)
                assert mqtt is not None  # --broker's, else the embedded broker's
                try:
                    options = SimOptions(
                        scenario=scenario,
                        mqtt=mqtt,
                        site_id=args.site_id,
                        speed=args.speed,
                        duration_s=args.duration,
                        truth_log=truth_log,
                        summary_path=summary_path,
                        start_epoch_s=args.start_epoch_s,
                        step_s=args.step_s,
                        progress=progress,
                        progress_interval_s=interval if interval > 0 else 5.0,
                    )
                except ValueError as exc:
                    raise UserError(str(exc)) from None
            # from here a signal is only remembered: during asyncio.run's set-up (cut there, the half-made loop
            # and the coroutine never awaited put an AttributeError and a RuntimeWarning on stderr) _run raises
            # it; after the run (the loop closing, the broker stopping) the run's report stands
            summary, summary_error = asyncio.run(_run(options, signals))
        except BusConnectError as exc:
            raise UserError(f"cannot connect to the broker: {exc}") from None
        finally:
            if broker is not None:
                with signals.remembering():  # a second Ctrl-C, a SIGTERM after it, must not cut the stop short
                    broker.stop()
    signal_name = signals.first.name if signals.first is not None else None
    _report(summary, options, summary_written=summary_error is None, signal_name=signal_name)
    if summary_error is not None:  # e.g. the disk filled up during the run: not a success
        raise UserError(f"--summary {options.summary_path}: cannot write the summary ({summary_error})")
    return 0


async def _run(options: Any, signals: CommandSignals) -> tuple[SimSummary, str | None]:
    """Run; the summary and why it could not be written to ``--summary`` (None: written or not asked). A
    Ctrl-C or SIGTERM before the run (one remembered during ``asyncio.run``'s set-up, one while the
    simulator is made) raises KeyboardInterrupt; one during the run stops it (``signals``)."""
    from sim.runner import Simulator, speed_text
    from twin.scenario import jobs_line

    with signals.raising():  # still starting
        if signals.received:
            raise KeyboardInterrupt
        try:
            sim = Simulator(options)
        except ValueError as exc:  # e.g. a site id that cannot be a topic level
            raise UserError(str(exc)) from None
    sc = options.scenario
    print(
        f"racktwin sim: scenario {sc.name} ({sc.source}): {sc.site.n_cards} cards in {sc.site.n_racks} racks, "
        f"{jobs_line(len(sc.jobs), sc.workload)}, {len(sc.faults)} plant faults, {len(sc.sim_faults)} disconnects; "
        f"site {options.site_id} on {options.mqtt.url}, speed {speed_text(options.speed)}",
        file=sys.stderr,
        flush=True,
    )
    with signals.stopping(sim.stop):
        summary = await sim.run()
    return summary, sim.summary_write_error


def _how_it_stopped(stopped_by: str, signal_name: str | None) -> str:
    """What ended the run, in the report's words: ``stopped by SIGINT`` / ``SIGTERM`` for a signal,
    ``stopped by request`` for :meth:`sim.runner.Simulator.stop` without one, else the summary's
    ``stopped_by`` (``duration``, ``cancelled``)."""
    if stopped_by == "stop":
        return f"stopped by {signal_name}" if signal_name else "stopped by request"
    return f"stopped by {stopped_by}"


def _report(s: SimSummary, options: Any, *, summary_written: bool = True, signal_name: str | None = None) -> None:
    d = s.to_dict()
    pue = d["pue"]
    lines = [
        f"racktwin sim: {_how_it_stopped(s.stopped_by, signal_name)} after {d['duration_s']:,.0f} s of site time "
        f"in {s.wall_s:,.1f} s ({s.speed_achieved:,.2f}x), CPU {s.cpu_share:.0%} of one core",
        f"  energy: IT {d['it_energy_kwh']:,.1f} kWh, facility {d['facility_energy_kwh']:,.1f} kWh, PUE "
        + (f"{pue:.4f}" if pue is not None else "-"),
        f"  work: {d['work_card_s']:,.0f} card-s, jobs finished {d['jobs_finished']:,}, running "
        f"{d['jobs_running']:,}, queued {d['jobs_queued']:,}; from t = 0: racks over limit "
        f"{d['rack_over_limit_s']:,.0f} rack-s, max rack {d['max_rack_power_w'] / 1e3:,.2f} kW, "
        f"max die {d['max_die_temp_c']:.1f} deg C",
        f"  messages: {s.messages_published:,} published, {s.telemetry_dropped:,} dropped while offline; commands "
        f"{s.commands_applied:,} applied, {s.commands_rejected:,} rejected, {s.commands_expired:,} expired"
        + (f", {s.commands_after_end:,} after the end (not taken)" if s.commands_after_end else "")
        + f"; bad messages {d['rejected_messages_total']:,}",
    ]
    if options.truth_log is not None:
        lines.append(f"  truth log: {options.truth_log} ({s.truth_rows:,} rows)")
    if options.summary_path is not None and summary_written:
        lines.append(f"  summary: {options.summary_path}")
    print("\n".join(lines), file=sys.stderr, flush=True)
