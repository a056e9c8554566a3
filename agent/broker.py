"""An embedded MQTT broker for the demo, the simulator and the tests.

``EmbeddedBroker`` runs mosquitto when it is installed (a temporary config, a listener on a free
loopback port, started as a child process, ready once it answers an MQTT CONNECT on that port and
its log says that it is the one listening, stopped on exit)
and otherwise amqtt, the pure-Python broker from PyPI (``pip install 'amqtt>=0.11'``, the ``[broker]``
extra), either as a child process (default) or in a thread of this process. Neither available:
:class:`BrokerUnavailable` with what to install. It is a sync and an async context manager::

    with EmbeddedBroker() as broker:                 # or: async with EmbeddedBroker() as broker:
        options = broker.options()                   # MqttOptions for agent.bus.Bus
        print(broker.backend, broker.url)            # "mosquitto", "mqtt://127.0.0.1:40123"

Security settings (password file, ACL file, TLS listener) are passed to mosquitto only; the amqtt
fallback is for anonymous loopback use (demo, simulator) and refuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import importlib.util
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.mqtt_options import MqttOptions

__all__ = [
    "BrokerTls",
    "BrokerUnavailable",
    "EmbeddedBroker",
    "find_mosquitto",
    "free_port",
    "free_ports",
    "mqtt_answers",
]

log = logging.getLogger("racktwin.broker")

Backend = Literal["auto", "mosquitto", "amqtt"]
AmqttMode = Literal["subprocess", "thread"]

#: Set to a mosquitto binary to use that one (or to "" to ignore an installed mosquitto).
MOSQUITTO_ENV = "RACKTWIN_MOSQUITTO"
_MOSQUITTO_PLACES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto")


_MOSQUITTO_READY = re.compile(r"mosquitto version \S+ running")
_AMQTT_READY = re.compile(r"racktwin-amqtt-ready")


class BrokerUnavailable(RuntimeError):
    """No broker could be started (none installed, or it failed to start: the message says why)."""


def find_mosquitto() -> str | None:
    """The mosquitto binary: $RACKTWIN_MOSQUITTO, then PATH, then the usual sbin folders."""
    env = os.environ.get(MOSQUITTO_ENV)
    if env is not None:
        return env or None
    found = shutil.which("mosquitto")
    if found:
        return found
    return next((p for p in _MOSQUITTO_PLACES if os.access(p, os.X_OK)), None)


def amqtt_available() -> bool:
    return importlib.util.find_spec("amqtt") is not None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` different TCP ports that are free on ``host`` right now. The sockets are held until all
    are picked: two calls of :func:`free_port` in a row may return the same port."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


_PROBE_CONNECT = bytes(
    [0x10, 26, 0, 4, *b"MQTT", 4, 0x02, 0, 10, 0, 14, *b"racktwin-probe"]
)  # MQTT 3.1.1 CONNECT, clean session, keepalive 10 s, client id "racktwin-probe"


def mqtt_answers(host: str, port: int, *, tls: bool = False, timeout_s: float = 0.5) -> bool:
    """True when an MQTT broker answers a CONNECT on host:port with a CONNACK (accepted or not)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            sock: socket.socket = raw
            if tls:  # readiness only: the certificate is checked by the real clients
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                sock = ctx.wrap_socket(raw, server_hostname=host)
            sock.sendall(_PROBE_CONNECT)
            answer = sock.recv(4)
            if answer[:1] == b"\x20" and answer[3:4] == b"\x00":
                sock.sendall(b"\xe0\x00")  # DISCONNECT
            return answer[:1] == b"\x20"
    except (OSError, ssl.SSLError):
        return False


def _user_line() -> str:
    """Run mosquitto as the invoking user: started as root it would otherwise switch to the
    'mosquitto' user, which cannot read our temporary files. Ignored when not started as root."""
    try:
        return f"user {getpass.getuser()}"
    except (KeyError, OSError):
        return ""


@dataclass(frozen=True)
class BrokerTls:
    """A TLS listener for mosquitto: CA, server certificate and key; optionally require client certs."""

    ca_file: str
    cert_file: str
    key_file: str
    require_certificate: bool = False


_AMQTT_MAIN = r"""
import asyncio, logging, signal, sys
from amqtt.broker import Broker

async def main(host: str, port: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    broker = Broker({
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    })
    await broker.start()
    print("racktwin-amqtt-ready", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _amqtt_config(host: str, port: int) -> dict[str, Any]:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


class _AmqttThread:
    """amqtt running in its own event loop on a daemon thread of this process."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"amqtt-{port}", daemon=True)

    def start(self, timeout_s: float) -> None:
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise BrokerUnavailable(f"amqtt did not start within {timeout_s} s")
        if self._error is not None:
            raise BrokerUnavailable(f"amqtt failed to start on {self.host}:{self.port}: {self._error}")

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        from amqtt.broker import Broker

        for name in ("amqtt", "transitions"):  # amqtt logs every connection at INFO
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            broker = Broker(_amqtt_config(self.host, self.port))
            await broker.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        await self._stop.wait()
        await broker.shutdown()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)


class EmbeddedBroker:
    """A broker on a free loopback port for as long as the context lasts (see the module docstring).

    ``backend``: "auto" (mosquitto if installed, else amqtt), "mosquitto" or "amqtt" (forces the
    fallback). ``port``: None picks a free port; once started, the broker keeps its port across
    :meth:`stop`/:meth:`start` and :meth:`restart`.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        backend: Backend = "auto",
        amqtt_mode: AmqttMode = "subprocess",
        mosquitto_path: str | None = None,
        password_file: str | Path | None = None,
        acl_file: str | Path | None = None,
        allow_anonymous: bool | None = None,
        tls: BrokerTls | None = None,
        max_queued_messages: int = 10_000,
        extra_config: str = "",
        startup_timeout_s: float = 15.0,
    ) -> None:
        self.host = host
        self._fixed_port = port
        self.port: int = port or 0
        self._requested = backend
        self.amqtt_mode = amqtt_mode
        self._mosquitto_path = mosquitto_path
        self.password_file = None if password_file is None else str(password_file)
        self.acl_file = None if acl_file is None else str(acl_file)
        self.allow_anonymous = allow_anonymous if allow_anonymous is not None else password_file is None
        self.tls = tls
        self.max_queued_messages = max_queued_messages
        self.extra_config = extra_config
        self.startup_timeout_s = startup_timeout_s
        self.backend: Literal["mosquitto", "amqtt"] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: _AmqttThread | None = None
        self._dir: Path | None = None
        self._starting = "broker"

    # ---- what is running ------------------------------------------------------------------
    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self._thread is not None

    @property
    def pid(self) -> int | None:
        """The broker process's id while one runs: mosquitto, or amqtt in its subprocess mode (None for
        amqtt on a thread of this process, or a stopped broker)."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        return None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return None if self._dir is None else self._dir / "broker.log"

    def log_text(self) -> str:
        """The broker's log so far (mosquitto, or amqtt as a subprocess)."""
        p = self.log_path
        return p.read_text(encoding="utf-8", errors="replace") if p is not None and p.exists() else ""

    def options(self, **overrides: Any) -> MqttOptions:
        """Client options for this broker (add ``username=``, ``password=``, ``ca_file=`` ...)."""
        kw: dict[str, Any] = {"host": self.host, "port": self.port, "tls": self.tls is not None}
        kw.update(overrides)
        return MqttOptions(**kw)

    def _resolve_backend(self) -> tuple[Literal["mosquitto", "amqtt"], str | None]:
        secured = self.password_file is not None or self.acl_file is not None or self.tls is not None
        mosquitto = self._mosquitto_path or find_mosquitto()
        if self._requested in ("auto", "mosquitto") and mosquitto is not None:
            return "mosquitto", mosquitto
        if self._requested == "mosquitto":
            raise BrokerUnavailable(
                "mosquitto is not installed (apt-get install mosquitto, or set RACKTWIN_MOSQUITTO=/path/to/mosquitto)"
            )
        if secured:
            raise BrokerUnavailable(
                "password files, ACLs and TLS need mosquitto (apt-get install mosquitto); "
                "the amqtt fallback runs anonymous loopback brokers only"
            )
        if not amqtt_available():
            raise BrokerUnavailable(
                "no MQTT broker available: install mosquitto (apt-get install mosquitto) or the pure-Python "
                "fallback (pip install 'amqtt>=0.11', the [broker] extra), or pass --broker URL of a running broker"
            )
        return "amqtt", None

    # ---- start / stop ---------------------------------------------------------------------
    def start(self) -> EmbeddedBroker:
        """Start and wait until the broker accepts connections. Raises :class:`BrokerUnavailable`."""
        if self.running:
            return self
        backend, binary = self._resolve_backend()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="racktwin-broker-"))
        attempts = 1 if self._fixed_port else 3  # a picked free port can be taken meanwhile: pick again
        last_error = ""
        for _ in range(attempts):
            self.port = self._fixed_port or free_port(self.host)
            self._starting = backend
            try:
                if backend == "mosquitto":
                    assert binary is not None
                    self._start_mosquitto(binary)
                elif self.amqtt_mode == "thread":
                    self._thread = _AmqttThread(self.host, self.port)
                    self._thread.start(self.startup_timeout_s)
                    self._wait_ready(None)
                else:
                    self._start_amqtt_subprocess()
                self.backend = backend
                self._fixed_port = self.port  # a later start() or restart() uses the same port
                log.info("embedded %s broker on %s", backend, self.url)
                return self
            except BrokerUnavailable as exc:
                last_error = str(exc)
                self._kill()
        raise BrokerUnavailable(last_error)

    def _start_mosquitto(self, binary: str) -> None:
        assert self._dir is not None
        conf = self._dir / "mosquitto.conf"
        conf.write_text(self._mosquitto_config(), encoding="utf-8")
        (self._dir / "broker.log").write_bytes(b"")
        self._proc = subprocess.Popen(
            [binary, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self._dir / "stderr.log", "ab"),  # noqa: SIM115 - the child keeps it
            start_new_session=True,
        )
        self._wait_ready(_MOSQUITTO_READY)

    def _mosquitto_config(self) -> str:
        assert self._dir is not None
        lines = [
            "# written by racktwin (agent/broker.py) for an embedded broker",
            f"listener {self.port} {self.host}",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
        ]
        if self.tls is not None:
            lines += [
                f"cafile {self.tls.ca_file}",
                f"certfile {self.tls.cert_file}",
                f"keyfile {self.tls.key_file}",
                f"require_certificate {'true' if self.tls.require_certificate else 'false'}",
                "tls_version tlsv1.2",
            ]
        if self.password_file is not None:
            lines.append(f"password_file {self.password_file}")
        if self.acl_file is not None:
            lines.append(f"acl_file {self.acl_file}")
        lines += [
            "persistence false",
            f"max_queued_messages {self.max_queued_messages}",
            "set_tcp_nodelay true",
            f"log_dest file {self._dir / 'broker.log'}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            "log_timestamp true",
            _user_line(),
            self.extra_config,
        ]
        return "\n".join(lines) + "\n"

    def _start_amqtt_subprocess(self) -> None:
        assert self._dir is not None
        (self._dir / "broker.log").write_bytes(b"")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _AMQTT_MAIN, self.host, str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self._dir / "broker.log", "ab"),  # noqa: SIM115 - the child keeps it
            start_new_session=True,
        )
        self._wait_ready(_AMQTT_READY)

    def _wait_ready(self, marker: re.Pattern[str] | None) -> None:
        """Until the broker answers MQTT on our port and, for a child process, its log says that *it*
        is the one listening (another broker already on a fixed port would answer the probe too)."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise BrokerUnavailable(
                    f"{self._requested_name()} exited with status {self._proc.returncode} on start: "
                    + self._tail_logs()
                )
            if (marker is None or marker.search(self.log_text())) and self._answers():
                return
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"{self._requested_name()} did not accept connections on {self.host}:{self.port} "
                    f"within {self.startup_timeout_s} s: " + self._tail_logs()
                )
            time.sleep(0.02)

    def _answers(self) -> bool:
        """Whether the broker answers on its port: an MQTT CONNECT gets a CONNACK; on a TLS listener that
        requires client certificates (the probe has none to show: the handshake fails) a TCP connection
        is accepted, the log's marker having said that it is our broker that listens."""
        if self.tls is not None and self.tls.require_certificate:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return True
            except OSError:
                return False
        return mqtt_answers(self.host, self.port, tls=self.tls is not None)

    def _requested_name(self) -> str:
        return self._starting

    def _tail_logs(self) -> str:
        if self._dir is None:
            return ""
        text = ""
        for name in ("stderr.log", "broker.log"):
            p = self._dir / name
            if p.exists():
                text += p.read_text(encoding="utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-6:]) or "(no log output)"

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()

    def stop(self, *, keep_files: bool = False) -> None:
        """Stop the broker (and delete its temporary folder unless ``keep_files``)."""
        self._kill()
        if not keep_files and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self) -> None:
        """Stop and start again on the same port (clients see a lost connection)."""
        self.stop(keep_files=True)
        self.start()

    # ---- context managers -----------------------------------------------------------------
    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedBroker:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def __del__(self) -> None:  # a forgotten broker must not outlive its owner, nor its temporary folder
        with contextlib.suppress(Exception):
            self.stop()
