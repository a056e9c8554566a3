"""``racktwin evaluate``: every policy runs the same plant in process and is judged on true values.

What users rely on: each policy runs a scenario to its end; the agent keeps true rack power under the
limit at full load where the baseline does not; the metrics add up (energy breakdown = the plant's
integrals, PUE = facility / IT energy); the same seed gives the same numbers, in process or in worker
processes; the command's JSON has the documented shape; bad arguments are one line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import example_site, job, small_site
from evaluate_helpers import full_load_scenario, mixed_scenario

from agent.cli import main
from agent.evaluate import BREAKDOWN_KEYS, Recorder, evaluate, run_policy
from agent.policies import POLICY_NAMES
from twin.plant import Plant, PlantConfig

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REQUIRED_KEYS = {
    "facility_energy_kwh": float,
    "it_energy_kwh": float,
    "pue": float,
    "throughput": float,
    "throughput_loss_pct": float,
    "limit_violation_s": float,
    "max_rack_power_w": float,
    "max_die_temp_c": float,
    "solve_p99_s": float,
}


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_each_policy_runs_a_scenario_to_its_end_and_its_numbers_add_up(name: str) -> None:
    sc = mixed_scenario(600.0)
    res = run_policy(sc, name)
    m = res.metrics
    assert m["duration_s"] == pytest.approx(600.0)
    assert m["facility_energy_kwh"] > m["it_energy_kwh"] > 0
    assert m["pue"] == pytest.approx(m["facility_energy_kwh"] / m["it_energy_kwh"])
    assert m["throughput"] > 0 and m["jobs_submitted"] > 0
    assert m["decisions"] > 0 and m["solve_p99_s"] >= m["solve_median_s"] >= 0
    assert m["queue_wait_max_s"] >= m["queue_wait_p95_s"] >= 0 and m["queue_wait_max_s"] >= m["queue_wait_mean_s"]
    it = sum(res.breakdown_kwh[k] for k in BREAKDOWN_KEYS[:5])
    assert it == pytest.approx(m["it_energy_kwh"], rel=1e-6)
    assert sum(res.breakdown_kwh.values()) == pytest.approx(m["facility_energy_kwh"], rel=1e-6)
    assert res.series["time_s"][0] == 0.0 and res.series["time_s"][-1] == pytest.approx(600.0)
    assert 0.0 < m["allocated_card_frac"] <= 1.0 and "busy_card_frac" not in m
    assert m["boot_wait_card_frac"] == 0.0  # the small site's hosts are never off
    held_s = m["allocated_card_frac"] * m["duration_s"] * sc.site.n_cards
    assert m["idle_card_s"] == pytest.approx(sc.site.n_cards * m["duration_s"] - held_s)


def test_cards_held_by_a_job_waiting_for_its_host_to_boot_are_allocated_and_counted_as_boot_wait() -> None:
    """A job placed on a host that is off holds its cards while the host boots (300 s on the example
    site): they are allocated (held by a job, as for every policy) and, all 300 s of it, a boot wait."""
    site = example_site()
    plant = Plant(site, [job("a", 8)], [], PlantConfig(seed=1, placement="external", external_timeout_s=1e6))
    plant.power_off_hosts([0])
    rec = Recorder(plant, judge_from_s=0.0)
    plant.place_job("a", np.arange(8))  # host 0's cards: the host boots, then the cards wake
    for _ in range(400):
        plant.step(1.0)
        rec.on_step()
    assert rec.allocated_card_s == pytest.approx(8 * 400.0)
    assert rec.boot_wait_card_s == pytest.approx(8 * site.rack.host_boot_s)
    phases = [(e.time_s, e.phase) for e in plant.drain_events() if e.kind == "phase"]
    assert phases[0][0] == pytest.approx(site.rack.host_boot_s + site.card.wake_latency_s)  # computing from then


def test_the_energy_breakdown_files_a_step_under_the_state_its_power_was_drawn_in() -> None:
    """A job that ends with a step has freed its cards by the time the step is recorded; that step's
    power is still the job's computing (it was filed as idle awake: +20% idle energy over 4 h)."""
    site = small_site()
    plant = Plant(site, [job("a", 16, share=1.0, work_steps=120.0, checkpoint_interval_s=1e9)], [], PlantConfig(seed=1))
    rec = Recorder(plant, judge_from_s=0.0)
    cards: list[int] = []
    while plant.time_s < 600.0:
        before = dict(rec.energy_j)
        plant.step(1.0)
        rec.on_step()
        events = plant.drain_events()
        cards += [c for e in events if e.kind == "started" for c in e.cards]
        if any(e.kind == "finished" for e in events):
            break
    else:
        pytest.fail("the job did not finish")
    tr = plant.truth()
    free = np.zeros(plant.n_cards, dtype=bool)
    free[plant.free_cards()] = True
    assert free[cards].all()  # the plant has freed them already
    others = free.copy()
    others[cards] = False  # the cards that were idle during the step
    idle_w = float(tr.card_power_w[others & ~tr.low_power].sum())
    assert rec.energy_j["cards_idle_awake"] - before["cards_idle_awake"] == pytest.approx(idle_w)
    computing = rec.energy_j["cards_computing"] - before["cards_computing"]
    assert computing == pytest.approx(float(tr.card_power_w[cards].sum()))  # the job's last step
    hosts = rec.energy_j["hosts"] - before["hosts"]
    assert hosts == pytest.approx(tr.it_power_w - float(tr.card_power_w.sum()))


def test_the_time_series_reach_the_end_of_a_run_between_two_samples() -> None:
    res = run_policy(mixed_scenario(630.5), "baseline", sample_s=60.0)
    assert res.series["time_s"][-1] == pytest.approx(630.5) and res.series["time_s"][-2] == pytest.approx(600.0)


def test_the_agent_keeps_true_rack_power_under_the_limit_at_full_load_where_the_baseline_does_not() -> None:
    sc = full_load_scenario(600.0)
    ev = evaluate(sc, ["baseline", "static-cap", "reactive", "racktwin"], jobs=1)
    base, agent = ev.results["baseline"].metrics, ev.results["racktwin"].metrics
    limit = sc.site.rack.power_limit_w
    assert base["limit_violation_s"] > 500.0  # every rack, nearly all the time
    assert base["max_rack_power_w"] > limit
    assert agent["limit_violation_s"] == 0.0
    assert agent["max_rack_power_w"] <= limit
    assert agent["throughput_loss_pct"] < 10.0  # it slows jobs a little, it does not stop them
    assert ev.results["static-cap"].metrics["limit_violation_s"] == 0.0
    # the reactive capper corrects within a few of its periods, after going over first
    assert ev.results["reactive"].metrics["limit_violation_longest_s"] < 30.0


def test_the_same_seed_gives_the_same_numbers_in_process_and_in_worker_processes() -> None:
    sc = mixed_scenario(300.0)
    a = evaluate(sc, ["racktwin", "reactive"], jobs=1)
    b = evaluate(sc, ["racktwin", "reactive"], jobs=2)
    timing = {"solve_median_s", "solve_p99_s", "solve_max_s"}
    for name in ("racktwin", "reactive", "baseline"):
        ma, mb = a.results[name].metrics, b.results[name].metrics
        assert {k: v for k, v in ma.items() if k not in timing} == {k: v for k, v in mb.items() if k not in timing}
        assert a.results[name].breakdown_kwh == b.results[name].breakdown_kwh


def test_json_has_the_documented_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "evaluate",
            "--scenario",
            str(EXAMPLES / "day-full-load.toml"),
            "--duration",
            "120",
            "--policy",
            "racktwin",
            "--policy",
            "static-cap",
            "--jobs",
            "1",
            "--json",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)
    assert set(obj) == {"policies"}
    assert set(obj["policies"]) == {"racktwin", "static-cap"}
    for m in obj["policies"].values():
        for key, typ in REQUIRED_KEYS.items():
            assert isinstance(m[key], typ), key
    assert obj["policies"]["static-cap"]["throughput_loss_pct"] > 0  # measured against the baseline, run too
    for f in ("report.html", "metrics.json", "metrics.csv", "series.csv"):
        assert (tmp_path / f).stat().st_size > 0
    full = json.loads((tmp_path / "metrics.json").read_text())
    assert set(full["policies"]) == {"racktwin", "static-cap", "baseline"}
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "baseline"], "--scenario FILE is required"),
        (["--scenario", "nope.toml"], "nope.toml: scenario file not found"),
        (["--scenario", "."], ".: is a directory, expected a TOML file"),
        (["--scenario", "{day}", "--duration", "1e12"], "at most 31536000 (365 days), got 1e+12"),
        (["--scenario", "{day}", "--policy", "magic"], "unknown policy 'magic'"),
        (["--scenario", "{day}", "--jobs", "0"], "--jobs must be within"),
        (["--scenario", "{day}", "--duration", "-5"], "--duration must be a positive"),
        (["--scenario", "{bad}"], "duration_s"),
        (["--scenario", "{day}", "--control", "host_off_after=3"], "did you mean 'host_off_after_s'"),
        (["--scenario", "{day}", "--control", "host_off_after_s=-3"], "host_off_after_s: must be >= 0 s"),
        (["--scenario", "{day}", "--control", "junk"], "expected KEY=VALUE"),
        # the last of two used to win silently; a TOML table refuses a key twice
        (["--scenario", "{day}", "--control", "period_s=10", "--control", "period_s=20"], "period_s: given twice"),
        (["--scenario", "{day}", "--duration", "10"], "(10 s) is not longer than one control period (15 s)"),
        # exactly one period: nothing is judged after it (the largest rack read 0.00 kW)
        (["--scenario", "{day}", "--duration", "15"], "(15 s) is not longer than one control period (15 s)"),
        (["--scenario", "{day}", "--control", "solve_deadline_s=100"], "solve_deadline_s: must be shorter than"),
        (["--scenario", "{day}", "--control", "command_ttl_s=1"], "command_ttl_s: must be at least period_s"),
        (["--scenario", "{day}", "--control", "rack_margin_w=60000"], "below the site's rack power limit"),
    ],
)
def test_bad_arguments_and_scenarios_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nduration_s = -1\nsite = "x.toml"\n')
    day = str(EXAMPLES / "day-nominal.toml")
    args = [a.replace("{day}", day).replace("{bad}", str(bad)) for a in argv]
    # a runnable scenario gets a short, one-policy, in-process run first on the line: should a refusal
    # regress, the test fails on the exit status in seconds instead of simulating a whole day (the case's
    # own --duration, --jobs come later and win; --policy appends, so an unknown name is still refused)
    fast = ["--duration", "30", "--policy", "baseline", "--jobs", "1", "--quiet"] if "{day}" in argv else []
    rc = main(["evaluate", *fast, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("racktwin evaluate: error: ")
    assert message in err[0]


def test_a_broker_disconnect_the_run_cannot_do_is_a_warning_not_a_silent_no_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/fault-broker-disconnect.toml in process ran with '0 faults' and no word that its two
    outages never happened (only racktwin sim has a broker to lose); one starting after a shortened
    run's end is warned of once, as any fault's."""
    scenario = str(EXAMPLES / "fault-broker-disconnect.toml")  # outages at 300 s and 900 s
    argv = ["evaluate", "--scenario", scenario, "--duration", "400", "--policy", "baseline", "--jobs", "1"]
    assert main([*argv, "--quiet", "--out", str(tmp_path)]) == 0
    warnings = [w for w in capsys.readouterr().err.splitlines() if "warning" in w]
    assert warnings == [
        f"racktwin evaluate: warning: {scenario}: faults[1].start_s: 900 s is at or after the end of this run "
        "(400 s, shortened from 1800 s): the fault does not happen",
        f"racktwin evaluate: warning: {scenario}: 1 broker_disconnect fault not run: evaluate runs the policies "
        "in process, with no broker to lose (racktwin sim and demo run them)",
    ]


def test_control_settings_reach_the_agent_policies_as_toml_values() -> None:
    from agent.commands.evaluate import control_of

    assert control_of([]) is None
    c = control_of(["host_off_after_s=1800", "control_host_power=false", "placement_method=greedy"])
    assert c is not None
    assert (c.host_off_after_s, c.control_host_power, c.placement_method) == (1800.0, False, "greedy")
    assert c.period_s == 15.0  # the rest stays at the agent's defaults


def test_the_report_lists_every_anomaly_flagged_during_the_run_with_its_time() -> None:
    """A pump degraded at t = 300 s is flagged as weak some minutes later; the policy's record says
    which rack and from when (and would say "cleared" for a flag that went away)."""
    fault = {"kind": "pump_degradation", "rack": "r1", "start_s": 300.0, "flow_fraction": 0.5}
    res = run_policy(full_load_scenario(1800.0, faults=[fault]), "racktwin")
    (line,) = res.stats.anomalies
    assert line.startswith("weak_pump r1 from t=") and not line.endswith("cleared")
    assert 300.0 < float(line.split("t=")[1].split(" s")[0]) < 1800.0
    assert res.metrics["anomalies"] == line


def test_a_fault_the_shortened_run_never_reaches_is_a_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scen = str(EXAMPLES / "day-fault-heat-wave.toml")
    rc = main(
        ["evaluate", "--scenario", scen, "--duration", "60", "--policy", "baseline", "--quiet", "--out", str(tmp_path)]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert rc == 0
    assert len(err) == 1 and err[0].startswith("racktwin evaluate: warning: ") and "the fault does not happen" in err[0]
