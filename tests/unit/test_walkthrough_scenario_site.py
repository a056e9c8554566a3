"""An operator's walk-through: a scenario copied out of examples/ to be edited.

The example scenarios name their site spec by a relative path (`site = "supernode-512.toml"`), taken
from the scenario's folder. Copied elsewhere, `racktwin sim`, `evaluate`, `demo` and `optimize`
answered "site: sub/supernode-512.toml: file not found", which does not say why the site was looked
for there nor what to do. The message now says both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main
from twin.scenario import load_run_scenario
from twin.spec import SpecError

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HINT = "a relative site is taken from the scenario's folder: give the site spec's path, or copy it there"


def test_a_copied_run_scenario_says_where_its_site_was_looked_for_and_what_to_do(tmp_path: Path) -> None:
    copy = tmp_path / "day-demo.toml"
    copy.write_text((EXAMPLES / "day-demo.toml").read_text())
    with pytest.raises(SpecError) as err:
        load_run_scenario(copy)
    text = str(err.value)
    assert f"site: {tmp_path / 'supernode-512.toml'}: file not found" in text
    assert HINT in text
    # given the site's path, the same copy loads
    copy.write_text(copy.read_text().replace('"supernode-512.toml"', f'"{EXAMPLES / "supernode-512.toml"}"'))
    assert load_run_scenario(copy, duration_s=60.0).site.n_cards == 512


def test_an_absolute_site_path_that_is_missing_gets_no_hint(tmp_path: Path) -> None:
    copy = tmp_path / "day-demo.toml"
    text = (EXAMPLES / "day-demo.toml").read_text()
    copy.write_text(text.replace('"supernode-512.toml"', f'"{tmp_path / "gone.toml"}"'))
    with pytest.raises(SpecError) as err:
        load_run_scenario(copy)
    assert "gone.toml: file not found" in str(err.value) and HINT not in str(err.value)


def test_a_copied_optimize_scenario_says_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "scenario-nominal.toml"
    copy.write_text((EXAMPLES / "scenario-nominal.toml").read_text())
    assert main(["optimize", str(copy), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot load site spec 'supernode-512.toml'" in err and HINT in err
    assert not (tmp_path / "out").exists()
