"""Mutation audit of ``twin.cooling``: what the existing tests left unchecked.

By hand from the example spec (supernode-512), as in tests/unit/test_steady.py: pumps at full
speed 4266.667 W (rack loops) + 2305.317 W (facility loop), UPS 2.5% of the IT power, 4 kW other
overhead; facility water 3 K under the rack supply (CDU approach); the facility loop's m c_p
10.758 kg/s x 4180 J/(kg K) = 44969 W/K at full flow.
"""

from __future__ import annotations

import pytest

from twin.cooling import facility_cooling
from twin.spec import SiteSpec

pytestmark = pytest.mark.unit


def test_the_pue_divides_by_the_it_power_also_in_a_transient(site: SiteSpec) -> None:
    """PUE = facility power / IT power, also when the heat reaching the coolant differs from the IT
    power (the dies and plates storing some): 400 kW drawn, 380 kW of heat at 40 deg C water and
    25 deg C air. Fans 514.425 W (speed 0.475), no chiller: facility
    400000 + 514.425 + 4266.667 + 2305.317 + 10000 + 4000 = 421086.41 W, PUE 1.0527160 (dividing by
    the heat would give 1.10812)."""
    p = facility_cooling(site, 400e3, 40.0, 25.0, heat_w=380e3)
    assert p.facility_power_w == pytest.approx(421_086.41, rel=1e-7)
    assert p.pue == pytest.approx(1.0527160, rel=1e-7)


def test_water_colder_than_the_air_goes_all_to_the_chiller_with_the_fans_still(site: SiteSpec) -> None:
    """Cold water on a hot day: 20 deg C supply (facility water 17 deg C) and 35 deg C air. The
    facility return, 17 + 400e3 / 44969 = 25.895 deg C, is under the air: the dry cooler can take
    no heat (its fans would warm the water), so they stand still and the chiller takes all 400 kW at
    COP 0.45 x 288.15 K / (43 - 15) K = 4.630982: 86374.77 W. Facility
    400000 + 86374.77 + 4266.667 + 2305.317 + 10000 + 4000 = 506946.75 W, PUE 1.2673669."""
    p = facility_cooling(site, 400e3, 20.0, 35.0)
    assert p.facility_return_temp_c == pytest.approx(25.895008, rel=1e-7)
    assert p.chiller_heat_w == pytest.approx(400e3, rel=1e-12)
    assert p.free_cooling_fraction == pytest.approx(0.0, abs=1e-12)
    assert p.chiller_cop == pytest.approx(4.6309821, rel=1e-7)
    assert p.chiller_w == pytest.approx(86_374.77, rel=1e-7)
    assert p.dry_cooler_fan_speed_frac == 0.0 and p.dry_cooler_fan_w == 0.0
    assert p.facility_power_w == pytest.approx(506_946.75, rel=1e-7)
    assert p.pue == pytest.approx(1.2673669, rel=1e-7)
