"""Each card's die-to-inlet resistance as the agent believes it (``agent.calibration.Calibration``):
the estimator's once it is certain, the largest confident one of the last two minutes, else the
journal's, else the spec's, kept between 0.9 and 3 times the spec's."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from agent_helpers import small_site

from agent.calibration import Calibration
from agent.load import spec_r_total_k_per_w
from twin.estimate import Estimates

pytestmark = pytest.mark.unit

SITE = small_site()  # 2 racks of 16 cards
N = SITE.n_cards
R_SPEC = spec_r_total_k_per_w(SITE)


def estimates(
    time_s: float, ratio: dict[int, float], sd: float = 0.01, leak: dict[int, float] | None = None
) -> Estimates:
    """The estimator's report at ``time_s``: resistance ratio ``ratio[card]`` (standard deviation ``sd``)
    for the cards given, unknown (NaN) for the others; leakage scale ``leak[card]`` (1 elsewhere)."""
    r = np.full(N, np.nan)
    for c, v in ratio.items():
        r[c] = v
    ls = np.ones(N)
    for c, v in (leak or {}).items():
        ls[c] = v
    nan = np.full(N, np.nan)
    nan_r = np.full(SITE.n_racks, np.nan)
    return Estimates(
        time_s=time_s,
        r_ratio=r,
        r_ratio_sd=np.full(N, sd),
        r_th_k_per_w=nan,
        r_expected_k_per_w=nan,
        idle_scale=nan,
        dynamic_scale=nan,
        leakage_scale=ls,
        leakage_w_per_k=nan,
        rack_dt_ratio=nan_r,
        rack_flow_deficit=nan_r,
    )


def test_an_uncalibrated_card_has_the_spec_resistance_and_nothing_for_the_journal() -> None:
    cal = Calibration(SITE)
    np.testing.assert_array_equal(cal.r_total_k_per_w(), R_SPEC)
    cards, r, leak = cal.calibrated()
    assert cards.size == r.size == leak.size == 0


def test_a_confident_ratio_times_the_spec_is_taken_an_uncertain_one_is_not() -> None:
    cal = Calibration(SITE)
    cal.update(estimates(10.0, {3: 1.5}, sd=0.01, leak={3: 1.2}))
    cal.update(estimates(11.0, {4: 2.0}, sd=0.05))  # sd must be under 0.05: not taken
    r = cal.r_total_k_per_w()
    assert r[3] == pytest.approx(1.5 * R_SPEC[3])
    assert r[4] == R_SPEC[4]
    cards, r_j, leak = cal.calibrated()
    assert cards.tolist() == [3]
    assert r_j[0] == pytest.approx(1.5 * R_SPEC[3])
    assert leak[0] == pytest.approx(1.2)  # the leakage scale of the confident estimate


def test_a_dip_within_two_minutes_is_not_believed_and_an_older_peak_is_forgotten() -> None:
    cal = Calibration(SITE)
    cal.update(estimates(0.0, {0: 1.5}))
    cal.update(estimates(60.0, {0: 1.2}))  # a fouled plate reads low while it warms up
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.5 * R_SPEC[0])
    cal.update(estimates(120.0, {0: 1.2}))  # exactly the hold: the peak of t = 0 still counts
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.5 * R_SPEC[0])
    cal.update(estimates(121.0, {0: 1.2}))  # older than the hold: forgotten
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.2 * R_SPEC[0])
    # a rise is believed at once
    cal.update(estimates(122.0, {0: 1.4}))
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.4 * R_SPEC[0])


def test_an_unconfident_report_keeps_the_recent_confident_estimate() -> None:
    cal = Calibration(SITE)
    cal.update(estimates(0.0, {0: 1.5}))
    cal.update(estimates(30.0, {0: 0.95}, sd=0.2))
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.5 * R_SPEC[0])


def test_after_a_clock_step_back_the_old_timelines_estimates_are_held_from_the_new_time() -> None:
    """The site clock steps back, and the estimator's time with it (1000 s -> 50 s: it goes back for
    nothing else). The estimates of the old timeline's last two minutes come back to the new time, as
    the belief's times do, and their largest is held two minutes from it, as any; they used to be
    dropped (a dip of a fouled plate warming up just after a restarted simulator went unheld)."""
    cal = Calibration(SITE)
    cal.update(estimates(850.0, {0: 2.5}))  # older than the hold at 1000 s: forgotten then
    cal.update(estimates(950.0, {0: 2.0}))
    cal.update(estimates(1000.0, {0: 1.2}))
    assert cal.r_total_k_per_w()[0] == pytest.approx(2.0 * R_SPEC[0])
    cal.update(estimates(50.0, {0: 1.1}))  # the site clock went back: 950 and 1000 s are the old timeline's
    assert cal.r_total_k_per_w()[0] == pytest.approx(2.0 * R_SPEC[0])
    cal.update(estimates(170.0, {0: 1.1}))  # exactly the hold from the new time: still held
    assert cal.r_total_k_per_w()[0] == pytest.approx(2.0 * R_SPEC[0])
    cal.update(estimates(171.0, {0: 1.1}))
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.1 * R_SPEC[0])


def test_a_report_without_a_time_counts_at_the_latest_time() -> None:
    cal = Calibration(SITE)
    cal.update(estimates(1000.0, {0: 2.0}))
    cal.update(estimates(float("nan"), {0: 1.1}))  # not a step back, not 120 s on: both count
    assert cal.r_total_k_per_w()[0] == pytest.approx(2.0 * R_SPEC[0])
    cal.update(estimates(1121.0, {0: 1.1}))
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.1 * R_SPEC[0])


def test_reports_without_a_newer_time_keep_the_largest_in_one_entry_whatever_their_number() -> None:
    cal = Calibration(SITE)
    cal.update(estimates(0.0, {0: 1.5}))
    cal.update(estimates(100.0, {0: 1.2}))
    # telemetry lost: the estimator's time stands still at 100 s while decisions go on (one every 15 s)
    tracemalloc.start()
    before, _peak = tracemalloc.get_traced_memory()
    for k in range(5000):
        cal.update(estimates(100.0, {0: 1.3} if k == 0 else {}))  # then card 0 unknown
    after, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after - before < 50_000  # not 5,000 reports' arrays (~2 MB)
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.5 * R_SPEC[0])
    cal.update(estimates(121.0, {0: 1.1}))  # t = 0 is older than the hold; the reports of t = 100 are not
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.3 * R_SPEC[0])
    cal.update(estimates(221.0, {0: 1.1}))  # now they are
    assert cal.r_total_k_per_w()[0] == pytest.approx(1.1 * R_SPEC[0])


def test_the_resistance_handed_on_is_clipped_to_0_9_to_3_times_the_spec_the_journal_keeps_the_estimate() -> None:
    cal = Calibration(SITE)
    cal.update(estimates(0.0, {0: 0.5, 1: 5.0, 2: 0.9, 3: 3.0}))
    r = cal.r_total_k_per_w()
    np.testing.assert_allclose(r[:4], [0.9 * R_SPEC[0], 3.0 * R_SPEC[1], 0.9 * R_SPEC[2], 3.0 * R_SPEC[3]])
    cards, r_j, _leak = cal.calibrated()
    assert cards.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(r_j, [0.5 * R_SPEC[0], 5.0 * R_SPEC[1], 0.9 * R_SPEC[2], 3.0 * R_SPEC[3]])


def test_the_journal_is_used_until_the_estimator_is_confident_and_bad_entries_are_ignored() -> None:
    cal = Calibration(SITE)
    cards = np.array([0, 1, 2, -1, N, 5, 6], dtype=np.int64)
    r = np.array([1.2, 1.3, 1.4, 1.0, 1.0, np.nan, 0.0]) * R_SPEC[0]
    leak = np.array([np.nan, 1.1, 1.2, 9.0, 9.0, 9.0, 9.0])
    cal.load(cards, r, leak)  # a card out of range, a NaN and a zero resistance are left out
    got_cards, got_r, got_leak = cal.calibrated()
    assert got_cards.tolist() == [0, 1, 2]
    np.testing.assert_allclose(got_r, [1.2 * R_SPEC[0], 1.3 * R_SPEC[0], 1.4 * R_SPEC[0]])
    np.testing.assert_allclose(got_leak, [1.0, 1.1, 1.2])  # a resistance without a leakage scale: the spec's
    assert cal.r_total_k_per_w()[5] == R_SPEC[5] and cal.r_total_k_per_w()[6] == R_SPEC[6]
    # the estimator overrides the journal where it is confident, wherever the estimate lies
    cal.update(estimates(0.0, {2: 1.0}, leak={2: 0.8}))
    r_now = cal.r_total_k_per_w()
    assert r_now[1] == pytest.approx(1.3 * R_SPEC[0])
    assert r_now[2] == pytest.approx(1.0 * R_SPEC[2])
    got_cards, got_r, got_leak = cal.calibrated()
    assert got_cards.tolist() == [0, 1, 2]
    np.testing.assert_allclose(got_r, [1.2 * R_SPEC[0], 1.3 * R_SPEC[0], 1.0 * R_SPEC[2]])  # journaled: the estimate
    np.testing.assert_allclose(got_leak, [1.0, 1.1, 0.8])
