"""Planners for the controller's fallback paths: one whose real HiGHS solves start late (the deadline
and fallback paths of the planner and the controller, exercised with the real solver rather than a
mock), and one that refuses every problem."""

from __future__ import annotations

import time
from typing import Any

from models.dvfs_solver import DvfsSolver
from models.problem import ProblemError
from models.solve import CyclePlanner

#: How late each solve starts (s): past any deadline the tests give (0.05 s).
LATE_BY_S = 0.3


class LateSolver(DvfsSolver):
    """The real solve, started ``late_by_s`` (default :data:`LATE_BY_S`) late."""

    def __init__(self, late_by_s: float = LATE_BY_S) -> None:
        super().__init__()
        self.late_by_s = late_by_s

    def solve(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.late_by_s)
        return super().solve(*args, **kwargs)


class LatePlanner(CyclePlanner):
    """A :class:`CyclePlanner` whose every solver is a :class:`LateSolver`."""

    def solver_for(self, supply_c: float, chunk: int | None = None) -> Any:
        return LateSolver()


class RefusingPlanner(CyclePlanner):
    """A :class:`CyclePlanner` that refuses every problem (``models.problem.ProblemError``): the
    controller's path for problem data the models refuse, which no known reading reaches."""

    REASON = "refused by the test's planner"

    def plan(self, *args: Any, **kwargs: Any) -> Any:
        raise ProblemError(self.REASON)
