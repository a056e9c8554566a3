"""What ``racktwin optimize`` writes: ``plan.json`` (the plan per job and card, the twin's judgement
and the baseline), ``racks.csv`` (one row per rack), ``report.html`` (plots embedded as PNG), the
``--json`` summary and the closing line on stdout.
"""

from __future__ import annotations

import csv
import io
import json
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from agent.commands.common import json_safe, write_text_replacing
from agent.commands.optimize_scenario import Scenario
from agent.report import figures_html, page, png_base64, pyplot
from twin.spec import SiteSpec


def write_plan_json(
    path: Path,
    sc: Scenario,
    p: Any,
    plan: Any,
    placement: Any,
    unplaced: dict[str, str],
    judged: dict[str, Any] | None,
    base: dict[str, Any],
    t_place: float,
) -> None:
    site = p.site
    clocks = site.card.clocks_mhz
    card_rack = site.card_rack()
    placed = set(placement.cards) if placement is not None else set()
    dv = plan.dvfs
    jobs_out = []
    for j, job in enumerate(p.jobs):
        cards = p.job_cards(j)
        lv = int(dv.job_level[j]) if dv is not None else None
        jobs_out.append(
            {
                "id": job.job_id,
                "phase": p.job_phase[j].name.lower(),
                "placed_now": job.job_id in placed,
                "racks": sorted({int(r) for r in card_rack[cards]}),
                "cards": cards.tolist(),
                "level": lv,
                "clock_mhz": clocks[lv] if lv is not None else None,
            }
        )
    card_host_off = judged["host_off"][site.card_host()] if judged else np.zeros(site.n_cards, dtype=bool)
    cards_out = []
    for i in range(site.n_cards):
        j = int(p.card_job[i])
        if p.failed[i]:
            state = "failed"
        elif j >= 0:
            state = "busy"
        elif card_host_off[i]:
            state = "host_off"
        elif dv is not None and dv.card_low_power[i]:
            state = "low_power"
        else:
            state = "awake"
        cards_out.append(
            {
                "card": i,
                "rack": int(card_rack[i]),
                "job": p.jobs[j].job_id if j >= 0 else None,
                "state": state,
                "level": int(dv.card_level[i]) if dv is not None else None,
                "power_w": float(judged["card_power_w"][i]) if judged else None,
                "die_temp_c": float(judged["die_c"][i]) if judged else None,
            }
        )
    doc = {
        "scenario": sc.name,
        "status": plan.status.value,
        "source": plan.source,
        "explanation": plan.explanation,
        "solve_time_s": plan.solve_time_s,
        "placement_time_s": t_place,
        "mip_gap": plan.mip_gap,
        "supply_temp_c": plan.supply_temp_c,
        "setpoint_options": [
            {
                "supply_temp_c": o.supply_temp_c,
                "status": o.status.value,
                "objective_per_h": o.objective_per_h,
                "facility_power_w": o.facility_power_w,
                "it_power_w": o.it_power_w,
            }
            for o in plan.setpoint.options
        ],
        "objective_per_h": plan.objective_per_h,
        "it_power_w": judged["it_power_w"] if judged else None,
        "facility_power_w": judged["facility_power_w"] if judged else None,
        "pue": judged["pue"] if judged else None,
        "pue_target": site.pue_target,
        # the facility's power above pue_target x IT at the judged plan (the soft constraint's slack)
        "pue_excess_w": max(0.0, judged["facility_power_w"] - site.pue_target * judged["it_power_w"])
        if judged
        else None,
        "pump_speed_frac": [float(x) for x in judged["pump_speed_frac"]] if judged else None,
        "pump_power_w": judged["pump_power_w"] if judged else None,
        "hosts_off": np.flatnonzero(judged["host_off"]).tolist() if judged else None,
        "host_saving_w": judged["host_saving_w"] if judged else None,
        "baseline": {k: base[k] for k in ("it_power_w", "facility_power_w", "pue", "throughput", "pump_power_w")},
        "unplaced": unplaced,
        "jobs": jobs_out,
        "cards": cards_out,
    }
    write_text_replacing(path, json.dumps(json_safe(doc), indent=1) + "\n")


def write_racks_csv(
    path: Path, p: Any, judged: dict[str, Any] | None, greedy: dict[str, Any] | None, base: dict[str, Any]
) -> None:
    site = p.site
    card_rack = site.card_rack()
    busy = np.bincount(card_rack[p.card_job >= 0], minlength=site.n_racks)
    failed = np.bincount(card_rack[p.failed], minlength=site.n_racks)
    hosts_off = judged["host_off"].reshape(site.n_racks, -1).sum(axis=1) if judged else None
    fh = io.StringIO()
    w = csv.writer(fh)
    w.writerow(
        [
            "rack",
            "limit_w",
            "cap_w",
            "power_w",
            "max_die_temp_c",
            "pump_speed_frac",
            "busy_cards",
            "failed_cards",
            "hosts_off",
            "greedy_power_w",
            "baseline_power_w",
            "baseline_max_die_temp_c",
        ]
    )
    cap = p.rack_cap_w()
    for r in range(site.n_racks):
        w.writerow(
            [
                site.rack_names[r],
                f"{p.rack_limit_w[r]:.1f}",
                f"{cap[r]:.1f}",
                f"{judged['rack_power_w'][r]:.1f}" if judged else "",
                f"{judged['rack_max_die_c'][r]:.2f}" if judged else "",
                f"{judged['pump_speed_frac'][r]:.3f}" if judged else "",
                int(busy[r]),
                int(failed[r]),
                int(hosts_off[r]) if hosts_off is not None else "",
                f"{greedy['rack_power_w'][r]:.1f}" if greedy else "",
                f"{base['rack_power_w'][r]:.1f}",
                f"{base['rack_max_die_c'][r]:.2f}",
            ]
        )
    write_text_replacing(path, fh.getvalue(), newline="")


def write_report(
    path: Path,
    sc: Scenario,
    p: Any,
    plan: Any,
    judged: dict[str, Any] | None,
    greedy: Any,
    greedy_j: dict[str, Any] | None,
    base: dict[str, Any],
    t_place: float,
) -> None:
    plt = pyplot()
    site = p.site
    names = site.rack_names
    x = np.arange(site.n_racks)
    imgs: list[tuple[str, str]] = []
    wide = max(6.0, min(0.25 * site.n_racks, 24.0))

    fig, ax = plt.subplots(figsize=(wide, 3.2))
    wb = 0.27
    ax.bar(x - wb, base["rack_power_w"] / 1e3, wb, label="baseline (top clock)", color="#bbbbbb")
    if greedy_j:
        ax.bar(x, greedy_j["rack_power_w"] / 1e3, wb, label="greedy", color="#8fb3d9")
    if judged:
        ax.bar(x + wb, judged["rack_power_w"] / 1e3, wb, label="plan", color="#1f5fa8")
    ax.axhline(float(p.rack_limit_w.max()) / 1e3, color="red", lw=1.2, label="limit")
    ax.axhline(float(p.rack_cap_w().max()) / 1e3, color="red", lw=0.8, ls="--", label="limit - margin")
    ax.set_ylabel("rack power (kW)")
    ax.set_xticks(x[:: max(1, site.n_racks // 32)], [names[i] for i in x[:: max(1, site.n_racks // 32)]], fontsize=7)
    ax.set_ylim(0.0, float(max(base["rack_power_w"].max(), p.rack_limit_w.max())) / 1e3 + 2.0)
    # above the axes, so that it never hides a bar
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    imgs.append(("Rack power vs limit (twin steady state)", png_base64(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 3.0))
    t_lo = float(min(base["die_c"].min(), judged["die_c"].min() if judged else 99.0)) - 1.0
    bins = [float(b) for b in np.linspace(t_lo, p.site.card.max_temp_c + 1.0, 50)]
    ax.hist(base["die_c"], bins=bins, alpha=0.5, label="baseline", color="#999999")
    if judged:
        ax.hist(judged["die_c"], bins=bins, alpha=0.7, label="plan", color="#1f5fa8")
    ax.axvline(p.die_limit_c, color="red", lw=1.0, ls="--", label="die limit")
    ax.axvline(p.site.card.slowdown_temp_c, color="red", lw=1.2, label="slowdown")
    ax.set_xlabel("steady die temperature (deg C)")
    ax.set_ylabel("cards")
    ax.legend(fontsize=7)
    imgs.append(("Die temperatures", png_base64(fig)))
    plt.close(fig)

    rows = [("baseline", base)] + ([("greedy", greedy_j)] if greedy_j else []) + ([("plan", judged)] if judged else [])
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.0))
    labels = [r[0] for r in rows]
    colors = ["#bbbbbb", "#8fb3d9", "#1f5fa8"][: len(rows)]
    axes[0].bar(labels, [r[1]["facility_power_w"] / 1e3 for r in rows], color=colors)
    axes[0].bar(labels, [r[1]["it_power_w"] / 1e3 for r in rows], color="none", edgecolor="k", hatch="//")
    axes[0].set_ylabel("facility power (kW); hatched: IT")
    axes[1].bar(labels, [r[1]["pue"] for r in rows], color=colors)
    axes[1].axhline(site.pue_target, color="red", lw=1.0, label="target")
    axes[1].set_ylim(1.0, max(max(r[1]["pue"] for r in rows), site.pue_target) + 0.02)
    axes[1].set_ylabel("PUE")
    axes[1].legend(fontsize=7)
    axes[2].bar(labels, [r[1]["throughput"] for r in rows], color=colors)
    axes[2].set_ylabel("throughput (top-clock card equiv.)")
    fig.tight_layout()
    imgs.append(("Energy, PUE and throughput against the baseline and the greedy plan", png_base64(fig)))
    plt.close(fig)

    opts = [o for o in plan.setpoint.options if o.facility_power_w is not None]
    if len(plan.setpoint.options) > 1 and opts:
        fig, ax = plt.subplots(figsize=(6.0, 2.8))
        ax.plot([o.supply_temp_c for o in opts], [o.facility_power_w / 1e3 for o in opts], "o-", label="facility power")
        ax.set_xlabel("rack supply set-point (deg C)")
        ax.set_ylabel("facility power (kW)")
        ax.axvline(plan.supply_temp_c, color="green", ls="--", label="chosen")
        ax.legend(fontsize=7)
        imgs.append(("Coolant set-point options (each with its own DVFS plan)", png_base64(fig)))
        plt.close(fig)

    def fmt(v: Any, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
        return "-" if v is None else f"{v / scale:.{digits}f}{unit}"

    table_rows = "".join(
        f"<tr><td>{escape(n)}</td><td>{fmt(r['it_power_w'], ' kW', 1e3)}</td>"
        f"<td>{fmt(r['facility_power_w'], ' kW', 1e3)}</td>"
        f"<td>{fmt(r['pue'], '', 1, 3)}</td><td>{fmt(r['throughput'])}</td><td>{r['supply_c']:g} deg C</td>"
        f"<td>{fmt(float(r['rack_power_w'].max()), ' kW', 1e3, 2)}</td>"
        f"<td>{fmt(float(r['die_c'].max()), ' deg C')}</td>"
        f"<td>{fmt(r['pump_power_w'], ' kW', 1e3, 2)}"
        f" (mean speed {100 * float(np.mean(r['pump_speed_frac'])):.0f}%)</td>"
        f"<td>{int(r['host_off'].sum())} of {site.n_hosts}</td></tr>"
        for n, r in rows
    )
    expl = f"<pre>{escape(plan.explanation)}</pre>" if plan.explanation else ""
    gen = {**sc.moved, **sc.dropped}
    if gen:
        expl += (
            "<p>Generated jobs a failed card or a listed job sat in:</p><ul>"
            + "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in gen.items())
            + "</ul>"
        )
    body = f"""<p>Site {escape(site.name)}: {site.n_cards} cards, {site.n_racks} racks; {p.n_jobs} jobs running;
ambient {p.ambient_c:g} deg C. Status <b>{escape(plan.status.value)}</b> ({escape(plan.source)}),
solve {plan.solve_time_s:.3f} s, placement {t_place:.3f} s, chosen supply {plan.supply_temp_c:g} deg C.</p>{expl}
<table><tr><th>plan</th><th>IT</th><th>facility</th><th>PUE</th><th>throughput</th><th>supply</th>
<th>max rack</th><th>max die</th><th>pumps</th><th>hosts off</th></tr>
{table_rows}</table>
<p>All numbers are the twin's steady state (<code>twin.steady.site_steady_state</code>) at each plan's levels
idle states and pump speeds (each rack loop's pump as slow as the plan's dies, cap and loop rise allow, as
the agent chooses it; <code>[solver] choose_pump_speed</code>) and hosts off (every host with no busy card but a
reserve of <code>[solver] host_reserve_per_supernode</code> per supernode and the hosts holding the ready reserve of
awake idle cards, none while jobs stay queued, as the agent powers off hosts idle long enough; decided before
planning, so the plan's caps count what they save; <code>[solver] choose_host_power</code>). Baseline: every card
at the top clock, idle cards in active idle, every host on, the scenario's set-point, pumps at full speed, only
the cards' own protection.</p>
{figures_html(imgs)}"""
    write_text_replacing(path, page(f"racktwin optimize: {sc.name}", body))


def json_summary(
    site: SiteSpec, p: Any, plan: Any, judged: dict[str, Any] | None, base: dict[str, Any]
) -> dict[str, Any]:
    """The object ``--json`` prints: the plan's status, per rack its power, limit, hottest die and
    pump speed, and the judged plan's totals against the baseline's (None where there is no plan)."""
    return {
        "status": plan.status.value,
        "solve_time_s": plan.solve_time_s,
        "racks": [
            {
                "rack": site.rack_names[r],
                "power_w": float(judged["rack_power_w"][r]) if judged else None,
                "limit_w": float(p.rack_limit_w[r]),
                "max_die_temp_c": float(judged["rack_max_die_c"][r]) if judged else None,
                "pump_speed_frac": float(judged["pump_speed_frac"][r]) if judged else None,
            }
            for r in range(site.n_racks)
        ],
        "pue": judged["pue"] if judged else None,
        "it_power_w": judged["it_power_w"] if judged else None,
        "facility_power_w": judged["facility_power_w"] if judged else None,
        "hosts_off": int(judged["host_off"].sum()) if judged else None,
        "baseline_facility_power_w": base["facility_power_w"],
        "throughput": judged["throughput"] if judged else None,
        "baseline_throughput": base["throughput"],
    }


def summary_line(
    name: str, site: SiteSpec, plan: Any, judged: dict[str, Any], base: dict[str, Any], out_dir: Path
) -> str:
    """The line printed on stdout without ``--json`` when there is a plan."""
    return (
        f"{name}: {plan.status.value}, supply {plan.supply_temp_c:g} deg C, "
        f"IT {judged['it_power_w'] / 1e3:.1f} kW, "
        f"facility {judged['facility_power_w'] / 1e3:.1f} kW (baseline {base['facility_power_w'] / 1e3:.1f} kW), "
        f"PUE {judged['pue']:.3f}, throughput {judged['throughput']:.1f} (baseline {base['throughput']:.1f})"
        + (f", {int(judged['host_off'].sum())} of {site.n_hosts} hosts off" if site.hosts_managed else "")
        + f"; files in {out_dir}"
    )
