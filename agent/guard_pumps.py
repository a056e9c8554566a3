"""The guard's step 3b, pumps (``agent.guard``'s module docstring): :func:`review_pumps` clips the
proposed pump speeds to the site's range and sends to full speed the fail-safe racks and those where
the twin predicts a die over its limit, the rack over its cap or the loop's rise over
``max_delta_t_k`` at the proposed speed; :func:`thermal_at_speeds` gives each card's resistance and
die offset at the speeds that leave, which steps 4-5 and the predictions use (``agent.pumps``). No I/O."""

from __future__ import annotations

import numpy as np

from agent.decision import StepContext
from agent.guard_draft import TOL_W, BoolArray, Draft, FloatArray, GuardSetup, Notes
from agent.load import predict
from agent.pumps import offset_at_speed, r_at_speed

__all__ = ["review_pumps", "thermal_at_speeds"]


def review_pumps(
    gs: GuardSetup,
    proposed: FloatArray | None,
    draft: Draft,
    inlet: FloatArray,
    off: FloatArray,
    measured_caps: FloatArray,
    fs_rack: BoolArray,
    ctx: StepContext,
    notes: Notes,
) -> FloatArray | None:
    """Step 3b (``agent.guard``'s module docstring): the pump speeds that may leave, or None (pumps not
    controlled). ``measured_caps`` are :func:`agent.guard_draft.rack_measured_caps_w`: the prediction
    below includes the extra. An undefined (NaN) speed is full speed; racks sent to full speed for their
    dies, cap or loop rise get a line in ``notes`` (not those only clipped into the site's range, nor
    fail-safe racks). The prediction is ``draft``'s levels, low-power states and limits so far, every busy
    card computing."""
    if proposed is None:
        return None
    site = gs.site
    speed = np.asarray(proposed, dtype=np.float64)
    if speed.shape != (site.n_racks,):
        raise ValueError(f"decision.rack_pump_speed_frac must have one entry per rack ({site.n_racks})")
    speed = np.clip(np.where(np.isfinite(speed), speed, 1.0), site.min_pump_speed_frac(), 1.0)
    speed = np.where(fs_rack, 1.0, speed)
    slow = speed < 1.0
    if not slow.any():
        return speed
    r = r_at_speed(site, ctx.r_total_k_per_w, ctx.rack_flow_full_lpm, speed)
    off = offset_at_speed(site, off, ctx.rack_flow_full_lpm, ctx.rack_pump_speed_frac, speed)
    load, lvl, lp, lim = draft.load, draft.level, draft.low_power, draft.power_limit_w
    worst = predict(site, load, lvl, lp, lim, inlet, r, off, rack_extra_w=ctx.rack_extra_w)
    loop = site.loop
    mcp = ctx.rack_flow_full_lpm * speed / 60_000.0 * loop.density_kg_per_m3 * loop.specific_heat_j_per_kg_k
    bad = (
        (worst.rack_max_die_c > site.card.slowdown_temp_c - gs.control.die_margin_k + 1e-9)
        | (worst.rack_power_w > measured_caps + TOL_W)
        | (worst.rack_power_w / np.maximum(mcp, 1e-9) > loop.max_delta_t_k + 1e-9)
    )
    raised = np.flatnonzero(slow & bad)
    if raised.size:
        names = ", ".join(site.rack_names[r] for r in raised[:8])
        notes.add("pumps_full_speed", f"pumps of {names} at full speed (dies, cap or loop rise at the proposed speed)")
    return np.asarray(np.where(slow & bad, 1.0, speed), dtype=np.float64)


def thermal_at_speeds(
    gs: GuardSetup, speed: FloatArray | None, off: FloatArray, ctx: StepContext
) -> tuple[FloatArray, FloatArray]:
    """Step 3b's consequence (``agent.guard``'s module docstring): each card's resistance and die offset at
    its rack's pump speed that leaves, for steps 4-5 and the predictions (as measured when pumps are not
    controlled)."""
    if speed is None:
        return ctx.r_total_k_per_w, off
    r_eff = r_at_speed(gs.site, ctx.r_total_k_per_w, ctx.rack_flow_full_lpm, speed)
    return r_eff, offset_at_speed(gs.site, off, ctx.rack_flow_full_lpm, ctx.rack_pump_speed_frac, speed)
