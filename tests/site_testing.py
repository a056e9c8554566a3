"""The small test site written as a file, for the tests whose service or simulator reads a site file
(tests/agent and tests/integration alike), and the agent configuration that names it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def write_agent_config(
    folder: Path, site_id: str, control: Mapping[str, Any], *, mode: str = "enforce", http_port: int | None = 0
) -> Path:
    """``folder/agent.toml`` for an agent on ``folder/site.toml``: ``control`` as its ``[control]``
    table, a journal in ``folder``, text logs, ``[http] port = http_port`` (none when None) and a
    placeholder broker URL that the test's broker fixture replaces."""
    lines = [
        'site = "site.toml"',
        f'site_id = "{site_id}"',
        f'mode = "{mode}"',
        "[broker]",
        'url = "mqtt://127.0.0.1:1"',  # replaced by the fixture's broker
        "[control]",
        *(f"{k} = {json.dumps(v)}" for k, v in control.items()),
        "[journal]",
        'path = "journal.sqlite"',
        *(() if http_port is None else ("[http]", f"port = {http_port}")),
        "[log]",
        'format = "text"',
    ]
    path = folder / "agent.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
