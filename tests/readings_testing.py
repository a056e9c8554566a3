"""Hand-made card readings for the tests of the belief, the estimator and the sensor faults."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from twin.readings import CardBatch, LoopReading, RackReading

#: Every column's value unless a test gives its own: a busy card at a modest power, awake, level 0.
CARD_DEFAULTS: dict[str, object] = {
    "power_w": 300.0,
    "die_temp_c": 50.0,
    "clock_mhz": 1980.0,
    "utilization": 0.5,
    "level": 0,
    "low_power": False,
    "waking": False,
    "power_limit_w": 700.0,
    "failed": False,
}
_KINDS = {"level": np.int64, "low_power": bool, "waking": bool, "failed": bool}


def card_batch(card_index: Sequence[int] | np.ndarray, **cols: object) -> CardBatch:
    """The cards ``card_index`` at :data:`CARD_DEFAULTS`; ``cols`` replaces a column (a scalar: on
    every card, or one value per card)."""
    idx = np.asarray(card_index, dtype=np.int64)
    values = {**CARD_DEFAULTS, **cols}
    arrays = {
        k: np.broadcast_to(np.asarray(v, dtype=_KINDS.get(k, np.float64)), idx.shape).copy() for k, v in values.items()
    }
    return CardBatch(card_index=idx, **arrays)


def cards_of(rack: RackReading) -> CardBatch:
    """``rack``'s card readings, which the test expects it to have (``RackReading.cards`` is None when a rack
    reads no cards)."""
    assert rack.cards is not None, f"rack {rack.rack} read no cards"
    return rack.cards


def loop_of(rack: RackReading) -> LoopReading:
    """``rack``'s loop reading, which the test expects it to have (``RackReading.loop`` is None when a rack
    reads no loop)."""
    assert rack.loop is not None, f"rack {rack.rack} read no loop"
    return rack.loop
