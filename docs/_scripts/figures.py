"""Figures of the semantics guide, drawn from polyconv's own geometry at build time.

Every size and pad in these pictures comes from :func:`polyconv.infer_shape`, so the figures
cannot drift from the code. ``python docs/_scripts/figures.py OUTDIR`` writes the PNG files;
``docs/conf.py`` calls :func:`main` before each build.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

import polyconv

KEPT, CROPPED, BIAS_ONLY, PAD = "#4c72b0", "#d9d9d9", "#f2c45a", "#eeeeee"

# A 1-D ConvTranspose: src of 3 positions, kernel 3, stride 2 (NXC, 1 channel in and out).
B, K, S = 3, 3, 2
TCONV_ROWS = [
    {"auto_pad": "none"},
    {"auto_pad": "none", "pads_begin": 1, "pads_end": 1},
    {"auto_pad": "none", "pads_begin": 1, "pads_end": 1, "output_padding": 1},
    {"auto_pad": "valid"},
    {"auto_pad": "valid", "output_padding": 1},
    {"auto_pad": "same_upper"},
    {"auto_pad": "same_upper", "output_padding": 1},
    {"auto_pad": "same_lower"},
    {"auto_pad": "same_lower", "output_padding": 1},
]


def _label(attrs: dict) -> str:
    parts = [f"auto_pad={attrs['auto_pad']!r}"]
    if attrs["auto_pad"] == "none":
        parts.append(f"pads={attrs.get('pads_begin', 0)},{attrs.get('pads_end', 0)}")
    if attrs.get("output_padding"):
        parts.append(f"output_padding={attrs['output_padding']}")
    return ", ".join(parts)


def conv_transpose_figure(path: Path) -> None:
    """Where each auto_pad and output_padding crop or extend a strided ConvTranspose."""
    full = S * (B - 1) + K  # positions that receive products, before any crop
    products = [0] * full
    for b in range(B):
        for k in range(K):
            products[b * S + k] += 1
    plans = [polyconv.infer_shape("ConvTranspose", (1, B, 1), (K, 1, 1), strides=S, **a)
             for a in TCONV_ROWS]
    width = max(full, *(p.pads_begin[0] + p.shape[1] for p in plans))
    fig, ax = plt.subplots(figsize=(10, 0.55 * (len(plans) + 2)))
    # the src row and the full product range
    y0 = len(plans) + 0.6
    for b in range(B):
        ax.add_patch(Rectangle((b * S, y0), 1, 0.8, color="#55a868"))
        ax.text(b * S + 0.5, y0 + 0.4, f"x{b}", ha="center", va="center", color="white")
    ax.text(-0.3, y0 + 0.4, f"src (size {B}) lands at y*stride", ha="right", va="center")
    for row, (attrs, plan) in enumerate(zip(TCONV_ROWS, plans)):
        y = len(plans) - 1 - row
        start, size = plan.pads_begin[0], plan.shape[1]
        for i in range(width):
            inside = start <= i < start + size
            has_products = i < full
            color = (KEPT if inside and has_products else BIAS_ONLY if inside
                     else CROPPED if has_products else None)
            if color is None:
                continue
            ax.add_patch(Rectangle((i, y), 1, 0.8, color=color, ec="white"))
            if has_products:
                ax.text(i + 0.5, y + 0.4, str(products[i]), ha="center", va="center",
                        color="white" if inside else "#777777", fontsize=8)
        ax.text(-0.3, y + 0.4, _label(attrs), ha="right", va="center", fontsize=9)
        ax.text(width + 0.3, y + 0.4,
                f"pads ({plan.pads_begin[0]}, {plan.pads_end[0]}) -> dst size {size}",
                ha="left", va="center", fontsize=9)
    ax.set_xlim(-11, width + 7)
    ax.set_ylim(-0.4, len(plans) + 1.6)
    ax.axis("off")
    ax.legend(handles=[Patch(color=KEPT, label="dst position (number of products)"),
                       Patch(color=CROPPED, label="cropped by pads_begin / pads_end"),
                       Patch(color=BIAS_ONLY, label="added by output_padding, no product")],
              loc="lower center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False,
              fontsize=9)
    ax.set_title(f"ConvTranspose, src size {B}, kernel {K}, stride {S}: full transposed "
                 f"range {full} positions", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# A 1-D Convolution: src of 7 positions, kernel 4, stride 2.
A, KC, SC = 7, 4, 2
CONV_ROWS = [{"auto_pad": "valid"}, {"auto_pad": "none", "pads_begin": 1, "pads_end": 2},
             {"auto_pad": "same_upper"}, {"auto_pad": "same_lower"}]


def convolution_figure(path: Path) -> None:
    """Where each auto_pad puts the zero padding of a strided Convolution."""
    plans = [polyconv.infer_shape("Convolution", (1, A, 1), (KC, 1, 1), strides=SC, **a)
             for a in CONV_ROWS]
    left = max(p.pads_begin[0] for p in plans)
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(plans) + 0.6))
    for row, (attrs, plan) in enumerate(zip(CONV_ROWS, plans)):
        y = (len(plans) - 1 - row) * 1.6
        pb, pe, out = plan.pads_begin[0], plan.pads_end[0], plan.shape[1]
        for i in range(-pb, A + pe):
            color = PAD if (i < 0 or i >= A) else KEPT
            ax.add_patch(Rectangle((left + i, y + 0.6), 1, 0.8, color=color, ec="white"))
            ax.text(left + i + 0.5, y + 1.0, "0" if color == PAD else f"x{i}", ha="center",
                    va="center", fontsize=8, color="#777777" if color == PAD else "white")
        for o in range(out):  # each output's window, one line per output
            start = left + o * SC - pb
            yy = y + 0.45 - 0.12 * o
            ax.plot([start + 0.1, start + KC - 0.1], [yy, yy], color="#c44e52", lw=2)
            ax.text(start + KC - 0.05, yy, f"y{o}", fontsize=7, va="center")
        ax.text(-0.3, y + 1.0, _label(attrs), ha="right", va="center", fontsize=9)
        ax.text(left + A + max(p.pads_end[0] for p in plans) + 2.2, y + 1.0,
                f"pads ({pb}, {pe}) -> dst size {out}", ha="left", va="center", fontsize=9)
    ax.set_xlim(-11, left + A + 12)
    ax.set_ylim(-0.2, 1.6 * len(plans))
    ax.axis("off")
    ax.set_title(f"Convolution, src size {A}, kernel {KC}, stride {SC}: zero padding (grey) "
                 f"and the window of each output (red)", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(outdir: str | Path) -> list[Path]:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [outdir / "conv_transpose_pads.png", outdir / "convolution_pads.png"]
    conv_transpose_figure(paths[0])
    convolution_figure(paths[1])
    return paths


if __name__ == "__main__":
    print("\n".join(map(str, main(sys.argv[1] if len(sys.argv) > 1 else "."))))
