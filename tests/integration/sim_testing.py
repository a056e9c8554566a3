"""Helpers for the simulator's integration tests: a small site, scenarios, a running simulator and
an observer on the bus that decodes what the simulator publishes."""

from __future__ import annotations

import asyncio
import tomllib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqtt_helpers import WAIT_S

from agent import wire
from agent.broker import EmbeddedBroker
from agent.bus import Bus
from sim.runner import SimOptions, Simulator
from twin.readings import Readings
from twin.scenario import RunScenario, run_scenario_from_dict
from twin.spec import SiteSpec, site_from_dict

REPO = Path(__file__).resolve().parents[2]
SITE_ID = "site1"
#: the site clock at t = 0 in these tests (a fixed epoch time, so expiries can be written down)
START_EPOCH_S = 1_800_000_000.0


def small_site() -> SiteSpec:
    """Two racks of 16 cards (torus 4x4x2), otherwise the example hardware."""
    d = tomllib.loads((REPO / "examples" / "supernode-512.toml").read_text(encoding="utf-8"))
    d["name"] = "small-32"
    d["torus_dims"] = [4, 4, 2]
    d["racks_per_supernode"] = 2
    return site_from_dict(d, source="small-32")


def scenario(**top: Any) -> RunScenario:
    """A run scenario on :func:`small_site` from top-level TOML keys (defaults: 60 s, no workload)."""
    data: dict[str, Any] = {"name": "test", "duration_s": 60.0, "seed": 5, "workload": {"source": "none"}}
    data.update(top)
    return run_scenario_from_dict(data, source="test", site=small_site())


def job(job_id: str, n_cards: int, **kw: Any) -> dict[str, Any]:
    """A ``[[jobs]]`` table."""
    return {"id": job_id, "n_cards": n_cards, "duration_s": 36000.0, "compute_share": 0.9, **kw}


@dataclass
class Observer:
    """A client on the agent's topics that decodes everything it receives."""

    bus: Bus
    codec: wire.Codec
    received: list[Any] = field(default_factory=list)

    def of(self, cls: type[Any]) -> list[Any]:
        return [m for m in self.received if isinstance(m, cls)]

    async def wait_for(self, what: Callable[[Any], bool], timeout_s: float = WAIT_S, label: str = "") -> Any:
        """The first message (received before or after the call) for which ``what`` holds."""
        async with asyncio.timeout(timeout_s):
            i = 0
            while True:
                while i < len(self.received):
                    m = self.received[i]
                    i += 1
                    if what(m):
                        return m
                await asyncio.sleep(0.005)
        raise AssertionError(label)  # pragma: no cover

    async def ack_of(self, command_id: uuid.UUID) -> wire.Acknowledgement:
        ack: wire.Acknowledgement = await self.wait_for(
            lambda m: isinstance(m, wire.Acknowledgement) and m.command_id == command_id, label=f"ack {command_id}"
        )
        return ack

    async def send(self, msg: wire.Message) -> None:
        await self.bus.send(self.codec.outgoing(msg))

    async def publish_raw(self, topic: str, payload: bytes) -> None:
        await self.bus.publish(topic, payload, qos=1)


@asynccontextmanager
async def observer(broker: EmbeddedBroker, site: SiteSpec) -> AsyncIterator[Observer]:
    layout = wire.SiteLayout(SITE_ID, tuple(site.rack_names), site.cards_per_rack, site.card.n_levels)
    codec = wire.Codec(layout)
    obs: Observer | None = None

    def handle(m: Any) -> None:
        assert obs is not None
        obs.received.append(codec.decode(m.topic, m.payload))

    bus = Bus(broker.options(), subscriptions=codec.topics.agent_filters(), on_message=handle, name="observer")
    obs = Observer(bus, codec)
    async with bus:
        await bus.wait_connected(WAIT_S)
        yield obs


@asynccontextmanager
async def running(
    broker: EmbeddedBroker, sc: RunScenario, *, capture: bool = False, **options: Any
) -> AsyncIterator[tuple[Simulator, dict[float, Readings]]]:
    """A simulator running ``sc`` in a task (stopped at the end); ``capture``: record every reading
    it takes, by plant time."""
    kw: dict[str, Any] = {"site_id": SITE_ID, "speed": 20.0, "start_epoch_s": START_EPOCH_S}
    kw.update(options)
    sim = Simulator(SimOptions(scenario=sc, mqtt=broker.options(), **kw))
    captured: dict[float, Readings] = {}
    if capture:
        plant = sim.plant
        original = plant.readings

        def spy() -> Readings:
            r = original()
            captured[round(r.time_s, 6)] = r
            return r

        plant.readings = spy  # type: ignore[method-assign]  # test double
    task = asyncio.create_task(sim.run())
    try:
        yield sim, captured
    finally:
        sim.stop()
        async with asyncio.timeout(WAIT_S):
            await task


def command_times(obs: Observer) -> tuple[float, float]:
    """(issue ts, expiry) for a command now: the latest telemetry time stamp and 60 s later."""
    ts = max(m.ts_s for m in obs.received if isinstance(m, wire.FacilityReading))
    return ts, ts + 60.0
