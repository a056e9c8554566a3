"""``twin.plant_readings.PlantSensors.read`` skips the per-card masking when ``n_low`` and ``n_failed``
are both 0 (``if n_low or n_failed``): the counts are the plant's own tallies of its ``low_power`` and
``failed`` arrays (``twin.plant.Plant`` recounts them wherever it changes either array), so the skip is
taken exactly when no card is asleep or failed. Each count alone must still mask what docs/twin.md says
(a sleeping or failed card reads no clock; a failed card no power or utilization): a sleeping card with
no failed card anywhere, a failed card with no sleeping card anywhere (the existing audit sets both)."""

from __future__ import annotations

import numpy as np
import pytest
from test_plant_readings_audit import _cards, _sensors, _state

from twin.spec import SiteSpec

pytestmark = pytest.mark.unit


def test_a_sleeping_card_reads_no_clock_when_no_card_has_failed(small_site: SiteSpec) -> None:
    state = _state(small_site)
    state["low_power"][2] = True
    state["n_low"] = 1
    rd = _sensors(small_site).read(**state)
    clock, power = _cards(rd, "clock_mhz"), _cards(rd, "power_w")
    assert clock[2] == 0.0 and power[2] > 400.0  # asleep: no clock, its power still read
    others = np.setdiff1d(np.arange(small_site.n_cards), [2])
    assert (clock[others] == 1980.0).all()


def test_a_failed_card_reads_no_clock_power_or_utilization_when_no_card_sleeps(small_site: SiteSpec) -> None:
    state = _state(small_site)
    state["failed"][20] = True
    state["n_failed"] = 1
    rd = _sensors(small_site).read(**state)
    clock, power, util = _cards(rd, "clock_mhz"), _cards(rd, "power_w"), _cards(rd, "utilization")
    assert (clock[20], power[20], util[20]) == (0.0, 0.0, 0.0)
    others = np.setdiff1d(np.arange(small_site.n_cards), [20])
    assert (clock[others] == 1980.0).all() and (power[others] > 400.0).all() and (util[others] > 0.4).all()


def test_with_no_card_asleep_or_failed_every_card_reads_its_clock_power_and_utilization(small_site: SiteSpec) -> None:
    rd = _sensors(small_site).read(**_state(small_site))
    assert (_cards(rd, "clock_mhz") == 1980.0).all()
    assert (_cards(rd, "power_w") > 400.0).all() and (_cards(rd, "utilization") > 0.4).all()
