"""A video classifier in plain ``torch.nn``: R3D-18, the ResNet-18 of 3-D convolutions
(Tran et al., CVPR 2018; torchvision's ``r3d_18``), whose every convolution, batch norm
and pooling also runs over time.

The module takes a clip N x 3 x frames x H x W and records, like the models of
``dense.py``, its input's name, channels and clip length for export
(``export.declare_io``); the clip length is a knob of the builder only for that.
"""
from __future__ import annotations

from typing import Sequence

from treadle.models import require
from treadle.models.export import declare_io

torch = require("torch")
nn = torch.nn


def conv3d_bn(cin: int, cout: int, kernel, stride=1, padding=0) -> list:
    return [nn.Conv3d(cin, cout, kernel, stride, padding, bias=False), nn.BatchNorm3d(cout)]


class BasicBlock3d(nn.Module):
    """Two 3x3x3 convolutions (the first strided in time and space alike), with a 1x1x1
    projection shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(*conv3d_bn(cin, cout, 3, stride, 1), nn.ReLU(inplace=True),
                                  *conv3d_bn(cout, cout, 3, 1, 1))
        self.shortcut = (nn.Sequential(*conv3d_bn(cin, cout, 1, stride))
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class VideoResNet(nn.Module):
    """A 3x7x7 stem of stride (1, 2, 2) and no pooling, stages of basic blocks (stage k
    with width * 2**k channels, the later ones starting with stride 2), global average
    pooling over time and space, and a linear classifier."""

    def __init__(self, blocks: Sequence[int], width: int, num_classes: int):
        super().__init__()
        layers = [*conv3d_bn(3, width, (3, 7, 7), (1, 2, 2), (1, 3, 3)), nn.ReLU(inplace=True)]
        cin = width
        for stage, count in enumerate(blocks):
            cout = width * 2 ** stage
            for k in range(count):
                layers.append(BasicBlock3d(cin, cout, 2 if stage > 0 and k == 0 else 1))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def r3d_18(*, blocks: Sequence[int] = (2, 2, 2, 2), width: int = 64, num_classes: int = 400,
           frames: int = 8) -> nn.Module:
    """R3D-18 for Kinetics-400 by default (channels 64-512); ``blocks`` counts the basic
    blocks per stage, ``width`` is the stem's channels, ``frames`` the clip length it is
    exported at (any length of at least 1 runs)."""
    model = VideoResNet(blocks, width, num_classes)
    declare_io(model, "video", 3, "logits", frames)
    return model
