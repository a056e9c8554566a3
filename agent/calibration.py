"""Each card's die-to-inlet resistance as the agent believes it: the estimator's, the journal's or the spec's.

The estimator (``twin.estimate``) reports per card a resistance ratio against the spec at the flow
it measured, with its standard deviation. :class:`Calibration` takes a card's ratio once it is
certain (sd under 0.05) and keeps, per card, the largest confident estimate of the last
``_CALIBRATION_HOLD_S``: the estimator runs the spec's thermal time constants, so it reads a fouled
plate ~10% low for the minute or so it warms up after a resume, and such a dip must not speed a hot
card up. When the site clock goes back to a new timeline, so does the estimator's time, and the
estimates of the old timeline come back to the new time (as the belief's times do,
``twin.state.TwinState.clock_went_back``): the hold runs on the new timeline. A restarted agent
starts from the journal's calibration (:meth:`Calibration.load`) until the estimator is confident
again; cards neither calibrated nor journaled get the spec's resistance.
The resistance handed to the planner is kept within ``_CALIBRATION_RANGE`` of the spec's (a card
cooler than the spec is believed only a little: underestimating a die is the dangerous direction).

The controller (``agent.controller.Controller``) keeps one and updates it with each step's estimates.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import numpy.typing as npt

from agent.load import spec_r_total_k_per_w
from twin.estimate import Estimates
from twin.spec import SiteSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = ["Calibration"]

#: Calibration is used once the estimator's resistance ratio is this certain (standard deviation).
_CALIBRATION_SD = 0.05
#: A card's calibrated resistance is the largest confident estimate of this long (site s): the
#: estimator runs the spec's thermal time constants, so a fouled plate (slower than the spec) reads
#: ~10% low for the minute or so it warms up after a resume (and ~10% high while it cools); such a dip
#: must not speed a hot card up (a fouled plate does not heal in minutes). About one warm-up of a
#: fouled plate (a few of its ~20 s slow time constants).
_CALIBRATION_HOLD_S = 120.0
#: Calibrated resistances are kept within these multiples of the spec's (a cooler-than-spec card is
#: believed only a little: underestimating a die is the dangerous direction).
_CALIBRATION_RANGE = (0.9, 3.0)


class Calibration:
    """Per card: die-to-inlet resistance at nominal flow and leakage scale (see the module docstring)."""

    def __init__(self, site: SiteSpec) -> None:
        n = site.n_cards
        self._n_cards = n
        self._r_spec = spec_r_total_k_per_w(site)
        self._r_journal = np.full(n, np.nan)
        self._r_est = np.full(n, np.nan)
        self._r_hist: collections.deque[tuple[float, FloatArray]] = collections.deque()
        self._leak_scale = np.full(n, np.nan)

    def update(self, est: Estimates) -> None:
        """Take the estimator's die-to-inlet resistances where it is confident: per card the
        largest confident estimate of the last ``_CALIBRATION_HOLD_S`` (a transient dip is not believed)."""
        # the estimator's resistance ratio is against the spec at the measured flow: times the spec at
        # nominal flow, it is the card's resistance at nominal flow whatever the pump's speed was
        ok = np.isfinite(est.r_ratio) & (est.r_ratio_sd < _CALIBRATION_SD)
        r_now = np.asarray(np.where(ok, est.r_ratio * self._r_spec, np.nan), dtype=np.float64)
        t = float(est.time_s) if math.isfinite(est.time_s) else (self._r_hist[-1][0] if self._r_hist else 0.0)
        while self._r_hist and self._r_hist[-1][0] > t:
            # the site clock went back to a new timeline (the estimator's time goes back only then: never
            # for a late reading): the old timeline's estimates come back to the new time, as the belief's times
            # do, and are held from it (dropped, a dip just after a restarted simulator went unheld)
            r_now = np.fmax(r_now, self._r_hist.pop()[1])
        if self._r_hist and self._r_hist[-1][0] == t:
            # no newer reading (telemetry lost, a decision between two readings): one entry per time,
            # else the history grows without bound while the estimator's time stands still
            self._r_hist[-1] = (t, np.fmax(self._r_hist[-1][1], r_now))
        else:
            self._r_hist.append((t, r_now))
        while self._r_hist[0][0] < t - _CALIBRATION_HOLD_S:
            self._r_hist.popleft()
        self._r_est = np.asarray(np.fmax.reduce([r for _t, r in self._r_hist]), dtype=np.float64)
        self._leak_scale = np.where(ok, est.leakage_scale, self._leak_scale)

    def load(self, cards: IntArray, r_th_k_per_w: FloatArray, leak_scale: FloatArray) -> None:
        """Calibration from the journal (a restarted agent), used until the estimator is confident."""
        cards = np.asarray(cards, dtype=np.int64)
        ok = (cards >= 0) & (cards < self._n_cards) & np.isfinite(r_th_k_per_w) & (r_th_k_per_w > 0)
        self._r_journal[cards[ok]] = r_th_k_per_w[ok]
        self._leak_scale[cards[ok]] = leak_scale[ok]

    def calibrated(self) -> tuple[IntArray, FloatArray, FloatArray]:
        """(cards, die-to-inlet resistance, leakage scale) of the calibrated cards, for the journal."""
        r = np.where(np.isfinite(self._r_est), self._r_est, self._r_journal)
        cards = np.flatnonzero(np.isfinite(r)).astype(np.int64)
        leak = np.where(np.isfinite(self._leak_scale), self._leak_scale, 1.0)
        return cards, r[cards].copy(), leak[cards].copy()

    def r_total_k_per_w(self) -> FloatArray:
        """Per card at nominal flow: the estimator's resistance, else the journal's, else the spec's (clipped)."""
        r = np.where(np.isfinite(self._r_est), self._r_est, self._r_journal)
        r = np.where(np.isfinite(r), r, self._r_spec)
        lo, hi = _CALIBRATION_RANGE
        return np.asarray(np.clip(r, lo * self._r_spec, hi * self._r_spec), dtype=np.float64)
