"""Measured die-temperature offsets: the persistent error of the twin's die prediction, never a transient.

The twin predicts a card's *steady* die temperature from its level, its job's phase, its power limit,
the rack's supply and its die-to-inlet resistance. A card whose die runs hotter than that in steady
state (a card drawing more than the power model says, a bad thermal interface, a fouled plate the
estimator has not calibrated yet) gets the excess as an offset added to every prediction the planner
(``models.problem.make_problem(die_offset_k=...)``) and the guard (``StepContext.die_offset_k``) make,
so that its die is kept under the limit.

The instantaneous excess (``agent.load.die_offsets_k``) is only an error measurement when the card
is thermally settled. Right after its job leaves COMPUTE (a checkpoint, a stall), its level or power
limit drops, or its supply cools, the die is still hot for tens of seconds (the plate's slow time
constant is ~10 s at nominal flow; the rack supply follows its set-point with a ~120 s lag) while the
steady prediction for the new state is cool: the raw excess is then a transient artifact of up to
~30 K, and a guard adding it to a computing prediction throttles healthy jobs (the demo run of
2026-11-29: a job's checkpoint at a 45 deg C supply took it to the slowest level with 200-285 W limits
on 64 cards). The opposite transient (a job that resumes computing: the die still cool) would hide a
real offset.

The controller keeps one :class:`DieOffsetFilter` and updates it ONCE per step
(``Controller.context``); the planner and the guard get the same array. A card's offset is the larger
of two transient-free measurements:

1. **its last settled observation**: the card's operating point has been unchanged for
   ``settle_time_constants`` (5) of its slow thermal time constant
   (``twin.thermal.ThermalNetwork.time_constants_s`` at its die-to-inlet resistance: ~53 s at nominal
   flow, longer for a fouled plate or a slowed pump): the same job, phase, reported level, low-power
   state and power limit at every step, its rack's measured supply within ``inlet_tolerance_k`` of
   the value it had when that operating point began, its plate's flow (``r_scale``: the resistance at
   the flow now over the one at nominal flow) within 1%; a die that still moves more than ``die_step_tolerance_k``
   between two steps once it should have settled (a change the snapshots did not show, e.g. a short
   stall between two steps) restarts the wait. Such an observation (die, supply, level, utilization, power limit)
   replaces the card's previous one; while the card is not settled its last one stands, so a card
   with a real offset stays protected through checkpoints and resumes (when its die is still cool);
2. **the smallest raw excess over the last settle window** (the same ~53 s): a transient decays
   within the window, and the samples before the change it follows hold the steady value, so the
   minimum never carries it; a card that runs hot at every sample for the whole window (one that
   never settles, e.g. under its own thermal slowdown, whose clock jitters) is covered by it.

The offset of the settled observation is recomputed every step with the CURRENT calibrated
resistance at the observation's flow (``max(die_obs - steady_die(obs point, R_nominal x
r_scale_obs), 0)``), so offsets and the estimator's calibrated
resistance (``twin.estimate``: R_true / R_spec from the dynamic response to the measured power) never
double count: once the calibration explains a fouled plate, the same observation predicted with the
calibrated R leaves no excess, and the offset keeps only what the calibration does not explain (a
card drawing more power than the power model says, a sensor bias). Offsets are clipped to 0..40 K.

Safety: a card is protected from its first settled observation or its first full window of hot
readings, about a minute after it starts running hot; before that (and for a fresh agent with no
journal of its calibration) its own thermal slowdown at ``slowdown_temp_c`` holds and the guard's
die margin stays in force.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import numpy.typing as npt

from agent.load import MAX_DIE_OFFSET_K, SiteLoad, card_utilization, steady_die_c
from twin.spec import SiteSpec
from twin.state import StateSnapshot
from twin.thermal import ThermalNetwork, ThermalParams

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["DieOffsetFilter", "slow_time_constants_s"]

#: A card's plate flow changed (its resistance ratio moved more than this): its operating point changed.
_SCALE_TOLERANCE = 0.01
_PHASE_IDLE = -1
_PHASE_FAILED = -2


def slow_time_constants_s(site: SiteSpec, r_total_k_per_w: FloatArray) -> FloatArray:
    """Every card's slow thermal time constant (s) at its die-to-inlet resistance."""
    n = site.n_cards
    r_dc = np.full(n, site.card.r_die_to_case_k_per_w)
    params = ThermalParams(
        r_die_case_k_per_w=r_dc,
        r_case_coolant_k_per_w=np.maximum(np.asarray(r_total_k_per_w, dtype=np.float64) - r_dc, 1e-5),
        c_die_j_per_k=np.full(n, site.card.die_heat_capacity_j_per_k),
        c_plate_j_per_k=np.full(n, site.cold_plate.heat_capacity_j_per_k),
    )
    _fast, slow = ThermalNetwork(params).time_constants_s()
    return np.asarray(slow, dtype=np.float64)


class DieOffsetFilter:
    """Per-card die offsets without transients (see the module docstring)."""

    def __init__(
        self,
        site: SiteSpec,
        *,
        settle_time_constants: float = 5.0,
        inlet_tolerance_k: float = 1.0,
        die_step_tolerance_k: float = 2.0,
    ) -> None:
        if not settle_time_constants > 0:
            raise ValueError("settle_time_constants must be > 0")
        self.site = site
        self.settle_time_constants = settle_time_constants
        self.inlet_tolerance_k = inlet_tolerance_k
        self.die_step_tolerance_k = die_step_tolerance_k
        n = site.n_cards
        self._job_ids: dict[str, int] = {}
        # the operating point each card has held since ``_since_s``
        self._job = np.full(n, -1, dtype=np.int64)
        self._phase = np.full(n, _PHASE_IDLE, dtype=np.int64)
        self._level = np.full(n, -1, dtype=np.int64)
        self._low = np.zeros(n, dtype=bool)
        self._limit = np.full(n, np.nan)
        self._inlet_ref = np.full(n, np.nan)
        self._scale = np.full(n, np.nan)
        self._since_s = np.full(n, math.inf)
        self._prev_die = np.full(n, np.nan)
        # the last settled observation of each card
        self._has_obs = np.zeros(n, dtype=bool)
        self._obs_die = np.zeros(n)
        self._obs_inlet = np.zeros(n)
        self._obs_level = np.zeros(n, dtype=np.int64)
        self._obs_util = np.zeros(n)
        self._obs_low = np.zeros(n, dtype=bool)
        self._obs_limit = np.full(n, site.card.power_limit_w)
        self._obs_scale = np.ones(n)
        # raw excesses of the recent steps (time, per card), for the windowed minimum
        self._raw: collections.deque[tuple[float, FloatArray]] = collections.deque()
        self.last_raw_k = np.zeros(n)

    # ---- public -------------------------------------------------------------------------------
    def update(
        self,
        snap: StateSnapshot,
        load: SiteLoad,
        inlet_c: FloatArray,
        r_total_k_per_w: FloatArray,
        now_s: float,
        *,
        r_scale: FloatArray | None = None,
    ) -> FloatArray:
        """Fold this step's snapshot in and return every card's offset (K, 0..40). ``load`` is the
        snapshot's running jobs (``agent.load.site_load``), ``inlet_c`` each card's rack supply,
        ``r_total_k_per_w`` the calibrated resistance at nominal flow and ``r_scale`` (default 1)
        the ratio of each card's resistance at its flow now to the one at nominal flow."""
        site = self.site
        n = site.n_cards
        scale = np.ones(n) if r_scale is None else np.asarray(r_scale, dtype=np.float64)
        r_nominal = np.asarray(r_total_k_per_w, dtype=np.float64)
        r_total = r_nominal * scale
        slowest = site.card.n_levels - 1
        level = np.clip(np.asarray(snap.card_level, dtype=np.int64), 0, slowest)
        failed = np.asarray(load.failed, dtype=bool)
        low = np.asarray(snap.card_low_power, dtype=bool) & ~load.busy
        lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
        lim = np.asarray(np.round(np.where(np.isfinite(lim), lim, site.card.power_limit_w)), dtype=np.float64)
        inlet = np.asarray(inlet_c, dtype=np.float64)
        die = np.asarray(snap.card_die_temp_c, dtype=np.float64)
        job = np.full(n, -1, dtype=np.int64)
        phase = np.full(n, _PHASE_IDLE, dtype=np.int64)
        for j in load.jobs:
            token = self._job_ids.setdefault(j.job_id, len(self._job_ids))
            job[j.cards] = token
            phase[j.cards] = int(j.phase)
        phase[failed] = _PHASE_FAILED
        valid = np.isfinite(die) & np.isfinite(inlet) & ~failed
        util = card_utilization(site, load, level, worst_case=False)

        # 1. settled observations
        settle_s = self.settle_time_constants * slow_time_constants_s(site, r_total)
        with np.errstate(invalid="ignore"):
            moved = (
                (job != self._job)
                | (phase != self._phase)
                | (level != self._level)
                | (low != self._low)
                | ~(lim == self._limit)
                | ~(np.abs(inlet - self._inlet_ref) <= self.inlet_tolerance_k)
                | ~(np.abs(scale / self._scale - 1.0) <= _SCALE_TOLERANCE)
            )
            # a die still moving when it should have settled: something changed between two steps
            jumped = ~(np.abs(die - self._prev_die) <= self.die_step_tolerance_k)
        moved |= ~valid | (jumped & (now_s - self._since_s >= settle_s))
        self._job, self._phase, self._level, self._low, self._limit = job, phase, level, low, lim
        self._scale = scale
        self._inlet_ref = np.where(moved, inlet, self._inlet_ref)
        self._since_s = np.where(moved, now_s, self._since_s)
        self._prev_die = np.where(valid, die, np.nan)
        settled = valid & (now_s - self._since_s >= settle_s)
        if settled.any():
            self._has_obs |= settled
            self._obs_die = np.where(settled, die, self._obs_die)
            self._obs_inlet = np.where(settled, inlet, self._obs_inlet)
            self._obs_level = np.where(settled, level, self._obs_level)
            self._obs_util = np.where(settled, util, self._obs_util)
            self._obs_low = np.where(settled, low, self._obs_low)
            self._obs_limit = np.where(settled, lim, self._obs_limit)
            self._obs_scale = np.where(settled, scale, self._obs_scale)
        held = self.offsets_k(r_nominal)

        # 2. the smallest raw excess over the last settle window (known once the history spans it)
        pred = steady_die_c(site, level, util, low, lim, np.where(np.isfinite(inlet), inlet, 0.0), r_total)
        with np.errstate(invalid="ignore"):
            raw = np.where(valid, die - pred, 0.0)
        raw = np.asarray(np.clip(raw, 0.0, MAX_DIE_OFFSET_K), dtype=np.float64)
        self.last_raw_k = raw
        while self._raw and self._raw[-1][0] > now_s:  # the site clock stepped back
            self._raw.pop()
        self._raw.append((now_s, raw))
        horizon = float(settle_s.max())
        while len(self._raw) > 1 and self._raw[1][0] <= now_s - horizon:
            self._raw.popleft()
        # per card: every sample inside its window and the last one at or before the window's start
        window_min = raw.copy()
        anchor = np.full(n, np.nan)
        for t_k, raw_k in self._raw:
            age = now_s - t_k
            window_min = np.where(age < settle_s, np.minimum(window_min, raw_k), window_min)
            anchor = np.where(age >= settle_s, raw_k, anchor)
        window_min = np.where(np.isfinite(anchor), np.minimum(window_min, anchor), 0.0)
        return np.asarray(np.maximum(held, window_min), dtype=np.float64)

    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s`` (``Controller.clock_went_back``): an operating
        point that began on the old timeline after ``now_s`` begins now, so that its settle wait
        runs on the new clock instead of pausing until the new clock passes the old start (the
        wait would otherwise last as long as the step back: ~760 s after a restarted simulator);
        settled observations stand (what a card's die read is still true of the card), and the raw
        samples newer than ``now_s`` are dropped at the next :meth:`update`."""
        np.minimum(self._since_s, now_s, out=self._since_s)

    def offsets_k(self, r_total_k_per_w: FloatArray) -> FloatArray:
        """Every card's offset from its last settled observation, predicted with ``r_total_k_per_w``
        (at nominal flow) at the observation's flow."""
        pred = steady_die_c(
            self.site,
            self._obs_level,
            self._obs_util,
            self._obs_low,
            self._obs_limit,
            self._obs_inlet,
            np.asarray(r_total_k_per_w, dtype=np.float64) * self._obs_scale,
        )
        off = np.where(self._has_obs, self._obs_die - pred, 0.0)
        return np.asarray(np.clip(off, 0.0, MAX_DIE_OFFSET_K), dtype=np.float64)

    def settled(self, now_s: float, r_total_k_per_w: FloatArray) -> BoolArray:
        """Cards whose operating point has been steady long enough at ``now_s`` (for tests and logs)."""
        settle_s = self.settle_time_constants * slow_time_constants_s(self.site, r_total_k_per_w)
        return np.asarray(now_s - self._since_s >= settle_s, dtype=np.bool_)
