"""A tiny pi0 written in LeRobot's layout, shared by the pi0 tests (and tests/e2e/test_pi0_openpi.py)."""

from __future__ import annotations

import os

import torch

from models.policy.pi0.config import GemmaSpec, Pi0Config, VisionSpec
from models.policy.pi0.layout import write_checkpoint, write_tokenizer
from models.policy.pi0.weights import build_random

CORPUS = ["pick up the red block", "stack the blocks", "open the drawer", "put the cup on the plate", "go", "warm up"]

TINY = Pi0Config(
    image_features=("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb"),
    state_feature="observation.state", state_dim=5, action_dim=4,
    image_resolution=(28, 28), chunk_size=6, max_state_dim=8, max_action_dim=8, num_inference_steps=3,
    tokenizer_max_length=12,
    vlm=GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16),
    expert=GemmaSpec(width=16, depth=2, mlp_dim=32, num_heads=2, num_kv_heads=1, head_dim=16),
    vision=VisionSpec(hidden=24, intermediate=48, layers=2, heads=2, patch=14),
    vocab_size=96,
)


def write_tiny(folder: str, cfg: Pi0Config = TINY, seed: int = 0, expert_head: bool = True) -> torch.nn.Module:
    model = build_random(cfg, device=torch.device("cpu"), dtype=torch.float32, seed=seed)
    # Gemma's norms start at zero (scale 1); random offsets make the test see them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
    write_checkpoint(folder, model, expert_head=expert_head)
    write_tokenizer(folder, CORPUS, vocab_size=cfg.vocab_size)
    return model
