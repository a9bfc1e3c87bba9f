"""What the API server does with an LLMDeployment before the operator sees it, offline:
apply the CRD's structural defaults, validate the OpenAPI schema (unknown fields rejected,
as `kubectl apply` does with strict field validation), and evaluate the CEL rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "llmdeployment.yaml"
EXAMPLES = ROOT / "crds" / "examples"


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def example(name: str, uid: str = "0b9ad5a6-1f3c-4b8e-9a52-6c1f0a0e7d11") -> dict[str, Any]:
    llmd = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    llmd["metadata"]["uid"] = uid
    return llmd


def with_defaults(obj: Any, node: dict[str, Any] | None = None) -> Any:
    """A copy of `obj` with every schema default filled in, the way the API server does."""
    node = schema() if node is None else node
    obj = copy.deepcopy(obj)
    if isinstance(obj, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = with_defaults(obj[key], sub)
    elif isinstance(obj, list) and "items" in node:
        obj = [with_defaults(item, node["items"]) for item in obj]
    return obj


def validate(llmd: dict[str, Any]) -> list[str]:
    """Every error the API server would answer for `llmd` (after defaulting)."""
    obj = with_defaults(llmd)
    validator = jsonschema.Draft4Validator(_strict(schema()))
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors or list(_cel_errors(obj, schema(), ""))


def _strict(node: dict[str, Any]) -> dict[str, Any]:
    """Objects without preserve-unknown-fields or additionalProperties take no other keys;
    Kubernetes-only keywords are dropped."""
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    node = {k: v for k, v in node.items() if not k.startswith("x-kubernetes")}
    closed = node.get("type") == "object" and "properties" in node and not preserve
    if closed and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if "properties" in node:
        node["properties"] = {k: _strict(v) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _strict(node["additionalProperties"])
    if "items" in node:
        node["items"] = _strict(node["items"])
    if node.get("properties", {}).get("metadata") is not None:
        node["properties"]["metadata"]["additionalProperties"] = True
    return node


def _cel_errors(obj: Any, node: dict[str, Any], path: str):
    env = celpy.Environment()
    for rule in node.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(obj)}):
            yield f"{path}{rule.get('fieldPath', '')}: {rule['message']}"
    if isinstance(obj, dict):
        for key, sub in node.get("properties", {}).items():
            if key in obj:
                yield from _cel_errors(obj[key], sub, f"{path}.{key}" if path else key)
