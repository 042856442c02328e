"""The step runner: one C call runs every kernel of a model in order.

Calling each kernel through ctypes costs microseconds of Python per step, and more once
the kernels have pushed the interpreter out of the caches: a MobileNetV2 call spent
0.3-0.4 ms of its 6 between its 55 kernels. The runner is one generic C function, built
once for every model: the steps are a table of entry points, arities and the position of
each step's first argument in one array of arguments. Every kernel argument is a 64-bit
integer word, an address or an int64 symbol, which the x86-64 and AArch64 calling
conventions pass alike, so a cast to the step's arity calls any kernel. A step with no
entry copies a view into a graph output, ``bytes[step]`` bytes from its first argument
to its second.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from treadle.backend.cpu import build
from treadle.backend.elf import open_library

MAX_ARITY = 128  # kernels with more parameters are called from Python
ENTRY = "treadle_run_steps"


def source() -> str:
    cases = []
    for arity in range(MAX_ARITY + 1):
        params = ", ".join(["word"] * arity) or "void"
        args = ", ".join(f"a[{k}]" for k in range(arity))
        cases.append(f"        case {arity}: status = ((int32_t (*)({params}))entry[k])({args}); "
                     "break;")
    body = "\n".join(cases)
    return f"""#include <stdint.h>
#include <string.h>

typedef int64_t word;

int32_t {ENTRY}(int64_t count, void *const *entry, const int32_t *arity,
                const int64_t *first, const word *args, const int64_t *bytes,
                int64_t *failed) {{
    for (int64_t k = 0; k < count; ++k) {{
        const word *a = args + first[k];
        int32_t status = 0;
        switch (arity[k]) {{
        case -1: memcpy((void *)a[1], (const void *)a[0], (size_t)bytes[k]); break;
{body}
        default: status = -1;
        }}
        if (status != 0) {{
            *failed = k;
            return status;
        }}
    }}
    return 0;
}}
"""


def library_path() -> Path:
    """The runner's shared object, built (or found in the cache) on first use."""
    return build(source(), "step_runner", [ENTRY])


def load_runner(path: Path) -> ctypes._CFuncPtr:
    """The runner's entry point in the shared object at ``path``."""
    run = open_library(path, [ENTRY])[ENTRY]
    run.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    run.restype = ctypes.c_int32
    return run
