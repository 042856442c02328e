"""Seven more ImageNet classifiers in plain ``torch.nn``, for the layers the three of
``cnn.py`` lack: grouped 3x3 convolutions with 4-32 channels a group (ResNeXt-50 32x4d,
RegNetY-800MF, and RegNetX-200MF, which has no squeeze-and-excitation),
channels split into scales that feed each other and are concatenated again (Res2Net-50),
Mish after every convolution and a cross-stage split (CSPDarknet-53), squeeze-and-excitation
(RegNetY in ReLU, EfficientNet-B0 in SiLU), and depthwise convolutions mixing 3x3 to 11x11
kernels in one layer with grouped 1x1 convolutions around them (MixNet-S).

At their default knobs they have the published layer shapes (channels, groups, kernels, SE
ratios, strides), each stated in its builder; every builder takes size knobs so that a
reduced model keeps the same kinds of layers at a fraction of the cost. Every model takes
any image of at least 32x32. Padding is symmetric (k // 2), as PyTorch ports have it, not
TensorFlow's "same".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from treadle.models import require
from treadle.models.cnn import Bottleneck, ResNet, conv_bn, make_divisible

torch = require("torch")
nn = torch.nn


def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
                act: type[nn.Module] = nn.ReLU, eps: float = 1e-5, dilation: int = 1) -> list:
    return [*conv_bn(cin, cout, kernel, stride, kernel // 2 * dilation, groups, eps, dilation),
            act()]


class SqueezeExcite(nn.Module):
    """Scales each channel by a gate computed from the channel means: a 1x1 convolution
    down to ``squeeze`` channels, ``act``, a 1x1 convolution back and ``gate`` (a sigmoid,
    or MobileNetV3's hard sigmoid)."""

    def __init__(self, channels: int, squeeze: int, act: type[nn.Module],
                 gate: type[nn.Module] = nn.Sigmoid):
        super().__init__()
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, squeeze, 1),
                                  act(), nn.Conv2d(squeeze, channels, 1), gate())

    def forward(self, x):
        return x * self.gate(x)


class Classifier(nn.Module):
    """``features`` (ending in ``channels`` channels), global average pooling, dropout and a
    linear layer."""

    def __init__(self, features: Sequence[nn.Module], channels: int, num_classes: int,
                 dropout: float = 0.0):
        super().__init__()
        self.features = nn.Sequential(*features)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# ResNeXt-50 and Res2Net-50: ResNet-50 (cnn.py) with other bottlenecks.

def resnext50_32x4d(*, blocks: Sequence[int] = (3, 4, 6, 3), width: int = 64,
                    groups: int = 32, group_width: int = 4,
                    num_classes: int = 1000) -> nn.Module:
    """ResNeXt-50 32x4d (Xie et al., CVPR 2017; torchvision's) by default: ResNet-50 whose
    bottlenecks run a 3x3 convolution of ``groups`` groups of ``group_width`` channels in
    the first stage, twice as wide each stage after (128-1024 channels, 4-32 a group), out
    to 256-2048 channels."""
    def block(cin: int, planes: int, stride: int) -> nn.Module:
        inner = planes // width * groups * group_width
        return Bottleneck(cin, planes, stride, inner, groups)
    return ResNet(blocks, width, num_classes, block)


class Res2Bottleneck(nn.Module):
    """Res2Net's bottleneck: the 1x1 convolution's output splits into ``scale`` parts of
    ``split`` channels; each part but the last goes through a 3x3 convolution after the
    previous part's result is added to it, and the results and the last part are
    concatenated for the closing 1x1 convolution. A stage's first block (the one with a
    projection shortcut) adds nothing, and average-pools its last part to its stride."""

    def __init__(self, cin: int, planes: int, stride: int, split: int, scale: int):
        super().__init__()
        cout = planes * Bottleneck.expansion
        self.split = split
        self.first = stride != 1 or cin != cout
        self.reduce = nn.Sequential(*conv_bn_act(cin, split * scale, 1))
        self.convs = nn.ModuleList(nn.Sequential(*conv_bn_act(split, split, 3, stride))
                                   for _ in range(scale - 1))
        self.last = nn.AvgPool2d(3, stride, 1) if self.first else nn.Identity()
        self.expand = nn.Sequential(*conv_bn(split * scale, cout, 1))
        self.shortcut = (nn.Sequential(*conv_bn(cin, cout, 1, stride)) if self.first
                         else nn.Identity())
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        parts = torch.split(self.reduce(x), self.split, 1)
        outs = []
        for k, conv in enumerate(self.convs):
            outs.append(conv(parts[k] if k == 0 or self.first else outs[-1] + parts[k]))
        outs.append(self.last(parts[-1]))
        return self.relu(self.expand(torch.cat(outs, 1)) + self.shortcut(x))


def res2net50_26w_4s(*, blocks: Sequence[int] = (3, 4, 6, 3), width: int = 64,
                     split_width: int = 26, scale: int = 4,
                     num_classes: int = 1000) -> nn.Module:
    """Res2Net-50 26w x 4s (Gao et al., TPAMI 2019) by default: ResNet-50 whose bottlenecks
    split into ``scale`` (at least 2) parts of ``split_width`` channels in the first stage,
    twice as wide each stage after (26-208 channels a part), each part but the last with a
    3x3 convolution of its own."""
    def block(cin: int, planes: int, stride: int) -> nn.Module:
        return Res2Bottleneck(cin, planes, stride, planes // width * split_width, scale)
    return ResNet(blocks, width, num_classes, block)


# RegNetY-800MF and RegNetX-200MF.

class RegNetBlock(nn.Module):
    """RegNet's block: 1x1, grouped 3x3 (strided), squeeze-and-excitation to ``se_ratio``
    of the block's input channels (RegNetY; RegNetX, at ratio 0, has none), 1x1; a
    projection shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, group_width: int, se_ratio: float):
        super().__init__()
        excite = [SqueezeExcite(cout, round(se_ratio * cin), nn.ReLU)] if se_ratio else []
        self.body = nn.Sequential(
            *conv_bn_act(cin, cout, 1), *conv_bn_act(cout, cout, 3, stride, cout // group_width),
            *excite, *conv_bn(cout, cout, 1))
        self.shortcut = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


def regnet_y_800mf(*, depths: Sequence[int] = (1, 3, 8, 2),
                   widths: Sequence[int] = (64, 144, 320, 784), group_width: int = 16,
                   se_ratio: float = 0.25, stem: int = 32,
                   num_classes: int = 1000) -> nn.Module:
    """RegNetY-800MF (Radosavovic et al., CVPR 2020; torchvision's) by default: a 3x3
    stride-2 stem of ``stem`` channels, then four stages of ``depths`` blocks and
    ``widths`` channels, each starting with stride 2, whose 3x3 convolutions have
    ``group_width`` channels a group (the stages' widths come from the paper's quantized
    linear rule, w0 = 56, wa = 38.84, wm = 2.4, depth 14)."""
    return _regnet(depths, widths, group_width, se_ratio, stem, num_classes)


def regnetx_200mf(*, depths: Sequence[int] = (1, 1, 4, 7),
                  widths: Sequence[int] = (24, 56, 152, 368), group_width: int = 8,
                  stem: int = 32, num_classes: int = 1000) -> nn.Module:
    """RegNetX-200MF (Radosavovic et al., CVPR 2020; torchvision's) by default: RegNetY's
    layout (``regnet_y_800mf``) without squeeze-and-excitation, at widths 24-368 from
    the quantized linear rule w0 = 24, wa = 36.44, wm = 2.49, depth 13, with 8 channels a
    group (3 to 46 groups)."""
    return _regnet(depths, widths, group_width, 0.0, stem, num_classes)


def _regnet(depths: Sequence[int], widths: Sequence[int], group_width: int, se_ratio: float,
            stem: int, num_classes: int) -> Classifier:
    if any(w % group_width for w in widths):
        raise ValueError(f"widths {tuple(widths)} do not split into groups of {group_width}")
    layers, cin = conv_bn_act(3, stem, 3, 2), stem
    for depth, cout in zip(depths, widths, strict=True):
        for k in range(depth):
            layers.append(RegNetBlock(cin, cout, 2 if k == 0 else 1, group_width, se_ratio))
            cin = cout
    return Classifier(layers, cin, num_classes)


# CSPDarknet-53.

class DarkResidual(nn.Module):
    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(*conv_bn_act(channels, hidden, 1, act=nn.Mish),
                                  *conv_bn_act(hidden, channels, 3, act=nn.Mish))

    def forward(self, x):
        return x + self.body(x)


class CrossStage(nn.Module):
    """A CSPDarknet stage: a strided 3x3 convolution, then a 1x1 one whose output splits in
    halves: one goes through the residual blocks and a 1x1 transition, the other around
    them, and a last 1x1 convolution merges the two. The first stage expands to twice its
    channels and halves them inside its blocks; the others neither."""

    def __init__(self, cin: int, cout: int, depth: int, first: bool):
        super().__init__()
        expanded = 2 * cout if first else cout
        half = self.half = expanded // 2
        self.enter = nn.Sequential(*conv_bn_act(cin, cout, 3, 2, act=nn.Mish),
                                   *conv_bn_act(cout, expanded, 1, act=nn.Mish))
        self.blocks = nn.Sequential(
            *(DarkResidual(half, half // 2 if first else half) for _ in range(depth)),
            *conv_bn_act(half, half, 1, act=nn.Mish))
        self.merge = nn.Sequential(*conv_bn_act(expanded, cout, 1, act=nn.Mish))

    def forward(self, x):
        around, through = self.enter(x).split(self.half, 1)
        return self.merge(torch.cat([around, self.blocks(through)], 1))


def cspdarknet53(*, depths: Sequence[int] = (1, 2, 8, 8, 4), width: int = 32,
                 num_classes: int = 1000) -> nn.Module:
    """CSPDarknet-53 (Wang et al., CVPR workshops 2020; YOLOv4's backbone, with Mish; timm's
    layout) by default: a 3x3 stem of ``width`` channels, then five cross stages of
    ``depths`` residual blocks, stage k with ``width`` * 2**(k+1) channels (64-1024)."""
    layers, cin = conv_bn_act(3, width, 3, act=nn.Mish), width
    for stage, depth in enumerate(depths):
        cout = width * 2 ** (stage + 1)
        layers.append(CrossStage(cin, cout, depth, stage == 0))
        cin = cout
    return Classifier(layers, cin, num_classes)


# EfficientNet-B0 and MixNet-S: inverted residuals with squeeze-and-excitation.

@dataclass(frozen=True)
class BlockRow:
    """A row of an inverted-residual network's table: ``repeats`` blocks (the first with
    ``stride``) of ``channels`` outputs, expanding their input ``expand`` times, depthwise
    over ``kernels`` (several: mixed, a split of the channels each), squeezing to
    ``se_ratio`` of the input's channels, in SiLU (``swish``) or ReLU, with 1x1
    convolutions of ``groups`` groups (expansion, projection)."""
    expand: int
    kernels: tuple[int, ...]
    stride: int
    channels: int
    repeats: int
    se_ratio: float = 0.0
    swish: bool = True
    groups: tuple[int, int] = (1, 1)


BN_EPS = 1e-3  # the TensorFlow originals' batch-norm epsilon


def split_channels(channels: int, parts: int) -> list[int]:
    """MixConv's split: equal parts, the first taking what does not divide."""
    sizes = [channels // parts] * parts
    sizes[0] += channels - sum(sizes)
    return sizes


class MixConv(nn.Module):
    """A depthwise convolution whose channels split into one part per kernel size (one
    kernel: a plain depthwise convolution)."""

    def __init__(self, channels: int, kernels: Sequence[int], stride: int):
        super().__init__()
        self.sizes = split_channels(channels, len(kernels))
        self.convs = nn.ModuleList(nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False)
                                   for c, k in zip(self.sizes, kernels))

    def forward(self, x):
        if len(self.convs) == 1:
            return self.convs[0](x)
        parts = torch.split(x, self.sizes, 1)
        return torch.cat([conv(part) for conv, part in zip(self.convs, parts)], 1)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, row: BlockRow):
        super().__init__()
        act = nn.SiLU if row.swish else nn.ReLU
        hidden = cin * row.expand
        expand_groups, project_groups = row.groups
        layers = ([] if row.expand == 1 else
                  conv_bn_act(cin, hidden, 1, groups=expand_groups, act=act, eps=BN_EPS))
        layers += [MixConv(hidden, row.kernels, stride), nn.BatchNorm2d(hidden, eps=BN_EPS),
                   act()]
        if row.se_ratio:
            layers.append(SqueezeExcite(hidden, max(1, int(cin * row.se_ratio)), act))
        layers += conv_bn(hidden, cout, 1, groups=project_groups, eps=BN_EPS)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def _inverted_residual_net(table: Sequence[BlockRow], repeats: Sequence[int], width: float,
                           stem: int, head: int, stem_act: type[nn.Module],
                           num_classes: int) -> Classifier:
    """A 3x3 stride-2 stem, the table's rows (``repeats`` blocks each, channels scaled by
    ``width``), a 1x1 head of ``head`` channels, then the classifier (dropout 0.2)."""
    cin = make_divisible(stem * width)
    layers = conv_bn_act(3, cin, 3, 2, act=stem_act, eps=BN_EPS)
    for row, count in zip(table, repeats, strict=True):
        cout = make_divisible(row.channels * width)
        for k in range(count):
            layers.append(InvertedResidual(cin, cout, row.stride if k == 0 else 1, row))
            cin = cout
    layers += conv_bn_act(cin, head, 1, act=stem_act, eps=BN_EPS)
    return Classifier(layers, head, num_classes, dropout=0.2)


EFFICIENTNET_B0 = tuple(BlockRow(expand, (kernel,), stride, channels, repeats, 0.25)
                        for expand, kernel, stride, channels, repeats in (
                            (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2),
                            (6, 3, 2, 80, 3), (6, 5, 1, 112, 3), (6, 5, 2, 192, 4),
                            (6, 3, 1, 320, 1)))


def efficientnet_b0(*, repeats: Sequence[int] = tuple(r.repeats for r in EFFICIENTNET_B0),
                    width: float = 1.0, head: int = 1280,
                    num_classes: int = 1000) -> nn.Module:
    """EfficientNet-B0 (Tan and Le, ICML 2019) by default: a 32-channel stem, the seven
    rows of ``EFFICIENTNET_B0`` (MBConv blocks with 3x3 or 5x5 depthwise kernels, SE to a
    quarter of each block's input, SiLU everywhere), a 1280-channel head. ``repeats``
    counts each row's blocks, ``width`` scales the channels (rounded to multiples of 8)."""
    return _inverted_residual_net(EFFICIENTNET_B0, repeats, width, 32, head, nn.SiLU,
                                  num_classes)


def _mixnet_row(repeats: int, kernels: tuple[int, ...], groups: tuple[int, int], stride: int,
                expand: int, channels: int, se_ratio: float = 0.0) -> BlockRow:
    return BlockRow(expand, kernels, stride, channels, repeats, se_ratio, se_ratio > 0, groups)


# The MixNet paper's block strings (r1_k3.5.7_a1_p1.1_s22_e6_i40_o80_se0.25_sw, ...) in
# their order: repeats, kernels, (expansion, projection) groups, stride, expansion,
# channels, SE ratio; the rows with SE are the ones in SiLU.
MIXNET_S = (
    _mixnet_row(1, (3,), (1, 1), 1, 1, 16),
    _mixnet_row(1, (3,), (2, 2), 2, 6, 24),
    _mixnet_row(1, (3,), (2, 2), 1, 3, 24),
    _mixnet_row(1, (3, 5, 7), (1, 1), 2, 6, 40, 0.5),
    _mixnet_row(3, (3, 5), (2, 2), 1, 6, 40, 0.5),
    _mixnet_row(1, (3, 5, 7), (1, 2), 2, 6, 80, 0.25),
    _mixnet_row(2, (3, 5), (1, 2), 1, 6, 80, 0.25),
    _mixnet_row(1, (3, 5, 7), (2, 2), 1, 6, 120, 0.5),
    _mixnet_row(2, (3, 5, 7, 9), (2, 2), 1, 3, 120, 0.5),
    _mixnet_row(1, (3, 5, 7, 9, 11), (1, 1), 2, 6, 200, 0.5),
    _mixnet_row(2, (3, 5, 7, 9), (1, 2), 1, 6, 200, 0.5),
)


def mixnet_s(*, repeats: Sequence[int] = tuple(r.repeats for r in MIXNET_S),
             width: float = 1.0, head: int = 1536, num_classes: int = 1000) -> nn.Module:
    """MixNet-S (Tan and Le, BMVC 2019) by default: a 16-channel stem and a 1536-channel
    head in ReLU around the eleven rows of ``MIXNET_S``: mixed depthwise kernels of 3x3 to
    11x11, 1x1 convolutions of two groups, SE to half or a quarter of each block's input.
    ``repeats`` counts each row's blocks, ``width`` scales the channels (rounded to
    multiples of 8)."""
    return _inverted_residual_net(MIXNET_S, repeats, width, 16, head, nn.ReLU, num_classes)
