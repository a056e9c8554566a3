"""What the site reports: plain dataclasses shared by the plant, the agent's state and the wire.

``twin.plant.Plant.readings()`` produces a :class:`Readings`; ``twin.state.TwinState.update()``
consumes one. The MQTT agent converts wire messages into the same classes (one message may fill
only part of a :class:`RackReading`: ``None`` means "not in this message"), so the in-process
evaluation and the networked service share one code path.

Units are SI as named. Card arrays are numpy arrays of one rack's cards, in ``card_index`` order.
Readings may contain NaN or implausible values (a faulty sensor): consumers must check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from twin.workload import JobSpec, Phase

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "JOB_EVENT_KINDS",
    "MAX_PUMP_SPEED_FRAC",
    "CardBatch",
    "FacilityReading",
    "JobEvent",
    "JobReading",
    "LoopReading",
    "PduReading",
    "RackReading",
    "Readings",
    "pump_speed_in_range",
]


@dataclass(frozen=True)
class CardBatch:
    """One telemetry sample of a rack's cards (DCGM / nvidia-smi style).

    ``level`` is the DVFS level the card was commanded to (after the DVFS latency);
    ``clock_mhz`` is the clock it actually runs at, lower than the level's clock when the card's
    own protection (power brake, thermal slowdown) acts, 0 in the low-power state or when failed.
    ``waking`` cards have left the low-power state but are not usable yet. ``host_off``: the card's
    host is powered off (the card is then also ``low_power``); None where the source does not say.
    """

    card_index: IntArray
    power_w: FloatArray
    die_temp_c: FloatArray
    clock_mhz: FloatArray
    utilization: FloatArray  # 0..1
    level: IntArray
    low_power: BoolArray
    waking: BoolArray
    power_limit_w: FloatArray
    failed: BoolArray
    host_off: BoolArray | None = None

    def __post_init__(self) -> None:
        # one value per card in every column (the wire's codec checks the wire's; in-process producers
        # had no check, and the belief only counted such a batch invalid). Unrolled, with len(): a batch
        # is built per rack per reading: measured +0.3 us a batch of 64 cards (1.1 -> 1.4 us; the belief's
        # own check, dropped with it, took 1.5 us)
        try:
            n = len(self.card_index)
            ok = (
                len(self.power_w) == n
                and len(self.die_temp_c) == n
                and len(self.clock_mhz) == n
                and len(self.utilization) == n
                and len(self.level) == n
                and len(self.low_power) == n
                and len(self.waking) == n
                and len(self.power_limit_w) == n
                and len(self.failed) == n
                and (self.host_off is None or len(self.host_off) == n)
            )
            # and one value per card, not one row: a (n, 2) column has n rows (len) but 2n values
            ok = ok and self._one_value_per_row()
        except TypeError:  # a scalar where a column belongs
            ok = False
        if not ok:
            raise ValueError(_card_batch_problem(self))

    def _one_value_per_row(self) -> bool:
        """Whether every column is one-dimensional: arrays' ``ndim`` unrolled (medians of 15 side by side,
        a batch of 64 cards: +0.4 us over no check, where ``np.ndim`` on every column cost +2.3 us),
        ``np.ndim`` where a column is a list (tests and in-process producers may pass lists)."""
        try:
            return (
                self.card_index.ndim == 1
                and self.power_w.ndim == 1
                and self.die_temp_c.ndim == 1
                and self.clock_mhz.ndim == 1
                and self.utilization.ndim == 1
                and self.level.ndim == 1
                and self.low_power.ndim == 1
                and self.waking.ndim == 1
                and self.power_limit_w.ndim == 1
                and self.failed.ndim == 1
                and (self.host_off is None or self.host_off.ndim == 1)
            )
        except AttributeError:  # a list among the columns
            columns = (self.card_index, self.power_w, self.die_temp_c, self.clock_mhz, self.utilization, self.level)
            more = (self.low_power, self.waking, self.power_limit_w, self.failed)
            host_off = () if self.host_off is None else (self.host_off,)
            return all(np.ndim(c) == 1 for c in (*columns, *more, *host_off))


#: the fastest a rack loop's pump runs, as a fraction of its nominal speed: full speed. The plant
#: refuses a faster command (``Plant.set_pump_speed``: the site's lowest speed .. 1), the wire carries
#: 0 .. 100 % (``agent.wire``: a CDU reading or command beyond it is rejected whole), and the
#: controller plans speeds from the site's lowest up to full speed (``agent.pumps``). A loop reading
#: that reports a speed outside 0 .. this is no reading (``twin.state``, ``twin.estimate``), on the
#: wire and in process alike.
MAX_PUMP_SPEED_FRAC = 1.0


def pump_speed_in_range(speed_frac: float) -> bool:
    """A reported pump speed (fraction of nominal) a pump can have: 0 (stopped) .. full speed; False
    for NaN (not reported: the caller knows no speed, which is no fault of the reading)."""
    return 0.0 <= speed_frac <= MAX_PUMP_SPEED_FRAC


@dataclass(frozen=True)
class LoopReading:
    """The rack's CDU / coolant loop (Redfish-style)."""

    supply_temp_c: float
    return_temp_c: float
    flow_lpm: float
    pump_power_w: float
    # the pump's commanded speed (fraction of nominal) as the CDU reports it; NaN: not reported (unknown),
    # also when a caller leaves it out (the plant always gives it; agent.ingest gives NaN for the wire's None)
    pump_speed_frac: float = math.nan


@dataclass(frozen=True)
class PduReading:
    """The rack's PDU: everything the rack draws (cards + hosts + switches)."""

    power_w: float


@dataclass(frozen=True)
class RackReading:
    """One rack's readings. The card batch, the loop (CDU) and the PDU reading may come from separate
    sources with their own clocks (the agent merges a rack's messages into one reading): each part
    keeps the time it was stamped in ``cards_time_s`` / ``loop_time_s`` / ``pdu_time_s``, None where
    it is ``time_s`` (:meth:`part_time_s` says which applies). ``time_s`` is the newest of them."""

    rack: int  # rack index in the site (name: site.rack_names[rack])
    time_s: float
    cards: CardBatch | None = None
    loop: LoopReading | None = None
    pdu: PduReading | None = None
    cards_time_s: float | None = None
    loop_time_s: float | None = None
    pdu_time_s: float | None = None

    def part_time_s(self, part: Literal["cards", "loop", "pdu"]) -> float:
        """When the ``"cards"``, ``"loop"`` or ``"pdu"`` part was stamped."""
        if part == "cards":
            t = self.cards_time_s
        elif part == "loop":
            t = self.loop_time_s
        elif part == "pdu":
            t = self.pdu_time_s
        else:
            raise ValueError(f"no part {part!r} in a rack reading (cards, loop or pdu)")
        return self.time_s if t is None else t


@dataclass(frozen=True)
class FacilityReading:
    time_s: float
    ambient_temp_c: float
    facility_supply_temp_c: float
    facility_return_temp_c: float
    cooling_power_w: float  # pumps, dry cooler fans, chiller
    it_power_w: float
    facility_power_w: float  # IT + cooling + UPS losses + other overhead
    supply_setpoint_c: float  # rack loop supply set-point in force


@dataclass(frozen=True)
class JobReading:
    """A running job as the cluster scheduler / framework reports it."""

    job_id: str
    phase: Phase
    n_cards: int
    progress_frac: float  # share of the job's work done (0..1)
    throughput_frac: float  # current training speed relative to the top clock (0 when not computing)


@dataclass(frozen=True)
class Readings:
    time_s: float
    racks: tuple[RackReading, ...]
    facility: FacilityReading | None = None
    jobs: tuple[JobReading, ...] = ()


#: Kinds of :class:`JobEvent`.
JOB_EVENT_KINDS = ("submitted", "started", "phase", "requeued", "finished", "failed")


@dataclass(frozen=True)
class JobEvent:
    """Something happened to a job.

    * ``submitted``: queued; ``job`` carries the spec.
    * ``started``: placed on ``cards`` (the job then WAITs for start-up and for sleeping cards).
    * ``phase``: the job entered ``phase``.
    * ``requeued``: a card failed; the job rolled back to its last checkpoint and is queued again.
    * ``finished`` / ``failed``: the job is gone; its cards are free. A ``finished`` with ``dropped``
      was not received: the agent inferred it (``agent.job_catchup``: the scheduler's snapshot no longer
      lists the job), and whether the job finished or was cancelled is not known.
    """

    time_s: float
    job_id: str
    kind: str
    phase: Phase
    cards: tuple[int, ...] = ()
    job: JobSpec | None = None
    detail: str = ""
    dropped: bool = False  # a ``finished`` inferred, not received (see above)


_CARD_COLUMNS = (
    "power_w",
    "die_temp_c",
    "clock_mhz",
    "utilization",
    "level",
    "low_power",
    "waking",
    "power_limit_w",
    "failed",
    "host_off",
)


def _card_batch_problem(b: CardBatch) -> str:
    """What is wrong with a card batch's column lengths (the first column found)."""
    if np.ndim(b.card_index) != 1:
        return f"CardBatch.card_index must be one-dimensional, got shape {np.shape(b.card_index)}"
    n = len(b.card_index)
    for name in _CARD_COLUMNS:
        v = getattr(b, name)
        if v is not None and (np.ndim(v) != 1 or len(v) != n):
            return f"CardBatch.{name} has shape {np.shape(v)}, not one value for each of the {n} cards of card_index"
    return "CardBatch: columns of different lengths"
