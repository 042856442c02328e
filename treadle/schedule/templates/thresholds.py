"""Sizes that decide which template takes an operator, which graph passes also read to lay
tensors out for that template (``graph.passes.channels_last``)."""

# Below this many output columns a GEMM tile is mostly padding (depthwise convolution,
# matrix-vector products, a convolution to a few channels); the dot template (constant
# columns, rows along K in whole vectors), the window template, the swapped product or
# the rule-based loops serve those better.
MIN_GEMM_COLUMNS = 8

# The gemv template (constant weights) takes products of at most this many rows, whose
# weights it streams once across the threads, and products whose K is at most
# MAX_OUTER_K (a sum of that many outer products, weights in L1), of any rows.
MAX_GEMV_ROWS = 4
MAX_OUTER_K = 8

# The dot template's K must fill whole vectors of the narrowest kind (AVX2's 8 floats).
VECTOR_ELEMENTS = 8

# K positions per 32-bit word of an integer product: VNNI's four bytes (gemm/words.py).
# Integer convolutions get their input channels padded to a multiple of it
# (graph.passes.integer_products), so that packing reads whole words.
WORD_BYTES = 4
