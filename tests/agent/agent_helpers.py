"""Helpers for the agent tests: sites, jobs, plants and beliefs (plain functions, no fixtures)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twin.plant import Fault, Plant, PlantConfig
from twin.spec import SiteSpec, load_site, site_from_dict
from twin.state import TwinState
from twin.tables import read_toml
from twin.workload import JobSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE_FILE = EXAMPLES / "supernode-512.toml"


def example_site() -> SiteSpec:
    """The 512-card example site (8 racks of 64 cards, 50 kW per rack)."""
    return load_site(SITE_FILE)


def small_site(racks: int = 2, xy: tuple[int, int] = (4, 4)) -> SiteSpec:
    """The example hardware scaled down: ``racks`` racks of ``x*y`` cards; host overhead and rack limit
    scaled with the cards, so that the cap binds at full load as in the example site."""
    data: dict[str, Any] = read_toml(SITE_FILE)
    cpr = xy[0] * xy[1]
    data["torus_dims"] = [xy[0], xy[1], racks]
    data["racks_per_supernode"] = racks
    data["name"] = f"small-{racks}x{cpr}"
    data["rack"] = {"host_overhead_w": 8800.0 * cpr / 64, "power_limit_w": 50000.0 * cpr / 64}
    return site_from_dict(data, source="small_site")


def job(
    job_id: str,
    n_cards: int,
    *,
    share: float = 0.95,
    priority: float = 1.0,
    work_steps: float = 1e7,
    checkpoint_interval_s: float = 900.0,
    checkpoint_duration_s: float = 60.0,
    submit_s: float = 0.0,
) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        n_cards=n_cards,
        work_steps=work_steps,
        step_time_s=1.0,
        compute_share=share,
        priority=priority,
        submit_time_s=submit_s,
        checkpoint_interval_s=checkpoint_interval_s,
        checkpoint_duration_s=checkpoint_duration_s,
    )


def full_load_jobs(site: SiteSpec, size: int = 32) -> list[JobSpec]:
    """Compute-bound jobs filling every card, priorities 1 / 1.5 / 2 in turn, shares 0.90-0.97."""
    n = site.n_cards // size
    return [job(f"j{i}", size, share=0.90 + 0.07 * i / max(n - 1, 1), priority=1.0 + 0.5 * (i % 3)) for i in range(n)]


def belief(
    site: SiteSpec, jobs: Sequence[JobSpec], seconds: float, faults: Sequence[Fault] = (), seed: int = 1
) -> tuple[Plant, TwinState]:
    """A plant run for ``seconds`` (1 s steps, its own scheduler) and the belief fed from it."""
    plant = Plant(site, list(jobs), list(faults), PlantConfig(seed=seed))
    state = TwinState(site, stuck_after_readings=20)
    t = 0.0
    while t < seconds:
        plant.step(1.0)
        t += 1.0
        state.update(plant.readings())
        state.apply_events(plant.drain_events())
    return plant, state


def true_violations(
    seen: Sequence[tuple[float, float, Any]], limit_w: Any, from_s: float
) -> tuple[float, float, int, float, float]:
    """The rack-limit violations of a run worked out by hand from its true steps (``(t0, dt, truth)``,
    ``truth.rack_power_w`` per rack), from ``from_s`` on: rack-seconds over, kW x s over, episodes,
    the longest episode (s) and the largest rack power seen (W): the oracle of the evaluation's metrics."""
    rack_s, kws, episodes, longest, window_max = 0.0, 0.0, 0, 0.0, 0.0
    for r in range(len(limit_w)):
        run = 0.0
        for t0, dt, tr in seen:
            if t0 < from_s:
                continue
            p = float(tr.rack_power_w[r])
            window_max = max(window_max, p)
            if p > limit_w[r]:
                episodes += run == 0.0
                run += dt
                rack_s += dt
                kws += (p - limit_w[r]) * dt / 1e3
                longest = max(longest, run)
            else:
                run = 0.0
    return rack_s, kws, episodes, longest, window_max
