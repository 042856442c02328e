"""Structural comparison of IR trees that reports the first node that differs."""
import dataclasses

from treadle.ir.expr import Expr
from treadle.ir.stmt import Stmt


def first_difference(actual, expected, path="root"):
    if type(actual) is not type(expected):
        return path, actual, expected
    if isinstance(actual, (Expr, Stmt)):
        for f in dataclasses.fields(actual):
            found = first_difference(getattr(actual, f.name), getattr(expected, f.name),
                                     f"{path}.{f.name}")
            if found:
                return found
        return None
    if isinstance(actual, tuple):
        if len(actual) != len(expected):
            return path, actual, expected
        for k, (a, e) in enumerate(zip(actual, expected)):
            found = first_difference(a, e, f"{path}[{k}]")
            if found:
                return found
        return None
    return None if actual == expected else (path, actual, expected)


def assert_ir_equal(actual, expected):
    found = first_difference(actual, expected)
    if found:
        path, a, e = found
        raise AssertionError(f"IR differs at {path}:\n  got:      {a}\n  expected: {e}\n"
                             f"--- got ---\n{actual}\n--- expected ---\n{expected}")
