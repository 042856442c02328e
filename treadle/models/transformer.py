"""BERT-base and GPT-2 small, built from ``transformers`` configs with random weights.

Both use the "eager" attention implementation by default, which exports as the classic
explicit pattern (MatMul, scale, mask Add, Softmax, MatMul); ``attention="sdpa"`` (what
``transformers`` picks when not told) calls ``scaled_dot_product_attention`` instead,
which torch's dynamo exporter writes as one Attention node from opset 23 on.
The builders return a wrapper that takes the model's inputs positionally and returns a
tuple, which is what ONNX export needs; it also records each input's range of values, so
that random inputs are valid token ids, masks and segment ids.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from treadle.models import require

torch = require("torch")
transformers = require("transformers")
nn = torch.nn


class TupleModel(nn.Module):
    """Calls a ``transformers`` model with named inputs and returns its outputs as a tuple.

    ``input_ranges`` maps each input name, in positional order, to the inclusive range of
    integer values it takes."""

    def __init__(self, model: nn.Module, input_ranges: Mapping[str, tuple[int, int]],
                 output_names: Sequence[str]):
        super().__init__()
        self.model = model
        self.input_ranges = dict(input_ranges)
        self.output_names = tuple(output_names)

    def forward(self, *inputs):
        named = dict(zip(self.input_ranges, inputs, strict=True))
        return tuple(self.model(**named, return_dict=False))


def bert(*, layers: int = 12, hidden: int = 768, heads: int = 12,
         intermediate: Optional[int] = None, vocab: int = 30522,
         max_positions: int = 512, attention: str = "eager") -> TupleModel:
    """BERT-base by default (with its pooler); ``intermediate`` defaults to 4 * hidden."""
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=max_positions, attn_implementation=attention)
    ranges = {"input_ids": (0, vocab - 1), "attention_mask": (1, 1),
              "token_type_ids": (0, config.type_vocab_size - 1)}
    return TupleModel(transformers.BertModel(config), ranges,
                      ("last_hidden_state", "pooler_output"))


def gpt2(*, layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 50257,
         max_positions: int = 1024, attention: str = "eager") -> TupleModel:
    """GPT-2 small by default: the transformer without the LM head and without a KV
    cache. The all-ones attention mask is an explicit input, which export needs."""
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
        n_positions=max_positions, bos_token_id=vocab - 1, eos_token_id=vocab - 1,
        use_cache=False, attn_implementation=attention)
    ranges = {"input_ids": (0, vocab - 1), "attention_mask": (1, 1)}
    return TupleModel(transformers.GPT2Model(config), ranges, ("last_hidden_state",))
