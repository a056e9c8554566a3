"""The MQTT rack simulator: a ``twin.plant.Plant`` behind the racktwin protocol (``agent.wire``).

:class:`Simulator` steps the scenario's plant (``twin.scenario.build_plant``) in a loop paced
against the wall clock (``speed`` site seconds per wall second; 0 or inf: as fast as possible),
publishes its telemetry every ``telemetry_period_s`` of site time (``sim.telemetry``), publishes job
events as they happen, applies the commands it receives and acks each (``sim.commands``), runs the
simulator-level faults (``sim.chaos``), keeps a ground-truth log (``sim.truth``) and ends with a
summary (:class:`SimSummary`, optionally written as JSON). Documentation: docs/sim.md.

The site clock: ``site_time_s = start_epoch_s + plant.time_s``; every ``ts`` the simulator sends
and every command expiry it judges use it. When the loop cannot keep up with ``speed`` it never
skips physics: it runs late (``behind_s`` in the progress line and the summary) and catches up when
it can.

Concurrency: one asyncio task steps the plant and publishes; commands are handled as they arrive
by a consumer task between steps (the plant is only touched from the event loop, never from two
places at once), so a command is applied at the plant time of the last completed step. The
consumer applies a burst of commands at once and publishes its answers pipelined (acks in order,
one applied state per rack), so acks do not trail the commands by a round trip each. A change the
plant makes itself to what a rack's applied state says (cards woken for a job the plant placed,
a card failing asleep or repaired on an off host: ``CommandHandler.note_plant_changes``) is
published after the step that made it, in the same queue as the answers of the bursts (so the
applied states of a rack go out in the order of their ``seq``), or with the answers of the burst
open then.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from agent import wire
from agent.aio import cancel_and_wait, wait_event
from agent.bus import Bus, BusError, BusNotConnected, MqttOptions
from sim.chaos import DisconnectSchedule
from sim.commands import CommandHandler
from sim.telemetry import TelemetryEncoder
from sim.truth import TruthLog
from twin.plant import Accounting, Plant
from twin.scenario import RunScenario, build_plant

__all__ = ["MAX_START_EPOCH_S", "PUBLISHER", "SimOptions", "SimSummary", "Simulator"]

log = logging.getLogger("racktwin.sim")

#: The ``publisher`` field of everything the simulator sends.
PUBLISHER = "sim"
#: Job events kept while the link is down (older ones are dropped beyond this).
EVENT_BACKLOG = 10_000
#: wall seconds the end of a run waits for the answers (acks, applied state) of the commands taken
ANSWER_DRAIN_S = 5.0
_EPS_S = 1e-9
#: latest ``start_epoch_s`` accepted (year 2286): a larger value is not epoch seconds (milliseconds?)
MAX_START_EPOCH_S = 1e10


#: Speeds written in digits (:func:`speed_text`): from this one up, and below :data:`_DIGITS_FROM_SPEED`,
#: an exponent (``1e300x`` in digits is 301 of them).
_DIGITS_BELOW_SPEED = Decimal("1e12")
_DIGITS_FROM_SPEED = Decimal("1e-9")


def speed_text(speed: float) -> str:
    """A ``speed`` (site seconds per wall second) as the run's lines write it: ``as fast as possible`` for
    0 or inf; else to six significant digits, with thousands separators and no exponent from 1e-9 up to
    below 1e12 (``1,000,000,000x``, ``2,000x``, ``0.5x``; ``:,g`` wrote ``1e+09x``), with one outside it
    (``1e-12x``; ``1.5e15x (out of reach: as fast as it can)``, where the digits ran to hundreds for
    ``--speed 1e300``). A finite speed the loop cannot reach (1e9) also runs as fast as it can, but is
    still a rate: its progress lines say how far BEHIND it runs, and it keeps its issue-ahead tolerance
    (:attr:`SimOptions.max_issue_ahead_s`)."""
    if speed == 0 or math.isinf(speed):
        return "as fast as possible"
    rounded = Decimal(f"{speed:.6g}")
    if _DIGITS_FROM_SPEED <= rounded < _DIGITS_BELOW_SPEED:
        return f"{rounded:,f}x"
    mantissa, _, exponent = f"{rounded:e}".partition("e")
    text = f"{mantissa}e{int(exponent)}x"
    return f"{text} (out of reach: as fast as it can)" if rounded >= _DIGITS_BELOW_SPEED else text


@dataclass
class SimOptions:
    """How to run a scenario (see the module docstring).

    ``mqtt``: the broker (``client_id`` defaults to ``racktwin-sim-{site_id}``; the session is
    persistent across the run's own reconnects, and a run starts by discarding what the broker kept
    of an earlier run's session, see ``sim.chaos``). ``duration_s``: default the scenario's.
    ``start_epoch_s``: the site clock at t = 0 (default: the wall clock when the run starts).
    ``step_s``: the plant's time step (site s; shortened to land on every telemetry period, plant
    fault edge and broker-disconnect edge).
    ``progress``: called with a progress line every ``progress_interval_s`` of wall time.
    """

    scenario: RunScenario
    mqtt: MqttOptions
    site_id: str = "site1"
    speed: float = 1.0
    duration_s: float | None = None
    truth_log: Path | None = None
    summary_path: Path | None = None
    start_epoch_s: float | None = None
    step_s: float = 1.0
    progress: Callable[[str], None] | None = None
    progress_interval_s: float = 5.0
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if math.isnan(self.speed) or self.speed < 0:
            raise ValueError(f"speed must be >= 0 (0 or inf: as fast as possible), got {self.speed}")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s must be a positive number of seconds, got {self.duration_s}")
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"step_s must be positive, got {self.step_s}")
        if self.start_epoch_s is not None and not (0 <= self.start_epoch_s <= MAX_START_EPOCH_S):
            raise ValueError(f"start_epoch_s must be epoch seconds, got {self.start_epoch_s}")

    @property
    def as_fast_as_possible(self) -> bool:
        return self.speed == 0 or math.isinf(self.speed)

    @property
    def max_issue_ahead_s(self) -> float:
        """How far a command's issue time may lie ahead of the site clock: ``wire.MAX_ISSUE_AHEAD_S``
        or ten wall seconds of site time at ``speed``, whichever is more: an agent's clock follows
        the telemetry at its rate and runs ahead of a simulator starved of CPU (with two wall
        seconds, 40 s at 20x, a test on a loaded 2-core machine had 6 of 21 commands refused); a
        rack bridge's clock does not stall with its process. As fast as possible,
        ``wire.MAX_COMMAND_TTL_S`` (no wall rate to measure by)."""
        if self.as_fast_as_possible:
            return wire.MAX_COMMAND_TTL_S
        return max(wire.MAX_ISSUE_AHEAD_S, 10.0 * self.speed)


@dataclass
class SimSummary:
    """What a run did. :meth:`to_dict` is the ``--summary`` JSON (keys: docs/sim.md)."""

    scenario: str
    site: str
    site_id: str
    n_cards: int
    n_racks: int
    rack_power_limit_w: float
    accounting: Accounting
    start_epoch_s: float
    site_time_s: float  # the site clock at the end
    wall_s: float
    cpu_s: float
    speed_requested: float
    messages_published: int = 0
    card_readings_published: int = 0
    telemetry_dropped: int = 0  # messages not published because the link was down
    job_events_published: int = 0
    commands_applied: int = 0
    commands_rejected: int = 0
    commands_expired: int = 0
    commands_superseded: int = 0  # rejected (in commands_rejected): a command issued later had been applied
    commands_duplicate: int = 0  # copies of commands already answered: answered again, not applied
    commands_malformed: int = 0  # messages on command topics the codec refused (acked rejected when possible)
    commands_unanswered: int = 0  # ... of which carried no readable command_id: no ack
    commands_after_end: int = 0  # received after the run's end: neither applied nor answered
    commands_by_target: dict[str, dict[str, int]] = field(default_factory=dict)
    command_refusals: dict[str, int] = field(default_factory=dict)
    rejected_messages: dict[str, int] = field(default_factory=dict)
    disconnects: int = 0  # planned (broker_disconnect faults)
    link_losses: int = 0  # unplanned (broker gone) as the MQTT client saw them
    max_rack_power_w: float = 0.0
    max_behind_s: float = 0.0
    truth_rows: int = 0
    stopped_by: str = "duration"  # "duration", "stop" (signal / Simulator.stop) or "cancelled"

    @property
    def speed_achieved(self) -> float:
        return self.accounting.time_s / self.wall_s if self.wall_s > 0 else math.inf

    @property
    def cpu_share(self) -> float:
        """CPU time of this process per wall second (1.0 = one core busy)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        a = self.accounting
        it_kwh = a.it_energy_j / 3.6e6
        fac_kwh = a.facility_energy_j / 3.6e6

        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "scenario": self.scenario,
            "site": self.site,
            "site_id": self.site_id,
            "n_cards": self.n_cards,
            "n_racks": self.n_racks,
            "duration_s": a.time_s,
            "start_ts_s": self.start_epoch_s,
            "end_ts_s": self.site_time_s,
            "wall_s": self.wall_s,
            "speed_requested": num(self.speed_requested),
            "speed_achieved": num(self.speed_achieved),
            "max_behind_s": self.max_behind_s,
            "cpu_s": self.cpu_s,
            "cpu_share": self.cpu_share,
            "stopped_by": self.stopped_by,
            "it_energy_kwh": it_kwh,
            "cooling_energy_kwh": a.cooling_energy_j / 3.6e6,
            "facility_energy_kwh": fac_kwh,
            "pue": num(a.pue),
            "work_card_s": a.work_card_s,
            "lost_work_card_s": a.lost_work_card_s,
            "throughput_card": a.throughput_card,
            "facility_energy_per_work_j": num(a.facility_energy_per_work_j),
            "jobs_submitted": a.jobs_submitted,
            "jobs_finished": a.jobs_finished,
            "jobs_failed": a.jobs_failed,
            "jobs_running": a.jobs_running,
            "jobs_queued": a.jobs_queued,
            "slo_violation_s": a.slo_violation_s,
            "rack_power_limit_w": self.rack_power_limit_w,
            "rack_over_limit_s": a.rack_over_limit_s,
            "rack_over_limit_kwh": a.rack_over_limit_j / 3.6e6,
            "max_rack_power_w": self.max_rack_power_w,
            "max_die_temp_c": a.max_die_temp_c,
            "throttled_card_s": a.throttled_card_s,
            "commands_applied": self.commands_applied,
            "commands_rejected": self.commands_rejected,
            "commands_expired": self.commands_expired,
            "commands_superseded": self.commands_superseded,
            "commands_duplicate": self.commands_duplicate,
            "commands_malformed": self.commands_malformed,
            "commands_unanswered": self.commands_unanswered,
            "commands_after_end": self.commands_after_end,
            "commands_by_target": self.commands_by_target,
            "command_refusals": self.command_refusals,
            "rejected_messages": self.rejected_messages,
            "rejected_messages_total": sum(self.rejected_messages.values()),
            "messages_published": self.messages_published,
            "card_readings_published": self.card_readings_published,
            "telemetry_dropped": self.telemetry_dropped,
            "job_events_published": self.job_events_published,
            "disconnects": self.disconnects,
            "link_losses": self.link_losses,
            "truth_rows": self.truth_rows,
        }

    def write(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as JSON (atomically: a reader never sees half a file). ``path``, if
        it exists, must be a regular file: a folder, a device or a pipe there is never replaced
        (``OSError``)."""
        p = Path(path)
        if p.exists() and not p.is_file():
            raise OSError(f"{p} exists and is not a regular file (not replaced)")
        tmp = p.with_name(p.name + ".tmp")  # as agent.commands.common.temporary_path: racktwin sim checks it first
        try:
            tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, p)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


class Simulator:
    """See the module docstring. ``await Simulator(options).run()`` -> :class:`SimSummary`."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        sc = options.scenario
        self.scenario = sc
        self.site = sc.site
        self._plant = build_plant(sc)
        layout = wire.SiteLayout(
            site=options.site_id, racks=tuple(self.site.rack_names), cards_per_rack=self.site.cards_per_rack
        )  # n_levels unset: a level beyond the table reaches the plant and is rejected with an ack
        self.codec = wire.Codec(layout)
        self.sequencer = wire.Sequencer(PUBLISHER)
        self.start_epoch_s = options.start_epoch_s if options.start_epoch_s is not None else time.time()
        self.duration_s = options.duration_s if options.duration_s is not None else sc.duration_s
        self.telemetry = TelemetryEncoder(self.codec, self.site, self.sequencer)
        self.commands = CommandHandler(
            self._plant,
            self.codec,
            self.sequencer,
            lambda: self.site_time_s,
            applied_with_ack=False,
            max_issue_ahead_s=options.max_issue_ahead_s,
        )
        self.chaos = DisconnectSchedule(sc.sim_faults)
        mq = options.mqtt
        self.mqtt = dataclasses.replace(
            mq, clean_session=False, client_id=mq.client_id or f"racktwin-sim-{options.site_id}"
        )
        self._bus: Bus | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._taking_commands = True  # False from the run's end on (:meth:`_drain_answers`)
        self._answers_held = 0  # answers made and not yet handed to the answerer (the burst goes on)
        self._bursts_open = 0  # bursts of answers handed to the answerer and not yet sent (or given up)
        self._bursts: asyncio.Queue[list[wire.Outgoing]] | None = None  # the answerer's queue (None: offline)
        self._commands_after_end = 0
        self._backlog: deque[wire.Outgoing] = deque(maxlen=EVENT_BACKLOG)
        self._flushing = asyncio.Lock()  # one flusher of the backlog at a time (step loop, on_connect)
        self._stop = asyncio.Event()
        self._stopping = False
        self._truth: TruthLog | None = None
        # counters
        self.messages_published = 0
        self.card_readings_published = 0
        self.telemetry_dropped = 0
        self.job_events_published = 0
        self.job_snapshots = 0  # job snapshots made (``jobs/state``: one per step with job events, and at t = 0)
        self._snapshot_owed = False  # job events went to the backlog: a snapshot follows once they are out
        self._snapshot_too_large = False  # a snapshot above the payload limit was reported
        self.disconnects = 0
        self._link_losses = 0
        self.max_rack_power_w = 0.0
        self._period_max_rack_w = 0.0
        self.behind_s = 0.0
        self.max_behind_s = 0.0
        self.summary: SimSummary | None = None
        #: why the summary could not be written to ``summary_path`` (None: written, or not asked for)
        self.summary_write_error: str | None = None

    # ---- public -------------------------------------------------------------------------------
    @property
    def plant(self) -> Plant:
        return self._plant

    @property
    def site_time_s(self) -> float:
        """The site clock (epoch seconds) used in every ``ts`` and to judge command expiry."""
        return self.start_epoch_s + self._plant.time_s

    @property
    def connected(self) -> bool:
        return self._bus is not None and self._bus.connected

    def stop(self) -> None:
        """Ask the run to end after the current step (the summary is still written)."""
        self._stopping = True
        self._stop.set()

    async def run(self) -> SimSummary:
        """Run until the duration is reached, :meth:`stop` is called or the task is cancelled."""
        opts = self.options
        wall0 = time.monotonic()
        cpu0 = time.process_time()
        stopped_by = "duration"
        if opts.truth_log is not None:
            self._truth = TruthLog(opts.truth_log, self.site)
        try:
            await self._discard_old_session()
            await self._connect(wait=True)
            await self._loop(wall0)
            if self._stopping:
                stopped_by = "stop"
            await self._drain_answers()
        except asyncio.CancelledError:
            stopped_by = "cancelled"
            self._finish(wall0, cpu0, stopped_by)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._disconnect())
            raise
        except BaseException:
            self._finish(wall0, cpu0, "error")
            with contextlib.suppress(Exception):
                await self._disconnect()
            raise
        summary = self._finish(wall0, cpu0, stopped_by)
        await self._disconnect()
        return summary

    # ---- the step loop ------------------------------------------------------------------------
    async def _loop(self, wall0: float) -> None:
        opts = self.options
        plant = self._plant
        period = self.scenario.telemetry_period_s
        end = self.duration_s
        speed = math.inf if opts.as_fast_as_possible else opts.speed
        n_pub = 0  # periods published; the next is due at n_pub * period (no accumulated rounding)
        next_pub = 0.0
        progress = _Progress(self, wall0, opts.progress, opts.progress_interval_s)
        # the jobs submitted and started at t = 0 are announced before the first telemetry round, as a
        # site's scheduler knows them before its racks report: an agent that has heard every rack never
        # sees a job submitted and not yet started that is in fact running
        # ... and the job snapshot (retained) follows them, also when there is no job: it replaces what
        # an earlier run left retained on the broker
        await self._publish_events(plant.drain_events(), snapshot=True)
        while True:
            t = plant.time_s
            change = self.chaos.transition(t) if t < end - _EPS_S and not self._stopping else None
            if change == "disconnect":
                self.disconnects += 1
                log.info("sim: broker_disconnect at t=%.1f s: dropping the MQTT connection", t)
                await self._disconnect()
            elif change == "reconnect":
                log.info("sim: broker_disconnect over at t=%.1f s: reconnecting", t)
                await self._connect(wait=True, timeout_s=min(self.options.connect_timeout_s, 5.0))
            if t >= next_pub - _EPS_S:
                await self._publish_telemetry()
                while next_pub <= t + _EPS_S:
                    n_pub += 1
                    next_pub = n_pub * period
            if t >= end - _EPS_S or self._stopping:
                break
            # land on every period, the end, every plant fault edge and every disconnect edge (the
            # chaos schedule merges windows that touch, so its next change is always ahead of t)
            dt = min(opts.step_s, next_pub - t, end - t, plant.next_fault_change_s() - t)
            link_change_s = self.chaos.next_change_s() - t
            if link_change_s > _EPS_S:
                dt = min(dt, link_change_s)
            plant.step(dt)
            rack_max = float(plant.rack_power_w.max())
            if rack_max > self._period_max_rack_w:
                self._period_max_rack_w = rack_max
            events = plant.drain_events()
            if events:
                await self._publish_events(events)  # and the job snapshot after them
            self._answer_plant_changes()
            # pacing against the wall clock
            if math.isfinite(speed):
                target = wall0 + plant.time_s / speed
                delay = target - time.monotonic()
                if delay > 0:
                    self.behind_s = 0.0
                    if delay > 0.2:
                        await wait_event(self._stop, delay)
                    else:
                        await asyncio.sleep(delay)
                else:
                    self.behind_s = -delay
                    self.max_behind_s = max(self.max_behind_s, self.behind_s)
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(0)
            progress.maybe()
        if self._truth is not None and self._truth.last_time_s is not None and plant.time_s > self._truth.last_time_s:
            # the end (or the stop) fell between two periods: one more truth row, no telemetry
            self._truth.write(plant, self.site_time_s, self._period_max_rack_w, self.connected)
        progress.final()

    # ---- publishing ---------------------------------------------------------------------------
    async def _publish_telemetry(self) -> None:
        plant = self._plant
        if self._period_max_rack_w > self.max_rack_power_w:
            self.max_rack_power_w = self._period_max_rack_w
        if self._truth is not None:
            row_max = self._period_max_rack_w or float(plant.rack_power_w.max())
            self._truth.write(plant, self.site_time_s, row_max, self.connected)
        self._period_max_rack_w = 0.0
        readings = plant.readings()  # taken even while offline: the sensor noise stream stays the same
        if not self.connected:
            self.telemetry_dropped += 3 * len(readings.racks) + (readings.facility is not None)
            return
        cards = sum(rr.cards.card_index.size for rr in readings.racks if rr.cards is not None)
        out = self.telemetry.readings(readings, self.site_time_s)
        sent = await self._send_all(out, keep=False)
        if sent == len(out):
            self.card_readings_published += cards
        self.telemetry_dropped += len(out) - sent

    async def _publish_events(self, events: list[Any], *, snapshot: bool = False) -> None:
        """The job events of a step, then the scheduler's job snapshot (``jobs/state``, retained) once,
        when there were events (or ``snapshot``). While the link is down (or events wait in the backlog)
        the events join the backlog and one snapshot is owed: made once the backlog is out, so that it
        follows every event it includes and the events and snapshots keep numbering 0, 1, 2, ... with
        no number skipped (a snapshot per offline step would fill the backlog with stale copies)."""
        out = []
        for ev in events:
            o = self.telemetry.job_event(ev, self.start_epoch_s)
            if o is not None:
                out.append(o)
        if not out and not snapshot:
            return
        if not self.connected or self._backlog:
            self._backlog.extend(out)
            self._snapshot_owed = True
            if self.connected:
                await self._flush_backlog()
            return
        out.append(self._job_state())
        sent = await self._send_all(out, keep=True)
        self.job_events_published += sum(1 for o in out[:sent] if not o.retain)  # (the snapshot is retained)

    def _job_state(self) -> wire.Outgoing:
        self.job_snapshots += 1
        out = self.telemetry.job_state(self.site_time_s)
        if len(out.payload) > wire.MAX_PAYLOAD_BYTES and not self._snapshot_too_large:
            self._snapshot_too_large = True  # (~360 bytes a running job, ~320 a queued one: some 700 jobs)
            log.warning(
                "sim: the job snapshot (%d jobs) is %d bytes, above the %d a receiver takes: agents that connect "
                "later will not catch up with the jobs from it (said once)",
                len(self.telemetry.jobs),
                len(out.payload),
                wire.MAX_PAYLOAD_BYTES,
            )
        return out

    async def _send_all(self, out: list[wire.Outgoing], *, keep: bool) -> int:
        """Publish in order; returns how many went out. ``keep``: on a lost link the rest goes to
        the backlog (job events), else it is dropped (telemetry)."""
        bus = self._bus
        for i, o in enumerate(out):
            if bus is None:
                if keep:
                    self._backlog.extend(out[i:])
                return i
            try:
                await bus.send(o)
            except BusNotConnected:
                if keep:
                    self._backlog.extend(out[i:])
                return i
            except BusError as exc:
                log.warning("sim: %s", exc)
                if keep:
                    self._backlog.extend(out[i:])
                return i
            self.messages_published += 1
        return len(out)

    async def _flush_backlog(self) -> None:
        """Publish the job events kept while offline, oldest first. The step loop (new events behind
        a backlog) and every reconnect's ``on_connect`` both flush: one at a time, so that each event
        goes out once; an event leaves the backlog only once it is sent (a failed send keeps it)."""
        async with self._flushing:
            bus = self._bus
            while bus is not None and bus.connected:
                if not self._backlog:
                    if not self._snapshot_owed:
                        return
                    self._snapshot_owed = False  # every event is out: the snapshot follows them
                    self._backlog.append(self._job_state())
                o = self._backlog[0]
                try:
                    await bus.send(o)
                except BusError:
                    return
                if self._backlog and self._backlog[0] is o:  # (a full backlog may have dropped it meanwhile)
                    self._backlog.popleft()
                self.messages_published += 1
                self.job_events_published += not o.retain  # (a job snapshot is retained, an event is not)

    # ---- connection ---------------------------------------------------------------------------
    async def _discard_old_session(self) -> None:
        """Connect once with a clean session and leave, before the run's persistent session starts:
        the broker drops what it kept for this client id (an earlier run's subscriptions and the
        commands queued for it), so a restarted simulator never applies commands meant for the run
        before it. The run's own reconnects keep its session (``sim.chaos``)."""
        bus = Bus(dataclasses.replace(self.mqtt, clean_session=True), name="sim")
        bus.start()
        try:
            await bus.wait_connected(self.options.connect_timeout_s)
        finally:
            await bus.close()

    async def _on_connect(self, bus: Bus) -> None:
        """After every (re)connect: republish every rack's retained applied state, then the events
        kept while offline; nothing on a connection made as the bus closes (``Bus.closing``)."""
        if bus.closing:
            return
        low = self._plant.low_power()
        for r in range(self.site.n_racks):
            await bus.send(self.commands.applied_state(r, low))
            self.messages_published += 1
        await self._flush_backlog()

    async def _connect(self, *, wait: bool, timeout_s: float | None = None) -> None:
        """Open the connection; ``wait``: until connected, at most ``timeout_s`` (default the
        option's; the first connect raises ``BusConnectError`` after it, a reconnect goes on
        trying in the background)."""
        bus = Bus(
            self.mqtt,
            subscriptions=[(f, 1) for f in self.codec.topics.plant_filters()],
            on_connect=self._on_connect,
            name="sim",
        )
        bus.start()
        self._bus = bus
        self._consumer = asyncio.create_task(self._consume(bus), name="sim-commands")
        if not wait:
            return
        if timeout_s is None:
            await bus.wait_connected(self.options.connect_timeout_s)
            return
        try:
            await bus.wait_connected(timeout_s)
        except BusError as exc:
            log.warning("sim: %s; still trying", exc)

    async def _drain_answers(self) -> None:
        """The run has ended: take no more commands (counted, neither applied nor answered) and let
        the answers of those taken go out, at most ``ANSWER_DRAIN_S``, so that every command the
        summary counts was answered (the bus used to close under the last burst's acks: the journal
        of the demo's agent lacked 4 of 79)."""
        self._taking_commands = False
        bus = self._bus
        if bus is None:
            return
        deadline = time.monotonic() + ANSWER_DRAIN_S
        while bus.pending() or self._answers_held or self._bursts_open:
            if time.monotonic() >= deadline:
                log.warning(
                    "sim: the answers to some commands were not sent within %g s of the run's end", ANSWER_DRAIN_S
                )
                return
            await asyncio.sleep(0.01)

    async def _disconnect(self) -> None:
        bus, self._bus = self._bus, None
        consumer, self._consumer = self._consumer, None
        if bus is not None:
            self._link_losses += bus.stats.disconnects
            await bus.close()
        if consumer is not None:
            await cancel_and_wait(consumer)

    async def _consume(self, bus: Bus) -> None:
        """Handle commands as they arrive; answer them (acks, applied state). Every command received
        is applied at once, in order; when no more are waiting, the answers of the burst go to
        :meth:`_answer_bursts`, which sends them pipelined (:meth:`_answer_all`: one round trip for
        the burst, not one per answer), burst after burst in order, while the commands that follow
        are applied: a rack applies what it gets whether or not its answers can go out. (Awaited
        here, an ack in flight when the broker stopped held every later command for the publish's
        10 s timeout: 200 site s at 20x.) A persistent session gets its queued commands right after
        CONNACK, before the bus reports itself connected: answers wait for the link (and are retried
        after a lost link)."""
        bursts: asyncio.Queue[list[wire.Outgoing]] = asyncio.Queue()
        answerer = asyncio.create_task(self._answer_bursts(bus, bursts))
        self._bursts = bursts
        try:
            while True:
                answers: list[wire.Outgoing] = []
                try:
                    async for m in bus.messages():
                        if not self._taking_commands:
                            self._commands_after_end += 1
                        else:
                            try:
                                answers.extend(self.commands.handle(m.topic, m.payload))
                            except Exception:  # this command only: the answers of the others in the burst still go
                                log.exception("sim: a command on %r could not be handled; going on", m.topic)
                        if bus.pending() == 0 or not self._taking_commands:
                            # each touched rack's applied state, made once for the burst (one seq number each)
                            answers.extend(self.commands.applied_states())
                            if answers:
                                burst, answers = answers, []
                                self._bursts_open += 1
                                bursts.put_nowait(burst)
                        self._answers_held = len(answers)
                    return  # the bus was closed
                except asyncio.CancelledError:
                    raise
                except Exception:  # never stop taking commands
                    log.exception("sim: command consumer failed; going on")
        finally:
            if self._bursts is bursts:
                self._bursts = None
            await cancel_and_wait(answerer)
            self._bursts_open -= bursts.qsize()  # never sent (the connection is gone)
            self._answers_held = 0

    def _answer_plant_changes(self) -> None:
        """After a step: the applied state of each rack whose cards the plant woke, put to sleep or
        powered on itself (``CommandHandler.note_plant_changes``: a job it placed, a failure, a
        repair), handed to the answerer as a burst of its own, behind the answers before it. Not
        while a burst of commands is open (its applied states, made at its end, include them), nor
        while offline (every rack's applied state is published on connect)."""
        bursts = self._bursts
        if bursts is None or self._answers_held or not self._taking_commands:
            return
        out = self.commands.applied_states()
        if out:
            self._bursts_open += 1
            bursts.put_nowait(out)

    async def _answer_bursts(self, bus: Bus, bursts: asyncio.Queue[list[wire.Outgoing]]) -> None:
        """Send the answers of each burst of commands, in the order of the bursts."""
        while True:
            burst = await bursts.get()
            try:
                await self._answer_all(bus, burst)
            except asyncio.CancelledError:
                raise
            except Exception:  # never stop answering
                log.exception("sim: answers of a burst of commands could not be sent; going on")
            finally:
                self._bursts_open -= 1

    async def _answer_all(self, bus: Bus, answers: list[wire.Outgoing]) -> None:
        """Publish a burst's answers at once: the acks in order, then each rack's applied state (one
        per rack, made after the burst's last command: ``CommandHandler.applied_states``), all in
        flight together."""
        acks = [o for o in answers if not o.retain]
        latest: dict[str, wire.Outgoing] = {}
        for o in answers:
            if o.retain:
                latest.pop(o.topic, None)
                latest[o.topic] = o
        tasks = [asyncio.ensure_future(self._answer(bus, o)) for o in (*acks, *latest.values())]
        await asyncio.gather(*tasks)

    async def _answer(self, bus: Bus, o: wire.Outgoing) -> None:
        """Send one answer; after a lost link (also one lost while the answer was in flight) once
        connected again, three tries in all."""
        for attempt in range(3):
            try:
                if not bus.connected:
                    await bus.wait_connected(None)
                await bus.send(o)
                self.messages_published += 1
                return
            except BusError as exc:
                if attempt == 2:
                    log.warning("sim: could not publish %s: %s", o.topic, exc)

    # ---- the end ------------------------------------------------------------------------------
    def _finish(self, wall0: float, cpu0: float, stopped_by: str) -> SimSummary:
        if self._period_max_rack_w > self.max_rack_power_w:
            self.max_rack_power_w = self._period_max_rack_w
        truth_rows = 0
        if self._truth is not None:
            truth_rows = self._truth.rows
            self._truth.close()
        c = self.commands.counts
        bus = self._bus
        summary = SimSummary(
            scenario=self.scenario.name,
            site=self.site.name,
            site_id=self.options.site_id,
            n_cards=self.site.n_cards,
            n_racks=self.site.n_racks,
            rack_power_limit_w=self.site.rack.power_limit_w,
            accounting=self._plant.accounting(),
            start_epoch_s=self.start_epoch_s,
            site_time_s=self.site_time_s,
            wall_s=time.monotonic() - wall0,
            cpu_s=time.process_time() - cpu0,
            speed_requested=self.options.speed,
            messages_published=self.messages_published,
            card_readings_published=self.card_readings_published,
            telemetry_dropped=self.telemetry_dropped,
            job_events_published=self.job_events_published,
            commands_applied=c.applied,
            commands_rejected=c.rejected,
            commands_expired=c.expired,
            commands_superseded=c.superseded,
            commands_duplicate=c.duplicates,
            commands_malformed=c.malformed_acked + c.unanswered,
            commands_unanswered=c.unanswered,
            commands_after_end=self._commands_after_end,
            commands_by_target={k: dict(v) for k, v in c.by_target.items()},
            command_refusals=dict(c.rejection_reasons),
            rejected_messages={k: v for k, v in self.codec.counter.snapshot().items() if v},
            disconnects=self.disconnects,
            link_losses=self._link_losses + (bus.stats.disconnects if bus is not None else 0),
            max_rack_power_w=self.max_rack_power_w,
            max_behind_s=self.max_behind_s,
            truth_rows=truth_rows,
            stopped_by=stopped_by,
        )
        self.summary = summary
        if self.options.summary_path is not None:
            try:
                summary.write(self.options.summary_path)
            except OSError as exc:
                self.summary_write_error = exc.strerror or str(exc)
                log.error("sim: cannot write the summary to %s: %s", self.options.summary_path, exc)
        return summary


class _Progress:
    """One line every few wall seconds: site time, speed achieved, IT power, PUE, messages."""

    def __init__(self, sim: Simulator, wall0: float, emit: Callable[[str], None] | None, interval_s: float) -> None:
        self.sim = sim
        self.emit = emit
        self.interval_s = interval_s
        self.last_wall = wall0
        self.last_t = sim.plant.time_s
        self.last_msgs = 0

    def maybe(self) -> None:
        if self.emit is None:
            return
        now = time.monotonic()
        if now - self.last_wall >= self.interval_s:
            self._line(now)

    def final(self) -> None:
        """The last line, unless the last periodic one already showed where the run ended (its speed
        would be measured over a window in which site time did not move: "0.00x")."""
        if self.emit is not None and self.sim.plant.time_s > self.last_t:
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        sim = self.sim
        assert self.emit is not None
        t = sim.plant.time_s
        wall = max(now - self.last_wall, 1e-9)
        speed = (t - self.last_t) / wall
        msgs = sim.messages_published
        rate = (msgs - self.last_msgs) / wall
        self.last_wall, self.last_t, self.last_msgs = now, t, msgs
        tr = sim.plant.truth()
        it = tr.it_power_w
        pue = tr.facility_power_w / it if it > 0 else math.nan
        c = sim.commands.counts
        rejected = sim.codec.counter.total
        clock = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sim.site_time_s))
        link = "up" if sim.connected else "DOWN"
        line = (
            f"sim: t={t:,.0f} s ({clock} UTC) speed {speed:,.2f}x, IT {it / 1e3:,.1f} kW, PUE {pue:.3f}, "
            f"msgs {msgs:,} ({rate:,.0f}/s), link {link}, commands {c.applied:,} applied / {c.rejected:,} rejected / "
            f"{c.expired:,} expired, bad messages {rejected:,}"
        )
        if sim.behind_s > 1.0 and not sim.options.as_fast_as_possible:
            line += f"; BEHIND by {sim.behind_s:,.1f} s: cannot keep up with speed {speed_text(sim.options.speed)}"
            line += " (physics not skipped)"
        self.emit(line)
