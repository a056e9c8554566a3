"""``racktwin optimize`` where a hand mutation pass over agent/commands/optimize*.py (2026-12-04)
left a mutant alive: the exit status of an infeasible plan, the prices (energy against the PUE
penalty), generated jobs dropped for want of cards listed as unplaced, the pumps slowed only when
``choose_pump_speed`` says so, and failed cards judged in low-power idle. Expected values come from
docs/models.md and the example site (examples/supernode-512.toml), not from a run.

Real HiGHS on the 512-card example site; the ``models`` layer, as tests/agent/test_optimize_cmd_audit.py.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.cli import main

pytestmark = pytest.mark.models

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE = (EXAMPLES / "supernode-512.toml").as_posix()
# the example site: 8 racks of 64 cards, clocks from 1980 MHz (level 0) down to 1210 MHz
TOP_MHZ, SLOWEST_MHZ = 1980, 1210


def _optimize(scenario: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = main(["optimize", str(scenario), "--out", str(out), *extra])
    return rc, so.getvalue(), se.getvalue()


def _plan(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "plan.json").read_text())
    return doc


def _scenario(path: Path, body: str, solver: str = "choose_setpoint = false\n", top: str = "") -> Path:
    path.write_text(
        f'name = "{path.stem}"\nsite = "{SITE}"\nambient_c = 22.0\nsupply_temp_c = 30.0\nready_reserve_cards = 0\n'
        f"{top}[solver]\n{solver}{body}"
    )
    return path


def test_an_infeasible_plan_exits_1_with_its_files_and_the_explanation_on_stderr(tmp_path: Path) -> None:
    """docs/models.md and ``--help``: exit status 1 when no plan meets the limits (the files are still
    written, why on stderr, even with --quiet). A rack margin of 45 kW leaves r0 a cap of 5 kW, below its hosts'
    8.8 kW alone: no plan can keep it."""
    path = _scenario(
        tmp_path / "cap.toml",
        '[margins]\nrack_margin_w = 45000.0\n[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n',
    )
    rc, stdout, stderr = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 1, stderr
    assert any(line.startswith("racktwin optimize: infeasible: ") for line in stderr.splitlines()), stderr
    for name in ("plan.json", "racks.csv", "report.html"):
        assert (tmp_path / "o" / name).stat().st_size > 0
    plan = _plan(tmp_path / "o")
    assert plan["status"] == "infeasible" and plan["explanation"]
    assert stdout.startswith("cap: infeasible, ")  # the closing line still reports the fallback plan judged


def _clocks(plan: dict[str, Any]) -> list[int]:
    return [int(j["clock_mhz"]) for j in plan["jobs"]]


def test_a_dear_energy_price_slows_every_job_and_a_dear_pue_penalty_alone_does_not(tmp_path: Path) -> None:
    """The objective (docs/models.md): value of the work less energy_price x facility energy less
    pue_penalty x facility energy above pue_target x IT. One compute job of 64 cards, a card-hour
    worth 2.0, the set-point fixed at 30 deg C:

    * energy at 1,000 per kWh, no PUE penalty: a card at the top clock draws several hundred W, so
      every MHz costs far more than the work it buys: the job runs at the slowest clock (1210 MHz);
    * the same prices swapped (energy free, the PUE penalty 1,000 per kWh): energy itself costs
      nothing, only facility power above 1.08 x IT does. At this light load the pumps and the heat
      rejection are there whatever the clocks, so each extra W of IT adds less than 1.08 W of facility
      power: a faster clock lowers that excess, and the work gains too: the top clock.

    A swap of the two prices turns each run into the other's."""
    job = '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\ncompute_share = 0.9\n'
    dear_energy = _scenario(
        tmp_path / "energy.toml",
        "[prices]\ncard_hour_value = 2.0\nenergy_price_per_kwh = 1000.0\npue_penalty_per_kwh = 0.0\n" + job,
    )
    dear_pue = _scenario(
        tmp_path / "pue.toml",
        "[prices]\ncard_hour_value = 2.0\nenergy_price_per_kwh = 0.0\npue_penalty_per_kwh = 1000.0\n" + job,
    )
    rc, out, err = _optimize(dear_energy, tmp_path / "e", "--quiet", "--json")
    assert rc == 0, err
    assert _clocks(_plan(tmp_path / "e")) == [SLOWEST_MHZ]
    summary = json.loads(out)  # --json: the plan's throughput against the baseline's (64 cards at the top clock)
    assert summary["baseline_throughput"] == 64.0 and summary["throughput"] < 64.0 * 0.9
    rc, _, err = _optimize(dear_pue, tmp_path / "p", "--quiet")
    assert rc == 0, err
    assert _clocks(_plan(tmp_path / "p")) == [TOP_MHZ]


def test_a_generated_job_dropped_for_want_of_cards_is_listed_unplaced(tmp_path: Path) -> None:
    """docs/models.md ([generate]): a generated job whose supernode has too few free cards is
    dropped, with a warning on stderr and under ``unplaced`` in plan.json. A listed job on cards
    16..511 leaves the one supernode 16 free cards, so the generator's jobs beyond its first 16
    cards (it packs them from card 0 up, 30% of 512 cards in jobs of 16 and 32) cannot all fit."""
    listed = list(range(16, 512))
    path = _scenario(
        tmp_path / "gen.toml",
        f"[generate]\nseed = 0\nallocation = 0.3\nsizes = [16, 32]\nphase_weights = [1.0, 0.0, 0.0, 0.0]\n"
        f'slo_fraction = 0.0\npriorities = [1.0]\n[[jobs]]\nid = "big"\nn_cards = {len(listed)}\ncards = {listed}\n',
    )
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    warned = [line for line in err.splitlines() if "generated job dropped" in line]
    assert warned, err
    plan = _plan(tmp_path / "o")
    dropped = {k for k, v in plan["unplaced"].items() if v.startswith("generated job dropped")}
    assert len(dropped) == len(warned)
    assert all(any(f": {job_id}: " in line for line in warned) for job_id in dropped)
    assert not dropped & {j["id"] for j in plan["jobs"]}


@pytest.mark.parametrize("choose", [True, False])
def test_pumps_slow_down_only_when_choose_pump_speed_is_set(tmp_path: Path, choose: bool) -> None:
    """[solver] choose_pump_speed: each rack loop's pump at the slowest speed the plan allows, or
    every one at full speed when false. One job on r0: r1-r7 run no job (their cards idle, far below
    any die limit), so their pumps can slow below full speed; the judged pump power is then below
    the baseline's (every pump at full speed)."""
    path = _scenario(
        tmp_path / "pumps.toml",
        '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n',
        solver=f"choose_setpoint = false\nchoose_pump_speed = {str(choose).lower()}\n",
    )
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    plan = _plan(tmp_path / "o")
    speeds = plan["pump_speed_frac"]
    if choose:
        assert all(s < 1.0 for s in speeds[1:]), speeds
        assert plan["pump_power_w"] < plan["baseline"]["pump_power_w"]
    else:
        assert speeds == [1.0] * 8
        assert plan["pump_power_w"] == pytest.approx(plan["baseline"]["pump_power_w"], rel=1e-9)


def test_the_plans_judged_count_failed_cards_in_low_power_idle() -> None:
    """Failed cards run nothing and are commanded to low-power idle (models.problem); the judge takes
    the plan's low-power cards as they are (an ``| p.failed`` there changed nothing and is gone), so
    the optimal plan and the greedy one must both list every failed card among them, on a host that
    stays on and on one with no job."""
    from agent.commands.optimize_judge import judge
    from agent.commands.optimize_scenario import SolverSection
    from models.problem import make_problem
    from models.solve import greedy_cycle, plan_cycle
    from twin.spec import load_site
    from twin.workload import JobSpec, Phase

    site = load_site(SITE)
    failed = np.zeros(site.n_cards, dtype=bool)
    failed[[7, 100, 300]] = True
    p = make_problem(
        site,
        jobs=[JobSpec("a", 7, work_steps=1e5, step_time_s=1.0, compute_share=0.9)],
        job_cards=[np.arange(7)],
        job_phase=[Phase.COMPUTE],
        failed=failed,
        supply_temp_c=30.0,
        ambient_c=22.0,
        ready_reserve_cards=8,
    )
    solver = SolverSection(choose_pump_speed=False)
    for plan in (plan_cycle(p, time_limit_s=10.0, choose_setpoint=False), greedy_cycle(p, choose_setpoint=False)):
        assert plan.dvfs is not None
        assert plan.dvfs.card_low_power[failed].all()
        judged = judge(p, plan.dvfs, plan.supply_temp_c, solver)
        # low-power idle on the example card: 52.8 W at 42 deg C, 0.4 W/K (racks.csv docs); active idle ~80 W
        assert (judged["card_power_w"][failed] < 65.0).all(), judged["card_power_w"][failed]


def test_pump_speeds_come_from_pump_speed_steps(tmp_path: Path) -> None:
    """[solver] pump_speed_steps: the speeds tried, from full down to the site's lowest. With 2 steps
    a rack loop's pump runs at full speed or at the lowest, nothing between, also at full load
    (examples/scenario-full-load.toml, where the 9 default steps give a loaded rack a speed between)."""
    text = (EXAMPLES / "scenario-full-load.toml").read_text()
    assert "choose_setpoint = true\n" in text
    text = text.replace("choose_setpoint = true\n", "choose_setpoint = true\npump_speed_steps = 2\n")
    path = tmp_path / "steps.toml"
    path.write_text(text.replace('site = "supernode-512.toml"', f'site = "{SITE}"'))
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    from twin.spec import load_site

    lowest = load_site(SITE).min_pump_speed_frac()
    speeds = _plan(tmp_path / "o")["pump_speed_frac"]
    assert all(s == 1.0 or s == pytest.approx(lowest, abs=1e-9) for s in speeds), (speeds, lowest)


def test_the_host_saving_is_what_the_off_hosts_would_draw_on(tmp_path: Path) -> None:
    """plan.json host_saving_w: the twin's IT power with the hosts off turned on (their cards asleep)
    less with them off: positive, each host at least its own saving (1,000 W on, 50 W off: the example
    site's hosts) and at most that and its 8 cards in low-power idle (52.8 W at 42 deg C, 0.4 W/K,
    under 60 W for a die near a 30 deg C supply)."""
    path = _scenario(tmp_path / "saving.toml", '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n')
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    plan = _plan(tmp_path / "o")
    n_off = len(plan["hosts_off"])
    assert n_off > 0
    assert n_off * 950.0 <= plan["host_saving_w"] <= n_off * (950.0 + 8 * 60.0)


def test_choose_host_power_false_keeps_every_host_on(tmp_path: Path) -> None:
    """[solver] choose_host_power = false: every host on (no card reads host_off), where the same
    scenario with it true powers idle hosts off."""
    body = '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n'
    path = _scenario(tmp_path / "on.toml", body, solver="choose_setpoint = false\nchoose_host_power = false\n")
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    plan = _plan(tmp_path / "o")
    assert plan["hosts_off"] == [] and plan["host_saving_w"] == 0.0
    assert not [c for c in plan["cards"] if c["state"] == "host_off"]


def test_hosts_holding_the_ready_reserve_stay_on_beyond_the_reserve_of_hosts(tmp_path: Path) -> None:
    """docs/models.md choose_host_power: the hosts holding the ready reserve of awake idle cards stay
    on, beyond the reserve of hosts per supernode. r0 full (hosts 0-7 busy), a ready reserve of 16
    and no reserve of hosts: two idle hosts stay on for the 16 awake cards, the other 54 go off and
    their 432 cards read host_off."""
    path = _scenario(
        tmp_path / "reserve.toml",
        '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n',
        solver="choose_setpoint = false\nhost_reserve_per_supernode = 0\n",
    )
    path.write_text(path.read_text().replace("ready_reserve_cards = 0\n", "ready_reserve_cards = 16\n"))
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    plan = _plan(tmp_path / "o")
    states = [c["state"] for c in plan["cards"]]
    assert states.count("awake") == 16
    assert len(plan["hosts_off"]) == 64 - 8 - 2
    off_cards = {h * 8 + k for h in plan["hosts_off"] for k in range(8)}
    assert {i for i, s in enumerate(states) if s == "host_off"} == off_cards
    assert all(states[i] == "awake" for i in range(512) if i not in off_cards and i >= 64)


def test_the_baseline_counts_a_failed_card_in_low_power_idle(tmp_path: Path) -> None:
    """The baseline (no agent): every card at the top clock, idle cards in active idle (84.5 W at
    42 deg C), failed cards in low-power idle (52.8 W): r1, with one failed card and no job, draws
    less than r2 (no job, none failed) by about the difference, 20-45 W."""
    path = _scenario(
        tmp_path / "base.toml", '[[jobs]]\nid = "a"\nn_cards = 8\nracks = [0]\n', top="failed_cards = [100]\n"
    )
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    import csv

    with (tmp_path / "o" / "racks.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    diff = float(rows[2]["baseline_power_w"]) - float(rows[1]["baseline_power_w"])
    assert 20.0 < diff < 45.0, diff


def test_the_closing_line_names_hosts_off_only_where_hosts_can_be_powered_off(tmp_path: Path) -> None:
    """docs/models.md's closing line ends with "N of M hosts off; files in DIR" on a site whose hosts
    can be powered off; a site without (rack.hosts_per_rack = 0) has no such part."""
    site = (EXAMPLES / "supernode-512.toml").read_text()
    assert "hosts_per_rack = 8\n" in site
    (tmp_path / "site.toml").write_text(site.replace("hosts_per_rack = 8\n", "hosts_per_rack = 0\n"))
    path = _scenario(tmp_path / "nohosts.toml", '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n')
    path.write_text(path.read_text().replace(f'site = "{SITE}"', 'site = "site.toml"'))
    rc, out, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    assert "hosts off" not in out and out.startswith("nohosts: ") and ", supply 30 deg C, " in out
    assert out.rstrip().endswith(f"; files in {tmp_path / 'o'}")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # the baseline's set-point must be one the site offers (examples/supernode-512.toml: 20-45 by 5)
        ("supply_temp_c = 32.0\n", "supply_temp_c: must be one of the site's supply_temp_options_c"),
        # fewer cards listed than the job has
        ('[[jobs]]\nid = "a"\nn_cards = 8\ncards = [0, 1, 2, 3, 4, 5, 6]\n', "cards: 7 cards listed but n_cards = 8"),
    ],
)
def test_a_bad_scenario_is_one_line_and_exit_2(tmp_path: Path, body: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "bad"\nsite = "{SITE}"\nambient_c = 20.0\n{body}')
    rc, stdout, stderr = _optimize(path, tmp_path / "o")
    assert rc == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and expected in lines[0], stderr


@pytest.mark.parametrize(
    "generate",
    [
        "sizes = [512]\nallocation = 1.0\n",  # a job as large as the site (512 cards) is allowed
        "compute_share_min = 0.9\ncompute_share_max = 0.9\n",  # one compute share: min = max is allowed
    ],
)
def test_generate_ranges_at_their_limits_are_accepted(tmp_path: Path, generate: str) -> None:
    """docs/models.md [generate]: sizes up to the site's cards, compute_share_min <= compute_share_max."""
    from agent.commands.optimize_scenario import load_scenario

    path = tmp_path / "edge.toml"
    path.write_text(f'name = "edge"\nsite = "{SITE}"\nambient_c = 20.0\n[generate]\nseed = 1\n{generate}')
    sc = load_scenario(path)
    assert sc.jobs and not sc.dropped


def test_a_plan_that_fell_back_to_the_greedy_one_says_why_on_stderr_and_in_plan_json(tmp_path: Path) -> None:
    """A time limit the greedy plans use up before any solve (1 ms): the plan is the greedy one
    (status "fallback", exit 0) and says why, on stderr even with --quiet and in plan.json's
    ``explanation`` (a fallback used to come with no reason: the explanation was empty)."""
    path = _scenario(tmp_path / "short.toml", '[[jobs]]\nid = "a"\nn_cards = 64\nracks = [0]\n')
    rc, _stdout, stderr = _optimize(path, tmp_path / "o", "--quiet", "--time-limit", "0.001")
    assert rc == 0, stderr
    why = "supply 30 deg C: the time limit was used up before its solve; greedy plan used"
    assert stderr.splitlines() == [f"racktwin optimize: fallback: {why}"]
    plan = _plan(tmp_path / "o")
    assert (plan["status"], plan["source"], plan["explanation"]) == ("fallback", "greedy", why)
