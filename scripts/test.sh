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
    echo "== installing Debian packages:$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
bash scripts/setup-env.sh "test,broker"
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
# One worker per core, at most 4 (pytest-xdist): most tests wait on a broker or a simulator in real
# time, not on the CPU. `-n 0` among the extra arguments runs them in this process, one by one.
echo "== pytest (the 15 slowest tests listed at the end: the suite should stay under about 10 minutes)"
.venv/bin/python -m pytest -n auto --maxprocesses 4 --durations=15 "$@"
