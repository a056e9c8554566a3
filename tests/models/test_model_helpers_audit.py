"""Mutation audit of the small model helpers: explain, decompose, from_state, synthetic.

Each test derives its expectation by hand from the module's docstring or docs/models.md (small
tables, a few racks) and kills a mutant the other model tests let live (named in the test).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypedDict, Unpack, cast

import numpy as np
import numpy.typing as npt
import pytest
from models_helpers import job, problem, rack_cards

from models.decompose import it_price_per_wh, restrict_tables, split_chunks
from models.explain import explain_infeasible, min_rack_power_w, reserve_capacity
from models.from_state import job_spec_of, problem_from_snapshot
from models.heuristic import GreedyDvfs, greedy_dvfs
from models.problem import (
    CycleProblem,
    DvfsTables,
    FacilityLine,
    Prices,
    dvfs_tables,
    facility_line,
    it_power_range_w,
    make_problem,
)
from models.synthetic import acme_workload, pack_jobs, synthetic_workload
from twin.readings import FacilityReading
from twin.spec import SiteSpec
from twin.state import JobInfo, StateSnapshot, TwinState
from twin.thermal import ThermalParams
from twin.workload import JobSpec, Phase, generate_jobs

pytestmark = pytest.mark.models


# ---------------------------------------------------------------- explain


class TableFields(TypedDict, total=False):
    """The ``DvfsTables`` fields a test here gives ``_tables``."""

    n_racks: int
    cheapest_level: np.ndarray
    pair_job: np.ndarray
    pair_rack: np.ndarray
    pair_cards: np.ndarray
    pair_power_w: np.ndarray
    rack_base_w: np.ndarray
    rack_idle: np.ndarray
    rack_wake_w: np.ndarray
    rack_cap_w: np.ndarray
    reserve: np.ndarray


def _tables(**kw: Unpack[TableFields]) -> DvfsTables:
    """Hand-made tables: 3 levels, 4 racks; fields not given are empty or zero."""
    empty = np.zeros((0, 3))
    base = DvfsTables(
        supply_c=30.0, n_levels=3, n_racks=4, job_power_w=empty, job_die_max_c=empty, job_value=empty,
        job_throughput=empty, allowed=np.zeros((0, 3), bool), die_ok=np.zeros((0, 3), bool),
        slo_ok=np.zeros((0, 3), bool), fixed=np.zeros(0, bool), cheapest_level=np.zeros(0, np.int64),
        pair_job=np.zeros(0, np.int64), pair_rack=np.zeros(0, np.int64), pair_cards=np.zeros(0, np.int64),
        pair_power_w=empty, rack_base_w=np.zeros(4), rack_idle=np.zeros(4, np.int64), rack_wake_w=np.zeros(4),
        rack_cap_w=np.zeros(4), rack_awake_now=np.zeros(4, np.int64), rack_supernode=np.zeros(4, np.int64),
        reserve=np.zeros(1, np.int64), card_level_power_w=empty,
        card_level_die_c=empty, idle_awake_level=0,
    )  # fmt: skip
    return dataclasses.replace(base, **kw)


def test_explain_min_rack_power_adds_each_jobs_cheapest_level_to_its_own_racks() -> None:
    # job 0 spans racks 0 and 2, its cheapest level is 0 (an SLO of the top clock); job 1 in rack 1 at level 2;
    # job 2 has no allowed level and adds nothing. Racks: base 100/200/300/400 W; r0 100 + 1000, r1 200 + 8,
    # r2 300 + 50, r3 400. (mutants: level 0 taken
    # for "no level", job index used as rack index, base power left out)
    pw = np.array([[1000.0, 800.0, 600.0], [50.0, 40.0, 30.0], [10.0, 9.0, 8.0], [7.0, 6.0, 5.0]])
    t = _tables(
        cheapest_level=np.array([0, 2, -1]),
        pair_job=np.array([0, 0, 1, 2]),
        pair_rack=np.array([0, 2, 1, 3]),
        pair_cards=np.array([4, 4, 2, 1]),
        pair_power_w=pw,
        rack_base_w=np.array([100.0, 200.0, 300.0, 400.0]),
    )
    assert min_rack_power_w(t).tolist() == [1100.0, 208.0, 350.0, 400.0]


def test_explain_reserve_capacity_is_whole_cards_within_headroom_and_at_most_the_idle_ones() -> None:
    # headroom 350 W / 100 W a card = 3 cards; none; none (over the cap); a free wake-up (0 W) wakes every
    # idle card; 1000 W of headroom but only 2 idle cards -> 2. (mutants: ceil, no cap at the idle count,
    # no card woken when waking costs nothing)
    t = _tables(
        n_racks=5,
        rack_cap_w=np.full(5, 1000.0),
        rack_wake_w=np.array([100.0, 100.0, 100.0, 0.0, 100.0]),
        rack_idle=np.array([5, 5, 5, 3, 2]),
        rack_base_w=np.zeros(5),
    )
    cap = reserve_capacity(t, np.array([650.0, 1000.0, 1200.0, 1000.0, 0.0]))
    assert cap.tolist() == [3, 0, 0, 3, 2]


def test_explain_a_rack_over_its_cap_but_under_its_limit_is_explained(site: SiteSpec) -> None:
    # the margin counts: a rack at least power 500 W under its limit but 500 W over limit - margin (1 kW)
    # is infeasible (mutant: compared against the limit itself -> "feasible", nothing explained)
    p0 = problem(site, [job("a", 64)], [rack_cards(3)], options=[30.0])
    t0 = dvfs_tables(p0)
    least_w = float(t0.rack_base_w[3] + t0.job_power_w[0].min())
    limits = np.full(8, 50_000.0)
    limits[3] = least_w + 500.0
    p = problem(site, [job("a", 64)], [rack_cards(3)], limit_w=limits, options=[30.0])
    why = explain_infeasible(p, dvfs_tables(p))
    assert why.startswith("rack power: rack r3: 64 busy cards")
    cap_kw, limit_kw = (least_w - 500.0) / 1e3, (least_w + 500.0) / 1e3
    assert why.endswith(f"> {cap_kw:.1f} kW (limit {limit_kw:.1f} kW - margin 1.0 kW; the site's limit is 50.0 kW)")


def test_explain_names_only_the_slo_jobs_of_a_rack_their_floor_and_what_it_could_drop_to(site: SiteSpec) -> None:
    # r4: job b (no SLO, 32 cards) and job a (SLO 0.93 -> level <= 1, 32 cards). At the SLO floors the rack
    # draws base + a@1 + b@least; without them base + a@least + b@least; the cap lies between. One reason,
    # naming a only, with both numbers and the cap (mutants: a second "rack power" line, the first job
    # named, the floor figure printed as what it could drop to, the limit printed for the cap)
    jobs = [job("b", 32), job("a", 32, share=0.95, slo=0.93)]
    cards = [rack_cards(4, 32), rack_cards(4, 32, start=32)]
    t0 = dvfs_tables(problem(site, jobs, cards, options=[30.0]))
    base = float(t0.rack_base_w[4])
    floor_w = base + t0.job_power_w[1, 1] + t0.job_power_w[0].min()
    free_w = base + t0.job_power_w[1].min() + t0.job_power_w[0].min()
    cap_w = (floor_w + free_w) / 2.0
    limits = np.full(8, 50_000.0)
    limits[4] = cap_w + 1000.0
    p = problem(site, jobs, cards, limit_w=limits, options=[30.0])
    why = explain_infeasible(p, dvfs_tables(p))
    assert why == (
        f"SLO: rack r4: the SLOs of job(s) a keep it at {floor_w / 1e3:.1f} kW > {cap_w / 1e3:.1f} kW "
        f"(limit - margin); without the SLO floors it could drop to {free_w / 1e3:.1f} kW"
    )


def test_explain_a_die_limit_names_the_hottest_card_at_the_slowest_level(site: SiteSpec) -> None:
    # the reported temperature is the job's hottest card at the lowest clock (level 7, 1210 MHz), the
    # lowest a job can go, above the limit (mutant: the top level's temperature)
    p = problem(site, [job("hot", 8)], [rack_cards(0, 8)], die_margin_k=60.0, options=[30.0])
    t = dvfs_tables(p)
    why = explain_infeasible(p, t)
    m = re.search(r"hottest card reaches ([0-9.]+) deg C even at the lowest level \(1210 MHz\)", why)
    assert m is not None
    assert float(m.group(1)) == pytest.approx(float(t.job_die_max_c[0].min()), abs=0.05)


def test_explain_counts_the_off_hosts_of_the_rack_it_names(site: SiteSpec) -> None:
    # r3: a 32-card job on its hosts 0-3, hosts 4-7 off; every host of r1 off as well. r3 is over a 5 kW
    # limit at any level: its line says 4 of its hosts are off, not r1's (mutant: hosts counted
    # across racks)
    off = np.zeros(site.n_hosts, dtype=bool)
    off[3 * 8 + 4 : 3 * 8 + 8] = True
    off[8:16] = True
    limits = np.full(8, 50_000.0)
    limits[3] = 5_000.0
    p = make_problem(
        site, jobs=[job("a", 32)], job_cards=[rack_cards(3, 32)], rack_limit_w=limits, supply_temp_c=30.0,
        ambient_c=25.0, supply_options_c=[30.0], ready_reserve_cards=0, host_off=off,
    )  # fmt: skip
    why = explain_infeasible(p, dvfs_tables(p))
    assert why.startswith("rack power: rack r3: 32 busy cards")
    assert "with 4 of its hosts off" in why


def test_explain_a_short_reserve_names_what_a_further_card_needs_in_the_racks_it_could_go_to(site: SiteSpec) -> None:
    # no jobs; caps 1 kW; at the lowest levels (no busy card: the base) the racks have 0/350/1000/150 W of
    # headroom, 4/5/1/2 idle cards waking at 500/100/900/120 W each: room for 0 + 3 + 1 + 1 = 5 < 8.
    # The racks whose headroom ran out with idle cards left are r1 (50 W left < 100 W) and r3 (30 W left
    # < 120 W): a further card needs up to 120 W there. r0 (no headroom) and r2 (its one idle card awake)
    # say nothing about it (before: 900 W, r2's, printed as what each awake card adds, the max over all racks)
    t = _tables(
        rack_cap_w=np.full(4, 1000.0),
        rack_base_w=np.array([1000.0, 650.0, 0.0, 850.0]),
        rack_idle=np.array([4, 5, 1, 2]),
        rack_wake_w=np.array([500.0, 100.0, 900.0, 120.0]),
        reserve=np.array([8]),
    )
    p = problem(site, [], [], options=[30.0])  # its clocks and rack names; the tables above are the data
    assert explain_infeasible(p, t) == (
        "ready reserve: 8 awake idle cards are required but the racks' headroom at the lowest levels leaves room "
        "for only 5 (each further awake card adds up to 120.0 W in the racks with idle cards and headroom left)"
    )
    # no headroom where idle cards are left (r1 and r3 at their caps): no figure, the reason in words
    t2 = dataclasses.replace(t, rack_base_w=np.array([1000.0, 1000.0, 0.0, 1000.0]), reserve=np.array([3]))
    assert explain_infeasible(p, t2).endswith("leaves room for only 1 (no rack with idle cards left has headroom)")


# ---------------------------------------------------------------- decompose


def _two_supernode_problem(site: SiteSpec, reserve: int = 12) -> tuple[CycleProblem, DvfsTables, GreedyDvfs]:
    """Two supernodes (16 racks): a 128-card job on r1-r2, 32-card jobs on r5 and r9, a 64-card job on r12.
    Rack limits differ (40 kW + 100 W x rack) so that a rack's numbers tell which rack they are."""
    big = site.with_supernodes(2)
    jobs = [job("two", 128), job("s5", 32), job("s9", 32), job("r12", 64)]
    cards = [list(range(64, 192)), rack_cards(5, 32), rack_cards(9, 32), rack_cards(12)]
    # float64 (numpy's stubs type a float times an int64 array as floating[Any])
    limits = cast(npt.NDArray[np.float64], 40_000.0 + 100.0 * np.arange(16))
    p = make_problem(
        big, jobs=jobs, job_cards=[np.asarray(c) for c in cards], rack_limit_w=limits, supply_temp_c=30.0,
        ambient_c=25.0, supply_options_c=[30.0], ready_reserve_cards=reserve,
    )  # fmt: skip
    t = dvfs_tables(p)
    g = greedy_dvfs(p, t, facility_line(big, 30.0, 25.0, *it_power_range_w(p, t)))
    return p, t, g


def test_decompose_a_job_on_two_racks_keeps_them_in_one_part_however_small_the_chunks(site: SiteSpec) -> None:
    # chunks of one rack (64 cards): every component alone, in rack order; r1 and r2 share job "two", so
    # they stay together (mutants: no union of a job's racks, pairs compared across jobs)
    _p, t, g = _two_supernode_problem(site)
    chunks = split_chunks(t, g, 64, 64)
    assert [c.racks.tolist() for c in chunks] == [[0], [1, 2]] + [[r] for r in range(3, 16)]
    assert [c.jobs.tolist() for c in chunks if c.jobs.size] == [[0], [1], [2], [3]]


def test_decompose_packs_512_cards_per_chunk_in_rack_order(site: SiteSpec) -> None:
    # 512-card chunks of 64-card racks: 8 racks each, r0-r7 then r8-r15, with the jobs of their racks
    # (mutants: a chunk closed one rack early, reversed order, jobs assigned by a wrong rack)
    _p, t, g = _two_supernode_problem(site)
    chunks = split_chunks(t, g, 512, 64)
    assert [c.racks.tolist() for c in chunks] == [list(range(8)), list(range(8, 16))]
    assert [c.jobs.tolist() for c in chunks] == [[0, 1], [2, 3]]


def test_decompose_a_chunk_carries_its_own_racks_numbers_and_its_share_of_the_reserve(site: SiteSpec) -> None:
    # Each chunk's rack r is global rack racks[r]: its cap (limit - 1 kW margin), idle cards (64 less
    # those of its jobs), base and wake power; its job i is jobs[i] with that job's pairs renumbered;
    # its reserve is, per supernode, what the greedy plan woke in its racks, and the parts add up to each
    # supernode's.
    p, t, g = _two_supernode_problem(site)
    limits = 40_000.0 + 100.0 * np.arange(16)
    busy = np.zeros(16, dtype=np.int64)
    busy[[1, 2, 12]] = 64
    busy[[5, 9]] = 32
    chunks = split_chunks(t, g, 512, 64)
    for c in chunks:
        ct = c.tables
        assert ct.n_racks == c.racks.size
        assert ct.rack_cap_w.tolist() == (limits[c.racks] - 1000.0).tolist()
        assert ct.rack_idle.tolist() == (64 - busy[c.racks]).tolist()
        assert ct.rack_base_w.tolist() == t.rack_base_w[c.racks].tolist()
        assert ct.rack_wake_w.tolist() == t.rack_wake_w[c.racks].tolist()
        sn = p.site.rack_supernode()[c.racks]
        assert ct.reserve.tolist() == np.bincount(sn, weights=g.rack_awake[c.racks], minlength=2).tolist()
        for i, j in enumerate(c.jobs.tolist()):
            mine = ct.pair_job == i
            racks = sorted(c.racks[ct.pair_rack[mine]].tolist())
            assert racks == sorted({r // 64 for r in p.job_cards(j).tolist()})
            assert int(ct.pair_cards[mine].sum()) == p.jobs[j].n_cards
            assert ct.job_power_w[i].tolist() == t.job_power_w[j].tolist()
    assert np.sum([c.tables.reserve for c in chunks], axis=0).tolist() == [12, 12]  # each supernode's, in its racks


def test_decompose_refuses_a_part_that_cuts_a_job(site: SiteSpec) -> None:
    # job "two" spans r1 and r2: a part with r1 only would check r1's cap without the job's r2 cards
    _p, t, _g = _two_supernode_problem(site)
    with pytest.raises(ValueError, match="spans a rack outside"):
        restrict_tables(t, np.array([0]), np.array([1]), np.zeros(2, np.int64))


@pytest.mark.parametrize(
    ("a_w", "b", "price"),
    [
        (10_000.0, 1.2, 0.2e-3 * 1.2 + 50e-3 * (1.2 - 1.08)),  # 130 kW > 108 kW: over the target
        (1_000.0, 1.05, 0.2e-3 * 1.05),  # 106 kW < 108 kW: under the target, energy only
        (5_000.0, 1.05, 0.2e-3 * 1.05 + 50e-3 * (1.05 - 1.08)),  # 110 kW > 108 kW through the fixed part
    ],
)
def test_decompose_prices_an_it_watt_at_the_greedy_plans_marginal_rate(
    site: SiteSpec, a_w: float, b: float, price: float
) -> None:
    # 100 kW of IT at PUE target 1.08: facility = a + b x IT; one IT W for an hour costs energy x b, plus
    # the penalty x (b - target) while the facility is above the target (units: per kWh -> per Wh)
    assert site.pue_target == 1.08
    p = problem(
        site, [job("a", 8)], [rack_cards(0, 8)], prices=Prices(energy_price_per_kwh=0.2, pue_penalty_per_kwh=50.0)
    )
    line = FacilityLine(supply_temp_c=30.0, a_w=a_w, b=b, it_lo_w=0.0, it_hi_w=2e5, max_error_w=0.0)
    assert it_price_per_wh(p, line, 100_000.0) == pytest.approx(price, rel=1e-12)


# ---------------------------------------------------------------- from_state


class SnapshotFields(TypedDict, total=False):
    """The ``StateSnapshot`` fields a test here sets on an empty site's snapshot."""

    card_level: np.ndarray
    card_die_temp_c: np.ndarray
    card_failed: np.ndarray
    card_job: np.ndarray
    facility: FacilityReading | None
    jobs: tuple[JobInfo, ...]
    queue: tuple[JobInfo, ...]


def _snapshot(site: SiteSpec, **kw: Unpack[SnapshotFields]) -> StateSnapshot:
    return dataclasses.replace(TwinState(site).snapshot(), **kw)


def _info(job_id: str, n: int, phase: Phase = Phase.COMPUTE, spec: JobSpec | None = None, **kw: float) -> JobInfo:
    fields: dict[str, float] = dict(
        priority=1.0, min_throughput_frac=0.0, compute_share=0.9, noncompute_utilization=0.3
    )
    fields.update(kw)
    return JobInfo(
        job_id=job_id, state="running", phase=phase, n_cards=n, cards=(), step_time_s=1.0, submit_time_s=0.0,
        progress_frac=0.0, throughput_frac=1.0, last_event_s=0.0, spec=spec, **fields,
    )  # fmt: skip


def test_snapshot_a_failed_card_leaves_its_job_and_a_job_with_none_left_leaves_the_problem(site: SiteSpec) -> None:
    # a (spec of 8 cards) on cards 0-7, card 3 failed: a keeps 7 cards and is a 7-card job; b on 64-65, both
    # failed: gone; c on 70-71 keeps its phase (CHECKPOINT) at index 1 (mutants: the failed card kept in
    # its job, the size not overridden, the phase of another job, the failed cards not passed on)
    card_job = np.full(site.n_cards, -1, dtype=np.int64)
    card_job[0:8] = 0
    card_job[64:66] = 1
    card_job[70:72] = 2
    failed = np.zeros(site.n_cards, dtype=bool)
    failed[[3, 64, 65]] = True
    jobs = (_info("a", 8, spec=job("a", 8)), _info("b", 2), _info("c", 2, Phase.CHECKPOINT))
    p = problem_from_snapshot(site, _snapshot(site, card_job=card_job, card_failed=failed, jobs=jobs))
    assert [jb.job_id for jb in p.jobs] == ["a", "c"]
    assert [jb.n_cards for jb in p.jobs] == [7, 2]
    assert p.job_cards(0).tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert p.job_cards(1).tolist() == [70, 71]
    assert list(p.job_phase) == [Phase.COMPUTE, Phase.CHECKPOINT]
    assert np.flatnonzero(p.failed).tolist() == [3, 64, 65]


def test_snapshot_ambient_and_set_point_come_from_the_facility_reading_unless_given(site: SiteSpec) -> None:
    # the set-point in force (supply_setpoint_c 33), not the facility loop's supply (20); explicit
    # arguments win; without a facility reading the site's supply temperature
    fac = FacilityReading(
        time_s=0.0, ambient_temp_c=12.0, facility_supply_temp_c=20.0, facility_return_temp_c=26.0,
        cooling_power_w=1e4, it_power_w=1e5, facility_power_w=1.1e5, supply_setpoint_c=33.0,
    )  # fmt: skip
    snap = _snapshot(site, facility=fac)
    p = problem_from_snapshot(site, snap)
    assert (p.ambient_c, p.supply_temp_c) == (12.0, 33.0)
    q = problem_from_snapshot(site, snap, ambient_c=5.0, supply_temp_c=31.0)
    assert (q.ambient_c, q.supply_temp_c) == (5.0, 31.0)
    r = problem_from_snapshot(site, _snapshot(site, facility=None))
    assert r.supply_temp_c == site.facility.supply_temp_c


def test_snapshot_never_seen_dies_read_the_supply_and_levels_are_clamped(site: SiteSpec) -> None:
    # a busy card never seen (NaN die) gets the supply temperature; a level 99 / -3 from a confused belief is
    # clamped to 7 / 0 instead of refusing the problem (mutants: 0 deg C, clamped to 8)
    card_job = np.full(site.n_cards, -1, dtype=np.int64)
    card_job[0:8] = 0
    die = np.full(site.n_cards, 40.0)
    die[2] = np.nan
    level = np.zeros(site.n_cards, dtype=np.int64)
    level[0], level[1] = 99, -3
    snap = _snapshot(site, card_job=card_job, card_die_temp_c=die, card_level=level, jobs=(_info("a", 8),))
    p = problem_from_snapshot(site, snap, supply_temp_c=32.0)
    assert p.die_temp_c[2] == 32.0 and p.die_temp_c[0] == 40.0


def test_snapshot_jobs_without_a_spec_keep_the_beliefs_fields_and_the_queue_and_thermal_pass_on(
    site: SiteSpec,
) -> None:
    # priority, SLO and compute share come from the belief (mutants: defaults or the wrong field); a
    # known spec is used as it is; queued jobs and the calibrated thermal parameters reach the problem
    info = _info("x", 4, priority=3.0, min_throughput_frac=0.8, compute_share=0.7, noncompute_utilization=0.2)
    spec = job_spec_of(info)
    assert (spec.priority, spec.min_throughput_frac, spec.compute_share, spec.noncompute_utilization) == (
        3.0,
        0.8,
        0.7,
        0.2,
    )
    given = dataclasses.replace(job("x", 4), priority=5.0)
    assert job_spec_of(_info("x", 4, spec=given)) == given
    assert job_spec_of(_info("x", 4, spec=given), 3).n_cards == 3
    card_job = np.full(site.n_cards, -1, dtype=np.int64)
    card_job[0:4] = 0
    thermal = ThermalParams.from_site(site)
    thermal = dataclasses.replace(thermal, r_die_case_k_per_w=thermal.r_die_case_k_per_w * 1.1)
    snap = _snapshot(site, card_job=card_job, jobs=(info,), queue=(_info("q", 16),))
    p = problem_from_snapshot(site, snap, thermal=thermal)
    assert [q.job_id for q in p.queue] == ["q"]
    assert p.r_total_k_per_w.tolist() == pytest.approx(thermal.r_total_k_per_w.tolist())
    assert p.jobs[0].priority == 3.0 and p.jobs[0].min_throughput_frac == 0.8


# ---------------------------------------------------------------- synthetic


def test_synthetic_packing_is_largest_first_first_fit_aligned_within_a_supernode(site: SiteSpec) -> None:
    # 512 cards a supernode, 64 a rack. [32, 48]: the 48 first (0-47, unaligned size), then the 32 aligned to
    # 32 -> 64-95, not 48-79 across a rack boundary. [448, 64]: the 64 fits only in the last rack (448-511).
    # [8, 512]: the 512 first fills the supernode and the 8 does not fit. A supernode-sized job fits.
    def spans(out: list[np.ndarray | None]) -> list[tuple[int, int] | None]:
        return [None if c is None else (int(c[0]), int(c[-1])) for c in out]

    assert spans(pack_jobs(site, [32, 48])) == [(64, 95), (0, 47)]
    assert spans(pack_jobs(site, [448, 64])) == [(0, 447), (448, 511)]
    assert spans(pack_jobs(site, [8, 512])) == [None, (0, 511)]
    assert spans(pack_jobs(site, [64, 64])) == [(0, 63), (64, 127)]
    assert spans(pack_jobs(site, [513])) == [None]


def test_synthetic_workload_reaches_its_allocation_and_honours_its_ranges(site: SiteSpec) -> None:
    # 8-card jobs at allocation 0.5 of 512 cards: exactly 32 jobs, 256 cards; a 512-card size is allowed
    wl = synthetic_workload(site, seed=1, allocation=0.5, sizes=(8,))
    assert len(wl.jobs) == 32 and sum(len(c) for c in wl.job_cards) == 256
    one = synthetic_workload(site, seed=1, allocation=1.0, sizes=(512,))
    assert [j.n_cards for j in one.jobs] == [512]
    wl = synthetic_workload(
        site, seed=2, allocation=0.5, sizes=(8,), compute_share=(0.5, 0.6), noncompute_utilization=0.15,
        phase_weights=(0.0, 1.0, 0.0, 0.0), slo_fraction=1.0, slo_min_throughput=0.7, queue_jobs=3,
    )  # fmt: skip
    assert all(0.5 <= j.compute_share <= 0.6 and j.noncompute_utilization == 0.15 for j in wl.jobs)
    assert set(wl.job_phase) == {Phase.COMMUNICATION}
    assert {j.min_throughput_frac for j in wl.jobs} == {0.7}
    assert {j.priority for j in wl.jobs} == {1.0, 2.0}
    none = synthetic_workload(site, seed=2, allocation=0.5, sizes=(8,), slo_fraction=0.0)
    assert {j.min_throughput_frac for j in none.jobs} == {0.0}
    ids = [j.job_id for j in wl.jobs + wl.queue]
    assert len(set(ids)) == len(ids) == 35  # queued ids never repeat a running job's
    with pytest.raises(ValueError, match="allocation"):
        synthetic_workload(site, allocation=1.2)


def test_synthetic_seeds_give_their_own_instances(site: SiteSpec) -> None:
    def key(seed: int) -> list[tuple[str, int, float]]:
        wl = synthetic_workload(site, seed=seed)
        return [(j.job_id, j.n_cards, j.compute_share) for j in wl.jobs]

    assert key(5) == key(5)
    assert key(5) != key(6)


def test_acme_workload_runs_the_streams_prefix_up_to_the_allocation_and_queues_the_next_jobs(site: SiteSpec) -> None:
    # allocation chosen so that the first k generated jobs hold exactly the target: all k run (mutant: the
    # last one left out by a strict bound), and the queue is the jobs right after them
    stream = generate_jobs(site.n_cards, 30 * 24 * 3600.0, 0)
    sums = np.cumsum([j.n_cards for j in stream])
    k = int(np.flatnonzero(sums <= 0.65 * site.n_cards)[-1]) + 1
    wl = acme_workload(site, seed=0, allocation=float(sums[k - 1]) / site.n_cards, queue_jobs=2)
    assert [j.job_id for j in wl.jobs] == [j.job_id for j in stream[:k]]
    assert [j.job_id for j in wl.queue] == [j.job_id for j in stream[k : k + 2]]
