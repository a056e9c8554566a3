"""``agent.durations``: the ``H:MM:SS`` and whole percent of the progress lines (``racktwin evaluate``,
``racktwin demo``), rounded down: never more done than is done."""

from __future__ import annotations

import pytest

from agent.durations import hms, percent_done

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("t_s", "text"),
    [
        (0.0, "0:00:00"),
        (59.999, "0:00:59"),  # a second is shown once it is done
        (60.0, "0:01:00"),
        (3599.6, "0:59:59"),  # not yet the hour (rounding to the nearest showed 1:00:00)
        (3600.0, "1:00:00"),
        (1799.9999999, "0:30:00"),  # a float sum of steps a hair below 1800 s is 1800 s
        (12 * 3600 + 15 * 60, "12:15:00"),
        (7 * 86400.0, "168:00:00"),  # hours are not wrapped into days
        (-0.5, "0:00:00"),
    ],
)
def test_hms_rounds_down_to_the_second(t_s: float, text: str) -> None:
    assert hms(t_s) == text


@pytest.mark.parametrize(
    ("done_s", "total_s", "pct"),
    [
        (0.0, 3600.0, 0),
        (900.0, 3600.0, 25),
        (3599.6, 3600.0, 99),  # not 100 while some of the run is left
        (3600.0, 3600.0, 100),
        (1799.9999999, 3600.0, 50),
        (5.0, 0.0, 100),
    ],
)
def test_percent_done_rounds_down_to_a_whole_percent(done_s: float, total_s: float, pct: int) -> None:
    assert percent_done(done_s, total_s) == pct
