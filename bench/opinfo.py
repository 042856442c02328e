"""Runs PyTorch's own OpInfo sample inputs through ``torch.compile(backend="treadle")``.

    python -m bench.opinfo [--ops NAME ...] [--samples 4] [--json FILE] [--verbose]

OpInfos come from ``op_db`` (shipped in torch's testing package), float32 on CPU. An
OpInfo is selected when treadle claims its ATen operators: one of its first samples, traced
by ``make_fx`` (which, as AOTAutograd does, decomposes composite ops), uses only overloads
with a converter in ``treadle.frontend.aten.TABLE``. Its other samples run too: one that
needs an unclaimed operator shows up as unsupported.

Each sample is one function of its tensors (python numbers and options are baked in),
compiled alone with static shapes and no graph breaks, and compared with eager under
``torch.testing.assert_close``: with the loosest float32 tolerance the OpInfo's decorators
give CPU tests, else assert_close's float32 defaults (rtol 1.3e-6, atol 1e-5), or, where
they differ by more, with the result computed in float64: treadle's error no larger than
a few times eager's (``as_accurate_as_eager``). OpInfo's
``wrapper_set_seed`` (around dropout and attention; dynamo does not trace into it) becomes
a plain call, as both runs start from the same seed anyway. A sample ends as
  passed       treadle compiled every ATen operator of the sample and the results match;
  failed       wrong numbers, shape or dtype, or an exception (a treadle bug);
  unsupported  the backend ran some of it in eager (and warned), or dynamo could not
               capture it in one graph;
  skipped      eager itself cannot run it, nor dynamo with its own eager backend, or
               it holds no ATen operator.
An op has failed if any sample failed, passed if others passed (some may be
unsupported), and is unsupported when no sample compiled.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
from unittest import mock

import torch
from torch.utils import _pytree as pytree

from bench.suites import FAILED, PASSED, SKIPPED, UNSUPPORTED, finish, first_line

DEFAULT_SAMPLES = 4
# Ops whose results are uninitialised memory: only their shape and dtype are compared.
UNDEFINED_VALUES = {"empty", "empty_like", "new_empty", "empty_strided", "empty_permuted"}


@dataclass
class SampleOutcome:
    index: int
    status: str
    detail: str = ""


@dataclass
class OpOutcome:
    name: str
    status: str
    samples: list[SampleOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(s.status == status for s in self.samples)


# ---- selecting OpInfos -------------------------------------------------------------------

def op_name(op) -> str:
    """The OpInfo's name as its tests spell it: ``name.variant`` when it has a variant."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def float32_opinfos(names: Optional[Sequence[str]] = None) -> list:
    """The OpInfos of ``op_db`` that run float32 on CPU, optionally only those named."""
    from torch.testing._internal.common_methods_invocations import op_db
    ops = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    if names is None:
        return ops
    by_name = {op_name(op): op for op in ops}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise KeyError(f"no float32 CPU OpInfo named {unknown}")
    return [by_name[n] for n in names]


def samples(op, limit: int) -> list:
    """The OpInfo's first ``limit`` float32 CPU samples."""
    found = []
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        found.append(sample)
        if len(found) == limit:
            break
    return found


def as_function(op, sample) -> tuple[Callable, list[torch.Tensor]]:
    """The sample as a function of its tensors (its graph inputs), with the tensors."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def call(*tensors):
        filled = list(leaves)
        for k, tensor in zip(positions, tensors):
            filled[k] = tensor
        first, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op(first, *args, **kwargs)
    return call, [leaves[k] for k in positions]


def aten_ops(function: Callable, tensors: Sequence[torch.Tensor]) -> set:
    """The ATen overloads ``make_fx`` traces the function to (empty if it cannot)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = make_fx(function)(*tensors)
    except Exception:  # noqa: BLE001  (eager itself refuses the sample: not claimed)
        return set()
    return {n.target for n in traced.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def claims(op, chosen: Sequence) -> bool:
    """Whether some sample traces to ATen overloads that all have treadle converters."""
    from treadle.frontend.aten import TABLE
    with traceable_seeding():
        for sample in chosen:
            targets = aten_ops(*as_function(op, sample))
            if targets and targets <= TABLE.keys():
                return True
    return False


@contextlib.contextmanager
def traceable_seeding():
    """OpInfo's ``wrapper_set_seed`` as a plain call of the op it wraps."""
    from torch.testing._internal import common_methods_invocations
    with mock.patch.object(common_methods_invocations, "wrapper_set_seed",
                           lambda op, *args, **kwargs: op(*args, **kwargs)):
        yield


def tolerance(op) -> dict[str, float]:
    """``atol`` and ``rtol`` for float32 on CPU: the loosest the OpInfo's decorators set,
    or none (assert_close's defaults)."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo
    atol = rtol = 0.0
    for info in op.decorators:
        applies = not isinstance(info, DecorateInfo) or (
            info.device_type in (None, "cpu") and info.active_if is not False
            and (info.dtypes is None or torch.float32 in info.dtypes))
        decorators = info.decorators if isinstance(info, DecorateInfo) else [info]
        for decorator in decorators if applies else []:
            value = getattr(decorator, "d", {}).get(torch.float32)
            if isinstance(decorator, toleranceOverride) and value is not None:
                atol, rtol = max(atol, value.atol), max(rtol, value.rtol)
            elif isinstance(decorator, precisionOverride) and value is not None:
                atol = max(atol, value)
    if not atol and not rtol:
        return {}
    defaults = torch.testing._comparison.default_tolerances(torch.float32)
    return {"rtol": max(rtol, defaults[0]), "atol": max(atol, defaults[1])}


# ---- running one sample -------------------------------------------------------------------

def _counting_backend(graphs: list) -> Callable:
    """The treadle backend, recording each graph dynamo hands it."""
    treadle = torch._dynamo.lookup_backend("treadle")

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        graphs.append(gm)
        return treadle(gm, example_inputs)
    return backend


def _eager_warning(caught) -> str:
    """The backend's warning that it ran something in eager, or ''."""
    for record in caught:
        text = str(record.message)
        if text.startswith("treadle") and "eager" in text:
            return text.splitlines()[0]
    return ""


def _run(function: Callable, tensors: Sequence[torch.Tensor]) -> Any:
    torch.manual_seed(0)  # random ops draw the same numbers in both runs
    with torch.no_grad():
        return function(*[t.detach().clone() for t in tensors])


def run_sample(op, sample, index: int, tol: dict[str, float]) -> SampleOutcome:
    """Compiles one sample alone and compares it with eager."""
    function, tensors = as_function(op, sample)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager's own deprecation notes
            expected = _run(function, tensors)
    except Exception as err:  # noqa: BLE001
        return SampleOutcome(index, SKIPPED, f"eager refuses it: {first_line(err)}")
    if not aten_ops(function, tensors):
        return SampleOutcome(index, SKIPPED, "no ATen operator")
    try:
        actual, fallback = _through_backend(function, tensors)
    except torch._dynamo.exc.Unsupported as err:
        return SampleOutcome(index, UNSUPPORTED, f"dynamo: {first_line(err)}")
    except Exception as err:  # noqa: BLE001  (anything else is a treadle bug...
        if _fails_without_treadle(function, tensors):  # ...unless dynamo fails alone
            return SampleOutcome(index, SKIPPED, "dynamo fails with its own eager backend "
                                 f"too: {type(err).__name__}: {first_line(err)}")
        return SampleOutcome(index, FAILED, f"{type(err).__name__}: {first_line(err)}")
    problem = compare(actual, expected, tol, values=op.name not in UNDEFINED_VALUES)
    if problem and as_accurate_as_eager(function, tensors, actual, expected):
        problem = ""
    if problem:
        return SampleOutcome(index, FAILED, problem + (f" ({fallback})" if fallback else ""))
    return SampleOutcome(index, UNSUPPORTED, fallback) if fallback else \
        SampleOutcome(index, PASSED)


def _fails_without_treadle(function: Callable, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``torch.compile`` with dynamo's eager backend fails on the sample too (a
    fault of dynamo's: ``combinations`` loses the unbacked sizes it creates)."""
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run(torch.compile(function, backend="eager", fullgraph=True, dynamic=False),
                 tensors)
    except Exception:  # noqa: BLE001
        return True
    return False


def _through_backend(function: Callable, tensors: Sequence[torch.Tensor]) -> tuple[Any, str]:
    """The function's result compiled afresh by the backend, and the backend's warning
    that it ran some of it in eager ('' if none)."""
    torch._dynamo.reset()  # nothing compiled for an earlier sample is reused
    graphs: list = []
    compiled = torch.compile(function, backend=_counting_backend(graphs), fullgraph=True,
                             dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run(compiled, tensors)
    if not graphs:
        raise RuntimeError("the sample never reached the backend")
    return result, _eager_warning(caught)


# How much further from float64 than eager's a result may be, where the two differ beyond
# the tolerance: summing in another order (a transposed convolution as a product of its
# stride phases) moves a sum that cancels to near zero by more than rtol, and the
# tolerance cannot tell that from a wrong number, float64 can.
EAGER_ERROR_FACTOR = 4


def as_accurate_as_eager(function: Callable, tensors: Sequence[torch.Tensor], actual: Any,
                         expected: Any) -> bool:
    """Whether every float tensor of ``actual`` lies within EAGER_ERROR_FACTOR times
    eager's largest error of the result computed in float64 (False where it cannot be)."""
    wide = [t.double() if t.is_floating_point() else t for t in tensors]
    try:
        exact = _run(function, wide)
    except Exception:  # noqa: BLE001  (an op without float64)
        return False
    leaves = [pytree.tree_leaves(v) for v in (actual, expected, exact)]
    if len({len(v) for v in leaves}) != 1:
        return False
    for a, e, x in zip(*leaves):
        if not (isinstance(a, torch.Tensor) and a.is_floating_point()):
            continue
        if not (isinstance(x, torch.Tensor) and a.shape == e.shape == x.shape):
            return False
        ours, eager = ((v.double() - x).abs().max().item() for v in (a, e))
        if not ours <= EAGER_ERROR_FACTOR * eager:
            return False
    return True


def compare(actual: Any, expected: Any, tol: dict[str, float], values: bool = True) -> str:
    """What differs between two results ('' if nothing), as assert_close words it;
    without ``values`` only their structure, shapes and dtypes."""
    if not values:
        actual, expected = (pytree.tree_map_only(torch.Tensor, torch.zeros_like, v)
                            for v in (actual, expected))
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
    except (AssertionError, TypeError, ValueError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        return "; ".join(lines[:4])
    return ""



# ---- running ops ----------------------------------------------------------------------------

def run_op(op, limit: int = DEFAULT_SAMPLES) -> OpOutcome:
    """Every one of the op's first ``limit`` samples through the backend."""
    start = time.perf_counter()
    tol = tolerance(op)
    with traceable_seeding():
        outcomes = [run_sample(op, s, k, tol) for k, s in enumerate(samples(op, limit))]
    statuses = {o.status for o in outcomes}
    status = FAILED if FAILED in statuses else PASSED if PASSED in statuses else \
        UNSUPPORTED if UNSUPPORTED in statuses else SKIPPED
    return OpOutcome(op_name(op), status, outcomes, time.perf_counter() - start)


def run_all(ops: Sequence, limit: int, progress: bool = False) -> list[OpOutcome]:
    outcomes = []
    for k, op in enumerate(ops):
        if progress:
            print(f"\r{k + 1}/{len(ops)} {op_name(op):<40}", end="", file=sys.stderr,
                  flush=True)
        outcomes.append(run_op(op, limit))
    if progress:
        print(file=sys.stderr)
    return outcomes


def report(outcomes: Sequence[OpOutcome], seconds: float, verbose: bool) -> str:
    lines = [f"{'op':<44} {'status':<12} {'pass':>4} {'fail':>4} {'eager':>5} {'skip':>4}"]
    for o in outcomes:
        lines.append(f"{o.name:<44} {o.status:<12} {o.count(PASSED):>4} {o.count(FAILED):>4} "
                     f"{o.count(UNSUPPORTED):>5} {o.count(SKIPPED):>4}")
        shown = (FAILED, UNSUPPORTED, SKIPPED) if verbose else (FAILED,)
        lines += [f"    sample {s.index}: {s.status}: {s.detail}" for s in o.samples
                  if s.status in shown]
    counts = Counter(o.status for o in outcomes)
    lines.append(f"torch {torch.__version__}: {len(outcomes)} OpInfos in {seconds:.0f} s: " +
                 ", ".join(f"{counts[s]} {s}" for s in (PASSED, FAILED, UNSUPPORTED, SKIPPED)))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", help="OpInfo names (name.variant); default: "
                        "every OpInfo whose ATen operators treadle claims")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help="samples per op (the first ones)")
    parser.add_argument("--json", help="also write every outcome to this file")
    parser.add_argument("--verbose", action="store_true",
                        help="say why samples ran in eager or were skipped")
    args = parser.parse_args(argv)
    # A function that warns (linear_cross_entropy warns that it ignores an option) stays
    # one graph, its warning given after the graph runs, as a user's torch.compile would
    # allow; under fullgraph dynamo otherwise refuses the sample under any backend.
    torch._dynamo.config.reorderable_logging_functions.add(warnings.warn)
    start = time.perf_counter()
    ops = float32_opinfos(args.ops)
    if args.ops is None:
        ops = [op for op in ops if claims(op, samples(op, args.samples))]
    outcomes = run_all(ops, args.samples, progress=sys.stderr.isatty())
    print(report(outcomes, time.perf_counter() - start, args.verbose))
    return finish(outcomes, args.json)


if __name__ == "__main__":
    sys.exit(main())
