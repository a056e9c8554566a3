"""twin.tables: how a TOML table becomes a frozen dataclass. An operator writes these files by hand:
every bad value is refused with a SpecError naming the file and the key, and a good one is taken as
written (bounds inclusive unless open, integers kept integers)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from twin.tables import SpecError, choices, decode_table, read_toml, rng, unit_of

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class _Inner:
    flow_lpm: float = field(metadata=rng(0.0, 10.0, lo_open=True))


@dataclass(frozen=True)
class _Table:
    name: str
    count: int = field(metadata=rng(1, 8))
    power_w: float = field(metadata=rng(50.0, 3000.0))
    ratio: float = field(metadata=rng(0.0, 1.0, lo_open=True))
    free: float = 0.0  # no range at all
    enabled: bool = True
    mode: str = field(default="a", metadata=choices("a", "b"))
    temps_c: tuple[float, ...] = field(default=(1.0,), metadata=rng(-10.0, 60.0))
    labels: tuple[str, ...] = ("x",)
    note: str | None = None
    inner: _Inner = field(default_factory=lambda: _Inner(1.0))


_GOOD: dict[str, Any] = {"name": "n", "count": 4, "power_w": 700.0, "ratio": 0.5}


def _decode(**changes: Any) -> _Table:
    return decode_table(_Table, {**_GOOD, **changes}, "f.toml")


def _refused(**changes: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        _decode(**changes)
    assert str(info.value).startswith("f.toml: "), "the message names the file"
    return info.value


def test_a_good_table_is_taken_as_written() -> None:
    t = _decode()
    assert t == _Table("n", 4, 700.0, 0.5)
    assert type(t.count) is int and type(t.power_w) is float
    assert type(_decode(power_w=700).power_w) is float  # an integer is a number
    assert _decode(power_w=700).power_w == 700.0


@pytest.mark.parametrize(
    ("key", "value"),
    [("count", 1), ("count", 8), ("power_w", 50.0), ("power_w", 3000.0), ("ratio", 1.0), ("ratio", 1e-9)],
)
def test_bounds_are_inclusive_unless_open(key: str, value: float) -> None:
    assert getattr(_decode(**{key: value}), key) == value


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("count", 0, "count: must be >= 1, got 0"),
        ("count", 9, "count: must be <= 8, got 9"),
        ("power_w", 49.9, "power_w: must be >= 50 W, got 49.9"),
        ("power_w", 3000.5, "power_w: must be <= 3000 W, got 3000.5"),
        ("ratio", 0.0, "ratio: must be > 0, got 0.0"),
        ("ratio", -0.1, "ratio: must be > 0, got -0.1"),
        ("ratio", 1.01, "ratio: must be <= 1, got 1.01"),
    ],
)
def test_a_value_out_of_its_range_names_the_bound(key: str, value: float, message: str) -> None:
    assert str(_refused(**{key: value})) == f"f.toml: {message}"


@dataclass(frozen=True)
class _Fault:
    share: float = field(metadata=rng(0.0, 1.0, hi_open=True))
    offset_k: float = field(metadata=rng(-30.0, 30.0, not_zero=True))


@pytest.mark.parametrize(("share", "offset_k"), [(0.0, -30.0), (0.999, 30.0), (0.5, -1e-9), (0.5, 1e-9)])
def test_an_upper_bound_may_be_open_and_zero_refused_inside_a_range(share: float, offset_k: float) -> None:
    assert decode_table(_Fault, {"share": share, "offset_k": offset_k}, "f.toml") == _Fault(share, offset_k)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("share", 1.0, "share: must be < 1, got 1.0"),
        ("share", 1, "share: must be < 1, got 1"),
        ("share", 1.5, "share: must be < 1, got 1.5"),
        ("offset_k", 0.0, "offset_k: must be within -30..30 K and not 0, got 0.0"),
        ("offset_k", -0.0, "offset_k: must be within -30..30 K and not 0, got -0.0"),
        ("offset_k", 0, "offset_k: must be within -30..30 K and not 0, got 0"),
        ("offset_k", 30.5, "offset_k: must be <= 30 K, got 30.5"),
    ],
)
def test_an_open_upper_bound_and_a_refused_zero_are_named(key: str, value: float, message: str) -> None:
    with pytest.raises(SpecError) as info:
        decode_table(_Fault, {"share": 0.5, "offset_k": 1.0, key: value}, "f.toml")
    assert str(info.value) == f"f.toml: {message}"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_number_that_is_not_finite_is_refused_even_without_a_range(value: float) -> None:
    err = _refused(free=value)
    assert err.path == "free" and "must be a finite number" in str(err)
    err = _refused(power_w=value)
    assert err.path == "power_w" and "must be a finite number" in str(err)


def test_true_and_false_are_not_numbers_and_numbers_not_booleans() -> None:
    assert str(_refused(count=True)) == "f.toml: count: expected an integer, got True"
    assert str(_refused(power_w=False)) == "f.toml: power_w: expected a number W, got False"
    assert str(_refused(enabled=1)) == "f.toml: enabled: expected true or false, got 1"
    assert str(_refused(count=4.0)) == "f.toml: count: expected an integer, got 4.0"


def test_a_number_written_with_its_unit_is_told_to_drop_it() -> None:
    assert str(_refused(power_w="700 W")) == (
        "f.toml: power_w: expected a number W, got '700 W' (write the number alone; the unit is in the key's name)"
    )
    assert "write the number alone" not in str(_refused(power_w=[700.0]))


def test_strings_must_say_something_and_be_one_of_the_choices() -> None:
    assert str(_refused(name="  ")) == "f.toml: name: expected a non-empty string, got '  '"
    assert str(_refused(name=3)) == "f.toml: name: expected a non-empty string, got 3"
    assert str(_refused(mode="c")) == "f.toml: mode: must be one of 'a', 'b', got 'c'"
    assert "must be one of" in str(_refused(mode=" a"))  # not stripped into a choice
    assert _decode(mode="b").mode == "b"


def test_lists_name_the_bad_entry() -> None:
    assert _decode(temps_c=[20, 30.5]).temps_c == (20.0, 30.5)
    assert str(_refused(temps_c=[])) == "f.toml: temps_c: must not be empty"
    assert str(_refused(temps_c=[20.0, 61.0])) == "f.toml: temps_c[1]: must be <= 60 deg C, got 61.0"
    assert str(_refused(temps_c=[20.0, True])) == "f.toml: temps_c[1]: expected a number deg C, got True"
    assert str(_refused(temps_c=20.0)) == "f.toml: temps_c: expected a list of numbers deg C, got 20.0"
    assert str(_refused(labels="x")) == "f.toml: labels: expected a list of strings, got 'x'"
    assert str(_refused(labels=["x", ""])) == "f.toml: labels[1]: expected a non-empty string, got ''"


def test_an_optional_value_and_a_nested_table() -> None:
    assert _decode().note is None
    assert _decode(note="hi").note == "hi"
    assert _decode(inner={"flow_lpm": 2.0}).inner == _Inner(2.0)
    assert str(_refused(inner={"flow_lpm": 0.0})) == "f.toml: inner.flow_lpm: must be > 0 L/min, got 0.0"
    assert str(_refused(inner={"flow_lpm": True})) == "f.toml: inner.flow_lpm: expected a number L/min, got True"
    assert str(_refused(inner={})) == "f.toml: inner.flow_lpm: missing required value in L/min"
    assert str(_refused(inner=[1])) == "f.toml: inner: expected a table, got list"
    with pytest.raises(SpecError) as info:
        decode_table(_Table, [], "f.toml")
    assert str(info.value) == "f.toml: (top level): expected a table, got list"


def test_missing_values_and_tables() -> None:
    @dataclass(frozen=True)
    class Outer:
        inner: _Inner
        power_w: float

    with pytest.raises(SpecError) as info:
        decode_table(Outer, {"power_w": 1.0}, "f.toml")
    assert str(info.value) == "f.toml: inner: missing required table"
    with pytest.raises(SpecError) as info:
        decode_table(Outer, {"inner": {"flow_lpm": 1.0}}, "f.toml")
    assert str(info.value) == "f.toml: power_w: missing required value in W"
    with pytest.raises(SpecError) as info:
        decode_table(_Table, {"count": 1, "power_w": 60.0, "ratio": 0.5}, "f.toml")
    assert str(info.value) == "f.toml: name: missing required value"


def test_unknown_keys() -> None:
    # a close key of the same unit, or with no unit: no unit note
    assert str(_refused(powr_w=1.0)) == "f.toml: powr_w: unknown key; did you mean 'power_w'?"
    assert str(_refused(power=1.0)) == "f.toml: power: unknown key; did you mean 'power_w'?"
    assert str(_refused(power_kw=1.0)) == (
        "f.toml: power_kw: unknown key; did you mean 'power_w'? (wrong unit: this field is in W, not kW)"
    )
    assert str(_refused(zzzzzz=1)) == (
        "f.toml: zzzzzz: unknown key; known keys here: "
        "name, count, power_w, ratio, free, enabled, mode, temps_c, labels, note, inner"
    )
    assert str(_refused(inner={"flow_lmp": 1.0})) == "f.toml: inner.flow_lmp: unknown key; did you mean 'flow_lpm'?"


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("power_w", "W"),
        ("r_die_to_case_k_per_w", "K/W"),  # not W: the longest suffix wins
        ("heat_capacity_j_per_k", "J/K"),  # not K
        ("specific_heat_j_per_kg_k", "J/(kg K)"),
        ("energy_kwh", "kWh"),
        ("price_per_kwh", "per kWh"),
        ("flow_lpm", "L/min"),
        ("wake_latency_s", "s"),
        ("power_kw_total", None),  # a suffix is at the end of the name
        ("name", None),
    ],
)
def test_the_unit_a_key_names(name: str, unit: str | None) -> None:
    assert unit_of(name) == unit


def test_reading_files(tmp_path: Path) -> None:
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbfa = 1\n")  # a UTF-8 byte order mark, as some Windows editors write
    assert read_toml(bom) == {"a": 1}
    with pytest.raises(SpecError) as info:
        read_toml(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, expected a TOML file"
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(SpecError) as info:
        read_toml(latin)
    assert str(info.value) == f"{latin}: not a UTF-8 text file"
    none = tmp_path / "none.toml"
    with pytest.raises(SpecError) as info:
        read_toml(none)
    assert (info.value.source, info.value.path, info.value.problem) == (str(none), "", "file not found")
    assert str(info.value) == f"{none}: file not found"  # no empty field in the message
