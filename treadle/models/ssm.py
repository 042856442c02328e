"""A small Mamba language model (Gu and Dao, 2023) in plain ``torch.nn``: a selective state
space model in place of attention.

Each layer normalizes its input (RMSNorm), projects it to an inner stream and a gate,
runs the stream through a causal depthwise 1-D convolution and SiLU, and scans it: every
channel carries a state of ``d_state`` numbers, which each time step decays by
exp(dt A) and feeds by dt B x, and which C reads out; dt, B and C are computed from the
token itself (the "selective" part), A is learnt per channel and state. The scan's
output, plus D times its input, is gated by SiLU of the gate and projected back onto the
residual stream. The language model head shares the embedding's weights.

The scan is a Python loop over the time steps, which the ONNX exporter unrolls into one
multiply-add per step: the exported model has a fixed sequence length. The module records
its input's range of values and its output's name for export, as the transformers do.
"""
from __future__ import annotations

import math

from treadle.models import require

torch = require("torch")
nn = torch.nn
F = torch.nn.functional


class RMSNorm(nn.RMSNorm):
    """torch's RMSNorm with its formula written out, since aten::rms_norm has no ONNX
    export at opset 17."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def selective_scan(x, dt, a, b, c):
    """y_t = c_t . h_t with h_t = exp(dt_t a) h_{t-1} + dt_t b_t x_t and h_0 = 0, for x and
    dt of batch x length x channels, a of channels x state, b and c of batch x length x
    state. The decays and inputs of all steps are computed at once; only the recurrence
    steps through time."""
    decay = torch.exp(dt.unsqueeze(-1) * a)  # batch x length x channels x state
    drive = (dt * x).unsqueeze(-1) * b.unsqueeze(2)
    states = [drive[:, 0]]
    for t in range(1, x.shape[1]):
        states.append(decay[:, t] * states[-1] + drive[:, t])
    return (torch.stack(states, 1) * c.unsqueeze(2)).sum(-1)


class MambaMixer(nn.Module):
    """Mamba's block (without its norm and residual), with an inner width ``expand`` times
    the model's and dt computed through a rank of model width / 16."""

    def __init__(self, d_model: int, d_state: int, d_conv: int, expand: int):
        super().__init__()
        inner = expand * d_model
        self.d_state = d_state
        self.dt_rank = math.ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * inner, bias=False)
        # Causal: padded on both sides by the d_conv - 1 steps of the past it sees, and
        # the outputs past the last input step dropped.
        self.conv = nn.Conv1d(inner, inner, d_conv, padding=d_conv - 1, groups=inner)
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, inner)
        # S4D-real's initialization: the channels' states decay at rates 1..d_state.
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, hidden):
        x, gate = self.in_proj(hidden).chunk(2, -1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2))
        dt, b, c = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], -1)
        dt = F.softplus(self.dt_proj(dt))
        y = selective_scan(x, dt, -torch.exp(self.A_log), b, c) + x * self.D
        return self.out_proj(y * F.silu(gate))


class MambaLayer(nn.Module):
    def __init__(self, d_model: int, d_state: int, d_conv: int, expand: int):
        super().__init__()
        self.norm = RMSNorm(d_model, eps=1e-5)
        self.mixer = MambaMixer(d_model, d_state, d_conv, expand)

    def forward(self, hidden):
        return hidden + self.mixer(self.norm(hidden))


class MambaLM(nn.Module):
    """Token ids in, next-token logits out."""

    def __init__(self, vocab: int, layers: int, d_model: int, d_state: int, d_conv: int,
                 expand: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.layers = nn.Sequential(*(MambaLayer(d_model, d_state, d_conv, expand)
                                      for _ in range(layers)))
        self.norm = RMSNorm(d_model, eps=1e-5)
        self.input_ranges = {"input_ids": (0, vocab - 1)}
        self.output_names = ("logits",)

    def forward(self, input_ids):
        return self.norm(self.layers(self.embedding(input_ids))) @ self.embedding.weight.T


def mamba_small(*, vocab: int = 1024, layers: int = 4, d_model: int = 256, d_state: int = 16,
                d_conv: int = 4, expand: int = 2) -> nn.Module:
    """A four-layer Mamba of width 256 (inner width 512, 16 states a channel, convolution
    over 4 steps: Mamba's defaults) over a vocabulary of 1024 tokens by default."""
    return MambaLM(vocab, layers, d_model, d_state, d_conv, expand)
