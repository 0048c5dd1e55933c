"""benchdnn's convolution and deconvolution problem descriptors as polyconv calls
(docs/frameworks.md#onednn): benchdnn's own reading (``str2desc``, ``sanitize_desc``,
``init_pad_r`` in oneDNN's tests/benchdnn), then :func:`~polyconv.dialects.onednn.keywords`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._onednn_rules import PRIMITIVES, SPATIAL, c_div, keywords, polyconv_weights_shape

#: benchdnn's entries, in the order its ``str2desc`` tries them
_ENTRIES = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
            "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")
_NUMBER = re.compile(r"\s*[+-]?\d+")
#: benchdnn's directions -> the primitive's direction (``_B``: with bias)
DIRECTIONS = {"FWD_B": "forward", "FWD_D": "forward", "FWD_I": "forward",
              "BWD_D": "backward_data", "BWD_W": "backward_weights"}


@dataclass(frozen=True)
class Call:
    """A polyconv call: ``getattr(polyconv, op)(*arrays, **keywords)`` with arrays of
    ``shapes`` (``NCX`` data, the weights in ``keywords["weights_format"]``) gives an
    array of ``output``."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    keywords: dict[str, Any]
    output: tuple[int, ...]

    def __call__(self, *arrays: Any, **more: Any) -> Any:
        import polyconv

        return getattr(polyconv, self.op)(*arrays, **{**self.keywords, **more})


@dataclass(frozen=True)
class Problem:
    """A benchdnn convolution (``driver="conv"``) or deconvolution (``"deconv"``) problem,
    every size deduced as benchdnn deduces it; per-axis tuples run over the spatial axes in
    ``[D, H, W]`` order (as many as ``ndims - 2``)."""

    driver: str
    g: int
    has_groups: bool
    mb: int
    ic: int
    oc: int
    i: tuple[int, ...]
    o: tuple[int, ...]
    k: tuple[int, ...]
    s: tuple[int, ...]
    p: tuple[int, ...]
    p_r: tuple[int, ...]
    d: tuple[int, ...]
    name: str = ""
    stated: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def ndims(self) -> int:
        return len(self.i) + 2

    def src_dims(self) -> tuple[int, ...]:
        return (self.mb, self.ic, *self.i)

    def dst_dims(self) -> tuple[int, ...]:
        return (self.mb, self.oc, *self.o)

    def wei_dims(self) -> tuple[int, ...]:
        """oneDNN's weights dims: ``[G, OC/G, IC/G, K..]`` (no ``G`` without ``g`` given)."""
        lead = (self.g,) if self.has_groups else ()
        return (*lead, self.oc // self.g, self.ic // self.g, *self.k)

    def call(self, dir: str = "FWD_D") -> Call:
        """This problem as a polyconv call in benchdnn's direction ``dir`` (``FWD_B``,
        ``FWD_D``, ``FWD_I``, ``BWD_D``, ``BWD_W``), on ``NCX`` arrays and ``OIX`` weights
        (oneDNN's ``oihw`` where there are no groups)."""
        direction = DIRECTIONS.get(str(dir).upper())
        if direction is None:
            why = (" (BWD_WB adds diff_bias, diff_dst summed over all but its channel axis, "
                   "which polyconv has no op for: use BWD_W)" if str(dir).upper() == "BWD_WB"
                   else "")
            msg = f"onednn: dir must be one of {list(DIRECTIONS)}; got dir={dir!r}{why}"
            raise ValueError(msg)
        kind = "convolution" if self.driver == "conv" else "deconvolution"
        primitive = f"{kind}_{direction}"
        family, op = PRIMITIVES[primitive]
        kw = keywords(primitive, self.src_dims(), self.wei_dims(), self.dst_dims(),
                      strides=self.s, padding_l=self.p, padding_r=self.p_r,
                      dilates=self.d, weights_tag="goi" + SPATIAL[len(self.i)]
                      if self.has_groups else None)
        weights = polyconv_weights_shape(family, self.wei_dims(), len(self.i), "OIX")
        src, dst = self.src_dims(), self.dst_dims()
        if direction == "forward":
            bias = ((self.oc,),) if str(dir).upper() == "FWD_B" else ()
            return Call(op, (src, weights, *bias), kw, dst)
        if direction == "backward_data":
            return Call(op, (dst, weights), kw, src)
        return Call(op, (src, dst), kw, weights)


def _descriptor_error(text: str, why: str) -> ValueError:
    return ValueError(f"onednn: benchdnn descriptor {text!r}: {why}")


def parse_descriptor(text: str, driver: str = "conv") -> Problem:
    """A benchdnn problem descriptor (``mb2_ic16oc32_ih14oh7kh3sh2dh0ph1_n"name"``) as
    benchdnn's ``str2desc`` reads it for ``driver`` ``"conv"`` or ``"deconv"``: defaults
    ``g1``, ``mb2``, strides 1, dilations 0; a missing output size computed, a missing
    pad computed from the output size (or 0); the right pads implied by the sizes; ``d``
    values propagated to ``h`` and ``w``, ``h`` to ``w``
    (tests/benchdnn/doc/knobs_desc.md of oneDNN).

    Examples
    --------
    >>> from polyconv.dialects import onednn
    >>> p = onednn.parse_descriptor('mb2_ic16oc32_ih14oh7kh3sh2dh0ph1_n"name"')
    >>> p.dst_dims(), p.p, p.p_r, p.name
    ((2, 32, 7, 7), (1, 1), (0, 0), 'name')
    >>> c = p.call("FWD_B")
    >>> c.op, c.shapes
    ('convolution', ((2, 16, 14, 14), (32, 16, 3, 3), (32,)))
    """
    if driver not in ("conv", "deconv"):
        msg = f"onednn: driver must be 'conv' or 'deconv'; got driver={driver!r}"
        raise ValueError(msg)
    values: dict[str, int] = {}
    name = ""
    pos = 0
    while pos < len(text):
        ok = False
        for key in _ENTRIES:
            if text.startswith(key, pos):
                number = _NUMBER.match(text, pos + len(key))
                if number is None:
                    raise _descriptor_error(text, f"no value found for {key!r}")
                value = int(number.group())
                if value < 0:
                    raise _descriptor_error(text, f"{key!r} must be positive")
                values[key] = value
                ok = True
                pos = number.end()
        if pos < len(text) and text[pos] == "n":
            name = text[pos + 1:].strip('"')
            break
        if pos < len(text) and text[pos] == "_":
            pos += 1
        elif not ok:
            raise _descriptor_error(text, f"unrecognized entry at {text[pos:]!r}")
    return _deduce(text, driver, values, name)


def _deduce_axis(text: str, v: dict[str, int], axis: str, deconv: bool) -> None:
    """benchdnn's ``str2desc`` on one spatial axis given at all: the output size, else the
    pad, deduced from the rest."""
    i, o, k, s, p, d = (v[f"{c}{axis}"] for c in "iokspd")
    if (i | k | o | d) == 0 and s == 1 and p < 1:
        return
    for key in (f"i{axis}", f"k{axis}"):
        if v[key] <= 0:
            raise _descriptor_error(text, f"{key!r} was not given or is 0")
    ek = (k - 1) * (d + 1) + 1
    if o == 0:
        p = max(p, 0)
        o = ((i - 1) * s + ek - 2 * p) if deconv else c_div(i - ek + 2 * p, s) + 1
        if o <= 0:
            raise _descriptor_error(text, f"the deduced o{axis}={o} is not positive")
    elif p < 0:
        p = c_div(((i - 1) * s - o + ek) if deconv else ((o - 1) * s - i + ek), 2)
    v[f"o{axis}"], v[f"p{axis}"] = o, p


def _spatial_axes(text: str, v: dict[str, int]) -> str:
    """benchdnn's ``sanitize_desc``: the axes the output sizes name; ``d`` values copied to
    ``h`` and ``w``, ``h`` to ``w``, absent axes set to their defaults."""
    no = {axis: v[f"o{axis}"] == 0 for axis in "dhw"}
    ndims = 5 - no["d"] - (no["d"] and no["h"]) - (no["d"] and no["h"] and no["w"])
    if ndims <= 2:
        raise _descriptor_error(text, "no spatial axis is given")
    if ndims == 5 and no["h"] != no["w"]:
        raise _descriptor_error(text, "give all of the h and w values or none of them")
    copy = {5: ("d", "hw"), 4: ("h", "w")}.get(ndims) if no["w"] else None
    for key, default in zip("oikspd", (1, 1, 1, 1, 0, 0)):
        if copy:
            for axis in copy[1]:
                v[f"{key}{axis}"] = v[f"{key}{copy[0]}"]
        for axis in "dhw"[:5 - ndims]:
            v[f"{key}{axis}"] = default
    return "dhw"[5 - ndims:]


def _deduce(text: str, driver: str, values: dict[str, int], name: str) -> Problem:
    """benchdnn's deductions (``str2desc``, ``sanitize_desc``, ``init_pad_r``)."""
    v = {key: values.get(key, 0) for key in _ENTRIES}
    v["mb"] = values.get("mb", 2)
    for axis in "dhw":
        v[f"s{axis}"] = values.get(f"s{axis}", 1)
        v[f"p{axis}"] = values.get(f"p{axis}", -1)
    has_groups = "g" in values
    for key in ("ic", "oc", "sd", "sh", "sw") + (("g",) if has_groups else ()):
        if v[key] <= 0:
            raise _descriptor_error(text, f"{key!r} was not given or is 0")
    v["g"] = v["g"] if has_groups else 1
    deconv = driver == "deconv"
    for axis in "dhw":
        _deduce_axis(text, v, axis, deconv)
    axes = _spatial_axes(text, v)
    i, o, k, s, p, d = (tuple(v[f"{key}{axis}"] for axis in axes) for key in "iokspd")
    small, large = (i, o) if deconv else (o, i)
    p_r = tuple((b - 1) * st + (kk - 1) * (dd + 1) + 1 - a - pl
                for b, a, kk, st, dd, pl in zip(small, large, k, s, d, p))
    return Problem(driver, v["g"], has_groups, v["mb"], v["ic"], v["oc"], i, o, k, s, p,
                   p_r, d, name, frozenset(values))


def parse_batch(text: str, driver: str = "conv") -> Iterator[Problem]:
    """The problems of a benchdnn batch file (``inputs/conv/shapes_*``): descriptors
    separated by white space, ``#`` comments to the end of the line, ``\\`` continuing a
    line; options (``--strides=...``, which change no size) are skipped."""
    tokens: list[str] = []
    continued = False
    for line in text.splitlines():
        for word in line.split():
            if word.startswith("#"):
                break
            if continued and tokens:
                word = tokens.pop() + word
            continued = word.endswith("\\")
            word = word.rstrip("\\")
            if word:
                tokens.append(word)
    for token in tokens:
        if not token.startswith("--"):
            yield parse_descriptor(token, driver)
