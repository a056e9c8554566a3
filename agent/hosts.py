"""Which idle hosts to power off: Slurm-style power saving, decided with the twin's view of the site.

A host (``site.cards_per_host`` consecutive cards, ``rack.hosts_per_rack`` per rack) none of whose
cards runs or is being given a job for ``host_off_after_s`` is powered off: it then draws
``rack.host_off_power_w`` instead of ``rack.host_power_w`` and its cards nothing. A job placed on an
off host waits for its boot (``rack.host_boot_s``), so each supernode keeps
``host_reserve_per_supernode`` idle hosts on for arriving jobs: when fewer are on, off hosts are
powered on again. While queued jobs are due to start within a boot (plus a lead; the controller
tells which from the running jobs' expected ends and the reservation it holds, see
``agent.placing.cards_due``), no host goes off and off hosts are powered on for the cards those jobs
need, so that a job that gets its cards when running jobs end does not also wait for a boot; hosts
left idle while a big job waits for a start further ahead go off meanwhile and boot in time for it.
The reserve and the waiting jobs are counted in cards: a free host with failed cards holds only its
healthy ones (a job requeued after a card failure, its host left with 7 healthy cards of 8, used to
wait for the scheduler's own fallback while the other host of its rack stayed off).
Hosts whose cards the agent cannot see (a rack without fresh telemetry, the host of a stuck card) keep
their state (their telemetry cannot be trusted), and a host with a card busy or being placed on is
never off. The idle hosts kept on are those holding awake idle cards (the
ready reserve the plan keeps on hosts that are on) first, then the most recently used; when hosts
come back on, the most recently used come first.

Pure functions of arrays, no I/O. The controller keeps a :class:`HostTimes`: per host, the last time
one of its cards was busy and when the boot a decision started ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from twin.spec import SiteSpec

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["HostChoice", "HostTimes", "choose_hosts_off", "host_any"]


def host_any(site: SiteSpec, card_mask: BoolArray) -> BoolArray:
    """Per host: any of its cards is set in ``card_mask``."""
    return np.asarray(np.asarray(card_mask, dtype=bool).reshape(site.n_hosts, site.cards_per_host).any(axis=1))


@dataclass(frozen=True, eq=False)
class HostChoice:
    host_off: BoolArray  # per host: powered off after this decision
    powering_off: BoolArray  # per host: on now, off after this decision
    powering_on: BoolArray  # per host: off now, on after this decision

    def note(self) -> str:
        return (
            f"hosts: {int(self.host_off.sum())} off ({int(self.powering_off.sum())} powering off, "
            f"{int(self.powering_on.sum())} on again)"
        )


def choose_hosts_off(
    site: SiteSpec,
    *,
    now_s: float,
    host_busy_last_s: FloatArray,
    card_busy: BoolArray,
    host_off_now: BoolArray,
    host_awake: BoolArray,
    frozen_host: BoolArray,
    off_after_s: float,
    reserve_per_supernode: int,
    due_cards: int = 0,
    card_failed: BoolArray | None = None,
) -> HostChoice:
    """The hosts to have off after this decision (see the module docstring).

    ``host_busy_last_s``: per host, the last time one of its cards was busy (the agent's start where
    it has not seen one); ``card_busy``: per card, runs or is being given a job (the decision's);
    ``host_off_now``: per host, off as last reported; ``host_awake``: per host, holds idle cards the
    decision keeps awake (the ready reserve: such hosts are kept on first); ``frozen_host``: hosts to leave
    as they are; ``due_cards``: cards of the jobs still waiting after this decision's placements that are
    due to start within a boot (their hosts are wanted on now); ``card_failed``: per card, failed or
    kept out of placement (a free host holds its healthy cards only; None: none failed)."""
    off_now = np.asarray(host_off_now, dtype=bool)
    frozen = np.asarray(frozen_host, dtype=bool)
    busy = host_any(site, card_busy)
    free = ~busy
    hosts_per_sn = site.n_hosts // site.supernodes
    off = off_now.copy()
    off[busy] = False  # a job placed on an off host boots it
    idle_s = now_s - np.asarray(host_busy_last_s, dtype=np.float64)
    awake = np.asarray(host_awake, dtype=bool)
    # cards wanted on free hosts that are on: the reserve's, and the waiting jobs' due to start soon,
    # spread over the supernodes
    cph = site.cards_per_host
    want = reserve_per_supernode * cph + -(-due_cards // site.supernodes)
    healthy = np.full(site.n_hosts, cph, dtype=np.int64)
    if card_failed is not None:
        healthy -= np.asarray(card_failed, dtype=bool).reshape(site.n_hosts, cph).sum(axis=1)
    for sn in range(site.supernodes):
        sl = slice(sn * hosts_per_sn, (sn + 1) * hosts_per_sn)
        f, fz, o, idle, aw, ok = free[sl], frozen[sl], off[sl], idle_s[sl], awake[sl], healthy[sl]
        # the hosts kept on: those holding awake idle cards (the ready reserve) first, then the most
        # recently used, as many as hold the cards wanted
        on_free = np.flatnonzero(f & ~o & ~fz)
        on_free = on_free[np.lexsort((idle[on_free], ~aw[on_free]))]
        held = np.cumsum(ok[on_free])
        n_keep = int(np.searchsorted(held, want)) + 1 if want > 0 else 0
        if n_keep < on_free.size and due_cards == 0:  # of the others, those idle long enough go off
            due = on_free[n_keep:]
            o[due[idle[due] >= off_after_s]] = True
        elif n_keep > on_free.size:  # too few: off hosts come back, the most recently used first
            back = np.flatnonzero(f & o & ~fz)
            back = back[np.argsort(idle[back], kind="stable")]
            short = want - (int(held[-1]) if held.size else 0)
            o[back[: int(np.searchsorted(np.cumsum(ok[back]), short)) + 1]] = False
        off[sl] = o
    off = np.where(frozen, off_now, off)
    return HostChoice(host_off=off, powering_off=off & ~off_now, powering_on=~off & off_now)


class HostTimes:
    """Per host: the last time one of its cards was busy (``busy_last_s``; NaN: not seen yet) and, for
    a host a decision powered on, when its boot ends (``up_at_s``)."""

    def __init__(self, site: SiteSpec) -> None:
        self.site = site
        self.busy_last_s = np.full(site.n_hosts, np.nan)
        self.up_at_s = np.full(site.n_hosts, -math.inf)

    def card_wait_s(self, card_host_off: BoolArray, now_s: float) -> FloatArray | None:
        """Per card: how long until its host is up (the rest of the boot for a host a decision powered
        on; a whole boot for an off host, ``card_host_off``); None where hosts are not managed."""
        site = self.site
        if not site.hosts_managed:
            return None
        off = host_any(site, card_host_off)
        wait = np.where(off, site.rack.host_boot_s, np.maximum(self.up_at_s - now_s, 0.0))
        return np.repeat(wait, site.cards_per_host)

    def commit(self, card_busy: BoolArray, host_off: BoolArray | None, card_host_off: BoolArray, now_s: float) -> None:
        """A decision taken at ``now_s``: its busy cards (``card_busy``), the hosts it has off
        (``host_off``; None: it does not say) and the cards whose hosts are off as last reported."""
        site = self.site
        busy_host = host_any(site, card_busy)
        self.busy_last_s = np.where(np.isnan(self.busy_last_s) | busy_host, now_s, self.busy_last_s)
        if host_off is not None:  # hosts this decision powers on (the reserve, a placement) boot
            booting = host_any(site, card_host_off) & ~host_off & (self.up_at_s < now_s)
            self.up_at_s[booting] = now_s + site.rack.host_boot_s
            self.busy_last_s[booting] = now_s  # a host just powered on is not due to go off again

    def clock_went_back(self, now_s: float) -> None:
        """The site's clock went back to ``now_s``: a boot lasts at most a boot from now."""
        np.minimum(self.up_at_s, now_s + self.site.rack.host_boot_s, out=self.up_at_s)
        np.minimum(self.busy_last_s, now_s, out=self.busy_last_s)  # NaN (never seen) stays NaN
