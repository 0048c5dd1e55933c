"""Reliability promises beyond the values of one call (docs/semantics.md#validation,
docs/numerics.md): inputs polyconv cannot take are refused by name, concurrent calls cannot
see each other's settings, and non-finite and subnormal values behave as documented per
backend.
"""

from __future__ import annotations

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
