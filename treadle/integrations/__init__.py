"""treadle behind other tools' interfaces: the ``torch.compile`` backend (``dynamo``) and
ONNX's backend API (``onnx_backend``). They sit above ``treadle.api``, which they call."""
