"""How a planned layout becomes the replicas set (`Stabilizer`), as the HPA's behaviour
does it: a pool scales up at once; it scales down only to the highest count planned over
the last `down_window_s` (the HPA's scale-down stabilization window, 300 s by default),
and not within `cooldown_s` of its last change. So a dip in traffic shorter than the
window removes nothing, a pod just added has time to start before it is judged, and a
planner that restarts keeps the pools as they are for a window.

The remote-prefill threshold rolls every decode pod when it changes, so it changes only to
one planned without a break for a whole `down_window_s` (seeded like the pools: a restart
holds a window), and not within `cooldown_s` of its last change."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tandem.planner.layout_search import Layout

POOLS = ("prefill", "decode")


@dataclass
class Stabilizer:
    down_window_s: float = 300.0
    cooldown_s: float = 60.0
    _planned: deque[tuple[float, Layout]] = field(default_factory=deque)
    _changed_at: dict[str, float] = field(default_factory=dict)
    _other_threshold: tuple[int, float] | None = None  # (planned, since) while it differs

    def settle(self, now_s: float, current: Layout, planned: Layout) -> Layout:
        """The layout to set now, given the current one and this interval's plan. The first
        call counts the current layout as planned now: a planner that (re)starts scales
        nothing down before a whole window has passed."""
        if not self._planned and self.down_window_s > 0:
            self._planned.append((now_s, current))
        self._planned.append((now_s, planned))
        while self._planned[0][0] < now_s - self.down_window_s:
            self._planned.popleft()
        counts = {pool: self._settle_pool(now_s, pool, current, planned) for pool in POOLS}
        return Layout(**counts, threshold=self._settle_threshold(now_s, current, planned))

    def _settle_pool(self, now_s: float, pool: str, current: Layout, planned: Layout) -> int:
        have, want = getattr(current, pool), getattr(planned, pool)
        if want < have:
            want = min(have, max(getattr(p, pool) for _, p in self._planned))
            if now_s - self._changed_at.get(pool, float("-inf")) < self.cooldown_s:
                want = have
        if want != have:
            self._changed_at[pool] = now_s
        return want

    def _settle_threshold(self, now_s: float, current: Layout, planned: Layout) -> int:
        have, want = current.threshold, planned.threshold
        if want == have:
            self._other_threshold = None
            return have
        if self._other_threshold is None or self._other_threshold[0] != want:
            self._other_threshold = (want, now_s)
        held_s = now_s - self._other_threshold[1]
        cooled_s = now_s - self._changed_at.get("threshold", float("-inf"))
        if held_s < self.down_window_s or cooled_s < self.cooldown_s:
            return have
        self._changed_at["threshold"] = now_s
        self._other_threshold = None
        return want
