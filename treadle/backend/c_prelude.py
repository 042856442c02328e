"""C types of IR dtypes, and the helper definitions generated code may need.

A ``Prelude`` collects what one source file uses: vector typedefs and small ``static
inline`` helpers (min/max, safe integer division, reductions, broadcasts, bfloat16
conversions, float32 math), each emitted once, in first-use order, so typedefs and
helpers precede their users. Helpers are functions rather than macros so that each
operand is evaluated once.

Float32 exp, log, erf and tanh are our own (``F32_MATH``): glibc's vector variants exist only
under -ffast-math, and a loop calling the scalar libm functions does not vectorise.
These use only arithmetic, fma and bit operations, and clamp with integer min and max:
a float select choosing a constant lets gcc specialise that path (the result folds to a
constant there), and with -ftrapping-math it will not if-convert a division in the
caller (softmax's exp(x - m) / s) that has become conditional by it.
"""
from __future__ import annotations

from typing import Callable

from treadle.errors import IRError
from treadle.ir.dtypes import DataType

INCLUDES = ("stdbool.h", "stddef.h", "stdint.h", "math.h")
# Included only where a kernel calls an intrinsic: parsing it takes gcc about 0.2 s, most
# of what a small kernel costs to compile.
INTRINSICS = "immintrin.h"

SCALAR_TYPES = {
    "float32": "float", "float64": "double", "float16": "_Float16",
    "bfloat16": "uint16_t",  # raw bits; only converted to and from float32
    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "bool": "bool",
}

F32_BITS = """\
static inline uint32_t treadle_f32_bits(float value) {
    uint32_t bits;
    __builtin_memcpy(&bits, &value, sizeof bits);
    return bits;
}

static inline float treadle_f32_from_bits(uint32_t bits) {
    float value;
    __builtin_memcpy(&value, &bits, sizeof value);
    return value;
}"""


BF16_TO_F32 = """\
static inline float treadle_bf16_to_f32(uint16_t bits) {
    return treadle_f32_from_bits((uint32_t)bits << 16);
}"""

# Round to nearest even; a NaN stays a (quiet) NaN instead of rounding into infinity.
F32_TO_BF16 = """\
static inline uint16_t treadle_f32_to_bf16(float value) {
    uint32_t bits = treadle_f32_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}"""


# exp(x) = 2^n exp(r), x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts, Cody-Waite), exp(r)
# by Cephes' degree-6 polynomial; max relative error 8.5e-8 (< 1 ulp) for normal results.
# Adding 1.5 * 2^23 rounds x / ln2 to the integer n, which the low bits then hold. 2^n is
# two factors so that results near overflow and subnormal ones round once (n <= 150, so
# each factor stays a normal float). x is clamped to [-104, 104] (where exp is 0 and inf)
# as an integer min of its magnitude's bits, the sign put back: three vector operations,
# where clamping both ends through an order-preserving key took eight and cost softmax
# 7%; a NaN x is passed through at the end with a bit mask.
EXPF = """\
static inline float treadle_expf(float x) {
    uint32_t bits = treadle_f32_bits(x);
    uint32_t magnitude = bits & 0x7fffffffu;
    uint32_t clamped = magnitude < 0x42d00000u ? magnitude : 0x42d00000u;  /* 104.0f */
    float c = treadle_f32_from_bits(clamped | (bits & 0x80000000u));
    float shifted = fmaf(c, 1.44269504f, 12582912.0f);
    float k = shifted - 12582912.0f;
    int32_t n = (int32_t)(treadle_f32_bits(shifted) - treadle_f32_bits(12582912.0f));
    float r = fmaf(k, -0.693145752f, c);
    r = fmaf(k, -1.42860677e-6f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
    int32_t half = n >> 1;
    float y = p * treadle_f32_from_bits((uint32_t)(half + 127) << 23)
                * treadle_f32_from_bits((uint32_t)(n - half + 127) << 23);
    uint32_t nan = magnitude > 0x7f800000u ? 0xffffffffu : 0u;
    return treadle_f32_from_bits((treadle_f32_bits(y) & ~nan) | (bits & nan));
}"""


# log(x) = e ln2 + log(m), x = m 2^e with m in [sqrt(1/2), sqrt(2)): subtracting the bits
# of sqrt(1/2) makes the exponent field e and the mantissa field m's offset, with no
# branch. log(1 + f), f = m - 1, is f - f^2/2 + f^3 P(f) (Cephes' degree-8 P), ln2 in two
# parts; max relative error 1.2e-7 (< 2 ulp) for every positive float. Subnormal inputs
# are scaled by 2^23 first (an exponent chosen by integer arithmetic, not a float
# select). Zero gives -inf, a negative number NaN, inf and NaN themselves, through bit
# masks at the end.
LOGF = """\
static inline float treadle_logf(float x) {
    uint32_t bits = treadle_f32_bits(x);
    uint32_t subnormal = bits < 0x00800000u;
    float scaled = x * treadle_f32_from_bits(0x3f800000u + subnormal * (23u << 23));
    uint32_t shifted = treadle_f32_bits(scaled) - 0x3f3504f3u;
    int32_t e = ((int32_t)shifted >> 23) - (int32_t)(23u * subnormal);
    float f = treadle_f32_from_bits((shifted & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
    float z = f * f;
    float p = 7.0376836292e-2f;
    p = fmaf(p, f, -1.1514610310e-1f);
    p = fmaf(p, f, 1.1676998740e-1f);
    p = fmaf(p, f, -1.2420140846e-1f);
    p = fmaf(p, f, 1.4249322787e-1f);
    p = fmaf(p, f, -1.6668057665e-1f);
    p = fmaf(p, f, 2.0000714765e-1f);
    p = fmaf(p, f, -2.4999993993e-1f);
    p = fmaf(p, f, 3.3333331174e-1f);
    float k = (float)e;
    float y = fmaf(f * z, p, fmaf(k, -2.12194440e-4f, -0.5f * z));
    y = fmaf(k, 0.693359375f, f + y);
    uint32_t zero = (bits & 0x7fffffffu) == 0u ? 0xffffffffu : 0u;
    uint32_t negative = ((int32_t)bits < 0 ? 0xffffffffu : 0u) & ~zero;
    uint32_t itself = bits - 0x7f800000u < 0x00800000u ? 0xffffffffu : 0u;  /* inf, NaN */
    uint32_t out = treadle_f32_bits(y);
    out = (out & ~zero) | (0xff800000u & zero);
    out = (out & ~negative) | (0x7fc00000u & negative);
    return treadle_f32_from_bits((out & ~itself) | (bits & itself));
}"""


def _odd_rational(name: str, limit: str, numerator: list[str], denominator: list[str]) -> str:
    """f(x) = sign(x) * c * P(c^2) / Q(c^2) with c = min(|x|, limit), and +-1 from the
    limit on. The clamp is an integer min on the magnitude's bits (NaN bits stay,
    being larger than any finite value's), so no path skips the division."""
    def horner(var: str, coefficients: list[str]) -> list[str]:
        return ([f"    float {var} = {coefficients[0]}f;"]
                + [f"    {var} = fmaf({var}, s, {c}f);" for c in coefficients[1:]])
    return "\n".join([
        f"static inline float {name}(float x) {{",
        "    uint32_t bits = treadle_f32_bits(x);",
        "    uint32_t magnitude = bits & 0x7fffffffu;",
        f"    uint32_t clamped = magnitude < {limit} ? magnitude : {limit};",
        "    clamped = magnitude > 0x7f800000u ? magnitude : clamped;",
        "    float c = treadle_f32_from_bits(clamped);",
        "    float s = c * c;",
        *horner("p", numerator),
        *horner("q", denominator),
        "    uint32_t r = treadle_f32_bits(c * (p / q));",
        # At the clamp the function is 1 (tanh's rational stops 5 ulp short of it); the
        # bit mask blend keeps the division on every path.
        f"    uint32_t saturated = clamped == {limit} ? 0xffffffffu : 0u;",
        "    r = (r & ~saturated) | (0x3f800000u & saturated);",
        "    return treadle_f32_from_bits(r | (bits & 0x80000000u));",
        "}"])


# erf: XLA's rational approximation on [-4, 4]; max error 6.5 ulp (relative 4e-7).
ERFF = _odd_rational(
    "treadle_erff", "0x40800000u",  # 4.0f
    ["-2.72614225801306e-10", "2.77068142495902e-08", "-2.10102402082508e-06",
     "-5.69250639462346e-05", "-7.34990630326855e-04", "-2.95459980854025e-03",
     "-1.60960333262415e-02"],
    ["-1.45660718464996e-05", "-2.13374055278905e-04", "-1.68282697438203e-03",
     "-7.37332916720468e-03", "-1.42647390514189e-02"])

# tanh: XLA's rational approximation on [-7.9053, 7.9053]; max error 5 ulp.
TANHF = _odd_rational(
    "treadle_tanhf", "0x40fcf84fu",  # 7.90531110763549805f
    ["-2.76076847742355e-16", "2.00018790482477e-13", "-8.60467152213735e-11",
     "5.12229709037114e-08", "1.48572235717979e-05", "6.37261928875436e-04",
     "4.89352455891786e-03"],
    ["1.19825839466702e-06", "1.18534705686654e-04", "2.26843463243900e-03",
     "4.89352518554385e-03"])

# Four bytes at any address as one little-endian uint32 (x86's byte order): a memcpy,
# which the compiler turns into one unaligned load, and vectorises along a row.
WORD_LOAD = """\
static inline uint32_t treadle_word_load(const void *bytes) {
    uint32_t word;
    __builtin_memcpy(&word, bytes, sizeof word);
    return word;
}"""

# AMX's tiles for this thread (tile_begin): Linux's permission for the process's tile data,
# asked once (a process may run kernels without having probed the host), then palette 1
# with every tile `rows` rows of 64 bytes. 0 where the tiles are ready, -1 where refused.
TILE_BEGIN = """\
static int32_t treadle_tile_begin(int32_t rows) {
    static int32_t permitted = 0;  /* 1 granted, -1 refused, 0 not asked yet */
    int32_t state = __atomic_load_n(&permitted, __ATOMIC_RELAXED);
    if (state == 0) {
        state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                        18 /* XFEATURE_XTILEDATA */) == 0 ? 1 : -1;
        __atomic_store_n(&permitted, state, __ATOMIC_RELAXED);
    }
    if (state < 0)
        return -1;
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; }
        config = {.palette = 1};
    for (int tile = 0; tile < 8; ++tile) {
        config.colsb[tile] = 64;
        config.rows[tile] = (uint8_t)rows;
    }
    _tile_loadconfig(&config);
    return 0;
}"""

# Primitive -> (C function, definition); each calls the F32_BITS helpers.
F32_MATH: dict[str, tuple[str, str]] = {
    "exp": ("treadle_expf", EXPF),
    "log": ("treadle_logf", LOGF),
    "erf": ("treadle_erff", ERFF),
    "tanh": ("treadle_tanhf", TANHF),
}


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


def _scalar_minmax(op: str, dtype: DataType, a: str, b: str) -> str:
    """min(a, b) / max(a, b) as functor.evaluate: ``b`` where it is strictly smaller /
    larger or, for floats, NaN; a NaN ``a`` fails both tests, so a NaN on either side
    wins, as in numpy. ``b`` is tested for NaN first, a branch the CPU predicts, so the
    common path is one max instruction. (Vectorised reductions do not come here: see
    c._nan_flags.)"""
    nan_test = f"__builtin_isnan({b}) ? {b} : " if dtype.is_float else ""
    return f"{nan_test}{b} {'<' if op == 'min' else '>'} {a} ? {b} : {a}"


def _minmax(op: str, dtype: DataType, t: str) -> str:
    head = f"static inline {t} treadle_{op}_{dtype.name}({t} a, {t} b) {{\n"
    if not dtype.is_vector:
        return head + f"    return {_scalar_minmax(op, dtype, 'a', 'b')};\n}}"
    # Vectors select lanes with the mask the comparisons yield.
    cmp = "<" if op == "min" else ">"
    mask = f"(b {cmp} a) | (b != b)" if dtype.is_float else f"b {cmp} a"
    return head + (f"    __typeof__(b < a) m = {mask};\n"
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
    step = "r + v[k]" if op == "add" else _scalar_minmax(op, dtype, "r", "v[k]")
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
        self.includes = list(INCLUDES)

    def include(self, header: str) -> None:
        """``header`` among the includes (once), for what a printer emits."""
        if header not in self.includes:
            self.includes.append(header)

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
        self.parts.setdefault("treadle_f32_bits", F32_BITS)
        self.parts.setdefault(name, text)
        return name

    def f32_math(self, primitive: str) -> str | None:
        """Our float32 function for ``primitive`` (see F32_MATH), or None to call libm."""
        if primitive not in F32_MATH:
            return None
        name, text = F32_MATH[primitive]
        self.parts.setdefault("treadle_f32_bits", F32_BITS)
        self.parts.setdefault(name, text)
        return name

    def tile_begin(self) -> str:
        """The helper that readies a thread's AMX tiles (TILE_BEGIN), with its headers."""
        for header in (INTRINSICS, "unistd.h", "sys/syscall.h"):
            self.include(header)
        self.parts.setdefault("treadle_tile_begin", TILE_BEGIN)
        return "treadle_tile_begin"

    def word_load(self) -> str:
        """The helper reading four bytes at any address as a uint32 (WORD_LOAD)."""
        self.parts.setdefault("treadle_word_load", WORD_LOAD)
        return "treadle_word_load"

    def text(self) -> str:
        includes = "\n".join(f"#include <{h}>" for h in self.includes)
        return "\n\n".join([includes, *self.parts.values()])

