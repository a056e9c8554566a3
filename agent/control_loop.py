"""The ``control`` task (:class:`ControlLoop`): when the agent decides, what it decides and what it
does with the decision.

When (:meth:`ControlLoop.run`): every ``control.period_s`` of *site* time, and at once (at most every
``min_replan_interval_s``) when a job event asks for it (:meth:`ControlLoop.on_job_event`,
``agent.controller.decides_again_on``) or a checkpoint's end is near (``checkpoint_end_lead_s``);
the first decision waits for every rack to report, or one period (``agent.first_round``). A cycle
that overran by more than a period is followed by one decision at once and the next a period later,
not by one for each period missed; decisions on job events take at most half the wall time.

What (:meth:`ControlLoop.cycle`): snapshot -> ``Controller.propose`` in a worker thread under
``asyncio.timeout`` shorter than the period (a late solve: the greedy plan now, and no new solve
until the late one returns; on a job event the last plan adjusted, ``Controller.propose_incremental``)
-> ``Controller.review`` (the guard, with the refusals in force once the solve returned) ->
``Controller.commit``.

With it (:meth:`ControlLoop.act`): the journal first (the decision and its commands; a decision the
journal cannot take sends nothing and changes nothing), the restart records, then the commands
(enforce: to the publisher), the advice (advisory) or nothing (standby), and the decision's log line.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import math
import time

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.aio import wait_event
from agent.bus import Bus, BusError
from agent.clock import SiteClock
from agent.command_outcomes import CommandOutcomes
from agent.config import ControlConfig
from agent.controller import Controller, decides_again_on
from agent.decision import Decision
from agent.estimation_loop import EstimationLoop
from agent.failsafe_log import FailsafeLog
from agent.failure_lines import WriteFailures
from agent.first_round import await_first_round
from agent.ingest import Ingest
from agent.journal import Journal, JournalError
from agent.metric_updates import MetricUpdates
from agent.metrics import AgentMetrics
from agent.publish import CommandBook, Publisher, new_commands
from agent.resume import RestartRecords
from agent.standby import Standby
from twin.readings import JobEvent
from twin.spec import SiteSpec
from twin.state import StateSnapshot, TwinState
from twin.workload import Phase

__all__ = ["ControlLoop"]

BoolArray = npt.NDArray[np.bool_]

log = logging.getLogger("racktwin.agent")

_DECISIONS_KEPT = 100_000  # decision wall times (and kinds) kept for a benchmark to read


def _report_late_solve(fut: asyncio.Future[Decision]) -> None:
    """A solve that outlived its deadline (its decision went by with the greedy plan): log its error,
    if it failed, when it ends; nobody awaits it any more."""
    if not fut.cancelled() and (exc := fut.exception()) is not None:
        log.error("control: a late solve failed: %r", exc, exc_info=exc)


class ControlLoop:
    """The ``control`` task of the service (see the module docstring), until ``stop`` is set. Its
    inputs are the service's parts it reads or drives; it keeps the decisions' count, the last one,
    the wall time each took and why the last decision write failed (:attr:`decision_writes`)."""

    def __init__(
        self,
        site: SiteSpec,
        config: ControlConfig,
        *,
        mode: str,
        clock: SiteClock,
        state: TwinState,
        controller: Controller,
        estimation: EstimationLoop,
        ingest: Ingest,
        book: CommandBook,
        journal: Journal,
        restart_records: RestartRecords,
        publisher: Publisher,
        bus: Bus,
        codec: wire.Codec,
        standby: Standby,
        outcomes: CommandOutcomes,
        metrics: AgentMetrics,
        metric_updates: MetricUpdates,
        failsafe_log: FailsafeLog,
        stop: asyncio.Event,
    ) -> None:
        self.site = site
        self.config = config
        self.mode = mode
        self.clock = clock
        self.state = state
        self.controller = controller
        self.estimation = estimation
        self.ingest = ingest
        self.book = book
        self.journal = journal
        self.restart_records = restart_records
        self.publisher = publisher
        self.bus = bus
        self.codec = codec
        self.standby = standby
        self.outcomes = outcomes
        self.metrics = metrics
        self.metric_updates = metric_updates
        self.failsafe_log = failsafe_log
        self._stop = stop
        self._replan = asyncio.Event()
        self._replan_wall = 0.0
        # a job event asked for a decision (``_replan`` is also set to wake the control loop when a
        # checkpoint begins, so that it waits for that checkpoint's end too: checkpoint_end_lead_s)
        self._replan_asked = False
        self._last_cycle_wall_s = 0.0
        self._last_cycle_end_wall = 0.0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="racktwin-solve")
        self._solve_future: asyncio.Future[Decision] | None = None
        self.decision_writes = WriteFailures()  # why a decision write failed (a full disk: every cycle)
        #: wall seconds each decision took to make and hand over (context, plan, guard, journal, commands
        #: queued), and its kind: "full" (the periodic MILP decision) or "incremental" (on a job event)
        self.decision_walls_s: collections.deque[float] = collections.deque(maxlen=_DECISIONS_KEPT)
        self.decision_kinds: collections.deque[str] = collections.deque(maxlen=_DECISIONS_KEPT)
        self.decisions = 0
        self.last_decision: Decision | None = None

    def on_job_event(self, ev: JobEvent) -> None:
        """A job event the belief took in (the ingest's ``on_event``): a decision at once where it asks
        for one; a checkpoint's beginning wakes the loop to wait for its end too."""
        control = self.config
        if control.replan_on_job_events and decides_again_on(ev, control.control_placement):
            self._replan_wall = time.monotonic()
            self._replan_asked = True
            self._replan.set()
        elif control.checkpoint_end_lead_s > 0.0 and ev.kind == "phase" and ev.phase == Phase.CHECKPOINT:
            self._replan.set()  # no decision yet: the control loop waits for this checkpoint's end too

    def wake(self) -> None:
        """Wake the loop from its wait (the service's stop: the loop then ends)."""
        self._replan.set()

    def close(self) -> None:
        """The solver's worker thread: a solve still running is not waited for."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self) -> None:
        """The task: decide when due (see the module docstring) until ``stop``."""
        cfg = self.config
        while not self.clock.known:
            if self._stop.is_set():
                return
            await wait_event(self._stop, 0.02)
        now = self.clock.now()
        assert now is not None
        self.standby.check()  # takes up the journal's open commands when this agent commands
        now = await await_first_round(
            now,
            clock=self.clock,
            state=self.state,
            period_s=cfg.period_s,
            telemetry_deadline_s=cfg.telemetry_deadline_s,
            stop=self._stop,
            pending=self.bus.pending,
        )
        next_t = now
        last_cycle = -math.inf
        while not self._stop.is_set():
            now = self.clock.now_or(next_t)
            if next_t > now + cfg.period_s:  # the clock stepped back (see SiteClock): keep the period
                next_t = now + cfg.period_s
            # a checkpoint's end near (checkpoint_end_lead_s) asks for a decision like a job event
            wake_s = math.inf
            if cfg.checkpoint_end_lead_s > 0.0 and last_cycle > -math.inf:
                wake_s = self.controller.checkpoint_wake_s(self.state.jobs.values(), last_cycle)
            target = min(next_t, wake_s)
            reached = await self.clock.wait_until(target, wake=self._replan)
            if self._stop.is_set():
                break
            if not reached and not self._replan_asked:  # a checkpoint began: wait again, for its end too
                self._replan.clear()
                continue
            if reached and target < next_t and self.clock.now_or(-math.inf) >= target:
                reached = False  # (not the period: a step back of the clock also ends the wait, as before)
                self._replan_wall = self.clock.target_reached_wall or time.monotonic()
            trigger_kind = "period" if reached else "event"
            if not reached:
                trigger = self._replan_wall
                # load shedding: decisions on job events take at most half the wall time
                rest = self._last_cycle_end_wall + self._last_cycle_wall_s - time.monotonic()
                if rest > 0 and await wait_event(self._stop, rest):
                    break
                now = self.clock.now_or(next_t)
                if now - last_cycle < cfg.min_replan_interval_s:
                    reached = await self.clock.wait_until(min(next_t, last_cycle + cfg.min_replan_interval_s))
                    if self._stop.is_set():
                        break
                    reached = self.clock.now_or(0.0) >= next_t
            else:  # the message that crossed the period boundary (or now, when the clock got there alone)
                trigger = self.clock.target_reached_wall or time.monotonic()
            # this decision takes every job event in the belief so far, also one that came with the period's
            # message or during the wait for min_replan_interval_s: only a later event asks for another
            self._replan.clear()
            self._replan_asked = False
            now = self.clock.now_or(next_t)
            t0 = time.monotonic()
            await self.cycle(now, trigger, trigger_kind, incremental=not reached)
            self._last_cycle_end_wall = time.monotonic()
            took_s = self._last_cycle_end_wall - t0
            kind = "full" if reached else "incremental"
            self.decision_walls_s.append(took_s)
            self.decision_kinds.append(kind)
            self.metrics.decision_seconds.labels(kind=kind).observe(took_s)
            if not reached:
                self._last_cycle_wall_s = took_s
            last_cycle = now
            if reached:
                next_t += cfg.period_s
                if next_t <= now:  # fell behind by more than a period: decide again one period from now
                    next_t = now + cfg.period_s
            # A cycle need not suspend (a greedy plan while a late solve runs on, journal writes waiting
            # for a lock) and the clock may already be past the next period: give the loop a turn, or
            # cycles that overrun their period follow each other for ever with nothing else running (the
            # late solve's end, telemetry, acks, HTTP, the stop).
            await asyncio.sleep(0)

    def unplaceable_cards(self, snap: StateSnapshot, now_s: float | None = None) -> BoolArray:
        """Per card, whether a decision at ``now_s`` (default: the site clock's now, else ``snap``'s
        time) on the belief's ``snap`` places no job on it for a ``card_failed`` refusal (of a card
        setting or a placement) that marks it, with no reading of it since, or a repeat's hold
        (``CommandBook.unplaceable``): a placement refused onto a card that failed is not made again
        onto it while the rack's telemetry does not show the failure yet, nor, for the hold, onto one
        refused as failed again although its telemetry reads it alive. The decision's
        ``Controller.context`` takes it (``refused_failed``); only placement leaves such a card out,
        the budget and the card's settings follow its readings."""
        now = now_s if now_s is not None else self.clock.now()
        return self.book.unplaceable(
            np.asarray(snap.card_last_seen_s, dtype=np.float64), now if now is not None else snap.time_s
        )

    def _refusals(self, snap: StateSnapshot, now_s: float) -> tuple[BoolArray, BoolArray]:
        """The refusals in force for a decision at ``now_s`` on ``snap``, as ``Controller.context``
        takes them: per card, kept out of placement by a ``card_failed`` refusal
        (:meth:`unplaceable_cards`), and per kind of card setting and card, held back by a refusal
        (``CommandBook.held_back``: the commands carry none, the guard keeps it as reported)."""
        refused = self.unplaceable_cards(snap, now_s)
        held = self.book.held_back(np.asarray(snap.card_failed, dtype=bool) | refused, now_s)
        return refused, held

    async def cycle(self, now: float, trigger_wall: float, trigger_kind: str, *, incremental: bool = False) -> None:
        """One decision at site time ``now``, triggered at ``trigger_wall`` (wall, ``trigger_kind``:
        "period" or "event"): the solve (or, ``incremental``, the last plan adjusted), reviewed and
        committed, then acted on (:meth:`act`)."""
        cfg = self.config
        self.outcomes.ahead_episode_ends(now)
        snap = self.state.snapshot()
        est = self.estimation.estimator.estimates()
        period_wall = self.clock.wall_seconds(cfg.period_s)
        limit = max(min(cfg.solve_deadline_s, 0.6 * period_wall), 0.005)
        refused, held = self._refusals(snap, now)
        ctx = self.controller.context(snap, now, est, time_limit_s=limit, refused_failed=refused, held_back=held)
        proposal: Decision | None = None
        note = ""
        if incremental:  # on a job event: the last plan adjusted, no solve (a few ms, on the loop)
            proposal = self.controller.propose_incremental(snap, ctx)
        elif self._solve_future is None or self._solve_future.done():
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(self._executor, functools.partial(self.controller.propose, snap, ctx))
            try:
                async with asyncio.timeout(max(min(limit + 0.25, 0.9 * period_wall), limit)):
                    proposal = await asyncio.shield(fut)
            except TimeoutError:
                self._solve_future = fut
                fut.add_done_callback(_report_late_solve)
                note = "solve late: greedy plan"
            except Exception as exc:  # the models failed: greedy plan, and say so
                log.exception("control: the solve failed")
                note = f"solve failed ({exc!r}): greedy plan"
        else:
            note = "previous solve still running: greedy plan"
        if proposal is None:
            proposal = self.controller.propose(snap, ctx, use_solver=False)
            proposal = proposal.replace(explanation=(*proposal.explanation, note))
        # refusals acked while the solve ran (the ack path runs meanwhile on the loop) hold settings
        # back from this decision's commands (:meth:`act`) and cards out of its placements: the guard
        # reviews with the refusals in force now, so its budget counts what the cards will draw; and
        # with what the racks confirmed applying now (the levels the commands of :meth:`act` are diffed against):
        # a card no command reaches keeps a confirmed raise or wake its telemetry does not show yet
        refused, held = self._refusals(snap, now)
        ctx = self.controller.with_refusals(
            ctx,
            refused_failed=refused,
            held_back=held,
            applied_level=self.ingest.applied_level,
            applied_power_limit_w=self.ingest.applied_power_limit_w,
            applied_low_power=self.ingest.applied_low_power,
        )
        decision = self.controller.review(proposal, snap, ctx)
        self.controller.commit(decision, snap, ctx)
        self.last_decision = decision
        self.decisions += 1
        await self.act(decision, snap, now, trigger_wall, trigger_kind)
        self.metric_updates.after_decision(decision)

    async def act(self, decision: Decision, snap: StateSnapshot, now: float, trigger_wall: float, kind: str) -> None:
        """The decision journaled (nothing more if that fails: its commands undone in the book), the
        restart records saved, then its commands to the publisher (commanding), its advice sent
        (advisory) or nothing (standing by), and its log line."""
        enforce = self.standby.commanding()
        standby = self.mode == "enforce" and not enforce  # another agent commands the site (or may)
        commands = self.book.commands(decision, snap, self.ingest.applied_level, now) if enforce else []
        summary = decision.summary(self.site.rack_names)
        summary["commands"] = len(commands)
        try:
            decision_id = self.journal.record_decision(
                decision.cycle,
                now,
                "standby" if standby else self.mode,
                decision.status,
                decision.solve_time_s,
                summary,
                new_commands(commands),
            )
            n = self.decision_writes.succeeded()
            if n:
                log.info("journal written again: decisions recorded (after %d failed write(s))", n)
        except JournalError as exc:
            # nothing is acted on that is not journaled first
            since = self.decision_writes.failed_with(str(exc))
            if since is not None:
                log.error(
                    "journal write failed: nothing sent this cycle (%d cycle(s) failed since the last such line)",
                    since,
                    extra={"fields": {"error": str(exc)}},
                )
            # and the open commands theirs would replace stay open as they were: closed superseded, they
            # were no longer held or retried although nothing replaced them on the wire
            self.book.undo(commands)
            return
        # the decision and its commands are journaled (pending): they go out whatever comes of these
        # records (a failed write is logged, makes the agent not ready and is tried again with the next
        # decision; dropping the commands here left them open in the journal, to be sent after a restart,
        # while this run never sent them)
        self.restart_records.save(self.book, snap)
        if enforce:
            if commands:
                self.outcomes.await_first_send(commands[0].command_id, trigger_wall, kind)
                self.publisher.submit(commands)
        elif not standby:
            advice = self.book.advice(decision, snap, self.ingest.applied_level, now)
            try:
                await self.bus.send(self.codec.outgoing(advice), timeout_s=5.0)
                self.outcomes.observe_latency(trigger_wall, kind)
            except BusError as exc:
                log.warning("advice not published: %s", exc)
        log.info(
            "decision",
            extra={
                "fields": {
                    "cycle": decision.cycle,
                    "decision": decision_id,  # the journal's id: racktwin journal --decision ID
                    "site_time_s": round(now, 3),
                    "status": decision.status,
                    "source": decision.source,
                    "solve_s": round(decision.solve_time_s, 4),
                    "supply_c": decision.supply_temp_c,
                    "failsafe": [self.site.rack_names[r] for r in decision.failsafe_racks],
                    "commands": len(commands),
                    "standby": standby,
                    "max_budget_kw": round(float(decision.budget_rack_power_w.max()) / 1e3, 2),
                    "queued_waiting": summary["queue_waits_by_kind"],
                }
            },
        )
        self.failsafe_log.changes(decision, snap, now)
