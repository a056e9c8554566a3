"""Simulator-level faults: what the plant cannot do to itself (``twin.scenario.SimFault``).

:class:`DisconnectSchedule` tells the runner when to drop its MQTT connection and when to come
back (site time). What a disconnect does on the wire (docs/sim.md, "Broker disconnect"):

* the simulator closes its connection (an MQTT DISCONNECT; it registers no last will) and opens
  none until ``start_s + duration_s``; the plant keeps running;
* telemetry of the gap (site times ``start_s <= t < start_s + duration_s``) is lost, as in a real
  outage (QoS 0, nothing is buffered; counted as ``telemetry_dropped``); at the end of the gap the
  simulator waits up to 5 s of wall time for the broker before it goes on (then keeps trying in
  the background);
* job events of the gap are kept (up to 10,000) and published, in order and with their original
  time stamps, once the link is back: a scheduler's event stream is QoS 1 and must not be lost;
* the simulator's session is persistent (``clean_session = false``, a fixed client id, by default
  ``racktwin-sim-{site_id}``): the broker keeps its subscriptions and queues the QoS 1 commands sent
  during the gap (up to the broker's per-client queue limit) and delivers them on reconnect. Each
  is then judged by its expiry against the site clock: a command whose ``expires_at`` has passed is
  acked ``expired`` and not applied; the others are applied and acked as usual. The session is the
  run's own: a run starts by discarding what the broker kept for the client id (a clean connect,
  then the persistent one), so commands queued for an earlier run are never applied;
* after reconnecting it republishes every rack's retained applied state.

Windows that touch or overlap (one starting when or before another ends) are one outage: the link
stays down from the first start to the last end (one disconnect, one reconnect).
"""

from __future__ import annotations

from collections.abc import Sequence

from twin.scenario import SimFault

__all__ = ["DisconnectSchedule"]

_EPS_S = 1e-9


class DisconnectSchedule:
    """Disconnect windows of a run, consumed in time order."""

    def __init__(self, faults: Sequence[SimFault]) -> None:
        windows: list[tuple[float, float]] = []
        for start, end in sorted((f.start_s, f.end_s) for f in faults):
            if windows and start <= windows[-1][1] + _EPS_S:  # touches or overlaps the previous one
                windows[-1] = (windows[-1][0], max(windows[-1][1], end))
            else:
                windows.append((start, end))
        self._windows = windows
        self._i = 0
        self.down = False

    def transition(self, t_s: float) -> str | None:
        """``"disconnect"`` or ``"reconnect"`` when the link must change at site time ``t_s``, else None."""
        if self.down:
            start, end = self._windows[self._i]
            if t_s >= end - _EPS_S:
                self.down = False
                self._i += 1
                return "reconnect"
            return None
        while self._i < len(self._windows):
            start, end = self._windows[self._i]
            if t_s < start - _EPS_S:
                return None
            if t_s >= end - _EPS_S:  # a window passed entirely inside one step: skip it
                self._i += 1
                continue
            self.down = True
            return "disconnect"
        return None

    def next_change_s(self) -> float:
        """Site time of the next transition (inf when none is left)."""
        if self._i >= len(self._windows):
            return float("inf")
        start, end = self._windows[self._i]
        return end if self.down else start
