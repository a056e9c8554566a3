"""The guard's step 5, dies (``agent.guard``'s module docstring): :func:`enforce_dies` slows the job of
a busy card whose die the twin predicts over ``slowdown_temp_c - die_margin_k``, power-limits its cards
still over at the slowest level, and says in the explanation which jobs were slowed, which were
power-limited and whose dies cannot be held (:func:`_note_dies`). No I/O."""

from __future__ import annotations

import numpy as np

from agent.guard_draft import Draft, FloatArray, GuardSetup, IntArray, Notes, Sight

__all__ = ["enforce_dies"]


def enforce_dies(
    gs: GuardSetup,
    draft: Draft,
    table: FloatArray,
    inlet: FloatArray,
    r_total: FloatArray,
    off: FloatArray,
    notes: Notes,
    *,
    sight: Sight,
) -> None:
    """Step 5 (``agent.guard``'s module docstring), dies: a busy card whose die the twin predicts (``table``:
    computing, held to its power limit) above ``slowdown_temp_c - die_margin_k`` slows its job down to the
    first level where all its cards are under it; a card still over at the slowest level gets the power
    limit (whole watts, down, within the card's range) that its die limit allows. A card whose level no
    command sets (``sight.level_kept``, step 3a) is not slowed: the job's other cards are judged alone;
    one whose power limit no command sets (``sight.limit_kept``: no command reaches it, or a refusal holds
    its limit back) is not limited, and its die over the limit has no lever. ``notes`` says what was done
    (:func:`_note_dies`): jobs slowed, jobs power-limited, and jobs whose dies are over their limit even
    at the lowest power limit a card accepts or on cards whose limit no command sets (no lever left)."""
    site, cfg = gs.site, gs.control
    load, lvl, lim = draft.load, draft.level, draft.power_limit_w
    slowest = gs.model.n_levels - 1
    die_limit = site.card.slowdown_temp_c - cfg.die_margin_k
    idx = np.arange(lvl.size)
    die = inlet + r_total * np.minimum(table[idx, lvl], lim) + off
    hot = load.busy & (die > die_limit + 1e-9)
    if not hot.any():
        return
    lvl, lim = lvl.copy(), lim.copy()
    slowed: dict[str, int] = {}
    limited: list[str] = []
    limited_cards: list[IntArray] = []
    unheld: dict[str, float] = {}  # job -> its hottest die at the lowest power limit
    out_hot: dict[str, float] = {}  # job -> its hottest die on a card whose limit no command sets
    n_out_hot = 0
    for j in load.jobs:
        if not hot[j.cards].any():
            continue
        cards = j.cards[~sight.level_kept[j.cards]]  # those whose level commands set (all, but for refusals)
        if hot[cards].any():
            k0 = k = int(lvl[cards[0]])
            while k < slowest:
                d = inlet[cards] + r_total[cards] * np.minimum(table[cards, k], lim[cards]) + off[cards]
                if np.all(d <= die_limit + 1e-9):
                    break
                k += 1
            lvl[cards] = k
            if k > k0:
                slowed[j.job_id] = k
        d = inlet[j.cards] + r_total[j.cards] * np.minimum(table[j.cards, lvl[j.cards]], lim[j.cards]) + off[j.cards]
        over = d > die_limit + 1e-9
        kept = over & sight.limit_kept[j.cards]
        if kept.any():
            out_hot[j.job_id] = float(d[kept].max())
            n_out_hot += int(np.count_nonzero(kept))
        still = j.cards[over & ~kept]
        if still.size:
            allowed = np.floor((die_limit - inlet[still] - off[still]) / r_total[still])  # whole watts, down
            before = lim[still].copy()
            lim[still] = np.clip(np.minimum(lim[still], allowed), cfg.min_power_limit_w, site.card.power_limit_w)
            lowered = still[lim[still] < before]
            if lowered.size:
                limited.append(j.job_id)
                limited_cards.append(lowered)
            at = np.minimum(table[still, lvl[still]], lim[still])
            held = inlet[still] + r_total[still] * at + off[still]
            if np.any(held > die_limit + 1e-9):
                unheld[j.job_id] = float(held.max())
    _note_dies(gs, die_limit, slowed, limited, limited_cards, lim, unheld, notes, out_hot, n_out_hot)
    draft.level, draft.power_limit_w = lvl, lim


def _note_dies(
    gs: GuardSetup,
    die_limit: float,
    slowed: dict[str, int],
    limited: list[str],
    limited_cards: list[IntArray],
    lim: FloatArray,
    unheld: dict[str, float],
    notes: Notes,
    out_hot: dict[str, float],
    n_out_hot: int,
) -> None:
    """Step 5's lines in ``notes``, each saying what the guard did for the dies: the jobs it slowed
    (and to which level), the jobs at the slowest level whose cards it gave a lower power limit (how
    many cards, the lowest limit), and the jobs whose dies it cannot hold under ``die_limit`` even at
    the lowest power limit a card accepts (``unheld``: their hottest die predicted there) or on cards
    whose power limit no command sets (``out_hot``: their hottest die at the limits in force there;
    ``n_out_hot`` such cards), in one line."""
    keep = f"to keep dies under {die_limit:g} deg C"
    if slowed:
        items = ", ".join(f"{k} -> {v}" for k, v in list(slowed.items())[:6])
        more = f" and {len(slowed) - 6} more" if len(slowed) > 6 else ""
        notes.add("die_jobs_slowed", f"slowed job(s) {items}{more} {keep}")
    if limited:
        cards = np.concatenate(limited_cards)
        more = f" and {len(limited) - 6} more" if len(limited) > 6 else ""
        notes.add(
            "die_power_limited",
            f"power-limited job(s) {', '.join(limited[:6])}{more} at the slowest level {keep} "
            f"({cards.size} cards, lowest limit {float(lim[cards].min()):.0f} W)",
        )
    if unheld or out_hot:
        jobs = list(dict.fromkeys([*unheld, *out_hot]))
        more = f" and {len(jobs) - 6} more" if len(jobs) > 6 else ""
        why: list[str] = []
        if unheld:
            why.append(
                f"up to {max(unheld.values()):.1f} deg C predicted at the lowest power limit a card accepts "
                f"({gs.control.min_power_limit_w:g} W)"
            )
        if out_hot:
            n_cards = f"{n_out_hot} card{'s' if n_out_hot != 1 else ''}"
            why.append(
                f"up to {max(out_hot.values()):.1f} deg C predicted on {n_cards} no command reaches "
                "(a card_failed refusal) or whose power limit a refusal holds back, at the limits in force"
            )
        notes.add(
            "die_not_held",
            f"dies of job(s) {', '.join(jobs[:6])}{more} cannot be held under {die_limit:g} deg C: " + "; ".join(why),
        )
