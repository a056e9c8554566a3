"""twin.scenario and twin.scenario_faults, audited against docs/sim.md ("Run-scenario files", "Fault
catalogue"): the documented defaults and the edges of every documented range, in the example site's
terms (8 racks r0..r7 of 64 cards, 8 DVFS levels, a 700-W card, 25 deg C ambient). Every value below is
read off the docs, not off the code."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from twin.faults import ConstantAmbient, DiurnalAmbient, SensorDropout, StuckSensor
from twin.plant import CardVariation, SensorNoise
from twin.scenario import BrokerDisconnect, RunScenario, build_plant, run_scenario_from_dict
from twin.spec import SiteSpec
from twin.tables import SpecError

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {"name": "audit", "duration_s": 600.0, "workload": {"source": "none"}}


def load(site: SiteSpec, change: dict[str, Any] | None = None, **overrides: Any) -> RunScenario:
    data = copy.deepcopy(BASE)
    data.update(change or {})
    return run_scenario_from_dict(data, source="day.toml", site=site, **overrides)


def refused(site: SiteSpec, change: dict[str, Any], **overrides: Any) -> str:
    with pytest.raises(SpecError) as info:
        load(site, change, **overrides)
    return str(info.value)


def disconnects(*windows: tuple[float, float]) -> dict[str, Any]:
    return {"faults": [{"kind": "broker_disconnect", "start_s": s, "duration_s": d} for s, d in windows]}


# ---- defaults (docs/sim.md: the top level, [plant] and [ambient] tables) ---------------------------


def test_a_minimal_scenario_gets_the_documented_defaults(site: SiteSpec) -> None:
    sc = load(site)
    assert sc.seed == 0 and sc.plant_config.seed == 0 and sc.telemetry_period_s == 1.0
    cfg = sc.plant_config
    assert cfg.placement == "external" and cfg.external_timeout_s == 120.0 and cfg.backfill_wait_s == 1800.0
    assert cfg.supply_time_constant_s == 120.0 and cfg.min_power_limit_w == 200.0 and cfg.pump_hold_s == 60.0
    assert cfg.initial_level == 0 and cfg.initial_low_power is False
    assert cfg.noise == SensorNoise() and cfg.variation == CardVariation()  # noise and spread on
    # [ambient] absent: diurnal, +-5 K around the site's 25 deg C, warmest at 15:00, a day long
    assert cfg.ambient == DiurnalAmbient(mean_c=25.0, amplitude_k=5.0, peak_time_s=54000.0, period_s=86400.0)
    assert sc.faults == () and sc.sim_faults == () and sc.warnings == ()


def test_an_ambient_section_without_its_temperature_takes_the_sites(site: SiteSpec) -> None:
    assert load(site, {"ambient": {"amplitude_k": 2.0}}).plant_config.ambient == DiurnalAmbient(25.0, 2.0)
    assert load(site, {"ambient": {"kind": "constant"}}).plant_config.ambient == ConstantAmbient(25.0)


# ---- the edges of the documented ranges ----------------------------------------------------------


@pytest.mark.parametrize(("period_s", "ok"), [(0.01, True), (3600.0, True), (0.009, False), (3600.5, False)])
def test_the_telemetry_period_is_from_a_hundredth_of_a_second_to_an_hour(
    site: SiteSpec, period_s: float, ok: bool
) -> None:
    if ok:
        assert load(site, {"telemetry_period_s": period_s}).telemetry_period_s == period_s
    else:
        assert refused(site, {"telemetry_period_s": period_s}).startswith("day.toml: telemetry_period_s: ")


def test_a_run_is_from_one_step_to_a_year_both_ends_included(site: SiteSpec) -> None:
    year_s = 365 * 86400.0
    assert load(site, {"duration_s": 1.0}).duration_s == 1.0
    assert load(site, {"duration_s": year_s}).duration_s == year_s
    assert load(site, duration_s=1.0).duration_s == 1.0 and load(site, duration_s=year_s).duration_s == year_s
    assert refused(site, {"duration_s": year_s + 1.0}).startswith("day.toml: duration_s: ")
    assert refused(site, {}, duration_s=0.99).startswith("day.toml: duration_s: ")


def test_overrides_replace_the_files_seed_duration_and_scale(site: SiteSpec) -> None:
    sc = load(site, {"seed": 5, "supernodes": 2}, seed=0, duration_s=60.0, supernodes=3)
    assert sc.seed == 0 and sc.plant_config.seed == 0  # seed 0 is a seed like any other
    assert sc.duration_s == 60.0 and sc.site.n_cards == 3 * 512
    assert refused(site, {}, seed=-1).startswith("day.toml: seed: ")


def test_plant_values_at_the_edge_of_the_card_are_accepted(site: SiteSpec) -> None:
    """``min_power_limit_w`` may equal the card's 700-W limit; ``initial_level`` may be the slowest of
    the card's 8 levels (7), not 8."""
    cfg = load(site, {"plant": {"min_power_limit_w": 700.0, "initial_level": 7}}).plant_config
    assert cfg.min_power_limit_w == 700.0 and cfg.initial_level == 7
    assert refused(site, {"plant": {"initial_level": 8}}).startswith("day.toml: plant.initial_level: ")
    assert refused(site, {"plant": {"min_power_limit_w": 700.5}}).startswith("day.toml: plant.min_power_limit_w: ")


def test_stalls_may_take_90_percent_of_a_computing_jobs_time_and_no_more(site: SiteSpec) -> None:
    """One 9-hour communication stall an hour (sigma 0, no input stalls) is 9 s of stalls per second of
    computing: 9 / (1 + 9) = 90%, the most allowed; 19 s per second (95%) is refused."""
    phases = {"comm_stalls_per_hour": 1.0, "input_stalls_per_hour": 0.0, "stall_sigma": 0.0}
    assert load(site, {"phases": {**phases, "comm_stall_median_s": 9 * 3600.0}}).plant_config.phases.stall_sigma == 0
    msg = refused(site, {"phases": {**phases, "comm_stall_median_s": 19 * 3600.0}})
    assert msg.startswith("day.toml: phases: stalls would take 95% ") and "at most 90%" in msg


# ---- [[faults]] (docs/sim.md, "Fault catalogue") ---------------------------------------------------


def test_a_fault_that_is_not_a_table_is_refused_at_its_index(site: SiteSpec) -> None:
    msg = refused(site, {"faults": [{"kind": "heat_wave", "start_s": 0, "peak_delta_k": 5}, 5]})
    assert msg.startswith("day.toml: faults[1]: expected a table"), msg


def test_the_last_rack_and_card_are_in_the_site_and_one_past_is_not(site: SiteSpec) -> None:
    sc = load(
        site,
        {
            "faults": [
                {"kind": "sensor_dropout", "rack": 7, "start_s": 0},
                {"kind": "sensor_dropout", "rack": "r7", "start_s": 0},
                {"kind": "sensor_dropout", "rack": "r0", "start_s": 0},
                {"kind": "card_failure", "card": 511, "at_s": 0},
                {"kind": "card_failure", "card": 0, "at_s": 0},
            ]
        },
    )
    assert [getattr(f, "rack", None) for f in sc.faults[:3]] == [7, 7, 0]
    assert refused(site, {"faults": [{"kind": "sensor_dropout", "rack": 8, "start_s": 0}]}) == (
        "day.toml: faults[0].rack: rack 8 is not in the site (0..7)"
    )
    assert refused(site, {"faults": [{"kind": "sensor_dropout", "rack": "r8", "start_s": 0}]}) == (
        "day.toml: faults[0].rack: rack 'r8' is not in the site (r0..r7)"
    )
    assert refused(site, {"faults": [{"kind": "card_failure", "card": 512, "at_s": 0}]}) == (
        "day.toml: faults[0].card: card 512 is not in the site (0..511)"
    )


@pytest.mark.parametrize(
    ("rack", "card", "ok"),
    [(0, 0, True), (0, 63, True), (1, 64, True), (7, 511, True), (0, 64, False), (1, 0, False), (1, 63, False),
     (1, 128, False)],
)  # fmt: skip
def test_a_stuck_card_must_be_in_the_rack_named(site: SiteSpec, rack: int, card: int, ok: bool) -> None:
    """Rack r holds cards r*64 .. r*64+63 (docs/sim.md); card 0 is no exception."""
    change = {"faults": [{"kind": "stuck_sensor", "rack": rack, "card": card, "start_s": 10}]}
    if ok:
        assert load(site, change).faults == (StuckSensor(rack=rack, start_s=10.0, card=card),)
    else:
        lo = rack * 64
        assert refused(site, change) == (
            f"day.toml: faults[0].card: card {card} is not in rack {rack} (cards {lo}..{lo + 63})"
        )


def test_a_fault_may_start_until_just_before_the_end_of_the_run(site: SiteSpec) -> None:
    sc = load(site, {"faults": [{"kind": "sensor_dropout", "rack": 0, "start_s": 599.5}]})
    assert sc.faults == (SensorDropout(rack=0, start_s=599.5),)
    msg = refused(site, {"faults": [{"kind": "sensor_dropout", "rack": 0, "start_s": 600}]})
    assert msg == "day.toml: faults[0].start_s: 600 s is at or after the end of the run (600 s): it would never happen"


def test_a_fault_at_the_files_own_end_is_an_error_even_in_a_shortened_run(site: SiteSpec) -> None:
    """Only a fault the file's own run reaches (before its 600 s) becomes a warning when ``--duration``
    shortens the run; one at 600 s would never have happened."""
    warned = load(site, {"faults": [{"kind": "sensor_dropout", "rack": 0, "start_s": 599}]}, duration_s=60.0)
    assert len(warned.warnings) == 1 and "599 s is at or after the end of this run (60 s" in warned.warnings[0]
    msg = refused(site, {"faults": [{"kind": "sensor_dropout", "rack": 0, "start_s": 600}]}, duration_s=60.0)
    assert msg.startswith("day.toml: faults[0].start_s: 600 s is at or after the end of the run (60 s)")
    # an override equal to the file's duration shortens nothing: a fault at its end is an error
    assert refused(site, {"faults": [{"kind": "sensor_dropout", "rack": 0, "start_s": 600}]}, duration_s=600.0)


def test_a_broker_disconnect_may_start_at_t0(site: SiteSpec) -> None:
    sc = load(site, disconnects((0.0, 30.0)))
    assert sc.sim_faults == (BrokerDisconnect(start_s=0.0, duration_s=30.0),) and sc.sim_faults[0].end_s == 30.0


def test_back_to_back_disconnects_load_in_time_order_and_any_overlap_is_refused(site: SiteSpec) -> None:
    """Windows that touch are one outage (docs/sim.md); they are listed in time order whatever the
    file's order. One that starts before the previous one ends (even by half a second, even where the
    file lists the later one first) is refused."""
    sc = load(site, disconnects((20.0, 10.0), (10.0, 10.0), (100.0, 5.0)))
    assert [(f.start_s, f.end_s) for f in sc.sim_faults] == [(10.0, 20.0), (20.0, 30.0), (100.0, 105.0)]
    for windows in (((10.0, 10.0), (19.5, 10.0)), ((19.5, 10.0), (10.0, 10.0)), ((0.0, 100.0), (50.0, 1.0))):
        msg = refused(site, disconnects(*windows))
        assert msg.startswith("day.toml: faults[") and ".start_s: broker disconnects overlap" in msg, msg


@pytest.mark.parametrize(
    ("start_s", "duration_s"),
    [(-1.0, 10.0), (math.inf, 10.0), (math.nan, 10.0), (0.0, 0.0), (0.0, -5.0), (0.0, math.inf), (0.0, math.nan)],
)
def test_a_broker_disconnect_is_a_finite_window_from_t0_on(start_s: float, duration_s: float) -> None:
    with pytest.raises(ValueError, match="BrokerDisconnect"):
        BrokerDisconnect(start_s=start_s, duration_s=duration_s)


def test_listed_jobs_come_in_submission_order_whatever_the_files_order(site: SiteSpec) -> None:
    listed = [
        {"id": "late", "n_cards": 8, "duration_s": 60, "submit_time_s": 300},
        {"id": "early", "n_cards": 8, "duration_s": 60, "submit_time_s": 10},
        {"id": "middle", "n_cards": 8, "duration_s": 60, "submit_time_s": 100},
    ]
    assert [j.job_id for j in load(site, {"jobs": listed}).jobs] == ["early", "middle", "late"]


def running(*sizes: int) -> dict[str, Any]:
    """Listed jobs of these sizes, all running at t = 0, placed in this order."""
    return {
        "jobs": [
            {"id": f"j{i}", "n_cards": n, "duration_s": 3600, "running_at_start": True} for i, n in enumerate(sizes)
        ]
    }


def test_the_warm_start_places_each_job_in_the_first_supernode_it_fits_exactly(site: SiteSpec) -> None:
    """Two supernodes of 512 cards: 8 cards go to supernode 0 (cards 0..7); 504 then fill supernode 0's
    504 free cards exactly (8..511), not supernode 1."""
    plant = build_plant(load(site, {**running(8, 504), "supernodes": 2}))
    assert plant.job_cards("j0").tolist() == list(range(8))
    assert plant.job_cards("j1").tolist() == list(range(8, 512))


def test_a_job_no_supernode_holds_whole_is_placed_across_the_site(site: SiteSpec) -> None:
    """504 cards fill supernode 0 up to card 503; 16 go to supernode 1 (512..527), the first with room
    for them; 504 more fit in neither supernode's free cards (8 and 496) but in the site's 504: the
    free cards in index order, 504..511 and 528..1023."""
    plant = build_plant(load(site, {**running(504, 16, 504), "supernodes": 2}))
    assert plant.job_cards("j0").tolist() == list(range(504))
    assert plant.job_cards("j1").tolist() == list(range(512, 528))
    assert plant.job_cards("j2").tolist() == [*range(504, 512), *range(528, 1024)]
    assert {j.job_id for j in plant.running_jobs()} == {"j0", "j1", "j2"}


def test_a_pue_target_below_one_is_refused(site: SiteSpec) -> None:
    """PUE is facility power over IT power: never below 1, so a target of at most 0.95 can never be met."""
    assert load(site, {"targets": {"pue_max": 1.0}}).targets is not None
    assert refused(site, {"targets": {"pue_max": 0.95}}).startswith("day.toml: targets.pue_max: ")


def test_a_seed_override_is_held_to_the_files_range(site: SiteSpec) -> None:
    """The file's ``seed`` is a 64-bit signed integer, 0..2^63 - 1; ``--seed`` (the ``seed`` override) is
    held to the same, as ``--duration`` is to the file's range."""
    top = 2**63 - 1
    assert load(site, seed=top).seed == top
    assert refused(site, {"seed": top + 1}).startswith("day.toml: seed: ")
    assert refused(site, {}, seed=top + 1).startswith("day.toml: seed: ")
