"""Window functions, DFT and STFT against numpy (its FFT in float64, the windows from their
formulas): real and complex signals, forward and inverse, one-sided, zero-padded and cut
transforms, odd and prime lengths, a symbolic batch, and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, rng
from treadle.errors import TreadleError


def dft_model(shape, axis, opset=20, length=None, **attrs):
    inputs, constants = ["x", "", "axis"], {"axis": np.array(axis, np.int64)}
    if opset < 20:
        inputs, constants, attrs = ["x"], {}, {**attrs, "axis": axis}
    if length is not None:
        inputs[1:2] = ["length"]
        constants["length"] = np.array(length, np.int64)
    node = helper.make_node("DFT", inputs, ["y"], name="dft", **attrs)
    return make_model([node], [tensor("x", list(shape))], [tensor("y", None)], constants,
                      opset=opset)


def as_complex(x):
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(np.complex128)


def as_pairs(z):
    return np.stack([z.real, z.imag], -1).astype(np.float32)


def signal(shape, seed=0):
    return rng(seed).standard_normal(shape).astype(np.float32)


# (shape, axis, dft_length): real and complex, each axis, padded and cut.
CASES = [((3, 13, 1), 1, None), ((2, 7, 5, 2), 1, None), ((2, 7, 5, 2), 2, None),
         ((1, 61, 2), -2, None), ((4, 10, 1), 1, 16), ((4, 10, 2), 1, 7), ((1, 1, 1), 1, None)]


@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("shape, axis, length", CASES)
def test_dft_matches_numpy(shape, axis, length, inverse):
    x = signal(shape)
    got = treadle.compile(dft_model(shape, axis, length=length, inverse=inverse))(x=x)[0]
    fft = np.fft.ifft if inverse else np.fft.fft
    want = fft(as_complex(x.astype(np.float64)), n=length, axis=axis % len(shape) if axis >= 0
               else axis + 1)
    assert_close(got, as_pairs(want), reduction=shape[axis])


@pytest.mark.parametrize("n, length", [(13, None), (8, None), (10, 7), (10, 24)])
def test_one_sided_and_back(n, length):
    """rfft of a real signal, then the inverse of the half spectrum (irfft)."""
    x = signal((3, n, 1))
    half = treadle.compile(dft_model((3, n, 1), 1, length=length, onesided=1))(x=x)[0]
    want = np.fft.rfft(x[..., 0].astype(np.float64), n=length, axis=1)
    assert_close(half, as_pairs(want), reduction=n)
    size = length or n
    back = treadle.compile(dft_model(half.shape, 1, length=size, inverse=1, onesided=1))(
        x=half)[0]
    assert_close(back[..., 0], np.fft.irfft(want, n=size, axis=1).astype(np.float32),
                 reduction=size)


def test_opset_19_takes_the_axis_as_an_attribute():
    x = signal((2, 5, 11, 1))
    got = treadle.compile(dft_model(x.shape, 2, opset=19))(x=x)[0]
    assert_close(got, as_pairs(np.fft.fft(x[..., 0].astype(np.float64), axis=2)), reduction=11)


def test_a_symbolic_batch():
    compiled = treadle.compile(dft_model(["n", 17, 2], 1))
    for n in (1, 4, 0):
        x = signal((n, 17, 2), n)
        assert_close(compiled(x=x)[0], as_pairs(np.fft.fft(as_complex(x.astype(np.float64)),
                                                           axis=1)), reduction=17)


def test_bad_inputs_name_the_node():
    with pytest.raises(TreadleError, match="dft.*axis of 1 \\(real\\) or 2"):
        treadle.compile(dft_model((3, 8, 3), 1))
    with pytest.raises(TreadleError, match="dft.*must not be the last"):
        treadle.compile(dft_model((3, 8, 2), -1))


def window_model(op, size, **attrs):
    node = helper.make_node(op, ["size"], ["y"], name="window", **attrs)
    return make_model([node], [], [tensor("y", None, attrs.get("output_datatype", 1))],
                      {"size": np.array(size, np.int64)}, opset=17)


def cosine_window(coefficients, size, periodic):
    """sum of c_j cos(2 pi j n / N), N the size for a periodic window, one less otherwise."""
    n = np.arange(size, dtype=np.float64)
    period = size if periodic else size - 1
    return sum(c * np.cos(2 * np.pi * j * n / period) for j, c in enumerate(coefficients))


@pytest.mark.parametrize("op, coefficients", [("HannWindow", (0.5, -0.5)),
                                              ("HammingWindow", (25 / 46, -21 / 46)),
                                              ("BlackmanWindow", (0.42, -0.5, 0.08))])
@pytest.mark.parametrize("size, periodic", [
    (1, 1), pytest.param(2, 1, marks=pytest.mark.slow), (2, 0),
    pytest.param(7, 1, marks=pytest.mark.slow), (7, 0),
    pytest.param(61, 0, marks=pytest.mark.slow), (400, 1)])
def test_windows_match_their_formulas(op, coefficients, size, periodic):
    got = treadle.compile(window_model(op, size, periodic=periodic))()[0]
    assert_close(got, cosine_window(coefficients, size, periodic).astype(np.float32))


def test_the_window_type_is_the_one_asked_for():
    got = treadle.compile(window_model("HannWindow", 16, output_datatype=TensorProto.DOUBLE))()[0]
    np.testing.assert_allclose(got, np.hanning(17)[:-1], rtol=1e-12, atol=1e-15)


def stft_model(shape, step, window=None, length=None, onesided=1):
    inputs, constants = ["signal", "step"], {"step": np.array(step, np.int64)}
    if window is not None:
        inputs.append("window")
        constants["window"] = window
    if length is not None:
        inputs += [""] * (3 - len(inputs)) + ["length"]
        constants["length"] = np.array(length, np.int64)
    node = helper.make_node("STFT", inputs, ["y"], name="stft", onesided=onesided)
    return make_model([node], [tensor("signal", list(shape))], [tensor("y", None)], constants,
                      opset=17)


def numpy_stft(x, step, length, window, onesided):
    frames = (x.shape[1] - length) // step + 1
    z = as_complex(x.astype(np.float64))
    windows = np.stack([z[:, f * step:f * step + length] for f in range(frames)], 1)
    spectrum = np.fft.fft(windows * (1 if window is None else window), axis=-1)
    return as_pairs(spectrum[..., :length // 2 + 1] if onesided else spectrum)


@pytest.mark.parametrize("shape, step, length, windowed, onesided", [
    ((1, 128, 1), 8, 16, False, 1), ((2, 97, 1), 5, 13, True, 1), ((3, 61, 2), 7, 10, True, 0),
    ((1, 400, 1), 160, 400, True, 1)])
def test_stft_matches_numpy(shape, step, length, windowed, onesided):
    window = np.hanning(length + 1)[:-1].astype(np.float32) if windowed else None
    x = signal(shape)
    got = treadle.compile(stft_model(shape, step, window, None if windowed else length,
                                     onesided))(signal=x)[0]
    assert_close(got, numpy_stft(x, step, length, window, onesided), reduction=length)
