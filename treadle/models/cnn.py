"""Three standard CNNs in plain ``torch.nn``: ResNet-50, Inception-V3 and MobileNetV2.

They follow torchvision's definitions (which do not import beside torch 2.13), so at their
default knobs they have the published layer shapes and FLOP counts. Every builder takes size
knobs (blocks per stage, channel width, classes) so that a reduced model keeps the same
kinds of layers — strided, grouped, asymmetric and pooled convolutions, residual adds,
concatenations — at a fraction of the cost. Input size is free: ResNet-50 and MobileNetV2
take any image of at least 32x32, Inception-V3 at least 75x75.
"""
from __future__ import annotations

from typing import Callable, Sequence

from treadle.models import require

torch = require("torch")
nn = torch.nn


def conv_bn(cin: int, cout: int, kernel, stride=1, padding=0, groups: int = 1,
            eps: float = 1e-5, dilation: int = 1) -> list:
    return [nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups, bias=False),
            nn.BatchNorm2d(cout, eps=eps)]


# ResNet-50 (the torchvision "v1.5" variant: the stride sits on the 3x3 convolution).

class Bottleneck(nn.Module):
    """1x1, 3x3 and 1x1 convolutions around ``inner`` channels (``planes`` unless given;
    ResNeXt's are wider and split into ``groups``), out to four times ``planes``."""
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, inner: int = 0, groups: int = 1):
        super().__init__()
        cout = planes * self.expansion
        inner = inner or planes
        self.body = nn.Sequential(
            *conv_bn(cin, inner, 1), nn.ReLU(inplace=True),
            *conv_bn(inner, inner, 3, stride, 1, groups), nn.ReLU(inplace=True),
            *conv_bn(inner, cout, 1))
        self.shortcut = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """``block(cin, planes, stride)`` makes each residual block, with ``planes`` times
    ``Bottleneck.expansion`` output channels."""

    def __init__(self, blocks: Sequence[int], width: int, num_classes: int,
                 block: Callable[[int, int, int], nn.Module] = Bottleneck):
        super().__init__()
        layers = [*conv_bn(3, width, 7, 2, 3), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        cin = width
        for stage, count in enumerate(blocks):
            planes = width * 2 ** stage
            for k in range(count):
                layers.append(block(cin, planes, 2 if stage > 0 and k == 0 else 1))
                cin = planes * Bottleneck.expansion
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def resnet50(*, blocks: Sequence[int] = (3, 4, 6, 3), width: int = 64,
             num_classes: int = 1000) -> nn.Module:
    """ResNet-50 by default; ``blocks`` sets bottlenecks per stage, ``width`` the stem's
    channels (stage k has width * 2**k bottleneck channels, four times that out)."""
    return ResNet(blocks, width, num_classes)


# Inception-V3 (torchvision's Inception3 without the auxiliary classifier).

class BasicConv(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__(*conv_bn(cin, cout, kernel, stride, padding, eps=1e-3),
                         nn.ReLU(inplace=True))


class _Branches(nn.Module):
    """Runs each branch on the input and concatenates the results on channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([branch(x) for branch in self.branches], 1)


def _avg_pool_conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), BasicConv(cin, cout, 1))


def _inception_a(cin: int, pool: int, c) -> tuple[nn.Module, int]:
    block = _Branches(
        BasicConv(cin, c(64), 1),
        nn.Sequential(BasicConv(cin, c(48), 1), BasicConv(c(48), c(64), 5, padding=2)),
        nn.Sequential(BasicConv(cin, c(64), 1), BasicConv(c(64), c(96), 3, padding=1),
                      BasicConv(c(96), c(96), 3, padding=1)),
        _avg_pool_conv(cin, pool))
    return block, c(64) + c(64) + c(96) + pool


def _inception_b(cin: int, c) -> tuple[nn.Module, int]:
    block = _Branches(
        BasicConv(cin, c(384), 3, 2),
        nn.Sequential(BasicConv(cin, c(64), 1), BasicConv(c(64), c(96), 3, padding=1),
                      BasicConv(c(96), c(96), 3, 2)),
        nn.MaxPool2d(3, 2))
    return block, c(384) + c(96) + cin


def _inception_c(cin: int, c7: int, c) -> tuple[nn.Module, int]:
    def row(a, b):  # 1x7
        return BasicConv(a, b, (1, 7), padding=(0, 3))

    def col(a, b):  # 7x1
        return BasicConv(a, b, (7, 1), padding=(3, 0))
    block = _Branches(
        BasicConv(cin, c(192), 1),
        nn.Sequential(BasicConv(cin, c7, 1), row(c7, c7), col(c7, c(192))),
        nn.Sequential(BasicConv(cin, c7, 1), col(c7, c7), row(c7, c7), col(c7, c7),
                      row(c7, c(192))),
        _avg_pool_conv(cin, c(192)))
    return block, 4 * c(192)


def _inception_d(cin: int, c) -> tuple[nn.Module, int]:
    block = _Branches(
        nn.Sequential(BasicConv(cin, c(192), 1), BasicConv(c(192), c(320), 3, 2)),
        nn.Sequential(BasicConv(cin, c(192), 1),
                      BasicConv(c(192), c(192), (1, 7), padding=(0, 3)),
                      BasicConv(c(192), c(192), (7, 1), padding=(3, 0)),
                      BasicConv(c(192), c(192), 3, 2)),
        nn.MaxPool2d(3, 2))
    return block, c(320) + c(192) + cin


def _inception_e(cin: int, c) -> tuple[nn.Module, int]:
    def split(stem: nn.Module) -> nn.Module:  # the stem feeds a 1x3 and a 3x1 branch
        return nn.Sequential(stem, _Branches(
            BasicConv(c(384), c(384), (1, 3), padding=(0, 1)),
            BasicConv(c(384), c(384), (3, 1), padding=(1, 0))))
    block = _Branches(
        BasicConv(cin, c(320), 1),
        split(BasicConv(cin, c(384), 1)),
        split(nn.Sequential(BasicConv(cin, c(448), 1),
                            BasicConv(c(448), c(384), 3, padding=1))),
        _avg_pool_conv(cin, c(192)))
    return block, c(320) + 4 * c(384) + c(192)


def _nth(widths: Sequence[int], k: int) -> int:
    return widths[min(k, len(widths) - 1)]


class InceptionV3(nn.Module):
    # Per-block widths of torchvision's Inception3: pool features of the A blocks and 7x7
    # channels of the C blocks; a model with more blocks repeats the last entry.
    POOL_FEATURES = (32, 64, 64)
    CHANNELS_7X7 = (128, 160, 160, 192)

    def __init__(self, blocks: Sequence[int], width: float, num_classes: int):
        super().__init__()

        def c(channels: int) -> int:
            return max(1, round(channels * width))
        count_a, count_c, count_e = blocks
        layers = [BasicConv(3, c(32), 3, 2), BasicConv(c(32), c(32), 3),
                  BasicConv(c(32), c(64), 3, padding=1), nn.MaxPool2d(3, 2),
                  BasicConv(c(64), c(80), 1), BasicConv(c(80), c(192), 3), nn.MaxPool2d(3, 2)]
        cin = c(192)
        for k in range(count_a):
            block, cin = _inception_a(cin, c(_nth(self.POOL_FEATURES, k)), c)
            layers.append(block)
        block, cin = _inception_b(cin, c)
        layers.append(block)
        for k in range(count_c):
            block, cin = _inception_c(cin, c(_nth(self.CHANNELS_7X7, k)), c)
            layers.append(block)
        block, cin = _inception_d(cin, c)
        layers.append(block)
        for _ in range(count_e):
            block, cin = _inception_e(cin, c)
            layers.append(block)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(self.dropout(torch.flatten(self.pool(self.features(x)), 1)))


def inception_v3(*, blocks: Sequence[int] = (3, 4, 2), width: float = 1.0,
                 num_classes: int = 1000) -> nn.Module:
    """Inception-V3 by default (for 299x299 images); ``blocks`` counts the A, C and E
    blocks (the B and D reductions are always there), ``width`` scales every channel count."""
    return InceptionV3(blocks, width, num_classes)


# MobileNetV2.

def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of 8, never 10% below the target."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1):
        super().__init__(*conv_bn(cin, cout, kernel, stride, (kernel - 1) // 2, groups),
                         nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = round(cin * expand)
        layers = [ConvBNReLU6(cin, hidden, 1)] if expand != 1 else []
        layers += [ConvBNReLU6(hidden, hidden, 3, stride, groups=hidden),
                   *conv_bn(hidden, cout, 1)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, stride) of each stage; the repeat counts are a knob.
    STAGES = ((1, 16, 1), (6, 24, 2), (6, 32, 2), (6, 64, 2), (6, 96, 1), (6, 160, 2),
              (6, 320, 1))

    def __init__(self, repeats: Sequence[int], width: float, last_channel: int,
                 num_classes: int):
        super().__init__()
        cin = make_divisible(32 * width)
        layers = [ConvBNReLU6(3, cin, 3, 2)]
        for (expand, channels, stride), count in zip(self.STAGES, repeats, strict=True):
            cout = make_divisible(channels * width)
            for k in range(count):
                layers.append(InvertedResidual(cin, cout, stride if k == 0 else 1, expand))
                cin = cout
        last = make_divisible(last_channel * max(1.0, width))
        layers.append(ConvBNReLU6(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def mobilenet_v2(*, repeats: Sequence[int] = (1, 2, 3, 4, 3, 3, 1), width: float = 1.0,
                 last_channel: int = 1280, num_classes: int = 1000) -> nn.Module:
    """MobileNetV2 (width 1.0) by default; ``repeats`` counts the inverted residuals of
    each of the seven stages, ``width`` scales channels as torchvision's width_mult does."""
    return MobileNetV2(repeats, width, last_channel, num_classes)
