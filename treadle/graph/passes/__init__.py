"""Graph passes, one per module; the pipeline that orders them is treadle.graph.optimize."""
