"""Fixtures of the unit tests: the example site, a small site for fast plant runs, the shared data."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from twin.spec import SiteSpec, load_site, site_from_dict

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SITE = REPO / "examples" / "supernode-512.toml"
#: measurement files beside the clone (CI checks ../shared out next to the repository, read-only)
SHARED_DATA = REPO / ".." / "shared" / "data"


def example_dict() -> dict[str, Any]:
    return tomllib.loads(EXAMPLE_SITE.read_text(encoding="utf-8"))


@pytest.fixture
def example_data() -> dict[str, Any]:
    """The example site spec as parsed TOML (a fresh copy to modify)."""
    return example_dict()


@pytest.fixture(scope="session")
def site() -> SiteSpec:
    return load_site(EXAMPLE_SITE)


@pytest.fixture(scope="session")
def small_site() -> SiteSpec:
    """Two racks of 16 cards (torus 4x4x2), otherwise the example hardware: fast plant runs."""
    d = example_dict()
    d["name"] = "small-32"
    d["torus_dims"] = [4, 4, 2]
    d["racks_per_supernode"] = 2
    return site_from_dict(d, source="small-32")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"measurement folder {SHARED_DATA.resolve()} is absent (CI checks ../shared out beside the clone)")
    return SHARED_DATA
