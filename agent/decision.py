"""What one control step decides (:class:`Decision`) and what it decides from (:class:`StepContext`).

A :class:`Decision` is plain data: per card the DVFS level, low-power idle or awake, and the power
limit (the fail-safe cap); the coolant supply set-point; per rack the loop pump's speed; where queued
jobs go; how the plan was made (status, source, solve time); what the twin predicts for it; and a
human explanation. The controller proposes one, the guard reviews it (``guarded=True``), the
service journals and sends it, and ``agent.loop.apply_to_plant`` applies it to an in-process
``twin.plant.Plant``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.load import SiteLoad, SiteLoads, site_load
from models.plans import CyclePlan
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["QUEUE_WAIT_KINDS", "Decision", "PlacementOrder", "QueueWait", "StepContext", "fell_back"]

#: Decision statuses, worst first: a rack at fail-safe caps, no plan meets the caps, the greedy
#: plan, a MILP plan stopped at its time limit, the last plan adjusted to job events without a
#: solve, an optimal MILP plan.
STATUSES = ("failsafe", "infeasible", "fallback", "feasible", "incremental", "optimal")


def fell_back(plan_status: str, source: str) -> bool:
    """Whether a decision's own solve was late, failed or infeasible (the greedy plan, relaxed racks,
    held settings): ``racktwin evaluate``'s and ``racktwin demo``'s ``fallbacks``. An incremental
    adjustment to job events makes no solve: it carries the plan status of the plan it adjusts and is
    not a fallback of its own (it was counted again after every job event that followed one)."""
    return source != "incremental" and plan_status not in ("optimal", "feasible")


_SUMMARY_QUEUE_WAITS = 16  # queued jobs whose wait the summary explains one by one (all are counted)


#: Why a queued job stays queued after a decision (:class:`QueueWait`): it holds the EASY
#: reservation (``agent.backfill``); another job holds it and this one would delay it; the placement
#: found no window of racks for it; it needs more cards than the site has; the agent does not know
#: how many cards it needs (no ``submitted`` event with its spec was seen); the placement failed; the
#: guard dropped its placement (cards not free, not seen, or said failed by a refusal).
QUEUE_WAIT_KINDS = (
    "reservation",
    "behind_reservation",
    "no_window",
    "too_large",
    "no_spec",
    "placement_error",
    "placement_dropped",
)


@dataclass(frozen=True)
class QueueWait:
    """Why one queued job stays queued after a decision."""

    kind: str  # one of QUEUE_WAIT_KINDS
    why: str  # for people: the placement's reason, the reservation's holder ...
    expected_start_s: float = float("nan")  # "reservation": the promised start (site s; <= now: the site drains)

    def __post_init__(self) -> None:
        if self.kind not in QUEUE_WAIT_KINDS:
            raise ValueError(f"QueueWait.kind must be one of {', '.join(QUEUE_WAIT_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class PlacementOrder:
    """Place queued job ``job_id`` on ``cards`` (site card indices)."""

    job_id: str
    cards: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class StepContext:
    """Everything a step needs besides the snapshot, computed once per step (cheap, on the caller's
    thread) and shared by the controller's proposal and the guard's review."""

    now_s: float
    cycle: int
    stale_racks: tuple[int, ...]  # telemetry older than the deadline
    stuck_racks: tuple[int, ...]  # the whole rack's readings (its cards' or its loop's) frozen
    stuck_cards: tuple[int, ...]  # one card's readings frozen while the rest of its rack changes
    # racks the agent cannot see: stale, stuck as a whole, or released from that too recently; their
    # cards and every job touching them run at the slowest level, nothing is placed on them
    blind_racks: tuple[int, ...]
    # racks at fail-safe caps: the blind ones and those with a stuck card (or released from either
    # too recently); a rack with only a stuck card keeps its levels and placements (not the card's)
    failsafe_racks: tuple[int, ...]
    setpoint_c: float  # supply set-point in force
    ambient_c: float
    card_inlet_c: FloatArray  # per card: its rack's measured supply (set-point where unknown)
    r_total_k_per_w: FloatArray  # per card: die-to-inlet resistance, pump at full speed (calibrated where confident)
    die_offset_k: FloatArray  # per card: measured persistent die excess over the twin (agent.offsets), >= 0
    rack_extra_w: FloatArray  # per rack: measured power the twin does not explain (>= 0)
    rack_flow_full_lpm: FloatArray  # per rack: the flow its pump gives at full speed now (agent.pumps)
    rack_pump_speed_frac: FloatArray  # per rack: the pump speed in force (as the CDU reports it)
    choose_setpoint: bool  # the set-point is re-optimized this step
    solver_time_limit_s: float  # wall seconds the solve may take
    # cards a ``card_failed`` refusal says failed and no reading has confirmed (a mark no reading at least
    # as new as the refusal has cleared, or a repeat's hold: agent.command_overlays.Overlays.unplaceable):
    # kept out of placement (and so out of the ready reserve: agent.planning.cycle_problem, and out of the
    # cards a free host holds for the hosts' reserve: Controller.with_hosts); the budget, levels,
    # low-power idle and hosts' power see them as their readings say (a card a stale scheduler calls
    # failed while its rack reads it alive draws power; an idle one keeps the low-power state in force,
    # as no command reaches it: the guard's step 3a)
    refused_failed_cards: tuple[int, ...] = ()
    # cards a refusal of a setting of theirs holds that kind back on (``command_ttl_s`` from the refusal,
    # ``agent.command_overlays.Overlays.held_back``): the decision's commands carry no level, power limit
    # or low-power idle / wake to them (``agent.command_diff``), so the guard keeps that setting as in
    # force (its step 3a: as reported, or as confirmed below); their other settings are sent as usual.
    # The service reads these four again after the proposal (``Controller.with_refusals``): the guard
    # sees the refusals acked during the solve
    held_level_cards: tuple[int, ...] = ()
    held_limit_cards: tuple[int, ...] = ()
    held_sleep_cards: tuple[int, ...] = ()
    # per card: the DVFS level, the power limit and the low-power state its rack confirmed applying (its
    # retained applied state, ``agent.ingest.Ingest.applied_level``, ``applied_power_limit_w`` and
    # ``applied_low_power``, 1.0 asleep / 0.0 awake; -1 / NaN / NaN: none confirmed; None: none for any
    # card, as in the in-process loop). Telemetry shows a setting the rack applied up to one telemetry
    # period later: the guard keeps a card its step 3a keeps at the faster level and the higher limit of
    # the two, and an idle one awake where either says awake (what draws more). The service sets them
    # with the refusals before the review
    applied_level: IntArray | None = None
    applied_power_limit_w: FloatArray | None = None
    applied_low_power: FloatArray | None = None
    # the loads of the step's snapshot (``agent.load.SiteLoads``: each set of placements built once);
    # None: every caller builds its own (``site_load``)
    loads: SiteLoads | None = None

    def load_of(
        self, site: SiteSpec, snap: StateSnapshot, placements: Sequence[tuple[str, Sequence[int] | IntArray]] = ()
    ) -> SiteLoad:
        """``agent.load.site_load(site, snap, placements)``, from :attr:`loads` when it holds ``snap``."""
        if self.loads is not None and self.loads.site is site:
            return self.loads.of(snap, placements)
        return site_load(site, snap, placements)

    def blind_card_mask(self, card_rack: IntArray) -> BoolArray:
        """Per card (``card_rack``: each card's rack): its rack is blind."""
        return np.isin(card_rack, np.asarray(self.blind_racks, dtype=np.int64))

    def unseen_card_mask(self, card_rack: IntArray) -> BoolArray:
        """Per card: its own state is not seen (its rack is blind or its sensor stuck): never placed
        on, woken or put to sleep (an idle one keeps the low-power state it last reported; the
        controller proposes that and ``agent.guard`` enforces it)."""
        unseen = self.blind_card_mask(card_rack)
        unseen[list(self.stuck_cards)] = True
        return unseen

    def unplaceable_card_mask(self, card_rack: IntArray) -> BoolArray:
        """Per card: no job is placed on it: its own state is not seen (:meth:`unseen_card_mask`) or a
        ``card_failed`` refusal says it failed and no reading has confirmed it (``refused_failed_cards``;
        counted alive everywhere else)."""
        out = self.unseen_card_mask(card_rack)
        out[list(self.refused_failed_cards)] = True
        return out


@dataclass(frozen=True, eq=False)
class Decision:
    """One control step's decision (see the module docstring). Arrays are per card or per rack."""

    cycle: int
    time_s: float  # site time it was made at
    card_level: IntArray
    card_low_power: BoolArray
    card_power_limit_w: FloatArray
    card_failed: BoolArray  # never commanded
    card_busy: BoolArray  # runs (or is being given) a job
    supply_temp_c: float
    placements: tuple[PlacementOrder, ...]
    status: str  # see STATUSES
    plan_status: str  # the models' SolveStatus value
    source: str  # "milp", "greedy", "incremental" or "hold"
    solve_time_s: float
    failsafe_racks: tuple[int, ...]
    rack_cap_w: FloatArray  # limit - margin
    predicted_rack_power_w: FloatArray  # the twin (+ measured extra), jobs in their current phases
    budget_rack_power_w: FloatArray  # the same with every busy card computing: kept <= rack_cap_w
    predicted_rack_max_die_c: FloatArray
    predicted_it_power_w: float
    predicted_facility_power_w: float
    predicted_pue: float
    max_power_limit_w: float = float("inf")  # the card's own (default) power limit
    job_levels: dict[str, int] = field(default_factory=dict)
    explanation: tuple[str, ...] = ()
    # what the guard changed: one entry per explanation line it wrote (agent.guard.GUARD_ACTIONS), all of
    # them even where the explanation keeps only its first lines; () when it changed nothing or is not guarded
    guard_actions: tuple[str, ...] = ()
    guarded: bool = False
    choose_setpoint: bool = False
    # per rack: the loop pump's speed (fraction of nominal); None: pumps are not controlled
    rack_pump_speed_frac: FloatArray | None = None
    # per host (site.card_host()): the host should be powered off; None: hosts are not managed
    host_off: BoolArray | None = None
    # job id -> why it stays queued, for every queued job this decision considered and did not place
    queue_waits: dict[str, QueueWait] = field(default_factory=dict)
    plan: CyclePlan | None = None  # the models' plan (warm start for the next step; not journaled)

    def replace(self, **changes: Any) -> Decision:
        return dataclasses.replace(self, **changes)

    def queue_wait_counts(self) -> dict[str, int]:
        """How many queued jobs wait for each reason (``queue_waits`` by kind; kinds with none left out)."""
        return dict(Counter(w.kind for w in self.queue_waits.values()))

    def guard_action_counts(self) -> dict[str, int]:
        """How many times the guard took each action (``guard_actions`` counted, in the order first
        taken; actions it did not take left out): the summary's ``guard_actions``."""
        return dict(Counter(self.guard_actions))

    @property
    def n_cards(self) -> int:
        return int(self.card_level.shape[0])

    def summary(self, rack_names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """A compact JSON-able account (for the journal, logs and advice). ``guard_actions``: what the
        guard changed, per action of ``agent.guard.GUARD_ACTIONS`` the number of times it took it (only
        those it took; ``{}`` where it changed nothing), all of them where ``explanation`` keeps only the
        guard's first 12 lines. Journals written before it have summaries without the key."""
        names = rack_names or tuple(f"r{i}" for i in range(self.rack_cap_w.shape[0]))
        alive = ~self.card_failed
        levels = Counter(int(x) for x in self.card_level[alive & self.card_busy])
        return {
            "cycle": self.cycle,
            "time_s": self.time_s,
            "status": self.status,
            "plan_status": self.plan_status,
            "source": self.source,
            "solve_time_s": round(self.solve_time_s, 6),
            "supply_temp_c": self.supply_temp_c,
            "pump_speed_pct": (
                None
                if self.rack_pump_speed_frac is None
                else [round(100 * float(x), 1) for x in self.rack_pump_speed_frac]
            ),
            "failsafe_racks": [names[r] for r in self.failsafe_racks],
            "busy_cards": int((alive & self.card_busy).sum()),
            "low_power_cards": int((alive & self.card_low_power).sum()),
            "hosts_off": None if self.host_off is None else int(self.host_off.sum()),
            "busy_levels": {str(k): v for k, v in sorted(levels.items())},
            "capped_cards": int((alive & (self.card_power_limit_w < self.max_power_limit_w - 1e-6)).sum()),
            "placements": {p.job_id: list(p.cards) for p in self.placements},
            "queue_waits": {
                jid: w.kind + ": " + w.why for jid, w in list(self.queue_waits.items())[:_SUMMARY_QUEUE_WAITS]
            },
            "queue_waits_by_kind": self.queue_wait_counts(),
            "predicted_rack_power_w": [round(float(x), 1) for x in self.predicted_rack_power_w],
            "budget_rack_power_w": [round(float(x), 1) for x in self.budget_rack_power_w],
            "rack_cap_w": [round(float(x), 1) for x in self.rack_cap_w],
            "predicted_it_power_w": round(self.predicted_it_power_w, 1),
            "predicted_facility_power_w": round(self.predicted_facility_power_w, 1),
            "predicted_pue": round(self.predicted_pue, 5),
            "explanation": list(self.explanation),
            "guard_actions": self.guard_action_counts(),
        }
