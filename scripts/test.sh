#!/usr/bin/env bash
# Install what the tests need (mosquitto from Debian, Python packages into .venv, promtool from Debian's
# prometheus package into .venv/bin) and run the whole test suite, plus ruff and mypy. Extra arguments
# go to pytest (e.g. -m unit, -k thermal).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the tests use: mosquitto (+ mosquitto_passwd) for the integration tests,
# mosquitto-clients for the broker-ceiling benchmarks, openssl to make TLS test certificates.
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
missing=""
{ command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; } || missing="$missing mosquitto"
command -v mosquitto_sub >/dev/null 2>&1 || missing="$missing mosquitto-clients"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
if [ -n "$missing" ]; then
    # Without apt-get (not Debian/Ubuntu), or as a user without sudo: say what is missing and how to
    # install it, rather than fail on "sudo: command not found".
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "the tests need these packages, not installed here:$missing" >&2
        echo "install them with the system's package manager (Debian/Ubuntu: apt-get install$missing) and run again" >&2
        exit 1
    fi
    if [ -n "$SUDO" ] && ! command -v sudo >/dev/null 2>&1; then
        echo "the tests need these Debian packages, not installed here:$missing" >&2
        echo "install them as root (no sudo here), then run again: apt-get update && apt-get install -y$missing" >&2
        exit 1
    fi
    echo "== installing Debian packages:$missing"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
bash scripts/setup-env.sh "test,broker"
# promtool, Prometheus's rule checker, for tests/agent/test_alert_rules_promtool.py (it evaluates the
# alert rules of deploy/prometheus): only that binary, taken out of Debian's prometheus package into
# .venv/bin. Not `apt-get install prometheus`: that starts a Prometheus server listening on all
# interfaces. Without apt-get the test skips (and fails where the variable CI is set).
if [ -x .venv/bin/promtool ] && .venv/bin/promtool --version >/dev/null 2>&1; then
    :
elif ! command -v apt-get >/dev/null 2>&1; then
    echo "no promtool in .venv/bin and no apt-get to fetch it: the alert rule tests skip (put Prometheus's promtool 2.x in .venv/bin to run them)" >&2
else
    echo "== fetching promtool (Debian's prometheus package, only its promtool) into .venv/bin"
    deb_dir=$(mktemp -d)
    # shellcheck disable=SC2064 # the folder's name now, not at exit
    trap "rm -rf '$deb_dir'" EXIT
    # as root apt downloads as its user _apt (else it warns "Download is performed unsandboxed as root")
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$deb_dir"; fi
    # package lists may be empty on a fresh machine (the install above updates them only when a
    # package is missing): update them once if prometheus is not found
    if ! (cd "$deb_dir" && apt-get download -qq prometheus 2>/dev/null); then
        $SUDO apt-get update -qq || true
        if ! (cd "$deb_dir" && apt-get download -qq prometheus); then
            echo "could not download Debian's prometheus package for its promtool (apt-get download prometheus, above)" >&2
            echo "as root: apt-get update, then run again; or put Prometheus's promtool 2.x in .venv/bin" >&2
            exit 1
        fi
    fi
    dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -O ./usr/bin/promtool >.venv/bin/promtool.part
    chmod 755 .venv/bin/promtool.part
    mv .venv/bin/promtool.part .venv/bin/promtool
    rm -rf "$deb_dir"
    trap - EXIT
    .venv/bin/promtool --version 2>&1 | sed -n 1p
fi
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
# every conftest.py is the module `conftest` to mypy, which checks one module per name in a run:
# the folder conftests that pyproject.toml leaves out are checked one at a time
for conftest in tests/unit/conftest.py tests/models/conftest.py; do
    .venv/bin/mypy "$conftest"
done
# One worker per core, at most 4 (pytest-xdist): most tests wait on a broker or a simulator in real
# time, not on the CPU. `-n 0` among the extra arguments runs them in this process, one by one.
echo "== pytest (the 15 slowest tests listed at the end: the suite should stay under about 10 minutes)"
.venv/bin/python -m pytest -n auto --maxprocesses 4 --durations=15 "$@"
