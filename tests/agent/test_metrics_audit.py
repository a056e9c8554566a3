"""The agent's Prometheus metrics and HTTP endpoint against what docs/agent.md ("Observability") and the
Prometheus exposition format promise: the documented series under the documented names, types and
labels; counters exported at 0 from the start and counting each event once; gauges that follow their
source (a rack's fail-safe flag back at 0 once lifted); and the endpoint's bounds, each at its edge
(connections, line length, header lines, a client that does not take its answer), GET only.
Real sockets on 127.0.0.1; the exposition parsed with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from http_testing import http_get
from prometheus_client.parser import text_string_to_metric_families

from agent.bus import MqttOptions
from agent.config import load_config
from agent.decision import QueueWait
from agent.metrics import AgentMetrics, HttpEndpoint
from agent.service import AgentService
from agent.wire import Rejection, RejectReason
from twin.readings import CardBatch, FacilityReading, LoopReading, PduReading, RackReading, Readings

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


# ------------------------------------------------------------------------------------------------
# names, types, labels: docs/agent.md's table
# ------------------------------------------------------------------------------------------------
def _documented() -> dict[str, set[str]]:
    """docs/agent.md's metrics table: series name -> its labels."""
    text = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    table = text.split("| metric | labels | meaning |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        labels = {x.strip() for x in cells[1].split(",") if x.strip()}
        for name in re.findall(r"`(racktwin_\w+)`", cells[0]):
            out[name] = labels
    return out


def _families(body: str) -> dict[str, Any]:
    """Parsed exposition by series name as written (a counter's ``_total`` included)."""
    fams = {}
    for fam in text_string_to_metric_families(body):
        if fam.name.endswith("_created"):  # prometheus_client's creation time of a counter or histogram
            continue
        fams[fam.name + "_total" if fam.type == "counter" else fam.name] = fam
    return fams


def test_every_documented_series_is_exported_under_its_name_type_and_labels_and_no_other() -> None:
    docs = _documented()
    assert len(docs) > 40
    m = AgentMetrics(["r0", "r1"])
    fams = _families(m.exposition().decode())
    assert set(fams) == set(docs)
    for name, fam in fams.items():
        # Prometheus conventions: counters and only counters end in _total; histograms here time things
        assert (fam.type == "counter") == name.endswith("_total"), name
        assert fam.type != "histogram" or name.endswith("_seconds"), name
        assert not re.search(r"_(percent|milliseconds|kilowatts|minutes|fahrenheit|kelvin)(_|$)", name), name
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        assert labels <= docs[name], (name, labels)


def test_counters_are_exported_at_zero_from_the_start_for_every_documented_value() -> None:
    """docs/agent.md: every rack's invalid-readings series at 0 from the start (so that the alert's
    increase() counts a first burst); the results, statuses and sources the table lists likewise, and every
    job-snapshot change, every applied setting per rack and every rack's applied states refused as older and
    dropped (their rows say "exported at 0 from the start")."""
    m = AgentMetrics(["r0", "r1"])
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(m.exposition().decode())
        for s in fam.samples
    }

    def zero(name: str, **labels: str) -> bool:
        return values.get((name, tuple(sorted(labels.items())))) == 0.0

    for rack in ("r0", "r1"):
        assert zero("racktwin_invalid_readings_total", rack=rack)
        assert zero("racktwin_rack_failsafe", rack=rack)
    results = ["sent", "retried", "applied", "rejected", "expired", "unacked", "abandoned", "superseded", "unconfirmed"]
    for result in results:
        assert zero("racktwin_commands_total", result=result), result
    for status in ["optimal", "feasible", "incremental", "fallback", "infeasible", "failsafe"]:
        assert zero("racktwin_decisions_total", status=status), status
    for source in ["milp", "greedy", "incremental", "hold"]:
        assert zero("racktwin_control_cycles_total", source=source), source
        for status in ["optimal", "feasible", "fallback", "infeasible", "timeout_no_solution", "error"]:
            assert zero("racktwin_plans_total", status=status, source=source), (status, source)
    for change in ["added", "corrected", "dropped"]:
        assert zero("racktwin_job_snapshot_changes_total", change=change), change
    for setting in ["level", "power_limit", "low_power"]:
        for rack in ("r0", "r1"):
            assert zero("racktwin_applied_state_disproved_total", setting=setting, rack=rack), (setting, rack)
    for rack in ("r0", "r1"):
        assert zero("racktwin_applied_states_old_total", rack=rack), rack
        assert zero("racktwin_applied_states_old_dropped_total", rack=rack), rack


# ------------------------------------------------------------------------------------------------
# the metrics brought up to date from the service's parts
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def service(tmp_path: Path) -> AgentService:
    loaded = load_config(EXAMPLES / "agent.toml", env={"RACKTWIN_JOURNAL_PATH": str(tmp_path / "j.sqlite")})
    return AgentService(loaded, mqtt=MqttOptions(port=1), http=False)  # not run: no connection


def _value(service: AgentService, name: str, **labels: str) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels)


def test_counters_add_what_their_source_counted_since_the_last_update(service: AgentService) -> None:
    """The service's parts keep growing counts; each update adds the difference, so an update that saw
    nothing new adds nothing and the exported counter equals the source's count."""
    up = service.metric_updates
    st = service.state
    racks = service.site.rack_names
    for late, ahead, takeovers, invalid_card, invalid_r1 in ((3, 1, 2, 2, 1), (3, 1, 2, 2, 1), (7, 4, 5, 6, 3)):
        st.late_count = late
        service.ingest.stats.ahead = ahead
        service.bus.stats.takeovers = takeovers
        st.invalid_count[0] = invalid_card  # a card of r0
        st.rack_invalid_count[1] = invalid_r1
        up.update()
        up.update()  # nothing new: adds nothing
        assert _value(service, "racktwin_late_readings_total") == late
        assert _value(service, "racktwin_messages_stamped_ahead_total") == ahead
        assert _value(service, "racktwin_broker_takeovers_total") == takeovers
        assert _value(service, "racktwin_invalid_readings_total", rack=racks[0]) == invalid_card
        assert _value(service, "racktwin_invalid_readings_total", rack=racks[1]) == invalid_r1
        assert _value(service, "racktwin_invalid_readings_total", rack=racks[2]) == 0.0
    for n in (1, 2, 2, 5):
        while service.codec.counter.count("unknown_rack") < n:
            service.codec.counter.record(Rejection(RejectReason.UNKNOWN_RACK, "rack 'nope'", "racktwin/v1/site1/x"))
        up.update()
        assert _value(service, "racktwin_rejected_messages_total", reason="unknown_rack") == n


def _readings(service: AgentService, t: float, die_c: float, hot_card: int, failed_card: int) -> Readings:
    site = service.site
    cpr = site.cards_per_rack
    racks = []
    for r in range(site.n_racks):
        idx = np.arange(r * cpr, (r + 1) * cpr, dtype=np.int64)
        die = np.full(cpr, die_c)
        failed = np.zeros(cpr, dtype=bool)
        if r == 0:
            die[hot_card] = die_c + 10.0
            die[failed_card] = die_c + 30.0  # a failed card's reading is no hot die
            failed[failed_card] = True
        power = np.where(failed, 0.0, 500.0)
        batch = CardBatch(
            card_index=idx,
            power_w=power,
            die_temp_c=die,
            clock_mhz=np.where(failed, 0.0, 1980.0),
            utilization=np.where(failed, 0.0, 0.9),
            level=np.zeros(cpr, dtype=np.int64),
            low_power=np.zeros(cpr, dtype=bool),
            waking=np.zeros(cpr, dtype=bool),
            power_limit_w=np.full(cpr, 700.0),
            failed=failed,
        )
        loop = LoopReading(30.0 + r, 40.0 + r, 100.0, 200.0, 1.0)
        racks.append(RackReading(r, t, batch, loop, PduReading(40_000.0 + 100.0 * r)))
    fac = FacilityReading(t, 18.0, 28.0, 38.0, 30_000.0, 300_000.0, 345_000.0, 30.0)
    return Readings(t, tuple(racks), fac)


def test_gauges_follow_the_site_in_base_units(service: AgentService) -> None:
    t = 1_790_000_000.0
    service.clock.observe(t)
    service.state.update(_readings(service, t, 60.0, hot_card=3, failed_card=5))
    service.metric_updates.update()
    names = service.site.rack_names
    v = _value
    assert v(service, "racktwin_pue_ratio") == pytest.approx(345_000.0 / 300_000.0)
    assert v(service, "racktwin_it_power_watts") == 300_000.0
    assert v(service, "racktwin_facility_power_watts") == 345_000.0
    assert v(service, "racktwin_cooling_power_watts") == 30_000.0
    assert v(service, "racktwin_ambient_temperature_celsius") == 18.0
    assert v(service, "racktwin_rack_power_watts", rack=names[2]) == 40_200.0
    assert v(service, "racktwin_rack_power_limit_watts", rack=names[2]) == service.site.rack.power_limit_w
    assert v(service, "racktwin_rack_supply_temperature_celsius", rack=names[1]) == 31.0
    assert v(service, "racktwin_rack_return_temperature_celsius", rack=names[1]) == 41.0
    assert v(service, "racktwin_rack_max_die_temperature_celsius", rack=names[0]) == 70.0  # not the failed card's
    assert v(service, "racktwin_rack_max_die_temperature_celsius", rack=names[1]) == 60.0
    assert v(service, "racktwin_card_die_temperature_celsius", rack=names[0], card="3") == 70.0
    assert v(service, "racktwin_card_die_temperature_celsius", rack=names[1], card="3") == 60.0  # card of its rack
    # every card's die temperature as it reads: a failed card's too (it cools down), never a stale value
    assert v(service, "racktwin_card_die_temperature_celsius", rack=names[0], card="5") == 90.0
    age = v(service, "racktwin_telemetry_age_seconds", rack=names[0])
    assert age is not None and 0.0 <= age < 60.0
    site_t = v(service, "racktwin_site_time_seconds")
    assert site_t is not None and site_t >= t
    assert v(service, "racktwin_broker_connected") == 0.0  # never connected
    assert service.standby.mode == "advisory"  # the example's mode: advice only, no agent stands by
    assert v(service, "racktwin_agent_standby") == 0.0
    assert v(service, "racktwin_open_commands") == 0.0


def test_a_rack_that_has_not_reported_exports_no_reading_rather_than_nan(service: AgentService) -> None:
    """Before a rack's first reading the agent knows nothing of its power, coolant temperatures or dies:
    their series have no sample (a NaN sample would plot as a gap and compare false in every alert
    rule, hiding the rack); its limit is known from the site and is exported."""
    service.metric_updates.update()
    rack = service.site.rack_names[0]
    for name in (
        "racktwin_rack_power_watts",
        "racktwin_rack_supply_temperature_celsius",
        "racktwin_rack_return_temperature_celsius",
        "racktwin_rack_max_die_temperature_celsius",
        "racktwin_telemetry_age_seconds",
    ):
        assert _value(service, name, rack=rack) is None, name
    assert _value(service, "racktwin_card_die_temperature_celsius", rack=rack, card="0") is None
    assert _value(service, "racktwin_rack_power_limit_watts", rack=rack) == service.site.rack.power_limit_w


def test_a_decisions_gauges_are_reset_when_their_cause_is_gone(service: AgentService) -> None:
    """A rack's fail-safe flag goes back to 0 once its caps are lifted, a kind of queue wait to 0 once no
    job waits so; without pump control the speed reads 1 (full speed, a ratio); hosts off counted per rack."""
    from guard_helpers import proposal

    site = service.site
    up = service.metric_updates
    names = site.rack_names
    n_hosts = len(np.unique(site.card_host()))
    hosts_off = np.zeros(n_hosts, dtype=bool)
    hosts_off[:3] = True  # the first three hosts: all in the first rack
    r_pow = np.arange(site.n_racks) * 1000.0 + 30_000.0
    first = proposal(
        site,
        failsafe_racks=(1,),
        queue_waits={"j1": QueueWait("no_window", "x"), "j2": QueueWait("no_window", "y")},
        rack_pump_speed_frac=np.full(site.n_racks, 0.6),
        host_off=hosts_off,
        predicted_rack_power_w=r_pow,
        rack_cap_w=np.full(site.n_racks, 45_000.0),
        solve_time_s=0.25,
        source="greedy",
        status="fallback",
        plan_status="timeout_no_solution",
    )
    up.after_decision(first)
    assert _value(service, "racktwin_rack_failsafe", rack=names[1]) == 1.0
    assert _value(service, "racktwin_queued_jobs", wait="no_window") == 2.0
    assert _value(service, "racktwin_rack_pump_speed_ratio", rack=names[0]) == 0.6
    assert _value(service, "racktwin_rack_hosts_off", rack=names[0]) == 3.0
    assert _value(service, "racktwin_rack_hosts_off", rack=names[1]) == 0.0
    assert _value(service, "racktwin_predicted_rack_power_watts", rack=names[2]) == 32_000.0
    assert _value(service, "racktwin_rack_power_cap_watts", rack=names[2]) == 45_000.0
    assert _value(service, "racktwin_solve_seconds_sum") == 0.25  # seconds
    assert _value(service, "racktwin_control_cycles_total", source="greedy") == 1.0
    assert _value(service, "racktwin_decisions_total", status="fallback") == 1.0
    assert _value(service, "racktwin_plans_total", status="timeout_no_solution", source="greedy") == 1.0
    up.after_decision(proposal(site, rack_cap_w=np.full(site.n_racks, 45_000.0), predicted_rack_power_w=r_pow))
    assert _value(service, "racktwin_rack_failsafe", rack=names[1]) == 0.0
    assert _value(service, "racktwin_queued_jobs", wait="no_window") == 0.0
    assert _value(service, "racktwin_rack_pump_speed_ratio", rack=names[0]) == 1.0
    assert _value(service, "racktwin_rack_hosts_off", rack=names[0]) == 0.0
    assert _value(service, "racktwin_decisions_total", status="optimal") == 1.0
    assert _value(service, "racktwin_plans_total", status="optimal", source="milp") == 1.0


# ------------------------------------------------------------------------------------------------
# the HTTP endpoint
# ------------------------------------------------------------------------------------------------
async def _raw(port: int, request: bytes, read: bool = True) -> tuple[str, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10.0)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return lines[0], headers, body


async def _started(m: AgentMetrics | None = None, reasons: list[str] | None = None, **kw: Any) -> HttpEndpoint:
    endpoint = HttpEndpoint(m or AgentMetrics(["r0"]), lambda: list(reasons or []), **kw)
    await endpoint.start("127.0.0.1", 0)
    return endpoint


async def _stop(endpoint: HttpEndpoint) -> None:
    endpoint.close()
    await endpoint.wait_closed()


async def test_metrics_are_served_in_the_prometheus_text_format_get_and_head_only() -> None:
    m = AgentMetrics(["r0"])
    m.it_power_watts.set(123_000.0)
    endpoint = await _started(m)
    try:
        status, headers, body = await _raw(endpoint.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status.split()[1] == "200"
        assert headers["content-type"].startswith("text/plain") and "version=" in headers["content-type"]
        assert int(headers["content-length"]) == len(body)
        fams = _families(body.decode())
        assert fams["racktwin_it_power_watts"].samples[0].value == 123_000.0
        # a scrape with parameters (Prometheus' params:) is still a scrape of /metrics
        status, _, body = await _raw(endpoint.port, b"GET /metrics?module=x HTTP/1.1\r\n\r\n")
        assert status.split()[1] == "200" and b"racktwin_it_power_watts 123000.0" in body
        status, headers, body = await _raw(endpoint.port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert status.split()[1] == "200" and body == b"" and int(headers["content-length"]) > 1000
        for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
            status, _, _ = await _raw(
                endpoint.port, f"{method} /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode()
            )
            assert status.split()[1] == "405", method
    finally:
        await _stop(endpoint)


async def test_readyz_says_ready_false_with_its_reasons_and_ready_true_without() -> None:
    reasons = ["not connected to the broker mqtt://x"]
    endpoint = await _started(reasons=reasons)
    try:
        status, headers, body = await _raw(endpoint.port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert status.split()[1] == "503" and headers["content-type"] == "application/json"
        assert json.loads(body) == {"ready": False, "reasons": reasons}
        reasons.clear()
        status, _, body = await _raw(endpoint.port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert status.split()[1] == "200" and json.loads(body) == {"ready": True, "reasons": []}
    finally:
        await _stop(endpoint)


async def test_exactly_max_connections_are_served_at_once() -> None:
    """At most ``max_connections`` at once, one more answered 503: with two allowed and one open, a
    second is served; with two open, a third is refused."""
    endpoint = await _started(max_connections=2)
    try:
        idle = [await asyncio.open_connection("127.0.0.1", endpoint.port)]
        await asyncio.sleep(0.05)
        assert (await http_get(endpoint.port, "/healthz"))[0] == 200
        idle.append(await asyncio.open_connection("127.0.0.1", endpoint.port))
        await asyncio.sleep(0.05)
        assert (await http_get(endpoint.port, "/healthz"))[0] == 503
        for _reader, writer in idle:
            writer.close()
    finally:
        await _stop(endpoint)


async def test_a_line_of_max_line_bytes_is_read_and_one_byte_more_is_431() -> None:
    """docs: lines of at most ``max_line_bytes`` (8 KiB by default), its line end included; else 431."""
    endpoint = await _started(max_line_bytes=1024)
    try:
        for line_bytes, expected in ((1024, "404"), (1025, "431")):
            path = "/" + "x" * (line_bytes - len("GET / HTTP/1.1\r\n"))
            request = f"GET {path} HTTP/1.1\r\n".encode()
            assert len(request) == line_bytes
            assert (await _raw(endpoint.port, request + b"\r\n"))[0].split()[1] == expected, line_bytes
            header = b"X-Pad: " + b"y" * (line_bytes - 9) + b"\r\n"
            assert len(header) == line_bytes
            status = (await _raw(endpoint.port, b"GET /healthz HTTP/1.1\r\n" + header + b"\r\n"))[0]
            assert status.split()[1] == ("200" if expected == "404" else "431"), line_bytes
    finally:
        await _stop(endpoint)


async def test_max_header_lines_are_read_and_one_more_is_431() -> None:
    """docs: at most ``max_header_lines`` header lines (64 by default); the request line and the empty
    line that ends the head are no header lines."""
    endpoint = await _started(max_header_lines=8)
    try:
        for n, expected in ((8, "200"), (9, "431")):
            head = b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-H%d: 1\r\n" % k for k in range(n)) + b"\r\n"
            assert (await _raw(endpoint.port, head))[0].split()[1] == expected, n
    finally:
        await _stop(endpoint)


async def test_a_client_that_does_not_take_its_answer_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer must be taken within ``write_timeout_s``: a client that asks for a large /metrics and
    reads nothing does not get the rest of it later (the server dropped the connection and what it
    still held for it); the endpoint goes on serving."""
    timed_out: list[str] = []  # the status of each answer whose write timed out (the connection dropped)
    reply = HttpEndpoint._reply

    async def recorded(self: HttpEndpoint, writer: asyncio.StreamWriter, method: str, status: str, *a: Any) -> None:
        try:
            await reply(self, writer, method, status, *a)
        except TimeoutError:
            timed_out.append(status)
            raise

    monkeypatch.setattr(HttpEndpoint, "_reply", recorded)
    m = AgentMetrics(["r0"])
    for k in range(16):  # ~16 MB of exposition: more than the sockets' buffers hold
        m.anomalies.labels(kind=f"{k}-" + "x" * 1_000_000).set(1)
    endpoint = await _started(m, write_timeout_s=0.2)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", endpoint.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
        await writer.drain()
        # not reading until the server has ended the connection (its write timed out), not for 1.5 s of
        # wall time (a slow machine might not have run the timeout by then)
        async with asyncio.timeout(10.0):
            while not timed_out:
                await asyncio.sleep(0.01)
        got = 0
        try:
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 10.0):
                got += len(chunk)
        except ConnectionResetError:
            pass
        assert got < 16_000_000
        assert (await http_get(endpoint.port, "/healthz"))[0] == 200
    finally:
        writer.close()
        await _stop(endpoint)
