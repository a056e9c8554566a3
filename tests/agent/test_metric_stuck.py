"""Stuck sensors on /metrics (docs/agent.md, "A value that is not known has no sample"): a reading that a
stuck sensor froze is fresh in time but not known, so its series has no sample while the sensor is
stuck (``twin.state``: readings that repeat exactly while they should move), per what is frozen:

* a card frozen as a whole, or its die alone: its die series, and the rack's hottest die is that of
  its other cards; a card whose power alone is frozen keeps its die series (the die is read);
* a rack whose cards are all frozen: every die series of the rack and its hottest die (not its loop
  temperatures nor its PDU power: other sensors);
* a rack whose loop readings are frozen: its supply and return series (not its cards' dies).

``racktwin_anomalies{kind="stuck_sensor"}`` counts the stuck racks plus the stuck cards of the other
racks: a card of a stuck rack is counted with its rack.

In process, on the service built from examples/agent.toml (not run: no broker), the readings fed to its
belief by hand; every value checked is the one a scrape sees, parsed with prometheus_client's parser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from readings_testing import card_batch
from test_metric_gaps import T0, _at, _scrape, _service, _SiteNow

from agent.service import AgentService
from twin.readings import LoopReading, PduReading, RackReading, Readings

pytestmark = pytest.mark.agent

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    s = _service(tmp_path)
    assert s.config.control.stuck_after_readings == 20  # examples/agent.toml
    return s


def _moving_die_c(k: int) -> float:
    """Every card's die at reading ``k`` unless set: it moves in the last digit, as real sensors do."""
    return 60.0 + 0.01 * k


def _readings(
    service: AgentService,
    k: int,
    *,
    die_c: dict[int, float] | None = None,
    power_w: dict[int, float] | None = None,
    utilization: dict[int, float] | None = None,
    supply_c: dict[int, float] | None = None,
) -> Readings:
    """Reading ``k`` (site time T0 + k): every card at the moving die, 500 W, 90% busy at the top clock,
    every rack's loop at 30 + r + 0.01 k deg C supply, 40 + r return, its PDU at 40 kW; but those named
    (card / rack index -> value)."""
    site = service.site
    cpr = site.cards_per_rack
    die = np.full(site.n_cards, _moving_die_c(k))
    power = np.full(site.n_cards, 500.0)
    util = np.full(site.n_cards, 0.9)
    for arr, named in ((die, die_c), (power, power_w), (util, utilization)):
        for c, v in (named or {}).items():
            arr[c] = v
    t = T0 + k
    racks = []
    for r in range(site.n_racks):
        sl = slice(r * cpr, (r + 1) * cpr)
        batch = card_batch(
            np.arange(r * cpr, (r + 1) * cpr), power_w=power[sl], die_temp_c=die[sl], utilization=util[sl]
        )
        supply = (supply_c or {}).get(r, 30.0 + r + 0.01 * k)
        loop = LoopReading(supply, 40.0 + r, 100.0, 200.0, 1.0)
        racks.append(RackReading(r, t, batch, loop, PduReading(40_000.0)))
    return Readings(t, tuple(racks), None)


def _feed(service: AgentService, reading: Callable[[int], Readings], ks: range) -> Scrape:
    """Readings ``ks`` into the belief, the site clock at the last one; what a scrape sees then."""
    clock = _SiteNow(T0)
    service.metric_updates.clock = clock
    for k in ks:
        service.state.update(reading(k))
        clock.t_s = T0 + k
    return _scrape(service)


def test_a_card_frozen_as_a_whole_has_no_die_sample_and_is_left_out_of_its_racks_hottest_die(
    service: AgentService,
) -> None:
    """Card 3 of r0 reads 70 deg C and 500 W again and again while its rack's other cards move: after
    the first reading and ``stuck_after_readings`` (20) repeats it is stuck. Its die series goes (before:
    70 for good) and r0's hottest die is its moving cards' (before: the frozen 70, which could keep
    RacktwinDieHot firing or quiet); the rack's loop and power, read apart, stay; one stuck sensor.
    Its next changed reading brings the series back."""
    r0 = service.site.rack_names[0]
    n = 20
    s = _feed(service, lambda k: _readings(service, k, die_c={3: 70.0}), range(n + 1))
    assert service.state.stuck_cards() == (3,) and service.state.stuck_racks() == ()
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") is None
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="4") == _moving_die_c(n)
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == _moving_die_c(n)
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r0) == 30.0 + 0.01 * n
    assert _at(s, "racktwin_rack_power_watts", rack=r0) == 40_000.0
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 1.0
    s = _feed(service, lambda k: _readings(service, k, die_c={3: 70.5}), range(n + 1, n + 2))
    assert service.state.stuck_cards() == ()
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") == 70.5
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == 70.5
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 0.0


def test_a_frozen_die_has_no_sample_but_a_card_whose_power_alone_is_frozen_keeps_its_die(
    service: AgentService,
) -> None:
    """Card 3 of r0: its die holds 70 deg C while its power steps from 500 W to 650 W and on (150 W
    through at least the card's 0.03 K/W die-to-case resistance is 4.5 K, more than the 3 K a held
    die may ignore): its die alone is frozen. Card 4: its power holds 500 W while its utilization
    drops from 90% to 20% at the top clock (the power model moves by hundreds of W, more than 50 W)
    and its die moves: its power alone is frozen. Both are stuck (two sensors); card 3's die series
    goes (before: 70) and so does its 70 from r0's hottest die; card 4's die series stays, as read."""
    r0 = service.site.rack_names[0]
    n = 20

    def reading(k: int) -> Readings:
        return _readings(
            service,
            k,
            die_c={3: 70.0},
            power_w={3: 500.0 if k == 0 else 650.0 + 0.1 * k},
            utilization={4: 0.9 if k == 0 else 0.2},
        )

    s = _feed(service, reading, range(n + 1))
    assert service.state.stuck_cards() == (3, 4) and service.state.stuck_racks() == ()
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="3") is None
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r0, card="4") == _moving_die_c(n)
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r0) == _moving_die_c(n)
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 2.0


def test_a_rack_whose_cards_are_all_frozen_has_no_die_samples_but_keeps_its_loop_and_power(
    service: AgentService,
) -> None:
    """Every card of r1 reads 70 deg C and 500 W again and again while the other racks move: r1 is
    stuck for its cards. None of its die series nor its hottest die has a sample (before: 70 each);
    its loop temperatures, which move, and its PDU power, read apart, stay; one stuck sensor."""
    site = service.site
    r1 = site.rack_names[1]
    cpr = site.cards_per_rack
    n = 20
    frozen = {c: 70.0 for c in range(cpr, 2 * cpr)}
    s = _feed(service, lambda k: _readings(service, k, die_c=frozen), range(n + 1))
    assert service.state.stuck_racks() == (1,) and service.state.stuck_cards() == ()
    for card in range(cpr):
        assert _at(s, "racktwin_card_die_temperature_celsius", rack=r1, card=str(card)) is None, card
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r1) is None
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) == 31.0 + 0.01 * n
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=r1) == 41.0
    assert _at(s, "racktwin_rack_power_watts", rack=r1) == 40_000.0
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=site.rack_names[0]) == _moving_die_c(n)
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 1.0


def test_a_rack_whose_loop_is_frozen_has_no_loop_temperatures_but_keeps_its_dies(service: AgentService) -> None:
    """r1's loop reads 31 deg C supply, 41 return and 100 l/min again and again while the other racks'
    loops move: r1 is stuck for its loop. Its supply and return series go (before: 31 and 41); its
    cards, which move, keep their die series and its hottest die; its PDU power stays."""
    site = service.site
    r1 = site.rack_names[1]
    n = 20
    s = _feed(service, lambda k: _readings(service, k, supply_c={1: 31.0}), range(n + 1))
    assert service.state.stuck_racks() == (1,) and service.state.stuck_cards() == ()
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=r1) is None
    assert _at(s, "racktwin_rack_return_temperature_celsius", rack=r1) is None
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r1, card="0") == _moving_die_c(n)
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r1) == _moving_die_c(n)
    assert _at(s, "racktwin_rack_power_watts", rack=r1) == 40_000.0
    assert _at(s, "racktwin_rack_supply_temperature_celsius", rack=site.rack_names[0]) == 30.0 + 0.01 * n
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 1.0


def test_a_stuck_card_of_a_stuck_rack_is_counted_once_with_its_rack(service: AgentService) -> None:
    """r1's loop is frozen (r1 stuck), card 5 of r1 and card 3 of r0 are frozen as a whole while their
    racks' other cards move (both stuck cards). docs/agent.md: the count is the stuck racks plus the
    stuck cards of the other racks: r1 and card 3 of r0, 2 (before: 3, card 5 counted with r1 and
    again on its own). Card 5's die series goes as well, the other dies of r1 stay."""
    site = service.site
    cpr = site.cards_per_rack
    r1 = site.rack_names[1]
    n = 20
    s = _feed(
        service, lambda k: _readings(service, k, die_c={3: 70.0, cpr + 5: 71.0}, supply_c={1: 31.0}), range(n + 1)
    )
    assert service.state.stuck_racks() == (1,) and service.state.stuck_cards() == (3, cpr + 5)
    assert _at(s, "racktwin_anomalies", kind="stuck_sensor") == 2.0
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r1, card="5") is None
    assert _at(s, "racktwin_card_die_temperature_celsius", rack=r1, card="6") == _moving_die_c(n)
    assert _at(s, "racktwin_rack_max_die_temperature_celsius", rack=r1) == _moving_die_c(n)
