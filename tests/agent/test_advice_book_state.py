"""Advisory mode's advice (``CommandBook.advice``): what enforce mode would command now, and nothing of
the book changed by asking.

The advice is the diff of ``CommandBook.commands`` unregistered. An advisory agent's book registers no
command, so each advice is what a fresh book in enforce mode would send for the same decision and
readings, cycle after cycle (here decisions of the real controller in a closed loop, pumps slowed,
jobs placed and cards put to sleep along the way). Asked of a book that holds open commands, the
advice leaves their holds as they were (``Overlays.holds``): the diff dates the pumps' last issue
times at the decision's time after the site clock stepped back, and used to keep that for advice,
which issued nothing, so that the book's next pump renewal came ``pump_renew_s`` after the advice
instead of after its own command."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from agent_helpers import belief, example_site, job
from test_publish import NOW, decision_like

from agent import wire
from agent.command_book import CommandBook
from agent.command_overlays import Holds
from agent.config import ControlConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.loop import ApplyReport, ClosedLoop
from twin.plant import Plant, PlantConfig
from twin.spec import SiteSpec
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent


def _codec(site: SiteSpec) -> wire.Codec:
    return wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))


def _as_advice(book: CommandBook, commands: list[Any]) -> dict[str, Any]:
    """What a list of open commands says, in the advice's terms."""
    items, pumps, placements = [], {}, []
    setpoint = None
    for oc in commands:
        msg = book.codec.decode(oc.topic, oc.payload)
        if isinstance(msg, wire.RackCommand):
            items.append((msg.rack, msg.cards, msg.setting))
        elif isinstance(msg, wire.CduCommand):
            pumps[msg.rack] = msg.pump_speed_frac
        elif isinstance(msg, wire.FacilityCommand):
            setpoint = msg.supply_setpoint_c
        else:
            assert isinstance(msg, wire.SchedulerCommand)
            placements.append((msg.job_id, msg.cards))
    return {"items": items, "pumps": pumps, "setpoint": setpoint, "placements": placements}


def _advised(advice: wire.AgentAdvice) -> dict[str, Any]:
    return {
        "items": [(it.rack, it.cards, it.setting) for it in advice.items],
        "pumps": dict(advice.pump_speeds),
        "setpoint": advice.supply_setpoint_c,
        "placements": [(p.job_id, p.cards) for p in advice.placements],
    }


def _same_holds(a: Holds, b: Holds) -> bool:
    return (
        np.array_equal(a.value, b.value)
        and np.array_equal(a.until, b.until)
        and np.array_equal(a.key, b.key)
        and a.setpoint == b.setpoint
        and a.placing == b.placing
        and a.pump == b.pump
        and np.array_equal(a.pump_sent, b.pump_sent)
    )


def test_each_advice_of_an_advisory_book_is_what_a_fresh_enforce_book_would_send() -> None:
    """The real controller in a closed loop on the example site (two jobs running, a third queued),
    a decision every 15 s for two minutes; at each, the advisory agent's one book advises on the
    decision and the belief it was made on. Each advice is what a fresh book in enforce mode sends for
    them, and the advisory book registers nothing and holds nothing (no open command, its holds as
    new). Along the way the advice slows pumps (and renews them at every decision: the advisory book
    sent nothing to renew), places the queued job and puts idle cards to sleep."""
    site = example_site()
    jobs = [job("a", 64), job("b", 64), job("c", 32, submit_s=20.0)]
    plant = Plant(site, jobs, config=PlantConfig(seed=5, placement="external"))
    control = ControlConfig(period_s=15.0, pump_renew_s=20.0)
    codec = _codec(site)
    advisory = CommandBook(site, codec, control)
    unused = advisory.overlays.holds()
    applied = np.full(site.n_cards, -1, dtype=np.int64)
    advised: list[dict[str, Any]] = []
    loop: ClosedLoop | None = None

    def on_decision(decision: Decision, _report: ApplyReport) -> None:
        assert loop is not None
        snap = loop.state.snapshot()  # what the decision was made on (the belief moves at the next step)
        now = plant.time_s
        advice = _advised(advisory.advice(decision, snap, applied, now))
        fresh = CommandBook(site, codec, control)
        assert advice == _as_advice(fresh, fresh.commands(decision, snap, applied, now)), f"at {now} s"
        assert advisory.open == {} and _same_holds(advisory.overlays.holds(), unused)
        advised.append(advice)

    loop = ClosedLoop(plant, Controller(site, control), on_decision=on_decision, estimator=False)
    loop.run(120.0)
    assert len(advised) >= 8
    slowed = [a["pumps"] for a in advised if any(v < 1.0 for v in a["pumps"].values())]
    assert len(slowed) >= 2  # the same slowed pumps advised again at each decision
    assert any(p[0] == "c" for a in advised for p in a["placements"])
    sleeps = [it for a in advised for it in a["items"] if it[2].action is wire.CardAction.LOW_POWER_IDLE]
    assert sleeps


def _slowed_pump(snap: StateSnapshot) -> Decision:
    speed = np.ones(8)
    speed[2] = 0.5  # rack r2's pump slowed
    return decision_like(snap, rack_pump_speed_frac=speed)


@pytest.fixture(scope="module")
def snap() -> StateSnapshot:
    _plant, state = belief(example_site(), [job("a", 64), job("b", 64)], 5)
    return state.snapshot()


def test_advice_after_the_clock_stepped_back_leaves_the_books_pump_renewal_as_it_was(snap: StateSnapshot) -> None:
    """Two books send rack r2's pump slowed at NOW; the site clock then steps back 5 s (within what a
    rack accepts ahead: the command stays open). One is asked for advice at the new time (nothing to
    advise: the open command holds the slowed speed), the other is not. At the decision 20 s
    (``pump_renew_s``) after the advice, 15 s after the pump's command, neither renews the pump. The
    advice used to keep the diff's dating of the pump's last command at the advice's time (the clock
    stepped back): that book renewed the pump there, 5 s early, for advice that issued nothing."""
    site = example_site()
    codec = _codec(site)
    control = ControlConfig(command_ttl_s=30.0, pump_renew_s=20.0)
    applied = np.full(site.n_cards, -1, dtype=np.int64)
    d = _slowed_pump(snap)
    asked, not_asked = CommandBook(site, codec, control), CommandBook(site, codec, control)
    for book in (asked, not_asked):
        assert _as_advice(book, book.commands(d, snap, applied, NOW))["pumps"] == {"r2": 0.5}
    back = NOW - 5.0
    before = asked.overlays.holds()
    advice = asked.advice(d, snap, applied, back)
    assert advice.pump_speeds == {} and advice.items == ()
    assert _same_holds(asked.overlays.holds(), before)
    later = back + control.pump_renew_s
    renewals = [_as_advice(b, b.commands(d, snap, applied, later))["pumps"] for b in (asked, not_asked)]
    assert renewals == [{}, {}]
    assert np.array_equal(asked.overlays.pump_sent, not_asked.overlays.pump_sent)


def test_advice_leaves_the_holds_of_open_commands_and_registers_nothing(snap: StateSnapshot) -> None:
    """A book with open commands (a card's level, a pump, the set-point, a placement) advises on a
    decision that changes each of them: the advice says the changes, and the book's open commands and
    holds are as they were."""
    site = example_site()
    codec = _codec(site)
    book = CommandBook(site, codec, ControlConfig(command_ttl_s=30.0))
    applied = np.full(site.n_cards, -1, dtype=np.int64)
    lvl = np.asarray(snap.card_level).copy()
    lvl[0:8] = 3
    first = dataclasses.replace(_slowed_pump(snap), card_level=lvl, supply_temp_c=33.0)
    assert book.commands(first, snap, applied, NOW)
    opened, before = dict(book.open), book.overlays.holds()
    lvl2 = lvl.copy()
    lvl2[0:8] = 5
    speed = np.ones(8)
    speed[2] = 0.7
    second = dataclasses.replace(first, card_level=lvl2, supply_temp_c=34.0, rack_pump_speed_frac=speed)
    advice = book.advice(second, snap, applied, NOW + 5.0)
    assert advice.supply_setpoint_c == 34.0 and advice.pump_speeds == {"r2": 0.7}
    assert [(it.rack, it.cards, it.setting.dvfs_level) for it in advice.items] == [("r0", tuple(range(8)), 5)]
    assert book.open == opened and _same_holds(book.overlays.holds(), before)
