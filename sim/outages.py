"""Prefill workers dying and restarting in a simulated run, and what the rest of the
deployment sees of it: the decode nodes' connections drop one hop later (their fail-over
does the rest) and the router's health checks eject the worker (`WorkerPool`, after
`EJECT_AFTER` failed rounds) and take it back, with a new agent, once it restarted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tandem.router.workers import EJECT_AFTER
from tandem.sim.faults import PrefillOutage
from tandem.sim.router import prefill_endpoint

if TYPE_CHECKING:
    from tandem.sim.cluster import Cluster

# The router's health-check period (`WorkerMonitor`'s default interval).
HEALTH_INTERVAL_S = 1.0


class Outages:
    """Kills and restarts the cluster's prefill nodes; counts them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.num_deaths = 0
        self.num_restarts = 0

    def schedule(self, outages: Sequence[PrefillOutage]) -> None:
        for outage in outages:
            if outage.worker >= len(self.cluster.prefills):
                raise ValueError(
                    f"outage of prefill worker {outage.worker}: there are "
                    f"{len(self.cluster.prefills)}"
                )
            self.cluster.events.at(outage.at_s, self._kill, outage)

    def _kill(self, outage: PrefillOutage) -> None:
        c = self.cluster
        node = c.prefills[outage.worker]
        if node.dead:
            return
        node.dead = True
        self.num_deaths += 1
        c.cores.stop(node)
        self._tell_decodes("on_disconnect", outage.worker)
        self._health_checks(node.url, EJECT_AFTER)
        if outage.restart_after_s is not None:
            c.events.after(outage.restart_after_s, self._restart, outage.worker)

    def _restart(self, index: int) -> None:
        c = self.cluster
        old = c.prefills[index]
        node = c.new_prefill(index)
        self.num_restarts += 1
        node.agent = f"{old.agent}+{self.num_restarts}"  # a new process: a new NIXL agent
        c.retired.append(old)
        c.prefills[index] = node
        c.nodes[node.url] = node
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
