"""TwinState: the agent's belief about the site, built from readings and job events. No I/O.

The same :class:`twin.readings.Readings` feed it whether they come from ``twin.plant.Plant`` in
process or from MQTT messages converted by the agent, and the same :class:`JobEvent` objects.

Per card it keeps the last *valid* power, die temperature, utilization, clock, level, low-power /
waking / failed flags, power limit and when it was last seen; per rack the PDU power, loop supply
and return temperatures, flow and pump power with their last-seen times; the facility's last
reading; the jobs (queued and running) from events and job readings.

Each part of a rack's reading (cards, loop, PDU) is dated by its own time stamp
(``RackReading.part_time_s``: the agent merges messages from separate exporters into one reading).
A reading stamped before what the belief holds of its card, loop or PDU (late, reordered) is not
taken (``late_count``); one stamped at the same time is the same reading again (at-least-once
delivery) and no evidence of a frozen sensor.

Invalid values (NaN, infinity, outside physical bounds: power < 0 or > 5 x the card's power limit,
die temperature outside -20..150 deg C, utilization outside 0..1) are not stored: the card keeps its
previous values and its last-seen time does not advance, so a card or rack that only sends garbage
goes stale. ``invalid_count`` tells how many were refused.

Stuck sensors: a card whose power and die temperature do not change *at all* over
``stuck_after_readings`` consecutive readings while another card of its rack changed in the latest
reading is stuck; a rack whose cards (or whose loop readings) are all unchanged over
``stuck_after_readings`` readings while another rack changed is stuck. Real sensors always jitter in
the last digit, so exact repetition is the signature of a frozen value. A die temperature frozen on
its own is stuck too, once it has held its value over ``stuck_after_readings`` readings in which its
card's power (through the spec's lowest die-to-coolant resistance) or its rack's supply had moved it
by ``stuck_die_move_k`` from where it last changed: a sensor reading whole degrees may hold one
value for minutes at a steady load, but not through a load step or a set-point change. A power
reading frozen on its own is stuck the same way, once it has held its value over
``stuck_after_readings`` readings in which the spec's power model, at the card's reported clock,
utilization, die temperature and low-power state, had moved it by ``stuck_power_move_w`` from where
it last changed (a job's checkpoint, a level change): the guard budgets the rack with that power and
the estimator learns the card's thermal resistance and leakage from it. A rack whose cards all
repeat while nothing else changes is not stuck (a steady site without sensor noise), unless its PDU,
read apart, moves by ``stuck_pdu_move_w`` (default: all of the rack's host overhead plus 5% of its
limit, more than anything but its cards can move it) from what it read when they last changed, over
``stuck_after_readings`` PDU readings: a site whose card readings froze as a whole. One whose PDU
readings froze with them is caught by the job events, which come from the scheduler, not from the
racks' telemetry: a card whose power and die both repeat over ``stuck_after_readings`` readings in
which its job's events said it started computing, stopped computing, was given a job or lost one
(the card's activity: idle, computing, busy not computing) since its readings last changed is
stuck. A card's readings cannot stay bit for bit the same through such a change, noise or not.

Job events come at least once, and not always in order: a ``submitted`` of a job the belief knows
(queued or running), or of one that finished after that submission, is a repeat and ignored; any
other event stamped before the job's last one taken (``JobInfo.last_event_s``) is a late copy or
was overtaken and is ignored too (an old ``phase`` does not overwrite a newer one, a ``requeued``
overtaken by the restart it led to does not queue the running job), and so is a ``started`` of a
running job stamped at its last event's time (the same start again; it would reset the phase).
A ``started`` stamped later is a restart and is taken, on whatever cards it names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from twin.power import PowerModel
from twin.readings import CardBatch, FacilityReading, JobEvent, Readings, pump_speed_in_range
from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["JobInfo", "StateSnapshot", "TwinState"]

_NEVER = -math.inf
_DIE_RANGE_C = (-20.0, 150.0)
#: Finished and failed jobs remembered (to tell a late copy of their submission from a new job).
_GONE_KEPT = 4096
#: A card's activity as the job events tell it (:meth:`TwinState.stuck_cards`).
_IDLE, _COMPUTING, _BUSY_NOT_COMPUTING = 0, 1, 2
#: A CDU reports its pump's speed to 0.01 % of nominal (the simulator's rounding, docs/sim.md): a
#: reported speed at most half of that under the site's lowest speed is the lowest speed (1/3 of
#: nominal reads 33.33 %, a hair under it; a consumer checking ``speed >= lowest`` would misread it).
_PUMP_SPEED_SNAP_FRAC = 0.5e-4 + 1e-12


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # "queued" or "running"
    phase: Phase
    n_cards: int
    cards: tuple[int, ...]
    priority: float
    min_throughput_frac: float
    compute_share: float
    noncompute_utilization: float
    step_time_s: float
    submit_time_s: float
    progress_frac: float
    throughput_frac: float
    last_event_s: float
    spec: JobSpec | None


@dataclass(frozen=True)
class StateSnapshot:
    """A consistent copy of the belief for one control step (arrays are copies)."""

    time_s: float
    card_power_w: FloatArray
    card_die_temp_c: FloatArray
    card_utilization: FloatArray
    card_clock_mhz: FloatArray
    card_level: IntArray
    card_low_power: BoolArray
    card_waking: BoolArray
    card_failed: BoolArray
    card_power_limit_w: FloatArray
    card_last_seen_s: FloatArray
    card_prev_seen_s: FloatArray  # the reading before the last: the start of the interval the last one covers
    card_job: IntArray  # index into ``jobs`` or -1 (idle)
    card_host_off: BoolArray  # the card's host is powered off (as last reported; False if never)
    card_released_s: FloatArray  # when a job last left the card (finished, failed, requeued); -inf: never
    rack_power_w: FloatArray  # PDU
    rack_supply_temp_c: FloatArray
    rack_return_temp_c: FloatArray
    rack_flow_lpm: FloatArray
    rack_pump_power_w: FloatArray
    rack_pump_speed_frac: FloatArray  # as the CDU reports it (1 until a reading says otherwise; kept when one omits it)
    rack_last_seen_s: FloatArray  # the oldest of the rack's card, loop and PDU readings
    stuck_racks: tuple[int, ...]
    stuck_cards: tuple[int, ...]
    facility: FacilityReading | None
    jobs: tuple[JobInfo, ...]  # running jobs
    queue: tuple[JobInfo, ...]  # queued jobs, in queue order
    # whether the rack's latest loop reading reported its pump's speed, 0 (a stopped pump) .. full speed
    # (a CDU that omits it, or reports NaN: the speed above is the last one reported, or 1; the speed the
    # agent commanded is the better guess). A reading with a speed outside that range is no reading
    # (twin.readings.MAX_PUMP_SPEED_FRAC), as on the wire, which rejects the whole CDU message.
    rack_pump_speed_reported: BoolArray | None = None


class TwinState:
    """The agent's belief. ``update(readings)`` and ``apply_events(events)``; ``snapshot()``."""

    def __init__(
        self,
        site: SiteSpec,
        stuck_after_readings: int = 10,
        stuck_die_move_k: float = 3.0,
        stuck_power_move_w: float = 50.0,
        stuck_pdu_move_w: float | None = None,
    ) -> None:
        if stuck_after_readings < 2:
            raise ValueError("stuck_after_readings must be >= 2")
        if not stuck_die_move_k > 0:
            raise ValueError("stuck_die_move_k must be positive")
        if not stuck_power_move_w > 0:
            raise ValueError("stuck_power_move_w must be positive")
        if stuck_pdu_move_w is None:  # more than all of a rack's hosts and switches, PDU error and pumps
            stuck_pdu_move_w = site.rack.host_overhead_w + 0.05 * site.rack.power_limit_w
        if not stuck_pdu_move_w > 0:
            raise ValueError("stuck_pdu_move_w must be positive")
        self.site = site
        self.stuck_after_readings = stuck_after_readings
        self.stuck_die_move_k = stuck_die_move_k
        self.stuck_power_move_w = stuck_power_move_w
        self.stuck_pdu_move_w = stuck_pdu_move_w
        n, r = site.n_cards, site.n_racks
        self._n, self._n_racks, self._cpr = n, r, site.cards_per_rack
        self._site_order = np.arange(n, dtype=np.int64)  # the cards' indices in site order
        card = site.card
        self._clocks = np.asarray(card.clocks_mhz, dtype=np.float64)
        self._max_power_w = 5.0 * card.power_limit_w
        self.max_plausible_clock_mhz = card.max_plausible_clock_mhz  # a clock reading above: refused
        self.time_s = _NEVER
        nan = np.full(n, np.nan)
        self.card_power_w = nan.copy()
        self.card_die_temp_c = nan.copy()
        self.card_utilization = nan.copy()
        self.card_clock_mhz = nan.copy()
        self.card_level = np.zeros(n, dtype=np.int64)
        self.card_low_power = np.zeros(n, dtype=bool)
        self.card_waking = np.zeros(n, dtype=bool)
        self.card_failed = np.zeros(n, dtype=bool)
        self.card_host_off = np.zeros(n, dtype=bool)
        self.card_power_limit_w = np.full(n, card.power_limit_w)
        self.card_last_seen_s = np.full(n, _NEVER)
        self.card_prev_seen_s = np.full(n, _NEVER)
        self.card_released_s = np.full(n, _NEVER)
        self.invalid_count = np.zeros(n, dtype=np.int64)
        self._card_same = np.zeros(n, dtype=np.int64)
        # die alone: readings since the die last changed in which its power (through the lowest spec
        # die-to-coolant resistance) and its rack's supply moved it by stuck_die_move_k from where it
        # last changed
        self._die_moved = np.zeros(n, dtype=np.int64)
        self._die_ref_power_w = nan.copy()
        self._die_ref_supply_c = nan.copy()
        self._r_min_k_per_w = card.r_die_to_case_k_per_w + min(site.cold_plate.r_case_to_coolant_k_per_w)
        # power alone: readings since the power last changed in which the spec's power model, at the
        # card's reported clock, utilization, die and low-power state, moved it by stuck_power_move_w
        self._power_moved = np.zeros(n, dtype=np.int64)
        self._power_ref_model_w = nan.copy()
        self._power_model = PowerModel.from_card(card)
        # a card frozen as a whole while its job's events moved it: readings since its power and die
        # last changed in which its activity (idle, computing, busy not computing: from the job events)
        # differed from what it was then
        self._card_activity = np.full(n, _IDLE, dtype=np.int8)
        self._activity_ref = np.full(n, -1, dtype=np.int8)
        self._activity_moved = np.zeros(n, dtype=np.int64)
        rnan = np.full(r, np.nan)
        self.rack_power_w = rnan.copy()
        self.rack_supply_temp_c = rnan.copy()
        self.rack_return_temp_c = rnan.copy()
        self.rack_flow_lpm = rnan.copy()
        self.rack_pump_power_w = rnan.copy()
        self.rack_pump_speed_frac = np.ones(r)
        self._min_pump_speed_frac = site.min_pump_speed_frac()
        self.rack_pump_speed_reported = np.zeros(r, dtype=bool)  # the latest loop reading gave the speed
        self.rack_cards_seen_s = np.full(r, _NEVER)
        self.rack_loop_seen_s = np.full(r, _NEVER)
        self.rack_pdu_seen_s = np.full(r, _NEVER)
        self.rack_invalid_count = np.zeros(r, dtype=np.int64)
        self.late_count = 0  # readings older than what the belief holds (late, reordered): not taken
        self._loop_same = np.zeros(r, dtype=np.int64)
        # a rack's cards all unchanged while its PDU moved: PDU readings since a card of the rack last
        # changed in which the PDU had moved by stuck_pdu_move_w from what it read then
        self._pdu_moved = np.zeros(r, dtype=np.int64)
        self._pdu_ref_w = rnan.copy()
        self._rack_cards_changed = np.ones(r, dtype=bool)  # since the rack's last PDU reading
        self._rack_cards_read = np.zeros(r, dtype=bool)  # new card readings since then
        self.facility: FacilityReading | None = None
        self._jobs: dict[str, JobInfo] = {}
        self._gone: dict[str, float] = {}  # jobs finished or failed: when (the latest _GONE_KEPT)
        self._queue: list[str] = []
        self._job_key: dict[str, int] = {}
        self._next_key = 0
        self._card_key = np.full(n, -1, dtype=np.int64)
        self.jobs_finished = 0
        self.jobs_failed = 0
        #: jobs gone from the scheduler's snapshot without an event (``JobEvent.dropped``): not in jobs_finished
        self.jobs_dropped = 0

    # ================================================================================================
    # readings
    # ================================================================================================
    def update(self, readings: Readings) -> None:
        """Fold one set of readings into the belief."""
        self.time_s = max(self.time_s, readings.time_s)
        batches: list[tuple[int, float, CardBatch]] = []
        for rr in readings.racks:
            r = rr.rack
            if not 0 <= r < self._n_racks:
                continue
            if rr.cards is not None:  # (its columns' lengths agree: CardBatch checks them)
                batches.append((r, rr.part_time_s("cards"), rr.cards))
            if rr.loop is not None:
                lp = rr.loop
                t = rr.part_time_s("loop")
                vals = (lp.supply_temp_c, lp.return_temp_c, lp.flow_lpm)
                if t < self.rack_loop_seen_s[r]:
                    self.late_count += 1  # late or reordered: older than what the belief holds
                elif t == self.rack_loop_seen_s[r]:
                    pass  # the same reading again (at-least-once delivery)
                elif (
                    all(math.isfinite(v) for v in vals)
                    and _plausible_loop(*vals)
                    and (math.isnan(lp.pump_speed_frac) or pump_speed_in_range(lp.pump_speed_frac))
                ):
                    same = (
                        vals[0] == self.rack_supply_temp_c[r]
                        and vals[1] == self.rack_return_temp_c[r]
                        and vals[2] == self.rack_flow_lpm[r]
                    )
                    self._loop_same[r] = self._loop_same[r] + 1 if same else 0
                    self.rack_supply_temp_c[r], self.rack_return_temp_c[r], self.rack_flow_lpm[r] = vals
                    if math.isfinite(lp.pump_power_w) and lp.pump_power_w >= 0:
                        self.rack_pump_power_w[r] = lp.pump_power_w
                    # 0 is reported: a stopped pump (the wire takes 0 %; the plant's speeds are never
                    # under the site's lowest, its pump faults cut the flow, not the speed). Read as not
                    # reported, the controller took the speed it last commanded for the one in force and
                    # did not resend it (agent.command_diff); reported, it reads the measured flow as the
                    # pump's whole (agent.pumps.full_speed_flow_lpm: a stalled pump) and commands the speed
                    speed = lp.pump_speed_frac
                    reported = pump_speed_in_range(speed)  # (NaN: not reported)
                    if reported:
                        lo = self._min_pump_speed_frac
                        self.rack_pump_speed_frac[r] = lo if lo - _PUMP_SPEED_SNAP_FRAC <= speed < lo else speed
                    self.rack_pump_speed_reported[r] = reported
                    self.rack_loop_seen_s[r] = t
                else:
                    self.rack_invalid_count[r] += 1
            if rr.pdu is not None:
                p = rr.pdu.power_w
                t = rr.part_time_s("pdu")
                if t < self.rack_pdu_seen_s[r]:
                    self.late_count += 1
                elif math.isfinite(p) and 0.0 <= p <= 1e7:
                    if t > self.rack_pdu_seen_s[r]:
                        self._pdu_evidence(r, p)
                    self.rack_power_w[r] = p
                    self.rack_pdu_seen_s[r] = t
                else:
                    self.rack_invalid_count[r] += 1
        if batches:
            self._update_cards(batches)
        if readings.facility is not None:
            self.facility = readings.facility
        for jr in readings.jobs:
            info = self._jobs.get(jr.job_id)
            if info is not None and info.state == "running" and readings.time_s >= info.last_event_s:
                self._jobs[jr.job_id] = _with_progress(info, jr.phase, jr.progress_frac, jr.throughput_frac)

    def _update_cards(self, batches: list[tuple[int, float, CardBatch]]) -> None:
        """All card batches of one :class:`Readings` at once (concatenated: one pass of array ops)."""
        n = self._n
        sizes = [len(b.card_index) for _, _, b in batches]

        def cat(name: str, dtype: Any) -> Any:
            cols = [getattr(b, name) for _, _, b in batches]
            try:  # the usual: one-dimensional arrays whose common type is the column's (values as converted)
                out = np.concatenate(cols)
            except (TypeError, ValueError):
                out = None
            if out is not None and out.dtype == dtype and out.ndim == 1:
                return out
            return np.concatenate([np.asarray(c, dtype=dtype).reshape(-1) for c in cols])

        idx = cat("card_index", np.int64)
        t_arr = np.repeat(np.asarray([t for _, t, _ in batches], dtype=np.float64), sizes)
        power = cat("power_w", np.float64)
        die = cat("die_temp_c", np.float64)
        util = cat("utilization", np.float64)
        clock = cat("clock_mhz", np.float64)
        level = cat("level", np.int64)
        low = cat("low_power", bool)
        waking = cat("waking", bool)
        failed = cat("failed", bool)
        lim = cat("power_limit_w", np.float64)
        host_known = np.repeat(np.asarray([b.host_off is not None for _, _, b in batches], dtype=bool), sizes)
        host_off = np.concatenate(
            [np.asarray(_or_zeros(b.host_off, len(b.card_index)), dtype=bool).reshape(-1) for _, _, b in batches]
        )
        keep = (idx >= 0) & (idx < n)
        # a reading stamped before what the belief holds of its card (late, reordered) is not taken
        late = np.zeros_like(keep)
        late[keep] = t_arr[keep] < self.card_last_seen_s[idx[keep]]
        if late.any():
            self.late_count += int(late.sum())
            keep &= ~late
        if not keep.all():
            idx, t_arr, power, die, util, clock = (a[keep] for a in (idx, t_arr, power, die, util, clock))
            level, low, waking, failed, lim = (a[keep] for a in (level, low, waking, failed, lim))
            host_known, host_off = host_known[keep], host_off[keep]
        with np.errstate(invalid="ignore"):
            valid = (
                np.isfinite(power)
                & np.isfinite(die)
                & np.isfinite(util)
                & np.isfinite(clock)
                & (power >= 0.0)
                & (power <= self._max_power_w)
                & (die >= _DIE_RANGE_C[0])
                & (die <= _DIE_RANGE_C[1])
                & (util >= 0.0)
                & (util <= 1.0)
                & (clock >= 0.0)
                & (clock <= self.max_plausible_clock_mhz)
            )
        ok = idx[valid]
        if not valid.all():
            np.add.at(self.invalid_count, idx[~valid], 1)
        seen, new_t = self.card_last_seen_s[ok], t_arr[valid]
        # the same reading again (at-least-once delivery, same time stamp) is no new evidence of a frozen sensor
        new = new_t > seen
        v_new = np.flatnonzero(valid)[new]
        self._stuck_evidence(ok[new], power[v_new], die[v_new], util[v_new], clock[v_new], low[v_new])
        self.card_power_w[ok] = power[valid]
        self.card_die_temp_c[ok] = die[valid]
        self.card_utilization[ok] = util[valid]
        self.card_clock_mhz[ok] = clock[valid]
        self.card_prev_seen_s[ok] = np.where(new, seen, self.card_prev_seen_s[ok])
        self.card_last_seen_s[ok] = np.maximum(seen, new_t)
        level_ok = (level >= 0) & (level < self._clocks.size)
        self.card_level[idx[level_ok]] = level[level_ok]
        self.card_low_power[idx] = low
        self.card_waking[idx] = waking
        # a card of a powered-off host reads asleep at 0 W whether or not it has failed: the belief
        # keeps what it knew of it until its host is on again (else a failed card is forgotten when
        # its idle host goes off, and jobs are placed on it)
        unknown = host_known & host_off
        self.card_failed[idx] = np.where(unknown, self.card_failed[idx], failed)
        self.card_host_off[idx[host_known]] = host_off[host_known]
        lim_ok = np.isfinite(lim) & (lim > 0)
        self.card_power_limit_w[idx[lim_ok]] = lim[lim_ok]
        for rack, t, _ in batches:
            if t > self.rack_cards_seen_s[rack]:
                self.rack_cards_seen_s[rack] = t

    def _stuck_evidence(
        self, ok: IntArray, power: FloatArray, die: FloatArray, util: FloatArray, clock: FloatArray, low: BoolArray
    ) -> None:
        """Count exact repetitions for new valid readings of cards ``ok`` (before they are stored): of
        power and die together (a card frozen as a whole), of the die alone while what drives it
        moved, and of the power alone while what drives it moved (see :meth:`stuck_cards`).

        ``at`` indexes the belief's per-card arrays: ``ok`` itself, or the whole array when ``ok``
        is every card in site order (a full round, the usual: a slice reads and writes the same
        entries as the index array, without gathering them)."""
        at: IntArray | slice = slice(None) if np.array_equal(ok, self._site_order) else ok
        same = (power == self.card_power_w[at]) & (die == self.card_die_temp_c[at])
        self._card_same[at] = np.where(same, self._card_same[at] + 1, 0)
        rack = ok // self._cpr
        self._rack_cards_changed[rack[~same]] = True
        self._rack_cards_read[rack] = True
        supply = self.rack_supply_temp_c[rack]
        die_same = die == self.card_die_temp_c[at]
        move = _nan_to_num(np.abs(power - self._die_ref_power_w[at]) * self._r_min_k_per_w)
        move += _nan_to_num(np.abs(supply - self._die_ref_supply_c[at]))
        self._die_moved[at] = np.where(die_same, self._die_moved[at] + (move >= self.stuck_die_move_k), 0)
        changed = ok[~die_same]
        self._die_ref_power_w[changed] = power[~die_same]
        self._die_ref_supply_c[changed] = supply[~die_same]
        # the power the spec's model gives at the clock the card reports (its own brake and slowdown
        # included), its utilization, die and low-power state
        pm = self._power_model
        level = np.abs(clock[:, None] - pm.clocks_mhz[None, :]).argmin(axis=1)
        model_w = pm.card_power_w(level, util, die, low)
        power_same = power == self.card_power_w[at]
        p_move = _nan_to_num(np.abs(model_w - self._power_ref_model_w[at]))
        self._power_moved[at] = np.where(power_same, self._power_moved[at] + (p_move >= self.stuck_power_move_w), 0)
        self._power_ref_model_w[ok[~power_same]] = model_w[~power_same]
        activity = self._card_activity[at]  # (a view with a slice: _card_activity is not written here)
        activity_moved = activity != self._activity_ref[at]
        self._activity_moved[at] = np.where(same, self._activity_moved[at] + activity_moved, 0)
        self._activity_ref[ok[~same]] = activity[~same]

    def _pdu_evidence(self, r: int, pdu_w: float) -> None:
        """A new PDU reading of rack ``r``: count it when the rack's cards reported since the last one
        and none changed, and it moved by ``stuck_pdu_move_w`` from what the PDU read when they last
        did (see :meth:`stuck_racks`)."""
        if self._rack_cards_changed[r]:
            self._pdu_moved[r] = 0
            self._pdu_ref_w[r] = pdu_w
        elif self._rack_cards_read[r] and abs(pdu_w - self._pdu_ref_w[r]) >= self.stuck_pdu_move_w:
            self._pdu_moved[r] += 1  # (cards that do not report at all are stale, not stuck)
        self._rack_cards_changed[r] = self._rack_cards_read[r] = False

    # ================================================================================================
    # job events
    # ================================================================================================
    def apply_events(self, events: Iterable[JobEvent]) -> None:
        for ev in events:
            self._apply_event(ev)

    def _apply_event(self, ev: JobEvent) -> None:
        info = self._jobs.get(ev.job_id)
        if ev.kind == "submitted":
            if info is not None:
                return  # the same event again (at-least-once delivery): a running job is not queued anew
            gone_s = self._gone.get(ev.job_id)
            if gone_s is not None and ev.time_s <= gone_s:
                return  # a late copy of the submission of a job that has finished since
            spec = ev.job
            info = JobInfo(
                job_id=ev.job_id,
                state="queued",
                phase=Phase.WAITING,
                n_cards=spec.n_cards if spec else 0,
                cards=(),
                priority=spec.priority if spec else 1.0,
                min_throughput_frac=spec.min_throughput_frac if spec else 0.0,
                compute_share=spec.compute_share if spec else 1.0,
                noncompute_utilization=spec.noncompute_utilization if spec else 0.2,
                step_time_s=spec.step_time_s if spec else 1.0,
                submit_time_s=spec.submit_time_s if spec else ev.time_s,
                progress_frac=0.0,
                throughput_frac=0.0,
                last_event_s=ev.time_s,
                spec=spec,
            )
            self._jobs[ev.job_id] = info
            self._job_key[ev.job_id] = self._next_key
            self._next_key += 1
            if ev.job_id not in self._queue:
                self._queue.append(ev.job_id)
            return
        if info is None:
            return  # events of a job we never saw submitted (agent started late): ignore
        if ev.time_s < info.last_event_s:
            return  # older than what the belief knows of the job (reordered, a late copy): not taken
        if ev.kind == "started" and info.state == "running" and ev.time_s == info.last_event_s:
            return  # the same start again (at-least-once delivery; a phase at its time may have followed)
        if ev.kind == "started":
            self._drop_from_queue(ev.job_id)
            self._set_cards(ev.job_id, (), released_s=ev.time_s)
            self._set_cards(ev.job_id, ev.cards)
            self._jobs[ev.job_id] = replace(
                info, state="running", phase=ev.phase, cards=tuple(ev.cards), last_event_s=ev.time_s
            )
            self._mark_activity(ev.job_id)
        elif ev.kind == "phase":
            self._jobs[ev.job_id] = replace(info, phase=ev.phase, last_event_s=ev.time_s)
            self._mark_activity(ev.job_id)
        elif ev.kind == "requeued":
            self._set_cards(ev.job_id, (), released_s=ev.time_s)
            self._jobs[ev.job_id] = replace(
                info, state="queued", phase=Phase.WAITING, cards=(), throughput_frac=0.0, last_event_s=ev.time_s
            )
            self._drop_from_queue(ev.job_id)
            self._queue.insert(0, ev.job_id)
        elif ev.kind in ("finished", "failed"):
            self._set_cards(ev.job_id, (), released_s=ev.time_s)
            self._drop_from_queue(ev.job_id)
            del self._jobs[ev.job_id]
            self._job_key.pop(ev.job_id, None)
            self._gone[ev.job_id] = ev.time_s
            if len(self._gone) > _GONE_KEPT:
                del self._gone[next(iter(self._gone))]
            if ev.dropped:
                self.jobs_dropped += 1  # gone while the agent did not listen: finished or cancelled, unknown
            elif ev.kind == "finished":
                self.jobs_finished += 1
            else:
                self.jobs_failed += 1

    def _drop_from_queue(self, job_id: str) -> None:
        if job_id in self._queue:
            self._queue.remove(job_id)

    def _mark_activity(self, job_id: str) -> None:
        """Note what a running job's cards do now, by its phase (:meth:`stuck_cards`)."""
        info = self._jobs[job_id]
        idx = np.asarray(info.cards, dtype=np.int64)
        idx = idx[(idx >= 0) & (idx < self._n)]
        idx = idx[self._card_key[idx] == self._job_key[job_id]]
        self._card_activity[idx] = _COMPUTING if info.phase == Phase.COMPUTE else _BUSY_NOT_COMPUTING

    def _set_cards(self, job_id: str, cards: tuple[int, ...], *, released_s: float = _NEVER) -> None:
        """Give the job ``cards``; ``()`` takes its cards back (noting ``released_s`` on them)."""
        key = self._job_key[job_id]
        if not cards:
            info = self._jobs.get(job_id)
            if info is not None and info.cards:
                old = np.asarray(info.cards, dtype=np.int64)
                old = old[(old >= 0) & (old < self._n)]
                old = old[self._card_key[old] == key]
                self._card_key[old] = -1
                self._card_activity[old] = _IDLE
                self.card_released_s[old] = np.maximum(self.card_released_s[old], released_s)
            return
        idx = np.asarray(cards, dtype=np.int64)
        self._card_key[idx[(idx >= 0) & (idx < self._n)]] = key

    # ================================================================================================
    # queries
    # ================================================================================================
    @property
    def jobs(self) -> dict[str, JobInfo]:
        return dict(self._jobs)

    def queue(self) -> tuple[JobInfo, ...]:
        return tuple(self._jobs[j] for j in self._queue)

    def rack_last_seen_s(self) -> FloatArray:
        """The oldest of each rack's sources: its cards (the stalest card that has not failed),
        loop and PDU readings."""
        cards = np.where(self.card_failed, np.inf, self.card_last_seen_s).reshape(self._n_racks, self._cpr)
        oldest_card = cards.min(axis=1)
        oldest_card = np.where(np.isinf(oldest_card) & (oldest_card > 0), self.rack_cards_seen_s, oldest_card)
        return np.asarray(
            np.minimum(np.minimum(oldest_card, self.rack_loop_seen_s), self.rack_pdu_seen_s), dtype=np.float64
        )

    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s`` (a restarted simulator, a publisher's clock
        stepped): times the belief holds beyond it belong to the old timeline and come back to it,
        so that a source silent since is judged stale on the new one, not fresh until the old
        times come round again."""
        for arr in (
            self.card_last_seen_s,
            self.card_prev_seen_s,
            self.card_released_s,
            self.rack_cards_seen_s,
            self.rack_loop_seen_s,
            self.rack_pdu_seen_s,
        ):
            np.minimum(arr, now_s, out=arr)
        self.time_s = min(self.time_s, now_s)
        # a job's events on the new timeline are not older than the ones it had on the old one
        for job_id, info in self._jobs.items():
            if info.last_event_s > now_s:
                self._jobs[job_id] = replace(info, last_event_s=now_s)
        for job_id, gone_s in self._gone.items():
            self._gone[job_id] = min(gone_s, now_s)

    def stale_racks(self, now_s: float, deadline_s: float) -> tuple[int, ...]:
        """Racks with any source (a card, the loop, the PDU) not seen within ``deadline_s``."""
        return tuple(int(r) for r in np.flatnonzero(self.rack_last_seen_s() < now_s - deadline_s))

    def stale_cards(self, now_s: float, deadline_s: float) -> tuple[int, ...]:
        stale = (self.card_last_seen_s < now_s - deadline_s) & ~self.card_failed
        return tuple(int(c) for c in np.flatnonzero(stale))

    def _moving_racks(self) -> BoolArray:
        """Racks whose latest card reading changed (some seen card's count is 0)."""
        same = self._card_same.reshape(self._n_racks, self._cpr)
        seen = np.isfinite(self.card_last_seen_s).reshape(self._n_racks, self._cpr)
        return np.asarray(((same == 0) & seen).any(axis=1), dtype=bool)

    def stuck_racks(self) -> tuple[int, ...]:
        """Racks whose card readings (all of them) or loop readings repeated exactly over
        ``stuck_after_readings`` readings while another rack's readings changed, and racks whose
        cards all repeated over ``stuck_after_readings`` PDU readings in which the PDU had moved by
        ``stuck_pdu_move_w`` (more than all of its hosts could: only its cards can) from what it
        read when they last changed (a site frozen as a whole, its PDUs read apart)."""
        n = self.stuck_after_readings
        if max(self._card_same.max(), self._loop_same.max(), self._pdu_moved.max()) < n:
            return ()  # no count has reached it: no part of _stuck_rack_parts can hold (asked every reading)
        cards, loop = self._stuck_rack_parts()
        return tuple(int(r) for r in np.flatnonzero(cards | loop))

    def stuck_cards(self) -> tuple[int, ...]:
        """Cards frozen while others of their rack change (a rack frozen as a whole is in
        :meth:`stuck_racks` instead), and cards whose die temperature alone is frozen: unchanged over
        ``stuck_after_readings`` readings in which its own power or its rack's supply had moved it
        by ``stuck_die_move_k`` (a sensor that reads whole degrees holds one value while nothing
        moves it; it cannot hold it through a load step or a set-point change), and cards whose power
        alone is frozen: unchanged over ``stuck_after_readings`` readings in which the power model, at
        the card's reported clock, utilization, die and low-power state, had moved it by
        ``stuck_power_move_w``, and cards awake whose power and die both held over
        ``stuck_after_readings`` readings in which their job's events had changed what they do
        (idle, computing, busy not computing): a site frozen as a whole, its PDUs with it."""
        n = self.stuck_after_readings
        if max(self._card_same.max(), self._activity_moved.max(), self._die_moved.max(), self._power_moved.max()) < n:
            return ()  # no count has reached it: no part of _stuck_card_parts can hold (asked every reading)
        die, power = self._stuck_card_parts()
        return tuple(int(c) for c in np.flatnonzero(die | power))

    def frozen_readings(self) -> tuple[BoolArray, BoolArray]:
        """Which readings the stuck cards and racks have frozen (:meth:`stuck_cards`,
        :meth:`stuck_racks`): per card, its die temperature (the card frozen as a whole, its die
        alone, or all of its rack's cards: not its power alone); per rack, its loop readings (not a
        rack stuck for its cards only). New arrays; the belief is not changed."""
        die, _ = self._stuck_card_parts()
        cards, loop = self._stuck_rack_parts()
        return die | np.repeat(cards, self._cpr), loop

    def _stuck_rack_parts(self) -> tuple[BoolArray, BoolArray]:
        """Per rack, of :meth:`stuck_racks`: stuck for its cards' readings, stuck for its loop's."""
        n = self.stuck_after_readings
        cards_frozen = (self._card_same.reshape(self._n_racks, self._cpr) >= n).all(axis=1)
        loop_frozen = self._loop_same >= n
        pdu_says = self._pdu_moved >= n
        if not (cards_frozen.any() or loop_frozen.any() or pdu_says.any()):
            return np.zeros(self._n_racks, dtype=bool), np.zeros(self._n_racks, dtype=bool)
        moving = self._moving_racks()
        others_moving = int(moving.sum()) - moving.astype(np.int64) > 0
        return (cards_frozen & others_moving) | pdu_says, loop_frozen & others_moving

    def _stuck_card_parts(self) -> tuple[BoolArray, BoolArray]:
        """Per card, of :meth:`stuck_cards`: its die reading frozen, its power reading frozen."""
        n = self.stuck_after_readings
        same = self._card_same.reshape(self._n_racks, self._cpr)
        moving = (same == 0).any(axis=1)
        whole = ((same >= n) & moving[:, None]).ravel()
        awake = ~self.card_failed & ~self.card_host_off
        both = whole | ((self._activity_moved >= n) & ~self.card_low_power & awake)
        die = both | ((self._die_moved >= n) & awake)
        power = both | ((self._power_moved >= n) & awake)
        return die, power

    def snapshot(self) -> StateSnapshot:
        running = [j for j in self._jobs.values() if j.state == "running"]
        keys = np.asarray([self._job_key[j.job_id] for j in running], dtype=np.int64)
        pos = np.full(self._next_key + 1, -1, dtype=np.int64)
        if keys.size:
            pos[keys] = np.arange(keys.size)
        card_job = np.where(self._card_key >= 0, pos[self._card_key], -1).astype(np.int64)
        return StateSnapshot(
            time_s=self.time_s,
            card_power_w=self.card_power_w.copy(),
            card_die_temp_c=self.card_die_temp_c.copy(),
            card_utilization=self.card_utilization.copy(),
            card_clock_mhz=self.card_clock_mhz.copy(),
            card_level=self.card_level.copy(),
            card_low_power=self.card_low_power.copy(),
            card_waking=self.card_waking.copy(),
            card_failed=self.card_failed.copy(),
            card_power_limit_w=self.card_power_limit_w.copy(),
            card_last_seen_s=self.card_last_seen_s.copy(),
            card_prev_seen_s=self.card_prev_seen_s.copy(),
            card_job=card_job,
            card_host_off=self.card_host_off.copy(),
            card_released_s=self.card_released_s.copy(),
            rack_power_w=self.rack_power_w.copy(),
            rack_supply_temp_c=self.rack_supply_temp_c.copy(),
            rack_return_temp_c=self.rack_return_temp_c.copy(),
            rack_flow_lpm=self.rack_flow_lpm.copy(),
            rack_pump_power_w=self.rack_pump_power_w.copy(),
            rack_pump_speed_frac=self.rack_pump_speed_frac.copy(),
            rack_last_seen_s=self.rack_last_seen_s(),
            stuck_racks=self.stuck_racks(),
            stuck_cards=self.stuck_cards(),
            facility=self.facility,
            jobs=tuple(running),
            queue=self.queue(),
            rack_pump_speed_reported=self.rack_pump_speed_reported.copy(),
        )


def _with_progress(info: JobInfo, phase: Phase, progress_frac: float, throughput_frac: float) -> JobInfo:
    """``replace(info, phase=phase, progress_frac=..., throughput_frac=...)``: the same frozen copy
    without ``dataclasses.replace``'s field walk (every running job's reading, every step)."""
    new = object.__new__(JobInfo)
    fields = new.__dict__
    fields.update(info.__dict__)
    fields["phase"] = phase
    fields["progress_frac"] = progress_frac
    fields["throughput_frac"] = throughput_frac
    return new


_FLOAT_MAX = float(np.finfo(np.float64).max)


def _nan_to_num(x: FloatArray) -> FloatArray:
    """``np.nan_to_num`` of a float64 array (NaN -> 0, +-inf -> +-largest float), in three ufunc calls."""
    out = np.where(np.isnan(x), 0.0, x)
    np.minimum(out, _FLOAT_MAX, out=out)
    np.maximum(out, -_FLOAT_MAX, out=out)
    return out


def _or_zeros(a: Any, n: int) -> Any:
    return a if a is not None else np.zeros(n, dtype=bool)


def _plausible_loop(supply_c: float, return_c: float, flow_lpm: float) -> bool:
    return -20.0 <= supply_c <= 100.0 and -20.0 <= return_c <= 120.0 and 0.0 <= flow_lpm <= 1e5
