"""A tiny pi0 written in LeRobot's layout, shared by the pi0 tests (and tests/e2e/test_pi0_openpi.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run_interpreted(code: str, min_triton: tuple[int, int] = (3, 9)) -> dict:
    """Run ``code`` under the Triton interpreter (a subprocess: TRITON_INTERPRET must be set
    before triton is imported) and return the JSON its last line prints; skips the test without
    Triton, or with a Triton older than ``min_triton``, whose interpreter cannot run these kernels."""
    import pytest

    triton = pytest.importorskip("triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < min_triton:
        # Measured on the H200 host: Triton 3.6's interpreter fails on a loop's bounds ("only
        # 0-dimensional arrays can be converted to Python scalars"), while the compiled
        # kernels there match the torch paths (test_pi0_cuda.py).
        pytest.skip(f"the interpreter of Triton {triton.__version__} cannot run this kernel")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
