"""polyconv's Convolution and ConvTranspose as layers of the frameworks people train with.

One module per framework, each imported only when used (``import polyconv`` and
``import polyconv.layers`` import no framework):

- :mod:`polyconv.layers.flax`: Flax ``nnx`` modules ``Conv`` and ``ConvTranspose``;
- :mod:`polyconv.layers.linen`: the same for Flax ``linen``;
- :mod:`polyconv.layers.equinox`: Equinox modules ``Conv`` and ``ConvTranspose``;
- :mod:`polyconv.layers.keras`: Keras 3 layers ``Conv`` and ``ConvTranspose``;
- :mod:`polyconv.layers.torch`: ``torch.nn`` modules ``Conv`` and ``ConvTranspose``.

Each layer keeps its framework's conventions (argument and parameter names, initialisers,
the kernel layout, how state is stored and saved), so its parameters interchange with the
framework's own layer of the same configuration, and adds what polyconv has: groups and
dilation in every direction, ``output_padding``, asymmetric pads, polyconv's ``auto_pad``,
both data formats, 1 to 3 (or more) spatial axes. The page "Layers" of the documentation
shows each one.
"""
