"""Fixtures for the model tests (helpers to build problems live in models_helpers.py)."""

from __future__ import annotations

import pytest
from models_helpers import EXAMPLES

from twin.spec import SiteSpec, load_site


@pytest.fixture(scope="session")
def site() -> SiteSpec:
    return load_site(EXAMPLES / "supernode-512.toml")
