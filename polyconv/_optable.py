"""The op table: one record per public function, and the one name lookup.

Everything that differs between the six ops (and the three older-spec aliases) is a field of
an :class:`OpSpec`: the family, which primitive of the canonical convolution computes it, which
argument is the large tensor ``a`` and which the small ``b``, its positional inputs, its
output, its default weights format and whether it takes ``output_padding``. The geometry
(:mod:`polyconv._geometry`), the ops and :func:`~polyconv.infer_shape` (:mod:`polyconv._ops`),
:func:`~polyconv.compare` and the ``polyconv`` command read it from here; none of them lists
the ops again. See docs/semantics.md#six-ops.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

Primitive = Literal["forward", "backward_data", "backward_weights"]
Family = Literal["convolution", "conv_transpose"]

#: The adjoint identities of the canonical convolution, ``<F(a, W), b> = <a, D(b, W)> =
#: <W, Wt(a, b)>``: per primitive, for the cotangent of each of its two inputs, the primitive
#: that computes it and the slot the cotangent takes among that primitive's inputs (the other
#: slot takes the primitive's other input). Every backend's derivative rules read it.
ADJOINTS: dict[str, tuple[tuple[Primitive, int], tuple[Primitive, int]]] = {
    "forward": (("backward_data", 0), ("backward_weights", 1)),
    "backward_data": (("forward", 0), ("backward_weights", 0)),
    "backward_weights": (("backward_data", 1), ("forward", 1)),
}

#: positional arguments that are shapes, not arrays
SHAPE_ARGUMENTS = ("dst_shape", "weights_shape")


@dataclass(frozen=True)
class OpSpec:
    """One public function of the family.

    Attributes
    ----------
    name : str
        The polyconv function name (``"conv_transpose"``).
    onednn : str
        Its oneDNN Graph name (``"ConvTranspose"``); for an older-spec alias, the older name
        without its ``-1`` suffix, which ``OPS`` lists with and without it.
    kind : str
        The function whose computation this is: ``name`` itself, or for an alias the
        function it is an older name of.
    family, primitive : str
        Convolution or ConvTranspose family; the primitive that computes it.
    large, small : str
        The argument or output that is the canonical large tensor ``a`` and small ``b``.
    positional : tuple of str
        Positional inputs in order: the arrays, then an optional shape argument.
    output : str
        Name of the output (``"dst"``, ``"diff_src"``, ``"diff_weights"``).
    weights_format : str
        The default ``weights_format``.
    output_padding : bool
        Whether the op takes ``output_padding`` (the transposed direction only).
    """

    name: str
    onednn: str
    kind: str
    family: Family
    primitive: Primitive
    large: str
    small: str
    positional: tuple[str, ...]
    output: str
    weights_format: str
    output_padding: bool

    @property
    def is_alias(self) -> bool:
        """An older-spec name of another function."""
        return self.kind != self.name

    @property
    def ops_names(self) -> tuple[str, ...]:
        """Its keys in :data:`polyconv.OPS`."""
        return (self.onednn, f"{self.onednn}-1") if self.is_alias else (self.onednn,)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The array inputs, in the order the primitive takes them."""
        bias = ("bias",) if "bias" in self.positional else ()
        if self.primitive == "forward":
            return (self.large, "weights", *bias)
        if self.primitive == "backward_data":
            return (self.small, "weights", *bias)
        return (self.large, self.small)

    @property
    def shape_argument(self) -> str | None:
        """``dst_shape``, ``weights_shape`` or ``None``: the shape the op may be given."""
        if self.primitive == "backward_weights":
            return "weights_shape"
        if self.primitive == "backward_data":
            return "dst_shape"
        return None


def _spec(name, onednn, family, primitive, large, small, positional, output,
          output_padding, *, kind=None, weights_format=None) -> OpSpec:
    default = "XIO" if family == "convolution" else "XOI"
    return OpSpec(name, onednn, kind or name, family, primitive, large, small,
                  tuple(positional.split()), output, weights_format or default, output_padding)


#: every public function of the family, the six ops first
OP_TABLE: tuple[OpSpec, ...] = (
    _spec("convolution", "Convolution", "convolution", "forward",
          "src", "dst", "src weights bias", "dst", False),
    _spec("convolution_backward_data", "ConvolutionBackwardData", "convolution",
          "backward_data", "diff_src", "diff_dst", "diff_dst weights dst_shape", "diff_src",
          True),
    _spec("convolution_backward_weights", "ConvolutionBackwardWeights", "convolution",
          "backward_weights", "src", "diff_dst", "src diff_dst weights_shape", "diff_weights",
          False),
    _spec("conv_transpose", "ConvTranspose", "conv_transpose", "backward_data",
          "dst", "src", "src weights bias", "dst", True),
    _spec("conv_transpose_backward_data", "ConvTransposeBackwardData", "conv_transpose",
          "forward", "diff_dst", "diff_src", "diff_dst weights", "diff_src", True),
    _spec("conv_transpose_backward_weights", "ConvTransposeBackwardWeights", "conv_transpose",
          "backward_weights", "diff_dst", "src", "src diff_dst weights_shape", "diff_weights",
          True),
    # older-spec names; ConvTransposeBackpropFilters-1's default filter_format is XIO, with
    # the ConvTranspose family's meaning of O and I
    _spec("convolution_backprop_data", "ConvolutionBackpropData", "convolution",
          "backward_data", "diff_src", "diff_dst", "diff_dst weights dst_shape", "diff_src",
          True, kind="convolution_backward_data"),
    _spec("convolution_backprop_filters", "ConvolutionBackpropFilters", "convolution",
          "backward_weights", "src", "diff_dst", "src diff_dst weights_shape", "diff_weights",
          False, kind="convolution_backward_weights"),
    _spec("conv_transpose_backprop_filters", "ConvTransposeBackpropFilters", "conv_transpose",
          "backward_weights", "diff_dst", "src", "src diff_dst weights_shape", "diff_weights",
          True, kind="conv_transpose_backward_weights", weights_format="XIO"),
)

#: the six ops (no aliases), in table order
MAIN_OPS: tuple[OpSpec, ...] = tuple(s for s in OP_TABLE if not s.is_alias)

_BY_NAME = {s.name: s for s in OP_TABLE}


def _loose(text: str) -> str:
    return text.lower().replace("-", "").replace("_", "")


_BY_LOOSE_NAME = {_loose(key): s for s in OP_TABLE for key in (s.name, *s.ops_names)}


def spec(name: str) -> OpSpec:
    """The record of a polyconv function name."""
    return _BY_NAME[name]


def lookup(op: str | Any, who: str = "") -> OpSpec:
    """The record of ``op``: an ``OPS`` name (``"ConvTranspose"``,
    ``"ConvolutionBackpropData-1"``), a polyconv function name (``"conv_transpose"``), either
    spelled loosely (case, ``_`` and ``-`` ignored), or the function itself.

    Anything else is a ``ValueError`` (prefixed with ``who:`` when given) listing the names.
    """
    found = None
    if isinstance(op, str):
        found = _BY_LOOSE_NAME.get(_loose(op.strip()))
    else:
        # a function of the op module is one of that loaded module's (no import: that module
        # imports this one)
        ops = sys.modules.get(f"{__package__}._ops")
        candidate = _BY_NAME.get(getattr(op, "__name__", None))
        if candidate is not None and getattr(ops, candidate.name, None) is op:
            found = candidate
    if found is None:
        names = ", ".join(repr(n) for s in OP_TABLE for n in s.ops_names)
        msg = f"unknown op {op!r}; known ops are {names} (or the polyconv function names)"
        raise ValueError(f"{who}: {msg}" if who else msg)
    return found
