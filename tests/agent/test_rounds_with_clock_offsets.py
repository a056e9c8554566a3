"""Racks whose clocks differ by milliseconds (every real site: each rack stamps its telemetry with its own
clock, NTP keeps them milliseconds apart) and the estimator (``agent.round_merger.RoundMerger`` ->
``twin.estimate.Estimator``). The estimator is one rack at a time anyway (each card, loop and PDU is
learnt from its own readings at their own stamps), so what it learns must not depend on how the racks'
stamps line up; and it costs the same for one rack as for all, so the racks of one period must reach it
as one round. Merged by the exact stamp, every rack made a round of its own: 9 estimator updates a second
on the 8-rack example site instead of one (33 at 2,048 cards, 129 at 8,192), with the same estimates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from agent_helpers import example_site
from test_clock_ingest import T0, _cdu, cards_msg

from agent import wire
from agent.bus import MqttOptions
from agent.clock import SiteClock
from agent.ingest import Ingest
from agent.round_merger import RoundMerger
from sim.runner import SimOptions, Simulator
from twin.estimate import Estimates, Estimator
from twin.readings import Readings
from twin.scenario import load_run_scenario
from twin.state import TwinState

pytestmark = pytest.mark.agent

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: the 8 example racks' clocks, ahead of the site's (the simulator's, which stamps the facility) by 0-50 ms
OFFSETS_S = np.array([0.0, 0.031, 0.004, 0.047, 0.012, 0.001, 0.026, 0.018])
_FIELDS = ("r_ratio", "r_ratio_sd", "idle_scale", "dynamic_scale", "leakage_scale", "rack_flow_deficit")


@dataclasses.dataclass
class _Fed:
    estimates: Estimates
    rounds: list[Readings]  # what the estimator was given, in order


def _feed(seconds: int, offsets_s: npt.NDArray[np.float64] | None = None, late_rack: int | None = None) -> _Fed:
    """The fouled-plate scenario's plant for ``seconds``: each second's telemetry as the simulator encodes
    it, each rack's stamped ``offsets_s`` ahead (None: every rack on the site's clock), decoded and taken
    in by the ingest (one flush per burst), merged (``RoundMerger``) into the estimator. ``late_rack``: that
    rack's messages of each second arrive in a burst of their own, after the others' of the next second."""
    sc = load_run_scenario(EXAMPLES / "fault-cold-plate-fouling.toml")
    sim = Simulator(SimOptions(scenario=sc, mqtt=MqttOptions(port=1), speed=0.0, start_epoch_s=T0))
    plant, site = sim.plant, sc.site
    codec = wire.Codec(wire.SiteLayout.from_spec(site, site="site1"))
    state = TwinState(site)
    wall = [0.0]
    estimator = Estimator(site)
    merger = RoundMerger()
    fed: list[Readings] = []

    def estimate(rounds: list[Readings]) -> None:
        for r in rounds:
            estimator.update(r, frozen_cards=state.stuck_cards(), frozen_racks=state.stuck_racks())
            fed.append(r)

    ing = Ingest(
        site, state, SiteClock(1.0, infer=False, wall=lambda: wall[0]), on_round=lambda r: estimate(merger.add(r))
    )

    def burst(outs: list[wire.Outgoing]) -> None:
        for o in outs:
            msg = codec.decode(o.topic, o.payload)
            assert not isinstance(msg, wire.Rejection)
            ing.handle(msg)
        ing.flush()

    held: list[wire.Outgoing] = []
    for _ in range(seconds):
        wall[0] = plant.time_s
        rd, ts = plant.readings(), sim.site_time_s
        outs: list[wire.Outgoing] = []
        for rr in rd.racks:
            off = 0.0 if offsets_s is None else float(offsets_s[rr.rack])
            outs += sim.telemetry.readings(Readings(time_s=rd.time_s, racks=(rr,)), ts + off)
        outs += sim.telemetry.readings(Readings(time_s=rd.time_s, racks=(), facility=rd.facility), ts)
        if late_rack is None:
            burst(outs)
        else:
            late = [o for o in outs if f"/{site.rack_names[late_rack]}/" in o.topic]
            burst([o for o in outs if o not in late])
            burst(held)
            held = late
        plant.step(1.0)
    burst(held)
    estimate(merger.drain())  # the round held: every run ends on the same readings
    return _Fed(estimator.estimates(), fed)


def _same_estimates(a: Estimates, b: Estimates) -> None:
    for name in _FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.rack_dt_ratio, b.rack_dt_ratio, equal_nan=True)


def test_racks_whose_clocks_differ_by_milliseconds_are_estimated_in_one_round_a_second_as_on_one_clock() -> None:
    """40 s of the example site, each rack's clock 0-50 ms ahead of the site's: the estimator gets one
    round a second with every rack and the facility, each rack's parts at the rack's own stamps, and
    learns exactly what it learns when the racks share one clock."""
    shared = _feed(40)
    offset = _feed(40, OFFSETS_S)
    assert len(shared.rounds) == len(offset.rounds) == 40  # (before: 320, one a rack, r0's with the facility)
    for i, r in enumerate(offset.rounds):
        assert [rr.rack for rr in r.racks] == list(range(8)) and r.facility is not None
        for rr in r.racks:
            stamp = T0 + i + OFFSETS_S[rr.rack]
            assert rr.part_time_s("cards") == rr.part_time_s("loop") == rr.part_time_s("pdu") == pytest.approx(stamp)
        assert r.facility.time_s == T0 + i
    _same_estimates(offset.estimates, shared.estimates)


def test_a_racks_reading_that_arrives_after_the_next_rounds_is_still_learnt() -> None:
    """Rack r1's telemetry of each second arrives after the other racks' of the next second (its round
    went to the estimator without it): each of its readings reaches the estimator, once and in order, and
    the estimator learns what it learns when every rack arrives on time."""
    on_time = _feed(30, OFFSETS_S)
    late = _feed(30, OFFSETS_S, late_rack=1)
    r1 = [rr.part_time_s("cards") for r in late.rounds for rr in r.racks if rr.rack == 1]
    assert r1 == [pytest.approx(T0 + i + OFFSETS_S[1]) for i in range(30)]
    _same_estimates(late.estimates, on_time.estimates)


def _host_batches(rack: str, ts: float) -> list[wire.CardBatch]:
    """Rack ``rack``'s 64 cards as two batches stamped ``ts``, one per host (cards 0-31, 32-63); die
    temperatures 40 + the card's index."""
    msg = cards_msg(rack, ts, temp_c=40.0 + np.arange(64, dtype=np.float64))
    cols = ("power_w", "temp_c", "sm_clock_mhz", "utilization", "power_limit_w", "low_power")
    return [
        dataclasses.replace(msg, card_index=host, **{f: getattr(msg, f)[host] for f in cols})
        for host in (np.arange(32), np.arange(32, 64))
    ]


def test_a_rack_sending_one_batch_per_host_on_its_own_clock_reaches_the_estimator_whole() -> None:
    """Rack r0 sends its cards in two batches, one per host, stamped 4 ms ahead of r1's; r1's reading
    arrives between them. The ingest flushes at r0's second batch; the round the estimator gets holds
    r0's 64 cards at r0's stamp and r1's at its own. Merged by the exact stamp, r1's later stamp closed
    r0's round after its first host: r0 reached the estimator in two rounds of 32 cards."""
    site = example_site()
    merger = RoundMerger()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    for i in range(3):
        t = T0 + i
        first, second = _host_batches("r0", t + 0.004)
        ing.handle(first)
        ing.handle(cards_msg("r1", t))
        ing.handle(_cdu("r1", t))
        ing.handle(second)
        ing.flush()
    assert ing.stats.rounds == 6  # (two flushes a second: at r0's second batch, and at the end)
    assert [r.time_s for r in rounds] == [T0 + 0.004, T0 + 1.004]  # (the newest waits for the next second)
    for i, r in enumerate(rounds):
        r0, r1 = r.racks
        assert r0.cards is not None and r0.part_time_s("cards") == T0 + i + 0.004
        assert r0.cards.card_index.tolist() == list(range(64))
        assert r0.cards.die_temp_c.tolist() == (40.0 + np.arange(64)).tolist()
        assert r1.cards is not None and r1.part_time_s("cards") == r1.part_time_s("loop") == T0 + i


def test_a_rack_that_reads_more_often_than_the_rounds_window_has_every_reading_estimated_in_order() -> None:
    """Rack r0 reads its cards every 0.1 s, r1 every second: two readings of r0's cards are never merged
    into one round (one would be lost to the estimator), each goes to it in its own round, in order; r1's
    joins the round of r0's reading stamped with it."""
    merger = RoundMerger()
    site = example_site()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    for k in range(21):
        t = T0 + 0.1 * k
        ing.handle(cards_msg("r0", t, temp_c=np.full(64, 40.0 + k)))
        if k % 10 == 0:
            ing.handle(cards_msg("r1", t))
        ing.flush()
    rounds += merger.drain()
    r0 = [
        (rr.part_time_s("cards"), rr.cards.die_temp_c[0]) for r in rounds for rr in r.racks if rr.rack == 0 and rr.cards
    ]
    assert r0 == [(T0 + 0.1 * k, 40.0 + k) for k in range(21)]
    assert [[rr.rack for rr in r.racks] for r in rounds if 1 in {rr.rack for rr in r.racks}] == [[0, 1]] * 3


def test_a_racks_reading_overtaken_by_its_next_goes_to_the_estimator_before_it() -> None:
    """r0's reading stamped 0.1 s before the one of r0 the merger holds arrives after it (reordered on
    the way): it goes out at once, before the round held, so that the estimator gets r0's readings in
    the order of their stamps (after the newer one it would drop it as late); the round held stays whole."""
    merger = RoundMerger()
    site = example_site()
    rounds: list[Readings] = []
    ing = Ingest(site, TwinState(site), SiteClock(1.0), on_round=lambda r: rounds.extend(merger.add(r)))
    ing.handle(cards_msg("r0", T0 + 1.0))
    ing.handle(cards_msg("r1", T0 + 1.01))
    ing.flush()
    ing.handle(cards_msg("r0", T0 + 0.9))
    ing.flush()
    ing.handle(cards_msg("r2", T0 + 1.02))
    ing.flush()
    rounds += merger.drain()
    assert [(r.time_s, [rr.rack for rr in r.racks]) for r in rounds] == [(T0 + 0.9, [0]), (T0 + 1.02, [0, 1, 2])]
