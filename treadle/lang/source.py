"""A Python function's syntax tree and where it came from, so that every error a kernel
raises names the file and line of the source at fault."""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

from treadle.errors import LangError


@dataclass(frozen=True)
class Source:
    path: str
    first_line: int          # the file's line number of the source's first line
    lines: tuple[str, ...]   # the source, dedented
    tree: ast.FunctionDef

    @staticmethod
    def of(fn) -> Source:
        name = getattr(fn, "__qualname__", repr(fn))
        if not inspect.isfunction(fn):
            raise LangError(f"{name}: treadle.lang parses functions defined with def, not "
                            f"{type(fn).__name__} objects")
        try:
            lines, first = inspect.getsourcelines(fn)
            path = inspect.getsourcefile(fn) or inspect.getfile(fn)
        except (OSError, TypeError) as err:
            raise LangError(f"{name}: its source is not available ({err}); treadle.lang reads "
                            "kernels from their source files") from None
        text = textwrap.dedent("".join(lines))
        try:
            tree = ast.parse(text).body[0]
        except SyntaxError as err:
            raise LangError(f"{path}:{first}: cannot parse the source of {name}: {err}") from None
        # A source that is not the function's own (code run from a string whose file
        # name is some other file's) must not be parsed in its place.
        if not isinstance(tree, ast.FunctionDef) or tree.name != fn.__name__:
            raise LangError(f"{path}:{first}: the source found there is not the definition "
                            f"of {name}")
        return Source(path, first, tuple(text.splitlines()), tree)

    def line_of(self, node: ast.AST) -> int:
        return getattr(node, "lineno", self.tree.lineno) + self.first_line - 1

    def error(self, node: ast.AST, message: str) -> LangError:
        """``path:line: message``, then the source line itself."""
        relative = getattr(node, "lineno", self.tree.lineno)
        text = self.lines[relative - 1].strip() if relative <= len(self.lines) else ""
        return LangError(f"{self.path}:{self.line_of(node)}: {message}\n    {text}")
