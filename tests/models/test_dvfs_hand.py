"""DVFS + idle on small cases whose optimum is derived by hand (explained in each test).

Power and temperatures are the twin's (computed in the test with twin functions); the reasoning
about which choice is optimal is ours. Common fact used throughout: with the default prices a
card-hour of training is worth 2.0 and a kWh costs 0.10, so one level down (about -5% throughput
= -0.1/h per card) is never paid for by its energy saving (about 60 W = 0.006/h per card): the
optimum runs every compute job at the fastest level the caps allow.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from models_helpers import card_die_c, card_power_w, job, judge, problem, rack_cards

from models.dvfs_solver import DvfsSolver
from models.plans import SolveStatus
from models.solve import greedy_cycle, plan_cycle
from twin.cooling import facility_cooling
from twin.power import PowerModel
from twin.spec import SiteSpec
from twin.steady import card_steady_power_w, site_steady_state
from twin.thermal import ThermalParams
from twin.workload import Phase, compute_utilization, relative_throughput

pytestmark = pytest.mark.models

HOST_W = 8800.0


def test_single_job_runs_at_fastest_level_under_the_rack_cap(site: SiteSpec) -> None:
    # 64 cards of one job fill rack r0: rack power = host + 64 P(k). At the top level that is
    # ~50.4 kW > 49 kW (limit 50 kW - 1 kW margin), so the optimum is the fastest k with
    # host + 64 P(k) <= 49 kW.
    p = problem(site, [job("a", 64, share=0.95)], [rack_cards(0)], options=[30.0])
    power = [HOST_W + 64 * card_power_w(site, 0.95, 0.5, k, 30.0) for k in range(8)]
    expected = next(k for k in range(8) if power[k] <= 49_000.0)
    assert expected == 1  # the cap binds: the test is about something
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL
    assert plan.dvfs is not None
    assert int(plan.dvfs.job_level[0]) == expected
    rack_w, _ = judge(p, plan.dvfs, 30.0)
    assert rack_w[0] == pytest.approx(power[expected], rel=1e-9)


def test_priority_decides_who_keeps_the_top_clock(site: SiteSpec) -> None:
    # Jobs H (priority 3) and L (priority 1), 32 cards each, share rack r0. The rack's cap is set to
    # exactly host + 32 P(0) + 32 P(2) (+1 W). Feasible pairs (H, L) with a top clock in them:
    #   (0, 2) and (2, 0) use that power exactly; (0, 1) and (1, 0) need 32 (P(1) - P(2)) ~ 1.9 kW more.
    #   (1, 1) fits too (P(0) - P(1) > P(1) - P(2): power is convex in the level).
    # Value per hour ~ 2.0 * (3 * 32 * tp(H) + 32 * tp(L)), tp(0) = 1, tp(1) = 0.947, tp(2) = 0.894 at
    # share 0.95: (0, 2) -> 124.6 x 2.0, (1, 1) -> 121.2 x 2.0, (2, 0) -> 117.8 x 2.0. The energy
    # difference of these is < 0.01/h. So the optimum is H at 0, L at 2.
    tp = [float(relative_throughput(0.95, site.card.clocks_mhz[k] / site.card.clocks_mhz[0])) for k in range(8)]
    assert 3 * tp[0] + tp[2] > 4 * tp[1] > 3 * tp[2] + tp[0]
    p_k = [card_power_w(site, 0.95, 0.5, k, 30.0) for k in range(8)]
    cap = HOST_W + 32 * p_k[0] + 32 * p_k[2] + 1.0
    limits = np.full(8, 50_000.0)
    limits[0] = cap + 1000.0
    p = problem(
        site,
        [job("H", 32, share=0.95, priority=3.0), job("L", 32, share=0.95, priority=1.0)],
        [rack_cards(0, 32), rack_cards(0, 32, start=32)],
        limit_w=limits,
        options=[30.0],
    )
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None
    assert plan.dvfs.job_level.tolist() == [0, 2]
    # the same answer by brute force over all 64 level pairs (value of throughput, caps by the twin's powers)
    best = max(
        (
            (3 * 32 * tp[h] + 32 * tp[lo], h, lo)
            for h, lo in itertools.product(range(8), range(8))
            if HOST_W + 32 * (p_k[h] + p_k[lo]) <= cap
        ),
    )
    assert (best[1], best[2]) == (0, 2)


def test_jobs_without_clock_sensitive_work_take_their_cheapest_level(site: SiteSpec) -> None:
    # A job in CHECKPOINT or WAITING (cards idle, u = 0) or COMMUNICATION (u = the phase model's
    # communication utilization, 0.2) does no work whose speed depends on the clock: any level gives
    # the same throughput (none this cycle), so the best level is the one with the least power. At
    # u = 0 a card draws idle_w V^2 + leak V (T - T_ref): least at the lowest voltage, which levels
    # 5..7 share (0.851 V), so any of them; at u = 0.2 the switching power (f V^2) makes level 7 the
    # only cheapest. The COMPUTE job, far from any cap, runs at the top clock. The plan's rack power
    # is checked against the twin's steady state at those utilizations, typed in here (the check was
    # against the model's own power table, which took the phases' utilizations from the same code:
    # a CHECKPOINT or WAITING job planned as if its cards were busy passed).
    from twin.workload import PhaseModel

    phases = [Phase.CHECKPOINT, Phase.COMMUNICATION, Phase.WAITING, Phase.COMPUTE]
    jobs = [job(f"j{i}", 16) for i in range(4)]
    p = problem(site, jobs, [rack_cards(1, 16, 16 * i) for i in range(4)], phases, options=[30.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None
    assert plan.source == "milp"  # the MILP's own plan, not the greedy one kept as better
    voltages = np.asarray(site.card.voltages_v)
    assert np.flatnonzero(voltages == voltages.min()).tolist() == [5, 6, 7]
    assert int(plan.dvfs.job_level[0]) in (5, 6, 7)  # checkpoint: u = 0
    assert int(plan.dvfs.job_level[1]) == 7  # communication: u > 0, so the slowest clock is cheapest
    assert int(plan.dvfs.job_level[2]) in (5, 6, 7)  # waiting: u = 0
    assert int(plan.dvfs.job_level[3]) == 0  # compute, far from any cap: top clock
    u_comm = PhaseModel().communication_utilization
    assert u_comm == 0.2
    clocks = np.asarray(site.card.clocks_mhz)
    u_compute = float(compute_utilization(0.95, clocks[0] / clocks[0], 0.5))  # job(): share 0.95, nu 0.5
    u = np.zeros(site.n_cards)
    u[64 + 16 : 64 + 32] = u_comm
    u[64 + 48 : 64 + 64] = u_compute
    twin = site_steady_state(
        site,
        level=plan.dvfs.card_level,
        utilization=u,
        supply_temp_c=30.0,
        ambient_c=25.0,
        low_power=plan.dvfs.card_low_power,
    )
    np.testing.assert_allclose(plan.dvfs.rack_power_w, twin.rack_power_w, rtol=1e-9)
    # and no level draws less than the plan's for the three jobs without clock-sensitive work
    r = float(ThermalParams.from_site(site).r_total_k_per_w[0])
    model = PowerModel.from_card(site.card)
    levels = np.arange(8)
    for j, uj in ((0, 0.0), (1, u_comm), (2, 0.0)):
        per_level, _ = card_steady_power_w(model, levels, np.full(8, uj), np.zeros(8, dtype=bool), 30.0, r)
        chosen = int(plan.dvfs.job_level[j])
        assert per_level[chosen] == pytest.approx(per_level.min(), rel=1e-12)
        assert twin.card_power_w[64 + 16 * j] == pytest.approx(per_level[chosen], rel=1e-9)


def test_idle_cards_sleep_except_the_ready_reserve_placed_where_there_is_room(site: SiteSpec) -> None:
    # One 64-card job in r0, 448 idle cards in r1..r7. An awake idle card draws ~8.5 W more than one
    # in low-power idle and earns nothing, so exactly the reserve (10) stays awake. Racks r1..r7 get
    # a limit that leaves no room to wake a single card, except r5: all 10 awake cards must be in r5.
    from models.problem import dvfs_tables

    p0 = problem(site, [job("a", 64, share=0.8)], [rack_cards(0)], reserve=10, options=[30.0])
    t = dvfs_tables(p0)
    limits = t.rack_base_w + 1000.0 + 1.0  # base = host + idle cards in low power; +margin +1 W
    limits[0] = 50_000.0
    limits[5] = 50_000.0
    p = problem(site, [job("a", 64, share=0.8)], [rack_cards(0)], reserve=10, limit_w=limits, options=[30.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None
    assert plan.dvfs.rack_awake.tolist() == [0, 0, 0, 0, 0, 10, 0, 0]
    assert int(plan.dvfs.card_low_power.sum()) == 448 - 10
    rack_w, _ = judge(p, plan.dvfs, 30.0)
    assert np.all(rack_w <= limits - 1000.0 + 1e-6)
    # the reserve is awake at the slowest clock, its least power. By hand (R = 0.03 + 0.023 K/W at a
    # 30 deg C supply, P = (P_ref + k (30 - 42)) / (1 - k R)): awake at level 7 (0.851 V), u = 0:
    # (84.5 x 0.851^2 - 0.47 x 0.851 x 12) / (1 - 0.47 x 0.851 x 0.053) = 57.617 W; asleep:
    # (52.8 - 0.4 x 12) / (1 - 0.4 x 0.053) = 49.040 W: 8.577 W more per awake card (at level 0 it
    # would be ~32 W). r5 and r6 hold the same 64 idle cards, r6 all asleep.
    assert rack_w[5] - rack_w[6] == pytest.approx(10 * 8.577, abs=0.02)
    # and the model plans with that cost of waking a card (the limits above leave room for none)
    np.testing.assert_allclose(t.rack_wake_w[1:], 8.577, atol=0.002)


def test_die_limit_excludes_the_levels_that_would_overheat(site: SiteSpec) -> None:
    # At a 45 deg C supply the hottest level-0 card reaches T0 and a level-1 card T1 < T0. With the
    # die limit (slowdown 87 - margin) set between them, level 0 is forbidden although the rack has
    # room (limit 100 kW): the job runs at level 1.
    t0, t1 = (card_die_c(site, 0.95, 0.5, k, 45.0) for k in (0, 1))
    margin = 87.0 - (t0 + t1) / 2.0
    p = problem(
        site, [job("a", 64, share=0.95)], [rack_cards(2)], limit_w=100_000.0, die_margin_k=margin, supply_c=45.0,
        options=[45.0],
    )  # fmt: skip
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None
    assert int(plan.dvfs.job_level[0]) == 1
    _, die = judge(p, plan.dvfs, 45.0)
    assert float(die.max()) <= 87.0 - margin


def test_setpoint_with_least_facility_power_is_chosen(site: SiteSpec) -> None:
    # Light load (two 64-card jobs at share 0.8, far below every cap): every set-point keeps the
    # jobs at the top clock, so throughput is the same and, without a PUE penalty, the best
    # set-point is the one with the least facility power for the resulting IT power (leakage rises
    # with the supply temperature, chiller power falls). Checked with twin.cooling.facility_cooling
    # at every option.
    from models.problem import Prices

    jobs, cards = [job("a", 64, share=0.8), job("b", 64, share=0.8)], [rack_cards(0), rack_cards(1)]
    p = problem(site, jobs, cards, ambient_c=28.0, prices=Prices(pue_penalty_per_kwh=0.0))
    plan = plan_cycle(p, time_limit_s=10.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.dvfs is not None
    assert plan.dvfs.job_level.tolist() == [0, 0]
    facility = {}
    it = {}
    for s in site.facility.supply_temp_options_c:
        rack_w, _ = judge(p, plan.dvfs, s)
        it[s] = float(rack_w.sum())
        facility[s] = facility_cooling(site, it[s], s, 28.0).facility_power_w
    best = min(facility, key=lambda s: facility[s])
    assert plan.supply_temp_c == best
    assert plan.dvfs.facility_power_w == pytest.approx(facility[best], rel=1e-6)

    # With the default PUE penalty (a soft PUE target), the choice maximizes energy cost + penalty
    # as the twin computes them: value is the same at every option, so it minimizes
    # energy price x F + PUE penalty x max(0, F - 1.08 IT) (per kWh), F and IT those of the same
    # levels and idle states as above.
    p2 = problem(site, jobs, cards, ambient_c=28.0)
    plan2 = plan_cycle(p2, time_limit_s=10.0)
    assert plan2.dvfs is not None
    assert plan2.dvfs.job_level.tolist() == [0, 0]
    assert plan2.dvfs.rack_awake.tolist() == plan.dvfs.rack_awake.tolist()
    prices = Prices()

    def cost(s: float) -> float:
        over_w = max(0.0, facility[s] - site.pue_target * it[s])
        return prices.energy_price_per_kwh * facility[s] + prices.pue_penalty_per_kwh * over_w

    assert plan2.supply_temp_c == min(facility, key=cost)


def test_failed_cards_count_at_low_power_idle_in_their_racks_cap(site: SiteSpec) -> None:
    # Rack r0: job a on its first 56 cards, its last 8 cards failed. A failed card runs nothing and
    # is commanded to low-power idle: 49.040 W at a 30 deg C supply (see the reserve test above), so
    # the rack draws host + 56 P(k) + 8 x 49.04 W at level k. The limit is set so that level 1 misses
    # the cap by 100 W, which only the failed cards' 392 W decide: the optimum is level 2.
    from models.problem import Margins, make_problem

    model = PowerModel.from_card(site.card)
    r = ThermalParams.from_site(site).r_total_k_per_w[:1]
    lp_w = float(card_steady_power_w(model, np.array([7]), np.zeros(1), np.array([True]), 30.0, r)[0][0])
    assert lp_w == pytest.approx(49.040, abs=0.002)
    power = [HOST_W + 56 * card_power_w(site, 0.95, 0.5, k, 30.0) + 8 * lp_w for k in range(8)]
    limits = np.full(8, 50_000.0)
    limits[0] = power[1] - 100.0 + 1000.0  # + the 1 kW margin
    failed = np.zeros(site.n_cards, dtype=bool)
    failed[56:64] = True
    p = make_problem(
        site,
        jobs=[job("a", 56, share=0.95)],
        job_cards=[rack_cards(0, 56)],
        failed=failed,
        rack_limit_w=limits,
        margins=Margins(1000.0, 2.0),
        supply_temp_c=30.0,
        ambient_c=25.0,
        ready_reserve_cards=0,
        supply_options_c=[30.0],
    )
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.source == "milp" and plan.dvfs is not None
    assert int(plan.dvfs.job_level[0]) == 2
    rack_w, _ = judge(p, plan.dvfs, 30.0)
    assert rack_w[0] == pytest.approx(power[2], rel=1e-9)
    assert rack_w[0] <= limits[0] - 1000.0


def test_a_ready_reserve_larger_than_the_idle_cards_wakes_them_all(site: SiteSpec) -> None:
    # One 64-card job in r0, 448 idle cards in r1..r7, far below every cap. A reserve of 1,000 awake
    # cards cannot be met by 448 idle cards: the reserve is what there is, all 448 awake (64 per
    # rack), and the problem is not infeasible for it.
    p = problem(site, [job("a", 64, share=0.8)], [rack_cards(0)], reserve=1000, options=[30.0])
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.source == "milp" and plan.dvfs is not None
    assert plan.dvfs.rack_awake.tolist() == [0] + [64] * 7
    assert int(plan.dvfs.card_low_power.sum()) == 0
    assert int(plan.dvfs.job_level[0]) == 0


@pytest.mark.parametrize(
    ("energy_price", "pue_penalty", "expected"),
    [(0.10, 0.20, 0), (1.5, 0.0, 3), (0.10, 50.0, 4)],
)
def test_energy_price_and_pue_penalty_slow_a_job_exactly_as_far_as_it_pays(
    site: SiteSpec, energy_price: float, pue_penalty: float, expected: int
) -> None:
    # One 64-card job in r0 under a 100 kW limit (no cap binds), no idle card awake, 35 deg C ambient:
    # the facility's power is affine in IT power here (chiller regime, slope b = 1.159 > PUE target
    # 1.08), so each W of IT costs energy_price x b and, above the PUE target, pue_penalty x (b - 1.08).
    # One level down gives up ~0.1/h of value per card and saves ~60 W. The best level, by brute
    # force over the 8 levels with the twin's own assessment (throughput value - energy cost - PUE
    # penalty): the top clock at the default prices; level 3 when a kWh costs 1.5; level 4 when each
    # kWh above the PUE target costs 50. The MILP must find the same, and its objective is minus the
    # loss against the top clock's value (2.0 x 64 = 128/h), the scale its relative gap is taken on.
    from models.plans import assess_dvfs
    from models.problem import Prices, dvfs_tables, facility_line, it_power_range_w

    prices = Prices(energy_price_per_kwh=energy_price, pue_penalty_per_kwh=pue_penalty)
    p = problem(site, [job("a", 64)], [rack_cards(0)], limit_w=100_000.0, ambient_c=35.0, options=[30.0], prices=prices)
    t = dvfs_tables(p)
    line = facility_line(site, 30.0, 35.0, *it_power_range_w(p, t))
    assert line.b == pytest.approx(1.159, abs=1e-3) and line.max_error_w < 1.0
    asleep = np.zeros(8, dtype=np.int64)
    by_level = [assess_dvfs(p, np.array([k]), asleep, 30.0).objective_per_h for k in range(8)]
    assert int(np.argmax(by_level)) == expected
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.source == "milp" and plan.dvfs is not None
    assert int(plan.dvfs.job_level[0]) == expected
    assert plan.dvfs.objective_per_h == pytest.approx(by_level[expected], rel=1e-9)
    info, level, _awake = DvfsSolver(persistent=False).solve(p, t, line, 5.0, 1e-6)
    assert level is not None and int(level[0]) == expected
    assert info.objective == pytest.approx(by_level[expected] - 128.0, abs=0.01)
    if pue_penalty == 0.0:  # the greedy prices energy only (models.heuristic): one job, it finds the optimum too
        greedy = greedy_cycle(p, choose_setpoint=False)
        assert greedy.dvfs is not None and int(greedy.dvfs.job_level[0]) == expected


def test_jobs_without_clock_sensitive_work_stay_at_their_cheapest_level_when_it_power_pays(site: SiteSpec) -> None:
    # At 10 deg C ambient the facility's slope b = 1.025 W per IT W is below the PUE target 1.08: each
    # IT W lowers the facility power above the target by 0.055 W. With a PUE penalty of 5/kWh (above
    # the bound Prices documents, energy price x b / (1.08 - b) = 1.86) that earns 0.275/kWh against
    # 0.1025/kWh of energy: IT power pays for itself, and a job free to choose its level with no
    # throughput to gain would take its most power-hungry one. Jobs in CHECKPOINT, COMMUNICATION or
    # WAITING are pinned at their cheapest level (5..7 at u = 0, 7 at u = 0.2) whatever the prices.
    from models.problem import Prices, dvfs_tables, facility_line, it_power_range_w

    phases = [Phase.CHECKPOINT, Phase.COMMUNICATION, Phase.WAITING, Phase.COMPUTE]
    jobs = [job(f"j{i}", 16) for i in range(4)]
    prices = Prices(pue_penalty_per_kwh=5.0)
    p = problem(
        site, jobs, [rack_cards(1, 16, 16 * i) for i in range(4)], phases, ambient_c=10.0, options=[30.0], prices=prices
    )
    t = dvfs_tables(p)
    assert facility_line(site, 30.0, 10.0, *it_power_range_w(p, t)).b == pytest.approx(1.025, abs=1e-3)
    plan = plan_cycle(p, choose_setpoint=False, time_limit_s=5.0)
    assert plan.status == SolveStatus.OPTIMAL and plan.source == "milp" and plan.dvfs is not None
    assert plan.dvfs.job_level.tolist()[:3] == t.cheapest_level.tolist()[:3]
    assert int(plan.dvfs.job_level[0]) in (5, 6, 7) and int(plan.dvfs.job_level[1]) == 7
    assert int(plan.dvfs.job_level[3]) == 0
