"""The log lines of racks going to fail-safe caps and leaving them (:class:`FailsafeLog`): the
decision line's ``failsafe`` list alone did not say that anything changed, nor why.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from agent.decision import Decision
from twin.spec import SiteSpec
from twin.state import StateSnapshot

__all__ = ["FailsafeLog"]

log = logging.getLogger("racktwin.agent")


class FailsafeLog:
    """Remembers the racks the log last said are at fail-safe caps; ``telemetry_deadline_s`` is the
    configured age past which a rack's telemetry is missing."""

    def __init__(self, site: SiteSpec, telemetry_deadline_s: float) -> None:
        self.site = site
        self.telemetry_deadline_s = telemetry_deadline_s
        self._logged: frozenset[int] = frozenset()  # racks the log last said are at fail-safe caps

    def changes(self, decision: Decision, snap: StateSnapshot, now: float) -> None:
        """A warning when racks go to fail-safe caps (with why: silent for how long, never heard from,
        a stuck sensor), an info line when they leave them."""
        racks = frozenset(int(r) for r in decision.failsafe_racks)
        entered, left = racks - self._logged, self._logged - racks
        self._logged = racks
        names = self.site.rack_names
        if entered:
            last = np.asarray(snap.rack_last_seen_s, dtype=np.float64)
            stuck = {int(r) for r in snap.stuck_racks}
            stuck_card_racks = {int(c) // self.site.cards_per_rack for c in snap.stuck_cards}
            why: dict[str, str] = {}
            for r in sorted(entered):
                if not last[r] >= now - self.telemetry_deadline_s:
                    why[names[r]] = (
                        f"no telemetry for {now - last[r]:.0f} s" if math.isfinite(last[r]) else "never reported"
                    )
                elif r in stuck:
                    why[names[r]] = "its readings are frozen (stuck sensor)"
                elif r in stuck_card_racks:
                    why[names[r]] = "a stuck card sensor"
                else:
                    why[names[r]] = "within failsafe_hold_s of its last fault"
            by_reason: dict[str, list[str]] = {}
            for rack, reason in why.items():
                by_reason.setdefault(reason, []).append(rack)
            log.warning(
                "fail-safe caps on %s",
                "; ".join(f"{', '.join(rs)}: {reason}" for reason, rs in by_reason.items()),
                extra={"fields": {"racks": list(why), "why": why, "cycle": decision.cycle}},
            )
        if left:
            log.info(
                "fail-safe caps lifted on %s (readings fresh again for failsafe_hold_s)",
                ", ".join(names[r] for r in sorted(left)),
                extra={"fields": {"racks": [names[r] for r in sorted(left)], "cycle": decision.cycle}},
            )
