"""A catalogue of calls that the contract refuses (docs/semantics.md#validation), with the
exception type and what the message
must say (the op, the argument, the offending values).

Every entry starts from one valid 2-D call of its op (NXC, default weights format, stride 1,
kernel 3) and changes one thing. ``test_errors`` runs them on every target; ``test_infer_shape``
checks that :func:`polyconv.infer_shape` raises exactly the same for the shape-only ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from oracle import ALIAS_OPS, MAIN_OPS

TRANSPOSED_DIRECTION = ("convolution_backward_data", "conv_transpose",
                        "conv_transpose_backward_data", "conv_transpose_backward_weights")
WITH_WEIGHTS = ("convolution", "convolution_backward_data", "conv_transpose",
                "conv_transpose_backward_data")
BACKWARD_WEIGHTS = ("convolution_backward_weights", "conv_transpose_backward_weights")

# Valid base calls. Convolution family: IC=3, OC=4, weights XIO [3, 3, 3, 4].
# ConvTranspose family: IC=4, OC=5, weights XOI [3, 3, 5, 4]. Data is NXC, X=5 <-> Y=3.
SRC = (2, 5, 5, 3)       # convolution src / convolution_backward_data diff_src
DST = (2, 3, 3, 4)       # convolution dst
T_SRC = (2, 3, 3, 4)     # conv_transpose src
T_DST = (2, 5, 5, 5)     # conv_transpose dst
W = (3, 3, 3, 4)
T_W = (3, 3, 5, 4)

# op -> (input names, input shapes, positional shape argument or None)
BASE: dict[str, tuple[tuple[str, ...], tuple[tuple[int, ...], ...], Any]] = {
    "convolution": (("src", "weights"), (SRC, W), None),
    "convolution_backward_data": (("diff_dst", "weights"), (DST, W), None),
    "convolution_backward_weights": (("src", "diff_dst"), (SRC, DST), W),
    "conv_transpose": (("src", "weights"), (T_SRC, T_W), None),
    "conv_transpose_backward_data": (("diff_dst", "weights"), (T_DST, T_W), None),
    "conv_transpose_backward_weights": (("src", "diff_dst"), (T_SRC, T_DST), T_W),
    # older-spec functions
    "convolution_backprop_data": (("diff_dst", "weights"), (DST, W), None),
    "convolution_backprop_filters": (("src", "diff_dst"), (SRC, DST), W),
    # default filter_format XIO: [K.., IC, OC/G]
    "conv_transpose_backprop_filters": (("src", "diff_dst"), (T_SRC, T_DST), (3, 3, 4, 5)),
}



@dataclass
class BadCall:
    """One refused call: inputs (arrays or other objects), keywords, what must be raised."""

    id: str
    fn: str
    inputs: list                      # numpy arrays (or non-arrays), signature order
    positional: tuple = ()            # the shape argument, when given positionally
    attrs: dict = field(default_factory=dict)
    exc: type = ValueError
    match: str = ""                   # regex searched in the message
    shape_only: bool = True           # can infer_shape see this error (no dtype/type issue)?

    def shapes(self) -> list:
        return [None if x is None else tuple(np.shape(x)) for x in self.inputs]


def _bad(fn: str, id_: str, exc: type, match: str, *, replace: dict | None = None,
         positional: Any = "base", shape_only: bool = True, dtype: str = "float32",
         **attrs) -> BadCall:
    names, shapes, base_pos = BASE[fn]
    inputs: list[Any] = [np.zeros(s, dtype) for s in shapes]
    for name, value in (replace or {}).items():
        if name == "bias":
            inputs.append(value)
        else:
            inputs[names.index(name)] = value
    if positional == "base":
        positional = () if base_pos is None else (base_pos,)
    elif positional is None:
        positional = ()
    else:
        positional = (positional,)
    return BadCall(id=f"{fn}-{id_}", fn=fn, inputs=inputs, positional=positional,
                   attrs=attrs, exc=exc, match=_pattern(fn, match), shape_only=shape_only)


def _pattern(fn: str, match: str) -> str:
    """``"^{op}: A.*B.*C"`` -> a regex requiring the prefix ``fn: `` (or ``fn()``, Python's
    own keyword errors) and each of A, B, C anywhere in the message, in any order, so that
    the tests pin what a message says (op, argument, rule, values), not its word order."""
    body = match.removeprefix("^").replace("{op}", re.escape(fn))
    head, sep, rest = body.partition(": ")
    if not sep:
        head, rest = body, ""
    parts = [p for p in rest.split(".*") if p]
    return "^" + head + (": " if sep else "") + "".join(f"(?=.*?{p})" for p in parts)


def t(shape) -> str:
    """A shape as it appears in a message, escaped for a regex: ``\\(3, 3\\)``."""
    return re.escape(repr(tuple(shape)))


def _every_op() -> list[BadCall]:
    calls = []
    for fn in MAIN_OPS:
        names, shapes, _ = BASE[fn]
        first = names[0]
        calls += [
            _bad(fn, "strides-length", ValueError,
                 r"^{op}: strides .*one entry per spatial axis.*2.*strides=\(1, 1, 1\)",
                 strides=(1, 1, 1)),
            _bad(fn, "dilations-length", ValueError,
                 r"^{op}: dilations .*spatial axis.*dilations=\(1,\)", dilations=[1]),
            _bad(fn, "pads-length", ValueError,
                 r"^{op}: pads_end .*spatial axis.*pads_end=\(0, 0, 0\)", pads_end=(0, 0, 0)),
            _bad(fn, "strides-zero", ValueError,
                 r"^{op}: strides must be positive.*strides=\(0, 1\)", strides=(0, 1)),
            _bad(fn, "strides-negative", ValueError,
                 r"^{op}: strides must be positive.*strides=\(-2, -2\)", strides=-2),
            _bad(fn, "dilations-zero", ValueError,
                 r"^{op}: dilations must be positive.*dilations=\(1, 0\)", dilations=(1, 0)),
            _bad(fn, "pads_begin-negative", ValueError,
                 r"^{op}: pads_begin must be non-negative.*pads_begin=\(-1, 0\)",
                 pads_begin=(-1, 0)),
            _bad(fn, "pads_end-negative", ValueError,
                 r"^{op}: pads_end must be non-negative.*pads_end=\(-1, -1\)", pads_end=-1),
            _bad(fn, "pads-negative-under-auto_pad", ValueError,
                 r"^{op}: pads_begin must be non-negative.*pads_begin=\(-1, 0\)",
                 pads_begin=(-1, 0), auto_pad="same_upper"),
            _bad(fn, "pads-length-under-auto_pad", ValueError,
                 r"^{op}: pads_end .*spatial axis.*pads_end=\(1, 1, 1\)",
                 pads_end=(1, 1, 1), auto_pad="valid"),
            # empty pads are oneDNN's spelling of "auto_pad computes them": not without it
            _bad(fn, "pads-empty-without-auto_pad", ValueError,
                 r"^{op}: pads_begin .*one entry per spatial axis.*pads_begin=\(\).*"
                 r"empty pads are accepted only where auto_pad computes them",
                 pads_begin=[], pads_end=[]),
            _bad(fn, "strides-float", TypeError, r"^{op}: strides.*integer.*1\.5",
                 strides=(1.5, 1)),
            _bad(fn, "groups-string", TypeError, r"^{op}: groups.*integer.*'2'", groups="2"),
            _bad(fn, "groups-zero", ValueError,
                 r"^{op}: groups must be a positive integer.*groups=0", groups=0),
            _bad(fn, "groups-not-dividing", ValueError,
                 r"^{op}: groups must divide both channel counts.*groups=3.*[45]", groups=3),
            _bad(fn, "auto_pad-unknown", ValueError,
                 r"^{op}: unknown auto_pad 'same'.*'none', 'same_upper', 'same_lower', 'valid'",
                 auto_pad="same"),
            _bad(fn, "data_format-unknown", ValueError,
                 r"^{op}: unknown data_format 'NHCW'.*'NXC', 'NCX'.*NHWC.*NCHW.*NCDHW",
                 data_format="NHCW"),
            _bad(fn, "weights_format-unknown", ValueError,
                 r"^{op}: unknown weights_format 'OHWI'.*'XIO', 'OIX', 'IOX', 'XOI'.*"
                 r"HWIO.*OIHW.*IOHW.*HWOI", weights_format="OHWI"),
            # a common spelling names the spatial axes: as many as the data has
            _bad(fn, "data_format-spelt-for-3d", ValueError,
                 r"^{op}: data_format='NDHWC' is 'NXC' with 3 spatial axes named.*"
                 rf"{first} has 2.*{first}\.shape=.*pass data_format='NHWC'.*"
                 r"data_format='NXC', which fits any number", data_format="NDHWC"),
            _bad(fn, "weights_format-spelt-for-1d", ValueError,
                 r"^{op}: weights_format='oiw' is 'OIX' with 1 spatial axis named.*"
                 rf"{first} has 2.*pass weights_format='OIHW'.*weights_format='OIX'",
                 weights_format="oiw"),
            _bad(fn, "data-rank-too-small", ValueError,
                 rf"^{{op}}: {first} must have rank >= 3.*{first}\.shape=\(2, 3\).*"
                 rf"if {first} lacks its batch axis, add one.*\[N, X\.\., C\]",
                 replace={first: np.zeros((2, 3), "float32")}),
            # dtypes: TypeError naming the dtypes
            _bad(fn, "int-input", TypeError,
                 rf"^{{op}}: inputs must be floating point.*{first}\.dtype=int32",
                 replace={first: np.zeros(shapes[0], "int32")}, shape_only=False),
            _bad(fn, "bool-input", TypeError,
                 rf"^{{op}}: inputs must be floating point.*{names[1]}\.dtype=bool",
                 replace={names[1]: np.zeros(shapes[1], bool)}, shape_only=False),
            _bad(fn, "complex-input", TypeError,
                 rf"^{{op}}: inputs must be floating point.*{first}\.dtype=complex64",
                 replace={first: np.zeros(shapes[0], "complex64")}, shape_only=False),
            _bad(fn, "mixed-dtypes", TypeError,
                 rf"^{{op}}: all inputs must share one floating dtype.*{first}\.dtype=float32"
                 rf".*{names[1]}\.dtype=float64",
                 replace={names[1]: np.zeros(shapes[1], "float64")}, shape_only=False),
            _bad(fn, "list-input", TypeError, rf"^{{op}}: {first} must be an array.*list",
                 replace={first: np.zeros(shapes[0]).tolist()}, shape_only=False),
        ]
    return calls


def _weights_and_channels() -> list[BadCall]:
    w_bad_rank = np.zeros((3, 3, 4), "float32")
    calls = [
        _bad(fn, "weights-rank", ValueError, r"^{op}: weights must have rank 4.*"
             r"weights\.shape=\(3, 3, 4\)", replace={"weights": w_bad_rank})
        for fn in WITH_WEIGHTS
    ]
    calls += [
        _bad(fn, "diff_dst-rank", ValueError,
             r"^{op}: diff_dst must have the same rank as src.*diff_dst\.shape=\(2, 3, 4\)",
             replace={"diff_dst": np.zeros((2, 3, 4), "float32")})
        for fn in BACKWARD_WEIGHTS
    ]
    calls += [
        # src IC=3 but XIO weights say IC/G=2
        _bad("convolution", "weights-IC", ValueError,
             r"^{op}: does not match the data channels.*\b3\b.*"
             r"weights\.shape=\(3, 3, 2, 4\)",
             replace={"weights": np.zeros((3, 3, 2, 4), "float32")}),
        # diff_dst OC=4 but XIO weights say OC=5
        _bad("convolution_backward_data", "weights-OC", ValueError,
             r"^{op}: does not match the data channels.*\b4\b.*"
             r"weights\.shape=\(3, 3, 3, 5\)",
             replace={"weights": np.zeros((3, 3, 3, 5), "float32")}),
        # src IC=4 but XOI weights say IC=3
        _bad("conv_transpose", "weights-IC", ValueError,
             r"^{op}: does not match the data channels.*\b4\b.*"
             r"weights\.shape=\(3, 3, 5, 3\)",
             replace={"weights": np.zeros((3, 3, 5, 3), "float32")}),
        # diff_dst OC=5 but XOI weights say OC/G=6
        _bad("conv_transpose_backward_data", "weights-OC", ValueError,
             r"^{op}: does not match the data channels.*\b5\b.*"
             r"weights\.shape=\(3, 3, 6, 4\)",
             replace={"weights": np.zeros((3, 3, 6, 4), "float32")}),
        # checked on every backend, though only JAX has precision modes
        _bad("convolution", "precision-unknown", ValueError,
             r"^{op}: precision must be.*'highest'.*precision='fast'", precision="fast",
             shape_only=False),
        _bad("conv_transpose_backward_weights", "precision-triple", ValueError,
             r"^{op}: precision must be.*pair.*precision=\('high', 'high', 'high'\)",
             precision=("high",) * 3, shape_only=False),
        _bad("convolution", "weights-zero-OC", ValueError,
             r"^{op}: weights\.shape=\(3, 3, 3, 0\).*at least one channel",
             replace={"weights": np.zeros((3, 3, 3, 0), "float32")}),
        _bad("conv_transpose", "weights-zero-OC", ValueError,
             r"^{op}: weights\.shape=\(3, 3, 0, 4\).*at least one channel",
             replace={"weights": np.zeros((3, 3, 0, 4), "float32")}),
        _bad("conv_transpose_backward_weights", "weights_shape-zero-OC", ValueError,
             r"^{op}: weights_shape=\(3, 3, 0, 4\).*at least one channel",
             positional=(3, 3, 0, 4)),
        _bad("convolution_backward_weights", "weights_shape-channels", ValueError,
             r"^{op}: does not match the data channels.*"
             r"weights_shape=\(3, 3, 2, 4\)", positional=(3, 3, 2, 4)),
        _bad("conv_transpose_backward_weights", "weights_shape-channels", ValueError,
             r"^{op}: does not match the data channels.*"
             r"weights_shape=\(3, 3, 5, 3\)", positional=(3, 3, 5, 3)),
    ]
    for fn in BACKWARD_WEIGHTS:
        calls += [
            _bad(fn, "weights_shape-zero-kernel", ValueError,
                 r"^{op}: kernel.*positive.*\(0, 3\)", positional=(0, 3)),
            _bad(fn, "weights_shape-length", ValueError,
                 r"^{op}: weights_shape must be the full weights shape.*"
                 r"weights_shape=\(3, 3, 3\)", positional=(3, 3, 3)),
            # kernel 2 would make diff_dst 4x4 (conv) or diff_src ... not 3x3
            _bad(fn, "weights_shape-kernel-vs-diff_dst", ValueError,
                 r"^{op}: .*spatial sizes \(\d, \d\) do not match.*kernel=\(2, 2\)",
                 positional=(2, 2)),
            _bad(fn, "weights_shape-missing", TypeError, r"^{op}: weights_shape is required",
                 positional=None),
            _bad(fn, "batch-mismatch", ValueError,
                 r"^{op}: (src and diff_dst|diff_dst and src) must have the same batch "
                 r"size.*\(3, ",
                 replace={"diff_dst": np.zeros((3, *BASE[fn][1][1][1:]), "float32")}),
        ]
    return calls


def _layouts() -> list[BadCall]:
    """The PyTorch user's first call: NCX data and PyTorch weights with the defaults (NXC and
    XIO/XOI). The message says how the data was read and which formats the shapes fit."""
    def z(*shape):
        return np.zeros(shape, "float32")

    read = r"read as NXC.*channels last, the default.*"
    return [
        # torch ConvTranspose2d(4, 3, 3): x [1, 4, 6, 6], weight [4, 3, 3, 3] (IOX)
        _bad("conv_transpose", "pytorch-layouts", ValueError,
             r"^{op}: weights\.shape=\(4, 3, 3, 3\) does not match the data channels.*"
             r"IC=6.*" + read + r"src\.shape\[3\]=6.*"
             r"fit data_format='NCX', weights_format='IOX'.*PyTorch",
             replace={"src": z(1, 4, 6, 6), "weights": z(4, 3, 3, 3)}),
        # torch Conv2d(3, 16, 3): x [2, 3, 8, 8], weight [16, 3, 3, 3] (OIX)
        _bad("convolution", "pytorch-layouts", ValueError,
             r"^{op}: does not match the data channels.*" + read + r"src\.shape\[3\]=8.*"
             r"fit data_format='NCX', weights_format='OIX'.*pass data_format='NCX' and "
             r"weights_format='OIX'",
             replace={"src": z(2, 3, 8, 8), "weights": z(16, 3, 3, 3)}),
        # torch depthwise Conv2d(8, 8, 3, groups=8): the groups check sees the wrong channels
        _bad("convolution", "pytorch-depthwise", ValueError,
             r"^{op}: groups must divide both channel counts.*groups=8.*" + read +
             r"fit data_format='NCX', weights_format='OIX'",
             replace={"src": z(1, 8, 10, 10), "weights": z(8, 1, 3, 3)}, groups=8),
        _bad("convolution_backward_weights", "pytorch-layouts", ValueError,
             r"^{op}: weights_shape=\(16, 3, 3, 3\) does not match the data channels.*"
             + read + r"src\.shape\[3\]=8, diff_dst\.shape\[3\]=6.*"
             r"fit data_format='NCX', weights_format='OIX'",
             replace={"src": z(2, 3, 8, 8), "diff_dst": z(2, 16, 6, 6)},
             positional=(16, 3, 3, 3)),
        # NXC data and PyTorch (OIX) convolution weights: only the weights format is off
        _bad("convolution", "weights-format-only", ValueError,
             r"^{op}: does not match the data channels.*" + read +
             r"fit weights_format='OIX'.*pass weights_format='OIX'",
             replace={"weights": z(4, 3, 2, 2)}),
        # channels-first data declared, channels-last data given
        _bad("conv_transpose_backward_data", "data-format-only", ValueError,
             r"^{op}: does not match the data channels.*read as NCX.*channels first.*"
             r"diff_dst\.shape\[1\]=6.*fit data_format='NXC'",
             replace={"diff_dst": z(2, 6, 6, 5)}, data_format="NCX"),
        # data without its batch axis: the weights look one rank too many
        _bad("convolution", "data-without-batch", ValueError,
             r"^{op}: weights must have rank 3.*weights\.shape=\(3, 3, 3, 4\).*"
             r"src lacks its batch axis, add one \(src\[None\]\).*"
             r"must be \[N, X\.\., C\] \(NXC\)",
             replace={"src": z(5, 5, 3)}),
        _bad("conv_transpose", "data-without-batch-NCX", ValueError,
             r"^{op}: weights must have rank 3.*src lacks its batch axis.*"
             r"must be \[N, C, X\.\.\] \(NCX\)",
             replace={"src": z(4, 3, 3), "weights": z(4, 5, 3, 3)}, data_format="NCX",
             weights_format="IOX"),
        _bad("convolution_backward_weights", "data-without-batch", ValueError,
             r"^{op}: weights_shape must be the full weights shape.*"
             r"weights_shape=\(3, 3, 3, 4\).*src lacks its batch axis",
             replace={"src": z(5, 5, 3), "diff_dst": z(3, 3, 4)}),
    ]


def _bias() -> list[BadCall]:
    return [
        _bad("convolution", "bias-shape", ValueError,
             r"^{op}: bias must have shape \(OC,\) = \(4,\).*bias\.shape=\(5,\)",
             replace={"bias": np.zeros(5, "float32")}),
        _bad("convolution", "bias-rank", ValueError,
             r"^{op}: bias must have shape \(OC,\) = \(4,\).*bias\.shape=\(1, 4\)",
             replace={"bias": np.zeros((1, 4), "float32")}),
        _bad("conv_transpose", "bias-shape", ValueError,
             r"^{op}: bias must have shape \(OC,\) = \(5,\).*bias\.shape=\(4,\)",
             replace={"bias": np.zeros(4, "float32")}),
        _bad("convolution", "bias-dtype", TypeError,
             r"^{op}: all inputs must share one floating dtype.*bias\.dtype=float16",
             replace={"bias": np.zeros(4, "float16")}, shape_only=False),
    ]


def _output_padding() -> list[BadCall]:
    calls = []
    for fn in TRANSPOSED_DIRECTION:
        calls += [
            _bad(fn, "output_padding-ge-stride", ValueError,
                 r"^{op}: output_padding must be in \[0, stride\).*"
                 r"output_padding=\(2, 0\).*strides=\(2, 2\)",
                 strides=2, output_padding=(2, 0)),
            _bad(fn, "output_padding-stride-1", ValueError,
                 r"^{op}: output_padding must be in \[0, stride\).*"
                 r"output_padding=\(1, 1\).*strides=\(1, 1\)", output_padding=1),
            _bad(fn, "output_padding-negative", ValueError,
                 r"^{op}: output_padding must be non-negative.*output_padding=\(0, -1\)",
                 strides=2, output_padding=(0, -1)),
        ]
    # The ConvTranspose backward ops: a non-zero output_padding must be the implied one.
    # diff_dst 5x5 with stride 2, k3: 2*(3-1) + 3 = 7 ... use diff_dst 6x6: implies (1, 1).
    for fn in ("conv_transpose_backward_data", "conv_transpose_backward_weights"):
        dd = np.zeros((2, 6, 6, 5), "float32")
        src_small = {"conv_transpose_backward_weights": {"src": np.zeros((2, 2, 2, 4),
                                                                         "float32")}}
        replace = {"diff_dst": dd, **src_small.get(fn, {})}
        calls.append(_bad(fn, "output_padding-contradicts", ValueError,
                          r"^{op}: output_padding=\(1, 0\) contradicts.*\(6, 6\).*"
                          r"output_padding=\(1, 1\)",
                          replace=replace, strides=2, output_padding=(1, 0)))
    # Not accepted by the forward-rule ops (they have no such attribute), whatever its value;
    # the message says where it belongs (docs/semantics.md says the same).
    for fn in ("convolution", "convolution_backward_weights", "convolution_backprop_filters"):
        for value in (1, 0):
            calls.append(_bad(fn, f"output_padding-{value}-not-accepted", TypeError,
                              r"{op}\(\) got an unexpected keyword argument 'output_padding'"
                              r".*belongs to the transposed direction.*conv_transpose.*"
                              r"{op} has no output_padding attribute, whatever its value",
                              output_padding=value))
    return calls


def _other_spellings() -> list[BadCall]:
    """PyTorch's, Keras's, JAX's and ONNX's keywords: the message names polyconv's."""
    kw = r"{op}\(\) got an unexpected keyword argument "
    calls = []
    for fn in (*MAIN_OPS, *ALIAS_OPS):
        calls += [
            _bad(fn, "stride", TypeError, kw + r"'stride'; did you mean strides=\?", stride=2),
            _bad(fn, "dilation", TypeError, kw + r"'dilation'; did you mean dilations=\?",
                 dilation=2),
            _bad(fn, "padding-int", TypeError,
                 kw + r"'padding'; did you mean pads_begin=1, pads_end=1\?.*pads_begin=.*"
                 r"pads_end=.*auto_pad=", padding=1),
            _bad(fn, "padding-same", TypeError,
                 kw + r"'padding'; did you mean auto_pad='same_upper'\?.*"
                 r"odd pad element at the end", padding="same"),
        ]
    calls += [
        _bad("convolution", "padding-per-axis", TypeError,
             kw + r"'padding'; did you mean pads_begin=\(1, 2\), pads_end=\(1, 2\)\?",
             padding=(1, 2)),
        _bad("convolution", "padding-lax-pairs", TypeError,
             kw + r"'padding'; did you mean pads_begin=\(1, 0\), pads_end=\(2, 1\)\?",
             padding=[(1, 2), (0, 1)]),
        _bad("convolution", "pads-onnx", TypeError,
             kw + r"'pads'; did you mean pads_begin=\(1, 0\), pads_end=\(2, 1\)\?",
             pads=[1, 0, 2, 1]),
        _bad("conv_transpose", "padding-valid", TypeError,
             kw + r"'padding'; did you mean auto_pad='valid'\?", padding="valid"),
        _bad("convolution", "padding-unknown", TypeError,
             kw + r"'padding'; polyconv has no padding=.*pads_begin=.*pads_end=.*auto_pad=",
             padding="full"),
        _bad("conv_transpose", "output_size", TypeError,
             kw + r"'output_size'; did you mean dst_shape=\?", output_size=(5, 5)),
        _bad("convolution", "output_size", TypeError,
             kw + r"'output_size'.*follows from its inputs.*infer_shape", output_size=(3, 3)),
        _bad("convolution", "group", TypeError, kw + r"'group'; did you mean groups=\?",
             group=1),
        _bad("convolution", "typo", TypeError, kw + r"'stides'; did you mean strides=\?",
             stides=1),
    ]
    return calls


def _empty_and_dst_shape() -> list[BadCall]:
    tiny = np.zeros((2, 2, 2, 3), "float32")
    calls = [
        _bad("convolution", "empty-output", ValueError,
             r"^{op}: the output would be empty on spatial axis 0.*src size 2.*kernel extent 3",
             replace={"src": tiny}),
        _bad("convolution", "empty-output-dilated", ValueError,
             r"^{op}: the output would be empty on spatial axis 1.*src size 5.*extent 9",
             dilations=(1, 4)),
        _bad("convolution_backward_weights", "empty-output", ValueError,
             r"^{op}: the output would be empty on spatial axis 0.*src size 2",
             replace={"src": tiny}),
        _bad("conv_transpose_backward_data", "empty-output", ValueError,
             r"^{op}: the output would be empty on spatial axis 0.*diff_dst size 2",
             replace={"diff_dst": np.zeros((2, 2, 2, 5), "float32")}),
    ]
    for fn in ("convolution_backward_data", "conv_transpose"):
        large = "diff_src" if fn == "convolution_backward_data" else "dst"
        channels = 3 if fn == "convolution_backward_data" else 5
        calls += [
            _bad(fn, "empty-transposed", ValueError,
                 rf"^{{op}}: the {large} would be empty.*\(-1, 5\).*pads_begin=\(3, 0\)",
                 pads_begin=(3, 0), pads_end=(3, 0)),
            _bad(fn, "dst_shape-unreachable", ValueError,
                 r"^{op}: dst_shape spatial sizes \(9, 5\) cannot be reached.*\(3, 3\).*"
                 r"axis 0: 9 not in \[5, 5\]", dst_shape=(9, 5)),
            _bad(fn, "dst_shape-unreachable-strided", ValueError,
                 r"^{op}: dst_shape spatial sizes \(7, 9\) cannot be reached.*"
                 r"axis 1: 9 not in \[7, 8\]", dst_shape=(7, 9), strides=2),
            _bad(fn, "dst_shape-unreachable-same", ValueError,
                 r"^{op}: dst_shape spatial sizes \(7, 6\) cannot be reached.*same_upper.*"
                 r"axis 0: 7 not in \[5, 6\]", dst_shape=(7, 6), strides=2,
                 auto_pad="same_upper"),
            _bad(fn, "dst_shape-batch", ValueError,
                 rf"^{{op}}: dst_shape \(3, 5, 5, {channels}\).*batch 2.*got batch 3",
                 dst_shape=(3, 5, 5, channels)),
            _bad(fn, "dst_shape-channels", ValueError,
                 rf"^{{op}}: dst_shape \(2, 5, 5, 7\).*{channels} channels.*channels 7",
                 dst_shape=(2, 5, 5, 7)),
            _bad(fn, "dst_shape-zero", ValueError,
                 r"^{op}: dst_shape.*positive.*\(0, 5\)", dst_shape=(0, 5)),
            _bad(fn, "dst_shape-length", ValueError,
                 r"^{op}: dst_shape must be the full output shape.*dst_shape=\(5,\)",
                 dst_shape=(5,)),
            _bad(fn, "dst_shape-output_padding-contradicts", ValueError,
                 r"^{op}: output_padding=\(1, 1\) contradicts the dst_shape.*\(5, 5\).*"
                 r"output_padding=\(0, 0\)", dst_shape=(5, 5), strides=2,
                 output_padding=1, pads_begin=1, pads_end=1),
        ]
    return calls


def _aliases() -> list[BadCall]:
    """Older-spec names and keywords: messages name the function that was called."""
    calls = [
        _bad("convolution_backward_data", "output_shape-unreachable", ValueError,
             r"^{op}: dst_shape spatial sizes \(9, 5\) cannot be reached",
             output_shape=(9, 5)),
        _bad("convolution_backprop_data", "output_shape-unreachable", ValueError,
             r"^{op}: dst_shape spatial sizes \(9, 5\) cannot be reached",
             positional=(9, 5)),
        _bad("conv_transpose", "dst_shape-and-output_shape", TypeError,
             r"^{op}: pass either dst_shape or its alias output_shape, not both",
             dst_shape=(5, 5), output_shape=(5, 5)),
        _bad("convolution", "weights_format-and-filter_format", TypeError,
             r"^{op}: pass either weights_format or its alias filter_format, not both",
             weights_format="XIO", filter_format="XIO"),
        _bad("conv_transpose_backward_weights", "weights_shape-and-filter_shape", TypeError,
             r"^{op}: pass either weights_shape or its alias filter_shape, not both",
             positional=None, weights_shape=T_W, filter_shape=T_W),
        # ConvTransposeBackpropFilters-1 defaults to XIO [K.., IC, OC/G]: the XOI shape of
        # conv_transpose_backward_weights does not fit it.
        _bad("conv_transpose_backprop_filters", "filter_shape-XOI-under-XIO", ValueError,
             r"^{op}: does not match the data channels.*"
             r"weights_shape=\(3, 3, 5, 4\)", positional=T_W),
    ]
    for fn in ALIAS_OPS:
        calls.append(_bad(fn, "strides-zero", ValueError,
                          r"^{op}: strides must be positive.*strides=\(0, 0\)", strides=0))
        calls.append(_bad(fn, "filter_format-unknown", ValueError,
                          r"^{op}: unknown weights_format 'OHWI'.*'XIO', 'OIX', 'IOX', 'XOI'",
                          filter_format="OHWI"))
    return calls


def catalogue() -> list[BadCall]:
    return [*_every_op(), *_weights_and_channels(), *_layouts(), *_bias(), *_output_padding(),
            *_other_spellings(), *_empty_and_dst_shape(), *_aliases()]


BAD_CALLS = catalogue()
