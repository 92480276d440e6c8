"""Native pi0 serving LeRobot's ``lerobot/pi0_base`` folder layout (see MODEL_CARD.md).

``build(path, options)`` is the factory: ``path`` is the checkpoint folder
(config.json, model.safetensors, tokenizer.json; optional normaliser files) and
``options`` any object with ``device``, ``max_batch``, ``steps`` and
``gpu_memory_fraction`` (``frames_per_chunk`` is for world models and unused here),
plus an optional ``image_key_map`` (client key -> checkpoint camera feature) and an
optional ``compile`` (False: CUDA graphs over the eager layers; see runner.py).
"""

from __future__ import annotations

import logging
from typing import Any

from models.policy.pi0.config import CheckpointError, Pi0Config, load_config, parse_config

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "Pi0Config", "build", "load_policy", "parse_config"]


def load_policy(path: str, *, device: str = "cpu", max_batch: int = 32, steps: int | None = None,
                image_key_map: dict[str, str] | None = None, gpu_memory_fraction: float | None = None,
                name: str = "pi0", use_graphs: bool | None = None, compile: bool | None = None,
                weight_stream: bool = True) -> Any:
    """The checkpoint folder ``path`` as a ``Pi0Policy`` (bf16 on CUDA, float32 on CPU).

    ``use_graphs`` / ``compile``: None is the default of the device (CUDA graphs of the whole
    call with compiled layers on CUDA, eager on CPU); see runner.py. ``weight_stream=False``: ``F.linear``
    for every Gemma matmul (no skinny_linear.py weight stream), the benchmarks' cuBLAS baseline."""
    import torch

    from models.policy.pi0.inputs import ACTION_STATS_GLOB, STATE_STATS_GLOB, PromptTokenizer, load_stats
    from models.policy.pi0.policy import Pi0Policy
    from models.policy.pi0.weights import build_empty, load_weights

    cfg = load_config(path)
    dev = torch.device(device)
    if dev.type == "cuda" and gpu_memory_fraction:
        torch.cuda.set_per_process_memory_fraction(float(gpu_memory_fraction), dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tokenizer = PromptTokenizer(path, cfg.tokenizer_max_length)
    model = build_empty(cfg)
    load_weights(model, path, device=dev, dtype=dtype)
    policy = Pi0Policy(
        model, tokenizer,
        state_stats=load_stats(path, STATE_STATS_GLOB, cfg.state_feature, cfg.state_norm, cfg.state_dim),
        action_stats=load_stats(path, ACTION_STATS_GLOB, "action", cfg.action_norm, cfg.action_dim),
        device=dev, max_batch=max_batch, steps=steps, image_key_map=image_key_map, name=name, use_graphs=use_graphs,
        compile=compile, weight_stream=weight_stream,
    )
    if dev.type == "cuda":
        policy.warmup()
    log.info("pi0: serving %s on %s (max_batch %d, %d steps, cameras %s)", path, dev, max_batch, policy.steps,
             list(policy.client_keys))
    return policy


def build(path: str | None, options: Any) -> Any:
    """Factory-table entry ``pi0``: ``realtime serve --policy pi0=/path/to/pi0_base``."""
    if not path:
        raise CheckpointError("pi0 needs its checkpoint folder: pi0=/path/to/pi0_base (LeRobot's layout)")
    return load_policy(
        path,
        device=str(getattr(options, "device", "cpu") or "cpu"),
        max_batch=int(getattr(options, "max_batch", None) or 32),
        steps=getattr(options, "steps", None),
        image_key_map=getattr(options, "image_key_map", None),
        gpu_memory_fraction=getattr(options, "gpu_memory_fraction", None),
        compile=getattr(options, "compile", None),
    )
