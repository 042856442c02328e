"""DeepLabV3 semantic segmentation on a MobileNetV3-Large backbone, in plain ``torch.nn``:
torchvision's ``deeplabv3_mobilenet_v3_large`` without its auxiliary (training) head.

The backbone (Howard et al., ICCV 2019) is a table of inverted residuals with 3x3 or
5x5 depthwise kernels, ReLU or hard swish, and squeeze-and-excitation gated by a hard
sigmoid. DeepLabV3 (Chen et al., 2017) keeps its stride-2 stages only down to an output
stride of 16 (or 8): each stage past it runs at stride 1 with twice the previous
dilation instead. Its ASPP head runs five branches side by side on that map - a 1x1
convolution, three 3x3 convolutions at dilations 12, 24 and 36 and image pooling
(global average, 1x1 convolution, bilinear upsampling back) - concatenates them,
projects them to 256 channels, and after a 3x3 convolution classifies every pixel; the
logits are upsampled bilinearly to the image's size. On the 14x14 map of a 224x224 image
only the centre tap of the 24 and 36 dilations lands inside the map, as in torchvision's.

The module records its input's and output's names for export (``export.declare_io``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from treadle.models import require
from treadle.models.cnn import conv_bn, make_divisible
from treadle.models.export import declare_io
from treadle.models.vision import SqueezeExcite, conv_bn_act

torch = require("torch")
nn = torch.nn
F = torch.nn.functional

BN_EPS = 1e-3  # MobileNetV3's; the DeepLab head keeps torch's default (1e-5)


@dataclass(frozen=True)
class Bneck:
    """A row of MobileNetV3's table: one inverted residual."""
    kernel: int
    expanded: int
    channels: int
    excite: bool
    hardswish: bool
    stride: int


MOBILENET_V3_LARGE = tuple(Bneck(*row) for row in (
    (3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2),
    (3, 72, 24, False, False, 1), (5, 72, 40, True, False, 2),
    (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
    (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1),
    (3, 184, 80, False, True, 1), (3, 184, 80, False, True, 1),
    (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
    (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1),
    (5, 960, 160, True, True, 1)))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expansion (unless the row keeps the input's width),
    depthwise convolution, squeeze-and-excitation to a quarter of the expanded channels
    (rounded to 8) where the row has it, and a 1x1 projection."""

    def __init__(self, cin: int, expanded: int, cout: int, row: Bneck, stride: int,
                 dilation: int):
        super().__init__()
        act = nn.Hardswish if row.hardswish else nn.ReLU
        layers = [] if expanded == cin else conv_bn_act(cin, expanded, 1, act=act, eps=BN_EPS)
        layers += conv_bn_act(expanded, expanded, row.kernel, stride, expanded, act, BN_EPS,
                              dilation)
        if row.excite:
            layers.append(SqueezeExcite(expanded, make_divisible(expanded // 4), nn.ReLU,
                                        nn.Hardsigmoid))
        layers += conv_bn(expanded, cout, 1, eps=BN_EPS)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v3_features(rows: Sequence[Bneck], width: float,
                          output_stride: int) -> tuple[nn.Sequential, int]:
    """MobileNetV3's stem (3x3, stride 2, hard swish), ``rows`` with their channels scaled
    by ``width``, and the last 1x1 convolution to six times the last row's channels; the
    rows past ``output_stride`` dilated instead of strided. Returns the layers and their
    output channels."""
    cin = make_divisible(16 * width)
    layers = conv_bn_act(3, cin, 3, 2, act=nn.Hardswish, eps=BN_EPS)
    reached, dilation = 2, 1
    for row in rows:
        stride = row.stride
        if stride > 1 and reached * stride > output_stride:
            stride, dilation = 1, dilation * row.stride
        reached *= stride
        cout = make_divisible(row.channels * width)
        layers.append(InvertedResidual(cin, make_divisible(row.expanded * width), cout, row,
                                       stride, dilation))
        cin = cout
    layers += conv_bn_act(cin, 6 * cin, 1, act=nn.Hardswish, eps=BN_EPS)
    return nn.Sequential(*layers), 6 * cin


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: a 1x1 convolution, a 3x3 one at each of ``rates``
    and image pooling, each to ``channels`` channels with a batch norm and ReLU,
    concatenated and projected back to ``channels`` (then dropout, for training)."""

    def __init__(self, cin: int, channels: int, rates: Sequence[int]):
        super().__init__()
        self.branches = nn.ModuleList(
            [nn.Sequential(*conv_bn_act(cin, channels, 1))]
            + [nn.Sequential(*conv_bn_act(cin, channels, 3, dilation=r)) for r in rates])
        self.pooling = nn.Sequential(nn.AdaptiveAvgPool2d(1), *conv_bn_act(cin, channels, 1))
        self.project = nn.Sequential(*conv_bn_act((len(rates) + 2) * channels, channels, 1),
                                     nn.Dropout(0.5))

    def forward(self, x):
        pooled = F.interpolate(self.pooling(x), size=x.shape[-2:], mode="bilinear",
                               align_corners=False)
        return self.project(torch.cat([branch(x) for branch in self.branches] + [pooled], 1))


class DeepLabV3(nn.Module):
    def __init__(self, backbone: nn.Module, cin: int, channels: int, rates: Sequence[int],
                 num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(
            ASPP(cin, channels, rates),
            *conv_bn_act(channels, channels, 3),
            nn.Conv2d(channels, num_classes, 1))

    def forward(self, x):
        return F.interpolate(self.head(self.backbone(x)), size=x.shape[-2:], mode="bilinear",
                             align_corners=False)


def deeplabv3_mobilenet_v3(*, rows: Sequence[int] = tuple(range(len(MOBILENET_V3_LARGE))),
                           width: float = 1.0, output_stride: int = 16, head: int = 256,
                           rates: Sequence[int] = (12, 24, 36),
                           num_classes: int = 21) -> nn.Module:
    """DeepLabV3-MobileNetV3-Large for the 21 Pascal VOC classes by default. ``rows``
    picks the rows of ``MOBILENET_V3_LARGE`` the backbone keeps, ``width`` scales its
    channels (rounded to multiples of 8), ``output_stride`` (8, 16 or 32) is the
    backbone's total stride, ``head`` the ASPP's channels and ``rates`` its dilations."""
    if output_stride not in (8, 16, 32):
        raise ValueError(f"output stride {output_stride}: DeepLabV3 takes 8, 16 or 32")
    backbone, channels = mobilenet_v3_features([MOBILENET_V3_LARGE[k] for k in rows], width,
                                               output_stride)
    model = DeepLabV3(backbone, channels, head, rates, num_classes)
    declare_io(model, "image", 3, "logits")
    return model
