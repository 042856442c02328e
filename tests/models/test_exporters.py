"""Architectures beyond the zoo, as users export them today: ``transformers`` models with
their default attention (scaled dot-product, which exports a NaN guard), through both of
torch's ONNX exporters, compared with ONNX Runtime.

The TorchScript exporter writes opset 17 with symbolic batch and sequence axes; the dynamo
exporter (torch's default) writes opset 20 with fixed shapes and its own op patterns
(GatherND for position ids, Expand/Where masks), and at opset 23 each scaled dot-product
attention as one Attention node. Each model is tiny (two layers, width 32) so that a test
costs seconds.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import treadle
from tests.harness import run_onnxruntime

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = ["input_ids", "attention_mask"]


def _bert():
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64)), TOKENS


def _gpt2():
    return transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False)), TOKENS


# A LLaMA-style decoder's sizes, for LLaMA and Mistral alike.
DECODER = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               use_cache=False)


def _llama():
    # Rotary embeddings, RMSNorm, grouped-query attention, SiLU-gated MLP.
    return transformers.LlamaModel(transformers.LlamaConfig(**DECODER)), TOKENS


def _t5():
    # Relative position buckets computed from the sequence length.
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)), TOKENS


def _vit():
    return transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8)), ["pixel_values"]


def _swin():
    # Shifted-window attention: window partitions as reshapes, rolls, masks.
    return transformers.SwinModel(transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 4],
        window_size=4)), ["pixel_values"]


def _deberta_v2():
    # Disentangled attention: log-bucketed relative positions, gathers by position.
    return transformers.DebertaV2Model(transformers.DebertaV2Config(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, relative_attention=True,
        position_buckets=16, pos_att_type=["p2c", "c2p"])), TOKENS


def _dinov2():
    # Position embeddings resized (bicubic) to the patch grid, whose side is computed in
    # float from the number of positions.
    return transformers.Dinov2Model(transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8)), ["pixel_values"]


def _mistral():
    # At opset 23 the exporter writes its rotary embeddings as RotaryEmbedding nodes, with
    # caches of batch 1 for every batch (which ONNX Runtime 1.32 refuses).
    return transformers.MistralModel(transformers.MistralConfig(**DECODER)), TOKENS


ARCHITECTURES = {"bert": _bert, "gpt2": _gpt2, "llama": _llama, "t5": _t5, "vit": _vit,
                 "swin": _swin, "deberta_v2": _deberta_v2, "dinov2": _dinov2}


class _Positional(torch.nn.Module):
    """The model called with positional inputs, returning its first output."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)), return_dict=False)[0]


def _inputs(names, batch: int, seq: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if names == ["pixel_values"]:
        return (torch.rand(batch, 3, 32, 32, generator=gen),)
    ids = torch.randint(0, 100, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq // 2:] = 0  # a padded sequence: the mask matters
    return ids, mask


def _export(name: str, opset: int | None, path):
    """Exports with TorchScript at opset 17 (``opset`` None) or with dynamo at ``opset``."""
    torch.manual_seed(0)
    model, names = ARCHITECTURES[name]()
    module = _Positional(model.eval(), names)
    example = _inputs(names, 2, 9, seed=0)
    axes = None if names == ["pixel_values"] else {n: {0: "batch", 1: "seq"} for n in names}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecation chatter
        if opset is not None:
            pytest.importorskip("onnxscript")
            torch.onnx.export(module, example, str(path), dynamo=True, input_names=names,
                              output_names=["out"], opset_version=opset)
        else:
            torch.onnx.export(module, example, str(path), dynamo=False, opset_version=17,
                              input_names=names, output_names=["out"], dynamic_axes=axes)
    return names


# Opset 23 writes every attention as one Attention node: the default run takes the three
# attention shapes (BERT's padding mask, GPT-2's causal one, LLaMA's grouped heads); -m slow
# the rest, and the exports that take 10-25 s (DeBERTa-v2's, Dinov2's through dynamo).
OPSET_23_DEFAULT = {"bert", "gpt2", "llama"}
SLOW = {("deberta_v2", None), ("deberta_v2", 20), ("dinov2", 20)}


def _is_slow(opset: int | None, name: str) -> bool:
    return (opset == 23 and name not in OPSET_23_DEFAULT) or (name, opset) in SLOW


@pytest.mark.parametrize("opset,name", [
    pytest.param(opset, name, marks=pytest.mark.slow) if _is_slow(opset, name)
    else (opset, name)
    for opset in (None, 20, 23) for name in sorted(ARCHITECTURES)],
    ids=[f"{name}-{label}" for label in ("torchscript", "dynamo", "dynamo23")
         for name in sorted(ARCHITECTURES)])
def test_exported_architecture_matches_onnxruntime(tmp_path, name, opset):
    path = tmp_path / f"{name}.onnx"
    names = _export(name, opset, path)
    compiled = treadle.compile(path)
    fixed = opset is not None or names == ["pixel_values"]
    sizes = [(2, 9)] if fixed else [(2, 9), (1, 5), (3, 16)]
    for batch, seq in sizes:
        feeds = {n: t.numpy() for n, t in zip(names, _inputs(names, batch, seq, batch * seq))}
        actual = compiled(**feeds)[0]
        expected = run_onnxruntime(onnx.load(path), feeds)[0]
        if not np.allclose(actual, expected, rtol=1e-4, atol=1e-4):
            pytest.fail(f"{name}, batch {batch}, seq {seq}:\n{treadle.check(path, feeds)}")


@pytest.mark.slow  # 15-25 s of export; tests/graph/ops/test_rotary.py checks the operator
def test_rotary_embeddings_at_opset_23_match_eager(tmp_path):
    """With dynamic axes, the exporter writes RotaryEmbedding nodes at opset 23."""
    pytest.importorskip("onnxscript")
    path = tmp_path / "mistral.onnx"
    torch.manual_seed(0)
    model, names = _mistral()
    module = _Positional(model.eval(), names)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, _inputs(names, 2, 9, seed=0), str(path), dynamo=True,
                          input_names=names, output_names=["out"], opset_version=23,
                          dynamic_shapes=(({0: "batch", 1: "seq"},) * len(names),))
    assert "RotaryEmbedding" in {n.op_type for n in onnx.load(path).graph.node}
    compiled = treadle.compile(path)
    for batch, seq in [(2, 9), (3, 13)]:
        feeds = _inputs(names, batch, seq, seed=batch)
        with torch.no_grad():
            expected = module(*feeds).numpy()
        np.testing.assert_allclose(compiled(*(t.numpy() for t in feeds))[0], expected,
                                   rtol=1e-4, atol=1e-4)
