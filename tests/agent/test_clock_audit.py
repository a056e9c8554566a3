"""The site clock's documented behaviours that no other test pinned (a mutation audit of ``agent.clock``).

Each test drives :class:`agent.clock.SiteClock` on a wall the test moves (its ``wall`` argument), so
none sleeps for the clock's seconds; the waiter tests turn the event loop a counted number of times
(one waits a twentieth of a second for the wall to reach its target)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from agent.clock import SiteClock

pytestmark = pytest.mark.agent

T0 = 1_800_000_000.0


class FakeWall:
    """A wall clock the test moves; counts how often it is read."""

    def __init__(self) -> None:
        self.t = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t


def _steady(
    clock: SiteClock, wall: FakeWall, t0: float, n: int, step_ts: float = 1.0, step_wall: float = 0.05
) -> float:
    """``n`` messages ``step_wall`` wall s apart, stamped ``t0``, ``t0 + step_ts``, ...; the last stamp."""
    ts = t0
    for i in range(n):
        ts = t0 + i * step_ts
        clock.observe(ts)
        wall.t += step_wall
    return ts


# ---- construction and stamps --------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_a_time_scale_that_is_not_a_positive_number_is_refused(scale: float) -> None:
    with pytest.raises(ValueError, match="time_scale"):
        SiteClock(scale)


def test_a_stamp_that_is_not_a_finite_number_is_no_time() -> None:
    """A NaN or infinite ``ts`` (a broken exporter's) neither starts the clock nor moves it."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    for bad in (math.nan, math.inf, -math.inf):
        assert not clock.observe(bad)
    assert not clock.known and clock.now() is None
    clock.observe(T0)
    wall.t += 1.0
    for bad in (math.nan, math.inf, -math.inf):
        assert not clock.observe(bad)
    assert clock.latest_ts_s == T0 and clock.now() == pytest.approx(T0 + 1.0)
    assert clock.corrections == 0 and clock.jumps == 0


def test_a_repeated_stamp_does_not_move_the_clock_nor_restart_its_extrapolation() -> None:
    """Every rack of a simulated site stamps a round with one time: the second message stamped as
    the newest does not move the clock (``observe`` says False) and the clock keeps extrapolating from
    when the first arrived (restarted from the copy, it would stand still until it caught up)."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    assert clock.observe(T0)
    wall.t += 0.5
    assert not clock.observe(T0)
    assert clock.now() == pytest.approx(T0 + 0.5)
    wall.t += 0.5
    assert clock.now() == pytest.approx(T0 + 1.0)


# ---- tolerances ---------------------------------------------------------------------------------
def test_the_default_step_back_tolerance_is_one_second_or_a_quarter_wall_second_of_site_time() -> None:
    """After a silence the clock steps back only to messages more than ``tolerance_s`` behind its
    extrapolation: by default 1 s at real time, a quarter wall second (5 s) at 20 site s per wall s."""
    for scale, within, beyond in ((1.0, 0.8, 1.5), (0.05, 4.0, 6.0)):
        wall = FakeWall()
        clock = SiteClock(scale, infer=False, wall=wall)
        clock.observe(T0)
        wall.t += 10.0
        ahead = clock.now()
        assert ahead is not None
        assert clock.observe(T0 + (ahead - T0) - within) and clock.corrections == 0
        assert clock.now() == pytest.approx(ahead)  # jitter: the clock does not go back
        wall.t += 10.0
        ahead = clock.now()
        assert ahead is not None
        assert clock.observe(ahead - beyond) and clock.corrections == 1
        assert clock.now() == pytest.approx(ahead - beyond)


def test_an_explicit_step_back_tolerance_is_the_one_used() -> None:
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, tolerance_s=5.0, wall=wall)
    clock.observe(T0)
    wall.t += 10.0
    assert clock.now() == pytest.approx(T0 + 10.0)
    clock.observe(T0 + 6.0)  # 4 s behind the extrapolation: within 5 s
    assert clock.corrections == 0 and clock.now() == pytest.approx(T0 + 10.0)
    wall.t += 10.0
    assert clock.now() == pytest.approx(T0 + 16.0)
    clock.observe(T0 + 9.0)  # 7 s behind
    assert clock.corrections == 1 and clock.now() == pytest.approx(T0 + 9.0)


def test_an_explicit_ahead_tolerance_is_the_one_used() -> None:
    """A publisher test moves site time on by a message far ahead (``ahead_tolerance_s=3600``)."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, ahead_tolerance_s=100.0, wall=wall)
    clock.observe(T0)
    assert clock.observe(T0 + 90.0) and not clock.last_was_ahead
    assert not clock.observe(T0 + 300.0) and clock.last_was_ahead


# ---- the rate -----------------------------------------------------------------------------------
def test_without_inference_the_rate_stays_the_configured_one() -> None:
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    _steady(clock, wall, T0, 40, step_ts=0.5, step_wall=0.25)  # the site runs 2x for 10 wall s
    assert clock.rate == 1.0


def test_the_rate_is_not_inferred_from_less_than_two_wall_seconds() -> None:
    """Two messages half a wall second apart, the second 5 s later in site time (jitter, or a
    publisher a little ahead): no rate is read from so short a span; from 2 wall s on, it is."""
    wall = FakeWall()
    clock = SiteClock(1.0, wall=wall)
    clock.observe(T0)
    wall.t += 0.5
    assert clock.observe(T0 + 5.0)
    assert clock.rate == 1.0
    wall.t += 1.5
    assert clock.observe(T0 + 7.0)
    assert clock.rate == pytest.approx(3.5)


def test_by_default_the_rate_is_read_over_the_last_thirty_wall_seconds() -> None:
    """The site ran 20x, then 10x: ten wall seconds after the change the default window still holds
    twenty seconds of 20x (500 site s over 30 wall s); once thirty have passed, the rate is 10."""
    wall = FakeWall()
    clock = SiteClock(1.0, wall=wall)
    last = _steady(clock, wall, T0, 160, step_ts=5.0, step_wall=0.25)  # 20x for 40 wall s
    last = _steady(clock, wall, last + 2.5, 40, step_ts=2.5, step_wall=0.25)  # 10x for 10 wall s
    assert 15.0 < clock.rate < 18.0
    _steady(clock, wall, last + 2.5, 100, step_ts=2.5, step_wall=0.25)  # 25 wall s more
    assert clock.rate == pytest.approx(10.0, rel=0.02)


def test_after_a_loop_stall_the_burst_of_queued_messages_keeps_the_rate() -> None:
    """The agent's loop stalls 4 wall s while the site (20x) keeps publishing; the messages queued
    meanwhile arrive in one burst. Once the burst's newest stamp is in, the rate is still 20x (it
    used to pair the burst's oldest stamp with the burst's wall time and read 14x, shrinking the
    commands' stamp hold exactly when the clock had to step back)."""
    wall = FakeWall()
    clock = SiteClock(1.0, wall=wall)
    last = _steady(clock, wall, T0, 200, step_ts=1.0, step_wall=0.05)  # 20x for 10 wall s
    assert clock.rate == pytest.approx(20.0, rel=0.01)
    wall.t += 4.0  # the stall: 80 messages (1 site s apart) wait in the queue
    for i in range(1, 81):
        clock.observe(last + i)
        wall.t += 0.0005
    assert clock.rate == pytest.approx(20.0, rel=0.02)
    _steady(clock, wall, last + 81, 40, step_ts=1.0, step_wall=0.05)  # and 2 wall s later as well
    assert clock.rate == pytest.approx(20.0, rel=0.02)


def test_after_a_forward_jump_the_rate_is_the_new_timelines_pace() -> None:
    """The site (20x) restarts 5000 s later: once the jump is followed the rate is the new
    timeline's 20x, not the 5000 s gained over a few wall seconds across the two timelines."""
    wall = FakeWall()
    clock = SiteClock(0.05, wall=wall)
    _steady(clock, wall, T0, 60)  # 20x for 3 wall s
    wall.t += 3.0
    _steady(clock, wall, T0 + 5000.0, 80)  # 4 wall s on the new timeline
    assert clock.jumps == 1
    assert clock.rate == pytest.approx(20.0, rel=0.05)


def test_after_the_site_clock_went_back_the_rate_follows_the_new_timeline() -> None:
    """The site ran 20x, restarts 500 s back and runs 10x: the clock steps back and, two wall
    seconds later, reads 10x (the old timeline's samples, all stamped ahead of the new one, would
    hold the rate at 20x for the whole window)."""
    wall = FakeWall()
    clock = SiteClock(0.05, wall=wall)
    last = _steady(clock, wall, T0, 100)  # 20x for 5 wall s
    wall.t += 3.0
    _steady(clock, wall, last - 500.0, 120, step_ts=0.5)  # 10x for 6 wall s
    assert clock.corrections == 1
    assert clock.rate == pytest.approx(10.0, rel=0.05)


# ---- the site's clock went back -----------------------------------------------------------------
def test_after_a_silence_messages_within_the_tolerance_behind_the_newest_are_not_a_restart() -> None:
    """The site falls silent; a publisher lagging half a second (real time: tolerance 1 s) keeps
    sending, its stamps advancing but still behind the newest: late messages, not a site whose clock
    went back: no step back, however long they keep coming."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    last = _steady(clock, wall, T0, 30, step_ts=0.25, step_wall=0.25)
    wall.t += 3.0
    for i in range(10):
        assert not clock.observe(last - 0.8 + 0.05 * i)
        wall.t += 0.25
    assert clock.corrections == 0


def test_after_a_silence_stragglers_from_different_pasts_do_not_step_the_clock_back() -> None:
    """The site falls silent; a backlog of late messages arrives from two publishers 300 s and 600 s
    behind, interleaved: each goes back from the one before, so no run of them keeps advancing and
    the clock does not go back to either."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    last = _steady(clock, wall, T0, 40)
    wall.t += 3.0
    for i in range(60):  # 3 wall s
        assert not clock.observe(last - 300.0 + i)
        assert not clock.observe(last - 600.0 + i)
        wall.t += 0.05
    assert clock.corrections == 0


def test_a_restarted_site_whose_messages_arrive_slightly_out_of_order_is_followed_back() -> None:
    """The site falls silent and comes back 500 s behind from two publishers whose stamps differ by
    0.3 s, the later one's message arriving first each round (two racks' clocks; an ack that overtakes
    the reading sent before it): one timeline, followed after ``confirm_s``. Before, each message
    behind the one before it started the run over, and such a site was never followed back (an
    integration test timed out waiting for the step back when load reordered the simulator's
    messages)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    last = _steady(clock, wall, T0, 40)
    wall.t += 3.0
    b = last - 500.0
    followed = []
    for i in range(30):  # 1.5 wall s
        followed.append(clock.observe(b + i + 0.3))
        followed.append(clock.observe(b + i))
        wall.t += 0.05
    assert not any(followed[:38]) and any(followed[40:])  # ignored for confirm_s (1 wall s), then followed
    assert clock.corrections == 1 and clock.timelines_left == 1
    assert clock.latest_ts_s is not None and clock.latest_ts_s < T0


def test_a_run_behind_counts_only_from_after_the_newest_timelines_last_message() -> None:
    """Messages 500 s behind come for half a wall second while the site is silent, stop, the site
    sends one more message, falls silent again, and they resume: their confirmation starts over
    (``confirm_s`` of them after the silence), it is not the run from before the site spoke."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    last = _steady(clock, wall, T0, 40)
    wall.t += 3.0
    b = last - 500.0
    for i in range(10):  # 0.5 wall s: not confirmed yet
        assert not clock.observe(b + i)
        wall.t += 0.05
    wall.t += 0.5
    assert clock.observe(last + 80.0)  # the site speaks once more
    wall.t += 3.0
    resumed = []
    for i in range(30):
        resumed.append(clock.observe(b + 30.0 + i))
        wall.t += 0.05
    assert not any(resumed[:19]) and all(resumed[21:])  # a full confirm_s again, then followed
    assert clock.corrections == 1


# ---- the first timeline -------------------------------------------------------------------------
def _rounds(clock: SiteClock, wall: FakeWall, start: int, n: int, own: int, behind: int) -> None:
    """``n`` rounds 0.05 wall s apart at 20x: ``own`` messages on the first message's timeline
    (``T0 + i``) and ``behind`` messages from a publisher an hour behind (``T0 - 3600 + i``)."""
    for i in range(start, start + n):
        for _ in range(own):
            clock.observe(T0 + i)
        for _ in range(behind):
            clock.observe(T0 - 3600.0 + i)
        wall.t += 0.05


def test_messages_a_little_behind_the_first_one_are_on_its_timeline() -> None:
    """The first message comes from a rack whose stamps run half a second ahead of the others'
    (real time: the tolerance is 1 s): the others are on the first message's timeline, not a run
    behind it that outvotes it."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    for i in range(20):  # 5 wall s
        clock.observe(T0 + 0.25 * i + 0.5)
        for _ in range(7):
            clock.observe(T0 + 0.25 * i)
        wall.t += 0.25
    assert clock.corrections == 0 and clock.latest_ts_s == T0 + 0.25 * 19 + 0.5


def test_a_run_behind_the_first_timeline_without_a_two_to_one_majority_does_not_outvote_it() -> None:
    """Three messages on the first timeline for two an hour behind, for three wall seconds: neither
    outnumbers the other two to one, and the clock stays where the first message put it."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    _rounds(clock, wall, 0, 60, own=3, behind=2)
    assert clock.corrections == 0 and clock.latest_ts_s == T0 + 59


def test_the_first_timeline_is_confirmed_only_by_a_two_to_one_majority() -> None:
    """At three to two the first timeline is not confirmed: when the publishers behind it later
    outnumber it two to one, it is outvoted though it never fell silent (the first-timeline rule)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    _rounds(clock, wall, 0, 30, own=3, behind=2)
    assert clock.corrections == 0
    _rounds(clock, wall, 30, 80, own=1, behind=4)
    assert clock.corrections == 1
    assert clock.latest_ts_s == T0 - 3600.0 + 109


def test_once_confirmed_the_first_timeline_is_not_outvoted_while_it_keeps_coming() -> None:
    """Three to one for a wall second and a half confirms the first timeline: later, a majority
    behind it no longer steps the clock back while it keeps coming (only after a silence would it)."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    _rounds(clock, wall, 0, 30, own=3, behind=1)
    _rounds(clock, wall, 30, 100, own=1, behind=4)
    assert clock.corrections == 0 and clock.latest_ts_s == T0 + 129


# ---- forward jumps ------------------------------------------------------------------------------
def test_a_jump_is_followed_though_its_publishers_stamps_interleave_out_of_order() -> None:
    """The site restarts an hour later while its old timeline is silent; its three publishers'
    stamps arrive a little out of order (within the tolerance): one run ahead, followed."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    _steady(clock, wall, T0, 30, step_ts=0.25, step_wall=0.25)
    wall.t += 3.0
    b = T0 + 3600.0
    for i in range(12):  # 3 wall s
        for off in (0.5, 0.0, 0.3):
            clock.observe(b + 0.25 * i + off)
        wall.t += 0.25
    assert clock.jumps == 1 and clock.now() == pytest.approx(b + 0.25 * 11 + 0.5 + 0.25)


def test_without_inference_a_forward_jump_keeps_the_configured_rate() -> None:
    """``infer=False``: the rate is the configured one, also after a jump to a site running 2x."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    _steady(clock, wall, T0, 30, step_ts=0.25, step_wall=0.25)
    wall.t += 3.0
    _steady(clock, wall, T0 + 3600.0, 8, step_ts=0.5, step_wall=0.25)
    assert clock.jumps == 1 and clock.rate == 1.0


def test_sporadic_stamps_far_ahead_do_not_move_the_clock_during_a_blackout() -> None:
    """During a telemetry blackout one bad stamp an hour ahead arrives every three wall seconds
    (more than ``reset_after_s`` apart): no run of them keeps coming, and the clock stays."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    _steady(clock, wall, T0, 30, step_ts=0.25, step_wall=0.25)
    for k in range(5):
        wall.t += 3.0
        assert not clock.observe(T0 + 3600.0 + 3.0 * k)
    assert clock.jumps == 0 and clock.ahead_ignored == 5


def test_a_jump_is_pending_while_messages_far_ahead_keep_coming_and_not_after() -> None:
    """``jump_pending`` (the first round waits on it): True while messages far ahead keep coming,
    False ``reset_after_s`` after the last of them, and False once the jump is followed."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    _steady(clock, wall, T0, 30, step_ts=0.25, step_wall=0.25)
    assert not clock.jump_pending
    assert not clock.observe(T0 + 3600.0)
    assert clock.jump_pending
    wall.t += 1.5
    assert clock.jump_pending
    wall.t += 1.0  # 2.5 wall s since: more than reset_after_s (2 s)
    assert not clock.jump_pending
    # the site restarts an hour later (old timeline silent): pending until followed, then not
    b = T0 + 7200.0
    assert not clock.observe(b)
    assert clock.jump_pending
    wall.t += 0.25
    for i in range(1, 12):
        clock.observe(b + 0.25 * i)
        wall.t += 0.25
    assert clock.jumps == 1 and clock.latest_ts_s == b + 2.75 and not clock.jump_pending


# ---- waiting ------------------------------------------------------------------------------------
async def _turns(n: int) -> None:
    """Let the event loop run ``n`` times round (each task ready runs once a turn)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _waiting(waiter: asyncio.Task[bool], wall: FakeWall) -> None:
    """Turn the loop until ``waiter`` (just created, on a clock reading ``wall``) has made its first
    check, and assert that it did and is waiting: one read of the wall (a waiter that has not run yet
    read none, one that checks over and over more) and not done. Counted in turns, not wall time, so
    a slow machine gives the same verdict; the waiter's sleep is seconds long, so no read is due to it."""
    reads = wall.reads
    await _turns(10)
    assert wall.reads - reads == 1, "reads of the clock by the waiter in 10 turns of the loop: its first check"
    assert not waiter.done()


async def test_a_waiter_is_woken_by_the_message_that_reaches_its_target() -> None:
    """The wall stands still (nothing extrapolates): the message stamped at the target ends the wait
    at once, not after the waiter's longest sleep."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    clock.observe(T0)
    waiter = asyncio.create_task(clock.wait_until(T0 + 8.0, max_sleep_s=30.0))
    await _waiting(waiter, wall)
    clock.observe(T0 + 8.0)  # within the ahead tolerance (10 s) of the clock standing at T0
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_a_waiter_returns_false_at_once_when_woken() -> None:
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    clock.observe(T0)
    wake = asyncio.Event()
    waiter = asyncio.create_task(clock.wait_until(T0 + 15.0, wake=wake, max_sleep_s=30.0))
    await _waiting(waiter, wall)
    wake.set()
    assert await asyncio.wait_for(waiter, 1.0) is False


async def test_a_waiter_returns_when_extrapolation_reaches_its_target_not_after_its_longest_sleep() -> None:
    clock = SiteClock(1.0, infer=False, wall=time.monotonic)
    clock.observe(T0)
    # half its longest sleep: a waiter that slept it out would time out here
    assert await asyncio.wait_for(clock.wait_until(T0 + 0.05, max_sleep_s=30.0), 15.0) is True


async def test_a_waiter_sleeps_between_its_checks() -> None:
    """A message arrived before the wait began: the waiter looks at the clock once per thing it
    awaits (a message, the wake, its sleep's end), not over and over, woken again and again by the
    message it has already seen. Counted in turns of the event loop, with a sleep no test outlasts:
    no read is due to wall time, so a slow machine reads no more (a busy loop reads about once every
    three turns)."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    clock.observe(T0)
    wake = asyncio.Event()
    waiter = asyncio.create_task(clock.wait_until(T0 + 1e6, wake=wake, max_sleep_s=3600.0))
    reads = wall.reads
    await _turns(100)
    assert wall.reads - reads == 1, "reads of the clock in 100 turns of the loop, only its first check due"
    wall.t += 1.0
    clock.observe(T0 + 1.0)  # a message during the wait, far from the target
    reads = wall.reads
    await _turns(100)
    assert wall.reads - reads == 1, "reads of the clock in 100 turns of the loop after one message"
    assert not waiter.done()
    wake.set()
    assert await asyncio.wait_for(waiter, 10.0) is False
    assert wall.reads - reads == 2  # and one for the wake


async def test_the_wall_time_a_target_was_reached_is_that_of_its_first_message() -> None:
    """``target_reached_wall`` (the control loop dates its cycle from it): the wall time the first
    message stamped at or after the target arrived; later messages do not move it, a new target
    clears it, and waiting again for the same target keeps it."""
    wall = FakeWall()
    clock = SiteClock(1.0, infer=False, wall=wall)
    clock.observe(T0)
    waiter = asyncio.create_task(clock.wait_until(T0 + 10.0, max_sleep_s=30.0))
    await _waiting(waiter, wall)  # its target set: the messages below are judged against it
    wall.t = 109.0
    clock.observe(T0 + 9.0)
    assert clock.target_reached_wall is None
    wall.t = 110.0
    clock.observe(T0 + 10.0)  # exactly the target
    assert await asyncio.wait_for(waiter, 1.0) is True
    assert clock.target_reached_wall == 110.0
    wall.t = 111.0
    clock.observe(T0 + 11.0)
    assert clock.target_reached_wall == 110.0
    # a new target: cleared until a message reaches it, even when the wait is cut short
    wake = asyncio.Event()
    wake.set()
    assert await clock.wait_until(T0 + 20.0, wake=wake) is False
    assert clock.target_reached_wall is None
    wall.t = 120.0
    clock.observe(T0 + 20.0)
    assert clock.target_reached_wall == 120.0
    wall.t = 121.0
    assert await clock.wait_until(T0 + 20.0) is True  # waiting again for it: reached at 120
    assert clock.target_reached_wall == 120.0


# ---- one stamp repeated is no timeline ----------------------------------------------------------
def _blackout(stuck: float) -> tuple[FakeWall, SiteClock]:
    """The site's publishers (real time) fall silent for 3 wall s; then one publisher repeats the stamp
    ``stuck`` (its clock stuck) every quarter wall second for 3 wall s."""
    wall = FakeWall()
    clock = SiteClock(1.0, wall=wall)
    _steady(clock, wall, T0, 30, step_ts=0.25, step_wall=0.25)
    wall.t += 3.0
    for _ in range(12):
        assert not clock.observe(stuck)
        wall.t += 0.25
    return wall, clock


def test_a_stamp_repeated_far_ahead_during_a_blackout_does_not_move_the_clock() -> None:
    """The clock jumps to messages ahead that keep coming *and advancing*: one stamp repeated (a
    publisher's stuck clock) moved the site's time an hour ahead, every rack stale."""
    _wall, clock = _blackout(T0 + 3600.0)
    assert clock.jumps == 0 and clock.ahead_ignored == 12 and clock.latest_ts_s == T0 + 7.25


def test_a_stamp_repeated_far_behind_after_a_silence_does_not_step_the_clock_back() -> None:
    """The same behind: the clock steps back to messages that keep coming and advancing after its
    timeline fell silent; one stamp repeated 600 s back stepped it back there."""
    _wall, clock = _blackout(T0 - 600.0)
    assert clock.corrections == 0 and clock.latest_ts_s == T0 + 7.25


def test_a_stamp_repeated_behind_the_first_message_does_not_outvote_it() -> None:
    """The first-timeline rule: a publisher an hour behind that repeats one stamp three times as
    often as the site publishes does not outvote the first message's (advancing) timeline."""
    wall = FakeWall()
    clock = SiteClock(0.05, infer=False, wall=wall)
    for i in range(60):  # 3 wall s
        clock.observe(T0 + i)
        for _ in range(3):
            assert not clock.observe(T0 - 3600.0)
        wall.t += 0.05
    assert clock.corrections == 0 and clock.latest_ts_s == T0 + 59
