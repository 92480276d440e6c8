#!/usr/bin/env python3
"""DreamZero-DROID at full size on one GPU: every GPU goal of issue 48 in one script.

    python3 -m bench.policy.bench_dreamzero --out /tmp/out/dreamzero.json             # GPU, all sections
    python3 -m bench.policy.bench_dreamzero --only served robots --out /tmp/out/s.json
    python3 -m bench.policy.bench_dreamzero --tiny --device cpu --out /tmp/dz.json     # CPU smoke test

The policy is ``models.policy.dreamzero.adapter.DreamZeroPolicy``, the class ``realtime serve
--models dreamzero=DIR`` serves, over a ``Checkpoint`` of random weights built on the device:
the DiT at the released DROID sizes (``config.DROID``: Wan2.1-I2V-14B, dim 5120, 40 layers, 40
heads, FFN 13,824, 36 input channels, patch 1x2x2; 24 action + 1 state tokens a chunk) in bf16;
the Wan2.1 VAE at its real config (base_dim 96, z 16) in float32, as ``load_policy`` loads it;
a CLIP ViT-H/14 vision tower at its real sizes (1280 wide, 32 blocks, 257 tokens) in bf16; and,
unless ``--text-encoder full``, a umt5 stand-in of the real output width (4096; one layer
instead of 24, a 30-piece vocabulary) so that the 14B DiT and four robots' K/V fit beside it on
an 80 GB card (the full umt5-xxl encoder is 5.7 B parameters, 11.4 GB; it runs once per prompt,
and the cross-attention over its 512 padded tokens costs the same either way). The tokenizer is
the tiny checkpoint's; the normalisation statistics are the tiny checkpoint's ``oxe_droid``
ones. ``--tiny`` loads the tiny checkpoint with DROID's action register (``config.TINY_DROID``)
written in the published layout, through ``load_policy``, for a CPU smoke test.

Sections, in the order they run (``--only`` picks some; each rewrites the JSON when it ends
and is skipped when it would start after ``--budget-s``):

``arithmetic``  the FLOPs of one denoising step for one robot counted from the geometry served
                (2 CFG branches x the chunk's tokens through every linear layer, self-attention
                over the held window and the chunk, cross-attention over text and image tokens),
                of the ``t = 0`` pass and of a window restart's cross K/V, per call over the
                window's 4-call cycle; the bf16 matrix rate measured on the device (large square
                products and the served shapes) and the copy bandwidth; the roofline time per
                chunk for the exact 16 steps and for the step cache (8 DiT steps); the same
                count at DROID's full size (a model on ``meta``) beside it.
``bare``        one robot's 24-action chunks through ``run_batch`` + ``end_tick`` (the engine's
                call), without a server: the process's first call (cold), then per schedule
                (``--schedules``: exact 16 steps, step cache) a new session's first call and ``--calls - 1``
                steady calls (every 4th restarts the window); per call the DiT time (synchronised
                around each forward), the DiT FLOPs, TFLOP/s and the fraction of the measured
                matrix rate; the transformer time against the roofline.
``memory``      a steady session's bytes (both branches' held pages and the model-owned state)
                measured from the tensors vs ``kv.session_bytes``; a swap round trip to the host
                (``PagedKVCache.swap_out/swap_in`` and the state, as ``Residency`` moves them);
                the resident sessions ``kv.plan_capacity`` fits at 0.9 of this device's memory
                after the weights, and with the host swap budget; the formula at full size for
                an 80 and a 141 GiB card.
``served``      a real uvicorn server on loopback and one robot through the real
                ``openpi_client.websocket_client_policy.WebsocketClientPolicy`` in a process of
                its own (DROID observations, its ``session_id``), with the step cache (upstream's
                default; ``--served-schedule``): first call and steady chunk latency end to end,
                served / bare.
``robots``      ``--robots`` robots at once (as many as the pool holds resident, when fewer fit:
                an 80 GB card holds 2): each alone (bare, one at a time: the reference), all in
                one batched call (bare; these two run before the server starts), and all through
                the server at once; aggregate chunks/s against what the roofline allows, p50/p99
                per robot, robots per DiT forward (the robots of an engine batch share every
                denoising forward, whatever their window positions), and each robot's actions against its chunks alone
                (the noise is fixed: seed 1140).

Progress goes to stderr; the JSON (``--out``) holds the command, the machine and versions.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bench.machine import GIB, device_memory, environment
from bench.policy.dreamzero_robots import droid_obs, drive, session_id
from bench.sections import Sections
from bench.timing import mean, med, p99, sync
from kv import session_bytes
from realtime.server.inventory import on_spent_thread

SECTIONS = ("arithmetic", "bare", "memory", "served", "robots")
START = time.perf_counter()
PATH = "/v1/realtime/robot/openpi"
SCHEDULES = ("exact", "step_cache")
# DROID's stitched frame (352 x 640) in latents, and umt5-xxl / CLIP ViT-H parameter counts for
# the weights of the full-size formula.
DROID_LATENT_HW = (44, 80)
UMT5_XXL_ENCODER_PARAMS = 5_680_000_000
CLIP_VIT_H_PARAMS = 632_000_000


def log(msg: str) -> None:
    print(f"[bench_dreamzero {time.perf_counter() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (rates on a CPU run are tiny, on a GPU large)."""
    return float(f"{x:.{digits}g}")


# ------------------------------------------------------------------ environment
# The packages whose versions a run records.
PACKAGES = ("torch", "diffusers", "transformers", "numpy", "uvicorn", "starlette", "websockets", "openpi-client",
            "triton")


def parameter_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


# ------------------------------------------------------------------ build
@torch.no_grad()
def init_random_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter in place: matrices N(0, 0.5/fan_in) (the action MLPs' ``W [1, in, out]``
    by their ``in``), modulation tables N(0, 1/dim), biases 0, norm gains 1: activations stay
    finite through 40 layers, and speed does not depend on the values."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("modulation"):
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
        elif name.endswith(".W"):
            p.normal_(0.0, math.sqrt(0.5 / p.shape[1]), generator=gen)
        elif name.endswith("bias") or name.endswith(".b"):
            p.zero_()
        elif p.ndim >= 2:
            p.normal_(0.0, math.sqrt(0.5 / math.prod(p.shape[1:])), generator=gen)
        else:
            p.fill_(1.0)


def on_device(module_fn: Callable[[], torch.nn.Module], device: torch.device, dtype: torch.dtype,
              seed: int) -> torch.nn.Module:
    """``module_fn()`` built on ``meta``, allocated once on ``device`` in ``dtype`` (no host copy), random."""
    with torch.device("meta"):
        m = module_fn()
    m = m.to(dtype).to_empty(device=device)
    init_random_(m, seed)
    return m.eval().requires_grad_(False)


def text_encoder(full: bool, vocab: int, device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    """umt5-xxl's encoder (``full``: 24 layers, its 256,384-piece vocabulary) or its stand-in:
    the same width (4096), heads and FFN, one layer, ``vocab`` pieces."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(vocab_size=256_384 if full else vocab, d_model=4096, d_kv=64, d_ff=10_240,
                        num_layers=24 if full else 1, num_heads=64, relative_attention_num_buckets=32,
                        relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
                        layer_norm_epsilon=1e-6, is_encoder_decoder=False)
    m = on_device(lambda: UMT5EncoderModel(config), device, dtype, seed)
    m.tie_weights()
    return m


def random_checkpoint(args: argparse.Namespace, device: torch.device, tokenizer: Any) -> Any:
    """A ``Checkpoint`` of random weights at full size on ``device`` (module docstring)."""
    from models.policy.dreamzero.checkpoint import Checkpoint
    from models.policy.dreamzero.config import DROID
    from models.policy.dreamzero.image_encoder import WanImageEncoder
    from models.policy.dreamzero.model import DreamZeroDiT
    from models.policy.dreamzero.tiny_checkpoint import tiny_metadata
    from models.policy.dreamzero.vae import make_vae

    dtype = torch.bfloat16
    dit = on_device(lambda: DreamZeroDiT(DROID), device, dtype, args.seed)
    text = text_encoder(args.text_encoder == "full", len(tokenizer), device, dtype, args.seed + 1)
    image = on_device(lambda: WanImageEncoder(dim=1280, patch=14, grid=16, layers=args.clip_layers, mlp=5120,
                                              out_dim=1024), device, dtype, args.seed + 2)
    torch.manual_seed(args.seed)
    with torch.device(device):
        vae = make_vae(base_dim=96, z_dim=16)
    vae = vae.eval().requires_grad_(False)
    return Checkpoint(DROID, dit, text, image, vae, tiny_metadata(), Path("random-weights"))


def build(args: argparse.Namespace, device: torch.device) -> tuple[Any, dict[str, Any]]:
    from models.policy.dreamzero import load_policy
    from models.policy.dreamzero.adapter import DreamZeroPolicy
    from models.policy.dreamzero.config import TINY_DROID
    from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint, write_tiny_tokenizer

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    host = int(args.host_gib * GIB)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dreamzero_bench_") as tmp:
        tok_dir = write_tiny_tokenizer(Path(tmp) / "tok")
        if args.tiny:
            ckpt_dir = write_tiny_checkpoint(Path(tmp) / "ckpt", cfg=TINY_DROID)
            policy = load_policy(str(ckpt_dir), str(tok_dir), device=str(device), sessions=args.sessions,
                                 max_batch=args.sessions, host_budget_bytes=host)
            after_weights = device_memory(device)
        else:
            from transformers import T5TokenizerFast

            tok = T5TokenizerFast.from_pretrained(str(tok_dir), local_files_only=True)
            ckpt = random_checkpoint(args, device, tok)
            sync(device)
            after_weights = device_memory(device)
            policy = DreamZeroPolicy(ckpt, tok, sessions=args.sessions, max_batch=args.sessions,
                                     host_budget_bytes=host, gpu_memory_fraction=args.fraction)
    sync(device)
    ck, cfg = policy.ckpt, policy.cfg
    info = {
        "build_s": round(time.perf_counter() - t0, 2), "dtype": str(next(ck.dit.parameters()).dtype).replace("torch.", ""),
        "transformer_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
        "transformer_params": sum(p.numel() for p in ck.dit.parameters()),
        "transformer_bytes": parameter_bytes(ck.dit), "text_encoder_bytes": parameter_bytes(ck.text_encoder),
        "image_encoder_bytes": parameter_bytes(ck.image_encoder), "vae_bytes": parameter_bytes(ck.vae),
        "frame_hw": list(policy.frame_hw), "tokens_per_latent_frame": policy.geometry.tokens_per_frame,
        "tokens_per_chunk": cfg.num_frame_per_block * policy.geometry.tokens_per_frame + cfg.register_tokens,
        "window_latent_frames": cfg.local_attn_size, "sessions_requested": args.sessions,
        "resident_sessions": policy.capacity, "max_batch": policy.max_batch,
        "pool_blocks": policy.plan.num_blocks, "pool_required_bytes": policy.plan.required_bytes,
        "host_budget_bytes": host, "memory_after_weights": after_weights, "memory_after_pool": device_memory(device),
        "weights": ("the tiny checkpoint (config.TINY_DROID) in the published layout, through load_policy"
                    if args.tiny else
                    "random, built on the device: DiT at DROID's full size (Wan2.1-I2V-14B dims) in bf16; Wan2.1 VAE "
                    f"at its real config in float32; CLIP ViT-H/14 tower 1280 wide, 257 tokens, {args.clip_layers} "
                    "blocks in bf16; text encoder "
                    + ("umt5-xxl's full encoder (24 layers)" if args.text_encoder == "full" else
                       "a umt5 stand-in of the real output width 4096 (1 layer, 30-piece vocabulary), so the 14B DiT "
                       "and the robots' K/V fit beside it")
                    + "; the tiny checkpoint's tokenizer and oxe_droid statistics"),
    }
    return policy, info


# ------------------------------------------------------------------ arithmetic
def linear_weights(module: torch.nn.Module) -> int:
    """Multiply-adds per token through every ``nn.Linear`` and action-MLP matrix of ``module``."""
    from models.policy.dreamzero.model import CategorySpecificLinear

    n = 0
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            n += m.in_features * m.out_features
        elif isinstance(m, CategorySpecificLinear):
            n += m.W.shape[1] * m.W.shape[2]
    return n


def dit_counts(dit: Any) -> dict[str, int]:
    """Per-token multiply-adds of each part of the DiT (``meta`` models count too)."""
    cfg = dit.config
    cross_kv = sum(linear_weights(getattr(b.cross_attn, n)) for b in dit.blocks for n in ("k", "v", "k_img", "v_img"))
    return {
        "blocks": linear_weights(dit.blocks) - cross_kv,     # self q k v o, cross q o, FFN: every chunk token
        "time": linear_weights(dit.time_embedding) + linear_weights(dit.time_projection),   # per token (its t)
        "patch": dit.patch_embedding.weight[0].numel() * cfg.dim,                          # per video token
        "head": linear_weights(dit.head),                                                  # per video token
        "action": linear_weights(dit.action_encoder) + linear_weights(dit.action_decoder),  # per action token
        "state": linear_weights(dit.state_encoder),                                        # per state token
        "cross_kv": cross_kv,                          # per text/image token, once per window (restart)
        "text_embedding": linear_weights(dit.text_embedding), "img_emb": linear_weights(dit.img_emb),
    }


def forward_flops(cfg: Any, counts: dict[str, int], video_tokens: int, register: bool, keys_video: int,
                  image_tokens: int, rows: int) -> dict[str, int]:
    """FLOPs (2 per multiply-add) of one DiT forward of ``rows`` rows: the linear layers over the
    chunk's tokens, self-attention over ``keys_video`` video keys (held + chunk) and the chunk's
    register keys, cross-attention over the text and image tokens."""
    reg = cfg.register_tokens if register else 0
    L = video_tokens + reg
    linear = L * (counts["blocks"] + counts["time"]) + video_tokens * (counts["patch"] + counts["head"])
    if register:
        linear += cfg.num_action_per_block * counts["action"] + cfg.num_state_per_block * counts["state"]
    self_attn = cfg.num_layers * 4 * L * (keys_video + reg) * cfg.dim
    cross = cfg.num_layers * 4 * L * (cfg.text_len + image_tokens) * cfg.dim
    per_row = {"linear": 2 * linear, "self_attention": self_attn, "cross_attention": cross}
    out = {k: rows * v for k, v in per_row.items()}
    out["total"] = sum(out.values())
    return out


def call_flops(cfg: Any, counts: dict[str, int], tokens_per_frame: int, image_tokens: int, plan: Any,
               dit_steps: int, robots: int = 1) -> dict[str, Any]:
    """One call's DiT FLOPs for ``robots`` robots (2 branches each) at the window position of ``plan``."""
    rows = 2 * robots
    write = forward_flops(cfg, counts, len(plan.write) * tokens_per_frame, False, plan.write.stop * tokens_per_frame,
                          image_tokens, rows)
    step = forward_flops(cfg, counts, len(plan.denoise) * tokens_per_frame, True, plan.denoise.stop * tokens_per_frame,
                         image_tokens, rows)
    context = 0
    if plan.restart:   # both branches' cross K/V of the new window (text and image tokens)
        context = 2 * rows * (cfg.text_len * (counts["text_embedding"] + counts["cross_kv"] // 2)
                              + image_tokens * (counts["img_emb"] + counts["cross_kv"] // 2))
    forwards = write["total"] + dit_steps * step["total"]
    return {"restart": plan.restart, "write_frames": [plan.write.start, plan.write.stop],
            "denoise_frames": [plan.denoise.start, plan.denoise.stop], "write_pass": write["total"],
            "denoise_step": step, "dit_steps": dit_steps, "forwards": forwards, "context": context,
            "total": forwards + context}


def window_cycle(cfg: Any) -> list[Any]:
    """The plans of a session's calls over one window cycle (a restart, then until the next one)."""
    from models.policy.dreamzero.window import plan_call

    plans, start = [plan_call(0, cfg, restart=True)], None
    start = plans[0].next_start
    while True:
        p = plan_call(start, cfg)
        if p.restart:
            return plans
        plans.append(p)
        start = p.next_start


def schedule_steps(schedule: str) -> int:
    from models.policy.dreamzero.scheduler import DIT_STEPS_8, NUM_STEPS

    return len(DIT_STEPS_8) if schedule == "step_cache" else NUM_STEPS


def geometry_flops(dit: Any, tokens_per_frame: int, image_tokens: int, robots: int = 1) -> dict[str, Any]:
    """Per schedule: each call of the window cycle and the cycle's mean FLOPs per chunk."""
    cfg = dit.config
    counts = dit_counts(dit)
    plans = window_cycle(cfg)
    out: dict[str, Any] = {"counts_per_token": counts, "tokens_per_latent_frame": tokens_per_frame,
                           "tokens_per_chunk_row": cfg.num_frame_per_block * tokens_per_frame + cfg.register_tokens,
                           "rows_per_robot": 2, "image_tokens": image_tokens, "text_tokens": cfg.text_len}
    steps = [call_flops(cfg, counts, tokens_per_frame, image_tokens, p, 1, robots)["denoise_step"] for p in plans]
    out["denoise_step_mean"] = {k: int(statistics.fmean(s[k] for s in steps)) for k in steps[0]}
    out["linear_params_per_token"] = counts["blocks"] + counts["time"]
    for schedule in SCHEDULES:
        calls = [call_flops(cfg, counts, tokens_per_frame, image_tokens, p, schedule_steps(schedule), robots)
                 for p in plans]
        out[schedule] = {"calls": calls, "per_chunk_mean": int(statistics.fmean(c["total"] for c in calls))}
    return out


def matmul_rate(device: torch.device, shapes: list[tuple[int, int, int]], seconds: float = 1.0) -> list[dict[str, Any]]:
    """TFLOP/s of ``[M, K] @ [K, N]`` in the model's dtype (bf16 on CUDA, float32 on CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = []
    for M, K, N in shapes:
        a = torch.randn(M, K, device=device, dtype=dtype)
        b = torch.randn(K, N, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        sync(device)
        n, t0 = 0, time.perf_counter()
        while True:
            for _ in range(4):
                a @ b
            n += 4
            sync(device)
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        out.append({"m": M, "k": K, "n": N, "tflop_per_s": sig(2 * M * K * N * n / dt / 1e12)})
        del a, b
    return out


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second a device-to-device copy moves (read + write counted)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(device)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.5 or n < 3:
        y.copy_(x)
        n += 1
        sync(device)
    return 2 * nbytes * n / (time.perf_counter() - t0)


def arithmetic(policy: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from models.policy.dreamzero.config import DROID, IMAGE_TOKENS
    from models.policy.dreamzero.model import DreamZeroDiT

    cuda = device.type == "cuda"
    shapes = ([(8192, 8192, 8192), (3570, 5120, 5120), (3570, 5120, 13824), (3570, 13824, 5120),
               (14280, 5120, 13824)] if cuda else [(512, 512, 512)])
    rates = matmul_rate(device, shapes, seconds=1.0 if cuda else 0.1)
    peak = max(r["tflop_per_s"] for r in rates)
    bw = copy_bandwidth(device, (512 if cuda else 64) << 20)   # the pool holds most of the memory by now
    served = geometry_flops(policy.ckpt.dit, policy.geometry.tokens_per_frame,
                            policy.ckpt.image_encoder.get_parameter("model.visual.pos_embedding").shape[1])
    with torch.device("meta"):
        full_dit = DreamZeroDiT(DROID)
    tpf = DROID.tokens_per_frame(*DROID_LATENT_HW)
    full = geometry_flops(full_dit, tpf, IMAGE_TOKENS)
    dit_bytes = parameter_bytes(policy.ckpt.dit)
    full_bytes = sum(p.numel() for p in full_dit.parameters()) * 2

    def roofline(g: dict[str, Any], weights: int) -> dict[str, Any]:
        out: dict[str, Any] = {"denoise_step_tflop": sig(g["denoise_step_mean"]["total"] / 1e12)}
        for schedule in SCHEDULES:
            s = g[schedule]
            forwards = schedule_steps(schedule) + 1
            out[schedule] = {
                "chunk_tflop": sig(s["per_chunk_mean"] / 1e12),
                "roofline_chunk_s": sig(s["per_chunk_mean"] / (peak * 1e12)),
                "roofline_chunk_s_per_call": [sig(c["total"] / (peak * 1e12)) for c in s["calls"]],
                "weight_reads_s": sig(forwards * weights / bw),
                "chunks_per_s_per_gpu": sig(peak * 1e12 / s["per_chunk_mean"])}
        return out

    result = {
        "matmul": rates, "matmul_tflop_per_s": peak, "copy_bandwidth_gb_per_s": sig(bw / 1e9),
        "dtype": "bfloat16" if cuda else "float32",
        "served_geometry": {**served, "roofline": roofline(served, dit_bytes), "dit_bytes": dit_bytes},
        "droid_full_size": {**full, "roofline": roofline(full, full_bytes), "dit_bytes": full_bytes},
        "convention": "2 FLOP per multiply-add; per chunk: the t = 0 pass + the DiT steps run (16, or 8 with the "
                      "step cache) + on a restart both branches' cross K/V; attention 4 L K d per layer and row; "
                      "the VAE encode, CLIP and umt5 are not counted; the roofline divides by the largest "
                      "measured matmul rate",
    }
    fs = result["droid_full_size"]["roofline"]["step_cache"]["roofline_chunk_s"]
    result["goal_0_8_s"] = ("within the roofline" if fs <= 0.8 else
                            f"beyond the roofline: upstream's default schedule needs {fs:.3f} s of bf16 matmul "
                            f"at {peak} TFLOP/s per chunk on this device; the roofline goal holds instead")
    log(f"matmul {peak} TFLOP/s, copy {result['copy_bandwidth_gb_per_s']} GB/s; DROID step "
        f"{result['droid_full_size']['roofline']['denoise_step_tflop']} TFLOP, roofline per chunk: exact "
        f"{result['droid_full_size']['roofline']['exact']['roofline_chunk_s']} s, step cache {fs} s")
    return result


# ------------------------------------------------------------------ calls
class Clock:
    """The DiT's forward timed (synchronised before and after) while ``on``, its rows always;
    ``infer_batch`` always: per call its robots and milliseconds (the engine's view when served)."""

    def __init__(self, policy: Any, device: torch.device) -> None:
        self.on = False
        self.seconds, self.forwards = 0.0, 0
        self.batches: list[tuple[int, float]] = []
        self.rows: list[int] = []          # rows of every DiT forward (2 per robot: the CFG branches)
        dit = policy.ckpt.dit
        fwd, infer = dit.forward, policy.infer_batch

        def timed(*a: Any, **k: Any) -> Any:
            self.rows.append(int(a[0].shape[0]))
            if not self.on:
                return fwd(*a, **k)
            sync(device)
            t0 = time.perf_counter()
            try:
                return fwd(*a, **k)
            finally:
                sync(device)
                self.seconds += time.perf_counter() - t0
                self.forwards += 1

        def infer_batch(works: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return infer(works)
            finally:
                self.batches.append((len(works), 1e3 * (time.perf_counter() - t0)))

        dit.forward = timed
        policy.infer_batch = infer_batch


def make_work(sid: str, k: int, obs: dict[str, Any]) -> Any:
    from models.policy.base import PolicyWork
    from models.policy.dreamzero.observation import METADATA
    from protocols.openpi import validate_observation

    return PolicyWork(sid, f"{sid}:{k}", validate_observation(obs, METADATA))


def obs_for(robot: int, call: int, args: argparse.Namespace) -> dict[str, Any]:
    from models.policy.dreamzero.observation import METADATA

    return droid_obs(robot, call, METADATA.image_keys, METADATA.image_resolution, seed=args.seed)


def bare_call(policy: Any, clock: Clock, sids: list[str], robots: list[int], k: int, args: argparse.Namespace,
              device: torch.device) -> dict[str, Any]:
    """One engine call of ``robots`` (their call ``k``) as sessions ``sids``, committed."""
    works = [make_work(sid, k, obs_for(r, k, args)) for sid, r in zip(sids, robots)]
    s0, f0 = clock.seconds, clock.forwards
    sync(device)
    t0 = time.perf_counter()
    results = policy.run_batch(works)
    sync(device)
    ms = 1e3 * (time.perf_counter() - t0)
    for sid in sids:
        policy.end_tick(sid, True)
    return {"ms": ms, "dit_ms": 1e3 * (clock.seconds - s0), "dit_forwards": clock.forwards - f0,
            "actions": [r.actions for r in results]}


def episode(policy: Any, clock: Clock, robot: int, calls: int, tag: str, args: argparse.Namespace,
            device: torch.device) -> list[dict[str, Any]]:
    """One robot alone for ``calls`` calls (a new session, dropped at the end)."""
    sid = session_id(robot, tag)
    try:
        return [bare_call(policy, clock, [sid], [robot], k, args, device) for k in range(calls)]
    finally:
        policy.drop_session(sid)


def per_call_flops(policy: Any, schedule: str, calls: int, robots: int = 1) -> list[dict[str, Any]]:
    """The DiT FLOPs of a session's calls 0..calls-1 (the window cycle repeated)."""
    cfg, dit = policy.cfg, policy.ckpt.dit
    counts = dit_counts(dit)
    image_tokens = policy.ckpt.image_encoder.get_parameter("model.visual.pos_embedding").shape[1]
    plans = window_cycle(cfg)
    return [call_flops(cfg, counts, policy.geometry.tokens_per_frame, image_tokens, plans[k % len(plans)],
                       schedule_steps(schedule), robots) for k in range(calls)]


def set_schedule(policy: Any, schedule: str) -> None:
    from models.policy.dreamzero.scheduler import DIT_STEPS_8

    policy.dit_steps = DIT_STEPS_8 if schedule == "step_cache" else None


def latency_summary(ms: list[float], restarts: list[bool]) -> dict[str, Any]:
    """Steady calls: all, the continuing ones and the restarting ones."""
    cont = [m for m, r in zip(ms, restarts) if not r]
    rest = [m for m, r in zip(ms, restarts) if r]
    return {"steady_ms_mean": mean(ms), "steady_ms_median": med(ms), "steady_ms_p99": p99(ms),
            "continuing_ms_median": med(cont), "restarting_ms_median": med(rest)}


def bare(policy: Any, clock: Clock, args: argparse.Namespace, device: torch.device, rate: float | None,
         result: dict[str, Any], budget_ok: Callable[[str], bool], save: Callable[[], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": args.calls, "how": "run_batch + end_tick of one robot, no server; the DiT "
                           "synchronised around each forward"}
    result["bare"] = out
    clock.on = True
    try:
        cold = episode(policy, clock, 0, 1, "cold", args, device)[0]
        out["cold_first_call_ms"] = round(cold["ms"], 3)
        log(f"bare: the process's first call {cold['ms']:.1f} ms")
        for schedule in args.schedules:
            if not budget_ok(f"bare[{schedule}]"):
                break
            set_schedule(policy, schedule)
            calls = episode(policy, clock, 0, args.calls, f"bare-{schedule}", args, device)
            flops = per_call_flops(policy, schedule, args.calls)
            rows = []
            for c, f in zip(calls, flops):
                rows.append({"ms": round(c["ms"], 3), "dit_ms": round(c["dit_ms"], 3), "dit_forwards": c["dit_forwards"],
                             "restart": f["restart"], "dit_tflop": sig(f["forwards"] / 1e12, 6),
                             "call_tflop": sig(f["total"] / 1e12, 6),
                             "dit_tflop_per_s": sig(f["forwards"] / 1e12 / (c["dit_ms"] / 1e3)) if c["dit_ms"] else None})
            steady = rows[1:]
            dit_s = sum(r["dit_ms"] for r in steady) / 1e3
            tflop = sum(r["dit_tflop"] for r in steady)        # the forwards the clock timed
            call_tflop = sum(r["call_tflop"] for r in steady)  # and a restart's cross K/V
            s: dict[str, Any] = {"first_call_ms": rows[0]["ms"], "rows": rows,
                                 **latency_summary([r["ms"] for r in steady], [r["restart"] for r in steady]),
                                 "dit_ms_mean": mean([r["dit_ms"] for r in steady]),
                                 "dit_tflop_per_s": sig(tflop / dit_s) if dit_s else None,
                                 "actions_finite": bool(all(np.isfinite(a).all() for c in calls for a in c["actions"]))}
            if rate and s["dit_tflop_per_s"]:
                s["dit_fraction_of_roofline"] = round(s["dit_tflop_per_s"] / rate, 4)
                s["roofline_chunk_ms_mean"] = sig(1e3 * call_tflop / len(steady) / rate)
                s["steady_over_roofline"] = round(s["steady_ms_mean"] / s["roofline_chunk_ms_mean"], 4)
            out[schedule] = s
            log(f"bare {schedule}: first {s['first_call_ms']} ms, steady mean {s['steady_ms_mean']} ms, DiT "
                f"{s['dit_tflop_per_s']} TFLOP/s ({s.get('dit_fraction_of_roofline')} of the matmul rate)")
            save()
    finally:
        clock.on = False
        set_schedule(policy, args.served_schedule)
    return out


# ------------------------------------------------------------------ memory
def capacity_at(g: Any, available: int, fraction: float = 0.9, in_flight: int = 1) -> dict[str, Any]:
    from kv import plan_capacity
    from kv.capacity import CapacityError

    try:
        plan = plan_capacity(g, available_bytes=available, fraction=fraction, ticks_in_flight=in_flight)
    except CapacityError as e:
        return {"available_bytes": available, "sessions": 0, "why": str(e)}
    return {"available_bytes": available, "fraction": fraction, "ticks_in_flight": in_flight,
            "sessions": plan.capacity, "required_bytes": plan.required_bytes,
            "required_1_bytes": plan.required_one_bytes}


def with_host(resident: dict[str, Any], host_bytes: int, per_session: int) -> dict[str, Any]:
    host = host_bytes // per_session
    return {**resident, "host_budget_bytes": host_bytes, "swapped_sessions": host,
            "sessions_with_swap": resident["sessions"] + host}


def full_size_formula(host_bytes: int) -> dict[str, Any]:
    """The capacity formula at DROID's full size (352 x 640, bf16) on an 80 and a 141 GiB card,
    after the weights: the DiT, CLIP ViT-H, the VAE in float32, and umt5-xxl's encoder or the
    bench's stand-in."""
    from models.policy.dreamzero.cache import kv_geometry
    from models.policy.dreamzero.config import DROID, IMAGE_TOKENS
    from models.policy.dreamzero.model import DreamZeroDiT
    from models.policy.dreamzero.vae import make_vae

    with torch.device("meta"):
        dit_params = sum(p.numel() for p in DreamZeroDiT(DROID).parameters())
        vae_bytes = parameter_bytes(make_vae(96, 16))
    g = kv_geometry(DROID, DROID_LATENT_HW, image_tokens=IMAGE_TOKENS, dtype=torch.bfloat16)
    per = session_bytes(g)
    out: dict[str, Any] = {"session_bytes": per, "page_bytes": g.page_bytes, "model_state_bytes": g.model_state_bytes}
    standin = 4096 * 30 + 4 * 4096 * 4096 + 3 * 4096 * 10_240
    for text, params in (("umt5_xxl", UMT5_XXL_ENCODER_PARAMS), ("umt5_standin", standin)):
        weights = 2 * (dit_params + CLIP_VIT_H_PARAMS + params) + vae_bytes
        row: dict[str, Any] = {"weights_bytes_estimate": weights}
        for name, gib in (("80_gib", 80), ("141_gib", 141)):
            row[name] = with_host(capacity_at(g, gib * GIB - weights), host_bytes, per)
        out[text] = row
    return out


def memory(policy: Any, clock: Clock, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    cache, g = policy.cache, policy.geometry
    sid = session_id(0, "memory")
    cycle = len(window_cycle(policy.cfg))
    for k in range(cycle):   # the window is full after the cycle's last call
        bare_call(policy, clock, [sid], [0], k, args, device)
    try:
        held = cache.session(sid).num_held_blocks()
        state = policy.residency.state(sid)
        kv_bytes = cache.swap_bytes(sid)
        measured = kv_bytes + state.nbytes
        formula = session_bytes(g)
        steady = {"calls": cycle, "held_blocks_both_branches": held, "page_bytes": g.page_bytes,
                  "kv_bytes": kv_bytes, "state_bytes": state.nbytes, "state_bytes_formula": g.model_state_bytes,
                  "session_bytes_measured": measured, "session_bytes_formula": formula,
                  "equal_to_the_byte": measured == formula, "session_gib": round(measured / GIB, 4)}
        sync(device)
        t0 = time.perf_counter()
        host = cache.swap_out(sid)
        state.to_host()
        sync(device)
        t1 = time.perf_counter()
        ok = cache.swap_in(host)
        state.to_device(device)
        sync(device)
        t2 = time.perf_counter()
        swap = {"bytes": measured, "out_ms": round(1e3 * (t1 - t0), 3), "in_ms": round(1e3 * (t2 - t1), 3),
                "swapped_back": bool(ok), "how": "PagedKVCache.swap_out/swap_in and the state's to_host/to_device, "
                                                 "as Residency moves an idle session"}
    finally:
        policy.drop_session(sid)
    out: dict[str, Any] = {"steady_session": steady, "swap_round_trip": swap, "plan": {
        "resident_sessions": policy.capacity, "required_bytes": policy.plan.required_bytes,
        "budget_bytes": policy.plan.budget_bytes, "ticks_in_flight": policy.plan.ticks_in_flight}}
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0] + policy.cache.storage.nbytes()
        host = policy.residency.host_budget_bytes
        out["this_device"] = {f"in_flight_{n}": with_host(capacity_at(g, free, 0.9, n), host, formula)
                              for n in (1, args.robots)}
        out["this_device"]["note"] = "free memory after the weights, the pool counted as free; 0.9 of it"
    out["full_size_formula"] = full_size_formula(int(args.host_gib * GIB))
    return out


# ------------------------------------------------------------------ served
def served_robots(url: str, robots: int, calls: int, tag: str, args: argparse.Namespace,
                  pool: Any) -> list[dict[str, Any]]:
    from models.policy.dreamzero.observation import METADATA

    return pool.apply(drive, (url, robots, calls, tuple(METADATA.image_keys), tuple(METADATA.image_resolution),
                              tag, args.seed))


def restarts_of(policy: Any, calls: int) -> list[bool]:
    n = len(window_cycle(policy.cfg))
    return [k % n == 0 for k in range(calls)]


def served(policy: Any, url: str, args: argparse.Namespace, pool: Any, result: dict[str, Any]) -> dict[str, Any]:
    set_schedule(policy, args.served_schedule)
    got = served_robots(url, 1, args.calls, "served", args, pool)[0]
    ms = got["latency_ms"]
    restart = restarts_of(policy, args.calls)
    out: dict[str, Any] = {"schedule": args.served_schedule, "calls": args.calls,
                           "client": "openpi_client.websocket_client_policy.WebsocketClientPolicy, a process of its own",
                           "server_metadata": got["server_metadata"], "first_call_ms": round(ms[0], 3),
                           "latency_ms": [round(x, 3) for x in ms],
                           **latency_summary(ms[1:], restart[1:])}
    b = (result.get("bare") or {}).get(args.served_schedule)
    if b:
        out["bare_steady_ms_mean"] = b["steady_ms_mean"]
        out["served_over_bare"] = round(out["steady_ms_mean"] / b["steady_ms_mean"], 4)
        out["first_served_over_bare"] = round(out["first_call_ms"] / b["first_call_ms"], 4)
    log(f"served 1 robot ({args.served_schedule}): first {out['first_call_ms']} ms, steady mean "
        f"{out['steady_ms_mean']} ms, served/bare {out.get('served_over_bare')}")
    return out


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max()) for x, y in zip(a, b))


def robots_bare(policy: Any, clock: Clock, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Each robot alone (the reference chunks), then all in one batched call per step."""
    set_schedule(policy, args.served_schedule)
    n = args.robots
    alone = [episode(policy, clock, r, args.robot_calls, "alone", args, device) for r in range(n)]
    sids = [session_id(r, "batched") for r in range(n)]
    try:
        batched = [bare_call(policy, clock, sids, list(range(n)), k, args, device) for k in range(args.robot_calls)]
    finally:
        for sid in sids:
            policy.drop_session(sid)
    steady = [c["ms"] for c in batched[1:]]
    return {"alone_actions": [[c["actions"][0] for c in a] for a in alone],
            "alone_steady_ms_mean": [mean([c["ms"] for c in a[1:]]) for a in alone],
            "batched": {"call_ms": [round(c["ms"], 3) for c in batched], "steady_ms_mean": mean(steady),
                        "chunks_per_s": round(n * len(steady) / (sum(steady) / 1e3), 4) if steady else None,
                        "max_abs_diff_vs_alone": max(max_diff([c["actions"][r] for c in batched],
                                                              [c["actions"][0] for c in alone[r]]) for r in range(n)),
                        "bit_equal_to_alone": all(np.array_equal(c["actions"][r], a["actions"][0])
                                                  for r in range(n) for c, a in zip(batched, alone[r]))}}


def robots_served(policy: Any, clock: Clock, url: str, bare_part: dict[str, Any], args: argparse.Namespace,
                  pool: Any, rate: float | None) -> dict[str, Any]:
    set_schedule(policy, args.served_schedule)
    n = args.robots
    clock.batches.clear()
    clock.rows.clear()
    m0 = policy.residency.metrics()
    got = served_robots(url, n, args.robot_calls, "robots", args, pool)
    m1 = policy.residency.metrics()
    sizes = [b for b, _ in clock.batches]
    rows = list(clock.rows)
    alone = bare_part.pop("alone_actions")
    per_robot = []
    for r, g in enumerate(got):
        steady = g["latency_ms"][1:]
        diff = max_diff(g["actions"], alone[r])
        per_robot.append({"session_id": g["session_id"], "first_call_ms": round(g["latency_ms"][0], 3),
                          "p50_ms": med(steady), "p99_ms": p99(steady),
                          "max_abs_diff_vs_alone": diff,
                          "bit_equal_to_alone": all(np.array_equal(a, b) for a, b in zip(g["actions"], alone[r]))})
    t_first = min(g["t_reply"][0] for g in got)
    t_last = max(g["t_reply"][-1] for g in got)
    chunks = n * (args.robot_calls - 1)
    out: dict[str, Any] = {
        "robots": n, "calls_per_robot": args.robot_calls, "schedule": args.served_schedule, "per_robot": per_robot,
        "aggregate_chunks_per_s": round(chunks / (t_last - t_first), 4) if t_last > t_first else None,
        "slowest_robot_p99_ms": max(r["p99_ms"] or 0 for r in per_robot),
        "engine_batches": len(sizes), "engine_batch_size_mean": mean([float(s) for s in sizes]),
        "dit_forwards": len(rows), "robots_per_dit_forward_mean": mean([r / 2 for r in rows]),
        "swaps_during": {k: m1[k] - m0[k] for k in ("swap_outs", "swap_ins", "drops")},
        "max_abs_diff_vs_alone": max(r["max_abs_diff_vs_alone"] for r in per_robot),
        "bit_equal_to_alone": all(r["bit_equal_to_alone"] for r in per_robot),
        "bare": bare_part,
        "how": "aggregate: the robots' steady chunks over the time from the first reply to the last; alone: each "
               "robot's chunks from its own session run one at a time (bare); the noise is the same draw for all; "
               "the robots of one engine batch share each denoising forward at their own window positions; the t = 0 "
               "write passes are one for restarting robots and one for continuing ones (robots_per_dit_forward_mean)"}
    if rate:
        flops = per_call_flops(policy, args.served_schedule, args.robot_calls)[1:]
        per_chunk = statistics.fmean(f["total"] for f in flops)
        out["roofline_chunks_per_s"] = sig(rate * 1e12 / per_chunk)
        if out["aggregate_chunks_per_s"]:
            out["aggregate_over_roofline"] = round(out["aggregate_chunks_per_s"] / out["roofline_chunks_per_s"], 4)
    log(f"robots x{n}: {out['aggregate_chunks_per_s']} chunks/s (roofline {out.get('roofline_chunks_per_s')}), "
        f"slowest p99 {out['slowest_robot_p99_ms']} ms, batch {out['engine_batch_size_mean']}, robots per DiT "
        f"forward {out['robots_per_dit_forward_mean']}, max |diff| vs alone "
        f"{out['max_abs_diff_vs_alone']:.3g}")
    return out


# ------------------------------------------------------------------ main
def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals against what this run measured (None: not measured)."""
    ar = result.get("arithmetic") or {}
    b = result.get("bare") or {}
    s = result.get("served") or {}
    r = result.get("robots") or {}
    m = (result.get("memory") or {}).get("steady_session") or {}
    cached = b.get("step_cache") or {}
    return {
        "matmul_tflop_per_s": ar.get("matmul_tflop_per_s"),
        "roofline_chunk_s_step_cache": ((ar.get("served_geometry") or {}).get("roofline") or {}).get(
            "step_cache", {}).get("roofline_chunk_s"),
        "goal_0_8_s": ar.get("goal_0_8_s"),
        "served_chunk_ms_step_cache": s.get("steady_ms_mean"), "served_first_call_ms": s.get("first_call_ms"),
        "served_over_bare": s.get("served_over_bare"),
        "bare_exact_chunk_ms": (b.get("exact") or {}).get("steady_ms_mean"),
        "bare_step_cache_chunk_ms": cached.get("steady_ms_mean"),
        "dit_fraction_of_roofline_step_cache": cached.get("dit_fraction_of_roofline"),
        "robots_aggregate_over_roofline": r.get("aggregate_over_roofline"),
        "robots_slowest_p99_ms": r.get("slowest_robot_p99_ms"),
        "robots_max_abs_diff_vs_alone": r.get("max_abs_diff_vs_alone"),
        "session_bytes_equal_to_formula": m.get("equal_to_the_byte"),
        "goals": {"served_chunk_s": "<= 0.8 (or the roofline, when 0.8 s is beyond it)",
                  "dit_fraction_of_roofline": ">= 0.75", "served_over_bare": "<= 1.05",
                  "robots_aggregate_over_roofline": ">= 0.95"},
    }


def main() -> None:
    global START
    START = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tiny checkpoint (config.TINY_DROID), CPU smoke test")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--calls", type=int, default=9, help="calls of one robot per schedule (first + steady)")
    ap.add_argument("--robots", type=int, default=4)
    ap.add_argument("--robot-calls", type=int, default=9, help="calls per robot in the robots section")
    ap.add_argument("--sessions", type=int, default=None, help="resident sessions asked of the pool (default: --robots)")
    ap.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES), help="bare's schedules")
    ap.add_argument("--served-schedule", choices=SCHEDULES, default="step_cache",
                    help="served and robots (step_cache: upstream's default)")
    ap.add_argument("--text-encoder", choices=("standin", "full"), default="standin")
    ap.add_argument("--clip-layers", type=int, default=32)
    ap.add_argument("--fraction", type=float, default=0.9, help="share of free device memory for the KV pool")
    ap.add_argument("--host-gib", type=float, default=64.0, help="host swap budget")
    ap.add_argument("--batch-wait-ms", type=float, default=20.0, help="the engine's policy batch wait")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (CPU runs)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip a section that would start after this")
    args = ap.parse_args()
    args.sessions = args.sessions or max(args.robots, 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    result: dict[str, Any] = {
        "benchmark": "DreamZero-DROID at full size: FLOPs and roofline, one robot bare and served, N robots at once, "
                     "memory per session (issue 48)",
        "command": " ".join(["python3", "-m", "bench.policy.bench_dreamzero", *sys.argv[1:]]),
        "env": environment(device, PACKAGES), "device": str(device), "tiny": args.tiny, "budget_s": args.budget_s,
        "skipped": {}, "errors": {},
    }

    run = Sections(result, args.out, args.only, args.budget_s, START, log)
    save, budget_ok, section, want = run.save, run.budget_ok, run.section, run.want

    log("building the policy ...")
    policy, info = build(args, device)
    result["model"] = info
    log(f"built in {info['build_s']} s: DiT {info['transformer_params'] / 1e9:.2f} B params, "
        f"{info['resident_sessions']} resident sessions")
    save()
    clock = Clock(policy, device)
    # On fresh threads, as the engine runs the model on its own thread.
    section("arithmetic", lambda: on_spent_thread(arithmetic, policy, args, device))
    rate = (result.get("arithmetic") or {}).get("matmul_tflop_per_s")
    section("bare", lambda: on_spent_thread(bare, policy, clock, args, device, rate, result, budget_ok, save))
    section("memory", lambda: on_spent_thread(memory, policy, clock, args, device))
    set_schedule(policy, args.served_schedule)

    robots_part = None
    if want("robots"):
        fit = min(policy.capacity, policy.max_batch)
        if fit < args.robots:   # more would swap on every call: run as many as are resident
            result["robots_fewer"] = (f"{args.robots} robots asked; the pool holds {policy.capacity} resident sessions "
                                      f"at {args.fraction} of this device's free memory (a session "
                                      f"{session_bytes(policy.geometry)} bytes), so {fit} run")
            log(result["robots_fewer"])
            args.robots = fit
        if args.robots < 2:
            result["skipped"]["robots"] = result.pop("robots_fewer", "fewer than 2 robots")
        elif budget_ok("robots"):
            log("robots: alone and batched, bare ...")
            try:
                robots_part = on_spent_thread(robots_bare, policy, clock, args, device)
            except Exception as e:
                traceback.print_exc()
                result["errors"]["robots"] = f"{type(e).__name__}: {e}"
    serve_robots = robots_part is not None
    if want("served") or serve_robots:
        from realtime.server.app import build_app
        from realtime.server.config import EngineConfig, LimitsConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
        from realtime.server.inventory import Inventory
        from realtime.server.server import serve_in_thread

        config = ServerConfig(engine=EngineConfig(device=str(device), batch_wait_ms=args.batch_wait_ms),
                              world=WorldConfig(models=()), policy=PolicyConfig(policy=""), tts=TTSConfig(enabled=False),
                              limits=LimitsConfig(max_sessions_per_client=0))   # every robot on loopback
        inventory = Inventory()
        inventory.adapters[policy.name] = policy
        with serve_in_thread(build_app(config, inventory)) as addr, mp.get_context("spawn").Pool(1) as pool:
            url = f"ws://{addr}{PATH}"
            log(f"serving on {url}")
            section("served", lambda: served(policy, url, args, pool, result))
            if serve_robots:
                section("robots", lambda: robots_served(policy, clock, url, robots_part, args, pool, rate))
    result["residency_end"] = policy.residency.metrics()
    result["memory_end"] = device_memory(device)
    result["summary"] = summary(result)
    save()
    print(json.dumps({k: result.get(k) for k in ("summary", "errors", "skipped", "elapsed_s")}, indent=1,
                     default=str), flush=True)


if __name__ == "__main__":
    main()
