"""``racktwin agent`` stopped by SIGTERM or SIGINT at any moment of its run: as its event loop is set up,
while the service is made (its journal just opened), once it is online, and again as its event loop has
closed. Each is a clean stop with exit status 0 (README "Exit statuses", docs/agent.md "Running it"), the
journal closed and its lock released: before the service runs, without connecting; from then on with the
retained status ``offline`` / ``clean shutdown``.

The real command in a child process, against a real mosquitto; a driver (as the sim and demo signal
tests do) sends the process its signal at the moment under test from within, so no test waits on a
sleep.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from test_agent_journal_faults import agent_process, statuses, statuses_after_the_end
from test_agent_service import Observer, observing, write_config, write_site

from agent import wire
from agent.broker import EmbeddedBroker
from agent.journal import Journal
from twin.spec import load_site

pytestmark = pytest.mark.integration

#: ``racktwin agent --config ARGV[1]`` sending itself the signal named by $SIGNAL_UNDER_TEST at the moment
#: $MOMENT_UNDER_TEST names: ``starting`` as ``asyncio.run`` begins (the service not made yet); ``making`` as
#: the service, its journal opened (and locked), loads it; ``online`` once its online status is out;
#: ``closed`` that and again as ``asyncio.run`` has returned (the run's event loop closed, the exit status
#: not yet given); ``connecting`` as the broker's CONNACK comes, which is held (the agent still connecting)
#: until the stop closes the bus
_SIGNALLING_AGENT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import aiomqtt.client, agent.bus, agent.service, agent.status
    from agent.cli import main

    sig = signal.Signals[os.environ["SIGNAL_UNDER_TEST"]]
    moment = os.environ["MOMENT_UNDER_TEST"]
    asyncio_run = asyncio.run
    load_journal = agent.service.load_journal
    publish_online = agent.status.StatusPublisher.publish_online

    def send():
        os.kill(os.getpid(), sig)  # delivered, and its Python handler run, before the next line

    def signal_then_run(main, **kwargs):
        send()
        return asyncio_run(main, **kwargs)

    def signal_then_load(*args, **kwargs):
        send()
        return load_journal(*args, **kwargs)

    async def publish_online_then_signal(self, bus):
        await publish_online(self, bus)
        send()

    def run_then_signal(main, **kwargs):
        result = asyncio_run(main, **kwargs)
        send()
        return result

    on_connack = aiomqtt.client.Client._on_connect
    bus_close = agent.bus.Bus.close
    held = []

    def hold_connack_then_signal(self, *args, **kwargs):
        held.append(lambda: on_connack(self, *args, **kwargs))
        send()

    async def let_connack_in_then_close(self):
        while held:
            held.pop(0)()
        await bus_close(self)

    if moment == "starting":
        asyncio.run = signal_then_run
    elif moment == "making":
        agent.service.load_journal = signal_then_load
    elif moment == "connecting":
        aiomqtt.client.Client._on_connect = hold_connack_then_signal
        agent.bus.Bus.close = let_connack_in_then_close
    else:
        agent.status.StatusPublisher.publish_online = publish_online_then_signal
        if moment == "closed":
            asyncio.run = run_then_signal
    sys.exit(main(["agent", "--config", sys.argv[1]]))
    """
)


@pytest.mark.parametrize("moment", ["starting", "making"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
async def test_a_signal_before_the_agent_runs_stops_it_before_it_connects(
    mosquitto: EmbeddedBroker, tmp_path: Path, sig: str, moment: str
) -> None:
    """A signal as the event loop is set up or while the service is made is remembered: the service is not
    run (nothing connected or published), the journal is closed, exit status 0. It used to come before the
    event loop's handlers: SIGTERM killed the agent (exit status 143, the journal left open) and a Ctrl-C
    was exit status 130 ("interrupted"; while the service was made: after it connected, status
    ``cancelled``)."""
    write_site(tmp_path)
    cfg = write_config(tmp_path, mode="advisory")
    async with agent_process(
        mosquitto, cfg, code=_SIGNALLING_AGENT, SIGNAL_UNDER_TEST=sig, MOMENT_UNDER_TEST=moment
    ) as agent:
        assert await agent.wait(30) == 0, agent.stderr[-3000:]
    assert "Traceback" not in agent.stderr and "interrupted" not in agent.stderr, agent.stderr[-3000:]
    assert f"stopped ({sig}) before it started: nothing connected or published" in agent.stderr, agent.stderr
    assert "agent starting" not in agent.stderr, agent.stderr[-3000:]  # logged as the service runs
    assert ("journal opened" in agent.stderr) == (moment == "making"), agent.stderr[-3000:]
    Journal(tmp_path / "journal.sqlite", lock=True).close()  # free for the next agent


@pytest.mark.parametrize("moment", ["online", "closed"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
async def test_a_signal_while_the_agent_runs_and_after_its_event_loop_closed_is_a_clean_stop(
    mosquitto: EmbeddedBroker, tmp_path: Path, sig: str, moment: str
) -> None:
    """A signal while the service runs stops it cleanly; another after its event loop closed changes
    nothing: exit status 0, ``offline`` / ``clean shutdown``. The event loop's handlers were gone by then
    and asyncio had put SIGTERM's default action back: SIGTERM was exit status 143 and SIGINT 130
    ("interrupted"), after a clean stop."""
    site = load_site(write_site(tmp_path))
    cfg = write_config(tmp_path, mode="advisory")
    obs = Observer()
    async with (
        observing(mosquitto, site, obs) as watch,
        agent_process(mosquitto, cfg, code=_SIGNALLING_AGENT, SIGNAL_UNDER_TEST=sig, MOMENT_UNDER_TEST=moment) as agent,
    ):
        assert await agent.wait(30) == 0, agent.stderr[-3000:]
        got, end = await statuses_after_the_end(mosquitto, watch, obs, cfg)
    assert "Traceback" not in agent.stderr and "interrupted" not in agent.stderr, agent.stderr[-3000:]
    assert f"stopping ({sig}): the current cycle finishes" in agent.stderr, agent.stderr[-3000:]
    # "agent stopped" is logged once the journal is closed (and its lock released)
    assert re.search(r"agent stopped.*open_commands", agent.stderr), agent.stderr[-3000:]
    assert end.endswith(" disconnected."), end  # no will: it said offline itself
    assert statuses(obs, wire.AgentState.ONLINE), agent.stderr[-3000:]
    assert got[-1].state == wire.AgentState.OFFLINE and got[-1].detail == "clean shutdown", got[-1]
    Journal(tmp_path / "journal.sqlite", lock=True).close()  # free for the next agent


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
async def test_a_signal_while_the_agent_connects_is_a_clean_stop_with_no_will(
    mosquitto: EmbeddedBroker, tmp_path: Path, sig: str
) -> None:
    """A signal as the broker's CONNACK comes, before the agent took it: the stop closes the bus while it
    still connects, and the connection made then says ``offline`` / ``clean shutdown`` (never ``online``)
    and ends with a DISCONNECT. The bus used to cancel the connecting: no offline status, no DISCONNECT,
    and as the process ended the broker published the agent's will, ``connection lost``, after a clean
    stop. (The driver holds the CONNACK until the bus is closed: no wait on a sleep.)"""
    site = load_site(write_site(tmp_path))
    cfg = write_config(tmp_path, mode="advisory")
    obs = Observer()
    async with (
        observing(mosquitto, site, obs) as watch,
        agent_process(
            mosquitto, cfg, code=_SIGNALLING_AGENT, SIGNAL_UNDER_TEST=sig, MOMENT_UNDER_TEST="connecting"
        ) as agent,
    ):
        assert await agent.wait(30) == 0, agent.stderr[-3000:]
        got, end = await statuses_after_the_end(mosquitto, watch, obs, cfg)
    assert "Traceback" not in agent.stderr and "interrupted" not in agent.stderr, agent.stderr[-3000:]
    assert f"stopping ({sig}): the current cycle finishes" in agent.stderr, agent.stderr[-3000:]
    assert re.search(r"agent stopped.*open_commands", agent.stderr), agent.stderr[-3000:]
    assert end.endswith(" disconnected."), end  # no will
    assert not statuses(obs, wire.AgentState.ONLINE), got
    assert got and got[-1].state == wire.AgentState.OFFLINE and got[-1].detail == "clean shutdown", got
    Journal(tmp_path / "journal.sqlite", lock=True).close()  # free for the next agent
