"""sim.truth: each column of the ground-truth log holds the quantity its name and docs/sim.md say, for
the right rack, in the right unit, without a broker (the simulator's run through MQTT is in
tests/integration/test_sim.py::test_truth_log_and_summary).

What users rely on: ``racktwin sim --truth-log`` is how a controller run over MQTT is judged; a column
written from the wrong field or rack, or in the wrong unit, skews every figure taken from it."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path
from typing import TypedDict, Unpack

import pytest

from sim.truth import TruthLog, truth_columns
from twin.faults import Ambient, Fault
from twin.plant import CardFailure, CardVariation, ConstantAmbient, Plant, PlantConfig, PumpDegradation, SensorNoise
from twin.spec import SiteSpec, site_from_dict
from twin.workload import JobSpec, PhaseModel

pytestmark = pytest.mark.unit

EXAMPLE_SITE = Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml"
EPOCH_S = 1_800_000_000.0
RACK_LIMIT_W = 15_000.0


def capped_small_site() -> SiteSpec:
    """Two racks of 16 cards with the example hardware and a 15 kW rack limit: a rack of 16 busy cards
    at the top clock (16 x ~665 W + 8.8 kW of hosts) is over it, a rack of idle ones (16 x ~85 W +
    8.8 kW) under it."""
    d = tomllib.loads(EXAMPLE_SITE.read_text(encoding="utf-8"))
    d["name"] = "small-32-capped"
    d["torus_dims"] = [4, 4, 2]
    d["racks_per_supernode"] = 2
    d["rack"]["power_limit_w"] = RACK_LIMIT_W
    return site_from_dict(d, source="small-32-capped")


def job(job_id: str, n_cards: int, work_steps: float = 1e9) -> JobSpec:
    return JobSpec(
        job_id,
        n_cards,
        work_steps=work_steps,
        step_time_s=1.0,
        compute_share=1.0,
        checkpoint_interval_s=1e9,
        noncompute_utilization=0.0,
    )


class PlantFields(TypedDict, total=False):
    """The ``PlantConfig`` fields a test here sets besides ``exact``'s."""

    ambient: Ambient | None


def exact(**kw: Unpack[PlantFields]) -> PlantConfig:
    quiet = PhaseModel(startup_s=0.0, restart_delay_s=5.0, comm_stalls_per_hour=0.0, input_stalls_per_hour=0.0)
    return PlantConfig(variation=CardVariation.none(), noise=SensorNoise.none(), phases=quiet, **kw)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def test_each_column_holds_its_quantity_for_its_rack(tmp_path: Path) -> None:
    """One row of a state whose every count is known: 2 jobs running (16 and 4 cards) and one queued
    (32 cards: it cannot fit), card 20 failed, cards 24..27 asleep, card 0 braked by the smallest
    power limit (its protection runs it below the commanded clock), rack r1's pump at half flow, the
    supply set-point just moved (the delivered supply lags it), a 21.5 deg C day, rack r0 over the
    15 kW limit and r1 under it, the link down."""
    site = capped_small_site()
    jobs = [job("a", 16), job("c", 4), job("b", 32)]
    faults: list[Fault] = [CardFailure(card=20, at_s=0.0), PumpDegradation(rack=1, start_s=0.0, flow_fraction=0.5)]
    p = Plant(site, jobs, faults, config=exact(ambient=ConstantAmbient(21.5)))
    p.step(1.0)  # the jobs are placed
    assert p.job_cards("a").tolist() == list(range(16)) and p.job_cards("c").tolist() == [16, 17, 18, 19]
    p.enter_low_power([24, 25, 26, 27])
    p.set_power_limits([0], p.config.min_power_limit_w)
    p.run(29.0, 1.0)
    p.set_supply_temp(p.truth().supply_setpoint_c + 5.0)
    p.step(1.0)
    log = TruthLog(tmp_path / "truth.csv", site)
    log.write(p, EPOCH_S + p.time_s, max_rack_power_w=12_345.5, connected=False)
    log.close()
    rows = read_rows(tmp_path / "truth.csv")
    assert list(rows[0]) == truth_columns(site) and len(rows) == 1
    row = rows[0]
    tr, acc = p.truth(), p.accounting()
    assert row["time_s"] == "31.000000" and row["ts_s"] == f"{EPOCH_S + 31.0:.6f}"
    # counts
    assert (row["jobs_running"], row["jobs_queued"], row["jobs_finished"]) == ("2", "1", "0")
    assert (row["failed_cards"], row["low_power_cards"], row["throttled_cards"]) == ("1", "4", "1")
    assert row["racks_over_limit"] == "1" and row["connected"] == "0"
    # the caller's maximum, as given (not the rack power now)
    assert row["max_rack_power_w"] == "12345.5"
    # per rack: each rack's own values
    nominal_lpm = site.loop_flow_per_rack_lpm()
    assert float(row["r0_flow_lpm"]) == pytest.approx(nominal_lpm, rel=1e-6)
    assert float(row["r1_flow_lpm"]) == pytest.approx(0.5 * nominal_lpm, rel=1e-6)
    r0_w, r1_w = float(row["r0_power_w"]), float(row["r1_power_w"])
    assert r0_w > RACK_LIMIT_W > r1_w
    assert float(row["it_power_w"]) == pytest.approx(r0_w + r1_w, rel=1e-6)
    for r in range(2):
        assert float(row[f"r{r}_power_w"]) == pytest.approx(float(tr.rack_power_w[r]), rel=1e-6)
        rack_dies = tr.die_temp_c[r * 16 : (r + 1) * 16]
        assert float(row[f"r{r}_max_die_temp_c"]) == pytest.approx(float(rack_dies.max()), rel=1e-6)
        assert float(row[f"r{r}_return_temp_c"]) == pytest.approx(float(tr.rack_return_temp_c[r]), rel=1e-6)
    assert float(row["r0_max_die_temp_c"]) > float(row["r0_return_temp_c"])  # a die, not the water
    assert float(row["max_die_temp_c"]) == pytest.approx(float(tr.die_temp_c.max()), rel=1e-6)
    # temperatures: the supply delivered lags the set-point just raised by 5 K; outdoor air as set
    setpoint, supply = float(row["supply_setpoint_c"]), float(row["supply_temp_c"])
    assert setpoint - 5.0 < supply < setpoint
    assert float(row["ambient_c"]) == pytest.approx(21.5)
    assert float(row["facility_supply_temp_c"]) == pytest.approx(tr.cooling.facility_supply_temp_c, rel=1e-6)
    # powers: cooling is pumps + fans + chiller; facility = IT + cooling + UPS and other losses; PUE the ratio
    cp = tr.cooling
    assert float(row["cooling_power_w"]) == pytest.approx(
        cp.rack_pump_w + cp.facility_pump_w + cp.dry_cooler_fan_w + cp.chiller_w, rel=1e-6
    )
    assert float(row["chiller_power_w"]) == pytest.approx(cp.chiller_w, rel=1e-6, abs=1e-6)
    facility = float(row["facility_power_w"])
    assert facility == pytest.approx(
        float(row["it_power_w"]) + float(row["cooling_power_w"]) + cp.ups_loss_w + cp.other_overhead_w, rel=1e-6
    )
    assert float(row["pue"]) == pytest.approx(facility / float(row["it_power_w"]), rel=1e-6)
    # energies in kWh (3.6e6 J each)
    assert float(row["it_energy_kwh"]) == pytest.approx(acc.it_energy_j / 3.6e6, rel=1e-6)
    assert float(row["cooling_energy_kwh"]) == pytest.approx(acc.cooling_energy_j / 3.6e6, rel=1e-6)
    assert float(row["facility_energy_kwh"]) == pytest.approx(acc.facility_energy_j / 3.6e6, rel=1e-6)
    # rack r0 has been over its limit since its jobs were placed at the end of the first step (30 s)
    # and no job has missed its SLO
    assert float(row["rack_over_limit_s"]) == pytest.approx(30.0)
    assert float(row["slo_violation_s"]) == 0.0


def test_cumulative_columns_and_the_throughput_of_each_period(tmp_path: Path) -> None:
    """Rows at 0, 10, 40 and 45 s: throughput is the work kept over each period divided by its length
    (0 in the first row), lost work is what a failure rolled back (job c's 4 cards x 19 s, kept apart
    from the work kept), a job that finished counts once, a row taken while connected says 1."""
    site = capped_small_site()
    jobs = [job("a", 16), job("c", 4), job("short", 2, work_steps=30.0)]
    p = Plant(site, jobs, [CardFailure(card=16, at_s=20.0)], config=exact())
    path = tmp_path / "truth.csv"
    log = TruthLog(path, site)
    works: list[float] = []
    lost: list[float] = []
    for t in (0.0, 10.0, 40.0, 45.0):
        if t > p.time_s:
            p.run(t - p.time_s, 1.0)
        log.write(p, EPOCH_S + t, max_rack_power_w=0.0, connected=True)
        works.append(p.accounting().work_card_s)
        lost.append(p.accounting().lost_work_card_s)
    log.close()
    rows = read_rows(path)
    assert [r["time_s"] for r in rows] == ["0.000000", "10.000000", "40.000000", "45.000000"]
    assert all(r["connected"] == "1" for r in rows)
    # the jobs are placed as the first step ends: 22 cards at full pace for 9 s of the first 10
    assert float(rows[1]["work_card_s"]) == pytest.approx(22 * 9.0, rel=1e-6)
    assert float(rows[0]["throughput_card"]) == 0.0
    assert float(rows[1]["throughput_card"]) == pytest.approx(22 * 9.0 / 10.0, rel=1e-6)
    expect = [(works[2] - works[1]) / 30.0, (works[3] - works[2]) / 5.0]
    assert [float(rows[2]["throughput_card"]), float(rows[3]["throughput_card"])] == pytest.approx(expect, rel=1e-5)
    # job c lost the 19 s of work of its 4 cards (1..20 s) when card 16 failed at 20 s (no checkpoint)
    assert float(rows[1]["lost_work_card_s"]) == 0.0
    assert float(rows[2]["lost_work_card_s"]) == pytest.approx(4 * 19.0, rel=1e-6)
    assert float(rows[3]["work_card_s"]) == pytest.approx(works[3], rel=1e-6) and works[3] != lost[3]
    # the 2-card job of 30 steps (1..31 s) finished: counted from then on, and no longer running
    assert [r["jobs_finished"] for r in rows] == ["0", "0", "1", "1"]
    assert rows[1]["jobs_running"] == "3" and rows[2]["jobs_running"] == "2"
