"""The vision models' architectures (the classifiers of ``vision.py`` and
``resnet_variants.py``, DeepLabV3 and R3D-18), checked without exporting: parameter counts
of the published networks at the default knobs, and reduced recipes that keep every kind
of layer of the full model. tests/models/test_models.py checks them end to end."""
import importlib

import pytest

torch = pytest.importorskip("torch", reason="the zoo models are built with torch "
                            "(pip install 'treadle[test]')")

from treadle.models import MODELS  # noqa: E402
from treadle.models import deeplab, resnet_variants, vision  # noqa: E402

# Parameters at the default knobs: torchvision's counts for ResNeXt-50 32x4d, RegNetY-800MF,
# RegNetX-200MF, EfficientNet-B0 and R3D-18, and for DeepLabV3-MobileNetV3-Large less its
# auxiliary head (11,029,328 - 3,851); timm's for DPN-68; the papers give Res2Net-50 26w4s
# 25.7M, MixNet-S 4.1M and CSPDarknet-53 27.6M; ECA-ResNet-50 is torchvision's ResNet-50
# (25,557,032) and its 16 ECA kernels (three of 5 on 256 channels, four of 5 on 512, six of
# 5 on 1024, three of 7 on 2048).
PUBLISHED = {"resnext50": 25_028_904, "regnet_y_800mf": 6_432_512, "res2net50": 25_699_120,
             "cspdarknet53": 27_642_184, "efficientnet_b0": 5_288_548, "mixnet_s": 4_134_606,
             "regnetx_200mf": 2_684_792, "eca_resnet50": 25_557_032 + 86,
             "dpn68": 12_611_602, "deeplabv3_mobilenet_v3": 11_029_328 - 3_851,
             "r3d_18": 33_371_472}
FAMILIES = ("vision", "resnet_variants", "deeplab", "video")
VISION = sorted(n for n, r in MODELS.items() if r.family in FAMILIES)


def builder(name: str):
    recipe = MODELS[name]
    return getattr(importlib.import_module(f"treadle.models.{recipe.family}"), recipe.builder)


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def layer_kinds(model) -> set:
    """Each convolution's kernel, stride, grouping and whether it is dilated, and every
    other module's type."""
    kinds = set()
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
            grouping = ("depthwise" if m.groups == m.in_channels > 1 else
                        "grouped" if m.groups > 1 else "dense")
            dilated = any(d > 1 for d in m.dilation)
            kinds.add((m.kernel_size, m.stride, grouping, dilated))
        else:
            kinds.add(type(m).__name__)
    return kinds


@pytest.fixture(scope="module")
def full_models():
    torch.manual_seed(0)
    return {name: builder(name)() for name in VISION}


def test_every_vision_model_has_a_published_size():
    assert sorted(PUBLISHED) == VISION


@pytest.mark.parametrize("name", VISION)
def test_full_model_has_the_published_size(full_models, name):
    assert parameters(full_models[name]) == PUBLISHED[name]


@pytest.mark.parametrize("name", VISION)
def test_reduced_model_keeps_every_kind_of_layer(full_models, name):
    reduced = builder(name)(**MODELS[name].reduced)
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


def test_eca_kernel_grows_with_the_channels():
    # k = (log2(C) + 1) / 2, truncated, then made odd.
    assert [resnet_variants.eca_kernel(c) for c in (16, 32, 256, 512, 1024, 2048, 8192)] == [
        3, 3, 5, 5, 5, 7, 7]
    attention = resnet_variants.EfficientChannelAttention(256)
    assert attention.conv.kernel_size == (5,)
    x = torch.randn(2, 256, 3, 5)
    assert attention(x).shape == x.shape


def test_dpn_paths_grow_by_the_increments():
    # A last stage of three blocks, as DPN-68's: its dense path is the projection's two
    # increments and one more a block (5 x 64 channels), beside 8 * 2**3 residual ones.
    model = resnet_variants.dpn68(blocks=(1, 1, 1, 3), width=8, increments=(2, 4, 4, 64),
                                  groups=4, stem=8).eval()
    assert model.classifier[1].in_features == 64 + 5 * 64
    with torch.no_grad():
        residual, dense = model.features[:-1](torch.randn(1, 3, 64, 64))
    assert residual.shape == (1, 64, 2, 2) and dense.shape == (1, 5 * 64, 2, 2)


@pytest.mark.parametrize("output_stride, side", [(8, 28), (16, 14), (32, 7)])
def test_deeplab_backbone_stops_at_the_output_stride(output_stride, side):
    backbone, channels = deeplab.mobilenet_v3_features(deeplab.MOBILENET_V3_LARGE, 0.25,
                                                       output_stride)
    with torch.no_grad():
        assert backbone.eval()(torch.randn(1, 3, 224, 224)).shape == (1, channels, side, side)
    dilations = {m.dilation[0] for m in backbone.modules() if isinstance(m, torch.nn.Conv2d)}
    assert max(dilations) == 32 // output_stride


def test_deeplab_rejects_other_output_strides():
    with pytest.raises(ValueError, match="output stride 4: DeepLabV3 takes 8, 16 or 32"):
        deeplab.deeplabv3_mobilenet_v3(output_stride=4)
