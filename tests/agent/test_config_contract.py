"""What docs/agent.md ("Configuration") and examples/agent.toml promise of the agent's configuration:
every key with its documented default, the cross-field checks at their documented bounds, the
environment overrides parsed as the key's type (a value that is not one is refused, never read as
another), the broker's password and certificate rules, and what ``--check-config`` says."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import typing
from pathlib import Path

import pytest

from agent.config import AgentConfig, BrokerConfig, explain, host_name, load_config
from agent.service import mqtt_options
from twin.tables import SpecError

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def write(tmp_path: Path, text: str, site: str = "") -> Path:
    (tmp_path / "site.toml").write_text(site or (EXAMPLES / "supernode-512.toml").read_text())
    p = tmp_path / "agent.toml"
    p.write_text('site = "site.toml"\n' + text)
    return p


def refused(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_config(write(tmp_path, text), env=env or {})
    return info.value


def code_defaults() -> dict[str, object]:
    """Every key (``section.key`` or a top-level key) and its default in agent.config."""
    out: dict[str, object] = {}
    hints = typing.get_type_hints(AgentConfig)
    for f in dataclasses.fields(AgentConfig):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out |= {f"{f.name}.{sf.name}": sf.default for sf in dataclasses.fields(hint)}
        else:
            out[f.name] = None if f.default is dataclasses.MISSING else f.default
    return out


def documented_defaults() -> dict[str, str]:
    """The key table of docs/agent.md's Configuration section: key -> its default cell."""
    text = (REPO / "docs" / "agent.md").read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for keys_cell, default_cell in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|", text, flags=re.M):
        keys = re.findall(r"`([^`]+)`", keys_cell)
        cells = [c.strip() for c in default_cell.split(",")] if len(keys) > 1 else [default_cell.strip()]
        cells = cells * len(keys) if len(cells) == 1 else cells  # one default for all (`none`)
        out |= dict(zip(keys, cells, strict=True))
    return out


def _as_documented(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return f"{value:g}"
    return str(value)


def test_every_key_is_documented_with_its_default() -> None:
    documented = documented_defaults()
    code = code_defaults()
    assert set(documented) == set(code)
    for key, default in code.items():
        cell = documented[key].strip("`")
        cell = {"(required)": "none", "unset": "none", "0 (off)": "0"}.get(cell, cell)
        number = re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", cell)
        assert (f"{float(cell):g}" if number else cell) == _as_documented(default), key


def test_the_example_lists_every_key_with_its_default() -> None:
    """examples/agent.toml: "Every key except `site` has a default (shown)"; a key without a default
    value (none) is there commented out."""
    text = (EXAMPLES / "agent.toml").read_text()
    data = tomllib.loads(text)
    commented = {m for m in re.findall(r"^# (\w+) = ", text, flags=re.M)}
    for key, default in code_defaults().items():
        section, _, name = key.rpartition(".")
        table = data.get(section, {}) if section else data
        if key == "site":
            assert table[name] == "supernode-512.toml"
        elif name in table:
            assert table[name] == default, key
        else:
            assert default is None and name in commented, key


def test_an_mqtts_url_without_a_port_is_port_8883_and_tls(tmp_path: Path) -> None:
    b = load_config(write(tmp_path, '[broker]\nurl = "mqtts://broker.example"\n'), env={}).config.broker
    assert (b.host, b.port, b.tls) == ("broker.example", 8883, True)
    b = load_config(write(tmp_path, '[broker]\nurl = "mqtt://broker.example"\n'), env={}).config.broker
    assert (b.port, b.tls) == (1883, False)


@pytest.mark.parametrize(
    ("files", "field"),
    [
        ('tls_ca_file = "ca.pem"\n', "broker.tls_ca_file"),
        ('tls_cert_file = "agent.crt"\ntls_key_file = "agent.key"\n', "broker.tls_cert_file"),  # mutual TLS is TLS
    ],
)
def test_a_certificate_file_needs_an_mqtts_url_as_the_clients_options_do(
    tmp_path: Path, files: str, field: str
) -> None:
    """docs/agent.md: the certificate files need an ``mqtts://`` ``broker.url``. With ``mqtt://`` they
    turned TLS on at the plain port (1883 when the URL has none), where a broker does not speak TLS:
    every connect failed. Refused naming the key, as ``racktwin sim --mqtt-ca-file`` with
    ``--broker mqtt://...``; with ``mqtts://`` the same files are TLS."""
    for name in ("ca.pem", "agent.crt", "agent.key"):
        (tmp_path / name).write_text("pem\n")
    for url in ("mqtt://broker:1883", "mqtt://broker"):
        err = refused(tmp_path, f'[broker]\nurl = "{url}"\n{files}')
        assert err.path == field and "needs an mqtts:// broker.url" in err.problem and url in err.problem, err
    loaded = load_config(write(tmp_path, f'[broker]\nurl = "mqtts://broker"\n{files}'), env={})
    assert loaded.config.broker.tls and mqtt_options(loaded.config.broker).use_tls
    assert mqtt_options(loaded.config.broker).port == 8883
    assert "mqtts://broker as (anonymous) with TLS," in explain(loaded)


@pytest.mark.parametrize("env", [{}, {"RACKTWIN_BROKER_USERNAME": ""}])
def test_an_empty_user_name_is_refused_naming_the_key(tmp_path: Path, env: dict[str, str]) -> None:
    """An empty ``broker.username`` (or ``RACKTWIN_BROKER_USERNAME=""``: a variable left unset in a unit
    file) is a mistake, not a login (the configuration's string keys are never empty: twin.tables), as
    ``racktwin sim --mqtt-username ""`` is."""
    text = "" if env else '[broker]\nusername = ""\n'
    err = refused(tmp_path, text, env=env)
    assert err.path == "broker.username" and "empty" in err.problem, err
    err = refused(tmp_path, '[broker]\nusername = "  "\n')
    assert err.path == "broker.username" and "empty" in err.problem, err
    assert load_config(write(tmp_path, '[broker]\nusername = "agent"\n'), env={}).config.broker.username == "agent"


def test_the_password_is_the_first_line_of_the_password_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("  s3cret  \nold-password\n")
    b = load_config(write(tmp_path, '[broker]\nusername = "agent"\npassword_file = "pw"\n'), env={}).config.broker
    assert b.resolved_password() == "s3cret"


def test_a_password_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "pw").write_bytes(b"\xff\xfe\x00s\x00e\x00c\x00\n")  # UTF-16, as an editor may save it
    err = refused(tmp_path, '[broker]\nusername = "agent"\npassword_file = "pw"\n')
    assert err.path == "broker.password_file" and "not a UTF-8 text file" in err.problem


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_password_or_certificate_file_the_agent_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    for name in ("pw", "agent.crt", "agent.key"):
        (tmp_path / name).write_text("secret\n")
        (tmp_path / name).chmod(0)
    for text, field in [
        ('[broker]\nusername = "agent"\npassword_file = "pw"\n', "broker.password_file"),
        ('[broker]\ntls_cert_file = "agent.crt"\ntls_key_file = "agent.key"\n', "broker.tls_cert_file"),
    ]:
        err = refused(tmp_path, text)
        assert err.path == field and "cannot read (permission denied)" in err.problem, err


def test_the_broker_credential_rules(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("secret\n")
    (tmp_path / "agent.crt").write_text("pem\n")
    for text, field, words in [
        ('[broker]\npassword = "secret"\n', "broker.username", "a password needs a user name"),
        ('[broker]\npassword_file = "pw"\n', "broker.username", "a password needs a user name"),
        (
            '[broker]\nusername = "agent"\npassword = "x"\npassword_file = "pw"\n',
            "broker.password_file",
            "either broker.password or broker.password_file",
        ),
        ('[broker]\ntls_key_file = "agent.crt"\n', "broker.tls_cert_file", "both tls_cert_file and tls_key_file"),
        ('[broker]\ntls_cert_file = "agent.crt"\n', "broker.tls_cert_file", "both tls_cert_file and tls_key_file"),
        (
            '[broker]\ntls_cert_file = "agent.crt"\ntls_key_file = "missing.key"\n',
            "broker.tls_key_file",
            "file not found",
        ),
    ]:
        err = refused(tmp_path, text)
        assert err.path == field and words in err.problem, (text, err)
    err = refused(tmp_path, "", env={"RACKTWIN_BROKER_PASSWORD": "secret"})  # the variable, as the file
    assert err.path == "broker.username"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mqtt://agent@host:1883", "no user name or password in the URL"),
        ("mqtt://host:1883#frag", "query or fragment not allowed"),
        ("mqtt://host:1883?", "query or fragment not allowed"),
    ],
)
def test_a_broker_url_with_more_than_host_and_port_is_refused(tmp_path: Path, url: str, words: str) -> None:
    err = refused(tmp_path, f'[broker]\nurl = "{url}"\n')
    assert err.path == "broker.url" and words in err.problem, err


@pytest.mark.parametrize(
    "host",
    [
        "broker..example",  # a typo: an empty label
        ".broker.example",
        "x" * 64 + ".example",  # a label longer than DNS allows
        ".".join(c * 63 for c in "abcd"),  # 255 characters
    ],
)
def test_a_broker_host_name_dns_cannot_look_up_is_refused(tmp_path: Path, host: str) -> None:
    """--check-config said OK, and the agent then logged "unexpected error on the connection" with
    the resolver's UnicodeError traceback at every reconnect, for ever."""
    url = f"mqtt://{host}:1883"
    err = refused(tmp_path, f'[broker]\nurl = "{url}"\n')
    assert err.path == "broker.url" and f"bad host {host!r}" in err.problem and "1 to 63 characters" in err.problem
    longest = ".".join(c * 63 for c in "abc") + "." + "d" * 61  # 253 characters
    for ok in ("broker.example.", "x" * 63 + ".example", longest, longest + "."):  # "." ends an FQDN
        assert load_config(write(tmp_path, f'[broker]\nurl = "mqtt://{ok}:1883"\n'), env={}).config.broker.host == ok


def test_a_bare_ipv6_zone_that_is_an_interface_index_is_kept(tmp_path: Path) -> None:
    """Only a bare zone beginning with 25 is read as RFC 6874's ``%25``: ``%2`` is interface 2."""
    b = load_config(write(tmp_path, '[broker]\nurl = "mqtt://[fe80::1%2]:1883"\n'), env={}).config.broker
    assert b.host == "fe80::1%2"


def test_an_http_host_name_longer_than_dns_allows_is_refused(tmp_path: Path) -> None:
    host = ".".join(c * 63 for c in "abcd")  # 255 characters of valid labels
    err = refused(tmp_path, f'[http]\nhost = "{host}"\n')
    assert err.path == "http.host"
    assert load_config(write(tmp_path, f'[http]\nhost = "{host[:253]}"\n'), env={})


def test_a_client_id_with_a_stray_brace_is_refused(tmp_path: Path) -> None:
    for bad in ("agent}", "agent-{host}}"):
        err = refused(tmp_path, f'[broker]\nclient_id = "{bad}"\n')
        assert err.path == "broker.client_id" and "the only placeholder is {host}" in err.problem


def test_the_host_in_the_client_id_is_at_most_64_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "node 7/" + "x" * 100)
    assert host_name() == ("node-7-" + "x" * 100)[:64]
    assert BrokerConfig().resolved_client_id() == "racktwin-agent-" + host_name()


@pytest.mark.parametrize(
    ("control", "field"),
    [
        ("period_s = 10\nsolve_deadline_s = 10\n", "control.solve_deadline_s"),  # < period_s
        ("period_s = 10\ntelemetry_deadline_s = 9.9\n", "control.telemetry_deadline_s"),  # >= period_s
        ("period_s = 10\ncommand_ttl_s = 9.9\n", "control.command_ttl_s"),  # >= period_s
        ("period_s = 10\nmin_replan_interval_s = 10.5\n", "control.min_replan_interval_s"),  # <= period_s
        ("rack_margin_w = 50000\n", "control.rack_margin_w"),  # below the 50 kW rack limit
    ],
)
def test_the_cross_field_checks_refuse_at_their_documented_bounds(tmp_path: Path, control: str, field: str) -> None:
    assert refused(tmp_path, f"[control]\n{control}").path == field


def test_the_cross_field_checks_accept_their_documented_bounds(tmp_path: Path) -> None:
    bounds = "period_s = 10\nsolve_deadline_s = 9.99\ntelemetry_deadline_s = 10\ncommand_ttl_s = 10\n"
    bounds += "min_replan_interval_s = 10\n"
    c = load_config(write(tmp_path, f"[control]\n{bounds}"), env={}).config.control
    assert (c.telemetry_deadline_s, c.command_ttl_s, c.min_replan_interval_s) == (10.0, 10.0, 10.0)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("[control]\nstuck_after_readings = 1\n", "control.stuck_after_readings", "must be >= 3"),
        ("[control]\nmax_level_raise_per_period = 0\n", "control.max_level_raise_per_period", "must be >= 1"),
        ("[control]\ntime_scale = 2.0\n", "control.time_scale", "must be <= 1"),
        ("[control]\npump_speed_steps = 1\n", "control.pump_speed_steps", "must be >= 2"),
        ("[http]\nport = 65536\n", "http.port", "must be <= 65535"),
        ("[broker]\nkeepalive_s = 1\n", "broker.keepalive_s", "must be >= 5"),
        # MQTT's keepalive is whole seconds: 7.9 was sent as 7 without a word
        ("[broker]\nkeepalive_s = 7.9\n", "broker.keepalive_s", "must be a whole number of seconds, got 7.9"),
        ("[log]\nlevel = 'trace'\n", "log.level", "must be one of 'debug', 'info', 'warning', 'error'"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_key_and_the_range(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    err = refused(tmp_path, text)
    assert err.path == field and words in err.problem, err


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("1", True), ("yes", True), ("On", True)])
def test_a_boolean_variable_takes_the_usual_spellings(tmp_path: Path, raw: str, value: bool) -> None:
    p = write(tmp_path, "[control]\ncontrol_setpoint = false\n")
    assert load_config(p, env={"RACKTWIN_CONTROL_CONTROL_SETPOINT": raw}).config.control.control_setpoint is value
    for off in ("false", "0", "no", "OFF"):
        env = {"RACKTWIN_CONTROL_CONTROL_SETPOINT": off}
        assert load_config(write(tmp_path, ""), env=env).config.control.control_setpoint is False


@pytest.mark.parametrize(
    ("name", "raw", "words"),
    [
        ("RACKTWIN_CONTROL_CONTROL_SETPOINT", "flase", "expected true or false"),  # not read as false
        ("RACKTWIN_CONTROL_COMMAND_RETRIES", "2.5", "expected an integer"),  # not cut to 2
        ("RACKTWIN_HTTP_PORT", "9464.0", "expected an integer"),
    ],
)
def test_a_variable_that_is_not_of_the_keys_type_is_refused(tmp_path: Path, name: str, raw: str, words: str) -> None:
    err = refused(tmp_path, "", env={name: raw})
    key = name.removeprefix("RACKTWIN_").lower().replace("_", ".", 1)
    assert err.path == key and words in err.problem and name in str(err), err


def test_an_optional_key_can_be_set_from_the_environment(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, ""), env={"RACKTWIN_CONTROL_HOST_OFF_AFTER_S": "600"})
    assert loaded.config.control.host_off_after_s == 600.0


def test_check_config_names_every_variable_that_changed_a_value(tmp_path: Path) -> None:
    env = {"RACKTWIN_MODE": "enforce", "RACKTWIN_CONTROL_PERIOD_S": "10", "RACKTWIN_HTTP_PORT": "0"}
    loaded = load_config(write(tmp_path, ""), env=env)
    assert loaded.overrides == ("RACKTWIN_MODE", "RACKTWIN_CONTROL_PERIOD_S", "RACKTWIN_HTTP_PORT")
    text = explain(loaded)
    assert "overridden by RACKTWIN_MODE, RACKTWIN_CONTROL_PERIOD_S, RACKTWIN_HTTP_PORT" in text
    assert "http          disabled" in text  # port 0 disables the endpoint


def test_check_config_names_an_accelerated_time_scale(tmp_path: Path) -> None:
    assert "time scale" not in explain(load_config(write(tmp_path, ""), env={}))
    loaded = load_config(write(tmp_path, "[control]\ntime_scale = 0.1\n"), env={})
    assert "time scale    0.1 wall s per site s (accelerated simulator)" in explain(loaded)


def test_a_reserve_that_needs_part_of_a_host_more_is_warned_about(tmp_path: Path) -> None:
    """17 cards on hosts of 8 need 3 hosts on, not 2 (the division rounds up)."""
    loaded = load_config(write(tmp_path, "[control]\nidle_reserve_cards = 17\n"), env={})
    assert loaded.site.cards_per_host == 8
    assert "needs 3 idle hosts on, host_reserve_per_supernode keeps 2" in explain(loaded)


def test_a_site_whose_racks_cannot_be_addressed_on_the_wire_is_refused_under_site(tmp_path: Path) -> None:
    """128 x 64 cards per rack is more than a rack's telemetry may carry (wire.MAX_CARDS_PER_RACK)."""
    site = (EXAMPLES / "supernode-512.toml").read_text()
    big = re.sub(r"^torus_dims = \[[^]]*\]", "torus_dims = [128, 64, 8]", site, count=1, flags=re.M)
    assert big != site
    with pytest.raises(SpecError) as info:
        load_config(write(tmp_path, "", site=big), env={})
    assert info.value.path == "site" and "cards_per_rack must be within 1..4096" in info.value.problem


def test_check_config_explains_what_the_agent_will_and_will_not_control(tmp_path: Path) -> None:
    text = explain(
        load_config(
            write(
                tmp_path,
                'mode = "enforce"\n[broker]\npersistent_session = false\n[control]\ncontrol_setpoint = false\n'
                "control_placement = false\ncontrol_host_power = false\n",
            ),
            env={},
        )
    )
    assert "  mode          enforce  (commands are published)" in text
    assert " (clean session)" in text and "persistent session" not in text
    assert "  set-point     fixed" in text
    assert "  placement     left to the site's scheduler" in text
    assert "  hosts         left on (control_host_power = false)" in text
    text = explain(load_config(write(tmp_path, ""), env={}))
    assert "  mode          advisory  (advice only, no command is sent)" in text
    assert "  set-point     re-optimized every 300 s" in text and "queued jobs placed by the agent (auto)" in text
    assert "2 idle per supernode kept on, booted 60 s before a queued job's expected start" in text


def test_check_config_of_a_site_without_managed_hosts_at_pue_target_1(tmp_path: Path) -> None:
    """A site spec without rack.hosts_per_rack keeps its hosts on; a PUE target of 1.0 (the lowest the
    spec allows) leaves no overhead to penalize, and no warning to divide by zero."""
    site = (EXAMPLES / "supernode-512.toml").read_text()
    site = re.sub(r"^hosts_per_rack = .*$", "hosts_per_rack = 0", site, count=1, flags=re.M)
    site = re.sub(r"^pue_target = .*$", "pue_target = 1.0", site, count=1, flags=re.M)
    text = explain(load_config(write(tmp_path, "", site=site), env={}))
    assert "  hosts         always on (the site spec has no rack.hosts_per_rack)" in text
    assert "PUE target 1)" in text and "warning" not in text


def test_a_lower_case_name_of_a_variable_racktwin_reads_elsewhere_says_names_are_upper_case(tmp_path: Path) -> None:
    err = refused(tmp_path, "", env={"racktwin_mosquitto": ""})
    assert err.path == "racktwin_mosquitto" and "did you mean RACKTWIN_MOSQUITTO? (names are upper case)" in err.problem
