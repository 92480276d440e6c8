"""Wan's CLIP image encoder (open-clip XLM-RoBERTa ViT-H/14, vision tower only), one
definition for the Wan models that condition on an image (DreamZero, Matrix-Game 2.0), in
the names of upstream's ``CLIPModel.model`` with a ``model.`` prefix (DreamZero's checkpoint
stores them under ``action_head.image_encoder.``; Wan's
``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`` without the prefix)::

    model.log_scale                                   (CLIP's logit scale; loaded, unused)
    model.visual.patch_embedding.weight               conv 3 -> 1280, 14x14, no bias
    model.visual.cls_embedding, .pos_embedding        [1, 1, 1280], [1, 257, 1280]
    model.visual.pre_norm.{weight,bias}
    model.visual.transformer.N.{norm1,attn.to_qkv,attn.proj,norm2,mlp.0,mlp.2}.{weight,bias}
    model.visual.post_norm.{weight,bias}, model.visual.head     (loaded, unused: see below)

Upstream encodes a frame with ``visual(x, use_31_block=True)``: every transformer block
but the last, no post norm, so the image context is ``[rows, 257, 1280]``. Sizes come from
the shapes; the head count is the width over ViT-H/14's head width of 80 (one head below).
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

HEAD_WIDTH = 80
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_LAYER = re.compile(r"model\.visual\.transformer\.(\d+)\.")


class ClipError(ValueError):
    """Weights that are not this encoder's (names the first name or shape off)."""


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class _Block(nn.Module):
    def __init__(self, dim: int, mlp: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _Visual(nn.Module):
    def __init__(self, dim: int, patch: int, grid: int, layers: int, mlp: int, out_dim: int) -> None:
        super().__init__()
        self.patch, self.image_size = patch, patch * grid
        self.patch_embedding = nn.Conv2d(3, dim, patch, stride=patch, bias=False)
        self.cls_embedding = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, grid * grid + 1, dim))
        self.pre_norm = nn.LayerNorm(dim, eps=1e-5)
        self.transformer = nn.Sequential(*(_Block(dim, mlp, max(1, dim // HEAD_WIDTH)) for _ in range(layers)))
        self.post_norm = nn.LayerNorm(dim, eps=1e-5)
        self.head = nn.Parameter(torch.zeros(dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_embedding.expand(x.shape[0], -1, -1).to(x.dtype), x], 1)
        x = self.pre_norm(x + self.pos_embedding.to(x.dtype))
        return self.transformer[:-1](x)          # upstream's use_31_block: the penultimate block


class _Clip(nn.Module):
    def __init__(self, visual: _Visual) -> None:
        super().__init__()
        self.visual = visual
        self.log_scale = nn.Parameter(torch.zeros(()))


class WanImageEncoder(nn.Module):
    """``encode(frames)``: frames ``[R, 3, H, W]`` in [-1, 1] -> ``[R, 1 + grid^2, width]``."""

    def __init__(self, dim: int, patch: int, grid: int, layers: int, mlp: int, out_dim: int) -> None:
        super().__init__()
        self.model = _Clip(_Visual(dim, patch, grid, layers, mlp, out_dim))

    @torch.no_grad()
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        v = self.model.visual
        x = F.interpolate(frames.float(), size=(v.image_size, v.image_size), mode="bicubic", align_corners=False)
        mean = torch.tensor(CLIP_MEAN, device=x.device)[:, None, None]
        std = torch.tensor(CLIP_STD, device=x.device)[:, None, None]
        x = ((x * 0.5 + 0.5) - mean) / std
        return v(x.to(v.patch_embedding.weight.dtype))


_TOP = ("model.log_scale", "model.visual.patch_embedding.weight", "model.visual.cls_embedding",
        "model.visual.pos_embedding", "model.visual.pre_norm.weight", "model.visual.pre_norm.bias",
        "model.visual.post_norm.weight", "model.visual.post_norm.bias", "model.visual.head")
_PER_LAYER = tuple(f"{m}.{p}" for m in ("norm1", "attn.to_qkv", "attn.proj", "norm2", "mlp.0", "mlp.2")
                   for p in ("weight", "bias"))


def expected_names(found: set[str]) -> set[str]:
    """Every name a tower with as many blocks as ``found`` names must have."""
    layers = {int(m.group(1)) for n in found if (m := _LAYER.match(n))}
    return set(_TOP) | {f"model.visual.transformer.{i}.{p}" for i in range(max(layers, default=-1) + 1)
                        for p in _PER_LAYER}


def build_image_encoder(weights: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> WanImageEncoder:
    """The encoder holding exactly ``weights``; an unknown or missing name, or another shape,
    fails naming it (``ClipError``)."""
    try:
        dim, _, patch, _ = weights["model.visual.patch_embedding.weight"].shape
        tokens = weights["model.visual.pos_embedding"].shape[1]
        mlp = weights["model.visual.transformer.0.mlp.0.weight"].shape[0]
        out_dim = weights["model.visual.head"].shape[1]
    except KeyError as e:
        raise ClipError(f"image encoder: missing key {e.args[0]!r}") from None
    grid = math.isqrt(tokens - 1)
    layers = len({int(m.group(1)) for n in weights if (m := _LAYER.match(n))})
    with torch.device("meta"):
        enc = WanImageEncoder(dim, patch, grid, layers, mlp, out_dim)
    params = dict(enc.named_parameters())
    unknown, missing = sorted(set(weights) - set(params)), sorted(set(params) - set(weights))
    if unknown or missing:
        raise ClipError(f"image encoder: missing {missing[:5]}, unknown {unknown[:5]}")
    enc = enc.to_empty(device=device).to(dtype)
    params = dict(enc.named_parameters())
    with torch.no_grad():
        for n, t in weights.items():
            if params[n].shape != t.shape:
                raise ClipError(f"image encoder: {n} has shape {tuple(t.shape)}, "
                                      f"expected {tuple(params[n].shape)}")
            params[n].copy_(t)
    return enc.eval()
