"""Architectures outside the model zoo, from current `transformers` configs with random
weights: treadle (tune 0) against ONNX Runtime on the same ONNX export.

    python bench/transformers_models.py                    # every model, 30 timed calls
    python bench/transformers_models.py --models vit swin --repeat 50

(from the repository root with PYTHONPATH=., or with treadle installed)

Each model is exported once by the TorchScript exporter at opset 17 into bench/out/ and
compiled into the user's kernel cache. Both systems run on ``--threads`` threads at batch
1; latencies are interleaved medians (``treadle.timing``), the ratio is ONNX Runtime's
time over treadle's, the error treadle's largest difference from ONNX Runtime over the
output's largest value.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

import treadle
from treadle.config import override
from treadle.models import require
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

OUT = Path(__file__).resolve().parent / "out"


def _llama(tf, torch):
    """LLaMA-style decoder: rotary embeddings, RMSNorm, grouped-query attention."""
    inner = tf.LlamaModel(tf.LlamaConfig(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=4000, max_position_embeddings=256, use_cache=False))
    ids = torch.randint(0, 4000, (1, 128))
    return _positional(inner, ("input_ids", "attention_mask")), (ids, torch.ones_like(ids))


def _vit(tf, torch):
    config = tf.ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                          intermediate_size=1536, image_size=224, patch_size=16)
    return _positional(tf.ViTModel(config), ("pixel_values",)), _image(torch)


def _convnext(tf, torch):
    config = tf.ConvNextConfig(depths=[2, 2, 6, 2], hidden_sizes=[64, 128, 256, 512])
    return _positional(tf.ConvNextModel(config), ("pixel_values",)), _image(torch)


def _swin(tf, torch):
    config = tf.SwinConfig(embed_dim=64, depths=[2, 2, 4, 2], num_heads=[2, 4, 8, 16])
    return _positional(tf.SwinModel(config), ("pixel_values",)), _image(torch)


def _image(torch) -> tuple:
    return (torch.randn(1, 3, 224, 224),)


def _whisper(tf, torch):
    """Whisper's encoder: a convolutional front end over 30 s of mel frames."""
    config = tf.WhisperConfig(d_model=256, encoder_layers=4, encoder_attention_heads=4,
                              decoder_attention_heads=4, encoder_ffn_dim=1024,
                              num_mel_bins=80)
    encoder = tf.WhisperModel(config).get_encoder()
    return _positional(encoder, ("input_features",)), (torch.randn(1, 80, 3000),)


MODELS: dict[str, Callable] = {"llama": _llama, "vit": _vit, "convnext": _convnext,
                               "swin": _swin, "whisper": _whisper}


def _positional(model, names):
    """``model`` called with positional inputs, giving its last hidden state."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(**dict(zip(names, inputs)), return_dict=False)[0]
    module = Hidden().eval()
    module.input_names = list(names)
    return module


def exported(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    torch, tf = require("torch"), require("transformers")
    torch.manual_seed(0)
    module, inputs = MODELS[name](tf, torch)
    path = OUT / f"transformers-{name}.onnx"
    if not path.exists():
        OUT.mkdir(exist_ok=True)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation chatter
            torch.onnx.export(module, inputs, str(path), input_names=module.input_names,
                              dynamo=False, opset_version=17)
    return path, {n: t.numpy() for n, t in zip(module.input_names, inputs)}


def bench(name: str, repeat: int, threads: int) -> str:
    path, feeds = exported(name)
    with override(num_threads=threads):
        compiled = treadle.compile(path)
        session = onnxruntime_session(path, threads)
        want = session.run(None, feeds)[0]
        error = float(np.abs(compiled(**feeds)[0] - want).max() / (np.abs(want).max() or 1))
        ms = interleaved_medians({"treadle": lambda: compiled(**feeds),
                                  "onnxruntime": lambda: session.run(None, feeds)}, repeat)
    return (f"{name:10s} {ms['treadle'] * 1e3:9.2f} {ms['onnxruntime'] * 1e3:9.2f} "
            f"{ms['onnxruntime'] / ms['treadle']:8.2f}x {error:9.1e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"{'model':10s} {'treadle':>9s} {'ORT ms':>9s} {'vs ORT':>9s} {'error':>9s}")
    for name in args.models:
        print(bench(name, args.repeat, args.threads), flush=True)
    print(load_note(args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
