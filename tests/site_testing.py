"""The small test site written as a file, for the tests whose service or simulator reads a site file
(tests/agent and tests/integration alike)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_capped_small_site(folder: Path, limit_w: float) -> Path:
    """The example hardware as 2 racks of 16 cards with host overhead (8.8 -> 2.2 kW, 8 -> 2 hosts of
    8 cards) and the rack limit scaled by 16/64, so that a full rack at the top clock is over ``limit_w`` (the agent's
    tests: the cap binds). Written as ``folder/site.toml`` (configs name it by file)."""
    text = (REPO / "examples" / "supernode-512.toml").read_text(encoding="utf-8")
    for pattern, new in (
        (r'^name = ".*"', 'name = "small-2x16"'),
        (r"^racks_per_supernode = 8\b", "racks_per_supernode = 2"),
        (r"^torus_dims = \[8, 8, 8\]", "torus_dims = [4, 4, 2]"),
        (r"^host_overhead_w = 8800\.0", "host_overhead_w = 2200.0"),
        (r"^hosts_per_rack = 8\b", "hosts_per_rack = 2"),  # 2 hosts of 8 cards x 1.0 kW, within the 2.2 kW
        (r"^power_limit_w = 50000\.0", f"power_limit_w = {limit_w}"),
    ):
        text, n = re.subn(pattern, new, text, flags=re.M)
        assert n == 1, pattern
    path = folder / "site.toml"
    path.write_text(text, encoding="utf-8")
    return path
