"""Each framework's padding arguments as polyconv's attributes: pure Python on ints.

A layer resolves its framework's ``padding`` (and ``output_padding``) once, at construction,
into the keywords of :func:`polyconv.convolution` or :func:`polyconv.conv_transpose`
(``pads_begin``, ``pads_end``, ``auto_pad``, ``output_padding``). Nothing here imports a
framework.

Two conventions cover the transposed direction:

- *crop pads* (PyTorch, Equinox, polyconv): the pads of the convolution whose gradient the
  ConvTranspose is; they crop the full transposed output;
- *dilated-input pads* (``lax.conv_transpose``, hence Flax and Keras on JAX): zeros added
  around the stride-dilated input before a stride-1 convolution. Per axis, with the dilated
  kernel extent ``ek``, the pair ``(lo, hi)`` is ``pads_begin = ek - 1 - lo`` and
  ``pads_end - output_padding = ek - 1 - hi`` (:func:`from_dilated_input_pads`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dialects.keras import transpose_pairs

#: polyconv's own ``auto_pad`` names, accepted by every layer's ``auto_pad=``
AUTO_PADS = ("same_upper", "same_lower", "valid")

Pairs = tuple[tuple[int, int], ...]


def extents(kernel_size: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:
    """The dilated kernel extents ``(k - 1) * d + 1``."""
    return tuple((k - 1) * d + 1 for k, d in zip(kernel_size, dilation))


def as_tuple(value: int | Sequence[int] | None, rank: int, name: str,
             default: int = 1) -> tuple[int, ...]:
    """``value`` broadcast to ``rank`` ints (``None`` is ``default``, as Flax reads it)."""
    if value is None:
        value = default
    if isinstance(value, int):
        return (value,) * rank
    out = tuple(int(v) for v in value)
    if len(out) != rank:
        msg = (f"{name}={value!r} has {len(out)} values but the layer has {rank} spatial "
               f"axes; pass one int or {rank} ints")
        raise ValueError(msg)
    return out


def pairs(padding: Any, rank: int, name: str = "padding") -> Pairs:
    """An int, ``rank`` ints or ``rank`` ``(begin, end)`` pairs as ``rank`` pairs."""
    if isinstance(padding, int):
        return ((padding, padding),) * rank
    items = list(padding)
    if len(items) == rank:
        out = []
        for p in items:
            if isinstance(p, int):
                out.append((p, p))
            elif isinstance(p, Sequence) and len(p) == 2:
                out.append((int(p[0]), int(p[1])))
            else:
                break
        if len(out) == rank:
            return tuple(out)
    msg = (f"{name}={padding!r} is not a padding of {rank} spatial axes; pass a string, an "
           f"int, or {rank} ints or (begin, end) pairs")
    raise ValueError(msg)


def _explicit(pads: Pairs, name: str, padding: Any) -> dict[str, Any]:
    if any(p < 0 for pair in pads for p in pair):
        msg = (f"{name}={padding!r} has a negative pad; polyconv pads with zeros only "
               "(pads >= 0): crop the input instead")
        raise ValueError(msg)
    return {"auto_pad": "none", "pads_begin": tuple(b for b, _ in pads),
            "pads_end": tuple(e for _, e in pads)}


def check_auto_pad(auto_pad: str | None) -> str | None:
    """polyconv's ``auto_pad`` name, lower-cased, or ``None`` (not given)."""
    if auto_pad is None:
        return None
    value = str(auto_pad).lower()
    if value not in AUTO_PADS:
        msg = (f"auto_pad={auto_pad!r} is not one of polyconv's {AUTO_PADS}; leave it None to "
               "use the layer's padding argument")
        raise ValueError(msg)
    return value


def conv_padding(padding: Any, kernel_size: Sequence[int], dilation: Sequence[int],
                 auto_pad: str | None = None) -> dict[str, Any]:
    """A convolution's ``padding`` as polyconv keywords (every framework means the same here).

    ``"SAME"`` / ``"SAME_LOWER"`` / ``"VALID"`` (any case) are ``same_upper`` / ``same_lower``
    / ``valid``; ``"CAUSAL"`` pads ``ek - 1`` at the beginning only; an int, ints or pairs are
    explicit zero pads. ``auto_pad`` (polyconv's names), when given, replaces ``padding``.
    """
    rank = len(kernel_size)
    if (chosen := check_auto_pad(auto_pad)) is not None:
        return {"auto_pad": chosen}
    if isinstance(padding, str):
        name = padding.upper()
        named = {"SAME": "same_upper", "SAME_LOWER": "same_lower", "VALID": "valid"}
        if name in named:
            return {"auto_pad": named[name]}
        if name == "CAUSAL":
            ek = extents(kernel_size, dilation)
            return _explicit(tuple((e - 1, 0) for e in ek), "padding", padding)
        msg = (f"padding={padding!r} is not a zero padding polyconv computes; use 'SAME', "
               "'SAME_LOWER', 'VALID', 'CAUSAL', an int, ints or (begin, end) pairs")
        raise ValueError(msg)
    return _explicit(pairs(padding, rank), "padding", padding)


def from_dilated_input_pads(lo_hi: Pairs, kernel_size: Sequence[int],
                            strides: Sequence[int], dilation: Sequence[int],
                            name: str, value: Any) -> dict[str, Any]:
    """``lax.conv_transpose``'s pads of the dilated input as polyconv's crop pads.

    ``pads_begin = ek - 1 - lo``; the end takes ``ek - 1 - hi`` as ``pads_end`` when it is
    not negative, else as ``output_padding`` (positions that only the bias reaches).
    """
    begin, end, extra = [], [], []
    for (lo, hi), e, s in zip(lo_hi, extents(kernel_size, dilation), strides):
        tail = e - 1 - hi
        if e - 1 - lo < 0 or -tail >= s:
            msg = (f"{name}={value!r} pads the dilated input by {(lo, hi)} on an axis with "
                   f"dilated kernel extent {e} and stride {s}; polyconv reaches begin pads "
                   f"up to {e - 1} and end pads below {e - 1 + s} there (a pad beyond them "
                   "adds positions no product or bias defines): pass smaller pads")
            raise ValueError(msg)
        begin.append(e - 1 - lo)
        end.append(max(tail, 0))
        extra.append(max(-tail, 0))
    return {"auto_pad": "none", "pads_begin": tuple(begin), "pads_end": tuple(end),
            "output_padding": tuple(extra)}


def lax_transpose_pairs(padding: Any, kernel_size: Sequence[int], strides: Sequence[int],
                        dilation: Sequence[int], output_padding: Sequence[int]) -> Pairs:
    """Flax's ``ConvTranspose`` padding (that of ``lax.conv_transpose``) as dilated-input
    pairs, ``output_padding`` added at the end: ``"SAME"`` makes ``in * s``, ``"VALID"``
    ``in * s + max(ek - s, 0)``, pairs are taken as they are."""
    rank = len(kernel_size)
    if isinstance(padding, str):
        name = padding.upper()
        if name not in ("SAME", "VALID"):
            msg = (f"padding={padding!r}: a ConvTranspose here takes 'SAME', 'VALID', an "
                   "int, ints or (begin, end) pairs (periodic and causal padding are not "
                   "zero paddings of the transposed direction); use flax.nnx.ConvTranspose "
                   "for 'CIRCULAR'")
            raise ValueError(msg)
        out = []
        for e, s in zip(extents(kernel_size, dilation), strides):
            total = e + s - 2 + (max(e - s, 0) if name == "VALID" else 0)
            lo = e - 1 if name == "VALID" or s > e - 1 else -(-total // 2)
            out.append((lo, total - lo))
        lo_hi = tuple(out)
    else:
        lo_hi = pairs(padding, rank)
    return tuple((lo, hi + op) for (lo, hi), op in zip(lo_hi, output_padding))


def keras_transpose_pairs(padding: str, kernel_size: Sequence[int], strides: Sequence[int],
                          dilation: Sequence[int],
                          output_padding: Sequence[int] | None) -> Pairs:
    """Keras 3's ``Conv*DTranspose`` ``"valid"`` / ``"same"`` as dilated-input pairs, as its
    JAX backend pads them (the Keras dialect's rule)."""
    opad = (None,) * len(strides) if output_padding is None else output_padding
    return tuple(transpose_pairs(kernel_size, strides, dilation, padding, opad))


def crop_transpose_padding(padding: Any, kernel_size: Sequence[int], strides: Sequence[int],
                           dilation: Sequence[int], output_padding: Sequence[int],
                           same_rule: str) -> dict[str, Any]:
    """A ConvTranspose's ``padding`` in crop pads (PyTorch's, Equinox's), as polyconv keywords.

    ``"VALID"`` crops nothing; ints and pairs are crop pads. ``"SAME"`` / ``"SAME_LOWER"``
    follow ``same_rule``: ``"equinox"`` (the total ``ek - s + output_padding`` split as its
    ConvTranspose does: the output is ``in * s - output_padding``) or ``"polyconv"``
    (``same_upper`` / ``same_lower``: ``in * s + output_padding`` when ``ek >= s``).
    """
    rank = len(kernel_size)
    if not isinstance(padding, str):
        return {**_explicit(pairs(padding, rank), "padding", padding),
                "output_padding": tuple(output_padding)}
    name = padding.upper()
    if name == "VALID":
        return {"auto_pad": "valid", "output_padding": tuple(output_padding)}
    if name not in ("SAME", "SAME_LOWER"):
        msg = (f"padding={padding!r}: a ConvTranspose here takes 'SAME', 'SAME_LOWER', "
               "'VALID', an int, ints or (begin, end) pairs")
        raise ValueError(msg)
    if same_rule == "polyconv":
        return {"auto_pad": "same_upper" if name == "SAME" else "same_lower",
                "output_padding": tuple(output_padding)}
    begin, end, extra = [], [], []
    for e, s, op in zip(extents(kernel_size, dilation), strides, output_padding):
        total = e - s + op
        lower = int(name == "SAME_LOWER")
        first = (max(total, 0) + lower) // 2
        begin.append(first)
        end.append(max(total, 0) - first)
        extra.append(max(-total, 0))
    return {"auto_pad": "none", "pads_begin": tuple(begin), "pads_end": tuple(end),
            "output_padding": tuple(extra)}
