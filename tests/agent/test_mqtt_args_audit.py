"""The MQTT client options of ``racktwin sim`` (``agent/mqtt_args.py``), as the help text and
docs/protocol.md ("Broker and security") and docs/sim.md describe them: ``--broker mqtt://host:port``
or ``mqtts://host:port`` (TLS, port 8883 by default), ``--mqtt-username``, ``--mqtt-password-file``
(its first line is the password) or else ``RACKTWIN_MQTT_PASSWORD``, ``--mqtt-ca-file``,
``--mqtt-cert-file``/``--mqtt-key-file``, ``--mqtt-tls-insecure`` (skips the host name check only),
``--mqtt-client-id``. A problem is one line naming the option (``UserError``), exit status 2.

Written for a mutation audit of the module: each test kills a mutant the other tests let live."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from mqtt_testing import TlsFiles

from agent.cli import main
from agent.commands.common import UserError
from agent.mqtt_args import PASSWORD_ENV, add_mqtt_arguments, check_tls_files_of_args, mqtt_options_from_args
from agent.mqtt_options import MqttOptions

pytestmark = pytest.mark.agent


def options(*argv: str, **overrides: object) -> MqttOptions | None:
    parser = argparse.ArgumentParser()
    add_mqtt_arguments(parser)
    return mqtt_options_from_args(parser.parse_args(list(argv)), **overrides)


def given(*argv: str, **overrides: object) -> MqttOptions:
    result = options(*argv, **overrides)
    assert result is not None
    return result


def refused(*argv: str) -> str:
    with pytest.raises(UserError) as info:
        options(*argv)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.fixture(autouse=True)
def _no_password_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)


def test_mqtts_defaults_to_port_8883_with_tls_and_mqtt_to_1883_without() -> None:
    tls = given("--broker", "mqtts://broker.example")
    assert (tls.host, tls.port, tls.use_tls) == ("broker.example", 8883, True)
    plain = given("--broker", "mqtt://broker.example")
    assert (plain.host, plain.port, plain.use_tls) == ("broker.example", 1883, False)
    assert given("--broker", "mqtts://broker.example:9999").port == 9999  # a port given is kept


def test_the_highest_port_is_taken_and_the_next_refused_naming_the_broker_option() -> None:
    assert given("--broker", "mqtt://h:65535").port == 65535
    assert given("--broker", "mqtt://h:1").port == 1
    assert refused("--broker", "mqtt://h:65536").startswith("--broker mqtt://h:65536: ")


def test_the_password_is_the_first_line_of_the_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\nsecond line\n", encoding="utf-8")
    o = given("--broker", "mqtt://h", "--mqtt-username", "sim", "--mqtt-password-file", str(pw))
    assert (o.username, o.password) == ("sim", "s3cret")


def test_a_password_file_that_is_no_file_says_so_as_the_other_commands_do(tmp_path: Path) -> None:
    """It said the system's "No such file or directory" (and "Is a directory") where the other commands
    say ``<path>: file not found``. A pipe is read (``--mqtt-password-file <(pass show mqtt)``)."""
    base = ["--broker", "mqtt://h", "--mqtt-username", "sim", "--mqtt-password-file"]
    missing = tmp_path / "missing"
    assert refused(*base, str(missing)) == f"--mqtt-password-file {missing}: file not found"
    assert refused(*base, str(tmp_path)) == f"--mqtt-password-file {tmp_path}: is a folder, not a file"
    read, write = os.pipe()
    os.write(write, b"piped\n")
    os.close(write)
    try:
        assert given(*base, f"/dev/fd/{read}").password == "piped"
    finally:
        os.close(read)


def test_the_password_comes_from_the_environment_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    assert PASSWORD_ENV == "RACKTWIN_MQTT_PASSWORD"  # the name the help and docs/protocol.md give
    monkeypatch.setenv("RACKTWIN_MQTT_PASSWORD", "from-env")
    assert given("--broker", "mqtt://h", "--mqtt-username", "sim").password == "from-env"


def test_a_password_file_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is read "when no password file is given"."""
    pw = tmp_path / "pw"
    pw.write_text("from-file\n", encoding="utf-8")
    monkeypatch.setenv("RACKTWIN_MQTT_PASSWORD", "from-env")
    o = given("--broker", "mqtt://h", "--mqtt-username", "sim", "--mqtt-password-file", str(pw))
    assert o.password == "from-file"


def test_without_a_password_the_client_logs_in_with_none() -> None:
    o = given("--broker", "mqtt://h", "--mqtt-username", "sim")
    assert (o.username, o.password) == ("sim", None)


def test_a_password_without_a_user_name_names_where_the_password_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: both were "--broker mqtt://h: a password needs a username", blaming a good URL (and an
    exported RACKTWIN_MQTT_PASSWORD made every anonymous ``racktwin sim --broker`` fail that way)."""
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n", encoding="utf-8")
    message = refused("--broker", "mqtt://h", "--mqtt-password-file", str(pw))
    assert message.startswith(f"--mqtt-password-file {pw}: ") and "--mqtt-username" in message, message
    monkeypatch.setenv("RACKTWIN_MQTT_PASSWORD", "from-env")
    message = refused("--broker", "mqtt://h")
    assert message.startswith("RACKTWIN_MQTT_PASSWORD ") and "--mqtt-username" in message, message


def test_tls_insecure_on_a_plain_broker_names_the_option() -> None:
    """Defect: it was "--broker mqtt://h: tls_insecure only makes sense with TLS" (a field name, not
    the option the user gave)."""
    message = refused("--broker", "mqtt://h", "--mqtt-tls-insecure")
    assert message.startswith("--mqtt-tls-insecure ") and "mqtts://" in message, message


def test_tls_insecure_skips_the_host_name_check_only(tls_files: TlsFiles) -> None:
    o = given("--broker", "mqtts://h", "--mqtt-ca-file", tls_files.ca_file, "--mqtt-tls-insecure")
    ctx = o.ssl_context()
    assert ctx is not None and ctx.check_hostname is False
    strict = given("--broker", "mqtts://h", "--mqtt-ca-file", tls_files.ca_file).ssl_context()
    assert strict is not None and strict.check_hostname is True  # off by default


def test_every_option_reaches_the_client(tls_files: TlsFiles) -> None:
    o = given(
        "--broker", "mqtts://h",
        "--mqtt-username", "sim",
        "--mqtt-ca-file", tls_files.ca_file,
        "--mqtt-cert-file", tls_files.cert_file,
        "--mqtt-key-file", tls_files.key_file,
        "--mqtt-client-id", "sim-7",
    )  # fmt: skip
    assert (o.username, o.ca_file, o.cert_file, o.key_file, o.client_id) == (
        "sim",
        tls_files.ca_file,
        tls_files.cert_file,
        tls_files.key_file,
        "sim-7",
    )
    check_tls_files_of_args(o)  # usable files: no error


def test_the_callers_overrides_win() -> None:
    o = given("--broker", "mqtt://h", "--mqtt-client-id", "sim-7", clean_session=False, client_id="other")
    assert (o.clean_session, o.client_id) == (False, "other")


@pytest.mark.parametrize("option", ["--mqtt-ca-file", "--mqtt-cert-file", "--mqtt-key-file"])
def test_a_missing_certificate_file_is_named_before_any_tls(option: str, tmp_path: Path, tls_files: TlsFiles) -> None:
    missing = str(tmp_path / "missing.pem")
    argv = ["--broker", "mqtts://h", option, missing]
    if option == "--mqtt-key-file":
        argv += ["--mqtt-cert-file", tls_files.cert_file]
    assert refused(*argv) == f"{option} {missing}: file not found"  # was "no such file"
    assert (
        refused(*[str(tmp_path) if a == missing else a for a in argv])
        == f"{option} {tmp_path}: is a folder, not a file"
    )


def test_a_key_file_needs_its_certificate(tls_files: TlsFiles) -> None:
    message = refused("--broker", "mqtts://h", "--mqtt-key-file", tls_files.key_file)
    assert message.startswith("--mqtt-key-file needs --mqtt-cert-file"), message


def test_a_certificate_file_that_is_not_pem_is_named_by_its_option(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    o = given("--broker", "mqtts://h", "--mqtt-ca-file", str(junk))
    with pytest.raises(UserError) as info:
        check_tls_files_of_args(o)
    assert str(info.value).startswith(f"--mqtt-ca-file {junk}: "), info.value


def test_an_empty_user_name_without_a_broker_is_still_a_credential() -> None:
    assert refused("--mqtt-username", "").startswith("--mqtt-username needs --broker")


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_user_name_is_refused_naming_the_option(name: str) -> None:
    """``--mqtt-username "$MQTT_USER"`` with the variable unset: it logged in as the user "" (with
    ``RACKTWIN_MQTT_PASSWORD`` set, the password check passed too), which the broker then refused."""
    message = refused("--broker", "mqtt://h", "--mqtt-username", name)
    assert message.startswith("--mqtt-username: empty: give a user name"), message
    assert given("--broker", "mqtt://h", "--mqtt-username", "sim").username == "sim"


@pytest.mark.parametrize(
    ("option", "extra"),
    [("--mqtt-ca-file", []), ("--mqtt-cert-file", []), ("--mqtt-cert-file", ["--mqtt-key-file"])],
)
@pytest.mark.parametrize("url", ["mqtt://h", "mqtt://h:1883", "mqtt://h:8883"])
def test_a_certificate_file_needs_an_mqtts_broker_url(
    option: str, extra: list[str], url: str, tls_files: TlsFiles
) -> None:
    """docs/protocol.md: the TLS options need ``--broker mqtts://``. A certificate file with
    ``mqtt://h`` turned TLS on at port 1883, where a broker speaks plain MQTT: every connect failed
    with a TLS error instead of the option being named."""
    files = {
        "--mqtt-ca-file": tls_files.ca_file,
        "--mqtt-cert-file": tls_files.cert_file,
        "--mqtt-key-file": tls_files.key_file,
    }
    argv = ["--broker", url, option, files[option], *(arg for e in extra for arg in (e, files[e]))]
    message = refused(*argv)
    assert message == f"{option} needs an mqtts:// broker URL (TLS, port 8883 by default): --broker {url} is plain MQTT"
    tls = given("--broker", url.replace("mqtt://", "mqtts://"), *argv[2:])
    assert tls.use_tls and tls.port == (8883 if url == "mqtt://h" else int(url.rsplit(":", 1)[1]))


def test_the_options_refuse_a_certificate_file_with_a_plain_url_as_the_commands_do(tls_files: TlsFiles) -> None:
    """``MqttOptions.from_url`` (the agent's ``[broker]`` and the commands' options both go through it)."""
    with pytest.raises(ValueError, match="plain MQTT: a CA or client certificate file needs an mqtts:// URL"):
        MqttOptions.from_url("mqtt://h", ca_file=tls_files.ca_file)
    with pytest.raises(ValueError, match="plain MQTT"):
        MqttOptions.from_url("mqtt://h", cert_file=tls_files.cert_file, key_file=tls_files.key_file)
    assert MqttOptions.from_url("mqtts://h", ca_file=tls_files.ca_file).port == 8883


def test_sim_says_an_empty_user_name_in_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "--broker", "mqtt://127.0.0.1:1", "--mqtt-username", "", "--duration", "5", "--speed", "0"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("racktwin sim: error: --mqtt-username: empty: give a user name") and err.count("\n") == 1, err


def test_without_a_broker_and_credentials_there_are_no_options() -> None:
    assert options() is None
    assert options("--mqtt-client-id", "sim-7") is None  # the client id applies to the embedded broker too


def test_a_blank_client_id_is_refused() -> None:
    assert refused("--broker", "mqtt://h", "--mqtt-client-id", "  ").startswith("--mqtt-client-id: empty")


def test_sim_says_the_password_problem_in_one_line_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RACKTWIN_MQTT_PASSWORD", "from-env")
    rc = main(["sim", "--broker", "mqtt://127.0.0.1:1", "--duration", "5", "--speed", "0"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("racktwin sim: error: RACKTWIN_MQTT_PASSWORD ") and err.count("\n") == 1, err
