"""The dense models' architectures at their default knobs, checked without exporting:
parameter counts of the published networks, and EfficientViT's linear attention against
the quadratic form it rearranges. tests/models/test_models.py checks them end to end."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the zoo models are built with torch "
                            "(pip install 'treadle[test]')")

from treadle.models import dense  # noqa: E402


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_candy_has_the_fast_neural_style_layers():
    # Johnson et al.'s network: 32-64-128 channels, five residual blocks; the ONNX model
    # zoo's candy holds the same 1.68M weights.
    assert parameters(dense.candy()) == 1_679_235


def test_segformer_b0_has_the_published_size():
    pytest.importorskip("transformers")
    model = dense.segformer_b0()
    # Segformer-B0 with its 150-class ADE20K head: 3.75M parameters (the paper's 3.8M).
    assert parameters(model) == 3_752_694
    assert (model.input_name, model.in_channels, model.output_name) == ("image", 3, "logits")


def test_linear_attention_is_normalized_relu_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 20, 8).unbind()  # (batch, heads, tokens, head_dim)
    scores = torch.relu(q) @ torch.relu(k).transpose(-1, -2)  # every query against every key
    expected = (scores / scores.sum(-1, keepdim=True)) @ v
    got = dense.relu_linear_attention(q, k, v)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)


def test_efficientvit_block_keeps_its_input_shape():
    block = dense.efficientvit_block(channels=32).eval()
    with torch.no_grad():
        assert block(torch.randn(1, 32, 9, 7)).shape == (1, 32, 9, 7)


def test_efficientvit_block_rejects_partial_heads():
    with pytest.raises(ValueError, match="24 channels do not split into heads of 16"):
        dense.efficientvit_block(channels=24)


def test_unet_has_the_published_size_and_keeps_the_image_size():
    # At the paper's width of 64, with batch norms: the common PyTorch U-Net's 31.04M
    # parameters for 3 input channels and 2 classes.
    assert parameters(dense.unet(width=64)) == 31_043_586
    model = dense.unet(width=4, depth=3).eval()
    assert sum(isinstance(m, torch.nn.ConvTranspose2d) for m in model.modules()) == 3
    with torch.no_grad():
        assert model(torch.randn(2, 3, 40, 24)).shape == (2, 2, 40, 24)
