"""Properties of the commands a decision becomes on the wire (``agent.publish.CommandBook``), applied in
order by the simulator's rack command handler (``sim.commands.CommandHandler``) on the plant:

* whatever a decision asks of the site (levels, limits, sleeping cards, hosts off, pumps, the
  set-point), every command is applied (none refused) and the site ends as the decision says, except
  where the protocol says a command cannot go (the cards of a host that is off keep their level and
  limit until it is on; those of a host being powered off need none); commands that lower power come
  before those that raise it;
* from the same start, a decision leaves the site the same through the wire as through
  ``agent.loop.apply_to_plant``, what ``racktwin evaluate`` uses (within the wire's tolerances)."""

from __future__ import annotations

import copy
import dataclasses
import uuid
from functools import cache
from typing import cast

import numpy as np
import numpy.typing as npt
import pytest
from agent_helpers import belief, example_site, job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_publish import decision_like

from agent import wire
from agent.config import ControlConfig
from agent.loop import apply_to_plant
from agent.publish import CommandBook, OpenCommand
from sim.commands import CommandHandler
from twin.plant import Plant
from twin.spec import SiteSpec
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent

NOW = 1000.0
BoolArray = npt.NDArray[np.bool_]


@cache
def scene() -> tuple[SiteSpec, Plant, StateSnapshot]:
    """The example site (8 racks of 64 cards, 8 hosts per rack) with three jobs on 160 cards."""
    site = example_site()
    plant, state = belief(site, [job("a", 64), job("b", 64), job("c", 32)], 5)
    return site, plant, state.snapshot()


@st.composite
def decisions(draw: st.DrawFn) -> tuple[int, float, float, float, float, bool, bool, float]:
    """What a decision changes, drawn small (the arrays are made from it: :func:`_changes`): a seed,
    the shares of cards given a random level, a random power limit or sleep, of idle hosts off,
    whether the decision manages hosts and pumps, and the set-point."""
    site = scene()[0]
    return (
        draw(st.integers(0, 2**32 - 1)),
        draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        draw(st.sampled_from([0.0, 0.2, 1.0])),
        draw(st.sampled_from([0.0, 0.3, 1.0])),
        draw(st.sampled_from([0.0, 0.25, 0.75, 1.0])),
        draw(st.booleans()),
        draw(st.booleans()),
        float(draw(st.sampled_from(site.facility.supply_temp_options_c))),
    )


def _changes(
    drawn: tuple[int, float, float, float, float, bool, bool, float], snap: StateSnapshot
) -> dict[str, object]:
    """The decision's fields from what :func:`decisions` drew: levels, limits, sleeping idle cards,
    idle hosts off, pump speeds, the set-point."""
    seed, moved_frac, capped_frac, asleep_frac, off_frac, hosts, pumps, setpoint_c = drawn
    site = scene()[0]
    n, n_levels = site.n_cards, site.card.n_levels
    busy = snap.card_job >= 0
    rng = np.random.default_rng(seed)
    level = np.asarray(snap.card_level).copy()
    moved = rng.random(n) < moved_frac
    level[moved] = rng.integers(0, n_levels, int(moved.sum()))
    limit = np.asarray(snap.card_power_limit_w, dtype=np.float64).copy()
    capped = rng.random(n) < capped_frac
    lo, hi = ControlConfig().min_power_limit_w, site.card.power_limit_w
    limit[capped] = np.round(rng.uniform(lo, hi, int(capped.sum())), 3)
    asleep = ~busy & (rng.random(n) < asleep_frac)
    host_busy = busy.reshape(site.n_hosts, site.cards_per_host).any(axis=1)
    host_off = ~host_busy & (rng.random(site.n_hosts) < off_frac)
    speed = np.ceil(rng.uniform(site.min_pump_speed_frac(), 1.0, site.n_racks) * 1000.0) / 1000.0
    speed[rng.random(site.n_racks) < 0.3] = 1.0
    return {
        "card_level": level,
        "card_power_limit_w": limit,
        "card_low_power": asleep,
        "host_off": host_off if hosts else None,
        "rack_pump_speed_frac": speed if pumps else None,
        "supply_temp_c": setpoint_c,
    }


def _apply(handler: CommandHandler, codec: wire.Codec, cmds: list[OpenCommand]) -> list[tuple[str, str, str]]:
    """The commands handed to the rack handler in order; the ones not applied (target, result, reason)."""
    refused = []
    for c in cmds:
        outs = handler.handle(c.topic, c.payload)
        assert len(outs) == 1
        ack = codec.decode(outs[0].topic, outs[0].payload)
        assert isinstance(ack, wire.Acknowledgement) and ack.command_id == uuid.UUID(c.command_id)
        if ack.result is not wire.AckResult.APPLIED:
            refused.append((c.target, ack.result.value, ack.reason or ""))
    return refused


def _reported(site: SiteSpec, snap: StateSnapshot, plant: Plant, handler: CommandHandler) -> StateSnapshot:
    """``snap`` with what the racks report after the commands: levels, limits, power states, hosts,
    pumps and the set-point."""
    truth = plant.truth()
    assert snap.facility is not None
    return dataclasses.replace(
        snap,
        card_level=handler.level.copy(),
        card_power_limit_w=handler.power_limit_w.copy(),
        card_low_power=truth.low_power.copy(),
        card_host_off=truth.host_off[site.card_host()],
        rack_pump_speed_frac=truth.rack_pump_speed_frac.copy(),
        facility=dataclasses.replace(snap.facility, supply_setpoint_c=truth.supply_setpoint_c),
    )


@dataclasses.dataclass
class _Wired:
    """A copy of the scene's plant behind the simulator's rack handler, with the site clock."""

    site: SiteSpec
    plant: Plant
    codec: wire.Codec
    handler: CommandHandler
    clock: list[float]
    applied: npt.NDArray[np.int64]

    @classmethod
    def of_scene(cls) -> _Wired:
        site, plant0, _snap0 = scene()
        plant = copy.deepcopy(plant0)
        codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
        clock = [NOW]
        handler = CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: clock[0], applied_with_ack=False)
        return cls(site, plant, codec, handler, clock, np.full(site.n_cards, -1, dtype=np.int64))

    def book(self) -> CommandBook:
        return CommandBook(self.site, self.codec, ControlConfig(command_ttl_s=30.0))

    def start_at(self, first: tuple[int, float, float, float, float, bool, bool, float]) -> StateSnapshot:
        """A first decision from the scene, sent by an agent's book and applied (levels, limits,
        sleeping cards, hosts off, pumps): what the racks report 10 s later."""
        snap0 = scene()[2]
        d = decision_like(snap0, **_changes(first, snap0))
        assert _apply(self.handler, self.codec, self.book().commands(d, snap0, self.applied, NOW)) == []
        self.clock[0] = NOW + 10.0
        return _reported(self.site, snap0, self.plant, self.handler)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=decisions(), then=decisions())
def test_the_commands_of_a_decision_bring_the_site_to_it(
    first: tuple[int, float, float, float, float, bool, bool, float],
    then: tuple[int, float, float, float, float, bool, bool, float],
) -> None:
    # a first decision from the scene brings the site somewhere; a second agent's book, fresh, then
    # takes it to the second decision
    w = _Wired.of_scene()
    site, codec, snap0 = w.site, w.codec, scene()[2]
    snap = w.start_at(first)
    d = decision_like(snap, **_changes(then, snap0)).replace(card_busy=snap0.card_job >= 0)
    cmds = w.book().commands(d, snap, w.applied, w.clock[0])
    assert _apply(w.handler, codec, cmds) == []
    after = _reported(site, snap, w.plant, w.handler)

    card_host = site.card_host()
    was_off = np.asarray(snap.card_host_off, dtype=bool)
    if d.host_off is None:  # hosts not managed: a host stays as it is unless a card of it is woken
        woken = cast(
            npt.NDArray[np.bool_], (was_off & ~d.card_low_power).reshape(site.n_hosts, site.cards_per_host).any(axis=1)
        )
        want_off = was_off & ~woken[card_host]
    else:
        want_off = np.asarray(d.host_off, dtype=bool)[card_host]
    # hosts: as the decision says (none of them busy); when the decision manages none, as they were
    # unless it wakes a card of an off host (a wake boots its host: docs/protocol.md)
    assert np.array_equal(after.card_host_off, want_off)
    # levels and limits: as the decision says on every card of a host that was on and stays on; the
    # cards of a host that was off are not reachable, those of a host going off need none: both keep
    # theirs (limits to 0.1 W rounded down, a difference of up to 0.5 W left alone)
    reach = ~was_off & ~want_off
    assert np.array_equal(after.card_level[reach], d.card_level[reach])
    assert np.array_equal(after.card_level[~reach], snap.card_level[~reach])
    want_lim = np.floor(d.card_power_limit_w * 10.0 + 1e-6) / 10.0
    assert np.all(np.abs(after.card_power_limit_w[reach] - want_lim[reach]) <= 0.5 + 1e-9)
    # power states: a card of a host that is off sleeps with it; the others as the decision says
    assert after.card_low_power[want_off].all()
    assert np.array_equal(after.card_low_power[~want_off], d.card_low_power[~want_off])
    # pumps and set-point
    if d.rack_pump_speed_frac is not None:
        assert np.allclose(after.rack_pump_speed_frac, d.rack_pump_speed_frac, atol=0.005)
    else:
        assert np.array_equal(after.rack_pump_speed_frac, snap.rack_pump_speed_frac)
    assert after.facility is not None and after.facility.supply_setpoint_c == d.supply_temp_c
    _assert_lowering_first(site, codec, cmds, snap)


def _assert_lowering_first(site: SiteSpec, codec: wire.Codec, cmds: list[OpenCommand], snap: StateSnapshot) -> None:
    """No rack or CDU command that lowers power (or die temperatures: a faster pump) after one that
    raises them, judged against what the racks reported."""
    level = np.asarray(snap.card_level)
    limit = np.asarray(snap.card_power_limit_w)
    pump = np.asarray(snap.rack_pump_speed_frac)
    raised_by = ""
    for c in cmds:
        m = codec.decode(c.topic, c.payload)
        if isinstance(m, wire.CduCommand):
            lowers = m.pump_speed_frac > pump[site.rack_names.index(m.rack)]
        elif isinstance(m, wire.RackCommand):
            cards = np.asarray(m.cards) + site.rack_names.index(m.rack) * site.cards_per_rack
            s = m.setting
            if s.action is wire.CardAction.SET_DVFS_LEVEL:
                lowers = bool(np.all(s.dvfs_level >= level[cards]))
            elif s.action is wire.CardAction.SET_POWER_LIMIT:
                lowers = bool(np.all(np.asarray(s.power_limit_w) <= limit[cards]))
            else:
                lowers = s.action in (wire.CardAction.LOW_POWER_IDLE, wire.CardAction.HOST_POWER_OFF)
        else:
            continue  # the set-point and placements go between the two groups
        assert not (lowers and raised_by), f"{c.target}: a command that lowers power after {raised_by}"
        if not lowers:
            raised_by = raised_by or f"{m.rack}'s {type(m).__name__} that raises it"


def _power_limits_w(plant: Plant) -> npt.NDArray[np.float64]:
    """Every card's power limit as the plant reports it."""
    limits = np.full(plant.n_cards, np.nan)
    for rack in plant.readings().racks:
        assert rack.cards is not None
        limits[rack.cards.card_index] = rack.cards.power_limit_w
    return limits


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=decisions(), then=decisions())
def test_the_wire_and_the_in_process_loop_leave_the_site_alike(
    first: tuple[int, float, float, float, float, bool, bool, float],
    then: tuple[int, float, float, float, float, bool, bool, float],
) -> None:
    """``racktwin evaluate`` applies decisions to the plant directly (``agent.loop.apply_to_plant``);
    the service sends them as commands. From the same start, a decision leaves the site the same
    either way: hosts, power states, pumps, set-point, and the levels and limits of every card whose
    host was on and stays on (the wire leaves the others' for when their host is on; in process they
    are set at once, which no reading shows while the host is off)."""
    w = _Wired.of_scene()
    site, codec, wired, snap0 = w.site, w.codec, w.plant, scene()[2]
    snap = w.start_at(first)
    in_process = copy.deepcopy(wired)
    d = decision_like(snap, **_changes(then, snap0)).replace(card_busy=snap0.card_job >= 0)
    card_host = site.card_host()
    if d.host_off is not None:  # as the controller decides: the cards of a host it wants off asleep
        d = d.replace(card_low_power=d.card_low_power | d.host_off[card_host])
    assert (
        _apply(w.handler, codec, CommandBook(site, codec, ControlConfig()).commands(d, snap, w.applied, w.clock[0]))
        == []
    )
    report = apply_to_plant(d, in_process)
    assert report.refused == []

    a, b = wired.truth(), in_process.truth()
    assert np.array_equal(a.host_off, b.host_off)
    assert np.array_equal(a.low_power, b.low_power)
    # the wire leaves a pump within half a percent of the speed wanted as it is
    assert np.allclose(a.rack_pump_speed_frac, b.rack_pump_speed_frac, rtol=0.0, atol=0.005 + 1e-9)
    assert a.supply_setpoint_c == b.supply_setpoint_c
    on = ~np.asarray(snap.card_host_off, dtype=bool) & ~a.host_off[card_host]
    assert np.array_equal(a.level[on], b.level[on])
    # the wire: to 0.1 W rounded down, a difference of up to 0.5 W from what the rack has left alone
    assert np.all(np.abs(_power_limits_w(wired)[on] - _power_limits_w(in_process)[on]) < 0.6)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(decisions(), min_size=2, max_size=5),
    hosts=st.booleans(),
    pumps=st.booleans(),
    report_every=st.sampled_from([1, 2]),
)
def test_one_book_over_a_run_of_decisions_keeps_the_site_where_the_last_one_wants_it(
    steps: list[tuple[int, float, float, float, float, bool, bool, float]], hosts: bool, pumps: bool, report_every: int
) -> None:
    """One agent's book over several decisions, 10 s apart, acks fed back, the racks' report (the
    snapshot) refreshed after every decision or every other one (telemetry lagging its overlays), with
    host power and pumps managed or not for the whole run (an agent's configuration): nothing is
    refused, and once the racks have reported, the last decision made once more puts the site where
    it wants it (cards of hosts that were off keep theirs, as above) and then needs no more commands
    but a slowed pump's renewal."""
    w = _Wired.of_scene()
    site, plant, codec, handler, clock, applied = w.site, w.plant, w.codec, w.handler, w.clock, w.applied
    snap0 = scene()[2]
    book = w.book()
    snap = snap0
    d = decision_like(snap0)
    for i, drawn in enumerate(steps):
        clock[0] = NOW + 10.0 * i
        drawn = (*drawn[:5], hosts, pumps, drawn[7])
        d = decision_like(snap, **_changes(drawn, snap0)).replace(card_busy=snap0.card_job >= 0)
        for c in book.commands(d, snap, applied, clock[0]):
            for out in handler.handle(c.topic, c.payload):
                msg = codec.decode(out.topic, out.payload)
                if isinstance(msg, wire.Acknowledgement):
                    assert msg.result is wire.AckResult.APPLIED, (c.target, msg.reason)
                    book.on_ack(msg, clock[0])
        if (i + 1) % report_every == 0:
            snap = _reported(site, snap0, plant, handler)
    # the racks report; the decision once more (the cards of a host powered on get their levels and
    # limits once the racks report it on), the racks report again
    for _settle in range(2):
        clock[0] += 10.0
        snap = _reported(site, snap0, plant, handler)
        settle = book.commands(d, snap, applied, clock[0])
        if _settle == 0:
            assert _apply(handler, codec, settle) == []
    left = [codec.decode(c.topic, c.payload) for c in settle]
    renewed = [m for m in left if isinstance(m, wire.CduCommand) and m.pump_speed_frac < 1.0]
    assert len(left) == len(renewed)
    card_host = site.card_host()
    off = np.asarray(snap.card_host_off, dtype=bool)
    if d.host_off is not None:
        assert np.array_equal(off, d.host_off[card_host])
    on = ~off
    assert np.array_equal(snap.card_level[on], d.card_level[on])
    want_lim = np.floor(d.card_power_limit_w * 10.0 + 1e-6) / 10.0
    assert np.all(np.abs(snap.card_power_limit_w[on] - want_lim[on]) <= 0.5 + 1e-9)
    assert np.array_equal(snap.card_low_power[on], d.card_low_power[on])
