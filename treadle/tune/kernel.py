"""The one layer that makes a kernel: for an operator on a target, select its template,
choose the template's config, emit the program.

The config comes from one of the producers of configs (``tune.choice.choose``): the
level-0 point, a stored record, measurement by the target's timer, Gensor's construction,
or, where the operator's sizes hold symbols with declared ranges, DietCode's variants and
the tree that dispatches them (``tune.dynamic``). The compiler driver, orchestration's
measurer and the tuner all make kernels here. Within one compile, the variants DietCode
chooses for the whole model at once are kept in memory (``KernelMaker.tune_dynamic``);
records on disk serve the next compile. Under TREADLE_DUMP, ``<name>/schedule.txt`` says
which template, config and source each kernel got.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from treadle.config import config
from treadle.dump import dump_text
from treadle.graph.operator import Operator
from treadle.schedule.dispatch import dispatching_kernel
from treadle.schedule.kernel import Kernel
from treadle.schedule.select import select_template
from treadle.schedule.template import Template
from treadle.target import Target
from treadle.tune.dynamic import (DynamicChoice, SizeRange, Tree, choose_dynamic_many,
                                  dynamic_symbols)
from treadle.tune.choice import Choice, choose


@dataclass
class KernelMaker:
    """Makes the kernels of one compile: on ``target``, at tuning level ``tune`` (see
    ``tune.choice.LEVELS``), with DietCode's variants over the ``dynamic`` ranges of
    symbols. Called as ``maker(op, name)``, the scheduler fusion takes."""
    target: Target
    tune: int | str = 0
    dynamic: Mapping[str, SizeRange] = field(default_factory=dict)
    # DietCode's choices made in this compile, by the operator they schedule.
    variants: dict[Operator, DynamicChoice] = field(default_factory=dict)

    def tune_dynamic(self, anchors: Sequence[tuple[Operator, str]]) -> None:
        """Chooses the variants of every anchor whose sizes hold a declared symbol at once
        (two rounds of measuring for the model, not two per kernel)."""
        if not self.dynamic:
            return
        found = []
        for op, name in anchors:
            template, pattern = select_template(op, self.target)
            if dynamic_symbols(template, pattern, self.dynamic):
                found.append((op, (template, pattern, name)))
        if found:
            choices = choose_dynamic_many([item for _, item in found], self.dynamic,
                                          self.dynamic_level, self.target)
            self.variants.update(zip((op for op, _ in found), choices))

    @property
    def dynamic_level(self) -> int:
        """Dynamic tuning measures: it runs at level 1 at least."""
        return self.tune if isinstance(self.tune, int) and self.tune > 1 else 1

    def __call__(self, op: Operator, name: str) -> Kernel:
        template, pattern = select_template(op, self.target)
        if self.dynamic and dynamic_symbols(template, pattern, self.dynamic):
            if op not in self.variants:
                self.tune_dynamic([(op, name)])
            return self._dispatched(op, name, template, pattern, self.variants[op])
        choice = choose(template, pattern, name, self.tune, self.target)
        dump_text((name, "schedule.txt"), format_choice(op, choice))
        return template.emit(choice.resolved, name)

    def _dispatched(self, op: Operator, name: str, template: Template, pattern: Any,
                    variants: DynamicChoice) -> Kernel:
        dump_text((name, "schedule.txt"), format_variants(op, variants))
        key = (template.workload(pattern), str(self.target), config.num_threads,
               getattr(pattern, "checks", ()), variants.configs,
               tuple(r.config for r in variants.resolved), variants.tree)
        return _named(_dispatching(_Variants(key, template, variants)), name)


@dataclass(frozen=True)
class _Variants:
    """A dynamic choice, equal to another where they emit the same program: repeated
    layers tune to the same variants of equal workloads, whose patterns differ only in
    the names of their axes (and a failing check names its own node)."""
    key: tuple
    template: Template = field(compare=False)
    choice: DynamicChoice = field(compare=False)


@functools.lru_cache(maxsize=256)
def _dispatching(variants: _Variants) -> Kernel:
    """The variants' kernel with the tree in front, emitted once for every layer that
    tunes to them (a dispatching kernel holds several programs)."""
    choice = variants.choice
    kernels = [variants.template.emit(r, "dispatched") for r in choice.resolved]
    if len(kernels) == 1:
        return kernels[0]
    return dispatching_kernel(kernels, choice.tree.nodes, choice.tree.symbols, "dispatched")


def _named(kernel: Kernel, name: str) -> Kernel:
    apart = None if kernel.apart is None else _named(kernel.apart, name)
    return replace(kernel, function=replace(kernel.function, name=name), apart=apart)


def format_choice(op: Operator, choice: Choice) -> str:
    lines = [f"operator: {op.name} ({op.op_type})", f"template: {choice.template.name}"]
    if choice.config is not None:
        lines += [f"config: {choice.config}", f"resolved: {choice.resolved.config}"]
    lines.append(f"source: {choice.source}")
    return "\n".join(lines)


def format_variants(op: Operator, choice: DynamicChoice) -> str:
    lines = [f"operator: {op.name} ({op.op_type})", f"template: {choice.template.name}",
             f"source: {choice.source}"]
    lines += [f"variant {k}: {c} -> {r.config}"
              for k, (c, r) in enumerate(zip(choice.configs, choice.resolved))]
    lines.append("dispatch:")
    lines += _tree_lines(choice.tree, 0, "  ")
    return "\n".join(lines)


def _tree_lines(tree: Tree, k: int, indent: str) -> list[str]:
    feature, value, left, right = tree.nodes[k]
    if feature < 0:
        return [f"{indent}variant {value}"]
    symbol = tree.symbols[feature]
    return ([f"{indent}if {symbol} <= {value}:"] + _tree_lines(tree, left, indent + "  ")
            + [f"{indent}else:  # {symbol} > {value}"] + _tree_lines(tree, right, indent + "  "))
