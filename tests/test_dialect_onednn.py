"""The oneDNN dialect against oneDNN's own published cases and PyTorch's runtime
(docs/frameworks.md#onednn).

Every problem descriptor of oneDNN's benchdnn input files ``inputs/conv/shapes_*`` and
``inputs/deconv/shapes_*`` (a verbatim copy in tests/data/onednn, see its README) is parsed and
translated in the three directions, and polyconv's own shape inference must give the sizes
oneDNN states (or benchdnn deduces where a descriptor leaves them out). The smallest
descriptors of each file also run on arrays, in several memory format tags, against
``torch.nn.functional`` (and its autograd for the backward primitives) fed by oneDNN's
definition: zeros padded ``padding_l``/``padding_r`` (a negative right pad crops), dilation
``dilates + 1``, group ``g`` owning weights ``[g, :, :]``."""

from __future__ import annotations

import dataclasses
import math
import tarfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import only_with_target

import polyconv
from polyconv.dialects import onednn

only_with_target("frameworks")

ARCHIVE = Path(__file__).parent / "data" / "onednn" / "benchdnn_shapes.tar.xz"
#: descriptors in the copy (its README says how they were counted)
DESCRIPTORS = 35514


@cache
def _published() -> tuple[tuple[str, str, tuple[onednn.Problem, ...]], ...]:
    """(file, driver, problems) for every shapes file of the copy."""
    out = []
    with tarfile.open(ARCHIVE) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if not member.isfile():
                continue
            driver = Path(member.name).parent.name
            text = tar.extractfile(member).read().decode()
            out.append((member.name, driver, tuple(onednn.parse_batch(text, driver))))
    return tuple(out)


def test_every_published_descriptor_gives_onednns_sizes():
    """oneDNN states the output sizes of all but a few hundred of them (``oh``, ``ow``...);
    benchdnn deduces the rest and every right pad (8208 of them negative)."""
    count = stated = negative = 0
    for name, _, problems in _published():
        for p in problems:
            count += 1
            stated += any(k[0] == "o" and k != "oc" for k in p.stated)
            negative += min(p.p_r) < 0
            for direction in ("FWD_B", "BWD_D", "BWD_W"):
                call = p.call(direction)
                got = polyconv.infer_shape(call.op, *call.shapes, **call.keywords).shape
                assert tuple(got) == call.output, (name, p, direction)
    assert count == DESCRIPTORS, count
    assert stated > 35000 and negative > 8000, (stated, negative)


def test_a_descriptor_as_oneDNN_reads_it():
    p = onednn.parse_descriptor('mb2_ic16oc32_ih14oh7kh3sh2dh0ph1_n"name"')
    assert (p.mb, p.ic, p.oc, p.i, p.o, p.k, p.s, p.p, p.p_r, p.d, p.name) == (
        2, 16, 32, (14, 14), (7, 7), (3, 3), (2, 2), (1, 1), (0, 0), (0, 0), "name")
    cube = onednn.parse_descriptor("g2ic4id5oc6kd3pd1", "deconv")      # d copied to h, w
    assert cube.i == (5, 5, 5) and cube.o == (5, 5, 5) and cube.wei_dims() == (2, 3, 2, 3, 3,
                                                                               3)
    assert onednn.parse_descriptor("ic2iw7oc2kw3ow9").p == (2,)       # pad from the sizes


@pytest.mark.parametrize(("text", "why"), [
    ("ic16oc32", "no spatial axis"), ("ic16ih5oc32", "'kh' was not given"),
    ("mb2ic16ih5oc32kh3xx", "unrecognized entry at 'xx'"), ("ic16ih5kh3", "'oc' was not"),
    ("ic16ih5kh7oc2", "deduced oh=-1"), ("ic4id5ih5oc4kd1kh1", "all of the h and w")])
def test_descriptor_errors(text, why):
    with pytest.raises(ValueError, match=why):
        onednn.parse_descriptor(text)


def test_directions():
    p = onednn.parse_descriptor("g2mb1ic4ih6oc8kh3ph1")
    assert p.call("FWD_B").shapes == ((1, 4, 6, 6), (8, 2, 3, 3), (8,))
    assert p.call("BWD_W").op == "convolution_backward_weights"
    with pytest.raises(ValueError, match="diff_bias"):
        p.call("BWD_WB")


# --------------------------------------------------------------------------------------------
# on arrays, against PyTorch
# --------------------------------------------------------------------------------------------


def _small() -> list[onednn.Problem]:
    """The smallest descriptors of each file (MACs at mb=1), as mb=1 problems: two of each
    convolution file, six of each deconvolution file (fewer, and larger, problems)."""
    chosen = []
    for _, driver, problems in _published():
        limit, per_file = (1e6, 2) if driver == "conv" else (2e7, 6)
        def macs(p):
            return p.oc * p.ic // p.g * math.prod(max(a, b) for a, b in zip(p.i, p.o)) * \
                math.prod(p.k)
        small = sorted((p for p in problems if macs(p) <= limit), key=macs)[:per_file]
        chosen += [dataclasses.replace(p, mb=1) for p in small]
    return chosen


def _torch_forward(torch, p: onednn.Problem, src, wei):
    """oneDNN's convolution or deconvolution by its definition, on torch's ops: ``wei`` is
    oneDNN's ``[G, OC/G, IC/G, K..]``."""
    fn = torch.nn.functional
    nd = len(p.i)
    conv = getattr(fn, f"conv{nd}d")
    dil = tuple(d + 1 for d in p.d)
    g, ocg, icg = wei.shape[:3]
    if p.driver == "conv":
        pads = [v for a in reversed(range(nd)) for v in (p.p[a], p.p_r[a])]
        return conv(fn.pad(src, pads), wei.reshape(g * ocg, icg, *p.k), stride=p.s,
                    dilation=dil, groups=g)
    w = wei.transpose(1, 2).reshape(g * icg, ocg, *p.k)
    full = getattr(fn, f"conv_transpose{nd}d")(src, w, stride=p.s, dilation=dil, groups=g)
    pads = [v for a in reversed(range(nd))
            for v in (-p.p[a], p.o[a] + p.p[a] - full.shape[2 + a])]
    return fn.pad(full, pads)       # crop padding_l, then crop or extend to the dst size


def _torch_all(torch, p: onednn.Problem, src, wei, diff_dst):
    src, wei = (torch.tensor(a, requires_grad=True) for a in (src, wei))
    grouped = wei.reshape(p.g, p.oc // p.g, p.ic // p.g, *p.k)
    dst = _torch_forward(torch, p, src, grouped)
    (dst * torch.tensor(diff_dst)).sum().backward()
    return dst.detach().numpy(), src.grad.numpy(), wei.grad.numpy()


def _to_tag(a, tag: str, logical: str):
    return np.ascontiguousarray(np.transpose(a, [logical.index(c) for c in tag]))


def _check_against_torch(torch, p: onednn.Problem, layout: str, rng) -> None:
    """The three primitives of ``p`` on arrays in ``layout`` against PyTorch."""
    nd = len(p.i)
    space = "dhw"[3 - nd:]
    data_logical = "nc" + space
    wei_logical = ("g" if p.has_groups else "") + "oi" + space
    data_tag = data_logical if layout == "plain" else "n" + space + "c"
    wei_tag = (wei_logical if layout == "plain" else     # gohwi, dhwigo: converted
               {1: "wigo", 2: "gohwi", 3: "dhwigo"}[nd] if p.has_groups else
               space + "io")                            # hwio: polyconv's XIO as it is
    src, wei = rng.standard_normal(p.src_dims()), rng.standard_normal(p.wei_dims())
    diff_dst = rng.standard_normal(p.dst_dims())
    dst, diff_src, diff_wei = _torch_all(torch, p, src, wei, diff_dst)
    kind = "convolution" if p.driver == "conv" else "deconvolution"
    attrs = {"strides": p.s, "padding_l": p.p, "padding_r": p.p_r, "dilates": p.d,
             "src_tag": data_tag, "weights_tag": wei_tag}
    x, w, dy = (_to_tag(src, data_tag, data_logical), _to_tag(wei, wei_tag, wei_logical),
                _to_tag(diff_dst, data_tag, data_logical))
    got = getattr(onednn, f"{kind}_forward")(x, w, dst_dims=p.dst_dims(), **attrs)
    got_dx = getattr(onednn, f"{kind}_backward_data")(dy, w, diff_src_dims=p.src_dims(),
                                                      **attrs)
    got_dw = getattr(onednn, f"{kind}_backward_weights")(x, dy, diff_weights_dims=p.wei_dims(),
                                                         **attrs)
    for what, a, b, logical in (("dst", got, dst, data_logical),
                                ("diff_src", got_dx, diff_src, data_logical),
                                ("diff_weights", got_dw, diff_wei, wei_logical)):
        want = _to_tag(b, wei_tag if what == "diff_weights" else data_tag, logical)
        assert a.shape == want.shape, (what, p)
        np.testing.assert_allclose(a, want, rtol=1e-10, atol=1e-10, err_msg=f"{what} {p}")


@pytest.mark.parametrize("layout", ["plain", "channels-last"])
def test_published_descriptors_on_arrays_against_torch(layout):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    problems = _small()
    for p in problems:
        _check_against_torch(torch, p, layout, rng)
    assert len(problems) > 150, len(problems)


@pytest.mark.parametrize(("driver", "text"), [
    ("deconv", "g2mb1ic4ih5oc6oh11kh3sh2ph1"),          # a right pad of -1: output padding
    ("deconv", "mb1ic3iw7oc2ow16kw2sw2dw1pw0"),
    ("deconv", "g2mb1ic4id3ih4iw5oc4od6oh8ow10kd2kh2kw2sd2sh2sw2pw1"),
    ("conv", "mb1ic2ih11oc2oh3kh2sh4ph0"),              # the last src position unread
    ("conv", "g3mb1ic6iw11oc3ow4kw3sw2dw1pw1"),
])
@pytest.mark.parametrize("layout", ["plain", "channels-last"])
def test_negative_right_pads_on_arrays_against_torch(driver, text, layout):
    torch = pytest.importorskip("torch")
    p = onednn.parse_descriptor(text, driver)
    assert min(p.p_r) < 0, p
    _check_against_torch(torch, p, layout, np.random.default_rng(2))


# --------------------------------------------------------------------------------------------
# conventions that have no polyconv equivalent, and oneDNN's own refusals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "why"), [
    ({"src_tag": "nChw16c"}, "blocked layout"),
    ({"src_tag": "any"}, "lets oneDNN choose"),
    ({"src_tag": "nchw", "dst_tag": "nhwc"}, "differ"),
    ({"src_tag": "chwn"}, "no polyconv data format"),
    ({"weights_tag": "ohiw"}, "reorders the spatial axes"),
    ({"src_tag": "ncw"}, "does not name the 4 axes"),
    ({"padding_r": -2, "strides": 2}, r"padding_r \+ stride > 0"),
    ({"dilates": -1}, "dilate >= 0"),
])
def test_refusals(kw, why):
    with pytest.raises(ValueError, match=why):
        onednn.keywords("convolution_forward", (1, 4, 9, 9), (8, 4, 3, 3), **kw)


def test_a_right_pad_that_drops_a_whole_stride_is_refused():
    """oneDNN accepts ``padding_r=-3`` with stride 4 (``-3 + 4 > 0``), yet then reads 5 fewer
    src positions than the end, more than a stride: polyconv's output would be longer."""
    with pytest.raises(ValueError, match=r"leaves 5 position\(s\) of the src"):
        onednn.keywords("convolution_forward", (1, 1, 10), (1, 1, 1), strides=4,
                        padding_r=-3)
    with pytest.raises(ValueError, match="dst"):      # a deconvolution's twin
        onednn.keywords("deconvolution_forward", (1, 1, 2), (1, 1, 1), (1, 1, 10),
                        strides=4, padding_r=-3)


def test_sizes_rule_mismatch_names_the_rule():
    with pytest.raises(ValueError, match=r"\(src - ek \+ padding_l \+ padding_r\) / stride"):
        onednn.keywords("convolution_forward", (1, 4, 9, 9), (8, 4, 3, 3), (1, 8, 8, 8))


def test_convert_weights_knows_onednns_layouts():
    """``goihw`` is ``[G, OC/G, IC/G, K..]`` for a deconvolution too (benchdnn's
    ``transpose_data_wei`` reads it so), against torch's ``ConvTranspose`` weights."""
    w = np.arange(2 * 3 * 4 * 2.0).reshape(2, 3, 4, 2)            # [G, OC/G, IC/G, K]
    torch_w = polyconv.convert_weights(w, "onednn-group", "torch", family="deconvolution")
    assert torch_w.shape == (8, 3, 2)                               # [IC, OC/G, K]
    assert torch_w[4 + 1, 2, 1] == w[1, 2, 1, 1]
    back = polyconv.convert_weights(torch_w, "torch", "onednn-group", family="deconvolution",
                                    groups=2)
    np.testing.assert_array_equal(back, w)
