"""LingBot-World v2 (``robbyant/lingbot-world-v2-14b-causal-fast-diffusers``), served from a
local checkpoint in the diffusers layout.

    config.py            LingBotTransformerConfig: the checkpoint's transformer config (defaults = 14B)
    transformer.py       CausalLingBotWorldTransformer3DModel: checkpoint names, fused self-attn q/k/v
    attention.py         BlockKV: one block's self-attention over kv/ pages, text K/V in cross slots
    cache.py             the kv/ geometry (sink 9 + 6 rolling + block 3) and a pool for it
    weights.py           shard-by-shard strict loading, the diffusers-layout transformer writer
    checkpoint.py        the checkpoint folder: validated at start, components loaded
    options.py           the entry's opt-in shortcuts (steps, reuse_kv, fp8, decoder, size), checked first
    fp8.py               e4m3 linear layers with per-row scales (torch._scaled_mm or emulated)
    decoders.py          the block decoder: the Wan VAE or TAEHV, and what each takes
    camera.py            key steps, intrinsics, frame-wise relative poses, Plücker rays
    controls.py          lingbot.camera_actions.v1 / lingbot.camera_trajectory.v1 reducers
    trajectory_files.py  named trajectories below a trusted root, loaded as untrusted input
    vae_io.py            Wan VAE: first-image condition, latent statistics
    pipeline.py          LingBotPipeline: sessions, one block per call (1..4 DMD steps), streaming decode
    adapter.py           LingBotWorld: the pipeline behind the world seam; ``build`` below
    tiny_checkpoint.py   a tiny random checkpoint in the exact layout (tests)
    MODEL_CARD.md        what the model is, deviations, licences (weights: CC BY-NC-SA 4.0)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build(path: str | None, options: Any) -> "LingBotWorld":  # noqa: F821 - imported below
    """The factory entry: ``realtime serve --models 'lingbot=DIR[?key=value&...]'``.

    ``options`` (``models.factory.BuildOptions``) has ``device``, ``max_batch``,
    ``frames_per_chunk``, ``gpu_memory_fraction``, ``trajectory_root``,
    ``height``/``width`` (None: 480x832) and ``model_options``, the entry's shortcuts
    (``options.py``: steps, reuse_kv, fp8, decoder, size). The shortcuts are checked first,
    then the checkpoint, then a TAEHV file, before any weight of the checkpoint loads;
    on CUDA the resident session count comes from kv capacity planning at
    ``gpu_memory_fraction`` of the memory free after the weights (FP8 ones included).

    In a process group of several ranks (``realtime serve --sequence-parallel N``) every rank
    builds the model and runs its forwards on a share of the tokens (``models/world/parallel``):
    the heads must divide by N (checked before any weight loads), each rank plans capacity
    for its heads' share of the K/V, and the ranks keep the smallest count any of them found.
    """
    import torch

    from kv import plan_capacity
    from models.world.lingbot.adapter import LingBotWorld
    from models.world.lingbot.cache import kv_geometry
    from models.world.lingbot.checkpoint import load_components, validate_checkpoint
    from models.world.lingbot.config import VAE_SPATIAL_STRIDE
    from models.world.lingbot.decoders import taehv_decoder, wan_decoder
    from models.world.lingbot.fp8 import quantize_linears
    from models.world.lingbot.options import parse_options
    from models.world.lingbot.pipeline import DEFAULT_SIZE, LingBotPipeline
    from models.world.parallel.ulysses import Ulysses, check_heads, per_rank_geometry

    shortcuts = parse_options(getattr(options, "model_options", ()) or ())
    if not path:
        raise ValueError("lingbot needs a checkpoint folder (--models lingbot=DIR, the diffusers "
                         "layout of robbyant/lingbot-world-v2-14b-causal-fast-diffusers)")
    if getattr(options, "steps", None) is not None:
        # --steps is the maze's; a lingbot block's steps are an option of its own entry.
        raise ValueError(f"lingbot takes its denoising steps from its entry (lingbot=DIR?steps=N, "
                         f"N in 1..4), not --steps {options.steps}")
    validate_checkpoint(path)
    sp = Ulysses.from_default_group()
    if sp is not None:
        import json

        from models.world.lingbot.config import LingBotTransformerConfig

        config = json.loads((Path(path) / "transformer" / "config.json").read_text())
        check_heads(LingBotTransformerConfig.from_config(config).num_attention_heads, sp.size)
    root = getattr(options, "trajectory_root", None)
    if root is not None and not Path(root).is_dir():
        raise ValueError(f"trajectory root {root}: not a folder")
    device = torch.device(getattr(options, "device", None) or "cpu")
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    height, width = shortcuts.size or (getattr(options, "height", None) or DEFAULT_SIZE[0],
                                       getattr(options, "width", None) or DEFAULT_SIZE[1])
    max_batch = max(1, int(getattr(options, "max_batch", 1) or 1))
    taehv = None
    if shortcuts.taehv is not None:   # a few MB, read before the checkpoint's GBs
        try:
            taehv = taehv_decoder(shortcuts.taehv, device)
        except ValueError as e:   # names the file and the first tensor off the taew2_1 layout
            raise ValueError(f"option decoder: {e}") from None
    progress = getattr(options, "progress", None)
    components = load_components(path, device, dtype, progress=progress)
    if progress is not None:
        progress("building")
    if shortcuts.fp8:
        quantize_linears(components.transformer, shortcuts.fp8)   # the bf16 layers are dropped
        if cuda:
            torch.cuda.empty_cache()   # so the capacity plan below sees their memory free
    decoder = taehv or wan_decoder(components.vae)
    cfg = components.transformer.config
    fpc = getattr(options, "frames_per_chunk", None)
    if fpc not in (None, 4 * cfg.num_frames_per_block):
        raise ValueError(f"lingbot makes {4 * cfg.num_frames_per_block} frames per chunk (one block), "
                         f"got frames_per_chunk={fpc}")
    sessions = max_batch
    if cuda:
        lh, lw = height // VAE_SPATIAL_STRIDE, width // VAE_SPATIAL_STRIDE
        g = kv_geometry(cfg, lh, lw, dtype=torch.bfloat16,
                        model_state_bytes=decoder.streaming.state_bytes(1, lh, lw))
        if sp is not None:
            g = per_rank_geometry(g, sp.size)
        plan = plan_capacity(g, available_bytes=torch.cuda.mem_get_info(device)[0],
                             fraction=getattr(options, "gpu_memory_fraction", 0.9) or 0.9,
                             requested_sessions=max_batch, ticks_in_flight=max_batch)
        sessions = plan.capacity if sp is None else sp.smallest(plan.capacity, device)
    pipeline = LingBotPipeline(components, height=height, width=width, max_sessions=sessions,
                               device=device, steps=shortcuts.steps, reuse_kv=shortcuts.reuse_kv,
                               decoder=decoder, sequence_parallel=sp)
    return LingBotWorld(pipeline, max_batch=min(max_batch, sessions), checkpoint=path,
                        trajectory_root=getattr(options, "trajectory_root", None), shortcuts=shortcuts)
