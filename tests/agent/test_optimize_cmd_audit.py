"""``racktwin optimize`` as docs/models.md describes it, checked where a hand mutation of the command
(agent/commands/optimize*.py) went unnoticed: the closing line against plan.json, the files' figures
(limits and caps, busy and failed cards per rack, clocks, phases, racks, set-point options, the PUE
excess), the baseline (every card at the top clock, idle cards in active idle, the scenario's
set-point), a fixed set-point and die margin, the hosts kept on (a queued job, the ready reserve, the
racks with the most headroom), failed cards, a generated job moved around a failed card, and the
one-line errors of a bad scenario. Real HiGHS on the 512-card example site; the expected values are
derived from the site spec and the docs, not taken from a run.

No broker: the ``models`` layer (the solver runs), as tests/models/test_cli.py.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main

pytestmark = pytest.mark.models

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE = (EXAMPLES / "supernode-512.toml").as_posix()
# the example site (examples/supernode-512.toml): 8 racks of 64 cards, 8 hosts of 8 cards per rack
CLOCKS_MHZ = [1980, 1870, 1760, 1650, 1540, 1430, 1320, 1210]
RACK_LIMIT_W = 50_000.0
HOST_OVERHEAD_W = 8800.0  # per rack, the 8 hosts' 1000 W and the switches
SUPPLY_OPTIONS_C = [20.0, 25.0, 30.0, 35.0, 40.0, 45.0]
PUE_TARGET = 1.08


def _optimize(scenario: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    """``racktwin optimize`` in-process: exit status, stdout, stderr."""
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = main(["optimize", str(scenario), "--out", str(out), *extra])
    return rc, so.getvalue(), se.getvalue()


def _outputs(out: Path) -> tuple[dict[str, Any], list[dict[str, str]], str]:
    plan = json.loads((out / "plan.json").read_text())
    with (out / "racks.csv").open() as fh:
        racks = list(csv.DictReader(fh))
    return plan, racks, (out / "report.html").read_text()


def _nominal_variant(path: Path, *edits: tuple[str, str]) -> Path:
    text = (EXAMPLES / "scenario-nominal.toml").read_text()
    for old, new in (*edits, ('site = "supernode-512.toml"', f'site = "{SITE}"')):
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _report_row(html: str, name: str) -> str:
    m = re.search(rf"<tr><td>{name}</td>(.*?)</tr>", html)
    assert m, name
    return m.group(1)


@pytest.fixture(scope="module")
def nominal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """examples/scenario-nominal.toml without --json: the closing line, stderr and the three files."""
    out = tmp_path_factory.mktemp("nominal") / "o"
    rc, stdout, stderr = _optimize(EXAMPLES / "scenario-nominal.toml", out)
    plan, racks, html = _outputs(out)
    return {"rc": rc, "out": out, "stdout": stdout, "stderr": stderr, "plan": plan, "racks": racks, "html": html}


def test_the_closing_line_is_plan_json_rounded_and_progress_stays_on_stderr(nominal: dict[str, Any]) -> None:
    """docs/models.md: without --json one line on stdout (IT and facility power in kW, the baseline's
    facility power, PUE, throughput, hosts off, the folder); progress lines go to stderr."""
    assert nominal["rc"] == 0
    lines = nominal["stdout"].splitlines()
    assert len(lines) == 1, nominal["stdout"]
    plan = nominal["plan"]
    b = plan["baseline"]
    expected = (
        f"nominal: {plan['status']}, supply {plan['supply_temp_c']:g} deg C, IT {plan['it_power_w'] / 1e3:.1f} kW, "
        f"facility {plan['facility_power_w'] / 1e3:.1f} kW (baseline {b['facility_power_w'] / 1e3:.1f} kW), "
        f"PUE {plan['pue']:.3f}, throughput "
    )
    assert lines[0].startswith(expected), (lines[0], expected)
    assert lines[0].endswith(f", {len(plan['hosts_off'])} of 64 hosts off; files in {nominal['out']}")
    err = nominal["stderr"].splitlines()
    assert len(err) >= 5 and all(ln.startswith("racktwin optimize: ") for ln in err)


def test_the_pue_excess_is_never_negative(nominal: dict[str, Any]) -> None:
    """``pue_excess_w``: the facility power above pue_target x IT, 0 when the PUE is below the target
    (the docs' nominal run: PUE 1.045 < 1.08)."""
    plan = nominal["plan"]
    assert plan["pue_target"] == PUE_TARGET
    assert plan["pue"] < PUE_TARGET
    assert plan["pue_excess_w"] == 0.0


def test_jobs_carry_their_phase_racks_and_the_clock_of_their_level(nominal: dict[str, Any]) -> None:
    """The scenario's phases and racks; far from the caps the compute jobs keep the top clock and
    the checkpointing, waiting and communicating ones go down to the voltage floor (levels 5-7 share
    0.851 V in the site's voltages_v; below it a lower clock saves nothing more), each with the clock
    of its level from the site's clocks_mhz."""
    jobs = {j["id"]: j for j in nominal["plan"]["jobs"]}
    phases = {
        "llm-a": "compute",
        "llm-b": "compute",
        "vision": "checkpoint",
        "finetune-1": "communication",
        "finetune-2": "compute",
        "eval": "waiting",
        "rl": "compute",
    }
    racks = {"llm-a": [0, 1], "llm-b": [2], "vision": [3], "finetune-1": [3], "finetune-2": [3], "eval": [4], "rl": [5]}
    for job_id, phase in phases.items():
        j = jobs[job_id]
        assert j["phase"] == phase, job_id
        assert j["racks"] == racks[job_id], job_id
        assert j["level"] == 0 if phase == "compute" else j["level"] >= 5, (job_id, j["level"])
        assert j["clock_mhz"] == CLOCKS_MHZ[j["level"]], job_id
    assert all(jobs[q]["clock_mhz"] == CLOCKS_MHZ[jobs[q]["level"]] for q in ("sweep", "debug"))


def test_racks_csv_limits_caps_and_busy_cards(nominal: dict[str, Any]) -> None:
    """racks.csv: the site's 50 kW limit, the cap 1 kW (rack_margin_w) below it, and per rack the
    busy cards of plan.json (r0 and r1 hold llm-a's 128 cards, r2 llm-b's 64, r3 three jobs' 64), which
    the greedy plan runs too."""
    plan, rows = nominal["plan"], nominal["racks"]
    assert len(rows) == 8
    busy = [0] * 8
    for c in plan["cards"]:
        busy[c["rack"]] += c["state"] == "busy"
    assert busy[:4] == [64, 64, 64, 64] and sum(busy) == 328 + 32 + 8  # listed jobs and the two queued
    for r, row in enumerate(rows):
        assert float(row["limit_w"]) == RACK_LIMIT_W
        assert float(row["cap_w"]) == RACK_LIMIT_W - 1000.0
        assert int(row["busy_cards"]) == busy[r]
        assert int(row["failed_cards"]) == 0
        assert float(row["power_w"]) <= float(row["cap_w"])
        # the greedy plan runs the same jobs, the two placed ones too: at least the rack's hosts on
        # (1000 W each, 50 W when off, 800 W of switches) and each busy card at the lowest clock and
        # voltage (569 W x u x 0.851^2 x 1210/1980 of switching power, u ~ 0.9, on ~50 W of idle power)
        hosts_w = HOST_OVERHEAD_W - 950.0 * int(row["hosts_off"])
        assert float(row["greedy_power_w"]) > hosts_w + busy[r] * 150.0


def test_plan_json_lists_every_set_point_option(nominal: dict[str, Any]) -> None:
    """choose_setpoint = true: one option per supply_temp_options_c, the chosen set-point among them."""
    plan = nominal["plan"]
    assert [o["supply_temp_c"] for o in plan["setpoint_options"]] == SUPPLY_OPTIONS_C
    assert plan["supply_temp_c"] in SUPPLY_OPTIONS_C


def test_the_baseline_runs_at_the_scenario_set_point(nominal: dict[str, Any]) -> None:
    """report.html's baseline row is at the scenario's supply_temp_c (30 deg C), the plan's at its own."""
    html, plan = nominal["html"], nominal["plan"]
    assert "<td>30 deg C</td>" in _report_row(html, "baseline")
    assert f"<td>{plan['supply_temp_c']:g} deg C</td>" in _report_row(html, "plan")


def test_a_fixed_set_point_and_die_margin_are_kept(tmp_path: Path) -> None:
    """choose_setpoint = false keeps supply_temp_c (40 deg C here, not the site's 30) for the plan and
    the baseline; die_margin_k = 10 keeps every die of the judged plan (pumps slowed) at or below
    slowdown (87 deg C) - 10, where slowed pumps would warm them past it at this supply; --json's
    limit_w is the site's limit, not the cap."""
    path = _nominal_variant(
        tmp_path / "fixed.toml",
        ("supply_temp_c = 30.0", "supply_temp_c = 40.0"),
        ("choose_setpoint = true", "choose_setpoint = false"),
        ("die_margin_k = 2.0", "die_margin_k = 10.0"),
    )
    rc, stdout, _ = _optimize(path, tmp_path / "o", "--json", "--quiet")
    assert rc == 0
    doc = json.loads(stdout)
    plan, _rows, html = _outputs(tmp_path / "o")
    assert plan["supply_temp_c"] == 40.0
    assert [o["supply_temp_c"] for o in plan["setpoint_options"]] == [40.0]
    assert "<td>40 deg C</td>" in _report_row(html, "baseline")
    assert all(r["limit_w"] == RACK_LIMIT_W for r in doc["racks"])
    assert max(r["max_die_temp_c"] for r in doc["racks"]) <= 87.0 - 10.0 + 0.05


def _one_rack_job(path: Path, n_cards: int, top: str, tail: str = "") -> Path:
    path.write_text(
        f'name = "{path.stem}"\nsite = "{SITE}"\nambient_c = 22.0\nsupply_temp_c = 30.0\n{top}'
        f'[solver]\nchoose_setpoint = false\n{tail}[[jobs]]\nid = "a"\nn_cards = {n_cards}\nracks = [0]\n'
    )
    return path


@pytest.mark.parametrize(("reserve", "awake"), [("", 476), ("ready_reserve_cards = 0\n", 0)])
def test_while_a_job_stays_queued_every_host_stays_on(tmp_path: Path, reserve: str, awake: int) -> None:
    """A queued job no rack can take (480 cards on at most one rack) stays queued: no host goes off
    ("none while jobs stay queued"), and the ready reserve is the scenario's, by default the largest
    job still queued (480 cards, capped at the 476 idle ones)."""
    path = _one_rack_job(
        tmp_path / "queued.toml", 36, reserve, tail='[[queue]]\nid = "big"\nn_cards = 480\nmax_racks = 1\n'
    )
    rc, _, _ = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0
    plan, _rows, _html = _outputs(tmp_path / "o")
    assert set(plan["unplaced"]) == {"big"}
    assert plan["hosts_off"] == []
    states = [c["state"] for c in plan["cards"]]
    assert states.count("busy") == 36 and states.count("awake") == awake
    assert states.count("low_power") == 476 - awake


def test_the_ready_reserve_fills_a_busy_host_before_keeping_an_idle_one(tmp_path: Path) -> None:
    """36 cards on r0: hosts 0-3 full, host 4 with 4 idle cards. A ready reserve of 4 is those 4
    cards (on a host that is on anyway), so with no reserve of hosts every one of the 59 idle hosts
    goes off. The largest --time-limit the docs allow, 3600 s, is taken."""
    path = _one_rack_job(tmp_path / "fill.toml", 36, "ready_reserve_cards = 4\n", "host_reserve_per_supernode = 0\n")
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet", "--time-limit", "3600")
    assert rc == 0, err
    plan, _rows, _html = _outputs(tmp_path / "o")
    assert [c["card"] for c in plan["cards"] if c["state"] == "awake"] == [36, 37, 38, 39]
    assert plan["hosts_off"] == list(range(5, 64))


def test_hosts_stay_on_in_the_racks_with_the_most_headroom(tmp_path: Path) -> None:
    """40 cards on r0 (hosts 0-4 full): r0 has the least headroom. The host kept on for a ready
    reserve of 8 and the second of the two kept per supernode are both in other racks: r0's idle
    hosts 5-7 go off first."""
    path = _one_rack_job(tmp_path / "head.toml", 40, "ready_reserve_cards = 8\n", "host_reserve_per_supernode = 2\n")
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    plan, _rows, _html = _outputs(tmp_path / "o")
    awake = [c["card"] for c in plan["cards"] if c["state"] == "awake"]
    assert len(awake) == 8 and all(c >= 64 for c in awake)
    off = set(plan["hosts_off"])
    assert {5, 6, 7} <= off and len(off) == 64 - 5 - 2


def test_failed_cards_read_failed_draw_low_power_idle_and_count_per_rack(tmp_path: Path) -> None:
    """A failed card on a busy host (card 7, host 0) and one on an idle host that goes off (card 100,
    host 12): both read "failed" in plan.json, the first draws low-power idle (52.8 W at 42 deg C,
    0.4 W/K), the second nothing; racks.csv counts one failed card in r0 and one in r1, and its
    baseline keeps the idle cards awake where the greedy plan does not."""
    path = tmp_path / "failed.toml"
    path.write_text(
        f'name = "failed"\nsite = "{SITE}"\nambient_c = 22.0\nsupply_temp_c = 30.0\nready_reserve_cards = 0\n'
        "failed_cards = [7, 100]\n[solver]\nchoose_setpoint = false\nhost_reserve_per_supernode = 0\n"
        f'[[jobs]]\nid = "a"\nn_cards = 7\ncards = {list(range(7))}\n'
    )
    rc, _, err = _optimize(path, tmp_path / "o", "--quiet")
    assert rc == 0, err
    plan, rows, _html = _outputs(tmp_path / "o")
    assert plan["cards"][7]["state"] == "failed" and plan["cards"][100]["state"] == "failed"
    assert 12 in plan["hosts_off"] and 0 not in plan["hosts_off"]
    assert 40.0 < plan["cards"][7]["power_w"] < 60.0
    assert plan["cards"][100]["power_w"] == 0.0
    assert [int(r["failed_cards"]) for r in rows] == [1, 1, 0, 0, 0, 0, 0, 0]
    # racks r2-r7 hold no job: the baseline's power is their hosts (8.8 kW) and 64 cards in active idle
    # (84.5 W at 42 deg C, -0.47 W/K: ~79 W or more on a die above the 30 deg C supply); the greedy
    # plan sends idle cards beyond the ready reserve to low-power idle (52.8 W) and idle hosts off
    for row in rows[2:]:
        base_w = float(row["baseline_power_w"])
        assert HOST_OVERHEAD_W + 64 * 70.0 < base_w < HOST_OVERHEAD_W + 64 * 95.0
        assert float(row["greedy_power_w"]) < base_w - 64 * 20.0


def test_a_generated_job_moved_around_a_failed_card_is_said_and_takes_the_nearest_free_card(tmp_path: Path) -> None:
    """The synthetic generator (seed 0, 30%, sizes 16 and 32, one supernode) packs its jobs from card
    0 up; job005 gets cards 128..143. With card 130 failed it runs on the other 15 and card 144, the
    nearest free card; a progress line says so (a warning only for a job dropped)."""
    path = tmp_path / "gen.toml"
    path.write_text(
        f'name = "gen"\nsite = "{SITE}"\nambient_c = 22.0\nsupply_temp_c = 30.0\nfailed_cards = [130]\n'
        "[solver]\nchoose_setpoint = false\n[generate]\nseed = 0\nallocation = 0.3\nsizes = [16, 32]\n"
        "phase_weights = [1.0, 0.0, 0.0, 0.0]\nslo_fraction = 0.0\npriorities = [1.0]\n"
    )
    rc, _, err = _optimize(path, tmp_path / "o")
    assert rc == 0, err
    said = (
        "racktwin optimize: job005: generated job placed around what is taken: its cards 128..143 hold failed "
        "card 130; it runs on the other 15 and the 1 nearest free card of supernode 0"
    )
    assert said in err.splitlines()
    assert "warning" not in err
    plan, _rows, _html = _outputs(tmp_path / "o")
    jobs = {j["id"]: j for j in plan["jobs"]}
    assert jobs["job005"]["cards"] == [c for c in range(128, 145) if c != 130]


_BAD = [
    ("failed_cards = [512]\n", "failed_cards: card 512 does not exist (site has cards 0..511)"),
    ('[[jobs]]\nid = "a"\nn_cards = 1\ncards = [512]\n', "jobs[0] (a): cards: card 512 does not exist (0..511)"),
    ('[[jobs]]\nid = "a"\nn_cards = 8\nracks = [8]\n', "jobs[0] (a): racks: rack index out of range"),
    ('[[jobs]]\nid = "a"\nn_cards = 65\nracks = [0]\n', "jobs[0] (a): racks [0] have only 64 free cards for 65"),
    (
        '[[jobs]]\nid = "a"\nn_cards = 8\nracks = [0]\ncards = [0, 1, 2, 3, 4, 5, 6, 7]\n',
        "jobs[0] (a): give either cards or racks, not both",
    ),
    (
        '[[jobs]]\nid = "a"\nn_cards = 2\ncards = [0, 1]\n[[jobs]]\nid = "b"\nn_cards = 2\ncards = [1, 2]\n',
        "jobs[1] (b): card 1 is already taken (another job or failed)",
    ),
    ('failed_cards = [3]\n[[jobs]]\nid = "a"\nn_cards = 8\ncards = [0, 1, 2, 3, 4, 5, 6, 7]\n', "card 3 is already"),
    ('[[queue]]\nid = "q"\nn_cards = 8\nracks = [0]\n', "queue[0] (q): queued jobs are placed by the optimizer"),
    (
        '[[jobs]]\nid = "a"\nn_cards = 8\nracks = [0]\n[[queue]]\nid = "a"\nn_cards = 8\n',
        "job id 'a' is used twice",
    ),
    (
        "[generate]\ncompute_share_min = 0.95\ncompute_share_max = 0.9\n",
        "generate.compute_share_min: must be <= compute_share_max",
    ),
    # a margin that leaves no power under the 50 kW limit was solved and reported "infeasible" (exit 1),
    # where the agent's control.rack_margin_w refuses it
    ("[margins]\nrack_margin_w = 50000.0\n", "margins.rack_margin_w: must be below the site's rack power limit"),
]


@pytest.mark.parametrize(("body", "expected"), _BAD, ids=[e.split(":")[0] + str(i) for i, (_b, e) in enumerate(_BAD)])
def test_a_bad_scenario_is_one_line_naming_the_field(tmp_path: Path, body: str, expected: str) -> None:
    """docs/models.md: cards that do not exist or are taken twice, racks out of range or too full, a
    queued job with cards, a job id used twice are one-line errors naming the file, exit 2."""
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "bad"\nsite = "{SITE}"\nambient_c = 20.0\n{body}')
    rc, stdout, stderr = _optimize(path, tmp_path / "o")
    assert rc == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert str(path) in lines[0] and expected in lines[0], lines[0]
    assert not (tmp_path / "o" / "plan.json").exists()
