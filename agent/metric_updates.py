"""The service's metrics (``agent.metrics.AgentMetrics``) brought up to date: the site's state, the
broker link, rejections and counts every second (:meth:`MetricUpdates.update`, the health task),
and each decision's plan and what the guard changed in it (:meth:`MetricUpdates.after_decision`).

The counters the service's parts keep only grow; what was counted into the metrics so far is kept
here, so that each update adds the difference.

A measured gauge exports a value only while it is known: a rack's power, its loop's supply and return
temperatures, a card's die temperature and the rack's hottest die have no sample (the labelled series
is removed) once their source has not been read validly within ``control.telemetry_deadline_s`` (the
deadline after which the rack goes to fail-safe caps: a source silent, or sending only values the
belief refuses, NaN among them), and come back with the source's next valid reading; the facility's
gauges (no labels to remove) read NaN then, and the site time before the site clock's first reading.
``racktwin_telemetry_age_seconds`` keeps growing meanwhile: it is what says so (docs/agent.md,
"Observability"). A reading a stuck sensor froze
(``TwinState.frozen_readings``: a card's die, frozen with its power or alone, every card's die of a rack
whose cards froze as a whole, a rack's loop temperatures) is not known either, fresh as it is: its
series has no sample while the sensor is stuck (a card's power frozen alone leaves its die series).

Each group of gauges is brought up to date in its own guarded step (the broker link, the message
counts, the refused readings, rack power, telemetry age, loop temperatures, dies, the facility, stuck
sensors, open commands, standby, the site clock): a step that raises (a defect) stops only its own
group, which keeps its last values, but a measured group's series go (rack power, telemetry age, loop
temperatures, dies; the facility's read NaN), since what they show is no longer known to be current.
A step's first failure is logged with its traceback (``health metrics not updated: <group>: <error>``),
a repeat of the same error is not, and its recovery is logged (``health metrics updated again:
<group>``); :attr:`MetricUpdates.failing` names the steps failing now, and
``racktwin_metrics_group_failing{group}`` (``agent.metrics.METRICS_GROUPS``: the group's id, its words in
snake_case) reads 1 while a group's step fails, 0 otherwise, so that the alert rules can say which
alerts are blind meanwhile (``RacktwinMetricsNotUpdated``).

The message counts include the jobs the scheduler's job snapshots changed in the job table
(``racktwin_job_snapshot_changes_total{change}``: added, corrected, dropped; ``agent.job_catchup``)
and the cards whose confirmed setting a later reading disproved and no late applied state explained
(``racktwin_applied_state_disproved_total{setting,rack}``: level, power_limit, low_power; ``agent.ingest``),
and per rack the applied states refused as older than the one taken for their cards and those dropped from
the book of the refused (``racktwin_applied_states_old_total{rack}``,
``racktwin_applied_states_old_dropped_total{rack}``; ``agent.applied_states``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from agent import wire
from agent.bus import Bus
from agent.clock import SiteTime
from agent.decision import QUEUE_WAIT_KINDS, Decision
from agent.ingest import Ingest
from agent.metrics import JOB_SNAPSHOT_CHANGES, METRICS_GROUPS, AgentMetrics
from agent.publish import CommandBook
from agent.standby import Standby
from twin.spec import SiteSpec
from twin.state import TwinState

__all__ = ["MetricUpdates"]

log = logging.getLogger("racktwin.agent")


def _no_sample(gauge: Any, *labels: str) -> None:
    """Remove a labelled series, whether it is exported or not (prometheus-client releases before
    client_python PR #1077 raise KeyError for a series that is not: a rack never read)."""
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


def _add_per_rack(counter: Any, counts: Mapping[str, int], seen: dict[str, int]) -> None:
    """Add to ``counter``'s series of each rack what its count (which only grows) grew since ``seen``."""
    for rack, n in list(counts.items()):
        counter.labels(rack=rack).inc(max(n - seen.get(rack, 0), 0))
        seen[rack] = n


class MetricUpdates:
    """Reads what it exports: the belief (``state``), ``clock``, the codec's rejections, the ingest's
    counts, the ``bus``'s link, the open commands of ``book`` and whether ``standby`` commands."""

    def __init__(
        self,
        metrics: AgentMetrics,
        site: SiteSpec,
        *,
        state: TwinState,
        clock: SiteTime,
        codec: wire.Codec,
        ingest: Ingest,
        bus: Bus,
        book: CommandBook,
        standby: Standby,
    ) -> None:
        self.metrics = metrics
        self.site = site
        self.state = state
        self.clock = clock
        self.codec = codec
        self.ingest = ingest
        self.bus = bus
        self.book = book
        self.standby = standby
        #: the control config's deadline (the book's is the service's): older readings are not known values
        self.telemetry_deadline_s = book.control.telemetry_deadline_s
        self._card_gauges: list[Any] = [None] * site.n_cards  # each card's series while it is exported
        self._seen_rejections: dict[str, int] = {}
        self._seen_ignored = (0, 0)  # messages stamped ahead, late readings: counted into the metrics so far
        self._seen_invalid = np.zeros(site.n_racks)  # readings refused per rack, counted so far
        self._seen_takeovers = 0
        self._seen_job_snapshot = dict.fromkeys(JOB_SNAPSHOT_CHANGES, 0)  # jobs changed by snapshots, counted so far
        self._seen_disproved: dict[tuple[str, str], int] = {}  # (setting, rack): settings disproved, counted so far
        self._seen_old: dict[str, int] = {}  # rack: applied states refused as older, counted so far
        self._seen_old_dropped: dict[str, int] = {}  # rack: of those, dropped from the book, counted so far
        #: the steps of :meth:`update` failing now (named as the log names them), with their error (each
        #: logged once per error); ``racktwin_metrics_group_failing`` says the same by group id
        self.failing: dict[str, str] = {}

    def after_decision(self, d: Decision) -> None:
        m = self.metrics
        m.solve_seconds.observe(d.solve_time_s)
        m.control_cycles_total.labels(source=d.source).inc()
        m.supply_setpoint_celsius.set(d.supply_temp_c)
        hosts_off = (
            np.zeros(self.site.n_racks)
            if d.host_off is None
            else np.asarray(d.host_off, dtype=np.float64).reshape(self.site.n_racks, -1).sum(axis=1)
        )
        for r, name in enumerate(self.site.rack_names):
            m.rack_failsafe.labels(rack=name).set(1 if r in d.failsafe_racks else 0)
            m.rack_hosts_off.labels(rack=name).set(float(hosts_off[r]))
            m.predicted_rack_power_watts.labels(rack=name).set(float(d.predicted_rack_power_w[r]))
            m.rack_power_cap_watts.labels(rack=name).set(float(d.rack_cap_w[r]))
            speed = 1.0 if d.rack_pump_speed_frac is None else float(d.rack_pump_speed_frac[r])
            m.rack_pump_speed_ratio.labels(rack=name).set(speed)
        m.predicted_facility_power_watts.set(d.predicted_facility_power_w)
        waiting = d.queue_wait_counts()
        for kind in QUEUE_WAIT_KINDS:
            m.queued_jobs.labels(wait=kind).set(waiting.get(kind, 0))
        m.decision_status.labels(status=d.status).inc()
        m.plans_total.labels(status=d.plan_status, source=d.source).inc()
        for action, n in Counter(d.guard_actions).items():  # one per explanation line the guard wrote
            m.guard_actions_total.labels(action=action).inc(n)

    def update(self) -> None:
        """Every group of gauges in its own guarded step: a step that raises (a defect) leaves the others
        to go on; its gauges keep their last values, but a measured group's series (rack power, telemetry
        age, loop temperatures, dies, the facility's readings) go (no sample; NaN for the facility), since what
        they read is no longer known to be current. The first failure of a step is logged with its
        traceback, a repeat of the same error is not, and the step's recovery is logged."""
        self._step("broker_link", self._update_link)
        self._step("message_counts", self._update_message_counts)
        self._step("invalid_readings", self._update_invalid_readings)
        self._step("rack_power", self._update_rack_power, forget=self._forget_rack_power)
        self._step("telemetry_age", self._update_telemetry_age, forget=self._forget_telemetry_age)
        self._step("loop_temperatures", self._update_loop_temperatures, forget=self._forget_loop_temperatures)
        self._step("die_temperatures", self._update_die_temperatures, forget=self._forget_die_temperatures)
        self._step("facility", self._update_facility, forget=self._forget_facility)
        self._step("stuck_sensors", self._update_stuck_sensors)
        self._step("open_commands", self._update_open_commands)
        self._step("standby", self._update_standby)
        self._step("site_clock", self._update_site_clock)

    def _step(self, group_id: str, run: Callable[[], None], *, forget: Callable[[], None] | None = None) -> None:
        """Run one group's update (``group_id``: a key of ``agent.metrics.METRICS_GROUPS``); its
        ``racktwin_metrics_group_failing`` series reads 1 while it raises, 0 once it does not."""
        group = METRICS_GROUPS[group_id]  # as the log names it
        failing = self.metrics.metrics_group_failing.labels(group=group_id)
        try:
            run()
        except Exception as exc:  # a defect: this group stops here, the others go on; said once per error
            failing.set(1)
            what = f"{type(exc).__name__}: {exc}"
            if self.failing.get(group) != what:
                log.exception("health metrics not updated: %s: %s", group, what)
            self.failing[group] = what
            if forget is not None:
                with contextlib.suppress(Exception):
                    forget()
        else:
            failing.set(0)
            if self.failing.pop(group, None) is not None:
                log.info("health metrics updated again: %s", group)

    def _fresh_s(self) -> float:
        """A reading at or after this site time is a known value (none before the clock's first reading)."""
        now = self.clock.now()
        return math.inf if now is None else now - self.telemetry_deadline_s

    def _update_link(self) -> None:
        m = self.metrics
        m.broker_connected.set(1 if self.bus.connected else 0)
        takeovers = self.bus.stats.takeovers  # only grows
        m.broker_takeovers_total.inc(max(takeovers - self._seen_takeovers, 0))
        self._seen_takeovers = takeovers

    def _update_message_counts(self) -> None:
        m = self.metrics
        for reason, n in self.codec.counter.snapshot().items():
            seen = self._seen_rejections.get(reason, 0)
            if n > seen:
                m.rejected_messages_total.labels(reason=reason).inc(n - seen)
                self._seen_rejections[reason] = n
        ahead, late = self.ingest.stats.ahead, self.state.late_count  # both only grow
        m.messages_stamped_ahead_total.inc(max(ahead - self._seen_ignored[0], 0))
        m.late_readings_total.inc(max(late - self._seen_ignored[1], 0))
        self._seen_ignored = (ahead, late)
        stats = self.ingest.stats  # jobs the scheduler's job snapshots changed in the job table: only grow
        changed = (stats.job_snapshot_added, stats.job_snapshot_corrected, stats.job_snapshot_dropped)
        for change, n in zip(JOB_SNAPSHOT_CHANGES, changed, strict=True):
            m.job_snapshot_changes_total.labels(change=change).inc(max(n - self._seen_job_snapshot[change], 0))
            self._seen_job_snapshot[change] = n
        for (setting, rack), n in list(stats.applied_disproved.items()):  # cards: only grow
            seen = self._seen_disproved.get((setting, rack), 0)
            m.applied_state_disproved_total.labels(setting=setting, rack=rack).inc(max(n - seen, 0))
            self._seen_disproved[setting, rack] = n
        _add_per_rack(m.applied_states_old_total, stats.applied_states_old, self._seen_old)  # messages: only grow
        _add_per_rack(m.applied_states_old_dropped_total, stats.applied_states_old_dropped, self._seen_old_dropped)

    def _update_invalid_readings(self) -> None:
        site, st = self.site, self.state
        per_rack = st.invalid_count.reshape(site.n_racks, site.cards_per_rack).sum(axis=1)
        invalid = np.asarray(per_rack + st.rack_invalid_count, dtype=np.float64)
        for i in np.flatnonzero(invalid > self._seen_invalid).tolist():
            self.metrics.invalid_readings_total.labels(rack=site.rack_names[i]).inc(
                float(invalid[i] - self._seen_invalid[i])
            )
        self._seen_invalid = invalid

    def _update_rack_power(self) -> None:
        m, st = self.metrics, self.state
        fresh_s = self._fresh_s()
        limit_w = self.site.rack.power_limit_w
        for r, name in enumerate(self.site.rack_names):
            m.rack_power_limit_watts.labels(rack=name).set(limit_w)
            if st.rack_pdu_seen_s[r] >= fresh_s and math.isfinite(st.rack_power_w[r]):
                m.rack_power_watts.labels(rack=name).set(float(st.rack_power_w[r]))
            else:
                _no_sample(m.rack_power_watts, name)

    def _forget_rack_power(self) -> None:
        self.metrics.rack_power_watts.clear()

    def _update_telemetry_age(self) -> None:
        now = self.clock.now()
        if now is None:
            return
        last = self.state.rack_last_seen_s()
        for r, name in enumerate(self.site.rack_names):
            if math.isfinite(last[r]):
                self.metrics.telemetry_age_seconds.labels(rack=name).set(max(now - float(last[r]), 0.0))

    def _forget_telemetry_age(self) -> None:
        # an age that stays at its last value reads as fresh telemetry while it grows old: no age shown
        self.metrics.telemetry_age_seconds.clear()

    def _update_loop_temperatures(self) -> None:
        m, st = self.metrics, self.state
        fresh_s = self._fresh_s()
        _, loop_frozen = st.frozen_readings()  # a stuck sensor's readings: fresh in time, but not taken
        for r, name in enumerate(self.site.rack_names):
            supply, ret = float(st.rack_supply_temp_c[r]), float(st.rack_return_temp_c[r])
            loop_known = st.rack_loop_seen_s[r] >= fresh_s and not loop_frozen[r]
            if loop_known and math.isfinite(supply) and math.isfinite(ret):
                m.rack_supply_temperature_celsius.labels(rack=name).set(supply)
                m.rack_return_temperature_celsius.labels(rack=name).set(ret)
            else:
                _no_sample(m.rack_supply_temperature_celsius, name)
                _no_sample(m.rack_return_temperature_celsius, name)

    def _forget_loop_temperatures(self) -> None:
        self.metrics.rack_supply_temperature_celsius.clear()
        self.metrics.rack_return_temperature_celsius.clear()

    def _update_die_temperatures(self) -> None:
        m, st, site = self.metrics, self.state, self.site
        fresh_s = self._fresh_s()
        die_frozen, _ = st.frozen_readings()  # a stuck sensor's readings: fresh in time, but not taken
        reading = st.card_die_temp_c  # every card as it reads, a failed one too (rack_max leaves it out)
        known = np.isfinite(reading) & (st.card_last_seen_s >= fresh_s) & ~die_frozen
        die = np.where(known & ~st.card_failed, reading, -np.inf)
        rack_max = die.reshape(site.n_racks, site.cards_per_rack).max(axis=1)
        for r, name in enumerate(site.rack_names):
            if math.isfinite(rack_max[r]):
                m.rack_max_die_temperature_celsius.labels(rack=name).set(float(rack_max[r]))
            else:
                _no_sample(m.rack_max_die_temperature_celsius, name)
        gauges = self._card_gauges
        cpr = site.cards_per_rack
        for c in np.flatnonzero(known).tolist():
            g = gauges[c]
            if g is None:  # a card's series starts with its first known reading (not at 0 deg C before it)
                g = gauges[c] = m.card_die_temperature_celsius.labels(rack=site.rack_names[c // cpr], card=str(c % cpr))
            g.set(float(reading[c]))
        for c in np.flatnonzero(~known).tolist():
            if gauges[c] is not None:  # its value is no longer known: the series goes until the next reading
                m.card_die_temperature_celsius.remove(site.rack_names[c // cpr], str(c % cpr))
                gauges[c] = None

    def _forget_die_temperatures(self) -> None:
        self._card_gauges = [None] * self.site.n_cards
        self.metrics.card_die_temperature_celsius.clear()
        self.metrics.rack_max_die_temperature_celsius.clear()

    def _update_facility(self) -> None:
        m = self.metrics
        fac = self.state.facility
        if fac is not None and fac.time_s >= self._fresh_s():
            m.it_power_watts.set(fac.it_power_w)
            m.facility_power_watts.set(fac.facility_power_w)
            m.cooling_power_watts.set(fac.cooling_power_w)
            m.pue_ratio.set(fac.facility_power_w / fac.it_power_w if fac.it_power_w > 0 else math.nan)
            m.ambient_temperature_celsius.set(fac.ambient_temp_c)
        else:  # none read yet, or none within the deadline: unknown
            self._forget_facility()

    def _forget_facility(self) -> None:
        for gauge in self.metrics.facility_gauges():
            gauge.set(math.nan)

    def _update_stuck_sensors(self) -> None:
        # a stuck rack counts once, its stuck cards with it (the controller takes none of its cards' readings)
        st = self.state
        stuck_racks = set(st.stuck_racks())
        stuck_cards = [c for c in st.stuck_cards() if c // self.site.cards_per_rack not in stuck_racks]
        self.metrics.anomalies.labels(kind="stuck_sensor").set(len(stuck_racks) + len(stuck_cards))

    def _update_open_commands(self) -> None:
        self.metrics.open_commands.set(len(self.book.open))

    def _update_standby(self) -> None:
        standby = self.standby
        self.metrics.agent_standby.set(1 if standby.mode == "enforce" and not standby.commanding() else 0)
        self.metrics.competing_agents.set(len(standby.competing()))

    def _update_site_clock(self) -> None:
        now = self.clock.now()
        # no site time before the first reading: NaN, not 0.0 (1970, and a site time a simulator may start at)
        self.metrics.site_time_seconds.set(math.nan if now is None else now)
        self.metrics.site_clock_rate.set(self.clock.rate)
