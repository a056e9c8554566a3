"""The agent's configuration file: defaults, validation with clear errors, environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import explain, load_config
from twin.tables import SpecError

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "site.toml").write_text((EXAMPLES / "supernode-512.toml").read_text())
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return p


def test_example_config_is_valid_and_explained() -> None:
    loaded = load_config(EXAMPLES / "agent.toml", env={})
    assert loaded.config.mode == "advisory"
    assert loaded.site.n_cards == 512
    text = explain(loaded)
    assert "advice only" in text and "512 cards" in text
    assert "idle hosts off after 311 s (the break-even time of a power cycle)" in text
    # relative paths resolve against the config file's folder
    assert Path(loaded.config.journal.path).parent == EXAMPLES


def test_minimal_config_uses_defaults(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, 'site = "site.toml"\n'), env={})
    assert loaded.config.control.period_s == 15.0
    assert loaded.config.broker.port == 1883
    assert "decisions kept 30 days" in explain(loaded)
    kept = load_config(write(tmp_path, 'site = "site.toml"\n[journal]\nkeep_days = 0\n'), env={})
    assert "everything kept" in explain(kept)
    with pytest.raises(SpecError) as info:
        load_config(write(tmp_path, 'site = "site.toml"\n[journal]\nkeep_days = -1\n'), env={})
    assert info.value.path == "journal.keep_days"


def test_a_configured_host_idle_time_wins_over_the_break_even_default(tmp_path: Path) -> None:
    default = load_config(write(tmp_path, 'site = "site.toml"\n'), env={})
    assert default.config.control.host_idle_off_s(default.site) == pytest.approx(default.site.host_break_even_s())
    loaded = load_config(write(tmp_path, 'site = "site.toml"\n[control]\nhost_off_after_s = 600\n'), env={})
    assert loaded.config.control.host_idle_off_s(loaded.site) == 600.0
    assert "idle hosts off after 600 s (host_off_after_s)" in explain(loaded)


def test_environment_overrides_values_and_is_reported(tmp_path: Path) -> None:
    p = write(tmp_path, 'site = "site.toml"\n')
    loaded = load_config(
        p, env={"RACKTWIN_MODE": "enforce", "RACKTWIN_CONTROL_PERIOD_S": "10", "RACKTWIN_BROKER_URL": "mqtts://h:8884"}
    )
    assert loaded.config.mode == "enforce"
    assert loaded.config.control.period_s == 10.0
    assert loaded.config.broker.port == 8884 and loaded.config.broker.tls
    assert "RACKTWIN_MODE" in explain(loaded)


@pytest.mark.parametrize(
    ("text", "env", "field", "words"),
    [
        ('site = "site.toml"\nmode = "yolo"\n', {}, "mode", "must be one of"),
        ('site = "site.toml"\n[control]\nperiod_ms = 5\n', {}, "control.period_ms", "did you mean 'period_s'"),
        (
            'site = "site.toml"\n[control]\nperiod_s = 5\nsolve_deadline_s = 6\n',
            {},
            "control.solve_deadline_s",
            "shorter",
        ),
        ('site = "site.toml"\n', {"RACKTWIN_CONTROL_PERIOD_S": "fast"}, "control.period_s", "expected a number"),
        ('site = "site.toml"\n[broker]\nurl = "http://x"\n', {}, "broker.url", "mqtt://"),
        ('site = "missing.toml"\n', {}, "", "file not found"),
        ("mode = 'enforce'\n", {}, "site", "missing required"),
    ],
)
def test_bad_configs_name_field_and_problem(
    tmp_path: Path, text: str, env: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as info:
        load_config(write(tmp_path, text), env=env)
    assert info.value.path == field
    assert words in str(info.value)
