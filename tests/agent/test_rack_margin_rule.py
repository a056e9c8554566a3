"""One rule for a rack margin: the agent's ``control.rack_margin_w`` and a scenario's
``margins.rack_margin_w`` (``racktwin optimize``) are refused for the same margins, in the same words
(``SiteSpec.rack_margin_problem``), each under its own field, and both take any margin below the site's
rack power limit (their ranges both end at the largest rack limit a site may have)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.commands.common import UserError
from agent.commands.optimize_scenario import load_scenario
from agent.config import load_config
from twin.spec import load_site
from twin.tables import SpecError

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE_TEXT = (EXAMPLES / "supernode-512.toml").read_text()
RACK_LIMIT_LINE = "power_limit_w = 50000.0"


def _files(tmp_path: Path, margin_w: float, rack_limit_w: float = 50_000.0) -> tuple[Path, Path]:
    """An agent configuration and a scenario, each with ``margin_w``, on the example site with racks of
    ``rack_limit_w``."""
    assert SITE_TEXT.count(RACK_LIMIT_LINE) == 1
    (tmp_path / "site.toml").write_text(SITE_TEXT.replace(RACK_LIMIT_LINE, f"power_limit_w = {rack_limit_w:.1f}"))
    agent = tmp_path / "agent.toml"
    agent.write_text(f'site = "site.toml"\n[control]\nrack_margin_w = {margin_w:.1f}\n')
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        f'name = "m"\nsite = "site.toml"\nambient_c = 20.0\n[margins]\nrack_margin_w = {margin_w:.1f}\n'
    )
    return agent, scenario


@pytest.mark.parametrize("margin_w", [50_000.0, 60_000.0])
def test_the_agent_and_optimize_refuse_a_margin_that_leaves_no_power_in_the_same_words(
    tmp_path: Path, margin_w: float
) -> None:
    agent, scenario = _files(tmp_path, margin_w)
    problem = load_site(tmp_path / "site.toml").rack_margin_problem(margin_w)
    assert problem == (
        f"must be below the site's rack power limit (50000 W), got {margin_w:g} W: no power would be left for the racks"
    )
    with pytest.raises(SpecError) as refused:
        load_config(agent, env={})
    assert (refused.value.path, refused.value.problem) == ("control.rack_margin_w", problem)
    with pytest.raises(UserError) as bad:
        load_scenario(scenario)
    assert str(bad.value) == f"{scenario}: margins.rack_margin_w: {problem}"


def test_a_margin_below_a_large_racks_limit_is_taken_by_both(tmp_path: Path) -> None:
    """A 150 kW margin on racks of 200 kW leaves 50 kW a rack (the agent's range stopped at 100 kW and
    refused it, where optimize took it)."""
    agent, scenario = _files(tmp_path, 150_000.0, rack_limit_w=200_000.0)
    assert load_config(agent, env={}).config.control.rack_margin_w == 150_000.0
    assert load_scenario(scenario).file.margins.rack_margin_w == 150_000.0
    assert load_site(tmp_path / "site.toml").rack_margin_problem(199_999.0) is None
