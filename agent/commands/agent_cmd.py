"""``racktwin agent --config FILE [--check-config]``: the control agent service.

``--check-config`` (or ``--check-config FILE``) validates the configuration (environment
overrides included) and explains it, or names the file and the field that is wrong. Without it the
service runs until SIGTERM / SIGINT (a clean shutdown, exit status 0, whenever it comes: one before the
service runs ends it before it connects); a journal another agent holds, a journal
that cannot be opened, an HTTP host name that does not exist or an HTTP address it may not listen on
stop it at the start (one line naming the field: restarting does not help, and the systemd unit does
not restart it). Two start errors may pass by themselves, at boot above all: the HTTP port still
held (EADDRINUSE: a previous agent still stopping) and the name service not answering yet
(EAI_AGAIN); they are the same one line with its own exit status (:data:`EXIT_TEMPORARY`), which the
unit's ``Restart=on-failure`` retries. A task failing later stops it (the log has the traceback, the
retained status ``error: ...``). An unreachable broker is not an error for a long-running service:
it retries with backoff, says so in the logs, and ``/readyz`` tells why it is not ready.

What each exit status means: :data:`EXIT_STATUSES` (``--help`` and the README's "Exit statuses" give
its words).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agent.commands.command_signals import CommandSignals
from agent.commands.common import UserError, path_arg

if TYPE_CHECKING:
    from agent.config import LoadedConfig

log = logging.getLogger("racktwin.agent")
_T = TypeVar("_T")

#: exit status of a start error that may pass by itself (sysexits.h's EX_TEMPFAIL, "try again later"):
#: not 2, the status of a configuration error, which deploy/systemd's unit does not restart
EXIT_TEMPORARY = 75


def _may_pass(cause: BaseException | None) -> bool:
    """Whether the HTTP endpoint's start error may pass by itself: the name service not answering
    yet (EAI_AGAIN), or the port still held, e.g. by the previous agent still stopping (EADDRINUSE).
    A name that does not exist (EAI_NONAME) or an address not on this host is the configuration's."""
    if isinstance(cause, socket.gaierror):
        return cause.errno == socket.EAI_AGAIN
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


#: how ``racktwin agent`` stops and what each exit status means, as its ``--help`` and the README
#: (Command line) say it
EXIT_STATUSES = (
    "With --check-config: exit status 0 when the configuration is valid (explained on stdout), 2 when it "
    "is not (one line naming the file and the field). Otherwise it runs until SIGTERM or SIGINT (Ctrl-C): "
    "the current cycle finishes, its commands go out, exit status 0. Exit status 2: a bad configuration "
    "or a start problem to fix (one line naming the field); "
    f"{EXIT_TEMPORARY}: a start problem that may pass (the HTTP port still held, the name service not "
    "answering yet); "
    "1: an unexpected error (traceback in the log). An unreachable broker is retried, not an error."
)

#: ``racktwin agent --help``'s epilog: what an operator asks first (how it stops, what its exit statuses
#: mean, where the keys and the health endpoints are described), as docs/agent.md "Running it" says.
AGENT_EPILOG = (
    f"{EXIT_STATUSES} "
    "Every configuration key and RACKTWIN_* variable: docs/agent.md (Configuration); health: /metrics, "
    "/healthz, /readyz on http.port; what it did: racktwin journal --config FILE. "
    "examples: racktwin agent --check-config /etc/racktwin/agent.toml; "
    "racktwin agent --config /etc/racktwin/agent.toml --mode enforce"
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = (
        "The control agent service: it reads the racks' telemetry and the scheduler's job events from an MQTT "
        "broker, keeps the digital twin current, decides every control period (DVFS levels, low-power idle, "
        "placements, hosts off, pump speeds, the coolant set-point), checks each decision with the twin's "
        "physics, journals it and publishes it: advice in advisory mode, commands in enforce mode."
    )
    parser.epilog = AGENT_EPILOG
    parser.add_argument(
        "--config",
        type=path_arg,
        metavar="FILE",
        help="agent configuration (TOML, see examples/agent.toml); required unless --check-config names the file",
    )
    parser.add_argument(
        "--check-config",
        type=path_arg,
        metavar="FILE",
        nargs="?",
        const=True,
        default=None,
        help="validate and explain the configuration (this FILE or --config's), then exit",
    )
    parser.add_argument(
        "--mode",
        choices=("advisory", "enforce"),
        help="override the configuration's mode: advisory publishes each decision as advice and commands "
        "nothing; enforce sends the commands to the racks, the facility and the scheduler",
    )


def config_read(path: str, read: Callable[[str], _T]) -> _T:
    """``read(path)`` of an agent configuration (``agent.config.load_config`` or ``journal_path_of``),
    its problems as a :class:`UserError` naming the file and the field."""
    from twin.tables import SpecError

    try:
        return read(path)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from None


def load_agent_config(path: str, *, check_tls: bool = True) -> LoadedConfig:
    """The agent's configuration (environment overrides included); a problem is a :class:`UserError`
    naming the file and the field. ``check_tls``: read the broker's certificate files too."""
    from agent.config import load_config

    loaded = config_read(path, load_config)
    if not check_tls:
        return loaded
    from agent.mqtt_options import TlsFileError
    from agent.service import mqtt_options

    try:  # the certificate files are read now, so that --check-config vouches for them too
        mqtt_options(loaded.config.broker).ssl_context()
    except TlsFileError as exc:
        raise UserError(f"{path}: broker.tls_{exc.field}: {exc.path}: {exc.why}") from None
    return loaded


def run(args: argparse.Namespace, command: str) -> int:
    check = args.check_config
    if isinstance(check, str) and args.config is not None and Path(check).resolve() != Path(args.config).resolve():
        raise UserError(
            f"--config {args.config} and --check-config {check} name two files: give one "
            "(--check-config alone checks --config's file)"
        )
    path = check if isinstance(check, str) else args.config
    if path is None:
        raise UserError("give the configuration: --config FILE (or --check-config FILE)")
    if check is not None:
        from agent.config import explain

        print(explain(_loaded(path, args.mode)))
        return 0
    # the service: one pair of signal handlers from here to its exit status, not the event loop's (a SIGTERM
    # after the loop closed, asyncio having put its default action back, ended it with exit status 143); a
    # signal before the service runs is remembered, and ends the command before it connects (exit status 0)
    with CommandSignals(interrupting=False) as signals:
        return _run_service(path, _loaded(path, args.mode), signals)


def _loaded(path: str, mode: str | None) -> LoadedConfig:
    """The configuration at ``path``, its mode replaced by ``--mode``'s (None: the file's)."""
    import dataclasses

    loaded = load_agent_config(path)
    if mode is not None:
        loaded = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, mode=mode))
    return loaded


def _run_service(path: str, loaded: LoadedConfig, signals: CommandSignals) -> int:
    """Run the service until SIGTERM or SIGINT (``signals``); its exit status, or a :class:`UserError` for a
    problem at the start."""
    from agent.journal import JournalError, JournalInUseError
    from agent.logs import setup_logging
    from agent.mqtt_options import TlsFileError
    from agent.service import AgentFailed, HttpListenError

    cfg = loaded.config
    setup_logging(cfg.log.level, cfg.log.format)
    try:
        asyncio.run(_serve(loaded, signals))
    except AgentFailed:  # a task failed after the start: logged with its traceback, status "error: ..."
        return 1
    except JournalInUseError as exc:  # another agent runs on this journal
        raise UserError(str(exc)) from None
    except JournalError as exc:  # the journal cannot be opened (folder, permissions, schema)
        raise UserError(f"{path}: journal.path: {exc}") from None
    except TlsFileError as exc:  # a certificate or key file of [broker] that TLS cannot use
        raise UserError(f"{path}: broker: {exc}") from None
    except HttpListenError as exc:  # e.g. the HTTP port is taken, or the host name does not resolve
        if isinstance(exc.__cause__, socket.gaierror):
            message = f"{path}: http.host {exc.host!r}: {exc.strerror or exc}"
        else:
            message = f"{path}: http.port {exc.port} ({exc.host}): {exc.strerror or exc}"
        if not _may_pass(exc.__cause__):
            raise UserError(message) from None
        raise UserError(f"{message} (may pass: exit status {EXIT_TEMPORARY})", exit_status=EXIT_TEMPORARY) from None
    except OSError as exc:  # anything else the operating system refused at the start: say what, not where
        where = f": {exc.filename}" if exc.filename else ""
        raise UserError(f"cannot start: {exc.strerror or exc}{where}") from None
    return 0


async def _serve(loaded: LoadedConfig, signals: CommandSignals) -> None:
    """The service until a signal stops it cleanly (``AgentService.stop``, its name in the log's
    ``stopping (SIGTERM)``). One that came before it runs (while the configuration was read, the event loop
    set up, the service made) ends the command before it connects: the journal, if opened, closed."""
    from agent.service import AgentService

    _quiet_stdout()
    if signals.received:
        _stopped_before_start(signals)
        return
    service = AgentService(loaded)
    if signals.received:
        service.discard()
        _stopped_before_start(signals)
        return

    def stop() -> None:
        service.stop(signals.first.name if signals.first is not None else "asked to")

    with signals.stopping(stop):  # (one that comes in between: the run stops as it begins)
        await service.run()


def _stopped_before_start(signals: CommandSignals) -> None:
    name = signals.first.name if signals.first is not None else "a signal"
    log.info("stopped (%s) before it started: nothing connected or published", name)


def _quiet_stdout() -> None:
    """The service writes nothing to stdout: native libraries' banners (HiGHS) go nowhere."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
