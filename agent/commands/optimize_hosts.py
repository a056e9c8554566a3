"""The hosts ``racktwin optimize`` powers off: decided before planning, after placement, with the
agent's rule (``agent.hosts``), so that the plan is made for the site with those hosts off
(``CycleProblem.host_off``: the caps and the explanation of an infeasible run count what they save).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.commands.optimize_scenario import SolverSection


def hosts_off(p: Any, solver: SolverSection) -> npt.NDArray[np.bool_] | None:
    """Per host: powered off for the plan, decided before planning from the busy cards (after
    placement), the ready reserve and the queue, for a problem ``p`` with every host on.

    The agent's rule for hosts idle long enough (``agent.hosts.choose_hosts_off``): every host none
    of whose cards runs a job goes off, except ``host_reserve_per_supernode`` per supernode kept on
    for arriving jobs, and none while jobs are still queued (they wait for cards). The ready reserve
    of awake idle cards must sit on hosts that are on: its cards are taken from the idle cards of
    hosts with a busy card (on anyway) first, then from whole idle hosts, in the racks with the most
    headroom first, each supernode's reserve in its own racks; those hosts stay on (they count toward
    the supernode's reserve of hosts on, and stay on beyond it). The other idle hosts go off in the
    racks with the least headroom first (a snapshot has no idle times to order them by). None where the
    site's hosts cannot be powered off or ``choose_host_power`` is false."""
    from agent.hosts import choose_hosts_off, host_any
    from models.explain import min_rack_power_w
    from models.problem import dvfs_tables

    site = p.site
    if not (solver.choose_host_power and site.hosts_managed):
        return None
    n_h, cph = site.n_hosts, site.cards_per_host
    busy = p.card_job >= 0
    host_busy = host_any(site, busy)
    free = p.idle_mask().reshape(n_h, cph).sum(axis=1)  # cards that can be woken, per host
    host_rack = np.arange(n_h) // site.rack.hosts_per_rack
    # each rack's headroom at its least power with every host that runs no job off
    t = dvfs_tables(p)
    idle_hosts = np.bincount(host_rack[~host_busy], minlength=site.n_racks)
    head = t.rack_cap_w - min_rack_power_w(t) + idle_hosts * site.host_off_saving_w()
    host_sn = site.rack_supernode()[host_rack]
    keep = np.zeros(n_h, dtype=bool)  # idle hosts on for the ready reserve, each supernode's in its racks
    for n, reserve in enumerate(np.asarray(p.ready_reserve_cards).tolist()):
        mine = host_sn == n
        left = min(reserve, int(free[mine].sum())) - int(free[mine & host_busy].sum())
        while left > 0:
            cand = np.flatnonzero(mine & ~host_busy & ~keep & (free > 0))
            h = int(cand[np.lexsort((-free[cand], -head[host_rack[cand]]))[0]])
            keep[h] = True
            left -= int(free[h])
            head[host_rack[h]] -= site.host_off_saving_w() + free[h] * t.rack_wake_w[host_rack[h]]
    none = np.zeros(n_h, dtype=bool)
    off = choose_hosts_off(
        site,
        now_s=0.0,
        # a snapshot: every idle host has been idle long enough; the "longest idle" (first off) are
        # those in the racks with the least headroom
        host_busy_last_s=head[host_rack] - float(head.max()) - 1.0,
        card_busy=busy,
        host_off_now=none,
        host_awake=keep,
        frozen_host=none,
        off_after_s=0.0,
        reserve_per_supernode=solver.host_reserve_per_supernode,
        due_cards=sum(q.n_cards for q in p.queue),
    ).host_off
    return np.asarray(off & ~keep, dtype=np.bool_)
