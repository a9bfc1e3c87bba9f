"""Config parsing for the four architectures, the safetensors loader and its errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine.core.config import CacheConfig, ModelConfig, SchedulerConfig
from tandem.engine.exec.loader import checkpoint_files, load_weights
from tandem.engine.models.llama import LlamaForCausalLM
from tandem.engine.tiny_model import make_model


def test_each_architecture_parses(model_dirs):
    configs = {a: ModelConfig.from_pretrained(d) for a, d in model_dirs.items()}
    assert configs["llama"].rope_scaling is not None
    assert configs["llama"].rope_scaling.factor == 8.0
    assert configs["llama"].rope_theta == 50000.0
    assert configs["qwen2"].qkv_bias and not configs["qwen2"].o_bias
    assert configs["qwen3"].qk_norm and configs["qwen3"].head_dim == 32
    assert configs["qwen3"].head_dim != configs["qwen3"].hidden_size // configs["qwen3"].num_heads
    assert configs["qwen2"].tie_word_embeddings and not configs["llama"].tie_word_embeddings
    assert all(c.num_kv_heads < c.num_heads for c in configs.values())  # GQA
    assert configs["mistral"].eos_token_ids == (2, 4)  # generation_config.json first


@pytest.mark.parametrize(
    ("fields", "window"),
    [
        ({"sliding_window": 4096}, 4096),
        ({"sliding_window": None}, 0),
        ({"sliding_window": 4096, "use_sliding_window": False}, 0),  # Qwen2's switch
        ({"sliding_window": 1 << 20}, 0),  # no shorter than the model: no window
    ],
)
def test_sliding_window_parses(model_dirs, fields, window):
    raw = json.loads((model_dirs["mistral"] / "config.json").read_text())
    raw["max_position_embeddings"] = 32768
    assert ModelConfig.from_dict({**raw, **fields}).sliding_window == window


def test_unsupported_architecture_is_named(llama_dir, tmp_path):
    raw = json.loads((llama_dir / "config.json").read_text())
    raw["architectures"] = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelConfig.from_dict(raw)
    raw = {
        **json.loads((llama_dir / "config.json").read_text()),
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    raw.pop("rope_parameters")
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'yarn'"):
        ModelConfig.from_dict(raw)


def test_missing_model_folder_is_an_os_error(tmp_path):
    with pytest.raises(OSError, match=r"no config\.json"):
        ModelConfig.from_pretrained(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: CacheConfig(block_size=12, num_blocks=4), "power of two"),
        (lambda: CacheConfig(block_size=16, num_blocks=0), "num_kv_blocks"),
        (lambda: SchedulerConfig(max_num_batched_tokens=0), "max_num_batched_tokens"),
        (lambda: SchedulerConfig(max_num_seqs=-1), "max_num_seqs"),
    ],
)
def test_engine_configs_validate_once(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def _model(model_dir):
    return LlamaForCausalLM(ModelConfig.from_pretrained(model_dir))


def test_sharded_checkpoint_loads_the_same_weights(tmp_path):
    single = make_model(tmp_path / "single", "qwen2", seed=3)
    sharded = make_model(tmp_path / "sharded", "qwen2", seed=3, max_shard_size="50KB")
    assert len(checkpoint_files(sharded)) > 1
    a, b = _model(single), _model(sharded)
    load_weights(a, single)
    load_weights(b, sharded)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_fused_qkv_holds_the_checkpoint_matrices(llama_dir):
    model = _model(llama_dir)
    load_weights(model, llama_dir)
    tensors = load_file(str(llama_dir / "model.safetensors"))
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    q, k, v = (tensors[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(qkv, torch.cat([q, k, v]))
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(
        gate_up[: gate_up.shape[0] // 2], tensors["model.layers.0.mlp.gate_proj.weight"]
    )


def _edit_checkpoint(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_tensor_is_named(llama_dir, tmp_path):
    bad = _edit_checkpoint(
        llama_dir, tmp_path / "m", lambda t: t.pop("model.layers.1.self_attn.k_proj.weight")
    )
    with pytest.raises(ValueError, match=r"model.layers.1.self_attn.qkv_proj.weight\[k\]"):
        load_weights(_model(bad), bad)


def test_unexpected_tensor_is_named(llama_dir, tmp_path):
    bad = _edit_checkpoint(
        llama_dir, tmp_path / "m", lambda t: t.__setitem__("model.extra.weight", torch.zeros(2))
    )
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.extra\.weight'"):
        load_weights(_model(bad), bad)


def test_wrong_shape_is_named(llama_dir, tmp_path):
    bad = _edit_checkpoint(
        llama_dir, tmp_path / "m", lambda t: t.__setitem__("model.norm.weight", torch.zeros(3))
    )
    with pytest.raises(ValueError, match=r"'model\.norm\.weight': shape"):
        load_weights(_model(bad), bad)


def test_missing_weight_files_are_os_errors(model_dirs, llama_dir, tmp_path):
    empty = tmp_path / "empty"
    shutil.copytree(llama_dir, empty)
    (empty / "model.safetensors").unlink()
    with pytest.raises(OSError, match=r"no \*.safetensors weight files"):
        checkpoint_files(empty)
    sharded = make_model(tmp_path / "sharded", "llama", max_shard_size="50KB")
    next(sharded.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(
        OSError, match=r"model-00002-of-.* named by model\.safetensors\.index\.json"
    ):
        checkpoint_files(sharded)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_parameter_count_matches_the_model(model_dirs, arch):
    config = ModelConfig.from_pretrained(model_dirs[arch])
    model = LlamaForCausalLM(config)
    # biases and q/k norms are small extras the planning count leaves out
    extras = sum(p.numel() for n, p in model.named_parameters() if "bias" in n or "_norm." in n)
    assert config.num_parameters() == sum(p.numel() for p in model.parameters()) - extras
