"""The Wan2.1 VAE from its original names (Wan's ``VideoVAE_``: ``encoder``, ``decoder``,
``conv1``, ``conv2``) into ``diffusers.AutoencoderKLWan``, the class the project's streaming
decoder (``wan_vae.py``), LingBot-World, Matrix-Game 2.0 and DreamZero use.

diffusers' own single-file loader converts the original names
(``convert_wan_vae_to_diffusers``: ``encoder.downsamples.N`` -> ``encoder.down_blocks.N``,
``decoder.upsamples.N`` grouped into ``up_blocks``, ``conv1``/``conv2`` -> the quant convs);
applied to ``{name: name}`` it is the name map itself. Its decoder grouping assumes
Wan2.1's structure (4 stages, 2 residual blocks each), which is therefore fixed here: only
the widths (``base_dim``, read from ``encoder.conv1.weight``) and ``z_dim`` vary, so a tiny
checkpoint's VAE is Wan2.1's network at width 4.

``wan_vae_names`` lists the original names of that structure (194 at any width), for the
tiny writers and the tests. Errors are ``WanVaeError`` (a ``ValueError``); a model's
checkpoint loader turns them into its own error type.
"""

from __future__ import annotations

import torch

DIM_MULT = (1, 2, 4, 4)
NUM_RES_BLOCKS = 2
TEMPORAL_DOWNSAMPLE = (False, True, True)


class WanVaeError(ValueError):
    """The VAE's weights do not fit Wan2.1's structure (the message names the tensor)."""


def _residual(prefix: str, shortcut: bool) -> list[str]:
    names = [f"{prefix}.residual.0.gamma", f"{prefix}.residual.2.weight", f"{prefix}.residual.2.bias",
             f"{prefix}.residual.3.gamma", f"{prefix}.residual.6.weight", f"{prefix}.residual.6.bias"]
    return names + ([f"{prefix}.shortcut.weight", f"{prefix}.shortcut.bias"] if shortcut else [])


def _middle(prefix: str) -> list[str]:
    return (_residual(f"{prefix}.middle.0", False)
            + [f"{prefix}.middle.1.{n}" for n in ("norm.gamma", "to_qkv.weight", "to_qkv.bias",
                                                  "proj.weight", "proj.bias")]
            + _residual(f"{prefix}.middle.2", False))


def _stages(prefix: str, dims: list[int], res_blocks: int, temporal: tuple[bool, ...],
            halved: tuple[int, ...] = ()) -> list[str]:
    """A stack of stages (``encoder.downsamples``, ``decoder.upsamples``), numbered on through
    it: stage ``s`` is ``res_blocks`` residual blocks from ``dims[s]`` to ``dims[s + 1]``
    channels (half the first for a stage in ``halved``), then, but after the last stage, a
    resample (with a time conv where ``temporal[s]``)."""
    names: list[str] = []
    i = 0
    for stage, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        a = a // 2 if stage in halved else a
        for r in range(res_blocks):
            names += _residual(f"{prefix}.{i}", r == 0 and a != b)
            i += 1
        if stage != len(DIM_MULT) - 1:
            names += [f"{prefix}.{i}.resample.1.weight", f"{prefix}.{i}.resample.1.bias"]
            if temporal[stage]:
                names += [f"{prefix}.{i}.time_conv.weight", f"{prefix}.{i}.time_conv.bias"]
            i += 1
    return names


def wan_vae_names() -> list[str]:
    """The original Wan2.1 VAE tensor names (Wan's ``VideoVAE_``: encoder, decoder, conv1, conv2)."""
    names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
             "encoder.conv1.weight", "encoder.conv1.bias"]
    names += _stages("encoder.downsamples", [1, *DIM_MULT], NUM_RES_BLOCKS, TEMPORAL_DOWNSAMPLE)
    names += _middle("encoder") + ["encoder.head.0.gamma", "encoder.head.2.weight", "encoder.head.2.bias"]
    names += ["decoder.conv1.weight", "decoder.conv1.bias"] + _middle("decoder")
    # An upsample halves the channels before the next stage; the decoder has one more block a stage.
    names += _stages("decoder.upsamples", [DIM_MULT[-1], *DIM_MULT[::-1]], NUM_RES_BLOCKS + 1,
                     TEMPORAL_DOWNSAMPLE[::-1], halved=(1, 2, 3))
    names += ["decoder.head.0.gamma", "decoder.head.2.weight", "decoder.head.2.bias"]
    return names


def diffusers_names(names) -> dict[str, str]:
    """Original name -> diffusers name, by diffusers' own converter."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    converted = convert_wan_vae_to_diffusers({n: n for n in names})
    return {orig: new for new, orig in converted.items()}


def make_vae(base_dim: int, z_dim: int):
    """An ``AutoencoderKLWan`` of Wan2.1's structure at width ``base_dim`` (random weights)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=base_dim, z_dim=z_dim, dim_mult=list(DIM_MULT), num_res_blocks=NUM_RES_BLOCKS,
                            attn_scales=[], temperal_downsample=list(TEMPORAL_DOWNSAMPLE))


def build_vae(weights: dict[str, torch.Tensor], device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32):
    """An ``AutoencoderKLWan`` holding exactly ``weights`` (original names); an unknown or
    missing name, or another shape, fails naming it (``WanVaeError``)."""
    expected = set(wan_vae_names())
    unknown, missing = sorted(set(weights) - expected), sorted(expected - set(weights))
    if unknown or missing:
        raise WanVaeError(f"vae: missing {missing[:5]}, unknown {unknown[:5]}")
    base_dim = weights["encoder.conv1.weight"].shape[0]
    z_dim = weights["conv2.weight"].shape[0]
    vae = make_vae(base_dim, z_dim)
    if dtype != torch.float32:
        vae = vae.to(dtype)
    params = dict(vae.named_parameters())
    names = diffusers_names(weights)
    if set(names.values()) != set(params):
        raise WanVaeError(f"vae: names do not match AutoencoderKLWan: "
                          f"{sorted(set(params) ^ set(names.values()))[:5]}")
    with torch.no_grad():
        for n, t in weights.items():
            p = params[names[n]]
            if p.shape != t.shape:
                raise WanVaeError(f"vae: {n} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
            p.copy_(t)
    return vae.to(device).eval()
