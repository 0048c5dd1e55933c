"""The public entry of the spatially sharded ops; the JAX backend is imported on first call,
so that ``import polyconv`` stays light."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def spatially_sharded(op: str | Any, *args: Any, mesh: Any, spatial: Sequence[str | None],
                      batch: str | None = None, **attributes: Any) -> Any:
    """Run op ``op`` on JAX arrays split along spatial axes over a device mesh, with halo
    exchange between neighbouring devices (docs/spatial_sharding.md).

    Every device holds an equal slab of each split spatial axis; it receives from its two
    neighbours only the rows its outputs read (one ``jax.lax.ppermute`` each way per split
    axis), then runs polyconv's own op on its window. The result equals the unsharded call,
    and so do its gradients (``jax.grad`` differentiates through the exchange and polyconv's
    own backward ops, sharded the same way).

    Parameters
    ----------
    op : str or callable
        Any of the six ops (or an older-spec alias), by name or the function itself.
    *args
        The op's positional arguments (arrays and its shape argument), as for the op.
    mesh : jax.sharding.Mesh
    spatial : sequence of str or None
        Per spatial axis in the data format's order (``D, H, W``), the mesh axis that splits
        it, or ``None``; a shorter sequence leaves the remaining axes whole.
    batch : str, optional
        A mesh axis that also splits the batch (data parallelism on top).
    **attributes
        The op's keyword attributes (``strides``, ``auto_pad``, ``data_format``...).

    Returns
    -------
    jax.Array
        The op's output, split like the data (the weights gradients: replicated).

    Raises
    ------
    ValueError
        When a device's slab is thinner than the rows its outputs read from a neighbour, or
        the mesh axes named are not the mesh's. (A split axis whose sizes are not multiples
        of its device count is computed exactly, but arrives and comes back whole: see
        docs/spatial_sharding.md.)

    Examples
    --------
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import polyconv
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("z",))
    >>> x = jnp.ones((1, 8, 8, 2))                     # NXC
    >>> w = jnp.ones((3, 3, 2, 4))                     # XIO
    >>> y = polyconv.spatially_sharded("convolution", x, w, mesh=mesh, spatial=("z",),
    ...                                auto_pad="same_upper")
    >>> y.shape
    (1, 8, 8, 4)
    """
    from polyconv_jax._sharded import spatially_sharded as run

    return run(op, *args, mesh=mesh, spatial=spatial, batch=batch, **attributes)
