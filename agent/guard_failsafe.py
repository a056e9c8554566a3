"""The guard's step 3, fail-safe racks (``agent.guard``'s module docstring): :func:`apply_failsafe`
gives the cards of racks whose telemetry is stale or has a stuck sensor power limits that hold the
rack's cap (:func:`agent.guard_draft.failsafe_card_limit_w`, or :func:`failsafe_beside_kept` where
some cards keep the limit in force), the slowest level (or no faster than in force) on blind racks,
and keeps the low-power state of the idle cards the agent cannot see. No I/O."""

from __future__ import annotations

import numpy as np

from agent.decision import StepContext
from agent.guard_draft import (
    BoolArray,
    Draft,
    FloatArray,
    GuardSetup,
    IntArray,
    Notes,
    Sight,
    one_level_per_job,
    rack_modelled_caps_w,
)
from agent.guard_in_force import kept_limits_w
from twin.state import StateSnapshot

__all__ = ["apply_failsafe", "failsafe_beside_kept"]


def apply_failsafe(
    gs: GuardSetup,
    draft: Draft,
    snap: StateSnapshot,
    snap_lp: BoolArray,
    in_force_lv: IntArray,
    sight: Sight,
    fs_lim: FloatArray,
    stuck_cards: tuple[int, ...],
    notes: Notes,
) -> None:
    """Step 3 (``agent.guard``'s module docstring), fail-safe racks (stale telemetry or a stuck sensor):
    every card's power limit becomes the lowest of the proposed one, the one it reports and its rack's
    fail-safe limit ``fs_lim`` (:func:`agent.guard_draft.failsafe_card_limit_w`, less beside cards no
    command reaches: :func:`failsafe_beside_kept`; caps are never raised); cards on blind racks and every
    job touching them get the slowest level (``failsafe_lowest_level``; otherwise no faster than the level
    in force, ``in_force_lv``, :func:`agent.guard_in_force.kept_levels`, their jobs following them); idle
    cards the agent cannot see keep the low-power state they last reported."""
    site, cfg = gs.site, gs.control
    card_rack = gs.card_rack
    fs_rack, blind_card = sight.failsafe_rack, sight.blind_card
    slowest = gs.model.n_levels - 1
    max_lim = site.card.power_limit_w
    snap_lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
    snap_lim = np.where(np.isfinite(snap_lim), snap_lim, max_lim)
    cap_now = np.minimum(np.minimum(draft.power_limit_w, snap_lim), fs_lim[card_rack])
    draft.power_limit_w = np.where(fs_rack[card_rack], np.maximum(cap_now, cfg.min_power_limit_w), draft.power_limit_w)
    if cfg.failsafe_lowest_level:
        draft.level[blind_card] = slowest
        for j in draft.load.jobs:
            if blind_card[j.cards].any():
                draft.level[j.cards] = slowest
    else:  # blind cards no faster than they run (not slowed to an older reading); their jobs follow them
        draft.level = np.where(blind_card, np.maximum(draft.level, in_force_lv), draft.level)
        one_level_per_job(draft)
    # neither woken nor put to sleep: not seen
    draft.low_power = np.where(sight.unseen_card & draft.load.idle, snap_lp, draft.low_power)
    names = ", ".join(site.rack_names[r] for r in np.flatnonzero(fs_rack))
    stuck = f" (stuck sensor: card {', '.join(str(c) for c in stuck_cards[:4])})" if stuck_cards else ""
    notes.add("failsafe_caps", f"fail-safe caps ({fs_lim[fs_rack].min():.0f} W per card) on {names}{stuck}")


def failsafe_beside_kept(
    gs: GuardSetup, fs_lim: FloatArray, snap: StateSnapshot, kept: BoolArray, ctx: StepContext
) -> FloatArray:
    """Per rack, the fail-safe power limit (steps 3 and 4) for its cards that commands reach when ``kept``
    cards (no command reaches them, step 3a) keep the limits in force
    (:func:`agent.guard_in_force.kept_limits_w`): what those leave of the rack's cap shared among the
    others (floored to a watt, within the card's accepted range), never above ``fs_lim``
    (:func:`agent.guard_draft.failsafe_card_limit_w`, every card at it). All the rack's cards at their
    limits then stay within its cap, as without such cards, unless the others would need less than
    ``min_power_limit_w``."""
    site, cfg = gs.site, gs.control
    rack = gs.card_rack[kept]
    kept_w = np.bincount(rack, weights=kept_limits_w(gs, snap, ctx)[kept], minlength=site.n_racks)
    others = site.cards_per_rack - np.bincount(rack, minlength=site.n_racks)
    left_w = rack_modelled_caps_w(site, cfg, ctx.rack_extra_w) - site.rack.host_overhead_w - kept_w
    per_card = np.floor(left_w / np.maximum(others, 1))
    per_card = np.clip(per_card, cfg.min_power_limit_w, site.card.power_limit_w)
    return np.asarray(np.minimum(fs_lim, per_card), dtype=np.float64)
