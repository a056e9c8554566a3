"""The virtual plant: the whole site stepped in time with its TRUE parameters.

``Plant(site, jobs, faults, config)`` holds every card's die and cold-plate temperature, DVFS level,
power limit, low-power state and job; every rack loop; the facility. ``step(dt_s)`` advances it
with power and coolant inlet held over the step (zero-order hold):

1. due actions: job submissions, DVFS commands whose latency has passed, cards that finished
   waking, faults starting or ending, the built-in scheduler;
2. each card's own protection (``twin.power``): power brake to the fastest level at or below the
   commanded one whose power, at the utilization the card would have at that level, stays within
   its power limit; then one level slower per ``SLOWDOWN_K_PER_LEVEL`` above its slowdown
   temperature (same rules as ``PowerModel.protected_level``);
3. jobs: a job computes at the pace of its slowest card, ``relative_throughput(compute_share,
   f_slowest/f_top)``; cards faster than the slowest wait (``synchronous_utilization``); power
   ``P = idle_k + leak_k (T - T_ref) + u dyn_k`` per card with per-card manufacturing spread
   (``CardVariation``); low-power cards draw the low-power idle power, failed cards 0 W;
4. the RC network (``twin.thermal.ThermalNetwork``, exact for any step);
5. racks (cards + host overhead), loop return temperature from ``Q = m c_p dT``, the facility
   (``twin.cooling.facility_cooling`` at the current ambient, heat waves included), energy and
   work accounting; jobs reaching a checkpoint or their end change phase.

Commands (``set_levels``, ``set_power_limits``, ``enter_low_power``, ``wake``,
``set_supply_temp``, ``set_pump_speed``, ``place_job``) either apply entirely or raise :class:`CommandError` with the
reason. ``readings()`` gives noisy telemetry (``twin.readings``) with sensor faults applied
(``twin.plant_readings``, ``twin.sensor_faults``); ``truth()`` the exact values; ``drain_events()`` the job events;
``accounting()`` energy and work.

Work is counted in top-clock-equivalent card-seconds (``twin.workload``): throughput is work per
second. Everything is seeded: the same site, jobs, faults, config and command sequence give the
same trajectory; sensor noise has its own random stream, so how often readings are taken does not
change the physics.

Speed: the hot path is vectorized over cards; Python loops run over jobs only when one of them
changes phase. See benchmarks/bench_twin.py.

Modules: this one holds the cards, hosts, loops, facility and timeline (submissions, commands,
wakes, faults); ``twin.plant_faults`` (``PlantFaults``, which ``Plant`` holds and calls) the plant
faults: their checks, the timeline actions and edges they bring, the flow, fouling and ambient they
leave in force; ``twin.plant_jobs`` (``PlantJobs``, likewise) the jobs: queue, built-in scheduler,
phases and their timers, checkpoints, failures, work accounting and job events;
``twin.plant_readings`` (``PlantSensors``, likewise) the sensors: noise, their random stream, the
sensor faults in force, and the readings they make of the true state; ``twin.plant_types`` the value
types (``PlantConfig``, ``Truth``, ``Accounting``, ...), re-exported here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from twin.cooling import facility_cooling, rack_pump_power_w
from twin.faults import (
    Ambient,
    CardFailure,
    ColdPlateFouling,
    ConstantAmbient,
    DiurnalAmbient,
    Fault,
    GarbageReadings,
    HeatWave,
    PiecewiseAmbient,
    PumpDegradation,
    SensorDropout,
    StuckSensor,
)
from twin.plant_faults import PlantFaults
from twin.plant_jobs import PlantJobs
from twin.plant_readings import PlantSensors
from twin.plant_types import (
    Accounting,
    BoolArray,
    CardVariation,
    CommandError,
    FloatArray,
    IntArray,
    JobRecord,
    PlantConfig,
    SensorNoise,
    Truth,
)
from twin.power import SLOWDOWN_K_PER_LEVEL, PowerModel
from twin.readings import JobEvent, Readings
from twin.spec import SiteSpec
from twin.thermal import ThermalNetwork, ThermalParams, plate_resistance_k_per_w
from twin.workload import JobSpec

__all__ = [
    "Accounting",
    "Ambient",
    "CardFailure",
    "CardVariation",
    "ColdPlateFouling",
    "CommandError",
    "ConstantAmbient",
    "DiurnalAmbient",
    "Fault",
    "GarbageReadings",
    "HeatWave",
    "JobRecord",
    "PiecewiseAmbient",
    "Plant",
    "PlantConfig",
    "PumpDegradation",
    "SensorDropout",
    "SensorNoise",
    "StuckSensor",
    "Truth",
]

_EPS_S = 1e-6
_INF = math.inf
# a warm start's thermal steady state (Plant.settle_warm_start): leakage's feedback through the die
# temperature shrinks by k * R_total (~0.05) per iteration, so a few iterations reach 1 mK
_WARM_START_ITERATIONS = 50
_WARM_START_TOLERANCE_K = 1e-3


def _per_target(values: Any, n: int, what: str, name: str) -> FloatArray:
    """``values`` as one number per target of a command (one value for all, or one each), as
    floats; a count that fits neither, or values that are not numbers, raise ``CommandError``."""
    arr = np.asarray(values)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise CommandError(f"{what}: {name} must be numbers")
    try:
        return np.broadcast_to(arr.astype(np.float64), (n,))
    except ValueError:
        raise CommandError(f"{what}: {arr.size} {name} for {n} targets (give one, or one per target)") from None


class Plant:
    """The whole site in time. See the module docstring."""

    def __init__(
        self,
        site: SiteSpec,
        jobs: list[JobSpec] | tuple[JobSpec, ...] = (),
        faults: Sequence[Fault] = (),
        config: PlantConfig | None = None,
    ) -> None:
        cfg = config if config is not None else PlantConfig()
        self.site = site
        self._config = cfg
        card = site.card
        n, n_racks, cpr = site.n_cards, site.n_racks, site.cards_per_rack
        self._n, self._n_racks, self._cpr = n, n_racks, cpr
        self._model = PowerModel.from_card(card)
        self._n_levels = card.n_levels
        if not 0 <= cfg.initial_level < self._n_levels:
            raise ValueError(f"initial_level must be within 0..{self._n_levels - 1}")
        self._clocks = self._model.clocks_mhz
        self._r_clock = self._clocks[0] / self._clocks  # step stretch f_top / f per level
        self._card_rack = site.card_rack()
        default_ambient = ConstantAmbient(site.facility.ambient_temp_c)
        self._ambient: Ambient = cfg.ambient if cfg.ambient is not None else default_ambient

        # ---- true per-card parameters (spread around the spec) ----------------------------------
        var_rng = np.random.default_rng([cfg.seed, 0])
        v = cfg.variation

        def spread(sd: float) -> FloatArray:
            return np.asarray(1.0 + sd * np.clip(var_rng.standard_normal(n), -3.0, 3.0), dtype=np.float64)

        self._s_idle = spread(v.idle_sd_frac)
        self._s_dyn = spread(v.dynamic_sd_frac)
        self._s_leak = spread(v.leakage_sd_frac)
        self._s_r = spread(v.r_th_sd_frac)
        self._lp_idle_w = card.low_power_idle_w * self._s_idle
        self._lp_leak = card.low_power_leakage_w_per_k * self._s_leak
        self._t_ref = card.reference_temp_c
        self._slowdown_c = card.slowdown_temp_c

        # ---- cooling ------------------------------------------------------------------------------
        self._flow_frac = np.ones(n_racks)
        self._pump_speed = np.ones(n_racks)
        self._pump_cmd = np.zeros(n_racks, dtype=np.int64)  # commands per rack (the hold's token)
        self._flow_varies = False
        self._r_foul = np.ones(n)
        self._thermal = ThermalNetwork(self._thermal_params())
        self._setpoint_c = site.facility.supply_temp_c
        self._supply_c = self._setpoint_c
        self._rack_pump_w = rack_pump_power_w(site, self._flow_frac)
        self._mcp_nominal = site.loop_flow_per_rack_lpm() / 60_000.0 * site.loop.density_kg_per_m3
        self._mcp_nominal *= site.loop.specific_heat_j_per_kg_k

        # ---- card state ---------------------------------------------------------------------------
        self._t = 0.0
        self._set_level = np.full(n, cfg.initial_level, dtype=np.int64)
        self._eff_level = self._set_level.copy()
        self._limit = np.full(n, card.power_limit_w)
        self._low = np.full(n, cfg.initial_low_power, dtype=bool)
        self._waking = np.zeros(n, dtype=bool)
        self._wake_at = np.zeros(n)
        self._failed = np.zeros(n, dtype=bool)
        self._fail_count = np.zeros(n, dtype=np.int64)  # card failures in force per card (they may overlap)
        self._n_low = int(self._low.sum())
        self._n_failed = 0
        # hosts (site.rack.hosts_per_rack > 0): an off host's cards are asleep and draw nothing
        self._card_host = site.card_host()
        self._host_off = np.zeros(site.n_hosts, dtype=bool)
        self._host_ready_at = np.zeros(site.n_hosts)
        self._card_off = np.zeros(n, dtype=bool)  # the card's host is off
        self._n_hosts_off = 0
        self._power = np.zeros(n)
        self._util = np.zeros(n)
        self._busy_in_step = np.zeros(n, dtype=bool)
        self._n_throttled = 0

        # ---- jobs: queue, scheduler, phases; what each card's job asks of it -----------------------
        self._jobs = PlantJobs(site, cfg, self._ready_for_job)

        # ---- timeline ------------------------------------------------------------------------------
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._faults = PlantFaults(site)  # the plant faults scheduled: edges, flow, fouling, heat waves

        # ---- sensors -------------------------------------------------------------------------------
        self._sensors = PlantSensors(site, cfg, self._clocks)

        # ---- accounting ---------------------------------------------------------------------------
        self._acc = {
            "it_j": 0.0,
            "cool_j": 0.0,
            "fac_j": 0.0,
            "over_s": 0.0,
            "over_j": 0.0,
            "throttled": 0.0,
        }
        self._max_die = -_INF

        # ---- initial steady state at idle ---------------------------------------------------------
        self._supply_decay: dict[float, float] = {}
        self._init_thermal_steady()
        self._max_die = float(self._die.max())
        for job in jobs:
            self.submit(job)
        for f in faults:
            self.add_fault(f)

    # ================================================================================================
    # setup helpers
    # ================================================================================================
    def _thermal_params(self) -> ThermalParams:
        site = self.site
        q = site.loop.flow_per_card_lpm * self._flow_frac[self._card_rack]
        r_pc = plate_resistance_k_per_w(site.cold_plate.flow_lpm, site.cold_plate.r_case_to_coolant_k_per_w, q)
        n = self._n
        return ThermalParams(
            r_die_case_k_per_w=site.card.r_die_to_case_k_per_w * self._s_r,
            r_case_coolant_k_per_w=np.asarray(r_pc * self._s_r * self._r_foul, dtype=np.float64),
            c_die_j_per_k=np.full(n, site.card.die_heat_capacity_j_per_k),
            c_plate_j_per_k=np.full(n, site.cold_plate.heat_capacity_j_per_k),
        )

    def _init_thermal_steady(self) -> None:
        """Start every card at the thermal steady state of its initial (idle) power."""
        m = self._model
        lvl = self._set_level
        p_r = np.where(self._low, self._lp_idle_w, m.idle_w[lvl] * self._s_idle)
        k = np.where(self._low, self._lp_leak, m.leak_w_per_k[lvl] * self._s_leak)
        r_tot = self._thermal.params.r_total_k_per_w
        power = (p_r + k * (self._supply_c - self._t_ref)) / (1.0 - k * r_tot)
        self._die, self._plate = self._thermal.steady_state(power, self._supply_c)
        self._power = power
        self._finish_step_outputs(0.0, self._supply_c)

    def settle_warm_start(self) -> None:
        """Take the jobs placed so far as running since before t = 0 (a warm start): what their
        timers have due now takes effect (a job placed with no start-up wait computes from now, not
        from the first step), and every card starts at the thermal steady state of its power now,
        leakage included (found by fixed-point iteration: leakage rises with the die temperature it
        heats). Only before the first step; the built-in scheduler still runs at the first step."""
        if self._t != 0.0 or self._acc["it_j"] != 0.0:
            raise RuntimeError("settle_warm_start: only before the first step")
        t = self._t
        self._jobs.process_timers(t)
        self._jobs.refresh_order()
        supply = self._supply_c
        for _ in range(_WARM_START_ITERATIONS):
            self._compute_power()
            die, plate = self._thermal.steady_state(self._power, supply)
            moved_k = float(np.max(np.abs(die - self._die))) if die.size else 0.0
            self._die, self._plate = die, plate
            if moved_k < _WARM_START_TOLERANCE_K:
                break
        self._compute_power()
        self._finish_step_outputs(0.0, supply)
        self._max_die = float(self._die.max())

    def _push(self, time_s: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, payload))

    # ================================================================================================
    # public: inputs
    # ================================================================================================
    @property
    def config(self) -> PlantConfig:
        return self._config

    @property
    def time_s(self) -> float:
        return self._t

    @property
    def n_cards(self) -> int:
        return self._n

    @property
    def rack_power_w(self) -> FloatArray:
        """TRUE power of every rack (cards + host overhead) over the last step (a copy; cheaper
        than :meth:`truth` for judging the rack limits every step)."""
        out: FloatArray = self._rack_power.copy()
        return out

    def submit(self, job: JobSpec) -> None:
        """Add a job; it enters the queue at ``job.submit_time_s`` (now if that has passed)."""
        rec = self._jobs.new(job)
        if job.submit_time_s > self._t + _EPS_S:
            self._push(job.submit_time_s, "submit", rec)
        else:
            self._jobs.enqueue(rec, self._t, front=False)

    def add_fault(self, fault: Fault) -> None:
        """Schedule a fault (see ``twin.faults``). A fault that starts at or before the plant's time
        (e.g. at t = 0 on a new plant) is in force at once, not from the next step: the readings
        taken now show it, and a job placed now does not get a card that has failed."""
        for time_s, kind, payload in self._faults.schedule(fault):
            self._push(time_s, kind, payload)
        start_s = fault.at_s if isinstance(fault, CardFailure) else fault.start_s
        if start_s <= self._t + _EPS_S:
            self._apply_due_now()

    def _apply_due_now(self) -> None:
        """Apply the timeline's actions due at the current time (rather than at the start of the next
        step, which would find nothing left to do) and refresh what readings and truth show of this
        instant: card powers, racks, loops, cooling (no time passes: nothing is integrated)."""
        t = self._t
        if self._heap and self._heap[0][0] <= t + _EPS_S:
            self._process_timeline(t)
        self._jobs.refresh_order()
        self._compute_power()
        self._finish_step_outputs(0.0, self._supply_c)

    def next_fault_change_s(self) -> float:
        """Site time of the next change a plant fault brings after now (a card failing or repaired, a
        pump degradation or fouling starting, ramping or ending, a sensor fault starting or ending);
        inf when none is left. Heat waves change the ambient smoothly and have no such edges."""
        return self._faults.next_change_s(self._t)

    # ---- commands -------------------------------------------------------------------------------
    def _cards(self, cards: Any, what: str) -> IntArray:
        idx = np.atleast_1d(np.asarray(cards))
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        if idx.dtype == np.bool_:
            if idx.size != self._n:
                raise CommandError(f"{what}: a card mask must have {self._n} entries, got {idx.size}")
            return np.flatnonzero(idx).astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise CommandError(f"{what}: card indices must be integers")
        idx = idx.astype(np.int64)
        bad = (idx < 0) | (idx >= self._n)
        if bad.any():
            raise CommandError(f"{what}: card {int(idx[bad][0])} is not in 0..{self._n - 1}")
        return idx

    def _refuse_failed(self, idx: IntArray, what: str) -> None:
        if self._n_failed and self._failed[idx].any():
            dead = tuple(int(c) for c in np.unique(idx[self._failed[idx]]))
            raise CommandError(f"{what}: card {dead[0]} has failed", failed_cards=dead)

    def set_levels(self, cards: Any, levels: Any) -> None:
        """Command DVFS levels (0 = fastest); they take effect ``card.dvfs_latency_s`` later (at the
        first step that starts at or after that time). A later command overrides an earlier one."""
        idx = self._cards(cards, "set_levels")
        if idx.size == 0:
            return
        lv_f = _per_target(levels, idx.size, "set_levels", "levels")
        if not np.all(np.isfinite(lv_f)) or not np.all(lv_f == np.round(lv_f)):
            raise CommandError("set_levels: levels must be integers")
        lv = lv_f.astype(np.int64)
        bad = (lv < 0) | (lv >= self._n_levels)
        if bad.any():
            raise CommandError(f"set_levels: level {int(lv[bad][0])} is not in 0..{self._n_levels - 1}")
        self._refuse_failed(idx, "set_levels")
        due = self._t + self.site.card.dvfs_latency_s
        self._push(due, "dvfs", (idx.copy(), lv.copy()))

    def set_power_limits(self, cards: Any, power_limit_w: Any) -> None:
        """Set card power limits (W), effective at once (firmware power capping acts in ms)."""
        idx = self._cards(cards, "set_power_limits")
        if idx.size == 0:
            return
        lim = _per_target(power_limit_w, idx.size, "set_power_limits", "limits")
        lo, hi = self.config.min_power_limit_w, self.site.card.power_limit_w
        bad = ~np.isfinite(lim) | (lim < lo) | (lim > hi)
        if bad.any():
            raise CommandError(f"set_power_limits: {float(lim[bad][0]):g} W is not within {lo:g}..{hi:g} W")
        self._refuse_failed(idx, "set_power_limits")
        self._limit[idx] = lim

    def enter_low_power(self, cards: Any) -> None:
        """Put idle cards into the low-power state (immediately). Busy cards are refused."""
        idx = self._cards(cards, "enter_low_power")
        if idx.size == 0:
            return
        self._refuse_failed(idx, "enter_low_power")
        busy = self._jobs.busy_card(idx)
        if busy is not None:
            raise CommandError(f"enter_low_power: card {busy[0]} is busy with job {busy[1]}")
        self._low[idx] = True
        self._waking[idx] = False
        self._n_low = int(self._low.sum())

    def wake(self, cards: Any) -> None:
        """Leave the low-power state; the card is usable ``card.wake_latency_s`` later. Cards that
        are awake (or waking) are left as they are."""
        idx = self._cards(cards, "wake")
        if idx.size == 0:
            return
        self._refuse_failed(idx, "wake")
        self._wake(idx[self._low[idx]])

    def _wake(self, idx: IntArray) -> float:
        """Start waking ``idx`` (sleeping cards; the hosts of those on off hosts are powered on
        first); returns when the last of them is ready."""
        if idx.size == 0:
            return self._t
        if self._n_hosts_off:
            self._boot_hosts(np.unique(self._card_host[idx[self._card_off[idx]]]))
        self._low[idx] = False
        self._waking[idx] = True
        self._n_low = int(self._low.sum())
        ready = np.maximum(self._host_ready_at[self._card_host[idx]], self._t) + self.site.card.wake_latency_s
        self._wake_at[idx] = ready
        for at in np.unique(ready).tolist():
            self._push(at, "woken", idx[ready == at].copy())
        return float(ready.max())

    # ---- hosts ---------------------------------------------------------------------------------------
    def _hosts(self, hosts: Any, what: str) -> IntArray:
        if not self.site.hosts_managed:
            raise CommandError(f"{what}: the site's hosts cannot be powered off (rack.hosts_per_rack = 0)")
        idx = np.atleast_1d(np.asarray(hosts))
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise CommandError(f"{what}: host indices must be integers")
        idx = idx.astype(np.int64)
        n_h = self.site.n_hosts
        bad = (idx < 0) | (idx >= n_h)
        if bad.any():
            raise CommandError(f"{what}: host {int(idx[bad][0])} is not in 0..{n_h - 1}")
        return np.unique(idx)

    def power_off_hosts(self, hosts: Any) -> None:
        """Power hosts off (at once): their cards go to the low-power state and draw nothing, the
        host draws ``rack.host_off_power_w``. A host with a card running (or given) a job is refused;
        so is a site without host power management. Off hosts stay off."""
        idx = self._hosts(hosts, "power_off_hosts")
        if idx.size == 0:
            return
        cph = self.site.cards_per_host
        cards = (idx[:, None] * cph + np.arange(cph)[None, :]).ravel()
        busy = self._jobs.busy_card(cards)
        if busy is not None:
            c, name = busy
            raise CommandError(f"power_off_hosts: host {c // cph} has card {c} busy with job {name}")
        self._host_off[idx] = True
        self._card_off[cards] = True
        self._low[cards] = ~self._failed[cards]  # a failed card is never asleep: it reads failed once on again
        self._waking[cards] = False
        self._n_low = int(self._low.sum())
        self._n_hosts_off = int(self._host_off.sum())

    def power_on_hosts(self, hosts: Any) -> None:
        """Power hosts on: they boot for ``rack.host_boot_s`` (drawing their on power); their cards stay
        in the low-power state (wake them to use them; a wake waits for the boot). Hosts that are on
        are left as they are."""
        idx = self._hosts(hosts, "power_on_hosts")
        self._boot_hosts(idx[self._host_off[idx]])

    def _boot_hosts(self, idx: IntArray) -> None:
        if idx.size == 0:
            return
        cph = self.site.cards_per_host
        self._host_off[idx] = False
        self._host_ready_at[idx] = self._t + self.site.rack.host_boot_s
        self._card_off[(idx[:, None] * cph + np.arange(cph)[None, :]).ravel()] = False
        self._n_hosts_off = int(self._host_off.sum())

    def host_off(self) -> BoolArray:
        """Per host: powered off (a copy; cheaper than :meth:`truth`)."""
        return self._host_off.copy()

    def low_power(self) -> BoolArray:
        """Per card: in the low-power state (a copy; cheaper than :meth:`truth`). A command changes it
        (``enter_low_power``, ``wake``, ``power_off_hosts``), and so does the plant itself: a job placed
        on sleeping cards wakes them (``place_job`` and the plant's own placement), a card that fails
        asleep leaves it, a card repaired on an off host enters it."""
        return self._low.copy()

    def host_booting(self) -> BoolArray:
        """Per host: on but still booting."""
        return ~self._host_off & (self._host_ready_at > self._t + _EPS_S)

    def _rack_host_w(self) -> FloatArray:
        """Per rack: hosts and switches (``host_overhead_w`` less what each off host saves)."""
        base = np.full(self._n_racks, self.site.rack.host_overhead_w)
        if not self._n_hosts_off:
            return base
        off_per_rack = self._host_off.reshape(self._n_racks, -1).sum(axis=1)
        return np.asarray(base - off_per_rack * self.site.host_saving_w(), dtype=np.float64)

    def set_supply_temp(self, supply_temp_c: float) -> None:
        """Change the rack loop supply set-point; the supply follows with a first-order lag."""
        opts = self.site.facility.supply_temp_options_c
        if not (math.isfinite(supply_temp_c) and min(opts) <= supply_temp_c <= max(opts)):
            raise CommandError(
                f"set_supply_temp: {supply_temp_c:g} deg C is not within {min(opts):g}..{max(opts):g} deg C"
            )
        self._setpoint_c = float(supply_temp_c)

    def set_pump_speed(self, racks: Any, speed_frac: Any) -> None:
        """Set rack-loop pump speeds (fraction of nominal; the loop's flow follows the speed, its
        pump power the cube of it), effective at once. Allowed: ``site.min_pump_speed_frac()`` .. 1.
        A speed below 1 holds for ``config.pump_hold_s`` after the last command for the rack, then
        the pump returns to full speed (renew it to keep it)."""
        idx = np.atleast_1d(np.asarray(racks))
        if idx.size == 0:
            return
        if not np.issubdtype(idx.dtype, np.integer):
            raise CommandError("set_pump_speed: rack indices must be integers")
        idx = idx.astype(np.int64)
        bad = (idx < 0) | (idx >= self._n_racks)
        if bad.any():
            raise CommandError(f"set_pump_speed: rack {int(idx[bad][0])} is not in 0..{self._n_racks - 1}")
        speed = _per_target(speed_frac, idx.size, "set_pump_speed", "speeds")
        lo = self.site.min_pump_speed_frac()
        out = ~np.isfinite(speed) | (speed < lo - 1e-9) | (speed > 1.0 + 1e-9)
        if out.any():
            raise CommandError(f"set_pump_speed: {float(speed[out][0]):g} is not within {lo:.3f}..1 of nominal speed")
        for r, v in zip(idx.tolist(), np.clip(speed, lo, 1.0).tolist(), strict=True):
            self._pump_speed[r] = v
            self._pump_cmd[r] += 1
            if v < 1.0:
                self._push(self._t + self.config.pump_hold_s, "pump_hold", (r, int(self._pump_cmd[r])))
        self._update_flow(self._t)

    def place_job(self, job_id: str, cards: Any, *, already_running: bool = False) -> None:
        """Place a queued job on ``cards`` (external scheduler). Sleeping cards are woken; the job
        waits for them and for its start-up (``PhaseModel.startup_s``), unless ``already_running``:
        a warm start's job that was running before the run began computes as soon as its cards are
        ready (``twin.scenario.place_compact``)."""
        job = self._jobs.get(job_id)
        if job is None:
            raise CommandError(f"place_job: unknown job {job_id!r}")
        if job.state != "queued":
            raise CommandError(f"place_job: job {job_id!r} is {job.state}, not queued")
        idx = self._cards(cards, "place_job")
        if idx.size != job.spec.n_cards:
            raise CommandError(f"place_job: job {job_id!r} needs {job.spec.n_cards} cards, got {idx.size}")
        if np.unique(idx).size != idx.size:
            raise CommandError(f"place_job: card list for job {job_id!r} has duplicates")
        self._refuse_failed(idx, "place_job")
        busy = self._jobs.card_slot[idx] > 0
        if busy.any():
            raise CommandError(f"place_job: card {int(idx[busy][0])} is busy")
        self._jobs.place(job, np.sort(idx), self._t, startup_s=0.0 if already_running else None)

    # ================================================================================================
    # public: outputs
    # ================================================================================================
    def drain_events(self) -> list[JobEvent]:
        """Job events since the last call, oldest first."""
        return self._jobs.drain_events()

    def queued_jobs(self) -> tuple[JobSpec, ...]:
        return self._jobs.queued()

    def running_jobs(self) -> tuple[JobSpec, ...]:
        return self._jobs.running()

    def job_cards(self, job_id: str) -> IntArray:
        job = self._jobs.get(job_id)
        return np.zeros(0, dtype=np.int64) if job is None else job.cards.copy()

    def free_cards(self) -> IntArray:
        """Cards with no job that have not failed (asleep or awake)."""
        return np.flatnonzero((self._jobs.card_slot == 0) & ~self._failed).astype(np.int64)

    def ambient_c(self, t_s: float | None = None) -> float:
        t = self._t if t_s is None else t_s
        return self._ambient.temp_at_c(t) + self._faults.heat_wave_delta_k(t)

    def job_records(self) -> list[JobRecord]:
        return self._jobs.records()

    def accounting(self) -> Accounting:
        a = self._acc
        jobs = self._jobs
        return Accounting(
            time_s=self._t,
            it_energy_j=a["it_j"],
            cooling_energy_j=a["cool_j"],
            facility_energy_j=a["fac_j"],
            work_card_s=jobs.work_card_s,
            lost_work_card_s=jobs.lost_work_card_s,
            jobs_submitted=jobs.n_submitted,
            jobs_finished=jobs.n_finished,
            jobs_failed=jobs.n_failed,
            jobs_running=jobs.n_running(),
            jobs_queued=jobs.n_queued(),
            jobs_placed_by_plant=jobs.n_placed_by_plant,
            slo_violation_s=jobs.slo_violation_s,
            rack_over_limit_s=a["over_s"],
            rack_over_limit_j=a["over_j"],
            throttled_card_s=a["throttled"],
            max_die_temp_c=self._max_die,
        )

    def truth(self) -> Truth:
        n_r = self._n_racks
        return Truth(
            time_s=self._t,
            card_power_w=self._power.copy(),
            die_temp_c=self._die.copy(),
            plate_temp_c=self._plate.copy(),
            level=self._set_level.copy(),
            effective_level=self._eff_level.copy(),
            utilization=self._util.copy(),
            low_power=self._low.copy(),
            failed=self._failed.copy(),
            r_total_k_per_w=self._thermal.params.r_total_k_per_w.copy(),
            rack_power_w=self._rack_power.copy(),
            rack_heat_w=self._rack_heat.copy(),
            rack_max_die_temp_c=self._die.reshape(n_r, self._cpr).max(axis=1),
            rack_supply_temp_c=np.full(n_r, self._supply_c),
            rack_return_temp_c=self._rack_return.copy(),
            rack_flow_lpm=self.site.loop_flow_per_rack_lpm() * self._flow_frac,
            rack_pump_speed_frac=self._pump_speed.copy(),
            supply_setpoint_c=self._setpoint_c,
            ambient_temp_c=self._ambient_now,
            cooling=self._cooling,
            host_off=self._host_off.copy(),
            rack_host_power_w=self._rack_host_w(),
            card_busy_in_step=self._busy_in_step.copy(),
        )

    # ================================================================================================
    # stepping
    # ================================================================================================
    def run(self, duration_s: float, dt_s: float = 1.0) -> None:
        """Step for ``duration_s`` (a whole number of steps of ``dt_s``, the last one shortened)."""
        end = self._t + duration_s
        while self._t < end - _EPS_S:
            self.step(min(dt_s, end - self._t))

    def step(self, dt_s: float) -> None:
        """Advance the site by ``dt_s`` seconds."""
        if not dt_s > 0.0:
            raise ValueError(f"dt_s must be positive, got {dt_s}")
        t = self._t
        self._process_due(t)
        self._compute_power()
        # ---- jobs make progress at their slowest card's pace ---------------------------------------
        self._jobs.advance(dt_s)

        # ---- thermal --------------------------------------------------------------------------------
        supply = self._supply_c
        die0, plate0 = self._die, self._plate
        self._die, self._plate = self._thermal.step(die0, plate0, self._power, supply, dt_s)
        # heat to the coolant over the step: the power less what the die and plate stored (exact for
        # power and inlet held over the step; the end-of-step plate temperature would not be)
        th = self._thermal.params
        stored_w = (th.c_die_j_per_k * (self._die - die0) + th.c_plate_j_per_k * (self._plate - plate0)) / dt_s
        card_heat_w = self._power - stored_w
        # ---- supply follows set-point ---------------------------------------------------------------
        if self._supply_c != self._setpoint_c:
            tau = self.config.supply_time_constant_s
            if tau <= 0:
                self._supply_c = self._setpoint_c
            else:
                decay = self._supply_decay.get(dt_s)
                if decay is None:
                    decay = math.exp(-dt_s / tau)
                    self._supply_decay[dt_s] = decay
                self._supply_c = self._setpoint_c + (self._supply_c - self._setpoint_c) * decay
                if abs(self._supply_c - self._setpoint_c) < 1e-6:
                    self._supply_c = self._setpoint_c
        self._t = t + dt_s
        self._finish_step_outputs(dt_s, supply, card_heat_w)

        # ---- checkpoints and completions reached during the step -------------------------------------
        self._jobs.reach_thresholds(self._t)
        # what falls due at the end of the step shows in readings taken now
        self._process_due(self._t)

    def _process_due(self, t: float) -> None:
        """Apply everything due at ``t``: timeline, job timers, the scheduler."""
        if self._heap and self._heap[0][0] <= t + _EPS_S:
            self._process_timeline(t)
        self._jobs.process_timers(t)
        if self._jobs.needs_scheduling:
            fallback_s = self._jobs.schedule(t, self._failed)
            if fallback_s is not None:
                self._push(fallback_s, "sched", None)
        self._jobs.refresh_order()

    def _finish_step_outputs(self, dt_s: float, supply: float, card_heat_w: FloatArray | None = None) -> None:
        """Racks, loops, facility and energy integrals from the powers of the step (``supply``:
        the coolant inlet temperature during the step; ``card_heat_w``: each card's heat to the
        coolant over the step, else what its plate passes now)."""
        n_r, cpr = self._n_racks, self._cpr
        host = self._rack_host_w()
        self._rack_power = self._power.reshape(n_r, cpr).sum(axis=1) + host
        if card_heat_w is not None:
            heat = card_heat_w
        else:
            heat = (self._plate - supply) / self._thermal.params.r_case_coolant_k_per_w
        self._rack_heat = heat.reshape(n_r, cpr).sum(axis=1) + host
        self._rack_return = supply + self._rack_heat / (self._mcp_nominal * self._flow_frac)
        it = float(self._rack_power.sum())
        self._ambient_now = self.ambient_c(self._t)
        flow = self._flow_frac if self._flow_varies else 1.0
        self._cooling = facility_cooling(
            self.site, it, supply, self._ambient_now, heat_w=float(self._rack_heat.sum()), flow_fraction=flow
        )
        if dt_s <= 0:
            return
        a = self._acc
        a["it_j"] += it * dt_s
        a["cool_j"] += self._cooling.cooling_power_w * dt_s
        a["fac_j"] += self._cooling.facility_power_w * dt_s
        if self._n_throttled:
            a["throttled"] += self._n_throttled * dt_s
        over = self._rack_power - self.site.rack.power_limit_w
        if over.max() > 0.0:
            pos = over > 0.0
            a["over_s"] += float(pos.sum()) * dt_s
            a["over_j"] += float(over[pos].sum()) * dt_s
        dmax = float(self._die.max())
        if dmax > self._max_die:
            self._max_die = dmax

    def _compute_power(self) -> None:
        """Effective levels (own protection), utilization and power of every card for this step."""
        m = self._model
        n_levels = self._n_levels
        die = self._die
        d_t = die - self._t_ref
        jobs = self._jobs
        cs, omc, a_, ncu = jobs.card_cs, jobs.card_omc, jobs.card_a, jobs.card_ncu
        lvl = self._set_level
        # power brake at the commanded level, with the utilization the card has if it is its job's
        # slowest card (an upper bound on its actual utilization)
        r = self._r_clock[lvl]
        csr = cs * r
        idle_t = m.idle_w[lvl] * self._s_idle
        leak_t = m.leak_w_per_k[lvl] * self._s_leak * d_t
        dyn_t = m.dyn_w[lvl] * self._s_dyn
        p_own = idle_t + leak_t + (csr + a_) / (csr + omc) * dyn_t
        over = p_own > self._limit
        changed = False
        if over.any():
            idx = np.flatnonzero(over & ~self._low)
            if idx.size:
                lvl = lvl.copy()
                lvl[idx] = self._braked_levels(idx, lvl[idx], d_t[idx])
                changed = True
        # thermal slowdown
        if float(die.max()) > self._slowdown_c:
            extra = np.ceil(np.maximum(die - self._slowdown_c, 0.0) / SLOWDOWN_K_PER_LEVEL).astype(np.int64)
            lvl = np.minimum(lvl + extra, n_levels - 1)
            changed = True
        if changed:
            r = self._r_clock[lvl]
            csr = cs * r
            idle_t = m.idle_w[lvl] * self._s_idle
            leak_t = m.leak_w_per_k[lvl] * self._s_leak * d_t
            dyn_t = m.dyn_w[lvl] * self._s_dyn
        self._eff_level = lvl
        self._n_throttled = 0
        if changed:
            self._n_throttled = int(np.count_nonzero((lvl > self._set_level) & ~self._low & ~self._failed))
        # pace of each job: its slowest card
        r_slow = self._jobs.slowest_stretch(r)
        if r_slow is not None:
            step_rel = cs * r_slow + omc
            util = (csr + (step_rel - csr) * ncu) / step_rel
        else:
            util = ncu.copy()
        power = idle_t + leak_t + util * dyn_t
        if self._n_low:
            low = self._low
            power = np.where(low, self._lp_idle_w + self._lp_leak * d_t, power)
            util = np.where(low, 0.0, util)
        if self._n_failed:
            power = np.where(self._failed, 0.0, power)
            util = np.where(self._failed, 0.0, util)
        if self._n_hosts_off:
            power = np.where(self._card_off, 0.0, power)
        self._power = power
        self._util = util
        self._busy_in_step = jobs.card_slot > 0

    def _braked_levels(self, idx: IntArray, lvl: IntArray, d_t: FloatArray) -> IntArray:
        """Fastest level at or below ``lvl`` within the power limit for cards ``idx``."""
        m = self._model
        jobs = self._jobs
        cs = jobs.card_cs[idx][:, None]
        csr = cs * self._r_clock[None, :]
        u = (csr + jobs.card_a[idx][:, None]) / (csr + jobs.card_omc[idx][:, None])
        p = (
            m.idle_w[None, :] * self._s_idle[idx][:, None]
            + m.leak_w_per_k[None, :] * (self._s_leak[idx] * d_t)[:, None]
            + u * m.dyn_w[None, :] * self._s_dyn[idx][:, None]
        )
        n_levels = self._n_levels
        ok = (p <= self._limit[idx][:, None]) & (np.arange(n_levels)[None, :] >= lvl[:, None])
        return np.where(ok.any(axis=1), ok.argmax(axis=1), n_levels - 1).astype(np.int64)

    # ================================================================================================
    # timeline: submissions, commands, wakes, faults
    # ================================================================================================
    def _process_timeline(self, t: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= t + _EPS_S:
            _time, _seq, kind, payload = heapq.heappop(heap)
            if kind == "submit":
                self._jobs.enqueue(payload, t, front=False)
            elif kind == "dvfs":
                idx, lv = payload
                ok = ~self._failed[idx]
                self._set_level[idx[ok]] = lv[ok]
            elif kind == "woken":
                # only cards still in this wake: one cut short (put back to sleep) and woken again has
                # a later end, whose own action ends it
                idx = payload
                still = idx[self._waking[idx] & (self._wake_at[idx] <= t + _EPS_S)]
                self._waking[still] = False
            elif kind == "fail":
                c = int(payload)
                self._fail_count[c] += 1
                self._fail_card(c, t)
            elif kind == "repair":
                # the card works again when the last failure in force on it is repaired
                c = int(payload)
                self._fail_count[c] -= 1
                if self._fail_count[c] == 0 and self._failed[c]:
                    self._failed[c] = False
                    self._n_failed -= 1
                    self._jobs.cards_freed()
                    if self._card_off[c]:  # repaired on an off host: asleep like its neighbours
                        self._low[c] = True
                        self._n_low = int(self._low.sum())
            elif kind == "flow":
                self._update_flow(t)
            elif kind == "pump_hold":
                r, token = payload
                if self._pump_cmd[r] == token and self._pump_speed[r] < 1.0:
                    self._pump_speed[r] = 1.0
                    self._update_flow(t)
            elif kind == "sensor_on":
                self._sensors.faults.switch(payload, on=True)
            elif kind == "sensor_off":
                self._sensors.faults.switch(payload, on=False)
            elif kind == "sched":
                self._jobs.fallback_due()

    def _update_flow(self, t: float) -> None:
        frac = self._faults.pump_flow_frac(t) * self._pump_speed
        self._flow_varies = bool(np.any(frac != 1.0))
        foul = self._faults.fouling_factor(t)
        self._flow_frac = frac
        self._r_foul = foul
        self._thermal.set_params(self._thermal_params())
        self._rack_pump_w = rack_pump_power_w(self.site, frac)

    # ================================================================================================
    # cards for jobs (the jobs themselves: twin.plant_jobs)
    # ================================================================================================
    def _ready_for_job(self, cards: IntArray, t: float) -> float:
        """Wake the sleeping ones of a placed job's ``cards`` (booting their hosts); when the last of
        them is ready (``t`` if all are awake)."""
        sleeping = cards[self._low[cards]]
        if sleeping.size:
            self._wake(sleeping)
        waking = self._waking[cards]
        return max(float(self._wake_at[cards][waking].max()), t) if waking.any() else t

    def _fail_card(self, c: int, t: float) -> None:
        if self._failed[c]:
            return
        self._failed[c] = True
        self._n_failed += 1
        if self._low[c]:
            self._low[c] = False
            self._n_low = int(self._low.sum())
        self._waking[c] = False
        self._jobs.card_failed(c, t)

    # ================================================================================================
    # sensors
    # ================================================================================================
    def readings(self) -> Readings:
        """Noisy telemetry of the current state, with sensor faults applied (``twin.plant_readings``)."""
        return self._sensors.read(
            time_s=self._t,
            power_w=self._power,
            die_temp_c=self._die,
            utilization=self._util,
            effective_level=self._eff_level,
            level=self._set_level,
            low_power=self._low,
            waking=self._waking,
            power_limit_w=self._limit,
            failed=self._failed,
            card_host_off=self._card_off,
            n_low=self._n_low,
            n_failed=self._n_failed,
            n_hosts_off=self._n_hosts_off,
            supply_c=self._supply_c,
            rack_return_c=self._rack_return,
            flow_frac=self._flow_frac,
            rack_power_w=self._rack_power,
            rack_pump_w=self._rack_pump_w,
            pump_speed_frac=self._pump_speed,
            cooling=self._cooling,
            ambient_c=self._ambient_now,
            setpoint_c=self._setpoint_c,
            jobs=self._jobs.readings(),
        )
