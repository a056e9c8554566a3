"""A site file no rack or twin can run (a rack limit under an idle rack's draw, a typo in ``torus_dims``,
a leakage reference temperature above the slowdown temperature) is refused by ``racktwin twin``,
``sim`` and ``optimize`` alike: one line naming the file and the key, exit 2, before anything runs
(the twin used to die with MemoryError on the typo, and ran the others). The agent's own
``--check-config`` still names its more specific fail-safe floor where the site's check passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE = EXAMPLES / "supernode-512.toml"

#: the example site's lines and what each case puts in their place
CASES = {
    # one host on (8,800 W - 7 off hosts x 950 W) and its 8 cards asleep at 44.0 W (20 deg C supply) = 2,502 W
    "rack limit": (
        "power_limit_w = 50000.0",
        "power_limit_w = 2500.0",
        "rack.power_limit_w: 2500 W is at or below",
    ),
    # 800 x 800 x 8 = 5,120,000 cards in one supernode
    "torus typo": ("torus_dims = [8, 8, 8]", "torus_dims = [800, 800, 8]", "torus_dims: 5,120,000 cards"),
    "reference temperature": (
        "reference_temp_c = 42.0",
        "reference_temp_c = 90.0",
        "card.reference_temp_c: 90 deg C is above card.slowdown_temp_c (87 deg C)",
    ),
}


def _site(tmp_path: Path, old: str, new: str) -> Path:
    text = SITE.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path = tmp_path / "site.toml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


def _one_error(capsys: pytest.CaptureFixture[str], rc: int, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "MemoryError" not in err, err
    lines = [line for line in err.strip().splitlines() if ": warning: " not in line]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"racktwin {command}: error: "), err
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_twin_sim_and_optimize_refuse_the_site_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    old, new, words = CASES[case]
    site = _site(tmp_path, old, new)
    line = _one_error(capsys, main(["twin", "steady", "--site", str(site)]), "twin steady")
    assert f"{site}: {words}" in line, line
    line = _one_error(capsys, main(["sim", "--site", str(site), "--duration", "5", "--speed", "0"]), "sim")
    assert f"{site}: {words}" in line, line
    scenario = tmp_path / "scenario.toml"
    text = (EXAMPLES / "scenario-nominal.toml").read_text(encoding="utf-8")
    scenario.write_text(text.replace('site = "supernode-512.toml"', f'site = "{site}"', 1), encoding="utf-8")
    line = _one_error(capsys, main(["optimize", str(scenario), "--out", str(tmp_path / "out")]), "optimize")
    assert words in line and "site" in line, line


def test_sim_refuses_more_supernodes_than_a_site_may_have_cards(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "--site", str(SITE), "--supernodes", "2000", "--duration", "5", "--speed", "0"])
    line = _one_error(capsys, rc, "sim")  # 2,000 x 512 = 1,024,000 cards
    assert "--supernodes: 1,024,000 cards (supernodes 2000 x torus_dims 8 x 8 x 8)" in line, line


def test_the_agents_fail_safe_floor_still_names_min_power_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 20 kW is above the site's 2,502 W floor, but 64 cards at the agent's 200 W fail-safe limit, 8.8 kW of
    # hosts and the 1 kW margin make 22,600 W: the agent's own, more specific check speaks
    site = _site(tmp_path, "power_limit_w = 50000.0", "power_limit_w = 20000.0")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'site = "{site}"\njournal.path = "{tmp_path / "journal.sqlite"}"\n', encoding="utf-8")
    line = _one_error(capsys, main(["agent", "--check-config", str(cfg)]), "agent")
    assert "control.min_power_limit_w: " in line and "22600 W" in line, line
    # and under the site's floor the site's check names the site's key
    _site(tmp_path, "power_limit_w = 50000.0", "power_limit_w = 2000.0")
    line = _one_error(capsys, main(["agent", "--check-config", str(cfg)]), "agent")
    assert "rack.power_limit_w: 2000 W is at or below" in line, line
