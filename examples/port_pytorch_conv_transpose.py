"""Port a PyTorch ConvTranspose2d (NCHW data, IOHW weights) to a channels-last JAX model.

PyTorch's ``ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding,
output_padding, groups)`` keeps its weight as ``[IC, OC/groups, KH, KW]``: polyconv's ``IOX``
format of the ConvTranspose family. Its ``padding=p`` crops ``p`` rows from both ends of the
full transposed output (``pads_begin = pads_end = p``) and ``output_padding`` adds rows at the
end. So the PyTorch layer is, exactly::

    polyconv.conv_transpose(x, w, b, strides=s, pads_begin=p, pads_end=p, output_padding=op,
                            groups=g, data_format="NCX", weights_format="IOX")

and moving the model to channels-last is only a transpose of the data (NCX -> NXC) and of the
weights (IOX -> XOI); the attributes do not change.

Run it with ``python examples/port_pytorch_conv_transpose.py`` (needs jax; uses torch if it is
installed).
"""

import sys

import numpy as np

import polyconv

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    sys.exit("this example needs JAX: pip install 'polyconv-ops[jax]'")

# The PyTorch layer: ConvTranspose2d(8, 6, kernel_size=3, stride=2, padding=1,
#                                    output_padding=1, groups=2)
IC, OC, K, STRIDE, PAD, OUT_PAD, GROUPS = 8, 6, 3, 2, 1, 1, 2
rng = np.random.default_rng(0)
x_ncx = rng.standard_normal((4, IC, 10, 12)).astype(np.float32)              # NCHW
w_iox = rng.standard_normal((IC, OC // GROUPS, K, K)).astype(np.float32)     # [IC, OC/g, K, K]
bias = rng.standard_normal(OC).astype(np.float32)

# --- 1. the PyTorch result (or, without torch, polyconv's numpy backend in NCX/IOX) ----------
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    y_ref = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x_ncx), torch.from_numpy(w_iox), torch.from_numpy(bias),
        stride=STRIDE, padding=PAD, output_padding=OUT_PAD, groups=GROUPS).numpy()
    reference = f"torch.nn.functional.conv_transpose2d, torch {torch.__version__}"
else:
    y_ref = polyconv.conv_transpose(
        x_ncx, w_iox, bias, strides=STRIDE, pads_begin=PAD, pads_end=PAD,
        output_padding=OUT_PAD, groups=GROUPS, data_format="NCX", weights_format="IOX")
    reference = "polyconv numpy backend (NCX/IOX; torch is not installed)"

# --- 2. the same layer in PyTorch's layout, on JAX --------------------------------------------
attrs = {"strides": STRIDE, "pads_begin": PAD, "pads_end": PAD, "output_padding": OUT_PAD,
         "groups": GROUPS}
y_jax_ncx = polyconv.conv_transpose(jnp.asarray(x_ncx), jnp.asarray(w_iox), jnp.asarray(bias),
                                    data_format="NCX", weights_format="IOX", **attrs)

# --- 3. the channels-last JAX model: NXC data, XOI weights (the defaults) -----------------------
w_xoi = np.transpose(w_iox, (2, 3, 1, 0))  # [IC, OC/g, KH, KW] -> [KH, KW, OC/g, IC]


@jax.jit
def layer(x_nxc, w_xoi, bias):
    return polyconv.conv_transpose(x_nxc, w_xoi, bias, **attrs)


x_nxc = np.transpose(x_ncx, (0, 2, 3, 1))  # NCHW -> NHWC
y_nxc = layer(jnp.asarray(x_nxc), jnp.asarray(w_xoi), jnp.asarray(bias))
y_nxc_as_ncx = np.transpose(np.asarray(y_nxc), (0, 3, 1, 2))

print(f"reference: {reference}")
print("PyTorch layout  ", x_ncx.shape, "->", y_ref.shape)
print("channels-last   ", x_nxc.shape, "->", y_nxc.shape, "(jax.jit, NXC/XOI)")
for name, y in (("JAX, NCX/IOX", np.asarray(y_jax_ncx)), ("JAX, NXC/XOI", y_nxc_as_ncx)):
    err = np.max(np.abs(y - y_ref))
    print(f"max |{name} - reference| = {err:.2e}")
    # Same numbers up to float32 rounding (the libraries sum the products in different orders).
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
print("the ported layer matches")
