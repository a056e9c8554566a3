"""The agent's configuration: one TOML file, environment variables may override any key.

Example (``examples/agent.toml``)::

    site = "supernode-512.toml"     # site spec, relative to this file
    site_id = "site1"               # the {site} segment of MQTT topics
    mode = "advisory"               # or "enforce"

    [broker]
    url = "mqtt://127.0.0.1:1883"   # mqtts:// for TLS
    username = "agent"
    password_file = "/etc/racktwin/agent.password"

    [control]
    period_s = 15.0
    ...

Environment overrides are named ``RACKTWIN_<SECTION>_<KEY>`` for keys in a section and
``RACKTWIN_<KEY>`` for top-level keys, upper case: ``RACKTWIN_MODE=enforce``,
``RACKTWIN_BROKER_URL=mqtt://10.0.0.5:1883``, ``RACKTWIN_BROKER_PASSWORD=...``,
``RACKTWIN_CONTROL_PERIOD_S=10``. Values are parsed as the field's type. Any other ``RACKTWIN_*``
variable is an error (a misspelled key must not be ignored), except :data:`OTHER_ENV_VARS`, which
other parts of racktwin read. Relative paths (``site``, ``journal.path``, ``broker.password_file``
and the ``broker.tls_*_file`` certificates) are taken from the file's folder, whether the file or a
variable gives them. Every problem is a :class:`twin.tables.SpecError` naming the file (or
variable), the field and what is wrong.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import socket
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from agent.wire.messages import MAX_COMMAND_TTL_S
from agent.wire.topics import SiteLayout, Topics
from twin.plant_types import DEFAULT_PUMP_HOLD_S
from twin.spec import MAX_RACK_POWER_W, SiteSpec, check_file_kind, load_site, site_spec_sections
from twin.tables import SpecError, choices, decode_table, read_toml, rng

ENV_PREFIX = "RACKTWIN_"
#: ``RACKTWIN_*`` variables that are not configuration keys but are read by other parts of racktwin.
#: Any other unknown ``RACKTWIN_*`` variable is an error of the agent's configuration.
OTHER_ENV_VARS: Final = frozenset(
    {
        # agent/broker.py (MOSQUITTO_ENV): the mosquitto binary of the embedded broker that racktwin demo
        # and racktwin sim (without a broker) start, and the tests; "" hides an installed one.
        "RACKTWIN_MOSQUITTO",
        # agent/mqtt_args.py (PASSWORD_ENV, mqtt_options_from_args): the broker password of the commands with
        # --mqtt-* options (racktwin sim) when --mqtt-password-file is not given.
        "RACKTWIN_MQTT_PASSWORD",
    }
)


#: The placeholder of ``broker.client_id`` for this host's name.
CLIENT_ID_HOST: Final = "{host}"


def host_name() -> str:
    """This host's name, reduced to ``A-Z a-z 0-9 _ . -`` (others become ``-``; at most 64)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:64] or "unknown"


@dataclass(frozen=True)
class BrokerConfig:
    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: str | None = None
    password_file: str | None = None
    # The MQTT client id; "{host}" is replaced by this host's name (CLIENT_ID_HOST). The default is one
    # id per host: stable across restarts (the persistent session, like the journal, stays on the host),
    # and two hosts never take a session from each other (docs/agent.md, "Another agent on the site").
    client_id: str = "racktwin-agent-{host}"
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    keepalive_s: float = field(default=30.0, metadata=rng(5.0, 3600.0))
    # Keep the MQTT session across restarts (clean_session=false with a fixed client_id): the broker
    # queues QoS 1 acks and job events while the agent is away.
    persistent_session: bool = True

    @property
    def host(self) -> str:
        return url_host(urlsplit(self.url).hostname) or "127.0.0.1"

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (8883 if parts.scheme == "mqtts" else 1883)

    @property
    def tls(self) -> bool:
        # mqtts:// only: a CA file or a client certificate with an mqtt:// URL is refused (_check), as
        # racktwin sim's --mqtt-ca-file with --broker mqtt://... (agent/mqtt_args.py)
        return urlsplit(self.url).scheme == "mqtts"

    def resolved_client_id(self) -> str:
        """The client id with ``{host}`` replaced by this host's name."""
        return self.client_id.replace(CLIENT_ID_HOST, host_name())

    def resolved_password(self) -> str | None:
        """The password, read from ``password_file`` when that is set (first line, stripped)."""
        if self.password_file is None:
            return self.password
        lines = Path(self.password_file).read_text(encoding="utf-8-sig").splitlines()
        return lines[0].strip() if lines else ""


@dataclass(frozen=True)
class ControlConfig:
    # How often the controller decides (s, site time). Solves must finish within solve_deadline_s.
    period_s: float = field(default=15.0, metadata=rng(0.05, 3600.0))
    solve_deadline_s: float = field(default=8.0, metadata=rng(0.01, 3600.0, lo_open=True))
    # Relative MIP gap of the DVFS solve (on the loss scale, see docs/models.md).
    mip_rel_gap: float = field(default=1e-3, metadata=rng(0.0, 0.5))
    # Plans keep every rack this far under its power limit (W), every die this far under its limit (K).
    rack_margin_w: float = field(default=1000.0, metadata=rng(0.0, MAX_RACK_POWER_W))
    die_margin_k: float = field(default=2.0, metadata=rng(0.0, 50.0))
    # A rack whose telemetry is older than this is stale and goes to fail-safe caps (s).
    telemetry_deadline_s: float = field(default=30.0, metadata=rng(0.1, 86400.0))
    # A sensor reporting exactly the same value this many times in a row is flagged stuck.
    stuck_after_readings: int = field(default=20, metadata=rng(3, 100_000))
    # A rack stays at fail-safe caps this long after its telemetry is fresh again (s).
    failsafe_hold_s: float = field(default=30.0, metadata=rng(0.0, 86400.0))
    # Blind fail-safe racks (telemetry stale, or frozen as a whole) also run their cards, and every job
    # touching them, at the slowest DVFS level (besides the power-limit caps). A rack at fail-safe caps
    # for one stuck card keeps its levels.
    failsafe_lowest_level: bool = True
    # The lowest power limit a card accepts (W; H100 SXM: 200 W).
    min_power_limit_w: float = field(default=200.0, metadata=rng(1.0, 5000.0))
    # Commands expire this long after they are issued (s); the rack ignores them after that.
    command_ttl_s: float = field(default=30.0, metadata=rng(0.1, MAX_COMMAND_TTL_S))
    # Unacknowledged commands are re-sent at most this many times (before they expire).
    command_retries: int = field(default=2, metadata=rng(0, 100))
    # Rate limit: a job's DVFS level moves by at most this many levels per decision toward a faster level.
    max_level_raise_per_period: int = field(default=8, metadata=rng(1, 64))
    # Rate limit: the supply set-point moves by at most this much per decision (K).
    max_setpoint_step_k: float = field(default=5.0, metadata=rng(0.0, 100.0))
    # The set-point is re-optimized this often (s, site time); in between it is held.
    setpoint_interval_s: float = field(default=300.0, metadata=rng(0.0, 86400.0))
    # An idle card's low-power state is not toggled again within this time (no flapping; s).
    low_power_hold_s: float = field(default=60.0, metadata=rng(0.0, 86400.0))
    # Cards kept awake (not in low-power idle) per supernode for queued work.
    idle_reserve_cards: int = field(default=16, metadata=rng(0, 1_000_000))
    # Opt-in (0 = off): the wake tie-break, W of IT power the plan charges for each idle card it keeps
    # awake on a rack beyond the idle cards awake there now (CycleProblem.wake_tie_w), so that where racks
    # tie the ready reserve stays on the cards awake now instead of moving between racks (a card slept
    # here, another woken there). 1 W breaks the ties (racks differ by fractions of a watt in a card's wake
    # power) and costs no job's level (a level step is worth tens of W). Measured at 1 W on the nominal
    # day: 17.9% fewer sleep/wake transitions (46 cards swapped in one decision vs 1,369), but 0.147% more
    # energy per unit of work (a reserve that stays put keeps its idle host on); benchmarks/
    # results-evaluation.md, "Low-power churn with the wake tie-break".
    reserve_wake_tie_w: float = field(default=0.0, metadata=rng(0.0, 10.0))
    # Wall-clock seconds per site-time second (1 for real racks; 1/speed against an accelerated simulator).
    time_scale: float = field(default=1.0, metadata=rng(1e-6, 1.0))
    # Follow the site clock's rate as the telemetry timestamps show it (time_scale is the starting guess).
    infer_time_scale: bool = True
    # Coolant supply set-point control (false keeps the site's fixed set-point).
    control_setpoint: bool = True
    # Rack-loop pump speed control (agent.pumps; false keeps every pump at full speed).
    control_pump_speed: bool = True
    # Speeds the pump chooser considers, evenly from full speed down to the site's lowest.
    pump_speed_steps: int = field(default=9, metadata=rng(2, 100))
    # A slowed pump's speed is re-sent this often (s, site time), at the first decision this long after
    # the last command for it: the plant returns a pump to full speed when no command renews it (its
    # pump_hold_s, DEFAULT_PUMP_HOLD_S = 60 s in the simulator; --check-config warns when renewals may
    # come that late: up to pump_renew_s + period_s after a command sent at a job event's decision).
    pump_renew_s: float = field(default=20.0, metadata=rng(0.1, 86400.0))
    # Host power-down (agent.hosts; only where the site spec has rack.hosts_per_rack > 0): a host
    # none of whose cards has run a job for host_off_after_s is powered off, keeping
    # host_reserve_per_supernode idle hosts on for arriving jobs. Unset (the default): the break-even
    # time of a power cycle, SiteSpec.host_break_even_s() (311 s on the example site; waiting it
    # spends at most twice the energy of the best choice in hindsight). AWS PCS scales a Slurm node
    # down after 600 s (scaleDownIdleTimeInSeconds).
    control_host_power: bool = True
    host_off_after_s: float | None = field(default=None, metadata=rng(0.0, 1.0e7))
    host_reserve_per_supernode: int = field(default=2, metadata=rng(0, 100_000))
    # Hosts for a queued job are powered on this long (s) before its expected start, on top of their
    # boot; hosts waiting for a start further away (a big job's reservation) may go off meanwhile.
    host_boot_lead_s: float = field(default=60.0, metadata=rng(0.0, 1.0e7))
    # Job placement for queued jobs (false leaves placement to the site's scheduler).
    control_placement: bool = True
    placement_method: str = field(default="auto", metadata=choices("auto", "greedy", "milp"))
    # A queued job that has waited this long gets a reservation: jobs behind it are placed only where
    # they do not delay it (EASY backfilling, agent.backfill; no starvation; s).
    placement_backfill_wait_s: float = field(default=1800.0, metadata=rng(0.0, 1.0e7))
    # Decide again at once (at most every min_replan_interval_s) when a job starts, ends, is requeued,
    # resumes computing or (with control_placement) is submitted.
    replan_on_job_events: bool = True
    min_replan_interval_s: float = field(default=2.0, metadata=rng(0.0, 3600.0))
    # Opt-in (0 = off): how long a job that resumes computing runs at the level it was given while
    # it did not compute (s; the resume shows at the next reading, the new level takes effect after
    # the card's DVFS latency: 1 s in the simulator). A job out of compute for t s is then valued at
    # resume_lag_s / t of a computing job, so it keeps its clock until the power a slower level would
    # save outweighs the work that level costs at the resume (a ski-rental rule, as for hosts). Off,
    # a job that stops computing gets its slowest level (meeting its SLO) at once. Measured on the
    # nominal day: at 1 s 0.13 points less saving for 0.007% more work (a loss at the default prices),
    # at 10 s 0.34 points less for 0.026% more; side by side over three workloads a loss of 2.3-4.0 a
    # day at the default prices; benchmarks/results-evaluation.md,
    # "Holding the clock through pauses".
    resume_lag_s: float = field(default=0.0, metadata=rng(0.0, 3600.0))
    # How long before a checkpoint's expected end (its start plus the job's declared
    # checkpoint_duration_s) a job in a checkpoint gets its computing level back (s; 0 = off), so
    # that it resumes at its clock instead of running its first second at the slow level it had
    # while it wrote. The agent decides at once (no solve, as on a job event) when a checkpoint comes
    # within the lead of its end: a few seconds suffice (the plant applies a level at its next 1-s
    # step; through the simulator a command lands a second later). A checkpoint that overruns its
    # expected end by more than the lead is slowed again. Measured at 3 s over three workloads:
    # 0.01-0.12 points less saving for 0.001-0.015% more work, +0.1 to +0.7 a day at the default
    # prices; off by default, as it relies on jobs' declared checkpoint durations (docs/agent.md).
    checkpoint_end_lead_s: float = field(default=0.0, metadata=rng(0.0, 3600.0))

    def host_idle_off_s(self, site: SiteSpec) -> float:
        """How long a host stays idle before it goes off: ``host_off_after_s``, else the site's
        break-even time of a power cycle (``SiteSpec.host_break_even_s``)."""
        return self.host_off_after_s if self.host_off_after_s is not None else site.host_break_even_s()


@dataclass(frozen=True)
class PricesConfig:
    # Price of facility energy and value of a top-clock card-hour of training, same currency.
    energy_per_kwh: float = field(default=0.15, metadata=rng(0.0, 100.0))
    card_hour_value: float = field(default=2.0, metadata=rng(0.0, 10_000.0))
    # Each kWh of facility overhead above the PUE target (soft constraint; keep it near 2x energy_per_kwh).
    pue_penalty_per_kwh: float = field(default=0.30, metadata=rng(0.0, 100.0))


@dataclass(frozen=True)
class JournalConfig:
    path: str = "racktwin-journal.sqlite"
    # Calibrated parameters (thermal resistance, leakage scale per card) are journaled this often (s, site time).
    calibration_every_s: float = field(default=300.0, metadata=rng(1.0, 86400.0))
    # Decisions and closed commands older than this (days, wall clock) are deleted once an hour; open
    # commands and the newest decision are always kept. 0 keeps everything.
    keep_days: float = field(default=30.0, metadata=rng(0.0, 3650.0))


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = field(default=9464, metadata=rng(0, 65535))  # 0 = disabled


@dataclass(frozen=True)
class LogConfig:
    level: str = field(default="info", metadata=choices("debug", "info", "warning", "error"))
    format: str = field(default="json", metadata=choices("json", "text"))


@dataclass(frozen=True)
class AgentConfig:
    site: str
    site_id: str = "site1"
    mode: str = field(default="advisory", metadata=choices("advisory", "enforce"))
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    prices: PricesConfig = field(default_factory=PricesConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)


@dataclass(frozen=True)
class LoadedConfig:
    """A validated configuration with its site spec loaded and paths resolved."""

    config: AgentConfig
    site: SiteSpec
    source: str
    overrides: tuple[str, ...]  # the environment variables that changed a value


def _env_value(hint: Any, raw: str) -> Any:
    """Parse an environment string as the field's type (validation follows in decode_table)."""
    origin = typing.get_origin(hint)
    if origin is not None:  # X | None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if args else str
    if hint is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        return raw
    if hint is int:
        try:
            return int(raw)
        except ValueError:
            return raw
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            return raw
    return raw


def env_variables() -> dict[str, str]:
    """Every override variable and the key it sets: ``RACKTWIN_CONTROL_PERIOD_S`` -> ``control.period_s``."""
    names: dict[str, str] = {}
    hints = typing.get_type_hints(AgentConfig)
    for f in dataclasses.fields(AgentConfig):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            for sf in dataclasses.fields(hint):
                names[f"{ENV_PREFIX}{f.name}_{sf.name}".upper()] = f"{f.name}.{sf.name}"
        else:
            names[f"{ENV_PREFIX}{f.name}".upper()] = f.name
    return names


def apply_env_overrides(data: dict[str, Any], env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Overlay ``RACKTWIN_*`` variables on parsed TOML data; returns the new data and the names used."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    used: list[str] = []
    hints = typing.get_type_hints(AgentConfig)
    for f in dataclasses.fields(AgentConfig):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            sub_hints = typing.get_type_hints(hint)
            for sf in dataclasses.fields(hint):
                name = f"{ENV_PREFIX}{f.name}_{sf.name}".upper()
                if name in env:
                    section = out.setdefault(f.name, {})
                    if not isinstance(section, dict):
                        continue
                    section[sf.name] = _env_value(sub_hints[sf.name], env[name])
                    used.append(name)
        else:
            name = f"{ENV_PREFIX}{f.name}".upper()
            if name in env:
                out[f.name] = _env_value(hint, env[name])
                used.append(name)
    return out, used


def check_env_names(env: Mapping[str, str], source: str) -> None:
    """Refuse a ``RACKTWIN_*`` variable that sets no configuration key (a misspelled override would
    otherwise be ignored silently); :data:`OTHER_ENV_VARS` are left alone."""
    known = env_variables()
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or name in known or name in OTHER_ENV_VARS:
            continue
        if upper in known or upper in OTHER_ENV_VARS:
            raise SpecError(source, name, f"unknown environment variable; did you mean {upper}? (names are upper case)")
        suffixes = {k[len(ENV_PREFIX) :]: k for k in (*known, *OTHER_ENV_VARS)}
        close = difflib.get_close_matches(upper[len(ENV_PREFIX) :], list(suffixes), n=1, cutoff=0.6)
        hint = (
            f"did you mean {suffixes[close[0]]}?"
            if close
            else f"the overrides are {ENV_PREFIX}<SECTION>_<KEY> for the keys of docs/agent.md (Configuration)"
        )
        raise SpecError(source, name, f"unknown environment variable, it sets no configuration key; {hint}")


def _under(base: Path, value: str | None) -> str | None:
    """``value`` as a path, a relative one taken from ``base``."""
    if value is None:
        return None
    p = Path(value)
    return str(p if p.is_absolute() else base / p)


def _resolve_paths(cfg: AgentConfig, base: Path) -> AgentConfig:
    """The configuration with every relative path taken from ``base`` (the file's folder)."""
    b = cfg.broker
    broker = dataclasses.replace(
        b,
        password_file=_under(base, b.password_file),
        tls_ca_file=_under(base, b.tls_ca_file),
        tls_cert_file=_under(base, b.tls_cert_file),
        tls_key_file=_under(base, b.tls_key_file),
    )
    return dataclasses.replace(
        cfg,
        site=str(_under(base, cfg.site)),
        broker=broker,
        journal=dataclasses.replace(cfg.journal, path=str(_under(base, cfg.journal.path))),
    )


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> LoadedConfig:
    """Read, override from the environment, validate, and load the site spec it names."""
    cfg, label, used = _decoded(path, env)
    try:
        site = load_site(cfg.site)
    except SpecError as exc:
        raise SpecError(label, "site", str(exc)) from None
    _check(cfg, site, label)
    return LoadedConfig(config=cfg, site=site, source=str(path), overrides=tuple(used))


def journal_path_of(path: str | Path, env: Mapping[str, str] | None = None) -> str:
    """The journal a configuration names (``journal.path``, environment overrides included, relative
    to the file's folder), without the service's checks: a reader of the journal (``racktwin
    journal``) needs neither write access to it nor the broker's secrets, nor the site spec."""
    return _decoded(path, env)[0].journal.path


def _decoded(path: str | Path, env: Mapping[str, str] | None) -> tuple[AgentConfig, str, list[str]]:
    """The file read, overridden from the environment, decoded (types and ranges) and its relative
    paths resolved; with the label errors name it by and the variables that overrode it."""
    source = str(path)
    environ = os.environ if env is None else env
    data = read_toml(path)
    if sections := site_spec_sections(data):
        raise SpecError(
            source,
            "",
            f"this looks like a site spec ({', '.join(f'[{k}]' for k in sections)}), not an agent configuration: "
            "name it in the configuration's `site` key (examples/agent.toml)",
        )
    check_file_kind(data, "agent configuration", source)
    check_env_names(environ, source)
    data, used = apply_env_overrides(data, environ)
    label = source + (f" (with {', '.join(used)})" if used else "")
    cfg = decode_table(AgentConfig, data, label)
    return _resolve_paths(cfg, Path(path).resolve().parent), label, used


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def check_control(c: ControlConfig, site: SiteSpec | None, source: str, *, prefix: str = "control") -> None:
    """Cross-field checks of a ``[control]`` table (and, given the site, that its margins leave room);
    raises :class:`SpecError` naming ``source`` and the field (``prefix.key``; ``prefix=""`` for bare keys)."""

    def fail(name: str, problem: str) -> SpecError:
        return SpecError(source, _join(prefix, name), problem)

    period = f"{_join(prefix, 'period_s')} ({c.period_s:g} s)"
    if c.solve_deadline_s >= c.period_s:
        raise fail("solve_deadline_s", f"must be shorter than {period} so that no period is skipped")
    if c.telemetry_deadline_s < c.period_s:
        raise fail("telemetry_deadline_s", f"must be at least {period}")
    if c.min_replan_interval_s > c.period_s:
        raise fail("min_replan_interval_s", f"must not exceed {period}")
    if c.command_ttl_s < c.period_s:
        raise fail("command_ttl_s", f"must be at least {period}")
    fixed = f"with {_join(prefix, 'control_setpoint')} = true the set-point never moves"
    off = f"set {_join(prefix, 'control_setpoint')} = false to keep the site's set-point"
    if c.control_setpoint and c.max_setpoint_step_k == 0:
        raise fail("max_setpoint_step_k", f"0 K: {fixed}; {off}, or allow a step > 0 K")
    if site is None:
        return
    fac = site.facility
    gap_k = min((abs(o - fac.supply_temp_c) for o in fac.supply_temp_options_c if o != fac.supply_temp_c), default=0.0)
    if c.control_setpoint and 0 < c.max_setpoint_step_k < gap_k - 1e-9:  # the planner's tolerance (agent.planning)
        raise fail(
            "max_setpoint_step_k",
            f"{c.max_setpoint_step_k:g} K is less than the {gap_k:g} K from the site's set-point "
            f"(facility.supply_temp_c, {fac.supply_temp_c:g} deg C) to its nearest other option: {fixed}; "
            f"{off}, or allow a step of at least {gap_k:g} K",
        )
    margin_problem = site.rack_margin_problem(c.rack_margin_w)
    if margin_problem is not None:
        raise fail("rack_margin_w", margin_problem)
    if c.min_power_limit_w > site.card.power_limit_w:
        raise fail(
            "min_power_limit_w",
            f"must not exceed the site's card power limit (card.power_limit_w, {site.card.power_limit_w:g} W "
            f"for {site.card.model}), got {c.min_power_limit_w:g} W",
        )
    rack_limit = float(site.rack_power_limits_w().min())
    floor_w = site.rack.host_overhead_w + site.cards_per_rack * c.min_power_limit_w + c.rack_margin_w
    if floor_w > rack_limit:
        raise fail(
            "min_power_limit_w",
            f"{site.cards_per_rack} cards at {c.min_power_limit_w:g} W, the hosts' {site.rack.host_overhead_w:g} W "
            f"and rack_margin_w {c.rack_margin_w:g} W make {floor_w:g} W, over the site's rack power limit "
            f"({rack_limit:g} W): the guard's last resort (every card at the fail-safe power limit) could not "
            "keep a full rack within it",
        )


#: a broker host outside brackets: an IPv4 address or a host name (``_`` too: container names have it)
#: of dot-separated labels of 1-63 characters (a trailing dot ends a fully qualified name); 253 in all
#: (``_broker_host_ok``). An empty or longer label made the resolver raise UnicodeError, which the
#: agent logged as an unexpected error with its traceback at every reconnect.
_BROKER_HOST = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?")


def _ascii_host(host: str) -> str:
    """``host`` as DNS looks it up: an internationalized name in its ``xn--`` form (the socket module
    encodes it so when it connects), anything else as it is."""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def _broker_host_ok(host: str) -> bool:
    """Whether ``host`` (ASCII, outside brackets) is an IPv4 address or a host name DNS can look up."""
    return len(host.removesuffix(".")) <= 253 and _BROKER_HOST.fullmatch(host) is not None


def url_host(hostname: str | None) -> str | None:
    """The host a URL names (``urlsplit(url).hostname``) as a socket takes it: an IPv6 zone written as
    RFC 6874 has it, ``[fe80::1%25eth0]`` (``%25`` is the URL encoding of ``%``), is ``fe80::1%eth0``;
    one written bare, ``[fe80::1%eth0]`` (as browsers and curl also take it), is kept. A bare zone that
    begins with 25 is read as RFC 6874's (``%251`` is zone 1): write it ``%2525...``."""
    if hostname is not None and ":" in hostname:
        addr, percent, zone = hostname.partition("%")
        if percent and zone.startswith("25"):
            return f"{addr}%{zone[2:]}"
    return hostname


def empty_zone_problem(url: str, hostname: str | None) -> str | None:
    """An IPv6 zone with nothing after its '%' (``[fe80::1%25]``) names no interface: why ``url``,
    whose host is ``hostname`` (``urlsplit(url).hostname``), is refused (None: it is not)."""
    if str(url_host(hostname)).endswith("%"):
        return f"no IPv6 zone after its '%25' in {url!r}: e.g. mqtt://[fe80::1%25eth0]:1883"
    return None


def broker_url_problem(url: str, *, credentials: str) -> str | None:
    """What keeps ``url`` from being a broker URL (None: nothing): ``mqtt://`` or ``mqtts://``, a
    host, an optional port within 1..65535, nothing else; user name and password go in their own
    settings, which ``credentials`` names. The agent's ``broker.url``, ``racktwin sim --broker``
    and ``racktwin demo --broker`` take the same URLs, and so does ``MqttOptions.from_url`` (which
    also takes a user name and password in the URL)."""
    form = "expected mqtt://host:port or mqtts://host:port"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed or invalid [IPv6] address
        return f"not a URL: {url!r} ({exc}): {form}"
    if parts.scheme not in ("mqtt", "mqtts"):
        return f"must start with mqtt:// or mqtts:// (no other scheme), got {url!r}"
    if parts.username is not None or parts.password is not None:
        return f"no user name or password in the URL, got {url!r}: use {credentials}"
    if not parts.hostname:
        return f"no host in {url!r}: {form}"
    if "[" not in parts.netloc and not _broker_host_ok(_ascii_host(parts.hostname)):  # urlsplit checks [IPv6]
        return (
            f"bad host {parts.hostname!r} in {url!r}: an IP address or a host name (letters, digits, '.', '-', "
            "'_'; labels of 1 to 63 characters between the dots, 253 characters in all)"
        )
    if (problem := empty_zone_problem(url, parts.hostname)) is not None:
        return problem
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"bad port in {url!r}: must be a number within 1..65535"
    if parts.path not in ("", "/"):
        return f"path not allowed in {url!r} ({parts.path!r}): {form}"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return f"query or fragment not allowed in {url!r}: {form}"
    return None


def _check_broker_url(url: str, source: str) -> None:
    credentials = "broker.username and broker.password_file (or RACKTWIN_BROKER_PASSWORD)"
    if (problem := broker_url_problem(url, credentials=credentials)) is not None:
        raise SpecError(source, "broker.url", problem)


def file_reason(path: str, *, regular: bool = True) -> str | None:
    """Why ``path`` cannot be read as a file, in words (None: it can): ``file not found``, ``is a folder,
    not a file``, ``not a regular file`` (unless ``regular`` is False, which lets a pipe through: a
    password file given as ``<(pass show mqtt)``), ``cannot read (permission denied)``. The agent's
    configuration and the other commands' file options (``agent.mqtt_args``) say it alike."""
    p = Path(path)
    if not p.exists():
        return "file not found"
    if p.is_dir():
        return "is a folder, not a file"
    if regular and not p.is_file():
        return "not a regular file"
    if not os.access(p, os.R_OK):
        return "cannot read (permission denied)"
    return None


def _file_problem(path: str) -> str | None:
    """What keeps ``path`` from being read as a file (None: nothing): :func:`file_reason`, the path after it."""
    why = file_reason(path)
    return None if why is None else f"{why}: {path}"


#: file systems where the agent cannot keep a journal (no regular files can be created there), though
#: ``os.access`` says their folders are writable for root
_PSEUDO_FILE_SYSTEMS: Final = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "pstore", "bpf",
     "devpts", "mqueue", "efivarfs", "fusectl", "binfmt_misc", "autofs", "nsfs"}
)  # fmt: skip


def _file_system_type(path: Path) -> str | None:
    """The type of the file system ``path`` (an existing folder) is on, from /proc/self/mountinfo
    (None where that cannot be read: not Linux)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        where = os.path.realpath(path)
    except OSError:
        return None
    best, kind = "", None
    for line in lines:
        fields, sep, rest = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5 or not rest.split():
            continue
        mount = parts[4].encode().decode("unicode_escape") if "\\" in parts[4] else parts[4]
        inside = where == mount or where.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, rest.split()[0]
    return kind


_SQLITE_HEADER = b"SQLite format 3\x00"


def _file_start(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of a file (fewer if it is shorter; empty if it cannot be read)."""
    try:
        with path.open("rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _journal_path_problem(path: str) -> str | None:
    """What keeps the service from keeping its journal at ``path`` (None: nothing). Nothing is
    created: the nearest existing folder must let the agent create files (the journal, its ``-wal``,
    ``-shm`` and ``.lock`` files next to it, and the folders on the way); an existing path must be a
    regular file it can read and write."""
    p = Path(path)
    if p.exists():
        if p.is_dir():
            return f"is a folder, not a file: {path}"
        if not p.is_file():
            return f"not a regular file: {path}"
        if not os.access(p, os.R_OK | os.W_OK):
            return f"cannot read and write it (permission denied): {path}"
        if (header := _file_start(p, len(_SQLITE_HEADER))) and header != _SQLITE_HEADER:
            return f"not a journal (an SQLite database): {path}"
        folder = p.parent
    else:
        folder = next((a for a in p.parents if a.exists() or a.is_symlink()), Path("/"))
        if not folder.is_dir():
            return f"{folder} is a file, not a folder: {path} cannot be created"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create files in {folder} (permission denied or read-only): {path}"
    kind = _file_system_type(folder)
    if kind in _PSEUDO_FILE_SYSTEMS:
        return f"{folder} is on a {kind} file system, where no journal can be kept: {path}"
    return None


def _check(cfg: AgentConfig, site: SiteSpec, source: str) -> None:
    try:
        Topics(cfg.site_id)
    except ValueError as exc:
        raise SpecError(source, "site_id", str(exc)) from None
    try:
        SiteLayout.from_spec(site, site=cfg.site_id)
    except ValueError as exc:
        raise SpecError(source, "site", f"{cfg.site}: {exc}") from None
    check_control(cfg.control, site, source)
    b = cfg.broker
    _check_broker_url(b.url, source)
    if b.password is not None and b.password_file is not None:
        raise SpecError(source, "broker.password_file", "set either broker.password or broker.password_file")
    if (b.password is not None or b.password_file is not None) and b.username is None:
        raise SpecError(source, "broker.username", "a password needs a user name")
    if b.password_file is not None:
        problem = _file_problem(b.password_file)
        if problem is None:
            try:
                if not b.resolved_password():
                    problem = f"the first line (the password) is empty: {b.password_file}"
            except UnicodeDecodeError:
                problem = f"not a UTF-8 text file: {b.password_file}"
            except OSError as exc:
                problem = f"cannot read: {exc.strerror or exc}: {b.password_file}"
        if problem is not None:
            raise SpecError(source, "broker.password_file", problem)
    for name in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        value = getattr(b, name)
        if value is not None and (problem := _file_problem(value)) is not None:
            raise SpecError(source, f"broker.{name}", problem)
    if (b.tls_cert_file is None) != (b.tls_key_file is None):
        raise SpecError(
            source, "broker.tls_cert_file", "a client certificate needs both tls_cert_file and tls_key_file"
        )
    for name in ("tls_ca_file", "tls_cert_file"):
        if getattr(b, name) is not None and urlsplit(b.url).scheme != "mqtts":
            raise SpecError(
                source,
                f"broker.{name}",
                f"needs an mqtts:// broker.url (TLS, port 8883 by default): {b.url} is plain MQTT",
            )
    if b.keepalive_s != int(b.keepalive_s):  # MQTT's keepalive is a whole number of seconds
        raise SpecError(source, "broker.keepalive_s", f"must be a whole number of seconds, got {b.keepalive_s:g}")
    if not b.client_id.strip():
        raise SpecError(source, "broker.client_id", "empty: give an id (the default is racktwin-agent-{host})")
    if "{" in b.client_id.replace(CLIENT_ID_HOST, "") or "}" in b.client_id.replace(CLIENT_ID_HOST, ""):
        raise SpecError(source, "broker.client_id", f"{b.client_id!r}: the only placeholder is {CLIENT_ID_HOST}")
    if (problem := _journal_path_problem(cfg.journal.path)) is not None:
        raise SpecError(source, "journal.path", problem)
    if (problem := _listen_host_problem(cfg.http.host)) is not None:
        raise SpecError(source, "http.host", problem)


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _listen_host_problem(host: str) -> str | None:
    """Why ``host`` cannot be an address to listen on (None: it can): an IP address or a host name
    (RFC 1123 labels). Only the form is checked here; a name that does not resolve fails at start."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if host and len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels):
        return None
    return f"{host!r} is neither an IP address nor a host name (e.g. 127.0.0.1, 0.0.0.0 for every interface, ::1)"


def _hosts_line(c: ControlConfig, site: SiteSpec) -> str:
    if not site.hosts_managed:
        return "always on (the site spec has no rack.hosts_per_rack)"
    if not c.control_host_power:
        return "left on (control_host_power = false)"
    why = "host_off_after_s" if c.host_off_after_s is not None else "the break-even time of a power cycle"
    line = (
        f"idle hosts off after {c.host_idle_off_s(site):.0f} s ({why}), "
        f"{c.host_reserve_per_supernode} idle per supernode kept on, "
        f"booted {c.host_boot_lead_s:g} s before a queued job's expected start"
    )
    needed = -(-c.idle_reserve_cards // site.cards_per_host)
    if needed > c.host_reserve_per_supernode:
        line += (
            f"\n                warning: idle_reserve_cards ({c.idle_reserve_cards} per supernode) needs {needed} idle "
            f"hosts on, host_reserve_per_supernode keeps {c.host_reserve_per_supernode}: the reserve's cards on "
            "the other idle hosts sleep with them"
        )
    return line


def _pumps_line(c: ControlConfig) -> str:
    """The pump speed control, with a warning when a slowed pump may not be renewed within the
    simulator's hold (:data:`twin.plant_types.DEFAULT_PUMP_HOLD_S`). A renewal goes at the first
    decision ``pump_renew_s`` or more after the last command for the pump (agent.command_diff).
    Decisions come on the grid of ``period_s`` and, between, at job events (agent.service: an event's
    decision leaves the grid where it was), so after a command at an event's decision the first
    decision ``pump_renew_s`` later may be a grid's almost a whole period after that: a renewal may
    wait up to ``pump_renew_s + period_s`` after the last command (on the grid alone, ``pump_renew_s``
    rounded up to whole periods)."""
    if not c.control_pump_speed:
        return "full speed (control_pump_speed = false)"
    latest_s = c.pump_renew_s + c.period_s
    line = (
        f"rack-loop speeds chosen among {c.pump_speed_steps} steps, a slowed pump's speed re-sent at the first "
        f"decision {c.pump_renew_s:g} s after the last command for it: up to {latest_s:g} s after it "
        f"(pump_renew_s + period_s: decisions every {c.period_s:g} s, and at job events in between)"
    )
    if latest_s < DEFAULT_PUMP_HOLD_S:
        return line
    renew = f"pump_renew_s ({c.pump_renew_s:g} s)"
    if c.pump_renew_s < DEFAULT_PUMP_HOLD_S:
        renew += (
            f" at decisions every period_s ({c.period_s:g} s) and at job events renews a slowed pump up to "
            f"{latest_s:g} s after a command, which"
        )
    return (
        line + f"\n                warning: {renew} is not under the simulator's pump hold (pump_hold_s, "
        f"{DEFAULT_PUMP_HOLD_S:g} s): a slowed pump returns to full speed between renewals (a real site's "
        "CDU hold may differ: renew well within it)"
    )


def _pue_penalty_warning(prices: PricesConfig, site: SiteSpec) -> str:
    """A warning line when the PUE penalty is so high that a plan may wake idle cards only to lower
    the PUE ratio: above ``energy_per_kwh * b / (pue_target - b)``, b being the marginal facility W
    per IT W (``models.problem.Prices``); b is at least 1, where that bound is lowest."""
    if site.pue_target <= 1.0:
        return ""
    bound = prices.energy_per_kwh / (site.pue_target - 1.0)
    if prices.pue_penalty_per_kwh <= bound:
        return ""
    return (
        f"\n                warning: pue_penalty_per_kwh ({prices.pue_penalty_per_kwh:g}) is above energy_per_kwh / "
        f"(PUE target - 1) = {bound:.3g}: in mild weather a plan may wake idle cards only to lower the PUE "
        "ratio (keep it near 2x energy_per_kwh)"
    )


def explain(loaded: LoadedConfig) -> str:
    """A human-readable account of a valid configuration (for ``racktwin agent --check-config``)."""
    cfg, site = loaded.config, loaded.site
    c = cfg.control
    lines = [
        f"{loaded.source}: OK",
        f"  site          {cfg.site} ({site.name}: {site.n_cards} cards in {site.n_racks} racks, "
        f"{site.rack.power_limit_w / 1e3:g} kW limit per rack, PUE target {site.pue_target:g})",
        f"  topics        racktwin/v1/{cfg.site_id}/...",
        f"  mode          {cfg.mode}"
        + ("  (commands are published)" if cfg.mode == "enforce" else "  (advice only, no command is sent)"),
        f"  broker        {cfg.broker.url} as {cfg.broker.username or '(anonymous)'}"
        + (" with TLS" if cfg.broker.tls else "")
        + f", client id {cfg.broker.resolved_client_id()}"
        + (" (persistent session)" if cfg.broker.persistent_session else " (clean session)"),
        f"  control       every {c.period_s:g} s, solve deadline {c.solve_deadline_s:g} s, "
        f"rack margin {c.rack_margin_w:g} W, die margin {c.die_margin_k:g} K",
        f"  fail-safe     racks silent for {c.telemetry_deadline_s:g} s or with a stuck sensor get conservative caps"
        f" (held {c.failsafe_hold_s:g} s after telemetry returns; a stuck card's rack keeps its levels)",
        f"  rate limits   levels up by at most {c.max_level_raise_per_period} per decision, set-point by "
        f"{c.max_setpoint_step_k:g} K, low-power state held {c.low_power_hold_s:g} s",
        "  set-point     " + (f"re-optimized every {c.setpoint_interval_s:g} s" if c.control_setpoint else "fixed"),
        "  placement     "
        + (
            f"queued jobs placed by the agent ({c.placement_method})"
            if c.control_placement
            else "left to the site's scheduler"
        ),
        "  pumps         " + _pumps_line(c),
        "  hosts         " + _hosts_line(c, site),
        f"  commands      expire after {c.command_ttl_s:g} s, at most {c.command_retries} retries",
        f"  prices        {cfg.prices.energy_per_kwh:g} per kWh, {cfg.prices.card_hour_value:g} per card-hour, "
        f"{cfg.prices.pue_penalty_per_kwh:g} per kWh above the PUE target" + _pue_penalty_warning(cfg.prices, site),
        f"  journal       {cfg.journal.path} ("
        + (f"decisions kept {cfg.journal.keep_days:g} days)" if cfg.journal.keep_days > 0 else "everything kept)"),
        "  http          " + (f"http://{cfg.http.host}:{cfg.http.port}/metrics" if cfg.http.port else "disabled"),
    ]
    if c.time_scale != 1.0:
        lines.append(f"  time scale    {c.time_scale:g} wall s per site s (accelerated simulator)")
    if c.reserve_wake_tie_w > 0.0:
        lines.append(
            f"  wake ties     {c.reserve_wake_tie_w:g} W per idle card woken: the ready reserve stays on the idle "
            "cards awake now where racks tie (opt-in: fewer sleep/wake transitions, a little more energy)"
        )
    if loaded.overrides:
        lines.append(f"  overridden by {', '.join(loaded.overrides)}")
    return "\n".join(lines)
