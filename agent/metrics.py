"""Prometheus exposition (``/metrics``), liveness (``/healthz``) and readiness (``/readyz``).

Metric names follow Prometheus conventions (base units, ``_total`` for counters, ``_ratio`` for
ratios). Each agent has its own registry, so several can run in one process (tests). The HTTP
server (:class:`HttpEndpoint`) is a small asyncio handler for GET (and HEAD) requests only, bounded in time,
size and connections because it shares the event loop with the control loop; it needs no framework.

/healthz answers 200 while the event loop runs (a hung loop does not answer at all);
/readyz answers 200 once the agent is connected to the broker, has fresh telemetry from every
rack and a working journal, else 503 with the reasons as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

#: Results ``racktwin_commands_total`` counts (docs/agent.md): sent, sent again, acked (applied,
#: rejected, expired: acked too late), closed without an ack (unacked: expired; abandoned: retries
#: used up or standing by for another agent; superseded: a newer command for what it set), and sent
#: without the broker's PUBACK (unconfirmed).
COMMAND_RESULTS = (
    "sent",
    "retried",
    "applied",
    "rejected",
    "expired",
    "unacked",
    "abandoned",
    "superseded",
    "unconfirmed",
)
#: Planners behind a decision (``Decision.source``).
PLAN_SOURCES = ("milp", "greedy", "incremental", "hold")
#: The groups of gauges ``agent.metric_updates`` brings up to date each in its own guarded step, in its
#: order: the ``group`` label of ``racktwin_metrics_group_failing`` -> the group as its log lines name it
#: (``health metrics not updated: <words>: <error>``).
METRICS_GROUPS: dict[str, str] = {
    "broker_link": "broker link",
    "message_counts": "message counts",
    "invalid_readings": "invalid readings",
    "rack_power": "rack power",
    "telemetry_age": "telemetry age",
    "loop_temperatures": "loop temperatures",
    "die_temperatures": "die temperatures",
    "facility": "facility",
    "stuck_sensors": "stuck sensors",
    "open_commands": "open commands",
    "standby": "standby",
    "site_clock": "site clock",
}
#: What ``racktwin_job_snapshot_changes_total`` counts, per job (``agent.job_catchup.Catchup``): a job the
#: agent did not hold, a job whose cards, phase or state it held wrong, a job it held that the snapshot
#: no longer lists.
JOB_SNAPSHOT_CHANGES = ("added", "corrected", "dropped")
#: What ``racktwin_applied_state_disproved_total`` counts, per card and rack
#: (``agent.applied_states.AppliedStates._disprove``, ``IngestStats.applied_disproved``,
#: ``agent.applied_states.DISPROVABLE_SETTINGS``): the setting of a rack's retained applied state that a later
#: reading of the card disproved and no late applied state explained.
APPLIED_SETTINGS = ("level", "power_limit", "low_power")

ReadinessCheck = Callable[[], list[str]]  # returns the reasons it is not ready (empty = ready)


class AgentMetrics:
    """All metrics of one agent, on their own registry."""

    def __init__(self, rack_names: Sequence[str]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rack_names = tuple(rack_names)
        self.rack_power_watts = Gauge("racktwin_rack_power_watts", "Rack power (PDU)", ["rack"], registry=r)
        self.rack_power_limit_watts = Gauge("racktwin_rack_power_limit_watts", "Rack power limit", ["rack"], registry=r)
        self.rack_max_die_temperature_celsius = Gauge(
            "racktwin_rack_max_die_temperature_celsius", "Hottest die in the rack", ["rack"], registry=r
        )
        self.card_die_temperature_celsius = Gauge(
            "racktwin_card_die_temperature_celsius", "Die temperature per card", ["rack", "card"], registry=r
        )
        self.rack_supply_temperature_celsius = Gauge(
            "racktwin_rack_supply_temperature_celsius", "Rack loop supply temperature", ["rack"], registry=r
        )
        self.rack_return_temperature_celsius = Gauge(
            "racktwin_rack_return_temperature_celsius", "Rack loop return temperature", ["rack"], registry=r
        )
        self.telemetry_age_seconds = Gauge(
            "racktwin_telemetry_age_seconds",
            "Site seconds since the rack's stalest source (a card, the loop, the PDU) reported",
            ["rack"],
            registry=r,
        )
        self.rack_failsafe = Gauge(
            "racktwin_rack_failsafe", "1 while a rack is held at fail-safe caps", ["rack"], registry=r
        )
        self.ready = Gauge(
            "racktwin_ready",
            "1 when /readyz answers 200 (connected, fresh telemetry, journal writable...), 0 otherwise; "
            "set at each /metrics rendering",
            registry=r,
        )
        self.pue_ratio = Gauge("racktwin_pue_ratio", "Power usage effectiveness (facility / IT)", registry=r)
        self.it_power_watts = Gauge("racktwin_it_power_watts", "IT power of the site", registry=r)
        self.facility_power_watts = Gauge("racktwin_facility_power_watts", "Facility power of the site", registry=r)
        self.cooling_power_watts = Gauge("racktwin_cooling_power_watts", "Cooling plant power", registry=r)
        self.supply_setpoint_celsius = Gauge("racktwin_supply_setpoint_celsius", "Coolant supply set-point", registry=r)
        self.solve_seconds = Histogram(
            "racktwin_solve_seconds",
            "Control-cycle solve time",
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.control_cycles_total = Counter(
            "racktwin_control_cycles_total", "Control cycles by plan source", ["source"], registry=r
        )
        self.commands_total = Counter(
            "racktwin_commands_total",
            "Commands by result (sent, applied, rejected, expired, ...)",
            ["result"],
            registry=r,
        )
        self.rejected_messages_total = Counter(
            "racktwin_rejected_messages_total", "Incoming MQTT messages rejected, by reason", ["reason"], registry=r
        )
        self.messages_total = Counter(
            "racktwin_messages_total", "Incoming MQTT messages accepted, by kind", ["kind"], registry=r
        )
        self.message_handling_errors_total = Counter(
            "racktwin_message_handling_errors_total",
            "Valid incoming messages whose handling failed (a defect; the message is dropped, the agent goes "
            "on; the log has the traceback)",
            registry=r,
        )
        self.estimation_errors_total = Counter(
            "racktwin_estimation_errors_total",
            "Telemetry rounds whose estimation (the estimator's update, anomaly flags, calibration save) failed "
            "(a defect; the agent goes on with the next round; the log has the traceback)",
            registry=r,
        )
        self.estimation_rounds_dropped_total = Counter(
            "racktwin_estimation_rounds_dropped_total",
            "Telemetry rounds the estimator never took: its queue full (the estimator that far behind), the "
            "oldest round waiting was dropped for each new one (the agent's CPU does not keep up with the "
            "site's telemetry, or its event loop is held up)",
            registry=r,
        )
        self.messages_stamped_ahead_total = Counter(
            "racktwin_messages_stamped_ahead_total",
            "Valid messages stamped far beyond the site clock (a publisher's clock runs ahead): their readings "
            "are not taken",
            registry=r,
        )
        self.late_readings_total = Counter(
            "racktwin_late_readings_total",
            "Card, loop and PDU readings older than what the agent holds (late or reordered): not taken",
            registry=r,
        )
        self.invalid_readings_total = Counter(
            "racktwin_invalid_readings_total",
            "Readings the agent's belief refused, by rack: a card's missing or implausible power, die "
            "temperature, utilization or clock (the rack's other cards are taken), a loop or PDU reading "
            "out of range",
            ["rack"],
            registry=r,
        )
        self.anomalies = Gauge(
            "racktwin_anomalies",
            "Current anomaly flags by kind (fouled plate, weak pump, stuck sensor)",
            ["kind"],
            registry=r,
        )
        self.decision_latency_seconds = Histogram(
            "racktwin_decision_latency_seconds",
            "Wall time from the message that triggers a decision to its first command (or advice) sent",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=r,
        )
        self.decision_seconds = Histogram(
            "racktwin_decision_seconds",
            "Wall time the agent takes to make a decision and hand over its commands, by kind: full "
            "(the periodic plan) or incremental (the adjustment on a job event)",
            ["kind"],
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=r,
        )
        self.decisions_total = Counter(
            "racktwin_decisions_total",
            "Decisions by status (optimal, feasible, fallback, failsafe...)",
            ["status"],
            registry=r,
        )
        self.decision_status = self.decisions_total
        self.plans_total = Counter(
            "racktwin_plans_total",
            "Plans beneath the decisions, by the models' solve status (optimal, feasible, fallback, "
            "infeasible...) and planner (milp, greedy, incremental, hold); a failsafe decision still counts its plan",
            ["status", "source"],
            registry=r,
        )
        self.guard_actions_total = Counter(
            "racktwin_guard_actions_total",
            "What the guard changed in the decisions it let out, one count per explanation line it wrote "
            "(agent.guard.GUARD_ACTIONS); cap_not_held, die_not_held: a rack or a die it cannot hold, no lever left",
            ["action"],
            registry=r,
        )
        self.predicted_rack_power_watts = Gauge(
            "racktwin_predicted_rack_power_watts",
            "Rack power the twin predicts for the last decision",
            ["rack"],
            registry=r,
        )
        self.rack_power_cap_watts = Gauge(
            "racktwin_rack_power_cap_watts", "Rack limit minus margin (what decisions keep to)", ["rack"], registry=r
        )
        self.rack_pump_speed_ratio = Gauge(
            "racktwin_rack_pump_speed_ratio",
            "Rack-loop pump speed the last decision chose (fraction of nominal; 1 without pump control)",
            ["rack"],
            registry=r,
        )
        self.rack_hosts_off = Gauge(
            "racktwin_rack_hosts_off",
            "Hosts of the rack the last decision wants powered off (0 where hosts are not managed)",
            ["rack"],
            registry=r,
        )
        self.queued_jobs = Gauge(
            "racktwin_queued_jobs",
            "Queued jobs the last decision did not place, by why they wait (agent.decision.QUEUE_WAIT_KINDS)",
            ["wait"],
            registry=r,
        )
        self.predicted_facility_power_watts = Gauge(
            "racktwin_predicted_facility_power_watts",
            "Facility power the twin predicts for the last decision",
            registry=r,
        )
        self.ambient_temperature_celsius = Gauge(
            "racktwin_ambient_temperature_celsius", "Outdoor air temperature at the facility", registry=r
        )
        self.open_commands = Gauge(
            "racktwin_open_commands", "Commands journaled and not yet closed (sent or still to send)", registry=r
        )
        self.site_time_seconds = Gauge(
            "racktwin_site_time_seconds",
            "The site clock (epoch seconds, from telemetry timestamps; NaN before its first reading)",
            registry=r,
        )
        self.site_clock_rate = Gauge(
            "racktwin_site_clock_rate_ratio", "Site seconds per wall second (1 against real racks)", registry=r
        )
        self.broker_connected = Gauge("racktwin_broker_connected", "1 while connected to the broker", registry=r)
        self.reconnects_total = Counter("racktwin_broker_reconnects_total", "Broker (re)connections", registry=r)
        self.broker_takeovers_total = Counter(
            "racktwin_broker_takeovers_total",
            "Connections the broker closed within 15 s of their start, the next one let in at once: another "
            "client uses this agent's client id",
            registry=r,
        )
        self.agent_standby = Gauge(
            "racktwin_agent_standby",
            "1 while this agent (enforce mode) sends no command because another agent commands the site, "
            "or may (a retained online status not confirmed yet)",
            registry=r,
        )
        self.competing_agents = Gauge(
            "racktwin_competing_agents",
            "Other agents alive in enforce mode on this site, and other publishers of its commands, while this "
            "agent is in enforce mode (0 in advisory mode)",
            registry=r,
        )
        self.foreign_commands_total = Counter(
            "racktwin_foreign_commands_total",
            "Commands on the site's command topics that this agent did not send (another agent or program)",
            registry=r,
        )
        self.foreign_acks_total = Counter(
            "racktwin_foreign_acks_total",
            "Acks of commands this agent did not send (another agent's, or forged)",
            registry=r,
        )
        self.repeated_acks_total = Counter(
            "racktwin_repeated_acks_total",
            "Acks of commands already acked: copies sent again and answered again, or a broker's second delivery",
            registry=r,
        )
        self.metrics_group_failing = Gauge(
            "racktwin_metrics_group_failing",
            "1 while the update of a group of these metrics fails (a defect; the group's measured series have no "
            "sample, its others keep their last values; the log has the traceback), 0 otherwise",
            ["group"],
            registry=r,
        )
        self.job_snapshot_changes_total = Counter(
            "racktwin_job_snapshot_changes_total",
            "Jobs the scheduler's job snapshot (jobs/state) changed in the agent's job table, by change: added, "
            "corrected, dropped (held queued or running, no longer listed: its events were lost, or the agent "
            "was away)",
            ["change"],
            registry=r,
        )
        self.applied_state_disproved_total = Counter(
            "racktwin_applied_state_disproved_total",
            "Cards whose setting, as their rack's retained applied state confirmed it, a later reading disproved "
            "and no late applied state explained (the card is commanded again), by setting and rack: level (a "
            "clock above the confirmed level's), power_limit (another limit), low_power (awake, confirmed "
            "asleep); the rack reset or changed outside the agent's commands without publishing its applied "
            "state again",
            ["setting", "rack"],
            registry=r,
        )
        self.applied_states_old_total = Counter(
            "racktwin_applied_states_old_total",
            "Applied states of the rack refused for some of their cards: stamped before the one taken for them "
            "(a second publisher for the rack, a stale bridge, or a broker bridge reordering; a rack restarted "
            "on a new timeline, until the agent's clock follows it back); one count per message",
            ["rack"],
            registry=r,
        )
        self.applied_states_old_dropped_total = Counter(
            "racktwin_applied_states_old_dropped_total",
            "Of those, the ones dropped from the agent's book of refused applied states kept to try again at a "
            "new timeline (past agent.refused_applied.REFUSED_KEPT_PER_RACK per rack; the oldest-stamped)",
            ["rack"],
            registry=r,
        )
        for name in self.rack_names:
            self.rack_failsafe.labels(rack=name).set(0)
        for group in METRICS_GROUPS:
            self.metrics_group_failing.labels(group=group).set(0)
        # the facility's readings are unknown until its first one (unlabelled: NaN rather than a 0 W, 0 deg C that
        # is no reading; agent.metric_updates sets NaN again when its readings stop)
        for gauge in self.facility_gauges():
            gauge.set(float("nan"))
        # nor is there a decided set-point or a predicted facility power before the first decision
        self.supply_setpoint_celsius.set(float("nan"))
        self.predicted_facility_power_watts.set(float("nan"))
        # nor a site time before the site clock's first reading (0.0 is one: a simulator's --start-epoch-s 0)
        self.site_time_seconds.set(float("nan"))
        self._zero_counters()

    def facility_gauges(self) -> tuple[Gauge, ...]:
        """The gauges of the facility's readings (NaN while it has none known)."""
        return (
            self.it_power_watts,
            self.facility_power_watts,
            self.cooling_power_watts,
            self.pue_ratio,
            self.ambient_temperature_celsius,
        )

    def _zero_counters(self) -> None:
        """Export every counter series the agent may count from the start, at 0: a series that first
        appears at its first event has no earlier sample, so Prometheus' ``increase()`` (the alert
        rules in deploy/prometheus) would miss that first burst."""
        from agent.decision import STATUSES
        from agent.guard import GUARD_ACTIONS
        from models.plans import SolveStatus

        for result in COMMAND_RESULTS:
            self.commands_total.labels(result=result)
        for rack in self.rack_names:
            self.invalid_readings_total.labels(rack=rack)
        for change in JOB_SNAPSHOT_CHANGES:
            self.job_snapshot_changes_total.labels(change=change)
        for setting in APPLIED_SETTINGS:
            for rack in self.rack_names:
                self.applied_state_disproved_total.labels(setting=setting, rack=rack)
        for rack in self.rack_names:
            self.applied_states_old_total.labels(rack=rack)
            self.applied_states_old_dropped_total.labels(rack=rack)
        for status in STATUSES:
            self.decisions_total.labels(status=status)
        for action in GUARD_ACTIONS:
            self.guard_actions_total.labels(action=action)
        for source in PLAN_SOURCES:
            self.control_cycles_total.labels(source=source)
            for solve in SolveStatus:
                self.plans_total.labels(status=solve.value, source=source)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class HttpEndpoint:
    """The agent's HTTP endpoint: ``/metrics`` (Prometheus text format), ``/healthz``, ``/readyz``.

    Hardened against clients that are slow, many or hostile, since the endpoint shares the event
    loop with the control loop: the request head (request line and headers) must arrive within
    ``head_timeout_s`` in all, a line at most ``max_line_bytes`` with its line end (else 431), at most
    ``max_header_lines`` header lines (else 431); the reply must be taken within ``write_timeout_s``
    (else the connection is dropped, with what the transport still held of the reply); at most
    ``max_connections`` are served at once (one more is answered 503 and closed); ``/metrics`` is
    rendered at most once every ``metrics_max_age_s`` (a burst of scrapes costs one rendering; a
    rendering at 2,048 cards takes ~30 ms). :meth:`close` also ends the connections still open.
    """

    def __init__(
        self,
        metrics: AgentMetrics,
        readiness: ReadinessCheck,
        *,
        max_connections: int = 32,
        head_timeout_s: float = 5.0,
        write_timeout_s: float = 5.0,
        metrics_max_age_s: float = 0.5,
        max_line_bytes: int = 8192,
        max_header_lines: int = 64,
    ) -> None:
        self.metrics = metrics
        self.readiness = readiness
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.write_timeout_s = write_timeout_s
        self.metrics_max_age_s = metrics_max_age_s
        self.max_line_bytes = max_line_bytes
        self.max_header_lines = max_header_lines
        self.port = 0
        self.refused = 0  # connections answered 503 because max_connections were open
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._exposition: tuple[float, bytes] | None = None  # (time.monotonic(), body)

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, limit=max(self.max_line_bytes - 1, 1))
        self.port = int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.gather(*list(self._handlers), return_exceptions=True)

    def _metrics_body(self) -> bytes:
        now = time.monotonic()
        if self._exposition is None or now - self._exposition[0] > self.metrics_max_age_s:
            self.metrics.ready.set(0 if self.readiness() else 1)
            self._exposition = (now, self.metrics.exposition())
        return self._exposition[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            over = len(self._handlers) > self.max_connections
            try:  # (the head is read even when refusing: closing on unread data would reset the answer)
                async with asyncio.timeout(min(self.head_timeout_s, 0.5) if over else self.head_timeout_s):
                    request = await reader.readline()
                    for _ in range(self.max_header_lines + 1):  # the headers, then the empty line
                        if await reader.readline() in (b"\r\n", b"\n", b""):
                            break
                    else:
                        raise ValueError("too many header lines")
            except ValueError:  # a line over max_line_bytes (asyncio's limit), or too many lines
                await self._reply(writer, "GET", "431 Request Header Fields Too Large", "text/plain", b"too large\n")
                return
            if over:
                self.refused += 1
                await self._reply(writer, "GET", "503 Service Unavailable", "text/plain", b"too many connections\n")
                return
            parts = request.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) >= 2 else ("", "")
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, self._metrics_body()
            elif path == "/healthz":
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path == "/readyz":
                reasons = self.readiness()
                status = "200 OK" if not reasons else "503 Service Unavailable"
                ctype = "application/json"
                body = json.dumps({"ready": not reasons, "reasons": reasons}).encode() + b"\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n"
            await self._reply(writer, method, status, ctype, body)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _reply(self, writer: asyncio.StreamWriter, method: str, status: str, ctype: str, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode("latin-1")
        try:
            async with asyncio.timeout(self.write_timeout_s):
                writer.write(head + (b"" if method == "HEAD" else body))
                await writer.drain()
        except TimeoutError:  # not taken in time: drop the connection and what the transport still holds for it
            writer.transport.abort()
            raise


async def serve_http(metrics: AgentMetrics, readiness: ReadinessCheck, host: str, port: int) -> HttpEndpoint:
    """Start the HTTP endpoint (:class:`HttpEndpoint`, defaults); the caller closes it."""
    endpoint = HttpEndpoint(metrics, readiness)
    await endpoint.start(host, port)
    return endpoint
