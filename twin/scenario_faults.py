"""The ``[[faults]]`` of a run scenario (``twin.scenario``): each table decoded into its plant fault
(``twin.faults``) or simulator fault (:class:`BrokerDisconnect`) and checked against the site and
the run (a rack or card not in the site, a fault after the end of the run, overlapping broker
disconnects are each a :class:`twin.tables.SpecError` naming the file and the field)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twin.faults import (
    CardFailure,
    ColdPlateFouling,
    Fault,
    GarbageReadings,
    HeatWave,
    PumpDegradation,
    SensorDropout,
    StuckSensor,
)
from twin.scenario_checks import check_before_end
from twin.spec import SiteSpec
from twin.tables import SpecError, decode_table, rng


@dataclass(frozen=True)
class BrokerDisconnect:
    """Simulator-only fault: the simulator drops its MQTT connection at ``start_s`` for
    ``duration_s`` seconds (site time) and reconnects (what happens on the wire: docs/sim.md)."""

    start_s: float = field(metadata=rng(0.0))
    duration_s: float = field(metadata=rng(0.0, lo_open=True))

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"BrokerDisconnect: start_s must be a finite time >= 0 s, got {self.start_s}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"BrokerDisconnect: duration_s must be a finite time > 0 s, got {self.duration_s}")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


SimFault = BrokerDisconnect

#: ``kind`` of a ``[[faults]]`` table -> the dataclass it decodes into.
FAULT_KINDS: Mapping[str, type[Any]] = {
    "sensor_dropout": SensorDropout,
    "stuck_sensor": StuckSensor,
    "garbage_readings": GarbageReadings,
    "card_failure": CardFailure,
    "pump_degradation": PumpDegradation,
    "cold_plate_fouling": ColdPlateFouling,
    "heat_wave": HeatWave,
    "broker_disconnect": BrokerDisconnect,
}


def decode_faults(
    raw: Any,
    site: SiteSpec,
    source: str,
    duration_s: float,
    shortened_from_s: float | None,
    warn: Callable[[str], None],
) -> tuple[list[Fault], list[SimFault]]:
    """The plant faults and the simulator faults of ``[[faults]]``. ``shortened_from_s``: the file's
    duration where an override shortened the run (a fault after the shortened end is then a warning)."""
    if not isinstance(raw, list):
        raise SpecError(source, "faults", "expected a list of tables ([[faults]])")
    faults: list[Fault] = []
    sim_faults: list[tuple[int, SimFault]] = []  # with its index in the file
    racks = {name: i for i, name in enumerate(site.rack_names)}
    for i, entry in enumerate(raw):
        where = f"faults[{i}]"
        if not isinstance(entry, Mapping):
            raise SpecError(source, where, f"expected a table, got {type(entry).__name__}")
        table = dict(entry)
        kind = table.pop("kind", None)
        if kind is None:
            raise SpecError(source, f"{where}.kind", f"missing: one of {', '.join(FAULT_KINDS)}")
        if kind not in FAULT_KINDS:
            raise SpecError(source, f"{where}.kind", f"must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        if isinstance(table.get("rack"), str):  # a rack name ("r3") is accepted too
            name = table["rack"]
            if name not in racks:
                raise SpecError(source, f"{where}.rack", f"rack {name!r} is not in the site (r0..r{site.n_racks - 1})")
            table["rack"] = racks[name]
        cls = FAULT_KINDS[kind]
        fault: Any = _decode_fault(cls, table, source, where)
        _check_fault_target(fault, site, source, where)
        _check_fault_start(fault, source, where, duration_s, shortened_from_s, warn)
        if isinstance(fault, BrokerDisconnect):
            sim_faults.append((i, fault))
        else:
            faults.append(fault)
    sim_faults.sort(key=lambda item: item[1].start_s)
    for (i, a), (j, b) in itertools.pairwise(sim_faults):
        if b.start_s < a.end_s:
            raise SpecError(
                source,
                f"faults[{j}].start_s",
                f"broker disconnects overlap: this one starts at {b.start_s:g} s, before the one of faults[{i}] "
                f"({a.start_s:g} s to {a.end_s:g} s) ends (back to back ones are one outage)",
            )
    return faults, [f for _, f in sim_faults]


def _decode_fault(cls: type[Any], table: dict[str, Any], source: str, where: str) -> Any:
    try:
        return decode_table(cls, table, source, where, other_keys=("kind",))
    except SpecError:
        raise
    except ValueError as exc:
        raise SpecError(source, where, str(exc)) from None


def _check_fault_target(fault: Any, site: SiteSpec, source: str, where: str) -> None:
    rack = getattr(fault, "rack", None)
    if rack is not None and not 0 <= rack < site.n_racks:
        raise SpecError(source, f"{where}.rack", f"rack {rack} is not in the site (0..{site.n_racks - 1})")
    card = getattr(fault, "card", None)
    if card is not None:
        if not 0 <= card < site.n_cards:
            raise SpecError(source, f"{where}.card", f"card {card} is not in the site (0..{site.n_cards - 1})")
        if rack is not None and card // site.cards_per_rack != rack:
            cpr = site.cards_per_rack
            raise SpecError(
                source,
                f"{where}.card",
                f"card {card} is not in rack {rack} (cards {rack * cpr}..{rack * cpr + cpr - 1})",
            )


def _check_fault_start(
    fault: Any, source: str, where: str, duration_s: float, shortened_from_s: float | None, warn: Callable[[str], None]
) -> None:
    name = "at_s" if isinstance(fault, CardFailure) else "start_s"
    start = float(getattr(fault, name))
    check_before_end(
        start,
        source,
        f"{where}.{name}",
        duration_s,
        shortened_from_s,
        warn,
        ("it would never happen", "the fault does not happen"),
    )
