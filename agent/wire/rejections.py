"""Rejections: why an incoming message was not accepted (:class:`RejectReason`, :class:`Rejection`)
and :class:`RejectionCounter`, which counts them by reason and logs them (rate-limited)."""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("racktwin.wire")


class RejectReason(enum.StrEnum):
    """Why an incoming message was rejected. A fixed set: each is a Prometheus label value."""

    UNKNOWN_TOPIC = "unknown_topic"  # not a racktwin/v1/{site}/... topic of this protocol
    UNKNOWN_RACK = "unknown_rack"  # a rack (in the topic or a payload) that the site does not have
    TOO_LARGE = "too_large"  # payload above the size limit, not parsed
    MALFORMED_JSON = "malformed_json"  # not JSON, not UTF-8, trailing data
    NON_FINITE = "non_finite"  # a NaN or Infinity literal, a number out of float range, null where a number goes
    WRONG_SCHEMA = "wrong_schema"  # schema name/version is not the one of this topic
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    WRONG_TYPE = "wrong_type"
    OUT_OF_RANGE = "out_of_range"  # physically impossible or outside the allowed values / lengths
    CARD_OUT_OF_RACK = "card_out_of_rack"  # a card index >= cards per rack
    DUPLICATE_CARD = "duplicate_card"
    LENGTH_MISMATCH = "length_mismatch"  # per-card columns of unequal length
    INCONSISTENT = "inconsistent"  # fields that contradict each other (action vs parameters, expiry)
    INVALID = "invalid"  # anything else (should not happen; logged with the detail)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A message that was not accepted: why (a fixed reason), a human detail, and its topic."""

    reason: RejectReason
    detail: str
    topic: str = ""

    def __bool__(self) -> bool:  # so that ``if (msg := codec.decode(...)):`` skips rejections
        return False


class RejectionCounter:
    """Counts rejections by reason and logs them, at most ``log_burst`` lines per reason in each
    fixed window of ``log_interval_s`` (the number left out is reported with the next line; around a
    window's edge up to twice ``log_burst`` lines may come close together). Thread-safe.

    The service exposes :meth:`snapshot` as ``racktwin_rejected_messages_total{reason=...}``.
    """

    def __init__(
        self,
        *,
        logger: logging.Logger | None = None,
        log_interval_s: float = 10.0,
        log_burst: int = 5,
        clock: Any = time.monotonic,
    ) -> None:
        self._counts: dict[RejectReason, int] = dict.fromkeys(RejectReason, 0)
        self._lock = threading.Lock()
        self._logger = logger or log
        self._interval_s = log_interval_s
        self._burst = log_burst
        self._clock = clock
        self._window: dict[RejectReason, tuple[float, int, int]] = {}  # start, logged, suppressed

    def record(self, rejection: Rejection) -> None:
        reason = rejection.reason
        now = self._clock()
        with self._lock:
            self._counts[reason] += 1
            start, logged, suppressed = self._window.get(reason, (now, 0, 0))
            if now - start >= self._interval_s:
                start, logged = now, 0
            if logged < self._burst:
                self._window[reason] = (start, logged + 1, 0)
                emit, left_out = True, suppressed
            else:
                self._window[reason] = (start, logged, suppressed + 1)
                emit, left_out = False, 0
        if emit:
            more = f" ({left_out} more {reason} rejections not logged)" if left_out else ""
            self._logger.warning(
                "rejected message on %r: %s: %s%s", rejection.topic[:200], reason, rejection.detail[:300], more
            )

    def count(self, reason: RejectReason | str) -> int:
        return self._counts[RejectReason(reason)]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def snapshot(self) -> dict[str, int]:
        """Counts by reason value, every reason present (zero included)."""
        with self._lock:
            return {r.value: n for r, n in self._counts.items()}


class _Reject(Exception):
    """Internal: raised by cross-field checks, turned into a Rejection by the codec."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
