"""Helpers shared by the command modules: user-facing errors, paths, JSON output."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from twin.spec import SiteSpec, SpecError, load_site

#: The repository's examples folder (the embedded defaults live there).
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
DEFAULT_SITE = EXAMPLES_DIR / "supernode-512.toml"


class UserError(Exception):
    """A problem the user can fix (bad file, bad option). Printed as one line, exit status 2."""


def load_site_or_fail(path: str | Path | None) -> SiteSpec:
    """Load a site spec; a missing or invalid file becomes a :class:`UserError`."""
    p = Path(path) if path is not None else DEFAULT_SITE
    try:
        return load_site(p)
    except SpecError as exc:
        raise UserError(str(exc)) from None


def _clean(obj: Any) -> Any:
    """Make an object JSON-safe: numpy scalars/arrays to Python, non-finite floats to null."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (machine-readable output of ``--json``)."""
    json.dump(_clean(obj), sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")
    sys.stdout.flush()
