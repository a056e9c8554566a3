"""Mutation audit of the agent's ingest (``agent.ingest``, ``agent.job_catchup``, ``agent.round_merger``):
behaviour the audit found no test holding, each test named for what an operator relies on. Example site:
8 racks of 64 cards (rack r1's card 0 is site card 64)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from agent_helpers import example_site
from test_clock_ingest import T0, FakeWall, _cdu, _every, _rack_applied, cards_msg, past_the_bound
from test_job_catchup import _facility, event, queued, running, snapshot, spec

from agent import wire
from agent.clock import SiteClock
from agent.ingest import Ingest
from agent.round_merger import RoundMerger
from twin.readings import JobEvent, Readings
from twin.state import TwinState
from twin.workload import Phase

pytestmark = pytest.mark.agent


def test_after_the_clock_steps_back_the_new_timelines_job_snapshot_is_reconciled() -> None:
    """A simulator restarted 600 s back on the same epoch: the old timeline's events were stamped after
    anything the new one sends for ten minutes. The snapshot the new scheduler sends is its catch-up
    (the jobs it started before the agent heard its events): reconciled, not refused as older than the
    old timeline's last event."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    for i in range(10):
        ing.handle(cards_msg("r0", T0 + i))
        wall.t += 0.05
    ing.handle(event(wire.JobEventType.SUBMITTED, "old", T0 + 9, 40, job=spec("old", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "old", T0 + 9, 41, cards={"r1": (0, 1)}))
    assert set(state.jobs) == {"old"}
    wall.t += 2.0  # silent; the restarted site comes back 600 s behind
    for i in range(12):
        ing.handle(cards_msg("r0", T0 - 600.0 + i))
        wall.t += 0.05
    assert clock.corrections == 1
    readings, now = ing.flush(), clock.now()
    assert readings is not None and now is not None
    assert readings.time_s == T0 - 589.0 and state.time_s <= now  # the belief's time came back too
    ing.handle(snapshot(T0 - 589.0, 3, running("new", {"r2": (0, 1, 2, 3)}, Phase.COMPUTE), queued("q", 8)))
    assert ing.stats.job_snapshots == 1 and ing.stats.job_snapshots_old == 0
    assert set(state.jobs) == {"new", "q"}  # "old" is not in the new scheduler's table: dropped
    assert state.jobs["new"].cards == (128, 129, 130, 131) and state.jobs["new"].state == "running"


def test_a_retained_applied_state_handed_over_again_does_not_confirm_what_a_reading_disproved() -> None:
    """Rack r0 confirmed level 5; it was reset (a reading at the top clock disproved the level); the agent
    reconnects and the broker hands it the rack's retained applied state again, the same message. Taken
    again, it confirmed level 5 once more (the belief planned the reset cards at the old slower level, and
    the diff did not command them) until the next reading disproved it a second time, and the one reset
    was counted twice (128 disprovals for 64 cards)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    confirmed = dataclasses.replace(_rack_applied("r0", T0 + 10.0, 5), seq=17)
    ing.handle(confirmed)
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.flush()
    assert np.all(ing.applied_level[:64] == -1)
    ing.handle(confirmed)  # the retained copy, at the agent's new subscription
    assert np.all(ing.applied_level[:64] == -1) and np.all(state.card_level[:64] == 0)
    ing.handle(cards_msg("r0", T0 + 21.0, sm_clock_mhz=np.full(64, 1980.0)))
    past_the_bound(ing, T0 + 21.0)
    assert ing.stats.applied_disproved == {("level", "r0"): 64}
    # a new applied state of the rack (the agent commanded it again) is taken, also one at the same stamp
    # (a second command applied in the same second: the rack's next seq)
    ing.handle(dataclasses.replace(_rack_applied("r0", T0 + 80.0, 3), seq=18))
    ing.handle(dataclasses.replace(_rack_applied("r0", T0 + 80.0, 4), seq=19))
    assert np.all(ing.applied_level[:64] == 4)


def test_a_facility_reading_stamped_far_ahead_is_not_taken_into_the_belief() -> None:
    """The facility meter stamps one reading an hour ahead of the site (a stepped clock): dropped like a
    rack's, counted ``ahead``. Taken, it moved the belief's time an hour ahead and stood for the site's
    facility reading until the meter's clock caught up (every newer one refused as older)."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    ing.handle(_facility(T0))
    wall.t += 1.0
    ing.handle(_facility(T0 + 3600.0))
    ing.flush()
    assert ing.stats.ahead == 1
    assert state.facility is not None and state.facility.time_s == T0 and state.time_s == T0
    wall.t += 1.0
    ing.handle(_facility(T0 + 2.0))
    ing.flush()
    assert state.facility is not None and state.facility.time_s == T0 + 2.0


def test_a_disproval_pending_when_the_site_restarts_is_counted_at_once() -> None:
    """A reading disproved r0's confirmed level and waits for a late applied state to explain it (the
    agent's own command); the site restarts 600 s back. No applied state of the new timeline explains a
    reading of the old one: counted at the step back. Left pending, it waited until the new timeline
    reached the old one's stamps (ten minutes), and an applied state of the new run stamped before them
    could explain it away."""
    site = example_site()
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall, reset_after_s=1.0, confirm_s=0.5)  # a site at wall speed
    state = TwinState(site)
    ing = Ingest(site, state, clock)
    ing.handle(_rack_applied("r0", T0, 5))
    for i in range(10):
        ing.handle(cards_msg("r0", T0 + i, sm_clock_mhz=np.full(64, 1430.0 if i < 5 else 1980.0)))
        wall.t += 1.0
    assert np.all(ing.applied_level[:64] == -1) and ing.stats.applied_disproved == {}  # pending
    wall.t += 2.0  # silent; the restarted site comes back 600 s behind
    for i in range(12):
        ing.handle(cards_msg("r1", T0 - 600.0 + 0.05 * i))
        wall.t += 0.05
    now = clock.now()
    assert clock.timelines_left == 1 and now is not None and now < T0 - 599.0
    assert ing.stats.applied_disproved == {("level", "r0"): 64}
    ing.handle(_rack_applied("r0", T0 - 599.0, 0))  # the new run's own applied state: explains nothing old
    assert ing.stats.applied_disprovals_explained == 0
    # the restarted rack replays its run: an applied state with the stamp and seq of the one disproved on
    # the old timeline is the new run's, not a copy of it
    ing.handle(_rack_applied("r0", T0, 5))
    assert np.all(ing.applied_level[:64] == 5)


def test_a_job_event_is_handed_on_after_the_readings_that_came_before_it() -> None:
    """r1's cards report, then the job on them finishes: the belief the event is handed to (the service
    decides again on it) holds that reading, and the estimator got the round before the event."""
    site = example_site()
    state = TwinState(site)
    order: list[str] = []
    seen_at_event: list[tuple[float, float]] = []  # when r1's and r2's cards were last read

    def on_event(ev: JobEvent) -> None:
        order.append(f"event {ev.kind}")
        seen_at_event.append((float(state.card_last_seen_s[64]), float(state.card_last_seen_s[128])))

    ing = Ingest(site, state, SiteClock(1.0), on_event=on_event, on_round=lambda r: order.append("round"))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 2)))
    ing.handle(cards_msg("r1", T0 + 1.0))
    ing.handle(event(wire.JobEventType.FINISHED, "j1", T0 + 1.0, 1))
    assert order == ["event submitted", "round", "event finished"]
    assert seen_at_event[-1][0] == T0 + 1.0
    # so with the jobs a snapshot adds (the catch-up of an agent that missed their events)
    ing.handle(cards_msg("r2", T0 + 2.0))
    ing.handle(snapshot(T0 + 2.0, 2, running("j2", {"r2": (0, 1)}, Phase.COMPUTE)))
    assert order[3:] == ["round", "event submitted", "event started"]
    assert seen_at_event[-1] == (T0 + 1.0, T0 + 2.0)


def test_a_card_awake_at_0_mhz_whose_power_reading_is_missing_has_failed() -> None:
    """A dead card reads 0 MHz; its power sensor may be gone with it (NaN): failed as at 0 W, so that no
    job is placed on it."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    clock_mhz, power = np.full(64, 1870.0), np.full(64, 300.0)
    clock_mhz[[3, 4]] = 0.0
    power[3] = np.nan
    ing.handle(cards_msg("r2", T0, sm_clock_mhz=clock_mhz, power_w=power))
    ing.flush()
    assert np.flatnonzero(state.card_failed).tolist() == [128 + 3]  # card 4 draws 300 W: not dead


def test_a_card_gone_to_sleep_keeps_the_level_it_was_read_at() -> None:
    """A card's level, while its rack confirmed none, is the one its clock was last read at: asleep at
    0 MHz it is not read at the slowest level (the card wakes at the level it had)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(cards_msg("r0", T0, sm_clock_mhz=np.full(64, 1980.0)))
    asleep = np.zeros(64, dtype=bool)
    asleep[:8] = True
    clock_mhz = np.full(64, 1980.0)
    clock_mhz[:8] = 0.0
    ing.handle(cards_msg("r0", T0 + 1.0, sm_clock_mhz=clock_mhz, low_power=asleep, power_w=np.full(64, 30.0)))
    ing.flush()
    assert state.card_low_power[:8].all() and np.all(state.card_level[:64] == 0)


def test_an_implausible_clock_reading_disproves_no_confirmed_level() -> None:
    """A garbage clock (above any card's, or infinite) is not a card running faster than its confirmed
    level: the confirmation stays (forgotten, the agent would command the card again on a bad sensor
    value). A reading stamped exactly the margin (1.5 s) after the applied state may still have been taken
    before the setting applied: it does not disprove it either; one just after it does."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(_rack_applied("r0", T0 + 10.0, 5))
    garbage = np.full(64, 1430.0)
    garbage[0], garbage[1] = 1e6, np.inf
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=garbage))
    ing.flush()
    assert np.all(ing.applied_level[:64] == 5)
    ing.handle(_rack_applied("r1", T0 + 20.0, 5))
    ing.handle(cards_msg("r1", T0 + 21.5, sm_clock_mhz=np.full(64, 1980.0)))
    assert np.all(ing.applied_level[64:128] == 5)
    ing.handle(cards_msg("r1", T0 + 21.75, sm_clock_mhz=np.full(64, 1980.0)))
    assert np.all(ing.applied_level[64:128] == -1)


def test_a_racks_reading_interval_is_its_period_when_a_card_drops_out_of_each_reading() -> None:
    """Rack r0 reads its cards every second, but each reading lacks one card (a flaky sensor, another card
    each time): the gap is to the newest earlier reading of the batch's cards, 1 s; taken to the oldest,
    the card left out last time made every gap 2 s, the interval 2 s, and the confirmation margin 3 s."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    for i in range(10):
        keep = np.arange(64) != i
        msg = cards_msg("r0", T0 + i)
        cols = {f: getattr(msg, f)[keep] for f in ("power_w", "temp_c", "sm_clock_mhz", "utilization")}
        cols |= {f: getattr(msg, f)[keep] for f in ("power_limit_w", "low_power")}
        ing.handle(dataclasses.replace(msg, card_index=np.arange(64)[keep], **cols))
    assert ing.applied.reading_interval_s[0] == 1.0


def _pdu(rack: str, ts_s: float) -> wire.PduReading:
    return wire.PduReading(rack=rack, power_w=20_000.0, ts_s=ts_s, seq=0, publisher="sim")


def test_a_confirmed_level_or_limit_is_disproved_by_a_clock_past_halfway_or_a_limit_a_watt_off() -> None:
    """Level 5 runs at 1430 MHz at most, level 4 at 1540: a card read at 1500 MHz (past halfway, 1485)
    runs faster than level 5 allows. A reported limit 1 W from the confirmed 700 W is another limit (the
    wire's resolution is 0.1 W); a limit the reading does not report (0, NaN) disproves nothing."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    for rack in ("r0", "r1", "r2"):
        ing.handle(_rack_applied(rack, T0 + 10.0, 5))
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, 1500.0)))
    limit_w = np.full(64, 700.0)
    limit_w[0], limit_w[1], limit_w[2] = 701.0, 0.0, np.nan
    ing.handle(cards_msg("r1", T0 + 20.0, sm_clock_mhz=np.full(64, 1430.0), power_limit_w=limit_w))
    assert np.all(ing.applied_level[:64] == -1) and np.all(ing.applied_level[64:128] == 5)
    assert np.isnan(ing.applied_power_limit_w[64]) and np.all(ing.applied_power_limit_w[65:128] == 700.0)


def test_a_card_confirmed_one_level_below_the_top_is_disproved_by_a_reading_at_the_top_clock() -> None:
    """Level 1 runs at 1870 MHz at most, level 0 at 1980: r0's cards confirmed at level 1 and read at the top
    clock were reset (or raised behind the agent's back): the confirmation is forgotten and, no late applied
    state explaining it, counted. r1's read at 1900 MHz (under halfway, 1925) keep theirs. Trusted, the agent
    planned r0's cards one level slower than they run and never commanded them."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    for rack in ("r0", "r1"):
        ing.handle(_rack_applied(rack, T0 + 10.0, 1))
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.handle(cards_msg("r1", T0 + 20.0, sm_clock_mhz=np.full(64, 1900.0)))
    assert np.all(ing.applied_level[:64] == -1) and np.all(ing.applied_level[64:128] == 1)
    past_the_bound(ing, T0 + 20.0)
    assert ing.stats.applied_disproved == {("level", "r0"): 64}


def test_a_late_applied_state_explains_a_limit_disproval_within_the_wires_resolution() -> None:
    """r0 confirmed 700 W; its reading at +20 s shows 600.2 W (the agent's own lower limit, applied); the
    applied state of that command, 600 W, reaches the agent after the reading, stamped within the margin:
    the rack reads its limit back to a tenth of a watt or so (the wire's 0.1 W), so it explains the
    disproval, and nothing is counted (required to match to the watt, the rack was counted as reset)."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    ing.handle(_rack_applied("r0", T0 + 10.0, 5, limit_w=700.0))
    shown_w = np.full(64, 600.2)
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, 1430.0), power_limit_w=shown_w))
    assert np.all(np.isnan(ing.applied_power_limit_w[:64]))
    ing.handle(_rack_applied("r0", T0 + 21.0, 5, limit_w=600.0))
    past_the_bound(ing, T0 + 20.0)
    assert ing.stats.applied_disprovals_explained == 64 and ing.stats.applied_disproved == {}
    assert np.all(ing.applied_power_limit_w[:64] == 600.0)


def test_a_late_applied_state_explains_a_disproval_only_within_the_margin_and_agreeing() -> None:
    """Each rack confirmed level 5 at +10 s; a reading at +20 s shows its cards at the top clock. The
    rack's applied state of the agent's own raise reaches the agent after that reading: r0's stamped
    the margin (1.5 s) after it, level 0: explained, not counted. r1's stamped 2 s after it: too late to
    have been what the reading showed, counted. r3's names a level the card lacks: it confirms nothing
    and explains nothing, counted."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    for rack in ("r0", "r1", "r3"):
        ing.handle(_rack_applied(rack, T0 + 10.0, 5))
        ing.handle(cards_msg(rack, T0 + 20.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.handle(_rack_applied("r0", T0 + 21.5, 0))
    ing.handle(_rack_applied("r1", T0 + 22.0, 0))
    ing.handle(_rack_applied("r3", T0 + 21.0, 99))
    past_the_bound(ing, T0 + 20.0)
    assert ing.stats.applied_disprovals_explained == 64
    assert ing.stats.applied_disproved == {("level", "r1"): 64, ("level", "r3"): 64}


def test_each_pending_disproval_is_counted_at_its_own_bound() -> None:
    """Disprovals by readings at +20 s (r0), +40 s (r1) and +45 s (r2) are due at +51.5, +71.5 and
    +76.5 s (the margin and the 30 s telemetry deadline): at +55 s only r0's is counted, at +73 s r1's
    too, and r2's late applied state may still explain it."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    for rack in ("r0", "r1", "r2"):
        ing.handle(_rack_applied(rack, T0 + 10.0, 5))
    ing.handle(cards_msg("r0", T0 + 20.0, sm_clock_mhz=np.full(64, 1980.0)))
    for t in (25.0, 30.0, 35.0):  # (the site clock follows stamps up to 10 s ahead of it, not beyond)
        ing.handle(_pdu("r7", T0 + t))
    ing.handle(cards_msg("r1", T0 + 40.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.handle(cards_msg("r2", T0 + 45.0, sm_clock_mhz=np.full(64, 1980.0)))
    for t in (50.0, 55.0):
        ing.handle(_pdu("r7", T0 + t))
    assert ing.stats.applied_disproved == {("level", "r0"): 64}
    for t in (60.0, 65.0, 70.0, 73.0):
        ing.handle(_pdu("r7", T0 + t))
    assert ing.stats.applied_disproved == {("level", "r0"): 64, ("level", "r1"): 64}
    ing.handle(_rack_applied("r2", T0 + 46.0, 0))
    past_the_bound(ing, T0 + 45.0)
    assert ing.stats.applied_disproved == {("level", "r0"): 64, ("level", "r1"): 64}
    assert ing.stats.applied_disprovals_explained == 64


def test_a_retained_job_snapshot_handed_over_again_is_not_reconciled_again() -> None:
    """The broker hands the scheduler's retained snapshot over again at each new subscription: the same
    snapshot (same ``ts`` and ``seq``) is not newer than itself, and counts as old
    (``IngestStats.job_snapshots_old``), not as another snapshot reconciled."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(_facility(T0))
    snap = snapshot(T0, 7, running("j1", {"r1": (0, 1)}, Phase.COMPUTE))
    ing.handle(snap)
    ing.handle(snap)
    assert set(state.jobs) == {"j1"}
    assert ing.stats.job_snapshots == 1 and ing.stats.job_snapshots_old == 1


def test_a_rack_whose_sensors_froze_as_a_whole_disproves_nothing() -> None:
    """Rack r1's card readings froze (every card repeats its power, die and clock, the top clock read
    before a confirmed slow-down) while r0's move: the belief holds r1 stuck, and its frozen readings do
    not disprove its confirmed level (the agent would command it again and again)."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(_rack_applied("r1", T0 + 10.0, 5))
    rng = np.random.default_rng(1)
    for i in range(state.stuck_after_readings + 2):
        ing.handle(cards_msg("r0", T0 + 10.4 + i * 0.1, power_w=300.0 + rng.uniform(-5.0, 5.0, 64)))
        ing.handle(cards_msg("r1", T0 + 10.4 + i * 0.1, sm_clock_mhz=np.full(64, 1980.0)))
        ing.flush()
    assert state.stuck_racks() == (1,)
    ing.handle(cards_msg("r1", T0 + 20.0, sm_clock_mhz=np.full(64, 1980.0)))
    ing.flush()
    assert np.all(ing.applied_level[64:128] == 5)


def test_a_racks_reading_is_dated_at_its_newest_part_whatever_order_the_parts_came_in() -> None:
    """Rack r0's card exporter's clock runs 3 ms ahead of its CDU's, and its cards reach the agent
    first: the rack's reading is dated at its newest part (the round it joins for the estimator), each
    part at its own stamp (what staleness is judged on)."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    ing.handle(cards_msg("r0", T0 + 0.003))
    ing.handle(_cdu("r0", T0))
    readings = ing.flush()
    assert readings is not None and readings.time_s == T0 + 0.003
    (rr,) = readings.racks
    assert rr.time_s == T0 + 0.003 and rr.cards_time_s == T0 + 0.003 and rr.loop_time_s == T0
    # r1's card exporter lags 3 ms behind its CDU, whose reading came first: the cards are as old as
    # their own stamp, not the CDU's
    ing.handle(_cdu("r1", T0 + 1.003))
    ing.handle(cards_msg("r1", T0 + 1.0))
    readings = ing.flush()
    assert readings is not None
    (rr,) = readings.racks
    assert rr.time_s == T0 + 1.003 and rr.cards_time_s == T0 + 1.0 and rr.loop_time_s == T0 + 1.003


def test_a_snapshot_that_corrects_only_a_jobs_phase_counts_it_corrected() -> None:
    """The agent missed j1's checkpoint: the snapshot's phase corrects it, one job corrected
    (``racktwin_job_snapshot_changes_total{change="corrected"}``), none added or dropped."""
    site = example_site()
    state = TwinState(site)
    ing = Ingest(site, state, SiteClock(1.0))
    ing.handle(_facility(T0))
    ing.handle(event(wire.JobEventType.SUBMITTED, "j1", T0, 0, job=spec("j1", 2)))
    ing.handle(event(wire.JobEventType.STARTED, "j1", T0, 1, cards={"r1": (0, 1)}))
    ing.handle(snapshot(T0 + 5.0, 4, running("j1", {"r1": (0, 1)}, Phase.CHECKPOINT)))
    assert state.jobs["j1"].phase == Phase.CHECKPOINT
    assert (ing.stats.job_snapshot_corrected, ing.stats.job_snapshot_added, ing.stats.job_snapshot_dropped) == (1, 0, 0)


def test_a_rack_that_sends_its_cards_in_one_batch_per_host_reaches_the_estimator_whole() -> None:
    """Rack r0 sends its cards in two batches, one per host, at one stamp each second: the ingest folds
    each into the belief (a second batch of a rack flushes the first), and the round the estimator gets
    (``RoundMerger``) holds all 64 cards, each with its own reading. Before, the merger kept the last
    batch's cards only: the estimator never saw the first host's cards."""
    site = example_site()
    merger = RoundMerger()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    die_c = 40.0 + np.arange(64, dtype=np.float64)
    for t in (T0, T0 + 1.0, T0 + 2.0):
        for host in (np.arange(32), np.arange(32, 64)):
            msg = cards_msg("r0", t, temp_c=die_c)
            cols = ("power_w", "temp_c", "sm_clock_mhz", "utilization", "power_limit_w", "low_power")
            ing.handle(dataclasses.replace(msg, card_index=host, **{f: getattr(msg, f)[host] for f in cols}))
        ing.flush()
    assert [r.time_s for r in rounds] == [T0, T0 + 1.0]  # (the newest waits for the next stamp)
    for r in rounds:
        (rr,) = r.racks
        assert rr.cards is not None and rr.cards_time_s == r.time_s
        assert rr.cards.card_index.tolist() == list(range(64))
        assert rr.cards.die_temp_c.tolist() == die_c.tolist()


def test_a_5_s_rack_keeps_a_confirmation_through_a_reading_6_s_after_it() -> None:
    """A rack that reads every 5 s has a margin of 1.5 of its interval, 7.5 s: its reading 6 s after a
    confirmed slow-down (more than one period, within the room for jitter and a varying interval) keeps
    it; one 8 s after disproves it."""
    site = example_site()
    ing = Ingest(site, TwinState(site), SiteClock(1.0))
    top = np.full(64, 1980.0)
    last_s = _every(ing, "r0", T0, 5.0, 4, sm_clock_mhz=top)
    ing.handle(_rack_applied("r0", last_s - 1.0, 5))
    ing.handle(cards_msg("r0", last_s + 5.0, sm_clock_mhz=top))  # 6 s after the applied state
    assert np.all(ing.applied_level[:64] == 5)
    ing.handle(cards_msg("r0", last_s + 7.0, sm_clock_mhz=top))  # 8 s after
    assert np.all(ing.applied_level[:64] == -1)
