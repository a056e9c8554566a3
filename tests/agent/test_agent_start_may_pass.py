"""``racktwin agent``'s HTTP endpoint start errors: those that may pass by themselves at boot (the port
still held by the previous agent, EADDRINUSE; the name service not answering yet, EAI_AGAIN) exit with
a status the shipped systemd unit restarts; a configuration error (a host name that does not exist,
EAI_NONAME) exits 2, which it does not (docs/agent.md, "Deploying"; agent/commands/agent_cmd.py).

The agent runs as a process, on examples/agent.toml with its journal, broker and HTTP endpoint moved
by environment overrides; the broker is never reached (the HTTP endpoint fails first). The resolver's
answers come from ``socket.getaddrinfo`` replaced in that process (the operating system's, not a mock
of anything of racktwin's); the taken port is a real listening socket.
"""

from __future__ import annotations

import configparser
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.broker import free_ports

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "agent.toml"
UNIT = REPO / "deploy" / "systemd" / "racktwin-agent.service"
HOST = "metrics.racktwin.test"  # answered by the replaced resolver below, never by a real one

#: ``racktwin agent`` with ``socket.getaddrinfo`` answering ``HOST`` with the gaierror of errno argv[1]
AGENT_WITH_RESOLVER = """
import socket, sys
real, code = socket.getaddrinfo, int(sys.argv.pop(1))
def getaddrinfo(host, *args, **kwargs):
    if host == HOST:
        raise socket.gaierror(code, {socket.EAI_AGAIN: "Temporary failure in name resolution",
                                     socket.EAI_NONAME: "Name or service not known"}[code])
    return real(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo
from agent.cli import main
sys.exit(main(sys.argv[1:]))
""".replace("HOST", repr(HOST))


def run_agent(
    tmp_path: Path, host: str, port: int, gaierror: int = socket.EAI_AGAIN
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RACKTWIN_JOURNAL_PATH": str(tmp_path / "journal.sqlite"),
        "RACKTWIN_BROKER_URL": f"mqtt://127.0.0.1:{free_ports(1)[0]}",
        "RACKTWIN_HTTP_HOST": host,
        "RACKTWIN_HTTP_PORT": str(port),
    }
    return subprocess.run(
        [sys.executable, "-c", AGENT_WITH_RESOLVER, str(gaierror), "agent", "--config", str(CONFIG)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )


def restarted_by_the_unit(status: int) -> bool:
    """systemd.service(5): Restart=on-failure restarts after an unclean exit status, one that is not 0
    or in SuccessExitStatus=, unless it is in RestartPreventExitStatus=."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(UNIT)
    svc = unit["Service"]
    assert svc["Restart"] == "on-failure"
    clean = {"0", *svc.get("SuccessExitStatus", "").split()}
    return str(status) not in clean and str(status) not in svc.get("RestartPreventExitStatus", "").split()


def test_a_port_still_held_exits_with_a_status_the_unit_restarts(tmp_path: Path) -> None:
    """A previous agent still stopping holds the port: it was exit 2, which the unit never restarts, so
    the agent stayed down after a quick restart. Failed on the old agent_cmd.py (exit 2)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_agent(tmp_path, "127.0.0.1", port)
    assert result.returncode == 75, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"racktwin agent: error: {CONFIG}: http.port {port} (127.0.0.1): "), result.stderr
    assert "address already in use" in last and last.endswith("(may pass: exit status 75)"), last
    assert "Traceback" not in result.stderr
    assert restarted_by_the_unit(result.returncode)


def test_a_name_service_not_answering_yet_exits_with_a_status_the_unit_restarts(tmp_path: Path) -> None:
    """At boot the name service may not answer yet (EAI_AGAIN): it was exit 2, a configuration error
    the unit does not restart. Failed on the old agent_cmd.py."""
    result = run_agent(tmp_path, HOST, free_ports(1)[0], socket.EAI_AGAIN)
    assert result.returncode == 75, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"racktwin agent: error: {CONFIG}: http.host {HOST!r}: Temporary failure in name resolution"
        " (may pass: exit status 75)"
    )
    assert restarted_by_the_unit(result.returncode)


def test_a_host_name_that_does_not_exist_is_a_configuration_error_the_unit_does_not_restart(tmp_path: Path) -> None:
    result = run_agent(tmp_path, HOST, free_ports(1)[0], socket.EAI_NONAME)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"racktwin agent: error: {CONFIG}: http.host {HOST!r}: Name or service not known"
    )
    assert not restarted_by_the_unit(result.returncode)
