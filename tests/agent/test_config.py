"""The agent's configuration file: defaults, validation with clear errors, environment overrides."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from agent.bus import MqttOptions
from agent.config import (
    OTHER_ENV_VARS,
    ControlConfig,
    check_control,
    env_variables,
    explain,
    host_name,
    load_config,
)
from twin.plant_types import DEFAULT_PUMP_HOLD_S
from twin.spec import load_site, site_from_dict
from twin.tables import SpecError, read_toml

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


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


def test_the_wake_tie_break_is_off_by_default_and_explained_when_set(tmp_path: Path) -> None:
    """``control.reserve_wake_tie_w`` (opt-in): 0 by default and in the example, where --check-config says
    nothing of it; set, its line says what it does."""
    default = load_config(write(tmp_path, 'site = "site.toml"\n'), env={})
    assert default.config.control.reserve_wake_tie_w == 0.0 and "wake ties" not in explain(default)
    assert load_config(EXAMPLES / "agent.toml", env={}).config.control.reserve_wake_tie_w == 0.0
    on = load_config(write(tmp_path, 'site = "site.toml"\n[control]\nreserve_wake_tie_w = 1\n'), env={})
    assert on.config.control.reserve_wake_tie_w == 1.0
    assert "wake ties     1 W per idle card woken: the ready reserve stays on the idle cards awake now" in explain(on)


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


def test_a_ready_reserve_larger_than_the_hosts_kept_on_is_warned_about(tmp_path: Path) -> None:
    assert "warning" not in explain(load_config(write(tmp_path, 'site = "site.toml"\n'), env={}))  # 16 cards, 2 hosts
    loaded = load_config(write(tmp_path, 'site = "site.toml"\n[control]\nidle_reserve_cards = 32\n'), env={})
    assert (
        "warning: idle_reserve_cards (32 per supernode) needs 4 idle hosts on, host_reserve_per_supernode keeps 2"
        in (explain(loaded))
    )


def test_a_pue_penalty_that_would_buy_it_power_to_lower_the_pue_ratio_is_warned_about(tmp_path: Path) -> None:
    # The test site's PUE target is read from the loaded spec; energy 0.15 per kWh: the bound is
    # 0.15 / (target - 1) (1.875 at 1.08). The default penalty (0.30) and one at the bound: no warning.
    default = load_config(write(tmp_path, 'site = "site.toml"\n'), env={})
    assert "warning" not in explain(default)
    bound = 0.15 / (default.site.pue_target - 1.0)
    at = load_config(write(tmp_path, f'site = "site.toml"\n[prices]\npue_penalty_per_kwh = {bound!r}\n'), env={})
    assert "warning" not in explain(at)
    above = load_config(
        write(tmp_path, f'site = "site.toml"\n[prices]\npue_penalty_per_kwh = {bound * 1.01!r}\n'), env={}
    )
    assert (
        f"warning: pue_penalty_per_kwh ({bound * 1.01:g}) is above energy_per_kwh / (PUE target - 1) = {bound:.3g}"
        in (explain(above))
    )


PUMPS = 'site = "site.toml"\n[control]\npump_renew_s = {renew}\n'


def test_a_pump_renewal_not_within_the_simulators_hold_is_warned_about(tmp_path: Path) -> None:
    # The simulator returns a slowed pump to full speed 60 s after the last command for it
    # (twin.plant_types.DEFAULT_PUMP_HOLD_S); renewals come at decisions, every 15 s here and at job
    # events between, so up to pump_renew_s + period_s after a command sent at an event's decision
    # (test_command_lifecycle.py: 34.5 s at the defaults).
    assert DEFAULT_PUMP_HOLD_S == 60.0
    default = explain(load_config(write(tmp_path, 'site = "site.toml"\n'), env={}))
    assert (
        "  pumps         rack-loop speeds chosen among 9 steps, a slowed pump's speed re-sent at the first decision"
        " 20 s after the last command for it: up to 35 s after it (pump_renew_s + period_s: decisions every 15 s,"
        " and at job events in between)"
    ) in default
    assert "warning" not in default
    assert "warning" not in explain(load_config(write(tmp_path, PUMPS.format(renew=44.9)), env={}))  # 59.9 s
    at = explain(load_config(write(tmp_path, PUMPS.format(renew=60)), env={}))
    assert (
        "warning: pump_renew_s (60 s) is not under the simulator's pump hold (pump_hold_s, 60 s): a slowed pump "
        "returns to full speed between renewals" in at
    )
    # 45 s is under the hold, and renewals on the period's grid alone come 45 s apart, but after a
    # command at a job event's decision the first decision 45 s later may come almost 60 s after it
    late = explain(load_config(write(tmp_path, PUMPS.format(renew=45)), env={}))
    assert (
        "warning: pump_renew_s (45 s) at decisions every period_s (15 s) and at job events renews a slowed pump "
        "up to 60 s after a command, which is not under the simulator's pump hold" in late
    )
    off = explain(load_config(write(tmp_path, PUMPS.format(renew=60) + "control_pump_speed = false\n"), env={}))
    assert "  pumps         full speed (control_pump_speed = false)" in off and "warning" not in off


def test_a_setpoint_step_that_never_lets_the_setpoint_move_is_refused_naming_both_keys(tmp_path: Path) -> None:
    err = refused(tmp_path, 'site = "site.toml"\n[control]\nmax_setpoint_step_k = 0\n')
    assert err.path == "control.max_setpoint_step_k"
    assert "0 K: with control.control_setpoint = true the set-point never moves" in err.problem
    assert "set control.control_setpoint = false to keep the site's set-point" in err.problem
    # the example site's options are 5 K apart around its 30 deg C: a 4 K step never reaches one
    err = refused(tmp_path, 'site = "site.toml"\n[control]\nmax_setpoint_step_k = 4.9\n')
    assert err.path == "control.max_setpoint_step_k"
    assert "4.9 K is less than the 5 K from the site's set-point (facility.supply_temp_c, 30 deg C)" in err.problem
    assert "allow a step of at least 5 K" in err.problem
    # a fixed set-point may have any step; a step that reaches the next option passes
    fixed = 'site = "site.toml"\n[control]\nmax_setpoint_step_k = 0\ncontrol_setpoint = false\n'
    assert "  set-point     fixed" in explain(load_config(write(tmp_path, fixed), env={}))
    assert load_config(write(tmp_path, 'site = "site.toml"\n[control]\nmax_setpoint_step_k = 5\n'), env={})
    # the keys as racktwin evaluate's --control names them, without a site too
    with pytest.raises(SpecError) as info:
        check_control(ControlConfig(max_setpoint_step_k=0.0), None, "--control", prefix="")
    assert str(info.value).startswith("--control: max_setpoint_step_k: 0 K: with control_setpoint = true the")


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
        # a rack refuses a command that lives longer (wire.MAX_COMMAND_TTL_S)
        ('site = "site.toml"\n[control]\ncommand_ttl_s = 7200\n', {}, "control.command_ttl_s", "3600"),
        ('site = "site.toml"\n[broker]\nurl = "http://x"\n', {}, "broker.url", "mqtt://"),
        ('site = "missing.toml"\n', {}, "site", "missing.toml: file not found"),
        ("mode = 'enforce'\n", {}, "site", "missing required"),
        # the opt-in wake tie-break: a weight of IT power per card woken, 0 (off) .. 10 W
        ('site = "site.toml"\n[control]\nreserve_wake_tie_w = -1\n', {}, "control.reserve_wake_tie_w", ">= 0 W"),
        (
            'site = "site.toml"\n',
            {"RACKTWIN_CONTROL_RESERVE_WAKE_TIE_W": "20"},
            "control.reserve_wake_tie_w",
            "<= 10 W",
        ),
    ],
)
def test_bad_configs_name_field_and_problem(
    tmp_path: Path, text: str, env: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as info:
        load_config(write(tmp_path, text), env=env)
    assert info.value.path == field
    assert words in str(info.value)


def refused(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_config(write(tmp_path, text), env=env or {})
    return info.value


@pytest.mark.parametrize("site_id", ["a/+/#", "agent", "x" * 100, "two words"])
def test_a_site_id_that_cannot_be_a_topic_level_is_refused(tmp_path: Path, site_id: str) -> None:
    err = refused(tmp_path, f'site = "site.toml"\nsite_id = "{site_id}"\n')
    assert err.path == "site_id"
    assert "cannot be a topic level" in err.problem


def test_a_broker_url_the_client_cannot_use_is_refused(tmp_path: Path) -> None:
    for url, words in [
        ("mqtt://:99999", "no host"),
        ("mqtt://host:abc", "bad port"),
        ("mqtt://host:0", "bad port"),
        ("mqtt://host:99999", "bad port"),
        ("mqtt://host:1883/racktwin", "path not allowed"),
        ("mqtt://host:1883?keepalive=5", "query or fragment not allowed"),
        ("mqtt://agent:secret@host:1883", "broker.username"),
    ]:
        err = refused(tmp_path, f'site = "site.toml"\n[broker]\nurl = "{url}"\n')
        assert err.path == "broker.url" and words in err.problem, err
    for url in ("mqtt://broker", "mqtts://broker.example:8884/", "mqtt://[::1]:1883"):
        assert load_config(write(tmp_path, f'site = "site.toml"\n[broker]\nurl = "{url}"\n'), env={})


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("mqtt://[fe80::1%25eth0]:1883", "fe80::1%eth0"),  # RFC 6874: %25 is the URL encoding of '%'
        ("mqtt://[fe80::1%eth0]:1883", "fe80::1%eth0"),  # the bare zone, as browsers and curl take it
        ("mqtt://[fe80::1%252]:1883", "fe80::1%2"),  # an interface index as the zone
        ("mqtt://[::1]:1883", "::1"),
        ("mqtt://broker.example:1883", "broker.example"),
    ],
)
def test_an_ipv6_zone_of_the_broker_url_is_decoded(tmp_path: Path, url: str, host: str) -> None:
    """The zone of ``[fe80::1%25eth0]`` is ``eth0`` (it was read as "25eth0", which no interface is),
    in the configuration and in the client's options; the client's URL (for logs) writes it back."""
    loaded = load_config(write(tmp_path, f'site = "site.toml"\n[broker]\nurl = "{url}"\n'), env={})
    assert loaded.config.broker.host == host and loaded.config.broker.port == 1883
    options = MqttOptions.from_url(url)
    assert options.host == host
    assert MqttOptions.from_url(options.url).host == host  # round trip
    assert options.url == (f"mqtt://[{host.replace('%', '%25')}]:1883" if ":" in host else url)


def test_an_empty_ipv6_zone_is_refused_by_the_options_as_by_the_configuration(tmp_path: Path) -> None:
    """A zone with nothing after its '%25' names no interface. The configuration (and ``--broker``)
    refused it, but options built in code from the URL took it (host ``fe80::1%``), which the client
    then failed to resolve at every connect. (Written bare, ``[fe80::1%]``, urlsplit refuses it.)"""
    url = "mqtt://[fe80::1%25]:1883"
    problem = refused(tmp_path, f'site = "site.toml"\n[broker]\nurl = "{url}"\n').problem
    assert problem == f"no IPv6 zone after its '%25' in {url!r}: e.g. mqtt://[fe80::1%25eth0]:1883"
    with pytest.raises(ValueError) as caught:
        MqttOptions.from_url(url)
    assert str(caught.value) == problem


def test_the_client_id_is_one_per_host_by_default_and_may_name_the_host(tmp_path: Path) -> None:
    """Two hosts with the shipped configuration must not share one MQTT session (the broker hands it
    back and forth, docs/agent.md "Another agent on the site"): the default and the example's client
    id name the host; --check-config says which id it is."""
    host = host_name()
    loaded = load_config(write(tmp_path, 'site = "site.toml"\n'), env={})
    assert loaded.config.broker.resolved_client_id() == f"racktwin-agent-{host}"
    assert f"client id racktwin-agent-{host} (persistent session)" in explain(loaded)
    example = load_config(EXAMPLES / "agent.toml", env={})
    assert example.config.broker.resolved_client_id() == f"racktwin-agent-{host}"
    fixed = load_config(write(tmp_path, 'site = "site.toml"\n[broker]\nclient_id = "agent-{host}-2"\n'), env={})
    assert fixed.config.broker.resolved_client_id() == f"agent-{host}-2"
    for bad, words in (("{hostname}", "the only placeholder is {host}"), ("  ", "empty")):
        err = refused(tmp_path, f'site = "site.toml"\n[broker]\nclient_id = "{bad}"\n')
        assert err.path == "broker.client_id" and words in err.problem, err


def test_relative_broker_files_are_taken_from_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("pw", "ca.pem", "agent.crt", "agent.key", "other-ca.pem"):
        (tmp_path / name).write_text("secret\n")
    p = write(
        tmp_path,
        'site = "site.toml"\n[broker]\nurl = "mqtts://127.0.0.1"\nusername = "agent"\npassword_file = "pw"\n'
        'tls_ca_file = "ca.pem"\ntls_cert_file = "agent.crt"\ntls_key_file = "agent.key"\n',
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    b = load_config(p, env={}).config.broker
    assert (b.password_file, b.tls_ca_file, b.tls_cert_file, b.tls_key_file) == tuple(
        str(tmp_path / n) for n in ("pw", "ca.pem", "agent.crt", "agent.key")
    )
    assert b.resolved_password() == "secret"
    # a variable's relative path follows the same rule as RACKTWIN_SITE: the file's folder
    b = load_config(p, env={"RACKTWIN_BROKER_TLS_CA_FILE": "other-ca.pem"}).config.broker
    assert b.tls_ca_file == str(tmp_path / "other-ca.pem")


def test_a_password_file_that_is_no_readable_file_says_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "empty").write_text("")
    head = 'site = "site.toml"\n[broker]\nusername = "agent"\n'
    for name, words in [
        ("folder", "is a folder"),
        ("fifo", "not a regular file"),
        ("empty", "empty"),
        ("missing", "file not found"),
    ]:
        err = refused(tmp_path, head + f'password_file = "{name}"\n')
        assert err.path == "broker.password_file"
        assert words in err.problem, err


def test_an_unknown_racktwin_variable_is_an_error_naming_it(tmp_path: Path) -> None:
    for name, words in [
        ("RACKTWIN_CONTROL_PERIOD", "did you mean RACKTWIN_CONTROL_PERIOD_S?"),
        ("RACKTWIN_PERIOD_S", "did you mean RACKTWIN_CONTROL_PERIOD_S?"),
        ("RACKTWIN_MOSQUITO", "did you mean RACKTWIN_MOSQUITTO?"),
        ("racktwin_mode", "did you mean RACKTWIN_MODE? (names are upper case)"),
        ("RACKTWIN_ZZZ", "RACKTWIN_<SECTION>_<KEY>"),
    ]:
        err = refused(tmp_path, 'site = "site.toml"\n', env={name: "5"})
        assert err.path == name
        assert "unknown environment variable" in err.problem and words in err.problem, err
    # variables other parts of racktwin read are no configuration error
    env = {"RACKTWIN_MOSQUITTO": "", "RACKTWIN_MQTT_PASSWORD": "x", "PATH": "/bin"}
    assert load_config(write(tmp_path, 'site = "site.toml"\n'), env=env).overrides == ()


def test_every_racktwin_variable_the_code_reads_is_a_config_key_or_allowed() -> None:
    """A new RACKTWIN_* variable read elsewhere must join OTHER_ENV_VARS, or the agent refuses it."""
    files = [
        f
        for root in ("agent", "sim", "twin", "models", "benchmarks", "tests", "scripts", "deploy", ".ci")
        for f in (REPO / root).rglob("*")
        if f.is_file() and f.suffix in (".py", ".sh", ".service", ".conf", ".md", "") and f != Path(__file__)
    ]
    assert len(files) > 50
    seen = {m for f in files for m in re.findall(r"\bRACKTWIN_[A-Z0-9_]*[A-Z0-9]\b", f.read_text(errors="ignore"))}
    assert {"RACKTWIN_MOSQUITTO", "RACKTWIN_MQTT_PASSWORD", "RACKTWIN_BROKER_URL"} <= seen
    assert seen - set(env_variables()) - OTHER_ENV_VARS == set()


def test_margins_that_leave_no_room_are_refused_with_the_sites_value(tmp_path: Path) -> None:
    err = refused(tmp_path, 'site = "site.toml"\n[control]\nrack_margin_w = 60000\n')
    assert err.path == "control.rack_margin_w" and "50000 W" in err.problem
    err = refused(tmp_path, 'site = "site.toml"\n[control]\nmin_power_limit_w = 5000\n')
    assert err.path == "control.min_power_limit_w" and "700 W" in err.problem
    # 700 W is a card's limit, but 64 cards at it and the hosts leave a 50 kW rack no room: the guard's
    # last resort could not hold it
    err = refused(tmp_path, 'site = "site.toml"\n[control]\nmin_power_limit_w = 700\n')
    assert err.path == "control.min_power_limit_w" and "54600 W" in err.problem
    assert load_config(write(tmp_path, 'site = "site.toml"\n[control]\nmin_power_limit_w = 600\n'), env={})


def test_a_missing_site_names_the_config_file_the_field_and_the_variable(tmp_path: Path) -> None:
    p = write(tmp_path, 'site = "nope.toml"\n')
    err = refused(tmp_path, 'site = "nope.toml"\n')
    assert str(err) == f"{p}: site: {tmp_path / 'nope.toml'}: file not found"
    err = refused(tmp_path, 'site = "site.toml"\n', env={"RACKTWIN_SITE": "/nonexistent/x.toml"})
    assert str(err) == f"{p} (with RACKTWIN_SITE): site: /nonexistent/x.toml: file not found"


def test_a_config_file_with_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    p = write(tmp_path, "")
    p.write_bytes(b"\xef\xbb\xbfsite = 'site.toml'\nmode = 'enforce'\n")
    assert load_config(p, env={}).config.mode == "enforce"


def test_check_control_is_the_cross_field_check_for_a_control_table_alone() -> None:
    site = load_site(EXAMPLES / "supernode-512.toml")
    check_control(ControlConfig(), site, "--control")
    with pytest.raises(SpecError) as info:
        check_control(ControlConfig(period_s=5.0, solve_deadline_s=6.0), None, "--control", prefix="")
    assert str(info.value).startswith("--control: solve_deadline_s: must be shorter than period_s (5 s)")
    with pytest.raises(SpecError) as info:
        check_control(ControlConfig(period_s=60.0, telemetry_deadline_s=60.0, command_ttl_s=30.0), None, "--control")
    assert info.value.path == "control.command_ttl_s"
    with pytest.raises(SpecError) as info:
        check_control(ControlConfig(rack_margin_w=60_000.0), site, "--control")
    assert info.value.path == "control.rack_margin_w"


def test_a_rack_limit_the_failsafe_power_limit_cannot_hold_is_refused() -> None:
    data = read_toml(EXAMPLES / "supernode-512.toml")
    data["rack"]["power_limit_w"] = 20_000.0  # a curtailed rack: 64 cards x 200 W + 8.8 kW hosts + 1 kW margin
    site = site_from_dict(data, source="curtailed")
    with pytest.raises(SpecError) as info:
        check_control(ControlConfig(), site, "--control")
    assert info.value.path == "control.min_power_limit_w" and "22600 W" in info.value.problem
    check_control(ControlConfig(min_power_limit_w=150.0), site, "--control")  # 64 x 150 W: 19.4 kW fits


def test_a_journal_path_the_service_cannot_use_is_refused_naming_journal_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a regular file")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    cases = [
        (str(tmp_path / "file"), "not a journal (an SQLite database)"),  # the service said so only at start
        (str(tmp_path / "file" / "x.sqlite"), "is a file, not a folder"),
        (str(tmp_path / "file" / "a" / "b" / "x.sqlite"), "is a file, not a folder"),
        (str(tmp_path / "folder"), "is a folder, not a file"),
        (str(tmp_path / "fifo"), "not a regular file"),
    ]
    if Path("/proc/self/mountinfo").exists():  # Linux: as root os.access says /proc is writable
        cases.append(("/proc/journal.sqlite", "proc file system"))
    for path, words in cases:
        for err in (
            refused(tmp_path, f'site = "site.toml"\n[journal]\npath = "{path}"\n'),
            refused(tmp_path, 'site = "site.toml"\n', env={"RACKTWIN_JOURNAL_PATH": path}),
        ):
            assert err.path == "journal.path", err
            assert words in err.problem and path in err.problem, err
    # folders still to be made are fine (the service makes them), and checking creates nothing
    p = write(tmp_path, 'site = "site.toml"\n[journal]\npath = "state/agent/journal.sqlite"\n')
    before = sorted(x.name for x in tmp_path.iterdir())
    loaded = load_config(p, env={})
    assert loaded.config.journal.path == str(tmp_path / "state" / "agent" / "journal.sqlite")
    assert sorted(x.name for x in tmp_path.iterdir()) == before  # nothing created by the check
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "agent").mkdir()
    Path(loaded.config.journal.path).write_bytes(b"")  # an existing (empty) file is fine too
    assert load_config(p, env={}).config.journal.path == loaded.config.journal.path


@pytest.mark.parametrize("host", ["not a host", "host_with_underscore", "-leading.dash", "a..b"])
def test_an_http_host_that_is_no_address_is_refused_naming_http_host(tmp_path: Path, host: str) -> None:
    """`--check-config` said OK and the service then failed at start naming http.port."""
    err = refused(tmp_path, f'site = "site.toml"\n[http]\nhost = "{host}"\n')
    assert err.path == "http.host" and "neither an IP address nor a host name" in err.problem


def test_http_hosts_that_are_addresses_or_names_pass(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "metrics-1.example.org", "node07."):
        p = write(tmp_path, f'site = "site.toml"\n[http]\nhost = "{host}"\n')
        assert load_config(p, env={}).config.http.host == host


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder")
def test_a_journal_in_a_folder_the_agent_cannot_write_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = refused(tmp_path, f'site = "site.toml"\n[journal]\npath = "{locked / "new" / "j.sqlite"}"\n')
        assert err.path == "journal.path" and f"cannot create files in {locked}" in err.problem
    finally:
        locked.chmod(0o700)


def test_check_config_of_another_file_than_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config A --check-config B` checked B alone and said OK; the same file twice is fine."""
    from agent.cli import main

    a = write(tmp_path, 'site = "site.toml"\n')
    b = tmp_path / "other.toml"
    b.write_text('site = "site.toml"\n')
    assert main(["agent", "--config", str(a), "--check-config", str(b)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "name two files" in err
    assert main(["agent", "--config", str(a), "--check-config", str(a)]) == 0
    assert main(["agent", "--config", str(a), "--check-config"]) == 0


def test_racktwin_without_a_command_is_a_usage_error_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from agent.cli import main

    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "COMMAND" in err
    assert main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert "COMMAND" in out and err == ""


def test_a_site_spec_given_as_the_configuration_says_so(tmp_path: Path) -> None:
    """It said `name: unknown key; did you mean 'mode'?`."""
    spec = tmp_path / "supernode-512.toml"
    spec.write_text((EXAMPLES / "supernode-512.toml").read_text())
    with pytest.raises(SpecError) as info:
        load_config(spec, env={})
    assert "this looks like a site spec ([card], [cold_plate]" in str(info.value)
    assert "not an agent configuration" in str(info.value)
