"""A refusal acked while a decision's solve runs counts for that decision's guard too.

What users rely on: every decision's budget is what the cards will draw. The service's cycle solves
in an executor thread (up to 0.6 of a period) while the event loop keeps taking acks; a refusal acked
meanwhile holds its setting back from the decision's commands (``CommandBook.commands``) or, refused
``card_failed``, keeps its cards out of them and of placement. Before, the guard reviewed the
proposal with the refusals read before the solve: it budgeted the decision's value of a setting no
command would carry (here r1's idle cards asleep while they stay awake), and kept a placement onto a
card refused as failed meanwhile. Now the cycle reads the refusals again before the guard reviews, and
with them the levels, power limits and low-power states the racks confirmed applying (a card no command
reaches keeps the faster level of what it reports and what its rack confirmed, and an idle one is awake
where either says awake: ``agent.guard`` step 3a).

The service (enforce mode, not connected: no broker) reads the plant through the simulator's
encoder, the wire and its ingest; its real controller solves; a thin wrapper around the real
``Controller.propose`` takes the rack's or scheduler's refusal on the service's ack path before the
proposal returns, as the event loop does while the solve runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from agent_helpers import job, small_site
from guard_helpers import drawn_rack_power_w

from agent import wire
from agent.bus import MqttOptions
from agent.config import AgentConfig, ControlConfig, JournalConfig, LoadedConfig
from agent.decision import Decision, StepContext
from agent.guard import rack_measured_caps_w
from agent.open_commands import LEVEL, SLEEP
from agent.publish import OpenCommand
from agent.service import AgentService
from sim.telemetry import TelemetryEncoder
from twin.plant import Plant, PlantConfig
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent

SITE = small_site()  # 2 racks of 16 cards
R0 = list(range(16))  # busy with "run"
R1 = list(range(16, 32))  # idle


class _Site:
    """A plant whose queued jobs wait for the agent (external placement) and an agent service whose
    belief reads the plant's telemetry through the simulator's encoder and the wire."""

    def __init__(self, tmp_path: Path, **control_changes: Any) -> None:
        """``control_changes``: fields of the agent's ``ControlConfig`` other than the tests' defaults."""
        self.plant = Plant(SITE, [job("run", len(R0))], [], PlantConfig(seed=1, placement="external"))
        self.plant.place_job("run", R0)
        control = ControlConfig(
            command_ttl_s=30.0,
            control_host_power=False,
            control_pump_speed=False,
            idle_reserve_cards=0,
            **control_changes,
        )
        cfg = AgentConfig(
            site="(test)",
            mode="enforce",
            control=control,
            journal=JournalConfig(path=str(tmp_path / "journal.sqlite")),
        )
        self.svc = AgentService(
            LoadedConfig(config=cfg, site=SITE, source="(test)", overrides=()), mqtt=MqttOptions(port=1), http=False
        )
        self.codec = self.svc.codec
        self.encoder = TelemetryEncoder(self.codec, SITE, wire.Sequencer("sim"))
        self.reviewed: list[StepContext] = []
        review = self.svc.controller.review

        def record_review(proposal: Decision, snap: StateSnapshot, ctx: StepContext) -> Decision:
            self.reviewed.append(ctx)
            return review(proposal, snap, ctx)

        self.svc.controller.review = record_review  # type: ignore[method-assign]

    def run_to(self, t_s: float) -> None:
        while self.plant.time_s < t_s - 1e-9:
            self.plant.step(1.0)
            readings = self.plant.readings()
            messages = self.encoder.readings(readings, readings.time_s)
            events = self.plant.drain_events()
            messages += [m for m in (self.encoder.job_event(ev, 0.0) for ev in events) if m is not None]
            for out in messages:
                msg = self.codec.decode(out.topic, out.payload)
                assert not isinstance(msg, wire.Rejection), msg
                self.svc.ingest.handle(msg)
            self.svc.ingest.flush()

    async def decide(
        self, during_solve: Callable[[Decision], None] | None = None
    ) -> tuple[Decision, list[OpenCommand]]:
        """One periodic decision of the service's cycle at the plant's time (its solve in the
        executor); ``during_solve`` gets the real proposal before it returns. The decision and the
        commands it sent."""
        before = set(self.svc.book.open)
        if during_solve is not None:
            propose = self.svc.controller.propose

            def propose_then(*args: Any, **kwargs: Any) -> Decision:
                proposal = propose(*args, **kwargs)
                during_solve(proposal)
                return proposal

            self.svc.controller.propose = propose_then  # type: ignore[method-assign]
        try:
            await self.svc.control.cycle(self.plant.time_s, time.monotonic(), "period")
        finally:
            self.svc.controller.__dict__.pop("propose", None)
        decision = self.svc.last_decision
        assert decision is not None
        return decision, [oc for cid, oc in self.svc.book.open.items() if cid not in before]

    def refuse(self, oc: OpenCommand, reason: str) -> None:
        """The target's refusal of ``oc``, taken by the service's ack path (stamped after the rack's
        last readings, as one that comes while a solve runs)."""
        ts = self.plant.time_s + 0.5
        ack = wire.Acknowledgement(oc.target, uuid.UUID(oc.command_id), wire.AckResult.REJECTED, ts, 0, "sim", reason)
        self.svc.outcomes.on_ack(ack)


def _applied_state(rack: str, levels: npt.NDArray[np.int64], low_power: npt.NDArray[np.bool_]) -> wire.AppliedState:
    """The retained applied state ``rack`` publishes at site time 40.5 s: every card of it at its full
    power limit, ``levels`` (a card's clock range up to its level's clock) and ``low_power``."""
    n = len(levels)
    return wire.AppliedState(
        rack=rack,
        card_index=np.arange(n),
        dvfs_level=levels,
        min_clock_mhz=np.full(n, SITE.card.clocks_mhz[-1]),
        max_clock_mhz=np.asarray(SITE.card.clocks_mhz)[levels],
        power_limit_w=np.full(n, SITE.card.power_limit_w),
        low_power=low_power,
        last_command_id=None,
        ts_s=40.5,
        seq=1,
        publisher="sim",
    )


def _sleeps_to_r1(commands: list[OpenCommand]) -> list[OpenCommand]:
    return [oc for oc in commands if oc.kind == SLEEP and set(oc.cards.tolist()) <= set(R1)]


async def test_a_sleep_refused_during_the_solve_is_budgeted_as_the_cards_report(tmp_path: Path) -> None:
    site = _Site(tmp_path)
    try:
        site.run_to(30.0)
        _first, sent = await site.decide()
        (sleep,) = _sleeps_to_r1(sent)  # r1's idle cards to low-power idle (the plant never gets it)
        asleep = sorted(sleep.cards.tolist())
        site.run_to(40.0)
        snap = site.svc.state.snapshot()
        assert not snap.card_low_power[asleep].any()  # they read awake
        # the next decision's solve: r1 refuses the sleep meanwhile (not for a failed card)
        decision, sent = await site.decide(lambda _proposal: site.refuse(sleep, "rejected: not now"))
        assert not _sleeps_to_r1(sent)  # the commands honour the refusal...
        # ...and the guard keeps the cards awake, as they report (before: budgeted asleep)
        assert not decision.card_low_power[asleep].any()
        ctx = site.reviewed[-1]
        assert ctx.held_sleep_cards == tuple(asleep)
        drawn = drawn_rack_power_w(SITE, decision, snap, ctx)
        assert decision.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
        assert np.all(drawn <= rack_measured_caps_w(SITE, site.svc.config.control) + 1e-6)
    finally:
        await site.svc._close()


async def test_a_placement_onto_a_card_refused_as_failed_during_the_solve_is_dropped(tmp_path: Path) -> None:
    site = _Site(tmp_path)
    try:
        site.plant.submit(job("q", 8, submit_s=35.0))
        site.run_to(30.0)
        _first, sent = await site.decide()
        (level,) = [oc for oc in sent if oc.kind == LEVEL and oc.target == "r1"]  # r1's idle cards' level
        site.run_to(40.0)
        assert [q.job_id for q in site.svc.state.snapshot().queue] == ["q"]
        dead: list[int] = []

        def refuse_a_card_of_the_placement(proposal: Decision) -> None:
            (order,) = proposal.placements
            dead.append(order.cards[0])
            local = dead[0] - SITE.cards_per_rack * int(SITE.card_rack()[dead[0]])
            site.refuse(level, wire.card_failed_reason("r1", [local]))

        decision, sent = await site.decide(refuse_a_card_of_the_placement)
        assert dead and dead[0] in R1
        # the guard drops the placement onto the card said failed meanwhile: no job is sent onto it
        assert not any(dead[0] in order.cards for order in decision.placements)
        placed = [site.svc.book.placement_of(oc) for oc in sent]
        assert not any(p is not None and dead[0] in p[1] for p in placed)
        assert dead[0] in site.reviewed[-1].refused_failed_cards
    finally:
        await site.svc._close()


async def test_a_card_no_command_reaches_is_budgeted_at_the_level_its_rack_confirmed_after_its_last_reading(
    tmp_path: Path,
) -> None:
    """r0's cards read level 7; r0 then applies a raise to level 4 and confirms it (its retained applied
    state) before their next reading, and refuses the older level command as ``card_failed`` for card 3
    while the solve runs: no command reaches card 3, which draws at level 4. The guard reviews with what
    the racks confirmed at that moment (the levels the decision's commands are diffed against) and keeps
    card 3 at level 4 (before: at the level 7 its telemetry still showed, budgeting it slower than it runs)."""
    site = _Site(tmp_path)
    try:
        site.run_to(30.0)
        _first, sent = await site.decide()
        (level,) = [oc for oc in sent if oc.kind == LEVEL and oc.target == "r0"]  # r0's cards to level 7
        site.plant.set_levels(R0, 7)
        site.run_to(40.0)
        snap = site.svc.state.snapshot()
        assert snap.card_level[R0].tolist() == [7] * len(R0)
        site.plant.set_levels(R0, 4)  # applied, not read yet
        confirmed = _applied_state("r0", np.full(len(R0), 4), np.zeros(len(R0), dtype=bool))

        def confirm_then_refuse_card_3(_proposal: Decision) -> None:
            site.svc.ingest.handle(confirmed)
            site.refuse(level, wire.card_failed_reason("r0", [3]))

        decision, _sent = await site.decide(confirm_then_refuse_card_3)
        ctx = site.reviewed[-1]
        assert ctx.refused_failed_cards == (3,)
        assert ctx.applied_level is not None and ctx.applied_level[R0].tolist() == [4] * len(R0)
        assert decision.card_level[3] == 4  # in force: the level r0 confirmed
        drawn = drawn_rack_power_w(SITE, decision, snap, ctx)
        assert decision.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    finally:
        await site.svc._close()


async def test_an_idle_card_no_command_reaches_is_budgeted_awake_after_a_wake_its_rack_confirmed(
    tmp_path: Path,
) -> None:
    """r1's idle cards read asleep; r1 then wakes one of them and confirms it (its retained applied state)
    before its next reading, and refuses the older sleep command as ``card_failed`` for that card while
    the solve runs: no command reaches it, and it draws awake. The guard reviews with what the racks
    confirmed at that moment and keeps the card awake (before: asleep, as its telemetry still showed)."""
    site = _Site(tmp_path)
    try:
        site.run_to(30.0)
        _first, sent = await site.decide()
        (sleep,) = _sleeps_to_r1(sent)
        asleep = sorted(sleep.cards.tolist())
        site.plant.enter_low_power(asleep)
        site.run_to(40.0)
        snap = site.svc.state.snapshot()
        assert snap.card_low_power[asleep].all()
        woken = asleep[0]
        local = woken - SITE.cards_per_rack
        site.plant.wake([woken])  # applied, not read yet
        low = np.asarray(snap.card_low_power[R1], dtype=bool)
        low[local] = False
        confirmed = _applied_state("r1", np.asarray(snap.card_level[R1], dtype=np.int64), low)

        def confirm_then_refuse_it(_proposal: Decision) -> None:
            site.svc.ingest.handle(confirmed)
            site.refuse(sleep, wire.card_failed_reason("r1", [local]))

        decision, _sent = await site.decide(confirm_then_refuse_it)
        ctx = site.reviewed[-1]
        assert ctx.refused_failed_cards == (woken,)
        assert ctx.applied_low_power is not None and ctx.applied_low_power[woken] == 0.0
        assert not decision.card_low_power[woken]  # in force: awake, as r1 confirmed
        drawn = drawn_rack_power_w(SITE, decision, snap, ctx)
        assert decision.budget_rack_power_w == pytest.approx(drawn, rel=1e-12)
    finally:
        await site.svc._close()
