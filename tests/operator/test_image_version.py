"""One version names the image everywhere: the chart's appVersion is the tag of the chart's
operator image, of the image a resource gets by default (operator and CRD) and of the one
`make image` builds, and the project's own version."""

from __future__ import annotations

import subprocess
import tomllib

import yaml

from tandem.operator.spec import DEFAULT_IMAGE
from tests.bounds import PROCESS_S
from tests.operator.crd_schema import ROOT

CHART = ROOT / "charts" / "tandem"


def app_version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def test_the_default_images_carry_the_charts_app_version():
    version = app_version()
    repository = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    assert f"{repository}:{version}" == DEFAULT_IMAGE
    for crd in (ROOT / "crds" / "llmdeployment.yaml", CHART / "crds" / "llmdeployment.yaml"):
        assert f"default: {DEFAULT_IMAGE}\n" in crd.read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert project == version


def test_make_image_tags_the_charts_app_version():
    printed = subprocess.run(
        ["make", "-n", "image", "BUILDER=buildah"], cwd=ROOT, capture_output=True, text=True,
        timeout=PROCESS_S, check=True,
    ).stdout  # fmt: skip
    assert f"-t {DEFAULT_IMAGE} " in printed
