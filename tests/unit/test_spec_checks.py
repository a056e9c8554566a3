"""The site spec's checks at their edges: a value just inside a rule is taken, one just outside it is
refused with the file and the key named. Each case changes one value of the example site."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from twin.spec import SpecError, check_file_kind, site_from_dict, site_spec_sections

pytestmark = pytest.mark.unit


def _with(example_data: dict[str, Any], section: str | None, key: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(example_data)
    (d if section is None else d[section])[key] = value
    return d


def _refused(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        site_from_dict(data, source="site.toml")
    assert str(info.value).startswith("site.toml: ")
    return info.value


# ---- the DVFS table ---------------------------------------------------------------------------------


def test_the_first_two_levels_are_checked_too(example_data: dict[str, Any]) -> None:
    clocks = [1870.0, 1980.0, 1760.0, 1650.0, 1540.0, 1430.0, 1320.0, 1210.0]
    err = _refused(_with(example_data, "card", "clocks_mhz", clocks))
    assert err.path == "card.clocks_mhz" and "level 1 (1980 MHz) >= level 0 (1870 MHz)" in str(err)


def test_two_levels_of_one_clock_are_refused(example_data: dict[str, Any]) -> None:
    clocks = [1980.0, 1870.0, 1760.0, 1760.0, 1540.0, 1430.0, 1320.0, 1210.0]
    err = _refused(_with(example_data, "card", "clocks_mhz", clocks))
    assert err.path == "card.clocks_mhz" and "level 3 (1760 MHz) >= level 2 (1760 MHz)" in str(err)


def test_a_voltage_may_stay_but_not_rise_from_one_level_to_the_next(example_data: dict[str, Any]) -> None:
    # 0.95 V at level 3 is below level 0's 1.0 V but above level 2's 0.926 V
    volts = [1.0, 0.963, 0.926, 0.95, 0.853, 0.851, 0.851, 0.851]
    err = _refused(_with(example_data, "card", "voltages_v", volts))
    assert err.path == "card.voltages_v" and "level 3 (0.95 V) > level 2 (0.926 V)" in str(err)
    flat = [1.0, 1.0, 0.926, 0.890, 0.853, 0.851, 0.851, 0.851]  # equal neighbours are fine
    assert site_from_dict(_with(example_data, "card", "voltages_v", flat)).card.voltages_v[1] == 1.0


def test_one_voltage_per_level_neither_more_nor_fewer(example_data: dict[str, Any]) -> None:
    volts = list(example_data["card"]["voltages_v"])
    err = _refused(_with(example_data, "card", "voltages_v", [*volts, 0.85]))
    assert err.path == "card.voltages_v" and "has 9 entries but card.clocks_mhz has 8" in str(err)
    err = _refused(_with(example_data, "card", "voltages_v", volts[:-1]))
    assert err.path == "card.voltages_v" and "has 7 entries but card.clocks_mhz has 8" in str(err)


# ---- powers and temperatures of the card --------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("slowdown_temp_c", 92.0, "must be below card.max_temp_c (92 deg C), got 92"),
        ("idle_power_w", 700.0, "less than its power limit (card.power_limit_w = 700 W), got 700"),
        ("low_power_idle_w", 700.0, "less than the card's power limit (card.power_limit_w = 700 W), got 700"),
        ("low_power_idle_w", 84.5, "less than active idle (84.5 W), got 84.5"),
    ],
)
def test_a_card_value_equal_to_its_bound_is_refused(
    example_data: dict[str, Any], key: str, value: float, message: str
) -> None:
    err = _refused(_with(example_data, "card", key, value))
    assert err.path == f"card.{key}" and message in str(err)


def test_a_card_value_just_inside_its_bound_is_taken(example_data: dict[str, Any]) -> None:
    d = _with(example_data, "card", "slowdown_temp_c", 91.9)
    d["card"]["low_power_idle_w"] = 84.4
    card = site_from_dict(d).card
    assert (card.slowdown_temp_c, card.low_power_idle_w) == (91.9, 84.4)


# ---- the cold-plate table -----------------------------------------------------------------------------


def test_the_cold_plate_table_from_its_first_entry(example_data: dict[str, Any]) -> None:
    flow = list(example_data["cold_plate"]["flow_lpm"])
    flow[0], flow[1] = flow[1], flow[0]  # 0.5, 0.4, 0.6, ...
    err = _refused(_with(example_data, "cold_plate", "flow_lpm", flow))
    assert err.path == "cold_plate.flow_lpm" and "strictly increasing" in str(err)
    flow = list(example_data["cold_plate"]["flow_lpm"])
    flow[1] = flow[0]  # 0.4, 0.4
    assert _refused(_with(example_data, "cold_plate", "flow_lpm", flow)).path == "cold_plate.flow_lpm"
    r = list(example_data["cold_plate"]["r_case_to_coolant_k_per_w"])
    r[0], r[1] = r[1], r[0]  # 0.0325 then 0.0389: resistance rising with flow
    err = _refused(_with(example_data, "cold_plate", "r_case_to_coolant_k_per_w", r))
    assert err.path == "cold_plate.r_case_to_coolant_k_per_w" and "must not rise with flow" in str(err)


def test_a_flat_stretch_of_the_resistance_is_taken(example_data: dict[str, Any]) -> None:
    r = list(example_data["cold_plate"]["r_case_to_coolant_k_per_w"])
    r[1] = r[0]  # non-increasing, as docs/twin.md says
    site = site_from_dict(_with(example_data, "cold_plate", "r_case_to_coolant_k_per_w", r))
    assert site.cold_plate.r_case_to_coolant_k_per_w[:2] == (0.0389, 0.0389)


def test_one_resistance_per_flow(example_data: dict[str, Any]) -> None:
    r = list(example_data["cold_plate"]["r_case_to_coolant_k_per_w"])
    err = _refused(_with(example_data, "cold_plate", "r_case_to_coolant_k_per_w", [*r, 0.019]))
    assert err.path == "cold_plate.r_case_to_coolant_k_per_w" and "has 15 entries but" in str(err)
    err = _refused(_with(example_data, "cold_plate", "r_case_to_coolant_k_per_w", r[:-1]))
    assert err.path == "cold_plate.r_case_to_coolant_k_per_w"
    assert "has 13 entries but cold_plate.flow_lpm has 14" in str(err)


# ---- layout ---------------------------------------------------------------------------------------------


def test_the_torus_has_three_dimensions_and_a_rack_per_plane(example_data: dict[str, Any]) -> None:
    err = _refused(_with(example_data, None, "torus_dims", [8, 8, 8, 1]))
    assert err.path == "torus_dims" and "must have 3 entries (x, y, z), got 4" in str(err)
    err = _refused(_with(example_data, None, "racks_per_supernode", 4))
    assert err.path == "racks_per_supernode" and "must equal torus_dims[2] (8)" in str(err)


# ---- hosts ----------------------------------------------------------------------------------------------


def test_hosts_may_use_all_of_the_host_overhead_but_no_more(example_data: dict[str, Any]) -> None:
    d = _with(example_data, "rack", "host_power_w", 1100.0)  # 8 x 1100 W = the 8800 W overhead
    assert site_from_dict(d).rack.host_power_w == 1100.0
    err = _refused(_with(example_data, "rack", "host_power_w", 1100.5))
    assert err.path == "rack.host_power_w" and "8 hosts x 1100.5 W exceed rack.host_overhead_w (8800 W)" in str(err)


def test_an_off_host_draws_less_than_an_on_one(example_data: dict[str, Any]) -> None:
    err = _refused(_with(example_data, "rack", "host_off_power_w", 1000.0))
    assert err.path == "rack.host_off_power_w" and "got 1000" in str(err)
    assert site_from_dict(_with(example_data, "rack", "host_off_power_w", 999.0)).host_saving_w() == 1.0


# ---- the facility's set-points ----------------------------------------------------------------------


def test_the_set_point_in_force_is_one_of_distinct_increasing_options(example_data: dict[str, Any]) -> None:
    err = _refused(_with(example_data, "facility", "supply_temp_c", 32.0))
    assert err.path == "facility.supply_temp_c" and "must be one of facility.supply_temp_options_c" in str(err)
    for options in ([20.0, 25.0, 25.0, 30.0], [30.0, 25.0]):
        err = _refused(_with(example_data, "facility", "supply_temp_options_c", options))
        assert err.path == "facility.supply_temp_options_c" and "strictly increasing" in str(err)


# ---- the ranges of single values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value", "bound"),
    [
        (None, "supernodes", 0, ">= 1"),
        (None, "pue_target", 0.99, ">= 1"),  # a PUE is at least 1
        (None, "torus_dims", [8, 0, 8], ">= 1"),
        ("card", "clocks_mhz", [1980.0, 100.0], "> 100 MHz"),
        ("card", "power_limit_w", 49.0, ">= 50 W"),
        ("card", "idle_power_w", 0.0, "> 0 W"),
        ("card", "r_die_to_case_k_per_w", 0.0, "> 0 K/W"),
        ("rack", "power_limit_w", 999.0, ">= 1000 W"),
        ("rack", "hosts_per_rack", -1, ">= 0"),
        ("rack", "host_boot_s", -1.0, ">= 0 s"),
        ("loop", "pump_efficiency", 0.04, ">= 0.05"),
        ("cdu", "approach_k", -0.1, ">= 0 K"),
        ("cdu", "facility_flow_ratio", 0.19, ">= 0.2"),
        ("facility", "supply_temp_c", 61.0, "<= 60 deg C"),
        ("facility", "ambient_temp_c", 56.0, "<= 55 deg C"),
        ("facility", "dry_cooler_min_fan_speed_frac", 1.01, "<= 1"),  # a fraction of full speed
        ("facility", "ups_loss_fraction", 0.51, "<= 0.5"),
    ],
)
def test_a_value_out_of_its_physical_range(
    example_data: dict[str, Any], section: str | None, key: str, value: Any, bound: str
) -> None:
    err = _refused(_with(example_data, section, key, value))
    assert err.path.startswith(key if section is None else f"{section}.{key}")
    assert f"must be {bound}" in str(err)


def test_the_loops_largest_rise_defaults_to_the_cdus_design_rise(example_data: dict[str, Any]) -> None:
    """docs/twin.md: `max_delta_t_k` (K, default 16.3: Project Deschutes' design rise)."""
    d = copy.deepcopy(example_data)
    del d["loop"]["max_delta_t_k"]
    assert site_from_dict(d).loop.max_delta_t_k == 16.3


def test_host_keys_without_hosts_per_rack_are_refused(example_data: dict[str, Any]) -> None:
    """docs/twin.md: host power-down is "all four or none". With `hosts_per_rack` left out (as when its
    line is deleted) the other three were taken and ignored: the hosts silently stayed on."""
    d = copy.deepcopy(example_data)
    del d["rack"]["hosts_per_rack"]
    err = _refused(d)
    assert err.path == "rack.hosts_per_rack"
    assert "host_power_w, host_off_power_w, host_boot_s" in str(err) and "hosts_per_rack = 0" in str(err)
    del d["rack"]["host_power_w"], d["rack"]["host_off_power_w"]
    assert "missing, but host_boot_s is given" in str(_refused(d)) and "host_power_w" not in str(_refused(d))
    d["rack"]["hosts_per_rack"] = 0  # said outright: hosts always on, the others may stay
    assert not site_from_dict(d).hosts_managed


def test_the_first_missing_host_key_is_named_and_all_are_listed(example_data: dict[str, Any]) -> None:
    d = copy.deepcopy(example_data)
    del d["rack"]["host_off_power_w"], d["rack"]["host_boot_s"]
    err = _refused(d)
    assert err.path == "rack.host_off_power_w"
    assert "(missing: host_off_power_w, host_boot_s)" in str(err)


def test_the_plate_and_loop_coolant_names_match_as_labels(example_data: dict[str, Any]) -> None:
    """Case and surrounding spaces do not make another coolant (docs/twin.md: `fluid` is a label)."""
    d = _with(example_data, "cold_plate", "fluid", " pg25 ")
    assert site_from_dict(d).cold_plate.fluid == " pg25 "


# ---- which kind of file ---------------------------------------------------------------------------------


def test_two_site_tables_make_a_site_spec_one_does_not() -> None:
    assert site_spec_sections({"card": {}, "rack": {}}) == ["card", "rack"]
    assert site_spec_sections({"card": {}}) == []  # one stray table is an unknown key where it is
    assert site_spec_sections({"card": 1, "rack": {}}) == []  # a value, not a table


def test_a_file_with_one_key_of_its_kind_is_not_named_as_another_kind() -> None:
    # a run scenario with a key only an optimize scenario has: its own kind's key wins
    check_file_kind({"duration_s": 60.0, "supply_temp_c": 30.0}, "run scenario", "s.toml")
    with pytest.raises(SpecError) as info:
        check_file_kind({"name": "x", "supply_temp_c": 30.0, "margins": {}}, "run scenario", "s.toml")
    assert str(info.value).startswith(
        "s.toml: this looks like an optimize scenario (supply_temp_c, margins), not a run scenario"
    )


def test_a_run_scenario_given_as_a_site_spec_is_named() -> None:
    with pytest.raises(SpecError) as info:
        site_from_dict({"duration_s": 3600.0, "site": "supernode-512.toml"}, source="day.toml")
    assert str(info.value).startswith("day.toml: this looks like a run scenario (duration_s), not a site spec")


def test_true_is_not_a_number_of_hosts(example_data: dict[str, Any]) -> None:
    """`hosts_per_rack = true` is refused as the wrong type, not read as 1 host (and the host keys
    then asked for)."""
    d = _with(example_data, "rack", "hosts_per_rack", True)
    del d["rack"]["host_boot_s"]
    err = _refused(d)
    assert str(err) == "site.toml: rack.hosts_per_rack: expected an integer, got True"
