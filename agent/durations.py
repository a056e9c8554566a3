"""Durations as the progress lines of ``racktwin evaluate`` and ``racktwin demo`` show them (``H:MM:SS``).

Pure formatting, no imports from the rest of the package, so that any command module can use it."""

from __future__ import annotations

import math

#: A float sum of steps may land a hair below a whole second (1799.9999999 s for 1800 s): within
#: this much it counts as the whole second.
_WHOLE_S_TOLERANCE = 1e-6


def hms(t_s: float) -> str:
    """Seconds (>= 0) as ``H:MM:SS``, hours not wrapped (``168:00:00`` for a week), rounded DOWN to the
    second: a progress line must never show more done than is done (3599.6 s of a 1-hour run reads
    ``0:59:59 of 1:00:00``, not a finished ``1:00:00 of 1:00:00``). A value a float sum left within a
    microsecond below a whole second reads as that second. Negative values read as ``0:00:00``."""
    t = max(math.floor(t_s + _WHOLE_S_TOLERANCE), 0)
    return f"{t // 3600}:{t % 3600 // 60:02d}:{t % 60:02d}"


def percent_done(done_s: float, total_s: float) -> int:
    """How much of ``total_s`` is done, in whole percent ROUNDED DOWN, as :func:`hms` rounds: 3599.6 s of
    an hour is 99%, never a 100% beside "s left" (within a microsecond of the whole it is 100%; 100 for
    a total of 0 or less)."""
    if total_s <= 0:
        return 100
    return max(math.floor(100.0 * (done_s + _WHOLE_S_TOLERANCE) / total_s), 0)
