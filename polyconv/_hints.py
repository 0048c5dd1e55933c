"""The fixes that refusals name: how to rewrite an ``output_padding`` that another library
accepts, how to cast inputs of two dtypes. Each
returns the clause a message ends with (docs/semantics.md#validation), in words that do not
depend on the backend.
"""

from __future__ import annotations


def output_padding_rewrite(output_padding: tuple[int, ...], strides: tuple[int, ...],
                           pads_end: tuple[int, ...], auto_pad: str) -> str:
    """How to say an ``output_padding >= stride`` (PyTorch allows up to ``max(stride,
    dilation) - 1``) in polyconv: only ``pads_end - output_padding`` changes the values, so
    the excess comes off both where ``pads_end`` has it (docs/porting.md); where it has not,
    the positions past the products receive only the bias, and are appended after the call."""
    if auto_pad != "none":
        return ("polyconv (like oneDNN) needs output_padding < stride; with auto_pad the "
                "pads are computed, so pass the pads explicitly (auto_pad='none') and see "
                "the rewrite in the porting guide (docs/porting.md, PyTorch)")
    excess = tuple(max(o - s + 1, 0) for o, s in zip(output_padding, strides))
    if all(e <= p for e, p in zip(excess, pads_end)):
        pe = tuple(p - e for p, e in zip(pads_end, excess))
        op = tuple(o - e for o, e in zip(output_padding, excess))
        return ("polyconv (like oneDNN) needs output_padding < stride, but only pads_end - "
                "output_padding changes the result (docs/porting.md, PyTorch): for the same "
                f"result pass pads_end={pe}, output_padding={op}")
    op = tuple(o - e for o, e in zip(output_padding, excess))
    return ("polyconv (like oneDNN) needs output_padding < stride, and pads_end="
            f"{pads_end} has too little to take the excess {excess} from (only pads_end - "
            "output_padding changes the result, docs/porting.md): pass "
            f"output_padding={op} and append {excess} positions at the end of each spatial "
            "axis of the result, holding the bias (zeros without one): they receive no product")


def cast_hint(dtypes: dict[str, str]) -> str:
    """How to give every input one dtype, in words every array library shares (the message
    is the same on every backend): the others to the data's dtype (the one a layer computes
    in), or the data to the others'."""
    first = next(iter(dtypes))
    odd = [n for n, d in dtypes.items() if d != dtypes[first]]
    others = " and ".join(odd)
    return (f"cast {others} to {dtypes[first]} ({first}'s dtype) to compute in "
            f"{dtypes[first]}, or {first} to {dtypes[odd[0]]}, before the call (numpy and JAX: "
            f".astype(dtype); PyTorch: .to(dtype))")
