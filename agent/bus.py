"""The MQTT client used by the agent and the simulator. The only module that imports aiomqtt.

:class:`Bus` keeps one connection alive: an outer loop connects (username/password, TLS), re-issues
every subscription on every connect, hands incoming messages to the caller, and after a lost
connection or a refused one waits a randomized exponential backoff (``reconnect_min_s`` doubling to
``reconnect_max_s``, times a random factor in [0.5, 1)) before trying again. A broker that closes the
connection before it answers CONNECT (over TLS: it refused the handshake, as one that requires a client
certificate refuses a client without one) ends the attempt at once (aiomqtt alone waits out
``connect_timeout_s``), and the log and ``BusStats.last_error`` say why. The caller never sees
``aiomqtt.MqttError``: it iterates :meth:`Bus.messages` (or passes ``on_message``) and publishes with
:meth:`Bus.publish` / :meth:`Bus.send`, which raise :class:`BusNotConnected` while the link is down,
and as soon as it goes down under a QoS 1 publish waiting for its PUBACK (aiomqtt would wait out its
timeout for an answer that cannot come on that connection), so that the caller decides (telemetry:
drop, commands and acks: keep and send again once connected)::

    options = MqttOptions.from_url("mqtts://broker:8883", username="r0", password=..., ca_file="ca.crt")
    async with Bus(options, subscriptions=[topics.rack_cmd("r0")], will=None) as bus:
        await bus.wait_connected(10)
        await bus.send(codec.outgoing(batch))
        async for m in bus.messages():           # survives reconnects
            msg = codec.decode(m.topic, m.payload)

How to reach the broker (:class:`MqttOptions`, :class:`TlsFileError`) lives in ``agent.mqtt_options``
and is re-exported here; the command-line options that make it (``--broker``, ``--mqtt-*``) in
``agent.mqtt_args``.

A last will (:class:`LastWill`, or a function returning one, called at every connect so its
timestamp is fresh) is published by the broker only when the connection is lost *uncleanly*; a
clean :meth:`Bus.close` sends DISCONNECT and the broker discards the will, so a service publishes
its own "offline" status before closing. A close that comes while the bus connects lets that attempt
end first (at most ``connect_timeout_s`` more): cancelled, it left a connection the broker had taken
without a DISCONNECT, and the broker published the will when the process ended. A connection made
then is handed to ``on_connect`` with :attr:`Bus.closing` True (the owner says goodbye, not hello:
the agent publishes its "offline" status there) and closed with DISCONNECT, with no subscription.

Two clients with one client id take the session from each other: the broker closes the older
connection when the newer one connects (MQTT 3.1.1 gives no reason; mosquitto just closes the
socket), the older reconnects and closes the newer, and so on. A connection the broker closes
within :data:`SHORT_LIVED_S` of its start, followed by a reconnect that succeeds at once (the broker
is up: no restart), is such a take-over (``BusStats.takeovers``); :meth:`Bus.contested` says so
once three came within ten minutes, and from then on the bus does not reset its backoff after a
short-lived connection, so a fight slows from two to four reconnects a second to one every
``reconnect_max_s / 2`` to ``reconnect_max_s`` (the random factor).
:meth:`Bus.reconnect_with` connects again with other options (another client id); like a close, it lets an
attempt to connect in progress end first, and a connection made then (with the old options) ends at once
with DISCONNECT, with no subscription and no ``on_connect`` (cancelled, it left the broker the will).

A message on a topic that none of the bus's subscriptions matches is dropped and counted
(``BusStats.unsubscribed``): a broker must not send one, but amqtt 0.12 (the embedded fallback broker)
sends every client, at every connect, the retained messages of every other client's subscriptions
(the simulator got the agent's retained status and counted it a bad command).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.client import MQTT_LOG_ERR
from paho.mqtt.reasoncodes import ReasonCode

from agent.aio import cancel_and_wait, cancellation_kept, wait_event
from agent.mqtt_options import MqttOptions, TlsFileError
from agent.wire import Outgoing

__all__ = [
    "Bus",
    "BusConnectError",
    "BusError",
    "BusNotConnected",
    "BusPubackTimeout",
    "BusStats",
    "Incoming",
    "LastWill",
    "MqttOptions",
    "TlsFileError",
    "backoff_delay_s",
    "check_connection",
]

log = logging.getLogger("racktwin.bus")
#: aiomqtt's and paho's log (paho's "Sending CONNECT" ... at debug level, its errors at error level)
_MQTT_LOG = logging.getLogger("racktwin.bus.mqtt")
#: paho's log while a connection waits for the broker's CONNACK (:func:`_closed_before_connack`)
_CONNECTING_LOG = logging.getLogger("racktwin.bus.mqtt.connect")
#: paho's error lines when reading the socket fails. Before the CONNACK, the bus says the same in its
#: own line for the attempt ("cannot connect: ... closed the connection before answering MQTT
#: CONNECT: <paho's reason>"), so there they are debug lines.
_PAHO_SOCKET_ERRORS = ("failed to receive on socket", "timeout on socket")

_AIOMQTT_TIMEOUT = "Operation timed out"  # the MqttError aiomqtt 2.x raises when its wait times out

#: wall seconds: a connection the broker closes sooner than this after its start, followed by a
#: reconnect that succeeds at once, counts as a session take-over (another client with our id)
SHORT_LIVED_S = 15.0
_TAKEOVERS_CONTESTED = 3  # take-overs within _TAKEOVER_WINDOW_S that make the client id contested
_TAKEOVER_WINDOW_S = 600.0
#: wall seconds :meth:`Bus.close` waits for an attempt to connect in progress beyond ``connect_timeout_s``
_CLOSE_CONNECTING_GRACE_S = 1.0
_TOPIC_CACHE_MAX = 10_000  # topics whose match against the subscriptions is remembered (a site has hundreds)


class BusError(Exception):
    """A publish or subscribe that could not be done."""


class BusNotConnected(BusError):
    """The bus is (momentarily) not connected; the message was not sent."""


class BusPubackTimeout(BusError):
    """The broker did not acknowledge a QoS 1 publish in time. The message is in flight on this
    connection (the broker may well have it): publishing it again now would only add a copy. It is
    not sent again after a reconnect (each connection is a new client with nothing in flight): a
    caller that needs it there sends it again then, as the publisher does with its open commands."""


class BusConnectError(BusError):
    """The broker could not be reached or refused the connection (bad credentials, not authorized)."""


@dataclass(frozen=True)
class LastWill:
    """Published by the broker for us when our connection dies uncleanly (retained by default)."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(frozen=True, slots=True)
class Incoming:
    """A received message: topic, raw payload, retain flag (a retained message replayed on subscribe)."""

    topic: str
    payload: bytes
    retain: bool
    qos: int


@dataclass
class BusStats:
    connects: int = 0
    disconnects: int = 0
    failed_connects: int = 0
    received: int = 0
    dropped: int = 0  # incoming messages dropped because the consumer's queue was full
    published: int = 0
    publish_errors: int = 0
    puback_timeouts: int = 0  # QoS 1 publishes the broker did not acknowledge in time (also in publish_errors)
    unexpected_errors: int = 0  # errors other than MQTT ones on the connection (logged with a traceback)
    takeovers: int = 0  # connections closed by the broker soon after their start (another client, same id)
    unsubscribed: int = 0  # messages on topics none of our subscriptions match (a broker's misdelivery): dropped
    last_error: str | None = None


def backoff_delay_s(attempt: int, min_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Randomized exponential backoff: ``min(max_s, min_s * 2**attempt) * U[0.5, 1)``."""
    base = min(max_s, min_s * (2.0 ** min(attempt, 60)))
    return base * (0.5 + 0.5 * (rng or random).random())


OnConnect = Callable[["Bus"], Awaitable[None]]
OnMessage = Callable[[Incoming], None]


def _client(
    options: MqttOptions, will: LastWill | None, queue_type: Any = None, tls_context: ssl.SSLContext | None = None
) -> aiomqtt.Client:
    client = aiomqtt.Client(
        options.host,
        options.port,
        username=options.username,
        password=options.password,
        identifier=options.client_id,
        clean_session=options.clean_session,
        keepalive=options.keepalive_s,
        timeout=options.connect_timeout_s,
        tls_context=tls_context if tls_context is not None else options.ssl_context(),
        will=None if will is None else aiomqtt.Will(will.topic, will.payload, will.qos, will.retain),
        max_inflight_messages=options.max_inflight,
        max_queued_incoming_messages=options.max_queued_incoming,
        queue_type=queue_type,
        logger=_MQTT_LOG,
    )
    # aiomqtt warns above 10 concurrent publishes; callers may keep up to max_inflight in flight
    client.pending_calls_threshold = max(10, 4 * options.max_inflight)
    return client


async def _unless_disconnected(client: aiomqtt.Client, aw: Awaitable[Any]) -> Any:
    """Await ``aw`` (a subscribe, the ``on_connect`` callback) unless the connection ends first:
    aiomqtt's calls would wait out their timeout (``connect_timeout_s``) for an answer that cannot come
    (a session taken over while subscribing stalled the bus for 10 s)."""
    ended = getattr(client, "_disconnected", None)
    if not isinstance(ended, asyncio.Future):
        return await aw
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise _ConnectionEnded("the broker closed the connection")


class _ConnectionEnded(aiomqtt.MqttError):
    """:func:`_unless_disconnected`: the connection ended before the awaited call did."""


def _mute_disconnect_error(client: aiomqtt.Client) -> None:
    """aiomqtt keeps the error of a connection the broker closes while the client connects or
    subscribes (a session take-over) in a future nobody awaits (it replaces the one of ``__init__``
    after connecting), and asyncio logs "Future exception was never retrieved" with a traceback when
    it is collected; the bus logs the loss itself. Called after creating the client and after
    connecting."""
    fut = getattr(client, "_disconnected", None)
    if isinstance(fut, asyncio.Future):
        fut.add_done_callback(lambda f: None if f.cancelled() else f.exception())


def _forwarding_queue(deliver: Callable[[aiomqtt.Message], None]) -> type[asyncio.Queue[aiomqtt.Message]]:
    """An aiomqtt ``queue_type`` that hands each message straight to ``deliver`` (no per-message
    task as aiomqtt's own iterator creates). ``client.messages`` then only waits for a disconnect."""

    class _Forward(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            deliver(item)

    return _Forward


class Bus:
    """One resilient MQTT connection (see the module docstring). Use as ``async with Bus(...)``."""

    def __init__(
        self,
        options: MqttOptions,
        *,
        subscriptions: Iterable[str | tuple[str, int]] = (),
        will: LastWill | Callable[[], LastWill] | None = None,
        on_connect: OnConnect | None = None,
        on_message: OnMessage | None = None,
        name: str = "bus",
    ) -> None:
        self.options = options
        self.name = name
        self.stats = BusStats()
        self._subs: dict[str, int] = {}
        self._topic_wanted: dict[str, bool] = {}  # topic -> whether a subscription matches it (cleared on change)
        for s in subscriptions:
            topic, qos = (s, 1) if isinstance(s, str) else s
            self._subs[topic] = qos
        self._will = will
        self._on_connect = on_connect
        self._on_message = on_message
        self._tls_context = options.ssl_context()  # read certificate files now: a bad path fails here
        self._queue: asyncio.Queue[Incoming | None] = asyncio.Queue(maxsize=options.max_queued_incoming)
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._leaving = False  # the connection loop ends after its current attempt (close, reconnect_with)
        self._connecting = False  # an attempt to connect is in progress (its CONNECT may have been sent)
        self._rng = random.Random()
        self._connected_at = -math.inf  # time.monotonic() when the current connection was made
        self._short_lived = False  # the last connection was closed soon after its start
        self._takeover_walls: deque[float] = deque(maxlen=_TAKEOVERS_CONTESTED)
        self._contested_logged = False

    # ---- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Bus:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start the connection loop in the background (``async with`` does this)."""
        if self._task is None:
            self._closing = self._leaving = False
            self._task = asyncio.create_task(self._run(), name=f"{self.name}-connection")

    async def close(self) -> None:
        """Disconnect cleanly (the broker drops our will) and stop reconnecting. An attempt to connect in
        progress is let end first, for at most ``connect_timeout_s`` plus a second (its own bound): a
        connection it makes goes to ``on_connect`` with :attr:`closing` True, then ends with DISCONNECT."""
        self._closing = True
        try:
            await self._end_run("closing")
        finally:
            task, self._task = self._task, None
            if task is not None:
                await cancel_and_wait(task)
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)  # ends messages()

    async def reconnect_with(self, options: MqttOptions) -> None:
        """Disconnect cleanly (the broker drops the will) and connect again with ``options`` (e.g.
        another client id); subscriptions, will and callbacks stay. An attempt to connect in progress is
        let end first, as in :meth:`close`: a connection it makes (with the old options) ends with
        DISCONNECT at once, with no subscription and no ``on_connect`` (the new connection's says hello)."""
        running = self._task is not None
        await self._end_run("switching to other options")  # cancelled meanwhile: the loop ends by itself (close waits)
        self.options = options
        self._takeover_walls.clear()
        self._short_lived = False
        self._contested_logged = False
        if running and not self._closing:  # a close() while the attempt ended: no new connection
            self._leaving = False
            self._task = asyncio.create_task(self._run(), name=f"{self.name}-connection")

    async def _end_run(self, why: str) -> None:
        """End the connection loop: a connection ends with DISCONNECT (the broker drops the will). An attempt
        to connect in progress is let end first, for at most ``connect_timeout_s`` plus a second (its own
        bound): cancelled, it left a connection the broker had taken without a DISCONNECT, and the broker
        published the will (at once when the process ended, else a keep-alive later). ``why`` is for the log."""
        task = self._task
        if task is None:
            return
        self._leaving = True  # a connection made now ends at once, and the loop after it
        if self._connecting and not task.done():
            await asyncio.wait({task}, timeout=self.options.connect_timeout_s + _CLOSE_CONNECTING_GRACE_S)
            if not task.done():
                log.warning(
                    "%s: the connection to %s was still being made when %s: abandoned (the broker may publish "
                    "the will)",
                    self.name,
                    self.options.url,
                    why,
                )
        await cancel_and_wait(task)
        if self._task is task:
            self._task = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` was called: ``on_connect`` of a connection made as the bus closes (it is
        closed at once) finds it True."""
        return self._closing

    def contested(self) -> str | None:
        """Why the client id seems to be in use by another client (see the module docstring), or
        None: three take-overs within ten minutes, and no connection since has lasted
        :data:`SHORT_LIVED_S`."""
        walls = self._takeover_walls
        if len(walls) < _TAKEOVERS_CONTESTED or time.monotonic() - walls[0] > _TAKEOVER_WINDOW_S:
            return None
        if self.connected and time.monotonic() - self._connected_at >= SHORT_LIVED_S:
            return None
        return (
            f"another client uses client id {self.options.client_id!r}: in {walls[-1] - walls[0]:.1f} s the broker "
            f"closed {len(walls)} connections of this client within {SHORT_LIVED_S:g} s of their start and let the "
            "next one in at once (a client id's session goes to whichever client connected last)"
        )

    def _note_connected(self) -> None:
        """A connection is made: after one the broker closed soon after its start, a take-over."""
        self._connected_at = time.monotonic()
        if not self._short_lived:
            return
        self._short_lived = False
        self.stats.takeovers += 1
        self._takeover_walls.append(self._connected_at)
        why = self.contested()
        if why is not None and not self._contested_logged:
            self._contested_logged = True
            log.error("%s: %s", self.name, why)

    def _note_ended(self, connected: bool) -> bool:
        """The connection attempt ended; whether the backoff starts again from its shortest delay
        (after a connection, unless it was short-lived while the client id is contested). A connection
        that lasted :data:`SHORT_LIVED_S` ends a fight: the take-overs before it are forgotten, so that
        :meth:`contested` does not say so again while the bus is disconnected (a broker restart)."""
        if not connected:
            self._short_lived = False  # the broker is away: not a take-over
            return False
        lived = time.monotonic() - self._connected_at
        self._short_lived = lived < SHORT_LIVED_S and not self._leaving
        if self._short_lived:
            return self.contested() is None  # contested: the backoff grows, the fight slows down
        self._takeover_walls.clear()
        if self._contested_logged:
            log.info("%s: connection to %s lasted %.0f s: no take-over since", self.name, self.options.url, lived)
            self._contested_logged = False
        return True

    async def wait_connected(self, timeout_s: float | None = None) -> None:
        """Wait until connected and subscribed; :class:`BusConnectError` after ``timeout_s``."""
        if not await wait_event(self._connected, timeout_s):
            raise BusConnectError(
                f"{self.name}: not connected to {self.options.url} after {timeout_s} s"
                + (f" (last error: {self.stats.last_error})" if self.stats.last_error else "")
            ) from None

    async def _run(self) -> None:
        attempt = 0
        while not self._leaving:
            will = self._will() if callable(self._will) else self._will
            client = _client(self.options, will, _forwarding_queue(self._deliver), self._tls_context)
            _mute_disconnect_error(client)
            connected = False
            self._connecting = True
            try:
                async with _Connection(client, self.options):
                    self._connecting = False
                    _mute_disconnect_error(client)
                    connected = True
                    self._note_connected()
                    self._client = client
                    if self._leaving and not self._closing:  # made as reconnect_with switches (it waits)
                        # no subscription, no on_connect (the new connection says hello): DISCONNECT
                        self.stats.connects += 1
                        log.info("%s: connected to %s as the bus switches: disconnecting", self.name, self.options.url)
                    else:
                        await self._greet(client)
                    if not self._leaving:
                        async for _ in client.messages:  # messages go to _deliver; this waits for a disconnect
                            pass
            except aiomqtt.MqttError as exc:
                self.stats.last_error = str(exc)
                if connected:
                    self.stats.disconnects += 1
                    log.warning("%s: connection to %s lost: %s", self.name, self.options.url, exc)
                else:
                    self.stats.failed_connects += 1
                    refused = isinstance(exc, (MqttConnectError, _ClosedBeforeConnack))  # not a broker away
                    level = logging.ERROR if refused else logging.WARNING
                    if isinstance(exc, _ClosedBeforeConnack):  # its message names the URL already
                        log.log(level, "%s: cannot connect: %s", self.name, exc)
                    else:
                        log.log(level, "%s: cannot connect to %s: %s", self.name, self.options.url, exc)
            except Exception as exc:  # a defect in the client library or here: never the end of the bus
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self.stats.unexpected_errors += 1
                if connected:
                    self.stats.disconnects += 1
                else:
                    self.stats.failed_connects += 1
                log.exception("%s: unexpected error on the connection to %s; reconnecting", self.name, self.options.url)
            finally:
                self._connecting = False
                self._connected.clear()
                self._client = None
            if self._note_ended(connected):
                attempt = 0
            if self._leaving:
                break
            delay = backoff_delay_s(attempt, self.options.reconnect_min_s, self.options.reconnect_max_s, self._rng)
            attempt += 1
            log.info("%s: reconnecting in %.2f s", self.name, delay)
            await asyncio.sleep(delay)

    async def _greet(self, client: aiomqtt.Client) -> None:
        """A connection is made (``client``): subscribe (unless the bus closes), say so, call ``on_connect``."""
        if self._subs and not self._closing:  # one SUBSCRIBE: retained messages in the filters' order
            await _unless_disconnected(client, client.subscribe(list(self._subs.items())))
        self.stats.connects += 1
        self._connected.set()
        if self._closing:  # made as the bus closes (close() waits): on_connect, then DISCONNECT
            log.info("%s: connected to %s as the bus closes: disconnecting", self.name, self.options.url)
        else:
            log.info("%s: connected to %s (%d subscriptions)", self.name, self.options.url, len(self._subs))
        if self._on_connect is not None:
            try:
                await _unless_disconnected(client, self._on_connect(self))
            except aiomqtt.MqttError:
                raise  # the connection ended: the caller's
            except BusError as exc:
                log.warning("%s: on_connect could not publish: %s", self.name, exc)
            except Exception:
                log.exception("%s: on_connect failed", self.name)

    # ---- receiving ------------------------------------------------------------------------
    def _wanted(self, topic: aiomqtt.Topic) -> bool:
        """Whether one of our subscriptions matches ``topic`` (cached: a site has a few hundred topics)."""
        wanted = self._topic_wanted.get(topic.value)
        if wanted is None:
            if len(self._topic_wanted) >= _TOPIC_CACHE_MAX:
                self._topic_wanted.clear()
            wanted = any(topic.matches(f) for f in self._subs)
            self._topic_wanted[topic.value] = wanted
        return wanted

    def _deliver(self, m: aiomqtt.Message) -> None:
        if not self._wanted(m.topic):
            self.stats.unsubscribed += 1
            n = self.stats.unsubscribed
            if n in (1, 10, 100, 1000) or n % 10_000 == 0:
                log.info(  # not a warning: amqtt, the embedded fallback broker, does it at every connect
                    "%s: %d message(s) on topics we did not subscribe to dropped (the broker sent them), last on %r",
                    self.name,
                    n,
                    m.topic.value,
                )
            return
        payload = m.payload
        if not isinstance(payload, bytes):
            payload = bytes(payload) if isinstance(payload, bytearray) else str(payload).encode()
        item = Incoming(m.topic.value, payload, bool(m.retain), int(m.qos))
        self.stats.received += 1
        if self._on_message is not None:
            try:
                self._on_message(item)
            except Exception:
                log.exception("%s: on_message failed for a message on %r", self.name, item.topic)
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.stats.dropped += 1
            if self.stats.dropped in (1, 10, 100, 1000) or self.stats.dropped % 10_000 == 0:
                log.warning("%s: consumer too slow, %d incoming messages dropped", self.name, self.stats.dropped)

    async def messages(self) -> AsyncIterator[Incoming]:
        """Every received message, across reconnects, until the bus is closed (or the caller stops)."""
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    def pending(self) -> int:
        """Messages received and not yet taken from :meth:`messages`."""
        return self._queue.qsize()

    # ---- subscribing and publishing -------------------------------------------------------
    async def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe now (if connected) and on every later connect."""
        self._subs[topic_filter] = qos
        self._topic_wanted.clear()
        client = self._client
        if client is not None and self.connected:
            try:
                await client.subscribe(topic_filter, qos)
            except aiomqtt.MqttError as exc:
                log.warning("%s: subscribe %r failed (will retry on reconnect): %s", self.name, topic_filter, exc)

    async def unsubscribe(self, topic_filter: str) -> None:
        self._subs.pop(topic_filter, None)
        self._topic_wanted.clear()
        client = self._client
        if client is not None and self.connected:
            with contextlib.suppress(aiomqtt.MqttError):
                await client.unsubscribe(topic_filter)

    async def publish(
        self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False, timeout_s: float | None = None
    ) -> None:
        """Publish; at QoS 1 returns once the broker has acknowledged. Raises :class:`BusNotConnected`
        when the link is down (also when it goes down under a QoS 1 publish waiting for its PUBACK),
        :class:`BusPubackTimeout` when the broker did not acknowledge within ``timeout_s`` (default
        ``connect_timeout_s``; the message stays in flight on this connection), and :class:`BusError`
        when the publish fails otherwise (nothing is queued)."""
        client = self._client
        if client is None or not self.connected:
            raise BusNotConnected(f"{self.name}: not connected to {self.options.url}")
        try:
            with cancellation_kept():  # aiomqtt waits for the PUBACK with asyncio.wait_for (agent.aio)
                # ... and for its timeout when the connection ends meanwhile: no PUBACK can come on it
                # (a simulator's answers held 10 s after a broker restart): not connected, at once. QoS 0
                # (telemetry) waits for no answer and keeps its fast path (no task per message).
                sending = client.publish(topic, payload, qos=qos, retain=retain, timeout=timeout_s)
                await (_unless_disconnected(client, sending) if qos > 0 else sending)
        except _ConnectionEnded as exc:
            self.stats.publish_errors += 1
            raise BusNotConnected(f"{self.name}: publish to {topic!r}: the connection ended before the PUBACK") from exc
        except aiomqtt.MqttError as exc:
            self.stats.publish_errors += 1
            if str(exc) == _AIOMQTT_TIMEOUT:
                self.stats.puback_timeouts += 1
                limit = self.options.connect_timeout_s if timeout_s is None else timeout_s
                raise BusPubackTimeout(f"{self.name}: publish to {topic!r}: no PUBACK within {limit:g} s") from exc
            raise BusError(f"{self.name}: publish to {topic!r} failed: {exc}") from exc
        self.stats.published += 1

    async def send(self, out: Outgoing, *, timeout_s: float | None = None) -> None:
        """Publish an encoded message with its protocol QoS and retain flag (``Codec.outgoing``)."""
        await self.publish(out.topic, out.payload, qos=out.qos, retain=out.retain, timeout_s=timeout_s)


def _closed_before_connack(client: aiomqtt.Client) -> asyncio.Future[str]:
    """A future set, with paho's last error line (or ""), when the connection of ``client`` ends before
    the broker answered CONNECT. aiomqtt 2.x ignores such an end (its ``_on_disconnect`` returns early
    while not connected) and waits out its timeout for a CONNACK that cannot come; paho reports it to
    its ``on_disconnect`` callback, which this wraps on the paho client aiomqtt keeps.

    That client is aiomqtt's private ``_client``: where it is missing (another aiomqtt), or lacks paho's
    callbacks, the future is never set and the caller's wait ends as before (aiomqtt's "Operation timed
    out" after ``connect_timeout_s``)."""
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[str] = loop.create_future()
    paho = getattr(client, "_client", None)
    if paho is None or not all(hasattr(paho, name) for name in ("on_connect", "on_disconnect", "on_log")):
        return closed  # never set: the old behaviour
    state = {"connack": False, "error": ""}
    then_connect, then_disconnect, then_log = paho.on_connect, paho.on_disconnect, paho.on_log
    then_logger = getattr(paho, "logger", None)
    if isinstance(then_logger, logging.Logger):  # paho's error line until the CONNACK is the bus's (on_log)
        paho.logger = _CONNECTING_LOG

    def on_log(_paho: Any, _userdata: Any, level: int, buf: str) -> None:
        if level == MQTT_LOG_ERR:  # e.g. "failed to receive on socket: [SSL: ...] ...": the part after the colon
            state["error"] = buf.partition(": ")[2] if buf.startswith("failed to ") else buf

    def on_connect(*args: Any) -> None:
        state["connack"] = True
        paho.on_log = then_log  # with on_log set paho formats every log line (one per message) for it
        if isinstance(then_logger, logging.Logger):  # a connection lost from now on: paho's reason is news
            paho.logger = then_logger
        then_connect(*args)

    def on_disconnect(*args: Any) -> None:
        # paho itself ends a connection whose CONNACK has not come within keepalive_s (its keepalive
        # check): the broker closed nothing, and aiomqtt's time-out says what happened
        gave_up = any(isinstance(a, ReasonCode) and a == "Keep alive timeout" for a in args)
        if not state["connack"] and not gave_up:
            error = str(state["error"])
            loop.call_soon_threadsafe(lambda: None if closed.done() else closed.set_result(error))
        then_disconnect(*args)

    paho.on_log, paho.on_connect, paho.on_disconnect = on_log, on_connect, on_disconnect
    return closed


class _SaidByTheBus(logging.Filter):
    """On :data:`_CONNECTING_LOG`: paho's socket error line (:data:`_PAHO_SOCKET_ERRORS`), which the
    bus's line for the attempt repeats, becomes a debug line (kept where debug lines are wanted);
    every other line passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and str(record.msg).startswith(_PAHO_SOCKET_ERRORS):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            return _CONNECTING_LOG.isEnabledFor(logging.DEBUG)
        return True


_CONNECTING_LOG.addFilter(_SaidByTheBus())


class _ClosedBeforeConnack(aiomqtt.MqttError):
    """:class:`_Connection`: the broker closed the connection before it answered CONNECT (the message
    says why, :func:`_closed_message`)."""


class _Connection(contextlib.AbstractAsyncContextManager[aiomqtt.Client]):
    """``async with _Connection(client, options)``: ``async with client``, except that a broker that
    closes the connection before it answers CONNECT ends the connect at once, with
    :class:`_ClosedBeforeConnack` saying why (over TLS, a refused handshake: with TLS 1.3 the client's
    side of the handshake completes before the broker checks the client certificate, so a broker that
    requires one refuses a client without one only with an alert read after CONNECT was sent), where
    aiomqtt would wait out ``connect_timeout_s`` and say "Operation timed out". Other failures are
    aiomqtt's, as with ``async with client``. Used by :class:`Bus` and :func:`check_connection`."""

    def __init__(self, client: aiomqtt.Client, options: MqttOptions) -> None:
        self._client = client
        self._options = options

    async def __aenter__(self) -> aiomqtt.Client:
        closed = _closed_before_connack(self._client)
        entering = asyncio.ensure_future(self._client.__aenter__())
        try:
            either: set[asyncio.Future[Any]] = {entering, closed}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not entering.done():
                await cancel_and_wait(entering)  # a throw-away client: its lock and futures are never used again
        failed = entering.cancelled() or entering.exception() is not None  # exception(): retrieved, not logged
        if failed and closed.done():  # the early close says more than aiomqtt's error
            raise _ClosedBeforeConnack(_closed_message(self._options, closed.result()))
        return entering.result()  # aiomqtt's error, or the connected client

    async def __aexit__(self, *exc: Any) -> None:
        await self._client.__aexit__(*exc)


def _closed_message(options: MqttOptions, error: str) -> str:
    why = f": {error}" if error else ""
    if not options.use_tls:
        return f"{options.url} closed the connection before answering MQTT CONNECT{why}"
    no_cert = options.cert_file is None
    if "SSL" in error or "alert" in error.lower():
        msg = f"{options.url} refused the TLS handshake (it closed the connection before answering MQTT CONNECT{why})"
        if no_cert and "CERTIFICATE_REQUIRED" in error.upper():
            return f"{msg}: the broker requires a client certificate and this client presents none"
        return msg + (": does the broker require a client certificate? this client presents none" if no_cert else "")
    msg = f"{options.url} closed the connection before answering MQTT CONNECT{why}"
    if no_cert:
        msg += " (over TLS, how a broker that requires a client certificate refuses a client that presents none)"
    return msg


async def check_connection(options: MqttOptions, timeout_s: float = 5.0) -> None:
    """Connect once and disconnect; :class:`BusConnectError` saying why when that fails. A broker that
    closes the connection before it answers CONNECT is reported as soon as it does (not after
    ``timeout_s`` as "no answer"): over TLS, a refused handshake. With TLS 1.3 the client's side of
    the handshake completes before the broker checks the client certificate, so a broker that
    requires one refuses a client without one only with an alert read after CONNECT was sent."""
    try:
        async with asyncio.timeout(timeout_s):
            async with _Connection(_client(options, None), options):
                return
    except _ClosedBeforeConnack as exc:
        raise BusConnectError(str(exc)) from None
    except TimeoutError:
        raise BusConnectError(f"no answer from {options.url} within {timeout_s} s") from None
    except MqttConnectError as exc:
        raise BusConnectError(f"{options.url} refused the connection: {exc}") from None
    except aiomqtt.MqttError as exc:
        raise BusConnectError(f"cannot connect to {options.url}: {exc}") from None
    except (OSError, ssl.SSLError) as exc:
        raise BusConnectError(f"cannot connect to {options.url}: {exc}") from None
