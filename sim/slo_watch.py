"""Ends a simulation as soon as it can no longer meet its SLOs.

`tandem plan` asks of each candidate only whether it meets the SLOs (every request finished,
at least `attainment` of them within both targets) and, of those that do, their goodput. A
candidate that cannot is most of the search's time: its queues grow until the workload
ends. The watch counts the requests that missed a target as the client sees them (as
`results.summarize` judges them: TTFT at the first token, TPOT at the last) or as soon as
they must miss it (no first token by the TTFT deadline, no last token by the TPOT one;
the deadlines sit a hair past the target, 1e-9 relative, so that no rounding of the times
can call a request late that `summarize` would call on time), and trips when the share
still possible falls below `attainment`, or when a request ends unfinished. A run it stops
cannot meet the SLOs; a run that could is never stopped, so the search's answer is the
exhaustive one.
"""

from __future__ import annotations

from tandem.sim.cluster import RequestRecord
from tandem.sim.results import SLO, tpot


class SLOWatch:
    def __init__(self, slo: SLO, attainment: float, num_requests: int) -> None:
        self.slo = slo
        self.attainment = attainment
        self.num_requests = num_requests
        self.missed: set[str] = set()
        self.lost = False

    def first_token_deadline(self, record: RequestRecord) -> float:
        return _past(record.arrival_s, self.slo.ttft_s)

    def last_token_deadline(self, record: RequestRecord) -> float | None:
        """After the first token; None for a one-token output (no TPOT)."""
        if record.num_output_tokens < 2 or record.first_token_s is None:
            return None
        return _past(record.first_token_s, self.slo.tpot_s * (record.num_output_tokens - 1))

    def first_token_due(self, record: RequestRecord) -> None:
        """At the TTFT deadline: a request with no first token yet misses."""
        if record.first_token_s is None:
            self._miss(record)

    def last_token_due(self, record: RequestRecord) -> None:
        """At the TPOT deadline: a request with no last token yet misses."""
        if record.finish_s is None:
            self._miss(record)

    def first_token(self, record: RequestRecord) -> None:
        assert record.first_token_s is not None
        if record.first_token_s - record.arrival_s > self.slo.ttft_s:
            self._miss(record)

    def finished(self, record: RequestRecord) -> None:
        if (tpot(record) or 0.0) > self.slo.tpot_s:
            self._miss(record)

    def ended_unfinished(self) -> None:
        self.lost = True  # the SLOs need every request finished

    def _miss(self, record: RequestRecord) -> None:
        self.missed.add(record.request_id)
        # the best share left, computed as `summarize` computes the attained one
        best = (self.num_requests - len(self.missed)) / max(self.num_requests, 1)
        self.lost = self.lost or best < self.attainment


def _past(start: float, span: float) -> float:
    return start + span + 1e-9 * (1.0 + abs(start) + span)
