"""treadle: a deep-learning compiler.

    import treadle
    model = treadle.compile("model.onnx")
    outputs = model(x)                  # numpy arrays or torch tensors in, numpy arrays out
    model.save("model.treadle")
    model = treadle.load("model.treadle")
"""
from treadle.api import CompiledModel, compile, load

__version__ = "0.1.0"

__all__ = ["CompiledModel", "compile", "load", "__version__"]
