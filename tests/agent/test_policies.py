"""The comparison policies of ``racktwin evaluate`` (``agent.policies``).

What users rely on: static-cap is the per-card limit that fits a full rack under its limit; the
reactive capper lowers a rack's limits above its high band, holds between the bands and raises them
below the low band, on measured power only; greedy is the agent's own controller planning greedily;
racktwin is the agent's controller with the agent's default configuration.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import pytest
from agent_helpers import example_site, small_site
from evaluate_helpers import full_load_scenario, mixed_scenario
from guard_helpers import proposal
from readings_testing import cards_of

from agent.config import ControlConfig, PricesConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.evaluate import _plant_for, run_policy
from agent.loop import ApplyReport
from agent.policies import AgentPolicy, GreedyController, ReactivePolicy, StaticCapPolicy, make_policy, static_cap_w
from twin.faults import CardFailure, StuckSensor
from twin.plant import Plant, PlantConfig
from twin.plant_types import SensorNoise
from twin.scenario import build_plant
from twin.workload import JobSpec

FloatArray = npt.NDArray[np.float64]

pytestmark = pytest.mark.agent


def test_the_static_cap_fits_a_full_rack_under_its_limit_with_the_agents_margin() -> None:
    site = example_site()
    cap = static_cap_w(site)
    assert cap == np.floor((50_000.0 - 1_000.0 - 8_800.0) / 64)  # 628 W
    assert 64 * cap + site.rack.host_overhead_w <= site.rack.power_limit_w - ControlConfig().rack_margin_w
    plant = build_plant(full_load_scenario(60.0))
    policy = make_policy("static-cap", plant.site)
    policy.bind(plant)
    assert np.all(cards_of(plant.readings().racks[0]).power_limit_w == static_cap_w(plant.site))


def test_the_reactive_capper_caps_above_the_high_band_and_uncaps_below_the_low_band() -> None:
    sc = full_load_scenario(300.0)
    plant = build_plant(sc)
    limit = sc.site.rack.power_limit_w
    assert float(plant.rack_power_w.max()) > limit  # the racks start over their limit (warm start)
    policy = ReactivePolicy(sc.site, 3.0)
    policy.bind(plant)
    powers: list[float] = []
    policy.run(300.0, lambda: powers.append(float(plant.rack_power_w.max())))
    # it holds the racks under their limit, but only reacts to what it measured: a job coming out of
    # a checkpoint (uncapped while its power was low) is over for a period or two before it caps
    runs, run = [], 0
    for p in powers:
        run = run + 1 if p > limit else 0
        runs.append(run)
    assert 0 < max(runs) <= 2 * 3
    assert sum(p > limit for p in powers) < 0.05 * len(powers)
    assert policy.stats.capping_actions > 0
    # when the load goes away the limits come back up toward the card's maximum
    plant2 = build_plant(full_load_scenario(60.0))
    p2 = ReactivePolicy(plant2.site, 3.0)
    p2.bind(plant2)
    plant2.set_power_limits(np.arange(plant2.n_cards), 300.0)  # capped hard: far below the low band
    p2.run(30.0, lambda: None)
    lim = np.concatenate([cards_of(r).power_limit_w for r in plant2.readings().racks])
    assert lim.min() > 300.0


def test_greedy_is_the_agents_controller_planning_greedily_and_racktwin_the_agents_defaults() -> None:
    site = small_site(2)
    greedy = make_policy("greedy", site)
    agent = make_policy("racktwin", site)
    assert isinstance(greedy, AgentPolicy) and isinstance(greedy.controller, GreedyController)
    assert isinstance(agent, AgentPolicy) and type(agent.controller) is Controller
    assert agent.controller.control == ControlConfig()
    p = PricesConfig()
    assert (agent.controller.prices.energy_price_per_kwh, agent.controller.prices.card_hour_value) == (
        p.energy_per_kwh,
        p.card_hour_value,
    )
    res = run_policy(full_load_scenario(120.0), "greedy")
    assert res.stats.decisions > 0 and res.metrics["limit_violation_s"] == 0.0


def test_decision_listeners_hear_every_decision_after_the_policys_count() -> None:
    sc = full_load_scenario(120.0)
    policy = make_policy("greedy", sc.site)
    assert isinstance(policy, AgentPolicy)
    heard: list[tuple[int, float, int]] = []
    policy.decision_listeners.append(
        lambda d, report: heard.append((policy.stats.decisions, d.time_s, len(report.refused)))
    )
    policy.bind(_plant_for(sc, policy))
    policy.run(120.0, lambda: None)
    assert len(heard) == policy.stats.decisions > 1
    assert [n for n, _t, _r in heard] == list(range(1, len(heard) + 1))  # the policy counted it first
    times = [t for _n, t, _r in heard]
    assert times == sorted(times)


def test_racktwin_leaves_placement_to_the_sites_scheduler_when_told_not_to_place() -> None:
    """With ``control_placement = false`` the plant's own scheduler places queued jobs at once (it used
    to wait ``external_timeout_s`` for placements the agent never sends)."""
    sc = mixed_scenario(900.0)
    timeout = sc.plant_config.external_timeout_s
    assert make_policy("racktwin", sc.site).placement == "external"
    told = make_policy("racktwin", sc.site, ControlConfig(control_placement=False))
    assert told.placement == "builtin"
    res = run_policy(sc, "racktwin", control=ControlConfig(control_placement=False))
    assert res.metrics["jobs_submitted"] > 0
    assert res.metrics["queue_wait_max_s"] < timeout / 2
    assert res.metrics["jobs_placed_by_plant"] == 0  # placed by the plant's scheduler, not its fallback


@pytest.mark.parametrize("policy", ["reactive", "racktwin"])
def test_policies_that_read_telemetry_read_it_at_the_scenarios_telemetry_period(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site whose telemetry comes every 20 s is evaluated on 20-s-old data, as the simulator would
    publish it: the plant is read at t = 0, 20, 40, ... and the policies act on the latest round; with
    telemetry every second (the day scenarios), at every plant step as before."""
    from twin.plant import Plant

    read_at: list[float] = []
    real = Plant.readings

    def counted(self: Plant) -> object:
        read_at.append(self.time_s)
        return real(self)

    monkeypatch.setattr(Plant, "readings", counted)
    slow = full_load_scenario(duration_s=120.0, telemetry_period_s=20.0)
    result = run_policy(slow, policy)
    assert sorted(set(read_at)) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    assert result.metrics["decisions"] > 0
    read_at.clear()
    run_policy(full_load_scenario(duration_s=120.0), policy)
    expected = list(range(0, 120)) if policy == "racktwin" else list(range(0, 120, 3))  # reactive acts every 3 s
    assert sorted(set(read_at)) == [float(t) for t in expected]


def _reactive_rack() -> tuple[Plant, ReactivePolicy]:
    """One 16-card rack (limit 12.5 kW): 15 cards computing at the top clock (the rack just over its
    capping threshold, limit - 0.5 kW), one idle; noise-free sensors: measured = true power."""
    site = small_site(1)
    jobs = [
        JobSpec(n, k, 1e7, 1.0, 0.97, checkpoint_interval_s=1e6, noncompute_utilization=0.9)
        for n, k in (("a", 8), ("b", 7))
    ]
    cfg = PlantConfig(seed=1, noise=SensorNoise.none(), placement="external", external_timeout_s=1e6)
    plant = Plant(site, jobs, [], cfg)
    plant.place_job("a", np.arange(8))
    plant.place_job("b", np.arange(8, 15))
    policy = ReactivePolicy(site, 3.0)
    policy.bind(plant)
    plant.run(90.0)  # past the jobs' start-up
    return plant, policy


def _rack_reading(plant: Plant) -> tuple[float, FloatArray, FloatArray]:
    """The rack's measured power, and its cards' power limits and powers."""
    (rr,) = plant.readings().racks
    assert rr.pdu is not None and rr.cards is not None
    return rr.pdu.power_w, np.asarray(rr.cards.power_limit_w), np.asarray(rr.cards.power_w)


def test_the_reactive_bands_cap_to_the_target_hold_between_and_raise_the_capped_cards_below() -> None:
    """The bands of the docstring on the small rack: capping threshold limit - 0.5 kW, target limit -
    1.5 kW, uncapping threshold limit - 3 kW."""
    plant, policy = _reactive_rack()
    limit, top = plant.site.rack.power_limit_w, plant.site.card.power_limit_w
    high, target, low = limit - 500.0, limit - 1500.0, limit - 3000.0
    # above the capping threshold: the busy cards' limits take the rack to the target, the cut split
    # by each card's power above the 200 W floor; the idle card keeps its limit
    p, lim, power = _rack_reading(plant)
    assert p > high
    busy = power > 200.0
    above = power[busy] - 200.0
    policy.act(plant)
    _p, new, _power = _rack_reading(plant)
    assert np.array_equal(new[busy], np.floor(np.minimum(lim, power)[busy] - (p - target) * above / above.sum()))
    assert np.all(new[~busy] == top) and (~busy).sum() == 1
    plant.run(10.0)
    settled, _lim, _power = _rack_reading(plant)
    assert low < settled <= target  # the DVFS levels land at or below the target, above the uncapping band
    # between the bands the limits hold, above the target and below it
    for card_limit_w in (640.0, 530.0):
        plant.set_power_limits(np.arange(16), card_limit_w)
        plant.run(10.0)
        p, lim, _power = _rack_reading(plant)
        assert low < p < high and (p > target) == (card_limit_w == 640.0)
        actions = policy.stats.capping_actions
        policy.act(plant)
        assert policy.stats.capping_actions == actions
        assert np.array_equal(_rack_reading(plant)[1], lim)
    # below the uncapping threshold: the capped cards (not those at the top limit) share the room up
    # to the target evenly
    limits = np.full(16, 380.0)
    limits[12:] = top
    plant.set_power_limits(np.arange(16), limits)
    plant.run(10.0)
    p, lim, _power = _rack_reading(plant)
    assert p < low
    policy.act(plant)
    _p, new, _power = _rack_reading(plant)
    assert np.all(new[:12] == np.floor(380.0 + (target - p) / 12))
    assert np.all(new[12:] == top)


def test_the_reactive_capper_acts_on_measured_power_only() -> None:
    """A rack whose readings are stuck between the bands while its true power goes over the limit: the
    capper sees nothing to do (the plant goes over, as a real capper's would)."""
    plant, policy = _reactive_rack()
    limit = plant.site.rack.power_limit_w
    plant.set_power_limits(np.arange(16), 640.0)
    plant.run(10.0)
    plant.add_fault(StuckSensor(rack=0, start_s=plant.time_s))
    stuck_p, _lim, _power = _rack_reading(plant)
    plant.set_power_limits(np.arange(16), plant.site.card.power_limit_w)
    plant.run(10.0)
    assert float(plant.truth().rack_power_w[0]) > limit - 500.0 > stuck_p
    actions = policy.stats.capping_actions
    policy.act(plant)
    assert policy.stats.capping_actions == actions


def test_static_cap_and_reactive_take_the_control_settings_the_docs_name() -> None:
    """``--control rack_margin_w`` / ``min_power_limit_w`` reach static-cap (its cap) and reactive (its
    floor); the baseline runs every card at the top clock and full power limit at the site's set-point."""
    site = example_site()
    wide = ControlConfig(rack_margin_w=2000.0)
    assert static_cap_w(site, wide) == np.floor((50_000.0 - 2_000.0 - 8_800.0) / 64)  # 612 W
    cap = make_policy("static-cap", site, wide)
    assert isinstance(cap, StaticCapPolicy) and cap.cap_w == static_cap_w(site, wide)
    reactive = make_policy("reactive", site, ControlConfig(min_power_limit_w=300.0))
    assert isinstance(reactive, ReactivePolicy) and reactive.min_limit_w == 300.0 and reactive.period_s == 3.0
    plant = build_plant(full_load_scenario(60.0))
    plant.set_levels(np.arange(plant.n_cards), 2)
    plant.set_power_limits(np.arange(plant.n_cards), 500.0)
    plant.set_supply_temp(40.0)
    make_policy("baseline", plant.site).bind(plant)
    tr = plant.truth()
    assert np.all(tr.level == 0) and tr.supply_setpoint_c == plant.site.facility.supply_temp_c
    lim = np.concatenate([cards_of(r).power_limit_w for r in plant.readings().racks])
    assert np.all(lim == plant.site.card.power_limit_w)


def test_fallbacks_count_the_decisions_whose_own_solve_fell_short_not_the_adjustments_after_one() -> None:
    """``fallbacks`` (docs/evaluation.md): racktwin's decisions whose solve was late, failed or
    infeasible (the greedy plan, relaxed racks, held settings). An incremental adjustment to a job event
    makes no solve and carries the plan status of the plan it adjusts: after a fallback every job event
    was counted as one more (examples/day-fault-pump.toml in process: 29 counted for 26 infeasible
    solves). A time-limited plan is not a fallback; greedy has no solver to fall back from."""
    sc = full_load_scenario(30.0)
    policy = make_policy("racktwin", sc.site)
    assert isinstance(policy, AgentPolicy)
    heard: list[tuple[Decision, ApplyReport]] = []
    policy.decision_listeners.append(lambda d, report: heard.append((d, report)))
    policy.bind(_plant_for(sc, policy))
    policy.run(30.0, lambda: None)
    d, report = heard[0]
    kinds = [
        ("milp", "optimal", 0),
        ("milp", "feasible", 0),
        ("milp", "infeasible", 1),
        ("greedy", "fallback", 1),
        ("hold", "error", 1),
        ("incremental", "fallback", 0),
        ("incremental", "infeasible", 0),
        ("incremental", "optimal", 0),
    ]
    greedy = make_policy("greedy", sc.site)
    assert isinstance(greedy, AgentPolicy)
    for source, plan_status, counted in kinds:
        before = policy.stats.fallbacks
        variant = d.replace(source=source, plan_status=plan_status)
        policy._on_decision(variant, report)
        greedy._on_decision(variant, report)
        assert policy.stats.fallbacks - before == counted, (source, plan_status)
    assert greedy.stats.fallbacks == 0


def test_the_reactive_capper_leaves_out_cards_failed_since_its_last_telemetry() -> None:
    """Telemetry every 20 s: a card that failed after the last round still reads healthy. The racks
    refuse commands to failed cards, so the capper leaves it out and caps the others (a command naming
    it was refused whole, and the rack stayed over its limit until the next round)."""
    plant, policy = _reactive_rack()
    top = plant.site.card.power_limit_w
    policy.telemetry_period_s = 20.0
    policy.bind(plant)  # t = 90 s: rounds at 90, 110, ...; it acts at 90, 93, ..., 108, 111
    policy.run(19.0, lambda: None)  # capped at 90 s, once: its acts at 93 .. 108 s see no new round
    assert policy.stats.capping_actions == 1
    plant.set_power_limits(np.arange(16), top)  # uncapped behind its back at 109 s: over the limit again
    policy.run(2.0, lambda: None)  # to t = 111 s, the round of 110 s read
    plant.add_fault(CardFailure(card=0, at_s=plant.time_s))
    actions = policy.stats.capping_actions
    policy.run(1.0, lambda: None)  # acts on the round of 110 s: card 0 still reads healthy
    assert policy.stats.refused_commands == 0 and policy.stats.capping_actions == actions + 1
    _p, lim, _power = _rack_reading(plant)
    assert np.all(lim[1:15] < top) and lim[0] == top


def test_the_report_notes_say_why_a_plan_fell_back() -> None:
    """The controllers' notes (metrics.json, the report's "What the controllers did"): a decision whose
    solve fell back to the greedy plan says why (``fallback: supply ... deg C: ...; greedy plan used``,
    models/solve.py), next to the ``fallbacks`` count. Here the shortest solve deadline leaves the first
    decision, which chooses among the set-points, less than a solve's least share (5 ms) per set-point.
    The notes kept guard, infeasible, relaxed and no-plan lines only: a fallback was counted, never
    explained."""
    sc = full_load_scenario(30.0)
    policy = make_policy("racktwin", sc.site, ControlConfig(solve_deadline_s=0.0101))
    assert isinstance(policy, AgentPolicy)
    heard: list[Decision] = []
    policy.decision_listeners.append(lambda d, _report: heard.append(d))
    policy.bind(_plant_for(sc, policy))
    policy.run(30.0, lambda: None)
    fell_back = [e for d in heard for e in d.explanation if e.startswith("fallback: ")]
    assert policy.stats.fallbacks > 0 and fell_back, [d.explanation for d in heard]
    # a note is the first line of its kind, with how many more of its kind followed
    notes = [
        re.sub(r" \(and \d+ more like it, the last at t=\d+ s\)$", "", n.split(": ", 1)[1]) for n in policy.stats.notes
    ]
    assert fell_back[0] in notes and all(n.endswith("; greedy plan used") for n in notes if n.startswith("fallback"))


def test_notes_count_repeats_of_one_kind_on_its_first_note_and_keep_room_for_other_kinds() -> None:
    """The notes (metrics.json, the report) keep the first note of each kind; a later one of its kind
    that differs only in a measured number (a late solve's time share, to three decimals) counts on
    it. 60 late solves, each with its own share, then a relaxed rack: the late solves are one note
    with their count, and the relaxed rack still gets its note. Each share made a note of its own
    before: the 40 notes were all late solves, and what followed was never told."""
    site = small_site()
    policy = AgentPolicy(site)
    late = (
        "fallback: supply 30 deg C: the solve was still running at the end of its {:.3f} s share of the time "
        "limit; greedy plan used"
    )
    for i in range(60):
        d = proposal(site, time_s=15.0 * (i + 1), explanation=("plan fallback (greedy)", late.format(0.3 + i / 1000)))
        policy._on_decision(d, ApplyReport())
    policy._on_decision(
        proposal(site, time_s=915.0, explanation=("relaxed: racks r0 left to the guard's caps",)), ApplyReport()
    )
    # whole numbers tell kinds apart: another set-point's late solve is a note of its own
    late_35 = late.replace("supply 30", "supply 35").format(0.5)
    guard = "guard: r1: 4 of 12 awake idle cards to low power for the cap"
    policy._on_decision(proposal(site, time_s=930.0, explanation=(late.format(0.5), late_35, guard)), ApplyReport())
    assert policy.stats.notes == [
        f"t=15 s: {late.format(0.3)} (and 60 more like it, the last at t=930 s)",
        "t=915 s: relaxed: racks r0 left to the guard's caps",
        f"t=930 s: {late_35}",
        f"t=930 s: {guard}",
    ]


def test_the_notes_keep_40_kinds_and_a_kind_past_them_is_left_out_repeats_included() -> None:
    """The notes keep at most 40 kinds (``_MAX_NOTES``): the 41st kind is left out, and so are its
    repeats; repeats of a kept kind still count on its own note once the notes are full."""
    site = small_site()
    policy = AgentPolicy(site)
    for i in range(41):  # whole numbers tell kinds apart: 41 kinds
        d = proposal(site, time_s=15.0 * (i + 1), explanation=(f"guard: rack {i}: capped",))
        policy._on_decision(d, ApplyReport())
    policy._on_decision(
        proposal(
            site, time_s=900.0, explanation=("guard: rack 40: capped", "guard: rack 0: capped", "guard: rack 5: capped")
        ),
        ApplyReport(),
    )
    notes = policy.stats.notes
    assert len(notes) == 40
    assert notes[0] == "t=15 s: guard: rack 0: capped (and 1 more like it, the last at t=900 s)"
    assert notes[5] == "t=90 s: guard: rack 5: capped (and 1 more like it, the last at t=900 s)"
    assert notes[1:5] + notes[6:] == [
        f"t={15 * (i + 1)} s: guard: rack {i}: capped" for i in (*range(1, 5), *range(6, 40))
    ]
