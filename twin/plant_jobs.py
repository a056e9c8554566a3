"""The jobs inside the virtual plant: queue, built-in scheduler, phases, checkpoints and failures.

``twin.plant.Plant`` holds one :class:`PlantJobs` and calls it; this module owns everything about
jobs, the plant everything about cards, loops and the timeline:

- **lifecycle**: a job is ``pending`` until its submit time, then ``queued``, ``running`` once placed
  (by :meth:`PlantJobs.place`, the external scheduler, or the built-in one), and ``finished`` or
  ``failed`` (after more card failures than ``PhaseModel.max_restarts``); a card failure rolls a
  running job back to its last checkpoint and, after ``restart_delay_s``, queues it again at the
  front.
- **built-in scheduler** (:meth:`PlantJobs.schedule`): compact first fit with EASY backfilling
  (``twin.easy_backfill``); under external placement only for jobs left in the queue past
  ``PlantConfig.external_timeout_s``.
- **phases** (``twin.workload.PhaseModel``): a running job waits for start-up and its cards, computes,
  stalls (communication or input, drawn from the job's own random stream), checkpoints, and ends;
  each job's next change is a timer, so the plant loops over jobs only when one falls due.
- **progress and work**: running jobs live in *slots* (slot 0 = "no job"), numpy arrays indexed by
  slot, so a step advances every job at once (:meth:`PlantJobs.advance`); each card carries what its
  job's phase asks of it (compute share, utilization of the rest), which the plant's power model
  reads. Work, work lost to failures and SLO violations are counted here; events for
  ``Plant.drain_events`` too.

What the plant lends: ``ready_cards(cards, t)`` wakes a placed job's sleeping cards (booting their
hosts) and says when they are all ready; the failed-card mask is passed to the scheduler.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from twin.easy_backfill import Reservation, keep_promise, reservation_from_ends, spare_after_backfill
from twin.plant_types import BoolArray, FloatArray, IntArray, JobRecord, PlantConfig
from twin.readings import JobEvent, JobReading
from twin.spec import SiteSpec
from twin.workload import JobSpec, Phase

__all__ = ["Job", "PlantJobs"]

_EPS_S = 1e-6
_INF = math.inf


class Job:
    """Mutable record of one job inside the plant."""

    __slots__ = (
        "cards",
        "ckpt_interval_steps",
        "compute_start_s",
        "finish_s",
        "last_ckpt_steps",
        "next_action",
        "pending_ckpt_steps",
        "phase",
        "progress_steps",
        "queued_since_s",
        "restarts",
        "rng",
        "slo_violation_s",
        "slot",
        "spec",
        "start_s",
        "state",
    )

    def __init__(self, spec: JobSpec, seed: int) -> None:
        self.spec = spec
        self.rng = np.random.default_rng([seed, 1, zlib.crc32(spec.job_id.encode("utf-8"))])
        self.state = "pending"
        self.phase = Phase.WAITING
        self.slot = 0
        self.cards: IntArray = np.zeros(0, dtype=np.int64)
        self.queued_since_s = 0.0
        self.start_s: float | None = None
        self.finish_s: float | None = None
        self.compute_start_s: float | None = None
        self.restarts = 0
        self.progress_steps = 0.0
        self.ckpt_interval_steps = spec.checkpoint_interval_s / spec.step_time_s
        # a job part way through its checkpoint interval (warm start) last checkpointed before its
        # progress 0: a failure before its first checkpoint here rolls it back behind 0
        first = spec.first_checkpoint_after_s
        self.last_ckpt_steps = 0.0 if first is None else (first - spec.checkpoint_interval_s) / spec.step_time_s
        self.pending_ckpt_steps = self.last_ckpt_steps
        self.next_action: tuple[Any, ...] = ("none",)
        self.slo_violation_s = 0.0


class PlantJobs:
    """Every job of a plant and what its running jobs ask of the cards. See the module docstring.

    Per card (read by the plant's power model; written only here): ``card_slot`` (the slot of the
    card's job, 0 for none), ``card_cs`` (compute share while computing, else 0), ``card_omc``
    (1 - card_cs), ``card_ncu`` (utilization of the non-scaling part, or of the phase) and
    ``card_a`` (card_omc * card_ncu)."""

    def __init__(self, site: SiteSpec, config: PlantConfig, ready_cards: Callable[[IntArray, float], float]) -> None:
        self.site = site
        self.config = config  # the plant's (read-only there)
        self._ready_cards = ready_cards
        n = site.n_cards

        # ---- per card ---------------------------------------------------------------------------------
        self.card_slot = np.zeros(n, dtype=np.int64)
        self.card_cs = np.zeros(n)
        self.card_omc = np.ones(n)
        self.card_ncu = np.zeros(n)
        self.card_a = np.zeros(n)

        # ---- job slots (slot 0 = "no job") ----------------------------------------------------------
        self._cap = 0
        empty = np.zeros(0)
        self._s_computing: BoolArray = np.zeros(0, dtype=bool)
        self._s_cs = self._s_omc = self._s_step = self._s_ncards = self._s_progress = empty
        self._s_work = self._s_next_ckpt = self._s_threshold = self._s_next_event = empty
        self._s_min_frac = self._s_rslow = self._s_rate = empty
        self._slot_job: list[Job | None] = []
        self._free_slots: list[int] = []
        self._grow_slots(64)
        # busy cards ordered by slot, for each job's slowest card (refresh_order)
        self._order = np.zeros(0, dtype=np.int64)
        self._starts = np.zeros(0, dtype=np.int64)
        self._seg_slot = np.zeros(0, dtype=np.int64)
        self._order_dirty = False
        self._n_computing = 0
        self._timer_min = _INF

        # ---- queue and events -----------------------------------------------------------------------
        self._by_id: dict[str, Job] = {}
        self._queue: list[Job] = []
        self._sched_dirty = False
        self._fallback_at = _INF
        self._reserved: tuple[str, float] | None = None  # the blocked job and its earliest expected start
        self._events: deque[JobEvent] = deque()

        # ---- accounting -----------------------------------------------------------------------------
        self.work_card_s = 0.0  # top-clock-equivalent card-seconds of training kept (after rollbacks)
        self.lost_work_card_s = 0.0  # work rolled back by card failures
        self.slo_violation_s = 0.0  # job-seconds computing below the job's min_throughput_frac
        self.n_submitted = self.n_finished = self.n_failed = 0
        self.n_placed_by_plant = 0

    def _grow_slots(self, new_cap: int) -> None:
        """Make room for ``new_cap`` job slots (slot 0 is reserved for "no job")."""
        old = self._cap
        new_cap = max(new_cap, 2)

        def grow(arr: FloatArray, fill: float) -> FloatArray:
            out = np.full(new_cap, fill, dtype=np.float64)
            out[: arr.size] = arr
            return out

        comp = np.zeros(new_cap, dtype=bool)
        comp[:old] = self._s_computing
        self._s_computing = comp
        self._s_cs = grow(self._s_cs, 0.0)
        self._s_omc = grow(self._s_omc, 1.0)
        self._s_step = grow(self._s_step, 1.0)
        self._s_ncards = grow(self._s_ncards, 0.0)
        self._s_progress = grow(self._s_progress, 0.0)
        self._s_work = grow(self._s_work, _INF)
        self._s_next_ckpt = grow(self._s_next_ckpt, _INF)
        self._s_threshold = grow(self._s_threshold, _INF)
        self._s_next_event = grow(self._s_next_event, _INF)
        self._s_min_frac = grow(self._s_min_frac, 0.0)
        self._s_rslow = grow(self._s_rslow, 1.0)
        self._s_rate = grow(self._s_rate, 0.0)
        self._slot_job.extend([None] * (new_cap - old))
        self._free_slots.extend(range(new_cap - 1, max(old, 1) - 1, -1))
        self._free_slots.sort(reverse=True)
        self._cap = new_cap

    # ================================================================================================
    # queries
    # ================================================================================================
    def new(self, spec: JobSpec) -> Job:
        """Record a job (pending until :meth:`enqueue`)."""
        if spec.job_id in self._by_id:
            raise ValueError(f"job {spec.job_id!r} was already submitted")
        if spec.n_cards > self.site.n_cards:
            raise ValueError(f"job {spec.job_id!r} needs {spec.n_cards} cards, the site has {self.site.n_cards}")
        job = Job(spec, self.config.seed)
        self._by_id[spec.job_id] = job
        return job

    def get(self, job_id: str) -> Job | None:
        return self._by_id.get(job_id)

    def queued(self) -> tuple[JobSpec, ...]:
        return tuple(j.spec for j in self._queue)

    def running(self) -> tuple[JobSpec, ...]:
        return tuple(j.spec for j in self._slot_job if j is not None)

    def n_running(self) -> int:
        return sum(1 for j in self._slot_job if j is not None)

    def n_queued(self) -> int:
        return len(self._queue)

    def busy_card(self, idx: IntArray) -> tuple[int, str] | None:
        """The first of ``idx`` that runs (or is given) a job, with the job's id; None if none does."""
        busy = self.card_slot[idx] > 0
        if not busy.any():
            return None
        c = int(idx[busy][0])
        job = self._slot_job[int(self.card_slot[c])]
        return c, job.spec.job_id if job is not None else "?"

    def drain_events(self) -> list[JobEvent]:
        """Job events since the last call, oldest first."""
        out = list(self._events)
        self._events.clear()
        return out

    def records(self) -> list[JobRecord]:
        out = []
        for job in self._by_id.values():
            spec = job.spec
            progress = self._s_progress[job.slot] if job.state == "running" else job.progress_steps
            out.append(
                JobRecord(
                    job_id=spec.job_id,
                    state=job.state,
                    phase=job.phase,
                    n_cards=spec.n_cards,
                    priority=spec.priority,
                    submit_time_s=spec.submit_time_s,
                    start_time_s=job.start_s,
                    finish_time_s=job.finish_s,
                    compute_start_s=job.compute_start_s,
                    work_done_card_s=float(min(progress, spec.work_steps) * spec.step_time_s * spec.n_cards),
                    work_total_card_s=spec.work_card_s,
                    slo_violation_s=job.slo_violation_s,
                    restarts=job.restarts,
                    cards=tuple(int(c) for c in job.cards),
                )
            )
        return out

    def readings(self) -> tuple[JobReading, ...]:
        """What the running jobs report: phase, progress, pace over the last step."""
        jobs = []
        # every running job, every step: the frozen readings are filled without their __init__'s
        # per-field object.__setattr__ (as twin.state's _with_progress); the same fields and values
        with np.errstate(divide="ignore", invalid="ignore"):  # (free slots: never read)
            progress = (self._s_progress / self._s_work).tolist()
        rate = self._s_rate.tolist()
        for job in self._slot_job:
            if job is None:
                continue
            s = job.slot
            reading = object.__new__(JobReading)
            reading.__dict__.update(
                job_id=job.spec.job_id,
                phase=job.phase,
                n_cards=job.spec.n_cards,
                progress_frac=min(max(progress[s], 0.0), 1.0),
                throughput_frac=rate[s],
            )
            jobs.append(reading)
        return tuple(jobs)

    # ================================================================================================
    # stepping (called by the plant)
    # ================================================================================================
    @property
    def needs_scheduling(self) -> bool:
        """The queue or the free cards changed since the scheduler last ran."""
        return self._sched_dirty

    def cards_freed(self) -> None:
        """A card came back (repaired): run the scheduler at the next chance."""
        self._sched_dirty = True

    def fallback_due(self) -> None:
        """The time :meth:`schedule` asked for has come (a queued job's external timeout)."""
        self._fallback_at = _INF
        self._sched_dirty = True

    def refresh_order(self) -> None:
        """Order the busy cards by job, if placements changed (for :meth:`slowest_stretch`)."""
        if not self._order_dirty:
            return
        busy = np.flatnonzero(self.card_slot > 0)
        if busy.size == 0:
            self._order = np.zeros(0, dtype=np.int64)
            self._starts = np.zeros(0, dtype=np.int64)
            self._seg_slot = np.zeros(0, dtype=np.int64)
        else:
            order = busy[np.argsort(self.card_slot[busy], kind="stable")]
            slots = self.card_slot[order]
            starts = np.flatnonzero(np.concatenate([[True], slots[1:] != slots[:-1]]))
            self._order, self._starts, self._seg_slot = order, starts.astype(np.int64), slots[starts]
        self._order_dirty = False

    def slowest_stretch(self, r_clock: FloatArray) -> FloatArray | None:
        """The pace of each job: given every card's step stretch ``f_top / f`` at its level, each card's
        job's largest (its slowest card's; 1 for cards with no job); None when no card has a job."""
        if not self._order.size:
            return None
        self._s_rslow[self._seg_slot] = np.maximum.reduceat(r_clock[self._order], self._starts)
        out: FloatArray = self._s_rslow[self.card_slot]
        return out

    def advance(self, dt_s: float) -> None:
        """The computing jobs make progress over a step at their slowest card's pace (set by the last
        :meth:`slowest_stretch`); work and SLO violations are counted."""
        if not self._n_computing:
            return
        comp = self._s_computing
        rel = 1.0 / (self._s_cs * self._s_rslow + self._s_omc)
        rate = np.where(comp, rel, 0.0)
        self._s_rate = rate
        self._s_progress += rate * (dt_s / self._s_step)
        self.work_card_s += float(np.dot(rate, self._s_ncards)) * dt_s
        viol = comp & (rel < self._s_min_frac - 1e-12)
        if viol.any():
            self.slo_violation_s += float(viol.sum()) * dt_s
            for s in np.flatnonzero(viol):
                job = self._slot_job[int(s)]
                if job is not None:
                    job.slo_violation_s += dt_s

    def reach_thresholds(self, t: float) -> None:
        """Jobs whose progress reached their next checkpoint or their end during the step now ending at ``t``."""
        if not self._n_computing:
            return
        hit = self._s_progress >= self._s_threshold
        if hit.any():
            for s in np.flatnonzero(hit):
                job = self._slot_job[int(s)]
                if job is not None:
                    self._reached_threshold(job, t)

    def process_timers(self, t: float) -> None:
        """Apply the job timers due at ``t``: start computing, stalls and their ends, checkpoints done,
        requeues after a failure."""
        if self._timer_min > t + _EPS_S:
            return
        due = np.flatnonzero(self._s_next_event <= t + _EPS_S)
        for s in due:
            job = self._slot_job[int(s)]
            if job is None:  # pragma: no cover - defensive
                self._s_next_event[s] = _INF
                continue
            action = job.next_action
            self._s_next_event[s] = _INF
            kind = action[0]
            if kind in ("start", "resume"):
                if job.compute_start_s is None:
                    job.compute_start_s = t
                self._set_phase(job, Phase.COMPUTE, t)
                self._schedule_stall(job, t)
            elif kind == "stall":
                _, phase, dur = action
                self._set_phase(job, phase, t, detail="input stall" if phase == Phase.WAITING else "collective stall")
                self._set_timer(job, t + dur, ("resume",))
            elif kind == "ckpt_done":
                job.last_ckpt_steps = job.pending_ckpt_steps
                self._s_next_ckpt[s] = job.last_ckpt_steps + job.ckpt_interval_steps
                self._set_phase(job, Phase.COMPUTE, t)
                self._schedule_stall(job, t)
            elif kind == "requeue":
                self._requeue(job, t, str(action[1]))
        self._timer_min = float(self._s_next_event.min())

    def card_failed(self, c: int, t: float) -> None:
        """Card ``c`` has just failed: its job (if any, and not already failing) loses the work since
        its last checkpoint, waits, and is queued again ``restart_delay_s`` later."""
        s = int(self.card_slot[c])
        job = self._slot_job[s] if s > 0 else None
        if job is None or job.next_action[0] == "requeue":
            return
        spec = job.spec
        lost = float(self._s_progress[s]) - job.last_ckpt_steps
        if lost > 0:
            lost_card_s = lost * spec.step_time_s * spec.n_cards
            self.work_card_s -= lost_card_s
            self.lost_work_card_s += lost_card_s
        self._s_progress[s] = job.last_ckpt_steps
        self._set_phase(job, Phase.WAITING, t, detail=f"card {c} failed")
        self._set_timer(job, t + self.config.phases.restart_delay_s, ("requeue", f"card {c} failed"))

    # ================================================================================================
    # queue and placement
    # ================================================================================================
    def enqueue(self, job: Job, t: float, front: bool) -> None:
        first = job.state == "pending"
        job.state = "queued"
        job.phase = Phase.WAITING
        job.queued_since_s = t
        job.cards = np.zeros(0, dtype=np.int64)
        if front:
            self._queue.insert(0, job)
        else:
            self._queue.append(job)
        if first:
            self.n_submitted += 1
            self._emit(t, job, "submitted")
        self._sched_dirty = True

    def place(self, job: Job, cards: IntArray, t: float, *, startup_s: float | None = None) -> None:
        """Start queued ``job`` on ``cards`` (checked by the caller: free, healthy, as many as it needs)
        after ``startup_s`` (None: the phase model's)."""
        self._queue.remove(job)
        self._start(job, cards, t, startup_s)

    def schedule(self, t: float, failed: BoolArray) -> float | None:
        """Built-in first-fit scheduler (see :meth:`_first_fit`) with EASY backfilling; ``failed``:
        the failed cards. Returns a time to run it again at (a queued job's external timeout; the plant
        calls :meth:`fallback_due` then), or None."""
        self._sched_dirty = False
        if not self._queue:
            return None
        cfg = self.config
        external = cfg.placement == "external"
        free = (self.card_slot == 0) & ~failed
        n_free = int(free.sum())
        remaining: list[Job] = []
        blocked = False
        res, spare = Reservation(_INF, _INF), _INF
        next_fallback = _INF
        for job in self._queue:
            if external and t + _EPS_S < job.queued_since_s + cfg.external_timeout_s:
                next_fallback = min(next_fallback, job.queued_since_s + cfg.external_timeout_s)
                remaining.append(job)
                continue
            n_need = job.spec.n_cards
            if blocked:
                # EASY backfilling (twin.easy_backfill): start ahead of the blocked job only what does
                # not delay its reservation
                left = spare_after_backfill(t + self._expected_hold_s(job), n_need, res, spare)
                if n_need > n_free or left is None:
                    remaining.append(job)
                    continue
                spare = left
            elif n_need > n_free:
                if t - job.queued_since_s >= cfg.backfill_wait_s:
                    blocked = True
                    # the reservation is a promise: it does not slip when jobs ahead of it overrun their
                    # expected ends (means, not wall-time limits); once due, the site drains for it
                    res = keep_promise(self._reserved, job.spec.job_id, self._reservation(n_need, n_free, t, failed))
                    spare = res.spare_cards
                    self._reserved = (job.spec.job_id, res.shadow_s)
                remaining.append(job)
                continue
            cards = self._first_fit(free, n_need)
            free[cards] = False
            n_free -= n_need
            self._start(job, cards, t)
            self.n_placed_by_plant += external
        self._queue = remaining
        if next_fallback < self._fallback_at:
            self._fallback_at = next_fallback
            return next_fallback
        return None

    def _expected_hold_s(self, job: Job) -> float:
        """Expected time ``job`` holds its cards from now when it starts now: start-up plus its remaining
        top-clock training, stretched by the expected stalls and checkpoints (the run time a user's
        wall-time request would tell a batch scheduler)."""
        spec = job.spec
        ph = self.config.phases
        left = max(spec.work_steps - job.progress_steps, 0.0) * spec.step_time_s
        return ph.startup_s + left * ph.wall_time_stretch(spec.checkpoint_interval_s, spec.checkpoint_duration_s)

    def _reservation(self, n_need: int, n_free: int, t: float, failed: BoolArray) -> Reservation:
        """EASY backfilling's reservation for a blocked job of ``n_need`` cards: the expected time
        enough cards are free for it (running jobs end in the order of their expected ends) and how
        many cards are spare then. A job that can never fit (too many failed cards) reserves nothing."""
        ph = self.config.phases
        ends: list[tuple[float, int]] = []
        for s, job in enumerate(self._slot_job):
            if job is None:
                continue
            if job.next_action[0] == "requeue":  # a failed card: the job lets its cards go then
                end = float(self._s_next_event[s])
            else:
                spec = job.spec
                left = max(float(self._s_work[s] - self._s_progress[s]), 0.0) * spec.step_time_s
                end = t + left * ph.wall_time_stretch(spec.checkpoint_interval_s, spec.checkpoint_duration_s)
                if job.next_action[0] == "start":
                    end += max(float(self._s_next_event[s]) - t, 0.0)
            healthy = int((~failed[job.cards]).sum())
            ends.append((end, healthy))
        ends.sort()
        return reservation_from_ends(ends, n_need, n_free, t)

    def _first_fit(self, free: BoolArray, n_need: int) -> IntArray:
        """Compact first fit: the first supernode with enough free cards, its free cards in index
        order (filling racks in order); if no supernode has enough, free cards across the site."""
        per_sn = self.site.cards_per_supernode
        counts = free.reshape(self.site.supernodes, per_sn).sum(axis=1)
        fits = np.flatnonzero(counts >= n_need)
        if fits.size:
            sn = int(fits[0])
            local = np.flatnonzero(free[sn * per_sn : (sn + 1) * per_sn])[:n_need]
            return (local + sn * per_sn).astype(np.int64)
        return np.flatnonzero(free)[:n_need].astype(np.int64)

    # ================================================================================================
    # lifecycle of a running job
    # ================================================================================================
    def _emit(self, t: float, job: Job, kind: str, detail: str = "", with_cards: bool = False) -> None:
        self._events.append(
            JobEvent(
                time_s=t,
                job_id=job.spec.job_id,
                kind=kind,
                phase=job.phase,
                cards=tuple(job.cards.tolist()) if with_cards else (),
                job=job.spec if kind == "submitted" else None,
                detail=detail,
            )
        )

    def _start(self, job: Job, cards: IntArray, t: float, startup_s: float | None = None) -> None:
        if self._reserved is not None and self._reserved[0] == job.spec.job_id:
            self._reserved = None
        if not self._free_slots:
            self._grow_slots(self._cap * 2)
        s = self._free_slots.pop()
        spec = job.spec
        job.slot = s
        job.cards = cards
        job.state = "running"
        if job.start_s is None:
            job.start_s = t
        self._slot_job[s] = job
        self.card_slot[cards] = s
        self._order_dirty = True
        ready = self._ready_cards(cards, t)
        delay = self.config.phases.startup_s if startup_s is None else startup_s
        start_at = max(t + delay, ready)
        self._s_cs[s] = spec.compute_share
        self._s_omc[s] = 1.0 - spec.compute_share
        self._s_step[s] = spec.step_time_s
        self._s_ncards[s] = spec.n_cards
        self._s_progress[s] = job.progress_steps
        self._s_work[s] = spec.work_steps
        self._s_next_ckpt[s] = job.last_ckpt_steps + job.ckpt_interval_steps
        self._s_min_frac[s] = spec.min_throughput_frac
        self._s_rate[s] = 0.0
        self._set_phase(job, Phase.WAITING, t, emit=False)
        self._emit(t, job, "started", with_cards=True)
        self._set_timer(job, start_at, ("start",))

    def _set_timer(self, job: Job, at_s: float, action: tuple[Any, ...]) -> None:
        job.next_action = action
        self._s_next_event[job.slot] = at_s
        if at_s < self._timer_min:
            self._timer_min = at_s

    def _set_phase(self, job: Job, phase: Phase, t: float, emit: bool = True, detail: str = "") -> None:
        s = job.slot
        was = bool(self._s_computing[s])
        job.phase = phase
        spec = job.spec
        comp = phase == Phase.COMPUTE
        if comp:
            cs, ncu = spec.compute_share, spec.noncompute_utilization
            self._s_threshold[s] = min(self._s_next_ckpt[s], self._s_work[s])
        else:
            cs = 0.0
            if phase == Phase.COMMUNICATION:
                ncu = self.config.phases.communication_utilization
            elif phase == Phase.CHECKPOINT:
                ncu = self.config.phases.checkpoint_utilization
            else:
                ncu = self.config.phases.waiting_utilization
            self._s_threshold[s] = _INF
            self._s_rate[s] = 0.0
        self._s_computing[s] = comp
        self._n_computing += int(comp) - int(was)
        cards = job.cards
        self.card_cs[cards] = cs
        self.card_omc[cards] = 1.0 - cs
        self.card_ncu[cards] = ncu
        self.card_a[cards] = (1.0 - cs) * ncu
        if emit:
            self._emit(t, job, "phase", detail=detail)

    def _schedule_stall(self, job: Job, t: float) -> None:
        ph = self.config.phases
        rate_c = ph.comm_stalls_per_hour / 3600.0
        rate_i = ph.input_stalls_per_hour / 3600.0
        total = rate_c + rate_i
        if total <= 0.0:
            self._set_timer(job, _INF, ("none",))
            return
        rng = job.rng
        gap = float(rng.exponential(1.0 / total))
        if rng.random() < rate_c / total:
            phase, median = Phase.COMMUNICATION, ph.comm_stall_median_s
        else:
            phase, median = Phase.WAITING, ph.input_stall_median_s
        dur = float(median * math.exp(ph.stall_sigma * float(rng.standard_normal())))
        self._set_timer(job, t + gap, ("stall", phase, dur))

    def _reached_threshold(self, job: Job, t: float) -> None:
        s = job.slot
        if self._s_progress[s] >= self._s_work[s]:
            self._finish(job, t)
            return
        job.pending_ckpt_steps = float(self._s_progress[s])
        self._set_phase(job, Phase.CHECKPOINT, t)
        self._set_timer(job, t + job.spec.checkpoint_duration_s, ("ckpt_done",))

    def _release(self, job: Job) -> None:
        s = job.slot
        was = bool(self._s_computing[s])
        self._n_computing -= int(was)
        cards = job.cards
        self.card_slot[cards] = 0
        self.card_cs[cards] = 0.0
        self.card_omc[cards] = 1.0
        self.card_ncu[cards] = 0.0
        self.card_a[cards] = 0.0
        job.progress_steps = float(self._s_progress[s])
        for arr, fill in (
            (self._s_computing, False),
            (self._s_threshold, _INF),
            (self._s_next_event, _INF),
            (self._s_rate, 0.0),
            (self._s_rslow, 1.0),
            (self._s_ncards, 0.0),
            (self._s_cs, 0.0),
            (self._s_omc, 1.0),
        ):
            arr[s] = fill
        self._slot_job[s] = None
        self._free_slots.append(s)
        job.slot = 0
        self._order_dirty = True
        self._sched_dirty = True
        self._timer_min = float(self._s_next_event.min())

    def _finish(self, job: Job, t: float) -> None:
        s = job.slot
        spec = job.spec
        overshoot = float(self._s_progress[s]) - spec.work_steps
        if overshoot > 0:  # progress past the end within the last step is not work
            self.work_card_s -= overshoot * spec.step_time_s * spec.n_cards
            self._s_progress[s] = spec.work_steps
        self._release(job)
        job.state = "finished"
        job.finish_s = t
        job.phase = Phase.WAITING
        self.n_finished += 1
        self._emit(t, job, "finished", with_cards=False)

    def _requeue(self, job: Job, t: float, why: str) -> None:
        self._release(job)
        job.restarts += 1
        job.progress_steps = job.last_ckpt_steps
        if job.restarts > self.config.phases.max_restarts:
            job.state = "failed"
            job.finish_s = t
            self.n_failed += 1
            self._emit(t, job, "failed", detail=f"{why}; gave up after {job.restarts - 1} restarts")
            return
        self.enqueue(job, t, front=True)
        self._emit(t, job, "requeued", detail=why)
