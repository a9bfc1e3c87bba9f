"""The shared model cache: a claim that one Job fills with the Hugging Face model, mounted
read-only by every pod, so that a pod the HPA adds starts without downloading the weights.

The reconcile holds the serving Deployments back until the Job of the current spec has
completed; `CacheProgress` reads that Job (and, once an attempt failed, its pods'
termination messages) for the status. The Job's name is a hash of its spec, so a new model
revision or image is a new Job (a Job's template cannot change), and the claim's name a
hash of what a claim cannot change (storage class, access modes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.operator.download import download_container
from tandem.operator.engine_config import model_dir
from tandem.operator.hardening import pod_security_context
from tandem.operator.names import child_name, child_object, labels, short_hash
from tandem.operator.spec import LLMDeploymentSpec

COMPONENT = "model-cache"
BACKOFF_LIMIT = 4  # failed download pods before the Job gives up
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods
_MESSAGE_LIMIT = 300


def claim_name(spec: LLMDeploymentSpec) -> str:
    cache = spec.model.cache
    assert cache is not None
    if cache.existing_claim:
        return cache.existing_claim
    fixed = {"storageClassName": cache.storage_class_name, "accessModes": cache.access_modes}
    return child_name(spec.name, f"cache-{short_hash(fixed)}")


def job_name(spec: LLMDeploymentSpec) -> str:
    return child_name(spec.name, f"download-{short_hash(_job_spec(spec))}")


def cache_objects(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The claim (unless an existing one is named) and the download Job; none without a
    cache."""
    cache = spec.model.cache
    if cache is None:
        return []
    job = _object("batch/v1", "Job", job_name(spec), spec, _job_spec(spec))
    if cache.existing_claim:
        return [job]
    body: dict[str, Any] = {
        "accessModes": list(cache.access_modes),
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name is not None:
        body["storageClassName"] = cache.storage_class_name
    return [_object("v1", "PersistentVolumeClaim", claim_name(spec), spec, body), job]


def _job_spec(spec: LLMDeploymentSpec) -> dict[str, Any]:
    download = download_container(spec.model.source, spec.image, model_dir(spec))
    # The log's tail becomes the termination message that the status reports on failure.
    download["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return {
        "backoffLimit": BACKOFF_LIMIT,
        "template": {
            "metadata": {"labels": labels(spec.name, COMPONENT)},
            "spec": {
                "securityContext": pod_security_context(),
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "containers": [download],
                "volumes": [
                    {"name": "model", "persistentVolumeClaim": {"claimName": claim_name(spec)}},
                    {"name": "tmp", "emptyDir": {}},
                ],
            },
        },
    }


def _object(
    api_version: str, kind: str, name: str, spec: LLMDeploymentSpec, body: dict[str, Any]
) -> dict[str, Any]:
    return child_object(api_version, kind, name, spec.name, COMPONENT, body)


@dataclass(frozen=True)
class CacheProgress:
    """The download as observed: `job` as read (None: not created yet) and, once an attempt
    failed, the Job's `pods` as read."""

    claim_name: str
    job_name: str
    job: dict[str, Any] | None
    pods: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self._condition("Complete") is not None

    @property
    def failure(self) -> str | None:
        """Why the Job gave up, with the last failed attempt's error; None unless it did."""
        failed = self._condition("Failed")
        if failed is None:
            return None
        why = failed.get("message") or failed.get("reason") or "failed"
        error = last_error(self.pods)
        return f"Job {self.job_name} failed ({why})" + (f": {error}" if error else "")

    def describe(self) -> str:
        """One line for the ModelCached condition."""
        if self.complete:
            return f"downloaded into claim {self.claim_name} by Job {self.job_name}"
        if (failure := self.failure) is not None:
            return f"{failure}; delete the Job to retry"
        if self.job is None:
            return f"Job {self.job_name} is not created yet"
        status = self.job.get("status") or {}
        line = f"Job {self.job_name} is downloading into claim {self.claim_name}"
        if failed := status.get("failed"):
            line += f" (attempt {failed} of {BACKOFF_LIMIT + 1} failed"
            line += f": {error})" if (error := last_error(self.pods)) else ")"
        return line

    def _condition(self, kind: str) -> dict[str, Any] | None:
        for condition in ((self.job or {}).get("status") or {}).get("conditions") or []:
            if condition.get("type") == kind and condition.get("status") == "True":
                return condition
        return None


def last_error(pods: list[dict[str, Any]]) -> str:
    """The last line of the newest failed download's termination message."""
    messages = []
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode") and terminated.get("message"):
                messages.append((terminated.get("finishedAt", ""), terminated["message"]))
    if not messages:
        return ""
    lines = [line for line in max(messages)[1].splitlines() if line.strip()]
    return lines[-1].strip()[:_MESSAGE_LIMIT] if lines else ""
