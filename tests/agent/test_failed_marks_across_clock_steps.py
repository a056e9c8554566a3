"""Cards a ``card_failed`` refusal marks failed, judged across site clock steps and rack clocks.

What users rely on: a card a rack refused as failed gets no job and no setting until a reading of it
at least as new as the refusal shows what it is (``agent.command_overlays.Overlays``), and

* after the site clock stepped back (a simulator restarted 760 s back, a time source corrected), a
  mark stamped on the old timeline dates from the first decision on the new one: the card stays out
  of that decision's placements (``Overlays.unplaceable``, computed before the decision) and of its
  commands (``Overlays.failed_now``) alike, until a reading stamped after it (the last-seen times the
  belief brought back with the clock are no new readings). Before, the first decision judged its
  placements on the old stamp and its commands on the new one, and a decision made at the step's
  instant took the mark for cleared without any reading: the card's next refusal then counted as a
  repeat (a doubling hold, and a warning that its telemetry read it alive);
* a rack whose clock lags the agent's (by more than a rack accepts ahead, with no step back: the
  other racks keep the agent's clock) is judged on its own clock: the refusal's stamp against the
  rack's own readings, so its next reading clears the mark although it is stamped behind the agent's
  clock; a refusal of another reason holds the setting back ``command_ttl_s`` of the agent's clock,
  readings or not.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from agent_helpers import small_site

from agent import wire
from agent.command_overlays import Overlays
from agent.open_commands import LEVEL, OpenCommand

pytestmark = pytest.mark.agent

SITE = small_site()  # 2 racks of 16 cards
DEAD = 20  # card 4 of rack r1
TTL_S = 30.0
OLD_S = 1000.0  # the refusal, on the old timeline
BACK_S = 240.0  # the site clock stepped back here (760 s)


def marked_on_old_timeline() -> tuple[Overlays, np.ndarray]:
    """Card DEAD refused as failed at OLD_S (its last reading at OLD_S - 1), then the clock stepped
    back to BACK_S: the belief's last-seen times come back to BACK_S (``TwinState.clock_went_back``)."""
    ov = Overlays(SITE)
    ov.mark_failed(np.array([DEAD]), OLD_S, OLD_S - 0.5, OLD_S, TTL_S)
    last_seen = np.full(SITE.n_cards, OLD_S - 1.0)
    assert ov.unplaceable(last_seen, OLD_S)[DEAD]
    return ov, np.minimum(last_seen, BACK_S)


@pytest.mark.parametrize("first_s", [BACK_S, BACK_S + 1.0])
def test_the_first_decision_after_a_step_back_keeps_an_old_mark_out_of_placements_and_commands_alike(
    first_s: float,
) -> None:
    ov, last_seen = marked_on_old_timeline()
    placing = ov.unplaceable(last_seen, first_s)  # before the decision (the service's cycle)
    commanding = ov.failed_now(last_seen, first_s)  # its commands (agent.command_diff)
    assert placing[DEAD] and commanding[DEAD]
    assert placing.sum() == commanding.sum() == 1
    # a refusal of a command of that decision is no repeat: no reading ever showed the card alive
    ov.mark_failed(np.array([DEAD]), first_s + 0.5, first_s, first_s + 0.5, TTL_S)
    assert ov.failed_repeats[DEAD] == 0 and not math.isfinite(ov.failed_hold_until_s[DEAD])


def test_after_a_step_back_a_reading_stamped_after_the_first_decision_clears_the_old_mark() -> None:
    ov, last_seen = marked_on_old_timeline()
    assert ov.unplaceable(last_seen, BACK_S)[DEAD] and ov.failed_now(last_seen, BACK_S)[DEAD]
    read = last_seen.copy()
    read[DEAD] = BACK_S + 1.0  # its next reading on the new timeline
    assert not ov.unplaceable(read, BACK_S + 2.0)[DEAD]
    assert not ov.failed_now(read, BACK_S + 2.0)[DEAD]
    # refused again after that reading showed it alive: a repeat, held out
    ov.mark_failed(np.array([DEAD]), BACK_S + 3.0, BACK_S + 2.5, BACK_S + 3.0, TTL_S)
    assert ov.failed_repeats[DEAD] == 1 and ov.failed_hold_until_s[DEAD] == BACK_S + 3.0 + TTL_S


def test_without_a_step_back_dating_marks_changes_nothing() -> None:
    ov = Overlays(SITE)
    ov.mark_failed(np.array([DEAD]), 100.0, 99.0, 100.0, TTL_S)
    last_seen = np.full(SITE.n_cards, 99.0)
    assert ov.unplaceable(last_seen, 105.0)[DEAD]
    assert ov.failed_by_ack_s[DEAD] == 100.0
    last_seen[DEAD] = 100.0  # a reading stamped the refusal's own instant clears it
    assert not ov.unplaceable(last_seen, 105.0)[DEAD] and not ov.failed_now(last_seen, 105.0)[DEAD]


def test_a_refusal_noted_while_a_decision_is_made_keeps_its_stamp_for_that_decisions_commands() -> None:
    """Without a step back, an ack that comes while a decision is being made (the service's solve runs off
    the event loop) is stamped after that decision's time; its commands (``failed_now`` at that time) must
    not date the mark back to the decision: a reading taken between the two, before the refusal, would
    clear it, the requeued job's decision would place it on the dead card again, and the scheduler's next
    refusal would count as a repeat (a hold, a warning that its telemetry reads it alive)."""
    ov = Overlays(SITE)
    last_seen = np.full(SITE.n_cards, 99.0)
    assert not ov.unplaceable(last_seen, 100.0).any()  # the decision at 100 s: its placements
    ov.mark_failed(np.array([DEAD]), 100.4, 95.0, 100.4, TTL_S)  # an ack during its solve
    last_seen[DEAD] = 100.2  # a reading of the card taken before the refusal
    assert ov.failed_now(last_seen, 100.0)[DEAD]  # the decision's commands leave it out
    assert ov.failed_by_ack_s[DEAD] == 100.4
    assert ov.unplaceable(last_seen, 100.5)[DEAD]  # the requeued job's decision: not placed on it again
    assert ov.failed_now(last_seen, 100.5)[DEAD]
    last_seen[DEAD] = 100.4  # a reading as new as the refusal clears it
    assert not ov.unplaceable(last_seen, 101.0)[DEAD] and not ov.failed_now(last_seen, 101.0)[DEAD]
    assert ov.failed_repeats[DEAD] == 0


# ---- a rack whose clock lags the agent's ---------------------------------------------------------

LAG_S = 15.0  # more than a rack accepts ahead (wire.MAX_ISSUE_AHEAD_S), less than the telemetry deadline
NOW_S = 5000.0  # the agent's clock (the other racks keep it)


def level_command(cards: list[int], key: int, now_s: float) -> OpenCommand:
    oc = OpenCommand(str(uuid.uuid4()), "r1", "rack/r1/cmd", b"", now_s, now_s + TTL_S, kind=LEVEL, stamp_s=now_s)
    oc.key = key
    oc.cards = np.asarray(cards, dtype=np.int64)
    return oc


def ack(oc: OpenCommand, reason: str, rack_now_s: float) -> wire.Acknowledgement:
    return wire.Acknowledgement(
        target="r1",
        command_id=uuid.UUID(oc.command_id),
        result=wire.AckResult.REJECTED,
        ts_s=rack_now_s,
        seq=1,
        publisher="sim",
        reason=reason,
    )


def test_a_lagging_racks_card_failed_mark_is_judged_on_its_own_clock() -> None:
    ov = Overlays(SITE)
    rack_now = NOW_S - LAG_S
    oc = level_command(list(range(16, 32)), 1, NOW_S)
    a = ack(oc, "card_failed: card 4 of rack r1 has failed", rack_now)
    ov.refuse(oc, NOW_S + TTL_S)
    ov.note_failed(oc, a, NOW_S, TTL_S)
    assert ov.failed_by_ack_s[DEAD] == rack_now  # the rack's stamp, not the agent's now
    assert (ov.backoff[LEVEL, 16:32] == -math.inf).all()  # the refusal holds no card's setting back
    last_seen = np.full(SITE.n_cards, NOW_S - 1.0)
    last_seen[16:32] = rack_now - 1.0  # the rack's readings, on its own clock
    assert ov.unplaceable(last_seen, NOW_S + 1.0)[DEAD] and ov.failed_now(last_seen, NOW_S + 1.0)[DEAD]
    last_seen[16:32] = rack_now + 1.0  # its next reading: 14 s behind the agent's clock, after the refusal
    assert not ov.unplaceable(last_seen, NOW_S + 2.0)[DEAD]
    assert not ov.failed_now(last_seen, NOW_S + 2.0)[DEAD]


def test_a_lagging_racks_other_refusal_holds_its_setting_command_ttl_s_of_the_agents_clock() -> None:
    ov = Overlays(SITE)
    oc = level_command([16, 17], 1, NOW_S)
    a = ack(oc, f"issued_ahead: ts {NOW_S} is {LAG_S:g} s ahead of the clock of rack r1", NOW_S - LAG_S)
    ov.refuse(oc, NOW_S + TTL_S)
    ov.note_failed(oc, a, NOW_S, TTL_S)  # names no failed card: nothing marked
    assert not np.isfinite(ov.failed_by_ack_s).any()
    assert (ov.backoff[LEVEL, [16, 17]] == NOW_S + TTL_S).all()  # the agent's clock, readings or not
