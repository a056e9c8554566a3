"""A placement the scheduler refuses no longer holds its job and cards: through the service's ack path.

What users rely on: when the scheduler answers a ``place`` command ``rejected`` (here the simulator's
scheduler, ``sim.commands.CommandHandler``: a card of the placement failed after the readings the
decision used), the agent's next decision places the job again at once, on cards it can use, and
does not count the refused placement's cards as busy (before, the job and its cards stayed held
until the order's ``command_ttl_s`` ran out: 30 s of a job waiting and cards kept awake for nothing).
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from agent_helpers import job, small_site

from agent import wire
from agent.bus import MqttOptions
from agent.command_overlays import Overlays
from agent.config import AgentConfig, ControlConfig, JournalConfig, LoadedConfig
from agent.controller import Controller
from agent.decision import Decision
from agent.loop import ClosedLoop
from agent.publish import OpenCommand
from agent.service import AgentService
from sim.commands import CommandHandler
from twin.estimate import Estimates
from twin.faults import CardFailure
from twin.plant import Plant, PlantConfig
from twin.state import StateSnapshot

pytestmark = pytest.mark.agent

SITE = small_site()  # 2 racks of 16 cards
RUN_CARDS = list(range(16))  # rack r0, busy with "run"


class _Site:
    """A plant whose queued jobs wait for the agent (external placement), the simulator's command
    handler on it, and an agent service (enforce mode, not connected) whose belief reads the plant."""

    def __init__(self, tmp_path: Path, run_cards: list[int] = RUN_CARDS) -> None:
        self.plant = Plant(SITE, [job("run", len(run_cards))], [], PlantConfig(seed=1, placement="external"))
        self.plant.place_job("run", run_cards)
        self.plant.submit(job("q", 8, submit_s=20.0))
        layout = wire.SiteLayout(site="site1", racks=tuple(SITE.rack_names), cards_per_rack=SITE.cards_per_rack)
        self.scheduler = CommandHandler(
            self.plant, wire.Codec(layout), wire.Sequencer("sim"), lambda: self.plant.time_s
        )
        cfg = AgentConfig(
            site="(test)",
            mode="enforce",
            control=ControlConfig(command_ttl_s=30.0),
            journal=JournalConfig(path=str(tmp_path / "journal.sqlite")),
        )
        loaded = LoadedConfig(config=cfg, site=SITE, source="(test)", overrides=())
        self.svc = AgentService(loaded, mqtt=MqttOptions(port=1), http=False)  # not run: no connection

    def run_to(self, t_s: float) -> None:
        while self.plant.time_s < t_s - 1e-9:
            self.plant.step(1.0)
            self.read()

    def read(self) -> None:
        self.svc.state.update(self.plant.readings())
        self.svc.state.apply_events(self.plant.drain_events())

    def decide(self) -> tuple[Decision, StateSnapshot, list[OpenCommand]]:
        snap = self.svc.state.snapshot()
        now = self.plant.time_s
        # as the service's cycle: the cards card_failed refusals keep out of placement
        decision = self.svc.controller.step(snap, now, refused_failed=self.unplaceable(snap))
        commands = self.svc.book.commands(decision, snap, self.svc.ingest.applied_level, now)
        return decision, snap, [c for c in commands if c.target == wire.SCHEDULER]

    def unplaceable(self, snap: StateSnapshot | None = None) -> npt.NDArray[np.bool_]:
        """Per card, kept out of the next decision's placements by a ``card_failed`` refusal."""
        return self.svc.unplaceable_cards(self.svc.state.snapshot() if snap is None else snap, self.plant.time_s)

    def answer(self, command: OpenCommand) -> wire.Acknowledgement:
        """The scheduler's answer to ``command``, taken by the service's ack path."""
        (out,) = self.scheduler.handle(command.topic, command.payload)
        ack = self.svc.codec.decode(out.topic, out.payload)
        assert isinstance(ack, wire.Acknowledgement)
        self.svc.outcomes.on_ack(ack)
        return ack


def test_a_refused_placement_frees_its_job_and_cards_for_the_next_decision(tmp_path: Path) -> None:
    site = _Site(tmp_path)
    try:
        site.run_to(60.0)
        first, snap, (sent,) = site.decide()
        assert [o.job_id for o in first.placements] == ["q"]
        assert [q.job_id for q in snap.queue] == ["q"]
        cards = first.placements[0].cards
        assert len(cards) == 8 and not set(cards) & set(RUN_CARDS)
        # a card of the placement fails before the command arrives (after the readings the agent used)
        dead = cards[0]
        site.plant.add_fault(CardFailure(dead, at_s=site.plant.time_s))
        site.plant.step(1.0)
        ack = site.answer(sent)
        assert ack.result is wire.AckResult.REJECTED and "failed" in (ack.reason or "")
        assert "q" not in site.svc.controller.pending_placements()
        # the next readings show the dead card; the decision right after places "q" on 8 healthy free
        # cards (15 left on rack r1), not 30 s later once the refused order expired
        site.read()
        second, snap, (again,) = site.decide()
        assert [q.job_id for q in snap.queue] == ["q"]
        assert [o.job_id for o in second.placements] == ["q"]
        new_cards = second.placements[0].cards
        assert len(new_cards) == 8 and dead not in new_cards and not set(new_cards) & set(RUN_CARDS)
        # the busy cards are those of "run" and of the new placement: none held for the refused one
        assert set(np.flatnonzero(second.card_busy).tolist()) == set(RUN_CARDS) | set(new_cards)
        assert site.answer(again).result is wire.AckResult.APPLIED
        site.run_to(site.plant.time_s + 1.0)
        assert sorted(site.plant.job_cards("q").tolist()) == sorted(new_cards)
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


def test_a_placement_refused_onto_a_failed_card_is_not_made_onto_it_again_before_telemetry_shows_it(
    tmp_path: Path,
) -> None:
    """The scheduler refuses the placement as ``card_failed`` naming the dead card
    (``wire.placement_card_failed_reason``); the failure requeues nothing here, but a job a failure
    requeues asks for a decision at once, before the rack's next telemetry: the decision made with
    readings that still show the card healthy places the job on 8 other cards. Before, it placed it
    onto the same dead card again (refused again, once per decision, until telemetry showed it)."""
    site = _Site(tmp_path)
    try:
        site.run_to(60.0)
        first, _snap, (sent,) = site.decide()
        cards = first.placements[0].cards
        dead = cards[3]
        site.plant.add_fault(CardFailure(dead, at_s=site.plant.time_s))
        site.plant.step(1.0)
        ack = site.answer(sent)
        assert ack.result is wire.AckResult.REJECTED and wire.reason_code(ack.reason) == wire.AckReason.CARD_FAILED
        r, local = divmod(dead, SITE.cards_per_rack)
        assert wire.failed_cards_by_rack(ack.reason) == {SITE.rack_names[r]: (local,)}
        # no reading since: the belief still shows the card healthy and idle
        assert not site.svc.state.snapshot().card_failed[dead]
        assert site.unplaceable()[dead]  # the decision places nothing on it
        second, _snap, (again,) = site.decide()
        assert [o.job_id for o in second.placements] == ["q"]
        new_cards = second.placements[0].cards
        assert len(new_cards) == 8 and dead not in new_cards and not set(new_cards) & set(RUN_CARDS)
        assert site.answer(again).result is wire.AckResult.APPLIED
        # a reading newer than the refusal ends the mark: the belief's own reading says failed now
        site.run_to(site.plant.time_s + 1.0)
        assert site.svc.book.overlays.failed_marks(site.svc.state.snapshot().card_last_seen_s) == {}
        assert site.svc.state.snapshot().card_failed[dead] and not site.unplaceable()[dead]
        assert sorted(site.plant.job_cards("q").tolist()) == sorted(new_cards)
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


def test_a_card_a_stale_scheduler_refuses_again_is_held_out_of_placements(tmp_path: Path) -> None:
    """A scheduler whose view of a card is stale (it says the card failed; the rack's telemetry reads
    it alive) refuses every placement onto it as ``card_failed``. The first refusal marks the card
    until the next reading; the decision after that reading places the job onto it again, and the
    second refusal, after a reading had cleared the mark, is a repeat: the card is held out for
    ``command_ttl_s`` whatever its readings say (agent.command_overlays), out of placements too. The
    third decision places the job on other cards. Before, the hold kept the card out of card
    commands only: the job was placed onto it again after every reading, refused each time."""
    site = _Site(tmp_path)
    try:
        site.run_to(60.0)

        def stale_refusal(command: OpenCommand, card: int) -> None:
            r, local = divmod(card, SITE.cards_per_rack)
            reason = wire.placement_card_failed_reason({SITE.rack_names[r]: [local]})
            ack = wire.Acknowledgement(
                wire.SCHEDULER, uuid.UUID(command.command_id), wire.AckResult.REJECTED, site.plant.time_s, 1, "sched",
                reason,
            )  # fmt: skip
            site.svc.outcomes.on_ack(ack)

        first, _snap, (sent,) = site.decide()
        stale = first.placements[0].cards[0]
        stale_refusal(sent, stale)
        site.run_to(site.plant.time_s + 1.0)  # a reading of the card, alive: the mark ends
        assert not site.unplaceable()[stale]
        second, _snap, (sent,) = site.decide()
        assert stale in second.placements[0].cards  # (the cards the decision likes best)
        stale_refusal(sent, stale)  # refused as failed again although the rack reads it alive: a repeat
        site.run_to(site.plant.time_s + 1.0)
        assert site.unplaceable()[stale]
        third, snap, (sent,) = site.decide()
        assert not snap.card_failed[stale]  # (the belief reads it alive)
        assert [o.job_id for o in third.placements] == ["q"] and stale not in third.placements[0].cards
        assert site.answer(sent).result is wire.AckResult.APPLIED
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


def test_a_card_held_out_of_placements_while_it_reads_alive_is_budgeted_at_its_power(tmp_path: Path) -> None:
    """Card 15 of rack r0 (the rest of r0 runs "run") is refused as failed again after a reading had
    cleared its first mark, while its rack reads it alive and idle (a stale status): held out for
    ``command_ttl_s`` (agent.command_overlays). The decision places "q" elsewhere, but the card still
    draws its idle power: r0's budget counts it, at the settings the card reports (no command reaches
    it, so the guard counts on none). Before, the
    decision counted the held card failed and budgeted it at 0 W (the rack's cap short for up to an
    hour in the repeat-hold case), and left it out of its levels and low-power idle."""
    held = 15
    site = _Site(tmp_path, run_cards=list(range(15)))
    try:
        site.run_to(60.0)
        overlays = site.svc.book.overlays
        dead = np.asarray([held], dtype=np.int64)
        overlays.mark_failed(dead, 60.0, 59.0, 60.0, 30.0)  # a first card_failed refusal: marked
        site.run_to(61.0)  # a reading of the card, alive: the mark ends (found so by a decision's commands)
        assert not overlays.failed_now(site.svc.state.snapshot().card_last_seen_s, 61.0)[held]
        overlays.mark_failed(dead, 61.0, 61.0, 61.0, 30.0)  # refused again for a command issued since
        site.run_to(62.0)  # read alive again: the repeat's hold holds it out until 91 s
        snap = site.svc.state.snapshot()
        assert not snap.card_failed[held] and snap.card_job[held] < 0
        assert site.unplaceable(snap)[held]
        decision, _snap, (sent,) = site.decide()
        assert [o.job_id for o in decision.placements] == ["q"] and held not in decision.placements[0].cards
        assert site.answer(sent).result is wire.AckResult.APPLIED
        # the decision sees the card as its readings say: alive and idle, at the settings it reports (no
        # command reaches it: agent.command_diff leaves it out), and places "q" as a decision without the
        # hold does (on rack r1), whose budget it shares but for r0's held card
        free = Controller(SITE, ControlConfig(command_ttl_s=30.0)).step(snap, 62.0)
        assert free.placements == decision.placements
        assert not decision.card_failed[held]
        assert decision.card_low_power[held] == snap.card_low_power[held]
        assert decision.card_level[held] == snap.card_level[held]
        assert decision.card_power_limit_w[held] == snap.card_power_limit_w[held]
        assert decision.budget_rack_power_w[1:] == pytest.approx(free.budget_rack_power_w[1:], rel=1e-9)
        # and r0's budget exceeds that of a decision whose readings show the card dead by the card's idle
        # power, by hand (examples/supernode-512.toml): awake at level k, 84.5 W * (V_k/V_0)^2 + 0.47 W/K *
        # (V_k/V_0) * (die - 42 deg C); asleep, 52.8 W + 0.4 W/K * (die - 42 deg C); its die between the
        # 30 deg C supply and 42 deg C (an idle card at ~60 W, ~0.1 K/W above its coolant)
        failed = np.asarray(snap.card_failed, dtype=bool).copy()
        failed[held] = True
        gone = Controller(SITE, ControlConfig(command_ttl_s=30.0)).step(
            dataclasses.replace(snap, card_failed=failed), 62.0
        )
        card_w = float(decision.budget_rack_power_w[0] - gone.budget_rack_power_w[0])
        if decision.card_low_power[held]:
            lo_w, hi_w = 52.8 + 0.4 * (30.0 - 42.0), 52.8
        else:
            v = SITE.card.voltages_v[int(decision.card_level[held])] / SITE.card.voltages_v[0]
            lo_w, hi_w = 84.5 * v**2 + 0.47 * v * (30.0 - 42.0), 84.5 * v**2
        assert lo_w <= card_w <= hi_w
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


def test_a_placement_answered_expired_is_placed_again_although_the_readings_lag(tmp_path: Path) -> None:
    """The command reached the scheduler after its expiry (``expired``: not applied). The readings lag
    the clock, so by the book's own rule the order would have been held until readings newer than its
    expiry came; the scheduler's answer says the job cannot start from it."""
    site = _Site(tmp_path)
    try:
        site.run_to(60.0)
        first, _snap, (sent,) = site.decide()
        assert [o.job_id for o in first.placements] == ["q"]
        # the command is held up past its 30 s; the agent's readings stop at 70 s (within the telemetry
        # deadline of the next decision at 91 s, but older than the order's expiry at 90 s)
        site.plant.run(10.0)  # the plant runs on, the agent reads none of it...
        site.read()  # ...until its readings of 70 s
        site.plant.run(21.0)
        assert site.answer(sent).result is wire.AckResult.EXPIRED
        assert "q" not in site.svc.controller.pending_placements()
        second, snap, (again,) = site.decide()
        assert (snap.time_s, site.plant.time_s) == (70.0, 91.0)
        assert [o.job_id for o in second.placements] == ["q"]
        assert site.answer(again).result is wire.AckResult.APPLIED
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


def test_an_applied_placement_stays_in_flight_until_its_job_runs(tmp_path: Path) -> None:
    """The other answer, for contrast: an applied placement keeps its job from being placed twice."""
    site = _Site(tmp_path)
    try:
        site.run_to(60.0)
        first, _snap, (sent,) = site.decide()
        assert site.answer(sent).result is wire.AckResult.APPLIED
        assert site.svc.controller.pending_placements() == {"q": first.placements[0].cards}
        second, _snap, again = site.decide()  # before the job's start shows in the readings
        assert not second.placements
        assert again == []
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


def test_a_placement_the_site_clock_left_behind_is_placed_again_at_the_next_decision(tmp_path: Path) -> None:
    """A placement sent at 60 s, unanswered; the site's clock steps back to 40 s (a scheduler restarted
    on an earlier clock): stamped more than a scheduler accepts ahead (``wire.MAX_ISSUE_AHEAD_S``,
    10 s at 1x), no scheduler applies it, and the publisher's next step closes it unacked
    (``CommandBook.expire``; the scheduler's ``issued_ahead`` answer, if any, finds it closed). As a
    refused placement, it no longer holds its job and cards: the next decision places the job again
    (before, the controller held it in flight for the order's 30 s)."""
    site = _Site(tmp_path)
    try:
        site.run_to(60.0)
        first, _snap, (sent,) = site.decide()
        assert [o.job_id for o in first.placements] == ["q"]
        gone = site.svc.book.expire(40.0)  # the publisher's step after the clock stepped back...
        assert sent in gone  # (with the card settings of that decision)
        for oc in gone:
            site.svc.outcomes.on_closed(oc, "unacked")  # ...and what it reports of each command it closed
        assert "q" not in site.svc.controller.pending_placements()
        second, _snap, (again,) = site.decide()
        assert [o.job_id for o in second.placements] == ["q"]
        assert site.answer(again).result is wire.AckResult.APPLIED
    finally:
        site.svc.control._executor.shutdown(wait=True)
        site.svc.journal.close()


class _CardFailsAfterDecision(Controller):
    """The agent's controller; the first card of its first placement fails in ``plant`` right after the
    decision (before the decision is applied: the readings it used showed the card alive)."""

    plant: Plant
    failed: int | None = None

    def step(
        self,
        snap: StateSnapshot,
        now_s: float | None = None,
        estimates: Estimates | None = None,
        *,
        use_solver: bool = True,
        incremental: bool = False,
        refused_failed: npt.NDArray[np.bool_] | None = None,
    ) -> Decision:
        d = super().step(
            snap, now_s, estimates, use_solver=use_solver, incremental=incremental, refused_failed=refused_failed
        )
        if self.failed is None and d.placements:
            self.failed = d.placements[0].cards[0]
            self.plant.add_fault(CardFailure(self.failed, at_s=self.plant.time_s))
        return d


def _loop_whose_placed_card_fails(
    telemetry_period_s: float = 1.0,
) -> tuple[Plant, _CardFailsAfterDecision, ClosedLoop, list[tuple[float, list[str]]]]:
    """The in-process loop over a plant with job "run" on ``RUN_CARDS`` and an 8-card job "q" submitted
    at 20 s, decided every 15 s by :class:`_CardFailsAfterDecision`; each decision's time and the
    commands the plant refused are appended to the returned list; readings every ``telemetry_period_s``
    (``ClosedLoop``'s default 1 s)."""
    plant = Plant(SITE, [job("run", 16)], [], PlantConfig(seed=1, placement="external"))
    plant.place_job("run", RUN_CARDS)
    plant.submit(job("q", 8, submit_s=20.0))
    controller = _CardFailsAfterDecision(SITE, ControlConfig(period_s=15.0, command_ttl_s=30.0))
    controller.plant = plant
    refusals: list[tuple[float, list[str]]] = []
    loop = ClosedLoop(
        plant,
        controller,
        estimator=False,
        replan_on_job_events=False,
        on_decision=lambda d, report: refusals.append((d.time_s, report.refused)),
        telemetry_period_s=telemetry_period_s,
    )
    return plant, controller, loop, refusals


def test_in_process_a_placement_the_plant_refuses_is_placed_again_at_the_next_decision() -> None:
    """``racktwin evaluate``'s loop (``agent.loop.ClosedLoop``) as the service: the plant refuses the
    placement onto the card that just failed, and the next decision (15 s later) places the job on
    healthy cards, not once the refused order expired (30 s)."""
    plant, controller, loop, refusals = _loop_whose_placed_card_fails()
    loop.run(46.0)  # decisions at 0, 15, 30 ("q", submitted at 20 s, placed and refused) and 45 s
    assert controller.failed is not None
    assert [t for t, refused in refusals if refused] == [30.0]
    cards = plant.job_cards("q").tolist()
    assert len(cards) == 8 and controller.failed not in cards and not set(cards) & set(RUN_CARDS)


def test_in_process_a_placement_refused_onto_a_failed_card_is_not_made_onto_it_again_while_readings_lag() -> None:
    """As the service: with telemetry read every 30 s, the decision after the refusal (45 s) still
    reads the dead card healthy; the plant's refusal named it (``CommandError.failed_cards``), so
    the job goes onto other cards at once. Before, it was placed onto the dead card again at 45 s
    (and refused again) and went onto healthy cards only after the telemetry round at 60 s."""
    plant, controller, loop, refusals = _loop_whose_placed_card_fails(telemetry_period_s=30.0)
    loop.run(46.0)  # readings at 0 and 30 s (before the decision); decisions at 0, 15, 30 (refused), 45 s
    assert controller.failed is not None
    assert [t for t, refused in refusals if refused] == [30.0]
    assert not loop.state.snapshot().card_failed[controller.failed]  # no reading shows it yet
    cards = plant.job_cards("q").tolist()
    assert len(cards) == 8 and controller.failed not in cards and not set(cards) & set(RUN_CARDS)


def test_a_placement_the_scheduler_applies_does_not_end_a_racks_failed_mark() -> None:
    """A placement sent before a rack refused a setting of card 20 as ``card_failed``, applied by the
    scheduler after the refusal: the scheduler does not reach the card (its view of the failure may
    lag the rack's), so the card stays marked until its next reading, and a later refusal of a
    setting to it is not counted a first one again (agent.command_overlays: only a card setting
    the rack applies ends the marks and repeats)."""
    overlays = Overlays(SITE)
    dead = np.asarray([20], dtype=np.int64)
    overlays.mark_failed(dead, 61.0, 60.0, 61.0, 30.0)
    placement = OpenCommand("p1", wire.SCHEDULER, "t", b"", 59.0, 89.0, cards=np.arange(16, 24, dtype=np.int64))
    applied = wire.Acknowledgement(wire.SCHEDULER, uuid.uuid4(), wire.AckResult.APPLIED, 62.0, 1, "sched")
    overlays.note_applied(placement, applied)
    assert overlays.said_failed(np.full(SITE.n_cards, 60.5))[20]
