"""The control policies ``racktwin evaluate`` compares, each driving a ``twin.plant.Plant`` in process.

========== ===============================================================================================
policy     what it does
========== ===============================================================================================
baseline   today's default: every card at its top clock and full power limit, no idle management, the
           site's fixed supply set-point (``facility.supply_temp_c``), the plant's own scheduler.
static-cap what operators do today with ``nvidia-smi -pl``: one power limit for every card such that a
           full rack fits its limit, ``(limit - margin - host overhead) / cards per rack`` (the agent's
           ``rack_margin_w``), set once; otherwise as baseline.
reactive   three-band rack power capping on MEASURED rack power, as the hierarchical data-center cappers
           do (Facebook Dynamo, Wu et al., ISCA'16: a capping threshold, a capping target and an
           uncapping threshold per power device; Google's fleet capping, Thunderbolt, Li et al.,
           OSDI'20): above the high band the rack's busy cards get power limits that take the rack to
           the target (the cut split in proportion to each card's power above the lowest limit, so the
           hungriest cards give most), between the bands the limits hold, below the low band they are
           raised toward the target; it acts every 3 s on the latest telemetry round, once per round
           (telemetry slower than that gives it nothing new to act on). No idle management, fixed
           set-point, the plant's scheduler.
greedy     the agent with ``models.heuristic`` plans instead of the MILP: the same ``Controller`` (the
           same context, placement, guard and estimator) with ``step(use_solver=False)``.
racktwin   the agent: ``agent.controller.Controller`` in ``agent.loop.ClosedLoop`` (twin belief,
           estimator, placement, DVFS + low-power idle + set-point MILP, guard), with the agent's
           default configuration (``ControlConfig()``, ``PricesConfig()``) -- the code ``racktwin agent``
           runs.
========== ===============================================================================================

A policy is bound to a plant (:meth:`Policy.bind`), then :meth:`Policy.run` steps the plant (1 s
steps) and calls ``on_step()`` after every step; :attr:`Policy.stats` tells what the controller did.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent.config import AgentConfig, ControlConfig, LoadedConfig, PricesConfig
from agent.controller import Controller
from agent.decision import Decision, fell_back
from agent.guard import failsafe_card_limit_w
from agent.loop import ApplyReport, ClosedLoop, TelemetryRounds
from twin.estimate import AnomalyHistory, Estimates
from twin.plant import CommandError, Plant
from twin.readings import Readings
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "POLICY_NAMES",
    "AgentPolicy",
    "BaselinePolicy",
    "ControlStats",
    "GreedyController",
    "Policy",
    "ReactivePolicy",
    "StaticCapPolicy",
    "make_policy",
    "static_cap_w",
]

#: The policies in the order reports list them.
POLICY_NAMES = ("baseline", "static-cap", "reactive", "greedy", "racktwin")

#: Decisions' explanations kept per policy (examples for the report): kinds of notes, each once.
_MAX_NOTES = 40

#: The measured numbers of a note (those with a decimal point: a late solve's time share, a rack's
#: kW), masked to tell a note's kind: the same event at another value is one more of its kind, not a
#: new note (a late solve's share, to three decimals, made every late solve a note of its own and
#: filled the notes with them). Whole numbers (racks, set-points, card counts) tell kinds apart.
_MEASURED = re.compile(r"\d+\.\d+")


@dataclass
class ControlStats:
    """What a policy's controller did over a run."""

    decisions: int = 0
    solve_times_s: list[float] = field(default_factory=list)  # per decision: the controller's compute time
    statuses: dict[str, int] = field(default_factory=dict)  # decision status -> count
    fallbacks: int = 0  # decisions whose solve was late, failed or infeasible (greedy plan, relaxed, held)
    failsafe_decisions: int = 0  # decisions with at least one rack at fail-safe caps
    failsafe_entries: int = 0  # times a rack went to fail-safe caps
    failsafe_racks: list[str] = field(default_factory=list)
    capping_actions: int = 0  # reactive: rack capping / uncapping moves
    refused_commands: int = 0  # commands the plant refused
    guard_notes: int = 0  # decisions the guard changed (at least one action in Decision.guard_actions)
    # what the guard changed: action (agent.guard.GUARD_ACTIONS) -> times it took it, over every decision
    guard_actions: dict[str, int] = field(default_factory=dict)
    # every anomaly the estimator flagged during the run, from when; ", cleared" if no longer flagged
    anomalies: list[str] = field(default_factory=list)
    invalid_readings: int = 0  # card readings the belief refused (NaN, out of range)
    first_failsafe_s: float = math.nan
    # a few explanations worth reading: the first of each kind, with how many more of its kind followed
    notes: list[str] = field(default_factory=list)


def static_cap_w(site: SiteSpec, control: ControlConfig | None = None) -> float:
    """The static per-card power limit: ``(limit - margin - host overhead) / cards per rack`` (W, floored,
    within the card's range) -- the agent's fail-safe cap, applied to every card all the time."""
    cfg = control if control is not None else ControlConfig()
    return float(failsafe_card_limit_w(site, cfg, np.zeros(site.n_racks))[0])


class Policy:
    """A controller of an in-process plant (see the module docstring)."""

    name = "policy"
    #: the plant's placement mode under this policy ("builtin": the plant's own scheduler)
    placement = "builtin"
    #: whether :meth:`act` reads telemetry (:meth:`telemetry`): :meth:`run` then takes each round
    reads_telemetry = False

    def __init__(self, site: SiteSpec, period_s: float) -> None:
        self.site = site
        self.period_s = float(period_s)
        self.stats = ControlStats()
        self.plant: Plant | None = None
        #: how often the site's telemetry comes (a run scenario's ``telemetry_period_s``; set before
        #: :meth:`bind`): a policy that reads telemetry sees the latest round
        self.telemetry_period_s = 1.0
        self._rounds = TelemetryRounds(0.0)
        self._latest: Readings | None = None

    def bind(self, plant: Plant) -> None:
        """Take control of ``plant`` (at its current time)."""
        self.plant = plant
        self._next_s = plant.time_s
        self._rounds = TelemetryRounds(plant.time_s, self.telemetry_period_s)
        self._latest = None

    def telemetry(self, plant: Plant) -> Readings:
        """The latest telemetry round: the plant's readings now when telemetry comes every step (1 s),
        else those of the last round (:meth:`run` takes them when due)."""
        if self.telemetry_period_s <= 1.0 or self._latest is None:
            return plant.readings()
        return self._latest

    def act(self, plant: Plant) -> None:
        """One control step (every ``period_s`` of plant time)."""

    def run(self, duration_s: float, on_step: Callable[[], None]) -> None:
        """Step the plant ``duration_s`` in 1 s steps, acting every period."""
        plant = self._bound()
        end = plant.time_s + duration_s
        while plant.time_s < end - 1e-9:
            if self.reads_telemetry and self.telemetry_period_s > 1.0 and self._rounds.due(plant.time_s):
                self._latest = plant.readings()
            if plant.time_s >= self._next_s - 1e-9:
                t0 = time.perf_counter()
                self.act(plant)
                self.stats.decisions += 1
                self.stats.solve_times_s.append(time.perf_counter() - t0)
                self._next_s = max(self._next_s + self.period_s, plant.time_s + 1e-9)
            plant.step(min(1.0, end - plant.time_s))
            on_step()

    def finish(self) -> None:
        """Fill the end-of-run parts of :attr:`stats`."""

    def _bound(self) -> Plant:
        if self.plant is None:
            raise RuntimeError(f"policy {self.name} is not bound to a plant")
        return self.plant


class BaselinePolicy(Policy):
    """Every card at its top clock and full power limit, fixed set-point, no idle management."""

    name = "baseline"

    def bind(self, plant: Plant) -> None:
        super().bind(plant)
        alive = np.flatnonzero(~plant.truth().failed)
        plant.set_levels(alive, 0)
        plant.set_power_limits(alive, self.site.card.power_limit_w)
        plant.set_supply_temp(self.site.facility.supply_temp_c)


class StaticCapPolicy(BaselinePolicy):
    """Baseline with one static power limit per card (:func:`static_cap_w`)."""

    name = "static-cap"

    def __init__(self, site: SiteSpec, period_s: float, control: ControlConfig | None = None) -> None:
        super().__init__(site, period_s)
        self.cap_w = static_cap_w(site, control)

    def bind(self, plant: Plant) -> None:
        super().bind(plant)
        plant.set_power_limits(np.flatnonzero(~plant.truth().failed), self.cap_w)
        self.stats.notes.append(f"every card limited to {self.cap_w:.0f} W")


class ReactivePolicy(BaselinePolicy):
    """Three-band capping of each rack on its measured (PDU) power (see the module docstring).

    Bands below the rack limit (assumptions in the range the cappers describe): capping threshold
    ``limit - high_band_w``, target ``limit - target_band_w``, uncapping threshold ``limit -
    low_band_w``. It sees only telemetry (``Plant.readings()``: noisy, possibly missing or garbage):
    a rack with no valid PDU reading keeps its limits."""

    name = "reactive"
    reads_telemetry = True

    def __init__(
        self,
        site: SiteSpec,
        period_s: float = 3.0,
        *,
        min_power_limit_w: float = 200.0,
        high_band_w: float = 500.0,
        target_band_w: float = 1500.0,
        low_band_w: float = 3000.0,
    ) -> None:
        super().__init__(site, period_s)
        self.min_limit_w = float(min_power_limit_w)
        self.high_w = float(high_band_w)
        self.target_w = float(target_band_w)
        self.low_w = float(low_band_w)
        self._acted_on: Readings | None = None  # the telemetry round it last acted on

    def bind(self, plant: Plant) -> None:
        super().bind(plant)
        self._acted_on = None

    def act(self, plant: Plant) -> None:
        site = self.site
        max_lim = site.card.power_limit_w
        readings = self.telemetry(plant)
        if readings is self._acted_on:
            return  # telemetry slower than its period: no new reading to act on (a cut is made once)
        self._acted_on = readings
        failed_now = plant.truth().failed  # the racks refuse commands to failed cards (as apply_to_plant)
        for rr in readings.racks:
            p = rr.pdu.power_w if rr.pdu is not None else math.nan
            limit = float(site.rack_power_limits_w()[rr.rack])
            if not (math.isfinite(p) and 0.0 < p < 10.0 * limit):
                continue
            cb = rr.cards
            if cb is None:
                continue
            idx = np.asarray(cb.card_index, dtype=np.int64)
            power = np.asarray(cb.power_w, dtype=np.float64)
            lim = np.asarray(cb.power_limit_w, dtype=np.float64)
            ok = np.isfinite(power) & np.isfinite(lim) & (power >= 0) & ~np.asarray(cb.failed, dtype=bool)
            ok &= ~failed_now[idx]
            if p > limit - self.high_w:
                # cap: take the rack to its target; the cut is split by each card's power above the floor
                cut = p - (limit - self.target_w)
                busy = ok & (power > self.min_limit_w)
                above = np.where(busy, power - self.min_limit_w, 0.0)
                if above.sum() <= 0:
                    continue
                new = np.minimum(lim, power) - cut * above / above.sum()
                new = np.clip(new, self.min_limit_w, max_lim)
                self._set(plant, idx[busy], new[busy])
            elif p < limit - self.low_w:
                # uncap: raise the capped cards toward the target, the room split evenly
                capped = ok & (lim < max_lim - 1e-6)
                if not capped.any():
                    continue
                room = (limit - self.target_w) - p
                new = np.clip(lim + room / int(capped.sum()), self.min_limit_w, max_lim)
                self._set(plant, idx[capped], new[capped])

    def _set(self, plant: Plant, cards: npt.NDArray[np.int64], limits_w: FloatArray) -> None:
        if cards.size == 0:
            return
        try:
            plant.set_power_limits(cards, np.floor(limits_w))
            self.stats.capping_actions += 1
        except CommandError:
            self.stats.refused_commands += 1


class GreedyController(Controller):
    """The agent's controller planning with ``models.heuristic`` (``greedy_cycle``) instead of the MILP:
    context, placement, guard and commit are the agent's own."""

    def step(
        self,
        snap: StateSnapshot,
        now_s: float | None = None,
        estimates: Estimates | None = None,
        *,
        use_solver: bool = True,
        incremental: bool = False,
        refused_failed: BoolArray | None = None,
    ) -> Decision:
        return super().step(
            snap, now_s, estimates, use_solver=False, incremental=incremental, refused_failed=refused_failed
        )


class AgentPolicy(Policy):
    """The agent's controller in ``agent.loop.ClosedLoop`` (``racktwin``) or its greedy variant. The
    agent places queued jobs (the plant waits for it) unless ``control.control_placement`` is false:
    then the plant's own scheduler places them, as under the other policies."""

    def __init__(
        self,
        site: SiteSpec,
        control: ControlConfig | None = None,
        prices: PricesConfig | None = None,
        *,
        greedy: bool = False,
        source: str = "(evaluate)",
    ) -> None:
        control = control if control is not None else ControlConfig()
        super().__init__(site, control.period_s)
        self.name = "greedy" if greedy else "racktwin"
        self.placement = "external" if control.control_placement else "builtin"
        loaded = LoadedConfig(
            config=AgentConfig(site=source, control=control, prices=prices if prices is not None else PricesConfig()),
            site=site,
            source=source,
            overrides=(),
        )
        cls = GreedyController if greedy else Controller
        self.controller: Controller = cls.from_config(loaded)
        self.greedy = greedy
        self.loop: ClosedLoop | None = None
        #: called with each decision and what the plant did with it, after the policy's own bookkeeping
        #: (benchmarks and diagnostics listen here: ``benchmarks/bench_placement_waits.py``)
        self.decision_listeners: list[Callable[[Decision, ApplyReport], None]] = []
        self._prev_failsafe: set[int] = set()
        self._anomalies = AnomalyHistory()
        # per kind of note (_MEASURED): its index in stats.notes, its first line and how many followed
        self._note_kinds: dict[str, tuple[int, str, int]] = {}

    def bind(self, plant: Plant) -> None:
        super().bind(plant)
        self.loop = ClosedLoop(
            plant, self.controller, on_decision=self._on_decision, telemetry_period_s=self.telemetry_period_s
        )

    def run(self, duration_s: float, on_step: Callable[[], None]) -> None:
        if self.loop is None:
            raise RuntimeError(f"policy {self.name} is not bound to a plant")
        self.loop.on_step = lambda _plant: on_step()
        self.loop.run(duration_s)

    def _on_decision(self, decision: Decision, report: ApplyReport) -> None:
        st = self.stats
        st.decisions += 1
        if self.loop is not None and self.loop.estimator is not None:
            self._anomalies.update(self.loop.estimator.anomalies(), decision.time_s)
        st.solve_times_s.append(decision.solve_time_s)
        st.statuses[decision.status] = st.statuses.get(decision.status, 0) + 1
        if not self.greedy and fell_back(decision.plan_status, decision.source):
            st.fallbacks += 1  # its solve was late, failed or infeasible (greedy plan, relaxation, held settings)
        st.refused_commands += len(report.refused)
        fs = set(decision.failsafe_racks)
        if fs:
            st.failsafe_decisions += 1
            if math.isnan(st.first_failsafe_s):
                st.first_failsafe_s = decision.time_s
        entered = fs - self._prev_failsafe
        st.failsafe_entries += len(entered)
        for r in sorted(entered):
            name = self.site.rack_names[r]
            if name not in st.failsafe_racks:
                st.failsafe_racks.append(name)
        self._prev_failsafe = fs
        if decision.guard_actions:
            st.guard_notes += 1
            for action in decision.guard_actions:
                st.guard_actions[action] = st.guard_actions.get(action, 0) + 1
        # why the guard acted, a plan was relaxed or none was found, and why a set-point's solve fell back
        # to the greedy plan (models/solve.py: late, failed, stopped with no solution, over a cap, no time left)
        kinds = ("guard:", "infeasible", "relaxed", "no plan", "fallback:")
        for e in decision.explanation:
            if e.startswith(kinds):
                self._note(e, decision.time_s)
        for listen in self.decision_listeners:
            listen(decision, report)

    def _note(self, e: str, time_s: float) -> None:
        """Keep explanation line ``e`` of the decision at ``time_s`` among the notes: the first of its
        kind (``_MEASURED``) as it reads, up to ``_MAX_NOTES`` kinds; a later one of its kind only
        counts on it (``(and 12 more like it, the last at t=900 s)``), so that one frequent kind
        does not crowd out the others."""
        st = self.stats
        kind = _MEASURED.sub("#", e)
        seen = self._note_kinds.get(kind)
        if seen is None:
            if len(st.notes) < _MAX_NOTES:
                self._note_kinds[kind] = (len(st.notes), f"t={time_s:.0f} s: {e}", 0)
                st.notes.append(f"t={time_s:.0f} s: {e}")
            return
        i, first, more = seen
        self._note_kinds[kind] = (i, first, more + 1)
        st.notes[i] = f"{first} (and {more + 1} more like it, the last at t={time_s:.0f} s)"

    def finish(self) -> None:
        if self.loop is None:
            return
        if self.loop.estimator is not None:
            self._anomalies.update(self.loop.estimator.anomalies(), self.loop.plant.time_s)
            self.stats.anomalies = self._anomalies.describe(self.site.rack_names)
        self.stats.invalid_readings = int(self.loop.state.invalid_count.sum())


def make_policy(
    name: str,
    site: SiteSpec,
    control: ControlConfig | None = None,
    prices: PricesConfig | None = None,
) -> Policy:
    """A fresh policy by name (one of :data:`POLICY_NAMES`)."""
    control = control if control is not None else ControlConfig()
    if name == "baseline":
        return BaselinePolicy(site, control.period_s)
    if name == "static-cap":
        return StaticCapPolicy(site, control.period_s, control)
    if name == "reactive":
        return ReactivePolicy(site, min_power_limit_w=control.min_power_limit_w)
    if name in ("greedy", "racktwin"):
        return AgentPolicy(site, control, prices, greedy=name == "greedy")
    raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")
