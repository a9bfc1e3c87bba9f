"""Workers dying and restarting in a simulated run, and what the rest of the deployment
sees of it. A prefill worker: the decode nodes' connections drop one hop later (their
fail-over does the rest). A decode worker: the router's streams to it break one hop later
(`Cluster.on_decode_death`: the router's `Dispatcher.on_failure` ejects it and retries or
fails each request), and prefill workers' writes to it fail (`SimPrefill`). Either way the
router's health checks eject the worker (`WorkerPool`, after `EJECT_AFTER` failed rounds)
and take it back, with a new agent, once it restarted."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tandem.router.workers import EJECT_AFTER
from tandem.sim.faults import Outage
from tandem.sim.node import SimNode
from tandem.sim.router import prefill_endpoint

if TYPE_CHECKING:
    from tandem.sim.cluster import Cluster

# The router's health-check period (`WorkerMonitor`'s default interval).
HEALTH_INTERVAL_S = 1.0


class Outages:
    """Kills and restarts the cluster's nodes; counts them by role."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.deaths: Counter[str] = Counter()
        self.restarts: Counter[str] = Counter()

    def _pool(self, role: str) -> list:
        return self.cluster.prefills if role == "prefill" else self.cluster.decodes

    def schedule(self, outages: Sequence[Outage]) -> None:
        for outage in outages:
            pool = self._pool(outage.role)
            if outage.worker >= len(pool):
                raise ValueError(
                    f"outage of {outage.role} worker {outage.worker}: there are {len(pool)}"
                )
            self.cluster.events.at(outage.at_s, self._kill, outage)

    def _kill(self, outage: Outage) -> None:
        c = self.cluster
        node: SimNode = self._pool(outage.role)[outage.worker]
        if node.dead:
            return
        node.dead, node.died_s = True, c.events.now
        self.deaths[outage.role] += 1
        c.cores.stop(node)
        if outage.role == "prefill":
            self._tell_decodes("on_disconnect", outage.worker)
        else:
            c.on_decode_death(node)
        self._health_checks(node.url, EJECT_AFTER)
        if outage.restart_after_s is not None:
            c.events.after(outage.restart_after_s, self._restart, outage.role, outage.worker)

    def _restart(self, role: str, index: int) -> None:
        c = self.cluster
        pool = self._pool(role)
        old = pool[index]
        node = c.new_prefill(index) if role == "prefill" else c.new_decode(index)
        self.restarts[role] += 1
        node.agent = f"{old.agent}+{sum(self.restarts.values())}"  # a new process: a new agent
        c.retired.append(old)
        pool[index] = node
        c.nodes[node.url] = node
        if role == "prefill":
            self._tell_decodes("on_connect", index)
        self._health_checks(node.url, 1)

    def _tell_decodes(self, handler: str, index: int) -> None:
        endpoint = prefill_endpoint(index)
        for d in self.cluster.decodes:
            self.cluster.send(d.deliver, getattr(d, handler), endpoint)

    def _health_checks(self, url: str, rounds: int) -> None:
        """The router's next `rounds` health rounds (on its fixed period) check `url`."""
        c = self.cluster
        tick = math.floor(c.events.now / HEALTH_INTERVAL_S)
        for k in range(1, rounds + 1):
            c.events.at((tick + k) * HEALTH_INTERVAL_S, self._check, url)

    def _check(self, url: str) -> None:
        node = self.cluster.nodes[url]
        self.cluster.router.check_health(url, None if node.dead else node.agent)
