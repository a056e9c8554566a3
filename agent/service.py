"""The agent service: one asyncio TaskGroup of named tasks around the controller.

``await AgentService(load_config("agent.toml")).run()`` until :meth:`AgentService.stop` (SIGTERM / SIGINT in
``racktwin agent``: ``agent.commands.agent_cmd``, with the command's signal handlers). The tasks:

* ``ingest``: every message from the broker (``agent.bus.Bus``: reconnects with randomized backoff
  and subscribes again on every connect) is decoded and validated by ``agent.wire.Codec`` (a
  rejection is counted by reason and ignored) and folded into the belief (``agent.ingest``):
  telemetry rounds into ``twin.state.TwinState`` (freshness per card, loop and PDU), job events,
  acks (into the journal and the command book), applied state; timestamps drive the site clock.
  A message whose handling fails (a defect: it passed validation) is dropped, counted
  (``racktwin_message_handling_errors_total``) and logged with its traceback (at most one a minute;
  the count in between is in the next line): one message does not stop the agent.
* ``estimate`` (``agent.estimation_loop.EstimationLoop``): each telemetry round updates
  ``twin.estimate.Estimator`` (thermal resistance and leakage per card; fouled cold plates and weak
  pumps are flagged in metrics and logs); calibration goes to the journal every
  ``journal.calibration_every_s``. A round whose estimation fails (a defect in the estimator's
  update, the anomaly report or the calibration save) is counted (``racktwin_estimation_errors_total``)
  and logged with its traceback as above (at most one line a minute); the task goes on with the next
  round (a failed calibration save waits its interval). The estimator's update is all or nothing: a
  round that fails in it leaves the estimates as they were. The rounds wait in a queue of 256; the
  task estimates them one a turn of the event loop, and while the queue is full (the estimator that
  far behind) the oldest round is dropped for each new one, counted
  (``racktwin_estimation_rounds_dropped_total``).
* ``control`` (``agent.control_loop.ControlLoop``): every ``control.period_s`` of *site* time, and
  at once (at most every ``min_replan_interval_s``) when a job starts, ends, is requeued or resumes
  computing, or is submitted when the agent places jobs (``agent.controller.decides_again_on``): snapshot ->
  ``Controller.propose`` in a worker thread under ``asyncio.timeout`` shorter than the period (a
  late solve: the greedy plan now, and no new solve until the late one returns) -> ``Guard.review``
  -> journal (the decision and its commands, before anything is sent) -> commands (enforce) or
  advice (advisory). No period is skipped for a slow solve (its deadline is shorter than the period);
  a cycle that overran by more than a period (the event loop held up) is followed by one decision at
  once and the next a period later, not by one for each period missed. The first decision waits for
  every rack to report, or one period (``agent.first_round``).
* ``publish``: commands at QoS 1, in order, never retained; retries and expiry (``agent.publish``).
* ``health``: every second, the metrics (``agent.metrics``, brought up to date by
  ``agent.metric_updates``; first, while connected, the ingest's disprovals whose bound the site clock
  passed are counted, also in a telemetry blackout: :meth:`AgentService._settle_disprovals`), the
  journal file's check and pruning (``agent.journal_upkeep``) and the other agents' silence
  (``agent.standby``); readiness (:meth:`AgentService.readiness`);
  ``/metrics``, ``/healthz``, ``/readyz``.
* ``status``: the agent's status (``agent.status``), below.

The agent's status is retained on ``agent/status`` (``online`` on every connect; the broker's last
will says ``offline`` if the connection dies; a clean shutdown finishes the current cycle, sends what
it decided, waits up to 2 s for the acks of the commands in flight (so the journal records how they
ended) and publishes ``offline`` itself, with the detail ``clean shutdown``, then disconnects (a
connection still being made is let finish, at most the broker's ``connect_timeout_s``, and says
``offline`` instead of ``online``: cancelled, it left the broker the will, ``connection lost``); a
task failing publishes ``offline`` with ``error: <type>: <message>`` and :meth:`AgentService.run`
raises :class:`AgentFailed`).
The journal is locked while the service holds it (a second agent on it is refused,
:class:`agent.journal.JournalInUseError`); a journal that cannot be written (decisions, acks,
calibration, the publisher's record of sends, the jobs and ``card_failed`` marks kept for a restart),
or whose file was removed or replaced, makes the agent not ready (``/readyz``); so does a broker that
leaves commands unacknowledged. A decision, calibration or restart-record write that keeps failing is
logged once, then at most once a minute with a count (``agent.failure_lines.FailureLines``), and once
when it works again. The jobs and ``card_failed`` marks are saved with each decision for a restart
(``agent.resume.RestartRecords``). A restarted agent resumes from its journal (``agent.resume``): the
cycle count, calibration, the jobs it knew, and the commands still open (re-sent if not expired; an
expired command is never sent again). Acks go to the journal in batches (``agent.journal_upkeep``).

Another agent on the site (docs/agent.md, "Another agent on the site"): each run of the agent names
itself in the ``publisher`` of its status and commands (``agent.other_agents.AgentInstance``),
publishes its status every ``agent.status.STATUS_EVERY_S`` (``status`` task) and listens to the
status topic and to the site's command topics (``agent.other_agents.OtherAgents``). Of two agents in
enforce mode the one that started first commands; the other stands by (``agent.standby.Standby``):
it decides and journals as before (mode ``standby``), sends no command, connects under a client id
of its own, says so (``/readyz``, status, log, metrics) and commands again once the first is gone.

This module wires those parts together and keeps what the tasks share: the ingest handlers (messages,
rounds, job events), the health tick and readiness, the standby callbacks and the lifecycle. The
control task is ``agent.control_loop.ControlLoop``; what became of the commands (the acks, the
publisher's sends and closes, the latencies) is ``agent.command_outcomes.CommandOutcomes``; what a
clean shutdown waits for and writes last is ``agent.shutdown``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from agent import wire
from agent.aio import wait_ended
from agent.bus import Bus, LastWill, MqttOptions
from agent.clock import SiteClock
from agent.command_outcomes import CommandOutcomes
from agent.config import BrokerConfig, LoadedConfig
from agent.control_loop import ControlLoop
from agent.controller import Controller
from agent.decision import Decision
from agent.estimation_loop import ClockWentBack, EstimationLoop
from agent.failsafe_log import FailsafeLog
from agent.failure_lines import FailureLines
from agent.ingest import Ingest
from agent.journal import Journal, JournalError
from agent.journal_upkeep import JournalAcks, JournalUpkeep, knows_command
from agent.metric_updates import MetricUpdates
from agent.metrics import AgentMetrics, HttpEndpoint, serve_http
from agent.other_agents import AgentInstance, OtherAgents, Peer
from agent.publish import CommandBook, Publisher
from agent.resume import RestartRecords, load_journal, open_commands_to_resume
from agent.round_merger import RoundMerger
from agent.shutdown import await_acks, journal_last_closes
from agent.solver_output import isolate_solver_output
from agent.standby import Standby
from agent.status import VERSION, StatusPublisher
from twin.estimate import AnomalyHistory, Estimator
from twin.readings import JobEvent, Readings
from twin.state import StateSnapshot, TwinState

__all__ = [
    "VERSION",
    "AgentFailed",
    "AgentService",
    "HttpListenError",
    "mqtt_options",
]

BoolArray = npt.NDArray[np.bool_]

log = logging.getLogger("racktwin.agent")


_ROUND_QUEUE = 256  # telemetry rounds waiting for the estimate task, at most
_HEALTH_INTERVAL_S = 1.0
_UNCONFIRMED_READY_S = 60.0  # wall seconds not ready after the broker left a command unacknowledged
_SHUTDOWN_ACK_WAIT_S = 2.0  # wall seconds a clean shutdown waits for the acks of the commands it sent
_COMMAND_TYPES = (wire.RackCommand, wire.CduCommand, wire.FacilityCommand, wire.SchedulerCommand)


class _Shutdown(Exception):
    """Raised inside the task group to stop the other tasks after a clean shutdown."""


class AgentFailed(RuntimeError):
    """The service stopped because one of its tasks failed (the cause is ``__cause__``); the status it
    published says ``error: ...`` (``detail``), not ``clean shutdown``."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class HttpListenError(OSError):
    """The HTTP endpoint (``[http]`` host and port) could not listen."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc))
        self.host = host
        self.port = port


def _failure_detail(exc: BaseException) -> str:
    """``error: <type>: <message>`` of the first real error in ``exc`` (an exception group unwrapped)."""
    leaf = _first_error(exc)
    text = str(leaf).replace("\n", " ").strip()
    detail = f"error: {type(leaf).__name__}" + (f": {text}" if text else "")
    return detail if len(detail) <= 300 else detail[:297] + "..."


def _first_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, _Shutdown | asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def mqtt_options(broker: BrokerConfig) -> MqttOptions:
    """Client options from the configuration's ``[broker]`` section."""
    return MqttOptions.from_url(
        broker.url,
        username=broker.username,
        password=broker.resolved_password(),
        ca_file=broker.tls_ca_file,
        cert_file=broker.tls_cert_file,
        key_file=broker.tls_key_file,
        client_id=broker.resolved_client_id(),
        clean_session=not broker.persistent_session,
        keepalive_s=int(broker.keepalive_s),
    )


class AgentService:
    """The service (see the module docstring). ``mqtt`` overrides the configuration's broker;
    ``http=False`` starts no HTTP endpoint; ``http_listen=(host, port)`` overrides the configuration's
    (port 0: any free port); ``http_port`` tells the port it listens on. ``controller`` and ``clock``
    replace the ones the configuration makes (tests: a controller of their own, a site clock on a wall
    they move); the one clock is handed to every part that reads the site's time."""

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        mqtt: MqttOptions | None = None,
        controller: Controller | None = None,
        clock: SiteClock | None = None,
        http: bool = True,
        http_listen: tuple[str, int] | None = None,
    ) -> None:
        cfg = loaded.config
        site = loaded.site
        self.loaded = loaded
        self.config = cfg
        self.site = site
        self._rack_index = {name: r for r, name in enumerate(site.rack_names)}  # rack name -> index
        self.mode = cfg.mode
        self.layout = wire.SiteLayout.from_spec(site, site=cfg.site_id)
        self.metrics = AgentMetrics(site.rack_names)
        self.codec = wire.Codec(self.layout, counter=wire.RejectionCounter(logger=logging.getLogger("racktwin.wire")))
        self.state = TwinState(site, stuck_after_readings=cfg.control.stuck_after_readings)
        # one site clock, handed to every part that reads the site's time (a test gives its own here)
        if clock is None:
            clock = SiteClock(cfg.control.time_scale, infer=cfg.control.infer_time_scale)
        self.clock = clock
        self.controller = controller if controller is not None else Controller.from_config(loaded)
        self.journal = Journal(cfg.journal.path, lock=True)  # JournalInUseError: another agent has it
        # from here on any failure closes the journal (and releases its lock): a caller that catches
        # the error and tries again must find the journal free
        try:
            #: this run of the agent (the publisher of its status and commands) and the others on the site
            self.instance = AgentInstance.current()
            self.others = OtherAgents(self.instance)
            self.book = CommandBook(
                site, self.codec, cfg.control, publisher=self.instance.publisher, site_rate=lambda: self.clock.rate
            )
            self.journal_acks = JournalAcks(self.journal)  # acks written in batches (and why the last write failed)
            #: the acks taken in and the publisher's sends and closes: counted, logged, latencies observed
            self.outcomes = CommandOutcomes(
                clock=self.clock,
                book=self.book,
                journal=self.journal,
                journal_acks=self.journal_acks,
                controller=self.controller,
                metrics=self.metrics,
            )
            self.ingest = Ingest(
                site,
                self.state,
                self.clock,
                on_ack=self.outcomes.on_ack,
                on_event=self._on_event,
                on_round=self._on_round,
                telemetry_deadline_s=cfg.control.telemetry_deadline_s,
            )
            self.mqtt = mqtt if mqtt is not None else mqtt_options(cfg.broker)
            t = self.codec.topics
            commands = (t.filter(wire.Kind.RACK_CMD), t.filter(wire.Kind.CDU_CMD), t.facility_cmd, t.scheduler_cmd)
            self.bus = Bus(
                self.mqtt,
                # the status first: another agent's retained status is known before any telemetry
                subscriptions=(t.agent_status, *t.agent_filters(), *commands),
                will=self._will,
                on_connect=self._on_connect,
                name="agent",
            )
            #: whether this agent commands the site or stands by for another, and its status that says so
            self.standby = Standby(
                self.others,
                mode=self.mode,
                site_id=cfg.site_id,
                connected=lambda: self.bus.connected,
                on_stand_by=self._drop_open_commands,
                on_commanding=self._take_up_journal_commands,
            )
            self.status = StatusPublisher(self.bus, self.codec, self.clock, self.standby, mqtt=self.mqtt)
            self.publisher = Publisher(
                self.bus,
                self.book,
                self.journal,
                self.clock,
                cfg.control,
                on_sent=self.outcomes.on_sent,
                on_closed=self.outcomes.on_closed,
                on_unconfirmed=self.outcomes.on_unconfirmed,
                heard_since=self._heard_since,
            )
            self.http = http
            self._http_listen = http_listen
            self.http_port: int | None = None
            self._http_server: HttpEndpoint | None = None
            self._stop = asyncio.Event()
            self._rounds: asyncio.Queue[Readings | ClockWentBack] = asyncio.Queue(maxsize=_ROUND_QUEUE)
            self._merger = RoundMerger()
            self._merger_timelines = 0  # the site clock's new timelines the merger has seen
            self.journal_upkeep = JournalUpkeep(self.journal, cfg.journal.keep_days)  # file checked, old rows pruned
            #: the jobs known and the cards refused as failed, saved with each decision for a restart
            self.restart_records = RestartRecords(self.journal, site)
            self._failure: str | None = None  # why the service stopped, if a task failed
            self._journal_resumed = False  # the journal's open commands were taken up (once commanding)
            #: why the last take-up of the journal's open commands failed (None: none failed since one succeeded)
            self._take_up_error: str | None = None
            self.metric_updates = MetricUpdates(
                self.metrics,
                site,
                state=self.state,
                clock=self.clock,
                codec=self.codec,
                ingest=self.ingest,
                bus=self.bus,
                book=self.book,
                standby=self.standby,
            )
            self.failsafe_log = FailsafeLog(site, cfg.control.telemetry_deadline_s)
            #: the ``estimate`` task: the estimator, the anomalies it flags and the calibration it saves
            self.estimation = EstimationLoop(
                site,
                rounds=self._rounds,
                state=self.state,
                clock=self.clock,
                controller=self.controller,
                journal=self.journal,
                metrics=self.metrics,
                calibration_every_s=cfg.journal.calibration_every_s,
            )
            #: the ``control`` task: when to decide, the decision, and the journal, commands or advice it makes
            self.control = ControlLoop(
                site,
                cfg.control,
                mode=self.mode,
                clock=self.clock,
                state=self.state,
                controller=self.controller,
                estimation=self.estimation,
                ingest=self.ingest,
                book=self.book,
                journal=self.journal,
                restart_records=self.restart_records,
                publisher=self.publisher,
                bus=self.bus,
                codec=self.codec,
                standby=self.standby,
                outcomes=self.outcomes,
                metrics=self.metrics,
                metric_updates=self.metric_updates,
                failsafe_log=self.failsafe_log,
                stop=self._stop,
            )
            #: telemetry rounds dropped unestimated from the ``estimate`` task's full queue (:meth:`_to_estimator`)
            self.rounds_dropped = 0
            #: messages whose handling raised (dropped; see :meth:`_message_failed`)
            self.message_errors = 0
            self._message_error_lines = FailureLines()
            self.resumed_commands = 0
            self.expired_on_resume = 0
            load_journal(self.journal, self.controller, self.state, self.book)
        except BaseException:
            self.journal.close()  # and its lock
            raise

    # ================================================================================================
    # lifecycle
    # ================================================================================================
    def stop(self, why: str = "asked to") -> None:
        """Ask for a clean shutdown: the current cycle finishes, status goes offline, the journal closes."""
        if not self._stop.is_set():  # said once: a stop that hangs is then seen to have begun
            log.info(
                "stopping (%s): the current cycle finishes, its commands go out, acks awaited up to %.0f s",
                why,
                _SHUTDOWN_ACK_WAIT_S,
            )
        self._stop.set()
        self.control.wake()

    def discard(self) -> None:
        """Give up a service made but never run (``racktwin agent`` stopped by a signal while it made it): its
        journal closed (its lock released); nothing was connected or published. Not after :meth:`run`."""
        self.control.close()
        self.journal.close()

    async def run(self) -> None:
        """Run until :meth:`stop` (or until a task fails)."""
        isolate_solver_output()
        listen = self._http_listen
        if listen is None and self.config.http.port:
            listen = (self.config.http.host, self.config.http.port)
        if self.http and listen is not None:
            try:
                self._http_server = await serve_http(self.metrics, self.readiness, listen[0], listen[1])
            except OSError as exc:  # e.g. the port is taken
                self.journal.close()
                raise HttpListenError(listen[0], listen[1], exc) from exc
            self.http_port = self._http_server.port
        log.info(
            "agent starting",
            extra={
                "fields": {
                    "config": self.loaded.source,
                    "overrides": list(self.loaded.overrides),  # RACKTWIN_* variables over the file's values
                    "mode": self.mode,
                    "site": self.site.name,
                    "cards": self.site.n_cards,
                    "broker": self.mqtt.url,
                    "journal": self.config.journal.path,
                    "http_port": self.http_port,
                }
            },
        )
        self.bus.start()
        failure: BaseException | None = None
        try:
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._ingest_task(), name="ingest")
                    tg.create_task(self.estimation.run(), name="estimate")
                    control = tg.create_task(self.control.run(), name="control")
                    tg.create_task(self.publisher.run(), name="publish")
                    tg.create_task(self._health_task(), name="health")
                    tg.create_task(self.status.run(), name="status")
                    tg.create_task(self._shutdown_task(control), name="shutdown")
            except* _Shutdown:
                pass
        except Exception as exc:  # a task failed: never "clean shutdown"
            failure = exc
            self._failure = _failure_detail(exc)
            log.error("agent failed: %s", self._failure, exc_info=_first_error(exc))
        except BaseException as exc:  # cancelled, interrupted: not a clean shutdown either
            self._failure = "cancelled" if isinstance(exc, asyncio.CancelledError) else _failure_detail(exc)
            raise
        finally:
            await self._close()
        if failure is not None:
            raise AgentFailed(self._failure or "error") from _first_error(failure)

    async def _shutdown_task(self, control: asyncio.Task[None]) -> None:
        await self._stop.wait()
        await wait_ended(control)  # the current cycle finishes
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.publisher.step()  # send what that cycle decided
        await await_acks(self.book, self.publisher, self.clock, self.bus, _SHUTDOWN_ACK_WAIT_S)
        raise _Shutdown

    async def _close(self) -> None:
        detail = self._failure or "clean shutdown"
        await self.status.publish_offline(detail)
        # a connection still being made is let finish: its on_connect says offline (_on_connect), then
        # DISCONNECT (cancelled, it left the broker the will: "connection lost" after a clean stop)
        await self.bus.close()
        if self._http_server is not None:
            self._http_server.close()
            with contextlib.suppress(Exception):
                await self._http_server.wait_closed()
        self.control.close()
        try:
            self.journal_acks.write(now_or_never=True)  # the last acks (those a clean stop waited for among them)
            journal_last_closes(self.publisher)
        except Exception:  # a defect: logged, and the journal still closed (its lock released)
            log.exception("journal not brought up to date at shutdown")
        with contextlib.suppress(Exception):
            self.journal.close()
        if self._failure is None:
            # open: journaled, not acked nor expired; a restart sends those still valid again
            open_commands = len(self.book.open)
            log.info("agent stopped", extra={"fields": {"decisions": self.decisions, "open_commands": open_commands}})
        else:
            log.error("agent stopped after an error", extra={"fields": {"decisions": self.decisions, "error": detail}})

    # ================================================================================================
    # status and other agents on the site (agent.status, agent.standby)
    # ================================================================================================
    @property
    def standing_by_for(self) -> Peer | None:
        """The agent this one leaves the site to (standby: it commands nothing), or None."""
        return self.standby.standing_by_for

    def commanding(self) -> bool:
        """Whether the agent sends commands now: enforce mode, and no other agent to leave the site to."""
        return self.standby.commanding()

    def _will(self) -> LastWill:  # the bus asks at each connect (the status publisher is made after it)
        return self.status.will()

    async def _on_connect(self, bus: Bus) -> None:
        if bus.closing:  # connected as the service closes (_close): offline, not online, and the bus disconnects
            await self.status.publish_offline(self._failure or "clean shutdown")
            return
        # the publisher hears of the connection before anything is awaited, and the counter after it:
        # a publisher step that sees the new connection counted sends the open commands again once
        # (told after the status's publish, a step in between sent them and the next sent them again)
        self.publisher.reconnected()
        self.metrics.reconnects_total.inc()
        await self.status.publish_online(bus)

    def _on_command_seen(self, cmd: Any) -> None:
        """A command on the site's command topics: this agent's own (the broker's copy of what it
        sent, or one of an earlier run on its journal) or another publisher's: a sure sign that
        another agent (or a program) commands the site. A command already expired is not counted
        (a copy the broker kept in a persistent session), and one is a sign of life as of its stamp."""
        cid = str(cmd.command_id)
        if cmd.publisher == self.instance.publisher or cid in self.book.open or knows_command(self.journal, cid):
            return
        now = self.clock.now()
        if now is not None and cmd.expires_s <= now:
            return
        age_s = self.clock.wall_seconds(max(now - cmd.ts_s, 0.0)) if now is not None else 0.0
        if self.standby.on_command(cmd.publisher, age_s):
            self.metrics.foreign_commands_total.inc()

    def _drop_open_commands(self) -> None:
        """Standing by: the open commands are not sent again (closed ``abandoned``); the other agent
        decides now."""
        dropped = list(self.book.open.values())
        for oc in dropped:
            self.book.open.pop(oc.command_id, None)
            self.book.forget(oc)
            self.outcomes.never_sent(oc.command_id)
            self.metrics.commands_total.labels(result="abandoned").inc()
        if not dropped:
            return
        # through the publisher: a failed write is kept and tried again (left ``sent``, a restarted
        # agent would take the commands up from the journal and send them again while valid)
        self.publisher.close_abandoned(dropped)
        log.warning("%d open command(s) abandoned: another agent commands the site", len(dropped))

    def _take_up_journal_commands(self) -> None:
        """Once the site time is known and the agent commands: the journal's open commands (once):
        expired ones are closed (never sent again), the others are sent again."""
        now = self.clock.now()
        if self._journal_resumed or now is None:
            return
        try:
            opened, self.expired_on_resume = open_commands_to_resume(self.journal, self.book, now)
        except JournalError as exc:  # e.g. another process holds the write lock: tried again at the next check
            if self._take_up_error is None:
                log.warning("open commands of the journal not taken up yet (tried again): %s", exc)
            self._take_up_error = str(exc)
            return
        self._journal_resumed = True
        self._take_up_error = None
        self.resumed_commands = len(opened)
        self.publisher.submit(opened)

    # ================================================================================================
    # ingest
    # ================================================================================================
    async def _ingest_task(self) -> None:
        async for m in self.bus.messages():
            try:
                if self._take_message(m.topic, m.payload, m.retain) and self.bus.pending() == 0:
                    self._flush()
                    self.journal_acks.write()
            except Exception:  # a defect: this message is lost, not the agent (see the module docstring)
                self._message_failed(m.topic)

    def _message_failed(self, topic: str) -> None:
        """Count the message being handled as failed and log it with the exception's traceback, at
        most once every ``agent.failure_lines.LOG_INTERVAL_S`` (with the number failed since the last line)."""
        self.message_errors += 1
        self.metrics.message_handling_errors_total.inc()
        since = self._message_error_lines.due(self.message_errors)
        if since is None:
            return
        log.exception(
            "a message on %s could not be handled; the agent goes on (%d message(s) dropped since the last such line)",
            topic,
            since,
            extra={"fields": {"topic": topic, "message_handling_errors": self.message_errors}},
        )

    def _take_message(self, topic: str, payload: bytes, retain: bool = False) -> bool:
        """One message from the broker, decoded and taken in; True when it went to the belief
        (:class:`Ingest`), whose round the caller flushes once the client has nothing more waiting."""
        msg = self.codec.decode(topic, payload)
        if isinstance(msg, wire.Rejection):
            return False
        if isinstance(msg, (wire.AgentStatus, *_COMMAND_TYPES)):  # other agents (their stamps: not the clock's)
            if isinstance(msg, wire.AgentStatus):
                self.standby.on_status(msg, retain)
            else:
                self._on_command_seen(msg)
            self.metrics.messages_total.labels(kind=wire.kind_of(msg).value).inc()
            return False
        kind = self.ingest.handle(msg)
        self.metrics.messages_total.labels(kind=kind).inc()
        return True

    def _flush(self) -> None:
        self.ingest.flush()

    def _on_round(self, r: Readings) -> None:
        """A round the belief took in (flushed here, or by the ingest before a job event that came
        right behind it), to the estimator."""
        now = self.clock.now()
        if self.clock.timelines_left != self._merger_timelines and now is not None:
            # the clock went back to a new timeline: the rounds the merger holds are the old timeline's, out
            # first, and so are the parts of r stamped beyond the clock (the ingest's flush as the clock stepped
            # back: the first message came from a publisher an hour ahead, whose round was then held for an
            # hour). Not after a step back of the clock that ran ahead of the site (a silence, a stall of the
            # agent's loop: SiteClock.extrapolation_corrections): every stamp seen, the estimator's included,
            # is behind the new now, the round held is the site's current one, and nothing goes back
            self._merger_timelines = self.clock.timelines_left
            old, new = self._merger.step_back(r, now)
            # and the estimator's time comes back with the clock: after the old timeline's rounds, before
            # the new one's (it kept the old time until the new timeline passed it, and misread a pump step)
            items: list[Readings | ClockWentBack] = [*old, ClockWentBack(now), *new]
        else:
            items = list(self._merger.add(r))
        for item in items:  # the estimator gets whole telemetry rounds
            self._to_estimator(item)

    def _to_estimator(self, item: Readings | ClockWentBack) -> None:
        """Into the ``estimate`` task's queue. When it is full (the estimator far behind) its oldest
        round is dropped (counted: ``rounds_dropped``, ``racktwin_estimation_rounds_dropped_total``); a
        step back of the clock at its head is not dropped but applied now, which is in order: the task
        takes one item at a time and estimates it without awaiting anything (it yields between items
        only), so every round before the head has been estimated."""
        if self._rounds.full():
            oldest = self._rounds.get_nowait()
            if isinstance(oldest, ClockWentBack):
                self.estimation.clock_went_back(oldest.now_s)
            else:
                self.rounds_dropped += 1
                self.metrics.estimation_rounds_dropped_total.inc()
        self._rounds.put_nowait(item)

    def _on_event(self, ev: JobEvent) -> None:
        self.control.on_job_event(ev)  # (the control loop is made after the ingest)

    def _heard_since(self, target: str, site_s: float) -> bool:
        """Whether rack ``target`` sent telemetry stamped after ``site_s`` (the publisher's test of
        a missing ack); True for the facility and the scheduler, whose silence the belief does not
        tell."""
        r = self._rack_index.get(target)
        if r is None:
            return True
        st = self.state
        return bool(max(st.rack_cards_seen_s[r], st.rack_loop_seen_s[r], st.rack_pdu_seen_s[r]) > site_s)

    # ================================================================================================
    # what became of the commands (agent.command_outcomes)
    # ================================================================================================
    @property
    def acks_received(self) -> int:
        """Ack messages taken in (ours, copies answered again, other agents'), a broker's second
        delivery of one not counted."""
        return self.outcomes.acks_received

    @property
    def latencies_s(self) -> collections.deque[float]:
        """Wall seconds from the message that triggered a decision to its first command (or advice) sent."""
        return self.outcomes.latencies_s

    @property
    def latency_kinds(self) -> collections.deque[str]:
        """What triggered each of :attr:`latencies_s`: "period" or "event"."""
        return self.outcomes.latency_kinds

    # ================================================================================================
    # estimate (agent.estimation_loop)
    # ================================================================================================
    @property
    def estimator(self) -> Estimator:
        """The estimator the ``estimate`` task updates (its estimates go into each decision)."""
        return self.estimation.estimator

    @property
    def anomaly_history(self) -> AnomalyHistory:
        """Every anomaly the estimator flagged while the service ran (first flagged at, still flagged)."""
        return self.estimation.anomaly_history

    @property
    def estimation_errors(self) -> int:
        """Telemetry rounds whose estimation raised (dropped by the estimator)."""
        return self.estimation.errors

    # ================================================================================================
    # control (agent.control_loop)
    # ================================================================================================
    @property
    def decisions(self) -> int:
        """Decisions made since the service started."""
        return self.control.decisions

    @property
    def last_decision(self) -> Decision | None:
        """The last decision made (None before the first)."""
        return self.control.last_decision

    @property
    def decision_walls_s(self) -> collections.deque[float]:
        """Wall seconds each decision took to make and hand over (context, plan, guard, journal,
        commands queued)."""
        return self.control.decision_walls_s

    @property
    def decision_kinds(self) -> collections.deque[str]:
        """The kind of each of :attr:`decision_walls_s`: "full" (the periodic MILP decision) or
        "incremental" (on a job event)."""
        return self.control.decision_kinds

    def unplaceable_cards(self, snap: StateSnapshot, now_s: float | None = None) -> BoolArray:
        """Per card, whether a decision at ``now_s`` places no job on it for a ``card_failed`` refusal
        (:meth:`agent.control_loop.ControlLoop.unplaceable_cards`)."""
        return self.control.unplaceable_cards(snap, now_s)

    # ================================================================================================
    # health and metrics
    # ================================================================================================
    async def _health_task(self) -> None:
        failing: str | None = None  # the error of the last metrics update that failed
        while True:
            try:
                self._settle_disprovals()  # before the metrics: a count shows at this tick
                self.metric_updates.update()
            except Exception as exc:  # (each group is guarded in update: this is the rest) say so once per error
                what = f"{type(exc).__name__}: {exc}"
                if what != failing:
                    log.exception("health metrics not updated: %s", what)
                failing = what
            else:
                if failing is not None:
                    log.info("health metrics updated again")
                failing = None
            self.journal_upkeep.check_file()
            self.journal_upkeep.prune()
            self.standby.check()  # agents gone silent, retained statuses that stay unconfirmed
            await asyncio.sleep(_HEALTH_INTERVAL_S)

    def _settle_disprovals(self) -> None:
        """The health tick's settling of the ingest's pending disprovals (``Ingest.settle_disprovals``):
        the ingest settles them after each message, so without this a count waited for the next message
        in a total telemetry blackout. It settles on the site clock's ``now``, which extrapolates from
        the newest stamp in a silence; the newest stamp itself would not help (each message's handling
        already settled on a ``now`` at least that far). Only while connected: in a broker outage the
        applied state that explains a disproval may be what is held up (the broker hands its retained
        copy over on the new subscription), so the count waits for the messages as before."""
        if self.bus.connected:
            self.ingest.settle_disprovals()

    def readiness(self) -> list[str]:
        """Why the agent is not ready (empty: ready): broker, telemetry, journal."""
        reasons: list[str] = []
        if not self.bus.connected:
            err = self.bus.stats.last_error
            reasons.append(f"not connected to the broker {self.mqtt.url}" + (f" (last error: {err})" if err else ""))
        now = self.clock.now()
        if now is None:
            reasons.append("no telemetry received yet")
        else:
            stale = self.state.stale_racks(now, self.config.control.telemetry_deadline_s)
            if stale:
                names = ", ".join(self.site.rack_names[r] for r in stale[:16])
                reasons.append(f"no fresh telemetry from {names}" + (" ..." if len(stale) > 16 else ""))
        if self.control.decision_writes.error:
            reasons.append(f"journal: {self.control.decision_writes.error}")
        if self.journal_acks.error:
            reasons.append(f"journal (acks): {self.journal_acks.error}")
        if self.estimation.calibration_error:
            reasons.append(f"journal (calibration): {self.estimation.calibration_error}")
        if self.restart_records.error:
            reasons.append(f"journal (restart records): {self.restart_records.error}")
        if self._take_up_error is not None:
            reasons.append(f"journal (open commands not taken up yet): {self._take_up_error}")
        if time.monotonic() - self.publisher.last_unconfirmed_wall < _UNCONFIRMED_READY_S:
            reasons.append(f"the broker is not acknowledging commands ({self.publisher.last_unconfirmed_error})")
        for what, err in self.publisher.journal_errors.items():
            reasons.append(f"journal (commands {what}): {err}")
        closes = self.publisher.unjournaled_closes()
        if closes:  # until written: a batch marked sent clears journal_errors before they may be
            by_state = ", ".join(f"{state} {n}" for state, n in closes.items())
            reasons.append(
                f"journal (commands closed): {sum(closes.values())} close(s) not written yet ({by_state}); "
                "a restart would send those commands again while valid"
            )
        if self.journal_upkeep.file_problem:
            reasons.append(self.journal_upkeep.file_problem)
        reasons.extend(self.standby.readiness())
        contested = self.bus.contested()
        if contested is not None:
            reasons.append(contested)
        return reasons
