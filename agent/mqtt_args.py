"""Command-line options of a client of the MQTT broker (``racktwin sim``; the agent reads its
configuration's ``[broker]`` instead): :func:`add_mqtt_arguments` adds ``--broker`` and the
``--mqtt-*`` options to a command's parser, :func:`mqtt_options_from_args` makes
:class:`agent.mqtt_options.MqttOptions` of them, and :func:`check_tls_files_of_args` reads their
certificate files before a run. Problems are ``agent.commands.common.UserError`` naming the option.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from agent.commands.common import UserError, path_arg
from agent.config import file_reason
from agent.mqtt_options import MqttOptions, TlsFileError

__all__ = ["PASSWORD_ENV", "add_mqtt_arguments", "check_tls_files_of_args", "mqtt_options_from_args"]

#: Environment variable read for the password when no password file is given.
PASSWORD_ENV = "RACKTWIN_MQTT_PASSWORD"


def add_mqtt_arguments(
    parser: argparse.ArgumentParser, *, embedded_default: bool = True, client_id_default: str = "random"
) -> None:
    """Add ``--broker`` and the MQTT client options to a command's parser; ``client_id_default`` says
    in the help what the command uses when ``--mqtt-client-id`` is not given."""
    g = parser.add_argument_group("MQTT broker")
    g.add_argument(
        "--broker",
        metavar="URL",
        default=None,
        help="mqtt://host:port or mqtts://host:port (TLS)"
        + ("; without it an embedded broker is started on a free loopback port" if embedded_default else ""),
    )
    g.add_argument("--mqtt-username", metavar="USER", default=None, help="user name for the broker")
    g.add_argument(
        "--mqtt-password-file",
        metavar="FILE",
        type=path_arg,
        default=None,
        help=f"file whose first line is the password (or set {PASSWORD_ENV})",
    )
    g.add_argument(
        "--mqtt-ca-file", metavar="FILE", type=path_arg, default=None, help="CA certificate(s) to verify the broker"
    )
    g.add_argument(
        "--mqtt-cert-file", metavar="FILE", type=path_arg, default=None, help="client certificate (TLS client auth)"
    )
    g.add_argument("--mqtt-key-file", metavar="FILE", type=path_arg, default=None, help="client private key")
    g.add_argument(
        "--mqtt-tls-insecure",
        action="store_true",
        help="do not check the broker's host name against its certificate (testing only)",
    )
    g.add_argument(
        "--mqtt-client-id", metavar="ID", default=None, help=f"MQTT client id (default: {client_id_default})"
    )


#: The options of :func:`add_mqtt_arguments` that only a ``--broker`` takes (credentials and TLS;
#: the embedded broker is anonymous and plain). ``--mqtt-client-id`` applies to both.
_BROKER_ONLY_OPTIONS = (
    "mqtt_username",
    "mqtt_password_file",
    "mqtt_ca_file",
    "mqtt_cert_file",
    "mqtt_key_file",
    "mqtt_tls_insecure",
)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def mqtt_options_from_args(ns: argparse.Namespace, **overrides: Any) -> MqttOptions | None:
    """MQTT options from :func:`add_mqtt_arguments`' options; None when ``--broker`` was not given
    (then a credential or TLS option is an error: the embedded broker takes none). Problems are
    raised as ``agent.commands.common.UserError`` (one line for the user); the certificate files'
    contents are checked by :func:`check_tls_files_of_args`."""
    if ns.mqtt_client_id is not None and not ns.mqtt_client_id.strip():  # as the agent's broker.client_id
        raise UserError("--mqtt-client-id: empty: give an id (or leave the option out for the default)")
    if ns.broker is None:
        for dest in _BROKER_ONLY_OPTIONS:
            if getattr(ns, dest) not in (None, False):
                raise UserError(f"{_flag(dest)} needs --broker (the embedded broker takes no credentials and no TLS)")
        return None
    if ns.mqtt_username is not None and not ns.mqtt_username.strip():  # an unset shell variable: "$USER"
        raise UserError("--mqtt-username: empty: give a user name (or leave the option out to connect anonymously)")
    password: str | None = None
    if ns.mqtt_password_file is not None:
        if (why := file_reason(ns.mqtt_password_file, regular=False)) is not None:
            raise UserError(f"--mqtt-password-file {ns.mqtt_password_file}: {why}")
        try:
            lines = Path(ns.mqtt_password_file).read_text(encoding="utf-8-sig").splitlines()
        except OSError as exc:
            raise UserError(
                f"--mqtt-password-file {ns.mqtt_password_file}: cannot read: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError:
            raise UserError(f"--mqtt-password-file {ns.mqtt_password_file}: not a UTF-8 text file") from None
        password = lines[0].strip() if lines else ""
        if not password:  # as the agent's broker.password_file: an empty password is a wrong file
            raise UserError(f"--mqtt-password-file {ns.mqtt_password_file}: the first line (the password) is empty")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    if password is not None and ns.mqtt_username is None:  # named here, not as a problem of --broker
        source = (
            f"--mqtt-password-file {ns.mqtt_password_file}:" if ns.mqtt_password_file else f"{PASSWORD_ENV} is set:"
        )
        raise UserError(f"{source} a password needs a user name: give --mqtt-username (or leave the password out)")
    for opt in ("mqtt_ca_file", "mqtt_cert_file", "mqtt_key_file"):
        value = getattr(ns, opt)
        if value is not None and (why := file_reason(value)) is not None:
            raise UserError(f"{_flag(opt)} {value}: {why}")
    if ns.mqtt_key_file is not None and ns.mqtt_cert_file is None:
        raise UserError("--mqtt-key-file needs --mqtt-cert-file (the client certificate it goes with)")
    for opt in ("mqtt_ca_file", "mqtt_cert_file"):  # as the agent's broker.tls_ca_file and tls_cert_file
        if getattr(ns, opt) is not None and not _url_asks_for_tls(ns.broker):
            raise UserError(
                f"{_flag(opt)} needs an mqtts:// broker URL (TLS, port 8883 by default): --broker {ns.broker} is "
                "plain MQTT"
            )
    kw: dict[str, Any] = {
        "ca_file": ns.mqtt_ca_file,
        "cert_file": ns.mqtt_cert_file,
        "key_file": ns.mqtt_key_file,
        "tls_insecure": ns.mqtt_tls_insecure,
        "client_id": ns.mqtt_client_id,
    }
    if ns.mqtt_username is not None:
        kw["username"] = ns.mqtt_username
    if password is not None:
        kw["password"] = password
    kw.update(overrides)
    try:
        if kw["tls_insecure"] and not MqttOptions.from_url(ns.broker, **{**kw, "tls_insecure": False}).use_tls:
            raise UserError("--mqtt-tls-insecure needs TLS (--broker mqtts://...): it skips TLS's host name check")
        return MqttOptions.from_url(ns.broker, **kw)
    except ValueError as exc:
        raise UserError(f"--broker {ns.broker}: {exc}") from None


def _url_asks_for_tls(url: str) -> bool:
    """Whether the broker URL itself asks for TLS (``mqtts://``); a URL that is not one is left to
    :meth:`MqttOptions.from_url`'s error."""
    try:
        return MqttOptions.from_url(url).use_tls
    except ValueError:
        return True


def check_tls_files_of_args(options: MqttOptions) -> None:
    """Read the certificate files of options made by :func:`mqtt_options_from_args` now, before a
    run: one that cannot be used is an ``agent.commands.common.UserError`` naming its option
    (``--mqtt-ca-file FILE: not a PEM certificate (...)``)."""
    try:
        options.ssl_context()
    except TlsFileError as exc:
        raise UserError(f"{_flag('mqtt_' + exc.field)} {exc.path}: {exc.why}") from None
