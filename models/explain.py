"""Why a DVFS problem is infeasible, computed directly from the data (no solver).

A card's power and die temperature fall monotonically toward the cheapest level its job may run
at, and a job's cheapest level is the cheapest in every rack it spans at once. So the problem is
feasible exactly when (1) every job has a level that keeps its hottest card under the die limit
and meets its SLO, (2) every rack at the cheapest levels, with all idle cards in low power, stays
under its limit minus margin, and (3) each supernode's ready reserve of awake idle cards fits into
what its racks have left (a job runs inside one supernode, so the reserve is one per supernode).
:func:`explain_infeasible` checks these in order and names the group, the rack, the job or the
supernode and the numbers.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from models.problem import CycleProblem, DvfsTables

__all__ = ["explain_infeasible", "is_feasible", "min_rack_power_w", "reserve_capacity"]


def min_rack_power_w(t: DvfsTables) -> npt.NDArray[np.float64]:
    """Each rack's power with every job at its cheapest allowed level and idle cards in low power."""
    lv = t.cheapest_level[t.pair_job]
    ok = lv >= 0
    power = t.rack_base_w.copy()
    np.add.at(power, t.pair_rack[ok], t.pair_power_w[np.flatnonzero(ok), lv[ok]])
    return power


def reserve_capacity(t: DvfsTables, rack_power_w: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """How many idle cards each rack can wake within its cap at ``rack_power_w``."""
    head = t.rack_cap_w - rack_power_w
    per = np.where(t.rack_wake_w > 0, np.floor(np.maximum(head, 0.0) / np.maximum(t.rack_wake_w, 1e-12)), t.rack_idle)
    return np.asarray(np.minimum(per, t.rack_idle), dtype=np.int64)


def explain_infeasible(p: CycleProblem, t: DvfsTables) -> str:
    """An empty string when the problem is feasible, else one line per reason (most basic first)."""
    reasons: list[str] = []
    clocks = p.site.card.clocks_mhz
    slowest = t.n_levels - 1
    for j in np.flatnonzero(t.cheapest_level < 0):
        job = p.jobs[int(j)]
        if not t.die_ok[j].any():
            reasons.append(
                f"die limit: job {job.job_id}: hottest card reaches {t.job_die_max_c[j, slowest]:.1f} deg C "
                f"even at the lowest level ({clocks[slowest]:g} MHz) > {p.die_limit_c:.1f} deg C limit "
                f"(slowdown {p.site.card.slowdown_temp_c:g} - margin {p.margins.die_margin_k:g}) "
                f"at supply {t.supply_c:g} deg C"
            )
        else:
            fastest_die = int(np.flatnonzero(t.die_ok[j])[0])
            slo_levels = np.flatnonzero(t.slo_ok[j])
            reasons.append(
                f"SLO: job {job.job_id} needs throughput >= {job.min_throughput_frac:.3g} of top clock, i.e. level <= "
                f"{int(slo_levels[-1])} ({clocks[int(slo_levels[-1])]:g} MHz), but the die limit allows only level >= "
                f"{fastest_die} ({clocks[fastest_die]:g} MHz) at supply {t.supply_c:g} deg C"
            )
    if reasons:
        return "\n".join(reasons)
    p_min = min_rack_power_w(t)
    # the same without SLOs: a rack that fits then is over its cap because of SLO floors
    die_only = np.where(t.die_ok, t.job_power_w, np.inf)
    lv_noslo = np.where(t.die_ok.any(axis=1), np.argmin(die_only, axis=1), t.n_levels - 1)
    p_noslo = t.rack_base_w.copy()
    np.add.at(p_noslo, t.pair_rack, t.pair_power_w[np.arange(t.pair_job.size), lv_noslo[t.pair_job]])
    names = p.site.rack_names
    for r in np.flatnonzero(p_min > t.rack_cap_w + 1e-6):
        busy = int(t.pair_cards[t.pair_rack == r].sum())
        if p_noslo[r] <= t.rack_cap_w[r] + 1e-6:
            in_rack = t.pair_job[t.pair_rack == r]
            slo_jobs = [p.jobs[int(j)].job_id for j in in_rack if t.cheapest_level[j] != lv_noslo[j]]
            reasons.append(
                f"SLO: rack {names[int(r)]}: the SLOs of job(s) {', '.join(slo_jobs)} keep it at "
                f"{p_min[r] / 1e3:.1f} kW > {t.rack_cap_w[r] / 1e3:.1f} kW (limit - margin); without the SLO floors "
                f"it could drop to {p_noslo[r] / 1e3:.1f} kW"
            )
            continue
        n_off = 0 if p.host_off is None else int(p.host_off.reshape(p.site.n_racks, -1)[r].sum())
        hosts = f"host {p.rack_host_w()[r] / 1e3:.1f} kW" + (f" with {n_off} of its hosts off" if n_off else "")
        draw = f"{busy} busy cards at their lowest allowed levels (+ {hosts}, idle cards in low power)"
        if t.rack_cap_w[r] <= 0.0:
            reasons.append(
                f"rack power: rack {names[int(r)]}: {_no_room(p, int(r))}; {draw} draw {p_min[r] / 1e3:.1f} kW"
            )
            continue
        limit_kw = f"{p.rack_limit_w[r] / 1e3:.1f}"
        site_kw = f"{p.site.rack_power_limits_w()[r] / 1e3:.1f}"
        site = f"; the site's limit is {site_kw} kW" if site_kw != limit_kw else ""
        reasons.append(
            f"rack power: rack {names[int(r)]}: {draw} still draw {p_min[r] / 1e3:.1f} kW > "
            f"{t.rack_cap_w[r] / 1e3:.1f} kW (limit {limit_kw} kW - margin {p.margins.rack_margin_w / 1e3:.1f} kW"
            f"{site})"
        )
    if reasons:
        return "\n".join(reasons)
    reasons += _reserve_reasons(p, t, reserve_capacity(t, p_min), p_min)
    return "\n".join(reasons)


def _reserve_reasons(
    p: CycleProblem, t: DvfsTables, cap: npt.NDArray[np.int64], p_min: npt.NDArray[np.float64]
) -> list[str]:
    """One line per supernode whose ready reserve does not fit in its racks' headroom (``cap`` per rack);
    on a site of one supernode the line names none."""
    reasons: list[str] = []
    names = p.site.rack_names
    for n in np.flatnonzero(t.reserve > 0):
        mine = t.rack_supernode == n
        room = int(cap[mine].sum())
        if room >= int(t.reserve[n]):
            continue
        # the racks whose headroom ran out before their idle cards did: what one more card there needs is
        # what it lacks (a rack with no headroom at all, or with every idle card awake, says nothing)
        short = mine & (cap < t.rack_idle) & (t.rack_cap_w - p_min > 0.0)
        if short.any():
            wake = f"each further awake card adds up to {float(t.rack_wake_w[short].max()):.1f} W in the racks"
            why = f"{wake} with idle cards and headroom left"
        else:
            why = "no rack with idle cards left has headroom"
        where = ""
        if p.site.supernodes > 1:
            first, last = (names[int(r)] for r in np.flatnonzero(mine)[[0, -1]])
            where = f"supernode {int(n)} (" + (f"rack {first}" if first == last else f"racks {first}-{last}") + "): "
        reasons.append(
            f"ready reserve: {where}{int(t.reserve[n])} awake idle cards are required but the racks' headroom at "
            f"the lowest levels leaves room for only {room} ({why})"
        )
    return reasons


def _no_room(p: CycleProblem, r: int) -> str:
    """Why rack ``r``, whose limit in ``p`` is at or below the margin, has no room at all: its limit in
    watts (a caller may hand the models a token limit, as the agent does for a rack whose unexplained
    power takes all of it: ``agent.planning``'s 1 W), next to the site's own where that is higher, so
    that the line is not read as a misconfigured limit of 0.0 kW."""
    limit_w = float(p.rack_limit_w[r])
    site_w = float(p.site.rack_power_limits_w()[r])
    site = f" (the site's limit is {site_w / 1e3:.1f} kW)" if site_w > limit_w else ""
    return (
        f"no room: its limit in this problem is {limit_w:,.0f} W{site}, not above the "
        f"{p.margins.rack_margin_w / 1e3:.1f} kW margin"
    )


def is_feasible(p: CycleProblem, t: DvfsTables) -> bool:
    return explain_infeasible(p, t) == ""
