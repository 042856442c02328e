"""Building a zoo model with fixed random weights and exporting it to ONNX.

Weights come from the architectures' own initializers under a fixed seed, with two changes
that make numerical checks meaningful: biases and normalization scales get random values
(initializers leave them at 0 and 1, where a kernel that ignores them still looks right),
and the image models' batch-norm statistics are measured on a batch of random inputs, so
that activations keep unit scale through fifty layers instead of growing or vanishing.
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np

SEED = 0
OPSET = 17
SDPA_OPSET = 23  # the first opset with an Attention operator
CALIBRATION_BATCH = 4


@dataclass(frozen=True)
class InputSpec:
    """One graph input. A ``str`` dimension is symbolic (an ONNX ``dim_param``). Float
    inputs are drawn from a standard normal, integer inputs uniformly from [low, high]."""
    name: str
    shape: tuple[Union[int, str], ...]
    dtype: str
    low: int = 0
    high: int = 0

    def concrete_shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        missing = [d for d in self.shape if isinstance(d, str) and d not in dims]
        if missing:
            raise ValueError(f"input {self.name!r} has symbolic dimensions {missing}: "
                             f"give their sizes")
        return tuple(dims[d] if isinstance(d, str) else d for d in self.shape)

    def random(self, gen: np.random.Generator, dims: Mapping[str, int]) -> np.ndarray:
        shape = self.concrete_shape(dims)
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            return gen.integers(self.low, self.high + 1, size=shape).astype(self.dtype)
        return gen.standard_normal(shape).astype(self.dtype)


@dataclass(frozen=True)
class ModelSpec:
    """What ``export_onnx`` wrote: the file, its inputs and outputs, and the size each
    symbolic dimension had at export (the default for ``random_inputs``)."""
    name: str
    path: Path
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    dims: Mapping[str, int] = field(default_factory=dict)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    def random_inputs(self, seed: int = SEED, **dims: int) -> dict[str, np.ndarray]:
        """Random inputs keyed by name; ``dims`` sizes the symbolic dimensions."""
        gen = np.random.default_rng(seed)
        sizes = {**self.dims, **dims}
        return {i.name: i.random(gen, sizes) for i in self.inputs}


@dataclass(frozen=True)
class Recipe:
    """A zoo entry: the builder ``family.builder`` (a module of treadle.models), its knobs
    for the standard and the reduced model, and the image side or sequence length each
    is exported at."""
    family: str
    builder: str
    full: Mapping[str, object]
    reduced: Mapping[str, object]
    size: int
    reduced_size: int


MODELS: dict[str, Recipe] = {
    "resnet50": Recipe("cnn", "resnet50", {}, dict(blocks=(2, 1, 1, 1), width=8,
                                                    num_classes=10), 224, 64),
    "inception_v3": Recipe("cnn", "inception_v3", {}, dict(blocks=(1, 1, 1), width=0.125,
                                                            num_classes=10), 299, 75),
    "mobilenet_v2": Recipe("cnn", "mobilenet_v2", {},
                           dict(repeats=(1, 2, 1, 1, 1, 1, 1), width=0.5, last_channel=128,
                                num_classes=10), 224, 64),
    "bert": Recipe("transformer", "bert", {}, dict(layers=2, hidden=64, heads=4, vocab=1000,
                                                   max_positions=64), 128, 16),
    "gpt2": Recipe("transformer", "gpt2", {}, dict(layers=2, hidden=64, heads=4, vocab=1000,
                                                   max_positions=64), 128, 16),
    "candy": Recipe("dense", "candy", {}, dict(width=8, blocks=2), 224, 32),
    "segformer_b0": Recipe("dense", "segformer_b0", {},
                           dict(depths=(1, 1, 1, 1), hidden_sizes=(16, 32, 40, 64),
                                decoder_hidden=32, num_labels=10), 512, 64),
    "efficientvit_block": Recipe("dense", "efficientvit_block", {}, dict(channels=32), 32, 16),
    "unet": Recipe("dense", "unet", {}, dict(width=4, depth=2), 256, 36),
    "resnext50": Recipe("vision", "resnext50_32x4d", {},
                        dict(blocks=(2, 1, 1, 1), width=8, groups=4, group_width=4,
                             num_classes=10), 224, 64),
    "regnet_y_800mf": Recipe("vision", "regnet_y_800mf", {},
                             dict(depths=(1, 2, 1), widths=(16, 32, 64), group_width=8,
                                  stem=16, num_classes=10), 224, 64),
    "res2net50": Recipe("vision", "res2net50_26w_4s", {},
                        dict(blocks=(2, 1), width=8, split_width=4, num_classes=10), 224, 64),
    "cspdarknet53": Recipe("vision", "cspdarknet53", {},
                           dict(depths=(1, 1, 1), width=8, num_classes=10), 256, 64),
    # A row of zero repeats is left out: the reduced tables keep each kind of block once.
    "efficientnet_b0": Recipe("vision", "efficientnet_b0", {},
                              dict(repeats=(1, 1, 2, 0, 0, 0, 0), width=0.25, head=128,
                                   num_classes=10), 224, 64),
    "mixnet_s": Recipe("vision", "mixnet_s", {},
                       dict(repeats=(1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0), width=0.5, head=128,
                            num_classes=10), 224, 64),
    "regnetx_200mf": Recipe("vision", "regnetx_200mf", {},
                            dict(depths=(1, 2, 1), widths=(16, 24, 48), group_width=8,
                                 stem=16, num_classes=10), 224, 64),
    "eca_resnet50": Recipe("resnet_variants", "eca_resnet50", {},
                           dict(blocks=(2, 1, 1, 1), width=8, num_classes=10), 224, 64),
    "dpn68": Recipe("resnet_variants", "dpn68", {},
                    dict(blocks=(2, 1, 1, 1), width=8, increments=(4, 8, 8, 16), groups=4,
                         stem=8, num_classes=10), 224, 64),
    # The reduced backbone keeps a row of each kind (with and without expansion,
    # squeeze-and-excitation and hard swish; strided, dilated, residual), and its 8x8
    # map is reached by the ASPP's smallest rate and not by the others, as the full
    # model's 14x14 map is.
    "deeplabv3_mobilenet_v3": Recipe("deeplab", "deeplabv3_mobilenet_v3", {},
                                     dict(rows=(0, 3, 4, 6, 7, 12, 13), width=0.25,
                                          output_stride=8, head=16, rates=(4, 8, 12),
                                          num_classes=5), 224, 64),
    "r3d_18": Recipe("video", "r3d_18", {},
                     dict(blocks=(1, 1, 1, 1), width=8, num_classes=10, frames=5), 112, 32),
    "mamba_small": Recipe("ssm", "mamba_small", {},
                          dict(vocab=100, layers=2, d_model=24, d_state=4), 64, 13),
}
# The families of ImageNet classifiers: an RGB image in, logits out.
CLASSIFIERS = ("cnn", "vision", "resnet_variants")
# The families whose inputs are token ids: their modules declare each input's range of
# values and the outputs' names (``input_ranges``, ``output_names``). The others take an
# image (or a video clip): a classifier an RGB one, any other module declares its own
# (``declare_io``).
TOKEN_FAMILIES = ("transformer", "ssm")


def export_onnx(name: str, path, *, reduced: bool = False, batch: int = 1,
                dynamic_seq: bool = False, dynamic_batch: bool = False,
                attention: Optional[str] = None) -> ModelSpec:
    """Builds zoo model ``name`` (the full-size one, or the CI-sized one when ``reduced``)
    and writes it to ``path`` as ONNX (opset 17). With ``dynamic_seq`` a transformer's
    sequence axis is the symbolic dimension ``seq``; with ``dynamic_batch`` a CNN's batch
    axis is ``batch`` (``batch`` is then the size of the example inputs). With
    ``attention="sdpa"`` a transformer calls ``scaled_dot_product_attention`` and is
    written by torch's dynamo exporter at opset SDPA_OPSET, one Attention node per layer,
    with fixed shapes."""
    recipe = _recipe(name)
    if dynamic_seq and recipe.family != "transformer":
        raise ValueError(f"dynamic_seq applies to the transformer models, not {name!r}")
    if dynamic_seq and attention == "sdpa":
        raise ValueError("the sdpa export has fixed shapes: no dynamic_seq")
    if dynamic_batch and recipe.family not in CLASSIFIERS:
        raise ValueError(f"dynamic_batch applies to the CNN models, not {name!r}")
    from treadle.models import require
    torch = require("torch")
    size = recipe.reduced_size if reduced else recipe.size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation chatter from the exporter
        model = build(name, reduced=reduced, attention=attention)
        if recipe.family in TOKEN_FAMILIES:
            spec = _token_spec(name, path, model, batch, size, dynamic_seq)
        else:
            input_name, sample, output = _image_io(recipe, model, size)
            image = InputSpec(input_name, ("batch" if dynamic_batch else batch, *sample),
                              "float32")
            spec = ModelSpec(name, path, (image,), (output,),
                             {"batch": batch} if dynamic_batch else {})
        _write(model, spec, dynamo=attention == "sdpa")
    return spec


def build(name: str, *, reduced: bool = False, attention: str | None = None):
    """Zoo model ``name`` as the torch module that ``export_onnx`` writes: the same random
    parameters (those the module note describes), in eval mode, for any batch size.
    ``attention`` picks a transformer's attention implementation ("eager", "sdpa")."""
    recipe = _recipe(name)
    options = dict(recipe.reduced if reduced else recipe.full)
    if attention is not None:
        if recipe.family != "transformer":
            raise ValueError(f"attention applies to the transformer models, not {name!r}")
        options["attention"] = attention
    from treadle.models import require
    torch = require("torch")
    family = importlib.import_module(f"treadle.models.{recipe.family}")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(SEED)
        model = getattr(family, recipe.builder)(**options)
        _randomize_affine(model)
        if recipe.family not in TOKEN_FAMILIES:
            size = recipe.reduced_size if reduced else recipe.size
            _calibrate_batch_norm(model, _image_io(recipe, model, size)[1])
    return model.eval()


def _recipe(name: str) -> Recipe:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the zoo has {sorted(MODELS)}")
    return MODELS[name]


def declare_io(module, input_name: str, in_channels: int, output_name: str,
               frames: int = 0) -> None:
    """Records on an image model that is not a classifier what export needs: its input's
    name and channels (and, for a video model, the clip's ``frames``: its input is then
    N x C x frames x H x W), and its output's name."""
    module.input_name = input_name
    module.in_channels = in_channels
    module.frames = frames
    module.output_name = output_name


def _image_io(recipe: Recipe, model, size: int) -> tuple[str, tuple[int, ...], str]:
    """An image model's input name, its input's shape without the batch axis at image side
    ``size``, and its output name: a classifier takes an RGB image, the other models
    declare theirs (``declare_io``)."""
    if recipe.family in CLASSIFIERS:
        return "image", (3, size, size), "logits"
    frames = (model.frames,) if model.frames else ()
    return model.input_name, (model.in_channels, *frames, size, size), model.output_name


def _write(model, spec: ModelSpec, dynamo: bool = False) -> None:
    import torch
    example = tuple(torch.from_numpy(a) for a in spec.random_inputs().values())
    if dynamo:
        torch.onnx.export(model, example, str(spec.path), dynamo=True,
                          opset_version=SDPA_OPSET, input_names=spec.input_names,
                          output_names=list(spec.outputs))
        return
    axes = _dynamic_axes(spec)
    torch.onnx.export(
        model, example, str(spec.path), dynamo=False, opset_version=OPSET,
        input_names=spec.input_names, output_names=list(spec.outputs),
        dynamic_axes=axes, export_params=True, do_constant_folding=True)
    if axes:
        outputs = model(*example)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        shapes = {n: tuple(o.shape) for n, o in zip(spec.outputs, outputs, strict=True)}
        _declare_output_shapes(spec.path, shapes, axes)


def _token_spec(name: str, path: Path, model, batch: int, seq: int,
                dynamic_seq: bool) -> ModelSpec:
    length = "seq" if dynamic_seq else seq
    inputs = tuple(InputSpec(n, (batch, length), "int64", low, high)
                   for n, (low, high) in model.input_ranges.items())
    return ModelSpec(name, path, inputs, model.output_names,
                     {"seq": seq} if dynamic_seq else {})


def _dynamic_axes(spec: ModelSpec) -> Optional[dict[str, dict[int, str]]]:
    """Symbolic input axes; a transformer's per-token output (last_hidden_state) shares
    the input's symbolic sequence axis, a CNN's logits its symbolic batch."""
    axes = {i.name: {k: d for k, d in enumerate(i.shape) if isinstance(d, str)}
            for i in spec.inputs}
    axes = {n: a for n, a in axes.items() if a}
    if not axes:
        return None
    if "last_hidden_state" in spec.outputs:
        axes["last_hidden_state"] = {1: "seq"}
    if "logits" in spec.outputs and "image" in axes:
        axes["logits"] = {0: "batch"}
    return axes


def _declare_output_shapes(path: Path, shapes: Mapping[str, tuple[int, ...]],
                           axes: Mapping[str, Mapping[int, str]]) -> None:
    """With dynamic axes the exporter names every output dimension it cannot infer (even
    the static batch); declares the static ones' sizes and the symbolic ones' names."""
    import onnx
    model = onnx.load(str(path))
    for value in model.graph.output:
        dims = value.type.tensor_type.shape.dim
        for k, (dim, size) in enumerate(zip(dims, shapes[value.name], strict=True)):
            symbol = axes.get(value.name, {}).get(k)
            if symbol is None:
                dim.dim_value = size
            else:
                dim.dim_param = symbol
    onnx.save(model, str(path))


def _randomize_affine(model) -> None:
    import torch
    norms = (torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.InstanceNorm2d,
             torch.nn.LayerNorm, torch.nn.RMSNorm)
    for module in model.modules():
        if isinstance(module, norms) and module.weight is not None:
            module.weight.uniform_(0.5, 1.5)
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            parameter.uniform_(-0.2, 0.2)


def _calibrate_batch_norm(model, shape: tuple[int, ...]) -> None:
    """Sets every (2-D or 3-D) batch norm's statistics to its input's over a batch of random
    inputs of ``shape`` (without the batch axis). Only the batch norms are in training mode,
    so that dropout and stochastic depth do not skew what they measure."""
    import torch
    norms = [m for m in model.modules()
             if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.BatchNorm3d))]
    if not norms:
        return
    model.eval()
    for module in norms:
        module.reset_running_stats()
        module.momentum = None  # a cumulative average: after one batch, its statistics
        module.train()
    model(torch.randn(CALIBRATION_BATCH, *shape))
    model.eval()
