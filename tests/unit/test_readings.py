"""twin.readings: a card batch built in process has one value per card in every column."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import pytest
from readings_testing import card_batch

from twin.readings import CardBatch

pytestmark = pytest.mark.unit

_COLUMNS = [f.name for f in dataclasses.fields(CardBatch) if f.name != "card_index"]


@pytest.mark.parametrize("column", _COLUMNS)
def test_a_card_batch_with_a_column_of_another_length_is_refused_naming_the_column(column: str) -> None:
    good = dataclasses.replace(card_batch(range(4)), host_off=np.zeros(4, dtype=bool))
    short = getattr(good, column)[:3]
    with pytest.raises(ValueError, match=rf"CardBatch\.{column} has shape \(3,\), not one value for each of the 4 "):
        dataclasses.replace(good, **{column: short})
    longer = np.concatenate([getattr(good, column), getattr(good, column)[:1]])
    with pytest.raises(ValueError, match=rf"CardBatch\.{column} has shape \(5,\)"):
        dataclasses.replace(good, **{column: longer})
    with pytest.raises(ValueError, match=rf"CardBatch\.{column} has shape \(\)"):  # a scalar for a column
        dataclasses.replace(good, **{column: getattr(good, column)[0]})


def test_a_card_batch_without_host_off_or_without_cards_is_a_batch() -> None:
    b = card_batch(range(4))
    assert b.host_off is None and len(b.power_w) == 4
    empty = card_batch([])
    assert len(empty.card_index) == 0 and len(empty.failed) == 0
    with pytest.raises(ValueError, match=r"CardBatch\.card_index must be one-dimensional"):
        dataclasses.replace(b, card_index=cast(Any, np.int64(0)))  # not an array, on purpose
