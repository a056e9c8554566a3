"""``racktwin sim``: problems a user can fix (an output path, a broker URL, a certificate file, an
option) are one line on stderr naming the option and what is wrong, exit status 2, before the run."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from mqtt_testing import TlsFiles
from sim_testing import scenario

from agent.broker import EmbeddedBroker
from agent.bus import MqttOptions
from agent.cli import main
from sim.runner import SimOptions, Simulator

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "sim-trace.toml"


def sim(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``racktwin sim`` on the trace scenario for 5 s as fast as possible: (exit status, stderr)."""
    rc = main(["sim", "--scenario", str(SCENARIO), "--duration", "5", "--speed", "0", *args])
    return rc, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("racktwin sim: error: "), err
    return lines[0]


@pytest.mark.parametrize("option", ["--summary", "--truth-log"])
def test_an_output_path_that_is_a_pipe_is_refused_and_kept(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a writer that opens the pipe does not hang
    try:
        rc, err = sim(capsys, option, str(fifo))
    finally:
        os.close(reader)
    assert rc == 2
    assert f"{option} {fifo}: exists and is not a regular file" in one_error_line(err)
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # not replaced by a regular file


@pytest.mark.parametrize(("option", "name"), [("--summary", "s.json"), ("--truth-log", "t.csv")])
def test_an_output_path_below_a_file_is_refused_before_the_run(
    option: str, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notadir = tmp_path / "notadir"
    notadir.write_text("x\n", encoding="utf-8")
    rc, err = sim(capsys, option, str(notadir / name))
    assert rc == 2
    assert f"{option} {notadir / name}: the folder {notadir} does not exist" in one_error_line(err)
    assert "scenario" not in err  # refused before the run started


def test_a_folder_where_the_summarys_temporary_goes_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary is written through SUMMARY.tmp: a folder there failed the write after the whole run."""
    summary, truth = tmp_path / "s.json", tmp_path / "t.csv"
    (tmp_path / "s.json.tmp").mkdir()
    rc, err = sim(capsys, "--summary", str(summary), "--truth-log", str(truth))
    assert rc == 2
    assert f"--summary {summary}.tmp: is a folder (the temporary file s.json is written through" in one_error_line(err)
    assert not truth.exists() and not summary.exists()  # refused before the run started


def test_a_summary_name_too_long_for_its_temporary_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / ("s" * (os.pathconf(tmp_path, "PC_NAME_MAX") - 2))  # fits; NAME.tmp does not
    rc, err = sim(capsys, "--summary", str(summary))
    assert rc == 2
    assert f"--summary {summary}: the name is too long for the temporary file" in one_error_line(err)
    assert "scenario" not in err  # refused before the run started


async def test_the_summary_is_never_written_over_a_pipe_and_the_failure_is_kept(
    mosquitto: EmbeddedBroker, tmp_path: Path
) -> None:
    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)
    options = SimOptions(scenario=scenario(duration_s=3.0), mqtt=mosquitto.options(), speed=0.0, summary_path=fifo)
    simulator = Simulator(options)
    summary = await simulator.run()
    assert summary.stopped_by == "duration"
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert simulator.summary_write_error is not None and "not a regular file" in simulator.summary_write_error


def _junk(tmp_path: Path) -> str:
    path = tmp_path / "junk.txt"
    path.write_text("this is not a certificate\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("files", "culprit", "what"),
    [
        ({"--mqtt-ca-file": "junk"}, "--mqtt-ca-file", "not a PEM certificate"),
        ({"--mqtt-cert-file": "junk"}, "--mqtt-cert-file", "not a PEM certificate"),
        ({"--mqtt-cert-file": "cert"}, "--mqtt-cert-file", "holds no private key"),
        ({"--mqtt-cert-file": "cert", "--mqtt-key-file": "junk"}, "--mqtt-key-file", "not a PEM private key"),
        ({"--mqtt-cert-file": "cert", "--mqtt-key-file": "other_key"}, "--mqtt-key-file", "does not match"),
    ],
)
def test_a_certificate_or_key_file_that_is_not_usable_is_one_line(
    files: dict[str, str],
    culprit: str,
    what: str,
    tls_files: TlsFiles,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = {
        "junk": _junk(tmp_path),
        "cert": tls_files.cert_file,
        "other_key": str(Path(tls_files.ca_file).with_name("ca.key")),  # the CA's key, not the certificate's
    }
    args = [arg for option, name in files.items() for arg in (option, paths[name])]
    rc, err = sim(capsys, "--broker", "mqtts://127.0.0.1:1", *args)
    assert rc == 2
    line = one_error_line(err)
    assert f"{culprit} {paths[files[culprit]]}: {what}" in line, line


def test_tls_file_errors_name_the_file_for_every_caller(tls_files: TlsFiles, tmp_path: Path) -> None:
    """``MqttOptions.ssl_context`` (also what the agent's [broker] TLS settings go through)."""
    from agent.bus import TlsFileError

    junk = _junk(tmp_path)
    with pytest.raises(TlsFileError) as caught:
        MqttOptions(ca_file=junk).ssl_context()
    assert caught.value.field == "ca_file" and str(caught.value).startswith(f"TLS CA file {junk}: not a PEM")
    with pytest.raises(TlsFileError) as caught:
        MqttOptions(cert_file=tls_files.cert_file, key_file=junk).ssl_context()
    assert caught.value.field == "key_file" and caught.value.path == junk
    # good files still make a context
    good = MqttOptions(ca_file=tls_files.ca_file, cert_file=tls_files.cert_file, key_file=tls_files.key_file)
    assert good.ssl_context() is not None


@pytest.mark.parametrize("url", ["mqtt://127.0.0.1:0", "mqtts://127.0.0.1:0"])
def test_port_zero_is_not_the_default_port(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="port"):
        MqttOptions.from_url(url)
    rc, err = sim(capsys, "--broker", url)
    assert rc == 2
    line = one_error_line(err)
    assert "--broker: " in line and repr(url) in line and "1..65535" in line


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_progress_interval_must_be_a_finite_number_of_seconds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = sim(capsys, "--progress-interval-s", value)
    assert rc == 2
    assert f"--progress-interval-s must be positive, or 0 for no progress lines, got {value}" in one_error_line(err)


@pytest.mark.parametrize(
    "args",
    [
        ["--mqtt-password-file", "/nonexistent"],
        ["--mqtt-username", "agent"],
        ["--mqtt-cert-file", "junk"],
        ["--mqtt-ca-file", "junk"],
        ["--mqtt-tls-insecure"],
    ],
)
def test_credentials_and_tls_options_need_a_broker(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = sim(capsys, *args)
    assert rc == 2
    assert f"{args[0]} needs --broker (the embedded broker takes no credentials" in one_error_line(err)


# ---- outputs that would overwrite an input or each other ----------------------------------------


def _copies(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The trace scenario, its site spec and its trace, copied to ``tmp_path`` (the scenario names
    the other two by relative path)."""
    examples = SCENARIO.parent
    paths = []
    for name in (SCENARIO.name, "supernode-512.toml", "sim-trace.csv"):
        (tmp_path / name).write_bytes((examples / name).read_bytes())
        paths.append(tmp_path / name)
    return paths[0], paths[1], paths[2]


def _sim_on(capsys: pytest.CaptureFixture[str], scenario_path: Path, *args: str) -> tuple[int, str]:
    rc = main(["sim", "--scenario", str(scenario_path), "--duration", "5", "--speed", "0", *args])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("option", ["--truth-log", "--summary"])
@pytest.mark.parametrize("victim", ["scenario", "site", "trace"])
def test_an_output_that_is_an_input_file_is_refused_and_the_input_kept(
    option: str, victim: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--truth-log SCENARIO.toml` used to replace the scenario with the CSV (exit 0)."""
    scenario_path, site_path, trace_path = _copies(tmp_path)
    target = {"scenario": scenario_path, "site": site_path, "trace": trace_path}[victim]
    before = target.read_bytes()
    rc, err = _sim_on(capsys, scenario_path, option, str(target))
    assert rc == 2
    line = one_error_line(err)
    what = "the scenario (--scenario" if victim == "scenario" else f"a file the scenario reads ({target})"
    assert line.startswith(f"racktwin sim: error: {option} {target}: is {what}"), line
    assert line.endswith("it would be overwritten; write it elsewhere"), line
    assert target.read_bytes() == before


def test_an_output_that_is_the_site_given_with_site_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario_path, site_path, _ = _copies(tmp_path)
    before = site_path.read_bytes()
    # another spelling of the same file, and the site given with --site
    spelt = tmp_path / "." / site_path.name
    rc, err = _sim_on(capsys, scenario_path, "--site", str(site_path), "--summary", str(spelt))
    assert rc == 2
    line = one_error_line(err)
    assert f"--summary {spelt}: is the site spec (--site {site_path})" in line, line
    assert site_path.read_bytes() == before


def test_the_site_spec_of_the_scenario_is_kept_when_supernodes_scale_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--supernodes` without `--site` reads the scenario's site spec apart: it is still an input."""
    scenario_path, site_path, _ = _copies(tmp_path)
    before = site_path.read_bytes()
    rc, err = _sim_on(capsys, scenario_path, "--supernodes", "1", "--truth-log", str(site_path))
    assert rc == 2
    assert f"--truth-log {site_path}: is a file the scenario reads ({site_path})" in one_error_line(err)
    assert site_path.read_bytes() == before


@pytest.mark.parametrize(("args", "cards"), [((), 2048), (("--supernodes", "1"), 512), (("--supernodes", "2"), 1024)])
def test_supernodes_given_on_the_command_line_win_over_the_scenarios(
    args: tuple[str, ...], cards: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/sim-2048.toml sets `supernodes = 4`; `--supernodes N` scales the site to N instead
    (it used to be scaled to N and then to the file's 4 again: 2,048 cards whatever N said)."""
    examples = SCENARIO.parent
    for name in ("sim-2048.toml", "supernode-512.toml"):
        (tmp_path / name).write_bytes((examples / name).read_bytes())
    summary = tmp_path / "summary.json"
    rc, err = _sim_on(capsys, tmp_path / "sim-2048.toml", "--summary", str(summary), *args)
    assert rc == 0, err
    assert json.loads(summary.read_text())["n_cards"] == cards
    assert f"{cards} cards" in err


def test_a_hard_link_to_an_input_is_the_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario_path, _, _ = _copies(tmp_path)
    link = tmp_path / "link.csv"
    os.link(scenario_path, link)
    rc, err = _sim_on(capsys, scenario_path, "--truth-log", str(link))
    assert rc == 2 and f"--truth-log {link}: is the scenario (--scenario {scenario_path})" in one_error_line(err)


def test_the_truth_log_and_the_summary_must_be_different_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--truth-log same.out --summary same.out` left only the summary, reported as a 6-row truth log."""
    same = tmp_path / "same.out"
    rc, err = sim(capsys, "--truth-log", str(same), "--summary", str(same))
    assert rc == 2
    assert f"--summary {same}: is the same file as --truth-log {same}" in one_error_line(err)
    assert not same.exists()


# ---- options checked before the embedded broker starts ----------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--site-id", "rack"], "--site-id: site 'rack' cannot be a topic level"),
        (["--site-id", "a/b"], "--site-id: site 'a/b' cannot be a topic level"),
        (["--start-epoch-s", "-1"], "--start-epoch-s must be epoch seconds within 0..1e+10, got -1"),
        (["--start-epoch-s", "nan"], "--start-epoch-s must be epoch seconds within 0..1e+10, got nan"),
    ],
)
def test_site_id_and_start_epoch_are_checked_before_the_broker_starts(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["sim", "--scenario", str(SCENARIO), "--duration", "5", "--speed", "0", *args])
    out, err = capsys.readouterr()
    assert rc == 2
    assert words in one_error_line(err)
    assert out == ""  # no embedded broker was started (its URL would be on stdout)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("tcp://127.0.0.1:1", "must start with mqtt:// or mqtts://"),
        ("127.0.0.1:1", "must start with mqtt:// or mqtts://"),
        ("mqtt://u:p@127.0.0.1:1", "no user name or password in the URL"),
        ("mqtt://u@127.0.0.1:1", "no user name or password in the URL"),
        ("mqtts://127.0.0.1:1/path", "path not allowed"),
        ("mqtt://127.0.0.1:1?x=1", "query or fragment not allowed"),
        ("mqtt://:1", "no host"),
    ],
)
def test_a_broker_url_the_agent_refuses_is_refused(url: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`racktwin sim --broker` takes the URLs the agent's broker.url takes."""
    rc, err = sim(capsys, "--broker", url)
    assert rc == 2
    line = one_error_line(err)
    assert "--broker: " in line and repr(url) in line and words in line, line


# ---- the run's length ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_scenario", [True, False])
def test_a_duration_over_a_year_is_refused_at_once(with_scenario: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """`--duration 1e12` used to reach the workload generator (a MemoryError traceback) or run for ever."""
    args = ["sim", "--duration", "1e12", "--speed", "0"]
    rc = main([*args, "--scenario", str(SCENARIO)] if with_scenario else args)
    err = capsys.readouterr().err
    assert rc == 2
    line = one_error_line(err)
    assert "1e+12" in line and "at most 31536000 s (365 days)" in line, line


def test_the_help_gives_the_defaults_and_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "> 0, or 0: none (default 5)" in text
    assert "1..10000" in text
    assert "at most 31536000 (365 days)" in text
