"""Reliability promises beyond the values of one call (docs/semantics.md#validation,
docs/numerics.md): inputs polyconv cannot take are refused by name, concurrent calls cannot
see each other's settings, and non-finite and subnormal values behave as documented per
backend.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
from cases import build_case
from oracle import EPS, assert_within_bound

import polyconv
from polyconv._backends import get_backend
from polyconv._choice import _CHOOSERS

# --------------------------------------------------------------------------------------------
# sparse tensors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("which", "layout"), [("src", "sparse_coo"), ("weights", "sparse_coo"),
                                               ("weights", "sparse_csr")])
def test_sparse_tensor_is_a_type_error_naming_it(target, which, layout):
    if target.array_library != "torch" or target.default_device is not None:
        pytest.skip("sparse tensors are torch's (on its CPU here)")
    import torch

    backend = target.backend
    x, w = torch.ones(1, 5, 5, 2), torch.ones(3, 3, 2, 4)
    polyconv.convolution(x, w, backend=backend)       # the dense call first: a cached dispatch
    sparse = {"sparse_coo": torch.Tensor.to_sparse, "sparse_csr": torch.Tensor.to_sparse_csr}
    args = {"src": x, "weights": w}
    if layout == "sparse_csr":
        args = {"src": torch.ones(1, 5, 2), "weights": torch.ones(3, 2, 4)}
        polyconv.convolution(*args.values(), backend=backend)
    args[which] = sparse[layout](args[which])
    with pytest.raises(TypeError, match=rf"convolution: {which} must be a dense array; got a "
                                        rf"torch\.{layout} Tensor: pass {which}\.to_dense\(\)"):
        polyconv.convolution(*args.values(), backend=backend)


# --------------------------------------------------------------------------------------------
# torch's process-wide float32 precision, under threads
# --------------------------------------------------------------------------------------------

@pytest.fixture
def torch_probe(request, monkeypatch):
    """``(seen, knob)``: every 2-D and 3-D torch convolution records the oneDNN float32
    precision it starts and ends under, ``seen[rank]``; the user has set ``"bf16"``."""
    if request.getfixturevalue("target").name != "torch":
        pytest.skip("the torch backend's own setting, on its CPU target")
    import torch
    from polyconv_torch import _lowering

    knob = torch.backends.mkldnn.conv
    if not hasattr(knob, "fp32_precision"):
        pytest.skip("torch < 2.9 has no oneDNN float32 precision setting")
    seen: dict[int, list[str]] = {2: [], 3: []}

    def probe(rank, real):
        def conv(*args, **kwargs):
            seen[rank].append(knob.fp32_precision)
            time.sleep(0.0005)              # a window for another call's exit to land in
            out = real(*args, **kwargs)
            seen[rank].append(knob.fp32_precision)
            return out
        return conv

    for rank in (2, 3):
        monkeypatch.setitem(_lowering._CONV, rank, probe(rank, _lowering._CONV[rank]))
    before = knob.fp32_precision
    _forget(_lowering)              # what holds the real convolution: made afresh
    knob.fp32_precision = "bf16"
    try:
        yield seen, knob
    finally:
        knob.fp32_precision = before
        _forget(_lowering)


def _forget(lowering) -> None:
    """Drop every torch lowering and kernel made so far, and the calls that hold them."""
    from polyconv import _dispatch

    lowering._lower_cached.cache_clear()
    lowering._kernel_cached.cache_clear()
    _dispatch._DISPATCH.clear()


def _in_threads(work, threads: int = 8) -> None:
    barrier = threading.Barrier(threads)
    errors = []

    def run(i):
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors


def test_torch_precision_override_holds_for_every_concurrent_call(target, torch_probe):
    """With the user's process-wide ``"bf16"``, every float32 call runs in IEEE float32 from
    start to end, whatever other threads' calls enter and leave meanwhile; those that ask for
    torch's own setting (``precision="default"``) run under the user's ``"bf16"``; the
    user's setting is back afterwards."""
    import torch

    seen, knob = torch_probe
    x2, w2 = torch.randn(1, 6, 6, 3), torch.randn(3, 3, 3, 4)
    x3, w3 = torch.randn(1, 4, 4, 4, 3), torch.randn(3, 3, 3, 3, 4)

    def work(i):
        for _ in range(20):
            if i % 4 == 3:
                polyconv.convolution(x3, w3, precision="default")
            else:
                polyconv.convolution(x2, w2)

    _in_threads(work)
    assert len(seen[2]) == 2 * 6 * 20 and set(seen[2]) == {"ieee"}
    assert len(seen[3]) == 2 * 2 * 20 and set(seen[3]) == {"bf16"}
    assert knob.fp32_precision == "bf16"


# --------------------------------------------------------------------------------------------
# non-finite weights (docs/numerics.md#nan-and-inf)
# --------------------------------------------------------------------------------------------

#: a busy call of each op (see cases.build_case): strided, grouped, asymmetric pads
ROW = {"rank": 2, "kernel": 3, "strides": "mixed", "dilations": 1, "pads": "asym",
       "auto_pad": "none", "groups": "some", "data_format": "NXC", "weights_format": "default",
       "dtype": "float32", "spelling": "keyword", "bias": True, "output_padding": "max",
       "dst": None, "wshape": "full"}

#: the inputs whose non-finite values also meet a lowering's zeros: the weights, and the small
#: tensor of the weight gradients
WEIGHT_LIKE = [("convolution", 1), ("convolution_backward_data", 1), ("conv_transpose", 1),
               ("conv_transpose_backward_data", 1), ("convolution_backward_weights", 1),
               ("conv_transpose_backward_weights", 0)]

#: the backends whose every implementation keeps a non-finite weight to the outputs that read it
EXACT_LOCALITY = {"numpy"}


def _implementations(backend: str, primitive: str) -> list[str | None]:
    """``None`` (the default pick) and every implementation the backend's chooser names."""
    get_backend(backend)
    chooser = _CHOOSERS.get(backend)
    return [None, *(chooser.names(primitive) if chooser is not None else ())]


def _readers(call, arrays, which: int, index) -> np.ndarray:
    """The output elements whose sum reads ``arrays[which][index]``: the oracle on an
    indicator there and all-positive other inputs (no cancellation)."""
    probe = [np.abs(a).astype(np.float64) + 1 for a in arrays]
    probe[which] = np.zeros(arrays[which].shape)
    probe[which][index] = 1
    if len(probe) == 3:
        probe[2] = np.zeros(arrays[2].shape)             # the bias reads nothing
    return call.expected(probe).y != 0


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("pads", ["asym", "none"])
@pytest.mark.parametrize(("fn", "which"), WEIGHT_LIKE)
def test_nonfinite_weights_reach_what_the_docs_promise(target, fn, which, pads):
    """On every implementation, forced or chosen: the outputs that read a non-finite weight
    are non-finite; numpy's other outputs are finite; elsewhere a weight's non-finite value
    stays in its output channel (docs/numerics.md#nan-and-inf)."""
    call = build_case(fn, {**ROW, "pads": pads}, seed=4)
    arrays = call.arrays()
    plan = polyconv.infer_shape(fn, *(a.shape for a in arrays), **call.attrs)
    axis = plan.weights_perm[0] if plan.primitive == "backward_weights" else plan.channel_axis
    others = tuple(i for i in range(len(plan.shape)) if i != axis)
    for index in (tuple(s // 2 for s in arrays[which].shape), (0,) * arrays[which].ndim):
        hit = _readers(call, arrays, which, index)
        channel = np.broadcast_to(hit.any(axis=others, keepdims=True), hit.shape)
        for value in (np.nan, np.inf):
            poisoned = [a.copy() for a in arrays]
            poisoned[which][index] = value
            for name in _implementations(target.backend, plan.primitive):
                forcing = (contextlib.nullcontext() if name is None else
                           polyconv.implementation(f"{target.backend}:{plan.primitive}={name}"))
                with forcing:
                    y = target.to_numpy(getattr(polyconv, fn)(
                        *(target.asarray(a) for a in poisoned), backend=target.backend,
                        **call.attrs))
                bad, where = ~np.isfinite(y), f"{name or 'default'}, {value} at {index}"
                assert bad[hit].all(), f"{where}: a non-finite value was lost"
                if target.backend in EXACT_LOCALITY:
                    np.testing.assert_array_equal(bad, hit, err_msg=where)
                elif plan.primitive != "backward_weights":   # there: any weight
                    assert not (bad & ~channel).any(), f"{where}: left its output channel"


# --------------------------------------------------------------------------------------------
# subnormal numbers (docs/numerics.md#subnormals)
# --------------------------------------------------------------------------------------------

def _flushes_subnormals(target) -> bool:
    """Whether the target's arrays run in XLA, which flushes subnormals to zero."""
    return target.array_library == "jax"


@pytest.mark.parametrize("fn", ["convolution", "conv_transpose", "convolution_backward_weights",
                                "conv_transpose_backward_data"])
def test_subnormals_as_documented(target, fn):
    """Subnormal float32 data, normal products: XLA flushes the data to zero and then meets
    the bound on the flushed inputs plus ``2*n*tiny``; every other target meets the bound on
    the inputs as they are."""
    call = build_case(fn, {**ROW, "bias": False}, seed=5)
    arrays = call.arrays()
    # subnormal: the first batch element and the first channel (NXC), so that some outputs
    # read only subnormal data; normal elsewhere
    sub = np.zeros(arrays[0].shape, bool)
    sub[0], sub[..., 0] = True, True
    arrays[0] = (arrays[0] * np.where(sub, 2.0**-130, 2.0**-100)).astype(np.float32)
    arrays[1] = (arrays[1] * 2.0**20).astype(np.float32)      # products normal
    tiny = float(np.finfo(np.float32).tiny)
    assert (np.abs(arrays[0]) < tiny).any() and (arrays[0] != 0).all()
    y = target.to_numpy(getattr(polyconv, fn)(*(target.asarray(a) for a in arrays),
                                              backend=target.backend, **call.attrs))
    ref = call.expected(arrays)
    if not _flushes_subnormals(target):
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")
        return
    with pytest.raises(AssertionError, match="outside the error bound"):
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")   # it does flush
    flushed = [np.where(np.abs(a) < tiny, np.float32(0), a) for a in arrays]
    fref = call.expected(flushed)
    bound = (EPS["float32"] * np.abs(fref.y) + fref.n * EPS["float32"] * fref.abs_sum
             + 2 * fref.n * tiny)
    assert (np.abs(y - fref.y) <= bound).all()
