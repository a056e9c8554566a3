"""The plant's value types: its configuration, what it refuses, and what it reports.

``PlantConfig`` (with ``SensorNoise`` and ``CardVariation``) says how ``twin.plant.Plant`` behaves
beyond the site spec; ``CommandError`` is a command it refuses; ``Truth``, ``Accounting`` and
``JobRecord`` are what it reports (exact state, run integrals, one job's record). Import them from
``twin.plant``, which re-exports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from twin.cooling import CoolingPoint
from twin.faults import Ambient
from twin.workload import Phase, PhaseModel

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class CommandError(ValueError):
    """A command the plant refuses (nothing of it was applied). ``reason`` is one line;
    ``failed_cards``: the cards of the command that have failed, when that is why (site indices)."""

    def __init__(self, reason: str, failed_cards: tuple[int, ...] = ()) -> None:
        self.reason = reason
        self.failed_cards = failed_cards
        super().__init__(reason)


@dataclass(frozen=True)
class SensorNoise:
    """Standard deviations of the Gaussian sensor noise (assumptions near data-sheet accuracies:
    NVML board power +-5 W, GPU temperature 1 deg C resolution, class-1 PDU metering, PT1000
    coolant sensors)."""

    power_sd_w: float = 3.0
    die_temp_sd_k: float = 0.5
    utilization_sd: float = 0.01  # relative: an idle card reads exactly 0
    coolant_temp_sd_k: float = 0.1
    flow_sd_frac: float = 0.01
    pdu_power_sd_frac: float = 0.005
    facility_sd_frac: float = 0.01
    ambient_sd_k: float = 0.2

    @classmethod
    def none(cls) -> SensorNoise:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class CardVariation:
    """Card-to-card spread of the TRUE parameters around the spec (relative standard deviations,
    clipped at +-3 sd). Assumptions: silicon lottery of a few percent in switching power, ~10% in
    leakage, a few percent in thermal interface quality (applied to both resistances)."""

    idle_sd_frac: float = 0.03
    dynamic_sd_frac: float = 0.02
    leakage_sd_frac: float = 0.10
    r_th_sd_frac: float = 0.03

    @classmethod
    def none(cls) -> CardVariation:
        return cls(0.0, 0.0, 0.0, 0.0)


#: How long a rack-loop pump slowed by a command stays slowed without another one (s): the simulator's
#: ``PlantConfig.pump_hold_s`` and the run scenario's ``[plant] pump_hold_s`` by default. The agent's
#: ``racktwin agent --check-config`` warns when its pump renewals do not come sooner.
DEFAULT_PUMP_HOLD_S: Final = 60.0


@dataclass(frozen=True)
class PlantConfig:
    """How the plant behaves beyond the site spec.

    * ``placement``: ``"builtin"`` (first-fit scheduler places queued jobs; the default here, for
      plants with no agent) or ``"external"`` (queued jobs wait for :meth:`Plant.place_job`; after
      ``external_timeout_s`` in the queue, 300 s here and 120 s in run scenarios
      (``twin.scenario.DEFAULT_EXTERNAL_TIMEOUT_S``), the built-in scheduler places them anyway).
    * ``backfill_wait_s``: once the oldest waiting job has waited this long, it gets a reservation
      (EASY backfilling: the expected time enough cards are free, from the running jobs' remaining
      work); jobs behind it start ahead only if they fit now and are expected to end before the
      reservation or fit in the cards it leaves spare (so big jobs do not starve and small jobs
      do not leave cards idle meanwhile).
    * ``supply_time_constant_s``: the rack supply temperature follows its set-point as a first-order
      lag (CDU valve loop, assumption).
    * ``min_power_limit_w``: the lowest power limit a card accepts (H100 SXM: 200 W, ``nvidia-smi -q``
      "Min Power Limit"). The power brake goes no lower than the slowest DVFS level of the table
      (a real card would clock lower still): a card computing at u = 1 draws ~315 W there on the
      example site, whatever lower limit it was given (no policy here sets one that low; a full
      rack's fail-safe cap is ~630 W a card).
    * ``pump_hold_s``: a rack-loop pump slowed by :meth:`Plant.set_pump_speed` returns to full speed
      this long after the last command for it, unless renewed (the CDU's fallback on a lost
      supervisor, as building controllers relinquish a point whose writer stopped writing).
    """

    seed: int = 0
    noise: SensorNoise = field(default_factory=SensorNoise)
    variation: CardVariation = field(default_factory=CardVariation)
    ambient: Ambient | None = None
    phases: PhaseModel = field(default_factory=PhaseModel)
    placement: str = "builtin"
    external_timeout_s: float = 300.0
    backfill_wait_s: float = 1800.0
    supply_time_constant_s: float = 120.0
    min_power_limit_w: float = 200.0
    initial_level: int = 0
    initial_low_power: bool = False
    pump_hold_s: float = DEFAULT_PUMP_HOLD_S

    def __post_init__(self) -> None:
        if self.placement not in ("builtin", "external"):
            raise ValueError(f"placement must be 'builtin' or 'external', got {self.placement!r}")
        if not self.external_timeout_s >= 0:
            raise ValueError("external_timeout_s must be >= 0")
        if not self.supply_time_constant_s >= 0:
            raise ValueError("supply_time_constant_s must be >= 0")
        if not (math.isfinite(self.pump_hold_s) and self.pump_hold_s > 0):
            raise ValueError("pump_hold_s must be a finite time > 0 s")


@dataclass(frozen=True)
class Truth:
    """Exact state of the site (ground truth for judging controllers and estimators)."""

    time_s: float
    card_power_w: FloatArray
    die_temp_c: FloatArray
    plate_temp_c: FloatArray
    level: IntArray  # commanded level in force
    effective_level: IntArray  # level after the card's protection
    utilization: FloatArray
    low_power: BoolArray
    failed: BoolArray
    r_total_k_per_w: FloatArray  # true die-to-inlet resistance of every card
    rack_power_w: FloatArray  # cards + host overhead
    rack_heat_w: FloatArray  # heat into each rack loop
    rack_max_die_temp_c: FloatArray
    rack_supply_temp_c: FloatArray
    rack_return_temp_c: FloatArray
    rack_flow_lpm: FloatArray
    rack_pump_speed_frac: FloatArray  # commanded pump speed in force (flow = speed x any fault's fraction)
    supply_setpoint_c: float
    ambient_temp_c: float
    cooling: CoolingPoint
    host_off: BoolArray  # per host (site.card_host()): powered off
    rack_host_power_w: FloatArray  # per rack: hosts and switches (host_overhead_w less the off hosts' saving)
    # per card: held by a job during the step just taken (card_power_w is that step's power; a job
    # that ended or started as the step ended has changed free_cards() already)
    card_busy_in_step: BoolArray

    @property
    def it_power_w(self) -> float:
        return float(self.rack_power_w.sum())

    @property
    def facility_power_w(self) -> float:
        return self.cooling.facility_power_w


@dataclass(frozen=True)
class Accounting:
    """Integrals since the start of the run (J, s, card-s)."""

    time_s: float
    it_energy_j: float
    cooling_energy_j: float
    facility_energy_j: float
    work_card_s: float  # top-clock-equivalent card-seconds of training kept (after rollbacks)
    lost_work_card_s: float  # work rolled back by card failures
    jobs_submitted: int
    jobs_finished: int
    jobs_failed: int
    jobs_running: int
    jobs_queued: int
    # jobs the plant's own scheduler started under external placement (an agent's job not placed by it
    # within PlantConfig.external_timeout_s); 0 under builtin placement
    jobs_placed_by_plant: int
    slo_violation_s: float  # job-seconds computing below the job's min_throughput_frac
    rack_over_limit_s: float  # rack-seconds above the rack power limit
    rack_over_limit_j: float  # energy above the rack limits
    throttled_card_s: float  # card-seconds below the commanded level (own protection)
    max_die_temp_c: float

    @property
    def pue(self) -> float:
        return self.facility_energy_j / self.it_energy_j if self.it_energy_j > 0 else math.inf

    @property
    def throughput_card(self) -> float:
        """Mean throughput: top-clock-equivalent cards of training over the run."""
        return self.work_card_s / self.time_s if self.time_s > 0 else 0.0

    @property
    def facility_energy_per_work_j(self) -> float:
        """Facility energy per top-clock-equivalent card-second of training."""
        return self.facility_energy_j / self.work_card_s if self.work_card_s > 0 else math.inf


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    state: str  # "pending" (not yet submitted), "queued", "running", "finished", "failed"
    phase: Phase
    n_cards: int
    priority: float
    submit_time_s: float
    start_time_s: float | None  # first placement
    finish_time_s: float | None
    compute_start_s: float | None  # first step of training (after its cards woke, its hosts booted, start-up)
    work_done_card_s: float
    work_total_card_s: float
    slo_violation_s: float
    restarts: int
    cards: tuple[int, ...]
