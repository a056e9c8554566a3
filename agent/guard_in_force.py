"""The guard's step 3a, settings no command changes (``agent.guard``'s module docstring), and the
settings *in force* that steps 2-5 count from: :func:`kept_levels`, :func:`kept_limits_w` and
:func:`kept_low_power` (as telemetry reports them or, where the card's rack confirmed applying a faster
level, a higher limit or a wake, the confirmed one); :func:`keep_in_force` keeps them on the cards no
command reaches or a refusal holds a setting back on; :func:`job_level` is a job's level as the
decision states it. No I/O."""

from __future__ import annotations

import numpy as np

from agent.decision import StepContext
from agent.guard_draft import BoolArray, Draft, FloatArray, GuardSetup, IntArray, Sight
from twin.state import StateSnapshot

__all__ = ["job_level", "keep_in_force", "kept_levels", "kept_limits_w", "kept_low_power"]


def keep_in_force(
    gs: GuardSetup, draft: Draft, snap: StateSnapshot, snap_lp: BoolArray, sight: Sight, ctx: StepContext
) -> None:
    """Step 3a (``agent.guard``'s module docstring), settings no command of the decision changes:
    ``agent.command_diff`` sends no level, power limit, sleep or wake to a card a ``card_failed`` refusal
    says failed, no reading having confirmed it (``StepContext.refused_failed_cards``; its rack reads it
    alive), and none of a kind a refusal holds back on a card (``StepContext.held_level_cards``,
    ``held_limit_cards``, ``held_sleep_cards``). Such a card keeps its level (``sight.level_kept``; a busy
    one too: its job's other cards get the job's level) and its power limit (``sight.limit_kept``) as in
    force (:func:`kept_levels`, :func:`kept_limits_w`: as reported, or as its rack confirmed where that
    draws more), and an idle one its low-power state in force (``sight.sleep_kept``: neither woken nor put
    to sleep; :func:`kept_low_power`); its other settings are the decision's."""
    draft.level = np.where(sight.level_kept, kept_levels(gs, snap, ctx), draft.level)
    draft.power_limit_w = np.where(sight.limit_kept, kept_limits_w(gs, snap, ctx), draft.power_limit_w)
    draft.low_power = np.where(sight.sleep_kept & draft.load.idle, kept_low_power(snap_lp, ctx), draft.low_power)


def kept_levels(gs: GuardSetup, snap: StateSnapshot, ctx: StepContext) -> IntArray:
    """Each card's level in force, as step 3a keeps it and steps 2 and 3 count from it: the faster
    (level 0 is the fastest) of the one telemetry reports and the one its rack confirmed applying
    (``ctx.applied_level``, -1: none; the commands' diff counts from it, ``agent.command_diff``):
    telemetry shows a raise the rack applied up to one telemetry period later, and the card runs at
    the faster level meanwhile."""
    reported = _reported_levels(gs, snap)
    if ctx.applied_level is None:
        return reported
    confirmed = np.asarray(ctx.applied_level, dtype=np.int64)
    faster = np.minimum(reported, np.clip(confirmed, 0, gs.model.n_levels - 1))
    return np.asarray(np.where(confirmed >= 0, faster, reported), dtype=np.int64)


def kept_limits_w(gs: GuardSetup, snap: StateSnapshot, ctx: StepContext) -> FloatArray:
    """Each card's power limit as step 3a keeps it: the higher of the one telemetry reports
    (:func:`_reported_limits_w`) and the one its rack confirmed applying (``ctx.applied_power_limit_w``,
    NaN: none), as :func:`kept_levels`."""
    reported = _reported_limits_w(gs, snap)
    if ctx.applied_power_limit_w is None:
        return reported
    confirmed = np.asarray(ctx.applied_power_limit_w, dtype=np.float64)
    return np.asarray(np.where(np.isfinite(confirmed), np.fmax(reported, confirmed), reported), dtype=np.float64)


def kept_low_power(snap_lp: BoolArray, ctx: StepContext) -> BoolArray:
    """Each card's low-power state as step 3a keeps it: asleep only where telemetry reports it asleep
    (``snap_lp``) and its rack did not confirm it awake (``ctx.applied_low_power`` 0.0; NaN: none), as
    :func:`kept_levels`: telemetry shows a wake the rack applied up to one telemetry period later, and
    the card draws awake meanwhile (where its rack confirmed a sleep telemetry does not show, awake too)."""
    if ctx.applied_low_power is None:
        return snap_lp
    return np.asarray(snap_lp & (np.asarray(ctx.applied_low_power, dtype=np.float64) != 0.0), dtype=np.bool_)


def job_level(lvl: IntArray, cards: IntArray, level_kept: BoolArray) -> int:
    """A job's level: the one its cards whose level commands set share (a card ``level_kept`` keeps
    the level in force, step 3a); the slowest of its cards' when commands set none's."""
    reached = cards[~level_kept[cards]]
    return int(lvl[reached if reached.size else cards].max())


def _reported_levels(gs: GuardSetup, snap: StateSnapshot) -> IntArray:
    """Each card's level as telemetry reports it, within the DVFS table."""
    return np.clip(np.asarray(snap.card_level, dtype=np.int64), 0, gs.model.n_levels - 1)


def _reported_limits_w(gs: GuardSetup, snap: StateSnapshot) -> FloatArray:
    """Each card's power limit as telemetry reports it (an undefined one: the card's largest)."""
    snap_lim = np.asarray(snap.card_power_limit_w, dtype=np.float64)
    return np.asarray(np.where(np.isfinite(snap_lim), snap_lim, gs.site.card.power_limit_w), dtype=np.float64)
