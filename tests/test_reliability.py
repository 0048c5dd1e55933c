"""Reliability promises beyond the values of one call (docs/semantics.md#validation,
docs/numerics.md): inputs polyconv cannot take are refused by name, concurrent calls cannot
see each other's settings, and non-finite and subnormal values behave as documented per
backend.
"""

from __future__ import annotations

import threading
import time

import pytest

import polyconv

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
    _lowering._lower_cached.cache_clear()       # lowerings hold their convolution
    knob.fp32_precision = "bf16"
    try:
        yield seen, knob
    finally:
        knob.fp32_precision = before
        _lowering._lower_cached.cache_clear()


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
