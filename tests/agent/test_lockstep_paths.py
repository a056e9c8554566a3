"""``racktwin evaluate`` claims to measure what the service would do. End to end, in lockstep and without
a broker: two plants built alike from one run scenario (site, jobs, faults, seed), one driven as
``racktwin evaluate`` drives the ``racktwin`` policy (``agent.policies.make_policy`` on the plant of
``agent.evaluate._plant_for``: ``agent.loop.ClosedLoop``, readings straight into the belief,
``Controller.step``, ``agent.loop.apply_to_plant``), the other as the service and the simulator drive
theirs: the simulator's ``TelemetryEncoder`` -> bytes -> the service's own ingest
(``AgentService._take_message``: ``agent.wire.Codec`` -> ``agent.ingest.Ingest`` -> belief), its own
``control.run`` (decision timing, ``agent.control_loop``), ``estimation.run`` (``agent.estimation_loop``),
``control.cycle`` (the same controller) and ``Publisher`` (``agent.publish.CommandBook``) -> command bytes -> the
simulator's ``CommandHandler`` -> plant, its acks and applied state back through the codec into the
book and the belief.

Lockstep: the plants step one site second at a time; the simulator's messages of a second reach the
service in the order the simulator sends them (``sim.runner``: a step's job events right after the
step, the telemetry round of that second at its end), and the service's site clock moves with them
only (no site time passes between messages). After each burst the service settles (its control task
waits for a later time again, nothing left to send) before the plants go on.

Where the service's commands land: ``same step`` applies them to the plant before it steps on, as
``apply_to_plant`` does (a service that answers within the simulator's step); ``one step later`` holds
the commands of a decision made on a telemetry round until the plant has stepped, as the simulator
paces (``sim.runner``: it publishes a round and steps at once, so a decision on that round is applied
a second later; one made on a job event, published right after a step, lands in the same second).

What the paths must show:

* same step: the same decisions at the same times and the same plant, second by second, except where
  the service decided on a job event ahead of the telemetry round of that second (the simulator sends
  a step's events first) and that round told something the event did not: here a card's failure, so
  the service's rack command for that card's rack is refused whole (docs/protocol.md) and the
  rack's other cards keep their level until the next decision;
* one step later: the same decisions until the one-second lag has shifted a job's phases, and the
  same energy, work and limits to a fraction of a percent."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from evaluate_helpers import full_load_scenario

from agent import wire
from agent.bus import MqttOptions
from agent.clock import SiteClock
from agent.config import AgentConfig, ControlConfig, HttpConfig, JournalConfig, LoadedConfig
from agent.decision import Decision
from agent.evaluate import _plant_for
from agent.policies import AgentPolicy, make_policy
from agent.service import AgentService
from sim.runner import SimOptions, Simulator
from twin.faults import CardFailure, Fault, SensorDropout
from twin.plant import Plant, Truth
from twin.readings import Readings
from twin.scenario import RunScenario, load_run_scenario, run_scenario_from_dict
from twin.spec import SiteSpec, site_from_dict
from twin.tables import read_toml

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
START = 1_800_000_000.0  # the simulator's site clock at t = 0


def _site() -> SiteSpec:
    """The example hardware as 3 racks of 16 cards, 4 hosts of 4 cards per rack, booting in 60 s."""
    data: dict[str, Any] = read_toml(EXAMPLES / "supernode-512.toml")
    data.update(torus_dims=[4, 4, 3], racks_per_supernode=3, name="lockstep-3x16")
    data["rack"] = {
        **data["rack"],
        "host_overhead_w": 2200.0,
        "power_limit_w": 12500.0,
        "hosts_per_rack": 4,
        "host_power_w": 250.0,
        "host_off_power_w": 12.5,
        "host_boot_s": 60.0,
    }
    return site_from_dict(data, source="lockstep")


def _mixed(duration_s: float = 900.0) -> RunScenario:
    """Jobs running, checkpointing, finishing, submitted later and placed by the agent; idle hosts
    going off and on again; card 3 failing at 150 s (its job waits, is requeued and restarts); NaN
    readings in r1 (250-290 s), card 40 stuck (320-460 s), r2 silent (600-640 s)."""
    jobs = [
        {"id": "run-a", "n_cards": 8, "duration_s": 1e6, "compute_share": 0.95, "running_at_start": True,
         "checkpoint_interval_s": 180.0, "checkpoint_duration_s": 30.0, "step_time_s": 1.0},
        {"id": "run-b", "n_cards": 8, "duration_s": 300.0, "compute_share": 0.9, "running_at_start": True,
         "checkpoint_interval_s": 120.0, "checkpoint_duration_s": 20.0, "step_time_s": 1.5, "priority": 2.0},
        {"id": "run-c", "n_cards": 4, "duration_s": 1e6, "compute_share": 0.97, "running_at_start": True,
         "step_time_s": 1.0},
        {"id": "late-d", "n_cards": 8, "duration_s": 250.0, "submit_time_s": 200.0, "compute_share": 0.93,
         "checkpoint_interval_s": 100.0, "checkpoint_duration_s": 15.0},
        {"id": "late-e", "n_cards": 12, "duration_s": 400.0, "submit_time_s": 420.0, "compute_share": 0.96},
        {"id": "late-f", "n_cards": 16, "duration_s": 1e6, "submit_time_s": 700.0, "compute_share": 0.97},
    ]  # fmt: skip
    faults = [
        {"kind": "card_failure", "card": 3, "at_s": 150.0},
        {"kind": "garbage_readings", "rack": "r1", "start_s": 250.0, "end_s": 290.0, "mode": "nan", "fraction": 0.3},
        {"kind": "stuck_sensor", "rack": "r2", "card": 40, "start_s": 320.0, "end_s": 460.0},
        {"kind": "sensor_dropout", "rack": "r2", "start_s": 600.0, "end_s": 640.0},
    ]
    data: dict[str, Any] = {
        "name": "lockstep-mixed",
        "duration_s": duration_s,
        "seed": 11,
        "workload": {"source": "none"},
        "ambient": {"kind": "constant", "temp_c": 27.0},
        "plant": {"placement": "external"},
        "jobs": jobs,
        "faults": faults,
    }
    return run_scenario_from_dict(data, source="lockstep-mixed", site=_site())


# ---- the in-process path: what ``racktwin evaluate`` runs ------------------------------------------
class _InProcess:
    def __init__(self, sc: RunScenario, control: ControlConfig) -> None:
        policy = make_policy("racktwin", sc.site, control)
        assert isinstance(policy, AgentPolicy)
        policy.telemetry_period_s = sc.telemetry_period_s  # as agent.evaluate.run_policy
        self.plant = _plant_for(sc, policy)
        policy.bind(self.plant)
        self.policy = policy
        self.decisions: list[Decision] = []
        policy.decision_listeners.append(lambda d, _report: self.decisions.append(d))

    def second(self) -> None:
        """Readings (and events) -> a decision when one is due -> applied -> one step."""
        self.policy.run(1.0, lambda: None)


# ---- the service's path ------------------------------------------------------------------------------
class _Clock(SiteClock):
    """The service's site clock on a wall that moves only with the simulator's messages; says where
    the control task waits (to tell when the service has settled)."""

    def __init__(self, control: ControlConfig, wall: list[float]) -> None:
        super().__init__(control.time_scale, infer=control.infer_time_scale, wall=lambda: wall[0])
        self.parked: tuple[float, asyncio.Event | None] | None = None

    async def wait_until(self, t_site_s: float, wake: asyncio.Event | None = None, max_sleep_s: float = 0.5) -> bool:
        self.parked = (t_site_s, wake)
        try:
            return await super().wait_until(t_site_s, wake, max_sleep_s)
        finally:
            self.parked = None


class _Broker:
    """What the publisher publishes (PUBACK at once)."""

    options = MqttOptions(port=1)

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool, timeout_s: float) -> None:
        self.sent.append((topic, payload))


class _ServicePath:
    """The simulator's plant, encoder and command handler; the service's ingest, control, estimate and
    publish, run for real on an event loop (see the module docstring)."""

    def __init__(self, sc: RunScenario, control: ControlConfig, journal: Path, *, later: bool) -> None:
        self.sim = Simulator(SimOptions(scenario=sc, mqtt=MqttOptions(port=1), speed=0.0, start_epoch_s=START))
        self.plant = self.sim.plant
        cfg = AgentConfig(
            site="(lockstep)", mode="enforce", control=control, journal=JournalConfig(path=str(journal)),
            http=HttpConfig(port=0),
        )  # fmt: skip
        loaded = LoadedConfig(config=cfg, site=sc.site, source="(lockstep)", overrides=())
        self.wall = [0.0]
        self.clock = _Clock(control, self.wall)
        # no connection is made; the service hands its clock to every part that reads the site's time
        self.svc = svc = AgentService(loaded, mqtt=MqttOptions(port=1), http=False, clock=self.clock)
        self.broker = _Broker()
        svc.publisher.bus = self.broker
        self.later = later
        self.held: list[tuple[str, bytes]] = []  # commands arriving after the simulator stepped on
        self.phase = "events"  # which of the simulator's bursts the service reacts to now
        self.decisions: list[tuple[Decision, str]] = []  # and the burst it was made on
        self.tasks: list[asyncio.Task[None]] = []

    def _take(self, outs: list[wire.Outgoing]) -> None:
        """Messages as the ingest task takes a burst: each in, then the round flushed, acks journaled."""
        if outs:
            self.wall[0] = self.plant.time_s  # the site clock moves with the messages
        for o in outs:
            self.svc._take_message(o.topic, o.payload, o.retain)
        self.svc._flush()
        self.svc.journal_acks.write()

    def _apply(self, commands: list[tuple[str, bytes]]) -> None:
        """Commands to the simulator's handler, its answers (acks, applied state) back to the service."""
        answers: list[wire.Outgoing] = []
        for topic, payload in commands:
            answers.extend(self.sim.commands.handle(topic, payload))
        answers.extend(self.sim.commands.applied_states())
        self._take(answers)

    def _settled(self) -> bool:
        svc, parked = self.svc, self.clock.parked
        pub = svc.publisher
        if parked is None or self.broker.sent or pub.backlog() or pub._stepping.locked() or not svc._rounds.empty():
            return False
        now = self.clock.now()
        target, wake = parked
        return (now is None or now < target) and not (wake is not None and wake.is_set())

    async def _settle(self) -> None:
        for _ in range(100_000):
            if self.broker.sent:
                sent, self.broker.sent = self.broker.sent, []
                if self.later and self.phase == "telemetry":
                    self.held += sent
                else:
                    self._apply(sent)
            elif self._settled():
                break
            await asyncio.sleep(0.0005)
        else:  # pragma: no cover - a hang is a failure, not a wait
            raise AssertionError(f"the service did not settle at t={self.plant.time_s}")
        svc = self.svc
        while svc.decisions > len(self.decisions):
            assert svc.last_decision is not None and svc.decisions == len(self.decisions) + 1
            self.decisions.append((svc.last_decision, self.phase))

    async def start(self) -> None:
        """The jobs of t = 0, the first round, then the service's tasks (it decides on that round)."""
        self._take([o for ev in self.plant.drain_events() if (o := self.sim.telemetry.job_event(ev, START))])
        self._take(self.sim.telemetry.readings(self.plant.readings(), self.sim.site_time_s))
        svc = self.svc
        self.tasks = [
            asyncio.create_task(svc.estimation.run()),
            asyncio.create_task(svc.publisher.run()),
            asyncio.create_task(svc.control.run()),
        ]
        self.phase = "telemetry"
        await self._settle()

    async def telemetry(self) -> None:
        self.phase = "telemetry"
        self._take(self.sim.telemetry.readings(self.plant.readings(), self.sim.site_time_s))
        await self._settle()

    def step(self) -> None:
        self.plant.step(1.0)
        held, self.held = self.held, []
        if held:
            self._apply(held)

    async def events(self) -> None:
        self.phase = "events"
        self._take([o for ev in self.plant.drain_events() if (o := self.sim.telemetry.job_event(ev, START))])
        await self._settle()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.svc.control._executor.shutdown(wait=True)
        self.svc.journal.close()


# ---- lockstep ----------------------------------------------------------------------------------------
_STATE = ("level", "effective_level", "low_power", "failed", "host_off", "rack_pump_speed_frac")


@dataclasses.dataclass
class _Run:
    evaluate: _InProcess
    service: _ServicePath
    #: per second where the plants' true settings differed: what differed ({name: card/host/rack indices})
    truth_diffs: dict[float, dict[str, list[int]]]
    #: per second: the largest difference of a card's true power (W) and die temperature (K), and the cards
    gaps: dict[float, tuple[float, float, list[int]]]
    coverage: dict[str, int]


def _truth_diff(a: Truth, b: Truth) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name in _STATE:
        x, y = getattr(a, name), getattr(b, name)
        if not np.array_equal(x, y):
            out[name] = np.flatnonzero(x != y).tolist()
    if a.supply_setpoint_c != b.supply_setpoint_c:
        out["supply_setpoint_c"] = [0]
    return out


def _count_changes(cov: dict[str, int], before: Truth, after: Truth) -> None:
    cov["hosts_off"] += int((~before.host_off & after.host_off).sum())
    cov["hosts_on"] += int((before.host_off & ~after.host_off).sum())
    cov["slept"] += int((~before.low_power & after.low_power).sum())
    cov["woken"] += int((before.low_power & ~after.low_power).sum())
    cov["levels"] += int((before.level != after.level).sum())
    cov["pumps"] += int((before.rack_pump_speed_frac != after.rack_pump_speed_frac).sum())
    cov["setpoints"] += int(before.supply_setpoint_c != after.supply_setpoint_c)


async def _lockstep_async(
    sc: RunScenario, seconds: int, journal: Path, later: bool, control: ControlConfig | None = None
) -> _Run:
    control = control if control is not None else ControlConfig()
    a = _InProcess(sc, control)
    b = _ServicePath(sc, control, journal, later=later)
    diffs: dict[float, dict[str, list[int]]] = {}
    gaps: dict[float, tuple[float, float, list[int]]] = {}
    cov = dict.fromkeys(("hosts_off", "hosts_on", "slept", "woken", "levels", "pumps", "setpoints"), 0)
    try:
        await b.start()
        before = a.plant.truth()
        for t in range(seconds):
            if t:
                await b.telemetry()
            a.second()
            b.step()
            assert a.plant.time_s == b.plant.time_s == t + 1
            after = a.plant.truth()
            other = b.plant.truth()
            d = _truth_diff(after, other)
            if d:
                diffs[after.time_s] = d
            power_w = np.abs(after.card_power_w - other.card_power_w)
            die_k = np.abs(after.die_temp_c - other.die_temp_c)
            if power_w.max() > 0 or die_k.max() > 0:
                gaps[after.time_s] = (
                    float(power_w.max()),
                    float(die_k.max()),
                    np.flatnonzero(power_w + die_k).tolist(),
                )
            _count_changes(cov, before, after)
            before = after
            await b.events()
    finally:
        await b.close()
    return _Run(a, b, diffs, gaps, cov)


def _lockstep(
    sc: RunScenario, seconds: int, journal: Path, *, later: bool = False, control: ControlConfig | None = None
) -> _Run:
    return asyncio.run(_lockstep_async(sc, seconds, journal, later, control))


def _decision_diff(a: Decision, b: Decision) -> dict[str, Any]:
    """What differs between two decisions (by field; card indices where arrays of cards differ)."""
    out: dict[str, Any] = {}
    for name in ("status", "source", "plan_status", "failsafe_racks"):
        if getattr(a, name) != getattr(b, name):
            out[name] = (getattr(a, name), getattr(b, name))
    for name in ("card_level", "card_power_limit_w", "card_low_power", "card_failed", "card_busy"):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        if not np.array_equal(x, y):
            out[name] = np.flatnonzero(x != y).tolist()
    for name in ("host_off", "rack_pump_speed_frac"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y)):
            out[name] = (x, y)
    if a.supply_temp_c != b.supply_temp_c:
        out["supply_temp_c"] = (a.supply_temp_c, b.supply_temp_c)
    pa = [(p.job_id, tuple(p.cards)) for p in a.placements]
    pb = [(p.job_id, tuple(p.cards)) for p in b.placements]
    if pa != pb:
        out["placements"] = (pa, pb)
    return out


def _times(run: _Run) -> tuple[list[float], list[float]]:
    """Decision times of both paths (site seconds from t = 0); the service's last, made on the events
    of the second the run ended at, has no in-process counterpart yet."""
    end = run.evaluate.plant.time_s
    ta = [d.time_s for d in run.evaluate.decisions]
    tb = [d.time_s - START for d, _phase in run.service.decisions if d.time_s - START < end]
    return ta, tb


def _accounting_close(a: Plant, b: Plant, rel: float) -> None:
    x, y = a.accounting(), b.accounting()
    for name in ("facility_energy_j", "it_energy_j", "cooling_energy_j", "work_card_s"):
        assert getattr(y, name) == pytest.approx(getattr(x, name), rel=rel), name
    assert (y.jobs_finished, y.jobs_running, y.jobs_queued) == (x.jobs_finished, x.jobs_running, x.jobs_queued)
    assert y.rack_over_limit_s == x.rack_over_limit_s
    assert y.max_die_temp_c == pytest.approx(x.max_die_temp_c, abs=0.5)


def _levels_of(run: _Run) -> npt.NDArray[np.int64]:
    return np.asarray(run.service.plant.truth().level)


def test_the_service_decides_and_acts_as_the_evaluation_measures(tmp_path: Path) -> None:
    """Fifteen site minutes of the mixed scenario, commands applied in the same second: the same
    decisions at the same times and the same plants, except what the card failure at 150 s explains."""
    run = _lockstep(_mixed(), 900, tmp_path / "journal.sqlite")
    ev, svc = run.evaluate, run.service
    ta, tb = _times(run)
    assert ta == tb
    # what happened in the fifteen minutes (as the evaluation's plant had it)
    assert min(run.coverage.values()) > 0, run.coverage
    states = {r.job_id: r.state for r in ev.plant.job_records()}
    assert states == {r.job_id: r.state for r in svc.plant.job_records()}
    assert states["run-b"] == states["late-d"] == "finished" and states["late-f"] == "running"
    assert sum(len(d.placements) for d in ev.decisions) >= 3
    assert any(d.failsafe_racks for d in ev.decisions)  # the stuck card, r2 silent
    # decisions: alike but for one, the periodic decision at 150 s. The service made it on run-a's
    # event (waiting: its card 3 failed in that step), which the simulator sends before the round of
    # that second; the in-process loop had that round and knew card 3 dead (failed, not busy, asleep)
    differ = {}
    for da, (db, phase) in zip(ev.decisions, svc.decisions, strict=False):
        d = _decision_diff(da, db)
        if d:
            differ[da.time_s] = (d, phase)
    assert differ == {150.0: ({"card_low_power": [3], "card_failed": [3], "card_busy": [3]}, "events")}
    # ... so the service's level command for r0's idle cards 0-7 (card 3 among them) was refused whole
    # (the rack refuses a command to a failed card), the only refusal; the next decision, 15 s later,
    # sent the seven others their level again
    counts = svc.sim.commands.counts
    assert (counts.rejected, counts.expired, counts.rejection_reasons) == (1, 0, {"rack.set_dvfs_level": 1})
    assert counts.applied > 100
    seven = [0, 1, 2, 4, 5, 6, 7]
    assert sorted(run.truth_diffs) == [151.0 + i for i in range(15)]
    assert all(d == {"level": seven, "effective_level": seven} for d in run.truth_diffs.values())
    # their power and die temperatures, as they cool to the same (their dies' heat capacity)
    assert min(run.gaps) == 152.0 and all(set(cards) <= set(seven) for _w, _k, cards in run.gaps.values())
    assert max(k for t_s, (_w, k, _c) in run.gaps.items() if t_s > 200.0) < 0.05
    assert max((k for t_s, (_w, k, _c) in run.gaps.items() if t_s > 600.0), default=0.0) < 1e-9
    # energy: 16 s of seven idle cards at another level; work, jobs and limits: the same
    _accounting_close(ev.plant, svc.plant, rel=2e-4)
    assert np.array_equal(_levels_of(run), ev.plant.truth().level)


def test_at_full_load_the_service_and_the_evaluation_are_the_same(tmp_path: Path) -> None:
    """Every rack held by compute-bound jobs (the cap binds: levels and limits chosen closely), a card
    failing: every decision and every second of the plants alike, through the wire's resolution."""
    sc = full_load_scenario(900.0, racks=3, seed=9, faults=[{"kind": "card_failure", "card": 20, "at_s": 100.0}])
    run = _lockstep(sc, 600, tmp_path / "journal.sqlite")
    ta, tb = _times(run)
    assert ta == tb and len(ta) >= 40
    for da, (db, _phase) in zip(run.evaluate.decisions, run.service.decisions, strict=False):
        assert _decision_diff(da, db) == {}, da.time_s
    assert run.truth_diffs == {}
    assert run.service.sim.commands.counts.rejected == 0
    _accounting_close(run.evaluate.plant, run.service.plant, rel=1e-12)
    assert run.coverage["levels"] > 0


def test_the_service_wakes_for_a_checkpoints_end_when_the_evaluation_does(tmp_path: Path) -> None:
    """``checkpoint_end_lead_s`` with a period longer than the checkpoints: the decisions that give the
    jobs their clock back come from the wait for each checkpoint's end (no event and no period falls
    there). The service's control task wakes at the same site seconds as the in-process loop and
    decides alike; the plants stay the same."""
    sc = full_load_scenario(600.0, racks=2, seed=9)
    jobs = tuple(
        dataclasses.replace(
            j,
            checkpoint_interval_s=120.0,
            checkpoint_duration_s=30.0 + 5.0 * i,
            first_checkpoint_after_s=20.0 + 7.0 * i,
        )
        for i, j in enumerate(sc.jobs)
    )
    sc = dataclasses.replace(sc, jobs=jobs)
    control = ControlConfig(period_s=60.0, checkpoint_end_lead_s=3.0)
    run = _lockstep(sc, 420, tmp_path / "journal.sqlite", control=control)
    ta, tb = _times(run)
    assert ta == tb
    for da, (db, _phase) in zip(run.evaluate.decisions, run.service.decisions, strict=False):
        assert _decision_diff(da, db) == {}, da.time_s
    off_period = [t for t in ta if t % 60.0]
    assert len(off_period) >= 8, ta  # the wakes (3 s before an end) and the resumes' decisions
    assert run.truth_diffs == {}
    _accounting_close(run.evaluate.plant, run.service.plant, rel=1e-12)


def test_as_the_simulator_paces_commands_land_a_second_later_and_cost_little(tmp_path: Path) -> None:
    """The commands of decisions on a telemetry round applied after the simulator's next step (as it
    paces): the same decisions at the same times until the lag has shifted a job's phases by a second,
    the plants a second apart after each decision meanwhile, the same placements, and the evaluation's
    energy and work to a fraction of a percent."""
    run = _lockstep(_mixed(), 900, tmp_path / "journal.sqlite", later=True)
    ev, svc = run.evaluate, run.service
    ta, tb = _times(run)
    assert abs(len(ta) - len(tb)) <= 3
    first_shift = min(set(ta) ^ set(tb), default=math.inf)  # (none at all: the paths never drifted apart)
    assert first_shift > 450.0  # late-e started a second later (its placement landed a second later)
    decided = set(ta)
    for t_s in run.truth_diffs:
        if t_s < first_shift:
            assert t_s - 1.0 in decided or 150.0 < t_s <= 166.0, (t_s, run.truth_diffs[t_s])
    assert [(p.job_id, d.time_s) for d in ev.decisions for p in d.placements] == [
        (p.job_id, d.time_s - START) for d, _phase in svc.decisions for p in d.placements
    ]
    counts = svc.sim.commands.counts
    assert (counts.rejected, counts.expired) == (1, 0)  # card 3's rack command, as above
    x, y = ev.plant.accounting(), svc.plant.accounting()
    assert y.facility_energy_j == pytest.approx(x.facility_energy_j, rel=5e-3)  # measured: -0.12%
    assert y.work_card_s == pytest.approx(x.work_card_s, rel=1e-2)  # measured: -0.30%
    assert y.rack_over_limit_s == x.rack_over_limit_s == 0.0
    assert (y.jobs_finished, y.jobs_submitted) == (x.jobs_finished, x.jobs_submitted)
    assert y.max_die_temp_c == pytest.approx(x.max_die_temp_c, abs=1.0)


def test_a_silent_rack_with_a_dead_card_gets_its_fail_safe_caps_over_the_wire(tmp_path: Path) -> None:
    """r2 silent from 600 s to 890 s and its card 36 failing at 610 s, unseen: the agent puts r2 at
    fail-safe caps once its telemetry is past the deadline (630 s). In process the live cards get them
    (apply_to_plant skips the dead card by the plant's truth). Over the wire the rack refuses the caps
    whole for the dead card (or an earlier command naming it); it used to refuse the caps again every
    ``command_ttl_s`` for the whole silence
    (the book held back a refusal no reading explained, and no reading came), so the rack ran uncapped.
    The refusal now names the dead card (``card_failed``) and the next decision caps the others, their
    limits leaving room for the dead card at the limit it last reported (no command reaches it, and the
    agent cannot tell a dead card from one a stale view calls dead). (The cards of r2's powered-off host
    get no limit over the wire, by design: a rack refuses it.)"""
    sc = _mixed()
    faults: list[Fault] = [f for f in sc.faults if not isinstance(f, SensorDropout)]
    faults += [SensorDropout(rack=2, start_s=600.0, end_s=890.0), CardFailure(card=36, at_s=610.0)]
    run = _lockstep(dataclasses.replace(sc, faults=tuple(faults)), 720, tmp_path / "journal.sqlite")
    capped = [d for d in run.evaluate.decisions if 2 in d.failsafe_racks and d.time_s >= 630.0]
    assert capped  # the agent decided fail-safe caps for r2 (in process; the service's plant is checked below)
    plant = run.evaluate.plant
    live = np.setdiff1d(np.arange(32, 48), [36])
    live = live[~plant.host_off()[plant.site.card_host()[live]]]  # (on hosts that are on)
    assert live.size >= 8
    in_process = plant._limit[live]  # (the plant's power limits in force; no reading from r2)
    assert np.all(in_process < plant.site.card.power_limit_w)  # capped in process
    # ... and over the wire: no command reaches the dead card, which reads (stale) at the 700 W limit it
    # last reported, so the fail-safe limits of the others leave room for it (agent.guard, step 3a)
    dead_w = float(run.service.svc.state.snapshot().card_power_limit_w[36])
    assert dead_w == plant.site.card.power_limit_w
    over_wire = run.service.plant._limit[live]
    assert np.ptp(over_wire) == 0.0 and np.all(over_wire < in_process)
    assert 15 * over_wire[0] + dead_w <= 16 * (in_process[0] + 1.0)  # the rack's limits within its cap
    # the first command that names the dead card is refused (card_failed) once, and none again: the caps of
    # 630 s (or, since each rack keeps the plan's awake idle cards, a wake or level command sent to r2 just
    # before) found it; it used to be the caps, refused again every command_ttl_s for the whole silence
    refused = run.service.sim.commands.counts.rejection_reasons
    assert refused and set(refused.values()) == {1}, refused


def test_a_round_followed_by_a_job_event_in_one_burst_reaches_the_estimator(tmp_path: Path) -> None:
    """The simulator publishes a round, steps and publishes the step's job events at once: a burst the
    service's ingest task reads in one go. The ingest folds the round into the belief before the
    event, and that round must reach the estimator too, as every round does in process (it was
    dropped: the estimator of the service missed every round a job event followed in one burst)."""
    b = _ServicePath(_mixed(), ControlConfig(), tmp_path / "journal.sqlite", later=False)
    plant, enc, svc = b.plant, b.sim.telemetry, b.svc
    try:
        events = plant.drain_events()  # the jobs running at t = 0: submitted, started
        assert events
        burst = enc.readings(plant.readings(), START)
        burst += [o for ev in events if (o := enc.job_event(ev, START))]
        plant.step(1.0)
        burst += enc.readings(plant.readings(), START + 1.0)
        b._take(burst)
        assert svc.state.snapshot().jobs  # the events are in the belief
        items = [svc._rounds.get_nowait() for _ in range(svc._rounds.qsize())]
        rounds = [r for r in items if isinstance(r, Readings)]
        assert len(rounds) == len(items)  # (no step back of the clock to tell the estimator of)
        # round 0 is whole (round 1 came after it); round 1 waits for a later one (agent.ingest.RoundMerger)
        assert [(r.time_s, len(r.racks)) for r in rounds] == [(START, plant.site.n_racks)]
    finally:
        svc.control._executor.shutdown(wait=True)
        svc.journal.close()


def test_on_the_example_site_the_wire_resolution_moves_ties_only(tmp_path: Path) -> None:
    """Ten minutes of examples/day-fault-card-failure.toml (512 cards, every rack held, card 70 failing
    at 300 s), commands in the same second: the telemetry's resolution on the wire (0.01 W, 0.01 deg C,
    0.01 %) tips near-ties of the MILP (at 45 s twelve cards of r7 get another level; with the values
    sent unrounded those go, checked by hand), and a job's phase may move a second; the plants end
    alike to a few hundredths of a percent, with the same seconds over a rack limit."""
    sc = load_run_scenario(EXAMPLES / "day-fault-card-failure.toml", duration_s=601.0)
    run = _lockstep(sc, 600, tmp_path / "journal.sqlite")
    ta, tb = _times(run)
    assert len(ta) == len(tb) >= 40 and all(abs(x - y) <= 1.0 for x, y in zip(ta, tb, strict=True))
    counts = run.service.sim.commands.counts
    assert (counts.rejected, counts.expired) == (0, 0) and counts.applied > 100
    _accounting_close(run.evaluate.plant, run.service.plant, rel=1e-3)
