"""Site spec loading: every mistake in a spec file is a SpecError naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from twin.spec import SiteSpec, SpecError, load_site

pytestmark = pytest.mark.unit


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    """Write a spec dict as TOML (flat tables of scalars and lists only)."""
    lines: list[str] = []

    def fmt(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return repr(v)

    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for k, v in data.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {fmt(v)}")
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {fmt(v)}" for k, v in table.items())
    p = tmp_path / "site.toml"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _error(tmp_path: Path, data: dict[str, Any]) -> SpecError:
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_site(path)
    assert str(path) in str(info.value), "the message names the file"
    return info.value


def test_example_site_loads_with_its_layout(site: SiteSpec) -> None:
    assert site.n_cards == 512
    assert site.n_racks == 8
    assert site.cards_per_rack == 64
    assert site.card.n_levels == len(site.card.voltages_v)
    big = site.with_supernodes(16)
    assert big.n_cards == 8192 and big.n_racks == 128


def test_round_trip_through_the_writer(tmp_path: Path, site: SiteSpec, example_data: dict[str, Any]) -> None:
    assert load_site(_write(tmp_path, example_data)) == site


def test_unknown_key_suggests_the_closest(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["card"]["idle_powr_w"] = d["card"].pop("idle_power_w")
    err = _error(tmp_path, d)
    assert err.path == "card.idle_powr_w"
    assert "did you mean 'idle_power_w'" in str(err)


def test_wrong_unit_in_key_is_named(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["card"]["power_limit_kw"] = d["card"].pop("power_limit_w") / 1000
    err = _error(tmp_path, d)
    assert err.path == "card.power_limit_kw"
    assert "power_limit_w" in str(err) and "wrong unit" in str(err)


def test_missing_field(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    del d["loop"]["flow_per_card_lpm"]
    err = _error(tmp_path, d)
    assert err.path == "loop.flow_per_card_lpm"
    assert "missing" in str(err) and "L/min" in str(err)


def test_wrong_type_string_with_unit(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["rack"]["power_limit_w"] = "50 kW"
    err = _error(tmp_path, d)
    assert err.path == "rack.power_limit_w"
    assert "expected a number" in str(err)


def test_a_toml_date_is_shown_as_written(tmp_path: Path) -> None:
    """`power_limit_w = 1979-05-27` said `got datetime.date(1979, 5, 27)` (Python's repr)."""
    path = tmp_path / "site.toml"
    text = (Path(__file__).resolve().parents[2] / "examples" / "supernode-512.toml").read_text()
    path.write_text(text.replace("power_limit_w = 50000.0", "power_limit_w = 1979-05-27", 1))
    with pytest.raises(SpecError) as info:
        load_site(path)
    assert info.value.path == "rack.power_limit_w"
    assert "got the date or time 1979-05-27" in str(info.value) and "datetime" not in str(info.value)


def test_out_of_range(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["cdu"]["approach_k"] = -3.0
    err = _error(tmp_path, d)
    assert err.path == "cdu.approach_k"
    assert ">= 0" in str(err)


def test_non_monotonic_dvfs_table(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    clocks = list(d["card"]["clocks_mhz"])
    clocks[2], clocks[3] = clocks[3], clocks[2]
    d["card"]["clocks_mhz"] = clocks
    err = _error(tmp_path, d)
    assert err.path == "card.clocks_mhz"
    assert "strictly decreasing" in str(err)


def test_unequal_tables(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["card"]["voltages_v"] = d["card"]["voltages_v"][:-1]
    err = _error(tmp_path, d)
    assert err.path == "card.voltages_v"


def test_the_plate_and_the_loop_name_the_same_coolant(tmp_path: Path, example_data: dict[str, Any]) -> None:
    """`fluid = "water"` in [loop] was accepted and changed nothing (the PG25 table and properties
    stayed in force): a plate table measured in another coolant than the loop's is refused."""
    d = example_data
    d["loop"]["fluid"] = "water"
    err = _error(tmp_path, d)
    assert err.path == "cold_plate.fluid" and "'water'" in str(err)
    d["cold_plate"]["fluid"] = "Water"  # both renamed (with the operator's own table and properties)
    assert load_site(_write(tmp_path, d)).loop.fluid == "water"


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_site(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n", encoding="utf-8")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_site(bad)
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 2000 + "]" * 2000 + "\n", encoding="utf-8")  # a RecursionError in tomllib
    with pytest.raises(SpecError, match="nested too deeply"):
        load_site(deep)


def test_flow_per_card_below_the_cold_plate_table(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["loop"]["flow_per_card_lpm"] = 0.01  # the plate table starts at 0.4 L/min (twin steady: 1219 deg C water)
    err = _error(tmp_path, d)
    assert err.path == "loop.flow_per_card_lpm"
    assert "0.01 L/min" in str(err) and "0.4..2.4 L/min" in str(err)
    d["loop"]["flow_per_card_lpm"] = d["cold_plate"]["flow_lpm"][0]  # the table's lowest flow is fine
    assert load_site(_write(tmp_path, d)).min_pump_speed_frac() == 1.0


def test_idle_power_at_or_above_the_power_limit(tmp_path: Path, example_data: dict[str, Any]) -> None:
    d = example_data
    d["card"]["idle_power_w"] = 800.0  # the card's power limit is 700 W
    err = _error(tmp_path, d)
    assert err.path == "card.idle_power_w"
    assert "power limit" in str(err) and "700 W" in str(err)
    d["card"]["idle_power_w"] = 84.5
    d["card"]["low_power_idle_w"] = 750.0
    err = _error(tmp_path, d)
    assert err.path == "card.low_power_idle_w"
    assert "power limit" in str(err) and "700 W" in str(err)
