"""The CPU's dtype and weights: bfloat16 chosen where the CPU computes in it, prepacked
linear weights, and the rotary table kept in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem.engine import LLM
from tandem.engine.core.config import ModelConfig, cpu_has_bf16, resolve_dtype
from tandem.engine.exec.loader import load_weights
from tandem.engine.models.llama import LlamaForCausalLM
from tandem.engine.models.prepacked import (
    can_prepack,
    linear,
    prepack,
    prepack_linears,
    weight_bytes,
)
from tests.engine.forward import prompt_logits

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)
FLAGS = "flags\t\t: fpu vme avx2 avx512f avx512bw {extra}\n"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [("avx512_bf16 avx512_vnni", True), ("amx_bf16 amx_tile", True), ("avx512_vnni", False)],
)
def test_bf16_is_found_from_the_cpu_flags(tmp_path, extra, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\n{FLAGS.format(extra=extra)}")
    assert cpu_has_bf16(cpuinfo) is expected
    assert cpu_has_bf16(tmp_path / "absent") is False  # no /proc: assume none


def test_auto_dtype_is_bf16_on_the_cpu_only_where_it_computes_in_it(llama_dir):
    model = ModelConfig.from_pretrained(llama_dir)
    cpu = torch.device("cpu")
    expected = torch.bfloat16 if cpu_has_bf16() else torch.float32
    assert resolve_dtype("auto", model, cpu) == expected
    assert resolve_dtype("float32", model, cpu) == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8", model, cpu)


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_a_prepacked_linear_is_the_plain_one(dtype, tokens):
    torch.manual_seed(0)
    weight = torch.randn(96, 48, dtype=dtype)  # [out, in]
    bias = torch.randn(96, dtype=dtype)
    x = torch.randn(tokens, 48, dtype=dtype)
    packed = prepack(weight)  # packed for one token: any count must work
    expected = F.linear(x, weight, bias)
    got = linear(x, torch.empty(0, dtype=dtype), bias, packed)
    # the same products summed in oneDNN's order either way; one rounding of the output apart
    # at most (48 terms, each within the dtype's eps of the sum's scale)
    atol = 48 * torch.finfo(dtype).eps * expected.abs().max().item()
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)


@needs_onednn
def test_prepacking_frees_the_projections_and_keeps_the_tied_embedding(model_dirs):
    model_dir = model_dirs["qwen2"]  # tied embeddings, q/k/v bias
    model = LlamaForCausalLM(ModelConfig.from_pretrained(model_dir)).to(torch.bfloat16)
    load_weights(model, model_dir)
    before = weight_bytes(model)
    embedding = model.model.embed_tokens.weight.clone()
    ids = torch.tensor([3, 9, 27])
    hidden = torch.randn(3, model.config.hidden_size, dtype=torch.bfloat16)
    logits = model.compute_logits(hidden)  # [3, V]
    qkv = model.model.layers[0].self_attn.qkv_proj
    projected = qkv(hidden)

    packed = prepack_linears(model)
    layers = model.config.num_layers
    assert packed == 4 * layers + 1  # qkv, o, gate_up, down per layer, and the LM head
    assert qkv.weight.numel() == 0 and qkv.prepacked is not None
    assert torch.equal(model.model.embed_tokens.weight, embedding)  # still embeds
    assert torch.equal(model.model.embed_tokens(ids), embedding[ids])
    torch.testing.assert_close(qkv(hidden), projected, rtol=0, atol=0.05)
    torch.testing.assert_close(model.compute_logits(hidden), logits, rtol=0, atol=0.05)
    # the LM head is a second copy of the embedding; the projections moved, not doubled
    embedding_bytes = embedding.numel() * embedding.element_size()
    assert weight_bytes(model) == before + embedding_bytes
    assert prepack_linears(model) == 0  # once only


def test_can_prepack_only_on_the_cpu_in_float32_or_bf16():
    cpu = torch.device("cpu")
    assert can_prepack(cpu, torch.float16) is False
    assert can_prepack(torch.device("cuda"), torch.bfloat16) is False
    assert can_prepack(cpu, torch.bfloat16) is torch.backends.mkldnn.is_available()


def test_the_rotary_table_stays_float32_and_is_shared(llama_dir):
    model = LlamaForCausalLM(ModelConfig.from_pretrained(llama_dir)).to(torch.bfloat16)
    tables = {id(layer.self_attn.rotary_emb) for layer in model.model.layers}
    assert len(tables) == 1
    rotary = model.model.layers[0].self_attn.rotary_emb
    assert rotary.cos_sin_cache.dtype == torch.float32
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_logits_are_float32_logits_within_bf16_rounding(model_dirs, arch):
    """One forward pass of a 180-token prompt in bfloat16 (prepacked where oneDNN is)
    against float32. Every op's output is rounded to 8 bits of mantissa (relative error
    eps / 2 each, some 30 such roundings in a row): the logits' error is a few eps of
    their spread (5 eps for llama, 2.3 for qwen3, measured on an AVX512-BF16 EPYC). A wrong
    weight, table or kernel is an error of the order of the spread itself (above 0.5)."""
    logits = {}
    for dtype in ("float32", "bfloat16"):
        engine = LLM(str(model_dirs[arch]), dtype=dtype, num_kv_blocks=32, kernels="torch").engine
        prompt = [(7 * i) % (engine.config.model.vocab_size - 5) + 5 for i in range(180)]
        logits[dtype] = prompt_logits(engine, prompt)
    ref = logits["float32"] - logits["float32"].mean(-1, keepdim=True)
    got = logits["bfloat16"] - logits["bfloat16"].mean(-1, keepdim=True)
    relative = ((got - ref).norm() / ref.norm()).item()
    assert relative < 16 * torch.finfo(torch.bfloat16).eps, relative
