"""Host power-down by the agent (``agent.hosts``, ``Controller.with_hosts``, host-aware placement):
idle hosts go off after the idle time, a reserve of idle hosts stays on, busy or fail-safe hosts are
never switched, jobs land on powered hosts first and whole hosts at a time, and in closed loop the
hosts really go off and come back for new work without a refused command or a rack over its limit."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypedDict, Unpack

import numpy as np
import pytest
from agent_helpers import SITE_FILE, belief, example_site, job, small_site

from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.hosts import HostTimes, choose_hosts_off
from agent.loop import ApplyReport, ClosedLoop
from models.placement import PlacementProblem, QueuedJob, greedy_placement
from twin.plant import CardFailure, Plant, PlantConfig
from twin.spec import site_from_dict
from twin.tables import read_toml
from twin.workload import PhaseModel

pytestmark = pytest.mark.agent

SITE = example_site()
N_H, CPH = SITE.n_hosts, SITE.cards_per_host


class HostArgs(TypedDict, total=False):
    """``choose_hosts_off``'s keyword arguments, all of which ``choose`` sets or a test overrides."""

    now_s: float
    host_busy_last_s: np.ndarray
    card_busy: np.ndarray
    host_off_now: np.ndarray
    host_awake: np.ndarray
    frozen_host: np.ndarray
    off_after_s: float
    reserve_per_supernode: int
    due_cards: int
    card_failed: np.ndarray


def choose(**kw: Unpack[HostArgs]) -> np.ndarray:
    args: HostArgs = {
        "now_s": 10_000.0,
        "host_busy_last_s": np.zeros(N_H),
        "card_busy": np.zeros(SITE.n_cards, dtype=bool),
        "host_off_now": np.zeros(N_H, dtype=bool),
        "host_awake": np.zeros(N_H, dtype=bool),
        "frozen_host": np.zeros(N_H, dtype=bool),
        "off_after_s": 600.0,
        "reserve_per_supernode": 2,
        **kw,
    }
    return choose_hosts_off(SITE, **args).host_off


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


def test_the_hosts_kept_on_are_those_holding_the_ready_reserve_even_when_others_were_used_later() -> None:
    last = np.full(N_H, 0.0)
    last[[3, 4, 5]] = 9_900.0  # used 100 s ago: not idle long enough to go off yet
    awake = np.zeros(N_H, dtype=bool)
    awake[[20, 21]] = True  # the ready reserve's awake cards, idle for long
    off = choose(host_busy_last_s=last, host_awake=awake)
    assert not off[[3, 4, 5, 20, 21]].any()  # the reserve, and recently used hosts until their time
    assert int((~off).sum()) == 5
    last[[3, 4, 5]] = 0.0  # all idle long: the awake ones are the reserve
    off = choose(host_busy_last_s=last, host_awake=awake)
    assert np.flatnonzero(~off).tolist() == [20, 21]


def test_off_hosts_come_back_for_the_reserve_and_frozen_hosts_keep_their_state() -> None:
    was_off = np.ones(N_H, dtype=bool)
    off = choose(host_off_now=was_off)
    assert int((~off).sum()) == 2  # powered on again to refill the reserve
    busy = np.zeros(SITE.n_cards, dtype=bool)
    busy[5 * CPH : 6 * CPH] = True  # a job placed on an off host: it is on
    assert not choose(host_off_now=was_off, card_busy=busy)[5]
    # jobs due to start within a boot: nothing goes off, off hosts come on for their cards
    assert not choose(due_cards=40).any()
    assert int((~choose(host_off_now=was_off, due_cards=40)).sum()) == 2 + 5
    frozen = np.zeros(N_H, dtype=bool)
    frozen[:8] = True  # rack r0 at fail-safe: neither switched off nor on
    off = choose(frozen_host=frozen)
    assert not off[:8].any()
    off = choose(frozen_host=frozen, host_off_now=was_off)
    assert off[:8].all()
    # not even a card the decision marks busy powers on a host the agent cannot see
    busy = np.zeros(SITE.n_cards, dtype=bool)
    busy[3 * CPH] = True  # a card of host 3 (rack r0, frozen)
    choice = choose_hosts_off(
        SITE,
        now_s=10_000.0,
        host_busy_last_s=np.zeros(N_H),
        card_busy=busy,
        host_off_now=was_off,
        host_awake=np.zeros(N_H, dtype=bool),
        frozen_host=frozen,
        off_after_s=600.0,
        reserve_per_supernode=2,
    )
    assert choice.host_off[:8].all() and not choice.powering_on[:8].any()


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


def test_the_ready_reserve_stays_awake_on_hosts_that_are_on() -> None:
    """``idle_reserve_cards`` idle cards stay awake while idle hosts are off: the plan never counts a
    card of an off host in its reserve (it could not wake it without a boot) and the hosts kept on
    are those holding the reserve (the reserve used to fall to 0-8 cards once hosts went off)."""
    jobs = [job(f"j{i}", 64, work_steps=400.0, submit_s=300.0 * i) for i in range(6)]
    plant = Plant(SITE, jobs, config=PlantConfig(seed=4, placement="external"))
    cfg = ControlConfig(period_s=15.0)
    short: list[tuple[float, int]] = []

    def check(d: Decision, _r: ApplyReport) -> None:
        if d.host_off is None or not d.host_off.any() or d.source == "incremental":
            return
        card_off = np.repeat(d.host_off, CPH)
        idle = ~d.card_busy & ~d.card_failed
        awake = idle & ~d.card_low_power
        assert not (awake & card_off).any()
        if int(awake.sum()) < min(cfg.idle_reserve_cards * SITE.supernodes, int((idle & ~card_off).sum())):
            short.append((d.time_s, int(awake.sum())))

    loop = ClosedLoop(plant, Controller(SITE, cfg), on_decision=check)
    loop.run(2_400.0)
    assert int(plant.truth().host_off.sum()) > 0
    assert short == []


def test_hosts_idle_while_a_big_job_waits_for_its_cards_go_off_and_boot_in_time_for_it() -> None:
    """A job that needs every card waits ~3,400 s for a half-site job to end: the idle half's hosts go
    off meanwhile (they used to stay on while any job waited) and are booted before its expected
    start, so it starts when the cards are free, not a boot later."""
    long = job("long", SITE.n_cards // 2, work_steps=3_000.0)
    big = job("big", SITE.n_cards, work_steps=300.0, submit_s=30.0)
    plant = Plant(SITE, [long, big], config=PlantConfig(seed=4, placement="external"))
    reports: list[ApplyReport] = []
    loop = ClosedLoop(plant, Controller(SITE, ControlConfig(period_s=15.0)), on_decision=lambda d, r: reports.append(r))
    off_while_waiting = []
    booting_when_placed = -1
    while plant.time_s < 4_000.0:
        loop.run(20.0)
        if "big" in {j.job_id for j in plant.queued_jobs()}:
            off_while_waiting.append(int(plant.truth().host_off.sum()))
        elif booting_when_placed < 0:
            booting_when_placed = int((plant.host_off() | plant.host_booting()).sum())
    assert max(off_while_waiting) == N_H // 2 - 2  # the idle half but the reserve
    assert booting_when_placed == 0  # its hosts were up when its cards were free: no boot on its path
    rec = {r.job_id: r for r in plant.job_records()}
    assert rec["big"].start_time_s == rec["long"].finish_time_s
    assert sum(len(r.refused) for r in reports) == 0
    assert plant.accounting().rack_over_limit_s == 0.0


def test_the_break_even_time_is_a_boot_at_on_power_over_what_an_off_host_saves_in_the_plant() -> None:
    """``SiteSpec.host_break_even_s`` checked on the plant's physics: the power an off host saves
    (host and its cards asleep, less the off power) and a boot drawn at the asleep host's power."""
    plants = [Plant(SITE, [], config=PlantConfig(seed=1)) for _ in range(2)]
    for p in plants:
        p.enter_low_power(np.arange(CPH))  # host 0's cards asleep
    plants[1].power_off_hosts([0])
    for p in plants:
        p.run(100.0)
    on_w, off_w = (p.truth().it_power_w for p in plants)
    saving_w = on_w - off_w
    plants[1].power_on_hosts([0])
    for p in plants:
        p.run(100.0)
    booting_w = plants[1].truth().it_power_w - off_w + SITE.rack.host_off_power_w
    assert plants[1].host_booting()[0] and booting_w == pytest.approx(saving_w + SITE.rack.host_off_power_w)
    measured_s = SITE.rack.host_boot_s * booting_w / saving_w
    assert SITE.host_break_even_s() == pytest.approx(measured_s, rel=0.01)  # cards asleep at 49-53 W
    assert 300.0 < SITE.host_break_even_s() < 330.0


def test_by_default_idle_hosts_go_off_after_the_break_even_time() -> None:
    plant = Plant(SITE, [job("j", 64, work_steps=200.0)], config=PlantConfig(seed=4))
    loop = ClosedLoop(plant, Controller(SITE, ControlConfig(period_s=15.0)))
    hosts: set[int] = set()
    off_at: dict[int, float] = {}
    while plant.time_s < 1_500.0:
        loop.run(5.0)
        if "j" in {j.job_id for j in plant.running_jobs()}:
            hosts |= {int(c) // CPH for c in plant.job_cards("j")}
        off = plant.host_off()
        off_at.update({h: plant.time_s for h in hosts if off[h] and h not in off_at})
    end_s = next(r for r in plant.job_records() if r.job_id == "j").finish_time_s
    assert end_s is not None and len(hosts) == 8
    # the reserve of hosts on is the two holding the ready reserve's awake cards (the job's hosts
    # were not among them), so every host the job used goes off once idle for the break-even time
    assert len(off_at) == 8
    on_idle = np.flatnonzero(~plant.host_off())
    assert on_idle.size == 2 and not set(on_idle.tolist()) & hosts
    awake = np.flatnonzero(~plant.truth().low_power)
    assert awake.size == 16 and set((awake // CPH).tolist()) == set(on_idle.tolist())
    after_s = [t - end_s for t in off_at.values()]
    assert all(SITE.host_break_even_s() <= a <= SITE.host_break_even_s() + 15.0 + 5.0 for a in after_s)


def test_a_failed_card_reads_failed_again_after_its_host_was_off_and_a_repaired_one_sleeps() -> None:
    """A failed card is never asleep: after its host was powered off and on it reads failed again
    (awake, 0 MHz, 0 W: what tells the agent over MQTT), so no job is placed on it; repaired while its
    host is off, it sleeps like its neighbours."""
    plant = Plant(SITE, [], [CardFailure(card=3, at_s=5.0), CardFailure(card=12, at_s=5.0, repair_after_s=50.0)])
    plant.run(10.0)
    plant.power_off_hosts([0, 1])
    plant.run(100.0)  # card 12 is repaired while host 1 is off
    plant.power_on_hosts([0, 1])
    plant.run(SITE.rack.host_boot_s + 10.0)
    cards = plant.readings().racks[0].cards
    assert cards is not None
    assert cards.failed[3] and not cards.low_power[3] and cards.clock_mhz[3] == 0.0 and cards.power_w[3] == 0.0
    assert not cards.failed[12] and cards.low_power[12]
    assert cards.low_power[[0, 1, 2, 4, 5, 6, 7]].all()


def test_a_job_requeued_after_a_card_failure_boots_a_host_when_its_own_is_short_of_healthy_cards() -> None:
    """Job b (8 cards, one host) loses a card and is requeued: its host has 7 healthy cards, the
    other host of its rack is off (no reserve). That host is powered on at once and b placed on it
    (was: the free host with a failed card counted as 8 cards, nothing booted, and b waited 120 s for
    the scheduler's own fallback to place it)."""
    data: dict[str, Any] = read_toml(SITE_FILE)
    data.update(name="small-2x16-hosts", racks_per_supernode=2, torus_dims=[4, 4, 2])
    data["rack"] = {**data["rack"], "host_overhead_w": 2200.0, "hosts_per_rack": 2, "power_limit_w": 12500.0}
    site = site_from_dict(data, source="2 racks of 2 hosts of 8 cards")
    jobs = [job("a", 16), job("b", 8)]
    config = PlantConfig(
        seed=7, placement="external", external_timeout_s=120.0, phases=PhaseModel(restart_delay_s=20.0)
    )
    plant = Plant(site, jobs, [CardFailure(card=21, at_s=200.0)], config)
    cfg = ControlConfig(period_s=5.0, idle_reserve_cards=0, host_off_after_s=30.0, host_reserve_per_supernode=0)
    placed: list[tuple[float, str]] = []
    booted: list[float] = []

    def note(d: Decision, r: ApplyReport) -> None:
        placed.extend((d.time_s, jid) for jid in r.placed)
        if r.hosts_on:
            booted.append(d.time_s)

    loop = ClosedLoop(plant, Controller(site, cfg), on_decision=note)
    loop.run(210.0)
    assert int(plant.truth().host_off.sum()) == 1  # r1's second host, idle since t = 0
    loop.run(40.0)  # b is requeued at 220 s
    assert booted and 220.0 <= booted[0] <= 225.0
    assert [jid for t, jid in placed if t >= 220.0] == ["b"]
    assert not plant.truth().host_off.any()


def test_hosts_the_agent_cannot_see_hold_none_of_the_reserve() -> None:
    """Rack r0 (hosts 0-7) is blind: its hosts keep their state and cannot be placed on, so two of
    the other hosts are kept on (or powered on) for the reserve."""
    frozen = np.zeros(N_H, dtype=bool)
    frozen[:8] = True
    off = choose(frozen_host=frozen)
    assert not off[:8].any() and int((~off[8:]).sum()) == 2
    # every host off: r0's stay off, and two others come back for the reserve
    off = choose(frozen_host=frozen, host_off_now=np.ones(N_H, dtype=bool))
    assert off[:8].all() and int((~off[8:]).sum()) == 2


def test_without_a_reserve_or_jobs_due_every_idle_host_goes_off() -> None:
    assert choose(reserve_per_supernode=0).all()


def test_the_reserve_already_on_powers_no_other_host_on() -> None:
    """Two free hosts on (the reserve's 16 cards), every other host off: nothing changes."""
    was_off = np.ones(N_H, dtype=bool)
    was_off[[9, 40]] = False
    choice = choose_hosts_off(
        SITE,
        now_s=10_000.0,
        host_busy_last_s=np.zeros(N_H),
        card_busy=np.zeros(SITE.n_cards, dtype=bool),
        host_off_now=was_off,
        host_awake=np.zeros(N_H, dtype=bool),
        frozen_host=np.zeros(N_H, dtype=bool),
        off_after_s=600.0,
        reserve_per_supernode=2,
    )
    np.testing.assert_array_equal(choice.host_off, was_off)
    assert not choice.powering_on.any() and not choice.powering_off.any()


def test_a_host_idle_for_exactly_the_idle_time_goes_off() -> None:
    last = np.full(N_H, 10_000.0 - 600.0)  # every host idle for exactly off_after_s (600 s) at now
    assert int(choose(host_busy_last_s=last).sum()) == N_H - 2  # all but the reserve
    assert not choose(host_busy_last_s=last + 1.0).any()  # a second short: none


def test_off_hosts_come_back_most_recently_used_first_and_only_as_many_as_the_cards_wanted() -> None:
    """Hosts powered on again for the reserve are the most recently used (warmest caches, likeliest
    wanted again), and only as many as the reserve is short of: a free host already on counts."""
    was_off = np.ones(N_H, dtype=bool)
    last = np.zeros(N_H)
    last[[7, 30, 41]] = [5_000.0, 9_000.0, 7_000.0]  # the most recently used: 30, then 41, then 7
    assert np.flatnonzero(~choose(host_off_now=was_off, host_busy_last_s=last)).tolist() == [30, 41]
    was_off[12] = False  # host 12 is on and free: it holds 8 of the 16 cards of the reserve
    on = np.flatnonzero(~choose(host_off_now=was_off, host_busy_last_s=last)).tolist()
    assert on == [12, 30]


def test_the_reserve_counts_only_the_healthy_cards_of_the_hosts_on_and_of_those_powered_on() -> None:
    """A host with a failed card holds 7 of the 8 cards of a one-host reserve: a free host on with a
    failed card does not make the reserve alone, and an off host with one is not enough to fill it
    (else the supernode keeps 7 placeable idle cards on, and an arriving 8-card job waits for a boot)."""
    was_off = np.ones(N_H, dtype=bool)
    last = np.zeros(N_H)
    last[[30, 41]] = [9_000.0, 7_000.0]  # the most recently used off hosts: 30, then 41

    def on(failed_card: int | None = None) -> list[int]:
        card_failed = np.isin(np.arange(SITE.n_cards), [] if failed_card is None else [failed_card])
        off = choose(host_off_now=was_off, host_busy_last_s=last, reserve_per_supernode=1, card_failed=card_failed)
        return np.flatnonzero(~off).tolist()

    assert on() == [30]  # all healthy: one host holds the reserve
    assert on(failed_card=30 * CPH + 2) == [30, 41]  # a card of host 30 failed: 41 comes back too
    # host 12 is on and free, but one of its cards failed: the most recently used off host comes back
    was_off[12] = False
    assert on() == [12]
    assert on(failed_card=12 * CPH + 5) == [12, 30]


def test_a_card_a_refusal_says_failed_holds_none_of_the_reserve_of_hosts_on() -> None:
    """Host 12 is the only host on, free, its 8 cards the reserve's (one host). A ``card_failed``
    refusal says one of them failed before any reading does: no job is placed on it, so the host holds
    7 placeable cards and another host is powered on (was: counted as 8, nothing booted, and an 8-card
    job waited for the scheduler or a reading to tell the agent)."""
    plant, state = belief(SITE, [], 5.0)
    plant.power_off_hosts([h for h in range(N_H) if h != 12])
    for _ in range(10):
        plant.step(1.0)
        state.update(plant.readings())
    snap = state.snapshot()
    cfg = ControlConfig(host_reserve_per_supernode=1, idle_reserve_cards=0)
    d = Controller(SITE, cfg).step(snap, 15.0)
    assert d.host_off is not None and np.flatnonzero(~d.host_off).tolist() == [12]
    refused = np.zeros(SITE.n_cards, dtype=bool)
    refused[12 * CPH + 3] = True
    d = Controller(SITE, cfg).step(snap, 15.0, refused_failed=refused)
    assert d.host_off is not None
    on = np.flatnonzero(~d.host_off).tolist()
    assert len(on) == 2 and 12 in on


@pytest.mark.parametrize("how", ["refused", "failed"])
def test_a_failed_or_refused_card_that_reads_awake_keeps_no_host_on_as_ready_reserve(how: str) -> None:
    """Hosts 12 and 13 are on and free, one host is the reserve, no ready reserve of awake cards. Card
    3 of host 13 reads awake: it failed (a failed card reads awake at 0 MHz), or a ``card_failed``
    refusal says it failed (no command reaches it, so it keeps the awake state it reports). Neither
    holds a job, so neither is ready reserve: host 12 holds the reserve's 8 cards and host 13 goes off
    once idle for ``host_off_after_s``. Was, for the refused card: its host counted as holding the
    ready reserve's awake cards, was kept on first, and both hosts stayed on."""
    card = 13 * CPH + 3
    faults = [CardFailure(card=card, at_s=1.0)] if how == "failed" else []
    refused = np.zeros(SITE.n_cards, dtype=bool)
    refused[card] = how == "refused"
    plant, state = belief(SITE, [], 5.0, faults)
    plant.power_off_hosts([h for h in range(N_H) if h not in (12, 13)])
    cfg = ControlConfig(host_reserve_per_supernode=1, idle_reserve_cards=0, host_off_after_s=30.0)
    ctl = Controller(SITE, cfg)
    on: list[list[int]] = []
    for t in range(6, 61):
        plant.step(1.0)
        state.update(plant.readings())
        if t % 15 == 0:
            snap = state.snapshot()
            assert not snap.card_low_power[card]  # it reads awake throughout
            d = ctl.step(snap, float(t), refused_failed=refused)
            assert d.host_off is not None
            on.append(np.flatnonzero(~d.host_off).tolist())
    assert on == [[12, 13], [12, 13], [12], [12]]  # first seen idle at 15 s: off at 45 s


def test_the_cards_of_jobs_due_soon_are_spread_over_the_supernodes_rounding_up() -> None:
    """17 cards due within a boot on a site of two supernodes: 9 per supernode (not 8: 16 < 17), two
    hosts of 8 cards each, all hosts off before and no reserve."""
    site = SITE.with_supernodes(2)
    n_h = site.n_hosts
    choice = choose_hosts_off(
        site,
        now_s=10_000.0,
        host_busy_last_s=np.zeros(n_h),
        card_busy=np.zeros(site.n_cards, dtype=bool),
        host_off_now=np.ones(n_h, dtype=bool),
        host_awake=np.zeros(n_h, dtype=bool),
        frozen_host=np.zeros(n_h, dtype=bool),
        off_after_s=600.0,
        reserve_per_supernode=0,
        due_cards=17,
    )
    on = np.flatnonzero(~choice.host_off)
    assert on.size == 4 and (on < n_h // 2).sum() == 2  # two hosts per supernode
    assert choice.powering_on.sum() == 4 and not choice.powering_off.any()


def host_cards(*hosts: int) -> np.ndarray:
    """A per-card mask of the cards of ``hosts``."""
    mask = np.zeros(SITE.n_cards, dtype=bool)
    for h in hosts:
        mask[h * CPH : (h + 1) * CPH] = True
    return mask


def test_a_card_waits_for_its_hosts_boot_a_whole_one_while_it_is_off_the_rest_of_one_a_decision_started() -> None:
    boot_s = SITE.rack.host_boot_s
    assert boot_s == 300.0
    times = HostTimes(SITE)
    none_off = np.zeros(SITE.n_cards, dtype=bool)
    np.testing.assert_array_equal(times.card_wait_s(none_off, 0.0), np.zeros(SITE.n_cards))
    wait = times.card_wait_s(host_cards(3), 0.0)
    assert wait is not None and wait[host_cards(3)].tolist() == [boot_s] * CPH and not wait[~host_cards(3)].any()
    times.commit(none_off, None, none_off, 0.0)  # every host idle since t = 0
    # a decision at t = 1,000 s powers host 3 on (reported off, on after the decision): its boot ends at 1,300 s
    times.commit(none_off, np.zeros(N_H, dtype=bool), host_cards(3), 1_000.0)
    assert times.up_at_s[3] == 1_300.0 and times.up_at_s[4] == -np.inf
    assert times.busy_last_s[3] == 1_000.0  # just powered on: not due to go off again
    assert times.busy_last_s[4] == 0.0
    wait = times.card_wait_s(none_off, 1_100.0)  # reported on now, still booting
    assert wait is not None and set(wait[host_cards(3)]) == {200.0} and not wait[~host_cards(3)].any()
    wait = times.card_wait_s(none_off, 1_400.0)
    assert wait is not None and not wait.any()
    # a host a decision keeps off does not boot
    times.commit(none_off, np.isin(np.arange(N_H), [4]), host_cards(4), 1_050.0)
    assert times.up_at_s[4] == -np.inf and times.busy_last_s[4] == 0.0
    # a later decision while it boots does not start the boot again
    times.commit(none_off, np.zeros(N_H, dtype=bool), host_cards(3), 1_100.0)
    assert times.up_at_s[3] == 1_300.0
    # hosts not managed: no wait
    assert HostTimes(small_site()).card_wait_s(np.zeros(32, dtype=bool), 0.0) is None


def test_host_times_record_the_last_busy_time_and_a_clock_step_back_bounds_them() -> None:
    times = HostTimes(SITE)
    assert np.isnan(times.busy_last_s).all()
    busy = host_cards(0, 1)
    times.commit(busy, None, np.zeros(SITE.n_cards, dtype=bool), 500.0)  # first seen: every host at 500 s
    assert (times.busy_last_s == 500.0).all()
    assert (times.up_at_s == -np.inf).all()  # a decision that says nothing of hosts starts no boot
    times.commit(host_cards(1), None, np.zeros(SITE.n_cards, dtype=bool), 800.0)
    assert times.busy_last_s[:3].tolist() == [500.0, 800.0, 500.0]
    times.commit(host_cards(1), np.zeros(N_H, dtype=bool), host_cards(5), 900.0)  # host 5 boots
    assert times.up_at_s[5] == 1_200.0
    times.clock_went_back(100.0)  # a boot lasts at most a boot from now; nothing was busy after now
    assert times.up_at_s[5] == 400.0
    assert (times.busy_last_s <= 100.0).all()
    fresh = HostTimes(SITE)
    fresh.clock_went_back(100.0)
    assert np.isnan(fresh.busy_last_s).all()  # never seen stays never seen


def test_a_job_picked_to_start_ahead_of_a_reservation_boots_the_off_host_it_needs() -> None:
    """Job big (24 cards) holds a reservation for the end of a (16 cards, ~3,000 s); small (8 cards,
    ~100 s) would end long before it, so the backfilling picks it, but the only free cards are on a
    host that went off, which the placement does not offer. That host is now powered on at once, small
    placed on it at the next decision and computing once it has booted (was: counted as starting no
    earlier than big's reservation, so no host was booted for it, and it waited for r's cards)."""
    data: dict[str, Any] = read_toml(SITE_FILE)
    data.update(name="small-2x16-hosts", racks_per_supernode=2, torus_dims=[4, 4, 2])
    data["rack"] = {**data["rack"], "host_overhead_w": 2200.0, "hosts_per_rack": 2, "power_limit_w": 12500.0}
    site = site_from_dict(data, source="2 racks of 2 hosts of 8 cards")
    jobs = [
        job("a", 16, work_steps=3000.0),
        job("r", 8, work_steps=1400.0),
        job("big", 24, submit_s=200.0),
        job("small", 8, work_steps=100.0, submit_s=400.0),
    ]
    plant = Plant(site, jobs, [], PlantConfig(seed=7, placement="external", external_timeout_s=1e6))
    cfg = ControlConfig(
        period_s=5.0,
        idle_reserve_cards=0,
        host_off_after_s=30.0,
        host_reserve_per_supernode=0,
        placement_backfill_wait_s=60.0,  # big holds its reservation from 260 s
    )
    placed: dict[str, float] = {}
    waits: dict[str, str] = {}

    def note(d: Decision, r: ApplyReport) -> None:
        placed.update((jid, d.time_s) for jid in r.placed if jid not in placed)
        if "small" in d.queue_waits and not waits:  # the first decision that sees small queued
            waits.update((jid, w.kind) for jid, w in d.queue_waits.items())

    loop = ClosedLoop(plant, Controller(site, cfg), on_decision=note)
    loop.run(399.0)
    assert int(plant.truth().host_off.sum()) == 1 and "big" not in placed
    loop.run(site.rack.host_boot_s + 60.0)
    assert waits["small"] == "no_window" and waits["big"] == "reservation" and "big" not in placed
    assert placed.get("small", math.inf) <= 420.0, placed
    started = {rec.job_id: rec.compute_start_s for rec in plant.job_records()}
    assert started["small"] is not None and started["small"] <= 400.0 + site.rack.host_boot_s + 20.0, started


def test_the_hosts_of_a_blind_rack_keep_their_state_and_the_cards_of_hosts_going_off_sleep() -> None:
    """``Controller.with_hosts``: every host idle for longer than ``host_off_after_s`` goes off (no
    reserve of hosts), but those of a rack the agent cannot see (blind: r0, hosts 0-7) keep their state,
    on here (its telemetry cannot be trusted, and it takes no job). The cards of the hosts going off
    are put in low-power idle with them, the ready reserve's awake ones included."""
    cfg = ControlConfig(host_off_after_s=30.0, host_reserve_per_supernode=0)
    ctl = Controller(SITE, cfg)
    plant, state = belief(SITE, [], 10.0)
    ctl.step(state.snapshot(), 10.0)  # every host idle since 10 s
    for _ in range(90):
        plant.step(1.0)
        state.update(plant.readings())
    snap = state.snapshot()
    ctx = dataclasses.replace(ctl.context(snap, 100.0), blind_racks=(0,))
    proposal = ctl.propose(snap, ctx)
    assert not proposal.card_low_power[8 * CPH :].all()  # the ready reserve's cards, awake
    d = ctl.with_hosts(proposal, snap, ctx)
    assert d.host_off is not None
    assert not d.host_off[:8].any() and d.host_off[8:].all()
    assert d.card_low_power[8 * CPH :].all()


def test_a_decision_that_switches_hosts_says_how_many_are_off_going_off_and_coming_back() -> None:
    """The explanation line a decision that switches hosts carries (``racktwin journal`` shows it)."""
    all_on = choose_hosts_off(
        SITE,
        now_s=10_000.0,
        host_busy_last_s=np.zeros(N_H),
        card_busy=np.zeros(SITE.n_cards, dtype=bool),
        host_off_now=np.zeros(N_H, dtype=bool),
        host_awake=np.zeros(N_H, dtype=bool),
        frozen_host=np.zeros(N_H, dtype=bool),
        off_after_s=600.0,
        reserve_per_supernode=2,
    )
    assert all_on.note() == f"hosts: {N_H - 2} off ({N_H - 2} powering off, 0 on again)"
    was_off = np.ones(N_H, dtype=bool)
    was_off[[9, 40]] = False  # two on; a reserve of 5 hosts (40 cards): host 40 holds 8, 4 come back
    busy = host_cards(9)  # host 9 is taken by a job: it holds none of the reserve
    back = choose_hosts_off(
        SITE,
        now_s=10_000.0,
        host_busy_last_s=np.zeros(N_H),
        card_busy=busy,
        host_off_now=was_off,
        host_awake=np.zeros(N_H, dtype=bool),
        frozen_host=np.zeros(N_H, dtype=bool),
        off_after_s=600.0,
        reserve_per_supernode=5,
    )
    assert back.note() == f"hosts: {N_H - 2 - 4} off (0 powering off, 4 on again)"


def test_hosts_used_equally_recently_come_back_in_host_order() -> None:
    """Ties in the last use (the hosts of one job end together) go to the lowest host first, the same
    on every machine: numpy's default sort leaves the order of ties to its implementation (a SIMD sort
    on some CPUs), so the hosts a decision powers on would differ between machines."""
    last = np.zeros(N_H)
    last[[5, 17, 40, 63]] = 9_000.0  # used together most recently
    off = choose(host_off_now=np.ones(N_H, dtype=bool), host_busy_last_s=last, reserve_per_supernode=3)
    assert np.flatnonzero(~off).tolist() == [5, 17, 40]
    off = choose(host_off_now=np.ones(N_H, dtype=bool), host_busy_last_s=last, reserve_per_supernode=5)
    assert np.flatnonzero(~off).tolist() == [0, 5, 17, 40, 63]
