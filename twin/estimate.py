"""Online calibration of every card and residual-based anomaly flags. Pure numpy, no I/O.

``Estimator(site).update(readings)`` after each :class:`twin.readings.Readings`; ``estimates()``
and ``anomalies()`` at any time. A copy of a card or loop reading (stamped at the time of the one the
estimator has: at-least-once delivery) is no new observation and changes nothing; nor does one
stamped before it (late, reordered, a backlog replayed), however late, which the belief
(``twin.state``) does not take either. The estimator's time (``Estimates.time_s``, the newest stamp
it took) never goes back with a reading, and no stamp is taken for the site's clock gone back:
:meth:`Estimator.clock_went_back` (``agent.estimation_loop``, when the site clock goes back to a new
timeline: the belief is told by ``agent.ingest``) brings the time, and the last readings of the sources read after
the new time, back to the new timeline, keeping what was learnt; the next readings of those sources
then (re)start their models.

Thermal resistance (per card). The die temperature rise over the coolant inlet is the response of
the card's RC network to its power (``twin.thermal``, as ``fit_thermal`` fits it offline). The
estimator runs the *spec* network (cold-plate resistance at the rack's measured flow, from the OCP
R-vs-flow table) on each card's measured power, zero-order hold between readings, giving the rise
``x`` the spec predicts; the measured rise is ``y = T_die - T_supply``. A scalar Kalman filter with a
random-walk state tracks the ratio ``g`` in ``y = g x + e``: ``g`` = R_true / R_expected, so the
estimated resistance is ``g * R_expected``. Measurement noise ``die_noise_k``; the random walk lets
``g`` drift by about 10% over ``r_time_constant_s``. ``g`` learns only from readings whose predicted
rise is at least ``min_rise_k`` (a card under load); an idle card keeps what it learnt under load.
A card's model (re)starts (its first reading, or the first after ``max_gap_s``) from the measured die
and learns nothing for ``settle_time_constants`` of the network's slow time constants (a start in a
transient is not read as a ratio). A reading whose innovation exceeds ``innovation_gate_sd`` of its
predicted standard deviation is skipped (a glitch), unless such readings persist on one side for
``gate_confirm_s``: then the resistance did change and the filter's variance grows to follow it.

Power coefficients (per card). ``P = s_idle idle_k + s_dyn u dyn_k + s_leak leak_k (T - T_ref)`` at the
card's running level ``k`` (from its clock): a 3-state Kalman filter (random walk, prior 1 +- 0.1,
0.1, 0.3) estimates the three scales; ``s_leak`` is the leakage scale. Leakage is told apart from
switching power by die-temperature changes that do not come from utilization: thermal transients
after a phase change, supply set-point changes, idle periods.

Anomalies:

* ``fouled_cold_plate``: ``g > 1 + r_threshold_frac`` with the estimate's standard deviation below a
  third of the threshold (a fouled or badly mounted plate, dried thermal interface). Flow changes
  are accounted for (R_expected follows the measured flow), so a weak pump does not flag plates.
* ``weak_pump``: the rack loop's return - supply difference, averaged over ``pump_time_constant_s``,
  exceeds ``1 + pump_threshold_frac`` times what the rack's PDU power and the flow its pump should
  give (nominal flow x the pump speed the CDU reports) predict (``Q = m c_p dT``), or the measured
  flow is more than ``pump_threshold_frac`` below that flow. A pump slowed on purpose is not weak;
  a CDU that does not report the speed (NaN) is not judged (its flow's expectation is unknown).
  The loop-dT ratio is judged (``Estimates.rack_dt_ratio`` is finite) once its averages cover one
  ``pump_time_constant_s`` of a loaded rack: averaged over a few seconds it is the transient of the
  dies' and plates' stored heat, which the PDU does not see (the first decision after a warm start
  slows hot cards and flagged weak pumps that cleared by themselves).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from twin.power import PowerModel
from twin.readings import CardBatch, Readings, pump_speed_in_range
from twin.spec import SiteSpec
from twin.thermal import ThermalNetwork, ThermalParams, plate_resistance_k_per_w

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["Anomaly", "AnomalyHistory", "Estimates", "Estimator", "EstimatorConfig"]

#: share of a time constant's weight an exponential average needs before it is judged (1 - 1/e)
_SETTLED_WEIGHT = 1.0 - math.exp(-1.0)


@dataclass(frozen=True)
class EstimatorConfig:
    """The estimator's thresholds and time constants: modelling choices (no public data gives them).
    15% flags a plate or pump: five times the card-to-card spread of the thermal resistance
    (``CardVariation.r_th_sd_frac``, 3%) and far above what sensor noise leaves after averaging, while
    a fouled plate or a failing pump drifts well past it (the fault scenarios use 30-60%). A
    resistance is learnt over an hour (fouling develops over days: an hour follows it without
    chasing a job's transients), the power coefficients over a day (they age more slowly still), the
    loop's heat balance over 10 minutes (a pump fails over minutes to hours)."""

    r_threshold_frac: float = 0.15
    pump_threshold_frac: float = 0.15
    r_time_constant_s: float = 3600.0
    coefficient_time_constant_s: float = 24 * 3600.0
    die_noise_k: float = 0.7  # die sensor noise + model error (sd)
    power_noise_w: float = 5.0  # power sensor noise + model error (sd)
    pump_time_constant_s: float = 600.0
    min_rack_power_w: float = 5000.0  # below this the loop dT is too small to judge
    max_gap_s: float = 30.0  # a longer gap between a card's readings restarts its thermal model
    # the resistance is learnt only while the spec network's die rise is at least this (K): at an idle
    # card's ~3 K rise a few tenths of a kelvin of inlet or sensor bias read as 10% of resistance (a
    # healthy idle card, true ratio 1.065, drifted to 1.154 and was flagged fouled on the card-failure
    # day); a computing card's rise is ~30 K, and a plate matters only under load
    min_rise_k: float = 10.0
    flow_update_frac: float = 0.03  # re-derive expected resistances when a rack's flow moves this much
    # the flow the expected resistances follow: smoothed over this (s), against the flow sensor's noise
    # (1% sd in the plant: 0.5% after 2 s, and ~0.7% between it and the latest reading, against which
    # learning pauses: a quarter of flow_update_frac), and short, because a plate's
    # resistance follows the flow at once (the network carries the die's response): at 10 s the
    # demo's first pump step, 58% -> 33% just as the cards' resistances began to be learnt, read three
    # healthy plates 12-18% above spec, as sure as a calibration, and flagged them fouled (the
    # weak-pump check averages over pump_time_constant_s instead)
    flow_time_constant_s: float = 2.0
    # after a card's thermal model (re)starts (the estimator's start, a gap longer than max_gap_s) the
    # resistance is not learnt for this many of the spec network's slow time constants: the model
    # starts from the measured die in equilibrium with the plate, a guess in a transient (a job that
    # just started or stopped); learning at once read the transient as a ratio 30% off, as sure
    # as a calibrated one (one reading of a 30 K rise takes the prior's 0.2 to 0.02)
    settle_time_constants: float = 4.0
    # a reading whose innovation exceeds this many of its predicted standard deviations is not an
    # observation (a die sensor's glitch within its valid range moved the ratio by 18% and flagged a
    # plate), unless such readings persist, on one side, for gate_confirm_s of site time: then the
    # resistance did change (a plate fouled at once) and the estimate follows them
    innovation_gate_sd: float = 5.0
    gate_confirm_s: float = 60.0


@dataclass(frozen=True)
class Estimates:
    time_s: float
    r_ratio: FloatArray  # estimated / expected die-to-inlet resistance per card
    r_ratio_sd: FloatArray
    r_th_k_per_w: FloatArray  # estimated die-to-inlet resistance
    r_expected_k_per_w: FloatArray  # spec resistance at the measured flow
    idle_scale: FloatArray
    dynamic_scale: FloatArray
    leakage_scale: FloatArray
    leakage_w_per_k: FloatArray  # estimated leakage slope at level 0
    rack_dt_ratio: FloatArray  # measured / predicted (expected flow) loop temperature rise
    rack_flow_deficit: FloatArray  # 1 - measured / expected flow (nominal x reported pump speed)


@dataclass(frozen=True)
class Anomaly:
    kind: str  # "fouled_cold_plate" | "weak_pump"
    rack: int
    card: int | None
    value: float  # the ratio that crossed the threshold
    threshold: float
    detail: str


AnomalyKey = tuple[str, int, int | None]  # kind, rack, card


class AnomalyHistory:
    """Every anomaly flagged during a run: when it was first flagged and whether it still is (a flag
    that came and went, e.g. a plate read as fouled for a few minutes, is kept as cleared).
    ``update(found, now_s)`` with each ``Estimator.anomalies()``; it returns the newly flagged."""

    def __init__(self) -> None:
        self.first_s: dict[AnomalyKey, float] = {}
        self.current: set[AnomalyKey] = set()

    def update(self, found: Sequence[Anomaly], now_s: float) -> list[Anomaly]:
        """Fold in the anomalies flagged now; the ones not flagged at the previous update."""
        keys = {(a.kind, a.rack, a.card) for a in found}
        new = [a for a in found if (a.kind, a.rack, a.card) not in self.current]
        for key in keys:
            self.first_s.setdefault(key, now_s)
        self.current = keys
        return new

    def describe(self, rack_names: Sequence[str], since_s: float = 0.0) -> list[str]:
        """One line each, in the order first flagged: ``kind rack [card N] from t=S s`` (site time
        less ``since_s``) and ``, cleared`` when no longer flagged."""
        out = []
        for key, t in sorted(self.first_s.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2] or -1)):
            kind, rack, card = key
            where = rack_names[rack] + (f" card {card}" if card is not None else "")
            out.append(f"{kind} {where} from t={t - since_s:.0f} s" + ("" if key in self.current else ", cleared"))
        return out


class Estimator:
    def __init__(self, site: SiteSpec, config: EstimatorConfig | None = None) -> None:
        self.site = site
        self.config = cfg = config if config is not None else EstimatorConfig()
        n, n_r, cpr = site.n_cards, site.n_racks, site.cards_per_rack
        self._n, self._n_r, self._cpr = n, n_r, cpr
        self._card_rack = site.card_rack()
        self._site_order = np.arange(n, dtype=np.int64)  # the cards' indices in site order
        self._model = PowerModel.from_card(site.card)
        self._clocks = self._model.clocks_mhz
        self._max_clock_mhz = site.card.max_plausible_clock_mhz
        self.time_s = -math.inf
        # thermal
        self._flow_used = np.full(n_r, site.loop_flow_per_rack_lpm())
        self._net = ThermalNetwork(self._params())
        self._r_exp = self._net.params.r_total_k_per_w.copy()
        self._xd = np.zeros(n)
        self._xp = np.zeros(n)
        self._last_t = np.full(n, -math.inf)
        self._g = np.ones(n)
        self._pg = np.full(n, 0.2**2)
        self._learn_from = np.full(n, -math.inf)  # no learning before (a restarted model settles)
        self._gated_since = np.full(n, np.nan)  # the first of consecutive gated readings (site s)
        self._gated_sign = np.zeros(n)
        self._q_g = 0.1**2 / cfg.r_time_constant_s
        # power coefficients
        self._theta = np.ones((n, 3))
        prior = np.array([0.1**2, 0.1**2, 0.3**2])
        self._p_theta = np.broadcast_to(np.diag(prior), (n, 3, 3)).copy()
        self._q_theta = prior / cfg.coefficient_time_constant_s
        self._last_pt = np.full(n, -math.inf)
        # pump
        self._mcp_nominal = site.loop_flow_per_rack_lpm() / 60_000.0 * site.loop.density_kg_per_m3
        self._mcp_nominal *= site.loop.specific_heat_j_per_kg_k
        self._dt_meas = np.zeros(n_r)
        self._dt_pred = np.zeros(n_r)
        self._dt_weight = np.zeros(n_r)  # how much of a time constant the two averages cover (0..1)
        self._flow_avg = np.full(n_r, site.loop_flow_per_rack_lpm())
        self._flow_fast = np.full(n_r, site.loop_flow_per_rack_lpm())
        self._flow_exp_avg = np.full(n_r, site.loop_flow_per_rack_lpm())
        self._flow_last = np.full(n_r, site.loop_flow_per_rack_lpm())  # the latest valid flow reading
        self._rack_t = np.full(n_r, -math.inf)
        self._rack_pdu_w = np.full(n_r, np.nan)
        self._rack_pdu_t = np.full(n_r, -math.inf)
        self._supply = np.full(n_r, np.nan)

    def _params(self) -> ThermalParams:
        site = self.site
        q = self._flow_used[self._card_rack] / self._cpr
        r_pc = plate_resistance_k_per_w(site.cold_plate.flow_lpm, site.cold_plate.r_case_to_coolant_k_per_w, q)
        n = self._n
        return ThermalParams(
            r_die_case_k_per_w=np.full(n, site.card.r_die_to_case_k_per_w),
            r_case_coolant_k_per_w=np.asarray(r_pc, dtype=np.float64),
            c_die_j_per_k=np.full(n, site.card.die_heat_capacity_j_per_k),
            c_plate_j_per_k=np.full(n, site.cold_plate.heat_capacity_j_per_k),
        )

    # ================================================================================================
    def update(
        self, readings: Readings, *, frozen_cards: Collection[int] = (), frozen_racks: Collection[int] = ()
    ) -> None:
        """Fold one set of readings into the estimates. ``frozen_cards`` and ``frozen_racks``: sensors
        the caller found stuck (``twin.state.TwinState.stuck_cards`` / ``stuck_racks``), whose
        readings are not observations: a die reading frozen while the coolant warms reads as a
        plate that cools better than the spec (or, while it cools, as a fouled one), so those cards
        keep their estimates (a frozen rack also its loop's) until they report again.

        All or nothing: a round that raises (a defect, or readings no source sends, such as a batch
        whose power column is text) leaves the estimator as it was before the round."""
        before = self._state()
        try:
            self._update(readings, frozen_cards, frozen_racks)
        except BaseException:
            self._restore(before)
            raise

    def _state(self) -> tuple[dict[str, Any], ThermalParams]:
        """What a round may change, to put back if it fails: the estimator's attributes, its arrays
        copied (1.5 MB at 8,192 cards: under 0.1 ms, about 2% of the round), and the thermal
        network's parameters (replaced, never changed in place, when the flow moves)."""
        state = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in vars(self).items()}
        return state, self._net.params

    def _restore(self, state: tuple[dict[str, Any], ThermalParams]) -> None:
        attrs, params = state
        vars(self).update(attrs)
        if self._net.params is not params:
            self._net.set_params(params)

    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s`` (a restarted simulator, a publisher's clock stepped:
        ``agent.clock.SiteClock`` tells; the service passes it on in order with the rounds, after the
        old timeline's). The estimator's time, and every card, loop and PDU last read after ``now_s``
        (on the old timeline), come back: the time follows the new timeline at once (learning pauses
        in a pump step on it, the calibration's hold runs on it), and such a source's next reading
        restarts it however little the clock went back (a card's thermal model settles again, a loop's
        flow averages start from its reading; untold, its readings are late, dropped until the new
        timeline passes the old, as the belief drops them). What was learnt stays: a resistance ratio,
        the power coefficients and a loop's heat-balance averages are true of the hardware on either
        timeline. A reading never moves the time back (a late one is not a step back): only this does."""
        if math.isnan(now_s):
            return
        self.time_s = min(self.time_s, now_s)
        for last_s in (self._last_t, self._last_pt, self._rack_t, self._rack_pdu_t):
            last_s[last_s > now_s] = -math.inf  # the old timeline's: the next reading (re)starts

    def _update(self, readings: Readings, frozen_cards: Collection[int], frozen_racks: Collection[int]) -> None:
        self.time_s = max(self.time_s, readings.time_s)  # (a late reading is not a step back: clock_went_back)
        n = self._n
        skip_racks = {int(r) for r in frozen_racks}
        power = np.full(n, np.nan)
        die = np.full(n, np.nan)
        util = np.full(n, np.nan)
        clock = np.full(n, np.nan)
        awake = np.zeros(n, dtype=bool)
        t_card = np.full(n, np.nan)
        supply = np.full(n, np.nan)
        batches: list[tuple[float, float, CardBatch]] = []  # per rack: cards time, its supply, its cards
        for rr in readings.racks:
            r = rr.rack
            if not 0 <= r < self._n_r or r in skip_racks:
                continue
            if rr.loop is not None:
                lp = rr.loop
                self._update_loop(
                    r, rr.part_time_s("loop"), lp.supply_temp_c, lp.return_temp_c, lp.flow_lpm, lp.pump_speed_frac
                )
            if rr.pdu is not None and math.isfinite(rr.pdu.power_w):
                t_pdu = rr.part_time_s("pdu")
                if not self._late(t_pdu, self._rack_pdu_t[r]):
                    self._rack_pdu_w[r], self._rack_pdu_t[r] = rr.pdu.power_w, t_pdu
            b = rr.cards
            if b is None:
                continue
            batches.append((rr.part_time_s("cards"), self._rack_supply(r), b))
        if batches and all(_plain(b) for _, _, b in batches):
            # the racks' batches at once (as the loop below, in one pass of array operations)
            sizes = [b.card_index.size for _, _, b in batches]
            idx = np.concatenate([b.card_index for _, _, b in batches]).astype(np.int64, copy=False)
            if idx.size == n and np.array_equal(idx, self._site_order):
                # every card once, in site order (the plant's readings, all racks reporting): the
                # columns are the per-card arrays themselves, no card left unread to fill
                def cat(name: str, dtype: type) -> Any:
                    return np.concatenate([getattr(b, name) for _, _, b in batches]).astype(dtype, copy=False)

                power, die = cat("power_w", np.float64), cat("die_temp_c", np.float64)
                util, clock = cat("utilization", np.float64), cat("clock_mhz", np.float64)
                awake = ~(cat("low_power", bool) | cat("failed", bool) | cat("waking", bool))
                t_card = np.repeat(np.asarray([t for t, _, _ in batches], dtype=np.float64), sizes)
                supply = np.repeat(np.asarray([c for _, c, _ in batches], dtype=np.float64), sizes)
            else:
                ok = (idx >= 0) & (idx < n)
                idx = idx[ok]

                def cat_ok(name: str, dtype: type) -> Any:
                    return np.concatenate([getattr(b, name) for _, _, b in batches]).astype(dtype, copy=False)[ok]

                power[idx] = cat_ok("power_w", np.float64)
                die[idx] = cat_ok("die_temp_c", np.float64)
                util[idx] = cat_ok("utilization", np.float64)
                clock[idx] = cat_ok("clock_mhz", np.float64)
                awake[idx] = ~(cat_ok("low_power", bool) | cat_ok("failed", bool) | cat_ok("waking", bool))
                t_card[idx] = np.repeat(np.asarray([t for t, _, _ in batches], dtype=np.float64), sizes)[ok]
                supply[idx] = np.repeat(np.asarray([c for _, c, _ in batches], dtype=np.float64), sizes)[ok]
        else:
            for t_b, supply_b, b in batches:
                idx = np.asarray(b.card_index, dtype=np.int64)
                ok = (idx >= 0) & (idx < n)
                idx = idx[ok]
                power[idx] = np.asarray(b.power_w, dtype=np.float64)[ok]
                die[idx] = np.asarray(b.die_temp_c, dtype=np.float64)[ok]
                util[idx] = np.asarray(b.utilization, dtype=np.float64)[ok]
                clock[idx] = np.asarray(b.clock_mhz, dtype=np.float64)[ok]
                awake[idx] = ~(
                    np.asarray(b.low_power, dtype=bool)[ok]
                    | np.asarray(b.failed, dtype=bool)[ok]
                    | np.asarray(b.waking, dtype=bool)[ok]
                )
                t_card[idx] = t_b
                supply[idx] = supply_b
        with np.errstate(invalid="ignore"):
            valid = (
                np.isfinite(power)
                & np.isfinite(die)
                & np.isfinite(supply)
                & np.isfinite(t_card)
                & (power >= 0)
                & (power < 5 * self.site.card.power_limit_w)
                & (die > -20)
                & (die < 150)
            )
        if frozen_cards:
            valid[[c for c in frozen_cards if 0 <= c < n]] = False
        # a card reading stamped before the last one taken (late, reordered, a backlog replayed) is
        # dropped however late, as the belief drops it (it restarted the card's thermal model at the
        # older time, pausing its learning); a step back of the site's clock comes as clock_went_back
        valid &= ~(t_card < self._last_t)
        self._maybe_update_flow()
        # leakage sees the die temperature at the start of each interval (power is held over it);
        # the thermal model's prediction is used there because the noisy measured temperature as a
        # regressor would bias the leakage scale towards zero (errors in variables)
        fresh = valid & (t_card - self._last_t <= self.config.max_gap_s)
        die_start = np.where(fresh, supply + self._g * self._xd, die)
        self._update_thermal(valid, t_card, power, die, supply)
        with np.errstate(invalid="ignore"):
            pvalid = valid & awake & np.isfinite(util) & (util >= 0) & (util <= 1) & np.isfinite(clock) & (clock > 0)
            pvalid &= clock <= self._max_clock_mhz  # as the belief (twin.state)
            pvalid &= t_card != self._last_pt  # a copy of the last reading is not a second observation
        self._update_power(pvalid, t_card, power, die_start, util, clock)

    def _rack_supply(self, r: int) -> float:
        return float(self._supply[r])

    def _update_loop(
        self, r: int, t: float, supply_c: float, return_c: float, flow_lpm: float, speed: float = 1.0
    ) -> None:
        if not (math.isfinite(supply_c) and math.isfinite(return_c) and math.isfinite(flow_lpm)):
            return
        if not (-20 < supply_c < 100 and -20 < return_c < 120 and flow_lpm >= 0):
            return
        if t == self._rack_t[r] or self._late(t, self._rack_t[r]):
            # the same reading again (at-least-once delivery), or an older one (late, reordered: the
            # belief drops it too): no new observation, no restart of the loop's averages
            return
        # a CDU that does not report its pump's speed (NaN): the flow it should give is unknown, and
        # a pump slowed on purpose is not judged weak (read as full speed, every slowed pump was)
        known = math.isfinite(speed)
        if known and not pump_speed_in_range(speed):
            return  # no pump runs so (twin.readings.MAX_PUMP_SPEED_FRAC): no reading, as for the belief
        speed = speed if known and speed >= 0.05 else 1.0
        expected = speed * self.site.loop_flow_per_rack_lpm()
        self._supply[r] = supply_c
        cfg = self.config
        dt = t - self._rack_t[r]
        self._rack_t[r] = t
        self._flow_last[r] = flow_lpm
        if not (0 < dt <= cfg.max_gap_s * 10):  # its first reading, or the first after a silence
            self._flow_avg[r] = flow_lpm
            self._flow_fast[r] = flow_lpm
            self._flow_exp_avg[r] = expected if known else flow_lpm
            return
        fast = math.exp(-dt / cfg.flow_time_constant_s)
        self._flow_fast[r] = fast * self._flow_fast[r] + (1 - fast) * flow_lpm
        if not known:
            return
        lam = math.exp(-dt / cfg.pump_time_constant_s)
        self._flow_avg[r] = lam * self._flow_avg[r] + (1 - lam) * flow_lpm
        self._flow_exp_avg[r] = lam * self._flow_exp_avg[r] + (1 - lam) * expected
        p = self._rack_pdu_w[r]
        if math.isfinite(p) and p >= cfg.min_rack_power_w:
            self._dt_meas[r] = lam * self._dt_meas[r] + (1 - lam) * (return_c - supply_c)
            self._dt_pred[r] = lam * self._dt_pred[r] + (1 - lam) * p / (self._mcp_nominal * speed)
            self._dt_weight[r] = lam * self._dt_weight[r] + (1 - lam)

    @staticmethod
    def _late(t: float, last_t: float) -> bool:
        """A loop or PDU reading stamped ``t`` is late (reordered, a backlog replayed) after one stamped
        ``last_t``: older, by however much. Formerly one older by more than ten ``max_gap_s`` was
        taken for the site's clock gone back and restarted the loop's averages (and again at the next
        live reading); the agent now says when the clock went back (:meth:`clock_went_back`)."""
        return t < last_t

    def _maybe_update_flow(self) -> None:
        moved = np.abs(self._flow_fast / self._flow_used - 1.0) > self.config.flow_update_frac
        if moved.any():
            self._flow_used = np.where(moved, self._flow_fast, self._flow_used)
            self._net.set_params(self._params())
            self._r_exp = self._net.params.r_total_k_per_w.copy()

    def _update_thermal(
        self, valid: BoolArray, t_card: FloatArray, power: FloatArray, die: FloatArray, supply: FloatArray
    ) -> None:
        cfg = self.config
        dt = np.where(valid, t_card - self._last_t, np.nan)
        cont = valid & (dt > 0) & (dt <= cfg.max_gap_s)
        restart = valid & ~cont & ~(dt == 0)
        if restart.any():
            self._restart_thermal(np.flatnonzero(restart), t_card, power, die, supply)
        if not cont.any():
            return
        idx = np.flatnonzero(cont)
        at = _every_or(idx, self._n)
        # (np.nan_to_num's own checks cost more than the step itself: only a round with a card unread needs it)
        held_w = power if np.isfinite(power).all() else np.nan_to_num(power)
        steps = dt[at]
        one_step = bool(np.all(steps == steps[0]))  # (the usual: every card read at one time, no sort)
        for step in steps[:1] if one_step else np.unique(steps):
            sel = at if one_step else idx[steps == step]
            xd, xp = self._net.step(self._xd, self._xp, held_w, 0.0, float(step))
            self._xd[sel], self._xp[sel] = xd[sel], xp[sel]
        self._last_t[at] = t_card[at]
        # informative readings only (EstimatorConfig.min_rise_k), of a model that has settled, at a flow
        # the model follows (not while its smoothed flow is still on the way to a new pump speed's)
        with np.errstate(divide="ignore", invalid="ignore"):
            in_step = ~(np.abs(self._flow_fast / self._flow_last - 1.0) <= cfg.flow_update_frac)
        # ... while the loop reports: a loop gone silent (or refused) in a step would pause its cards for good
        in_step &= self._rack_t >= self.time_s - cfg.max_gap_s
        idx = idx[
            (self._xd[idx] >= cfg.min_rise_k) & (t_card[idx] >= self._learn_from[idx]) & ~in_step[self._card_rack[idx]]
        ]
        if not idx.size:
            return
        x = self._xd[idx]
        y = die[idx] - supply[idx]
        pg = self._pg[idx] + self._q_g * dt[idx]
        s = x * x * pg + cfg.die_noise_k**2
        innov = y - self._g[idx] * x
        # innovation gate (EstimatorConfig.innovation_gate_sd): an outlier is skipped; outliers on one
        # side for gate_confirm_s are a change of the resistance: the variance grows to take it
        gated = innov * innov > cfg.innovation_gate_sd**2 * s
        sign = np.sign(innov)
        since = self._gated_since[idx]
        new_run = gated & (np.isnan(since) | (sign != self._gated_sign[idx]))
        since = np.where(new_run, t_card[idx], since)
        confirmed = gated & (t_card[idx] - since >= cfg.gate_confirm_s)
        self._gated_since[idx] = np.where(gated & ~confirmed, since, np.nan)
        self._gated_sign[idx] = np.where(gated, sign, 0.0)
        pg = np.where(confirmed, np.maximum(pg, (innov / x) ** 2), pg)
        take = ~gated | confirmed
        s = x * x * pg + cfg.die_noise_k**2
        k = np.where(take, pg * x / s, 0.0)
        self._g[idx] += k * innov
        self._pg[idx] = pg - k * x * pg

    def _restart_thermal(
        self, idx: IntArray, t_card: FloatArray, power: FloatArray, die: FloatArray, supply: FloatArray
    ) -> None:
        """(Re)start the thermal model of cards ``idx`` (their first reading, or the first after a
        gap): the die as measured (through the current ratio), in equilibrium with the plate under
        the current power; no learning for ``settle_time_constants`` slow time constants."""
        p = self._net.params
        r_dc = p.r_die_case_k_per_w[idx]
        xd_ss, _xp_ss = self._net.steady_state(power, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            xd = (die[idx] - supply[idx]) / self._g[idx]
        xd = np.where(np.isfinite(xd) & (xd >= 0), xd, xd_ss[idx])
        self._xd[idx] = xd
        self._xp[idx] = np.clip(xd - power[idx] * r_dc, 0.0, xd)
        self._last_t[idx] = t_card[idx]
        tau = (p.c_die_j_per_k[idx] + p.c_plate_j_per_k[idx]) * (r_dc + p.r_case_coolant_k_per_w[idx])
        self._learn_from[idx] = t_card[idx] + self.config.settle_time_constants * tau
        self._gated_since[idx] = np.nan

    def _update_power(
        self,
        valid: BoolArray,
        t_card: FloatArray,
        power: FloatArray,
        die: FloatArray,
        util: FloatArray,
        clock: FloatArray,
    ) -> None:
        if not valid.any():
            return
        idx = _every_or(np.flatnonzero(valid), self._n)
        m = self._model
        lvl = np.abs(clock[idx][:, None] - self._clocks[None, :]).argmin(axis=1)
        phi = np.stack(
            [m.idle_w[lvl], util[idx] * m.dyn_w[lvl], m.leak_w_per_k[lvl] * (die[idx] - m.reference_temp_c)], axis=1
        )
        dt = t_card[idx] - self._last_pt[idx]
        dt = np.where(np.isfinite(dt) & (dt > 0), np.minimum(dt, 3600.0), 0.0)
        self._last_pt[idx] = t_card[idx]
        p = self._p_theta[idx]  # (with every card a view: its diagonals grow in place, then p is replaced)
        p.reshape(-1, 9)[:, ::4] += self._q_theta[None, :] * dt[:, None]  # (each 3x3's diagonal, in place)
        p_phi = np.einsum("nij,nj->ni", p, phi)
        s = np.einsum("ni,ni->n", phi, p_phi) + self.config.power_noise_w**2
        k = p_phi / s[:, None]
        innov = power[idx] - np.einsum("ni,ni->n", phi, self._theta[idx])
        self._theta[idx] += k * innov[:, None]
        self._p_theta[idx] = p - np.einsum("ni,nj->nij", k, p_phi)

    # ================================================================================================
    def estimates(self) -> Estimates:
        site = self.site
        with np.errstate(invalid="ignore", divide="ignore"):
            settled = self._dt_weight >= _SETTLED_WEIGHT
            ratio = np.where(settled & (self._dt_pred > 0), self._dt_meas / self._dt_pred, np.nan)
        return Estimates(
            time_s=self.time_s,
            r_ratio=self._g.copy(),
            r_ratio_sd=np.sqrt(self._pg),
            r_th_k_per_w=self._g * self._r_exp,
            r_expected_k_per_w=self._r_exp.copy(),
            idle_scale=self._theta[:, 0].copy(),
            dynamic_scale=self._theta[:, 1].copy(),
            leakage_scale=self._theta[:, 2].copy(),
            leakage_w_per_k=self._theta[:, 2] * site.card.leakage_w_per_k,
            rack_dt_ratio=np.asarray(ratio, dtype=np.float64),
            rack_flow_deficit=1.0 - self._flow_avg / self._flow_exp_avg,
        )

    def anomalies(self) -> list[Anomaly]:
        cfg = self.config
        out: list[Anomaly] = []
        thr = cfg.r_threshold_frac
        sure = np.sqrt(self._pg) < thr / 3.0
        fouled = np.flatnonzero((self._g > 1.0 + thr) & sure)
        for c in fouled:
            g = float(self._g[c])
            out.append(
                Anomaly(
                    kind="fouled_cold_plate",
                    rack=int(self._card_rack[c]),
                    card=int(c),
                    value=g,
                    threshold=1.0 + thr,
                    detail=f"card {int(c)}: thermal resistance {100 * (g - 1):.0f}% above the spec at the "
                    f"measured flow ({g * self._r_exp[c]:.4f} vs {self._r_exp[c]:.4f} K/W)",
                )
            )
        est = self.estimates()
        pthr = cfg.pump_threshold_frac
        for r in range(self._n_r):
            ratio = float(est.rack_dt_ratio[r])
            deficit = float(est.rack_flow_deficit[r])
            if math.isfinite(ratio) and ratio > 1.0 + pthr:
                out.append(
                    Anomaly(
                        kind="weak_pump",
                        rack=r,
                        card=None,
                        value=ratio,
                        threshold=1.0 + pthr,
                        detail=f"rack {r}: loop dT {100 * (ratio - 1):.0f}% above what its power and pump speed "
                        f"predict (flow {100 * deficit:.0f}% below what the pump speed should give)",
                    )
                )
            elif deficit > pthr:
                out.append(
                    Anomaly(
                        kind="weak_pump",
                        rack=r,
                        card=None,
                        value=1.0 / max(1.0 - deficit, 1e-6),
                        threshold=1.0 + pthr,
                        detail=f"rack {r}: flow {100 * deficit:.0f}% below what the pump speed should give",
                    )
                )
        return out


def _every_or(idx: IntArray, n: int) -> IntArray | slice:
    """``idx`` (indices of cards, ascending and distinct, as ``np.flatnonzero`` gives them), or a slice
    of every card when it is all ``n`` of them: it reads and writes the same entries of a per-card
    array, as views, without gathering them (the usual round: every card read)."""
    return slice(None) if idx.size == n else idx


def _plain(b: CardBatch) -> bool:
    """The batch's arrays (those the estimator reads) are one-dimensional arrays, one entry per card."""
    ci = b.card_index
    if not (isinstance(ci, np.ndarray) and ci.ndim == 1):
        return False
    n = ci.shape
    for a in (b.power_w, b.die_temp_c, b.utilization, b.clock_mhz, b.low_power, b.failed, b.waking):
        if not (isinstance(a, np.ndarray) and a.shape == n):
            return False
    return True
