"""Candidates of one device count simulated side by side, one process per core.

Each candidate is one independent simulation of the same workload, so the search maps them
over a pool of forked processes. The workload, model, device profile and SLOs reach each
worker once, when it is forked (`_start` keeps them in the worker's `_inputs`, the one piece
of process state here: the worker exists only to run `evaluate` on them); each task is then
a `ClusterConfig` out and a `Candidate` back. With `jobs=1` nothing is forked.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape
from tandem.sim.workload import SimRequest

_inputs: dict[str, Any] = {}  # in a worker: what `_start` was given


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


class CandidatePool:
    """`evaluate_all` of a list of configurations, in their order; a context manager."""

    def __init__(
        self,
        shape: ModelShape,
        profile: DeviceProfile,
        requests: Sequence[SimRequest],
        slo: SLO,
        attainment: float,
        jobs: int = 1,
    ) -> None:
        self._args = (shape, profile, list(requests), slo, attainment)
        self._executor: ProcessPoolExecutor | None = None
        if jobs > 1:
            context = multiprocessing.get_context("fork")
            self._executor = ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_start, initargs=self._args
            )

    def __enter__(self) -> CandidatePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)

    def evaluate_all(self, configs: Sequence[ClusterConfig]) -> list[Any]:
        """`plan.evaluate` of each configuration (a `Candidate`, or None where the model
        does not fit)."""
        from tandem.sim.plan import evaluate

        if self._executor is None:
            return [evaluate(c, *self._args) for c in configs]
        return list(self._executor.map(_evaluate, configs))


def _start(*args: Any) -> None:
    _inputs["args"] = args


def _evaluate(config: ClusterConfig) -> Any:
    from tandem.sim.plan import evaluate

    return evaluate(config, *_inputs["args"])
