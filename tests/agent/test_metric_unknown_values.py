"""A gauge whose value the agent does not know yet exports no made-up value (docs/agent.md,
"Observability"): ``racktwin_site_time_seconds`` reads NaN before the site clock's first reading, as
the facility's gauges, the decided set-point and the predicted facility power do before theirs; a
site time of 0.0 is a site time like any other (``agent.clock.SiteClock.now_or``: a simulator started
with ``--start-epoch-s 0``) and is exported as such.

In process, on the service built from examples/agent.toml (not run: no broker), the service's own
site clock; the values are those a scrape sees (the exposition parsed by prometheus_client's parser)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_metric_gaps import T0, _at, _scrape, _service, _SiteNow

from agent.service import AgentService

pytestmark = pytest.mark.agent


@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    return _service(tmp_path)


def _site_time(service: AgentService) -> float | None:
    return _at(_scrape(service), "racktwin_site_time_seconds")


def test_the_site_time_reads_nan_until_the_site_clock_has_a_reading_then_its_time(service: AgentService) -> None:
    """Before any message the agent has no site time: NaN, as built and after the health task's updates
    (before: 0.0, a site time in 1970 that a dashboard's ``time() - racktwin_site_time_seconds`` read as
    56 years behind, and that a simulator started at epoch 0 also reads). Its first reading sets it."""
    assert service.clock.now() is None
    body = service.metrics.exposition().decode()  # as built, before any update
    first = {s.name: s.value for fam in text_string_to_metric_families(body) for s in fam.samples}
    assert math.isnan(first["racktwin_site_time_seconds"])
    for _ in range(2):  # the health task's updates, each alike
        site_t = _site_time(service)
        assert site_t is not None and math.isnan(site_t)
    service.clock.observe(T0)
    site_t = _site_time(service)
    assert site_t is not None and T0 <= site_t < T0 + 60.0  # the wall time since, at the clock's rate


def test_a_site_clock_at_epoch_zero_is_exported_as_zero_not_as_unknown(service: AgentService) -> None:
    """A simulator started with ``--start-epoch-s 0`` stamps its messages from 0.0: that is a known site
    time, exported as read (the NaN above means only that the clock has none)."""
    service.clock.observe(0.0)
    site_t = _site_time(service)
    assert site_t is not None and 0.0 <= site_t < 60.0


def test_the_site_clock_rate_is_the_clocks_rate(service: AgentService) -> None:
    """``racktwin_site_clock_rate_ratio`` reads the site clock's rate (1 against real racks; a simulator
    run faster, its factor), not the gauge's 0 as built."""
    clock = _SiteNow(T0)
    clock.rate = 12.0
    service.metric_updates.clock = clock
    assert _at(_scrape(service), "racktwin_site_clock_rate_ratio") == 12.0
