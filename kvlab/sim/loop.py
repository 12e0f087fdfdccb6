"""The event loop: a heap of (time, seq, handler, args); handlers return new events.

`seq` is a per-loop counter, so events at the same time run in the order they were
scheduled (SimPy's tie-break) and two loops never share state. An event is a tuple
(time_s, handler, args); a handler is called as handler(now, *args) and returns an
iterable of new events, or None.
"""

from __future__ import annotations

import heapq
import math


class SimulationError(RuntimeError):
    """The simulator broke one of its own invariants (a bug, not bad input)."""


class EventLoop:
    """Discrete-event core. `now` never decreases; scheduling into the past is an error."""

    def __init__(self):
        self.now = 0.0
        self.events = 0  # handled so far
        self._heap: list = []
        self._seq = 0

    def schedule(self, time_s: float, handler, *args) -> None:
        if not time_s >= self.now:  # also rejects NaN
            raise SimulationError(
                f"event {getattr(handler, '__name__', handler)} scheduled at {time_s!r}, "
                f"before now ({self.now!r})"
            )
        heapq.heappush(self._heap, (time_s, self._seq, handler, args))
        self._seq += 1

    def add(self, events) -> None:
        """Schedule an iterable of (time_s, handler, args) events."""
        if events:
            for time_s, handler, args in events:
                self.schedule(time_s, handler, *args)

    def run(self, until_s: float = math.inf) -> float:
        """Handle events in time order until none is left (or the next is after `until_s`).
        Returns the time of the last handled event."""
        heap, pop, push = self._heap, heapq.heappop, heapq.heappush
        while heap and heap[0][0] <= until_s:
            time_s, _, handler, args = pop(heap)
            if time_s < self.now:
                raise SimulationError(f"event at {time_s!r} popped after {self.now!r}")
            self.now = time_s
            self.events += 1
            new = handler(time_s, *args)
            if new:
                for t, h, a in new:
                    if not t >= time_s:
                        raise SimulationError(
                            f"{getattr(handler, '__name__', handler)} at {time_s!r} returned an "
                            f"event at {t!r}, in the past"
                        )
                    push(heap, (t, self._seq, h, a))
                    self._seq += 1
        return self.now

    def __len__(self) -> int:
        return len(self._heap)
