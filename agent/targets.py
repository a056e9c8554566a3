"""A scenario's targets, judged on an evaluation: met or missed, by how much, and why.

A run scenario may declare what one policy must show (``[targets]``, ``twin.scenario.ScenarioTargets``:
a facility saving against the baseline, a throughput-loss bound, a PUE bound, rack-limit and die
bounds, policies to beat). :func:`check_targets` judges the evaluated metrics against them and,
for every target missed, explains the miss with numbers from the same run:

* **facility saving**: :func:`saving_ceiling` bounds what the controller's levers can remove from
  the baseline's energy at the target's throughput-loss budget, lever by lever, from where the
  baseline's energy went (``agent.evaluate.BREAKDOWN_KEYS``) and the site's power model:

  - idle cards: every idle card in low-power idle all the time saves ``1 - low_power_idle_w /
    idle_power_w`` of their awake energy;
  - busy cards not computing (checkpoints, stalls): at most all of it;
  - computing cards: slowing a job one DVFS level saves at most ``k`` times its relative throughput
    loss in power (``k`` from the site's DVFS table and the jobs' compute shares,
    :func:`dvfs_saving_per_loss`), so a loss budget ``L`` bounds the saving at ``k L`` of their energy;
  - fans and chiller: at most all of it (a warm enough set-point);
  - pumps: every loop at the site's lowest pump speed all the time saves ``1 - s_min^3`` of them;
  - UPS and other overhead: in proportion to the IT energy removed;
  - hosts (sites whose hosts can be powered off): every host with no busy card off all the time saves
    its on power less its off power, and its idle cards what they would still draw asleep (from the
    baseline's host-seconds with no busy card, ``idle_host_frac``); hosts with a busy card and the
    switches: nothing.

  The ceiling is an upper bound, not a forecast: it ignores every constraint (caps, die limits,
  wake-up latency, the ready reserve).
* **throughput loss**: split into fewer card-seconds held (when jobs ran: placement, queue
  order, what was still queued at the end) and less work per held card-second (DVFS, host boots,
  wake-ups), and, where the runs'
  per-job work is given, the jobs that make most of the difference (``agent.job_work``);
* **better than a policy**: the energy and throughput differences, and for less work the jobs behind
  it (one big job started later often outweighs all the rest); identical results say the two made
  the same decisions; "less energy" is at least 0.01% less (less by under that is a tie); a miss that
  is a trade (more energy for more work, or less work for less energy) is also priced at the
  controller's own prices (``agent.config.PricesConfig``: a kWh of facility energy, a top-clock
  card-hour of work), which says whether the trade was worth making by the objective it plans with;
* PUE, limits and dies: the measured values beside the bounds.

A measured value that is not a finite number (a run with no IT energy has no PUE) is not measured:
the target is not judged (``met`` None, measured ``-``, the why says "not measured"), never missed
by "nan over"; no verdict's text holds a NaN.

Pure functions of the metrics (no I/O); ``racktwin evaluate`` prints and writes the checks. Each kind
of target has its own judge (``_judge_*``, listed in ``_JUDGES`` in the order the checks are listed):
a new kind of target is one more judge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.config import PricesConfig
from agent.job_work import JobWork, describe_work_gap
from twin.power import PowerModel
from twin.scenario import ScenarioTargets
from twin.spec import SiteSpec
from twin.workload import JobSpec, compute_utilization, relative_throughput

__all__ = [
    "SavingCeiling",
    "TargetCheck",
    "TargetsError",
    "check_targets",
    "dvfs_saving_per_loss",
    "saving_ceiling",
    "validate_targets",
]

#: Relative differences below this count as identical (two policies that made the same decisions
#: differ only in the last digits of float sums); "less energy" means less by at least this much.
_SAME_FRAC = 1e-4


class TargetsError(ValueError):
    """Targets that cannot be judged (an unknown policy, a policy that did not run)."""


@dataclass(frozen=True)
class TargetCheck:
    """One target judged: ``met`` is None when it could not be judged (see ``why``)."""

    name: str
    target: str
    measured: str
    met: bool | None
    shortfall: str  # by how much it was missed ("" when met)
    why: str  # the numbers behind a miss ("" when met)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "measured": self.measured,
            "met": self.met,
            "shortfall": self.shortfall,
            "why": self.why,
        }


@dataclass(frozen=True)
class SavingCeiling:
    """Upper bound of the facility saving reachable with the controller's levers (kWh per lever)."""

    parts_kwh: dict[str, float]
    baseline_kwh: float
    dvfs_k: float  # power saved per unit of throughput lost, best DVFS step
    loss_budget_pct: float
    idle_host_kwh: float = 0.0  # of "idle hosts off": the hosts' own power (the rest is their cards asleep)

    @property
    def total_kwh(self) -> float:
        return float(sum(self.parts_kwh.values()))

    @property
    def total_pct(self) -> float:
        return 100.0 * self.total_kwh / self.baseline_kwh if self.baseline_kwh > 0 else math.nan


def validate_targets(targets: ScenarioTargets, known: Sequence[str]) -> None:
    """Refuse targets naming a policy that does not exist (before any policy runs)."""
    for name in (targets.policy, *(targets.better_than or ())):
        if name not in known:
            raise TargetsError(f"[targets]: unknown policy {name!r} (choose from {', '.join(known)})")


def dvfs_saving_per_loss(site: SiteSpec, jobs: Sequence[JobSpec]) -> float:
    """Largest ratio of relative power saved to relative throughput lost when a computing card of
    one of ``jobs`` goes from the top level to any lower one (at the reference temperature).

    A slowed card draws ``P_k`` instead of ``P_0`` and does ``thr_k`` of its work; the ratio
    ``(1 - P_k / P_0) / (1 - thr_k)`` bounds the saving per unit of loss of any DVFS plan."""
    model = PowerModel.from_card(site.card)
    kinds = sorted({(j.compute_share, j.noncompute_utilization) for j in jobs})
    if not kinds or model.n_levels < 2:
        return 0.0
    share = np.array([c for c, _u in kinds], dtype=np.float64)
    other_u = np.array([u for _c, u in kinds], dtype=np.float64)
    f_rel = model.clocks_mhz / model.clocks_mhz[0]
    t_ref = np.full(share.size, model.reference_temp_c)
    p0 = model.active_power_w(np.zeros(share.size, dtype=np.int64), compute_utilization(share, 1.0, other_u), t_ref)
    best = 0.0
    for k in range(1, model.n_levels):
        u = compute_utilization(share, f_rel[k], other_u)
        pk = model.active_power_w(np.full(share.size, k, dtype=np.int64), u, t_ref)
        loss = 1.0 - relative_throughput(share, f_rel[k])
        ok = loss > 1e-9
        if np.any(ok):
            best = max(best, float(np.max((1.0 - pk[ok] / p0[ok]) / loss[ok])))
    return best


def saving_ceiling(
    site: SiteSpec,
    baseline_breakdown_kwh: Mapping[str, float],
    baseline_facility_kwh: float,
    loss_budget_pct: float,
    jobs: Sequence[JobSpec],
    idle_host_s: float = 0.0,
    idle_card_s: float = 0.0,
) -> SavingCeiling:
    """Upper bound of the facility saving at ``loss_budget_pct`` of throughput (module docstring).
    ``idle_host_s`` / ``idle_card_s``: the baseline's host-seconds with no busy card and card-seconds
    idle (the host lever; nothing where hosts cannot be powered off)."""
    b = baseline_breakdown_kwh
    card = site.card
    k = dvfs_saving_per_loss(site, jobs)
    budget = max(loss_budget_pct, 0.0) / 100.0
    asleep_frac = 1.0 - card.low_power_idle_w / card.idle_power_w
    parts = {
        "idle cards to low-power idle": b.get("cards_idle_awake", 0.0) * asleep_frac,
        "busy cards not computing": b.get("cards_busy_not_computing", 0.0),
        "computing cards (DVFS within the loss budget)": b.get("cards_computing", 0.0) * min(1.0, k * budget),
        "fans and chiller": b.get("fans", 0.0) + b.get("chiller", 0.0),
        "pumps at the lowest speed": b.get("pumps", 0.0) * (1.0 - site.min_pump_speed_frac() ** 3),
    }
    if site.hosts_managed and idle_host_s > 0:
        on_idle_hosts = min(1.0, idle_host_s * site.cards_per_host / idle_card_s) if idle_card_s > 0 else 0.0
        asleep_left = b.get("cards_idle_awake", 0.0) * (1.0 - asleep_frac) * on_idle_hosts
        idle_host_kwh = idle_host_s * site.host_saving_w() / 3.6e6
        parts["idle hosts off"] = idle_host_kwh + asleep_left
    else:
        idle_host_kwh = 0.0
    it_kwh = sum(b.get(x, 0.0) for x in ("hosts", "cards_computing", "cards_busy_not_computing", "cards_idle_awake"))
    it_kwh += b.get("cards_low_power", 0.0)
    it_removed = parts["idle cards to low-power idle"] + parts["busy cards not computing"]
    it_removed += parts["computing cards (DVFS within the loss budget)"] + parts.get("idle hosts off", 0.0)
    parts["UPS and other overhead"] = b.get("ups_and_other", 0.0) * (it_removed / it_kwh if it_kwh > 0 else 0.0)
    return SavingCeiling(parts, baseline_facility_kwh, k, 100.0 * budget, idle_host_kwh)


def _pct(x: float) -> str:
    return f"{x:.2f}%" if math.isfinite(x) else "-"


def _signed_pct(x: float) -> str:
    return f"{x:+.2f}%" if math.isfinite(x) else "-"


def _not_measured(what: str, got: float) -> str:
    """Why a target on a non-finite measured value is not judged (NaN: a run with nothing to measure,
    e.g. no IT energy for a PUE): it was not measured, which is neither met nor missed."""
    return f"not measured: {what} is {'not a number' if math.isnan(got) else 'infinite'} in this run"


def _count(x: float) -> str:
    """A count of seconds (or card-seconds) for a verdict's text: whole where it is whole, else with
    the decimals that tell it from its neighbours (a limit missed by 0.4 s reads "0.4", not "0")."""
    if not math.isfinite(x) or x == round(x):
        return f"{x:,.0f}"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _fewer(loss_pct: float, word: str) -> str:
    """A loss in percent as words: ``1.00% fewer`` for a loss, ``1.00% more`` for a gain (``word`` is
    "fewer" or "less")."""
    if not math.isfinite(loss_pct):
        return f"- {word}"
    return f"{abs(loss_pct):.2f}% {word if loss_pct >= 0 else 'more'}"


def _saving_why(name: str, got_pct: float, ceil: SavingCeiling, baseline_hosts_kwh: float) -> str:
    """Why a facility saving falls short: the ceiling of the policy's levers, part by part."""
    if ceil.total_pct <= 0:
        return f"with {name}'s levers nothing can be saved at this throughput-loss budget"
    parts = "; ".join(f"{k} {v:,.1f} kWh ({100 * v / ceil.baseline_kwh:.2f}%)" for k, v in ceil.parts_kwh.items())
    # the hosts' energy less what powering the idle ones off saves of it (not of their cards)
    fixed_pct = 100 * (baseline_hosts_kwh - ceil.idle_host_kwh) / ceil.baseline_kwh
    return (
        f"with {name}'s levers the saving is at most {ceil.total_pct:.2f}% of the baseline's "
        f"{ceil.baseline_kwh:,.1f} kWh at {ceil.loss_budget_pct:g}% throughput loss: {parts}. Hosts "
        f"with a busy card, switches and the standby power of hosts off (~{fixed_pct:.1f}% of the "
        f"baseline) have no lever; a DVFS step saves at most {ceil.dvfs_k:.2f}x its relative "
        f"throughput loss in card power. {name} reached {100 * got_pct / ceil.total_pct:.0f}% of that bound."
    )


def _better_target(tol_pct: float) -> str:
    return "less energy at equal or more work" + (f" (within {tol_pct:g}%)" if tol_pct else "")


def _trade_value(name: str, other: str, m: Mapping[str, Any], o: Mapping[str, Any], prices: PricesConfig) -> str:
    """For a policy that spent more energy for more work than ``other`` (or less for less): that
    trade priced at ``prices`` (facility kWh, top-clock card-hours of work from ``work_card_s``), "; "
    first; "" when it is no trade or the work is not in the metrics."""
    try:
        d_kwh = float(m["facility_energy_kwh"]) - float(o["facility_energy_kwh"])
        d_card_h = (float(m["work_card_s"]) - float(o["work_card_s"])) / 3600.0
    except (KeyError, TypeError, ValueError):
        return ""
    if not (math.isfinite(d_kwh) and math.isfinite(d_card_h)) or d_kwh * d_card_h <= 0.0:
        return ""
    value = d_card_h * prices.card_hour_value - d_kwh * prices.energy_per_kwh
    verdict = "worth it" if value > 0 else "not worth it"
    return (
        f"; a trade: {name} used {d_kwh:+,.1f} kWh for {d_card_h:+,.1f} card-hours of top-clock work against"
        f" {other}, {value:+,.2f} at the prices it plans with ({prices.energy_per_kwh:g} per kWh,"
        f" {prices.card_hour_value:g} per card-hour): {verdict} by its own objective"
    )


def _better_than(
    name: str,
    other: str,
    m: Mapping[str, Any],
    o: Mapping[str, Any],
    tol_pct: float,
    by_job: Callable[[str], str],
    prices: PricesConfig | None = None,
) -> tuple[str, str, bool | None, str]:
    """Policy ``name`` (metrics ``m``) against ``other`` (``o``): the target's text, what was
    measured, whether it used less energy for equal or more work (within ``tol_pct``; None: not
    measured, an energy or work that is not a number), and why not
    (``by_job(other)``: the jobs behind a shortfall of work, "; " first, or ""; a trade of energy
    for work priced at ``prices``, default :class:`PricesConfig`)."""
    e_p, e_o = float(m["facility_energy_kwh"]), float(o["facility_energy_kwh"])
    w_p, w_o = float(m["throughput"]), float(o["throughput"])
    if not all(math.isfinite(x) for x in (e_p, e_o, w_p, w_o)):
        return _better_target(tol_pct), "-", None, _not_measured("energy or work", math.nan)
    d_e = 100.0 * (e_p / e_o - 1.0) if e_o > 0 else math.nan
    d_w = 100.0 * (w_p / w_o - 1.0) if w_o > 0 else math.nan
    less_energy = e_p <= e_o * (1.0 - _SAME_FRAC)  # less by at least 0.01% (less by less is a tie)
    enough_work = w_p >= w_o * (1.0 - tol_pct / 100.0)
    if abs(d_e) < 100 * _SAME_FRAC and abs(d_w) < 100 * _SAME_FRAC:
        why = f"{name} and {other} gave the same energy and work (to 0.01%): they made the same decisions"
    else:
        shortfalls = []
        if not less_energy and e_p < e_o:  # less, but within the tie band
            shortfalls.append(f"energy {d_e:+.3f}% against {other} (less by under 0.01% counts as equal)")
        elif not less_energy:
            shortfalls.append(f"energy {d_e:+.2f}% against {other}")
        if not enough_work:
            shortfalls.append(f"work {d_w:+.2f}% against {other} (tolerance {tol_pct:g}%){by_job(other)}")
        why = "; ".join(shortfalls)
        if shortfalls:
            why += _trade_value(name, other, m, o, prices if prices is not None else PricesConfig())
    measured = f"energy {_signed_pct(d_e)}, work {_signed_pct(d_w)}"  # "-" against a policy with none
    return _better_target(tol_pct), measured, less_energy and enough_work, why


@dataclass(frozen=True)
class _Judged:
    """What every judge reads: the targets, the judged policy's metrics (``m``), the baseline's
    (``base``, None when it did not run) and everything else of the evaluation."""

    targets: ScenarioTargets
    name: str  # the judged policy (targets.policy)
    m: Mapping[str, Any]
    base: Mapping[str, Any] | None
    metrics: Mapping[str, Mapping[str, Any]]
    breakdown_kwh: Mapping[str, Mapping[str, float]]
    site: SiteSpec
    jobs: Sequence[JobSpec]
    job_work: Mapping[str, Sequence[JobWork]] | None
    prices: PricesConfig | None = None  # the controller's prices (a trade of energy for work is priced at them)

    def by_job(self, other: str) -> str:
        """The jobs behind the judged policy's shortfall of work against ``other``, "; " first, or ""."""
        if self.job_work is None or self.name not in self.job_work or other not in self.job_work:
            return ""
        gap = describe_work_gap(self.job_work[self.name], self.job_work[other], other)
        return f"; {gap}" if gap else ""


def _target_check(
    title: str, target: str, measured: str, met: bool | None, shortfall: str = "", why: str = ""
) -> TargetCheck:
    """One target's check: a shortfall only for a target missed; the why of one not judged says why not."""
    return TargetCheck(title, target, measured, met, shortfall if met is False else "", "" if met else why)


#: A judge: the checks of one kind of target (none when the scenario does not set it).
_Judge = Callable[[_Judged], list[TargetCheck]]


def _judge_facility_saving(j: _Judged) -> list[TargetCheck]:
    want = j.targets.facility_saving_pct_min
    if want is None:
        return []
    title, target = "facility saving vs baseline", f">= {want:g}%"
    got = float(j.m.get("facility_energy_saving_pct", math.nan))
    if j.base is None or not math.isfinite(got):
        why = "the baseline did not run" if j.base is None else "the baseline used no energy"
        return [_target_check(title, target, "-", None, why=why)]
    loss_budget = j.targets.throughput_loss_pct_max if j.targets.throughput_loss_pct_max is not None else 0.0
    ceil = saving_ceiling(
        j.site,
        j.breakdown_kwh["baseline"],
        float(j.base["facility_energy_kwh"]),
        loss_budget,
        j.jobs,
        idle_host_s=float(j.base.get("idle_host_s", 0.0)),
        idle_card_s=float(j.base.get("idle_card_s", 0.0)),
    )
    why = _saving_why(j.name, got, ceil, j.breakdown_kwh["baseline"].get("hosts", 0.0))
    return [_target_check(title, target, _pct(got), got >= want, f"{want - got:.2f} points short", why)]


def _throughput_loss_why(j: _Judged, base: Mapping[str, Any]) -> str:
    """Why the judged policy did less work than the baseline: fewer card-seconds held, or less work
    per held card-second (and the jobs behind it)."""
    busy_b, busy_p = float(base["allocated_card_frac"]), float(j.m["allocated_card_frac"])
    if busy_b > 0 and busy_p <= 0:
        return f"{j.name} held no card all run (baseline {100 * busy_b:.2f}% of the cards)" + j.by_job("baseline")
    if busy_b <= 0:
        return ""
    busy_loss = 100.0 * (1.0 - busy_p / busy_b)
    speed_b = float(base["throughput"]) / busy_b
    speed_p = float(j.m["throughput"]) / busy_p
    speed_loss = 100.0 * (1.0 - speed_p / speed_b) if speed_b > 0 else math.nan
    return (
        f"{_fewer(busy_loss, 'fewer')} card-seconds held (when jobs ran: placement, queue order, "
        f"jobs still queued at the end; {j.name} held {100 * busy_p:.2f}% of the cards, baseline "
        f"{100 * busy_b:.2f}%) and {_fewer(speed_loss, 'less')} work per held card-second (DVFS "
        f"levels, host boots and card wake-ups)"
    ) + j.by_job("baseline")


def _judge_throughput_loss(j: _Judged) -> list[TargetCheck]:
    want = j.targets.throughput_loss_pct_max
    if want is None:
        return []
    got = float(j.m.get("throughput_loss_pct", math.nan))
    if j.base is None or not math.isfinite(got):  # not judged
        why = "the baseline did not run" if j.base is None else "the baseline did no work"
    else:
        why = _throughput_loss_why(j, j.base)
    met = (got < want) if math.isfinite(got) else None
    return [
        _target_check(
            "throughput loss vs baseline", f"< {want:g}%", _pct(got), met, f"{got - want:.2f} points over", why
        )
    ]


def _judge_pue(j: _Judged) -> list[TargetCheck]:
    bound = j.targets.pue_max
    if bound is None:
        return []
    title, target = "time-weighted PUE", f"<= {bound:g}"
    got = float(j.m["pue"])
    cool, it = float(j.m["cooling_energy_kwh"]), float(j.m["it_energy_kwh"])
    fac = float(j.m["facility_energy_kwh"])
    if not math.isfinite(got):  # a run with no IT energy has no PUE (facility / IT): not a miss
        why = "not measured: the run used no IT energy (PUE is facility / IT energy)" if it <= 0 else ""
        return [_target_check(title, target, "-", None, why=why or _not_measured("PUE", got))]
    why = f"cooling {cool:,.1f} kWh and other overhead {fac - it - cool:,.1f} kWh on {it:,.1f} kWh of IT energy"
    return [_target_check(title, target, f"{got:.4f}", got <= bound, f"{got - bound:.4f} over", why)]


def _at_most(j: _Judged, title: str, key: str, bound: float, unit: str, over: str, why: str) -> list[TargetCheck]:
    """An upper bound on one metric (counts of seconds: whole ones in the text where they are whole)."""
    got = float(j.m[key])
    target = f"<= {bound:g} {unit}"
    if not math.isfinite(got):
        return [_target_check(title, target, "-", None, why=_not_measured(key, got))]
    return [
        _target_check(title, target, f"{_count(got)} {unit}", got <= bound, f"{_count(got - bound)} {unit} {over}", why)
    ]


def _judge_limit_violation_s(j: _Judged) -> list[TargetCheck]:
    bound, m = j.targets.limit_violation_s_max, j.m
    if bound is None:
        return []
    why = (
        f"{int(m['limit_violation_episodes'])} episodes, longest {float(m['limit_violation_longest_s']):,.0f} s, "
        f"{float(m['limit_violation_kws']):,.1f} kW x s over; largest rack {float(m['max_rack_power_w']) / 1e3:.2f} kW"
    )
    return _at_most(j, "true rack power over a limit", "limit_violation_s", bound, "rack-s", "over", why)


def _judge_limit_violation_longest_s(j: _Judged) -> list[TargetCheck]:
    bound, m = j.targets.limit_violation_longest_s_max, j.m
    if bound is None:
        return []
    why = f"{float(m['limit_violation_s']):,.0f} rack-s over in {int(m['limit_violation_episodes'])} episodes"
    return _at_most(j, "longest time over a rack limit", "limit_violation_longest_s", bound, "s", "too long", why)


def _judge_die_over_max(j: _Judged) -> list[TargetCheck]:
    bound = j.targets.die_over_max_card_s_max
    if bound is None:
        return []
    why = f"hottest die {float(j.m['max_die_temp_c']):.1f} deg C (maximum {j.site.card.max_temp_c:g} deg C)"
    return _at_most(j, "dies over their maximum", "die_over_max_card_s", bound, "card-s", "over", why)


def _judge_better_than(j: _Judged) -> list[TargetCheck]:
    tol = j.targets.equal_throughput_tolerance_pct
    checks: list[TargetCheck] = []
    for other in j.targets.better_than or ():
        title = f"better than {other}"
        if other not in j.metrics:
            checks.append(_target_check(title, _better_target(tol), "-", None, why=f"{other} did not run"))
            continue
        target, measured, met, why = _better_than(j.name, other, j.m, j.metrics[other], tol, j.by_job, j.prices)
        checks.append(_target_check(title, target, measured, met, "", why))
    return checks


#: Every kind of target, in the order the checks are listed; a new kind of target is one more judge here.
_JUDGES: tuple[_Judge, ...] = (
    _judge_facility_saving,
    _judge_throughput_loss,
    _judge_pue,
    _judge_limit_violation_s,
    _judge_limit_violation_longest_s,
    _judge_die_over_max,
    _judge_better_than,
)


def check_targets(
    targets: ScenarioTargets,
    metrics: Mapping[str, Mapping[str, Any]],
    breakdown_kwh: Mapping[str, Mapping[str, float]],
    site: SiteSpec,
    jobs: Sequence[JobSpec],
    job_work: Mapping[str, Sequence[JobWork]] | None = None,
    prices: PricesConfig | None = None,
) -> list[TargetCheck]:
    """Judge ``targets`` on an evaluation's ``metrics`` and ``breakdown_kwh`` (per policy; the
    baseline must be among them for savings, losses and ceilings); ``job_work`` (per policy, the
    jobs' work at the end) names the jobs behind a throughput miss; ``prices`` (the controller's,
    default :class:`PricesConfig`) price a "better than" miss that is a trade of energy for work."""
    name = targets.policy
    if name not in metrics:
        raise TargetsError(f"targets.policy {name!r} did not run")
    judged = _Judged(
        targets, name, metrics[name], metrics.get("baseline"), metrics, breakdown_kwh, site, jobs, job_work, prices
    )
    return [check for judge in _JUDGES for check in judge(judged)]
