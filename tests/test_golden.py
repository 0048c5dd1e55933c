"""Published golden cases: ONNX's backend node tests for Conv and ConvTranspose.

The expected outputs below are the values published in ONNX's operator test suite
(``onnx/backend/test/case/node/conv.py`` and ``convtranspose.py``), not computed by polyconv or
by this project's oracle. They are small integer-valued cases, so every backend and dtype must
match them exactly. ONNX's layouts are polyconv's ``NCX`` data, ``OIX`` Conv weights and ``IOX``
ConvTranspose weights; ONNX's ``pads`` list is ``pads_begin + pads_end``.

ONNX's ``auto_pad="SAME_UPPER"`` ConvTranspose case puts the odd padding element at the end, as
the contract does (docs/semantics.md#auto-pad, rule T: ``total = ek - s = 1``,
``pads_begin = 0``, ``pads_end = 1``).
"""

from __future__ import annotations

import numpy as np
import pytest

import polyconv

ONNX = {"data_format": "NCX"}


def _arange(*shape):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape)


X5 = _arange(1, 1, 5, 5)
X7x5 = _arange(1, 1, 7, 5)
X3 = _arange(1, 1, 3, 3)
ONES_3x3 = np.ones((1, 1, 3, 3))
ONES_CT = np.ones((1, 2, 3, 3))        # IOX: one input channel, two output channels
X_G2 = _arange(1, 2, 3, 3)
X_G2_IMAGE_3 = np.concatenate([X_G2, np.stack([X_G2[0, 0] + 18, X_G2[0, 1]])[None], X_G2])

CT_BASIC = [[0, 1, 3, 3, 2], [3, 8, 15, 12, 7], [9, 21, 36, 27, 15], [9, 20, 33, 24, 13],
            [6, 13, 21, 15, 8]]
CT_G2_SECOND = [[9, 19, 30, 21, 11], [21, 44, 69, 48, 25], [36, 75, 117, 81, 42],
                [27, 56, 87, 60, 31], [15, 31, 48, 33, 17]]
CT_G2_IMAGE_2_FIRST = [[18, 37, 57, 39, 20], [39, 80, 123, 84, 43], [63, 129, 198, 135, 69],
                       [45, 92, 141, 96, 49], [24, 49, 75, 51, 26]]
CT_STRIDES_3_2 = ([[0, 0, 1, 1, 3, 2, 2, 0]] * 3 + [[3, 3, 7, 4, 9, 5, 5, 0]] * 3
                  + [[6, 6, 13, 7, 15, 8, 8, 0]] * 3 + [[0] * 8])
CT_AUTOPAD_SAME = [[0, 0, 1, 1, 3, 2], [0, 0, 1, 1, 3, 2], [3, 3, 8, 5, 12, 7],
                   [3, 3, 7, 4, 9, 5], [9, 9, 20, 11, 24, 13], [6, 6, 13, 7, 15, 8]]

# name: (polyconv function, src, weights, attributes, expected output)
CASES = {
    "test_basic_conv_with_padding": (
        polyconv.convolution, X5, ONES_3x3, {"pads_begin": 1, "pads_end": 1},
        [[[[12, 21, 27, 33, 24], [33, 54, 63, 72, 51], [63, 99, 108, 117, 81],
           [93, 144, 153, 162, 111], [72, 111, 117, 123, 84]]]]),
    "test_basic_conv_without_padding": (
        polyconv.convolution, X5, ONES_3x3, {},
        [[[[54, 63, 72], [99, 108, 117], [144, 153, 162]]]]),
    "test_conv_with_strides_padding": (
        polyconv.convolution, X7x5, ONES_3x3, {"strides": 2, "pads_begin": 1, "pads_end": 1},
        [[[[12, 27, 24], [63, 108, 81], [123, 198, 141], [112, 177, 124]]]]),
    "test_conv_with_strides_no_padding": (
        polyconv.convolution, X7x5, ONES_3x3, {"strides": 2},
        [[[[54, 72], [144, 162], [234, 252]]]]),
    "test_conv_with_strides_and_asymmetric_padding": (
        polyconv.convolution, X7x5, ONES_3x3,
        {"strides": 2, "pads_begin": (1, 0), "pads_end": (1, 0)},
        [[[[21, 33], [99, 117], [189, 207], [171, 183]]]]),
    "test_conv_with_autopad_same": (
        polyconv.convolution, X5, ONES_3x3, {"strides": 2, "auto_pad": "SAME_LOWER"},
        [[[[12, 27, 24], [63, 108, 81], [72, 117, 84]]]]),
    "test_convtranspose": (
        polyconv.conv_transpose, X3, ONES_CT, {}, [[CT_BASIC, CT_BASIC]]),
    "test_convtranspose_1d": (
        polyconv.conv_transpose, _arange(1, 1, 3), np.ones((1, 2, 3)), {},
        [[[0, 1, 3, 3, 2], [0, 1, 3, 3, 2]]]),
    "test_convtranspose_output_shape": (
        polyconv.conv_transpose, X3, ONES_CT, {"strides": (3, 2), "dst_shape": (10, 8)},
        [[CT_STRIDES_3_2, CT_STRIDES_3_2]]),
    "test_convtranspose_pad": (
        polyconv.conv_transpose, X3, ONES_CT, {"strides": (3, 2), "output_padding": (1, 1)},
        [[CT_STRIDES_3_2, CT_STRIDES_3_2]]),
    "test_convtranspose_kernel_shape": (
        polyconv.conv_transpose, X3, ONES_CT,
        {"strides": (3, 2), "output_padding": (1, 1), "dst_shape": (10, 8)},
        [[CT_STRIDES_3_2, CT_STRIDES_3_2]]),
    "test_convtranspose_pads": (
        polyconv.conv_transpose, X3, ONES_CT,
        {"strides": (3, 2), "pads_begin": (1, 2), "pads_end": (1, 2)},
        [[[[1, 1, 3], [1, 1, 3], [7, 4, 9], [7, 4, 9], [7, 4, 9], [13, 7, 15],
           [13, 7, 15]]] * 2]),
    "test_convtranspose_dilations": (
        polyconv.conv_transpose, np.array([[[[3, 8, 1], [9, 5, 7], [3, 2, 6]]]], np.float64),
        np.array([[[[7, 2], [1, 9]]]], np.float64), {"dilations": 2},
        [[[[21, 56, 13, 16, 2], [63, 35, 67, 10, 14], [24, 22, 76, 76, 21],
           [9, 5, 88, 45, 63], [3, 2, 33, 18, 54]]]]),
    "test_convtranspose_autopad_same": (
        polyconv.conv_transpose, X3, ONES_CT, {"strides": 2, "auto_pad": "SAME_UPPER"},
        [[CT_AUTOPAD_SAME, CT_AUTOPAD_SAME]]),
    "test_convtranspose_group_2": (
        polyconv.conv_transpose, X_G2, np.ones((2, 1, 3, 3)), {"groups": 2},
        [[CT_BASIC, CT_G2_SECOND]]),
    "test_convtranspose_group_2_image_3": (
        polyconv.conv_transpose, X_G2_IMAGE_3, np.ones((2, 1, 3, 3)), {"groups": 2},
        [[CT_BASIC, CT_G2_SECOND], [CT_G2_IMAGE_2_FIRST, CT_G2_SECOND],
         [CT_BASIC, CT_G2_SECOND]]),
}


@pytest.mark.parametrize("name", CASES)
def test_onnx_backend_node_case(target, name):
    fn, x, w, attrs, expected = CASES[name]
    weights_format = "OIX" if fn is polyconv.convolution else "IOX"
    for dtype in ("float32", "float64"):
        if dtype not in target.dtypes:
            continue
        y = target.call(fn, x.astype(dtype), w.astype(dtype), **ONNX,
                        weights_format=weights_format, **attrs)
        np.testing.assert_array_equal(target.to_numpy(y), np.asarray(expected, np.float64),
                                      err_msg=f"{name} ({dtype})")


def test_onnx_cases_cover_the_published_inputs():
    """The image-3 group case's second image, as ONNX publishes it: 18..26 then 9..17."""
    second = X_G2_IMAGE_3[1]
    np.testing.assert_array_equal(second[0].ravel(), np.arange(18, 27))
    np.testing.assert_array_equal(second[1].ravel(), np.arange(9, 18))
