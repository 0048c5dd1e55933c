"""polyconv's generic backend: the three primitives in the Python array API standard.

Works on the arrays of any library that ``array_api_compat.array_namespace`` knows (numpy,
JAX, PyTorch, CuPy, dask, array-api-strict, ...) and keeps each input's namespace, dtype and
device. Written only with functions of the standard: no item assignment (so JAX arrays work,
also inside ``jax.jit``), no library-specific array calls. The one library-specific line is a
precision guard for JAX (see :mod:`polyconv_array_api._lowering`).

Lowering (see ``_lowering.py``): shift-and-add over kernel taps, one strided slice and one
batched ``matmul`` over channels per tap, groups as the matmul batch axis. ``backward_data``
splits the large tensor into its ``stride`` phases (polyphase decomposition), computes each
phase as a stride-1 correlation of the once-padded small tensor, and interleaves the phases
with ``stack`` + ``reshape``. Accumulation in float32 (float64 for float64 inputs), one final
cast to the input dtype, bias added before that cast (docs/numerics.md#accumulation).

Use it with ``backend="array_api"``, or let polyconv pick it for arrays with no dedicated
backend (e.g. ``torch.Tensor``).
"""

from ._lowering import BACKEND, ArrayAPIBackend

__all__ = ["BACKEND", "ArrayAPIBackend"]
