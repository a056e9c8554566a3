"""The guard's step 2, rate limits (``agent.guard``'s module docstring): :func:`limit_level_raises`
(a card's level rises by at most ``max_level_raise_per_period`` from the level in force, all cards of
a job at one level), :func:`limit_setpoint` (the supply set-point moves by at most
``max_setpoint_step_k``) and :func:`hold_low_power` (an idle card's low-power state is held for
``low_power_hold_s`` after it changed). No I/O."""

from __future__ import annotations

import math

import numpy as np

from agent.guard_draft import BoolArray, Draft, FloatArray, GuardSetup, IntArray, Notes, one_level_per_job

__all__ = ["hold_low_power", "limit_level_raises", "limit_setpoint"]


def limit_level_raises(gs: GuardSetup, draft: Draft, in_force_lv: IntArray, notes: Notes) -> None:
    """Step 2 (``agent.guard``'s module docstring), rate limits on levels: a card's level rises (toward
    faster clocks) by at most ``max_level_raise_per_period`` from the level in force (``in_force_lv``,
    :func:`agent.guard_in_force.kept_levels`: as reported, or the faster one its rack confirmed since,
    from which the commands' diff counts); then all cards of a job get one level, the slowest any of them
    has."""
    step = gs.control.max_level_raise_per_period
    cur = in_force_lv
    limited = draft.level < cur - step
    if limited[draft.load.busy].any():
        notes.add("level_raise_limited", f"level raises limited to {step} per decision")
    draft.level = np.maximum(draft.level, cur - step)
    one_level_per_job(draft)


def limit_setpoint(gs: GuardSetup, wanted_c: float, current_c: float, notes: Notes) -> float:
    """Step 2 (``agent.guard``'s module docstring), set-point: the proposed supply set-point (the one in
    force if it is undefined; the site's design set-point if that is unknown too) within the site's
    options, moved by at most ``max_setpoint_step_k`` from the one in force (when that is known)."""
    opts = gs.site.facility.supply_temp_options_c
    lo, hi = min(opts), max(opts)
    if math.isfinite(wanted_c):
        target = wanted_c
    else:  # never an undefined set-point: every prediction below would be NaN and hold no cap
        target = current_c if math.isfinite(current_c) else gs.site.facility.supply_temp_c
    target = min(max(target, lo), hi)
    step = gs.control.max_setpoint_step_k
    if math.isfinite(current_c) and abs(target - current_c) > step + 1e-9:
        limited = current_c + math.copysign(step, target - current_c)
        notes.add("setpoint_limited", f"set-point move {current_c:g} -> {target:g} deg C limited to {limited:g}")
        target = min(max(limited, lo), hi)
    return float(target)


def hold_low_power(gs: GuardSetup, draft: Draft, snap_lp: BoolArray, now_s: float, toggle_s: FloatArray) -> None:
    """Step 2 (``agent.guard``'s module docstring), no flapping: an idle card whose low-power state changed
    less than ``low_power_hold_s`` ago (``toggle_s``: when it last changed as telemetry showed it, which
    the guard notes, ``agent.guard.Guard``) keeps the state it reports."""
    change = draft.load.idle & (draft.low_power != snap_lp)
    held = change & (now_s - toggle_s < gs.control.low_power_hold_s)
    draft.low_power[held] = snap_lp[held]
