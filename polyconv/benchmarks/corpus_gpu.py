"""The real-model corpus on a CUDA GPU: the competitors of ``polyconv bench --corpus --device gpu``.

On the GPU every call is timed until its results are ready (``block_until_ready``,
``torch.cuda.synchronize``). The competitors:

- ``polyconv-jax``, ``polyconv-jax backward ops`` and ``lax``, as on the CPU, on JAX's default
  device (the GPU when JAX's CUDA plugin is installed);
- ``torch`` and ``torch NCX``: ``torch.nn.functional`` on CUDA with channels-last and with
  contiguous (channels-first) memory, cuDNN's benchmark mode on and TF32 off, i.e. the full
  float32 arithmetic of polyconv's default; ratios take the faster of the two;
- ``torch tf32``: the same with TF32 allowed, PyTorch's default for cuDNN convolutions (10
  mantissa bits in the products: faster, and not the same arithmetic);
- ``polyconv-torch``: polyconv's PyTorch backend on CUDA tensors in the layer's own layout
  (forward; the gradient: the autograd backward pass alone, as ``torch`` times it), cuDNN's
  benchmark mode on as for ``torch``;
- ``polyconv-cupy``: polyconv's array-API backend on CuPy arrays (forward; the gradient row
  times the two backward ops).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

import polyconv

from .corpus import (
    Competitor,
    Layer,
    Waited,
    _lax,
    _polyconv_jax,
    _torch,
    on_cuda,
    polyconv_eager,
)
from .suite import torch_dtype, torch_tensor


def _polyconv_torch(layer: Layer, mode: str, arrays):
    import torch

    tdt = torch_dtype(layer)
    x, w, g = (torch_tensor(np.asarray(a, np.float32), tdt).to("cuda") for a in arrays)
    op = partial(getattr(polyconv, layer.op), **layer.attrs)
    if mode == "forward":
        def call():
            return op(x, w)
    else:
        # the backward pass alone, as for the peers (``torch``: ``convolution_backward``; JAX:
        # the vjp, whose forward XLA drops as unused): the graph is built once, outside the
        # timed call, and each call runs polyconv's autograd backward through it
        x.requires_grad_(True)
        w.requires_grad_(True)
        y = op(x, w)

        def call():
            return torch.autograd.grad(y, (x, w), g, retain_graph=True)

    return on_cuda(call)


def _polyconv_cupy(layer: Layer, mode: str, arrays):
    import cupy

    if layer.dtype not in ("float32", "float16", "float64"):
        raise TypeError(f"CuPy has no {layer.dtype}")
    call = polyconv_eager(layer, mode, [cupy.asarray(a) for a in arrays], backend=None)
    return Waited(call, cupy.cuda.Device().synchronize)


GPU_COMPETITORS: tuple[Competitor, ...] = (
    Competitor("polyconv-jax", "jax", _polyconv_jax),
    Competitor("polyconv-jax backward ops", "jax", _polyconv_jax, mode="backward_ops"),
    Competitor("lax", "jax", _lax),
    Competitor("torch", "torch", partial(_torch, device="cuda")),
    Competitor("torch NCX", "torch", partial(_torch, device="cuda", memory="contiguous")),
    Competitor("torch tf32", "torch", partial(_torch, device="cuda", tf32=True)),
    Competitor("polyconv-torch", "torch", _polyconv_torch),
    Competitor("polyconv-cupy", "cupy", _polyconv_cupy),
)


def gpu_machine() -> dict[str, Any]:
    """The GPU and the libraries' view of it."""
    info: dict[str, Any] = {}
    try:
        import jax

        device = jax.devices()[0]
        info["jax_device"] = f"{device.platform}: {device.device_kind}"
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
            info["cudnn"] = torch.backends.cudnn.version()
    except ImportError:
        pass
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        pass
    return info
