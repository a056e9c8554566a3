"""What the parts of the run-scenario loader (``twin.scenario``) share: the limits of a run's
duration, a constructor's ValueError turned into a :class:`twin.tables.SpecError` at a field, and
the check that a fault or a listed job happens before the end of the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from twin.tables import SpecError

T = TypeVar("T")

#: Shortest run: one step of the plant (``Plant.run``'s and the simulator's default ``dt_s``). A
#: shorter run records nothing (``racktwin evaluate --duration 0.5`` would report a 0 kW rack).
MIN_DURATION_S = 1.0

#: Longest run: a year (365 days), in the file (``duration_s``) and as an override (``--duration``
#: of sim and evaluate). More is nothing an operator simulates, and the generated workload grows with
#: the run: a year of the example site's (512 cards at 65% allocation) is ~380,000 jobs, drawn in
#: ~15 s with ~0.3 GB; 1e10 s (the limit before) would have been ~120 million jobs, ~100 GB.
MAX_DURATION_S = 365 * 86400.0


def wrap_value_error(source: str, where: str, make: Callable[[], T]) -> T:
    """Run a constructor; its ValueError becomes a SpecError at ``where``."""
    try:
        return make()
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(source, where, str(exc)) from None


def check_before_end(
    start_s: float,
    source: str,
    where: str,
    duration_s: float,
    shortened_from_s: float | None,
    warn: Callable[[str], None],
    outcome: tuple[str, str],
) -> None:
    """A fault that starts, or a listed job submitted, at or after the end of the run would never
    happen: an error, or a warning where the file's own duration reaches it and only an override
    shortened the run. ``outcome``: what the error says, what the warning says."""
    if start_s < duration_s:
        return
    never, not_in_this_run = outcome
    if shortened_from_s is not None and start_s < shortened_from_s:
        warn(
            f"{source}: {where}: {start_s:g} s is at or after the end of this run ({duration_s:g} s, "
            f"shortened from {shortened_from_s:g} s): {not_in_this_run}"
        )
        return
    raise SpecError(source, where, f"{start_s:g} s is at or after the end of the run ({duration_s:g} s): {never}")
