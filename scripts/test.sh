#!/usr/bin/env bash
# Install what the tests need (mosquitto from Debian, Python packages into .venv) and run the whole
# test suite, plus ruff and mypy. Extra arguments go to pytest (e.g. -m unit, -k thermal).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    echo "== installing mosquitto (Debian package) for the integration tests"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mosquitto mosquitto-clients >/dev/null
fi
bash scripts/setup-env.sh "test,broker"
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest "$@"
