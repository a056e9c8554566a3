"""What docs/sim.md, docs/evaluation.md, docs/models.md, docs/twin.md and docs/protocol.md say of the
code, checked against it (test_docs_contract.py checks the command lines, options, configuration keys,
topic tables and metrics): each page's module table names every module of its folder and only files
that exist, each JSON example of the protocol decodes on its topic, the simulator's summary keys and
truth-log columns, the run-scenario tables' defaults and ``racktwin evaluate``'s metric keys are the
code's, and the supply sweep's table is what ``racktwin twin sweep-supply`` prints.

A documentation audit (2026-12-05) found docs/twin.md's sweep table two rows behind the code (the
steady state settling a throttled card one level at a time since ec80764: speed 0.955 at 54 and
56 deg C where the table read 0.862 and 0.765) and docs/protocol.md naming host 3 where a rack names
host 9: these tests catch those classes of drift."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent import wire
from agent.cli import main
from agent.evaluate import run_policy
from agent.wire.topics import SCHEMAS, Topics
from sim.commands import CommandHandler
from sim.runner import SimSummary
from sim.truth import truth_columns
from twin import scenario, scenario_jobs
from twin.plant import Plant
from twin.scenario import load_run_scenario
from twin.spec import load_site
from twin.workload import GeneratorConfig

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
SITE = load_site(REPO / "examples" / "supernode-512.toml")


def page(name: str) -> str:
    return (REPO / "docs" / name).read_text(encoding="utf-8")


def section(text: str, heading: str, next_heading: str) -> str:
    """The text from ``heading`` up to ``next_heading`` (both at the start of a line)."""
    start = text.index(f"\n{heading}")
    return text[start : text.index(f"\n{next_heading}", start + 1)]


def first_cells(text: str) -> set[str]:
    """The backticked names of each table row's first cell (``| `a`, `b` | ...``)."""
    return {name for cell in re.findall(r"^\| ([^|]+) \|", text, flags=re.M) for name in re.findall(r"`([^`]+)`", cell)}


# ---- module tables ------------------------------------------------------------------------------------

#: each page, the folder its module table (or listing) describes
MODULE_PAGES = {"twin.md": "twin", "models.md": "models", "sim.md": "sim", "protocol.md": "agent/wire"}


@pytest.mark.parametrize(("name", "folder"), sorted(MODULE_PAGES.items()))
def test_each_pages_module_table_names_every_module_of_its_folder(name: str, folder: str) -> None:
    """models/solve.py was split into dvfs_solver.py and dvfs_highspy.py: a page that did not name them
    would leave a reader looking for the solver where it no longer is."""
    text = page(name)
    missing = [
        f"{folder}/{m.name}"
        for m in sorted((REPO / folder).glob("*.py"))
        if m.name not in ("__init__.py", "__main__.py")
        # `twin/spec.py`, or `topics.py` under its package's name; not models/cooling.py for twin/cooling.py
        and not re.search(rf"(?<![\w./-])(?:{re.escape(folder)}/)?{re.escape(m.name)}(?!\w)", text)
    ]
    assert not missing, f"docs/{name} does not name {missing}"


PAGES = ("sim.md", "evaluation.md", "models.md", "twin.md", "protocol.md")
_PATH = re.compile(
    r"(?<![\w./-])((?:agent|twin|models|sim|tests|benchmarks|examples|deploy|scripts)/[\w./-]*\.[a-z]+)\b"
)


@pytest.mark.parametrize("name", PAGES)
def test_every_file_a_page_names_exists(name: str) -> None:
    """``models/solve.py``, ``agent/ingest.py``, ``tests/unit/test_power_fit.py``, ``examples/day-demo.toml``:
    a file a page sends the reader to is there (``examples/fault-<kind>.toml`` patterns aside)."""
    named = set(_PATH.findall(page(name)))
    assert len(named) >= 5, named
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"docs/{name} names {missing}"


# ---- the protocol's examples --------------------------------------------------------------------------


def test_every_json_example_of_the_protocol_decodes_on_its_topic() -> None:
    """A bridge author copies these payloads: each one (a block may hold several, one per line group)
    decodes on its schema's topic on the example site, none rejected."""
    codec = wire.Codec(wire.SiteLayout.from_spec(SITE, site="site1"))
    topics = Topics("site1")
    kind_of = {schema: kind for kind, schema in SCHEMAS.items()}
    blocks = re.findall(r"```json\n(.*?)```", page("protocol.md"), flags=re.S)
    payloads = [p for b in blocks for p in re.split(r"\n(?=\{\"schema\")", b.strip())]
    assert len(payloads) >= 8, payloads
    decoded = set()
    for payload in payloads:
        kind = kind_of[json.loads(payload)["schema"]]
        try:
            topic = topics.of(kind, "r0")
        except ValueError:  # a site topic
            topic = topics.of(kind)
        msg = codec.decode(topic, payload.encode())
        assert not isinstance(msg, wire.Rejection), (payload, msg)
        decoded.add(kind)
    assert len(decoded) >= 8, decoded


# ---- the simulator's outputs and run-scenario files ---------------------------------------------------


def test_the_summary_table_names_every_key_of_the_summary_and_no_other() -> None:
    summary = SimSummary(
        scenario="s",
        site="x",
        site_id="site1",
        n_cards=SITE.n_cards,
        n_racks=SITE.n_racks,
        rack_power_limit_w=SITE.rack.power_limit_w,
        accounting=Plant(SITE).accounting(),
        start_epoch_s=0.0,
        site_time_s=0.0,
        wall_s=1.0,
        cpu_s=0.0,
        speed_requested=1.0,
    )
    documented = first_cells(section(page("sim.md"), "## Summary", "## Python API"))
    assert documented == set(summary.to_dict()), documented ^ set(summary.to_dict())


def test_the_truth_log_table_names_its_columns_in_their_order() -> None:
    table = section(page("sim.md"), "## Truth log", "## Summary")
    documented = [
        n for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.M) for n in re.findall(r"`([^`]+)`", cell)
    ]
    per_rack = [c.replace("r{i}_", "") for c in documented if c.startswith("r{i}_")]
    columns = truth_columns(SITE)
    site_columns = columns[: len(columns) - SITE.n_racks * len(per_rack)]
    assert [c for c in documented if not c.startswith("r{i}_")] == site_columns
    assert columns[len(site_columns) :] == [f"{r}_{c}" for r in SITE.rack_names for c in per_rack]


#: the tables of docs/sim.md's "Run-scenario files" and the decoder's dataclass of each
SCENARIO_TABLES = {
    "Top level": scenario._RunFile,
    "`[workload]`": scenario_jobs.WorkloadSection,
    "`[plant]`": scenario._PlantSection,
    "`[targets]`": scenario.ScenarioTargets,
}


def table_after(text: str, heading: str) -> str:
    """The first table (its lines up to a blank one) after the line that starts with ``heading``."""
    start = text.index("\n| key | default | meaning |", text.index(f"\n{heading}"))
    return text[start:].split("\n\n", 1)[0]


def _literal(cell: str) -> Any:
    """A default cell as a value: ``120``, ``1.0``, ``true``, `` `"external"` ``, `` `[0.60, 0.87]` ``;
    None for words (``(required)``, ``the site's``, ``-``)."""
    text = cell.strip().strip("`")
    if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r'"[a-z_-]+"', text):
        return text.strip('"')
    if re.fullmatch(r"\[[0-9., ]+\]", text):
        return tuple(float(x) for x in text.strip("[]").split(","))
    return None


def test_the_defaults_in_the_run_scenario_tables_are_the_decoders() -> None:
    """Where a key's default is a value, the decoder has it; a key the decoder leaves unset (None) to
    the generator takes the generator's (``max_cards`` 256, ``compute_share_range`` [0.60, 0.87])."""
    text = section(page("sim.md"), "## Run-scenario files", "## Fault catalogue")
    checked = 0
    for heading, cls in SCENARIO_TABLES.items():
        table = table_after(text, heading)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]*) \|", table, flags=re.M)
        assert rows, heading
        for key, cell in rows:
            assert key in fields, f"{heading}: {key} is no key"
            value = _literal(cell)
            if value is None:
                continue
            default = fields[key].default
            if default is None:
                default = getattr(GeneratorConfig(), key)
            if isinstance(value, float):
                assert isinstance(default, int | float) and math.isclose(default, value), (heading, key, default)
            else:
                assert default == value, (heading, key, default)
            checked += 1
    assert checked >= 15, checked


# ---- racktwin evaluate's metrics ----------------------------------------------------------------------


def test_the_metrics_table_names_every_metric_a_run_reports() -> None:
    """docs/evaluation.md's "Metrics" table, against the keys of a short baseline run (every policy
    reports the same keys)."""
    sc = load_run_scenario(REPO / "examples" / "day-full-load.toml", duration_s=60.0)
    metrics = run_policy(sc, "baseline").metrics
    text = section(page("evaluation.md"), "### Metrics", "Where the energy went")
    documented = {
        n for row in re.findall(r"^\| ([^|]+) \|", text, flags=re.M) for n in re.findall(r"`([a-z_0-9]+)`", row)
    }
    documented |= set(re.findall(r"\(`([a-z_0-9]+)`: from t = 0\)", text))  # a key named inside a row
    assert set(metrics) <= documented, set(metrics) - documented
    assert documented - {"key"} <= set(metrics), documented - set(metrics)


# ---- docs/twin.md's supply sweep ----------------------------------------------------------------------


def test_the_supply_sweep_table_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """The table under "The supply-temperature trade-off of the example site", from the command it
    names, to the digits it prints."""
    text = page("twin.md")
    assert "`racktwin twin sweep-supply --step-k 2 --to-c 56`" in text
    rows = re.findall(r"^\| \**(\d+)\** \| ([^\n]+) \|$", text, flags=re.M)
    assert main(["twin", "sweep-supply", "--step-k", "2", "--to-c", "56", "--json"]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert [int(r[0]) for r in rows] == [round(p["supply_temp_c"]) for p in points]
    for (_, cells), p in zip(rows, points, strict=True):
        printed = [
            f"{p['it_power_w'] / 1e3:.1f}",
            f"{p['cooling_power_w'] / 1e3:.2f}",
            f"{p['chiller_power_w'] / 1e3:.2f}",
            f"{p['facility_power_w'] / 1e3:.1f}",
            f"{p['pue']:.4f}",
            f"{100 * p['free_cooling_fraction']:.0f}",
            f"{p['max_die_temp_c']:.1f}",
            str(p["throttled_cards"]),
            f"{p['throughput_frac']:.3f}",
        ]
        assert [c.strip().strip("*") for c in cells.split("|")] == printed, p["supply_temp_c"]


# ---- the reasons a rack gives, as the pages quote them ------------------------------------------------


def _reason(
    rack: CommandHandler, codec: wire.Codec, cards: tuple[int, ...], setting: wire.CardSetting, ts_s: float
) -> str:
    cmd = wire.RackCommand("r1", cards, setting, uuid.uuid4(), ts_s + 30.0, ts_s, 0, "agent")
    out = codec.outgoing(cmd)
    acks = [codec.decode(o.topic, o.payload) for o in rack.handle(out.topic, out.payload) if not o.retain]
    (ack,) = acks
    assert isinstance(ack, wire.Acknowledgement)
    return ack.reason or ""


def test_the_host_reasons_quoted_are_the_ones_a_rack_of_the_example_site_gives() -> None:
    """docs/protocol.md and docs/sim.md quote a rack's refusals of a host command that is not whole
    hosts and of a setting for a card of a powered-off host: on the example site (8 hosts of 8 cards a
    rack) cards 8..15 of rack r1 are host 9 of the site (protocol.md said host 3)."""
    plant = Plant(SITE)
    codec = wire.Codec(wire.SiteLayout.from_spec(SITE, site="site1"))
    rack = CommandHandler(plant, codec, wire.Sequencer("sim"), lambda: 100.0)
    missing = _reason(rack, codec, (8, 9, 10, 12, 13, 14, 15), wire.CardSetting.host_power_off(), 90.0)
    assert _reason(rack, codec, tuple(range(8, 16)), wire.CardSetting.host_power_off(), 91.0) == ""
    host_off = _reason(rack, codec, (8,), wire.CardSetting.power_limit(300.0), 92.0)
    missing = missing.split(": ", 1)[1]  # after the plant's action name
    host_off = host_off.split(" the card cannot be reached")[0]
    assert missing == "cards must be whole hosts of 8 cards; host 9 (cards 8..15 of rack r1) is missing card 11"
    assert host_off == "host_off: card 8 is on host 9 (cards 8..15 of rack r1), which is powered off:"
    for name in ("protocol.md", "sim.md"):
        text = " ".join(page(name).split())
        assert missing.split("; ")[1] in text, f"docs/{name}: {missing}"  # sim.md quotes it from "host 9"
        assert host_off in text, f"docs/{name}: {host_off}"


def test_the_cut_card_failed_reason_quoted_is_the_wires() -> None:
    """docs/protocol.md quotes a ``card_failed`` reason too long for the ack's 1,024 characters (every
    card of a 256-card rack): its last number named and the count left out are the wire's."""
    quoted = re.search(r"`cards 0, 1, \.\.\., (\d+) and (\d+) more of rack r2 have failed", page("protocol.md"))
    assert quoted is not None
    reason = wire.card_failed_reason("r2", tuple(range(256)))
    assert len(reason) <= 1024
    assert f", {quoted.group(1)} and {quoted.group(2)} more of rack r2 have failed" in reason
