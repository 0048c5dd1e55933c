"""Data and weights layouts: where the channels and the kernel sit in each format, and the
hint that names the formats a mismatched call's shapes fit (docs/semantics.md#layouts)."""

from __future__ import annotations

from ._attributes import LAYOUT_SPELLINGS, WEIGHTS_FORMATS
from ._optable import Family


def check_spelled_ranks(op: str, args: dict) -> None:
    """``data_format`` and ``weights_format`` spelt with their spatial axes named (``NCHW``,
    ``HWIO``, ...) must name as many as the data has: ``NCHW`` is ``NCX`` on 2-D data only.
    ``args`` holds the call's arguments by name, the data as arrays or shapes; what cannot be
    read here is left to the checks of the data's shapes."""
    first = next((n for n in ("src", "diff_dst") if args.get(n) is not None), None)
    try:
        shape = tuple(getattr(args[first], "shape", args[first]))
    except (KeyError, TypeError):
        return
    rank = len(shape) - 2
    for name in ("data_format", "weights_format"):
        value = args.get(name)
        spelled = LAYOUT_SPELLINGS.get(value.upper()) if isinstance(value, str) else None
        if spelled is None or rank < 1 or spelled[1] == rank:
            continue
        fmt, ndim = spelled
        fits = [s for s, (f, n) in LAYOUT_SPELLINGS.items() if f == fmt and n == rank]
        fix = f"{name}={fits[0]!r}, or " if fits else ""
        msg = (f"{op}: {name}={value!r} is {fmt!r} with {ndim} spatial "
               f"{'axes' if ndim > 1 else 'axis'} named, but {first} has {rank} "
               f"({first}.shape={shape}); pass {fix}{name}={fmt!r}, which fits any number "
               f"of spatial axes")
        raise ValueError(msg)


def split_data(op: str, name: str, shape: tuple[int, ...], channels_last: bool):
    n = shape[0]
    if channels_last:
        return n, shape[-1], shape[1:-1]
    return n, shape[1], shape[2:]


def _weights_axes(fmt: str, ndim: int) -> dict[str, object]:
    """Positions of O, I and the spatial axes for a weights format of rank ``ndim + 2``."""
    axes: dict[str, object] = {}
    pos = 0
    for letter in fmt:
        if letter == "X":
            axes["X"] = tuple(range(pos, pos + ndim))
            pos += ndim
        else:
            axes[letter] = pos
            pos += 1
    return axes


def weights_perm(fmt: str, ndim: int, family: Family) -> tuple[int, ...]:
    axes = _weights_axes(fmt, ndim)
    cb, ca = ("O", "I") if family == "convolution" else ("I", "O")
    return (axes[cb], axes[ca], *axes["X"])


AXIS_MEANING = {"convolution": {"O": "OC", "I": "IC/groups"},
                 "conv_transpose": {"O": "OC/groups", "I": "IC"}}


def weights_meaning(family: Family, fmt: str) -> str:
    names = {**AXIS_MEANING[family], "X": "K.."}
    return ", ".join(names[letter] for letter in fmt)


#: The weights format of each family that goes with channels-first data in PyTorch and ONNX
#: (and with channels-last data in TensorFlow and JAX): tried first by the layout hint.
_USUAL_WEIGHTS = {("convolution", "NCX"): "OIX", ("convolution", "NXC"): "XIO",
                  ("conv_transpose", "NCX"): "IOX", ("conv_transpose", "NXC"): "XOI"}


def _channels_fit(family: Family, primitive: str, data: dict[str, tuple[int, ...]],
                  order: tuple[str, str], weights: tuple[int, ...] | None, groups: int,
                  data_format: str, weights_format: str) -> bool:
    """Whether the data and weights channels agree when read in these formats.

    ``data`` holds the full data shapes by name; ``order`` names the (large, small) data
    inputs of a backward-weights op, or (first, first) otherwise; ``weights`` is the full
    weights shape, ``None`` when only the kernel sizes are known.
    """
    def channels(name: str) -> int:
        shape = data[name]
        return shape[-1] if data_format == "NXC" else shape[1]

    ndim = len(next(iter(data.values()))) - 2
    if weights is not None:
        perm = weights_perm(weights_format, ndim, family)
        w_cb, w_ca = weights[perm[0]], weights[perm[1]]
    if primitive == "backward_weights":
        a, b = channels(order[0]), channels(order[1])
    elif primitive == "forward":
        a, b = channels(order[0]), w_cb
    else:
        a, b = w_ca * groups, channels(order[0])
    if a % groups or b % groups or min(a, b) < 1:
        return False
    return weights is None or (w_cb, w_ca) == (b, a // groups)


def _kernel(weights: tuple[int, ...] | None, weights_format: str, ndim: int) -> int:
    """The largest kernel size the weights have when read in ``weights_format`` (0 when only
    the kernel sizes are known: they do not depend on the format)."""
    if weights is None:
        return 0
    return max(weights[i] for i in _weights_axes(weights_format, ndim)["X"])


def _fits(family: Family, primitive: str, data: dict[str, tuple[int, ...]],
          order: tuple[str, str], weights: tuple[int, ...] | None, groups: int,
          data_format: str, weights_format: str) -> list[tuple[str, str]]:
    """The other (data_format, weights_format) pairs that make the channels agree, the most
    likely first: fewest attributes changed, then the smallest kernel (a 4x4 map's
    ``[4, 4, 512, 256]`` weights fit ``XIO`` with a 4x4 kernel and, read channels-first,
    ``IOX`` with a 512x256 one), then the usual pairs of each library. A pair whose kernel is
    larger than the first's is dropped: it is rarely what was meant."""
    other = "NCX" if data_format == "NXC" else "NXC"
    candidates = [(other, weights_format)]
    if weights is not None:
        def usual_first(fmt: str) -> list[str]:
            usual = _USUAL_WEIGHTS[family, fmt]
            return sorted(WEIGHTS_FORMATS, key=lambda f: f != usual)

        candidates = [(other, _USUAL_WEIGHTS[family, other]), *candidates]
        candidates += [(data_format, f) for f in usual_first(data_format)]
        candidates += [(other, f) for f in usual_first(other)]
    ndim = len(data[order[0]]) - 2
    fits = [c for c in dict.fromkeys(candidates) if c != (data_format, weights_format)
            and _channels_fit(family, primitive, data, order, weights, groups, *c)]
    fits.sort(key=lambda c: ((c[0] != data_format) + (c[1] != weights_format),
                             _kernel(weights, c[1], ndim)))
    return [c for c in fits if _kernel(weights, c[1], ndim) <= _kernel(weights, fits[0][1], ndim)]


def layout_message(family: Family, primitive: str, data: dict[str, tuple[int, ...]],
                   order: tuple[str, str], weights: tuple[int, ...] | None, groups: int,
                   data_format: str, weights_format: str) -> str:
    """How the data was read and, where other formats make the channels agree, which (at
    most two readings, the likeliest first; see :func:`_fits`)."""
    channels_last = data_format == "NXC"
    axis = len(data[order[0]]) - 1 if channels_last else 1
    read = (f"the data is read as {data_format} "
            f"({'[N, X.., C], channels last' if channels_last else '[N, C, X..], channels first'}"
            f"{', the default' if channels_last else ''}), so its channels are "
            f"{', '.join(f'{n}.shape[{axis}]={data[n][axis]}' for n in dict.fromkeys(order))}")

    def reading(dfmt: str, wfmt: str) -> tuple[str, str]:
        changes = [f"{name}={fmt!r}" for name, fmt, given in
                   (("data_format", dfmt, data_format), ("weights_format", wfmt, weights_format))
                   if fmt != given]
        torch = (" (channels-first data and PyTorch's weights layout)"
                 if dfmt == "NCX" and wfmt == _USUAL_WEIGHTS[family, "NCX"] else "")
        return f"{', '.join(changes)}{torch}", " and ".join(changes)

    fits = _fits(family, primitive, data, order, weights, groups, data_format, weights_format)
    if not fits:
        return read
    fit, fix = reading(*fits[0])
    msg = f"{read}. These shapes fit {fit}: if that is how they are laid out, pass {fix}"
    if len(fits) > 1:
        also, fix = reading(*fits[1])
        msg += f"; they also fit {also}: then pass {fix}"
    return msg
