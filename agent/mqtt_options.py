"""How to reach the MQTT broker: :class:`MqttOptions` (host, port, credentials, TLS, client id,
timeouts and backoff), read from a broker URL (:meth:`MqttOptions.from_url`), and the client's TLS
context (:meth:`MqttOptions.ssl_context`), which names a certificate or key file it cannot use in a
:class:`TlsFileError`. Plain data and file reads, no network: :class:`agent.bus.Bus` connects with
these options; ``agent.mqtt_args`` makes them from a command's ``--broker`` and ``--mqtt-*`` options.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from agent.config import broker_url_problem, url_host

__all__ = ["MqttOptions", "TlsFileError"]


#: What :class:`TlsFileError` calls each certificate file of :class:`MqttOptions`.
_TLS_FILE_LABELS = {"ca_file": "CA file", "cert_file": "client certificate file", "key_file": "client key file"}


class TlsFileError(OSError):
    """A certificate or key file of :class:`MqttOptions` that cannot be used (unreadable, not PEM, a
    key that does not match the certificate). ``field``: ``ca_file``, ``cert_file`` or ``key_file``;
    ``path``: the file; ``why``: what is wrong with it. ``str()``: one line naming both. An ``OSError``,
    as the ``ssl.SSLError`` it replaces."""

    def __init__(self, field: str, path: str, why: str) -> None:
        super().__init__(f"TLS {_TLS_FILE_LABELS.get(field, field)} {path}: {why}")
        self.field = field
        self.path = path
        self.why = why


_SSL_SOURCE_LINE = re.compile(r"\s*\(_ssl\.c:\d+\)$")


def _without_userinfo(url: str) -> str:
    """``url`` without the user name and password it may hold (``mqtt://user:pw@host`` is
    ``mqtt://host``), to check and to name in messages; ``url`` itself when it has none or is no URL."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return url
    return url.replace(netloc, netloc.rpartition("@")[2], 1) if "@" in netloc else url


def _tls_why(exc: OSError, what: str) -> str:
    """``what`` is wrong with a file, with OpenSSL's reason; or that it cannot be read."""
    if isinstance(exc, ssl.SSLError):
        return f"{what} ({_SSL_SOURCE_LINE.sub('', str(exc))})"
    return f"cannot read it ({exc.strerror or exc})"


def _cert_chain_error(cert_file: str, key_file: str | None, exc: OSError) -> TlsFileError:
    """Which of the client certificate and key files made ``load_cert_chain`` fail, and why."""
    if not isinstance(exc, ssl.SSLError):  # a file that cannot be read: OpenSSL does not say which
        for field_name, path in (("cert_file", cert_file), ("key_file", key_file)):
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as read_exc:
                return TlsFileError(field_name, path, _tls_why(read_exc, ""))
        return TlsFileError("cert_file", cert_file, _tls_why(exc, ""))
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cafile=cert_file)  # does the file hold a certificate at all?
    except ssl.SSLError:
        return TlsFileError("cert_file", cert_file, _tls_why(exc, "not a PEM certificate"))
    except OSError as read_exc:
        return TlsFileError("cert_file", cert_file, _tls_why(read_exc, ""))
    if key_file is None:
        return TlsFileError(
            "cert_file", cert_file, _tls_why(exc, "holds no private key for the certificate (a key file is needed)")
        )
    if exc.reason == "KEY_VALUES_MISMATCH":
        return TlsFileError("key_file", key_file, _tls_why(exc, f"does not match the certificate {cert_file}"))
    return TlsFileError("key_file", key_file, _tls_why(exc, "not a PEM private key"))


@dataclass(frozen=True)
class MqttOptions:
    """How to reach the broker. TLS is on when ``tls`` is set or any certificate file is given;
    ``tls_insecure`` skips the host name check only (the certificate chain is still verified)."""

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_insecure: bool = False
    client_id: str | None = None
    clean_session: bool = True
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    max_inflight: int = 100
    max_queued_incoming: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be within 1..65535, got {self.port}")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a username")
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("a client key file needs a client certificate file")
        if self.tls_insecure and not self.use_tls:
            raise ValueError("tls_insecure only makes sense with TLS")
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            raise ValueError("need 0 < reconnect_min_s <= reconnect_max_s")

    @property
    def use_tls(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None

    @property
    def url(self) -> str:
        """``mqtt[s]://user@host:port`` (never the password), for logs."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host.replace('%', '%25')}]" if ":" in self.host else self.host  # IPv6, its zone (RFC 6874)
        return f"{'mqtts' if self.use_tls else 'mqtt'}://{user}{host}:{self.port}"

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> MqttOptions:
        """From ``mqtt://[user[:password]@]host[:port]`` or ``mqtts://...`` (TLS, default port 8883;
        1883 without TLS). Keyword arguments override what the URL says. The URL is held to the rule of
        the agent's ``broker.url`` and the commands' ``--broker`` (``agent.config.broker_url_problem``:
        those two schemes only, a host, a port within 1..65535, no path, query or fragment), except that
        a user name and password may be in it; a URL that breaks it is a ValueError in the same words.
        TLS is what the scheme says: a ``tls`` override that contradicts it, or a CA or client
        certificate file (``ca_file``, ``cert_file``) with ``mqtt://``, is a ValueError (TLS at the plain
        port 1883, whose broker does not speak it, or plain MQTT at the TLS port)."""
        if (problem := broker_url_problem(_without_userinfo(url), credentials="the URL")) is not None:
            raise ValueError(problem)  # the words of the configuration and --broker; never the password
        parts = urlsplit(url)
        tls = parts.scheme == "mqtts"
        port = parts.port or (8883 if tls else 1883)  # a port of 0 is refused above: it is not "the default"
        kw: dict[str, Any] = {"host": url_host(parts.hostname), "port": port, "tls": tls}
        if parts.username:
            kw["username"] = unquote(parts.username)
        if parts.password:
            kw["password"] = unquote(parts.password)
        if "tls" in overrides and bool(overrides["tls"]) != tls:
            raise ValueError(
                f"broker URL {_without_userinfo(url)!r}: tls={overrides['tls']!r} contradicts the URL: TLS is "
                "mqtts:// (port 8883 by default), plain MQTT is mqtt:// (port 1883 by default)"
            )
        kw.update(overrides)
        if not tls and (kw.get("ca_file") is not None or kw.get("cert_file") is not None):
            raise ValueError(
                f"broker URL {_without_userinfo(url)!r} is plain MQTT: a CA or client certificate file needs an "
                "mqtts:// URL (TLS, port 8883 by default)"
            )
        return cls(**kw)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (None without TLS). Reads the certificate files: one that cannot
        be used raises :class:`TlsFileError` naming it and what is wrong."""
        if not self.use_tls:
            return None
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        except OSError as exc:  # ssl.SSLError included
            if self.ca_file is None:
                raise
            raise TlsFileError("ca_file", self.ca_file, _tls_why(exc, "not a PEM certificate")) from None
        if self.cert_file is not None:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except OSError as exc:
                raise _cert_chain_error(self.cert_file, self.key_file, exc) from None
        if self.tls_insecure:
            ctx.check_hostname = False
        return ctx
