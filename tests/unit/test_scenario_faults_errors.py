"""twin.scenario_faults: overlapping broker disconnects are refused naming the field to change, like
every other problem of a ``[[faults]]`` table (docs/sim.md, "Fault catalogue": disconnects may not
overlap; back to back ones are one outage): ``faults[i].start_s`` of the disconnect that starts
before another one (``faults[j]``) ends, in the file's own numbering whatever its order."""

from __future__ import annotations

from typing import Any

import pytest

from twin.scenario import run_scenario_from_dict
from twin.spec import SiteSpec
from twin.tables import SpecError

pytestmark = pytest.mark.unit


def refused(site: SiteSpec, faults: list[dict[str, Any]]) -> str:
    data = {"name": "overlap", "duration_s": 600.0, "workload": {"source": "none"}, "faults": faults}
    with pytest.raises(SpecError) as info:
        run_scenario_from_dict(data, source="day.toml", site=site)
    return str(info.value)


def disconnect(start_s: float, duration_s: float) -> dict[str, Any]:
    return {"kind": "broker_disconnect", "start_s": start_s, "duration_s": duration_s}


def test_the_disconnect_that_starts_inside_another_is_named_by_its_start_s(site: SiteSpec) -> None:
    # faults[1] (30 s) starts inside faults[0] (10..70 s)
    msg = refused(site, [disconnect(10.0, 60.0), disconnect(30.0, 5.0)])
    assert msg.startswith("day.toml: faults[1].start_s: "), msg
    assert "30 s" in msg and "faults[0]" in msg and "10 s" in msg and "70 s" in msg and "overlap" in msg, msg


def test_the_file_order_numbers_the_fields_not_the_time_order(site: SiteSpec) -> None:
    # listed later first: faults[0] (19.5 s) starts before faults[2] (10..20 s) ends; faults[1] is a plant fault
    heat = {"kind": "heat_wave", "start_s": 0.0, "peak_delta_k": 2.0}
    msg = refused(site, [disconnect(19.5, 10.0), heat, disconnect(10.0, 10.0)])
    assert msg.startswith("day.toml: faults[0].start_s: "), msg
    assert "19.5 s" in msg and "faults[2]" in msg and "20 s" in msg, msg


def test_back_to_back_disconnects_are_not_an_overlap(site: SiteSpec) -> None:
    data = {
        "name": "touching",
        "duration_s": 600.0,
        "workload": {"source": "none"},
        "faults": [disconnect(20.0, 10.0), disconnect(10.0, 10.0)],
    }
    sc = run_scenario_from_dict(data, source="day.toml", site=site)
    assert [(f.start_s, f.end_s) for f in sc.sim_faults] == [(10.0, 20.0), (20.0, 30.0)]
