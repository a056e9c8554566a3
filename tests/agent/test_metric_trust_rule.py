"""What /metrics exports of a rack or card the controller does not trust (docs/agent.md, "A value that is
not known has no sample"): a series goes only with the reading a stuck sensor froze, not with everything
the controller sets aside. The controller, more cautious, takes none of a stuck card's readings and none
of a stuck rack's dies, and holds the rack at fail-safe caps (``racktwin_rack_failsafe``,
``racktwin_anomalies``); but a die that moves is read, and exporting it keeps ``RacktwinDieHot`` able to
fire on the rack whose loop sensor froze, where the cooling may be what failed. These tests pin that rule
with the die that matters being the hottest: were the exported dies to follow what the controller trusts,
the hottest die would be another card's, or none.

In process, on the service built from examples/agent.toml (not run: no broker), as in
test_metric_stuck.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_metric_gaps import _at, _service
from test_metric_stuck import _feed, _moving_die_c, _readings

from agent.service import AgentService
from twin.readings import Readings

pytestmark = pytest.mark.agent

DIE_HOT_C = 85.0  # deploy/prometheus/racktwin-alerts.yml, RacktwinDieHot: slowdown 87 deg C less the 2 K margin


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def test_a_card_whose_power_alone_is_frozen_still_gives_its_racks_hottest_die(service: AgentService) -> None:
    """Card 4 of r0 runs 20 K hotter than the others, its die moving; its power holds 500 W while its
    utilization drops from 90% to 20% (the power model moves by hundreds of W): its power alone is frozen,
    the card is stuck, its die is not frozen. Its die series stays and it is r0's hottest die."""
    r0 = service.site.rack_names[0]
    n = 20

    def reading(k: int) -> Readings:
        return _readings(service, k, die_c={4: _moving_die_c(k) + 20.0}, utilization={4: 0.9 if k == 0 else 0.2})

    s = _feed(service, reading, range(n + 1))
    die_frozen, _ = service.state.frozen_readings()
    assert service.state.stuck_cards() == (4,) and not die_frozen[4]
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="4") == pytest.approx(_moving_die_c(n) + 20.0)
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == pytest.approx(_moving_die_c(n) + 20.0)
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 1.0


def test_a_hot_die_of_a_rack_whose_loop_sensor_froze_is_exported_over_the_die_hot_threshold(
    service: AgentService,
) -> None:
    """r1's loop reads 31 deg C again and again (r1 stuck for its loop, at fail-safe caps) while card 2
    of r1 heats past 85 deg C, moving: its die series and r1's hottest die show it, over the
    RacktwinDieHot threshold; r1's loop temperatures have no sample."""
    site = service.site
    r1 = site.rack_names[1]
    cpr = site.cards_per_rack
    n = 20

    def reading(k: int) -> Readings:
        return _readings(service, k, die_c={cpr + 2: 86.0 + 0.05 * k}, supply_c={1: 31.0})

    s = _feed(service, reading, range(n + 1))
    _, loop_frozen = service.state.frozen_readings()
    assert service.state.stuck_racks() == (1,) and loop_frozen[1]
    hottest = _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r1)
    assert hottest is not None
    assert hottest == pytest.approx(87.0) and hottest > DIE_HOT_C
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r1, card="2") == pytest.approx(87.0)
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) is None
