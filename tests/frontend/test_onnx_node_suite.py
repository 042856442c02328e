"""ONNX's own node test cases (shipped with the onnx package) run through treadle.

By default, a curated list of cases of the operators CNNs and transformers use runs in
process, and each must pass. The slow test runs the whole suite with
bench/onnx_node_tests.py (two worker processes, a timeout per case) and asserts that no
case fails: a case may be unsupported, with a clear UnsupportedOpError, but never give
wrong numbers or crash. Refresh CURATED from that script's output as operators are added.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.onnx_node_tests import FAILED, PASSED, node_cases, run_case
from treadle.config import config

ROOT = Path(__file__).resolve().parents[2]
SUITE_TIMEOUT_S = 3600

CURATED = (
    # element-wise arithmetic and activations
    "test_add", "test_add_bcast", "test_sub", "test_sub_bcast", "test_mul", "test_mul_bcast",
    "test_div", "test_div_bcast", "test_pow", "test_pow_bcast_array", "test_neg",
    "test_reciprocal", "test_sqrt", "test_exp", "test_erf", "test_relu", "test_sigmoid",
    "test_tanh", "test_leakyrelu", "test_clip", "test_clip_default_min",
    "test_clip_splitbounds", "test_where_example", "test_where_long_example", "test_equal",
    "test_less", "test_gelu_default_1", "test_gelu_tanh_1", "test_gelu_default_1_expanded",
    "test_gelu_tanh_1_expanded",
    # linear layers
    "test_matmul_1d_1d", "test_matmul_1d_3d", "test_matmul_2d", "test_matmul_3d",
    "test_matmul_4d", "test_matmul_4d_1d", "test_matmul_bcast", "test_gemm_all_attributes",
    "test_gemm_alpha", "test_gemm_beta", "test_gemm_default_matrix_bias",
    "test_gemm_default_no_bias", "test_gemm_default_scalar_bias",
    "test_gemm_default_single_elem_vector_bias", "test_gemm_default_vector_bias",
    "test_gemm_transposeA", "test_gemm_transposeB",
    # softmax and normalization
    "test_softmax_axis_0", "test_softmax_axis_1", "test_softmax_axis_2",
    "test_softmax_default_axis", "test_softmax_example", "test_softmax_large_number",
    "test_softmax_negative_axis", "test_softmax_axis_1_expanded",
    "test_softmax_large_number_expanded", "test_logsoftmax_axis_1",
    "test_logsoftmax_large_number", "test_batchnorm_epsilon", "test_batchnorm_example",
    "test_layer_normalization_2d_axis0", "test_layer_normalization_2d_axis1",
    "test_layer_normalization_2d_axis_negative_1", "test_layer_normalization_2d_axis_negative_2",
    "test_layer_normalization_3d_axis0_epsilon", "test_layer_normalization_3d_axis1_epsilon",
    "test_layer_normalization_3d_axis2_epsilon",
    "test_layer_normalization_3d_axis_negative_1_epsilon",
    "test_layer_normalization_3d_axis_negative_3_epsilon", "test_layer_normalization_4d_axis0",
    "test_layer_normalization_4d_axis1", "test_layer_normalization_4d_axis2",
    "test_layer_normalization_4d_axis3", "test_layer_normalization_4d_axis_negative_1",
    "test_layer_normalization_4d_axis_negative_4", "test_layer_normalization_default_axis",
    "test_group_normalization_epsilon", "test_group_normalization_example",
    "test_layer_normalization_2d_axis1_expanded", "test_layer_normalization_4d_axis1_expanded",
    "test_reduce_max_default_axes_keepdims_random", "test_rms_normalization_2d_axis_negative_1",
    "test_rms_normalization_3d_axis2_epsilon", "test_rms_normalization_3d_axis2_epsilon_expanded",
    "test_isnan", "test_isinf",
    # convolution and pooling (opset 22)
    "test_conv_with_strides_padding", "test_conv_with_autopad_same", "test_maxpool_2d_default",
    "test_maxpool_2d_pads", "test_averagepool_2d_default", "test_averagepool_2d_pads",
    "test_globalaveragepool", "test_hardswish", "test_mish", "test_convtranspose",
    "test_convtranspose_1d", "test_convtranspose_3d", "test_convtranspose_autopad_same",
    "test_convtranspose_dilations", "test_convtranspose_group_2", "test_convtranspose_kernel_shape",
    "test_convtranspose_output_shape", "test_convtranspose_pads",
    # data movement
    "test_concat_1d_axis_0", "test_concat_2d_axis_1", "test_concat_2d_axis_negative_2",
    "test_concat_3d_axis_0", "test_concat_3d_axis_2", "test_concat_3d_axis_negative_1",
    "test_gather_0", "test_gather_1", "test_gather_2d_indices", "test_gather_negative_indices",
    "test_split_equal_parts_1d_opset13", "test_split_equal_parts_2d_opset13",
    "test_split_1d_uneven_split_opset18", "test_split_2d_uneven_split_opset18",
    # sizes found in the data, and resizing with antialias
    "test_nonzero_example", "test_compress_0", "test_compress_default_axis",
    "test_unique_not_sorted_without_axis", "test_unique_sorted_with_axis_3d",
    "test_nonmaxsuppression_two_batches", "test_nonmaxsuppression_center_point_box_format",
    "test_resize_downsample_sizes_cubic_antialias",
    # selection, running products, sampling, einsum
    "test_top_k", "test_top_k_negative_axis", "test_top_k_same_values",
    "test_top_k_same_values_2d", "test_top_k_same_values_largest", "test_top_k_smallest",
    "test_top_k_uint64", "test_cumprod_1d_reverse_exclusive", "test_cumprod_2d_axis_1",
    "test_cumprod_2d_int32", "test_gridsample", "test_gridsample_border_padding",
    "test_gridsample_bilinear_align_corners_0_additional_1",
    "test_gridsample_nearest_align_corners_1_additional_1", "test_einsum_batch_diagonal",
    "test_einsum_batch_matmul", "test_einsum_inner_prod", "test_einsum_sum",
    "test_einsum_transpose", "test_gridsample_bicubic", "test_gridsample_reflection_padding",
    "test_gridsample_volumetric_bilinear_align_corners_0",
    # resizing, training-mode statistics, integer powers, bool reductions, pools
    "test_resize_upsample_scales_cubic", "test_resize_downsample_sizes_cubic",
    "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside",
    "test_resize_upsample_scales_linear_half_pixel_symmetric",
    "test_resize_tf_crop_and_resize_extrapolation_value",
    "test_resize_tf_crop_and_resize_axes_3_2", "test_resize_downsample_sizes_nearest_not_larger",
    "test_batchnorm_example_training_mode", "test_pow_types_int64_int64",
    "test_pow_types_int32_float32", "test_reduce_max_bool_inputs", "test_reduce_min_bool_inputs",
    "test_lppool_2d_pads", "test_lppool_2d_dilations",
    "test_maxpool_with_argmax_2d_precomputed_strides",
    # inputs whose contents decide shapes (compiled per content), contents computed from
    # constants in float arithmetic, half precision rounded per operation
    "test_reduce_sum_keepdims_random", "test_reshape_reordered_all_dims", "test_constant_pad",
    "test_unsqueeze_two_axes", "test_hannwindow_expanded",
    "test_resize_downsample_scales_linear_align_corners",
    "test_range_bfloat16_type_positive_delta", "test_attention_4d_causal_fp16_expanded",
    "test_attention_4d_fp16", "test_attention_4d_causal_fp16",
    "test_attention_4d_gqa_with_past_and_present_fp16",
    # recurrent layers
    "test_lstm_defaults", "test_lstm_batchwise", "test_lstm_bidirectional",
    "test_lstm_reverse", "test_lstm_with_initial_bias", "test_lstm_with_peepholes",
    "test_gru_defaults", "test_gru_batchwise", "test_gru_bidirectional", "test_gru_reverse",
    "test_gru_seq_length", "test_gru_with_initial_bias", "test_simple_rnn_defaults",
    "test_simple_rnn_batchwise", "test_simple_rnn_bidirectional", "test_simple_rnn_reverse",
    "test_simple_rnn_with_initial_bias", "test_rnn_seq_length",
)


@pytest.fixture(scope="module")
def cases():
    wanted = set(CURATED)
    return {c.name: c for c in node_cases("^(" + "|".join(CURATED) + ")$") if c.name in wanted}


@pytest.mark.parametrize("name", CURATED)
def test_curated_node_case_passes(cases, name):
    assert name in cases, f"{name} is not among the installed onnx package's node tests"
    outcome = run_case(cases[name])
    assert outcome.status == PASSED, outcome.detail


@pytest.mark.slow
def test_no_node_case_gives_wrong_results(tmp_path):
    report = tmp_path / "outcomes.json"
    env = {**os.environ, "TREADLE_CACHE_DIR": str(config.cache_dir)}
    result = subprocess.run([sys.executable, "-m", "bench.onnx_node_tests", "--json",
                             str(report)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=SUITE_TIMEOUT_S)
    assert report.exists(), result.stderr[-4000:]
    outcomes = json.loads(report.read_text())
    failed = [f"{o['name']}: {o['detail']}" for o in outcomes if o["status"] == FAILED]
    assert not failed, f"{len(failed)} node tests failed:\n" + "\n".join(failed)
    assert sum(o["status"] == PASSED for o in outcomes) >= len(CURATED)
