"""Operator families; importing this package registers every operator."""
from treadle.graph.ops import elementwise  # noqa: F401
