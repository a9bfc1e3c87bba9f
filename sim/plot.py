"""The latency-against-load plot of a sweep (matplotlib, PNG, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_sweep(result: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(result["runs"], key=lambda r: r["offered_rps"])
    rate = [r["offered_rps"] for r in runs]
    fig, (ax_ttft, ax_tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for p in ("p50", "p90"):
        ax_ttft.plot(rate, [r["ttft_s"][p] for r in runs], marker="o", label=f"TTFT {p}")
        ax_tpot.plot(rate, [r["tpot_s"][p] for r in runs], marker="o", label=f"TPOT {p}")
    ax_ttft.plot(rate, [r["e2e_s"]["p50"] for r in runs], marker="s", label="E2E p50")
    for ax, title in ((ax_ttft, "time to first token / end to end"), (ax_tpot, "time per token")):
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    c = result["cluster"]
    fig.suptitle(
        f"{result['model']['name']} on {result['profile']['name']}: "
        f"{c['num_prefill']}P x TP{c['tp_prefill']} + {c['num_decode']}D x TP{c['tp_decode']}, "
        f"{c['policy']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
