"""Shared fixtures: a real mosquitto on a random loopback port (plain, secured with the shipped ACL,
or TLS), certificates, and a small site layout for the MQTT protocol. Plain helpers and data
(sample messages, users, paths) are in tests/mqtt_testing.py.

mosquitto is required (CI installs it; scripts/test.sh installs it from Debian). When it is missing
the tests that need it fail with one clear message rather than being skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mqtt_testing import (
    SECURED_USERS,
    SHIPPED_ACL,
    TEST_RACKS,
    TEST_SITE,
    SecuredBroker,
    TlsFiles,
    make_tls_files,
    sample_messages,
    write_password_file,
)

from agent.broker import EmbeddedBroker, find_mosquitto
from agent.wire import Codec, SiteLayout

#: every test belongs to one layer (pyproject.toml's markers): `-m unit` and the like select by it
TEST_LAYERS = ("unit", "models", "agent", "integration")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test with no layer marker when it runs (the whole suite, as CI runs it): `-m unit` and the
    like would silently leave it out. It shows as an error at set-up (a collection error instead would
    be an internal error under pytest-xdist); a test skipped before set-up is not checked."""
    if not any(item.get_closest_marker(m) for m in TEST_LAYERS):
        pytest.fail(
            f"no layer marker: mark the test or its file with one of {', '.join(TEST_LAYERS)} "
            "(e.g. 'pytestmark = pytest.mark.unit')",
            pytrace=False,
        )


_NO_MOSQUITTO = (
    "mosquitto is not installed, and the agent/integration tests need a real broker. Install it with "
    "'apt-get install mosquitto mosquitto-clients' (scripts/test.sh does this), or point "
    "RACKTWIN_MOSQUITTO at a mosquitto 2.x binary."
)


def _tool(name: str, near: str | None) -> str:
    found = shutil.which(name)
    if found:
        return found
    if near is not None:
        candidate = Path(near).parent / name
        if candidate.exists():
            return str(candidate)
    for folder in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        if (Path(folder) / name).exists():
            return str(Path(folder) / name)
    pytest.fail(f"{name} is not installed (it comes with mosquitto: apt-get install mosquitto)", pytrace=False)


@pytest.fixture(scope="session")
def mosquitto_path() -> str:
    """The mosquitto binary; fails (not skips) with an install hint when there is none."""
    path = find_mosquitto()
    if path is None:
        pytest.fail(_NO_MOSQUITTO, pytrace=False)
    return path


@pytest.fixture(scope="session")
def mosquitto_passwd_path(mosquitto_path: str) -> str:
    return _tool("mosquitto_passwd", mosquitto_path)


@pytest.fixture
def mosquitto_factory(mosquitto_path: str) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Start mosquitto brokers with config variants (``EmbeddedBroker`` keyword arguments:
    ``password_file``, ``acl_file``, ``tls``, ``extra_config`` ...); all are stopped after the test."""
    started: list[EmbeddedBroker] = []

    def make(**kwargs: Any) -> EmbeddedBroker:
        broker = EmbeddedBroker(backend="mosquitto", mosquitto_path=mosquitto_path, **kwargs)
        started.append(broker)
        broker.start()
        return broker

    yield make
    for broker in started:
        # killed, not terminated: after its first client, mosquitto takes 0.1 s to exit on SIGTERM (its
        # main loop's tick), a wait at every test's teardown that tests nothing (no persistence to write;
        # a test of the broker's own stop calls stop() itself). stop() then reaps it and removes its folder.
        if broker.pid is not None:
            os.kill(broker.pid, signal.SIGKILL)
        broker.stop()


@pytest.fixture
def mosquitto(mosquitto_factory: Callable[..., EmbeddedBroker]) -> EmbeddedBroker:
    """A real mosquitto (anonymous) on a random loopback port for one test. ``.restart()`` keeps the port."""
    return mosquitto_factory()


# ---- the secured broker: shipped ACL + a generated password file ----------------------------------


@pytest.fixture
def secured_mosquitto(
    mosquitto_factory: Callable[..., EmbeddedBroker], mosquitto_passwd_path: str, tmp_path: Path
) -> SecuredBroker:
    """mosquitto on a random loopback port with the shipped ACL and a generated password file:
    no anonymous access; users agent, observer, facility, scheduler, sim, r0..r7."""
    passwords = {u: f"pw-{u}-secret" for u in SECURED_USERS}
    pw_file = write_password_file(tmp_path / "passwd", passwords, mosquitto_passwd_path)
    broker = mosquitto_factory(password_file=pw_file, acl_file=SHIPPED_ACL)
    return SecuredBroker(broker, passwords)


# ---- TLS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Test certificates (session-wide; RSA key generation takes a moment)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


# ---- protocol --------------------------------------------------------------------------------------


@pytest.fixture
def site_layout() -> SiteLayout:
    """site1: racks r0..r7 of 64 cards, 8 DVFS levels."""
    return SiteLayout(TEST_SITE, TEST_RACKS, cards_per_rack=64, n_levels=8)


@pytest.fixture
def codec(site_layout: SiteLayout) -> Codec:
    """A codec with its own rejection counter."""
    return Codec(site_layout)


@pytest.fixture
def all_messages() -> list[Any]:
    """One message of every kind (see :func:`sample_messages`)."""
    return sample_messages()
