"""The decode node's fail-over settings, with `tandem.decode_node.worker.DecodeOptions`'s
fields, defaults and checks (less the threshold, which `ClusterConfig` has), and its abort
resend period. A copy, because the simulator imports only the engine and the router
(design §2, tests/test_layout.py); tests/sim/test_failures.py checks that the copy and the
real class agree. The policy acting on them is in `sim/decode.py`."""

from __future__ import annotations

from dataclasses import dataclass

# `decode_node.worker.ABORT_RESEND_S`: seconds between two sends of an unconfirmed abort.
ABORT_RESEND_S = 1.0


@dataclass(frozen=True)
class FailoverOptions:
    on_prefill_failure: str = "recompute"  # or "fail"
    prefill_timeout_s: float = 30.0
    hold_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.on_prefill_failure not in ("recompute", "fail"):
            raise ValueError("on_prefill_failure must be 'recompute' or 'fail'")
        if self.prefill_timeout_s <= 0:
            raise ValueError("the prefill timeout must be > 0")
