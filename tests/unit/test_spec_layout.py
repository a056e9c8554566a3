"""Where every card of a site is, worked out by hand: its rack, host, supernode and torus position,
and the quantities derived from the layout (the agent, the optimiser and the plant all place jobs
and budgets by these indices, so an off-by-one misplaces them).

The example site is 8x8x8 in one supernode, where several wrong formulas agree with the right one
(x*y = x*z, a rack's cards = its hosts' count, one supernode): the layouts here are made so they
do not."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from twin.spec import SiteSpec, site_from_dict

pytestmark = pytest.mark.unit


def _two_supernodes(example_data: dict[str, Any], hosts_per_rack: int = 2) -> SiteSpec:
    """Two supernodes of a 4x2x3 torus: 3 racks of 8 cards each, ``hosts_per_rack`` hosts per rack."""
    d = copy.deepcopy(example_data)
    d["supernodes"] = 2
    d["torus_dims"] = [4, 2, 3]
    d["racks_per_supernode"] = 3
    d["rack"]["hosts_per_rack"] = hosts_per_rack
    if hosts_per_rack == 0:
        for k in ("host_power_w", "host_off_power_w", "host_boot_s"):
            del d["rack"][k]
    return site_from_dict(d, source="two-supernodes")


def test_counts_of_a_site_of_two_supernodes(example_data: dict[str, Any]) -> None:
    site = _two_supernodes(example_data)
    assert site.cards_per_rack == 4 * 2
    assert site.cards_per_supernode == 3 * 8
    assert site.n_racks == 2 * 3
    assert site.n_cards == 6 * 8
    assert site.cards_per_host == 8 // 2
    assert site.n_hosts == 6 * 2
    assert site.hosts_managed
    assert site.rack_names == ("r0", "r1", "r2", "r3", "r4", "r5")
    assert site.loop_flow_per_rack_lpm() == pytest.approx(1.2 * 8)  # 1.2 L/min per card, 8 cards
    assert site.rack_power_limits_w().tolist() == [50000.0] * 6


def test_each_card_is_on_its_rack_host_and_supernode(example_data: dict[str, Any]) -> None:
    site = _two_supernodes(example_data)
    rack = site.card_rack()
    assert rack.shape == (48,)
    # racks are runs of 8 consecutive cards
    assert rack.tolist() == [r for r in range(6) for _ in range(8)]
    assert (rack[7], rack[8], rack[23], rack[24], rack[47]) == (0, 1, 2, 3, 5)
    assert site.rack_supernode().tolist() == [0, 0, 0, 1, 1, 1]
    # the supernode of a card through its rack: cards 0..23 in the first, 24..47 in the second
    assert site.rack_supernode()[rack].tolist() == [0] * 24 + [1] * 24
    host = site.card_host()
    # hosts are runs of 4 consecutive cards, 2 per rack
    assert host.tolist() == [h for h in range(12) for _ in range(4)]
    assert (host[3], host[4], host[8], host[47]) == (0, 1, 2, 11)
    # no host straddles two racks
    for h in range(12):
        assert len(set(rack[host == h].tolist())) == 1


def test_each_card_has_its_torus_position(example_data: dict[str, Any]) -> None:
    """(x, y, z) = ((i % (x*y)) // y, i % y, rack % z) with (x, y, z) = (4, 2, 3)."""
    site = _two_supernodes(example_data)
    xyz = site.card_torus_xyz()
    assert xyz.shape == (48, 3)
    assert xyz[0].tolist() == [0, 0, 0]
    assert xyz[1].tolist() == [0, 1, 0]
    assert xyz[2].tolist() == [1, 0, 0]
    assert xyz[5].tolist() == [2, 1, 0]  # 5 = 2*2 + 1, rack 0
    assert xyz[13].tolist() == [2, 1, 1]  # 13 - 8 = 5, rack 1
    assert xyz[23].tolist() == [3, 1, 2]  # last card of the first supernode
    assert xyz[24].tolist() == [0, 0, 0]  # the second supernode starts over
    assert xyz[31].tolist() == [3, 1, 0]  # rack 3 is plane 0 of supernode 1
    assert xyz[47].tolist() == [3, 1, 2]
    # every position of the 4x2x3 torus once per supernode
    for s in range(2):
        positions = {tuple(p) for p in xyz[24 * s : 24 * (s + 1)].tolist()}
        assert positions == {(x, y, z) for x in range(4) for y in range(2) for z in range(3)}


def test_without_managed_hosts_a_host_is_a_rack(example_data: dict[str, Any]) -> None:
    site = _two_supernodes(example_data, hosts_per_rack=0)
    assert not site.hosts_managed
    assert site.cards_per_host == 8
    assert site.n_hosts == 6
    assert np.array_equal(site.card_host(), site.card_rack())
    assert site.host_saving_w() == 0.0
    assert site.host_off_saving_w() == 0.0
    assert site.host_break_even_s() == 0.0


def test_one_host_per_rack_is_managed(example_data: dict[str, Any]) -> None:
    site = _two_supernodes(example_data, hosts_per_rack=1)
    assert site.hosts_managed
    assert site.cards_per_host == 8
    assert site.n_hosts == 6
    assert np.array_equal(site.card_host(), site.card_rack())
    # 1000 W on - 50 W off, plus 8 cards asleep at 52.8 W
    assert site.host_off_saving_w() == pytest.approx(950.0 + 8 * 52.8)


def test_what_a_host_saves_and_its_break_even_time(site: SiteSpec, example_data: dict[str, Any]) -> None:
    """Example site: hosts of 8 cards, 1000 W on, 50 W off, 300 s boot, 52.8 W per card asleep."""
    assert site.host_saving_w() == pytest.approx(950.0)
    assert site.host_off_saving_w() == pytest.approx(950.0 + 8 * 52.8)  # 1372.4 W
    # a boot costs 300 s x (1000 W + 8 x 52.8 W) = 426.72 kJ; off saves 1372.4 W: 310.9 s ("311 s")
    assert site.host_break_even_s() == pytest.approx(300.0 * 1422.4 / 1372.4)
    small = _two_supernodes(example_data)  # hosts of 4 cards
    assert small.host_off_saving_w() == pytest.approx(950.0 + 4 * 52.8)
    assert small.host_break_even_s() == pytest.approx(300.0 * (1000.0 + 4 * 52.8) / (950.0 + 4 * 52.8))


def test_scale_studies_keep_the_hardware(site: SiteSpec) -> None:
    big = site.with_supernodes(3)
    assert (big.supernodes, big.n_racks, big.n_cards, big.cards_per_supernode) == (3, 24, 1536, 512)
    assert big.name == "supernode-512-x3"
    assert big.rack_supernode().tolist() == [0] * 8 + [1] * 8 + [2] * 8
    assert site.with_supernodes(1).n_cards == 512
    with pytest.raises(ValueError, match="supernodes must be >= 1"):
        site.with_supernodes(0)


def test_the_lowest_pump_speed_gives_each_plate_the_tables_lowest_flow(site: SiteSpec) -> None:
    # plate table from 0.4 L/min, 1.2 L/min per card at full speed
    assert site.min_pump_speed_frac() == pytest.approx(0.4 / 1.2)


@pytest.mark.parametrize(
    ("clock_mhz", "level"),
    [
        (1980.0, 0),  # the top clock
        (1870.0, 1),  # a table clock is its own level
        (1871.0, 0),  # above level 1's clock: only level 0 is at least as fast
        (1869.0, 1),  # the slowest level still at least as fast
        (1210.0, 7),
        (5000.0, 0),  # above the table: clamped to the fastest
        (100.0, 7),  # below the table: clamped to the slowest
    ],
)
def test_level_of_a_clock(site: SiteSpec, clock_mhz: float, level: int) -> None:
    assert site.card.level_of_clock(clock_mhz) == level


def test_the_largest_plausible_clock_is_five_times_the_top(site: SiteSpec) -> None:
    assert site.card.max_plausible_clock_mhz == 5.0 * 1980.0


def test_cards_named_per_rack_convert_to_site_indices_and_back(example_data: dict[str, Any]) -> None:
    """The wire names cards per rack, rack-local (a placement, a ``card_failed`` refusal); the agent
    and the plant index them site-wide: card c of rack r is r * cards_per_rack + c. Two supernodes of
    3 racks of 8 cards (r0..r5): card 5 of r1 is 13, card 0 of r3 is 24, card 7 of r5 is 47."""
    site = _two_supernodes(example_data)
    assert site.site_cards({"r1": (5, 0), "r3": [0], "r5": (7,)}) == [13, 8, 24, 47]  # rack by rack, as given
    assert site.site_cards({}) == [] and site.site_cards({"r2": ()}) == []
    assert site.cards_by_rack([13, 2, 14, 47]) == {"r1": [5, 6], "r0": [2], "r5": [7]}
    assert site.cards_by_rack(np.array([47, 40], dtype=np.int64)) == {"r5": [7, 0]}
    assert site.site_cards(site.cards_by_rack(range(48))) == list(range(48))


@pytest.mark.parametrize(
    ("by_rack", "message"),
    [
        ({"r6": [0]}, "rack 'r6' is not in the site"),  # 6 racks: r0..r5
        ({"r0": [8]}, "card 8 of rack r0 is not within 0..7"),  # not card 0 of r1
        ({"r1": [-1]}, "card -1 of rack r1 is not within 0..7"),  # not card 7 of r0
    ],
)
def test_cards_a_site_does_not_have_are_refused_not_moved_to_another_rack(
    example_data: dict[str, Any], by_rack: dict[str, list[int]], message: str
) -> None:
    site = _two_supernodes(example_data)
    with pytest.raises(ValueError, match=message):
        site.site_cards(by_rack)
    for card in (-1, 48):
        with pytest.raises(ValueError, match=f"card {card} is not within the site's 0..47"):
            site.cards_by_rack([0, card])
