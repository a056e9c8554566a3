"""What the guard changed, where people read it back: the decision's journal summary
(``guard_actions``: per action, how many times the guard took it), ``racktwin journal`` (a ``guard``
line of totals, a ``guard actions:`` line per decision) and ``racktwin evaluate``
(``guard_interventions``: decisions with any action; ``guard_actions``: per action, over the run).

The decisions are the guard's own, on the scene of tests/agent/guard_helpers.py (see
tests/agent/test_guard_actions.py): with 8.5 kW r1's PDU reads that the twin does not explain, the guard
slows r0's job "a" (one line for all racks), sends r1's 12 idle cards to low power, cuts r1's power limits
to 200 W and still cannot hold r1 (4 x 200 + 12 x 49 + 2200 = 3588 W > 11.5 - 8.5 = 3 kW): four actions.
At an 80 deg C inlet r0's dies allow (85 - 80) / 0.053 = 94 W, under the 200 W a card accepts: the guard
power-limits r0's jobs at their slowest level and cannot hold their dies: two actions. At level 2 the plan
is within every limit and the guard changes nothing.

The journal is a real SQLite journal written by ``agent.journal.Journal`` in ``tmp_path`` and read by
the command as a user runs it; a summary written without ``guard_actions`` (by a racktwin before it)
must still read.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from evaluate_helpers import full_load_scenario
from guard_helpers import proposal, scene, step_context

from agent.cli import main
from agent.config import ControlConfig
from agent.decision import Decision
from agent.evaluate import run_policy
from agent.guard import Guard
from agent.journal import Journal
from agent.loop import ApplyReport
from agent.policies import AgentPolicy, make_policy

pytestmark = pytest.mark.agent

CFG = ControlConfig(period_s=10.0, max_level_raise_per_period=3, max_setpoint_step_k=5.0)
CAP_NOT_HELD = {"cap_jobs_slowed": 1, "cap_idle_to_low_power": 1, "cap_power_limited": 1, "cap_not_held": 1}
DIE_NOT_HELD = {"die_power_limited": 1, "die_not_held": 1}


def _review(level: int = 0, **ctx: Any) -> Decision:
    site, snap = scene()
    return Guard(site, CFG).review(proposal(site, level), snap, step_context(site, **ctx))


def cap_not_held() -> Decision:
    return _review(rack_extra_w=np.array([0.0, 8500.0]))


def die_not_held() -> Decision:
    inlet = np.full(32, 30.0)
    inlet[:16] = 80.0
    return _review(level=7, card_inlet_c=inlet)


def unchanged() -> Decision:
    return _review(level=2)


def _summary(d: Decision) -> dict[str, Any]:
    return d.summary(scene()[0].rack_names)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["journal", *args])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------------
# the summary
# ------------------------------------------------------------------------------------------------
def test_the_summary_counts_each_action_the_guard_took_and_only_those() -> None:
    assert _summary(cap_not_held())["guard_actions"] == CAP_NOT_HELD
    assert _summary(die_not_held())["guard_actions"] == DIE_NOT_HELD
    assert _summary(unchanged())["guard_actions"] == {}
    json.dumps(_summary(cap_not_held()))  # JSON-able as the journal writes it


def test_the_summary_counts_every_action_where_the_explanation_keeps_only_12_lines() -> None:
    """The explanation keeps the guard's first 12 lines (docs/agent.md), the summary's counts all: a
    decision with 20 per-rack actions on 10 racks (2 each) counts 10 of each."""
    d = cap_not_held().replace(guard_actions=("cap_idle_to_low_power", "cap_not_held") * 10)
    assert _summary(d)["guard_actions"] == {"cap_idle_to_low_power": 10, "cap_not_held": 10}


# ------------------------------------------------------------------------------------------------
# racktwin journal
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    """Decisions 1-4: the cap not held, nothing changed, the cap not held again, the dies not held."""
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    for i, d in enumerate((cap_not_held(), unchanged(), cap_not_held(), die_not_held())):
        j.record_decision(i, 100.0 * (i + 1), "enforce", d.status, 0.01, _summary(d))
    j.close()
    return path


def test_a_journal_keeps_each_decisions_guard_actions(journal_file: Path) -> None:
    db = sqlite3.connect(journal_file)
    try:
        stored = [json.loads(s)["guard_actions"] for (s,) in db.execute("SELECT summary FROM decisions ORDER BY id")]
    finally:
        db.close()
    assert stored == [CAP_NOT_HELD, {}, CAP_NOT_HELD, DIE_NOT_HELD]


def test_journal_counts_the_guards_actions_over_the_decisions(
    journal_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three of the four decisions changed; each cap action twice, each die action once (the most
    frequent first, then by name)."""
    rc, out, err = run_cli(capsys, "--journal", str(journal_file), "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert s["guard"] == {
        "decisions": 3,
        "actions": {
            "cap_idle_to_low_power": 2,
            "cap_jobs_slowed": 2,
            "cap_not_held": 2,
            "cap_power_limited": 2,
            "die_not_held": 1,
            "die_power_limited": 1,
        },
        "unrecorded_decisions": 0,
    }
    assert list(s["guard"]["actions"]) == [
        "cap_idle_to_low_power",
        "cap_jobs_slowed",
        "cap_not_held",
        "cap_power_limited",
        "die_not_held",
        "die_power_limited",
    ]
    assert [d["summary"]["guard_actions"] for d in s["recent"]] == [CAP_NOT_HELD, {}, CAP_NOT_HELD, DIE_NOT_HELD]


def test_journal_counts_an_action_taken_twice_in_one_decision_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The totals count actions, not decisions that took them: two racks not held in one decision (two
    lines, ``cap_power_limited`` and ``cap_not_held`` twice each, as racktwin_guard_actions_total counts
    them) and one more in the next decision are 3 of each; the actions that decisions took once, 1."""
    path = tmp_path / "twice.sqlite"
    j = Journal(path)
    two_racks = cap_not_held().replace(guard_actions=("cap_power_limited", "cap_not_held") * 2)
    assert _summary(two_racks)["guard_actions"] == {"cap_power_limited": 2, "cap_not_held": 2}
    for i, d in enumerate((two_racks, cap_not_held())):
        j.record_decision(i, 100.0 * (i + 1), "enforce", d.status, 0.01, _summary(d))
    j.close()
    rc, out, err = run_cli(capsys, "--journal", str(path), "--json")
    assert rc == 0, err
    guard = json.loads(out)["guard"]
    assert list(guard["actions"]) == ["cap_not_held", "cap_power_limited", "cap_idle_to_low_power", "cap_jobs_slowed"]
    assert guard == {
        "decisions": 2,
        "actions": {"cap_not_held": 3, "cap_power_limited": 3, "cap_idle_to_low_power": 1, "cap_jobs_slowed": 1},
        "unrecorded_decisions": 0,
    }


def test_journal_text_names_the_actions_in_the_totals_and_per_decision(
    journal_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run_cli(capsys, "--journal", str(journal_file))
    assert rc == 0, err
    assert (
        "  guard        3 decisions changed: cap_idle_to_low_power 2, cap_jobs_slowed 2, cap_not_held 2, "
        "cap_power_limited 2, die_not_held 1, die_power_limited 1\n" in out
    )
    per_decision = [line.strip() for line in out.splitlines() if line.strip().startswith("guard actions:")]
    assert per_decision == [
        "guard actions: cap_idle_to_low_power 1, cap_power_limited 1, cap_not_held 1, cap_jobs_slowed 1",
        "guard actions: cap_idle_to_low_power 1, cap_power_limited 1, cap_not_held 1, cap_jobs_slowed 1",
        "guard actions: die_power_limited 1, die_not_held 1",
    ]  # in the order the guard took them (its lines' order); decision 2 (nothing changed) has none
    rc, out, err = run_cli(capsys, "--journal", str(journal_file), "--decision", "4")
    assert rc == 0, err
    assert "  guard actions: die_power_limited 1, die_not_held 1\n" in out
    assert "guard: dies of job(s) a, b cannot be held under 85 deg C" in out  # the explanation as before
    rc, out, err = run_cli(capsys, "--journal", str(journal_file), "--decision", "2")
    assert rc == 0 and "guard actions" not in out, err


def test_a_journal_of_summaries_without_guard_actions_still_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Decision 1 journaled by a racktwin before ``guard_actions`` (its summary has no such key, the
    guard's lines are in its explanation), decision 2 with it, decision 3 hand-written with odd values:
    the totals count decision 2, and say that two decisions have no record."""
    path = tmp_path / "old.sqlite"
    j = Journal(path)
    old = _summary(cap_not_held())
    del old["guard_actions"]
    j.record_decision(0, 100.0, "enforce", "optimal", 0.01, old)
    j.record_decision(1, 200.0, "enforce", "optimal", 0.01, _summary(die_not_held()))
    j.record_decision(2, 300.0, "enforce", "optimal", 0.01, {"guard_actions": 5, "explanation": []})
    j.close()
    rc, out, err = run_cli(capsys, "--journal", str(path), "--json")
    assert rc == 0, err
    assert json.loads(out)["guard"] == {"decisions": 1, "actions": DIE_NOT_HELD, "unrecorded_decisions": 2}
    rc, out, err = run_cli(capsys, "--journal", str(path))
    assert rc == 0, err
    assert (
        "  guard        1 decision changed: die_not_held 1, die_power_limited 1; 2 decisions without a record "
        "of it (journaled by an older racktwin)\n" in out
    )
    rc, out, err = run_cli(capsys, "--journal", str(path), "--decision", "1")
    assert rc == 0, err
    assert "guard actions" not in out and "guard: r1: cannot be held under its cap" in out


def test_a_journal_where_the_guard_changed_nothing_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "quiet.sqlite"
    j = Journal(path)
    j.record_decision(0, 100.0, "enforce", "optimal", 0.01, _summary(unchanged()))
    j.close()
    rc, out, err = run_cli(capsys, "--journal", str(path))
    assert rc == 0, err
    assert "  guard        no decision changed\n" in out and "guard actions" not in out


# ------------------------------------------------------------------------------------------------
# racktwin evaluate
# ------------------------------------------------------------------------------------------------
def test_evaluate_counts_decisions_with_any_action_and_each_action() -> None:
    """``guard_interventions``: decisions the guard changed; the per-action counts sum over them."""
    site, _snap = scene()
    policy = make_policy("racktwin", site)
    assert isinstance(policy, AgentPolicy)
    for d in (cap_not_held(), unchanged(), cap_not_held(), die_not_held()):
        policy._on_decision(d, ApplyReport())
    assert policy.stats.guard_notes == 3
    assert policy.stats.guard_actions == {
        "cap_jobs_slowed": 2,
        "cap_idle_to_low_power": 2,
        "cap_power_limited": 2,
        "cap_not_held": 2,
        "die_power_limited": 1,
        "die_not_held": 1,
    }


def test_evaluate_counts_every_action_of_a_decision_whose_explanation_keeps_12_lines() -> None:
    site, _snap = scene()
    policy = make_policy("racktwin", site)
    assert isinstance(policy, AgentPolicy)
    policy._on_decision(cap_not_held().replace(guard_actions=("cap_not_held",) * 20), ApplyReport())
    assert policy.stats.guard_notes == 1 and policy.stats.guard_actions == {"cap_not_held": 20}


def test_evaluates_metrics_count_the_guards_actions_of_the_run() -> None:
    """A 90 s run of the agent on a site whose racks are all over their limits at the top clock, r1's
    telemetry silent from 20 to 60 s (the guard puts it at fail-safe caps while it is): the metrics'
    counts are those of the decisions it made, heard one by one."""
    sc = full_load_scenario(90.0, faults=[{"kind": "sensor_dropout", "rack": "r1", "start_s": 20.0, "end_s": 60.0}])
    heard: list[Decision] = []
    original = AgentPolicy._on_decision

    def hear(self: AgentPolicy, decision: Decision, report: ApplyReport) -> None:
        heard.append(decision)
        original(self, decision, report)

    mp = pytest.MonkeyPatch()
    with mp.context() as m:
        m.setattr(AgentPolicy, "_on_decision", hear)
        res = run_policy(sc, "racktwin")
    assert res.metrics["decisions"] == len(heard) > 1
    assert res.metrics["guard_interventions"] == sum(1 for d in heard if d.guard_actions) > 0
    counts: dict[str, int] = {}
    for d in heard:
        for a in d.guard_actions:
            counts[a] = counts.get(a, 0) + 1
    assert res.metrics["guard_actions"] == counts and "failsafe_caps" in counts
    json.dumps(res.metrics["guard_actions"])
