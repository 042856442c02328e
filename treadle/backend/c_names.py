"""C identifiers for names that come from models and programs.

Names reach generated C only through this module, so a tensor called ``a b;system("x")``
can never become code. A name keeps its ``[A-Za-z0-9_]`` characters (runs of ``_``
collapse), and gets a suffix where it would clash with the C language or the headers the
prelude includes: a local called ``int``, ``linux`` (a macro under gnu11) or ``NAN`` would
not compile or would silently change meaning. Exported kernels are ``kernel_<name>``, so a
kernel called ``exp`` or ``free`` cannot collide with libc; when sanitizing changed a
kernel's name, a hash of the original keeps distinct names distinct.
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterable

C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch
    typedef union unsigned void volatile while asm typeof _Alignas _Alignof _Atomic _Bool
    _Complex _Float16 _Generic _Imaginary _Noreturn _Static_assert _Thread_local
""".split())

# Lower-case macros and types of <stdint.h> <stdbool.h> <stddef.h> <math.h> <immintrin.h>
# under -std=gnu11 (from `gcc -E -dM`); upper-case macros are caught by _MACRO_LIKE.
HEADER_NAMES = frozenset("""
    alloca bool false true linux unix offsetof size_t ptrdiff_t wchar_t max_align_t
    fpclassify isfinite isgreater isgreaterequal isinf isless islessequal islessgreater
    isnan isnormal isunordered signbit math_errhandling float_t double_t
    be16toh be32toh be64toh htobe16 htobe32 htobe64 htole16 htole32 htole64
    le16toh le32toh le64toh
""".split())

_MACRO_LIKE = re.compile(r"[A-Z][A-Z0-9_]{2,}")  # NAN, INFINITY, INT32_MAX, M_PI, ...
_TYPE_LIKE = re.compile(r"(u?int|float|bfloat|bool)\d*(x\d+)?(_t|_u)?")  # typedefs we emit
INTERNAL_PREFIX = "treadle_"  # prelude helpers, the thread count, the status variable
KERNEL_PREFIX = "kernel_"


def identifier(name: str) -> str:
    """``name`` reduced to a C identifier: no leading digit, no ``__``, never empty."""
    text = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name)).strip("_")
    if not text:
        return "v"
    return f"v_{text}" if text[0].isdigit() else text


def kernel_symbol(name: str) -> str:
    """The exported C symbol of a kernel named ``name`` (it never contains ``__``, so
    ``<symbol>__messages`` cannot be another kernel's symbol)."""
    base = identifier(name)
    if base != name:
        base += "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return KERNEL_PREFIX + base


class Namer:
    """Gives each declared Var or Buffer a C name unique within one function.

    Declarations are scoped like C blocks (``push`` / ``pop``); a name is never reused in
    a function, so an inner declaration cannot shadow a variable an outer one still uses.
    """

    def __init__(self, reserved: Iterable[str]):
        self.reserved = frozenset(reserved) | C_KEYWORDS | HEADER_NAMES
        self.used: set[str] = set()
        self.frames: list[dict] = [{}]

    def _is_reserved(self, name: str) -> bool:
        return (name in self.reserved or name.startswith(INTERNAL_PREFIX)
                or _MACRO_LIKE.fullmatch(name) is not None
                or _TYPE_LIKE.fullmatch(name) is not None)

    def declare(self, key, name: str) -> str:
        base = identifier(name)
        if self._is_reserved(base):
            base += "_"
        text, k = base, 1
        while text in self.used:
            text, k = f"{base}_{k}", k + 1
        self.used.add(text)
        self.frames[-1][key] = text
        return text

    def lookup(self, key) -> str | None:
        for frame in reversed(self.frames):
            if key in frame:
                return frame[key]
        return None

    def push(self) -> None:
        self.frames.append({})

    def pop(self) -> None:
        self.frames.pop()
