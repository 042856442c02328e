"""treadle: a deep-learning compiler.

    import treadle
    model = treadle.compile("model.onnx")
    outputs = model(x)                  # numpy arrays or torch tensors in, numpy arrays out
    model.save("model.treadle")
    model = treadle.load("model.treadle")
    print(treadle.check("model.onnx"))  # outputs against ONNX Runtime's, and where they part

    @treadle.lang.kernel                # a kernel written as a Python function (treadle.lang)
    def double(x: treadle.lang.f32["n"], y: treadle.lang.f32["n"]): ...
"""
from treadle import lang
from treadle.api import CompiledModel, compile, load
from treadle.checker import check
from treadle.version import __version__

__all__ = ["CompiledModel", "check", "compile", "lang", "load", "__version__"]
