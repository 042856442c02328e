"""The table of templates per target and the protocol's helpers: which template takes
which operator, level-0 points, and a template whose every point is refused."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.errors import ScheduleConfigError
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant
from treadle.schedule.select import TEMPLATES, schedule_operator, select_template
from treadle.schedule.template import default_point, valid_points
from treadle.schedule.templates.gemm import GEMM, GemmConfig, GemmTemplate
from treadle.schedule.templates.gemm.space import gemm_space
from treadle.target.cpu import host


def producer(op_type, inputs, **attrs):
    return apply(op_type, inputs, attrs)[0].producer


def test_each_operator_gets_the_first_template_that_matches():
    x = Tensor("x", "float32", [1, 8, 9, 9])
    cases = {
        "gemm": producer("MatMul", [Tensor("a", "float32", [7, 24]),
                                    constant(random_array((24, 16)))]),
        "window": producer("MaxPool", [x], kernel_shape=[3, 3]),
        "rules": producer("Softmax", [Tensor("s", "float32", [3, 5])]),
    }
    for name, op in cases.items():
        template, pattern = select_template(op, host())
        assert template.name == name and pattern is not None
    assert TEMPLATES["cpu"][-1].name == "rules"  # the fallback, last


def test_level_zero_point_is_the_first_accepted_config():
    op = producer("MatMul", [Tensor("a", "float32", [7, 24]), constant(random_array((24, 16)))])
    pattern = GEMM.match(op)
    config, resolved = default_point(GEMM, pattern, host())
    assert config == gemm_space(0, host())[0]
    assert resolved == GEMM.resolve(pattern, config, host())


def test_a_refused_space_falls_back_to_the_template_default(monkeypatch):
    bad = GemmConfig(block_m=7)  # not a multiple of the register tile
    monkeypatch.setattr(GemmTemplate, "space", lambda self, p, level, target: [bad])
    op = producer("MatMul", [Tensor("a", "float32", [7, 24]), constant(random_array((24, 16)))])
    pattern = GEMM.match(op)
    assert valid_points(GEMM, pattern, [bad], host()) == []
    assert default_point(GEMM, pattern, host())[0] == GemmConfig()


def test_fixed_templates_take_no_config():
    op = producer("Softmax", [Tensor("s", "float32", [3, 5])])
    template, pattern = select_template(op, host())
    assert template.space(pattern, 2, host()) == [None]
    with pytest.raises(ScheduleConfigError, match="takes no config"):
        template.check(pattern, GemmConfig(), host())


def test_schedule_operator_builds_the_level_zero_kernel():
    from tests.schedule.templates.gemm.test_program import runner
    x = random_array((7, 13), seed=2)
    op = producer("Softmax", [Tensor("s", "float32", [7, 13])])
    run = runner(schedule_operator(op, "softmax", host()))
    out = np.full((7, 13), np.nan, np.float32)
    run(x, out)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    assert_close(out, e / e.sum(axis=-1, keepdims=True))
