"""What the guard's steps share (``agent.guard``, whose module docstring numbers the steps): the
decision under review as they change it (:class:`Draft`), what the agent cannot trust or no command
changes this step (:class:`Sight`), the explanation lines and their actions (:class:`Notes`,
:data:`GUARD_ACTIONS`), what every step reads and none changes (:class:`GuardSetup`), and the racks'
caps in watts (:func:`rack_measured_caps_w`, :func:`rack_modelled_caps_w`, :func:`failsafe_card_limit_w`).
No I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.config import ControlConfig
from agent.decision import PlacementOrder, QueueWait, StepContext
from agent.load import SiteLoad
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "GUARD_ACTIONS",
    "TOL_W",
    "BoolArray",
    "Draft",
    "FloatArray",
    "GuardSetup",
    "IntArray",
    "Notes",
    "Sight",
    "failsafe_card_limit_w",
    "one_level_per_job",
    "rack_measured_caps_w",
    "rack_modelled_caps_w",
]

#: How far over a cap a rack's predicted power may be and still count as within it (rounding).
TOL_W = 1e-6


#: What the guard changed in a decision (``Decision.guard_actions``, ``racktwin_guard_actions_total``),
#: one entry per explanation line it writes, by the steps of ``agent.guard``'s module docstring: (1) placements dropped;
#: (2) level raises limited, the set-point's move limited; (3) fail-safe caps; (3b) pumps sent to full
#: speed; (4) for a rack's cap: jobs slowed (one line for all racks), idle cards to low power, power
#: limits cut to the fail-safe limit, and the cap not held even so (one line each per rack); (5) for
#: the dies: jobs slowed, jobs power-limited at the slowest level, dies not held even at
#: ``min_power_limit_w`` or on cards at the power limits in force (one line each per decision). ``cap_not_held``
#: and ``die_not_held`` mean no lever of the agent is left (alert ``RacktwinGuardCannotHold``).
GUARD_ACTIONS = (
    "placements_dropped",
    "level_raise_limited",
    "setpoint_limited",
    "failsafe_caps",
    "pumps_full_speed",
    "cap_jobs_slowed",
    "cap_idle_to_low_power",
    "cap_power_limited",
    "cap_not_held",
    "die_jobs_slowed",
    "die_power_limited",
    "die_not_held",
)


def rack_measured_caps_w(site: SiteSpec, control: ControlConfig) -> FloatArray:
    """What each rack's PDU may read: its limit minus the margin. Compare with predictions that include
    the rack's unexplained power (``predict(..., rack_extra_w=...)``) and with ``Decision.rack_cap_w``."""
    return np.asarray(site.rack_power_limits_w() - control.rack_margin_w, dtype=np.float64)


def rack_modelled_caps_w(site: SiteSpec, control: ControlConfig, rack_extra_w: FloatArray) -> FloatArray:
    """What the cards and hosts the twin models may draw in each rack: the measured cap minus the power
    the twin does not explain (``StepContext.rack_extra_w``). Compare with predictions without it."""
    return np.asarray(rack_measured_caps_w(site, control) - rack_extra_w, dtype=np.float64)


def failsafe_card_limit_w(site: SiteSpec, control: ControlConfig, rack_extra_w: FloatArray) -> FloatArray:
    """Per rack, the power limit for every card such that all cards at it plus the host overhead stay
    within the rack's cap (floored to a watt, within the card's accepted range)."""
    caps = rack_modelled_caps_w(site, control, rack_extra_w)
    per_card = np.floor((caps - site.rack.host_overhead_w) / site.cards_per_rack)
    return np.asarray(np.clip(per_card, control.min_power_limit_w, site.card.power_limit_w), dtype=np.float64)


class Notes:
    """The guard's explanation lines and, with each, the action it names (:data:`GUARD_ACTIONS`): a line
    and its action are written together (:meth:`add`), so the two records cannot drift apart."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.actions: list[str] = []

    def add(self, action: str, text: str) -> None:
        """The line ``guard: <text>`` for ``action`` (one of :data:`GUARD_ACTIONS`, a ValueError if not)."""
        if action not in GUARD_ACTIONS:
            raise ValueError(f"guard action must be one of {', '.join(GUARD_ACTIONS)}, got {action!r}")
        self.lines.append(f"guard: {text}")
        self.actions.append(action)


@dataclass(frozen=True)
class GuardSetup:
    """What every step of the guard reads and none changes: the site, the control settings, the card's
    power model (its DVFS table), each card's rack and the value of a card-hour (the caps' choice of
    the job to slow, ``agent.load.job_value_per_h``)."""

    site: SiteSpec
    control: ControlConfig
    model: PowerModel
    card_rack: IntArray
    card_hour_value: float

    @classmethod
    def of(cls, site: SiteSpec, control: ControlConfig, card_hour_value: float) -> GuardSetup:
        return cls(site, control, PowerModel.from_card(site.card), site.card_rack(), card_hour_value)


@dataclass(frozen=True)
class Sight:
    """What the agent cannot trust this step (``StepContext``), as masks: fail-safe racks (stale or a
    stuck sensor), cards on blind racks (stale, or frozen as a whole) and cards whose own state is not
    seen (blind racks and stuck cards)."""

    failsafe_rack: BoolArray
    blind_card: BoolArray
    unseen_card: BoolArray
    unplaceable_card: BoolArray  # unseen, or said failed by a refusal no reading confirmed: no placement
    # said failed by a refusal no reading confirmed, read alive: no command reaches it (agent.command_diff)
    unreached_card: BoolArray
    # the cards whose level, power limit or low-power state no command of the decision changes (step 3a):
    # those no command reaches, and those a refusal holds that kind of setting back on (StepContext.held_*)
    level_kept: BoolArray
    limit_kept: BoolArray
    sleep_kept: BoolArray

    @classmethod
    def of(cls, site: SiteSpec, ctx: StepContext, card_rack: IntArray, snap: StateSnapshot) -> Sight:
        failsafe_rack = np.zeros(site.n_racks, dtype=bool)
        failsafe_rack[list(ctx.failsafe_racks)] = True
        unseen = ctx.unseen_card_mask(card_rack)
        alive = ~np.asarray(snap.card_failed, dtype=bool)  # a failed card is budgeted at 0 W anyway

        def mask(cards: tuple[int, ...]) -> BoolArray:
            out = np.zeros(site.n_cards, dtype=bool)
            out[list(cards)] = True
            return np.asarray(out & alive, dtype=np.bool_)

        unreached = mask(ctx.refused_failed_cards)
        return cls(
            failsafe_rack,
            ctx.blind_card_mask(card_rack),
            unseen,
            ctx.unplaceable_card_mask(card_rack),
            unreached,
            unreached | mask(ctx.held_level_cards),
            unreached | mask(ctx.held_limit_cards),
            unreached | mask(ctx.held_sleep_cards),
        )

    def any_kept(self) -> bool:
        """Some card keeps a setting as in force (step 3a)."""
        return bool(self.level_kept.any() or self.limit_kept.any() or self.sleep_kept.any())


@dataclass
class Draft:
    """The decision under review as the guard's steps change it (its arrays are the review's own)."""

    load: SiteLoad  # running jobs and the placements kept (which cards are busy)
    orders: list[PlacementOrder]  # the placements kept
    queue_waits: dict[str, QueueWait]
    level: IntArray
    low_power: BoolArray
    power_limit_w: FloatArray


def one_level_per_job(draft: Draft) -> None:
    """All cards of a job get one level, the slowest of theirs (a job runs at its slowest card's pace)."""
    for j in draft.load.jobs:
        draft.level[j.cards] = int(draft.level[j.cards].max())
