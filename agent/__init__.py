"""racktwin's control agent, MQTT protocol, evaluation harness and command line."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["racktwin_version"]


def racktwin_version() -> str:
    """The installed distribution's version; from a checkout's pyproject.toml when not installed."""
    try:
        return version("racktwin")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"
