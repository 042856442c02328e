"""treadle.lang: tensor programs written as plain Python functions (Hidet Script's idea).

    from treadle import lang
    from treadle.lang import f32, repeat, spatial

    M, N = lang.symbols("M N")

    @lang.kernel
    def scale_rows(x: f32[M, N], y: f32[M, N], alpha: f32):
        for t in lang.parallel(4):                          # 4 workers
            for i, j in (repeat(lang.ceil_div(M, 4), N) * spatial(4, 1)).on(t):
                if i < M:
                    y[i, j] = x[i, j] * alpha

    scale_rows(x, y, 2.0)    # numpy arrays or CPU torch tensors; y is written in place
    scale_rows(x, y, alpha=2.0)                         # arguments by name, too

``@lang.kernel`` parses the function's source when it is defined (``parse``) into the
tensor-program IR through a ``FunctionBuilder``; the body never runs. The first call
compiles it (once; the C goes through the kernel cache).

Parameters. Each is annotated: a tensor ``f32[M, N]`` (dtypes f16, bf16, f32, f64, i8,
i16, i32, i64, u8, boolean) whose dimensions are ints, size symbols (``lang.symbols``), a
symbol's name as a string, or index expressions over symbols; or a scalar ``f32``, passed
as a number. Symbols take their sizes from the arguments' shapes.

Body. Names from the closure and the module, as they are when the kernel is defined, are
compile-time constants (ints, floats, tuples, task mappings, functions, tensors' shapes):
arithmetic on them runs while parsing, calls of Python functions too. Run-time values are
IR expressions: loop variables, loads ``x[i, j]``, and what is computed from them.

* ``for i in range(n)`` (also ``range(a, b, step)``), ``lang.parallel(n)`` (threads),
  ``lang.unroll(n)``, ``lang.vectorize(n)``: loops; ``lang.static_range(n)``: unrolled
  while parsing, ``i`` an int in each copy; ``for i, j in mapping.on(w)``: a task-mapping
  loop over ``spatial``, ``repeat`` and their compositions.
* ``if``/``elif``/``else`` on run-time conditions (``<``, ``==``, ``and``, ``or``,
  ``not``); on compile-time ones only the branch taken is parsed. ``x if c else y``,
  ``lang.select``, ``min``, ``max``, ``abs``, the IR's math (``lang.exp``, ``lang.sqrt``,
  ``lang.fma`` ...; ``math.exp`` means the same), ``lang.cast(x, f64)`` or ``f64(x)``.
* ``y[i, j] = v`` and ``y[i, j] += v`` store (the index count must match the rank).
* ``v = e``: a name not assigned again in the rest of its block is a constant (a let);
  one assigned again, or annotated (``acc: f32 = 0``), is a variable. Names are scoped by
  block, as in C: assign a variable before an ``if`` to set it in both branches.
* ``acc = lang.buffer(f32, [4, 2])``: a worker's local array; ``scope="shared"``: shared
  by the workers of a parallel loop, with ``lang.barrier()`` between phases.
* SIMD: vector dtypes (``f32x8``) for local buffers, ``x.vload((i, j), 8)``,
  ``lang.broadcast(s, 8)``, ``lang.fma``; a vector stored into a tensor fills consecutive
  elements.
* ``assert cond, "message"``: a run-time check (a KernelError).
* Helpers: a function decorated ``@lang.inline`` is parsed into the kernel where it is
  called, its arguments bound to what is passed; it may end with ``return value``. A
  helper may call itself where a compile-time condition ends the recursion (helper calls
  nest at most 16 deep).

Anything else (``while``, ``try``, ``return`` in a kernel, ``lambda``, comprehensions,
slices, an unknown name, a wrong number of indices) raises ``LangError`` whose message
begins ``path/to/file.py:LINE:``.

Checking. A kernel is C: an index outside a tensor reads or overwrites other memory.
``@lang.kernel(checked=True)`` (or ``TREADLE_CHECK_BOUNDS=1`` for kernels that do not say)
checks every load and store of a tensor parameter first and fails the call with a
``KernelError`` naming the tensor, the index, and the size (``ir.passes.check_bounds``).

Operators. ``kernel.register_op("name", outputs="y")`` (or a list of output parameter
names) makes the kernel a treadle graph operator and, where torch is installed, the torch
custom op ``torch.ops.treadle_lang.name``. ``OPS["name"]`` is its ``OpSpec``; an importer
of torch graphs maps a call of ``torch.ops.treadle_lang.<name>`` (the ``.default``
overload) to treadle thus:

* graph op type: ``OPS[name].op_type`` == ``"treadle_lang.<name>"`` (in
  ``treadle.graph.operator.REGISTRY``);
* the torch op's arguments are ``OPS[name].arguments``: the kernel's parameters minus its
  outputs, in declaration order, tensors and scalars interleaved as declared;
* graph inputs: the tensor arguments, in that order (``OPS[name].inputs``); scalar
  arguments become attributes of the same name (``OPS[name].attributes``);
* outputs: the torch op returns the tensors named by ``OPS[name].outputs`` (one Tensor,
  or a tuple of several), which are the graph op's outputs in the same order.

``OPS[name].apply(args, name=node_name)`` does all of it: given the torch op's arguments
(graph tensors for tensors, numbers for scalars) it returns the graph op's output tensors.
In a graph the kernel is that operator's whole program (``OpDef.kernel``), and elementwise
neighbours fuse into it as prologues and epilogues. The torch op is functional: it
allocates and returns its outputs, where a direct call of the kernel writes into the
arrays passed. Either way the kernel must write every element of its outputs.
"""
from treadle.errors import LangError
from treadle.ir.expr import broadcast, ceil_div, select
from treadle.ir.mapping import column_spatial, custom, repeat, spatial
from treadle.lang.intrinsics import (PRIMITIVE_CALLS, barrier, buffer, cast, parallel,
                                     static_range, unroll, vectorize)
from treadle.lang.kernel import LangKernel, inline, kernel
from treadle.lang.registry import OPS, OpSpec
from treadle.lang.types import (bf16, boolean, f16, f32, f32x4, f32x8, f32x16, f64, i8, i16,
                                i32, i64, symbols, u8)

# lang.exp, lang.sqrt, lang.fma ...: one function per IR primitive (treadle.ir.primitives).
globals().update(PRIMITIVE_CALLS)

__all__ = ["LangError", "LangKernel", "OPS", "OpSpec", "barrier", "bf16", "boolean",
           "broadcast", "buffer", "cast", "ceil_div", "column_spatial", "custom", "f16", "f32",
           "f32x4", "f32x8", "f32x16", "f64", "i8", "i16", "i32", "i64", "inline", "kernel",
           "parallel", "repeat", "select", "spatial", "static_range", "symbols", "u8",
           "unroll", "vectorize", *sorted(PRIMITIVE_CALLS)]
