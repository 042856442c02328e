"""Convolutions a GEMM tile fits badly: to a few output channels, and transposed ones,
alone and in the decoders that use them, against ONNX Runtime and PyTorch eager.

    python bench/convolutions.py                    # every case
    python bench/convolutions.py --cases dcgan cyclegan_decoder --repeat 40

(from the repository root with PYTHONPATH=., or with treadle installed)

Each case is a torch module with random weights, exported to ONNX (opset 17) and compiled
by ``treadle.compile`` at tune 0 into a fresh cache; ONNX Runtime runs the same file with
all graph optimizations, PyTorch the module itself, all on ``--threads`` threads. Times
are medians of ``--repeat`` calls taken in interleaved rounds (``treadle.timing``); a
speed-up is the other system's time over treadle's.

    narrow_*      a convolution to 1-3 channels (the window template)
    up_*          one ConvTranspose (a Conv of its stride phases and a pixel shuffle)
    dcgan         DCGAN's generator: five ConvTranspose layers with batch norms
    cyclegan_decoder  CycleGAN's upsampling: 3x3 stride-2 ConvTranspose layers, whose
                  phases have different taps, with instance norms, and its last 7x7
                  convolution to 3 channels
    aspp_d*       a DeepLabV3-MobileNetV3 head's dilated 3x3 convolutions, 960 -> 256
                  channels on a 28x28 map: at dilation 36 only the centre tap reads the
                  image
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import numpy as np

import treadle
from common import enter_treadle_settings, relative_error
from treadle.timing import interleaved_medians, load_note, onnxruntime_session


def _cases() -> dict:
    import torch
    nn = torch.nn

    def norm_relu(kind, channels):
        return [kind(channels, affine=True), nn.ReLU()]

    def dcgan():
        layers = []
        for cin, cout, stride, pad in ((100, 512, 1, 0), (512, 256, 2, 1), (256, 128, 2, 1),
                                       (128, 64, 2, 1)):
            layers += [nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False),
                       *norm_relu(nn.BatchNorm2d, cout)]
        return nn.Sequential(*layers, nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False),
                             nn.Tanh()), (1, 100, 1, 1)

    def cyclegan_decoder():
        return nn.Sequential(
            nn.Conv2d(256, 256, 3, padding=1), *norm_relu(nn.InstanceNorm2d, 256),
            nn.ConvTranspose2d(256, 128, 3, 2, 1, 1), *norm_relu(nn.InstanceNorm2d, 128),
            nn.ConvTranspose2d(128, 64, 3, 2, 1, 1), *norm_relu(nn.InstanceNorm2d, 64),
            nn.ReflectionPad2d(3), nn.Conv2d(64, 3, 7), nn.Tanh()), (1, 256, 64, 64)

    return {
        "narrow_9x9_to_3": lambda: (nn.Conv2d(32, 3, 9), (1, 32, 232, 232)),
        "narrow_5x5_to_1": lambda: (nn.Conv2d(16, 1, 5), (1, 16, 101, 101)),
        "narrow_3x3_to_2": lambda: (nn.Conv2d(128, 2, 3, padding=1), (1, 128, 56, 56)),
        "up_4x4_s2": lambda: (nn.ConvTranspose2d(256, 128, 4, 2, 1), (1, 256, 16, 16)),
        "up_2x2_s2": lambda: (nn.ConvTranspose2d(128, 64, 2, 2), (1, 128, 64, 64)),
        "up_3x3_s2": lambda: (nn.ConvTranspose2d(64, 32, 3, 2, 1, 1), (1, 64, 56, 56)),
        "dcgan": dcgan,
        "cyclegan_decoder": cyclegan_decoder,
        **{f"aspp_d{d}": (lambda d=d: (nn.Conv2d(960, 256, 3, padding=d, dilation=d),
                                       (1, 960, 28, 28))) for d in (12, 24, 36)},
    }


def bench_case(name: str, make, args) -> dict:
    import torch
    torch.manual_seed(0)
    module, shape = make()
    module.eval()
    x = torch.randn(*shape)
    path = Path(tempfile.mkdtemp(prefix="treadle-convs-")) / f"{name}.onnx"
    with torch.no_grad():
        torch.onnx.export(module, (x,), str(path), input_names=["x"], dynamo=False)
        expected = module(x).numpy()
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, warm_cache=False)
        model = treadle.compile(str(path))
        session = onnxruntime_session(str(path), args.threads)
        feed = x.numpy()
        error = relative_error(model(x=feed)[0], expected)
        torch.set_num_threads(args.threads)
        with torch.no_grad():
            seconds = interleaved_medians({
                "treadle": lambda: model(x=feed),
                "onnxruntime": lambda: session.run(None, {"x": feed}),
                "eager": lambda: module(x)}, args.repeat)
    return {"case": name, "error": error, "ms": {k: v * 1e3 for k, v in seconds.items()}}


def main(argv=None) -> int:
    cases = _cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(cases), choices=list(cases))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(load_note(args.threads), file=sys.stderr)
    print("| case | treadle ms | ORT ms | eager ms | vs ORT | vs eager | rel err |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for name in args.cases:
        row = bench_case(name, cases[name], args)
        ms = row["ms"]
        ratios.append(ms["onnxruntime"] / ms["treadle"])
        print(f"| {name} | {ms['treadle']:.3f} | {ms['onnxruntime']:.3f} | {ms['eager']:.3f} | "
              f"{ratios[-1]:.2f}x | {ms['eager'] / ms['treadle']:.2f}x | {row['error']:.1e} |",
              flush=True)
    print(f"\ngeometric mean over ONNX Runtime: {np.exp(np.mean(np.log(ratios))):.2f}x")
    print(load_note(args.threads), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
