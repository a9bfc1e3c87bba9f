"""Convert a GGUF checkpoint into a model folder Tandem loads (config.json, one
model.safetensors, the tokenizer and its chat template), dequantized to fp32 by
transformers. Run as a subprocess (`python -P tests/gguf_model.py DIR FILE OUT`), so the
conversion's memory is given back when it ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def convert(folder: Path, gguf_file: str, out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    tied = config.get("tie_word_embeddings", False)
    # transformers will not save a model it loaded from GGUF: the tensors are written as is
    weights = {
        name: tensor.contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    out.mkdir(parents=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    convert(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
