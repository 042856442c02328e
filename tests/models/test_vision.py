"""The vision models' architectures, checked without exporting: parameter counts of the
published networks at the default knobs, and reduced recipes that keep every kind of layer
of the full model. tests/models/test_models.py checks them end to end."""
import pytest

torch = pytest.importorskip("torch", reason="the zoo models are built with torch "
                            "(pip install 'treadle[test]')")

from treadle.models import MODELS  # noqa: E402
from treadle.models import vision  # noqa: E402

# Parameters at the default knobs: torchvision's counts for ResNeXt-50 32x4d, RegNetY-800MF
# and EfficientNet-B0; the papers give Res2Net-50 26w4s 25.7M, MixNet-S 4.1M and
# CSPDarknet-53 27.6M.
PUBLISHED = {"resnext50": 25_028_904, "regnet_y_800mf": 6_432_512, "res2net50": 25_699_120,
             "cspdarknet53": 27_642_184, "efficientnet_b0": 5_288_548, "mixnet_s": 4_134_606}
VISION = sorted(n for n, r in MODELS.items() if r.family == "vision")


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def layer_kinds(model) -> set:
    """Each convolution's kernel, stride and grouping, and every other module's type."""
    kinds = set()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            grouping = ("depthwise" if m.groups == m.in_channels > 1 else
                        "grouped" if m.groups > 1 else "dense")
            kinds.add((m.kernel_size, m.stride, grouping))
        else:
            kinds.add(type(m).__name__)
    return kinds


@pytest.fixture(scope="module")
def full_models():
    torch.manual_seed(0)
    return {name: getattr(vision, MODELS[name].builder)() for name in VISION}


def test_every_vision_model_has_a_published_size():
    assert sorted(PUBLISHED) == VISION


@pytest.mark.parametrize("name", VISION)
def test_full_model_has_the_published_size(full_models, name):
    assert parameters(full_models[name]) == PUBLISHED[name]


@pytest.mark.parametrize("name", VISION)
def test_reduced_model_keeps_every_kind_of_layer(full_models, name):
    reduced = getattr(vision, MODELS[name].builder)(**MODELS[name].reduced)
    assert layer_kinds(reduced) == layer_kinds(full_models[name])


def test_mixed_kernels_split_channels_as_mixconv():
    assert vision.split_channels(10, 3) == [4, 3, 3]
    conv = vision.MixConv(10, (3, 5, 7), stride=2)
    assert [(c.in_channels, c.kernel_size) for c in conv.convs] == [
        (4, (3, 3)), (3, (5, 5)), (3, (7, 7))]
    assert conv(torch.randn(1, 10, 9, 9)).shape == (1, 10, 5, 5)


def test_regnet_rejects_partial_groups():
    with pytest.raises(ValueError, match=r"widths \(16, 24\) do not split into groups of 16"):
        vision.regnet_y_800mf(depths=(1, 1), widths=(16, 24))
