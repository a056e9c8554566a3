"""Small run scenarios for the evaluation tests (plain functions, no fixtures)."""

from __future__ import annotations

from typing import Any

from agent_helpers import small_site

from twin.scenario import RunScenario, run_scenario_from_dict


def full_load_scenario(duration_s: float = 600.0, racks: int = 2, seed: int = 5, **extra: Any) -> RunScenario:
    """A small site (``racks`` racks of 16 cards) held by compute-bound jobs: at the top clock every
    rack is over its limit (as on the example site), so a controller must act."""
    site = small_site(racks)
    jobs = [
        {
            "id": f"train-{i}",
            "n_cards": 8,
            "duration_s": 1e6,
            "step_time_s": 1.0 + 0.5 * (i % 3),
            "compute_share": 0.97,
            "noncompute_utilization": 0.9,
            "priority": 1.0 + (i % 2),
            "running_at_start": True,
        }
        for i in range(site.n_cards // 8)
    ]
    data: dict[str, Any] = {
        "name": "test-full-load",
        "duration_s": duration_s,
        "seed": seed,
        "workload": {"source": "none"},
        "ambient": {"kind": "constant", "temp_c": 25.0},
        "jobs": jobs,
        **extra,
    }
    return run_scenario_from_dict(data, source="test-full-load", site=site)


def mixed_scenario(duration_s: float = 600.0, seed: int = 2) -> RunScenario:
    """A small site with a generated workload (jobs arriving, idle cards, checkpoints)."""
    site = small_site(2)
    data: dict[str, Any] = {
        "name": "test-mixed",
        "duration_s": duration_s,
        "seed": seed,
        "workload": {"source": "generate", "target_allocation": 0.6, "max_cards": 16},
        "ambient": {"kind": "diurnal", "mean_c": 22.0},
    }
    return run_scenario_from_dict(data, source="test-mixed", site=site)
