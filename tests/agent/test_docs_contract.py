"""What the documentation tells users to type exists: every ``racktwin COMMAND ... --option`` written in
README.md, docs/*.md, deploy/**, scripts/*.sh and the examples' comments is an option of that command
(its argparse parser, built in process as ``racktwin`` builds it), every option of every command is
described somewhere, the defaults docs/sim.md's option table states are the parser's, every
``section.key`` of the agent's configuration and every ``RACKTWIN_*`` variable named there exists, and
every ``python benchmarks/X.py --option`` named in the docs is an option of that script, every row of
the topic tables in docs/protocol.md and the README has its topic's schema, QoS and retain flag,
every ``racktwin_*`` series the README and docs/*.md name is exported with the labels they name, every
``Racktwin*`` alert they and the deploy files name is a shipped rule, every file of the checkout they
name exists, and every Python name they write (``agent.round_merger.RoundMerger``,
``SiteClock.timelines_left``) resolves.

A helper found deploy/mosquitto telling operators to run ``racktwin agent --broker ... --mqtt-ca-file``,
options only ``racktwin sim`` has: these tests catch that class of error."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path

import pytest
from test_metrics_audit import _documented

from agent.cli import COMMANDS
from agent.config import OTHER_ENV_VARS, AgentConfig, env_variables
from agent.metrics import AgentMetrics
from agent.wire.topics import SCHEMAS, Kind, Topics, qos_of, retain_of

pytestmark = pytest.mark.agent

REPO = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def _walk(parser: argparse.ArgumentParser, name: str, out: dict[str, argparse.ArgumentParser]) -> None:
    out[name] = parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                _walk(sub, f"{name} {sub_name}", out)


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser as ``racktwin`` builds it (agent/cli.py), subcommands as ``twin steady``."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"racktwin {name}", description=help_text)
        importlib.import_module(f"agent.commands.{module_name}").add_arguments(parser, name)
        _walk(parser, name, out)
    return out


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


PARSERS = command_parsers()
OPTIONS = {name: options_of(p) for name, p in PARSERS.items()}
ALL_OPTIONS = set().union(*OPTIONS.values())


def documented_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    files += sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file())
    files += sorted((REPO / "scripts").glob("*.sh")) + sorted((REPO / "examples").glob("*.toml"))
    return [*files, REPO / ".ci" / "run"]


def command_line_section() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8").split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]


_NAME = "(?:" + "|".join(re.escape(c) for c in sorted(COMMANDS, key=len, reverse=True)) + ")"
#: ``racktwin sim``, ``racktwin twin steady``, ``racktwin sim/agent`` (each of the two is meant)
_COMMAND_AT = re.compile(rf"racktwin\s+({_NAME}(?:/{_NAME})*)(?![\w-])(?:\s+(steady|sweep-supply)(?![\w-]))?")


def written_invocations(text: str) -> list[tuple[int, str, str]]:
    """(line, command, option) for each ``--option`` written after ``racktwin COMMAND`` on one command
    line (shell continuations joined), up to the end of its code span, a shell separator or the next
    command."""
    text = re.sub(r"\\\n\s*", " ", text)
    out: list[tuple[int, str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in _COMMAND_AT.finditer(line):
            rest = re.split(r"`|;|\|\||&&|\||\bracktwin\s|\)|,\s|#", line[m.end() :])[0]
            for name in m.group(1).split("/"):
                command = f"{name} {m.group(2)}" if m.group(2) else name
                out += [(number, command, o) for o in OPTION.findall(rest)]
    return out


def test_the_scanner_reads_a_command_line_as_a_user_would() -> None:
    """The rule itself, on the line that was wrong in deploy/mosquitto (the agent has no --broker)."""
    line = "run `racktwin agent --broker mqtts://b:8883 --mqtt-ca-file ca.crt` and `racktwin sim --seed 1`"
    assert written_invocations(line) == [(1, "agent", "--broker"), (1, "agent", "--mqtt-ca-file"), (1, "sim", "--seed")]
    # mosquitto.conf's comment said "racktwin sim/agent --broker ...": both commands are meant
    assert written_invocations("# racktwin sim/agent --broker mqtts://b:8883") == [
        (1, "sim", "--broker"),
        (1, "agent", "--broker"),
    ]
    assert written_invocations("racktwin twin sweep-supply --ambient-c 25 \\\n    --to-c 50") == [
        (1, "twin sweep-supply", "--ambient-c"),
        (1, "twin sweep-supply", "--to-c"),
    ]
    assert {"--broker", "--mqtt-ca-file"} & OPTIONS["agent"] == set()


def test_every_racktwin_command_line_written_anywhere_uses_options_of_that_command() -> None:
    wrong = []
    for path in documented_files():
        for number, command, option in written_invocations(path.read_text(encoding="utf-8")):
            # `racktwin twin --level 2` (a subcommand left out) is read as any subcommand's option
            known = (
                set().union(*(v for c, v in OPTIONS.items() if c.startswith("twin ")))
                if command == "twin"
                else OPTIONS[command]
            )
            if option not in known and option != "--help":  # argparse gives each command its --help
                wrong.append(f"{path.relative_to(REPO)}:{number}: racktwin {command} has no {option}")
    assert not wrong, "\n".join(wrong)


def test_every_option_in_the_readmes_command_line_section_is_an_option_of_a_command() -> None:
    """The section's text and table name options in backticks (`--json`, `sim --truth-log`); the
    top-level --version and --help are the only others."""
    section = command_line_section()
    named = {o for span in re.findall(r"`([^`]+)`", section) for o in OPTION.findall(span)}
    assert named, "no option found: the section moved?"
    assert named - ALL_OPTIONS <= {"--version", "--help"}, sorted(named - ALL_OPTIONS)


def test_the_readmes_option_list_names_each_option_under_its_own_command() -> None:
    """Under "Their other options", each entry (- `cmd`: ...) names options of that command."""
    section = command_line_section()
    entries = re.findall(r"^- (`[^\n]*(?:\n  [^\n]*)*)", section, flags=re.M)
    assert len(entries) >= len(COMMANDS) - 2, entries  # fit-power and fit-thermal have only what the table shows
    wrong = []
    for entry in entries:
        # `twin steady`: ...; `twin sweep-supply`: ...: one entry may list two commands
        parts = re.split(r"`((?:" + "|".join(re.escape(c) for c in PARSERS) + r"))`:", entry)
        assert len(parts) >= 3, entry
        for command, text in zip(parts[1::2], parts[2::2], strict=True):
            for option in OPTION.findall(text):
                if option not in OPTIONS[command]:
                    wrong.append(f"README.md 'Command line': `{command}` lists {option}, which it does not have")
    assert not wrong, "\n".join(wrong)


def test_every_option_of_every_command_is_described_in_the_readme_or_its_docs() -> None:
    """An option `--help` shows and no document describes is one users cannot look up."""
    docs = (REPO / "README.md").read_text(encoding="utf-8")
    docs += "".join(p.read_text(encoding="utf-8") for p in (REPO / "docs").glob("*.md"))
    missing = [
        f"racktwin {c} {o}"
        for c, opts in OPTIONS.items()
        for o in sorted(opts)
        if not re.search(re.escape(o) + r"(?![a-z0-9-])", docs)
    ]
    assert not missing, missing


def test_the_defaults_in_the_simulators_option_table_are_the_parsers() -> None:
    """docs/sim.md's table: where the default cell is a number or a literal, the parser has it."""
    text = (REPO / "docs" / "sim.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(--[a-z0-9-]+)[^`]*` \| ([^|]*) \|", text, flags=re.M)
    assert len(rows) >= 14, rows
    actions = {o: a for a in PARSERS["sim"]._actions for o in a.option_strings}
    assert {o for o, _ in rows} <= set(actions), {o for o, _ in rows} - set(actions)
    assert OPTIONS["sim"] - {o for o, _ in rows} <= {o for o in OPTIONS["sim"] if o.startswith("--mqtt-")}
    checked = 0
    for option, cell in rows:
        cell = cell.strip()
        default = actions[option].default
        if re.fullmatch(r"[0-9]+(\.[0-9]+)?", cell):
            assert float(default) == float(cell), (option, cell, default)
            checked += 1
        elif re.fullmatch(r"`[^`]+`", cell):
            assert str(default) == cell.strip("`"), (option, cell, default)
            checked += 1
        elif cell in ("none", ""):
            assert default in (None, False), (option, default)
    assert checked >= 4


def readme_exit_statuses() -> dict[str, str]:
    """The README's "Exit statuses" list (Command line): each entry's commands as written (`` `demo` ``,
    or several joined by ``, ``) -> its words, with the lines joined."""
    listed = command_line_section().split("\nExit statuses", 1)[1].split("\n\n", 2)[1]
    entries = re.findall(r"^- ((?:`[^`]+`(?:, )?)+): ([^\n]*(?:\n  [^\n]*)*)", listed, flags=re.M)
    assert entries, "no exit statuses found: the list moved?"
    return {names: " ".join(text.split()) for names, text in entries}


def test_the_readmes_exit_statuses_are_the_words_of_each_commands_help() -> None:
    """A script or a unit file that runs a command reads what its exit status means in the README or
    in ``--help``: both give the words of the command module's ``EXIT_STATUSES``, which its epilog
    includes, and the epilog of each of its actions (``twin steady --help``) too (the README said the
    demo's 2 meant bad options or a broker it cannot start or reach, where ``--help`` also named a
    simulator that stopped before its first second; journal, twin and fit-power/fit-thermal had no
    words of their own, only one line for the four in the README). Every command has them; commands
    that share them (fit-power and fit-thermal) share one entry of the README's list."""
    entries = readme_exit_statuses()
    names_of: dict[str, list[str]] = {}  # the words -> the commands that have them
    for name, (module_name, _help) in COMMANDS.items():
        words = getattr(importlib.import_module(f"agent.commands.{module_name}"), "EXIT_STATUSES", None)
        assert words is not None, f"racktwin {name}: no EXIT_STATUSES"
        words = " ".join(words.split())
        names_of.setdefault(words, []).append(name)
        helps = [p for p in PARSERS if p == name or p.startswith(f"{name} ")]
        for parser_name in helps:
            assert words in " ".join((PARSERS[parser_name].epilog or "").split()), f"racktwin {parser_name} --help"
    expected = {", ".join(f"`{n}`" for n in names): words for words, names in names_of.items()}
    assert set(entries) == set(expected), sorted(entries)
    for names, words in expected.items():
        assert entries[names] == words, names


#: where the docs quote a command's exit statuses (``racktwin X --help` says: "..."``) rather than
#: restating them in their own words (docs/models.md's optimize and docs/evaluation.md's demo once
#: said a bad scenario alone, and "bad options, a broker that cannot start or be reached"; evaluate's,
#: the agent's, twin's and fit's were restated in docs/evaluation.md, docs/agent.md and docs/twin.md)
EXIT_STATUS_QUOTES = {
    "docs/models.md": {"optimize"},
    "docs/sim.md": {"sim"},
    "docs/evaluation.md": {"demo", "evaluate"},
    "docs/agent.md": {"agent", "journal"},
    "docs/twin.md": {"twin", "fit-power"},
}


def test_the_docs_quote_each_commands_exit_statuses_in_the_words_of_its_help() -> None:
    """A reader of the docs in :data:`EXIT_STATUS_QUOTES` finds there the same exit statuses as
    ``--help`` and the README give: each quote names its command and holds the words of its
    ``EXIT_STATUSES``, whole, wherever the README or docs/*.md quote them."""
    quoted: dict[str, set[str]] = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = " ".join(path.read_text(encoding="utf-8").split())
        for name, words in re.findall(r"`racktwin ([a-z-]+) --help` says: \"([^\"]*)\"", text):
            quoted.setdefault(str(path.relative_to(REPO)), set()).add(name)
            module = importlib.import_module(f"agent.commands.{COMMANDS[name][0]}")
            assert words == " ".join(module.EXIT_STATUSES.split()), f"{path.relative_to(REPO)}: racktwin {name}"
    for doc, names in EXIT_STATUS_QUOTES.items():
        assert names <= quoted.get(doc, set()), f"{doc}: no quote of the exit statuses of {sorted(names)}"


# ---- the agent's configuration keys and variables ---------------------------------------------------


def config_keys() -> tuple[set[str], set[str]]:
    """(every ``section.key`` and top-level key, the section names) of agent.config.AgentConfig."""
    keys: set[str] = set()
    sections: set[str] = set()
    hints = typing.get_type_hints(AgentConfig)
    for f in dataclasses.fields(AgentConfig):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            sections.add(f.name)
            keys |= {f"{f.name}.{sf.name}" for sf in dataclasses.fields(hint)}
        else:
            keys.add(f.name)
    return keys, sections


def test_every_configuration_key_named_in_the_docs_and_deploy_files_exists() -> None:
    """``broker.tls_ca_file``, ``control.telemetry_deadline_s``, ``broker.tls_*_file``: written as
    ``section.key``, not a file name (``journal.py``, ``journal.sqlite``) nor a host (``broker.example``)."""
    keys, sections = config_keys()
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(sections) + r")\.([a-z_]+\*?[a-z_]*)")
    wrong = []
    for path in documented_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                # broker.example (a host), broker.options() (Python), journal.py, journal.sqlite (files)
                if m.group(2) in ("example", "options", "py", "sqlite"):
                    continue
                key = f"{m.group(1)}.{m.group(2)}"
                exists = (
                    any(re.fullmatch(re.escape(key).replace(r"\*", "[a-z_]+"), k) for k in keys)
                    if "*" in key
                    else key in keys
                )
                if not exists:
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {key}")
    assert not wrong, "\n".join(wrong)


def test_every_racktwin_variable_named_in_the_docs_and_deploy_files_exists() -> None:
    """``RACKTWIN_BROKER_PASSWORD`` in the unit file's header, ``RACKTWIN_MQTT_PASSWORD``; a family
    (``RACKTWIN_BROKER_*``) has at least one member; the misspelling docs/agent.md shows refused is
    followed by its error message."""
    known = set(env_variables()) | set(OTHER_ENV_VARS)
    wrong = []
    for path in documented_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"RACKTWIN_[A-Z0-9_]*", line):
                name, after = m.group(0), line[m.end() : m.end() + 9]
                if after.startswith(("*", "<")) or name == "RACKTWIN_":
                    family = name + ("" if name.endswith("_") else "_")
                    ok = after.startswith("<") or any(k.startswith(family) for k in known)
                elif after.startswith(": unknown"):  # the error message of a misspelled variable
                    ok = name not in known
                else:
                    ok = name in known
                if not ok:
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {name}")
    assert not wrong, "\n".join(wrong)


# ---- benchmarks named in the docs --------------------------------------------------------------------


def test_every_benchmark_option_named_in_the_docs_is_an_option_of_that_script() -> None:
    """``python benchmarks/bench_evaluate.py --faults``: rerunning a published figure starts here."""
    wrong = []
    seen = 0
    for path in documented_files():
        text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
        for m in re.finditer(r"(benchmarks/[a-z_0-9]+\.py)([^`\n;)]*)", text):
            script = REPO / m.group(1)
            assert script.exists(), f"{path.relative_to(REPO)}: {m.group(1)} does not exist"
            source = script.read_text(encoding="utf-8")
            for option in OPTION.findall(m.group(2)):
                seen += 1
                if f'"{option}"' not in source:
                    wrong.append(f"{path.relative_to(REPO)}: {m.group(1)} has no {option}")
    assert seen, "no benchmark option found"
    assert not wrong, "\n".join(wrong)


def test_a_default_written_in_a_usage_line_is_the_parsers() -> None:
    """``racktwin twin sweep-supply [--from-c 20] [--to-c 55] ...`` (docs/twin.md's headings): a number
    written as the value of an optional option in a usage line of a docs page is its default (the
    examples' comments write suggested values: ``[--speed 60]``)."""
    checked = 0
    for path in sorted((REPO / "docs").glob("*.md")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _COMMAND_AT.finditer(line):
                if "/" in m.group(1):
                    continue
                command = f"{m.group(1)} {m.group(2)}" if m.group(2) else m.group(1)
                actions = {o: a for a in PARSERS[command]._actions for o in a.option_strings}
                for option, value in re.findall(r"\[(--[a-z0-9-]+) (-?[0-9]+(?:\.[0-9]+)?)\]", line[m.end() :]):
                    default = actions[option].default
                    where = f"{path.relative_to(REPO)}:{number}: racktwin {command} {option}"
                    assert default is not None and float(default) == float(value), (where, value, default)
                    checked += 1
    assert checked >= 5


# ---- MQTT topics and metrics named in the docs -------------------------------------------------------

_TOPIC_ROW = re.compile(
    r"^\| ((?:`[a-z_/{}]+`(?:, )?)+) \| [^|]+ \| `(racktwin\.[a-z_]+/\d+)` \| (\d) \| \**(yes|no|never)\** \|", re.M
)


def test_the_topic_tables_give_each_topic_its_schema_qos_and_retain_flag() -> None:
    """docs/protocol.md's and the README's topic tables against agent.wire.topics: a bridge is written
    from these tables (topic, schema, QoS, retained)."""

    topics = Topics("site1")
    by_topic: dict[str, Kind] = {}
    for k in Kind:
        try:
            by_topic[topics.of(k, "r0")] = k
        except ValueError:  # a site topic
            by_topic[topics.of(k)] = k
    for name in ("docs/protocol.md", "README.md"):
        rows = _TOPIC_ROW.findall((REPO / name).read_text(encoding="utf-8"))
        named = []
        for cell, schema, qos, retained in rows:
            for path in re.findall(r"`([^`]+)`", cell):
                topic = f"{topics.prefix}/{path.replace('{rack}', 'r0')}"
                assert topic in by_topic, f"{name}: no such topic {path}"
                kind = by_topic[topic]
                named.append(kind)
                assert schema == SCHEMAS[kind], (name, path, schema)
                assert int(qos) == qos_of(kind), (name, path, qos)
                assert (retained == "yes") == retain_of(kind), (name, path, retained)
        assert set(named) == set(Kind), f"{name}'s topic table leaves out {set(Kind) - set(named)}"


def test_every_metric_named_in_the_readme_and_docs_is_exported_with_the_labels_named() -> None:
    """``racktwin_queued_jobs{wait}``, ``racktwin_anomalies{kind="stuck_sensor"}``: docs/agent.md's table is
    tied to the registry with its labels (test_metrics_audit.py); the README and the other pages name
    series too."""
    labels: dict[str, set[str]] = {name: set(names) for name, names in _documented().items()}
    for family in AgentMetrics(["r0"]).registry.collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(set(sample.labels) - {"le"})
        suffixes = {"counter": ("_total",), "histogram": ("", "_bucket", "_sum", "_count")}.get(family.type, ("",))
        for suffix in suffixes:  # a labelled series with no sample yet is still the family's
            labels.setdefault(family.name + suffix, set())
    wrong = []
    seen = 0
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"\b(racktwin_[a-z_]+)(\{([^}]*)\})?", line):
                seen += 1
                name, named = m.group(1), set(re.findall(r"([a-z_]+)(?:=~?\"[^\"]*\")?(?:,\s*|$)", m.group(3) or ""))
                if name not in labels:
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {name} is not exported")
                elif not named <= labels[name]:
                    wrong.append(
                        f"{path.relative_to(REPO)}:{number}: {name} has no label {sorted(named - labels[name])}"
                    )
    assert seen > 50, seen
    assert not wrong, "\n".join(wrong)


def test_the_readmes_folder_table_names_every_module_of_its_folder() -> None:
    """The "How it fits together" table names each module of twin/, models/, agent/ and sim/ (agent's
    `commands/` and `wire/` as folders); agent/job_catchup.py, ahead_refusals.py and durations.py were
    missing from it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)/` \|.*$", readme, flags=re.M)}
    missing = [
        f"{folder}/{module.name}"
        for folder in ("twin", "models", "agent", "sim")
        for module in sorted((REPO / folder).glob("*.py"))
        if module.name not in ("__init__.py", "__main__.py") and f"`{module.name}`" not in rows[folder]
    ]
    assert not missing, missing


# ---- alerts, files and Python names the docs name ---------------------------------------------------

ALERT_RULES = REPO / "deploy" / "prometheus" / "racktwin-alerts.yml"


def shipped_alerts() -> set[str]:
    return set(re.findall(r"^\s*- alert: (\w+)\s*$", ALERT_RULES.read_text(encoding="utf-8"), flags=re.M))


def test_every_alert_named_in_the_docs_and_deploy_files_is_a_shipped_rule() -> None:
    """``alert RacktwinEstimatorBehind``, ``RacktwinGuardCannotHold``: an operator looks the alert up in
    deploy/prometheus/racktwin-alerts.yml (and silences or routes it by that name)."""
    alerts = shipped_alerts()
    assert {"RacktwinGuardCannotHold", "RacktwinEstimatorBehind"} <= alerts, "the rules file moved?"
    wrong = []
    for path in documented_files():
        if path.name.startswith("racktwin-alerts"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            wrong += [
                f"{path.relative_to(REPO)}:{number}: {name} is no alert of {ALERT_RULES.relative_to(REPO)}"
                for name in re.findall(r"\bRacktwin[A-Z]\w*", line)
                if name not in alerts
            ]
    assert not wrong, "\n".join(wrong)


#: a file of the checkout named in the docs: ``tests/agent/test_guard_held_back.py``, ``examples/day-demo.toml``
_REPO_FILE = re.compile(
    r"(?<![\w./-])((?:agent|models|twin|sim|tests|benchmarks|examples|deploy|scripts|docs)/[\w./-]*"
    r"\.(?:py|md|toml|csv|yml|json|sh|service|conf))(?![\w/-])"
)


def test_every_file_of_the_checkout_the_readme_and_docs_name_exists() -> None:
    """A test, script or example a doc points to (``tests/agent/test_level_raises_from_confirmed.py``,
    ``agent/commands/command_signals.py``) is there: a file moved or renamed leaves no dangling name."""
    wrong = []
    seen = 0
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in _REPO_FILE.findall(line):
                seen += 1
                if not (REPO / name).is_file():
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {name} does not exist")
    assert seen > 100, seen
    assert not wrong, "\n".join(wrong)


_PACKAGES = ("agent", "models", "twin", "sim")


def _classes_by_name() -> dict[str, list[type]]:
    """Every class defined in a module of the packages, by its name (a name may be defined twice)."""
    out: dict[str, list[type]] = {}
    for package in _PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
            for name, obj in vars(module).items():
                if isinstance(obj, type) and obj.__module__ == module.__name__:
                    out.setdefault(name, []).append(obj)
    return out


def _has(owner: object, name: str) -> bool:
    """``owner.name`` exists: an attribute, or a field or instance attribute a class declares (a
    dataclass field without a default, ``self.name = ...`` in its methods)."""
    if hasattr(owner, name):
        return True
    if not isinstance(owner, type):
        return False
    for klass in owner.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return True
        try:
            if re.search(rf"\bself\.{name}\b\s*(?::[^=\n]+)?=", inspect.getsource(klass)):
                return True
        except (OSError, TypeError):  # a built-in class
            continue
    return False


def _resolves(name: str, classes: dict[str, list[type]]) -> bool | None:
    """Whether a dotted name resolves: ``agent.applied_states.AppliedStates._disprove`` (a module path,
    then attributes) or ``SiteClock.timelines_left`` (a class of the packages, then attributes); None
    when it is neither (``journal.path``, a configuration key; ``asyncio.wait_for``)."""
    parts = name.split(".")
    if parts[0] in _PACKAGES:
        for i in range(len(parts), 0, -1):
            try:
                owner: object = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                if not _has(owner, attr):
                    return False
                owner = getattr(owner, attr, None)
                if owner is None:  # a field with no class value: nothing further to look up
                    return attr == parts[-1]
            return True
        return False
    if parts[0] not in classes:
        return None
    for klass in classes[parts[0]]:
        owner = klass
        for attr in parts[1:]:
            if owner is None or not _has(owner, attr):
                break
            owner = getattr(owner, attr, None)
        else:
            return True
    return False


#: ``agent.x.Y``, ``Class.method(args) -> T`` at the start of a code span; not a file (``agent.log``)
_PY_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?=[(`])")
_FILE_SUFFIX = re.compile(r"\.(?:py|md|toml|csv|json|sqlite|yml|conf|service|sh|html|env|log|txt|lock)$")


def unresolved_python_names(text: str, classes: dict[str, list[type]]) -> tuple[int, list[tuple[int, str]]]:
    """(names checked, [(line, name)] of those that do not resolve) in a document's text."""
    seen, wrong = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        for m in _PY_NAME.finditer(line):
            name = m.group(1)
            if _FILE_SUFFIX.search(name):
                continue
            ok = _resolves(name, classes)
            if ok is not None:
                seen += 1
                if not ok:
                    wrong.append((number, name))
    return seen, wrong


def test_the_python_name_scanner_finds_a_name_a_move_left_behind() -> None:
    """The rule on what the split of agent/ingest.py (applied states to agent/applied_states.py) left
    for docs/agent.md to update by hand: ``agent.ingest.Ingest._disprove`` moved, the class and module
    that hold it now resolve, and a configuration key or a file is not taken for a Python name."""
    classes = _classes_by_name()
    text = (
        "`agent.ingest.Ingest._disprove`; `agent.applied_states.AppliedStates._disprove`;\n"
        "`Ingest._disproved_copies`, `AppliedStates._disproved_copies`, `SiteClock.timelines_left`;\n"
        "`Controller.step(snapshot) -> Decision`, `Decision.no_such_field`; `journal.path`, `agent.log`"
    )
    assert unresolved_python_names(text, classes) == (
        7,
        [(1, "agent.ingest.Ingest._disprove"), (2, "Ingest._disproved_copies"), (3, "Decision.no_such_field")],
    )


def test_every_python_name_the_readme_and_docs_name_exists() -> None:
    """``agent.round_merger.RoundMerger``, ``SiteClock.extrapolation_corrections``, ``Overlays.held_back``:
    a reader who looks a name up finds it where the docs say, after a module is split or a class
    renamed (``agent/ingest.py`` and ``models/solve.py`` were split on 2026-12-05)."""
    classes = _classes_by_name()
    wrong = []
    seen = 0
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        n, bad = unresolved_python_names(path.read_text(encoding="utf-8"), classes)
        seen += n
        wrong += [f"{path.relative_to(REPO)}:{number}: {name} does not resolve" for number, name in bad]
    assert seen > 100, seen
    assert not wrong, "\n".join(wrong)
