"""``racktwin_applied_state_disproved_total{setting,rack}`` (docs/agent.md, "Observability"): the cards
whose setting, as their rack's retained applied state confirmed it, a later reading disproved
(``agent.ingest.Ingest._disprove``) and no late applied state explained: ``level`` (a clock above the
confirmed level's), ``power_limit`` (another reported limit), ``low_power`` (awake, confirmed asleep). A
rack reset or changed outside the agent's commands that does not publish its applied state again shows
here; before, only ``IngestStats`` counted it, which nothing exported.

The agent's own commands do not count: a QoS 0 reading that shows a setting the rack has just applied
may reach the agent before the QoS 1 applied state confirming it, stamped at or before the reading. It
forgets the older confirmation at once as before, but the late applied state explains the disproval;
counted at once, a plain ``racktwin demo`` with no reset counted 864 levels and 168 low-power states in
75 site minutes (2026-12-05). A disproval is counted once the site clock is past the reading's stamp plus
the rack's confirmation margin plus the telemetry deadline with no applied state explaining it.

In process, through the service's ingest (the service built from examples/agent.toml, not run: no
broker); every value checked is the one a scrape sees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_clock_ingest import CardColumns, cards_msg, past_the_bound
from test_metric_gaps import _at, _scrape, _service

from agent import wire
from agent.ingest import DISPROVABLE_SETTINGS
from agent.metrics import APPLIED_SETTINGS
from agent.service import AgentService

pytestmark = pytest.mark.agent

T0 = 1_790_000_000.0
N = 64  # cards per rack of the example site


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def _disproved(service: AgentService, rack: str | None = None) -> dict[str, float | None]:
    """What a scrape shows per setting: for ``rack`` (the first rack when None)."""
    s = _scrape(service)
    rack = rack if rack is not None else service.site.rack_names[0]
    name = "racktwin_applied_state_disproved_total"
    return {k: _at(s, name, setting=k, rack=rack) for k in ("level", "power_limit", "low_power")}


def _all_disproved(service: AgentService) -> float:
    """The counts of every setting and rack together."""
    return sum(v for k, v in _scrape(service).items() if k[0] == "racktwin_applied_state_disproved_total")


NONE = {"level": 0.0, "power_limit": 0.0, "low_power": 0.0}


def _applied(rack: str, ts_s: float, *, level: int, limit_w: float, low: np.ndarray) -> wire.AppliedState:
    return wire.AppliedState(
        rack=rack,
        card_index=np.arange(N),
        dvfs_level=np.full(N, level),
        min_clock_mhz=np.full(N, 1210.0),
        max_clock_mhz=np.full(N, 1980.0),
        power_limit_w=np.full(N, limit_w),
        low_power=low,
        last_command_id=None,
        ts_s=ts_s,
        seq=0,
        publisher="sim",
    )


def test_the_ingests_settings_are_the_metrics_and_every_racks_series_is_exported_at_0(service: AgentService) -> None:
    assert DISPROVABLE_SETTINGS == APPLIED_SETTINGS
    for rack in service.site.rack_names:
        assert _disproved(service, rack) == NONE


def test_each_card_whose_confirmed_setting_a_reading_disproves_is_counted_once_per_setting(
    service: AgentService,
) -> None:
    """Rack r0, reading its cards every second, confirms level 5 (1430 MHz), a 500 W limit, and card 0
    asleep. Its reading 1.8 s later (past the 1.5 s margin) has card 0 awake, cards 1 and 2 at a 700 W
    limit and cards 3 to 5 at the top clock: one sleep, two limits and three levels disproved, forgotten
    at once, counted per setting once no applied state explained them in time; a later reading that shows
    the same counts nothing more (what was disproved is forgotten), nor does one that agrees with the
    rest."""
    rack = service.site.rack_names[0]
    ing = service.ingest
    for i in range(3):
        ing.handle(cards_msg(rack, T0 + i, sm_clock_mhz=np.full(N, 1980.0)))
    low = np.zeros(N, dtype=bool)
    low[0] = True
    ing.handle(_applied(rack, T0 + 2.2, level=5, limit_w=500.0, low=low))
    clock_mhz = np.full(N, 1430.0)
    clock_mhz[3:6] = 1980.0
    limit_w = np.full(N, 500.0)
    limit_w[1:3] = 700.0
    reading = cards_msg(rack, T0 + 4.0, sm_clock_mhz=clock_mhz, power_limit_w=limit_w)  # card 0 reads awake
    ing.handle(reading)
    ing.flush()
    assert np.all(ing.applied_level[3:6] == -1) and np.isnan(ing.applied_low_power[0])  # forgotten at once
    assert _disproved(service) == NONE  # not counted yet: a late applied state may explain it
    ing.handle(dataclasses.replace(reading, ts_s=T0 + 5.0))
    ing.flush()
    past_the_bound(ing, T0 + 5.0)
    assert _disproved(service) == {"level": 3.0, "power_limit": 2.0, "low_power": 1.0}
    assert _disproved(service) == {"level": 3.0, "power_limit": 2.0, "low_power": 1.0}  # counted once
    assert _all_disproved(service) == 6.0  # on its rack only
    assert np.all(ing.applied_level[6:N] == 5) and np.all(ing.applied_power_limit_w[3:N] == 500.0)


@pytest.mark.parametrize("stamped_before_s", [1.0, 0.0])
def test_a_reading_that_overtakes_the_applied_state_of_the_agents_own_command_counts_nothing(
    service: AgentService, stamped_before_s: float
) -> None:
    """The agent commands rack r0's cards 3 to 5 to the top level, cards 1 and 2 to a 700 W limit and card
    0 awake; the rack applies them and publishes its applied state (QoS 1) stamped up to a second before
    its next reading (QoS 0), which reaches the agent first and shows the new settings: the older
    confirmation is forgotten at once (as before: the level comes from the clock until the applied state
    arrives), then the applied state confirms the new settings and explains the disproval. Nothing is
    counted, also well past the bound. Counted at once, these were 3 levels, 2 limits and 1 sleep here,
    and 1,032 in a 75-minute demo run with no reset."""
    rack = service.site.rack_names[0]
    ing = service.ingest
    for i in range(3):
        ing.handle(cards_msg(rack, T0 + i, sm_clock_mhz=np.full(N, 1430.0)))
    low = np.zeros(N, dtype=bool)
    low[0] = True
    ing.handle(_applied(rack, T0 + 2.2, level=5, limit_w=500.0, low=low))
    clock_mhz = np.full(N, 1430.0)
    clock_mhz[3:6] = 1980.0
    limit_w = np.full(N, 500.0)
    limit_w[1:3] = 700.0
    reading_s = T0 + 6.0
    ing.handle(cards_msg(rack, reading_s, sm_clock_mhz=clock_mhz, power_limit_w=limit_w))  # card 0 awake
    ing.flush()
    assert np.all(ing.applied_level[3:6] == -1) and np.all(np.isnan(ing.applied_power_limit_w[1:3]))
    assert np.isnan(ing.applied_low_power[0])
    levels = np.full(N, 5)
    levels[3:6] = 0
    applied = _applied(rack, reading_s - stamped_before_s, level=5, limit_w=500.0, low=np.zeros(N, dtype=bool))
    limits = np.full(N, 500.0)
    limits[1:3] = 700.0
    ing.handle(dataclasses.replace(applied, dvfs_level=levels, power_limit_w=limits))  # the late applied state
    assert np.all(ing.applied_level[3:6] == 0) and np.all(ing.applied_power_limit_w[1:3] == 700.0)
    assert ing.applied_low_power[0] == 0.0
    past_the_bound(ing, reading_s)
    stats = ing.stats
    assert (stats.applied_levels_disproved, stats.applied_limits_disproved, stats.applied_low_power_disproved) == (
        0,
        0,
        0,
    )
    assert _disproved(service) == NONE
    assert _all_disproved(service) == 0.0
    assert ing.stats.applied_disprovals_explained == 6


def test_a_rack_reset_to_its_defaults_is_counted_once_per_card_and_setting_on_its_rack(service: AgentService) -> None:
    """Rack r1 confirmed every card asleep at level 5 under a 500 W limit, then was reset to its defaults
    (awake, top clock, 700 W) without publishing its applied state. Its readings show the defaults for a
    while; the agent, its confirmation forgotten, commands the cards again and the rack confirms that
    (stamped after the readings, and not what they showed: no explanation), and a confirmation in the
    window that does not agree with the readings (an applied state stamped before them, showing the old
    settings) explains nothing either. Each of the 64 cards counts once per setting, on r1 only."""
    r0, r1 = service.site.rack_names[:2]
    ing = service.ingest
    asleep = np.ones(N, dtype=bool)
    ing.handle(_applied(r1, T0, level=5, limit_w=500.0, low=asleep))
    defaults: CardColumns = {"sm_clock_mhz": np.full(N, 1980.0), "power_limit_w": np.full(N, 700.0)}
    ing.handle(cards_msg(r1, T0 + 5.0, **defaults))  # awake
    ing.handle(_applied(r1, T0 + 5.5, level=5, limit_w=500.0, low=asleep))  # in the window, but disagrees
    for i in range(6, 12):
        ing.handle(cards_msg(r1, T0 + i, **defaults))  # the same, disproving the confirmation again
    ing.flush()
    ing.handle(_applied(r1, T0 + 20.0, level=5, limit_w=500.0, low=asleep))  # the agent's command again
    assert ing.applied_level[N] == 5
    past_the_bound(ing, T0 + 20.0)
    assert _disproved(service, r1) == {"level": 128.0, "power_limit": 128.0, "low_power": 128.0}
    assert _disproved(service, r0) == NONE
