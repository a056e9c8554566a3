"""Decode parsed TOML tables into frozen dataclasses, with errors a person can act on.

Used for site specs (twin/spec.py), scenarios and the agent's configuration. Every problem is a
:class:`SpecError` naming the file, the field (dotted path) and what is wrong: unknown key (with the
closest known key, and a note when only the unit differs), missing field, wrong type, value out of
its physical range, a value outside its allowed choices.

Field metadata (``field(metadata=rng(lo, hi))`` or ``choices(...)``) carries ranges and choices;
fields with a default are optional in the file. Supported field types: ``str``, ``int``, ``float``,
``bool``, ``tuple[T, ...]`` of those, ``X | None`` (optional) and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

__all__ = ["SpecError", "choices", "decode_table", "read_toml", "rng", "unit_of"]

_UNIT_SUFFIXES = {
    "_w": "W",
    "_kw": "kW",
    "_c": "deg C",
    "_k": "K",
    "_s": "s",
    "_mhz": "MHz",
    "_v": "V",
    "_lpm": "L/min",
    "_kpa": "kPa",
    "_k_per_w": "K/W",
    "_w_per_k": "W/K",
    "_j_per_k": "J/K",
    "_j_per_kg_k": "J/(kg K)",
    "_kg_per_m3": "kg/m3",
    "_kwh": "kWh",
    "_per_kwh": "per kWh",
}

T = typing.TypeVar("T")


class SpecError(ValueError):
    """A spec/config file is wrong. The message names the file, the field and the problem."""

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        super().__init__(f"{source}: {path}: {problem}" if path else f"{source}: {problem}")


def rng(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    not_zero: bool = False,
) -> dict[str, Any]:
    """Field metadata: the physically sensible range of a value (inclusive unless ``lo_open`` /
    ``hi_open``; ``not_zero``: 0, inside the range, is refused too)."""
    return {"lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open, "not_zero": not_zero}


def choices(*allowed: str) -> dict[str, Any]:
    """Field metadata: the allowed values of a string field."""
    return {"choices": tuple(allowed)}


def unit_of(name: str) -> str | None:
    """The unit a key's suffix names (``power_w`` -> W), or None."""
    for suffix in sorted(_UNIT_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return _UNIT_SUFFIXES[suffix]
    return None


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file (a UTF-8 byte order mark, as some Windows editors write, is accepted); a
    missing, unreadable or malformed file is a :class:`SpecError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SpecError(source, "", "file not found") from None
    except IsADirectoryError:
        raise SpecError(source, "", "is a directory, expected a TOML file") from None
    except OSError as exc:
        raise SpecError(source, "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(source, "", "not a UTF-8 text file") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(source, "", f"not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise SpecError(source, "", "not valid TOML here: arrays or inline tables nested too deeply") from None


def _shown(raw: Any) -> str:
    """A TOML value as the user wrote it, for messages: dates and times in their TOML form (their
    Python repr, ``datetime.date(1979, 5, 27)``, is not what the file says), the rest as repr."""
    if isinstance(raw, datetime.date | datetime.time):
        return f"the date or time {raw.isoformat()}"
    return repr(raw)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _unknown_key_message(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    msg = "unknown key"
    if close:
        msg += f"; did you mean '{close[0]}'?"
        unit_given, unit_known = unit_of(key), unit_of(close[0])
        if unit_given and unit_known and unit_given != unit_known:
            msg += f" (wrong unit: this field is in {unit_known}, not {unit_given})"
    else:
        msg += f"; known keys here: {', '.join(known)}"
    return msg


def decode_table(cls: type[T], data: Any, source: str, prefix: str = "", *, other_keys: typing.Iterable[str] = ()) -> T:
    """Build dataclass ``cls`` from a parsed TOML table, validating every field.

    ``other_keys``: keys also valid in this table that the caller took out and decodes itself
    (a scenario's ``[[jobs]]``, a fault's ``kind``): an unknown key is matched against them too, and
    they are listed among the known keys, so a typo of one is pointed at it (``ambiant`` -> 'ambient')."""
    if not isinstance(data, dict):
        raise SpecError(source, prefix or "(top level)", f"expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            known = [*fields, *(k for k in other_keys if k not in fields)]
            raise SpecError(source, _join(prefix, key), _unknown_key_message(key, known))
    values: dict[str, Any] = {}
    for name, f in fields.items():
        path = _join(prefix, name)
        hint = hints[name]
        if name not in data:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            unit = unit_of(name)
            what = "table" if dataclasses.is_dataclass(hint) else f"value{f' in {unit}' if unit else ''}"
            raise SpecError(source, path, f"missing required {what}")
        values[name] = _decode_value(hint, data[name], source, path, f.metadata)
    return cls(**values)


def _decode_value(hint: Any, raw: Any, source: str, path: str, meta: Any) -> Any:
    unit = unit_of(path.rsplit(".", 1)[-1])
    unit_txt = f" {unit}" if unit else ""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:  # pragma: no cover - programming error
            raise TypeError(f"unsupported field type {hint}")
        hint, origin = args[0], typing.get_origin(args[0])
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return decode_table(hint, raw, source, path)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(hint)
        if not isinstance(raw, list):
            kind = "strings" if item_type is str else "numbers"
            raise SpecError(source, path, f"expected a list of {kind}{unit_txt}, got {_shown(raw)}")
        if not raw:
            raise SpecError(source, path, "must not be empty")
        return tuple(
            _decode_scalar(item_type, item, source, f"{path}[{i}]", meta, unit_txt) for i, item in enumerate(raw)
        )
    return _decode_scalar(hint, raw, source, path, meta, unit_txt)


def _decode_scalar(hint: Any, raw: Any, source: str, path: str, meta: Any, unit_txt: str) -> Any:
    if hint is str:
        if not isinstance(raw, str) or not raw.strip():
            raise SpecError(source, path, f"expected a non-empty string, got {_shown(raw)}")
        allowed = meta.get("choices")
        if allowed and raw not in allowed:
            raise SpecError(source, path, f"must be one of {', '.join(repr(a) for a in allowed)}, got {_shown(raw)}")
        return raw
    if hint is bool:
        if not isinstance(raw, bool):
            raise SpecError(source, path, f"expected true or false, got {_shown(raw)}")
        return raw
    if hint is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise SpecError(source, path, f"expected an integer{unit_txt}, got {_shown(raw)}")
        value: float = raw
    elif hint is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            hint_txt = " (write the number alone; the unit is in the key's name)" if isinstance(raw, str) else ""
            raise SpecError(source, path, f"expected a number{unit_txt}, got {_shown(raw)}{hint_txt}")
        value = float(raw)
        if not math.isfinite(value):
            raise SpecError(source, path, f"must be a finite number, got {_shown(raw)}")
    else:  # pragma: no cover - programming error
        raise TypeError(f"unsupported field type {hint}")
    lo, hi = meta.get("lo"), meta.get("hi")
    lo_open, hi_open = meta.get("lo_open", False), meta.get("hi_open", False)
    if lo is not None and (value < lo or (lo_open and value <= lo)):
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        raise SpecError(source, path, f"must be {bound}{unit_txt}, got {_shown(raw)}")
    if hi is not None and (value > hi or (hi_open and value >= hi)):
        bound = f"< {hi:g}" if hi_open else f"<= {hi:g}"
        raise SpecError(source, path, f"must be {bound}{unit_txt}, got {_shown(raw)}")
    if meta.get("not_zero", False) and value == 0:
        within = f"within {lo:g}..{hi:g}{unit_txt} and " if lo is not None and hi is not None else ""
        raise SpecError(source, path, f"must be {within}not 0, got {_shown(raw)}")
    return raw if hint is int else value
