"""The ``racktwin`` command line: a thin dispatcher over ``agent/commands/<module>.py``.

Each command module defines ``add_arguments(parser, command)`` and ``run(args, command) -> int``
Modules are imported only when their command runs, so ``racktwin --help`` and light commands start
fast (no Pyomo import for ``twin steady``). Errors that users can fix (bad files, bad options) are
raised as :class:`agent.commands.common.UserError` and printed as one line, exit status 2, after the
name of the command (``racktwin twin steady: error: ...``: a command with subcommands sets ``_parser``
to the subcommand's parser in its namespace, as :mod:`agent.commands.twin_cmd` does, and that parser
also reports the arguments it does not know, which argparse leaves to the command's parser).
:func:`main` returns the exit status to an in-process caller in every case: argparse's usage errors
(its message on stderr) are 2 and a command's ``--help`` is 0, not a ``SystemExit``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from agent import racktwin_version
from agent.commands.common import Interrupted, UserError

#: command name -> (module under agent.commands, one-line help). Order is the order in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "closed-loop demo: embedded broker + simulator + agent, summary vs baseline"),
    "agent": ("agent_cmd", "run the control agent service against an MQTT broker"),
    "journal": ("journal_cmd", "what the agent did: decisions, fail-safe racks, commands and acks from its journal"),
    "sim": ("sim_cmd", "run the MQTT rack simulator (virtual plant with workloads and faults)"),
    "optimize": ("optimize", "offline optimization of a scenario: plan.json, per-rack CSV, report.html"),
    "evaluate": ("evaluate", "closed-loop evaluation of control policies over a scenario"),
    "twin": ("twin_cmd", "what-if runs of the digital twin: steady state of a site, supply set-point sweep"),
    "fit-power": ("fit", "fit the card power model to a clock sweep CSV"),
    "fit-thermal": ("fit", "fit a card's thermal resistance and time constant to a time series CSV"),
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="racktwin",
        description=(
            "racktwin keeps liquid-cooled AI racks under their power and thermal limits at the least "
            "energy: a digital twin, Pyomo/HiGHS models and an MQTT control agent."
        ),
        epilog=(
            "Run 'racktwin COMMAND --help' for a command's options; 'racktwin --version' for the version. "
            "Documentation: README.md."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # parsed by _main itself (before any command is imported); declared here for the help's option list
    p.add_argument("--version", action="store_true", help="print racktwin's version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return p


def _exit_status(exc: SystemExit) -> int:
    """The exit status a ``SystemExit`` asks for, as the interpreter reads it: argparse's (0 after
    --help, 2 after a usage error, its message already on stderr); a message instead of a number is
    printed to stderr, status 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``racktwin`` with ``argv`` (default: ``sys.argv[1:]``) and return its exit status: 0 done,
    2 a usage error or a :class:`agent.commands.common.UserError` (one line on stderr), 130 interrupted
    (``racktwin CMD: interrupted``, with what the command leaves behind where it says it:
    :class:`agent.commands.common.Interrupted`), 141 the output's reader went away; a command's own status
    otherwise."""
    try:
        return _main(argv)
    except SystemExit as exc:  # argparse's error() and --help exit; an in-process caller gets the status
        return _exit_status(exc)


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not args:  # a usage error: the help on stderr, as argparse does with its errors
        top.print_help(sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if args[0] == "--version":
        print(f"racktwin {racktwin_version()}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r} (choose from {', '.join(COMMANDS)})")
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(f"agent.commands.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("agent.commands"):
            print(f"racktwin {name}: not available in this build ({exc.name} missing)", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"racktwin {name}", description=help_text)
    module.add_arguments(parser, name)
    ns, unknown = parser.parse_known_args(args[1:])
    own: argparse.ArgumentParser = getattr(ns, "_parser", parser)  # the subcommand's, if it has one
    if unknown:  # argparse says these in the command's name (racktwin twin), not the subcommand's
        own.error(f"unrecognized arguments: {' '.join(unknown)}")
    prog = own.prog
    try:
        return int(module.run(ns, name))
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM too where the command makes it one (sigterm_interrupts)
        left = f": {exc.left}" if isinstance(exc, Interrupted) else ""
        print(f"{prog}: interrupted{left}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `racktwin ... | head`): stop quietly, like standard tools
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the broken stream until exit
        return 141


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
