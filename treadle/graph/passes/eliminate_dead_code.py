"""Drop every operator no graph output depends on."""
from treadle.graph.graph import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    # Building from the outputs walks producers only, so unreachable operators vanish.
    return Graph.from_outputs(graph.inputs, graph.outputs, graph.name)
