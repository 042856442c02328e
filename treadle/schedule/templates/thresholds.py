"""Sizes that decide which template takes an operator, which graph passes also read to lay
tensors out for that template (``graph.passes.channels_last``)."""

# Below this many output columns a GEMM tile is mostly padding (depthwise convolution,
# matrix-vector products, a convolution to a few channels); the dot template (constant
# columns, rows along K in whole vectors), the window template, the swapped product or
# the rule-based loops serve those better.
MIN_GEMM_COLUMNS = 8

# The dot template's K must fill whole vectors of the narrowest kind (AVX2's 8 floats).
VECTOR_ELEMENTS = 8

# K positions per 32-bit word of an integer product: VNNI's four bytes (gemm/words.py).
# Integer convolutions get their input channels padded to a multiple of it
# (graph.passes.integer_products), so that packing reads whole words.
WORD_BYTES = 4
