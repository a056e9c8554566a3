#!/usr/bin/env bash
# Install what the tests need (mosquitto from Debian, Python packages into .venv) and run the whole
# test suite, plus ruff and mypy. Extra arguments go to pytest (e.g. -m unit, -k thermal).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the tests use: mosquitto (+ mosquitto_passwd) for the integration tests,
# mosquitto-clients for the broker-ceiling benchmarks, openssl to make TLS test certificates.
missing=""
{ command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; } || missing="$missing mosquitto"
command -v mosquitto_sub >/dev/null 2>&1 || missing="$missing mosquitto-clients"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
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
