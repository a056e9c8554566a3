"""``racktwin optimize``'s plans as the twin sees them: :func:`judge` gives each rack loop's pump the
slowest speed the plan allows (``agent.pumps``, as the agent does) and takes the twin's steady state
(``twin.steady.site_steady_state``) at the plan's levels, idle states, pump speeds and hosts off;
:func:`baseline` is the same site with no agent (every card at the top clock, pumps at full speed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from agent.commands.optimize_scenario import SolverSection
from twin.workload import Phase

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _card_utilization(p: Any, level: IntArray) -> FloatArray:
    from models.problem import phase_utilization

    u = np.zeros(p.n_cards)
    for j, job in enumerate(p.jobs):
        cards = p.card_job == j
        u[cards] = phase_utilization(job, p.job_phase[j], p.site, level[cards])
    return u


def _pump_speeds(p: Any, dvfs: Any, supply_c: float, solver: SolverSection) -> FloatArray:
    """Each rack loop's pump speed for the plan: the agent's choice (``agent.pumps``) with the
    problem's resistances and die offsets, healthy pumps now at full speed (all at full speed if
    not chosen). The hosts the problem powers off (``p.host_off``) heat their racks less: each by
    ``SiteSpec.host_off_saving_w`` (the host's saving and its cards, counted asleep by the prediction)."""
    from agent.load import site_load_of_problem
    from agent.pumps import choose_pump_speeds

    site = p.site
    if not solver.choose_pump_speed:
        return np.ones(site.n_racks)
    load = site_load_of_problem(p.jobs, p.job_phase, p.card_job, p.failed)
    extra_w = np.zeros(site.n_racks)
    if p.host_off is not None:
        off_per_rack = np.asarray(p.host_off, dtype=np.float64).reshape(site.n_racks, -1).sum(axis=1)
        extra_w = -off_per_rack * site.host_off_saving_w()
    return choose_pump_speeds(
        site,
        load,
        dvfs.card_level,
        dvfs.card_low_power,  # the failed cards included: see judge
        np.full(site.n_cards, site.card.power_limit_w),
        np.full(site.n_cards, supply_c),
        p.r_total_k_per_w,
        p.die_offset_k,
        np.full(site.n_racks, site.loop_flow_per_rack_lpm()),
        np.ones(site.n_racks),
        p.rack_cap_w(),
        extra_w,
        p.die_limit_c,
        facility_w_per_it_w=1.0 + site.facility.ups_loss_fraction,
        steps=solver.pump_speed_steps,
    ).speed_frac


def judge(p: Any, dvfs: Any, supply_c: float, solver: SolverSection) -> dict[str, Any]:
    """The plan as the twin sees it: ``site_steady_state`` at the plan's levels, idle states, pump
    speeds (:func:`_pump_speeds`) and the problem's hosts off (``p.host_off``,
    :func:`agent.commands.optimize_hosts.hosts_off`). ``host_saving_w``: the twin's IT power with those
    hosts on (their cards asleep) less with them off."""
    from twin.steady import site_steady_state

    host_off = p.host_off
    speed = _pump_speeds(p, dvfs, supply_c, solver)
    state: dict[str, Any] = {
        "level": dvfs.card_level,
        "utilization": _card_utilization(p, dvfs.card_level),
        "supply_temp_c": supply_c,
        "ambient_c": p.ambient_c,
        # the failed cards are among the plan's low-power ones: models.plans.assess_dvfs puts there every
        # card neither busy nor awake, and a failed card is neither (make_problem, CycleProblem.idle_mask);
        # an `| p.failed` here changed nothing (a mutation audit found it)
        "low_power": dvfs.card_low_power,
        "flow_fraction": speed,
    }
    ss = site_steady_state(p.site, **state, host_off=host_off)
    saving = 0.0
    if host_off is not None and host_off.any():
        saving = site_steady_state(p.site, **state).it_power_w - ss.it_power_w
    return {
        "host_off": np.zeros(p.site.n_hosts, dtype=bool) if host_off is None else host_off,
        "host_saving_w": saving,
        "pump_speed_frac": speed,
        "pump_power_w": ss.cooling.rack_pump_w + ss.cooling.facility_pump_w,
        "rack_power_w": ss.rack_power_w,
        "rack_max_die_c": ss.rack_max_die_temp_c,
        "card_power_w": ss.card_power_w,
        "die_c": ss.die_temp_c,
        "it_power_w": ss.it_power_w,
        "facility_power_w": ss.cooling.facility_power_w,
        "pue": ss.cooling.pue,
        "throughput": dvfs.throughput,
        "supply_c": supply_c,
    }


def baseline(p: Any, supply_c: float) -> dict[str, Any]:
    """No agent: every card at the top clock (idle cards in active idle), the scenario's set-point,
    pumps at full speed, the cards' own firmware protection (power brake, thermal slowdown) as the only limit."""
    from twin.steady import site_steady_state

    level = np.zeros(p.n_cards, dtype=np.int64)
    ss = site_steady_state(
        p.site,
        level=level,
        utilization=_card_utilization(p, level),
        supply_temp_c=supply_c,
        ambient_c=p.ambient_c,
        low_power=p.failed,
    )
    from twin.workload import relative_throughput

    clocks = np.asarray(p.site.card.clocks_mhz)
    thr = 0.0
    for j, job in enumerate(p.jobs):
        if p.job_phase[j] == Phase.COMPUTE:
            lv = int(ss.level[p.card_job == j].max())  # the slowest card sets the pace
            thr += job.n_cards * float(relative_throughput(job.compute_share, clocks[lv] / clocks[0]))
    return {
        "host_off": np.zeros(p.site.n_hosts, dtype=bool),
        "pump_speed_frac": np.ones(p.site.n_racks),
        "pump_power_w": ss.cooling.rack_pump_w + ss.cooling.facility_pump_w,
        "rack_power_w": ss.rack_power_w,
        "rack_max_die_c": ss.rack_max_die_temp_c,
        "die_c": ss.die_temp_c,
        "it_power_w": ss.it_power_w,
        "facility_power_w": ss.cooling.facility_power_w,
        "pue": ss.cooling.pue,
        "throughput": thr,
        "supply_c": supply_c,
    }
