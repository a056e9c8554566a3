"""``MqttOptions.from_url`` takes the broker URLs the agent's ``broker.url`` and the commands'
``--broker`` take (docs/sim.md: "``mqtt://host:port`` or ``mqtts://host:port``, as the agent's
``broker.url`` (no other scheme, no bare ``host:port`` ... no path or query)"), refused in the same
words, and TLS is what the scheme says. It accepted ``tcp://`` and ``ssl://``, a bare ``host:port``,
a URL without a host (then 127.0.0.1), a path or query (ignored), and a ``tls`` override that
contradicted the scheme, all of which the front ends refuse.

The one difference, documented: a user name and password may be in the URL given to the library
(the front ends have options and settings for them); a refusal never repeats the password."""

from __future__ import annotations

import pytest
from mqtt_testing import TlsFiles

from agent.config import broker_url_problem
from agent.mqtt_options import MqttOptions

pytestmark = pytest.mark.agent


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("tcp://127.0.0.1:1883", "must start with mqtt:// or mqtts://"),  # was plain MQTT
        ("ssl://127.0.0.1:8883", "must start with mqtt:// or mqtts://"),  # was TLS
        ("http://x", "scheme"),
        ("127.0.0.1:1883", "must start with mqtt:// or mqtts://"),  # was read as mqtt://127.0.0.1:1883
        ("mqtt://", "no host"),  # was 127.0.0.1
        ("mqtt://:1883", "no host"),
        ("mqtt://broker:1883/racktwin", "path not allowed"),  # the path was dropped
        ("mqtt://broker:1883?keepalive=5", "query or fragment not allowed"),  # the query was dropped
        ("mqtt://broker:1883#x", "query or fragment not allowed"),
        ("mqtt://bad host:1883", "bad host 'bad host'"),
        ("mqtt://broker:0", "bad port"),
        ("mqtt://broker:65536", "bad port"),
        ("mqtt://[fe80::1%25]:1883", "no IPv6 zone"),
    ],
)
def test_a_url_the_front_ends_refuse_is_refused_in_their_words(url: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        MqttOptions.from_url(url)
    assert words in str(caught.value)
    # the very words the agent's configuration and --broker give for it
    assert str(caught.value) == broker_url_problem(url, credentials="--mqtt-username")


def test_a_refused_url_with_credentials_does_not_repeat_the_password() -> None:
    with pytest.raises(ValueError) as caught:
        MqttOptions.from_url("tcp://agent:s3cret@broker:1883")
    assert "s3cret" not in str(caught.value) and "tcp://broker:1883" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "tls"),
    [
        ("mqtt://broker", True),  # was TLS at the plain port 1883
        ("mqtt://broker:1883", True),
        ("mqtts://broker", False),  # was plain MQTT at the TLS port 8883
    ],
)
def test_a_tls_override_that_contradicts_the_scheme_is_refused(url: str, tls: bool) -> None:
    with pytest.raises(ValueError, match="contradicts the URL"):
        MqttOptions.from_url(url, tls=tls)


def test_a_tls_override_that_agrees_with_the_scheme_is_taken(tls_files: TlsFiles) -> None:
    assert MqttOptions.from_url("mqtts://broker", tls=True, ca_file=tls_files.ca_file).use_tls
    assert not MqttOptions.from_url("mqtt://broker", tls=False).use_tls
    with pytest.raises(ValueError, match="plain MQTT"):  # tls=True no longer lets a CA file through mqtt://
        MqttOptions.from_url("mqtt://broker", tls=True, ca_file=tls_files.ca_file)


@pytest.mark.parametrize(
    ("url", "host", "port", "tls"),
    [
        ("mqtt://broker", "broker", 1883, False),  # MQTT's registered ports: 1883 plain, 8883 TLS
        ("mqtts://broker.example", "broker.example", 8883, True),
        ("mqtt://10.0.0.5:1884", "10.0.0.5", 1884, False),
        ("mqtts://10.0.0.5:8884/", "10.0.0.5", 8884, True),  # a bare trailing slash, as broker.url takes
        ("mqtt://[::1]", "::1", 1883, False),
        ("mqtts://[2001:db8::5]:8883", "2001:db8::5", 8883, True),
        ("mqtt://[fe80::1%25eth0]:1883", "fe80::1%eth0", 1883, False),
        ("mqtt://broker_1.local:1883", "broker_1.local", 1883, False),
    ],
)
def test_the_urls_the_front_ends_take_are_taken(url: str, host: str, port: int, tls: bool) -> None:
    assert broker_url_problem(url, credentials="--mqtt-username") is None
    o = MqttOptions.from_url(url)
    assert (o.host, o.port, o.use_tls) == (host, port, tls)
    assert MqttOptions.from_url(o.url) == o  # the URL it writes for logs reads back as the same options


def test_credentials_may_be_in_the_url_given_to_the_library() -> None:
    o = MqttOptions.from_url("mqtts://agent:s%40cret@[::1]:8884")
    assert (o.host, o.port, o.username, o.password, o.use_tls) == ("::1", 8884, "agent", "s@cret", True)
    assert o.url == "mqtts://agent@[::1]:8884"  # never the password
