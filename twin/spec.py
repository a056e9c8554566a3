"""Hardware and site specifications: frozen dataclasses loaded from TOML and validated.

A site is one TOML file (see ``examples/supernode-512.toml``, which cites a source for every value).
All quantities are SI with the unit in the key's name (``power_limit_w``, ``supply_temp_c``,
``flow_per_card_lpm``); conversions to the twin's internal units happen in the physics modules.

Every problem in a spec file is reported as a :class:`SpecError` that names the file, the field
(dotted path) and what is wrong: unknown key (with the closest known key and its unit), missing
field, wrong type, value out of its physical range, tables of unequal length, a DVFS table that
is not ordered from the fastest level (0) down, an idle power at or above the card's power limit, a
reference temperature above the card's slowdown temperature, a flow per card below the measured
cold-plate table, a site of more than :data:`MAX_SITE_CARDS` cards, or a rack power limit at or below
the least a rack that can run a job draws (:meth:`SiteSpec.rack_floor_w`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from twin.tables import SpecError, decode_table, read_toml
from twin.tables import rng as _rng

__all__ = [
    "MAX_RACK_POWER_W",
    "MAX_SITE_CARDS",
    "CardSpec",
    "CduSpec",
    "ColdPlateSpec",
    "FacilitySpec",
    "LoopSpec",
    "RackSpec",
    "SiteSpec",
    "SpecError",
    "load_site",
    "site_from_dict",
]

#: Most cards a site may have (``supernodes`` x ``torus_dims[0]`` x ``torus_dims[1]`` x ``torus_dims[2]``),
#: checked before anything is allocated: a typo in ``torus_dims`` (up to 1,000 per axis, 10^9 cards per
#: supernode) made the twin die with MemoryError, as it keeps float arrays per card and per card and
#: DVFS level. A million cards is 122 times the largest site any benchmark or example runs (8,192
#: cards: 16 supernodes of 512, benchmarks/bench_models.py, bench_sim.py, bench_twin.py), and its
#: arrays stay small (8 MB per card array, 64 MB per card x 8-level table).
MAX_SITE_CARDS = 1_000_000

#: Highest rack power limit a site may have (``rack.power_limit_w``, W), and so the range's top of a
#: rack margin (``control.rack_margin_w``, a scenario's ``margins.rack_margin_w``): a narrower one
#: would refuse a margin that a site with larger racks allows (:meth:`SiteSpec.rack_margin_problem`).
MAX_RACK_POWER_W = 1.0e6


def check_card_count(supernodes: int, torus_dims: tuple[int, ...]) -> str | None:
    """Why a site of ``supernodes`` supernodes of ``torus_dims`` cards is too large for the twin
    (None: it is not): more than :data:`MAX_SITE_CARDS` cards."""
    n = supernodes
    for d in torus_dims:
        n *= d
    if n <= MAX_SITE_CARDS:
        return None
    dims = " x ".join(str(d) for d in torus_dims)
    return (
        f"{n:,} cards (supernodes {supernodes} x torus_dims {dims}) is more than the {MAX_SITE_CARDS:,} "
        "cards a site may have: check torus_dims and supernodes for a typo"
    )


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CardSpec:
    """One accelerator card type.

    Power model (see ``twin.power``): at DVFS level ``k`` with utilization ``u`` and die
    temperature ``T``::

        P = idle_power_w * (V_k/V_0)^2                               (active idle, u = 0)
          + leakage_w_per_k * (V_k/V_0) * (T - reference_temp_c)       (leakage vs temperature)
          + u * dynamic_power_w * (f_k/f_0) * (V_k/V_0)^2              (switching, C f V^2)
    """

    model: str
    clocks_mhz: tuple[float, ...] = field(metadata=_rng(100.0, 5000.0, lo_open=True))
    voltages_v: tuple[float, ...] = field(metadata=_rng(0.3, 2.0, lo_open=True))
    power_limit_w: float = field(metadata=_rng(50.0, 3000.0))
    idle_power_w: float = field(metadata=_rng(0.0, 1000.0, lo_open=True))
    dynamic_power_w: float = field(metadata=_rng(0.0, 3000.0, lo_open=True))
    reference_temp_c: float = field(metadata=_rng(0.0, 100.0))
    leakage_w_per_k: float = field(metadata=_rng(0.0, 20.0))
    low_power_idle_w: float = field(metadata=_rng(0.0, 1000.0))
    low_power_leakage_w_per_k: float = field(metadata=_rng(0.0, 20.0))
    wake_latency_s: float = field(metadata=_rng(0.0, 600.0))
    dvfs_latency_s: float = field(metadata=_rng(0.0, 60.0))
    slowdown_temp_c: float = field(metadata=_rng(40.0, 130.0))
    max_temp_c: float = field(metadata=_rng(40.0, 150.0))
    die_heat_capacity_j_per_k: float = field(metadata=_rng(0.0, 1.0e5, lo_open=True))
    r_die_to_case_k_per_w: float = field(metadata=_rng(0.0, 1.0, lo_open=True))

    @property
    def n_levels(self) -> int:
        return len(self.clocks_mhz)

    @property
    def top_clock_mhz(self) -> float:
        return self.clocks_mhz[0]

    @property
    def max_plausible_clock_mhz(self) -> float:
        """An SM clock reading above this is refused as no sensor's (five times the top DVFS clock, as
        a power above five times the card's limit is): the belief and the estimator take none."""
        return 5.0 * max(self.clocks_mhz)

    def level_of_clock(self, clock_mhz: float) -> int:
        """The slowest level whose clock is at least ``clock_mhz`` (clamped to the table)."""
        level = 0
        for k, f in enumerate(self.clocks_mhz):
            if f >= clock_mhz - 1e-9:
                level = k
        return level


@dataclass(frozen=True)
class ColdPlateSpec:
    """Cold plate: thermal resistance case -> coolant inlet vs flow per plate (interpolated)."""

    fluid: str
    flow_lpm: tuple[float, ...] = field(metadata=_rng(0.0, 100.0, lo_open=True))
    r_case_to_coolant_k_per_w: tuple[float, ...] = field(metadata=_rng(0.0, 1.0, lo_open=True))
    heat_capacity_j_per_k: float = field(metadata=_rng(0.0, 1.0e6, lo_open=True))


@dataclass(frozen=True)
class RackSpec:
    """One rack: the cards of one z-plane of the supernode torus plus host overhead.

    ``host_overhead_w`` is everything but the cards with every host on (CPUs, DRAM, NICs, switches).
    With ``hosts_per_rack`` > 0 the rack's cards sit in that many hosts of consecutive cards, each of
    which can be powered off as a whole when none of its cards runs a job (as Slurm's power saving
    does for idle nodes): an off host draws ``host_off_power_w`` instead of ``host_power_w`` (its
    share of ``host_overhead_w``), its cards draw nothing (an HGX baseboard is fed by its host's
    supplies), and it needs ``host_boot_s`` to boot before its cards can wake. ``hosts_per_rack = 0``
    (the default) leaves hosts always on.
    """

    host_overhead_w: float = field(metadata=_rng(0.0, 1.0e6))
    power_limit_w: float = field(metadata=_rng(1.0e3, MAX_RACK_POWER_W))
    hosts_per_rack: int = field(default=0, metadata=_rng(0, 4096))
    host_power_w: float = field(default=0.0, metadata=_rng(0.0, 1.0e5))
    host_off_power_w: float = field(default=0.0, metadata=_rng(0.0, 1.0e4))
    host_boot_s: float = field(default=0.0, metadata=_rng(0.0, 7200.0))


@dataclass(frozen=True)
class LoopSpec:
    """The rack (technology / secondary) coolant loop, one per rack, fed by its CDU."""

    fluid: str
    density_kg_per_m3: float = field(metadata=_rng(500.0, 2000.0))
    specific_heat_j_per_kg_k: float = field(metadata=_rng(1000.0, 6000.0))
    flow_per_card_lpm: float = field(metadata=_rng(0.0, 100.0, lo_open=True))
    pump_head_kpa: float = field(metadata=_rng(0.0, 2000.0, lo_open=True))
    pump_efficiency: float = field(metadata=_rng(0.05, 1.0))
    # Largest return - supply rise the loop may run at when its pump is slowed (the CDU's design
    # rise: docs/twin.md); the pump never runs below the speed that keeps each plate's flow within
    # the measured cold-plate table (SiteSpec.min_pump_speed_frac).
    max_delta_t_k: float = field(default=16.3, metadata=_rng(1.0, 60.0))


@dataclass(frozen=True)
class CduSpec:
    """Coolant distribution unit between the rack loop and the facility water loop."""

    approach_k: float = field(metadata=_rng(0.0, 20.0))
    facility_flow_ratio: float = field(metadata=_rng(0.2, 5.0))
    facility_specific_heat_j_per_kg_k: float = field(metadata=_rng(1000.0, 6000.0))
    facility_pump_head_kpa: float = field(metadata=_rng(0.0, 2000.0))
    facility_pump_efficiency: float = field(metadata=_rng(0.05, 1.0))


@dataclass(frozen=True)
class FacilitySpec:
    """Heat rejection (dry cooler with a trim chiller) and the facility's other overheads."""

    ambient_temp_c: float = field(metadata=_rng(-40.0, 55.0))
    supply_temp_c: float = field(metadata=_rng(5.0, 60.0))
    supply_temp_options_c: tuple[float, ...] = field(metadata=_rng(5.0, 60.0))
    dry_cooler_approach_k: float = field(metadata=_rng(0.5, 30.0))
    dry_cooler_fan_power_fraction: float = field(metadata=_rng(0.0, 0.2))
    dry_cooler_min_fan_speed_frac: float = field(metadata=_rng(0.0, 1.0))
    chiller_carnot_efficiency: float = field(metadata=_rng(0.05, 1.0))
    chiller_max_cop: float = field(metadata=_rng(1.0, 50.0))
    chiller_condenser_approach_k: float = field(metadata=_rng(0.0, 30.0))
    chiller_evaporator_approach_k: float = field(metadata=_rng(0.0, 30.0))
    ups_loss_fraction: float = field(metadata=_rng(0.0, 0.5))
    other_overhead_w: float = field(metadata=_rng(0.0, 1.0e8))


@dataclass(frozen=True)
class SiteSpec:
    """A whole site: supernodes of racks of cards, their cooling and the facility.

    Cards of a supernode form a 3D torus of ``torus_dims`` = (x, y, z); rack ``z`` of a supernode
    holds the x*y cards of torus plane z, so ``racks_per_supernode == torus_dims[2]``. Card ``i`` of
    the site is in supernode ``i // (x*y*z)``, rack ``i // (x*y)`` and at torus position
    (x, y, z) = ((i % (x*y)) // y, i % y, rack % z).
    """

    name: str
    pue_target: float = field(metadata=_rng(1.0, 3.0))
    supernodes: int = field(metadata=_rng(1, 10_000))
    racks_per_supernode: int = field(metadata=_rng(1, 1_000))
    torus_dims: tuple[int, ...] = field(metadata=_rng(1, 1_000))
    card: CardSpec
    cold_plate: ColdPlateSpec
    rack: RackSpec
    loop: LoopSpec
    cdu: CduSpec
    facility: FacilitySpec

    # ---- derived layout ---------------------------------------------------------------------
    @property
    def cards_per_rack(self) -> int:
        return int(self.torus_dims[0] * self.torus_dims[1])

    @property
    def cards_per_supernode(self) -> int:
        """Cards of one supernode: the largest job, which never spans two (its cards are consecutive)."""
        return self.racks_per_supernode * self.cards_per_rack

    @property
    def n_racks(self) -> int:
        return self.supernodes * self.racks_per_supernode

    @property
    def n_cards(self) -> int:
        return self.n_racks * self.cards_per_rack

    @property
    def rack_names(self) -> tuple[str, ...]:
        return tuple(f"r{r}" for r in range(self.n_racks))

    def card_rack(self) -> npt.NDArray[np.int64]:
        """Rack index of every card, shape (n_cards,)."""
        return np.repeat(np.arange(self.n_racks, dtype=np.int64), self.cards_per_rack)

    def site_cards(self, by_rack: Mapping[str, Iterable[int]]) -> list[int]:
        """The site indices of cards named per rack (rack name -> rack-local indices, as the wire names
        them: a placement, a ``card_failed`` refusal), rack by rack in the order given. ValueError for a
        rack the site does not have or a rack-local index outside 0..cards_per_rack-1 (a decoded message
        names neither; a caller reading names from elsewhere leaves those out first)."""
        cpr = self.cards_per_rack
        index = {name: r for r, name in enumerate(self.rack_names)}
        out: list[int] = []
        for rack, local in by_rack.items():
            r = index.get(rack)
            if r is None:
                raise ValueError(f"rack {rack!r} is not in the site")
            for c in local:
                if not 0 <= int(c) < cpr:
                    raise ValueError(f"card {int(c)} of rack {rack} is not within 0..{cpr - 1}")
                out.append(r * cpr + int(c))
        return out

    def cards_by_rack(self, cards: Iterable[int]) -> dict[str, list[int]]:
        """Site card indices per rack (the reverse of :meth:`site_cards`): rack name -> rack-local
        indices, the racks in the order of their first card, the cards in the order given. ValueError
        for an index outside 0..n_cards-1."""
        cpr, names, n = self.cards_per_rack, self.rack_names, self.n_cards
        out: dict[str, list[int]] = {}
        for c in cards:
            if not 0 <= int(c) < n:
                raise ValueError(f"card {int(c)} is not within the site's 0..{n - 1}")
            r, local = divmod(int(c), cpr)
            out.setdefault(names[r], []).append(local)
        return out

    def rack_supernode(self) -> npt.NDArray[np.int64]:
        """Supernode index of every rack, shape (n_racks,)."""
        return np.repeat(np.arange(self.supernodes, dtype=np.int64), self.racks_per_supernode)

    @property
    def hosts_managed(self) -> bool:
        """Hosts can be powered off (``rack.hosts_per_rack`` > 0)."""
        return self.rack.hosts_per_rack > 0

    @property
    def cards_per_host(self) -> int:
        """Cards of one host (the whole rack where hosts are not modelled)."""
        h = self.rack.hosts_per_rack
        return self.cards_per_rack // h if h > 0 else self.cards_per_rack

    @property
    def n_hosts(self) -> int:
        """Hosts of the site (one per rack where hosts are not modelled)."""
        return self.n_cards // self.cards_per_host

    def card_host(self) -> npt.NDArray[np.int64]:
        """Host index of every card, shape (n_cards,): hosts are runs of consecutive cards."""
        return np.arange(self.n_cards, dtype=np.int64) // self.cards_per_host

    def host_saving_w(self) -> float:
        """Power one host saves when off: its on power minus its off power (0 if not modelled)."""
        r = self.rack
        return max(r.host_power_w - r.host_off_power_w, 0.0) if r.hosts_per_rack > 0 else 0.0

    def host_off_saving_w(self) -> float:
        """Power an idle host with its cards asleep saves when it goes off: :meth:`host_saving_w`
        plus its cards' low-power idle power, which an off host does not feed (0 if not modelled)."""
        if self.rack.hosts_per_rack <= 0:
            return 0.0
        return self.host_saving_w() + self.cards_per_host * self.card.low_power_idle_w

    def host_break_even_s(self) -> float:
        """Idle time after which powering a host off pays even if it must boot again at once (the
        break-even time of the ski-rental problem): a boot's energy (``host_boot_s`` at the host's on
        power, its cards asleep) over the power an off host saves (the host less its off power, and
        its cards asleep). Waiting this long before powering off spends at most twice the energy of
        the best choice made with hindsight of how long the host stays idle (Karlin, Manasse, McGeoch
        and Owicki, Algorithmica 1994; Irani, Shukla and Gupta, ACM TECS 2003). 311 s on the example
        site (300 s boot, 1,000 W on, 50 W off, 8 cards at 52.8 W asleep); 0 without host power."""
        r = self.rack
        if r.hosts_per_rack <= 0:
            return 0.0
        cards_asleep_w = self.cards_per_host * self.card.low_power_idle_w
        saving_w = self.host_off_saving_w()
        if saving_w <= 0.0:
            return math.inf
        return r.host_boot_s * (r.host_power_w + cards_asleep_w) / saving_w

    def card_torus_xyz(self) -> npt.NDArray[np.int64]:
        """Torus coordinates (x, y, z) of every card inside its supernode, shape (n_cards, 3)."""
        _x, y, z = self.torus_dims
        i = np.arange(self.n_cards, dtype=np.int64)
        within = i % self.cards_per_rack
        rack_z = (i // self.cards_per_rack) % z
        return np.stack([within // y, within % y, rack_z], axis=1)

    def rack_floor_card_w(self) -> float:
        """Least power one card of a powered host draws: asleep (low-power idle) with its die as cold as
        it can be, at the coldest supply set-point (``facility.supply_temp_options_c``; a die is never
        colder than the coolant that cools it), per the twin's power model (``twin.power``: low-power
        leakage below ``reference_temp_c`` lowers it, never under its modelling floor)."""
        from twin.power import PowerModel  # twin.power imports this module

        coldest_c = np.array([min(self.facility.supply_temp_options_c)], dtype=np.float64)
        return float(PowerModel.from_card(self.card).low_power_w(coldest_c)[0])

    def rack_floor_w(self) -> float:
        """Least power a rack that can run a job draws: its hosts and switches with as many hosts off as
        may be, and the cards of the hosts on asleep at :meth:`rack_floor_card_w`. A rack limit at or
        below it is refused: no rack could run work within it.

        Hosts always on (``hosts_per_rack = 0``): ``host_overhead_w`` plus every card asleep. Hosts that
        can be powered off lower it, as ``racktwin optimize`` plans idle hosts off to fit a tight
        limit (tests/models/test_cli.py: an 11 kW limit, under the 11,616 W of every host on, holds one
        8-card job with the other hosts off): the floor is then one host on with its cards asleep and
        every other host off (``host_overhead_w`` less :meth:`host_saving_w` per off host; an off host's
        cards draw nothing). Below that only every host off would fit: a rack that runs nothing. Failed
        cards (0 W) are a fault, not a state to plan for."""
        r = self.rack
        if r.hosts_per_rack <= 0:
            return r.host_overhead_w + self.cards_per_rack * self.rack_floor_card_w()
        off = r.hosts_per_rack - 1
        return r.host_overhead_w - off * self.host_saving_w() + self.cards_per_host * self.rack_floor_card_w()

    def rack_power_limits_w(self) -> npt.NDArray[np.float64]:
        return np.full(self.n_racks, self.rack.power_limit_w)

    def rack_margin_problem(self, rack_margin_w: float) -> str | None:
        """Why a rack margin (W kept free under every rack's power limit) does not fit this site, or
        ``None`` when it does: it must be below the lowest rack power limit, or no power would be left
        for the racks. One rule for the agent's ``control.rack_margin_w`` (agent.config) and a
        scenario's ``margins.rack_margin_w`` (``racktwin optimize``); each caller names its own field."""
        rack_limit_w = float(self.rack_power_limits_w().min())
        if rack_margin_w < rack_limit_w:
            return None
        return (
            f"must be below the site's rack power limit ({rack_limit_w:g} W), got {rack_margin_w:g} W: "
            "no power would be left for the racks"
        )

    def loop_flow_per_rack_lpm(self) -> float:
        return self.loop.flow_per_card_lpm * self.cards_per_rack

    def min_pump_speed_frac(self) -> float:
        """Lowest rack-loop pump speed (fraction of nominal; flow follows speed): the one that gives
        each plate the smallest flow of the measured cold-plate table, so the plate resistance is
        never extrapolated below measured data."""
        return float(min(1.0, self.cold_plate.flow_lpm[0] / self.loop.flow_per_card_lpm))

    def with_supernodes(self, supernodes: int) -> SiteSpec:
        """The same hardware with another number of supernodes (for scale studies)."""
        if supernodes < 1:
            raise ValueError("supernodes must be >= 1")
        if (problem := check_card_count(supernodes, self.torus_dims)) is not None:
            raise ValueError(problem)
        return dataclasses.replace(self, supernodes=supernodes, name=f"{self.name}-x{supernodes}")


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------


def load_site(path: str | Path) -> SiteSpec:
    """Read and validate a site spec TOML file. Raises :class:`SpecError` on any problem."""
    return site_from_dict(read_toml(path), source=str(path))


#: The tables of a site spec file; a file with two or more of them is a site spec.
_SITE_SECTIONS = ("card", "cold_plate", "rack", "loop", "cdu", "facility")


def site_spec_sections(data: Mapping[str, Any]) -> list[str]:
    """The site spec tables a parsed TOML file holds when it looks like a site spec (two or more of
    them), else an empty list: for loaders of other files to say "this is a site spec" rather than
    report its first key as unknown."""
    sections = [k for k in _SITE_SECTIONS if isinstance(data.get(k), Mapping)]
    return sections if len(sections) >= 2 else []


#: The kinds of racktwin TOML files: name -> (top-level keys no other kind has, where such a file goes).
_FILE_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "site spec": (
        ("pue_target", "racks_per_supernode", "torus_dims", *_SITE_SECTIONS),
        "name it in the `site` key of a scenario or an agent configuration",
    ),
    "run scenario": (
        ("duration_s", "telemetry_period_s", "workload", "plant", "targets", "ambient", "phases", "faults"),
        "racktwin evaluate, sim and demo take it with --scenario",
    ),
    "optimize scenario": (
        ("ambient_c", "supply_temp_c", "ready_reserve_cards", "failed_cards", "margins", "solver", "generate", "queue"),
        "racktwin optimize takes it",
    ),
    "agent configuration": (
        ("site_id", "mode", "broker", "control", "journal", "http", "log"),
        "racktwin agent takes it with --config",
    ),
}


def check_file_kind(data: Mapping[str, Any], expected: str, source: str) -> None:
    """Refuse a racktwin file of another kind than ``expected`` (a key of :data:`_FILE_KINDS`): one
    with none of the keys only ``expected`` files have and some only another kind has is named as
    that kind, not reported as its first unknown key (whose nearest known key misleads)."""
    if any(k in data for k in _FILE_KINDS[expected][0]):
        return
    found = {kind: [k for k in keys if k in data] for kind, (keys, _) in _FILE_KINDS.items() if kind != expected}
    kind = max(found, key=lambda k: len(found[k]))
    if found[kind]:
        raise SpecError(
            source,
            "",
            f"this looks like {'an' if kind[0] in 'aeiou' else 'a'} {kind} ({', '.join(found[kind])}), "
            f"not {'an' if expected[0] in 'aeiou' else 'a'} {expected}: {_FILE_KINDS[kind][1]}",
        )


#: With ``rack.hosts_per_rack`` > 0 these must be given too (none has a default that fits a real host).
_HOST_KEYS = ("host_power_w", "host_off_power_w", "host_boot_s")


def site_from_dict(data: dict[str, Any], source: str = "<site>") -> SiteSpec:
    """Build and validate a :class:`SiteSpec` from parsed TOML data."""
    check_file_kind(data, "site spec", source)
    _check_host_keys_given(data, source)
    site = decode_table(SiteSpec, data, source)
    _check_site(site, source)
    return site


def _check_host_keys_given(data: dict[str, Any], source: str) -> None:
    """Host power-down is all four keys or none: a missing boot time or off power read as 0 would
    power real hosts off the moment they idle (a 0 s break-even time) or overstate what they save,
    and host keys without ``hosts_per_rack`` would be ignored (hosts always on, silently)."""
    rack = data.get("rack")
    if not isinstance(rack, dict):
        return
    if "hosts_per_rack" not in rack:
        given = [k for k in _HOST_KEYS if k in rack]
        if given:  # the other keys without it were read and ignored: hosts silently stayed on
            raise SpecError(
                source,
                "rack.hosts_per_rack",
                f"missing, but {', '.join(given)} {'is' if len(given) == 1 else 'are'} given: host power-down "
                "is all four keys or none (hosts_per_rack = 0 keeps hosts always on)",
            )
        return
    hosts = rack["hosts_per_rack"]
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts <= 0:
        return  # hosts not managed, or a value the table's own check refuses
    missing = [k for k in _HOST_KEYS if k not in rack]
    if missing:
        raise SpecError(
            source,
            f"rack.{missing[0]}",
            f"missing: rack.hosts_per_rack > 0 needs {', '.join(_HOST_KEYS)} as well (missing: {', '.join(missing)})",
        )


def _check_site(site: SiteSpec, source: str) -> None:
    """Cross-field checks that a per-field range cannot express, in this order (the first that fails is
    reported)."""
    _check_plate_fluid(site, source)
    _check_card_levels(site, source)
    _check_card_limits(site, source)
    _check_cold_plate_table(site, source)
    _check_layout(site, source)
    _check_hosts(site, source)
    _check_supply_temps(site, source)
    _check_rack_floor(site, source)


def _check_plate_fluid(site: SiteSpec, source: str) -> None:
    """The cold plate's resistance table is for the coolant the loop carries."""
    if site.cold_plate.fluid.strip().casefold() != site.loop.fluid.strip().casefold():
        raise SpecError(
            source,
            "cold_plate.fluid",
            f"{site.cold_plate.fluid!r}, but the loop carries {site.loop.fluid!r}: the plate's resistance table "
            "must be measured in the loop's coolant (fluid is a label: the table, density and heat capacity "
            "are what the twin computes with)",
        )


def _check_card_levels(site: SiteSpec, source: str) -> None:
    """The DVFS table: one voltage per clock level, clocks strictly falling, voltages never rising."""
    card = site.card
    if len(card.voltages_v) != len(card.clocks_mhz):
        raise SpecError(
            source,
            "card.voltages_v",
            f"has {len(card.voltages_v)} entries but card.clocks_mhz has {len(card.clocks_mhz)}: one voltage per level",
        )
    for k in range(1, card.n_levels):
        if not card.clocks_mhz[k] < card.clocks_mhz[k - 1]:
            raise SpecError(
                source,
                "card.clocks_mhz",
                "DVFS table must be strictly decreasing (level 0 is the fastest): "
                f"level {k} ({card.clocks_mhz[k]:g} MHz) >= level {k - 1} ({card.clocks_mhz[k - 1]:g} MHz)",
            )
        if card.voltages_v[k] > card.voltages_v[k - 1]:
            raise SpecError(
                source,
                "card.voltages_v",
                "voltage must not rise as the clock falls: "
                f"level {k} ({card.voltages_v[k]:g} V) > level {k - 1} ({card.voltages_v[k - 1]:g} V)",
            )


def _check_card_limits(site: SiteSpec, source: str) -> None:
    """The card's temperatures in order (reference <= slowdown < max) and its idle powers below its
    power limit, low-power idle below active idle."""
    card = site.card
    if card.reference_temp_c > card.slowdown_temp_c:
        # The idle powers are measured at the reference temperature at level 0; above the slowdown
        # temperature the firmware slows the clock, so no card shows its level-0 idle power there, and
        # every die the twin runs (below slowdown) would be a downward extrapolation of leakage.
        raise SpecError(
            source,
            "card.reference_temp_c",
            f"{card.reference_temp_c:g} deg C is above card.slowdown_temp_c ({card.slowdown_temp_c:g} deg C): "
            "the idle powers (card.idle_power_w, card.low_power_idle_w) are measured at it at level 0, which "
            "a card does not hold above its slowdown temperature",
        )
    if card.slowdown_temp_c >= card.max_temp_c:
        raise SpecError(
            source,
            "card.slowdown_temp_c",
            f"must be below card.max_temp_c ({card.max_temp_c:g} deg C), got {card.slowdown_temp_c:g}",
        )
    if card.idle_power_w >= card.power_limit_w:
        raise SpecError(
            source,
            "card.idle_power_w",
            f"an idle card must draw less than its power limit (card.power_limit_w = {card.power_limit_w:g} W), "
            f"got {card.idle_power_w:g}",
        )
    if card.low_power_idle_w >= card.power_limit_w:
        raise SpecError(
            source,
            "card.low_power_idle_w",
            f"the low-power idle state must draw less than the card's power limit "
            f"(card.power_limit_w = {card.power_limit_w:g} W), got {card.low_power_idle_w:g}",
        )
    if card.low_power_idle_w >= card.idle_power_w:
        raise SpecError(
            source,
            "card.low_power_idle_w",
            f"the low-power idle state must draw less than active idle ({card.idle_power_w:g} W), "
            f"got {card.low_power_idle_w:g}",
        )


def _check_cold_plate_table(site: SiteSpec, source: str) -> None:
    """The cold plate's table (flow rising, resistance never rising with it) covers the loop's flow
    per card."""
    cp = site.cold_plate
    if len(cp.flow_lpm) != len(cp.r_case_to_coolant_k_per_w):
        raise SpecError(
            source,
            "cold_plate.r_case_to_coolant_k_per_w",
            f"has {len(cp.r_case_to_coolant_k_per_w)} entries but cold_plate.flow_lpm has {len(cp.flow_lpm)}",
        )
    for k in range(1, len(cp.flow_lpm)):
        if not cp.flow_lpm[k] > cp.flow_lpm[k - 1]:
            raise SpecError(source, "cold_plate.flow_lpm", "must be strictly increasing")
        if cp.r_case_to_coolant_k_per_w[k] > cp.r_case_to_coolant_k_per_w[k - 1]:
            raise SpecError(
                source,
                "cold_plate.r_case_to_coolant_k_per_w",
                "thermal resistance must not rise with flow",
            )
    if site.loop.flow_per_card_lpm < cp.flow_lpm[0]:
        raise SpecError(
            source,
            "loop.flow_per_card_lpm",
            f"{site.loop.flow_per_card_lpm:g} L/min is below the cold-plate table (cold_plate.flow_lpm "
            f"{cp.flow_lpm[0]:g}..{cp.flow_lpm[-1]:g} L/min): the plate's resistance is not known there",
        )


def _check_layout(site: SiteSpec, source: str) -> None:
    """The torus: three dimensions holding the site's cards, one rack per plane of its last one."""
    if len(site.torus_dims) != 3:
        raise SpecError(source, "torus_dims", f"must have 3 entries (x, y, z), got {len(site.torus_dims)}")
    if (problem := check_card_count(site.supernodes, site.torus_dims)) is not None:
        raise SpecError(source, "torus_dims", problem)
    if site.torus_dims[2] != site.racks_per_supernode:
        raise SpecError(
            source,
            "racks_per_supernode",
            f"must equal torus_dims[2] ({site.torus_dims[2]}): one rack per torus plane",
        )


def _check_supply_temps(site: SiteSpec, source: str) -> None:
    """The facility's supply set-point is one of its options, which are strictly increasing."""
    fac = site.facility
    if fac.supply_temp_c not in fac.supply_temp_options_c:
        raise SpecError(
            source,
            "facility.supply_temp_c",
            f"must be one of facility.supply_temp_options_c {list(fac.supply_temp_options_c)}",
        )
    if list(fac.supply_temp_options_c) != sorted(set(fac.supply_temp_options_c)):
        raise SpecError(source, "facility.supply_temp_options_c", "must be strictly increasing")


def _check_rack_floor(site: SiteSpec, source: str) -> None:
    """A rack limit at or below :meth:`SiteSpec.rack_floor_w` leaves no rack able to run work: refused."""
    floor_w = site.rack_floor_w()
    r = site.rack
    if r.power_limit_w > floor_w:
        return
    card = site.card
    asleep = (
        f"{site.rack_floor_card_w():.4g} W asleep (card.low_power_idle_w {card.low_power_idle_w:g} W at "
        f"{card.reference_temp_c:g} deg C, less card.low_power_leakage_w_per_k {card.low_power_leakage_w_per_k:g} "
        f"W/K down to the coldest supply {min(site.facility.supply_temp_options_c):g} deg C)"
    )
    if r.hosts_per_rack > 0:
        least = (
            f"the least a rack draws with one host on and {r.hosts_per_rack - 1} off: rack.host_overhead_w "
            f"{r.host_overhead_w:g} W - {r.hosts_per_rack - 1} x ({r.host_power_w:g} - {r.host_off_power_w:g}) W "
            f"saved by the off hosts + {site.cards_per_host} cards x {asleep}"
        )
    else:
        least = (
            f"the least a rack draws with every host on: rack.host_overhead_w {r.host_overhead_w:g} W + "
            f"{site.cards_per_rack} cards x {asleep}"
        )
    raise SpecError(
        source,
        "rack.power_limit_w",
        f"{r.power_limit_w:g} W is at or below {least} = {floor_w:,.1f} W: no rack could run work within it",
    )


def _check_hosts(site: SiteSpec, source: str) -> None:
    rack = site.rack
    if rack.hosts_per_rack == 0:
        return
    if site.cards_per_rack % rack.hosts_per_rack:
        raise SpecError(
            source,
            "rack.hosts_per_rack",
            f"must divide the rack's {site.cards_per_rack} cards into equal hosts, got {rack.hosts_per_rack}",
        )
    if rack.host_power_w <= 0:
        raise SpecError(source, "rack.host_power_w", "must be > 0 W when rack.hosts_per_rack > 0")
    if rack.hosts_per_rack * rack.host_power_w > rack.host_overhead_w:
        raise SpecError(
            source,
            "rack.host_power_w",
            f"{rack.hosts_per_rack} hosts x {rack.host_power_w:g} W exceed rack.host_overhead_w "
            f"({rack.host_overhead_w:g} W), which includes them",
        )
    if rack.host_off_power_w >= rack.host_power_w:
        raise SpecError(
            source,
            "rack.host_off_power_w",
            f"an off host must draw less than an on one ({rack.host_power_w:g} W), got {rack.host_off_power_w:g}",
        )
