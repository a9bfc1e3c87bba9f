"""What the routers saw over one planning interval (`TrafficWindow`), from two scrapes of
each router's `/metrics` (`RouterScrape`).

The planner reads only metrics every router exports from its start (docs/observability.md):
requests ended (`tandem_request_success_total`, every finish reason) and in flight
(`tandem_router_requests_in_flight`), so arrivals are what ended plus what the backlog grew
by; the prompt and generated lengths of finished requests; time to first token and time per
output token as the client sees them; prompt blocks the chosen prefill worker had cached
(`tandem_router_prefix_overlap_blocks_total`) against prompt tokens. A router restarted
between two scrapes counts from zero; one that left is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tandem.planner.histogram import BucketCounts

ENDED = "tandem_request_success"
IN_FLIGHT = "tandem_router_requests_in_flight"
PROMPT = "tandem_request_prompt_tokens"
GENERATED = "tandem_request_generation_tokens"
TTFT = "tandem_time_to_first_token_seconds"
TPOT = "tandem_request_time_per_output_token_seconds"
PREFIX_BLOCKS = "tandem_router_prefix_overlap_blocks"
HISTOGRAMS = (PROMPT, GENERATED, TTFT, TPOT)


@dataclass(frozen=True)
class RouterScrape:
    """One router's cumulative figures at one scrape."""

    ended: float
    in_flight: float
    histograms: dict[str, BucketCounts]
    prefix_blocks: float

    @classmethod
    def parse(cls, text: str) -> RouterScrape:
        """From the Prometheus text of a router's `/metrics`. Raises ValueError on text
        that is not the exposition format."""
        sums: dict[str, float] = {}
        buckets: dict[str, dict[float, float]] = {name: {} for name in HISTOGRAMS}
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.name in buckets and sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    buckets[family.name][le] = buckets[family.name].get(le, 0.0) + sample.value
                elif family.name in buckets and sample.name.endswith("_sum"):
                    totals[family.name] = totals.get(family.name, 0.0) + sample.value
                elif not sample.name.endswith("_created"):
                    sums[family.name] = sums.get(family.name, 0.0) + sample.value
        histograms = {
            name: BucketCounts(
                tuple(sorted(b)), tuple(b[k] for k in sorted(b)), totals.get(name, 0.0)
            )
            for name, b in buckets.items()
        }
        return cls(
            ended=sums.get(ENDED, 0.0),
            in_flight=sums.get(IN_FLIGHT, 0.0),
            histograms=histograms,
            prefix_blocks=sums.get(PREFIX_BLOCKS, 0.0),
        )


@dataclass(frozen=True)
class TrafficWindow:
    """The routers' traffic over `seconds`; histograms of the requests that finished in it."""

    seconds: float
    arrivals: float
    histograms: dict[str, BucketCounts]
    prefix_blocks: float
    block_size: int

    @property
    def rate_rps(self) -> float:
        return self.arrivals / self.seconds if self.seconds > 0 else 0.0

    @property
    def finished(self) -> float:
        return self.histograms[PROMPT].count

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens the chosen prefill worker had cached, of all prompt tokens."""
        tokens = self.histograms[PROMPT].total
        return min(1.0, self.prefix_blocks * self.block_size / tokens) if tokens > 0 else 0.0

    def attainment(self, ttft_s: float, tpot_s: float) -> float | None:
        """The measured share within both targets, bounded from above by the lower of the
        two shares (the metrics are per target, not joint); None with no finished request."""
        ttft = self.histograms[TTFT].share_at_most(ttft_s)
        tpot = self.histograms[TPOT].share_at_most(tpot_s)
        shares = [s for s in (ttft, tpot) if s is not None]
        return min(shares) if shares else None


def window(
    before: Mapping[str, RouterScrape],
    after: Mapping[str, RouterScrape],
    seconds: float,
    block_size: int,
) -> TrafficWindow:
    """The traffic between two scrapes of the routers (by pod name)."""
    arrivals, prefix = 0.0, 0.0
    histograms: dict[str, BucketCounts] = {}
    for pod, now in after.items():
        then = before.get(pod)
        reset = then is None or now.ended < then.ended
        arrivals += now.ended + now.in_flight - (0.0 if reset else then.ended + then.in_flight)
        prefix += now.prefix_blocks - (0.0 if reset else then.prefix_blocks)
        for name in HISTOGRAMS:
            part = now.histograms[name].since(None if reset else then.histograms[name])
            histograms[name] = histograms[name].plus(part) if name in histograms else part
    for name in HISTOGRAMS:
        histograms.setdefault(name, BucketCounts((), ()))
    return TrafficWindow(seconds, max(0.0, arrivals), histograms, max(0.0, prefix), block_size)
