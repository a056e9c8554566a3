"""Per rack, the power the twin does not explain: measured, smoothed and budgeted off the rack's cap.

Two parts, each with its own ``_EXTRA_DEADBAND_W`` dead band (:meth:`UnexplainedPower.budget_w`):

* **the PDU's part** (:meth:`UnexplainedPower.update_pdu`, once per step at commit): the rack's PDU
  power above what its cards report and the spec's host overhead (a host reported off draws its off
  power instead of its share), smoothed; racks at fail-safe caps or without a fresh PDU reading keep
  theirs;
* **the cards' part** (:meth:`UnexplainedPower.update_cards`, once per step in the context): what
  the cards of computing jobs draw above the twin's power model of their work at the settings in
  force (``agent.load.model_gap_w``: a job whose work is not what the agent believes). Per card,
  from its readings while its job computes, kept while the job holds the card (a job that stalls or
  checkpoints draws it again when it resumes) and dropped when another job takes it; a card on a
  fail-safe rack, or without a new reading since the last step, keeps its own. A rise is taken as
  soon as two readings in a row show it (one reading may show a card's new level with the power of
  the level it left: 680 W read at a level the model puts at 587 W, once in a nominal day), a fall
  as slowly as the PDU's part.

A decision says which racks draw more than the margin above the twin's prediction
(:meth:`UnexplainedPower.notes`). The controller (``agent.controller.Controller``) keeps one.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from agent.load import SiteLoad, model_gap_w
from twin.spec import SiteSpec
from twin.state import StateSnapshot

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["UnexplainedPower"]

#: Smoothing (per step) and dead band of the rack power the twin does not explain (each of its two
#: parts: the PDU's power above the cards' readings and the host overhead, and the cards' power above
#: the twin's model of their work).
_EXTRA_SMOOTHING = 0.3
_EXTRA_DEADBAND_W = 300.0


class UnexplainedPower:
    """Per rack: PDU power above the cards and hosts, and cards' power above the twin's model of their
    work (see the module docstring)."""

    def __init__(self, site: SiteSpec) -> None:
        n, n_r = site.n_cards, site.n_racks
        self.site = site
        self._card_rack = site.card_rack()
        self._extra_w = np.zeros(n_r)  # PDU power above the cards' readings and the hosts (smoothed)
        # cards' power above the twin's model of their work (agent.load.model_gap_w), per rack and per card
        self._gap_w = np.zeros(n_r)
        self._card_gap_w = np.zeros(n)  # held while the card's job holds it
        self._card_gap_last_w = np.full(n, np.nan)  # the card's newest reading's gap ...
        self._card_gap_seen_s = np.full(n, -math.inf)  # ... and its time
        self._card_gap_job = np.full(n, "", dtype=object)  # the job it was measured on

    def budget_w(self) -> FloatArray:
        """Per rack: the power taken off its cap (each part beyond its dead band)."""
        return np.maximum(self._extra_w - _EXTRA_DEADBAND_W, 0.0) + np.maximum(self._gap_w - _EXTRA_DEADBAND_W, 0.0)

    def clock_went_back(self) -> None:
        """The site's clock went back: readings on the new timeline are new."""
        self._card_gap_seen_s[:] = -math.inf

    def update_cards(self, snap: StateSnapshot, load: SiteLoad, card_seen: BoolArray, failsafe: set[int]) -> None:
        """Per rack, the sum over its busy cards of what each draws above the twin's model of its job's
        work (``agent.load.model_gap_w``; see the module docstring). ``card_seen``: the cards whose
        readings are observations; ``failsafe``: the racks at fail-safe caps."""
        site = self.site
        ids = np.array([j.job_id for j in load.jobs] + [""], dtype=object)
        job = ids[np.where(load.card_job >= 0, load.card_job, len(load.jobs))]
        moved = job != self._card_gap_job
        self._card_gap_w = np.where(moved, 0.0, self._card_gap_w)
        self._card_gap_last_w = np.where(moved, np.nan, self._card_gap_last_w)
        self._card_gap_job = job
        gap = model_gap_w(site, snap, load, card_seen)
        seen_s = np.asarray(snap.card_last_seen_s, dtype=np.float64)
        new = np.isfinite(gap) & (seen_s > self._card_gap_seen_s)
        new &= ~np.isin(self._card_rack, np.asarray(sorted(failsafe), dtype=np.int64))
        a = _EXTRA_SMOOTHING
        shown = np.fmin(gap, self._card_gap_last_w)  # what the two newest readings both show
        smoothed = np.maximum(shown, (1 - a) * self._card_gap_w + a * shown)
        self._card_gap_w = np.where(new, smoothed, self._card_gap_w)
        self._card_gap_last_w = np.where(new, gap, self._card_gap_last_w)
        self._card_gap_seen_s = np.where(new, seen_s, self._card_gap_seen_s)
        held = np.where(load.busy, self._card_gap_w, 0.0)
        self._gap_w = np.bincount(self._card_rack, weights=held, minlength=site.n_racks).astype(np.float64)

    def update_pdu(self, snap: StateSnapshot, failsafe_racks: tuple[int, ...]) -> None:
        """PDU power above what the cards report plus the spec's host overhead, per fresh rack."""
        site = self.site
        pdu = np.asarray(snap.rack_power_w, dtype=np.float64)
        card_p = np.where(np.isfinite(snap.card_power_w) & ~snap.card_failed, snap.card_power_w, 0.0)
        cards_w = np.bincount(self._card_rack, weights=card_p, minlength=site.n_racks)
        # hosts reported off draw their off power instead of their share of the overhead
        off_per_rack = (
            np.bincount(
                self._card_rack, weights=np.asarray(snap.card_host_off, dtype=np.float64), minlength=site.n_racks
            )
            / site.cards_per_host
        )
        excess = pdu - cards_w - (site.rack.host_overhead_w - off_per_rack * site.host_saving_w())
        fresh = np.isfinite(excess)
        fresh[list(failsafe_racks)] = False
        a = _EXTRA_SMOOTHING
        self._extra_w = np.where(fresh, (1 - a) * self._extra_w + a * np.maximum(excess, 0.0), self._extra_w)

    def notes(self, margin_w: float) -> list[str]:
        """A line per rack that draws more than ``margin_w`` above the twin's prediction at the settings
        in force (the power the twin does not explain, smoothed; budgeted)."""
        names = self.site.rack_names
        pdu_w, gap_w = self._extra_w, np.maximum(self._gap_w, 0.0)
        return [
            f"{names[r]} draws {(pdu_w[r] + gap_w[r]) / 1e3:.2f} kW more than the twin predicts at the settings in "
            f"force (its cards {gap_w[r] / 1e3:.2f} kW beyond the power model of their work, its PDU "
            f"{pdu_w[r] / 1e3:.2f} kW beyond its cards and hosts): budgeted"
            for r in np.flatnonzero(pdu_w + gap_w > margin_w)
        ]
