"""Order and timelines in the agent's ingest (``agent.ingest``): an applied state older than the one taken,
a job snapshot made long before the site's now, a snapshot that overtakes the end event it includes.
In process on the example site (8 racks of 64 cards: rack r1's card 0 is site card 64; level 0 is the top
clock, 1980 MHz, level 5 1430 MHz), and through a real mosquitto where the broker makes the order."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import example_site
from mqtt_testing import wait_for
from test_applied_disproved_metrics import _applied
from test_clock_ingest import T0, FakeWall, _rack_applied, cards_msg, past_the_bound
from test_job_catchup import _facility, event, running, snapshot, spec
from test_service_audit import SITE_ID, START, service_on
from test_service_audit import running as service_running

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from agent.clock import SiteClock
from agent.ingest import Ingest
from twin.state import TwinState
from twin.workload import Phase

pytestmark = pytest.mark.agent

TOP_MHZ = 1980.0  # level 0's clock


def _ingest(clock: SiteClock | None = None) -> tuple[TwinState, Ingest]:
    site = example_site()
    state = TwinState(site)
    return state, Ingest(site, state, clock or SiteClock(1.0))


def test_an_applied_state_older_than_the_one_taken_is_refused_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Rack r0 slowed its cards to level 5 (applied state stamped T0 + 10), then raised them to the top
    level (T0 + 20). The older one reaches the agent after the newer (a second publisher for the rack: a
    stale bridge; a broker bridge): taken, it set the cards back to level 5, and the next reading at the
    top clock disproved it and counted 64 cards reset behind the agent's back
    (``racktwin_applied_state_disproved_total``, alert ``RacktwinRackSettingsChanged``) that never were.
    Now it is refused for those cards, counted and logged; the newer confirmation stands."""
    state, ing = _ingest()
    ing.handle(cards_msg("r0", T0 + 19.0, sm_clock_mhz=np.full(64, TOP_MHZ)))
    ing.handle(dataclasses.replace(_rack_applied("r0", T0 + 20.0, 0), seq=8))
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, TOP_MHZ)))
    with caplog.at_level(logging.INFO, logger="racktwin.agent.ingest"):
        ing.handle(dataclasses.replace(_rack_applied("r0", T0 + 10.0, 5), seq=3, publisher="bridge-r0"))
    assert np.all(ing.applied_level[:64] == 0)
    assert ing.stats.applied_states_old == {"r0": 1}
    lines = [r.getMessage() for r in caplog.records if "applied state of r0" in r.getMessage()]
    assert len(lines) == 1 and "bridge-r0" in lines[0] and "64 of its cards" in lines[0], lines
    ing.handle(cards_msg("r0", T0 + 22.0, sm_clock_mhz=np.full(64, TOP_MHZ)))
    past_the_bound(ing, T0 + 22.0)
    assert ing.stats.applied_disproved == {} and np.all(state.card_level[:64] == 0)
    # a newer one, and one at the same stamp (a second command applied in the same second), are taken
    ing.handle(dataclasses.replace(_rack_applied("r0", T0 + 30.0, 4), seq=9))
    ing.handle(dataclasses.replace(_rack_applied("r0", T0 + 30.0, 3), seq=10))
    assert np.all(ing.applied_level[:64] == 3) and ing.stats.applied_states_old == {"r0": 1}


def test_an_older_applied_state_is_refused_only_for_the_cards_it_is_older_for() -> None:
    """A rack that confirms some cards only (its command named them): an older applied state of the whole
    rack is refused for those and taken for the cards that held nothing newer."""
    _state, ing = _ingest()
    ing.handle(cards_msg("r0", T0 + 20.0))
    newer = wire.AppliedState(
        rack="r0",
        card_index=np.arange(4),
        dvfs_level=np.zeros(4, dtype=np.int64),
        min_clock_mhz=np.full(4, 1210.0),
        max_clock_mhz=np.full(4, TOP_MHZ),
        power_limit_w=np.full(4, 700.0),
        low_power=np.zeros(4, dtype=bool),
        last_command_id=None,
        ts_s=T0 + 20.0,
        seq=8,
        publisher="sim",
    )
    ing.handle(newer)
    ing.handle(_rack_applied("r0", T0 + 10.0, 5))
    assert np.all(ing.applied_level[:4] == 0) and np.all(ing.applied_level[4:64] == 5)
    assert ing.stats.applied_states_old == {"r0": 1}


def test_a_restarted_racks_applied_state_stamped_behind_the_old_timeline_is_taken_once_the_clock_follows() -> None:
    """A simulator restarted 600 s back on the same epoch publishes its applied state before its first
    telemetry: stamped before the old run's, while the site clock is still the old run's, it is refused as
    older. Once the clock has followed the new timeline back, it is taken (the agent would otherwise keep
    the old run's confirmation until the rack's next command); an applied state stamped after the site's
    now (another timeline's) never makes one refused."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    _state, ing = _ingest(clock)
    for i in range(10):
        ing.handle(cards_msg("r0", T0 + i, sm_clock_mhz=np.full(64, 1430.0)))
        wall.t += 0.05
    ing.handle(_rack_applied("r0", T0 + 9.0, 5))
    wall.t += 2.0  # the old run stops; the new one comes back 600 s behind
    ing.handle(_rack_applied("r0", T0 - 600.0, 0))
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {
        "r0": 1
    }  # the clock is the old run's
    for i in range(12):
        ing.handle(cards_msg("r0", T0 - 600.0 + i, sm_clock_mhz=np.full(64, TOP_MHZ)))
        wall.t += 0.05
    assert clock.corrections == 1
    assert np.all(ing.applied_level[:64] == 0)  # taken when the clock stepped back
    ing.handle(_rack_applied("r0", T0 - 590.0, 2))
    assert np.all(ing.applied_level[:64] == 2) and ing.stats.applied_states_old == {"r0": 1}


def test_an_applied_state_taken_from_an_earlier_run_stamped_ahead_refuses_nothing() -> None:
    """The retained applied state an earlier run left stamped an hour after the site's now: the rack's own,
    stamped before it, is taken (and the readings may disprove the earlier run's, as before)."""
    _state, ing = _ingest()
    ing.handle(_facility(T0))
    ing.handle(_rack_applied("r0", T0 + 3600.0, 5))
    ing.handle(_rack_applied("r0", T0 + 1.0, 0))
    assert np.all(ing.applied_level[:64] == 0) and ing.stats.applied_states_old == {}


async def test_through_mosquitto_a_second_publishers_older_applied_state_does_not_undo_the_racks(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """The running service against a real mosquitto (2 racks of 16 cards): the rack confirms its cards at
    the top level; then a second publisher on the rack's applied topic (a stale bridge) publishes an
    applied state stamped before it, at level 5. The broker keeps the order it got them in, so the agent
    gets the older one last: refused and counted, the rack's confirmation stands, and the rack's next
    reading at the top clock disproves nothing."""
    service = service_on(mosquitto, tmp_path, period_s=15.0, speed=30.0, infer_time_scale=False)
    r0, r1 = service.site.rack_names
    n = service.site.cards_per_rack
    codec = wire.Codec(wire.SiteLayout.from_spec(service.site, site=SITE_ID))
    top = np.full(n, TOP_MHZ)
    no_sleep = np.zeros(n, dtype=bool)
    rack_msgs: list[wire.Message] = [
        cards_msg(r, START + i, n=n, sm_clock_mhz=top) for i in (1, 2, 3) for r in (r0, r1)
    ]
    rack_msgs.append(dataclasses.replace(_applied(r0, START + 3.0, level=0, limit_w=700.0, low=no_sleep), seq=5))
    stale = dataclasses.replace(_applied(r0, START + 2.0, level=5, limit_w=700.0, low=no_sleep), publisher="bridge")
    reading = cards_msg(r0, START + 5.0, n=n, sm_clock_mhz=top)
    ing = service.ingest
    async with (
        service_running(service),
        Bus(mosquitto.options(), subscriptions=(), name="racks") as racks,
        Bus(mosquitto.options(), subscriptions=(), name="bridge") as bridge,
    ):
        await wait_for("the publishers' connections", lambda: racks.connected and bridge.connected)
        for publisher, m in [(racks, m) for m in rack_msgs] + [(bridge, stale), (racks, reading)]:
            out = codec.outgoing(m)
            await publisher.publish(out.topic, out.payload, qos=1, retain=out.retain)
            if m is rack_msgs[-1]:  # the rack's applied state taken before the bridge's goes out
                await wait_for("the rack's applied state", lambda: ing.stats.by_kind.get("applied", 0) == 1)
        await wait_for("every message", lambda: sum(ing.stats.by_kind.values()) == len(rack_msgs) + 2)
        assert ing.stats.applied_states_old == {r0: 1}
        assert np.all(ing.applied_level[:n] == 0)  # the rack's confirmation, not the bridge's
        assert ing.stats.applied_disproved == {} and np.all(np.isnan(ing.applied._explain_by_s))  # nothing pending


def test_a_snapshot_made_hours_before_the_site_now_is_taken() -> None:
    """The scheduler publishes its snapshot when its job set changes: on a quiet site (long training jobs,
    none ending or starting) the retained one an agent finds at its (re)start may be hours old and still
    true, and it is what keeps a job in a checkpoint (its cards read idle) from being slept or placed on.
    So a snapshot stamped behind the site's now is taken however far behind, unlike one stamped ahead of it
    (only another timeline stamps there). Refused, an agent restarted four hours into such jobs took their
    cards for idle. What an earlier run left behind is replaced by the new run's first snapshot (or undone
    by its events): its jobs go then, counted dropped."""
    state, ing = _ingest(SiteClock(1.0, infer=False))
    ing.handle(_facility(T0 + 4 * 3600.0))
    ing.handle(snapshot(T0, 41, running("long", {"r1": (0, 1, 2, 3)}, Phase.CHECKPOINT)))
    assert ing.stats.job_snapshots == 1 and ing.stats.job_snapshots_ahead == 0
    assert state.jobs["long"].state == "running" and state.jobs["long"].cards == (64, 65, 66, 67)
    ing.handle(snapshot(T0 + 4 * 3600.0, 0))  # a new run of the scheduler (its seq from 0): no job
    assert state.jobs == {} and ing.stats.job_snapshot_dropped == 1


def test_a_snapshot_that_overtakes_the_end_it_includes_frees_the_cards_and_counts_the_job_once() -> None:
    """A broker that keeps no order across topics (a bridge, a cluster; mosquitto keeps one publisher's
    QoS 1 order) may hand the agent the snapshot made after a job's ``finished`` before the event. The
    snapshot no longer lists the job: it goes at once, its cards free for the queue, counted dropped (the
    agent cannot tell it finished); the event, when it comes, neither brings it back nor counts it again.
    The plan is the same as in order; only the ``dropped`` count (no alert on it) says an end was lost."""
    state, ing = _ingest(SiteClock(1.0, infer=False))
    ing.handle(_facility(T0))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0, 1, cards={"r1": (0, 1)}))
    ing.handle(snapshot(T0 + 5.0, 3))  # made after the end (seq 2): lists no job
    assert state.jobs == {} and (state.jobs_finished, state.jobs_dropped) == (0, 1)
    assert ing.stats.job_snapshot_dropped == 1
    ing.handle(event(wire.JobEventType.FINISHED, "j1", T0 + 5.0, 2))  # the end, overtaken
    assert state.jobs == {} and (state.jobs_finished, state.jobs_dropped) == (0, 1)
    assert ing.stats.job_snapshot_dropped == 1


def _restart_behind(ing: Ingest, wall: FakeWall, clock: SiteClock, at_s: float, mhz: float) -> None:
    """The old run stops and a new one comes back on a timeline starting ``at_s``: rack r0's readings (its
    cards at ``mhz``) until the site clock has followed it back."""
    corrections = clock.corrections
    wall.t += 2.0
    for i in range(12):
        ing.handle(cards_msg("r0", at_s + i, sm_clock_mhz=np.full(64, mhz)))
        wall.t += 0.05
    assert clock.corrections == corrections + 1 and clock.timelines_left >= 1


def _r0_confirmed_5() -> tuple[FakeWall, SiteClock, Ingest]:
    """Rack r0 read at level 5's clock for ten site seconds (a site at 20x) and confirmed level 5 (T0 + 9)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    _state, ing = _ingest(clock)
    for i in range(10):
        ing.handle(cards_msg("r0", T0 + i, sm_clock_mhz=np.full(64, 1430.0)))
        wall.t += 0.05
    ing.handle(_rack_applied("r0", T0 + 9.0, 5))
    return wall, clock, ing


def _r0_confirmed_5_then_an_older_0_refused() -> tuple[FakeWall, SiteClock, Ingest]:
    """:func:`_r0_confirmed_5`, then an applied state stamped T0 + 5 at level 0 (a stale bridge): refused,
    counted and kept."""
    wall, clock, ing = _r0_confirmed_5()
    ing.handle(_rack_applied("r0", T0 + 5.0, 0))
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {"r0": 1}
    return wall, clock, ing


def test_a_refused_applied_state_of_the_old_timeline_is_not_taken_after_a_mere_step_back_or_a_restart() -> None:
    """The site clock runs ahead during a telemetry silence and steps back to the next reading (the same
    timeline): the applied state refused as older (a stale bridge's, stamped T0 + 5) is not tried again
    and not counted a second time (``racktwin_applied_states_old_total`` counts messages, not tries). A
    later restart of the site (a new timeline, 600 s behind) must not take it either: it is stamped far
    ahead of the new timeline's now, so it is the old timeline's (it was taken there, level 0 over the
    confirmed 5, before ``AppliedStates.clock_stepped_back`` tried only those stamped up to its now)."""
    wall, clock, ing = _r0_confirmed_5_then_an_older_0_refused()
    wall.t += 1.0  # a silence: 20 site s at the clock's rate
    assert clock.now() == pytest.approx(T0 + 30.0)
    timelines = clock.timelines_left
    ing.handle(cards_msg("r0", T0 + 11.0, sm_clock_mhz=np.full(64, 1430.0)))
    assert clock.now() == pytest.approx(T0 + 11.0) and clock.timelines_left == timelines  # a mere step back
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {"r0": 1}
    _restart_behind(ing, wall, clock, T0 - 600.0, 1430.0)
    assert np.all(ing.applied_level[:64] == 5)  # the old run's confirmation, never the refused one
    assert ing.stats.applied_states_old == {"r0": 1}


def test_a_refused_applied_state_is_not_tried_again_once_its_rack_confirmed_a_newer_one() -> None:
    """After refusing an older applied state, the rack confirms a newer one (level 3): the one refused is
    no new timeline's (the rack spoke since). When the site restarts behind, it is not taken: the rack's
    newest confirmation stands."""
    wall, clock, ing = _r0_confirmed_5_then_an_older_0_refused()
    ing.handle(_rack_applied("r0", T0 + 10.0, 3))
    assert np.all(ing.applied_level[:64] == 3)
    _restart_behind(ing, wall, clock, T0 - 600.0, 1430.0)
    assert np.all(ing.applied_level[:64] == 3) and ing.stats.applied_states_old == {"r0": 1}


@pytest.mark.parametrize("newest_first", [False, True])
def test_of_the_applied_states_refused_the_newest_is_taken_when_the_site_restarts_behind(newest_first: bool) -> None:
    """Two applied states of a restarted rack arrive while the site clock is still the old run's (T0 + 9):
    both refused as older. When the clock follows the new timeline back, the newer of the two (T0 - 590, level
    2) is taken, in whichever order they came: the older (T0 - 600, level 0) was the rack's setting before it."""
    wall, clock, ing = _r0_confirmed_5()
    first, second = _rack_applied("r0", T0 - 600.0, 0), _rack_applied("r0", T0 - 590.0, 2)
    for msg in (second, first) if newest_first else (first, second):
        ing.handle(msg)
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {"r0": 2}
    _restart_behind(ing, wall, clock, T0 - 595.0, 1430.0)
    assert np.all(ing.applied_level[:64] == 2)


def test_an_older_applied_state_is_refused_when_the_one_taken_is_stamped_at_the_site_now() -> None:
    """The rack's applied state is the newest stamp and no time has passed since (the site's now is its
    stamp): it is of this timeline, and an older one arriving now is refused like any other."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    _state, ing = _ingest(clock)
    ing.handle(cards_msg("r0", T0 + 9.0, sm_clock_mhz=np.full(64, 1430.0)))
    ing.handle(_rack_applied("r0", T0 + 9.0, 5))
    assert clock.now() == T0 + 9.0
    ing.handle(_rack_applied("r0", T0 + 5.0, 0))
    assert np.all(ing.applied_level[:64] == 5) and ing.stats.applied_states_old == {"r0": 1}
