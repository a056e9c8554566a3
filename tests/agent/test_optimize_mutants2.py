"""``racktwin optimize``: the mutants an earlier audit of the offline optimization left alive.

* M15: the sign of the hosts-off saving in the pump choice (``agent.commands.optimize_judge._pump_speeds``:
  the hosts a plan powers off heat their racks *less*);
* M16: the UPS loss in the pump pricing (each W of rack power costs ``1 + ups_loss_fraction`` W at
  the facility, ``agent.pumps`` module docstring);
* M39: the nearest-card tie-break for a generated job placed around what is taken
  (``agent.commands.optimize_scenario._around``: lower card index first at equal distance).

(M19, the baseline paced by the fastest card of a job instead of the slowest, is an equivalent
mutant: in the baseline every card of a job has the same level, utilization, supply, resistance
and flow, and no failed card can belong to a job, so its fastest and slowest cards agree.)

Expected values are derived by hand from the example site (examples/supernode-512.toml) and the
docs, written out in each test. Real HiGHS (the ``models`` layer, as test_optimize_mutants_audit.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main

pytestmark = pytest.mark.models

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SITE = EXAMPLES / "supernode-512.toml"


def _optimize(scenario: Path, out: Path) -> dict[str, Any]:
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = main(["optimize", str(scenario), "--out", str(out), "--quiet"])
    assert rc == 0, se.getvalue()
    doc: dict[str, Any] = json.loads((out / "plan.json").read_text())
    return doc


def _scenario(path: Path, site: Path, body: str) -> Path:
    path.write_text(
        f'name = "{path.stem}"\nsite = "{site.as_posix()}"\nambient_c = 22.0\nsupply_temp_c = 30.0\n'
        f"ready_reserve_cards = 0\n{body}"
    )
    return path


def _site_with(path: Path, **values: float) -> Path:
    """The example site with some top-level keys of its tables replaced (``key = value`` lines)."""
    text = SITE.read_text()
    for key, value in values.items():
        text, n = re.subn(rf"(?m)^{key} = [^\s#]+", f"{key} = {value}", text)
        assert n == 1, key
    path.write_text(text)
    return path


def test_hosts_powered_off_lower_the_rack_power_the_pump_choice_holds_to_the_cap(tmp_path: Path) -> None:
    """M15. An idle supernode, every host off (no reserve of hosts, no ready reserve), each rack's
    usable power cut to 50 - 35 = 15 kW by the rack margin.

    The pump choice holds each rack's predicted power to its cap at every speed but full speed
    (agent.pumps; full speed is always allowed). A rack's predicted power is its 8 hosts' 8,800 W,
    its 64 cards counted asleep (52.8 W each at 42 deg C, a little less at a 30 deg C supply) and
    the hosts off's saving taken off: 8 x (950 W of host + 8 x 52.8 W of cards) = 10,979 W, so
    about 8,800 + 3,379 - 10,979 = 1,200 W (the IT power the twin reports: 8 x 1.2 = 9.6 kW), far
    under 15 kW; nothing else binds (no awake die; the loop rise at a third of the flow, 1.2 kW /
    (76.8 L/min x 1.02 kg/L x 3,900 J/kg/K / 3) ~ 0.7 K, is far under 16.3 K). The slowest speed
    saves most of the rack pump's 250 kPa x 1.28 L/s / 0.6 = 533 W (1 - 1/27 of it) for ~21 W of
    extra leakage of the asleep cards: every pump at the slowest speed, 0.4 / 1.2 L/min = 1/3.

    With the saving's sign flipped, the prediction adds 10,979 W instead: 23,158 W > 15 kW at
    every speed, so every pump would stay at full speed."""
    path = _scenario(
        tmp_path / "idle.toml",
        SITE,
        "[margins]\nrack_margin_w = 35000.0\n[solver]\nchoose_setpoint = false\nhost_reserve_per_supernode = 0\n",
    )
    plan = _optimize(path, tmp_path / "o")
    assert len(plan["hosts_off"]) == 64  # every host off
    assert plan["it_power_w"] == pytest.approx(8 * (8800.0 - 8 * 950.0), rel=1e-6)
    assert plan["pump_speed_frac"] == pytest.approx([1.0 / 3.0] * 8, abs=1e-9)


# M16: rack pump power at nominal flow is head x 64 x 1.2 L/min / 0.6; the pump saves 26/27 of it at
# a third of the speed. The asleep cards' leakage it costs (derivation in the test) is 20.527 W a rack,
# priced at 1.025 W of facility power per W (UPS loss 2.5%): 21.040 W. At 10.1 kPa the pump saves
# 10.1e3 x 1.28e-3 / 0.6 x 26/27 = 20.749 W (under 21.040: full speed; a pricing without the UPS loss,
# 20.527 W, would slow the pumps); at 10.5 kPa it saves 21.570 W (over 21.040: a third of the speed).
@pytest.mark.parametrize(("head_kpa", "speed"), [(10.1, 1.0), (10.5, 1.0 / 3.0)])
def test_the_pump_choice_prices_the_leakage_it_costs_with_the_ups_loss(
    tmp_path: Path, head_kpa: float, speed: float
) -> None:
    """M16. An idle site (no job, no ready reserve: every card asleep, hosts kept on), the facility
    pump without head (its power 0: each rack's choice is its own) and two speed options, full and
    the slowest (0.4 / 1.2 L/min = 1/3). The pump choice minimizes, per rack,
    ``(1 + ups_loss_fraction) x rack power + rack pump power`` (agent.pumps).

    An asleep card's steady power (twin.steady): ``(52.8 + 0.4 x (30 - 42)) / (1 - 0.4 x R)`` W with
    R its die-to-coolant resistance: 0.03 + 0.0230 = 0.053 K/W at 1.2 L/min per plate, 0.03 + 0.0389
    = 0.0689 K/W at 0.4 L/min (the OCP table of the site): 49.0396 W and 49.3604 W, 20.527 W more a
    rack of 64 at a third of the speed. The host overhead is the same at both speeds."""
    site = _site_with(tmp_path / "site.toml", pump_head_kpa=head_kpa, facility_pump_head_kpa=0.0)
    path = _scenario(
        tmp_path / "ups.toml",
        site,
        "[solver]\nchoose_setpoint = false\nchoose_host_power = false\npump_speed_steps = 2\n",
    )
    plan = _optimize(path, tmp_path / "o")
    asleep = [c for c in plan["cards"] if c["state"] == "low_power"]
    assert len(asleep) == 512
    assert plan["pump_speed_frac"] == pytest.approx([speed] * 8, abs=1e-9)


def test_a_generated_job_moved_around_failed_cards_takes_the_lower_card_at_equal_distance(tmp_path: Path) -> None:
    """M39. docs/models.md ([generate]): a generated job whose block holds a failed card runs on the
    other cards of its block and the free cards of its supernode nearest to it; at equal distance
    the lower card first (``optimize_scenario._around``).

    Seed 1, allocation 0.1, sizes 16 and 32 draw two jobs: job000 on cards 32..47, then job001 on
    0..31. Cards 0 and 40..42 failed: neither block is free, and job000 is placed first, while
    cards 0..31 are still free. It keeps its 13 other cards and needs 3 more: cards 31 and 48 (one
    away), then 30 or 49 (two away): the lower, 30. job001 then keeps 1..29 (0 failed, 30 and 31
    taken) and takes the 3 nearest free ones: 49, 50, 51."""
    path = _scenario(
        tmp_path / "gen.toml",
        SITE,
        "failed_cards = [0, 40, 41, 42]\n"
        "[generate]\nseed = 1\nallocation = 0.1\nsizes = [16, 32]\nphase_weights = [1.0, 0.0, 0.0, 0.0]\n"
        "slo_fraction = 0.0\npriorities = [1.0]\n[solver]\nchoose_setpoint = false\n",
    )
    plan = _optimize(path, tmp_path / "o")
    cards = {j["id"]: j["cards"] for j in plan["jobs"]}
    assert cards["job000"] == [30, 31, *range(32, 40), *range(43, 48), 48]
    assert cards["job001"] == [*range(1, 30), 49, 50, 51]
