#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: a virtual environment in .venv with racktwin
# installed (editable) and the extras named in $1 (e.g. "broker" or "test,broker").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "racktwin needs Python 3.11 or newer: $PY not found (install python3, or set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "racktwin needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1)" >&2
    exit 1
fi
# A .venv without pip is what `python3 -m venv` leaves when it fails on Debian/Ubuntu without
# python3-venv (it makes bin/python, then cannot install pip): make it again rather than fail on it.
if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    echo "== .venv has no pip (left by a failed set-up?): making it again"
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv"
    if ! "$PY" -m venv .venv; then
        rm -rf .venv
        echo "could not create .venv with $PY: install its venv module (Debian/Ubuntu: apt-get install python3-venv) and run again" >&2
        exit 1
    fi
fi
echo "== installing racktwin[$1] into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$1]"
