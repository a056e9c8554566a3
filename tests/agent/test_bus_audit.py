"""``agent.bus`` (and ``agent.mqtt_options``): what a changed line of a mutation audit did not make any
other test fail, held against a real mosquitto on a random loopback port.

The connection the client asks for (client id, clean session, keepalive, user name: mosquitto's
connection log says what it got), subscriptions at QoS 1 unless told otherwise, a subscription or an
unsubscription made while connected taking effect at once and across reconnects, a message the
broker sent for a topic none of the subscriptions matched no longer dropped once one does, a full
queue keeping the oldest messages and counting what it dropped, ``on_message`` taking every message
(nothing queued besides, an exception in it logged and survived), a last will made at every connect,
counters of what went and came, a QoS 1 publish the broker does not acknowledge raising
:class:`BusPubackTimeout`, :meth:`Bus.reconnect_with` connecting again with the new options, and the
checks :class:`MqttOptions` makes of its values."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import AsyncIterator
from typing import TypedDict

import pytest
from mqtt_testing import PubackDroppingProxy, until_sentinel, wait_for

from agent.broker import EmbeddedBroker
from agent.bus import Bus, BusNotConnected, BusPubackTimeout, Incoming, LastWill, MqttOptions

pytestmark = pytest.mark.agent

WAIT_S = 15.0  # a bound on every wait (a hang fails the test); nothing here asserts a duration


def fast(options: MqttOptions) -> MqttOptions:
    return dataclasses.replace(options, reconnect_min_s=0.05, reconnect_max_s=0.3)


async def test_the_connection_asks_for_the_client_id_session_keepalive_and_user_of_the_options(
    mosquitto: EmbeddedBroker,
) -> None:
    """mosquitto logs each CONNECT as ``as <client id> (p2, c<clean session>, k<keepalive>, u'<user>')``."""
    options = mosquitto.options(client_id="audit-cid", clean_session=False, keepalive_s=7, username="someone")
    async with Bus(options, name="audit") as bus:
        await bus.wait_connected(WAIT_S)
    assert "as audit-cid (p2, c0, k7, u'someone')" in mosquitto.log_text()


async def test_subscriptions_are_qos_1_unless_told_otherwise(mosquitto: EmbeddedBroker) -> None:
    """A QoS 1 publish reaches a subscriber at the lower of the two QoS: at 1 when the subscription is a
    bare filter, given at the start or with :meth:`Bus.subscribe` (``qos=1`` by default)."""
    async with (
        Bus(mosquitto.options(), subscriptions=["audit/start"], name="sub") as sub,
        Bus(mosquitto.options(), name="pub") as pub,
    ):
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        await sub.subscribe("audit/later")
        await pub.publish("audit/start", b"1", qos=1)
        await pub.publish("audit/later", b"2", qos=1)
        await pub.publish("audit/start", b"end", qos=1)
        got = await until_sentinel(sub, b"end")
        assert [(m.topic, m.qos) for m in got] == [("audit/start", 1), ("audit/later", 1)]
        assert sub.stats.connects == 1  # subscribed at once, not at a reconnect


async def test_an_unsubscribed_filter_gets_nothing_now_nor_after_a_reconnect(mosquitto: EmbeddedBroker) -> None:
    """After :meth:`Bus.unsubscribe` the broker sends nothing more on that filter (nothing for the bus to
    drop either), and a reconnect does not subscribe to it again."""
    async with (
        Bus(fast(mosquitto.options()), subscriptions=["audit/a", "audit/b"], name="sub") as sub,
        Bus(fast(mosquitto.options()), name="pub") as pub,
    ):
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        await sub.unsubscribe("audit/a")
        await pub.publish("audit/a", b"1", qos=1)
        await pub.publish("audit/b", b"end1", qos=1)
        assert await until_sentinel(sub, b"end1") == []
        assert sub.stats.unsubscribed == 0  # the broker was told, not just the bus

        await asyncio.to_thread(mosquitto.restart)
        await wait_for("both reconnects", lambda: sub.connected and pub.connected and sub.stats.connects == 2)
        await pub.publish("audit/a", b"2", qos=1)
        await pub.publish("audit/b", b"end2", qos=1)
        assert await until_sentinel(sub, b"end2") == []
        assert sub.stats.unsubscribed == 0


async def test_a_topic_dropped_as_unsubscribed_is_delivered_once_subscribed(mosquitto: EmbeddedBroker) -> None:
    """A persistent session keeps its subscriptions on the broker: a bus that takes it over without them
    gets messages it did not subscribe to, and drops and counts them. Once it subscribes to that topic
    (:meth:`Bus.subscribe`: "subscribe now"), the same topic's messages are its own."""
    session = mosquitto.options(client_id="audit-session", clean_session=False)
    async with Bus(session, subscriptions=["audit/x"], name="first") as first:
        await first.wait_connected(WAIT_S)
    async with Bus(session, name="second") as second, Bus(mosquitto.options(), name="pub") as pub:
        await second.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        await pub.publish("audit/x", b"stray", qos=1)
        await wait_for("the stray message", lambda: second.stats.unsubscribed == 1)
        assert second.pending() == 0
        await second.subscribe("audit/x")
        await second.subscribe("audit/end")
        await pub.publish("audit/x", b"mine", qos=1)
        await pub.publish("audit/end", b"end", qos=1)
        got = await until_sentinel(second, b"end")
    assert [m.payload for m in got] == [b"mine"] and second.stats.unsubscribed == 1


async def test_a_full_queue_keeps_the_oldest_messages_and_counts_those_it_drops(
    mosquitto: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """``max_queued_incoming`` messages wait for the consumer; the ones after them are dropped, counted
    (``BusStats.dropped``) and logged; publishes and receipts are counted too."""
    caplog.set_level(logging.WARNING, logger="racktwin.bus")
    options = dataclasses.replace(mosquitto.options(), max_queued_incoming=5)
    async with (
        Bus(options, subscriptions=["audit/q"], name="slow") as slow,
        Bus(mosquitto.options(), name="pub") as pub,
    ):
        await slow.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        for k in range(12):
            await pub.publish("audit/q", str(k).encode(), qos=1)
        assert pub.stats.published == 12
        await wait_for("12 messages received", lambda: slow.stats.received == 12)
        assert slow.stats.dropped == 7 and slow.pending() == 5
        kept = [m.payload async for m in _take(slow, 5)]
    assert kept == [b"0", b"1", b"2", b"3", b"4"]
    # logged at the 1st, 10th, 100th ... drop, not at each
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        "slow: consumer too slow, 1 incoming messages dropped"
    ]


async def _take(bus: Bus, n: int) -> AsyncIterator[Incoming]:
    """The next ``n`` messages of :meth:`Bus.messages`."""
    k = 0
    async for m in bus.messages():
        yield m
        k += 1
        if k == n:
            return


async def test_on_message_takes_every_message_and_survives_its_own_exception(
    mosquitto: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``on_message`` the messages go to it, not to :meth:`Bus.messages` as well; one that raises
    is logged and the next ones still come, on the same connection."""
    got: list[bytes] = []

    def on_message(m: Incoming) -> None:
        got.append(m.payload)
        if m.payload == b"bad":
            raise ValueError("a defect in the handler")

    async with (
        Bus(mosquitto.options(), subscriptions=["audit/m"], on_message=on_message, name="sub") as sub,
        Bus(mosquitto.options(), name="pub") as pub,
    ):
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        for payload in (b"1", b"bad", b"2"):
            await pub.publish("audit/m", payload, qos=1)
        await wait_for("three messages", lambda: len(got) == 3)
        assert got == [b"1", b"bad", b"2"] and sub.pending() == 0
        assert sub.stats.connects == 1 and sub.stats.disconnects == 0 and sub.stats.received == 3
    assert [r.exc_info is not None for r in caplog.records if "on_message failed" in r.getMessage()] == [True]


async def test_a_will_function_is_called_at_every_connect(mosquitto: EmbeddedBroker) -> None:
    """A will given as a function is made anew at every connect (its timestamp fresh)."""
    made: list[int] = []

    def will() -> LastWill:
        made.append(len(made))
        return LastWill("audit/will", f"offline {len(made)}".encode())

    async with Bus(fast(mosquitto.options()), will=will, name="willing") as bus:
        await bus.wait_connected(WAIT_S)
        await asyncio.to_thread(mosquitto.restart)
        await wait_for("the reconnect", lambda: bus.connected and bus.stats.connects == 2)
    assert len(made) == 2 + bus.stats.failed_connects  # one per attempt to connect


def test_a_last_will_is_retained_at_qos_1_by_default() -> None:
    will = LastWill("racktwin/v1/site1/agent/status", b"offline")
    assert (will.qos, will.retain) == (1, True)


async def test_a_publish_the_broker_does_not_acknowledge_raises_puback_timeout(mosquitto: EmbeddedBroker) -> None:
    async with PubackDroppingProxy(mosquitto.port) as proxy:
        options = dataclasses.replace(mosquitto.options(), port=proxy.port)
        async with Bus(options, name="unacked") as bus:
            await bus.wait_connected(WAIT_S)
            with pytest.raises(BusPubackTimeout, match=r"no PUBACK within 0\.2 s"):
                await bus.publish("audit/p", b"x", qos=1, timeout_s=0.2)
            assert (bus.stats.puback_timeouts, bus.stats.publish_errors, bus.stats.published) == (1, 1, 0)
            assert bus.connected


async def test_reconnect_with_connects_again_with_the_new_options(mosquitto: EmbeddedBroker) -> None:
    """:meth:`Bus.reconnect_with` (another client id): the bus connects again as the new id, with its
    subscriptions."""
    async with (
        Bus(mosquitto.options(client_id="audit-one"), subscriptions=["audit/r"], name="r") as bus,
        Bus(mosquitto.options(), name="pub") as pub,
    ):
        await bus.wait_connected(WAIT_S)
        await bus.reconnect_with(mosquitto.options(client_id="audit-two"))
        await wait_for("the second connection", lambda: bus.connected and bus.stats.connects == 2)
        assert bus.options.client_id == "audit-two"
        await pub.wait_connected(WAIT_S)
        await pub.publish("audit/r", b"after", qos=1)
        [m] = [m async for m in _take(bus, 1)]
    assert m.payload == b"after"
    assert "as audit-two (" in mosquitto.log_text()


# ---- MqttOptions: the values it refuses --------------------------------------------------------------


class MqttFields(TypedDict, total=False):
    """The ``MqttOptions`` fields the cases below set (values of the right type that cannot work)."""

    port: int
    password: str | None
    key_file: str | None
    reconnect_min_s: float
    reconnect_max_s: float


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"port": 0}, "port must be within 1..65535"),
        ({"port": 65536}, "port must be within 1..65535"),
        ({"password": "pw"}, "a password needs a username"),
        ({"key_file": "client.key"}, "a client key file needs a client certificate file"),
        ({"reconnect_min_s": 0.0}, "reconnect_min_s"),
        ({"reconnect_min_s": 2.0, "reconnect_max_s": 1.0}, "reconnect_min_s <= reconnect_max_s"),
    ],
)
def test_options_refuse_values_that_cannot_work(kwargs: MqttFields, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MqttOptions(**kwargs)


def test_options_take_one_port_and_equal_backoff_bounds() -> None:
    assert MqttOptions(port=1, reconnect_min_s=1.0, reconnect_max_s=1.0).port == 1
    assert MqttOptions(port=65535).port == 65535


def test_a_client_certificate_turns_tls_on_and_tls_insecure_still_verifies_the_chain() -> None:
    assert MqttOptions(cert_file="client.crt").use_tls
    assert MqttOptions(cert_file="client.crt").url == "mqtts://127.0.0.1:1883"
    ctx = MqttOptions(tls=True, tls_insecure=True).ssl_context()
    assert ctx is not None and not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    strict = MqttOptions(tls=True).ssl_context()
    assert strict is not None and strict.check_hostname and strict.verify_mode == ssl.CERT_REQUIRED


async def test_a_connection_that_lasts_ends_the_take_over_fight_for_good(
    mosquitto: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:meth:`Bus.contested`: "three take-overs within ten minutes, and no connection since has lasted
    SHORT_LIVED_S". Once the other client has gone and a connection has lasted, the fight is over:
    a broker restart afterwards (the bus not connected for a while) does not bring it back. It did:
    the take-overs were kept, and a bus between two connections said its client id was in use (the
    agent's readiness and the ``RacktwinClientIdInUse`` alert read it) for ten minutes after the fight."""
    monkeypatch.setattr("agent.bus.SHORT_LIVED_S", 2.0)
    options = dataclasses.replace(
        mosquitto.options(client_id="audit-fight", clean_session=False), reconnect_min_s=0.05, reconnect_max_s=0.8
    )
    a = Bus(options, name="a")
    b = Bus(options, name="b")
    async with a:
        await a.wait_connected(WAIT_S)
        async with b:
            await wait_for("a fight", lambda: a.contested() is not None)
        await wait_for("a connection of a alone", lambda: a.connected)
        await wait_for("a lasting connection", lambda: a.connected and a.contested() is None)
        await asyncio.to_thread(mosquitto.stop, keep_files=True)
        await wait_for("the lost connection", lambda: not a.connected)
        assert a.contested() is None
        await asyncio.to_thread(mosquitto.start)
        await wait_for("the reconnect", lambda: a.connected)
        assert a.contested() is None and a.stats.takeovers >= 3


async def test_an_on_connect_that_cannot_publish_is_a_warning_and_the_connection_stays(
    mosquitto: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """``on_connect`` raising a :class:`BusError` (a publish it could not make) is logged as a one-line
    warning (no traceback: not a defect), and the bus stays connected and subscribed."""

    async def on_connect(bus: Bus) -> None:
        raise BusNotConnected("the status could not go out")

    async with (
        Bus(mosquitto.options(), subscriptions=["audit/c"], on_connect=on_connect, name="sub") as sub,
        Bus(mosquitto.options(), name="pub") as pub,
    ):
        await sub.wait_connected(WAIT_S)
        await pub.wait_connected(WAIT_S)
        await pub.publish("audit/c", b"still here", qos=1)
        [m] = [m async for m in _take(sub, 1)]
        assert m.payload == b"still here" and sub.stats.connects == 1 and sub.stats.unexpected_errors == 0
    lines = [r for r in caplog.records if r.name == "racktwin.bus" and r.levelno >= logging.WARNING]
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in lines] == [
        (logging.WARNING, "sub: on_connect could not publish: the status could not go out", None)
    ]
