"""The routers' metrics, scraped by the planner (`RouterScraper`): the deployment's ready
router pods, found by their labels, and each one's `/metrics` on its HTTP port."""

from __future__ import annotations

import logging

import httpx

from tandem.operator.kinds import POD
from tandem.operator.kube import KubeApi
from tandem.operator.names import DEPLOYMENT_LABEL, HTTP_PORT, ROLE_LABEL
from tandem.planner.traffic import RouterScrape

logger = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 5.0


class RouterScraper:
    def __init__(self, api: KubeApi, namespace: str, deployment: str, port: int = HTTP_PORT):
        self.api, self.namespace, self.port = api, namespace, port
        self.selector = f"{DEPLOYMENT_LABEL}={deployment},{ROLE_LABEL}=router"

    def scrape(self) -> dict[str, RouterScrape]:
        """Pod name -> its scrape, for every ready router that answered."""
        out = {}
        with httpx.Client(timeout=SCRAPE_TIMEOUT_S) as client:
            for name, ip in self.ready_routers():
                try:
                    response = client.get(f"http://{ip}:{self.port}/metrics")
                    response.raise_for_status()
                    out[name] = RouterScrape.parse(response.text)
                except (httpx.HTTPError, ValueError) as exc:
                    logger.warning("router %s: metrics not read: %s", name, exc)
        return out

    def ready_routers(self) -> list[tuple[str, str]]:
        pods = self.api.list(POD, self.namespace, self.selector)
        return [
            (pod["metadata"]["name"], pod["status"]["podIP"])
            for pod in pods
            if _ready(pod) and pod.get("status", {}).get("podIP")
        ]


def _ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
