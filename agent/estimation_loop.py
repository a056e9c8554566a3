"""The service's ``estimate`` task (:class:`EstimationLoop`): each whole telemetry round the ingest
hands over (through a queue) updates ``twin.estimate.Estimator`` (thermal resistance and leakage per
card; the sensors the belief found stuck are no observations). Every ``_ANOMALY_INTERVAL_S`` of site
time the anomalies it flags (fouled cold plates, weak pumps) go to the metrics, and those newly
flagged to the log (``twin.estimate.AnomalyHistory``); every ``journal.calibration_every_s`` the
controller's calibration is brought up to date and saved to the journal. Site time is the site
clock's (``agent.clock``), else the round's own stamp; the first round starts both intervals (the
anomalies are reported at once, the calibration first saved an interval later), and so does a round
at which site time stepped back (a restarted site clock). The task gives the event loop a turn after
each item of the queue, never within one: a backlog (the estimator behind) is estimated a round a
turn, not back to back with the control, ingest, publish and health tasks held up meanwhile.

When the site clock goes back to a new timeline (``SiteClock.timelines_left``), the service puts a
:class:`ClockWentBack` into the queue, between the old timeline's rounds and the new one's (not when
the clock only steps back after running ahead of the site, a silence or a stall of the agent's loop:
every stamp the estimator took is behind the new now, and nothing of it goes back): the estimator's
time and its sources' last readings come back to the new time (``Estimator.clock_went_back``; what
it learnt stays), and with its time the calibration's (``agent.calibration``: its hold runs on the
new timeline). The estimator's time never goes back with a round (a late round is not a step back),
and it kept the old timeline's until the new one passed it: learning did not pause in a pump step, a
small step back dropped the loops' readings as late, and the calibration's hold lasted as long as
the clock had gone back.

A round whose estimation fails (a defect in the estimator's update, the anomaly report or the
calibration save) is counted (``racktwin_estimation_errors_total``) and logged with its traceback
(at most one line a minute, :class:`agent.failure_lines.FailureLines`); the task goes on with the
next round (a failed calibration save waits its interval). The estimator's update is all or
nothing: a round that fails in it leaves the estimates as they were. A calibration write that fails
is kept as :attr:`EstimationLoop.calibration_error` (the agent is not ready) and logged once, then
at most once a minute with a count, and once when it works again.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from agent.clock import SiteClock
from agent.controller import Controller
from agent.failure_lines import FailureLines, WriteFailures
from agent.journal import Journal, JournalError
from agent.metrics import AgentMetrics
from agent.resume import site_layout_json
from twin.estimate import AnomalyHistory, Estimator
from twin.readings import Readings
from twin.spec import SiteSpec
from twin.state import TwinState

__all__ = ["ClockWentBack", "EstimationLoop"]

log = logging.getLogger("racktwin.agent")

_ANOMALY_INTERVAL_S = 10.0  # site seconds between two reports of the anomalies flagged


@dataclass(frozen=True)
class ClockWentBack:
    """In the ``estimate`` task's queue, after the old timeline's rounds and before the new one's: the
    site's clock went back to ``now_s`` (``agent.clock.SiteClock``; the service puts it there as the
    clock goes back to a new timeline)."""

    now_s: float


class EstimationLoop:
    """The estimator and what it flags, fed by :meth:`run` from ``rounds`` (whole telemetry rounds),
    with the calibration it hands ``controller`` saved to ``journal`` every ``calibration_every_s``
    of site time (see the module docstring)."""

    def __init__(
        self,
        site: SiteSpec,
        *,
        rounds: asyncio.Queue[Readings | ClockWentBack],
        state: TwinState,
        clock: SiteClock,
        controller: Controller,
        journal: Journal,
        metrics: AgentMetrics,
        calibration_every_s: float,
    ) -> None:
        self.site = site
        self.rounds = rounds
        self.state = state
        self.clock = clock
        self.controller = controller
        self.journal = journal
        self.metrics = metrics
        self.calibration_every_s = calibration_every_s
        self.estimator = Estimator(site)
        #: every anomaly the estimator flagged while the service ran (first flagged at, still flagged)
        self.anomaly_history = AnomalyHistory()
        #: telemetry rounds whose estimation raised (dropped by the estimator; see :meth:`_round_failed`)
        self.errors = 0
        self._error_lines = FailureLines()
        self._calibration_writes = WriteFailures()
        self._site_layout_json = site_layout_json(site)  # kept with the calibration

    @property
    def calibration_error(self) -> str | None:
        """Why the last calibration write failed (None: it worked, or none was tried): the agent is not ready."""
        return self._calibration_writes.error

    async def run(self) -> None:
        """The ``estimate`` task: every round (and step back of the site clock) from the queue, for ever."""
        last_cal = -math.inf
        last_anomaly = -math.inf
        while True:
            # a turn for the other tasks between two items, never within one: get() suspends nothing while
            # items wait, and a backlog (up to the queue's bound, 256 rounds, ~10 ms each at 8,192 cards)
            # would hold up the control, ingest, publish and health tasks for seconds. Whenever this task is
            # suspended, every item it took has been handled (the service's _to_estimator relies on it).
            await asyncio.sleep(0)
            r = await self.rounds.get()
            if isinstance(r, ClockWentBack):
                self.clock_went_back(r.now_s)
                continue
            try:
                # sensors the belief found stuck are no observations (the belief has this round already)
                self.estimator.update(r, frozen_cards=self.state.stuck_cards(), frozen_racks=self.state.stuck_racks())
                clock_now = self.clock.now()
                now = r.time_s if clock_now is None else clock_now  # a clock at 0.0 s is a time too
                if now - last_anomaly >= _ANOMALY_INTERVAL_S or now < last_anomaly:  # or the clock stepped back
                    last_anomaly = now
                    self._report_anomalies(now)
                if now < last_cal:  # the site clock stepped back: the interval starts again from the new time
                    last_cal = now
                if now - last_cal >= self.calibration_every_s:
                    first, last_cal = last_cal == -math.inf, now  # a save that fails waits its interval too
                    if not first:
                        self._save_calibration(now)
            except Exception:  # a defect: this round's update, anomaly report or save fails, not the agent
                self._round_failed(r.time_s)

    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s``: the estimator's time and its sources' last readings
        come back to it (``twin.estimate.Estimator.clock_went_back``), and with the estimates' time the
        calibration's (``agent.calibration.Calibration.update``)."""
        self.estimator.clock_went_back(now_s)

    def _round_failed(self, round_s: float) -> None:
        """Count the round being estimated as failed and log it with the exception's traceback, at most
        once every ``agent.failure_lines.LOG_INTERVAL_S`` (with the number failed since the last line)."""
        self.errors += 1
        self.metrics.estimation_errors_total.inc()
        since = self._error_lines.due(self.errors)
        if since is None:
            return
        log.exception(
            "the estimation of the telemetry round at %.1f failed; the agent goes on (%d round(s) failed since "
            "the last such line)",
            round_s,
            since,
            extra={"fields": {"round_s": round_s, "estimation_errors": self.errors}},
        )

    def _report_anomalies(self, now_s: float) -> None:
        found = self.estimator.anomalies()
        counts: dict[str, int] = {"fouled_cold_plate": 0, "weak_pump": 0}
        for a in found:
            counts[a.kind] = counts.get(a.kind, 0) + 1
        for a in self.anomaly_history.update(found, now_s):
            log.warning(
                "anomaly: %s",
                a.detail,
                extra={"fields": {"kind": a.kind, "rack": self.site.rack_names[a.rack], "card": a.card}},
            )
        for kind, n in counts.items():
            self.metrics.anomalies.labels(kind=kind).set(n)

    def _save_calibration(self, now_s: float) -> None:
        self.controller.update_calibration(self.estimator.estimates())
        cards, r_th, leak = self.controller.calibration()
        if cards.size == 0:
            return
        try:
            self.journal.save_calibration(cards, r_th, leak, now_s, layout=self._site_layout_json)
        except JournalError as exc:  # degraded (not ready), not stopped: the calibration is kept in memory
            since = self._calibration_writes.failed_with(str(exc))
            if since is not None:
                log.error(
                    "journal write failed: calibration not saved (%d failed since the last such line)",
                    since,
                    extra={"fields": {"error": str(exc)}},
                )
            return
        n = self._calibration_writes.succeeded()
        if n:
            log.info("journal written again: calibration saved (after %d failed write(s))", n)
