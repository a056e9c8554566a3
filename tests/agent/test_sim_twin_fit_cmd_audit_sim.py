"""``racktwin sim`` against docs/sim.md ("Command line") and its help: what a mutation audit of
agent/commands/sim_cmd.py found the existing tests let through. Runs use a real mosquitto (the
``mosquitto`` fixture) or the embedded broker, a few site minutes as fast as possible."""

from __future__ import annotations

import csv
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent.broker import EmbeddedBroker, free_ports
from agent.cli import main
from sim.runner import SimOptions

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
EPOCH = 1_000_000_000.0


def _sim(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["sim", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc, out, err = _sim(capsys, *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("racktwin sim: error: "), err
    assert out == ""  # refused before an embedded broker started (its URL goes to stdout)
    return lines[0]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _copy(tmp_path: Path, *names: str) -> list[Path]:
    out = []
    for name in names:
        (tmp_path / name).write_bytes((EXAMPLES / name).read_bytes())
        out.append(tmp_path / name)
    return out


def test_a_run_takes_every_option_it_is_given(
    mosquitto: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, summary = tmp_path / "truth.csv", tmp_path / "summary.json"
    rc, out, err = _sim(
        capsys,
        "--broker", mosquitto.url, "--duration", "30", "--speed", "0", "--supernodes", "2",
        "--telemetry-period-s", "10", "--start-epoch-s", f"{EPOCH:.0f}", "--site-id", "audit7",
        "--truth-log", str(truth), "--summary", str(summary), "--progress-interval-s", "0",
    )  # fmt: skip
    assert rc == 0, err
    assert out == ""  # with --broker, no embedded broker and no URL on stdout
    d: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
    assert d["stopped_by"] == "duration" and d["duration_s"] == 30.0
    assert d["n_cards"] == 1024  # the default site (512 cards, one supernode) scaled to 2 supernodes
    assert d["site_id"] == "audit7" and d["start_ts_s"] == EPOCH
    rows = _rows(truth)
    assert [float(r["time_s"]) for r in rows] == [0.0, 10.0, 20.0, 30.0]  # one row per period
    assert [float(r["ts_s"]) for r in rows] == [EPOCH, EPOCH + 10, EPOCH + 20, EPOCH + 30]
    assert ", speed as fast as possible\n" in err and "site audit7 on " in err  # --speed 0
    assert "sim: t=" not in err  # --progress-interval-s 0: no progress lines
    # the report's energy line is the summary's: IT, then facility, PUE their ratio
    m = re.search(r"energy: IT ([0-9.,]+) kWh, facility ([0-9.,]+) kWh, PUE ([0-9.]+)", err)
    assert m is not None, err
    it_kwh, fac_kwh, pue = (float(x.replace(",", "")) for x in m.groups())
    assert it_kwh == pytest.approx(d["it_energy_kwh"], abs=0.06)
    assert fac_kwh == pytest.approx(d["facility_energy_kwh"], abs=0.06)
    assert fac_kwh > it_kwh and pue == pytest.approx(d["facility_energy_kwh"] / d["it_energy_kwh"], abs=1e-4)
    assert f"truth log: {truth} (4 rows)" in err and f"summary: {summary}" in err
    # a progress interval: at least the last line, where the run ended
    rc, _, err = _sim(
        capsys, "--broker", mosquitto.url, "--duration", "5", "--speed", "0", "--progress-interval-s", "1"
    )
    assert rc == 0 and "sim: t=5 s" in err, err


def _truth_of(capsys: pytest.CaptureFixture[str], url: str, path: Path, *args: str) -> list[dict[str, str]]:
    base = ["--broker", url, "--duration", "20", "--speed", "0", "--progress-interval-s", "0"]
    rc, _, err = _sim(capsys, *base, "--start-epoch-s", f"{EPOCH:.0f}", "--truth-log", str(path), *args)
    assert rc == 0, err
    return _rows(path)


def test_a_speed_the_run_cannot_reach_reads_in_digits(
    mosquitto: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--speed 1e9``: the line describing the run says ``speed 1,000,000,000x``, not ``1e+09x``."""
    rc, _, err = _sim(
        capsys, "--broker", mosquitto.url, "--duration", "5", "--speed", "1e9", "--progress-interval-s", "0"
    )
    assert rc == 0, err
    assert ", speed 1,000,000,000x\n" in err, err


def test_the_seed_is_taken_with_and_without_a_scenario(
    mosquitto: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The seed draws the workload, the card spread and the sensor noise: one seed gives one run, truth
    log for truth log; another seed gives another (docs/sim.md, --seed)."""
    url = mosquitto.url
    a = _truth_of(capsys, url, tmp_path / "a.csv", "--seed", "3")
    assert _truth_of(capsys, url, tmp_path / "a2.csv", "--seed", "3") == a
    assert _truth_of(capsys, url, tmp_path / "b.csv", "--seed", "4") != a
    (scenario,) = _copy(tmp_path, "fault-card-failure.toml")
    _copy(tmp_path, "supernode-512.toml")
    own = int(tomllib.loads(scenario.read_text(encoding="utf-8"))["seed"])  # 14
    c = _truth_of(capsys, url, tmp_path / "c.csv", "--scenario", str(scenario))
    assert _truth_of(capsys, url, tmp_path / "c2.csv", "--scenario", str(scenario), "--seed", str(own)) == c
    assert _truth_of(capsys, url, tmp_path / "d.csv", "--scenario", str(scenario), "--seed", str(own + 1)) != c


def test_the_scenarios_faults_happen_and_late_ones_are_warned_about(
    mosquitto: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/fault-card-failure.toml: card 5 fails at 300 s (repaired 1200 s later), card 130 at
    600 s. A run of 450 s sees the first failure; the second is after its end: one warning line."""
    (scenario,) = _copy(tmp_path, "fault-card-failure.toml")
    _copy(tmp_path, "supernode-512.toml")
    truth = tmp_path / "t.csv"
    rc, _, err = _sim(
        capsys,
        "--broker", mosquitto.url, "--scenario", str(scenario), "--speed", "0", "--progress-interval-s", "0",
        "--duration", "450", "--step-s", "10", "--telemetry-period-s", "50", "--truth-log", str(truth),
    )  # fmt: skip
    assert rc == 0, err
    failed = {float(r["time_s"]): int(float(r["failed_cards"])) for r in _rows(truth)}
    assert (failed[250.0], failed[300.0], failed[450.0]) == (0, 1, 1)
    warnings = [line for line in err.splitlines() if line.startswith("racktwin sim: warning: ")]
    assert len(warnings) == 1 and "faults[1].at_s: 600 s" in warnings[0], err


def test_a_site_given_with_a_scenario_replaces_the_scenarios(
    mosquitto: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario, site, _ = _copy(tmp_path, "sim-trace.toml", "supernode-512.toml", "sim-trace.csv")
    other = tmp_path / "other-site.toml"
    text = site.read_text(encoding="utf-8")
    assert text.count("power_limit_w = 50000.0") == 1
    other.write_text(text.replace("power_limit_w = 50000.0", "power_limit_w = 61000.0"), encoding="utf-8")
    summary = tmp_path / "s.json"
    args = ["--broker", mosquitto.url, "--scenario", str(scenario), "--site", str(other), "--duration", "5"]
    rc, _, err = _sim(capsys, *args, "--speed", "0", "--summary", str(summary))
    assert rc == 0, err
    assert json.loads(summary.read_text(encoding="utf-8"))["rack_power_limit_w"] == 61000.0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        # the ends of the documented ranges are accepted: the run goes on to the next problem
        (["--duration", "31536000", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--duration", "5", "--seed", "0", "--telemetry-period-s", "0.005"], "--telemetry-period-s must be within"),
        (
            ["--duration", "5", "--start-epoch-s", "0", "--summary", "/nonexistent-dir/s.json"],
            "the folder /nonexistent-dir",
        ),
        (["--duration", "5", "--supernodes", "10000"], "--supernodes: "),  # in 1..10000, but 5.12 million cards
        # and just past them refused
        (["--duration", "0"], "--duration must be a positive number of seconds"),
        (["--duration", "5", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--duration", "5", "--supernodes", "10001"], "--supernodes must be within 1..10000, got 10001"),
        (["--duration", "5", "--telemetry-period-s", "3601"], "--telemetry-period-s must be within 0.01..3600 s"),
        (["--duration", "5", "--step-s", "0"], "--step-s must be positive, got 0"),
    ],
)
def test_option_ranges_are_the_documented_ones(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error(capsys, "--speed", "0", *args)
    assert words in line, line
    if "10000" in args:
        assert "1..10000" not in line  # refused for the card count (at most 1,000,000), not the range


def test_a_period_of_an_hour_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """3600 s is the top of --telemetry-period-s: accepted, so the output check that follows refuses."""
    scenario, _, _ = _copy(tmp_path, "sim-trace.toml", "supernode-512.toml", "sim-trace.csv")
    line = _one_error(
        capsys, "--scenario", str(scenario), "--speed", "0", "--telemetry-period-s", "3600", "--summary", str(scenario)
    )
    assert "is the scenario" in line, line


def test_an_output_that_is_the_password_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = tmp_path / "pw.txt"
    pw.write_text("secret\n", encoding="utf-8")
    args = ["--broker", "mqtt://127.0.0.1:1", "--mqtt-username", "u", "--mqtt-password-file", str(pw)]
    line = _one_error(capsys, "--duration", "5", "--speed", "0", *args, "--summary", str(pw))
    assert f"--summary {pw}: is --mqtt-password-file {pw}: it would be overwritten" in line, line
    assert pw.read_text(encoding="utf-8") == "secret\n"


def test_an_unreachable_broker_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (port,) = free_ports(1)  # nothing listens there
    # the simulator's first connect gives up after SimOptions.connect_timeout_s (10 s, not a command-line
    # option): 1 s here, the same refused connects and the same error, without waiting 9 s more for it
    monkeypatch.setattr("sim.runner.SimOptions", functools.partial(SimOptions, connect_timeout_s=1.0))
    rc, out, err = _sim(capsys, "--broker", f"mqtt://127.0.0.1:{port}", "--duration", "5", "--speed", "0")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("racktwin sim: error: cannot connect to the broker"), err
    assert "Traceback" not in err


def test_the_embedded_broker_is_stopped_on_exit(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _sim(capsys, "--duration", "3", "--speed", "0", "--progress-interval-s", "0")
    assert rc == 0, err
    m = re.fullmatch(r"racktwin sim: embedded \w+ broker at mqtt://127\.0\.0\.1:(\d+)\n", out)
    assert m is not None, out
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=2):
        pass


def test_an_embedded_broker_that_fails_to_start_is_one_line_and_leaves_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mosquitto that exits on start: exit 2, one line saying so, and the broker's temporary folder
    removed (it was left behind: the error was raised without stopping the broker)."""
    monkeypatch.setenv("RACKTWIN_MOSQUITTO", "/bin/false")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rc, out, err = _sim(capsys, "--duration", "3", "--speed", "0")
    assert (rc, out) == (2, "")
    assert err.startswith("racktwin sim: error: mosquitto exited with status 1 on start"), err
    assert list(tmp_path.iterdir()) == []


def test_sigint_stops_the_run_and_a_summary_it_cannot_write_is_exit_2(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    """SIGINT stops the run as SIGTERM does (docs/sim.md); a summary that cannot be written at the end
    (its folder went away during the run) is an error, exit 2, and not reported as written."""
    folder = tmp_path / "out"
    folder.mkdir()
    summary, truth = folder / "summary.json", tmp_path / "truth.csv"
    cmd = [
        sys.executable, "-m", "sim", "--broker", mosquitto.url, "--speed", "20", "--duration", "3600",
        "--truth-log", str(truth), "--summary", str(summary), "--progress-interval-s", "0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        waited = 0.0
        while not (truth.exists() and len(truth.read_text(encoding="utf-8").splitlines()) > 20):
            assert proc.poll() is None, proc.communicate()[1]
            assert waited < 60.0
            time.sleep(0.1)
            waited += 0.1
        folder.rmdir()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    assert "racktwin sim: stopped by SIGINT after" in err and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"racktwin sim: error: --summary {summary}: cannot write the summary"), err
    assert not any(line.strip().startswith("summary:") for line in lines), err
    assert len(_rows(truth)) > 20  # the truth log is kept, flushed


def test_the_help_gives_the_ranges_it_enforces(capsys: pytest.CaptureFixture[str]) -> None:
    """--telemetry-period-s (0.01..3600) and --seed (>= 0) were refused outside ranges the help and
    docs/sim.md did not give."""
    assert main(["sim", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "publishing period in site seconds, 0.01..3600" in text
    assert "the plant and its sensors, >= 0" in text
