"""What an operator gets wrong on the command line, and what racktwin must answer: one line naming the
file, the key and what is expected, exit status 2 (``UserError``), before anything runs; never a
traceback, and never a run whose results a nonsense value would make misleading."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE = EXAMPLES / "supernode-512.toml"


def one_error(capsys: pytest.CaptureFixture[str], rc: int, command: str) -> str:
    """The one error line of a refused command (warnings about the scenario may come before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if ": warning: " not in line]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"racktwin {command}: error: "), err
    return lines[0]


def variant(tmp_path: Path, example: str, old: str, new: str) -> Path:
    """A copy of ``examples/<example>`` under ``tmp_path`` with ``old`` replaced by ``new`` (once);
    the site spec it names is the example's, by absolute path."""
    text = (EXAMPLES / example).read_text(encoding="utf-8")
    assert old in text, old
    text = text.replace(old, new, 1).replace('site = "supernode-512.toml"', f'site = "{SITE}"', 1)
    path = tmp_path / example
    path.write_text(text, encoding="utf-8")
    return path


def agent_config(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "agent.toml"
    body = [f'site = "{SITE}"', f'journal.path = "{tmp_path / "journal.sqlite"}"', *lines]
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    return path


# ---- broker URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mqtt://[::1:1883", "not a URL: 'mqtt://[::1:1883' (Invalid IPv6 URL)"),  # was a ValueError traceback
        ("mqtt://[zz]:1883", "not a URL: 'mqtt://[zz]:1883'"),
        ("mqtt://bad host:1883", "bad host 'bad host'"),  # was accepted: the agent retried a DNS error for ever
        ("mqtt://broker%201:1883", "bad host 'broker%201'"),
        # was accepted: the agent logged the resolver's UnicodeError traceback at every reconnect
        ("mqtt://broker..example:1883", "bad host 'broker..example'"),
        ("mqtt://[fe80::1%25]:1883", "no IPv6 zone after its '%25'"),
    ],
)
def test_a_malformed_broker_url_is_one_line_in_the_config_and_the_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, words: str
) -> None:
    cfg = agent_config(tmp_path, "[broker]", f'url = "{url}"')
    line = one_error(capsys, main(["agent", "--check-config", str(cfg)]), "agent")
    assert f"{cfg}: broker.url: " in line and words in line, line
    line = one_error(capsys, main(["sim", "--broker", url, "--duration", "5", "--speed", "0"]), "sim")
    assert "--broker: " in line and words in line, line
    line = one_error(capsys, main(["demo", "--broker", url, "--minutes", "1", "--out", str(tmp_path)]), "demo")
    assert "--broker: " in line and words in line, line


@pytest.mark.parametrize(
    "url",
    [
        "mqtt://[::1]:1883",
        "mqtt://broker_1.local:1883",
        "mqtts://10.0.0.5",
        "mqtt://BROKER.Example:1883",
        "mqtt://[fe80::1%eth0]:1883",  # a link-local address with its zone id
        "mqtt://[fe80::1%25eth0]:1883",  # the same as RFC 6874 writes it (%25: '%' URL-encoded)
        "mqtt://bröker.example:1883",  # an internationalized name (connects as xn--brker-kua.example)
    ],
)
def test_broker_urls_with_ipv6_container_names_and_default_ports_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    cfg = agent_config(tmp_path, "[broker]", f'url = "{url}"')
    assert main(["agent", "--check-config", str(cfg)]) == 0
    assert ": OK" in capsys.readouterr().out


# ---- telemetry further apart than the agent's deadline ----------------------------------------------


def test_evaluate_refuses_telemetry_further_apart_than_the_agents_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Readings every 120 s against the agent's 30-s telemetry deadline left every rack stale, at
    fail-safe caps: the racktwin policy's result showed a 14% throughput loss that was only that."""
    scen = variant(tmp_path, "day-nominal.toml", "telemetry_period_s = 1.0", "telemetry_period_s = 120.0")
    out = tmp_path / "out"
    args = ["evaluate", "--scenario", str(scen), "--duration", "60", "--jobs", "1", "--quiet", "--out", str(out)]
    line = one_error(capsys, main([*args, "--policy", "racktwin"]), "evaluate")
    assert f"{scen}: telemetry_period_s: 120 s is longer than the agent's telemetry_deadline_s (30 s" in line, line
    assert "--control telemetry_deadline_s=S" in line
    assert not (out / "metrics.json").exists()  # nothing ran
    # a deadline that covers the period, or policies that do not go to fail-safe, run
    relaxed = ["--control", "telemetry_deadline_s=150", "--control", "command_ttl_s=150"]
    assert main([*args, "--policy", "greedy", *relaxed]) == 0
    assert main([*args, "--policy", "baseline"]) == 0


def test_demo_refuses_telemetry_further_apart_than_the_agents_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scen = variant(tmp_path, "day-demo.toml", "telemetry_period_s = 1.0", "telemetry_period_s = 45.0")
    rc = main(["demo", "--scenario", str(scen), "--minutes", "1", "--out", str(tmp_path / "out")])
    line = one_error(capsys, rc, "demo")
    assert f"{scen}: telemetry_period_s: 45 s is longer than the agent's telemetry_deadline_s (30 s" in line, line


# ---- the simulator's broker password file ------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\xff\xfe\x00secret\n", "not a UTF-8 text file"),  # was a UnicodeDecodeError traceback
        (b"", "the first line (the password) is empty"),  # was sent as an empty password
        (b"\n\nsecret\n", "the first line (the password) is empty"),
    ],
)
def test_sim_refuses_a_password_file_it_cannot_use_as_the_agent_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    pw = tmp_path / "sim.password"
    pw.write_bytes(content)
    args = ["sim", "--broker", "mqtt://127.0.0.1:1", "--duration", "5", "--speed", "0", "--mqtt-username", "u"]
    line = one_error(capsys, main([*args, "--mqtt-password-file", str(pw)]), "sim")
    assert f"--mqtt-password-file {pw}: {words}" in line, line


# ---- run-scenario values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("startup_s = 1e300", "phases.startup_s: must be <= 86400 s, got 1e+300"),  # was accepted: no job computed
        ("restart_delay_s = 86401.0", "phases.restart_delay_s: must be <= 86400 s, got 86401.0"),
        ("startup_s = -1.0", "phases.startup_s: must be >= 0 s, got -1.0"),
    ],
)
def test_a_job_start_or_restart_longer_than_a_day_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, words: str
) -> None:
    scen = tmp_path / "s.toml"
    scen.write_text(
        f'name = "s"\nsite = "{SITE}"\nduration_s = 600.0\n[workload]\nsource = "none"\n[phases]\n{line}\n',
        encoding="utf-8",
    )
    rc = main(["evaluate", "--scenario", str(scen), "--policy", "baseline", "--duration", "20", "--jobs", "1"])
    assert f"{scen}: {words}" in one_error(capsys, rc, "evaluate")


# ---- a racktwin file of another kind ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "given", "words"),
    [
        # were "name: unknown key; did you mean 'mode'?", "ambient_c: unknown key; did you mean 'ambient'?", ...
        (["agent", "--check-config", "{f}"], "scenario-nominal.toml", "an optimize scenario (ambient_c, "),
        (["agent", "--check-config", "{f}"], "day-nominal.toml", "a run scenario (duration_s, "),
        (["journal", "--config", "{f}"], "day-nominal.toml", "a run scenario (duration_s, "),
        (["evaluate", "--scenario", "{f}", "--duration", "60"], "scenario-nominal.toml", "an optimize scenario"),
        (["evaluate", "--scenario", "{f}", "--duration", "60"], "agent.toml", "an agent configuration (site_id, "),
        (["optimize", "{f}", "--out", "{out}"], "day-nominal.toml", "a run scenario (duration_s, "),
        (["optimize", "{f}", "--out", "{out}"], "agent.toml", "an agent configuration (site_id, "),
        (["optimize", "{f}", "--out", "{out}"], "supernode-512.toml", "a site spec (pue_target, "),
        (["twin", "steady", "--site", "{f}"], "day-nominal.toml", "a run scenario (duration_s, "),
        (["twin", "steady", "--site", "{f}"], "agent.toml", "an agent configuration (site_id, "),
    ],
)
def test_a_file_of_another_kind_is_named_as_that_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], given: str, words: str
) -> None:
    f = EXAMPLES / given
    argv = [a.format(f=f, out=tmp_path / "out") for a in args]
    line = one_error(capsys, main(argv), " ".join(argv[:2]) if argv[0] == "twin" else argv[0])
    assert f"{f}: this looks like {words}" in line, line
    assert "unknown key" not in line
    assert not (tmp_path / "out").exists()


# ---- an empty path ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["journal", "--journal", ""], "--journal"),  # was "journal .: not a file"
        (["journal", "--config", ""], "--config"),  # was ": is a directory, expected a TOML file"
        (["agent", "--config", ""], "--config"),
        (["agent", "--check-config", ""], "--check-config"),
        (["twin", "steady", "--site", ""], "--site"),  # was ".: is a directory, expected a TOML file"
        (["twin", "sweep-supply", "--site", ""], "--site"),
        (["fit-thermal", ""], "FILE.csv"),
        (["fit-power", ""], "FILE.csv"),
        (["evaluate", "--scenario", ""], "--scenario"),
        (["evaluate", "--scenario", str(EXAMPLES / "day-nominal.toml"), "--out", ""], "--out"),
        (["optimize", ""], "SCENARIO.toml"),  # the positional named as its --help names it
        (["optimize", str(EXAMPLES / "scenario-nominal.toml"), "--out", ""], "--out"),
        (["demo", "--out", ""], "--out"),  # ran the demo and wrote its files into the current folder
        (["demo", "--scenario", ""], "--scenario"),
        (["sim", "--site", ""], "--site"),
        (["sim", "--scenario", ""], "--scenario"),
        (["sim", "--truth-log", ""], "--truth-log"),
        (["sim", "--summary", ""], "--summary"),
        (["sim", "--mqtt-password-file", ""], "--mqtt-password-file"),  # was ": Is a directory"
        (["sim", "--mqtt-ca-file", ""], "--mqtt-ca-file"),  # was "--mqtt-ca-file : no such file"
        (["sim", "--mqtt-cert-file", ""], "--mqtt-cert-file"),
        (["sim", "--mqtt-key-file", ""], "--mqtt-key-file"),
    ],
)
def test_an_empty_path_is_refused_as_such_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], option: str
) -> None:
    """An empty file or folder option (an unset shell variable: ``--journal "$J"``) was read as the
    current folder: "journal .: not a file", ".: is a directory", or a demo writing into it."""
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    command = " ".join(args[:2]) if args[0] == "twin" else args[0]
    assert (
        err.strip().splitlines()[-1]
        == f"racktwin {command}: error: argument {option}: expected a non-empty path, got ''"
    )
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


# ---- optimize ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf", "1e9"])
def test_optimize_takes_the_time_limit_its_scenario_would(limit: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--time-limit` has the bounds of the scenario's `[solver] time_limit_s`, (0, 3600] s (1e9 was
    taken: a solve that never gives up)."""
    rc = main(["optimize", str(EXAMPLES / "scenario-nominal.toml"), "--time-limit", limit, "--quiet"])
    line = one_error(capsys, rc, "optimize")
    assert f"--time-limit must be within (0, 3600] seconds, got {float(limit):g}" in line, line


@pytest.mark.parametrize("broker", [(), ("--broker", "mqtt://127.0.0.1:1")])
def test_sim_refuses_an_empty_client_id_as_the_agent_does(
    broker: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["sim", "--duration", "5", "--speed", "0", "--mqtt-client-id", " ", *broker])
    assert "--mqtt-client-id: empty: give an id" in one_error(capsys, rc, "sim")


def test_a_password_file_saved_with_a_byte_order_mark_gives_the_password_without_it(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a byte-order mark: it is no part of the password (it was sent
    as its first character, and the broker refused the login)."""
    import argparse

    from agent.config import load_config
    from agent.mqtt_args import add_mqtt_arguments, mqtt_options_from_args

    pw = tmp_path / "agent.password"
    pw.write_bytes("\ufeffs3cret\n".encode())
    cfg = agent_config(tmp_path, "[broker]", 'username = "agent"', f'password_file = "{pw}"')
    assert load_config(cfg).config.broker.resolved_password() == "s3cret"
    parser = argparse.ArgumentParser()
    add_mqtt_arguments(parser)
    ns = parser.parse_args(["--broker", "mqtt://127.0.0.1:1", "--mqtt-username", "u", "--mqtt-password-file", str(pw)])
    options = mqtt_options_from_args(ns)
    assert options is not None and options.password == "s3cret"
