"""``racktwin_applied_states_old_total{rack}`` and ``racktwin_applied_states_old_dropped_total{rack}``
(docs/agent.md, "Observability"): a rack's applied states refused for some of their cards as stamped before
the one the agent took for them (``agent.applied_states.AppliedStates._older_than_taken``: a second
publisher for the rack, a stale bridge, a broker bridge reordering), one count per message, and those of
them dropped from the book of refused ones kept to retry at a new timeline (past
``agent.refused_applied.REFUSED_KEPT_PER_RACK`` per rack). Before, only ``IngestStats`` counted them (one
count for the whole site) and the log said so: nothing on /metrics showed a second publisher fighting a
rack (alert ``RacktwinAppliedStatesOutOfOrder``).

Through the running service's HTTP endpoint on 127.0.0.1, against a real mosquitto; and in process, through
the service's ingest and its metrics' exposition (the service built from examples/agent.toml, not run)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from http_testing import http_get
from mqtt_testing import wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_applied_disproved_metrics import _applied
from test_clock_ingest import T0, cards_msg
from test_metric_gaps import _at, _scrape, _service
from test_service_audit import SITE_ID, START, running, service_on

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from agent.refused_applied import REFUSED_KEPT_PER_RACK

pytestmark = pytest.mark.agent

OLD = "racktwin_applied_states_old_total"
DROPPED = "racktwin_applied_states_old_dropped_total"
TOP_MHZ = 1980.0  # level 0's clock


def _values(body: str) -> dict[tuple[str, str], float]:
    """(series, rack) -> value of the two series in a /metrics body."""
    return {
        (s.name, s.labels["rack"]): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
        if s.name in (OLD, DROPPED)
    }


async def _scraped_until(port: int, want: dict[tuple[str, str], float], wait_s: float = 15.0) -> None:
    """GET /metrics from 127.0.0.1:``port`` until its series show ``want`` (a bound on a hang, not a timing
    assertion: the health tick brings them up to date every wall second)."""
    seen: dict[tuple[str, str], float] = {}
    try:
        async with asyncio.timeout(wait_s):
            while True:
                status, body = await http_get(port, "/metrics")
                assert status == 200
                seen = _values(body)
                if all(seen.get(k) == v for k, v in want.items()):
                    return
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"/metrics did not show {want} within {wait_s} s: {seen}")


async def test_a_second_publishers_older_applied_states_are_counted_on_metrics_for_their_rack(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The running service with its HTTP endpoint, against a real mosquitto (2 racks of 16 cards): rack r0
    confirms its cards at the top level (stamped START + 3); then a second publisher on its applied topic
    (a stale bridge) replays one more than ``REFUSED_KEPT_PER_RACK`` older applied states of r0 (stamped
    START + 2.0, 2.1, ...). Every one is refused, and /metrics counts them on r0, and the one dropped from
    the book of refused ones (the oldest); r1's series read 0. Both were at 0 for every rack from the start.
    Before, /metrics had neither series."""
    service = service_on(
        mosquitto, tmp_path, period_s=15.0, speed=30.0, infer_time_scale=False, http_listen=("127.0.0.1", 0)
    )
    r0, r1 = service.site.rack_names
    n = service.site.cards_per_rack
    codec = wire.Codec(wire.SiteLayout.from_spec(service.site, site=SITE_ID))
    top = np.full(n, TOP_MHZ)
    no_sleep = np.zeros(n, dtype=bool)
    rack_msgs: list[wire.Message] = [
        cards_msg(r, START + i, n=n, sm_clock_mhz=top) for i in (1, 2, 3) for r in (r0, r1)
    ]
    rack_msgs.append(dataclasses.replace(_applied(r0, START + 3.0, level=0, limit_w=700.0, low=no_sleep), seq=5))
    replayed = REFUSED_KEPT_PER_RACK + 1
    stale = [
        dataclasses.replace(
            _applied(r0, START + 2.0 + 0.1 * i, level=5, limit_w=700.0, low=no_sleep), seq=i, publisher="bridge"
        )
        for i in range(replayed)
    ]
    ing = service.ingest
    async with (
        running(service),
        Bus(mosquitto.options(), subscriptions=(), name="racks") as racks,
        Bus(mosquitto.options(), subscriptions=(), name="bridge") as bridge,
    ):
        port = service.http_port
        assert port is not None
        await _scraped_until(port, {(OLD, r0): 0.0, (OLD, r1): 0.0, (DROPPED, r0): 0.0, (DROPPED, r1): 0.0})
        await wait_for("the publishers' connections", lambda: racks.connected and bridge.connected)
        for m in rack_msgs:
            out = codec.outgoing(m)
            await racks.publish(out.topic, out.payload, qos=1, retain=out.retain)
        await wait_for("the rack's applied state", lambda: ing.stats.by_kind.get("applied", 0) == 1)
        for m in stale:
            out = codec.outgoing(m)
            await bridge.publish(out.topic, out.payload, qos=1, retain=False)
        await wait_for("the bridge's applied states", lambda: ing.stats.by_kind.get("applied", 0) == 1 + replayed)
        await _scraped_until(port, {(OLD, r0): replayed, (DROPPED, r0): 1.0, (OLD, r1): 0.0, (DROPPED, r1): 0.0})
        assert np.all(ing.applied_level[:n] == 0)  # the rack's confirmation stands
        assert ing.stats.applied_states_old == {r0: replayed} and ing.stats.applied_states_old_dropped == {r0: 1}


def test_each_refused_applied_state_counts_once_on_its_own_rack(tmp_path: Path) -> None:
    """In process (the example site: 8 racks of 64 cards): an applied state of r1 older than the one taken
    counts 1 on r1 and nothing on the other racks; an update that saw nothing new adds nothing; one more on
    r1 and one on r3 count on theirs. An older applied state for cards that held none (taken) counts
    nothing, and nothing is dropped."""
    service = _service(tmp_path)
    racks = service.site.rack_names
    ing = service.ingest
    awake = np.zeros(64, dtype=bool)

    def old(rack: str) -> float | None:
        return _at(_scrape(service), OLD, rack=rack)

    for rack in ("r1", "r3"):
        ing.handle(cards_msg(rack, T0 + 19.0, sm_clock_mhz=np.full(64, TOP_MHZ)))
        ing.handle(_applied(rack, T0 + 20.0, level=0, limit_w=700.0, low=awake))
    ing.handle(cards_msg("r1", T0 + 21.0, sm_clock_mhz=np.full(64, TOP_MHZ)))
    ing.handle(_applied("r2", T0 + 5.0, level=5, limit_w=700.0, low=awake))  # r2 held none: taken
    assert [old(r) for r in racks] == [0.0] * 8
    ing.handle(_applied("r1", T0 + 10.0, level=5, limit_w=700.0, low=awake))
    assert [old(r) for r in racks] == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert old("r1") == 1.0  # counted once
    ing.handle(_applied("r1", T0 + 11.0, level=4, limit_w=700.0, low=awake))
    ing.handle(_applied("r3", T0 + 12.0, level=4, limit_w=700.0, low=awake))
    assert [old(r) for r in racks] == [0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [_at(_scrape(service), DROPPED, rack=r) for r in racks] == [0.0] * 8
    assert np.all(ing.applied_level[64:128] == 0) and np.all(ing.applied_level[128:192] == 5)
