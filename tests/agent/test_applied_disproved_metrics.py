"""``racktwin_applied_state_disproved_total{setting}`` (docs/agent.md, "Observability"): the cards whose
setting, as their rack's retained applied state confirmed it, a later reading disproved
(``agent.ingest.Ingest._disprove``): ``level`` (a clock above the confirmed level's), ``power_limit``
(another reported limit), ``low_power`` (awake, confirmed asleep). A rack reset or changed outside the
agent's commands that does not publish its applied state again shows here; before, only
``IngestStats`` counted it, which nothing exported.

In process, through the service's ingest (the service built from examples/agent.toml, not run: no
broker); every value checked is the one a scrape sees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_clock_ingest import cards_msg
from test_metric_gaps import _at, _scrape, _service

from agent import wire
from agent.service import AgentService

pytestmark = pytest.mark.agent

T0 = 1_790_000_000.0
N = 64  # cards per rack of the example site


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def _disproved(service: AgentService) -> dict[str, float | None]:
    s = _scrape(service)
    return {
        k: _at(s, "racktwin_applied_state_disproved_total", setting=k) for k in ("level", "power_limit", "low_power")
    }


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


def test_each_card_whose_confirmed_setting_a_reading_disproves_is_counted_once_per_setting(
    service: AgentService,
) -> None:
    """Rack r0, reading its cards every second, confirms level 5 (1430 MHz), a 500 W limit, and card 0
    asleep. Its reading 1.8 s later (past the 1.5 s margin) has card 0 awake, cards 1 and 2 at a 700 W
    limit and cards 3 to 5 at the top clock: one sleep, two limits and three levels disproved, counted
    per setting once; a later reading that shows the same counts nothing more (what was disproved is
    forgotten), nor does one that agrees with the rest."""
    assert _disproved(service) == {"level": 0.0, "power_limit": 0.0, "low_power": 0.0}  # exported from the start
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
    assert _disproved(service) == {"level": 3.0, "power_limit": 2.0, "low_power": 1.0}
    assert _disproved(service) == {"level": 3.0, "power_limit": 2.0, "low_power": 1.0}  # counted once
    ing.handle(dataclasses.replace(reading, ts_s=T0 + 5.0))
    ing.flush()
    assert _disproved(service) == {"level": 3.0, "power_limit": 2.0, "low_power": 1.0}
    assert np.all(ing.applied_level[6:N] == 5) and np.all(ing.applied_power_limit_w[3:N] == 500.0)
