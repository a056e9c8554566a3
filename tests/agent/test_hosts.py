"""Host power-down by the agent (``agent.hosts``, ``Controller.with_hosts``, host-aware placement):
idle hosts go off after the idle time, a reserve of idle hosts stays on, busy or fail-safe hosts are
never switched, jobs land on powered hosts first and whole hosts at a time, and in closed loop the
hosts really go off and come back for new work without a refused command or a rack over its limit."""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import example_site, job

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.hosts import choose_hosts_off
from agent.loop import ApplyReport, ClosedLoop
from models.placement import PlacementProblem, QueuedJob, greedy_placement
from twin.plant import Plant, PlantConfig

pytestmark = pytest.mark.agent

SITE = example_site()
N_H, CPH = SITE.n_hosts, SITE.cards_per_host


def choose(**kw: object) -> np.ndarray:
    args: dict[str, object] = {
        "now_s": 10_000.0,
        "host_busy_last_s": np.zeros(N_H),
        "card_busy": np.zeros(SITE.n_cards, dtype=bool),
        "host_off_now": np.zeros(N_H, dtype=bool),
        "host_awake": np.zeros(N_H, dtype=bool),
        "frozen_host": np.zeros(N_H, dtype=bool),
        "off_after_s": 600.0,
        "reserve_per_supernode": 2,
    }
    args.update(kw)
    return choose_hosts_off(SITE, **args).host_off  # type: ignore[arg-type]


def test_idle_hosts_go_off_keeping_the_reserve_on_and_busy_hosts_never() -> None:
    busy = np.zeros(SITE.n_cards, dtype=bool)
    busy[: 10 * CPH] = True  # hosts 0-9 run jobs
    busy[10 * CPH] = True  # one card of host 10
    off = choose(card_busy=busy)
    assert not off[:11].any()
    assert int((~off[11:]).sum()) == 2  # the reserve
    # idle for less than off_after_s: stays on
    last = np.full(N_H, 9_500.0)
    assert not choose(host_busy_last_s=last).any()
    # the longest idle go first, and hosts holding awake reserve cards last
    last = np.linspace(0.0, 9_000.0, N_H)
    awake = np.zeros(N_H, dtype=bool)
    awake[0] = True
    off = choose(host_busy_last_s=last, host_awake=awake)
    assert not off[0] and not off[N_H - 1]  # awake cards kept; most recently used kept
    assert int((~off).sum()) == 2


def test_off_hosts_come_back_for_the_reserve_and_frozen_hosts_keep_their_state() -> None:
    was_off = np.ones(N_H, dtype=bool)
    off = choose(host_off_now=was_off)
    assert int((~off).sum()) == 2  # powered on again to refill the reserve
    busy = np.zeros(SITE.n_cards, dtype=bool)
    busy[5 * CPH : 6 * CPH] = True  # a job placed on an off host: it is on
    assert not choose(host_off_now=was_off, card_busy=busy)[5]
    # jobs waiting for cards (the site is full): nothing goes off, off hosts come on for their cards
    assert not choose(queued_cards=40).any()
    assert int((~choose(host_off_now=was_off, queued_cards=40)).sum()) == 2 + 5
    frozen = np.zeros(N_H, dtype=bool)
    frozen[:8] = True  # rack r0 at fail-safe: neither switched off nor on
    off = choose(frozen_host=frozen)
    assert not off[:8].any()
    off = choose(frozen_host=frozen, host_off_now=was_off)
    assert off[:8].all()


def test_placement_takes_whole_powered_hosts_first() -> None:
    free = np.ones(SITE.n_cards, dtype=bool)
    free[:4] = False  # host 0 half used
    off = np.zeros(SITE.n_cards, dtype=bool)
    off[8 : 6 * CPH] = True  # hosts 1-5 of rack r0 are off
    wait = np.where(off, 300.0, 0.0)

    def place(n: int) -> np.ndarray:
        pp = PlacementProblem(
            SITE, free, (QueuedJob(job("j", n)),), np.full(SITE.n_racks, 40_000.0), np.full(1, 500.0), wait
        )
        return greedy_placement(pp).cards["j"]

    assert set(place(4).tolist()) == {4, 5, 6, 7}  # a part-host job fills the half-used host
    for n in (8, 16, 64):  # whole-host jobs take whole hosts that are on
        cards = place(n)
        hosts = np.unique(cards // CPH)
        assert hosts.size == n // CPH and free[cards].all()
        assert not off[cards].any()
    # with every free host of the site off, a job still goes somewhere (and waits for the boot)
    all_off = free.copy()
    pp = PlacementProblem(
        SITE, free, (QueuedJob(job("k", 8)),), np.full(SITE.n_racks, 40_000.0), np.full(1, 500.0), all_off
    )
    assert greedy_placement(pp).cards["k"].size == 8


def test_closed_loop_powers_idle_hosts_off_and_back_on_for_new_work() -> None:
    jobs = [job(f"j{i}", 64, work_steps=600.0) for i in range(4)]  # half the site for ~10 min
    jobs.append(job("late", 128, work_steps=300.0, submit_s=2_400.0))
    plant = Plant(SITE, jobs, config=PlantConfig(seed=4))
    reports: list[ApplyReport] = []
    decisions: list[Decision] = []

    def note(d: Decision, r: ApplyReport) -> None:
        decisions.append(d)
        reports.append(r)

    cfg = ControlConfig(period_s=15.0, host_off_after_s=600.0, host_reserve_per_supernode=2)
    loop = ClosedLoop(plant, Controller(SITE, cfg), on_decision=note)
    host_w = []
    while plant.time_s < 2_300.0:
        loop.run(50.0)
        host_w.append(float(plant.truth().rack_host_power_w.sum()))
    truth = plant.truth()
    assert int(truth.host_off.sum()) == N_H - 2  # all idle hosts off but the reserve
    all_on_w = SITE.rack.host_overhead_w * SITE.n_racks
    assert host_w[-1] == pytest.approx(all_on_w - (N_H - 2) * SITE.host_saving_w())
    assert float(truth.card_power_w.sum()) < 16 * SITE.card.idle_power_w  # off cards draw nothing
    loop.run(1_200.0)  # the late job lands on off hosts: they boot and it runs
    late = {r.job_id: r for r in plant.job_records()}["late"]
    assert late.start_time_s is not None and late.work_done_card_s > 0
    assert sum(len(r.refused) for r in reports) == 0
    assert plant.accounting().rack_over_limit_s == 0.0
    assert any(r.hosts_off for r in reports) and any(d.host_off is not None for d in decisions)
