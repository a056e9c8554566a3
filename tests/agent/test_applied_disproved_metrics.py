"""``racktwin_applied_state_disproved_total{setting,rack}`` (docs/agent.md, "Observability"): the cards
whose setting, as their rack's retained applied state confirmed it, a later reading disproved
(``agent.applied_states.AppliedStates._disprove``) and no late applied state explained: ``level`` (a clock above the
confirmed level's), ``power_limit`` (another reported limit), ``low_power`` (awake, confirmed asleep). A
rack reset or changed outside the agent's commands that does not publish its applied state again shows
here; before, only ``IngestStats`` counted it, which nothing exported.

The agent's own commands do not count: a QoS 0 reading that shows a setting the rack has just applied
may reach the agent before the QoS 1 applied state confirming it, stamped at or before the reading. It
forgets the older confirmation at once as before, but the late applied state explains the disproval;
counted at once, a plain ``racktwin demo`` with no reset counted 864 levels and 168 low-power states in
75 site minutes (2026-12-05). A disproval is counted once the site clock is past the reading's stamp plus
the rack's confirmation margin plus the telemetry deadline with no applied state explaining it: after a
message, or on the service's health tick while connected (a telemetry blackout), not while the broker is
away (the applied state that explains it may be held up there).

In process, through the service's ingest (the service built from examples/agent.toml, not run: no
broker); the blackout, and an agent standing by for another (it counts the same as the one that
commands), through running services against a real mosquitto. Every value checked is the one a scrape
sees."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from mqtt_testing import wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_clock_ingest import CardColumns, FakeWall, cards_msg, past_the_bound
from test_metric_gaps import _at, _scrape, _service
from test_service_audit import SITE_ID, START, running, service_on

from agent import wire
from agent.applied_states import DISPROVABLE_SETTINGS
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from agent.clock import SiteClock
from agent.ingest import Ingest
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


def _confirm_level_5(ing: Ingest, rack: str, *, clock_mhz: float, card_0_asleep: bool) -> None:
    """Readings of ``rack`` at T0, T0 + 1, T0 + 2 (every card at ``clock_mhz``), then its applied state
    stamped T0 + 2.2: level 5 (1430 MHz), a 500 W limit, card 0 asleep when ``card_0_asleep``."""
    for i in range(3):
        ing.handle(cards_msg(rack, T0 + i, sm_clock_mhz=np.full(N, clock_mhz)))
    low = np.zeros(N, dtype=bool)
    low[0] = card_0_asleep
    ing.handle(_applied(rack, T0 + 2.2, level=5, limit_w=500.0, low=low))


def _disproving(rack: str, ts_s: float, *, limits_raised: bool) -> wire.CardBatch:
    """A reading of ``rack`` stamped ``ts_s``: every card awake, cards 3 to 5 at the top clock (1980 MHz),
    the others at level 5's 1430 MHz; cards 1 and 2 at a 700 W limit when ``limits_raised`` (else 500 W)."""
    clock_mhz = np.full(N, 1430.0)
    clock_mhz[3:6] = 1980.0
    limit_w = np.full(N, 500.0)
    if limits_raised:
        limit_w[1:3] = 700.0
    return cards_msg(rack, ts_s, sm_clock_mhz=clock_mhz, power_limit_w=limit_w)


def _applied(rack: str, ts_s: float, *, level: int, limit_w: float, low: np.ndarray) -> wire.AppliedState:
    n = low.size
    return wire.AppliedState(
        rack=rack,
        card_index=np.arange(n),
        dvfs_level=np.full(n, level),
        min_clock_mhz=np.full(n, 1210.0),
        max_clock_mhz=np.full(n, 1980.0),
        power_limit_w=np.full(n, limit_w),
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
    _confirm_level_5(ing, rack, clock_mhz=1980.0, card_0_asleep=True)
    reading = _disproving(rack, T0 + 4.0, limits_raised=True)  # card 0 reads awake
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
    _confirm_level_5(ing, rack, clock_mhz=1430.0, card_0_asleep=True)
    reading_s = T0 + 6.0
    ing.handle(_disproving(rack, reading_s, limits_raised=True))  # card 0 awake
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


def test_a_wake_whose_reading_overtakes_the_racks_applied_states_of_that_second_and_the_last_counts_nothing(
    service: AgentService,
) -> None:
    """What a 75-minute demo run counted as 8 low-power disprovals on one rack (2026-12-05): rack r5's
    cards 40 to 47, confirmed asleep, are woken by the agent at T0 + 6, after other commands to the rack at
    T0 + 5. The readings showing them awake reach the agent before the rack's applied states (QoS 0 ahead
    of QoS 1): the one of T0 + 6 disproves the sleep (pending until an applied state stamped by T0 + 7.5
    explains it); then the applied state of T0 + 5 comes, still showing them asleep (it explains nothing,
    and confirms the sleep again), and the reading of T0 + 7 disproves that confirmation too; at last the
    applied state of T0 + 6 confirms them awake. It explains both: nothing is counted, also well past the
    bound. Before, the second disproval counted the first at once (8 cards, alert
    ``RacktwinRackSettingsChanged``), as if no applied state could still explain it."""
    rack = service.site.rack_names[5]
    ing = service.ingest
    asleep = np.ones(N, dtype=bool)
    woken = np.ones(N, dtype=bool)
    woken[40:48] = False

    def reading(ts_s: float, low: np.ndarray) -> wire.CardBatch:
        return cards_msg(rack, ts_s, sm_clock_mhz=np.where(low, 0.0, 1430.0), low_power=low)

    ing.handle(_applied(rack, T0, level=5, limit_w=700.0, low=asleep))
    for i in range(1, 6):
        ing.handle(reading(T0 + i, asleep))
    ing.handle(reading(T0 + 6.0, woken))  # the wake applied at T0 + 6
    assert np.all(np.isnan(ing.applied_low_power[5 * N + 40 : 5 * N + 48]))
    ing.handle(dataclasses.replace(_applied(rack, T0 + 5.0, level=5, limit_w=700.0, low=asleep), seq=6))
    assert np.all(ing.applied_low_power[5 * N + 40 : 5 * N + 48] == 1.0)  # confirmed asleep again
    ing.handle(reading(T0 + 7.0, woken))  # disproves it again
    ing.flush()
    assert ing.stats.applied_disproved == {}
    ing.handle(dataclasses.replace(_applied(rack, T0 + 6.0, level=5, limit_w=700.0, low=woken), seq=7))
    past_the_bound(ing, T0 + 7.0)
    assert ing.stats.applied_disproved == {}
    assert _disproved(service, rack) == NONE
    assert _all_disproved(service) == 0.0
    assert np.all(ing.applied_low_power[5 * N + 40 : 5 * N + 48] == 0.0)


def test_a_confirmation_disproved_again_within_the_bound_counts_its_card_once_when_nothing_explains_it(
    service: AgentService, caplog: pytest.LogCaptureFixture
) -> None:
    """The same readings without the applied state that would explain them (the cards woken behind the
    agent's back, the rack's applied states of that second still saying asleep): each card counts once,
    when the bound of the first reading passed. A confirmation disproved again that was stamped after the
    earlier disproval's bound still counts that one at once (no applied state to come can explain it).
    Each count is logged with its rack, setting and the rack's cards (what an operator chasing alert
    ``RacktwinRackSettingsChanged`` looks for)."""
    rack = service.site.rack_names[5]
    ing = service.ingest
    asleep = np.ones(N, dtype=bool)
    woken = np.ones(N, dtype=bool)
    woken[40:48] = False

    def reading(ts_s: float, low: np.ndarray) -> wire.CardBatch:
        return cards_msg(rack, ts_s, sm_clock_mhz=np.where(low, 0.0, 1430.0), low_power=low)

    ing.handle(_applied(rack, T0, level=5, limit_w=700.0, low=asleep))
    for i in range(1, 6):
        ing.handle(reading(T0 + i, asleep))
    ing.handle(reading(T0 + 6.0, woken))
    ing.handle(dataclasses.replace(_applied(rack, T0 + 5.0, level=5, limit_w=700.0, low=asleep), seq=6))
    ing.handle(reading(T0 + 7.0, woken))
    ing.flush()
    assert ing.stats.applied_disproved == {}
    ing.handle(dataclasses.replace(_applied(rack, T0 + 8.0, level=5, limit_w=700.0, low=asleep), seq=7))
    assert ing.stats.applied_disproved == {}  # (stamped after the bound: it explains nothing, as asleep)
    with caplog.at_level(logging.WARNING, logger="racktwin.agent.ingest"):
        ing.handle(reading(T0 + 10.0, woken))  # disproves a confirmation stamped after the pending one's bound
    assert ing.stats.applied_disproved == {("low_power", rack): 8}
    lines = [r.getMessage() for r in caplog.records if "disproved" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("r5: the low_power of 8 card(s)"), lines
    assert lines[0].endswith("cards 40-47") and f"ts {T0 + 7.5:.3f}" in lines[0], lines
    past_the_bound(ing, T0 + 10.0)
    assert _disproved(service, rack) == {"level": 0.0, "power_limit": 0.0, "low_power": 16.0}


def test_a_rack_reset_to_its_defaults_is_counted_once_per_card_and_setting_on_its_rack(service: AgentService) -> None:
    """Rack r1 confirmed every card asleep at level 5 under a 500 W limit, then was reset to its defaults
    (awake, top clock, 700 W) without publishing its applied state. Its readings show the defaults for a
    while; the agent, its confirmation forgotten, commands the cards again and the rack confirms that
    (stamped after the readings, and not what they showed: no explanation), and a confirmation in the
    window that does not agree with the readings (an applied state stamped before them, showing the old
    settings) explains nothing either. Each of the 64 cards counts once per setting, on r1 only: the
    readings that disprove that confirmation again are the same disproval (it was stamped within the first
    reading's bound; counted twice before, 128 per setting, when the card's setting was disproved again)."""
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
    assert _disproved(service, r1) == {"level": 64.0, "power_limit": 64.0, "low_power": 64.0}
    assert _disproved(service, r0) == NONE


def _exported(service: AgentService, rack: str) -> float | None:
    """The level count of ``rack`` on /metrics as the service's own health tick last brought it up to date
    (no update here)."""
    body = service.metrics.exposition().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }
    return _at(samples, "racktwin_applied_state_disproved_total", setting="level", rack=rack)


async def test_a_disproval_is_counted_in_a_telemetry_blackout_without_any_new_message(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The running service, connected to a real mosquitto, site time 30 times the wall clock: rack r0
    confirms its 16 cards at level 5 (1430 MHz), then a reading shows card 3 at the top clock (a reset
    card) and the telemetry stops for good. No late applied state comes to explain it; the site clock
    extrapolates past the bound (the reading plus the 1.5 s margin plus the 30 s telemetry deadline) and
    the service's health tick counts it, and /metrics shows it, with no message taken in since the
    reading. Before, only a message's handling settled a disproval: the count waited for the telemetry
    to come back."""
    service = service_on(
        mosquitto, tmp_path, period_s=15.0, speed=30.0, telemetry_deadline_s=30.0, infer_time_scale=False
    )
    r0, r1 = service.site.rack_names
    n = service.site.cards_per_rack
    codec = wire.Codec(wire.SiteLayout.from_spec(service.site, site=SITE_ID))
    top = np.full(n, 1430.0)
    top[3] = 1980.0
    messages: list[wire.Message] = [_applied(r0, START, level=5, limit_w=700.0, low=np.zeros(n, dtype=bool))]
    for i in range(1, 4):  # r0 at its confirmed level, r1 alongside
        messages += [cards_msg(r, START + i, n=n, sm_clock_mhz=np.full(n, 1430.0)) for r in (r0, r1)]
    messages.append(cards_msg(r0, START + 5.0, n=n, sm_clock_mhz=top))  # the last message: card 3 disproves
    ing = service.ingest
    async with running(service), Bus(mosquitto.options(), subscriptions=(), name="racks") as racks:
        await wait_for("the racks' connection", lambda: racks.connected)
        for m in messages:
            out = codec.outgoing(m)
            await racks.publish(out.topic, out.payload, qos=out.qos, retain=out.retain)
        await wait_for("the racks' messages", lambda: sum(ing.stats.by_kind.values()) == len(messages))
        assert ing.applied_level[3] == -1 and np.all(ing.applied_level[4:n] == 5)  # disproved, pending
        assert ing.stats.applied_levels_disproved == 0
        taken = dict(ing.stats.by_kind)
        await wait_for("the count on /metrics", lambda: _exported(service, r0) == 1.0)
        assert ing.stats.by_kind == taken  # no message since the reading
        assert ing.stats.applied_disproved == {("level", r0): 1} and ing.stats.applied_disprovals_explained == 0
        clock_now = service.clock.now()
        assert clock_now is not None and clock_now > START + 5.0 + 1.5 + 30.0
        assert service.clock.latest_ts_s == START + 5.0  # extrapolated: the newest stamp is the reading's


def test_in_a_broker_outage_the_health_tick_counts_nothing_and_the_applied_state_may_still_explain_it(
    service: AgentService,
) -> None:
    """Not connected (a broker outage: the service here never connects), the health tick leaves a
    disproval pending however far the site clock extrapolates: the applied state that explains it may
    be what the outage holds up (the broker hands its retained copy over on the new subscription). Here
    it comes after 100 silent site seconds, stamped before the reading: it explains the disproval, and
    nothing is counted. Settled on the extrapolated clock, the tick would have counted 3 levels."""
    rack = service.site.rack_names[0]
    ing = service.ingest
    wall = FakeWall()
    ing.clock = SiteClock(1.0, infer=False, wall=wall)  # the ingest's clock, moved by the test
    _confirm_level_5(ing, rack, clock_mhz=1430.0, card_0_asleep=False)
    ing.handle(_disproving(rack, T0 + 6.0, limits_raised=False))
    assert np.all(ing.applied_level[3:6] == -1)  # disproved, pending
    assert not service.bus.connected
    wall.t += 100.0  # 100 site s without a message: past the bound (T0 + 6 + 1.5 + 30)
    service._settle_disprovals()
    assert _disproved(service) == NONE and ing.stats.applied_disproved == {}
    levels = np.full(N, 5)
    levels[3:6] = 0
    late = _applied(rack, T0 + 5.5, level=5, limit_w=500.0, low=np.zeros(N, dtype=bool))
    ing.handle(dataclasses.replace(late, dvfs_level=levels))  # the late applied state, after the outage
    service._settle_disprovals()
    assert _disproved(service) == NONE and ing.stats.applied_disprovals_explained == 3


def test_after_a_broker_outage_the_clock_stepping_back_to_the_late_messages_counts_nothing_they_explain(
    service: AgentService,
) -> None:
    """As above, but as the running service does it: the health tick reads the site clock every second
    (its metrics), so the clock has extrapolated 100 s past the reading when the outage ends (it
    ran ahead of the site during the silence) when the rack's queued messages come in: a reading stamped
    a second after the disproving one steps the clock back (a correction on the same timeline), then the
    applied state stamped before it. The step back does not count the pending disproval: the late applied
    state explains it. Counted at every correction, these 3 levels were counted here, and a late batch
    after commands raised RacktwinRackSettingsChanged; only a new timeline (the site's clock went back)
    counts them at once."""
    rack = service.site.rack_names[0]
    ing = service.ingest
    wall = FakeWall()
    ing.clock = SiteClock(1.0, infer=False, wall=wall)
    _confirm_level_5(ing, rack, clock_mhz=1430.0, card_0_asleep=False)
    ing.handle(_disproving(rack, T0 + 6.0, limits_raised=False))
    assert np.all(ing.applied_level[3:6] == -1)  # disproved, pending
    for _ in range(100):  # the health tick's reads of the site clock, one a second, during the outage
        wall.t += 1.0
        assert ing.clock.now() is not None
        service._settle_disprovals()  # not connected: nothing settled
    corrections = ing.clock.corrections
    ing.handle(_disproving(rack, T0 + 7.0, limits_raised=False))  # queued
    assert ing.clock.corrections == corrections + 1 and ing.clock.timelines_left == 0  # a step back, same timeline
    levels = np.full(N, 5)
    levels[3:6] = 0
    late = _applied(rack, T0 + 5.5, level=5, limit_w=500.0, low=np.zeros(N, dtype=bool))
    ing.handle(dataclasses.replace(late, dvfs_level=levels))  # the rack's applied state, queued behind it
    assert _disproved(service) == NONE and ing.stats.applied_disprovals_explained == 3


def _on_host(host: str, make: Callable[[], AgentService]) -> AgentService:
    """An agent made as if on ``host`` (two agents of one process on one host, with one pid, would take
    each other for an earlier run whose process is gone)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("agent.other_agents.host_name", lambda: host)
        return make()


async def _counted_once(name: str, agent: AgentService, kinds: dict[str, int], rack: str) -> None:
    """Wait until ``agent`` has taken in the racks' messages (``kinds``: how many of each) and its
    /metrics shows one level disproved on ``rack``."""
    taken = agent.ingest.stats.by_kind
    await wait_for(f"the racks' messages at {name}", lambda: all(taken.get(k, 0) >= v for k, v in kinds.items()))
    await wait_for(
        f"the count on {name}'s /metrics",
        lambda: _exported(agent, rack) == 1.0,
        30.0,
        found=lambda: f"{_exported(agent, rack)} {agent.ingest.stats}",
    )


async def test_an_agent_standing_by_counts_the_same_disprovals_as_the_one_that_commands(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """Two agents in enforce mode on one site and one real mosquitto: A commands, B, started later,
    stands by. A rack's messages: r0 confirms its cards at level 5; a reading shows card 4 at the top
    clock and the applied state confirming level 0 for it comes after it, stamped before it (A's
    command applied: the reading overtook the confirmation); a later reading shows card 3 at the top
    clock too, which no applied state explains (a card reset behind the agents' backs). Each agent
    counts card 3 once and card 4 not at all: what a standby counts is a change outside any command
    whose application its rack confirmed, the commanding agent's included, not that agent's settings.
    It sees the same site as the agent that commands and counts the same, as it exports the same rack
    powers, die temperatures and telemetry ages (docs/agent.md, "Observability":
    ``RacktwinRackSettingsChanged`` fires on both agents, as every alert on what the racks report)."""

    def make(folder: Path) -> AgentService:
        folder.mkdir()
        return service_on(
            mosquitto,
            folder,
            period_s=15.0,
            speed=30.0,
            mode="enforce",
            telemetry_deadline_s=30.0,
            infer_time_scale=False,
        )

    a = _on_host("host-a", lambda: make(tmp_path / "a"))
    b = _on_host("host-b", lambda: make(tmp_path / "b"))
    r0, r1 = a.site.rack_names
    n = a.site.cards_per_rack
    codec = wire.Codec(wire.SiteLayout.from_spec(a.site, site=SITE_ID))
    at_5 = np.full(n, 1430.0)  # level 5's clock
    card_4_top = at_5.copy()
    card_4_top[4] = 1980.0  # the top level's: level 0
    both_top = card_4_top.copy()
    both_top[3] = 1980.0
    level_0_on_4 = np.full(n, 5)
    level_0_on_4[4] = 0
    messages: list[wire.Message] = [_applied(r0, START, level=5, limit_w=700.0, low=np.zeros(n, dtype=bool))]
    for i in range(1, 4):
        messages += [cards_msg(r, START + i, n=n, sm_clock_mhz=at_5) for r in (r0, r1)]
    messages.append(cards_msg(r0, START + 5.0, n=n, sm_clock_mhz=card_4_top))
    late = _applied(r0, START + 4.6, level=5, limit_w=700.0, low=np.zeros(n, dtype=bool))
    messages.append(dataclasses.replace(late, dvfs_level=level_0_on_4))  # A's command, confirmed late
    messages += [cards_msg(r0, START + t, n=n, sm_clock_mhz=card_4_top) for t in (6.0, 7.0)]
    messages.append(cards_msg(r0, START + 8.0, n=n, sm_clock_mhz=both_top))  # card 3: reset
    kinds: dict[str, int] = {}
    for m in messages:
        kinds[wire.kind_of(m).value] = kinds.get(wire.kind_of(m).value, 0) + 1
    async with running(a):
        await wait_for("agent A's status", lambda: a.bus.stats.published > 0)
        async with running(b), Bus(mosquitto.options(), subscriptions=(), name="racks") as racks:
            await wait_for("agent B standing by for A", lambda: b.standing_by_for is not None, 30.0)
            await wait_for(  # it reconnects under a client id of its own (its second connection)
                "B connected under its standby id",
                lambda: (
                    "-standby-" in (b.bus.options.client_id or "") and b.bus.connected and b.bus.stats.connects >= 2
                ),
                30.0,
            )
            await wait_for("the racks' connection", lambda: racks.connected)
            for m in messages:
                out = codec.outgoing(m)
                await racks.publish(out.topic, out.payload, qos=out.qos, retain=out.retain)
            for name, agent in (("A", a), ("B", b)):
                await _counted_once(name, agent, kinds, r0)
            assert a.commanding() and not b.commanding() and b.standing_by_for is not None
            for agent in (a, b):
                assert agent.ingest.stats.applied_disproved == {("level", r0): 1}
                assert agent.ingest.applied_level[3] == -1 and agent.ingest.applied_level[4] == 0
                assert _exported(agent, r1) == 0.0
