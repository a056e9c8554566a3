"""The site clock: the agent's "now" follows the telemetry timestamps, not its own wall clock.

Racks, the facility and the simulator stamp every message with their clock (``ts``, seconds since
the epoch). Against real racks that is wall time; against an accelerated simulator site time runs
``speed`` times faster. Every period, staleness deadline and command expiry of the agent is in site
time, so the agent reads its "now" from the messages it receives:

* :meth:`SiteClock.observe` with each message's timestamp moves the clock forward (never back: a
  late or reordered message does not rewind it);
* between messages, and during a total telemetry blackout, :meth:`SiteClock.now` extrapolates with
  the clock's *rate* (site seconds per wall second). The rate starts at ``1 / time_scale`` (the
  configured ``control.time_scale``) and, with ``infer=True``, follows what the timestamps show:
  the site time gained over the wall time elapsed in a sliding window of ``window_s`` wall seconds;
* the site's clock is the authority: when messages come back after a silence stamped more than
  ``tolerance_s`` (default: 1 s or a quarter wall second of site time) *behind* what the clock had
  extrapolated (the site ran slower than its usual rate meanwhile; or the agent's own event loop
  stalled, :meth:`now` was read after the stall and the messages queued meanwhile were handled
  after it), the clock steps back to them; otherwise it never goes back. Such a message is still
  newer than every stamp seen: only the clock's extrapolation went back, not the site's time
  (``extrapolation_corrections`` counts it). The same when the site's clock itself
  went back (a simulator restarted, a publisher's clock stepped by NTP): messages stamped behind
  the newest timestamp seen are late or reordered ones, ignored, unless the newest one's timeline
  has fallen silent (nothing newer for ``reset_after_s`` wall seconds) and the messages behind it
  keep coming and advancing for ``confirm_s`` wall seconds (in any order within ``tolerance_s``
  of each other: publishers' clocks differ, an ack overtakes a reading): then the clock steps back to them,
  onto a new timeline on which the stamps seen before are the old one's (``timelines_left`` counts
  it). ``corrections`` counts both kinds: what was dated at the clock's now beyond the new now comes
  back in either, what is keyed on the stamps seen only when the clock left their timeline.
  A waiter in :meth:`wait_until` returns at once when the clock steps back, of either kind (its target
  was on the old timeline, or as far ahead of the site's time as the clock had run ahead);
* forward jumps are confirmed the same way: a message stamped more than ``ahead_tolerance_s``
  (default: 10 s or two wall seconds of site time) beyond where the clock expects the site to be
  (its newest timestamp plus the wall time since at its rate) is ignored (``ahead_ignored``,
  ``last_was_ahead``: the ingest drops its readings), unless messages ahead keep coming and
  advancing for ``confirm_s`` wall seconds and outnumber those on the clock's timeline two to one
  meanwhile: then the clock jumps to them (``jumps``; a simulator restarted later, or a first
  message that came from a publisher lagging the others). One bad stamp, or one publisher whose
  clock runs far ahead of the others, does not move the site's time (it used to: every other rack
  read as stale, and the control loop's wait returned at once);
* the first message's timeline is confirmed the same way: until its messages outnumber those behind
  it two to one (after ``confirm_s``), messages stamped behind it that keep coming and advancing for
  ``confirm_s`` and outnumber it two to one meanwhile step the clock back to them (``timelines_left``),
  silent or not: a first message from a publisher far ahead of the others (it used to anchor the
  site's time there, and every other rack read as stale for as long as it kept publishing).

No reading, no time: :meth:`now` is None until the first timestamp arrives.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["SiteClock", "SiteTime"]


class SiteTime(Protocol):
    """What a reader of the site's time uses of :class:`SiteClock`: its time now (None before any reading)
    and its rate."""

    @property
    def rate(self) -> float: ...

    def now(self) -> float | None: ...


class SiteClock:
    """Site time from message timestamps (see the module docstring)."""

    def __init__(
        self,
        time_scale: float = 1.0,
        *,
        infer: bool = True,
        window_s: float = 30.0,
        min_span_s: float = 2.0,
        tolerance_s: float | None = None,
        reset_after_s: float = 2.0,
        confirm_s: float = 1.0,
        ahead_tolerance_s: float | None = None,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self._wall = wall
        self._rate = 1.0 / time_scale
        self._infer = infer
        self._window_s = window_s
        self._min_span_s = min_span_s
        self._anchor_ts: float | None = None  # newest timestamp seen
        self._anchor_wall = 0.0  # wall time it arrived
        self._last_now = -math.inf
        self._tolerance_s = tolerance_s
        self._reset_after_s = reset_after_s
        self._confirm_s = confirm_s
        self._ahead_tolerance_s = ahead_tolerance_s
        # messages behind the newest timestamp after its timeline fell silent: (first wall, first ts, newest ts)
        self._behind: tuple[float, float, float] | None = None
        # messages stamped beyond the clock's extrapolation plus the tolerance, and the others since
        self._ahead: _Run | None = None
        # the first timestamp's timeline until a majority of the messages confirms it
        self._first: _FirstAnchor | None = None
        #: steps back that followed the site's clock back to a new timeline (a site restarted, a clock
        #: stepped, a first timeline outvoted): the stamps seen before are the old timeline's
        self.timelines_left = 0
        #: steps back to a message newer than every stamp seen, only behind the clock's extrapolation (the
        #: clock ran ahead of the site during a silence, or during a stall of the agent's event loop): no
        #: stamp seen went back, only times dated at the clock's now beyond the new now
        self.extrapolation_corrections = 0
        #: forward jumps followed (the site's clock jumped ahead: confirmed as for steps back)
        self.jumps = 0
        #: messages ignored because they were stamped too far ahead of the site clock
        self.ahead_ignored = 0
        #: the last message given to :meth:`observe` was one of them
        self.last_was_ahead = False
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self._slot_wall = -math.inf  # wall time the newest sample's 0.2-s slot began
        self._advanced = asyncio.Event() if _has_loop() else None
        self._target: float | None = None
        #: wall time at which the first message stamped at or after the last :meth:`wait_until`
        #: target arrived (None when extrapolation, not a message, reached it)
        self.target_reached_wall: float | None = None

    # ---- observing --------------------------------------------------------------------------
    def observe(self, ts_s: float) -> bool:
        """A message stamped ``ts_s`` arrived now. Returns True when it moved the clock forward."""
        self.last_was_ahead = False
        if not math.isfinite(ts_s):
            return False
        w = self._wall()
        tol = self._tolerance_s if self._tolerance_s is not None else max(1.0, 0.25 * self._rate)
        jumped = False
        if self._anchor_ts is not None and ts_s > self._anchor_ts and self._too_far_ahead(ts_s, w):
            if not self._site_jumped_ahead(ts_s, w, tol):
                self.ahead_ignored += 1
                self.last_was_ahead = True
                return False
            self._samples.clear()  # the old timeline is gone: its samples would read as a huge rate
            self.jumps += 1
            jumped = True
            run = self._ahead
            if self._infer and run is not None and run.newest_ts > run.first_ts:
                # the run's own pace: where the clock ran too slow (a simulator faster than the rate
                # configured), the next messages would read as far ahead again
                self._rate = (run.newest_ts - run.first_ts) / (run.last_wall - run.first_wall)
        elif self._ahead is not None:
            self._ahead.others += 1  # a message on the clock's timeline (or behind it)
        outvoted = self._first is not None and self._first_outvoted(ts_s, w, tol)
        stepped_back = False
        if self._anchor_ts is not None and ts_s <= self._anchor_ts:
            went_back = self._site_went_back(ts_s, w, tol)
            if not (went_back or outvoted):
                return False
            self._last_now = ts_s  # the old timeline is gone: restart from this message
            self._samples.clear()
            self.timelines_left += 1
            stepped_back = True
        elif ts_s < self._last_now - tol:
            self._last_now = ts_s  # the clock ran ahead of the site during a silence (or a loop stall): step back
            self.extrapolation_corrections += 1
        self._behind = None
        if jumped:
            self._ahead = None
        if jumped or stepped_back:
            self._first = None  # a run of messages confirmed the timeline it follows now
        elif self._anchor_ts is None:
            self._first = _FirstAnchor(first_wall=w)
        self._anchor_ts, self._anchor_wall = ts_s, w
        if self._target is not None and ts_s >= self._target and self.target_reached_wall is None:
            self.target_reached_wall = w
        if self._infer:
            self._sample(w, ts_s)
        if self._advanced is not None:
            self._advanced.set()
        return True

    def _site_went_back(self, ts_s: float, w: float, tol: float) -> bool:
        """A message stamped ``ts_s``, behind the newest timestamp: True once it is clear that the
        site's clock went back (see the module docstring), False for a late or reordered message."""
        assert self._anchor_ts is not None
        if ts_s >= self._anchor_ts - tol or w - self._anchor_wall < self._reset_after_s:
            self._behind = None
            return False
        # a new run of messages behind, unless this one continues the run: not more than ``tol`` behind its
        # newest stamp (messages of one timeline reach the agent slightly out of order: racks' clocks
        # differ by milliseconds, an ack overtakes the reading sent before it; a strict order reset the
        # run at each such message, and a site whose messages interleave so never got confirmed)
        if self._behind is None or ts_s < self._behind[2] - tol:
            self._behind = (w, ts_s, ts_s)
            return False
        first_wall, first_ts, newest_ts = self._behind
        newest_ts = max(newest_ts, ts_s)
        self._behind = (first_wall, first_ts, newest_ts)
        return w - first_wall >= self._confirm_s and newest_ts > first_ts  # kept coming and advanced

    def _first_outvoted(self, ts_s: float, w: float, tol: float) -> bool:
        """While the first timestamp's timeline is not confirmed, a message stamped ``ts_s``: True once
        messages stamped more than ``tol`` behind the newest timestamp keep coming and advancing for
        ``confirm_s`` and outnumber those on the clock's timeline two to one meanwhile (the first
        message came from a publisher far ahead of the others: the rule of forward jumps, the other
        way round). The timeline is confirmed once, after ``confirm_s``, its messages outnumber
        those behind it two to one."""
        first = self._first
        assert first is not None and self._anchor_ts is not None
        run = first.behind
        if ts_s >= self._anchor_ts - tol:  # on the clock's timeline
            first.own += 1
            if run is not None:
                run.others += 1
            if w - first.first_wall >= self._confirm_s and first.own > 2 * (run.count if run is not None else 0):
                self._first = None
            return False
        if run is None or not run.takes(ts_s, w, tol, self._reset_after_s):
            first.behind = _Run(first_wall=w, last_wall=w, first_ts=ts_s, newest_ts=ts_s)  # a new run behind
            return False
        return run.confirmed(w, self._confirm_s)

    def _too_far_ahead(self, ts_s: float, w: float) -> bool:
        """``ts_s`` lies beyond where the clock expects the site to be (its newest timestamp plus the
        wall time since at its rate) by more than the ahead tolerance (default: 10 s or two wall
        seconds of site time, whichever is more)."""
        assert self._anchor_ts is not None
        tol = self._ahead_tolerance_s if self._ahead_tolerance_s is not None else max(10.0, 2.0 * self._rate)
        expected = max(self._anchor_ts + (w - self._anchor_wall) * self._rate, self._last_now)
        return ts_s > expected + tol

    def _site_jumped_ahead(self, ts_s: float, w: float, tol: float) -> bool:
        """A message stamped too far ahead: True once it is clear that the site's clock itself
        jumped (a simulator restarted later, a clock stepped forward; or the clock's first message
        came from a publisher far behind the others): messages ahead keep coming and advancing for
        ``confirm_s`` and outnumber those on the clock's own timeline two to one meanwhile. False
        for one bad stamp, or one publisher far ahead while the others keep the site's time."""
        run = self._ahead
        if run is None or not run.takes(ts_s, w, tol, self._reset_after_s):
            self._ahead = _Run(first_wall=w, last_wall=w, first_ts=ts_s, newest_ts=ts_s)  # a new run ahead
            return False
        return run.confirmed(w, self._confirm_s)

    def _sample(self, wall_s: float, ts_s: float) -> None:
        """One sample per 0.2 wall-s slot (plenty), each the slot's newest message: after a loop stall
        the messages queued meanwhile arrive in one burst, and the burst's first (oldest) stamp
        paired with the wall time of the burst would read as a site that slowed down (the rate, and
        with it :meth:`agent.command_book.CommandBook.stamp_hold_s`, dropped by up to half)."""
        s = self._samples
        if s and wall_s - self._slot_wall < 0.2:
            s[-1] = (wall_s, ts_s)
        else:
            s.append((wall_s, ts_s))
            self._slot_wall = wall_s
        while s and wall_s - s[0][0] > self._window_s:
            s.popleft()
        w0, t0 = s[0]
        if wall_s - w0 >= self._min_span_s and ts_s > t0:
            self._rate = (ts_s - t0) / (wall_s - w0)

    # ---- reading ------------------------------------------------------------------------------
    @property
    def corrections(self) -> int:
        """Every step back of the clock: :attr:`timelines_left` (the site's clock went back) plus
        :attr:`extrapolation_corrections` (the clock's extrapolation ran ahead of the site)."""
        return self.timelines_left + self.extrapolation_corrections

    @property
    def known(self) -> bool:
        return self._anchor_ts is not None

    @property
    def jump_pending(self) -> bool:
        """Messages stamped too far ahead of the clock keep coming (the last within ``reset_after_s``)
        and may yet move it there: a forward jump not confirmed yet (see :meth:`observe`)."""
        run = self._ahead
        return run is not None and self._wall() - run.last_wall <= self._reset_after_s

    @property
    def rate(self) -> float:
        """Site seconds per wall second (1 for real racks)."""
        return self._rate

    @property
    def latest_ts_s(self) -> float | None:
        """The newest timestamp seen."""
        return self._anchor_ts

    def now(self) -> float | None:
        """Site time now: the newest timestamp plus the wall time since it, at the clock's rate."""
        if self._anchor_ts is None:
            return None
        t = self._anchor_ts + (self._wall() - self._anchor_wall) * self._rate
        if t < self._last_now:
            t = self._last_now
        self._last_now = t
        return t

    def stamped_too_far_ahead(self, ts_s: float) -> bool:
        """Whether a message stamped ``ts_s`` lies beyond the site's time by more than the ahead
        tolerance (the rule :meth:`observe` applies), judged without observing it: for stamps that must
        not move the clock (a retained message may come from another timeline). False while the clock
        knows no time."""
        return self._anchor_ts is not None and self._too_far_ahead(ts_s, self._wall())

    def now_or(self, fallback_s: float) -> float:
        """Site time now, ``fallback_s`` while the clock knows none. A site time of 0.0 is a site time
        like any other (a simulator started with ``--start-epoch-s 0``), not a missing one, so callers
        use this rather than ``now() or fallback_s``."""
        now = self.now()
        return fallback_s if now is None else now

    def wall_seconds(self, site_s: float) -> float:
        """How long ``site_s`` of site time takes in wall time at the current rate."""
        return site_s / self._rate

    async def wait_until(self, t_site_s: float, wake: asyncio.Event | None = None, max_sleep_s: float = 0.5) -> bool:
        """Wait until the site clock reaches ``t_site_s`` or steps back (True: of either kind, see
        :attr:`corrections`; the target may then lie as far ahead of the site's time as the clock had
        run ahead), or ``wake`` is set (False)."""
        if self._advanced is None:
            self._advanced = asyncio.Event()
        if self._target != t_site_s:
            self._target = t_site_s
            self.target_reached_wall = None
        corrections = self.corrections
        while True:
            now = self.now()
            if now is not None and now >= t_site_s:
                return True
            if self.corrections != corrections:  # stepped back: the target was on the old timeline
                return True
            if wake is not None and wake.is_set():
                return False
            self._advanced.clear()
            sleep = max_sleep_s if now is None else min(max_sleep_s, max(self.wall_seconds(t_site_s - now), 0.001))
            waiters = [asyncio.ensure_future(self._advanced.wait())]
            if wake is not None:
                waiters.append(asyncio.ensure_future(wake.wait()))
            try:
                await asyncio.wait(waiters, timeout=sleep, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()


@dataclass
class _Run:
    """Messages stamped far ahead of the clock that advance together, and the others meanwhile."""

    first_wall: float
    last_wall: float
    first_ts: float
    newest_ts: float
    count: int = 1
    others: int = 0

    def takes(self, ts_s: float, wall_s: float, tol_s: float, reset_after_s: float) -> bool:
        """Count a message stamped ``ts_s`` into the run when it continues it (not more than ``tol_s``
        behind its newest stamp, within ``reset_after_s`` of its last message); False: a new run."""
        if ts_s < self.newest_ts - tol_s or wall_s - self.last_wall > reset_after_s:
            return False
        self.count += 1
        self.last_wall = wall_s
        self.newest_ts = max(self.newest_ts, ts_s)
        return True

    def confirmed(self, wall_s: float, confirm_s: float) -> bool:
        """The run has lasted ``confirm_s``, advanced (one stamp repeated is no timeline: a stuck clock)
        and outnumbers the messages of the other timeline two to one."""
        return wall_s - self.first_wall >= confirm_s and self.newest_ts > self.first_ts and self.count > 2 * self.others


@dataclass
class _FirstAnchor:
    """The first timestamp's timeline until confirmed: its messages and the run of messages behind it."""

    first_wall: float
    own: int = 1
    behind: _Run | None = None


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
