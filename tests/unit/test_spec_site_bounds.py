"""Site checks an operator relies on: a rack limit no rack can meet, a site too large for the twin
(a typo in ``torus_dims``) and a leakage reference temperature no card holds are refused with the
key and the figures, before anything is allocated; the example site and its neighbours still load.

Figures by hand from the example site (examples/supernode-512.toml): 64 cards per rack in 8 hosts of
8, hosts and switches 8,800 W with every host on, a host 1,000 W on and 50 W off, low-power idle
52.8 W at 42 deg C with 0.4 W/K, coldest supply set-point 20 deg C. A card asleep with its die at
20 deg C draws 52.8 - 0.4 x (42 - 20) = 44.0 W (above the model's floor of half of 52.8 W). With
hosts always on a rack draws at least 8,800 + 64 x 44.0 = 11,616 W; with idle hosts powered off, a
rack that can run a job keeps one host on: 8,800 - 7 x 950 + 8 x 44.0 = 2,502 W.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from twin.scenario import run_scenario_from_dict
from twin.spec import MAX_SITE_CARDS, SpecError, site_from_dict

pytestmark = pytest.mark.unit

RACK_FLOOR_W = 8800.0 + 64 * (52.8 - 0.4 * (42.0 - 20.0))  # 11,616 W: hosts always on
HOSTS_OFF_FLOOR_W = 8800.0 - 7 * (1000.0 - 50.0) + 8 * (52.8 - 0.4 * (42.0 - 20.0))  # 2,502 W: one host on


def _with(example_data: dict[str, Any], section: str | None, **values: Any) -> dict[str, Any]:
    d = copy.deepcopy(example_data)
    (d if section is None else d[section]).update(values)
    return d


def _refused(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        site_from_dict(data, source="site.toml")
    assert str(info.value).startswith("site.toml: ")
    return info.value


# ---- the rack limit against what an idle rack must draw ------------------------------------------


def _hosts_always_on(example_data: dict[str, Any], **rack: Any) -> dict[str, Any]:
    d = copy.deepcopy(example_data)
    for key in ("hosts_per_rack", "host_power_w", "host_off_power_w", "host_boot_s"):
        del d["rack"][key]
    d["rack"].update(rack)
    return d


def test_the_rack_floor_is_the_hosts_and_their_cards_asleep_at_the_coldest_supply(
    example_data: dict[str, Any],
) -> None:
    assert math.isclose(site_from_dict(_hosts_always_on(example_data)).rack_floor_w(), RACK_FLOOR_W, rel_tol=1e-12)
    assert math.isclose(site_from_dict(example_data).rack_floor_w(), HOSTS_OFF_FLOOR_W, rel_tol=1e-12)


@pytest.mark.parametrize("limit_w", [RACK_FLOOR_W, 10_000.0, 1_000.0])
def test_with_hosts_always_on_a_limit_at_or_below_the_floor_is_refused_with_the_figures(
    example_data: dict[str, Any], limit_w: float
) -> None:
    err = _refused(_hosts_always_on(example_data, power_limit_w=limit_w))
    assert err.path == "rack.power_limit_w", err
    assert err.problem.startswith(f"{limit_w:g} W is at or below the least a rack draws with every host on"), err
    assert "rack.host_overhead_w 8800 W + 64 cards x 44 W asleep" in err.problem and "= 11,616.0 W" in err.problem
    assert "no rack could run work within it" in err.problem, err


def test_with_hosts_always_on_a_limit_just_above_the_floor_is_taken(example_data: dict[str, Any]) -> None:
    site = site_from_dict(_hosts_always_on(example_data, power_limit_w=RACK_FLOOR_W + 1.0))
    assert site.rack.power_limit_w == RACK_FLOOR_W + 1.0


def test_hosts_that_can_be_powered_off_lower_the_floor_to_one_host_on(example_data: dict[str, Any]) -> None:
    # 11 kW is under every host on (11,616 W), but `racktwin optimize` runs a job there with the idle
    # hosts off: taken. Under one host on with its cards asleep no job could run: refused.
    assert site_from_dict(_with(example_data, "rack", power_limit_w=11_000.0)).rack.power_limit_w == 11_000.0
    assert site_from_dict(_with(example_data, "rack", power_limit_w=HOSTS_OFF_FLOOR_W + 1.0))
    err = _refused(_with(example_data, "rack", power_limit_w=2500.0))
    assert err.path == "rack.power_limit_w", err
    assert "one host on and 7 off: rack.host_overhead_w 8800 W - 7 x (1000 - 50) W" in err.problem, err
    assert "8 cards x 44 W asleep" in err.problem and "= 2,502.0 W" in err.problem, err


def test_a_warmer_coldest_supply_raises_the_floor_by_the_low_power_leakage(example_data: dict[str, Any]) -> None:
    # Supply options from 30 deg C: a sleeping card draws 52.8 - 0.4 x 12 = 48.0 W; 8,800 + 64 x 48 = 11,872 W
    d = _hosts_always_on(example_data)
    d["facility"]["supply_temp_options_c"] = [30.0, 35.0, 40.0, 45.0]
    assert math.isclose(site_from_dict(d).rack_floor_w(), 11_872.0, rel_tol=1e-12)
    err = _refused(_with(d, "rack", power_limit_w=11_800.0))  # above the 11,616 W of a 20 deg C supply
    assert err.path == "rack.power_limit_w" and "11,872.0 W" in err.problem


# ---- the size of the site ------------------------------------------------------------------------


def test_a_typo_in_torus_dims_is_refused_naming_the_count_before_anything_is_allocated(
    example_data: dict[str, Any],
) -> None:
    # [800, 800, 8]: 5,120,000 cards of one supernode (the twin's arrays for them are what ran out of memory)
    err = _refused(_with(example_data, None, torus_dims=[800, 800, 8]))
    assert err.path == "torus_dims", err
    assert "5,120,000 cards" in err.problem and "supernodes 1 x torus_dims 800 x 800 x 8" in err.problem, err
    assert f"{MAX_SITE_CARDS:,}" in err.problem
    huge = _with(example_data, None, torus_dims=[1000, 1000, 1000], racks_per_supernode=1000, supernodes=10_000)
    err = _refused(huge)
    assert err.path == "torus_dims" and "10,000,000,000,000 cards" in err.problem, err


def test_a_site_of_exactly_the_bound_is_taken_and_twice_as_many_cards_are_not(example_data: dict[str, Any]) -> None:
    # 1,000,000 cards: 1 supernode of [100, 100, 100]; racks of 10,000 cards draw 8,800 + 10,000 x 44 W asleep
    at = _with(example_data, None, torus_dims=[100, 100, 100], racks_per_supernode=100)
    at["rack"] = {**at["rack"], "power_limit_w": 5.0e5}
    assert site_from_dict(at).n_cards == MAX_SITE_CARDS
    err = _refused(_with(at, None, supernodes=2))
    assert "2,000,000 cards (supernodes 2 x torus_dims 100 x 100 x 100)" in err.problem


def test_scaling_a_site_past_the_bound_is_refused_at_supernodes(example_data: dict[str, Any]) -> None:
    site = site_from_dict(example_data)
    assert site.with_supernodes(1953).n_cards == 999_936  # 1,953 x 512
    with pytest.raises(ValueError, match="1,000,448 cards"):
        site.with_supernodes(1954)
    data = {"name": "big", "duration_s": 60.0, "supernodes": 10_000, "workload": {"source": "none"}}
    with pytest.raises(SpecError) as info:
        run_scenario_from_dict(data, source="run.toml", site=site)
    assert str(info.value).startswith("run.toml: supernodes: 5,120,000 cards"), info.value


# ---- the leakage model's reference temperature ---------------------------------------------------


def test_a_reference_temperature_above_the_slowdown_temperature_is_refused(example_data: dict[str, Any]) -> None:
    err = _refused(_with(example_data, "card", reference_temp_c=90.0))  # slowdown at 87 deg C
    assert err.path == "card.reference_temp_c", err
    assert "90 deg C is above card.slowdown_temp_c (87 deg C)" in err.problem, err
    site = site_from_dict(_with(example_data, "card", reference_temp_c=87.0))  # at the threshold: no slowdown yet
    assert site.card.reference_temp_c == 87.0
