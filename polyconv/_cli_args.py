"""What the ``polyconv`` subcommands share: argument types, op names as typed, the shape and
attribute options, and the usage error."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from ._optable import lookup, spec

_DTYPE_ALIASES = {"f32": "float32", "float32": "float32", "f16": "float16",
                  "float16": "float16", "half": "float16", "bf16": "bfloat16",
                  "bfloat16": "bfloat16", "f64": "float64", "float64": "float64",
                  "double": "float64"}
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
SHAPE_OPTIONS = ("src", "weights", "bias", "diff_dst", "weights_shape", "dst_shape")
ATTR_OPTIONS = ("strides", "pads_begin", "pads_end", "dilations", "auto_pad",
                 "output_padding", "groups", "data_format", "weights_format")


#: ``name=value`` in a message, for an attribute or shape the command takes as an option:
#: a string value anywhere, any value in a suggestion (from ``pass`` to the clause's end)
_NAMES = "|".join(ATTR_OPTIONS + SHAPE_OPTIONS)
_STRING_KEYWORD = re.compile(rf"\b({_NAMES})=('[^']*')")
_ANY_KEYWORD = re.compile(rf"\b({_NAMES})=('[^']*'|\([\d, ]*\)|-?\d+)")
_SUGGESTION = re.compile(r"\bpass [^;:]*?(?=[;:]|\.\s|\.?$)")


def as_flags(message: str) -> str:
    """A library message in the command's language: ``data_format='NCX'`` becomes
    ``--data-format NCX``; in a suggestion (``pass strides=(2, 1)``) numbers too
    (``pass --strides 2,1``). Numbers that describe a call (``got groups=3``) stay."""
    def flag(match: re.Match) -> str:
        value = match.group(2).strip("'()").replace(" ", "")
        return f"--{match.group(1).replace('_', '-')} {value}"

    message = _SUGGESTION.sub(lambda m: _ANY_KEYWORD.sub(flag, m.group(0)), message)
    return _STRING_KEYWORD.sub(flag, message)


class UsageError(Exception):
    """A bad command line; reported as ``polyconv: error: ...``, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# --------------------------------------------------------------------------------------------
# argument types
# --------------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        msg = f"expected integers separated by ',' or 'x'; got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    return values


def shape_arg(text: str) -> tuple[int, ...]:
    """``8x32x32x64`` or ``8,32,32,64`` -> ``(8, 32, 32, 64)``."""
    return tuple(_int_list(text))


def ints_arg(text: str) -> int | tuple[int, ...]:
    """``2`` -> ``2`` (broadcast to every axis); ``2,1`` or ``2x1`` -> ``(2, 1)``."""
    values = _int_list(text)
    return values[0] if len(values) == 1 else tuple(values)


def dtypes_arg(text: str) -> tuple[str, ...]:
    out = []
    for part in text.split(","):
        name = _DTYPE_ALIASES.get(part.strip().lower())
        if name is None:
            msg = (f"unknown dtype {part.strip()!r}; accepted: float32, float16, bfloat16, "
                   f"float64 (or f32, f16, bf16, f64)")
            raise argparse.ArgumentTypeError(msg)
        out.append(name)
    return tuple(dict.fromkeys(out))


def list_arg(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def op_name(text: str) -> str:
    """An op as typed (``ConvTranspose``, ``convtranspose``, ``conv_transpose``) -> the polyconv
    function name."""
    return lookup(text).name


def display_name(name: str) -> str:
    """The oneDNN Graph name (or older-spec name) of a polyconv function name."""
    return spec(name).onednn


def add_shape_options(p: argparse.ArgumentParser, bias_shape: bool) -> None:
    g = p.add_argument_group("input shapes (NxHxWxC style; ',' works too)")
    g.add_argument("--src", type=shape_arg, metavar="SHAPE", help="src shape")
    g.add_argument("--weights", type=shape_arg, metavar="SHAPE",
                   help="weights shape, in --weights-format order")
    if bias_shape:
        g.add_argument("--bias", type=shape_arg, metavar="SHAPE", help="bias shape ([OC])")
    g.add_argument("--diff-dst", type=shape_arg, metavar="SHAPE", help="diff_dst shape")
    g.add_argument("--weights-shape", type=shape_arg, metavar="SHAPE",
                   help="weights_shape of the backward-weights ops (full or spatial only)")
    g.add_argument("--dst-shape", type=shape_arg, metavar="SHAPE",
                   help="dst_shape of ConvolutionBackwardData / ConvTranspose "
                        "(full or spatial only)")


def add_attr_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("attributes (an int is broadcast; lists as 2,1 or 2x1)")
    for name in ("strides", "pads_begin", "pads_end", "dilations", "output_padding"):
        g.add_argument("--" + name.replace("_", "-"), type=ints_arg, metavar="INTS")
    g.add_argument("--auto-pad", metavar="MODE",
                   help="none, same_upper, same_lower or valid")
    g.add_argument("--groups", type=int, metavar="G")
    g.add_argument("--data-format", metavar="FMT",
                   help="NXC (default) or NCX; also spelt NHWC, NCHW, NCDHW, ...")
    g.add_argument("--weights-format", metavar="FMT",
                   help="XIO, OIX, IOX or XOI; also spelt HWIO, OIHW, IOHW, HWOI, ...")


def attrs_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ATTR_OPTIONS if getattr(args, k) is not None}


def flag(role: str) -> str:
    return "--" + role.replace("_", "-")


def shape_inputs(name: str, given: dict[str, Any], attrs: dict[str, Any]):
    """The user's shapes as the op's positional inputs (``dst_shape`` of ConvTranspose is a
    keyword); nothing is derived."""
    kind, positional = spec(name).kind, spec(name).positional
    attrs = dict(attrs)
    if kind == "conv_transpose" and "dst_shape" in given:
        attrs["dst_shape"] = given.pop("dst_shape")
    extra = [r for r in given if r not in positional]
    if extra:
        msg = (f"{display_name(name)} does not take {', '.join(map(flag, extra))} (its "
               f"inputs are {', '.join(map(flag, positional))}"
               f"{', --dst-shape' if kind == 'conv_transpose' else ''})")
        raise UsageError(msg)
    return {r: given.get(r) for r in positional}, attrs
