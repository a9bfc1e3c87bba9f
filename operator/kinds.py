"""The kinds the operator reads and writes, with their REST paths. The chart's RBAC is
derived from the same table (`permissions()`), and a test holds the two equal."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.operator.names import API_VERSION, PLURAL


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str, name: str | None = None, subresource: str = "") -> str:
        root = "/api/v1" if self.group == "" else f"/apis/{self.api_version}"
        path = f"{root}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        return path + (f"/{subresource}" if subresource else "")

    def cluster_path(self) -> str:
        """The collection across every namespace (list and watch only)."""
        root = "/api/v1" if self.group == "" else f"/apis/{self.api_version}"
        return f"{root}/{self.plural}"


LLM_DEPLOYMENT = Kind(API_VERSION, "LLMDeployment", PLURAL)
EVENT = Kind("v1", "Event", "events")
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
HPA = Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
JOB = Kind("batch/v1", "Job", "jobs")
POD = Kind("v1", "Pod", "pods")  # only listed: a failed model download's messages
SECRET = Kind("v1", "Secret", "secrets")  # only created: the deployment's token

# Every kind render() may produce, in apply order (the ConfigMap and the router's identity
# before the pods that mount or use them).
CHILD_KINDS = (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    JOB,
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    DEPLOYMENT,
    Kind("v1", "Service", "services"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    HPA,
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
)
_BY_KIND = {(k.api_version, k.kind): k for k in CHILD_KINDS}

# The router's Role grants these; Kubernetes lets the operator create that Role only when
# it holds the same permissions itself (RBAC escalation prevention).
ROUTER_PERMISSIONS = {("discovery.k8s.io", "endpointslices", "list")}
# The same for the SLO planner's Role (access.planner_rules; a test holds the two equal).
PLANNER_PERMISSIONS = {
    *((LLM_DEPLOYMENT.group, PLURAL, verb) for verb in ("get", "list", "watch")),
    *((LLM_DEPLOYMENT.group, f"{PLURAL}/status", verb) for verb in ("get", "patch", "update")),
    (DEPLOYMENT.group, DEPLOYMENT.plural, "get"),
    *((DEPLOYMENT.group, "deployments/scale", verb) for verb in ("get", "patch", "update")),
    *((POD.group, POD.plural, verb) for verb in ("get", "list")),
    *((group, "events", verb) for group in ("", "events.k8s.io") for verb in ("create", "patch")),
}


def child_kind(obj: dict) -> Kind:
    return _BY_KIND[(obj["apiVersion"], obj["kind"])]


def permissions() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the operator uses, and nothing more."""
    needed = {
        # kopf lists and watches them and keeps its progress in their annotations
        (LLM_DEPLOYMENT.group, PLURAL, verb)
        for verb in ("list", "watch", "patch")
    } | {
        (LLM_DEPLOYMENT.group, f"{PLURAL}/status", "patch"),
        ("", "events", "create"),
        (LEASE.group, "leases", "get"),
        (LEASE.group, "leases", "create"),
        (LEASE.group, "leases", "update"),
    }
    for kind in CHILD_KINDS:
        # apply = PATCH (and create on first apply); prune = list + delete
        needed |= {(kind.group, kind.plural, v) for v in ("create", "patch", "list", "delete")}
    # read back: Deployments for status, the model cache's Job before the Deployments
    needed |= {(kind.group, kind.plural, "get") for kind in (DEPLOYMENT, JOB)}
    needed.add((POD.group, POD.plural, "list"))
    needed.add((SECRET.group, SECRET.plural, "create"))
    return needed | ROUTER_PERMISSIONS | PLANNER_PERMISSIONS
