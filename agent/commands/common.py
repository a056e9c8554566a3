"""Helpers shared by the command modules: user-facing errors, paths, JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from twin.spec import SiteSpec, SpecError, load_site


def examples_dir() -> Path:
    """The example files (the embedded defaults are among them): ``examples/`` of the checkout this
    code runs from, else the copy installed with the package (``agent.examples``, pyproject.toml)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "examples" / "supernode-512.toml").is_file():
        return root / "examples"
    return Path(__file__).resolve().parents[1] / "examples"


EXAMPLES_DIR = examples_dir()
DEFAULT_SITE = EXAMPLES_DIR / "supernode-512.toml"


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C (or a SIGTERM, :func:`sigterm_interrupts`) that a command caught to say what it leaves
    behind (``left``: e.g. ``racktwin optimize``'s files written and not): :mod:`agent.cli` ends the
    command with ``racktwin CMD: interrupted: LEFT`` on stderr, exit status 130."""

    def __init__(self, left: str) -> None:
        super().__init__(left)
        self.left = left


class WrittenFiles:
    """Where a command writes its files (``out_dir``, None until it is known) and which of ``names`` (in
    the order it writes them, each whole or not at all: :func:`write_text_replacing`) it has written
    there (``files``, each added by :meth:`wrote` once written), for the line a Ctrl-C or SIGTERM ends
    it with (:class:`Interrupted`: ``racktwin optimize``, ``racktwin evaluate``), or a write that failed
    (:meth:`failed`)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.out_dir: Path | None = None
        self.files: list[str] = []

    def wrote(self, name: str) -> None:
        """``name`` (one of ``names``) is written."""
        self.files.append(name)

    def left(self) -> str:
        """What an interrupted run leaves in ``out_dir``: ``no file written`` (the folder not known yet),
        ``no file written to DIR (...)``, e.g. ``wrote DIR/plan.json; racks.csv, report.html not written
        (...)`` or ``wrote DIR/plan.json, racks.csv, report.html``."""
        if self.out_dir is None:
            return "no file written"
        whole = "none half-written; any from an earlier run are as they were"
        if not self.files:
            return f"no file written to {self.out_dir} ({whole})"
        wrote = f"wrote {self.out_dir / self.files[0]}" + "".join(f", {name}" for name in self.files[1:])
        not_yet = [name for name in self.names if name not in self.files]
        return f"{wrote}; {', '.join(not_yet)} not written ({whole})" if not_yet else wrote

    def failed(self, exc: OSError) -> UserError:
        """The one line a command ends with when writing its files failed after its work was done (a disk
        that filled during the run, a quota, a file replaced by a folder meanwhile; the command prints its
        results first): the file it was writing, the OS error (with the paths it names) and what
        :meth:`left` says, e.g. ``cannot write DIR/racks.csv: No space left on device; wrote
        DIR/plan.json; racks.csv, report.html not written (...)``; exit status 2."""
        name = next((n for n in self.names if n not in self.files), None)
        where = self.out_dir / name if self.out_dir is not None and name is not None else self.out_dir
        paths = [repr(f) if isinstance(f, str) else str(f) for f in (exc.filename, exc.filename2) if f is not None]
        why = f"{exc.strerror or exc}" + (f": {' -> '.join(paths)}" if paths else "")
        return UserError(f"cannot write {where}: {why}; {self.left()}")


class UserError(Exception):
    """A problem the user can fix (bad file, bad option). Printed as one line, exit status 2, or
    ``exit_status`` where the problem may pass by itself (``racktwin agent``'s 75)."""

    def __init__(self, message: str, *, exit_status: int = 2) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def path_arg(text: str) -> str:
    """The ``type`` of every file and folder option: an empty one (``--journal "$UNSET"``) is refused
    as the configuration refuses an empty path, where it would otherwise be read as the current folder
    (``journal .: not a file``; ``demo --out ''`` wrote its files there)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a non-empty path, got ''")
    return text


def load_site_or_fail(path: str | Path | None) -> SiteSpec:
    """Load a site spec; a missing or invalid file becomes a :class:`UserError`."""
    p = Path(path) if path is not None else DEFAULT_SITE
    try:
        return load_site(p)
    except SpecError as exc:
        raise UserError(str(exc)) from None


_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def folder_name(name: str) -> str:
    """A scenario's name as one folder name for the default output folder: characters other than
    ``A-Z a-z 0-9 . _ -`` become ``_`` and leading dots go, so no name leaves ``./out``."""
    return _UNSAFE_IN_NAME.sub("_", name).lstrip(".") or "unnamed"


def prepare_output_dir(
    out_dir: Path, files: Iterable[str], option: str = "--out", *, replaced_whole: Iterable[str] | None = None
) -> None:
    """Create ``out_dir`` (with its parents) and check, before a long run, that the named files can
    be written there: a problem is a :class:`UserError` naming the path, not a traceback at the end.
    ``replaced_whole`` (default: all of ``files``) are the ones written through their
    :func:`temporary_path`, which is checked too."""
    try:
        if out_dir.exists() and not out_dir.is_dir():  # mkdir would say only "File exists"
            raise UserError(f"{option} {out_dir}: exists and is not a folder")
        out_dir.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"{option} {out_dir}: cannot create the folder ({why})") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UserError(f"{option} {out_dir}: the folder is not writable")
    names = tuple(files)
    whole = set(names if replaced_whole is None else replaced_whole)
    for name in names:
        check_output_file(out_dir / name, option, replaced_whole=name in whole)


#: ``--progress-interval-s``'s name (``racktwin demo``, ``racktwin evaluate``, ``racktwin sim``).
PROGRESS_INTERVAL_OPTION = "--progress-interval-s"


def add_progress_interval_argument(
    parser: argparse.ArgumentParser, *, default_s: float, lines: str = "", zero_for_none: bool = False
) -> None:
    """``--progress-interval-s S`` (``args.progress_interval_s``): wall seconds between progress lines, > 0
    (or 0 for none with ``zero_for_none``: ``racktwin sim``, which the demo runs without progress lines),
    checked by :func:`check_progress_interval`; ``lines`` says which lines (e.g. ``" (each policy's run)"``)."""
    parser.add_argument(
        PROGRESS_INTERVAL_OPTION,
        type=float,
        default=default_s,
        metavar="S",
        help=f"wall seconds between progress lines{lines}, > 0{', or 0: none' if zero_for_none else ''} "
        "(default %(default)g)",
    )


def check_progress_interval(interval_s: float, *, zero_for_none: bool = False) -> None:
    """A ``--progress-interval-s`` that is not a positive finite number (nor 0 with ``zero_for_none``) is a
    :class:`UserError`."""
    if not (math.isfinite(interval_s) and (interval_s > 0 or (zero_for_none and interval_s == 0))):
        allowed = "positive, or 0 for no progress lines" if zero_for_none else "positive"
        raise UserError(f"{PROGRESS_INTERVAL_OPTION} must be {allowed}, got {interval_s:g}")


def check_telemetry_period(source: str | Path, telemetry_period_s: float, deadline_s: float, setting: str) -> None:
    """A run scenario's ``telemetry_period_s`` against the agent's ``telemetry_deadline_s`` (which
    ``setting`` says how to change): readings further apart than the deadline leave every rack stale
    between them, and the agent holds stale racks at fail-safe caps (its results would measure that)."""
    if telemetry_period_s > deadline_s:
        raise UserError(
            f"{source}: telemetry_period_s: {telemetry_period_s:g} s is longer than the agent's telemetry_deadline_s "
            f"({deadline_s:g} s, {setting}): every rack would be stale between readings and held at fail-safe "
            f"caps; give at most {deadline_s:g} s"
        )


def check_broker_option(url: str, *, credentials: str) -> None:
    """``--broker URL`` (racktwin sim, racktwin demo): the URLs the agent's ``broker.url`` takes
    (``agent.config.broker_url_problem``); ``credentials`` says where a user name and password go."""
    from agent.config import broker_url_problem

    if (problem := broker_url_problem(url, credentials=credentials)) is not None:
        raise UserError(f"--broker: {problem}")


def check_output_file(path: Path, option: str, *, replaced_whole: bool = False) -> None:
    """A file about to be written: its folder exists and is writable, and the path itself, if it
    exists, is a regular file (not a folder, a device or a pipe, which a write would replace or
    block on). ``replaced_whole``: it is written through its :func:`temporary_path`
    (:func:`write_text_replacing`, the simulator's summary), which must be creatable as well
    (:func:`_check_temporary`)."""
    if "\x00" in str(path):
        raise UserError(f"{option} {str(path)!r}: not a usable path (a NUL character)")
    try:
        folder = path.parent
        if not folder.is_dir():
            raise UserError(f"{option} {path}: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"{option} {path}: the folder {folder} is not writable")
        if path.exists() and not path.is_file():
            raise UserError(f"{option} {path}: exists and is not a regular file")
        if replaced_whole:
            _check_temporary(path, option)
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise UserError(f"{option} {path!r}: not a usable path ({exc})") from None
    except OSError as exc:  # e.g. a name longer than the file system takes
        raise UserError(f"{option} {path}: not a usable path ({exc.strerror or exc})") from None


def _check_temporary(path: Path, option: str) -> None:
    """The temporary file a whole-or-nothing write of ``path`` goes through can be opened for writing:
    its name within what the file system takes, no folder there (nor a link to one), no regular file
    there that may not be written (one a failed run left behind is written over). Where a link or a
    special file there leads a write (a device, a pipe) is left to the write, as a disk that fills is
    (the tests of a write that fails after the work, or is stopped, put one there)."""
    tmp = temporary_path(path)
    what = f"the temporary file {path.name} is written through"
    try:
        name_max = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(tmp.name)) > name_max:
        raise UserError(f"{option} {path}: the name is too long for {what} ({tmp.name}: over {name_max} bytes)")
    if tmp.is_dir():
        raise UserError(f"{option} {tmp}: is a folder ({what}; remove it)")
    if tmp.is_file() and not os.access(tmp, os.W_OK):
        raise UserError(f"{option} {tmp}: exists and is not writable ({what}; remove it)")


def temporary_path(path: Path) -> Path:
    """``NAME.tmp`` in ``path``'s folder: the file a whole-or-nothing write of ``path`` goes through
    before it is renamed over ``path`` (:func:`write_text_replacing`; ``sim.runner.Summary.write``
    names its temporary the same way)."""
    return path.with_name(path.name + ".tmp")


def write_text_replacing(path: Path, text: str, newline: str | None = None) -> None:
    """Write ``text`` to ``path`` whole or not at all: into ``path.tmp`` in the same folder, then renamed
    over ``path`` (``os.replace``), so a run stopped or a disk filled mid-write leaves the earlier
    file as it was, never half of the new one. The temporary file is removed when the write fails.
    ``newline`` as :func:`open`'s (``""`` for CSV text, whose rows end in ``\\r\\n`` already)."""
    tmp = temporary_path(path)
    try:
        tmp.write_text(text, encoding="utf-8", newline=newline)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def json_safe(obj: Any) -> Any:
    """Make an object JSON-safe: numpy scalars/arrays to Python, non-finite floats to null."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "tolist"):
        return json_safe(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (machine-readable output of ``--json``)."""
    json.dump(json_safe(obj), sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")
    sys.stdout.flush()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that the ``finally`` blocks
    that stop what a command started run and the command ends as its ``--help`` says, exit status 130 with
    one line (SIGTERM's default action ends the process at once, exit status 143 with no word:
    ``evaluate``'s worker processes outlived it; ``journal``, ``twin``, ``fit-*`` and ``optimize`` ended
    without saying so, an operator or a scheduler stopping a long one left guessing what was written;
    ``demo``, ``sim`` and ``agent`` have their own, :mod:`agent.commands.command_signals`);
    the previous handler is put back after. Outside an event loop's own handlers (asyncio puts SIGTERM back
    to its default when its loop closes). Neither SIGTERM nor Ctrl-C lands inside a C extension module's
    initialisation (``optimize`` and ``evaluate`` import matplotlib for their reports, and HiGHS, within the
    block): it is handled once that has finished (:mod:`agent.commands.deferred_signals`; it ended them with
    an ImportError traceback or an abort, -6, instead of the line)."""

    from agent.commands.deferred_signals import extension_inits_uninterrupted  # not for `racktwin --help`

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        with extension_inits_uninterrupted():
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)
