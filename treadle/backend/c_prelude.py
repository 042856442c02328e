"""C types of IR dtypes, and the helper definitions generated code may need.

A ``Prelude`` collects what one source file uses: vector typedefs and small ``static
inline`` helpers (min/max, safe integer division, reductions, broadcasts, bfloat16
conversions), each emitted once, in first-use order, so typedefs precede their users.
Helpers are functions rather than macros so that each operand is evaluated once.
"""
from __future__ import annotations

from typing import Callable

from treadle.errors import IRError
from treadle.ir.dtypes import DataType

INCLUDES = ("stdbool.h", "stddef.h", "stdint.h", "math.h", "immintrin.h")

SCALAR_TYPES = {
    "float32": "float", "float64": "double", "float16": "_Float16",
    "bfloat16": "uint16_t",  # raw bits; only converted to and from float32
    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "bool": "bool",
}

BF16_TO_F32 = """\
static inline float treadle_bf16_to_f32(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    __builtin_memcpy(&value, &wide, sizeof value);
    return value;
}"""

# Round to nearest even; a NaN stays a (quiet) NaN instead of rounding into infinity.
F32_TO_BF16 = """\
static inline uint16_t treadle_f32_to_bf16(float value) {
    uint32_t bits;
    __builtin_memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}"""


def c_scalar_type(dtype: DataType) -> str:
    try:
        return SCALAR_TYPES[dtype.scalar.name]
    except KeyError:
        raise IRError(f"dtype {dtype.scalar} has no entry in the C backend's SCALAR_TYPES "
                      "table") from None


def _vector_typedefs(dtype: DataType) -> str:
    """The aligned register type and an ``_u`` variant for unaligned loads and stores at
    an element's address inside a scalar buffer."""
    if dtype.scalar.is_bool:
        raise IRError(f"vector dtype {dtype} has no C type: bool vectors (masks) are not "
                      "supported by the C backend")
    size = dtype.nbytes
    if size & (size - 1):
        raise IRError(f"vector dtype {dtype} is {size} bytes; C vectors need a power of two")
    element = c_scalar_type(dtype)
    return (f"typedef {element} {dtype.name} __attribute__((vector_size({size})));\n"
            f"typedef {element} {dtype.name}_u __attribute__((vector_size({size}), "
            f"aligned({dtype.scalar.bits // 8})));")


def _minmax(op: str, dtype: DataType, t: str) -> str:
    # Python's min(a, b) / max(a, b), as functor.evaluate: `a` unless `b` is strictly
    # smaller / larger. Vectors select lanes with the mask a comparison yields.
    cmp = "<" if op == "min" else ">"
    head = f"static inline {t} treadle_{op}_{dtype.name}({t} a, {t} b) {{\n"
    if not dtype.is_vector:
        return head + f"    return b {cmp} a ? b : a;\n}}"
    return head + (f"    __typeof__(b {cmp} a) m = b {cmp} a;\n"
                   f"    return ({t})((m & (__typeof__(m))b) | (~m & (__typeof__(m))a));\n}}")


def _unsigned(dtype: DataType) -> str:
    """The unsigned C type of the same width, where negation cannot overflow."""
    return SCALAR_TYPES[f"uint{dtype.bits}" if dtype.kind == "int" else dtype.name]


def _div(op: str, dtype: DataType, t: str) -> str:
    # Integer division by zero gives 0, as in numpy, and x / -1 negates with wrap-around:
    # the hardware would trap on both and take the Python process down.
    head = f"static inline {t} treadle_{op}_{dtype.name}({t} a, {t} b) {{\n"
    if dtype.kind == "uint":
        return head + f"    return b == 0 ? 0 : a {'/' if op == 'div' else '%'} b;\n}}"
    if op == "div":
        body = f"b == 0 ? 0 : b == -1 ? ({t})(0 - ({_unsigned(dtype)})a) : a / b"
    else:
        body = "b == 0 || b == -1 ? 0 : a % b"
    return head + f"    return {body};\n}}"


def _abs(dtype: DataType, t: str) -> str:
    return (f"static inline {t} treadle_abs_{dtype.name}({t} x) {{\n"
            f"    return x < 0 ? ({t})(0 - ({_unsigned(dtype)})x) : x;\n}}")


def _reduce(op: str, dtype: DataType, t: str) -> str:
    element = c_scalar_type(dtype)
    step = {"add": "r + v[k]", "max": "v[k] > r ? v[k] : r", "min": "v[k] < r ? v[k] : r"}[op]
    return (f"static inline {element} treadle_reduce_{op}_{dtype.name}({t} v) {{\n"
            f"    {element} r = v[0];\n"
            f"    for (int k = 1; k < {dtype.lanes}; ++k)\n"
            f"        r = {step};\n"
            f"    return r;\n}}")


def _broadcast(dtype: DataType, t: str) -> str:
    lanes = ", ".join(["x"] * dtype.lanes)
    return (f"static inline {t} treadle_broadcast_{dtype.name}({c_scalar_type(dtype)} x) {{\n"
            f"    return ({t}){{{lanes}}};\n}}")


# Helper kind -> definition for a dtype (given with its C type); the helper is named
# treadle_<kind>_<dtype>.
HELPERS: dict[str, Callable[[DataType, str], str]] = {
    "min": lambda d, t: _minmax("min", d, t),
    "max": lambda d, t: _minmax("max", d, t),
    "div": lambda d, t: _div("div", d, t),
    "mod": lambda d, t: _div("mod", d, t),
    "abs": _abs,
    "reduce_add": lambda d, t: _reduce("add", d, t),
    "reduce_max": lambda d, t: _reduce("max", d, t),
    "reduce_min": lambda d, t: _reduce("min", d, t),
    "broadcast": _broadcast,
}


class Prelude:
    def __init__(self):
        self.parts: dict[str, str] = {}

    def type(self, dtype: DataType) -> str:
        """The C type of ``dtype``, declaring the typedefs of a vector type on first use."""
        if not dtype.is_vector:
            return c_scalar_type(dtype)
        if dtype.name not in self.parts:
            self.parts[dtype.name] = _vector_typedefs(dtype)
        return dtype.name

    def helper(self, kind: str, dtype: DataType) -> str:
        name = f"treadle_{kind}_{dtype.name}"
        if name not in self.parts:
            self.parts[name] = HELPERS[kind](dtype, self.type(dtype))
        return name

    def bfloat16_conversion(self, to_bfloat16: bool) -> str:
        name, text = (("treadle_f32_to_bf16", F32_TO_BF16) if to_bfloat16
                      else ("treadle_bf16_to_f32", BF16_TO_F32))
        self.parts.setdefault(name, text)
        return name

    def text(self) -> str:
        includes = "\n".join(f"#include <{h}>" for h in INCLUDES)
        return "\n\n".join([includes, *self.parts.values()])

