"""A model zoo for tests, benchmarks and the demo: twenty-one standard networks with random
weights.

``export_onnx(name, path)`` writes one as an ONNX file and returns a ``ModelSpec`` (input
names, shapes and dtypes, and a maker of random inputs); ``build(name)`` returns the same
model, with the same weights, as a torch module. Each model has size knobs and a
``reduced`` variant small enough for CI. Nothing is downloaded: the CNNs are plain
``torch.nn`` (``cnn.py``; ``vision.py`` for the grouped, multi-scale, Mish,
squeeze-and-excitation and mixed-kernel ones; ``resnet_variants.py`` for channel attention
and dual paths; ``video.py`` for 3-D convolutions), the transformers are built from
``transformers`` configs (``transformer.py``), the Mamba language model is plain
``torch.nn`` (``ssm.py``), and of the models whose output is a feature map, Candy, U-Net,
the EfficientViT block (``dense.py``) and DeepLabV3 (``deeplab.py``) are plain
``torch.nn`` and Segformer-B0 a ``transformers`` config. torch is an optional dependency of
treadle, so it is imported only when a model is built.
"""
from __future__ import annotations

import importlib

from treadle.models.export import MODELS, InputSpec, ModelSpec, build, export_onnx

_INSTALL = {
    "torch": "pip install 'treadle[torch]'",
    "transformers": "pip install 'treadle[torch]' transformers",
}


def require(module: str):
    """Imports an optional dependency, or says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"treadle.models needs the optional package {module!r}: "
                          f"{_INSTALL.get(module, f'pip install {module}')}") from error


__all__ = ["MODELS", "InputSpec", "ModelSpec", "build", "export_onnx", "require"]
