"""``racktwin optimize`` on the shipped scenarios (JSON shape, files written) and on bad scenario files."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import TypedDict, cast

import pytest
from models_helpers import EXAMPLES

from agent.cli import main

pytestmark = pytest.mark.models

KEYS = {
    "status": str,
    "solve_time_s": float,
    "racks": list,
    "pue": float,
    "it_power_w": float,
    "facility_power_w": float,
    "baseline_facility_power_w": float,
    "hosts_off": int,
    "throughput": float,
    "baseline_throughput": float,
}


class RackJson(TypedDict):
    """One rack of ``racktwin optimize --json`` (``agent.commands.optimize_outputs.json_summary``), with a plan."""

    rack: str
    power_w: float
    limit_w: float
    max_die_temp_c: float
    pump_speed_frac: float


class OptimizeJson(TypedDict):
    """The object ``racktwin optimize --json`` prints when there is a plan (None fields are for no plan)."""

    status: str
    solve_time_s: float
    racks: list[RackJson]
    pue: float
    it_power_w: float
    facility_power_w: float
    baseline_facility_power_w: float
    hosts_off: int
    throughput: float
    baseline_throughput: float


def _run(capsys: pytest.CaptureFixture[str], scenario: Path, out: Path) -> OptimizeJson:
    rc = main(["optimize", str(scenario), "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = [ln for ln in captured.out.splitlines() if ln.strip()]
    assert len(lines) == 1, captured.out  # one JSON object, nothing else on stdout
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    assert "racktwin optimize:" in captured.err  # progress lines go to stderr
    return cast(OptimizeJson, doc)  # parsed JSON: the shape is what _check_shape asserts where a test relies on it


def _check_shape(doc: Mapping[str, object]) -> None:
    for key, typ in KEYS.items():
        assert isinstance(doc[key], typ), (key, doc[key])
    racks = doc["racks"]
    assert isinstance(racks, list) and len(racks) == 8
    for r in racks:
        assert set(r) == {"rack", "power_w", "limit_w", "max_die_temp_c", "pump_speed_frac"}
        assert r["power_w"] <= r["limit_w"]
        assert r["max_die_temp_c"] < 87.0
        assert 0.33 <= r["pump_speed_frac"] <= 1.0


def _check_files(out: Path) -> None:
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["cards"]) == 512
    assert {c["state"] for c in plan["cards"]} <= {"busy", "awake", "low_power", "host_off", "failed"}
    for j in plan["jobs"]:
        assert set(j) >= {"id", "racks", "cards", "level"}
    with (out / "racks.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 8 and float(rows[0]["power_w"]) > 0
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3


def test_nominal_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _run(capsys, EXAMPLES / "scenario-nominal.toml", tmp_path / "nominal")
    _check_shape(doc)
    _check_files(tmp_path / "nominal")
    assert doc["status"] in ("optimal", "feasible", "fallback")  # a plan (solver speed varies)
    # far from the caps: no throughput is given up, energy is saved (idle cards, stalled jobs, set-point)
    assert doc["throughput"] == pytest.approx(doc["baseline_throughput"])
    assert doc["facility_power_w"] < doc["baseline_facility_power_w"]
    plan = json.loads((tmp_path / "nominal" / "plan.json").read_text())
    assert plan["unplaced"] == {}
    assert {j["id"] for j in plan["jobs"] if j["placed_now"]} == {"sweep", "debug"}


def test_pumps_slow_where_the_plan_allows_and_full_speed_when_not_chosen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan gives each rack loop's pump the slowest speed its dies, cap and loop rise allow
    (idle racks slowest), which the twin judges as less facility power at the same work; with
    ``choose_pump_speed = false`` every pump stays at full speed."""
    slow = _run(capsys, EXAMPLES / "scenario-nominal.toml", tmp_path / "slow")
    text = (EXAMPLES / "scenario-nominal.toml").read_text()
    assert "choose_pump_speed = true" in text
    fixed_file = tmp_path / "fixed.toml"
    fixed_file.write_text(
        text.replace("choose_pump_speed = true", "choose_pump_speed = false").replace(
            'site = "supernode-512.toml"', f'site = "{EXAMPLES / "supernode-512.toml"}"'
        )
    )
    fixed = _run(capsys, fixed_file, tmp_path / "fixed")
    slow_speed = [r["pump_speed_frac"] for r in slow["racks"]]
    assert [r["pump_speed_frac"] for r in fixed["racks"]] == [1.0] * 8
    assert max(slow_speed) < 1.0 and min(slow_speed) == pytest.approx(1 / 3, abs=0.01)
    assert slow["throughput"] == pytest.approx(fixed["throughput"])
    assert slow["facility_power_w"] < fixed["facility_power_w"] - 2000.0
    plan = json.loads((tmp_path / "slow" / "plan.json").read_text())
    assert plan["pump_power_w"] < plan["baseline"]["pump_power_w"]
    # the slower loops warm the dies, within the die limit (slowdown - margin)
    assert all(r["max_die_temp_c"] <= 85.0 + 0.05 for r in slow["racks"])


def test_idle_hosts_go_off_but_a_reserve_and_every_host_with_a_busy_card_stay_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the nominal snapshot (a third of the cards idle) the plan powers off every host with no
    busy card but two per supernode (the agent's reserve for arriving jobs); the twin judges that as
    what the hosts and their sleeping cards drew, at the same work. ``choose_host_power = false``
    keeps every host on."""
    text = (EXAMPLES / "scenario-nominal.toml").read_text()
    assert "choose_host_power = true" in text and "host_reserve_per_supernode = 2" in text
    site_line = 'site = "supernode-512.toml"'

    def variant(name: str, old: str, new: str) -> Path:
        f = tmp_path / f"{name}.toml"
        f.write_text(text.replace(old, new).replace(site_line, f'site = "{EXAMPLES / "supernode-512.toml"}"'))
        return f

    off = _run(capsys, EXAMPLES / "scenario-nominal.toml", tmp_path / "off")
    on = _run(capsys, variant("on", "choose_host_power = true", "choose_host_power = false"), tmp_path / "on")
    plan = json.loads((tmp_path / "off" / "plan.json").read_text())
    cph = 8
    busy_hosts = {c["card"] // cph for c in plan["cards"] if c["state"] == "busy"}
    idle_hosts = set(range(64)) - busy_hosts
    assert plan["hosts_off"] and not busy_hosts & set(plan["hosts_off"])
    assert off["hosts_off"] == len(plan["hosts_off"]) == len(idle_hosts) - 2  # one supernode: 2 kept on
    assert on["hosts_off"] == 0
    assert {c["state"] for c in plan["cards"] if c["card"] // cph in plan["hosts_off"]} == {"host_off"}
    assert off["throughput"] == pytest.approx(on["throughput"])
    # what the off hosts save (950 W each) plus their cards asleep (~50 W each), and cooling on top;
    # host_saving_w counts both (it once counted the hosts alone)
    saved_it_w = on["it_power_w"] - off["it_power_w"]
    assert plan["host_saving_w"] == pytest.approx((950.0 + 8 * 50.0) * off["hosts_off"], rel=0.05)
    assert saved_it_w == pytest.approx(plan["host_saving_w"], rel=0.01)
    assert on["facility_power_w"] - off["facility_power_w"] > saved_it_w
    with (tmp_path / "off" / "racks.csv").open() as fh:
        assert sum(int(r["hosts_off"]) for r in csv.DictReader(fh)) == off["hosts_off"]
    assert "hosts off" in (tmp_path / "off" / "report.html").read_text()
    # a bigger reserve keeps more on
    more = _run(
        capsys,
        variant("reserve", "host_reserve_per_supernode = 2", "host_reserve_per_supernode = 6"),
        tmp_path / "reserve",
    )
    assert more["hosts_off"] == off["hosts_off"] - 4


def test_the_pump_choice_counts_the_heat_of_the_hosts_the_plan_powers_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 40-card compute job on r0 and its three idle hosts off: r0's loop carries the job and five
    hosts, not eight hosts and 24 sleeping cards, so its pump may run slower than the hosts-on heat
    would allow within the loop's rise bound (it did not before the pump choice counted them)."""
    from twin.spec import load_site

    site = load_site(EXAMPLES / "supernode-512.toml")
    scenario = tmp_path / "one.toml"
    scenario.write_text(
        f'name = "one-rack"\nsite = "{EXAMPLES / "supernode-512.toml"}"\nambient_c = 22.0\nsupply_temp_c = 30.0\n'
        "ready_reserve_cards = 0\n[solver]\nhost_reserve_per_supernode = 0\n"
        '[[jobs]]\nid = "big"\nn_cards = 40\nracks = [0]\ncompute_share = 0.97\n'
    )
    doc = _run(capsys, scenario, tmp_path / "o")
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    off_r0 = [h for h in plan["hosts_off"] if h < site.n_hosts // site.n_racks]
    assert off_r0 == [5, 6, 7]
    r0 = doc["racks"][0]
    loop = site.loop
    mcp_full_w_per_k = site.loop_flow_per_rack_lpm() / 60_000.0 * loop.density_kg_per_m3 * loop.specific_heat_j_per_kg_k
    allowed_w = loop.max_delta_t_k * mcp_full_w_per_k * r0["pump_speed_frac"]
    hosts_on_w = r0["power_w"] + len(off_r0) * (site.host_saving_w() + site.cards_per_host * site.card.low_power_idle_w)
    assert r0["power_w"] <= allowed_w < hosts_on_w  # within the rise bound only because the hosts are off


def test_full_load_scenario_caps_bind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _run(capsys, EXAMPLES / "scenario-full-load.toml", tmp_path / "full")
    _check_shape(doc)
    _check_files(tmp_path / "full")
    assert doc["status"] in ("optimal", "feasible", "fallback")  # a plan (solver speed varies)
    # at the top clock every rack would exceed limit - margin: the plan gives up some throughput
    assert doc["throughput"] < doc["baseline_throughput"]
    with (tmp_path / "full" / "racks.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert all(float(r["baseline_power_w"]) > float(r["cap_w"]) for r in rows)
    assert all(float(r["power_w"]) <= float(r["cap_w"]) for r in rows)


SITE_LINE = 'site = "{site}"\n'


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('name = "x"\nambient_c = 20.0\n', "site: missing required value"),
        ('name = "x"\nsite = "nope.toml"\nambient_c = 20.0\n', "site: cannot load site spec 'nope.toml'"),
        ('name = "x"\n{site}ambient_c = "warm"\n', "ambient_c: expected a number deg C"),
        ('name = "x"\n{site}ambient_c = 20.0\nambient_temp_c = 3\n', "ambient_temp_c: unknown key"),
        ('name = "x"\n{site}ambient_c = 20.0\n[[jobs]]\nid = "a"\nn_cards = 8\n', "jobs[0] (a): a running job needs"),
        (
            'name = "x"\n{site}ambient_c = 20.0\n[[jobs]]\nid = "a"\nn_cards = 8\ncards = [0, 1]\n',
            "jobs[0] (a): cards: 2 cards listed but n_cards = 8",
        ),
        (
            'name = "x"\n{site}ambient_c = 20.0\n[[jobs]]\nid = "a"\nn_cards = 8\nracks = [0]\nphase = "sleeping"\n',
            "jobs[0].phase: must be one of",
        ),
        ('name = "x"\n{site}ambient_c = 20.0\nsupply_temp_c = 33.0\n', "supply_temp_c: must be one of"),
        ('name = "x"\n{site}ambient_c = 20.0\n[solver]\ntime_limit_s = 0\n', "solver.time_limit_s: must be > 0"),
        ("name = = 3\n", "not valid TOML"),
        ('name = "x"\n{site}ambient_c = 20.0\nfailed_cards = [511, 511]\n', "failed_cards: card 511 is listed twice"),
        (
            'name = "x"\n{site}ambient_c = 20.0\n[[jobs]]\nid = "a"\nn_cards = 8\nracks = [0, 0]\n',
            "jobs[0] (a): racks: rack 0 is listed twice",
        ),
        (
            'name = "x"\n{site}ambient_c = 20.0\n[generate]\nphase_weights = [0.0, 0.0, 0.0, 0.0]\n',
            "generate.phase_weights: the 4 weights must not all be 0",
        ),
        (
            'name = "x"\n{site}ambient_c = 20.0\n[generate]\nphase_weights = [1.0, 0.0]\n',
            "generate.phase_weights: need 4 weights (compute, communication, checkpoint, waiting), got 2",
        ),
        (
            'name = "x"\n{site}ambient_c = 20.0\n[generate]\nsizes = [8, 100000]\n',
            "generate.sizes: 100000 cards is more than the site's 512",
        ),
        # the sections decoded apart are known keys too (was: "known keys here: name, site, ..." without them)
        (
            'name = "x"\n{site}ambient_c = 20.0\n[[job]]\nid = "a"\nn_cards = 8\n',
            "job: unknown key; did you mean 'jobs'?",
        ),
        ('name = "x"\n{site}ambient_c = 20.0\n[[queues]]\nid = "a"\n', "queues: unknown key; did you mean 'queue'?"),
    ],
)
def test_bad_scenario_files_give_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, expected: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body.replace("{site}", SITE_LINE.format(site=(EXAMPLES / "supernode-512.toml").as_posix())))
    rc = main(["optimize", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0]
    assert expected in lines[0]


def test_generated_acme_workload_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # [generate] source = "acme": jobs drawn from twin.workload.generate_jobs, packed onto the site
    path = tmp_path / "acme.toml"
    site = (EXAMPLES / "supernode-512.toml").as_posix()
    path.write_text(
        f'name = "acme"\nsite = "{site}"\nambient_c = 20.0\n[generate]\nsource = "acme"\nseed = 3\n'
        "allocation = 0.7\nqueue_jobs = 3\n"
    )
    doc = _run(capsys, path, tmp_path / "acme")
    _check_shape(doc)
    plan = json.loads((tmp_path / "acme" / "plan.json").read_text())
    busy = sum(1 for c in plan["cards"] if c["state"] == "busy")
    assert busy >= 0.6 * 512


def test_infeasible_scenario_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a 45 kW margin leaves 5 kW per rack: less than the host overhead alone
    path = tmp_path / "tight.toml"
    site = (EXAMPLES / "supernode-512.toml").as_posix()
    path.write_text(
        f'name = "tight"\nsite = "{site}"\nambient_c = 20.0\n[margins]\nrack_margin_w = 45000.0\n'
        '[solver]\nchoose_setpoint = false\n[[jobs]]\nid = "a"\nn_cards = 64\nracks = [2]\n'
    )
    rc = main(["optimize", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "infeasible: rack power: rack r2: 64 busy cards" in err
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    # the idle racks fit once their idle hosts are off (decided before planning): only r2 is named, with
    # the power the twin judges the written plan's r2 at (they were all named, at every host on, before)
    assert plan["status"] == "infeasible" and plan["source"] == "greedy"
    assert len(plan["explanation"].splitlines()) == 1 and plan["explanation"].startswith("rack power: rack r2")
    with (tmp_path / "o" / "racks.csv").open() as fh:
        r2_kw = float(list(csv.DictReader(fh))[2]["power_w"]) / 1e3
    assert f"still draw {r2_kw:.1f} kW > 5.0 kW" in plan["explanation"]


def test_a_site_without_host_power_keeps_every_host_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a site whose hosts cannot be powered off (no ``rack.hosts_per_rack``) the plan powers none
    off and the summary line does not talk about hosts."""
    host_keys = ("hosts_per_rack", "host_power_w", "host_off_power_w", "host_boot_s")
    site_text = (EXAMPLES / "supernode-512.toml").read_text()
    kept = [ln for ln in site_text.splitlines() if not ln.startswith(host_keys)]
    assert len(kept) == len(site_text.splitlines()) - 4
    (tmp_path / "site.toml").write_text("\n".join(kept) + "\n")
    text = (EXAMPLES / "scenario-nominal.toml").read_text()
    scenario = tmp_path / "sc.toml"
    scenario.write_text(text.replace('site = "supernode-512.toml"', 'site = "site.toml"'))
    doc = _run(capsys, scenario, tmp_path / "json")
    assert doc["hosts_off"] == 0
    rc = main(["optimize", str(scenario), "--out", str(tmp_path / "line"), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "hosts off" not in out and out.startswith("nominal: ")


def _variant(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """The nominal scenario with text replaced (``edits``), its site given by absolute path."""
    text = (EXAMPLES / "scenario-nominal.toml").read_text()
    for old, new in (
        *edits,
        ('site = "supernode-512.toml"', f'site = "{(EXAMPLES / "supernode-512.toml").as_posix()}"'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "edits", "reserve", "hosts_on_for_it"),
    [
        ("reserve32", [("ready_reserve_cards = 16", "ready_reserve_cards = 32")], 32, 4),
        (
            "failed",
            [
                (
                    "ready_reserve_cards = 16",
                    f"ready_reserve_cards = 16\nfailed_cards = {[300, 301, 302, 303, 400, 401, *range(448, 457), 500]}",
                )
            ],
            16,
            2,
        ),
    ],
)
def test_the_ready_reserve_is_awake_on_hosts_that_stay_on(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edits: list[tuple[str, str]],
    reserve: int,
    hosts_on_for_it: int,
) -> None:
    """Every card of the ready reserve is awake on a host that is on: the hosts holding it stay on,
    beyond the two per supernode kept for arriving jobs where it needs more. (Hosts holding awake
    cards used to go off once more than two held them: 16 of 32 reserve cards were planned awake
    on hosts that were off.)"""
    doc = _run(capsys, _variant(tmp_path, name, *edits), tmp_path / name)
    plan = json.loads((tmp_path / name / "plan.json").read_text())
    off = set(plan["hosts_off"])
    awake = [c for c in plan["cards"] if c["state"] == "awake"]
    assert len(awake) == reserve
    assert not {c["card"] // 8 for c in awake} & off
    assert all(c["power_w"] > 60.0 for c in awake)  # awake, not asleep (~53 W) nor off (0 W)
    busy_hosts = {c["card"] // 8 for c in plan["cards"] if c["state"] == "busy"}
    free_hosts = set(range(64)) - busy_hosts
    # the idle hosts left on are those of the reserve (here more than the 2 per supernode)
    assert len(free_hosts - off) == hosts_on_for_it and doc["hosts_off"] == len(off)
    assert {c["state"] for c in plan["cards"] if c["card"] // 8 in off} <= {"host_off", "failed"}


def test_a_plan_that_fits_only_with_the_idle_hosts_off_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An 11 kW rack limit: every rack with all its hosts on draws more than the 10 kW cap (8.8 kW of
    hosts and 64 sleeping cards), but the plan powers the idle hosts off, so one 8-card job runs at
    the top clock within every cap. The hosts are decided before planning and the models count what
    they save (the run used to report "infeasible" and slow the job to its least-power level while
    the twin judged every rack of the written plan within its cap)."""
    site_text = (EXAMPLES / "supernode-512.toml").read_text()
    assert "power_limit_w = 50000.0" in site_text
    (tmp_path / "site.toml").write_text(site_text.replace("power_limit_w = 50000.0", "power_limit_w = 11000.0"))
    scenario = tmp_path / "light.toml"
    scenario.write_text(
        'name = "light"\nsite = "site.toml"\nambient_c = 22.0\nsupply_temp_c = 30.0\n'
        '[[jobs]]\nid = "small"\nn_cards = 8\nracks = [0]\n'
    )
    doc = _run(capsys, scenario, tmp_path / "o")
    assert doc["status"] in ("optimal", "feasible", "fallback")
    assert doc["throughput"] == pytest.approx(8.0)  # top clock
    assert all(r["power_w"] <= 10_000.0 for r in doc["racks"])
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["jobs"][0]["level"] == 0 and plan["explanation"] == ""
    assert len(plan["hosts_off"]) == 64 - 1 - 2  # the job's host and the supernode's reserve of 2 stay on


def test_plan_json_reports_what_the_twin_judges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """plan.json's per-card power, PUE excess and host saving are the judged plan's (pumps slowed,
    idle hosts off), so they add up with racks.csv and the file's own IT / facility power. (They were
    the model's numbers at full pump speed with every host on: cards of off hosts at ~51 W, the PUE
    excess at every host on, the saving of the hosts alone.)"""
    site_path = (EXAMPLES / "supernode-512.toml").as_posix()
    scenario = tmp_path / "one.toml"
    scenario.write_text(
        f'name = "one"\nsite = "{site_path}"\nambient_c = 22.0\nsupply_temp_c = 30.0\n'
        '[[jobs]]\nid = "small"\nn_cards = 8\nracks = [0]\n'
    )
    _run(capsys, scenario, tmp_path / "o")
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    with (tmp_path / "o" / "racks.csv").open() as fh:
        racks = list(csv.DictReader(fh))
    off = set(plan["hosts_off"])
    assert len(off) == 61
    cards = plan["cards"]
    assert all(c["power_w"] == 0.0 for c in cards if c["card"] // 8 in off)
    # racks.csv power = the rack's cards + its hosts (8.8 kW, 950 W less per host off)
    for r, row in enumerate(racks):
        cards_w = sum(c["power_w"] for c in cards if c["rack"] == r)
        n_off = sum(1 for h in off if h // 8 == r)
        assert cards_w + 8800.0 - 950.0 * n_off == pytest.approx(float(row["power_w"]), abs=0.06)
    assert sum(float(row["power_w"]) for row in racks) == pytest.approx(plan["it_power_w"], abs=0.5)
    # nearly idle: the PUE is above the 1.08 target, the excess is that of the judged plan
    excess = plan["facility_power_w"] - 1.08 * plan["it_power_w"]
    assert excess > 1000.0 and plan["pue_excess_w"] == pytest.approx(excess)
    # each host off saves its 950 W and its eight sleeping cards (~50 W each at 30 deg C supply)
    assert plan["host_saving_w"] == pytest.approx(61 * (950.0 + 8 * 50.0), rel=0.02)


def test_quiet_still_says_why_a_plan_is_infeasible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--quiet`` drops the progress lines, not the explanation of an infeasible plan (exit 1), with
    or without ``--json`` (it used to print nothing on stderr: status "infeasible" and no reason)."""
    path = tmp_path / "tight.toml"
    site = (EXAMPLES / "supernode-512.toml").as_posix()
    path.write_text(
        f'name = "tight"\nsite = "{site}"\nambient_c = 20.0\n[margins]\nrack_margin_w = 45000.0\n'
        '[solver]\nchoose_setpoint = false\n[[jobs]]\nid = "a"\nn_cards = 64\nracks = [2]\n'
    )
    for extra in ([], ["--json"]):
        rc = main(["optimize", str(path), "--out", str(tmp_path / "o"), "--quiet", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1
        assert err and all(line.startswith("racktwin optimize: infeasible: ") for line in err), err
        assert "rack power: rack r2: 64 busy cards" in err[0]


def _full_load(tmp_path: Path, name: str, top: str = "", tail: str = "", allocation: str = "1.0") -> Path:
    """examples/scenario-full-load.toml (a generated workload) with ``top`` added after its top-level
    keys, ``tail`` at its end and its own ``allocation``; its site given by absolute path."""
    text = (EXAMPLES / "scenario-full-load.toml").read_text()
    for old, new in (
        ("supply_temp_c = 30.0\n", f"supply_temp_c = 30.0\n{top}"),
        ("allocation = 1.0 ", f"allocation = {allocation} "),
        ('site = "supernode-512.toml"', f'site = "{(EXAMPLES / "supernode-512.toml").as_posix()}"'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text + tail)
    return path


def test_a_generated_job_runs_around_a_failed_card_in_its_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The generator packs job000 (128 cards) on cards 0..127; with card 5 failed it runs on the other
    127 and the nearest free card of the supernode, instead of vanishing from the plan (it was
    dropped without a word)."""
    doc = _run(capsys, _full_load(tmp_path, "half", top="failed_cards = [5]\n", allocation="0.65"), tmp_path / "o")
    err = capsys.readouterr().err
    assert doc["status"] in ("optimal", "feasible", "fallback")
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    jobs = {j["id"]: j for j in plan["jobs"]}
    assert plan["unplaced"] == {} and "job000" in jobs
    cards = jobs["job000"]["cards"]
    assert len(cards) == 128 and 5 not in cards and set(range(128)) - {5} <= set(cards)
    assert plan["cards"][5]["state"] == "failed"
    assert sum(1 for c in plan["cards"] if c["state"] == "busy") == sum(len(j["cards"]) for j in plan["jobs"])
    assert "warning" not in err


@pytest.mark.parametrize(
    ("top", "tail", "what", "free"),
    [
        ("failed_cards = [0]\n", "", "failed card 0", 127),
        ("", '\n[[jobs]]\nid = "x"\nn_cards = 8\nracks = [0]\n', "listed job 'x' (8 cards)", 120),
    ],
)
def test_a_generated_job_with_no_room_left_is_dropped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], top: str, tail: str, what: str, free: int
) -> None:
    """Every card busy: a failed card or a listed job in job000's block (cards 0..127) leaves the
    supernode too few free cards for it. The job is dropped, but said so on stderr even with --quiet,
    and plan.json's ``unplaced`` and report.html name it with the reason (it vanished silently)."""
    path = _full_load(tmp_path, "full", top=top, tail=tail)
    rc = main(["optimize", str(path), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0
    reason = (
        f"generated job dropped: its cards 0..127 hold {what}, and supernode 0 has only {free} free cards for its 128"
    )
    assert err == [f"racktwin optimize: warning: {path}: job000: {reason}"]
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["unplaced"] == {"job000": reason}
    assert "job000" not in {j["id"] for j in plan["jobs"]}
    assert escape(reason) in (tmp_path / "o" / "report.html").read_text()
