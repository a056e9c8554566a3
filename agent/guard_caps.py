"""The guard's step 4, caps (``agent.guard``'s module docstring), and the power tables steps 4-5 predict
with: :func:`power_table_w` (every card's steady power at every level, busy cards computing),
:func:`low_power_w` (at low-power idle), :func:`card_power_w` (at given settings).

:func:`enforce_caps` takes, for each rack predicted over its cap and while it still is, the levers in
order: as few awake idle cards it can see as the cap needs go to low-power idle (:func:`_sleep_idle_for_cap`:
a sleep loses no work now), then the jobs whose next slower level gives up the least value per watt
saved step down (:func:`_slow_jobs_for_cap`, :func:`_cheapest_step`) and the cards put to sleep that the
slowing made room for stay awake after all (:meth:`_Slept.wake_unneeded`), then the rack's cards get the fail-safe
power limit, or the rack is said not held (:func:`_limit_power_for_cap`). No I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.guard_draft import (
    TOL_W,
    BoolArray,
    Draft,
    FloatArray,
    GuardSetup,
    IntArray,
    Notes,
    Sight,
    rack_measured_caps_w,
)
from agent.load import SiteLoad, job_value_per_h
from twin.steady import card_steady_power_w
from twin.workload import compute_utilization

__all__ = ["card_power_w", "enforce_caps", "low_power_w", "power_table_w"]


@dataclass
class _CapBudget:
    """Step 4's working state (:func:`enforce_caps`): the levels, low-power states and power
    limits as the caps change them (copies of the draft's), each card's predicted power and each
    rack's (its cards plus its hosts), kept up to date as each lever is taken."""

    level: IntArray
    low_power: BoolArray
    power_limit_w: FloatArray
    power_w: FloatArray
    rack_w: FloatArray

    def over(self, r: int, modelled_caps: FloatArray) -> bool:
        """Rack ``r`` is predicted over its cap (``modelled_caps``,
        :func:`agent.guard_draft.rack_modelled_caps_w`)."""
        return bool(self.rack_w[r] > modelled_caps[r] + TOL_W)


def power_table_w(
    gs: GuardSetup, load: SiteLoad, inlet: FloatArray, r_total: FloatArray, off: FloatArray
) -> FloatArray:
    """Steady power of every card at every level when awake: busy cards computing (the job's
    utilization at that clock), idle cards at u = 0; leakage includes the measured die offset."""
    site, model = gs.site, gs.model
    n, n_lv = site.n_cards, model.n_levels
    cs = np.zeros(n)
    ncu = np.zeros(n)
    for j in load.jobs:
        cs[j.cards] = j.spec.compute_share
        ncu[j.cards] = j.spec.noncompute_utilization
    clocks = model.clocks_mhz
    rel = clocks / clocks[0]
    u = np.where(load.busy[:, None], compute_utilization(cs[:, None], rel[None, :], ncu[:, None]), 0.0)
    levels = np.broadcast_to(np.arange(n_lv, dtype=np.int64)[None, :], (n, n_lv))
    p, _die = card_steady_power_w(model, levels, u, np.zeros((n, n_lv), dtype=bool), inlet[:, None], r_total[:, None])
    return np.asarray(p + model.leak_w_per_k[None, :] * off[:, None], dtype=np.float64)


def low_power_w(gs: GuardSetup, inlet: FloatArray, r_total: FloatArray, off: FloatArray) -> FloatArray:
    """Steady power of every card at low-power idle; leakage includes the measured die offset."""
    model = gs.model
    n = gs.site.n_cards
    p, _ = card_steady_power_w(model, np.zeros(n, dtype=np.int64), np.zeros(n), np.ones(n, dtype=bool), inlet, r_total)
    return np.asarray(p + model.low_power_leak_w_per_k * off, dtype=np.float64)


def card_power_w(
    table: FloatArray, lp_w: FloatArray, lvl: IntArray, lp: BoolArray, lim: FloatArray, failed: BoolArray
) -> FloatArray:
    """Each card's power at level ``lvl`` held to ``lim`` (``table``), at low-power idle where ``lp``
    (``lp_w``), 0 W where ``failed``."""
    awake = np.minimum(table[np.arange(lvl.size), lvl], lim)
    return np.asarray(np.where(failed, 0.0, np.where(lp, lp_w, awake)), dtype=np.float64)


def enforce_caps(
    gs: GuardSetup,
    draft: Draft,
    table: FloatArray,
    lp_w: FloatArray,
    modelled_caps: FloatArray,
    fs_lim: FloatArray,
    failed: BoolArray,
    notes: Notes,
    *,
    unseen: BoolArray,
    sight: Sight,
) -> None:
    """Step 4 (``agent.guard``'s module docstring), caps: ``draft``'s levels, low-power states and power
    limits such that every rack's predicted power (``table``: every busy card computing) stays within
    ``modelled_caps``. ``unseen``: the cards the agent cannot see (never put to sleep); ``sight``'s
    ``level_kept``, ``sleep_kept`` and ``limit_kept``: the cards whose level, low-power state or power
    limit no command changes (step 3a: no lever changes that setting, their power counts at it as in
    force). Each rack over its cap, in turn, takes the levers in the docstring's order while it is still
    over: :func:`_sleep_idle_for_cap`, :func:`_slow_jobs_for_cap` (then the idle cards the slowing made
    room for stay awake after all, :meth:`_Slept.wake_unneeded`), :func:`_limit_power_for_cap`."""
    site = gs.site
    lp = draft.low_power & ~draft.load.busy
    power = card_power_w(table, lp_w, draft.level, lp, draft.power_limit_w, failed)
    rack_p = np.bincount(gs.card_rack, weights=power, minlength=site.n_racks) + site.rack.host_overhead_w
    over = np.flatnonzero(rack_p > modelled_caps + TOL_W)
    if over.size == 0:
        draft.low_power = lp
        return
    b = _CapBudget(draft.level.copy(), lp.copy(), draft.power_limit_w.copy(), power, np.asarray(rack_p, np.float64))
    jobs_in_rack = _jobs_by_rack(gs, draft.load)
    lowered: dict[str, int] = {}
    for r_over in over:
        r = int(r_over)
        jobs = jobs_in_rack.get(r, [])
        slept = _sleep_idle_for_cap(gs, r, b, draft.load, lp_w, modelled_caps, unseen | sight.sleep_kept)
        if b.over(r, modelled_caps):
            _slow_jobs_for_cap(gs, r, b, draft.load, jobs, table, modelled_caps, lowered, sight.level_kept)
            slept.wake_unneeded(r, b, lp_w, modelled_caps)
        slept.note(gs, r, notes)
        if b.over(r, modelled_caps):
            _limit_power_for_cap(gs, r, b, draft.load, table, lp_w, modelled_caps, fs_lim, failed, sight, notes)
    if lowered:
        items = ", ".join(f"{k} -> {v}" for k, v in list(lowered.items())[:6])
        more = f" and {len(lowered) - 6} more" if len(lowered) > 6 else ""
        notes.add("cap_jobs_slowed", f"slowed job(s) {items}{more} to keep racks under their caps (worst-case phases)")
    draft.level, draft.low_power, draft.power_limit_w = b.level, b.low_power, b.power_limit_w


def _jobs_by_rack(gs: GuardSetup, load: SiteLoad) -> dict[int, list[int]]:
    """The indices (in ``load.jobs``) of the jobs with a card in each rack, in ``load.jobs``' order."""
    card_rack = gs.card_rack
    jobs_in_rack: dict[int, list[int]] = {}
    for ji, j in enumerate(load.jobs):
        for r in np.unique(card_rack[j.cards]):
            jobs_in_rack.setdefault(int(r), []).append(ji)
    return jobs_in_rack


def _slow_jobs_for_cap(
    gs: GuardSetup,
    r: int,
    b: _CapBudget,
    load: SiteLoad,
    jobs: list[int],
    table: FloatArray,
    modelled_caps: FloatArray,
    lowered: dict[str, int],
    level_kept: BoolArray,
) -> None:
    """Step 4's second lever (``agent.guard``'s module docstring): while rack ``r`` is over its cap with its
    idle cards asleep (:func:`_sleep_idle_for_cap`), the job of ``jobs`` (those with a card in it) whose
    next slower level gives up the least value per watt saved in the rack (:func:`_cheapest_step`) steps
    down, all its cards (on every rack) whose level commands set (not ``level_kept``: those keep the
    level in force, step 3a); until none can. ``lowered`` gets each job slowed and its new level."""
    while b.over(r, modelled_caps):
        step = _cheapest_step(gs, r, b, load, jobs, table, level_kept)
        if step is None:
            break
        ji, k2 = step
        j = load.jobs[ji]
        cards = j.cards[~level_kept[j.cards]]
        before = b.power_w[cards].copy()
        b.level[cards] = k2
        b.power_w[cards] = np.minimum(table[cards, k2], b.power_limit_w[cards])
        np.add.at(b.rack_w, gs.card_rack[cards], b.power_w[cards] - before)
        lowered[j.job_id] = k2


def _cheapest_step(
    gs: GuardSetup, r: int, b: _CapBudget, load: SiteLoad, jobs: list[int], table: FloatArray, level_kept: BoolArray
) -> tuple[int, int] | None:
    """The step down that gives up the least value per watt saved in rack ``r``: (job index, new
    level), each job judged at its first slower level that saves power in the rack (levels sharing a
    voltage may not) on its cards whose level commands set (not ``level_kept``: those keep their power);
    None when every job of ``jobs`` is at the slowest level or no step saves."""
    site = gs.site
    card_rack = gs.card_rack
    slowest = gs.model.n_levels - 1
    lvl, lim = b.level, b.power_limit_w
    best: tuple[float, int, int] | None = None
    for ji in jobs:
        j = load.jobs[ji]
        cards = j.cards[~level_kept[j.cards]]
        if cards.size == 0:
            continue
        k = int(lvl[cards[0]])
        if k >= slowest:
            continue
        in_r = cards[card_rack[cards] == r]
        now_w = float(np.minimum(table[in_r, k], lim[in_r]).sum())
        # the next level that saves power in this rack (levels sharing a voltage may not)
        for k2 in range(k + 1, slowest + 1):
            saved = now_w - float(np.minimum(table[in_r, k2], lim[in_r]).sum())
            if saved > 1e-9:
                lost = job_value_per_h(site, j, k, gs.card_hour_value) - job_value_per_h(
                    site, j, k2, gs.card_hour_value
                )
                score = max(lost, 0.0) / saved
                if best is None or score < best[0]:
                    best = (score, ji, k2)
                break
    if best is None:
        return None
    _score, ji, k2 = best
    return ji, k2


@dataclass
class _Slept:
    """The awake idle cards of one rack :func:`_sleep_idle_for_cap` put to low-power idle (``cards``, most
    saved first; ``awake_w``: each one's power awake) out of ``n_awake`` it could have."""

    cards: IntArray
    awake_w: FloatArray
    n_awake: int

    def wake_unneeded(self, r: int, b: _CapBudget, lp_w: FloatArray, modelled_caps: FloatArray) -> None:
        """After the rack's jobs slowed (a step may save more than the cap needs): the cards put to
        sleep stay awake after all, those that save the least first, while rack ``r`` stays under its
        cap."""
        keep = self.cards.size
        for i in range(self.cards.size - 1, -1, -1):
            c = int(self.cards[i])
            more_w = float(self.awake_w[i] - lp_w[c])
            if b.rack_w[r] + more_w > modelled_caps[r]:
                break
            b.low_power[c] = False
            b.power_w[c] = self.awake_w[i]
            b.rack_w[r] += more_w
            keep = i
        self.cards, self.awake_w = self.cards[:keep], self.awake_w[:keep]

    def note(self, gs: GuardSetup, r: int, notes: Notes) -> None:
        """The line in ``notes`` saying how many of how many, when any sleeps."""
        if self.cards.size:
            notes.add(
                "cap_idle_to_low_power",
                f"{gs.site.rack_names[r]}: {self.cards.size} of {self.n_awake} awake idle cards to low power "
                "for the cap",
            )


def _sleep_idle_for_cap(
    gs: GuardSetup,
    r: int,
    b: _CapBudget,
    load: SiteLoad,
    lp_w: FloatArray,
    modelled_caps: FloatArray,
    kept: BoolArray,
) -> _Slept:
    """Step 4's first lever (``agent.guard``'s module docstring), for rack ``r`` over its cap: as few of its
    awake idle cards not ``kept`` (those the agent cannot see keep the state they report, those no command
    reaches the state in force, step 3a) as bring it under its cap go to low-power idle, those whose sleep
    saves the most first (card order among equals), all of them when even that is not enough; the others
    stay awake, the ready reserve for the next job. A sleep loses no work, a slower job does: this lever
    comes before :func:`_slow_jobs_for_cap`."""
    cand = np.flatnonzero((gs.card_rack == r) & load.idle & ~b.low_power & ~kept)
    saved_w = b.power_w[cand] - lp_w[cand]
    cand, saved_w = cand[saved_w > 0.0], saved_w[saved_w > 0.0]  # a sleep that saves nothing is no lever
    order = np.argsort(-saved_w, kind="stable")  # most saved first; card order among equals
    over_w = float(b.rack_w[r] - modelled_caps[r])  # to the cap itself: TOL_W left for rounding
    n_sleep = min(int(np.searchsorted(np.cumsum(saved_w[order]), over_w)) + 1, cand.size)
    to_sleep = cand[order[:n_sleep]]
    slept = _Slept(to_sleep, b.power_w[to_sleep].copy(), int(cand.size))
    b.low_power[to_sleep] = True
    b.rack_w[r] -= float(saved_w[order[:n_sleep]].sum())
    b.power_w[to_sleep] = lp_w[to_sleep]
    return slept


def _limit_power_for_cap(
    gs: GuardSetup,
    r: int,
    b: _CapBudget,
    load: SiteLoad,
    table: FloatArray,
    lp_w: FloatArray,
    modelled_caps: FloatArray,
    fs_lim: FloatArray,
    failed: BoolArray,
    sight: Sight,
    notes: Notes,
) -> None:
    """Step 4's last lever (``agent.guard``'s module docstring), for rack ``r`` still over its cap after the
    other two: every card of the rack whose power limit commands set (not failed, not
    ``sight.limit_kept``) gets the fail-safe power limit ``fs_lim[r]`` (or keeps a lower one), with a line
    in ``notes``; when even that does not hold the cap (the limit it would need is below
    ``min_power_limit_w``, or cards at settings in force, step 3a, draw more than it), a line saying the
    rack cannot be held and by how much, naming how many cards keep settings in force (no command reaches
    them, or a refusal holds one back: a level, a power limit, an awake idle card's sleep)."""
    site = gs.site
    in_r = (gs.card_rack == r) & ~failed & ~sight.limit_kept
    lim, power = b.power_limit_w, b.power_w
    lim[in_r] = np.minimum(lim[in_r], fs_lim[r])
    before_r = power[in_r].copy()
    power[in_r] = np.where(b.low_power[in_r], lp_w[in_r], np.minimum(table[in_r, b.level[in_r]], lim[in_r]))
    b.rack_w[r] += float((power[in_r] - before_r).sum())
    notes.add(
        "cap_power_limited",
        f"{site.rack_names[r]}: still over its cap at the slowest levels; power limits of {fs_lim[r]:.0f} W per card",
    )
    if b.over(r, modelled_caps):
        cfg = gs.control
        extra = float(rack_measured_caps_w(site, cfg)[r] - modelled_caps[r])
        rack_r = (gs.card_rack == r) & ~failed
        n_out = int(np.count_nonzero(sight.unreached_card & rack_r))
        them = f"{n_out} card no command reaches at the settings in force" if n_out == 1 else ""
        them = them or f"{n_out} cards no command reaches at the settings in force"
        out = f"; {them}" if n_out else ""
        awake_idle = load.idle & ~b.low_power
        held = (sight.level_kept | sight.limit_kept | (sight.sleep_kept & awake_idle)) & ~sight.unreached_card
        n_held = int(np.count_nonzero(held & rack_r))
        if n_held:
            s_ = "" if n_held == 1 else "s"
            out += f"; {n_held} card{s_} at a setting a refusal holds back"
        notes.add(
            "cap_not_held",
            f"{site.rack_names[r]}: cannot be held under its cap: {b.rack_w[r] / 1e3:.1f} kW "
            f"predicted at the lowest power limit a card accepts ({cfg.min_power_limit_w:g} W{out}) > "
            f"{modelled_caps[r] / 1e3:.1f} kW left for its cards and hosts "
            f"({extra / 1e3:.1f} kW on its PDU the twin does not explain)",
        )
