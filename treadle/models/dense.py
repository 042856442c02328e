"""Models that map a feature map to a feature map: three among the benchmarks of the Korch
paper (kernel orchestration, ASPLOS 2024), Candy style transfer, Segformer-B0 segmentation
and an EfficientViT block; and U-Net segmentation, whose decoder upsamples by transposed
convolutions.

Candy is Johnson et al.'s fast-neural-style network (the ONNX model zoo's "candy"), built
in plain ``torch.nn``: reflection padding, instance norms and nearest upsampling. The
EfficientViT block is the unit of EfficientViT (Cai et al., ICCV 2023): ReLU linear
attention with multi-scale tokens, then an MBConv. Segformer-B0 comes from a
``transformers`` config (imported only when it is built); its encoder mixes attention over
reduced keys with depthwise convolutions, its head bilinear upsampling. U-Net
(Ronneberger et al., MICCAI 2015) is plain ``torch.nn``, with batch norms after its
convolutions, as most of its uses have.

Every builder returns a module of one float NCHW input, which records the input's name and
channel count and the output's name for export (``export.declare_io``).
"""
from __future__ import annotations

from treadle.models import require
from treadle.models.export import declare_io

torch = require("torch")
nn = torch.nn

# Candy (fast neural style transfer).

def _reflect_conv(cin: int, cout: int, kernel: int, stride: int = 1) -> list:
    return [nn.ReflectionPad2d(kernel // 2), nn.Conv2d(cin, cout, kernel, stride)]


def _conv_in_relu(cin: int, cout: int, kernel: int, stride: int = 1) -> list:
    return [*_reflect_conv(cin, cout, kernel, stride), nn.InstanceNorm2d(cout, affine=True),
            nn.ReLU()]


class StyleResidual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(*_conv_in_relu(channels, channels, 3),
                                  *_reflect_conv(channels, channels, 3),
                                  nn.InstanceNorm2d(channels, affine=True))

    def forward(self, x):
        return x + self.body(x)


def _upsample_conv(cin: int, cout: int) -> list:
    # Nearest upsampling then a convolution, rather than a transposed convolution, is what
    # avoids checkerboard artefacts in the stylized image.
    return [nn.Upsample(scale_factor=2, mode="nearest"), *_conv_in_relu(cin, cout, 3)]


def candy(*, width: int = 32, blocks: int = 5) -> nn.Module:
    """Candy by default; ``width`` is the first convolution's channels (the downsampling
    ones have two and four times that), ``blocks`` counts the residual blocks."""
    model = nn.Sequential(
        *_conv_in_relu(3, width, 9),
        *_conv_in_relu(width, 2 * width, 3, 2),
        *_conv_in_relu(2 * width, 4 * width, 3, 2),
        *(StyleResidual(4 * width) for _ in range(blocks)),
        *_upsample_conv(4 * width, 2 * width),
        *_upsample_conv(2 * width, width),
        *_reflect_conv(width, 3, 9))
    declare_io(model, "image", 3, "stylized")
    return model


# U-Net.

def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """Each level of the encoder doubles the channels and halves the image (max pooling);
    each level of the decoder upsamples by a 2x2 transposed convolution of stride 2,
    concatenates the encoder's features of that size and convolves them."""

    def __init__(self, width: int, depth: int, classes: int):
        super().__init__()
        channels = [width * 2 ** level for level in range(depth + 1)]
        self.down = nn.ModuleList(_double_conv(a, b) for a, b in zip([3] + channels, channels))
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2)
                                for a, b in zip(channels, channels[1:]))
        self.merge = nn.ModuleList(_double_conv(2 * a, a) for a in channels[:-1])
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        skips = []
        for level in self.down[:-1]:
            skips.append(level(x))
            x = self.pool(skips[-1])
        x = self.down[-1](x)
        for up, merge, skip in reversed(list(zip(self.up, self.merge, skips))):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def unet(*, width: int = 32, depth: int = 4, classes: int = 2) -> nn.Module:
    """U-Net by default at half the paper's width; ``depth`` counts the poolings."""
    model = UNet(width, depth, classes)
    declare_io(model, "image", 3, "mask")
    return model


# EfficientViT block.

EPS = 1e-15  # EfficientViT's: only guards a query whose every product with k is 0


def relu_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention whose weights are ReLU(q) ReLU(k)^T normalized per query, computed as
    q (k^T v) / (q sum(k)): linear in the tokens, since k^T v and sum(k) are computed
    once for all queries. q, k, v: (batch, heads, tokens, head_dim)."""
    q, k = torch.relu(q), torch.relu(k)
    numerator = q @ (k.transpose(-1, -2) @ v)
    denominator = q @ k.sum(-2, keepdim=True).transpose(-1, -2)
    return numerator / (denominator + EPS)


class LinearAttention(nn.Module):
    """EfficientViT's multi-scale ReLU linear attention. q, k and v come from one 1x1
    convolution; each scale aggregates them over a neighbourhood (a depthwise convolution,
    then a 1x1 convolution grouped by head), which adds as many heads again."""

    def __init__(self, channels: int, head_dim: int, scales: tuple[int, ...]):
        super().__init__()
        heads = channels // head_dim
        self.head_dim = head_dim
        self.qkv = nn.Conv2d(channels, 3 * channels, 1, bias=False)
        self.aggregate = nn.ModuleList(
            nn.Sequential(nn.Conv2d(3 * channels, 3 * channels, s, padding=s // 2,
                                    groups=3 * channels, bias=False),
                          nn.Conv2d(3 * channels, 3 * channels, 1, groups=3 * heads,
                                    bias=False))
            for s in scales)
        self.project = nn.Sequential(
            nn.Conv2d(channels * (1 + len(scales)), channels, 1, bias=False),
            nn.BatchNorm2d(channels))

    def forward(self, x):
        batch, _, height, width = x.shape
        qkv = self.qkv(x)
        qkv = torch.cat([qkv, *(aggregate(qkv) for aggregate in self.aggregate)], 1)
        # (batch, heads, tokens, 3 * head_dim): each head's q, k and v side by side.
        qkv = qkv.reshape(batch, -1, 3 * self.head_dim, height * width).transpose(-1, -2)
        out = relu_linear_attention(*qkv.split(self.head_dim, -1))
        out = out.transpose(-1, -2).reshape(batch, -1, height, width)
        return self.project(out)


class MBConv(nn.Sequential):
    """EfficientViT's inverted residual: 1x1 expansion, 3x3 depthwise, 1x1 projection."""

    def __init__(self, channels: int, expand: int):
        hidden = channels * expand
        super().__init__(nn.Conv2d(channels, hidden, 1), nn.Hardswish(),
                         nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden),
                         nn.Hardswish(),
                         nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))


class EfficientViTBlock(nn.Module):
    def __init__(self, channels: int, head_dim: int, scales: tuple[int, ...], expand: int):
        super().__init__()
        self.attention = LinearAttention(channels, head_dim, scales)
        self.mbconv = MBConv(channels, expand)
        declare_io(self, "features", channels, "block_out")

    def forward(self, x):
        x = x + self.attention(x)
        return x + self.mbconv(x)


def efficientvit_block(*, channels: int = 64, head_dim: int = 16,
                       scales: tuple[int, ...] = (5,), expand: int = 4) -> nn.Module:
    """An EfficientViT-B block by default (aggregation over 5x5, MBConv expansion 4);
    ``channels`` must be a multiple of ``head_dim``."""
    if channels % head_dim:
        raise ValueError(f"{channels} channels do not split into heads of {head_dim}")
    return EfficientViTBlock(channels, head_dim, tuple(scales), expand)


# Segformer-B0.

class Segmenter(nn.Module):
    """A ``transformers`` semantic segmentation model that returns only its logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        declare_io(self, "image", model.config.num_channels, "logits")

    def forward(self, image):
        return self.model(pixel_values=image, return_dict=False)[0]


def segformer_b0(*, depths: tuple[int, ...] = (2, 2, 2, 2),
                 hidden_sizes: tuple[int, ...] = (32, 64, 160, 256),
                 heads: tuple[int, ...] = (1, 2, 5, 8), decoder_hidden: int = 256,
                 num_labels: int = 150) -> Segmenter:
    """Segformer-B0 with its ADE20K head (150 classes) by default; ``depths``,
    ``hidden_sizes`` and ``heads`` give each of the four stages' layers, width and heads.
    Logits are a quarter of the image's side."""
    transformers = require("transformers")
    config = transformers.SegformerConfig(
        depths=list(depths), hidden_sizes=list(hidden_sizes),
        num_attention_heads=list(heads), decoder_hidden_size=decoder_hidden,
        num_labels=num_labels, attn_implementation="eager")
    return Segmenter(transformers.SegformerForSemanticSegmentation(config))
