"""The controller in process, against ``twin.plant.Plant``: fast closed loops for tests and evaluation.

* :func:`apply_to_plant` applies a :class:`agent.decision.Decision` to a plant: DVFS levels, power
  limits, low-power idle / wake, the supply set-point, placements, rack pump speeds (faster pumps
  first, slower ones last; a slowed pump is renewed at every decision), host power (hosts to power
  on before the wakes, hosts to power off last). Cards that failed are left
  alone; a command the plant refuses (a busy card asked to sleep, a job no longer queued) is
  reported, not raised. :class:`ClosedLoop` tells the controller of a placement refused
  (``Controller.placement_refused``), as the service does on a ``rejected`` ack: the job may be placed
  again at the next decision, its cards are not held for it; the cards a placement was refused for
  as failed get no placement in the next decisions until a reading of them at least as new as the refusal
  (as the service's ``card_failed`` ack: ``agent.command_overlays.Overlays.unplaceable``; the
  decisions budget them as their readings say).
* :class:`ClosedLoop` runs plant -> readings (every ``telemetry_period_s``: :class:`TelemetryRounds`)
  -> ``TwinState`` (+ ``Estimator``) -> ``Controller.step`` -> ``apply_to_plant``: a decision every
  ``period_s`` of plant time and, like the service, at once (at most every
  ``min_replan_interval_s``; the incremental adjustment, no solve) when a job starts, ends, is
  requeued, resumes computing or (when the agent places jobs) is submitted, and (with
  ``checkpoint_end_lead_s``) when a checkpoint comes within that lead of its declared end::

      loop = ClosedLoop(plant, Controller(site, ControlConfig(period_s=15)))
      loop.run(3600)                    # one hour of plant time, 1 s steps
      plant.accounting()                # energy, work, seconds over a rack limit ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agent.command_overlays import Overlays
from agent.controller import Controller, decides_again_on
from agent.decision import Decision, PlacementOrder
from twin.estimate import Estimator
from twin.plant import CommandError, Plant
from twin.state import TwinState

__all__ = ["ApplyReport", "ClosedLoop", "TelemetryRounds", "apply_to_plant"]


@dataclass
class ApplyReport:
    """What :func:`apply_to_plant` did: counts of cards per command and the refusals."""

    levels: int = 0
    power_limits: int = 0
    slept: int = 0
    woken: int = 0
    setpoint_c: float | None = None
    pumps: int = 0  # racks whose pump speed was set (a slowed pump is renewed every decision)
    hosts_on: int = 0
    hosts_off: int = 0
    placed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    refused_placements: list[PlacementOrder] = field(default_factory=list)  # also in ``refused``
    # the cards a refused placement found failed (``CommandError.failed_cards``, site indices)
    placement_failed_cards: list[int] = field(default_factory=list)


def apply_to_plant(decision: Decision, plant: Plant) -> ApplyReport:
    """Apply ``decision`` to ``plant`` (see the module docstring): lowering commands first."""
    rep = ApplyReport()
    truth = plant.truth()
    failed = truth.failed | decision.card_failed
    alive = np.flatnonzero(~failed)
    min_lim = plant.config.min_power_limit_w

    def attempt(what: str, fn: Callable[[], None]) -> bool:
        try:
            fn()
        except CommandError as exc:
            rep.refused.append(f"{what}: {exc.reason}")
            return False
        return True

    speed = decision.rack_pump_speed_frac
    if speed is not None:  # faster pumps first
        faster = np.flatnonzero(speed > truth.rack_pump_speed_frac + 1e-9)
        if faster.size and attempt("set_pump_speed", lambda: plant.set_pump_speed(faster, speed[faster])):
            rep.pumps = int(faster.size)
    lim = np.clip(decision.card_power_limit_w[alive], min_lim, plant.site.card.power_limit_w)
    if alive.size and attempt("set_power_limits", lambda: plant.set_power_limits(alive, lim)):
        rep.power_limits = int(alive.size)
    lv = decision.card_level[alive]
    moved = alive[truth.level[alive] != lv]
    if moved.size and attempt("set_levels", lambda: plant.set_levels(moved, decision.card_level[moved])):
        rep.levels = int(moved.size)
    free = np.zeros(plant.n_cards, dtype=bool)
    free[plant.free_cards()] = True
    sleep = np.flatnonzero(decision.card_low_power & ~truth.low_power & ~failed & free)
    if sleep.size and attempt("enter_low_power", lambda: plant.enter_low_power(sleep)):
        rep.slept = int(sleep.size)
    host_off = decision.host_off
    if host_off is not None:
        boot = np.flatnonzero(~host_off & truth.host_off)
        if boot.size and attempt("power_on_hosts", lambda: plant.power_on_hosts(boot)):
            rep.hosts_on = int(boot.size)
    wake = np.flatnonzero(~decision.card_low_power & truth.low_power & ~failed)
    if wake.size and attempt("wake", lambda: plant.wake(wake)):
        rep.woken = int(wake.size)
    new_setpoint = (
        math.isfinite(decision.supply_temp_c) and abs(decision.supply_temp_c - truth.supply_setpoint_c) > 1e-9
    )
    if new_setpoint and attempt("set_supply_temp", lambda: plant.set_supply_temp(decision.supply_temp_c)):
        rep.setpoint_c = decision.supply_temp_c
    for order in decision.placements:
        try:
            plant.place_job(order.job_id, np.asarray(order.cards, dtype=np.int64))
        except CommandError as exc:
            rep.refused.append(f"place_job {order.job_id}: {exc.reason}")
            rep.refused_placements.append(order)
            rep.placement_failed_cards.extend(exc.failed_cards)
        else:
            rep.placed.append(order.job_id)
    if host_off is not None:
        down = np.flatnonzero(host_off & ~truth.host_off)
        if down.size and attempt("power_off_hosts", lambda: plant.power_off_hosts(down)):
            rep.hosts_off = int(down.size)
    if speed is not None:  # slower pumps last (and renewed: the plant holds a slowed pump for a while)
        slower = np.flatnonzero((speed < 1.0) & (speed <= truth.rack_pump_speed_frac + 1e-9))
        if slower.size and attempt("set_pump_speed", lambda: plant.set_pump_speed(slower, speed[slower])):
            rep.pumps += int(slower.size)
    return rep


class TelemetryRounds:
    """When an in-process loop reads the plant's telemetry: at ``start_s`` and every
    ``telemetry_period_s`` after (a run scenario's period, as the simulator publishes), or at every
    plant step when the period is at most a step (1 s)."""

    def __init__(self, start_s: float, telemetry_period_s: float = 1.0) -> None:
        if not (math.isfinite(telemetry_period_s) and telemetry_period_s > 0):
            raise ValueError(f"telemetry_period_s must be a positive number of seconds, got {telemetry_period_s}")
        self.start_s = start_s
        self.period_s = float(telemetry_period_s)
        self._n = 0  # rounds taken; the next is due at start_s + n * period (no accumulated rounding)

    def due(self, t_s: float) -> bool:
        """Whether a round is due at plant time ``t_s`` (called once per step; marks it taken)."""
        if self.period_s <= 1.0:
            return True
        if t_s < self.start_s + self._n * self.period_s - 1e-9:
            return False
        while self.start_s + self._n * self.period_s <= t_s + 1e-9:
            self._n += 1
        return True


class ClosedLoop:
    """Plant, belief, estimator and controller in one loop (see the module docstring).

    ``on_decision(decision, report)`` is called after each decision is applied; ``on_step(plant)``
    after each plant step (``racktwin evaluate`` judges the true state there). ``estimator=False``
    skips online calibration (faster). ``decisions`` counts the decisions made.
    """

    def __init__(
        self,
        plant: Plant,
        controller: Controller,
        *,
        period_s: float | None = None,
        estimator: bool = True,
        replan_on_job_events: bool | None = None,
        on_decision: Callable[[Decision, ApplyReport], None] | None = None,
        on_step: Callable[[Plant], None] | None = None,
        telemetry_period_s: float = 1.0,
    ) -> None:
        cfg = controller.control
        self.plant = plant
        self.controller = controller
        self.period_s = cfg.period_s if period_s is None else float(period_s)
        self.state = TwinState(plant.site, stuck_after_readings=cfg.stuck_after_readings)
        self.estimator = Estimator(plant.site) if estimator else None
        self.replan = cfg.replan_on_job_events if replan_on_job_events is None else replan_on_job_events
        self.on_decision = on_decision
        self.on_step = on_step
        self.decisions = 0
        self.last_decision: Decision | None = None
        self._next_s = plant.time_s
        self._last_s = -math.inf
        self._urgent = False  # an event asked for a decision within min_replan_interval_s of the last one
        self._wake_s = math.inf  # when a checkpoint's end calls for a decision (checkpoint_end_lead_s)
        self.telemetry = TelemetryRounds(plant.time_s, telemetry_period_s)
        # cards a refused placement found failed, placed on by no decision until a reading of them newer
        # than the decision that found them (marked just after it: as the service's card_failed acks,
        # agent.command_overlays)
        self.refusals = Overlays(plant.site)

    def observe(self) -> bool:
        """Fold the plant's readings (when a telemetry round is due) and its events into the belief;
        True when an event asks for a decision now."""
        readings = self.plant.readings() if self.telemetry.due(self.plant.time_s) else None
        events = self.plant.drain_events()
        if readings is not None:
            self.state.update(readings)
        self.state.apply_events(events)
        if events:
            self._rewake()
        if self.estimator is not None and readings is not None:  # stuck sensors are no observations
            self.estimator.update(
                readings, frozen_cards=self.state.stuck_cards(), frozen_racks=self.state.stuck_racks()
            )
        placing = self.controller.control.control_placement
        return self.replan and any(decides_again_on(e, placing) for e in events)

    def _rewake(self) -> None:
        """When the next checkpoint's end calls for a decision, after the last one (inf: none)."""
        if self.controller.control.checkpoint_end_lead_s > 0.0:
            self._wake_s = self.controller.checkpoint_wake_s(self.state.jobs.values(), self._last_s)

    def decide(self, *, incremental: bool = False) -> Decision:
        """One decision now, applied to the plant (``incremental``: the fast adjustment made on job
        events, as the service does)."""
        t = self.plant.time_s
        est = self.estimator.estimates() if self.estimator is not None else None
        snap = self.state.snapshot()
        refused = self.refusals.unplaceable(np.asarray(snap.card_last_seen_s, dtype=np.float64), t)
        decision = self.controller.step(snap, t, est, incremental=incremental, refused_failed=refused)
        report = apply_to_plant(decision, self.plant)
        for order in report.refused_placements:  # not in flight: placed again at the next decision
            self.controller.placement_refused(order.job_id, order.cards, t)
        if report.placement_failed_cards:  # as the service's card_failed ack: not placed on again unseen
            dead = np.unique(np.asarray(report.placement_failed_cards, dtype=np.int64))
            # stamped just after t: the readings of t were taken before this decision, so they do not end it
            after = float(np.nextafter(t, math.inf))
            self.refusals.mark_failed(dead, after, t, after, self.controller.control.command_ttl_s)
        self.decisions += 1
        self.last_decision = decision
        self._last_s = t
        self._rewake()
        if self.on_decision is not None:
            self.on_decision(decision, report)
        return decision

    def run(self, duration_s: float, dt_s: float = 1.0) -> None:
        """Step the plant ``duration_s`` in steps of ``dt_s``, deciding every period (and on job events)."""
        end = self.plant.time_s + duration_s
        min_gap = self.controller.control.min_replan_interval_s
        while self.plant.time_s < end - 1e-9:
            self._urgent = self.observe() or self._urgent
            t = self.plant.time_s
            if t >= self._next_s - 1e-9:
                self.decide()
                self._urgent = False
                self._next_s = max(self._next_s + self.period_s, t + 1e-9)
            elif (self._urgent or t >= self._wake_s - 1e-9) and t - self._last_s >= min_gap:
                # a job event, or a checkpoint's end near (either within min_gap of the last decision waits)
                self.decide(incremental=True)
                self._urgent = False
            self.plant.step(min(dt_s, end - self.plant.time_s))
            if self.on_step is not None:
                self.on_step(self.plant)
