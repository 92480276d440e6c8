"""DreamZero-DROID (``GEAR-Dreams/DreamZero-DROID``): a world-action model served as a policy.

    config.py           DreamZeroConfig: config.json's action_head_cfg (defaults = the 14B DROID model)
    mask.py             the block-causal mask of a training sequence, drawn and tested
    model.py            DreamZeroDiT: the Wan2.1-I2V DiT with 24 action + 1 state tokens a chunk
    scheduler.py        16-step UniPC (flow shift 5) as upstream builds it; the 8-step DiT cache
    window.py           which frames a call writes and denoises; the window restart every 4 calls
    denoise.py          write_frames (t = 0 K/V pass) and denoise_chunk (CFG on video only)
    text_encoder.py     umt5-xxl from Wan's names into transformers' UMT5EncoderModel
    image_encoder.py    Wan's CLIP ViT-H/14 vision tower (penultimate block, 257 tokens)
    vae.py              the Wan2.1 VAE (builder in models/world/wan_vae_build.py), latents normalised
    checkpoint.py       the folder: shards + index, every tensor consumed, metadata.json exposed
    observation.py      DROID cameras stitched, state/action normalisation, the prompt template
    conditioning.py     the frames a call uses, the first-frame condition (CLIP + y), frames to latents
    options.py          the entry's options: tokenizer=PATH, step_cache=1, sessions=N, kv_gib, host_gib,
                        cfg_parallel=1
    cache.py            the kv/ geometry (two branches, sink 1 + window 6), SessionState (cross K/V
                        and y, model-owned), PagedRows (the DiT's self-attention on the pool)
    adapter.py          DreamZeroPolicy: sessions in kv/'s pool with LRU swap and admission
    tiny_checkpoint.py  a tiny random checkpoint in the exact layout, and a tiny tokenizer (tests)

``build(path, options)`` is the factory (``realtime serve --policy 'dreamzero=DIR?tokenizer=TOK'``;
see MODEL_CARD.md).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def load_policy(path: str, tokenizer: str, *, device: str = "cpu", sessions: int | None = None,
                step_cache: bool = False, max_batch: int | None = None, name: str = "dreamzero",
                progress: Any = None, kv_budget_bytes: int | None = None,
                host_budget_bytes: int | None = None, gpu_memory_fraction: float = 0.9,
                split: Any = None) -> Any:
    """The checkpoint folder ``path`` and the umt5 tokenizer folder ``tokenizer`` as a
    ``DreamZeroPolicy`` (bf16 on CUDA, float32 on CPU; the VAE float32). The KV pool is planned
    after the weights are on the device (``adapter.DreamZeroPolicy``). ``split``: this rank's
    share of a process group (``models.world.parallel``: ``Ulysses`` or ``CfgSplit``), or None."""
    from pathlib import Path

    import torch
    from transformers import T5TokenizerFast

    from models.policy.dreamzero.adapter import DreamZeroPolicy
    from models.policy.dreamzero.checkpoint import load_checkpoint
    from models.policy.dreamzero.options import DEFAULT_HOST_GIB, DEFAULT_SESSIONS

    if not Path(tokenizer).is_dir():
        raise FileNotFoundError(f"{tokenizer}: not a folder (expected the umt5-xxl tokenizer)")
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    on_shard = None
    if progress is not None:
        on_shard = lambda i, n, file: progress("reading checkpoint", i + 1, n)  # noqa: E731
    ckpt = load_checkpoint(path, dev, dtype, on_shard=on_shard)
    tok = T5TokenizerFast.from_pretrained(tokenizer, local_files_only=True)
    host = int(DEFAULT_HOST_GIB * (1 << 30)) if host_budget_bytes is None else host_budget_bytes
    policy = DreamZeroPolicy(ckpt, tok, sessions=sessions or DEFAULT_SESSIONS, step_cache=step_cache,
                             max_batch=max_batch, name=name, kv_budget_bytes=kv_budget_bytes,
                             host_budget_bytes=host, gpu_memory_fraction=gpu_memory_fraction, split=split)
    log.info("dreamzero: serving %s on %s (%d sessions resident at most, %s DiT steps)", path, dev,
             policy.capacity, "8 of 16" if step_cache else "16")
    return policy


def build(path: str | None, options: Any) -> Any:
    """Factory-table entry ``dreamzero``:
    ``dreamzero=DIR?tokenizer=TOK[&step_cache=1][&sessions=N][&kv_gib=X][&host_gib=X][&cfg_parallel=1]``.

    In a process group of several ranks (``realtime serve --sequence-parallel N``) every rank
    builds the policy and runs each forward over the group: Ulysses (the heads must divide by
    N, checked before any weight loads), or with ``cfg_parallel=1`` on exactly 2 ranks one CFG
    branch a rank (``models/world/parallel``)."""
    from models.policy.dreamzero.checkpoint import CheckpointError, read_config
    from models.policy.dreamzero.options import OptionError, parse_options
    from models.world.parallel.cfg import BRANCHES, CfgSplit
    from models.world.parallel.ulysses import Ulysses, check_heads

    opts = parse_options(getattr(options, "model_options", ()))
    if not path:
        raise CheckpointError("dreamzero needs its checkpoint folder: dreamzero=/path/to/DreamZero-DROID?tokenizer=...")
    split = Ulysses.from_default_group()
    if opts.cfg_parallel:
        if split is None or split.size != BRANCHES:
            raise OptionError(f"option cfg_parallel=1 runs the {BRANCHES} CFG branches on {BRANCHES} ranks: "
                              f"serve with --sequence-parallel {BRANCHES}"
                              + ("" if split is None else f", not {split.size}"))
        split = CfgSplit(split.rank, split.size)
    elif split is not None:
        check_heads(read_config(path).num_heads, split.size)
    return load_policy(path, opts.tokenizer, device=str(getattr(options, "device", "cpu") or "cpu"),
                       sessions=opts.sessions, step_cache=opts.step_cache,
                       max_batch=getattr(options, "max_batch", None), progress=getattr(options, "progress", None),
                       kv_budget_bytes=opts.kv_budget_bytes or getattr(options, "kv_budget_bytes", None),
                       host_budget_bytes=opts.host_budget_bytes,
                       gpu_memory_fraction=getattr(options, "gpu_memory_fraction", 0.9), split=split)
