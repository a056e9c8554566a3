"""Where two policies' work differs, job by job: the "why" behind a throughput verdict.

Two policies get the same jobs, so the difference in work they did (top-clock-equivalent
card-seconds kept, ``twin.plant.JobRecord.work_done_card_s``; their sum is the run's work) is the sum
of per-job differences. A job that finishes within the run does the same work under both (its
total); only the jobs still running or queued at the end differ, each by about its cards times how
much later it started (a queue wait, a host's boot) or how much slower it ran (DVFS). On a day at
65% allocation one big job started a few minutes later can outweigh everything else (the nominal day
before 39da4ac: one 256-card job started 1,215 s later under racktwin than under reactive cost 1.18%
of the work, the other jobs gained 0.80%; docs/evaluation.md), so a throughput verdict is explained
by the jobs behind it, not by a mean.

Pure functions (no I/O); ``agent.evaluate`` records :class:`JobWork` per policy and
``agent.targets`` names the largest differences in a missed target's why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from twin.plant import JobRecord

__all__ = ["JobDifference", "JobWork", "describe_work_gap", "job_work", "work_differences"]


@dataclass(frozen=True)
class JobWork:
    """One job at the end of a run: its size, when it was first placed and began training, and the
    work it did."""

    job_id: str
    n_cards: int
    start_s: float | None  # first placement (plant time); None: never placed
    work_card_s: float
    compute_start_s: float | None = None  # first step of training (after wake-ups, boots, start-up)


@dataclass(frozen=True)
class JobDifference:
    """One job under policy P against policy O: P's work, placement and first training step less O's."""

    job_id: str
    n_cards: int
    work_delta_card_s: float
    start_delta_s: float | None  # placement; None: one of them never placed it
    started: tuple[bool, bool]  # placed (under P, under O)
    compute_start_delta_s: float | None = None  # first step of training; None: one of them never began
    computing: tuple[bool, bool] = (True, True)  # began training (under P, under O)


def job_work(records: Iterable[JobRecord]) -> tuple[JobWork, ...]:
    """The per-job work of a plant's job records."""
    return tuple(JobWork(r.job_id, r.n_cards, r.start_time_s, r.work_done_card_s, r.compute_start_s) for r in records)


def work_differences(p: Sequence[JobWork], o: Sequence[JobWork], min_card_s: float = 1.0) -> list[JobDifference]:
    """Jobs whose work differs by at least ``min_card_s`` between ``p`` and ``o`` (a job missing from
    one counts as no work there), largest loss of ``p`` first."""
    by_o = {j.job_id: j for j in o}
    by_p = {j.job_id: j for j in p}
    out: list[JobDifference] = []
    for jid in dict.fromkeys([*by_p, *by_o]):
        jp, jo = by_p.get(jid), by_o.get(jid)
        wp = jp.work_card_s if jp is not None else 0.0
        wo = jo.work_card_s if jo is not None else 0.0
        if abs(wp - wo) < min_card_s:
            continue
        ref = jp if jp is not None else jo
        assert ref is not None  # jid comes from one of them
        sp = jp.start_s if jp is not None else None
        so = jo.start_s if jo is not None else None
        cp = jp.compute_start_s if jp is not None else None
        co = jo.compute_start_s if jo is not None else None
        out.append(
            JobDifference(
                job_id=jid,
                n_cards=ref.n_cards,
                work_delta_card_s=wp - wo,
                start_delta_s=sp - so if sp is not None and so is not None else None,
                started=(sp is not None, so is not None),
                compute_start_delta_s=cp - co if cp is not None and co is not None else None,
                computing=(cp is not None, co is not None),
            )
        )
    out.sort(key=lambda d: (d.work_delta_card_s, d.job_id))
    return out


def _same(delta_s: float) -> bool:
    """A time difference that rounds to 0 s (the whole seconds the texts print)."""
    return round(abs(delta_s)) == 0


def _shift(delta_s: float) -> str:
    if _same(delta_s):
        return "at the same time"
    return f"{abs(delta_s):,.0f} s {'later' if delta_s > 0 else 'earlier'}"


def _how(d: JobDifference, other: str) -> str:
    """When the job was placed and began training against ``other``: a job placed at the same time
    but computing later waited for its cards to wake or its hosts to boot. A delay explains at most
    its cards times its length in work (a card does at most one top-clock second per second); a gap
    beyond that (more than a tenth more) came after the start as well: "then ran slower" (DVFS, a
    slower card, a rollback after a failure). A job placed under both that began training under only
    one of them (its hosts still booting at the end) says so."""
    if d.start_delta_s is not None:
        when = f"with {other}" if _same(d.start_delta_s) else f"{_shift(d.start_delta_s)} than under {other}"
        placed = f"placed {when}"
        if d.computing == (False, True):
            return f"{placed}, never computing; under {other} it was"
        if d.computing == (True, False):
            return f"{placed}, computing; under {other} never"
        c = d.compute_start_delta_s
        if c is not None and not _same(c - d.start_delta_s):  # it waited longer (or less) once placed
            return f"placed {_shift(d.start_delta_s)}, computing {_shift(c)} than under {other}{_after(d, c)}"
        if _same(d.start_delta_s):
            return f"placed and computing with {other}, ran {'slower' if d.work_delta_card_s < 0 else 'faster'}"
        return f"{placed}{_after(d, d.start_delta_s)}"
    if d.started[0]:
        return f"placed; under {other} never"
    return f"never placed; under {other} it was"


def _after(d: JobDifference, delay_s: float) -> str:
    """ ", then ran slower" / ", then ran faster" where the work gap exceeds what the start's
    ``delay_s`` explains (see :func:`_how`), else ""."""
    gap = d.work_delta_card_s
    # the part of the gap a later (loss) or earlier (gain) start explains; none where it points the other way
    explained = 1.1 * d.n_cards * max(delay_s if gap < 0 else -delay_s, 0.0)
    if abs(gap) - explained <= d.n_cards:  # within a second of the job's work
        return ""
    return f", then ran {'slower' if gap < 0 else 'faster'}"


def describe_work_gap(p: Sequence[JobWork], o: Sequence[JobWork], other: str, top: int = 3) -> str:
    """The jobs that make most of the work difference of ``p`` against ``o`` (the policy called
    ``other``), largest first, then the rest together, each also as a share of ``o``'s work (none
    where ``o`` did no work); "" when no job's work differs."""
    diffs = work_differences(p, o)
    if not diffs:
        return ""
    o_work = sum(j.work_card_s for j in o)

    def share(card_s: float) -> str:
        return f" ({100.0 * card_s / o_work:+.2f}%)" if o_work > 0 else ""

    ranked = sorted(diffs, key=lambda d: -abs(d.work_delta_card_s))
    named = ranked[:top]
    parts = [
        f"{d.job_id} ({d.n_cards} cards, {_how(d, other)}) {d.work_delta_card_s:+,.0f} card-s"
        + share(d.work_delta_card_s)
        for d in named
    ]
    rest = ranked[top:]
    if rest:
        rest_card_s = sum(d.work_delta_card_s for d in rest)
        others = f"{len(rest)} other job{'s' if len(rest) > 1 else ''}"
        parts.append(f"{others} {rest_card_s:+,.0f} card-s{share(rest_card_s)}")
    total = sum(d.work_delta_card_s for d in diffs)
    differ = "1 job differs" if len(diffs) == 1 else f"{len(diffs)} jobs differ"
    return f"by job ({total:+,.0f} card-s in all, {differ}): " + "; ".join(parts)
