"""What the agent believes runs where (``agent.load.site_load``) and what the twin predicts of it.

What users rely on: busy cards of no known job are budgeted as an unknown job (and so never put to
sleep or placed on), but a job's cards are free the moment its end event is in, even though the
readings of that second still show its utilization. A failed card is no job's and no unknown work; a
placement is taken only on free cards of the job's size; a job's utilization follows its phase and
its clock; a prediction adds the measured die offset and its leakage, the hosts' overhead, and holds
each awake card to its power limit.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any, TypedDict, Unpack

import numpy as np
import pytest
from agent_helpers import belief, example_site, job, small_site

from agent.load import (
    UNKNOWN_JOB_PREFIX,
    Prediction,
    SiteLoad,
    SiteLoads,
    card_utilization,
    job_value_per_h,
    power_model,
    predict,
    site_load,
    site_load_of_problem,
    spec_r_total_k_per_w,
)
from twin.plant import Plant, PlantConfig
from twin.state import StateSnapshot, TwinState
from twin.workload import Phase, relative_throughput

pytestmark = pytest.mark.agent


@pytest.mark.parametrize("events_first", [False, True])
def test_a_finished_jobs_cards_are_free_at_once_and_unknown_work_is_still_seen(events_first: bool) -> None:
    site = example_site()
    plant = Plant(site, [job("short", 64, work_steps=20.0), job("long", 64)], [], PlantConfig(seed=1))
    state = TwinState(site, stuck_after_readings=20)
    finished_at = None
    for _ in range(120):
        plant.step(1.0)
        readings, events = plant.readings(), plant.drain_events()
        if events_first:  # over MQTT the end event may come before the telemetry of the same second
            state.apply_events(events)
            state.update(readings)
        else:
            state.update(readings)
            state.apply_events(events)
        if any(e.kind == "finished" and e.job_id == "short" for e in events):
            finished_at = plant.time_s
            break
    assert finished_at is not None, "the short job did not finish"
    snap = state.snapshot()
    freed = np.flatnonzero(snap.card_released_s > -1.0e9)
    assert freed.size == 64 and np.all(snap.card_job[freed] == -1)
    assert np.all(snap.card_utilization[freed] > 0.5)  # the last reading still shows the job's work
    load = site_load(site, snap)
    assert [j.job_id for j in load.jobs] == ["long"]
    assert np.all(load.idle[freed])
    assert np.all(snap.card_prev_seen_s[freed] < snap.card_released_s[freed] - 1e-9)
    # a card that still reads busy over a whole reading interval after its job left is work the agent
    # does not know of (a telemetry period of 10 s here: the rule does not assume one)
    released = snap.card_released_s
    later = dataclasses.replace(snap, card_prev_seen_s=released + 10.0, card_last_seen_s=released + 20.0)
    unknown = [j for j in site_load(site, later).jobs if j.origin == "unknown"]
    assert [j.job_id for j in unknown] == [f"{UNKNOWN_JOB_PREFIX}{site.rack_names[int(site.card_rack()[freed[0]])]}"]
    assert unknown[0].cards.tolist() == freed.tolist()


# --------------------------------------------------------------------------------------------
# The rules of site_load, card_utilization and predict on a tiny site, values derived by hand
# --------------------------------------------------------------------------------------------

# 2 racks of 4 cards: job "a" (share 0.9) on cards 0-3 of rack r0, job "b" (share 0.8, priority 2) on
# cards 4-5 of rack r1, cards 6-7 idle; every job computing
TINY = small_site(2, (2, 2))
CLOCKS = TINY.card.clocks_mhz


@cache
def _tiny() -> StateSnapshot:
    _plant, state = belief(TINY, [job("a", 4, share=0.9), job("b", 2, share=0.8, priority=2.0)], 90)
    snap = state.snapshot()
    assert snap.card_job.tolist() == [0, 0, 0, 0, 1, 1, -1, -1]
    assert all(j.phase == Phase.COMPUTE for j in snap.jobs) and not snap.queue
    return snap


def _with(snap: StateSnapshot, **cards: dict[int, object]) -> StateSnapshot:
    """``snap`` with some cards' values of per-card fields replaced (``card_failed={1: True}``)."""
    fields: dict[str, Any] = {}
    for name, values in cards.items():
        arr = np.asarray(getattr(snap, name)).copy()
        for c, v in values.items():
            arr[c] = v
        fields[name] = arr
    return dataclasses.replace(snap, **fields)


def _queued(snap: StateSnapshot, n_cards: int) -> StateSnapshot:
    q = dataclasses.replace(snap.jobs[0], job_id="q", state="queued", n_cards=n_cards, cards=(), spec=None)
    return dataclasses.replace(snap, queue=(q,))


def test_a_failed_card_leaves_its_job_and_a_job_with_no_card_left_is_no_load() -> None:
    # a card failure is read before the job's requeue event: the job is budgeted on its other cards,
    # at their number (its value and its spec count them), and a failed card is no unknown work
    snap = _with(_tiny(), card_failed={1: True, 4: True, 5: True}, card_utilization={1: 0.9, 4: 0.9, 5: 0.9})
    load = site_load(TINY, snap)
    assert [j.job_id for j in load.jobs] == ["a"]
    (a,) = load.jobs
    assert a.cards.tolist() == [0, 2, 3] and a.spec.n_cards == 3
    assert load.card_job.tolist() == [0, -1, 0, 0, -1, -1, -1, -1]
    assert load.idle.tolist() == [False, False, False, False, False, False, True, True]
    rel = float(relative_throughput(0.9, 1.0))
    assert job_value_per_h(TINY, a, 0, 10.0) == pytest.approx(3 * 10.0 * rel)


@pytest.mark.parametrize(
    ("cards", "valid"),
    [
        ((6, 7), True),
        ((7, 6), True),
        ((6,), False),  # wrong number of cards
        ((6, 6), False),  # a card listed twice
        ((0, 6), False),  # a card of the first running job
        ((5, 6), False),  # a card of another running job
        ((6, 8), False),  # no such card
        ((-1, 6), False),
        ((3, 7), False),  # card 3 failed (below)
    ],
)
def test_a_placement_is_taken_only_on_free_cards_of_its_size(cards: tuple[int, ...], valid: bool) -> None:
    snap = _queued(_with(_tiny(), card_failed={3: True}), 2)
    load = site_load(TINY, snap, [("q", cards), ("nosuchjob", (6, 7))] if valid else [("q", cards)])
    placing = [j for j in load.jobs if j.origin == "placing"]
    if not valid:
        assert placing == [] and load.card_job[6:].tolist() == [-1, -1]
        return
    (q,) = placing
    assert q.job_id == "q" and q.cards.tolist() == [6, 7] and q.spec.n_cards == 2
    assert load.card_job[6:].tolist() == [load.index_of("q")] * 2
    # a job being placed does not compute yet: no training value now, no power in its current phase,
    # but its cards are budgeted computing at the level they are given
    assert not q.computing and job_value_per_h(TINY, q, 0, 10.0) == 0.0
    lv = np.zeros(TINY.n_cards, dtype=np.int64)
    assert card_utilization(TINY, load, lv, worst_case=False)[6:].tolist() == [0.0, 0.0]
    assert card_utilization(TINY, load, lv, worst_case=True)[6:] == pytest.approx([0.92, 0.92])


@pytest.mark.parametrize(
    "placements",
    [(), (("q", (6, 7)),), (("q", [6, 7]),), (("q", np.array([7, 6])),), (("q", (6, 6)),), (("nosuchjob", (6, 7)),)],
)
def test_a_steps_loads_are_site_load_built_once_per_placements_and_read_only(placements: Any) -> None:
    snap = _queued(_with(_tiny(), card_failed={3: True}), 2)
    loads = SiteLoads(TINY, snap)
    got, want = loads.of(snap, placements), site_load(TINY, snap, placements)
    assert [(j.job_id, j.cards.tolist(), j.phase, j.origin, j.spec) for j in got.jobs] == [
        (j.job_id, j.cards.tolist(), j.phase, j.origin, j.spec) for j in want.jobs
    ]
    assert got.card_job.tolist() == want.card_job.tolist() and got.failed.tolist() == want.failed.tolist()
    # asked again (the same placements, however spelled): the same load, whose arrays no caller may change
    assert loads.of(snap, [(jid, tuple(int(c) for c in cards)) for jid, cards in placements]) is got
    for a in (got.card_job, got.failed, *(j.cards for j in got.jobs)):
        with pytest.raises(ValueError):
            a[...] = a
    assert snap.card_failed.flags.writeable  # the snapshot's own array is left as it was
    # another snapshot is not this step's: its load is built afresh
    other = dataclasses.replace(snap, card_failed=np.zeros(TINY.n_cards, dtype=bool))
    assert loads.of(other, placements).failed.tolist() == [False] * TINY.n_cards


def test_unknown_work_is_a_busy_awake_card_of_no_job_one_pseudo_job_per_rack_budgeted_at_full_utilization() -> None:
    # card 6 (rack r1) busy; card 7 (r1) at 0.04, under the 0.05 threshold; card 3 (r0) left job "a"
    # (released long before its reading) and reads busy; a low-power card's stale utilization is no work
    snap = _tiny()
    jobs = (dataclasses.replace(snap.jobs[0], n_cards=3, cards=(0, 1, 2)), snap.jobs[1])
    snap = dataclasses.replace(_with(snap, card_job={3: -1}, card_released_s={3: 10.0}), jobs=jobs)
    snap = _with(snap, card_utilization={3: 0.5, 6: 0.3, 7: 0.04})
    load = site_load(TINY, snap)
    unknown = {j.job_id: j for j in load.jobs if j.origin == "unknown"}
    assert sorted(unknown) == [f"{UNKNOWN_JOB_PREFIX}{TINY.rack_names[0]}", f"{UNKNOWN_JOB_PREFIX}{TINY.rack_names[1]}"]
    assert unknown[f"{UNKNOWN_JOB_PREFIX}{TINY.rack_names[0]}"].cards.tolist() == [3]
    assert unknown[f"{UNKNOWN_JOB_PREFIX}{TINY.rack_names[1]}"].cards.tolist() == [6]
    # budgeted at its worst, u = 1 at every clock, now and in the worst case: it is never put to sleep
    for lv in (0, TINY.card.n_levels - 1):
        level = np.full(TINY.n_cards, lv, dtype=np.int64)
        for worst in (False, True):
            u = card_utilization(TINY, load, level, worst_case=worst)
            assert u[[3, 6]] == pytest.approx([1.0, 1.0]) and u[7] == 0.0
    assert not load.idle[[3, 6]].any() and load.idle[7]
    asleep = _with(snap, card_low_power={6: True})
    assert [j.cards.tolist() for j in site_load(TINY, asleep).jobs if j.origin == "unknown"] == [[3]]


def test_a_jobs_utilization_follows_its_phase_and_its_clock() -> None:
    # u = (share / f + (1 - share) * ncu) / (share / f + 1 - share), f the clock over the top clock
    snap = _tiny()
    load = site_load(TINY, snap)
    slow = TINY.card.n_levels - 1
    level = np.array([0, 0, slow, slow, 0, slow, 0, slow], dtype=np.int64)
    f = CLOCKS[slow] / CLOCKS[0]
    u_a_slow = (0.9 / f + 0.1 * 0.2) / (0.9 / f + 0.1)
    u_b_slow = (0.8 / f + 0.2 * 0.2) / (0.8 / f + 0.2)
    expected = [0.92, 0.92, u_a_slow, u_a_slow, 0.84, u_b_slow, 0.0, 0.0]
    assert card_utilization(TINY, load, level, worst_case=True) == pytest.approx(expected)
    assert card_utilization(TINY, load, level, worst_case=False) == pytest.approx(expected)
    # a communication stall holds every card at 0.2; a checkpoint or an input stall leaves them idle
    for phase, u_now in ((Phase.COMMUNICATION, 0.2), (Phase.CHECKPOINT, 0.0), (Phase.WAITING, 0.0)):
        stalled = dataclasses.replace(snap, jobs=(dataclasses.replace(snap.jobs[0], phase=phase), snap.jobs[1]))
        sl = site_load(TINY, stalled)
        assert card_utilization(TINY, sl, level, worst_case=False) == pytest.approx([u_now] * 4 + expected[4:])
        assert card_utilization(TINY, sl, level, worst_case=True) == pytest.approx(expected)
        assert job_value_per_h(TINY, sl.jobs[0], 0, 10.0) == 0.0
    # a plan of the models: its jobs in the phases it gives them
    planned = site_load_of_problem(
        [j.spec for j in load.jobs], [Phase.CHECKPOINT, Phase.COMPUTE], load.card_job, load.failed
    )
    assert [j.computing for j in planned.jobs] == [False, True]
    assert card_utilization(TINY, planned, level, worst_case=False) == pytest.approx([0.0] * 4 + expected[4:])


def test_a_jobs_value_per_hour_is_priority_times_cards_times_its_relative_throughput() -> None:
    load = site_load(TINY, _tiny())
    a, b = load.jobs
    slow = TINY.card.n_levels - 1
    f = CLOCKS[slow] / CLOCKS[0]
    assert job_value_per_h(TINY, a, 0, 10.0) == pytest.approx(1.0 * 10.0 * 4)
    # the step takes share / f + (1 - share) of its time at the top clock
    assert job_value_per_h(TINY, b, slow, 10.0) == pytest.approx(2.0 * 10.0 * 2 / (0.8 / f + 0.2))


class PredictArgs(TypedDict, total=False):
    """``predict``'s arguments after the load, all of which ``_predict`` sets or a test overrides."""

    level: np.ndarray
    low_power: np.ndarray
    power_limit_w: np.ndarray
    inlet_c: np.ndarray
    r_total_k_per_w: np.ndarray
    die_offset_k: np.ndarray
    rack_extra_w: np.ndarray | None


def _predict(load: SiteLoad, **kw: Unpack[PredictArgs]) -> Prediction:
    n = TINY.n_cards
    args: PredictArgs = {
        "level": np.zeros(n, dtype=np.int64),
        "low_power": np.zeros(n, dtype=bool),
        "power_limit_w": np.full(n, TINY.card.power_limit_w),
        "inlet_c": np.full(n, 35.0),
        "r_total_k_per_w": spec_r_total_k_per_w(TINY),
        "die_offset_k": np.zeros(n),
        **kw,
    }
    return predict(TINY, load, **args)


def test_a_prediction_adds_the_die_offset_its_leakage_the_host_overhead_and_holds_cards_to_their_limits() -> None:
    load = site_load(TINY, _tiny())
    model = power_model(TINY)
    r = spec_r_total_k_per_w(TINY)
    sleep = np.array([False] * 6 + [True, True])
    base = _predict(load, low_power=sleep)
    # a card 5 K hotter than the twin says draws its leakage of 5 K more, and its die is 5 K plus
    # what that power adds hotter; a sleeping card leaks at its low-power rate
    off = np.zeros(TINY.n_cards)
    off[[1, 6]] = 5.0
    hot = _predict(load, low_power=sleep, die_offset_k=off)
    d_p = hot.card_power_w - base.card_power_w
    assert d_p[1] == pytest.approx(5.0 * model.leak_w_per_k[0])
    assert d_p[6] == pytest.approx(5.0 * model.low_power_leak_w_per_k)
    assert hot.card_die_c[1] - base.card_die_c[1] == pytest.approx(5.0 + r[1] * d_p[1])
    assert np.all(d_p[[0, 2, 3, 4, 5, 7]] == 0.0)
    # a rack draws its cards, its hosts' overhead and the measured extra
    rack = TINY.card_rack()
    extra = np.array([100.0, -50.0])
    with_extra = _predict(load, low_power=sleep, rack_extra_w=extra)
    for k in range(TINY.n_racks):
        cards_w = base.card_power_w[rack == k].sum()
        assert base.rack_power_w[k] == pytest.approx(cards_w + TINY.rack.host_overhead_w)
        assert with_extra.rack_power_w[k] == pytest.approx(cards_w + TINY.rack.host_overhead_w + extra[k])
    # the hottest die of a rack is that of an awake card: a sleeping card's is not the rack's
    very_hot = np.zeros(TINY.n_cards)
    very_hot[7] = 30.0
    assert _predict(load, low_power=sleep, die_offset_k=very_hot).rack_max_die_c[1] == base.rack_max_die_c[1]
    assert base.rack_max_die_c[1] == pytest.approx(base.card_die_c[4:6].max())
    # a card over its power limit is held at it by its power brake; a sleeping card ignores limits
    limit = np.full(TINY.n_cards, TINY.card.power_limit_w)
    limit[[0, 7]] = 100.0
    limited = _predict(load, low_power=sleep, power_limit_w=limit)
    assert base.card_power_w[0] > 100.0 and limited.card_power_w[0] == 100.0
    assert limited.card_power_w[7] == base.card_power_w[7]
    assert limited.card_die_c[0] == pytest.approx(35.0 + r[0] * 100.0)
    # a busy card is never asleep, whatever the settings say
    np.testing.assert_array_equal(
        _predict(load, low_power=np.ones(TINY.n_cards, dtype=bool)).card_power_w[:6], base.card_power_w[:6]
    )
