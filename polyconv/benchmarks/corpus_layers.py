"""The corpus's layers: convolutions of real public models, each with its source.

Sizes follow the published definitions (channels, kernel, stride, padding, dilation, groups,
layout); batches are sized for a small CPU. :mod:`polyconv.benchmarks.corpus` times them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polyconv


@dataclass(frozen=True)
class Layer:
    """One convolution of a public model: a polyconv op with its inputs' shapes."""

    model: str
    name: str
    op: str                        # "conv_transpose" or "convolution"
    src: tuple[int, ...]           # in the layer's data_format
    weights: tuple[int, ...]       # in the layer's weights_format
    attrs: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    source: str = ""

    @property
    def title(self) -> str:
        return f"{self.model}: {self.name}"

    @property
    def plan(self) -> polyconv.ConvPlan:
        return polyconv.infer_shape(self.op, self.src, self.weights, **self.attrs)

    @property
    def flops(self) -> float:
        """2 x multiply-adds of the canonical convolution."""
        return 2.0 * self.plan.macs


def _kernel(k, d: int) -> tuple[int, ...]:
    """A kernel's sizes: ``k`` as given (a tuple) or ``d`` times (a number)."""
    return tuple(k) if isinstance(k, tuple) else (k,) * d


def _ct(model, name, src, ic, oc, k, s, p, op=0, fmt="NXC", dtype="float32", source="",
        groups=1):
    """A ConvTranspose layer; weights in the framework's layout for ``fmt`` (torch's IOX for
    channels-first, Flax's XIO-like XOI for channels-last)."""
    d = len(src) - 1            # src: batch and spatial sizes
    og = oc // groups
    if fmt == "NCX":
        shape, wshape, wfmt = (src[0], ic, *src[1:]), (ic, og, *_kernel(k, d)), "IOX"
    else:
        shape, wshape, wfmt = (*src, ic), (*_kernel(k, d), og, ic), "XOI"
    return Layer(model, name, "conv_transpose", shape, wshape,
                 dict(strides=s, pads_begin=p, pads_end=p, output_padding=op, groups=groups,
                      data_format=fmt, weights_format=wfmt), dtype, source)


def _conv(model, name, src, ic, oc, k, s, p, groups=1, fmt="NXC", source="", wfmt=None,
          dilation=1):
    """A Convolution layer; weights in the framework's layout for ``fmt`` (torch's OIX for
    channels-first, Flax's XIO for channels-last) unless ``wfmt`` names one of the two."""
    d = len(src) - 1            # src: batch and spatial sizes
    shape = (src[0], ic, *src[1:]) if fmt == "NCX" else (*src, ic)
    wfmt = wfmt or ("OIX" if fmt == "NCX" else "XIO")
    ks = _kernel(k, d)
    wshape = {"OIX": (oc, ic // groups, *ks), "XIO": (*ks, ic // groups, oc)}[wfmt]
    return Layer(model, name, "convolution", shape, wshape,
                 dict(strides=s, pads_begin=p, pads_end=p, dilations=dilation, groups=groups,
                      data_format=fmt, weights_format=wfmt), "float32", source)


_DCGAN = "pytorch/examples dcgan/main.py Generator (nz=100, ngf=64, nc=3)"
_HIFI = "jik876/hifi-gan models.py Generator, config_v1.json (upsample 8,8,2,2; k 16,16,4,4)"
_UNET = "milesial/Pytorch-UNet unet_parts.py Up (bilinear=False), 256x256 input"
_JAX3D = "jax-ml/jax issue #31662 (equinox ConvTranspose, 3-D, 64->1)"
_NNUNET = "nnU-Net Generic_UNet 3-D transposed-conv upsampling (2x2x2, stride 2)"
_MONAI = "MONAI networks/nets/unet.py UNet up layer (3-D, kernel 3, stride 2)"
_NNUNET_CONV = ("nnU-Net Generic_UNet 3-D conv block (3x3x3, 32 features: the first stage), "
                "a 32x64x64 crop of its patch")
_RESNET = "torchvision resnet50 (Bottleneck 3x3 convolutions)"
_RESNET_STEM = "torchvision resnet50 (conv1: 7x7, stride 2, on the RGB image)"
_MBV2 = "torchvision mobilenet_v2 (InvertedResidual depthwise 3x3)"
_CONVNEXT = "facebookresearch/ConvNeXt models/convnext.py Block (ConvNeXt-T, 7x7 depthwise)"

_RESNET_1X1 = "torchvision resnet50 (Bottleneck 1x1 convolutions, and layer2's downsample)"
_RESNEXT = "torchvision resnext50_32x4d (layer1 Bottleneck 3x3: width 128, 32 groups)"
_RESNEXT101 = "torchvision resnext101_64x4d (layer1 Bottleneck 3x3: width 256, 64 groups of 4)"
_CENTERNET = ("xingyizhou/CenterNet pose_dla_dcn.py IDAUp up_i: ConvTranspose2d(o, o, 2f, "
              "stride=f, padding=f//2, groups=o), o = 64, DLA-34 on a 512x512 image")
_DEEPLAB = ("torchvision segmentation deeplabv3 ASPPConv (rate 12), at output stride 16 on a "
            "513x513 image as in the DeepLabV3 paper")
_WHISPER = "openai/whisper model.py AudioEncoder conv2 (tiny: n_state 384, 3000 mel frames)"
_VIT = "torchvision vit_b_16 conv_proj (16x16 patches, 768 features)"
_EFFNET = "torchvision efficientnet_b0 (stage 3 MBConv6 depthwise 5x5, stride 2, 144 channels)"
_WAV2VEC = "facebookresearch/fairseq wav2vec2 ConvFeatureExtractionModel (1 s of 16 kHz audio)"
_YOLO = "ultralytics/yolov5 v6 models/yolov5s.yaml first Conv (6x6, stride 2, 32 channels)"
_CYCLEGAN = ("junyanz/pytorch-CycleGAN-and-pix2pix networks.py ResnetGenerator upsampling "
             "(k3 s2 p1 output_padding 1), 256x256 image")
_MASKRCNN = "torchvision maskrcnn_resnet50_fpn MaskRCNNPredictor conv5_mask (32 RoIs)"
_WAVENET = ("ibab/tensorflow-wavenet / r9y9 wavenet_vocoder dilated causal conv (64 residual "
            "channels, gate and filter together, dilation 8), on its left-padded input")
_SDVAE = "CompVis/stable-diffusion Decoder mid-block ResnetBlock conv (512 channels, 32x32 latent)"
_STYLEGAN2 = ("NVlabs/stylegan2-ada-pytorch training/networks.py modulated_conv2d with "
              "fused_modconv: a batch of 4 as 4 groups of 512 channels, 3x3 at 16x16")
_INCEPTION = "torchvision inception_v3 InceptionC branch7x7 (17x17 grid, c7 = 128; 1x7 then 7x1)"
_CONFORMER = ("pytorch/audio torchaudio/models/conformer.py _ConvolutionModule depthwise conv "
              "(kernel 31, 256 channels), 512 frames")
_FCN = ("shelhamer/fcn.berkeleyvision.org voc-fcn8s upscore8 (Deconvolution 21->21, kernel 16, "
        "stride 8), padded 4 instead of cropped, 64x64 -> 512x512")
_PIX2PIX = ("junyanz/pytorch-CycleGAN-and-pix2pix networks.py UnetSkipConnectionBlock "
            "outermost upconv (128->3, k4 s2 p1), 256x256 image")
_MNIST = "pytorch/examples mnist/main.py Net conv1 (1->32, 3x3), batch 64"

LAYERS: tuple[Layer, ...] = (
    _ct("DCGAN G", "ConvT 512->256 k4 s2 4x4", (16, 4, 4), 512, 256, 4, 2, 1, source=_DCGAN),
    _ct("DCGAN G", "ConvT 256->128 k4 s2 8x8", (16, 8, 8), 256, 128, 4, 2, 1, source=_DCGAN),
    _ct("DCGAN G", "ConvT 128->64 k4 s2 16x16", (16, 16, 16), 128, 64, 4, 2, 1, source=_DCGAN),
    _ct("DCGAN G", "ConvT 64->3 k4 s2 32x32", (16, 32, 32), 64, 3, 4, 2, 1, source=_DCGAN),
    _ct("HiFi-GAN", "ConvT1d 512->256 k16 s8 NCX", (4, 32), 512, 256, 16, 8, 4, fmt="NCX",
        source=_HIFI),
    _ct("HiFi-GAN", "ConvT1d 256->128 k16 s8 NCX", (4, 256), 256, 128, 16, 8, 4, fmt="NCX",
        source=_HIFI),
    _ct("HiFi-GAN", "ConvT1d 128->64 k4 s2 NCX", (4, 2048), 128, 64, 4, 2, 1, fmt="NCX",
        source=_HIFI),
    _ct("U-Net", "ConvT 1024->512 k2 s2 16x16 NCX", (1, 16, 16), 1024, 512, 2, 2, 0,
        fmt="NCX", source=_UNET),
    _ct("U-Net", "ConvT 256->128 k2 s2 64x64 NCX", (1, 64, 64), 256, 128, 2, 2, 0, fmt="NCX",
        source=_UNET),
    _ct("U-Net", "ConvT 128->64 k2 s2 128x128 NCX", (1, 128, 128), 128, 64, 2, 2, 0,
        fmt="NCX", source=_UNET),
    _ct("3-D decoder", "ConvT3d 64->1 k3 s2 64x64x32 NCX", (1, 64, 64, 32), 64, 1, 3, 2, 1,
        op=1, fmt="NCX", source=_JAX3D),
    _ct("3-D decoder", "ConvT3d 64->1 k3 s2 64x64x32 NCX bf16", (1, 64, 64, 32), 64, 1, 3, 2,
        1, op=1, fmt="NCX", dtype="bfloat16", source=_JAX3D),
    _ct("nnU-Net 3-D", "ConvT3d 128->64 k2 s2 16x20x24", (1, 16, 20, 24), 128, 64, 2, 2, 0,
        source=_NNUNET),
    _ct("MONAI UNet", "ConvT3d 64->32 k3 s2 16^3", (1, 16, 16, 16), 64, 32, 3, 2, 1, op=1,
        source=_MONAI),
    _ct("CenterNet DLA-34", "depthwise ConvT 64 k4 s2 64x64 NCX", (4, 64, 64), 64, 64, 4, 2, 1,
        fmt="NCX", groups=64, source=_CENTERNET),
    _ct("CenterNet DLA-34", "depthwise ConvT 64 k8 s4 32x32 NCX", (4, 32, 32), 64, 64, 8, 4, 2,
        fmt="NCX", groups=64, source=_CENTERNET),
    _conv("ResNet-50", "Conv 3->64 k7 s2 224x224 (stem)", (4, 224, 224), 3, 64, 7, 2, 3,
          source=_RESNET_STEM),
    _conv("ResNet-50", "Conv 64->64 k3 s1 56x56", (4, 56, 56), 64, 64, 3, 1, 1,
          source=_RESNET),
    _conv("ResNet-50", "Conv 128->128 k3 s2 56x56", (4, 56, 56), 128, 128, 3, 2, 1,
          source=_RESNET),
    _conv("MobileNetV2", "depthwise 96 k3 s2 112x112", (8, 112, 112), 96, 96, 3, 2, 1,
          groups=96, source=_MBV2),
    _conv("MobileNetV2", "depthwise 144 k3 s1 56x56", (8, 56, 56), 144, 144, 3, 1, 1,
          groups=144, source=_MBV2),
    _conv("MobileNetV2", "depthwise 144 k3 s1 56x56 OIX weights", (8, 56, 56), 144, 144, 3, 1,
          1, groups=144, wfmt="OIX", source=_MBV2 + "; weights in PyTorch's layout, as a port "
          "of its checkpoint keeps them"),
    _conv("ConvNeXt-T", "depthwise 96 k7 s1 56x56", (8, 56, 56), 96, 96, 7, 1, 3,
          groups=96, source=_CONVNEXT),
    _conv("U-Net", "Conv 64->64 k3 s1 128x128 NCX", (1, 128, 128), 64, 64, 3, 1, 1,
          fmt="NCX", source=_UNET),
    _conv("nnU-Net 3-D", "Conv3d 32->32 k3 s1 32x64x64 NCX", (1, 32, 64, 64), 32, 32, 3, 1, 1,
          fmt="NCX", source=_NNUNET_CONV),
    _conv("ResNet-50", "Conv 1x1 256->64 56x56", (4, 56, 56), 256, 64, 1, 1, 0,
          source=_RESNET_1X1),
    _conv("ResNet-50", "Conv 1x1 s2 256->512 56x56 (downsample)", (4, 56, 56), 256, 512, 1, 2,
          0, source=_RESNET_1X1),
    _conv("ResNeXt-50", "grouped 128->128 k3 g32 56x56", (4, 56, 56), 128, 128, 3, 1, 1,
          groups=32, source=_RESNEXT),
    _conv("ResNeXt-101 64x4d", "grouped 256->256 k3 g64 56x56", (4, 56, 56), 256, 256, 3, 1,
          1, groups=64, source=_RESNEXT101),
    _conv("DeepLabV3", "ASPP 2048->256 k3 d12 33x33", (1, 33, 33), 2048, 256, 3, 1, 12,
          dilation=12, source=_DEEPLAB),
    _conv("Whisper-tiny", "Conv1d 384->384 k3 s2 NCX", (1, 3000), 384, 384, 3, 2, 1, fmt="NCX",
          source=_WHISPER),
    _conv("ViT-B/16", "patch embedding 3->768 k16 s16 224x224", (4, 224, 224), 3, 768, 16, 16,
          0, source=_VIT),
    _conv("EfficientNet-B0", "depthwise 144 k5 s2 56x56", (8, 56, 56), 144, 144, 5, 2, 2,
          groups=144, source=_EFFNET),
    _conv("wav2vec 2.0", "Conv1d 1->512 k10 s5 NCX", (2, 16000), 1, 512, 10, 5, 0, fmt="NCX",
          source=_WAV2VEC),
    _conv("wav2vec 2.0", "Conv1d 512->512 k3 s2 NCX", (2, 3199), 512, 512, 3, 2, 0, fmt="NCX",
          source=_WAV2VEC),
    _conv("YOLOv5s", "Conv 3->32 k6 s2 640x640", (1, 640, 640), 3, 32, 6, 2, 2, source=_YOLO),
    _ct("CycleGAN", "ConvT 256->128 k3 s2 op1 64x64 NCX", (1, 64, 64), 256, 128, 3, 2, 1, op=1,
        fmt="NCX", source=_CYCLEGAN),
    _ct("Mask R-CNN", "ConvT 256->256 k2 s2 14x14 NCX", (32, 14, 14), 256, 256, 2, 2, 0,
        fmt="NCX", source=_MASKRCNN),
    _conv("WaveNet", "Conv1d 64->128 k2 d8 NCX", (4, 16008), 64, 128, 2, 1, 0, fmt="NCX",
          dilation=8, source=_WAVENET),
    _conv("SD VAE", "Conv 512->512 k3 32x32 NCX", (1, 32, 32), 512, 512, 3, 1, 1, fmt="NCX",
          source=_SDVAE),
    _conv("StyleGAN2", "modulated Conv 4x512 groups k3 16x16 NCX", (1, 16, 16), 2048, 2048,
          3, 1, 1, groups=4, fmt="NCX", source=_STYLEGAN2),
    _conv("Inception-v3", "Conv 1x7 128->128 17x17", (8, 17, 17), 128, 128, (1, 7), 1,
          (0, 3), source=_INCEPTION),
    _conv("Inception-v3", "Conv 7x1 128->192 17x17 NCX", (8, 17, 17), 128, 192, (7, 1), 1,
          (3, 0), fmt="NCX", source=_INCEPTION),
    _conv("Conformer", "depthwise Conv1d 256 k31 NCX", (4, 512), 256, 256, 31, 1, 15,
          groups=256, fmt="NCX", source=_CONFORMER),
    _ct("FCN-8s", "ConvT 21->21 k16 s8 64x64 NCX", (1, 64, 64), 21, 21, 16, 8, 4, fmt="NCX",
        source=_FCN),
    _ct("pix2pix", "ConvT 128->3 k4 s2 128x128 NCX", (1, 128, 128), 128, 3, 4, 2, 1,
        fmt="NCX", source=_PIX2PIX),
    _conv("MNIST CNN", "Conv 1->32 k3 28x28 NCX", (64, 28, 28), 1, 32, 3, 1, 0, fmt="NCX",
          source=_MNIST),
)
