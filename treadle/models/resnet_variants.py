"""Two ImageNet classifiers that change ResNet's block, in plain ``torch.nn``: ECA-ResNet-50,
whose bottlenecks end in efficient channel attention (a 1-D convolution across the channel
means, in place of squeeze-and-excitation's two 1x1 convolutions), and DPN-68, whose dual
path blocks keep a residual path (added to) beside a densely connected one (concatenated
to), with pre-activated grouped 3x3 convolutions.

At their default knobs they have the published layer shapes, stated in each builder; the
size knobs let a reduced model keep every kind of layer. Every model takes any image of
at least 32x32.
"""
from __future__ import annotations

import math
from typing import Sequence

from treadle.models import require
from treadle.models.cnn import Bottleneck, ResNet
from treadle.models.vision import Classifier, conv_bn_act

torch = require("torch")
nn = torch.nn


# ECA-ResNet-50.

def eca_kernel(channels: int, gamma: int = 2, b: int = 1) -> int:
    """ECA's kernel for ``channels`` channels: the odd number nearest above
    (log2(channels) + b) / gamma, so wider layers mix more neighbouring channels."""
    size = int(abs((math.log2(channels) + b) / gamma))
    return size if size % 2 else size + 1


class EfficientChannelAttention(nn.Module):
    """Scales each channel by the sigmoid of a 1-D convolution (no bias) over the channel
    means, the channels taken as a sequence."""

    def __init__(self, channels: int):
        super().__init__()
        kernel = eca_kernel(channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.conv = nn.Conv1d(1, 1, kernel, padding=kernel // 2, bias=False)

    def forward(self, x):
        means = self.pool(x).squeeze(-1).transpose(-1, -2)  # N x 1 x C
        weights = self.conv(means).transpose(-1, -2).unsqueeze(-1)  # N x C x 1 x 1
        return x * torch.sigmoid(weights)


def eca_resnet50(*, blocks: Sequence[int] = (3, 4, 6, 3), width: int = 64,
                 num_classes: int = 1000) -> nn.Module:
    """ECA-ResNet-50 (Wang et al., CVPR 2020) by default: ResNet-50 (``cnn.resnet50``, same
    knobs) with ECA on each bottleneck's output before the residual add, its kernel
    adapted to the channels (5 for 256-1024 channels, 7 for 2048): 86 parameters more."""
    def block(cin: int, planes: int, stride: int) -> nn.Module:
        bottleneck = Bottleneck(cin, planes, stride)
        bottleneck.body.append(EfficientChannelAttention(planes * Bottleneck.expansion))
        return bottleneck
    return ResNet(blocks, width, num_classes, block)


# DPN-68.

BN_EPS = 1e-3  # the MXNet original's batch-norm epsilon


def bn_relu_conv(cin: int, cout: int, kernel: int, stride: int = 1,
                 groups: int = 1) -> nn.Sequential:
    """DPN's pre-activated convolution: batch norm and ReLU on the input."""
    return nn.Sequential(nn.BatchNorm2d(cin, eps=BN_EPS), nn.ReLU(inplace=True),
                         nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups,
                                   bias=False))


class DualPathBlock(nn.Module):
    """Takes the residual and the dense path (or, first in the network, one tensor) and
    runs their concatenation through a 1x1, a grouped 3x3 (strided) and a 1x1 convolution,
    whose output splits in two: ``residual`` channels added to the residual path and
    ``increment`` channels concatenated to the dense one. A stage's first block projects
    the concatenated input to a fresh residual path and a dense path of two increments."""

    def __init__(self, cin: int, bottleneck: int, residual: int, increment: int, groups: int,
                 stride: int, project: bool):
        super().__init__()
        self.residual = residual
        self.project = (bn_relu_conv(cin, residual + 2 * increment, 1, stride) if project
                        else None)
        self.body = nn.Sequential(bn_relu_conv(cin, bottleneck, 1),
                                  bn_relu_conv(bottleneck, bottleneck, 3, stride, groups),
                                  bn_relu_conv(bottleneck, residual + increment, 1))

    def forward(self, x):
        paths = x if isinstance(x, tuple) else (x,)
        joined = torch.cat(paths, 1) if len(paths) > 1 else paths[0]
        if self.project is not None:
            projected = self.project(joined)
            paths = (projected[:, :self.residual], projected[:, self.residual:])
        out = self.body(joined)
        return (paths[0] + out[:, :self.residual],
                torch.cat([paths[1], out[:, self.residual:]], 1))


class JoinPaths(nn.Module):
    """The last block's two paths concatenated, batch-normed and rectified."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.Sequential(nn.BatchNorm2d(channels, eps=BN_EPS), nn.ReLU(inplace=True))

    def forward(self, paths):
        return self.norm(torch.cat(paths, 1))


def dpn68(*, blocks: Sequence[int] = (3, 4, 12, 3), width: int = 64,
          increments: Sequence[int] = (16, 32, 32, 64), bottleneck: int = 2,
          groups: int = 32, stem: int = 10, num_classes: int = 1000) -> nn.Module:
    """DPN-68 (Chen et al., NeurIPS 2017; the MXNet original's layout, as timm has it) by
    default: a 3x3 stride-2 stem of ``stem`` channels and a max pooling, then four stages of
    ``blocks`` dual path blocks, stage k with a residual path of ``width`` * 2**k channels
    (64-512), a dense path growing ``increments[k]`` channels a block and grouped 3x3
    convolutions ``bottleneck`` times as wide as the residual path (128-1024 channels in
    ``groups`` groups); the stages after the first start with stride 2. The two paths end
    at 832 channels."""
    layers = [*conv_bn_act(3, stem, 3, 2, eps=BN_EPS), nn.MaxPool2d(3, 2, 1)]
    cin = stem
    for stage, (count, increment) in enumerate(zip(blocks, increments, strict=True)):
        residual = width * 2 ** stage
        for k in range(count):
            layers.append(DualPathBlock(cin, bottleneck * residual, residual, increment,
                                        groups, 2 if stage > 0 and k == 0 else 1, k == 0))
            cin = residual + (k + 3) * increment
    layers.append(JoinPaths(cin))
    return Classifier(layers, cin, num_classes)
