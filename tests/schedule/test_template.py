"""The template protocol's helpers and the optional protocols of the paper adapters."""
import pytest

from treadle.errors import ScheduleConfigError
from treadle.schedule.select import TEMPLATES, RulesTemplate
from treadle.schedule.template import (Constructible, FixedTemplate, Sized, canonical_names,
                                       default_point, valid_points)
from treadle.schedule.templates.gemm import GEMM
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA
from treadle.target.cpu import host


def test_the_adapters_are_told_apart_by_protocol():
    """DietCode's variants need a Sized template, Gensor's chain a Constructible one."""
    assert isinstance(GEMM, Sized) and isinstance(GEMM, Constructible)
    assert isinstance(MATMUL_CUDA, Constructible) and isinstance(MATMUL_CUDA, Sized)
    assert not isinstance(RulesTemplate(), Sized)
    assert not isinstance(RulesTemplate(), Constructible)
    sized = [t.name for ts in TEMPLATES.values() for t in ts if isinstance(t, Sized)]
    assert sorted(sized) == ["gemm", "matmul_cuda"]


def test_a_fixed_template_has_one_point_and_refuses_configs():
    template = FixedTemplate()
    assert template.space("pattern", 2, host()) == [None]
    assert valid_points(template, "pattern", [None, 3], host()) == [
        (None, template.resolve("pattern", None, host()))]
    config, resolved = default_point(template, "pattern", host())
    assert config is None and resolved.pattern == "pattern" and resolved.target == host()
    with pytest.raises(ScheduleConfigError, match="takes no config, got 3"):
        template.check("pattern", 3, host())


@pytest.mark.parametrize("text, names, expected", [
    ("k3_MatMul reads x7 and x7_2", ["x7", "x7_2"], "k3_MatMul reads _0 and _1"),
    ("a + ab + b", ["b", "ab", "a"], "_2 + _1 + _0"),
    ("nothing named", [], "nothing named"),
])
def test_canonical_names_number_names_by_first_appearance(text, names, expected):
    assert canonical_names(text, names) == expected
